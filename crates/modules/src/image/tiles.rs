//! Pure pieces of the `image` codec: what a part of the screen looks like (solid, palette,
//! photo), palette indexing, and merging neighbouring parts into larger rectangles.

use ndd_wire::display::Rect;

/// A 32-bpp BGRX image: the screen copy the forward half keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Screen {
    pub width: u16,
    pub height: u16,
    pub px: Vec<u8>,
}

impl Screen {
    pub fn new(width: u16, height: u16) -> Screen {
        Screen {
            width,
            height,
            px: vec![0; usize::from(width) * usize::from(height) * 4],
        }
    }

    pub fn stride(&self) -> usize {
        usize::from(self.width) * 4
    }

    /// Byte range of row `y`, columns `x..x+w`.
    pub fn row(&self, x: u16, y: u16, w: u16) -> std::ops::Range<usize> {
        let start = usize::from(y) * self.stride() + usize::from(x) * 4;
        start..start + usize::from(w) * 4
    }

    /// Copies `r`'s pixels out as BGRX rows without padding.
    pub fn copy_out(&self, r: Rect, out: &mut Vec<u8>) {
        out.clear();
        for y in r.y..r.y + r.h {
            out.extend_from_slice(&self.px[self.row(r.x, y, r.w)]);
        }
    }
}

/// A colour without its X byte.
#[inline]
fn colour(p: &[u8]) -> u32 {
    u32::from(p[0]) | u32::from(p[1]) << 8 | u32::from(p[2]) << 16
}

/// What a part of the screen looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Class {
    /// One colour (B, G, R).
    Solid([u8; 3]),
    /// At most `palette_max` colours, as B, G, R triples, in ascending order.
    Palette(Vec<u8>),
    /// More colours.
    Photo,
}

/// Classifies `r` of `s`, stopping as soon as it has more than `palette_max` colours.
pub(crate) fn classify(s: &Screen, r: Rect, palette_max: usize) -> Class {
    let mut colours: Vec<u32> = Vec::with_capacity(16);
    let mut last = u32::MAX;
    for y in r.y..r.y + r.h {
        for p in s.px[s.row(r.x, y, r.w)].chunks_exact(4) {
            let c = colour(p);
            if c == last {
                continue;
            }
            last = c;
            if !colours.contains(&c) {
                if colours.len() == palette_max {
                    return Class::Photo;
                }
                colours.push(c);
            }
        }
    }
    let bgr = |c: u32| [c as u8, (c >> 8) as u8, (c >> 16) as u8];
    // A fixed order, so the same content gives the same indices wherever it moves (the zstd
    // stream then finds scrolled text in earlier frames).
    colours.sort_unstable();
    match colours.as_slice() {
        [c] => Class::Solid(bgr(*c)),
        cs => Class::Palette(cs.iter().flat_map(|c| bgr(*c)).collect()),
    }
}

/// Appends the palette index of every pixel of `r` (palette as B, G, R triples, holding
/// every colour of `r`).
pub(crate) fn index(s: &Screen, r: Rect, palette: &[u8], out: &mut Vec<u8>) {
    let colours: Vec<u32> = palette.chunks_exact(3).map(colour).collect();
    let (mut last, mut last_i) = (u32::MAX, 0u8);
    for y in r.y..r.y + r.h {
        for p in s.px[s.row(r.x, y, r.w)].chunks_exact(4) {
            let c = colour(p);
            if c != last {
                last = c;
                last_i = colours.iter().position(|&k| k == c).unwrap_or(0) as u8;
            }
            out.push(last_i);
        }
    }
}

/// Appends the B, G, R bytes of every pixel of `r`.
pub(crate) fn bgr(s: &Screen, r: Rect, out: &mut Vec<u8>) {
    for y in r.y..r.y + r.h {
        for p in s.px[s.row(r.x, y, r.w)].chunks_exact(4) {
            out.extend_from_slice(&p[..3]);
        }
    }
}

/// Merges rects that share an edge exactly (same rows and touching columns, then same
/// columns and touching rows) into larger ones. The union covers the same pixels.
pub(crate) fn merge(mut rects: Vec<Rect>) -> Vec<Rect> {
    rects.sort_by_key(|r| (r.y, r.h, r.x));
    let mut rows: Vec<Rect> = Vec::with_capacity(rects.len());
    for r in rects {
        match rows.last_mut() {
            Some(l) if l.y == r.y && l.h == r.h && l.right() == u32::from(r.x) => {
                l.w += r.w;
            }
            _ => rows.push(r),
        }
    }
    rows.sort_by_key(|r| (r.x, r.w, r.y));
    let mut out: Vec<Rect> = Vec::with_capacity(rows.len());
    for r in rows {
        match out.last_mut() {
            Some(l) if l.x == r.x && l.w == r.w && l.bottom() == u32::from(r.y) => {
                l.h += r.h;
            }
            _ => out.push(r),
        }
    }
    out
}
