//! Fuzz harnesses of the trace and config parsers (feature `fuzzing`).
//!
//! Each function takes the fuzzer's bytes, drives a parser with them and
//! panics when a property breaks; a typed error is a pass. The libFuzzer
//! targets of `fuzz/` call these functions, and this crate's tests replay
//! the committed inputs of `fuzz/regressions/<target>/` and `fuzz/seeds/`
//! through the same functions on stable, so every crash found stays a test.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::config::{
    AllocatorConfig, ConfigReplay, MAX_CONFIG_LEN, MAX_ROUNDUP_DIVISIONS, MAX_SIZE_MB,
};
use crate::replay::{Op, Trace, TraceError, TraceLimits};

/// The committed inputs of fuzz target `target` under `fuzz_root` (the
/// repository's `fuzz/`): every file of `regressions/<target>/` and
/// `seeds/<target>/` with its bytes, sorted by path. The replay tests of
/// every harness (this crate's, the engine's, the C ABI's) read them so.
pub fn committed_inputs(fuzz_root: &Path, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for dir in ["regressions", "seeds"] {
        let Ok(entries) = std::fs::read_dir(fuzz_root.join(dir).join(target)) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_file() {
                let bytes = std::fs::read(&p).expect("read a committed fuzz input");
                out.push((p, bytes));
            }
        }
    }
    out.sort();
    out
}

/// Longest error message a hostile input may produce, in bytes: messages
/// echo a bounded excerpt of the input, never all of it.
pub const MAX_ERROR_MESSAGE: usize = 512;

/// The trace target. Input: trace text; when the first byte is 0, the
/// next three bytes choose small limits (operations, streams, line bytes)
/// and the rest is the text. Properties: no panic; errors are typed with a
/// bounded message; a chunked reader gives the same result as one buffer;
/// a parsed trace is consistent (dense ids and streams in range, each id
/// allocated once and freed at most once after it, limits kept) and
/// renders to text that parses back to the same trace.
pub fn trace(data: &[u8]) {
    let (limits, text) = match data {
        [0, ops, streams, line, rest @ ..] => (
            TraceLimits {
                max_ops: usize::from(*ops) + 1,
                max_streams: u32::from(*streams % 32) + 1,
                max_line_bytes: usize::from(*line) + 1,
            },
            rest,
        ),
        _ => (TraceLimits::default(), data),
    };
    let whole = Trace::from_reader("fuzz", text, &limits);
    // The same bytes through a reader that hands out 3 bytes at a time.
    let chunked = Trace::from_reader("fuzz", std::io::BufReader::with_capacity(3, text), &limits);
    match (&whole, &chunked) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "chunked reading changed the trace"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("chunked reading changed the outcome: {whole:?} vs {chunked:?}"),
    }
    match whole {
        Err(e) => {
            assert!(
                !matches!(e, TraceError::Io { .. }),
                "an in-memory reader cannot fail: {e}"
            );
            let msg = e.to_string();
            assert!(msg.len() <= MAX_ERROR_MESSAGE, "message too long: {msg}");
        }
        Ok(t) => check_trace(&t, &limits),
    }
}

fn check_trace(t: &Trace, limits: &TraceLimits) {
    assert!(!t.ops.is_empty());
    assert!(t.ops.len() <= limits.max_ops);
    assert!(t.num_streams >= 1 && t.num_streams <= limits.max_streams);
    assert_eq!(t.lines.len(), t.ops.len());
    assert!(t.lines.windows(2).all(|w| w[0] < w[1]), "lines ascend");
    for values in [&t.id_values, &t.stream_values] {
        assert!(values.windows(2).all(|w| w[0] < w[1]), "values ascend");
    }
    assert!(t.id_values.is_empty() || t.id_values.len() == t.num_ids);
    assert!(t.stream_values.is_empty() || t.stream_values.len() == t.num_streams as usize);
    // per dense id: allocated, freed
    let mut state = vec![(false, false); t.num_ids];
    let mut streams_seen = vec![false; t.num_streams as usize];
    for op in &t.ops {
        match *op {
            Op::Alloc { id, stream, .. } => {
                let s = &mut state[id as usize];
                assert!(!s.0, "id {id} allocated twice");
                s.0 = true;
                streams_seen[stream as usize] = true;
            }
            Op::Free { id } => {
                let s = &mut state[id as usize];
                assert!(s.0 && !s.1, "id {id} freed before its allocation or twice");
                s.1 = true;
            }
        }
    }
    assert!(state.iter().all(|s| s.0), "every id is allocated");
    assert!(streams_seen.iter().all(|&s| s), "every stream is used");
    // Round trip through the text form (its comment line is not an op).
    let round_limits = TraceLimits {
        max_line_bytes: TraceLimits::default().max_line_bytes,
        ..*limits
    };
    let again = Trace::from_reader("fuzz", t.to_text().as_bytes(), &round_limits)
        .expect("a rendered trace parses");
    assert_eq!(again.ops, t.ops);
    assert_eq!(again.num_ids, t.num_ids);
    assert_eq!(again.num_streams, t.num_streams);
    assert_eq!(again.id_values, t.id_values);
    assert_eq!(again.stream_values, t.stream_values);
    for i in 0..t.ops.len() {
        assert!(t.op_text(i).is_some() && t.line_of(i).is_some());
    }
    assert!(t.op_text(t.ops.len()).is_none());
}

/// Separator of the config strings in one config input (never in UTF-8).
pub const CONFIG_SEPARATOR: u8 = 0xff;

/// The config target. Input: up to 8 strings separated by
/// [`CONFIG_SEPARATOR`] (each taken as lossy UTF-8), applied in order.
/// Properties: no panic; a failed `apply` leaves the config unchanged and
/// gives a bounded message; a successful one keeps every value in its
/// documented range; [`ConfigReplay`] agrees with the applies and its
/// strings rebuild the same config from the defaults; the environment path
/// (non-UTF-8 values included) gives the same outcome as `parse`.
pub fn config(data: &[u8]) {
    let mut c = AllocatorConfig::default();
    let mut replay = ConfigReplay::new(AllocatorConfig::default());
    let mut input_bytes = 0usize;
    for piece in data.split(|&b| b == CONFIG_SEPARATOR).take(8) {
        let s = String::from_utf8_lossy(piece);
        input_bytes += s.len();
        let before = c.clone();
        let applied = c.apply(&s);
        let pushed = replay.push(&s);
        match (&applied, &pushed) {
            (Ok(()), Ok(())) => check_config(&c),
            (Err(a), Err(b)) => {
                assert_eq!(a.to_string(), b.to_string());
                assert_eq!(c, before, "a failed apply changed the config");
                let msg = a.to_string();
                assert!(msg.len() <= MAX_ERROR_MESSAGE, "message too long: {msg}");
                if s.len() > MAX_CONFIG_LEN {
                    assert!(matches!(
                        a.kind,
                        crate::error::ConfigErrorKind::TooLong { .. }
                    ));
                }
            }
            _ => panic!("apply {applied:?} and ConfigReplay::push {pushed:?} disagree"),
        }
        assert_eq!(replay.config(), &c);
        // parse is apply over the defaults
        let parsed = AllocatorConfig::parse(&s);
        assert_eq!(parsed.is_ok(), AllocatorConfig::default().apply(&s).is_ok());
    }
    let mut fresh = AllocatorConfig::default();
    for s in replay.strings() {
        fresh
            .apply(&s)
            .unwrap_or_else(|e| panic!("replayed string {s:?} fails: {e}"));
    }
    assert_eq!(fresh, c, "ConfigReplay::strings rebuild another config");
    assert!(replay.stored_bytes() <= 2 * input_bytes + 64 * 16);
    for size in [0, 1, 1 << 20, u64::MAX, data.len() as u64 * 0x1_0000_0001] {
        let _ = c.divisions_for(size);
    }
    let _ = c.max_split_size_stat();
    // The environment path, the raw bytes as the variable's value.
    let raw = data.split(|&b| b == CONFIG_SEPARATOR).next().unwrap_or(&[]);
    let from_env = AllocatorConfig::from_lookup(|var| {
        (var == "PYTORCH_ALLOC_CONF").then(|| os_string(raw.to_vec()))
    });
    match (std::str::from_utf8(raw), &from_env) {
        (Ok(s), _) => assert_eq!(
            from_env.as_ref().map_err(|e| e.kind.clone()),
            AllocatorConfig::parse(s)
                .as_ref()
                .map_err(|e| e.kind.clone())
        ),
        (Err(_), Err(e)) => {
            assert_eq!(e.env_var, Some("PYTORCH_ALLOC_CONF"));
            assert!(e.to_string().len() <= MAX_ERROR_MESSAGE);
        }
        (Err(_), Ok(_)) => panic!("a non-UTF-8 variable was accepted"),
    }
}

#[cfg(unix)]
fn os_string(bytes: Vec<u8>) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    OsString::from_vec(bytes)
}

#[cfg(not(unix))]
fn os_string(bytes: Vec<u8>) -> OsString {
    OsString::from(String::from_utf8_lossy(&bytes).into_owned())
}

/// Every value of a successfully applied config in its documented range.
fn check_config(c: &AllocatorConfig) {
    const MIB: u64 = 1 << 20;
    let max = MAX_SIZE_MB * MIB;
    assert!((11 * MIB..=max).contains(&c.large_segment_size));
    assert!(c.max_split_size == u64::MAX || c.max_split_size <= max);
    assert!(c.max_non_split_rounding_size <= max);
    assert!((0.0..1.0).contains(&c.garbage_collection_threshold));
    assert!((0.0..=1.0).contains(&c.per_process_memory_fraction));
    for &d in &c.roundup_power2_divisions {
        assert!(d == 0 || (d.is_power_of_two() && d <= MAX_ROUNDUP_DIVISIONS));
    }
    assert!(c.pinned_num_register_threads.is_power_of_two());
    assert!(c.pinned_num_register_threads <= 128);
    assert!(c.pinned_reserve_segment_size_mb <= MAX_SIZE_MB);
    assert!(c.last_config_string.len() <= MAX_CONFIG_LEN);
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// Every file of `fuzz/regressions/<target>/` and `fuzz/seeds/<target>/`.
    fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
        super::committed_inputs(&root, target)
    }

    #[test]
    fn fuzz_regressions_trace() {
        let inputs = inputs("trace");
        assert!(!inputs.is_empty(), "the trace seeds are committed");
        for (path, bytes) in inputs {
            eprintln!("{}", path.display());
            super::trace(&bytes);
        }
    }

    #[test]
    fn fuzz_regressions_config() {
        let inputs = inputs("config");
        assert!(!inputs.is_empty(), "the config seeds are committed");
        for (path, bytes) in inputs {
            eprintln!("{}", path.display());
            super::config(&bytes);
        }
    }

    #[test]
    fn harnesses_take_any_bytes() {
        for data in [
            &b""[..],
            b"\0",
            b"\0\0\0\0a 0 1 0\n",
            b"\xff\xff",
            b"a 0 1 0\nf 0\n",
        ] {
            super::trace(data);
            super::config(data);
        }
    }
}
