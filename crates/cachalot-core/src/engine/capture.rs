//! Reuse of blocks freed with cross-stream uses during graph capture
//! (PyTorch PR #158352 with #162186's terminals-as-markers and incremental
//! reachability), plus cachalot's `cross_stream` mode.
//!
//! A block freed during capture while it has cross-stream uses gets free
//! markers: the terminal node sets, at free time, of its allocation stream and
//! of every stream that used it. Every later node of a stream whose `visited`
//! set (ancestors-or-self of every terminal the stream has had in this
//! capture) holds all markers is ordered after every use of the block, so the
//! block may be reused by that stream.

use crate::backend::{Backend, CaptureStatus};
use crate::config::CaptureReuse;
use crate::engine::state::{BState, BlockId, Inner, Params, PoolFilter, ReuseContext};
use crate::error::Error;

impl<B: Backend> Inner<B> {
    /// Free markers of a block freed during capture; empty = wait for the
    /// capture's end. Never fails: any doubt gives the safe empty list.
    pub(crate) fn free_markers(&mut self, backend: &B, id: BlockId) -> Result<Vec<B::Node>, Error> {
        let b = &self.blocks[id as usize];
        // Uses recorded before the capture are eager work the graph does not
        // order: those blocks wait for capture end and their events (PyTorch
        // would take the terminals of those streams if they capture now).
        if !b.stream_uses.is_empty() {
            return Ok(Vec::new());
        }
        let streams: Vec<B::Stream> = std::iter::once(b.stream)
            .chain(b.capture_uses.iter().copied())
            .collect();
        let mut markers: Vec<B::Node> = Vec::new();
        let mut capture_id = None;
        for s in streams {
            let info = match backend.capture_info(s) {
                Ok(i) => i,
                Err(e) => {
                    tracing::warn!(%e, "capture_info failed while recording free markers");
                    return Ok(Vec::new());
                }
            };
            if info.status != CaptureStatus::Active {
                return Ok(Vec::new());
            }
            if *capture_id.get_or_insert(info.id) != info.id {
                return Ok(Vec::new());
            }
            for n in info.terminals {
                if !markers.contains(&n) {
                    markers.push(n);
                }
            }
        }
        Ok(markers)
    }

    /// Extends the requesting stream's visited set and returns the capture id,
    /// or `None` when the stream is not capturing into a registered pool.
    fn extend_visited(&mut self, backend: &B, stream: B::Stream) -> Result<Option<u64>, Error> {
        let info = backend.capture_info(stream)?;
        if info.status != CaptureStatus::Active || info.terminals.is_empty() {
            return Ok(None);
        }
        if !self.reuse_contexts.contains_key(&info.id) {
            // A `CaptureOf` entry learns its capture id at the first
            // allocation routed to it; a block freed in capture before any
            // allocation (a default-pool block) must not wait for that.
            for ci in 0..self.captures.len() {
                if let PoolFilter::CaptureOf(origin) = self.captures[ci].filter
                    && self.captures[ci].resolved.is_none()
                {
                    let o = backend.capture_info(origin)?;
                    if o.status == CaptureStatus::Active {
                        self.captures[ci].resolved = Some(o.id);
                    }
                }
            }
            let mut pool = None;
            for c in self.captures.iter().rev() {
                let hit = match &c.filter {
                    PoolFilter::Streams(v) => v.contains(&stream),
                    PoolFilter::CaptureId(id) => *id == info.id,
                    PoolFilter::CaptureOf(_) => c.resolved == Some(info.id),
                };
                if hit {
                    pool = Some(c.pool);
                    break;
                }
            }
            let Some(pool) = pool else { return Ok(None) };
            self.reuse_contexts.insert(
                info.id,
                ReuseContext {
                    visited: Default::default(),
                    pool,
                },
            );
        }
        let ctx = self
            .reuse_contexts
            .get_mut(&info.id)
            .expect("inserted above");
        let visited = ctx.visited.entry(stream).or_default();
        let mut stack: Vec<B::Node> = Vec::new();
        for t in info.terminals {
            if visited.insert(t) {
                stack.push(t);
            }
        }
        while let Some(n) = stack.pop() {
            for d in backend.node_dependencies(n)? {
                if visited.insert(d) {
                    stack.push(d);
                }
            }
        }
        Ok(Some(info.id))
    }

    fn markers_visited(&self, capture: u64, stream: B::Stream, markers: &[B::Node]) -> bool {
        let Some(v) = self
            .reuse_contexts
            .get(&capture)
            .and_then(|c| c.visited.get(&stream))
        else {
            return false;
        };
        markers.iter().all(|m| v.contains(m))
    }

    /// The reclaim step at `malloc` during capture (spec 1.5): deferred blocks
    /// of the requesting stream whose markers are all visited are freed.
    pub(crate) fn reclaim_in_capture(
        &mut self,
        backend: &B,
        stream: B::Stream,
    ) -> Result<(), Error> {
        if !self.deferred.iter().any(|d| !d.markers.is_empty()) {
            return Ok(());
        }
        let Some(capture) = self.extend_visited(backend, stream)? else {
            return Ok(());
        };
        let mut i = 0;
        while i < self.deferred.len() {
            let d = &self.deferred[i];
            let b = &self.blocks[d.block as usize];
            if !d.markers.is_empty()
                && b.stream == stream
                && b.state == BState::Pending
                && b.stream_uses.is_empty()
                && b.event_count == 0
                && self.markers_visited(capture, stream, &d.markers)
            {
                let id = d.block;
                self.deferred.swap_remove(i);
                self.blocks[id as usize].capture_uses.clear();
                self.free_block(id);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// `cross_stream` mode: after the normal search missed, hand the
    /// requesting stream a deferred block of another stream whose markers are
    /// all in the requesting stream's visited set (best fit, lowest address).
    /// The block changes stream; it never merges with blocks of other streams.
    pub(crate) fn cross_stream_reuse(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Result<Option<BlockId>, Error> {
        if self.config.graph_capture_record_stream_reuse != CaptureReuse::CrossStream
            || !self.deferred.iter().any(|d| !d.markers.is_empty())
        {
            return Ok(None);
        }
        let info = backend.capture_info(p.stream)?;
        if info.status != CaptureStatus::Active {
            return Ok(None);
        }
        let capture = info.id;
        let max_split = self.config.max_split_size;
        let mut best: Option<(u64, u64, usize)> = None;
        for (i, d) in self.deferred.iter().enumerate() {
            let b = &self.blocks[d.block as usize];
            if d.markers.is_empty()
                || b.stream == p.stream
                || b.pool != p.pool
                || b.small != p.small
                || b.size < p.size
                || b.state != BState::Pending
                || !b.stream_uses.is_empty()
                || (p.size < max_split && b.size >= max_split)
                || (p.size >= max_split
                    && b.size
                        >= p.size
                            .saturating_add(self.config.max_non_split_rounding_size))
            {
                continue;
            }
            let key = (b.size, b.addr, i);
            if best.is_some_and(|bk| (bk.0, bk.1) <= (key.0, key.1)) {
                continue;
            }
            if self.markers_visited(capture, p.stream, &d.markers) {
                best = Some(key);
            }
        }
        // Free blocks cached under another stream A of this capture: every
        // use of them precedes A's current terminals, so they are safe once
        // those terminals are all in the requesting stream's visited set.
        let mut free_best: Option<(u64, u64, BlockId)> = None;
        {
            let pool = self.pools[p.pool as usize]
                .as_ref()
                .expect("live pool")
                .get_ref(p.small);
            let mut cands: Vec<(u64, u64, B::Stream, BlockId)> = Vec::new();
            for (s, size, addr, id) in pool.free.iter() {
                if s == p.stream
                    || size < p.size
                    || (p.size < max_split && size >= max_split)
                    || (p.size >= max_split
                        && size >= p.size.saturating_add(self.config.max_non_split_rounding_size))
                {
                    continue;
                }
                cands.push((size, addr, s, id));
            }
            cands.sort_unstable_by_key(|c| (c.0, c.1));
            let mut verdict: Vec<(B::Stream, bool)> = Vec::new();
            for (size, addr, s, id) in cands {
                if best.is_some_and(|bk| (bk.0, bk.1) <= (size, addr)) {
                    break;
                }
                let ok = match verdict.iter().find(|v| v.0 == s) {
                    Some(v) => v.1,
                    None => {
                        let i = backend.capture_info(s)?;
                        let ok = i.status == CaptureStatus::Active
                            && i.id == capture
                            && !i.terminals.is_empty()
                            && self.markers_visited(capture, p.stream, &i.terminals);
                        verdict.push((s, ok));
                        ok
                    }
                };
                if ok {
                    free_best = Some((size, addr, id));
                    break;
                }
            }
        }
        if let Some((_, _, id)) = free_best {
            self.remove_free(id);
            self.blocks[id as usize].stream = p.stream;
            return Ok(Some(id));
        }
        let Some((_, _, i)) = best else {
            return Ok(None);
        };
        let id = self.deferred.swap_remove(i).block;
        // Retire the block as if freed (stats), re-keyed to the new stream:
        // it merges only with free blocks of that stream.
        let b = &mut self.blocks[id as usize];
        b.capture_uses.clear();
        b.stream = p.stream;
        let id = self.free_block(id);
        self.remove_free(id);
        Ok(Some(id))
    }
}
