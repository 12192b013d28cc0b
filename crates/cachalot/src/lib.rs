//! # cachalot
//!
//! A caching device-memory allocator with the semantics of PyTorch's
//! `CUDACachingAllocator`, for every accelerator. This is the crate users
//! depend on; pick backends with cargo features. The crates are not on
//! crates.io: depend on the repository (cargo finds the `cachalot` package
//! in its workspace):
//!
//! ```toml
//! [dependencies]
//! cachalot = { git = "https://github.com/cachalot-rs/cachalot", features = ["cuda"] }
//! ```
//!
//! | feature | backend | default | adds to the build |
//! |---|---|---|---|
//! | `mock` | the simulated device (`cachalot-mock`) | yes | nothing: the mock is always compiled in, the feature only names it |
//! | `cuda` | CUDA driver API (`cachalot-cuda`) | no | `cudarc`, loading `libcuda` at run time (builds without CUDA installed) |
//! | `hip` | HIP (`cachalot-hip`) | no | loads `libamdhip64.so` at run time |
//! | `level-zero` | Level Zero (`cachalot-level-zero`) | no | loads `libze_loader.so.1` at run time |
//!
//! The backend is chosen at run time ([`BackendKind::detect`]): the
//! `CACHALOT_BACKEND` environment variable (`mock`, `cuda`, `hip`,
//! `level-zero`), else the first compiled-in real backend with a device,
//! else the mock. [`init`] chooses it explicitly.
//!
//! * One global allocator per device, created on first use
//!   ([`allocator`]); [`accelerator`] has `torch.accelerator`'s memory API
//!   and [`memory`] `torch.cuda.memory`'s (an uninitialized device reads as
//!   an empty map / 0).
//! * [`DeviceBuffer`]: a safe RAII allocation (pointer, size, device,
//!   stream) freed on drop, with [`DeviceBuffer::record_stream`];
//!   [`raw_alloc`] / [`raw_free`] for FFI users.
//! * Out-of-memory errors carry an [`OomReport`] (PyTorch's message fields
//!   plus the largest free block per pool, cached bytes per stream, and
//!   whether emptying the cache would make the request fit); observers
//!   registered with [`add_oom_observer`] run before the error returns.
//! * Memory history and snapshots exported in PyTorch's `_snapshot()` pickle
//!   format ([`memory::dump_snapshot`], [`export`]), so
//!   `python -m torch.cuda._memory_viz` opens them, and as JSON.
//! * [`memory_summary`]: the table `torch.cuda.memory_summary()` prints.
//!
//! ## PyTorch's names
//!
//! | PyTorch | cachalot |
//! |---|---|
//! | `torch.cuda.memory_stats(device)` | [`memory::memory_stats`] (= [`accelerator::memory_stats`]) |
//! | `torch.cuda.memory_stats_as_nested_dict(device)` | [`memory_stats_as_nested_dict`] |
//! | `torch.cuda.memory_allocated` / `max_memory_allocated` / `memory_reserved` / `max_memory_reserved` | [`memory::memory_allocated`], ... (= `accelerator::*`) |
//! | `torch.cuda.reset_peak_memory_stats` / `reset_accumulated_memory_stats` | [`memory::reset_peak_memory_stats`], [`memory::reset_accumulated_memory_stats`] |
//! | `torch.cuda.empty_cache()` | [`memory::empty_cache`] |
//! | `torch.cuda.mem_get_info(device)` | [`mem_get_info`] |
//! | `torch.accelerator.get_memory_info(device)` | [`accelerator::get_memory_info`] (the same function) |
//! | `torch.cuda.set_per_process_memory_fraction(fraction, device)` | [`set_per_process_memory_fraction`]; on one allocator [`DeviceAllocator::set_per_process_memory_fraction`] |
//! | `torch.cuda.get_per_process_memory_fraction(device)` | [`get_per_process_memory_fraction`] |
//! | `torch.cuda.memory_summary(device, abbreviated)` | [`memory_summary`] |
//! | `torch.cuda.memory._record_memory_history(...)` | [`memory::record_memory_history`]`(config, device)` |
//! | `torch.cuda.memory._snapshot()` | [`memory::snapshot`] (the dict: [`export::snapshot_value`]) |
//! | `torch.cuda.memory._dump_snapshot(filename)` | [`memory::dump_snapshot`] |
//! | `torch.cuda.caching_allocator_alloc` / `caching_allocator_delete` | [`raw_alloc`], [`raw_free`] |
//! | `Tensor.record_stream(stream)` | [`DeviceBuffer::record_stream`], [`record_stream`] |
//!
//! The names before these (`record_memory_history(device, config)`,
//! `memory_snapshot()`, `dump_snapshot(path)` at the crate root,
//! `DeviceAllocator::set_memory_fraction`) remain for one release as
//! deprecated aliases. [`memory_summary`] has one signature everywhere,
//! PyTorch's `(device, abbreviated)`.
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
//! println!("{}", cachalot::memory_summary(None, false).unwrap());
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
pub mod memory;
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
    add_oom_observer, allocator, backend_kind, init, initialized_allocators, select, try_allocator,
};

/// The device-agnostic core (engine, backend trait, stats model).
pub use cachalot_core as core;
pub use cachalot_core::engine::{
    ActionSet, Annotation, BlockSnapshot, BlockState, HistoryConfig, HistoryContext, ObserverId,
    RecordContext, SegmentSnapshot, Snapshot, TraceAction, TraceEntry,
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

pub use memory::{
    NestedStat, get_per_process_memory_fraction, mem_get_info, memory_stats_as_nested_dict,
    memory_summary, set_per_process_memory_fraction,
};

/// The old name of [`memory::record_memory_history`] (device first).
#[deprecated(
    since = "0.1.0",
    note = "use `cachalot::memory::record_memory_history(config, device)` (torch.cuda.memory._record_memory_history)"
)]
pub fn record_memory_history(
    device: Option<DeviceIndex>,
    config: Option<HistoryConfig>,
) -> Result<()> {
    memory::record_memory_history(config, device)
}

/// The old name of [`memory::snapshot`].
#[deprecated(
    since = "0.1.0",
    note = "use `cachalot::memory::snapshot()` (torch.cuda.memory._snapshot)"
)]
pub fn memory_snapshot() -> Vec<Snapshot> {
    memory::snapshot()
}

/// The old name of [`memory::dump_snapshot`].
#[deprecated(
    since = "0.1.0",
    note = "use `cachalot::memory::dump_snapshot(path)` (torch.cuda.memory._dump_snapshot)"
)]
pub fn dump_snapshot(path: impl AsRef<Path>) -> std::io::Result<()> {
    memory::dump_snapshot(path)
}
