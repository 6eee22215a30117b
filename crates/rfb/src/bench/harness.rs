//! Helpers to run real X and VNC programs from Debian packages: free display numbers and ports,
//! children that die with their owner (kill on drop), readiness polling.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

use crate::RfbError;

/// The absolute path of `name` on `PATH`, if any.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Names from `names` that are not on `PATH`.
pub fn missing_programs(names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter(|n| find_program(n).is_none())
        .map(|n| n.to_string())
        .collect()
}

/// A child process killed when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
}

impl Proc {
    /// Spawn `program args…` with `DISPLAY` set (if given), output discarded, killed on drop.
    pub fn spawn(program: &str, args: &[&str], display: Option<u32>) -> Result<Proc, RfbError> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(d) = display {
            cmd.env("DISPLAY", format!(":{d}"));
        }
        cmd.env("SDL_AUDIODRIVER", "dummy");
        let child = cmd
            .spawn()
            .map_err(|e| RfbError::Bench(format!("cannot start {program}: {e}")))?;
        Ok(Proc {
            name: program.to_string(),
            child,
        })
    }

    /// The child's process id (None once reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; the caller uses it at once).
pub fn free_port() -> Result<u16, RfbError> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A running X server (Xvnc or Xvfb).
#[derive(Debug)]
pub struct XServer {
    pub display: u32,
    /// RFB port for Xvnc.
    pub rfb_port: Option<u16>,
    pub proc: Proc,
}

impl XServer {
    /// Start TigerVNC's Xvnc without authentication, listening on localhost only.
    pub async fn xvnc(geometry: &str) -> Result<XServer, RfbError> {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port()?;
            let p = port.to_string();
            let mut x = XServer::start(
                "Xvnc",
                &[
                    "-SecurityTypes",
                    "None",
                    "-geometry",
                    geometry,
                    "-depth",
                    "24",
                    "-rfbport",
                    &p,
                    "-localhost",
                    "-AlwaysShared",
                ],
                Some(port),
            )
            .await?;
            // The port may have been taken between free_port and the server's bind.
            match x.wait_rfb().await {
                Ok(()) => return Ok(x),
                Err(e) => last = e.to_string(),
            }
        }
        Err(RfbError::Bench(format!("Xvnc did not start: {last}")))
    }

    /// Start Xvfb.
    pub async fn xvfb(geometry: &str) -> Result<XServer, RfbError> {
        let screen = format!("{geometry}x24");
        XServer::start("Xvfb", &["-screen", "0", &screen], None).await
    }

    /// Start an X server that picks a free display number itself and reports it (`-displayfd`:
    /// no race with other tests or runs picking the same number), with `-noreset` (without it
    /// the server resets whenever its last client leaves, e.g. after an `xwd` screenshot, and
    /// a client connecting at that moment fails) and no TCP listener. Returns once the server
    /// accepts X clients.
    async fn start(
        program: &str,
        args: &[&str],
        rfb_port: Option<u16>,
    ) -> Result<XServer, RfbError> {
        use tokio::io::AsyncBufReadExt;
        let mut cmd = Command::new(program);
        cmd.args(["-displayfd", "1", "-noreset", "-nolisten", "tcp"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| RfbError::Bench(format!("cannot start {program}: {e}")))?;
        let out = child.stdout.take();
        let mut proc = Proc {
            name: program.to_string(),
            child,
        };
        let mut line = String::new();
        if let Some(out) = out {
            let mut out = tokio::io::BufReader::new(out);
            let read = out.read_line(&mut line);
            match tokio::time::timeout(Duration::from_secs(20), read).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(RfbError::Bench(format!("{program}: {e}"))),
                Err(_) => {
                    return Err(RfbError::Bench(format!(
                        "{program} did not report a display within 20 s"
                    )))
                }
            }
        }
        let display: u32 = line.trim().parse().map_err(|_| {
            let state = if proc.alive() { "running" } else { "exited" };
            RfbError::Bench(format!(
                "{program} did not report a display number (said {line:?}; {state})"
            ))
        })?;
        Ok(XServer {
            display,
            rfb_port,
            proc,
        })
    }

    pub fn rfb_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.rfb_port.unwrap_or(0)))
    }

    async fn wait_rfb(&mut self) -> Result<(), RfbError> {
        let addr = self.rfb_addr();
        for _ in 0..100 {
            if !self.proc.alive() {
                return Err(RfbError::Bench("Xvnc exited".into()));
            }
            if let Ok(mut s) = TcpStream::connect(addr).await {
                let mut v = [0u8; 12];
                if s.read_exact(&mut v).await.is_ok() && v.starts_with(b"RFB ") {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(RfbError::Bench(
            "Xvnc did not accept RFB connections within 10 s".into(),
        ))
    }
}

/// Bind 127.0.0.1:0.
pub async fn local_listener() -> Result<TcpListener, RfbError> {
    Ok(TcpListener::bind("127.0.0.1:0").await?)
}

/// Count pure-red pixels in an `xwd -root` dump (32 bits per pixel, either byte order).
pub fn red_pixels(xwd: &[u8]) -> Option<usize> {
    let f = |i: usize| -> Option<u32> {
        let b = xwd.get(i * 4..i * 4 + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    };
    let (header, width, height, order, bpp, stride) = (f(0)?, f(4)?, f(5)?, f(7)?, f(11)?, f(12)?);
    let (rm, gm, bm, ncolours) = (f(14)?, f(15)?, f(16)?, f(19)?);
    if bpp != 32 {
        return None;
    }
    let data = xwd.get(header as usize + ncolours as usize * 12..)?;
    let mut n = 0;
    for y in 0..height as usize {
        for x in 0..width as usize {
            let at = y * stride as usize + x * 4;
            let p = data.get(at..at + 4)?;
            let v = if order == 0 {
                u32::from_le_bytes([p[0], p[1], p[2], p[3]])
            } else {
                u32::from_be_bytes([p[0], p[1], p[2], p[3]])
            };
            if v & rm == rm && v & gm == 0 && v & bm == 0 {
                n += 1;
            }
        }
    }
    Some(n)
}

pub async fn screenshot_red(display: u32) -> usize {
    let out = Command::new("xwd")
        .args(["-root", "-silent", "-display", &format!(":{display}")])
        .output()
        .await;
    out.ok().and_then(|o| red_pixels(&o.stdout)).unwrap_or(0)
}

/// Run xdotool on a display; given up after 5 s (`windowfocus --sync` waits for the focus to
/// change, which may never happen if the window went away).
pub async fn xdotool(display: u32, args: &[&str]) {
    let run = Command::new("xdotool")
        .args(args)
        .env("DISPLAY", format!(":{display}"))
        .kill_on_drop(true)
        .output();
    let _ = tokio::time::timeout(Duration::from_secs(5), run).await;
}

pub async fn window(display: u32, args: &[&str]) -> Option<String> {
    let out = Command::new("xdotool")
        .arg("search")
        .args(args)
        .env("DISPLAY", format!(":{display}"))
        .output()
        .await
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(str::to_string)
}

/// Give the server's xterm and the viewer's window their displays' keyboard focus; returns
/// what each display's focus then is, for the failure message.
pub async fn give_focus(server: u32, viewer: u32) -> String {
    let xterm = window(server, &["--class", "xterm"]).await;
    if let Some(w) = &xterm {
        xdotool(server, &["windowfocus", "--sync", w]).await;
    }
    let tiger = window(viewer, &["--name", "TigerVNC"]).await;
    if let Some(w) = &tiger {
        xdotool(viewer, &["windowfocus", "--sync", w]).await;
    }
    let focused = |display: u32| async move {
        Command::new("xdotool")
            .arg("getwindowfocus")
            .env("DISPLAY", format!(":{display}"))
            .output()
            .await
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    format!(
        "server xterm {xterm:?} focused {:?}, viewer window {tiger:?} focused {:?}",
        focused(server).await,
        focused(viewer).await
    )
}

/// A red xterm filling the top left of `display` whose shell writes what is typed to `file`:
/// what a viewer must show, and where its keys land.
pub fn red_xterm_writing_to(display: u32, file: &Path) -> Result<Proc, RfbError> {
    let script = format!("cat > '{}'", file.display());
    Proc::spawn(
        "xterm",
        &[
            "-geometry",
            "120x50+0+0",
            "-bg",
            "red",
            "-fg",
            "white",
            "-e",
            "sh",
            "-c",
            &script,
        ],
        Some(display),
    )
}

/// An unmodified TigerVNC `vncviewer` on `display`, at the top left, connected to port
/// `port` of 127.0.0.1.
pub fn vncviewer(display: u32, port: u16) -> Result<Proc, RfbError> {
    let target = format!("127.0.0.1::{port}");
    Proc::spawn("vncviewer", &["-geometry", "+0+0", &target], Some(display))
}

/// Type `want` and Return into the viewer window on display `viewer`, over an xterm on display
/// `server` that writes what it reads to `file`, until `file` holds a line equal to `want`
/// (45 s at most); the error says what the file held and where the focus was.
///
/// Setup only (a window manager would do this): the xterm gets the server's keyboard focus and
/// the viewer window the viewer display's. Both are given again before each try: with no
/// window manager, focus reverts to nothing when a window is unmapped and mapped again (the
/// viewer does so while it settles on the server's size), and a loaded machine (CI) settles
/// later than the first try. A try whose keys arrive slowly can interleave with the next one:
/// success is one whole line equal to the text, whichever try wrote it.
pub async fn type_through_viewer(
    server: u32,
    viewer: u32,
    file: &Path,
    want: &str,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(45);
    let mut got = String::new();
    let mut attempt = 0;
    let mut focus = String::new();
    while std::time::Instant::now() < deadline && !got.lines().any(|l| l == want) {
        if attempt % 10 == 0 {
            focus = give_focus(server, viewer).await;
            xdotool(viewer, &["mousemove", "200", "200"]).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            xdotool(viewer, &["type", "--delay", "30", want]).await;
            xdotool(viewer, &["key", "Return"]).await;
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
        got = std::fs::read_to_string(file).unwrap_or_default();
    }
    if got.lines().any(|l| l == want) {
        Ok(())
    } else {
        Err(format!(
            "keys typed in the viewer did not reach the server's xterm; file holds {got:?} \
             (focus: {focus})"
        ))
    }
}

/// Wait until display `display` shows more than `at_least` pure-red pixels (25 s at most);
/// returns the last count.
pub async fn wait_for_red(display: u32, at_least: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(25);
    let mut red = 0;
    while std::time::Instant::now() < deadline {
        red = screenshot_red(display).await;
        if red > at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    red
}
