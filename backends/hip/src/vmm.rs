//! Virtual memory through HIP's `hipMem*` calls: physical allocations,
//! reservations, mappings and access.

use super::*;

/// Physical device memory from `hipMemCreate` ([`VirtualMemory::create_physical`]),
/// released on drop or with [`VirtualMemory::release_physical`].
#[derive(Debug)]
pub struct HipPhysical {
    pub(crate) api: Arc<HipApi>,
    pub(crate) raw: u64,
    pub(crate) size: u64,
}

impl HipPhysical {
    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The raw `hipMemGenericAllocationHandle_t`.
    pub fn as_raw(&self) -> *mut c_void {
        self.raw as usize as *mut c_void
    }
}

impl Drop for HipPhysical {
    fn drop(&mut self) {
        if self.raw != 0 {
            // SAFETY: the handle is owned by `self` and never used again.
            let _ = unsafe { result::mem_release(&self.api, self.as_raw()) };
        }
    }
}

/// Virtual memory of one HIP device ([`Backend::virtual_memory`]):
/// `hipMemAddressReserve`/`hipMemAddressFree`, `hipMemCreate`/`hipMemRelease`
/// of pinned device memory, `hipMemMap`/`hipMemUnmap` and `hipMemSetAccess`
/// (read-write), with the minimum granularity of
/// `hipMemGetAllocationGranularity`.
///
/// A [`HipBackend`] has one when the runtime has all eight calls, the device
/// does not deny support (`hipDeviceAttributeVirtualMemoryManagementSupported`
/// is 0; runtimes that predate the attribute are asked nothing more), the
/// runtime reports its version (the layout of `hipMemAllocationProp` changed
/// in ROCm 5.3, see [`sys::hipMemAllocationProp`]) and the granularity query
/// succeeds with a power of two. Each call makes the device current for its
/// duration, as [`Backend::malloc`] does.
#[derive(Debug, Clone)]
pub struct HipVirtualMemory {
    pub(crate) api: Arc<HipApi>,
    pub(crate) device: c_int,
    pub(crate) layout: PropLayout,
    pub(crate) granularity: u64,
}

impl HipVirtualMemory {
    /// The capability of `device`, or `None` when it has none (see the type's docs).
    pub(crate) fn probe(api: &Arc<HipApi>, device: c_int) -> Option<Self> {
        if !api.has_virtual_memory() {
            return None;
        }
        let attr = cachalot_hip_sys::hipDeviceAttributeVirtualMemoryManagementSupported;
        match result::device_attribute(api, attr, device) {
            Ok(0) => return None,
            Ok(_) => {}
            // A runtime without the attribute (or without the call): the
            // granularity query below decides. Clear the sticky error.
            Err(_) => {
                let _ = result::get_last_error(api);
            }
        }
        let layout = PropLayout::for_runtime(result::runtime_version(api).ok()??);
        let prop = AllocationProp::pinned_on(device, layout);
        let option = cachalot_hip_sys::hipMemAllocationGranularityMinimum;
        match result::mem_get_allocation_granularity(api, &prop, option) {
            Ok(g) if g.is_power_of_two() => Some(Self {
                api: api.clone(),
                device,
                layout,
                granularity: g as u64,
            }),
            Ok(_) => None,
            Err(_) => {
                let _ = result::get_last_error(api);
                None
            }
        }
    }

    /// The `hipMemAllocationProp` layout this runtime takes.
    pub fn prop_layout(&self) -> PropLayout {
        self.layout
    }

    pub(crate) fn err(&self, e: HipError) -> BackendError {
        backend_error(&self.api, e)
    }

    /// `v` as `size_t`, or a typed error naming `call`.
    pub(crate) fn size(&self, call: &'static str, v: u64) -> Result<usize, BackendError> {
        usize::try_from(v).map_err(|_| {
            BackendError::new(
                NAME,
                call,
                i64::from(cachalot_hip_sys::hipErrorInvalidValue),
                format!("{v} does not fit in size_t"),
            )
        })
    }

    /// Maps an allocation failure: out of memory (the sticky error cleared)
    /// or a backend error.
    pub(crate) fn alloc_err(&self, e: HipError) -> DeviceAllocError {
        if e.code == cachalot_hip_sys::hipErrorOutOfMemory {
            let _ = result::get_last_error(&self.api);
            DeviceAllocError::OutOfMemory
        } else {
            DeviceAllocError::Backend(self.err(e))
        }
    }
}

pub(crate) fn as_ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

impl VirtualMemory for HipVirtualMemory {
    type Physical = HipPhysical;

    fn granularity(&self) -> Result<u64, BackendError> {
        Ok(self.granularity)
    }

    fn reserve(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let size = usize::try_from(size).map_err(|_| DeviceAllocError::OutOfMemory)?;
        let _g = DeviceGuard::new(&self.api, self.device)?;
        result::mem_address_reserve(&self.api, size, self.granularity as usize)
            .map(|p| p as usize as u64)
            .map_err(|e| self.alloc_err(e))
    }

    fn unreserve(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let size = self.size("hipMemAddressFree", size)?;
        let _g = DeviceGuard::new(&self.api, self.device)?;
        // SAFETY: the VirtualMemory contract: a whole range from `reserve`,
        // nothing mapped in it; the driver checks and reports misuse.
        unsafe { result::mem_address_free(&self.api, as_ptr(addr), size) }.map_err(|e| self.err(e))
    }

    fn create_physical(&self, size: u64) -> Result<HipPhysical, DeviceAllocError> {
        let bytes = usize::try_from(size).map_err(|_| DeviceAllocError::OutOfMemory)?;
        let _g = DeviceGuard::new(&self.api, self.device)?;
        let prop = AllocationProp::pinned_on(self.device, self.layout);
        let raw = result::mem_create(&self.api, bytes, &prop).map_err(|e| self.alloc_err(e))?;
        Ok(HipPhysical {
            api: self.api.clone(),
            raw: raw as usize as u64,
            size,
        })
    }

    fn release_physical(&self, mut physical: HipPhysical) -> Result<(), BackendError> {
        let _g = DeviceGuard::new(&self.api, self.device)?;
        let raw = std::mem::take(&mut physical.raw);
        // SAFETY: `physical` owned the handle; `raw` is now 0 so its Drop
        // does not release it again, whatever this call answers.
        unsafe { result::mem_release(&self.api, as_ptr(raw)) }.map_err(|e| self.err(e))
    }

    fn map(&self, addr: u64, size: u64, physical: &HipPhysical) -> Result<(), BackendError> {
        if size != physical.size {
            return Err(BackendError::new(
                NAME,
                "hipMemMap",
                i64::from(cachalot_hip_sys::hipErrorInvalidValue),
                format!(
                    "mapping {size} bytes of a {} byte physical allocation (all of it is mapped)",
                    physical.size
                ),
            ));
        }
        let bytes = self.size("hipMemMap", size)?;
        let _g = DeviceGuard::new(&self.api, self.device)?;
        // SAFETY: `physical` is live and `size` bytes; the range is the
        // caller's, in a reservation per the VirtualMemory contract, which
        // the driver checks.
        unsafe { result::mem_map(&self.api, as_ptr(addr), bytes, physical.as_raw()) }
            .map_err(|e| self.err(e))
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let size = self.size("hipMemUnmap", size)?;
        let _g = DeviceGuard::new(&self.api, self.device)?;
        // SAFETY: the VirtualMemory contract: a mapped range no pending work
        // uses; the driver checks the mapping.
        unsafe { result::mem_unmap(&self.api, as_ptr(addr), size) }.map_err(|e| self.err(e))
    }

    fn set_access(&self, addr: u64, size: u64, device: DeviceIndex) -> Result<(), BackendError> {
        let size = self.size("hipMemSetAccess", size)?;
        let device = c_int::try_from(device).map_err(|_| {
            BackendError::new(
                NAME,
                "hipMemSetAccess",
                i64::from(cachalot_hip_sys::hipErrorInvalidDevice),
                format!("device {device} out of range"),
            )
        })?;
        let _g = DeviceGuard::new(&self.api, self.device)?;
        // SAFETY: the range is mapped per the VirtualMemory contract; the
        // driver checks it.
        unsafe { result::mem_set_access(&self.api, as_ptr(addr), size, device) }
            .map_err(|e| self.err(e))
    }
}
