//! Thin, `Result`-returning wrappers over the raw [`HipApi`] entries: one
//! function per driver call, no policy. Functions that take raw handles are
//! `unsafe`: the caller vouches that the handle is live.

#![allow(non_upper_case_globals)] // vendor constant names in patterns

use std::ffi::{CStr, c_int, c_uint, c_ulonglong, c_void};
use std::fmt;

use cachalot_hip_sys::*;

/// A failed HIP call: the `hipError_t` code and the call's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HipError {
    /// The HIP call that failed.
    pub call: &'static str,
    /// The `hipError_t` it returned.
    pub code: hipError_t,
}

impl fmt::Display for HipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} returned {} ({})",
            self.call,
            self.code,
            builtin_name(self.code)
        )
    }
}

impl std::error::Error for HipError {}

/// Name of a `hipError_t` from a built-in table (used when the runtime's
/// `hipGetErrorName` is unavailable).
pub fn builtin_name(code: hipError_t) -> &'static str {
    match code {
        hipSuccess => "hipSuccess",
        hipErrorInvalidValue => "hipErrorInvalidValue",
        hipErrorOutOfMemory => "hipErrorOutOfMemory",
        hipErrorNotInitialized => "hipErrorNotInitialized",
        hipErrorDeinitialized => "hipErrorDeinitialized",
        hipErrorInsufficientDriver => "hipErrorInsufficientDriver",
        hipErrorNoDevice => "hipErrorNoDevice",
        hipErrorInvalidDevice => "hipErrorInvalidDevice",
        hipErrorInvalidHandle => "hipErrorInvalidHandle",
        hipErrorIllegalState => "hipErrorIllegalState",
        hipErrorNotReady => "hipErrorNotReady",
        hipErrorNotSupported => "hipErrorNotSupported",
        hipErrorStreamCaptureUnsupported => "hipErrorStreamCaptureUnsupported",
        hipErrorStreamCaptureInvalidated => "hipErrorStreamCaptureInvalidated",
        hipErrorUnknown => "hipErrorUnknown",
        _ => "unrecognized hipError_t",
    }
}

/// Name of a `hipError_t` as the runtime spells it (`hipGetErrorName`),
/// falling back to [`builtin_name`].
pub fn error_name(api: &HipApi, code: hipError_t) -> String {
    // SAFETY: hipGetErrorName takes any code and returns null or a pointer
    // to a static NUL-terminated string owned by the runtime.
    let p = unsafe { (api.hipGetErrorName)(code) };
    if p.is_null() {
        return builtin_name(code).to_owned();
    }
    // SAFETY: non-null, static and NUL-terminated per the HIP contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[inline]
fn check(call: &'static str, code: hipError_t) -> Result<(), HipError> {
    if code == hipSuccess {
        Ok(())
    } else {
        Err(HipError { call, code })
    }
}

fn missing(call: &'static str) -> HipError {
    HipError {
        call,
        code: hipErrorNotSupported,
    }
}

/// `hipInit(0)`.
pub fn init(api: &HipApi) -> Result<(), HipError> {
    // SAFETY: plain value argument.
    check("hipInit", unsafe { (api.hipInit)(0) })
}

/// `hipGetDeviceCount`.
pub fn device_count(api: &HipApi) -> Result<c_int, HipError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer for the duration of the call.
    check("hipGetDeviceCount", unsafe {
        (api.hipGetDeviceCount)(&mut n)
    })?;
    Ok(n)
}

/// `hipGetDevice`.
pub fn get_device(api: &HipApi) -> Result<c_int, HipError> {
    let mut d: c_int = 0;
    // SAFETY: `d` is a valid out-pointer for the duration of the call.
    check("hipGetDevice", unsafe { (api.hipGetDevice)(&mut d) })?;
    Ok(d)
}

/// `hipSetDevice`.
pub fn set_device(api: &HipApi, device: c_int) -> Result<(), HipError> {
    // SAFETY: plain value argument; an out-of-range ordinal is an error code.
    check("hipSetDevice", unsafe { (api.hipSetDevice)(device) })
}

/// `hipGetLastError`: returns and clears the thread's sticky error.
pub fn get_last_error(api: &HipApi) -> hipError_t {
    // SAFETY: no arguments.
    unsafe { (api.hipGetLastError)() }
}

/// `hipMalloc` of `size` bytes on the current device.
pub fn malloc(api: &HipApi, size: usize) -> Result<*mut c_void, HipError> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer for the duration of the call.
    check("hipMalloc", unsafe { (api.hipMalloc)(&mut p, size) })?;
    Ok(p)
}

/// `hipFree`.
///
/// # Safety
/// `ptr` must come from [`malloc`] and not be freed yet, nor used afterwards.
pub unsafe fn free(api: &HipApi, ptr: *mut c_void) -> Result<(), HipError> {
    // SAFETY: the caller guarantees `ptr` is a live hipMalloc allocation.
    check("hipFree", unsafe { (api.hipFree)(ptr) })
}

/// `hipMemGetInfo`: `(free, total)` bytes of the current device.
pub fn mem_get_info(api: &HipApi) -> Result<(usize, usize), HipError> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both are valid out-pointers for the duration of the call.
    check("hipMemGetInfo", unsafe {
        (api.hipMemGetInfo)(&mut free, &mut total)
    })?;
    Ok((free, total))
}

/// `hipDeviceSynchronize` of the current device.
pub fn device_synchronize(api: &HipApi) -> Result<(), HipError> {
    // SAFETY: no arguments.
    check("hipDeviceSynchronize", unsafe {
        (api.hipDeviceSynchronize)()
    })
}

/// `hipStreamCreateWithFlags`.
pub fn stream_create(api: &HipApi, flags: c_uint) -> Result<hipStream_t, HipError> {
    let mut s: hipStream_t = std::ptr::null_mut();
    // SAFETY: `s` is a valid out-pointer for the duration of the call.
    check("hipStreamCreateWithFlags", unsafe {
        (api.hipStreamCreateWithFlags)(&mut s, flags)
    })?;
    Ok(s)
}

/// `hipStreamDestroy`.
///
/// # Safety
/// `stream` must be a live stream from [`stream_create`], not used afterwards.
pub unsafe fn stream_destroy(api: &HipApi, stream: hipStream_t) -> Result<(), HipError> {
    // SAFETY: the caller guarantees the handle is live.
    check("hipStreamDestroy", unsafe {
        (api.hipStreamDestroy)(stream)
    })
}

/// `hipStreamSynchronize`.
///
/// # Safety
/// `stream` must be null or a live stream.
pub unsafe fn stream_synchronize(api: &HipApi, stream: hipStream_t) -> Result<(), HipError> {
    // SAFETY: the caller guarantees the handle is null or live.
    check("hipStreamSynchronize", unsafe {
        (api.hipStreamSynchronize)(stream)
    })
}

/// `hipStreamQuery`: `Ok(Some(true))` when all work submitted to the
/// stream has completed, `Ok(Some(false))` on `hipErrorNotReady`,
/// `Ok(None)` when the library lacks the symbol.
///
/// # Safety
/// `stream` must be null or a live stream.
pub unsafe fn stream_query(api: &HipApi, stream: hipStream_t) -> Result<Option<bool>, HipError> {
    const CALL: &str = "hipStreamQuery";
    let Some(f) = api.hipStreamQuery else {
        return Ok(None);
    };
    // SAFETY: the caller guarantees the handle is null or live.
    match unsafe { f(stream) } {
        hipSuccess => Ok(Some(true)),
        hipErrorNotReady => Ok(Some(false)),
        code => Err(HipError { call: CALL, code }),
    }
}

/// `hipEventCreateWithFlags`.
pub fn event_create(api: &HipApi, flags: c_uint) -> Result<hipEvent_t, HipError> {
    let mut e: hipEvent_t = std::ptr::null_mut();
    // SAFETY: `e` is a valid out-pointer for the duration of the call.
    check("hipEventCreateWithFlags", unsafe {
        (api.hipEventCreateWithFlags)(&mut e, flags)
    })?;
    Ok(e)
}

/// `hipEventDestroy`.
///
/// # Safety
/// `event` must be a live event, not used afterwards.
pub unsafe fn event_destroy(api: &HipApi, event: hipEvent_t) -> Result<(), HipError> {
    // SAFETY: the caller guarantees the handle is live.
    check("hipEventDestroy", unsafe { (api.hipEventDestroy)(event) })
}

/// `hipEventRecord`.
///
/// # Safety
/// `event` must be live; `stream` null or live.
pub unsafe fn event_record(
    api: &HipApi,
    event: hipEvent_t,
    stream: hipStream_t,
) -> Result<(), HipError> {
    // SAFETY: the caller guarantees both handles.
    check("hipEventRecord", unsafe {
        (api.hipEventRecord)(event, stream)
    })
}

/// `hipEventQuery`: `Ok(true)` when complete, `Ok(false)` on `hipErrorNotReady`.
///
/// # Safety
/// `event` must be live.
pub unsafe fn event_query(api: &HipApi, event: hipEvent_t) -> Result<bool, HipError> {
    // SAFETY: the caller guarantees the handle is live.
    match unsafe { (api.hipEventQuery)(event) } {
        hipSuccess => Ok(true),
        hipErrorNotReady => Ok(false),
        code => Err(HipError {
            call: "hipEventQuery",
            code,
        }),
    }
}

/// `hipEventSynchronize`.
///
/// # Safety
/// `event` must be live.
pub unsafe fn event_synchronize(api: &HipApi, event: hipEvent_t) -> Result<(), HipError> {
    // SAFETY: the caller guarantees the handle is live.
    check("hipEventSynchronize", unsafe {
        (api.hipEventSynchronize)(event)
    })
}

/// `hipStreamWaitEvent(stream, event, 0)`.
///
/// # Safety
/// `event` must be live; `stream` null or live.
pub unsafe fn stream_wait_event(
    api: &HipApi,
    stream: hipStream_t,
    event: hipEvent_t,
) -> Result<(), HipError> {
    // SAFETY: the caller guarantees both handles.
    check("hipStreamWaitEvent", unsafe {
        (api.hipStreamWaitEvent)(stream, event, 0)
    })
}

/// `hipThreadExchangeStreamCaptureMode`: sets the thread's capture mode and
/// returns the previous one. `Ok(None)` when the runtime lacks the call.
pub fn exchange_capture_mode(
    api: &HipApi,
    mode: hipStreamCaptureMode,
) -> Result<Option<hipStreamCaptureMode>, HipError> {
    let Some(f) = api.hipThreadExchangeStreamCaptureMode else {
        return Ok(None);
    };
    let mut m = mode;
    // SAFETY: `m` is a valid in/out pointer for the duration of the call.
    check("hipThreadExchangeStreamCaptureMode", unsafe { f(&mut m) })?;
    Ok(Some(m))
}

/// What `hipStreamGetCaptureInfo_v2` reports, with the dependency array
/// copied at once (it is only valid until the next call on the stream).
#[derive(Debug)]
pub struct RawCaptureInfo {
    /// `hipStreamCaptureStatus`.
    pub status: hipStreamCaptureStatus,
    /// Capture id.
    pub id: c_ulonglong,
    /// The graph being captured into (null when not capturing).
    pub graph: hipGraph_t,
    /// The stream's current terminal node set.
    pub deps: Vec<hipGraphNode_t>,
}

/// `hipStreamGetCaptureInfo_v2`.
///
/// # Safety
/// `stream` must be null or live.
pub unsafe fn stream_get_capture_info(
    api: &HipApi,
    stream: hipStream_t,
) -> Result<RawCaptureInfo, HipError> {
    const CALL: &str = "hipStreamGetCaptureInfo_v2";
    let f = api.hipStreamGetCaptureInfo_v2.ok_or(missing(CALL))?;
    let mut status: hipStreamCaptureStatus = hipStreamCaptureStatusNone;
    let mut id: c_ulonglong = 0;
    let mut graph: hipGraph_t = std::ptr::null_mut();
    let mut deps: *const hipGraphNode_t = std::ptr::null();
    let mut n: usize = 0;
    // SAFETY: all out-pointers are valid locals; the caller vouches for `stream`.
    check(CALL, unsafe {
        f(stream, &mut status, &mut id, &mut graph, &mut deps, &mut n)
    })?;
    let deps = if deps.is_null() || n == 0 {
        Vec::new()
    } else {
        // SAFETY: on success the runtime returns an array of `n` nodes valid
        // until the next call on this stream; we copy it immediately.
        unsafe { std::slice::from_raw_parts(deps, n) }.to_vec()
    };
    Ok(RawCaptureInfo {
        status,
        id,
        graph,
        deps,
    })
}

/// `hipGraphNodeGetDependencies`, called once for the count and once to fill.
///
/// # Safety
/// `node` must be a live node of a live graph.
pub unsafe fn graph_node_get_dependencies(
    api: &HipApi,
    node: hipGraphNode_t,
) -> Result<Vec<hipGraphNode_t>, HipError> {
    const CALL: &str = "hipGraphNodeGetDependencies";
    let f = api.hipGraphNodeGetDependencies.ok_or(missing(CALL))?;
    let mut n: usize = 0;
    // SAFETY: null array asks for the count only; `n` is a valid out-pointer.
    check(CALL, unsafe { f(node, std::ptr::null_mut(), &mut n) })?;
    let mut deps: Vec<hipGraphNode_t> = vec![std::ptr::null_mut(); n];
    if n == 0 {
        return Ok(deps);
    }
    let mut filled = n;
    // SAFETY: `deps` has room for `filled` nodes.
    check(CALL, unsafe { f(node, deps.as_mut_ptr(), &mut filled) })?;
    deps.truncate(filled.min(n));
    deps.retain(|p| !p.is_null());
    Ok(deps)
}

/// `hipGraphAddEmptyNode`.
///
/// # Safety
/// `graph` must be live and `deps` nodes of it.
pub unsafe fn graph_add_empty_node(
    api: &HipApi,
    graph: hipGraph_t,
    deps: &[hipGraphNode_t],
) -> Result<hipGraphNode_t, HipError> {
    const CALL: &str = "hipGraphAddEmptyNode";
    let f = api.hipGraphAddEmptyNode.ok_or(missing(CALL))?;
    let mut node: hipGraphNode_t = std::ptr::null_mut();
    let dp = if deps.is_empty() {
        std::ptr::null()
    } else {
        deps.as_ptr()
    };
    // SAFETY: `node` is a valid out-pointer; `dp` points at `deps.len()` nodes.
    check(CALL, unsafe { f(&mut node, graph, dp, deps.len()) })?;
    Ok(node)
}

/// `hipStreamUpdateCaptureDependencies`.
///
/// # Safety
/// `stream` must be capturing and `deps` nodes of its graph.
pub unsafe fn stream_update_capture_dependencies(
    api: &HipApi,
    stream: hipStream_t,
    deps: &[hipGraphNode_t],
    flags: c_uint,
) -> Result<(), HipError> {
    const CALL: &str = "hipStreamUpdateCaptureDependencies";
    let f = api
        .hipStreamUpdateCaptureDependencies
        .ok_or(missing(CALL))?;
    // The C prototype takes a non-const pointer; pass a private copy.
    let mut copy = deps.to_vec();
    let dp = if copy.is_empty() {
        std::ptr::null_mut()
    } else {
        copy.as_mut_ptr()
    };
    // SAFETY: `dp` points at `copy.len()` nodes owned by this frame.
    check(CALL, unsafe { f(stream, dp, copy.len(), flags) })
}

/// `hipRuntimeGetVersion` (`HIP_VERSION`: major·10⁷ + minor·10⁵ + patch).
/// `Ok(None)` when the runtime lacks the call.
pub fn runtime_version(api: &HipApi) -> Result<Option<c_int>, HipError> {
    let Some(f) = api.hipRuntimeGetVersion else {
        return Ok(None);
    };
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer for the duration of the call.
    check("hipRuntimeGetVersion", unsafe { f(&mut v) })?;
    Ok(Some(v))
}

/// `hipDeviceGetAttribute(attr, device)`.
pub fn device_attribute(
    api: &HipApi,
    attr: hipDeviceAttribute_t,
    device: c_int,
) -> Result<c_int, HipError> {
    const CALL: &str = "hipDeviceGetAttribute";
    let f = api.hipDeviceGetAttribute.ok_or(missing(CALL))?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer; attribute and device are plain
    // values (an unknown one is an error code).
    check(CALL, unsafe { f(&mut v, attr, device) })?;
    Ok(v)
}

/// Which `hipMemAllocationProp` layout a runtime takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropLayout {
    /// ROCm 5.3 and later: [`hipMemAllocationProp`].
    Current,
    /// ROCm 5.2 and earlier: [`hipMemAllocationProp_rocm52`].
    Rocm52,
}

impl PropLayout {
    /// The layout of the runtime whose `hipRuntimeGetVersion` is `version`.
    pub fn for_runtime(version: c_int) -> Self {
        if version >= HIP_VERSION_ALLOCATION_PROP_REORDERED {
            PropLayout::Current
        } else {
            PropLayout::Rocm52
        }
    }
}

/// A `hipMemAllocationProp` in the layout of the runtime it is passed to.
#[derive(Debug, Clone, Copy)]
pub enum AllocationProp {
    /// ROCm 5.3 and later.
    Current(hipMemAllocationProp),
    /// ROCm 5.2 and earlier.
    Rocm52(hipMemAllocationProp_rocm52),
}

impl AllocationProp {
    /// Pinned memory on `device`, not exportable, uncompressed.
    pub fn pinned_on(device: c_int, layout: PropLayout) -> Self {
        let location = hipMemLocation {
            r#type: hipMemLocationTypeDevice,
            id: device,
        };
        match layout {
            PropLayout::Current => AllocationProp::Current(hipMemAllocationProp {
                r#type: hipMemAllocationTypePinned,
                requestedHandleType: hipMemHandleTypeNone,
                location,
                win32HandleMetaData: std::ptr::null_mut(),
                allocFlags: hipMemAllocationPropFlags::default(),
            }),
            PropLayout::Rocm52 => AllocationProp::Rocm52(hipMemAllocationProp_rocm52 {
                compressionType: 0,
                location,
                requestedHandleType: hipMemHandleTypeNone,
                r#type: hipMemAllocationTypePinned,
                usage: 0,
                win32HandleMetaData: std::ptr::null_mut(),
            }),
        }
    }

    /// The pointer to pass as `const hipMemAllocationProp*`.
    fn as_ptr(&self) -> *const c_void {
        match self {
            AllocationProp::Current(p) => (p as *const hipMemAllocationProp).cast(),
            AllocationProp::Rocm52(p) => (p as *const hipMemAllocationProp_rocm52).cast(),
        }
    }
}

/// `hipMemGetAllocationGranularity(prop, option)`.
pub fn mem_get_allocation_granularity(
    api: &HipApi,
    prop: &AllocationProp,
    option: hipMemAllocationGranularity_flags,
) -> Result<usize, HipError> {
    const CALL: &str = "hipMemGetAllocationGranularity";
    let f = api.hipMemGetAllocationGranularity.ok_or(missing(CALL))?;
    let mut g: usize = 0;
    // SAFETY: `g` is a valid out-pointer; `prop` points at a live struct of
    // the layout the runtime takes (the caller chose it by version).
    check(CALL, unsafe { f(&mut g, prop.as_ptr(), option) })?;
    Ok(g)
}

/// `hipMemAddressReserve(size, alignment, addr = null, flags = 0)`.
pub fn mem_address_reserve(
    api: &HipApi,
    size: usize,
    alignment: usize,
) -> Result<*mut c_void, HipError> {
    const CALL: &str = "hipMemAddressReserve";
    let f = api.hipMemAddressReserve.ok_or(missing(CALL))?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer; no address is requested.
    check(CALL, unsafe {
        f(&mut p, size, alignment, std::ptr::null_mut(), 0)
    })?;
    Ok(p)
}

/// `hipMemAddressFree`.
///
/// # Safety
/// `[ptr, ptr + size)` must be a whole range from [`mem_address_reserve`],
/// nothing mapped in it, unused afterwards.
pub unsafe fn mem_address_free(
    api: &HipApi,
    ptr: *mut c_void,
    size: usize,
) -> Result<(), HipError> {
    const CALL: &str = "hipMemAddressFree";
    let f = api.hipMemAddressFree.ok_or(missing(CALL))?;
    // SAFETY: the caller's guarantee.
    check(CALL, unsafe { f(ptr, size) })
}

/// `hipMemCreate(size, prop, flags = 0)`.
pub fn mem_create(
    api: &HipApi,
    size: usize,
    prop: &AllocationProp,
) -> Result<hipMemGenericAllocationHandle_t, HipError> {
    const CALL: &str = "hipMemCreate";
    let f = api.hipMemCreate.ok_or(missing(CALL))?;
    let mut h: hipMemGenericAllocationHandle_t = std::ptr::null_mut();
    // SAFETY: `h` is a valid out-pointer; `prop` points at a live struct of
    // the layout the runtime takes.
    check(CALL, unsafe { f(&mut h, size, prop.as_ptr(), 0) })?;
    Ok(h)
}

/// `hipMemRelease`.
///
/// # Safety
/// `handle` must come from [`mem_create`], be released once and unused afterwards.
pub unsafe fn mem_release(
    api: &HipApi,
    handle: hipMemGenericAllocationHandle_t,
) -> Result<(), HipError> {
    const CALL: &str = "hipMemRelease";
    let f = api.hipMemRelease.ok_or(missing(CALL))?;
    // SAFETY: the caller's guarantee.
    check(CALL, unsafe { f(handle) })
}

/// `hipMemMap(ptr, size, offset = 0, handle, flags = 0)`.
///
/// # Safety
/// `[ptr, ptr + size)` must lie in a range from [`mem_address_reserve`] and
/// `handle` be live physical memory of at least `size` bytes.
pub unsafe fn mem_map(
    api: &HipApi,
    ptr: *mut c_void,
    size: usize,
    handle: hipMemGenericAllocationHandle_t,
) -> Result<(), HipError> {
    const CALL: &str = "hipMemMap";
    let f = api.hipMemMap.ok_or(missing(CALL))?;
    // SAFETY: the caller's guarantee.
    check(CALL, unsafe { f(ptr, size, 0, handle, 0) })
}

/// `hipMemUnmap`.
///
/// # Safety
/// `[ptr, ptr + size)` must be mapped by [`mem_map`] and no pending work use it.
pub unsafe fn mem_unmap(api: &HipApi, ptr: *mut c_void, size: usize) -> Result<(), HipError> {
    const CALL: &str = "hipMemUnmap";
    let f = api.hipMemUnmap.ok_or(missing(CALL))?;
    // SAFETY: the caller's guarantee.
    check(CALL, unsafe { f(ptr, size) })
}

/// `hipMemSetAccess(ptr, size, {device, read-write}, 1)`.
///
/// # Safety
/// `[ptr, ptr + size)` must be mapped by [`mem_map`].
pub unsafe fn mem_set_access(
    api: &HipApi,
    ptr: *mut c_void,
    size: usize,
    device: c_int,
) -> Result<(), HipError> {
    const CALL: &str = "hipMemSetAccess";
    let f = api.hipMemSetAccess.ok_or(missing(CALL))?;
    let desc = hipMemAccessDesc {
        location: hipMemLocation {
            r#type: hipMemLocationTypeDevice,
            id: device,
        },
        flags: hipMemAccessFlagsProtReadWrite,
    };
    // SAFETY: `desc` is one valid descriptor for the call; the caller
    // vouches for the range.
    check(CALL, unsafe { f(ptr, size, &desc, 1) })
}
