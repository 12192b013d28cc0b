//! HIP and Level Zero as conformance-suite [`Harness`](crate::Harness)es. Neither backend
//! exposes a sleeping host function or a memset to the suite, so on those
//! devices `make_busy` and `fill` do nothing and `read` returns `None`: the
//! checks that need a busy stream run only when the stream is observed busy.

/// The HIP harness.
#[cfg(feature = "hip")]
pub mod hip {
    use cachalot_hip::{HipBackend, HipStream, OwnedStream};

    use crate::Harness;

    /// Runs the suite on HIP device 0.
    pub struct HipHarness;

    impl HipHarness {
        /// `Ok` when the HIP runtime loads and has a device, else the reason to
        /// skip (no library, or no device). Panics when HIP is present but
        /// fails to open: that is a failure, not a reason to skip.
        pub fn open() -> Result<Self, String> {
            match HipBackend::new(0) {
                Ok(_) => Ok(Self),
                Err(e) if e.is_unavailable() => Err(e.to_string()),
                Err(e) => panic!("HIP failed to open: {e}"),
            }
        }
    }

    impl Harness for HipHarness {
        type B = HipBackend;
        type OwnedStream = OwnedStream;
        fn name(&self) -> &'static str {
            "hip"
        }
        fn backend(&self) -> HipBackend {
            HipBackend::new(0).expect("HIP device 0")
        }
        fn new_stream(&self, b: &HipBackend) -> OwnedStream {
            b.create_stream().expect("stream")
        }
        fn handle(&self, s: &OwnedStream) -> HipStream {
            s.handle()
        }
        fn make_busy(&self, _b: &HipBackend, _s: HipStream) {}
        fn release(&self, b: &HipBackend, _s: HipStream) {
            cachalot_core::Backend::synchronize_device(b).expect("sync");
        }
        fn fill(&self, _b: &HipBackend, _a: u64, _l: u64, _v: u8, _s: HipStream) {}
        fn read(&self, _b: &HipBackend, _a: u64, _l: u64) -> Option<Vec<u8>> {
            None
        }
    }
}

/// The Level Zero harness.
#[cfg(feature = "level-zero")]
pub mod level_zero {
    use cachalot_level_zero::{LevelZeroBackend, OwnedStream, ZeStream};

    use crate::Harness;

    /// Runs the suite on Level Zero device 0.
    pub struct LevelZeroHarness;

    impl LevelZeroHarness {
        /// `Ok` when the loader initializes and has a device, else the reason
        /// to skip (no loader, no driver or no device). Panics when Level
        /// Zero is present but fails to open: that is a failure, not a
        /// reason to skip.
        pub fn open() -> Result<Self, String> {
            match LevelZeroBackend::new(0) {
                Ok(_) => Ok(Self),
                Err(e) if e.is_unavailable() => Err(e.to_string()),
                Err(e) => panic!("Level Zero failed to open: {e}"),
            }
        }
    }

    impl Harness for LevelZeroHarness {
        type B = LevelZeroBackend;
        type OwnedStream = OwnedStream;
        fn name(&self) -> &'static str {
            "level-zero"
        }
        fn backend(&self) -> LevelZeroBackend {
            LevelZeroBackend::new(0).expect("Level Zero device 0")
        }
        fn new_stream(&self, b: &LevelZeroBackend) -> OwnedStream {
            b.create_stream().expect("stream")
        }
        fn handle(&self, s: &OwnedStream) -> ZeStream {
            s.handle()
        }
        fn make_busy(&self, _b: &LevelZeroBackend, _s: ZeStream) {}
        fn release(&self, b: &LevelZeroBackend, _s: ZeStream) {
            cachalot_core::Backend::synchronize_device(b).expect("sync");
        }
        fn fill(&self, _b: &LevelZeroBackend, _a: u64, _l: u64, _v: u8, _s: ZeStream) {}
        fn read(&self, _b: &LevelZeroBackend, _a: u64, _l: u64) -> Option<Vec<u8>> {
            None
        }
    }
}
