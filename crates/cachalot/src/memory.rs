//! `torch.cuda.memory`'s API over the global allocators.
//!
//! The names are PyTorch's: what `torch.cuda.memory` (and `torch.cuda`,
//! which re-exports it) calls `mem_get_info`, `memory_summary`,
//! `memory_stats_as_nested_dict`, `set_per_process_memory_fraction` is
//! called the same here. PyTorch's private-looking history functions
//! `_record_memory_history`, `_snapshot` and `_dump_snapshot` drop the
//! leading underscore (a Rust public function does not start with one):
//! [`record_memory_history`], [`snapshot`], [`dump_snapshot`]. The
//! statistics readers that `torch.accelerator` shares with `torch.cuda`
//! ([`memory_stats`], [`memory_allocated`], ...) are re-exported from
//! [`crate::accelerator`], so `cachalot::memory` holds the whole of
//! `torch.cuda.memory`'s memory API in one place.
//!
//! As in PyTorch, every function takes the device last, `None` meaning the
//! current device ([`crate::accelerator::set_device`]). The readers of
//! statistics initialize nothing (an uninitialized device reads as zeros);
//! [`mem_get_info`], [`set_per_process_memory_fraction`] and
//! [`record_memory_history`] initialize the device's allocator, as
//! PyTorch's do.
//!
//! ```
//! use cachalot::{memory, DeviceBuffer, HistoryConfig};
//!
//! cachalot::init(cachalot::BackendKind::Mock).unwrap();
//! memory::record_memory_history(Some(HistoryConfig::default()), None).unwrap();
//! memory::set_per_process_memory_fraction(0.5, None).unwrap();
//! assert_eq!(memory::get_per_process_memory_fraction(None).unwrap(), 0.5);
//! let buf = DeviceBuffer::new(2 << 20).unwrap();
//! let nested = memory::memory_stats_as_nested_dict(None).unwrap();
//! assert_eq!(nested["allocated_bytes"].get_path("all.current"), Some(2 << 20));
//! let (free, total) = memory::mem_get_info(None).unwrap();
//! assert!(free <= total);
//! assert_eq!(memory::snapshot().len(), 1);
//! drop(buf);
//! print!("{}", memory::memory_summary(None, false).unwrap());
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use cachalot_core::engine::{HistoryConfig, Snapshot};
use cachalot_core::{DeviceIndex, Error};

pub use crate::accelerator::{
    empty_cache, max_memory_allocated, max_memory_reserved, memory_allocated, memory_reserved,
    memory_stats, reset_accumulated_memory_stats, reset_peak_memory_stats,
};
use crate::global;

/// One value of [`memory_stats_as_nested_dict`]: a number, or a dictionary
/// of further values (PyTorch's nested `dict`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NestedStat {
    /// A counter or byte count.
    Value(i64),
    /// A level of the nesting (`all` / `large_pool` / `small_pool`, then
    /// `current` / `peak` / `allocated` / `freed`).
    Dict(BTreeMap<String, NestedStat>),
}

impl NestedStat {
    /// The number, when this is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Self::Value(v) => Some(*v),
            Self::Dict(_) => None,
        }
    }

    /// The entry `key` of a dictionary (`None` for a number or a missing key).
    pub fn get(&self, key: &str) -> Option<&NestedStat> {
        match self {
            Self::Dict(d) => d.get(key),
            Self::Value(_) => None,
        }
    }

    /// The number at a dotted path below this value
    /// (`"all.current"` of `allocated_bytes`).
    pub fn get_path(&self, path: &str) -> Option<i64> {
        path.split('.')
            .try_fold(self, |v, k| v.get(k))
            .and_then(Self::as_i64)
    }
}

/// Nests flat statistics at their dots: `"allocated_bytes.all.current"`
/// becomes `allocated_bytes` → `all` → `current`, as PyTorch's
/// `memory_stats` flattens the nested dict it is given. A key that is both
/// a number and a prefix of another key (no PyTorch key is) keeps the
/// number under its full flat name.
pub fn nest_stats(flat: &BTreeMap<String, i64>) -> BTreeMap<String, NestedStat> {
    let mut root: BTreeMap<String, NestedStat> = BTreeMap::new();
    for (key, &value) in flat {
        if !insert_nested(&mut root, key, value) {
            root.insert(key.clone(), NestedStat::Value(value));
        }
    }
    root
}

/// Inserts `value` at the dotted `key`; false (nothing changed) when a
/// number already sits where a dictionary is needed, or the reverse.
fn insert_nested(root: &mut BTreeMap<String, NestedStat>, key: &str, value: i64) -> bool {
    let parts: Vec<&str> = key.split('.').collect();
    let Some((last, dirs)) = parts.split_last() else {
        return false;
    };
    // check first, so that a conflict leaves the map as it was
    let mut probe = Some(&*root);
    for d in dirs {
        match probe.and_then(|m| m.get(*d)) {
            Some(NestedStat::Dict(m)) => probe = Some(m),
            Some(NestedStat::Value(_)) => return false,
            None => probe = None,
        }
    }
    if let Some(NestedStat::Dict(_)) = probe.and_then(|m| m.get(*last)) {
        return false;
    }
    let mut map = root;
    for d in dirs {
        let entry = map
            .entry((*d).to_string())
            .or_insert_with(|| NestedStat::Dict(BTreeMap::new()));
        let NestedStat::Dict(next) = entry else {
            return false; // checked above
        };
        map = next;
    }
    map.insert((*last).to_string(), NestedStat::Value(value));
    true
}

/// `torch.cuda.memory_stats_as_nested_dict`: [`memory_stats`] nested at
/// the dots of its keys (empty when the device's allocator is not
/// initialized).
pub fn memory_stats_as_nested_dict(
    device: Option<DeviceIndex>,
) -> Result<BTreeMap<String, NestedStat>, Error> {
    Ok(nest_stats(&memory_stats(device)?))
}

/// `torch.cuda.mem_get_info`: `(free, total)` device bytes as the driver
/// reports them. Opens the device (initializes its allocator).
/// `torch.accelerator` calls the same function
/// [`get_memory_info`](crate::accelerator::get_memory_info).
pub fn mem_get_info(device: Option<DeviceIndex>) -> Result<(u64, u64), Error> {
    let info = global::allocator(device)?.memory_info()?;
    Ok((info.free, info.total))
}

/// `torch.cuda.set_per_process_memory_fraction`: caps the device's
/// allocator at `fraction` (in `[0, 1]`, else an error and nothing changes)
/// of the device's total memory; a request that would reserve more is an
/// out-of-memory error. Initializes the device's allocator.
pub fn set_per_process_memory_fraction(
    fraction: f64,
    device: Option<DeviceIndex>,
) -> Result<(), Error> {
    global::allocator(device)?.set_per_process_memory_fraction(fraction)
}

/// `torch.cuda.get_per_process_memory_fraction`: the fraction of the
/// device's memory its allocator may reserve (1.0 unless set by
/// [`set_per_process_memory_fraction`] or the `per_process_memory_fraction`
/// config key). Initializes the device's allocator.
pub fn get_per_process_memory_fraction(device: Option<DeviceIndex>) -> Result<f64, Error> {
    Ok(global::allocator(device)?
        .config()
        .per_process_memory_fraction)
}

/// `torch.cuda.memory_summary(device, abbreviated)`: the statistics table
/// of the device (all zeros when it is not initialized; initializes
/// nothing). `abbreviated` leaves out the per-pool lines.
pub fn memory_summary(device: Option<DeviceIndex>, abbreviated: bool) -> Result<String, Error> {
    let d = device.unwrap_or_else(global::current_device);
    Ok(match global::try_allocator(Some(d))? {
        Some(a) => a.memory_summary(abbreviated),
        None => crate::summary::render(
            &BTreeMap::new(),
            d,
            crate::summary::SummaryLabels::for_backend(global::backend_kind()?.as_str()),
            abbreviated,
        ),
    })
}

/// `torch.cuda.memory._record_memory_history`: turns the memory history of
/// `device` on (`Some`, with its ring size and whether to capture
/// backtraces) or off (`None`, clearing it); initializes its allocator.
pub fn record_memory_history(
    config: Option<HistoryConfig>,
    device: Option<DeviceIndex>,
) -> Result<(), Error> {
    global::allocator(device)?.record_memory_history(config);
    Ok(())
}

/// `torch.cuda.memory._snapshot`: the segments, blocks and memory history
/// of every initialized global allocator, by device index. The dictionary
/// PyTorch returns is [`crate::export::snapshot_value`] of this.
pub fn snapshot() -> Vec<Snapshot> {
    global::initialized_allocators()
        .iter()
        .map(|a| a.snapshot())
        .collect()
}

/// `torch.cuda.memory._dump_snapshot`: writes [`snapshot`] to `path`, as a
/// pickle that `python -m torch.cuda._memory_viz` and
/// `pytorch.org/memory_viz` open when the name ends in `.pickle` or `.pkl`,
/// else as JSON of the same structure.
pub fn dump_snapshot(path: impl AsRef<Path>) -> std::io::Result<()> {
    crate::export::write_snapshot(path, &snapshot())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nests_pytorch_keys() {
        let flat = cachalot_core::DeviceStats::default().to_flat();
        let nested = nest_stats(&flat);
        // every flat key is found again at its path, and nothing else
        let mut leaves = 0;
        fn count(v: &NestedStat, n: &mut usize) {
            match v {
                NestedStat::Value(_) => *n += 1,
                NestedStat::Dict(d) => d.values().for_each(|v| count(v, n)),
            }
        }
        for v in nested.values() {
            count(v, &mut leaves);
        }
        assert_eq!(leaves, flat.len());
        let root = NestedStat::Dict(nested.clone());
        for (k, v) in &flat {
            assert_eq!(root.get_path(k), Some(*v), "{k}");
        }
        assert!(nested["allocated_bytes"].get("large_pool").is_some());
        assert_eq!(nested["num_ooms"], NestedStat::Value(0));
        assert_eq!(nested["num_ooms"].get("x"), None);
        assert_eq!(nested["allocation"].as_i64(), None);
    }

    #[test]
    fn conflicting_keys_stay_flat() {
        let flat: BTreeMap<String, i64> = [("a", 1), ("a.b", 2), ("c.d", 3), ("c.d.e", 4)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let n = nest_stats(&flat);
        assert_eq!(n["a"], NestedStat::Value(1));
        assert_eq!(n["a.b"], NestedStat::Value(2));
        assert_eq!(n["c"].get_path("d"), Some(3));
        assert_eq!(n["c.d.e"], NestedStat::Value(4));
        // an empty key, and empty parts, nest as empty names
        let odd: BTreeMap<String, i64> = [(String::new(), 5), ("x..y".to_string(), 6)].into();
        let n = nest_stats(&odd);
        assert_eq!(n[""], NestedStat::Value(5));
        assert_eq!(n["x"].get_path(".y"), Some(6));
    }
}
