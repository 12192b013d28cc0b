//! Snapshot export in the format of PyTorch's `torch.cuda.memory._snapshot()`
//! (spec section 5.2): as a pickle that PyTorch's own viewer
//! (`python -m torch.cuda._memory_viz`, `pytorch.org/memory_viz`) opens, and
//! as JSON with the same structure.
//!
//! Top level: `segments`, `device_traces` (one list per device index),
//! `allocator_settings`, `external_annotations`. Streams are numbers (the
//! backend's native handle; the mock's stream index), as in PyTorch.

use std::path::Path;

use cachalot_core::AllocatorConfig;
use cachalot_core::config::ROUNDUP_INTERVALS;
use cachalot_core::engine::{Snapshot, TraceAction, TraceEntry};

use crate::pickle::{Value, dict};

/// The numeric value of a stream as rendered by its `Debug` impl: the number
/// inside the parentheses (hex with `0x`), `legacy` = 0, `per-thread` = 2.
pub fn stream_number(debug: &str) -> i64 {
    let inner = debug
        .split_once('(')
        .and_then(|(_, r)| r.rsplit_once(')'))
        .map_or(debug, |(i, _)| i)
        .trim();
    let inner = inner.trim_start_matches("stream");
    if inner == "legacy" {
        return 0;
    }
    if inner == "per-thread" {
        return 2;
    }
    let parsed = if let Some(hex) = inner.strip_prefix("0x") {
        u64::from_str_radix(hex, 16).ok()
    } else {
        inner.parse::<u64>().ok()
    };
    parsed.map_or(0, |v| v as i64)
}

/// Frames of a captured Rust backtrace as PyTorch's frame dicts
/// (`name`, `filename`, `line`).
pub fn backtrace_frames(bt: &str) -> Value {
    let mut frames: Vec<(String, String, i64)> = Vec::new();
    for line in bt.lines() {
        let t = line.trim();
        if let Some(loc) = t.strip_prefix("at ") {
            if let Some(last) = frames.last_mut() {
                let mut parts = loc.rsplitn(3, ':');
                let _col = parts.next();
                let line_no = parts.next().and_then(|l| l.parse().ok());
                match (line_no, parts.next()) {
                    (Some(l), Some(file)) => {
                        last.1 = file.to_string();
                        last.2 = l;
                    }
                    _ => last.1 = loc.to_string(),
                }
            }
        } else if let Some((num, name)) = t.split_once(": ")
            && num.chars().all(|c| c.is_ascii_digit())
        {
            frames.push((name.to_string(), "??".to_string(), 0));
        }
    }
    Value::List(
        frames
            .into_iter()
            .map(|(name, file, line)| {
                dict([
                    ("name", Value::from(name)),
                    ("filename", Value::from(file)),
                    ("line", Value::Int(line.into())),
                ])
            })
            .collect(),
    )
}

fn trace_entry(e: &TraceEntry) -> Value {
    let frames = e
        .frames
        .as_deref()
        .map_or_else(|| Value::List(Vec::new()), backtrace_frames);
    let addr_key = if e.action == TraceAction::Oom {
        "device_free"
    } else {
        "addr"
    };
    dict([
        ("action", Value::from(e.action.as_str())),
        (addr_key, Value::from(e.addr)),
        ("size", Value::from(e.size)),
        ("stream", Value::from(stream_number(&e.stream))),
        ("time_us", Value::from(e.time_us)),
        ("frames", frames),
        (
            "compile_context",
            Value::from(e.compile_context.as_deref().unwrap_or("N/A")),
        ),
        (
            "user_metadata",
            Value::from(e.user_metadata.as_deref().unwrap_or("")),
        ),
    ])
}

/// PyTorch's `allocator_settings` dict for a configuration.
pub fn allocator_settings(c: &AllocatorConfig) -> Value {
    let divisions = (0..ROUNDUP_INTERVALS)
        .map(|i| {
            (
                Value::from((1u64 << i).to_string()),
                Value::from(c.roundup_power2_divisions[i]),
            )
        })
        .collect();
    dict([
        (
            "PYTORCH_CUDA_ALLOC_CONF",
            Value::from(c.last_config_string.as_str()),
        ),
        ("max_split_size", Value::from(c.max_split_size_stat())),
        (
            "garbage_collection_threshold",
            Value::from(c.garbage_collection_threshold),
        ),
        ("expandable_segments", Value::from(c.expandable_segments)),
        (
            "pinned_num_register_threads",
            Value::from(c.pinned_num_register_threads),
        ),
        (
            "release_lock_on_cudamalloc",
            Value::from(c.release_lock_on_device_malloc),
        ),
        (
            "pinned_use_cuda_host_register",
            Value::from(c.pinned_use_host_register),
        ),
        (
            "graph_capture_record_stream_reuse",
            Value::from(c.graph_capture_record_stream_reuse != cachalot_core::CaptureReuse::Off),
        ),
        ("roundup_power2_divisions", Value::Dict(divisions)),
    ])
}

/// The `_snapshot()` dictionary of one or more devices' snapshots.
/// `device_traces` has one list per device index up to the largest given;
/// `allocator_settings` come from the first snapshot.
pub fn snapshot_value(snapshots: &[Snapshot]) -> Value {
    let mut segments: Vec<(u32, u64, Value)> = Vec::new();
    for snap in snapshots {
        for seg in &snap.segments {
            let blocks = seg
                .blocks
                .iter()
                .map(|b| {
                    dict([
                        ("address", Value::from(b.address)),
                        ("size", Value::from(b.size)),
                        ("requested_size", Value::from(b.requested_size)),
                        ("state", Value::from(b.state.as_str())),
                        ("frames", Value::List(Vec::new())),
                    ])
                })
                .collect();
            let v = dict([
                ("device", Value::from(seg.device)),
                ("address", Value::from(seg.address)),
                ("total_size", Value::from(seg.total_size)),
                ("allocated_size", Value::from(seg.allocated_size)),
                ("active_size", Value::from(seg.active_size)),
                ("requested_size", Value::from(seg.requested_size)),
                ("stream", Value::from(stream_number(&seg.stream))),
                (
                    "segment_type",
                    Value::from(if seg.is_small { "small" } else { "large" }),
                ),
                (
                    "segment_pool_id",
                    Value::Tuple(vec![Value::from(seg.pool_id.0), Value::from(seg.pool_id.1)]),
                ),
                ("is_expandable", Value::Bool(seg.is_expandable)),
                ("frames", Value::List(Vec::new())),
                ("blocks", Value::List(blocks)),
            ]);
            segments.push((seg.device, seg.address, v));
        }
    }
    segments.sort_by_key(|s| (s.0, s.1));
    let ndev = snapshots
        .iter()
        .map(|s| s.device as usize + 1)
        .max()
        .unwrap_or(0);
    let mut traces = vec![Value::List(Vec::new()); ndev];
    for snap in snapshots {
        traces[snap.device as usize] = Value::List(snap.traces.iter().map(trace_entry).collect());
    }
    // PyTorch's annotation dicts: the metadata, `device`, `time_us`
    let annotations = snapshots
        .iter()
        .flat_map(|snap| {
            snap.annotations.iter().map(|a| {
                let mut d: Vec<(Value, Value)> = a
                    .metadata
                    .iter()
                    .map(|(k, v)| (Value::from(k.as_str()), Value::from(v.as_str())))
                    .collect();
                d.push((Value::from("device"), Value::from(snap.device)));
                d.push((Value::from("time_us"), Value::from(a.time_us)));
                Value::Dict(d)
            })
        })
        .collect();
    let settings = snapshots.first().map_or_else(
        || allocator_settings(&AllocatorConfig::default()),
        |s| allocator_settings(&s.config),
    );
    dict([
        (
            "segments",
            Value::List(segments.into_iter().map(|s| s.2).collect()),
        ),
        ("device_traces", Value::List(traces)),
        ("allocator_settings", settings),
        ("external_annotations", Value::List(annotations)),
    ])
}

/// The snapshot as a pickle for `torch.cuda._memory_viz` (see
/// [`crate::pickle`]; every number of a snapshot is 64-bit, so the error
/// does not occur in practice).
pub fn snapshot_pickle(snapshots: &[Snapshot]) -> Result<Vec<u8>, crate::pickle::PickleError> {
    snapshot_value(snapshots).to_pickle()
}

/// The snapshot as JSON with the same structure (tuples as arrays).
pub fn snapshot_json(snapshots: &[Snapshot]) -> String {
    snapshot_value(snapshots).to_json()
}

/// Whether a snapshot written to `path` is a pickle: its name ends in
/// `.pickle` or `.pkl` (else it is JSON).
pub fn is_pickle_path(path: impl AsRef<Path>) -> bool {
    matches!(
        path.as_ref().extension().and_then(|e| e.to_str()),
        Some("pickle" | "pkl")
    )
}

/// Writes the snapshot to `w`: a pickle when `pickle`, else JSON.
pub fn write_snapshot_to(
    w: &mut impl std::io::Write,
    snapshots: &[Snapshot],
    pickle: bool,
) -> std::io::Result<()> {
    let bytes = if pickle {
        snapshot_pickle(snapshots).map_err(std::io::Error::other)?
    } else {
        snapshot_json(snapshots).into_bytes()
    };
    w.write_all(&bytes)
}

/// Writes the snapshot to `path`: a pickle when the name ends in `.pickle`
/// or `.pkl`, else JSON.
pub fn write_snapshot(path: impl AsRef<Path>, snapshots: &[Snapshot]) -> std::io::Result<()> {
    let path = path.as_ref();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    write_snapshot_to(&mut f, snapshots, is_pickle_path(path))?;
    std::io::Write::flush(&mut f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_numbers() {
        assert_eq!(stream_number("MockStream(3)"), 3);
        assert_eq!(stream_number("CudaStream(legacy)"), 0);
        assert_eq!(stream_number("CudaStream(per-thread)"), 2);
        assert_eq!(stream_number("CudaStream(0x5f00a0)"), 0x5f00a0);
        assert_eq!(stream_number("HipStream(1234)"), 1234);
        assert_eq!(stream_number("7"), 7);
        assert_eq!(stream_number("weird"), 0);
    }

    #[test]
    fn frames_from_backtrace() {
        let bt = "   0: cachalot_core::engine::history::History::push\n             at /src/history.rs:95:26\n   1: main\n";
        let v = backtrace_frames(bt).to_json();
        assert_eq!(
            v,
            r#"[{"name":"cachalot_core::engine::history::History::push","filename":"/src/history.rs","line":95},{"name":"main","filename":"??","line":0}]"#
        );
    }
}
