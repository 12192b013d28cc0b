//! The `cachalot` command: replay allocation traces through the caching
//! allocator (as PyTorch's `cca_replay`), print the memory summary, plot
//! memory over time, and export snapshots for PyTorch's viewer.
//!
//! Exit codes (also in `--help`, [`AFTER_HELP`]): 0 success; 1 a failure
//! while running (an allocator or I/O error); 2 bad input (usage or an
//! argument out of range, unreadable, malformed or over-limit trace,
//! unknown or unavailable backend, bad allocator config).
#![forbid(unsafe_code)]

mod capture_sim;
mod fit;
mod plot;
mod raster;
mod run;
mod units;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// An error of the command with its exit code.
#[derive(Debug)]
pub struct CliError {
    /// Process exit code (1 or 2).
    pub code: u8,
    /// The message printed on stderr.
    pub message: String,
}

impl CliError {
    /// Bad input: exit code 2.
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: 2,
            message: message.into(),
        }
    }

    /// A failure while running: exit code 1.
    pub fn failure(message: impl Into<String>) -> Self {
        Self {
            code: 1,
            message: message.into(),
        }
    }

    /// A failed write to stdout: a closed pipe (`cachalot ... | head`) ends
    /// the command quietly with success, any other error is a failure.
    pub fn output(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Self {
                code: 0,
                message: String::new(),
            }
        } else {
            Self::failure(format!("writing output: {e}"))
        }
    }
}

/// Writes `text` to stdout (see [`CliError::output`] for errors).
pub fn print_out(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(CliError::output)
}

/// Most `--passes` of `replay`.
pub const MAX_PASSES: u32 = 10_000;
/// Most timed operations per thread of `threads --ops`.
pub const MAX_BENCH_OPS: u64 = 1_000_000_000;

/// The exit codes and trace limits, shown after `--help` (the numbers are
/// [`cachalot::core::replay::MAX_TRACE_STREAMS`], `MAX_TRACE_OPS` and
/// `MAX_TRACE_LINE_BYTES`; a test checks them).
pub const AFTER_HELP: &str = "\
Examples:
  cachalot replay traces/gpt2_train.trace --backend mock
  cachalot replay traces/gpt2_train.trace --device-memory 24GiB
  cachalot fit traces/gpt2_train.trace
  cachalot plot traces/gpt2_train.trace -o gpt2.png --compare expandable_segments:True

Exit status:
  0  success
  1  a failure while running: an allocator error in a replay (out of memory,
     a size that can never fit; the message names the trace file, line and
     operation; with --device-memory: the trace does not fit), an error
     writing output or a file
  2  bad input: a usage error or an argument out of its range (the message
     names the argument and value), an unreadable or malformed trace (the
     message names the file, line and value), an unknown or unavailable
     backend, a bad allocator config

Trace files: one operation a line, 'a ID SIZE STREAM' or 'f ID' ('#' starts a
comment). IDs and stream numbers may be any 64-bit value. A trace must have
an operation, allocate each ID once and free only an ID allocated and not yet
freed on an earlier line. Limits: 1024 distinct streams (each is a stream of
the device in a replay), 134217728 operations, 65536 bytes a line.";

/// Replay allocation traces through the cachalot caching allocator.
#[derive(Parser, Debug)]
#[command(name = "cachalot", version, about, long_about = None, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options shared by the commands that run a trace.
#[derive(Args, Debug, Clone)]
pub struct DeviceOpts {
    /// Backend: mock, cuda, hip or level-zero (default: $CACHALOT_BACKEND,
    /// else cuda when a GPU is present, else mock). The mock is a simulated
    /// device whose work completes at once, of --device-memory bytes, else
    /// $CACHALOT_MOCK_MEMORY, else an H200's 150,754,820,096.
    #[arg(long)]
    pub backend: Option<String>,
    /// Allocator config string, PyTorch's syntax (e.g.
    /// "max_split_size_mb:256,garbage_collection_threshold:0.8"); default:
    /// $CACHALOT_ALLOC_CONF, then $PYTORCH_CUDA_ALLOC_CONF,
    /// $PYTORCH_HIP_ALLOC_CONF, $PYTORCH_ALLOC_CONF. Keys of another PyTorch
    /// allocator (backend:cudaMallocAsync, pinned_*) are ignored with a warning.
    #[arg(long)]
    pub config: Option<String>,
    /// Will it fit? Run on a simulated device of this size (e.g. 24GiB, 80GB,
    /// 512MiB or bytes; 1MiB..=4TiB; implies the mock backend) and say
    /// whether the trace fits, or which operation fails first with the
    /// out-of-memory report and the smallest device it fits on.
    #[arg(long, value_name = "SIZE", value_parser = units::device_memory)]
    pub device_memory: Option<u64>,
}

/// Examples of `replay`.
const REPLAY_EXAMPLES: &str = "\
Examples:
  cachalot replay traces/gpt2_train.trace --backend mock
  cachalot replay traces/gpt2_train.trace --device-memory 24GiB
  cachalot replay traces/*.trace --json --stats --config placement:pytorch
  cachalot replay traces/gpt2_train.trace --passes 1 --snapshot gpt2.pickle
  grep -v '^#' traces/gpt2_train.trace | cachalot replay - --passes 1";

/// Examples of `summary`.
const SUMMARY_EXAMPLES: &str = "\
Examples:
  cachalot summary traces/gpt2_train.trace --backend mock
  cachalot summary traces/resnet50_train.trace --device-memory 16GiB --abbreviated";

/// Examples of `plot`.
const PLOT_EXAMPLES: &str = "\
Examples:
  cachalot plot traces/side_stream_pipeline.trace -o mem.svg
  cachalot plot traces/gpt2_train.trace -o gpt2.png --device-memory 8GiB
  cachalot plot traces/gpt2_train.trace -o compare.png \\
      --compare placement:pytorch,expandable_segments:True";

/// Examples of `fit`.
const FIT_EXAMPLES: &str = "\
Examples:
  cachalot fit traces/gpt2_train.trace
  cachalot fit traces/resnet50_train.trace --json
  cachalot fit traces/gpt2_train.trace --config max_split_size_mb:256 --passes 1";

/// Examples of `threads`.
const THREADS_EXAMPLES: &str = "\
Examples:
  cachalot threads --backend mock
  cachalot threads --backend cuda --threads 1,8,32 --ops 100000
  cachalot threads --backend cuda --clock monotonic
  cachalot threads --backend cuda --threads 8,16 --stats-thread on";

/// Examples of `capture-sim`.
const CAPTURE_SIM_EXAMPLES: &str = "\
Examples:
  cachalot capture-sim --streams 4 --ops 1000 --reuse cross-stream
  cachalot capture-sim --seed 7 --json --bound
  cachalot capture-sim --seed 7 --emit-pytorch prog.py && python3 prog.py";

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay traces as PyTorch's cca_replay and report peak memory,
    /// device allocations and host time per operation.
    #[command(after_help = REPLAY_EXAMPLES)]
    Replay {
        /// Trace files, `-` for standard input, or synthetic trace names
        /// (hit_1mib, churn_1stream, churn_4streams, bert_serving,
        /// gpt2_generate).
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<String>,
        #[command(flatten)]
        device: DeviceOpts,
        /// Passes over each trace (the first is cold, the median of the
        /// others is the warm figure), 1..=10000.
        #[arg(long, default_value_t = 5,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PASSES)))]
        passes: u32,
        /// One JSON line per trace with cca_replay's fields (and, with
        /// --device-memory, `device_memory` and `fits`).
        #[arg(long)]
        json: bool,
        /// Also print the final memory_stats() (PyTorch's 122 flat keys):
        /// with --json as the `memory_stats` object of the trace's line,
        /// else on a line naming the trace.
        #[arg(long)]
        stats: bool,
        /// Write a snapshot after the replay, with the memory history recorded
        /// during it: a pickle for torch.cuda._memory_viz when OUT ends in
        /// .pickle (or .pkl), else JSON. With several traces the trace name
        /// is added to the file name. The file is created before the replay,
        /// so a bad path fails at once.
        #[arg(long, value_name = "OUT")]
        snapshot: Option<PathBuf>,
    },
    /// Replay a trace once, without freeing the blocks still live at its
    /// end, and print the torch.cuda.memory_summary() table.
    #[command(after_help = SUMMARY_EXAMPLES)]
    Summary {
        /// Trace file, `-` for standard input, or synthetic trace name.
        trace: String,
        #[command(flatten)]
        device: DeviceOpts,
        /// Leave out the per-pool lines.
        #[arg(long)]
        abbreviated: bool,
    },
    /// Plot allocated and reserved bytes over the operations of a trace
    /// (total and per stream) as SVG or PNG (by the extension of -o).
    #[command(after_help = PLOT_EXAMPLES)]
    Plot {
        /// Trace file, `-` for standard input, or synthetic trace name.
        trace: String,
        #[command(flatten)]
        device: DeviceOpts,
        /// Output file (.svg or .png).
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// Image width in pixels, 200..=10000.
        #[arg(long, default_value_t = 1200,
              value_parser = clap::value_parser!(u32).range(200..=10_000))]
        width: u32,
        /// Image height in pixels, 150..=10000.
        #[arg(long, default_value_t = 600,
              value_parser = clap::value_parser!(u32).range(150..=10_000))]
        height: u32,
        /// Overlay the reserved bytes of the trace under this allocator
        /// config too (e.g. "placement:pytorch,expandable_segments:True"),
        /// against the --config one (default: the environment's, else the
        /// default config); up to 4 times. Per-stream lines are left out.
        #[arg(long, value_name = "CONFIG")]
        compare: Vec<String>,
    },
    /// Will it fit? The smallest simulated device on which the trace
    /// replays, for each policy: PyTorch's default (placement:pytorch),
    /// PyTorch's expandable segments, cachalot with fixed segments,
    /// cachalot's default (expandable segments with page recycling) (a
    /// bisection in 2 MiB steps, the allocator's segment granularity, so
    /// the answer is exact).
    #[command(after_help = FIT_EXAMPLES)]
    Fit {
        /// Trace file, `-` for standard input, or synthetic trace name.
        trace: String,
        /// Allocator config every policy starts from (the policy's keys
        /// override it); default: $CACHALOT_ALLOC_CONF, then PyTorch's
        /// variables.
        #[arg(long)]
        config: Option<String>,
        /// Passes over the trace on each probed device, 1..=10000 (as
        /// `replay`: a training step runs again and again).
        #[arg(long, default_value_t = 5,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PASSES)))]
        passes: u32,
        /// One JSON line per policy.
        #[arg(long)]
        json: bool,
    },
    /// Capture a random multi-stream program into a graph on the simulated
    /// device and report its memory, reuse, races and capture time.
    #[command(after_help = CAPTURE_SIM_EXAMPLES)]
    CaptureSim(capture_sim::CaptureSimArgs),
    /// The multi-thread benchmark of PyTorch's cca_threads.cpp: T threads,
    /// each allocating and freeing on its own stream; one JSON line per T.
    #[command(after_help = THREADS_EXAMPLES)]
    Threads {
        #[command(flatten)]
        device: DeviceOpts,
        /// Thread counts to run, each 1..=256.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16",
              value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
                  .range(1..=cachalot::MAX_BENCH_THREADS as u64))]
        threads: Vec<usize>,
        /// Timed operations per thread, 1..=1000000000.
        #[arg(long, default_value_t = 200_000,
              value_parser = clap::value_parser!(u64).range(1..=MAX_BENCH_OPS))]
        ops: u64,
        /// The clock of the stat logs' time stamps: tsc (the invariant TSC
        /// behind an lfence, where the machine has one the kernel keeps as
        /// its clock; else the monotonic clock) or monotonic. Default: tsc.
        /// Each JSON line names the clock used.
        #[arg(long, value_enum, default_value_t = run::Clock::Tsc)]
        clock: run::Clock,
        /// Who sums the stat logs' flushed windows: off (the allocating
        /// thread whose log filled, the default) or on (a process-wide
        /// stats thread). Each JSON line says which.
        #[arg(long, value_enum, default_value_t = run::OnOff::Off)]
        stats_thread: run::OnOff,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.command {
        Command::Replay {
            traces,
            device,
            passes,
            json,
            stats,
            snapshot,
        } => run::replay_cmd(
            &traces,
            &device,
            passes as usize,
            json,
            stats,
            snapshot.as_deref(),
        ),
        Command::Summary {
            trace,
            device,
            abbreviated,
        } => run::summary_cmd(&trace, &device, abbreviated),
        Command::Plot {
            trace,
            device,
            output,
            width,
            height,
            compare,
        } => plot::plot_cmd(&trace, &device, &output, (width, height), &compare),
        Command::Fit {
            trace,
            config,
            passes,
            json,
        } => fit::fit_cmd(
            &trace,
            config.as_deref(),
            passes as usize,
            fit::DEFAULT_GRANULARITY,
            json,
        ),
        Command::CaptureSim(args) => capture_sim::run(&args),
        Command::Threads {
            device,
            threads,
            ops,
            clock,
            stats_thread,
        } => run::threads_cmd(&device, &threads, ops, clock, stats_thread),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if !e.message.is_empty() {
                eprintln!("cachalot: error: {}", e.message);
            }
            ExitCode::from(e.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot::core::replay::{MAX_TRACE_LINE_BYTES, MAX_TRACE_OPS, MAX_TRACE_STREAMS};

    /// The limits `--help` states are the parser's.
    #[test]
    fn after_help_states_the_trace_limits() {
        for n in [
            MAX_TRACE_STREAMS as usize,
            MAX_TRACE_OPS,
            MAX_TRACE_LINE_BYTES,
        ] {
            let text = format!(" {n} ");
            assert!(
                AFTER_HELP.replace('\n', " ").contains(&text),
                "{n} not in --help"
            );
        }
        assert_eq!(cachalot::MAX_BENCH_THREADS, 256);
    }
}
