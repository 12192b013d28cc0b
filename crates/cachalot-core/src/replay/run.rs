//! The replay: a trace's operations through a [`CachingAllocator`], with
//! the figures `cca_replay.cpp` measures.

use std::time::Instant;

use super::{Op, Trace};
use crate::backend::Backend;
use crate::engine::CachingAllocator;
use crate::error::Error;

/// Figures of one replay, with the fields of `cca_replay.cpp` first.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayReport {
    /// Trace name.
    pub trace: String,
    /// Operations per pass.
    pub ops: usize,
    /// Host ns per operation on the first pass.
    pub cold_ns_per_op: f64,
    /// Median host ns per operation of the later passes.
    pub warm_ns_per_op: f64,
    /// Peak reserved bytes on the first pass.
    pub peak_reserved: i64,
    /// Peak allocated bytes on the first pass.
    pub peak_allocated: i64,
    /// Device allocations on the first pass.
    pub device_allocs_cold: i64,
    /// Device allocations over all passes.
    pub device_allocs_all: i64,
    /// Release-all retries over all passes.
    pub alloc_retries: i64,
    /// Device frees over all passes.
    pub device_frees_all: i64,
    /// Passes run.
    pub passes: usize,
}

impl ReplayReport {
    /// One JSON object with exactly the fields of `cca_replay.cpp`.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"trace\":\"{}\",\"ops\":{},\"cold_ns_per_op\":{:.1},\"warm_ns_per_op\":{:.1},\"peak_reserved\":{},\"peak_allocated\":{},\"device_allocs_cold\":{},\"device_allocs_all\":{},\"alloc_retries\":{}}}",
            self.trace.replace('\\', "\\\\").replace('"', "\\\""),
            self.ops,
            self.cold_ns_per_op,
            self.warm_ns_per_op,
            self.peak_reserved,
            self.peak_allocated,
            self.device_allocs_cold,
            self.device_allocs_all,
            self.alloc_retries
        )
    }
}

/// A failed replay: the allocator's error and, when an operation hit it,
/// which one (its index, its line in the trace text and its text).
#[derive(Debug, thiserror::Error)]
pub struct ReplayError {
    /// Trace name (the CLI puts the file path here).
    pub trace: String,
    /// Index of the failing operation (`None`: before the first operation,
    /// or freeing the blocks live at the end of a pass).
    pub op_index: Option<usize>,
    /// Its 1-based line in the trace text (`None` for a generated trace).
    pub line: Option<usize>,
    /// Its text, with the trace's own id and stream numbers.
    pub op: Option<String>,
    /// The allocator's error (boxed: the error stays small to return).
    #[source]
    pub source: Box<Error>,
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.trace)?;
        match (self.line, self.op_index) {
            (Some(line), _) => write!(f, ":{line}")?,
            (None, Some(i)) => write!(f, ": operation {i}")?,
            (None, None) => {}
        }
        if let Some(op) = &self.op {
            write!(f, ": '{op}'")?;
        }
        write!(f, ": {}", self.source)
    }
}

impl ReplayError {
    /// `source` hit at operation `op_index` of `trace`.
    pub fn at(trace: &Trace, op_index: usize, source: Error) -> Self {
        Self {
            trace: trace.name.clone(),
            op_index: Some(op_index),
            line: trace.line_of(op_index),
            op: trace.op_text(op_index),
            source: Box::new(source),
        }
    }

    /// `source` outside any one operation of `trace`.
    pub fn whole(trace: &Trace, source: Error) -> Self {
        Self {
            trace: trace.name.clone(),
            op_index: None,
            line: None,
            op: None,
            source: Box::new(source),
        }
    }
}

/// Checks that `streams` and `ptr` cover `trace` (no stream is folded onto
/// another: dense stream index `i` runs on `streams[i]`).
fn check_replay_args<S>(streams: &[S], trace: &Trace, ptr_len: usize) -> Result<(), ReplayError> {
    let need = (trace.num_streams as usize).max(1);
    if streams.len() < need {
        return Err(ReplayError::whole(
            trace,
            Error::InvalidArgument(format!(
                "the trace uses {need} streams but {} were given",
                streams.len()
            )),
        ));
    }
    if ptr_len < trace.num_ids {
        return Err(ReplayError::whole(
            trace,
            Error::InvalidArgument(format!(
                "the trace has {} ids but the address table has {ptr_len} entries",
                trace.num_ids
            )),
        ));
    }
    Ok(())
}

/// One pass of `trace` through `alloc`: every op (dense stream index `i`
/// on `streams[i]`), then the blocks still live are freed. `ptr` maps
/// allocation ids to addresses (at least `trace.num_ids` entries, all 0 on
/// entry and on return). `streams` must hold at least
/// `trace.num_streams.max(1)` streams, else an error (streams are never
/// folded onto each other); so must an op naming an id or stream beyond
/// them (a trace built by hand).
pub fn replay_pass<B: Backend>(
    alloc: &CachingAllocator<B>,
    streams: &[B::Stream],
    trace: &Trace,
    ptr: &mut [u64],
) -> Result<(), ReplayError> {
    check_replay_args(streams, trace, ptr.len())?;
    let bad = |i: usize, what: String| ReplayError::at(trace, i, Error::InvalidArgument(what));
    for (i, op) in trace.ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, size, stream } => {
                let Some(&s) = streams.get(stream as usize) else {
                    return Err(bad(i, format!("stream index {stream} out of range")));
                };
                let Some(slot) = ptr.get_mut(id as usize) else {
                    return Err(bad(i, format!("id {id} out of range")));
                };
                *slot = alloc
                    .allocate(size, s)
                    .map_err(|e| ReplayError::at(trace, i, e))?;
            }
            Op::Free { id } => {
                let Some(slot) = ptr.get_mut(id as usize) else {
                    return Err(bad(i, format!("id {id} out of range")));
                };
                let p = std::mem::take(slot);
                if p != 0 {
                    alloc.free(p).map_err(|e| ReplayError::at(trace, i, e))?;
                }
            }
        }
    }
    for p in ptr.iter_mut() {
        if *p != 0 {
            alloc
                .free(std::mem::take(p))
                .map_err(|e| ReplayError::whole(trace, e))?;
        }
    }
    Ok(())
}

/// Replays `trace` `passes` times through `alloc` as `cca_replay.cpp` does:
/// empty the cache and reset stats first; each pass runs every op (dense
/// stream index `i` on `streams[i]`; fewer streams than the trace uses is
/// an error) then frees what is still live. `progress` is called after
/// each pass.
pub fn replay<B: Backend>(
    alloc: &CachingAllocator<B>,
    streams: &[B::Stream],
    trace: &Trace,
    passes: usize,
    mut progress: impl FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    check_replay_args(streams, trace, trace.num_ids)?;
    let whole = |e| ReplayError::whole(trace, e);
    let passes = passes.max(1);
    alloc.empty_cache().map_err(whole)?;
    alloc.reset_peak_stats();
    alloc.reset_accumulated_stats();
    let mut ptr = vec![0u64; trace.num_ids];
    let mut warm = Vec::new();
    let mut cold = (0.0, 0, 0, 0);
    for pass in 0..passes {
        let t0 = Instant::now();
        replay_pass(alloc, streams, trace, &mut ptr)?;
        let per = t0.elapsed().as_nanos() as f64 / trace.ops.len().max(1) as f64;
        if pass == 0 {
            let s = alloc.stats();
            cold = (
                per,
                s.reserved_bytes.all().peak,
                s.allocated_bytes.all().peak,
                s.num_device_alloc,
            );
        } else {
            warm.push(per);
        }
        progress(pass);
    }
    warm.sort_by(f64::total_cmp);
    let s = alloc.stats();
    Ok(ReplayReport {
        trace: trace.name.clone(),
        ops: trace.ops.len(),
        cold_ns_per_op: cold.0,
        warm_ns_per_op: if warm.is_empty() {
            cold.0
        } else {
            warm[warm.len() / 2]
        },
        peak_reserved: cold.1,
        peak_allocated: cold.2,
        device_allocs_cold: cold.3,
        device_allocs_all: s.num_device_alloc,
        alloc_retries: s.num_alloc_retries,
        device_frees_all: s.num_device_free,
        passes,
    })
}
