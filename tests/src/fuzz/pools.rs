//! The private-pool fuzz harness: random operation sequences on
//! `CachingAllocator<MockBackend>` exercising what a private pool does
//! beyond capture routing, decoded from the fuzzer's bytes.
//!
//! Operations: pools created (`create_or_incref_pool` with a fresh
//! `graph_pool_handle`, optionally `use_on_oom`, `no_split` and a segment
//! source over the device that misbehaves on request), more uses taken,
//! released (as `MemPool`'s destructor: `use_on_oom` off, then
//! `release_pool`), `use_on_oom` toggled; allocations into a pool
//! (`allocate_in_pool`, the `use_mem_pool` routing) and into the default
//! pools (which may borrow a lender's cached block), frees,
//! `record_stream`, uses on other streams, stream waits, (partial)
//! completion of work, `empty_cache`, memory fractions, injected device
//! failures; checkpoints of a pool saved and restored (as cudagraph trees
//! do, outside capture, on pools no default-pool allocation borrows from);
//! a live allocation shared with another process (a second mock device
//! opens the handle or the pages), closed later, its block freed or not
//! in between. A segment tracker keeps a book of the segment events.
//!
//! Configurations: fixed segments, the default (expandable default pool,
//! fixed private pools), expandable everywhere, each with PyTorch's
//! placement or cachalot's, and a few extra keys.
//!
//! After every operation: the engine's invariants hold, the race checker
//! found no race, the tracker's book matches the snapshot (segment
//! allocations heard of minus frees are the fixed segments, the bytes
//! mapped those of the expandable ones), every live allocation lies in the
//! pool it was made in (or a lender's), and a `no_split` pool's fixed
//! segments hold one block each. The harness only uses memory correctly:
//! a use of a block is ordered after its allocation and before its free;
//! a restore, which moves blocks between streams, comes after the work of
//! the pool's allocation streams completed when the pool has several.
//! At the end, with every window closed, everything freed and every pool
//! released, no memory, segment, event, source segment or open handle is
//! left.
//!
//! The libFuzzer target `pools` (`fuzz/`) and the regression test
//! `fuzz_regressions_pools` (`tests/tests/fuzz_regressions.rs`) both call
//! [`pools`].

mod books;
mod checkpoints;
mod ipc;

use std::sync::{Arc, Mutex};

use arbitrary::{Arbitrary, Unstructured};
use cachalot_core::engine::PoolCheckpoint;
use cachalot_core::{
    AllocatorConfig, Backend, CachingAllocator, CaptureError, Error, PoolId, graph_pool_handle,
};
use cachalot_mock::{MockBackend, MockConfig, MockStream};

use self::books::{FuzzSource, SourceKind, TrackerBook};
use self::ipc::Window;
use super::device::{
    allocated, assert_all_released, capacity, check_device, free_live, inject_failure, run_ops,
    wait_event, write_new,
};
use super::{Size, debug};

/// Streams of the program: the default stream and two more.
const STREAMS: usize = 3;
/// Most operations one input runs.
const MAX_OPS: usize = 384;
/// Most pools one input creates.
const MAX_POOLS: usize = 12;
/// Checkpoints kept (the oldest goes first).
const MAX_CHECKPOINTS: usize = 4;

/// The configurations an input starts from.
const CONFIGS: &[&str] = &[
    "expandable_segments:False",
    "",
    "expandable_segments:True",
    "expandable_segments:True,placement:pytorch",
    "expandable_segments:False,placement:pytorch",
    "placement:pytorch",
];
/// Keys added to a configuration.
const EXTRAS: &[&str] = &[
    "",
    "release_lock_on_cudamalloc:True",
    "max_split_size_mb:40",
    "garbage_collection_threshold:0.6",
    "roundup_power2_divisions:4",
];

/// One operation: one of the engine harness's operations on memory and
/// work ([`super::Op`]), or one of the private pools'. Indices are taken
/// modulo what exists; an operation that does not apply in the current
/// state is skipped.
#[derive(Debug, Clone)]
pub enum Op {
    /// Allocations into the default pools (which may borrow a lender's
    /// cached block), frees, `record_stream`, uses, waits, launches,
    /// completion of work, `empty_cache`, fractions, injected failures
    /// and stats; the engine harness's other operations (bad frees,
    /// `set_config`, captures) are skipped.
    Memory(super::Op),
    /// A private pool's operation.
    Pool(PoolOp),
}

impl<'a> Arbitrary<'a> for Op {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(if u.arbitrary::<bool>()? {
            Op::Memory(super::Op::arbitrary(u)?)
        } else {
            Op::Pool(PoolOp::arbitrary(u)?)
        })
    }
}

/// A private pool's operation.
#[derive(Arbitrary, Debug, Clone)]
pub enum PoolOp {
    /// A new pool with its first use.
    Create {
        /// Default-pool allocations may borrow its cached blocks
        /// (`use_on_oom` on from the start; never checkpointed).
        lender: bool,
        /// Its blocks are never split.
        no_split: bool,
        /// Its segments come from a source.
        source: Option<SourceKind>,
    },
    /// One more use of a held pool (given a source too: refused).
    Incref {
        /// Which pool.
        pick: u8,
        /// Give a source as well.
        with_source: bool,
    },
    /// One use of a held pool ends.
    Release {
        /// Which pool.
        pick: u8,
    },
    /// `use_on_oom` of a lender turned on or off.
    UseOnOom {
        /// Which pool.
        pick: u8,
        /// On.
        on: bool,
    },
    /// `allocate_in_pool` (a released pool: refused).
    Alloc {
        /// Which pool.
        pick: u8,
        /// Size.
        size: Size,
        /// Stream index.
        stream: u8,
    },
    /// Save a checkpoint of a pool.
    Checkpoint {
        /// Which pool.
        pick: u8,
    },
    /// Restore a saved checkpoint.
    Restore {
        /// Which checkpoint.
        pick: u8,
    },
    /// Share a live allocation with the other process, which opens it.
    Share {
        /// Which live allocation.
        pick: u16,
    },
    /// The other process closes what it opened.
    Close {
        /// Which window.
        pick: u8,
    },
}

/// A pool of the program.
struct Pool {
    id: PoolId,
    /// Uses held (0: released).
    uses: u32,
    lender: bool,
    /// `use_on_oom` now.
    on_oom: bool,
    no_split: bool,
    source: Option<Arc<FuzzSource>>,
    /// The streams allocations into it were made on, as bits.
    alloc_streams: u8,
}

/// A live allocation of the program.
struct Live {
    addr: u64,
    size: u64,
    tag: u64,
    /// Streams it may be used on (its allocation stream first).
    streams: Vec<usize>,
    /// The pool it was made in (index into `pools`); `None`: `allocate`.
    pool: Option<usize>,
}

struct World {
    m: MockBackend,
    a: CachingAllocator<MockBackend>,
    /// The other process.
    other: MockBackend,
    streams: [MockStream; STREAMS],
    live: Vec<Live>,
    pools: Vec<Pool>,
    /// (pool index, checkpoint)
    checkpoints: Vec<(usize, PoolCheckpoint<MockStream>)>,
    windows: Vec<Window>,
    /// A segment of this device was open in the other process since the
    /// last release that reported: a release may fail.
    held_open: bool,
    /// Whether allocations may be shared as runs of different sizes
    /// (cachalot's page runs; PyTorch's mode has pages of one size).
    runs: bool,
    book: Arc<Mutex<TrackerBook>>,
    next_tag: u64,
}

impl World {
    fn stream(&self, s: u8) -> usize {
        s as usize % STREAMS
    }

    fn pick_live(&self, pick: u16) -> Option<usize> {
        (!self.live.is_empty()).then(|| pick as usize % self.live.len())
    }

    fn pick_pool(&self, pick: u8) -> Option<usize> {
        (!self.pools.is_empty()).then(|| pick as usize % self.pools.len())
    }

    /// The held pool `pick` names, if it is held.
    fn held_pool(&self, pick: u8) -> Option<usize> {
        self.pick_pool(pick).filter(|&p| self.pools[p].uses > 0)
    }

    /// Whether a release may have failed for a segment open elsewhere.
    fn release_may_fail(&self, e: &Error) -> bool {
        matches!(e, Error::ReleaseFailed { .. }) && self.held_open
    }

    /// A release path's answer: a failure only for a segment held open.
    fn released(&mut self, what: &str, r: Result<(), Error>) {
        match r {
            Ok(()) => {}
            Err(e) if self.release_may_fail(&e) => {}
            Err(e) => panic!("{what}: {e}"),
        }
        if !self.segments_open() {
            self.held_open = false;
        }
    }

    /// A new allocation of `size` bytes on stream `si` (in pool `pool`):
    /// written on its stream, then live.
    fn made(&mut self, r: Result<u64, Error>, size: u64, si: usize, pool: Option<usize>) {
        let Some(addr) = allocated(r, size) else {
            return;
        };
        let tag = write_new(&self.m, self.streams[si], addr, size, &mut self.next_tag);
        if let Some(p) = pool {
            self.pools[p].alloc_streams |= 1 << si;
        }
        self.live.push(Live {
            addr,
            size,
            tag,
            streams: vec![si],
            pool,
        });
    }

    fn step(&mut self, op: &Op) {
        match op {
            Op::Memory(op) => self.memory(op),
            Op::Pool(op) => self.pool_op(op),
        }
    }

    fn memory(&mut self, op: &super::Op) {
        use super::Op as M;
        match op {
            M::Alloc { size, stream } => {
                let (si, size) = (self.stream(*stream), size.bytes());
                let r = self.a.allocate(size, self.streams[si]);
                self.made(r, size, si, None);
            }
            M::Free { pick } => {
                let Some(i) = self.pick_live(*pick) else {
                    return;
                };
                let l = self.live.swap_remove(i);
                free_live(&self.a, l.addr);
            }
            M::RecordStream { pick, stream } => {
                let Some(i) = self.pick_live(*pick) else {
                    return;
                };
                let (t, own) = (self.stream(*stream), self.live[i].streams[0]);
                if t != own {
                    wait_event(&self.m, self.streams[t], self.streams[own]);
                }
                let l = &mut self.live[i];
                self.a
                    .record_stream(l.addr, self.streams[t])
                    .unwrap_or_else(|e| panic!("record_stream of live {:#x}: {e}", l.addr));
                if !l.streams.contains(&t) {
                    l.streams.push(t);
                }
            }
            M::Use { pick, which } => {
                let Some(i) = self.pick_live(*pick) else {
                    return;
                };
                let l = &self.live[i];
                let s = l.streams[*which as usize % l.streams.len()];
                self.m
                    .use_memory(self.streams[s], l.addr, l.size, l.tag)
                    .expect("a live block lies in a live segment");
            }
            M::Wait { waiter, other } => {
                let (w, o) = (self.stream(*waiter), self.stream(*other));
                if w != o {
                    wait_event(&self.m, self.streams[w], self.streams[o]);
                }
            }
            M::Launch { stream } => {
                self.m
                    .launch(self.streams[self.stream(*stream)])
                    .expect("launch");
            }
            M::Complete { stream, n } => {
                let s = self.streams[self.stream(*stream)];
                if *n == 0 {
                    self.m.complete(s).expect("complete");
                } else {
                    self.m.complete_n(s, u64::from(*n)).expect("complete_n");
                }
            }
            M::CompleteAll => self.m.complete_all(),
            M::EmptyCache => {
                let r = self.a.empty_cache();
                self.released("empty_cache", r);
            }
            M::Fraction(f) => self
                .a
                .set_memory_fraction(f64::from(*f) / 255.0)
                .expect("a fraction in [0, 1]"),
            M::InjectFailure { backend_error, at } => {
                inject_failure(&self.m, *backend_error, *at);
            }
            M::Inspect => {
                let live = self.live.iter().filter(|l| l.size > 0).count() as i64;
                let stats = self.a.stats();
                assert_eq!(stats.allocation.all().current, live, "allocation count");
                assert_eq!(
                    self.a.live_allocations().len() as i64,
                    live,
                    "live allocations"
                );
            }
            M::FreeBad { .. }
            | M::FreeInterior { .. }
            | M::SetConfig(_)
            | M::BeginCapture { .. }
            | M::EndCapture
            | M::LaunchGraph { .. }
            | M::DropGraph { .. } => {}
        }
    }

    fn pool_op(&mut self, op: &PoolOp) {
        match op {
            PoolOp::Create {
                lender,
                no_split,
                source,
            } => self.create_pool(*lender, *no_split, *source),
            PoolOp::Incref { pick, with_source } => {
                let Some(p) = self.held_pool(*pick) else {
                    return;
                };
                let id = self.pools[p].id;
                if *with_source {
                    let src = Arc::new(FuzzSource::new(self.m.clone(), SourceKind::Device));
                    let e = self
                        .a
                        .create_or_incref_pool(id, Some(src))
                        .expect_err("a source for a pool that exists");
                    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
                } else {
                    self.a.create_or_incref_pool(id, None).expect("incref");
                    self.pools[p].uses += 1;
                }
            }
            PoolOp::Release { pick } => {
                let Some(p) = self.held_pool(*pick) else {
                    return;
                };
                self.release_pool(p);
            }
            PoolOp::UseOnOom { pick, on } => {
                let Some(p) = self.held_pool(*pick).filter(|&p| self.pools[p].lender) else {
                    return;
                };
                self.a
                    .set_pool_use_on_oom(self.pools[p].id, *on)
                    .expect("set_pool_use_on_oom");
                self.pools[p].on_oom = *on;
            }
            PoolOp::Alloc { pick, size, stream } => {
                let Some(p) = self.pick_pool(*pick) else {
                    return;
                };
                let (si, size) = (self.stream(*stream), size.bytes());
                let r = self
                    .a
                    .allocate_in_pool(self.pools[p].id, size, self.streams[si]);
                if self.pools[p].uses == 0 {
                    // (a request of 0 bytes or of more than can exist is
                    // answered before the pool is looked up)
                    assert!(
                        matches!(
                            r,
                            Ok(0)
                                | Err(Error::Capture(CaptureError::UnknownPool(_)))
                                | Err(Error::NeverFits { .. })
                        ),
                        "allocate_in_pool of {size} bytes in a released pool: {r:?}"
                    );
                    return;
                }
                self.made(r, size, si, Some(p));
            }
            PoolOp::Checkpoint { pick } => self.checkpoint(*pick),
            PoolOp::Restore { pick } => self.restore(*pick),
            PoolOp::Share { pick } => self.share(*pick),
            PoolOp::Close { pick } => {
                if !self.windows.is_empty() {
                    self.close(*pick as usize % self.windows.len());
                }
            }
        }
    }

    fn create_pool(&mut self, lender: bool, no_split: bool, source: Option<SourceKind>) {
        if self.pools.len() >= MAX_POOLS {
            return;
        }
        let id = graph_pool_handle();
        let source = source.map(|k| Arc::new(FuzzSource::new(self.m.clone(), k)));
        let given = source
            .clone()
            .map(|s| s as Arc<dyn cachalot_core::SegmentSource>);
        self.a
            .create_or_incref_pool(id, given)
            .expect("create_or_incref_pool of a new pool");
        if lender {
            self.a
                .set_pool_use_on_oom(id, true)
                .expect("set_pool_use_on_oom");
        }
        if no_split {
            self.a.set_pool_no_split(id).expect("set_pool_no_split");
        }
        self.pools.push(Pool {
            id,
            uses: 1,
            lender,
            on_oom: lender,
            no_split,
            source,
            alloc_streams: 0,
        });
    }

    /// One use of pool `p` ends, as `MemPool`'s destructor ends it: a
    /// lender's `use_on_oom` is turned off first at its last use.
    fn release_pool(&mut self, p: usize) {
        let id = self.pools[p].id;
        if self.pools[p].uses == 1 && self.pools[p].on_oom {
            self.a
                .set_pool_use_on_oom(id, false)
                .expect("set_pool_use_on_oom");
            self.pools[p].on_oom = false;
        }
        self.pools[p].uses -= 1;
        let r = self.a.release_pool(id);
        self.released("release_pool", r);
    }

    fn check(&self, op: Option<&Op>) {
        check_device(&self.m, &self.a, &op);
        let snap = self.a.snapshot();
        self.book.lock().expect("tracker lock").check(&snap, &op);
        let pool_of = |addr: u64| {
            snap.segments
                .iter()
                .find(|s| s.address <= addr && addr < s.address + s.total_size)
                .map(|s| s.pool_id)
        };
        for l in self.live.iter().filter(|l| l.size > 0) {
            let at = pool_of(l.addr).unwrap_or_else(|| panic!("live {:#x} in no segment", l.addr));
            match l.pool {
                Some(p) => assert_eq!(at, self.pools[p].id, "pool of {:#x}", l.addr),
                None => assert!(
                    at == (0, 0) || self.pools.iter().any(|p| p.lender && p.id == at),
                    "{:#x} of the default pools lies in pool {at:?} after {op:?}",
                    l.addr
                ),
            }
        }
        for p in self.pools.iter().filter(|p| p.no_split) {
            for s in snap
                .segments
                .iter()
                .filter(|s| s.pool_id == p.id && !s.is_expandable)
            {
                assert_eq!(
                    s.blocks.len(),
                    1,
                    "a segment of no_split pool {:?} was split after {op:?}",
                    p.id
                );
            }
        }
    }
}

/// Runs the program the bytes decode to; panics when an invariant breaks,
/// the race checker finds a race, an operation fails in a way the program
/// cannot cause, or something is left at the end.
pub fn pools(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let capacity = capacity(&mut u);
    let base = CONFIGS[u.choose_index(CONFIGS.len()).unwrap_or(0)];
    let extra = EXTRAS[u.choose_index(EXTRAS.len()).unwrap_or(0)];
    let text = [base, extra]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    let config = AllocatorConfig::parse(&text).expect("a config of the list");
    let m: MockBackend = MockConfig::new(capacity).auto_complete(false).build();
    let a = CachingAllocator::with_config(m.clone(), config).expect("allocator");
    let book = Arc::new(Mutex::new(TrackerBook::default()));
    a.set_segment_tracker(Some(TrackerBook::tracker(&book)));
    let streams = [m.default_stream(), m.create_stream(), m.create_stream()];
    let runs = !text.contains("placement:pytorch") && !text.contains("expandable_segments:False");
    let mut w = World {
        other: MockConfig::new(capacity).build(),
        m,
        a,
        streams,
        live: Vec::new(),
        pools: Vec::new(),
        checkpoints: Vec::new(),
        windows: Vec::new(),
        held_open: false,
        runs,
        book,
        next_tag: 1,
    };
    if debug() {
        eprintln!("capacity {capacity}, config {text:?}");
    }
    run_ops(&mut u, MAX_OPS, |op: &Op| {
        w.step(op);
        w.check(Some(op));
    });
    // Wind down: the other process closes everything, then every block is
    // freed and every pool released.
    while !w.windows.is_empty() {
        w.close(0);
    }
    assert_eq!(w.other.ipc_open_count(), 0, "windows left open");
    for l in std::mem::take(&mut w.live) {
        free_live(&w.a, l.addr);
    }
    for p in 0..w.pools.len() {
        while w.pools[p].uses > 0 {
            w.release_pool(p);
        }
    }
    w.check(None);
    let World {
        m, a, pools, book, ..
    } = w;
    assert_all_released(m, a);
    for p in &pools {
        if let Some(s) = &p.source {
            assert_eq!(
                s.lent(),
                0,
                "segments left lent by the source of {:?}",
                p.id
            );
        }
    }
    let book = book.lock().expect("tracker lock");
    assert!(book.is_empty(), "the tracker heard of segments left");
}
