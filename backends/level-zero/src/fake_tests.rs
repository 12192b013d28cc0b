//! Backend-level tests over the faked Level Zero table: the zeInit rule,
//! error mapping, event pools and events, streams, and no capture.

use cachalot_core::{Backend, DeviceAllocError, MemoryInfo};
use cachalot_level_zero_sys::*;

use crate::fake::{self, Ev, with};
use crate::{LevelZeroBackend, OpenError};

fn backend() -> LevelZeroBackend {
    LevelZeroBackend::with_api(fake::api(), 0).expect("fake GPU opens")
}

#[test]
fn failed_zeinit_calls_nothing_else() {
    let api = fake::api();
    with(|s| s.init_result = ZE_RESULT_ERROR_UNINITIALIZED);
    let e = LevelZeroBackend::with_api(api, 0).unwrap_err();
    assert!(
        matches!(e, OpenError::NoDevice { code, .. } if code == ZE_RESULT_ERROR_UNINITIALIZED),
        "{e:?}"
    );
    assert!(e.is_unavailable());
    assert_eq!(with(|s| s.calls.clone()), vec!["zeInit"]);
    assert!(matches!(
        cachalot_core::Error::from(e),
        cachalot_core::Error::NoDevice(_)
    ));
}

#[test]
fn no_gpu_and_bad_index_are_typed_errors() {
    let api = fake::api();
    with(|s| s.gpus = 0);
    let e = LevelZeroBackend::with_api(api.clone(), 0).unwrap_err();
    assert!(matches!(e, OpenError::NoDevice { code: 0, .. }), "{e:?}");
    with(|s| s.gpus = 1);
    let e = LevelZeroBackend::with_api(api, 3).unwrap_err();
    assert!(
        matches!(e, OpenError::InvalidDevice { index: 3, count: 1 }),
        "{e:?}"
    );
    assert!(!e.is_unavailable());
}

#[test]
fn an_incomplete_library_is_not_unavailable() {
    // absent: tests skip; present without a required symbol: they fail
    let absent = OpenError::Library(LoadError::LibraryNotFound { tried: Vec::new() });
    assert!(absent.is_unavailable());
    let broken = OpenError::Library(LoadError::MissingSymbol {
        library: "libze_loader.so.1".into(),
        symbol: "some_entry",
    });
    assert!(!broken.is_unavailable(), "{broken}");
}

#[test]
fn stub_table_is_a_clean_error_not_a_panic() {
    let e = LevelZeroBackend::with_api(std::sync::Arc::new(ZeApi::stub()), 0).unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    assert!(e.to_string().contains("zeInit"), "{e}");
}

#[test]
fn malloc_free_memory_info_and_error_mapping() {
    let b = backend();
    assert_eq!((b.name(), b.device()), ("level-zero", 0));
    assert!(b.capture().is_none(), "Level Zero has no graph capture");
    let p = b.malloc(4 << 20).unwrap();
    assert_eq!(
        b.memory_info().unwrap(),
        MemoryInfo {
            free: (1 << 30) - (4 << 20),
            total: 1 << 30
        }
    );
    b.free(p, 4 << 20).unwrap();
    assert_eq!(b.memory_info().unwrap().free, 1 << 30);
    // free synchronizes the streams before zeMemFree.
    let calls = with(|s| s.calls.clone());
    let free_at = calls.iter().rposition(|c| *c == "zeMemFree").unwrap();
    assert_eq!(calls[free_at - 1], "zeEventDestroy");
    assert!(calls[..free_at].contains(&"zeEventHostSynchronize"));

    assert!(matches!(
        b.malloc(2 << 30),
        Err(DeviceAllocError::OutOfMemory)
    ));
    with(|s| s.alloc_error = Some(ZE_RESULT_ERROR_UNSUPPORTED_SIZE));
    match b.malloc(512).unwrap_err() {
        DeviceAllocError::Backend(e) => {
            assert_eq!((e.backend, e.call), ("level-zero", "zeMemAllocDevice"));
            assert_eq!(e.code, i64::from(ZE_RESULT_ERROR_UNSUPPORTED_SIZE));
            assert_eq!(e.message, "ZE_RESULT_ERROR_UNSUPPORTED_SIZE");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    let e = b.free(0xdead_0000, 512).unwrap_err();
    assert_eq!(e.code, i64::from(ZE_RESULT_ERROR_INVALID_ARGUMENT));
}

#[test]
fn events_come_from_pools_and_recycle_slots() {
    let b = backend();
    let s1 = b.create_stream().unwrap();
    let evs: Vec<_> = (0..70).map(|_| b.create_event().unwrap()).collect();
    assert_eq!(with(|s| s.pools.len()), 2, "64 events per pool");
    for ev in evs {
        b.destroy_event(ev).unwrap();
    }
    let _again: Vec<_> = (0..64).map(|_| b.create_event().unwrap()).collect();
    assert_eq!(with(|s| s.pools.len()), 2, "freed slots are reused");
    drop(s1);
}

#[test]
fn record_query_wait_and_synchronize() {
    let b = backend();
    let s1 = b.create_stream().unwrap();
    let ev = b.create_event().unwrap();
    with(|s| s.hold = true);
    b.record_event(&ev, s1.handle()).unwrap();
    assert!(!b.query_event(&ev).unwrap());
    b.stream_wait_event(b.default_stream(), &ev).unwrap();
    assert_eq!(with(|s| s.waits.len()), 1);
    with(|s| s.complete_all());
    assert!(b.query_event(&ev).unwrap());
    // Re-recording a completed event resets it on the host first.
    b.record_event(&ev, s1.handle()).unwrap();
    assert!(!b.query_event(&ev).unwrap());
    b.synchronize_event(&ev).unwrap();
    assert!(b.query_event(&ev).unwrap());
    with(|s| s.hold = false);
    b.synchronize_device().unwrap();
    assert!(with(|s| s.events.values().all(|e| *e != Ev::Pending)));
}

#[test]
fn drop_order_destroys_objects_before_pools_and_context() {
    {
        let b = backend();
        let _s = b.create_stream().unwrap();
        let _e = b.create_event().unwrap();
        let _f = b.create_event().unwrap();
    }
    // The fake asserts on destroy order; everything is gone afterwards.
    assert!(with(|s| s.contexts.is_empty()
        && s.lists.is_empty()
        && s.pools.is_empty()
        && s.events.is_empty()));
}
