//! The conformance suite on every backend this build has: the mock always;
//! CUDA with `--features cuda` when a device is present (skipped with a
//! printed reason otherwise, failed under `CACHALOT_REQUIRE_GPU=1`).

#[allow(unused_imports)]
use cachalot_conformance::skip;
use cachalot_conformance::suite::run_all;

#[test]
fn mock_backend() {
    let (passed, failed) = run_all(&cachalot_conformance::mock::MockHarness);
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
