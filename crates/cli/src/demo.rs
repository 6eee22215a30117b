//! `ndd demo`: both halves of a driver on this machine, over loopback TLS, each with a fresh
//! identity in a temporary home, trusting each other; a simulated 3D mouse forwarded through
//! the pairs that exist, with live stats.

use crate::config::{Config, SideName};
use crate::session::{self, Endpoint, RunOptions, RunReport};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The embedded default driver.
pub const DEMO_CONFIG: &str = r#"
driver = "spacenav-demo"

[link]
listener = "app"

# The 3D mouse, device -> app. On the device side, top to bottom:
#   average   two 62.5 Hz six-axis records become one (axes averaged, buttons OR-ed)
#   buffer    the app side keeps 2..4 records and replays them 32 ms apart (jitter removal)
#   bundle    2 records travel in one wire frame
#   compress  lz4 (small bundles are sent as they are when that is smaller)
#   encrypt   AES-256-GCM end to end, on top of the TLS link
# The app side runs the inverse halves bottom to top.
[[stream]]
name = "motion"
direction = "device-to-app"
source = { type = "spacenav-sim" }
# Averaging merges records, so the app receives every other sequence number: a `check`
# sink would call that a gap; `null` just counts.
sink = { type = "null" }
stack = [
  { type = "average", preset = "spacenav", count = 2 },
  { type = "buffer", min = 2, max = 4, playout_ms = 30 },
  { type = "bundle", count = 2, max_delay_ms = 80 },
  { type = "compress", codec = "lz4", min_size = 32 },
  { type = "encrypt", key_file = "KEY_FILE" },
]

# The way back, app -> device: the application sets the device's LEDs ten times a second.
[[stream]]
name = "leds"
direction = "app-to-device"
source = { type = "synthetic", size = 2, interval_ms = 100.0, seed = 7 }
sink = { type = "check", seed = 7, size = 2 }
stack = [{ type = "checksum" }, { type = "encrypt", key_file = "KEY_FILE" }]
"#;

/// A random 32-byte key, mode 0600, for the demo's `encrypt` pairs.
pub fn write_key(path: &Path) -> Result<()> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .context("cannot read /dev/urandom")?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(&key)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// A temporary directory removed on drop.
#[derive(Debug)]
pub struct TempHome(pub PathBuf);

impl TempHome {
    /// Creates `$TMPDIR/ndd-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> Result<TempHome> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "ndd-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).with_context(|| format!("cannot create {}", p.display()))?;
        Ok(TempHome(p))
    }
}

impl Drop for TempHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates two identities that trust each other: (device home, app home).
pub fn paired_homes(base: &Path) -> Result<(PathBuf, PathBuf)> {
    let dev = base.join("device");
    let app = base.join("app");
    let d = ndd_link::Identity::create(&dev, false).context("device identity")?;
    let a = ndd_link::Identity::create(&app, false).context("app identity")?;
    ndd_link::KnownPeers::trust(&dev, &a.fingerprint(), Some("demo-app"))
        .context("device trusts app")?;
    ndd_link::KnownPeers::trust(&app, &d.fingerprint(), Some("demo-device"))
        .context("app trusts device")?;
    Ok((dev, app))
}

/// Runs both sides of `cfg` in this process over 127.0.0.1. The device side stops after
/// `duration` (or on `stop`); the app side follows when the device closes.
#[allow(clippy::too_many_arguments)]
pub async fn run_loopback(
    cfg: Config,
    insecure: bool,
    quiet: bool,
    live_stats: Option<Duration>,
    duration: Option<Duration>,
    stop: watch::Receiver<bool>,
) -> Result<(RunReport, RunReport)> {
    let tmp = TempHome::new("loopback")?;
    let (dev_home, app_home) = paired_homes(&tmp.0)?;
    // TCP: a listener bound here on port 0. QUIC and UDP: a free UDP port, bound by the app
    // side itself (it is polled first below, so it binds before the device connects).
    let (app_end, addr) = if cfg.link.transport == crate::session::TransportKind::Tcp {
        let listener = ndd_link::listen("127.0.0.1:0")
            .await
            .context("cannot listen on 127.0.0.1")?;
        let addr = listener
            .local_addr()
            .context("listener address")?
            .to_string();
        (Endpoint::ListenOn(listener), addr)
    } else {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .context("cannot find a free UDP port")?
            .port();
        let addr = format!("127.0.0.1:{port}");
        (Endpoint::Listen(addr.clone()), addr)
    };
    let cfg = Arc::new(cfg);
    let app = session::run_side_task(
        cfg.clone(),
        RunOptions {
            side: SideName::App,
            home: app_home,
            endpoint: app_end,
            insecure,
            live_stats,
            duration: None,
            quiet,
            once: true,
            metrics: None,
            peer_hint: None,
            label: None,
        },
        stop.clone(),
    );
    let dev = session::run_side_task(
        cfg,
        RunOptions {
            side: SideName::Device,
            home: dev_home,
            endpoint: Endpoint::Connect(addr),
            insecure,
            live_stats,
            duration,
            quiet,
            once: true,
            metrics: None,
            peer_hint: None,
            label: None,
        },
        stop,
    );
    let (a, d) = tokio::join!(app, dev);
    Ok((d.context("device side")?, a.context("app side")?))
}

/// The driver of `ndd demo --fanout`: one simulated 3D mouse to every app side, through NATS.
pub const FANOUT_CONFIG: &str = r#"
driver = "spacenav-fanout"

[link]
transport = "nats"

[link.nats]
servers = ["NATS_URL"]
min_app_sides = 3

# The 3D mouse, to every app side (a copy each), through the NATS server. Every frame is
# encrypted under the group key the device gave each app side when it joined.
[[stream]]
name = "motion"
direction = "device-to-app"
reliability = "lossy"
source = { type = "spacenav-sim" }
sink = { type = "null" }
stack = [{ type = "multiplex", mode = "all" }]

# Its buttons, reliable (JetStream keeps them for an app side that goes away).
[[stream]]
name = "buttons"
direction = "device-to-app"
source = { type = "synthetic", size = 16, interval_ms = 50.0, seed = 7 }
sink = { type = "check", seed = 7, size = 16 }
stack = [{ type = "checksum" }, { type = "multiplex", mode = "all" }]
"#;

/// The demo's private nats-server: loopback, JetStream in a temporary store, a port it picks
/// itself (read from its ports file); killed, and its store removed, on drop.
struct DemoNats {
    child: std::process::Child,
    dir: PathBuf,
    port: u16,
}

impl DemoNats {
    fn start() -> Result<DemoNats> {
        let dir = std::env::temp_dir().join(format!("ndd-demo-nats-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let log = std::fs::File::create(dir.join("server.log"))?;
        let child = std::process::Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", "-1", "-js", "-sd"])
            .arg(dir.join("store"))
            .arg("--ports_file_dir")
            .arg(&dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => anyhow::anyhow!(
                    "ndd demo --fanout needs nats-server (Debian: apt install nats-server; ./run demo --fanout installs it)"
                ),
                _ => anyhow::anyhow!("cannot start nats-server: {e}"),
            })?;
        let mut n = DemoNats {
            port: 0,
            dir,
            child,
        };
        // It writes nats-server_PID.ports ({"nats":["nats://127.0.0.1:PORT"]}) once it listens.
        let ports = n.dir.join(format!("nats-server_{}.ports", n.child.id()));
        let t0 = std::time::Instant::now();
        loop {
            let port = std::fs::read_to_string(&ports).ok().and_then(|t| {
                let at = t.find("127.0.0.1:")? + "127.0.0.1:".len();
                let digits: String = t[at..].chars().take_while(char::is_ascii_digit).collect();
                digits.parse::<u16>().ok()
            });
            if let Some(p) = port {
                if std::net::TcpStream::connect(("127.0.0.1", p)).is_ok() {
                    n.port = p;
                    return Ok(n);
                }
            }
            if let Ok(Some(status)) = n.child.try_wait() {
                let log = std::fs::read_to_string(n.dir.join("server.log")).unwrap_or_default();
                anyhow::bail!("nats-server exited ({status}): {}", log.trim());
            }
            if t0.elapsed() > Duration::from_secs(10) {
                anyhow::bail!("nats-server did not listen within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for DemoNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `ndd demo --fanout`: a private nats-server on loopback, one device side and three app
/// sides in this process, each with its own identity, live stats per app side.
pub async fn run_fanout(duration: Option<Duration>) -> Result<i32> {
    let nats = tokio::task::spawn_blocking(DemoNats::start)
        .await
        .context("starting nats-server")??;
    let text = FANOUT_CONFIG.replace("NATS_URL", &nats.url());
    let cfg = Config::parse(&text, Path::new("<embedded fan-out demo config>"))?;
    let tmp = TempHome::new("fanout")?;
    let dev_home = tmp.0.join("device");
    let d = ndd_link::Identity::create(&dev_home, false).context("device identity")?;
    let mut app_homes = Vec::new();
    for i in 0..3 {
        let home = tmp.0.join(format!("app{i}"));
        let a = ndd_link::Identity::create(&home, false).context("app identity")?;
        ndd_link::KnownPeers::trust(&dev_home, &a.fingerprint(), Some(&format!("app{i}")))?;
        ndd_link::KnownPeers::trust(&home, &d.fingerprint(), Some("demo-device"))?;
        app_homes.push(home);
    }
    eprintln!(
        "ndd demo --fanout: a simulated 3D mouse on one device side, used by three app sides,"
    );
    eprintln!(
        "          through a private nats-server on {} (JetStream on).",
        nats.url()
    );
    eprintln!("  motion   device→apps: multiplex(all), lossy on core NATS");
    eprintln!("  buttons  device→apps: checksum → multiplex(all), reliable on JetStream");
    eprintln!(
        "  every frame is encrypted under a group key only the three admitted app sides hold;"
    );
    eprintln!("  each line: [side] stream, frames, rate, one-way latency.");
    match duration {
        Some(d) => eprintln!(
            "  running for {:.1} s (Ctrl-C stops earlier)\n",
            d.as_secs_f64()
        ),
        None => eprintln!("  press Ctrl-C to stop\n"),
    }
    let stop = crate::ctrl_c();
    let opts = |side, home: PathBuf, duration, label| RunOptions {
        side,
        home,
        endpoint: Endpoint::Connect(String::new()),
        insecure: false,
        live_stats: Some(Duration::from_secs(1)),
        duration,
        quiet: false,
        once: true,
        metrics: None,
        peer_hint: None,
        label,
    };
    let cfg = Arc::new(cfg);
    let apps: Vec<_> = app_homes
        .iter()
        .enumerate()
        .map(|(i, h)| {
            session::run_side_task(
                cfg.clone(),
                // Named as the device knows them (three in one process).
                opts(SideName::App, h.clone(), None, Some(format!("app{i}"))),
                stop.clone(),
            )
        })
        .collect();
    let dev = session::run_side_task(
        cfg,
        opts(SideName::Device, dev_home, duration, None),
        stop.clone(),
    );
    let (dev, apps) = tokio::join!(dev, futures_util::future::join_all(apps));
    let dev = dev.context("device side")?;
    println!("summary");
    let mut ok = true;
    for s in &dev.streams {
        println!("  [device] {:<8} {:>6} frames sent", s.name, s.frames);
    }
    for (i, a) in apps.into_iter().enumerate() {
        let a = a.with_context(|| format!("app side {i}"))?;
        for s in &a.streams {
            let mut line = format!("  [app{i}] {:<8} {:>6} frames", s.name, s.frames);
            if let (Some(p50), Some(p99)) = (s.latency_p50_ms, s.latency_p99_ms) {
                line += &format!("  latency p50 {p50:.3} ms p99 {p99:.3} ms");
            }
            println!("{line}");
        }
        for (name, c) in &a.checks {
            println!("  [app{i}] {name}: {c}");
            ok &= c.is_ok();
        }
    }
    drop(nats);
    Ok(if ok { 0 } else { 3 })
}

/// `ndd demo`.
pub async fn run(duration: Option<Duration>, stats_json: Option<PathBuf>) -> Result<i32> {
    let keys = TempHome::new("demo-key")?;
    let key = keys.0.join("demo.key");
    write_key(&key)?;
    let text = DEMO_CONFIG.replace("KEY_FILE", &key.display().to_string());
    let cfg = Config::parse(&text, Path::new("<embedded demo config>"))?;
    eprintln!("ndd demo: a simulated 3D mouse (62.5 Hz) on the device side, used on the app side,");
    eprintln!("          over loopback TLS 1.3 with two fresh identities that trust each other.");
    eprintln!("  motion  device→app: average(2) → buffer → bundle(2) → compress(lz4) → encrypt");
    eprintln!("  leds    app→device: checksum → encrypt");
    eprintln!("  each line: frames and rate through the endpoint; on the receiving side one-way");
    eprintln!("  latency (creation → delivery) and spacing error (how far the delivery rhythm is");
    eprintln!("  from the device's); the summary shows what every pair did.");
    match duration {
        Some(d) => eprintln!(
            "  running for {:.1} s (Ctrl-C stops earlier)\n",
            d.as_secs_f64()
        ),
        None => eprintln!("  press Ctrl-C to stop\n"),
    }
    let stop = crate::ctrl_c();
    let (dev, app) = run_loopback(
        cfg,
        false,
        false,
        Some(Duration::from_secs(1)),
        duration,
        stop,
    )
    .await?;
    // The result goes to stdout (the live lines and notes are on stderr): `ndd demo >
    // result.txt` keeps it.
    println!("summary");
    let mut ok = true;
    for (side, rep) in [("device", &dev), ("app", &app)] {
        for s in &rep.streams {
            let mut line = format!(
                "  [{side}] {:<7} {:<6} {:>6} frames {:>9} bytes",
                s.name,
                s.role,
                s.frames,
                crate::stats::human_bytes(s.bytes as f64)
            );
            if let (Some(p50), Some(p99)) = (s.latency_p50_ms, s.latency_p99_ms) {
                line += &format!("  latency p50 {p50:.3} ms p99 {p99:.3} ms");
            }
            if let Some(j) = s.jitter_mean_ms {
                line += &format!("  spacing error {j:.3} ms");
            }
            println!("{line}");
            for m in &s.modules {
                let mut extra: Vec<String> = m
                    .counters
                    .iter()
                    .filter(|c| c.1 > 0)
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                if m.drops > 0 {
                    extra.push(format!("drops {}", m.drops));
                }
                println!(
                    "      layer {} {:<9} {:>6} → {:<6} frames {:>9} → {:<9} {}",
                    m.layer,
                    m.module,
                    m.frames_in,
                    m.frames_out,
                    crate::stats::human_bytes(m.bytes_in as f64),
                    crate::stats::human_bytes(m.bytes_out as f64),
                    extra.join(", ")
                );
            }
        }
        for (name, c) in &rep.checks {
            println!("  [{side}] {name}: {c}");
            ok &= c.is_ok();
        }
    }
    if let Some(path) = stats_json {
        crate::write_json(
            &path,
            &serde_json::json!({ "device": dev.streams, "app": app.streams }),
        )?;
    }
    Ok(if ok { 0 } else { 3 })
}
