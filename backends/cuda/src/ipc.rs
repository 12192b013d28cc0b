//! Sharing device memory with other processes ([`IpcMemory`]), as PyTorch
//! does it: a `cuMemAlloc` segment by its legacy IPC handle
//! (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`), and the physical memory
//! of expandable segments by POSIX file descriptors
//! (`cuMemExportToShareableHandle`), which the receiving process takes
//! from the sender with `pidfd_getfd` and maps contiguously
//! (`cuMemImportFromShareableHandle`, `cuMemMap`).
//!
//! Physical memory is created exportable (POSIX file descriptor handle
//! type) unless `TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0` (PyTorch's switch)
//! or the device refuses it (then plain, and its pages cannot be shared).

use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cachalot_core::{BackendError, DeviceAllocError, IPC_HANDLE_BYTES, IpcMemory, VirtualMemory};
use cudarc::driver::sys;

use crate::{CudaBackend, CudaPhysical, NAME, driver, to_backend, unsupported_vmm};

/// What the backend knows of interprocess sharing.
#[derive(Debug, Default)]
pub(crate) struct IpcState {
    /// The driver has every call of [`driver::IPC_SYMBOLS`].
    symbols: bool,
    /// New physical memory is created exportable.
    exportable: AtomicBool,
    /// Mappings of other processes' pages made by `open_pages`, by address.
    opened: Mutex<HashMap<u64, Opened>>,
}

/// One `open_pages` mapping: its pages and their imported handles.
#[derive(Debug)]
struct Opened {
    page: u64,
    handles: Vec<sys::CUmemGenericAllocationHandle>,
}

impl IpcState {
    /// Looks the driver's calls and PyTorch's switch up (at context setup).
    pub(crate) fn probe(&mut self) {
        self.symbols = driver::missing_symbols(driver::IPC_SYMBOLS).is_empty();
        let off =
            std::env::var("TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC").is_ok_and(|v| v.trim() == "0");
        self.exportable = AtomicBool::new(self.symbols && !off);
    }

    /// Whether the driver can share memory at all.
    pub(crate) fn available(&self) -> bool {
        self.symbols
    }
}

fn ipc_error(call: &'static str, message: String) -> BackendError {
    BackendError::new(NAME, call, 0, message)
}

impl CudaBackend {
    /// `cuMemCreate` of `bytes` of physical memory, exportable as a POSIX
    /// file descriptor while the device accepts that.
    pub(crate) fn create_shareable(
        &self,
        bytes: usize,
    ) -> Result<sys::CUmemGenericAllocationHandle, DeviceAllocError> {
        if self.ctx.ipc.exportable.load(Ordering::Relaxed) {
            let prop = driver::allocation_prop(self.ctx.dev, true);
            match self.vmm_call("cuMemCreate", || driver::mem_create(bytes, &prop))? {
                Ok(h) => return Ok(h),
                Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                    return Err(DeviceAllocError::OutOfMemory);
                }
                Err(_) => {
                    // PyTorch falls back the same way: plain memory from
                    // now on, whose pages cannot be shared
                    self.ctx.ipc.exportable.store(false, Ordering::Relaxed);
                }
            }
        }
        let prop = driver::device_allocation_prop(self.ctx.dev);
        self.vmm_alloc("cuMemCreate", || driver::mem_create(bytes, &prop))
    }

    /// The POSIX file descriptor of `physical`, exported once and kept
    /// until it is released.
    pub(crate) fn export_fd(&self, physical: &CudaPhysical) -> Result<Option<i32>, BackendError> {
        if !self.ctx.ipc.symbols {
            return Ok(None);
        }
        if let Some(&fd) = physical.fd.get() {
            return Ok(Some(fd));
        }
        let fd = self
            .vmm_call("cuMemExportToShareableHandle", || {
                driver::mem_export_posix_fd(physical.handle)
            })?
            .map_err(to_backend("cuMemExportToShareableHandle"))?;
        if let Err(fd) = physical.fd.set(fd) {
            // another thread exported it meanwhile: keep the first
            driver::close_fd(fd);
        }
        Ok(physical.fd.get().copied())
    }

    /// Undoes a partial `open_pages`: unmaps `mapped` pages, releases the
    /// handles, frees the range.
    fn unwind_pages(
        &self,
        addr: u64,
        total: u64,
        page: u64,
        mapped: usize,
        handles: &[sys::CUmemGenericAllocationHandle],
    ) {
        let _b = self.ctx.bind("cuMemUnmap");
        for i in 0..mapped {
            let _ = driver::mem_unmap(addr + i as u64 * page, page as usize);
        }
        for &h in handles {
            let _ = driver::mem_release(h);
        }
        let _ = driver::mem_address_free(addr, total as usize);
    }
}

impl IpcMemory for CudaBackend {
    fn segment_handle(&self, base: u64) -> Result<[u8; IPC_HANDLE_BYTES], BackendError> {
        let _b = self.ctx.bind("cuIpcGetMemHandle")?;
        driver::ipc_get_mem_handle(base).map_err(to_backend("cuIpcGetMemHandle"))
    }

    fn open_segment(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<u64, BackendError> {
        let _b = self.ctx.bind("cuIpcOpenMemHandle")?;
        driver::ipc_open_mem_handle(handle).map_err(to_backend("cuIpcOpenMemHandle"))
    }

    fn close_segment(&self, addr: u64) -> Result<(), BackendError> {
        let _b = self.ctx.bind("cuIpcCloseMemHandle")?;
        driver::ipc_close_mem_handle(addr).map_err(to_backend("cuIpcCloseMemHandle"))
    }

    fn open_pages(&self, pid: i32, page: u64, handles: &[i32]) -> Result<u64, BackendError> {
        let gran = self
            .ctx
            .vmm_granularity
            .ok_or_else(|| unsupported_vmm("cuMemImportFromShareableHandle"))?;
        if handles.is_empty() || page == 0 || !page.is_multiple_of(gran) {
            return Err(ipc_error(
                "open_pages",
                format!(
                    "{} handle(s) of {page} bytes: not a whole number of {gran}-byte pages",
                    handles.len()
                ),
            ));
        }
        let total = page
            .checked_mul(handles.len() as u64)
            .filter(|&t| usize::try_from(t).is_ok())
            .ok_or_else(|| {
                ipc_error(
                    "open_pages",
                    format!("{} pages of {page} bytes", handles.len()),
                )
            })?;
        let addr = VirtualMemory::reserve(self, total).map_err(|e| match e {
            DeviceAllocError::OutOfMemory => ipc_error(
                "cuMemAddressReserve",
                format!("no address space for {total} bytes"),
            ),
            DeviceAllocError::Backend(b) => b,
        })?;
        let mut imported = Vec::with_capacity(handles.len());
        for &fd in handles {
            let mine = match driver::fd_of_process(pid, fd as c_int) {
                Ok(f) => f,
                Err(e) => {
                    self.unwind_pages(addr, total, page, 0, &imported);
                    let hint = if e.raw_os_error() == Some(libc::ENOSYS) {
                        "the kernel on this machine does not support the pidfd_open syscall needed \
                         to share expandable segments between processes (Linux 5.6+)"
                    } else {
                        "taking another process's file descriptor needs ptrace permission over it"
                    };
                    return Err(ipc_error(
                        "pidfd_getfd",
                        format!("descriptor {fd} of process {pid}: {e} ({hint})"),
                    ));
                }
            };
            let h = {
                let _b = self.ctx.bind("cuMemImportFromShareableHandle")?;
                driver::mem_import_posix_fd(mine.as_raw_fd())
            };
            drop(mine);
            match h {
                Ok(h) => imported.push(h),
                Err(e) => {
                    self.unwind_pages(addr, total, page, 0, &imported);
                    return Err(to_backend("cuMemImportFromShareableHandle")(e));
                }
            }
        }
        for (i, &h) in imported.iter().enumerate() {
            let r = {
                let _b = self.ctx.bind("cuMemMap")?;
                driver::mem_map(addr + i as u64 * page, page as usize, h)
            };
            if let Err(e) = r {
                self.unwind_pages(addr, total, page, i, &imported);
                return Err(to_backend("cuMemMap")(e));
            }
        }
        if let Err(e) = VirtualMemory::set_access(self, addr, total, self.ctx.index) {
            self.unwind_pages(addr, total, page, imported.len(), &imported);
            return Err(e);
        }
        self.ctx
            .ipc
            .opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                addr,
                Opened {
                    page,
                    handles: imported,
                },
            );
        Ok(addr)
    }

    fn close_pages(&self, addr: u64) -> Result<(), BackendError> {
        let opened = self
            .ctx
            .ipc
            .opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&addr)
            .ok_or_else(|| ipc_error("close_pages", format!("nothing is open at {addr:#x}")))?;
        // unmapping does not wait for the device's work on the pages
        {
            let _b = self.ctx.bind("cuCtxSynchronize")?;
            driver::ctx_synchronize().map_err(to_backend("cuCtxSynchronize"))?;
        }
        let total = opened.page * opened.handles.len() as u64;
        self.unwind_pages(
            addr,
            total,
            opened.page,
            opened.handles.len(),
            &opened.handles,
        );
        Ok(())
    }
}
