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
//!
//! Every file a test reads is found through [`repo_root`] (and
//! [`traces_dir`]), so that `cargo xtask test-cuda`, which packs those files
//! next to the test binaries, can point the binaries at them on another
//! machine.

pub mod capture;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fuzz;
pub mod mock;
pub mod suite;
pub mod vendor;

use std::path::PathBuf;

use cachalot_core::{AllocatorConfig, Backend, CachingAllocator};

/// Reports a test that cannot run here: writes `skipped: <reason>` to
/// the process's stderr and returns, or panics when `CACHALOT_REQUIRE_GPU`
/// is set (to anything but `0`): the packed `run.sh` sets it on the
/// machine with the hardware, where a skip would hide a test that never ran.
///
/// The note is written to stderr directly, not with `println!`: libtest
/// captures the `print!`/`eprint!` output of a passing test and never shows
/// it, so a skipped test would look like any pass in `cargo test`'s output.
/// A direct write is not captured: the note shows, one line per skip.
pub fn skip(reason: impl std::fmt::Display) {
    if std::env::var("CACHALOT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0") {
        panic!("CACHALOT_REQUIRE_GPU is set, and this test would skip: {reason}");
    }
    skip_note(&reason.to_string());
}

/// Writes `skipped: <reason>` as one line straight to stderr (see [`skip`]).
pub fn skip_note(reason: &str) {
    use std::io::Write;
    // one write of the whole line, so that parallel tests do not mix lines
    let _ = std::io::stderr().write_all(format!("skipped: {reason}\n").as_bytes());
}

/// Environment variable naming the folder that stands for the repository
/// when the test binaries run away from it (`run.sh` of `cargo xtask
/// test-cuda` sets it to the pack's `repo/`).
pub const REPO_ROOT_ENV: &str = "CACHALOT_REPO_ROOT";

/// The repository root, where the files the tests read live (`traces/`,
/// `fuzz/seeds/`, `fuzz/regressions/`, `tests/tests/*.proptest-regressions`):
/// `$CACHALOT_REPO_ROOT` when set, else the source tree this crate was
/// built from.
pub fn repo_root() -> PathBuf {
    if let Some(root) = std::env::var_os(REPO_ROOT_ENV) {
        return PathBuf::from(root);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The proptest regressions file of the integration test `name`
/// (`tests/tests/<name>.proptest-regressions` under [`repo_root`]), for
/// `FileFailurePersistence::Direct`: proptest's default finds the file next
/// to the test's source file, which the packed binaries do not have.
pub fn proptest_regressions(name: &str) -> &'static str {
    let path = repo_root()
        .join("tests")
        .join("tests")
        .join(format!("{name}.proptest-regressions"));
    Box::leak(path.to_string_lossy().into_owned().into_boxed_str())
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
