//! The pickle writer and the snapshot export, checked by loading the bytes
//! with CPython's `pickle` module (skipped when `python3` is absent).

use std::path::PathBuf;
use std::process::Command;

use cachalot::pickle::{Value, dict};
use cachalot::{AllocatorConfig, DeviceAllocator, HistoryConfig, MockSettings};

fn python() -> Option<&'static str> {
    Command::new("python3")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "python3")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cachalot-pickle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs `script` with the pickle path as argv[1]; returns stdout.
fn run_python(script: &str, path: &PathBuf) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn values_round_trip_through_cpython() {
    if python().is_none() {
        // a direct write: libtest captures eprintln! of a passing test
        std::io::Write::write_all(&mut std::io::stderr(), b"skipped: python3 not found\n").ok();
        return;
    }
    let many: Vec<Value> = (0..2500).map(Value::Int).collect();
    let many_dict: Vec<(Value, Value)> = (0..1500)
        .map(|i| (Value::from(format!("k{i}")), Value::Int(i)))
        .collect();
    let v = dict([
        ("none", Value::None),
        ("t", Value::Bool(true)),
        ("f", Value::Bool(false)),
        (
            "ints",
            Value::List(vec![
                Value::Int(0),
                Value::Int(255),
                Value::Int(256),
                Value::Int(65535),
                Value::Int(65536),
                Value::Int(-1),
                Value::Int(i32::MIN.into()),
                Value::Int(i32::MAX as i128 + 1),
                Value::Int(u64::MAX.into()),
                Value::Int(i64::MIN.into()),
            ]),
        ),
        ("float", Value::Float(-1.5e300)),
        ("str", Value::from("héllo \u{1F40B} \"quoted\"\n")),
        ("empty", Value::from("")),
        (
            "tuples",
            Value::List(vec![
                Value::Tuple(vec![]),
                Value::Tuple(vec![Value::Int(1)]),
                Value::Tuple(vec![Value::Int(1), Value::Int(2)]),
                Value::Tuple(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
                Value::Tuple(vec![
                    Value::Int(1),
                    Value::Int(2),
                    Value::Int(3),
                    Value::from("four"),
                ]),
            ]),
        ),
        ("many", Value::List(many)),
        ("many_dict", Value::Dict(many_dict)),
        (
            "int_keys",
            Value::Dict(vec![(Value::Int(7), Value::List(vec![]))]),
        ),
    ]);
    let path = temp("values.pickle");
    std::fs::write(&path, v.to_pickle().unwrap()).unwrap();
    let script = r#"
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
assert d["none"] is None
assert d["t"] is True and d["f"] is False
assert d["ints"] == [0, 255, 256, 65535, 65536, -1, -2**31, 2**31, 2**64 - 1, -2**63], d["ints"]
assert d["float"] == -1.5e300
assert d["str"] == 'h\u00e9llo \U0001F40B "quoted"\n'
assert d["empty"] == ""
assert d["tuples"] == [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, "four")]
assert all(type(t) is tuple for t in d["tuples"])
assert d["many"] == list(range(2500))
assert d["many_dict"] == {f"k{i}": i for i in range(1500)}
assert d["int_keys"] == {7: []}
assert list(d.keys())[:3] == ["none", "t", "f"]
print("ok")
"#;
    assert_eq!(run_python(script, &path).trim(), "ok");
}

#[test]
fn snapshot_pickle_has_pytorch_structure() {
    if python().is_none() {
        // a direct write: libtest captures eprintln! of a passing test
        std::io::Write::write_all(&mut std::io::stderr(), b"skipped: python3 not found\n").ok();
        return;
    }
    let dev = DeviceAllocator::with_mock(
        MockSettings::default().backend(0),
        Some(AllocatorConfig::parse("max_split_size_mb:256,expandable_segments:False").unwrap()),
    )
    .unwrap();
    dev.record_memory_history(Some(HistoryConfig::default()));
    dev.record_annotation(vec![
        ("name".into(), "step".into()),
        ("stage".into(), "START".into()),
    ]);
    cachalot::core::engine::history::set_user_metadata("meta");
    let side = dev.new_stream().unwrap();
    let a = dev.allocate(3 << 20, dev.default_stream()).unwrap();
    let b = dev.allocate(1000, side).unwrap();
    let c = dev.allocate(512, dev.default_stream()).unwrap();
    a.record_stream(side).unwrap();
    drop(c);
    cachalot::core::engine::history::set_user_metadata("");
    let snap = dev.snapshot();
    let path = temp("snapshot.pickle");
    cachalot::export::write_snapshot(&path, std::slice::from_ref(&snap)).unwrap();
    let script = r#"
import pickle, sys, json
d = pickle.load(open(sys.argv[1], "rb"))
assert set(d) == {"segments", "device_traces", "allocator_settings", "external_annotations"}, list(d)
segs = d["segments"]
seg_keys = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
            "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
for s in segs:
    assert set(s) == seg_keys, set(s) ^ seg_keys
    assert s["segment_pool_id"] == (0, 0) and type(s["segment_pool_id"]) is tuple
    assert s["segment_type"] in ("small", "large")
    assert s["is_expandable"] is False
    assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    for b in s["blocks"]:
        assert set(b) == {"address", "size", "requested_size", "state", "frames"}
        assert b["state"] in ("active_allocated", "active_pending_free", "inactive")
assert [s["address"] for s in segs] == sorted(s["address"] for s in segs)
assert len(d["device_traces"]) == 1
tr = d["device_traces"][0]
for e in tr:
    assert {"action", "size", "stream", "time_us", "frames", "compile_context", "user_metadata"} <= set(e)
    assert "addr" in e or "device_free" in e
    assert e["compile_context"] == "N/A" and e["user_metadata"] == "meta", e
(ann,) = d["external_annotations"]
assert ann["name"] == "step" and ann["stage"] == "START" and ann["device"] == 0, ann
assert ann["time_us"] > 0
st = d["allocator_settings"]
assert st["max_split_size"] == 256 << 20, st
assert st["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:256,expandable_segments:False"
assert set(st["roundup_power2_divisions"]) == {str(1 << i) for i in range(16)}
print(json.dumps({
    "segments": [(s["segment_type"], s["total_size"], s["allocated_size"], s["stream"],
                  [(b["size"], b["state"]) for b in s["blocks"]]) for s in segs],
    "actions": [e["action"] for e in tr],
    "streams": sorted({e["stream"] for e in tr}),
}))
"#;
    let out = run_python(script, &path);
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let segs = got["segments"].as_array().unwrap();
    // One large segment (20 MiB, holding the 3 MiB block) and one small
    // 2 MiB segment (the 1000- and 512-byte blocks on two streams do not
    // share a segment: one small segment per stream).
    let large: Vec<_> = segs.iter().filter(|s| s[0] == "large").collect();
    assert_eq!(large.len(), 1);
    assert_eq!(large[0][1], 20u64 << 20);
    assert_eq!(large[0][2], 3u64 << 20);
    let small_alloc: u64 = segs
        .iter()
        .filter(|s| s[0] == "small")
        .map(|s| s[2].as_u64().unwrap())
        .sum();
    assert_eq!(small_alloc, 1024);
    let actions: Vec<&str> = got["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        actions.iter().filter(|a| **a == "alloc").count(),
        3,
        "{actions:?}"
    );
    assert!(actions.contains(&"segment_alloc"));
    assert!(actions.contains(&"free_requested"));
    // a snapshot never holds its own entry (PyTorch records it after the copy)
    assert!(!actions.contains(&"snapshot"), "{actions:?}");
    assert_eq!(got["streams"], serde_json::json!([0, 1]));

    // JSON export: the same structure.
    let json = cachalot::export::snapshot_json(std::slice::from_ref(&snap));
    let j: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(j["segments"].as_array().unwrap().len(), segs.len());
    assert_eq!(
        j["segments"][0]["segment_pool_id"],
        serde_json::json!([0, 0])
    );
    drop((a, b));
}
