//! Virtual memory through Level Zero's `zeVirtualMem*` and
//! `zePhysicalMem*` calls: physical allocations, reservations, mappings
//! and access.

use super::*;

/// Physical device memory from `zePhysicalMemCreate`
/// ([`VirtualMemory::create_physical`]), destroyed on drop or with
/// [`VirtualMemory::release_physical`].
#[derive(Debug)]
pub struct ZePhysical {
    pub(crate) ctx: Arc<Context>,
    pub(crate) allocated: Arc<AtomicU64>,
    pub(crate) raw: u64,
    pub(crate) size: u64,
}

impl ZePhysical {
    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The raw `ze_physical_mem_handle_t`.
    pub fn as_raw(&self) -> *mut c_void {
        raw(self.raw)
    }

    /// Destroys the memory, consuming the handle whatever the driver answers.
    pub(crate) fn destroy(&mut self) -> Result<(), ZeError> {
        let h = std::mem::take(&mut self.raw);
        // SAFETY: `self` owned the handle, now 0 so it is not destroyed twice.
        let r = unsafe { result::physical_mem_destroy(&self.ctx.api, raw(self.ctx.raw), raw(h)) };
        if r.is_ok() {
            sub_allocated(&self.allocated, self.size);
        }
        r
    }
}

impl Drop for ZePhysical {
    fn drop(&mut self) {
        if self.raw != 0 {
            let _ = self.destroy();
        }
    }
}

pub(crate) fn sub_allocated(allocated: &AtomicU64, size: u64) {
    let _ = allocated.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| {
        Some(a.saturating_sub(size))
    });
}

/// Virtual memory of one Level Zero GPU ([`Backend::virtual_memory`]), in
/// the backend's context: `zeVirtualMemReserve`/`zeVirtualMemFree`,
/// `zePhysicalMemCreate`/`zePhysicalMemDestroy` of device memory,
/// `zeVirtualMemMap`/`zeVirtualMemUnmap` and
/// `zeVirtualMemSetAccessAttribute`.
///
/// A [`LevelZeroBackend`] has one when the loader has all eight calls and
/// `zeVirtualMemQueryPageSize` answers a power of two for a 2 MiB allocation;
/// that page size is the [`VirtualMemory::granularity`]. Mappings are made
/// read-write at once and [`VirtualMemory::set_access`] sets read-write
/// again (a driver that ignored the attribute call would otherwise leave
/// them inaccessible). Access attributes are per context, not per device:
/// `set_access` takes only this backend's own device index.
/// [`VirtualMemory::unmap`] first waits for every stream of the backend,
/// since `zeVirtualMemUnmap` does not wait for pending work.
#[derive(Debug)]
pub struct ZeVirtualMemory {
    pub(crate) pools: Arc<EventPools>,
    pub(crate) registry: Registry,
    pub(crate) allocated: Arc<AtomicU64>,
    pub(crate) index: DeviceIndex,
    pub(crate) granularity: u64,
}

impl ZeVirtualMemory {
    /// The capability, or `None` (see the type's docs). Called after
    /// `zeInit` succeeded.
    pub(crate) fn probe(
        pools: &Arc<EventPools>,
        registry: &Registry,
        allocated: &Arc<AtomicU64>,
        index: DeviceIndex,
    ) -> Option<Self> {
        let ctx = &pools.ctx;
        if !ctx.api.has_virtual_memory() {
            return None;
        }
        // SAFETY: the context and device are alive (held by `pools`).
        let page = unsafe {
            result::virtual_mem_query_page_size(
                &ctx.api,
                raw(ctx.raw),
                raw(ctx.device),
                PAGE_QUERY_SIZE,
            )
        }
        .ok()?;
        page.is_power_of_two().then(|| Self {
            pools: pools.clone(),
            registry: registry.clone(),
            allocated: allocated.clone(),
            index,
            granularity: page as u64,
        })
    }

    pub(crate) fn ctx(&self) -> &Context {
        &self.pools.ctx
    }

    /// `v` as `size_t`, or a typed error naming `call`.
    pub(crate) fn size(call: &'static str, v: u64) -> Result<usize, BackendError> {
        usize::try_from(v).map_err(|_| {
            BackendError::new(
                NAME,
                call,
                i64::from(sys::ZE_RESULT_ERROR_INVALID_SIZE),
                format!("{v} does not fit in size_t"),
            )
        })
    }
}

pub(crate) fn alloc_err(e: ZeError) -> DeviceAllocError {
    if e.code == sys::ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY {
        DeviceAllocError::OutOfMemory
    } else {
        DeviceAllocError::Backend(backend_error(e))
    }
}

impl VirtualMemory for ZeVirtualMemory {
    type Physical = ZePhysical;

    fn granularity(&self) -> Result<u64, BackendError> {
        Ok(self.granularity)
    }

    fn reserve(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let size = usize::try_from(size).map_err(|_| DeviceAllocError::OutOfMemory)?;
        let ctx = self.ctx();
        // SAFETY: the context is alive (held by `self.pools`).
        unsafe { result::virtual_mem_reserve(&ctx.api, raw(ctx.raw), size) }
            .map(handle)
            .map_err(alloc_err)
    }

    fn unreserve(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let size = Self::size("zeVirtualMemFree", size)?;
        let ctx = self.ctx();
        // SAFETY: the context is alive; the VirtualMemory contract: a whole
        // reservation with nothing mapped, which the driver checks.
        unsafe { result::virtual_mem_free(&ctx.api, raw(ctx.raw), raw(addr), size) }
            .map_err(backend_error)
    }

    fn create_physical(&self, size: u64) -> Result<ZePhysical, DeviceAllocError> {
        let bytes = usize::try_from(size).map_err(|_| DeviceAllocError::OutOfMemory)?;
        let ctx = self.ctx();
        // SAFETY: the context and device are alive (held by `self.pools`).
        let h =
            unsafe { result::physical_mem_create(&ctx.api, raw(ctx.raw), raw(ctx.device), bytes) }
                .map_err(alloc_err)?;
        self.allocated.fetch_add(size, Ordering::Relaxed);
        Ok(ZePhysical {
            ctx: self.pools.ctx.clone(),
            allocated: self.allocated.clone(),
            raw: handle(h),
            size,
        })
    }

    fn release_physical(&self, mut physical: ZePhysical) -> Result<(), BackendError> {
        physical.destroy().map_err(backend_error)
    }

    fn map(&self, addr: u64, size: u64, physical: &ZePhysical) -> Result<(), BackendError> {
        if size != physical.size {
            return Err(BackendError::new(
                NAME,
                "zeVirtualMemMap",
                i64::from(sys::ZE_RESULT_ERROR_INVALID_SIZE),
                format!(
                    "mapping {size} bytes of a {} byte physical allocation (all of it is mapped)",
                    physical.size
                ),
            ));
        }
        let bytes = Self::size("zeVirtualMemMap", size)?;
        let ctx = self.ctx();
        // SAFETY: the context is alive, `physical` is live memory of it of
        // `size` bytes; the range is in a reservation per the VirtualMemory
        // contract, which the driver checks.
        unsafe {
            result::virtual_mem_map(
                &ctx.api,
                raw(ctx.raw),
                raw(addr),
                bytes,
                physical.as_raw(),
                sys::ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE,
            )
        }
        .map_err(backend_error)
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let size = Self::size("zeVirtualMemUnmap", size)?;
        // zeVirtualMemUnmap does not wait for pending work.
        synchronize_lists(&self.pools, &self.registry)?;
        let ctx = self.ctx();
        // SAFETY: the context is alive; every stream is synchronized above;
        // the driver checks that the range is mapped.
        unsafe { result::virtual_mem_unmap(&ctx.api, raw(ctx.raw), raw(addr), size) }
            .map_err(backend_error)
    }

    fn set_access(&self, addr: u64, size: u64, device: DeviceIndex) -> Result<(), BackendError> {
        const CALL: &str = "zeVirtualMemSetAccessAttribute";
        if device != self.index {
            return Err(BackendError::new(
                NAME,
                CALL,
                i64::from(sys::ZE_RESULT_ERROR_UNSUPPORTED_FEATURE),
                format!(
                    "access from device {device}: Level Zero sets access per context, and this \
                     backend's context serves device {} only",
                    self.index
                ),
            ));
        }
        let size = Self::size(CALL, size)?;
        let ctx = self.ctx();
        // SAFETY: the context is alive; the driver checks that the range is mapped.
        unsafe {
            result::virtual_mem_set_access(
                &ctx.api,
                raw(ctx.raw),
                raw(addr),
                size,
                sys::ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE,
            )
        }
        .map_err(backend_error)
    }
}
