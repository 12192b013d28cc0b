//! The figures the README shows are what the code gives today: the first
//! command's memory report, `cachalot fit`'s table, the 8 GB example, and
//! every memory cell of the "Why switch" table (cachalot's on the mock,
//! whose peaks equal the H200's; PyTorch's and RMM's from the recorded H200
//! figures in `traces/`). The table's speed columns need a GPU: README and
//! BENCHMARKS.md name the command that measures them.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

fn trace(name: &str) -> String {
    root()
        .join("traces")
        .join(format!("{name}.trace"))
        .to_string_lossy()
        .into_owned()
}

/// Runs the `cachalot` binary (no allocator configuration from the
/// environment) and returns its standard output; the run must succeed.
fn cachalot(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(args)
        .env_remove("CACHALOT_ALLOC_CONF")
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .env_remove("PYTORCH_HIP_ALLOC_CONF")
        .env_remove("PYTORCH_ALLOC_CONF")
        .env_remove("CACHALOT_BACKEND")
        .env_remove("CACHALOT_MOCK_MEMORY")
        .output()
        .expect("run cachalot");
    assert!(
        o.status.success(),
        "cachalot {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

/// The lines of the first fenced block after `marker` in `text`.
fn block_after(text: &str, marker: &str) -> Vec<String> {
    let start = text
        .find(marker)
        .unwrap_or_else(|| panic!("'{marker}' in README.md"));
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(str::to_string)
        .collect()
}

/// Every line of the README's block is a line the command prints.
fn assert_block_printed(block: &[String], out: &str) {
    assert!(block.len() >= 4, "{block:?}");
    for line in block {
        assert!(
            out.lines().any(|l| l.trim_end() == line.trim_end()),
            "README.md shows a line the command does not print: {line:?}\n{out}"
        );
    }
}

#[test]
fn the_first_commands_report_is_what_replay_prints() {
    let out = cachalot(&["replay", &trace("gpt2_train"), "--backend", "mock"]);
    assert_block_printed(&block_after(&readme(), "The first one prints"), &out);
}

#[test]
fn the_fit_table_is_what_fit_prints() {
    let block: Vec<String> = block_after(&readme(), "`fit` bisects the device size")
        .into_iter()
        .filter(|l| !l.starts_with("$ "))
        .collect();
    let out = cachalot(&["fit", &trace("gpt2_train")]);
    assert_block_printed(&block, &out);
}

/// "gpt2_train fits on an 8 GB card with the default (98.4% of it) where
/// PyTorch's default mode is 67 MiB short".
#[test]
fn the_8_gb_example_holds() {
    let text = readme();
    for needle in ["fits on an 8 GB card", "(98.4% of it)", "67 MiB short"] {
        assert!(text.contains(needle), "'{needle}' not in README.md");
    }
    let gpt2 = trace("gpt2_train");
    let out = cachalot(&["replay", &gpt2, "--device-memory", "8GB", "--passes", "2"]);
    assert!(
        out.contains("peak reserved is 98.4% of the device"),
        "{out}"
    );
    let fit = cachalot(&["fit", &gpt2, "--json", "--passes", "2"]);
    let pytorch = fit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
        .find(|r| r["policy"] == "pytorch")
        .expect("the pytorch row");
    let short = pytorch["smallest_device"].as_u64().unwrap() - 8_000_000_000;
    assert_eq!((short as f64 / (1 << 20) as f64).round(), 67.0, "{pytorch}");
}

/// The "Why switch" table's memory cells: peak reserved ÷ live peak on
/// GPT-2 training, ResNet-50 training, two streams taking turns
/// (side_stream_pipeline) and random sizes on four streams (churn_4streams).
#[test]
fn the_memory_table_is_what_the_mock_and_the_recorded_figures_give() {
    let json = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(root().join("traces").join(name)).expect(name);
        serde_json::from_str(&text).expect(name)
    };
    let (modes, rmm) = (json("pytorch-modes-h200.json"), json("rmm-fit-h200.json"));
    let traces = [
        "gpt2_train",
        "resnet50_train",
        "side_stream_pipeline",
        "churn_4streams",
    ];
    let live = |t: &str| modes["traces"][t]["live_peak"].as_f64().unwrap();
    let recorded = |t: &str, key: &str| format!("{:.4}", modes["traces"][t][key].as_f64().unwrap());
    let ours = |t: &str, config: &str| {
        let path = if t.starts_with("churn") {
            t.to_string()
        } else {
            trace(t)
        };
        let out = cachalot(&[
            "replay",
            &path,
            "--backend",
            "mock",
            "--json",
            "--passes",
            "2",
            "--config",
            config,
        ]);
        let j: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
        j["peak_reserved"].as_f64().unwrap() / live(t)
    };
    let mut want: Vec<(&str, Vec<String>)> = vec![
        (
            "PyTorch 2.11, default",
            traces
                .iter()
                .map(|t| recorded(t, "default_reserved_over_live"))
                .collect(),
        ),
        (
            "PyTorch, *expandable segments*",
            traces
                .iter()
                .map(|t| recorded(t, "expandable_reserved_over_live"))
                .collect(),
        ),
        (
            "PyTorch, `cudaMallocAsync`",
            traces
                .iter()
                .map(|t| recorded(t, "async_reserved_over_live"))
                .collect(),
        ),
        (
            "*RMM* pool / arena (smallest that fits)",
            traces
                .iter()
                .map(|t| {
                    let r = &rmm["traces"][t];
                    format!(
                        "{:.4} / {:.4}",
                        r["pool_over_live"].as_f64().unwrap(),
                        r["arena_over_live"].as_f64().unwrap()
                    )
                })
                .collect(),
        ),
    ];
    let default: Vec<f64> = traces.iter().map(|t| ours(t, "")).collect();
    let fixed: Vec<f64> = traces
        .iter()
        .map(|t| ours(t, "expandable_segments:False"))
        .collect();
    want.push((
        "**cachalot, default**",
        default.iter().map(|v| format!("**{v:.4}**")).collect(),
    ));
    want.push((
        "cachalot, `expandable_segments:False`",
        fixed.iter().map(|v| format!("{v:.4}")).collect(),
    ));
    // the default reserves less than every other column's figure
    for (i, t) in traces.iter().enumerate() {
        for key in [
            "default_reserved_over_live",
            "expandable_reserved_over_live",
            "async_reserved_over_live",
        ] {
            let theirs = modes["traces"][t][key].as_f64().unwrap();
            assert!(default[i] < theirs, "{t}: {} vs {key} {theirs}", default[i]);
        }
        for key in ["pool_over_live", "arena_over_live"] {
            let theirs = rmm["traces"][t][key].as_f64().unwrap();
            assert!(
                default[i] < theirs,
                "{t}: {} vs RMM {key} {theirs}",
                default[i]
            );
        }
    }
    let text = readme();
    let section = &text[text
        .find("\n## Why switch\n")
        .expect("a Why switch section")..];
    for (label, cells) in want {
        let row = section
            .lines()
            .find(|l| l.starts_with(&format!("| {label} |")))
            .unwrap_or_else(|| panic!("README.md: no row '{label}'"));
        let got: Vec<&str> = row.split('|').map(str::trim).skip(2).take(4).collect();
        assert_eq!(got, cells, "README.md's row '{label}'");
    }
}
