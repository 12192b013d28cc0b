//! The context of one device (the retained primary context or a
//! caller's), made current for the duration of a call, and the relaxed
//! capture mode around allocations.

use super::*;

/// The context of one device: the primary context this crate retained
/// (released on drop), or a caller's `cudarc` context (kept alive, never
/// released by this crate).
pub(crate) struct Context {
    pub(crate) index: DeviceIndex,
    pub(crate) dev: sys::CUdevice,
    pub(crate) ctx: usize,
    pub(crate) driver_version: i32,
    pub(crate) capture: bool,
    /// The minimum VMM granularity, `None` without virtual memory.
    pub(crate) vmm_granularity: Option<u64>,
    pub(crate) name: String,
    /// Interprocess sharing (`ipc.rs`): the driver has the calls, and
    /// physical memory is still created exportable (cleared when the
    /// device refuses an exportable allocation).
    pub(crate) ipc: ipc::IpcState,
    /// The caller's context when opened with [`CudaBackend::from_cudarc`]:
    /// held so that it outlives the backend, and not released on drop.
    pub(crate) borrowed: Option<Arc<cudarc::driver::CudaContext>>,
}

/// Keeps the primary context current for the duration of one operation and
/// restores a different context that was current before.
pub(crate) struct Bound {
    restore: Option<sys::CUcontext>,
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(prev) = self.restore.take() {
            // Nothing useful can be done if restoring fails.
            let _ = driver::ctx_set_current(prev);
        }
    }
}

impl Context {
    pub(crate) fn raw(&self) -> sys::CUcontext {
        std::ptr::with_exposed_provenance_mut(self.ctx)
    }

    pub(crate) fn bind(&self, call: &'static str) -> Result<Bound, BackendError> {
        let cur = driver::ctx_get_current().map_err(to_backend("cuCtxGetCurrent"))?;
        let ours = self.raw();
        if cur == ours {
            return Ok(Bound { restore: None });
        }
        driver::ctx_set_current(ours).map_err(|e| {
            let mut err = to_backend("cuCtxSetCurrent")(e);
            err.message = format!("{} (before {call})", err.message);
            err
        })?;
        Ok(Bound {
            restore: (!cur.is_null()).then_some(cur),
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if self.borrowed.is_some() {
            // The caller's context: its `CudaContext` releases it.
            return;
        }
        // Errors cannot be reported from drop; the driver may already be
        // shutting down at process exit.
        let _ = driver::primary_ctx_release(self.dev);
    }
}

/// Runs `f` with this thread's capture mode set to relaxed, so that
/// `cuMemAlloc` is legal while some stream is capturing (PyTorch's
/// `cudaMallocMaybeCapturing`). The previous mode is restored.
pub(crate) fn with_relaxed_capture<T>(f: impl FnOnce() -> T) -> Result<T, BackendError> {
    let prev =
        driver::exchange_capture_mode(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(to_backend("cuThreadExchangeStreamCaptureMode"))?;
    let out = f();
    driver::restore_capture_mode(prev).map_err(to_backend("cuThreadExchangeStreamCaptureMode"))?;
    Ok(out)
}
