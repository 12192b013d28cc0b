//! The invariant checker: run after every operation in tests.

use std::collections::HashSet;

use crate::backend::Backend;
use crate::engine::state::{BState, BlockId, Inner, NIL};
use crate::stats::{DeviceStats, StatType};

impl<B: Backend> Inner<B> {
    /// Verifies: segments are tiled exactly by their blocks (so live blocks
    /// never overlap), free sets agree with block states, the live map agrees
    /// with allocated blocks, pending blocks wait on events or a capture, and
    /// every stat equals its sum over blocks and segments.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        let mut expect = DeviceStats::default();
        let mut seen: HashSet<BlockId> = HashSet::new();
        let mut free_count = 0usize;
        let mut alloc_count = 0usize;
        let mut event_sum = 0usize;
        let deferred: HashSet<BlockId> = self.deferred.iter().map(|d| d.block).collect();
        // blocks out of each (pool, small pool?, stream): allocated or pending
        let mut out: std::collections::HashMap<(u32, bool, B::Stream), u32> = Default::default();
        if let Some(d) = self
            .deferred
            .iter()
            .find(|d| self.blocks[d.block as usize].stream != d.stream)
        {
            return Err(format!(
                "deferred block {} changed stream while deferred",
                d.block
            ));
        }
        for (&start, seg) in &self.segments {
            let head = &self.blocks[seg.head as usize];
            if head.addr != start || head.prev != NIL {
                return Err(format!("segment {start:#x}: head block mismatch"));
            }
            let st = head.stat_type();
            expect.segment.update(st, 1);
            expect.reserved_bytes.update(st, seg.size as i64);
            if seg.oversize {
                expect.oversize_segments.increase(1);
            }
            let mut at = start;
            let mut id = seg.head;
            let mut prev = NIL;
            while id != NIL {
                if !seen.insert(id) {
                    return Err(format!("block {id} reached twice"));
                }
                let b = &self.blocks[id as usize];
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
                if b.dormant && (b.state != BState::Free || b.is_split()) {
                    return Err(format!("dormant block {id} is not a whole free segment"));
                }
                if b.state != BState::Free {
                    *out.entry((b.pool, b.small, b.stream)).or_default() += 1;
                }
                match b.state {
                    BState::Free => {
                        free_count += 1;
                        let pool = self.pools[b.pool as usize]
                            .as_ref()
                            .ok_or("free block in a deleted pool")?;
                        if pool.get_ref(b.small).free.get(b.stream, b.size, b.addr) != Some(id) {
                            return Err(format!("free block {id} missing from its pool"));
                        }
                        if b.is_split() {
                            expect.inactive_split.update(st, 1);
                            expect.inactive_split_bytes.update(st, b.size as i64);
                        }
                        if b.event_count != 0 || !b.stream_uses.is_empty() {
                            return Err(format!("free block {id} has pending uses"));
                        }
                    }
                    BState::Allocated => {
                        alloc_count += 1;
                        if self.live.get(b.addr) != Some(id) {
                            return Err(format!("allocated block {id} missing from the live map"));
                        }
                        expect.allocation.update(st, 1);
                        expect.allocated_bytes.update(st, b.size as i64);
                        expect.active.update(st, 1);
                        expect.active_bytes.update(st, b.size as i64);
                        expect.requested_bytes.update(st, b.requested as i64);
                        if b.oversize {
                            expect.oversize_allocations.increase(1);
                        }
                    }
                    BState::Pending => {
                        if b.event_count == 0 && !deferred.contains(&id) {
                            return Err(format!("pending block {id} waits for nothing"));
                        }
                        expect.active.update(st, 1);
                        expect.active_bytes.update(st, b.size as i64);
                        expect.requested_bytes.update(st, b.requested as i64);
                    }
                    BState::Dead => unreachable!(),
                }
                event_sum += b.event_count as usize;
                at += b.size;
                prev = id;
                id = b.next;
            }
            if at != start + seg.size {
                return Err(format!(
                    "segment {start:#x}: blocks cover {} of {} bytes",
                    at - start,
                    seg.size
                ));
            }
        }
        for (i, pool) in self.pools.iter().enumerate() {
            let Some(pool) = pool else { continue };
            for (small, bp) in [(true, &pool.small), (false, &pool.large)] {
                for s in bp.free.streams() {
                    let want = out.get(&(i as u32, small, s)).copied().unwrap_or(0);
                    if bp.free.out(s) != want {
                        return Err(format!(
                            "pool {i} small={small} stream {s:?}: {} blocks counted out, {want} are",
                            bp.free.out(s)
                        ));
                    }
                }
                bp.free.check_dormant(|id| {
                    let b = &self.blocks[id as usize];
                    (b.dormant, b.seq)
                })?;
            }
        }
        let pooled: usize = self
            .pools
            .iter()
            .flatten()
            .map(|p| p.small.free.len() + p.large.free.len())
            .sum();
        if pooled != free_count {
            return Err(format!(
                "{pooled} blocks in free sets but {free_count} free blocks"
            ));
        }
        if self.live.len() != alloc_count {
            return Err(format!(
                "{} live entries but {alloc_count} allocated blocks",
                self.live.len()
            ));
        }
        let queued: usize = self.event_queues.iter().map(|(_, q)| q.len()).sum();
        if queued != self.outstanding_events || queued != event_sum {
            return Err(format!(
                "events: {queued} queued, {} outstanding, {event_sum} on blocks",
                self.outstanding_events
            ));
        }
        for (idx, p) in self.pools.iter().enumerate() {
            if let Some(p) = p {
                let segs = self
                    .segments
                    .values()
                    .filter(|s| self.blocks[s.head as usize].pool as usize == idx)
                    .count();
                if segs != p.segments as usize {
                    return Err(format!(
                        "pool {:?}: {segs} segments, counted {}",
                        p.id, p.segments
                    ));
                }
            }
        }
        let s = &self.stats;
        let pairs = [
            ("allocation", &s.allocation, &expect.allocation),
            ("segment", &s.segment, &expect.segment),
            ("active", &s.active, &expect.active),
            ("inactive_split", &s.inactive_split, &expect.inactive_split),
            (
                "allocated_bytes",
                &s.allocated_bytes,
                &expect.allocated_bytes,
            ),
            ("reserved_bytes", &s.reserved_bytes, &expect.reserved_bytes),
            ("active_bytes", &s.active_bytes, &expect.active_bytes),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                &expect.inactive_split_bytes,
            ),
            (
                "requested_bytes",
                &s.requested_bytes,
                &expect.requested_bytes,
            ),
        ];
        for (name, got, want) in pairs {
            for t in [
                StatType::Aggregate,
                StatType::SmallPool,
                StatType::LargePool,
            ] {
                let (g, w) = (got.0[t as usize].current, want.0[t as usize].current);
                if g != w {
                    return Err(format!("{name}.{t:?}.current is {g}, blocks say {w}"));
                }
                let st = &got.0[t as usize];
                if st.peak < st.current {
                    return Err(format!("{name}.{t:?}: peak below current"));
                }
            }
        }
        if s.oversize_allocations.current != expect.oversize_allocations.current
            || s.oversize_segments.current != expect.oversize_segments.current
        {
            return Err("oversize stats disagree with blocks".into());
        }
        Ok(())
    }
}
