//! # cachalot-level-zero
//!
//! The oneAPI Level Zero (Intel GPU) backend of cachalot:
//! [`LevelZeroBackend`] implements [`cachalot_core::Backend`] over
//! `zeMemAllocDevice`/`zeMemFree`, immediate command lists as streams, event
//! pools and events, the device memory properties and, where the loader and
//! driver have it, virtual memory ([`ZeVirtualMemory`] over
//! `zeVirtualMemReserve`, `zePhysicalMemCreate`, `zeVirtualMemMap`,
//! `zeVirtualMemSetAccessAttribute` and their inverses).
//!
//! Level Zero has no stream capture: [`Backend::capture`] is `None` ([`cachalot_core::NoCapture`]),
//! so the engine rejects capture calls with
//! [`cachalot_core::CaptureError::Unsupported`].
//!
//! Layers, as in cudarc: `cachalot-level-zero-sys` holds the run-time loaded
//! table of function pointers; [`result`] wraps each call into a `Result`;
//! this crate's root holds the safe RAII types.
//!
//! Opening calls `zeInit` first and, if it fails, no other `ze*` function
//! (calling into the loader after a failed `zeInit` is a known crash). Without
//! the loader or without a GPU driver, [`LevelZeroBackend::new`] returns an
//! [`OpenError`] whose [`OpenError::is_unavailable`] is true.
//!
//! Two documented differences from CUDA semantics: Level Zero cannot report
//! free device memory through its core API, so [`Backend::memory_info`]
//! reports the total minus what this backend has allocated (segments and
//! physical memory); and `zeMemFree` does not wait for pending work, so
//! [`Backend::free`] first synchronizes every stream of the backend (as
//! `cudaFree` implicitly does), and so does [`VirtualMemory::unmap`] before
//! `zeVirtualMemUnmap`.

pub mod result;
mod vmm;

pub use vmm::{ZePhysical, ZeVirtualMemory};

use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cachalot_core::{
    Backend, BackendError, DeviceAllocError, DeviceIndex, MemoryInfo, NoCapture, VirtualMemory,
};
pub use cachalot_level_zero_sys as sys;
use cachalot_level_zero_sys::{LoadError, ZeApi};

use crate::result::ZeError;

const NAME: &str = "level-zero";
/// Events per event pool.
const POOL_SIZE: u32 = 64;
/// The allocation size whose page size ([`VirtualMemory::granularity`]) is
/// asked for: 2 MiB, at and above which drivers use their large pages.
const PAGE_QUERY_SIZE: usize = 2 << 20;

/// Why a [`LevelZeroBackend`] could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// The Level Zero loader is absent or incomplete.
    Library(LoadError),
    /// `zeInit` failed (no driver) or no GPU device was found.
    NoDevice {
        /// The failing call's `ze_result_t` (0 when there were simply no devices).
        code: u32,
        /// Human-readable reason.
        reason: String,
    },
    /// The requested device index is out of range.
    InvalidDevice {
        /// Index asked for.
        index: DeviceIndex,
        /// Devices present.
        count: u32,
    },
    /// Any other driver failure while opening.
    Driver(BackendError),
}

impl OpenError {
    /// Whether Level Zero is simply not available here (no loader, no driver
    /// or no device): the condition under which device tests skip.
    ///
    /// A loader that opens but lacks a required symbol
    /// ([`LoadError::MissingSymbol`]) is a broken installation, not an
    /// absent one: not unavailable.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            OpenError::Library(LoadError::LibraryNotFound { .. }) | OpenError::NoDevice { .. }
        )
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Library(e) => write!(f, "level-zero: {e}"),
            OpenError::NoDevice { reason, .. } => write!(f, "level-zero: no device: {reason}"),
            OpenError::InvalidDevice { index, count } => {
                write!(
                    f,
                    "level-zero: device {index} out of range ({count} present)"
                )
            }
            OpenError::Driver(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Library(e) => Some(e),
            OpenError::Driver(e) => Some(e),
            _ => None,
        }
    }
}

impl From<LoadError> for OpenError {
    fn from(e: LoadError) -> Self {
        OpenError::Library(e)
    }
}

impl From<ZeError> for OpenError {
    fn from(e: ZeError) -> Self {
        OpenError::Driver(backend_error(e))
    }
}

impl From<OpenError> for cachalot_core::Error {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Driver(b) => cachalot_core::Error::Backend(b),
            OpenError::InvalidDevice { .. } => cachalot_core::Error::InvalidArgument(e.to_string()),
            other => cachalot_core::Error::NoDevice(other.to_string()),
        }
    }
}

fn backend_error(e: ZeError) -> BackendError {
    BackendError::new(NAME, e.call, i64::from(e.code), result::result_name(e.code)).with_source(e)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn raw(h: u64) -> *mut c_void {
    h as usize as *mut c_void
}

fn handle(p: *mut c_void) -> u64 {
    p as usize as u64
}

/// A Level Zero context, destroyed when the last owner drops it.
#[derive(Debug)]
struct Context {
    api: Arc<ZeApi>,
    raw: u64,
    device: u64,
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object created in the context holds an Arc to it, so
        // none is left when the last one drops.
        let _ = unsafe { result::context_destroy(&self.api, raw(self.raw)) };
    }
}

/// Event pools of the backend and their free slots.
#[derive(Debug)]
struct EventPools {
    ctx: Arc<Context>,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    pools: Vec<u64>,
    free: Vec<(u32, u32)>,
}

impl EventPools {
    fn take_slot(&self) -> Result<(u32, u32, u64), ZeError> {
        let mut st = lock(&self.state);
        if st.free.is_empty() {
            // SAFETY: the context and device are alive for as long as `self`.
            let pool = unsafe {
                result::event_pool_create(
                    &self.ctx.api,
                    raw(self.ctx.raw),
                    raw(self.ctx.device),
                    POOL_SIZE,
                )
            }?;
            let idx = st.pools.len() as u32;
            st.pools.push(handle(pool));
            st.free.extend((0..POOL_SIZE).rev().map(|i| (idx, i)));
        }
        let (p, i) = st.free.pop().unwrap_or_default();
        Ok((p, i, st.pools[p as usize]))
    }

    fn put_slot(&self, slot: (u32, u32)) {
        lock(&self.state).free.push(slot);
    }
}

impl Drop for EventPools {
    fn drop(&mut self) {
        for &pool in &lock(&self.state).pools {
            // SAFETY: every event holds an Arc to the pools, so none is left.
            let _ = unsafe { result::event_pool_destroy(&self.ctx.api, raw(pool)) };
        }
    }
}

/// An owned Level Zero event from the backend's event pools (host-visible),
/// destroyed on drop or with [`Backend::destroy_event`].
#[derive(Debug)]
pub struct ZeEvent {
    pools: Arc<EventPools>,
    raw: u64,
    slot: (u32, u32),
}

impl ZeEvent {
    fn as_raw(&self) -> *mut c_void {
        raw(self.raw)
    }

    fn destroy(mut self) -> Result<(), BackendError> {
        let ev = std::mem::take(&mut self.raw);
        // SAFETY: `self` owned the event; `raw` is now 0 so Drop skips the destroy.
        let r = unsafe { result::event_destroy(&self.pools.ctx.api, raw(ev)) };
        self.pools.put_slot(self.slot);
        r.map_err(backend_error)
    }
}

impl Drop for ZeEvent {
    fn drop(&mut self) {
        if self.raw != 0 {
            // SAFETY: the event is owned by `self` and never used again.
            let _ = unsafe { result::event_destroy(&self.pools.ctx.api, self.as_raw()) };
            self.pools.put_slot(self.slot);
        }
    }
}

/// A stream handle: an immediate command list of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ZeStream(u64);

impl ZeStream {
    /// The raw `ze_command_list_handle_t`.
    pub fn as_raw(self) -> *mut c_void {
        raw(self.0)
    }
}

/// Live immediate command lists of a backend (for device-wide synchronization).
type Registry = Arc<Mutex<Vec<u64>>>;

/// An immediate command list created by [`LevelZeroBackend::create_stream`],
/// destroyed on drop.
#[derive(Debug)]
pub struct OwnedStream {
    ctx: Arc<Context>,
    registry: Registry,
    handle: ZeStream,
}

impl OwnedStream {
    /// The copyable handle to pass to the allocator.
    pub fn handle(&self) -> ZeStream {
        self.handle
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        lock(&self.registry).retain(|&h| h != self.handle.0);
        // SAFETY: the list is owned by `self` and never used again.
        let _ = unsafe { result::list_destroy(&self.ctx.api, self.handle.as_raw()) };
    }
}

/// One Level Zero GPU driven through a run-time loaded `libze_loader`.
#[derive(Debug)]
pub struct LevelZeroBackend {
    ctx: Arc<Context>,
    index: DeviceIndex,
    ordinal: u32,
    total: u64,
    allocated: Arc<AtomicU64>,
    registry: Registry,
    pools: Arc<EventPools>,
    default: OwnedStream,
    vmm: Option<ZeVirtualMemory>,
}

impl LevelZeroBackend {
    /// Opens GPU `device`, loading the loader from [`sys::LIBRARY_NAMES`]
    /// (or [`sys::LIBRARY_ENV`]).
    pub fn new(device: DeviceIndex) -> Result<Self, OpenError> {
        Self::with_api(ZeApi::load()?, device)
    }

    /// Opens GPU `device`, loading the loader from the first of `names`.
    pub fn open(names: &[&str], device: DeviceIndex) -> Result<Self, OpenError> {
        Self::with_api(ZeApi::load_from(names)?, device)
    }

    /// Opens GPU `device` over an already loaded (or faked) table.
    pub fn with_api(api: Arc<ZeApi>, device: DeviceIndex) -> Result<Self, OpenError> {
        let all = Self::gpus(&api)?;
        let count = u32::try_from(all.len()).unwrap_or(u32::MAX);
        let Some(&(driver, dev)) = all.get(device as usize) else {
            return Err(OpenError::InvalidDevice {
                index: device,
                count,
            });
        };
        // SAFETY: `driver` and `dev` come from zeDriverGet/zeDeviceGet.
        let ordinal = unsafe { result::queue_group_flags(&api, dev) }?
            .iter()
            .position(|f| f & sys::ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE != 0)
            .unwrap_or(0) as u32;
        // SAFETY: as above.
        let total = unsafe { result::memory_sizes(&api, dev) }?.iter().sum();
        // SAFETY: as above.
        let ctx = unsafe { result::context_create(&api, driver) }?;
        let ctx = Arc::new(Context {
            api,
            raw: handle(ctx),
            device: handle(dev),
        });
        let registry: Registry = Arc::default();
        let default = Self::new_stream(&ctx, &registry, ordinal).map_err(OpenError::Driver)?;
        let pools = Arc::new(EventPools {
            ctx: ctx.clone(),
            state: Mutex::default(),
        });
        let allocated = Arc::new(AtomicU64::new(0));
        let vmm = ZeVirtualMemory::probe(&pools, &registry, &allocated, device);
        Ok(Self {
            pools,
            ctx,
            index: device,
            ordinal,
            total,
            allocated,
            registry,
            default,
            vmm,
        })
    }

    /// Number of Level Zero GPUs, or why there are none.
    pub fn device_count() -> Result<u32, OpenError> {
        let api = ZeApi::load()?;
        Ok(u32::try_from(Self::gpus(&api)?.len()).unwrap_or(u32::MAX))
    }

    /// Every GPU of every driver, as `(driver, device)`.
    fn gpus(api: &ZeApi) -> Result<Vec<(*mut c_void, *mut c_void)>, OpenError> {
        // If zeInit fails, no other ze* function may be called.
        result::init(api, sys::ZE_INIT_FLAG_GPU_ONLY).map_err(|e| OpenError::NoDevice {
            code: e.code,
            reason: e.to_string(),
        })?;
        let mut all = Vec::new();
        for driver in result::drivers(api)? {
            // SAFETY: `driver` comes from zeDriverGet.
            for dev in unsafe { result::devices(api, driver) }? {
                all.push((driver, dev));
            }
        }
        if all.is_empty() {
            return Err(OpenError::NoDevice {
                code: 0,
                reason: "no Level Zero GPU device".to_owned(),
            });
        }
        Ok(all)
    }

    fn new_stream(
        ctx: &Arc<Context>,
        registry: &Registry,
        ordinal: u32,
    ) -> Result<OwnedStream, BackendError> {
        // SAFETY: the context and device are alive (held by `ctx`).
        let list = unsafe {
            result::immediate_list_create(&ctx.api, raw(ctx.raw), raw(ctx.device), ordinal)
        }
        .map_err(backend_error)?;
        lock(registry).push(handle(list));
        Ok(OwnedStream {
            ctx: ctx.clone(),
            registry: registry.clone(),
            handle: ZeStream(handle(list)),
        })
    }

    /// Creates a stream: an immediate command list on the compute queue group.
    pub fn create_stream(&self) -> Result<OwnedStream, BackendError> {
        Self::new_stream(&self.ctx, &self.registry, self.ordinal)
    }

    /// The loaded (or faked) function table.
    pub fn api(&self) -> &Arc<ZeApi> {
        &self.ctx.api
    }

    fn new_event(&self) -> Result<ZeEvent, BackendError> {
        new_event(&self.pools)
    }
}

fn new_event(pools: &Arc<EventPools>) -> Result<ZeEvent, BackendError> {
    let (p, i, pool) = pools.take_slot().map_err(backend_error)?;
    // SAFETY: `pool` is live and slot `i` is free.
    match unsafe { result::event_create(&pools.ctx.api, raw(pool), i) } {
        Ok(ev) => Ok(ZeEvent {
            pools: pools.clone(),
            raw: handle(ev),
            slot: (p, i),
        }),
        Err(e) => {
            pools.put_slot((p, i));
            Err(backend_error(e))
        }
    }
}

/// Blocks until all work appended so far to every list of `registry` has
/// completed: a barrier signalling one event, waited for, per list.
fn synchronize_lists(pools: &Arc<EventPools>, registry: &Registry) -> Result<(), BackendError> {
    let api = &pools.ctx.api;
    let lists = lock(registry).clone();
    let ev = new_event(pools)?;
    for list in lists {
        // SAFETY: the event is owned and live, and complete (fresh or waited
        // for below) so a host reset is safe; `list` is a live list of the
        // registry.
        unsafe {
            result::event_host_reset(api, ev.as_raw())
                .and_then(|()| result::append_barrier(api, raw(list), ev.as_raw()))
                .and_then(|()| result::event_host_synchronize(api, ev.as_raw()))
        }
        .map_err(backend_error)?;
    }
    ev.destroy()
}

impl Backend for LevelZeroBackend {
    type Stream = ZeStream;
    type Event = ZeEvent;
    type Ptr = u64;
    type Capture = NoCapture;
    type VirtualMemory = ZeVirtualMemory;

    fn name(&self) -> &'static str {
        NAME
    }

    fn device(&self) -> DeviceIndex {
        self.index
    }

    fn default_stream(&self) -> ZeStream {
        self.default.handle
    }

    fn malloc(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let size_usize = usize::try_from(size).map_err(|_| DeviceAllocError::OutOfMemory)?;
        // SAFETY: the context and device are alive (held by `self.ctx`).
        match unsafe {
            result::mem_alloc_device(
                &self.ctx.api,
                raw(self.ctx.raw),
                raw(self.ctx.device),
                size_usize,
            )
        } {
            Ok(p) => {
                self.allocated.fetch_add(size, Ordering::Relaxed);
                Ok(handle(p))
            }
            Err(e) if e.code == sys::ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY => {
                Err(DeviceAllocError::OutOfMemory)
            }
            Err(e) => Err(DeviceAllocError::Backend(backend_error(e))),
        }
    }

    fn free(&self, ptr: u64, size: u64) -> Result<(), BackendError> {
        // zeMemFree does not wait for pending work; cudaFree does.
        self.synchronize_device()?;
        // SAFETY: the Backend contract: `ptr` came from `malloc` and is freed
        // once; all streams are synchronized above.
        unsafe { result::mem_free(&self.ctx.api, raw(self.ctx.raw), raw(ptr)) }
            .map_err(backend_error)?;
        self.allocated.fetch_sub(
            size.min(self.allocated.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        Ok(())
    }

    fn memory_info(&self) -> Result<MemoryInfo, BackendError> {
        Ok(MemoryInfo {
            free: self
                .total
                .saturating_sub(self.allocated.load(Ordering::Relaxed)),
            total: self.total,
        })
    }

    fn create_event(&self) -> Result<ZeEvent, BackendError> {
        self.new_event()
    }

    fn destroy_event(&self, event: ZeEvent) -> Result<(), BackendError> {
        event.destroy()
    }

    fn record_event(&self, event: &ZeEvent, stream: ZeStream) -> Result<(), BackendError> {
        // The engine re-records only completed events, so a host reset is safe.
        // SAFETY: the event is owned and live; the stream is a list of this backend.
        unsafe {
            result::event_host_reset(&self.ctx.api, event.as_raw()).and_then(|()| {
                result::append_barrier(&self.ctx.api, stream.as_raw(), event.as_raw())
            })
        }
        .map_err(backend_error)
    }

    fn query_event(&self, event: &ZeEvent) -> Result<bool, BackendError> {
        // SAFETY: the event is owned and live.
        unsafe { result::event_query(&self.ctx.api, event.as_raw()) }.map_err(backend_error)
    }

    fn synchronize_event(&self, event: &ZeEvent) -> Result<(), BackendError> {
        // SAFETY: the event is owned and live.
        unsafe { result::event_host_synchronize(&self.ctx.api, event.as_raw()) }
            .map_err(backend_error)
    }

    fn stream_wait_event(&self, stream: ZeStream, event: &ZeEvent) -> Result<(), BackendError> {
        // SAFETY: the event is owned and live; the stream is a list of this backend.
        unsafe { result::append_wait(&self.ctx.api, stream.as_raw(), event.as_raw()) }
            .map_err(backend_error)
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        synchronize_lists(&self.pools, &self.registry)
    }

    fn virtual_memory(&self) -> Option<&ZeVirtualMemory> {
        self.vmm.as_ref()
    }
}

#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod fake_tests;
#[cfg(test)]
mod vmm_tests;
