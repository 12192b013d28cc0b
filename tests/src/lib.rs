//! # cachalot-conformance
//!
//! One conformance suite that every backend runs ([`suite`]), generic over
//! the backend through [`Harness`], plus the mock-only helpers of the engine's
//! spec, parity and property tests ([`mock`]).
//!
//! The suite runs on the mock always; on CUDA, HIP and Level Zero when the
//! crate is built with that feature *and* a device is present, and prints
//! `skipped: <reason>` otherwise ([`skip`]: a failure under
//! `CACHALOT_REQUIRE_GPU=1`).

pub mod capture;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fuzz;
pub mod mock;
pub mod suite;
pub mod vendor;

use std::path::PathBuf;

use cachalot_core::{AllocatorConfig, Backend, CachingAllocator};

/// Reports a test that cannot run here: prints `skipped: <reason>` and
/// returns, or panics when `CACHALOT_REQUIRE_GPU` is set (to anything but
/// `0`): the packed `run.sh` sets it on the machine with the hardware,
/// where a skip would hide a test that never ran.
pub fn skip(reason: impl std::fmt::Display) {
    if std::env::var("CACHALOT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0") {
        panic!("CACHALOT_REQUIRE_GPU is set, and this test would skip: {reason}");
    }
    println!("skipped: {reason}");
}

/// The repository root (where `traces/` lives).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The folder of trace files: `$CACHALOT_TRACES` when set (packed test
/// binaries run on another machine), else the repository's `traces/`.
pub fn traces_dir() -> PathBuf {
    std::env::var_os("CACHALOT_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("traces"))
}

/// What the conformance suite needs from a backend beyond the [`Backend`]
/// trait: making streams, and making a stream slow so that cross-stream
/// reuse can be observed.
pub trait Harness: Sized {
    /// The backend under test.
    type B: Backend;
    /// An owned stream (kept alive by the test).
    type OwnedStream;

    /// Short name for messages.
    fn name(&self) -> &'static str;
    /// A fresh backend instance on device 0.
    fn backend(&self) -> Self::B;
    /// A new stream on `backend`.
    fn new_stream(&self, backend: &Self::B) -> Self::OwnedStream;
    /// The handle of an owned stream.
    fn handle(&self, s: &Self::OwnedStream) -> <Self::B as Backend>::Stream;
    /// Enqueues work on `stream` that keeps it busy until [`Harness::release`]
    /// (mock) or for a while (real devices: a sleeping host function).
    fn make_busy(&self, backend: &Self::B, stream: <Self::B as Backend>::Stream);
    /// Lets the busy work of `stream` finish and waits for it.
    fn release(&self, backend: &Self::B, stream: <Self::B as Backend>::Stream);
    /// Whether `stream` still has unfinished work (an event recorded now is
    /// not complete).
    fn is_busy(&self, backend: &Self::B, stream: <Self::B as Backend>::Stream) -> bool {
        let e = backend.create_event().expect("event");
        backend.record_event(&e, stream).expect("record");
        let done = backend.query_event(&e).expect("query");
        backend.destroy_event(e).expect("destroy");
        !done
    }
    /// Writes `value` into `len` bytes at `addr` on `stream` (on the mock: a
    /// use tagged `value`, which the mock remembers as the range's contents).
    fn fill(
        &self,
        backend: &Self::B,
        addr: u64,
        len: u64,
        value: u8,
        stream: <Self::B as Backend>::Stream,
    );
    /// Reads back `len` bytes at `addr` after synchronizing; `None` when the
    /// harness cannot read device memory (the data checks are then skipped,
    /// unless [`Harness::can_read`] says it can).
    fn read(&self, backend: &Self::B, addr: u64, len: u64) -> Option<Vec<u8>>;
    /// Whether [`Harness::read`] returns the memory's contents (the mock's
    /// and CUDA's do). When true, a `None` from `read` fails the suite
    /// instead of silently skipping the data checks.
    fn can_read(&self) -> bool {
        false
    }

    /// An allocator over a fresh backend.
    fn allocator(&self, config: &str) -> CachingAllocator<Self::B> {
        let config = AllocatorConfig::parse(config).expect("test config parses");
        CachingAllocator::with_config(self.backend(), config).expect("allocator")
    }
}

/// Cases per property of the property tests: `default` (what CI runs), or
/// `PROPTEST_CASES` when set to a number (longer local soaks), within
/// 1..=1,000,000.
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .map_or(default, |n| n.clamp(1, 1_000_000))
}
