//! The stream-safety rule of `cachalot_cuda::interop` ([`StreamUses`]) on
//! the mock device, where stream work and races are under test control:
//! a use on a stream other than the buffer's own is recorded once, so the
//! block is not reused before that stream's work completes; without the
//! record, the mock's race checker sees the reuse race. Runs everywhere.

use cachalot_core::{AllocatorConfig, CachingAllocator, Error};
use cachalot_cuda::StreamUses;
use cachalot_mock::{MockBackend, MockConfig, MockStream};

const MIB: u64 = 1 << 20;

fn alloc() -> (CachingAllocator<MockBackend>, MockStream, MockStream) {
    let dev = MockConfig::new(1 << 30).race_checking(true).build();
    let (s, side) = (dev.create_stream(), dev.create_stream());
    let a = CachingAllocator::with_config(dev, AllocatorConfig::default()).unwrap();
    (a, s, side)
}

/// Allocates on `s`, writes it on `side` (pending), frees it; then the next
/// same-size allocation on `s` and its use. Returns (first, second address).
fn cycle(
    a: &CachingAllocator<MockBackend>,
    s: MockStream,
    side: MockStream,
    record: bool,
) -> (u64, u64) {
    let p = a.allocate(4 * MIB, s).unwrap();
    let uses = StreamUses::new(s);
    a.backend().use_memory(s, p, 4 * MIB, 1).unwrap();
    if record {
        assert!(
            uses.record_use(a, p, side).unwrap(),
            "first use on side recorded"
        );
        assert!(
            !uses.record_use(a, p, side).unwrap(),
            "second use on side not again"
        );
        assert!(
            !uses.record_use(a, p, s).unwrap(),
            "own stream never recorded"
        );
        assert_eq!(uses.recorded(), [side]);
    }
    a.backend().use_memory(side, p, 4 * MIB, 1).unwrap();
    a.free(p).unwrap();
    let q = a.allocate(4 * MIB, s).unwrap();
    a.backend().use_memory(s, q, 4 * MIB, 2).unwrap();
    (p, q)
}

#[test]
fn recorded_use_defers_reuse_until_the_side_stream_completes() {
    let (a, s, side) = alloc();
    let (p, q) = cycle(&a, s, side, true);
    assert_ne!(p, q, "reused while the side stream's work was pending");
    assert_eq!(a.backend().race_count(), 0, "{:?}", a.backend().races());
    // once the side stream's work completes, the block comes back on `s`
    a.backend().complete_all();
    a.free(q).unwrap();
    let calls = a.stats().num_device_alloc;
    let r = a.allocate(4 * MIB, s).unwrap();
    assert!(r == p || r == q, "a cached block is reused: {r:#x}");
    assert_eq!(a.stats().num_device_alloc, calls, "no device call");
    a.free(r).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn without_the_record_the_reuse_races() {
    let (a, s, side) = alloc();
    let (p, q) = cycle(&a, s, side, false);
    assert_eq!(p, q, "an unrecorded block is reused at once");
    assert!(a.backend().race_count() > 0, "the mock sees the race");
}

#[test]
fn a_failed_record_is_a_typed_error_and_is_retried() {
    let (a, s, side) = alloc();
    let uses = StreamUses::new(s);
    let e = uses.record_use(&a, 0xdead_0000, side).unwrap_err();
    assert!(
        matches!(e, Error::UnknownPointer(_) | Error::InvalidArgument(_)),
        "{e:?}"
    );
    assert!(uses.needs_record(side));
    let p = a.allocate(MIB, s).unwrap();
    assert!(uses.record_use(&a, p, side).unwrap());
    a.free(p).unwrap();
}
