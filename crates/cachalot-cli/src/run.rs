//! Loading traces, opening the device, and the `replay` and `summary` commands.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cachalot::core::replay::Op;
use cachalot::{
    AllocatorConfig, BackendKind, DeviceAllocator, Error, H200_TOTAL_MEMORY, HistoryConfig,
    ReplayError, ReplayReport, Stream, Trace,
};

use crate::{CliError, DeviceOpts, print_out};

/// Total operations (over all passes) from which a progress bar is shown.
const PROGRESS_MIN_OPS: usize = 500_000;

/// A failed replay of the trace given as `spec` (its file path), exit
/// code 1: `replaying FILE:LINE: 'OP': error`.
pub fn replay_failure(spec: &str, mut e: ReplayError) -> CliError {
    e.trace = spec.to_string();
    CliError::failure(format!("replaying {e}"))
}

/// A synthetic trace by name, else the trace file at `spec`; a malformed
/// or over-limit trace is a usage error naming the file, line and value.
pub fn load_trace(spec: &str) -> Result<Trace, CliError> {
    if let Some(t) = Trace::synthetic(spec) {
        return Ok(t);
    }
    let mut t = Trace::load(spec).map_err(|e| CliError::usage(e.to_string()))?;
    // Name the trace like cca_replay: the file stem.
    if let Some(stem) = Path::new(spec).file_stem().and_then(|s| s.to_str()) {
        t.name = stem.to_string();
    }
    Ok(t)
}

/// The backend named by `--backend`, else the detected one.
pub fn backend_kind(opts: &DeviceOpts) -> Result<BackendKind, CliError> {
    match &opts.backend {
        Some(b) => b.parse().map_err(|e: Error| CliError::usage(e.to_string())),
        None => BackendKind::detect().map_err(|e| CliError::usage(e.to_string())),
    }
}

/// The allocator config from `--config`, else from the environment.
pub fn allocator_config(opts: &DeviceOpts) -> Result<AllocatorConfig, CliError> {
    match &opts.config {
        Some(c) => AllocatorConfig::parse(c),
        None => AllocatorConfig::from_env(),
    }
    .map_err(|e| CliError::usage(e.to_string()))
}

/// A fresh allocator over device 0 of the chosen backend; the mock is an
/// H200-sized device whose work completes at once, without race checking.
pub fn open_device(
    kind: BackendKind,
    config: AllocatorConfig,
) -> Result<Arc<DeviceAllocator>, CliError> {
    let r = match kind {
        BackendKind::Mock => {
            let backend = cachalot::mock::MockConfig::new(H200_TOTAL_MEMORY)
                .auto_complete(true)
                .race_checking(false)
                .build();
            DeviceAllocator::with_mock(backend, Some(config))
        }
        other => DeviceAllocator::open(other, 0, Some(config)),
    };
    r.map_err(|e| match e {
        Error::Config(_) | Error::NoDevice(_) | Error::InvalidArgument(_) => {
            CliError::usage(format!("cannot open the {kind} backend: {e}"))
        }
        other => CliError::failure(format!("cannot open the {kind} backend: {other}")),
    })
}

fn failure(context: &str) -> impl Fn(Error) -> CliError + '_ {
    move |e| CliError::failure(format!("{context}: {e}"))
}

fn fmt_bytes(b: i64) -> String {
    let v = b as f64;
    let (unit, d) = if b >= 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        ("MiB", (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        ("KiB", 1024.0)
    } else {
        return format!("{b} B");
    };
    format!("{b} ({:.2} {unit})", v / d)
}

fn print_report(out: &mut impl Write, r: &ReplayReport, kind: BackendKind) -> std::io::Result<()> {
    let ratio = if r.peak_allocated > 0 {
        r.peak_reserved as f64 / r.peak_allocated as f64
    } else {
        0.0
    };
    writeln!(
        out,
        "trace {} ({kind} backend, {} passes)",
        r.trace, r.passes
    )?;
    let rows: [(&str, String); 10] = [
        ("ops per pass", r.ops.to_string()),
        ("peak reserved", fmt_bytes(r.peak_reserved)),
        ("peak allocated", fmt_bytes(r.peak_allocated)),
        ("reserved/allocated", format!("{ratio:.3}")),
        ("device allocs (cold)", r.device_allocs_cold.to_string()),
        ("device allocs (all)", r.device_allocs_all.to_string()),
        ("device frees (all)", r.device_frees_all.to_string()),
        ("alloc retries", r.alloc_retries.to_string()),
        ("cold ns/op", format!("{:.1}", r.cold_ns_per_op)),
        ("warm ns/op", format!("{:.1}", r.warm_ns_per_op)),
    ];
    for (k, v) in rows {
        writeln!(out, "  {k:<22} {v:>28}")?;
    }
    Ok(())
}

fn snapshot_path(base: &Path, trace: &str, many: bool) -> PathBuf {
    if !many {
        return base.to_path_buf();
    }
    let stem = base
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("snapshot");
    let name = match base.extension().and_then(|e| e.to_str()) {
        Some(ext) => format!("{stem}-{trace}.{ext}"),
        None => format!("{stem}-{trace}"),
    };
    base.with_file_name(name)
}

/// `cachalot threads`: the multi-thread benchmark, one fresh allocator per
/// thread count, one JSON line each (`cca_threads.cpp`'s fields).
pub fn threads_cmd(opts: &DeviceOpts, threads: &[usize], ops: u64) -> Result<(), CliError> {
    let kind = backend_kind(opts)?;
    let config = allocator_config(opts)?;
    for &t in threads {
        // clap bounds the count; checked again for a direct caller
        if !(1..=cachalot::MAX_BENCH_THREADS).contains(&t) {
            return Err(CliError::usage(format!(
                "--threads: thread count {t} is outside 1..={}",
                cachalot::MAX_BENCH_THREADS
            )));
        }
        let dev = open_device(kind, config.clone())?;
        let r = dev
            .threads_bench(t, ops)
            .map_err(failure(&format!("running {t} threads")))?;
        print_out(&format!("{}\n", r.to_json()))?;
    }
    Ok(())
}

/// `cachalot replay`.
pub fn replay_cmd(
    traces: &[String],
    opts: &DeviceOpts,
    passes: usize,
    json: bool,
    stats: bool,
    snapshot: Option<&Path>,
) -> Result<(), CliError> {
    let kind = backend_kind(opts)?;
    let config = allocator_config(opts)?;
    // Load every trace first so that a bad one fails before any work.
    let loaded = traces
        .iter()
        .map(|t| load_trace(t))
        .collect::<Result<Vec<_>, _>>()?;
    let passes = passes.max(1);
    let stdout = std::io::stdout();
    for (spec, trace) in traces.iter().zip(&loaded) {
        let dev = open_device(kind, config.clone())?;
        if snapshot.is_some() {
            dev.record_memory_history(Some(HistoryConfig::default()));
        }
        let bar = (std::io::stderr().is_terminal()
            && trace.ops.len().saturating_mul(passes) >= PROGRESS_MIN_OPS)
            .then(|| {
                let pb = indicatif::ProgressBar::new(passes as u64);
                pb.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} [{bar:30}] pass {pos}/{len} ({elapsed})",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                pb.set_message(trace.name.clone());
                pb
            });
        let report = dev
            .replay(trace, passes, |_| {
                if let Some(b) = &bar {
                    b.inc(1);
                }
            })
            .map_err(|e| replay_failure(spec, e))?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        let mut out = stdout.lock();
        let io = CliError::output;
        if json {
            writeln!(out, "{}", report.to_json()).map_err(io)?;
        } else {
            print_report(&mut out, &report, kind).map_err(io)?;
        }
        if stats {
            let flat: serde_json::Map<String, serde_json::Value> = dev
                .memory_stats()
                .into_iter()
                .map(|(k, v)| (k, serde_json::Value::from(v)))
                .collect();
            writeln!(out, "{}", serde_json::Value::Object(flat)).map_err(io)?;
        }
        if let Some(base) = snapshot {
            let path = snapshot_path(base, &trace.name, loaded.len() > 1);
            cachalot::export::write_snapshot(&path, &[dev.snapshot()]).map_err(|e| {
                CliError::failure(format!("writing snapshot {}: {e}", path.display()))
            })?;
            if !json {
                writeln!(out, "  snapshot written to {}", path.display()).map_err(io)?;
            }
        }
    }
    Ok(())
}

/// Runs every operation of `trace` (given as `spec`) once on `dev`, the
/// trace's dense stream `i` on stream slot `i` (one stream each, never
/// folded), leaving the blocks live at the end of the trace allocated;
/// `after_op(op_index, op, address)` runs after each one. Returns the live
/// allocations (address per dense id; 0 when not live). A failing operation
/// is named by its line and text.
pub fn run_ops(
    dev: &DeviceAllocator,
    trace: &Trace,
    spec: &str,
    mut after_op: impl FnMut(usize, &Op, u64),
) -> Result<Vec<u64>, CliError> {
    let n = trace.num_streams.max(1);
    if n > cachalot::MAX_REPLAY_STREAMS {
        return Err(CliError::usage(format!(
            "{spec}: the trace uses {n} streams, more than {}",
            cachalot::MAX_REPLAY_STREAMS
        )));
    }
    let streams: Vec<Stream> = dev
        .streams(n as usize)
        .map_err(|e| replay_failure(spec, ReplayError::whole(trace, e)))?;
    let mut ptr = vec![0u64; trace.num_ids];
    let at = |i: usize, e: Error| replay_failure(spec, ReplayError::at(trace, i, e));
    let range =
        |i: usize, what: &str| at(i, Error::InvalidArgument(format!("{what} out of range")));
    for (i, op) in trace.ops.iter().enumerate() {
        let addr = match *op {
            Op::Alloc { id, size, stream } => {
                let s = *streams
                    .get(stream as usize)
                    .ok_or_else(|| range(i, "stream index"))?;
                let slot = ptr.get_mut(id as usize).ok_or_else(|| range(i, "id"))?;
                *slot = dev.raw_alloc(size, s).map_err(|e| at(i, e))?;
                *slot
            }
            Op::Free { id } => {
                let slot = ptr.get_mut(id as usize).ok_or_else(|| range(i, "id"))?;
                let p = std::mem::take(slot);
                dev.raw_free(p).map_err(|e| at(i, e))?;
                p
            }
        };
        after_op(i, op, addr);
    }
    Ok(ptr)
}

/// Frees what [`run_ops`] left live.
pub fn free_all(dev: &DeviceAllocator, live: Vec<u64>) -> Result<(), CliError> {
    for p in live {
        dev.raw_free(p)
            .map_err(failure("freeing the live blocks"))?;
    }
    Ok(())
}

/// `cachalot summary`: runs the trace's operations once, leaving the blocks
/// still live at the end of the trace allocated (the recorded window's
/// live tensors), prints the summary table, then frees them.
pub fn summary_cmd(trace: &str, opts: &DeviceOpts, abbreviated: bool) -> Result<(), CliError> {
    let kind = backend_kind(opts)?;
    let config = allocator_config(opts)?;
    let spec = trace;
    let trace = load_trace(spec)?;
    let dev = open_device(kind, config)?;
    let live = run_ops(&dev, &trace, spec, |_, _, _| {})?;
    let table = dev.memory_summary(abbreviated);
    free_all(&dev, live)?;
    crate::print_out(&table)
}
