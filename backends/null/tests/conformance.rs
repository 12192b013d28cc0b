//! The conformance suite on the null backend: every check of
//! `cachalot_conformance::suite` (none of them needs graph capture, which
//! this backend lacks).
//!
//! The null device cannot keep a stream busy or hold bytes, so the harness
//! makes no work and reads nothing: the checks' "not reused while busy" and
//! "data reads back" assertions are vacuous here, everything else applies.

use cachalot_conformance::Harness;
use cachalot_conformance::suite::{all, run_all};
use cachalot_core::Backend;
use cachalot_null::{NullBackend, NullStream};

/// 16 GiB, as the mock harness.
const CAPACITY: u64 = 16 << 30;

/// The null backend as a conformance-suite harness.
struct NullHarness;

impl Harness for NullHarness {
    type B = NullBackend;
    type OwnedStream = NullStream;

    fn name(&self) -> &'static str {
        "null"
    }
    fn backend(&self) -> NullBackend {
        NullBackend::new(CAPACITY)
    }
    fn new_stream(&self, backend: &NullBackend) -> NullStream {
        backend.create_stream()
    }
    fn handle(&self, s: &NullStream) -> NullStream {
        *s
    }
    // Work completes at once: a stream is never busy.
    fn make_busy(&self, _backend: &NullBackend, _stream: NullStream) {}
    fn release(&self, backend: &NullBackend, _stream: NullStream) {
        backend.synchronize_device().expect("sync");
    }
    // No bytes behind the addresses: nothing to write or read back.
    fn fill(&self, _b: &NullBackend, _addr: u64, _len: u64, _value: u8, _s: NullStream) {}
    fn read(&self, _b: &NullBackend, _addr: u64, _len: u64) -> Option<Vec<u8>> {
        None
    }
}

#[test]
fn suite_passes_on_null() {
    let (passed, failed) = run_all(&NullHarness);
    assert_eq!(failed, 0, "{failed} conformance checks failed on null");
    assert_eq!(passed, all::<NullHarness>().len(), "every check ran");
}

#[test]
fn empty_cache_returns_segments_and_events() {
    let h = NullHarness;
    let a = h.allocator("");
    let side = h.new_stream(a.backend());
    let p = a
        .allocate(1 << 20, a.backend().default_stream())
        .expect("alloc");
    a.record_stream(p, side).expect("record_stream");
    a.free(p).expect("free");
    a.empty_cache().expect("empty_cache");
    assert_eq!(a.backend().live_segments(), 0, "segments returned");
    assert_eq!(a.backend().live_events(), 0, "pooled events destroyed");
}
