//! The viewer's scaling (pure, no X): the window size a remote screen is first shown at (the
//! screen itself, or the largest size of its shape that fits the viewer's screen: never
//! cropped), which part of the window a changed part of the image lands in, and the pixels
//! there — an area average where the window is smaller than the image (every source pixel
//! counts, so text thins out instead of losing strokes), bilinear where it is larger.

use ndd_wire::display::Rect;

/// Share of the viewer's screen a remote screen too large for it is fitted into (room for a
/// window manager's frame and panels).
pub const FIT_SHARE: f64 = 0.95;

/// The size to show an image of `w`×`h` at on a screen of `sw`×`sh`: its own when it fits,
/// else the largest size of the same shape within [`FIT_SHARE`] of the screen (at least 1×1).
pub fn fit(w: u16, h: u16, sw: u16, sh: u16) -> (u16, u16) {
    if w <= sw && h <= sh {
        return (w, h);
    }
    let f =
        (f64::from(sw) * FIT_SHARE / f64::from(w)).min(f64::from(sh) * FIT_SHARE / f64::from(h));
    let s = |v: u16| ((f64::from(v) * f).round() as u16).max(1);
    (s(w), s(h))
}

/// HiDPI: the factor a display's X resources ask for (`Xft.dpi` / 96, what desktops set for
/// a HiDPI screen), to the nearest quarter, from 1 to 4; 1 without one.
pub fn dpi_scale(resources: &str) -> f64 {
    let dpi = resources.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "Xft.dpi").then(|| v.trim().parse::<f64>().ok())?
    });
    match dpi {
        Some(d) if d.is_finite() && d > 0.0 => ((d / 96.0 * 4.0).round() / 4.0).clamp(1.0, 4.0),
        _ => 1.0,
    }
}

/// `v` pixels at `factor` (at most `u16::MAX`).
pub fn scaled(v: u16, factor: f64) -> u16 {
    (f64::from(v) * factor)
        .round()
        .clamp(1.0, f64::from(u16::MAX)) as u16
}

/// The part of a `dw`×`dh` window whose pixels depend on `r` of a `sw`×`sh` image (a pixel
/// reads the source pixels under it, and bilinear ones a neighbour more).
pub fn window_rect(r: Rect, sw: u16, sh: u16, dw: u16, dh: u16) -> Option<Rect> {
    let lo = |v: u16, s: u16, d: u16| {
        (u32::from(v) * u32::from(d) / u32::from(s).max(1)).saturating_sub(1)
    };
    let hi = |v: u32, s: u16, d: u16| {
        ((v * u32::from(d)).div_ceil(u32::from(s).max(1)) + 1).min(u32::from(d))
    };
    let (x0, y0) = (lo(r.x, sw, dw), lo(r.y, sh, dh));
    let x1 = hi(u32::from(r.x) + u32::from(r.w), sw, dw);
    let y1 = hi(u32::from(r.y) + u32::from(r.h), sh, dh);
    (x1 > x0 && y1 > y0)
        .then(|| Rect::new(x0 as u16, y0 as u16, (x1 - x0) as u16, (y1 - y0) as u16))
}

/// One axis of the scaling: for each window coordinate, the source span it averages
/// (shrinking) or the two source coordinates and the weight of the second in 1/256
/// (growing).
#[derive(Debug, Clone, Copy)]
enum Tap {
    Span(u32, u32),
    Lerp(u32, u32, u32),
}

fn tap(d: u32, s: u32, dn: u32) -> Tap {
    let (d, s64, dn) = (u64::from(d), u64::from(s), u64::from(dn).max(1));
    if s64 >= dn {
        // Shrinking (or the same size): the source pixels under this one.
        let a = d * s64 / dn;
        let b = ((d + 1) * s64).div_ceil(dn).clamp(a + 1, s64);
        Tap::Span(a as u32, b as u32)
    } else {
        // Growing: the source position of this pixel's centre, between two pixels.
        let pos = ((2 * d + 1) * s64 * 256 / (2 * dn)).saturating_sub(128);
        let a = (pos / 256).min(s64 - 1);
        let b = (a + 1).min(s64 - 1);
        Tap::Lerp(a as u32, b as u32, (pos % 256) as u32)
    }
}

/// The source pixels of one window coordinate with their weights, which sum to 256, each
/// handed to `f` (no allocation: this runs for every column and row of every update).
fn each_weight(t: Tap, mut f: impl FnMut(u32, u32)) {
    match t {
        Tap::Span(a, b) => {
            let n = b - a;
            let (w, extra) = (256 / n, 256 % n);
            for (i, x) in (a..b).enumerate() {
                f(x, w + u32::from((i as u32) < extra));
            }
        }
        Tap::Lerp(a, b, w) => {
            f(a, 256 - w);
            f(b, w);
        }
    }
}

/// Writes the pixels of window rect `r` (in a `dw`×`dh` bgrx image `dst`) scaled from the whole
/// `sw`×`sh` bgrx image `src`: each axis by itself (a row of the source weighed across, then
/// the rows weighed down), each source row weighed once for the rows that read it.
pub fn scale_into(src: &[u8], sw: u16, sh: u16, dst: &mut [u8], dw: u16, dh: u16, r: Rect) {
    let Some(r) = r.clip(dw, dh) else {
        return;
    };
    if sw == 0 || sh == 0 || src.len() < usize::from(sw) * usize::from(sh) * 4 {
        return;
    }
    if dst.len() < usize::from(dw) * usize::from(dh) * 4 {
        return;
    }
    let (sw32, sh32) = (u32::from(sw), u32::from(sh));
    // Each window column's source pixels and weights, worked out once for the whole update
    // (not for every source row it is weighed on): one flat list, and where each column's
    // part ends.
    let mut taps: Vec<(u32, u32)> = Vec::with_capacity(usize::from(r.w) * 2);
    let ends: Vec<usize> = (u32::from(r.x)..u32::from(r.x) + u32::from(r.w))
        .map(|x| {
            each_weight(tap(x, sw32, u32::from(dw)), |sx, w| taps.push((sx * 4, w)));
            taps.len()
        })
        .collect();
    let width = usize::from(r.w);
    // Source rows weighed across (×256), the last few kept: neighbouring window rows share
    // them.
    let mut rows: std::collections::VecDeque<(u32, Vec<u32>)> = std::collections::VecDeque::new();
    let across = |sy: u32, mut out: Vec<u32>| {
        let row = &src[sy as usize * usize::from(sw) * 4..][..usize::from(sw) * 4];
        out.resize(width * 3, 0);
        let mut from = 0;
        for (o, &end) in out.chunks_exact_mut(3).zip(&ends) {
            let (mut b, mut g, mut rr) = (0u32, 0u32, 0u32);
            for &(at, w) in &taps[from..end] {
                let p = &row[at as usize..at as usize + 3];
                b += u32::from(p[0]) * w;
                g += u32::from(p[1]) * w;
                rr += u32::from(p[2]) * w;
            }
            from = end;
            o[0] = b;
            o[1] = g;
            o[2] = rr;
        }
        out
    };
    let mut sum = vec![0u32; width * 3];
    for y in u32::from(r.y)..u32::from(r.y) + u32::from(r.h) {
        sum.iter_mut().for_each(|v| *v = 0);
        each_weight(tap(y, sh32, u32::from(dh)), |sy, wy| {
            if !rows.iter().any(|(k, _)| *k == sy) {
                // The oldest row's buffer is weighed into again (no allocation a row).
                let spare = if rows.len() >= 4 {
                    rows.pop_front().map(|(_, v)| v).unwrap_or_default()
                } else {
                    Vec::new()
                };
                rows.push_back((sy, across(sy, spare)));
            }
            if let Some((_, row)) = rows.iter().find(|(k, _)| *k == sy) {
                for (s, v) in sum.iter_mut().zip(row) {
                    *s += v * wy;
                }
            }
        });
        let o = (y as usize * usize::from(dw) + usize::from(r.x)) * 4;
        for (px, s) in dst[o..o + width * 4]
            .chunks_exact_mut(4)
            .zip(sum.chunks_exact(3))
        {
            px[0] = ((s[0] + 32768) >> 16) as u8;
            px[1] = ((s[1] + 32768) >> 16) as u8;
            px[2] = ((s[2] + 32768) >> 16) as u8;
            px[3] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hidpi_factor_comes_from_xft_dpi_to_the_nearest_quarter() {
        assert_eq!(dpi_scale("Xft.dpi:\t192\nXft.antialias:\t1\n"), 2.0);
        assert_eq!(dpi_scale("Xcursor.size: 48\nXft.dpi: 144\n"), 1.5);
        assert_eq!(dpi_scale("Xft.dpi:\t120"), 1.25);
        assert_eq!(dpi_scale("Xft.dpi: 96"), 1.0);
        assert_eq!(dpi_scale("Xft.dpi: 72"), 1.0, "never below 1");
        assert_eq!(dpi_scale("Xft.dpi: 1000"), 4.0, "never above 4");
        assert_eq!(dpi_scale("Xft.dpi: lots"), 1.0);
        assert_eq!(dpi_scale(""), 1.0);
        assert_eq!(scaled(320, 2.0), 640);
        assert_eq!(scaled(40000, 2.0), u16::MAX);
    }

    #[test]
    fn a_screen_that_fits_is_shown_as_it_is_and_a_larger_one_keeps_its_shape() {
        assert_eq!(fit(800, 600, 1920, 1080), (800, 600));
        assert_eq!(fit(1920, 1080, 1920, 1080), (1920, 1080));
        // 2560×1440 on a 1920×1080 screen: 95 % of it, 16:9 kept.
        assert_eq!(fit(2560, 1440, 1920, 1080), (1824, 1026));
        // Taller than the screen.
        assert_eq!(fit(1000, 2000, 1920, 1080), (513, 1026));
        assert_eq!(fit(60000, 1, 100, 100), (95, 1));
    }

    /// A `w`×`h` bgrx image: four quadrants (blue, green, red, white).
    fn quadrants(w: u16, h: u16) -> Vec<u8> {
        let mut v = Vec::new();
        for y in 0..h {
            for x in 0..w {
                let p: [u8; 4] = match (x < w / 2, y < h / 2) {
                    (true, true) => [255, 0, 0, 0],
                    (false, true) => [0, 255, 0, 0],
                    (true, false) => [0, 0, 255, 0],
                    (false, false) => [255, 255, 255, 0],
                };
                v.extend_from_slice(&p);
            }
        }
        v
    }

    fn at(img: &[u8], w: u16, x: u16, y: u16) -> [u8; 3] {
        let i = (usize::from(y) * usize::from(w) + usize::from(x)) * 4;
        [img[i], img[i + 1], img[i + 2]]
    }

    #[test]
    fn shrinking_and_growing_keep_each_quadrant_where_it_was() {
        let (sw, sh) = (640, 360);
        let src = quadrants(sw, sh);
        for (dw, dh) in [(304, 171), (320, 180), (1280, 720), (333, 97), (640, 360)] {
            let mut dst = vec![7u8; usize::from(dw) * usize::from(dh) * 4];
            scale_into(&src, sw, sh, &mut dst, dw, dh, Rect::new(0, 0, dw, dh));
            let q = |fx: u16, fy: u16| at(&dst, dw, dw * fx / 4, dh * fy / 4);
            assert_eq!(q(1, 1), [255, 0, 0], "{dw}x{dh}");
            assert_eq!(q(3, 1), [0, 255, 0], "{dw}x{dh}");
            assert_eq!(q(1, 3), [0, 0, 255], "{dw}x{dh}");
            assert_eq!(q(3, 3), [255, 255, 255], "{dw}x{dh}");
            assert!(
                !dst.chunks(4).any(|p| p == [7, 7, 7, 7]),
                "every pixel written"
            );
        }
    }

    #[test]
    fn an_area_average_keeps_a_thin_line_and_the_mean_of_the_image() {
        // A one-pixel white line on black, shrunk 4×: it shows as a grey line, not gone.
        let (sw, sh) = (64u16, 64u16);
        let mut src = vec![0u8; 64 * 64 * 4];
        for x in 0..64usize {
            let i = (9 * 64 + x) * 4;
            src[i..i + 3].copy_from_slice(&[255, 255, 255]);
        }
        let (dw, dh) = (16u16, 16u16);
        let mut dst = vec![0u8; 16 * 16 * 4];
        scale_into(&src, sw, sh, &mut dst, dw, dh, Rect::new(0, 0, dw, dh));
        assert_eq!(at(&dst, dw, 5, 2), [64, 64, 64]);
        assert_eq!(at(&dst, dw, 5, 3), [0, 0, 0]);
    }

    #[test]
    fn a_changed_part_maps_to_the_window_pixels_that_read_it() {
        // Half size: image x 100..110 lands in window 50..55, a pixel more each side.
        assert_eq!(
            window_rect(Rect::new(100, 40, 10, 4), 640, 360, 320, 180),
            Some(Rect::new(49, 19, 7, 4))
        );
        // Clipped to the window.
        assert_eq!(
            window_rect(Rect::new(630, 350, 10, 10), 640, 360, 320, 180),
            Some(Rect::new(314, 174, 6, 6))
        );
        // Scaling a part alone gives what scaling the whole image gives there.
        let (sw, sh, dw, dh) = (640u16, 360u16, 333u16, 197u16);
        let mut src = quadrants(sw, sh);
        let mut whole = vec![0u8; usize::from(dw) * usize::from(dh) * 4];
        scale_into(&src, sw, sh, &mut whole, dw, dh, Rect::new(0, 0, dw, dh));
        let mut part = whole.clone();
        // A changed square of the image.
        for y in 100..140usize {
            for x in 200..260usize {
                let i = (y * 640 + x) * 4;
                src[i..i + 3].copy_from_slice(&[9, 99, 199]);
            }
        }
        let r = window_rect(Rect::new(200, 100, 60, 40), sw, sh, dw, dh).unwrap();
        scale_into(&src, sw, sh, &mut part, dw, dh, r);
        scale_into(&src, sw, sh, &mut whole, dw, dh, Rect::new(0, 0, dw, dh));
        assert_eq!(part, whole);
    }
}
