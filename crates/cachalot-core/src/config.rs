//! The allocator configuration string (PyTorch's `PYTORCH_ALLOC_CONF`
//! grammar and keys, read from `CACHALOT_ALLOC_CONF`).
//!
//! Grammar: tokens split on `,` `:` `[` `]`, whitespace dropped; `key:value`
//! pairs separated by commas; list values in brackets; booleans exactly
//! `True`/`False`. Every parse first resets `max_split_size`,
//! `roundup_power2_divisions`, `garbage_collection_threshold` and
//! `max_non_split_rounding` to their defaults; every other key keeps its
//! previous value unless named (PyTorch 2.11's runtime re-parse semantics).
//!
//! # Keys of another PyTorch allocator
//!
//! A PyTorch user's `PYTORCH_CUDA_ALLOC_CONF` may name keys that belong to
//! an allocator cachalot does not replace: `backend:cudaMallocAsync` (or
//! `hipMallocAsync`, PyTorch's asynchronous backend) and the `pinned_*`
//! keys of the pinned host-memory allocator.
//! Their values are checked as
//! PyTorch checks them (a malformed or out-of-range value is still a typed
//! error), then ignored: [`AllocatorConfig::parse_with_warnings`] and its
//! siblings return one [`ConfigWarning`] per ignored key, and
//! [`AllocatorConfig::apply`] logs them through `tracing` (once per
//! process). Every other key is honoured or, where cachalot does not act
//! on it, takes only its default value (any other value is a typed "not
//! supported" error).
//!
//! # `release_lock_on_cudamalloc`
//!
//! `release_lock_on_cudamalloc:True` (aliases `release_lock_on_hipmalloc`,
//! `release_lock_on_device_malloc`; `True`/`False`, default `False`, kept
//! across parses unless named, settable at run time) is honoured as
//! PyTorch honours it: the device call that creates a fixed segment
//! (`Backend::malloc`, or a private pool's `SegmentSource::alloc`) runs
//! with the device lock and the shard locks released, so other threads'
//! cache hits, frees, `empty_cache` and statistics on the device go on
//! while it runs; the allocation then takes the locks again and goes on
//! where it stopped (the engine's `unlocked.rs`). The pages an expandable
//! segment maps stay under the lock, as in PyTorch (its expandable path
//! never drops the lock): they grow a segment whose records the other
//! operations read and edit. With expandable segments on, the key acts
//! only on the pools that take fixed segments (a pool with a segment
//! source, or a private pool when `expandable_segments` was not given).
//!
//! # Bounds
//!
//! The input is hostile until checked: a string is at most
//! [`MAX_CONFIG_LEN`] bytes, every number is range-checked (a typed
//! [`ConfigErrorKind::OutOfRange`] naming the key, the value and the allowed
//! range), and an error echoes at most [`ECHO_LIMIT`] characters of any
//! input. The ranges:
//!
//! | key | allowed |
//! |---|---|
//! | `large_segment_size_mb` | [11, [`MAX_SIZE_MB`]] |
//! | `max_split_size_mb`, `max_non_split_rounding_mb` | [`large_segment_size_mb`, [`MAX_SIZE_MB`]] |
//! | `garbage_collection_threshold` | (0.0, 1.0) |
//! | `per_process_memory_fraction` | [0.0, 1.0] |
//! | `roundup_power2_divisions` (each value) | 0 or a power of two ≤ [`MAX_ROUNDUP_DIVISIONS`] |
//! | `roundup_power2_divisions` (each list boundary, MiB) | a power of two ≤ [`MAX_SIZE_MB`], or `>` |
//! | `pinned_num_register_threads` | a power of two ≤ 128 |
//! | `pinned_reserve_segment_size_mb` | [1, [`MAX_SIZE_MB`]] |
#![forbid(unsafe_code)]

use std::env::VarError;
use std::ffi::OsString;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{ConfigError, ConfigErrorKind};

mod replay;
mod syntax;
mod values;

pub use replay::ConfigReplay;
use syntax::{Value, parse_entries};
pub(crate) use values::expandable_unsupported;
use values::*;

/// Longest configuration string accepted, in bytes (64 KiB; every valid
/// configuration is far shorter). Longer is [`ConfigErrorKind::TooLong`].
pub const MAX_CONFIG_LEN: usize = 64 * 1024;
/// Characters of user input an error message echoes; longer input is cut
/// there and marked with `…`.
pub const ECHO_LIMIT: usize = 64;
/// Largest value of every `*_mb` size key and of a
/// `roundup_power2_divisions` boundary: 2^40 MiB = 2^60 bytes, the request
/// size from which the engine refuses every allocation (`MAX_REQUEST`), so
/// that every size derived from the configuration fits in a `u64` with room
/// to add a request to it.
pub const MAX_SIZE_MB: u64 = 1 << 40;
/// Largest `roundup_power2_divisions` value: 2^20. PyTorch requires a power
/// of two (or 0) and sets no maximum; a value `d` applies only to requests
/// over 512·`d` bytes, so with 2^20 divisions only requests over 512 MiB are
/// rounded: larger values are typos, not tuning.
pub const MAX_ROUNDUP_DIVISIONS: u64 = 1 << 20;

/// `s`, cut after [`ECHO_LIMIT`] characters (marked `…`): how an error
/// message echoes user input.
pub fn echo(s: &str) -> String {
    match s.char_indices().nth(ECHO_LIMIT) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

/// Environment variables read, in order; the first one that is set wins.
pub const CONFIG_ENV_VARS: [&str; 4] = [
    "CACHALOT_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
];

/// A key of the config string that belongs to another PyTorch allocator
/// (its `cudaMallocAsync` backend, its pinned host-memory allocator) and
/// that cachalot ignored: the value was valid for PyTorch and changed
/// nothing here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigWarning {
    /// The key, as written.
    pub key: String,
    /// Its value (cut after [`ECHO_LIMIT`] characters).
    pub value: String,
    /// Why cachalot ignores it.
    pub reason: &'static str,
    /// The environment variable the string came from, if any.
    pub env_var: Option<&'static str>,
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "'{}:{}' ignored: {}", self.key, self.value, self.reason)?;
        if let Some(v) = self.env_var {
            write!(f, " (from {v})")?;
        }
        Ok(())
    }
}

/// Why `backend:cudaMallocAsync` is ignored.
const OTHER_BACKEND: &str = "it selects PyTorch's cudaMallocAsync allocator; cachalot is the \
                             caching allocator (PyTorch's `native` backend)";
/// Why the `pinned_*` keys are ignored.
const HOST_ALLOCATOR: &str = "it configures PyTorch's pinned host-memory allocator, which \
                              cachalot does not replace";

const MIB: u64 = 1 << 20;
/// Number of `roundup_power2_divisions` intervals.
pub const ROUNDUP_INTERVALS: usize = 16;

/// Reuse of blocks freed with cross-stream uses during graph capture
/// (key `graph_capture_record_stream_reuse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CaptureReuse {
    /// No reuse until the capture ends (PyTorch's `False`).
    #[default]
    Off,
    /// PyTorch 2.11 exactly: only the block's own allocation stream may reuse it.
    PyTorch,
    /// Any capturing stream whose visited set holds all of the block's
    /// markers may reuse it (the default when reuse is turned on with `True`).
    CrossStream,
}

/// Which free block an allocation takes (key `placement`, a cachalot extension).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Placement {
    /// PyTorch's best fit while a stream has blocks out of the default pool;
    /// once it has none, its whole free segments turn dormant and are taken
    /// again oldest first, only when no other free block fits. Work that
    /// runs again after such a drain replays its first run's placement
    /// exactly: no device call after the first pass.
    #[default]
    Steady,
    /// PyTorch's best fit over all free blocks of the stream, (size, address) order.
    PyTorch,
}

/// The parsed allocator configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks of at least this size are never split (`u64::MAX` = unlimited).
    pub max_split_size: u64,
    /// How much larger than the request an oversize block may be.
    pub max_non_split_rounding_size: u64,
    /// Segment size for requests in (1 MiB, 10 MiB).
    pub large_segment_size: u64,
    /// Fraction of reserved memory over which GC runs (0 = off).
    pub garbage_collection_threshold: f64,
    /// Power-of-two divisions per interval (`roundup_power2_divisions`).
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// Expandable segments: pages of one growing segment per stream and
    /// pool, mapped on demand (the engine's effective value). When the key
    /// was not given ([`Self::expandable_segments_given`]) the engine
    /// decides ([`Self::resolve_expandable`]): on with cachalot's placement
    /// where the backend has virtual memory (cachalot's low-memory
    /// default), off with `placement:pytorch` (PyTorch's default) or
    /// without virtual memory.
    pub expandable_segments: bool,
    /// Whether a config string gave `expandable_segments` (then
    /// [`Self::expandable_segments`] is what it said).
    pub expandable_segments_given: bool,
    /// Release the device lock around the device call of a new fixed
    /// segment (`release_lock_on_cudamalloc`; see the module docs for
    /// where it applies).
    pub release_lock_on_device_malloc: bool,
    /// Reuse during graph capture.
    pub graph_capture_record_stream_reuse: CaptureReuse,
    /// Per-process memory fraction (1.0 = the whole device).
    pub per_process_memory_fraction: f64,
    /// Reject allocations over the fraction cap before calling the driver.
    pub throw_on_device_malloc_oom: bool,
    /// cachalot extension: on a miss, before asking the device, take a whole
    /// free segment cached under another stream if that stream has no
    /// unfinished work (PyTorch silos blocks per stream forever, #186232).
    pub idle_stream_reuse: bool,
    /// cachalot extension: block placement (`steady` or `pytorch`).
    pub placement: Placement,
    /// Pinned host allocator: register with the device (always the default:
    /// the `pinned_*` keys are checked and ignored).
    pub pinned_use_host_register: bool,
    /// Pinned host allocator: registration threads (always the default).
    pub pinned_num_register_threads: u64,
    /// Pinned host allocator: background threads (always the default).
    pub pinned_use_background_threads: bool,
    /// Pinned host allocator: reserve segment size in MiB (always the default).
    pub pinned_reserve_segment_size_mb: u64,
    /// The last string parsed (reported in snapshots).
    pub last_config_string: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: 20 * MIB,
            large_segment_size: 20 * MIB,
            garbage_collection_threshold: 0.0,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            expandable_segments: false,
            expandable_segments_given: false,
            release_lock_on_device_malloc: false,
            graph_capture_record_stream_reuse: CaptureReuse::Off,
            per_process_memory_fraction: 1.0,
            throw_on_device_malloc_oom: false,
            idle_stream_reuse: false,
            placement: Placement::Steady,
            pinned_use_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            last_config_string: String::new(),
        }
    }
}

/// Every key the parser accepts (aliases included).
pub const KNOWN_KEYS: &[&str] = &[
    "backend",
    "large_segment_size_mb",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "release_lock_on_device_malloc",
    "graph_capture_record_stream_reuse",
    "per_process_memory_fraction",
    "throw_on_cudamalloc_oom",
    "throw_on_device_malloc_oom",
    "idle_stream_reuse",
    "placement",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
];

/// The keys a parse does not reset, each with the field it sets (aliases
/// share a field); `None` for the keys every parse resets, and for unknown
/// keys.
fn sticky_field(key: &str) -> Option<&'static str> {
    Some(match key {
        "backend" => "backend",
        "large_segment_size_mb" => "large_segment_size",
        "expandable_segments" => "expandable_segments",
        "release_lock_on_cudamalloc"
        | "release_lock_on_hipmalloc"
        | "release_lock_on_device_malloc" => "release_lock_on_device_malloc",
        "graph_capture_record_stream_reuse" => "graph_capture_record_stream_reuse",
        "per_process_memory_fraction" => "per_process_memory_fraction",
        "throw_on_cudamalloc_oom" | "throw_on_device_malloc_oom" => "throw_on_device_malloc_oom",
        "idle_stream_reuse" => "idle_stream_reuse",
        "placement" => "placement",
        "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
            "pinned_use_host_register"
        }
        "pinned_num_register_threads" => "pinned_num_register_threads",
        "pinned_use_background_threads" => "pinned_use_background_threads",
        "pinned_reserve_segment_size_mb" => "pinned_reserve_segment_size_mb",
        _ => return None,
    })
}

impl AllocatorConfig {
    /// Parses a config string over the defaults. The keys of another
    /// PyTorch allocator are ignored (see [`AllocatorConfig::apply`]).
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        c.apply(s)?;
        Ok(c)
    }

    /// [`AllocatorConfig::parse`], also returning the keys of another
    /// PyTorch allocator it ignored, one [`ConfigWarning`] each, without
    /// logging them (the caller reports them).
    pub fn parse_with_warnings(s: &str) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        let mut c = Self::default();
        let w = c.apply_with_warnings(s)?;
        Ok((c, w))
    }

    /// Sets `expandable_segments` as the key `expandable_segments:True` or
    /// `False` does (given, so the engine keeps it): the way to set it in
    /// code.
    pub fn set_expandable_segments(&mut self, on: bool) {
        self.expandable_segments = on;
        self.expandable_segments_given = true;
    }

    /// Decides [`Self::expandable_segments`] when no config string gave it:
    /// on with `placement:steady` (the default) on a backend with virtual
    /// memory (`has_vmm`), else off, so that `placement:pytorch` alone
    /// stays PyTorch's default mode exactly. A value that was given is
    /// kept. The engine calls this at construction and after every
    /// `set_config`.
    pub fn resolve_expandable(&mut self, has_vmm: bool) {
        if !self.expandable_segments_given {
            self.expandable_segments = self.placement == Placement::Steady && has_vmm;
        }
    }

    /// Reads the first set variable of [`CONFIG_ENV_VARS`]; defaults if none
    /// is set. A bad value, or one that is not UTF-8, is an error naming the
    /// variable ([`ConfigError::env_var`]). Ignored keys are logged as
    /// [`AllocatorConfig::apply`] does.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(std::env::var_os)
    }

    /// [`AllocatorConfig::from_env`], also returning the ignored keys (each
    /// naming its variable), without logging them.
    pub fn from_env_with_warnings() -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        Self::from_lookup_with_warnings(std::env::var_os)
    }

    /// [`AllocatorConfig::from_env`] over `lookup` instead of the process
    /// environment.
    pub(crate) fn from_lookup(
        lookup: impl FnMut(&'static str) -> Option<OsString>,
    ) -> Result<Self, ConfigError> {
        let (c, w) = Self::from_lookup_with_warnings(lookup)?;
        log_warnings(&w);
        Ok(c)
    }

    /// [`AllocatorConfig::from_env_with_warnings`] over `lookup` instead of
    /// the process environment.
    pub(crate) fn from_lookup_with_warnings(
        mut lookup: impl FnMut(&'static str) -> Option<OsString>,
    ) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        for var in CONFIG_ENV_VARS {
            let Some(raw) = lookup(var) else { continue };
            let named = |mut e: ConfigError| {
                e.env_var = Some(var);
                e
            };
            let v = match raw.into_string().map_err(VarError::NotUnicode) {
                Ok(v) => v,
                Err(VarError::NotUnicode(raw)) => {
                    return Err(named(ConfigError::new(
                        "",
                        ConfigErrorKind::NotUnicode,
                        format!(
                            "the value is not valid UTF-8: '{}'",
                            echo(&raw.to_string_lossy())
                        ),
                    )));
                }
                Err(VarError::NotPresent) => continue,
            };
            let (c, mut w) = Self::parse_with_warnings(&v).map_err(named)?;
            for x in &mut w {
                x.env_var = Some(var);
            }
            return Ok((c, w));
        }
        Ok((Self::default(), Vec::new()))
    }

    /// Re-parses `s` on top of this config, as PyTorch's runtime
    /// `_accelerator_setAllocatorSettings`. On error `self` is unchanged.
    /// The keys of another PyTorch allocator (`backend:cudaMallocAsync`,
    /// `pinned_*`) are checked and ignored; they are logged through
    /// `tracing` at warning level, once per process.
    pub fn apply(&mut self, s: &str) -> Result<(), ConfigError> {
        let w = self.apply_with_warnings(s)?;
        log_warnings(&w);
        Ok(())
    }

    /// [`AllocatorConfig::apply`], returning the ignored keys instead of
    /// logging them.
    pub fn apply_with_warnings(&mut self, s: &str) -> Result<Vec<ConfigWarning>, ConfigError> {
        let entries = parse_entries(s)?;
        let mut c = self.clone();
        c.max_split_size = u64::MAX;
        c.roundup_power2_divisions = [0; ROUNDUP_INTERVALS];
        c.garbage_collection_threshold = 0.0;
        c.max_non_split_rounding_size = c.large_segment_size;
        let mut warnings = Vec::new();
        for e in &entries {
            match &e.value {
                Value::One(v) => {
                    if let Some(reason) = c.set(e.key, v)? {
                        warnings.push(ConfigWarning {
                            key: echo(e.key),
                            value: echo(v),
                            reason,
                            env_var: None,
                        });
                    }
                }
                Value::List(items) => c.set_list(e.key, e.raw, items)?,
            }
        }
        c.last_config_string = s.to_string();
        *self = c;
        Ok(warnings)
    }

    fn set_list(
        &mut self,
        key: &str,
        raw: &str,
        items: &[(&str, &str)],
    ) -> Result<(), ConfigError> {
        if key != "roundup_power2_divisions" {
            if Self::is_known(key) {
                return Err(invalid(key, raw, "does not take a list value".to_string()));
            }
            return Err(unknown(key));
        }
        let mut table = [0u64; ROUNDUP_INTERVALS];
        let mut first = true;
        let mut last_index = 0usize;
        for (b, v) in items {
            let val = divisions(key, v)?;
            if *b == ">" {
                for e in table.iter_mut().skip(last_index + 1) {
                    *e = val;
                }
                continue;
            }
            let boundary = boundary(key, b)?;
            let index = (boundary.trailing_zeros() as usize).min(ROUNDUP_INTERVALS - 1);
            if first {
                for e in table.iter_mut().take(index) {
                    *e = val;
                }
                first = false;
            }
            table[index] = val;
            last_index = index;
        }
        self.roundup_power2_divisions = table;
        Ok(())
    }

    fn is_known(key: &str) -> bool {
        sticky_field(key).is_some()
            || matches!(
                key,
                "max_split_size_mb"
                    | "max_non_split_rounding_mb"
                    | "garbage_collection_threshold"
                    | "roundup_power2_divisions"
            )
    }

    /// Sets `key` to `v`; `Some(reason)` when the key belongs to another
    /// PyTorch allocator and `v`, valid there, is ignored.
    fn set(&mut self, key: &str, v: &str) -> Result<Option<&'static str>, ConfigError> {
        match key {
            "backend" => match v {
                "native" => {}
                "cudaMallocAsync" | "hipMallocAsync" => return Ok(Some(OTHER_BACKEND)),
                _ => {
                    return Err(invalid(
                        key,
                        v,
                        format!("Unknown allocator backend '{}'", echo(v)),
                    ));
                }
            },
            "large_segment_size_mb" => {
                // PyTorch: "must be > 10 MB".
                self.large_segment_size = size_mb(key, v, 11)?;
                if self.max_non_split_rounding_size < self.large_segment_size {
                    self.max_non_split_rounding_size = self.large_segment_size;
                }
            }
            "max_split_size_mb" => {
                self.max_split_size = size_mb(key, v, self.large_segment_size / MIB)?;
            }
            "max_non_split_rounding_mb" => {
                self.max_non_split_rounding_size = size_mb(key, v, self.large_segment_size / MIB)?;
            }
            "garbage_collection_threshold" => {
                self.garbage_collection_threshold =
                    float_in(key, v, |x| x > 0.0 && x < 1.0, "(0.0, 1.0)")?;
            }
            "roundup_power2_divisions" => {
                self.roundup_power2_divisions = [divisions(key, v)?; ROUNDUP_INTERVALS];
            }
            "expandable_segments" => {
                self.expandable_segments = parse_bool(key, v)?;
                self.expandable_segments_given = true;
            }
            "release_lock_on_cudamalloc"
            | "release_lock_on_hipmalloc"
            | "release_lock_on_device_malloc" => {
                self.release_lock_on_device_malloc = parse_bool(key, v)?;
            }
            "graph_capture_record_stream_reuse" => {
                self.graph_capture_record_stream_reuse = match v {
                    "True" | "cross_stream" => CaptureReuse::CrossStream,
                    "pytorch" => CaptureReuse::PyTorch,
                    "False" | "off" => CaptureReuse::Off,
                    _ => {
                        return Err(invalid(
                            key,
                            v,
                            format!(
                                "Expected 'True', 'False', 'pytorch' or 'cross_stream', got '{}'",
                                echo(v)
                            ),
                        ));
                    }
                }
            }
            "per_process_memory_fraction" => {
                self.per_process_memory_fraction =
                    float_in(key, v, |x| (0.0..=1.0).contains(&x), "[0.0, 1.0]")?;
            }
            "throw_on_cudamalloc_oom" | "throw_on_device_malloc_oom" => {
                self.throw_on_device_malloc_oom = not_yet(
                    key,
                    v,
                    "cachalot always flushes its cache and retries before reporting an OOM",
                )?
            }
            "idle_stream_reuse" => self.idle_stream_reuse = parse_bool(key, v)?,
            "placement" => {
                self.placement = match v {
                    "steady" => Placement::Steady,
                    "pytorch" => Placement::PyTorch,
                    _ => {
                        return Err(invalid(
                            key,
                            v,
                            format!("'{}' is not a placement, use steady or pytorch", echo(v)),
                        ));
                    }
                }
            }
            "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                return Ok(parse_bool(key, v)?.then_some(HOST_ALLOCATOR));
            }
            "pinned_num_register_threads" => {
                const ALLOWED: &str = "a power of two <= 128";
                let n = int_in(key, v, 1, 128, ALLOWED)?;
                if !n.is_power_of_two() {
                    return Err(out_of_range(
                        key,
                        v,
                        ALLOWED,
                        format!("{n} is not a power of 2"),
                    ));
                }
                return Ok(
                    (n != AllocatorConfig::default().pinned_num_register_threads)
                        .then_some(HOST_ALLOCATOR),
                );
            }
            "pinned_use_background_threads" => {
                return Ok(parse_bool(key, v)?.then_some(HOST_ALLOCATOR));
            }
            "pinned_reserve_segment_size_mb" => {
                // range-checked as PyTorch does, then ignored
                size_mb(key, v, 1)?;
                return Ok(Some(HOST_ALLOCATOR));
            }
            _ => return Err(unknown(key)),
        }
        Ok(None)
    }

    /// `roundup_power2_divisions` entry that applies to `size`.
    #[inline]
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.max(1).leading_zeros() as i64;
        let idx = (log - 20).clamp(0, ROUNDUP_INTERVALS as i64 - 1) as usize;
        self.roundup_power2_divisions[idx]
    }

    /// `max_split_size` as the stat reports it (−1 when unlimited).
    pub fn max_split_size_stat(&self) -> i64 {
        if self.max_split_size == u64::MAX {
            -1
        } else {
            i64::try_from(self.max_split_size).unwrap_or(i64::MAX)
        }
    }
}

/// Logs `warnings` through `tracing` at warning level, the first time a
/// parse in this process ignored a key (a config parsed again, e.g. by
/// every device's allocator, does not repeat it).
fn log_warnings(warnings: &[ConfigWarning]) {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    log_warnings_once(&LOGGED, warnings);
}

/// [`log_warnings`] with its "already logged" flag.
fn log_warnings_once(logged: &AtomicBool, warnings: &[ConfigWarning]) {
    if warnings.is_empty() || logged.swap(true, Ordering::Relaxed) {
        return;
    }
    let list: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    tracing::warn!("allocator config: {}", list.join("; "));
}

fn unknown(key: &str) -> ConfigError {
    let key = echo(key);
    ConfigError::new(
        key.clone(),
        ConfigErrorKind::UnknownKey,
        format!("Unrecognized key '{key}' in Accelerator allocator config."),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_simple_keys() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:100, garbage_collection_threshold:0.5,expandable_segments:False",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 100 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.5);
        assert!(!c.expandable_segments);
        assert_eq!(c.max_split_size_stat(), 100 * MIB as i64);
        assert_eq!(AllocatorConfig::default().max_split_size_stat(), -1);
    }

    #[test]
    fn errors_name_the_key() {
        let e = AllocatorConfig::parse("foo:1").unwrap_err();
        assert_eq!(e.key, "foo");
        assert!(e.to_string().contains("Unrecognized key 'foo'"));
        assert_eq!(
            AllocatorConfig::parse("max_split_size_mb:10")
                .unwrap_err()
                .key,
            "max_split_size_mb"
        );
        assert!(
            AllocatorConfig::parse("max_split_size_mb:10")
                .unwrap_err()
                .reason
                .contains("must be >= 20")
        );
        assert_eq!(
            AllocatorConfig::parse("expandable_segments:true")
                .unwrap_err()
                .key,
            "expandable_segments"
        );
        assert_eq!(
            AllocatorConfig::parse("roundup_power2_divisions:3")
                .unwrap_err()
                .key,
            "roundup_power2_divisions"
        );
        assert_eq!(
            AllocatorConfig::parse("garbage_collection_threshold:1.5")
                .unwrap_err()
                .key,
            "garbage_collection_threshold"
        );
        assert_eq!(
            AllocatorConfig::parse("large_segment_size_mb:10")
                .unwrap_err()
                .key,
            "large_segment_size_mb"
        );
        assert_eq!(
            AllocatorConfig::parse("max_split_size_mb").unwrap_err().key,
            "max_split_size_mb"
        );
        assert_eq!(
            AllocatorConfig::parse("max_split_size_mb:abc")
                .unwrap_err()
                .key,
            "max_split_size_mb"
        );
        assert_eq!(
            AllocatorConfig::parse("roundup_power2_divisions:[1:2")
                .unwrap_err()
                .key,
            "roundup_power2_divisions"
        );
        assert_eq!(
            AllocatorConfig::parse("per_process_memory_fraction:2")
                .unwrap_err()
                .key,
            "per_process_memory_fraction"
        );
        assert_eq!(
            AllocatorConfig::parse("backend:cudaMallocSync")
                .unwrap_err()
                .key,
            "backend"
        );
        assert!(AllocatorConfig::parse("").is_ok());
    }

    #[test]
    fn roundup_lists() {
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(&c.roundup_power2_divisions[..8], &[1; 8]);
        assert_eq!(c.roundup_power2_divisions[8], 1);
        assert_eq!(c.roundup_power2_divisions[9], 2);
        assert_eq!(c.roundup_power2_divisions[10], 4);
        assert_eq!(&c.roundup_power2_divisions[11..], &[8; 5]);
        let c = AllocatorConfig::parse("roundup_power2_divisions:[1:2,>:8]").unwrap();
        assert_eq!(c.roundup_power2_divisions[0], 2);
        assert_eq!(&c.roundup_power2_divisions[1..], &[8; 15]);
    }

    #[test]
    fn reparse_resets_only_the_three_keys() {
        let mut c = AllocatorConfig::parse("max_split_size_mb:100,idle_stream_reuse:True,roundup_power2_divisions:4,graph_capture_record_stream_reuse:True").unwrap();
        c.apply("garbage_collection_threshold:0.6").unwrap();
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.roundup_power2_divisions, [0; 16]);
        assert!(c.idle_stream_reuse);
        assert_eq!(
            c.graph_capture_record_stream_reuse,
            CaptureReuse::CrossStream
        );
        // a failed parse leaves the config unchanged
        let before = c.clone();
        assert!(c.apply("max_split_size_mb:100,bogus:1").is_err());
        assert_eq!(c, before);
    }

    /// Every key the parser knows is honoured (it changes what the engine
    /// does), takes only the value cachalot implements (any other value is
    /// a typed "not supported" error), or belongs to another PyTorch
    /// allocator and is ignored with a warning naming it. The list is the
    /// parser's own.
    #[test]
    fn no_key_is_accepted_and_ignored_silently() {
        // (key, a value that changes behaviour); the engine reads each field
        let honoured: &[(&str, &str)] = &[
            ("large_segment_size_mb", "40"),
            ("max_split_size_mb", "100"),
            ("max_non_split_rounding_mb", "100"),
            ("garbage_collection_threshold", "0.5"),
            ("roundup_power2_divisions", "4"),
            ("graph_capture_record_stream_reuse", "pytorch"),
            ("per_process_memory_fraction", "0.5"),
            ("idle_stream_reuse", "True"),
            ("placement", "pytorch"),
            ("expandable_segments", "True"),
            ("release_lock_on_cudamalloc", "True"),
            ("release_lock_on_hipmalloc", "True"),
            ("release_lock_on_device_malloc", "True"),
        ];
        let refused: &[&str] = &["throw_on_cudamalloc_oom", "throw_on_device_malloc_oom"];
        // (key, PyTorch's default, a value valid for PyTorch that cachalot ignores)
        let ignored: &[(&str, &str, &str)] = &[
            ("backend", "native", "cudaMallocAsync"),
            ("backend", "native", "hipMallocAsync"),
            ("pinned_use_cuda_host_register", "False", "True"),
            ("pinned_use_hip_host_register", "False", "True"),
            ("pinned_use_background_threads", "False", "True"),
            ("pinned_num_register_threads", "1", "8"),
            ("pinned_reserve_segment_size_mb", "", "8"),
        ];
        let bare = |c: AllocatorConfig| AllocatorConfig {
            last_config_string: String::new(),
            ..c
        };
        for &(k, v) in honoured {
            assert!(AllocatorConfig::is_known(k), "{k}");
            let (c, w) = AllocatorConfig::parse_with_warnings(&format!("{k}:{v}")).unwrap();
            assert_ne!(c, AllocatorConfig::default(), "{k}:{v} changed nothing");
            assert!(w.is_empty(), "{k}:{v}: {w:?}");
        }
        for &k in refused {
            assert!(AllocatorConfig::is_known(k), "{k}");
            let c = AllocatorConfig::parse(&format!("{k}:False")).unwrap();
            assert_eq!(bare(c), AllocatorConfig::default(), "{k}");
            let e = AllocatorConfig::parse(&format!("{k}:True")).unwrap_err();
            assert!(
                matches!(e.kind, ConfigErrorKind::Unsupported { .. }),
                "{k}: {e}"
            );
            assert!(e.to_string().contains("not supported"), "{e}");
        }
        for &(k, default, other) in ignored {
            assert!(AllocatorConfig::is_known(k), "{k}");
            if !default.is_empty() {
                let (c, w) =
                    AllocatorConfig::parse_with_warnings(&format!("{k}:{default}")).unwrap();
                assert_eq!(bare(c), AllocatorConfig::default(), "{k}");
                assert!(w.is_empty(), "{k}:{default}: {w:?}");
            }
            let s = format!("{k}:{other},max_split_size_mb:100");
            let (c, w) = AllocatorConfig::parse_with_warnings(&s).unwrap();
            // ignored, and the rest of the string still applies
            assert_eq!(
                bare(c),
                AllocatorConfig::parse("max_split_size_mb:100")
                    .map(bare)
                    .unwrap(),
                "{s}"
            );
            assert_eq!(w.len(), 1, "{s}: {w:?}");
            assert_eq!((w[0].key.as_str(), w[0].value.as_str()), (k, other));
            let text = w[0].to_string();
            assert!(text.contains(&format!("'{k}:{other}' ignored")), "{text}");
            assert!(text.contains("PyTorch"), "{text}");
            // `parse` accepts it too (logging instead of returning it)
            AllocatorConfig::parse(&s).unwrap();
        }
        // a malformed value of an ignored key is still a typed error
        for s in [
            "backend:cudaMallocSync",
            "pinned_use_cuda_host_register:yes",
            "pinned_num_register_threads:3",
            "pinned_reserve_segment_size_mb:0",
        ] {
            AllocatorConfig::parse(s).expect_err(s);
        }
        // one warning per ignored key, in order
        let (_, w) = AllocatorConfig::parse_with_warnings(
            "backend:cudaMallocAsync,pinned_use_background_threads:True",
        )
        .unwrap();
        let keys: Vec<&str> = w.iter().map(|w| w.key.as_str()).collect();
        assert_eq!(keys, ["backend", "pinned_use_background_threads"]);
        // every key the parser accepts is in exactly one of the lists
        for k in KNOWN_KEYS {
            let n = usize::from(honoured.iter().any(|h| h.0 == *k))
                + usize::from(refused.contains(k))
                + usize::from(ignored.iter().any(|i| i.0 == *k));
            assert_eq!(n, 1, "key {k} is in {n} of the lists");
            assert!(AllocatorConfig::is_known(k), "{k}");
        }
    }

    /// `release_lock_on_cudamalloc` and its aliases set one field, with
    /// no warning, as PyTorch parses it (exactly `True`/`False`); a parse
    /// that does not name it keeps it.
    #[test]
    fn release_lock_is_a_bool_kept_across_parses() {
        for k in [
            "release_lock_on_cudamalloc",
            "release_lock_on_hipmalloc",
            "release_lock_on_device_malloc",
        ] {
            let (c, w) = AllocatorConfig::parse_with_warnings(&format!("{k}:True")).unwrap();
            assert!(c.release_lock_on_device_malloc, "{k}");
            assert!(w.is_empty(), "{k}: {w:?}");
            let mut c2 = c.clone();
            c2.apply("max_split_size_mb:100").unwrap();
            assert!(c2.release_lock_on_device_malloc, "{k} reset by another key");
            c2.apply(&format!("{k}:False")).unwrap();
            assert!(!c2.release_lock_on_device_malloc, "{k}");
            for bad in ["true", "1", "yes", "TRUE"] {
                let e = err(&format!("{k}:{bad}"));
                assert_eq!(e.key, k, "{e}");
                assert!(e.to_string().contains("Expected 'True' or 'False'"), "{e}");
            }
        }
    }

    fn err(s: &str) -> ConfigError {
        AllocatorConfig::parse(s).expect_err(s)
    }

    /// `s` fails as out of range for `key`, naming the value and a range
    /// that contains `allowed`.
    fn assert_out_of_range(s: &str, key: &str, value: &str, allowed: &str) {
        let e = err(s);
        assert_eq!(e.key, key, "{s}: {e}");
        match &e.kind {
            ConfigErrorKind::OutOfRange {
                value: v,
                allowed: a,
            } => {
                assert_eq!(v, value, "{s}: {e}");
                assert!(a.contains(allowed), "{s}: {a}");
            }
            k => panic!("{s}: not OutOfRange: {k:?} ({e})"),
        }
        let msg = e.to_string();
        assert!(msg.contains(key) && msg.contains(allowed), "{s}: {msg}");
    }

    #[test]
    fn hostile_numbers_are_out_of_range_naming_key_value_and_range() {
        let max = MAX_SIZE_MB.to_string();
        let over = (MAX_SIZE_MB + 1).to_string();
        let huge = "9223372036854775808";
        let beyond_u64 = "184467440737095516160000";
        for key in [
            "large_segment_size_mb",
            "max_split_size_mb",
            "max_non_split_rounding_mb",
            "pinned_reserve_segment_size_mb",
        ] {
            for v in [over.as_str(), huge, beyond_u64, "18446744073709551615"] {
                assert_out_of_range(&format!("{key}:{v}"), key, v, &max);
            }
            assert_out_of_range(&format!("{key}:-1"), key, "-1", &max);
            // the largest size passes the range check, and in bytes it is
            // MAX_REQUEST (the host allocator's key is then ignored)
            let (_, w) = AllocatorConfig::parse_with_warnings(&format!("{key}:{max}")).unwrap();
            assert_eq!(
                w.len(),
                usize::from(key == "pinned_reserve_segment_size_mb")
            );
        }
        let c = AllocatorConfig::parse(&format!("large_segment_size_mb:{max}")).unwrap();
        assert_eq!(c.large_segment_size, crate::engine::rounding::MAX_REQUEST);
        assert_out_of_range(
            "large_segment_size_mb:10",
            "large_segment_size_mb",
            "10",
            "[11,",
        );
        assert_out_of_range("max_split_size_mb:19", "max_split_size_mb", "19", "[20,");
        assert_out_of_range(
            "large_segment_size_mb:40,max_non_split_rounding_mb:39",
            "max_non_split_rounding_mb",
            "39",
            "[40,",
        );
        assert_out_of_range(
            "pinned_reserve_segment_size_mb:0",
            "pinned_reserve_segment_size_mb",
            "0",
            "[1,",
        );
        let d = MAX_ROUNDUP_DIVISIONS.to_string();
        for v in [huge, beyond_u64, "2097152", "3", "-4"] {
            let s = format!("roundup_power2_divisions:{v}");
            assert_out_of_range(&s, "roundup_power2_divisions", v, &d);
            // the per-interval form is checked the same way
            let s = format!("roundup_power2_divisions:[256:{v},>:8]");
            assert_out_of_range(&s, "roundup_power2_divisions", v, &d);
            let s = format!("roundup_power2_divisions:[256:4,>:{v}]");
            assert_out_of_range(&s, "roundup_power2_divisions", v, &d);
        }
        for b in [huge, over.as_str(), "0", "3"] {
            let s = format!("roundup_power2_divisions:[{b}:4]");
            assert_out_of_range(&s, "roundup_power2_divisions", b, &max);
        }
        let c = AllocatorConfig::parse(&format!("roundup_power2_divisions:[{max}:{d}]")).unwrap();
        assert_eq!(c.roundup_power2_divisions, [MAX_ROUNDUP_DIVISIONS; 16]);
        for v in ["0", "1", "1.0", "1e400", "inf", "NaN", "-0.5", "1e-400"] {
            let s = format!("garbage_collection_threshold:{v}");
            assert_out_of_range(&s, "garbage_collection_threshold", v, "(0.0, 1.0)");
        }
        for v in ["1.0000001", "1e308", "-inf", "nan", "-1"] {
            let s = format!("per_process_memory_fraction:{v}");
            assert_out_of_range(&s, "per_process_memory_fraction", v, "[0.0, 1.0]");
        }
        for v in ["0", "3", "256", huge] {
            let s = format!("pinned_num_register_threads:{v}");
            assert_out_of_range(&s, "pinned_num_register_threads", v, "<= 128");
        }
    }

    #[test]
    fn malformed_values_are_invalid_values() {
        for (s, key, value) in [
            ("max_split_size_mb:abc", "max_split_size_mb", "abc"),
            ("max_split_size_mb:1.5", "max_split_size_mb", "1.5"),
            (
                "garbage_collection_threshold:x",
                "garbage_collection_threshold",
                "x",
            ),
            ("expandable_segments:true", "expandable_segments", "true"),
            ("max_split_size_mb:[1:2]", "max_split_size_mb", "[1:2]"),
        ] {
            let e = err(s);
            assert_eq!(e.key, key, "{s}");
            assert_eq!(
                e.kind,
                ConfigErrorKind::InvalidValue {
                    value: value.to_string()
                },
                "{s}"
            );
        }
        assert!(matches!(
            err("backend:cudaMallocSync").kind,
            ConfigErrorKind::InvalidValue { .. }
        ));
        assert_eq!(err("foo:1").kind, ConfigErrorKind::UnknownKey);
    }

    #[test]
    fn syntax_errors_say_what_was_found_where() {
        for (s, key, offset, found) in [
            (":", "", 0, "expected a key, found ':' at offset 0"),
            (",,", "", 0, "expected a key, found ',' at offset 0"),
            (
                "expandable_segments:True,,",
                "",
                25,
                "expected a key, found ',' at offset 25",
            ),
            ("[", "", 0, "expected a key, found '[' at offset 0"),
            (
                "max_split_size_mb",
                "max_split_size_mb",
                17,
                "expected ':' after the key, found the end of the string at offset 17",
            ),
            (
                "max_split_size_mb:",
                "max_split_size_mb",
                18,
                "expected a value, found the end of the string",
            ),
            (
                "max_split_size_mb 100",
                "max_split_size_mb",
                18,
                "expected ':' after the key, found '100' at offset 18",
            ),
            (
                "max_split_size_mb:100 200",
                "max_split_size_mb",
                22,
                "expected ',' between options, found '200'",
            ),
            (
                "roundup_power2_divisions:[1:2",
                "roundup_power2_divisions",
                29,
                "found the end of the string at offset 29",
            ),
            (
                "roundup_power2_divisions:[1 2]",
                "roundup_power2_divisions",
                28,
                "expected ':' after the list boundary, found '2'",
            ),
        ] {
            let e = err(s);
            assert_eq!(e.key, key, "{s}: {e}");
            assert_eq!(e.kind, ConfigErrorKind::Syntax { offset }, "{s}: {e}");
            assert!(e.to_string().contains(found), "{s}: {e}");
            assert!(!e.to_string().contains("Colon"), "{e}");
            assert!(!e.to_string().contains("Comma"), "{e}");
        }
        // the old "key 'Colon'" wording is gone: no key is named before one
        assert_eq!(
            err(":").to_string(),
            "invalid allocator config: expected a key, found ':' at offset 0"
        );
    }

    #[test]
    fn long_input_is_refused_and_never_echoed_whole() {
        let huge = "x".repeat(100 << 20);
        let e = err(&huge);
        assert_eq!(
            e.kind,
            ConfigErrorKind::TooLong {
                len: 100 << 20,
                max: MAX_CONFIG_LEN
            }
        );
        assert!(e.to_string().len() < 300, "{}", e.to_string().len());
        // at the limit it parses (a long unknown key) and the key is cut
        let key = "k".repeat(MAX_CONFIG_LEN - 2);
        let e = err(&format!("{key}:1"));
        assert_eq!(e.kind, ConfigErrorKind::UnknownKey);
        assert_eq!(e.key, format!("{}…", "k".repeat(ECHO_LIMIT)));
        assert!(e.to_string().len() < 300);
        // a long value is cut in the error too
        let v = "9".repeat(60_000);
        let e = err(&format!("max_split_size_mb:{v}"));
        assert!(e.to_string().len() < 300, "{}", e.to_string().len());
        match e.kind {
            ConfigErrorKind::OutOfRange { value, .. } => {
                assert_eq!(value.chars().count(), ECHO_LIMIT + 1);
                assert!(value.ends_with('…'));
            }
            k => panic!("{k:?}"),
        }
        let e = err(&format!("expandable_segments:{}", "é".repeat(1000)));
        assert!(e.to_string().chars().count() < 200);
        assert_eq!(echo("short"), "short");
        assert_eq!(echo(&"a".repeat(ECHO_LIMIT)), "a".repeat(ECHO_LIMIT));
    }

    #[test]
    #[cfg(unix)]
    fn env_lookup_names_the_variable() {
        use std::os::unix::ffi::OsStringExt;
        let only = |name: &'static str, v: OsString| {
            move |var: &'static str| (var == name).then(|| v.clone())
        };
        let e = AllocatorConfig::from_lookup(only(
            "PYTORCH_CUDA_ALLOC_CONF",
            "roundup_power2_divisions:9223372036854775808".into(),
        ))
        .unwrap_err();
        assert_eq!(e.env_var, Some("PYTORCH_CUDA_ALLOC_CONF"));
        assert!(matches!(e.kind, ConfigErrorKind::OutOfRange { .. }));
        assert!(
            e.to_string().contains("(from PYTORCH_CUDA_ALLOC_CONF)"),
            "{e}"
        );
        let e = AllocatorConfig::from_lookup(only(
            "CACHALOT_ALLOC_CONF",
            OsString::from_vec(vec![b'a', 0xff, b':']),
        ))
        .unwrap_err();
        assert_eq!(e.kind, ConfigErrorKind::NotUnicode);
        assert_eq!(e.env_var, Some("CACHALOT_ALLOC_CONF"));
        let e =
            AllocatorConfig::from_lookup(only("PYTORCH_ALLOC_CONF", "y".repeat(1 << 20).into()))
                .unwrap_err();
        assert!(matches!(e.kind, ConfigErrorKind::TooLong { .. }));
        // the first set variable wins
        let (c, w) = AllocatorConfig::from_lookup_with_warnings(|var| match var {
            "PYTORCH_CUDA_ALLOC_CONF" => Some("max_split_size_mb:100".into()),
            "PYTORCH_ALLOC_CONF" => Some("bogus:1".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.max_split_size, 100 * MIB);
        assert!(w.is_empty());
        assert_eq!(
            AllocatorConfig::from_lookup(|_| None).unwrap(),
            AllocatorConfig::default()
        );
        // a PyTorch user's environment: the other backend's key is ignored,
        // the warning names the variable
        let (c, w) = AllocatorConfig::from_lookup_with_warnings(only(
            "PYTORCH_CUDA_ALLOC_CONF",
            "backend:cudaMallocAsync".into(),
        ))
        .unwrap();
        assert_eq!(c.last_config_string, "backend:cudaMallocAsync");
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].env_var, Some("PYTORCH_CUDA_ALLOC_CONF"));
        assert!(
            w[0].to_string().ends_with("(from PYTORCH_CUDA_ALLOC_CONF)"),
            "{}",
            w[0]
        );
    }

    /// Applies every string in order.
    fn fold(base: &AllocatorConfig, strings: &[&str]) -> AllocatorConfig {
        let mut c = base.clone();
        for s in strings {
            c.apply(s).unwrap();
        }
        c
    }

    #[test]
    fn replay_is_bounded_and_equals_the_whole_sequence() {
        let base = AllocatorConfig::parse("large_segment_size_mb:30,placement:pytorch").unwrap();
        let sequences: [&[&str]; 5] = [
            &[],
            &["max_split_size_mb:100"],
            &[
                "idle_stream_reuse:True,max_split_size_mb:100",
                "placement:steady",
                "garbage_collection_threshold:0.5,release_lock_on_device_malloc:False",
                "roundup_power2_divisions:[256:4,>:8]",
            ],
            &[
                "large_segment_size_mb:40,per_process_memory_fraction:0.5",
                "max_non_split_rounding_mb:50, pinned_num_register_threads:1",
                "graph_capture_record_stream_reuse:pytorch,expandable_segments:False",
                "large_segment_size_mb:60,max_split_size_mb:70",
                "idle_stream_reuse:True,throw_on_cudamalloc_oom:False,backend:native",
            ],
            &[
                "pinned_use_cuda_host_register:False,pinned_use_hip_host_register:False",
                "pinned_use_background_threads:False,per_process_memory_fraction:0.25",
                "",
            ],
        ];
        for seq in sequences {
            let mut r = ConfigReplay::new(base.clone());
            for s in seq {
                r.push(s).unwrap();
            }
            let want = fold(&base, seq);
            assert_eq!(r.config(), &want, "{seq:?}");
            let replayed: Vec<String> = r.strings();
            assert!(replayed.len() <= 2);
            let got = fold(
                &base,
                &replayed.iter().map(String::as_str).collect::<Vec<_>>(),
            );
            assert_eq!(got, want, "{seq:?} replayed as {replayed:?}");
        }
        // a failing push changes nothing and is checked against the state so far
        let mut r = ConfigReplay::new(base.clone());
        r.push("large_segment_size_mb:40").unwrap();
        let before = r.clone();
        let e = r.push("max_split_size_mb:35").unwrap_err();
        assert_eq!(e.key, "max_split_size_mb");
        assert_eq!(r, before);
        // 100k pushes: the stored text stays bounded
        let mut r = ConfigReplay::new(base.clone());
        let mut peak = 0;
        for i in 0..100_000u32 {
            let s = format!(
                "garbage_collection_threshold:0.{},idle_stream_reuse:{},placement:steady",
                i + 1,
                if i % 2 == 0 { "True" } else { "False" }
            );
            r.push(&s).unwrap();
            peak = peak.max(r.stored_bytes());
        }
        assert!(peak < 256, "stored {peak} bytes");
        assert!(!r.config().idle_stream_reuse);
        assert_eq!(r.config().garbage_collection_threshold, 0.1);
    }

    /// The ignored keys are logged once: a second parse with the same
    /// keys (each device's allocator parses the environment) says nothing.
    #[test]
    fn ignored_keys_are_logged_once() {
        use std::sync::Mutex;
        use std::sync::atomic::AtomicUsize;
        use tracing::field::{Field, Visit};

        /// Counts warning events and keeps their messages.
        #[derive(Default)]
        struct Count {
            events: AtomicUsize,
            text: Mutex<String>,
        }
        struct Text<'a>(&'a mut String);
        impl Visit for Text<'_> {
            fn record_debug(&mut self, _: &Field, v: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{v:?}"));
            }
        }
        impl tracing::Subscriber for &'static Count {
            fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
                tracing::span::Id::from_u64(1)
            }
            fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
            fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
            fn event(&self, e: &tracing::Event<'_>) {
                if *e.metadata().level() == tracing::Level::WARN {
                    self.events.fetch_add(1, Ordering::Relaxed);
                    e.record(&mut Text(&mut self.text.lock().unwrap()));
                }
            }
            fn enter(&self, _: &tracing::span::Id) {}
            fn exit(&self, _: &tracing::span::Id) {}
        }
        let count: &'static Count = Box::leak(Box::default());
        let flag = AtomicBool::new(false);
        let (_, w) = AllocatorConfig::parse_with_warnings(
            "backend:cudaMallocAsync,pinned_use_cuda_host_register:True",
        )
        .unwrap();
        tracing::subscriber::with_default(count, || {
            log_warnings_once(&flag, &[]);
            assert_eq!(count.events.load(Ordering::Relaxed), 0, "nothing to say");
            for _ in 0..3 {
                log_warnings_once(&flag, &w);
            }
        });
        assert_eq!(count.events.load(Ordering::Relaxed), 1);
        let text = count.text.lock().unwrap().clone();
        assert!(
            text.contains("'backend:cudaMallocAsync' ignored")
                && text.contains("'pinned_use_cuda_host_register:True' ignored"),
            "{text}"
        );
    }
}
