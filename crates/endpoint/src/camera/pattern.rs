//! Sans-IO pieces of the camera class: the synthetic camera's test pattern (with its frame
//! number written in the picture, so a test can read it back after lossy coding) and the
//! BGRX → I420 conversion of the y4m sink.

/// Height of the frame-number strip at the top of every synthetic frame.
pub const STRIP_H: usize = 16;
/// Width of one bit of the frame number in the strip (32 bits: 512 px).
pub const BIT_W: usize = 16;

/// Draws frame `k` of the synthetic camera into `bgrx` (`w` × `h`, 4 bytes per pixel): a
/// gradient background, a square moving 8 px per frame, and `k` as 32 black/white blocks of
/// 16 × 16 px along the top-left edge (bit 31 first).
pub fn draw(k: u64, w: usize, h: usize, bgrx: &mut [u8]) {
    let side = (h / 4).max(1);
    let x0 = (k as usize * 8) % w.max(1);
    let y0 = (h / 2).saturating_sub(side / 2);
    for y in 0..h {
        for x in 0..w {
            let i = (y * w + x) * 4;
            let Some(p) = bgrx.get_mut(i..i + 4) else {
                return;
            };
            let in_square = (x + w - x0) % w < side && (y0..y0 + side).contains(&y);
            let (b, g, r) = if y < STRIP_H && x < 32 * BIT_W {
                let bit = (k >> (31 - x / BIT_W)) & 1;
                let v = if bit == 1 { 255 } else { 0 };
                (v, v, v)
            } else if in_square {
                (40, 200, 240)
            } else {
                ((x * 255 / w.max(1)) as u8, (y * 255 / h.max(1)) as u8, 96)
            };
            p.copy_from_slice(&[b, g, r, 0]);
        }
    }
}

/// Reads the frame number back from the strip of a luma plane (`w` wide): the middle pixel of
/// each bit's block, white above half.
pub fn read_number(luma: &[u8], w: usize) -> Option<u32> {
    let y = STRIP_H / 2;
    let mut k = 0u32;
    for bit in 0..32 {
        let x = bit * BIT_W + BIT_W / 2;
        let v = *luma.get(y * w + x)?;
        k = (k << 1) | u32::from(v > 128);
    }
    Some(k)
}

/// Converts a BGRX image (`w` × `h`, even sizes) to planar I420 (Y, then U and V at half
/// resolution), BT.601 full range as JPEG and y4m's `C420jpeg` use.
pub fn bgrx_to_i420(bgrx: &[u8], w: usize, h: usize, out: &mut Vec<u8>) {
    out.clear();
    out.resize(w * h + 2 * (w / 2) * (h / 2), 0);
    let (y_plane, uv) = out.split_at_mut(w * h);
    let (u_plane, v_plane) = uv.split_at_mut((w / 2) * (h / 2));
    let px = |x: usize, y: usize| -> (f32, f32, f32) {
        let i = (y * w + x) * 4;
        match bgrx.get(i..i + 3) {
            Some(p) => (f32::from(p[2]), f32::from(p[1]), f32::from(p[0])),
            None => (0.0, 0.0, 0.0),
        }
    };
    for y in 0..h {
        for x in 0..w {
            let (r, g, b) = px(x, y);
            y_plane[y * w + x] = (0.299 * r + 0.587 * g + 0.114 * b)
                .round()
                .clamp(0.0, 255.0) as u8;
        }
    }
    for y in 0..h / 2 {
        for x in 0..w / 2 {
            let (mut r, mut g, mut b) = (0.0, 0.0, 0.0);
            for (dx, dy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                let (pr, pg, pb) = px(2 * x + dx, 2 * y + dy);
                r += pr / 4.0;
                g += pg / 4.0;
                b += pb / 4.0;
            }
            let u = -0.168_736 * r - 0.331_264 * g + 0.5 * b + 128.0;
            let v = 0.5 * r - 0.418_688 * g - 0.081_312 * b + 128.0;
            u_plane[y * (w / 2) + x] = u.round().clamp(0.0, 255.0) as u8;
            v_plane[y * (w / 2) + x] = v.round().clamp(0.0, 255.0) as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_number_survives_drawing_and_conversion() {
        let (w, h) = (640, 480);
        let mut img = vec![0u8; w * h * 4];
        let mut yuv = Vec::new();
        for k in [0u64, 1, 29, 0x8000_0001, 123_456] {
            draw(k, w, h, &mut img);
            bgrx_to_i420(&img, w, h, &mut yuv);
            assert_eq!(yuv.len(), w * h * 3 / 2);
            assert_eq!(read_number(&yuv, w), Some(k as u32), "frame {k}");
        }
        // White is Y 255, U/V neutral; the square moves.
        draw(0, w, h, &mut img);
        let a = img.clone();
        draw(1, w, h, &mut img);
        assert_ne!(a[STRIP_H * w * 4..], img[STRIP_H * w * 4..]);
    }
}
