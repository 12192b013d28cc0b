//! Device segments: the segment type, the registry by address, and the
//! only calls of [`Backend::malloc`] and [`Backend::free`] in the engine.
//! Also what a segment's blocks may do with it: whether a free block is a
//! releasable segment, and whether a bad pointer lies inside one.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use smallvec::SmallVec;

use crate::backend::{Backend, DevicePointer, VirtualMemory};
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
    /// ([`Backend::malloc`]).
    Fixed,
    /// A reserved virtual range whose pages are mapped on demand
    /// (`expandable_segments:True`): index into [`Segments`]' expandable
    /// list.
    Expandable { index: u32 },
}

/// The most pages one physical allocation of cachalot's expandable mode
/// holds: two 2 MiB pages. Each run is one `cuMemCreate` and one
/// `cuMemMap` (on the H200 each call costs about the same for 4 MiB as for
/// 2 MiB), but recycling and release take runs whole, so longer runs strand
/// free pages next to live ones. Measured on the mock (VMM calls in the
/// first pass, then per later pass; peak reserved / live peak), runs of
/// 1 / 2 / 4 / 8 pages: gpt2_train 8,780 then 0, 1.0198 / 4,626 then 0-3,
/// 1.0165 / 2,414 then up to 344 (no longer settles) / 1,404 then 75-182;
/// side_stream_pipeline 507 per pass, 1.0765 / 353, 1.1073 / 196, 1.1688
/// / 0, 1.2611; churn_1stream about 8,400 / 5,400 / 4,100 / 1,600 per pass
/// at 1.0625 / 1.0625 / 1.0625 / 1.0796; churn_4streams 13,000 / 9,200 /
/// 5,400 / 2,400 at 1.0624 / 1.0624 / 1.0759 / 1.1070.
pub(crate) const MAX_RUN: usize = 2;

/// A mapping of at least this many pages (48 MiB) in cachalot's
/// expandable mode is made of runs of up to [`LARGE_RUN`] pages instead of
/// [`MAX_RUN`]: the driver's calls cost about the same for 24 MiB as for
/// 4 MiB, and a large block is mostly freed, and recycled, whole, so large
/// runs strand few pages; small mappings keep runs of two. Measured on the
/// mock (`docs/design-expandable.md`, "Large mappings in large runs"),
/// VMM calls of the first pass: gpt2_train 4,626 -> 1,872,
/// resnet50_train 1,755 -> 1,061, churn_1stream 16,122 -> 12,590,
/// churn_4streams 33,248 -> 28,544; peak reserved / live peak unchanged
/// but for gpt2_train 1.0165 -> 1.0190 and churn_4streams 1.0624 -> 1.0748.
/// From 32 MiB (16 pages) the churn traces save more calls but
/// churn_4streams reaches 1.097, against the 1.10 bound; from 16 MiB (8
/// pages) side_stream_pipeline reaches 1.26.
pub(crate) const LARGE_MAPPING: usize = 24;

/// The most pages one run of a large mapping holds (24 MiB): runs of 16
/// pages or more take the churn traces past 1.08.
pub(crate) const LARGE_RUN: usize = 12;

/// The most ghost mappings cachalot's expandable mode keeps
/// ([`Expandable::ghosts`]); past it, recycled pages are unmapped.
pub(crate) const GHOSTS: usize = 1 << 16;

/// Expandable slots [`Segments::expandable_at`] scans before it asks the
/// ordered map of all segments.
const SCAN_SLOTS: usize = 16;

/// The identity of one physical allocation of an expandable segment (the
/// backend's handles need not compare).
pub(crate) type PhysId = u64;

/// The physical-memory handle type of a backend.
pub(crate) type Phys<B> = <<B as Backend>::VirtualMemory as VirtualMemory>::Physical;

/// Runs one mapping call handles: (first page, pages, physical memory,
/// id), a few, kept inline.
type Runs<B> = SmallVec<[(usize, usize, Phys<B>, PhysId); 4]>;

/// An expandable segment (PyTorch's `ExpandableSegment`): a reservation
/// cut into pages, mapped in runs: each run of pages is one physical
/// allocation and one mapping (PyTorch's mode: a run per page).
pub(crate) struct Expandable<P, S> {
    pub start: u64,
    pub size: u64,
    pub page: u64,
    /// The mapped runs by first page index: (pages in the run, the
    /// physical memory mapped there, its [`PhysId`]). A sparse table: a
    /// reservation spans about 1.125× the device in 2 MiB pages, of which
    /// few are mapped.
    pub runs: BTreeMap<usize, (usize, P, PhysId)>,
    /// Ghost mappings by first page index: (pages, physical memory),
    /// physical memory that page recycling moved elsewhere and whose old
    /// mapping here was kept (cachalot's expandable mode, [`GHOSTS`]). To
    /// the engine these pages are unmapped; on the device they still map
    /// that memory, so it moves back here with no driver call.
    pub ghosts: BTreeMap<usize, (usize, PhysId)>,
    /// Pages in the reservation.
    pub npages: usize,
    /// The stream it was created for (synchronized before unmapping).
    pub stream: S,
}

impl<P, S> Expandable<P, S> {
    /// Bytes mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.runs.values().map(|r| r.0 as u64).sum::<u64>() * self.page
    }

    /// The run holding page `i`: (first page, pages).
    pub fn run_at(&self, i: usize) -> Option<(usize, usize)> {
        let (&at, &(n, _, _)) = self.runs.range(..=i).next_back()?;
        (at + n > i).then_some((at, n))
    }

    /// The ghosts that overlap pages `lo..hi`: (first page, pages, id).
    pub fn ghosts_in(&self, lo: usize, hi: usize) -> SmallVec<[(usize, usize, PhysId); 4]> {
        self.ghosts
            .range(lo.saturating_sub(LARGE_RUN)..hi)
            .filter(|(at, (n, _))| *at + *n > lo)
            .map(|(&at, &(n, id))| (at, n, id))
            .collect()
    }

    /// Mapped pages among pages `lo..hi`.
    pub fn mapped_in(&self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        if let Some((at, len)) = self.run_at(lo) {
            n += (at + len).min(hi) - lo;
        }
        for (&at, &(len, _, _)) in self.runs.range(lo + 1..hi) {
            n += (at + len).min(hi) - at;
        }
        n
    }

    /// The pages of `lo..hi` an unmap can take: the range less a run at
    /// either end that reaches past it (a mapping is unmapped whole).
    pub fn whole_runs(&self, mut lo: usize, mut hi: usize) -> (usize, usize) {
        if lo < hi
            && let Some((at, n)) = self.run_at(lo)
            && at < lo
        {
            lo = at + n;
        }
        if lo < hi
            && let Some((at, n)) = self.run_at(hi - 1)
            && at + n > hi
        {
            hi = at;
        }
        (lo, hi.max(lo))
    }
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

/// The ghost sites of one physical allocation, (expandable index, first
/// page): most have one or two, kept inline (no heap allocation per move).
pub(crate) type Sites = SmallVec<[(u32, usize); 2]>;

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
        }
    }
}

impl<P, S> Segments<P, S> {
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

/// Returns a fixed segment's memory to the device.
fn free_segment<B: Backend>(backend: &B, addr: u64, seg: &Segment) -> Result<(), BackendError> {
    match seg.kind {
        SegmentKind::Fixed => backend.free(B::Ptr::from_addr(addr), seg.size),
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

/// Whether a free block may be returned to the device: it is its whole
/// (fixed) segment.
#[inline]
pub(crate) fn releasable<S>(b: &Block<S>) -> bool {
    !b.is_split() && !b.expandable
}

/// What [`Inner::unmap_pages`] waits for before unmapping (unmapping does
/// not wait for pending work).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnmapSync {
    /// The whole device (a private pool's pages: its graphs may run on any
    /// stream).
    Device,
    /// The segment's stream: an event recorded on it and waited for.
    Stream,
    /// Page recycling: the caller has synchronized the segment's stream
    /// already, and the physical pages go to [`Segments::spare`] for the
    /// mapping that follows instead of back to the device.
    Recycle,
}

/// Waits for the work queued on `stream` so far (an event recorded on it
/// and waited for).
pub(crate) fn sync_stream<B: Backend>(backend: &B, stream: B::Stream) -> Result<(), BackendError> {
    backend.create_event().and_then(|ev| {
        let r = backend
            .record_event(&ev, stream)
            .and_then(|()| backend.synchronize_event(&ev));
        let d = backend.destroy_event(ev);
        r.and(d)
    })
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
        let expandable = self.expandable_in(p.pool) && backend.virtual_memory().is_some();
        // cachalot's expandable mode: the chain to map into is chosen
        // first, then pages elsewhere recycle to make room (before the
        // memory-fraction check: recycled pages make room)
        let mut chain = None;
        if expandable && self.moves_memory(backend) {
            let (need, keep, target) = match self.recycling_chain(p) {
                Some((start, need, keep)) => {
                    chain = Some(start);
                    (need, keep, Some((self.blocks[start].addr, p.size)))
                }
                None => (p.size, 0..0, None),
            };
            self.recycle_pages(backend, need, keep, target);
        }
        if let Some(max) = self.limits.allowed_max
            && self.stats.reserved_bytes.all().current as u64 + size > max
        {
            self.release_spare(backend);
            return Ok(None);
        }
        if expandable {
            let r = self.alloc_expandable(backend, p, chain);
            self.release_spare(backend);
            return r;
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
        tracing::debug!(size, ptr, "device segment allocated");
        Ok(Some(id))
    }

    /// The bytes of the whole pages inside free expandable block `id` (what
    /// unmapping it gives back).
    pub(super) fn unmappable_bytes(&self, id: BlockId) -> u64 {
        let b = &self.blocks[id];
        let (_, e) = self.segments.expandable_at(b.addr);
        let (lo, hi) = e.whole_runs(
            (b.addr - e.start).div_ceil(e.page) as usize,
            ((b.addr + b.size - e.start) / e.page) as usize,
        );
        (hi - lo) as u64 * e.page
    }

    /// Releases the recycled pages the mapping did not take (and their
    /// ghosts).
    fn release_spare(&mut self, backend: &B) {
        if self.segments.spare.is_empty() {
            return;
        }
        let Some(vm) = backend.virtual_memory() else {
            return;
        };
        for (bytes, h, id) in std::mem::take(&mut self.segments.spare) {
            self.release_physical(vm, bytes, h, id);
        }
    }

    /// Releases physical allocation `id` (mapped nowhere but in its
    /// ghosts, which are unmapped first).
    fn release_physical(&mut self, vm: &B::VirtualMemory, bytes: u64, h: Phys<B>, id: PhysId) {
        self.drop_ghosts_of(vm, id);
        if let Err(err) = vm.release_physical(h) {
            tracing::warn!(%err, "releasing a page's memory failed");
            self.release_failures.record(bytes, err);
        }
    }

    /// Unmaps ghost mapping `at` of expandable segment `index`.
    fn drop_ghost(&mut self, vm: &B::VirtualMemory, index: u32, at: usize) {
        let e = self.segments.expandable[index as usize]
            .as_mut()
            .expect("a live expandable segment");
        let Some((n, id)) = e.ghosts.remove(&at) else {
            return;
        };
        let (addr, bytes) = (e.start + at as u64 * e.page, n as u64 * e.page);
        self.stats.num_device_free += 1;
        if let Err(err) = vm.unmap(addr, bytes) {
            tracing::warn!(%err, addr, "unmapping a ghost mapping failed");
            self.release_failures.record(0, err);
        }
        self.segments.forget_site(id, index, at);
    }

    /// Unmaps every ghost mapping of physical allocation `id`.
    fn drop_ghosts_of(&mut self, vm: &B::VirtualMemory, id: PhysId) {
        // (out of the index first: `drop_ghost` finds no entry to edit)
        let sites = self.segments.ghost_sites.remove(&id).unwrap_or_default();
        for (index, at) in sites {
            self.drop_ghost(vm, index, at);
        }
    }

    /// Unmaps every ghost mapping inside expandable segment `index`.
    fn drop_ghosts_in(&mut self, vm: &B::VirtualMemory, index: u32) {
        let ats: Vec<usize> = self.segments.expandable[index as usize]
            .as_ref()
            .map(|e| e.ghosts.keys().copied().collect())
            .unwrap_or_default();
        for at in ats {
            self.drop_ghost(vm, index, at);
        }
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
    pub(super) fn block_containing(&self, addr: u64) -> Option<BlockId> {
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

    /// Reserves the range of a new expandable segment of `size` bytes in
    /// pages of `page` bytes for `stream` and registers it (head block still
    /// to set); returns (start, age). `Ok(None)`: no address space.
    pub(super) fn reserve_expandable(
        &mut self,
        backend: &B,
        size: u64,
        page: u64,
        stream: B::Stream,
    ) -> Result<Option<(u64, u64)>, Error> {
        let vm = backend
            .virtual_memory()
            .ok_or_else(|| Error::from(crate::config::expandable_unsupported()))?;
        let gran = vm.granularity()?;
        debug_assert!(page.is_multiple_of(gran));
        let start = match vm.reserve(size) {
            Ok(a) => a,
            Err(DeviceAllocError::OutOfMemory) => return Ok(None),
            Err(DeviceAllocError::Backend(e)) => return Err(e.into()),
        };
        let pages = (size / page) as usize;
        let e = Expandable {
            start,
            size,
            page,
            runs: BTreeMap::new(),
            ghosts: BTreeMap::new(),
            npages: pages,
            stream,
        };
        let seq = self.segments.add_expandable(e, NIL);
        Ok(Some((start, seq)))
    }

    /// Maps the pages covering `[addr, addr + size)` of an expandable
    /// segment (`addr` on a page boundary, the pages unmapped), then sets
    /// access on what is newly mapped. A ghost mapping there whose physical
    /// memory page recycling freed in this operation becomes the run again,
    /// with no driver call; other ghosts in the range are unmapped. Physical
    /// memory recycled in this operation ([`Segments::spare`]) goes next, a
    /// run at a time where it fits; the rest is new: in cachalot's mode one
    /// physical allocation and one mapping per run of [`MAX_RUN`] pages
    /// (half the driver calls of one per page), or of [`LARGE_RUN`] pages
    /// when the mapping has at least [`LARGE_MAPPING`]; in PyTorch's mode
    /// one per page, as PyTorch 2.11.
    /// Returns the bytes mapped and whether a driver call mapped any;
    /// `Ok(None)`: out of device memory (nothing mapped).
    pub(super) fn map_pages(
        &mut self,
        backend: &B,
        addr: u64,
        size: u64,
    ) -> Result<Option<(u64, bool)>, Error> {
        let vm = backend
            .virtual_memory()
            .ok_or_else(|| Error::from(crate::config::expandable_unsupported()))?;
        let (index, e) = self.segments.expandable_at(addr);
        let (start, page) = (e.start, e.page);
        debug_assert!((addr - start).is_multiple_of(page));
        let begin = ((addr - start) / page) as usize;
        let end = (addr + size - start).div_ceil(page) as usize;
        let runs_of_many = self.recycles_pages();
        // ghosts whose memory is spare come back; the others go
        let mut back: Runs<B> = SmallVec::new();
        for (at, n, id) in e.ghosts_in(begin, end) {
            let whole = at >= begin && at + n <= end;
            match self.segments.spare.iter().position(|s| s.2 == id) {
                Some(k) if whole => {
                    let (_, h, id) = self.segments.spare.swap_remove(k);
                    back.push((at, n, h, id));
                }
                _ => self.drop_ghost(vm, index, at),
            }
        }
        back.sort_unstable_by_key(|r| r.0);
        // (first page, pages, physical memory, id)
        let mut made: Runs<B> = SmallVec::new();
        // on failure everything goes to the spare list, which the caller
        // releases (with the ghosts of what was recycled)
        let undo = |this: &mut Self, made: Runs<B>, back: Runs<B>, mapped: usize| {
            for (k, (i, n, h, id)) in made.into_iter().enumerate() {
                if k < mapped {
                    let _ = vm.unmap(start + i as u64 * page, n as u64 * page);
                }
                this.segments.spare.push((n as u64 * page, h, id));
            }
            for (_, n, h, id) in back {
                this.segments.spare.push((n as u64 * page, h, id));
            }
        };
        let mut i = begin;
        let mut next_back = back.iter().map(|r| (r.0, r.1)).peekable();
        while i < end {
            if let Some(&(at, n)) = next_back.peek()
                && at == i
            {
                next_back.next();
                i += n;
                continue;
            }
            let gap_end = next_back.peek().map_or(end, |r| r.0);
            let left = (gap_end - i) as u64 * page;
            if let Some(k) = self
                .segments
                .spare
                .iter()
                .rposition(|(n, _, _)| *n <= left && n.is_multiple_of(page))
            {
                let (n, h, id) = self.segments.spare.swap_remove(k);
                let n = (n / page) as usize;
                made.push((i, n, h, id));
                i += n;
                continue;
            }
            let n = if !runs_of_many {
                1
            } else if end - begin >= LARGE_MAPPING {
                (gap_end - i).min(LARGE_RUN)
            } else {
                (gap_end - i).min(MAX_RUN)
            };
            let mut made_phys = vm.create_physical(n as u64 * page);
            if matches!(made_phys, Err(DeviceAllocError::OutOfMemory))
                && !self.segments.spare.is_empty()
            {
                // recycled memory this mapping cannot use goes back first
                self.release_spare(backend);
                made_phys = vm.create_physical(n as u64 * page);
            }
            match made_phys {
                Ok(h) => {
                    let id = self.segments.next_phys();
                    made.push((i, n, h, id));
                }
                Err(err) => {
                    undo(self, made, back, 0);
                    return match err {
                        DeviceAllocError::OutOfMemory => Ok(None),
                        DeviceAllocError::Backend(e) => Err(e.into()),
                    };
                }
            }
            i += n;
        }
        for k in 0..made.len() {
            let (i, n, ref h, id) = made[k];
            let (at, bytes) = (start + i as u64 * page, n as u64 * page);
            let mut r = vm.map(at, bytes, h);
            if r.is_err() && self.segments.ghost_sites.contains_key(&id) {
                // a driver that maps physical memory at one place only:
                // its ghosts go, and no ghost is made from now on
                tracing::debug!("mapping memory that has a ghost mapping failed; ghosts off");
                self.segments.ghosts_off = true;
                self.drop_ghosts_of(vm, id);
                r = vm.map(at, bytes, h);
            }
            if let Err(err) = r {
                undo(self, made, back, k);
                return Err(err.into());
            }
        }
        // access on each stretch of new mappings (ghosts have it)
        let mut k = 0;
        while k < made.len() {
            let mut j = k + 1;
            while j < made.len() && made[j].0 == made[j - 1].0 + made[j - 1].1 {
                j += 1;
            }
            let first = start + made[k].0 as u64 * page;
            let bytes = (made[j - 1].0 + made[j - 1].1 - made[k].0) as u64 * page;
            if let Err(err) = vm.set_access(first, bytes, backend.device()) {
                let all = made.len();
                undo(self, made, back, all);
                return Err(err.into());
            }
            k = j;
        }
        let calls = !made.is_empty();
        for &(at, _, _, id) in &back {
            self.segments.forget_site(id, index, at);
        }
        let e = self.segments.expandable[index as usize]
            .as_mut()
            .expect("a live expandable segment");
        for (at, n, h, id) in back.into_iter().chain(made) {
            e.ghosts.remove(&at);
            let old = e.runs.insert(at, (n, h, id));
            debug_assert!(old.is_none());
            self.segments.homes.insert(id, (index, at));
        }
        Ok(Some(((end - begin) as u64 * page, calls)))
    }

    /// Unmaps and releases the whole pages inside `[addr, addr + size)` of
    /// an expandable segment, after synchronizing the segment's stream (an
    /// event recorded on it and waited for: unmapping does not wait for
    /// pending work), or the device with `whole_device` (a private pool's
    /// segment: its graphs may run on any stream). With
    /// [`UnmapSync::Recycle`] the physical memory goes to the spare list and
    /// the mapping stays as a ghost (while fewer than [`GHOSTS`] are kept),
    /// with no driver call. Returns the unmapped range (start, bytes) and
    /// whether a driver call unmapped any of it; `None` when no whole page
    /// lies inside or the first step failed (recorded in
    /// `release_failures`).
    pub(super) fn unmap_pages(
        &mut self,
        backend: &B,
        addr: u64,
        size: u64,
        sync: UnmapSync,
    ) -> Option<(u64, u64, bool)> {
        let vm = backend.virtual_memory()?;
        let (index, e) = self.segments.expandable_at(addr);
        let (start, page, stream) = (e.start, e.page, e.stream);
        let (begin, end) = e.whole_runs(
            (addr - start).div_ceil(page) as usize,
            ((addr + size - start) / page) as usize,
        );
        // Unmapping needs a synchronization, which a capture underway
        // forbids: the pages stay mapped until a release path outside
        // capture.
        if begin >= end || self.capture.is_active() {
            return None;
        }
        // recycled pages keep their physical memory for the next mapping
        let keep = sync == UnmapSync::Recycle;
        let sync = match sync {
            UnmapSync::Device => backend.synchronize_device(),
            UnmapSync::Stream => sync_stream(backend, stream),
            UnmapSync::Recycle => Ok(()),
        };
        if let Err(err) = sync {
            // "not now" (a capture the engine does not see, in global mode,
            // forbids it): the pages stay mapped and a later release path
            // tries again; nothing is lost, so it is not a release failure
            tracing::debug!(%err, addr, "synchronizing before an unmap failed; the pages stay mapped");
            return None;
        }
        let mut done = begin;
        let mut calls = false;
        while done < end {
            let i = done;
            let at = start + i as u64 * page;
            let e = self.segments.expandable[index as usize]
                .as_mut()
                .expect("a live expandable segment");
            let n = e.runs.get(&i).expect("a run starts at each mapped page").0;
            debug_assert!(i + n <= end, "whole runs only");
            let bytes = n as u64 * page;
            let ghost = keep && !self.segments.ghosts_off && self.segments.ghost_count < GHOSTS;
            if !ghost {
                calls = true;
                if let Err(err) = vm.unmap(at, bytes) {
                    tracing::warn!(%err, at, "unmapping a page failed; it stays mapped");
                    self.release_failures.record((end - i) as u64 * page, err);
                    break;
                }
            }
            let (_, h, id) = e.runs.remove(&i).expect("a mapped run");
            self.segments.homes.remove(&id);
            done = i + n;
            if ghost {
                e.ghosts.insert(i, (n, id));
                self.segments
                    .ghost_sites
                    .entry(id)
                    .or_default()
                    .push((index, i));
                self.segments.ghost_count += 1;
            }
            if keep {
                self.segments.spare.push((bytes, h, id));
                continue;
            }
            self.release_physical(vm, bytes, h, id);
        }
        (done > begin).then(|| {
            (
                start + begin as u64 * page,
                (done - begin) as u64 * page,
                calls,
            )
        })
    }

    /// Unreserves the (wholly unmapped) expandable segment at `start` and
    /// unregisters it, its ghost mappings unmapped first; false (recorded)
    /// when the backend refuses.
    pub(super) fn unreserve_expandable(&mut self, backend: &B, start: u64) -> bool {
        let Some(vm) = backend.virtual_memory() else {
            return false;
        };
        let (index, e) = self.segments.expandable_at(start);
        let size = e.size;
        self.drop_ghosts_in(vm, index);
        if let Err(err) = vm.unreserve(start, size) {
            tracing::warn!(%err, start, "unreserving an expandable segment failed");
            self.release_failures.record(0, err);
            return false;
        }
        self.segments.remove_expandable(start);
        true
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
                keep(free_segment(backend, addr, &seg).map_err(Error::from));
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
