//! Typed errors of the allocator and of its backends.
#![forbid(unsafe_code)]

use std::error::Error as StdError;
use std::fmt;

/// A failed backend (driver) call, carrying the vendor's error code and,
/// where the binding provides one, the vendor error as `source`.
#[derive(Debug, thiserror::Error)]
#[error("{backend}: {call} failed with code {code}: {message}")]
pub struct BackendError {
    /// Backend name ("cuda", "hip", "level-zero", "mock").
    pub backend: &'static str,
    /// The driver call that failed.
    pub call: &'static str,
    /// The vendor's numeric error code (0 when there is none).
    pub code: i64,
    /// Human-readable description.
    pub message: String,
    /// The vendor error value, when the binding has one.
    #[source]
    pub source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl BackendError {
    /// A backend error without a vendor error value.
    pub fn new(
        backend: &'static str,
        call: &'static str,
        code: i64,
        message: impl Into<String>,
    ) -> Self {
        Self {
            backend,
            call,
            code,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the vendor error value as the source.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The error for a call the backend does not support.
    pub fn unsupported(backend: &'static str, call: &'static str) -> Self {
        Self::new(backend, call, 0, "not supported by this backend")
    }
}

/// Result of a failed raw segment allocation.
#[derive(Debug, thiserror::Error)]
pub enum DeviceAllocError {
    /// The device has no room for the segment now; freeing cached memory may help.
    #[error("device out of memory")]
    OutOfMemory,
    /// Any other driver failure; never retried.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// What is wrong with an allocator configuration string.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The string is not `key:value,...`; the problem is at byte `offset`.
    Syntax {
        /// Byte offset in the config string.
        offset: usize,
    },
    /// The string is longer than [`crate::config::MAX_CONFIG_LEN`] bytes.
    TooLong {
        /// Length of the string, in bytes.
        len: usize,
        /// The largest length accepted.
        max: usize,
    },
    /// A key cachalot does not know.
    UnknownKey,
    /// A value of the wrong form: not a number, not `True`/`False`, a list
    /// for a key that takes one value, ...
    InvalidValue {
        /// The value as written (truncated).
        value: String,
    },
    /// A number outside the range the key allows.
    OutOfRange {
        /// The value as written (truncated).
        value: String,
        /// The allowed range, in words (`"[11, 1099511627776] MiB"`).
        allowed: String,
    },
    /// A value PyTorch accepts and cachalot does not support.
    Unsupported {
        /// The value as written (truncated).
        value: String,
    },
    /// The environment variable that holds the string is not valid UTF-8.
    NotUnicode,
}

/// A malformed or invalid allocator configuration: the key (when the
/// problem is tied to one), what kind of problem, and a message. Every
/// piece of user input it echoes is truncated to
/// [`crate::config::ECHO_LIMIT`] characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The offending key; empty when the problem is not tied to a key
    /// (a syntax error before any key, a string too long).
    pub key: String,
    /// What kind of problem.
    pub kind: ConfigErrorKind,
    /// What is wrong, in words.
    pub reason: String,
    /// The environment variable the string came from, if it came from one.
    pub env_var: Option<&'static str>,
}

impl ConfigError {
    pub(crate) fn new(
        key: impl Into<String>,
        kind: ConfigErrorKind,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            key: key.into(),
            kind,
            reason: reason.into(),
            env_var: None,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid allocator config")?;
        if let Some(var) = self.env_var {
            write!(f, " (from {var})")?;
        }
        if !self.key.is_empty() {
            write!(f, ": key '{}'", self.key)?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl StdError for ConfigError {}

/// Misuse of graph capture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    /// The backend cannot capture (e.g. Level Zero).
    #[error("graph capture is not supported by the {0} backend")]
    Unsupported(&'static str),
    /// `begin_allocate_to_pool` for a pool that is already recording.
    #[error("already recording to mempool {0:?}")]
    AlreadyRecording((u64, u64)),
    /// `end_allocate_to_pool` for a pool that is not recording.
    #[error("not currently recording to mempool {0:?}")]
    NotRecording((u64, u64)),
    /// `release_pool` of an unknown pool, or a pool whose use count is 0.
    #[error("unknown or already released mempool {0:?}")]
    UnknownPool((u64, u64)),
    /// The pool id is reserved (the default pool (0,0)).
    #[error("mempool id {0:?} is reserved")]
    ReservedPool((u64, u64)),
    /// A stream was found in an invalidated capture.
    #[error("stream capture was invalidated")]
    Invalidated,
    /// The operation is not allowed while a capture is underway.
    #[error("{0} is not allowed while a graph capture is underway")]
    NotAllowedDuringCapture(&'static str),
    /// Streams of one capture report different graphs or states.
    #[error("inconsistent capture state: {0}")]
    Inconsistent(String),
    /// A pool checkpoint cannot be restored: taken by another allocator, or
    /// its segments are no longer the pool's as they were.
    #[error("cannot restore the pool checkpoint: {0}")]
    Checkpoint(String),
}

/// Details of an out-of-memory failure, with PyTorch's message fields and
/// what no peer reports: the largest free block per pool, cached bytes per
/// stream, and whether emptying the cache would make the request fit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OomReport {
    /// Backend name.
    pub backend: &'static str,
    /// Device index.
    pub device: u32,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// Rounded block size.
    pub rounded: u64,
    /// Segment size the allocator tried to obtain ("Tried to allocate").
    pub segment_size: u64,
    /// Total device capacity.
    pub total: u64,
    /// Free device memory as reported by the driver.
    pub device_free: u64,
    /// Allowed maximum when a memory fraction is set.
    pub allowed: Option<u64>,
    /// Bytes allocated by this allocator (including blocks cached in private pools).
    pub allocated: u64,
    /// Free bytes cached in private pools.
    pub private_pool_cached: u64,
    /// Bytes reserved by this allocator.
    pub reserved: u64,
    /// Largest free block of the default small pool.
    pub largest_free_small: u64,
    /// Largest free block of the default large pool.
    pub largest_free_large: u64,
    /// Free bytes cached per stream (stream rendered with `Debug`).
    pub cached_per_stream: Vec<(String, u64)>,
    /// Whether releasing every free cached segment would make the segment
    /// fit: false when nothing is releasable.
    pub fits_after_empty_cache: bool,
}

/// Formats a byte count as PyTorch's OOM message does.
pub fn format_size(bytes: u64) -> String {
    const KB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if bytes <= 1 << 20 {
        format!("{:.2} KiB", b / KB)
    } else if bytes <= 1 << 30 {
        format!("{:.2} MiB", b / (KB * KB))
    } else {
        format!("{:.2} GiB", b / (KB * KB * KB))
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory. Tried to allocate {}. Device {} ({}) has a total capacity of {} of which {} is free. ",
            format_size(self.segment_size),
            self.device,
            self.backend,
            format_size(self.total),
            format_size(self.device_free)
        )?;
        if let Some(a) = self.allowed {
            write!(f, "{} allowed; ", format_size(a))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by cachalot, ",
            format_size(self.allocated)
        )?;
        if self.private_pool_cached > 0 {
            write!(
                f,
                "with {} allocated in private pools (e.g., CUDA Graphs), ",
                format_size(self.private_pool_cached)
            )?;
        }
        write!(
            f,
            "and {} is reserved by cachalot but unallocated. ",
            format_size(
                self.reserved
                    .saturating_sub(self.allocated.saturating_sub(self.private_pool_cached))
                    .saturating_sub(self.private_pool_cached)
            )
        )?;
        write!(
            f,
            "Largest free block: {} (small pool), {} (large pool). ",
            format_size(self.largest_free_small),
            format_size(self.largest_free_large)
        )?;
        if !self.cached_per_stream.is_empty() {
            write!(f, "Cached per stream:")?;
            for (s, b) in &self.cached_per_stream {
                write!(f, " {s}={}", format_size(*b))?;
            }
            write!(f, ". ")?;
        }
        if self.fits_after_empty_cache {
            write!(
                f,
                "Emptying the cache (empty_cache) would make this request fit."
            )
        } else {
            write!(f, "Emptying the cache would not make this request fit.")?;
            if self.allowed.is_none() && self.device_free >= self.segment_size {
                write!(
                    f,
                    " The device reports that much memory free: what ran out is not its memory \
                     (address space, or a limit of the driver)."
                )?;
            }
            Ok(())
        }
    }
}

/// Every error the allocator returns across its public API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Out of memory now, after the whole flush-and-retry ladder. Freeing
    /// memory (or waiting for other streams) may make a retry succeed.
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),
    /// The request can never fit on this device (or is absurd, ≥ 2^60 bytes).
    #[error("allocation of {requested} bytes can never fit: {reason}")]
    NeverFits {
        /// Requested bytes.
        requested: u64,
        /// Why.
        reason: String,
        /// The allocator's report, when the request went through the
        /// out-of-memory ladder (none for a request of 2^60 bytes or more).
        report: Option<Box<OomReport>>,
    },
    /// The pointer was never handed out by this allocator.
    #[error("invalid device pointer: {0:#x} was not allocated by this allocator")]
    UnknownPointer(u64),
    /// The pointer lies in this allocator's memory, in a block that is not a
    /// live allocation (a cached free block, or one freed and waiting for
    /// its streams): a double free, or a free of memory never handed out.
    #[error("double free or invalid free of device pointer {0:#x}: it is not a live allocation")]
    DoubleFree(u64),
    /// The pointer lies inside a live allocation but is not its start
    /// (`free` and `record_stream` take the address the allocation returned).
    #[error(
        "device pointer {addr:#x} points inside the live allocation at {block:#x} \
         ({size} bytes, offset {offset}): pass the allocation's start address",
        offset = interior_offset(.addr, .block)
    )]
    InteriorPointer {
        /// The pointer passed.
        addr: u64,
        /// Start of the live allocation that contains it.
        block: u64,
        /// Size of that allocation's block, in bytes.
        size: u64,
    },
    /// The pointer lies in this allocator's memory but is not a live
    /// allocation (e.g. `record_stream` after free).
    #[error("device pointer {0:#x} is not a live allocation (already freed?)")]
    NotLive(u64),
    /// A malformed or invalid allocator configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Misuse of graph capture.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// A driver call failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// No backend or device is available.
    #[error("no device: {0}")]
    NoDevice(String),
    /// An environment variable cachalot reads holds a value it does not
    /// accept (not a number, out of range, not UTF-8).
    #[error("environment variable {var}: invalid value '{value}', expected {allowed}")]
    InvalidEnv {
        /// The variable.
        var: &'static str,
        /// Its value (truncated to [`crate::config::ECHO_LIMIT`] characters).
        value: String,
        /// What is allowed, in words (`"an integer in [0, 64]"`).
        allowed: String,
    },
    /// An argument is invalid (e.g. a device index out of range).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Releasing cached segments to the device failed for some of them
    /// (`empty_cache`, a private pool's release): every other segment was
    /// released; these stay cached, consistent, and a later release retries
    /// them.
    #[error(
        "{segments} cached segment(s) ({bytes} bytes) could not be released to the device; the first failure: {first}"
    )]
    ReleaseFailed {
        /// Segments still cached.
        segments: usize,
        /// Their bytes.
        bytes: u64,
        /// The first driver error.
        first: BackendError,
    },
}

impl Error {
    /// Whether this is the "out of memory now" kind (retrying after freeing may help).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory(_))
    }
}

/// Offset of an interior pointer in its block (for the message).
fn interior_offset(addr: &u64, block: &u64) -> u64 {
    addr.saturating_sub(*block)
}

/// Result alias of the allocator.
pub type Result<T, E = Error> = std::result::Result<T, E>;
