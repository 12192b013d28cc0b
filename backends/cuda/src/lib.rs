//! CUDA backend of the cachalot caching device allocator.
//!
//! Layers, as in `cudarc`:
//!
//! 1. `cudarc::driver::sys`: the raw driver API, loaded at run time;
//! 2. a private thin layer (one function per driver call returning a
//!    `Result`), the crate's only `unsafe` code;
//! 3. the safe types of this module: [`CudaBackend`] (implements
//!    [`cachalot_core::Backend`] and [`cachalot_core::VirtualMemory`]),
//!    [`CudaStream`], [`OwnedStream`], [`CudaEvent`], [`CudaPhysical`],
//!    [`CudaNode`], [`CudaGraph`] and [`CudaGraphExec`].
//!
//! Segments are plain `cuMemAlloc` allocations (no events or other
//! bookkeeping per allocation). Loading never panics: when `libcuda` is
//! missing, lacks a symbol, or has no device, [`CudaBackend::new`] returns
//! [`Error::NoDevice`].
//!
//! # Virtual memory
//!
//! [`CudaBackend`] implements [`cachalot_core::VirtualMemory`] with the
//! driver's `cuMem*` calls: `reserve` is `cuMemAddressReserve` (aligned to
//! the granularity), `create_physical` is `cuMemCreate` of pinned memory on the
//! backend's device (no shareable handle type; `CUDA_ERROR_OUT_OF_MEMORY`
//! is `DeviceAllocError::OutOfMemory`), `map` is `cuMemMap` of the whole
//! allocation, `set_access` is `cuMemSetAccess` (read-write from the given
//! device), `unmap`, `release_physical` and `unreserve` are `cuMemUnmap`,
//! `cuMemRelease` and `cuMemAddressFree`. Each runs with the thread's
//! capture mode relaxed, as `malloc` does. [`Backend::virtual_memory`]
//! answers `Some` only when the driver exports these calls and the device
//! reports `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`;
//! otherwise every call fails with a typed error and calls nothing.
//!
//! The granularity is the *minimum* one (`CU_MEM_ALLOC_GRANULARITY_MINIMUM`,
//! 2 MiB on current GPUs), queried once when the backend opens: it is what
//! `cuMemCreate` and `cuMemMap` require of every size and address, so it is
//! the exact contract of [`cachalot_core::VirtualMemory::granularity`]. The
//! recommended granularity is a performance hint (equal to the minimum on
//! current NVIDIA GPUs); the engine picks its page size as a multiple of the
//! granularity anyway (PyTorch maps 2 MiB and 20 MiB pages).
//!
//! As in CUDA, `cuMemUnmap` is not stream-ordered: the caller synchronizes
//! the work that uses a range before unmapping it, and unmaps one mapping
//! per call (the driver documents that `cuMemUnmap` takes "the entire
//! contiguous address range that was mapped"); `cuMemSetAccess` may span
//! several adjacent mappings.
//!
//! # Contexts and threads
//!
//! A backend retains the device's *primary context* and releases it on drop.
//! Every driver call is made with that context current on the calling
//! thread: when the thread has no current context, the primary context is
//! made current and left current; when another context is current, it is
//! restored after the call. The backend may therefore be used from any
//! thread.
//!
//! [`CudaBackend::from_cudarc`] opens the backend on a caller's
//! `cudarc::driver::CudaContext` instead: every call is made in that
//! context (primary or not), which the backend keeps alive and never
//! releases. [`CudaAllocator`] (module [`interop`]) builds the caching
//! allocator on it, with cudarc streams and typed [`Slice`] buffers.
//!
//! # Streams
//!
//! [`CudaStream`] is a copyable handle (like a file descriptor number). The
//! backend's default stream is the *legacy* NULL stream ([`CudaStream::LEGACY`]),
//! which implicitly synchronizes with every blocking stream of the context,
//! as PyTorch's default stream does; [`CudaBackend::with_default_stream`]
//! picks another, e.g. [`CudaStream::PER_THREAD`]. Streams made by
//! [`CudaBackend::create_stream`] are non-blocking. Legacy and per-thread
//! default streams cannot be captured.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use cachalot_core::{
    Backend, BackendError, CaptureStatus, DependencyUpdate, DeviceAllocError, DeviceIndex, Error,
    GraphCapture, MemoryInfo, VirtualMemory,
};
use cudarc::driver::result::DriverError;
use cudarc::driver::sys;

mod capture;
mod context;
mod driver;
pub mod interop;
mod ipc;
mod vmm;

pub use capture::{CaptureMode, CudaGraph, CudaGraphExec, CudaNode, GraphNodeKind};
use context::{Context, with_relaxed_capture};
pub use cudarc;
pub use interop::{CudaAllocator, Slice, StreamUses, View, ViewMut};
pub use vmm::CudaPhysical;
use vmm::usize_of;

/// Backend name reported in errors.
const NAME: &str = "cuda";

/// Smallest driver version (`cuDriverGetVersion`) with the capture calls used
/// here (`cuStreamGetCaptureInfo_v3` and friends): CUDA 12.3.
pub const MIN_CAPTURE_DRIVER_VERSION: i32 = 12030;

/// `CUDA_ERROR_ILLEGAL_STATE`, reported when a capture call is made on a
/// stream that is not capturing.
const CUDA_ERROR_ILLEGAL_STATE: i64 = 401;

/// `CUDA_ERROR_INVALID_VALUE`, reported when `map` is given a size other
/// than the physical allocation's.
const CUDA_ERROR_INVALID_VALUE: i64 = 1;

fn to_backend(call: &'static str) -> impl FnOnce(DriverError) -> BackendError {
    move |e| BackendError::new(NAME, call, e.0 as i64, driver::describe(&e)).with_source(e)
}

fn unsupported_capture(call: &'static str) -> BackendError {
    BackendError::new(
        NAME,
        call,
        0,
        format!(
            "graph capture introspection needs a CUDA driver >= {}.{}",
            MIN_CAPTURE_DRIVER_VERSION / 1000,
            (MIN_CAPTURE_DRIVER_VERSION % 1000) / 10
        ),
    )
}

fn unsupported_vmm(call: &'static str) -> BackendError {
    BackendError::new(
        NAME,
        call,
        0,
        "virtual memory management is not supported by this driver or device",
    )
}

/// The minimum allocation granularity of pinned memory on `dev`, or `None`
/// when the driver lacks the virtual-memory calls or the device does not
/// support them. Needs the device's context current.
fn probe_vmm(dev: sys::CUdevice) -> Option<u64> {
    if !driver::missing_symbols(driver::VMM_SYMBOLS).is_empty() {
        return None;
    }
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    if driver::device_get_attribute(attr, dev).ok()? == 0 {
        return None;
    }
    let prop = driver::device_allocation_prop(dev);
    let min = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    let g = driver::mem_get_allocation_granularity(&prop, min).ok()?;
    u64::try_from(g).ok().filter(|g| g.is_power_of_two())
}

/// Loads the driver library, checks its symbols and runs `cuInit(0)`.
fn open_driver() -> Result<(), Error> {
    if !driver::library_present() {
        return Err(Error::NoDevice(
            "the CUDA driver library (libcuda) could not be loaded".into(),
        ));
    }
    let missing = driver::missing_symbols(driver::CORE_SYMBOLS);
    if !missing.is_empty() {
        return Err(Error::NoDevice(format!(
            "the CUDA driver library lacks {}",
            missing.join(", ")
        )));
    }
    driver::init().map_err(|e| Error::NoDevice(format!("cuInit failed: {}", driver::describe(&e))))
}

/// Whether a CUDA driver and at least one device are usable. Never panics.
pub fn is_available() -> bool {
    matches!(device_count(), Ok(n) if n > 0)
}

/// Number of CUDA devices. Errors with [`Error::NoDevice`] when the driver
/// library is missing or fails to initialize (a machine without a GPU).
pub fn device_count() -> Result<u32, Error> {
    open_driver()?;
    let n = driver::device_count().map_err(to_backend("cuDeviceGetCount"))?;
    Ok(u32::try_from(n).unwrap_or(0))
}

/// The driver's CUDA version (`cuDriverGetVersion`, e.g. 12080 for 12.8).
pub fn driver_version() -> Result<i32, Error> {
    open_driver()?;
    Ok(driver::driver_version().map_err(to_backend("cuDriverGetVersion"))?)
}

/// A CUDA stream handle: a copyable, ordered, hashable newtype over the raw
/// `CUstream` value.
///
/// It does not own the stream; see [`OwnedStream`] for one that does. Using a
/// handle after its stream was destroyed is a driver error or undefined, as
/// with any CUDA handle.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct CudaStream(usize);

impl CudaStream {
    /// The legacy default (NULL) stream; the backend's default.
    pub const LEGACY: CudaStream = CudaStream(0);
    /// The per-thread default stream (`CU_STREAM_PER_THREAD`).
    pub const PER_THREAD: CudaStream = CudaStream(0x2);

    /// The raw `CUstream`.
    pub fn as_raw(self) -> sys::CUstream {
        std::ptr::with_exposed_provenance_mut(self.0)
    }

    /// The handle's numeric value (0 for the legacy stream).
    pub fn addr(self) -> usize {
        self.0
    }

    fn from_raw(raw: sys::CUstream) -> Self {
        CudaStream(raw.expose_provenance())
    }
}

impl fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CudaStream::LEGACY => write!(f, "CudaStream(legacy)"),
            CudaStream::PER_THREAD => write!(f, "CudaStream(per-thread)"),
            CudaStream(a) => write!(f, "CudaStream({a:#x})"),
        }
    }
}

/// An owned CUDA event created without timing. The engine pools these and
/// returns them with [`Backend::destroy_event`]; dropping one without doing
/// so leaks the driver event.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct CudaEvent(usize);

impl CudaEvent {
    /// The raw `CUevent`.
    pub fn as_raw(&self) -> sys::CUevent {
        std::ptr::with_exposed_provenance_mut(self.0)
    }
}

/// One CUDA device driven through the driver API: implements
/// [`cachalot_core::Backend`] plus helpers for tests and tools (copies,
/// memsets, stream creation, delays and graph capture).
///
/// Cloning is cheap and shares the retained primary context.
#[derive(Clone)]
pub struct CudaBackend {
    ctx: Arc<Context>,
    default_stream: CudaStream,
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.ctx.index)
            .field("name", &self.ctx.name)
            .field("driver_version", &self.ctx.driver_version)
            .field("capture", &self.ctx.capture)
            .field("vmm_granularity", &self.ctx.vmm_granularity)
            .field("default_stream", &self.default_stream)
            .finish()
    }
}

impl CudaBackend {
    /// Opens device `device_index`: loads the driver, runs `cuInit(0)` and
    /// retains the device's primary context.
    ///
    /// Errors: [`Error::NoDevice`] without a usable driver or device,
    /// [`Error::InvalidArgument`] when the index is out of range,
    /// [`Error::Backend`] when a driver call fails.
    pub fn new(device_index: DeviceIndex) -> Result<Self, Error> {
        let count = device_count()?;
        if count == 0 {
            return Err(Error::NoDevice("the CUDA driver reports no device".into()));
        }
        if device_index >= count {
            return Err(Error::InvalidArgument(format!(
                "CUDA device index {device_index} out of range (the driver reports {count} device(s))"
            )));
        }
        let ordinal = i32::try_from(device_index)
            .map_err(|_| Error::InvalidArgument(format!("device index {device_index}")))?;
        let dev = driver::device_get(ordinal).map_err(to_backend("cuDeviceGet"))?;
        let name = driver::device_name(dev).unwrap_or_default();
        let version = driver::driver_version().map_err(to_backend("cuDriverGetVersion"))?;
        let capture = version >= MIN_CAPTURE_DRIVER_VERSION
            && driver::missing_symbols(driver::CAPTURE_SYMBOLS).is_empty();
        let raw =
            driver::primary_ctx_retain(dev).map_err(to_backend("cuDevicePrimaryCtxRetain"))?;
        Ok(Self::with_context(Context {
            index: device_index,
            dev,
            ctx: raw.expose_provenance(),
            driver_version: version,
            capture,
            vmm_granularity: None,
            name,
            ipc: ipc::IpcState::default(),
            borrowed: None,
        }))
    }

    /// Opens the device of a caller's `cudarc` context and makes every
    /// driver call in *that* context (primary or not): no second context is
    /// retained or created, and `ctx` is kept alive as long as the backend.
    ///
    /// Errors: [`Error::NoDevice`] when the driver library cannot be loaded
    /// (checked before any call, so this never panics),
    /// [`Error::InvalidArgument`] for a context whose ordinal does not fit
    /// a device index, [`Error::Backend`] when a driver call fails.
    pub fn from_cudarc(ctx: &Arc<cudarc::driver::CudaContext>) -> Result<Self, Error> {
        open_driver()?;
        let index = DeviceIndex::try_from(ctx.ordinal()).map_err(|_| {
            Error::InvalidArgument(format!("CUDA device ordinal {}", ctx.ordinal()))
        })?;
        let dev = ctx.cu_device();
        let raw = ctx.cu_ctx();
        if raw.is_null() {
            return Err(Error::InvalidArgument(
                "the cudarc context has no CUcontext".into(),
            ));
        }
        let name = driver::device_name(dev).unwrap_or_default();
        let version = driver::driver_version().map_err(to_backend("cuDriverGetVersion"))?;
        let capture = version >= MIN_CAPTURE_DRIVER_VERSION
            && driver::missing_symbols(driver::CAPTURE_SYMBOLS).is_empty();
        Ok(Self::with_context(Context {
            index,
            dev,
            ctx: raw.expose_provenance(),
            driver_version: version,
            capture,
            vmm_granularity: None,
            name,
            ipc: ipc::IpcState::default(),
            borrowed: Some(Arc::clone(ctx)),
        }))
    }

    fn with_context(mut ctx: Context) -> Self {
        if let Ok(_b) = ctx.bind("cuMemGetAllocationGranularity") {
            ctx.vmm_granularity = probe_vmm(ctx.dev);
        }
        ctx.ipc.probe();
        Self {
            ctx: Arc::new(ctx),
            default_stream: CudaStream::LEGACY,
        }
    }

    /// The caller's `cudarc` context when the backend was opened with
    /// [`CudaBackend::from_cudarc`].
    pub fn cudarc_context(&self) -> Option<&Arc<cudarc::driver::CudaContext>> {
        self.ctx.borrowed.as_ref()
    }

    /// The same backend with another default stream (e.g.
    /// [`CudaStream::PER_THREAD`]).
    pub fn with_default_stream(mut self, stream: CudaStream) -> Self {
        self.default_stream = stream;
        self
    }

    /// The device's name as the driver reports it.
    pub fn device_name(&self) -> &str {
        &self.ctx.name
    }

    /// The driver's CUDA version (e.g. 12080).
    pub fn driver_version(&self) -> i32 {
        self.ctx.driver_version
    }

    /// The minimum virtual-memory granularity of this device, `None` when
    /// it has no virtual memory ([`Backend::virtual_memory`] is `None`).
    pub fn vmm_granularity(&self) -> Option<u64> {
        self.ctx.vmm_granularity
    }

    /// The raw context this backend makes its calls in (the retained primary
    /// context, or the caller's with [`CudaBackend::from_cudarc`]).
    pub fn raw_context(&self) -> sys::CUcontext {
        self.ctx.raw()
    }

    /// Wraps a caller's existing stream.
    ///
    /// # Safety
    ///
    /// `raw` must be a stream of this device's primary context (or a special
    /// default-stream value), and must stay alive for as long as the returned
    /// handle is used with this backend (also by a caching allocator that
    /// keeps blocks associated with it).
    pub unsafe fn wrap_stream(raw: sys::CUstream) -> CudaStream {
        CudaStream::from_raw(raw)
    }

    /// Creates a new non-blocking stream, destroyed when the returned
    /// [`OwnedStream`] is dropped.
    pub fn create_stream(&self) -> Result<OwnedStream, BackendError> {
        let _b = self.ctx.bind("cuStreamCreate")?;
        let raw = driver::stream_create(sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            .map_err(to_backend("cuStreamCreate"))?;
        Ok(OwnedStream {
            stream: CudaStream::from_raw(raw),
            ctx: Arc::clone(&self.ctx),
        })
    }

    /// Blocks until all work queued on `stream` has completed.
    pub fn stream_synchronize(&self, stream: CudaStream) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuStreamSynchronize")?;
        driver::stream_synchronize(stream.as_raw()).map_err(to_backend("cuStreamSynchronize"))
    }

    /// Queues a memset of `len` bytes at device address `ptr` to `value` on `stream`.
    pub fn memset_d8_async(
        &self,
        ptr: u64,
        value: u8,
        len: u64,
        stream: CudaStream,
    ) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuMemsetD8Async")?;
        let len = usize_of(len, "cuMemsetD8Async")?;
        driver::memset_d8_async(ptr, value, len, stream.as_raw())
            .map_err(to_backend("cuMemsetD8Async"))
    }

    /// Queues a device-to-device copy of `len` bytes on `stream`.
    pub fn memcpy_dtod_async(
        &self,
        dst: u64,
        src: u64,
        len: u64,
        stream: CudaStream,
    ) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuMemcpyDtoDAsync")?;
        let len = usize_of(len, "cuMemcpyDtoDAsync")?;
        driver::memcpy_dtod_async(dst, src, len, stream.as_raw())
            .map_err(to_backend("cuMemcpyDtoDAsync"))
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst`
    /// (synchronous; ordered after the legacy default stream).
    pub fn memcpy_dtoh(&self, dst: &mut [u8], src: u64) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuMemcpyDtoH")?;
        driver::memcpy_dtoh(dst, src).map_err(to_backend("cuMemcpyDtoH"))
    }

    /// Copies `src` to device address `dst` (synchronous for pageable host
    /// memory; ordered after the legacy default stream).
    pub fn memcpy_htod(&self, dst: u64, src: &[u8]) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuMemcpyHtoD")?;
        driver::memcpy_htod(dst, src).map_err(to_backend("cuMemcpyHtoD"))
    }

    /// Makes `stream` slow on purpose: queues a host function that sleeps for
    /// `delay` (rounded down to milliseconds), holding back later work on it.
    pub fn delay_stream(&self, stream: CudaStream, delay: Duration) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuLaunchHostFunc")?;
        let ms = usize::try_from(delay.as_millis()).unwrap_or(usize::MAX);
        driver::launch_sleep(stream.as_raw(), ms).map_err(to_backend("cuLaunchHostFunc"))
    }

    /// Makes future work on `waiter` wait for all work queued so far on
    /// `other` (a fork or join during capture; `waiter.wait_stream(other)`).
    pub fn wait_stream(&self, waiter: CudaStream, other: CudaStream) -> Result<(), BackendError> {
        let event = self.create_event()?;
        let r = self
            .record_event(&event, other)
            .and_then(|()| self.stream_wait_event(waiter, &event));
        let d = self.destroy_event(event);
        r.and(d)
    }

    /// Starts capturing `stream` into a new graph (`cuStreamBeginCapture_v2`).
    pub fn begin_capture(&self, stream: CudaStream, mode: CaptureMode) -> Result<(), BackendError> {
        if !self.ctx.capture {
            return Err(unsupported_capture("cuStreamBeginCapture"));
        }
        let _b = self.ctx.bind("cuStreamBeginCapture")?;
        driver::stream_begin_capture(stream.as_raw(), mode.raw())
            .map_err(to_backend("cuStreamBeginCapture"))
    }

    /// Ends the capture on `stream` and returns the captured graph.
    pub fn end_capture(&self, stream: CudaStream) -> Result<CudaGraph, BackendError> {
        if !self.ctx.capture {
            return Err(unsupported_capture("cuStreamEndCapture"));
        }
        let _b = self.ctx.bind("cuStreamEndCapture")?;
        let g = driver::stream_end_capture(stream.as_raw())
            .map_err(to_backend("cuStreamEndCapture"))?;
        if g.is_null() {
            return Err(BackendError::new(
                NAME,
                "cuStreamEndCapture",
                0,
                "the driver returned no graph",
            ));
        }
        Ok(CudaGraph {
            raw: g.expose_provenance(),
            ctx: Arc::clone(&self.ctx),
        })
    }

    fn raw_capture_info(
        &self,
        stream: CudaStream,
        call: &'static str,
    ) -> Result<driver::RawCaptureInfo, BackendError> {
        if !self.ctx.capture {
            return Err(unsupported_capture(call));
        }
        let _b = self.ctx.bind(call)?;
        driver::stream_get_capture_info(stream.as_raw())
            .map_err(to_backend("cuStreamGetCaptureInfo"))
    }
}

impl Backend for CudaBackend {
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Ptr = u64;
    type Capture = Self;
    type VirtualMemory = Self;

    fn name(&self) -> &'static str {
        NAME
    }

    fn device(&self) -> DeviceIndex {
        self.ctx.index
    }

    fn default_stream(&self) -> CudaStream {
        self.default_stream
    }

    fn malloc(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let Ok(size) = usize::try_from(size) else {
            return Err(DeviceAllocError::OutOfMemory);
        };
        let _b = self.ctx.bind("cuMemAlloc")?;
        match with_relaxed_capture(|| driver::mem_alloc(size))? {
            Ok(p) => Ok(p),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(DeviceAllocError::OutOfMemory)
            }
            Err(e) => Err(to_backend("cuMemAlloc")(e).into()),
        }
    }

    fn free(&self, ptr: u64, _size: u64) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuMemFree")?;
        driver::mem_free(ptr).map_err(to_backend("cuMemFree"))
    }

    fn memory_info(&self) -> Result<MemoryInfo, BackendError> {
        let _b = self.ctx.bind("cuMemGetInfo")?;
        let (free, total) =
            with_relaxed_capture(driver::mem_get_info)?.map_err(to_backend("cuMemGetInfo"))?;
        Ok(MemoryInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn create_event(&self) -> Result<CudaEvent, BackendError> {
        let _b = self.ctx.bind("cuEventCreate")?;
        let e = driver::event_create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            .map_err(to_backend("cuEventCreate"))?;
        Ok(CudaEvent(e.expose_provenance()))
    }

    fn destroy_event(&self, event: CudaEvent) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuEventDestroy")?;
        driver::event_destroy(event.as_raw()).map_err(to_backend("cuEventDestroy"))
    }

    fn record_event(&self, event: &CudaEvent, stream: CudaStream) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuEventRecord")?;
        driver::event_record(event.as_raw(), stream.as_raw()).map_err(to_backend("cuEventRecord"))
    }

    fn query_event(&self, event: &CudaEvent) -> Result<bool, BackendError> {
        let _b = self.ctx.bind("cuEventQuery")?;
        driver::event_query(event.as_raw()).map_err(to_backend("cuEventQuery"))
    }

    fn query_stream(&self, stream: CudaStream) -> Result<Option<bool>, BackendError> {
        let _b = self.ctx.bind("cuStreamQuery")?;
        driver::stream_query(stream.as_raw())
            .map(Some)
            .map_err(to_backend("cuStreamQuery"))
    }

    fn synchronize_event(&self, event: &CudaEvent) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuEventSynchronize")?;
        driver::event_synchronize(event.as_raw()).map_err(to_backend("cuEventSynchronize"))
    }

    fn stream_wait_event(&self, stream: CudaStream, event: &CudaEvent) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuStreamWaitEvent")?;
        driver::stream_wait_event(stream.as_raw(), event.as_raw())
            .map_err(to_backend("cuStreamWaitEvent"))
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuCtxSynchronize")?;
        driver::ctx_synchronize().map_err(to_backend("cuCtxSynchronize"))
    }

    fn capture(&self) -> Option<&Self> {
        self.ctx.capture.then_some(self)
    }

    fn virtual_memory(&self) -> Option<&Self> {
        self.ctx.vmm_granularity.is_some().then_some(self)
    }

    fn ipc(&self) -> Option<&dyn cachalot_core::IpcMemory> {
        self.ctx.ipc.available().then_some(self)
    }
}

/// A stream created by [`CudaBackend::create_stream`]; destroyed on drop.
///
/// Dereferences to its [`CudaStream`] handle. Do not use copies of the
/// handle after the owner is dropped.
pub struct OwnedStream {
    stream: CudaStream,
    ctx: Arc<Context>,
}

impl OwnedStream {
    /// The stream's handle.
    pub fn handle(&self) -> CudaStream {
        self.stream
    }
}

impl Deref for OwnedStream {
    type Target = CudaStream;
    fn deref(&self) -> &CudaStream {
        &self.stream
    }
}

impl fmt::Debug for OwnedStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OwnedStream").field(&self.stream).finish()
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        if let Ok(_b) = self.ctx.bind("cuStreamDestroy") {
            let _ = driver::stream_destroy(self.stream.as_raw());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_handles_order_and_debug() {
        assert!(CudaStream::LEGACY < CudaStream::PER_THREAD);
        assert_eq!(format!("{:?}", CudaStream::LEGACY), "CudaStream(legacy)");
        assert_eq!(CudaStream::default(), CudaStream::LEGACY);
        assert_eq!(CudaStream::LEGACY.addr(), 0);
        assert!(CudaStream::PER_THREAD.as_raw().addr() == 2);
    }

    #[test]
    fn node_kinds_map() {
        assert_eq!(GraphNodeKind::from_raw(10), GraphNodeKind::MemAlloc);
        assert_eq!(GraphNodeKind::from_raw(5), GraphNodeKind::Empty);
        assert_eq!(GraphNodeKind::from_raw(99), GraphNodeKind::Other(99));
    }

    #[test]
    fn new_never_panics() {
        match CudaBackend::new(0) {
            Ok(b) => assert_eq!(b.device(), 0),
            Err(Error::NoDevice(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
        assert!(matches!(
            CudaBackend::new(u32::MAX),
            Err(Error::NoDevice(_) | Error::InvalidArgument(_))
        ));
    }
}
