//! Replays the committed inputs of the engine fuzz target (`fuzz/seeds/engine`
//! and every crash found, `fuzz/regressions/engine`) through the harness the
//! fuzz target runs ([`cachalot_conformance::fuzz::engine`]), plus a few
//! thousand inputs from a fixed pseudo-random stream, on stable.

use std::path::PathBuf;

use cachalot_conformance::fuzz::engine;

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = cachalot_conformance::repo_root().join("fuzz");
    let mut out = Vec::new();
    for dir in ["regressions", "seeds"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_file() {
                let bytes = std::fs::read(&p).expect("read input");
                out.push((p, bytes));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn fuzz_regressions_engine() {
    let inputs = inputs("engine");
    assert!(!inputs.is_empty(), "the engine seeds are committed");
    for (path, bytes) in inputs {
        eprintln!("{}", path.display());
        engine(&bytes);
    }
}

/// A fixed stream of pseudo-random inputs (splitmix64): the harness on
/// inputs no fuzzer shaped, so that `cargo test` explores a little too.
#[test]
fn engine_on_pseudo_random_inputs() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for _ in 0..300 {
        let len = (next() % 2048) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        engine(&bytes);
    }
}
