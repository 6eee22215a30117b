//! Helpers shared by the process-level tests: temporary homes, spawning `ndd` sides and
//! collecting their output with bounded waits.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

pub const WAIT: Duration = Duration::from_secs(90);

pub struct Dir(pub PathBuf);
impl Dir {
    pub fn new(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("ndd-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn ndd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ndd"));
    c.env("NDD_LOG", "warn").env_remove("NDD_HOME");
    c
}

pub fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("ndd runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Two homes; `trust` says who trusts whom (device trusts app, app trusts device).
pub fn homes(
    dir: &Path,
    dev_trusts_app: bool,
    app_trusts_dev: bool,
) -> (PathBuf, PathBuf, String, String) {
    let (d, a) = (dir.join("dev"), dir.join("app"));
    let dfp = ok(ndd().args(["id", "--home"]).arg(&d)).trim().to_string();
    let afp = ok(ndd().args(["id", "--home"]).arg(&a)).trim().to_string();
    if dev_trusts_app {
        ok(ndd()
            .args(["trust", &afp, "--name", "app", "--home"])
            .arg(&d));
    }
    if app_trusts_dev {
        ok(ndd()
            .args(["trust", &dfp, "--name", "device", "--home"])
            .arg(&a));
    }
    (d, a, dfp, afp)
}

/// A running side: its stderr lines are collected; stdout is collected in full.
pub struct Side {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    stdout: Option<thread::JoinHandle<Vec<u8>>>,
    stderr_done: Option<thread::JoinHandle<()>>,
    listening: mpsc::Receiver<String>,
}

impl Side {
    pub fn spawn(mut cmd: Command) -> Side {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ndd");
        let err = child.stderr.take().unwrap();
        let mut out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let l2 = lines.clone();
        let stderr_done = thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening on ").nth(1) {
                    let _ = tx.send(addr.trim().to_string());
                }
                l2.lock().unwrap().push(line);
            }
        });
        let stdout = thread::spawn(move || {
            let mut v = Vec::new();
            let _ = out.read_to_end(&mut v);
            v
        });
        Side {
            child,
            stderr: lines,
            stdout: Some(stdout),
            stderr_done: Some(stderr_done),
            listening: rx,
        }
    }

    /// Kills the process at once (SIGKILL: no cleanup, no goodbye) and reaps it.
    pub fn kill(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(t) = self.stderr_done.take() {
            let _ = t.join();
        }
        self.stderr_now()
    }

    /// Stderr lines so far.
    pub fn stderr_now(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    pub fn addr(&self) -> String {
        self.listening.recv_timeout(WAIT).unwrap_or_else(|_| {
            panic!(
                "no 'listening on' line; stderr: {:?}",
                self.stderr.lock().unwrap()
            )
        })
    }

    pub fn feed(&mut self, data: Vec<u8>) -> thread::JoinHandle<()> {
        let mut stdin = self.child.stdin.take().unwrap();
        thread::spawn(move || {
            let _ = stdin.write_all(&data);
        })
    }

    /// Waits for exit (bounded), returns (status, stdout, stderr text).
    pub fn finish(mut self) -> (ExitStatus, Vec<u8>, String) {
        drop(self.child.stdin.take());
        let (tx, rx) = mpsc::channel();
        let mut child = self.child;
        thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let status = match rx.recv_timeout(WAIT) {
            Ok(s) => s.unwrap(),
            Err(_) => panic!(
                "ndd did not exit in time; stderr: {:?}",
                self.stderr.lock().unwrap()
            ),
        };
        let out = self.stdout.take().unwrap().join().unwrap();
        // The stderr reader ends at EOF, which the exit guarantees.
        self.stderr_done.take().unwrap().join().unwrap();
        let err = self.stderr.lock().unwrap().join("\n");
        (status, out, err)
    }
}

pub fn run_cmd(cfg: &Path, side: &str, home: &Path, extra: &[&str]) -> Command {
    let mut c = ndd();
    c.arg("run")
        .arg(cfg)
        .args(["--side", side, "--home"])
        .arg(home)
        .args(extra);
    c
}

pub fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u8
        })
        .collect()
}
