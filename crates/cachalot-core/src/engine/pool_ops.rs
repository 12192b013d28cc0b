//! What a private pool does beyond the routing of `capture/`: allocation
//! into a named pool (a `torch.cuda.use_mem_pool` context, routed by its
//! caller), the pool options (a segment source, `use_on_oom`, `no_split`)
//! and where they act, and segment trackers (PyTorch's allocator trace
//! trackers, NCCL's buffer-registration hook).
//!
//! An allocation into a named pool registers no filter: PyTorch routes
//! `use_mem_pool` by thread, and a stream filter registered for the
//! duration of the call would route another thread's allocation on the
//! same stream into the pool too.
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::backend::{Backend, DevicePointer};
use crate::engine::block::BlockId;
use crate::engine::history::TraceAction;
use crate::engine::pools::{DEFAULT_POOL, PoolId, PoolIdx, SegmentSource};
use crate::engine::rounding::MAX_REQUEST;
use crate::engine::shard;
use crate::engine::state::{Inner, Params};
use crate::engine::{CachingAllocator, history};
use crate::error::{BackendError, CaptureError, DeviceAllocError, Error};

/// A segment event as a tracker sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentEvent {
    /// [`TraceAction::SegmentAlloc`] (after the memory is obtained),
    /// [`TraceAction::SegmentFree`] (before it is returned),
    /// [`TraceAction::SegmentMap`] or [`TraceAction::SegmentUnmap`] (pages
    /// of an expandable segment).
    pub action: TraceAction,
    /// Start of the range.
    pub addr: u64,
    /// Bytes of the range.
    pub size: u64,
    /// The pool owning the segment ((0, 0): the default pools).
    pub pool: PoolId,
    /// The segment's stream, rendered with `Debug`.
    pub stream: String,
}

/// A callback run for every segment event, with the allocator's device
/// lock held: it must not call back into the allocator.
pub type SegmentTracker = Arc<dyn Fn(&SegmentEvent) + Send + Sync>;

impl<B: Backend> CachingAllocator<B> {
    /// Allocates `size` bytes for use on `stream` in private pool `pool`,
    /// which must be held ([`Self::create_or_incref_pool`] or a capture):
    /// the allocation of a `torch.cuda.use_mem_pool` context. Nothing is
    /// registered: allocations of other callers go where they would have
    /// gone. An unknown or released pool is [`CaptureError::UnknownPool`],
    /// `(0, 0)` [`CaptureError::ReservedPool`].
    pub fn allocate_in_pool(
        &self,
        pool: PoolId,
        size: u64,
        stream: B::Stream,
    ) -> Result<u64, Error> {
        if pool == (0, 0) {
            return Err(CaptureError::ReservedPool(pool).into());
        }
        if size == 0 {
            return Ok(0);
        }
        if size >= MAX_REQUEST {
            return Err(Error::NeverFits {
                requested: size,
                reason: "tried to allocate more than 1EB memory".into(),
                report: None,
            });
        }
        let key = shard::stream_key(self.id, &stream);
        shard::count_path(shard::DEVICE);
        let (outcome, k) = {
            let mut g = self.lock();
            let idx = g
                .pools
                .find(pool)
                .filter(|&i| g.pools.pair(i).in_use())
                .ok_or(CaptureError::UnknownPool(pool))?;
            let k = g.shard_of(stream);
            shard::hint_set(key, k);
            (g.malloc_to(&self.backend, size, stream, Some(idx))?, k)
        };
        self.finish_alloc(outcome, k, size)
    }

    /// PyTorch's `createOrIncrefPool`: one more use of private pool `pool`,
    /// created if new (its segments then come from `source` when given; a
    /// source for a pool that exists is [`Error::InvalidArgument`]).
    pub fn create_or_incref_pool(
        &self,
        pool: PoolId,
        source: Option<Arc<dyn SegmentSource>>,
    ) -> Result<(), Error> {
        self.lock().pools.create_or_incref(pool, source)
    }

    /// PyTorch's `setUseOnOOM`: while on, an allocation of the default pools
    /// that found no cached block and no device memory takes a cached free
    /// block of this pool (same stream) before the cache is released.
    /// Turning it off for a pool that no longer exists does nothing (as in
    /// PyTorch: `MemPool`'s destructor does it).
    pub fn set_pool_use_on_oom(&self, pool: PoolId, on: bool) -> Result<(), Error> {
        let mut g = self.lock();
        let idx = match g.private_pool(pool) {
            Ok(idx) => idx,
            Err(Error::Capture(CaptureError::UnknownPool(_))) if !on => return Ok(()),
            Err(e) => return Err(e),
        };
        g.pools.pair_mut(idx).options.use_on_oom = on;
        Ok(())
    }

    /// PyTorch's `setNoSplit`: the pool's blocks are never split (each
    /// allocation keeps the whole block found, a new segment's included).
    pub fn set_pool_no_split(&self, pool: PoolId) -> Result<(), Error> {
        let mut g = self.lock();
        let idx = g.private_pool(pool)?;
        g.pools.pair_mut(idx).options.no_split = true;
        Ok(())
    }

    /// Sets (or with `None` removes) the callback that sees every segment
    /// event from now on.
    pub fn set_segment_tracker(&self, tracker: Option<SegmentTracker>) {
        self.lock().tracker = tracker;
    }
}

/// The device call of a new fixed segment of `size` bytes: the pool's
/// source `src` when it has one, else the backend. Needs no lock.
pub(super) fn device_memory<B: Backend>(
    backend: &B,
    src: Option<&dyn SegmentSource>,
    size: u64,
) -> Result<u64, DeviceAllocError> {
    match src {
        None => backend.malloc(size).map(|p| p.addr()),
        Some(src) => src.alloc(size),
    }
}

impl<B: Backend> Inner<B> {
    /// The index of live private pool `id`.
    fn private_pool(&self, id: PoolId) -> Result<PoolIdx, Error> {
        if id == (0, 0) {
            return Err(CaptureError::ReservedPool(id).into());
        }
        self.pools
            .find(id)
            .ok_or_else(|| CaptureError::UnknownPool(id).into())
    }

    /// PyTorch's `try_mempool_fallback`: for a request of the default
    /// pools, the first cached free block found in a `use_on_oom` pool
    /// still held (no new segment there).
    pub(super) fn borrow_use_on_oom_block(&mut self, p: &Params<B::Stream>) -> Option<BlockId> {
        if p.pool != DEFAULT_POOL {
            return None;
        }
        let lenders: Vec<PoolIdx> = self
            .pools
            .iter()
            .filter(|(_, pp)| pp.options.use_on_oom && pp.in_use())
            .map(|(i, _)| i)
            .collect();
        lenders.into_iter().find_map(|idx| {
            let q = Params { pool: idx, ..*p };
            self.get_free_block(&q)
        })
    }

    /// Whether pool `pool`'s blocks are never split.
    #[inline]
    pub(super) fn no_split(&self, pool: PoolIdx) -> bool {
        pool != DEFAULT_POOL && self.pools.pair(pool).options.no_split
    }

    /// Whether pool `pool` takes its segments from a source (and so never
    /// from expandable segments).
    #[inline]
    pub(super) fn has_source(&self, pool: PoolIdx) -> bool {
        pool != DEFAULT_POOL && self.pools.pair(pool).options.source.is_some()
    }

    /// The memory of a new fixed segment of `size` bytes for `pool`: from
    /// the pool's source, else from the backend. A source's address that is
    /// null is out of memory (as PyTorch reads it); one that is misaligned
    /// (handed back) or overlaps a segment of the device (kept away from
    /// the source's free: it may be memory in use) is refused.
    pub(super) fn segment_memory(
        &mut self,
        backend: &B,
        pool: PoolIdx,
        size: u64,
    ) -> Result<u64, DeviceAllocError> {
        let src = self.source(pool).cloned();
        let got = device_memory(backend, src.as_deref(), size);
        self.accept_memory(pool, size, src.as_deref(), got)
    }

    /// What [`Self::segment_memory`] checks of the device call's answer
    /// `got` (from `src` when the pool has a source), with the lock held.
    pub(super) fn accept_memory(
        &mut self,
        pool: PoolIdx,
        size: u64,
        src: Option<&dyn SegmentSource>,
        got: Result<u64, DeviceAllocError>,
    ) -> Result<u64, DeviceAllocError> {
        let Some(src) = src else {
            return got;
        };
        let addr = got?;
        if addr == 0 {
            return Err(DeviceAllocError::OutOfMemory);
        }
        // (an overlapping address is not handed back: freeing it could free
        // memory a live segment uses)
        let bad = if addr.checked_add(size).is_none() || self.segments.overlaps(addr, size) {
            Some(("overlaps another segment of the device", false))
        } else if addr % crate::engine::rounding::MIN_BLOCK_SIZE != 0 {
            Some(("is not aligned to 512 bytes", true))
        } else {
            None
        };
        if let Some((why, hand_back)) = bad {
            if hand_back && let Err(e) = src.free(addr, size) {
                tracing::warn!(%e, addr, "handing a refused segment back to its source failed");
            }
            return Err(BackendError::new(
                "segment source",
                "alloc",
                0,
                format!("the pool's segment source returned {addr:#x} ({size} bytes), which {why}"),
            )
            .into());
        }
        self.pools.pair_mut(pool).options.sourced.insert(addr, size);
        Ok(addr)
    }

    /// Returns the memory of fixed segment `addr`: to the source that gave
    /// it, else to the backend.
    pub(super) fn release_segment_memory(
        &mut self,
        backend: &B,
        addr: u64,
        size: u64,
    ) -> Result<(), BackendError> {
        let owner = self
            .pools
            .iter_mut()
            .find(|p| p.options.sourced.contains_key(&addr));
        let Some(owner) = owner else {
            return backend.free(B::Ptr::from_addr(addr), size);
        };
        let src = owner
            .options
            .source
            .clone()
            .expect("a pool with sourced segments has a source");
        src.free(addr, size)?;
        owner.options.sourced.remove(&addr);
        Ok(())
    }

    pub(super) fn source(&self, pool: PoolIdx) -> Option<&Arc<dyn SegmentSource>> {
        if pool == DEFAULT_POOL {
            return None;
        }
        self.pools.pair(pool).options.source.as_ref()
    }

    /// Runs the segment tracker (one branch when there is none).
    #[inline]
    pub(super) fn track(
        &self,
        action: history::TraceAction,
        addr: u64,
        size: u64,
        pool: PoolIdx,
        stream: B::Stream,
    ) {
        if let Some(t) = &self.tracker {
            t(&SegmentEvent {
                action,
                addr,
                size,
                pool: self.pools.pair(pool).id(),
                stream: format!("{stream:?}"),
            });
        }
    }
}
