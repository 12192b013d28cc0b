//! # cachalot-core
//!
//! The device-agnostic heart of cachalot: the [`Backend`] trait every
//! accelerator implements, typed [errors](Error), the [stats model](stats)
//! with PyTorch's exact flat keys, the [allocator config](config) string, and
//! the caching engine [`CachingAllocator`] (size rounding, small and large
//! pools, best fit, split and coalesce, per-stream reuse, `record_stream`
//! with events, OOM flush-and-retry, `empty_cache`).
//!
//! The core knows no vendor: backends live in their own crates and depend on
//! this one.
#![forbid(unsafe_code)]

pub mod backend;
/// The stat logs' time stamp (`cachalot-clock`): its source can be chosen
/// before the first stamp ([`clock::prefer`]), as `cachalot threads
/// --clock` does.
pub use cachalot_clock as clock;
pub mod config;
pub mod error;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
pub mod rng;
pub mod stats;

pub use backend::{
    Backend, CaptureInfo, CaptureQuery, CaptureStatus, DependencyUpdate, DeviceIndex,
    DevicePointer, GraphCapture, IPC_HANDLE_BYTES, IpcMemory, MemoryInfo, NoCapture,
    NoVirtualMemory, NodeOf, VirtualMemory,
};
pub use config::{AllocatorConfig, CaptureReuse};
pub use error::{
    BackendError, CaptureError, ConfigError, ConfigErrorKind, DeviceAllocError, Error, OomReport,
    Result,
};
pub use stats::{DeviceStats, Stat, StatArray, StatType};

pub mod engine;
pub use engine::{
    CachingAllocator, PathCounts, PoolFilter, PoolId, SegmentEvent, SegmentSource, SegmentTracker,
    graph_pool_handle,
};
pub mod replay;
