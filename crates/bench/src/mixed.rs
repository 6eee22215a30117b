//! `ndd bench links --mixed`: an input-like stream (64 B every 1 ms) alone and beside a bulk
//! stream of 1 MB frames that saturates the link, through ndd over TLS (both sides in one
//! process, loopback), with the in-flight window as shipped and with it as large as the resume
//! buffer (what ndd did before); next to the same experiment on one raw TCP socket, where the
//! small messages are written between the bulk writes. Reports the small stream's one-way
//! p50/p99 and the bulk throughput; writes `links-mixed.md`.

use super::{hardware, hist, p50_p99, today};
use anyhow::{Context, Result};
use ndd::config::Config;
use ndd::demo;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One row: the small stream's p50/p99 in ms, frames, and the bulk GB/s (None alone).
struct Row {
    name: String,
    p50: f64,
    p99: f64,
    small: u64,
    bulk_gbs: Option<f64>,
}

/// The link settings and the input stream's priority a row runs with.
#[derive(Clone, Copy)]
struct Variant {
    flight_min: u64,
    chunk: u64,
    priority: &'static str,
}

/// The driver: `small` input frames at 1 kHz (the stream at `v.priority`), with `bulk` 1 MB
/// frames beside them unless 0 (more than the run takes: the device side stops at
/// [`run_time`], so the bulk stream saturates the link for all of the small stream's time, as
/// the raw baseline's does).
fn mixed_config(small: u64, bulk: u64, v: Variant) -> String {
    let Variant {
        flight_min,
        chunk,
        priority,
    } = v;
    let mut text = format!(
        r#"
driver = "bench-mixed"
[link]
flight_min_bytes = {flight_min}
chunk_bytes = {chunk}
[[stream]]
name = "input"
direction = "device-to-app"
priority = "{priority}"
source = {{ type = "synthetic", size = 64, interval_ms = 1.0, count = {small} }}
sink = {{ type = "null" }}
"#
    );
    if bulk > 0 {
        text += &format!(
            r#"
[[stream]]
name = "bulk"
direction = "device-to-app"
source = {{ type = "synthetic", size = 1000000, interval_ms = 0.0, count = {bulk}, repeat = true }}
sink = {{ type = "null" }}
"#
        );
    }
    text
}

/// Through ndd, both sides in this process.
async fn ndd_mixed(small: u64, bulk: u64, v: Variant) -> Result<Row> {
    let text = mixed_config(small, bulk, v);
    let cfg = Config::parse(&text, Path::new("<bench links --mixed>"))?;
    let (_tx, stop) = tokio::sync::watch::channel(false);
    let run = (bulk > 0).then(|| run_time(small));
    let (_dev, app) = demo::run_loopback(cfg, false, true, None, run, stop).await?;
    let s = &app.streams[0];
    Ok(Row {
        name: String::new(),
        p50: s.latency_p50_ms.unwrap_or(f64::NAN),
        p99: s.latency_p99_ms.unwrap_or(f64::NAN),
        small: s.frames,
        bulk_gbs: app
            .streams
            .get(1)
            .and_then(|b| Some(b.bytes as f64 / b.delivery_span_s.filter(|&x| x > 0.0)? / 1e9)),
    })
}

/// How long the device side runs when a bulk stream is beside the small one: the small
/// stream's time (1 ms a frame) and a margin, after which it stops (its frames all sent).
fn run_time(small: u64) -> Duration {
    Duration::from_millis(small + small / 10 + 1000)
}

/// Through ndd as users run it: two `ndd run` processes (TLS, loopback), the app side's
/// `--stats-json` read back.
async fn ndd_mixed_processes(small: u64, bulk: u64, v: Variant) -> Result<Row> {
    let run = (bulk > 0).then(|| run_time(small));
    let v = two_processes("mixed", &mixed_config(small, bulk, v), false, run).await?;
    row_of(&v, bulk > 0)
}

/// A row from the app side's `--stats-json`: the input stream is the first; with `bulk`, the
/// second stream's throughput.
fn row_of(v: &serde_json::Value, bulk: bool) -> Result<Row> {
    let streams = v["streams"]
        .as_array()
        .context("no streams in the stats JSON")?;
    let f = |i: usize, k: &str| streams.get(i).and_then(|s| s[k].as_f64());
    Ok(Row {
        name: String::new(),
        p50: f(0, "latency_p50_ms").unwrap_or(f64::NAN),
        p99: f(0, "latency_p99_ms").unwrap_or(f64::NAN),
        small: f(0, "frames").unwrap_or(0.0) as u64,
        bulk_gbs: f(1, "bytes")
            .zip(f(1, "delivery_span_s").filter(|&x| x > 0.0))
            .map(|(b, secs)| b / secs / 1e9)
            .filter(|_| bulk),
    })
}

/// Through ndd as two processes, the input stream beside a reliable stream of 1 KB frames at
/// 1 kHz whose sink nobody reads (a `file` sink on a FIFO no program opens): that stream stops
/// at its sink; the input stream must not notice (issue 31, item 4). The app side leaves the
/// stuck sink behind as it ends (5 s after the device side stops). Not `stuck`: the same
/// stream into a `null` sink (the same traffic, a sink that drains).
async fn ndd_beside_stuck_sink(small: u64, v: Variant, stuck: bool) -> Result<Row> {
    let fifo = std::env::temp_dir().join(format!("ndd-bench-stuck-{}.fifo", std::process::id()));
    let _ = std::fs::remove_file(&fifo);
    if stuck {
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .context("cannot run mkfifo")?;
        anyhow::ensure!(made.success(), "mkfifo {} failed", fifo.display());
    }
    let config = mixed_config(small, 0, v)
        + &format!(
            r#"
[[stream]]
name = "stuck"
direction = "device-to-app"
reliability = "reliable"
source = {{ type = "synthetic", size = 1000, interval_ms = 1.0, count = {small} }}
sink = {}
"#,
            if stuck {
                format!(r#"{{ type = "file", path = "{}" }}"#, fifo.display())
            } else {
                r#"{ type = "null" }"#.to_string()
            }
        );
    let v = two_processes("stuck", &config, false, Some(run_time(small))).await;
    let _ = std::fs::remove_file(&fifo);
    row_of(&v?, false)
}

/// Runs `config` as two `ndd run` processes on loopback (TLS, or plain with `insecure`; fresh
/// identities trusting each other, `--once`; the device side stopping after `device_run` if
/// given), within 120 s; the app side's `--stats-json`.
pub(crate) async fn two_processes(
    tag: &str,
    config: &str,
    insecure: bool,
    device_run: Option<Duration>,
) -> Result<serde_json::Value> {
    let exe = super::ndd_exe()?;
    let dir = std::env::temp_dir().join(format!("ndd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let ndd = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new(&exe)
            .args(args)
            .output()
            .context("cannot run ndd")?;
        if !out.status.success() {
            anyhow::bail!(
                "ndd {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let (ha, hd) = (dir.join("app"), dir.join("device"));
    let (ha, hd) = (ha.display().to_string(), hd.display().to_string());
    let fa = ndd(&["id", "--home", &ha])?;
    let fd = ndd(&["id", "--home", &hd])?;
    ndd(&["trust", &fd, "--home", &ha])?;
    ndd(&["trust", &fa, "--home", &hd])?;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string();
    let cfg = dir.join(format!("{tag}.toml"));
    std::fs::write(&cfg, config)?;
    let (cfg, json) = (cfg.display().to_string(), dir.join("app.json"));
    let json_s = json.display().to_string();
    let spawn = |args: &[&str]| {
        tokio::process::Command::new(&exe)
            .args(args)
            .env("NDD_LOG", "error")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start ndd")
    };
    let plain: &[&str] = if insecure { &["--insecure"] } else { &[] };
    let secs = device_run.map(|d| format!("{:.3}", d.as_secs_f64()));
    let run_for: Vec<&str> = match &secs {
        Some(s) => vec!["--duration", s],
        None => vec![],
    };
    let mut app = spawn(
        &[
            &[
                "run",
                &cfg,
                "--side",
                "app",
                "--listen",
                &addr,
                "--home",
                &ha,
                "--once",
                "--stats-json",
                &json_s,
            ],
            plain,
        ]
        .concat(),
    )?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut dev = spawn(
        &[
            &[
                "run",
                &cfg,
                "--side",
                "device",
                "--connect",
                &addr,
                "--home",
                &hd,
                "--once",
            ],
            plain,
            &run_for,
        ]
        .concat(),
    )?;
    let limit = Duration::from_secs(120);
    let (a, d) = tokio::time::timeout(limit, async { (app.wait().await, dev.wait().await) })
        .await
        .context("the two ndd processes did not finish within 120 s")?;
    if !(a?.success() && d?.success()) {
        anyhow::bail!(
            "an ndd process failed (run the config in {} by hand)",
            dir.display()
        );
    }
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&json).with_context(|| format!("cannot read {json_s}"))?,
    )
    .context("the app side's stats JSON")?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(v)
}

fn wall_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The same on one raw TCP socket: a task writes 1 MB bulk messages back to back while
/// another writes a 64-byte message every 1 ms between them (one writer at a time, each
/// message whole); the reader times the small ones. Messages: u32 length, u8 kind, u64 wall
/// clock ns, payload.
async fn raw_mixed(small: u64, bulk: bool) -> Result<Row> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let mut h = hist();
        let mut got = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        let mut bulk_bytes = 0u64;
        let t0 = Instant::now();
        while got < small {
            let mut head = [0u8; 13];
            if s.read_exact(&mut head).await.is_err() {
                break;
            }
            let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
            s.read_exact(&mut buf[..len]).await?;
            let sent = u64::from_be_bytes([
                head[5], head[6], head[7], head[8], head[9], head[10], head[11], head[12],
            ]);
            if head[4] == 0 {
                let _ = h.record(wall_ns().saturating_sub(sent).max(1));
                got += 1;
            } else {
                bulk_bytes += len as u64;
            }
        }
        Ok::<_, std::io::Error>((h, got, bulk_bytes as f64 / t0.elapsed().as_secs_f64()))
    });
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let w = Arc::new(tokio::sync::Mutex::new(s));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bulk_task = bulk.then(|| {
        let (w, done) = (w.clone(), done.clone());
        tokio::spawn(async move {
            let payload = vec![7u8; 1_000_000];
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let mut m = Vec::with_capacity(13 + payload.len());
                m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                m.push(1);
                m.extend_from_slice(&wall_ns().to_be_bytes());
                m.extend_from_slice(&payload);
                if w.lock().await.write_all(&m).await.is_err() {
                    break;
                }
            }
        })
    });
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    for _ in 0..small {
        tick.tick().await;
        let mut m = Vec::with_capacity(13 + 64);
        m.extend_from_slice(&64u32.to_be_bytes());
        m.push(0);
        m.extend_from_slice(&wall_ns().to_be_bytes());
        m.extend_from_slice(&[1u8; 64]);
        w.lock().await.write_all(&m).await?;
    }
    let (h, got, bulk_rate) = reader.await??;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(t) = bulk_task {
        t.abort();
    }
    let (p50, p99) = p50_p99(&h);
    Ok(Row {
        name: String::new(),
        p50: p50 / 1e3,
        p99: p99 / 1e3,
        small: got,
        bulk_gbs: bulk.then_some(bulk_rate / 1e9),
    })
}

/// Runs the mixed experiment and writes `links-mixed.md` into `out`.
pub async fn run(quick: bool, out: &Path) -> Result<()> {
    let small: u64 = if quick { 500 } else { 5000 };
    // More than the run takes (the device side stops at `run_time`).
    let bulk: u64 = 1 << 40;
    let link = ndd::config::LinkConfig::default();
    let shipped = Variant {
        flight_min: link.flight_min_bytes,
        chunk: link.chunk_bytes,
        priority: "high",
    };
    let whole = Variant {
        chunk: 0,
        ..shipped
    };
    let normal = Variant {
        priority: "normal",
        ..shipped
    };
    let before = Variant {
        flight_min: link.resume_buffer_bytes,
        chunk: 0,
        priority: "normal",
    };
    eprintln!("bench links --mixed: {small} × 64 B at 1 kHz, alone and beside 1 MB bulk frames");
    let mut rows = Vec::new();
    let mut add = |name: &str, mut r: Row| {
        r.name = name.to_string();
        eprintln!(
            "  {:<58} small p50 {:>7.3} ms p99 {:>7.3} ms ({} delivered){}",
            r.name,
            r.p50,
            r.p99,
            r.small,
            r.bulk_gbs
                .map(|g| format!(", bulk {g:.2} GB/s"))
                .unwrap_or_default()
        );
        rows.push(r);
    };
    add(
        "raw TCP, small messages alone",
        raw_mixed(small, false).await.context("raw TCP alone")?,
    );
    add(
        "raw TCP, small messages between 1 MB bulk writes",
        raw_mixed(small, true).await.context("raw TCP mixed")?,
    );
    add(
        "ndd TLS, input stream alone",
        ndd_mixed(small, 0, shipped).await.context("ndd alone")?,
    );
    add(
        "ndd TLS, beside a bulk stream, as shipped (input priority high, frames cut in 1 ms chunks)",
        ndd_mixed(small, bulk, shipped).await.context("ndd mixed")?,
    );
    add(
        "ndd TLS, beside a bulk stream, frames whole (chunk_bytes = 0)",
        ndd_mixed(small, bulk, whole)
            .await
            .context("ndd mixed, whole frames")?,
    );
    add(
        "ndd TLS, beside a bulk stream, both priority normal",
        ndd_mixed(small, bulk, normal)
            .await
            .context("ndd mixed, equal priority")?,
    );
    add(
        "ndd TLS, beside a bulk stream, as before (window = resume buffer, frames whole, equal priority)",
        ndd_mixed(small, bulk, before).await.context("ndd mixed, as before")?,
    );
    add(
        "ndd TLS, two processes, input stream alone",
        ndd_mixed_processes(small, 0, shipped)
            .await
            .context("ndd processes alone")?,
    );
    add(
        "ndd TLS, two processes, beside a reliable stream whose sink nobody reads (a FIFO never opened)",
        ndd_beside_stuck_sink(small, shipped, true)
            .await
            .context("ndd processes beside a stuck sink")?,
    );
    add(
        "ndd TLS, two processes, beside the same reliable stream into a sink that drains (null)",
        ndd_beside_stuck_sink(small, shipped, false)
            .await
            .context("ndd processes beside a draining sink")?,
    );
    add(
        "ndd TLS, two processes, beside a bulk stream, as shipped (input priority high, frames cut in 1 ms chunks)",
        ndd_mixed_processes(small, bulk, shipped).await.context("ndd processes mixed")?,
    );
    add(
        "ndd TLS, two processes, beside a bulk stream, frames whole (chunk_bytes = 0)",
        ndd_mixed_processes(small, bulk, whole)
            .await
            .context("ndd processes mixed, whole frames")?,
    );
    add(
        "ndd TLS, two processes, beside a bulk stream, both priority normal",
        ndd_mixed_processes(small, bulk, normal)
            .await
            .context("ndd processes mixed, equal priority")?,
    );
    add(
        "ndd TLS, two processes, beside a bulk stream, as before (window = resume buffer, frames whole, equal priority)",
        ndd_mixed_processes(small, bulk, before).await.context("ndd processes mixed, as before")?,
    );
    let mut md = String::from("# Links: small frames beside a bulk stream\n\n");
    md += &format!(
        "Hardware: {}. Date: {}. Command: `ndd bench links --mixed{}`.\n\n",
        hardware(),
        today(),
        if quick { " --quick" } else { "" }
    );
    md += &format!(
        "An input-like stream ({small} × 64 B, one every 1 ms) alone and beside a bulk stream of \
         1 MB frames sent as fast as the link takes them for all of the small stream's time (a \
         `synthetic` source with `repeat = true`: made once; the device side stops a second after \
         the last small frame), both device→app on one link (ndd: \
         TLS 1.3 on loopback, `null` sinks, both sides in one process, then as two `ndd run` \
         processes; one-way = delivery − source timestamp, same clock; bulk GB/s = its bytes \
         over the time from its first delivery to its last). Baseline in the same run: one raw TCP socket carrying \
         the small messages between back-to-back 1 MB writes. `window = resume buffer` sets \
         `flight_min_bytes` to the resume buffer (16 MiB), as ndd behaved before the in-flight \
         window (and the streams at equal priority, as before stream priorities). `as shipped`: \
         the input stream at `priority = \"high\"` (the default of input-device sources; the \
         bench's synthetic source sets it), its frames leaving before any bulk frame waiting \
         beside them, and large frames cut into chunks of 1 ms of the path (at least `link.chunk_bytes`, 4 KiB; on loopback a 1 MB frame is one chunk once the rate is measured) that \
         an input frame can go between; `frames whole`: the same with `chunk_bytes = 0`; \
         `both priority normal`: round-robin between the two streams. `a sink nobody reads`: \
         beside the input stream a reliable one of {small} × 1 KB at 1 kHz into a `file` sink on \
         a FIFO no program opens, so that stream stops at its sink (its frames wait on the app \
         side, unconfirmed) while the input stream must go on as alone; `a sink that drains`: \
         the same stream into a `null` sink, the same traffic on the link.\n\n| run | small p50 ms | small p99 ms | small delivered | bulk GB/s |\n\
         |---|---:|---:|---:|---:|\n"
    );
    for r in &rows {
        md += &format!(
            "| {} | {:.3} | {:.3} | {} | {} |\n",
            r.name,
            r.p50,
            r.p99,
            r.small,
            r.bulk_gbs.map(|g| format!("{g:.2}")).unwrap_or_default()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("links-mixed.md");
    std::fs::write(&path, md).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
