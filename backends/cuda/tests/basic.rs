//! Segments, memory info, events, streams and copies on a real device.
//! Every test prints "skipped: ..." and passes on a machine without CUDA
//! (fails instead under `CACHALOT_REQUIRE_GPU=1`: see `common::skip`).

mod common;

use cachalot_core::{CaptureQuery as _, GraphCapture as _};
use std::time::{Duration, Instant};

use cachalot_core::{Backend, DeviceAllocError, Error};
use cachalot_cuda::{CudaBackend, CudaStream};
use common::{backend_or_skip, read_back, skip};

const MIB: u64 = 1 << 20;

#[test]
fn new_without_device_is_typed_error() {
    match CudaBackend::new(0) {
        Ok(b) => {
            println!(
                "device 0: {} (driver {}), capture: {}",
                b.device_name(),
                b.driver_version(),
                b.capture().is_some()
            );
            assert_eq!(b.name(), "cuda");
            assert_eq!(b.device(), 0);
            assert_eq!(b.default_stream(), CudaStream::LEGACY);
        }
        Err(Error::NoDevice(reason)) => {
            assert!(!cachalot_cuda::is_available());
            skip(format_args!("no device ({reason})"));
        }
        Err(e) => panic!("unexpected error {e}"),
    }
    // An out-of-range index is a typed error, never a panic.
    let err = CudaBackend::new(100_000).expect_err("index 100000 must fail");
    assert!(
        matches!(err, Error::NoDevice(_) | Error::InvalidArgument(_)),
        "{err}"
    );
}

#[test]
fn alloc_free_and_memory_info() {
    let Some(b) = backend_or_skip("alloc_free_and_memory_info") else {
        return;
    };
    let before = b.memory_info().expect("memory_info");
    assert!(before.total > 0 && before.free <= before.total);
    let size = 256 * MIB;
    let p = b.malloc(size).expect("malloc 256 MiB");
    assert_ne!(p, 0);
    assert_eq!(p % 512, 0);
    let during = b.memory_info().expect("memory_info");
    assert!(
        during.free + size <= before.free + 64 * MIB,
        "free memory did not drop: {before:?} -> {during:?}"
    );
    b.free(p, size).expect("free");
    let q = b.malloc(512).expect("malloc 512");
    b.free(q, 512).expect("free 512");
}

#[test]
fn absurd_allocation_is_out_of_memory() {
    let Some(b) = backend_or_skip("absurd_allocation_is_out_of_memory") else {
        return;
    };
    let total = b.memory_info().expect("memory_info").total;
    for size in [total + (1 << 30), 1u64 << 50] {
        match b.malloc(size) {
            Err(DeviceAllocError::OutOfMemory) => {}
            Ok(p) => panic!("allocating {size} bytes succeeded at {p:#x}"),
            Err(e) => panic!("allocating {size} bytes: expected OutOfMemory, got {e}"),
        }
    }
    // The failure is not sticky: the device is still usable.
    let p = b.malloc(MIB).expect("malloc after OOM");
    b.memset_d8_async(p, 7, MIB, CudaStream::LEGACY)
        .expect("memset");
    assert!(read_back(&b, p, 16).iter().all(|&x| x == 7));
    b.free(p, MIB).expect("free");
}

#[test]
fn free_of_bad_pointer_is_backend_error() {
    let Some(b) = backend_or_skip("free_of_bad_pointer_is_backend_error") else {
        return;
    };
    let err = b.free(0xdead_0000, 512).expect_err("bogus free must fail");
    assert_eq!(err.backend, "cuda");
    assert_ne!(err.code, 0);
    assert!(std::error::Error::source(&err).is_some());
    println!("bogus free: {err}");
}

#[test]
fn memset_copy_readback() {
    let Some(b) = backend_or_skip("memset_copy_readback") else {
        return;
    };
    let s = b.create_stream().expect("create_stream");
    let len = 4 * MIB;
    let a = b.malloc(len).expect("malloc a");
    let c = b.malloc(len).expect("malloc c");
    b.memset_d8_async(a, 0xab, len, *s).expect("memset");
    b.memcpy_dtod_async(c, a, len, s.handle()).expect("dtod");
    b.stream_synchronize(*s).expect("sync");
    let host = read_back(&b, c, len as usize);
    assert!(host.iter().all(|&x| x == 0xab));

    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    b.memcpy_htod(a, &pattern).expect("htod");
    assert_eq!(read_back(&b, a, pattern.len()), pattern);
    b.free(a, len).expect("free a");
    b.free(c, len).expect("free c");
}

#[test]
fn events_order_streams() {
    let Some(b) = backend_or_skip("events_order_streams") else {
        return;
    };
    let s1 = b.create_stream().expect("s1");
    let s2 = b.create_stream().expect("s2");
    let len = MIB;
    let buf = b.malloc(len).expect("buf");
    let out = b.malloc(len).expect("out");
    b.memset_d8_async(out, 0, len, *s2).expect("memset out");
    b.stream_synchronize(*s2).expect("sync");

    // s1: slow, then writes 1s and records the event.
    let ev = b.create_event().expect("event");
    let delay = Duration::from_millis(300);
    let queued = Instant::now();
    b.delay_stream(*s1, delay).expect("delay");
    b.memset_d8_async(buf, 1, len, *s1).expect("memset buf");
    b.record_event(&ev, *s1).expect("record");
    // The driver may run the host function on the calling thread, blocking
    // it until the delay is over (always under compute-sanitizer, which
    // run.sh says with CACHALOT_UNDER_SANITIZER; seen once without it on
    // the H200): the event can then be complete here, and the ordering is
    // checked by the data alone. Otherwise it must not be.
    let took = queued.elapsed();
    let early = b.query_event(&ev).expect("query");
    assert!(
        !early || took >= delay || std::env::var_os("CACHALOT_UNDER_SANITIZER").is_some(),
        "event completed too early ({took:?} after the delay was queued)"
    );

    // s2 waits for the event, then copies buf to out.
    b.stream_wait_event(*s2, &ev).expect("wait");
    b.memcpy_dtod_async(out, buf, len, *s2).expect("dtod");
    let t = Instant::now();
    b.stream_synchronize(*s2).expect("sync s2");
    println!("s2 waited {:?} for s1", t.elapsed());
    assert!(
        b.query_event(&ev).expect("query"),
        "event not complete after wait"
    );
    assert!(read_back(&b, out, len as usize).iter().all(|&x| x == 1));

    // synchronize_event on a fresh record.
    b.delay_stream(*s1, Duration::from_millis(50))
        .expect("delay");
    b.record_event(&ev, *s1).expect("record");
    b.synchronize_event(&ev).expect("synchronize_event");
    assert!(b.query_event(&ev).expect("query"));
    b.destroy_event(ev).expect("destroy");
    b.synchronize_device().expect("synchronize_device");
    b.free(buf, len).expect("free");
    b.free(out, len).expect("free");
}

#[test]
fn usable_from_other_threads() {
    let Some(b) = backend_or_skip("usable_from_other_threads") else {
        return;
    };
    std::thread::scope(|scope| {
        for t in 0..4u8 {
            let b = &b;
            scope.spawn(move || {
                let s = b.create_stream().expect("stream");
                for _ in 0..50 {
                    let p = b.malloc(2 * MIB).expect("malloc");
                    b.memset_d8_async(p, t, 2 * MIB, *s).expect("memset");
                    let ev = b.create_event().expect("event");
                    b.record_event(&ev, *s).expect("record");
                    b.synchronize_event(&ev).expect("sync");
                    b.destroy_event(ev).expect("destroy");
                    assert_eq!(read_back(b, p, 8), vec![t; 8]);
                    b.free(p, 2 * MIB).expect("free");
                }
            });
        }
    });
}

#[test]
fn without_capture_stream_reports_none() {
    let Some(b) = backend_or_skip("without_capture_stream_reports_none") else {
        return;
    };
    if b.capture().is_none() {
        skip(format_args!(
            "driver {} has no capture API",
            b.driver_version()
        ));
        return;
    }
    let s = b.create_stream().expect("stream");
    let info = b.capture_info(*s).expect("capture_info");
    assert_eq!(info, cachalot_core::CaptureInfo::none());
    assert!(b.add_empty_node(*s, &[]).is_err());
}
