//! Checkpoints of a private pool for cudagraph trees: PyTorch's
//! `getCheckpointState` ([`cachalot_pool_checkpoint`]) and
//! `setCheckpointPoolState` ([`cachalot_pool_restore`]). The engine's
//! [`PoolCheckpoint`] does the work; here it is held behind an opaque
//! handle, and a restore's delta is handed over as two arrays.

use std::ffi::{c_int, c_void};

use cachalot::core::engine::{CheckpointDelta, PoolCheckpoint};
use cachalot::{DeviceAllocator, Error};

use crate::{Failure, device_alloc, entry, status};

/// The checkpoint of one backend's engine.
enum Saved {
    Mock(PoolCheckpoint<cachalot::mock::MockStream>),
    Cuda(PoolCheckpoint<cachalot::cuda::CudaStream>),
}

/// An opaque pool checkpoint (`cachalot_checkpoint_t`): the device it was
/// taken on and the engine's checkpoint.
pub struct CachalotCheckpoint {
    device: u32,
    saved: Saved,
}

/// What a restore changed (`cachalot_checkpoint_delta_t`): arrays owned by
/// cachalot until [`cachalot_checkpoint_delta_free`].
#[repr(C)]
#[derive(Debug)]
pub struct CachalotCheckpointDelta {
    /// Addresses of the pool's blocks that were allocated and were freed.
    pub freed: *const *mut c_void,
    /// Number of freed addresses.
    pub num_freed: usize,
    /// Addresses allocated again as the checkpoint holds them: each is a
    /// live allocation, freed with `cachalot_raw_delete`.
    pub allocated: *const *mut c_void,
    /// Number of allocated addresses.
    pub num_allocated: usize,
}

#[repr(C)]
struct OwnedDelta {
    public: CachalotCheckpointDelta,
    freed: Vec<*mut c_void>,
    allocated: Vec<*mut c_void>,
}

fn unsupported(dev: &DeviceAllocator) -> Failure {
    Failure::invalid(format!(
        "pool checkpoints are not available on the {} backend through the C ABI",
        dev.backend_kind()
    ))
}

fn ptr(addr: u64) -> *mut c_void {
    std::ptr::with_exposed_provenance_mut(addr as usize)
}

/// Saves the layout of private pool `(pool_hi, pool_lo)` of `device` (every
/// segment, every block, which are allocated) and writes a handle to it to
/// `*out`; release it with [`cachalot_checkpoint_free`]. The default pool,
/// an unknown pool and one whose uses all ended are
/// [`crate::CACHALOT_ERR_CAPTURE`].
///
/// # Safety
/// `out` is NULL (an error) or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_pool_checkpoint(
    device: c_int,
    pool_hi: u64,
    pool_lo: u64,
    out: *mut *mut CachalotCheckpoint,
) -> c_int {
    status("cachalot_pool_checkpoint", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let dev = device_alloc(device)?;
        let id = (pool_hi, pool_lo);
        let saved = if let Some(a) = dev.as_mock() {
            Saved::Mock(a.checkpoint_pool(id)?)
        } else if let Some(a) = dev.as_cuda() {
            Saved::Cuda(a.checkpoint_pool(id)?)
        } else {
            return Err(unsupported(dev));
        };
        let h = Box::new(CachalotCheckpoint {
            device: dev.index(),
            saved,
        });
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(Box::into_raw(h)) };
        Ok(())
    })
}

/// Releases a checkpoint from [`cachalot_pool_checkpoint`] (NULL is a
/// no-op).
///
/// # Safety
/// `c` is NULL or a checkpoint from [`cachalot_pool_checkpoint`] not yet
/// released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_checkpoint_free(c: *mut CachalotCheckpoint) {
    entry("cachalot_checkpoint_free", false, (), || {
        if !c.is_null() {
            // SAFETY: from `Box::into_raw` in `cachalot_pool_checkpoint`,
            // released once (the caller's contract).
            drop(unsafe { Box::from_raw(c) });
        }
        Ok(())
    })
}

/// Restores the pool of checkpoint `c` on `device` (PyTorch's
/// `setCheckpointPoolState`): every block of the pool allocated now is
/// freed, then every block the checkpoint holds as allocated is allocated
/// again at its address; the addresses of both go to `*out` (release with
/// [`cachalot_checkpoint_delta_free`]). A checkpoint of another device, of
/// a pool no longer used, or whose segments the pool no longer has is
/// [`crate::CACHALOT_ERR_CAPTURE`], and nothing changes. The checkpoint
/// stays valid: it may be restored again.
///
/// # Safety
/// `c` is NULL (an error) or a live checkpoint from
/// [`cachalot_pool_checkpoint`]; `out` is NULL (an error) or valid for one
/// pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_pool_restore(
    device: c_int,
    c: *const CachalotCheckpoint,
    out: *mut *mut CachalotCheckpointDelta,
) -> c_int {
    status("cachalot_pool_restore", || {
        if c.is_null() || out.is_null() {
            return Err(Failure::invalid("checkpoint or out is NULL"));
        }
        // SAFETY: non-NULL, live and not written concurrently (the
        // caller's contract); only read.
        let c = unsafe { &*c };
        let dev = device_alloc(device)?;
        if dev.index() != c.device {
            return Err(
                Error::Capture(cachalot::core::CaptureError::Checkpoint(format!(
                    "the checkpoint is of device {}, not {}",
                    c.device,
                    dev.index()
                )))
                .into(),
            );
        }
        let d: CheckpointDelta = match (&c.saved, dev.as_mock(), dev.as_cuda()) {
            (Saved::Mock(s), Some(a), _) => a.restore_pool(s)?,
            (Saved::Cuda(s), _, Some(a)) => a.restore_pool(s)?,
            _ => {
                return Err(Error::Capture(cachalot::core::CaptureError::Checkpoint(
                    "the checkpoint is of another backend".into(),
                ))
                .into());
            }
        };
        let mut owned = Box::new(OwnedDelta {
            public: CachalotCheckpointDelta {
                freed: std::ptr::null(),
                num_freed: d.freed.len(),
                allocated: std::ptr::null(),
                num_allocated: d.allocated.len(),
            },
            freed: d.freed.iter().map(|&a| ptr(a)).collect(),
            allocated: d.allocated.iter().map(|&(a, _)| ptr(a)).collect(),
        });
        owned.public.freed = owned.freed.as_ptr();
        owned.public.allocated = owned.allocated.as_ptr();
        // `public` is the first field of the repr(C) `OwnedDelta`.
        let p = Box::into_raw(owned).cast::<CachalotCheckpointDelta>();
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(p) };
        Ok(())
    })
}

/// Releases a delta from [`cachalot_pool_restore`] (NULL is a no-op).
///
/// # Safety
/// `d` is NULL or a delta from [`cachalot_pool_restore`] not yet released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_checkpoint_delta_free(d: *mut CachalotCheckpointDelta) {
    entry("cachalot_checkpoint_delta_free", false, (), || {
        if !d.is_null() {
            // SAFETY: from `Box::into_raw` of an `OwnedDelta` (whose first
            // field it points to) in `cachalot_pool_restore`, released once.
            drop(unsafe { Box::from_raw(d.cast::<OwnedDelta>()) });
        }
        Ok(())
    })
}
