//! The invariant checker, run after every operation in tests: one check per
//! structure, each usable on its own.
//!
//! * [`Inner::check_tiling`]: blocks tile their segments exactly (so live
//!   blocks never overlap), with their segment's pool and age;
//! * [`Inner::check_free_sets`]: free sets hold exactly the free blocks,
//!   count the blocks out per stream, and keep their dormant lists;
//! * [`Inner::check_live`]: the live map holds exactly the allocated blocks;
//! * [`Inner::check_events`]: events queued = outstanding = on blocks, and
//!   every pending block waits for an event or a capture;
//! * [`Inner::check_pools`]: each pool's segment count and device calls
//!   in flight;
//! * [`Inner::check_stats`]: every current stat equals its sum over blocks
//!   and segments, and no peak is below its current value.
#![forbid(unsafe_code)]

use crate::engine::accounting::StatSink;
use std::collections::{HashMap, HashSet};

use crate::backend::Backend;
use crate::engine::block::{BState, Block, BlockId, NIL};
use crate::engine::pools::PoolIdx;
use crate::engine::segments::{Expandable, Phys, Segment, SegmentKind};
use crate::engine::state::Inner;
use crate::stats::{DeviceStats, StatType};

impl<B: Backend> Inner<B> {
    /// Every check below, in order; the first failure is returned.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        self.check_tiling()?;
        self.check_ghost_index()?;
        self.check_free_sets()?;
        self.check_live()?;
        self.check_events()?;
        self.check_pools()?;
        self.check_shards()?;
        self.check_stats()
    }

    /// The ghost mappings of expandable segment `index` at `start`: inside
    /// the range, clear of the runs and of each other, each of memory
    /// mapped as a run elsewhere (its home) of the same length, and in the
    /// site index ([`Self::check_ghost_index`] checks the index whole).
    fn check_ghosts(
        &self,
        start: u64,
        index: u32,
        e: &Expandable<Phys<B>, B::Stream>,
    ) -> Result<(), String> {
        let mut end = 0usize;
        for (&at, &(n, id)) in &e.ghosts {
            if n == 0 || at < end || at + n > e.npages || e.mapped_in(at, at + n) > 0 {
                return Err(format!(
                    "segment {start:#x}: ghost at page {at} of {n} pages overlaps or overruns"
                ));
            }
            let home = self.segments.homes.get(&id).and_then(|&(i, first)| {
                let h = self.segments.expandable.get(i as usize)?.as_ref()?;
                h.runs.get(&first).map(|r| (i, first, r.0 as u64 * h.page))
            });
            match home {
                Some((i, first, bytes))
                    if bytes == n as u64 * e.page && (i, first) != (index, at) => {}
                _ => {
                    return Err(format!(
                        "segment {start:#x}: ghost at page {at} has no home run of {n} pages"
                    ));
                }
            }
            if !self
                .segments
                .ghost_sites
                .get(&id)
                .is_some_and(|v| v.contains(&(index, at)))
            {
                return Err(format!(
                    "segment {start:#x}: ghost at page {at} not indexed"
                ));
            }
            end = at + n;
        }
        Ok(())
    }

    /// The ghost bookkeeping as a whole: no recycled memory is left
    /// between operations, every run has its home, and the site index and
    /// the count hold exactly the ghosts mapped.
    pub(crate) fn check_ghost_index(&self) -> Result<(), String> {
        if !self.segments.spare.is_empty() {
            return Err("recycled memory left between operations".into());
        }
        let (sites, ghosts) = (
            self.segments
                .ghost_sites
                .values()
                .map(|v| v.len())
                .sum::<usize>(),
            self.segments
                .expandable
                .iter()
                .flatten()
                .map(|e| e.ghosts.len())
                .sum::<usize>(),
        );
        let runs: usize = self
            .segments
            .expandable
            .iter()
            .flatten()
            .map(|e| e.runs.len())
            .sum();
        if runs != self.segments.homes.len() {
            return Err(format!(
                "{runs} runs mapped, {} homes recorded",
                self.segments.homes.len()
            ));
        }
        if sites != ghosts || ghosts != self.segments.ghost_count {
            return Err(format!(
                "ghosts: {ghosts} mapped, {sites} indexed, {} counted",
                self.segments.ghost_count
            ));
        }
        Ok(())
    }

    /// The shard parts: every block of a segment lives in the part of its
    /// head, every live entry in its block's part, and (unless a block
    /// changed shard, which turns the fast path off) every block in the
    /// part of its stream's shard.
    pub(crate) fn check_shards(&self) -> Result<(), String> {
        if !self.live.parts_consistent() {
            return Err("a live entry outside its block's part".into());
        }
        for (start, seg) in self.segments.iter() {
            let part = crate::engine::block::part_of(seg.head);
            for id in self.blocks.segment_blocks(seg.head) {
                if crate::engine::block::part_of(id) != part {
                    return Err(format!("segment {start:#x}: block {id} outside its part"));
                }
                let s = self.blocks[id].stream;
                if !self.foreign && self.router.get(s) != Some(part) {
                    return Err(format!(
                        "segment {start:#x}: block {id} of stream {s:?} outside its shard"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Calls `f` on every block of every segment, in address order.
    fn for_each_block(&self, mut f: impl FnMut(BlockId, &Block<B::Stream>)) {
        for (_, seg) in self.segments.iter() {
            for id in self.blocks.segment_blocks(seg.head) {
                f(id, &self.blocks[id]);
            }
        }
    }

    /// Blocks tile each segment exactly, in address order, each reached
    /// once, none dead, each of its segment's pool and age.
    pub(crate) fn check_tiling(&self) -> Result<(), String> {
        let mut seen: HashSet<BlockId> = HashSet::new();
        for (start, seg) in self.segments.iter() {
            let head = &self.blocks[seg.head];
            if head.addr != start || head.prev != NIL {
                return Err(format!("segment {start:#x}: head block mismatch"));
            }
            let (mut at, mut prev) = (start, NIL);
            for id in self.blocks.segment_blocks(seg.head) {
                if !seen.insert(id) {
                    return Err(format!("block {id} reached twice"));
                }
                let b = &self.blocks[id];
                if b.state == BState::Dead {
                    return Err(format!("dead block {id} in segment {start:#x}"));
                }
                if b.addr != at || b.prev != prev || b.size == 0 || !b.size.is_multiple_of(512) {
                    return Err(format!(
                        "segment {start:#x}: block {id} at {:#x} size {} breaks the tiling at {at:#x}",
                        b.addr, b.size
                    ));
                }
                if b.pool != head.pool || b.small != head.small || b.seq != head.seq {
                    return Err(format!("block {id} pool or age differs from its segment's"));
                }
                at += b.size;
                prev = id;
            }
            if at != start + seg.size {
                return Err(format!(
                    "segment {start:#x}: blocks cover {} of {} bytes",
                    at - start,
                    seg.size
                ));
            }
            self.check_expandable(start, seg)?;
        }
        Ok(())
    }

    /// An expandable segment: its blocks are flagged expandable, unmapped
    /// blocks cover exactly the unmapped pages (page-aligned, never two in a
    /// row) and carry the segment's stream; a fixed segment has no
    /// expandable or unmapped block.
    fn check_expandable(&self, start: u64, seg: &Segment) -> Result<(), String> {
        let SegmentKind::Expandable { index } = seg.kind else {
            for id in self.blocks.segment_blocks(seg.head) {
                let b = &self.blocks[id];
                if b.expandable || b.state == BState::Unmapped {
                    return Err(format!(
                        "fixed segment {start:#x}: block {id} is expandable"
                    ));
                }
            }
            return Ok(());
        };
        let Some(e) = self
            .segments
            .expandable
            .get(index as usize)
            .and_then(Option::as_ref)
        else {
            return Err(format!("segment {start:#x}: no expandable segment {index}"));
        };
        if e.start != start || e.size != seg.size || e.npages as u64 * e.page != e.size {
            return Err(format!("segment {start:#x}: expandable record disagrees"));
        }
        let mut end = 0usize;
        for (&at, &(n, _, id)) in &e.runs {
            if n == 0 || at < end || at + n > e.npages {
                return Err(format!(
                    "segment {start:#x}: run at page {at} of {n} pages overlaps or overruns"
                ));
            }
            if self.segments.homes.get(&id) != Some(&(index, at)) {
                return Err(format!(
                    "segment {start:#x}: run at page {at} is not its memory's home"
                ));
            }
            end = at + n;
        }
        self.check_ghosts(start, index, e)?;
        let mut prev_unmapped = false;
        for id in self.blocks.segment_blocks(seg.head) {
            let b = &self.blocks[id];
            if !b.expandable {
                return Err(format!(
                    "expandable segment {start:#x}: block {id} not flagged"
                ));
            }
            let unmapped = b.state == BState::Unmapped;
            let first = (b.addr - start) / e.page;
            let last = (b.addr + b.size - 1 - start) / e.page;
            if unmapped {
                if prev_unmapped {
                    return Err(format!("unmapped block {id} follows an unmapped block"));
                }
                if !(b.addr - start).is_multiple_of(e.page) || !b.size.is_multiple_of(e.page) {
                    return Err(format!("unmapped block {id} is not page-aligned"));
                }
                if b.stream != e.stream {
                    return Err(format!("unmapped block {id} not of its segment's stream"));
                }
                if e.mapped_in(first as usize, last as usize + 1) != 0 {
                    return Err(format!("unmapped block {id} has mapped pages"));
                }
            } else if e.mapped_in(first as usize, last as usize + 1) as u64 != last - first + 1 {
                return Err(format!("block {id} lies on unmapped pages"));
            }
            prev_unmapped = unmapped;
        }
        Ok(())
    }

    /// Free sets hold exactly the free blocks (each under its own key, with
    /// no pending use), count exactly the blocks out of each (pool, stream),
    /// and file exactly the dormant blocks in age-ordered dormant lists.
    pub(crate) fn check_free_sets(&self) -> Result<(), String> {
        let mut free_count = 0usize;
        let mut unmapped_count = 0usize;
        let mut out: HashMap<(PoolIdx, bool, B::Stream), u32> = HashMap::new();
        let mut bad = Ok(());
        self.for_each_block(|id, b| {
            if bad.is_err() {
                return;
            }
            if b.dormant && (b.state != BState::Free || b.is_split()) {
                bad = Err(format!("dormant block {id} is not a whole free segment"));
            } else if b.state == BState::Unmapped {
                unmapped_count += 1;
                let filed = self
                    .pools
                    .pool(b.pool, b.small)
                    .unmapped
                    .get(&(b.stream, b.addr));
                if filed != Some(&id) {
                    bad = Err(format!(
                        "unmapped block {id} missing from its pool's unmapped set"
                    ));
                } else if b.event_count != 0 || !b.stream_uses.is_empty() {
                    bad = Err(format!("unmapped block {id} has pending uses"));
                }
            } else if b.state != BState::Free {
                *out.entry((b.pool, b.small, b.stream)).or_default() += 1;
            } else {
                free_count += 1;
                let filed = self
                    .pools
                    .pool(b.pool, b.small)
                    .free
                    .get(b.stream, b.size, b.addr);
                if filed != Some(id) {
                    bad = Err(format!("free block {id} missing from its pool"));
                } else if b.event_count != 0
                    || !b.stream_uses.is_empty()
                    || !b.capture_uses.is_empty()
                {
                    bad = Err(format!("free block {id} has pending uses"));
                }
            }
        });
        bad?;
        let mut pooled = 0usize;
        let mut unmapped_filed = 0usize;
        for (i, pair) in self.pools.iter() {
            for (small, bp) in pair.both() {
                pooled += bp.free.len();
                unmapped_filed += bp.unmapped.len();
                for s in bp.free.streams() {
                    let want = out.get(&(i, small, s)).copied().unwrap_or(0);
                    if bp.free.out(s) != want {
                        return Err(format!(
                            "pool {i} small={small} stream {s:?}: {} blocks counted out, {want} are",
                            bp.free.out(s)
                        ));
                    }
                }
                bp.free.check_dormant(|id| {
                    let b = &self.blocks[id];
                    (b.dormant, b.seq)
                })?;
            }
        }
        if unmapped_filed != unmapped_count {
            return Err(format!(
                "{unmapped_filed} blocks in unmapped sets but {unmapped_count} unmapped blocks"
            ));
        }
        if pooled != free_count {
            return Err(format!(
                "{pooled} blocks in free sets but {free_count} free blocks"
            ));
        }
        Ok(())
    }

    /// The live map holds exactly the allocated blocks.
    pub(crate) fn check_live(&self) -> Result<(), String> {
        let mut allocated = 0usize;
        let mut bad = Ok(());
        self.for_each_block(|id, b| {
            if b.state == BState::Allocated {
                allocated += 1;
                if self.live.get(b.addr) != Some(id) && bad.is_ok() {
                    bad = Err(format!("allocated block {id} missing from the live map"));
                }
            }
        });
        bad?;
        if self.live.len() != allocated {
            return Err(format!(
                "{} live entries but {allocated} allocated blocks",
                self.live.len()
            ));
        }
        Ok(())
    }

    /// Events queued = outstanding = the sum of the blocks' event counts;
    /// every pending block waits for an event or is deferred; a deferred
    /// block keeps its stream.
    pub(crate) fn check_events(&self) -> Result<(), String> {
        if let Some(d) = self
            .capture
            .deferred
            .iter()
            .find(|d| self.blocks[d.block].stream != d.stream)
        {
            return Err(format!(
                "deferred block {} changed stream while deferred",
                d.block
            ));
        }
        let mut on_blocks = 0usize;
        let mut bad = Ok(());
        self.for_each_block(|id, b| {
            on_blocks += b.event_count as usize;
            if b.state == BState::Pending
                && b.event_count == 0
                && !self.capture.is_deferred(id)
                && bad.is_ok()
            {
                bad = Err(format!("pending block {id} waits for nothing"));
            }
        });
        bad?;
        let (queued, outstanding) = (self.events.queued(), self.events.outstanding());
        if queued != outstanding || queued != on_blocks {
            return Err(format!(
                "events: {queued} queued, {outstanding} outstanding, {on_blocks} on blocks"
            ));
        }
        Ok(())
    }

    /// Each pool counts exactly the segments whose blocks name it; the
    /// pools' device calls in flight sum to the engine's.
    pub(crate) fn check_pools(&self) -> Result<(), String> {
        let calls: u32 = self.pools.iter().map(|(_, p)| p.calls()).sum();
        if calls != self.in_flight.calls || (calls == 0) != (self.in_flight.bytes == 0) {
            return Err(format!(
                "device calls in flight: pools count {calls}, the engine {:?}",
                self.in_flight
            ));
        }
        for (idx, p) in self.pools.iter() {
            let segs = self
                .segments
                .iter()
                .filter(|(_, s)| self.blocks[s.head].pool == idx)
                .count();
            if segs != p.segments() as usize {
                return Err(format!(
                    "pool {:?}: {segs} segments, counted {}",
                    p.id(),
                    p.segments()
                ));
            }
        }
        Ok(())
    }

    /// Every current stat equals its sum over blocks and segments; no peak
    /// is below its current value.
    pub(crate) fn check_stats(&self) -> Result<(), String> {
        let mut expect = DeviceStats::default();
        for (_, seg) in self.segments.iter() {
            let st = self.blocks[seg.head].stat_type();
            if let SegmentKind::Expandable { index } = seg.kind {
                // only mapped pages are reserved; `segment` never counts them
                let mapped = self.segments.expandable[index as usize]
                    .as_ref()
                    .map_or(0, |e| e.mapped_bytes());
                expect.reserved_bytes.update(st, mapped as i64);
                continue;
            }
            expect.segment.update(st, 1);
            expect.reserved_bytes.update(st, seg.size as i64);
            if seg.oversize {
                expect.oversize_segments.increase(1);
            }
        }
        self.for_each_block(|_, b| {
            let st = b.stat_type();
            match b.state {
                BState::Free if b.is_split() && !b.expandable => {
                    expect.inactive_split.update(st, 1);
                    expect.inactive_split_bytes.update(st, b.size as i64);
                }
                BState::Allocated => {
                    expect.on_alloc(st, b.size, b.requested, b.oversize);
                }
                BState::Pending => {
                    expect.active.update(st, 1);
                    expect.active_bytes.update(st, b.size as i64);
                    expect.requested_bytes.update(st, b.requested as i64);
                }
                _ => {}
            }
        });
        let s = &self.stats;
        let e = &expect;
        let pairs = [
            ("allocation", &s.allocation, &e.allocation),
            ("segment", &s.segment, &e.segment),
            ("active", &s.active, &e.active),
            ("inactive_split", &s.inactive_split, &e.inactive_split),
            ("allocated_bytes", &s.allocated_bytes, &e.allocated_bytes),
            ("reserved_bytes", &s.reserved_bytes, &e.reserved_bytes),
            ("active_bytes", &s.active_bytes, &e.active_bytes),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                &e.inactive_split_bytes,
            ),
            ("requested_bytes", &s.requested_bytes, &e.requested_bytes),
        ];
        for (name, got, want) in pairs {
            for t in [
                StatType::Aggregate,
                StatType::SmallPool,
                StatType::LargePool,
            ] {
                let peak = got.0[t as usize].peak;
                let (g, w) = (got.0[t as usize].current, want.0[t as usize].current);
                if peak < g {
                    return Err(format!("{name}[{t:?}]: peak {peak} below current {g}"));
                }
                if g != w {
                    return Err(format!("{name}.{t:?}.current is {g}, blocks say {w}"));
                }
                let st = &got.0[t as usize];
                if st.peak < st.current {
                    return Err(format!("{name}.{t:?}: peak below current"));
                }
            }
        }
        if s.oversize_allocations.current != e.oversize_allocations.current
            || s.oversize_segments.current != e.oversize_segments.current
        {
            return Err("oversize stats disagree with blocks".into());
        }
        Ok(())
    }
}
