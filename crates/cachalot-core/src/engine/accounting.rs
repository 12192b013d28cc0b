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

    /// Pages of an expandable segment mapped: `segment` is unchanged;
    /// `calls` when the driver was called (one device allocation), not
    /// when every page was a ghost mapping taken back.
    #[inline]
    pub(crate) fn on_map(&mut self, st: StatType, bytes: u64, calls: bool) {
        self.reserved_bytes.update(st, bytes as i64);
        self.num_device_alloc += i64::from(calls);
    }

    /// Pages of an expandable segment unmapped: `calls` when the driver
    /// was called (one device free), not when every run stayed mapped as a
    /// ghost.
    #[inline]
    pub(crate) fn on_unmap(&mut self, st: StatType, bytes: u64, calls: bool) {
        self.reserved_bytes.update(st, -(bytes as i64));
        self.num_device_free += i64::from(calls);
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
/// logs (`stat_log/`). Each transition is written once, here.
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

impl DeviceStats {
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
