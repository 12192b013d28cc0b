//! `torch.accelerator`'s memory API over the global allocators.
//!
//! Every function takes an optional device index (`None` = the current
//! device of the calling thread, see [`set_device`]). As in PyTorch 2.11,
//! reading the statistics of a device whose allocator was never initialized
//! gives an empty map or 0 and initializes nothing, and [`empty_cache`] does
//! not initialize the device. Unlike PyTorch 2.11 (and like the guards of
//! PyTorch #186269) the two resets are no-ops on an uninitialized device
//! instead of initializing it.
//!
//! ```
//! use cachalot::accelerator;
//! cachalot::init(cachalot::BackendKind::Mock).unwrap();
//! assert!(accelerator::memory_stats(None).unwrap().is_empty());
//! let buf = cachalot::DeviceBuffer::new(1 << 20).unwrap();
//! assert_eq!(accelerator::memory_allocated(None).unwrap(), 1 << 20);
//! drop(buf);
//! assert_eq!(accelerator::memory_stats(None).unwrap().len(), 122);
//! ```

use std::collections::BTreeMap;

use cachalot_core::{DeviceIndex, Error};

use crate::global;

/// Number of devices of the backend (0 when it has none).
pub fn device_count() -> Result<u32, Error> {
    global::device_count()
}

/// The calling thread's current device (0 until [`set_device`]).
pub fn current_device() -> DeviceIndex {
    global::current_device()
}

/// Sets the calling thread's current device (an index out of range is an error).
pub fn set_device(device: DeviceIndex) -> Result<(), Error> {
    global::set_current_device(device)
}

/// `torch.accelerator.memory_stats`: PyTorch's 122 flat keys, sorted; empty
/// when the device's allocator is not initialized.
pub fn memory_stats(device: Option<DeviceIndex>) -> Result<BTreeMap<String, i64>, Error> {
    Ok(global::try_allocator(device)?.map_or_else(BTreeMap::new, |a| a.memory_stats()))
}

fn stat(device: Option<DeviceIndex>, key: &str) -> Result<u64, Error> {
    Ok(global::try_allocator(device)?
        .map_or(0, |a| a.memory_stats().get(key).copied().unwrap_or(0))
        .max(0) as u64)
}

/// Bytes currently allocated (`allocated_bytes.all.current`; 0 when uninitialized).
pub fn memory_allocated(device: Option<DeviceIndex>) -> Result<u64, Error> {
    stat(device, "allocated_bytes.all.current")
}

/// Peak bytes allocated (`allocated_bytes.all.peak`; 0 when uninitialized).
pub fn max_memory_allocated(device: Option<DeviceIndex>) -> Result<u64, Error> {
    stat(device, "allocated_bytes.all.peak")
}

/// Bytes currently reserved (`reserved_bytes.all.current`; 0 when uninitialized).
pub fn memory_reserved(device: Option<DeviceIndex>) -> Result<u64, Error> {
    stat(device, "reserved_bytes.all.current")
}

/// Peak bytes reserved (`reserved_bytes.all.peak`; 0 when uninitialized).
pub fn max_memory_reserved(device: Option<DeviceIndex>) -> Result<u64, Error> {
    stat(device, "reserved_bytes.all.peak")
}

/// `torch.accelerator.empty_cache`: releases the unused cached memory of the
/// current device; does nothing (and initializes nothing) when its allocator
/// is not initialized.
pub fn empty_cache() -> Result<(), Error> {
    match global::try_allocator(None)? {
        Some(a) => a.empty_cache(),
        None => Ok(()),
    }
}

/// Peaks := current values (a no-op on an uninitialized device).
pub fn reset_peak_memory_stats(device: Option<DeviceIndex>) -> Result<(), Error> {
    if let Some(a) = global::try_allocator(device)? {
        a.reset_peak_memory_stats();
    }
    Ok(())
}

/// Cumulative counters := 0 (a no-op on an uninitialized device).
pub fn reset_accumulated_memory_stats(device: Option<DeviceIndex>) -> Result<(), Error> {
    if let Some(a) = global::try_allocator(device)? {
        a.reset_accumulated_memory_stats();
    }
    Ok(())
}

/// `torch.accelerator.get_memory_info`: `(free, total)` device bytes as the
/// driver reports them. Opens the device (initializes its allocator).
/// `torch.cuda` calls the same function
/// [`mem_get_info`](crate::memory::mem_get_info).
pub fn get_memory_info(device: Option<DeviceIndex>) -> Result<(u64, u64), Error> {
    crate::memory::mem_get_info(device)
}

/// `torch.cuda.memory_summary` (not in `torch.accelerator`; the one
/// function of [`crate::memory`], re-exported here).
pub use crate::memory::memory_summary;
