//! Drawing a [`Figure`](super::Figure): the axes' layout, the SVG written
//! by hand and the PNG rasterized by [`crate::raster`].

use super::*;

/// Axis ranges, tick positions and the data-to-pixel mapping.
pub(super) struct Layout {
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    x_max: f64,
    y_max: f64,
    x_ticks: Vec<(f64, String)>,
    y_ticks: Vec<(f64, String)>,
    /// The y-axis title, naming the unit: `memory (GiB)`.
    y_title: String,
}

/// The x-axis title.
pub(super) const X_TITLE: &str = "operation";

pub(super) fn nice_step(range: f64, target: f64) -> f64 {
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

/// A tick value: integers with thousands separators (`350,000`), else up
/// to two decimals (`0.25`).
pub(super) fn fmt_num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        units::group_i(v.round() as i64)
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
            .chain(fig.device_memory)
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
            ("bytes", 1.0)
        };
        let ystep = nice_step(y_data / div, 5.0);
        let y_max = (y_data / div / ystep).ceil() * ystep * div;
        let mut y_ticks = Vec::new();
        let mut v = 0.0;
        while v <= y_max / div + 1e-9 {
            y_ticks.push((v * div, fmt_num(v)));
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
            left: 80.0,
            right: width as f64 - 24.0,
            top: 44.0,
            bottom: height as f64 - 52.0,
            x_max,
            y_max,
            x_ticks,
            y_ticks,
            y_title: format!("memory ({unit})"),
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

/// The label of the device-capacity line.
pub(super) fn device_label(bytes: u64) -> String {
    format!("device memory {}", units::human(bytes))
}

/// Legend rows: height in pixels, and the legend box's left and top.
pub(super) const LEGEND_ROW: f64 = 16.0;

pub(super) fn css(c: Rgb) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

pub(super) fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub(super) fn render_svg(fig: &Figure, width: u32, height: u32) -> String {
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
        r#"<text x="{:.1}" y="{}" text-anchor="middle">{X_TITLE}</text>"#,
        (l.left + l.right) / 2.0,
        height - 14
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (l.top + l.bottom) / 2.0,
        xml_escape(&l.y_title)
    );
    if let Some(m) = fig.device_memory {
        let y = l.py(m as f64);
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="1.5" stroke-dasharray="8,4"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="{}">{}</text>"#,
            l.left,
            l.right,
            css(LIMIT),
            l.right - 4.0,
            y - 5.0,
            css(LIMIT),
            xml_escape(&device_label(m))
        );
    }
    for &(op, color) in &fig.ooms {
        let x = l.px(op as f64);
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{}" stroke-width="1.5"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="{}">out of memory</text>"#,
            l.top,
            l.bottom,
            css(color),
            x - 4.0,
            l.bottom - 6.0,
            css(color)
        );
    }
    let legend_w = fig
        .series
        .iter()
        .map(|x| x.name.chars().count() as f64 * 6.6)
        .fold(0.0, f64::max)
        + 56.0;
    let _ = writeln!(
        s,
        r##"<rect x="{:.1}" y="{:.1}" width="{legend_w:.1}" height="{:.1}" fill="white" fill-opacity="0.85" stroke="#c0c0c0"/>"##,
        l.left + 6.0,
        l.top + 2.0,
        LEGEND_ROW * fig.series.len() as f64 + 6.0
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
        let ly = l.top + 12.0 + LEGEND_ROW * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            l.left + 12.0,
            l.left + 42.0,
            css(ser.color),
            l.left + 48.0,
            ly + 4.0,
            xml_escape(&ser.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

pub(super) fn render_png(fig: &Figure, width: u32, height: u32) -> Result<Vec<u8>, CliError> {
    use crate::raster::text_width;
    const BLACK: Rgb = (0, 0, 0);
    const GRID: Rgb = (224, 224, 224);
    const LABEL: f32 = 12.0;
    const TITLE: f32 = 15.0;
    let font =
        crate::raster::font().map_err(|e| CliError::failure(format!("the bundled font: {e}")))?;
    let h = Dir::Horizontal;
    let l = Layout::new(fig, width, height);
    let mut c = Canvas::new(width, height, (255, 255, 255));
    let mut phase = 0;
    let tw = text_width(&font, &fig.title, TITLE);
    c.text(
        &font,
        ((f64::from(width) - tw) / 2.0, 26.0),
        &fig.title,
        TITLE,
        BLACK,
        h,
    );
    for (v, label) in &l.y_ticks {
        let y = l.py(*v);
        c.line((l.left, y), (l.right, y), GRID, 1, None, &mut phase);
        let w = text_width(&font, label, LABEL);
        c.text(&font, (l.left - 6.0 - w, y + 4.0), label, LABEL, BLACK, h);
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
        let w = text_width(&font, label, LABEL);
        c.text(
            &font,
            (x - w / 2.0, l.bottom + 19.0),
            label,
            LABEL,
            BLACK,
            h,
        );
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
    let w = text_width(&font, X_TITLE, LABEL);
    c.text(
        &font,
        ((l.left + l.right - w) / 2.0, f64::from(height) - 14.0),
        X_TITLE,
        LABEL,
        BLACK,
        h,
    );
    let w = text_width(&font, &l.y_title, LABEL);
    c.text(
        &font,
        (22.0, (l.top + l.bottom + w) / 2.0),
        &l.y_title,
        LABEL,
        BLACK,
        Dir::Up,
    );
    if let Some(m) = fig.device_memory {
        let y = l.py(m as f64);
        let mut p = 0;
        c.line((l.left, y), (l.right, y), LIMIT, 2, Some((8, 4)), &mut p);
        let label = device_label(m);
        let w = text_width(&font, &label, LABEL);
        c.text(&font, (l.right - 4.0 - w, y - 6.0), &label, LABEL, LIMIT, h);
    }
    for &(op, color) in &fig.ooms {
        let x = l.px(op as f64);
        let mut p = 0;
        c.line((x, l.top), (x, l.bottom), color, 2, None, &mut p);
        let label = "out of memory";
        let w = text_width(&font, label, LABEL);
        c.text(&font, (x - 4.0 - w, l.bottom - 6.0), label, LABEL, color, h);
    }
    let legend_w = fig
        .series
        .iter()
        .map(|x| text_width(&font, &x.name, LABEL))
        .fold(0.0, f64::max)
        + 50.0;
    let (bx, by) = (l.left + 6.0, l.top + 2.0);
    let bh = LEGEND_ROW * fig.series.len() as f64 + 6.0;
    for ser in &fig.series {
        let dash = ser.dashed.then_some((6, 4));
        let pts = l.polyline(&ser.values);
        let mut phase = 0;
        for w in pts.windows(2) {
            c.line(w[0], w[1], ser.color, 2, dash, &mut phase);
        }
    }
    // legend over the lines, on a white box
    c.fill_rect(
        bx as i64,
        by as i64,
        (bx + legend_w) as i64,
        (by + bh) as i64,
        (255, 255, 255),
    );
    let frame = (192, 192, 192);
    let mut p = 0;
    for (a, b) in [
        ((bx, by), (bx + legend_w, by)),
        ((bx + legend_w, by), (bx + legend_w, by + bh)),
        ((bx + legend_w, by + bh), (bx, by + bh)),
        ((bx, by + bh), (bx, by)),
    ] {
        c.line(a, b, frame, 1, None, &mut p);
    }
    for (i, ser) in fig.series.iter().enumerate() {
        let dash = ser.dashed.then_some((6, 4));
        let ly = l.top + 12.0 + LEGEND_ROW * i as f64;
        let mut p = 0;
        c.line(
            (l.left + 12.0, ly),
            (l.left + 42.0, ly),
            ser.color,
            2,
            dash,
            &mut p,
        );
        c.text(&font, (l.left + 48.0, ly + 4.0), &ser.name, LABEL, BLACK, h);
    }
    c.to_png()
        .map_err(|e| CliError::failure(format!("encoding PNG: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(values: Vec<u64>, device_memory: Option<u64>) -> Figure {
        Figure {
            title: "t: memory".into(),
            ops: values.len(),
            series: vec![Series {
                name: "reserved, peak 3.00 GiB".into(),
                color: PALETTE[0],
                dashed: false,
                values,
            }],
            device_memory,
            ooms: vec![(2, LIMIT)],
        }
    }

    #[test]
    fn ticks_have_separators_and_the_axes_titles() {
        let fig = figure(vec![0; 350_000], None);
        let l = Layout::new(&fig, 1200, 600);
        assert!(
            l.x_ticks.iter().any(|t| t.1 == "350,000"),
            "{:?}",
            l.x_ticks
        );
        assert_eq!(fmt_num(1234567.0), "1,234,567");
        assert_eq!(fmt_num(0.25), "0.25");
        let fig = figure(vec![3 << 30, 1 << 30], Some(24 << 30));
        let l = Layout::new(&fig, 1200, 600);
        assert_eq!(l.y_title, "memory (GiB)");
        // the device line is inside the plot
        assert!(l.y_max >= (24u64 << 30) as f64);
        let svg = render_svg(&fig, 1200, 600);
        for needle in [
            ">memory (GiB)</text>",
            "rotate(-90)",
            ">operation</text>",
            ">device memory 24.00 GiB</text>",
            ">out of memory</text>",
            ">reserved, peak 3.00 GiB<",
        ] {
            assert!(svg.contains(needle), "{needle} not in the SVG");
        }
        let png = render_png(&fig, 1200, 600).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
}
