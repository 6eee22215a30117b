//! `ndd status`: what every side running on this machine is doing, asked over Unix sockets.
//!
//! Each `ndd run` serves a JSON snapshot of itself ([`SideStatus`], refreshed every second)
//! on `DIR/DRIVER-SIDE-PID-N.sock`, where DIR is [`status_dir`]: `$NDD_STATUS_DIR`, else
//! `/run/ndd` for root, else `$XDG_RUNTIME_DIR/ndd`, else `/tmp/ndd-UID` (made 0700). A
//! client connects, reads one JSON document and the side closes: the socket takes no
//! commands. `ndd status` reads every socket there and prints a table (`--watch`: redrawn
//! every second; `--json`: the documents); a socket nobody answers on (a side killed with
//! SIGKILL) is removed.

use crate::stats::StreamSummary;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One running side, as `ndd status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SideStatus {
    /// The driver (the config's `driver`).
    pub driver: String,
    /// `device` or `app`.
    pub side: String,
    /// The process.
    pub pid: u32,
    /// Where it listens, or whom it connects to.
    pub address: String,
    /// The link: `waiting for the peer`, `up`, `down, reconnecting`, …
    pub link: String,
    /// The peer's address and name, once one connected.
    pub peer: Option<String>,
    /// Round trip to the peer, ms (while the link is up).
    pub rtt_ms: Option<f64>,
    /// Links restored after a loss.
    pub recoveries: usize,
    /// The last loss or refusal, as the side said it.
    pub last_error: Option<String>,
    /// Seconds since the side started.
    pub uptime_s: f64,
    /// Its streams.
    pub streams: Vec<StreamStatus>,
}

/// One stream of a running side.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StreamStatus {
    /// Stream name.
    pub name: String,
    /// `source` or `sink` on this side.
    pub role: String,
    /// Direction (`device→app`).
    pub direction: String,
    /// Frames through the endpoint.
    pub frames: u64,
    /// Payload bytes through the endpoint.
    pub bytes: u64,
    /// Frames a second over the last refresh.
    pub rate_fps: f64,
    /// One-way latency p50 and p99, ms (sink only).
    pub latency_p50_ms: Option<f64>,
    /// See `latency_p50_ms`.
    pub latency_p99_ms: Option<f64>,
    /// Frames dropped: by pairs, from a full resume buffer, behind a slow sink, refused,
    /// stale input.
    pub drops: u64,
}

impl SideStatus {
    /// A side of this process before its first peer; `link` says what it does meanwhile.
    pub fn starting(driver: &str, side: &str, address: String, link: &str) -> SideStatus {
        SideStatus {
            driver: driver.to_string(),
            side: side.to_string(),
            pid: std::process::id(),
            address,
            link: link.to_string(),
            peer: None,
            rtt_ms: None,
            recoveries: 0,
            last_error: None,
            uptime_s: 0.0,
            streams: Vec::new(),
        }
    }
}

impl StreamStatus {
    /// From a stream's counters; `rate_fps` from the frames since `before` (`dt` ago).
    pub fn of(s: &StreamSummary, before: Option<u64>, dt: Duration) -> StreamStatus {
        let rate_fps = match before {
            Some(b) if dt > Duration::ZERO => s.frames.saturating_sub(b) as f64 / dt.as_secs_f64(),
            _ => 0.0,
        };
        StreamStatus {
            name: s.name.clone(),
            role: s.role.to_string(),
            direction: s.direction.clone(),
            frames: s.frames,
            bytes: s.bytes,
            rate_fps,
            latency_p50_ms: s.latency_p50_ms,
            latency_p99_ms: s.latency_p99_ms,
            drops: s.drops + s.overflow + s.sink_behind + s.refused + s.stale,
        }
    }
}

/// Where the status sockets are (see the module's documentation).
pub fn status_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NDD_STATUS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let uid = rustix::process::getuid();
    if uid.is_root() {
        return PathBuf::from("/run/ndd");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ndd");
    }
    std::env::temp_dir().join(format!("ndd-{}", uid.as_raw()))
}

/// A side's status, shared with the task that serves it; the socket goes when it drops.
#[derive(Debug)]
pub struct Served {
    status: Arc<Mutex<SideStatus>>,
    path: PathBuf,
    /// The socket file's (device, inode): removed at the end only if it is still this one.
    file: (u64, u64),
    task: tokio::task::JoinHandle<()>,
    started: Instant,
    /// Frames of each stream at the last refresh, and when.
    last: Option<(Instant, Vec<u64>)>,
}

impl Served {
    /// Changes the status (`uptime_s` is kept up to date here).
    pub fn update(&self, f: impl FnOnce(&mut SideStatus)) {
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut s);
        s.uptime_s = self.started.elapsed().as_secs_f64();
    }

    /// The streams' counters now (rates from the last call).
    pub fn streams(&mut self, now: Instant, streams: &[StreamSummary]) {
        let (dt, before) = match &self.last {
            Some((t, v)) => (now.saturating_duration_since(*t), Some(v)),
            None => (Duration::ZERO, None),
        };
        let list: Vec<StreamStatus> = streams
            .iter()
            .enumerate()
            .map(|(i, s)| StreamStatus::of(s, before.and_then(|b| b.get(i).copied()), dt))
            .collect();
        self.last = Some((now, streams.iter().map(|s| s.frames).collect()));
        self.update(|st| st.streams = list);
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        self.task.abort();
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether `dir` is this user's and nobody else may write to it; why not.
fn ours(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta =
        std::fs::symlink_metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let mode = meta.permissions().mode();
    if !meta.is_dir() || meta.uid() != rustix::process::getuid().as_raw() || mode & 0o022 != 0 {
        anyhow::bail!(
            "{} is not a directory only this user may write to (mode {:04o}): set NDD_STATUS_DIR to one",
            dir.display(),
            mode & 0o7777
        );
    }
    Ok(())
}

/// Serves `first` on a socket in [`status_dir`] until the returned handle drops.
pub fn serve(first: SideStatus) -> Result<Served> {
    serve_in(&status_dir(), first)
}

/// [`serve`], or a warning that `ndd status` will not see the side (it runs on without).
pub fn serve_or_say(first: SideStatus) -> Option<Served> {
    let side = first.side.clone();
    serve(first)
        .map_err(|e| tracing::warn!(side = %side, "ndd status will not see this side: {e:#}"))
        .ok()
}

/// [`serve`] in `dir`.
pub fn serve_in(dir: &Path, first: SideStatus) -> Result<Served> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create the status directory {}", dir.display()))?;
    // Another user's directory, or one others may write to, is not used (systemd's
    // RuntimeDirectory /run/ndd is 0755: others may look, the sockets answer only root).
    ours(dir)?;
    // Several sides may run in one process (`ndd demo --fanout`): each its own socket.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("{}-{}-{}-{n}.sock", first.driver, first.side, first.pid);
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    // Only this user may connect (connecting needs write permission on the socket).
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", path.display()))?;
    let file = {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(&path)?;
        (m.dev(), m.ino())
    };
    let status = Arc::new(Mutex::new(first));
    let s = status.clone();
    let task = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        loop {
            let Ok((mut c, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let text = {
                let st = s.lock().unwrap_or_else(|p| p.into_inner());
                serde_json::to_string(&*st).unwrap_or_default()
            };
            tokio::spawn(async move {
                let write = async {
                    c.write_all(text.as_bytes()).await?;
                    c.write_all(b"\n").await?;
                    c.shutdown().await
                };
                let _ = tokio::time::timeout(Duration::from_secs(2), write).await;
            });
        }
    });
    Ok(Served {
        status,
        path,
        file,
        task,
        started: Instant::now(),
        last: None,
    })
}

/// Every side answering in `dir`, sorted by driver, side and pid; sockets nobody answers on
/// are removed (their side is gone). A directory another user could have filled is not read.
pub fn read_all(dir: &Path) -> Result<Vec<SideStatus>> {
    use std::os::unix::fs::FileTypeExt;
    if !dir.exists() {
        return Ok(Vec::new());
    }
    ours(dir)?;
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let mut all = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        // Only sockets named as a side names them.
        if path.extension().is_none_or(|x| x != "sock")
            || !e.file_type().is_ok_and(|t| t.is_socket())
        {
            continue;
        }
        match read_one(&path) {
            Ok(s) => all.push(s),
            Err(ReadError::Gone) => {
                let _ = std::fs::remove_file(&path);
            }
            Err(ReadError::Bad(why)) => {
                tracing::warn!("{}: {why}", path.display());
            }
        }
    }
    all.sort_by(|a, b| (&a.driver, &a.side, a.pid).cmp(&(&b.driver, &b.side, b.pid)));
    Ok(all)
}

enum ReadError {
    /// Nobody listens: the side is gone.
    Gone,
    /// Something answered, not a status.
    Bad(String),
}

fn read_one(path: &Path) -> Result<SideStatus, ReadError> {
    use std::io::Read;
    let c = match std::os::unix::net::UnixStream::connect(path) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Err(ReadError::Gone),
        Err(e) => return Err(ReadError::Bad(format!("cannot connect: {e}"))),
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
    let mut text = String::new();
    c.take(4 << 20)
        .read_to_string(&mut text)
        .map_err(|e| ReadError::Bad(format!("cannot read: {e}")))?;
    serde_json::from_str(text.trim()).map_err(|e| ReadError::Bad(format!("not a status: {e}")))
}

/// The table `ndd status` prints: a line per stream, the side's columns on its first.
pub fn table(all: &[SideStatus]) -> String {
    let mut rows: Vec<Vec<String>> = vec![[
        "DRIVER",
        "SIDE",
        "PID",
        "LINK",
        "PEER",
        "RTT",
        "STREAM",
        "DIRECTION",
        "FRAMES",
        "RATE",
        "P50/P99",
        "DROPS",
    ]
    .map(String::from)
    .to_vec()];
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for s in all {
        // What a socket says is shown escaped (another program could answer there).
        let esc = |v: &str| ndd_wire::text::printable(v, 80);
        let side = [
            esc(&s.driver),
            esc(&s.side),
            s.pid.to_string(),
            esc(&s.link),
            s.peer.as_deref().map_or_else(|| "-".into(), esc),
            s.rtt_ms.map_or("-".into(), |r| format!("{r:.2} ms")),
        ];
        if s.streams.is_empty() {
            let mut r = side.to_vec();
            r.resize(12, "-".to_string());
            rows.push(r);
        }
        for (i, t) in s.streams.iter().enumerate() {
            let mut r: Vec<String> = if i == 0 {
                side.to_vec()
            } else {
                vec![String::new(); 6]
            };
            r.extend([
                esc(&t.name),
                esc(&format!("{} ({})", t.direction, t.role)),
                t.frames.to_string(),
                format!("{:.0}/s", t.rate_fps),
                format!("{}/{}", ms(t.latency_p50_ms), ms(t.latency_p99_ms)),
                t.drops.to_string(),
            ]);
            rows.push(r);
        }
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    for s in all {
        if let Some(e) = &s.last_error {
            out.push_str(&format!(
                "{} {} (pid {}): last error: {}\n",
                ndd_wire::text::printable(&s.driver, 80),
                ndd_wire::text::printable(&s.side, 80),
                s.pid,
                ndd_wire::text::printable(e, 300)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(driver: &str, pid: u32) -> SideStatus {
        SideStatus {
            pid,
            ..SideStatus::starting(
                driver,
                "device",
                "127.0.0.1:7878".into(),
                "waiting for the peer",
            )
        }
    }

    #[tokio::test]
    async fn a_side_answers_with_its_status_and_a_gone_one_is_cleared() {
        let dir = std::env::temp_dir().join(format!("ndd-status-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let served = serve_in(&dir, side("serial", 11)).unwrap();
        served.update(|s| {
            s.link = "up".into();
            s.peer = Some("127.0.0.1:5555 (app)".into());
            s.last_error = Some("link lost: \u{1b}[31mno message".into());
        });
        // A socket left behind by a side killed with SIGKILL, and a file that is no socket.
        let stale = dir.join("gone-app-12.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        let plain = dir.join("notes.sock");
        std::fs::write(&plain, "x").unwrap();
        // A second side in the same process (ndd demo --fanout runs three app sides).
        let twin = serve_in(&dir, side("serial", 11)).unwrap();
        let all = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || read_all(&dir).unwrap()
        })
        .await
        .unwrap();
        assert_eq!(all.len(), 2, "both sides of the process");
        assert!(all.iter().any(|s| s.link == "up"));
        assert!(!stale.exists(), "the stale socket is removed");
        assert!(plain.exists(), "a file that is no socket is left alone");
        drop(twin);
        let t = table(&all);
        assert!(t.starts_with("DRIVER  SIDE    PID  LINK "), "{t}");
        assert!(
            t.lines()
                .any(|l| l.starts_with("serial  device  11   up ")
                    && l.contains("127.0.0.1:5555 (app)")),
            "{t}"
        );
        assert!(
            !t.contains('\u{1b}'),
            "escape codes from the network are escaped: {t}"
        );
        let path = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains("serial-device-11-"))
            .expect("the side's socket");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only its user may connect");
        drop(served);
        assert!(!path.exists(), "the socket goes with the side");
        let mode = std::fs::metadata(&dir).unwrap().permissions();
        assert_eq!(mode.mode() & 0o777, 0o700);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_others_may_write_to_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ndd-status-open-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt
            .block_on(async { serve_in(&dir, side("x", 1)).map(|_| ()) })
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("is not a directory only this user may write to (mode 0777)"),
            "{e}"
        );
        // systemd's RuntimeDirectory (0755): others may look, not write.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        rt.block_on(async { serve_in(&dir, side("x", 1)).map(drop) })
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
