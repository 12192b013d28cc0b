//! The conformance suite on every backend this build has: the mock always;
//! CUDA with `--features cuda` when a device is present (skipped with a
//! printed reason otherwise, failed under `CACHALOT_REQUIRE_GPU=1`).

use cachalot_conformance::Harness;
use cachalot_conformance::mock::MockHarness;
#[allow(unused_imports)]
use cachalot_conformance::skip;
use cachalot_conformance::suite::run_all;

#[test]
fn mock_backend() {
    let (passed, failed) = run_all(&MockHarness);
    assert_eq!(failed, 0, "{failed} conformance checks failed on the mock");
    assert!(passed > 0);
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_backend() {
    match cachalot_conformance::cuda::CudaHarness::open() {
        Ok(h) => {
            let (_, failed) = run_all(&h);
            assert_eq!(failed, 0, "{failed} conformance checks failed on CUDA");
        }
        Err(reason) => skip(format_args!("cuda: {reason}")),
    }
}

#[cfg(feature = "hip")]
#[test]
fn hip_backend() {
    match cachalot_conformance::vendor::hip::HipHarness::open() {
        Ok(h) => {
            let (_, failed) = run_all(&h);
            assert_eq!(failed, 0, "{failed} conformance checks failed on HIP");
        }
        Err(reason) => skip(format_args!("hip: {reason}")),
    }
}

#[cfg(feature = "level-zero")]
#[test]
fn level_zero_backend() {
    match cachalot_conformance::vendor::level_zero::LevelZeroHarness::open() {
        Ok(h) => {
            let (_, failed) = run_all(&h);
            assert_eq!(
                failed, 0,
                "{failed} conformance checks failed on Level Zero"
            );
        }
        Err(reason) => skip(format_args!("level-zero: {reason}")),
    }
}

/// The mock harness with a faulty `fill` (an out-of-bounds kernel that also
/// writes the 512 bytes before its range), or one that claims to read memory
/// but returns nothing: `data_survives_reuse` must fail on both, so on the
/// mock it really compares contents.
struct Faulty {
    scribble: bool,
}

impl Harness for Faulty {
    type B = cachalot_mock::MockBackend;
    type OwnedStream = cachalot_mock::MockStream;
    fn name(&self) -> &'static str {
        "faulty-mock"
    }
    fn backend(&self) -> Self::B {
        MockHarness.backend()
    }
    fn new_stream(&self, b: &Self::B) -> Self::OwnedStream {
        MockHarness.new_stream(b)
    }
    fn handle(&self, s: &Self::OwnedStream) -> cachalot_mock::MockStream {
        *s
    }
    fn make_busy(&self, b: &Self::B, s: cachalot_mock::MockStream) {
        MockHarness.make_busy(b, s)
    }
    fn release(&self, b: &Self::B, s: cachalot_mock::MockStream) {
        MockHarness.release(b, s)
    }
    fn fill(&self, b: &Self::B, addr: u64, len: u64, value: u8, s: cachalot_mock::MockStream) {
        MockHarness.fill(b, addr, len, value, s);
        if self.scribble && addr >= 512 {
            // Inside a live segment only (the block may start one).
            let _ = b.use_memory(s, addr - 512, 512, 0xEE);
        }
    }
    fn can_read(&self) -> bool {
        true
    }
    fn read(&self, b: &Self::B, addr: u64, len: u64) -> Option<Vec<u8>> {
        if self.scribble {
            MockHarness.read(b, addr, len)
        } else {
            None
        }
    }
}

#[test]
fn data_check_fails_on_corruption_or_a_missing_read() {
    for scribble in [true, false] {
        let r = std::panic::catch_unwind(|| {
            cachalot_conformance::suite::data_survives_reuse(&Faulty { scribble })
        });
        let msg = r.expect_err("data_survives_reuse must fail");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        let want = if scribble {
            "corrupted"
        } else {
            "returned nothing"
        };
        assert!(msg.contains(want), "scribble {scribble}: {msg}");
    }
    // The honest harness passes, reading real contents.
    cachalot_conformance::suite::data_survives_reuse(&MockHarness);
}
