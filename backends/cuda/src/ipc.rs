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
    /// Mappings of other processes' pages made by `open_runs`, by address.
    opened: Mutex<HashMap<u64, Opened>>,
}

/// One `open_runs` mapping: its imported handles and their bytes, mapped
/// one after the other.
#[derive(Debug)]
struct Opened {
    runs: Vec<(sys::CUmemGenericAllocationHandle, u64)>,
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

    /// Undoes a partial `open_runs`: unmaps the first `mapped` of the
    /// imported runs (laid out from `addr`), releases every imported
    /// handle, frees the `total` bytes of address space.
    fn unwind_runs(
        &self,
        addr: u64,
        total: u64,
        mapped: usize,
        runs: &[(sys::CUmemGenericAllocationHandle, u64)],
    ) {
        let _b = self.ctx.bind("cuMemUnmap");
        let mut at = addr;
        for &(_, bytes) in &runs[..mapped] {
            let _ = driver::mem_unmap(at, bytes as usize);
            at += bytes;
        }
        for &(h, _) in runs {
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

    fn open_runs(&self, pid: i32, runs: &[(i32, u64)]) -> Result<u64, BackendError> {
        let gran = self
            .ctx
            .vmm_granularity
            .ok_or_else(|| unsupported_vmm("cuMemImportFromShareableHandle"))?;
        if runs.is_empty() || runs.iter().any(|r| r.1 == 0 || !r.1.is_multiple_of(gran)) {
            return Err(ipc_error(
                "open_runs",
                format!(
                    "{} handle(s) of {:?} bytes: not whole numbers of {gran}-byte pages",
                    runs.len(),
                    runs.iter().map(|r| r.1).collect::<Vec<_>>()
                ),
            ));
        }
        let total = runs
            .iter()
            .try_fold(0u64, |t, r| t.checked_add(r.1))
            .filter(|&t| usize::try_from(t).is_ok())
            .ok_or_else(|| {
                ipc_error("open_runs", format!("{} runs: too many bytes", runs.len()))
            })?;
        let addr = VirtualMemory::reserve(self, total).map_err(|e| match e {
            DeviceAllocError::OutOfMemory => ipc_error(
                "cuMemAddressReserve",
                format!("no address space for {total} bytes"),
            ),
            DeviceAllocError::Backend(b) => b,
        })?;
        let mut imported = Vec::with_capacity(runs.len());
        for &(fd, bytes) in runs {
            let mine = match driver::fd_of_process(pid, fd as c_int) {
                Ok(f) => f,
                Err(e) => {
                    self.unwind_runs(addr, total, 0, &imported);
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
            // (a failure to bind the context unwinds too: nothing leaks)
            let h = self
                .ctx
                .bind("cuMemImportFromShareableHandle")
                .and_then(|_b| {
                    driver::mem_import_posix_fd(mine.as_raw_fd())
                        .map_err(to_backend("cuMemImportFromShareableHandle"))
                });
            drop(mine);
            match h {
                Ok(h) => imported.push((h, bytes)),
                Err(e) => {
                    self.unwind_runs(addr, total, 0, &imported);
                    return Err(e);
                }
            }
        }
        let mut at = addr;
        for (i, &(h, bytes)) in imported.iter().enumerate() {
            let r = self.ctx.bind("cuMemMap").and_then(|_b| {
                driver::mem_map(at, bytes as usize, h).map_err(to_backend("cuMemMap"))
            });
            if let Err(e) = r {
                self.unwind_runs(addr, total, i, &imported);
                return Err(e);
            }
            at += bytes;
        }
        if let Err(e) = VirtualMemory::set_access(self, addr, total, self.ctx.index) {
            self.unwind_runs(addr, total, imported.len(), &imported);
            return Err(e);
        }
        self.ctx
            .ipc
            .opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, Opened { runs: imported });
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
        let total = opened.runs.iter().map(|r| r.1).sum();
        self.unwind_runs(addr, total, opened.runs.len(), &opened.runs);
        Ok(())
    }
}
