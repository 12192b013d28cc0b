//! Thin, `Result`-returning wrappers over the raw [`ZeApi`] entries: one
//! function per driver call, no policy. Functions that take raw handles are
//! `unsafe`: the caller vouches that the handles are live.
#![allow(non_upper_case_globals)] // vendor constant names in patterns

use std::ffi::c_void;
use std::fmt;

use cachalot_level_zero_sys::*;

/// A failed Level Zero call: the `ze_result_t` and the call's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeError {
    /// The call that failed.
    pub call: &'static str,
    /// The `ze_result_t` it returned.
    pub code: ze_result_t,
}

impl fmt::Display for ZeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} returned {:#x} ({})",
            self.call,
            self.code,
            result_name(self.code)
        )
    }
}

impl std::error::Error for ZeError {}

/// The header's name of a `ze_result_t`.
pub fn result_name(code: ze_result_t) -> &'static str {
    match code {
        ZE_RESULT_SUCCESS => "ZE_RESULT_SUCCESS",
        ZE_RESULT_NOT_READY => "ZE_RESULT_NOT_READY",
        ZE_RESULT_ERROR_DEVICE_LOST => "ZE_RESULT_ERROR_DEVICE_LOST",
        ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY => "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY",
        ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY => "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
        ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE => "ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE",
        ZE_RESULT_ERROR_UNINITIALIZED => "ZE_RESULT_ERROR_UNINITIALIZED",
        ZE_RESULT_ERROR_UNSUPPORTED_FEATURE => "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
        ZE_RESULT_ERROR_INVALID_ARGUMENT => "ZE_RESULT_ERROR_INVALID_ARGUMENT",
        ZE_RESULT_ERROR_INVALID_NULL_HANDLE => "ZE_RESULT_ERROR_INVALID_NULL_HANDLE",
        ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE => "ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE",
        ZE_RESULT_ERROR_INVALID_SIZE => "ZE_RESULT_ERROR_INVALID_SIZE",
        ZE_RESULT_ERROR_UNSUPPORTED_SIZE => "ZE_RESULT_ERROR_UNSUPPORTED_SIZE",
        ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT => "ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT",
        ZE_RESULT_ERROR_UNKNOWN => "ZE_RESULT_ERROR_UNKNOWN",
        _ => "unrecognized ze_result_t",
    }
}

#[inline]
fn check(call: &'static str, code: ze_result_t) -> Result<(), ZeError> {
    if code == ZE_RESULT_SUCCESS {
        Ok(())
    } else {
        Err(ZeError { call, code })
    }
}

/// The error of a call the loader lacks.
fn missing(call: &'static str) -> ZeError {
    ZeError {
        call,
        code: ZE_RESULT_ERROR_UNSUPPORTED_FEATURE,
    }
}

/// `zeInit`. If it fails, no other `ze*` function may be called (a known
/// loader crash otherwise).
pub fn init(api: &ZeApi, flags: ze_init_flags_t) -> Result<(), ZeError> {
    // SAFETY: plain value argument.
    check("zeInit", unsafe { (api.zeInit)(flags) })
}

/// `zeDriverGet`, count then fill. Only after a successful [`init`].
pub fn drivers(api: &ZeApi) -> Result<Vec<ze_driver_handle_t>, ZeError> {
    let mut n = 0u32;
    // SAFETY: null array asks for the count; `n` is a valid out-pointer.
    check("zeDriverGet", unsafe {
        (api.zeDriverGet)(&mut n, std::ptr::null_mut())
    })?;
    let mut v = vec![std::ptr::null_mut(); n as usize];
    if n > 0 {
        // SAFETY: `v` has room for `n` handles.
        check("zeDriverGet", unsafe {
            (api.zeDriverGet)(&mut n, v.as_mut_ptr())
        })?;
        v.truncate(n as usize);
    }
    Ok(v)
}

/// `zeDeviceGet`, count then fill.
///
/// # Safety
/// `driver` must come from [`drivers`].
pub unsafe fn devices(
    api: &ZeApi,
    driver: ze_driver_handle_t,
) -> Result<Vec<ze_device_handle_t>, ZeError> {
    let mut n = 0u32;
    // SAFETY: null array asks for the count; the caller vouches for `driver`.
    check("zeDeviceGet", unsafe {
        (api.zeDeviceGet)(driver, &mut n, std::ptr::null_mut())
    })?;
    let mut v = vec![std::ptr::null_mut(); n as usize];
    if n > 0 {
        // SAFETY: `v` has room for `n` handles.
        check("zeDeviceGet", unsafe {
            (api.zeDeviceGet)(driver, &mut n, v.as_mut_ptr())
        })?;
        v.truncate(n as usize);
    }
    Ok(v)
}

/// `zeDeviceGetCommandQueueGroupProperties`: the flags of each group.
///
/// # Safety
/// `device` must be live.
pub unsafe fn queue_group_flags(
    api: &ZeApi,
    device: ze_device_handle_t,
) -> Result<Vec<ze_command_queue_group_property_flags_t>, ZeError> {
    const CALL: &str = "zeDeviceGetCommandQueueGroupProperties";
    let f = api.zeDeviceGetCommandQueueGroupProperties;
    let mut n = 0u32;
    // SAFETY: null array asks for the count; the caller vouches for `device`.
    check(CALL, unsafe { f(device, &mut n, std::ptr::null_mut()) })?;
    let blank = ze_command_queue_group_properties_t {
        stype: ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES,
        pNext: std::ptr::null_mut(),
        flags: 0,
        maxMemoryFillPatternSize: 0,
        numQueues: 0,
    };
    let mut v = vec![blank; n as usize];
    if n > 0 {
        // SAFETY: `v` holds `n` initialized property structs.
        check(CALL, unsafe { f(device, &mut n, v.as_mut_ptr()) })?;
        v.truncate(n as usize);
    }
    Ok(v.into_iter().map(|p| p.flags).collect())
}

/// `zeDeviceGetMemoryProperties`: the total size of each memory.
///
/// # Safety
/// `device` must be live.
pub unsafe fn memory_sizes(api: &ZeApi, device: ze_device_handle_t) -> Result<Vec<u64>, ZeError> {
    const CALL: &str = "zeDeviceGetMemoryProperties";
    let f = api.zeDeviceGetMemoryProperties;
    let mut n = 0u32;
    // SAFETY: null array asks for the count; the caller vouches for `device`.
    check(CALL, unsafe { f(device, &mut n, std::ptr::null_mut()) })?;
    let blank = ze_device_memory_properties_t {
        stype: ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES,
        pNext: std::ptr::null_mut(),
        flags: 0,
        maxClockRate: 0,
        maxBusWidth: 0,
        totalSize: 0,
        name: [0; ZE_MAX_DEVICE_NAME],
    };
    let mut v = vec![blank; n as usize];
    if n > 0 {
        // SAFETY: `v` holds `n` initialized property structs.
        check(CALL, unsafe { f(device, &mut n, v.as_mut_ptr()) })?;
        v.truncate(n as usize);
    }
    Ok(v.into_iter().map(|p| p.totalSize).collect())
}

/// `zeContextCreate`.
///
/// # Safety
/// `driver` must come from [`drivers`].
pub unsafe fn context_create(
    api: &ZeApi,
    driver: ze_driver_handle_t,
) -> Result<ze_context_handle_t, ZeError> {
    let desc = ze_context_desc_t {
        stype: ZE_STRUCTURE_TYPE_CONTEXT_DESC,
        pNext: std::ptr::null(),
        flags: 0,
    };
    let mut ctx = std::ptr::null_mut();
    // SAFETY: `desc` and `ctx` are valid for the call; the caller vouches for `driver`.
    check("zeContextCreate", unsafe {
        (api.zeContextCreate)(driver, &desc, &mut ctx)
    })?;
    Ok(ctx)
}

/// `zeContextDestroy`.
///
/// # Safety
/// `ctx` must be live, with every object created in it destroyed, and unused afterwards.
pub unsafe fn context_destroy(api: &ZeApi, ctx: ze_context_handle_t) -> Result<(), ZeError> {
    // SAFETY: the caller's guarantee.
    check("zeContextDestroy", unsafe { (api.zeContextDestroy)(ctx) })
}

/// `zeCommandListCreateImmediate` on queue group `ordinal`, asynchronous mode.
///
/// # Safety
/// `ctx` and `device` must be live.
pub unsafe fn immediate_list_create(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    device: ze_device_handle_t,
    ordinal: u32,
) -> Result<ze_command_list_handle_t, ZeError> {
    let desc = ze_command_queue_desc_t {
        stype: ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
        pNext: std::ptr::null(),
        ordinal,
        index: 0,
        flags: 0,
        mode: ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS,
        priority: ZE_COMMAND_QUEUE_PRIORITY_NORMAL,
    };
    let mut list = std::ptr::null_mut();
    // SAFETY: `desc` and `list` are valid for the call; the caller vouches for the handles.
    check("zeCommandListCreateImmediate", unsafe {
        (api.zeCommandListCreateImmediate)(ctx, device, &desc, &mut list)
    })?;
    Ok(list)
}

/// `zeCommandListDestroy`.
///
/// # Safety
/// `list` must be live and unused afterwards.
pub unsafe fn list_destroy(api: &ZeApi, list: ze_command_list_handle_t) -> Result<(), ZeError> {
    // SAFETY: the caller's guarantee.
    check("zeCommandListDestroy", unsafe {
        (api.zeCommandListDestroy)(list)
    })
}

/// `zeCommandListAppendBarrier(list, signal, 0, null)`: `signal` fires once
/// all work appended before it has completed.
///
/// # Safety
/// Both handles must be live.
pub unsafe fn append_barrier(
    api: &ZeApi,
    list: ze_command_list_handle_t,
    signal: ze_event_handle_t,
) -> Result<(), ZeError> {
    // SAFETY: the caller's guarantee; no wait list.
    check("zeCommandListAppendBarrier", unsafe {
        (api.zeCommandListAppendBarrier)(list, signal, 0, std::ptr::null_mut())
    })
}

/// `zeCommandListAppendWaitOnEvents(list, 1, &event)`.
///
/// # Safety
/// Both handles must be live.
pub unsafe fn append_wait(
    api: &ZeApi,
    list: ze_command_list_handle_t,
    event: ze_event_handle_t,
) -> Result<(), ZeError> {
    let mut ev = event;
    // SAFETY: `ev` is one valid handle slot; the caller vouches for the handles.
    check("zeCommandListAppendWaitOnEvents", unsafe {
        (api.zeCommandListAppendWaitOnEvents)(list, 1, &mut ev)
    })
}

/// `zeEventPoolCreate` of `count` host-visible events for `device`.
///
/// # Safety
/// `ctx` and `device` must be live.
pub unsafe fn event_pool_create(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    device: ze_device_handle_t,
    count: u32,
) -> Result<ze_event_pool_handle_t, ZeError> {
    let desc = ze_event_pool_desc_t {
        stype: ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
        pNext: std::ptr::null(),
        flags: ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
        count,
    };
    let mut dev = device;
    let mut pool = std::ptr::null_mut();
    // SAFETY: `desc`, `dev` and `pool` are valid for the call.
    check("zeEventPoolCreate", unsafe {
        (api.zeEventPoolCreate)(ctx, &desc, 1, &mut dev, &mut pool)
    })?;
    Ok(pool)
}

/// `zeEventPoolDestroy`.
///
/// # Safety
/// `pool` must be live, its events destroyed, and unused afterwards.
pub unsafe fn event_pool_destroy(api: &ZeApi, pool: ze_event_pool_handle_t) -> Result<(), ZeError> {
    // SAFETY: the caller's guarantee.
    check("zeEventPoolDestroy", unsafe {
        (api.zeEventPoolDestroy)(pool)
    })
}

/// `zeEventCreate` at `index` of `pool`, host scope for signal and wait.
///
/// # Safety
/// `pool` must be live and `index` free in it.
pub unsafe fn event_create(
    api: &ZeApi,
    pool: ze_event_pool_handle_t,
    index: u32,
) -> Result<ze_event_handle_t, ZeError> {
    let desc = ze_event_desc_t {
        stype: ZE_STRUCTURE_TYPE_EVENT_DESC,
        pNext: std::ptr::null(),
        index,
        signal: ZE_EVENT_SCOPE_FLAG_HOST,
        wait: ZE_EVENT_SCOPE_FLAG_HOST,
    };
    let mut ev = std::ptr::null_mut();
    // SAFETY: `desc` and `ev` are valid for the call; the caller vouches for `pool`.
    check("zeEventCreate", unsafe {
        (api.zeEventCreate)(pool, &desc, &mut ev)
    })?;
    Ok(ev)
}

/// `zeEventDestroy`.
///
/// # Safety
/// `event` must be live and unused afterwards.
pub unsafe fn event_destroy(api: &ZeApi, event: ze_event_handle_t) -> Result<(), ZeError> {
    // SAFETY: the caller's guarantee.
    check("zeEventDestroy", unsafe { (api.zeEventDestroy)(event) })
}

/// `zeEventHostReset`.
///
/// # Safety
/// `event` must be live and not pending.
pub unsafe fn event_host_reset(api: &ZeApi, event: ze_event_handle_t) -> Result<(), ZeError> {
    // SAFETY: the caller's guarantee.
    check("zeEventHostReset", unsafe { (api.zeEventHostReset)(event) })
}

/// `zeEventQueryStatus`: `Ok(true)` when signaled, `Ok(false)` on `ZE_RESULT_NOT_READY`.
///
/// # Safety
/// `event` must be live.
pub unsafe fn event_query(api: &ZeApi, event: ze_event_handle_t) -> Result<bool, ZeError> {
    // SAFETY: the caller's guarantee.
    match unsafe { (api.zeEventQueryStatus)(event) } {
        ZE_RESULT_SUCCESS => Ok(true),
        ZE_RESULT_NOT_READY => Ok(false),
        code => Err(ZeError {
            call: "zeEventQueryStatus",
            code,
        }),
    }
}

/// `zeEventHostSynchronize(event, UINT64_MAX)`.
///
/// # Safety
/// `event` must be live.
pub unsafe fn event_host_synchronize(api: &ZeApi, event: ze_event_handle_t) -> Result<(), ZeError> {
    // SAFETY: the caller's guarantee.
    check("zeEventHostSynchronize", unsafe {
        (api.zeEventHostSynchronize)(event, u64::MAX)
    })
}

/// `zeMemAllocDevice` of `size` bytes (driver-chosen alignment) from memory ordinal 0.
///
/// # Safety
/// `ctx` and `device` must be live.
pub unsafe fn mem_alloc_device(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    device: ze_device_handle_t,
    size: usize,
) -> Result<*mut c_void, ZeError> {
    let desc = ze_device_mem_alloc_desc_t {
        stype: ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC,
        pNext: std::ptr::null(),
        flags: 0,
        ordinal: 0,
    };
    let mut p = std::ptr::null_mut();
    // SAFETY: `desc` and `p` are valid for the call; the caller vouches for the handles.
    check("zeMemAllocDevice", unsafe {
        (api.zeMemAllocDevice)(ctx, &desc, size, 0, device, &mut p)
    })?;
    Ok(p)
}

/// `zeMemFree`.
///
/// # Safety
/// `ptr` must come from [`mem_alloc_device`] in `ctx`, with no work using it
/// still pending, and unused afterwards.
pub unsafe fn mem_free(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    ptr: *mut c_void,
) -> Result<(), ZeError> {
    // SAFETY: the caller's guarantee.
    check("zeMemFree", unsafe { (api.zeMemFree)(ctx, ptr) })
}

/// `zeVirtualMemQueryPageSize(ctx, device, size)`: the page size that
/// reservations and physical memory of `size` bytes align to.
///
/// # Safety
/// `ctx` and `device` must be live.
pub unsafe fn virtual_mem_query_page_size(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    device: ze_device_handle_t,
    size: usize,
) -> Result<usize, ZeError> {
    const CALL: &str = "zeVirtualMemQueryPageSize";
    let f = api.zeVirtualMemQueryPageSize.ok_or(missing(CALL))?;
    let mut page = 0usize;
    // SAFETY: `page` is a valid out-pointer; the caller vouches for the handles.
    check(CALL, unsafe { f(ctx, device, size, &mut page) })?;
    Ok(page)
}

/// `zeVirtualMemReserve(ctx, pStart = null, size)`.
///
/// # Safety
/// `ctx` must be live.
pub unsafe fn virtual_mem_reserve(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    size: usize,
) -> Result<*mut c_void, ZeError> {
    const CALL: &str = "zeVirtualMemReserve";
    let f = api.zeVirtualMemReserve.ok_or(missing(CALL))?;
    let mut p = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer; no start address is asked for.
    check(CALL, unsafe { f(ctx, std::ptr::null(), size, &mut p) })?;
    Ok(p)
}

/// `zeVirtualMemFree`.
///
/// # Safety
/// `ctx` must be live and `[ptr, ptr + size)` a reservation of it with
/// nothing mapped, unused afterwards.
pub unsafe fn virtual_mem_free(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    ptr: *const c_void,
    size: usize,
) -> Result<(), ZeError> {
    const CALL: &str = "zeVirtualMemFree";
    let f = api.zeVirtualMemFree.ok_or(missing(CALL))?;
    // SAFETY: the caller's guarantee.
    check(CALL, unsafe { f(ctx, ptr, size) })
}

/// `zePhysicalMemCreate` of `size` bytes of device memory (flags 0).
///
/// # Safety
/// `ctx` and `device` must be live.
pub unsafe fn physical_mem_create(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    device: ze_device_handle_t,
    size: usize,
) -> Result<ze_physical_mem_handle_t, ZeError> {
    const CALL: &str = "zePhysicalMemCreate";
    let f = api.zePhysicalMemCreate.ok_or(missing(CALL))?;
    let mut desc = ze_physical_mem_desc_t {
        stype: ZE_STRUCTURE_TYPE_PHYSICAL_MEM_DESC,
        pNext: std::ptr::null(),
        flags: 0,
        size,
    };
    let mut h = std::ptr::null_mut();
    // SAFETY: `desc` and `h` are valid for the call; the caller vouches for the handles.
    check(CALL, unsafe { f(ctx, device, &mut desc, &mut h) })?;
    Ok(h)
}

/// `zePhysicalMemDestroy`.
///
/// # Safety
/// `physical` must come from [`physical_mem_create`] in `ctx`, be destroyed
/// once and unused afterwards.
pub unsafe fn physical_mem_destroy(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    physical: ze_physical_mem_handle_t,
) -> Result<(), ZeError> {
    const CALL: &str = "zePhysicalMemDestroy";
    let f = api.zePhysicalMemDestroy.ok_or(missing(CALL))?;
    // SAFETY: the caller's guarantee.
    check(CALL, unsafe { f(ctx, physical) })
}

/// `zeVirtualMemMap(ctx, ptr, size, physical, offset = 0, access)`.
///
/// # Safety
/// `ctx` must be live, `[ptr, ptr + size)` in one of its reservations and
/// `physical` live memory of it of at least `size` bytes.
pub unsafe fn virtual_mem_map(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    ptr: *const c_void,
    size: usize,
    physical: ze_physical_mem_handle_t,
    access: ze_memory_access_attribute_t,
) -> Result<(), ZeError> {
    const CALL: &str = "zeVirtualMemMap";
    let f = api.zeVirtualMemMap.ok_or(missing(CALL))?;
    // SAFETY: the caller's guarantee.
    check(CALL, unsafe { f(ctx, ptr, size, physical, 0, access) })
}

/// `zeVirtualMemUnmap`.
///
/// # Safety
/// `ctx` must be live and `[ptr, ptr + size)` mapped with no work using it pending.
pub unsafe fn virtual_mem_unmap(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    ptr: *const c_void,
    size: usize,
) -> Result<(), ZeError> {
    const CALL: &str = "zeVirtualMemUnmap";
    let f = api.zeVirtualMemUnmap.ok_or(missing(CALL))?;
    // SAFETY: the caller's guarantee.
    check(CALL, unsafe { f(ctx, ptr, size) })
}

/// `zeVirtualMemSetAccessAttribute`.
///
/// # Safety
/// `ctx` must be live and `[ptr, ptr + size)` mapped.
pub unsafe fn virtual_mem_set_access(
    api: &ZeApi,
    ctx: ze_context_handle_t,
    ptr: *const c_void,
    size: usize,
    access: ze_memory_access_attribute_t,
) -> Result<(), ZeError> {
    const CALL: &str = "zeVirtualMemSetAccessAttribute";
    let f = api.zeVirtualMemSetAccessAttribute.ok_or(missing(CALL))?;
    // SAFETY: the caller's guarantee.
    check(CALL, unsafe { f(ctx, ptr, size, access) })
}
