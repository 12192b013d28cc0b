//! A global-mode capture (PyTorch's default) with allocator calls inside it:
//! `malloc` and `memory_info` must work thanks to the relaxed-mode guard and
//! leave no memory node in the graph. Its own process: a global capture
//! forbids unsafe calls in every thread.

mod common;

use cachalot_core::CaptureQuery as _;
use cachalot_core::{Backend, CaptureStatus};
use cachalot_cuda::{CaptureMode, GraphNodeKind};
use common::{backend_or_skip, read_back, skip};

const MIB: u64 = 1 << 20;

#[test]
fn malloc_during_global_capture() {
    let Some(b) = backend_or_skip("malloc_during_global_capture") else {
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
    b.begin_capture(*s, CaptureMode::Global).expect("begin");
    let p = b.malloc(8 * MIB).expect("malloc during global capture");
    let info = b.memory_info().expect("memory_info during global capture");
    assert!(info.free > 0);
    b.memset_d8_async(p, 9, 8 * MIB, *s).expect("memset");
    assert_eq!(
        b.capture_info(*s).expect("info").status,
        CaptureStatus::Active
    );
    let graph = b.end_capture(*s).expect("end");
    assert_eq!(
        graph.count_nodes(GraphNodeKind::MemAlloc).expect("count"),
        0
    );
    assert_eq!(graph.count_nodes(GraphNodeKind::MemFree).expect("count"), 0);
    assert_eq!(graph.count_nodes(GraphNodeKind::Memset).expect("count"), 1);
    let exec = graph.instantiate().expect("instantiate");
    for _ in 0..3 {
        exec.launch(*s).expect("launch");
    }
    b.stream_synchronize(*s).expect("sync");
    assert!(read_back(&b, p, 4096).iter().all(|&v| v == 9));
    drop(exec);
    drop(graph);
    b.free(p, 8 * MIB).expect("free after the graph is gone");
}
