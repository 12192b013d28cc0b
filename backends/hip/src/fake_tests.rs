//! Backend-level tests over the faked HIP table: error mapping, device
//! guard, events, streams and the capture calls, without hardware.

use cachalot_core::{Backend, CaptureStatus, DependencyUpdate, DeviceAllocError, MemoryInfo};
#[allow(unused_imports)]
use cachalot_core::{CaptureQuery as _, GraphCapture as _};
use cachalot_hip_sys::*;

use crate::fake::{self, with};
use crate::{HipBackend, HipStream, OpenError};

fn backend() -> HipBackend {
    HipBackend::with_api(fake::api(), 0).expect("fake device opens")
}

#[test]
fn open_maps_no_device_and_bad_index_to_typed_errors() {
    let api = fake::api();
    with(|s| s.device_count = 0);
    let e = HipBackend::with_api(api.clone(), 0).unwrap_err();
    assert!(
        matches!(e, OpenError::NoDevice { code, .. } if code == hipErrorNoDevice),
        "{e:?}"
    );
    assert!(e.is_unavailable());
    let core: cachalot_core::Error = e.into();
    assert!(matches!(core, cachalot_core::Error::NoDevice(_)));

    with(|s| {
        s.device_count = 2;
        s.count_error = hipErrorInsufficientDriver;
    });
    let e = HipBackend::with_api(api.clone(), 0).unwrap_err();
    assert!(
        matches!(e, OpenError::NoDevice { code, .. } if code == hipErrorInsufficientDriver),
        "{e:?}"
    );

    with(|s| s.count_error = hipSuccess);
    let e = HipBackend::with_api(api.clone(), 5).unwrap_err();
    assert!(
        matches!(e, OpenError::InvalidDevice { index: 5, count: 2 }),
        "{e:?}"
    );
    assert!(!e.is_unavailable());
    assert!(matches!(
        cachalot_core::Error::from(e),
        cachalot_core::Error::InvalidArgument(_)
    ));
}

#[test]
fn an_incomplete_library_is_not_unavailable() {
    // absent: tests skip; present without a required symbol: they fail
    let absent = OpenError::Library(LoadError::LibraryNotFound { tried: Vec::new() });
    assert!(absent.is_unavailable());
    let broken = OpenError::Library(LoadError::MissingSymbol {
        library: "libamdhip64.so.6".into(),
        symbol: "some_entry",
    });
    assert!(!broken.is_unavailable(), "{broken}");
}

#[test]
fn stub_table_is_a_clean_error_not_a_panic() {
    let api = std::sync::Arc::new(HipApi::stub());
    let e = HipBackend::with_api(api, 0).unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    assert!(e.to_string().contains("hipGetDeviceCount"), "{e}");
}

#[test]
fn malloc_free_and_memory_info() {
    let b = backend();
    assert_eq!(b.name(), "hip");
    assert_eq!(b.default_stream(), HipStream::NULL);
    let p = b.malloc(2 << 20).unwrap();
    assert_ne!(p, 0);
    assert_eq!(
        b.memory_info().unwrap(),
        MemoryInfo {
            free: (1 << 30) - (2 << 20),
            total: 1 << 30
        }
    );
    b.free(p, 2 << 20).unwrap();
    assert!(with(|s| s.allocs.is_empty()));
    // Freeing an unknown pointer is the driver's error, typed.
    let e = b.free(p, 2 << 20).unwrap_err();
    assert_eq!(
        (e.backend, e.call, e.code),
        ("hip", "hipFree", i64::from(hipErrorInvalidValue))
    );
    assert!(e.source.is_some());
}

#[test]
fn out_of_memory_is_distinguished_and_clears_sticky_error() {
    let b = backend();
    let e = b.malloc(2 << 30).unwrap_err();
    assert!(matches!(e, DeviceAllocError::OutOfMemory), "{e:?}");
    assert_eq!(with(|s| s.sticky), hipSuccess, "hipGetLastError was called");

    with(|s| s.malloc_error = Some(hipErrorInvalidValue));
    match b.malloc(512).unwrap_err() {
        DeviceAllocError::Backend(e) => {
            assert_eq!(e.call, "hipMalloc");
            assert_eq!(e.code, i64::from(hipErrorInvalidValue));
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
}

#[test]
fn device_guard_sets_and_restores_the_current_device() {
    let b = HipBackend::with_api(fake::api(), 1).unwrap();
    with(|s| s.current = 0);
    let p = b.malloc(512).unwrap();
    assert_eq!(
        with(|s| (s.current, s.set_device_calls.clone())),
        (0, vec![1, 0])
    );
    b.free(p, 512).unwrap();
    b.synchronize_device().unwrap();
    assert_eq!(with(|s| s.device_syncs), 1);
}

#[test]
fn events_record_query_wait_synchronize_and_destroy() {
    let b = backend();
    let s1 = b.create_stream().unwrap();
    let ev = b.create_event().unwrap();
    with(|s| s.hold_events = true);
    assert_eq!(b.query_stream(s1.handle()).unwrap(), Some(true), "idle");
    b.record_event(&ev, s1.handle()).unwrap();
    assert!(
        !b.query_event(&ev).unwrap(),
        "pending while the stream is busy"
    );
    assert_eq!(b.query_stream(s1.handle()).unwrap(), Some(false), "busy");
    b.stream_wait_event(HipStream::NULL, &ev).unwrap();
    assert_eq!(with(|s| s.waits.len()), 1);
    with(|s| s.complete_all());
    assert!(b.query_event(&ev).unwrap());
    assert_eq!(b.query_stream(s1.handle()).unwrap(), Some(true));
    b.record_event(&ev, s1.handle()).unwrap();
    b.synchronize_event(&ev).unwrap();
    assert!(b.query_event(&ev).unwrap());
    b.destroy_event(ev).unwrap();
    // Dropping an event destroys it too; destroy is not repeated.
    drop(b.create_event().unwrap());
    assert_eq!(with(|s| (s.events_created, s.events_destroyed)), (2, 2));
    drop(s1);
    assert!(
        with(|s| s.streams.is_empty()),
        "OwnedStream destroys on drop"
    );
}

/// A runtime without `hipStreamQuery` (an optional entry): the backend
/// cannot tell whether a stream is idle, and says so (`Ok(None)`: the
/// engine records a completion fence instead).
#[test]
fn stream_query_without_the_entry_cannot_tell() {
    let mut t = std::sync::Arc::try_unwrap(fake::api())
        .unwrap_or_else(|_| panic!("the fake table has one owner"));
    t.hipStreamQuery = None;
    let b = HipBackend::with_api(std::sync::Arc::new(t), 0).expect("fake device opens");
    let s1 = b.create_stream().unwrap();
    assert_eq!(b.query_stream(s1.handle()).unwrap(), None);
}

#[test]
fn capture_info_reports_status_id_and_terminals() {
    let b = backend();
    assert!(b.capture().is_some());
    let st = b.create_stream().unwrap();
    let raw = st.handle().as_raw() as usize;
    assert_eq!(
        b.capture_info(st.handle()).unwrap().status,
        CaptureStatus::None
    );

    let (k1, k2) = with(|s| {
        s.begin_capture(raw, 7);
        (s.kernel(raw), s.kernel(raw))
    });
    let info = b.capture_info(st.handle()).unwrap();
    assert_eq!((info.status, info.id), (CaptureStatus::Active, 7));
    assert_eq!(info.terminals.len(), 1);
    assert_eq!(info.terminals[0].as_raw() as usize, k2);
    let parents = b.node_dependencies(info.terminals[0]).unwrap();
    assert_eq!(
        parents
            .iter()
            .map(|n| n.as_raw() as usize)
            .collect::<Vec<_>>(),
        vec![k1]
    );
    assert!(b.node_dependencies(parents[0]).unwrap().is_empty());

    // v1 free marker: an empty node after the terminals becomes the sole dependency.
    let marker = b.add_empty_node(st.handle(), &info.terminals).unwrap();
    assert_eq!(b.node_dependencies(marker).unwrap(), info.terminals);
    b.update_capture_dependencies(st.handle(), &[marker], DependencyUpdate::Set)
        .unwrap();
    assert_eq!(b.capture_info(st.handle()).unwrap().terminals, vec![marker]);
    b.update_capture_dependencies(st.handle(), &info.terminals, DependencyUpdate::Add)
        .unwrap();
    assert_eq!(
        b.capture_info(st.handle()).unwrap().terminals,
        vec![marker, info.terminals[0]]
    );

    with(|s| s.captures.get_mut(&raw).unwrap().id = u64::MAX);
    assert_eq!(
        b.capture_info(st.handle()).unwrap().status,
        CaptureStatus::Invalidated
    );
}

#[test]
fn capture_calls_off_capture_are_typed_errors() {
    let b = backend();
    let e = b.add_empty_node(HipStream::NULL, &[]).unwrap_err();
    assert_eq!(e.code, i64::from(hipErrorIllegalState));
    let e = b
        .update_capture_dependencies(HipStream::NULL, &[], DependencyUpdate::Set)
        .unwrap_err();
    assert_eq!(
        (e.call, e.code),
        (
            "hipStreamUpdateCaptureDependencies",
            i64::from(hipErrorIllegalState)
        )
    );
}

#[test]
fn malloc_during_capture_runs_in_relaxed_mode_and_restores_it() {
    let b = backend();
    let st = b.create_stream().unwrap();
    with(|s| s.begin_capture(st.handle().as_raw() as usize, 3));
    let p = b.malloc(4096).unwrap();
    assert_eq!(with(|s| s.capture_mode), hipStreamCaptureModeGlobal);
    b.free(p, 4096).unwrap();
}

#[test]
fn runtime_without_capture_entries_declares_no_capture() {
    let api = fake::api();
    let mut t = HipApi::stub();
    t.hipGetDeviceCount = api.hipGetDeviceCount;
    t.hipGetDevice = api.hipGetDevice;
    t.hipMalloc = api.hipMalloc;
    let b = HipBackend::with_api(std::sync::Arc::new(t), 0).unwrap();
    assert!(b.capture().is_none());
    assert_eq!(
        b.capture_info(HipStream::NULL).unwrap().status,
        CaptureStatus::None
    );
    let e = b.node_dependencies(crate::HipGraphNode(16)).unwrap_err();
    assert_eq!(e.code, i64::from(hipErrorNotSupported));
    // Without hipThreadExchangeStreamCaptureMode malloc still works.
    assert!(b.malloc(512).is_ok());
}
