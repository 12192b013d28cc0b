//! The shards' stat logs: exact stats, peaks included, with no shared
//! write on the fast path (`docs/design-shards.md`, time-stamped stat
//! logs).
//!
//! A fast operation (a hit, a plain free) does not touch the device's
//! [`DeviceStats`]: it appends its stat changes to its shard's log, one
//! signed delta per kind of stat ([`Entry`], 40 bytes, made by the engine's
//! own transitions through a [`StatSink`]), stamped with the time
//! ([`now`]). The device replays the logs into its stats, each shard's
//! entries in their order and the shards interleaved by their stamps, so
//! every current, every cumulative count and every peak is what the
//! unsharded engine would have computed for that order of the operations.
//! The order is real time: a stamp is taken under the shard's lock, from
//! a clock shared by the threads (`cachalot-clock`: the invariant TSC
//! behind an `lfence`, else the monotonic clock), so an operation that
//! ends before another begins has
//! the smaller stamp (operations that overlap may be put in either order:
//! both orders are possible histories). While one shard alone is out
//! (`Logging::Solo`) no other shard can change a stat, and the shard
//! sums its transitions directly instead (`Shard::mirror`, a [`Window`]
//! folded at check-in): no log, no stamp. Several shards out, used by one
//! thread at a time (`Logging::Shared`), sum theirs into one shared
//! mirror owned by that thread (`shard::SharedMirror`), and log only once
//! two threads take turns there operation by operation.
//!
//! The device replays everything at check-in (every shard held: the stats
//! are exact for the engine's own code). A log that fills up
//! ([`LOG_CAP`]) is set aside and offered to the device; a flush
//! (`CachingAllocator::flush_held`) holds every shard's lock at once, for
//! as long as it takes to swap their logs for empty ones, as one numbered
//! window: every entry swapped out was logged before any entry logged
//! after. It sums the window after letting go of every lock ([`Folds`]:
//! flushes on several threads sum theirs in parallel), and the sums are
//! folded into the stats in the windows' order. A replay of more than a
//! few entries adds them up per kind of change ([`Window`]: running sums
//! and their highest values, folded into the stats once), and takes a run
//! of one log's entries at a time, for as long as they come before every
//! other log's head.
#![forbid(unsafe_code)]

use crate::engine::accounting::{Arr, StatSink};
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

/// A log entry: a fast operation's stat changes, one signed delta per kind
/// of stat it changes (a fast operation changes each stat at most once, and
/// `allocation` and `active`, `allocated_bytes` and `active_bytes` alike),
/// with its time stamp: 40 bytes, written by the shard ([`Entry::of`], the
/// engine's own transitions) so that the device's replay only adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The time stamp, [`now`].
    pub ts: u64,
    /// The change of `allocated_bytes` and of `active_bytes`.
    pub bytes: i64,
    /// The change of `requested_bytes`.
    pub requested: i64,
    /// The change of `inactive_split_bytes`.
    pub split_bytes: i64,
    /// The change of `inactive_split`.
    pub split_count: i32,
    /// The change of `allocation` and of `active`.
    pub count: i8,
    /// The change of `oversize_allocations`.
    pub oversize: i8,
    /// The pool kind ([`StatType`] as a number: 1 small, 2 large).
    pub pool: u8,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 40);

impl Entry {
    /// The entry of the transitions `rec`, stamped `ts`.
    #[inline(always)]
    pub(crate) fn of(rec: &Rec, ts: u64) -> Self {
        let mut d = DeltaSink(Entry {
            ts,
            ..Entry::default()
        });
        rec.apply(&mut d);
        d.0
    }
}

/// Records each transition as its stat's delta ([`Entry::of`]).
struct DeltaSink(Entry);

impl DeltaSink {
    #[inline(always)]
    fn set(&mut self, arr: Arr, st: StatType, d: i64) {
        let e = &mut self.0;
        debug_assert!(st != StatType::Aggregate);
        e.pool = st as u8;
        match arr {
            Arr::Allocation => e.count = d as i8,
            Arr::Active => debug_assert_eq!(d, e.count as i64, "active moves with allocation"),
            Arr::AllocatedBytes => e.bytes = d,
            Arr::ActiveBytes => debug_assert_eq!(d, e.bytes, "active bytes move with allocated"),
            Arr::RequestedBytes => e.requested = d,
            Arr::InactiveSplit => e.split_count = d as i32,
            Arr::InactiveSplitBytes => e.split_bytes = d,
        }
    }
}

impl StatSink for DeltaSink {
    #[inline(always)]
    fn inc(&mut self, arr: Arr, st: StatType, n: i64) {
        self.set(arr, st, n)
    }
    #[inline(always)]
    fn dec(&mut self, arr: Arr, st: StatType, n: i64) {
        self.set(arr, st, -n)
    }
    #[inline(always)]
    fn oversize(&mut self, d: i64) {
        self.0.oversize = d as i8;
    }
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
    /// The block is of an expandable segment: no `inactive_split` change
    /// (PyTorch 2.11).
    pub expandable: bool,
}

impl AllocTransitions {
    /// Writes the transitions to `s` (as the engine's `alloc_found_block`).
    #[inline(always)]
    pub(crate) fn apply(&self, s: &mut impl StatSink) {
        let st = self.st;
        let split_stats = !self.expandable;
        let size = if self.split {
            if split_stats {
                if self.already_split {
                    s.on_split_split(st, self.rounded);
                } else {
                    s.on_split_segment(st, self.block_size - self.rounded);
                }
            }
            self.rounded
        } else {
            if self.already_split && split_stats {
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

/// A time stamp ([`cachalot_clock::stamp`]: the invariant TSC behind an
/// `lfence` where it orders stamps across threads, else nanoseconds of the
/// monotonic clock; counted from the process's first stamp, never 0),
/// strictly above this thread's last. A stamp taken after this thread saw
/// another thread's operation (through a lock, an atomic, a barrier) is
/// above that operation's stamp.
#[cfg(not(feature = "shuttle"))]
#[inline]
pub(crate) fn now() -> u64 {
    let t = cachalot_clock::stamp();
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

mod flusher;
mod folds;
mod window;

pub(crate) use flusher::{Job, offer};
pub use flusher::{
    enabled as stats_thread_enabled, set_enabled as set_stats_thread,
    summed as stats_thread_windows,
};
pub(crate) use folds::{Folds, Taken};
use window::ARR_KIND;
pub(crate) use window::Window;

/// The summary of a flushed window's logs: its entries merged in stamp
/// order (each shard's set-aside log first) and summed in a [`Window`].
pub(crate) fn summarize(taken: &Taken) -> Window {
    let seqs = seqs_of(taken.iter().map(|[full, log]| Some([&full[..], &log[..]])));
    let mut w = Window::default();
    merge(&mut w, &seqs);
    w
}

/// The logs to merge, by shard (its set-aside log at `2k`, its log at
/// `2k + 1`; `None`: a shard with none), as [`replay`] and [`summarize`]
/// take them.
pub(crate) fn seqs_of<'a>(
    shards: impl IntoIterator<Item = Option<[&'a [Entry]; 2]>>,
) -> [&'a [Entry]; 2 * SHARDS] {
    let mut seqs: [&[Entry]; 2 * SHARDS] = [&[]; 2 * SHARDS];
    for (pair, logs) in seqs.chunks_mut(2).zip(shards) {
        if let Some(logs) = logs {
            pair.copy_from_slice(&logs);
        }
    }
    seqs
}

/// Replays the stat logs `seqs` into `stats`: each log's entries in their
/// order, the logs interleaved by stamp (ties: the lower index first, so
/// a shard's set-aside log at `2k` comes before its log at `2k + 1`).
pub(crate) fn replay(stats: &mut DeviceStats, seqs: &[&[Entry]; 2 * SHARDS]) {
    let total: usize = seqs.iter().map(|s| s.len()).sum();
    if total >= WINDOW_MIN {
        let mut w: Window = Window::default();
        merge(&mut w, seqs);
        w.fold(stats);
    } else if total > 0 {
        merge(stats, seqs);
    }
}

/// Entries from which a replay sums them in a [`Window`] (setting one up
/// and folding it costs about as much as this many entries applied one by
/// one save).
const WINDOW_MIN: usize = 16;

/// Where the merge puts the entries, in replay order.
trait Apply {
    fn add(&mut self, e: &Entry);
}

impl Apply for DeviceStats {
    /// The entry's deltas, each to "all" and its pool kind.
    #[inline(always)]
    fn add(&mut self, e: &Entry) {
        let st = if e.pool == 1 {
            StatType::SmallPool
        } else {
            StatType::LargePool
        };
        for (arr, kind) in ARR_KIND {
            let d = match kind {
                0 => e.count as i64,
                1 => e.bytes,
                2 => e.requested,
                3 => e.split_count as i64,
                _ => e.split_bytes,
            };
            self.array_mut(arr).update(st, d);
        }
        if e.oversize != 0 {
            self.oversize_allocations.update(e.oversize as i64);
        }
    }
}

/// Bits of a merge key below the stamp: the log's index (`2 * SHARDS`
/// logs).
const IDX_BITS: u32 = (2 * SHARDS).trailing_zeros();

/// The merge key of a log's head: stamp, then index, in one word (a stamp
/// is below 2^59 for 18 years of a process in nanoseconds, 3.6 years in
/// ticks of a 5 GHz TSC; later ones compare as equal, and then by index).
#[inline(always)]
fn key(ts: u64, idx: usize) -> u64 {
    (ts.min(u64::MAX >> IDX_BITS) << IDX_BITS) | idx as u64
}

/// [`replay`] into `sink`: the earliest head (stamp, then index) is
/// applied, with the entries after it on its log for as long as they come
/// before every other log's head (the heads are compared without a branch:
/// under threads they interleave at random).
#[inline]
fn merge(w: &mut impl Apply, seqs: &[&[Entry]; 2 * SHARDS]) {
    const _: () = assert!((2 * SHARDS).is_power_of_two());
    let mut live: [&[Entry]; 2 * SHARDS] = [&[]; 2 * SHARDS];
    // each live log's head key, in index order
    let mut heads = [0u64; 2 * SHARDS];
    let mut n = 0;
    for (i, s) in seqs.iter().enumerate() {
        if let Some(e) = s.first() {
            live[n] = s;
            heads[n] = key(e.ts, i);
            n += 1;
        }
    }
    while n > 1 {
        let (mut at, mut best, mut second) = (0, heads[0], u64::MAX);
        for (j, &h) in heads.iter().enumerate().take(n).skip(1) {
            let lt = h < best;
            second = if lt { best } else { second.min(h) };
            at = if lt { j } else { at };
            best = if lt { h } else { best };
        }
        let s = live[at];
        let idx = (best & ((1 << IDX_BITS) - 1)) as usize;
        let mut p = 0;
        while p < s.len() && key(s[p].ts, idx) < second {
            w.add(&s[p]);
            p += 1;
        }
        if p == s.len() {
            // keep the rest in index order
            live.copy_within(at + 1..n, at);
            heads.copy_within(at + 1..n, at);
            n -= 1;
        } else {
            live[at] = &s[p..];
            heads[at] = key(s[p].ts, idx);
        }
    }
    if n == 1 {
        for e in live[0] {
            w.add(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::window::Num;
    use super::*;
    use crate::engine::sync::AtomicI64;

    /// A xorshift generator from `seed` (deterministic test inputs).
    fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut rng = seed;
        move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        }
    }

    fn alloc_rec(size: u64) -> Rec {
        Rec::Alloc(AllocTransitions {
            st: StatType::LargePool,
            split: false,
            already_split: false,
            block_size: size,
            rounded: size,
            requested: size,
            oversize: false,
            expandable: false,
        })
    }

    fn free_rec(size: u64) -> Rec {
        Rec::Free(FreeTransitions {
            st: StatType::LargePool,
            size,
            oversize: false,
            requested: size,
            split_count: 0,
            split_bytes: 0,
        })
    }

    fn alloc(ts: u64, size: u64) -> Entry {
        Entry::of(&alloc_rec(size), ts)
    }

    fn free(ts: u64, size: u64) -> Entry {
        Entry::of(&free_rec(size), ts)
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
        // (the same, the log with the earliest head the higher index)
        let mut s = DeviceStats::default();
        replay(&mut s, &seqs(&[(1, &b), (2, &a)]));
        assert_eq!(peak(&s), (6, 10));
    }

    /// A random fast operation's transitions, as the shard makes them (a
    /// free of a split block may merge with its neighbours), of `size`
    /// bytes in pool kind `st`; `Err` when nothing of that kind was live.
    fn random_rec(next: &mut impl FnMut() -> u64, live: &mut Vec<(StatType, u64, bool)>) -> Rec {
        if !live.is_empty() && next().is_multiple_of(2) {
            let (st, size, oversize) = live.swap_remove((next() as usize) % live.len());
            let merged = (next() % 3) as i64;
            return Rec::Free(FreeTransitions {
                st,
                size,
                oversize,
                requested: size - size / 4,
                // merged neighbours, the result itself a split block or not
                split_count: 1 - merged - (next() % 2) as i64 * (merged > 0) as i64,
                split_bytes: size as i64 - (next() % 64) as i64 * merged,
            });
        }
        let st = if next().is_multiple_of(2) {
            StatType::SmallPool
        } else {
            StatType::LargePool
        };
        let block_size = 512 * (1 + next() % 64);
        let split = next().is_multiple_of(2) && block_size > 512;
        let rounded = if split { block_size / 2 } else { block_size };
        let oversize = next().is_multiple_of(8);
        live.push((st, rounded, oversize));
        Rec::Alloc(AllocTransitions {
            st,
            split,
            already_split: next().is_multiple_of(2),
            block_size,
            rounded,
            requested: rounded - next() % 256,
            oversize,
            expandable: next().is_multiple_of(4),
        })
    }

    /// Device stats with history: enough of everything for the random
    /// frees of the tests, and peaks above the currents.
    fn stats_with_history() -> DeviceStats {
        let mut stats = DeviceStats::default();
        for st in [StatType::SmallPool, StatType::LargePool] {
            for (arr, _) in ARR_KIND {
                stats.inc(arr, st, 1 << 40);
                stats.dec(arr, st, 1 << 20);
            }
        }
        stats.oversize(1 << 30);
        stats
    }

    /// The replay (the merge by runs, the window of sums) gives the stats
    /// of applying each operation's transitions one by one, in (stamp,
    /// index) order, from a device state with history.
    #[test]
    fn replay_matches_the_transitions_one_by_one_in_stamp_order() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let mut start = stats_with_history();
        for round in 0..400 {
            // (up to every log at once in some rounds)
            let nlogs = 1 + (next() % [6, 6, 2 * SHARDS as u64][round % 3]) as usize;
            let per = [2, 5, 60][round % 3];
            let mut logs: Vec<(usize, Vec<(Entry, Rec)>)> = Vec::new();
            let mut used = [false; 2 * SHARDS];
            let mut live = Vec::new();
            for _ in 0..nlogs {
                let idx = (next() % (2 * SHARDS as u64)) as usize;
                if std::mem::replace(&mut used[idx], true) {
                    continue;
                }
                let mut ts = 1 + next() % 5;
                let mut log = Vec::new();
                for _ in 0..(next() % per) {
                    // stamps rise on a log, with ties across logs
                    ts += next() % 3;
                    let rec = random_rec(&mut next, &mut live);
                    log.push((Entry::of(&rec, ts), rec));
                    ts += 1;
                }
                logs.push((idx, log));
            }
            let entries: Vec<(usize, Vec<Entry>)> = logs
                .iter()
                .map(|(i, l)| (*i, l.iter().map(|(e, _)| *e).collect()))
                .collect();
            let refs: Vec<(usize, &[Entry])> =
                entries.iter().map(|(i, l)| (*i, l.as_slice())).collect();
            let mut got = start.clone();
            replay(&mut got, &seqs(&refs));
            let mut all: Vec<(u64, usize, usize, Rec)> = Vec::new();
            for (i, l) in &logs {
                for (p, (e, r)) in l.iter().enumerate() {
                    all.push((e.ts, *i, p, *r));
                }
            }
            all.sort_by_key(|&(ts, i, p, _)| (ts, i, p));
            let mut want = start.clone();
            for (_, _, _, r) in &all {
                r.apply(&mut want);
            }
            assert_eq!(got, want, "round {round}");
            if round % 50 == 49 {
                start.reset_peak();
            }
        }
    }

    /// The solo shard's window (transitions written straight into it,
    /// folded at check-in) gives the stats of applying them to the device,
    /// from a state with history, over many check-out/check-in cycles; so
    /// does the shared mirror's (atomic numbers, written and folded through
    /// a shared reference).
    #[test]
    fn a_solo_window_folds_to_the_transitions_applied_in_turn() {
        folds_in_turn::<Cell<i64>>();
        folds_in_turn::<AtomicI64>();
    }

    fn folds_in_turn<N: Num>() {
        let mut next = xorshift(0x1234_5678_9abc_def1);
        let mut dev = stats_with_history();
        dev.reset_accumulated();
        let mut want = dev.clone();
        let mirror = Window::<N>::default();
        let mut live = Vec::new();
        for round in 0..200 {
            for _ in 0..(next() % 40) {
                let rec = random_rec(&mut next, &mut live);
                rec.apply(&mut &mirror);
                rec.apply(&mut want);
            }
            mirror.take_into(&mut dev);
            assert_eq!(dev, want, "round {round}");
            if round % 20 == 19 {
                dev.reset_peak();
                want.reset_peak();
            }
        }
    }

    #[test]
    fn stamps_increase_on_one_thread() {
        let a = now();
        let b = now();
        assert!(a > 0 && b > a);
    }

    #[test]
    fn windows_fold_in_their_order_whatever_order_they_are_filed_in() {
        // window 0: +10 then -10; window 1: +4; in order the peak is 10,
        // then 4 on top of the 0 left: 10 again
        let mut f = Folds::default();
        let mut t0: Taken = std::array::from_fn(|_| [Vec::new(), Vec::new()]);
        t0[3][1] = vec![alloc(1, 10), free(2, 10)];
        let mut t1: Taken = std::array::from_fn(|_| [Vec::new(), Vec::new()]);
        t1[5][0] = vec![alloc(3, 4)];
        let (w0, w1) = (summarize(&t0), summarize(&t1));
        let mut s = DeviceStats::default();
        let mut next = 0;
        // window 1 is filed first: nothing folds until window 0 is there
        f.deposit(1, w1);
        f.fold_ready(&mut next, &mut s);
        assert_eq!((next, peak(&s)), (0, (0, 0)));
        f.deposit(0, w0);
        f.fold_ready(&mut next, &mut s);
        assert_eq!((next, peak(&s)), (2, (4, 10)));
        assert_eq!(f.waiting(), 0);
        // the logs go back as spares, with their capacity
        let mut log = f.spare();
        assert!(log.capacity() >= LOG_CAP);
        log.push(alloc(9, 1));
        f.give_back([&mut log, &mut Vec::new()]);
        assert_eq!(f.spares.len(), 1);
        assert!(f.spares[0].is_empty() && f.spares[0].capacity() >= LOG_CAP);
    }
}
