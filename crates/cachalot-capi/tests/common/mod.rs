//! What the C ABI's test binaries share: the lock and setup on the mock
//! backend, the last error, and the calls most tests make (allocate, read
//! the stats, take a snapshot). Each `tests/*.rs` is a crate of its own that
//! includes this with `mod common;` and uses a part of it.

#![allow(dead_code)]

use std::ffi::{CStr, c_int, c_void};
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

use cachalot_capi::drop_in::*;
use cachalot_capi::*;

/// The functions share process-wide allocators: one test at a time.
static LOCK: Mutex<()> = Mutex::new(());

/// Takes the lock (held while the guard lives), then installs the mock
/// backend with the error log off.
pub fn lock_mock() -> MutexGuard<'static, ()> {
    let g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: a NUL-terminated literal.
    assert_eq!(unsafe { cachalot_init(c"mock".as_ptr()) }, CACHALOT_OK);
    cachalot_set_error_logging(0);
    g
}

/// [`lock_mock`], and every test starts from an empty cache.
pub fn setup() -> MutexGuard<'static, ()> {
    let g = lock_mock();
    assert_eq!(cachalot_empty_cache(-1), CACHALOT_OK);
    g
}

/// This thread's last error, if there is one.
pub fn last_error_opt() -> Option<String> {
    let p = cachalot_last_error();
    // SAFETY: NULL or a NUL-terminated string valid until the next call.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// This thread's last error; there must be one.
pub fn last_error() -> String {
    last_error_opt().expect("no last error")
}

/// Asserts a call succeeded, with the last error if not.
pub fn ok(rc: c_int) {
    assert_eq!(rc, CACHALOT_OK, "{}", last_error());
}

/// The block of an allocation call that returned `rc`, or `rc` and the
/// last error.
fn outcome(rc: c_int, p: *mut c_void) -> Result<*mut c_void, (c_int, String)> {
    if rc == CACHALOT_OK {
        Ok(p)
    } else {
        Err((rc, last_error()))
    }
}

/// `cachalot_alloc` on device 0 and `stream`: the block, or the code and
/// the last error.
pub fn try_alloc_on(size: usize, stream: *mut c_void) -> Result<*mut c_void, (c_int, String)> {
    let mut p = null_mut();
    // SAFETY: `p` is a valid out-pointer.
    let rc = unsafe { cachalot_alloc(size, 0, stream.cast(), &mut p) };
    outcome(rc, p)
}

/// [`try_alloc_on`] the default stream.
pub fn try_alloc(size: usize) -> Result<*mut c_void, (c_int, String)> {
    try_alloc_on(size, null_mut())
}

/// `cachalot_alloc_in_pool` on device 0 and the default stream: the block,
/// or the code and the last error.
pub fn try_alloc_in(pool: (u64, u64), size: usize) -> Result<*mut c_void, (c_int, String)> {
    let mut p = null_mut();
    // SAFETY: `p` is a valid out-pointer.
    let rc = unsafe { cachalot_alloc_in_pool(size, 0, null_mut(), pool.0, pool.1, &mut p) };
    outcome(rc, p)
}

/// [`try_alloc_on`]; it must succeed.
pub fn alloc(size: usize, stream: *mut c_void) -> *mut c_void {
    try_alloc_on(size, stream).unwrap_or_else(|(rc, e)| panic!("cachalot_alloc: {rc}: {e}"))
}

/// [`try_alloc_in`]; it must succeed.
pub fn alloc_in(pool: (u64, u64), size: usize) -> *mut c_void {
    try_alloc_in(pool, size).unwrap_or_else(|(rc, e)| panic!("cachalot_alloc_in_pool: {rc}: {e}"))
}

/// Device 0's stats as the C struct.
pub fn stats() -> CachalotDeviceStats {
    let mut s = CachalotDeviceStats::default();
    // SAFETY: `s` is writable and of the size passed.
    ok(unsafe { cachalot_get_stats(0, &mut s, std::mem::size_of_val(&s)) });
    s
}

/// A device's stats as the flat JSON object of `cachalot_memory_stats_json`.
pub fn json_stats(device: c_int) -> serde_json::Map<String, serde_json::Value> {
    let p = cachalot_memory_stats_json(device);
    assert!(!p.is_null(), "{:?}", last_error_opt());
    // SAFETY: a NUL-terminated string from cachalot, released right after.
    let s = unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned();
    // SAFETY: `p` came from cachalot_memory_stats_json and is released once.
    unsafe { cachalot_string_free(p) };
    match serde_json::from_str(&s).unwrap() {
        serde_json::Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

/// A snapshot of device 0, released when dropped.
pub struct Snap(*mut CachalotSnapshot);

impl Snap {
    /// The snapshot of pool `(hi, lo)` (`(0, 0)`: all), with the traces or not.
    pub fn take(hi: u64, lo: u64, traces: bool) -> Self {
        let mut p = null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { cachalot_snapshot(0, hi, lo, c_int::from(traces), &mut p) };
        assert_eq!(rc, CACHALOT_OK, "{}", last_error());
        assert!(!p.is_null());
        Snap(p)
    }
    pub fn get(&self) -> &CachalotSnapshot {
        // SAFETY: a live snapshot from cachalot_snapshot.
        unsafe { &*self.0 }
    }
    pub fn segments(&self) -> &[CachalotSegment] {
        let s = self.get();
        // SAFETY: cachalot's arrays, valid while the snapshot lives.
        unsafe { std::slice::from_raw_parts(s.segments, s.num_segments) }
    }
    pub fn blocks(&self) -> &[CachalotBlock] {
        let s = self.get();
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(s.blocks, s.num_blocks) }
    }
    pub fn traces(&self) -> &[CachalotTrace] {
        let s = self.get();
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(s.traces, s.num_traces) }
    }
}

impl Drop for Snap {
    fn drop(&mut self) {
        // SAFETY: from cachalot_snapshot, released once.
        unsafe { cachalot_snapshot_free(self.0) };
    }
}
