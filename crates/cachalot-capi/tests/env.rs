//! Hostile environment variables through the C ABI (issue 17). The
//! environment is process-global: this binary holds one test.

use std::ffi::c_int;
use std::ptr::null_mut;

use cachalot_capi::*;

mod common;
use common::*;

fn set(var: &str, value: &str) {
    // SAFETY: the only test of this binary, so no other thread reads or
    // writes the environment meanwhile.
    unsafe { std::env::set_var(var, value) };
}

fn init() -> c_int {
    // SAFETY: a NUL-terminated literal.
    unsafe { cachalot_init(c"mock".as_ptr()) }
}

#[test]
fn hostile_mock_environment_is_an_error_code() {
    cachalot_set_error_logging(0);
    // once aborted cachalot_init (2^32 device slots)
    set("CACHALOT_MOCK_DEVICES", "4294967295");
    assert_eq!(init(), CACHALOT_ERR_INVALID_ARGUMENT);
    let msg = last_error();
    assert!(
        msg.contains("CACHALOT_MOCK_DEVICES") && msg.contains("[0, 64]"),
        "{msg}"
    );
    set("CACHALOT_MOCK_DEVICES", "2");
    set("CACHALOT_MOCK_MEMORY", "18446744073709551615");
    assert_eq!(init(), CACHALOT_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("CACHALOT_MOCK_MEMORY"));
    set("CACHALOT_MOCK_MEMORY", "1073741824");
    // a bad config variable: set_config and first use say so, naming it
    set(
        "CACHALOT_ALLOC_CONF",
        "max_split_size_mb:99999999999999999999",
    );
    assert_eq!(init(), CACHALOT_OK);
    assert_eq!(cachalot_device_count(), 2);
    // SAFETY: a NUL-terminated literal.
    let rc = unsafe { cachalot_set_config(c"garbage_collection_threshold:0.5".as_ptr()) };
    assert_eq!(rc, CACHALOT_ERR_CONFIG);
    assert!(last_error().contains("CACHALOT_ALLOC_CONF"));
    assert!(cachalot_malloc(512, 1, null_mut()).is_null());
    assert_eq!(cachalot_last_error_code(), CACHALOT_ERR_CONFIG);
    assert!(last_error().contains("CACHALOT_ALLOC_CONF"));
    set("CACHALOT_ALLOC_CONF", "large_segment_size_mb:40");
    // strings are checked against the environment's configuration
    // SAFETY: a NUL-terminated literal.
    let rc = unsafe { cachalot_set_config(c"max_split_size_mb:30".as_ptr()) };
    assert_eq!(rc, CACHALOT_ERR_CONFIG);
    assert!(last_error().contains("must be >= 40"));
    // SAFETY: a NUL-terminated literal.
    let rc = unsafe { cachalot_set_config(c"max_split_size_mb:50".as_ptr()) };
    assert_eq!(rc, CACHALOT_OK);
    let p = cachalot_malloc(512, 1, null_mut());
    assert!(!p.is_null());
    let c = cachalot::allocator(Some(1)).unwrap().config();
    assert_eq!(c.max_split_size, 50 << 20);
    assert_eq!(c.large_segment_size, 40 << 20);
    cachalot_free(p, 512, 1, null_mut());
}
