//! Named stat transitions: every change the engine makes to
//! [`DeviceStats`] goes through one of these, so each counter's meaning
//! is written once (the invariant checker recomputes them from the blocks).
#![forbid(unsafe_code)]

use crate::stats::{DeviceStats, StatType};

impl DeviceStats {
    /// A segment of `size` bytes came from the device.
    #[inline(always)]
    pub(crate) fn on_segment_alloc(&mut self, st: StatType, size: u64, oversize: bool) {
        self.segment.update(st, 1);
        self.reserved_bytes.update(st, size as i64);
        if oversize {
            self.oversize_segments.increase(1);
        }
        self.num_device_alloc += 1;
    }

    /// A segment of `size` bytes went back to the device.
    #[inline(always)]
    pub(crate) fn on_segment_free(&mut self, st: StatType, size: u64, oversize: bool) {
        self.segment.update(st, -1);
        self.reserved_bytes.update(st, -(size as i64));
        if oversize {
            self.oversize_segments.decrease(1);
        }
        self.num_device_free += 1;
    }

    /// Two inactive split blocks of different streams merged into one block
    /// of `merged` bytes, itself split (`still_split`) or a whole segment.
    #[inline(always)]
    pub(crate) fn on_merge_split(&mut self, st: StatType, merged: u64, still_split: bool) {
        self.inactive_split.update(st, -2);
        self.inactive_split_bytes.update(st, -(merged as i64));
        if still_split {
            self.inactive_split.update(st, 1);
            self.inactive_split_bytes.update(st, merged as i64);
        }
    }

    /// Pages of an expandable segment mapped (one map call): `segment` is
    /// unchanged.
    #[inline]
    pub(crate) fn on_map(&mut self, st: StatType, bytes: u64) {
        self.reserved_bytes.update(st, bytes as i64);
        self.num_device_alloc += 1;
    }

    /// Pages of an expandable segment unmapped (one unmap call).
    #[inline]
    pub(crate) fn on_unmap(&mut self, st: StatType, bytes: u64) {
        self.reserved_bytes.update(st, -(bytes as i64));
        self.num_device_free += 1;
    }
}

/// The stats a cache hit and a simple free change (PyTorch's
/// `StatType`-indexed arrays among [`DeviceStats`]' fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arr {
    Allocation = 0,
    Active = 1,
    AllocatedBytes = 2,
    ActiveBytes = 3,
    RequestedBytes = 4,
    InactiveSplit = 5,
    InactiveSplitBytes = 6,
}

/// Where the transitions of a hit and a free are written: the device's
/// [`DeviceStats`], by the engine and by the replay of the shards' stat
/// logs (`stat_log.rs`). Each transition is written once, here.
pub(crate) trait StatSink {
    /// Adds `n ≥ 0` to "all" and to `st` of `arr`.
    fn inc(&mut self, arr: Arr, st: StatType, n: i64);
    /// Subtracts `n ≥ 0` from "all" and from `st` of `arr`.
    fn dec(&mut self, arr: Arr, st: StatType, n: i64);
    /// `oversize_allocations` += `d` (±1).
    fn oversize(&mut self, d: i64);
    /// Applies a signed delta.
    #[inline(always)]
    fn upd(&mut self, arr: Arr, st: StatType, delta: i64) {
        if delta >= 0 {
            self.inc(arr, st, delta)
        } else {
            self.dec(arr, st, -delta)
        }
    }

    /// A block of `size` bytes (for a request of `requested`) was handed out.
    #[inline(always)]
    fn on_alloc(&mut self, st: StatType, size: u64, requested: u64, oversize: bool) {
        self.inc(Arr::Allocation, st, 1);
        self.inc(Arr::AllocatedBytes, st, size as i64);
        self.inc(Arr::Active, st, 1);
        self.inc(Arr::ActiveBytes, st, size as i64);
        self.inc(Arr::RequestedBytes, st, requested as i64);
        if oversize {
            self.oversize(1);
        }
    }

    /// The caller freed a block: no longer allocated (still active until its
    /// uses on other streams are over).
    #[inline(always)]
    fn on_free_requested(&mut self, st: StatType, size: u64, oversize: bool) {
        self.dec(Arr::Allocation, st, 1);
        self.dec(Arr::AllocatedBytes, st, size as i64);
        if oversize {
            self.oversize(-1);
        }
    }

    /// A freed block became inactive (back in its pool).
    #[inline(always)]
    fn on_inactive(&mut self, st: StatType, size: u64, requested: u64) {
        self.dec(Arr::Active, st, 1);
        self.dec(Arr::ActiveBytes, st, size as i64);
        self.dec(Arr::RequestedBytes, st, requested as i64);
    }

    /// Inactive split blocks changed by `count` blocks and `bytes` bytes.
    #[inline(always)]
    fn on_inactive_split(&mut self, st: StatType, count: i64, bytes: i64) {
        if count != 0 {
            self.upd(Arr::InactiveSplit, st, count);
        }
        if bytes != 0 {
            self.upd(Arr::InactiveSplitBytes, st, bytes);
        }
    }

    /// A whole segment was split for a request: its remainder of `rem`
    /// bytes is a new inactive split block.
    #[inline(always)]
    fn on_split_segment(&mut self, st: StatType, rem: u64) {
        self.upd(Arr::InactiveSplitBytes, st, rem as i64);
        self.upd(Arr::InactiveSplit, st, 1);
    }

    /// An inactive split block was split for a request of `taken` bytes:
    /// the remainder stays an inactive split block.
    #[inline(always)]
    fn on_split_split(&mut self, st: StatType, taken: u64) {
        self.upd(Arr::InactiveSplitBytes, st, -(taken as i64));
    }

    /// An inactive split block of `size` bytes was handed out whole.
    #[inline(always)]
    fn on_take_split(&mut self, st: StatType, size: u64) {
        self.upd(Arr::InactiveSplitBytes, st, -(size as i64));
        self.upd(Arr::InactiveSplit, st, -1);
    }
}

/// The [`Arr`] arrays, in index order.
pub(crate) const ARRS: [Arr; 7] = [
    Arr::Allocation,
    Arr::Active,
    Arr::AllocatedBytes,
    Arr::ActiveBytes,
    Arr::RequestedBytes,
    Arr::InactiveSplit,
    Arr::InactiveSplitBytes,
];

/// One pool kind's stat of a [`FastArr`]: `freed` is not kept but derived
/// (`base + allocated - current`: an increase adds to `allocated` and
/// `current` alike, a decrease takes from `current` what it adds to
/// `freed`, so `freed - allocated + current` never changes between
/// resets, which happen on the device).
#[derive(Clone, Copy, Debug, Default)]
struct PoolStat {
    current: i64,
    peak: i64,
    allocated: i64,
    base: i64,
}

/// A [`crate::stats::StatArray`] as the fast path changes it cheaply: the
/// two pool kinds in full (less `freed`, derived), and of "all" only the
/// peak, since its current and cumulative values are the pools' sums (plus
/// the offsets they had when loaded). A decrease then writes one word, an
/// increase four.
#[derive(Clone, Copy, Debug, Default)]
struct FastArr {
    /// `[small, large]`.
    pool: [PoolStat; 2],
    all_peak: i64,
    all_current_off: i64,
    all_allocated_off: i64,
    all_base: i64,
}

/// The stats a hit and a free change (the [`Arr`] arrays and
/// `oversize_allocations`), held by the shard that is the only one out
/// (`Shard::mirror`) in the form it changes cheaply; loaded from and stored
/// back to [`DeviceStats`] exactly.
#[derive(Clone, Debug, Default)]
pub(crate) struct FastStats {
    arr: [FastArr; 7],
    oversize: crate::stats::Stat,
}

/// The index of pool kind `st` in [`FastArr::pool`] (the fast path never
/// names "all").
#[inline(always)]
fn pool_index(st: StatType) -> usize {
    debug_assert!(st != StatType::Aggregate);
    match st {
        StatType::SmallPool => 0,
        _ => 1,
    }
}

impl FastStats {
    /// The fast stats of `from`.
    pub(crate) fn load(&mut self, from: &DeviceStats) {
        for (a, arr) in self.arr.iter_mut().zip(ARRS) {
            let s = &from.array(arr).0;
            for (p, st) in a.pool.iter_mut().zip(&s[1..]) {
                *p = PoolStat {
                    current: st.current,
                    peak: st.peak,
                    allocated: st.allocated,
                    base: st.freed - st.allocated + st.current,
                };
            }
            let all = &s[0];
            a.all_peak = all.peak;
            a.all_current_off = all.current - s[1].current - s[2].current;
            a.all_allocated_off = all.allocated - s[1].allocated - s[2].allocated;
            a.all_base = all.freed - all.allocated + all.current;
        }
        self.oversize = from.oversize_allocations;
    }

    /// Writes the fast stats back to `to` (the inverse of [`Self::load`]).
    pub(crate) fn store(&self, to: &mut DeviceStats) {
        for (a, arr) in self.arr.iter().zip(ARRS) {
            let s = &mut to.array_mut(arr).0;
            for (p, st) in a.pool.iter().zip(&mut s[1..]) {
                st.current = p.current;
                st.peak = p.peak;
                st.allocated = p.allocated;
                st.freed = p.base + p.allocated - p.current;
            }
            let current = a.pool[0].current + a.pool[1].current + a.all_current_off;
            let allocated = a.pool[0].allocated + a.pool[1].allocated + a.all_allocated_off;
            s[0] = crate::stats::Stat {
                current,
                peak: a.all_peak,
                allocated,
                freed: a.all_base + allocated - current,
            };
        }
        to.oversize_allocations = self.oversize;
    }
}

impl StatSink for FastStats {
    #[inline(always)]
    fn inc(&mut self, arr: Arr, st: StatType, n: i64) {
        let a = &mut self.arr[arr as usize];
        let p = &mut a.pool[pool_index(st)];
        p.current += n;
        p.allocated += n;
        if p.current > p.peak {
            p.peak = p.current;
        }
        let all = a.pool[0].current + a.pool[1].current + a.all_current_off;
        if all > a.all_peak {
            a.all_peak = all;
        }
    }
    #[inline(always)]
    fn dec(&mut self, arr: Arr, st: StatType, n: i64) {
        let p = &mut self.arr[arr as usize].pool[pool_index(st)];
        p.current -= n;
        debug_assert!(p.current >= 0, "stat went negative");
    }
    #[inline(always)]
    fn oversize(&mut self, d: i64) {
        self.oversize.update(d)
    }
}

impl DeviceStats {
    /// The stat array `arr` names.
    #[inline(always)]
    fn array(&self, arr: Arr) -> &crate::stats::StatArray {
        match arr {
            Arr::Allocation => &self.allocation,
            Arr::Active => &self.active,
            Arr::AllocatedBytes => &self.allocated_bytes,
            Arr::ActiveBytes => &self.active_bytes,
            Arr::RequestedBytes => &self.requested_bytes,
            Arr::InactiveSplit => &self.inactive_split,
            Arr::InactiveSplitBytes => &self.inactive_split_bytes,
        }
    }

    /// The stat array `arr` names.
    #[inline(always)]
    pub(crate) fn array_mut(&mut self, arr: Arr) -> &mut crate::stats::StatArray {
        match arr {
            Arr::Allocation => &mut self.allocation,
            Arr::Active => &mut self.active,
            Arr::AllocatedBytes => &mut self.allocated_bytes,
            Arr::ActiveBytes => &mut self.active_bytes,
            Arr::RequestedBytes => &mut self.requested_bytes,
            Arr::InactiveSplit => &mut self.inactive_split,
            Arr::InactiveSplitBytes => &mut self.inactive_split_bytes,
        }
    }
}

impl StatSink for DeviceStats {
    #[inline(always)]
    fn inc(&mut self, arr: Arr, st: StatType, n: i64) {
        self.array_mut(arr).increase(st, n);
    }
    #[inline(always)]
    fn dec(&mut self, arr: Arr, st: StatType, n: i64) {
        self.array_mut(arr).decrease(st, n);
    }
    #[inline(always)]
    fn oversize(&mut self, d: i64) {
        if d >= 0 {
            self.oversize_allocations.increase(d)
        } else {
            self.oversize_allocations.decrease(-d)
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A xorshift generator from `seed` (deterministic test inputs).
    pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut rng = seed;
        move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        }
    }

    /// A random walk of fast transitions written to the device's stats and,
    /// from any starting state, to a [`FastStats`] loaded from them: the
    /// stored result is the same in every field.
    #[test]
    fn fast_stats_change_exactly_as_the_device_stats() {
        let mut next = xorshift(0x1234_5678_9abc_def1);
        let mut dev = DeviceStats::default();
        // some history first, resets included, so the offsets are not zero
        for arr in ARRS {
            dev.inc(arr, StatType::LargePool, 40);
            dev.dec(arr, StatType::LargePool, 15);
            dev.inc(arr, StatType::SmallPool, 7);
        }
        dev.reset_accumulated();
        dev.inc(Arr::Active, StatType::SmallPool, 3);
        dev.reset_peak();
        for round in 0..50 {
            let mut fast = FastStats::default();
            fast.load(&dev);
            let check = fast.clone();
            let mut copy = DeviceStats::default();
            check.store(&mut copy);
            assert_eq!(copy, dev, "load then store is the identity");
            for _ in 0..200 {
                let arr = ARRS[(next() % 7) as usize];
                let st = if next().is_multiple_of(2) {
                    StatType::SmallPool
                } else {
                    StatType::LargePool
                };
                let cur = dev.array(arr).0[st as usize].current;
                let n = (next() % 100) as i64;
                match next() % 3 {
                    0 if cur >= n => {
                        dev.dec(arr, st, n);
                        fast.dec(arr, st, n);
                    }
                    1 => {
                        let d = if next().is_multiple_of(2) { 1 } else { -1 };
                        if d > 0 || dev.oversize_allocations.current > 0 {
                            dev.oversize(d);
                            fast.oversize(d);
                        }
                    }
                    _ => {
                        dev.inc(arr, st, n);
                        fast.inc(arr, st, n);
                    }
                }
            }
            let mut got = dev.clone();
            // start from other values: store overwrites every fast field
            for arr in ARRS {
                *got.array_mut(arr) = Default::default();
            }
            got.oversize_allocations = Default::default();
            fast.store(&mut got);
            assert_eq!(got, dev, "round {round}");
            if round % 10 == 9 {
                dev.reset_peak();
            }
        }
    }
}
