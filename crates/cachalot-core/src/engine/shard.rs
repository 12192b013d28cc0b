//! Shards: the per-stream part of the engine that a cache hit and a plain
//! free need, behind its own lock, so that threads on different streams
//! do not contend (`docs/design-shards.md`).
//!
//! A shard owns, while the device is not looking, one part of every
//! per-device structure: its [`Slab`] part (the blocks of the segments of
//! its streams), its live-map part, the default pool's free sets of its
//! streams, and counters for the stats a hit and a free change. Every
//! other operation (a miss, the OOM ladder, `empty_cache`, capture,
//! `record_stream`, events, config changes, stats reads) runs on the
//! device: it takes the device lock, then every shard lock in shard order,
//! moves the parts back into the engine's `Inner` ([`Inner::check_in`]),
//! runs the engine's code unchanged, and hands the parts out again
//! ([`Inner::check_out`]). So the engine sees exactly the state it would
//! see without shards, and a single thread gets exactly the results it
//! would get without them.
//!
//! Peaks stay exact with no shared write on the fast path: at each
//! check-out the device knows every stat exactly and sets its slack
//! (`peak - current`) aside as grants; a thread takes grants (a share of
//! what is left, under the device lock alone) into a thread-local budget.
//! The grants of one generation (from one check-out to the next) sum to at
//! most the slack, and a fast operation spends the increases it makes from
//! its thread's budget, so no stat can exceed its peak whatever the other
//! threads do; an operation that would exceed the budget takes a new grant
//! or goes to the device, where the stats are exact. The budget is the
//! thread's, not the shard's: a thread that frees on one stream and
//! allocates on another spends what it freed.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::hash::{Hash, Hasher};

use crate::config::{AllocatorConfig, Placement};
use crate::engine::accounting::{Arr, FAST_STATS, OVERSIZE, StatSink, idx};
use crate::engine::addr_table::AddrTable;
use crate::engine::block::{BState, BlockId, NIL, Slab, part_of};
use crate::engine::free_set::{Back, FreeSet};
use crate::engine::placement::FitRule;
use crate::engine::pools::DEFAULT_POOL;
use crate::engine::rounding::{MIN_BLOCK_SIZE, SMALL_SIZE, round_size};
use crate::stats::{DeviceStats, StatType};

/// Number of shards (and of parts of the slab and the live map). Streams
/// are assigned to shards round-robin in the order they first allocate, so
/// up to this many streams never share a shard.
pub(crate) const SHARDS: usize = 16;

/// What a shard may do on its own, refreshed at every check-out.
pub(crate) struct FastView {
    /// The fast path is allowed: no capture, no pending events or deferred
    /// frees, no memory history, no garbage collection, no expandable
    /// segments, no block outside the part of its stream's shard.
    pub ok: bool,
    /// The configuration (cloned only when it changed).
    pub config: AllocatorConfig,
    /// `Inner::config_gen` of `config`.
    pub config_gen: u64,
    /// The default pools' GC clocks `[large, small]` (constant while the
    /// fast path is allowed: the clock runs only with GC on).
    pub gc_calls: [u64; 2],
    /// The generation of the grants (`Inner::generation`).
    pub generation: u64,
    /// The allocator's key of the grants.
    pub alloc: u64,
}

/// A shard's counters of the [`FAST_STATS`]: changes since the last
/// check-in.
#[derive(Clone, Debug)]
pub(crate) struct ShardStats {
    /// Increases (the stats' `allocated`; the current value changed by
    /// `inc - dec`), by [`FAST_STATS`] index.
    pub inc: [i64; SLOTS],
    /// Decreases (the stats' `freed`).
    pub dec: [i64; SLOTS],
    /// Some count is not zero.
    pub dirty: bool,
}

impl ShardStats {
    /// Adds the changes to `stats` and clears them (at check-in; the peaks
    /// need no change: the budgets kept every current at or below its peak
    /// once every shard's changes are in, see [`Inner::check_in`]).
    pub fn fold_into(&mut self, stats: &mut DeviceStats) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        // the fast path counts the pool kinds; "all" is their sum
        for (a, arr) in stats.fast_arrays().into_iter().enumerate() {
            let (s, l) = (3 * a + 1, 3 * a + 2);
            let inc = [self.inc[s] + self.inc[l], self.inc[s], self.inc[l]];
            let dec = [self.dec[s] + self.dec[l], self.dec[s], self.dec[l]];
            for k in 0..3 {
                let st = &mut arr.0[k];
                st.current += inc[k] - dec[k];
                st.allocated += inc[k];
                st.freed += dec[k];
            }
        }
        let st = &mut stats.oversize_allocations;
        st.current += self.inc[OVERSIZE] - self.dec[OVERSIZE];
        st.allocated += self.inc[OVERSIZE];
        st.freed += self.dec[OVERSIZE];
        self.inc = [0; SLOTS];
        self.dec = [0; SLOTS];
    }
}

impl Default for ShardStats {
    fn default() -> Self {
        Self {
            inc: [0; SLOTS],
            dec: [0; SLOTS],
            dirty: false,
        }
    }
}

/// A thread's budget of stat increases, granted by the device for one
/// allocator and one generation.
pub(crate) struct Budget {
    alloc: Cell<u64>,
    generation: Cell<u64>,
    /// What is left of the grants of this generation for each stat: the
    /// sum of the grants less the net change this thread made on the fast
    /// path since the first of them.
    room: [Cell<i64>; SLOTS],
}

/// Array slots of the [`FAST_STATS`] (a power of two: indices are masked,
/// so the hit path has no bounds checks).
const SLOTS: usize = 32;

#[cfg(not(feature = "shuttle"))]
thread_local! {
    /// This thread's budget (one allocator at a time; a thread that
    /// alternates between allocators takes a fresh grant at each switch).
    pub(crate) static BUDGET: Budget = const {
        Budget {
            alloc: Cell::new(0),
            generation: Cell::new(0),
            room: [const { Cell::new(0) }; SLOTS],
        }
    };
}

#[cfg(feature = "shuttle")]
shuttle::thread_local! {
    /// This (model) thread's budget.
    pub(crate) static BUDGET: Budget = Budget {
        alloc: Cell::new(0),
        generation: Cell::new(0),
        room: [const { Cell::new(0) }; SLOTS],
    };
}

impl Budget {
    /// Whether the budget holds grants of allocator `alloc`'s generation
    /// `generation`.
    #[inline(always)]
    fn valid(&self, alloc: u64, generation: u64) -> bool {
        self.alloc.get() == alloc && self.generation.get() == generation
    }
}

/// A dry run of a fast operation's stat transitions: whether every
/// increase fits in the thread's budget (each stat changes at most once in
/// one operation, so each is checked on its own).
struct Probe<'a, const VALID: bool> {
    b: &'a Budget,
    ok: bool,
}

impl<const VALID: bool> Probe<'_, VALID> {
    #[inline(always)]
    fn add(&mut self, i: usize, n: i64) {
        // branch-free: an increase needs room (and a valid budget); a room
        // is never negative, so a decrease always fits
        let room = if VALID {
            self.b.room[i & (SLOTS - 1)].get()
        } else {
            0
        };
        debug_assert!(room >= 0);
        self.ok &= room >= n;
    }
}

impl<const VALID: bool> StatSink for Probe<'_, VALID> {
    #[inline(always)]
    fn inc(&mut self, arr: Arr, st: StatType, n: i64) {
        self.add(idx(arr, StatType::Aggregate), n);
        self.add(idx(arr, st), n);
    }
    #[inline(always)]
    fn dec(&mut self, _arr: Arr, _st: StatType, _n: i64) {}
    #[inline(always)]
    fn oversize(&mut self, d: i64) {
        self.add(OVERSIZE, d);
    }
}

/// The commit of a fast operation's transitions: the shard's counters
/// (of the pool kinds only: "all" is their sum, added up at check-in), and
/// the thread's budget spent when `VALID`.
struct Spend<'a, const VALID: bool> {
    s: &'a mut ShardStats,
    b: &'a Budget,
}

impl<const VALID: bool> Spend<'_, VALID> {
    #[inline(always)]
    fn room(&self, i: usize, n: i64) {
        if VALID {
            let r = &self.b.room[i & (SLOTS - 1)];
            r.set(r.get() - n);
        }
    }
}

impl<const VALID: bool> StatSink for Spend<'_, VALID> {
    #[inline(always)]
    fn inc(&mut self, arr: Arr, st: StatType, n: i64) {
        self.s.inc[idx(arr, st) & (SLOTS - 1)] += n;
        self.room(idx(arr, StatType::Aggregate), n);
        self.room(idx(arr, st), n);
    }
    #[inline(always)]
    fn dec(&mut self, arr: Arr, st: StatType, n: i64) {
        self.s.dec[idx(arr, st) & (SLOTS - 1)] += n;
        self.room(idx(arr, StatType::Aggregate), -n);
        self.room(idx(arr, st), -n);
    }
    #[inline(always)]
    fn oversize(&mut self, d: i64) {
        if d >= 0 {
            self.s.inc[OVERSIZE] += d;
        } else {
            self.s.dec[OVERSIZE] -= d;
        }
        self.room(OVERSIZE, d);
    }
}

/// Why a fast operation did not run (nothing was changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Miss {
    /// This shard cannot serve it: the device must.
    Device,
    /// A free of an address this shard does not hold (another may).
    Absent,
    /// It would exceed the thread's budget: a new grant may let it run.
    Budget,
}

/// One shard: its parts of the engine's structures, and what it may do.
pub(crate) struct Shard<S> {
    /// The blocks of the segments of this shard's streams.
    pub slab: Slab<S>,
    /// The live (handed-out) blocks of `slab`, by address.
    pub live: AddrTable,
    /// The default pools' free sets of this shard's streams `[large, small]`.
    pub free: [FreeSet<S>; 2],
    /// Stat changes since the last check-in.
    pub stats: ShardStats,
    /// What the fast path may do.
    pub view: FastView,
}

impl<S: Copy + Ord> Shard<S> {
    /// Shard `part`, empty, with the fast path off until the first check-out.
    pub fn new(part: usize, config: &AllocatorConfig) -> Self {
        Self {
            slab: Slab::new(part),
            live: AddrTable::default(),
            free: [FreeSet::default(), FreeSet::default()],
            stats: ShardStats::default(),
            view: FastView {
                ok: false,
                config: config.clone(),
                config_gen: u64::MAX,
                gc_calls: [0; 2],
                generation: 0,
                alloc: 0,
            },
        }
    }

    /// A cache hit of `size` bytes on `stream`, on this shard alone: the
    /// same block, split and stats as the engine's `malloc` would give
    /// (`get_free_block` and `alloc_found_block` when no capture, event,
    /// history, GC or expandable segment is involved). `None`: nothing was
    /// changed; the device must serve the request.
    #[inline]
    pub fn try_alloc(&mut self, size: u64, stream: S, budget: &Budget) -> Result<u64, Miss> {
        if !self.view.ok {
            return Err(Miss::Device);
        }
        let cfg = &self.view.config;
        let rounded = round_size(size, cfg);
        let small = rounded <= SMALL_SIZE;
        let fit = FitRule::of(cfg);
        let free = &mut self.free[small as usize];
        let Some(peeked) = free.peek_first_at_least(stream, rounded, |b| fit.accepts(rounded, b))
        else {
            return Err(Miss::Device);
        };
        let found = peeked.found;
        let id = found.id;
        if part_of(id) != self.slab.part() {
            return Err(Miss::Device);
        }
        let b = &self.slab[id];
        debug_assert!(b.state == BState::Free && b.pool == DEFAULT_POOL && !b.expandable);
        let st = StatType::of_pool(small);
        let split = should_split(cfg, b.small, b.size, rounded);
        let already_split = b.is_split();
        let final_size = if split { rounded } else { b.size };
        let oversize = final_size >= cfg.max_split_size;
        // the stat transitions, tried first against the budget
        // (every hit increases stats: no budget, no hit)
        if !budget.valid(self.view.alloc, self.view.generation) {
            return Err(Miss::Budget);
        }
        let mut probe = Probe::<true> {
            b: budget,
            ok: true,
        };
        transitions_alloc(
            &mut probe,
            st,
            split,
            already_split,
            b.size,
            rounded,
            size,
            oversize,
        );
        if !probe.ok {
            return Err(Miss::Budget);
        }
        // ----- commit: nothing below fails -----
        free.take_peeked(&peeked);
        let gc = self.view.gc_calls[small as usize];
        self.slab[id].dormant = false;
        if split {
            let rid = self.slab.split(id, rounded);
            let r = &mut self.slab[rid];
            r.gc_base = gc;
            let (rs, ra) = (r.size, r.addr);
            free.insert_peeked(&peeked, rs, ra, rid);
        }
        let b = &mut self.slab[id];
        b.state = BState::Allocated;
        b.requested = size;
        b.oversize = oversize;
        let addr = b.addr;
        self.live.insert(addr, id);
        self.stats.dirty = true;
        transitions_alloc(
            &mut Spend::<true> {
                s: &mut self.stats,
                b: budget,
            },
            st,
            split,
            already_split,
            found.size,
            rounded,
            size,
            oversize,
        );
        Ok(addr)
    }

    /// The caller's free of `addr`, on this shard alone, when `addr` is a
    /// live block of this shard with no uses on other streams: the same
    /// merges, filing and stats as the engine's `free` and `free_block`.
    /// `false`: nothing was changed; the device must do it.
    #[inline]
    pub fn try_free(&mut self, addr: u64, budget: &Budget) -> Result<(), Miss> {
        if !self.view.ok {
            return Err(Miss::Device);
        }
        // (an address held here but not servable here goes to the device
        // at once; one not held here may be another shard's)
        let Some(id) = self.live.get(addr) else {
            return Err(Miss::Absent);
        };
        let b = &self.slab[id];
        if !b.stream_uses.is_empty()
            || !b.capture_uses.is_empty()
            || b.pool != DEFAULT_POOL
            || b.expandable
            || b.state != BState::Allocated
        {
            return Err(Miss::Device);
        }
        let (stream, small, size, requested, oversize) =
            (b.stream, b.small, b.size, b.requested, b.oversize);
        // the stream's set is here: blocks live in the part of their
        // stream's shard (no block changed shard, or the fast path is off),
        // and a stream's set exists from its first block on
        debug_assert!(self.free[small as usize].has_stream(stream));
        let st = StatType::of_pool(small);
        // the merges, planned
        let slab = &self.slab;
        let mergeable =
            |n: BlockId| n != NIL && slab[n].state == BState::Free && slab[n].stream == stream;
        let (prev, next) = (b.prev, b.next);
        let (mp, mn) = (mergeable(prev), mergeable(next));
        let mut split_count = 0i64;
        let mut split_bytes = 0i64;
        let mut merged = size;
        let (mut fprev, mut fnext) = (prev, next);
        if mp {
            split_count -= 1;
            split_bytes -= slab[prev].size as i64;
            merged += slab[prev].size;
            fprev = slab[prev].prev;
        }
        if mn {
            split_count -= 1;
            split_bytes -= slab[next].size as i64;
            merged += slab[next].size;
            fnext = slab[next].next;
        }
        if fprev != NIL || fnext != NIL {
            split_count += 1;
            split_bytes += merged as i64;
        }
        let tr = FreeTransitions {
            st,
            size,
            oversize,
            requested,
            split_count,
            split_bytes,
        };
        let valid = budget.valid(self.view.alloc, self.view.generation);
        let fits = if valid {
            tr.fits::<true>(budget)
        } else {
            tr.fits::<false>(budget)
        };
        if !fits {
            return Err(Miss::Budget);
        }
        // ----- commit: nothing below fails -----
        let removed = self.live.remove(addr);
        debug_assert_eq!(removed, Some(id));
        self.slab[id].oversize = false;
        let free = &mut self.free[small as usize];
        let mut id = id;
        if mp {
            let p = &self.slab[prev];
            let r = free.remove(stream, p.size, p.addr, p.dormant_key());
            debug_assert_eq!(r, Some(prev));
            self.slab[prev].dormant = false;
            self.slab.absorb_next(prev);
            id = prev;
        }
        if mn {
            let n = &self.slab[next];
            let r = free.remove(stream, n.size, n.addr, n.dormant_key());
            debug_assert_eq!(r, Some(next));
            self.slab[next].dormant = false;
            self.slab.absorb_next(id);
        }
        let b = &mut self.slab[id];
        b.requested = 0;
        b.event_count = 0;
        debug_assert!(!b.dormant);
        let steady = self.view.config.placement == Placement::Steady;
        let (bs, ba, whole) = (b.size, b.addr, b.whole_seq());
        let back = free.insert_back(stream, bs, ba, id, steady, whole);
        let b = &mut self.slab[id];
        b.gc_base = self.view.gc_calls[small as usize];
        b.state = BState::Free;
        b.dormant = back == Back::Dormant;
        if back == Back::Drained {
            // `placement:steady` (the only policy that watches drains):
            // the stream's whole free segments become dormant
            let slab = &self.slab;
            let mut moved = Vec::new();
            free.make_dormant(stream, |i| slab[i].whole_seq(), &mut moved);
            for i in moved {
                self.slab[i].dormant = true;
            }
        }
        self.stats.dirty = true;
        if valid {
            tr.apply(&mut Spend::<true> {
                s: &mut self.stats,
                b: budget,
            });
        } else {
            tr.apply(&mut Spend::<false> {
                s: &mut self.stats,
                b: budget,
            });
        }
        Ok(())
    }
}

/// The stat transitions of a hit (the engine's `alloc_found_block`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn transitions_alloc(
    s: &mut impl StatSink,
    st: StatType,
    split: bool,
    already_split: bool,
    block_size: u64,
    rounded: u64,
    requested: u64,
    oversize: bool,
) {
    let size = if split {
        if already_split {
            s.on_split_split(st, rounded);
        } else {
            s.on_split_segment(st, block_size - rounded);
        }
        rounded
    } else {
        if already_split {
            s.on_take_split(st, block_size);
        }
        block_size
    };
    s.on_alloc(st, size, requested, oversize);
}

/// The stat transitions of a plain free (the engine's `retire` and
/// `free_block`), planned once and applied to a probe, then to the commit.
struct FreeTransitions {
    st: StatType,
    size: u64,
    oversize: bool,
    requested: u64,
    split_count: i64,
    split_bytes: i64,
}

impl FreeTransitions {
    /// Whether every increase fits in budget `b` (a dry run).
    #[inline(always)]
    fn fits<const VALID: bool>(&self, b: &Budget) -> bool {
        let mut probe = Probe::<VALID> { b, ok: true };
        self.apply(&mut probe);
        probe.ok
    }

    #[inline(always)]
    fn apply(&self, s: &mut impl StatSink) {
        s.on_free_requested(self.st, self.size, self.oversize);
        s.on_inactive_split(self.st, self.split_count, self.split_bytes);
        s.on_inactive(self.st, self.size, self.requested);
    }
}

/// The engine's `should_split` (expandable segments aside: the fast path
/// never runs with them).
#[inline(always)]
pub(crate) fn should_split(cfg: &AllocatorConfig, small: bool, b_size: u64, size: u64) -> bool {
    let remaining = b_size - size;
    if small || cfg.expandable_segments {
        remaining >= MIN_BLOCK_SIZE
    } else {
        size < cfg.max_split_size && remaining > SMALL_SIZE
    }
}

/// FNV-1a over a stream's `Hash`: the key of the thread-local shard hint.
pub(crate) fn stream_key<S: Hash>(alloc: u64, s: &S) -> u64 {
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for &b in bytes {
                self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = (self.0 ^ n)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29);
        }
        fn write_u32(&mut self, n: u32) {
            self.write_u64(n as u64);
        }
        fn write_u16(&mut self, n: u16) {
            self.write_u64(n as u64);
        }
        fn write_u8(&mut self, n: u8) {
            self.write_u64(n as u64);
        }
        fn write_usize(&mut self, n: usize) {
            self.write_u64(n as u64);
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325 ^ alloc.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    s.hash(&mut h);
    h.finish() | 1
}

#[cfg(not(feature = "shuttle"))]
thread_local! {
    /// How this thread's operations were served (cheap thread-local
    /// counters, always on): see [`crate::engine::PathCounts`].
    pub(crate) static PATHS: Cell<[u64; 5]> = const { Cell::new([0; 5]) };
}

#[cfg(feature = "shuttle")]
shuttle::thread_local! {
    /// This (model) thread's path counts.
    pub(crate) static PATHS: Cell<[u64; 5]> = Cell::new([0; 5]);
}

/// Counts one event of kind `i` (0 fast, 1 grant, 2 device, 3 refresh,
/// 4 peak raise).
#[inline(always)]
pub(crate) fn count_path(i: usize) {
    PATHS.with(|c| {
        let mut v = c.get();
        v[i] += 1;
        c.set(v);
    });
}

/// Entries of the thread-local hint.
pub(crate) const HINTS: usize = 4;

#[cfg(not(feature = "shuttle"))]
thread_local! {
    /// The shards this thread used last, as (stream key, shard), most
    /// recent first. Only a guess: the shard checks that it holds the
    /// stream (a wrong guess is a miss, served by the device).
    static HINT: [Cell<(u64, u32)>; HINTS] = const { [const { Cell::new((0, 0)) }; HINTS] };
}

#[cfg(feature = "shuttle")]
shuttle::thread_local! {
    /// This (model) thread's hints.
    static HINT: [Cell<(u64, u32)>; HINTS] = [const { Cell::new((0, 0)) }; HINTS];
}

/// The shard the hint gives for `key`.
#[inline]
pub(crate) fn hint_get(key: u64) -> Option<usize> {
    HINT.with(|h| {
        h.iter().find_map(|c| {
            let (k, s) = c.get();
            (k == key).then_some(s as usize)
        })
    })
}

/// The shard this thread used `i`-th last (for a free, which names no
/// stream).
#[inline]
pub(crate) fn hint_shard(i: usize) -> Option<usize> {
    HINT.with(|h| {
        let (k, s) = h[i % HINTS].get();
        (k != 0).then_some(s as usize)
    })
}

/// Records that `key`'s stream is on `shard`, most recent first.
pub(crate) fn hint_set(key: u64, shard: usize) {
    HINT.with(|h| {
        let at = h.iter().position(|c| c.get().0 == key).unwrap_or(HINTS - 1);
        for i in (1..=at).rev() {
            h[i].set(h[i - 1].get());
        }
        h[0].set((key, shard as u32));
    });
}

/// Stream → shard, assigned round-robin as streams first appear (on the
/// device; the fast path uses the thread-local hint).
pub(crate) struct Router<S> {
    map: Vec<(S, u32)>,
    next: u32,
}

impl<S> Default for Router<S> {
    fn default() -> Self {
        Self {
            map: Vec::new(),
            next: 0,
        }
    }
}

impl<S: Copy + Ord> Router<S> {
    /// The shard of `s`, assigned now if `s` is new.
    #[inline]
    pub fn shard(&mut self, s: S) -> usize {
        match self.map.binary_search_by(|e| e.0.cmp(&s)) {
            Ok(i) => self.map[i].1 as usize,
            Err(i) => {
                let k = self.next;
                self.next = (self.next + 1) % SHARDS as u32;
                self.map.insert(i, (s, k));
                k as usize
            }
        }
    }

    /// The shard of `s` if assigned.
    #[inline]
    pub fn get(&self, s: S) -> Option<usize> {
        self.map
            .binary_search_by(|e| e.0.cmp(&s))
            .ok()
            .map(|i| self.map[i].1 as usize)
    }
}

impl<B: crate::backend::Backend> crate::engine::state::Inner<B> {
    /// Block `id` now belongs to stream `s`; a block that leaves the
    /// shard of its part turns the fast path off.
    pub(super) fn rekey(&mut self, id: BlockId, s: B::Stream) {
        self.blocks[id].stream = s;
        if self.router.shard(s) != part_of(id) {
            self.foreign = true;
        }
    }

    /// Takes the parts of the shards held (those that hold any, see
    /// [`Self::occupied`]) back: the slab and live-map parts, the default
    /// pools' free sets, and the stat changes, folded into the device's
    /// stats. A shard not held holds nothing (its fast path finds nothing).
    pub(crate) fn check_in<G>(&mut self, shards: &mut [Option<G>])
    where
        G: std::ops::DerefMut<Target = Shard<B::Stream>>,
    {
        debug_assert_eq!(shards.len(), SHARDS);
        let mut moved = false;
        for (k, sh) in shards.iter_mut().enumerate() {
            let Some(sh) = sh else { continue };
            let sh = &mut **sh;
            moved = true;
            std::mem::swap(&mut self.blocks.parts[k], &mut sh.slab);
            std::mem::swap(&mut self.live.parts[k], &mut sh.live);
            for small in [false, true] {
                self.pools
                    .pool_mut(DEFAULT_POOL, small)
                    .free
                    .take_streams_from(&mut sh.free[small as usize]);
            }
            sh.stats.fold_into(&mut self.stats);
        }
        // (with no shard held, e.g. while the fast path is off, every part
        // is here already and the sets are in order)
        if moved {
            for small in [false, true] {
                self.pools.pool_mut(DEFAULT_POOL, small).free.sort_streams();
            }
        }
        if cfg!(debug_assertions) {
            for i in 0..FAST_STATS {
                let s = self.stats.fast_stat_mut(i);
                assert!(s.current <= s.peak, "fast stat {i} past its peak: {s:?}");
            }
        }
        // what the budgets hold: the slack not left to grant
        let slack = self.slack();
        for (i, s) in slack.iter().enumerate() {
            self.outstanding[i] = s - self.remaining[i];
        }
    }

    /// Whether the fast path is allowed: no capture, no pending events or
    /// deferred frees, no memory history, no garbage collection, no
    /// expandable segments ever, no block outside its stream's shard.
    pub(crate) fn fast_ok(&mut self) -> bool {
        let gc_on =
            self.limits.allowed_max.is_some() && self.config.garbage_collection_threshold > 0.0;
        self.ever_expandable |= self.config.expandable_segments;
        !self.capture.is_active()
            && self.capture.deferred.is_empty()
            && self.events.outstanding() == 0
            && self.history.is_none()
            && !gc_on
            && !self.ever_expandable
            && !self.foreign
    }

    /// Every fast stat's slack `peak - current` (exact once every shard is
    /// folded in).
    fn slack(&mut self) -> [i64; FAST_STATS] {
        let mut out = [0; FAST_STATS];
        for (a, arr) in self.stats.fast_arrays().into_iter().enumerate() {
            for k in 0..3 {
                out[3 * a + k] = (arr.0[k].peak - arr.0[k].current).max(0);
            }
        }
        let o = &self.stats.oversize_allocations;
        out[OVERSIZE] = (o.peak - o.current).max(0);
        out
    }

    /// The shards that will hold anything once checked out (blocks, live
    /// blocks or default-pool free sets): the caller holds at least these.
    pub(crate) fn occupied(&mut self) -> u32 {
        if !self.fast_ok() {
            // nothing goes out while the fast path is off
            return 0;
        }
        let mut m = 0u32;
        for k in 0..SHARDS {
            // (a live block is a block of its part)
            if self.blocks.parts[k].has_blocks() {
                m |= 1 << k;
            }
        }
        for small in [false, true] {
            for s in self.pools.pool(DEFAULT_POOL, small).free.streams() {
                m |= 1 << self.router.shard(s);
            }
        }
        m
    }

    /// Hands the parts out to the shards held again (the reverse of
    /// [`Self::check_in`]; the caller holds every shard of
    /// [`Self::occupied`]), with what each may now do alone: the fast-path
    /// flag and the configuration. A new generation of grants starts from
    /// the exact stats, and the calling thread takes the first.
    pub(crate) fn check_out<G>(&mut self, shards: &mut [Option<G>])
    where
        G: std::ops::DerefMut<Target = Shard<B::Stream>>,
    {
        debug_assert_eq!(shards.len(), SHARDS);
        if !self.fast_ok() {
            // Every part stays here (the device path then takes no shard
            // lock at all): the shards held were checked in and hold
            // nothing; they refuse every fast operation, and every budget
            // is void.
            for sh in shards.iter_mut().flatten() {
                sh.view.ok = false;
            }
            self.generation += 1;
            self.remaining = [0; FAST_STATS];
            self.outstanding = [0; FAST_STATS];
            self.grantee = 0;
            self.fast_on = false;
            return;
        }
        self.fast_on = true;
        let ok = true;
        for small in [false, true] {
            let free = &mut self.pools.pool_mut(DEFAULT_POOL, small).free;
            while let Some(s) = free.last_stream() {
                let k = self.router.shard(s);
                let sh = shards[k]
                    .as_mut()
                    .expect("the caller holds every occupied shard");
                free.move_last_to(&mut sh.free[small as usize]);
            }
        }
        let gc_calls = [
            self.pools.pool(DEFAULT_POOL, false).gc_calls,
            self.pools.pool(DEFAULT_POOL, true).gc_calls,
        ];
        // The budgets stay valid when the slack after the device's work
        // still covers what they hold (the usual case: a miss, a stats
        // read); else (a peak reset, a change that used up the slack) they
        // are void and a new generation starts from the exact slack.
        let slack = self.slack();
        let keep = self.generation != 0
            && slack
                .iter()
                .zip(&self.outstanding)
                .all(|(s, held)| s - held >= 0);
        if keep {
            for (i, s) in slack.iter().enumerate() {
                self.remaining[i] = s - self.outstanding[i];
            }
        } else {
            self.generation += 1;
            self.set_slack();
        }
        for (k, sh) in shards.iter_mut().enumerate() {
            let Some(sh) = sh else {
                debug_assert!(!self.blocks.parts[k].has_blocks() && self.live.parts[k].len() == 0);
                continue;
            };
            let sh = &mut **sh;
            sh.free[0].sort_streams();
            sh.free[1].sort_streams();
            std::mem::swap(&mut self.blocks.parts[k], &mut sh.slab);
            std::mem::swap(&mut self.live.parts[k], &mut sh.live);
            debug_assert!(sh.stats.inc == [0; SLOTS] && sh.stats.dec == [0; SLOTS]);
            sh.view.ok = ok;
            sh.view.gc_calls = gc_calls;
            sh.view.generation = self.generation;
            sh.view.alloc = self.alloc_id;
            if sh.view.config_gen != self.config_gen {
                sh.view.config = self.config.clone();
                sh.view.config_gen = self.config_gen;
            }
        }
        let _ = self.grant();
    }

    /// The grants of a new generation: every fast stat's slack (`peak -
    /// current`, the stats exact: every shard's changes folded in).
    fn set_slack(&mut self) {
        self.remaining = self.slack();
        self.outstanding = [0; FAST_STATS];
        self.grantee = 0;
    }

    /// Starts a refresh of the grants (the device lock held, the shards
    /// not): a new generation, so that every budget of the old one is void
    /// on each shard once [`Self::refresh_shard`] has marked it. Returns the
    /// shards to visit.
    pub(crate) fn refresh_begin(&mut self) -> u32 {
        self.generation += 1;
        self.occupied
    }

    /// Folds held shard `sh`'s stat changes into the device's stats and
    /// marks it with the new generation: from now on it takes no spending
    /// of an old budget, so its changes folded here are all it made with
    /// them (a free that only decreases stats may still run on it; that
    /// only makes the slack set aside below smaller than it is).
    pub(crate) fn refresh_shard(&mut self, sh: &mut Shard<B::Stream>) {
        sh.stats.fold_into(&mut self.stats);
        sh.view.generation = self.generation;
    }

    /// A new generation with every shard in `held` folded in and marked
    /// (the caller holds every occupied shard: the stats are exact after
    /// it, and no budget of an older generation can be spent).
    pub(crate) fn refresh_held<G>(&mut self, held: &mut [Option<G>])
    where
        G: std::ops::DerefMut<Target = Shard<B::Stream>>,
    {
        let _ = self.refresh_begin();
        for sh in held.iter_mut().flatten() {
            self.refresh_shard(sh);
        }
    }

    /// Ends a refresh (every shard of [`Self::refresh_begin`] marked): the
    /// new generation's slack from the stats, now exact for every increase,
    /// and a grant for the calling thread.
    #[must_use]
    pub(crate) fn refresh_end(&mut self) -> bool {
        if cfg!(debug_assertions) {
            for i in 0..FAST_STATS {
                let s = self.stats.fast_stat_mut(i);
                assert!(s.current <= s.peak, "fast stat {i} past its peak: {s:?}");
            }
        }
        self.set_slack();
        self.grant()
    }

    /// Makes budget `b` unbounded for the current generation (every shard
    /// held, for one operation that may raise peaks; see
    /// [`Self::raise_peaks`]).
    pub(crate) fn unbounded_budget(&self, b: &Budget) {
        b.alloc.set(self.alloc_id);
        b.generation.set(self.generation);
        for r in &b.room {
            r.set(i64::MAX / 4);
        }
    }

    /// Raises every fast stat's peak to its current value (every shard
    /// held and folded in: the currents are exact).
    pub(crate) fn raise_peaks(&mut self) {
        for i in 0..FAST_STATS {
            let s = self.stats.fast_stat_mut(i);
            s.peak = s.peak.max(s.current);
        }
    }

    /// Gives the calling thread a grant: half of what is left of each
    /// stat's slack in this generation (rounded up), added to its budget
    /// (a budget of an older generation or another allocator is dropped).
    /// False when nothing is left to give.
    #[must_use]
    pub(crate) fn grant(&mut self) -> bool {
        BUDGET.with(|b| {
            // a budget of this generation, even if empty: the thread's
            // frees give it room
            let fresh = !b.valid(self.alloc_id, self.generation);
            if fresh {
                b.alloc.set(self.alloc_id);
                b.generation.set(self.generation);
                for r in &b.room {
                    r.set(0);
                }
            }
            if self.remaining == [0; FAST_STATS] {
                // nothing left to give: a retry helps only a fresh budget
                return fresh;
            }
            // the thread's key: its budget's address (unique among live
            // threads); a thread that is the only one to have taken grants
            // in this generation and asks again gets everything left (one
            // thread reaches a peak again exactly, with no device visit)
            let me = b as *const Budget as usize;
            let all = self.grantee == me;
            self.grantee = if self.grantee == 0 || all {
                me
            } else {
                usize::MAX
            };
            for (r, room) in self.remaining.iter_mut().zip(&b.room) {
                // half of what is left, rounded up (never negative)
                let g = if all {
                    *r
                } else {
                    ((*r as u64 + 1) >> 1) as i64
                };
                *r -= g;
                room.set(room.get() + g);
            }
            true
        })
    }

    /// [`Self::grant`] for a free refused for its budget: a free increases
    /// only the inactive-split stats, so when one of them has nothing left
    /// a grant cannot help (false, nothing granted).
    #[must_use]
    pub(crate) fn grant_for_free(&mut self) -> bool {
        let i = idx(Arr::InactiveSplit, StatType::Aggregate);
        let j = idx(Arr::InactiveSplitBytes, StatType::Aggregate);
        if self.remaining[i..i + 3].contains(&0) || self.remaining[j..j + 3].contains(&0) {
            return false;
        }
        self.grant()
    }

    /// The shard of `s` (assigned now if new).
    pub(crate) fn shard_of(&mut self, s: B::Stream) -> usize {
        self.router.shard(s)
    }
}
