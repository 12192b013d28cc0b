//! The capture state machine on the mock: private pools, pools shared
//! between graphs, use counts, release when the graphs are gone and the
//! blocks are free, abandoned captures (PyTorch #190308), no release-all
//! retry and no event query during capture, and typed errors for misuse.

use cachalot_conformance::mock::{Dev, FIXED, MIB, check};
use cachalot_core::{CachingAllocator, CaptureError, Error, PoolFilter, graph_pool_handle};
use cachalot_mock::{MockBackend, MockStream};

fn setup(capacity: u64) -> (MockBackend, CachingAllocator<MockBackend>, MockStream) {
    let Dev { m, a } = Dev::with_capacity(FIXED, capacity);
    let s = m.create_stream();
    (m, a, s)
}

#[test]
fn misuse_is_a_typed_error() {
    let (m, a, s) = setup(1 << 30);
    let pool = graph_pool_handle();
    assert!(matches!(
        a.begin_allocate_to_pool((0, 0), PoolFilter::CaptureOf(s)),
        Err(Error::Capture(CaptureError::ReservedPool(_)))
    ));
    a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s))
        .unwrap();
    assert!(matches!(
        a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s)),
        Err(Error::Capture(CaptureError::AlreadyRecording(_)))
    ));
    let other = graph_pool_handle();
    assert!(matches!(
        a.end_allocate_to_pool(other),
        Err(Error::Capture(CaptureError::NotRecording(_)))
    ));
    assert!(matches!(
        a.release_pool(other),
        Err(Error::Capture(CaptureError::UnknownPool(_)))
    ));
    m.begin_capture(s).unwrap();
    m.end_capture(s).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    assert!(matches!(
        a.release_pool(pool),
        Err(Error::Capture(CaptureError::UnknownPool(_)))
    ));
    check(&a);
}

#[test]
fn private_pool_is_shared_between_graphs_and_released_when_they_are_gone() {
    let (m, a, s) = setup(1 << 30);
    let pool = graph_pool_handle();
    // graph 1
    a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s))
        .unwrap();
    m.begin_capture(s).unwrap();
    let p = a.allocate(3 * MIB, s).unwrap();
    m.use_memory(s, p, 3 * MIB, 1).unwrap();
    a.free(p).unwrap();
    m.end_capture(s).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    let after_first = a.stats().reserved_bytes.all().current;
    assert_eq!(
        after_first,
        20 * MIB as i64,
        "one large segment in the private pool"
    );
    // graph 2 into the same pool reuses its memory
    a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s))
        .unwrap();
    m.begin_capture(s).unwrap();
    let q = a.allocate(3 * MIB, s).unwrap();
    assert_eq!(q, p, "the second graph reuses the shared pool's block");
    m.use_memory(s, q, 3 * MIB, 2).unwrap();
    a.free(q).unwrap();
    m.end_capture(s).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    // default-pool allocations never take private-pool memory
    let d = a.allocate(3 * MIB, s).unwrap();
    assert_ne!(d, p);
    a.free(d).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(
        a.stats().reserved_bytes.all().current,
        20 * MIB as i64,
        "graphs still hold the pool"
    );
    a.release_pool(pool).unwrap();
    assert_eq!(
        a.stats().reserved_bytes.all().current,
        20 * MIB as i64,
        "one graph left"
    );
    a.release_pool(pool).unwrap();
    assert_eq!(
        a.stats().reserved_bytes.all().current,
        0,
        "released with its last graph"
    );
    assert!(m.live_segments().is_empty());
    check(&a);
}

#[test]
fn a_released_pool_keeps_live_blocks_until_they_are_freed() {
    let (m, a, s) = setup(1 << 30);
    let pool = graph_pool_handle();
    a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s))
        .unwrap();
    m.begin_capture(s).unwrap();
    let out = a.allocate(MIB, s).unwrap(); // the graph's output, still alive
    m.use_memory(s, out, MIB, 1).unwrap();
    m.end_capture(s).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    assert_eq!(
        a.stats().segment.all().current,
        1,
        "the live output keeps its segment"
    );
    a.free(out).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().segment.all().current, 0);
    check(&a);
}

#[test]
fn an_abandoned_capture_does_not_leak_its_pool() {
    let (m, a, s) = setup(1 << 30);
    let pool = graph_pool_handle();
    a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s))
        .unwrap();
    m.begin_capture(s).unwrap();
    let p = a.allocate(12 * MIB, s).unwrap();
    m.use_memory(s, p, 12 * MIB, 1).unwrap();
    m.invalidate_capture(s).unwrap();
    assert!(
        m.end_capture(s).is_err(),
        "an invalidated capture cannot end cleanly"
    );
    a.free(p).unwrap();
    a.abandon_capture(pool).unwrap();
    assert_eq!(
        a.stats().reserved_bytes.all().current,
        0,
        "pool released (PyTorch #190308 leaked it)"
    );
    assert!(m.live_segments().is_empty());
    // the allocator works normally afterwards
    let q = a.allocate(MIB, s).unwrap();
    a.free(q).unwrap();
    check(&a);
}

#[test]
fn capture_skips_the_release_all_retry_and_queries_no_event() {
    let (m, a, s) = setup(64 * MIB);
    let side = m.create_stream();
    // a cached default-pool segment and a pending free from before the capture
    let cached = a.allocate(40 * MIB, s).unwrap();
    a.free(cached).unwrap();
    let pending = a.allocate(2 * MIB, s).unwrap();
    a.record_stream(pending, side).unwrap();
    a.free(pending).unwrap();
    let before = a.stats();
    let pool = graph_pool_handle();
    a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s))
        .unwrap();
    m.begin_capture(s).unwrap();
    // does not fit next to the cached segment: OOM without release-all
    let e = a.allocate(30 * MIB, s).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)), "{e}");
    // empty_cache inside a capture releases nothing of the default pool
    a.empty_cache().unwrap();
    let after = a.stats();
    assert_eq!(
        after.num_alloc_retries, before.num_alloc_retries,
        "no release-all retry in capture"
    );
    assert_eq!(
        after.num_sync_all_streams, before.num_sync_all_streams,
        "no event sync in capture"
    );
    assert_eq!(
        after.reserved_bytes.all().current,
        before.reserved_bytes.all().current
    );
    assert_eq!(m.counters().query_event, 0, "no event queried");
    // the capture is still valid: it ends cleanly
    m.end_capture(s).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    // after the capture the ladder works again: release-all frees the cache
    let big = a.allocate(60 * MIB, s).unwrap();
    assert_eq!(a.stats().num_alloc_retries, before.num_alloc_retries + 1);
    a.free(big).unwrap();
    check(&a);
}

/// The default configuration: the default pool maps pages (cachalot's
/// expandable mode), a graph's private pool takes fixed segments
/// (PyTorch's: a private pool never recycles pages, so pages would only
/// round it up). With `expandable_segments:True` given, the private pool
/// maps pages too.
#[test]
fn the_default_gives_private_pools_fixed_segments() {
    use cachalot_mock::MockCall;
    for (config, private_expandable) in [("", false), ("expandable_segments:True", true)] {
        let Dev { m, a } = Dev::with_capacity(config, 1 << 30);
        let s = m.create_stream();
        let q = a.allocate(3 * MIB, s).unwrap();
        assert_eq!(m.call_count(MockCall::Malloc), 0, "{config}: default pool");
        let pool = graph_pool_handle();
        a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(s))
            .unwrap();
        m.begin_capture(s).unwrap();
        let p = a.allocate(3 * MIB, s).unwrap();
        let kinds: Vec<(bool, bool)> = a
            .snapshot()
            .segments
            .iter()
            .map(|g| (g.pool_id != (0, 0), g.is_expandable))
            .collect();
        assert!(kinds.contains(&(false, true)), "{config}: {kinds:?}");
        assert!(
            kinds.contains(&(true, private_expandable)),
            "{config}: {kinds:?}"
        );
        let mallocs = u64::from(!private_expandable);
        assert_eq!(m.call_count(MockCall::Malloc), mallocs, "{config}");
        a.free(p).unwrap();
        m.end_capture(s).unwrap();
        a.end_allocate_to_pool(pool).unwrap();
        a.release_pool(pool).unwrap();
        a.free(q).unwrap();
        a.empty_cache().unwrap();
        assert_eq!(a.stats().reserved_bytes.all().current, 0, "{config}");
        check(&a);
    }
}
