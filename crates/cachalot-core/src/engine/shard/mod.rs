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
//! moves the parts back into the engine's `Inner`
//! ([`Inner::check_in`](crate::engine::state::Inner::check_in)), runs the
//! engine's code unchanged, and hands the parts out again
//! ([`Inner::check_out`](crate::engine::state::Inner::check_out)). So the
//! engine sees exactly the state it would see without shards, and a single
//! thread gets exactly the results it would get without them.
//!
//! Stats stay exact, peaks included, with no shared write on the fast
//! path: a fast operation appends its stat transitions, time-stamped, to
//! its shard's log, and the device replays the logs in time order
//! (`stat_log/`).
#![forbid(unsafe_code)]

mod checkout;
mod mirror;
mod route;

use crate::config::{AllocatorConfig, Placement};
use crate::engine::addr_table::{AddrTable, Slot};
use crate::engine::block::{BState, BlockId, NIL, Slab, part_of};
use crate::engine::free_set::{Back, Found, FreeSet, Peeked};
use crate::engine::placement::FitRule;
use crate::engine::pools::DEFAULT_POOL;
use crate::engine::rounding::{MIN_BLOCK_SIZE, SMALL_SIZE, round_size};
use crate::engine::stat_log::{AllocTransitions, Entry, FreeTransitions, LOG_CAP, Rec, now};
use crate::stats::StatType;

pub(crate) use mirror::{Logging, Mirror, SHORT_TURN, SHORT_TURNS, SharedMirror};
pub(crate) use route::{
    DEVICE, FAST, FLUSH, HINTS, PATHS, Router, count_path, hint_get, hint_set, hint_shard,
    owner_get, owner_set, stream_key,
};

/// Number of shards (and of parts of the slab and the live map). Streams
/// are assigned to shards round-robin in the order they first allocate, so
/// up to this many streams never share a shard.
pub(crate) const SHARDS: usize = 16;

/// What a shard may do on its own, refreshed at every check-out.
pub(crate) struct FastView {
    /// The fast path is allowed: no capture, no pending events or deferred
    /// frees, no memory history, no garbage collection, no expandable
    /// segments turned off after use, no block outside the part of its
    /// stream's shard.
    pub ok: bool,
    /// The configuration (cloned only when it changed).
    pub config: AllocatorConfig,
    /// `Inner::config_gen` of `config`.
    pub config_gen: u64,
    /// The default pools' GC clocks `[large, small]` (constant while the
    /// fast path is allowed: the clock runs only with GC on).
    pub gc_calls: [u64; 2],
    /// Where the fast operations' stat transitions go.
    pub logging: Logging,
}

/// Why a fast operation did not run (nothing was changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Miss {
    /// This shard cannot serve it: the device must.
    Device,
    /// A free of an address this shard does not hold (another may).
    Absent,
    /// The shard's stat log is full: once the device has taken it, the
    /// operation can run here.
    Full,
    /// The shared mirror ([`Logging::Shared`]) is another thread's. Once
    /// the device has handed it over, or the shards log, the operation can
    /// run here.
    Thread,
}

/// One shard: its parts of the engine's structures, and what it may do.
pub(crate) struct Shard<S> {
    /// The blocks of the segments of this shard's streams.
    pub slab: Slab<S>,
    /// The live (handed-out) blocks of `slab`, by address.
    pub live: AddrTable,
    /// The default pools' free sets of this shard's streams `[large, small]`.
    pub free: [FreeSet<S>; 2],
    /// The stat transitions of its fast operations since the device last
    /// took them (capacity [`LOG_CAP`], never grown by the fast path).
    pub log: Vec<Entry>,
    /// A full log waiting for the device to take it (else empty; the same
    /// capacity): a log that fills up goes here, and the fast path goes on
    /// with this one's empty buffer, without waiting.
    pub full: Vec<Entry>,
    /// A log was set aside just now: the caller asks the device to take
    /// it if the device lock is free (`CachingAllocator::offer_logs`).
    pub rotated: bool,
    /// While the shard is the only one out ([`Logging::Solo`]): the sums
    /// of its transitions since check-out, folded into the device's stats
    /// at check-in.
    pub mirror: Mirror,
    /// What the fast path may do.
    pub view: FastView,
    /// The free stamp of this shard's latest fast free of an expandable
    /// block (`EventState::clock` at check-out, then counted up; the device
    /// takes the highest of the shards' at check-in, so a completion fence
    /// recorded after a free is stamped at least as high as it).
    pub free_clock: u64,
}

impl<S: Copy + Ord> Shard<S> {
    /// Shard `part`, empty, with the fast path off until the first check-out.
    pub fn new(part: usize, config: &AllocatorConfig) -> Self {
        Self {
            slab: Slab::new(part),
            live: AddrTable::default(),
            free: [FreeSet::default(), FreeSet::default()],
            log: Vec::with_capacity(LOG_CAP),
            full: Vec::with_capacity(LOG_CAP),
            rotated: false,
            mirror: Mirror::default(),
            view: FastView {
                ok: false,
                config: config.clone(),
                config_gen: u64::MAX,
                gc_calls: [0; 2],
                logging: Logging::Log,
            },
            free_clock: 0,
        }
    }

    /// A cache hit of `size` bytes on `stream`, on this shard alone: the
    /// same block, split and stats as the engine's `malloc` would give
    /// (`get_free_block` and `alloc_found_block` when no capture, event,
    /// history, GC or expandable segment is involved). `shared`: the
    /// allocator's shared mirror ([`Logging::Shared`]). An error: nothing
    /// was changed.
    #[inline]
    pub fn try_alloc(&mut self, size: u64, stream: S, shared: &SharedMirror) -> Result<u64, Miss> {
        // (one copy per way of logging: the solo path stays as it was)
        if self.view.logging == Logging::Shared {
            self.alloc_with::<true>(size, stream, shared)
        } else {
            self.alloc_with::<false>(size, stream, shared)
        }
    }

    /// [`Self::try_alloc`], writing to the shared mirror if `SHARED`.
    #[inline(always)]
    fn alloc_with<const SHARED: bool>(
        &mut self,
        size: u64,
        stream: S,
        shared: &SharedMirror,
    ) -> Result<u64, Miss> {
        if !self.view.ok {
            return Err(Miss::Device);
        }
        if self.log.len() == LOG_CAP && !self.log_rotate() {
            return Err(Miss::Full);
        }
        let cfg = &self.view.config;
        let rounded = round_size(size, cfg);
        let small = rounded <= SMALL_SIZE;
        let fit = FitRule::of(cfg);
        if cfg.expandable_segments {
            return self.alloc_expandable::<SHARED>(size, rounded, stream, shared);
        }
        let free = &self.free[small as usize];
        let Some(peeked) = free.peek_first_at_least(stream, rounded, |b| fit.accepts(rounded, b))
        else {
            return Err(Miss::Device);
        };
        let shared = Self::shared_sink::<SHARED>(shared)?;
        self.alloc_found(peeked, size, rounded, stream, shared)
    }

    /// The shared mirror, claimed by this thread, while the shards write
    /// there ([`Logging::Shared`]; else `None`); [`Miss::Thread`] if
    /// another thread owns it.
    #[inline(always)]
    fn shared_sink<const SHARED: bool>(
        shared: &SharedMirror,
    ) -> Result<Option<&SharedMirror>, Miss> {
        if !SHARED {
            return Ok(None);
        }
        shared.claim().map(Some).ok_or(Miss::Thread)
    }

    /// [`Self::try_alloc`] with expandable segments: the engine's
    /// `get_free_block_expandable` (blocks found by the size they can grow
    /// to).
    #[inline(never)]
    fn alloc_expandable<const SHARED: bool>(
        &mut self,
        size: u64,
        rounded: u64,
        stream: S,
        shared: &SharedMirror,
    ) -> Result<u64, Miss> {
        let small = rounded <= SMALL_SIZE;
        let free = &self.free[small as usize];
        let Some(found) = expandable_best_fit(free, &self.slab, stream, rounded) else {
            return Err(Miss::Device);
        };
        if !FitRule::of(&self.view.config).accepts(rounded, found.size) {
            return Err(Miss::Device);
        }
        let shared = Self::shared_sink::<SHARED>(shared)?;
        self.alloc_found(ByKey(found), size, rounded, stream, shared)
    }

    /// Hands out the block `how` found for a request of `size` bytes
    /// (`rounded`) on `stream`: the rest of [`Self::try_alloc`] (the
    /// engine's `alloc_found_block`), one copy per way of taking it;
    /// `shared`: the shared mirror, claimed ([`Self::shared_sink`]).
    #[inline(always)]
    fn alloc_found<T: Take<S>>(
        &mut self,
        how: T,
        size: u64,
        rounded: u64,
        stream: S,
        shared: Option<&SharedMirror>,
    ) -> Result<u64, Miss> {
        let cfg = &self.view.config;
        let small = rounded <= SMALL_SIZE;
        let id = how.found().id;
        if part_of(id) != self.slab.part() {
            return Err(Miss::Device);
        }
        let b = &self.slab[id];
        debug_assert!(b.state == BState::Free && b.pool == DEFAULT_POOL);
        let st = StatType::of_pool(small);
        let split = should_split(cfg, b.small, b.size, rounded);
        let already_split = b.is_split();
        let final_size = if split { rounded } else { b.size };
        let oversize = final_size >= cfg.max_split_size;
        let expandable = T::EXPANDABLE && b.expandable;
        let tr = AllocTransitions {
            st,
            split,
            already_split,
            block_size: b.size,
            rounded,
            requested: size,
            oversize,
            expandable,
        };
        // ----- commit: nothing below fails -----
        let free = &mut self.free[small as usize];
        how.take(free, stream, b.dormant_key());
        let gc = self.view.gc_calls[small as usize];
        self.slab[id].dormant = false;
        if split {
            let rid = self.slab.split(id, rounded);
            if expandable {
                // the remainder keeps the parent's free stamp
                let stamp = self.slab.freed_at(id);
                self.slab.set_freed_at(rid, stamp);
            }
            let r = &mut self.slab[rid];
            r.gc_base = gc;
            let rest = Found {
                size: r.size,
                addr: r.addr,
                id: rid,
            };
            how.insert_rest(free, stream, rest);
        }
        let b = &mut self.slab[id];
        b.state = BState::Allocated;
        b.requested = size;
        b.oversize = oversize;
        let addr = b.addr;
        self.live.insert(addr, id);
        if self.view.logging != Logging::Solo {
            // (alone, the shard a free tries first is this one anyway)
            owner_set(addr, self.slab.part());
        }
        self.log(Rec::Alloc(tr), shared);
        Ok(addr)
    }

    /// The caller's free of `addr`, on this shard alone, when `addr` is a
    /// live block of this shard with no uses on other streams: the same
    /// merges, filing and stats as the engine's `free` and `free_block`.
    /// `shared`: as for [`Self::try_alloc`]. An error: nothing was changed.
    #[inline]
    pub fn try_free(&mut self, addr: u64, shared: &SharedMirror) -> Result<(), Miss> {
        if self.view.logging == Logging::Shared {
            self.free_with::<true>(addr, shared)
        } else {
            self.free_with::<false>(addr, shared)
        }
    }

    /// [`Self::try_free`], writing to the shared mirror if `SHARED`.
    #[inline(always)]
    fn free_with<const SHARED: bool>(
        &mut self,
        addr: u64,
        shared: &SharedMirror,
    ) -> Result<(), Miss> {
        if !self.view.ok {
            return Err(Miss::Device);
        }
        // (an address held here but not servable here goes to the device
        // at once; one not held here may be another shard's)
        let Some((slot, id)) = self.live.find(addr) else {
            return Err(Miss::Absent);
        };
        if self.log.len() == LOG_CAP && !self.log_rotate() {
            return Err(Miss::Full);
        }
        let b = &self.slab[id];
        if !b.stream_uses.is_empty()
            || !b.capture_uses.is_empty()
            || b.pool != DEFAULT_POOL
            || b.state != BState::Allocated
        {
            return Err(Miss::Device);
        }
        let expandable = b.expandable;
        let shared = Self::shared_sink::<SHARED>(shared)?;
        if expandable {
            self.free_found::<true>(slot, id, shared);
        } else {
            self.free_found::<false>(slot, id, shared);
        }
        Ok(())
    }

    /// The rest of [`Self::try_free`] (the engine's `free_block`) for live
    /// block `id` at `slot` of the live map, one copy for blocks of
    /// expandable segments (`EXPANDABLE`: stamped, no `inactive_split`
    /// change) and one for the others; `shared` as for
    /// [`Self::alloc_found`].
    #[inline(always)]
    fn free_found<const EXPANDABLE: bool>(
        &mut self,
        slot: Slot,
        id: BlockId,
        shared: Option<&SharedMirror>,
    ) {
        let expandable = EXPANDABLE;
        let b = &self.slab[id];
        let (stream, small, size, requested, oversize) =
            (b.stream, b.small, b.size, b.requested, b.oversize);
        // the stream's set is here: blocks live in the part of their
        // stream's shard (no block changed shard, or the fast path is off),
        // and a stream's set exists from its first block on
        debug_assert!(self.free[small as usize].has_stream(stream));
        let st = StatType::of_pool(small);
        // the merges, planned
        let slab = &self.slab;
        let (prev, next) = (b.prev, b.next);
        let (mp, mn) = (mergeable(slab, prev, stream), mergeable(slab, next, stream));
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
        if expandable {
            // expandable blocks stay out of `inactive_split` (PyTorch 2.11)
            (split_count, split_bytes) = (0, 0);
        }
        let tr = FreeTransitions {
            st,
            size,
            oversize,
            requested,
            split_count,
            split_bytes,
        };
        // ----- commit: nothing below fails -----
        let removed = self.live.remove_at(slot);
        debug_assert_eq!(removed, id);
        self.slab[id].oversize = false;
        let free = &mut self.free[small as usize];
        let mut id = id;
        if mp {
            unfile(free, &mut self.slab, stream, prev);
            self.slab.absorb_next(prev);
            id = prev;
        }
        if mn {
            unfile(free, &mut self.slab, stream, next);
            self.slab.absorb_next(id);
        }
        if expandable {
            // the engine's free stamp (`Blocks::freed_at`): this shard's
            // clock, merged into the device's at check-in
            self.free_clock += 1;
            self.slab.set_freed_at(id, self.free_clock);
        }
        let b = &mut self.slab[id];
        // the last request stays with the free block (see `free_block`)
        b.requested = requested;
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
        self.log(Rec::Free(tr), shared);
    }

    /// Sets the full log aside when nothing waits there yet (false: both
    /// are full, the device must take them first).
    #[inline]
    fn log_rotate(&mut self) -> bool {
        if !self.full.is_empty() {
            return false;
        }
        std::mem::swap(&mut self.log, &mut self.full);
        self.rotated = true;
        true
    }

    /// Records a fast operation's transitions ([`Logging`]): into the
    /// shared mirror when given (claimed before the commit), into the
    /// shard's own while it is the only one out, else appended to the log
    /// (room was checked before the commit) with a time stamp.
    #[inline(always)]
    fn log(&mut self, rec: Rec, shared: Option<&SharedMirror>) {
        if let Some(m) = shared {
            m.add(&rec);
            return;
        }
        if self.view.logging == Logging::Solo {
            self.mirror.add(&rec);
            return;
        }
        debug_assert!(self.log.len() < LOG_CAP);
        self.log.push(Entry::of(&rec, now()));
    }
}

/// How a hit takes its block out of the shard's free set (of streams `S`),
/// and files the split remainder.
trait Take<S: Copy + Ord> {
    /// Whether the block may be of an expandable segment.
    const EXPANDABLE: bool;
    /// The block found.
    fn found(&self) -> Found;
    /// Takes it out (`dormant`: its dormant key).
    fn take(&self, free: &mut FreeSet<S>, stream: S, dormant: Option<u64>);
    /// Files the split remainder `rest` (its size, address and id).
    fn insert_rest(&self, free: &mut FreeSet<S>, stream: S, rest: Found);
}

/// The best fit of fixed segments: a [`Peeked`] block.
impl<S: Copy + Ord> Take<S> for Peeked {
    const EXPANDABLE: bool = false;
    #[inline(always)]
    fn found(&self) -> Found {
        self.found
    }
    #[inline(always)]
    fn take(&self, free: &mut FreeSet<S>, _stream: S, _dormant: Option<u64>) {
        free.take_peeked(self)
    }
    #[inline(always)]
    fn insert_rest(&self, free: &mut FreeSet<S>, _stream: S, rest: Found) {
        free.insert_peeked(self, rest.size, rest.addr, rest.id)
    }
}

/// A block found by its key (the expandable best fit).
struct ByKey(Found);

impl<S: Copy + Ord> Take<S> for ByKey {
    const EXPANDABLE: bool = true;
    #[inline(always)]
    fn found(&self) -> Found {
        self.0
    }
    #[inline(always)]
    fn take(&self, free: &mut FreeSet<S>, stream: S, dormant: Option<u64>) {
        let removed = free.remove(stream, self.0.size, self.0.addr, dormant);
        debug_assert_eq!(removed, Some(self.0.id));
        free.note_out(stream);
    }
    #[inline(always)]
    fn insert_rest(&self, free: &mut FreeSet<S>, stream: S, rest: Found) {
        free.insert(stream, rest.size, rest.addr, rest.id, None)
    }
}

/// The engine's `get_free_block_expandable` best fit on a shard's free
/// set: the smallest block of `stream` of at least `size` bytes, then, while
/// it is a block of an expandable segment, the next larger one when that
/// can grow to less (its size plus an unmapped block after it). `None`: no
/// block, or one of another part on the way (the device decides then).
fn expandable_best_fit<S: Copy + Ord>(
    free: &FreeSet<S>,
    slab: &Slab<S>,
    stream: S,
    size: u64,
) -> Option<Found> {
    let part = slab.part();
    let grows = |id: BlockId| {
        let b = &slab[id];
        b.size
            + if b.next != NIL && slab[b.next].state == BState::Unmapped {
                slab[b.next].size
            } else {
                0
            }
    };
    let mut it = free.first_at_least(stream, size)?;
    if part_of(it.id) != part {
        return None;
    }
    // (a block that cannot grow is the best already: every later one is
    // at least as large)
    while slab[it.id].expandable && grows(it.id) > it.size {
        match free.next_after(stream, it.size, it.addr) {
            Some(n) if part_of(n.id) != part => return None,
            Some(n) if grows(n.id) < grows(it.id) => it = n,
            _ => break,
        }
    }
    Some(it)
}

/// Whether neighbour `n` merges into a block of `stream` being freed: a
/// free block of the same stream (inlined: the free path's hottest test).
#[inline(always)]
fn mergeable<S: Copy + Ord>(slab: &Slab<S>, n: BlockId, stream: S) -> bool {
    n != NIL && slab[n].state == BState::Free && slab[n].stream == stream
}

/// Takes free block `id` of `stream` out of `free` before a merge (the
/// shard's `Inner::remove_free`).
#[inline(always)]
fn unfile<S: Copy + Ord>(free: &mut FreeSet<S>, slab: &mut Slab<S>, stream: S, id: BlockId) {
    let b = &slab[id];
    let r = free.remove(stream, b.size, b.addr, b.dormant_key());
    debug_assert_eq!(r, Some(id));
    slab[id].dormant = false;
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
