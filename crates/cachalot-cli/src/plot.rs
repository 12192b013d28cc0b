//! `cachalot plot`: allocated and reserved bytes over the operations of a
//! trace, in total and per stream, as a hand-written SVG or a PNG drawn by
//! [`crate::raster`].

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use cachalot::DeviceAllocator;
use cachalot::core::replay::Op;

use crate::raster::{Canvas, Rgb};
use crate::run::{allocator_config, backend_kind, free_all, load_trace, open_device, run_ops};
use crate::{CliError, DeviceOpts};

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

/// Most streams drawn with their own lines; a trace with more is drawn in
/// total only (a line per stream would be unreadable, and its samples cost
/// 16 bytes per operation and stream).
pub const MAX_PLOT_STREAMS: usize = 16;

/// Runs the trace once and samples the statistics after every operation.
fn collect(
    dev: &DeviceAllocator,
    trace: &cachalot::Trace,
    spec: &str,
) -> Result<(Figure, Vec<u64>), CliError> {
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
    let per_stream = (2..=MAX_PLOT_STREAMS).contains(&nstreams);
    if nstreams > MAX_PLOT_STREAMS {
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
    let live = run_ops(dev, trace, spec, |_, op, addr| {
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
    })?;
    let mut series = vec![
        Series {
            name: "reserved".into(),
            color: PALETTE[0],
            dashed: false,
            values: reserved,
        },
        Series {
            name: "allocated".into(),
            color: PALETTE[1],
            dashed: false,
            values: allocated,
        },
    ];
    for (i, (a, r)) in s_alloc.into_iter().zip(s_res).enumerate() {
        let color = PALETTE[(2 + i) % PALETTE.len()];
        // the trace's own stream number
        let i = trace.stream_value(i as u32);
        series.push(Series {
            name: format!("reserved stream {i}"),
            color,
            dashed: false,
            values: r,
        });
        series.push(Series {
            name: format!("allocated stream {i}"),
            color,
            dashed: true,
            values: a,
        });
    }
    Ok((
        Figure {
            title: format!(
                "{}: memory over {} ops ({} backend)",
                trace.name,
                n,
                dev.backend_kind()
            ),
            ops: n,
            series,
        },
        live,
    ))
}

/// `cachalot plot`.
pub fn plot_cmd(
    trace: &str,
    opts: &DeviceOpts,
    output: &Path,
    width: u32,
    height: u32,
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
    let kind = backend_kind(opts)?;
    let config = allocator_config(opts)?;
    let spec = trace;
    let trace = load_trace(spec)?;
    let dev = open_device(kind, config)?;
    let (fig, live) = collect(&dev, &trace, spec)?;
    free_all(&dev, live)?;
    let bytes = if png {
        render_png(&fig, width, height)
            .map_err(|e| CliError::failure(format!("encoding PNG: {e}")))?
    } else {
        render_svg(&fig, width, height).into_bytes()
    };
    std::fs::write(output, bytes)
        .map_err(|e| CliError::failure(format!("writing {}: {e}", output.display())))?;
    crate::print_out(&format!("wrote {}\n", output.display()))
}

/// Axis ranges, tick positions and the data-to-pixel mapping.
struct Layout {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    x_max: f64,
    y_max: f64,
    x_ticks: Vec<(f64, String)>,
    y_ticks: Vec<(f64, String)>,
}

fn nice_step(range: f64, target: f64) -> f64 {
    let raw = (range / target).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

fn fmt_num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

impl Layout {
    fn new(fig: &Figure, width: u32, height: u32) -> Self {
        let y_data = fig
            .series
            .iter()
            .flat_map(|s| s.values.iter())
            .copied()
            .max()
            .unwrap_or(0)
            .max(1) as f64;
        let (unit, div) = if y_data >= (1u64 << 30) as f64 {
            ("GiB", (1u64 << 30) as f64)
        } else if y_data >= (1u64 << 20) as f64 {
            ("MiB", (1u64 << 20) as f64)
        } else if y_data >= 1024.0 {
            ("KiB", 1024.0)
        } else {
            ("B", 1.0)
        };
        let ystep = nice_step(y_data / div, 5.0);
        let y_max = (y_data / div / ystep).ceil() * ystep * div;
        let mut y_ticks = Vec::new();
        let mut v = 0.0;
        while v <= y_max / div + 1e-9 {
            y_ticks.push((v * div, format!("{} {unit}", fmt_num(v))));
            v += ystep;
        }
        let x_max = fig.ops.max(1) as f64;
        let xstep = nice_step(x_max, 8.0).max(1.0);
        let mut x_ticks = Vec::new();
        let mut x = 0.0;
        while x <= x_max + 1e-9 {
            x_ticks.push((x, fmt_num(x)));
            x += xstep;
        }
        Self {
            left: 100.0,
            right: width as f64 - 20.0,
            top: 40.0,
            bottom: height as f64 - 50.0,
            x_max,
            y_max,
            x_ticks,
            y_ticks,
        }
    }

    fn px(&self, x: f64) -> f64 {
        self.left + (self.right - self.left) * x / self.x_max
    }

    fn py(&self, y: f64) -> f64 {
        self.bottom - (self.bottom - self.top) * y / self.y_max
    }

    /// The series reduced to at most one point per pixel column: the
    /// maximum of each column (peaks stay visible), at the column's last op.
    fn polyline(&self, values: &[u64]) -> Vec<(f64, f64)> {
        let cols = (self.right - self.left).max(1.0) as usize;
        let n = values.len();
        if n == 0 {
            return Vec::new();
        }
        let mut pts = Vec::with_capacity(cols.min(n) + 1);
        pts.push((self.px(0.0), self.py(0.0)));
        let per = n.div_ceil(cols).max(1);
        for (c, chunk) in values.chunks(per).enumerate() {
            let m = chunk.iter().copied().max().unwrap_or(0) as f64;
            let x = (c * per + chunk.len()) as f64;
            pts.push((self.px(x), self.py(m)));
        }
        pts
    }
}

fn css(c: Rgb) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn render_svg(fig: &Figure, width: u32, height: u32) -> String {
    let l = Layout::new(fig, width, height);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        width / 2,
        xml_escape(&fig.title)
    );
    for (v, label) in &l.y_ticks {
        let y = l.py(*v);
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            l.left,
            l.right,
            l.left - 6.0,
            y + 4.0,
            xml_escape(label)
        );
    }
    for (v, label) in &l.x_ticks {
        let x = l.px(*v);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#000"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            l.bottom,
            l.bottom + 5.0,
            l.bottom + 18.0,
            xml_escape(label)
        );
    }
    let _ = writeln!(
        s,
        r##"<path d="M{:.1},{:.1} V{:.1} H{:.1}" fill="none" stroke="#000"/>"##,
        l.left, l.top, l.bottom, l.right
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{}" text-anchor="middle">operation index</text>"#,
        (l.left + l.right) / 2.0,
        height - 12
    );
    for (i, ser) in fig.series.iter().enumerate() {
        let pts = l.polyline(&ser.values);
        let mut d = String::with_capacity(pts.len() * 14);
        for (j, (x, y)) in pts.iter().enumerate() {
            let _ = write!(d, "{}{x:.1},{y:.1}", if j == 0 { "M" } else { " L" });
        }
        let dash = if ser.dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.5"{dash}><title>{}</title></path>"#,
            css(ser.color),
            xml_escape(&ser.name)
        );
        // Legend, top left inside the plot.
        let ly = l.top + 12.0 + 16.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            l.left + 10.0,
            l.left + 40.0,
            css(ser.color),
            l.left + 46.0,
            ly + 4.0,
            xml_escape(&ser.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn render_png(fig: &Figure, width: u32, height: u32) -> Result<Vec<u8>, png::EncodingError> {
    const BLACK: Rgb = (0, 0, 0);
    const GRID: Rgb = (224, 224, 224);
    let l = Layout::new(fig, width, height);
    let mut c = Canvas::new(width, height, (255, 255, 255));
    let mut phase = 0;
    let title_w = Canvas::text_width(&fig.title, 2);
    c.text((width as i64 - title_w) / 2, 10, &fig.title, BLACK, 2);
    for (v, label) in &l.y_ticks {
        let y = l.py(*v);
        c.line((l.left, y), (l.right, y), GRID, 1, None, &mut phase);
        let w = Canvas::text_width(label, 1);
        c.text(l.left as i64 - 6 - w, y as i64 - 3, label, BLACK, 1);
    }
    for (v, label) in &l.x_ticks {
        let x = l.px(*v);
        c.line(
            (x, l.bottom),
            (x, l.bottom + 5.0),
            BLACK,
            1,
            None,
            &mut phase,
        );
        let w = Canvas::text_width(label, 1);
        c.text(x as i64 - w / 2, l.bottom as i64 + 9, label, BLACK, 1);
    }
    c.line(
        (l.left, l.top),
        (l.left, l.bottom),
        BLACK,
        1,
        None,
        &mut phase,
    );
    c.line(
        (l.left, l.bottom),
        (l.right, l.bottom),
        BLACK,
        1,
        None,
        &mut phase,
    );
    let xl = "operation index";
    c.text(
        ((l.left + l.right) / 2.0) as i64 - Canvas::text_width(xl, 1) / 2,
        height as i64 - 18,
        xl,
        BLACK,
        1,
    );
    for (i, ser) in fig.series.iter().enumerate() {
        let dash = ser.dashed.then_some((6, 4));
        let pts = l.polyline(&ser.values);
        let mut phase = 0;
        for w in pts.windows(2) {
            c.line(w[0], w[1], ser.color, 2, dash, &mut phase);
        }
        let ly = l.top + 12.0 + 14.0 * i as f64;
        let mut p = 0;
        c.line(
            (l.left + 10.0, ly),
            (l.left + 40.0, ly),
            ser.color,
            2,
            dash,
            &mut p,
        );
        c.text(l.left as i64 + 46, ly as i64 - 3, &ser.name, BLACK, 1);
    }
    c.to_png()
}
