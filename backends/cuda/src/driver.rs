//! Thin layer over `cudarc::driver::sys`: one safe function per driver call,
//! returning `Result<_, DriverError>` instead of a raw `CUresult`.
//!
//! This module is the crate's FFI boundary and the only place with `unsafe`.
//!
//! # Invariants the callers (the rest of this crate) uphold
//!
//! * No function here is called before [`library_present`] returned `true`
//!   and [`init`] succeeded (cudarc panics when `libcuda` is missing, and
//!   panics on a missing symbol: [`missing_symbols`] is checked first for
//!   every symbol this crate loads).
//! * Every handle passed in (stream, event, graph, node, context) is a live
//!   handle: created by this crate and not yet destroyed, or vouched for by
//!   the caller of the `unsafe` constructor `CudaBackend::wrap_stream`.
//! * Device pointers are plain integers to the host; the driver validates
//!   them, and device-side misuse cannot corrupt host memory.
//! * Host buffers are passed as Rust slices, so their length bounds every
//!   host read and write done by the driver.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::OnceLock;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{self, CUresult};

mod capture;
mod memory;

pub(crate) use capture::*;
pub(crate) use memory::*;

/// Result of one driver call.
pub(crate) type DResult<T> = Result<T, DriverError>;

/// The driver symbols [`crate::CudaBackend::new`] requires.
pub(crate) const CORE_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuStreamWaitEvent",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuMemsetD8Async",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD_v2",
    "cuLaunchHostFunc",
    "cuThreadExchangeStreamCaptureMode",
    "cuGetErrorString",
    "cuGetErrorName",
];

/// The driver symbols capture introspection requires (driver ≥ 12.3).
pub(crate) const CAPTURE_SYMBOLS: &[&str] = &[
    "cuStreamGetCaptureInfo_v3",
    "cuGraphNodeGetDependencies_v2",
    "cuGraphAddEmptyNode",
    "cuStreamUpdateCaptureDependencies_v2",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
];

/// The driver symbols virtual memory management requires (CUDA 10.2+);
/// checked before [`crate::CudaBackend::new`] asks the device whether it
/// supports it.
pub(crate) const VMM_SYMBOLS: &[&str] = &[
    "cuDeviceGetAttribute",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// The driver symbols sharing memory between processes requires: legacy
/// IPC of `cuMemAlloc` segments, and the shareable handles of `cuMemCreate`
/// memory.
pub(crate) const IPC_SYMBOLS: &[&str] = &[
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
];

#[inline]
fn res(r: CUresult) -> DResult<()> {
    r.result()
}

/// Whether a CUDA driver library (`libcuda`) can be loaded. Cached.
pub(crate) fn library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to dlopen the library names
        // and drops the handles; it dereferences nothing of ours.
        unsafe { sys::is_culib_present() }
    })
}

/// The names in `names` that the loaded driver library does not export.
/// Requires [`library_present`].
pub(crate) fn missing_symbols(names: &[&'static str]) -> Vec<&'static str> {
    if !library_present() {
        return names.to_vec();
    }
    // SAFETY: the library is present (checked above), so `culib` loads it
    // without panicking; it is kept loaded for the life of the process.
    let lib = unsafe { sys::culib() };
    names
        .iter()
        .copied()
        .filter(|name| {
            // SAFETY: we only look the symbol up and never call it through
            // this (deliberately opaque) function-pointer type.
            let sym = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) };
            sym.is_err()
        })
        .collect()
}

/// `cuInit(0)`.
pub(crate) fn init() -> DResult<()> {
    // SAFETY: no pointers; cuInit is idempotent and thread-safe.
    res(unsafe { sys::cuInit(0) })
}

/// `cuDriverGetVersion`: e.g. 12080 for CUDA 12.8.
pub(crate) fn driver_version() -> DResult<i32> {
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer for the duration of the call.
    res(unsafe { sys::cuDriverGetVersion(&mut v) })?;
    Ok(v)
}

/// `cuDeviceGetCount`.
pub(crate) fn device_count() -> DResult<i32> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer for the duration of the call.
    res(unsafe { sys::cuDeviceGetCount(&mut n) })?;
    Ok(n)
}

/// `cuDeviceGet`.
pub(crate) fn device_get(ordinal: i32) -> DResult<sys::CUdevice> {
    let mut d: sys::CUdevice = 0;
    // SAFETY: `d` is a valid out-pointer for the duration of the call.
    res(unsafe { sys::cuDeviceGet(&mut d, ordinal) })?;
    Ok(d)
}

/// `cuDeviceGetName`.
pub(crate) fn device_name(dev: sys::CUdevice) -> DResult<String> {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the driver writes at most `len` bytes (NUL included) into `buf`.
    res(unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int - 1, dev) })?;
    // SAFETY: the buffer's last byte is never written by the driver (len - 1
    // was passed) and stays 0, so the string is NUL-terminated in bounds.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(s.to_string_lossy().into_owned())
}

/// `cuDevicePrimaryCtxRetain`.
pub(crate) fn primary_ctx_retain(dev: sys::CUdevice) -> DResult<sys::CUcontext> {
    let mut ctx: sys::CUcontext = ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; `dev` came from cuDeviceGet.
    res(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) })?;
    Ok(ctx)
}

/// `cuDevicePrimaryCtxRelease_v2`.
pub(crate) fn primary_ctx_release(dev: sys::CUdevice) -> DResult<()> {
    // SAFETY: called once per successful retain of `dev`'s primary context.
    res(unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) })
}

/// `cuCtxGetCurrent`.
pub(crate) fn ctx_get_current() -> DResult<sys::CUcontext> {
    let mut ctx: sys::CUcontext = ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer for the duration of the call.
    res(unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    Ok(ctx)
}

/// `cuCtxSetCurrent`.
pub(crate) fn ctx_set_current(ctx: sys::CUcontext) -> DResult<()> {
    // SAFETY: `ctx` is null or a live (retained) context (module invariant).
    res(unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// `cuCtxSynchronize`.
pub(crate) fn ctx_synchronize() -> DResult<()> {
    // SAFETY: no pointers.
    res(unsafe { sys::cuCtxSynchronize() })
}

/// `cuMemAlloc_v2`.
pub(crate) fn mem_alloc(size: usize) -> DResult<sys::CUdeviceptr> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: `p` is a valid out-pointer for the duration of the call.
    res(unsafe { sys::cuMemAlloc_v2(&mut p, size) })?;
    Ok(p)
}

/// `cuMemFree_v2`.
pub(crate) fn mem_free(p: sys::CUdeviceptr) -> DResult<()> {
    // SAFETY: device pointers are validated by the driver (module invariant).
    res(unsafe { sys::cuMemFree_v2(p) })
}

/// `cuMemGetInfo_v2`: (free, total).
pub(crate) fn mem_get_info() -> DResult<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-pointers are valid for the duration of the call.
    res(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
    Ok((free, total))
}

/// `cuEventCreate` with the given flags.
pub(crate) fn event_create(flags: c_uint) -> DResult<sys::CUevent> {
    let mut e: sys::CUevent = ptr::null_mut();
    // SAFETY: `e` is a valid out-pointer for the duration of the call.
    res(unsafe { sys::cuEventCreate(&mut e, flags) })?;
    Ok(e)
}

/// `cuEventDestroy_v2`.
pub(crate) fn event_destroy(e: sys::CUevent) -> DResult<()> {
    // SAFETY: `e` is a live event, destroyed once (module invariant).
    res(unsafe { sys::cuEventDestroy_v2(e) })
}

/// `cuEventRecord`.
pub(crate) fn event_record(e: sys::CUevent, s: sys::CUstream) -> DResult<()> {
    // SAFETY: live handles (module invariant).
    res(unsafe { sys::cuEventRecord(e, s) })
}

/// `cuEventQuery`: `Ok(true)` when complete, `Ok(false)` on `CUDA_ERROR_NOT_READY`.
pub(crate) fn event_query(e: sys::CUevent) -> DResult<bool> {
    // SAFETY: live handle (module invariant).
    match unsafe { sys::cuEventQuery(e) } {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => Err(DriverError(other)),
    }
}

/// `cuStreamQuery`: `Ok(true)` when all work submitted to the stream has
/// completed, `Ok(false)` on `CUDA_ERROR_NOT_READY`.
pub(crate) fn stream_query(s: sys::CUstream) -> DResult<bool> {
    // SAFETY: live handle (module invariant).
    match unsafe { sys::cuStreamQuery(s) } {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => Err(DriverError(other)),
    }
}

/// `cuEventSynchronize`.
pub(crate) fn event_synchronize(e: sys::CUevent) -> DResult<()> {
    // SAFETY: live handle (module invariant).
    res(unsafe { sys::cuEventSynchronize(e) })
}

/// `cuStreamWaitEvent` (flags 0).
pub(crate) fn stream_wait_event(s: sys::CUstream, e: sys::CUevent) -> DResult<()> {
    // SAFETY: live handles (module invariant).
    res(unsafe { sys::cuStreamWaitEvent(s, e, 0) })
}

/// `cuStreamCreate`.
pub(crate) fn stream_create(flags: c_uint) -> DResult<sys::CUstream> {
    let mut s: sys::CUstream = ptr::null_mut();
    // SAFETY: `s` is a valid out-pointer for the duration of the call.
    res(unsafe { sys::cuStreamCreate(&mut s, flags) })?;
    Ok(s)
}

/// `cuStreamDestroy_v2`.
pub(crate) fn stream_destroy(s: sys::CUstream) -> DResult<()> {
    // SAFETY: `s` is a live stream created by this crate, destroyed once.
    res(unsafe { sys::cuStreamDestroy_v2(s) })
}

/// `cuStreamSynchronize`.
pub(crate) fn stream_synchronize(s: sys::CUstream) -> DResult<()> {
    // SAFETY: live handle (module invariant).
    res(unsafe { sys::cuStreamSynchronize(s) })
}

/// `cuMemsetD8Async`.
pub(crate) fn memset_d8_async(
    dst: sys::CUdeviceptr,
    value: u8,
    len: usize,
    s: sys::CUstream,
) -> DResult<()> {
    // SAFETY: device pointer validated by the driver; live stream.
    res(unsafe { sys::cuMemsetD8Async(dst, value, len, s) })
}

/// `cuMemcpyDtoDAsync_v2`.
pub(crate) fn memcpy_dtod_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    len: usize,
    s: sys::CUstream,
) -> DResult<()> {
    // SAFETY: device pointers validated by the driver; live stream.
    res(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, s) })
}

/// `cuMemcpyDtoH_v2` into the whole of `dst` (synchronous).
pub(crate) fn memcpy_dtoh(dst: &mut [u8], src: sys::CUdeviceptr) -> DResult<()> {
    // SAFETY: the driver writes exactly `dst.len()` bytes into `dst`, which is
    // an exclusively borrowed host buffer of that length; the copy is
    // synchronous, so the borrow outlives it.
    res(unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast::<c_void>(), src, dst.len()) })
}

/// `cuMemcpyHtoD_v2` from the whole of `src` (synchronous for pageable memory).
pub(crate) fn memcpy_htod(dst: sys::CUdeviceptr, src: &[u8]) -> DResult<()> {
    // SAFETY: the driver reads exactly `src.len()` bytes from `src`; for
    // pageable host memory cuMemcpyHtoD returns only once the source has been
    // consumed, so the borrow outlives the read.
    res(unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast::<c_void>(), src.len()) })
}

/// Host function run by [`launch_sleep`]: sleeps for `user` milliseconds.
/// It reads the duration from the pointer's address and dereferences nothing.
extern "C" fn host_sleep(user: *mut c_void) {
    std::thread::sleep(std::time::Duration::from_millis(user.addr() as u64));
}

/// `cuLaunchHostFunc` with a host function that sleeps `ms` milliseconds,
/// holding back every later operation on `s`.
pub(crate) fn launch_sleep(s: sys::CUstream, ms: usize) -> DResult<()> {
    let user = ptr::without_provenance_mut::<c_void>(ms);
    // SAFETY: `host_sleep` never dereferences `user` (the duration is encoded
    // in the address), makes no CUDA call and cannot unwind; live stream.
    res(unsafe { sys::cuLaunchHostFunc(s, Some(host_sleep), user) })
}
