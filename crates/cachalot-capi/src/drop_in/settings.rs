//! Settings set from Python: the shim chains a parser hook after
//! PyTorch's (`torch.cuda.memory._set_allocator_settings`) and forwards
//! every string PyTorch accepted to [`crate::cachalot_set_config`]; it also
//! registers with PyTorch's parsers the keys only cachalot knows, so that
//! they pass PyTorch's check (in `_set_allocator_settings` and in
//! `PYTORCH_CUDA_ALLOC_CONF`). This is the list it asks for.

use std::ffi::{CString, c_char, c_int};
use std::sync::OnceLock;

use cachalot::AllocatorConfig;
use cachalot::core::config::{CaptureReuse, KNOWN_KEYS};

use crate::entry;

/// Every configuration key cachalot accepts, comma-separated (a static
/// string, valid for the life of the process).
#[unsafe(no_mangle)]
pub extern "C" fn cachalot_config_keys() -> *const c_char {
    static KEYS: OnceLock<CString> = OnceLock::new();
    entry("cachalot_config_keys", false, std::ptr::null(), || {
        Ok(KEYS
            .get_or_init(|| CString::new(KNOWN_KEYS.join(",")).unwrap_or_default())
            .as_ptr())
    })
}

/// The configuration in force (`cachalot_config_info_t`): what
/// `torch.cuda.memory._snapshot()["allocator_settings"]` shows.
#[repr(C)]
#[derive(Debug)]
pub struct CachalotConfigInfo {
    /// `max_split_size` in bytes (`u64::MAX`: unlimited).
    pub max_split_size: u64,
    /// `garbage_collection_threshold`.
    pub garbage_collection_threshold: f64,
    /// 1 when expandable segments are on.
    pub expandable_segments: i32,
    /// 1 unless `graph_capture_record_stream_reuse` is off.
    pub graph_capture_record_stream_reuse: i32,
    /// `roundup_power2_divisions` per power-of-two interval.
    pub roundup_power2_divisions: [u64; 16],
    /// The last configuration string (NUL-terminated; valid until the
    /// calling thread's next `cachalot_current_config`).
    pub last_config: *const c_char,
    /// 1 when `release_lock_on_cudamalloc` is on.
    pub release_lock_on_malloc: i32,
}

impl CachalotConfigInfo {
    /// The C view of `cfg` (the snapshot's settings too), `last_config`
    /// NULL, and the last configuration string (NULs dropped) for
    /// `last_config` to point to while it lives.
    pub(crate) fn of(cfg: &AllocatorConfig) -> (Self, CString) {
        let mut divisions = [0u64; 16];
        for (d, s) in divisions
            .iter_mut()
            .zip(cfg.roundup_power2_divisions.iter())
        {
            *d = *s;
        }
        let last = CString::new(cfg.last_config_string.replace('\0', "")).unwrap_or_default();
        let info = CachalotConfigInfo {
            max_split_size: cfg.max_split_size,
            garbage_collection_threshold: cfg.garbage_collection_threshold,
            expandable_segments: i32::from(cfg.expandable_segments),
            graph_capture_record_stream_reuse: i32::from(
                cfg.graph_capture_record_stream_reuse != CaptureReuse::Off,
            ),
            roundup_power2_divisions: divisions,
            last_config: std::ptr::null(),
            release_lock_on_malloc: i32::from(cfg.release_lock_on_device_malloc),
        };
        (info, last)
    }
}

thread_local! {
    static LAST: std::cell::RefCell<CString> = std::cell::RefCell::new(CString::default());
}

/// Writes the configuration of `device` to `*out`: its allocator's when it
/// is in use, else the one it would start with now (the environment's,
/// then every string set since).
///
/// # Safety
/// `out` is NULL (an error) or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cachalot_current_config(
    device: c_int,
    out: *mut CachalotConfigInfo,
) -> c_int {
    crate::status("cachalot_current_config", || {
        if out.is_null() {
            return Err(crate::Failure::invalid("out is NULL"));
        }
        let cfg = match crate::existing_alloc(device)? {
            Some(d) => d.config(),
            None => match crate::CONFIGS.lock().as_ref() {
                Some(r) => r.config().clone(),
                None => AllocatorConfig::from_env()?,
            },
        };
        let (mut info, last) = CachalotConfigInfo::of(&cfg);
        info.last_config = LAST.with(|l| {
            *l.borrow_mut() = last;
            l.borrow().as_ptr()
        });
        // SAFETY: non-NULL and valid for writes by the caller's contract.
        unsafe { out.write(info) };
        Ok(())
    })
}
