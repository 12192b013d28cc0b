//! Parity with PyTorch 2.11's allocator on the recorded and synthetic traces:
//! peak reserved, peak allocated and device allocations against
//! `shared/anchor/pytorch-cca-h200.json` (copied into
//! `traces/pytorch-cca-h200.json`). Every figure is exact except the two
//! of `churn_1stream` that depend on where the driver places segments
//! (see [`churn_1stream`]).

use cachalot_conformance::mock::{FIXED, MIB, replay_on_mock};
use cachalot_conformance::traces_dir;
use cachalot_core::replay::Trace;

fn anchor() -> serde_json::Value {
    let path = traces_dir().join("pytorch-cca-h200.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("anchor json")
}

/// How far a figure may be from PyTorch's.
#[derive(Clone, Copy)]
struct Slack {
    /// Peak reserved bytes.
    reserved: i64,
    /// Device allocations in the first pass.
    device_allocs: i64,
}

const EXACT: Slack = Slack {
    reserved: 0,
    device_allocs: 0,
};

/// Replays `name` once on the mock and compares with PyTorch's figures:
/// equal, except for the stated slack. Peak allocated is always exact.
fn check(name: &str, slack: Slack) {
    let trace = match Trace::synthetic(name) {
        Some(t) => t,
        None => Trace::load(traces_dir().join(format!("{name}.trace"))).expect("trace"),
    };
    // PyTorch's default mode exactly, and fixed segments with cachalot's
    // placement (its first pass is PyTorch's too)
    for config in ["placement:pytorch", FIXED] {
        check_config(name, &trace, config, slack);
    }
}

/// [`check`] of one configuration.
fn check_config(name: &str, trace: &Trace, config: &str, slack: Slack) {
    let r = replay_on_mock(trace, 1, config);
    let a = &anchor()["traces"][name];
    let want_res = a["peak_reserved"].as_i64().unwrap();
    let want_alloc = a["peak_allocated"].as_i64().unwrap();
    let want_dev = a["device_allocs_cold"].as_i64().unwrap();
    println!(
        "{name} ({config}): peak_reserved {} vs {want_res} ({:+}), peak_allocated {} vs {want_alloc} ({:+}), device allocs {} vs {want_dev}",
        r.peak_reserved,
        r.peak_reserved - want_res,
        r.peak_allocated,
        r.peak_allocated - want_alloc,
        r.device_allocs_cold
    );
    assert_eq!(
        r.ops,
        a["ops"].as_u64().unwrap() as usize,
        "{name} ({config}): op count"
    );
    assert_eq!(
        r.peak_allocated, want_alloc,
        "{name} ({config}): peak allocated"
    );
    assert!(
        (r.peak_reserved - want_res).abs() <= slack.reserved,
        "{name} ({config}): peak reserved {} vs PyTorch's {want_res} ({:+} B, {} B allowed)",
        r.peak_reserved,
        r.peak_reserved - want_res,
        slack.reserved
    );
    assert!(
        (r.device_allocs_cold - want_dev).abs() <= slack.device_allocs,
        "{name} ({config}): {} device allocs vs PyTorch's {want_dev} ({} allowed)",
        r.device_allocs_cold,
        slack.device_allocs
    );
}

#[test]
fn gpt2_train() {
    check("gpt2_train", EXACT);
}

#[test]
fn resnet50_train() {
    check("resnet50_train", EXACT);
}

#[test]
fn side_stream_pipeline() {
    check("side_stream_pipeline", EXACT);
}

#[test]
fn hit_1mib() {
    check("hit_1mib", EXACT);
}

/// The one trace whose PyTorch figures move with the driver: best fit
/// breaks size ties by address, so where the driver places each segment
/// decides which block a request takes. The mock models the CUDA 13
/// driver's placement, and on this trace's 1000 live blocks of random
/// sizes one segment lands elsewhere than on the H200 the anchor was
/// recorded on: PyTorch there made one more 2 MiB small-pool segment
/// (8,443,133,952 B and 251 allocations; the mock 8,441,036,800 B and
/// 250). The slack is that one small segment, no more; peak allocated
/// (which no placement changes here) stays exact.
#[test]
fn churn_1stream() {
    check(
        "churn_1stream",
        Slack {
            reserved: 2 * MIB as i64,
            device_allocs: 1,
        },
    );
}

#[test]
fn churn_4streams() {
    check("churn_4streams", EXACT);
}

/// Steady state. Fixed segments with cachalot's placement
/// (`placement:steady,expandable_segments:False`) make no
/// device call at all after the first pass of every trace, with first-pass
/// figures equal to PyTorch's; `placement:pytorch` reproduces PyTorch's own
/// extra allocations (1 on `resnet50_train`, 5 on `churn_4streams`, in
/// pass 2). `idle_stream_reuse` (cachalot's extension) lets streams share
/// idle cached memory: 11% less peak reserved on `churn_4streams`, with at
/// most PyTorch's extra allocations.
#[test]
fn steady_state_device_calls_after_the_first_pass() {
    let churn4 = Trace::synthetic("churn_4streams").unwrap();
    let pytorch = replay_on_mock(&churn4, 3, "placement:pytorch");
    assert_eq!(
        pytorch.device_allocs_all - pytorch.device_allocs_cold,
        5,
        "PyTorch's behaviour"
    );
    let resnet = Trace::load(traces_dir().join("resnet50_train.trace")).expect("trace");
    let pytorch = replay_on_mock(&resnet, 3, "placement:pytorch");
    assert_eq!(
        pytorch.device_allocs_all - pytorch.device_allocs_cold,
        1,
        "PyTorch's behaviour"
    );
    for name in [
        "hit_1mib",
        "churn_1stream",
        "churn_4streams",
        "gpt2_train",
        "resnet50_train",
        "side_stream_pipeline",
    ] {
        let trace = match Trace::synthetic(name) {
            Some(t) => t,
            None => Trace::load(traces_dir().join(format!("{name}.trace"))).expect("trace"),
        };
        let steady = replay_on_mock(&trace, 3, FIXED);
        let pytorch = replay_on_mock(&trace, 1, "placement:pytorch");
        assert_eq!(
            steady.device_allocs_all, steady.device_allocs_cold,
            "{name}: device allocations after the first pass"
        );
        assert_eq!(
            (
                steady.peak_reserved,
                steady.peak_allocated,
                steady.device_allocs_cold
            ),
            (
                pytorch.peak_reserved,
                pytorch.peak_allocated,
                pytorch.device_allocs_cold
            ),
            "{name}: the first pass is PyTorch's"
        );
        // idle reuse moves segments between streams as their work allows,
        // so it keeps PyTorch's bound on extra allocations, not zero
        for config in [FIXED, "idle_stream_reuse:True,placement:pytorch"] {
            let r = replay_on_mock(&trace, 3, config);
            let a = &anchor()["traces"][name];
            let want = a["peak_reserved"].as_i64().unwrap();
            let extra = r.device_allocs_all - r.device_allocs_cold;
            assert!(
                r.peak_reserved <= want,
                "{name} {config}: {} > PyTorch's {want}",
                r.peak_reserved
            );
            assert_eq!(r.device_frees_all, 0, "{name} {config}");
            let pt_extra = a["device_allocs_all"].as_i64().unwrap()
                - a["device_allocs_cold"].as_i64().unwrap();
            assert!(
                extra <= pt_extra,
                "{name} {config}: {extra} extra device allocs, PyTorch {pt_extra}"
            );
            if name == "churn_4streams" && config != FIXED {
                assert!(
                    (r.peak_reserved as f64) < want as f64 * 0.9,
                    "{name}: idle reuse saves memory"
                );
            }
        }
    }
}
