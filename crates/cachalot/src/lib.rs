//! # cachalot
//!
//! A caching device-memory allocator with the semantics of PyTorch's
//! `CUDACachingAllocator`, for every accelerator. This is the crate users
//! depend on; pick backends with cargo features (`cuda`, `hip`,
//! `level-zero`; the simulated `mock` device is always compiled in):
//!
//! ```toml
//! cachalot = { version = "0.1", features = ["cuda"] }
//! ```
//!
//! The backend is chosen at run time ([`BackendKind::detect`]): the
//! `CACHALOT_BACKEND` environment variable (`mock`, `cuda`, `hip`,
//! `level-zero`), else the first compiled-in real backend with a device,
//! else the mock. [`init`] chooses it explicitly.
//!
//! * One global allocator per device, created on first use
//!   ([`allocator`]); [`accelerator`] has `torch.accelerator`'s memory API
//!   (an uninitialized device reads as an empty map / 0).
//! * [`DeviceBuffer`]: a safe RAII allocation (pointer, size, device,
//!   stream) freed on drop, with [`DeviceBuffer::record_stream`];
//!   [`raw_alloc`] / [`raw_free`] for FFI users.
//! * Out-of-memory errors carry an [`OomReport`] (PyTorch's message fields
//!   plus the largest free block per pool, cached bytes per stream, and
//!   whether emptying the cache would make the request fit); observers
//!   registered with [`add_oom_observer`] run before the error returns.
//! * Memory history and snapshots exported in PyTorch's `_snapshot()` pickle
//!   format ([`export`]), so `python -m torch.cuda._memory_viz` opens them,
//!   and as JSON.
//! * [`memory_summary`]: the table `torch.cuda.memory_summary()` prints.
//!
//! ```
//! use cachalot::{accelerator, BackendKind, DeviceBuffer};
//!
//! cachalot::init(BackendKind::Mock).unwrap();
//! let side = cachalot::new_stream(None).unwrap();
//! let a = DeviceBuffer::new(3 << 20).unwrap();
//! a.record_stream(side).unwrap();
//! assert_eq!(accelerator::memory_allocated(None).unwrap(), 3 << 20);
//! drop(a);
//! println!("{}", cachalot::memory_summary(None).unwrap());
//! ```
#![forbid(unsafe_code)]

pub mod accelerator;
mod backend;
mod buffer;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
pub mod export;
mod global;
pub mod pickle;
pub mod summary;

use std::path::Path;

pub use backend::{
    BACKEND_ENV, BackendKind, H200_TOTAL_MEMORY, MAX_MOCK_DEVICES, MAX_MOCK_MEMORY,
    MOCK_DEVICES_ENV, MOCK_MEMORY_ENV, MockSettings,
};
pub use buffer::DeviceBuffer;
pub use device::{DeviceAllocator, MAX_BENCH_THREADS, MAX_REPLAY_STREAMS, Stream};
pub use global::{
    add_oom_observer, allocator, backend_kind, init, initialized_allocators, try_allocator,
};

/// The device-agnostic core (engine, backend trait, stats model).
pub use cachalot_core as core;
pub use cachalot_core::engine::{
    BlockSnapshot, BlockState, HistoryConfig, ObserverId, SegmentSnapshot, Snapshot, TraceAction,
    TraceEntry,
};
pub use cachalot_core::replay::{
    ParseErrorKind, ReplayError, ReplayReport, Trace, TraceError, TraceLimits,
};
pub use cachalot_core::{
    AllocatorConfig, ConfigError, DeviceIndex, DeviceStats, Error, MemoryInfo, OomReport, Result,
};
/// The HIP backend.
#[cfg(feature = "hip")]
pub use cachalot_hip as hip;
/// The Level Zero backend.
#[cfg(feature = "level-zero")]
pub use cachalot_level_zero as level_zero;
/// The simulated device backend.
pub use cachalot_mock as mock;

/// The default stream of `device` (`None` = the current device).
pub fn default_stream(device: Option<DeviceIndex>) -> Stream {
    Stream::default_for(device.unwrap_or_else(accelerator::current_device))
}

/// Creates a new stream on `device` (`None` = the current device),
/// initializing its global allocator; the stream lives as long as the process.
pub fn new_stream(device: Option<DeviceIndex>) -> Result<Stream> {
    allocator(device)?.new_stream()
}

/// Allocates `size` bytes for use on `stream` from the global allocator of
/// the stream's device; returns the raw address (0 for 0 bytes). Free it with
/// [`raw_free`]. PyTorch's `caching_allocator_alloc`.
pub fn raw_alloc(size: u64, stream: Stream) -> Result<u64> {
    allocator(Some(stream.device()))?.raw_alloc(size, stream)
}

/// Frees an address from [`raw_alloc`] on `device` (`None` = the current
/// device). PyTorch's `caching_allocator_delete`.
pub fn raw_free(ptr: u64, device: Option<DeviceIndex>) -> Result<()> {
    if ptr == 0 {
        return Ok(());
    }
    match try_allocator(device)? {
        Some(a) => a.raw_free(ptr),
        None => Err(Error::UnknownPointer(ptr)),
    }
}

/// Marks the allocation at `ptr` on `stream`'s device as used on `stream`.
pub fn record_stream(ptr: u64, stream: Stream) -> Result<()> {
    match try_allocator(Some(stream.device()))? {
        Some(a) => a.record_stream(ptr, stream),
        None => Err(Error::UnknownPointer(ptr)),
    }
}

/// `torch.cuda.memory_summary(device)`: the statistics table.
pub fn memory_summary(device: Option<DeviceIndex>) -> Result<String> {
    accelerator::memory_summary(device, false)
}

/// Turns the memory history of `device` on (`Some`) or off (`None`),
/// initializing its allocator (PyTorch's `_record_memory_history`).
pub fn record_memory_history(
    device: Option<DeviceIndex>,
    config: Option<HistoryConfig>,
) -> Result<()> {
    allocator(device)?.record_memory_history(config);
    Ok(())
}

/// Snapshots of every initialized global allocator (PyTorch's `_snapshot()`).
pub fn memory_snapshot() -> Vec<Snapshot> {
    initialized_allocators()
        .iter()
        .map(|a| a.snapshot())
        .collect()
}

/// Writes [`memory_snapshot`] to `path` (PyTorch's `_dump_snapshot`): a
/// pickle when the name ends in `.pickle` or `.pkl`, else JSON.
pub fn dump_snapshot(path: impl AsRef<Path>) -> std::io::Result<()> {
    export::write_snapshot(path, &memory_snapshot())
}
