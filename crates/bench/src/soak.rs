//! `ndd bench soak`: two real `ndd run` processes over TLS through a TCP proxy that cuts
//! every connection at a fixed period, carrying a device-rate mix (1 kHz × 64 B input,
//! 30 fps × 100 KB display-like, a 500 Hz × 32 B serial-like byte stream back) for N
//! minutes. Each minute: RSS and open fds of both processes, frames delivered per stream
//! (from their `--stats` lines); at the end the `check` sinks' verdicts (missing, duplicate,
//! reordered, corrupt) on the reliable streams. Writes soak.md.

use super::{hardware, ndd_ok, today};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// Streams of the mix: (name, side whose stderr shows its sink, frames per second).
const STREAMS: [(&str, &str, f64); 3] = [
    ("input", "app", 1000.0),
    ("display", "app", 30.0),
    ("serial", "device", 500.0),
];

fn config(secs: u64, addr: &str) -> String {
    format!(
        r#"
driver = "soak"
[link]
address = "{addr}"
ping_interval_ms = 200
keepalive_timeout_ms = 2000
max_backoff_ms = 200
[[stream]]
name = "input"
direction = "device-to-app"
source = {{ type = "synthetic", size = 64, interval_ms = 1.0, count = {input}, seed = 1 }}
sink = {{ type = "check", seed = 1, size = 64, expect = {input} }}
[[stream]]
name = "display"
direction = "device-to-app"
reliability = "lossy"
source = {{ type = "synthetic", size = 100000, interval_ms = 33.333, count = {display}, seed = 2 }}
sink = {{ type = "null" }}
[[stream]]
name = "serial"
direction = "app-to-device"
source = {{ type = "synthetic", size = 32, interval_ms = 2.0, count = {serial}, seed = 3 }}
sink = {{ type = "check", seed = 3, size = 32, expect = {serial} }}
"#,
        input = secs * 1000,
        display = secs * 30,
        serial = secs * 500,
    )
}

/// A TCP proxy whose connections can all be cut at once.
struct CutProxy {
    addr: String,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl CutProxy {
    async fn start(upstream: String) -> Result<CutProxy> {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .context("soak proxy: bind")?;
        let addr = l.local_addr()?.to_string();
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let c = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = l.accept().await {
                let Ok(mut server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let t = tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                c.lock().unwrap_or_else(|p| p.into_inner()).push(t);
            }
        });
        Ok(CutProxy {
            addr,
            conns,
            accept,
        })
    }

    /// Drops every connection at once (whatever is in flight).
    fn cut(&self) {
        for t in self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// One `ndd run` and what its stderr said: the latest frame count per stream, all lines.
struct Proc {
    child: Child,
    pid: u32,
    counts: Arc<Mutex<HashMap<String, u64>>>,
    lines: Arc<Mutex<Vec<String>>>,
    reader: JoinHandle<()>,
}

impl Proc {
    fn spawn(exe: &Path, args: &[&str]) -> Result<Proc> {
        let mut child = Command::new(exe)
            .args(args)
            .env("NDD_LOG", "warn,ndd::session=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start ndd")?;
        let pid = child.id().context("ndd exited at once")?;
        let err = child.stderr.take().context("no stderr")?;
        let counts: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let (c, l) = (counts.clone(), lines.clone());
        let reader = tokio::spawn(async move {
            let mut r = BufReader::new(err).lines();
            while let Ok(Some(line)) = r.next_line().await {
                if let Some((name, n)) = live_count(&line) {
                    c.lock().unwrap_or_else(|p| p.into_inner()).insert(name, n);
                } else {
                    l.lock().unwrap_or_else(|p| p.into_inner()).push(line);
                }
            }
        });
        Ok(Proc {
            child,
            pid,
            counts,
            lines,
            reader,
        })
    }

    fn count(&self, stream: &str) -> u64 {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(stream)
            .copied()
            .unwrap_or(0)
    }

    fn text(&self) -> String {
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .join("\n")
    }
}

/// `[app] input      sink  device→app   12345 frames …` → ("input", 12345).
fn live_count(line: &str) -> Option<(String, u64)> {
    let t: Vec<&str> = line.split_whitespace().collect();
    if !t.first()?.starts_with('[') || t.get(2) != Some(&"sink") {
        return None;
    }
    let at = t.iter().position(|w| *w == "frames")?;
    let n = t.get(at.checked_sub(1)?)?.parse().ok()?;
    Some((t.get(1)?.to_string(), n))
}

/// Resident set size (KiB) and open file descriptors of `pid`.
fn rss_fds(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds)
}

struct Minute {
    minute: u64,
    cuts: u64,
    app: (u64, usize),
    dev: (u64, usize),
    delivered: Vec<u64>,
}

/// Runs the soak for `minutes` (15 s with a cut every 5 s when `quick`: the CI's smoke run).
pub async fn run(quick: bool, minutes: u64, out: &Path) -> Result<()> {
    let minutes = if quick { 1 } else { minutes.max(1) };
    let cut_every = Duration::from_secs(if quick { 5 } else { 60 });
    let secs = if quick { 15 } else { minutes * 60 };
    let exe = super::ndd_exe()?;
    let dir = std::env::temp_dir().join(format!("ndd-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (ha, hd): (PathBuf, PathBuf) = (dir.join("app"), dir.join("device"));
    let (ha_s, hd_s) = (ha.display().to_string(), hd.display().to_string());
    let fa = ndd_ok(&exe, &["id", "--home", &ha_s])?;
    let fd = ndd_ok(&exe, &["id", "--home", &hd_s])?;
    ndd_ok(&exe, &["trust", &fd, "--home", &ha_s])?;
    ndd_ok(&exe, &["trust", &fa, "--home", &hd_s])?;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .to_string();
    let cfg = dir.join("soak.toml");
    std::fs::write(&cfg, config(secs, &listen))?;
    let cfg_s = cfg.display().to_string();

    let mut app = Proc::spawn(
        &exe,
        &[
            "run", &cfg_s, "--side", "app", "--listen", &listen, "--home", &ha_s, "--stats",
            "--once",
        ],
    )?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let proxy = CutProxy::start(listen.clone()).await?;
    let mut dev = Proc::spawn(
        &exe,
        &[
            "run",
            &cfg_s,
            "--side",
            "device",
            "--connect",
            &proxy.addr,
            "--home",
            &hd_s,
            "--stats",
            "--once",
        ],
    )?;
    eprintln!(
        "bench soak: {secs} s, a cut every {} s; app pid {}, device pid {}",
        cut_every.as_secs(),
        app.pid,
        dev.pid
    );
    let start = Instant::now();
    let mut rows: Vec<Minute> = Vec::new();
    let mut cuts = 0u64;
    let mut next_cut = start + cut_every;
    let sample_every = if quick {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(60)
    };
    let mut next_sample = start + sample_every;
    let limit = Duration::from_secs(secs + 120);
    let (app_status, dev_status) = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = Instant::now();
        if now >= next_cut && now.duration_since(start) < Duration::from_secs(secs) {
            proxy.cut();
            cuts += 1;
            next_cut += cut_every;
        }
        let (a, d) = (app.child.try_wait()?, dev.child.try_wait()?);
        if let (Some(a), Some(d)) = (a, d) {
            break (a, d);
        }
        if now >= next_sample && a.is_none() && d.is_none() {
            let m = Minute {
                minute: rows.len() as u64 + 1,
                cuts,
                app: rss_fds(app.pid),
                dev: rss_fds(dev.pid),
                delivered: STREAMS
                    .iter()
                    .map(|(name, side, _)| {
                        if *side == "app" {
                            app.count(name)
                        } else {
                            dev.count(name)
                        }
                    })
                    .collect(),
            };
            eprintln!(
                "  {:>3} {} cut(s)  app {:.1} MB {} fds  device {:.1} MB {} fds  delivered {:?}",
                m.minute,
                m.cuts,
                m.app.0 as f64 / 1024.0,
                m.app.1,
                m.dev.0 as f64 / 1024.0,
                m.dev.1,
                m.delivered
            );
            rows.push(m);
            next_sample += sample_every;
        }
        if now.duration_since(start) > limit {
            bail!(
                "the soak did not end {} s after its sources: app said {}; device said {}",
                limit.as_secs() - secs,
                app.text(),
                dev.text()
            );
        }
    };
    let took = start.elapsed();
    drop(proxy);
    let _ = (&mut app.reader).await;
    let _ = (&mut dev.reader).await;
    let (atext, dtext) = (app.text(), dev.text());
    let checks: Vec<String> = atext
        .lines()
        .chain(dtext.lines())
        .filter(|l| l.contains(": check: "))
        .map(|l| l.split("]: ").nth(1).unwrap_or(l).to_string())
        .collect();
    let recoveries: Vec<String> = atext
        .lines()
        .chain(dtext.lines())
        .filter(|l| l.contains("reconnect(s), recovered in"))
        .map(|l| l.to_string())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);

    let mut md = String::from("# Soak: a device-rate mix across a link cut every minute\n\n");
    let _ = writeln!(
        md,
        "Hardware: {}. Date: {}. Command: `ndd bench soak{}`.\n",
        hardware(),
        today(),
        if quick {
            " --quick".to_string()
        } else {
            format!(" --minutes {minutes}")
        }
    );
    let _ = writeln!(
        md,
        "Two `ndd run` processes over TLS on 127.0.0.1, the device side connecting through a \
         TCP proxy that drops every connection every {} s (mid-frame, whatever is in flight); \
         both sides reconnect and resume. Streams: `input` 1 kHz × 64 B (reliable, `check` \
         sink), `display` 30 fps × 100 KB (lossy, latest-wins, `null` sink), `serial` \
         500 Hz × 32 B the other way (reliable, `check` sink). RSS and open fds read from \
         /proc; frames delivered from each side's `--stats` lines. {} s of sources, {:.0} s \
         in all, {cuts} cuts.\n",
        cut_every.as_secs(),
        secs,
        took.as_secs_f64()
    );
    md += "| sample | cuts so far | app RSS MB | app fds | device RSS MB | device fds | input delivered | display delivered | serial delivered |\n";
    md += "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {} | {:.1} | {} | {} | {} | {} |",
            r.minute,
            r.cuts,
            r.app.0 as f64 / 1024.0,
            r.app.1,
            r.dev.0 as f64 / 1024.0,
            r.dev.1,
            r.delivered[0],
            r.delivered[1],
            r.delivered[2]
        );
    }
    md += "\n## Verdict\n\n";
    for c in &checks {
        let _ = writeln!(md, "- {c}");
    }
    for r in &recoveries {
        let _ = writeln!(md, "- {}", r.trim_start_matches("ndd "));
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let _ = writeln!(
            md,
            "- RSS from the first sample to the last: app {:.1} → {:.1} MB, device {:.1} → {:.1} MB; open fds: app {} → {}, device {} → {}",
            first.app.0 as f64 / 1024.0,
            last.app.0 as f64 / 1024.0,
            first.dev.0 as f64 / 1024.0,
            last.dev.0 as f64 / 1024.0,
            first.app.1,
            last.app.1,
            first.dev.1,
            last.dev.1
        );
    }
    let ok = app_status.success() && dev_status.success();
    let _ = writeln!(
        md,
        "- exit: app {}, device {} (0: every reliable frame once, in order, intact)",
        app_status.code().unwrap_or(-1),
        dev_status.code().unwrap_or(-1)
    );
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join("soak.md");
    std::fs::write(&path, &md).with_context(|| format!("cannot write {}", path.display()))?;
    eprint!("{}", md.split("## Verdict").nth(1).unwrap_or(""));
    eprintln!("wrote {}", path.display());
    if !ok {
        bail!("the soak lost or damaged reliable frames or a side failed: app said {atext}; device said {dtext}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::live_count;

    #[test]
    fn live_lines_give_the_stream_and_its_count() {
        assert_eq!(
            live_count("[app] input      sink  device→app     4484 frames   566.3 f/s"),
            Some(("input".into(), 4484))
        );
        assert_eq!(
            live_count("[device] serial  source  app→device  12 frames"),
            None
        );
        assert_eq!(live_count("ndd [app]: link lost: x; reconnecting"), None);
    }
}
