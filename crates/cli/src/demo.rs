//! `ndd demo`: both halves of a driver on this machine, over loopback TLS, each with a fresh
//! identity in a temporary home, trusting each other; a simulated 3D mouse forwarded through
//! the pairs that exist, with live stats.

use crate::config::{Config, SideName};
use crate::session::{self, Endpoint, RunOptions, RunReport};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::watch;

/// The embedded default driver.
pub const DEMO_CONFIG: &str = r#"
driver = "spacenav-demo"

[link]
listener = "app"

# The 3D mouse: 62.5 Hz six-axis records, checksummed, bundled 4 to a wire frame and
# re-released on the app side with their original 16 ms spacing.
[[stream]]
name = "motion"
direction = "device-to-app"
source = { type = "spacenav-sim" }
sink = { type = "check" }
stack = [{ type = "checksum" }, { type = "bundle", count = 4, max_delay_ms = 80 }]

# The way back: the application sets the device's LEDs ten times a second.
[[stream]]
name = "leds"
direction = "app-to-device"
source = { type = "synthetic", size = 2, interval_ms = 100.0, seed = 7 }
sink = { type = "check", seed = 7, size = 2 }
stack = [{ type = "checksum" }]
"#;

/// A temporary directory removed on drop.
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
    cfg: &Config,
    insecure: bool,
    quiet: bool,
    live_stats: Option<Duration>,
    duration: Option<Duration>,
    stop: watch::Receiver<bool>,
) -> Result<(RunReport, RunReport)> {
    let tmp = TempHome::new("loopback")?;
    let (dev_home, app_home) = paired_homes(&tmp.0)?;
    let listener = ndd_link::listen("127.0.0.1:0")
        .await
        .context("cannot listen on 127.0.0.1")?;
    let addr = listener
        .local_addr()
        .context("listener address")?
        .to_string();
    let app = session::run_side(
        cfg,
        RunOptions {
            side: SideName::App,
            home: app_home,
            endpoint: Endpoint::ListenOn(listener),
            insecure,
            live_stats,
            duration: None,
            quiet,
        },
        stop.clone(),
    );
    let dev = session::run_side(
        cfg,
        RunOptions {
            side: SideName::Device,
            home: dev_home,
            endpoint: Endpoint::Connect(addr),
            insecure,
            live_stats,
            duration,
            quiet,
        },
        stop,
    );
    let (a, d) = tokio::join!(app, dev);
    Ok((d.context("device side")?, a.context("app side")?))
}

/// `ndd demo`.
pub async fn run(duration: Option<Duration>, stats_json: Option<PathBuf>) -> Result<i32> {
    let cfg = Config::parse(DEMO_CONFIG, Path::new("<embedded demo config>"))?;
    eprintln!("ndd demo: a simulated 3D mouse (62.5 Hz) on the device side, used on the app side,");
    eprintln!("          over loopback TLS 1.3 with two fresh identities that trust each other.");
    eprintln!("          stack: checksum + bundle(4) one way, checksum the other way.");
    match duration {
        Some(d) => eprintln!(
            "          running for {:.1} s (Ctrl-C stops earlier)\n",
            d.as_secs_f64()
        ),
        None => eprintln!("          press Ctrl-C to stop\n"),
    }
    let stop = crate::ctrl_c();
    let (dev, app) = run_loopback(
        &cfg,
        false,
        false,
        Some(Duration::from_secs(1)),
        duration,
        stop,
    )
    .await?;
    eprintln!("\nsummary");
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
            eprintln!("{line}");
        }
        for (name, c) in &rep.checks {
            eprintln!("  [{side}] {name}: {c}");
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
