//! The engine fuzz harness: random operation sequences on
//! `CachingAllocator<MockBackend>` decoded from the fuzzer's bytes.
//!
//! Operations: allocations of arbitrary sizes on four streams (the default
//! one and three more), frees, frees of bad pointers, `record_stream`, uses,
//! stream waits, launches and (partial) completion of work on the mock,
//! `empty_cache`, `set_config` with arbitrary strings (from a dictionary of
//! keys and values, or raw), memory fractions, injected device failures,
//! stats and snapshots, and graph capture into private pools (begin, fork
//! streams into it, end, launch the graph, drop it). After every operation
//! the engine's invariants hold and the mock's race checker has found no
//! race: the harness only ever uses memory correctly (a use of a block on
//! a stream is ordered after its allocation, and comes before its free).
//! At the end, with everything freed and released, no memory, segment or
//! event is left.
//!
//! The libFuzzer target `engine` (`fuzz/`) and the regression test
//! `fuzz_regressions_engine` (`tests/tests/fuzz_regressions.rs`) both call
//! [`engine`]. The private-pool features (named pools and their options,
//! checkpoints, interprocess sharing, segment trackers) have a harness of
//! their own, [`pools()`] (target `pools`), which shares the helpers below.

mod device;
pub mod pools;

pub use pools::pools;

use self::device::{
    allocated, assert_all_released, capacity, check_device, free_live, inject_failure, run_ops,
    wait_event, write_new,
};

use arbitrary::{Arbitrary, Unstructured};
use cachalot_core::{
    AllocatorConfig, Backend, CachingAllocator, Error, PoolFilter, PoolId, graph_pool_handle,
};
use cachalot_mock::{MockBackend, MockConfig, MockGraph, MockStream};

use crate::mock::MIB;

/// Streams of the program: the default stream and three more.
const STREAMS: usize = 4;
/// Most operations one input runs.
const MAX_OPS: usize = 512;

/// Config keys a generated config string draws from.
const KEYS: &[&str] = &[
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "large_segment_size_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "graph_capture_record_stream_reuse",
    "per_process_memory_fraction",
    "throw_on_cudamalloc_oom",
    "idle_stream_reuse",
    "placement",
    "pinned_num_register_threads",
    "backend",
];
/// Values a generated config string draws from.
const VALUES: &[&str] = &[
    "True",
    "False",
    "0",
    "1",
    "2",
    "4",
    "12",
    "20",
    "21",
    "40",
    "64",
    "1024",
    "0.5",
    "0.01",
    "0.99",
    "1.0",
    "pytorch",
    "steady",
    "cross_stream",
    "native",
    "[1:2,>:8]",
    "[256:1,>:4]",
    "18446744073709551615",
    "-1",
    "nan",
    "",
];

/// A requested size class.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Size {
    /// 0 bytes.
    Zero,
    /// Below 64 KiB (the small pool).
    Small(u16),
    /// Below 32 MiB.
    Medium(u32),
    /// Up to 512 MiB (large segments, oversize blocks, OOM near capacity).
    Large(u32),
    /// Any `u64` (never fits, overflow paths).
    Any(u64),
}

impl Size {
    /// The bytes requested.
    pub(crate) fn bytes(self) -> u64 {
        match self {
            Size::Zero => 0,
            Size::Small(n) => u64::from(n),
            Size::Medium(n) => u64::from(n) % (32 * MIB),
            Size::Large(n) => u64::from(n) % (512 * MIB),
            Size::Any(n) => n,
        }
    }
}

/// One config string: dictionary pairs, or raw text.
#[derive(Arbitrary, Debug, Clone)]
pub enum ConfigString {
    /// `key:value` pairs joined with commas.
    Pairs(Vec<(u8, u8)>),
    /// Any text.
    Raw(String),
}

impl ConfigString {
    fn text(&self) -> String {
        match self {
            ConfigString::Pairs(p) => p
                .iter()
                .take(8)
                .map(|&(k, v)| {
                    format!(
                        "{}:{}",
                        KEYS[k as usize % KEYS.len()],
                        VALUES[v as usize % VALUES.len()]
                    )
                })
                .collect::<Vec<_>>()
                .join(","),
            ConfigString::Raw(s) => s.clone(),
        }
    }
}

/// One operation. Indices are taken modulo what exists; an operation that
/// does not apply in the current state (e.g. a free with nothing live) is
/// skipped.
#[derive(Arbitrary, Debug, Clone)]
pub enum Op {
    /// Allocate and write the block on its stream.
    Alloc {
        /// Size.
        size: Size,
        /// Stream index.
        stream: u8,
    },
    /// Free a live allocation.
    Free {
        /// Which live allocation.
        pick: u16,
    },
    /// Free a pointer that is not a live allocation (a freed one, plus an
    /// offset), and one that was never handed out.
    FreeBad {
        /// Which freed pointer.
        pick: u16,
        /// Offset in 512-byte units.
        offset: u8,
    },
    /// Free an interior pointer of a live allocation.
    FreeInterior {
        /// Which live allocation.
        pick: u16,
        /// Offset in 512-byte units (at least 1).
        offset: u8,
    },
    /// `other.wait_stream(alloc stream); record_stream(other)`.
    RecordStream {
        /// Which live allocation.
        pick: u16,
        /// Stream index.
        stream: u8,
    },
    /// A kernel using the allocation on one of its streams.
    Use {
        /// Which live allocation.
        pick: u16,
        /// Which of its streams.
        which: u8,
    },
    /// `waiter.wait_stream(other)`.
    Wait {
        /// Stream index.
        waiter: u8,
        /// Stream index.
        other: u8,
    },
    /// A kernel touching no tracked memory.
    Launch {
        /// Stream index.
        stream: u8,
    },
    /// Complete the next `n` units of work of a stream (0: all of them).
    Complete {
        /// Stream index.
        stream: u8,
        /// Units.
        n: u8,
    },
    /// Complete all work.
    CompleteAll,
    /// `empty_cache`.
    EmptyCache,
    /// `set_config`.
    SetConfig(ConfigString),
    /// `set_memory_fraction` (`f / 255`).
    Fraction(u8),
    /// The `at`-th next device allocation fails.
    InjectFailure {
        /// A backend error rather than out-of-memory.
        backend_error: bool,
        /// Which allocation from now (1 = the next).
        at: u8,
    },
    /// Stats, snapshot, largest free block, live allocations.
    Inspect,
    /// Begin a capture on a non-default stream into a new private pool.
    BeginCapture {
        /// Stream index (the default stream is never captured).
        stream: u8,
    },
    /// End the capture (joining every forked stream back first).
    EndCapture,
    /// Launch a captured graph on its origin stream.
    LaunchGraph {
        /// Which graph.
        pick: u8,
    },
    /// Destroy a graph and release its pool.
    DropGraph {
        /// Which graph.
        pick: u8,
    },
}

/// A live allocation of the program.
struct Live {
    addr: u64,
    size: u64,
    tag: u64,
    /// Streams it may be used on (its allocation stream first).
    streams: Vec<usize>,
    /// The capture it was allocated in (index into `captures`).
    capture: Option<usize>,
}

/// A capture, underway or ended.
struct Capture {
    origin: usize,
    pool: PoolId,
    /// Streams capturing into it (the origin first) while it is underway.
    members: Vec<usize>,
    active: bool,
}

struct World {
    m: MockBackend,
    a: CachingAllocator<MockBackend>,
    streams: [MockStream; STREAMS],
    live: Vec<Live>,
    freed: Vec<u64>,
    captures: Vec<Capture>,
    /// (graph, capture index)
    graphs: Vec<(MockGraph, usize)>,
    next_tag: u64,
}

impl World {
    fn active(&self) -> Option<usize> {
        self.captures.iter().rposition(|c| c.active)
    }

    /// Whether stream `s` is capturing now.
    fn capturing(&self, s: usize) -> bool {
        self.active()
            .is_some_and(|c| self.captures[c].members.contains(&s))
    }

    /// `waiter.wait_stream(other)` through an event; a non-capturing waiter
    /// of a capturing stream forks into its capture.
    fn wait(&mut self, waiter: usize, other: usize) {
        wait_event(&self.m, self.streams[waiter], self.streams[other]);
        if self.capturing(other) && !self.capturing(waiter) {
            let c = self.active().expect("a capture is active");
            self.captures[c].members.push(waiter);
        }
    }

    /// Whether `waiter.wait_stream(other)` keeps the program valid: a
    /// capturing stream may not wait on uncaptured work.
    fn may_wait(&self, waiter: usize, other: usize) -> bool {
        waiter != other
            // a capturing stream may not wait on uncaptured work
            && (!self.capturing(waiter) || self.capturing(other))
            // the legacy default stream cannot join a capture
            && !(waiter == 0 && self.capturing(other))
    }

    /// The streams live allocation `i` may be used on now.
    fn usable_streams(&self, i: usize) -> Vec<usize> {
        let l = &self.live[i];
        match l.capture {
            // A block of the default pools is used outside capture only (a
            // use in a capture would make it a graph input, which the
            // program would have to keep alive as long as the graph).
            None => l
                .streams
                .iter()
                .copied()
                .filter(|&s| !self.capturing(s))
                .collect(),
            // In its own capture: on its streams, all of them capturing.
            Some(c) if self.captures[c].active => l.streams.clone(),
            // After its capture: on the origin only (where its graph runs),
            // outside any capture.
            Some(c) => {
                let o = self.captures[c].origin;
                if self.capturing(o) { vec![] } else { vec![o] }
            }
        }
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Alloc { size, stream } => {
                let si = *stream as usize % STREAMS;
                let size = size.bytes();
                let r = self.a.allocate(size, self.streams[si]);
                if let Some(addr) = allocated(r, size) {
                    let tag = write_new(&self.m, self.streams[si], addr, size, &mut self.next_tag);
                    let capture = self.active().filter(|_| self.capturing(si));
                    self.live.push(Live {
                        addr,
                        size,
                        tag,
                        streams: vec![si],
                        capture,
                    });
                }
            }
            Op::Free { pick } => {
                if self.live.is_empty() {
                    return;
                }
                let l = self.live.swap_remove(*pick as usize % self.live.len());
                free_live(&self.a, l.addr);
                self.freed.push(l.addr);
                if self.freed.len() > 64 {
                    self.freed.remove(0);
                }
            }
            Op::FreeBad { pick, offset } => {
                let offset = u64::from(*offset) * 512;
                if let Some(&p) = self.freed.get(*pick as usize % self.freed.len().max(1)) {
                    let bad = p + offset;
                    if !self.live.iter().any(|l| l.addr == bad) {
                        let e = self.a.free(bad).expect_err("free of a pointer not live");
                        let interior_of_live = matches!(e, Error::InteriorPointer { block, .. }
                            if self.live.iter().any(|l| l.addr == block));
                        assert!(
                            interior_of_live
                                || matches!(
                                    e,
                                    Error::DoubleFree(_)
                                        | Error::UnknownPointer(_)
                                        | Error::NotLive(_)
                                ),
                            "free of {bad:#x}: {e}"
                        );
                    }
                }
                let e = self
                    .a
                    .free(0x10_0000_0000_0000 + offset)
                    .expect_err("free of a pointer never handed out");
                assert!(matches!(e, Error::UnknownPointer(_)), "{e}");
            }
            Op::FreeInterior { pick, offset } => {
                if self.live.is_empty() {
                    return;
                }
                let l = &self.live[*pick as usize % self.live.len()];
                let off = (u64::from(*offset) + 1) * 512;
                if off < l.size {
                    let e = self.a.free(l.addr + off).expect_err("interior free");
                    assert!(
                        matches!(e, Error::InteriorPointer { block, .. } if block == l.addr),
                        "interior free at {:#x}+{off}: {e}",
                        l.addr
                    );
                }
            }
            Op::RecordStream { pick, stream } => {
                if self.live.is_empty() {
                    return;
                }
                let i = *pick as usize % self.live.len();
                let t = *stream as usize % STREAMS;
                let own = self.live[i].streams[0];
                let ok = match self.live[i].capture {
                    None => !self.capturing(t) && !self.capturing(own),
                    // onto a member, or fork a new stream into the capture
                    Some(c) => self.captures[c].active,
                };
                if !ok || !self.may_wait(t, own) {
                    return;
                }
                self.wait(t, own);
                let l = &mut self.live[i];
                self.a
                    .record_stream(l.addr, self.streams[t])
                    .unwrap_or_else(|e| panic!("record_stream of live {:#x}: {e}", l.addr));
                if !l.streams.contains(&t) {
                    l.streams.push(t);
                }
            }
            Op::Use { pick, which } => {
                if self.live.is_empty() {
                    return;
                }
                let i = *pick as usize % self.live.len();
                let usable = self.usable_streams(i);
                if usable.is_empty() {
                    return;
                }
                let s = usable[*which as usize % usable.len()];
                let l = &self.live[i];
                self.m
                    .use_memory(self.streams[s], l.addr, l.size, l.tag)
                    .expect("a live block lies in a live segment");
            }
            Op::Wait { waiter, other } => {
                let (w, o) = (*waiter as usize % STREAMS, *other as usize % STREAMS);
                if self.may_wait(w, o) {
                    self.wait(w, o);
                }
            }
            Op::Launch { stream } => {
                self.m
                    .launch(self.streams[*stream as usize % STREAMS])
                    .expect("launch");
            }
            Op::Complete { stream, n } => {
                let s = self.streams[*stream as usize % STREAMS];
                if *n == 0 {
                    self.m.complete(s).expect("complete");
                } else {
                    self.m.complete_n(s, u64::from(*n)).expect("complete_n");
                }
            }
            Op::CompleteAll => self.m.complete_all(),
            Op::EmptyCache => match self.a.empty_cache() {
                Ok(()) => {}
                Err(Error::Capture(_)) if self.active().is_some() => {}
                Err(e) => panic!("empty_cache: {e}"),
            },
            Op::SetConfig(c) => {
                let s = c.text();
                match self.a.set_config(&s) {
                    Ok(()) | Err(Error::Config(_)) => {}
                    Err(Error::Capture(_)) if self.active().is_some() => {}
                    Err(e) => panic!("set_config({s:?}): {e}"),
                }
            }
            Op::Fraction(f) => {
                self.a
                    .set_memory_fraction(f64::from(*f) / 255.0)
                    .expect("a fraction in [0, 1]");
            }
            Op::InjectFailure { backend_error, at } => inject_failure(&self.m, *backend_error, *at),
            Op::Inspect => {
                let stats = self.a.stats();
                let active: i64 = self.live.iter().filter(|l| l.size > 0).count() as i64;
                assert_eq!(stats.allocation.all().current, active, "allocation count");
                let _ = self.a.memory_stats();
                let _ = self.a.snapshot();
                let _ = self.a.largest_free_block();
                let listed = self.a.live_allocations();
                for l in &self.live {
                    assert!(
                        listed.iter().any(|&(addr, _)| addr == l.addr),
                        "live {:#x} not listed",
                        l.addr
                    );
                    assert!(self.a.block_size(l.addr).is_some_and(|b| b >= l.size));
                }
            }
            Op::BeginCapture { stream } => {
                if self.active().is_some() {
                    return;
                }
                let s = 1 + *stream as usize % (STREAMS - 1);
                let pool = graph_pool_handle();
                self.a
                    .begin_allocate_to_pool(pool, PoolFilter::CaptureOf(self.streams[s]))
                    .expect("begin_allocate_to_pool");
                self.m
                    .begin_capture(self.streams[s])
                    .expect("begin_capture");
                self.captures.push(Capture {
                    origin: s,
                    pool,
                    members: vec![s],
                    active: true,
                });
            }
            Op::EndCapture => self.end_capture(),
            Op::LaunchGraph { pick } => {
                if self.graphs.is_empty() {
                    return;
                }
                let (g, c) = &self.graphs[*pick as usize % self.graphs.len()];
                let o = self.captures[*c].origin;
                if !self.capturing(o) {
                    self.m
                        .launch_graph(g, self.streams[o])
                        .expect("the graph's memory is alive while the graph is");
                }
            }
            Op::DropGraph { pick } => {
                if self.graphs.is_empty() {
                    return;
                }
                let (g, c) = self.graphs.swap_remove(*pick as usize % self.graphs.len());
                drop(g);
                self.a
                    .release_pool(self.captures[c].pool)
                    .expect("release_pool");
            }
        }
    }

    fn end_capture(&mut self) {
        let Some(c) = self.active() else { return };
        let origin = self.captures[c].origin;
        for m in self.captures[c].members.clone() {
            if m != origin {
                self.wait(origin, m);
            }
        }
        let g = self
            .m
            .end_capture(self.streams[origin])
            .unwrap_or_else(|e| {
                panic!(
                    "end_capture: {e} (invalidated: {:?})",
                    self.m.invalidation_reason(self.streams[origin])
                )
            });
        self.captures[c].active = false;
        self.captures[c].members.clear();
        self.a
            .end_allocate_to_pool(self.captures[c].pool)
            .expect("end_allocate_to_pool");
        self.graphs.push((g, c));
    }

    fn check(&self, op: Option<&Op>) {
        check_device(&self.m, &self.a, &op);
    }
}

/// Whether `CACHALOT_FUZZ_DEBUG` is set: [`engine`] and [`pools()`] then
/// print each operation to stderr (to read a crash input).
pub(crate) fn debug() -> bool {
    static DEBUG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var_os("CACHALOT_FUZZ_DEBUG").is_some())
}

/// Runs the program the bytes decode to; panics when an invariant breaks,
/// the race checker finds a race, an operation fails in a way the program
/// cannot cause, or something is left at the end.
pub fn engine(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let capacity = capacity(&mut u);
    let m: MockBackend = MockConfig::new(capacity).auto_complete(false).build();
    let config = match ConfigString::arbitrary(&mut u) {
        Ok(c) => AllocatorConfig::parse(&c.text()).unwrap_or_default(),
        Err(_) => AllocatorConfig::default(),
    };
    let a = CachingAllocator::with_config(m.clone(), config).expect("allocator");
    let streams = [
        m.default_stream(),
        m.create_stream(),
        m.create_stream(),
        m.create_stream(),
    ];
    let mut w = World {
        m,
        a,
        streams,
        live: Vec::new(),
        freed: Vec::new(),
        captures: Vec::new(),
        graphs: Vec::new(),
        next_tag: 1,
    };
    if debug() {
        eprintln!(
            "capacity {capacity}, config {:?}",
            w.a.config().last_config_string
        );
    }
    run_ops(&mut u, MAX_OPS, |op: &Op| {
        w.step(op);
        w.check(Some(op));
    });
    // Wind down: end the capture, free everything, drop the graphs.
    w.end_capture();
    w.check(None);
    for l in std::mem::take(&mut w.live) {
        free_live(&w.a, l.addr);
    }
    for (g, c) in std::mem::take(&mut w.graphs) {
        drop(g);
        w.a.release_pool(w.captures[c].pool).expect("release_pool");
    }
    let World { m, a, .. } = w;
    assert_all_released(m, a);
}
