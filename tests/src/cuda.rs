//! The CUDA backend as a conformance-suite [`Harness`].

use std::time::Duration;

use cachalot_core::Backend;
use cachalot_cuda::{CudaBackend, CudaStream, OwnedStream};

use crate::Harness;

/// Runs the suite on CUDA device 0.
pub struct CudaHarness;

impl CudaHarness {
    /// `Ok(harness)` when libcuda loads and a device exists, else the reason to skip.
    pub fn open() -> Result<Self, String> {
        if !cachalot_cuda::is_available() {
            return Err("libcuda is not present".into());
        }
        match cachalot_cuda::device_count() {
            Ok(0) => Err("no CUDA device".into()),
            Ok(_) => Ok(Self),
            Err(e) => Err(format!("CUDA unavailable: {e}")),
        }
    }
}

impl Harness for CudaHarness {
    type B = CudaBackend;
    type OwnedStream = OwnedStream;

    fn name(&self) -> &'static str {
        "cuda"
    }
    fn backend(&self) -> CudaBackend {
        CudaBackend::new(0).expect("CUDA device 0")
    }
    fn new_stream(&self, backend: &CudaBackend) -> OwnedStream {
        backend.create_stream().expect("stream")
    }
    fn handle(&self, s: &OwnedStream) -> CudaStream {
        s.handle()
    }
    fn make_busy(&self, backend: &CudaBackend, stream: CudaStream) {
        backend
            .delay_stream(stream, Duration::from_millis(300))
            .expect("delay");
    }
    fn release(&self, backend: &CudaBackend, stream: CudaStream) {
        backend.stream_synchronize(stream).expect("sync");
    }
    fn fill(&self, backend: &CudaBackend, addr: u64, len: u64, value: u8, stream: CudaStream) {
        backend
            .memset_d8_async(addr, value, len, stream)
            .expect("memset");
    }
    fn can_read(&self) -> bool {
        true
    }
    fn read(&self, backend: &CudaBackend, addr: u64, len: u64) -> Option<Vec<u8>> {
        backend.synchronize_device().expect("sync");
        let mut v = vec![0u8; len as usize];
        backend.memcpy_dtoh(&mut v, addr).expect("dtoh");
        Some(v)
    }
}
