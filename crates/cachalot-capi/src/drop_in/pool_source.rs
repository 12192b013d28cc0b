//! Private pools backed by a user's allocator (`torch.cuda.MemPool(
//! allocator=CUDAPluggableAllocator(...))`: every segment of such a pool
//! comes from the user's alloc function and goes back through its free
//! function), and the pool options `use_on_oom` and `no_split`.

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use cachalot::core::engine::SegmentSource;
use cachalot::core::error::{BackendError, DeviceAllocError};

use super::{IN_POOL, book, check_private, pool_id};
use cachalot::DeviceAllocator;

use crate::{Failure, device_alloc, status, stream_of};

/// Allocates a segment: writes its address to `*addr` (0: none now, out of
/// memory) and returns 0, or a non-zero code with a message in
/// `err[..errlen]` (NUL-terminated) on another failure.
pub type SourceAllocFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    size: usize,
    addr: *mut u64,
    err: *mut c_char,
    errlen: usize,
) -> c_int;
/// Frees a segment `alloc` gave; 0, or non-zero with a message as above.
pub type SourceFreeFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    addr: u64,
    size: usize,
    err: *mut c_char,
    errlen: usize,
) -> c_int;
/// Called once when cachalot no longer needs `ctx` (the pool was deleted
/// after its last segment went back).
pub type SourceReleaseFn = unsafe extern "C" fn(ctx: *mut c_void);

/// Longest message a source function may write.
const ERR_LEN: usize = 512;

/// A [`SegmentSource`] made of C functions.
struct CSource {
    alloc: SourceAllocFn,
    free: SourceFreeFn,
    release: Option<SourceReleaseFn>,
    ctx: *mut c_void,
}

// SAFETY: the caller of `cachalot_pool_create_with_source` guarantees that
// the functions may be called with `ctx` from any thread (the contract in
// include/cachalot.h); cachalot calls them with its device lock held, one
// at a time per device.
unsafe impl Send for CSource {}
// SAFETY: as above; `CSource` itself holds no interior state.
unsafe impl Sync for CSource {}

fn message(buf: &[u8], call: &str, rc: c_int) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let text = String::from_utf8_lossy(&buf[..end]);
    if text.is_empty() {
        format!("the pool's allocator failed in {call} (code {rc})")
    } else {
        format!("the pool's allocator failed in {call} (code {rc}): {text}")
    }
}

impl SegmentSource for CSource {
    fn alloc(&self, size: u64) -> Result<u64, DeviceAllocError> {
        let size = usize::try_from(size).map_err(|_| DeviceAllocError::OutOfMemory)?;
        let mut addr = 0u64;
        let mut buf = [0u8; ERR_LEN];
        // SAFETY: the function and `ctx` come from the caller of
        // `cachalot_pool_create_with_source`, who guarantees they are valid
        // for calls from any thread; `addr` and `buf` are valid for writes
        // of one u64 and `ERR_LEN` bytes.
        let rc =
            unsafe { (self.alloc)(self.ctx, size, &mut addr, buf.as_mut_ptr().cast(), ERR_LEN) };
        if rc != 0 {
            return Err(BackendError::new(
                "segment source",
                "alloc",
                i64::from(rc),
                message(&buf, "alloc", rc),
            )
            .into());
        }
        Ok(addr)
    }

    fn free(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let mut buf = [0u8; ERR_LEN];
        // SAFETY: as in `alloc`.
        let rc = unsafe { (self.free)(self.ctx, addr, size, buf.as_mut_ptr().cast(), ERR_LEN) };
        if rc != 0 {
            return Err(BackendError::new(
                "segment source",
                "free",
                i64::from(rc),
                message(&buf, "free", rc),
            ));
        }
        Ok(())
    }
}

impl Drop for CSource {
    fn drop(&mut self) {
        if let Some(r) = self.release {
            // SAFETY: called once, as the contract of
            // `cachalot_pool_create_with_source` says.
            unsafe { r(self.ctx) };
        }
    }
}

/// Creates private pool `(pool_hi, pool_lo)` with one use, its segments
/// coming from `alloc_fn` and going back through `free_fn` (both called
/// with `ctx`, from any thread, with cachalot's device lock held: they must
/// not call back into cachalot); the pool never uses expandable segments.
/// `release_fn` (may be NULL) is called once with `ctx` when the pool is
/// deleted, after its last segment went back; on an error return it is
/// called before returning. A pool that exists already, `(0, 0)`, and NULL
/// functions are errors.
///
/// # Safety
/// The functions are valid to call with `ctx` from any thread until
/// `release_fn` is called (for ever when it is NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_pool_create_with_source(
    device: c_int,
    pool_hi: u64,
    pool_lo: u64,
    alloc_fn: Option<SourceAllocFn>,
    free_fn: Option<SourceFreeFn>,
    release_fn: Option<SourceReleaseFn>,
    ctx: *mut c_void,
) -> c_int {
    status("cachalot_pool_create_with_source", || {
        let (Some(alloc), Some(free)) = (alloc_fn, free_fn) else {
            if let Some(r) = release_fn {
                // SAFETY: the caller's contract; called once.
                unsafe { r(ctx) };
            }
            return Err(Failure::invalid("alloc_fn or free_fn is NULL"));
        };
        // from here on, dropping `source` releases `ctx`
        let source: Arc<dyn SegmentSource> = Arc::new(CSource {
            alloc,
            free,
            release: release_fn,
            ctx,
        });
        let id = pool_id(pool_hi, pool_lo);
        check_private(id)?;
        let dev = device_alloc(device)?;
        let _g = IN_POOL.lock();
        typed!(dev, |a, _s| Ok::<(), Failure>(
            a.create_or_incref_pool(id, Some(source))?
        ))?;
        book(|b| *b.uses.entry((dev.index(), id)).or_insert(0) += 1);
        Ok(())
    })
}

/// PyTorch's `setUseOnOOM`: while `on` is non-zero, an allocation of the
/// default pools that finds no cached block and no device memory takes a
/// cached free block of pool `(pool_hi, pool_lo)` (same stream) before the
/// cache is released. An unknown pool or `(0, 0)` is an error.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_pool_set_use_on_oom(
    device: c_int,
    pool_hi: u64,
    pool_lo: u64,
    on: c_int,
) -> c_int {
    status("cachalot_pool_set_use_on_oom", || {
        let id = pool_id(pool_hi, pool_lo);
        check_private(id)?;
        let dev = device_alloc(device)?;
        typed!(dev, |a, _s| Ok::<(), Failure>(
            a.set_pool_use_on_oom(id, on != 0)?
        ))
    })
}

/// PyTorch's `setNoSplit`: blocks of pool `(pool_hi, pool_lo)` are never
/// split. An unknown pool or `(0, 0)` is an error.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_pool_set_no_split(device: c_int, pool_hi: u64, pool_lo: u64) -> c_int {
    status("cachalot_pool_set_no_split", || {
        let id = pool_id(pool_hi, pool_lo);
        check_private(id)?;
        let dev = device_alloc(device)?;
        typed!(dev, |a, _s| Ok::<(), Failure>(a.set_pool_no_split(id)?))
    })
}
