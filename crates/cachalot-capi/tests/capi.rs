//! The C functions called directly (as Rust `extern "C"` functions) on the
//! mock backend.

use std::ffi::{CStr, c_int, c_void};
use std::ptr::{null, null_mut};

use cachalot_capi::*;

mod common;
use common::*;

fn stat(device: c_int, key: &str) -> i64 {
    json_stats(device)[key].as_i64().unwrap()
}

#[test]
fn backend_and_devices() {
    let _g = lock_mock();
    let name = cachalot_backend_name();
    // SAFETY: a static NUL-terminated string.
    assert_eq!(unsafe { CStr::from_ptr(name) }.to_str().unwrap(), "mock");
    assert_eq!(cachalot_device_count(), 1);
    // Same backend again: fine; another one: an error with a message.
    // SAFETY: NUL-terminated literals.
    assert_eq!(unsafe { cachalot_init(c"mock".as_ptr()) }, CACHALOT_OK);
    // SAFETY: as above.
    let rc = unsafe { cachalot_init(c"cuda".as_ptr()) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("already 'mock'"));
    // SAFETY: as above.
    let rc = unsafe { cachalot_init(c"tpu".as_ptr()) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("unknown backend 'tpu'"));
    // A success clears the last error.
    assert_eq!(cachalot_device_count(), 1);
    assert_eq!(cachalot_last_error_code(), CACHALOT_OK);
    assert!(last_error_opt().is_none());
}

#[test]
fn malloc_free_and_stats() {
    let _g = lock_mock();
    let before = stat(0, "allocated_bytes.all.current");
    let p = cachalot_malloc(1000, 0, null_mut());
    assert!(!p.is_null(), "{:?}", last_error_opt());
    assert_eq!(cachalot_last_error_code(), CACHALOT_OK);
    assert_eq!(p.addr() % 512, 0);
    let s = json_stats(0);
    assert_eq!(s.len(), 122, "PyTorch's 122 flat keys");
    assert_eq!(
        s["allocated_bytes.all.current"].as_i64().unwrap(),
        before + 1024,
        "1000 B rounds to 1024 B"
    );
    assert!(s["reserved_bytes.all.peak"].as_i64().unwrap() >= 2 << 20);
    cachalot_free(p, 1000, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_OK);
    assert_eq!(stat(0, "allocated_bytes.all.current"), before);

    // 0 bytes: NULL and success; NULL frees are no-ops.
    assert!(cachalot_malloc(0, 0, null_mut()).is_null());
    assert_eq!(cachalot_last_error_code(), CACHALOT_OK);
    cachalot_free(null_mut(), 0, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_OK);

    // Cached memory goes back with empty_cache.
    assert_eq!(cachalot_empty_cache(0), CACHALOT_OK);
    assert_eq!(cachalot_empty_cache(-1), CACHALOT_OK);
    assert_eq!(stat(0, "reserved_bytes.all.current"), 0, "nothing is live");
    assert_eq!(cachalot_reset_peak_stats(0), CACHALOT_OK);
    let s = json_stats(0);
    assert_eq!(
        s["reserved_bytes.all.peak"],
        s["reserved_bytes.all.current"]
    );
}

#[test]
fn bad_arguments_are_errors_not_crashes() {
    let _g = lock_mock();
    let p = cachalot_malloc(4096, 0, null_mut());
    assert!(!p.is_null());
    cachalot_free(p, 4096, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_OK);

    // Double free.
    cachalot_free(p, 4096, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_DOUBLE_FREE);
    let msg = last_error();
    assert!(msg.starts_with("cachalot_free: double free"), "{msg}");

    // A pointer never handed out.
    cachalot_free(std::ptr::without_provenance_mut(0x1234), 8, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INVALID_POINTER);
    assert!(last_error().contains("0x1234"));

    // Bad devices.
    assert!(cachalot_malloc(64, 7, null_mut()).is_null());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("out of range"),
        "{:?}",
        last_error_opt()
    );
    assert!(cachalot_malloc(64, -1, null_mut()).is_null());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("negative"));
    cachalot_free(p, 4096, 3, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(cachalot_memory_stats_json(9).is_null());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INVALID_ARGUMENT);
    assert_eq!(cachalot_empty_cache(5), CACHALOT_ERR_INVALID_ARGUMENT);

    // Negative size; absurd size.
    assert!(cachalot_malloc(-5, 0, null_mut()).is_null());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(cachalot_malloc(isize::MAX, 0, null_mut()).is_null());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_NEVER_FITS);
    // Larger than the device: never fits either (mock = an H200's memory).
    assert!(cachalot_malloc(200 << 30, 0, null_mut()).is_null());
    let code = cachalot_last_error_code();
    assert!(
        code == CACHALOT_ERR_NEVER_FITS || code == CACHALOT_ERR_OUT_OF_MEMORY,
        "{code}: {:?}",
        last_error_opt()
    );

    // An unknown stream handle on the mock.
    assert!(cachalot_malloc(64, 0, std::ptr::without_provenance_mut(0xdead)).is_null());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("unknown stream handle 0xdead"));

    // NULL strings and out-pointers.
    // SAFETY: NULL is allowed (an error).
    let rc = unsafe { cachalot_set_config(null()) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    // SAFETY: NULL is allowed (an error).
    let rc = unsafe { cachalot_stream_create(0, null_mut()) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    // record_stream on a freed pointer (its segment may be released already).
    let rc = cachalot_record_stream(p, 0, null_mut());
    assert!(
        rc == CACHALOT_ERR_DOUBLE_FREE || rc == CACHALOT_ERR_INVALID_POINTER,
        "{rc}"
    );
}

#[test]
fn set_config_errors_and_effect() {
    let _g = lock_mock();
    // Make sure device 0's allocator exists (set_config also reaches
    // allocators created later; that path is in the C smoke test).
    cachalot_free(cachalot_malloc(1, 0, null_mut()), 1, 0, null_mut());
    // SAFETY: NUL-terminated literals.
    let rc = unsafe { cachalot_set_config(c"max_split_size_mb:banana".as_ptr()) };
    assert_eq!(rc, CACHALOT_ERR_CONFIG);
    let msg = last_error();
    assert!(msg.starts_with("cachalot_set_config:"), "{msg}");
    assert!(msg.contains("max_split_size_mb"), "{msg}");
    // SAFETY: as above.
    let rc = unsafe { cachalot_set_config(c"no_such_key:1".as_ptr()) };
    assert_eq!(rc, CACHALOT_ERR_CONFIG);
    assert!(last_error().contains("no_such_key"));
    // Nothing changed.
    let split = || {
        cachalot::allocator(Some(0))
            .unwrap()
            .config()
            .max_split_size
    };
    assert_eq!(split(), u64::MAX);

    // SAFETY: as above.
    let rc = unsafe { cachalot_set_config(c"max_split_size_mb:64".as_ptr()) };
    assert_eq!(rc, CACHALOT_OK, "{:?}", last_error_opt());
    assert_eq!(split(), 64 << 20);
    // SAFETY: as above.
    let rc = unsafe { cachalot_set_config(c"".as_ptr()) };
    assert_eq!(rc, CACHALOT_OK, "{:?}", last_error_opt());
    assert_eq!(split(), u64::MAX, "a new string re-parses (PyTorch's rule)");
}

#[test]
fn record_stream_on_a_second_stream() {
    let _g = lock_mock();
    let mut side: *mut c_void = null_mut();
    // SAFETY: `side` is valid for one write.
    assert_eq!(unsafe { cachalot_stream_create(0, &mut side) }, CACHALOT_OK);
    assert!(!side.is_null(), "a mock stream index > 0");
    let p = cachalot_malloc(3 << 20, 0, side);
    assert!(!p.is_null(), "{:?}", last_error_opt());
    assert_eq!(cachalot_record_stream(p, 0, null_mut()), CACHALOT_OK);
    cachalot_free(p, 3 << 20, 0, side);
    assert_eq!(cachalot_last_error_code(), CACHALOT_OK);
    // A block freed on `side` serves the next request on `side`.
    let q = cachalot_malloc(3 << 20, 0, side);
    assert_eq!(q, p);
    cachalot_free(q, 3 << 20, 0, side);
}

#[test]
fn threads_have_their_own_last_error() {
    let _g = lock_mock();
    cachalot_free(std::ptr::without_provenance_mut(0x40), 1, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INVALID_POINTER);
    std::thread::spawn(|| {
        assert_eq!(cachalot_last_error_code(), CACHALOT_OK);
        assert!(cachalot_last_error().is_null());
        let p = cachalot_malloc(100, 0, null_mut());
        assert!(!p.is_null());
        cachalot_free(p, 100, 0, null_mut());
    })
    .join()
    .unwrap();
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INVALID_POINTER);
}

#[test]
fn set_config_storage_stays_flat() {
    let _g = lock_mock();
    cachalot_free(cachalot_malloc(1, 0, null_mut()), 1, 0, null_mut());
    let mut at_1k = 0;
    // Miri runs fewer calls (each parse is slow there): still past 1k.
    let calls: u32 = if cfg!(miri) { 1_500 } else { 100_000 };
    for i in 0..calls {
        // only keys every parse resets: the other tests see no trace of it
        let s = std::ffi::CString::new(format!(
            "max_split_size_mb:{},garbage_collection_threshold:0.{}",
            20 + i % 1000,
            i + 1
        ))
        .unwrap();
        // SAFETY: a NUL-terminated string.
        let rc = unsafe { cachalot_set_config(s.as_ptr()) };
        assert_eq!(rc, CACHALOT_OK, "{:?}", last_error_opt());
        if i == 999 {
            at_1k = stored_config_bytes();
        }
    }
    let at_end = stored_config_bytes();
    assert!(
        at_end <= at_1k + 8,
        "{at_1k} B after 1k calls, {at_end} B after {calls}"
    );
    assert!(at_end < 256, "{at_end} B stored");
    let c = cachalot::allocator(Some(0)).unwrap().config();
    assert_eq!(c.max_split_size, u64::from(20 + (calls - 1) % 1000) << 20);
    let last_threshold: f64 = format!("0.{calls}").parse().unwrap();
    assert_eq!(c.garbage_collection_threshold, last_threshold);
    // SAFETY: a NUL-terminated literal.
    assert_eq!(unsafe { cachalot_set_config(c"".as_ptr()) }, CACHALOT_OK);
    assert_eq!(stored_config_bytes(), 0, "only the empty last string");
}

#[test]
fn hostile_config_strings() {
    let _g = lock_mock();
    cachalot_free(cachalot_malloc(1, 0, null_mut()), 1, 0, null_mut());
    let before = stored_config_bytes();
    let split = || {
        cachalot::allocator(Some(0))
            .unwrap()
            .config()
            .max_split_size
    };
    let was = split();
    for (s, needle) in [
        (
            "roundup_power2_divisions:9223372036854775808".to_string(),
            "roundup_power2_divisions",
        ),
        (
            "large_segment_size_mb:18446744073709551615".to_string(),
            "1099511627776",
        ),
        (":".to_string(), "expected a key, found ':' at offset 0"),
        (",,".to_string(), "expected a key, found ','"),
        // (Miri: just over the limit; reading 100 MiB there takes hours)
        (
            "x".repeat(if cfg!(miri) { 65 << 10 } else { 100 << 20 }),
            "at most 65536",
        ),
    ] {
        let c = std::ffi::CString::new(s.clone()).unwrap();
        // SAFETY: a NUL-terminated string.
        let rc = unsafe { cachalot_set_config(c.as_ptr()) };
        assert_eq!(rc, CACHALOT_ERR_CONFIG);
        let msg = last_error();
        assert!(msg.contains(needle), "{msg}");
        assert!(msg.len() < 400, "{} bytes of message", msg.len());
        assert_eq!(split(), was, "nothing changed");
        assert_eq!(stored_config_bytes(), before, "nothing stored");
    }
    // not UTF-8
    // SAFETY: a NUL-terminated byte string.
    let rc = unsafe { cachalot_set_config(c"max_split_size_mb:\xff".as_ptr()) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("not UTF-8"));
    // a backend name is echoed truncated
    let long = std::ffi::CString::new("q".repeat(if cfg!(miri) { 4096 } else { 1 << 20 })).unwrap();
    // SAFETY: a NUL-terminated string.
    let rc = unsafe { cachalot_init(long.as_ptr()) };
    assert_ne!(rc, CACHALOT_OK);
    assert!(last_error().len() < 400);
}

#[test]
fn interior_pointers_have_their_own_code() {
    let _g = lock_mock();
    let p = cachalot_malloc(4096, 0, null_mut());
    assert!(!p.is_null());
    let inner = p.wrapping_byte_add(100);
    cachalot_free(inner, 4096, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_INTERIOR_POINTER);
    let msg = last_error();
    assert!(msg.contains("inside the live allocation"), "{msg}");
    assert_eq!(
        cachalot_record_stream(inner, 0, null_mut()),
        CACHALOT_ERR_INTERIOR_POINTER
    );
    // still live: frees normally, then it is a double free
    cachalot_free(p, 4096, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_OK);
    cachalot_free(p, 4096, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_DOUBLE_FREE);
}
