//! The shards' stat logs: exact stats, peaks included, with no shared
//! write on the fast path (`docs/design-shards.md`, "Session 9").
//!
//! A fast operation (a hit, a plain free) does not touch the device's
//! [`DeviceStats`]: it appends its stat transitions ([`Rec`], a few words)
//! to its shard's log, stamped with the time ([`now`]). The device replays
//! the logs into its stats through the engine's own transitions (the
//! [`StatSink`] of [`DeviceStats`]), each shard's entries in their order
//! and the shards interleaved by their stamps, so every current, every
//! cumulative count and every peak is what the unsharded engine would have
//! computed for that order of the operations. The order is real time: a
//! stamp is taken under the shard's lock, from the monotonic clock, so an
//! operation that ends before another begins has the smaller stamp
//! (operations that overlap may be put in either order: both orders are
//! possible histories). While one shard alone is out (`FastView::solo`)
//! no other shard can change a stat, and the shard writes a copy of the
//! stats directly instead (`Shard::mirror`): no log, no stamp.
//!
//! The device replays everything at check-in (every shard held: the stats
//! are exact for the engine's own code). A log that fills up
//! ([`LOG_CAP`]) is set aside and offered to the device; a flush
//! (`CachingAllocator::flush_held`) holds every shard's lock at once, for
//! as long as it takes to swap their logs for empty ones ([`Flush`]), and
//! replays them after letting go: every entry swapped out was logged
//! before any entry logged after, so nothing is left waiting. The replay
//! goes through the cheap form of the stats ([`FastStats`]) when it has
//! more than a few entries, and applies a run of one log's entries at a
//! time, for as long as they come before every other log's head.
#![forbid(unsafe_code)]

use crate::engine::accounting::{FastStats, StatSink};
use crate::engine::shard::SHARDS;
use crate::stats::{DeviceStats, StatType};

/// Entries a shard's log holds (allocated once, at the shard's creation:
/// the fast path never grows it; a full log is flushed).
#[cfg(not(feature = "shuttle"))]
pub(crate) const LOG_CAP: usize = 256;
/// Entries a shard's log holds: a few under the model check, so that its
/// schedules take full logs out too.
#[cfg(feature = "shuttle")]
pub(crate) const LOG_CAP: usize = 3;

/// One fast operation's stat transitions.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rec {
    /// A hit (the engine's `alloc_found_block`).
    Alloc(AllocTransitions),
    /// A plain free (the engine's `retire` and `free_block`).
    Free(FreeTransitions),
}

impl Rec {
    /// Writes the transitions to `s`.
    #[inline(always)]
    pub(crate) fn apply(&self, s: &mut impl StatSink) {
        match self {
            Rec::Alloc(a) => a.apply(s),
            Rec::Free(f) => f.apply(s),
        }
    }
}

/// A log entry: a fast operation's transitions and its time stamp.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    /// The time stamp, [`now`].
    pub ts: u64,
    /// What the operation changed.
    pub rec: Rec,
}

/// The stat transitions of a hit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AllocTransitions {
    /// The pool kind of the block.
    pub st: StatType,
    /// The found block was split for the request.
    pub split: bool,
    /// The found block was a split block already.
    pub already_split: bool,
    /// The found block's size.
    pub block_size: u64,
    /// The rounded request.
    pub rounded: u64,
    /// The caller's request.
    pub requested: u64,
    /// The block handed out is oversize (`max_split_size` or more).
    pub oversize: bool,
}

impl AllocTransitions {
    /// Writes the transitions to `s` (as the engine's `alloc_found_block`).
    #[inline(always)]
    pub(crate) fn apply(&self, s: &mut impl StatSink) {
        let st = self.st;
        let size = if self.split {
            if self.already_split {
                s.on_split_split(st, self.rounded);
            } else {
                s.on_split_segment(st, self.block_size - self.rounded);
            }
            self.rounded
        } else {
            if self.already_split {
                s.on_take_split(st, self.block_size);
            }
            self.block_size
        };
        s.on_alloc(st, size, self.requested, self.oversize);
    }
}

/// The stat transitions of a plain free.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FreeTransitions {
    /// The pool kind of the block.
    pub st: StatType,
    /// The block's size.
    pub size: u64,
    /// The block was oversize.
    pub oversize: bool,
    /// The caller's request the block served.
    pub requested: u64,
    /// The change of inactive split blocks (merges and the result).
    pub split_count: i64,
    /// The change of inactive split bytes.
    pub split_bytes: i64,
}

impl FreeTransitions {
    /// Writes the transitions to `s` (as the engine's `retire` and
    /// `free_block`).
    #[inline(always)]
    pub(crate) fn apply(&self, s: &mut impl StatSink) {
        s.on_free_requested(self.st, self.size, self.oversize);
        s.on_inactive_split(self.st, self.split_count, self.split_bytes);
        s.on_inactive(self.st, self.size, self.requested);
    }
}

#[cfg(not(feature = "shuttle"))]
thread_local! {
    /// The last stamp this thread took: stamps are strictly increasing per
    /// thread, so one thread's operations on several shards keep their
    /// order even on a clock coarser than an operation.
    static LAST: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A time stamp (nanoseconds of the monotonic clock since the first stamp
/// of the process, plus one; never 0), strictly above this thread's last.
#[cfg(not(feature = "shuttle"))]
#[inline]
pub(crate) fn now() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    let t = base.elapsed().as_nanos() as u64 + 1;
    LAST.with(|c| {
        let v = t.max(c.get() + 1);
        c.set(v);
        v
    })
}

/// A time stamp: under the model check, one global counter (the model's
/// threads run one at a time, so its order is the order of execution).
#[cfg(feature = "shuttle")]
#[inline]
pub(crate) fn now() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CLOCK: AtomicU64 = AtomicU64::new(1);
    CLOCK.fetch_add(1, Ordering::Relaxed)
}

/// The device's side of a flush: the logs swapped out of the shards, and
/// empty logs of [`LOG_CAP`] capacity to swap in (made on the first
/// flushes, then reused: the fast path never allocates).
pub(crate) struct Flush {
    /// Per shard, its set-aside log and its log, as swapped out.
    out: Vec<[Vec<Entry>; 2]>,
    /// Empty logs of `LOG_CAP` capacity.
    spares: Vec<Vec<Entry>>,
}

impl Default for Flush {
    fn default() -> Self {
        Self {
            out: (0..SHARDS).map(|_| [Vec::new(), Vec::new()]).collect(),
            spares: Vec::new(),
        }
    }
}

impl Flush {
    /// An empty log of `LOG_CAP` capacity.
    fn spare(&mut self) -> Vec<Entry> {
        self.spares
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(LOG_CAP))
    }

    /// Swaps shard `k`'s logs (its lock held; `full`, the one set aside,
    /// then `log`) for empty ones of the same capacity.
    #[inline]
    pub(crate) fn swap(&mut self, k: usize, full: &mut Vec<Entry>, log: &mut Vec<Entry>) {
        debug_assert!(self.out[k].iter().all(Vec::is_empty));
        if !full.is_empty() {
            let e = self.spare();
            self.out[k][0] = std::mem::replace(full, e);
        }
        if !log.is_empty() {
            let e = self.spare();
            self.out[k][1] = std::mem::replace(log, e);
        }
    }

    /// Replays every log swapped out ([`replay`]) and keeps them as spares.
    pub(crate) fn replay(&mut self, stats: &mut DeviceStats) {
        {
            let mut seqs: [&[Entry]; 2 * SHARDS] = [&[]; 2 * SHARDS];
            for (pair, out) in seqs.chunks_mut(2).zip(&self.out) {
                pair[0] = &out[0];
                pair[1] = &out[1];
            }
            replay(stats, &seqs);
        }
        for out in &mut self.out {
            for log in out {
                if log.capacity() > 0 {
                    log.clear();
                    self.spares.push(std::mem::take(log));
                }
            }
        }
    }
}

/// Entries from which a replay goes through a [`FastStats`] (loading and
/// storing it costs about as much as this many entries save).
const FAST_REPLAY_MIN: usize = 16;

/// Replays the stat logs `seqs` into `stats`: each log's entries in their
/// order, the logs interleaved by stamp (ties: the lower index first, so
/// a shard's set-aside log at `2k` comes before its log at `2k + 1`).
pub(crate) fn replay(stats: &mut DeviceStats, seqs: &[&[Entry]; 2 * SHARDS]) {
    let total: usize = seqs.iter().map(|s| s.len()).sum();
    if total >= FAST_REPLAY_MIN {
        let mut fast = FastStats::default();
        fast.load(stats);
        merge(&mut fast, seqs);
        fast.store(stats);
    } else if total > 0 {
        merge(stats, seqs);
    }
}

/// [`replay`] into `sink`: the earliest head (stamp, then index) is
/// applied, with the entries after it on its log for as long as they come
/// before every other log's head.
#[inline]
fn merge(sink: &mut impl StatSink, seqs: &[&[Entry]; 2 * SHARDS]) {
    let mut live: [&[Entry]; 2 * SHARDS] = [&[]; 2 * SHARDS];
    // (stamp, index) of each live log's head, in index order
    let mut heads = [(0u64, 0usize); 2 * SHARDS];
    let mut n = 0;
    for (i, s) in seqs.iter().enumerate() {
        if let Some(e) = s.first() {
            live[n] = s;
            heads[n] = (e.ts, i);
            n += 1;
        }
    }
    while n > 1 {
        let mut at = 0;
        let mut second = (u64::MAX, usize::MAX);
        for j in 1..n {
            if heads[j] < heads[at] {
                second = heads[at];
                at = j;
            } else if heads[j] < second {
                second = heads[j];
            }
        }
        let s = live[at];
        let idx = heads[at].1;
        let mut p = 0;
        while p < s.len() && (s[p].ts, idx) < second {
            s[p].rec.apply(sink);
            p += 1;
        }
        if p == s.len() {
            // keep the rest in index order
            live.copy_within(at + 1..n, at);
            heads.copy_within(at + 1..n, at);
            n -= 1;
        } else {
            live[at] = &s[p..];
            heads[at].0 = s[p].ts;
        }
    }
    if n == 1 {
        for e in live[0] {
            e.rec.apply(sink);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(ts: u64, size: u64) -> Entry {
        Entry {
            ts,
            rec: Rec::Alloc(AllocTransitions {
                st: StatType::LargePool,
                split: false,
                already_split: false,
                block_size: size,
                rounded: size,
                requested: size,
                oversize: false,
            }),
        }
    }

    fn free(ts: u64, size: u64) -> Entry {
        Entry {
            ts,
            rec: Rec::Free(FreeTransitions {
                st: StatType::LargePool,
                size,
                oversize: false,
                requested: size,
                split_count: 0,
                split_bytes: 0,
            }),
        }
    }

    fn peak(s: &DeviceStats) -> (i64, i64) {
        let a = &s.allocated_bytes.0[StatType::Aggregate as usize];
        (a.current, a.peak)
    }

    fn seqs<'a>(logs: &[(usize, &'a [Entry])]) -> [&'a [Entry]; 2 * SHARDS] {
        let mut s: [&[Entry]; 2 * SHARDS] = [&[]; 2 * SHARDS];
        for &(i, l) in logs {
            s[i] = l;
        }
        s
    }

    #[test]
    fn shards_interleave_by_stamp() {
        // shard 0: +10 at 1, -10 at 4; shard 1: +5 at 2, -5 at 3: the sum
        // peaks at 15 (both live between 2 and 3)
        let a = [alloc(1, 10), free(4, 10)];
        let b = [alloc(2, 5), free(3, 5)];
        let mut s = DeviceStats::default();
        replay(&mut s, &seqs(&[(1, &a), (3, &b)]));
        assert_eq!(peak(&s), (0, 15));
        // the other order of the same operations: shard 1's before
        // shard 0's, the peak is 10
        let a = [alloc(3, 10), free(4, 10)];
        let b = [alloc(1, 5), free(2, 5)];
        let mut s = DeviceStats::default();
        replay(&mut s, &seqs(&[(1, &a), (3, &b)]));
        assert_eq!(peak(&s), (0, 10));
    }

    #[test]
    fn equal_stamps_go_to_the_lower_index() {
        // a free and an alloc stamped alike: the log at the lower index
        // first (a shard's set-aside log before its log)
        let a = [alloc(1, 4), free(5, 4)];
        let b = [alloc(5, 6)];
        let mut s = DeviceStats::default();
        replay(&mut s, &seqs(&[(0, &a), (1, &b)]));
        assert_eq!(peak(&s), (6, 6));
        let mut s = DeviceStats::default();
        replay(&mut s, &seqs(&[(0, &b), (1, &a)]));
        assert_eq!(peak(&s), (6, 10));
    }

    /// The merge (runs of one log, through [`FastStats`] or not) gives the
    /// stats of applying every entry one by one in (stamp, index) order.
    #[test]
    fn merge_matches_one_by_one_in_stamp_order() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..300 {
            let nlogs = 1 + (next() % 6) as usize;
            let per = if round % 2 == 0 { 3 } else { 60 };
            let mut logs: Vec<(usize, Vec<Entry>)> = Vec::new();
            let mut used = [false; 2 * SHARDS];
            for _ in 0..nlogs {
                let idx = (next() % (2 * SHARDS as u64)) as usize;
                if std::mem::replace(&mut used[idx], true) {
                    continue;
                }
                let mut ts = 1 + next() % 5;
                let mut live: Vec<u64> = Vec::new();
                let mut log = Vec::new();
                for _ in 0..(next() % per) {
                    // stamps rise on a log, with ties across logs
                    ts += next() % 3;
                    if !live.is_empty() && next() % 2 == 0 {
                        let size = live.swap_remove((next() as usize) % live.len());
                        log.push(free(ts, size));
                    } else {
                        let size = 1 + next() % 50;
                        live.push(size);
                        log.push(alloc(ts, size));
                    }
                    ts += 1;
                }
                logs.push((idx, log));
            }
            let refs: Vec<(usize, &[Entry])> =
                logs.iter().map(|(i, l)| (*i, l.as_slice())).collect();
            let mut got = DeviceStats::default();
            replay(&mut got, &seqs(&refs));
            let mut all: Vec<(u64, usize, usize, Entry)> = Vec::new();
            for (i, l) in &logs {
                for (p, e) in l.iter().enumerate() {
                    all.push((e.ts, *i, p, *e));
                }
            }
            all.sort_by_key(|&(ts, i, p, _)| (ts, i, p));
            let mut want = DeviceStats::default();
            for (_, _, _, e) in &all {
                e.rec.apply(&mut want);
            }
            assert_eq!(got, want, "round {round}");
        }
    }

    #[test]
    fn stamps_increase_on_one_thread() {
        let a = now();
        let b = now();
        assert!(a > 0 && b > a);
    }

    #[test]
    fn a_swapped_log_keeps_its_capacity_and_is_replayed_once() {
        let mut f = Flush::default();
        let mut full = Vec::with_capacity(LOG_CAP);
        full.push(alloc(1, 3));
        let mut log = Vec::with_capacity(LOG_CAP);
        log.push(alloc(2, 4));
        f.swap(2, &mut full, &mut log);
        assert!(log.is_empty() && log.capacity() >= LOG_CAP);
        assert!(full.is_empty() && full.capacity() >= LOG_CAP);
        let mut s = DeviceStats::default();
        f.replay(&mut s);
        assert_eq!(peak(&s), (7, 7));
        // the logs swapped out are spares now, and replayed only once
        assert_eq!(f.spares.len(), 2);
        assert!(
            f.spares
                .iter()
                .all(|l| l.is_empty() && l.capacity() >= LOG_CAP)
        );
        f.replay(&mut s);
        assert_eq!(peak(&s), (7, 7));
        // a swap takes its empty logs from the spares
        log.push(free(3, 4));
        f.swap(2, &mut full, &mut log);
        assert_eq!(f.spares.len(), 1);
        f.replay(&mut s);
        assert_eq!(peak(&s), (3, 7));
    }
}
