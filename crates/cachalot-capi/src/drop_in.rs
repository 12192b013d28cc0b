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
mod trackers;
mod uncached;

pub use oom_text::{OVER_1EB, pytorch_text};
pub use pool_source::{
    SourceAllocFn, SourceFreeFn, SourceReleaseFn, cachalot_pool_create_with_source,
    cachalot_pool_set_no_split, cachalot_pool_set_use_on_oom,
};
pub use settings::{CachalotConfigInfo, cachalot_config_keys, cachalot_current_config};
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

// ----- statistics -----

/// One statistic (PyTorch's `c10::CachingAllocator::Stat`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachalotStat {
    /// Current value.
    pub current: i64,
    /// Peak since the last peak reset.
    pub peak: i64,
    /// Sum of increases since the last accumulated reset.
    pub allocated: i64,
    /// Sum of decreases since the last accumulated reset.
    pub freed: i64,
}

/// The statistics of one device, field for field PyTorch's `DeviceStats`
/// (each array: `[all, small_pool, large_pool]`). `cachalot_device_stats_t`
/// in `include/cachalot.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachalotDeviceStats {
    /// Blocks handed out.
    pub allocation: [CachalotStat; 3],
    /// Device segments.
    pub segment: [CachalotStat; 3],
    /// Active blocks.
    pub active: [CachalotStat; 3],
    /// Inactive split blocks.
    pub inactive_split: [CachalotStat; 3],
    /// Bytes handed out.
    pub allocated_bytes: [CachalotStat; 3],
    /// Bytes of segments.
    pub reserved_bytes: [CachalotStat; 3],
    /// Bytes of active blocks.
    pub active_bytes: [CachalotStat; 3],
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: [CachalotStat; 3],
    /// Requested (unrounded) bytes of active blocks.
    pub requested_bytes: [CachalotStat; 3],
    /// Allocations of at least `max_split_size`.
    pub oversize_allocations: CachalotStat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: CachalotStat,
    /// Release-everything-and-retry attempts.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors.
    pub num_ooms: i64,
    /// Synchronizations of all outstanding events.
    pub num_sync_all_streams: i64,
    /// Device allocation calls.
    pub num_device_alloc: i64,
    /// Device free calls.
    pub num_device_free: i64,
    /// `max_split_size` (−1 = unlimited).
    pub max_split_size: i64,
}

fn stat(s: &Stat) -> CachalotStat {
    CachalotStat {
        current: s.current,
        peak: s.peak,
        allocated: s.allocated,
        freed: s.freed,
    }
}

fn arr(a: &StatArray) -> [CachalotStat; 3] {
    [stat(&a.0[0]), stat(&a.0[1]), stat(&a.0[2])]
}

impl From<&DeviceStats> for CachalotDeviceStats {
    fn from(s: &DeviceStats) -> Self {
        Self {
            allocation: arr(&s.allocation),
            segment: arr(&s.segment),
            active: arr(&s.active),
            inactive_split: arr(&s.inactive_split),
            allocated_bytes: arr(&s.allocated_bytes),
            reserved_bytes: arr(&s.reserved_bytes),
            active_bytes: arr(&s.active_bytes),
            inactive_split_bytes: arr(&s.inactive_split_bytes),
            requested_bytes: arr(&s.requested_bytes),
            oversize_allocations: stat(&s.oversize_allocations),
            oversize_segments: stat(&s.oversize_segments),
            num_alloc_retries: s.num_alloc_retries,
            num_ooms: s.num_ooms,
            num_sync_all_streams: s.num_sync_all_streams,
            num_device_alloc: s.num_device_alloc,
            num_device_free: s.num_device_free,
            max_split_size: s.max_split_size,
        }
    }
}

/// Writes the statistics of `device` to `*out`; `out_size` is
/// `sizeof(cachalot_device_stats_t)` as the caller compiled it (a mismatch
/// is [`crate::CACHALOT_ERR_INVALID_ARGUMENT`]: header and library differ).
/// A device without an allocator yet reads as all zeros (`max_split_size`
/// −1).
///
/// # Safety
/// `out` is NULL (an error) or valid for a write of `out_size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_get_stats(
    device: c_int,
    out: *mut CachalotDeviceStats,
    out_size: usize,
) -> c_int {
    status("cachalot_get_stats", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let want = std::mem::size_of::<CachalotDeviceStats>();
        if out_size != want {
            return Err(Failure::invalid(format!(
                "stats struct size {out_size} != {want}: header and library differ"
            )));
        }
        let s = match existing_alloc(device)? {
            Some(d) => d.stats(),
            None => DeviceStats::default(),
        };
        // SAFETY: non-NULL, and the caller guarantees `out_size` (checked
        // equal to the struct's size) writable bytes.
        unsafe { out.write(CachalotDeviceStats::from(&s)) };
        Ok(())
    })
}

/// Cumulative counters of `device` (-1: of every device) := 0
/// (`torch.cuda.reset_accumulated_memory_stats`).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_reset_accumulated_stats(device: c_int) -> c_int {
    status("cachalot_reset_accumulated_stats", || {
        let devs = if device == -1 {
            existing_allocs()?
        } else {
            existing_alloc(device)?.into_iter().collect()
        };
        for d in devs {
            d.reset_accumulated_memory_stats();
        }
        Ok(())
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

// ----- memory history and snapshots -----

/// A block of a snapshot segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachalotBlock {
    /// Device address.
    pub address: u64,
    /// Block size.
    pub size: u64,
    /// Requested bytes (0 when inactive).
    pub requested_size: u64,
    /// 0 = active_allocated, 1 = active_pending_free, 2 = inactive.
    pub state: i32,
    /// Zero.
    pub reserved: i32,
    /// The `data` of the context its allocation was made with (see
    /// [`crate::history`]), NULL when none; valid until the snapshot is freed.
    pub context: *mut c_void,
}

/// A segment of a snapshot; its blocks are `blocks[first_block ..
/// first_block + num_blocks]` of the snapshot, in address order, tiling it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachalotSegment {
    /// Device address.
    pub address: u64,
    /// Segment size.
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active blocks.
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// The stream (the raw `cudaStream_t` value; the mock's index).
    pub stream: u64,
    /// Owning pool id, first half ((0, 0): the default pools).
    pub pool_hi: u64,
    /// Owning pool id, second half.
    pub pool_lo: u64,
    /// Index of the segment's first block in the snapshot's blocks.
    pub first_block: u64,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Device index.
    pub device: i32,
    /// 1 for a small-pool segment.
    pub is_small: i32,
    /// 1 for a mapped range of an expandable segment.
    pub is_expandable: i32,
    /// Zero.
    pub reserved: i32,
    /// The `data` of the context the segment was allocated with, NULL when
    /// none; valid until the snapshot is freed.
    pub context: *mut c_void,
}

/// A memory-history entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachalotTrace {
    /// PyTorch's `TraceEntry::Action` order: alloc 0, free_requested 1,
    /// free_completed 2, segment_alloc 3, segment_free 4, segment_map 5,
    /// segment_unmap 6, snapshot 7, oom 8.
    pub action: i32,
    /// Device index.
    pub device: i32,
    /// Address (device free bytes for oom).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Stream (raw handle value).
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// The `data` of the entry's context, NULL when none; valid until the
    /// snapshot is freed.
    pub context: *mut c_void,
    /// The recording thread's compile context (NUL-terminated), NULL when
    /// none (PyTorch: `"N/A"`).
    pub compile_context: *const c_char,
    /// The recording thread's user metadata (NUL-terminated), NULL when
    /// none (PyTorch: `""`).
    pub user_metadata: *const c_char,
}

/// A snapshot (`cachalot_snapshot_t`): arrays owned by cachalot until
/// [`cachalot_snapshot_free`].
#[repr(C)]
#[derive(Debug)]
pub struct CachalotSnapshot {
    /// Segments, by address.
    pub segments: *const CachalotSegment,
    /// Number of segments.
    pub num_segments: usize,
    /// Blocks of every segment.
    pub blocks: *const CachalotBlock,
    /// Number of blocks.
    pub num_blocks: usize,
    /// History entries, oldest first (none when the history is off or
    /// traces were not asked for).
    pub traces: *const CachalotTrace,
    /// Number of history entries.
    pub num_traces: usize,
    /// The config's `max_split_size` in bytes (`u64::MAX`: unlimited).
    pub max_split_size: u64,
    /// `garbage_collection_threshold`.
    pub garbage_collection_threshold: f64,
    /// 1 when expandable segments are on.
    pub expandable_segments: i32,
    /// 1 unless `graph_capture_record_stream_reuse` is off.
    pub graph_capture_record_stream_reuse: i32,
    /// `roundup_power2_divisions` per power-of-two interval.
    pub roundup_power2_divisions: [u64; 16],
    /// The last configuration string (NUL-terminated).
    pub last_config: *const c_char,
    /// `record_function` annotations, oldest first (none when the history
    /// is off or traces were not asked for).
    pub annotations: *const crate::history::CachalotAnnotation,
    /// Number of annotations.
    pub num_annotations: usize,
}

#[repr(C)]
struct OwnedSnapshot {
    public: CachalotSnapshot,
    segments: Vec<CachalotSegment>,
    blocks: Vec<CachalotBlock>,
    traces: Vec<CachalotTrace>,
    last_config: CString,
    /// The strings and annotations the arrays point to; the engine's
    /// snapshot, whose contexts the `context` pointers are.
    extras: crate::history::SnapshotExtras,
}

fn action_code(a: TraceAction) -> i32 {
    match a {
        TraceAction::Alloc => 0,
        TraceAction::FreeRequested => 1,
        TraceAction::FreeCompleted => 2,
        TraceAction::SegmentAlloc => 3,
        TraceAction::SegmentFree => 4,
        TraceAction::SegmentMap => 5,
        TraceAction::SegmentUnmap => 6,
        TraceAction::Snapshot => 7,
        TraceAction::Oom => 8,
    }
}

fn state_code(s: BlockState) -> i32 {
    match s {
        BlockState::ActiveAllocated => 0,
        BlockState::ActivePendingFree => 1,
        BlockState::Inactive => 2,
    }
}

fn stream_value(debug: &str) -> u64 {
    cachalot::export::stream_number(debug) as u64
}

fn build_snapshot(dev: &DeviceAllocator, pool: PoolId, include_traces: bool) -> Box<OwnedSnapshot> {
    let snap = dev.snapshot();
    let cfg = dev.config();
    let ctx = |c: &Option<cachalot::HistoryContext>| crate::history::context_data(c.as_ref());
    let mut extras = crate::history::SnapshotExtras::default();
    let mut segments = Vec::new();
    let mut blocks = Vec::new();
    for s in snap
        .segments
        .iter()
        .filter(|s| pool == DEFAULT_POOL || s.pool_id == pool)
    {
        let first = blocks.len() as u64;
        blocks.extend(s.blocks.iter().map(|b| CachalotBlock {
            address: b.address,
            size: b.size,
            requested_size: b.requested_size,
            state: state_code(b.state),
            reserved: 0,
            context: ctx(&b.context),
        }));
        segments.push(CachalotSegment {
            address: s.address,
            total_size: s.total_size,
            allocated_size: s.allocated_size,
            active_size: s.active_size,
            requested_size: s.requested_size,
            stream: stream_value(&s.stream),
            pool_hi: s.pool_id.0,
            pool_lo: s.pool_id.1,
            first_block: first,
            num_blocks: s.blocks.len() as u64,
            device: i32::try_from(s.device).unwrap_or(i32::MAX),
            is_small: i32::from(s.is_small),
            is_expandable: i32::from(s.is_expandable),
            reserved: 0,
            context: ctx(&s.context),
        });
    }
    let device = i32::try_from(dev.index()).unwrap_or(i32::MAX);
    let traces: Vec<CachalotTrace> = if include_traces {
        snap.traces
            .iter()
            .map(|t| CachalotTrace {
                action: action_code(t.action),
                device,
                addr: t.addr,
                size: t.size,
                stream: stream_value(&t.stream),
                time_us: t.time_us,
                context: ctx(&t.context),
                compile_context: extras.intern(t.compile_context.as_ref()),
                user_metadata: extras.intern(t.user_metadata.as_ref()),
            })
            .collect()
    } else {
        Vec::new()
    };
    if include_traces {
        extras.annotations(&snap.annotations, device);
    }
    let (config, last_config) = CachalotConfigInfo::of(&cfg);
    let mut owned = Box::new(OwnedSnapshot {
        public: CachalotSnapshot {
            segments: std::ptr::null(),
            num_segments: segments.len(),
            blocks: std::ptr::null(),
            num_blocks: blocks.len(),
            traces: std::ptr::null(),
            num_traces: traces.len(),
            max_split_size: config.max_split_size,
            garbage_collection_threshold: config.garbage_collection_threshold,
            expandable_segments: config.expandable_segments,
            graph_capture_record_stream_reuse: config.graph_capture_record_stream_reuse,
            roundup_power2_divisions: config.roundup_power2_divisions,
            last_config: std::ptr::null(),
            annotations: std::ptr::null(),
            num_annotations: 0,
        },
        segments,
        blocks,
        traces,
        last_config,
        extras,
    });
    owned.extras.keep(snap);
    (owned.public.annotations, owned.public.num_annotations) = owned.extras.annotation_array();
    owned.public.segments = owned.segments.as_ptr();
    owned.public.blocks = owned.blocks.as_ptr();
    owned.public.traces = owned.traces.as_ptr();
    owned.public.last_config = owned.last_config.as_ptr();
    owned
}

/// Writes a snapshot of `device` to `*out`: every segment (or, for a pool
/// id other than `(0, 0)`, that pool's segments) with its blocks, and,
/// when `include_traces` is non-zero, the memory history. Release it with
/// [`cachalot_snapshot_free`]. A device not in use yet (no allocator)
/// writes NULL (and opens nothing).
///
/// # Safety
/// `out` is NULL (an error) or valid for one pointer write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_snapshot(
    device: c_int,
    pool_hi: u64,
    pool_lo: u64,
    include_traces: c_int,
    out: *mut *mut CachalotSnapshot,
) -> c_int {
    status("cachalot_snapshot", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let Some(dev) = existing_alloc(device)? else {
            // SAFETY: non-NULL and valid for writes by the caller's contract.
            unsafe { out.write(std::ptr::null_mut()) };
            return Ok(());
        };
        let owned = build_snapshot(dev, pool_id(pool_hi, pool_lo), include_traces != 0);
        // `public` is the first field of the repr(C) `OwnedSnapshot`: the
        // pointer to it is the pointer to the whole.
        let p = Box::into_raw(owned).cast::<CachalotSnapshot>();
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(p) };
        Ok(())
    })
}

/// Releases a snapshot from [`cachalot_snapshot`] (NULL is a no-op).
///
/// # Safety
/// `s` is NULL or a snapshot returned by [`cachalot_snapshot`] and not yet
/// released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_snapshot_free(s: *mut CachalotSnapshot) {
    entry("cachalot_snapshot_free", false, (), || {
        if !s.is_null() {
            // SAFETY: by the caller's contract `s` came from `Box::into_raw`
            // of an `OwnedSnapshot` (whose first field it points to) in
            // `cachalot_snapshot`, and is released once.
            drop(unsafe { Box::from_raw(s.cast::<OwnedSnapshot>()) });
        }
        Ok(())
    })
}
