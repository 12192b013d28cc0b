//! Checkpoints of a private pool: the layout of every segment of the pool
//! (blocks, sizes, which are allocated) saved, and restored later, as
//! cudagraph trees use PyTorch's `getCheckpointState` /
//! `setCheckpointPoolState` when the path through a tree of CUDA graphs
//! diverges (PyTorch's `torch/_inductor/cudagraph_trees.py` and
//! `setSegmentStateToCheckpoint` in `CUDACachingAllocator.cpp`).
//!
//! A restore frees every block of the pool allocated now (reported in
//! [`CheckpointDelta::freed`]) and allocates again, at the same addresses
//! and sizes, every block the checkpoint holds as allocated (reported in
//! [`CheckpointDelta::allocated`]): tensors of the checkpoint can then be
//! rebuilt over those addresses. Segments the pool gained since stay (free);
//! a pool never shrinks while it is used.
#![forbid(unsafe_code)]

use crate::backend::Backend;
use crate::engine::CachingAllocator;
use crate::engine::accounting::StatSink;
use crate::engine::block::{BState, BlockId, NIL};
use crate::engine::history::TraceAction;
use crate::engine::pools::{PoolId, PoolIdx};
use crate::engine::segments::SegmentKind;
use crate::engine::state::Inner;
use crate::error::{CaptureError, Error};
use crate::stats::StatType;

/// What a block of a checkpointed segment was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointState {
    /// Handed out to the caller: a restore allocates it again.
    Allocated,
    /// Free (cached), or freed and waiting for other streams' work.
    Free,
    /// Address space of an expandable segment with no memory mapped.
    Unmapped,
}

/// One block of a checkpointed segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointBlock<S> {
    /// Device address.
    pub addr: u64,
    /// Block size.
    pub size: u64,
    /// Bytes requested (allocated blocks; 0 otherwise).
    pub requested: u64,
    /// The block's stream.
    pub stream: S,
    /// Its state.
    pub state: CheckpointState,
}

/// One segment of a checkpointed pool, its blocks in address order tiling it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSegment<S> {
    /// Start address (of the reservation, for an expandable segment).
    pub start: u64,
    /// Size (of the reservation, for an expandable segment).
    pub size: u64,
    /// A small-pool segment.
    pub small: bool,
    /// An expandable segment.
    pub expandable: bool,
    /// The blocks, in address order.
    pub blocks: Vec<CheckpointBlock<S>>,
}

/// The full layout of one private pool at one moment
/// ([`CachingAllocator::checkpoint_pool`]); immutable, and restorable any
/// number of times on the allocator that took it
/// ([`CachingAllocator::restore_pool`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolCheckpoint<S> {
    owner: u64,
    pool: PoolId,
    segments: Vec<CheckpointSegment<S>>,
}

impl<S> PoolCheckpoint<S> {
    /// The pool checkpointed.
    pub fn pool(&self) -> PoolId {
        self.pool
    }

    /// Its segments, by address.
    pub fn segments(&self) -> &[CheckpointSegment<S>] {
        &self.segments
    }

    /// The addresses of the blocks allocated in the checkpoint, by address.
    pub fn allocated(&self) -> impl Iterator<Item = u64> + '_ {
        self.segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == CheckpointState::Allocated)
            .map(|b| b.addr)
    }
}

/// What a restore changed (PyTorch's `CheckpointDelta`): the addresses it
/// freed, and those it allocated (an address may be in both).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointDelta {
    /// Blocks of the pool that were allocated and were freed, by address.
    pub freed: Vec<u64>,
    /// Blocks allocated again as the checkpoint holds them, by address; each
    /// is a live allocation to be freed with [`CachingAllocator::free`].
    pub allocated: Vec<(u64, u64)>,
}

fn mismatch(msg: String) -> Error {
    CaptureError::Checkpoint(msg).into()
}

impl<B: Backend> CachingAllocator<B> {
    /// Saves the layout of private pool `pool` (PyTorch's
    /// `getCheckpointState`). An unknown pool, the default pool and a pool
    /// whose uses all ended are [`CaptureError`]s.
    pub fn checkpoint_pool(&self, pool: PoolId) -> Result<PoolCheckpoint<B::Stream>, Error> {
        let g = self.lock();
        let idx = g.used_private_pool(pool)?;
        Ok(PoolCheckpoint {
            owner: self.id,
            pool,
            segments: g.pool_layout(idx),
        })
    }

    /// Restores the pool of `checkpoint` to it (PyTorch's
    /// `setCheckpointPoolState`): frees every block of the pool allocated
    /// now, then allocates each block the checkpoint holds as allocated,
    /// with its address, size and stream. A checkpoint of another
    /// allocator, of a pool no longer used, or whose segments the pool no
    /// longer has mapped is a [`CaptureError`] and changes nothing.
    pub fn restore_pool(
        &self,
        checkpoint: &PoolCheckpoint<B::Stream>,
    ) -> Result<CheckpointDelta, Error> {
        if checkpoint.owner != self.id {
            return Err(mismatch("the checkpoint is of another allocator".into()));
        }
        let mut g = self.lock();
        g.restore_pool(&self.backend, checkpoint)
    }
}

impl<B: Backend> Inner<B> {
    /// The index of private pool `id`, which must be used.
    fn used_private_pool(&self, id: PoolId) -> Result<PoolIdx, Error> {
        if id == (0, 0) {
            return Err(CaptureError::ReservedPool(id).into());
        }
        match self.pools.find(id) {
            Some(idx) if !self.pools.is_freeable(idx) => Ok(idx),
            _ => Err(CaptureError::UnknownPool(id).into()),
        }
    }

    /// The head blocks of pool `idx`'s segments, by address, with their
    /// start, size and kind.
    fn pool_segments(&self, idx: PoolIdx) -> Vec<(u64, u64, BlockId, bool)> {
        self.segments
            .iter()
            .filter(|(_, s)| self.blocks[s.head].pool == idx)
            .map(|(a, s)| {
                let expandable = matches!(s.kind, SegmentKind::Expandable { .. });
                (a, s.size, s.head, expandable)
            })
            .collect()
    }

    /// Every segment of pool `idx` with its blocks.
    fn pool_layout(&self, idx: PoolIdx) -> Vec<CheckpointSegment<B::Stream>> {
        self.pool_segments(idx)
            .into_iter()
            .map(|(start, size, head, expandable)| CheckpointSegment {
                start,
                size,
                small: self.blocks[head].small,
                expandable,
                blocks: self
                    .blocks
                    .segment_blocks(head)
                    .map(|id| {
                        let b = &self.blocks[id];
                        let state = match b.state {
                            BState::Allocated => CheckpointState::Allocated,
                            BState::Unmapped => CheckpointState::Unmapped,
                            _ => CheckpointState::Free,
                        };
                        CheckpointBlock {
                            addr: b.addr,
                            size: b.size,
                            requested: if state == CheckpointState::Allocated {
                                b.requested
                            } else {
                                0
                            },
                            stream: b.stream,
                            state,
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// Checks, before anything changes, that every segment of the
    /// checkpoint is still one of the pool's, of the same kind and size,
    /// and that every block to allocate again lies in mapped memory.
    fn check_restorable(&self, idx: PoolIdx, c: &PoolCheckpoint<B::Stream>) -> Result<(), Error> {
        for s in &c.segments {
            let Some((start, seg)) = self.segments.find(s.start) else {
                return Err(mismatch(format!(
                    "segment {:#x} of the checkpoint was released",
                    s.start
                )));
            };
            let head = &self.blocks[seg.head];
            let expandable = matches!(seg.kind, SegmentKind::Expandable { .. });
            if start != s.start
                || seg.size != s.size
                || head.pool != idx
                || head.small != s.small
                || expandable != s.expandable
            {
                return Err(mismatch(format!(
                    "segment {:#x} of the checkpoint is not the pool's segment there now",
                    s.start
                )));
            }
            // the blocks allocated now are freed first; what must hold is
            // that no block to allocate overlaps unmapped pages
            let mut want = s
                .blocks
                .iter()
                .filter(|b| b.state == CheckpointState::Allocated)
                .peekable();
            for id in self.blocks.segment_blocks(seg.head) {
                let b = &self.blocks[id];
                while want.peek().is_some_and(|w| w.addr + w.size <= b.addr) {
                    want.next();
                }
                if b.state == BState::Unmapped
                    && want.peek().is_some_and(|w| w.addr < b.addr + b.size)
                {
                    return Err(mismatch(format!(
                        "block {:#x} of the checkpoint lies in pages unmapped since",
                        want.peek().map_or(0, |w| w.addr)
                    )));
                }
            }
            if s.blocks.iter().any(|b| {
                b.state == CheckpointState::Allocated && b.addr + b.size > s.start + s.size
            }) {
                return Err(mismatch(format!(
                    "segment {:#x}: a block overruns it",
                    s.start
                )));
            }
        }
        if self.capture.is_active() {
            // a free during a capture can be deferred; refuse before any
            // change rather than find a block still in use half-way
            for (_, _, head, _) in self.pool_segments(idx) {
                for id in self.blocks.segment_blocks(head) {
                    let b = &self.blocks[id];
                    if b.state == BState::Pending
                        || (b.state == BState::Allocated
                            && (!b.stream_uses.is_empty() || !b.capture_uses.is_empty()))
                    {
                        return Err(CaptureError::NotAllowedDuringCapture(
                            "restoring a pool checkpoint with blocks in use on other streams",
                        )
                        .into());
                    }
                }
            }
        }
        Ok(())
    }

    /// The restore of [`CachingAllocator::restore_pool`].
    fn restore_pool(
        &mut self,
        backend: &B,
        c: &PoolCheckpoint<B::Stream>,
    ) -> Result<CheckpointDelta, Error> {
        let idx = self.used_private_pool(c.pool)?;
        self.check_restorable(idx, c)?;
        // 1. every block of the pool allocated now is freed
        let mut delta = CheckpointDelta::default();
        for (_, _, head, _) in self.pool_segments(idx) {
            delta.freed.extend(
                self.blocks
                    .segment_blocks(head)
                    .filter(|&id| self.blocks[id].state == BState::Allocated)
                    .map(|id| self.blocks[id].addr),
            );
        }
        for &addr in &delta.freed {
            self.free(backend, addr)?;
        }
        // blocks freed with uses on other streams wait for their events
        let pending = self.pool_segments(idx).into_iter().any(|(_, _, head, _)| {
            self.blocks
                .segment_blocks(head)
                .any(|id| self.blocks[id].state == BState::Pending)
        });
        if pending {
            self.synchronize_and_free_events(backend, Some(idx))?;
        }
        // 2. the checkpoint's allocated blocks are carved out again
        for s in &c.segments {
            let head = self
                .segments
                .find(s.start)
                .map(|(_, seg)| seg.head)
                .expect("checked restorable");
            let before = self.split_free(head, s.expandable);
            for b in s
                .blocks
                .iter()
                .filter(|b| b.state == CheckpointState::Allocated)
            {
                self.carve(idx, b)?;
                delta.allocated.push((b.addr, b.size));
            }
            let head = self
                .segments
                .find(s.start)
                .map(|(_, seg)| seg.head)
                .expect("checked restorable");
            let after = self.split_free(head, s.expandable);
            let st = StatType::of_pool(s.small);
            self.stats
                .on_inactive_split(st, after.0 - before.0, after.1 - before.1);
        }
        Ok(delta)
    }

    /// The inactive split blocks of the segment at `head` (count, bytes),
    /// as the stats count them (none in an expandable segment).
    fn split_free(&self, head: BlockId, expandable: bool) -> (i64, i64) {
        if expandable {
            return (0, 0);
        }
        let mut n = (0, 0);
        for id in self.blocks.segment_blocks(head) {
            let b = &self.blocks[id];
            if b.state == BState::Free && b.is_split() {
                n.0 += 1;
                n.1 += b.size as i64;
            }
        }
        n
    }

    /// Allocates checkpoint block `w` of pool `idx` again at its address:
    /// the free block holding its start is cut before it, joined with the
    /// free blocks after it while shorter, cut after it, moved to its
    /// stream and handed out. The segment's inactive-split stats are the
    /// caller's.
    fn carve(&mut self, idx: PoolIdx, w: &CheckpointBlock<B::Stream>) -> Result<(), Error> {
        let not_free = |addr: u64| {
            mismatch(format!(
                "block {addr:#x} of the checkpoint is not free after the pool's blocks were freed"
            ))
        };
        let mut id = self
            .block_containing(w.addr)
            .ok_or_else(|| not_free(w.addr))?;
        if self.blocks[id].state != BState::Free || self.blocks[id].pool != idx {
            return Err(not_free(w.addr));
        }
        self.remove_free(id);
        let start = self.blocks[id].addr;
        if start < w.addr {
            let rid = self.blocks.split(id, w.addr - start);
            self.insert_free(id);
            id = rid;
        }
        while self.blocks[id].size < w.size {
            let next = self.blocks[id].next;
            if next == NIL || self.blocks[next].state != BState::Free {
                // (checked restorable: cannot happen; the block is filed back)
                self.insert_free(id);
                return Err(not_free(w.addr));
            }
            self.remove_free(next);
            self.blocks.absorb_next(id);
        }
        if self.blocks[id].size > w.size {
            let rid = self.blocks.split(id, w.size);
            self.insert_free(rid);
        }
        if self.blocks[id].stream != w.stream {
            self.rekey(id, w.stream);
        }
        let oversize = w.size >= self.config.max_split_size;
        let b = &mut self.blocks[id];
        b.state = BState::Allocated;
        b.requested = w.requested;
        b.oversize = oversize;
        let (small, stream) = (b.small, b.stream);
        self.pools.pool_mut(idx, small).free.note_out(stream);
        self.live.insert(w.addr, id);
        self.stats
            .on_alloc(StatType::of_pool(small), w.size, w.requested, oversize);
        self.trace(TraceAction::Alloc, w.addr, w.size, stream);
        Ok(())
    }
}
