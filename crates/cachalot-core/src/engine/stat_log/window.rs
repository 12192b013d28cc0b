//! Running sums of stat transitions and their highest values ([`Window`]):
//! a replay's sums, folded into the stats once, and the solo shard's and
//! the shared mirror's copies of the stats.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use super::{Apply, Entry};
use crate::engine::accounting::{Arr, StatSink};
use crate::engine::sync::AtomicI64;
use crate::stats::{DeviceStats, StatType};

/// One number of a [`Window`], read and written through a shared
/// reference: a [`Cell`] (plain memory) for the windows of one thread at a
/// time (a solo shard's mirror, the device's replays), an atomic read and
/// written with relaxed loads and stores, never a read-modify-write (plain
/// moves on x86-64 and ARM), for the shared mirror
/// ([`SharedMirror`](crate::engine::shard::SharedMirror)), which the
/// thread that owns it writes without a lock. Each of the owner's writes
/// is ordered before any other thread's read by a shard lock (the writer
/// holds one; the reader, the device, holds them all).
pub(crate) trait Num: Default {
    /// The value.
    fn get(&self) -> i64;
    /// Sets the value.
    fn set(&self, v: i64);
}

impl Num for Cell<i64> {
    #[inline(always)]
    fn get(&self) -> i64 {
        Cell::get(self)
    }
    #[inline(always)]
    fn set(&self, v: i64) {
        Cell::set(self, v)
    }
}

impl Num for AtomicI64 {
    #[inline(always)]
    fn get(&self) -> i64 {
        self.load(Ordering::Relaxed)
    }
    #[inline(always)]
    fn set(&self, v: i64) {
        self.store(v, Ordering::Relaxed)
    }
}

/// One kind of change of one pool kind over a replay: its running sum from
/// the replay's start, the sum's highest value (from 0, the empty prefix)
/// and the sum of its increases (that of its decreases is `pos - cur`).
#[derive(Debug, Default)]
struct Run<N> {
    cur: N,
    max: N,
    pos: N,
}

/// One kind of change over a replay: a [`Run`] per pool kind `[small,
/// large]`, and the highest value of their sum (the "all" stat's running
/// sum, whose other figures are the pools' sums).
#[derive(Debug, Default)]
struct KindRun<N> {
    pool: [Run<N>; 2],
    all_max: N,
}

impl<N: Num> KindRun<N> {
    #[inline(always)]
    fn inc(&self, p: usize, n: i64) {
        let r = &self.pool[p];
        let cur = r.cur.get() + n;
        r.cur.set(cur);
        r.pos.set(r.pos.get() + n);
        if cur > r.max.get() {
            r.max.set(cur);
        }
        let all = self.pool[0].cur.get() + self.pool[1].cur.get();
        if all > self.all_max.get() {
            self.all_max.set(all);
        }
    }
    #[inline(always)]
    fn dec(&self, p: usize, n: i64) {
        let r = &self.pool[p].cur;
        r.set(r.get() - n);
    }
    #[inline(always)]
    fn upd(&self, p: usize, d: i64) {
        if d > 0 {
            self.inc(p, d)
        } else {
            self.dec(p, -d)
        }
    }
}

/// The changes of a replay by kind: 0 `count`, 1 `bytes`, 2 `requested`,
/// 3 `split_count`, 4 `split_bytes`; and `oversize` (one stat, no pool
/// kinds). Every stat's value during the replay is its value before plus
/// its kind's running sum, so its peak is the higher of its peak before and
/// its value before plus the sum's highest value: the same peak, current
/// and cumulative counts as applying each entry's transitions in turn.
#[derive(Debug, Default)]
pub(crate) struct Window<N = Cell<i64>> {
    kinds: [KindRun<N>; 5],
    oversize: Run<N>,
}

/// The kind of change a transition of `arr` is written to in a
/// [`Window`] ([`ARR_KIND`]); `None` for `active` and `active_bytes`,
/// which follow the same kinds as `allocation` and `allocated_bytes`.
#[inline(always)]
fn written_kind(arr: Arr) -> Option<usize> {
    match arr {
        Arr::Active | Arr::ActiveBytes => None,
        a => ARR_KIND.iter().find(|(x, _)| *x == a).map(|&(_, k)| k),
    }
}

/// The [`Arr`] arrays and the kind of change each follows.
pub(super) const ARR_KIND: [(Arr, usize); 7] = [
    (Arr::Allocation, 0),
    (Arr::Active, 0),
    (Arr::AllocatedBytes, 1),
    (Arr::ActiveBytes, 1),
    (Arr::RequestedBytes, 2),
    (Arr::InactiveSplit, 3),
    (Arr::InactiveSplitBytes, 4),
];

impl<N: Num> Apply for Window<N> {
    /// The next entry in replay order.
    #[inline(always)]
    fn add(&mut self, e: &Entry) {
        debug_assert!(e.pool == 1 || e.pool == 2);
        let p = (e.pool != 1) as usize;
        let k = &self.kinds;
        if e.count > 0 {
            // a hit: the count, bytes and request rise
            debug_assert!(e.bytes >= 0 && e.requested >= 0);
            k[0].inc(p, 1);
            k[1].inc(p, e.bytes);
            k[2].inc(p, e.requested);
        } else {
            // a free: they fall
            debug_assert!(e.count == -1 && e.bytes <= 0 && e.requested <= 0);
            k[0].dec(p, 1);
            k[1].dec(p, -e.bytes);
            k[2].dec(p, -e.requested);
        }
        k[3].upd(p, e.split_count as i64);
        k[4].upd(p, e.split_bytes);
        if e.oversize != 0 {
            self.oversize_by(e.oversize as i64);
        }
    }
}

/// A window written through a shared reference: the solo shard's copy of
/// the stats (`Shard::mirror`), and the shared mirror's, written by the
/// thread that owns it (`shard::SharedMirror`); check-in folds each into
/// the device's stats. `active` and `active_bytes` move with `allocation`
/// and `allocated_bytes` on the fast path (the window keeps one sum for
/// each pair), so their transitions are not written twice.
impl<N: Num> StatSink for &Window<N> {
    #[inline(always)]
    fn inc(&mut self, arr: Arr, st: StatType, n: i64) {
        if let Some(k) = written_kind(arr) {
            self.kinds[k].inc((st != StatType::SmallPool) as usize, n);
        }
    }
    #[inline(always)]
    fn dec(&mut self, arr: Arr, st: StatType, n: i64) {
        if let Some(k) = written_kind(arr) {
            self.kinds[k].dec((st != StatType::SmallPool) as usize, n);
        }
    }
    #[inline(always)]
    fn oversize(&mut self, d: i64) {
        self.oversize_by(d)
    }
}

impl<N: Num> Window<N> {
    /// [`StatSink::oversize`].
    #[inline(always)]
    fn oversize_by(&self, d: i64) {
        let r = &self.oversize;
        let cur = r.cur.get() + d;
        r.cur.set(cur);
        r.pos.set(r.pos.get() + d.max(0));
        r.max.set(r.max.get().max(cur));
    }

    /// Folds the window into `stats` and empties it (through a shared
    /// reference: the shared mirror's is folded so, by the device).
    pub(crate) fn take_into(&self, stats: &mut DeviceStats) {
        self.fold(stats);
        let runs = self
            .kinds
            .iter()
            .flat_map(|k| &k.pool)
            .chain([&self.oversize]);
        for r in runs {
            for n in [&r.cur, &r.max, &r.pos] {
                n.set(0);
            }
        }
        for k in &self.kinds {
            k.all_max.set(0);
        }
    }

    /// Writes the replay's changes to `stats`.
    pub(super) fn fold(&self, stats: &mut DeviceStats) {
        fn fold_one(s: &mut crate::stats::Stat, cur: i64, max: i64, pos: i64) {
            s.peak = s.peak.max(s.current + max);
            s.current += cur;
            s.allocated += pos;
            s.freed += pos - cur;
        }
        for (arr, kind) in ARR_KIND {
            let k = &self.kinds[kind];
            let [all, small, large] = &mut stats.array_mut(arr).0;
            for (s, r) in [small, large].into_iter().zip(&k.pool) {
                fold_one(s, r.cur.get(), r.max.get(), r.pos.get());
            }
            let (a, b) = (&k.pool[0], &k.pool[1]);
            fold_one(
                all,
                a.cur.get() + b.cur.get(),
                k.all_max.get(),
                a.pos.get() + b.pos.get(),
            );
        }
        let o = &self.oversize;
        fold_one(
            &mut stats.oversize_allocations,
            o.cur.get(),
            o.max.get(),
            o.pos.get(),
        );
    }
}
