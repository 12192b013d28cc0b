//! The null backend's own contract, method by method, without the engine.

use cachalot_core::{Backend, DeviceAllocError, NoCapture, NoVirtualMemory};
use cachalot_null::{
    BASE, ERR_INVALID_SIZE, ERR_UNKNOWN_ADDRESS, ERR_UNKNOWN_STREAM, ERR_WRONG_SIZE, NAME,
    NullBackend,
};

const KIB: u64 = 1024;

#[test]
fn oom_when_full() {
    let b = NullBackend::new(8 * KIB);
    let p = b.malloc(6 * KIB).expect("fits");
    assert!(matches!(
        b.malloc(4 * KIB),
        Err(DeviceAllocError::OutOfMemory)
    ));
    assert!(matches!(
        b.malloc(16 * KIB),
        Err(DeviceAllocError::OutOfMemory)
    ));
    let q = b.malloc(2 * KIB).expect("the rest fits exactly");
    let info = b.memory_info().expect("info");
    assert_eq!((info.free, info.total), (0, 8 * KIB));
    b.free(p, 6 * KIB).expect("free");
    b.free(q, 2 * KIB).expect("free");
    assert_eq!(b.memory_info().expect("info").free, 8 * KIB);
}

#[test]
fn oom_when_fragmented() {
    let b = NullBackend::new(4 * KIB);
    let ptrs: Vec<u64> = (0..4).map(|_| b.malloc(KIB).expect("fits")).collect();
    b.free(ptrs[0], KIB).expect("free");
    b.free(ptrs[2], KIB).expect("free");
    assert_eq!(b.memory_info().expect("info").free, 2 * KIB);
    assert!(matches!(
        b.malloc(2 * KIB),
        Err(DeviceAllocError::OutOfMemory)
    ));
}

#[test]
fn bad_sizes_are_not_oom() {
    let b = NullBackend::new(8 * KIB);
    for size in [0, 100, 513] {
        match b.malloc(size) {
            Err(DeviceAllocError::Backend(e)) => {
                assert_eq!(
                    (e.backend, e.call, e.code),
                    (NAME, "malloc", ERR_INVALID_SIZE)
                );
            }
            other => panic!("size {size}: expected a backend error, got {other:?}"),
        }
    }
}

#[test]
fn bad_free_is_a_typed_error() {
    let b = NullBackend::new(8 * KIB);
    let p = b.malloc(KIB).expect("alloc");
    let e = b.free(p + 512, KIB).expect_err("interior address");
    assert_eq!(
        (e.backend, e.call, e.code),
        (NAME, "free", ERR_UNKNOWN_ADDRESS)
    );
    let e = b.free(p, 2 * KIB).expect_err("wrong size");
    assert_eq!(e.code, ERR_WRONG_SIZE);
    assert_eq!(b.live_segments(), 1, "a failed free changes nothing");
    b.free(p, KIB).expect("free");
    let e = b.free(p, KIB).expect_err("double free");
    assert_eq!(e.code, ERR_UNKNOWN_ADDRESS);
}

#[test]
fn addresses_are_reused_after_free() {
    let b = NullBackend::new(64 * KIB);
    let p = b.malloc(4 * KIB).expect("alloc");
    let q = b.malloc(KIB).expect("alloc");
    assert_eq!(p, BASE, "first fit starts at BASE, never at 0");
    assert_eq!(q, p + 4 * KIB, "segments are packed");
    b.free(p, 4 * KIB).expect("free");
    assert_eq!(
        b.malloc(2 * KIB).expect("alloc"),
        p,
        "first fit reuses the gap"
    );
    assert_eq!(
        b.malloc(2 * KIB).expect("alloc"),
        p + 2 * KIB,
        "and its rest"
    );
    assert_eq!(b.malloc(KIB).expect("alloc"), q + KIB, "then goes past q");
}

#[test]
fn events_are_always_complete() {
    let b = NullBackend::new(KIB);
    let s = b.create_stream();
    assert_ne!(s, b.default_stream());
    let e = b.create_event().expect("event");
    assert!(
        b.query_event(&e).expect("query"),
        "complete before any record"
    );
    b.record_event(&e, s).expect("record");
    assert!(b.query_event(&e).expect("query"));
    b.stream_wait_event(b.default_stream(), &e).expect("wait");
    b.synchronize_event(&e).expect("sync");
    let err = b.record_event(&e, s + 1).expect_err("unknown stream");
    assert_eq!(err.code, ERR_UNKNOWN_STREAM);
    assert_eq!(b.live_events(), 1);
    b.destroy_event(e).expect("destroy");
    assert_eq!(b.live_events(), 0);
}

#[test]
fn no_capture_no_virtual_memory() {
    fn optional_parts<B: Backend<Capture = NoCapture, VirtualMemory = NoVirtualMemory>>(_: &B) {}
    let b = NullBackend::new(KIB);
    optional_parts(&b);
    assert!(b.capture().is_none());
    assert!(b.virtual_memory().is_none());
}
