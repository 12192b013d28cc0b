//! Device segments: the segment type, the registry by address, and the
//! only calls of [`Backend::malloc`] and [`Backend::free`] in the engine.
//! Also what a segment's blocks may do with it: whether a free block is a
//! releasable segment, and whether a bad pointer lies inside one.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use crate::backend::{Backend, DevicePointer};
use crate::engine::block::{BState, Block, BlockId, NIL};
use crate::engine::history::TraceAction;
use crate::engine::pools::PoolIdx;
use crate::engine::state::{Inner, Params};
use crate::error::{BackendError, DeviceAllocError, Error};
use crate::stats::StatType;

/// How a segment's memory is backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegmentKind {
    /// One device allocation of the segment's whole size
    /// ([`Backend::malloc`]). (Expandable segments, a virtual range whose
    /// pages are mapped on demand, will be a second kind.)
    Fixed,
}

/// A device segment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    pub size: u64,
    /// The block at the segment's start.
    pub head: BlockId,
    /// Counted in `oversize_segments`.
    pub oversize: bool,
    /// How the memory is backed.
    pub kind: SegmentKind,
}

/// Every segment, by start address, and the age counter.
#[derive(Default)]
pub(crate) struct Segments {
    map: BTreeMap<u64, Segment>,
    /// Segments created so far (each segment's `seq`).
    created: u64,
}

impl Segments {
    /// Every segment as (start, segment), in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Segment)> + '_ {
        self.map.iter().map(|(&a, s)| (a, s))
    }

    /// The head block of every segment, in address order.
    pub fn heads(&self) -> Vec<BlockId> {
        self.map.values().map(|s| s.head).collect()
    }

    /// Number of segments.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether `addr` lies inside one of the segments.
    pub fn contains(&self, addr: u64) -> bool {
        self.map
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, seg)| addr < start + seg.size)
    }

    /// The next segment age.
    fn next_seq(&mut self) -> u64 {
        self.created += 1;
        self.created
    }
}

/// Returns a segment's memory to the device.
fn free_segment<B: Backend>(backend: &B, addr: u64, seg: &Segment) -> Result<(), BackendError> {
    match seg.kind {
        SegmentKind::Fixed => backend.free(B::Ptr::from_addr(addr), seg.size),
    }
}

/// Segments a release path could not return to the device, collected while
/// it goes on with the others.
#[derive(Debug, Default)]
pub(crate) struct ReleaseFailures {
    segments: usize,
    bytes: u64,
    first: Option<BackendError>,
}

impl ReleaseFailures {
    fn record(&mut self, bytes: u64, e: BackendError) {
        self.segments += 1;
        self.bytes += bytes;
        self.first.get_or_insert(e);
    }

    /// The failures so far as one error (`Ok` when none), cleared.
    pub fn take(&mut self) -> Result<(), Error> {
        let taken = std::mem::take(self);
        match taken.first {
            None => Ok(()),
            Some(first) => Err(Error::ReleaseFailed {
                segments: taken.segments,
                bytes: taken.bytes,
                first,
            }),
        }
    }
}

/// Whether a free block may be returned to the device: it is its whole
/// segment.
#[inline]
pub(crate) fn releasable<S>(b: &Block<S>) -> bool {
    !b.is_split()
}

impl<B: Backend> Inner<B> {
    /// Gets a new segment of `p.alloc_size` bytes from the device as one free
    /// block counted out to `p.stream` (PyTorch's `alloc_block`).
    /// `Ok(None)` = out of memory, or over the memory fraction (retry may
    /// help); `Err` = another driver error.
    pub(super) fn alloc_segment(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<Option<BlockId>, Error> {
        let size = p.alloc_size;
        if let Some(max) = self.limits.allowed_max
            && self.stats.reserved_bytes.all().current as u64 + size > max
        {
            return Ok(None);
        }
        let ptr = match backend.malloc(size) {
            Ok(ptr) => ptr.addr(),
            Err(DeviceAllocError::OutOfMemory) => return Ok(None),
            Err(DeviceAllocError::Backend(e)) => return Err(e.into()),
        };
        let oversize = size >= self.config.max_split_size;
        self.stats
            .on_segment_alloc(StatType::of_pool(p.small), size, oversize);
        self.pools.add_segment(p.pool);
        let seq = self.segments.next_seq();
        let id = self.blocks.insert(Block {
            seq,
            ..Block::free(ptr, size, p.stream, p.pool, p.small, NIL, NIL)
        });
        self.segments.map.insert(
            ptr,
            Segment {
                size,
                head: id,
                oversize,
                kind: SegmentKind::Fixed,
            },
        );
        self.pools.pool_mut(p.pool, p.small).free.note_out(p.stream);
        self.trace(TraceAction::SegmentAlloc, ptr, size, p.stream);
        tracing::debug!(size, ptr, "device segment allocated");
        Ok(Some(id))
    }

    /// Returns a whole free segment to the device (PyTorch's
    /// `release_block`). True when released; a failed device free changes
    /// nothing (the segment stays cached) and is recorded in
    /// `release_failures` for the release path to report.
    pub(super) fn release_segment(&mut self, backend: &B, id: BlockId) -> bool {
        let b = &self.blocks[id];
        debug_assert!(releasable(b) && b.state == BState::Free);
        let (addr, size, small, pool, stream) = (b.addr, b.size, b.small, b.pool, b.stream);
        let seg = *self
            .segments
            .map
            .get(&addr)
            .expect("a whole block is its segment");
        if let Err(e) = free_segment(backend, addr, &seg) {
            tracing::warn!(%e, size, addr, "releasing a cached segment failed; it stays cached");
            self.release_failures.record(size, e);
            return false;
        }
        self.segments.map.remove(&addr);
        let oversize = seg.oversize;
        self.trace(TraceAction::SegmentFree, addr, size, stream);
        self.remove_free(id);
        self.stats
            .on_segment_free(StatType::of_pool(small), size, oversize);
        self.pools.remove_segment(pool);
        self.blocks.remove(id);
        tracing::debug!(size, addr, "device segment released");
        true
    }

    /// Releases every releasable free block of one block pool (going on
    /// past failures, which `release_failures` collects).
    pub(super) fn release_pool_segments(&mut self, backend: &B, pool: PoolIdx, small: bool) {
        let ids: Vec<BlockId> = match self.pools.try_pool_mut(pool, small) {
            Some(p) => p.free.iter().map(|e| e.id).collect(),
            None => return,
        };
        for id in ids {
            if releasable(&self.blocks[id]) {
                self.release_segment(backend, id);
            }
        }
    }

    /// Why `addr`, not a live allocation's start, was passed to `free`
    /// (`is_free`) or `record_stream`: not in any segment (unknown
    /// pointer); inside a live allocation but not its start (interior
    /// pointer); in a block that is not live, a cached free block or one
    /// waiting for its streams (double free for `free`, not live for
    /// `record_stream`).
    pub(super) fn classify_bad_pointer(&self, addr: u64, is_free: bool) -> Error {
        match self.block_containing(addr) {
            None => Error::UnknownPointer(addr),
            Some(id) => {
                let b = &self.blocks[id];
                if b.state == BState::Allocated && b.addr != addr {
                    Error::InteriorPointer {
                        addr,
                        block: b.addr,
                        size: b.size,
                    }
                } else if is_free {
                    Error::DoubleFree(addr)
                } else {
                    Error::NotLive(addr)
                }
            }
        }
    }

    /// The block of a segment whose bytes contain `addr` (a walk of its
    /// segment's block list: for the error path only).
    fn block_containing(&self, addr: u64) -> Option<BlockId> {
        if !self.segments.contains(addr) {
            return None;
        }
        let (_, seg) = self.segments.map.range(..=addr).next_back()?;
        let mut id = seg.head;
        while id != NIL {
            let b = &self.blocks[id];
            if addr >= b.addr && addr - b.addr < b.size {
                return Some(id);
            }
            id = b.next;
        }
        None
    }

    /// Returns every segment and event to the backend (allocator dropped).
    pub(super) fn release_all_on_drop(&mut self, backend: &B) -> Result<(), Error> {
        let mut first_err: Option<Error> = None;
        let mut keep = |r: Result<(), Error>| {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        };
        if self.segments.len() > 0 || self.events.outstanding() > 0 {
            keep(backend.synchronize_device().map_err(Error::from));
        }
        keep(self.events.destroy_all(backend));
        for (addr, seg) in std::mem::take(&mut self.segments.map) {
            keep(free_segment(backend, addr, &seg).map_err(Error::from));
        }
        first_err.map_or(Ok(()), Err)
    }
}
