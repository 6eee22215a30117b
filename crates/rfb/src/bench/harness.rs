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

/// A display number with neither a socket nor a lock file, starting at a pseudo-random
/// offset so concurrent runs rarely collide.
pub fn free_display() -> u32 {
    let start = 100 + (std::process::id() % 400);
    (start..start + 500)
        .find(|n| {
            !Path::new(&format!("/tmp/.X11-unix/X{n}")).exists()
                && !Path::new(&format!("/tmp/.X{n}-lock")).exists()
        })
        .unwrap_or(start)
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
            let display = free_display();
            let port = free_port()?;
            let d = format!(":{display}");
            let p = port.to_string();
            let proc = Proc::spawn(
                "Xvnc",
                &[
                    &d,
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
                    "-nolisten",
                    "tcp",
                ],
                None,
            )?;
            let mut x = XServer {
                display,
                rfb_port: Some(port),
                proc,
            };
            match x.wait_rfb().await {
                Ok(()) => {
                    x.wait_x().await?;
                    return Ok(x);
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(RfbError::Bench(format!("Xvnc did not start: {last}")))
    }

    /// Start Xvfb.
    pub async fn xvfb(geometry: &str) -> Result<XServer, RfbError> {
        let mut last = String::new();
        for _ in 0..5 {
            let display = free_display();
            let d = format!(":{display}");
            let screen = format!("{geometry}x24");
            let proc = Proc::spawn(
                "Xvfb",
                &[&d, "-screen", "0", &screen, "-nolisten", "tcp"],
                None,
            )?;
            let mut x = XServer {
                display,
                rfb_port: None,
                proc,
            };
            match x.wait_x().await {
                Ok(()) => return Ok(x),
                Err(e) => last = e.to_string(),
            }
        }
        Err(RfbError::Bench(format!("Xvfb did not start: {last}")))
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

    async fn wait_x(&mut self) -> Result<(), RfbError> {
        let sock = format!("/tmp/.X11-unix/X{}", self.display);
        for _ in 0..100 {
            if !self.proc.alive() {
                return Err(RfbError::Bench(format!(
                    "X server :{} exited",
                    self.display
                )));
            }
            if Path::new(&sock).exists() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(RfbError::Bench(format!(
            "X server :{} not ready within 10 s",
            self.display
        )))
    }
}

/// Bind 127.0.0.1:0.
pub async fn local_listener() -> Result<TcpListener, RfbError> {
    Ok(TcpListener::bind("127.0.0.1:0").await?)
}
