//! A tiny RGB rasterizer (lines, rectangles, a 5×7 bitmap font) and PNG
//! encoding, so that plots need no system library.

/// An RGB colour.
pub type Rgb = (u8, u8, u8);

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

    /// Sets one pixel (ignored outside the canvas).
    pub fn put(&mut self, x: i64, y: i64, c: Rgb) {
        if x < 0 || y < 0 || x >= self.width as i64 || y >= self.height as i64 {
            return;
        }
        let i = (y as usize * self.width as usize + x as usize) * 3;
        self.buf[i..i + 3].copy_from_slice(&[c.0, c.1, c.2]);
    }

    /// Fills the rectangle `[x0, x1) × [y0, y1)`.
    pub fn fill_rect(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb) {
        for y in y0..y1 {
            for x in x0..x1 {
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

    /// Draws `text` (upper-cased) with its top-left corner at `(x, y)`,
    /// each font pixel `scale` × `scale`.
    pub fn text(&mut self, x: i64, y: i64, text: &str, c: Rgb, scale: i64) {
        let mut cx = x;
        for ch in text.chars() {
            let g = glyph(ch);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        self.fill_rect(
                            cx + col * scale,
                            y + row as i64 * scale,
                            cx + (col + 1) * scale,
                            y + (row as i64 + 1) * scale,
                            c,
                        );
                    }
                }
            }
            cx += 6 * scale;
        }
    }

    /// Width in pixels of `text` drawn at `scale`.
    pub fn text_width(text: &str, scale: i64) -> i64 {
        text.chars().count() as i64 * 6 * scale - scale
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

/// The 5×7 glyph of `c` (rows top to bottom, bit 4 = leftmost column).
fn glyph(c: char) -> [u8; 7] {
    const fn g(rows: [u8; 7]) -> [u8; 7] {
        rows
    }
    match c.to_ascii_uppercase() {
        ' ' => [0; 7],
        '0' => g([
            0b01110, 0b10001, 0b10011, 0b10101, 0b11001, 0b10001, 0b01110,
        ]),
        '1' => g([
            0b00100, 0b01100, 0b00100, 0b00100, 0b00100, 0b00100, 0b01110,
        ]),
        '2' => g([
            0b01110, 0b10001, 0b00001, 0b00010, 0b00100, 0b01000, 0b11111,
        ]),
        '3' => g([
            0b11111, 0b00010, 0b00100, 0b00010, 0b00001, 0b10001, 0b01110,
        ]),
        '4' => g([
            0b00010, 0b00110, 0b01010, 0b10010, 0b11111, 0b00010, 0b00010,
        ]),
        '5' => g([
            0b11111, 0b10000, 0b11110, 0b00001, 0b00001, 0b10001, 0b01110,
        ]),
        '6' => g([
            0b00110, 0b01000, 0b10000, 0b11110, 0b10001, 0b10001, 0b01110,
        ]),
        '7' => g([
            0b11111, 0b00001, 0b00010, 0b00100, 0b01000, 0b01000, 0b01000,
        ]),
        '8' => g([
            0b01110, 0b10001, 0b10001, 0b01110, 0b10001, 0b10001, 0b01110,
        ]),
        '9' => g([
            0b01110, 0b10001, 0b10001, 0b01111, 0b00001, 0b00010, 0b01100,
        ]),
        'A' => g([
            0b01110, 0b10001, 0b10001, 0b11111, 0b10001, 0b10001, 0b10001,
        ]),
        'B' => g([
            0b11110, 0b10001, 0b10001, 0b11110, 0b10001, 0b10001, 0b11110,
        ]),
        'C' => g([
            0b01110, 0b10001, 0b10000, 0b10000, 0b10000, 0b10001, 0b01110,
        ]),
        'D' => g([
            0b11100, 0b10010, 0b10001, 0b10001, 0b10001, 0b10010, 0b11100,
        ]),
        'E' => g([
            0b11111, 0b10000, 0b10000, 0b11110, 0b10000, 0b10000, 0b11111,
        ]),
        'F' => g([
            0b11111, 0b10000, 0b10000, 0b11110, 0b10000, 0b10000, 0b10000,
        ]),
        'G' => g([
            0b01110, 0b10001, 0b10000, 0b10111, 0b10001, 0b10001, 0b01111,
        ]),
        'H' => g([
            0b10001, 0b10001, 0b10001, 0b11111, 0b10001, 0b10001, 0b10001,
        ]),
        'I' => g([
            0b01110, 0b00100, 0b00100, 0b00100, 0b00100, 0b00100, 0b01110,
        ]),
        'J' => g([
            0b00111, 0b00010, 0b00010, 0b00010, 0b00010, 0b10010, 0b01100,
        ]),
        'K' => g([
            0b10001, 0b10010, 0b10100, 0b11000, 0b10100, 0b10010, 0b10001,
        ]),
        'L' => g([
            0b10000, 0b10000, 0b10000, 0b10000, 0b10000, 0b10000, 0b11111,
        ]),
        'M' => g([
            0b10001, 0b11011, 0b10101, 0b10101, 0b10001, 0b10001, 0b10001,
        ]),
        'N' => g([
            0b10001, 0b10001, 0b11001, 0b10101, 0b10011, 0b10001, 0b10001,
        ]),
        'O' => g([
            0b01110, 0b10001, 0b10001, 0b10001, 0b10001, 0b10001, 0b01110,
        ]),
        'P' => g([
            0b11110, 0b10001, 0b10001, 0b11110, 0b10000, 0b10000, 0b10000,
        ]),
        'Q' => g([
            0b01110, 0b10001, 0b10001, 0b10001, 0b10101, 0b10010, 0b01101,
        ]),
        'R' => g([
            0b11110, 0b10001, 0b10001, 0b11110, 0b10100, 0b10010, 0b10001,
        ]),
        'S' => g([
            0b01111, 0b10000, 0b10000, 0b01110, 0b00001, 0b00001, 0b11110,
        ]),
        'T' => g([
            0b11111, 0b00100, 0b00100, 0b00100, 0b00100, 0b00100, 0b00100,
        ]),
        'U' => g([
            0b10001, 0b10001, 0b10001, 0b10001, 0b10001, 0b10001, 0b01110,
        ]),
        'V' => g([
            0b10001, 0b10001, 0b10001, 0b10001, 0b10001, 0b01010, 0b00100,
        ]),
        'W' => g([
            0b10001, 0b10001, 0b10001, 0b10101, 0b10101, 0b10101, 0b01010,
        ]),
        'X' => g([
            0b10001, 0b10001, 0b01010, 0b00100, 0b01010, 0b10001, 0b10001,
        ]),
        'Y' => g([
            0b10001, 0b10001, 0b10001, 0b01010, 0b00100, 0b00100, 0b00100,
        ]),
        'Z' => g([
            0b11111, 0b00001, 0b00010, 0b00100, 0b01000, 0b10000, 0b11111,
        ]),
        '.' => g([0, 0, 0, 0, 0, 0b01100, 0b01100]),
        ',' => g([0, 0, 0, 0, 0b01100, 0b00100, 0b01000]),
        ':' => g([0, 0b01100, 0b01100, 0, 0b01100, 0b01100, 0]),
        '/' => g([0, 0b00001, 0b00010, 0b00100, 0b01000, 0b10000, 0]),
        '(' => g([
            0b00010, 0b00100, 0b01000, 0b01000, 0b01000, 0b00100, 0b00010,
        ]),
        ')' => g([
            0b01000, 0b00100, 0b00010, 0b00010, 0b00010, 0b00100, 0b01000,
        ]),
        '-' => g([0, 0, 0, 0b11111, 0, 0, 0]),
        '_' => g([0, 0, 0, 0, 0, 0, 0b11111]),
        '=' => g([0, 0, 0b11111, 0, 0b11111, 0, 0]),
        '%' => g([
            0b11000, 0b11001, 0b00010, 0b00100, 0b01000, 0b10011, 0b00011,
        ]),
        '+' => g([0, 0b00100, 0b00100, 0b11111, 0b00100, 0b00100, 0]),
        _ => g([
            0b11111, 0b10001, 0b10001, 0b10001, 0b10001, 0b10001, 0b11111,
        ]),
    }
}
