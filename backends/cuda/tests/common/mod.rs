//! Shared helpers of the CUDA integration tests.
#![allow(dead_code)]

use cachalot_cuda::CudaBackend;

/// Reports a test that cannot run here: writes `skipped: <reason>` to
/// stderr and returns, or panics when `CACHALOT_REQUIRE_GPU` is set (to
/// anything but `0`): the packed `run.sh` sets it on the machine with the
/// hardware, where a skip would hide a test that never ran. The note is a
/// direct write to stderr, which libtest does not capture (it captures
/// `println!`), so `cargo test` shows it.
pub fn skip(reason: impl std::fmt::Display) {
    if std::env::var("CACHALOT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0") {
        panic!("CACHALOT_REQUIRE_GPU is set, and this test would skip: {reason}");
    }
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("skipped: {reason}\n").as_bytes());
}

/// Opens device 0, or [skips](skip) and returns `None` when this machine
/// has no usable CUDA driver or device (CI, build machines).
pub fn backend_or_skip(test: &str) -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(cachalot_core::Error::NoDevice(reason)) => {
            skip(format_args!("{test}: {reason}"));
            None
        }
        Err(e) => panic!("{test}: CudaBackend::new(0) failed: {e}"),
    }
}

/// Reads `len` bytes at device address `ptr`.
pub fn read_back(b: &CudaBackend, ptr: u64, len: usize) -> Vec<u8> {
    let mut host = vec![0u8; len];
    b.memcpy_dtoh(&mut host, ptr).expect("memcpy_dtoh");
    host
}
