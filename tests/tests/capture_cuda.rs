//! The scenario of `anchor/graph_reuse.py` (PyTorch PR #158352) on a real
//! GPU: in one captured graph, 16 times, a 64 MiB block is allocated and
//! written on the capture stream, copied from on a side stream, recorded
//! there with `record_stream`, freed, and the side stream joined back.
//! With reuse on, the private pool holds one block (≤ 66 MiB; PyTorch 2.11:
//! 66 MiB); with it off, all sixteen (PyTorch: 1026 MiB). The graph holds no
//! memory nodes and its replay copies the right values.
#![cfg(feature = "cuda")]

use cachalot_conformance::Harness;
use cachalot_conformance::cuda::CudaHarness;
use cachalot_core::{Backend, PoolFilter, graph_pool_handle};
use cachalot_cuda::{CaptureMode, GraphNodeKind};

const MIB: u64 = 1 << 20;
const K: u64 = 16;
const BLOCK: u64 = 64 * MIB;
/// Bytes of each block copied into the output by the side stream.
const CHUNK: u64 = MIB;

/// Runs the scenario with `config`; returns the private pool's reserved
/// bytes at the end of the capture.
fn graph_reuse(h: &CudaHarness, config: &str) -> u64 {
    let a = h.allocator(config);
    let b = a.backend();
    let s0 = h.new_stream(b);
    let s1 = h.new_stream(b);
    let (c0, c1) = (h.handle(&s0), h.handle(&s1));
    let out = a.allocate(K * CHUNK, c0).expect("output buffer");
    b.memset_d8_async(out, 0, K * CHUNK, c0)
        .expect("clear output");
    b.stream_synchronize(c0).expect("sync");
    let base = a.stats().reserved_bytes.all().current as u64;

    let pool = graph_pool_handle();
    a.begin_allocate_to_pool(pool, PoolFilter::CaptureOf(c0))
        .expect("begin_allocate_to_pool");
    b.begin_capture(c0, CaptureMode::Global)
        .expect("begin capture");
    for i in 0..K {
        let x = a.allocate(BLOCK, c0).expect("allocate in capture");
        b.memset_d8_async(x, (i + 1) as u8, BLOCK, c0)
            .expect("write on the capture stream");
        b.wait_stream(c1, c0).expect("fork");
        b.memcpy_dtod_async(out + i * CHUNK, x, CHUNK, c1)
            .expect("copy on the side stream");
        a.record_stream(x, c1).expect("record_stream");
        a.free(x).expect("free in capture");
        b.wait_stream(c0, c1).expect("join");
    }
    let graph = b.end_capture(c0).expect("end capture");
    a.end_allocate_to_pool(pool).expect("end_allocate_to_pool");
    a.check_invariants().expect("invariants");
    let pool_bytes = a.stats().reserved_bytes.all().current as u64 - base;

    assert_eq!(
        graph.count_nodes(GraphNodeKind::MemAlloc).expect("count"),
        0
    );
    assert_eq!(graph.count_nodes(GraphNodeKind::MemFree).expect("count"), 0);
    let exec = graph.instantiate().expect("instantiate");
    exec.launch(c0).expect("replay");
    b.stream_synchronize(c0).expect("sync");
    let mut host = vec![0u8; (K * CHUNK) as usize];
    b.memcpy_dtoh(&mut host, out).expect("read back");
    for i in 0..K as usize {
        let chunk = &host[i * CHUNK as usize..(i + 1) * CHUNK as usize];
        assert!(
            chunk.iter().all(|&v| v == (i + 1) as u8),
            "{config}: block {i} replayed wrong values"
        );
    }
    drop(exec);
    drop(graph);
    a.free(out).expect("free output");
    a.release_pool(pool).expect("release_pool");
    a.empty_cache().expect("empty_cache");
    a.check_invariants().expect("invariants");
    println!(
        "graph_reuse {config}: private pool {} MiB, replay correct, no memory nodes",
        pool_bytes / MIB
    );
    pool_bytes
}

#[test]
fn graph_reuse_h200() {
    let h = match CudaHarness::open() {
        Ok(h) => h,
        Err(reason) => {
            cachalot_conformance::skip(reason);
            return;
        }
    };
    if h.backend().capture().is_none() {
        cachalot_conformance::skip("the driver has no capture API");
        return;
    }
    let off = graph_reuse(&h, "graph_capture_record_stream_reuse:False");
    let pytorch = graph_reuse(&h, "graph_capture_record_stream_reuse:pytorch");
    let cross = graph_reuse(&h, "graph_capture_record_stream_reuse:True");
    assert!(off >= K * BLOCK, "off: {} MiB", off / MIB);
    assert!(off <= K * BLOCK + 2 * MIB, "off: {} MiB", off / MIB);
    assert!(pytorch <= 66 * MIB, "pytorch: {} MiB", pytorch / MIB);
    assert!(cross <= 66 * MIB, "cross_stream: {} MiB", cross / MIB);
}
