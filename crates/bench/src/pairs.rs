//! `ndd bench pairs`: throughput of each pair's forward and inverse half on 1 KB, 64 KB and
//! 1 MB frames, next to memcpy in the same run.

use super::{hardware, today};
use anyhow::{Context, Result};
use bytes::Bytes;
use ndd_core::{Frame, Meta, Pair, Role, Stack};
use ndd_modules::ModuleConfig;
use serde::Deserialize;
use std::path::Path;
use std::time::{Duration, Instant};

const SIZES: [usize; 3] = [1 << 10, 64 << 10, 1 << 20];

fn size_name(s: usize) -> String {
    match s {
        s if s >= 1 << 20 => format!("{} MiB", s >> 20),
        s => format!("{} KiB", s >> 10),
    }
}

/// The representative configuration of every pair, as a user would write it. `KEY` is
/// replaced by a key file made for the run.
pub const CASES: &[(&str, &str)] = &[
    ("pass", r#"{ type = "pass" }"#),
    ("checksum", r#"{ type = "checksum" }"#),
    ("bundle(10)", r#"{ type = "bundle", count = 10 }"#),
    ("compress lz4", r#"{ type = "compress", codec = "lz4" }"#),
    (
        "compress zstd 3",
        r#"{ type = "compress", codec = "zstd", level = 3 }"#,
    ),
    (
        "encrypt aes-256-gcm",
        r#"{ type = "encrypt", key_file = "KEY" }"#,
    ),
    (
        "encrypt chacha20",
        r#"{ type = "encrypt", cipher = "chacha20-poly1305", key_file = "KEY" }"#,
    ),
    ("buffer", r#"{ type = "buffer", min = 5, max = 10 }"#),
    (
        "average u8 × 4",
        r#"{ type = "average", fields = ["u8:avg"], count = 4 }"#,
    ),
    ("periodic(16)", r#"{ type = "periodic", interval_ms = 16 }"#),
    ("latest", r#"{ type = "latest" }"#),
    ("delta", r#"{ type = "delta" }"#),
];

#[derive(Deserialize)]
struct One {
    m: ModuleConfig,
}

/// Parses one case.
pub fn parse_case(toml_inline: &str, key_file: &Path) -> Result<ModuleConfig> {
    let text = format!(
        "m = {}",
        toml_inline.replace("KEY", &key_file.display().to_string())
    );
    Ok(toml::from_str::<One>(&text)
        .with_context(|| format!("bench case {toml_inline}"))?
        .m)
}

/// Screen-like content: rows that repeat with small changes, some noise (compressible about
/// as much as a desktop frame, not as much as zeros).
pub fn content(i: u64, size: usize) -> Vec<u8> {
    let mut s = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..size)
        .map(|j| {
            if j % 97 == 0 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            } else {
                ((j / 64) as u8).wrapping_add(i as u8)
            }
        })
        .collect()
}

/// Forward time, inverse time, wire bytes, frames delivered.
struct Measured {
    fwd: Duration,
    inv: Duration,
    wire: u64,
    delivered: u64,
}

fn measure(cfg: &ModuleConfig, size: usize, n: usize) -> Result<Measured> {
    let pairs: [&dyn Pair; 1] = [cfg];
    let mut src = Stack::build(Role::Source, "bench", &pairs)?;
    let mut sink = Stack::build(Role::Sink, "bench", &pairs)?;
    let frames: Vec<Frame> = (0..n as u64)
        .map(|i| {
            let meta = Meta {
                stream: 1,
                seq: i,
                timestamp_ns: 1_000_000_000 + i * 1_000_000,
                flags: 0,
            };
            Frame::new(meta, &content(i, size))
        })
        .collect();
    let base = Instant::now();
    let mut m = Measured {
        fwd: Duration::ZERO,
        inv: Duration::ZERO,
        wire: 0,
        delivered: 0,
    };
    let mut wire: Vec<(Meta, Bytes)> = Vec::new();
    let mut step = |src: &mut Stack,
                    sink: &mut Stack,
                    m: &mut Measured,
                    now: Instant,
                    frame: Option<Frame>|
     -> Result<()> {
        let t = Instant::now();
        match frame {
            Some(f) => src.handle_frame(now, f)?,
            None => src.flush(now)?,
        }
        src.handle_timeout(now)?;
        let mut out = Vec::new();
        while let Some(w) = src.poll_frame() {
            out.push(w);
        }
        let ctl: Vec<(usize, Bytes)> = std::iter::from_fn(|| src.poll_control()).collect();
        m.fwd += t.elapsed();
        // The link: frames become shared bytes, as they would after a socket read.
        for w in out {
            m.wire += w.len() as u64;
            let meta = w.meta;
            wire.push((meta, w.into_bytes()));
        }
        let t = Instant::now();
        for (layer, msg) in ctl {
            sink.handle_control(now, layer, msg)?;
        }
        for (meta, b) in wire.drain(..) {
            sink.handle_frame(now, Frame::from_bytes(meta, b))?;
        }
        sink.handle_timeout(now)?;
        while let Some(f) = sink.poll_frame() {
            std::hint::black_box(f.payload());
            m.delivered += 1;
        }
        let back: Vec<(usize, Bytes)> = std::iter::from_fn(|| sink.poll_control()).collect();
        m.inv += t.elapsed();
        let t = Instant::now();
        for (layer, msg) in back {
            src.handle_control(now, layer, msg)?;
        }
        m.fwd += t.elapsed();
        Ok(())
    };
    for (i, f) in frames.into_iter().enumerate() {
        // Virtual time runs 1 ms per frame so time-driven pairs behave as in use.
        step(
            &mut src,
            &mut sink,
            &mut m,
            base + Duration::from_millis(i as u64),
            Some(f),
        )?;
    }
    let end = base + Duration::from_millis(n as u64 + 10_000);
    step(&mut src, &mut sink, &mut m, end, None)?;
    let t = Instant::now();
    sink.flush(end)?;
    while sink.poll_frame().is_some() {
        m.delivered += 1;
    }
    m.inv += t.elapsed();
    Ok(m)
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

fn memcpy_gbps(size: usize, n: usize) -> f64 {
    let src = content(0, size);
    let t = Instant::now();
    for _ in 0..n {
        let v = src.clone();
        std::hint::black_box(&v);
    }
    gbps((size * n) as u64, t.elapsed())
}

/// Runs the benchmark and writes `pairs.md` into `out`.
pub fn run(quick: bool, out: &Path) -> Result<()> {
    let budget: usize = if quick { 4 << 20 } else { 256 << 20 };
    let tmp = ndd::demo::TempHome::new("bench-pairs")?;
    let key = tmp.0.join("key");
    ndd::demo::write_key(&key)?;
    let mut md = String::new();
    md += "# Pair throughput (forward and inverse half)\n\n";
    md += &format!(
        "Hardware: {}. Date: {}. Command: `ndd bench pairs{}`.\n\n",
        hardware(),
        today(),
        if quick { " --quick" } else { "" }
    );
    md += "Each pair alone in a stack, in process, one thread: frames of screen-like content \
           (64-byte rows repeating with small changes, 1 % noise) go through the forward \
           half, become shared bytes as after a socket read, and go through the inverse half; \
           control messages are handed across at once. GB/s of input payload per half, \
           next to a memcpy of the same sizes in the same run. `wire/in` is the size on the \
           wire relative to the input. Figures far above memcpy mean the half does no per-byte work \
           (it moves a pointer or slices shared bytes): only its per-frame cost counts, and at \
           1 KiB that is what the first column shows.\n\n";
    md += "| pair |";
    for s in SIZES {
        md += &format!(" {0} fwd | {0} inv |", size_name(s));
    }
    md += " wire/in |\n|---|";
    md += &"---:|".repeat(SIZES.len() * 2 + 1);
    md += "\n| memcpy |";
    for s in SIZES {
        let n = (budget / s).max(16);
        let g = memcpy_gbps(s, n);
        md += &format!(" {g:.2} | – |");
    }
    md += " 1.00 |\n";
    eprintln!("bench pairs: GB/s per half");
    for (label, case) in CASES {
        let cfg = parse_case(case, &key)?;
        let mut row = format!("| `{label}` |");
        let mut ratio = 0.0;
        for s in SIZES {
            let n = (budget / s).max(16);
            let m = measure(&cfg, s, n)
                .with_context(|| format!("bench pairs: {label} at {}", size_name(s)))?;
            let input = (s * n) as u64;
            row += &format!(" {:.2} | {:.2} |", gbps(input, m.fwd), gbps(input, m.inv));
            ratio = m.wire as f64 / input as f64;
            tracing::debug!(label, size = s, delivered = m.delivered, "measured");
        }
        row += &format!(" {ratio:.3} |\n");
        eprint!("{row}");
        md += &row;
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("pairs.md");
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
