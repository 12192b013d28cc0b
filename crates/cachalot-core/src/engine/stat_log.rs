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
//! ([`LOG_CAP`]) is set aside and offered to the device; taking logs out
//! does not stop the other shards (`CachingAllocator::flush_held`): each
//! shard's logs are swapped out under its lock in turn, and only the
//! entries stamped before the first swap are replayed, since later ones of
//! the shards swapped first are still to come; the rest wait in [`Pending`].
#![forbid(unsafe_code)]

use crate::engine::accounting::StatSink;
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

/// The device's side of the logs: each shard's entries taken out and not
/// yet replayed, in their order.
pub(crate) struct Pending {
    logs: Vec<Vec<Entry>>,
    /// Empty logs of [`LOG_CAP`] capacity, swapped for a shard's.
    spare: Vec<Entry>,
    spare2: Vec<Entry>,
}

impl Default for Pending {
    fn default() -> Self {
        Self {
            logs: (0..SHARDS).map(|_| Vec::new()).collect(),
            spare: Vec::with_capacity(LOG_CAP),
            spare2: Vec::with_capacity(LOG_CAP),
        }
    }
}

impl Pending {
    /// Swaps a shard's logs (its lock held; `full`, the one set aside,
    /// then `log`) for empty ones of the same capacity;
    /// [`Self::keep_swapped`] files what they held.
    #[inline]
    pub(crate) fn swap(&mut self, full: &mut Vec<Entry>, log: &mut Vec<Entry>) {
        debug_assert!(self.spare.is_empty() && self.spare.capacity() >= LOG_CAP);
        debug_assert!(self.spare2.is_empty() && self.spare2.capacity() >= LOG_CAP);
        if !full.is_empty() {
            std::mem::swap(full, &mut self.spare2);
        }
        std::mem::swap(log, &mut self.spare);
    }

    /// Files the entries of the logs swapped out last as shard `k`'s, in
    /// their order (no shard lock needed).
    #[inline]
    pub(crate) fn keep_swapped(&mut self, k: usize) {
        self.logs[k].extend_from_slice(&self.spare2);
        self.logs[k].extend_from_slice(&self.spare);
        self.spare2.clear();
        self.spare.clear();
    }

    /// Takes shard `k`'s log (its lock held) in full.
    pub(crate) fn take(&mut self, k: usize, log: &mut Vec<Entry>) {
        if !log.is_empty() {
            self.logs[k].extend_from_slice(log);
            log.clear();
        }
    }

    /// Whether no entry waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.logs.iter().all(Vec::is_empty)
    }

    /// Replays the waiting entries into `stats` ([`replay`]), for as long
    /// as the next is stamped before `until`; the rest keep waiting.
    /// Returns how many were replayed.
    pub(crate) fn replay(&mut self, stats: &mut DeviceStats, until: u64) -> usize {
        let mut logs: [&[Entry]; SHARDS] = [&[]; SHARDS];
        for (l, log) in logs.iter_mut().zip(&self.logs) {
            *l = log;
        }
        let pos = replay(stats, &logs, until);
        let mut n = 0;
        for (log, p) in self.logs.iter_mut().zip(pos) {
            log.drain(..p);
            n += p;
        }
        n
    }
}

/// Replays shard logs `logs` into `stats`: each shard's entries in their
/// order, the shards interleaved by stamp (ties: the lower shard first),
/// for as long as the next entry is stamped before `until` (`u64::MAX`:
/// everything, as no stamp reaches it). Returns how many of each log were
/// replayed.
pub(crate) fn replay(
    stats: &mut DeviceStats,
    logs: &[&[Entry]; SHARDS],
    until: u64,
) -> [usize; SHARDS] {
    let mut pos = [0usize; SHARDS];
    let mut live = [0usize; SHARDS];
    let mut n_live = 0;
    for (k, log) in logs.iter().enumerate() {
        if !log.is_empty() {
            live[n_live] = k;
            n_live += 1;
        }
    }
    while n_live > 0 {
        if n_live == 1 {
            let k = live[0];
            let log = logs[k];
            let mut p = pos[k];
            while p < log.len() && log[p].ts < until {
                log[p].rec.apply(stats);
                p += 1;
            }
            pos[k] = p;
            break;
        }
        // the earliest head (the lower shard wins a tie)
        let mut at = 0;
        let mut best = logs[live[0]][pos[live[0]]].ts;
        for (i, &k) in live[1..n_live].iter().enumerate() {
            let ts = logs[k][pos[k]].ts;
            if ts < best {
                best = ts;
                at = i + 1;
            }
        }
        if best >= until {
            break;
        }
        let k = live[at];
        logs[k][pos[k]].rec.apply(stats);
        pos[k] += 1;
        if pos[k] == logs[k].len() {
            // keep `live` in shard order (ties go to the lower shard)
            live.copy_within(at + 1..n_live, at);
            n_live -= 1;
        }
    }
    pos
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

    #[test]
    fn shards_interleave_by_stamp() {
        // shard 0: +10 at 1, -10 at 4; shard 1: +5 at 2, -5 at 3: the sum
        // peaks at 15 (both live between 2 and 3)
        let mut p = Pending::default();
        p.logs[0] = vec![alloc(1, 10), free(4, 10)];
        p.logs[1] = vec![alloc(2, 5), free(3, 5)];
        let mut s = DeviceStats::default();
        assert_eq!(p.replay(&mut s, u64::MAX), 4);
        assert_eq!(peak(&s), (0, 15));
        // the other order of the same operations: shard 1's before
        // shard 0's, the peak is 10
        let mut p = Pending::default();
        p.logs[0] = vec![alloc(3, 10), free(4, 10)];
        p.logs[1] = vec![alloc(1, 5), free(2, 5)];
        let mut s = DeviceStats::default();
        p.replay(&mut s, u64::MAX);
        assert_eq!(peak(&s), (0, 10));
        assert!(p.is_empty());
    }

    #[test]
    fn replay_stops_at_the_watermark_and_keeps_each_shards_order() {
        let mut p = Pending::default();
        // shard 1's second entry is stamped below the watermark but comes
        // after one above it: it must wait with it
        p.logs[0] = vec![alloc(1, 8), alloc(7, 1)];
        p.logs[1] = vec![alloc(2, 4), free(6, 4), alloc(3, 2)];
        let mut s = DeviceStats::default();
        assert_eq!(p.replay(&mut s, 5), 2);
        assert_eq!(peak(&s), (12, 12));
        assert_eq!(p.logs[0].len(), 1);
        assert_eq!(p.logs[1].len(), 2);
        assert_eq!(p.replay(&mut s, u64::MAX), 3);
        assert_eq!(peak(&s), (11, 12));
    }

    #[test]
    fn stamps_increase_on_one_thread() {
        let a = now();
        let b = now();
        assert!(a > 0 && b > a);
    }

    #[test]
    fn a_swapped_log_keeps_its_capacity() {
        let mut p = Pending::default();
        let mut full = Vec::with_capacity(LOG_CAP);
        full.push(alloc(1, 3));
        let mut log = Vec::with_capacity(LOG_CAP);
        log.push(alloc(2, 4));
        p.swap(&mut full, &mut log);
        assert!(log.is_empty() && log.capacity() >= LOG_CAP);
        assert!(full.is_empty() && full.capacity() >= LOG_CAP);
        p.keep_swapped(2);
        // the log set aside first
        assert_eq!(p.logs[2].iter().map(|e| e.ts).collect::<Vec<_>>(), [1, 2]);
        assert!(p.spare.capacity() >= LOG_CAP && p.spare.is_empty());
        assert!(p.spare2.capacity() >= LOG_CAP && p.spare2.is_empty());
    }
}
