//! Expandable segments (`expandable_segments:True`), as PyTorch 2.11's
//! `try_allocate_expandable_block`, `find_expandable_block`, `map_block`,
//! `unmap_block` and `release_expandable_segment`: one reserved range per
//! (stream, pool), pages mapped on demand, whole free pages unmapped on
//! release. The virtual-memory calls themselves are in `segments/pages.rs`.
#![forbid(unsafe_code)]

mod recycle;

use crate::backend::Backend;
use crate::config::Placement;
use crate::engine::block::{BState, Block, BlockId, NIL};
use crate::engine::history::TraceAction;
use crate::engine::pools::{DEFAULT_POOL, PoolIdx};
use crate::engine::rounding::SMALL_BUFFER;
use crate::engine::segments::UnmapSync;
use crate::engine::state::{Inner, Params};
use crate::error::Error;

pub(crate) use recycle::Recycling;

/// A chain of free and unmapped blocks of one stream, contiguous in its
/// segment, that holds a request ([`Inner::chain_at`]).
struct Chain {
    /// The first block.
    start: BlockId,
    /// The last block.
    last: BlockId,
    /// The bytes of the request that fall on unmapped blocks.
    unmapped: u64,
}

impl<B: Backend> Inner<B> {
    /// The page size of the small or large pool's expandable segments.
    pub(super) fn expandable_page(&self, small: bool) -> u64 {
        if small || self.recycles_pages() {
            SMALL_BUFFER
        } else {
            self.config.large_segment_size
        }
    }

    /// Whether expandable segments recycle pages (cachalot's expandable
    /// mode: every placement but `placement:pytorch`, which keeps PyTorch
    /// 2.11's pages and growth exactly). Then both pools map 2 MiB pages, and
    /// a segment about to grow past the peak of reserved memory first
    /// unmaps whole free pages of any stream's expandable segments
    /// ([`Self::recycle_pages`]), so their memory serves the new mapping.
    pub(super) fn recycles_pages(&self) -> bool {
        self.config.placement != Placement::PyTorch
    }

    /// Whether new segments of `pool` are expandable: always with
    /// `expandable_segments:True` given; with the default (the key not
    /// given, `AllocatorConfig::resolve_expandable`), in the default pool
    /// only. A private pool (a CUDA graph's) never recycles pages, so there
    /// expandable segments would bring only their 2 MiB rounding per
    /// stream and pool: on the H200 the graph of a CUDA-graphed MLP held
    /// 180,355,072 B in cachalot's default against 178,257,920 in PyTorch's
    /// fixed segments (`python/train_compare.py`). Its fixed segments are
    /// PyTorch's.
    pub(super) fn expandable_in(&self, pool: PoolIdx) -> bool {
        self.config.expandable_segments
            && (pool == DEFAULT_POOL || self.config.expandable_segments_given)
            && !self.has_source(pool)
    }

    /// The chain of free and unmapped blocks of `p.stream` at unmapped
    /// block `c` (starting at the free block just before it, if any) that
    /// holds `p.size` bytes, as PyTorch's `find_expandable_block` walks it;
    /// `None` when it is too short.
    fn chain_at(&self, c: BlockId, p: &Params<B::Stream>) -> Option<Chain> {
        let prev = self.blocks[c].prev;
        let start = if self.allocatable(prev, p.stream) {
            prev
        } else {
            c
        };
        let (mut bytes, mut unmapped, mut b, mut last) = (0u64, 0u64, start, start);
        while bytes < p.size && self.allocatable(b, p.stream) {
            let blk = &self.blocks[b];
            if blk.state == BState::Unmapped {
                unmapped += blk.size.min(p.size - bytes);
            }
            bytes += blk.size;
            last = b;
            b = blk.next;
        }
        (bytes >= p.size).then_some(Chain {
            start,
            last,
            unmapped,
        })
    }

    /// Whether block `id` is a free block of an expandable segment with no
    /// pending use, whose whole pages a release may unmap.
    pub(super) fn unmappable(&self, id: BlockId) -> bool {
        let b = &self.blocks[id];
        b.state == BState::Free && b.expandable && b.event_count == 0 && b.stream_uses.is_empty()
    }

    /// PyTorch's `try_allocate_expandable_block`: a mapped block of at least
    /// `p.size` bytes, out of the free set and counted out. `Ok(None)`: out
    /// of memory.
    pub(super) fn alloc_expandable(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
        chain: Option<BlockId>,
    ) -> Result<Option<BlockId>, Error> {
        let size = p.size;
        let found = match chain {
            Some(start) => Some(start),
            None => self.find_expandable_block(backend, p)?,
        };
        let Some(mut cand) = found else {
            return Ok(None);
        };
        if self.blocks[cand].state == BState::Unmapped {
            let n = self.blocks[cand].size.min(size);
            match self.map_block(backend, cand, n)? {
                Some(id) => cand = id,
                None => return Ok(None),
            }
        }
        while self.blocks[cand].size < size {
            let next = self.blocks[cand].next;
            debug_assert!(next != NIL && self.blocks[next].state == BState::Unmapped);
            let n = (size - self.blocks[cand].size).min(self.blocks[next].size);
            match self.map_block(backend, next, n)? {
                Some(id) => cand = id,
                None => return Ok(None),
            }
        }
        self.remove_free(cand);
        self.pools.pool_mut(p.pool, p.small).free.note_out(p.stream);
        Ok(Some(cand))
    }

    /// Whether block `id` may be part of a chain to map into: free or
    /// unmapped, of `stream`, with no pending use.
    fn allocatable(&self, id: BlockId, stream: B::Stream) -> bool {
        id != NIL && {
            let b = &self.blocks[id];
            matches!(b.state, BState::Free | BState::Unmapped)
                && b.stream == stream
                && b.event_count == 0
                && b.stream_uses.is_empty()
        }
    }

    /// PyTorch's `find_expandable_block`: the first chain (lowest address)
    /// of free/unmapped blocks of the stream with `p.size` bytes, starting
    /// at an unmapped block or the free block just before it; else a new
    /// expandable segment's single unmapped block. `Ok(None)`: the
    /// reservation failed for lack of address space.
    fn find_expandable_block(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<Option<BlockId>, Error> {
        let pool = self.pools.pool(p.pool, p.small);
        for (_, &c) in pool.unmapped.range((p.stream, 0)..=(p.stream, u64::MAX)) {
            if let Some(chain) = self.chain_at(c, p) {
                return Ok(Some(chain.start));
            }
        }
        let page = self.expandable_page(p.small);
        let need = p.size.div_ceil(page) * page;
        let mut size = self.reservation_size(p.stream, page, need);
        let (start, seq) = loop {
            if let Some(r) = self.reserve_expandable(backend, size, page, p.stream)? {
                break r;
            }
            // Where the device has less address space left than asked for
            // (a process that reserved much already, a simulated device of
            // terabytes): in cachalot's mode what the request needs, so the
            // address space left serves as many streams as it can; in
            // PyTorch's, half as much, down to the request.
            let next = if self.recycles_pages() {
                need
            } else {
                (size / 2).div_ceil(page) * page
            };
            if next < need || next >= size {
                return Ok(None);
            }
            size = next;
        };
        let mut b = Block::free(start, size, p.stream, p.pool, p.small, NIL, NIL);
        b.state = BState::Unmapped;
        b.expandable = true;
        b.seq = seq;
        let part = self.router.shard(p.stream);
        let id = self.blocks.insert(part, b);
        self.segments.set_head(start, id);
        self.pools.add_segment(p.pool);
        self.pools
            .pool_mut(p.pool, p.small)
            .unmapped
            .insert((p.stream, start), id);
        tracing::debug!(size, start, "expandable segment reserved");
        Ok(Some(id))
    }

    /// The bytes a new expandable segment of `stream` reserves for a
    /// request of `need` bytes (a multiple of `page`). PyTorch's mode
    /// reserves 1.125x the device's memory for every segment, as PyTorch
    /// 2.11 does. In cachalot's mode the device's memory is shared by the
    /// streams, so a reservation is that size divided among the live
    /// expandable segments (this one counted): the first gets all of it,
    /// the `k`-th 1/`k`. A stream that outgrows its segments reserves
    /// another (`find_expandable_block`), at least as large as those it
    /// holds, so a stream that grows holds few segments. The address space
    /// so taken by `n` segments is at most 1.125x the device's memory times
    /// the `n`-th harmonic number (8.4x for 1,000 streams, 10.8x for
    /// 10,000) plus what the requests themselves need, where a reservation
    /// of 1.125x the device per stream ran out of a 15 TiB address space at
    /// the 98th stream of a 140 GiB device.
    fn reservation_size(&self, stream: B::Stream, page: u64, need: u64) -> u64 {
        let total = self.limits.total_memory;
        let space = (total + total / 8).div_ceil(page) * page;
        if !self.recycles_pages() {
            return space;
        }
        let (mut live, mut own) = (0u64, 0u64);
        for e in self.segments.expandable.iter().flatten() {
            live += 1;
            if e.stream == stream {
                own += e.size;
            }
        }
        let share = (space / (live + 1)).div_ceil(page) * page;
        share.max(own.min(space)).max(need)
    }

    /// PyTorch's `map_block`: maps the pages covering the first `size`
    /// bytes of unmapped block `id`, splits off the unmapped rest, merges
    /// the mapped part with free neighbours and files it free. Returns the
    /// merged block; `Ok(None)`: out of memory (nothing changed).
    fn map_block(&mut self, backend: &B, id: BlockId, size: u64) -> Result<Option<BlockId>, Error> {
        let (addr, bsize, stream, pool, small) = {
            let b = &self.blocks[id];
            debug_assert!(b.state == BState::Unmapped && size <= b.size && size > 0);
            (b.addr, b.size, b.stream, b.pool, b.small)
        };
        let Some((mapped, calls)) = self.map_pages(backend, addr, size)? else {
            return Ok(None);
        };
        debug_assert!(mapped >= size && mapped <= bsize);
        self.pools
            .pool_mut(pool, small)
            .unmapped
            .remove(&(stream, addr));
        if mapped < bsize {
            let rid = self.blocks.split(id, mapped);
            self.blocks[rid].state = BState::Unmapped;
            self.pools
                .pool_mut(pool, small)
                .unmapped
                .insert((stream, addr + mapped), rid);
        }
        self.blocks[id].state = BState::Free;
        let id = self.merge_free_neighbours(id);
        self.insert_free(id);
        self.stats
            .on_map(crate::stats::StatType::of_pool(small), mapped, calls);
        self.trace(TraceAction::SegmentMap, addr, mapped, stream);
        self.track(TraceAction::SegmentMap, addr, mapped, pool, stream);
        Ok(Some(id))
    }

    /// Merges free block `id` (not in the free set) with its free
    /// neighbours of the same stream; returns the merged block.
    fn merge_free_neighbours(&mut self, mut id: BlockId) -> BlockId {
        let stream = self.blocks[id].stream;
        let prev = self.blocks[id].prev;
        if prev != NIL
            && self.blocks[prev].state == BState::Free
            && self.blocks[prev].stream == stream
        {
            self.remove_free(prev);
            self.blocks.absorb_next(prev);
            id = prev;
        }
        let next = self.blocks[id].next;
        if next != NIL
            && self.blocks[next].state == BState::Free
            && self.blocks[next].stream == stream
        {
            self.remove_free(next);
            self.blocks.absorb_next(id);
        }
        id
    }

    /// PyTorch's `unmap_block`: unmaps the whole pages inside free block
    /// `id` of an expandable segment (the slivers before and after stay
    /// free), merges the unmapped part with unmapped neighbours, and
    /// unreserves the segment when that leaves it one unmapped block.
    pub(super) fn unmap_block(&mut self, backend: &B, id: BlockId) {
        let pool = self.blocks[id].pool;
        let sync = if pool != DEFAULT_POOL {
            UnmapSync::Device
        } else {
            UnmapSync::Stream
        };
        self.unmap_block_with(backend, id, None, sync, true);
    }

    /// [`Self::unmap_block`] with the synchronization given, of the whole
    /// pages of `range` (a part of the block) or of the whole block,
    /// unreserving a segment left wholly unmapped when `unreserve`; returns
    /// the bytes unmapped.
    fn unmap_block_with(
        &mut self,
        backend: &B,
        id: BlockId,
        range: Option<(u64, u64)>,
        sync: UnmapSync,
        unreserve: bool,
    ) -> u64 {
        let (addr, size, stream, pool, small) = {
            let b = &self.blocks[id];
            debug_assert!(b.state == BState::Free && b.expandable);
            (b.addr, b.size, b.stream, b.pool, b.small)
        };
        let (addr, size) = range.unwrap_or((addr, size));
        let Some((ustart, usize_, calls)) = self.unmap_pages(backend, addr, size, sync) else {
            return 0;
        };
        let addr = self.blocks[id].addr;
        self.remove_free(id);
        let mut id = id;
        if ustart > addr {
            let rid = self.blocks.split(id, ustart - addr);
            self.insert_free(id);
            id = rid;
        }
        if self.blocks[id].size > usize_ {
            let rid = self.blocks.split(id, usize_);
            self.insert_free(rid);
        }
        self.blocks[id].state = BState::Unmapped;
        // Unmapped neighbours merge regardless of stream (PyTorch's
        // `try_merge_blocks` compares `mapped` only); the merged block takes
        // the segment's stream.
        let seg_stream = self.segments.expandable_at(ustart).1.stream;
        let prev = self.blocks[id].prev;
        if prev != NIL && self.blocks[prev].state == BState::Unmapped {
            let (ps, pa) = (self.blocks[prev].stream, self.blocks[prev].addr);
            self.pools.pool_mut(pool, small).unmapped.remove(&(ps, pa));
            self.blocks.absorb_next(prev);
            id = prev;
        }
        let next = self.blocks[id].next;
        if next != NIL && self.blocks[next].state == BState::Unmapped {
            let (ns, na) = (self.blocks[next].stream, self.blocks[next].addr);
            self.pools.pool_mut(pool, small).unmapped.remove(&(ns, na));
            self.blocks.absorb_next(id);
        }
        self.rekey(id, seg_stream);
        let b = &mut self.blocks[id];
        let (baddr, whole) = (b.addr, !b.is_split());
        self.pools
            .pool_mut(pool, small)
            .unmapped
            .insert((seg_stream, baddr), id);
        self.stats
            .on_unmap(crate::stats::StatType::of_pool(small), usize_, calls);
        self.trace(TraceAction::SegmentUnmap, ustart, usize_, stream);
        self.track(TraceAction::SegmentUnmap, ustart, usize_, pool, stream);
        if whole && unreserve {
            self.release_expandable_segment(backend, id);
        }
        usize_
    }

    /// Unreserves the expandable segment whose single block is unmapped
    /// block `id` (PyTorch's `release_expandable_segment`).
    pub(super) fn release_expandable_segment(&mut self, backend: &B, id: BlockId) {
        let b = &self.blocks[id];
        debug_assert!(b.state == BState::Unmapped && !b.is_split());
        let (addr, stream, pool, small) = (b.addr, b.stream, b.pool, b.small);
        if !self.unreserve_expandable(backend, addr) {
            return;
        }
        self.pools
            .pool_mut(pool, small)
            .unmapped
            .remove(&(stream, addr));
        self.pools.remove_segment(pool);
        self.blocks.remove(id);
        tracing::debug!(addr, "expandable segment unreserved");
    }
}
