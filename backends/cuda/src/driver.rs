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

/// `cuThreadExchangeStreamCaptureMode`: sets this thread's capture mode and
/// returns the previous one (as the raw enum value).
pub(crate) fn exchange_capture_mode(mode: sys::CUstreamCaptureMode) -> DResult<u32> {
    let mut m: u32 = mode as u32;
    // SAFETY: `m` is a valid in/out location of the enum's size (repr(u32));
    // reading it back as a u32 is valid for any value the driver writes.
    res(unsafe {
        sys::cuThreadExchangeStreamCaptureMode((&raw mut m).cast::<sys::CUstreamCaptureMode>())
    })?;
    Ok(m)
}

/// Restores a capture mode returned by [`exchange_capture_mode`].
pub(crate) fn restore_capture_mode(raw: u32) -> DResult<()> {
    let mut m: u32 = raw;
    // SAFETY: as in `exchange_capture_mode`; `raw` is a value the driver
    // itself returned, so it is a valid mode for the driver.
    res(unsafe {
        sys::cuThreadExchangeStreamCaptureMode((&raw mut m).cast::<sys::CUstreamCaptureMode>())
    })
}

/// What `cuStreamGetCaptureInfo_v3` reports, with the terminal nodes copied.
pub(crate) struct RawCaptureInfo {
    pub status: u32,
    pub id: u64,
    pub graph: sys::CUgraph,
    pub deps: Vec<sys::CUgraphNode>,
}

/// `cuStreamGetCaptureInfo_v3`; the dependency array is copied at once (it is
/// only valid until the next call on the stream).
pub(crate) fn stream_get_capture_info(s: sys::CUstream) -> DResult<RawCaptureInfo> {
    let mut status: u32 = 0;
    let mut id: u64 = 0;
    let mut graph: sys::CUgraph = ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = ptr::null();
    let mut n: usize = 0;
    // SAFETY: every out-pointer is valid for the call; the status is written
    // into a u32 (the enum is repr(u32)) so any value is readable.
    res(unsafe {
        sys::cuStreamGetCaptureInfo_v3(
            s,
            (&raw mut status).cast::<sys::CUstreamCaptureStatus>(),
            &mut id,
            &mut graph,
            &mut deps,
            &mut edges,
            &mut n,
        )
    })?;
    let deps = if deps.is_null() || n == 0 {
        Vec::new()
    } else {
        // SAFETY: the driver returned `n` nodes at `deps`, valid until the
        // next call on this stream; we copy them out immediately.
        unsafe { std::slice::from_raw_parts(deps, n) }.to_vec()
    };
    Ok(RawCaptureInfo {
        status,
        id,
        graph,
        deps,
    })
}

/// `cuGraphNodeGetDependencies_v2` (count, then fill).
pub(crate) fn graph_node_get_dependencies(
    node: sys::CUgraphNode,
) -> DResult<Vec<sys::CUgraphNode>> {
    let mut n: usize = 0;
    // SAFETY: with null node and edge arrays (the driver rejects edge data
    // without a node array) it only writes the count to `n`.
    res(unsafe {
        sys::cuGraphNodeGetDependencies_v2(node, ptr::null_mut(), ptr::null_mut(), &mut n)
    })?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut nodes: Vec<sys::CUgraphNode> = vec![ptr::null_mut(); n];
    let blank = sys::CUgraphEdgeData {
        from_port: 0,
        to_port: 0,
        type_: 0,
        reserved: [0; 5],
    };
    let mut edges = vec![blank; n];
    let mut filled = n;
    // SAFETY: `nodes` and `edges` have room for `filled` entries, and the
    // driver writes at most that many, updating `filled`.
    res(unsafe {
        sys::cuGraphNodeGetDependencies_v2(
            node,
            nodes.as_mut_ptr(),
            edges.as_mut_ptr(),
            &mut filled,
        )
    })?;
    nodes.truncate(filled.min(n));
    Ok(nodes)
}

/// `cuGraphAddEmptyNode`.
pub(crate) fn graph_add_empty_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
) -> DResult<sys::CUgraphNode> {
    let mut node: sys::CUgraphNode = ptr::null_mut();
    let deps_ptr = if deps.is_empty() {
        ptr::null()
    } else {
        deps.as_ptr()
    };
    // SAFETY: the driver reads `deps.len()` nodes from `deps_ptr` and writes
    // the new node to a valid out-pointer; live graph (module invariant).
    res(unsafe { sys::cuGraphAddEmptyNode(&mut node, graph, deps_ptr, deps.len()) })?;
    Ok(node)
}

/// `cuStreamUpdateCaptureDependencies_v2` without edge data.
pub(crate) fn stream_update_capture_dependencies(
    s: sys::CUstream,
    nodes: &mut [sys::CUgraphNode],
    flags: c_uint,
) -> DResult<()> {
    let nodes_ptr = if nodes.is_empty() {
        ptr::null_mut()
    } else {
        nodes.as_mut_ptr()
    };
    // SAFETY: the driver reads `nodes.len()` nodes from `nodes_ptr` (the
    // pointer is non-const in the C prototype only); null edge data means
    // default edges; live stream (module invariant).
    res(unsafe {
        sys::cuStreamUpdateCaptureDependencies_v2(s, nodes_ptr, ptr::null(), nodes.len(), flags)
    })
}

/// `cuStreamBeginCapture_v2`.
pub(crate) fn stream_begin_capture(
    s: sys::CUstream,
    mode: sys::CUstreamCaptureMode,
) -> DResult<()> {
    // SAFETY: live stream (module invariant); mode is a valid enum value.
    res(unsafe { sys::cuStreamBeginCapture_v2(s, mode) })
}

/// `cuStreamEndCapture`.
pub(crate) fn stream_end_capture(s: sys::CUstream) -> DResult<sys::CUgraph> {
    let mut g: sys::CUgraph = ptr::null_mut();
    // SAFETY: valid out-pointer; live stream (module invariant).
    res(unsafe { sys::cuStreamEndCapture(s, &mut g) })?;
    Ok(g)
}

/// `cuGraphDestroy`.
pub(crate) fn graph_destroy(g: sys::CUgraph) -> DResult<()> {
    // SAFETY: `g` is a live graph owned by this crate, destroyed once.
    res(unsafe { sys::cuGraphDestroy(g) })
}

/// `cuGraphGetNodes` (count, then fill).
pub(crate) fn graph_get_nodes(g: sys::CUgraph) -> DResult<Vec<sys::CUgraphNode>> {
    let mut n: usize = 0;
    // SAFETY: with a null array the driver only writes the count.
    res(unsafe { sys::cuGraphGetNodes(g, ptr::null_mut(), &mut n) })?;
    let mut nodes: Vec<sys::CUgraphNode> = vec![ptr::null_mut(); n];
    let mut filled = n;
    if n > 0 {
        // SAFETY: `nodes` has room for `filled` entries; the driver writes at
        // most that many and updates `filled`.
        res(unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut filled) })?;
    }
    nodes.truncate(filled.min(n));
    Ok(nodes)
}

/// `cuGraphNodeGetType`, as the raw enum value.
pub(crate) fn graph_node_get_type(node: sys::CUgraphNode) -> DResult<u32> {
    let mut t: u32 = 0;
    // SAFETY: the type is written into a u32 (the enum is repr(u32)), so
    // values unknown to these bindings are still readable.
    res(unsafe { sys::cuGraphNodeGetType(node, (&raw mut t).cast::<sys::CUgraphNodeType>()) })?;
    Ok(t)
}

/// `cuGraphInstantiateWithFlags` (flags 0).
pub(crate) fn graph_instantiate(g: sys::CUgraph) -> DResult<sys::CUgraphExec> {
    let mut e: sys::CUgraphExec = ptr::null_mut();
    // SAFETY: valid out-pointer; live graph (module invariant).
    res(unsafe { sys::cuGraphInstantiateWithFlags(&mut e, g, 0) })?;
    Ok(e)
}

/// `cuGraphLaunch`.
pub(crate) fn graph_launch(e: sys::CUgraphExec, s: sys::CUstream) -> DResult<()> {
    // SAFETY: live handles (module invariant).
    res(unsafe { sys::cuGraphLaunch(e, s) })
}

/// `cuGraphExecDestroy`.
pub(crate) fn graph_exec_destroy(e: sys::CUgraphExec) -> DResult<()> {
    // SAFETY: `e` is a live executable graph owned by this crate, destroyed once.
    res(unsafe { sys::cuGraphExecDestroy(e) })
}

/// `cuDeviceGetAttribute`.
pub(crate) fn device_get_attribute(
    attr: sys::CUdevice_attribute,
    dev: sys::CUdevice,
) -> DResult<i32> {
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer; `dev` came from cuDeviceGet.
    res(unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) })?;
    Ok(v)
}

/// The properties of a pinned allocation in the memory of device `dev`,
/// with no shareable handle type.
pub(crate) fn device_allocation_prop(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    allocation_prop(dev, false)
}

/// [`device_allocation_prop`], exportable as a POSIX file descriptor when
/// `exportable` (what another process maps with
/// [`mem_import_posix_fd`]).
pub(crate) fn allocation_prop(dev: sys::CUdevice, exportable: bool) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: if exportable {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        },
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        },
        win32HandleMetaData: ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// `cuMemGetAllocationGranularity` of `prop`.
pub(crate) fn mem_get_allocation_granularity(
    prop: &sys::CUmemAllocationProp,
    option: sys::CUmemAllocationGranularity_flags,
) -> DResult<usize> {
    let mut g: usize = 0;
    // SAFETY: `g` is a valid out-pointer and `prop` a valid, initialised
    // property structure, both for the duration of the call.
    res(unsafe { sys::cuMemGetAllocationGranularity(&mut g, prop, option) })?;
    Ok(g)
}

/// `cuMemAddressReserve` of `size` bytes anywhere, aligned to `alignment`
/// (a power of two).
pub(crate) fn mem_address_reserve(size: usize, alignment: usize) -> DResult<sys::CUdeviceptr> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: `p` is a valid out-pointer; no address hint, flags 0.
    res(unsafe { sys::cuMemAddressReserve(&mut p, size, alignment, 0, 0) })?;
    Ok(p)
}

/// `cuMemAddressFree`.
pub(crate) fn mem_address_free(p: sys::CUdeviceptr, size: usize) -> DResult<()> {
    // SAFETY: device addresses are validated by the driver (module invariant).
    res(unsafe { sys::cuMemAddressFree(p, size) })
}

/// `cuMemCreate` of `size` bytes with `prop`.
pub(crate) fn mem_create(
    size: usize,
    prop: &sys::CUmemAllocationProp,
) -> DResult<sys::CUmemGenericAllocationHandle> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `h` is a valid out-pointer and `prop` a valid, initialised
    // property structure for the duration of the call; flags 0.
    res(unsafe { sys::cuMemCreate(&mut h, size, prop, 0) })?;
    Ok(h)
}

/// `cuMemRelease`.
pub(crate) fn mem_release(h: sys::CUmemGenericAllocationHandle) -> DResult<()> {
    // SAFETY: `h` came from cuMemCreate and is released once: the crate's
    // handle type is neither `Clone` nor `Copy` and is consumed here (an
    // invalid handle would be undefined behaviour).
    res(unsafe { sys::cuMemRelease(h) })
}

/// `cuMemMap` of all `size` bytes of `h` (offset 0) at `p`.
pub(crate) fn mem_map(
    p: sys::CUdeviceptr,
    size: usize,
    h: sys::CUmemGenericAllocationHandle,
) -> DResult<()> {
    // SAFETY: `h` is a live handle (not yet released: the caller holds the
    // crate's handle by reference); the address range is validated by the
    // driver; offset and flags 0.
    res(unsafe { sys::cuMemMap(p, size, 0, h, 0) })
}

/// `cuMemUnmap`.
pub(crate) fn mem_unmap(p: sys::CUdeviceptr, size: usize) -> DResult<()> {
    // SAFETY: device addresses are validated by the driver (module invariant).
    res(unsafe { sys::cuMemUnmap(p, size) })
}

/// `cuMemSetAccess`: makes `[p, p + size)` readable and writable from `dev`.
pub(crate) fn mem_set_access(p: sys::CUdeviceptr, size: usize, dev: sys::CUdevice) -> DResult<()> {
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the driver reads one descriptor from `&desc`, valid for the
    // call; device addresses are validated by the driver.
    res(unsafe { sys::cuMemSetAccess(p, size, &desc, 1) })
}

/// `cuIpcGetMemHandle`: the interprocess handle of the `cuMemAlloc`
/// allocation at `p`.
pub(crate) fn ipc_get_mem_handle(p: sys::CUdeviceptr) -> DResult<[u8; 64]> {
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `h` is a valid out-pointer; the address is validated by the
    // driver (module invariant).
    res(unsafe { sys::cuIpcGetMemHandle(&mut h, p) })?;
    Ok(h.reserved.map(|c| c as u8))
}

/// `cuIpcOpenMemHandle` of another process's handle, peer access enabled
/// lazily (PyTorch's flag); returns the address it is mapped at here.
pub(crate) fn ipc_open_mem_handle(handle: &[u8; 64]) -> DResult<sys::CUdeviceptr> {
    let h = sys::CUipcMemHandle {
        reserved: handle.map(|b| b as c_char),
    };
    let mut p: sys::CUdeviceptr = 0;
    let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
    // SAFETY: `p` is a valid out-pointer; the handle is passed by value
    // (64 plain bytes the driver validates).
    res(unsafe { sys::cuIpcOpenMemHandle_v2(&mut p, h, flags) })?;
    Ok(p)
}

/// `cuIpcCloseMemHandle` of an address [`ipc_open_mem_handle`] returned.
pub(crate) fn ipc_close_mem_handle(p: sys::CUdeviceptr) -> DResult<()> {
    // SAFETY: the address is validated by the driver (module invariant).
    res(unsafe { sys::cuIpcCloseMemHandle(p) })
}

/// `cuMemExportToShareableHandle` as a POSIX file descriptor (owned by the
/// caller, who closes it).
pub(crate) fn mem_export_posix_fd(h: sys::CUmemGenericAllocationHandle) -> DResult<c_int> {
    let mut fd: c_int = -1;
    // SAFETY: for the POSIX file descriptor type the driver writes one
    // `int` through the pointer, here a valid `c_int`; `h` is a live
    // handle (the caller holds it by reference).
    res(unsafe {
        sys::cuMemExportToShareableHandle(
            (&mut fd as *mut c_int).cast::<c_void>(),
            h,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    Ok(fd)
}

/// `cuMemImportFromShareableHandle` of a POSIX file descriptor of this
/// process (the caller still owns and closes it).
pub(crate) fn mem_import_posix_fd(fd: c_int) -> DResult<sys::CUmemGenericAllocationHandle> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `h` is a valid out-pointer; for the POSIX file descriptor
    // type the "OS handle" argument is the descriptor's value itself, cast
    // to a pointer (the driver's documented convention), never
    // dereferenced as memory.
    res(unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut h,
            fd as usize as *mut c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    })?;
    Ok(h)
}

/// A file descriptor of process `pid`, duplicated into this one
/// (`pidfd_open` + `pidfd_getfd`, Linux 5.6+): how a shareable handle
/// another process exported reaches this one (PyTorch's scheme).
pub(crate) fn fd_of_process(pid: c_int, fd: c_int) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: a plain syscall with integer arguments; the result is a new
    // descriptor (owned below) or -1 with errno set.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `pidfd` is a descriptor the syscall just returned, owned by
    // nothing else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as c_int) };
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall with integer arguments (`pidfd` is live).
    let mine = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if mine < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor of this process, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(mine as c_int) })
}

/// Closes a file descriptor [`mem_export_posix_fd`] returned.
pub(crate) fn close_fd(fd: c_int) {
    use std::os::fd::{FromRawFd, OwnedFd};
    if fd >= 0 {
        // SAFETY: `fd` came from `mem_export_posix_fd` and is closed once
        // (its owner, the crate's physical handle, is consumed on release).
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
}

/// The driver's name and description of an error code (never fails).
pub(crate) fn describe(e: &DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    let text = e
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if text.is_empty() {
        name
    } else {
        format!("{name}: {text}")
    }
}
