//! Expandable segments' records and their driver calls: a reservation
//! cut into pages, mapped in runs of physical memory ([`Expandable`]),
//! the ghost mappings page recycling keeps, and the only `VirtualMemory`
//! calls of the engine (reserve, map, unmap, unreserve).

use std::collections::BTreeMap;

use smallvec::SmallVec;

use crate::backend::{Backend, VirtualMemory};
use crate::engine::block::{BlockId, NIL};
use crate::engine::state::Inner;
use crate::error::{BackendError, DeviceAllocError, Error};

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

/// A mapping of at least this many pages (32 MiB) in cachalot's
/// expandable mode is made of runs of up to [`LARGE_RUN`] pages instead of
/// [`MAX_RUN`]: the driver's calls cost about the same for 24 MiB as for
/// 4 MiB, and a large block is mostly freed, and recycled, whole, so large
/// runs strand few pages; small mappings keep runs of two. Measured on the
/// mock (`docs/design-expandable.md`, "Large mappings in large runs" and
/// "A move budget"), with the move budget: 32 MiB against 48 MiB takes the
/// first pass of resnet50_train from 456 runs created to 412 and the
/// churn traces' page moves down by a fifth, every peak unchanged; from 28
/// MiB churn_4streams reaches 1.1001 of its live peak, from 24 MiB
/// 1.1064 (the 1.10 bound); runs of 16 pages take bert_serving from 1.028
/// to 1.066.
pub(crate) const LARGE_MAPPING: usize = 16;

/// The most pages one run of a large mapping holds (24 MiB): runs of 16
/// pages or more take the churn traces past 1.08.
pub(crate) const LARGE_RUN: usize = 12;

/// The most ghost mappings cachalot's expandable mode keeps
/// ([`Expandable::ghosts`]); past it, recycled pages are unmapped.
pub(crate) const GHOSTS: usize = 1 << 16;

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

/// The ghost sites of one physical allocation, (expandable index, first
/// page): most have one or two, kept inline (no heap allocation per move).
pub(crate) type Sites = SmallVec<[(u32, usize); 2]>;

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
    /// already, and the physical pages go to [`Segments::spare`](super::Segments::spare) for the
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
    /// The bytes of the whole pages inside free expandable block `id` (what
    /// unmapping it gives back).
    pub(in crate::engine) fn unmappable_bytes(&self, id: BlockId) -> u64 {
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
    pub(super) fn release_spare(&mut self, backend: &B) {
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
    pub(super) fn release_physical(
        &mut self,
        vm: &B::VirtualMemory,
        bytes: u64,
        h: Phys<B>,
        id: PhysId,
    ) {
        self.drop_ghosts_of(vm, id);
        self.segments.moves.releases += 1;
        if let Err(err) = vm.release_physical(h) {
            tracing::warn!(%err, "releasing a page's memory failed");
            self.release_failures.record(bytes, err);
        }
    }

    /// Unmaps ghost mapping `at` of expandable segment `index`.
    pub(super) fn drop_ghost(&mut self, vm: &B::VirtualMemory, index: u32, at: usize) {
        let e = self.segments.expandable[index as usize]
            .as_mut()
            .expect("a live expandable segment");
        let Some((n, id)) = e.ghosts.remove(&at) else {
            return;
        };
        let (addr, bytes) = (e.start + at as u64 * e.page, n as u64 * e.page);
        self.stats.num_device_free += 1;
        self.segments.moves.unmaps += 1;
        if let Err(err) = vm.unmap(addr, bytes) {
            tracing::warn!(%err, addr, "unmapping a ghost mapping failed");
            self.release_failures.record(0, err);
        }
        self.segments.forget_site(id, index, at);
    }

    /// Unmaps every ghost mapping of physical allocation `id`.
    pub(super) fn drop_ghosts_of(&mut self, vm: &B::VirtualMemory, id: PhysId) {
        // (out of the index first: `drop_ghost` finds no entry to edit)
        let sites = self.segments.ghost_sites.remove(&id).unwrap_or_default();
        for (index, at) in sites {
            self.drop_ghost(vm, index, at);
        }
    }

    /// Unmaps every ghost mapping inside expandable segment `index`.
    pub(super) fn drop_ghosts_in(&mut self, vm: &B::VirtualMemory, index: u32) {
        let ats: Vec<usize> = self.segments.expandable[index as usize]
            .as_ref()
            .map(|e| e.ghosts.keys().copied().collect())
            .unwrap_or_default();
        for at in ats {
            self.drop_ghost(vm, index, at);
        }
    }

    /// Reserves the range of a new expandable segment of `size` bytes in
    /// pages of `page` bytes for `stream` and registers it (head block still
    /// to set); returns (start, age). `Ok(None)`: no address space.
    pub(in crate::engine) fn reserve_expandable(
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
    /// memory recycled in this operation ([`Segments::spare`](super::Segments::spare)) goes next, a
    /// run at a time where it fits; the rest is new: in cachalot's mode one
    /// physical allocation and one mapping per run of [`MAX_RUN`] pages
    /// (half the driver calls of one per page), or of [`LARGE_RUN`] pages
    /// when the mapping has at least [`LARGE_MAPPING`]; in PyTorch's mode
    /// one per page, as PyTorch 2.11.
    /// Returns the bytes mapped and whether a driver call mapped any;
    /// `Ok(None)`: out of device memory (nothing mapped).
    pub(in crate::engine) fn map_pages(
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
                self.segments.moves.remaps += 1;
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
    pub(in crate::engine) fn unmap_pages(
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
                self.segments.moves.unmaps += 1;
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
    pub(in crate::engine) fn unreserve_expandable(&mut self, backend: &B, start: u64) -> bool {
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
}
