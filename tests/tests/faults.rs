//! Failure atomicity and reentrancy: an operation that fails changes
//! nothing observable, release paths go on past a failed device free and
//! report it, and OOM observers run with no allocator lock held.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use cachalot_conformance::mock::{Dev, FIXED, GIB, MIB};
use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, Error};
use cachalot_mock::{MockBackend, MockConfig};

/// The figures a failed operation must leave unchanged.
fn observable(
    d: &Dev,
) -> (
    std::collections::BTreeMap<String, i64>,
    Vec<(u64, u64)>,
    usize,
) {
    (
        d.a.memory_stats(),
        d.a.live_allocations(),
        d.m.segment_count(),
    )
}

#[test]
fn free_with_failing_event_creation_changes_nothing_and_a_retry_frees() {
    let d = Dev::manual(FIXED);
    let side = d.stream();
    let p = d.alloc(4 * MIB);
    d.a.record_stream(p, side).unwrap();
    d.m.launch(side).unwrap(); // work queued on `side`, not complete
    let before = observable(&d);
    d.m.fail_create_event_at(1);
    let e = d.a.free(p).unwrap_err();
    assert!(matches!(e, Error::Backend(_)), "{e}");
    d.check();
    assert_eq!(observable(&d), before, "a failed free changed something");
    assert_eq!(
        d.a.block_size(p),
        Some(4 * MIB),
        "the allocation is still live"
    );
    // the retry frees it (not a double free), and it is not reused while
    // `side`'s work is pending
    d.a.free(p).unwrap();
    d.check();
    assert_eq!(d.a.stats().active_bytes.all().current, 4 * MIB as i64);
    let q = d.alloc(4 * MIB);
    assert_ne!(q, p, "reused before the side stream's work completed");
    d.m.complete_all();
    d.free(q);
    let r = d.alloc(4 * MIB);
    d.free(r);
    assert_eq!(d.a.stats().active_bytes.all().current, 0);
}

#[test]
fn free_with_several_streams_and_a_late_failure_rolls_back() {
    // the second of three events fails to be created: the first, already
    // recorded, goes back to the pool; nothing is queued
    let d = Dev::manual(FIXED);
    let (s1, s2, s3) = (d.stream(), d.stream(), d.stream());
    let p = d.alloc(MIB);
    for s in [s1, s2, s3] {
        d.a.record_stream(p, s).unwrap();
        d.m.launch(s).unwrap();
    }
    let before = observable(&d);
    d.m.fail_create_event_at(2);
    assert!(d.a.free(p).is_err());
    d.check();
    assert_eq!(observable(&d), before);
    d.a.free(p).unwrap();
    d.check();
    d.m.complete_all();
    d.a.empty_cache().unwrap();
    d.check();
    assert_eq!(d.m.segment_count(), 0, "a segment leaked");
    assert_eq!(d.m.live_events(), 0, "an event leaked");
}

#[test]
fn empty_cache_goes_on_past_a_failed_free_and_reports_it() {
    let d = Dev::new(FIXED);
    // three whole segments (large requests, one segment each)
    let ps: Vec<u64> = (0..3).map(|_| d.alloc(30 * MIB)).collect();
    for &p in &ps {
        d.free(p);
    }
    assert_eq!(d.m.segment_count(), 3);
    d.m.fail_free_at(2);
    let e = d.a.empty_cache().unwrap_err();
    match &e {
        Error::ReleaseFailed {
            segments, bytes, ..
        } => {
            assert_eq!(*segments, 1);
            assert_eq!(*bytes, 30 * MIB);
        }
        other => panic!("expected ReleaseFailed, got {other}"),
    }
    d.check();
    assert_eq!(d.m.segment_count(), 1, "the other two were released");
    assert_eq!(
        d.a.stats().reserved_bytes.all().current,
        30 * MIB as i64,
        "the failed segment is still counted as reserved"
    );
    // the retry releases it
    d.a.empty_cache().unwrap();
    d.check();
    assert_eq!(d.m.segment_count(), 0);
    assert_eq!(d.a.stats().reserved_bytes.all().current, 0);
}

#[test]
fn oom_ladder_goes_on_past_a_failed_free() {
    // 100 MiB device; two cached 40 MiB segments; a 60 MiB request must
    // release both; one release fails, so the request still fits after the
    // other (40 + 60 = 100): it succeeds, the failed segment stays cached
    let d = Dev::with_capacity(FIXED, 100 * MIB);
    let a = d.alloc(40 * MIB);
    let b = d.alloc(40 * MIB);
    d.free(a);
    d.free(b);
    d.m.fail_free_at(1);
    let p =
        d.a.allocate(60 * MIB, d.s0())
            .expect("fits after one release");
    d.check();
    assert_eq!(d.m.segment_count(), 2);
    d.free(p);
    d.a.empty_cache().unwrap();
    assert_eq!(d.m.segment_count(), 0);
}

/// An allocator in an `Arc`, with an observer that calls back into it.
fn reentrant_allocator() -> (Arc<CachingAllocator<MockBackend>>, Arc<AtomicUsize>) {
    let m = MockConfig::new(GIB).auto_complete(true).build();
    let a =
        Arc::new(CachingAllocator::with_config(m, AllocatorConfig::parse(FIXED).unwrap()).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let weak: Weak<CachingAllocator<MockBackend>> = Arc::downgrade(&a);
    let c = calls.clone();
    a.add_oom_observer(Arc::new(move |_report| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        let Some(a) = weak.upgrade() else { return };
        let s = a.backend().default_stream();
        // every public operation, from inside the observer
        let p = a.allocate(MIB, s).expect("a small allocation still fits");
        a.free(p).unwrap();
        let _ = a.memory_stats();
        a.empty_cache().unwrap();
        a.check_invariants().unwrap();
        let id = a.add_oom_observer(Arc::new(|_| {}));
        assert!(a.remove_oom_observer(id));
        assert!(!a.remove_oom_observer(id));
        // an OOM from inside the observer runs the observers again (once)
        if n == 0 {
            assert!(a.allocate(2 * GIB, s).is_err());
        }
    }));
    (a, calls)
}

#[test]
fn observers_may_call_back_into_the_allocator() {
    let (a, calls) = reentrant_allocator();
    let s = a.backend().default_stream();
    let e = a.allocate(2 * GIB, s).unwrap_err();
    assert!(matches!(e, Error::NeverFits { .. }), "{e}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "outer OOM and the nested one"
    );
    a.check_invariants().unwrap();
    assert_eq!(a.stats().allocated_bytes.all().current, 0);
}

#[test]
fn observers_can_be_removed() {
    let m = MockConfig::new(GIB).auto_complete(true).build();
    let a = CachingAllocator::with_config(m, AllocatorConfig::parse(FIXED).unwrap()).unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let id = a.add_oom_observer(Arc::new(move |_| {
        c.fetch_add(1, Ordering::SeqCst);
    }));
    let s = a.backend().default_stream();
    assert!(a.allocate(2 * GIB, s).is_err());
    assert!(a.remove_oom_observer(id));
    assert!(a.allocate(2 * GIB, s).is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
