//! Device attributes, virtual memory (`cuMem*`) and interprocess sharing
//! (IPC handles, POSIX file descriptors).

use super::*;

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
