//! What the engine fuzz harnesses share on the mock device: stream waits,
//! frees of live allocations, injected failures, the device's capacity,
//! the checks after every operation and those at the end of a run.

use arbitrary::{Arbitrary, Unstructured};
use cachalot_core::{Backend, CachingAllocator, Error};
use cachalot_mock::{MallocFailure, MockBackend, MockStream};

use crate::mock::{GIB, MIB};

/// `waiter.wait_stream(other)`: `waiter` waits for the work queued on
/// `other` so far, through an event.
pub(crate) fn wait_event(m: &MockBackend, waiter: MockStream, other: MockStream) {
    let e = m.create_event().expect("create_event");
    m.record_event(&e, other).expect("record_event");
    m.stream_wait_event(waiter, &e).expect("stream_wait_event");
    m.destroy_event(e).expect("destroy_event");
}

/// Decodes up to `max` operations from `u` and runs each through `step`,
/// printing it first when `CACHALOT_FUZZ_DEBUG` is set.
pub(crate) fn run_ops<'a, O: Arbitrary<'a> + std::fmt::Debug>(
    u: &mut Unstructured<'a>,
    max: usize,
    mut step: impl FnMut(&O),
) {
    let debug = super::debug();
    let mut n = 0;
    while n < max && !u.is_empty() {
        let Ok(op) = O::arbitrary(u) else { break };
        if debug {
            eprintln!("op {n}: {op:?}");
        }
        step(&op);
        n += 1;
    }
}

/// The block an allocation of `size` bytes answered with `r`, if it made
/// one: 0 bytes get the null address, and out of memory, a size that never
/// fits and an injected device failure are no block; any other answer
/// panics.
pub(crate) fn allocated(r: Result<u64, Error>, size: u64) -> Option<u64> {
    match r {
        Ok(0) => {
            assert_eq!(size, 0, "address 0 for a non-empty request");
            None
        }
        Ok(addr) => {
            assert_ne!(size, 0, "an address for a zero-byte request");
            Some(addr)
        }
        Err(Error::OutOfMemory(_) | Error::NeverFits { .. } | Error::Backend(_)) => None,
        Err(e) => panic!("allocating {size} bytes failed unexpectedly: {e}"),
    }
}

/// Writes new block `[addr, addr + size)` on `stream` as allocation
/// `next_tag` (which moves on); returns that tag.
pub(crate) fn write_new(
    m: &MockBackend,
    stream: MockStream,
    addr: u64,
    size: u64,
    next_tag: &mut u64,
) -> u64 {
    let tag = *next_tag;
    *next_tag += 1;
    m.use_memory(stream, addr, size, tag)
        .expect("the new block lies in a live segment");
    tag
}

/// Frees live allocation `addr`, which must succeed.
pub(crate) fn free_live(a: &CachingAllocator<MockBackend>, addr: u64) {
    a.free(addr)
        .unwrap_or_else(|e| panic!("free of live {addr:#x}: {e}"));
}

/// Makes the `at % 4 + 1`-th next device allocation fail: a backend error
/// or out of memory.
pub(crate) fn inject_failure(m: &MockBackend, backend_error: bool, at: u8) {
    let f = if backend_error {
        MallocFailure::Backend(999)
    } else {
        MallocFailure::OutOfMemory
    };
    m.fail_malloc_at_with(u64::from(at % 4) + 1, f);
}

/// The device's capacity, drawn from the input's first byte.
pub(crate) fn capacity(u: &mut Unstructured) -> u64 {
    match u.int_in_range(0u8..=3).unwrap_or(0) {
        0 => GIB,
        1 => 256 * MIB,
        2 => 64 * MIB,
        _ => 8 * GIB,
    }
}

/// After every operation: the engine's invariants hold, the race checker
/// found no race and no page was unmapped under pending work.
pub(crate) fn check_device(
    m: &MockBackend,
    a: &CachingAllocator<MockBackend>,
    after: &dyn std::fmt::Debug,
) {
    if let Err(e) = a.check_invariants() {
        panic!("invariant violated after {after:?}: {e}");
    }
    let races = m.races();
    assert!(races.is_empty(), "race after {after:?}: {}", races[0]);
    assert_eq!(
        m.counters().unmap_refused,
        0,
        "a page unmapped under pending work after {after:?}"
    );
}

/// The end of a run, once everything was freed and released: all work
/// completes and `empty_cache` leaves no memory, segment or event.
pub(crate) fn assert_all_released(m: MockBackend, a: CachingAllocator<MockBackend>) {
    m.clear_failures();
    m.complete_all();
    a.empty_cache().expect("empty_cache");
    check_device(&m, &a, &"the wind-down");
    let s = a.stats();
    assert_eq!(s.reserved_bytes.all().current, 0, "reserved bytes left");
    assert_eq!(s.active.all().current, 0, "active blocks left");
    assert!(
        m.live_segments().is_empty(),
        "segments left: {:?}",
        m.live_segments()
    );
    drop(a);
    assert_eq!(m.live_events(), 0, "events left");
}
