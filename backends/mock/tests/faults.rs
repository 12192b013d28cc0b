//! The general failure-injection API: every `MockCall` can be made to fail
//! once (`fail_call_at`) or always (`fail_call_always`), with a typed error,
//! without side effects, and is counted.

use cachalot_core::{
    Backend, CaptureStatus, DependencyUpdate, DeviceAllocError, GraphCapture, VirtualMemory,
};
use cachalot_mock::{
    CaptureMode, Failure, MallocFailure, MockBackend, MockCall, MockConfig, MockEvent, MockNode,
    MockStream, Submitted, codes,
};

const M: u64 = 1 << 20;

/// A device set up so that one call of any kind succeeds: an event recorded
/// on `s1`, and for the capture calls an active capture of `s2` with a node.
struct Fix {
    d: MockBackend,
    s1: MockStream,
    s2: MockStream,
    e: MockEvent,
    capture: u64,
    node: Option<MockNode>,
}

fn fixture(call: MockCall) -> Fix {
    let d = MockConfig::new(1 << 30)
        .capture_mode(CaptureMode::Relaxed)
        .build();
    let s1 = d.create_stream();
    let s2 = d.create_stream();
    let e = d.create_event().unwrap();
    d.launch(s1).unwrap();
    d.record_event(&e, s1).unwrap();
    let capture_call = matches!(
        call,
        MockCall::CaptureState
            | MockCall::ExtendNodeDependencies
            | MockCall::MarkAncestors
            | MockCall::AddEmptyNode
            | MockCall::UpdateCaptureDependencies
    );
    let (capture, node) = if capture_call {
        let id = d.begin_capture(s2).unwrap();
        d.launch(s2).unwrap();
        let Submitted::Node(n) = d.launch(s2).unwrap() else {
            panic!("not a node")
        };
        (id, Some(n))
    } else {
        (0, None)
    };
    Fix {
        d,
        s1,
        s2,
        e,
        capture,
        node,
    }
}

/// One call of `call`; `Err((code, call name))` on a backend error (malloc's
/// OOM reads as code -1).
fn invoke(f: &Fix, call: MockCall) -> Result<(), (i64, &'static str)> {
    let d = &f.d;
    let be = |e: cachalot_core::BackendError| (e.code, e.call);
    let ae = |e: DeviceAllocError, name: &'static str| match e {
        DeviceAllocError::OutOfMemory => (-1, name),
        DeviceAllocError::Backend(e) => (e.code, e.call),
    };
    let node = || f.node.expect("capture fixture");
    // The setup of a virtual-memory call: a reservation, a physical
    // allocation, a mapping.
    let reserve = || d.reserve(2 * M).expect("reserve for the call");
    let create = || {
        d.create_physical(2 * M)
            .expect("create_physical for the call")
    };
    let mapped = || {
        let (a, p) = (reserve(), create());
        d.map(a, 2 * M, &p).expect("map for the call");
        a
    };
    match call {
        MockCall::Malloc => d.malloc(2 * M).map(drop).map_err(|e| match e {
            DeviceAllocError::OutOfMemory => (-1, "malloc"),
            DeviceAllocError::Backend(e) => be(e),
        }),
        MockCall::Free => {
            let p = d.malloc(2 * M).expect("malloc for free");
            d.free(p, 2 * M).map_err(be)
        }
        MockCall::MemoryInfo => d.memory_info().map(drop).map_err(be),
        MockCall::CreateEvent => d.create_event().map(drop).map_err(be),
        MockCall::DestroyEvent => {
            let e = d.create_event().expect("event for destroy");
            d.destroy_event(e).map_err(be)
        }
        MockCall::RecordEvent => d.record_event(&f.e, f.s1).map_err(be),
        MockCall::QueryEvent => d.query_event(&f.e).map(drop).map_err(be),
        MockCall::QueryStream => d.query_stream(f.s1).map(drop).map_err(be),
        MockCall::SynchronizeEvent => d.synchronize_event(&f.e).map_err(be),
        MockCall::StreamWaitEvent => d.stream_wait_event(f.s2, &f.e).map_err(be),
        MockCall::SynchronizeDevice => d.synchronize_device().map_err(be),
        MockCall::CaptureState => {
            let mut t = Vec::new();
            let r = d.capture_state(f.s2, &mut t).map_err(be)?;
            assert_eq!(r, (CaptureStatus::Active, f.capture));
            Ok(())
        }
        MockCall::ExtendNodeDependencies => {
            let mut out = Vec::new();
            d.extend_node_dependencies(node(), &mut out).map_err(be)?;
            assert_eq!(out.len(), 1);
            Ok(())
        }
        MockCall::MarkAncestors => {
            let mut bits = Vec::new();
            let walked = d
                .mark_ancestors(f.capture, &[node()], &mut bits)
                .map_err(be)?;
            assert!(walked);
            Ok(())
        }
        MockCall::AddEmptyNode => d.add_empty_node(f.s2, &[node()]).map(drop).map_err(be),
        MockCall::UpdateCaptureDependencies => d
            .update_capture_dependencies(f.s2, &[node()], DependencyUpdate::Add)
            .map_err(be),
        MockCall::Granularity => d.granularity().map(drop).map_err(be),
        MockCall::Reserve => d.reserve(2 * M).map(drop).map_err(|e| ae(e, "reserve")),
        MockCall::Unreserve => d.unreserve(reserve(), 2 * M).map_err(be),
        MockCall::CreatePhysical => d
            .create_physical(2 * M)
            .map(drop)
            .map_err(|e| ae(e, "create_physical")),
        MockCall::ReleasePhysical => d.release_physical(create()).map_err(be),
        MockCall::Map => d.map(reserve(), 2 * M, &create()).map_err(be),
        MockCall::Unmap => d.unmap(mapped(), 2 * M).map_err(be),
        MockCall::SetAccess => d.set_access(mapped(), 2 * M, 0).map_err(be),
    }
}

/// The calls `invoke(call)` makes before the call itself.
fn setup_calls(call: MockCall) -> &'static [MockCall] {
    match call {
        MockCall::Free => &[MockCall::Malloc],
        MockCall::DestroyEvent => &[MockCall::CreateEvent],
        MockCall::Unreserve => &[MockCall::Reserve],
        MockCall::ReleasePhysical => &[MockCall::CreatePhysical],
        MockCall::Map => &[MockCall::Reserve, MockCall::CreatePhysical],
        MockCall::Unmap | MockCall::SetAccess => {
            &[MockCall::Reserve, MockCall::CreatePhysical, MockCall::Map]
        }
        _ => &[],
    }
}

#[test]
fn every_call_fails_once_at_its_number() {
    for call in MockCall::ALL {
        let f = fixture(call);
        assert_eq!(invoke(&f, call), Ok(()), "{call} works without injection");
        let before = f.d.call_count(call);
        f.d.fail_call_at(call, 2);
        assert_eq!(f.d.pending_failures(call), 1);
        assert_eq!(
            invoke(&f, call),
            Ok(()),
            "{call}: the 1st call from now works"
        );
        assert_eq!(
            invoke(&f, call),
            Err((codes::INJECTED, call.name())),
            "{call}: the 2nd call from now fails"
        );
        assert_eq!(f.d.pending_failures(call), 0);
        assert_eq!(invoke(&f, call), Ok(()), "{call}: the failure fires once");
        assert_eq!(f.d.call_count(call), before + 3);
        let c = f.d.counters();
        assert_eq!(c.injected, 1, "{call}");
        assert!(c.errors >= 1, "{call}");
    }
}

#[test]
fn other_kinds_are_not_affected() {
    for call in MockCall::ALL {
        let f = fixture(call);
        for other in MockCall::ALL {
            if other != call {
                f.d.fail_call_at(other, 1);
            }
        }
        // Free, DestroyEvent, Map, ... make other calls first: spare those.
        for &setup in setup_calls(call) {
            f.d.clear_failures_of(setup);
        }
        assert_eq!(
            invoke(&f, call),
            Ok(()),
            "{call} fails only on its own kind"
        );
        assert_eq!(f.d.counters().injected, 0);
    }
}

#[test]
fn chosen_failures_and_codes() {
    let d = MockBackend::new(1 << 30);
    d.fail_call_at_with(MockCall::Malloc, 1, Failure::OutOfMemory);
    d.fail_call_at_with(MockCall::Malloc, 2, Failure::Backend(719));
    assert!(matches!(
        d.malloc(2 * M),
        Err(DeviceAllocError::OutOfMemory)
    ));
    match d.malloc(2 * M) {
        Err(DeviceAllocError::Backend(e)) => {
            assert_eq!((e.code, e.call), (719, "malloc"));
            assert!(e.message.contains("injected"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    // OOM on a call other than malloc is a backend error with the OOM code.
    d.fail_call_at_with(MockCall::CreateEvent, 1, Failure::OutOfMemory);
    let e = d.create_event().unwrap_err();
    assert_eq!((e.code, e.call), (codes::MEMORY_ALLOCATION, "create_event"));
    // Injecting twice at one call keeps the later failure.
    d.fail_call_at_with(MockCall::MemoryInfo, 1, Failure::Backend(5));
    d.fail_call_at_with(MockCall::MemoryInfo, 1, Failure::Backend(6));
    assert_eq!(d.pending_failures(MockCall::MemoryInfo), 1);
    assert_eq!(d.memory_info().unwrap_err().code, 6);
    // n = 0 is ignored.
    d.fail_call_at(MockCall::MemoryInfo, 0);
    assert!(d.memory_info().is_ok());
    // The legacy names are thin wrappers of the general API.
    let _: MallocFailure = Failure::OutOfMemory;
    d.fail_malloc_at(1);
    assert_eq!(d.pending_failures(MockCall::Malloc), 1);
    d.fail_free_at(3);
    d.fail_create_event_at(2);
    assert_eq!(d.pending_failures(MockCall::Free), 1);
    assert_eq!(d.pending_failures(MockCall::CreateEvent), 1);
    d.clear_failures();
    for call in MockCall::ALL {
        assert_eq!(d.pending_failures(call), 0);
    }
    let c = d.counters();
    assert_eq!(
        (c.injected, c.malloc_failed, c.create_event_failed),
        (4, 2, 1)
    );
}

#[test]
fn always_fails_until_cleared() {
    let d = MockBackend::new(1 << 30);
    d.fail_call_always(MockCall::MemoryInfo);
    assert_eq!(
        d.failing_always(MockCall::MemoryInfo),
        Some(Failure::INJECTED)
    );
    for _ in 0..3 {
        assert_eq!(d.memory_info().unwrap_err().code, codes::INJECTED);
    }
    // A one-shot failure takes precedence at its call.
    d.fail_call_at_with(MockCall::MemoryInfo, 2, Failure::Backend(42));
    assert_eq!(d.memory_info().unwrap_err().code, codes::INJECTED);
    assert_eq!(d.memory_info().unwrap_err().code, 42);
    d.clear_failures_of(MockCall::MemoryInfo);
    assert_eq!(d.failing_always(MockCall::MemoryInfo), None);
    assert!(d.memory_info().is_ok());
    d.fail_call_always_with(MockCall::Malloc, Failure::OutOfMemory);
    assert!(matches!(
        d.malloc(2 * M),
        Err(DeviceAllocError::OutOfMemory)
    ));
    assert!(matches!(
        d.malloc(2 * M),
        Err(DeviceAllocError::OutOfMemory)
    ));
    d.clear_failures();
    assert!(d.malloc(2 * M).is_ok());
    let c = d.counters();
    assert_eq!(c.injected, 7);
    assert_eq!(c.memory_info, 6);
    assert_eq!(d.call_count(MockCall::MemoryInfo), 6);
    d.reset_counters();
    assert_eq!(
        d.call_count(MockCall::MemoryInfo),
        6,
        "call numbers never reset"
    );
}

#[test]
fn injected_failures_change_nothing() {
    let d = MockConfig::new(1 << 30)
        .capture_mode(CaptureMode::Relaxed)
        .build();
    let (s1, s2) = (d.create_stream(), d.create_stream());
    // free: the segment stays.
    let p = d.malloc(2 * M).unwrap();
    d.fail_call_at(MockCall::Free, 1);
    assert!(d.free(p, 2 * M).is_err());
    assert_eq!(d.live_segments(), vec![(p, 2 * M)]);
    assert_eq!(d.live_bytes(), 2 * M);
    // malloc: nothing allocated.
    d.fail_call_at(MockCall::Malloc, 1);
    assert!(d.malloc(2 * M).is_err());
    assert_eq!(d.segment_count(), 1);
    // create/destroy: no event made, none destroyed.
    d.fail_call_at(MockCall::CreateEvent, 1);
    assert!(d.create_event().is_err());
    assert_eq!(d.live_events(), 0);
    let e = d.create_event().unwrap();
    d.fail_call_at(MockCall::DestroyEvent, 1);
    assert!(d.destroy_event(e.clone()).is_err());
    assert_eq!(d.live_events(), 1);
    // record: the event keeps its old record (never recorded: complete).
    d.launch(s1).unwrap();
    d.fail_call_at(MockCall::RecordEvent, 1);
    assert!(d.record_event(&e, s1).is_err());
    assert!(
        d.query_event(&e).unwrap(),
        "a never-recorded event is complete"
    );
    d.record_event(&e, s1).unwrap();
    // synchronize: nothing completes.
    d.fail_call_at(MockCall::SynchronizeEvent, 1);
    assert!(d.synchronize_event(&e).is_err());
    assert_eq!(d.pending(s1).unwrap(), 1);
    d.fail_call_at(MockCall::SynchronizeDevice, 1);
    assert!(d.synchronize_device().is_err());
    assert_eq!(d.pending(s1).unwrap(), 1);
    // wait: no ordering edge, so a use of the same bytes on s2 races.
    d.use_memory(s1, p, 512, 1).unwrap();
    d.record_event(&e, s1).unwrap();
    d.fail_call_at(MockCall::StreamWaitEvent, 1);
    assert!(d.stream_wait_event(s2, &e).is_err());
    d.use_memory(s2, p, 512, 2).unwrap();
    assert_eq!(d.race_count(), 1, "the failed wait ordered nothing");
    // capture: no node added, terminals unchanged.
    let _ = d.begin_capture(s2).unwrap();
    let Submitted::Node(n) = d.launch(s2).unwrap() else {
        panic!()
    };
    d.fail_call_at(MockCall::AddEmptyNode, 1);
    assert!(d.add_empty_node(s2, &[n]).is_err());
    assert_eq!(d.capture_node_count(s2), Some(1));
    let m = d.add_empty_node(s2, &[n]).unwrap();
    d.fail_call_at(MockCall::UpdateCaptureDependencies, 1);
    assert!(
        d.update_capture_dependencies(s2, &[m], DependencyUpdate::Set)
            .is_err()
    );
    let mut t = Vec::new();
    assert_eq!(
        d.capture_state(s2, &mut t).unwrap().0,
        CaptureStatus::Active
    );
    assert_eq!(t, vec![n], "terminals unchanged");
    assert_eq!(
        d.counters().captures_invalidated,
        0,
        "no failure invalidates"
    );
    d.end_capture(s2).unwrap();
    d.complete_all();
    d.destroy_event(e).unwrap();
}
