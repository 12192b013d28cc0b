//! The statistics model of PyTorch's caching allocator (`DeviceStats`), with
//! PyTorch's exact flat key names and reset semantics.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

/// One statistic: current value, peak, and cumulative increases and decreases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Current value.
    pub current: i64,
    /// Highest value since the last peak reset.
    pub peak: i64,
    /// Sum of all increases since the last accumulated reset.
    pub allocated: i64,
    /// Sum of all decreases since the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    /// Adds `n` (PyTorch's `increase_stat`).
    #[inline]
    pub fn increase(&mut self, n: i64) {
        self.current += n;
        if self.current > self.peak {
            self.peak = self.current;
        }
        self.allocated += n;
    }

    /// Subtracts `n` (PyTorch's `decrease_stat`).
    #[inline]
    pub fn decrease(&mut self, n: i64) {
        self.current -= n;
        debug_assert!(self.current >= 0, "stat went negative");
        self.freed += n;
    }

    /// Applies a signed delta.
    #[inline]
    pub fn update(&mut self, delta: i64) {
        if delta >= 0 {
            self.increase(delta)
        } else {
            self.decrease(-delta)
        }
    }

    /// `allocated = freed = 0`.
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }

    /// `peak = current`.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn flatten_into(&self, prefix: &str, out: &mut BTreeMap<String, i64>) {
        out.insert(format!("{prefix}.current"), self.current);
        out.insert(format!("{prefix}.peak"), self.peak);
        out.insert(format!("{prefix}.allocated"), self.allocated);
        out.insert(format!("{prefix}.freed"), self.freed);
    }
}

/// Which pool kind a stat update is charged to (besides "all").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StatType {
    /// Every block ("all").
    Aggregate = 0,
    /// Blocks of small pools ("small_pool").
    SmallPool = 1,
    /// Blocks of large pools ("large_pool").
    LargePool = 2,
}

impl StatType {
    /// The pool kind of a pool: small or large.
    #[inline]
    pub fn of_pool(is_small: bool) -> Self {
        if is_small {
            StatType::SmallPool
        } else {
            StatType::LargePool
        }
    }
}

/// Three stats: "all", "small_pool", "large_pool".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// Adds `n` to "all" and to the given pool kind.
    #[inline]
    pub fn increase(&mut self, pool: StatType, n: i64) {
        self.0[0].increase(n);
        self.0[pool as usize].increase(n);
    }

    /// Subtracts `n` from "all" and from the given pool kind.
    #[inline]
    pub fn decrease(&mut self, pool: StatType, n: i64) {
        self.0[0].decrease(n);
        self.0[pool as usize].decrease(n);
    }

    /// Applies `delta` to "all" and to the given pool kind.
    #[inline]
    pub fn update(&mut self, pool: StatType, delta: i64) {
        self.0[0].update(delta);
        self.0[pool as usize].update(delta);
    }
    /// The "all" stat.
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }
    /// The "small_pool" stat.
    pub fn small(&self) -> &Stat {
        &self.0[1]
    }
    /// The "large_pool" stat.
    pub fn large(&self) -> &Stat {
        &self.0[2]
    }
    fn for_each(&mut self, f: impl Fn(&mut Stat)) {
        self.0.iter_mut().for_each(f)
    }
    fn flatten_into(&self, name: &str, out: &mut BTreeMap<String, i64>) {
        for (i, pool) in ["all", "small_pool", "large_pool"].iter().enumerate() {
            self.0[i].flatten_into(&format!("{name}.{pool}"), out);
        }
    }
}

/// All statistics of one device (PyTorch's `DeviceStats`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceStats {
    /// Blocks handed out and not yet freed by the caller.
    pub allocation: StatArray,
    /// Device segments.
    pub segment: StatArray,
    /// Blocks allocated or waiting for their events / stream uses.
    pub active: StatArray,
    /// Free blocks inside segments that also hold other blocks.
    pub inactive_split: StatArray,
    /// Bytes of handed-out blocks.
    pub allocated_bytes: StatArray,
    /// Bytes of device segments.
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: StatArray,
    /// Unrounded requested bytes of active blocks.
    pub requested_bytes: StatArray,
    /// Handed-out blocks of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
    /// Final release-everything-and-retry attempts.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors returned.
    pub num_ooms: i64,
    /// Synchronizations of all outstanding events.
    pub num_sync_all_streams: i64,
    /// Device allocation calls.
    pub num_device_alloc: i64,
    /// Device free calls.
    pub num_device_free: i64,
    /// `max_split_size` at construction, −1 when unlimited.
    pub max_split_size: i64,
}

impl Default for DeviceStats {
    fn default() -> Self {
        Self {
            allocation: StatArray::default(),
            segment: StatArray::default(),
            active: StatArray::default(),
            inactive_split: StatArray::default(),
            allocated_bytes: StatArray::default(),
            reserved_bytes: StatArray::default(),
            active_bytes: StatArray::default(),
            inactive_split_bytes: StatArray::default(),
            requested_bytes: StatArray::default(),
            oversize_allocations: Stat::default(),
            oversize_segments: Stat::default(),
            num_alloc_retries: 0,
            num_ooms: 0,
            num_sync_all_streams: 0,
            num_device_alloc: 0,
            num_device_free: 0,
            max_split_size: -1,
        }
    }
}

/// Number of keys in [`DeviceStats::to_flat`], as `torch.cuda.memory_stats()`.
pub const NUM_FLAT_KEYS: usize = 122;

impl DeviceStats {
    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// `reset_peak_memory_stats`: every peak := current. Counters untouched.
    pub fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `reset_accumulated_memory_stats`: allocated/freed := 0 everywhere and
    /// the five event counters := 0 (`max_split_size` unchanged), as PyTorch 2.11.
    pub fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// The flat, sorted key → value map of `torch.cuda.memory_stats()`
    /// (122 keys, e.g. `reserved_bytes.all.current`).
    pub fn to_flat(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        let arrays: [(&str, &StatArray); 9] = [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ];
        for (name, a) in arrays {
            a.flatten_into(name, &mut out);
        }
        self.oversize_allocations
            .flatten_into("oversize_allocations", &mut out);
        self.oversize_segments
            .flatten_into("oversize_segments", &mut out);
        out.insert("num_alloc_retries".into(), self.num_alloc_retries);
        out.insert("num_ooms".into(), self.num_ooms);
        out.insert("max_split_size".into(), self.max_split_size);
        out.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        out.insert("num_device_alloc".into(), self.num_device_alloc);
        out.insert("num_device_free".into(), self.num_device_free);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_has_122_sorted_keys() {
        let s = DeviceStats::default();
        let flat = s.to_flat();
        assert_eq!(flat.len(), NUM_FLAT_KEYS);
        assert_eq!(flat["max_split_size"], -1);
        assert!(flat.contains_key("reserved_bytes.large_pool.peak"));
        assert!(flat.contains_key("oversize_segments.freed"));
        assert!(flat.contains_key("allocation.all.current"));
        let keys: Vec<_> = flat.keys().cloned().collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn reset_semantics() {
        let mut s = DeviceStats::default();
        s.allocated_bytes.update(StatType::LargePool, 100);
        s.allocated_bytes.update(StatType::LargePool, -40);
        s.num_device_alloc = 3;
        s.num_ooms = 1;
        s.reset_peak();
        assert_eq!(s.allocated_bytes.all().peak, 60);
        assert_eq!(s.allocated_bytes.all().allocated, 100);
        s.reset_accumulated();
        assert_eq!(s.allocated_bytes.large().allocated, 0);
        assert_eq!(s.allocated_bytes.large().freed, 0);
        assert_eq!(s.allocated_bytes.large().current, 60);
        assert_eq!(s.num_device_alloc, 0);
        assert_eq!(s.num_ooms, 0);
        assert_eq!(s.max_split_size, -1);
    }
}
