//! `cachalot plot`: allocated and reserved bytes over the operations of a
//! trace, in total and per stream, or (`--compare`) the reserved bytes of
//! several allocator configs over one trace, as a hand-written SVG or a PNG
//! drawn by [`crate::raster`]. With a chosen device size
//! (`--device-memory`) the device's capacity is drawn too, and a trace
//! that does not fit ends at the failing operation, marked.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use cachalot::core::replay::Op;
use cachalot::{AllocatorConfig, DeviceAllocator, ReplayError};

use crate::raster::{Canvas, Dir, Rgb};
use crate::run::{
    NoFit, OpsError, Setup, allocator_config, config_label, free_all, is_no_fit, load_trace,
    open_device, report_no_fit, run_ops,
};
use crate::{CliError, DeviceOpts, units};

mod render;

use render::{render_png, render_svg};

/// One line of the plot: a value after every operation.
struct Series {
    name: String,
    color: Rgb,
    dashed: bool,
    values: Vec<u64>,
}

/// Everything to draw.
struct Figure {
    title: String,
    ops: usize,
    series: Vec<Series>,
    /// The device's capacity, drawn as a line (a chosen device size).
    device_memory: Option<u64>,
    /// Operations at which a series ran out of memory, with its colour.
    ooms: Vec<(usize, Rgb)>,
}

const PALETTE: [Rgb; 8] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (23, 190, 207),
];

/// Colour of the device-capacity line and the out-of-memory markers.
const LIMIT: Rgb = (200, 0, 0);

/// Most streams drawn with their own lines; a trace with more is drawn in
/// total only (a line per stream would be unreadable, and its samples cost
/// 16 bytes per operation and stream).
pub const MAX_PLOT_STREAMS: usize = 16;

/// Most `--compare` configs.
pub const MAX_COMPARE: usize = 4;

/// What one run of the trace gave.
struct Run {
    reserved: Vec<u64>,
    allocated: Vec<u64>,
    /// Per stream: (trace stream number, reserved, allocated).
    streams: Vec<(u64, Vec<u64>, Vec<u64>)>,
    /// The operation that failed, and how.
    failed: Option<ReplayError>,
}

/// Runs the trace once and samples the statistics after every operation
/// (per stream too when `per_stream_wanted`). An allocator error stops the
/// run; it is returned with the samples up to it.
fn collect(
    dev: &DeviceAllocator,
    trace: &cachalot::Trace,
    spec: &str,
    per_stream_wanted: bool,
) -> Result<Run, CliError> {
    let nstreams = (trace.num_streams.max(1) as usize).min(cachalot::MAX_REPLAY_STREAMS as usize);
    let streams = dev
        .streams(nstreams)
        .map_err(|e| CliError::failure(format!("creating streams: {e}")))?;
    // Segment stream (as the snapshot numbers it) → stream index.
    let handle_index: HashMap<i64, usize> = streams
        .iter()
        .enumerate()
        .filter_map(|(i, s)| dev.stream_handle(*s).ok().map(|h| (h as i64, i)))
        .collect();
    let n = trace.ops.len();
    let mut allocated = Vec::with_capacity(n);
    let mut reserved = Vec::with_capacity(n);
    let per_stream = per_stream_wanted && (2..=MAX_PLOT_STREAMS).contains(&nstreams);
    if per_stream_wanted && nstreams > MAX_PLOT_STREAMS {
        eprintln!(
            "cachalot: note: {spec} uses {nstreams} streams; per-stream lines are drawn for at most {MAX_PLOT_STREAMS}"
        );
    }
    let mut s_alloc = vec![Vec::new(); if per_stream { nstreams } else { 0 }];
    let mut s_res = vec![Vec::new(); if per_stream { nstreams } else { 0 }];
    let mut cur_alloc = vec![0u64; nstreams];
    let mut cur_res = vec![0u64; nstreams];
    let mut id_info: Vec<(usize, u64)> = vec![(0, 0); if per_stream { trace.num_ids } else { 0 }];
    let mut last_device_ops = (0i64, 0i64);
    let r = run_ops(dev, trace, spec, |_, op, addr| {
        let st = dev.stats();
        allocated.push(st.allocated_bytes.all().current.max(0) as u64);
        reserved.push(st.reserved_bytes.all().current.max(0) as u64);
        if !per_stream {
            return;
        }
        match *op {
            Op::Alloc { id, stream, .. } => {
                // run_ops checked the stream and id against their tables
                let s = (stream as usize).min(nstreams - 1);
                let size = dev.block_size(addr).unwrap_or(0);
                if let Some(info) = id_info.get_mut(id as usize) {
                    *info = (s, size);
                }
                cur_alloc[s] = cur_alloc[s].saturating_add(size);
            }
            Op::Free { id } => {
                let (s, size) = id_info
                    .get_mut(id as usize)
                    .map(std::mem::take)
                    .unwrap_or_default();
                cur_alloc[s] = cur_alloc[s].saturating_sub(size);
            }
        }
        let device_ops = (st.num_device_alloc, st.num_device_free);
        if device_ops != last_device_ops {
            last_device_ops = device_ops;
            cur_res.iter_mut().for_each(|r| *r = 0);
            for seg in dev.snapshot().segments {
                let h = cachalot::export::stream_number(&seg.stream);
                if let Some(&i) = handle_index.get(&h) {
                    cur_res[i] += seg.total_size;
                }
            }
        }
        for i in 0..nstreams {
            s_alloc[i].push(cur_alloc[i]);
            s_res[i].push(cur_res[i]);
        }
    });
    let failed = match r {
        Ok(live) => {
            free_all(dev, live)?;
            None
        }
        Err(OpsError::Replay(e)) => Some(e),
        Err(e) => return Err(e.into_cli(spec)),
    };
    let streams = s_res
        .into_iter()
        .zip(s_alloc)
        .enumerate()
        // the trace's own stream number
        .map(|(i, (r, a))| (trace.stream_value(i as u32), r, a))
        .collect();
    Ok(Run {
        reserved,
        allocated,
        streams,
        failed,
    })
}

/// `peak 7.53 GiB` of a series.
fn peak_label(values: &[u64]) -> String {
    format!(
        "peak {}",
        units::human(values.iter().copied().max().unwrap_or(0))
    )
}

/// `cachalot plot`.
pub fn plot_cmd(
    trace: &str,
    opts: &DeviceOpts,
    output: &Path,
    (width, height): (u32, u32),
    compare: &[String],
) -> Result<(), CliError> {
    let ext = output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let png = match ext.as_deref() {
        Some("svg") => false,
        Some("png") => true,
        _ => {
            return Err(CliError::usage(format!(
                "{}: the output must end in .svg or .png",
                output.display()
            )));
        }
    };
    // clap bounds both; checked again for a direct caller
    if !(200..=10_000).contains(&width) {
        return Err(CliError::usage(format!(
            "--width {width} is outside 200..=10000"
        )));
    }
    if !(150..=10_000).contains(&height) {
        return Err(CliError::usage(format!(
            "--height {height} is outside 150..=10000"
        )));
    }
    if compare.len() > MAX_COMPARE {
        return Err(CliError::usage(format!(
            "--compare: at most {MAX_COMPARE} configs, got {}",
            compare.len()
        )));
    }
    let setup = Setup::new(opts)?;
    // every config is checked before the trace is read or run
    let mut configs: Vec<AllocatorConfig> = vec![setup.config.clone()];
    for c in compare {
        configs.push(
            allocator_config(Some(c))
                .map_err(|e| CliError::usage(format!("--compare: {}", e.message)))?,
        );
    }
    let spec = trace;
    let trace = load_trace(spec)?;
    let mut fig = Figure {
        title: String::new(),
        ops: trace.ops.len(),
        series: Vec::new(),
        device_memory: setup.sized.then_some(setup.mock_memory),
        ooms: Vec::new(),
    };
    let mut failures: Vec<(AllocatorConfig, ReplayError)> = Vec::new();
    if compare.is_empty() {
        let dev = setup.open()?;
        let run = collect(&dev, &trace, spec, true)?;
        fig.title = format!(
            "{}: memory over {} operations ({} backend{})",
            trace.name,
            units::group(trace.ops.len() as u64),
            dev.backend_kind(),
            fig.device_memory
                .map(|m| format!(", {} device", units::human(m)))
                .unwrap_or_default()
        );
        if run.failed.is_some() {
            fig.ooms.push((run.reserved.len(), LIMIT));
        }
        fig.series.push(Series {
            name: format!("reserved, {}", peak_label(&run.reserved)),
            color: PALETTE[0],
            dashed: false,
            values: run.reserved,
        });
        fig.series.push(Series {
            name: format!("allocated, {}", peak_label(&run.allocated)),
            color: PALETTE[1],
            dashed: false,
            values: run.allocated,
        });
        for (i, (stream, r, a)) in run.streams.into_iter().enumerate() {
            let color = PALETTE[(2 + i) % PALETTE.len()];
            fig.series.push(Series {
                name: format!("reserved, stream {stream}"),
                color,
                dashed: false,
                values: r,
            });
            fig.series.push(Series {
                name: format!("allocated, stream {stream}"),
                color,
                dashed: true,
                values: a,
            });
        }
        if let Some(e) = run.failed {
            failures.push((setup.config.clone(), e));
        }
    } else {
        fig.title = format!(
            "{}: reserved memory of {} configs over {} operations ({} backend{})",
            trace.name,
            configs.len(),
            units::group(trace.ops.len() as u64),
            setup.kind,
            fig.device_memory
                .map(|m| format!(", {} device", units::human(m)))
                .unwrap_or_default()
        );
        let mut allocated: Vec<(String, Vec<u64>)> = Vec::new();
        for (i, c) in configs.iter().enumerate() {
            let dev = open_device(setup.kind, c.clone(), setup.mock_memory)?;
            let run = collect(&dev, &trace, spec, false)?;
            let color = PALETTE[[0, 3, 2, 4, 5][i % 5]];
            if run.failed.is_some() {
                fig.ooms.push((run.reserved.len(), color));
            }
            fig.series.push(Series {
                name: format!(
                    "reserved, {}: {}{}",
                    config_label(c),
                    peak_label(&run.reserved),
                    if run.failed.is_some() {
                        ", out of memory"
                    } else {
                        ""
                    }
                ),
                color,
                dashed: false,
                values: run.reserved,
            });
            allocated.push((config_label(c), run.allocated));
            if let Some(e) = run.failed {
                failures.push((c.clone(), e));
            }
        }
        // allocated bytes are the trace's own unless rounding differs
        if allocated.windows(2).all(|w| w[0].1 == w[1].1) {
            let (_, values) = allocated.swap_remove(0);
            fig.series.push(Series {
                name: format!("allocated, {}", peak_label(&values)),
                color: PALETTE[1],
                dashed: true,
                values,
            });
        } else {
            for (i, (label, values)) in allocated.into_iter().enumerate() {
                fig.series.push(Series {
                    name: format!("allocated, {label}: {}", peak_label(&values)),
                    color: fig.series[i].color,
                    dashed: true,
                    values,
                });
            }
        }
    }
    let bytes = if png {
        render_png(&fig, width, height)?
    } else {
        render_svg(&fig, width, height).into_bytes()
    };
    std::fs::write(output, bytes)
        .map_err(|e| CliError::failure(format!("writing {}: {e}", output.display())))?;
    crate::print_out(&format!("wrote {}\n", output.display()))?;
    // the plot shows where a run stopped; the command still fails
    if let Some((config, e)) = failures.into_iter().next() {
        if setup.sized && is_no_fit(&e.source) {
            let s = Setup { config, ..setup };
            let nf = NoFit {
                spec,
                trace: &trace,
                error: e,
                pass: None,
                passes: 1,
            };
            return Err(report_no_fit(&s, nf, false)?);
        }
        return Err(crate::run::replay_failure(spec, e));
    }
    Ok(())
}
