//! The caching engine over the faked Level Zero table: caching, error
//! mapping, OOM, event recycling, and the typed refusal of capture.

use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, CaptureError, Error, PoolFilter};
use cachalot_level_zero_sys::*;

use crate::LevelZeroBackend;
use crate::fake::{self, with};

const MIB: u64 = 1 << 20;

fn allocator() -> CachingAllocator<LevelZeroBackend> {
    let b = LevelZeroBackend::with_api(fake::api(), 0).unwrap();
    CachingAllocator::with_config(
        b,
        AllocatorConfig::parse("expandable_segments:False").unwrap(),
    )
    .unwrap()
}

#[test]
fn capture_is_refused_with_a_typed_error() {
    let a = allocator();
    let e = a
        .begin_allocate_to_pool(cachalot_core::graph_pool_handle(), PoolFilter::CaptureId(1))
        .unwrap_err();
    assert!(
        matches!(e, Error::Capture(CaptureError::Unsupported("level-zero"))),
        "{e:?}"
    );
}

#[test]
fn cache_hit_error_mapping_and_oom() {
    let a = allocator();
    let s0 = a.backend().default_stream();
    let p = a.allocate(3 * MIB, s0).unwrap();
    a.free(p).unwrap();
    assert_eq!(a.allocate(3 * MIB, s0).unwrap(), p);
    assert_eq!(with(|s| s.allocs.len()), 1);
    a.free(p).unwrap();

    with(|s| s.alloc_error = Some(ZE_RESULT_ERROR_DEVICE_LOST));
    match a.allocate(64 * MIB, s0).unwrap_err() {
        Error::Backend(e) => assert_eq!((e.backend, e.call), ("level-zero", "zeMemAllocDevice")),
        other => panic!("expected a backend error, got {other:?}"),
    }
    let e = a.allocate(900 * MIB, s0).unwrap();
    assert!(a.allocate(900 * MIB, s0).unwrap_err().is_out_of_memory());
    a.free(e).unwrap();
    a.empty_cache().unwrap();
    assert!(with(|s| s.allocs.is_empty()));
    a.check_invariants().unwrap();
}

#[test]
fn record_stream_defers_reuse_and_recycles_events() {
    let a = allocator();
    let s0 = a.backend().default_stream();
    let side = a.backend().create_stream().unwrap();
    with(|s| s.hold = true);
    for round in 0..3 {
        let p = a.allocate(2 * MIB, s0).unwrap();
        a.record_stream(p, side.handle()).unwrap();
        a.free(p).unwrap();
        let q = a.allocate(2 * MIB, s0).unwrap();
        assert_ne!(
            p, q,
            "round {round}: block in use on the side stream is not reused"
        );
        a.free(q).unwrap();
        with(|s| s.complete_all());
        let r = a.allocate(2 * MIB, s0).unwrap();
        a.free(r).unwrap();
    }
    let created = with(|s| s.calls.iter().filter(|c| **c == "zeEventCreate").count());
    assert_eq!(created, 1, "the engine recycles its event");
    a.check_invariants().unwrap();
}

/// The default configuration maps pages through the virtual-memory table
/// (cachalot's expandable mode), serves a hit with no driver call, and
/// gives every mapping, physical allocation and reservation back at
/// `empty_cache`.
#[test]
fn the_default_maps_pages_and_returns_them() {
    let b = crate::fake::api();
    let a = CachingAllocator::with_config(
        crate::LevelZeroBackend::with_api(b, 0).unwrap(),
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
