//! # cachalot-capi
//!
//! The C ABI of cachalot, on the [`cachalot`] facade's per-device global
//! allocators. Its first user is PyTorch's `CUDAPluggableAllocator`:
//!
//! ```python
//! alloc = torch.cuda.memory.CUDAPluggableAllocator(
//!     "libcachalot_capi.so", "cachalot_malloc", "cachalot_free")
//! torch.cuda.memory.change_current_allocator(alloc)
//! ```
//!
//! (`cachalot_torch.install(mode="pluggable")` of `python/cachalot_torch/`
//! does this.) Its main user is the C++ shim of `python/cachalot_torch/`, a
//! subclass of PyTorch's `CUDAAllocator` that forwards every method to the
//! functions of [`drop_in`] (`cachalot_torch.install()`). The C
//! declarations are in `include/cachalot.h`.
//!
//! # Conventions
//!
//! * Every entry point runs under `catch_unwind`: no panic crosses the C
//!   boundary; a panic is reported as [`CACHALOT_ERR_PANIC`].
//! * Functions returning `int` return [`CACHALOT_OK`] (0) or a positive
//!   `CACHALOT_ERR_*` code. [`cachalot_malloc`] returns NULL on error and
//!   [`cachalot_free`] returns nothing (PyTorch's signatures); for those,
//!   [`cachalot_last_error_code`] tells. Every call first clears the calling
//!   thread's last error, and a failing call sets it: a code and a message
//!   ([`cachalot_last_error`]).
//! * Because PyTorch cannot see a failure of `cachalot_malloc` /
//!   `cachalot_free`, those two also print the message to stderr (turn that
//!   off with [`cachalot_set_error_logging`]).
//! * Device indices are the backend's ordinals (CUDA: as `CUDA_VISIBLE_DEVICES`
//!   leaves them, the same as PyTorch's). A negative or out-of-range index is
//!   [`CACHALOT_ERR_INVALID_ARGUMENT`], never a crash; so is a pointer that
//!   this allocator did not hand out ([`CACHALOT_ERR_INVALID_POINTER`]), one
//!   already freed ([`CACHALOT_ERR_DOUBLE_FREE`]) and one inside a live
//!   allocation ([`CACHALOT_ERR_INTERIOR_POINTER`]).
//! * Strings are read up to their NUL; a configuration string over 64 KiB
//!   is [`CACHALOT_ERR_CONFIG`], and error messages echo at most 64
//!   characters of any input.
//!
//! # Streams
//!
//! The `stream` arguments are raw `cudaStream_t` values. 0 is the legacy
//! default stream, which is also PyTorch's default stream. Any other CUDA
//! handle not seen before is added to the device's stream table with the
//! unsafe [`cachalot::cuda::CudaBackend::wrap_stream`], whose contract is
//! that the stream outlives its use by the allocator. PyTorch keeps that
//! contract: its streams (the default stream, the per-device pools behind
//! `torch.cuda.Stream()`, and the high-priority pools) are created once and
//! never destroyed while the process runs; only `torch.cuda.ExternalStream`
//! wraps a stream whose lifetime the user manages, and the user must keep it
//! alive while memory allocated on it is live or cached. On the mock backend
//! a stream handle is the mock's stream index (0 = default); streams there
//! come from [`cachalot_stream_create`].

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use cachalot::core::config::ConfigReplay;
use cachalot::{AllocatorConfig, BackendKind, DeviceAllocator, DeviceStats, Error, Stream};
use parking_lot::Mutex;

pub mod checkpoint;
pub mod drop_in;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
pub mod history;
pub mod ipc;

/// Success.
pub const CACHALOT_OK: c_int = 0;
/// An argument is invalid: a negative or out-of-range device, a negative
/// size, a NULL or non-UTF-8 string, an unknown stream handle.
pub const CACHALOT_ERR_INVALID_ARGUMENT: c_int = 1;
/// Out of memory now, after freeing the cache and retrying (freeing memory
/// may make a retry succeed).
pub const CACHALOT_ERR_OUT_OF_MEMORY: c_int = 2;
/// The request can never fit on the device.
pub const CACHALOT_ERR_NEVER_FITS: c_int = 3;
/// The pointer was never handed out by this allocator (on that device).
pub const CACHALOT_ERR_INVALID_POINTER: c_int = 4;
/// The pointer lies in this allocator's memory but is not a live allocation
/// (double free, or use after free).
pub const CACHALOT_ERR_DOUBLE_FREE: c_int = 5;
/// A malformed or invalid configuration string.
pub const CACHALOT_ERR_CONFIG: c_int = 6;
/// Misuse of graph capture.
pub const CACHALOT_ERR_CAPTURE: c_int = 7;
/// A driver call failed.
pub const CACHALOT_ERR_BACKEND: c_int = 8;
/// No backend or device is available.
pub const CACHALOT_ERR_NO_DEVICE: c_int = 9;
/// A panic inside cachalot was caught at the C boundary (a bug).
pub const CACHALOT_ERR_PANIC: c_int = 10;
/// The pointer lies inside a live allocation but is not its start (`free`
/// and `record_stream` take the address `cachalot_malloc` returned).
pub const CACHALOT_ERR_INTERIOR_POINTER: c_int = 11;

/// A failed call: its code and message.
#[derive(Debug)]
struct Failure {
    code: c_int,
    message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: CACHALOT_ERR_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::OutOfMemory(_) => CACHALOT_ERR_OUT_OF_MEMORY,
            Error::NeverFits { .. } => CACHALOT_ERR_NEVER_FITS,
            Error::UnknownPointer(_) => CACHALOT_ERR_INVALID_POINTER,
            Error::DoubleFree(_) | Error::NotLive(_) => CACHALOT_ERR_DOUBLE_FREE,
            Error::InteriorPointer { .. } => CACHALOT_ERR_INTERIOR_POINTER,
            Error::Config(_) => CACHALOT_ERR_CONFIG,
            Error::Capture(_) => CACHALOT_ERR_CAPTURE,
            Error::Backend(_) | Error::ReleaseFailed { .. } => CACHALOT_ERR_BACKEND,
            Error::NoDevice(_) => CACHALOT_ERR_NO_DEVICE,
            Error::InvalidArgument(_) | Error::InvalidEnv { .. } => CACHALOT_ERR_INVALID_ARGUMENT,
        };
        Self {
            code,
            message: e.to_string(),
        }
    }
}

impl From<cachalot::ConfigError> for Failure {
    fn from(e: cachalot::ConfigError) -> Self {
        Error::from(e).into()
    }
}

// ----- last error -----

thread_local! {
    static LAST_ERROR: RefCell<Option<(c_int, CString)>> = const { RefCell::new(None) };
}

static LOG_ERRORS: AtomicBool = AtomicBool::new(true);

fn clear_last_error() {
    // `try_with`: during thread teardown (PyTorch may free tensors from
    // thread-local destructors) the slot may be gone; nothing to clear then.
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut()
            && e.is_some()
        {
            *e = None;
        }
    });
}

fn set_last_error(code: c_int, message: String) {
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            *e = Some((code, c));
        }
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// Runs `f` as the body of the entry point `name`: clears the last error,
/// catches panics, and on failure sets the last error (printing it when
/// `log` and logging is on) and returns its code.
fn guarded<T>(name: &str, log: bool, f: impl FnOnce() -> Result<T, Failure>) -> Result<T, c_int> {
    clear_last_error();
    let failure = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => return Ok(v),
        Ok(Err(f)) => f,
        Err(payload) => Failure {
            code: CACHALOT_ERR_PANIC,
            message: format!("internal panic: {}", panic_message(&*payload)),
        },
    };
    let message = format!("{name}: {}", failure.message);
    if log && LOG_ERRORS.load(Ordering::Relaxed) {
        // Not `eprintln!`, which panics when stderr is closed.
        let _ = writeln!(std::io::stderr(), "cachalot: {message}");
    }
    set_last_error(failure.code, message);
    Err(failure.code)
}

/// [`guarded`] returning `on_error` on failure.
fn entry<T>(name: &str, log: bool, on_error: T, f: impl FnOnce() -> Result<T, Failure>) -> T {
    guarded(name, log, f).unwrap_or(on_error)
}

/// [`guarded`] for functions returning a status code.
fn status(name: &str, f: impl FnOnce() -> Result<(), Failure>) -> c_int {
    match guarded(name, false, f) {
        Ok(()) => CACHALOT_OK,
        Err(code) => code,
    }
}

fn last_code_or_ok() -> c_int {
    LAST_ERROR
        .try_with(|e| {
            e.try_borrow()
                .ok()
                .and_then(|e| e.as_ref().map(|(c, _)| *c))
        })
        .ok()
        .flatten()
        .unwrap_or(CACHALOT_OK)
}

// ----- devices and configuration -----

/// The capi's view of the global allocators, one slot per device, filled on
/// first use (after the configurations of [`cachalot_set_config`] are applied).
static DEVICES: OnceLock<Vec<OnceLock<Arc<DeviceAllocator>>>> = OnceLock::new();
/// The net effect of the configuration strings set with
/// [`cachalot_set_config`] (`None` before the first), in bounded space: at
/// most two strings to replay on a device's allocator when it is created,
/// however many calls there were. Also the lock under which device slots
/// are filled.
static CONFIGS: Mutex<Option<ConfigReplay>> = Mutex::new(None);

/// Bytes of configuration text the C ABI holds for devices not yet in use
/// (an observable of [`cachalot_set_config`]'s storage: bounded, whatever
/// the number of calls).
pub fn stored_config_bytes() -> usize {
    CONFIGS
        .lock()
        .as_ref()
        .map_or(0, ConfigReplay::stored_bytes)
}

fn device_table() -> Result<&'static [OnceLock<Arc<DeviceAllocator>>], Failure> {
    if let Some(t) = DEVICES.get() {
        return Ok(t);
    }
    let n = cachalot::accelerator::device_count()?;
    Ok(DEVICES.get_or_init(|| (0..n).map(|_| OnceLock::new()).collect()))
}

fn device_index(device: c_int) -> Result<(u32, &'static OnceLock<Arc<DeviceAllocator>>), Failure> {
    let table = device_table()?;
    let idx = u32::try_from(device)
        .map_err(|_| Failure::invalid(format!("device index {device} is negative")))?;
    let slot = table.get(idx as usize).ok_or_else(|| {
        if table.is_empty() {
            Failure {
                code: CACHALOT_ERR_NO_DEVICE,
                message: "the backend reports no device".into(),
            }
        } else {
            Failure::invalid(format!(
                "device index {device} out of range ({} device(s))",
                table.len()
            ))
        }
    })?;
    Ok((idx, slot))
}

/// The allocator of `device`, created (and configured) on first use.
fn device_alloc(device: c_int) -> Result<&'static DeviceAllocator, Failure> {
    let (idx, slot) = device_index(device)?;
    if let Some(a) = slot.get() {
        return Ok(a);
    }
    let configs = CONFIGS.lock();
    if let Some(a) = slot.get() {
        return Ok(a);
    }
    let a = cachalot::allocator(Some(idx))?;
    for c in configs.iter().flat_map(ConfigReplay::strings) {
        a.set_config(&c)?;
    }
    history::on_new_allocator(&a);
    drop_in::install_trackers(&a);
    Ok(slot.get_or_init(|| a))
}

/// The allocator of `device` if one exists (never creates one).
fn existing_alloc(device: c_int) -> Result<Option<&'static DeviceAllocator>, Failure> {
    let (idx, slot) = device_index(device)?;
    if let Some(a) = slot.get() {
        return Ok(Some(a));
    }
    if cachalot::try_allocator(Some(idx))?.is_some() {
        return device_alloc(device).map(Some);
    }
    Ok(None)
}

/// Every device allocator that exists.
fn existing_allocs() -> Result<Vec<&'static DeviceAllocator>, Failure> {
    let n = device_table()?.len();
    let mut out = Vec::new();
    for d in 0..n {
        if let Some(a) = existing_alloc(d as c_int)? {
            out.push(a);
        }
    }
    Ok(out)
}

/// The allocator's stream for the raw handle `raw` (0 = default stream).
fn stream_of(dev: &DeviceAllocator, raw: *mut c_void) -> Result<Stream, Failure> {
    let handle = raw.addr() as u64;
    if let Some(s) = dev.stream_by_handle(handle) {
        return Ok(s);
    }
    if dev.backend_kind() == BackendKind::Cuda {
        // SAFETY: `raw` is a `cudaStream_t` that the caller passed for use on
        // this device. `wrap_stream` requires the stream to stay alive while
        // the allocator uses it; the C contract (include/cachalot.h) puts that
        // on the caller, and PyTorch's streams are never destroyed (see the
        // crate docs). The handle is only stored and passed to the driver,
        // never dereferenced here.
        let s = unsafe { cachalot::cuda::CudaBackend::wrap_stream(raw.cast()) };
        return Ok(dev.adopt_cuda_stream(s)?);
    }
    Err(Failure::invalid(format!(
        "unknown stream handle {handle:#x} for {} device {}",
        dev.backend_kind(),
        dev.index()
    )))
}

/// Reads a C string argument.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string valid for reads.
unsafe fn c_str<'a>(s: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL, and the caller guarantees a valid NUL-terminated string.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

fn backend_cstr(kind: BackendKind) -> &'static CStr {
    match kind {
        BackendKind::Mock => c"mock",
        BackendKind::Cuda => c"cuda",
        BackendKind::Hip => c"hip",
        BackendKind::LevelZero => c"level-zero",
    }
}

// ----- the C functions -----

/// Chooses the backend: `"cuda"`, `"mock"` (or `"hip"`, `"level-zero"` when
/// compiled in); NULL or `""` detects it (`CACHALOT_BACKEND`, else CUDA when a
/// GPU is usable, else the mock). Optional: without it the first call
/// detects. Choosing again the same backend is a no-op; another one, once
/// chosen, is an error.
///
/// # Safety
/// `backend` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_init(backend: *const c_char) -> c_int {
    status("cachalot_init", || {
        let kind = if backend.is_null() {
            BackendKind::detect()?
        } else {
            // SAFETY: non-NULL; the caller guarantees a NUL-terminated string.
            let name = unsafe { c_str(backend, "backend") }?;
            if name.trim().is_empty() {
                BackendKind::detect()?
            } else {
                name.parse()?
            }
        };
        cachalot::init(kind)?;
        device_table()?;
        Ok(())
    })
}

/// Chooses the backend as [`cachalot_init`] does, but does not touch its
/// driver: the devices are counted (CUDA's `cuInit`) at the first call
/// that needs a device, as PyTorch initializes CUDA at its first use (the
/// PyTorch drop-in installs with it, so that `import torch` and a fork
/// before any CUDA use stay as they are natively). A backend that is not
/// compiled in is an error now; one without a device, at that first call.
/// NULL or `""` is an error (detection needs the driver).
///
/// # Safety
/// `backend` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_select(backend: *const c_char) -> c_int {
    status("cachalot_select", || {
        // SAFETY: the caller guarantees NULL or a NUL-terminated string.
        let name = unsafe { c_str(backend, "backend") }?;
        cachalot::select(name.parse()?)?;
        Ok(())
    })
}

/// The name of the backend in use (`"cuda"`, `"mock"`, ...), choosing it if
/// not yet chosen; a static string. NULL on error.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_backend_name() -> *const c_char {
    entry("cachalot_backend_name", false, std::ptr::null(), || {
        Ok(backend_cstr(cachalot::backend_kind()?).as_ptr())
    })
}

/// Number of devices of the backend; -1 on error.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_device_count() -> c_int {
    entry("cachalot_device_count", false, -1, || {
        Ok(c_int::try_from(device_table()?.len()).unwrap_or(c_int::MAX))
    })
}

/// Allocates `size` bytes on `device` for use on `stream` (PyTorch's
/// `alloc_fn`: `void* alloc(ssize_t size, int device, cudaStream_t stream)`).
/// Returns the device address; NULL for `size == 0` (success) and on error
/// (the last error says which, and the message is printed to stderr).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    entry("cachalot_malloc", true, std::ptr::null_mut(), || {
        let size =
            u64::try_from(size).map_err(|_| Failure::invalid(format!("negative size {size}")))?;
        let dev = device_alloc(device)?;
        let s = stream_of(dev, stream)?;
        let addr = dev.raw_alloc(size, s)?;
        Ok(std::ptr::with_exposed_provenance_mut(addr as usize))
    })
}

/// Frees `ptr`, allocated by [`cachalot_malloc`] on `device` (PyTorch's
/// `free_fn`: `void free(void* ptr, ssize_t size, int device, cudaStream_t
/// stream)`). `size` and `stream` are those of the allocation; cachalot knows
/// both and ignores them. NULL is a no-op. An unknown pointer, a double free
/// or a bad device sets the last error and prints it; nothing else happens.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    let _ = (size, stream);
    entry("cachalot_free", true, (), || {
        let addr = ptr.addr() as u64;
        if addr == 0 {
            return Ok(());
        }
        match existing_alloc(device)? {
            Some(dev) => Ok(dev.raw_free(addr)?),
            None => Err(Error::UnknownPointer(addr).into()),
        }
    })
}

/// Marks the allocation at `ptr` on `device` as used on `stream` too
/// (PyTorch's `record_stream`): its memory is not reused before the work
/// queued on `stream` up to its free has completed.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_record_stream(
    ptr: *mut c_void,
    device: c_int,
    stream: *mut c_void,
) -> c_int {
    status("cachalot_record_stream", || {
        let addr = ptr.addr() as u64;
        if drop_in::is_uncached(addr) {
            // allocated while the cache was off: freed by the device at once
            return Ok(());
        }
        let dev = existing_alloc(device)?.ok_or(Error::UnknownPointer(addr))?;
        let s = stream_of(dev, stream)?;
        Ok(dev.record_stream(addr, s)?)
    })
}

/// Releases the unused cached memory of `device` (-1: of every device) to
/// the driver (`torch.cuda.empty_cache()`; PyTorch's pluggable interface
/// does not forward that call, so call this one).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_empty_cache(device: c_int) -> c_int {
    status("cachalot_empty_cache", || {
        let devs = if device == -1 {
            existing_allocs()?
        } else {
            existing_alloc(device)?.into_iter().collect()
        };
        for d in devs {
            d.empty_cache()?;
        }
        Ok(())
    })
}

/// Resets the peak statistics of `device` (-1: of every device) to their
/// current values (`torch.cuda.reset_peak_memory_stats()`).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_reset_peak_stats(device: c_int) -> c_int {
    status("cachalot_reset_peak_stats", || {
        let devs = if device == -1 {
            existing_allocs()?
        } else {
            existing_alloc(device)?.into_iter().collect()
        };
        for d in devs {
            d.reset_peak_memory_stats();
        }
        Ok(())
    })
}

/// The flat statistics of `device` with PyTorch's 122 keys
/// (`torch.cuda.memory_stats()`: `"reserved_bytes.all.peak"`, ...) as a JSON
/// object of integers, in a string to release with [`cachalot_string_free`].
/// A device without an allocator yet reads as all zeros. NULL on error.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_memory_stats_json(device: c_int) -> *mut c_char {
    entry(
        "cachalot_memory_stats_json",
        false,
        std::ptr::null_mut(),
        || {
            let stats = match existing_alloc(device)? {
                Some(d) => d.memory_stats(),
                None => DeviceStats::default().to_flat(),
            };
            let json = serde_json::to_string(&stats)
                .map_err(|e| Failure::invalid(format!("serializing the stats: {e}")))?;
            let c = CString::new(json).map_err(|_| Failure::invalid("NUL in the stats JSON"))?;
            Ok(c.into_raw())
        },
    )
}

/// Releases a string returned by cachalot (NULL is a no-op).
///
/// # Safety
/// `s` is NULL or a string returned by [`cachalot_memory_stats_json`] and not
/// yet released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_string_free(s: *mut c_char) {
    entry("cachalot_string_free", false, (), || {
        if !s.is_null() {
            // SAFETY: the caller guarantees `s` came from `CString::into_raw`
            // in this library and is released once.
            drop(unsafe { CString::from_raw(s) });
        }
        Ok(())
    })
}

/// Applies an allocator configuration string with PyTorch's grammar
/// (`"max_split_size_mb:256,garbage_collection_threshold:0.8"`, plus
/// cachalot's keys) to every device: those already in use now, the others
/// when first used (PyTorch's `torch.cuda.memory._set_allocator_settings`).
/// A bad key or value is [`CACHALOT_ERR_CONFIG`] naming it, and nothing
/// changes; so is a string over 64 KiB. The configuration of
/// `CACHALOT_ALLOC_CONF` (then `PYTORCH_CUDA_ALLOC_CONF`, ...) applies
/// first, and each string is checked against the configuration the strings
/// before it produce. Memory stays flat however often it is called: what
/// devices not yet in use will replay is the net effect of the strings
/// ([`ConfigReplay`], see [`stored_config_bytes`]), not each string.
///
/// # Safety
/// `config` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_set_config(config: *const c_char) -> c_int {
    status("cachalot_set_config", || {
        // SAFETY: the caller guarantees NULL or a NUL-terminated string.
        let s = unsafe { c_str(config, "config") }?;
        let mut configs = CONFIGS.lock();
        let mut next = match configs.as_ref() {
            Some(r) => r.clone(),
            None => ConfigReplay::new(AllocatorConfig::from_env()?),
        };
        next.push(s)?;
        for a in cachalot::initialized_allocators() {
            a.set_config(s)?;
        }
        *configs = Some(next);
        Ok(())
    })
}

/// Creates a new stream on `device`, owned by the allocator (it lives as long
/// as the process), and writes its handle to `*out` (a `cudaStream_t` on
/// CUDA, the stream index on the mock).
///
/// # Safety
/// `out` is NULL (an error) or valid for one pointer-sized write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_stream_create(device: c_int, out: *mut *mut c_void) -> c_int {
    status("cachalot_stream_create", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let dev = device_alloc(device)?;
        let s = dev.new_stream()?;
        let handle = dev.stream_handle(s)?;
        // SAFETY: non-NULL and, by the caller's contract, valid for writes.
        unsafe { out.write(std::ptr::with_exposed_provenance_mut(handle as usize)) };
        Ok(())
    })
}

/// Turns printing of [`cachalot_malloc`] / [`cachalot_free`] failures to
/// stderr on (non-zero, the default) or off (0).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_set_error_logging(on: c_int) {
    LOG_ERRORS.store(on != 0, Ordering::Relaxed);
}

/// The code of the calling thread's last error ([`CACHALOT_OK`] when the last
/// cachalot call on this thread succeeded).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_last_error_code() -> c_int {
    last_code_or_ok()
}

/// The message of the calling thread's last error, NULL when the last
/// cachalot call on this thread succeeded. The string belongs to cachalot and
/// stays valid until the thread's next cachalot call.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|e| {
            e.try_borrow()
                .ok()
                .and_then(|e| e.as_ref().map(|(_, m)| m.as_ptr()))
        })
        .ok()
        .flatten()
        .unwrap_or(std::ptr::null())
}
