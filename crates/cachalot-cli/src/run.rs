//! Loading traces, opening the device, and the `replay` and `summary` commands.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cachalot::core::config::ConfigWarning;
use cachalot::core::replay::Op;
use cachalot::{
    AllocatorConfig, BackendKind, DeviceAllocator, Error, H200_TOTAL_MEMORY, HistoryConfig,
    MockSettings, ReplayError, ReplayReport, Stream, Trace,
};

use crate::{CliError, DeviceOpts, print_out, units};

mod threads;

pub use threads::{Clock, OnOff, threads_cmd};

/// Total operations (over all passes) from which a progress bar is shown.
const PROGRESS_MIN_OPS: usize = 500_000;

/// A failed replay of the trace given as `spec` (its file path), exit
/// code 1: `replaying FILE:LINE: 'OP': error`.
pub fn replay_failure(spec: &str, mut e: ReplayError) -> CliError {
    e.trace = spec.to_string();
    CliError::failure(format!("replaying {e}"))
}

/// The name standing for standard input among the traces.
pub const STDIN: &str = "-";

/// A synthetic trace by name, `-` for standard input, else the trace file
/// at `spec`; a malformed or over-limit trace is a usage error naming the
/// file, line and value.
pub fn load_trace(spec: &str) -> Result<Trace, CliError> {
    if spec == STDIN {
        let mut t = Trace::from_reader(
            "<stdin>",
            std::io::stdin().lock(),
            &cachalot::TraceLimits::default(),
        )
        .map_err(|e| CliError::usage(e.to_string()))?;
        t.name = "stdin".to_string();
        return Ok(t);
    }
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

/// Loads every trace of `specs` before any work, so that a bad one fails
/// first; standard input (`-`) may be named once.
pub fn load_traces(specs: &[String]) -> Result<Vec<Trace>, CliError> {
    if specs.iter().filter(|s| *s == STDIN).count() > 1 {
        return Err(CliError::usage(
            "'-' (standard input) may be named only once among the traces",
        ));
    }
    specs.iter().map(|t| load_trace(t)).collect()
}

/// The backend named by `--backend`, else the detected one.
pub fn backend_kind(opts: &DeviceOpts) -> Result<BackendKind, CliError> {
    match &opts.backend {
        Some(b) => b.parse().map_err(|e: Error| CliError::usage(e.to_string())),
        None => BackendKind::detect().map_err(|e| CliError::usage(e.to_string())),
    }
}

/// Prints the config's warnings (keys of another PyTorch allocator that
/// were ignored) to stderr as one line.
pub fn print_config_warnings(warnings: &[ConfigWarning]) {
    if warnings.is_empty() {
        return;
    }
    let list: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    eprintln!("cachalot: warning: {}", list.join("; "));
}

/// The allocator config from `--config`, else from the environment
/// (`CACHALOT_ALLOC_CONF`, then PyTorch's variables); the keys of another
/// PyTorch allocator it ignores are reported on stderr, once.
pub fn allocator_config(config: Option<&str>) -> Result<AllocatorConfig, CliError> {
    let (c, w) = match config {
        Some(c) => AllocatorConfig::parse_with_warnings(c),
        None => AllocatorConfig::from_env_with_warnings(),
    }
    .map_err(|e| CliError::usage(e.to_string()))?;
    print_config_warnings(&w);
    Ok(c)
}

/// Capacity of the mock device: `--device-memory`, else
/// `CACHALOT_MOCK_MEMORY`, else an H200's. The second value says whether
/// the size was chosen (then the commands answer "does it fit?").
pub fn mock_memory(opts: &DeviceOpts) -> Result<(u64, bool), CliError> {
    if let Some(b) = opts.device_memory {
        return Ok((b, true));
    }
    let from_env = std::env::var_os(cachalot::MOCK_MEMORY_ENV).is_some();
    let s = MockSettings::from_env().map_err(|e| CliError::usage(e.to_string()))?;
    if from_env && s.total_memory < crate::units::MIN_DEVICE_MEMORY {
        return Err(CliError::usage(format!(
            "{}={}: the mock device needs at least {}",
            cachalot::MOCK_MEMORY_ENV,
            s.total_memory,
            crate::units::human(crate::units::MIN_DEVICE_MEMORY)
        )));
    }
    Ok((s.total_memory, from_env))
}

/// What a command runs on: the backend, the allocator config and, on the
/// mock, the device's capacity.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The backend.
    pub kind: BackendKind,
    /// The allocator config.
    pub config: AllocatorConfig,
    /// Capacity of the mock device in bytes.
    pub mock_memory: u64,
    /// Whether the capacity was chosen (`--device-memory` or
    /// `CACHALOT_MOCK_MEMORY`): the commands then say whether the trace fits.
    pub sized: bool,
}

impl Setup {
    /// The backend, config and device size of `opts`; `--device-memory`
    /// means the mock (with another `--backend` it is a usage error).
    pub fn new(opts: &DeviceOpts) -> Result<Self, CliError> {
        let kind = if opts.device_memory.is_some() {
            match &opts.backend {
                Some(b) if b.parse::<BackendKind>().ok() != Some(BackendKind::Mock) => {
                    return Err(CliError::usage(format!(
                        "--device-memory sizes the simulated device: it runs on the mock \
                         backend, not on '{}' (leave --backend out or say --backend mock)",
                        cachalot::core::config::echo(b)
                    )));
                }
                _ => BackendKind::Mock,
            }
        } else {
            backend_kind(opts)?
        };
        let config = allocator_config(opts.config.as_deref())?;
        let (mock_memory, sized) = if kind == BackendKind::Mock {
            mock_memory(opts)?
        } else {
            (H200_TOTAL_MEMORY, false)
        };
        Ok(Self {
            kind,
            config,
            mock_memory,
            sized,
        })
    }

    /// A fresh allocator over device 0 (see [`open_device`]).
    pub fn open(&self) -> Result<Arc<DeviceAllocator>, CliError> {
        open_device(self.kind, self.config.clone(), self.mock_memory)
    }
}

/// A fresh allocator over device 0 of the chosen backend; the mock is a
/// device of `mock_memory` bytes whose work completes at once, without
/// race checking.
pub fn open_device(
    kind: BackendKind,
    config: AllocatorConfig,
    mock_memory: u64,
) -> Result<Arc<DeviceAllocator>, CliError> {
    let r = match kind {
        BackendKind::Mock => {
            let backend = cachalot::mock::MockConfig::new(mock_memory)
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
    units::bytes(b.max(0) as u64)
}

fn print_report(out: &mut impl Write, r: &ReplayReport, kind: BackendKind) -> std::io::Result<()> {
    let ratio = if r.peak_allocated > 0 {
        r.peak_reserved as f64 / r.peak_allocated as f64
    } else {
        0.0
    };
    writeln!(
        out,
        "trace {} ({kind} backend, {} pass{})",
        r.trace,
        r.passes,
        if r.passes == 1 { "" } else { "es" }
    )?;
    let rows: [(&str, String); 10] = [
        ("ops per pass", units::group(r.ops as u64)),
        ("peak reserved", fmt_bytes(r.peak_reserved)),
        ("peak allocated", fmt_bytes(r.peak_allocated)),
        ("reserved/allocated", format!("{ratio:.3}")),
        ("device allocs (cold)", units::group_i(r.device_allocs_cold)),
        ("device allocs (all)", units::group_i(r.device_allocs_all)),
        ("device frees (all)", units::group_i(r.device_frees_all)),
        ("alloc retries", units::group_i(r.alloc_retries)),
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

/// Whether `e` says the trace does not fit on the device: out of memory
/// now, or a request the device can never hold.
pub fn is_no_fit(e: &Error) -> bool {
    matches!(e, Error::OutOfMemory(_) | Error::NeverFits { .. })
}

/// The allocator's error as indented lines, one sentence each (the OOM
/// report is one long line).
pub fn indented_error(e: &Error) -> String {
    let text = e.to_string();
    let mut out = String::new();
    for sentence in text.split_inclusive(". ") {
        out.push_str("    ");
        out.push_str(sentence.trim_end());
        out.push('\n');
    }
    out
}

/// The replay's JSON line: cca_replay's fields in its order, then `extra`.
fn report_json(report: &ReplayReport, extra: &[(&str, serde_json::Value)]) -> String {
    let mut line = report.to_json();
    if !extra.is_empty() && line.ends_with('}') {
        line.pop();
        for (k, v) in extra {
            line.push_str(&format!(",{}:{v}", serde_json::Value::from(*k)));
        }
        line.push('}');
    }
    line
}

/// `memory_stats()` as a JSON object (PyTorch's 122 flat keys, sorted).
fn stats_json(dev: &DeviceAllocator) -> serde_json::Value {
    serde_json::Value::Object(
        dev.memory_stats()
            .into_iter()
            .map(|(k, v)| (k, serde_json::Value::from(v)))
            .collect(),
    )
}

/// Where a trace failed to fit: the failing operation and pass.
pub struct NoFit<'a> {
    /// The trace as named on the command line.
    pub spec: &'a str,
    /// The loaded trace.
    pub trace: &'a Trace,
    /// The allocator's error at the failing operation.
    pub error: ReplayError,
    /// The 1-based pass it failed in, when the command runs passes.
    pub pass: Option<usize>,
    /// Passes the command runs (for the smallest-device bisection).
    pub passes: usize,
}

/// Prints the answer "does not fit" for `setup`'s device (the first
/// failing operation, the OOM report and the smallest device this config
/// fits on) on stdout, as text or one JSON line; returns the error the
/// command exits with (code 1).
pub fn report_no_fit(setup: &Setup, nf: NoFit<'_>, json: bool) -> Result<CliError, CliError> {
    let NoFit {
        spec,
        trace,
        error,
        pass,
        passes,
    } = nf;
    let smallest = crate::fit::smallest_device(
        trace,
        &setup.config,
        passes,
        crate::fit::DEFAULT_GRANULARITY,
    )?;
    let size = setup.mock_memory;
    let mut where_ = String::new();
    if let Some(line) = error.line {
        where_.push_str(&format!("{spec}:{line}"));
    } else {
        where_.push_str(spec);
    }
    if let Some(op) = &error.op {
        where_.push_str(&format!(": '{op}'"));
    }
    if json {
        let mut j = serde_json::json!({
            "trace": trace.name,
            "device_memory": size,
            "fits": false,
            "failed_line": error.line,
            "failed_op": error.op,
            "failed_op_index": error.op_index,
            "failed_pass": pass,
            "error": error.source.to_string(),
        });
        j["smallest_device"] = smallest.fit().map(|f| f.smallest_device).into();
        print_out(&format!("{j}\n"))?;
    } else {
        let mut out = format!(
            "trace {} does not fit on {} ({} B) ({} backend, config: {})\n",
            trace.name,
            units::human(size),
            units::group(size),
            setup.kind,
            config_label(&setup.config)
        );
        let mut at = where_.clone();
        if let Some(i) = error.op_index {
            at.push_str(&format!(" (operation {}", units::group(i as u64 + 1)));
            if let Some(p) = pass {
                at.push_str(&format!(", pass {p}"));
            }
            at.push(')');
        }
        out.push_str(&format!("  first failing operation: {at}\n"));
        out.push_str("  allocator report:\n");
        out.push_str(&indented_error(&error.source));
        match &smallest {
            crate::fit::Answer::Fits(f) => out.push_str(&format!(
                "  smallest device it fits on with this config: {} ({} B, bisected in {} steps)\n",
                units::human(f.smallest_device),
                units::group(f.smallest_device),
                units::human(crate::fit::DEFAULT_GRANULARITY)
            )),
            crate::fit::Answer::Never { address_space } => out.push_str(&format!(
                "  it fits on no device up to {}{}\n",
                units::human(crate::fit::UNCONSTRAINED),
                if *address_space {
                    " (on the larger devices address space runs out first)"
                } else {
                    ""
                }
            )),
        }
        out.push_str(&format!("  compare the policies: cachalot fit {spec}\n"));
        print_out(&out)?;
    }
    Ok(CliError::failure(format!(
        "{where_}: the trace does not fit on {} ({})",
        units::human(size),
        match *error.source {
            Error::NeverFits { .. } => "a request larger than the device",
            _ => "out of memory",
        }
    )))
}

/// The config as the reports name it: its string, or `default`.
pub fn config_label(c: &AllocatorConfig) -> String {
    if c.last_config_string.trim().is_empty() {
        "default".to_string()
    } else {
        c.last_config_string.clone()
    }
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
    // clap bounds it; checked again for a direct caller (0 is not 1)
    if !(1..=crate::MAX_PASSES as usize).contains(&passes) {
        return Err(CliError::usage(format!(
            "--passes {passes} is outside 1..={}",
            crate::MAX_PASSES
        )));
    }
    let setup = Setup::new(opts)?;
    let loaded = load_traces(traces)?;
    // Create every snapshot file first: a bad path fails before any replay.
    let mut files: Vec<Option<(PathBuf, std::fs::File)>> = Vec::new();
    if let Some(base) = snapshot {
        for t in &loaded {
            let path = snapshot_path(base, &t.name, loaded.len() > 1);
            let f = std::fs::File::create(&path).map_err(|e| {
                CliError::usage(format!("--snapshot: cannot create {}: {e}", path.display()))
            })?;
            files.push(Some((path, f)));
        }
    }
    let r = replay_all(&setup, traces, &loaded, passes, json, stats, &mut files);
    // a failed replay leaves no empty snapshot file behind
    for (path, f) in files.into_iter().flatten() {
        drop(f);
        let _ = std::fs::remove_file(path);
    }
    r
}

fn replay_all(
    setup: &Setup,
    specs: &[String],
    loaded: &[Trace],
    passes: usize,
    json: bool,
    stats: bool,
    files: &mut [Option<(PathBuf, std::fs::File)>],
) -> Result<(), CliError> {
    let io = CliError::output;
    for (i, (spec, trace)) in specs.iter().zip(loaded).enumerate() {
        let dev = setup.open()?;
        // taken once written: what is left is removed on an error
        if files.get(i).is_some_and(Option::is_some) {
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
        let mut done = 0usize;
        let result = dev.replay(trace, passes, |_| {
            done += 1;
            if let Some(b) = &bar {
                b.inc(1);
            }
        });
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        let report = match result {
            Ok(r) => r,
            Err(e) if setup.sized && is_no_fit(&e.source) => {
                let nf = NoFit {
                    spec,
                    trace,
                    error: e,
                    pass: Some(done + 1),
                    passes,
                };
                return Err(report_no_fit(setup, nf, json)?);
            }
            Err(e) => return Err(replay_failure(spec, e)),
        };
        let mut text = String::new();
        if json {
            let mut extra = Vec::new();
            if setup.sized {
                extra.push(("device_memory", setup.mock_memory.into()));
                extra.push(("fits", true.into()));
            }
            if stats {
                extra.push(("memory_stats", stats_json(&dev)));
            }
            text.push_str(&report_json(&report, &extra));
            text.push('\n');
        } else {
            let mut buf = Vec::new();
            print_report(&mut buf, &report, setup.kind).map_err(io)?;
            text.push_str(&String::from_utf8_lossy(&buf));
            if setup.sized {
                let share = 100.0 * report.peak_reserved.max(0) as f64 / setup.mock_memory as f64;
                text.push_str(&format!(
                    "  fits on {} ({} B): peak reserved is {share:.1}% of the device\n",
                    units::human(setup.mock_memory),
                    units::group(setup.mock_memory)
                ));
            }
            if stats {
                text.push_str(&format!(
                    "  memory_stats of {}: {}\n",
                    trace.name,
                    stats_json(&dev)
                ));
            }
        }
        if let Some((path, mut f)) = files.get_mut(i).and_then(Option::take) {
            let pickle = cachalot::export::is_pickle_path(&path);
            cachalot::export::write_snapshot_to(&mut f, &[dev.snapshot()], pickle)
                .and_then(|()| f.flush())
                .map_err(|e| {
                    CliError::failure(format!("writing snapshot {}: {e}", path.display()))
                })?;
            if !json {
                text.push_str(&format!("  snapshot written to {}\n", path.display()));
            }
        }
        print_out(&text)?;
    }
    Ok(())
}

/// Why [`run_ops`] stopped.
pub enum OpsError {
    /// Bad input or another failure, ready to print.
    Cli(CliError),
    /// An operation failed in the allocator.
    Replay(ReplayError),
}

impl OpsError {
    /// The error as the command prints it (`spec` names the trace).
    pub fn into_cli(self, spec: &str) -> CliError {
        match self {
            OpsError::Cli(e) => e,
            OpsError::Replay(e) => replay_failure(spec, e),
        }
    }
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
) -> Result<Vec<u64>, OpsError> {
    let n = trace.num_streams.max(1);
    if n > cachalot::MAX_REPLAY_STREAMS {
        return Err(OpsError::Cli(CliError::usage(format!(
            "{spec}: the trace uses {n} streams, more than {}",
            cachalot::MAX_REPLAY_STREAMS
        ))));
    }
    let streams: Vec<Stream> = dev
        .streams(n as usize)
        .map_err(|e| OpsError::Replay(ReplayError::whole(trace, e)))?;
    let mut ptr = vec![0u64; trace.num_ids];
    let at = |i: usize, e: Error| OpsError::Replay(ReplayError::at(trace, i, e));
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
    for p in live.into_iter().filter(|&p| p != 0) {
        dev.raw_free(p)
            .map_err(failure("freeing the live blocks"))?;
    }
    Ok(())
}

/// `cachalot summary`: runs the trace's operations once, leaving the blocks
/// still live at the end of the trace allocated (the recorded window's
/// live tensors), prints the summary table, then frees them.
pub fn summary_cmd(trace: &str, opts: &DeviceOpts, abbreviated: bool) -> Result<(), CliError> {
    let setup = Setup::new(opts)?;
    let spec = trace;
    let trace = load_trace(spec)?;
    let dev = setup.open()?;
    let live = match run_ops(&dev, &trace, spec, |_, _, _| {}) {
        Ok(live) => live,
        Err(OpsError::Replay(e)) if setup.sized && is_no_fit(&e.source) => {
            let nf = NoFit {
                spec,
                trace: &trace,
                error: e,
                pass: None,
                passes: 1,
            };
            return Err(report_no_fit(&setup, nf, false)?);
        }
        Err(e) => return Err(e.into_cli(spec)),
    };
    let mut table = dev.memory_summary(abbreviated);
    free_all(&dev, live)?;
    if setup.sized {
        let peak = dev.stats().reserved_bytes.all().peak.max(0) as u64;
        table.push_str(&format!(
            "fits on {} ({} B): peak reserved {} is {:.1}% of the device\n",
            units::human(setup.mock_memory),
            units::group(setup.mock_memory),
            units::bytes(peak),
            100.0 * peak as f64 / setup.mock_memory as f64
        ));
    }
    crate::print_out(&table)
}
