//! Statistics: PyTorch's `DeviceStats` as C structs, read and reset.

use super::*;

/// One statistic (PyTorch's `c10::CachingAllocator::Stat`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachalotStat {
    /// Current value.
    pub current: i64,
    /// Peak since the last peak reset.
    pub peak: i64,
    /// Sum of increases since the last accumulated reset.
    pub allocated: i64,
    /// Sum of decreases since the last accumulated reset.
    pub freed: i64,
}

/// The statistics of one device, field for field PyTorch's `DeviceStats`
/// (each array: `[all, small_pool, large_pool]`). `cachalot_device_stats_t`
/// in `include/cachalot.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachalotDeviceStats {
    /// Blocks handed out.
    pub allocation: [CachalotStat; 3],
    /// Device segments.
    pub segment: [CachalotStat; 3],
    /// Active blocks.
    pub active: [CachalotStat; 3],
    /// Inactive split blocks.
    pub inactive_split: [CachalotStat; 3],
    /// Bytes handed out.
    pub allocated_bytes: [CachalotStat; 3],
    /// Bytes of segments.
    pub reserved_bytes: [CachalotStat; 3],
    /// Bytes of active blocks.
    pub active_bytes: [CachalotStat; 3],
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: [CachalotStat; 3],
    /// Requested (unrounded) bytes of active blocks.
    pub requested_bytes: [CachalotStat; 3],
    /// Allocations of at least `max_split_size`.
    pub oversize_allocations: CachalotStat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: CachalotStat,
    /// Release-everything-and-retry attempts.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors.
    pub num_ooms: i64,
    /// Synchronizations of all outstanding events.
    pub num_sync_all_streams: i64,
    /// Device allocation calls.
    pub num_device_alloc: i64,
    /// Device free calls.
    pub num_device_free: i64,
    /// `max_split_size` (−1 = unlimited).
    pub max_split_size: i64,
}

fn stat(s: &Stat) -> CachalotStat {
    CachalotStat {
        current: s.current,
        peak: s.peak,
        allocated: s.allocated,
        freed: s.freed,
    }
}

fn arr(a: &StatArray) -> [CachalotStat; 3] {
    [stat(&a.0[0]), stat(&a.0[1]), stat(&a.0[2])]
}

impl From<&DeviceStats> for CachalotDeviceStats {
    fn from(s: &DeviceStats) -> Self {
        Self {
            allocation: arr(&s.allocation),
            segment: arr(&s.segment),
            active: arr(&s.active),
            inactive_split: arr(&s.inactive_split),
            allocated_bytes: arr(&s.allocated_bytes),
            reserved_bytes: arr(&s.reserved_bytes),
            active_bytes: arr(&s.active_bytes),
            inactive_split_bytes: arr(&s.inactive_split_bytes),
            requested_bytes: arr(&s.requested_bytes),
            oversize_allocations: stat(&s.oversize_allocations),
            oversize_segments: stat(&s.oversize_segments),
            num_alloc_retries: s.num_alloc_retries,
            num_ooms: s.num_ooms,
            num_sync_all_streams: s.num_sync_all_streams,
            num_device_alloc: s.num_device_alloc,
            num_device_free: s.num_device_free,
            max_split_size: s.max_split_size,
        }
    }
}

/// Writes the statistics of `device` to `*out`; `out_size` is
/// `sizeof(cachalot_device_stats_t)` as the caller compiled it (a mismatch
/// is [`crate::CACHALOT_ERR_INVALID_ARGUMENT`]: header and library differ).
/// A device without an allocator yet reads as all zeros (`max_split_size`
/// −1).
///
/// # Safety
/// `out` is NULL (an error) or valid for a write of `out_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_get_stats(
    device: c_int,
    out: *mut CachalotDeviceStats,
    out_size: usize,
) -> c_int {
    status("cachalot_get_stats", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let want = std::mem::size_of::<CachalotDeviceStats>();
        if out_size != want {
            return Err(Failure::invalid(format!(
                "stats struct size {out_size} != {want}: header and library differ"
            )));
        }
        let s = match existing_alloc(device)? {
            Some(d) => d.stats(),
            None => DeviceStats::default(),
        };
        // SAFETY: non-NULL, and the caller guarantees `out_size` (checked
        // equal to the struct's size) writable bytes.
        unsafe { out.write(CachalotDeviceStats::from(&s)) };
        Ok(())
    })
}

/// Cumulative counters of `device` (-1: of every device) := 0
/// (`torch.cuda.reset_accumulated_memory_stats`).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_reset_accumulated_stats(device: c_int) -> c_int {
    status("cachalot_reset_accumulated_stats", || {
        let devs = if device == -1 {
            existing_allocs()?
        } else {
            existing_alloc(device)?.into_iter().collect()
        };
        for d in devs {
            d.reset_accumulated_memory_stats();
        }
        Ok(())
    })
}
