//! `ndd bench rfb`: time per update of a classic client-pull viewer against a real Xvnc showing
//! moving content, through a delay proxy adding one-way latency in both directions, without and
//! with the accelerator, alternating (seed 001, Table 1).

pub mod harness;
mod report;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::info;

use crate::accel::{serve_accel, AccelOptions};
use crate::client::{emit_set_encodings, emit_set_pixel_format};
use crate::proto::{enc, PixelFormat, UpdateRequest};
use crate::RfbError;
use harness::{local_listener, missing_programs, Proc, XServer};

pub use report::{Stats, PAPER_TABLE1};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Few updates and latencies (under a minute).
    pub quick: bool,
    /// Where `rfb.md` and `rfb.svg` go.
    pub out_dir: PathBuf,
    /// One-way latencies in ms; empty means the default set.
    pub latencies_ms: Vec<u64>,
    /// Updates measured per latency and mode, summed over rounds; 0 means the default.
    pub updates: usize,
    /// Alternations of unmodified and accelerated runs per latency; 0 means the default.
    pub rounds: usize,
    /// The command line recorded in the report.
    pub command: String,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            quick: false,
            out_dir: PathBuf::from("docs/bench"),
            latencies_ms: Vec::new(),
            updates: 0,
            rounds: 0,
            command: "ndd bench rfb".into(),
        }
    }
}

/// One latency's figures.
#[derive(Debug, Clone)]
pub struct BenchRow {
    pub latency_ms: u64,
    pub unmodified: Stats,
    pub accelerated: Stats,
}

/// The result; also written to `out_dir`.
#[derive(Debug, Clone)]
pub struct BenchReport {
    pub rows: Vec<BenchRow>,
    pub markdown: PathBuf,
    pub svg: PathBuf,
}

const GEOMETRY: &str = "640x480";

/// Run the benchmark. Needs `Xvnc` (tigervnc-standalone-server) and `ffplay` (ffmpeg).
pub async fn bench(opts: BenchOptions) -> Result<BenchReport, RfbError> {
    let missing = missing_programs(&["Xvnc", "ffplay"]);
    if !missing.is_empty() {
        return Err(RfbError::Bench(format!(
            "missing programs {missing:?}: apt-get install tigervnc-standalone-server ffmpeg"
        )));
    }
    let latencies = if !opts.latencies_ms.is_empty() {
        opts.latencies_ms.clone()
    } else if opts.quick {
        vec![0, 100, 300]
    } else {
        vec![0, 10, 20, 50, 100, 200, 300]
    };
    let rounds = if opts.rounds > 0 {
        opts.rounds
    } else if opts.quick {
        1
    } else {
        3
    };
    let updates = if opts.updates > 0 {
        opts.updates
    } else if opts.quick {
        20
    } else {
        150
    };
    let per_round = updates.div_ceil(rounds).max(2);

    let xvnc = XServer::xvnc(GEOMETRY).await?;
    let mut content = Proc::spawn(
        "ffplay",
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=320x240:rate=30",
            "-an",
            "-nostats",
            "-loglevel",
            "error",
            "-left",
            "0",
            "-top",
            "0",
            "-noborder",
        ],
        Some(xvnc.display),
    )?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    if !content.alive() {
        return Err(RfbError::Bench("ffplay exited at start".into()));
    }
    let server = xvnc.rfb_addr();
    let accel_listener = local_listener().await?;
    let accel_addr = accel_listener.local_addr()?;
    let accel = tokio::spawn(serve_accel(
        accel_listener,
        server.to_string(),
        AccelOptions::default(),
    ));

    let mut rows = Vec::new();
    for &lat in &latencies {
        let latency = Duration::from_millis(lat);
        let (mut plain, mut fast) = (Vec::new(), Vec::new());
        let (mut plain_bytes, mut fast_bytes) = (0u64, 0u64);
        for _ in 0..rounds {
            for accelerated in [false, true] {
                let upstream = if accelerated { accel_addr } else { server };
                let listener = local_listener().await?;
                let addr = listener.local_addr()?;
                let proxy = tokio::spawn(delay_proxy(listener, upstream, latency));
                let limit = Duration::from_secs(30)
                    + (latency * 2 + Duration::from_secs(1)) * per_round as u32;
                let r = tokio::time::timeout(limit, classic_viewer(addr, per_round)).await;
                proxy.abort();
                let run = r.map_err(|_| RfbError::Timeout(format!("viewer run at {lat} ms")))??;
                if accelerated {
                    fast.extend(run.times_ms);
                    fast_bytes += run.bytes;
                } else {
                    plain.extend(run.times_ms);
                    plain_bytes += run.bytes;
                }
            }
        }
        let row = BenchRow {
            latency_ms: lat,
            unmodified: Stats::of(&plain, plain_bytes),
            accelerated: Stats::of(&fast, fast_bytes),
        };
        info!(
            latency_ms = lat,
            unmodified_median = row.unmodified.median,
            accelerated_median = row.accelerated.median,
            "rfb bench latency done"
        );
        eprintln!(
            "latency {:>3} ms: unmodified median {:>7.1} mean {:>7.1} sd {:>7.1} | accelerated median {:>6.1} mean {:>6.1} sd {:>6.1} ms/update",
            lat,
            row.unmodified.median,
            row.unmodified.mean,
            row.unmodified.sd,
            row.accelerated.median,
            row.accelerated.mean,
            row.accelerated.sd
        );
        rows.push(row);
    }
    accel.abort();
    drop(content);
    drop(xvnc);

    std::fs::create_dir_all(&opts.out_dir)?;
    let markdown = opts.out_dir.join("rfb.md");
    let svg = opts.out_dir.join("rfb.svg");
    let info = report::RunInfo {
        command: opts.command.clone(),
        rounds,
        updates_per_round: per_round,
        geometry: GEOMETRY.into(),
    };
    std::fs::write(&markdown, report::markdown(&rows, &info))?;
    std::fs::write(&svg, report::svg(&rows))?;
    Ok(BenchReport {
        rows,
        markdown,
        svg,
    })
}

/// Forward connections to `upstream`, delaying every chunk by `latency` in each direction,
/// preserving order (a chunk is written no earlier than `latency` after it was read).
pub async fn delay_proxy(listener: TcpListener, upstream: SocketAddr, latency: Duration) {
    while let Ok((down, _)) = listener.accept().await {
        tokio::spawn(async move {
            let Ok(up) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = down.set_nodelay(true);
            let _ = up.set_nodelay(true);
            let (dr, dw) = down.into_split();
            let (ur, uw) = up.into_split();
            tokio::join!(delay_pipe(dr, uw, latency), delay_pipe(ur, dw, latency));
        });
    }
}

async fn delay_pipe(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    latency: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0
                || tx
                    .send((tokio::time::Instant::now() + latency, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if w.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// One viewer run.
#[derive(Debug, Clone)]
pub struct ViewerRun {
    /// Time per update (loop iteration), ms; the first (full-screen) update is excluded.
    pub times_ms: Vec<f64>,
    pub bytes: u64,
}

/// A client that behaves like the classic single-threaded viewer: Raw encoding; read a whole
/// update (copying the pixels into its framebuffer), then request the next incremental update.
pub async fn classic_viewer(addr: SocketAddr, updates: usize) -> Result<ViewerRun, RfbError> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let (r, mut w) = s.into_split();
    let mut r = BufReader::with_capacity(64 << 10, r);
    let bad = |m: &str| RfbError::Bench(format!("viewer: {m}"));
    let mut v = [0u8; 12];
    r.read_exact(&mut v).await?;
    w.write_all(b"RFB 003.008\n").await?;
    let n = r.read_u8().await?;
    let mut types = vec![0u8; usize::from(n)];
    r.read_exact(&mut types).await?;
    if !types.contains(&1) {
        return Err(bad("server does not offer security type None"));
    }
    w.write_all(&[1]).await?;
    if r.read_u32().await? != 0 {
        return Err(bad("security result failed"));
    }
    w.write_all(&[1]).await?;
    let mut init = [0u8; 24];
    r.read_exact(&mut init).await?;
    let (fw, fh) = (
        u16::from_be_bytes([init[0], init[1]]),
        u16::from_be_bytes([init[2], init[3]]),
    );
    let name_len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]);
    let mut name = vec![0u8; name_len.min(4096) as usize];
    r.read_exact(&mut name).await?;
    let pf = PixelFormat::default();
    w.write_all(&emit_set_pixel_format(&pf)).await?;
    w.write_all(&emit_set_encodings(&[enc::RAW])).await?;
    let full = UpdateRequest {
        incremental: false,
        x: 0,
        y: 0,
        w: fw,
        h: fh,
    };
    w.write_all(&full.emit()).await?;
    let next = UpdateRequest {
        incremental: true,
        ..full
    }
    .emit();
    let stride = usize::from(fw) * 4;
    let mut fb = vec![0u8; stride * usize::from(fh)];
    let mut times = Vec::with_capacity(updates);
    let mut bytes = 0u64;
    let mut last = Instant::now();
    let mut first = true;
    while times.len() < updates {
        let t = r.read_u8().await?;
        match t {
            0 => {
                let _pad = r.read_u8().await?;
                let nrects = r.read_u16().await?;
                let mut got = 4u64;
                for _ in 0..nrects {
                    let mut h = [0u8; 12];
                    r.read_exact(&mut h).await?;
                    let x = usize::from(u16::from_be_bytes([h[0], h[1]]));
                    let y = usize::from(u16::from_be_bytes([h[2], h[3]]));
                    let rw = usize::from(u16::from_be_bytes([h[4], h[5]]));
                    let rh = usize::from(u16::from_be_bytes([h[6], h[7]]));
                    let e = i32::from_be_bytes([h[8], h[9], h[10], h[11]]);
                    if e != enc::RAW || x + rw > usize::from(fw) || y + rh > usize::from(fh) {
                        return Err(bad("unexpected rectangle"));
                    }
                    for row in y..y + rh {
                        let at = row * stride + x * 4;
                        r.read_exact(&mut fb[at..at + rw * 4]).await?;
                    }
                    got += 12 + (rw * rh * 4) as u64;
                }
                let now = Instant::now();
                if first {
                    first = false;
                } else {
                    times.push(now.duration_since(last).as_secs_f64() * 1000.0);
                    bytes += got;
                }
                last = now;
                w.write_all(&next).await?;
            }
            2 => {}
            3 => {
                let mut h = [0u8; 7];
                r.read_exact(&mut h).await?;
                let len = u32::from_be_bytes([h[3], h[4], h[5], h[6]]);
                let mut text = vec![0u8; (len as i32).unsigned_abs().min(16 << 20) as usize];
                r.read_exact(&mut text).await?;
            }
            other => return Err(bad(&format!("unexpected message type {other}"))),
        }
    }
    std::hint::black_box(&fb);
    Ok(ViewerRun {
        times_ms: times,
        bytes,
    })
}
