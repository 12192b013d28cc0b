//! The README's "Use it from Rust" program is this file's `using_it` body
//! inside a `main`: one test runs it, the other checks that the README
//! shows exactly that program.

use std::error::Error;

fn using_it() -> Result<(), Box<dyn Error>> {
    // README begin
    use cachalot::{AllocatorConfig, DeviceAllocator, DeviceBuffer, memory};

    // The global allocator of the current device: the backend that
    // CACHALOT_BACKEND names, else the first compiled-in GPU backend with a
    // device, else the mock; configured from CACHALOT_ALLOC_CONF or
    // PYTORCH_CUDA_ALLOC_CONF.
    let (s, side) = (cachalot::new_stream(None)?, cachalot::new_stream(None)?);
    let buf = DeviceBuffer::on_stream(4 << 20, s)?; // device memory, stream-ordered on `s`
    buf.record_stream(side)?; // also used on `side`
    drop(buf); // reused once `side`'s queued work completes
    println!("{} B reserved", memory::memory_reserved(None)?);
    print!("{}", memory::memory_summary(None, false)?);

    // A private allocator with its own configuration.
    let config = AllocatorConfig::parse("max_split_size_mb:256,expandable_segments:True")?;
    let alloc = DeviceAllocator::open(cachalot::backend_kind()?, 0, Some(config))?;
    let big = alloc.allocate(1 << 30, alloc.default_stream())?; // a DeviceBuffer
    assert_eq!(alloc.memory_stats()["allocated_bytes.all.current"], 1 << 30);
    drop(big);
    // README end
    Ok(())
}

#[test]
fn readme_snippet_runs() {
    using_it().unwrap();
    // what the snippet left behind: a cached 4 MiB block on the global device
    assert!(cachalot::memory::memory_reserved(None).unwrap() >= 4 << 20);
    assert_eq!(cachalot::memory::memory_allocated(None).unwrap(), 0);
}

/// The code between the markers above, as the body of a `main` that
/// returns `Result`: a program a reader can copy.
fn snippet_of_this_file() -> String {
    let me = include_str!("readme.rs");
    let begin =
        me.find("    // README begin\n").expect("begin marker") + "    // README begin\n".len();
    let end = me.find("    // README end\n").expect("end marker");
    format!(
        "fn main() -> Result<(), Box<dyn std::error::Error>> {{\n{}    Ok(())\n}}\n",
        &me[begin..end]
    )
}

/// The first ```rust block of the README's "## Use it from Rust" section.
fn snippet_of_readme() -> String {
    let readme = include_str!("../../../README.md");
    let section = &readme[readme
        .find("\n## Use it from Rust\n")
        .expect("a \"## Use it from Rust\" section")..];
    let start = section.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let len = section[start..].find("```\n").expect("the block's end");
    section[start..start + len].to_string()
}

#[test]
fn readme_shows_this_snippet() {
    let (ours, readme) = (snippet_of_this_file(), snippet_of_readme());
    assert!(ours.contains("cachalot::new_stream"), "{ours}");
    assert_eq!(
        readme, ours,
        "README.md's \"Use it from Rust\" block differs from crates/cachalot/tests/readme.rs"
    );
}

/// Every relative link of the user-facing Markdown files names a file or
/// folder of the repository (`traces/README.md` once linked a file outside it).
#[test]
fn markdown_links_resolve() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut checked = 0;
    for doc in [
        "README.md",
        "BENCHMARKS.md",
        "PORTING.md",
        "traces/README.md",
        "bench/pytorch/README.md",
        "docs/capture-results.md",
        "docs/configuration.md",
        "docs/design-expandable.md",
        "docs/design-shards.md",
        "docs/experiments.md",
        "docs/glossary.md",
        "docs/pytorch-pluggable.md",
        "docs/pytorch-shim.md",
        "docs/reliability.md",
        "docs/rust.md",
    ] {
        let path = root.join(doc);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let dir = path.parent().unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split('#').next().unwrap_or("");
            rest = &rest[end..];
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            assert!(
                dir.join(target).exists(),
                "{doc}: the link ({target}) names no file"
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "{checked} links checked");
}
