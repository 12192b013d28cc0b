//! The engine's state and the operations that change it: `malloc` (the OOM
//! ladder), `free`, `empty_cache` and the configuration. Everything here runs
//! under the allocator's lock; the bookkeeping each step relies on lives in
//! its own module (blocks, free sets, pools, segments, events, placement,
//! reclaim, capture).
#![forbid(unsafe_code)]

use crate::backend::{Backend, NodeOf};
use crate::config::{AllocatorConfig, CaptureReuse, Placement};
use crate::engine::accounting::StatSink;
use crate::engine::addr_table::Live;
use crate::engine::block::{BState, BlockId, Blocks};
use crate::engine::capture::{CaptureState, Deferred, MallocCtx};
use crate::engine::events::EventState;
use crate::engine::history::{History, StreamNames, TraceAction};
use crate::engine::pools::{DEFAULT_POOL, PoolIdx, Pools};
use crate::engine::rounding::{
    MAX_REQUEST, MIN_BLOCK_SIZE, SMALL_SIZE, allocation_size, round_size,
};
use crate::engine::segments::{NewSegment, Phys, ReleaseFailures, Segments};
use crate::engine::shard::{Router, SHARDS};
use crate::engine::unlocked::{DeviceCall, InFlight, Rung};
use crate::error::{Error, OomReport};
use crate::stats::{DeviceStats, StatType};

/// Parameters of one allocation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params<S> {
    pub stream: S,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// The rounded block size.
    pub size: u64,
    /// The size of a new segment for it.
    pub alloc_size: u64,
    pub pool: PoolIdx,
    pub small: bool,
}

/// How `malloc` ended, when it did not fail with an error.
pub(crate) enum AllocOutcome<S> {
    /// The address handed out.
    Ok(u64),
    /// Out of memory; the caller reports it after dropping the lock.
    Oom {
        report: Box<OomReport>,
        /// The segment exceeds the device (or the memory fraction) itself.
        never_fits: bool,
    },
    /// Not ended yet: the device call of a new fixed segment is to be made
    /// with the lock released (`release_lock_on_device_malloc`), then
    /// [`Inner::resume_malloc`] goes on (`unlocked.rs`).
    Call(Box<DeviceCall<S>>),
}

/// What [`Inner::free`] does once its fallible part succeeded.
enum FreePlan<N> {
    /// Back to the pool now.
    Now,
    /// Back to the pool now, during a capture (the free is logged for
    /// cross-stream reuse).
    InCapture,
    /// Deferred during capture with these free markers (empty: until the
    /// capture ends).
    Defer(Vec<N>),
    /// Pending until the end-of-life events staged for it complete.
    Events,
}

/// The device-memory budget.
pub(crate) struct Limits {
    /// The device's total memory.
    pub total_memory: u64,
    /// `set_per_process_memory_fraction`.
    pub memory_fraction: f64,
    /// The reserved-bytes cap the fraction sets (`None` at 1.0).
    pub allowed_max: Option<u64>,
}

impl Limits {
    fn new(total_memory: u64, memory_fraction: f64) -> Self {
        let mut l = Self {
            total_memory,
            memory_fraction,
            allowed_max: None,
        };
        l.set_fraction(memory_fraction);
        l
    }

    fn set_fraction(&mut self, f: f64) {
        self.memory_fraction = f;
        self.allowed_max = (f < 1.0).then_some((f * self.total_memory as f64) as u64);
    }
}

/// The engine's state for one device.
pub(crate) struct Inner<B: Backend> {
    /// Every block, one part per shard (the parts are here only while the
    /// device holds every shard, see `shard/`).
    pub(super) blocks: Blocks<B::Stream>,
    pub(super) pools: Pools<B::Stream>,
    pub(super) segments: Segments<Phys<B>, B::Stream>,
    /// Handed-out blocks by address.
    pub(super) live: Live,
    pub(super) stats: DeviceStats,
    pub(super) config: AllocatorConfig,
    pub(super) events: EventState<B>,
    pub(super) capture: CaptureState<B::Stream, NodeOf<B>>,
    pub(super) limits: Limits,
    /// Memory history, `None` when off.
    pub(super) history: Option<Box<History>>,
    /// The history's names of the streams (`Inner::trace`).
    pub(super) trace_names: StreamNames<B::Stream>,
    /// Segments the current release path could not free.
    pub(super) release_failures: ReleaseFailures,
    /// Stream → shard.
    pub(super) router: Router<B::Stream>,
    /// Bumped at every configuration change (shards copy the config when
    /// it differs from theirs).
    pub(super) config_gen: u64,
    /// A block changed stream to one of another shard than its part's
    /// (idle-stream reuse, cross-stream capture reuse, expandable
    /// unmapping): the fast path stays off from then on.
    pub(super) foreign: bool,
    /// Expandable segments were on at some point (some may remain): the
    /// fast path stays off from then on.
    pub(super) ever_expandable: bool,
    /// The fast path was on at the last check-out (parts may be out);
    /// while off, the device path skips check-in and check-out.
    pub(super) fast_on: bool,
    /// The shards holding anything (held by the device path).
    pub(super) occupied: u32,
    /// Several threads run fast operations at once (two threads' fast
    /// operations took turns on the shared mirror, `Logging::Shared`,
    /// operation by operation): the shards log from then on (sticky).
    pub(super) multi_thread: bool,
    /// The times the shared mirror was handed from one thread to another
    /// (`CachingAllocator::handover`).
    pub(super) handovers: u64,
    /// Short turns on the shared mirror in a row (`shard::SHORT_TURN`).
    pub(super) short_turns: u32,
    /// The number the next flushed window of stat logs gets
    /// (`stat_log::Folds`).
    pub(super) windows_out: u64,
    /// The number of the next window to fold into `stats` (all before it
    /// are folded).
    pub(super) windows_folded: u64,
    /// How far cachalot's expandable mode lets reserved memory pass the
    /// allocated peak before pages recycle.
    pub(super) recycling: crate::engine::expandable::Recycling,
    /// Blocks lent to another stream so far (`Self::lend_block`).
    pub(super) lent: u64,
    /// Of those, the ones that made the borrowing stream wait for a fence.
    pub(super) lent_waits: u64,
    /// Sees every segment event (`pool_ops.rs`).
    pub(super) tracker: Option<crate::engine::SegmentTracker>,
    /// Device calls of new segments in flight with the lock released.
    pub(super) in_flight: InFlight,
}

impl<B: Backend> Inner<B> {
    pub fn new(config: AllocatorConfig, total_memory: u64) -> Self {
        let stats = DeviceStats {
            max_split_size: config.max_split_size_stat(),
            ..DeviceStats::default()
        };
        Self {
            blocks: Blocks::new(SHARDS),
            pools: Pools::default(),
            segments: Segments::default(),
            live: Live::new(SHARDS),
            stats,
            events: EventState::default(),
            capture: CaptureState::default(),
            limits: Limits::new(total_memory, config.per_process_memory_fraction),
            history: None,
            trace_names: StreamNames::default(),
            release_failures: ReleaseFailures::default(),
            router: Router::default(),
            config_gen: 0,
            foreign: false,
            ever_expandable: config.expandable_segments,
            fast_on: true,
            occupied: 0,
            multi_thread: false,
            handovers: 0,
            short_turns: 0,
            windows_out: 0,
            windows_folded: 0,
            recycling: Default::default(),
            lent: 0,
            lent_waits: 0,
            tracker: None,
            in_flight: InFlight::default(),
            config,
        }
    }

    /// The rounded sizes and pool of a request.
    fn params(&self, size: u64, stream: B::Stream, pool: PoolIdx) -> Params<B::Stream> {
        let rounded = round_size(size, &self.config);
        Params {
            stream,
            requested: size,
            size: rounded,
            alloc_size: allocation_size(rounded, &self.config),
            pool,
            small: rounded <= SMALL_SIZE,
        }
    }

    // ----- malloc -----

    /// The whole malloc sequence of spec 2.8: the cached block, else (during
    /// capture) another stream's, else the OOM ladder.
    pub fn malloc(
        &mut self,
        backend: &B,
        size: u64,
        stream: B::Stream,
    ) -> Result<AllocOutcome<B::Stream>, Error> {
        self.malloc_to(backend, size, stream, None)
    }

    /// [`Self::malloc`] into pool `to` when given (`pool_ops.rs`), else
    /// into the pool the registered captures route `stream` to.
    pub(super) fn malloc_to(
        &mut self,
        backend: &B,
        size: u64,
        stream: B::Stream,
        to: Option<PoolIdx>,
    ) -> Result<AllocOutcome<B::Stream>, Error> {
        debug_assert!(size > 0 && size < MAX_REQUEST);
        let mut ctx = MallocCtx::default();
        let capturing = self.capture.is_active();
        if !capturing {
            self.process_events(backend)?;
        } else if self.config.graph_capture_record_stream_reuse != CaptureReuse::Off {
            ctx = self.reclaim_in_capture(backend, stream)?;
        }
        let pool = match to {
            Some(pool) => pool,
            None if self.capture.is_active() => self.choose_pool(backend, stream, &ctx)?,
            None => DEFAULT_POOL,
        };
        let p = self.params(size, stream, pool);
        if let Some(id) = self.get_free_block(&p) {
            return Ok(AllocOutcome::Ok(self.alloc_found_block(id, &p)));
        }
        if to.is_none()
            && self.capture.is_active()
            && let Some(id) = self.cross_stream_reuse(backend, &p, &mut ctx)?
        {
            self.pools.pool_mut(p.pool, p.small).free.note_out(p.stream);
            return Ok(AllocOutcome::Ok(self.alloc_found_block(id, &p)));
        }
        let r = self.malloc_slow(backend, &p);
        self.drop_release_failures_on_err(r)
    }

    /// An allocation's outcome `r`: when it is an error, the release
    /// failures its ladder met are dropped, as at the ladder's end (the
    /// segments stay cached, warned about): a later `empty_cache` or
    /// `release_pool` must not report them as its own.
    pub(super) fn drop_release_failures_on_err<T>(
        &mut self,
        r: Result<T, Error>,
    ) -> Result<T, Error> {
        if r.is_err() {
            let _ = self.release_failures.take();
        }
        r
    }

    /// PyTorch's ladder: `alloc_block || (release_available && alloc_block)
    /// || (release_all && alloc_block)`, with garbage collection first and
    /// cachalot's idle-stream reuse before the device call.
    #[cold]
    fn malloc_slow(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<AllocOutcome<B::Stream>, Error> {
        if self.limits.allowed_max.is_some() && self.config.garbage_collection_threshold > 0.0 {
            self.garbage_collect(backend)?;
        }
        let mut found = None;
        if self.config.idle_stream_reuse && !self.capture.is_active() {
            found = self.take_idle_block(backend, p)?;
        }
        if found.is_none() {
            found = self.lend(backend, p);
        }
        if found.is_none() {
            match self.alloc_segment(backend, p)? {
                NewSegment::Got(id) => found = Some(id),
                NewSegment::None => {}
                NewSegment::Call(size) => return Ok(self.suspend(p, Rung::First, size)),
            }
        }
        self.ladder_after(backend, p, Rung::First, found)
    }

    /// The ladder's rungs after `done`'s device call, which got `found`
    /// (the same run, or the run resumed after a device call made with the
    /// lock released: then the state is read again, as PyTorch reads it
    /// after it takes its lock again).
    pub(super) fn ladder_after(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
        done: Rung,
        mut found: Option<BlockId>,
    ) -> Result<AllocOutcome<B::Stream>, Error> {
        if done == Rung::First {
            if found.is_none() {
                found = self.borrow_use_on_oom_block(p);
            }
            if found.is_none() && self.release_available_cached_blocks(backend, p)? {
                match self.alloc_after_release(backend, p)? {
                    NewSegment::Got(id) => found = Some(id),
                    NewSegment::None => {}
                    NewSegment::Call(size) => return Ok(self.suspend(p, Rung::Available, size)),
                }
            }
        }
        if done < Rung::All && found.is_none() && !self.capture.is_active() {
            match self.release_all_and_retry(backend, p)? {
                NewSegment::Got(id) => found = Some(id),
                NewSegment::None => {}
                NewSegment::Call(size) => return Ok(self.suspend(p, Rung::All, size)),
            }
        }
        // A segment the ladder could not release stays cached (warned
        // about); the allocation's outcome does not depend on it.
        let _ = self.release_failures.take();
        match found {
            Some(id) => Ok(AllocOutcome::Ok(self.alloc_found_block(id, p))),
            None => {
                self.stats.num_ooms += 1;
                let report = self.oom_report(backend, p);
                self.trace(TraceAction::Oom, report.device_free, p.alloc_size, p.stream);
                let cap = self.limits.allowed_max.unwrap_or(self.limits.total_memory);
                Ok(AllocOutcome::Oom {
                    report: Box::new(report),
                    never_fits: p.alloc_size > cap,
                })
            }
        }
    }

    /// A free block of another stream lent to `p` ([`Self::lend_block`])
    /// in cachalot's expandable mode, outside capture; `None` otherwise.
    /// Each search of the ladder's free blocks is followed by one, so that
    /// an OOM stays final (a release can make another stream's blocks
    /// free, and the same request must not then succeed at once).
    fn lend(&mut self, backend: &B, p: &Params<B::Stream>) -> Option<BlockId> {
        if self.moves_memory(backend) {
            self.lend_block(backend, p)
        } else {
            None
        }
    }

    /// The ladder's search of the cached blocks after a release: `p`'s own
    /// stream's free blocks, then another stream's ([`Self::lend`]).
    fn search_cached(&mut self, backend: &B, p: &Params<B::Stream>) -> Option<BlockId> {
        self.get_free_block(p).or_else(|| self.lend(backend, p))
    }

    /// The last rung: synchronize every event, then (fixing PyTorch
    /// #189504) search the free blocks again before releasing the cache,
    /// and again after it (`alloc_after_release`) before asking the
    /// device once more.
    fn release_all_and_retry(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<NewSegment, Error> {
        self.stats.num_alloc_retries += 1;
        self.synchronize_and_free_events(backend, None)?;
        if let Some(id) = self.search_cached(backend, p) {
            return Ok(NewSegment::Got(id));
        }
        self.release_default_pools(backend);
        self.release_freeable_private_pools(backend);
        self.alloc_after_release(backend, p)
    }

    /// The ladder's step after it released cached memory: a search of the
    /// free blocks, then the device. With fixed segments a release only
    /// removes whole free segments, so nothing new can fit (no search).
    /// With expandable segments it unmaps the whole free pages of free
    /// blocks and leaves their mapped edges as smaller free blocks, which
    /// may now fit where the block they were part of did not (one too
    /// large to split under `max_split_size_mb`): without the search the
    /// request would fail with OOM and the same request at once succeed
    /// (PyTorch 2.11 goes on to `alloc_block` only).
    fn alloc_after_release(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<NewSegment, Error> {
        if self.ever_expandable
            && let Some(id) = self.search_cached(backend, p)
        {
            return Ok(NewSegment::Got(id));
        }
        self.alloc_segment(backend, p)
    }

    /// Whether a block of `pool` of `b_size` bytes handed out for `size`
    /// is split.
    fn should_split(&self, pool: PoolIdx, small: bool, b_size: u64, size: u64) -> bool {
        let remaining = b_size - size;
        if self.no_split(pool) {
            return false;
        }
        // PyTorch 2.11: with expandable segments large blocks split as
        // small ones do (`should_split`)
        if small || self.expandable_in(pool) {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Hands out `id` for `p` (PyTorch's `alloc_found_block`), splitting off
    /// what it does not need; returns the address.
    fn alloc_found_block(&mut self, id: BlockId, p: &Params<B::Stream>) -> u64 {
        let st = StatType::of_pool(p.small);
        let b = &self.blocks[id];
        let already_split = b.is_split();
        // expandable blocks stay out of `inactive_split` (PyTorch 2.11)
        let expandable = b.expandable;
        if self.should_split(b.pool, b.small, b.size, p.size) {
            let rem_size = b.size - p.size;
            let rid = self.blocks.split(id, p.size);
            self.insert_free(rid);
            if !expandable {
                if already_split {
                    self.stats.on_split_split(st, p.size);
                } else {
                    self.stats.on_split_segment(st, rem_size);
                }
            }
        } else if already_split && !expandable {
            self.stats.on_take_split(st, b.size);
        }
        let oversize = self.blocks[id].size >= self.config.max_split_size;
        let b = &mut self.blocks[id];
        b.state = BState::Allocated;
        b.requested = p.requested;
        b.oversize = oversize;
        let (addr, size) = (b.addr, b.size);
        self.live.insert(addr, id);
        self.stats.on_alloc(st, size, p.requested, oversize);
        if self.history.is_some() {
            // PyTorch's size: the request's
            self.trace(TraceAction::Alloc, addr, p.requested, p.stream);
        }
        addr
    }

    // ----- free -----

    /// The caller's free of `addr`: the block returns to its pool now, or
    /// once its uses on other streams are over (events, or during capture
    /// its free markers). Atomic: everything that can fail (recording the
    /// end-of-life events, asking the capture graph) happens before any
    /// change but the live map's, which a failure undoes: an error leaves
    /// the allocation live and unchanged, and a retry frees it.
    pub fn free(&mut self, backend: &B, addr: u64) -> Result<(), Error> {
        let Some(id) = self.live.remove(addr) else {
            return Err(self.classify_bad_pointer(addr, true));
        };
        let b = &self.blocks[id];
        if b.stream_uses.is_empty() && b.capture_uses.is_empty() && !self.capture.is_active() {
            // the common case: nothing can fail
            self.retire(id);
            self.free_block(id);
            return Ok(());
        }
        self.free_with_uses(backend, addr, id)
    }

    /// [`Self::free`] of a block used on other streams, or during a
    /// capture: the fallible part first; on its failure the block goes back
    /// to the live map, unchanged.
    #[cold]
    fn free_with_uses(&mut self, backend: &B, addr: u64, id: BlockId) -> Result<(), Error> {
        let plan = match self.prepare_free(backend, id) {
            Ok(plan) => plan,
            Err(e) => {
                self.live.insert(addr, id);
                return Err(e);
            }
        };
        // ----- nothing below fails -----
        self.retire(id);
        match plan {
            FreePlan::Now => {
                // uses recorded during an earlier capture end with it
                self.blocks[id].capture_uses.clear();
                self.free_block(id);
            }
            FreePlan::InCapture => {
                let id = self.free_block(id);
                self.note_capture_free(backend, id);
            }
            FreePlan::Defer(markers) => {
                let b = &mut self.blocks[id];
                b.state = BState::Pending;
                let stream = b.stream;
                self.capture.deferred.push(Deferred {
                    block: id,
                    stream,
                    markers,
                });
            }
            FreePlan::Events => {
                let b = &mut self.blocks[id];
                b.state = BState::Pending;
                b.capture_uses.clear();
                self.commit_staged_events(id);
            }
        }
        Ok(())
    }

    /// The caller gave block `id` up: traced, and no longer counted as
    /// allocated (it stays active until it is back in its pool).
    #[inline(always)]
    fn retire(&mut self, id: BlockId) {
        if self.history.is_some() {
            let b = &self.blocks[id];
            let (a, sz, s) = (b.addr, b.requested, b.stream);
            self.trace(TraceAction::FreeRequested, a, sz, s);
        }
        let b = &mut self.blocks[id];
        debug_assert_eq!(b.state, BState::Allocated);
        let (st, size) = (b.stat_type(), b.size);
        let oversize = std::mem::take(&mut b.oversize);
        self.stats.on_free_requested(st, size, oversize);
    }

    /// The fallible part of [`Self::free`], before any change the caller
    /// can observe: the block's end-of-life events recorded (staged), or its
    /// free markers taken, or (`cross_stream`) free neighbours adopted.
    fn prepare_free(&mut self, backend: &B, id: BlockId) -> Result<FreePlan<NodeOf<B>>, Error> {
        let b = &self.blocks[id];
        let no_other_uses = b.stream_uses.is_empty() && b.capture_uses.is_empty();
        if !self.capture.is_active() {
            if no_other_uses || b.stream_uses.is_empty() {
                return Ok(FreePlan::Now);
            }
            self.stage_events(backend, id)?;
            return Ok(FreePlan::Events);
        }
        if no_other_uses {
            // Adopting free neighbours only re-keys free blocks (the merge
            // itself happens in `free_block`).
            self.adopt_free_neighbours(backend, id, &mut MallocCtx::default())?;
            return Ok(FreePlan::InCapture);
        }
        let markers = if self.config.graph_capture_record_stream_reuse != CaptureReuse::Off {
            self.free_markers(backend, id)?
        } else {
            Vec::new()
        };
        Ok(FreePlan::Defer(markers))
    }

    /// Returns a block to its pool, merging with free neighbours of its
    /// stream (PyTorch's `free_block`); returns the merged block.
    pub(super) fn free_block(&mut self, mut id: BlockId) -> BlockId {
        let b = &self.blocks[id];
        let st = b.stat_type();
        let (orig_size, requested, stream) = (b.size, b.requested, b.stream);
        if self.history.is_some() {
            let a = b.addr;
            self.trace(TraceAction::FreeCompleted, a, requested, stream);
        }
        let (mut split_count, mut split_bytes) = (0i64, 0i64);
        // Neighbours merge only when free and of the same stream (blocks of one
        // segment differ in stream only after cross-stream capture reuse).
        let mergeable = |blocks: &Blocks<B::Stream>, n: BlockId| {
            n != crate::engine::block::NIL
                && blocks[n].state == BState::Free
                && blocks[n].stream == stream
        };
        let prev = self.blocks[id].prev;
        if mergeable(&self.blocks, prev) {
            // the previous block absorbs this one
            self.remove_free(prev);
            split_count -= 1;
            split_bytes -= self.blocks[prev].size as i64;
            self.blocks.absorb_next(prev);
            id = prev;
        }
        let next = self.blocks[id].next;
        if mergeable(&self.blocks, next) {
            self.remove_free(next);
            split_count -= 1;
            split_bytes -= self.blocks.absorb_next(id) as i64;
        }
        let b = &mut self.blocks[id];
        // the last request stays with the free block, as PyTorch's
        // `requested_size` does (its snapshots show it on inactive blocks)
        b.requested = requested;
        b.event_count = 0;
        if b.expandable {
            let stamp = self.events.stamp();
            self.blocks.set_freed_at(id, stamp);
        }
        self.insert_free_back(id);
        let b = &self.blocks[id];
        if b.is_split() {
            split_count += 1;
            split_bytes += b.size as i64;
        }
        if !b.expandable {
            self.stats.on_inactive_split(st, split_count, split_bytes);
        }
        self.stats.on_inactive(st, orig_size, requested);
        id
    }

    // ----- cache and configuration -----

    /// Releases every whole free segment that may go (after waiting for
    /// pending events outside capture) and, outside capture, the pooled
    /// events.
    /// A segment whose device free fails stays cached and the others are
    /// still released; the failures come back as one
    /// [`Error::ReleaseFailed`].
    pub fn empty_cache(&mut self, backend: &B) -> Result<(), Error> {
        let r = self.release_cached_blocks(backend);
        let released = self.release_failures.take();
        r?;
        if !self.capture.is_active() {
            self.events.destroy_pooled(backend)?;
        }
        released
    }

    /// Applies a config string; on error nothing changes.
    pub fn set_config(&mut self, s: &str, has_vmm: bool) -> Result<(), Error> {
        let mut c = self.config.clone();
        c.apply(s)?;
        if c.expandable_segments && c.expandable_segments_given && !has_vmm {
            return Err(crate::config::expandable_unsupported().into());
        }
        c.resolve_expandable(has_vmm);
        // The reuse mode decides what a free in a capture records for later
        // reuse: switching it mid-capture let a block freed under `off`
        // (no markers) be taken by another capturing stream unordered (found
        // by the engine fuzz target). Nothing changes on this error.
        if self.capture.is_active()
            && c.graph_capture_record_stream_reuse != self.config.graph_capture_record_stream_reuse
        {
            return Err(crate::error::CaptureError::NotAllowedDuringCapture(
                "changing graph_capture_record_stream_reuse",
            )
            .into());
        }
        self.config = c;
        self.config_gen += 1;
        self.ever_expandable |= self.config.expandable_segments;
        self.limits
            .set_fraction(self.config.per_process_memory_fraction);
        if self.config.placement == Placement::PyTorch {
            self.wake_dormant();
        }
        Ok(())
    }

    /// `set_per_process_memory_fraction`.
    pub fn set_memory_fraction(&mut self, f: f64) -> Result<(), Error> {
        if !(0.0..=1.0).contains(&f) || f.is_nan() {
            return Err(Error::InvalidArgument(format!(
                "memory fraction {f} is outside [0, 1]"
            )));
        }
        self.limits.set_fraction(f);
        // kept in the config too, so that a later `set_config` that does
        // not name the key leaves it as set here
        self.config.per_process_memory_fraction = f;
        self.config_gen += 1;
        Ok(())
    }
}
