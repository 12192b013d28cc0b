//! The caching engine over the faked HIP table: caching, error mapping, OOM
//! flush-and-retry, event recycling for cross-stream frees, and capture.

use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, Error, PoolFilter};
use cachalot_hip_sys::*;

use crate::fake::{self, with};
use crate::{HipBackend, HipStream};

const MIB: u64 = 1 << 20;

fn allocator() -> CachingAllocator<HipBackend> {
    let b = HipBackend::with_api(fake::api(), 0).unwrap();
    CachingAllocator::with_config(
        b,
        AllocatorConfig::parse("expandable_segments:False").unwrap(),
    )
    .unwrap()
}

#[test]
fn cache_hit_reuses_the_segment_without_a_driver_call() {
    let a = allocator();
    let p = a.allocate(3 * MIB, HipStream::NULL).unwrap();
    a.free(p).unwrap();
    let q = a.allocate(3 * MIB, HipStream::NULL).unwrap();
    assert_eq!(p, q);
    assert_eq!(with(|s| s.allocs.len()), 1, "one hipMalloc");
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    assert!(
        with(|s| s.allocs.is_empty()),
        "empty_cache hipFrees the segment"
    );
    a.check_invariants().unwrap();
}

#[test]
fn driver_errors_surface_typed() {
    let a = allocator();
    with(|s| s.malloc_error = Some(hipErrorInvalidValue));
    match a.allocate(MIB, HipStream::NULL).unwrap_err() {
        Error::Backend(e) => assert_eq!((e.backend, e.call), ("hip", "hipMalloc")),
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[test]
fn oom_flushes_the_cache_and_retries_then_reports() {
    let a = allocator();
    with(|s| s.total = 64 << 20);
    let p = a.allocate(40 * MIB, HipStream::NULL).unwrap();
    a.free(p).unwrap();
    // 50 MiB fits only once the cached 40 MiB segment is released.
    let q = a.allocate(50 * MIB, HipStream::NULL).unwrap();
    assert_eq!(with(|s| s.allocs.len()), 1);
    let e = a.allocate(40 * MIB, HipStream::NULL).unwrap_err();
    assert!(e.is_out_of_memory(), "{e:?}");
    assert_eq!(with(|s| s.sticky), hipSuccess);
    a.free(q).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn record_stream_defers_reuse_and_recycles_events() {
    let a = allocator();
    let side = a.backend().create_stream().unwrap();
    with(|s| s.hold_events = true);
    for round in 0..3 {
        let p = a.allocate(2 * MIB, HipStream::NULL).unwrap();
        a.record_stream(p, side.handle()).unwrap();
        a.free(p).unwrap();
        let q = a.allocate(2 * MIB, HipStream::NULL).unwrap();
        assert_ne!(
            p, q,
            "round {round}: block in use on the side stream is not reused"
        );
        a.free(q).unwrap();
        with(|s| s.complete_all());
        let r = a.allocate(2 * MIB, HipStream::NULL).unwrap();
        a.free(r).unwrap();
        a.check_invariants().unwrap();
    }
    assert_eq!(
        with(|s| s.events_created),
        1,
        "the engine recycles its event"
    );
}

#[test]
fn allocation_to_a_private_pool_during_hip_capture() {
    let a = allocator();
    let st = a.backend().create_stream().unwrap();
    let raw = st.handle().as_raw() as usize;
    let pool = cachalot_core::graph_pool_handle();
    assert!(a.backend().capture().is_some());
    with(|s| s.begin_capture(raw, 42));
    a.begin_allocate_to_pool(pool, PoolFilter::CaptureId(42))
        .unwrap();
    with(|s| {
        s.kernel(raw);
    });
    let p = a.allocate(MIB, st.handle()).unwrap();
    with(|s| {
        s.kernel(raw);
    });
    a.free(p).unwrap();
    assert_eq!(with(|s| s.capture_mode), hipStreamCaptureModeGlobal);
    with(|s| s.captures.clear());
    a.end_allocate_to_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert!(with(|s| s.allocs.is_empty()));
}

/// The default configuration maps pages through the virtual-memory table
/// (cachalot's expandable mode), serves a hit with no driver call, and
/// gives every mapping, physical allocation and reservation back at
/// `empty_cache`.
#[test]
fn the_default_maps_pages_and_returns_them() {
    let b = crate::fake::api();
    let a = CachingAllocator::with_config(
        crate::HipBackend::with_api(b, 0).unwrap(),
        AllocatorConfig::default(),
    )
    .unwrap();
    assert!(a.config().expandable_segments);
    let s0 = a.backend().default_stream();
    let p = a.allocate(3 * MIB, s0).unwrap();
    a.free(p).unwrap();
    let maps = with(|s| s.vm.mappings.len());
    assert!(maps > 0, "pages mapped");
    assert_eq!(a.allocate(3 * MIB, s0).unwrap(), p, "a hit");
    assert_eq!(with(|s| s.vm.mappings.len()), maps, "no driver call");
    assert!(with(|s| s.allocs.is_empty()), "no plain device allocation");
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    with(|s| {
        assert!(s.vm.mappings.is_empty(), "every page unmapped");
        assert!(s.vm.reservations.is_empty(), "every reservation freed");
    });
    a.check_invariants().unwrap();
}
