//! The reuse steps during capture: free markers at a free, the reclaim step
//! at a malloc (PyTorch PR #158352), and `cross_stream` mode's adoption of
//! free neighbours and search of other streams' blocks.
#![forbid(unsafe_code)]

use super::{MallocCtx, PoolFilter, capture_state, graph};
use crate::backend::{Backend, CaptureStatus, NodeOf};
use crate::config::CaptureReuse;
use crate::engine::block::{BState, BlockId, Blocks, NIL};
use crate::engine::free_set::Found;
use crate::engine::placement::FitRule;
use crate::engine::pools::PoolIdx;
use crate::engine::state::{Inner, Params};
use crate::error::Error;

/// A stream's next candidate in the cross-stream search.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Head<S> {
    size: u64,
    addr: u64,
    stream: S,
    id: BlockId,
}

/// The deferred block the cross-stream search would take: its size and
/// address (the best-fit key) and its index in the deferred list.
#[derive(Clone, Copy, Debug)]
struct DeferredPick {
    size: u64,
    addr: u64,
    index: usize,
}

impl DeferredPick {
    fn key(&self) -> (u64, u64) {
        (self.size, self.addr)
    }
}

/// A free block held out of its set during the cross-stream search (put
/// back before the search returns).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held<S> {
    stream: S,
    size: u64,
    addr: u64,
    id: BlockId,
    /// The block's dormant key.
    dormant: Option<u64>,
}

impl<B: Backend> Inner<B> {
    /// Free markers of a block freed during capture; empty = wait for the
    /// capture's end. Never fails: any doubt gives the safe empty list.
    pub(in crate::engine) fn free_markers(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<Vec<NodeOf<B>>, Error> {
        let b = &self.blocks[id];
        // Uses recorded before the capture are eager work the graph does not
        // order: those blocks wait for capture end and their events (PyTorch
        // would take the terminals of those streams if they capture now).
        if !b.stream_uses.is_empty() {
            return Ok(Vec::new());
        }
        let uses = 1 + b.capture_uses.len();
        let buf = &mut self.capture.scratch.other;
        let mut markers: Vec<NodeOf<B>> = Vec::new();
        let mut capture_id = None;
        for k in 0..uses {
            let b = &self.blocks[id];
            let s = if k == 0 {
                b.stream
            } else {
                b.capture_uses[k - 1]
            };
            let (status, cid) = match capture_state(backend, s, buf) {
                Ok(i) => i,
                Err(e) => {
                    tracing::warn!(%e, "capture_info failed while recording free markers");
                    return Ok(Vec::new());
                }
            };
            if status != CaptureStatus::Active {
                return Ok(Vec::new());
            }
            if *capture_id.get_or_insert(cid) != cid {
                return Ok(Vec::new());
            }
            for &n in buf.iter() {
                if !markers.contains(&n) {
                    markers.push(n);
                }
            }
        }
        // The caller defers the block with these markers: the reclaim step
        // of its stream has something new to look at.
        let stream = self.blocks[id].stream;
        if let Some(c) = capture_id
            && self.ensure_context(backend, stream, c)?
            && let Some(ctx) = self.capture.contexts.get_mut(&c)
        {
            ctx.cross.checks.entry(stream).or_default().pushes += 1;
        }
        Ok(markers)
    }

    /// Extends the requesting stream's visited set; returns the capture id
    /// (the stream's current terminals are left in the scratch's
    /// `terminals`), or `None` when the stream is not capturing into a
    /// registered pool. Uses what `ctx` knows of the stream's terminals.
    fn extend_visited(
        &mut self,
        backend: &B,
        stream: B::Stream,
        ctx: &mut MallocCtx<B::Stream>,
    ) -> Result<Option<u64>, Error> {
        if let Some((s, capture, walked)) = ctx.terminals.take()
            && s == stream
        {
            // The reclaim step of this malloc asked already (and the
            // context exists); walk unless it did.
            if !walked && let Some(ctx) = self.capture.contexts.get_mut(&capture) {
                ctx.visited.visit(
                    graph(backend)?,
                    capture,
                    stream,
                    &self.capture.scratch.terminals,
                )?;
            }
            return Ok(Some(capture));
        }
        let (status, capture) =
            capture_state(backend, stream, &mut self.capture.scratch.terminals)?;
        if status != CaptureStatus::Active || self.capture.scratch.terminals.is_empty() {
            return Ok(None);
        }
        if !self.ensure_context(backend, stream, capture)? {
            return Ok(None);
        }
        if let Some(ctx) = self.capture.contexts.get_mut(&capture) {
            ctx.visited.visit(
                graph(backend)?,
                capture,
                stream,
                &self.capture.scratch.terminals,
            )?;
        }
        Ok(Some(capture))
    }

    fn markers_visited(
        &self,
        backend: &B,
        capture: u64,
        stream: B::Stream,
        markers: &[NodeOf<B>],
    ) -> bool {
        let Some(cap) = backend.capture() else {
            return false;
        };
        self.capture
            .contexts
            .get(&capture)
            .is_some_and(|c| c.visited.all_visited(cap, capture, stream, markers))
    }

    /// `cross_stream` mode: logs the free block `id` (just freed and merged)
    /// as freed by its stream now. Called for every block that becomes free
    /// during a capture.
    pub(in crate::engine) fn note_capture_free(&mut self, backend: &B, id: BlockId) {
        if self.config.graph_capture_record_stream_reuse != CaptureReuse::CrossStream
            || !self.capture.is_active()
        {
            return;
        }
        let b = &self.blocks[id];
        let (stream, lo, hi) = (b.stream, b.addr, b.addr + b.size);
        let (status, capture) = match capture_state(
            backend,
            stream,
            &mut self.capture.scratch.other,
        ) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(%e, "capture_info failed; cross-stream reuse of free blocks stops");
                for c in self.capture.contexts.values_mut() {
                    c.cross.poisoned = true;
                }
                return;
            }
        };
        if status != CaptureStatus::Active {
            return;
        }
        match self.ensure_context(backend, stream, capture) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(%e, "capture_info failed; cross-stream reuse of free blocks stops");
                for c in self.capture.contexts.values_mut() {
                    c.cross.poisoned = true;
                }
                return;
            }
        }
        self.capture
            .contexts
            .get_mut(&capture)
            .expect("ensured above")
            .cross
            .log_free(lo, hi, stream, &self.capture.scratch.other);
    }

    /// Whether every snapshot logged over `[lo, hi)` is in `stream`'s
    /// visited set (capture `capture`).
    fn range_visited(
        &mut self,
        backend: &B,
        capture: u64,
        stream: B::Stream,
        lo: u64,
        hi: u64,
    ) -> bool {
        let (Some(cap), Some(ctx)) = (backend.capture(), self.capture.contexts.get_mut(&capture))
        else {
            return false;
        };
        let visited = &ctx.visited;
        let log = &mut ctx.cross;
        // The ranges over `[lo, hi)`: those starting below `hi` and ending
        // after `lo`, walked down from `hi`.
        for (_, &(end, s, ix)) in log.ranges.range(..hi).rev() {
            if end <= lo {
                break;
            }
            let known = log.known.get(&(stream, s)).copied().unwrap_or(0);
            if ix < known {
                continue;
            }
            let Some(&(at, len)) = log.snaps.get(&s).and_then(|v| v.get(ix as usize)) else {
                return false;
            };
            let snap = &log.snap_nodes[at as usize..(at + len) as usize];
            if !visited.all_visited(cap, capture, stream, snap) {
                return false;
            }
            log.known.insert((stream, s), ix + 1);
        }
        true
    }

    /// Whether free blocks of pool `pool` may move between the streams of
    /// capture `capture`: the capture's free log is intact, `pool` is the
    /// capture's pool, and no stream-filtered (eager, unlogged) allocation
    /// shares it.
    fn free_blocks_may_move(&self, capture: u64, pool: PoolIdx) -> bool {
        self.capture.contexts.get(&capture).is_some_and(|ctx| {
            !ctx.cross.poisoned
                && self.pools.find(ctx.pool) == Some(pool)
                && !self
                    .capture
                    .captures
                    .iter()
                    .any(|c| c.pool == ctx.pool && matches!(c.filter, PoolFilter::Streams(_)))
        })
    }

    /// Whether `stream` captures into capture `capture` (answers cached in
    /// `member` for one search).
    fn in_capture(
        &mut self,
        backend: &B,
        capture: u64,
        stream: B::Stream,
        member: &mut Vec<(B::Stream, bool)>,
    ) -> Result<bool, Error> {
        if let Some(m) = member.iter().find(|m| m.0 == stream) {
            return Ok(m.1);
        }
        let (status, id) = self.capture_status(backend, stream)?;
        let ok = status == CaptureStatus::Active && id == capture;
        member.push((stream, ok));
        Ok(ok)
    }

    /// The reclaim step at `malloc` during capture (spec 1.5): deferred blocks
    /// of the requesting stream whose markers are all visited are freed.
    /// Returns what it learned of the stream for the rest of the malloc.
    pub(in crate::engine) fn reclaim_in_capture(
        &mut self,
        backend: &B,
        stream: B::Stream,
    ) -> Result<MallocCtx<B::Stream>, Error> {
        let mut mctx = MallocCtx::default();
        if !self
            .capture
            .deferred
            .iter()
            .any(|d| d.stream == stream && !d.markers.is_empty())
        {
            // Nothing to reclaim for this stream. Skipping the visited-set
            // extension is sound: a stream's terminals only move forward, so
            // a later extension covers this moment's ancestors too.
            return Ok(mctx);
        }
        let (status, capture) =
            capture_state(backend, stream, &mut self.capture.scratch.terminals)?;
        mctx.queried = Some((stream, status, capture));
        if status != CaptureStatus::Active || self.capture.scratch.terminals.is_empty() {
            return Ok(mctx);
        }
        if !self.ensure_context(backend, stream, capture)? {
            return Ok(mctx);
        }
        mctx.terminals = Some((stream, capture, false));
        // Nothing new since the last check (same terminals, no block
        // deferred since): nothing can have become reclaimable (and the
        // visited set covers these terminals).
        let terminals = &self.capture.scratch.terminals;
        let ctx = self
            .capture
            .contexts
            .get_mut(&capture)
            .expect("ensured above");
        let check = ctx.cross.checks.entry(stream).or_default();
        let pushes = check.pushes;
        let same = check.checked.as_ref().is_some_and(|(t, _)| t == terminals);
        if same && check.checked.as_ref().is_some_and(|&(_, p)| p == pushes) {
            mctx.terminals = Some((stream, capture, true));
            return Ok(mctx);
        }
        // Same terminals as at the last check: the visited set covers them.
        if !same {
            ctx.visited
                .visit(graph(backend)?, capture, stream, terminals)?;
        }
        mctx.terminals = Some((stream, capture, true));
        match &mut check.checked {
            Some((t, p)) => {
                t.clone_from(terminals);
                *p = pushes;
            }
            None => check.checked = Some((terminals.clone(), pushes)),
        }
        // Free every reclaimable deferred block, in the order of a scan that
        // swap-removes each (the element moved into a freed slot is looked
        // at next). Freeing a block changes no other deferred block's
        // eligibility.
        let cap = graph(backend)?;
        let mut i = 0;
        while let Some(ctx) = self.capture.contexts.get(&capture) {
            let (deferred, blocks) = (&self.capture.deferred, &self.blocks);
            let found = (i..deferred.len()).find(|&j| {
                let d = &deferred[j];
                d.stream == stream
                    && !d.markers.is_empty()
                    && {
                        let b = &blocks[d.block];
                        debug_assert_eq!(b.stream, d.stream);
                        b.state == BState::Pending && b.stream_uses.is_empty() && b.event_count == 0
                    }
                    && ctx.visited.all_visited(cap, capture, stream, &d.markers)
            });
            let Some(j) = found else { break };
            i = j;
            let id = self.capture.deferred.swap_remove(i).block;
            self.blocks[id].capture_uses.clear();
            self.adopt_free_neighbours(backend, id, &mut mctx)?;
            let id = self.free_block(id);
            // As `note_capture_free`, with the terminals just asked for.
            if self.config.graph_capture_record_stream_reuse == CaptureReuse::CrossStream {
                let b = &self.blocks[id];
                let (lo, hi) = (b.addr, b.addr + b.size);
                self.capture
                    .contexts
                    .get_mut(&capture)
                    .expect("ensured above")
                    .cross
                    .log_free(lo, hi, stream, &self.capture.scratch.terminals);
            }
        }
        Ok(mctx)
    }

    /// `cross_stream` mode, before block `id` (of stream T, about to be
    /// freed during capture) merges with its neighbours: a free neighbour
    /// cached under another stream joins T's free set when every free logged
    /// over its bytes is in T's visited set (T's later work is ordered after
    /// all of that memory's captured uses), so the two merge instead of
    /// leaving the segment cut at a stream boundary.
    pub(in crate::engine) fn adopt_free_neighbours(
        &mut self,
        backend: &B,
        id: BlockId,
        ctx: &mut MallocCtx<B::Stream>,
    ) -> Result<(), Error> {
        if self.config.graph_capture_record_stream_reuse != CaptureReuse::CrossStream {
            return Ok(());
        }
        let b = &self.blocks[id];
        let t = b.stream;
        let nbs = [b.prev, b.next];
        let cand = |blocks: &Blocks<B::Stream>, n: BlockId| {
            n != NIL && {
                let nb = &blocks[n];
                nb.state == BState::Free && nb.stream != t
            }
        };
        if !nbs.iter().any(|&n| cand(&self.blocks, n)) {
            return Ok(());
        }
        // Ask afresh (the merge may follow a reclaim that changed the graph
        // position the context recorded).
        ctx.terminals = None;
        let Some(capture) = self.extend_visited(backend, t, ctx)? else {
            return Ok(());
        };
        if !self.free_blocks_may_move(capture, self.blocks[id].pool) {
            return Ok(());
        }
        let mut member = std::mem::take(&mut self.capture.scratch.member);
        member.clear();
        for n in nbs {
            if !cand(&self.blocks, n) {
                continue;
            }
            let (s, lo, hi) = {
                let nb = &self.blocks[n];
                (nb.stream, nb.addr, nb.addr + nb.size)
            };
            // a failed query only means no adoption
            let in_capture = self
                .in_capture(backend, capture, s, &mut member)
                .unwrap_or(false);
            if in_capture && self.range_visited(backend, capture, t, lo, hi) {
                self.remove_free(n);
                self.rekey(n, t);
                self.insert_free(n);
            }
        }
        self.capture.scratch.member = member;
        Ok(())
    }

    /// `cross_stream` mode: after the normal search missed, hand the
    /// requesting stream the best-fitting (size, then address) block among
    /// the deferred blocks of other streams whose markers are all in its
    /// visited set and the free blocks of other streams of the capture whose
    /// logged frees all are. The block changes stream; it never merges with
    /// blocks of other streams.
    pub(in crate::engine) fn cross_stream_reuse(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
        ctx: &mut MallocCtx<B::Stream>,
    ) -> Result<Option<BlockId>, Error> {
        if self.config.graph_capture_record_stream_reuse != CaptureReuse::CrossStream {
            return Ok(None);
        }
        let Some(capture) = self.extend_visited(backend, p.stream, ctx)? else {
            return Ok(None);
        };
        let deferred = self.best_deferred_of_other_streams(backend, capture, p);
        let free = if self.free_blocks_may_move(capture, p.pool) {
            self.best_free_of_other_streams(backend, capture, p, deferred)?
        } else {
            None
        };
        let id = if let Some(id) = free {
            self.remove_free(id);
            self.rekey(id, p.stream);
            id
        } else if let Some(c) = deferred {
            let id = self.capture.deferred.swap_remove(c.index).block;
            // Retire the block as if freed (stats), re-keyed to the new
            // stream: it merges only with free blocks of that stream.
            let b = &mut self.blocks[id];
            b.capture_uses.clear();
            let (from, pool, small) = (b.stream, b.pool, b.small);
            self.rekey(id, p.stream);
            // the block is out: count it under its new stream
            let free = &mut self.pools.pool_mut(pool, small).free;
            free.note_back_only(from);
            free.note_out(p.stream);
            let id = self.free_block(id);
            self.remove_free(id);
            id
        } else {
            return Ok(None);
        };
        // Whatever of the block stays free (a split remainder) is ordered
        // before the new stream's current terminals: log it so.
        let (lo, hi) = {
            let b = &self.blocks[id];
            (b.addr, b.addr + b.size)
        };
        if let Some(ctx) = self.capture.contexts.get_mut(&capture) {
            ctx.cross
                .log_free(lo, hi, p.stream, &self.capture.scratch.terminals);
        }
        Ok(Some(id))
    }

    /// The best-fitting deferred block of another stream that `p.stream`
    /// may take: its markers are all in the stream's visited set.
    fn best_deferred_of_other_streams(
        &self,
        backend: &B,
        capture: u64,
        p: &Params<B::Stream>,
    ) -> Option<DeferredPick> {
        let rule = FitRule::of(&self.config);
        let mut best: Option<DeferredPick> = None;
        for (i, d) in self.capture.deferred.iter().enumerate() {
            let b = &self.blocks[d.block];
            if d.markers.is_empty()
                || b.stream == p.stream
                || b.pool != p.pool
                || b.small != p.small
                || !rule.fits(p.size, b.size)
                || b.state != BState::Pending
                || !b.has_no_other_uses()
            {
                continue;
            }
            if best.is_some_and(|bk| bk.key() <= (b.size, b.addr)) {
                continue;
            }
            if self.markers_visited(backend, capture, p.stream, &d.markers) {
                best = Some(DeferredPick {
                    size: b.size,
                    addr: b.addr,
                    index: i,
                });
            }
        }
        best
    }

    /// The best-fitting free block of another stream of capture `capture`
    /// that `p.stream` may take (every free logged over its bytes is in the
    /// stream's visited set), if it fits better than `deferred`.
    ///
    /// The candidates are the fitting free blocks of other streams in
    /// (size, address) order; the first whose stream captures here and
    /// whose logged frees are all visited wins. They are visited in that
    /// order by merging the streams: each stream's next block is its first
    /// fitting one once the blocks already looked at are held out of the
    /// free set (they go back before returning). A stream outside the
    /// capture drops out whole.
    fn best_free_of_other_streams(
        &mut self,
        backend: &B,
        capture: u64,
        p: &Params<B::Stream>,
        deferred: Option<DeferredPick>,
    ) -> Result<Option<BlockId>, Error> {
        let rule = FitRule::of(&self.config);
        let fits = |size: u64| rule.fits(p.size, size);
        let head = |s: B::Stream, f: Found| {
            fits(f.size).then_some(Head {
                size: f.size,
                addr: f.addr,
                stream: s,
                id: f.id,
            })
        };
        let pool = self.pools.pool(p.pool, p.small);
        let mut heads = std::mem::take(&mut self.capture.scratch.heads);
        let mut held = std::mem::take(&mut self.capture.scratch.held);
        let mut member = std::mem::take(&mut self.capture.scratch.member);
        heads.clear();
        held.clear();
        member.clear();
        heads.extend(
            pool.free
                .sets()
                .filter(|e| e.0 != p.stream)
                .filter_map(|(s, set)| head(s, set.first_at_least(p.size)?)),
        );
        let mut found = Ok(None);
        while let Some(h) = (0..heads.len()).min_by_key(|&i| (heads[i].size, heads[i].addr)) {
            let Head {
                size,
                addr,
                stream: s,
                id,
            } = heads[h];
            if deferred.is_some_and(|d| d.key() <= (size, addr)) {
                break;
            }
            match self.in_capture(backend, capture, s, &mut member) {
                Err(e) => {
                    found = Err(e);
                    break;
                }
                Ok(false) => {
                    heads.swap_remove(h);
                    continue;
                }
                Ok(true) => {}
            }
            if self.range_visited(backend, capture, p.stream, addr, addr + size) {
                found = Ok(Some(id));
                break;
            }
            let dormant = self.blocks[id].dormant_key();
            let free = &mut self.pools.pool_mut(p.pool, p.small).free;
            let removed = free.remove(s, size, addr, dormant);
            debug_assert_eq!(removed, Some(id));
            held.push(Held {
                stream: s,
                size,
                addr,
                id,
                dormant,
            });
            match free.first_at_least(s, size).and_then(|f| head(s, f)) {
                Some(next) => heads[h] = next,
                None => {
                    heads.swap_remove(h);
                }
            }
        }
        let free = &mut self.pools.pool_mut(p.pool, p.small).free;
        for h in &held {
            free.insert(h.stream, h.size, h.addr, h.id, h.dormant);
        }
        self.capture.scratch.heads = heads;
        self.capture.scratch.held = held;
        self.capture.scratch.member = member;
        found
    }
}
