//! The rest of PyTorch's `CUDAAllocator` interface, for the C++ shim of
//! `python/cachalot_torch/` (a subclass of
//! `c10::cuda::CUDACachingAllocator::CUDAAllocator` that forwards every
//! method here): allocation returning a status code (so that the shim can
//! raise `torch.OutOfMemoryError` with cachalot's report), the statistics
//! as a struct, memory fraction, device and cache info, private pools for
//! graph capture and `torch.cuda.MemPool`, memory history and snapshots.
//!
//! Everything the shim needs to decide is decided here; the shim only
//! converts types and throws.
//!
//! # Pools
//!
//! PyTorch passes `beginAllocateToPool` a C++ filter. The shim tells two
//! kinds apart by calling the filter once on the current stream when the
//! pool begins:
//!
//! * a capture filter (`torch.cuda.graph`, `make_graphed_callables`,
//!   cudagraph trees) is false there: the stream has not begun capturing.
//!   [`cachalot_pool_begin`] routes, as cachalot's engine does, every
//!   allocation of a stream capturing into the same capture as that stream
//!   (`PoolFilter::CaptureOf`), forked streams included;
//! * a context filter (`torch.cuda.use_mem_pool`: same thread; the
//!   always-true filter of `_cuda_beginAllocateToPool`) is true there: the
//!   shim takes one use of the pool ([`cachalot_pool_create_or_incref`]),
//!   evaluates the filter itself at each allocation, and allocates matching
//!   requests with [`cachalot_alloc_in_pool`].
//!
//! Use counts follow PyTorch's: `createOrIncrefPool` and every
//! `beginAllocateToPool` add one, `releasePool` drops one; at zero the pool's
//! free segments are released and it is deleted once it owns none.

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};

use cachalot::core::engine::{PoolFilter, PoolId};
use cachalot::core::stats::{Stat, StatArray};
use cachalot::{BlockState, DeviceAllocator, DeviceStats, Error, TraceAction};
use parking_lot::Mutex;

use crate::{
    CACHALOT_ERR_CAPTURE, Failure, device_alloc, entry, existing_alloc, existing_allocs, status,
    stream_of,
};

/// The pool id `(0, 0)`: the default pools (in a snapshot: every pool).
const DEFAULT_POOL: PoolId = (0, 0);
/// Most pointers [`cachalot_pool_check_live`] reads.
pub const MAX_CHECK_POINTERS: usize = 1 << 28;

// ----- mirrored state -----

/// Use counts of the private pools, per (device, pool), as the engine keeps
/// them (every change goes through this module), for `getPoolUseCount`; and
/// the pools with a capture registered.
#[derive(Default)]
struct PoolBook {
    uses: HashMap<(u32, PoolId), u64>,
    recording: HashMap<(u32, PoolId), ()>,
}

static BOOK: Mutex<Option<PoolBook>> = Mutex::new(None);
/// Serializes [`cachalot_alloc_in_pool`]'s register/allocate/unregister.
static IN_POOL: Mutex<()> = Mutex::new(());

fn book<T>(f: impl FnOnce(&mut PoolBook) -> T) -> T {
    f(BOOK.lock().get_or_insert_with(PoolBook::default))
}

// ----- typed engines -----

/// Runs `$body` with `$a` bound to the device's typed engine and `$s` a
/// closure mapping a raw stream handle to the engine's stream type.
macro_rules! typed {
    ($dev:expr, |$a:ident, $s:ident| $body:expr) => {{
        let dev: &DeviceAllocator = $dev;
        if let Some($a) = dev.as_mock() {
            let $s = |raw: *mut c_void| -> Result<cachalot::mock::MockStream, Failure> {
                let st = stream_of(dev, raw)?;
                let h = dev.stream_handle(st)?;
                Ok(cachalot::mock::MockStream(u32::try_from(h).map_err(
                    |_| Failure::invalid(format!("mock stream handle {h} out of range")),
                )?))
            };
            $body
        } else if let Some($a) = dev.as_cuda() {
            let $s = |raw: *mut c_void| -> Result<cachalot::cuda::CudaStream, Failure> {
                // registers (adopts) the handle, or fails for a bad one
                stream_of(dev, raw)?;
                // SAFETY: `raw` is a `cudaStream_t` the caller passed for use
                // on this device and that outlives its use by the allocator
                // (the contract of include/cachalot.h, kept by PyTorch, whose
                // streams are never destroyed). Only stored and passed to the
                // driver, never dereferenced here.
                Ok(unsafe { cachalot::cuda::CudaBackend::wrap_stream(raw.cast()) })
            };
            $body
        } else {
            Err(Failure::invalid(format!(
                "pools are not available on the {} backend through the C ABI",
                dev.backend_kind()
            )))
        }
    }};
}

fn pool_id(hi: u64, lo: u64) -> PoolId {
    (hi, lo)
}

fn check_private(id: PoolId) -> Result<(), Failure> {
    if id == DEFAULT_POOL {
        return Err(Error::Capture(cachalot::core::CaptureError::ReservedPool(id)).into());
    }
    Ok(())
}

fn capture_failure(message: String) -> Failure {
    Failure {
        code: CACHALOT_ERR_CAPTURE,
        message,
    }
}

// ----- the drop-in's other parts, one file each -----

mod oom_text;
mod pool_source;
mod settings;
mod snapshot;
mod stats;
mod trackers;
mod uncached;

pub use oom_text::{OVER_1EB, pytorch_text};
pub use pool_source::{
    SourceAllocFn, SourceFreeFn, SourceReleaseFn, cachalot_pool_create_with_source,
    cachalot_pool_set_no_split, cachalot_pool_set_use_on_oom,
};
pub use settings::{CachalotConfigInfo, cachalot_config_keys, cachalot_current_config};
pub use snapshot::*;
pub use stats::*;
pub(crate) use trackers::install as install_trackers;
pub use trackers::{
    CachalotSegmentEvent, MAX_TRACKERS, TrackerFn, cachalot_attach_segment_tracker,
};
pub(crate) use uncached::is_uncached;
pub use uncached::{cachalot_caching_enable, cachalot_caching_enabled};

// ----- allocation -----

/// Allocates `size` bytes on `device` for use on `stream` and writes the
/// address to `*out` (NULL for 0 bytes). Unlike [`crate::cachalot_malloc`]
/// it returns a status code and prints nothing: on
/// [`crate::CACHALOT_ERR_OUT_OF_MEMORY`] or
/// [`crate::CACHALOT_ERR_NEVER_FITS`] the last error message
/// ([`crate::cachalot_last_error`]) is PyTorch's out-of-memory text
/// ([`pytorch_text`]), then cachalot's report (the largest free block per
/// pool, cached bytes per stream, whether `empty_cache` would help) on a
/// line starting "cachalot: ". While the cache is off
/// ([`cachalot_caching_enable`]) the memory is a device allocation of its
/// own.
///
/// # Safety
/// `out` is NULL (an error) or valid for one pointer-sized write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> c_int {
    status("cachalot_alloc", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let dev = device_alloc(device)?;
        let addr = if size != 0 && uncached::off() {
            uncached::alloc(dev, device, size as u64)?
        } else {
            let s = stream_of(dev, stream)?;
            dev.raw_alloc(size as u64, s).map_err(oom_text::failure)?
        };
        // SAFETY: non-NULL and, by the caller's contract, valid for writes.
        unsafe { out.write(std::ptr::with_exposed_provenance_mut(addr as usize)) };
        Ok(())
    })
}

/// [`cachalot_alloc`] into the private pool `(pool_hi, pool_lo)`, which
/// must have a use ([`cachalot_pool_create_or_incref`]) and no capture
/// recording into it: the allocation a `torch.cuda.use_mem_pool` context
/// makes. The caller routes (PyTorch routes a context by thread): nothing
/// is registered, so allocations of other threads, on any stream, never
/// land in the pool. A pool with a capture recording into it is
/// [`CACHALOT_ERR_CAPTURE`]; so is the default pool `(0, 0)` and a pool
/// without a use. While the cache is off the memory is a device allocation
/// of its own, in no pool.
///
/// # Safety
/// `out` is NULL (an error) or valid for one pointer-sized write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_alloc_in_pool(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    pool_hi: u64,
    pool_lo: u64,
    out: *mut *mut c_void,
) -> c_int {
    status("cachalot_alloc_in_pool", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let id = pool_id(pool_hi, pool_lo);
        check_private(id)?;
        let dev = device_alloc(device)?;
        if size != 0 && uncached::off() {
            let addr = uncached::alloc(dev, device, size as u64)?;
            // SAFETY: non-NULL and, by the caller's contract, valid for writes.
            unsafe { out.write(std::ptr::with_exposed_provenance_mut(addr as usize)) };
            return Ok(());
        }
        let key = (dev.index(), id);
        let (uses, recording) = book(|b| {
            (
                b.uses.get(&key).copied().unwrap_or(0),
                b.recording.contains_key(&key),
            )
        });
        if uses == 0 {
            return Err(capture_failure(format!(
                "mempool {id:?} has no use (create it first)"
            )));
        }
        if recording {
            return Err(capture_failure(format!(
                "mempool {id:?} is recording a graph capture"
            )));
        }
        let addr = typed!(dev, |a, to_stream| {
            let s = to_stream(stream)?;
            a.allocate_in_pool(id, size as u64, s)
                .map_err(oom_text::failure)
        })?;
        // SAFETY: non-NULL and, by the caller's contract, valid for writes.
        unsafe { out.write(std::ptr::with_exposed_provenance_mut(addr as usize)) };
        Ok(())
    })
}

/// Frees `ptr` wherever it was allocated: on `device_hint` first when it is
/// a device in use, then on every other device in use (PyTorch's deleter
/// knows only the pointer). NULL is a no-op. A pointer no device handed out
/// is [`crate::CACHALOT_ERR_INVALID_POINTER`]; a double free
/// [`crate::CACHALOT_ERR_DOUBLE_FREE`]. Prints nothing.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_raw_delete(ptr: *mut c_void, device_hint: c_int) -> c_int {
    status("cachalot_raw_delete", || {
        let addr = ptr.addr() as u64;
        if addr == 0 || uncached::free(addr)? {
            return Ok(());
        }
        // no heap allocation on this path: it is every tensor's deleter
        let n = crate::device_table()?.len();
        let hint = usize::try_from(device_hint).ok().filter(|&h| h < n);
        let order = hint.into_iter().chain((0..n).filter(|&d| Some(d) != hint));
        for d in order {
            let Some(dev) = existing_alloc(d as c_int)? else {
                continue;
            };
            match dev.raw_free(addr) {
                Err(Error::UnknownPointer(_)) => {}
                r => return Ok(r?),
            }
        }
        Err(Error::UnknownPointer(addr).into())
    })
}

// ----- memory fraction, device and cache info -----

/// Caps `device`'s allocator at `fraction` ∈ [0, 1] of the device memory
/// (`torch.cuda.set_per_process_memory_fraction`); outside that range (or
/// NaN) is [`crate::CACHALOT_ERR_INVALID_ARGUMENT`] and nothing changes.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_set_memory_fraction(device: c_int, fraction: f64) -> c_int {
    status("cachalot_set_memory_fraction", || {
        Ok(device_alloc(device)?.set_per_process_memory_fraction(fraction)?)
    })
}

/// Writes `device`'s memory fraction (1.0 unless set) to `*out`.
///
/// # Safety
/// `out` is NULL (an error) or valid for one `double` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_get_memory_fraction(device: c_int, out: *mut f64) -> c_int {
    status("cachalot_get_memory_fraction", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let f = device_alloc(device)?.config().per_process_memory_fraction;
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(f) };
        Ok(())
    })
}

/// Writes the device's free and total bytes as the driver reports them
/// (`torch.cuda.mem_get_info`). Either pointer may be NULL.
///
/// # Safety
/// Each pointer is NULL or valid for one `size_t` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_mem_get_info(
    device: c_int,
    free: *mut usize,
    total: *mut usize,
) -> c_int {
    status("cachalot_mem_get_info", || {
        let info = device_alloc(device)?.memory_info()?;
        // SAFETY: each non-NULL pointer is valid for writes (caller's contract).
        unsafe {
            if !free.is_null() {
                free.write(info.free as usize);
            }
            if !total.is_null() {
                total.write(info.total as usize);
            }
        }
        Ok(())
    })
}

/// PyTorch's `cacheInfo` (cuDNN's workspace sizing): `*largest` := the
/// largest of `*largest` and every cached free block; when `*largest` is 0
/// on entry it starts from the device's free bytes.
///
/// # Safety
/// `largest` is NULL (an error) or valid for reads and writes of a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_cache_info(device: c_int, largest: *mut usize) -> c_int {
    status("cachalot_cache_info", || {
        if largest.is_null() {
            return Err(Failure::invalid("largest is NULL"));
        }
        let dev = device_alloc(device)?;
        // SAFETY: non-NULL and valid for reads by the caller's contract.
        let mut v = unsafe { largest.read() } as u64;
        if v == 0 {
            v = dev.memory_info()?.free;
        }
        v = v.max(dev.largest_free_block());
        // SAFETY: as above, valid for writes.
        unsafe { largest.write(v as usize) };
        Ok(())
    })
}

// ----- pools -----

/// Starts routing the allocations of every stream capturing into the same
/// capture as `stream` to private pool `(pool_hi, pool_lo)` (created if new,
/// else one more use): PyTorch's `beginAllocateToPool` for a graph capture,
/// called before the capture begins on `stream`. A pool already recording,
/// the default pool `(0, 0)` and a pool whose uses all ended are
/// [`CACHALOT_ERR_CAPTURE`]; a backend without capture (the null backend)
/// too.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_pool_begin(
    device: c_int,
    pool_hi: u64,
    pool_lo: u64,
    stream: *mut c_void,
) -> c_int {
    status("cachalot_pool_begin", || {
        let id = pool_id(pool_hi, pool_lo);
        check_private(id)?;
        let dev = device_alloc(device)?;
        let _g = IN_POOL.lock();
        typed!(dev, |a, to_stream| {
            let s = to_stream(stream)?;
            a.begin_allocate_to_pool(id, PoolFilter::CaptureOf(s))?;
            Ok::<(), Failure>(())
        })?;
        book(|b| {
            *b.uses.entry((dev.index(), id)).or_insert(0) += 1;
            b.recording.insert((dev.index(), id), ());
        });
        Ok(())
    })
}

/// Stops routing to pool `(pool_hi, pool_lo)` (PyTorch's
/// `endAllocateToPool`, after the capture ended). Not recording: error.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_pool_end(device: c_int, pool_hi: u64, pool_lo: u64) -> c_int {
    status("cachalot_pool_end", || {
        let id = pool_id(pool_hi, pool_lo);
        let dev = device_alloc(device)?;
        let _g = IN_POOL.lock();
        typed!(dev, |a, _s| Ok::<(), Failure>(a.end_allocate_to_pool(id)?))?;
        book(|b| b.recording.remove(&(dev.index(), id)));
        Ok(())
    })
}

/// Takes one use of private pool `(pool_hi, pool_lo)`, creating it if new
/// (PyTorch's `createOrIncrefPool`: `torch.cuda.MemPool()`, and the begin
/// of a `use_mem_pool` context). The default pool, a pool whose uses all
/// ended, and a pool recording a capture are [`CACHALOT_ERR_CAPTURE`].
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_pool_create_or_incref(
    device: c_int,
    pool_hi: u64,
    pool_lo: u64,
) -> c_int {
    status("cachalot_pool_create_or_incref", || {
        let id = pool_id(pool_hi, pool_lo);
        check_private(id)?;
        let dev = device_alloc(device)?;
        let _g = IN_POOL.lock();
        typed!(dev, |a, _s| Ok::<(), Failure>(
            a.create_or_incref_pool(id, None)?
        ))?;
        book(|b| *b.uses.entry((dev.index(), id)).or_insert(0) += 1);
        Ok(())
    })
}

/// Drops one use of private pool `(pool_hi, pool_lo)` (PyTorch's
/// `releasePool`: graph reset or destroyed, end of `use_mem_pool`, MemPool
/// deleted). At zero uses its free segments are released, the rest when
/// their blocks are freed. An unknown pool or one without uses is
/// [`CACHALOT_ERR_CAPTURE`].
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_pool_release(device: c_int, pool_hi: u64, pool_lo: u64) -> c_int {
    status("cachalot_pool_release", || {
        let id = pool_id(pool_hi, pool_lo);
        check_private(id)?;
        let dev = device_alloc(device)?;
        let _g = IN_POOL.lock();
        typed!(dev, |a, _s| Ok::<(), Failure>(a.release_pool(id)?))?;
        book(|b| {
            let k = (dev.index(), id);
            if let Some(n) = b.uses.get_mut(&k) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    b.uses.remove(&k);
                }
            }
        });
        Ok(())
    })
}

/// Writes the number of uses of pool `(pool_hi, pool_lo)` to `*out` (0 for
/// a pool never created or fully released): `MemPool.use_count()`.
///
/// # Safety
/// `out` is NULL (an error) or valid for one `int` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_pool_use_count(
    device: c_int,
    pool_hi: u64,
    pool_lo: u64,
    out: *mut c_int,
) -> c_int {
    status("cachalot_pool_use_count", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let dev = device_alloc(device)?;
        let id = pool_id(pool_hi, pool_lo);
        let n = book(|b| b.uses.get(&(dev.index(), id)).copied().unwrap_or(0));
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(c_int::try_from(n).unwrap_or(c_int::MAX)) };
        Ok(())
    })
}

/// PyTorch's `checkPoolLiveAllocations` (cudagraph trees' check): writes 1
/// to `*out` when the allocated blocks of pool `(pool_hi, pool_lo)` are
/// exactly the `n` addresses of `ptrs` (duplicates count once), else 0. A
/// pool that does not exist is [`CACHALOT_ERR_CAPTURE`]; `n` over
/// [`MAX_CHECK_POINTERS`] is [`crate::CACHALOT_ERR_INVALID_ARGUMENT`].
///
/// # Safety
/// `ptrs` is valid for reads of `n` pointers (NULL allowed when `n` is 0);
/// `out` is NULL (an error) or valid for one `int` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_pool_check_live(
    device: c_int,
    pool_hi: u64,
    pool_lo: u64,
    ptrs: *const *const c_void,
    n: usize,
    out: *mut c_int,
) -> c_int {
    status("cachalot_pool_check_live", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        if n > MAX_CHECK_POINTERS {
            return Err(Failure::invalid(format!(
                "{n} pointers, more than {MAX_CHECK_POINTERS}"
            )));
        }
        if n > 0 && ptrs.is_null() {
            return Err(Failure::invalid("ptrs is NULL"));
        }
        let id = pool_id(pool_hi, pool_lo);
        let dev = device_alloc(device)?;
        let expected: std::collections::HashSet<u64> = if n == 0 {
            Default::default()
        } else {
            // SAFETY: non-NULL, and valid for `n` reads by the caller's contract.
            let s = unsafe { std::slice::from_raw_parts(ptrs, n) };
            s.iter().map(|p| p.addr() as u64).collect()
        };
        let snap = dev.snapshot();
        let in_pool: Vec<_> = snap.segments.iter().filter(|s| s.pool_id == id).collect();
        let known = book(|b| b.uses.contains_key(&(dev.index(), id)));
        if in_pool.is_empty() && !known {
            return Err(capture_failure(format!("no mempool {id:?}")));
        }
        let mut count = 0usize;
        let mut ok = true;
        for b in in_pool
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::ActiveAllocated)
        {
            count += 1;
            if !expected.contains(&b.address) {
                ok = false;
            }
        }
        ok &= count == expected.len();
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(c_int::from(ok)) };
        Ok(())
    })
}
