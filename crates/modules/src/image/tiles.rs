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

/// Colours among a tile's samples above which it looks like a picture ([`Screen::photo_like`]).
pub(crate) const PHOTO_SAMPLE_COLOURS: usize = 16;
/// Share of a tile's samples that differ from both their right and lower neighbours above
/// which it looks like a picture whatever its colours ([`Screen::photo_like`]): grain. 50–70 %
/// in `testsrc2` under ±4 noise as ffplay shows it (6–9 colours a tile), under 10 % in
/// bitmap-font and anti-aliased terminal text.
pub(crate) const GRAIN_SHARE: f64 = 0.25;

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

    /// Whether `r` looks like a picture (a video frame, a 3D scene) rather than text or flat
    /// drawing: its pixels sampled on a grid of about 16×16 (every 4th on every 4th row of a
    /// 64-pixel tile) have more than [`PHOTO_SAMPLE_COLOURS`] colours, or fewer but grain
    /// ([`GRAIN_SHARE`]). On 1080p test video with light grain 9 tiles in 10 have that many
    /// colours (the flattest ones 11–13); bitmap-font text 2; anti-aliased text 13 at the
    /// median, 37 at the 90th percentile, so the video detector wants such tiles to be a share
    /// of a region, not all of it ([`super::video::PHOTO_SHARE`]). `testsrc2`'s saturated bars
    /// under ±4 noise, as ffplay shows them, clip to 6–9 colours a tile: only 1 tile in 3 had
    /// more than 16 and a full-screen such video stayed on JPEG and palette tiles at 3 frames
    /// a second; their grain tells them.
    pub fn photo_like(&self, r: Rect) -> bool {
        // About 16 samples across and down whatever the tile size (16 to 256: at most 31×31
        // samples, for 31-pixel tiles). This runs for every changed tile: the colours found
        // stay on the stack, and a picture is known once one more than the limit is (a grainy
        // video's tile after about 17 samples; sorting all of them cost 5 % of the app side
        // at 1440p).
        let mut found = [0u32; PHOTO_SAMPLE_COLOURS];
        let mut n = 0;
        let step = usize::from((r.w.max(r.h) / 16).max(1));
        for y in (r.y..r.y + r.h).step_by(step) {
            let Some(row) = self.px.get(self.row(r.x, y, r.w)) else {
                return false;
            };
            for p in row.chunks_exact(4).step_by(step) {
                let c = u32::from_le_bytes([p[0], p[1], p[2], 0]);
                if !found[..n].contains(&c) {
                    if n == found.len() {
                        return true;
                    }
                    found[n] = c;
                    n += 1;
                }
            }
        }
        // Few colours, but grain: most samples differ from the pixels right of and below them
        // (a test pattern's saturated bars under noise clip to 6–9 colours a tile; text, even
        // anti-aliased, differs from both at a stroke's corners only). Two colours are text or
        // line drawing, whatever their pattern.
        n > 2 && self.grainy(r, step)
    }

    /// Whether at least [`GRAIN_SHARE`] of `r`'s samples (every `step`th pixel of every
    /// `step`th row) differ from both the pixel right of them and the one below.
    fn grainy(&self, r: Rect, step: usize) -> bool {
        let (w, h) = (usize::from(self.width), usize::from(self.height));
        let stride = self.stride();
        let (mut samples, mut grain) = (0usize, 0usize);
        for y in (usize::from(r.y)..usize::from(r.y + r.h)).step_by(step) {
            for x in (usize::from(r.x)..usize::from(r.x + r.w)).step_by(step) {
                if x + 1 >= w || y + 1 >= h {
                    continue;
                }
                let i = y * stride + x * 4;
                let (Some(p), Some(right), Some(below)) = (
                    self.px.get(i..i + 3),
                    self.px.get(i + 4..i + 7),
                    self.px.get(i + stride..i + stride + 3),
                ) else {
                    return false;
                };
                samples += 1;
                grain += usize::from(p != right && p != below);
            }
        }
        samples > 0 && grain as f64 >= GRAIN_SHARE * samples as f64
    }

    /// Copies `r`'s pixels out as BGRX rows without padding.
    pub fn copy_out(&self, r: Rect, out: &mut Vec<u8>) {
        out.clear();
        for y in r.y..r.y + r.h {
            out.extend_from_slice(&self.px[self.row(r.x, y, r.w)]);
        }
    }
}

/// What a part of the screen looks like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Class {
    /// One colour (B, G, R).
    Solid([u8; 3]),
    /// At most `palette_max` colours, as B, G, R triples, in ascending order; the packed
    /// indices were appended to the output.
    Palette(Vec<u8>),
    /// More colours.
    Photo,
}

pub(crate) use super::format::{index_bits, index_row_len};

/// Classifies `r` of `s` in one pass, stopping as soon as it has more than `palette_max`
/// colours. For a palette, appends the rows of packed indices to `out` (most significant
/// bits first; a row's last byte padded with zeros), indexing the colours in ascending
/// order so that the same content gives the same bytes wherever it moves (the zstd stream
/// then finds scrolled text in earlier frames). `scratch` is reused between calls.
pub(crate) fn classify_index(
    s: &Screen,
    r: Rect,
    palette_max: usize,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Class {
    let mut colours: Vec<u32> = Vec::with_capacity(16);
    scratch.clear();
    scratch.reserve(usize::from(r.w) * usize::from(r.h));
    let (mut last, mut last_i) = (u32::MAX, 0u8);
    let mut photo = false;
    for y in r.y..r.y + r.h {
        // One row at a time through `extend` (no capacity check per pixel); a part found to
        // have too many colours stops at the end of its row.
        scratch.extend(s.px[s.row(r.x, y, r.w)].chunks_exact(4).map(|p| {
            let c = u32::from_le_bytes([p[0], p[1], p[2], 0]);
            if c != last {
                last = c;
                last_i = match colours.iter().position(|&k| k == c) {
                    Some(i) => i as u8,
                    None if colours.len() == palette_max => {
                        photo = true;
                        0
                    }
                    None => {
                        colours.push(c);
                        (colours.len() - 1) as u8
                    }
                };
            }
            last_i
        }));
        if photo {
            return Class::Photo;
        }
    }
    let bgr = |c: u32| [c as u8, (c >> 8) as u8, (c >> 16) as u8];
    if let [c] = colours.as_slice() {
        return Class::Solid(bgr(*c));
    }
    // First-seen order → ascending colour order.
    let mut order: Vec<usize> = (0..colours.len()).collect();
    order.sort_unstable_by_key(|&i| colours[i]);
    let mut remap = [0u8; 256];
    for (sorted, &first_seen) in order.iter().enumerate() {
        remap[first_seen] = sorted as u8;
    }
    let bits = index_bits(colours.len());
    pack_rows(scratch, usize::from(r.w), bits, &remap, out);
    Class::Palette(order.iter().flat_map(|&i| bgr(colours[i])).collect())
}

/// Appends `indices` (rows of `w`), mapped through `remap`, packed `bits` to an index.
fn pack_rows(indices: &[u8], w: usize, bits: u32, remap: &[u8; 256], out: &mut Vec<u8>) {
    if w == 0 {
        return;
    }
    if bits == 8 {
        out.extend(indices.iter().map(|&i| remap[usize::from(i)]));
        return;
    }
    let per_byte = (8 / bits) as usize;
    for row in indices.chunks(w) {
        for group in row.chunks(per_byte) {
            let mut b = 0u8;
            for (k, &i) in group.iter().enumerate() {
                b |= remap[usize::from(i)] << (8 - bits as usize * (k + 1));
            }
            out.push(b);
        }
    }
}

/// Unpacks one row of `w` indices, `bits` each, from `packed` (at least
/// [`index_row_len`] bytes) into `out`.
pub(crate) fn unpack_row(packed: &[u8], w: usize, bits: u32, out: &mut Vec<u8>) {
    out.clear();
    if bits == 8 {
        out.extend_from_slice(&packed[..w]);
        return;
    }
    let per_byte = (8 / bits) as usize;
    let mask = (1u8 << bits) - 1;
    for &b in packed {
        for k in 0..per_byte {
            if out.len() == w {
                return;
            }
            out.push((b >> (8 - bits as usize * (k + 1))) & mask);
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

#[cfg(test)]
mod photo_tests {
    use super::*;

    /// A screen `side`×`side` whose pixels are `px(x, y)`.
    fn screen(side: u16, px: impl Fn(u16, u16) -> [u8; 3]) -> Screen {
        let mut s = Screen::new(side, side);
        for y in 0..side {
            for x in 0..side {
                let i = (usize::from(y) * usize::from(side) + usize::from(x)) * 4;
                s.px[i..i + 3].copy_from_slice(&px(x, y));
            }
        }
        s
    }

    /// A picture is more than [`PHOTO_SAMPLE_COLOURS`] colours among the samples: 16 are
    /// not, 17 are (counted up to the 17th, no further).
    #[test]
    fn a_picture_is_more_than_sixteen_sampled_colours() {
        for (colours, photo) in [(1u16, false), (16, false), (17, true), (200, true)] {
            // A 64-pixel tile is sampled every 4th pixel of every 4th row: 256 samples.
            let s = screen(64, |x, y| {
                let c = ((x / 4) + 16 * (y / 4)) % colours;
                [c as u8, (c >> 8) as u8, 7]
            });
            assert_eq!(
                s.photo_like(Rect::new(0, 0, 64, 64)),
                photo,
                "{colours} colours"
            );
        }
    }

    /// Every tile size the pair takes (16 to 256) samples about 16×16 pixels: noise is a
    /// picture at each, two-colour text at none (16-pixel tiles once gave 16 samples, which
    /// can never hold more than 16 colours: no video was ever found with `tile = 16`).
    #[test]
    fn photo_like_at_every_tile_size() {
        let noise = |x: u16, y: u16| {
            let h = u32::from(x).wrapping_mul(2_654_435_761) ^ u32::from(y).wrapping_mul(40503);
            let h = h.wrapping_mul(2_246_822_519);
            [(h >> 24) as u8, (h >> 16) as u8, (h >> 8) as u8]
        };
        let text = |x: u16, y: u16| {
            if (x / 3 + y / 5).is_multiple_of(4) {
                [0, 0, 0]
            } else {
                [255, 255, 255]
            }
        };
        for side in [16u16, 32, 64, 128, 256] {
            let whole = Rect::new(0, 0, side, side);
            assert!(screen(side, noise).photo_like(whole), "noise at {side}");
            assert!(!screen(side, text).photo_like(whole), "text at {side}");
        }
    }

    /// Grain in few colours is a picture (a test pattern's clipped bars under noise: 6
    /// colours here, the count `testsrc2` showed); text in as many colours (one a glyph
    /// cell, 1-pixel strokes on a 6×13 cell, as a terminal with syntax colours) is not.
    #[test]
    fn grain_in_few_colours_is_a_picture_and_coloured_text_is_not() {
        let colours = [
            [0, 0, 255],
            [4, 0, 251],
            [0, 4, 255],
            [0, 0, 247],
            [8, 0, 255],
            [0, 8, 251],
        ];
        let grain = |x: u16, y: u16| {
            let h = u32::from(x).wrapping_mul(2_654_435_761) ^ u32::from(y).wrapping_mul(40503);
            colours[(h.wrapping_mul(2_246_822_519) >> 24) as usize % colours.len()]
        };
        let text = |x: u16, y: u16| {
            let (cx, cy, col) = (
                x % 6,
                y % 13,
                usize::from(x / 6 + y / 13) % (colours.len() - 1),
            );
            let stroke = (2..11).contains(&cy) && (cx == 1 || cx == 4 || cy == 6 && cx < 5);
            if stroke {
                colours[1 + col]
            } else {
                colours[0]
            }
        };
        for side in [16u16, 32, 64, 128, 256] {
            let whole = Rect::new(0, 0, side, side);
            let (g, t) = (screen(side, grain), screen(side, text));
            assert!(
                g.grainy(whole, usize::from((side / 16).max(1))),
                "grain at {side}"
            );
            assert!(g.photo_like(whole), "grain at {side}");
            assert!(!t.photo_like(whole), "text at {side}");
        }
    }
}
