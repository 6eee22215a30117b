//! `ndd bench links`: one-way time and throughput by link (TCP, TCP+TLS, QUIC, UDP), next to
//! raw TCP and raw UDP measured in the same run.

use super::e2e::{ndd_one_way_on, raw_tcp_one_way};
use super::{hardware, p50_p99, size_name, today};
use crate::config::Config;
use crate::demo;
use anyhow::{Context, Result};
use std::path::Path;
use std::time::Instant;

const LINKS: [(&str, &str, bool); 4] = [
    ("TCP (--insecure)", "tcp", true),
    ("TCP + TLS 1.3", "tcp", false),
    ("QUIC", "quic", false),
    ("UDP", "udp", false),
];

/// Throughput of 1 MB frames through ndd over one link, in GB/s at the app side.
async fn ndd_throughput(transport: &str, insecure: bool, frames: u64) -> Result<(f64, u64)> {
    let size = 1_000_000;
    let text = format!(
        r#"
driver = "bench-throughput"
[link]
transport = "{transport}"
max_frame_bytes = 4194304
resume_buffer_bytes = 1073741824
[[stream]]
name = "bulk"
direction = "device-to-app"
reliability = "{rel}"
source = {{ type = "synthetic", size = {size}, interval_ms = 0.0, count = {frames} }}
sink = {{ type = "null" }}
"#,
        rel = if transport == "udp" {
            "lossy"
        } else {
            "reliable"
        }
    );
    let cfg = Config::parse(&text, Path::new("<bench links>"))?;
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let t = Instant::now();
    let (_dev, app) = demo::run_loopback(&cfg, insecure, true, None, None, stop).await?;
    let secs = t.elapsed().as_secs_f64();
    let s = &app.streams[0];
    Ok((s.bytes as f64 / secs / 1e9, s.frames))
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
    md += "## One-way time by message size\n\nBoth sides in one process on 127.0.0.1, paced \
           synthetic source, empty stack, `null` sink; one-way = delivery − source timestamp \
           (same clock); p50 / p99 in µs. Baseline: raw TCP ping-pong, RTT/2, same run.\n\n";
    md += "| size | raw TCP |";
    for (name, _, _) in LINKS {
        md += &format!(" {name} |");
    }
    md += "\n|---:|---:|";
    md += &"---:|".repeat(LINKS.len());
    md += "\n";
    eprintln!("bench links: one-way µs p50 / p99");
    for size in [100usize, 1_000, 10_000, 100_000, 1_000_000] {
        let (r50, r99) = p50_p99(&raw_tcp_one_way(size, n(size)).await.context("raw TCP")?);
        let mut row = format!("| {} | {r50:.0} / {r99:.0} |", size_name(size));
        for (name, t, insecure) in LINKS {
            let (a, b) = ndd_one_way_on(size, n(size), insecure, t)
                .await
                .with_context(|| format!("{name} at {}", size_name(size)))?;
            row += &format!(" {a:.0} / {b:.0} |");
        }
        row += "\n";
        eprint!("{row}");
        md += &row;
    }
    let frames: u64 = if quick { 20 } else { 300 };
    md += &format!(
        "\n## Throughput, 1 MB frames\n\n{frames} frames of 1 MB, unpaced, through ndd (empty \
         stack, `null` sink; UDP as a lossy stream), timed from start to the last delivery, \
         handshake included; next to raw TCP (1 MB writes) and raw UDP (largest datagrams) in \
         the same run.\n\n| link | GB/s | frames delivered |\n|---|---:|---:|\n"
    );
    let raw_tcp = ndd_link::bench::raw_tcp_throughput(1_000_000, frames)
        .await
        .context("raw TCP throughput")?;
    let raw_udp = ndd_link::bench::raw_udp_throughput(65_000, frames * 16)
        .await
        .context("raw UDP throughput")?;
    md += &format!(
        "| raw TCP | {:.2} | {} |\n",
        raw_tcp.bytes_per_sec() / 1e9,
        frames
    );
    md += &format!(
        "| raw UDP (65 000-byte datagrams) | {:.2} | loss {:.1} % |\n",
        raw_udp.bytes_per_sec() / 1e9,
        raw_udp.loss() * 100.0
    );
    for (name, t, insecure) in LINKS {
        let (g, got) = ndd_throughput(t, insecure, frames)
            .await
            .with_context(|| format!("{name} throughput"))?;
        let row = format!("| ndd {name} | {g:.2} | {got} of {frames} |\n");
        eprint!("{row}");
        md += &row;
    }
    md += "\nUDP carries no retransmission: frames lost to socket buffer overflow on a burst \
           are gone (a lossy stream); QUIC and TCP deliver everything. TLS and QUIC encrypt; \
           `--insecure` and UDP do not (add the `encrypt` pair).\n";
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("links.md");
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
