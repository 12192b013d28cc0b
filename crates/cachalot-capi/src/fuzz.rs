//! The C ABI fuzz harness (feature `fuzzing`): random sequences of C calls
//! from several threads at once, on the mock backend.
//!
//! The bytes choose 1 to 4 threads and each thread's calls: `cachalot_malloc`
//! (any size, including negative ones, on good and bad devices and
//! streams), `cachalot_free` of live, handed-over, interior, never-allocated
//! and NULL pointers and on bad devices, `cachalot_record_stream`,
//! `cachalot_empty_cache`, `cachalot_reset_peak_stats`,
//! `cachalot_memory_stats_json` / `cachalot_string_free`,
//! `cachalot_set_config` with arbitrary bytes (and NULL), `cachalot_init`
//! with arbitrary names, and the getters. Pointers move between threads
//! through a shared list, so one thread frees what another allocated.
//!
//! Properties: no call panics (no [`CACHALOT_ERR_PANIC`]); each call's
//! result and the thread's last error agree (code and message set exactly
//! when the call failed); a misuse gets its documented code; and when every
//! thread is done and everything is freed, no byte is allocated, the
//! engine's invariants hold and the stored configuration stays bounded.
//!
//! The libFuzzer target `capi` (`fuzz/`) and this crate's test
//! `fuzz_regressions_capi` call [`capi`]. The allocators are process-wide,
//! so each input starts by restoring the default configuration.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::{Mutex, OnceLock};

use arbitrary::{Arbitrary, Unstructured};

use crate::*;

/// Restores the default of every key a configuration string keeps across
/// calls (`pinned_reserve_segment_size_mb` has no settable default and is
/// only stored).
const RESET_CONFIG: &CStr = c"large_segment_size_mb:20,expandable_segments:False,\
release_lock_on_device_malloc:False,graph_capture_record_stream_reuse:False,\
per_process_memory_fraction:1.0,throw_on_device_malloc_oom:False,\
idle_stream_reuse:False,placement:steady,pinned_use_cuda_host_register:False,\
pinned_num_register_threads:1,pinned_use_background_threads:False";

/// Config strings to draw from, besides raw bytes.
const CONFIGS: &[&CStr] = &[
    c"",
    c"max_split_size_mb:40",
    c"roundup_power2_divisions:4",
    c"garbage_collection_threshold:0.6",
    c"per_process_memory_fraction:0.001",
    c"per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True",
    c"idle_stream_reuse:True,placement:pytorch",
    c"roundup_power2_divisions:[1:2,>:8],max_split_size_mb:64",
    c"large_segment_size_mb:12",
    c"max_split_size_mb:banana",
    c"backend:cudaMallocAsync",
];

/// A device argument.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Device {
    /// Device 0, the only mock device.
    Zero,
    /// -1 (every device, where allowed).
    All,
    /// Any `c_int`.
    Any(c_int),
}

impl Device {
    fn index(self) -> c_int {
        match self {
            Device::Zero => 0,
            Device::All => -1,
            Device::Any(d) => d,
        }
    }
}

/// A size argument.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Size {
    /// Below 64 KiB.
    Small(u16),
    /// Below 64 MiB.
    Medium(u32),
    /// Any `isize` (negative, never fits).
    Any(isize),
}

impl Size {
    fn bytes(self) -> isize {
        match self {
            Size::Small(n) => n as isize,
            Size::Medium(n) => (n % (64 << 20)) as isize,
            Size::Any(n) => n,
        }
    }
}

/// One C call (indices are taken modulo what exists).
#[derive(Arbitrary, Debug, Clone)]
pub enum Call {
    /// `cachalot_malloc`.
    Malloc {
        /// Size.
        size: Size,
        /// Device.
        device: Device,
        /// Stream: 0 the default, 1..=3 created ones, others unknown.
        stream: u8,
    },
    /// `cachalot_free` of one of this thread's pointers.
    Free {
        /// Which.
        pick: u16,
    },
    /// Hand one of this thread's pointers to the shared list.
    Share {
        /// Which.
        pick: u16,
    },
    /// `cachalot_free` of a pointer from the shared list.
    FreeShared,
    /// `cachalot_free` of an interior pointer of this thread's pointer.
    FreeInterior {
        /// Which.
        pick: u16,
        /// Offset (at least 1, below the size).
        offset: u32,
    },
    /// `cachalot_free` of a pointer never handed out, and of NULL.
    FreeBogus {
        /// Offset from an address far from any segment.
        offset: u32,
    },
    /// `cachalot_free` of this thread's pointer naming a bad device (it
    /// stays live).
    FreeWrongDevice {
        /// Which.
        pick: u16,
        /// The device (not 0).
        device: c_int,
    },
    /// `cachalot_record_stream`.
    RecordStream {
        /// Which of this thread's pointers.
        pick: u16,
        /// Stream as for `Malloc`.
        stream: u8,
    },
    /// `cachalot_empty_cache`.
    EmptyCache(Device),
    /// `cachalot_reset_peak_stats`.
    ResetPeak(Device),
    /// `cachalot_memory_stats_json` and `cachalot_string_free`.
    Stats(Device),
    /// `cachalot_set_config` with one of a list of valid and invalid strings.
    SetConfig(u8),
    /// `cachalot_set_config` with raw bytes (up to a NUL).
    SetConfigRaw(Vec<u8>),
    /// `cachalot_set_config(NULL)`.
    SetConfigNull,
    /// `cachalot_init` with raw bytes (or NULL).
    Init(Option<Vec<u8>>),
    /// `cachalot_stream_create` with a NULL output.
    StreamCreateNull(Device),
    /// `cachalot_device_count`, `cachalot_backend_name`.
    Getters,
}

/// The streams created once per process: handles of streams 1..=3.
fn streams() -> &'static [usize; 3] {
    static S: OnceLock<[usize; 3]> = OnceLock::new();
    S.get_or_init(|| {
        let mut out = [0usize; 3];
        for h in &mut out {
            let mut p: *mut c_void = null_mut();
            // SAFETY: `p` is valid for one pointer write.
            let rc = unsafe { cachalot_stream_create(0, &mut p) };
            assert_eq!(rc, CACHALOT_OK, "stream_create: {:?}", last_error());
            *h = p.addr();
        }
        out
    })
}

fn stream_handle(s: u8) -> *mut c_void {
    let h = match s % 8 {
        0 => 0,
        i @ 1..=3 => streams()[i as usize - 1],
        // never handed out
        i => 0x7777_0000 + i as usize,
    };
    std::ptr::without_provenance_mut(h)
}

fn last_error() -> Option<String> {
    let p = cachalot_last_error();
    // SAFETY: NULL or a NUL-terminated string valid until the next call.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The last error agrees with a call's result `rc`.
fn check_rc(what: &str, rc: c_int) {
    assert_ne!(
        rc,
        CACHALOT_ERR_PANIC,
        "{what} panicked: {:?}",
        last_error()
    );
    assert_eq!(cachalot_last_error_code(), rc, "{what}: last error code");
    let msg = last_error();
    assert_eq!(msg.is_some(), rc != CACHALOT_OK, "{what}: message {msg:?}");
    if let Some(m) = msg {
        assert!(m.len() <= 1024, "{what}: message too long: {m}");
    }
}

fn check_code(what: &str, rc: c_int, allowed: &[c_int]) {
    check_rc(what, rc);
    assert!(
        allowed.contains(&rc),
        "{what}: code {rc} ({:?}), expected one of {allowed:?}",
        last_error()
    );
}

/// Whether `device` names device 0 (the mock has one).
fn good_device(device: c_int) -> bool {
    device == 0
}

/// A live allocation: address, requested size.
type Ptr = (usize, isize);

fn run_thread(calls: &[Call], shared: &Mutex<Vec<Ptr>>) {
    let mut own: Vec<Ptr> = Vec::new();
    let free = |p: usize| {
        cachalot_free(std::ptr::without_provenance_mut(p), 0, 0, null_mut());
        check_code("free", cachalot_last_error_code(), &[CACHALOT_OK]);
    };
    for call in calls {
        match call {
            Call::Malloc {
                size,
                device,
                stream,
            } => {
                let (size, device) = (size.bytes(), device.index());
                let known_stream = stream % 8 < 4;
                let p = cachalot_malloc(size, device, stream_handle(*stream));
                let rc = cachalot_last_error_code();
                check_rc("malloc", rc);
                if !p.is_null() {
                    assert!(size > 0 && good_device(device) && known_stream);
                    assert_eq!(p.addr() % 512, 0);
                    own.push((p.addr(), size));
                } else if size < 0 || !known_stream || !good_device(device) {
                    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT, "{:?}", last_error());
                } else if size > 0 {
                    check_code(
                        "malloc",
                        rc,
                        &[CACHALOT_ERR_OUT_OF_MEMORY, CACHALOT_ERR_NEVER_FITS],
                    );
                } else {
                    assert_eq!(rc, CACHALOT_OK, "malloc(0)");
                }
            }
            Call::Free { pick } => {
                if !own.is_empty() {
                    let (p, _) = own.swap_remove(*pick as usize % own.len());
                    free(p);
                }
            }
            Call::Share { pick } => {
                if !own.is_empty() {
                    let p = own.swap_remove(*pick as usize % own.len());
                    shared.lock().unwrap_or_else(|e| e.into_inner()).push(p);
                }
            }
            Call::FreeShared => {
                let p = shared.lock().unwrap_or_else(|e| e.into_inner()).pop();
                if let Some((p, _)) = p {
                    free(p);
                }
            }
            Call::FreeInterior { pick, offset } => {
                if !own.is_empty() {
                    let (p, size) = own[*pick as usize % own.len()];
                    if size > 1 {
                        let off = 1 + *offset as usize % (size as usize - 1);
                        cachalot_free(std::ptr::without_provenance_mut(p + off), 0, 0, null_mut());
                        check_code(
                            "interior free",
                            cachalot_last_error_code(),
                            &[CACHALOT_ERR_INTERIOR_POINTER],
                        );
                    }
                }
            }
            Call::FreeBogus { offset } => {
                let p = 0x10_0000_0000_0000usize + *offset as usize;
                cachalot_free(std::ptr::without_provenance_mut(p), 0, 0, null_mut());
                check_code(
                    "free of a bogus pointer",
                    cachalot_last_error_code(),
                    &[CACHALOT_ERR_INVALID_POINTER],
                );
                cachalot_free(null_mut(), 0, 0, null_mut());
                check_code("free(NULL)", cachalot_last_error_code(), &[CACHALOT_OK]);
            }
            Call::FreeWrongDevice { pick, device } => {
                if !own.is_empty() && *device != 0 {
                    let (p, _) = own[*pick as usize % own.len()];
                    cachalot_free(std::ptr::without_provenance_mut(p), 0, *device, null_mut());
                    check_code(
                        "free on a bad device",
                        cachalot_last_error_code(),
                        &[CACHALOT_ERR_INVALID_ARGUMENT],
                    );
                }
            }
            Call::RecordStream { pick, stream } => {
                if !own.is_empty() {
                    let (p, _) = own[*pick as usize % own.len()];
                    let rc = cachalot_record_stream(
                        std::ptr::without_provenance_mut(p),
                        0,
                        stream_handle(*stream),
                    );
                    let want = if stream % 8 < 4 {
                        CACHALOT_OK
                    } else {
                        CACHALOT_ERR_INVALID_ARGUMENT
                    };
                    check_code("record_stream", rc, &[want]);
                }
            }
            Call::EmptyCache(d) => {
                let d = d.index();
                let rc = cachalot_empty_cache(d);
                let want = if d == 0 || d == -1 {
                    CACHALOT_OK
                } else {
                    CACHALOT_ERR_INVALID_ARGUMENT
                };
                check_code("empty_cache", rc, &[want]);
            }
            Call::ResetPeak(d) => {
                let d = d.index();
                let rc = cachalot_reset_peak_stats(d);
                let want = if d == 0 || d == -1 {
                    CACHALOT_OK
                } else {
                    CACHALOT_ERR_INVALID_ARGUMENT
                };
                check_code("reset_peak_stats", rc, &[want]);
            }
            Call::Stats(d) => {
                let d = d.index();
                let s = cachalot_memory_stats_json(d);
                if good_device(d) {
                    assert!(!s.is_null(), "stats: {:?}", last_error());
                    check_rc("stats", CACHALOT_OK);
                    // SAFETY: a NUL-terminated string from cachalot.
                    let text = unsafe { CStr::from_ptr(s) }.to_str().expect("UTF-8 JSON");
                    let v: serde_json::Value = serde_json::from_str(text).expect("JSON");
                    assert_eq!(v.as_object().map(|m| m.len()), Some(122));
                } else {
                    assert!(s.is_null());
                    check_code(
                        "stats",
                        cachalot_last_error_code(),
                        &[CACHALOT_ERR_INVALID_ARGUMENT],
                    );
                }
                // SAFETY: NULL or a string from cachalot_memory_stats_json, released once.
                unsafe { cachalot_string_free(s) };
            }
            Call::SetConfig(i) => {
                let c = CONFIGS[*i as usize % CONFIGS.len()];
                // SAFETY: a NUL-terminated literal.
                let rc = unsafe { cachalot_set_config(c.as_ptr()) };
                check_code("set_config", rc, &[CACHALOT_OK, CACHALOT_ERR_CONFIG]);
            }
            Call::SetConfigRaw(bytes) => {
                let c = c_string(bytes);
                // SAFETY: a NUL-terminated string.
                let rc = unsafe { cachalot_set_config(c.as_ptr()) };
                check_code(
                    "set_config",
                    rc,
                    &[
                        CACHALOT_OK,
                        CACHALOT_ERR_CONFIG,
                        CACHALOT_ERR_INVALID_ARGUMENT,
                    ],
                );
            }
            Call::SetConfigNull => {
                // SAFETY: NULL is allowed.
                let rc = unsafe { cachalot_set_config(null()) };
                check_code("set_config(NULL)", rc, &[CACHALOT_ERR_INVALID_ARGUMENT]);
            }
            Call::Init(name) => {
                // Detection probes the CUDA library (dlopen), which Miri
                // cannot run: there the empty name is the mock's.
                let name = match name {
                    Some(b)
                        if cfg!(miri)
                            && b.iter()
                                .take_while(|&&c| c != 0)
                                .all(|c| c.is_ascii_whitespace()) =>
                    {
                        Some(b"mock".to_vec())
                    }
                    None if cfg!(miri) => Some(b"mock".to_vec()),
                    other => other.clone(),
                };
                let rc = match &name {
                    // SAFETY: a NUL-terminated string.
                    Some(bytes) => unsafe { cachalot_init(c_string(bytes).as_ptr()) },
                    // SAFETY: NULL is allowed.
                    None => unsafe { cachalot_init(null()) },
                };
                check_code("init", rc, &[CACHALOT_OK, CACHALOT_ERR_INVALID_ARGUMENT]);
                assert_eq!(backend(), "mock", "the backend stays the mock");
            }
            Call::StreamCreateNull(d) => {
                // SAFETY: NULL out is an error, not a write.
                let rc = unsafe { cachalot_stream_create(d.index(), null_mut()) };
                check_code("stream_create", rc, &[CACHALOT_ERR_INVALID_ARGUMENT]);
            }
            Call::Getters => {
                assert_eq!(cachalot_device_count(), 1);
                check_rc("device_count", CACHALOT_OK);
                assert_eq!(backend(), "mock");
            }
        }
    }
    for (p, _) in own {
        free(p);
    }
}

/// `bytes` up to their first NUL, as a C string.
fn c_string(bytes: &[u8]) -> CString {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    CString::new(&bytes[..end]).expect("no NUL before the end")
}

fn backend() -> String {
    let p: *const c_char = cachalot_backend_name();
    assert!(!p.is_null());
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn stat(key: &str) -> i64 {
    let s = cachalot_memory_stats_json(0);
    assert!(!s.is_null(), "{:?}", last_error());
    // SAFETY: a NUL-terminated string from cachalot.
    let text = unsafe { CStr::from_ptr(s) }
        .to_str()
        .expect("UTF-8")
        .to_owned();
    // SAFETY: from cachalot_memory_stats_json, released once.
    unsafe { cachalot_string_free(s) };
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    v[key].as_i64().expect("an integer stat")
}

/// Runs the calls the bytes decode to on 1 to 4 threads; panics when a
/// property breaks.
pub fn capi(data: &[u8]) {
    static SETUP: OnceLock<()> = OnceLock::new();
    SETUP.get_or_init(|| {
        cachalot_set_error_logging(0);
        // SAFETY: a NUL-terminated literal.
        let rc = unsafe { cachalot_init(c"mock".as_ptr()) };
        assert_eq!(rc, CACHALOT_OK, "{:?}", last_error());
        streams();
    });
    // SAFETY: a NUL-terminated literal.
    let rc = unsafe { cachalot_set_config(RESET_CONFIG.as_ptr()) };
    assert_eq!(rc, CACHALOT_OK, "{:?}", last_error());
    let mut u = Unstructured::new(data);
    let threads = 1 + u.int_in_range(0u8..=3).unwrap_or(0) as usize;
    let mut plans: Vec<Vec<Call>> = vec![Vec::new(); threads];
    let mut t = 0;
    while !u.is_empty() && plans.iter().map(Vec::len).sum::<usize>() < 1024 {
        let Ok(call) = Call::arbitrary(&mut u) else {
            break;
        };
        plans[t].push(call);
        t = (t + 1) % threads;
    }
    let shared = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let handles: Vec<_> = plans
            .iter()
            .map(|calls| {
                let shared = &shared;
                s.spawn(move || run_thread(calls, shared))
            })
            .collect();
        for h in handles {
            if let Err(payload) = h.join() {
                std::panic::resume_unwind(payload);
            }
        }
    });
    for (p, _) in shared.into_inner().unwrap_or_else(|e| e.into_inner()) {
        cachalot_free(std::ptr::without_provenance_mut(p), 0, 0, null_mut());
        check_code("free", cachalot_last_error_code(), &[CACHALOT_OK]);
    }
    assert_eq!(cachalot_empty_cache(-1), CACHALOT_OK, "{:?}", last_error());
    assert_eq!(
        stat("allocated_bytes.all.current"),
        0,
        "bytes left allocated"
    );
    assert_eq!(stat("reserved_bytes.all.current"), 0, "bytes left reserved");
    let dev = cachalot::try_allocator(Some(0))
        .expect("the mock device")
        .expect("in use");
    if let Err(e) = dev.check_invariants() {
        panic!("invariant violated: {e}");
    }
    assert!(stored_config_bytes() <= 4 * cachalot::core::config::MAX_CONFIG_LEN);
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    /// The committed inputs of the `capi` target.
    fn inputs() -> Vec<(PathBuf, Vec<u8>)> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
        cachalot_core::fuzz::committed_inputs(&root, "capi")
    }

    /// Every committed input of the `capi` fuzz target through the same
    /// harness, then pseudo-random ones (this test binary holds only these
    /// tests: the allocators are process-wide).
    #[test]
    fn fuzz_regressions_capi() {
        let inputs = inputs();
        assert!(!inputs.is_empty(), "the capi seeds are committed");
        for (path, bytes) in inputs {
            eprintln!("{}", path.display());
            super::capi(&bytes);
        }
        let mut rng = cachalot::core::rng::SplitMix64::new(0x1234_5678_9abc_def0);
        let n = if cfg!(miri) { 2 } else { 100 };
        for _ in 0..n {
            let len = (rng.next_u64() % 1024) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            super::capi(&bytes);
        }
    }
}
