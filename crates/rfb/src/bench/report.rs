//! Statistics, the markdown table and a hand-written SVG plot.

use std::fmt::Write as _;

use super::BenchRow;

/// Median, mean and sample standard deviation of the time per update (ms).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    pub n: usize,
    pub median: f64,
    pub mean: f64,
    pub sd: f64,
    /// Mean bytes per update.
    pub bytes_per_update: f64,
}

impl Stats {
    pub fn of(xs: &[f64], bytes: u64) -> Stats {
        if xs.is_empty() {
            return Stats::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Stats {
            n,
            median,
            mean,
            sd: var.sqrt(),
            bytes_per_update: bytes as f64 / n as f64,
        }
    }
}

/// Seed 001, Table 1: latency (ms); unmodified median, mean, sd; accelerated median, mean, sd.
pub const PAPER_TABLE1: [(u64, [f64; 6]); 11] = [
    (0, [76.9, 77.3, 4.5, 76.0, 76.1, 2.6]),
    (10, [96.8, 101.5, 26.7, 75.9, 76.3, 7.6]),
    (20, [138.6, 150.5, 69.3, 75.9, 77.2, 14.5]),
    (30, [198.7, 225.3, 122.1, 75.9, 76.8, 22.0]),
    (40, [258.4, 301.4, 174.9, 75.9, 79.6, 41.9]),
    (50, [318.6, 382.4, 235.0, 76.0, 80.2, 45.3]),
    (100, [620.5, 925.7, 1117.9, 83.1, 111.8, 172.0]),
    (150, [920.6, 1544.6, 1243.3, 86.4, 128.3, 187.1]),
    (200, [1220.2, 2313.1, 1861.8, 79.5, 157.6, 317.9]),
    (250, [1520.8, 3183.6, 2500.7, 79.2, 182.4, 366.5]),
    (300, [1820.9, 3723.3, 2842.7, 80.4, 252.7, 694.2]),
];

fn paper(lat: u64) -> Option<[f64; 6]> {
    PAPER_TABLE1
        .iter()
        .find(|(l, _)| *l == lat)
        .map(|(_, v)| *v)
}

pub(super) struct RunInfo {
    pub command: String,
    pub rounds: usize,
    pub updates_per_round: usize,
    pub geometry: String,
}

fn hardware() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {kernel}")
}

/// Today's UTC date, from the system clock.
fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

pub(super) fn markdown(rows: &[BenchRow], info: &RunInfo) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# RFB Message Accelerator: time per update vs latency\n");
    let _ = writeln!(
        s,
        "Measured {} on {}.  \nCommand: `{}`\n",
        today(),
        hardware(),
        info.command
    );
    let _ = writeln!(
        s,
        "Setup: TigerVNC `Xvnc` ({}, depth 24, security None) showing `ffplay` playing the lavfi \
         `testsrc2` pattern (320x240, 30 fps). A built-in classic viewer (Raw encoding, 32 bpp; \
         reads a whole update, then requests the next incremental one) measures each loop \
         iteration. A built-in delay proxy adds the one-way latency to every chunk in both \
         directions, preserving order (no bandwidth limit). The accelerator runs next to the \
         server, as in the paper. Each latency alternates unmodified and accelerated runs \
         ({} rounds x {} updates each; the first, full-screen update of every run is excluded).\n",
        info.geometry, info.rounds, info.updates_per_round
    );
    let _ = writeln!(s, "All times in ms per update.\n");
    let _ = writeln!(
        s,
        "| one-way latency | unmodified median | mean | sd | accelerated median | mean | sd | paper unmodified median | mean | sd | paper accelerated median | mean | sd |"
    );
    let _ = writeln!(
        s,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        let p = paper(r.latency_ms)
            .map(|p| {
                p.iter()
                    .map(|x| format!("{x:.1}"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            })
            .unwrap_or_else(|| "– | – | – | – | – | –".into());
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {:.1} | **{:.1}** | **{:.1}** | {:.1} | {} |",
            r.latency_ms,
            r.unmodified.median,
            r.unmodified.mean,
            r.unmodified.sd,
            r.accelerated.median,
            r.accelerated.mean,
            r.accelerated.sd,
            p
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| one-way latency | updates measured (unmod. / accel.) | KiB per update (unmod. / accel.) |"
    );
    let _ = writeln!(s, "|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} / {} | {:.0} / {:.0} |",
            r.latency_ms,
            r.unmodified.n,
            r.accelerated.n,
            r.unmodified.bytes_per_update / 1024.0,
            r.accelerated.bytes_per_update / 1024.0
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        if first.latency_ms == 0 && first.accelerated.median > 0.0 {
            let _ = writeln!(
                s,
                "\nAccelerated at {} ms vs 0 ms: median {:+.1} %, mean {:+.1} % (target: within ±10 %; \
                 the paper's mean grew by {:+.0} %).",
                last.latency_ms,
                100.0 * (last.accelerated.median / first.accelerated.median - 1.0),
                100.0 * (last.accelerated.mean / first.accelerated.mean - 1.0),
                100.0 * (252.7 / 76.1 - 1.0)
            );
        }
    }
    let _ = writeln!(s, "\n![time per update vs latency](rfb.svg)");
    s
}

pub(super) fn svg(rows: &[BenchRow]) -> String {
    let (w, h) = (760.0, 440.0);
    let (l, r, t, b) = (70.0, 200.0, 30.0, 50.0);
    let (pw, ph) = (w - l - r, h - t - b);
    let xmax = rows
        .iter()
        .map(|r| r.latency_ms)
        .max()
        .unwrap_or(300)
        .max(1) as f64;
    // Log scale from 10 ms to 10 s.
    let (ymin, ymax) = (10f64.log10(), 10_000f64.log10());
    let x = |lat: f64| l + pw * lat / xmax;
    let y = |ms: f64| t + ph * (1.0 - (ms.max(10.0).log10() - ymin) / (ymax - ymin));
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    for ms in [10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0] {
        let yy = y(ms);
        let _ = writeln!(
            s,
            r##"<line x1="{l}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{ms}</text>"##,
            l + pw,
            l - 6.0,
            yy + 4.0
        );
    }
    for r0 in rows {
        let xx = x(r0.latency_ms as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" x2="{xx:.1}" y1="{t}" y2="{}" stroke="#eee"/><text x="{xx:.1}" y="{}" text-anchor="middle">{}</text>"##,
            t + ph,
            t + ph + 16.0,
            r0.latency_ms
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">one-way latency (ms)</text>"#,
        l + pw / 2.0,
        h - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">ms per update (log)</text>"#,
        t + ph / 2.0,
        t + ph / 2.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="18" text-anchor="middle" font-weight="bold">RFB time per update vs latency</text>"#,
        l + pw / 2.0
    );
    type Series = (&'static str, &'static str, &'static str, Vec<(f64, f64)>);
    let ours = |f: fn(&BenchRow) -> f64| {
        rows.iter()
            .map(|r| (r.latency_ms as f64, f(r)))
            .collect::<Vec<_>>()
    };
    let paper_pts = |i: usize| {
        PAPER_TABLE1
            .iter()
            .filter(|(l, _)| (*l as f64) <= xmax)
            .map(|(l, v)| (*l as f64, v[i]))
            .collect::<Vec<_>>()
    };
    let series: Vec<Series> = vec![
        (
            "unmodified median",
            "#c0392b",
            "",
            ours(|r| r.unmodified.median),
        ),
        (
            "unmodified mean",
            "#c0392b",
            "2,3",
            ours(|r| r.unmodified.mean),
        ),
        (
            "accelerated median",
            "#2471a3",
            "",
            ours(|r| r.accelerated.median),
        ),
        (
            "accelerated mean",
            "#2471a3",
            "2,3",
            ours(|r| r.accelerated.mean),
        ),
        ("paper unmodified median", "#e59866", "8,4", paper_pts(0)),
        ("paper accelerated median", "#7fb3d5", "8,4", paper_pts(3)),
    ];
    for (i, (name, colour, dash, pts)) in series.iter().enumerate() {
        let path: Vec<String> = pts
            .iter()
            .map(|(a, v)| format!("{:.1},{:.1}", x(*a), y(*v)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
            path.join(" ")
        );
        for (a, v) in pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{colour}"/>"#,
                x(*a),
                y(*v)
            );
        }
        let ly = t + 10.0 + 20.0 * i as f64;
        let lx = l + pw + 12.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" x2="{}" y1="{ly}" y2="{ly}" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}">{name}</text>"#,
            lx + 24.0,
            lx + 30.0,
            ly + 4.0
        );
    }
    let _ = writeln!(s, "</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_small_samples() {
        let s = Stats::of(&[1.0, 2.0, 3.0, 10.0], 400);
        assert_eq!(s.median, 2.5);
        assert_eq!(s.mean, 4.0);
        assert!((s.sd - 4.0826).abs() < 1e-3);
        assert_eq!(s.bytes_per_update, 100.0);
        assert_eq!(Stats::of(&[], 0), Stats::default());
    }

    #[test]
    fn date_looks_like_a_date() {
        let d = today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"));
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let rows = vec![BenchRow {
            latency_ms: 0,
            unmodified: Stats::of(&[30.0], 1),
            accelerated: Stats::of(&[30.0], 1),
        }];
        let s = svg(&rows);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
    }
}
