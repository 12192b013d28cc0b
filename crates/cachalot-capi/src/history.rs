//! Memory history with the caller's contexts, for the PyTorch drop-in's
//! `recordHistory` (`torch.cuda.memory._record_memory_history`) and the
//! profiler's memory events.
//!
//! PyTorch's allocator calls the recorder PyTorch hands it (a function
//! returning a `std::shared_ptr<c10::GatheredContext>`: the Python, script
//! and C++ frames) outside its lock, and keeps the result with the block and
//! in the trace entries. The shim does the same: it calls the recorder, and
//! passes the result to [`cachalot_context_enter`] as an opaque
//! [`CachalotContext`] (`data` and the `release` function that drops it)
//! before its allocate / free / `empty_cache` call, and
//! [`cachalot_context_exit`] after. The engine keeps the context where
//! PyTorch keeps it (`cachalot::core::engine::history`); snapshots hand the
//! `data` pointers back (valid until [`crate::drop_in::cachalot_snapshot_free`]),
//! and PyTorch's own snapshot code turns them into frames. `release` runs
//! once, on whatever thread drops the last reference (possibly under an
//! allocator lock: it must not call back into cachalot).
//!
//! Settings apply as PyTorch's do: [`cachalot_history_configure`] with
//! device −1 sets every device, present and future (PyTorch's
//! `recordHistory` goes to every device's allocator); called again while
//! on, the entries stay unless `clear`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

use cachalot::core::engine::history;
use cachalot::{ActionSet, DeviceAllocator, HistoryConfig, HistoryContext, RecordContext};
use parking_lot::Mutex;

use crate::{Failure, c_str, device_alloc, device_table, existing_alloc, existing_allocs, status};

/// Most entries the history keeps: a larger `max_entries` (PyTorch's
/// default is `sys.maxsize`, "unbounded") is clamped to it.
pub const MAX_HISTORY_ENTRIES: u64 = 1 << 22;
/// Most `skip_actions` names [`cachalot_history_configure`] reads.
pub const MAX_SKIP_ACTIONS: usize = 64;
/// Most key/value pairs of one annotation.
pub const MAX_ANNOTATION_PAIRS: usize = 64;
/// Longest string (annotation key or value, compile context, user
/// metadata) accepted, in bytes.
pub const MAX_HISTORY_STRING: usize = 1 << 16;

/// A caller's context (`cachalot_context_t`): `data` is opaque to
/// cachalot; `release(data)` is called exactly once, from any thread, when
/// cachalot drops its last reference. A NULL `data` is no context.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CachalotContext {
    /// The caller's value.
    pub data: *mut c_void,
    /// Drops it (NULL: nothing to drop).
    pub release: Option<unsafe extern "C" fn(*mut c_void)>,
}

/// A [`CachalotContext`] owned by the engine's history.
pub(crate) struct ForeignContext {
    data: *mut c_void,
    release: Option<unsafe extern "C" fn(*mut c_void)>,
}

// SAFETY: `data` is never dereferenced by cachalot; it is only handed back
// (snapshots) and passed to `release`, which by the contract of
// `cachalot_context_t` may run on any thread.
unsafe impl Send for ForeignContext {}
// SAFETY: as for `Send`: shared references only read the pointer value.
unsafe impl Sync for ForeignContext {}

impl Drop for ForeignContext {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            // SAFETY: the caller's `release` for its own `data`, called once
            // (this value is dropped once), as `cachalot_context_t` specifies.
            unsafe { release(self.data) };
        }
    }
}

/// The caller's `data` of a context made by [`cachalot_context_enter`]
/// (NULL for a context from elsewhere).
pub(crate) fn context_data(ctx: Option<&HistoryContext>) -> *mut c_void {
    ctx.and_then(|c| c.downcast_ref::<ForeignContext>())
        .map_or(std::ptr::null_mut(), |f| f.data)
}

/// The settings `cachalot_history_configure(-1, ...)` gave every device
/// (`None`: off), for devices whose allocator is created later.
static ALL_DEVICES: Mutex<Option<HistoryConfig>> = Mutex::new(None);
/// Whether any device's history is on (compile contexts are kept only then).
static ANY_ON: AtomicBool = AtomicBool::new(false);

/// Applies the every-device settings to an allocator just created.
pub(crate) fn on_new_allocator(dev: &DeviceAllocator) {
    if let Some(c) = *ALL_DEVICES.lock() {
        dev.record_memory_history(Some(c));
    }
}

fn apply(dev: &DeviceAllocator, config: Option<HistoryConfig>, clear: bool) {
    match config {
        None => dev.record_memory_history(None),
        Some(c) => {
            dev.record_memory_history(Some(c));
            if clear {
                dev.clear_memory_history();
            }
        }
    }
}

fn refresh_any_on() -> Result<(), Failure> {
    let all = ALL_DEVICES.lock().is_some();
    let on = all
        || existing_allocs()?
            .iter()
            .any(|d| d.history_config().is_some());
    ANY_ON.store(on, Ordering::Relaxed);
    Ok(())
}

/// Reads `n` C strings of at most [`MAX_HISTORY_STRING`] bytes.
///
/// # Safety
/// `strs` is valid for `n` reads of NUL-terminated strings (NULL when `n` is 0).
unsafe fn strings<'a>(
    strs: *const *const c_char,
    n: usize,
    what: &str,
) -> Result<Vec<&'a str>, Failure> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if strs.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and valid for `n` reads by the caller's contract.
    let ptrs = unsafe { std::slice::from_raw_parts(strs, n) };
    ptrs.iter()
        .map(|&p| {
            // SAFETY: each is a NUL-terminated string by the caller's contract.
            let s = unsafe { c_str(p, what) }?;
            if s.len() > MAX_HISTORY_STRING {
                return Err(Failure::invalid(format!(
                    "{what}: a string of {} bytes, more than {MAX_HISTORY_STRING}",
                    s.len()
                )));
            }
            Ok(s)
        })
        .collect()
}

/// PyTorch's `recordHistory`: turns the memory history of `device` (−1:
/// every device, including those used later) on (`enabled` non-zero) or
/// off (dropping entries and contexts).
///
/// * `max_entries`: ring capacity, clamped to [`MAX_HISTORY_ENTRIES`];
/// * `record_context`: PyTorch's `RecordContext` (0 never, 1 state, 2
///   alloc, 3 all): which contexts are kept (see the module docs); another
///   value is [`crate::CACHALOT_ERR_INVALID_ARGUMENT`];
/// * `clear`: drop the entries recorded so far (otherwise turning it on
///   again keeps them under the new settings, as PyTorch does);
/// * `skip_actions[0..num_skip)`: action names not recorded (`"alloc"`,
///   `"free_requested"`, …); an unknown name is
///   [`crate::CACHALOT_ERR_INVALID_ARGUMENT`] ("Unknown TraceEntry action:
///   …"), more than [`MAX_SKIP_ACTIONS`] too. Nothing changes on an error.
///
/// # Safety
/// `skip_actions` is valid for `num_skip` reads of NUL-terminated strings
/// (NULL when `num_skip` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_history_configure(
    device: c_int,
    enabled: c_int,
    max_entries: u64,
    record_context: c_int,
    clear: c_int,
    skip_actions: *const *const c_char,
    num_skip: usize,
) -> c_int {
    status("cachalot_history_configure", || {
        if num_skip > MAX_SKIP_ACTIONS {
            return Err(Failure::invalid(format!(
                "{num_skip} skip_actions, more than {MAX_SKIP_ACTIONS}"
            )));
        }
        let level = u32::try_from(record_context)
            .ok()
            .and_then(RecordContext::from_level)
            .ok_or_else(|| {
                Failure::invalid(format!(
                    "record_context {record_context} is not 0 (never), 1 (state), 2 (alloc) or 3 (all)"
                ))
            })?;
        // SAFETY: the caller's contract.
        let names = unsafe { strings(skip_actions, num_skip, "skip_actions") }?;
        let skip = ActionSet::parse(names.iter().copied())?;
        let config = (enabled != 0).then(|| HistoryConfig {
            max_entries: max_entries.min(MAX_HISTORY_ENTRIES) as usize,
            backtraces: false,
            record_context: level,
            skip_actions: skip,
        });
        if device == -1 {
            // first for the devices created from now on (the lock is not
            // held below: creating an allocator takes it)
            *ALL_DEVICES.lock() = config;
            for d in existing_allocs()? {
                apply(d, config, clear != 0);
            }
        } else {
            apply(device_alloc(device)?, config, clear != 0);
        }
        refresh_any_on()
    })
}

/// [`cachalot_history_configure`] of one device (≥ 0), keeping every
/// context, skipping nothing.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_record_history(
    device: c_int,
    enabled: c_int,
    max_entries: u64,
    clear: c_int,
) -> c_int {
    status("cachalot_record_history", || {
        let dev = device_alloc(device)?;
        let config = (enabled != 0).then(|| HistoryConfig {
            max_entries: max_entries.min(MAX_HISTORY_ENTRIES) as usize,
            ..HistoryConfig::default()
        });
        apply(dev, config, clear != 0);
        refresh_any_on()
    })
}

/// Writes 1 to `*out` when `device`'s memory history is on, else 0.
///
/// # Safety
/// `out` is NULL (an error) or valid for one `int` write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_history_enabled(device: c_int, out: *mut c_int) -> c_int {
    status("cachalot_history_enabled", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let on = match existing_alloc(device)? {
            Some(d) => d.history_config().is_some(),
            None => ALL_DEVICES.lock().is_some(),
        };
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(c_int::from(on)) };
        Ok(())
    })
}

thread_local! {
    /// The contexts [`cachalot_context_enter`] replaced, innermost last.
    static ENTERED: RefCell<Vec<Option<HistoryContext>>> = const { RefCell::new(Vec::new()) };
    /// The string [`cachalot_history_user_metadata`] returned last.
    static METADATA_OUT: RefCell<CString> = RefCell::new(CString::default());
}

/// Most nested [`cachalot_context_enter`] calls of one thread.
pub const MAX_CONTEXT_DEPTH: usize = 64;

/// Makes `ctx` the calling thread's context for the allocator calls until
/// the matching [`cachalot_context_exit`] (calls nest). cachalot takes
/// ownership of `ctx` (its `release` runs once cachalot drops it), also when
/// this fails (depth over [`MAX_CONTEXT_DEPTH`]). A NULL `data` is "no
/// context".
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_context_enter(ctx: CachalotContext) -> c_int {
    let owned = (!ctx.data.is_null()).then(|| {
        HistoryContext::new(ForeignContext {
            data: ctx.data,
            release: ctx.release,
        })
    });
    status("cachalot_context_enter", move || {
        ENTERED.with(|e| {
            let mut e = e.borrow_mut();
            if e.len() >= MAX_CONTEXT_DEPTH {
                return Err(Failure::invalid(format!(
                    "contexts nested more than {MAX_CONTEXT_DEPTH} deep"
                )));
            }
            e.push(history::set_current_context(owned));
            Ok(())
        })
    })
}

/// Ends the innermost [`cachalot_context_enter`] of the calling thread
/// (none: no-op), restoring the context before it.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_context_exit() {
    let _ = ENTERED.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut()
            && let Some(prev) = e.pop()
        {
            history::set_current_context(prev);
        }
    });
}

/// Pushes a compile context (`"Torch-Compiled Region: 0/0"`) on the calling
/// thread's stack while some device's history is on (PyTorch ignores it
/// otherwise); the thread's entries carry the innermost. Longer than
/// [`MAX_HISTORY_STRING`] or NULL is [`crate::CACHALOT_ERR_INVALID_ARGUMENT`].
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_history_push_compile_context(name: *const c_char) -> c_int {
    status("cachalot_history_push_compile_context", || {
        // SAFETY: the caller's contract.
        let s = unsafe { strings(&name, 1, "name") }?;
        if ANY_ON.load(Ordering::Relaxed) {
            history::push_compile_context(s[0]);
        }
        Ok(())
    })
}

/// Pops the calling thread's innermost compile context (none: no-op).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_history_pop_compile_context() {
    history::pop_compile_context();
}

/// Sets the calling thread's user metadata (`""` clears it), copied into
/// every entry it records (`torch.cuda.memory._set_memory_metadata`).
///
/// # Safety
/// `metadata` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_history_set_user_metadata(metadata: *const c_char) -> c_int {
    status("cachalot_history_set_user_metadata", || {
        // SAFETY: the caller's contract.
        let s = unsafe { strings(&metadata, 1, "metadata") }?;
        history::set_user_metadata(s[0]);
        Ok(())
    })
}

/// The calling thread's user metadata (`""` when none): a string owned by
/// cachalot, valid until the thread's next call of this function.
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_history_user_metadata() -> *const c_char {
    let s = CString::new(history::user_metadata().replace('\0', "")).unwrap_or_default();
    METADATA_OUT
        .try_with(|m| {
            let mut m = m.borrow_mut();
            *m = s;
            m.as_ptr()
        })
        .unwrap_or(c"".as_ptr())
}

/// Records an annotation of `device`'s history (PyTorch's
/// `recordAnnotation`: `{"name": ..., "stage": "START" | "END"}` from
/// `record_function`): the pairs `keys[i]`, `values[i]` for `i < n`, at
/// most [`MAX_ANNOTATION_PAIRS`]. Nothing when the history is off.
///
/// # Safety
/// `keys` and `values` are valid for `n` reads of NUL-terminated strings
/// (NULL when `n` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_history_record_annotation(
    device: c_int,
    keys: *const *const c_char,
    values: *const *const c_char,
    n: usize,
) -> c_int {
    status("cachalot_history_record_annotation", || {
        if n > MAX_ANNOTATION_PAIRS {
            return Err(Failure::invalid(format!(
                "{n} pairs, more than {MAX_ANNOTATION_PAIRS}"
            )));
        }
        // SAFETY: the caller's contract.
        let (k, v) = unsafe { (strings(keys, n, "keys")?, strings(values, n, "values")?) };
        let Some(dev) = existing_alloc(device)? else {
            return Ok(());
        };
        dev.record_annotation(
            k.into_iter()
                .zip(v)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        Ok(())
    })
}

// ----- the profiler's memory events -----

/// For `torch.profiler`'s memory events (`reportMemoryUsageToProfiler`):
/// writes the device and block size of the live allocation at `ptr`.
/// A pointer no device holds live is [`crate::CACHALOT_ERR_INVALID_POINTER`].
///
/// # Safety
/// `device` and `size` are NULL (an error) or valid for one write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_block_lookup(
    ptr: *const c_void,
    device: *mut c_int,
    size: *mut u64,
) -> c_int {
    status("cachalot_block_lookup", || {
        if device.is_null() || size.is_null() {
            return Err(Failure::invalid("device or size is NULL"));
        }
        let addr = ptr.addr() as u64;
        for d in 0..device_table()?.len() {
            let Some(dev) = existing_alloc(d as c_int)? else {
                continue;
            };
            if let Some(n) = dev.block_size(addr) {
                // SAFETY: both non-NULL and valid for writes by the caller's contract.
                unsafe {
                    device.write(d as c_int);
                    size.write(n);
                }
                return Ok(());
            }
        }
        Err(cachalot::Error::UnknownPointer(addr).into())
    })
}

/// Writes `device`'s allocated and reserved bytes now (the totals
/// PyTorch's allocator passes with each profiler memory event); zeros for a
/// device not in use.
///
/// # Safety
/// `allocated` and `reserved` are NULL (an error) or valid for one write each.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_memory_totals(
    device: c_int,
    allocated: *mut u64,
    reserved: *mut u64,
) -> c_int {
    status("cachalot_memory_totals", || {
        if allocated.is_null() || reserved.is_null() {
            return Err(Failure::invalid("allocated or reserved is NULL"));
        }
        let (a, r) = match existing_alloc(device)? {
            Some(d) => {
                let s = d.stats();
                (
                    s.allocated_bytes.0[0].current.max(0) as u64,
                    s.reserved_bytes.0[0].current.max(0) as u64,
                )
            }
            None => (0, 0),
        };
        // SAFETY: both non-NULL and valid for writes by the caller's contract.
        unsafe {
            allocated.write(a);
            reserved.write(r);
        }
        Ok(())
    })
}

// ----- snapshots -----

/// A `record_function` annotation of a snapshot (`cachalot_annotation_t`):
/// `keys[i]`, `values[i]` for `i < num_pairs`, NUL-terminated, owned by the
/// snapshot.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CachalotAnnotation {
    /// Device index.
    pub device: i32,
    /// Zero.
    pub reserved: i32,
    /// Microseconds since the Unix epoch.
    pub time_us: u64,
    /// Number of pairs.
    pub num_pairs: usize,
    /// Keys.
    pub keys: *const *const c_char,
    /// Values.
    pub values: *const *const c_char,
}

/// What a C snapshot points to beyond its arrays of numbers: the engine's
/// snapshot (holding the contexts whose `data` it hands out), the entries'
/// strings (one copy per distinct string) and the annotations.
#[derive(Default)]
pub(crate) struct SnapshotExtras {
    snap: Option<cachalot::Snapshot>,
    strings: HashMap<usize, CString>,
    owned: Vec<CString>,
    keys: Vec<*const c_char>,
    values: Vec<*const c_char>,
    annotations: Vec<CachalotAnnotation>,
}

impl SnapshotExtras {
    /// A NUL-terminated copy of `s` owned by the snapshot (NULL for none).
    pub(crate) fn intern(&mut self, s: Option<&std::sync::Arc<str>>) -> *const c_char {
        let Some(s) = s else {
            return std::ptr::null();
        };
        let key = std::sync::Arc::as_ptr(s).cast::<u8>().addr();
        self.strings
            .entry(key)
            .or_insert_with(|| CString::new(s.replace('\0', "")).unwrap_or_default())
            .as_ptr()
    }

    /// Builds the annotation array of `device`.
    pub(crate) fn annotations(&mut self, list: &[cachalot::Annotation], device: i32) {
        let mut spans = Vec::with_capacity(list.len());
        for a in list {
            let start = self.keys.len();
            for (k, v) in &a.metadata {
                for (s, out) in [(k, &mut self.keys), (v, &mut self.values)] {
                    let c = CString::new(s.replace('\0', "")).unwrap_or_default();
                    out.push(c.as_ptr());
                    self.owned.push(c);
                }
            }
            spans.push((a.time_us, start, a.metadata.len()));
        }
        // (the pointer arrays are complete: no reallocation below)
        self.annotations = spans
            .into_iter()
            .map(|(time_us, start, n)| CachalotAnnotation {
                device,
                reserved: 0,
                time_us,
                num_pairs: n,
                keys: self.keys[start..].as_ptr(),
                values: self.values[start..].as_ptr(),
            })
            .collect();
    }

    /// Keeps the engine's snapshot (its contexts) alive with the C one.
    pub(crate) fn keep(&mut self, snap: cachalot::Snapshot) {
        self.snap = Some(snap);
    }

    /// The annotation array and its length.
    pub(crate) fn annotation_array(&self) -> (*const CachalotAnnotation, usize) {
        (self.annotations.as_ptr(), self.annotations.len())
    }
}
