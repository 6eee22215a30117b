//! `ndd bench links`: one-way time and throughput by link (TCP, TCP+TLS, QUIC, UDP), next to
//! raw TCP and raw UDP measured in the same run.

use super::e2e::{ndd_one_way_on, pacing_ms, raw_tcp_one_way};
use super::{hardware, hist, p50_p99, size_name, today};
use anyhow::{Context, Result};
use ndd::config::Config;
use ndd::demo;
use std::path::Path;
use std::time::{Duration, Instant};

const LINKS: [(&str, &str, bool); 5] = [
    ("TCP (--insecure)", "tcp", true),
    ("TCP + TLS 1.3", "tcp", false),
    ("QUIC", "quic", false),
    ("UDP (--insecure)", "udp", true),
    ("UDP (sealed)", "udp", false),
];

/// The throughput rows' config: `frames` unpaced 1 MB frames on a reliable stream, the
/// payload made once, a `null` sink.
fn throughput_config(transport: &str, frames: u64) -> String {
    format!(
        r#"
driver = "bench-throughput"
[link]
transport = "{transport}"
max_frame_bytes = 4194304
resume_buffer_bytes = 1073741824
[[stream]]
name = "bulk"
direction = "device-to-app"
reliability = "reliable"
source = {{ type = "synthetic", size = 1000000, interval_ms = 0.0, count = {frames}, repeat = true }}
sink = {{ type = "null" }}
"#
    )
}

/// Throughput of 1 MB frames through ndd over one link, in GB/s at the app side.
async fn ndd_throughput(transport: &str, insecure: bool, frames: u64) -> Result<(f64, u64)> {
    let text = throughput_config(transport, frames);
    let cfg = Config::parse(&text, Path::new("<bench links>"))?;
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let t = Instant::now();
    let (_dev, app) = demo::run_loopback(cfg, insecure, true, None, None, stop).await?;
    let s = &app.streams[0];
    // From the first delivery to the last, as the raw baselines time from their first write
    // (after their connect) to the last byte read: the handshake is not the link's throughput.
    // The first frame's bytes arrived at the start of that span, so they do not count.
    let (bytes, secs) = match s.delivery_span_s {
        Some(span) if s.frames > 1 => (s.bytes - s.bytes / s.frames, span),
        _ => (s.bytes, t.elapsed().as_secs_f64()),
    };
    Ok((bytes as f64 / secs / 1e9, s.frames))
}

/// The same over TCP (TLS, or plain with `insecure`) between two `ndd run` processes (each
/// side its own runtime, as users run it; steadier than one process, where both sides share
/// one runtime's threads).
async fn ndd_throughput_processes(frames: u64, insecure: bool) -> Result<(f64, u64)> {
    let v = super::mixed::two_processes("links", &throughput_config("tcp", frames), insecure, None)
        .await?;
    let s = &v["streams"][0];
    let (bytes, got) = (
        s["bytes"].as_u64().unwrap_or(0),
        s["frames"].as_u64().unwrap_or(0),
    );
    let span = s["delivery_span_s"]
        .as_f64()
        .filter(|&x| x > 0.0 && got > 1)
        .context("no delivery span in the app side's stats")?;
    Ok(((bytes - bytes / got) as f64 / span / 1e9, got))
}

/// Runs the benchmark and writes `links.md` into `out`.
pub async fn run(quick: bool, out: &Path) -> Result<()> {
    let n = |size: usize| {
        if quick {
            10
        } else if size >= 100_000 {
            200
        } else {
            500
        }
    };
    let mut md = String::from("# Links: one-way time and throughput (TCP, TLS, QUIC, UDP)\n\n");
    md += &format!(
        "Hardware: {}. Date: {}. Command: `ndd bench links{}`.\n\n",
        hardware(),
        today(),
        if quick { " --quick" } else { "" }
    );
    md += &format!("## One-way time by message size\n\nBoth sides in one process on 127.0.0.1, paced \
           synthetic source (`repeat = true`: its payload made once), empty stack, `null` sink; one-way = delivery − source timestamp \
           (same clock); p50 / p99 in µs{}. Baselines, same run: raw TCP ping-pong and raw TLS 1.3 ping-pong \
           (rustls with ndd's configuration, no ndd framing or session), RTT/2 (the issue's \
           yardstick: both threads busy, never idle); and the same sockets paced as ndd's \
           source is (one message every max(2 ms, size / 50 MB/s), a sender task and a receiver \
           task on the same runtime, one-way = arrival − send time): the like-for-like \
           baseline, where threads sleep between messages and each message pays their \
           wake-ups.\n\n", if quick {
               " (one round, --quick)"
           } else {
               ", each the median of 3 rounds' figures, the rounds interleaved across columns"
           });
    md += "| size | raw TCP RTT/2 | raw TLS RTT/2 | raw TCP paced | raw TLS paced |";
    for (name, _, _) in LINKS {
        md += &format!(" {name} |");
    }
    md += "\n|---:|---:|---:|---:|---:|";
    md += &"---:|".repeat(LINKS.len());
    md += "\n";
    eprintln!("bench links: one-way µs p50 / p99");
    // Every column is measured `rounds` times per size, the rounds interleaved across the
    // columns (a slow moment of the machine hits them alike); the medians of the rounds' p50s
    // and p99s are reported.
    let rounds = if quick { 1 } else { 3 };
    for size in [100usize, 1_000, 10_000, 100_000, 1_000_000] {
        let mut cols: Vec<Vec<(f64, f64)>> = vec![Vec::new(); 4 + LINKS.len()];
        for _ in 0..rounds {
            cols[0].push(p50_p99(
                &raw_tcp_one_way(size, n(size)).await.context("raw TCP")?,
            ));
            let period = Duration::from_secs_f64(pacing_ms(size) / 1e3);
            let raws = [
                crate::raw_link::raw_tls_one_way_ns(size, n(size))
                    .await
                    .context("raw TLS")?,
                crate::raw_link::raw_tcp_paced_one_way_ns(size, n(size), period)
                    .await
                    .context("raw TCP paced")?,
                crate::raw_link::raw_tls_paced_one_way_ns(size, n(size), period)
                    .await
                    .context("raw TLS paced")?,
            ];
            for (k, ns) in raws.into_iter().enumerate() {
                let mut h = hist();
                for ns in ns {
                    h.saturating_record(ns);
                }
                cols[1 + k].push(p50_p99(&h));
            }
            for (k, (name, t, insecure)) in LINKS.iter().enumerate() {
                cols[4 + k].push(
                    ndd_one_way_on(size, n(size), *insecure, t)
                        .await
                        .with_context(|| format!("{name} at {}", size_name(size)))?,
                );
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let mut row = format!("| {} |", size_name(size));
        for c in cols {
            let (mut a, mut b): (Vec<f64>, Vec<f64>) = c.into_iter().unzip();
            row += &format!(" {:.0} / {:.0} |", median(&mut a), median(&mut b));
        }
        row += "\n";
        eprint!("{row}");
        md += &row;
    }
    // 3000 (3 GB): at 5–10 GB/s 1000 frames took 100–200 ms, and a run's figure moved by
    // half between rounds.
    let frames: u64 = if quick { 20 } else { 3000 };
    md += &format!(
        "\n## Throughput, 1 MB frames\n\n{frames} frames of 1 MB, unpaced, through ndd (empty \
         stack, `null` sink, a reliable stream on every link, a `synthetic` source with \
         `repeat = true`: its payload made once, as the raw baselines write one buffer), timed \
         from the first delivery to the last (the bytes after the first frame); next to raw TCP (1 MB writes), raw TLS 1.3 (rustls with ndd's \
         configuration, no ndd framing or session), raw QUIC (one quinn stream, ndd's QUIC \
         configuration) and raw UDP (largest datagrams) in the same \
         run. Each row {rounds_text}.\n\n| link | GB/s (median) | range | frames delivered |\n\
         |---|---:|---:|---:|\n",
        rounds_text = if quick {
            "is one run (--quick)"
        } else {
            "is the median of 5 runs, the rounds interleaved across rows"
        }
    );
    // Every row is measured `rounds` times, the rounds interleaved (so a slow moment of the
    // machine hits every row alike); the median is reported with the range.
    let rounds = if quick { 1 } else { 5 };
    let names: Vec<String> = [
        "raw TCP (1 MB writes)".to_string(),
        "raw TLS 1.3 (rustls over TCP, ndd's TLS configuration, 1 MB writes)".to_string(),
        "raw QUIC (one quinn stream, ndd's QUIC configuration, 1 MB writes)".to_string(),
        "raw UDP (65 000-byte datagrams)".to_string(),
    ]
    .into_iter()
    .chain(LINKS.iter().map(|(name, _, _)| format!("ndd {name}")))
    .chain([
        "ndd TCP (--insecure), two `ndd run` processes".to_string(),
        "ndd TCP + TLS 1.3, two `ndd run` processes".to_string(),
    ])
    .collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut delivered: Vec<String> = vec![String::new(); names.len()];
    for _ in 0..rounds {
        let mut k = 0;
        let mut put = |gbs: f64, got: String| {
            rates[k].push(gbs);
            delivered[k] = got;
            k += 1;
        };
        let t = crate::raw_link::raw_tcp_throughput(1_000_000, frames)
            .await
            .context("raw TCP throughput")?;
        put(t.bytes_per_sec() / 1e9, format!("{}", t.frames_received));
        let t = crate::raw_link::raw_tls_throughput(1_000_000, frames)
            .await
            .context("raw TLS throughput")?;
        put(t.bytes_per_sec() / 1e9, format!("{}", t.frames_received));
        let t = crate::raw_link::raw_quic_throughput(1_000_000, frames)
            .await
            .context("raw QUIC throughput")?;
        put(t.bytes_per_sec() / 1e9, format!("{}", t.frames_received));
        let t = crate::raw_link::raw_udp_throughput(65_000, frames * 16)
            .await
            .context("raw UDP throughput")?;
        put(
            t.bytes_per_sec() / 1e9,
            format!("loss {:.1} %", t.loss() * 100.0),
        );
        for (name, t, insecure) in LINKS {
            let (g, got) = ndd_throughput(t, insecure, frames)
                .await
                .with_context(|| format!("{name} throughput"))?;
            put(g, format!("{got} of {frames}"));
        }
        for (insecure, what) in [(true, "plain TCP"), (false, "TLS")] {
            let (g, got) = ndd_throughput_processes(frames, insecure)
                .await
                .with_context(|| format!("{what} throughput, two processes"))?;
            put(g, format!("{got} of {frames}"));
        }
    }
    for ((name, mut r), got) in names.iter().zip(rates).zip(delivered) {
        r.sort_by(f64::total_cmp);
        let (lo, mid, hi) = (r[0], r[r.len() / 2], r[r.len() - 1]);
        let row = format!("| {name} | {mid:.2} | {lo:.2}–{hi:.2} | {got} |\n");
        eprint!("{row}");
        md += &row;
    }
    md += "\nEvery link delivers every frame (UDP retransmits what a burst loses to socket \
           buffer overflow, paced by its congestion window). TLS, QUIC and sealed UDP \
           (ChaCha20-Poly1305 on every datagram) encrypt and authenticate; `--insecure` links \
           do not. The rows above it run both sides in this process (sharing its runtime's two \
           threads); the last two rows run them as two `ndd run` processes, as users do.\n";
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("links.md");
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
