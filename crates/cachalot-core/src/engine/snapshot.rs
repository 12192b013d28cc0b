//! Snapshots of every segment and block (PyTorch's `_snapshot()` segments).

use crate::backend::Backend;
use crate::engine::CachingAllocator;
use crate::engine::block::BState;
use crate::engine::history::{Annotation, HistoryContext, TraceAction};
use crate::engine::pools::PoolId;
use crate::engine::segments::SegmentKind;
use crate::engine::state::Inner;

/// State of a block in a snapshot (PyTorch's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out to the caller.
    ActiveAllocated,
    /// Freed by the caller, waiting for other streams' work or a capture.
    ActivePendingFree,
    /// Free and cached.
    Inactive,
}

impl BlockState {
    /// PyTorch's string for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSnapshot {
    /// Device address.
    pub address: u64,
    /// Block size.
    pub size: u64,
    /// Bytes requested by the caller; for an inactive block, those of the
    /// last allocation whose free left it (0 for a block never handed
    /// out), as PyTorch's `requested_size`.
    pub requested_size: u64,
    /// State.
    pub state: BlockState,
    /// The block's stream (rendered with `Debug`).
    pub stream: String,
    /// The context its allocation was made with, while the memory history
    /// keeps contexts (PyTorch's `context_when_allocated`).
    pub context: Option<HistoryContext>,
}

/// One device segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSnapshot {
    /// Device index.
    pub device: u32,
    /// Device address.
    pub address: u64,
    /// Segment size.
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active (allocated or pending) blocks.
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// Stream of the segment's first block (rendered with `Debug`).
    pub stream: String,
    /// Whether the segment belongs to a small pool.
    pub is_small: bool,
    /// Pool id ((0,0) for the default pools).
    pub pool_id: PoolId,
    /// A contiguous mapped range of an expandable segment (each is reported
    /// as a segment of its own, as PyTorch does).
    pub is_expandable: bool,
    /// Blocks in address order.
    pub blocks: Vec<BlockSnapshot>,
    /// The context the segment (range) was allocated (mapped) with, while
    /// the memory history keeps contexts.
    pub context: Option<HistoryContext>,
}

/// Every segment, sorted by address, and the memory history.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Device index.
    pub device: u32,
    /// Segments in address order.
    pub segments: Vec<SegmentSnapshot>,
    /// Memory-history entries, oldest first (empty when the history is off).
    pub traces: Vec<crate::engine::history::TraceEntry>,
    /// `record_function` annotations, oldest first (empty when the history
    /// is off).
    pub annotations: Vec<Annotation>,
    /// The allocator config at snapshot time.
    pub config: crate::config::AllocatorConfig,
}

impl<B: Backend> Inner<B> {
    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut segments = Vec::with_capacity(self.segments.len());
        for (addr, seg) in self.segments.iter() {
            let expandable = matches!(seg.kind, SegmentKind::Expandable { .. });
            let mut cur: Option<SegmentSnapshot> = None;
            for id in self.blocks.segment_blocks(seg.head) {
                let b = &self.blocks[id];
                if b.state == BState::Unmapped {
                    segments.extend(cur.take());
                    continue;
                }
                let s = cur.get_or_insert_with(|| SegmentSnapshot {
                    device: 0,
                    address: if expandable { b.addr } else { addr },
                    total_size: if expandable { 0 } else { seg.size },
                    allocated_size: 0,
                    active_size: 0,
                    requested_size: 0,
                    stream: format!("{:?}", b.stream),
                    is_small: b.small,
                    pool_id: self.pools.pair(b.pool).id(),
                    is_expandable: expandable,
                    blocks: Vec::new(),
                    context: None,
                });
                if expandable {
                    s.total_size += b.size;
                }
                let state = match b.state {
                    BState::Allocated => BlockState::ActiveAllocated,
                    BState::Pending => BlockState::ActivePendingFree,
                    _ => BlockState::Inactive,
                };
                if state == BlockState::ActiveAllocated {
                    s.allocated_size += b.size;
                }
                if state != BlockState::Inactive {
                    s.active_size += b.size;
                    s.requested_size += b.requested;
                }
                s.blocks.push(BlockSnapshot {
                    address: b.addr,
                    size: b.size,
                    requested_size: b.requested,
                    state,
                    stream: format!("{:?}", b.stream),
                    context: None,
                });
            }
            segments.extend(cur);
        }
        Snapshot {
            device: 0,
            segments,
            traces: Vec::new(),
            annotations: Vec::new(),
            config: self.config.clone(),
        }
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// A snapshot of every segment and block, with the memory history's
    /// entries, annotations and contexts (none when it is off) and the
    /// device index. With the history on, a `snapshot` entry (size: the
    /// active bytes) is recorded after the copy: a snapshot never holds its
    /// own entry, as in PyTorch.
    pub fn snapshot(&self) -> Snapshot {
        let mut g = self.lock();
        let mut s = g.snapshot();
        s.device = self.backend.device();
        for seg in &mut s.segments {
            seg.device = s.device;
        }
        if let Some(h) = g.history.as_ref() {
            h.fill(&mut s);
            let active = s.segments.iter().map(|seg| seg.active_size).sum();
            g.trace(
                TraceAction::Snapshot,
                0,
                active,
                self.backend.default_stream(),
            );
        }
        s
    }
}
