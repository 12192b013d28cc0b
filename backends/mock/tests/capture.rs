//! Capture-graph simulation: ids, terminals, fork/join, invalidation, graph
//! inspection, race checking inside graphs and graph replays.

use cachalot_core::{Backend, CaptureInfo, CaptureStatus, DependencyUpdate};
#[allow(unused_imports)]
use cachalot_core::{CaptureQuery as _, GraphCapture as _};
use cachalot_mock::{
    CaptureMode, MockBackend, MockConfig, MockNode, MockStream, NodeKind, Submitted, codes,
};

const M: u64 = 1 << 20;

fn node(s: Submitted) -> MockNode {
    match s {
        Submitted::Node(n) => n,
        other => panic!("expected a node, got {other:?}"),
    }
}

fn setup() -> (MockBackend, MockStream, MockStream, MockStream) {
    let d = MockBackend::new(1 << 30);
    let a = d.create_stream();
    let b = d.create_stream();
    let c = d.create_stream();
    (d, a, b, c)
}

#[test]
fn capture_ids_and_begin_errors() {
    let (d, a, b, _) = setup();
    let e = d.begin_capture(d.default_stream()).unwrap_err();
    assert_eq!(e.code, codes::STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(d.begin_capture(a).unwrap(), 1);
    assert_eq!(d.begin_capture(a).unwrap_err().code, codes::ILLEGAL_STATE);
    assert_eq!(d.begin_capture(b).unwrap(), 2);
    assert_eq!(d.captures_underway(), 2);
    assert_eq!(d.capture_info(a).unwrap().id, 1);
    assert_eq!(d.capture_info(b).unwrap().id, 2);
    d.end_capture(a).unwrap();
    d.end_capture(b).unwrap();
    assert_eq!(d.begin_capture(a).unwrap(), 3);
    d.end_capture(a).unwrap();
    assert_eq!(d.end_capture(a).unwrap_err().code, codes::ILLEGAL_STATE);
    assert_eq!(d.captures_underway(), 0);
    let c = d.counters();
    assert_eq!((c.begin_capture, c.end_capture), (5, 4));
}

#[test]
fn terminals_collapse_and_events_add_no_node() {
    let (d, a, _, _) = setup();
    assert_eq!(d.capture_info(a).unwrap(), CaptureInfo::none());
    let id = d.begin_capture(a).unwrap();
    let info = d.capture_info(a).unwrap();
    assert_eq!(info.status, CaptureStatus::Active);
    assert_eq!(info.id, id);
    assert!(info.terminals.is_empty());
    let n0 = node(d.launch(a).unwrap());
    let n1 = node(d.launch(a).unwrap());
    assert_eq!(d.capture_info(a).unwrap().terminals, vec![n1]);
    assert_eq!(d.node_dependencies(n1).unwrap(), vec![n0]);
    assert!(d.node_dependencies(n0).unwrap().is_empty());
    let e = d.create_event().unwrap();
    d.record_event(&e, a).unwrap();
    assert_eq!(d.capture_node_count(a), Some(2));
    assert_eq!(d.submitted(a).unwrap(), 0, "captured work is not executed");
    let g = d.end_capture(a).unwrap();
    assert_eq!(g.node_count(), 2);
    assert_eq!(g.edges(), vec![(n0, n1)]);
    assert_eq!(g.kind(n0), Some(NodeKind::Kernel));
    assert_eq!(g.stream(n0), Some(a));
    assert_eq!(d.capture_info(a).unwrap(), CaptureInfo::none());
    d.destroy_event(e).unwrap();
}

#[test]
fn fork_and_join() {
    let (d, s1, s2, _) = setup();
    let id = d.begin_capture(s1).unwrap();
    let a = node(d.launch(s1).unwrap());
    let fork = d.create_event().unwrap();
    d.record_event(&fork, s1).unwrap();
    d.stream_wait_event(s2, &fork).unwrap();
    let info2 = d.capture_info(s2).unwrap();
    assert_eq!((info2.status, info2.id), (CaptureStatus::Active, id));
    assert_eq!(info2.terminals, vec![a]);
    let b = node(d.launch(s2).unwrap());
    assert_eq!(d.node_dependencies(b).unwrap(), vec![a]);
    let c = node(d.launch(s1).unwrap());
    let join = d.create_event().unwrap();
    d.record_event(&join, s2).unwrap();
    d.stream_wait_event(s1, &join).unwrap();
    assert_eq!(
        d.capture_info(s1).unwrap().terminals,
        vec![c, b],
        "wait adds"
    );
    let sink = node(d.launch(s1).unwrap());
    assert_eq!(d.node_dependencies(sink).unwrap(), vec![c, b]);
    let g = d.end_capture(s1).unwrap();
    assert_eq!(d.capture_info(s2).unwrap().status, CaptureStatus::None);
    assert_eq!(g.node_count(), 4);
    assert_eq!(g.edge_count(), 4);
    assert_eq!(g.roots(), vec![a]);
    assert_eq!(g.leaves(), vec![sink]);
    assert!(g.reaches(a, sink));
    assert!(!g.reaches(b, c));
    d.destroy_event(fork).unwrap();
    d.destroy_event(join).unwrap();
}

#[test]
fn unjoined_fork_fails_end_capture() {
    let (d, s1, s2, _) = setup();
    d.begin_capture(s1).unwrap();
    d.launch(s1).unwrap();
    let fork = d.create_event().unwrap();
    d.record_event(&fork, s1).unwrap();
    d.stream_wait_event(s2, &fork).unwrap();
    d.launch(s2).unwrap();
    let e = d.end_capture(s1).unwrap_err();
    assert_eq!(e.code, codes::STREAM_CAPTURE_UNJOINED);
    assert_eq!(d.capture_info(s1).unwrap().status, CaptureStatus::None);
    assert_eq!(d.capture_info(s2).unwrap().status, CaptureStatus::None);
    assert_eq!(d.captures_underway(), 0);
    // A join made stale by later work on the side stream is not a join.
    d.begin_capture(s1).unwrap();
    d.record_event(&fork, s1).unwrap();
    d.stream_wait_event(s2, &fork).unwrap();
    d.launch(s2).unwrap();
    let join = d.create_event().unwrap();
    d.record_event(&join, s2).unwrap();
    d.stream_wait_event(s1, &join).unwrap();
    d.launch(s2).unwrap();
    assert_eq!(
        d.end_capture(s1).unwrap_err().code,
        codes::STREAM_CAPTURE_UNJOINED
    );
    d.destroy_event(fork).unwrap();
    d.destroy_event(join).unwrap();
}

#[test]
fn end_on_wrong_stream_invalidates() {
    let (d, s1, s2, _) = setup();
    d.begin_capture(s1).unwrap();
    let fork = d.create_event().unwrap();
    d.record_event(&fork, s1).unwrap();
    d.stream_wait_event(s2, &fork).unwrap();
    assert_eq!(
        d.end_capture(s2).unwrap_err().code,
        codes::STREAM_CAPTURE_UNMATCHED
    );
    assert_eq!(
        d.capture_info(s1).unwrap().status,
        CaptureStatus::Invalidated
    );
    assert!(d.invalidation_reason(s1).unwrap().contains("began on"));
    assert_eq!(
        d.launch(s2).unwrap_err().code,
        codes::STREAM_CAPTURE_INVALIDATED
    );
    assert_eq!(
        d.end_capture(s1).unwrap_err().code,
        codes::STREAM_CAPTURE_INVALIDATED
    );
    assert_eq!(d.capture_info(s2).unwrap(), CaptureInfo::none());
    assert_eq!(d.counters().captures_invalidated, 1);
    d.destroy_event(fork).unwrap();
}

#[test]
fn querying_a_captured_event_invalidates() {
    for sync in [false, true] {
        let d = MockConfig::new(1 << 30)
            .capture_mode(CaptureMode::Relaxed)
            .build();
        let s = d.create_stream();
        let id = d.begin_capture(s).unwrap();
        d.launch(s).unwrap();
        let e = d.create_event().unwrap();
        d.record_event(&e, s).unwrap();
        let err = if sync {
            d.synchronize_event(&e).unwrap_err()
        } else {
            d.query_event(&e).unwrap_err()
        };
        assert_eq!(err.code, codes::CAPTURED_EVENT);
        let info = d.capture_info(s).unwrap();
        assert_eq!((info.status, info.id), (CaptureStatus::Invalidated, id));
        assert!(info.terminals.is_empty());
        let e2 = d.create_event().unwrap();
        assert_eq!(
            d.record_event(&e2, s).unwrap_err().code,
            codes::STREAM_CAPTURE_INVALIDATED
        );
        assert_eq!(
            d.update_capture_dependencies(s, &[], DependencyUpdate::Add)
                .unwrap_err()
                .code,
            codes::STREAM_CAPTURE_INVALIDATED
        );
        assert_eq!(
            d.end_capture(s).unwrap_err().code,
            codes::STREAM_CAPTURE_INVALIDATED
        );
        // Still illegal after the capture: the event stands for no work.
        assert_eq!(d.query_event(&e).unwrap_err().code, codes::CAPTURED_EVENT);
        // Re-recorded outside capture it is an ordinary event again.
        d.record_event(&e, s).unwrap();
        assert!(d.query_event(&e).unwrap());
        d.destroy_event(e).unwrap();
        d.destroy_event(e2).unwrap();
    }
}

#[test]
fn global_mode_forbids_event_queries_during_capture() {
    let (d, s1, s2, _) = setup();
    let pre = d.create_event().unwrap();
    d.launch(s2).unwrap();
    d.record_event(&pre, s2).unwrap();
    assert!(!d.query_event(&pre).unwrap());
    d.begin_capture(s1).unwrap();
    // Recording, waiting (outside the capture) and creating are fine.
    d.record_event(&pre, s2).unwrap();
    d.stream_wait_event(s2, &pre).unwrap();
    let other = d.create_event().unwrap();
    let e = d.query_event(&pre).unwrap_err();
    assert_eq!(e.code, codes::STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(
        d.capture_info(s1).unwrap().status,
        CaptureStatus::Invalidated
    );
    assert!(d.end_capture(s1).is_err());
    assert!(
        !d.query_event(&pre).unwrap(),
        "fine once no capture is underway"
    );

    // Relaxed mode allows it.
    let r = MockConfig::new(1 << 30)
        .capture_mode(CaptureMode::Relaxed)
        .build();
    let (r1, r2) = (r.create_stream(), r.create_stream());
    let ev = r.create_event().unwrap();
    r.launch(r2).unwrap();
    r.record_event(&ev, r2).unwrap();
    r.begin_capture(r1).unwrap();
    assert!(!r.query_event(&ev).unwrap());
    r.synchronize_event(&ev).unwrap();
    assert_eq!(r.capture_info(r1).unwrap().status, CaptureStatus::Active);
    r.end_capture(r1).unwrap();
    r.destroy_event(ev).unwrap();
    d.destroy_event(pre).unwrap();
    d.destroy_event(other).unwrap();
}

#[test]
fn synchronization_during_capture_invalidates() {
    let (d, s1, s2, _) = setup();
    d.begin_capture(s1).unwrap();
    assert_eq!(
        d.synchronize_device().unwrap_err().code,
        codes::STREAM_CAPTURE_UNSUPPORTED
    );
    assert_eq!(
        d.capture_info(s1).unwrap().status,
        CaptureStatus::Invalidated
    );
    assert!(d.end_capture(s1).is_err());
    d.begin_capture(s1).unwrap();
    d.synchronize_stream(s2).unwrap();
    assert_eq!(
        d.synchronize_stream(s1).unwrap_err().code,
        codes::STREAM_CAPTURE_UNSUPPORTED
    );
    assert_eq!(
        d.capture_info(s1).unwrap().status,
        CaptureStatus::Invalidated
    );
    assert!(d.end_capture(s1).is_err());
    d.synchronize_device().unwrap();
}

#[test]
fn isolation_and_merge_errors() {
    let (d, s1, s2, s3) = setup();
    let outside = d.create_event().unwrap();
    d.launch(s3).unwrap();
    d.record_event(&outside, s3).unwrap();
    d.begin_capture(s1).unwrap();
    assert_eq!(
        d.stream_wait_event(s1, &outside).unwrap_err().code,
        codes::STREAM_CAPTURE_ISOLATION
    );
    assert_eq!(
        d.capture_info(s1).unwrap().status,
        CaptureStatus::Invalidated
    );
    assert!(d.end_capture(s1).is_err());

    d.begin_capture(s1).unwrap();
    d.begin_capture(s2).unwrap();
    let e = d.create_event().unwrap();
    d.record_event(&e, s1).unwrap();
    assert_eq!(
        d.stream_wait_event(s2, &e).unwrap_err().code,
        codes::STREAM_CAPTURE_MERGE
    );
    assert_eq!(
        d.capture_info(s1).unwrap().status,
        CaptureStatus::Invalidated
    );
    assert_eq!(
        d.capture_info(s2).unwrap().status,
        CaptureStatus::Invalidated
    );
    assert!(d.end_capture(s1).is_err());
    assert!(d.end_capture(s2).is_err());
    // Waiting on an event of an ended capture is an error, not a join.
    assert_eq!(
        d.stream_wait_event(s3, &e).unwrap_err().code,
        codes::CAPTURED_EVENT
    );
    // The legacy stream cannot join.
    d.begin_capture(s1).unwrap();
    d.record_event(&e, s1).unwrap();
    assert!(d.stream_wait_event(d.default_stream(), &e).is_err());
    assert!(d.end_capture(s1).is_err());
    d.destroy_event(e).unwrap();
    d.destroy_event(outside).unwrap();
}

#[test]
fn empty_nodes_and_dependency_updates() {
    let (d, s1, s2, _) = setup();
    let no = d.update_capture_dependencies(s1, &[], DependencyUpdate::Set);
    assert_eq!(no.unwrap_err().code, codes::ILLEGAL_STATE);
    assert_eq!(
        d.add_empty_node(s1, &[]).unwrap_err().code,
        codes::ILLEGAL_STATE
    );
    let id = d.begin_capture(s1).unwrap();
    let a = node(d.launch(s1).unwrap());
    let b = node(d.launch(s1).unwrap());
    let marker = d.add_empty_node(s1, &[a, b, a]).unwrap();
    assert_eq!(marker.capture_id(), id);
    assert_eq!(d.node_dependencies(marker).unwrap(), vec![a, b]);
    assert_eq!(d.capture_info(s1).unwrap().terminals, vec![b], "unchanged");
    d.update_capture_dependencies(s1, &[marker], DependencyUpdate::Add)
        .unwrap();
    assert_eq!(d.capture_info(s1).unwrap().terminals, vec![b, marker]);
    d.update_capture_dependencies(s1, &[marker], DependencyUpdate::Set)
        .unwrap();
    assert_eq!(d.capture_info(s1).unwrap().terminals, vec![marker]);
    let c = node(d.launch(s1).unwrap());
    assert_eq!(d.node_dependencies(c).unwrap(), vec![marker]);
    // Foreign or out-of-range nodes are invalid values.
    let bogus = d.add_empty_node(s2, &[]);
    assert_eq!(bogus.unwrap_err().code, codes::ILLEGAL_STATE);
    d.begin_capture(s2).unwrap();
    let e = d.update_capture_dependencies(s2, &[a], DependencyUpdate::Add);
    assert_eq!(e.unwrap_err().code, codes::INVALID_VALUE);
    d.end_capture(s2).unwrap();
    let g = d.end_capture(s1).unwrap();
    assert_eq!(g.kind(marker), Some(NodeKind::Empty));
    assert_eq!(g.stream(marker), None);
    // Nodes stay queryable while the graph lives.
    assert_eq!(d.node_dependencies(c).unwrap(), vec![marker]);
    drop(g);
    assert_eq!(
        d.node_dependencies(c).unwrap_err().code,
        codes::INVALID_VALUE
    );
    let c = d.counters();
    assert_eq!(c.add_empty_node, 3);
    assert_eq!(c.update_capture_dependencies, 4);
    assert_eq!(c.node_dependencies, 4);
    assert_eq!(c.capture_info, 3);
}

#[test]
fn set_drops_nodes_without_unjoined_error() {
    let (d, s1, s2, _) = setup();
    d.begin_capture(s1).unwrap();
    let fork = d.create_event().unwrap();
    d.record_event(&fork, s1).unwrap();
    d.stream_wait_event(s2, &fork).unwrap();
    let side = node(d.launch(s2).unwrap());
    // Marker after the side work becomes s2's only dependency; joining the
    // marker into s1 joins s2.
    let marker = d.add_empty_node(s1, &[side]).unwrap();
    d.update_capture_dependencies(s2, &[marker], DependencyUpdate::Set)
        .unwrap();
    d.update_capture_dependencies(s1, &[marker], DependencyUpdate::Add)
        .unwrap();
    d.launch(s1).unwrap();
    d.end_capture(s1).unwrap();
    d.destroy_event(fork).unwrap();
}

#[test]
fn malloc_and_free_are_allowed_during_capture() {
    let (d, s1, _, _) = setup();
    d.begin_capture(s1).unwrap();
    let p = d.malloc(2 * M).unwrap();
    d.free(p, 2 * M).unwrap();
    d.end_capture(s1).unwrap();
    let c = d.counters();
    assert_eq!((c.malloc_during_capture, c.free_during_capture), (1, 1));
}

#[test]
fn invalidate_capture_for_abandoned_captures() {
    let (d, s1, s2, _) = setup();
    assert_eq!(
        d.invalidate_capture(s1).unwrap_err().code,
        codes::ILLEGAL_STATE
    );
    d.begin_capture(s1).unwrap();
    d.invalidate_capture(s1).unwrap();
    assert_eq!(
        d.capture_info(s1).unwrap().status,
        CaptureStatus::Invalidated
    );
    assert_eq!(
        d.invalidation_reason(s1).as_deref(),
        Some("invalidated by the test")
    );
    assert_eq!(
        d.end_capture(s1).unwrap_err().code,
        codes::STREAM_CAPTURE_INVALIDATED
    );
    assert_eq!(d.begin_capture(s1).unwrap(), 2);
    let _ = s2;
    d.end_capture(s1).unwrap();
}

/// The scenario of PyTorch PR #158352: a block used on a side stream inside
/// the capture, freed and reused on the capture stream.
#[test]
fn race_in_captured_graph() {
    let (d, s1, s2, _) = setup();
    let seg = d.malloc(2 * M).unwrap();
    let id = d.begin_capture(s1).unwrap();
    d.use_memory(s1, seg, 512, 1).unwrap(); // data1 written on s1
    let fork = d.create_event().unwrap();
    d.record_event(&fork, s1).unwrap();
    d.stream_wait_event(s2, &fork).unwrap();
    let read = node(d.use_memory(s2, seg, 512, 1).unwrap()); // read on s2
    assert_eq!(d.race_count(), 0);
    // Reusing data1's bytes on s1 before the join: race in the graph.
    let bad = node(d.use_memory(s1, seg, 512, 2).unwrap());
    let races = d.races();
    assert_eq!(races.len(), 1);
    assert_eq!(races[0].capture_id, Some(id));
    assert_eq!(races[0].earlier.at, Submitted::Node(read));
    assert_eq!(races[0].later.at, Submitted::Node(bad));
    assert_eq!(races[0].earlier.stream, s2);
    // After the join the reuse is ordered.
    let join = d.create_event().unwrap();
    d.record_event(&join, s2).unwrap();
    d.stream_wait_event(s1, &join).unwrap();
    d.use_memory(s1, seg + 4096, 512, 3).unwrap(); // unrelated bytes
    d.use_memory(s1, seg, 512, 4).unwrap();
    assert_eq!(d.race_count(), 1, "only the pre-join reuse");
    let g = d.end_capture(s1).unwrap();
    assert_eq!(g.uses().len(), 5);
    assert_eq!(g.node_uses(read)[0].tag, 1);
    d.destroy_event(fork).unwrap();
    d.destroy_event(join).unwrap();
}

#[test]
fn graph_ordering_through_markers_counts() {
    // Ordering through an empty node and update_capture_dependencies (v1
    // free markers) is a path too.
    let (d, s1, s2, _) = setup();
    let seg = d.malloc(2 * M).unwrap();
    d.begin_capture(s1).unwrap();
    let fork = d.create_event().unwrap();
    d.record_event(&fork, s1).unwrap();
    d.stream_wait_event(s2, &fork).unwrap();
    let side = node(d.use_memory(s2, seg, 1024, 1).unwrap());
    let marker = d.add_empty_node(s2, &[side]).unwrap();
    d.update_capture_dependencies(s1, &[marker], DependencyUpdate::Add)
        .unwrap();
    d.use_memory(s1, seg, 1024, 2).unwrap();
    assert_eq!(d.race_count(), 0);
    d.update_capture_dependencies(s2, &[marker], DependencyUpdate::Set)
        .unwrap();
    d.end_capture(s1).unwrap();
    d.destroy_event(fork).unwrap();
}

#[test]
fn graph_replay_is_checked_against_eager_work() {
    let (d, s1, s2, s3) = setup();
    let seg = d.malloc(2 * M).unwrap();
    d.begin_capture(s1).unwrap();
    d.use_memory(s1, seg, 4096, 1).unwrap();
    d.use_memory(s1, seg, 4096, 2).unwrap();
    let g = d.end_capture(s1).unwrap();
    assert_eq!(d.race_count(), 0);
    let w = d.launch_graph(&g, s2).unwrap();
    assert_eq!(w, Submitted::Work { stream: s2, seq: 1 });
    assert_eq!(d.race_count(), 0, "uses inside one replay are ordered");
    // Another stream touching the graph's memory while the replay runs.
    d.use_memory(s3, seg + 1024, 512, 9).unwrap();
    assert_eq!(d.race_count(), 2, "unordered with both uses of the replay");
    d.complete_all();
    d.launch_graph(&g, s3).unwrap();
    assert_eq!(d.race_count(), 2);
    // Replaying into a capture adds one child-graph node.
    d.begin_capture(s1).unwrap();
    let n = node(d.launch_graph(&g, s1).unwrap());
    let outer = d.end_capture(s1).unwrap();
    assert_eq!(outer.kind(n), Some(NodeKind::ChildGraph));
    assert_eq!(outer.node_uses(n).len(), 2);
    // Replay after the memory was released is a use after free.
    d.free(seg, 2 * M).unwrap();
    assert_eq!(
        d.launch_graph(&g, s2).unwrap_err().code,
        codes::INVALID_DEVICE_POINTER
    );
}

#[test]
fn four_stream_partial_joins() {
    // test_graph_capture_reclaim_4_streams: uses on s2, s3, s4; joining
    // s2 into s1 orders only s2's use.
    let d = MockBackend::new(1 << 30);
    let s: Vec<MockStream> = (0..4).map(|_| d.create_stream()).collect();
    let seg = d.malloc(2 * M).unwrap();
    d.begin_capture(s[0]).unwrap();
    d.use_memory(s[0], seg, 512, 1).unwrap();
    let ev: Vec<_> = (0..6).map(|_| d.create_event().unwrap()).collect();
    d.record_event(&ev[0], s[0]).unwrap();
    for &side in &s[1..] {
        d.stream_wait_event(side, &ev[0]).unwrap();
        d.use_memory(side, seg, 512, 1).unwrap();
    }
    // join s1 <- s2, s3 <- s4
    d.record_event(&ev[1], s[1]).unwrap();
    d.stream_wait_event(s[0], &ev[1]).unwrap();
    d.record_event(&ev[2], s[3]).unwrap();
    d.stream_wait_event(s[2], &ev[2]).unwrap();
    d.launch(s[2]).unwrap();
    let n = d.capture_node_count(s[0]).unwrap();
    d.use_memory(s[0], seg, 512, 2).unwrap();
    assert_eq!(d.race_count(), 2, "s3 and s4 uses are not ordered");
    d.clear_races();
    // Undo by joining s3 (which holds s4) and using again.
    d.record_event(&ev[3], s[2]).unwrap();
    d.stream_wait_event(s[0], &ev[3]).unwrap();
    d.use_memory(s[0], seg + 512, 512, 3).unwrap();
    d.use_memory(s[0], seg, 512, 4).unwrap();
    assert_eq!(d.race_count(), 0);
    assert!(d.capture_node_count(s[0]).unwrap() > n);
    d.end_capture(s[0]).unwrap();
    for e in ev {
        d.destroy_event(e).unwrap();
    }
}

/// `query_stream` answers "completed ≥ submitted", and is prohibited
/// during capture as CUDA's `cuStreamQuery`: on the capturing stream (the
/// capture is invalidated) and, in the global capture mode, on any stream
/// while a capture is underway.
#[test]
fn stream_queries_are_idle_checks_and_prohibited_during_capture() {
    let (d, s1, s2, _) = setup();
    assert_eq!(d.query_stream(s2).unwrap(), Some(true), "no work yet");
    d.launch(s2).unwrap();
    assert_eq!(d.query_stream(s2).unwrap(), Some(false), "work pending");
    assert_eq!(d.query_stream(s1).unwrap(), Some(true), "another stream");
    d.complete(s2).unwrap();
    assert_eq!(d.query_stream(s2).unwrap(), Some(true));
    // global mode (the default): any stream, while a capture is underway
    d.begin_capture(s1).unwrap();
    query_refused(&d, s2, s1);
    assert_eq!(d.query_stream(s2).unwrap(), Some(true), "fine after it");
    // relaxed mode: the capturing stream itself only
    let r = MockConfig::new(1 << 30)
        .capture_mode(CaptureMode::Relaxed)
        .build();
    let (a, b) = (r.create_stream(), r.create_stream());
    r.begin_capture(a).unwrap();
    assert_eq!(r.query_stream(b).unwrap(), Some(true));
    query_refused(&r, a, a);
}

/// Querying `queried` while `capturing` captures is refused as CUDA refuses
/// it, and the capture is invalidated: it cannot end.
fn query_refused(d: &MockBackend, queried: MockStream, capturing: MockStream) {
    let e = d.query_stream(queried).unwrap_err();
    assert_eq!(e.code, codes::STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(
        d.capture_info(capturing).unwrap().status,
        CaptureStatus::Invalidated
    );
    assert!(d.end_capture(capturing).is_err());
}
