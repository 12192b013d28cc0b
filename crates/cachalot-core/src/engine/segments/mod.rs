//! Device segments: the segment type, the registry by address, and the
//! only calls of [`Backend::malloc`] and [`Backend::free`] in the engine.
//! Also what a segment's blocks may do with it: whether a free block is a
//! releasable segment, the release paths, and whether a bad pointer lies
//! inside one (`bad_pointer.rs`). Expandable segments' records and their
//! `VirtualMemory` calls are in `pages.rs`.
#![forbid(unsafe_code)]

mod bad_pointer;
mod pages;

use std::collections::BTreeMap;

use crate::backend::{Backend, VirtualMemory};
use crate::engine::block::{BState, Block, BlockId, NIL};
use crate::engine::history::TraceAction;
use crate::engine::pools::PoolIdx;
use crate::engine::state::{Inner, Params};
use crate::error::{BackendError, DeviceAllocError, Error};
use crate::stats::StatType;

pub(crate) use pages::{Expandable, Phys, PhysId, Sites, UnmapSync, sync_stream};

/// How a segment's memory is backed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegmentKind {
    /// One device allocation of the segment's whole size
    /// ([`Backend::malloc`]).
    Fixed,
    /// A reserved virtual range whose pages are mapped on demand
    /// (`expandable_segments:True`): index into [`Segments`]' expandable
    /// list.
    Expandable { index: u32 },
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

/// Expandable slots [`Segments::expandable_at`] scans before it asks the
/// ordered map of all segments.
const SCAN_SLOTS: usize = 16;

/// Every segment, by start address, and the age counter.
pub(crate) struct Segments<P, S> {
    map: BTreeMap<u64, Segment>,
    /// Segments created so far (each segment's `seq`).
    created: u64,
    /// The expandable segments (`None`: a released slot).
    pub expandable: Vec<Option<Expandable<P, S>>>,
    /// Physical pages just unmapped by page recycling, with their size
    /// and id, for the mapping that follows in the same operation (no
    /// release and create in between); empty between operations.
    pub spare: Vec<(u64, P, PhysId)>,
    /// The last [`PhysId`] given.
    phys_ids: PhysId,
    /// Where each physical allocation of a run is mapped: (expandable
    /// index, first page). Ordered maps: ids are handed out in order, so
    /// lookups stay cheap, with no hashing (SipHash cost a move about 100
    /// instructions per operation; a fast hasher's `HashMap` here made the
    /// default configuration's free path 1% longer in the fat-LTO build).
    pub homes: BTreeMap<PhysId, (u32, usize)>,
    /// Where each physical allocation has ghost mappings.
    pub ghost_sites: BTreeMap<PhysId, Sites>,
    /// Ghost mappings in all.
    pub ghost_count: usize,
    /// No more ghosts: the backend refused to map memory that a ghost
    /// still maps.
    pub ghosts_off: bool,
    /// The driver calls that moving memory makes, counted since the
    /// allocator was made ([`MoveCalls`]).
    pub moves: MoveCalls,
}

/// The driver calls of cachalot's expandable mode that move memory rather
/// than add it: recycled runs mapped again at a new place (a map and its
/// access), mappings unmapped (ghosts dropped, pages unmapped with ghosts
/// off or on release), physical memory released. Fresh memory (a create,
/// its map and its access) is not counted: a workload needs it whatever
/// the policy. Page recycling's budget (`Recycling`) weighs them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MoveCalls {
    /// Recycled runs mapped at a new place (`map` + `set_access`).
    pub remaps: u64,
    /// Mappings unmapped (`unmap`).
    pub unmaps: u64,
    /// Physical allocations released (`release_physical`).
    pub releases: u64,
}

impl MoveCalls {
    /// The calls made since `earlier`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            remaps: self.remaps - earlier.remaps,
            unmaps: self.unmaps - earlier.unmaps,
            releases: self.releases - earlier.releases,
        }
    }
}

impl<P, S> Default for Segments<P, S> {
    fn default() -> Self {
        Self {
            map: BTreeMap::new(),
            created: 0,
            expandable: Vec::new(),
            spare: Vec::new(),
            phys_ids: 0,
            homes: BTreeMap::new(),
            ghost_sites: BTreeMap::new(),
            ghost_count: 0,
            ghosts_off: false,
            moves: MoveCalls::default(),
        }
    }
}

impl<P, S> Segments<P, S> {
    /// Whether `[addr, addr + size)` meets a registered segment.
    pub fn overlaps(&self, addr: u64, size: u64) -> bool {
        self.find(addr).is_some()
            || self
                .map
                .range(addr..addr.saturating_add(size))
                .next()
                .is_some()
    }

    /// The segment whose range contains `addr`, as (start, segment).
    pub fn find(&self, addr: u64) -> Option<(u64, &Segment)> {
        self.map
            .range(..=addr)
            .next_back()
            .filter(|(start, seg)| addr < *start + seg.size)
            .map(|(&a, s)| (a, s))
    }

    /// The expandable segment containing `addr` (which must be in one).
    pub fn expandable_at(&self, addr: u64) -> (u32, &Expandable<P, S>) {
        // A device has a few expandable segments (one per stream and pool):
        // a scan of their slots is several times cheaper than the ordered
        // map of every segment, which many fixed ones may share.
        if self.expandable.len() <= SCAN_SLOTS {
            for (i, e) in self.expandable.iter().enumerate() {
                if let Some(e) = e
                    && e.start <= addr
                    && addr < e.start + e.size
                {
                    return (i as u32, e);
                }
            }
        }
        match self.find(addr) {
            Some((_, s)) => match s.kind {
                SegmentKind::Expandable { index } => (
                    index,
                    self.expandable[index as usize]
                        .as_ref()
                        .expect("a live expandable segment"),
                ),
                SegmentKind::Fixed => panic!("{addr:#x} is in a fixed segment"),
            },
            None => panic!("{addr:#x} is in no segment"),
        }
    }

    /// Registers a new expandable segment whose head block is `head`.
    pub fn add_expandable(&mut self, e: Expandable<P, S>, head: BlockId) -> u64 {
        let (start, size) = (e.start, e.size);
        let index = match self.expandable.iter().position(Option::is_none) {
            Some(i) => {
                self.expandable[i] = Some(e);
                i
            }
            None => {
                self.expandable.push(Some(e));
                self.expandable.len() - 1
            }
        };
        let seq = self.next_seq();
        self.map.insert(
            start,
            Segment {
                size,
                head,
                oversize: false,
                kind: SegmentKind::Expandable {
                    index: index as u32,
                },
            },
        );
        seq
    }

    /// Sets the head block of the segment at `start`.
    pub fn set_head(&mut self, start: u64, head: BlockId) {
        self.map.get_mut(&start).expect("a registered segment").head = head;
    }

    /// Unregisters the expandable segment at `start`; returns it.
    pub fn remove_expandable(&mut self, start: u64) -> Expandable<P, S> {
        let seg = self.map.remove(&start).expect("a registered segment");
        let SegmentKind::Expandable { index } = seg.kind else {
            panic!("not an expandable segment");
        };
        self.expandable[index as usize]
            .take()
            .expect("a live expandable segment")
    }

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

    /// A new [`PhysId`].
    fn next_phys(&mut self) -> PhysId {
        self.phys_ids += 1;
        self.phys_ids
    }

    /// Forgets ghost `(index, at)` of physical allocation `id` in the
    /// site index.
    fn forget_site(&mut self, id: PhysId, index: u32, at: usize) {
        if let Some(v) = self.ghost_sites.get_mut(&id) {
            v.retain(|s| *s != (index, at));
            if v.is_empty() {
                self.ghost_sites.remove(&id);
            }
        }
        self.ghost_count -= 1;
    }

    /// The next segment age.
    fn next_seq(&mut self) -> u64 {
        self.created += 1;
        self.created
    }
}

/// Returns a fixed segment's memory to the device (or to the segment
/// source that gave it).
fn free_segment<B: Backend>(
    inner: &mut Inner<B>,
    backend: &B,
    addr: u64,
    seg: &Segment,
) -> Result<(), BackendError> {
    match seg.kind {
        SegmentKind::Fixed => inner.release_segment_memory(backend, addr, seg.size),
        SegmentKind::Expandable { .. } => unreachable!("expandable segments are unmapped"),
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
    pub(crate) fn record(&mut self, bytes: u64, e: BackendError) {
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

/// What [`Inner::alloc_segment`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NewSegment {
    /// The new segment's block (free, counted out to the request's stream).
    Got(BlockId),
    /// Out of memory, or over the memory fraction (the ladder goes on).
    None,
    /// A fixed segment of this many bytes is to come from a device call
    /// made with the device lock released
    /// (`release_lock_on_device_malloc`, `unlocked.rs`): nothing changed.
    Call(u64),
}

impl NewSegment {
    /// The block, when there is one.
    pub fn from_found(found: Option<BlockId>) -> Self {
        found.map_or(Self::None, Self::Got)
    }
}

/// Whether a free block may be returned to the device: it is its whole
/// (fixed) segment.
#[inline]
pub(crate) fn releasable<S>(b: &Block<S>) -> bool {
    !b.is_split() && !b.expandable
}

impl<B: Backend> Inner<B> {
    /// Gets a new segment of `p.alloc_size` bytes from the device as one free
    /// block counted out to `p.stream` (PyTorch's `alloc_block`).
    /// [`NewSegment::None`] = out of memory, or over the memory fraction
    /// (retry may help); [`NewSegment::Call`] = a fixed segment whose
    /// device call the caller makes with the lock released; `Err` =
    /// another driver error.
    pub(super) fn alloc_segment(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<NewSegment, Error> {
        let size = p.alloc_size;
        let expandable = self.expandable_in(p.pool) && backend.virtual_memory().is_some();
        // cachalot's expandable mode: the chain to map into is chosen
        // first, then pages elsewhere recycle to make room (before the
        // memory-fraction check: recycled pages make room)
        let mut chain = None;
        let moves = expandable && self.moves_memory(backend);
        let calls = self.segments.moves;
        if moves {
            let (need, keep, target) = match self.recycling_chain(p) {
                Some((start, need, keep)) => {
                    chain = Some(start);
                    (need, keep, Some((self.blocks[start].addr, p.size)))
                }
                None => (p.size, 0..0, None),
            };
            self.recycle_pages(backend, need, keep, target);
        }
        // (the bytes of device calls in flight with the lock released
        // count: two of them must not both pass the cap; PyTorch lets
        // them)
        if let Some(max) = self.limits.allowed_max
            && self.stats.reserved_bytes.all().current as u64 + self.in_flight.bytes + size > max
        {
            self.release_spare(backend);
            return Ok(NewSegment::None);
        }
        if expandable {
            let r = self.alloc_expandable(backend, p, chain);
            self.release_spare(backend);
            if moves {
                let live = self.stats.allocated_bytes.all().peak.max(0) as u64;
                let made = self.segments.moves.since(&calls);
                self.recycling.charge(made, self.events.clock(), live);
            }
            return r.map(NewSegment::from_found);
        }
        if self.config.release_lock_on_device_malloc {
            return Ok(NewSegment::Call(size));
        }
        let got = self.segment_memory(backend, p.pool, size);
        self.new_fixed_segment(p, size, got)
            .map(NewSegment::from_found)
    }

    /// Registers the fixed segment of `size` bytes that the device call
    /// for `p` got (`got`) as one free block counted out to `p.stream`;
    /// `Ok(None)` when the call was out of memory.
    pub(super) fn new_fixed_segment(
        &mut self,
        p: &Params<B::Stream>,
        size: u64,
        got: Result<u64, DeviceAllocError>,
    ) -> Result<Option<BlockId>, Error> {
        let ptr = match got {
            Ok(ptr) => ptr,
            Err(DeviceAllocError::OutOfMemory) => return Ok(None),
            Err(DeviceAllocError::Backend(e)) => return Err(e.into()),
        };
        let oversize = size >= self.config.max_split_size;
        self.stats
            .on_segment_alloc(StatType::of_pool(p.small), size, oversize);
        self.pools.add_segment(p.pool);
        let seq = self.segments.next_seq();
        let part = self.router.shard(p.stream);
        let id = self.blocks.insert(
            part,
            Block {
                seq,
                ..Block::free(ptr, size, p.stream, p.pool, p.small, NIL, NIL)
            },
        );
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
        self.track(TraceAction::SegmentAlloc, ptr, size, p.pool, p.stream);
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
        // trackers hear of it before the memory goes (NCCL deregisters it)
        self.track(TraceAction::SegmentFree, addr, size, pool, stream);
        if let Err(e) = free_segment(self, backend, addr, &seg) {
            self.track(TraceAction::SegmentAlloc, addr, size, pool, stream);
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
        let mut expandable = Vec::new();
        for id in ids {
            let b = &self.blocks[id];
            if b.expandable {
                expandable.push(id);
            } else if releasable(b) {
                self.release_segment(backend, id);
            }
        }
        // PyTorch's `release_blocks`: the free blocks of expandable
        // segments are gathered first (unmapping edits the free set)
        for id in expandable {
            let b = &self.blocks[id];
            if b.state == BState::Free && b.expandable {
                self.unmap_block(backend, id);
            }
        }
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
            if seg.kind == SegmentKind::Fixed {
                keep(free_segment(self, backend, addr, &seg).map_err(Error::from));
            }
        }
        let expandable = std::mem::take(&mut self.segments.expandable);
        if let Some(vm) = backend.virtual_memory() {
            // every ghost first: then a run's memory is mapped only there
            for e in expandable.iter().flatten() {
                for (&i, &(n, _)) in &e.ghosts {
                    keep(
                        vm.unmap(e.start + i as u64 * e.page, n as u64 * e.page)
                            .map_err(Error::from),
                    );
                }
            }
            for e in expandable.into_iter().flatten() {
                for (i, (n, h, _)) in e.runs {
                    keep(
                        vm.unmap(e.start + i as u64 * e.page, n as u64 * e.page)
                            .map_err(Error::from),
                    );
                    keep(vm.release_physical(h).map_err(Error::from));
                }
                keep(vm.unreserve(e.start, e.size).map_err(Error::from));
            }
        }
        self.segments.ghost_sites.clear();
        self.segments.homes.clear();
        self.segments.ghost_count = 0;
        first_err.map_or(Ok(()), Err)
    }
}
