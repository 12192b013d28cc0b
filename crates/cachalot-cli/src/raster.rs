//! A small RGB canvas for the PNG plots: lines and rectangles, text drawn
//! by a real font rasterizer, and PNG encoding, so that plots need no
//! system library.
//!
//! Text: [`ab_glyph`] (outline rasterizing with anti-aliasing, kerning)
//! over a bundled Noto Sans Regular, subset to Latin-1 (18 KB; SIL Open
//! Font License 1.1, `fonts/OFL.txt`). It replaces a hand-written 5×7
//! bitmap font that had capitals only ("GIB" for "GiB") and no rotated
//! text for a y-axis title. `ab_glyph` was chosen over `plotters` because
//! the plots only needed a font: the layout (ticks, legend, the SVG, which
//! the viewer's own font renders) is kept, and `plotters`' bitmap backend
//! would bring an image stack and its own text layout for what four calls
//! here do; `ab_glyph` is a few hundred kilobytes of pure Rust with no
//! system dependency (no fontconfig).

use ab_glyph::{Font, FontRef, GlyphId, PxScale, ScaleFont, point};

/// An RGB colour.
pub type Rgb = (u8, u8, u8);

/// The bundled font: Noto Sans Regular, subset to Latin-1 (OFL 1.1).
const FONT: &[u8] = include_bytes!("../fonts/NotoSans-Regular-subset.ttf");

/// The bundled font, parsed.
pub fn font() -> Result<FontRef<'static>, ab_glyph::InvalidFont> {
    FontRef::try_from_slice(FONT)
}

/// Direction of a line of text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Left to right.
    Horizontal,
    /// Bottom to top (a y-axis title).
    Up,
}

/// An RGB image in memory.
pub struct Canvas {
    width: u32,
    height: u32,
    buf: Vec<u8>,
}

impl Canvas {
    /// A canvas filled with `bg`.
    pub fn new(width: u32, height: u32, bg: Rgb) -> Self {
        let n = width as usize * height as usize;
        let mut buf = Vec::with_capacity(n * 3);
        for _ in 0..n {
            buf.extend_from_slice(&[bg.0, bg.1, bg.2]);
        }
        Self { width, height, buf }
    }

    fn index(&self, x: i64, y: i64) -> Option<usize> {
        if x < 0 || y < 0 || x >= self.width as i64 || y >= self.height as i64 {
            return None;
        }
        Some((y as usize * self.width as usize + x as usize) * 3)
    }

    /// Sets one pixel (ignored outside the canvas).
    pub fn put(&mut self, x: i64, y: i64, c: Rgb) {
        if let Some(i) = self.index(x, y) {
            self.buf[i..i + 3].copy_from_slice(&[c.0, c.1, c.2]);
        }
    }

    /// Blends `c` over one pixel with coverage `a` in [0, 1].
    pub fn blend(&mut self, x: i64, y: i64, c: Rgb, a: f32) {
        let a = a.clamp(0.0, 1.0);
        if let Some(i) = self.index(x, y) {
            for (k, v) in [c.0, c.1, c.2].into_iter().enumerate() {
                let old = f32::from(self.buf[i + k]);
                self.buf[i + k] = (old + (f32::from(v) - old) * a).round() as u8;
            }
        }
    }

    /// The pixel at `(x, y)` (`None` outside the canvas).
    #[cfg(test)]
    pub fn get(&self, x: i64, y: i64) -> Option<Rgb> {
        self.index(x, y)
            .map(|i| (self.buf[i], self.buf[i + 1], self.buf[i + 2]))
    }

    /// Fills the rectangle `[x0, x1) × [y0, y1)`.
    pub fn fill_rect(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb) {
        for y in y0.max(0)..y1.min(self.height as i64) {
            for x in x0.max(0)..x1.min(self.width as i64) {
                self.put(x, y, c);
            }
        }
    }

    /// A line `thickness` pixels wide (Bresenham with a square pen); with
    /// `dash` = Some((on, off)) only the "on" pixels of each period are drawn.
    pub fn line(
        &mut self,
        (x0, y0): (f64, f64),
        (x1, y1): (f64, f64),
        c: Rgb,
        thickness: i64,
        dash: Option<(i64, i64)>,
        dash_phase: &mut i64,
    ) {
        let (mut x, mut y) = (x0.round() as i64, y0.round() as i64);
        let (xe, ye) = (x1.round() as i64, y1.round() as i64);
        let dx = (xe - x).abs();
        let dy = -(ye - y).abs();
        let sx = if x < xe { 1 } else { -1 };
        let sy = if y < ye { 1 } else { -1 };
        let mut err = dx + dy;
        let lo = -(thickness - 1) / 2;
        let hi = thickness / 2;
        loop {
            let on = match dash {
                Some((on, off)) => (*dash_phase).rem_euclid(on + off) < on,
                None => true,
            };
            *dash_phase += 1;
            if on {
                for oy in lo..=hi {
                    for ox in lo..=hi {
                        self.put(x + ox, y + oy, c);
                    }
                }
            }
            if x == xe && y == ye {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// Draws `text` in `font` at `size` pixels, starting at `(x, y)` on its
    /// baseline (for [`Dir::Up`] the baseline runs upwards from `(x, y)`).
    pub fn text(
        &mut self,
        font: &FontRef<'_>,
        (x, y): (f64, f64),
        text: &str,
        size: f32,
        c: Rgb,
        dir: Dir,
    ) {
        let scale = PxScale::from(size);
        for (id, caret) in layout(font, text, size) {
            let g = id.with_scale_and_position(scale, point(caret, 0.0));
            let Some(outline) = font.outline_glyph(g) else {
                continue;
            };
            let b = outline.px_bounds();
            outline.draw(|gx, gy, cov| {
                // (dx, dy): the pixel relative to the text's origin
                let dx = f64::from(b.min.x) + f64::from(gx);
                let dy = f64::from(b.min.y) + f64::from(gy);
                let (px, py) = match dir {
                    Dir::Horizontal => (x + dx, y + dy),
                    Dir::Up => (x + dy, y - dx),
                };
                self.blend(px.floor() as i64, py.floor() as i64, c, cov);
            });
        }
    }

    /// The image encoded as an 8-bit RGB PNG.
    pub fn to_png(&self) -> Result<Vec<u8>, png::EncodingError> {
        let mut out = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut out, self.width, self.height);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut w = enc.write_header()?;
            w.write_image_data(&self.buf)?;
            w.finish()?;
        }
        Ok(out)
    }
}

/// Each glyph of `text` with its pen position (kerning applied).
fn layout(font: &FontRef<'_>, text: &str, size: f32) -> Vec<(GlyphId, f32)> {
    let sf = font.as_scaled(PxScale::from(size));
    let mut caret = 0.0;
    let mut prev: Option<GlyphId> = None;
    let mut out = Vec::with_capacity(text.len());
    for ch in text.chars() {
        let id = font.glyph_id(ch);
        if let Some(p) = prev {
            caret += sf.kern(p, id);
        }
        out.push((id, caret));
        caret += sf.h_advance(id);
        prev = Some(id);
    }
    out
}

/// Width in pixels of `text` at `size`.
pub fn text_width(font: &FontRef<'_>, text: &str, size: f32) -> f64 {
    let sf = font.as_scaled(PxScale::from(size));
    let w = layout(font, text, size)
        .last()
        .map_or(0.0, |&(id, caret)| caret + sf.h_advance(id));
    f64::from(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inked pixels of `text` drawn alone.
    fn ink(text: &str, dir: Dir) -> Vec<(i64, i64)> {
        let f = font().expect("the bundled font parses");
        let mut c = Canvas::new(200, 200, (255, 255, 255));
        c.text(&f, (100.0, 100.0), text, 20.0, (0, 0, 0), dir);
        let mut v = Vec::new();
        for y in 0..200 {
            for x in 0..200 {
                if c.get(x, y) != Some((255, 255, 255)) {
                    v.push((x, y));
                }
            }
        }
        v
    }

    #[test]
    fn the_bundled_font_has_lower_case_latin1_glyphs() {
        let f = font().expect("the bundled font parses");
        for ch in ('a'..='z')
            .chain('A'..='Z')
            .chain("0123456789,.:()%/-×µ".chars())
        {
            assert_ne!(f.glyph_id(ch).0, 0, "no glyph for {ch:?}");
        }
        // lower case differs from upper case, and text has width
        assert_ne!(ink("gib", Dir::Horizontal), ink("GIB", Dir::Horizontal));
        assert!(text_width(&f, "GiB", 12.0) > 10.0);
        assert!(text_width(&f, "350,000", 12.0) > text_width(&f, "350", 12.0));
    }

    #[test]
    fn text_sits_on_its_baseline_and_turns_upwards() {
        // no descender in "memo"
        let h = ink("memo", Dir::Horizontal);
        assert!(!h.is_empty());
        // horizontal: right of the origin, above the baseline (no descender)
        assert!(h.iter().all(|&(x, _)| x >= 100));
        assert!(h.iter().all(|&(_, y)| y <= 100));
        let (w, hgt) = extent(&h);
        assert!(w > hgt, "{w} x {hgt}");
        // upwards: left of the baseline, above the origin, taller than wide
        let u = ink("memo", Dir::Up);
        assert!(u.iter().all(|&(_, y)| y <= 100));
        assert!(u.iter().all(|&(x, _)| x <= 100));
        let (w, hgt) = extent(&u);
        assert!(hgt > w, "{w} x {hgt}");
    }

    fn extent(px: &[(i64, i64)]) -> (i64, i64) {
        let xs = px.iter().map(|p| p.0);
        let ys = px.iter().map(|p| p.1);
        (
            xs.clone().max().unwrap() - xs.min().unwrap(),
            ys.clone().max().unwrap() - ys.min().unwrap(),
        )
    }
}
