//! Virtual memory through the driver's `cuMem*` calls: physical
//! allocations, reservations, mappings and access.

use super::*;

/// Physical device memory made by [`VirtualMemory::create_physical`]: the
/// driver's `CUmemGenericAllocationHandle` and the allocation's size.
///
/// Neither `Clone` nor `Copy`, and consumed by
/// [`VirtualMemory::release_physical`], so a handle is released at most once
/// (releasing an invalid handle is undefined behaviour in CUDA). Dropping one
/// without releasing it leaks the memory, as with [`CudaEvent`].
#[derive(Debug, PartialEq, Eq)]
pub struct CudaPhysical {
    pub(crate) handle: sys::CUmemGenericAllocationHandle,
    pub(crate) size: u64,
    /// The POSIX file descriptor another process imports it with, exported
    /// at the first share and closed when the memory is released.
    pub(crate) fd: std::sync::OnceLock<std::ffi::c_int>,
}

impl CudaPhysical {
    /// The raw `CUmemGenericAllocationHandle`.
    pub fn as_raw(&self) -> sys::CUmemGenericAllocationHandle {
        self.handle
    }

    /// The allocation's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

pub(crate) fn usize_of(v: u64, call: &'static str) -> Result<usize, BackendError> {
    usize::try_from(v).map_err(|_| BackendError::new(NAME, call, 0, format!("size {v} too large")))
}

impl CudaBackend {
    /// Runs the virtual-memory driver call `f` (named `call`): fails without
    /// calling it when the device has no virtual memory, else binds the
    /// context and runs it with the capture mode relaxed.
    pub(crate) fn vmm_call<T>(
        &self,
        call: &'static str,
        f: impl FnOnce() -> driver::DResult<T>,
    ) -> Result<driver::DResult<T>, BackendError> {
        if self.ctx.vmm_granularity.is_none() {
            return Err(unsupported_vmm(call));
        }
        let _b = self.ctx.bind(call)?;
        with_relaxed_capture(f)
    }

    /// Like [`Self::vmm_call`] for a call that allocates:
    /// `CUDA_ERROR_OUT_OF_MEMORY` is `DeviceAllocError::OutOfMemory`.
    pub(crate) fn vmm_alloc<T>(
        &self,
        call: &'static str,
        f: impl FnOnce() -> driver::DResult<T>,
    ) -> Result<T, DeviceAllocError> {
        match self.vmm_call(call, f)? {
            Ok(v) => Ok(v),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(DeviceAllocError::OutOfMemory)
            }
            Err(e) => Err(to_backend(call)(e).into()),
        }
    }
}

/// Virtual memory through the driver's `cuMem*` calls (see the [crate
/// documentation](crate#virtual-memory)).
impl VirtualMemory for CudaBackend {
    type Physical = CudaPhysical;

    fn granularity(&self) -> Result<u64, BackendError> {
        self.ctx
            .vmm_granularity
            .ok_or_else(|| unsupported_vmm("cuMemGetAllocationGranularity"))
    }

    fn reserve(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let Ok(size) = usize::try_from(size) else {
            return Err(DeviceAllocError::OutOfMemory);
        };
        // Aligned to the granularity, so that every page of the range can be
        // mapped (the default alignment is not documented).
        let align = self
            .ctx
            .vmm_granularity
            .and_then(|g| usize::try_from(g).ok())
            .unwrap_or(0);
        self.vmm_alloc("cuMemAddressReserve", || {
            driver::mem_address_reserve(size, align)
        })
    }

    fn unreserve(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let size = usize_of(size, "cuMemAddressFree")?;
        self.vmm_call("cuMemAddressFree", || driver::mem_address_free(addr, size))?
            .map_err(to_backend("cuMemAddressFree"))
    }

    fn create_physical(&self, size: u64) -> Result<CudaPhysical, DeviceAllocError> {
        let Ok(bytes) = usize::try_from(size) else {
            return Err(DeviceAllocError::OutOfMemory);
        };
        let handle = self.create_shareable(bytes)?;
        Ok(CudaPhysical {
            handle,
            size,
            fd: std::sync::OnceLock::new(),
        })
    }

    fn release_physical(&self, physical: CudaPhysical) -> Result<(), BackendError> {
        if let Some(&fd) = physical.fd.get() {
            driver::close_fd(fd);
        }
        self.vmm_call("cuMemRelease", || driver::mem_release(physical.handle))?
            .map_err(to_backend("cuMemRelease"))
    }

    fn map(&self, addr: u64, size: u64, physical: &CudaPhysical) -> Result<(), BackendError> {
        if size != physical.size {
            return Err(BackendError::new(
                NAME,
                "cuMemMap",
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "the physical allocation has {} bytes but was mapped with size {size}",
                    physical.size
                ),
            ));
        }
        let size = usize_of(size, "cuMemMap")?;
        self.vmm_call("cuMemMap", || driver::mem_map(addr, size, physical.handle))?
            .map_err(to_backend("cuMemMap"))
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let size = usize_of(size, "cuMemUnmap")?;
        self.vmm_call("cuMemUnmap", || driver::mem_unmap(addr, size))?
            .map_err(to_backend("cuMemUnmap"))
    }

    fn set_access(&self, addr: u64, size: u64, device: DeviceIndex) -> Result<(), BackendError> {
        if self.ctx.vmm_granularity.is_none() {
            return Err(unsupported_vmm("cuMemSetAccess"));
        }
        let size = usize_of(size, "cuMemSetAccess")?;
        let dev = if device == self.ctx.index {
            self.ctx.dev
        } else {
            let ordinal = i32::try_from(device).map_err(|_| {
                BackendError::new(NAME, "cuMemSetAccess", 0, format!("device {device}"))
            })?;
            driver::device_get(ordinal).map_err(to_backend("cuDeviceGet"))?
        };
        self.vmm_call("cuMemSetAccess", || driver::mem_set_access(addr, size, dev))?
            .map_err(to_backend("cuMemSetAccess"))
    }

    fn export_physical(&self, physical: &CudaPhysical) -> Result<Option<i32>, BackendError> {
        self.export_fd(physical)
    }
}
