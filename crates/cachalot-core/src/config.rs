//! The allocator configuration string (PyTorch's `PYTORCH_ALLOC_CONF`
//! grammar and keys, read from `CACHALOT_ALLOC_CONF`).
//!
//! Grammar: tokens split on `,` `:` `[` `]`, whitespace dropped; `key:value`
//! pairs separated by commas; list values in brackets; booleans exactly
//! `True`/`False`. Every parse first resets `max_split_size`,
//! `roundup_power2_divisions`, `garbage_collection_threshold` and
//! `max_non_split_rounding` to their defaults; every other key keeps its
//! previous value unless named (PyTorch 2.11's runtime re-parse semantics).
#![forbid(unsafe_code)]

use crate::error::ConfigError;

/// Environment variables read, in order; the first one that is set wins.
pub const CONFIG_ENV_VARS: [&str; 4] = [
    "CACHALOT_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
];

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
    /// Expandable segments (accepted; the engine uses fixed segments).
    pub expandable_segments: bool,
    /// Release the allocator lock around device allocation calls.
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
    /// Pinned host allocator: register with the device (stored only).
    pub pinned_use_host_register: bool,
    /// Pinned host allocator: registration threads (stored only).
    pub pinned_num_register_threads: u64,
    /// Pinned host allocator: background threads (stored only).
    pub pinned_use_background_threads: bool,
    /// Pinned host allocator: reserve segment size in MiB (stored only).
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

#[derive(Debug, Clone, PartialEq)]
enum Tok<'a> {
    Word(&'a str),
    Colon,
    Comma,
    Open,
    Close,
}

fn tokenize<'a>(s: &'a str) -> Vec<Tok<'a>> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let flush = |start: &mut Option<usize>, end: usize, out: &mut Vec<Tok<'a>>| {
        if let Some(b) = start.take() {
            let w = s[b..end].trim();
            if !w.is_empty() {
                out.push(Tok::Word(w));
            }
        }
    };
    for (i, c) in s.char_indices() {
        let t = match c {
            ',' => Some(Tok::Comma),
            ':' => Some(Tok::Colon),
            '[' => Some(Tok::Open),
            ']' => Some(Tok::Close),
            c if c.is_whitespace() => {
                flush(&mut start, i, &mut out);
                continue;
            }
            _ => None,
        };
        match t {
            Some(t) => {
                flush(&mut start, i, &mut out);
                out.push(t);
            }
            None => {
                if start.is_none() {
                    start = Some(i);
                }
            }
        }
    }
    flush(&mut start, s.len(), &mut out);
    out
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(ConfigError::new(
            key,
            format!("Expected 'True' or 'False', got '{v}'"),
        )),
    }
}

fn parse_u64(key: &str, v: &str) -> Result<u64, ConfigError> {
    v.parse::<u64>()
        .map_err(|_| ConfigError::new(key, format!("expected a non-negative integer, got '{v}'")))
}

fn parse_f64(key: &str, v: &str) -> Result<f64, ConfigError> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| ConfigError::new(key, format!("expected a number, got '{v}'")))
}

fn mib(key: &str, v: u64) -> Result<u64, ConfigError> {
    v.checked_mul(MIB)
        .ok_or_else(|| ConfigError::new(key, format!("{v} MiB is too large")))
}

impl AllocatorConfig {
    /// Parses a config string over the defaults.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut c = Self::default();
        c.apply(s)?;
        Ok(c)
    }

    /// Reads the first set variable of [`CONFIG_ENV_VARS`]; defaults if none is set.
    pub fn from_env() -> Result<Self, ConfigError> {
        for var in CONFIG_ENV_VARS {
            if let Ok(v) = std::env::var(var) {
                return Self::parse(&v).map_err(|mut e| {
                    e.reason = format!("{} (from {var})", e.reason);
                    e
                });
            }
        }
        Ok(Self::default())
    }

    /// Re-parses `s` on top of this config, as PyTorch's runtime
    /// `_accelerator_setAllocatorSettings`. On error `self` is unchanged.
    pub fn apply(&mut self, s: &str) -> Result<(), ConfigError> {
        let mut c = self.clone();
        c.max_split_size = u64::MAX;
        c.roundup_power2_divisions = [0; ROUNDUP_INTERVALS];
        c.garbage_collection_threshold = 0.0;
        c.max_non_split_rounding_size = c.large_segment_size;
        let toks = tokenize(s);
        let mut i = 0;
        while i < toks.len() {
            let key = match toks[i] {
                Tok::Word(w) => w,
                ref t => {
                    return Err(ConfigError::new(
                        format!("{t:?}"),
                        "expected a key".to_string(),
                    ));
                }
            };
            if toks.get(i + 1) != Some(&Tok::Colon) {
                return Err(ConfigError::new(key, "expected ':' after the key"));
            }
            i += 2;
            if toks.get(i) == Some(&Tok::Open) {
                // list value
                let mut j = i + 1;
                let mut items = Vec::new();
                loop {
                    match toks.get(j) {
                        Some(Tok::Close) => break,
                        Some(Tok::Word(b)) => {
                            if toks.get(j + 1) != Some(&Tok::Colon) {
                                return Err(ConfigError::new(
                                    key,
                                    "expected 'boundary:value' in list",
                                ));
                            }
                            let v = match toks.get(j + 2) {
                                Some(Tok::Word(v)) => *v,
                                _ => return Err(ConfigError::new(key, "missing value in list")),
                            };
                            items.push((*b, v));
                            j += 3;
                            match toks.get(j) {
                                Some(Tok::Comma) => j += 1,
                                Some(Tok::Close) => {}
                                _ => {
                                    return Err(ConfigError::new(
                                        key,
                                        "expected ',' or ']' in list",
                                    ));
                                }
                            }
                        }
                        _ => return Err(ConfigError::new(key, "unterminated list")),
                    }
                }
                c.set_list(key, &items)?;
                i = j + 1;
            } else {
                let v = match toks.get(i) {
                    Some(Tok::Word(v)) => *v,
                    _ => return Err(ConfigError::new(key, "missing value")),
                };
                c.set(key, v)?;
                i += 1;
            }
            match toks.get(i) {
                None => {}
                Some(Tok::Comma) => i += 1,
                Some(_) => return Err(ConfigError::new(key, "expected ',' between options")),
            }
        }
        c.last_config_string = s.to_string();
        *self = c;
        Ok(())
    }

    fn set_list(&mut self, key: &str, items: &[(&str, &str)]) -> Result<(), ConfigError> {
        if key != "roundup_power2_divisions" {
            if Self::is_known(key) {
                return Err(ConfigError::new(key, "does not take a list value"));
            }
            return Err(unknown(key));
        }
        let mut table = [0u64; ROUNDUP_INTERVALS];
        let mut first = true;
        let mut last_index = 0usize;
        for (b, v) in items {
            let val = parse_u64(key, v)?;
            if val != 0 && !val.is_power_of_two() {
                return Err(ConfigError::new(
                    key,
                    format!("For roundups, the divisions has to be power of 2, got {val}"),
                ));
            }
            if *b == ">" {
                for e in table.iter_mut().skip(last_index + 1) {
                    *e = val;
                }
                continue;
            }
            let boundary = parse_u64(key, b)?;
            if !boundary.is_power_of_two() {
                return Err(ConfigError::new(
                    key,
                    format!("For roundups, the intervals have to be power of 2, got {boundary}"),
                ));
            }
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
        matches!(
            key,
            "backend"
                | "large_segment_size_mb"
                | "max_split_size_mb"
                | "max_non_split_rounding_mb"
                | "garbage_collection_threshold"
                | "roundup_power2_divisions"
                | "expandable_segments"
                | "release_lock_on_cudamalloc"
                | "release_lock_on_hipmalloc"
                | "release_lock_on_device_malloc"
                | "graph_capture_record_stream_reuse"
                | "per_process_memory_fraction"
                | "throw_on_cudamalloc_oom"
                | "throw_on_device_malloc_oom"
                | "idle_stream_reuse"
                | "placement"
                | "pinned_use_cuda_host_register"
                | "pinned_use_hip_host_register"
                | "pinned_num_register_threads"
                | "pinned_use_background_threads"
                | "pinned_reserve_segment_size_mb"
        )
    }

    fn set(&mut self, key: &str, v: &str) -> Result<(), ConfigError> {
        match key {
            "backend" => match v {
                "native" => {}
                "cudaMallocAsync" | "hipMallocAsync" => {
                    return Err(ConfigError::new(
                        key,
                        format!("'{v}' is not supported by cachalot (only 'native')"),
                    ));
                }
                _ => {
                    return Err(ConfigError::new(
                        key,
                        format!("Unknown allocator backend '{v}'"),
                    ));
                }
            },
            "large_segment_size_mb" => {
                let n = parse_u64(key, v)?;
                if n <= 10 {
                    return Err(ConfigError::new(
                        key,
                        format!("{n} is too small, must be > 10 MB"),
                    ));
                }
                self.large_segment_size = mib(key, n)?;
                if self.max_non_split_rounding_size < self.large_segment_size {
                    self.max_non_split_rounding_size = self.large_segment_size;
                }
            }
            "max_split_size_mb" => {
                let n = parse_u64(key, v)?;
                let min = self.large_segment_size / MIB;
                if n < min {
                    return Err(ConfigError::new(
                        key,
                        format!("{n} is too small, must be >= {min}"),
                    ));
                }
                self.max_split_size = mib(key, n)?;
            }
            "max_non_split_rounding_mb" => {
                let n = parse_u64(key, v)?;
                let min = self.large_segment_size / MIB;
                if n < min {
                    return Err(ConfigError::new(
                        key,
                        format!("{n} is too small, must be >= {min}"),
                    ));
                }
                self.max_non_split_rounding_size = mib(key, n)?;
            }
            "garbage_collection_threshold" => {
                let x = parse_f64(key, v)?;
                if !(x > 0.0 && x < 1.0) {
                    return Err(ConfigError::new(
                        key,
                        format!("{v} is out of range, set it in (0.0, 1.0)"),
                    ));
                }
                self.garbage_collection_threshold = x;
            }
            "roundup_power2_divisions" => {
                let n = parse_u64(key, v)?;
                if n != 0 && !n.is_power_of_two() {
                    return Err(ConfigError::new(
                        key,
                        format!("For roundups, the divisions has to be power of 2, got {n}"),
                    ));
                }
                self.roundup_power2_divisions = [n; ROUNDUP_INTERVALS];
            }
            "expandable_segments" => self.expandable_segments = parse_bool(key, v)?,
            "release_lock_on_cudamalloc"
            | "release_lock_on_hipmalloc"
            | "release_lock_on_device_malloc" => {
                self.release_lock_on_device_malloc = parse_bool(key, v)?
            }
            "graph_capture_record_stream_reuse" => {
                self.graph_capture_record_stream_reuse = match v {
                    "True" | "cross_stream" => CaptureReuse::CrossStream,
                    "pytorch" => CaptureReuse::PyTorch,
                    "False" | "off" => CaptureReuse::Off,
                    _ => {
                        return Err(ConfigError::new(
                            key,
                            format!(
                                "Expected 'True', 'False', 'pytorch' or 'cross_stream', got '{v}'"
                            ),
                        ));
                    }
                }
            }
            "per_process_memory_fraction" => {
                let x = parse_f64(key, v)?;
                if !(0.0..=1.0).contains(&x) {
                    return Err(ConfigError::new(
                        key,
                        format!("{v} is out of range, set it in [0.0, 1.0]"),
                    ));
                }
                self.per_process_memory_fraction = x;
            }
            "throw_on_cudamalloc_oom" | "throw_on_device_malloc_oom" => {
                self.throw_on_device_malloc_oom = parse_bool(key, v)?
            }
            "idle_stream_reuse" => self.idle_stream_reuse = parse_bool(key, v)?,
            "placement" => {
                self.placement = match v {
                    "steady" => Placement::Steady,
                    "pytorch" => Placement::PyTorch,
                    _ => {
                        return Err(ConfigError::new(
                            key,
                            format!("{v} is not a placement, use steady or pytorch"),
                        ));
                    }
                }
            }
            "pinned_use_cuda_host_register" | "pinned_use_hip_host_register" => {
                self.pinned_use_host_register = parse_bool(key, v)?
            }
            "pinned_num_register_threads" => {
                let n = parse_u64(key, v)?;
                if !n.is_power_of_two() || n > 128 {
                    return Err(ConfigError::new(
                        key,
                        format!("{n} must be a power of 2 and at most 128"),
                    ));
                }
                self.pinned_num_register_threads = n;
            }
            "pinned_use_background_threads" => {
                self.pinned_use_background_threads = parse_bool(key, v)?
            }
            "pinned_reserve_segment_size_mb" => {
                let n = parse_u64(key, v)?;
                if n == 0 {
                    return Err(ConfigError::new(key, "must be > 0"));
                }
                self.pinned_reserve_segment_size_mb = n;
            }
            _ => return Err(unknown(key)),
        }
        Ok(())
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
            self.max_split_size as i64
        }
    }
}

fn unknown(key: &str) -> ConfigError {
    ConfigError::new(
        key,
        format!("Unrecognized key '{key}' in Accelerator allocator config."),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_simple_keys() {
        let c = AllocatorConfig::parse(
            "max_split_size_mb:100, garbage_collection_threshold:0.5,expandable_segments:True",
        )
        .unwrap();
        assert_eq!(c.max_split_size, 100 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.5);
        assert!(c.expandable_segments);
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
            AllocatorConfig::parse("backend:cudaMallocAsync")
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
        let mut c = AllocatorConfig::parse("max_split_size_mb:100,expandable_segments:True,roundup_power2_divisions:4,graph_capture_record_stream_reuse:True").unwrap();
        c.apply("garbage_collection_threshold:0.6").unwrap();
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.roundup_power2_divisions, [0; 16]);
        assert!(c.expandable_segments);
        assert_eq!(
            c.graph_capture_record_stream_reuse,
            CaptureReuse::CrossStream
        );
        // a failed parse leaves the config unchanged
        let before = c.clone();
        assert!(c.apply("max_split_size_mb:100,bogus:1").is_err());
        assert_eq!(c, before);
    }
}
