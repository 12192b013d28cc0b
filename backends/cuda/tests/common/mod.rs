//! Shared helpers of the CUDA integration tests.
#![allow(dead_code)]

use cachalot_cuda::CudaBackend;

/// Opens device 0, or prints "skipped: <reason>" and returns `None` when this
/// machine has no usable CUDA driver or device (CI, build machines).
pub fn backend_or_skip(test: &str) -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(cachalot_core::Error::NoDevice(reason)) => {
            println!("skipped: {test}: {reason}");
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
