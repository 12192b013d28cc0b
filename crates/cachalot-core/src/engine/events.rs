//! Stream ordering: the event pool and the per-stream event queues,
//! `record_stream`, `process_events`, and the deferred frees of blocks whose
//! uses on other streams are not over yet.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use crate::backend::Backend;
use crate::engine::block::{BState, BlockId};
use crate::engine::capture::Deferred;
use crate::engine::pools::PoolIdx;
use crate::engine::state::Inner;
use crate::error::{BackendError, Error};

/// An end-of-life event of a block on one stream.
struct PendingEvent<E> {
    event: E,
    block: BlockId,
}

/// One stream's events in record order.
struct StreamEvents<B: Backend> {
    stream: B::Stream,
    queue: VecDeque<PendingEvent<B::Event>>,
}

/// The completion fences of one stream (cachalot's page recycling): events
/// recorded on it when recycling looks at its pages. A fence with stamp `f`
/// was recorded after every free stamped `f` or less, so once it completes
/// none of those blocks' uses on the stream is pending, however busy the
/// stream is with later work.
struct StreamFences<B: Backend> {
    stream: B::Stream,
    /// Fences not known to be complete, `(stamp, event)`, oldest first
    /// (they complete in this order: one stream runs its work in order).
    ring: VecDeque<(u64, B::Event)>,
    /// The stamp of the newest fence seen complete.
    done: u64,
    /// The stamp of the newest fence recorded.
    last: u64,
}

/// Most fences pending on one stream; past it a probe records none (the
/// blocks freed since are proven idle by a later fence, or waited for).
const FENCE_RING: usize = 16;

/// Most streams that keep fences ([`EventState::fences_of`]): with
/// [`FENCE_RING`], at most 1,024 fence events in all.
const FENCE_STREAMS: usize = 64;

/// The event pool and the queues of recorded end-of-life events.
pub(crate) struct EventState<B: Backend> {
    queues: Vec<StreamEvents<B>>,
    /// Completion fences per stream ([`StreamFences`]).
    fences: Vec<StreamFences<B>>,
    /// Frees of expandable blocks so far: the stamp of the latest.
    free_clock: u64,
    /// Events in all queues.
    outstanding: usize,
    /// Completed events kept for reuse.
    pool: Vec<B::Event>,
    /// Events recorded for a block that is not yet committed to them
    /// ([`Inner::stage_events`]).
    staged: Vec<(B::Stream, B::Event)>,
}

impl<B: Backend> Default for EventState<B> {
    fn default() -> Self {
        Self {
            queues: Vec::new(),
            fences: Vec::new(),
            free_clock: 0,
            outstanding: 0,
            pool: Vec::new(),
            staged: Vec::new(),
        }
    }
}

impl<B: Backend> EventState<B> {
    /// A pooled event, or a new one.
    fn get(&mut self, backend: &B) -> Result<B::Event, BackendError> {
        match self.pool.pop() {
            Some(e) => Ok(e),
            None => backend.create_event(),
        }
    }

    /// Queues `event`, recorded on `stream`, for `block`.
    fn push(&mut self, stream: B::Stream, event: B::Event, block: BlockId) {
        self.outstanding += 1;
        let e = PendingEvent { event, block };
        match self.queues.iter_mut().find(|q| q.stream == stream) {
            Some(q) => q.queue.push_back(e),
            None => self.queues.push(StreamEvents {
                stream,
                queue: VecDeque::from([e]),
            }),
        }
    }

    /// Events recorded and not yet seen complete.
    #[inline]
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Events in the queues, counted one by one (the invariant checker's
    /// cross-check of [`Self::outstanding`]).
    pub fn queued(&self) -> usize {
        self.queues.iter().map(|q| q.queue.len()).sum()
    }

    /// Destroys pooled events (empty_cache), going on past a failure; the
    /// first error is returned. [`Backend::destroy_event`] consumes the
    /// event: one the backend fails to destroy is left to the backend.
    pub fn destroy_pooled(&mut self, backend: &B) -> Result<(), Error> {
        let mut first: Result<(), Error> = Ok(());
        while let Some(e) = self.pool.pop() {
            if let Err(err) = backend.destroy_event(e)
                && first.is_ok()
            {
                first = Err(err.into());
            }
        }
        first
    }

    /// Destroys every event, queued or pooled (allocator dropped, after a
    /// device sync); the first error is returned, the rest still destroyed.
    pub fn destroy_all(&mut self, backend: &B) -> Result<(), Error> {
        let mut first: Result<(), Error> = Ok(());
        let queued = std::mem::take(&mut self.queues)
            .into_iter()
            .flat_map(|q| q.queue.into_iter().map(|e| e.event));
        let fences = std::mem::take(&mut self.fences)
            .into_iter()
            .flat_map(|f| f.ring.into_iter().map(|(_, e)| e));
        for ev in queued.chain(fences).chain(std::mem::take(&mut self.pool)) {
            if let Err(e) = backend.destroy_event(ev)
                && first.is_ok()
            {
                first = Err(e.into());
            }
        }
        self.outstanding = 0;
        first
    }
}

/// Completion fences (cachalot's page recycling): which free pages of a busy
/// stream may be unmapped without waiting for the stream.
impl<B: Backend> EventState<B> {
    /// The stamp of the latest free.
    pub fn clock(&self) -> u64 {
        self.free_clock
    }

    /// Takes a shard's clock (`Shard::free_clock`) into account: stamps
    /// given from now on are above it.
    pub fn observe_clock(&mut self, shard_clock: u64) {
        self.free_clock = self.free_clock.max(shard_clock);
    }

    /// The stamp of a block being freed now.
    pub fn stamp(&mut self) -> u64 {
        self.free_clock += 1;
        self.free_clock
    }

    /// The fences of `stream`, made when missing. At most
    /// [`FENCE_STREAMS`] streams keep fences: past it, those with none
    /// pending are forgotten, then the one probed least recently, its
    /// events destroyed (a program that makes a stream per request must
    /// not grow them without end). Forgetting is conservative: the
    /// stream's blocks wait for a new fence, or for the stream.
    fn fences_of(&mut self, backend: &B, stream: B::Stream) -> usize {
        match self.fences.iter().position(|f| f.stream == stream) {
            Some(i) => i,
            None => {
                if self.fences.len() >= FENCE_STREAMS {
                    self.fences.retain(|f| !f.ring.is_empty());
                }
                if self.fences.len() >= FENCE_STREAMS
                    && let Some(old) = (0..self.fences.len()).min_by_key(|&i| self.fences[i].last)
                {
                    for (_, ev) in self.fences.swap_remove(old).ring {
                        let _ = backend.destroy_event(ev);
                    }
                }
                self.fences.push(StreamFences {
                    stream,
                    ring: VecDeque::new(),
                    done: 0,
                    last: 0,
                });
                self.fences.len() - 1
            }
        }
    }

    /// What recycling may take from `stream` without waiting: the newest
    /// free stamp whose uses on the stream are known to be over (every
    /// block of the stream freed with that stamp or an earlier one has no
    /// work pending; the current clock when the stream is idle). When
    /// blocks were freed since that stamp and `ask_stream` (no capture is
    /// underway), first asks the backend whether the stream is idle
    /// ([`Backend::query_stream`], one call and no event: a training
    /// loop's streams are often idle when the host allocates ahead of
    /// them); idle, everything freed on it so far is done. Else polls the
    /// stream's fences without waiting (a binary search; a failed query
    /// reads as pending), then, when blocks were freed since its newest
    /// fence, records one now and queries it: complete means the stream is
    /// idle; pending, it proves those blocks done at a later probe, however
    /// busy the stream is by then. One event per stream and probe at most;
    /// none when the ring is full or the backend fails (conservative: the
    /// blocks wait for a later fence, or recycling waits for the stream).
    pub fn probe(&mut self, backend: &B, stream: B::Stream, ask_stream: bool) -> u64 {
        let i = self.fences_of(backend, stream);
        let clock = self.free_clock;
        if ask_stream
            && self.fences[i].done < clock
            && let Ok(Some(true)) = backend.query_stream(stream)
        {
            // idle: every fence recorded on it has completed too
            let f = &mut self.fences[i];
            self.pool.extend(f.ring.drain(..).map(|(_, ev)| ev));
            f.done = clock;
            f.last = clock;
            return clock;
        }
        let done = self.poll_fences(backend, i);
        if done == clock || self.fences[i].last == clock {
            return done;
        }
        if self.fences[i].ring.len() >= FENCE_RING {
            return done;
        }
        let Ok(ev) = self.get(backend) else {
            return done;
        };
        if let Err(err) = backend.record_event(&ev, stream) {
            tracing::debug!(%err, "recording a completion fence failed");
            self.pool.push(ev);
            return done;
        }
        let f = &mut self.fences[i];
        f.last = clock;
        if backend.query_event(&ev).unwrap_or(false) {
            // the stream is idle: everything freed on it so far is done
            f.done = clock;
            self.pool.push(ev);
            return clock;
        }
        f.ring.push_back((clock, ev));
        done
    }

    /// The oldest pending fence of `stream` recorded after a free stamped
    /// `stamp` (`None`: none is pending, or none is that late): work
    /// queued behind it on another stream runs after every use of such a
    /// block on `stream`.
    pub fn covering(&self, stream: B::Stream, stamp: u64) -> Option<&B::Event> {
        let f = self.fences.iter().find(|f| f.stream == stream)?;
        f.ring.iter().find(|(s, _)| *s >= stamp).map(|(_, e)| e)
    }

    /// After a synchronization of `stream`: every block freed on it so
    /// far is done.
    pub fn synchronized(&mut self, backend: &B, stream: B::Stream) {
        let i = self.fences_of(backend, stream);
        self.fences[i].done = self.free_clock;
    }

    fn poll_fences(&mut self, backend: &B, i: usize) -> u64 {
        let f = &mut self.fences[i];
        // the completed fences are a prefix of the ring
        let (mut lo, mut hi) = (0, f.ring.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if backend.query_event(&f.ring[mid].1).unwrap_or(false) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        for (stamp, ev) in f.ring.drain(..lo) {
            f.done = stamp;
            self.pool.push(ev);
        }
        f.done
    }
}

impl<B: Backend> Inner<B> {
    /// Marks the allocation at `addr` as used on `stream` (besides its own).
    pub fn record_stream(
        &mut self,
        backend: &B,
        addr: u64,
        stream: B::Stream,
    ) -> Result<(), Error> {
        let Some(id) = self.live.get(addr) else {
            return Err(self.classify_bad_pointer(addr, false));
        };
        if stream == self.blocks[id].stream {
            return Ok(());
        }
        // A use recorded while a capture is underway is a captured use (its
        // work is in a graph, not queued: dropped when the capture ends)
        // only when `stream` itself is capturing. A stream outside every
        // capture runs its work now, so its use needs an end-of-life event
        // like any other (dropping it let the block be reused while that
        // work was still pending: found by the engine fuzz target).
        let captured = self.capture.is_active()
            && crate::engine::capture::active_capture_id(backend, stream)?.is_some();
        let b = &mut self.blocks[id];
        if captured {
            if !b.capture_uses.contains(&stream) {
                b.capture_uses.push(stream);
            }
        } else if !b.stream_uses.contains(&stream) {
            b.stream_uses.push(stream);
        }
        Ok(())
    }

    /// Whether every piece of work submitted to `stream` so far has completed
    /// (an event recorded now is already complete).
    pub(super) fn stream_is_idle(&mut self, backend: &B, stream: B::Stream) -> Result<bool, Error> {
        let ev = self.events.get(backend)?;
        let r = backend
            .record_event(&ev, stream)
            .and_then(|()| backend.query_event(&ev));
        self.events.pool.push(ev);
        Ok(r?)
    }

    /// [`Self::stream_is_idle`], asked once per stream within one operation.
    pub(super) fn stream_is_idle_cached(
        &mut self,
        backend: &B,
        seen: &mut Vec<(B::Stream, bool)>,
        s: B::Stream,
    ) -> Result<bool, Error> {
        if let Some(e) = seen.iter().find(|e| e.0 == s) {
            return Ok(e.1);
        }
        let ok = self.stream_is_idle(backend, s)?;
        seen.push((s, ok));
        Ok(ok)
    }

    /// Records an end-of-life event on every stream the block was used on,
    /// staged: nothing is queued and the block is unchanged until
    /// [`Self::commit_staged_events`]. On a failure every event taken goes
    /// back to the pool (a recorded event is re-recorded before any reuse)
    /// and nothing has changed.
    pub(super) fn stage_events(&mut self, backend: &B, id: BlockId) -> Result<(), Error> {
        debug_assert!(self.events.staged.is_empty());
        for i in 0..self.blocks[id].stream_uses.len() {
            let s = self.blocks[id].stream_uses[i];
            let recorded = match self.events.get(backend) {
                Ok(e) => match backend.record_event(&e, s) {
                    Ok(()) => Ok(e),
                    Err(err) => {
                        self.events.pool.push(e);
                        Err(err)
                    }
                },
                Err(err) => Err(err),
            };
            match recorded {
                Ok(e) => self.events.staged.push((s, e)),
                Err(err) => {
                    let staged = std::mem::take(&mut self.events.staged);
                    self.events.pool.extend(staged.into_iter().map(|(_, e)| e));
                    return Err(err.into());
                }
            }
        }
        Ok(())
    }

    /// Queues the events [`Self::stage_events`] recorded for `id`: the
    /// block waits for them (its stream uses are now covered).
    pub(super) fn commit_staged_events(&mut self, id: BlockId) {
        self.blocks[id].stream_uses.clear();
        let mut staged = std::mem::take(&mut self.events.staged);
        for (s, e) in staged.drain(..) {
            self.blocks[id].event_count += 1;
            self.events.push(s, e, id);
        }
        self.events.staged = staged;
    }

    /// Records and queues an end-of-life event on every stream the block was
    /// used on. On a failure nothing is recorded and the block, with all its
    /// uses, is parked as deferred until a device-wide sync.
    pub(super) fn insert_events(&mut self, backend: &B, id: BlockId) -> Result<(), Error> {
        if let Err(e) = self.stage_events(backend, id) {
            let b = &self.blocks[id];
            if b.event_count == 0 {
                let stream = b.stream;
                self.capture.deferred.push(Deferred {
                    block: id,
                    stream,
                    markers: Vec::new(),
                });
            }
            return Err(e);
        }
        self.commit_staged_events(id);
        Ok(())
    }

    /// One of `id`'s events completed: the block is freed after its last.
    fn event_done(&mut self, id: BlockId) {
        self.events.outstanding -= 1;
        let b = &mut self.blocks[id];
        b.event_count -= 1;
        if b.event_count == 0 && b.stream_uses.is_empty() {
            self.free_block(id);
        }
    }

    /// Flushes blocks deferred during a capture once no capture is underway
    /// (PyTorch 1.1 item 3): streams recorded during capture are dropped.
    pub(super) fn flush_deferred(&mut self, backend: &B) -> Result<(), Error> {
        if self.capture.deferred.is_empty() || self.capture.is_active() {
            return Ok(());
        }
        let deferred = std::mem::take(&mut self.capture.deferred);
        let mut result = Ok(());
        for d in deferred {
            let b = &mut self.blocks[d.block];
            b.capture_uses.clear();
            if b.state != BState::Pending {
                continue;
            }
            if b.stream_uses.is_empty() {
                if b.event_count == 0 {
                    self.free_block(d.block);
                }
            } else if let Err(e) = self.insert_events(backend, d.block) {
                result = Err(e);
            }
        }
        result
    }

    /// PyTorch's `process_events`: frees blocks whose events have completed.
    #[inline]
    pub(super) fn process_events(&mut self, backend: &B) -> Result<(), Error> {
        if !self.capture.deferred.is_empty() {
            self.flush_deferred(backend)?;
        }
        if self.events.outstanding == 0 {
            return Ok(());
        }
        for qi in 0..self.events.queues.len() {
            while let Some(front) = self.events.queues[qi].queue.front() {
                if !backend.query_event(&front.event)? {
                    break;
                }
                let e = self.events.queues[qi]
                    .queue
                    .pop_front()
                    .expect("front exists");
                self.events.pool.push(e.event);
                self.event_done(e.block);
            }
        }
        Ok(())
    }

    /// Frees the blocks parked after an event-record failure (they have no
    /// events): a device sync certifies their uses are over. Only outside
    /// capture.
    fn free_stranded(&mut self, backend: &B) -> Result<(), Error> {
        if self.capture.is_active() {
            return Ok(());
        }
        let stranded: Vec<BlockId> = self
            .capture
            .deferred
            .iter()
            .filter(|d| self.blocks[d.block].state == BState::Pending)
            .map(|d| d.block)
            .collect();
        if stranded.is_empty() {
            return Ok(());
        }
        backend.synchronize_device()?;
        self.capture.deferred.clear();
        for id in stranded {
            let b = &mut self.blocks[id];
            b.stream_uses.clear();
            if b.event_count == 0 {
                self.free_block(id);
            }
        }
        Ok(())
    }

    /// Synchronizes outstanding events (all, or those of blocks of one pool)
    /// and frees their blocks. Counts one `num_sync_all_streams`.
    pub(super) fn synchronize_and_free_events(
        &mut self,
        backend: &B,
        pool: Option<PoolIdx>,
    ) -> Result<(), Error> {
        self.stats.num_sync_all_streams += 1;
        self.flush_deferred(backend)?;
        self.free_stranded(backend)?;
        for qi in 0..self.events.queues.len() {
            let mut keep = VecDeque::new();
            while let Some(e) = self.events.queues[qi].queue.pop_front() {
                if pool.is_some_and(|p| self.blocks[e.block].pool != p) {
                    keep.push_back(e);
                    continue;
                }
                if let Err(err) = backend.synchronize_event(&e.event) {
                    let q = &mut self.events.queues[qi].queue;
                    q.push_front(e);
                    while let Some(k) = keep.pop_back() {
                        q.push_front(k);
                    }
                    return Err(err.into());
                }
                self.events.pool.push(e.event);
                self.event_done(e.block);
            }
            self.events.queues[qi].queue = keep;
        }
        Ok(())
    }
}
