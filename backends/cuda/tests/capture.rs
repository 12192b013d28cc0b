//! Stream capture introspection on a real device, in thread-local capture
//! mode (each test captures its own streams; own process so that no other
//! test binary's driver calls race a capture).

mod common;

use cachalot_core::{Backend, CaptureStatus, DependencyUpdate};
use cachalot_core::{CaptureQuery as _, GraphCapture as _};
use cachalot_cuda::{CaptureMode, CudaBackend, GraphNodeKind};
use common::{backend_or_skip, read_back, skip};

const MIB: u64 = 1 << 20;

fn capture_backend(test: &str) -> Option<CudaBackend> {
    let b = backend_or_skip(test)?;
    if b.capture().is_none() {
        skip(format_args!(
            "{test}: driver {} has no capture API",
            b.driver_version()
        ));
        return None;
    }
    Some(b)
}

#[test]
fn terminals_collapse_and_parents() {
    let Some(b) = capture_backend("terminals_collapse_and_parents") else {
        return;
    };
    let s = b.create_stream().expect("stream");
    let x = b.malloc(MIB).expect("x");
    b.begin_capture(*s, CaptureMode::ThreadLocal)
        .expect("begin");
    let info = b.capture_info(*s).expect("info");
    assert_eq!(info.status, CaptureStatus::Active);
    assert_ne!(info.id, 0);
    assert!(info.terminals.is_empty(), "{info:?}");

    b.memset_d8_async(x, 1, MIB, *s).expect("n1");
    let n1 = b.capture_info(*s).expect("info").terminals;
    assert_eq!(n1.len(), 1);
    assert!(b.node_dependencies(n1[0]).expect("deps of n1").is_empty());
    b.memset_d8_async(x, 2, MIB, *s).expect("n2");
    let n2 = b.capture_info(*s).expect("info").terminals;
    assert_eq!(n2.len(), 1);
    assert_ne!(n1, n2);
    assert_eq!(b.node_dependencies(n2[0]).expect("deps of n2"), n1);
    // An event record adds no node.
    let ev = b.create_event().expect("event");
    b.record_event(&ev, *s).expect("record");
    assert_eq!(b.capture_info(*s).expect("info").terminals, n2);

    let graph = b.end_capture(*s).expect("end");
    b.destroy_event(ev).expect("destroy");
    assert_eq!(
        b.capture_info(*s).expect("info").status,
        CaptureStatus::None
    );
    assert_eq!(graph.nodes().expect("nodes").len(), 2);
    let exec = graph.instantiate().expect("instantiate");
    exec.launch(*s).expect("launch");
    b.stream_synchronize(*s).expect("sync");
    assert!(read_back(&b, x, MIB as usize).iter().all(|&v| v == 2));
    drop(exec);
    drop(graph);
    b.free(x, MIB).expect("free");
}

#[test]
fn fork_join_markers_and_replay() {
    let Some(b) = capture_backend("fork_join_markers_and_replay") else {
        return;
    };
    let main = b.create_stream().expect("main");
    let side = b.create_stream().expect("side");
    let x = b.malloc(MIB).expect("x");
    let y = b.malloc(MIB).expect("y");
    b.memset_d8_async(x, 0, MIB, *main).expect("clear x");
    b.memset_d8_async(y, 0, MIB, *main).expect("clear y");
    b.stream_synchronize(*main).expect("sync");

    b.begin_capture(*main, CaptureMode::ThreadLocal)
        .expect("begin");
    let id = b.capture_info(*main).expect("info").id;
    b.memset_d8_async(x, 1, MIB, *main).expect("n1");
    let n1 = b.capture_info(*main).expect("info").terminals;
    b.memset_d8_async(x, 2, MIB, *main).expect("n2");
    let n2 = b.capture_info(*main).expect("info").terminals;

    // Allocation while capturing is legal (relaxed capture mode inside malloc).
    let z = b.malloc(MIB).expect("malloc during capture");

    // Fork: side joins the capture and writes y; join back into main.
    b.wait_stream(*side, *main).expect("fork");
    let side_info = b.capture_info(*side).expect("side info");
    assert_eq!(side_info.status, CaptureStatus::Active);
    assert_eq!(side_info.id, id);
    assert_eq!(side_info.terminals, n2, "wait_stream adds main's terminals");
    b.memset_d8_async(y, 3, MIB, *side).expect("side memset");
    let side_terms = b.capture_info(*side).expect("side info").terminals;
    assert_eq!(side_terms.len(), 1);
    b.memset_d8_async(x, 4, MIB, *main).expect("n3");
    b.wait_stream(*main, *side).expect("join");
    let joined = b.capture_info(*main).expect("info").terminals;
    println!("joined terminals: {joined:?}");
    assert_eq!(joined.len(), 2, "{joined:?}");
    assert!(joined.contains(&side_terms[0]));

    // Free marker: an empty node after the joined terminals, made the sole dependency.
    let marker = b.add_empty_node(*main, &joined).expect("empty node");
    let mut deps = b.node_dependencies(marker).expect("marker deps");
    let mut want = joined.clone();
    deps.sort();
    want.sort();
    assert_eq!(deps, want);
    b.update_capture_dependencies(*main, &[marker], DependencyUpdate::Set)
        .expect("set deps");
    assert_eq!(b.capture_info(*main).expect("info").terminals, vec![marker]);
    b.update_capture_dependencies(*main, &n1, DependencyUpdate::Add)
        .expect("add deps");
    let t = b.capture_info(*main).expect("info").terminals;
    println!("after add: {t:?}");
    assert!(t.contains(&marker) && t.contains(&n1[0]), "{t:?}");
    b.memcpy_dtod_async(z, x, MIB, *main).expect("copy into z");

    let graph = b.end_capture(*main).expect("end");
    let kinds = graph.node_kinds().expect("kinds");
    println!("captured nodes: {kinds:?}");
    assert_eq!(graph.count_nodes(GraphNodeKind::Memset).expect("count"), 4);
    assert_eq!(graph.count_nodes(GraphNodeKind::Empty).expect("count"), 1);
    assert_eq!(graph.count_nodes(GraphNodeKind::Memcpy).expect("count"), 1);
    assert_eq!(
        graph.count_nodes(GraphNodeKind::MemAlloc).expect("count"),
        0
    );

    let exec = graph.instantiate().expect("instantiate");
    exec.launch(*main).expect("launch");
    b.stream_synchronize(*main).expect("sync");
    assert!(read_back(&b, x, MIB as usize).iter().all(|&v| v == 4));
    assert!(read_back(&b, y, MIB as usize).iter().all(|&v| v == 3));
    assert!(read_back(&b, z, MIB as usize).iter().all(|&v| v == 4));
    drop(exec);
    drop(graph);
    for p in [x, y, z] {
        b.free(p, MIB).expect("free");
    }
}

#[test]
fn calls_outside_capture_are_errors() {
    let Some(b) = capture_backend("calls_outside_capture_are_errors") else {
        return;
    };
    let s = b.create_stream().expect("stream");
    let err = b
        .update_capture_dependencies(*s, &[], DependencyUpdate::Set)
        .expect_err("not capturing");
    println!("outside capture: {err}");
    let err = b.add_empty_node(*s, &[]).expect_err("not capturing");
    println!("outside capture: {err}");
    assert!(b.end_capture(*s).is_err());
}
