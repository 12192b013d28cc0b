//! `cachalot_cuda::interop` on a real device, through cudarc's own calls:
//! the allocator on the caller's context, copies and memsets into slices
//! and views, foreign-stream uses recorded, stream-ordered reuse, typed
//! errors. Every test prints "skipped: ..." and passes on a machine without
//! CUDA (fails instead under `CACHALOT_REQUIRE_GPU=1`: see `common::skip`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use cachalot_core::{AllocatorConfig, Error};
use cachalot_cuda::cudarc::driver::{CudaContext, DevicePtr, DeviceSlice};
use cachalot_cuda::{CudaAllocator, CudaStream};
use common::skip;

/// The caller's context on device 0 and an allocator on it, or a skip.
fn open(test: &str) -> Option<(Arc<CudaContext>, Arc<CudaAllocator>)> {
    if !cachalot_cuda::is_available() {
        skip(format_args!("{test}: no CUDA driver or device"));
        return None;
    }
    let ctx = CudaContext::new(0).expect("CudaContext::new(0)");
    let alloc = CudaAllocator::with_config(&ctx, AllocatorConfig::default()).expect("allocator");
    Some((ctx, alloc))
}

#[test]
fn opens_on_the_callers_context() {
    let Some((ctx, alloc)) = open("opens_on_the_callers_context") else {
        return;
    };
    let b = alloc.engine().backend();
    assert_eq!(
        b.raw_context(),
        ctx.cu_ctx(),
        "the caller's context, not a second one"
    );
    assert!(Arc::ptr_eq(b.cudarc_context().unwrap(), &ctx));
    assert!(Arc::ptr_eq(alloc.context(), &ctx));
}

#[test]
fn copies_views_and_memsets_round_trip() {
    let Some((ctx, alloc)) = open("copies_views_and_memsets_round_trip") else {
        return;
    };
    let s = ctx.new_stream().unwrap();
    let host: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let mut a = alloc.clone_htod(&s, &host).unwrap();
    assert_eq!(s.clone_dtoh(&a).unwrap(), host);
    // a view, a sub-view, and a mutable view written by memset and memcpy
    let v = a.slice(10..20).unwrap();
    assert_eq!(s.clone_dtoh(&v).unwrap(), host[10..20]);
    assert_eq!(s.clone_dtoh(&v.slice(2..4).unwrap()).unwrap(), [12.0, 13.0]);
    {
        let mut w = a.slice_mut(100..200).unwrap();
        s.memset_zeros(&mut w).unwrap();
        s.memcpy_htod(&[7.0f32; 10], &mut w.slice_mut(..10).unwrap())
            .unwrap();
    }
    let back = s.clone_dtoh(&a).unwrap();
    assert_eq!(back[99], 99.0);
    assert_eq!(back[100..110], [7.0; 10]);
    assert_eq!(back[110..200], [0.0; 90]);
    assert_eq!(back[200], 200.0);
    // split halves, device-to-device with a cudarc slice
    let (l, r) = a.split_at_mut(500).unwrap();
    assert_eq!((l.len(), r.len()), (500, 500));
    let c = s.clone_dtod(&r.as_view()).unwrap();
    assert_eq!(s.clone_dtoh(&c).unwrap(), host[500..]);
    let z = alloc.alloc_zeros::<u32>(&s, 3).unwrap();
    assert_eq!(s.clone_dtoh(&z).unwrap(), [0, 0, 0]);
    assert!(alloc.take_error().is_none());
}

#[test]
fn drop_is_stream_ordered_and_foreign_uses_are_recorded() {
    let Some((ctx, alloc)) = open("drop_is_stream_ordered_and_foreign_uses_are_recorded") else {
        return;
    };
    let (s, side) = (ctx.new_stream().unwrap(), ctx.new_stream().unwrap());
    let n = 1 << 20;
    // same stream: freed and reused at once, no device call, no sync
    // SAFETY: the memory is never read.
    let a = unsafe { alloc.alloc::<f32>(&s, n) }.unwrap();
    let pa = a.raw_ptr();
    drop(a);
    let calls = alloc.stats().num_device_alloc;
    // SAFETY: as above.
    let b = unsafe { alloc.alloc::<f32>(&s, n) }.unwrap();
    assert_eq!(b.raw_ptr(), pa);
    assert_eq!(alloc.stats().num_device_alloc, calls);
    // a use on a registered side stream is recorded (once) ...
    let side_h = alloc.register_stream(&side).unwrap();
    let backend = alloc.engine().backend();
    backend
        .delay_stream(side_h, Duration::from_millis(300))
        .unwrap();
    let mut b = b;
    side.memset_zeros(&mut b).unwrap();
    let (_, sync) = b.device_ptr(&side);
    drop(sync);
    assert_eq!(b.recorded_streams(), [side_h]);
    let pb = b.raw_ptr();
    drop(b);
    // ... so its block is not reused while the side stream is busy
    // SAFETY: as above.
    let c = unsafe { alloc.alloc::<f32>(&s, n) }.unwrap();
    assert_ne!(
        c.raw_ptr(),
        pb,
        "reused before the side stream's work completed"
    );
    side.synchronize().unwrap();
    drop(c);
    assert!(alloc.take_error().is_none());
    alloc.engine().check_invariants().unwrap();
}

#[test]
fn unknown_streams_fall_back_to_a_sync_and_bad_use_is_a_typed_error() {
    let Some((ctx, alloc)) = open("unknown_streams_fall_back") else {
        return;
    };
    let s = ctx.new_stream().unwrap();
    // SAFETY: never read.
    let a = unsafe { alloc.alloc::<f32>(&s, 256) }.unwrap();
    // a stream the allocator does not hold: not recorded (it could not be
    // kept alive), the use is synchronized instead
    let unknown = ctx.new_stream().unwrap();
    let (p, sync) = a.device_ptr(&unknown);
    assert_eq!(p, a.raw_ptr());
    drop(sync);
    assert!(a.recorded_streams().is_empty());
    // a stream of another context: the same fallback, and a typed error kept
    if let Ok(other) = CudaContext::new_non_primary(0, 0) {
        let os = other.new_stream().unwrap();
        drop(a.device_ptr(&os).1);
        assert!(matches!(
            alloc.take_error(),
            Some(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            // SAFETY: fails before allocating.
            unsafe { alloc.alloc::<f32>(&os, 4) },
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            a.record_stream(&os),
            Err(Error::InvalidArgument(_))
        ));
        ctx.bind_to_thread().unwrap();
    }
    assert!(matches!(
        // SAFETY: fails before allocating.
        unsafe { alloc.alloc::<f32>(&s, usize::MAX) },
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(a.slice(0..257), Err(Error::InvalidArgument(_))));
    let mut a = a;
    assert!(a.split_at_mut(300).is_err());
    assert_eq!(DeviceSlice::len(&a), 256);
    // an explicit record_stream registers and records the stream
    a.record_stream(&unknown).unwrap();
    assert_eq!(a.recorded_streams().len(), 1);
    a.free().unwrap();
    // empty slices have no address and need no recording
    // SAFETY: empty.
    let e = unsafe { alloc.alloc::<f32>(&s, 0) }.unwrap();
    assert_eq!(e.raw_ptr(), 0);
    e.record_stream(&unknown).unwrap();
    assert!(e.recorded_streams().is_empty());
    let h = CudaStream::default();
    assert_eq!(h, CudaStream::LEGACY);
}
