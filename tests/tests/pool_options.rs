//! Private pools beyond capture routing, on the mock, with every invariant
//! checked after each step: allocation into a named pool (routed by the
//! caller, so it changes no other allocation's pool), pools whose segments
//! come from a user's allocator, `use_on_oom`, `no_split`, and the segment
//! tracker.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cachalot_conformance::mock::{Dev, FIXED, MIB, check};
use cachalot_core::engine::TraceAction;
use cachalot_core::{
    BackendError, CachingAllocator, CaptureError, DeviceAllocError, Error, SegmentEvent,
    SegmentSource, graph_pool_handle,
};
use cachalot_mock::{MockBackend, MockStream};

fn setup(config: &str) -> (CachingAllocator<MockBackend>, MockStream) {
    let Dev { m, a } = Dev::with_capacity(config, 1 << 34);
    let s = m.create_stream();
    (a, s)
}

fn pool_of(a: &CachingAllocator<MockBackend>, addr: u64) -> (u64, u64) {
    a.snapshot()
        .segments
        .iter()
        .find(|s| s.address <= addr && addr < s.address + s.total_size)
        .map(|s| s.pool_id)
        .expect("a segment holds it")
}

/// A user's allocator: addresses from its own range, every call logged.
#[derive(Default)]
struct Source {
    next: Mutex<u64>,
    live: Mutex<BTreeMap<u64, u64>>,
    log: Mutex<Vec<(&'static str, u64, u64)>>,
}

const SOURCE_BASE: u64 = 0x0200_0000_0000;

impl SegmentSource for Source {
    fn alloc(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let mut n = self.next.lock().unwrap();
        let a = SOURCE_BASE + *n;
        *n += size.next_multiple_of(64 * MIB);
        self.live.lock().unwrap().insert(a, size);
        self.log.lock().unwrap().push(("alloc", a, size));
        Ok(a)
    }
    fn free(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        if self.live.lock().unwrap().remove(&addr) != Some(size) {
            return Err(BackendError::new("test source", "free", 1, "not mine"));
        }
        self.log.lock().unwrap().push(("free", addr, size));
        Ok(())
    }
}

#[test]
fn a_named_pool_takes_only_the_allocations_made_into_it() {
    let (a, s) = setup(FIXED);
    let pool = graph_pool_handle();
    assert!(matches!(
        a.allocate_in_pool(pool, 512, s),
        Err(Error::Capture(CaptureError::UnknownPool(_)))
    ));
    assert!(matches!(
        a.allocate_in_pool((0, 0), 512, s),
        Err(Error::Capture(CaptureError::ReservedPool(_)))
    ));
    a.create_or_incref_pool(pool, None).unwrap();
    let x = a.allocate_in_pool(pool, 3 * MIB, s).unwrap();
    let y = a.allocate(3 * MIB, s).unwrap();
    check(&a);
    assert_eq!(pool_of(&a, x), pool);
    assert_eq!(pool_of(&a, y), (0, 0));
    // the pool's cache serves only allocations into it
    a.free(x).unwrap();
    let z = a.allocate(3 * MIB, s).unwrap();
    assert_eq!(pool_of(&a, z), (0, 0));
    assert_eq!(a.allocate_in_pool(pool, 3 * MIB, s).unwrap(), x);
    check(&a);
    for p in [x, y, z] {
        a.free(p).unwrap();
    }
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    assert!(matches!(
        a.allocate_in_pool(pool, 512, s),
        Err(Error::Capture(CaptureError::UnknownPool(_)))
    ));
    check(&a);
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
}

#[test]
fn a_pool_with_a_source_gets_and_returns_segments_there() {
    // expandable segments everywhere, but never in a pool with a source
    let (a, s) = setup("expandable_segments:True");
    let src = Arc::new(Source::default());
    let events: Arc<Mutex<Vec<SegmentEvent>>> = Arc::default();
    {
        let (events, src) = (events.clone(), src.clone());
        a.set_segment_tracker(Some(Arc::new(move |e: &SegmentEvent| {
            // a free is heard of while the source still holds the memory
            if e.action == TraceAction::SegmentFree && e.addr >= SOURCE_BASE {
                assert!(src.live.lock().unwrap().contains_key(&e.addr));
            }
            events.lock().unwrap().push(e.clone());
        })));
    }
    let pool = graph_pool_handle();
    a.create_or_incref_pool(pool, Some(src.clone())).unwrap();
    assert!(matches!(
        a.create_or_incref_pool(pool, Some(src.clone())),
        Err(Error::InvalidArgument(_))
    ));
    let x = a.allocate_in_pool(pool, 5 * MIB, s).unwrap();
    let y = a.allocate_in_pool(pool, 30 * MIB, s).unwrap();
    let d = a.allocate(5 * MIB, s).unwrap();
    check(&a);
    let snap = a.snapshot();
    for seg in &snap.segments {
        let from_source = seg.address >= SOURCE_BASE && seg.address < SOURCE_BASE + (1 << 40);
        assert_eq!(from_source, seg.pool_id == pool, "{seg:?}");
        assert_eq!(seg.is_expandable, !from_source, "{seg:?}");
    }
    assert_eq!(src.log.lock().unwrap().len(), 2);
    assert_eq!(
        a.stats().reserved_bytes.all().current as u64,
        20 * MIB + 30 * MIB + 6 * MIB
    );
    // released while its blocks live: nothing goes back yet
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(src.live.lock().unwrap().len(), 2);
    a.free(x).unwrap();
    a.free(y).unwrap();
    a.free(d).unwrap();
    a.empty_cache().unwrap();
    check(&a);
    assert!(src.live.lock().unwrap().is_empty());
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    // the pool is gone, and with it its hold on the source
    assert_eq!(Arc::strong_count(&src), 2, "the tracker's and this test's");
    let ev = events.lock().unwrap();
    let of_pool: Vec<_> = ev
        .iter()
        .filter(|e| e.pool == pool)
        .map(|e| e.action)
        .collect();
    assert_eq!(
        of_pool,
        [
            TraceAction::SegmentAlloc,
            TraceAction::SegmentAlloc,
            TraceAction::SegmentFree,
            TraceAction::SegmentFree
        ]
    );
    assert!(
        ev.iter()
            .any(|e| e.pool == (0, 0) && e.action == TraceAction::SegmentMap)
    );
    assert!(
        ev.iter()
            .any(|e| e.pool == (0, 0) && e.action == TraceAction::SegmentUnmap)
    );
}

#[test]
fn use_on_oom_and_no_split() {
    let (a, s) = setup(FIXED);
    let lender = graph_pool_handle();
    let whole = graph_pool_handle();
    a.create_or_incref_pool(lender, None).unwrap();
    a.create_or_incref_pool(whole, None).unwrap();
    a.set_pool_use_on_oom(lender, true).unwrap();
    a.set_pool_no_split(whole).unwrap();
    // no_split: a 2 MiB request keeps its whole 20 MiB segment
    let w1 = a.allocate_in_pool(whole, 2 * MIB, s).unwrap();
    let w2 = a.allocate_in_pool(whole, 2 * MIB, s).unwrap();
    assert_eq!(a.block_size(w1), Some(20 * MIB));
    assert_eq!(a.block_size(w2), Some(20 * MIB));
    check(&a);
    a.free(w1).unwrap();
    a.free(w2).unwrap();
    // use_on_oom: 100 MiB allowed beyond what is reserved (40 MiB)
    let l = a.allocate_in_pool(lender, 60 * MIB, s).unwrap();
    a.free(l).unwrap();
    let total = 1u64 << 34;
    a.set_memory_fraction((100 * MIB) as f64 / total as f64)
        .unwrap();
    let big = a.allocate(50 * MIB, s).unwrap();
    assert_eq!(big, l, "the lender's cached block");
    assert_eq!(pool_of(&a, big), lender);
    check(&a);
    assert!(matches!(
        a.allocate(50 * MIB, s),
        Err(Error::OutOfMemory(_))
    ));
    a.free(big).unwrap();
    // the blocks returned to their pools
    assert_eq!(a.allocate_in_pool(lender, 60 * MIB, s).unwrap(), l);
    a.free(l).unwrap();
    a.set_pool_use_on_oom(lender, false).unwrap();
    assert!(matches!(
        a.allocate(50 * MIB, s),
        Err(Error::OutOfMemory(_))
    ));
    check(&a);
    assert!(matches!(
        a.set_pool_no_split((0, 0)),
        Err(Error::Capture(CaptureError::ReservedPool(_)))
    ));
    assert!(matches!(
        a.set_pool_use_on_oom(graph_pool_handle(), true),
        Err(Error::Capture(CaptureError::UnknownPool(_)))
    ));
}

#[test]
fn dropping_the_allocator_gives_a_source_its_segments_back() {
    let (a, s) = setup(FIXED);
    let src = Arc::new(Source::default());
    let pool = graph_pool_handle();
    a.create_or_incref_pool(pool, Some(src.clone())).unwrap();
    let _live = a.allocate_in_pool(pool, 5 * MIB, s).unwrap();
    let cached = a.allocate_in_pool(pool, 50 * MIB, s).unwrap();
    a.free(cached).unwrap();
    let _default = a.allocate(5 * MIB, s).unwrap();
    assert_eq!(src.live.lock().unwrap().len(), 2);
    drop(a);
    assert!(
        src.live.lock().unwrap().is_empty(),
        "{:?}",
        src.live.lock().unwrap()
    );
    assert_eq!(Arc::strong_count(&src), 1);
}
