//! The quality of moving content, measured from outside the viewer: every frame of the test
//! video carries its number as a stripe of black and white blocks along its top, a viewer's
//! screen read off its X server names the frame it shows, and ffmpeg renders that same frame
//! again from the same filter graph (deterministic: its noise has a fixed seed) for SSIM and
//! PSNR against it.
//!
//! The graph ends in `bgr0`, so ffplay hands SDL the pixels as they are: the app's screen
//! equals the rendered frame bit for bit (checked by the test
//! `vnc::tests::the_app_screen_equals_the_rendered_frame` and, in every run, by the app
//! screen's own row), and whatever differs at the viewer is the remote display's doing.

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::process::{Command, Stdio};

/// Bits of the frame number; the stripe holds them, then the same bits inverted.
const MARK_BITS: usize = 20;
/// Side of one block of the stripe, in pixels.
const MARK_BLOCK: usize = 16;
/// Rows at the top that hold the stripe (left out of SSIM and PSNR).
pub const MARK_ROWS: usize = MARK_BLOCK;

/// The lavfi graph of the test video, `w`x`h` at 30 fps: `testsrc` with temporal noise of
/// ±`grain` on every pixel, its number in the stripe, pixels as BGRX.
pub fn video_graph(w: u16, h: u16, grain: u8) -> String {
    let half = MARK_BITS * MARK_BLOCK;
    format!(
        "testsrc=size={w}x{h}:rate=30,format=yuv420p,noise=alls={grain}:allf=t+u[v];\
         color=c=black:size={}x{MARK_BLOCK}:rate=30,format=gray,\
         geq=lum='if(lt(X\\,{half})\\,255*mod(floor(N/pow(2\\,floor(X/{MARK_BLOCK})))\\,2)\\,\
         255-255*mod(floor(N/pow(2\\,floor(X/{MARK_BLOCK})-{MARK_BITS}))\\,2))'[m];\
         [v][m]overlay=0:0:shortest=1,format=bgr0[out0]",
        2 * half
    )
}

/// Luma (0–255) of pixel (`x`, `y`) of a BGRX picture `w` pixels wide.
fn luma(bgrx: &[u8], w: usize, x: usize, y: usize) -> f64 {
    let i = (y * w + x) * 4;
    match bgrx.get(i..i + 3) {
        Some(p) => 0.114 * f64::from(p[0]) + 0.587 * f64::from(p[1]) + 0.299 * f64::from(p[2]),
        None => 0.0,
    }
}

/// The frame number a BGRX picture `w` pixels wide shows, if its stripe reads consistently
/// (each block's centre 4x4 averaged; the inverted half must agree bit for bit).
pub fn read_mark(bgrx: &[u8], w: usize) -> Option<u32> {
    if w < 2 * MARK_BITS * MARK_BLOCK || bgrx.len() < w * MARK_BLOCK * 4 {
        return None;
    }
    let block = |k: usize| {
        let (x0, y0) = (k * MARK_BLOCK + MARK_BLOCK / 2 - 2, MARK_BLOCK / 2 - 2);
        let mut sum = 0.0;
        for y in y0..y0 + 4 {
            for x in x0..x0 + 4 {
                sum += luma(bgrx, w, x, y);
            }
        }
        let mean = sum / 16.0;
        // Far from both black and white: not a stripe (a torn or smeared picture).
        if (64.0..192.0).contains(&mean) {
            None
        } else {
            Some(mean >= 128.0)
        }
    };
    let mut n = 0u32;
    for k in 0..MARK_BITS {
        let (bit, inverted) = (block(k)?, block(k + MARK_BITS)?);
        if bit == inverted {
            return None;
        }
        if bit {
            n |= 1 << k;
        }
    }
    Some(n)
}

/// The frames numbered `numbers` of the test video ([`video_graph`]), rendered again by
/// ffmpeg as BGRX, in ascending order (each number once).
pub fn reference_frames(w: u16, h: u16, grain: u8, numbers: &[u32]) -> Result<Vec<(u32, Vec<u8>)>> {
    let mut wanted: Vec<u32> = numbers.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let select: Vec<String> = wanted.iter().map(|n| format!("eq(n\\,{n})")).collect();
    let mut child = Command::new("ffmpeg")
        .args(["-nostdin", "-loglevel", "error", "-f", "lavfi", "-i"])
        .arg(video_graph(w, h, grain))
        .arg("-vf")
        .arg(format!("select='{}'", select.join("+")))
        .args(["-fps_mode", "passthrough", "-frames:v"])
        .arg(wanted.len().to_string())
        .args(["-f", "rawvideo", "-pix_fmt", "bgra", "pipe:1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start ffmpeg (apt-get install ffmpeg)")?;
    let size = usize::from(w) * usize::from(h) * 4;
    let mut out = Vec::with_capacity(wanted.len());
    let mut stdout = child.stdout.take().context("ffmpeg's stdout")?;
    for &n in &wanted {
        let mut frame = vec![0u8; size];
        if stdout.read_exact(&mut frame).is_err() {
            break;
        }
        out.push((n, frame));
    }
    drop(stdout);
    let result = child.wait_with_output().context("ffmpeg")?;
    if out.len() != wanted.len() {
        bail!(
            "ffmpeg rendered {} of the {} reference frames: {}",
            out.len(),
            wanted.len(),
            String::from_utf8_lossy(&result.stderr).trim()
        );
    }
    Ok(out)
}

/// SSIM of the luma of two BGRX pictures `w`x`h` (8x8 windows every 4 pixels, the usual
/// constants), rows from `top` down.
pub fn ssim(a: &[u8], b: &[u8], w: usize, h: usize, top: usize) -> f64 {
    let (c1, c2) = ((0.01f64 * 255.0).powi(2), (0.03f64 * 255.0).powi(2));
    let ya: Vec<f64> = (0..w * h).map(|i| luma(a, w, i % w, i / w)).collect();
    let yb: Vec<f64> = (0..w * h).map(|i| luma(b, w, i % w, i / w)).collect();
    let (mut total, mut windows) = (0.0, 0u64);
    let mut y0 = top;
    while y0 + 8 <= h {
        let mut x0 = 0;
        while x0 + 8 <= w {
            let (mut sa, mut sb, mut saa, mut sbb, mut sab) = (0.0, 0.0, 0.0, 0.0, 0.0);
            for y in y0..y0 + 8 {
                for x in x0..x0 + 8 {
                    let (p, q) = (ya[y * w + x], yb[y * w + x]);
                    sa += p;
                    sb += q;
                    saa += p * p;
                    sbb += q * q;
                    sab += p * q;
                }
            }
            let n = 64.0;
            let (ma, mb) = (sa / n, sb / n);
            let (va, vb) = (saa / n - ma * ma, sbb / n - mb * mb);
            let cov = sab / n - ma * mb;
            total += ((2.0 * ma * mb + c1) * (2.0 * cov + c2))
                / ((ma * ma + mb * mb + c1) * (va + vb + c2));
            windows += 1;
            x0 += 4;
        }
        y0 += 4;
    }
    if windows == 0 {
        1.0
    } else {
        total / windows as f64
    }
}

/// PSNR (dB over B, G, R; infinite when equal) of two BGRX pictures, rows from `top` down.
pub fn psnr(a: &[u8], b: &[u8], w: usize, top: usize) -> f64 {
    let from = top * w * 4;
    let (a, b) = (a.get(from..).unwrap_or(&[]), b.get(from..).unwrap_or(&[]));
    let mut se = 0f64;
    let mut n = 0u64;
    for (p, q) in a.chunks_exact(4).zip(b.chunks_exact(4)) {
        for c in 0..3 {
            let d = f64::from(p[c]) - f64::from(q[c]);
            se += d * d;
        }
        n += 3;
    }
    if se == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64 * 255.0 * n.max(1) as f64 / se).log10()
    }
}

/// What the pictures read off a screen say of the moving content.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quality {
    /// Pictures taken.
    pub pictures: usize,
    /// Of them, those whose stripe named a frame.
    pub read: usize,
    /// Distinct frames among those.
    pub distinct: usize,
    /// Mean and lowest SSIM of the read ones against their frames.
    pub ssim_mean: f64,
    /// Lowest SSIM.
    pub ssim_min: f64,
    /// Mean PSNR (dB; infinite ones count as 99).
    pub psnr_mean: f64,
}

/// Scores `pictures` (BGRX, `w`x`h`) against the frames of the test video with `grain` their
/// stripes name.
pub fn score(w: u16, h: u16, grain: u8, pictures: &[Vec<u8>]) -> Result<Quality> {
    let (wu, hu) = (usize::from(w), usize::from(h));
    let marked: Vec<(u32, &Vec<u8>)> = pictures
        .iter()
        .filter_map(|p| Some((read_mark(p, wu)?, p)))
        .collect();
    let numbers: Vec<u32> = marked.iter().map(|(n, _)| *n).collect();
    let refs = reference_frames(w, h, grain, &numbers)?;
    let (mut ssims, mut psnrs) = (Vec::new(), Vec::new());
    for (n, p) in &marked {
        let Some((_, r)) = refs.iter().find(|(m, _)| m == n) else {
            continue;
        };
        ssims.push(ssim(r, p, wu, hu, MARK_ROWS));
        psnrs.push(psnr(r, p, wu, MARK_ROWS).min(99.0));
    }
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    Ok(Quality {
        pictures: pictures.len(),
        read: marked.len(),
        distinct: refs.len(),
        ssim_mean: mean(&ssims),
        ssim_min: ssims.iter().copied().fold(f64::NAN, f64::min),
        psnr_mean: mean(&psnrs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BGRX picture `w`x`h` whose stripe names `n`, grey elsewhere.
    fn marked(w: usize, h: usize, n: u32) -> Vec<u8> {
        let mut p = vec![128u8; w * h * 4];
        for k in 0..2 * MARK_BITS {
            let bit = (n >> (k % MARK_BITS)) & 1 == 1;
            let white = if k < MARK_BITS { bit } else { !bit };
            for y in 0..MARK_BLOCK {
                for x in k * MARK_BLOCK..(k + 1) * MARK_BLOCK {
                    let i = (y * w + x) * 4;
                    p[i..i + 3].fill(if white { 255 } else { 0 });
                }
            }
        }
        p
    }

    #[test]
    fn a_stripe_reads_back_and_a_garbled_one_does_not() {
        for n in [0, 1, 5, 85, 1000, (1 << MARK_BITS) - 1] {
            assert_eq!(read_mark(&marked(700, 20, n), 700), Some(n));
        }
        // One block of the inverted half flipped: the halves disagree.
        let mut p = marked(700, 20, 85);
        let x = (MARK_BITS + 3) * MARK_BLOCK + 8;
        for y in 0..MARK_BLOCK {
            let i = (y * 700 + x - 4) * 4;
            let v = p[i];
            p[i..i + 32].fill(255 - v);
        }
        assert_eq!(read_mark(&p, 700), None);
        // Grey (a smeared picture), or too narrow a screen: no number.
        assert_eq!(read_mark(&vec![128u8; 700 * 20 * 4], 700), None);
        assert_eq!(read_mark(&marked(700, 20, 3), 600), None);
    }

    #[test]
    fn ssim_and_psnr_tell_equal_from_degraded() {
        let (w, h) = (64, 48);
        let a: Vec<u8> = (0..w * h * 4).map(|i| ((i * 37) % 251) as u8).collect();
        assert!((ssim(&a, &a, w, h, 0) - 1.0).abs() < 1e-9);
        assert!(psnr(&a, &a, w, 0).is_infinite());
        // Noise of up to ±24 on every value (a fixed sequence).
        let mut b = a.clone();
        let mut r = 12345u32;
        for v in b.iter_mut() {
            r = r.wrapping_mul(1_103_515_245).wrapping_add(12345);
            *v = (i32::from(*v) + (r >> 16) as i32 % 49 - 24).clamp(0, 255) as u8;
        }
        let (s, p) = (ssim(&a, &b, w, h, 0), psnr(&a, &b, w, 0));
        assert!(s < 0.99 && s > 0.5, "{s}");
        assert!(p < 40.0 && p > 20.0, "{p}");
        // A flat picture against the pattern: structure gone.
        let c = vec![128u8; w * h * 4];
        assert!(ssim(&a, &c, w, h, 0) < 0.1);
    }

    /// The real ffmpeg: a rendered frame carries its own number, and rendering is
    /// deterministic (the same frame twice is the same bytes).
    #[test]
    fn rendered_frames_carry_their_numbers() {
        let frames = reference_frames(640, 64, 12, &[7, 3, 7]).expect("ffmpeg renders frames");
        assert_eq!(frames.iter().map(|f| f.0).collect::<Vec<_>>(), [3, 7]);
        for (n, f) in &frames {
            assert_eq!(f.len(), 640 * 64 * 4);
            assert_eq!(read_mark(f, 640), Some(*n));
        }
        let again = reference_frames(640, 64, 12, &[7]).expect("ffmpeg renders frames");
        assert_eq!(again[0].1, frames[1].1);
        assert!(ssim(&frames[0].1, &frames[1].1, 640, 64, MARK_ROWS) < 0.9);
        let q =
            score(640, 64, 12, &[frames[1].1.clone(), vec![0u8; 640 * 64 * 4]]).expect("scores");
        assert_eq!((q.pictures, q.read, q.distinct), (2, 1, 1));
        assert!((q.ssim_mean - 1.0).abs() < 1e-9 && q.psnr_mean == 99.0);
    }
}
