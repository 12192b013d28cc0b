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

    /// A block of `size` bytes (for a request of `requested`) was handed out.
    #[inline(always)]
    pub(crate) fn on_alloc(&mut self, st: StatType, size: u64, requested: u64, oversize: bool) {
        self.allocation.increase(st, 1);
        self.allocated_bytes.increase(st, size as i64);
        self.active.increase(st, 1);
        self.active_bytes.increase(st, size as i64);
        self.requested_bytes.increase(st, requested as i64);
        if oversize {
            self.oversize_allocations.increase(1);
        }
    }

    /// The caller freed a block: no longer allocated (still active until its
    /// uses on other streams are over).
    #[inline(always)]
    pub(crate) fn on_free_requested(&mut self, st: StatType, size: u64, oversize: bool) {
        self.allocation.decrease(st, 1);
        self.allocated_bytes.decrease(st, size as i64);
        if oversize {
            self.oversize_allocations.decrease(1);
        }
    }

    /// A freed block became inactive (back in its pool).
    #[inline(always)]
    pub(crate) fn on_inactive(&mut self, st: StatType, size: u64, requested: u64) {
        self.active.decrease(st, 1);
        self.active_bytes.decrease(st, size as i64);
        self.requested_bytes.decrease(st, requested as i64);
    }

    /// Inactive split blocks changed by `count` blocks and `bytes` bytes.
    #[inline(always)]
    pub(crate) fn on_inactive_split(&mut self, st: StatType, count: i64, bytes: i64) {
        if count != 0 {
            self.inactive_split.update(st, count);
        }
        if bytes != 0 {
            self.inactive_split_bytes.update(st, bytes);
        }
    }

    /// A whole segment was split for a request: its remainder of `rem`
    /// bytes is a new inactive split block.
    #[inline(always)]
    pub(crate) fn on_split_segment(&mut self, st: StatType, rem: u64) {
        self.inactive_split_bytes.update(st, rem as i64);
        self.inactive_split.update(st, 1);
    }

    /// An inactive split block was split for a request of `taken` bytes:
    /// the remainder stays an inactive split block.
    #[inline(always)]
    pub(crate) fn on_split_split(&mut self, st: StatType, taken: u64) {
        self.inactive_split_bytes.update(st, -(taken as i64));
    }

    /// An inactive split block of `size` bytes was handed out whole.
    #[inline(always)]
    pub(crate) fn on_take_split(&mut self, st: StatType, size: u64) {
        self.inactive_split_bytes.update(st, -(size as i64));
        self.inactive_split.update(st, -1);
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
