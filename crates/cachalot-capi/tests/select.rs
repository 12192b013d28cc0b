//! `cachalot_select`: the backend chosen without touching its driver (the
//! PyTorch drop-in installs with it, so that `import torch` and a fork
//! before any CUDA use stay as they are natively); what the device needs
//! is read at the first call that needs a device. The environment and the
//! backend are process-global: this binary holds one test.

use std::ffi::{CStr, c_char, c_int};
use std::ptr::{null, null_mut};

use cachalot_capi::*;

mod common;
use common::*;

fn select(name: &CStr) -> c_int {
    // SAFETY: a NUL-terminated string.
    unsafe { cachalot_select(name.as_ptr()) }
}

fn set(var: &str, value: &str) {
    // SAFETY: the only test of this binary, so no other thread reads or
    // writes the environment meanwhile.
    unsafe { std::env::set_var(var, value) };
}

fn backend_name() -> String {
    let p: *const c_char = cachalot_backend_name();
    assert!(!p.is_null(), "{}", last_error());
    // SAFETY: a static NUL-terminated string of the library.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()
}

#[test]
fn select_chooses_and_the_first_use_sets_up() {
    cachalot_set_error_logging(0);
    // SAFETY: NULL is reported, never read.
    let rc = unsafe { cachalot_select(null()) };
    assert_eq!(rc, CACHALOT_ERR_INVALID_ARGUMENT);
    assert_ne!(
        select(c""),
        CACHALOT_OK,
        "detection needs the driver: not here"
    );
    assert_ne!(select(c"frobnicate"), CACHALOT_OK);
    assert!(last_error().contains("frobnicate"), "{}", last_error());

    // a mock whose device count would be refused: choosing it reads nothing
    set("CACHALOT_MOCK_DEVICES", "4294967295");
    assert_eq!(select(c"mock"), CACHALOT_OK, "{}", last_error());
    assert_eq!(select(c"mock"), CACHALOT_OK, "the same again");
    assert_ne!(select(c"cuda"), CACHALOT_OK, "another one once chosen");
    assert!(last_error().contains("already 'mock'"), "{}", last_error());
    assert_eq!(backend_name(), "mock", "named without being set up");

    // the first call that needs a device sets it up, and says what is wrong
    assert_eq!(cachalot_device_count(), -1);
    assert!(
        last_error().contains("CACHALOT_MOCK_DEVICES"),
        "{}",
        last_error()
    );
    set("CACHALOT_MOCK_DEVICES", "2");
    assert_eq!(cachalot_device_count(), 2, "{}", last_error());
    let p = alloc(4096, null_mut());
    assert!(!p.is_null());
    cachalot_free(p, 4096, 0, null_mut());
    assert_eq!(cachalot_last_error_code(), CACHALOT_OK, "{}", last_error());
    // set up now: the same backend is still a no-op, another an error
    assert_eq!(select(c"mock"), CACHALOT_OK);
    assert_ne!(select(c"cuda"), CACHALOT_OK);
}
