//! # cachalot-hip
//!
//! The HIP (AMD ROCm) backend of cachalot: [`HipBackend`] implements
//! [`cachalot_core::Backend`] over `hipMalloc`/`hipFree`, HIP streams and
//! events (`hipStreamQuery` where the runtime has it), `hipMemGetInfo` and
//! the stream-capture calls
//! (`hipStreamGetCaptureInfo_v2`, `hipGraphNodeGetDependencies`,
//! `hipGraphAddEmptyNode`, `hipStreamUpdateCaptureDependencies`), and, where
//! the runtime and device have it, virtual memory ([`HipVirtualMemory`] over
//! `hipMemAddressReserve`, `hipMemCreate`, `hipMemMap`, `hipMemSetAccess` and
//! their inverses).
//!
//! Layers, as in cudarc: `cachalot-hip-sys` holds the run-time loaded table of
//! function pointers; [`result`] wraps each call into a `Result`; this crate's
//! root holds the safe types: [`HipBackend`], the RAII [`OwnedStream`] and
//! [`HipEvent`] and [`HipPhysical`], the plain handles [`HipStream`] and
//! [`HipGraphNode`], and the virtual-memory capability [`HipVirtualMemory`].
//!
//! Opening never panics and never fails to link: without the runtime library
//! or without a device, [`HipBackend::new`] returns an [`OpenError`] whose
//! [`OpenError::is_unavailable`] is true, so test suites can skip cleanly.

pub mod result;
mod vmm;

pub use vmm::{HipPhysical, HipVirtualMemory};

use std::ffi::{c_int, c_void};
use std::fmt;
use std::sync::Arc;

use cachalot_core::{
    Backend, BackendError, CaptureStatus, DependencyUpdate, DeviceAllocError, DeviceIndex,
    GraphCapture, MemoryInfo, VirtualMemory,
};
pub use cachalot_hip_sys as sys;
use cachalot_hip_sys::{HipApi, LoadError};

use crate::result::{AllocationProp, HipError, PropLayout};

const NAME: &str = "hip";

/// Why a [`HipBackend`] could not be opened.
#[derive(Debug)]
pub enum OpenError {
    /// The HIP runtime library is absent or incomplete.
    Library(LoadError),
    /// The runtime loaded but reports no usable device.
    NoDevice {
        /// The failing call's `hipError_t` (0 when the count was simply 0).
        code: i32,
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
    /// Whether HIP is simply not available here (no library or no device):
    /// the condition under which device tests skip. A library that opens
    /// but lacks a required symbol ([`LoadError::MissingSymbol`]) is a
    /// broken installation, not an absent one: not unavailable.
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
            OpenError::Library(e) => write!(f, "hip: {e}"),
            OpenError::NoDevice { reason, .. } => write!(f, "hip: no device: {reason}"),
            OpenError::InvalidDevice { index, count } => {
                write!(f, "hip: device {index} out of range ({count} present)")
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

impl From<OpenError> for cachalot_core::Error {
    fn from(e: OpenError) -> Self {
        match e {
            OpenError::Driver(b) => cachalot_core::Error::Backend(b),
            OpenError::InvalidDevice { .. } => cachalot_core::Error::InvalidArgument(e.to_string()),
            other => cachalot_core::Error::NoDevice(other.to_string()),
        }
    }
}

/// Converts a failed call into the core's [`BackendError`], naming the
/// error as the runtime does and keeping the [`HipError`] as its source.
fn backend_error(api: &HipApi, e: HipError) -> BackendError {
    BackendError::new(
        NAME,
        e.call,
        i64::from(e.code),
        result::error_name(api, e.code),
    )
    .with_source(e)
}

/// A HIP stream handle (the legacy null stream is [`HipStream::NULL`]).
///
/// A plain copyable handle; the stream itself is owned by an
/// [`OwnedStream`] (or by whoever created it outside cachalot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HipStream(u64);

impl HipStream {
    /// The legacy default (null) stream.
    pub const NULL: HipStream = HipStream(0);

    /// Wraps a raw `hipStream_t` created elsewhere (e.g. by PyTorch).
    ///
    /// # Safety
    /// `raw` must be null or a stream of the backend's device that stays
    /// alive while cachalot may use it.
    pub unsafe fn from_raw(raw: *mut c_void) -> Self {
        HipStream(raw as usize as u64)
    }

    /// The raw `hipStream_t`.
    pub fn as_raw(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }
}

/// A node of a HIP capture graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HipGraphNode(u64);

impl HipGraphNode {
    /// Wraps a raw `hipGraphNode_t`.
    ///
    /// # Safety
    /// `raw` must be a node of a graph that stays alive while it is used.
    pub unsafe fn from_raw(raw: *mut c_void) -> Self {
        HipGraphNode(raw as usize as u64)
    }

    /// The raw `hipGraphNode_t`.
    pub fn as_raw(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }
}

/// A stream created by [`HipBackend::create_stream`], destroyed on drop.
#[derive(Debug)]
pub struct OwnedStream {
    api: Arc<HipApi>,
    handle: HipStream,
}

impl OwnedStream {
    /// The copyable handle to pass to the allocator.
    pub fn handle(&self) -> HipStream {
        self.handle
    }

    /// Blocks until all work on the stream has completed.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        // SAFETY: the stream is owned by `self` and alive.
        unsafe { result::stream_synchronize(&self.api, self.handle.as_raw()) }
            .map_err(|e| backend_error(&self.api, e))
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: the stream is owned by `self` and never used again.
        let _ = unsafe { result::stream_destroy(&self.api, self.handle.as_raw()) };
    }
}

/// An owned HIP event (created with `hipEventDisableTiming`), destroyed on
/// drop or explicitly with [`Backend::destroy_event`].
#[derive(Debug)]
pub struct HipEvent {
    api: Arc<HipApi>,
    raw: u64,
}

impl HipEvent {
    fn as_raw(&self) -> *mut c_void {
        self.raw as usize as *mut c_void
    }

    /// Destroys the event, reporting a failure instead of ignoring it.
    fn destroy(mut self) -> Result<(), BackendError> {
        let raw = std::mem::take(&mut self.raw);
        // SAFETY: `self` owned the event; `raw` is now 0 so Drop skips it.
        unsafe { result::event_destroy(&self.api, raw as usize as *mut c_void) }
            .map_err(|e| backend_error(&self.api, e))
    }
}

impl Drop for HipEvent {
    fn drop(&mut self) {
        if self.raw != 0 {
            // SAFETY: the event is owned by `self` and never used again.
            let _ = unsafe { result::event_destroy(&self.api, self.as_raw()) };
        }
    }
}

/// Makes `device` current for the guard's lifetime and restores the
/// previous device on drop (PyTorch's device guard).
struct DeviceGuard<'a> {
    api: &'a HipApi,
    prev: Option<c_int>,
}

impl<'a> DeviceGuard<'a> {
    fn new(api: &'a HipApi, device: c_int) -> Result<Self, BackendError> {
        let cur = result::get_device(api).map_err(|e| backend_error(api, e))?;
        if cur == device {
            return Ok(Self { api, prev: None });
        }
        result::set_device(api, device).map_err(|e| backend_error(api, e))?;
        Ok(Self {
            api,
            prev: Some(cur),
        })
    }
}

impl Drop for DeviceGuard<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.prev {
            let _ = result::set_device(self.api, prev);
        }
    }
}

/// One HIP device driven through a run-time loaded `libamdhip64`.
#[derive(Debug, Clone)]
pub struct HipBackend {
    api: Arc<HipApi>,
    device: c_int,
    vmm: Option<HipVirtualMemory>,
}

impl HipBackend {
    /// Opens device `device`, loading the runtime from
    /// [`sys::LIBRARY_NAMES`] (or [`sys::LIBRARY_ENV`]).
    pub fn new(device: DeviceIndex) -> Result<Self, OpenError> {
        Self::with_api(HipApi::load()?, device)
    }

    /// Opens device `device`, loading the runtime from the first of `names`.
    pub fn open(names: &[&str], device: DeviceIndex) -> Result<Self, OpenError> {
        Self::with_api(HipApi::load_from(names)?, device)
    }

    /// Opens device `device` over an already loaded (or faked) table.
    pub fn with_api(api: Arc<HipApi>, device: DeviceIndex) -> Result<Self, OpenError> {
        let count = Self::count_with(&api)?;
        if device >= count {
            return Err(OpenError::InvalidDevice {
                index: device,
                count,
            });
        }
        let device = c_int::try_from(device).map_err(|_| OpenError::InvalidDevice {
            index: device,
            count,
        })?;
        let vmm = HipVirtualMemory::probe(&api, device);
        Ok(Self { api, device, vmm })
    }

    /// Number of HIP devices, or why there are none.
    pub fn device_count() -> Result<u32, OpenError> {
        let api = HipApi::load()?;
        Self::count_with(&api)
    }

    fn count_with(api: &HipApi) -> Result<u32, OpenError> {
        // hipGetDeviceCount initializes the runtime implicitly; with the
        // library present and no GPU it returns hipErrorNoDevice.
        let n = result::device_count(api).map_err(|e| OpenError::NoDevice {
            code: e.code,
            reason: format!("{}: {}", e.call, result::error_name(api, e.code)),
        })?;
        if n <= 0 {
            return Err(OpenError::NoDevice {
                code: 0,
                reason: "hipGetDeviceCount reports 0 devices".to_owned(),
            });
        }
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// The loaded (or faked) function table.
    pub fn api(&self) -> &Arc<HipApi> {
        &self.api
    }

    /// Creates a non-blocking stream on this device.
    pub fn create_stream(&self) -> Result<OwnedStream, BackendError> {
        let _g = DeviceGuard::new(&self.api, self.device)?;
        let raw = result::stream_create(&self.api, cachalot_hip_sys::hipStreamNonBlocking)
            .map_err(|e| self.err(e))?;
        Ok(OwnedStream {
            api: self.api.clone(),
            handle: HipStream(raw as usize as u64),
        })
    }

    fn err(&self, e: HipError) -> BackendError {
        backend_error(&self.api, e)
    }

    fn graph_of(&self, stream: HipStream) -> Result<*mut c_void, BackendError> {
        // SAFETY: stream handles come from OwnedStream, NULL or an unsafe from_raw.
        let info = unsafe { result::stream_get_capture_info(&self.api, stream.as_raw()) }
            .map_err(|e| self.err(e))?;
        if info.status != cachalot_hip_sys::hipStreamCaptureStatusActive || info.graph.is_null() {
            return Err(BackendError::new(
                NAME,
                "hipGraphAddEmptyNode",
                i64::from(cachalot_hip_sys::hipErrorIllegalState),
                "stream is not capturing",
            ));
        }
        Ok(info.graph)
    }
}

impl Backend for HipBackend {
    type Stream = HipStream;
    type Event = HipEvent;
    type Ptr = u64;
    type Capture = Self;
    type VirtualMemory = HipVirtualMemory;

    fn name(&self) -> &'static str {
        NAME
    }

    fn device(&self) -> DeviceIndex {
        self.device as DeviceIndex
    }

    fn default_stream(&self) -> HipStream {
        HipStream::NULL
    }

    fn malloc(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let size = usize::try_from(size).map_err(|_| DeviceAllocError::OutOfMemory)?;
        let _g = DeviceGuard::new(&self.api, self.device)?;
        // hipMalloc during a capture is legal only in relaxed mode (spec 1.9).
        let prev =
            result::exchange_capture_mode(&self.api, cachalot_hip_sys::hipStreamCaptureModeRelaxed)
                .map_err(|e| self.err(e))?;
        let r = result::malloc(&self.api, size);
        if let Some(prev) = prev {
            let _ = result::exchange_capture_mode(&self.api, prev);
        }
        match r {
            Ok(p) => Ok(p as usize as u64),
            Err(e) if e.code == cachalot_hip_sys::hipErrorOutOfMemory => {
                // Clear the sticky error so later calls do not report it.
                let _ = result::get_last_error(&self.api);
                Err(DeviceAllocError::OutOfMemory)
            }
            Err(e) => Err(DeviceAllocError::Backend(self.err(e))),
        }
    }

    fn free(&self, ptr: u64, _size: u64) -> Result<(), BackendError> {
        let _g = DeviceGuard::new(&self.api, self.device)?;
        // SAFETY: the Backend contract: `ptr` came from `malloc` and is freed once.
        unsafe { result::free(&self.api, ptr as usize as *mut c_void) }.map_err(|e| self.err(e))
    }

    fn memory_info(&self) -> Result<MemoryInfo, BackendError> {
        let _g = DeviceGuard::new(&self.api, self.device)?;
        let (free, total) = result::mem_get_info(&self.api).map_err(|e| self.err(e))?;
        Ok(MemoryInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn create_event(&self) -> Result<HipEvent, BackendError> {
        let _g = DeviceGuard::new(&self.api, self.device)?;
        let raw = result::event_create(&self.api, cachalot_hip_sys::hipEventDisableTiming)
            .map_err(|e| self.err(e))?;
        Ok(HipEvent {
            api: self.api.clone(),
            raw: raw as usize as u64,
        })
    }

    fn destroy_event(&self, event: HipEvent) -> Result<(), BackendError> {
        event.destroy()
    }

    fn record_event(&self, event: &HipEvent, stream: HipStream) -> Result<(), BackendError> {
        // SAFETY: the event is owned and live; the stream handle per HipStream's contract.
        unsafe { result::event_record(&self.api, event.as_raw(), stream.as_raw()) }
            .map_err(|e| self.err(e))
    }

    fn query_event(&self, event: &HipEvent) -> Result<bool, BackendError> {
        // SAFETY: the event is owned and live.
        unsafe { result::event_query(&self.api, event.as_raw()) }.map_err(|e| self.err(e))
    }

    fn query_stream(&self, stream: HipStream) -> Result<Option<bool>, BackendError> {
        // SAFETY: the stream handle per HipStream's contract.
        unsafe { result::stream_query(&self.api, stream.as_raw()) }.map_err(|e| self.err(e))
    }

    fn synchronize_event(&self, event: &HipEvent) -> Result<(), BackendError> {
        // SAFETY: the event is owned and live.
        unsafe { result::event_synchronize(&self.api, event.as_raw()) }.map_err(|e| self.err(e))
    }

    fn stream_wait_event(&self, stream: HipStream, event: &HipEvent) -> Result<(), BackendError> {
        // SAFETY: the event is owned and live; the stream handle per HipStream's contract.
        unsafe { result::stream_wait_event(&self.api, stream.as_raw(), event.as_raw()) }
            .map_err(|e| self.err(e))
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        let _g = DeviceGuard::new(&self.api, self.device)?;
        result::device_synchronize(&self.api).map_err(|e| self.err(e))
    }

    fn capture(&self) -> Option<&Self> {
        self.api.has_capture().then_some(self)
    }

    fn virtual_memory(&self) -> Option<&HipVirtualMemory> {
        self.vmm.as_ref()
    }
}

impl GraphCapture<HipStream> for HipBackend {
    type Node = HipGraphNode;

    fn capture_state(
        &self,
        stream: HipStream,
        terminals: &mut Vec<HipGraphNode>,
    ) -> Result<(CaptureStatus, u64), BackendError> {
        terminals.clear();
        if !self.api.has_capture() {
            return Ok((CaptureStatus::None, 0));
        }
        // SAFETY: the stream handle per HipStream's contract.
        let info = unsafe { result::stream_get_capture_info(&self.api, stream.as_raw()) }
            .map_err(|e| self.err(e))?;
        let status = match info.status {
            cachalot_hip_sys::hipStreamCaptureStatusNone => return Ok((CaptureStatus::None, 0)),
            cachalot_hip_sys::hipStreamCaptureStatusActive => CaptureStatus::Active,
            cachalot_hip_sys::hipStreamCaptureStatusInvalidated => CaptureStatus::Invalidated,
            other => {
                return Err(BackendError::new(
                    NAME,
                    "hipStreamGetCaptureInfo_v2",
                    i64::from(other),
                    format!("unknown hipStreamCaptureStatus {other}"),
                ));
            }
        };
        terminals.extend(
            info.deps
                .into_iter()
                .map(|p| HipGraphNode(p as usize as u64)),
        );
        Ok((status, info.id))
    }

    fn extend_node_dependencies(
        &self,
        node: HipGraphNode,
        out: &mut Vec<HipGraphNode>,
    ) -> Result<(), BackendError> {
        // SAFETY: nodes come from capture_state/add_empty_node of a live capture.
        let deps = unsafe { result::graph_node_get_dependencies(&self.api, node.as_raw()) }
            .map_err(|e| self.err(e))?;
        out.extend(deps.into_iter().map(|p| HipGraphNode(p as usize as u64)));
        Ok(())
    }

    fn add_empty_node(
        &self,
        stream: HipStream,
        deps: &[HipGraphNode],
    ) -> Result<HipGraphNode, BackendError> {
        let graph = self.graph_of(stream)?;
        let raw: Vec<*mut c_void> = deps.iter().map(|n| n.as_raw()).collect();
        // SAFETY: `graph` is the live capture graph of `stream`; `deps` are its nodes.
        unsafe { result::graph_add_empty_node(&self.api, graph, &raw) }
            .map(|p| HipGraphNode(p as usize as u64))
            .map_err(|e| self.err(e))
    }

    fn update_capture_dependencies(
        &self,
        stream: HipStream,
        nodes: &[HipGraphNode],
        mode: DependencyUpdate,
    ) -> Result<(), BackendError> {
        let flags = match mode {
            DependencyUpdate::Add => cachalot_hip_sys::hipStreamAddCaptureDependencies,
            DependencyUpdate::Set => cachalot_hip_sys::hipStreamSetCaptureDependencies,
        };
        let raw: Vec<*mut c_void> = nodes.iter().map(|n| n.as_raw()).collect();
        // SAFETY: the stream handle per HipStream's contract; nodes of its capture graph.
        unsafe {
            result::stream_update_capture_dependencies(&self.api, stream.as_raw(), &raw, flags)
        }
        .map_err(|e| self.err(e))
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
