//! cachalot's expandable mode: page recycling (whole free pages of any
//! stream's expandable segments unmapped so their memory serves a new
//! mapping, the request's chain chosen first, the [`Recycling`] allowance
//! above the allocated peak, pages whose work is done first by completion
//! fences, a busy stream waited for only past the hard cap, ghost
//! mappings moved back with no driver call) and cross-stream lending.

use std::ops::Range;

use smallvec::SmallVec;

use crate::backend::Backend;
use crate::engine::block::{BlockId, NIL};
use crate::engine::placement::FitRule;
use crate::engine::pools::DEFAULT_POOL;
use crate::engine::rounding::SMALL_BUFFER;
use crate::engine::segments::{MoveCalls, PhysId, UnmapSync, sync_stream};
use crate::engine::state::{Inner, Params};

use super::Chain;

/// How far past the allocated peak cachalot's expandable mode lets
/// reserved memory grow before pages recycle, and the budget that raises
/// it (`docs/design-expandable.md`, "A move budget"). The allowance starts
/// at 1/50 of the allocated peak (2%): gpt2_train and resnet50_train settle
/// there, with no page moving after their first passes, and a workload
/// whose moves are cheap for its operations keeps it (a random-shape
/// serving trace: the memory of its later passes stays at its first's).
/// What moving costs is counted in driver time ([`MoveCalls`], weighed by
/// the H200's measured cost per call): each time [`WINDOW_FREES`] frees
/// have passed, if page moves cost more than [`MOVE_BUDGET_NS`] per
/// operation (an allocation or a free) in that window, the allowance
/// doubles, up to 1/[`MAX_SLACK`]; moves that spend twice a window's
/// budget before it ends double it at once (a training step that moves
/// pages all through its first pass has the larger allowance before its
/// second, so gpt2_train makes no device call from its second pass; a
/// serving trace's occasional burst, a new largest request, does not).
/// At the largest allowance pages keep moving because the workload has no
/// repeating layout (random sizes: the churn traces), so recycling takes
/// the fewest, largest free blocks instead of the smallest
/// ([`Recycling::churning`]): the small ones serve the frequent small
/// requests, and a large one is fewer driver calls per byte.
///
/// So a repeating workload settles on a mapping it keeps (no device calls
/// once its first passes are done), and one that cannot settle moves pages
/// at a bounded rate, at a memory cost bounded by the cap.
#[derive(Debug, Default)]
pub(crate) struct Recycling {
    /// The allowance above the allocated peak, bytes (0: the first, 2%).
    extra: u64,
    /// The free clock when the budget's window began.
    since: u64,
    /// Driver time of page moves in the window, ns ([`MoveCalls`] weighed).
    cost: u64,
}

/// The first allowance: 1/`FIRST_SLACK` of the allocated peak.
const FIRST_SLACK: u64 = 50;
/// The largest allowance: 1/`MAX_SLACK` of the allocated peak (9.1%: the
/// cap stays under 1.10x the live peak, which the memory goal of every
/// trace of 400 MB and more asks for).
const MAX_SLACK: u64 = 11;
/// Frees in one window of the move budget.
pub(crate) const WINDOW_FREES: u64 = 8192;
/// The most driver time page moves may take per operation (an allocation
/// or a free) in a window before the allowance doubles, ns.
pub(crate) const MOVE_BUDGET_NS: u64 = 50;
/// What each call of [`MoveCalls`] costs on the H200, ns
/// (`bench/vmm/vmm_cost.cpp`, 2 MiB pages): a map and its access 1.0 +
/// 25.0 µs, an unmap 15.2 µs, a release 9.3 µs.
const REMAP_NS: u64 = 26_000;
const UNMAP_NS: u64 = 15_000;
const RELEASE_NS: u64 = 9_000;

/// The hard cap of recycling on a busy device: 1/`HARD_SLACK` of the
/// allocated peak above it, at most [`HARD_SLACK_MAX`]. Past the recycling
/// cap, free pages whose work is done are recycled at once; pages with
/// work pending are waited for (a synchronization of their stream) only
/// when growing instead would take reserved memory past this cap. Small
/// workloads round to whole pages per stream and pool, so a relative cap;
/// for large ones a few dozen pages are not worth a pipeline stall, but a
/// gigabyte is (GPT-2 training with 1/8 alone: 9,746 MiB reserved against
/// PyTorch expandable's 9,724).
const HARD_SLACK: u64 = 8;
/// The most growth that recycling prefers to a wait: 64 MiB (32 pages).
const HARD_SLACK_MAX: u64 = 64 << 20;

/// The most ghost homes of one request that recycling groups into
/// stretches moved at once ([`Inner::recycle_pages`]); a request over more
/// moves them run by run, as before (the grouping's search and the spare
/// list's reordering grow with the square of the homes).
const GROUP_HOMES: usize = 64;

/// A recycling call's answers of [`Inner::done_on`]: (stream, stamp up to
/// which its frees are done), a few streams, kept inline.
type Seen<S> = SmallVec<[(S, u64); 4]>;

/// Records in `seen` (a recycling call's answers of
/// [`Inner::done_on`]) that `stream`'s blocks freed up to `stamp` are done.
fn note_done<S: PartialEq>(seen: &mut Seen<S>, stream: S, stamp: u64) {
    match seen.iter_mut().find(|e| e.0 == stream) {
        Some(e) => e.1 = stamp,
        None => seen.push((stream, stamp)),
    }
}

/// Orders recycling's candidates, (unmappable bytes, address, block):
/// smallest first (they serve the fewest requests: a repeating workload
/// then moves the same small blocks and settles), or, when `churning`
/// (the allowance at its largest: no layout to settle on), the fewest,
/// largest blocks: the smallest that covers `want` alone, then the
/// largest first. That leaves the small free blocks to the frequent small
/// requests and moves the memory in fewer runs: on the mock, the churn
/// traces' later passes make 2-4x fewer driver calls than smallest first
/// at the same allowance (`docs/design-expandable.md`, "A move budget").
fn order_victims(cands: &mut [(u64, u64, BlockId)], want: u64, churning: bool) {
    cands.sort_unstable();
    if !churning {
        return;
    }
    match cands.iter().position(|c| c.0 >= want) {
        // the covering block first, the rest largest first
        Some(k) => {
            cands[k..].rotate_left(1);
            let n = cands.len();
            cands[..n - 1].reverse();
            cands.rotate_right(1);
        }
        None => cands.reverse(),
    }
}

impl Recycling {
    /// The allowance for an allocated peak of `live` bytes.
    pub(crate) fn allowance(&self, live: u64) -> u64 {
        self.extra.clamp(live / FIRST_SLACK, live / MAX_SLACK)
    }

    /// Whether the allowance is at its largest: page moves cost more than
    /// the budget even there, so the workload has no layout to settle on.
    fn churning(&self, live: u64) -> bool {
        self.allowance(live) >= live / MAX_SLACK
    }

    /// Charges the driver calls `calls` to the budget's window; at the
    /// free clock `clock` (frees so far), closes the window once
    /// [`WINDOW_FREES`] frees have passed, doubling the allowance when the
    /// window's moves cost more than [`MOVE_BUDGET_NS`] per operation.
    pub(crate) fn charge(&mut self, calls: MoveCalls, clock: u64, live: u64) {
        self.cost +=
            calls.remaps * REMAP_NS + calls.unmaps * UNMAP_NS + calls.releases * RELEASE_NS;
        let frees = clock.saturating_sub(self.since);
        // a window's whole budget, at MOVE_BUDGET_NS per operation (an
        // allocation or a free: about two per free)
        let budget = MOVE_BUDGET_NS * 2 * WINDOW_FREES;
        // moves that have spent twice that before the window ends (a cold
        // start that keeps moving) close it at once
        if frees < WINDOW_FREES && self.cost <= 2 * budget {
            return;
        }
        if self.cost > MOVE_BUDGET_NS * 2 * frees.max(WINDOW_FREES) && !self.churning(live) {
            self.extra = (self.allowance(live) * 2).min(live / MAX_SLACK);
            tracing::debug!(extra = self.extra, "page recycling allowance raised");
        }
        self.since = clock;
        self.cost = 0;
    }
}

impl<B: Backend> Inner<B> {
    /// Whether this operation may move memory between streams' expandable
    /// segments (page recycling, [`Self::lend_block`]): cachalot's
    /// expandable mode on a backend with virtual memory, outside capture,
    /// while one thread drives the streams. Once several threads allocate
    /// at once (the shards log, `Inner::multi_thread`), each move would
    /// take the device lock and check every shard in, stopping every
    /// thread's fast path: on the H200, 8 threads each on its own stream
    /// ran 3.5 Mops/s with moves against 32.8 with fixed segments
    /// (22,402 blocks lent in 800,000 operations on the mock). So from then
    /// on each stream keeps the memory it mapped, as in PyTorch's
    /// expandable mode, and the OOM ladder still releases free pages.
    pub(in crate::engine) fn moves_memory(&self, backend: &B) -> bool {
        self.config.expandable_segments
            && backend.virtual_memory().is_some()
            && self.recycles_pages()
            && !self.capture.is_active()
            && !self.multi_thread
    }

    /// Page recycling, before an expandable segment maps what request `p`
    /// needs: when that would take reserved memory past the recycling cap,
    /// unmaps whole free pages of the default pools' expandable segments
    /// (smallest free blocks first: they serve the fewest requests) until
    /// the excess is covered. Each stream whose pages are unmapped is
    /// synchronized once, and pages of streams whose work has completed go
    /// first (no wait). Pages of private pools (graphs) and the blocks at
    /// `keep` (the request's chain and its neighbours,
    /// [`Self::recycling_chain`]) are never taken, so the chain stays as it
    /// was. Runs whose memory has a ghost mapping where the request maps
    /// (`target`: the chain's first address and the request's size) go
    /// before any other, when their work is done: that memory moves back
    /// with no driver call ([`Self::ghost_homes`]).
    ///
    /// The cap is the larger of the reserved peak (recycling never lets
    /// reserved memory pass its old peak if free pages can make room) and
    /// the allocated peak plus the [`Recycling`] allowance: a segment may
    /// grow that far past the live peak without moving pages, so a
    /// repeating workload settles on a mapping it keeps (no device calls
    /// once its first passes are done) instead of moving the same pages
    /// every pass.
    pub(in crate::engine) fn recycle_pages(
        &mut self,
        backend: &B,
        need: u64,
        keep: Range<u64>,
        target: Option<(u64, u64)>,
    ) {
        let clock = self.events.clock();
        let mut done: Seen<B::Stream> = Seen::new();
        // Ghosts first, below the cap too: memory that a ghost maps where
        // the request maps moves back with no driver call (and no new
        // memory) when its run is free and done where it is now. Such moves
        // cost nothing, so they do not raise the allowance.
        if let Some((at, bytes)) = target {
            // The home runs that tile one stretch of one free block move
            // in one unmap: the block is split, filed and merged once for
            // all of them. The outcome is that of moving them one at a time
            // in the ghosts' order (`ghost_homes`), which the choices of
            // later mappings depend on: their memory is set aside in that
            // order (below), and a stretch is taken whole only where the
            // piece each run would be looked up in could not be one of the
            // request's chain (else its runs go one at a time).
            let homes = self.ghost_homes(at, bytes);
            // (the search for a stretch is quadratic in the homes: past
            // `GROUP_HOMES` they go run by run)
            let group = homes.len() <= GROUP_HOMES;
            let spared = self.segments.spare.len();
            let mut taken: SmallVec<[bool; 8]> = smallvec::smallvec![false; homes.len()];
            for k in 0..homes.len() {
                if taken[k] {
                    continue;
                }
                taken[k] = true;
                let (addr, len, _) = homes[k];
                // (looked up now: an earlier move may have split the block)
                let Some(id) = self.block_containing(addr) else {
                    continue;
                };
                let b = &self.blocks[id];
                let (lo, hi) = (b.addr, b.addr + b.size);
                let movable = self.unmappable(id)
                    && b.pool == DEFAULT_POOL
                    && !keep.contains(&lo)
                    && lo <= addr
                    && addr + len <= hi;
                if !movable {
                    continue;
                }
                let (mut from, mut to) = (addr, addr + len);
                let mut more: SmallVec<[usize; 8]> = SmallVec::new();
                while group
                    && let Some(j) = (k + 1..homes.len()).find(|&j| {
                        let (a, n, _) = homes[j];
                        !taken[j] && a >= lo && a + n <= hi && (a == to || a + n == from)
                    })
                {
                    taken[j] = true;
                    more.push(j);
                    from = from.min(homes[j].0);
                    to = to.max(homes[j].0 + homes[j].1);
                }
                // one at a time, a run is looked up in a piece that starts
                // at the block's start or at the end of a run moved before
                if more
                    .iter()
                    .chain([&k])
                    .any(|&j| keep.contains(&(homes[j].0 + homes[j].1)))
                {
                    for &j in &more {
                        taken[j] = false;
                    }
                    (from, to) = (addr, addr + len);
                }
                if self.work_done(backend, &mut done, id, clock) {
                    self.unmap_block_with(
                        backend,
                        id,
                        Some((from, to - from)),
                        UnmapSync::Recycle,
                        false,
                    );
                }
            }
            if group {
                let seq = |id: PhysId| homes.iter().position(|h| h.2 == id);
                self.segments.spare[spared..].sort_by_key(|s| seq(s.2));
            }
        }
        let r = self.stats.reserved_bytes.all();
        let (current, peak) = (r.current.max(0) as u64, r.peak.max(0) as u64);
        let live = self.stats.allocated_bytes.all().peak.max(0) as u64;
        let cap = peak.max(live + self.recycling.allowance(live));
        let need = need.div_ceil(SMALL_BUFFER) * SMALL_BUFFER;
        if current + need <= cap {
            return;
        }
        let mut want = current + need - cap;
        let slack = (live / HARD_SLACK)
            .min(HARD_SLACK_MAX)
            .saturating_sub(cap - live.min(cap));
        let mut cands: SmallVec<[(u64, u64, BlockId); 16]> = SmallVec::new();
        for small in [true, false] {
            for e in self.pools.pool(DEFAULT_POOL, small).free.iter() {
                if self.unmappable(e.id) && !keep.contains(&e.addr) {
                    let pages = self.unmappable_bytes(e.id);
                    if pages > 0 {
                        cands.push((pages, e.addr, e.id));
                    }
                }
            }
        }
        order_victims(&mut cands, want, self.recycling.churning(live));
        // Pages with no work pending go first, with no wait (the host stays
        // ahead of the device): a block is done when a completion fence of
        // its stream recorded after its free has completed (every block of
        // an idle stream is; `EventState::probe`, one probe per stream).
        // Then, if that is not enough and reserved memory would pass the
        // hard cap (the allocated peak plus 1/`HARD_SLACK`, at most
        // `HARD_SLACK_MAX`), pages of busy streams, after one
        // synchronization each; below it the segment grows instead: a stall
        // of the pipeline costs more than a few pages.
        for busy_pass in [false, true] {
            for &(_, _, id) in &cands {
                if want == 0 {
                    return;
                }
                // an earlier unmap may have reused the id
                if !self.unmappable(id) || keep.contains(&self.blocks[id].addr) {
                    continue;
                }
                if !self.work_done(backend, &mut done, id, clock) {
                    if !busy_pass {
                        continue;
                    }
                    if want <= slack {
                        // within the hard cap: grow rather than wait
                        return;
                    }
                    let stream = self.segments.expandable_at(self.blocks[id].addr).1.stream;
                    let own = self.blocks[id].stream;
                    // the segment's stream, and the block's own if another
                    let waits: &[B::Stream] = if own == stream {
                        &[stream]
                    } else {
                        &[stream, own]
                    };
                    if let Err(err) = waits.iter().try_for_each(|&s| sync_stream(backend, s)) {
                        tracing::debug!(%err, "synchronizing before recycling failed; pages stay mapped");
                        continue;
                    }
                    // synchronized: done from now on
                    for &s in waits {
                        self.events.synchronized(backend, s);
                        note_done(&mut done, s, clock);
                    }
                }
                // the range stays reserved: the stream maps into it again soon
                let got = self.unmap_block_with(backend, id, None, UnmapSync::Recycle, false);
                want = want.saturating_sub(got);
            }
        }
    }

    /// Whether the work on free block `id` is done, so its pages may move
    /// with no wait: a completion fence of its stream recorded after its
    /// free has completed, and, when its segment belongs to another stream,
    /// that stream is idle (`done`: this recycling call's probes, one per
    /// stream; `clock`: the free clock when the call began).
    fn work_done(
        &mut self,
        backend: &B,
        done: &mut Seen<B::Stream>,
        id: BlockId,
        clock: u64,
    ) -> bool {
        let stream = self.segments.expandable_at(self.blocks[id].addr).1.stream;
        let own = self.blocks[id].stream;
        self.done_on(backend, done, own) >= self.blocks.freed_at(id)
            && (own == stream || self.done_on(backend, done, stream) == clock)
    }

    /// Where the physical memory of each ghost wholly among the pages that
    /// a request of `bytes` at `at` would map is mapped now: (address,
    /// bytes, id of the memory) of each such run, once each, in the
    /// ghosts' order.
    fn ghost_homes(&self, at: u64, bytes: u64) -> SmallVec<[(u64, u64, PhysId); 4]> {
        let (_, e) = self.segments.expandable_at(at);
        let lo = ((at - e.start) / e.page) as usize;
        let hi = (at + bytes - e.start).div_ceil(e.page) as usize;
        let mut out = SmallVec::new();
        for (g, n, pid) in e.ghosts_in(lo, hi) {
            if g < lo || g + n > hi {
                continue;
            }
            let Some(&(index, first)) = self.segments.homes.get(&pid) else {
                continue;
            };
            let Some(home) = self.segments.expandable[index as usize].as_ref() else {
                continue;
            };
            let Some(&(pages, _, _)) = home.runs.get(&first) else {
                continue;
            };
            let run = (
                home.start + first as u64 * home.page,
                pages as u64 * home.page,
                pid,
            );
            debug_assert_eq!(run.1, n as u64 * e.page);
            if !out.contains(&run) {
                out.push(run);
            }
        }
        out
    }

    /// Cross-stream lending (cachalot's expandable mode, outside capture):
    /// for request `p`, which its own stream's free blocks cannot serve, the
    /// best-fitting free block of another stream of the same default pool,
    /// taken out of its free set. The block stays its stream's (its segment
    /// and shard keep it, so no page moves and no block changes shard); the
    /// block is handed out with `p.stream` recorded as a use, so its free
    /// records an end-of-life event there and the block goes back to its
    /// own stream's set once that work is done, as after `record_stream`.
    ///
    /// A block whose work is done (a completion fence of its stream
    /// recorded after its free has completed) is taken first, with no
    /// wait; the candidates are probed best fit first, on at most four
    /// streams (a probe may record a fence: one miss on a device with many
    /// busy streams records at most four). Otherwise the best-fitting one is taken
    /// and `p.stream` waits for the oldest fence of the block's stream
    /// recorded after its free (the probe records one when none is), so
    /// the new work runs after every earlier use of the block and no
    /// later work of the other stream is waited for: one inserted wait,
    /// no host synchronization. Memory one stream cached and no longer
    /// uses thus serves another where page recycling would unmap and map
    /// it again (driver calls of tens of microseconds per page) and where
    /// PyTorch would grow. `None`: no block fits, or the wait could not be
    /// queued (the caller grows instead).
    pub(in crate::engine) fn lend_block(
        &mut self,
        backend: &B,
        p: &Params<B::Stream>,
    ) -> Option<BlockId> {
        /// Candidates taken per stream, smallest first (a busy stream's
        /// latest frees are not done yet; older, larger ones may be).
        const PER_STREAM: usize = 8;
        /// The most a lent block may exceed the request by: the larger of
        /// this and half the request. A larger block would be split, and
        /// its stream left with a hole where its own next large request
        /// fits no more (on side_stream_pipeline, lending any block that
        /// fits took the main stream's large blocks apart: peak reserved
        /// 1.076 -> 1.138 of the allocated peak; churn_4streams 1.0624 ->
        /// 1.0583 with the bound, 1.0624 without).
        const LEND_LEFTOVER: u64 = 2 << 20;
        /// The most streams one lending probes for completion fences.
        const MAX_PROBES: usize = 4;
        if p.pool != DEFAULT_POOL {
            return None;
        }
        let fit = FitRule::of(&self.config);
        // The candidates, (size, addr, stream, id): with no device call,
        // one walk over the streams that have free blocks
        let mut cands: Vec<(u64, u64, B::Stream, BlockId)> = Vec::new();
        let pool = self.pools.pool(p.pool, p.small);
        for (s, set) in pool.free.sets().filter(|e| e.0 != p.stream) {
            let mut at = set.first_at_least(p.size);
            let mut looked = 0;
            while let Some(f) = at {
                if !fit.accepts(p.size, f.size)
                    || f.size - p.size > LEND_LEFTOVER.max(p.size / 2)
                    || looked == PER_STREAM
                {
                    break;
                }
                looked += 1;
                if self.unmappable(f.id) {
                    cands.push((f.size, f.addr, s, f.id));
                }
                at = set.next_after(f.size, f.addr);
            }
        }
        cands.sort_unstable_by_key(|c| (c.0, c.1));
        // Then, best fit first, the first whose work is done, probing at
        // most `MAX_PROBES` streams (a probe may record a fence: a miss on
        // a device with many streams must not record one on each).
        let mut done: Seen<B::Stream> = Seen::new();
        let mut best = None;
        for &(_, _, s, id) in &cands {
            if !done.iter().any(|e| e.0 == s) && done.len() == MAX_PROBES {
                continue;
            }
            if self.done_on(backend, &mut done, s) >= self.blocks.freed_at(id) {
                best = Some((s, id));
                break;
            }
        }
        let any = cands.first().map(|c| (c.2, c.3));
        let (s, id) = match (best, any) {
            (Some((s, id)), _) => (s, id),
            (None, Some((s, id))) => {
                // the probe above (the best fit's stream is probed first)
                // left a fence after every free of `s`
                let stamp = self.blocks.freed_at(id);
                let ev = self.events.covering(s, stamp)?;
                if let Err(err) = backend.stream_wait_event(p.stream, ev) {
                    tracing::debug!(%err, "waiting for a lent block's fence failed");
                    return None;
                }
                self.lent_waits += 1;
                (s, id)
            }
            (None, None) => return None,
        };
        self.remove_free(id);
        self.pools.pool_mut(p.pool, p.small).free.note_out(s);
        // the use on `p.stream`, as `record_stream` (a block split off it
        // when it is handed out starts with no uses)
        self.blocks[id].stream_uses.push(p.stream);
        self.lent += 1;
        tracing::debug!(from = ?s, to = ?p.stream, "lending a free block of another stream");
        Some(id)
    }

    /// [`EventState::probe`](crate::engine::events) of `stream`, once per
    /// recycling call (`seen` caches the answers).
    fn done_on(&mut self, backend: &B, seen: &mut Seen<B::Stream>, stream: B::Stream) -> u64 {
        if let Some(e) = seen.iter().find(|e| e.0 == stream) {
            return e.1;
        }
        let ask_stream = !self.capture.is_active();
        let d = self.events.probe(backend, stream, ask_stream);
        note_done(seen, stream, d);
        d
    }

    /// The chain request `p` maps into when pages recycle: of the stream's
    /// chains ([`Self::chain_at`]), the lowest (as PyTorch's
    /// `find_expandable_block`), so the mapped pages gather at the bottom
    /// of each segment and a repeating workload moves the same pages
    /// between the same places, which ghost mappings make free
    /// (`docs/design-expandable.md`, "Ghost mappings"). The chain with the
    /// fewest bytes left to map instead makes the mapped range of
    /// side_stream_pipeline creep up its reservation, a step at a time, for
    /// good. Returns its first block, the bytes to map, and the addresses
    /// [`Self::recycle_pages`] must leave alone: the chain's blocks and the
    /// neighbours on either side (an unmap merging into one of them would
    /// change the chain). `None`: no chain fits (a new segment serves it).
    pub(in crate::engine) fn recycling_chain(
        &self,
        p: &Params<B::Stream>,
    ) -> Option<(BlockId, u64, Range<u64>)> {
        let pool = self.pools.pool(p.pool, p.small);
        let chain = pool
            .unmapped
            .range((p.stream, 0)..=(p.stream, u64::MAX))
            .find_map(|(_, &c)| self.chain_at(c, p))?;
        let keep = self.chain_keep(&chain);
        Some((chain.start, chain.unmapped, keep))
    }

    /// The addresses of `chain`'s blocks and of the neighbours on either
    /// side.
    fn chain_keep(&self, chain: &Chain) -> Range<u64> {
        let (first, last) = (&self.blocks[chain.start], &self.blocks[chain.last]);
        let lo = match first.prev {
            NIL => first.addr,
            prev => self.blocks[prev].addr,
        };
        let hi = match last.next {
            NIL => last.addr + last.size,
            next => self.blocks[next].addr + self.blocks[next].size,
        };
        lo..hi
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIVE: u64 = 1 << 34;

    /// `n` recycled runs mapped again: `n` × 26 µs.
    fn remaps(n: u64) -> MoveCalls {
        MoveCalls {
            remaps: n,
            ..MoveCalls::default()
        }
    }

    /// The runs mapped again that cost `ns_per_op` per operation over a
    /// window of `frees` frees (two operations each).
    fn costing(ns_per_op: u64, frees: u64) -> MoveCalls {
        remaps(ns_per_op * 2 * frees / REMAP_NS)
    }

    #[test]
    fn churning_takes_the_covering_block_then_the_largest() {
        let ids = |c: &[(u64, u64, BlockId)]| c.iter().map(|x| x.2).collect::<Vec<_>>();
        let base = [(6, 0, 1), (2, 0, 2), (9, 0, 3), (4, 0, 4), (4, 8, 5)];
        let mut c = base;
        order_victims(&mut c, 5, false);
        assert_eq!(ids(&c), [2, 4, 5, 1, 3], "smallest first");
        let mut c = base;
        order_victims(&mut c, 5, true);
        assert_eq!(
            ids(&c),
            [1, 3, 5, 4, 2],
            "the 6 covers 5 alone, then largest first"
        );
        let mut c = base;
        order_victims(&mut c, 10, true);
        assert_eq!(ids(&c), [3, 1, 5, 4, 2], "none covers 10: largest first");
        let mut c = base;
        order_victims(&mut c, 9, true);
        assert_eq!(ids(&c), [3, 1, 5, 4, 2], "the largest covers 9 itself");
        let mut c = base;
        order_victims(&mut c, 1, true);
        assert_eq!(ids(&c), [2, 3, 1, 5, 4], "the smallest covers 1");
        let mut none: [(u64, u64, BlockId); 0] = [];
        order_victims(&mut none, 1, true);
    }

    #[test]
    fn moves_within_the_budget_keep_the_first_allowance() {
        let mut r = Recycling::default();
        let mut clock = 0;
        for _ in 0..100 {
            clock += WINDOW_FREES;
            r.charge(costing(MOVE_BUDGET_NS - 5, WINDOW_FREES), clock, LIVE);
        }
        assert_eq!(r.allowance(LIVE), LIVE / FIRST_SLACK);
        assert!(!r.churning(LIVE));
    }

    #[test]
    fn windows_over_the_budget_double_it_up_to_the_largest() {
        let mut r = Recycling::default();
        let mut clock = 0;
        let mut seen = vec![r.allowance(LIVE)];
        for _ in 0..6 {
            clock += WINDOW_FREES;
            r.charge(costing(2 * MOVE_BUDGET_NS, WINDOW_FREES), clock, LIVE);
            seen.push(r.allowance(LIVE));
        }
        let (first, max) = (LIVE / FIRST_SLACK, LIVE / MAX_SLACK);
        assert_eq!(seen, [first, 2 * first, 4 * first, max, max, max, max]);
        assert!(r.churning(LIVE));
        // a window closes only once its frees have passed: calls charged
        // within one (and within twice its budget) change nothing yet
        let mut r = Recycling::default();
        r.charge(
            costing(2 * MOVE_BUDGET_NS, WINDOW_FREES),
            WINDOW_FREES - 1,
            LIVE,
        );
        assert_eq!(r.allowance(LIVE), first);
        r.charge(MoveCalls::default(), WINDOW_FREES, LIVE);
        assert_eq!(r.allowance(LIVE), 2 * first);
    }

    #[test]
    fn moves_that_spend_twice_a_windows_budget_raise_it_at_once() {
        let budget = MOVE_BUDGET_NS * 2 * WINDOW_FREES;
        let mut r = Recycling::default();
        // twice the budget, 100 frees into the window: not yet
        r.charge(remaps(2 * budget / REMAP_NS), 100, LIVE);
        assert_eq!(r.allowance(LIVE), LIVE / FIRST_SLACK);
        // one run more: at once
        r.charge(remaps(1), 101, LIVE);
        assert_eq!(r.allowance(LIVE), 2 * (LIVE / FIRST_SLACK));
        // and the window starts again there
        r.charge(remaps(1), 102, LIVE);
        assert_eq!(r.allowance(LIVE), 2 * (LIVE / FIRST_SLACK));
    }

    #[test]
    fn unmaps_and_releases_are_weighed_too() {
        let mut r = Recycling::default();
        let window = MOVE_BUDGET_NS * 2 * WINDOW_FREES;
        let calls = MoveCalls {
            remaps: 0,
            unmaps: window / UNMAP_NS / 2 + 1,
            releases: window / RELEASE_NS / 2 + 1,
        };
        r.charge(calls, WINDOW_FREES, LIVE);
        assert_eq!(r.allowance(LIVE), 2 * (LIVE / FIRST_SLACK));
    }
}
