//! The OOM ladder's steps (PyTorch's `malloc` slow path): garbage
//! collection, releasing cached blocks that could serve the request,
//! releasing the whole cache, cachalot's idle-stream reuse, and the OOM
//! report. `Inner::malloc_slow` in `state.rs` climbs them in order.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use crate::backend::Backend;
use crate::engine::block::{BState, BlockId, NIL};
use crate::engine::placement::FitRule;
use crate::engine::pools::DEFAULT_POOL;
use crate::engine::segments::releasable;
use crate::engine::state::{Inner, Params};
use crate::error::{Error, OomReport};

impl<B: Backend> Inner<B> {
    /// PyTorch's `garbage_collect_cached_blocks` (only with a fraction and a
    /// threshold): releases the default large pool's whole free segments,
    /// oldest (least recently considered) first, until usage is back under
    /// the threshold.
    pub(super) fn garbage_collect(&mut self, backend: &B) -> Result<(), Error> {
        let Some(max) = self.limits.allowed_max else {
            return Ok(());
        };
        let threshold = (self.config.garbage_collection_threshold * max as f64) as u64;
        let total = self.stats.reserved_bytes.all().current as u64;
        if total <= threshold {
            return Ok(());
        }
        let target = total - threshold;
        let pool = self.pools.pool(DEFAULT_POOL, false);
        let calls = pool.gc_calls;
        let mut cands: Vec<(BlockId, u64)> = pool
            .free
            .iter()
            .map(|e| e.id)
            .filter(|&id| releasable(&self.blocks[id]))
            .map(|id| (id, calls - self.blocks[id].gc_base))
            .collect();
        let mut total_age: u64 = cands.iter().map(|c| c.1).sum();
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && !cands.is_empty() {
            let age_threshold = total_age / cands.len() as u64;
            freed_any = false;
            let mut keep = Vec::with_capacity(cands.len());
            for (id, age) in cands {
                if age >= age_threshold {
                    total_age -= age;
                    let size = self.blocks[id].size;
                    if self.release_segment(backend, id) {
                        freed_any = true;
                        reclaimed += size;
                    }
                } else {
                    keep.push((id, age));
                }
            }
            cands = keep;
        }
        Ok(())
    }

    /// PyTorch's `release_available_cached_blocks` (only with
    /// `max_split_size` set): releases one whole cached segment of the
    /// stream large enough for `p`, else oversize ones, largest first, that
    /// together are. True when something was released.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<bool, Error> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let target = p.size.max(max_split);
        let pool = self.pools.pool(p.pool, p.small);
        if let Some(f) = pool.free.first_at_least(p.stream, target)
            && releasable(&self.blocks[f.id])
        {
            return Ok(self.release_segment(backend, f.id));
        }
        let candidates: Vec<BlockId> = pool
            .free
            .range_desc(p.stream, max_split, target)
            .into_iter()
            .map(|f| f.id)
            .filter(|&id| releasable(&self.blocks[id]))
            .collect();
        let total: u64 = candidates.iter().map(|&id| self.blocks[id].size).sum();
        if total < target {
            return Ok(false);
        }
        let mut released = 0;
        for id in candidates {
            if released >= target {
                break;
            }
            let size = self.blocks[id].size;
            if self.release_segment(backend, id) {
                released += size;
            }
        }
        Ok(released > 0)
    }

    /// PyTorch's `release_cached_blocks` for the default id: sync all events
    /// (outside capture), release whole free segments of the default pools
    /// and of freeable private pools.
    pub(super) fn release_cached_blocks(&mut self, backend: &B) -> Result<(), Error> {
        if !self.capture.is_active() {
            self.synchronize_and_free_events(backend, None)?;
            // Free neighbours of different streams come from
            // `idle_stream_reuse` and from cross-stream reuse in a capture
            // (a private-pool segment shared by two streams): merged here
            // once their streams are idle, so the segment can be released
            // (found by the engine fuzz target: a released graph's pool kept
            // such a segment forever). A scan of the blocks when none differ.
            self.merge_idle_neighbours(backend)?;
            self.release_default_pools(backend);
        }
        self.release_freeable_private_pools(backend);
        Ok(())
    }

    /// Releases every whole free segment of the default pools.
    pub(super) fn release_default_pools(&mut self, backend: &B) {
        self.release_pool_segments(backend, DEFAULT_POOL, false);
        self.release_pool_segments(backend, DEFAULT_POOL, true);
    }

    /// Releases the whole free segments of private pools no one holds, and
    /// deletes those left without segments.
    pub(super) fn release_freeable_private_pools(&mut self, backend: &B) {
        for idx in 1..self.pools.slots() {
            if !self.pools.is_freeable(idx) {
                continue;
            }
            self.release_pool_segments(backend, idx, false);
            self.release_pool_segments(backend, idx, true);
            self.pools.delete_if_empty(idx);
        }
    }

    /// cachalot extension (`idle_stream_reuse`): the best-fitting whole free
    /// segment of the same pool cached under another, idle stream, re-keyed
    /// to `p`'s stream. Safe because an idle stream has no unfinished work,
    /// so no earlier use of the segment can still run. Only whole segments
    /// move (taking blocks out of split segments fragmented them and cost
    /// memory on `side_stream_pipeline`); blocks merge only within one
    /// stream, and `empty_cache` merges free neighbours of idle streams.
    pub(super) fn take_idle_block(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<Option<BlockId>, Error> {
        let fit = FitRule::of(&self.config);
        let mut cands: Vec<(u64, u64, B::Stream, BlockId)> = self
            .pools
            .pool(p.pool, p.small)
            .free
            .iter()
            .filter(|e| {
                e.stream != p.stream && fit.fits(p.size, e.size) && releasable(&self.blocks[e.id])
            })
            .map(|e| (e.size, e.addr, e.stream, e.id))
            .collect();
        if cands.is_empty() {
            return Ok(None);
        }
        cands.sort_unstable_by_key(|c| (c.0, c.1));
        let mut idle: Vec<(B::Stream, bool)> = Vec::new();
        for (_, _, s, id) in cands {
            if self.stream_is_idle_cached(backend, &mut idle, s)? {
                self.remove_free(id);
                self.rekey(id, p.stream);
                self.pools.pool_mut(p.pool, p.small).free.note_out(p.stream);
                tracing::debug!(?s, to = ?p.stream, "reusing an idle stream's cached segment");
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// Merges adjacent free blocks of different streams when every stream
    /// involved is idle (undoing the splits left by `take_idle_block` and by
    /// cross-stream reuse during a capture).
    fn merge_idle_neighbours(&mut self, backend: &B) -> Result<(), Error> {
        let mut idle: Vec<(B::Stream, bool)> = Vec::new();
        for head in self.segments.heads() {
            let mut id = head;
            while id != NIL {
                let next = self.blocks[id].next;
                if next == NIL {
                    break;
                }
                let (a, b) = (&self.blocks[id], &self.blocks[next]);
                if a.state != BState::Free || b.state != BState::Free {
                    id = next;
                    continue;
                }
                // Free neighbours of one stream merge as `free_block` would
                // have, had the stream boundary between them not been there
                // when they were freed (a block just re-keyed here).
                let (sa, sb) = (a.stream, b.stream);
                if sa != sb
                    && (!self.stream_is_idle_cached(backend, &mut idle, sa)?
                        | !self.stream_is_idle_cached(backend, &mut idle, sb)?)
                {
                    id = next;
                    continue;
                }
                // re-key `next` to this block's stream and merge it in
                self.remove_free(id);
                self.remove_free(next);
                let st = self.blocks[id].stat_type();
                self.blocks.absorb_next(id);
                let b = &self.blocks[id];
                // expandable blocks stay out of `inactive_split` (PyTorch
                // 2.11), so their merges change nothing there
                if !b.expandable {
                    self.stats.on_merge_split(st, b.size, b.is_split());
                }
                self.insert_free(id);
                // stay on `id`: it may merge with its new next neighbour too
            }
        }
        Ok(())
    }

    /// The report of an allocation that nothing on the ladder could serve.
    pub(super) fn oom_report(&self, backend: &B, p: &Params<B::Stream>) -> OomReport {
        let info = backend.memory_info().unwrap_or_default();
        let mut private_cached = 0u64;
        let mut per_stream: BTreeMap<String, u64> = BTreeMap::new();
        let mut largest = [0u64; 2];
        let mut releasable_bytes = 0u64;
        for (i, pp) in self.pools.iter() {
            for (small, pool) in pp.both() {
                for e in pool.free.iter() {
                    *per_stream.entry(format!("{:?}", e.stream)).or_default() += e.size;
                    if i == DEFAULT_POOL {
                        let l = &mut largest[usize::from(!small)];
                        *l = (*l).max(e.size);
                        let b = &self.blocks[e.id];
                        if releasable(b) {
                            releasable_bytes += e.size;
                        } else if self.unmappable(e.id) {
                            // the whole pages an expandable block's release unmaps
                            releasable_bytes += self.unmappable_bytes(e.id);
                        }
                    } else {
                        private_cached += e.size;
                    }
                }
            }
        }
        let reserved = self.stats.reserved_bytes.all().current as u64;
        let allocated = self.stats.allocated_bytes.all().current as u64 + private_cached;
        let allowed = self.limits.allowed_max;
        let limit = allowed.map_or(info.free + releasable_bytes, |m| {
            m.saturating_sub(reserved) + releasable_bytes
        });
        OomReport {
            backend: backend.name(),
            device: backend.device(),
            requested: p.requested,
            rounded: p.size,
            segment_size: p.alloc_size,
            total: info.total.max(self.limits.total_memory),
            device_free: info.free,
            allowed,
            allocated,
            private_pool_cached: private_cached,
            reserved,
            largest_free_small: largest[0],
            largest_free_large: largest[1],
            cached_per_stream: per_stream.into_iter().collect(),
            // only what is releasable can help: with nothing to release,
            // emptying the cache changes nothing, however much the device
            // has free (then what ran out is not its memory)
            fits_after_empty_cache: releasable_bytes > 0 && limit >= p.alloc_size,
        }
    }
}
