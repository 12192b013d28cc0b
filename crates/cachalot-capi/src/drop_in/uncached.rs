//! `torch.cuda.caching_allocator_enable(False)` (and
//! `PYTORCH_NO_CUDA_MEMORY_CACHING`): while the cache is off, every
//! allocation of the drop-in is a device allocation of its own, freed by
//! the device at once, outside the statistics, the history and the pools
//! (PyTorch's `uncached_allocate`); a pointer given out so is freed the
//! same way whenever it is freed, and is ignored by `record_stream`.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use cachalot::core::backend::{Backend, DevicePointer};
use cachalot::core::error::DeviceAllocError;
use cachalot::{DeviceAllocator, Error};
use parking_lot::Mutex;

use crate::{Failure, device_alloc, status};

/// 0: not decided yet (the environment is read first), 1: caching, 2: off.
static STATE: AtomicU8 = AtomicU8::new(0);
/// Live uncached allocations: address → (device, bytes).
static LIVE: Mutex<Option<HashMap<u64, (c_int, u64)>>> = Mutex::new(None);
/// How many there are (read without the lock on every free).
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// PyTorch turns caching off for good when either variable is set.
const ENV_VARS: [&str; 2] = [
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_NO_HIP_MEMORY_CACHING",
];

/// Whether the cache is off.
#[inline]
pub fn off() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let env_off = ENV_VARS.iter().any(|v| std::env::var_os(v).is_some());
            let _ = STATE.compare_exchange(
                0,
                if env_off { 2 } else { 1 },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            STATE.load(Ordering::Relaxed) == 2
        }
    }
}

/// A device allocation of `size` bytes (> 0) on `dev`, outside the cache.
pub fn alloc(dev: &DeviceAllocator, device: c_int, size: u64) -> Result<u64, Failure> {
    let r = if let Some(a) = dev.as_mock() {
        a.backend().malloc(size).map(|p| p.addr())
    } else if let Some(a) = dev.as_cuda() {
        a.backend().malloc(size).map(|p| p.addr())
    } else {
        return Err(Failure::invalid(format!(
            "uncached allocation is not available on the {} backend through the C ABI",
            dev.backend_kind()
        )));
    };
    let addr = match r {
        Ok(a) => a,
        Err(DeviceAllocError::OutOfMemory) => {
            return Err(Failure {
                code: crate::CACHALOT_ERR_OUT_OF_MEMORY,
                message: format!(
                    "CUDA out of memory. Tried to allocate {} (caching off: one device \
                     allocation per request)",
                    cachalot::core::error::format_size(size)
                ),
            });
        }
        Err(DeviceAllocError::Backend(e)) => return Err(Error::from(e).into()),
    };
    LIVE.lock()
        .get_or_insert_with(HashMap::new)
        .insert(addr, (device, size));
    COUNT.fetch_add(1, Ordering::Relaxed);
    Ok(addr)
}

/// Whether `addr` is a live uncached allocation.
#[inline]
pub fn is_uncached(addr: u64) -> bool {
    COUNT.load(Ordering::Relaxed) != 0
        && LIVE.lock().as_ref().is_some_and(|m| m.contains_key(&addr))
}

/// Frees `addr` if it is a live uncached allocation: `Ok(true)`; `Ok(false)`
/// when it is not one.
pub fn free(addr: u64) -> Result<bool, Failure> {
    if COUNT.load(Ordering::Relaxed) == 0 {
        return Ok(false);
    }
    let Some((device, size)) = LIVE.lock().as_mut().and_then(|m| m.remove(&addr)) else {
        return Ok(false);
    };
    COUNT.fetch_sub(1, Ordering::Relaxed);
    let dev = device_alloc(device)?;
    let r = if let Some(a) = dev.as_mock() {
        a.backend().free(
            <cachalot::mock::MockBackend as Backend>::Ptr::from_addr(addr),
            size,
        )
    } else if let Some(a) = dev.as_cuda() {
        a.backend().free(
            <cachalot::cuda::CudaBackend as Backend>::Ptr::from_addr(addr),
            size,
        )
    } else {
        unreachable!("uncached allocations are made on the mock and CUDA backends only")
    };
    r.map_err(|e| Failure::from(Error::from(e)))?;
    Ok(true)
}

/// Turns the cache on (`enabled` non-zero) or off
/// (`torch.cuda.caching_allocator_enable`). What was cached stays cached
/// (`empty_cache` releases it); allocations made while it was off are
/// freed by the device whenever they are freed.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_caching_enable(enabled: c_int) -> c_int {
    status("cachalot_caching_enable", || {
        // the environment is read first (it may have turned caching off)
        let _ = off();
        STATE.store(if enabled != 0 { 1 } else { 2 }, Ordering::Relaxed);
        Ok(())
    })
}

/// Writes 1 to `*out` when the cache is on, else 0
/// (`CUDAAllocator::isEnabled`).
///
/// # Safety
/// `out` is NULL (an error) or valid for one `int` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_caching_enabled(out: *mut c_int) -> c_int {
    status("cachalot_caching_enabled", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(c_int::from(!off())) };
        Ok(())
    })
}
