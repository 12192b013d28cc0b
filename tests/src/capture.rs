//! Helpers for the graph-capture tests on the mock: a capture harness with
//! fork/join, reads and writes that the race checker sees, and random
//! multi-stream capture programs.

use cachalot_core::{AllocatorConfig, Backend, CachingAllocator, PoolFilter, PoolId};
use cachalot_mock::{MockBackend, MockConfig, MockGraph, MockStream};

use crate::mock::H200_BYTES;

/// A simulated H200 (work completes at once, race checker on, global
/// capture mode) and an allocator over it.
pub struct Cap {
    /// The mock.
    pub m: MockBackend,
    /// The allocator under test.
    pub a: CachingAllocator<MockBackend>,
}

impl Cap {
    /// A fresh device and allocator with `config`.
    pub fn new(config: &str) -> Self {
        let m = MockConfig::new(H200_BYTES).auto_complete(true).build();
        let a = CachingAllocator::with_config(
            m.clone(),
            AllocatorConfig::parse(config).expect("config"),
        )
        .expect("allocator");
        Self { m, a }
    }

    /// A new stream.
    pub fn stream(&self) -> MockStream {
        self.m.create_stream()
    }

    /// Panics if an invariant is broken or the race checker found a race.
    pub fn check(&self) {
        if let Err(e) = self.a.check_invariants() {
            panic!("invariant violated: {e}");
        }
        let races = self.m.races();
        assert!(races.is_empty(), "races: {}", races[0]);
    }

    /// `waiter.wait_stream(other)` through an event.
    pub fn wait(&self, waiter: MockStream, other: MockStream) {
        let e = self.m.create_event().expect("event");
        self.m.record_event(&e, other).expect("record");
        self.m.stream_wait_event(waiter, &e).expect("wait");
        self.m.destroy_event(e).expect("destroy");
    }

    /// Allocates `size` on `s` and writes it there (tag `tag`).
    pub fn alloc(&self, size: u64, s: MockStream, tag: u64) -> u64 {
        let p = self.a.allocate(size, s).expect("allocate");
        self.m.use_memory(s, p, size, tag).expect("write");
        self.check();
        p
    }

    /// Uses `p` (tag `tag`, `size` bytes) on `s` and records it there.
    pub fn use_on(&self, p: u64, size: u64, s: MockStream, tag: u64) {
        self.m.use_memory(s, p, size, tag).expect("use");
        self.a.record_stream(p, s).expect("record_stream");
        self.check();
    }

    /// One kernel on `s` touching no tracked memory (a "sink" op).
    pub fn op(&self, s: MockStream) {
        self.m.launch(s).expect("launch");
    }

    /// Frees `p`.
    pub fn free(&self, p: u64) {
        self.a.free(p).expect("free");
        self.check();
    }

    /// Registers `pool` for the capture `origin` begins, then begins it.
    pub fn begin(&self, pool: PoolId, origin: MockStream) {
        self.a
            .begin_allocate_to_pool(pool, PoolFilter::CaptureOf(origin))
            .expect("begin_allocate_to_pool");
        self.m.begin_capture(origin).expect("begin_capture");
    }

    /// Ends the capture and the pool's routing.
    pub fn end(&self, pool: PoolId, origin: MockStream) -> MockGraph {
        let g = self.m.end_capture(origin).expect("end_capture");
        self.a
            .end_allocate_to_pool(pool)
            .expect("end_allocate_to_pool");
        self.check();
        g
    }
}

/// One operation of a random capture program (streams are indices, 0 is
/// the capture stream; ids name allocations in order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `bytes` on `stream` and write it there.
    Alloc {
        /// Stream index.
        stream: usize,
        /// Bytes.
        bytes: u64,
    },
    /// Use live allocation number `pick % live` on `stream` (another
    /// stream than its own) and record it there; a wait for the allocation
    /// stream comes first when `stream` is not yet ordered after the write.
    Use {
        /// Which live allocation.
        pick: usize,
        /// Stream index (moved off the allocation's own stream).
        stream: usize,
    },
    /// Free live allocation number `pick % live`.
    Free {
        /// Which live allocation.
        pick: usize,
    },
    /// `waiter.wait_stream(other)`.
    Wait {
        /// Stream index.
        waiter: usize,
        /// Stream index.
        other: usize,
    },
}

/// Runs `ops` captured on `nstreams` streams of a fresh device with
/// `config`; checks invariants and races after every operation, ends the
/// capture (joining every stream back), frees what is left and releases
/// the pool. Returns the capture's peak reserved bytes.
pub fn run_program(config: &str, nstreams: usize, ops: &[Op]) -> u64 {
    let c = Cap::new(config);
    let streams: Vec<MockStream> = (0..nstreams).map(|_| c.stream()).collect();
    let pool = cachalot_core::graph_pool_handle();
    c.begin(pool, streams[0]);
    for &s in &streams[1..] {
        c.wait(s, streams[0]);
    }
    let n = nstreams;
    let mut clocks = vec![vec![0u64; n]; n];
    // live: (addr, bytes, tag, stream, write clock)
    let mut live: Vec<(u64, u64, u64, usize, u64)> = Vec::new();
    let mut tag = 0u64;
    let join = |clocks: &mut Vec<Vec<u64>>, a: usize, b: usize| {
        let cb = clocks[b].clone();
        for (u, v) in clocks[a].iter_mut().zip(cb) {
            *u = (*u).max(v);
        }
    };
    for op in ops {
        match *op {
            Op::Alloc { stream, bytes } => {
                let s = stream % n;
                tag += 1;
                let p = c.alloc(bytes, streams[s], tag);
                clocks[s][s] += 1;
                live.push((p, bytes, tag, s, clocks[s][s]));
            }
            Op::Use { pick, stream } => {
                if live.is_empty() {
                    continue;
                }
                let (p, bytes, t, own, wc) = live[pick % live.len()];
                let mut s = stream % (n - 1);
                if s >= own {
                    s += 1;
                }
                if clocks[s][own] < wc {
                    c.wait(streams[s], streams[own]);
                    join(&mut clocks, s, own);
                }
                c.use_on(p, bytes, streams[s], t);
                clocks[s][s] += 1;
            }
            Op::Free { pick } => {
                if live.is_empty() {
                    continue;
                }
                let (p, ..) = live.swap_remove(pick % live.len());
                c.free(p);
            }
            Op::Wait { waiter, other } => {
                let (a, b) = (waiter % n, other % n);
                if a != b {
                    c.wait(streams[a], streams[b]);
                    join(&mut clocks, a, b);
                }
            }
        }
    }
    for &s in &streams[1..] {
        c.wait(streams[0], s);
    }
    let g = c.end(pool, streams[0]);
    let peak = c.a.stats().reserved_bytes.all().peak as u64;
    for (p, ..) in live {
        c.free(p);
    }
    drop(g);
    c.a.release_pool(pool).expect("release_pool");
    c.a.empty_cache().expect("empty_cache");
    c.check();
    peak
}
