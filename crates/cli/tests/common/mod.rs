//! Helpers shared by the process-level tests: temporary homes, spawning `ndd` sides and
//! collecting their output with bounded waits, and a TCP proxy that injects link faults.
#![allow(dead_code)]

#[allow(unused_imports)] // each test binary uses some of them
pub use ndd_procs::{have, missing, python_with, read_s16le, wait_for, Killed, Pulse, Tone, Xvfb};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

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
    c.env("NDD_LOG", "warn,ndd::session=info,ndd_link::establish=info")
        .env_remove("NDD_HOME");
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

/// A running side: its stderr lines are collected; stdout is collected in full. Killed on
/// drop, so a failing test leaves no `ndd` behind.
pub struct Side {
    child: Option<Child>,
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
            child: Some(child),
            stderr: lines,
            stdout: Some(stdout),
            stderr_done: Some(stderr_done),
            listening: rx,
        }
    }

    /// Kills the process at once (SIGKILL: no cleanup, no goodbye) and reaps it.
    pub fn kill(mut self) -> String {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(t) = self.stderr_done.take() {
            let _ = t.join();
        }
        self.stderr_now()
    }

    /// Sends SIGTERM (a clean stop, as systemd or `kill` would ask).
    pub fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Sends SIGINT (Ctrl-C at a terminal).
    pub fn interrupt(&self) {
        self.signal("-INT");
    }

    /// Sends SIGHUP (reload, for `ndd serve`).
    pub fn hangup(&self) {
        self.signal("-HUP");
    }

    /// Stops the process where it is (SIGSTOP), until [`Side::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
        }
    }

    /// The process's id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the process is still running (it has not exited, cleanly or not).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits (bounded by [`WAIT`]) until this side's stderr holds `needle`; on timeout the
    /// panic carries this side's stderr and that of `others`, so a CI failure says why.
    pub fn wait_says(&self, needle: &str, others: &[&Side]) {
        let t0 = Instant::now();
        while !self.stderr_now().contains(needle) {
            if t0.elapsed() > WAIT {
                let rest: Vec<String> = others.iter().map(|s| s.stderr_now()).collect();
                panic!(
                    "timed out waiting for {needle:?}; stderr:\n{}\nother sides:\n{}",
                    self.stderr_now(),
                    rest.join("\n---\n")
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
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
        let mut stdin = self.child.as_mut().unwrap().stdin.take().unwrap();
        thread::spawn(move || {
            let _ = stdin.write_all(&data);
        })
    }

    /// Waits for exit (bounded), returns (status, stdout, stderr text).
    pub fn finish(mut self) -> (ExitStatus, Vec<u8>, String) {
        let mut child = self.child.take().expect("not finished yet");
        drop(child.stdin.take());
        let t = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > WAIT {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "ndd did not exit in time; stderr: {:?}",
                    self.stderr.lock().unwrap()
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        let out = self.stdout.take().unwrap().join().unwrap();
        // The stderr reader ends at EOF, which the exit guarantees.
        self.stderr_done.take().unwrap().join().unwrap();
        let err = self.stderr.lock().unwrap().join("\n");
        (status, out, err)
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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

/// The recovery times a side logged (`link restored after N ms`), in order.
pub fn recoveries(err: &str) -> Vec<String> {
    err.lines()
        .filter_map(|l| l.split("link restored after ").nth(1))
        .map(|r| r.split(';').next().unwrap_or("").to_string())
        .collect()
}

/// The check line a `check` sink prints for a stream that got `n` frames, all correct.
pub fn check_ok(stream: &str, n: u64) -> String {
    format!(
        "stream \"{stream}\": check: {n} frames, seq 0..={}, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK",
        n - 1
    )
}

/// Proxy modes.
pub const PASS: u8 = 0;
/// Hold every byte back (a blackhole): nothing is closed, nothing gets through.
pub const BLOCK: u8 = 1;
/// Close every new connection at once without reaching upstream (the peer is unreachable).
pub const REFUSE: u8 = 2;

/// A TCP proxy in front of `upstream` that the test controls: forwards both ways, can cut
/// every connection at once (mid-frame, whatever is in flight), stop forwarding without
/// closing anything, or turn new connections away.
pub struct Proxy {
    pub addr: String,
    mode: Arc<AtomicU8>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    /// Connections accepted and forwarded upstream so far.
    pub accepted: Arc<AtomicUsize>,
}

impl Proxy {
    pub fn start(upstream: String) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let mode = Arc::new(AtomicU8::new(PASS));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (m, c, a) = (mode.clone(), conns.clone(), accepted.clone());
        thread::spawn(move || {
            for client in l.incoming() {
                let Ok(client) = client else { return };
                if m.load(Ordering::SeqCst) == REFUSE {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                a.fetch_add(1, Ordering::SeqCst);
                c.lock().unwrap().push(client.try_clone().unwrap());
                c.lock().unwrap().push(server.try_clone().unwrap());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let m = m.clone();
                    thread::spawn(move || {
                        let mut buf = [0u8; 1500];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            // Blackhole: hold the bytes back until forwarding resumes; a
                            // connection cut meanwhile just ends here.
                            while m.load(Ordering::SeqCst) == BLOCK {
                                thread::sleep(Duration::from_millis(5));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy {
            addr,
            mode,
            conns,
            accepted,
        }
    }

    /// Switches to `PASS`, `BLOCK` or `REFUSE`.
    pub fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    /// Cuts every connection now, in whatever state it is.
    pub fn cut(&self) {
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Connections forwarded so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Starts the app side listening on a free loopback port, then the device side connecting
/// to it: (app, device).
pub fn start_pair(
    app_cfg: &Path,
    dev_cfg: &Path,
    app_home: &Path,
    dev_home: &Path,
) -> (Side, Side) {
    let app = Side::spawn(run_cmd(
        app_cfg,
        "app",
        app_home,
        &["--listen", "127.0.0.1:0"],
    ));
    let addr = app.addr();
    let dev = Side::spawn(run_cmd(dev_cfg, "device", dev_home, &["--connect", &addr]));
    (app, dev)
}

/// Runs `cfg` with the device side connecting through a [`Proxy`] that cuts every
/// connection `cuts` times, `after` once each new connection is up; waits for both sides to
/// end, prints the recovery times, checks both succeeded and returns (device, app) stderr.
pub fn run_with_cuts(
    cfg: &Path,
    dev_home: &Path,
    app_home: &Path,
    cuts: usize,
    after: Duration,
) -> (String, String) {
    let app = Side::spawn(run_cmd(cfg, "app", app_home, &["--listen", "127.0.0.1:0"]));
    let proxy = Proxy::start(app.addr());
    let dev = Side::spawn(run_cmd(
        cfg,
        "device",
        dev_home,
        &["--connect", &proxy.addr],
    ));
    for round in 1..=cuts {
        wait_for("a connection", Duration::from_secs(30), || {
            proxy.accepted() >= round
        });
        thread::sleep(after);
        proxy.cut();
    }
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    println!("recoveries (device side): {:?}", recoveries(&derr));
    println!("recoveries (app side): {:?}", recoveries(&aerr));
    assert!(ds.success(), "device: {derr}");
    assert!(as_.success(), "app: {aerr}");
    (derr, aerr)
}

/// A loopback `host:port` free right now for TCP and UDP listeners alike, for a process a
/// test starts to listen on. The port is below the kernel's ephemeral range (32768–60999 by
/// default): a port the kernel handed out could meanwhile become an outgoing connection's own
/// port, and a client retrying a port nobody listens on yet can even be connected to itself
/// there (TCP's simultaneous open) — either way the listener could not bind and the test would
/// wait for a session that never comes. Each call in a process takes the next port.
pub fn free_addr() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    const FIRST: usize = 20000;
    const SPAN: usize = 12000;
    let start = (std::process::id() as usize).wrapping_mul(7919) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let addr = format!("127.0.0.1:{}", FIRST + (start + n) % SPAN);
        if TcpListener::bind(&addr).is_ok() && std::net::UdpSocket::bind(&addr).is_ok() {
            return addr;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN)
}

/// The sequence numbers of the synthetic frames (`seed`, `count` made) in a file a `file`
/// sink wrote with `framing = "length"`; panics on anything else in it.
pub fn synthetic_seqs_in(path: &Path, seed: u64, count: u64) -> Vec<u64> {
    seeded_frames_in(path, &[seed], count)
        .into_iter()
        .map(|(_, seq)| seq)
        .collect()
}

/// The (seed, seq) of each frame in a length-framed file of synthetic frames made with one
/// of `seeds` (each counting from 0 up to `count`); panics on a frame none of them made.
pub fn seeded_frames_in(path: &Path, seeds: &[u64], count: u64) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let mut next: Vec<u64> = vec![0; seeds.len()];
    let mut got = Vec::new();
    let mut at = 0;
    while at + 4 <= bytes.len() {
        let n = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let p = &bytes[at + 4..at + 4 + n];
        // Mostly the next one of some seed; else search.
        let hit = (0..seeds.len())
            .find(|&i| ndd_endpoint::synthetic::verify(seeds[i], next[i], p))
            .map(|i| (i, next[i]))
            .or_else(|| {
                (0..seeds.len()).find_map(|i| {
                    (0..count)
                        .find(|&q| ndd_endpoint::synthetic::verify(seeds[i], q, p))
                        .map(|q| (i, q))
                })
            })
            .expect("a frame one of the sources made");
        next[hit.0] = hit.1 + 1;
        got.push((seeds[hit.0], hit.1));
        at += 4 + n;
    }
    assert_eq!(at, bytes.len(), "whole frames only");
    got
}

/// Runs `cfg` on a fixed loopback port; once `flowing()` holds, kills the app side (SIGKILL:
/// no goodbye), calls `at_kill` (to note what the first app wrote) and starts the app side
/// again. Waits for both sides to end, prints the recovery time, checks both succeeded and
/// the device saw a new peer; returns (device stderr, app stderr, what `at_kill` returned).
pub fn run_with_app_restart<T>(
    cfg: &Path,
    dev_home: &Path,
    app_home: &Path,
    flowing: impl FnMut() -> bool,
    at_kill: impl FnOnce() -> T,
) -> (String, String, T) {
    let addr = free_addr();
    let app1 = Side::spawn(run_cmd(cfg, "app", app_home, &["--listen", &addr]));
    let _ = app1.addr();
    let dev = Side::spawn(run_cmd(cfg, "device", dev_home, &["--connect", &addr]));
    wait_for("frames to flow", Duration::from_secs(30), flowing);
    let t_kill = std::time::Instant::now();
    app1.kill();
    let noted = at_kill();
    let app2 = Side::spawn(run_cmd(cfg, "app", app_home, &["--listen", &addr]));
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app2.finish();
    println!(
        "recovered after the restart: {:?} (kill to end {:?})",
        recoveries(&derr),
        t_kill.elapsed()
    );
    assert!(ds.success(), "device: {derr}");
    assert!(as_.success(), "app: {aerr}");
    assert!(derr.contains("the peer restarted"), "{derr}");
    (derr, aerr, noted)
}

/// How a stream's sequence numbers arrived: the next one expected after the highest seen,
/// how many came again (at or below one already seen), and the ranges never seen.
pub fn order(seqs: impl IntoIterator<Item = u64>) -> (u64, usize, Vec<std::ops::Range<u64>>) {
    let (mut expect, mut dups, mut lost) = (0u64, 0, Vec::new());
    for s in seqs {
        if s < expect {
            dups += 1;
        } else {
            if s > expect {
                lost.push(expect..s);
            }
            expect = s + 1;
        }
    }
    (expect, dups, lost)
}

/// A named pipe `name` in `dir`, opened read-write: opening does not block, and the pipe
/// never reports end of file while the test holds it, so a stream reading it cannot end
/// behind the test's back (dropping the returned file ends it).
pub fn fifo(dir: &Path, name: &str) -> (PathBuf, std::fs::File) {
    let path = dir.join(name);
    assert!(Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("mkfifo runs")
        .success());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open the fifo");
    (path, file)
}

/// Runs an unmodified ffmpeg on the y4m stream `fifo` (at most `frames` pictures, within
/// `limit_s` seconds when given) keeping each picture's frame-number strip as gray bytes in
/// `strip`; its output and the numbers read back (`None` for a strip that does not read).
pub fn frame_numbers(
    fifo: &std::path::Path,
    strip: &std::path::Path,
    frames: Option<&str>,
    limit_s: Option<&str>,
) -> (std::process::Output, Vec<Option<u32>>) {
    let mut c = match limit_s {
        // Bounded: with no stream to read, ffmpeg would wait on the pipe for good.
        Some(s) => {
            let mut c = std::process::Command::new("timeout");
            c.args([s, "ffmpeg"]);
            c
        }
        None => std::process::Command::new("ffmpeg"),
    };
    c.args(["-loglevel", "error", "-f", "yuv4mpegpipe", "-i"])
        .arg(fifo);
    if let Some(n) = frames {
        c.args(["-frames:v", n]);
    }
    let out = c
        .args([
            "-vf",
            "crop=512:16:0:0",
            "-pix_fmt",
            "gray",
            "-f",
            "rawvideo",
            "-y",
        ])
        .arg(strip)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("ffmpeg");
    let numbers = std::fs::read(strip)
        .unwrap_or_default()
        .chunks_exact(512 * 16)
        .map(|f| ndd_endpoint::camera::pattern::read_number(f, 512))
        .collect();
    (out, numbers)
}

/// GET `path` from `addr` (HTTP/1.1); the whole response.
pub fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Two network namespaces joined by a veth pair (10.231.N.1 and .2), removed on drop.
pub struct Lan {
    /// The first namespace (10.231.N.1).
    pub a: String,
    /// The second namespace (10.231.N.2).
    pub b: String,
    /// The veth end in `a`.
    va: String,
    net: u32,
}

impl Lan {
    /// `None` where namespaces cannot be made (not root, no `ip`).
    pub fn new() -> Option<Lan> {
        let id = std::process::id() % 100_000;
        let (a, b) = (format!("nddda{id}"), format!("ndddb{id}"));
        let (va, vb) = (format!("dva{id}"), format!("dvb{id}"));
        let net = id % 200 + 20;
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !ok(&["netns", "add", &a]) {
            return None;
        }
        let lan = Lan {
            a,
            b,
            va: va.clone(),
            net,
        };
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), lan.b.clone()],
            vec![
                "link".into(),
                "add".into(),
                va.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                vb.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                va.clone(),
                "netns".into(),
                lan.a.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                vb.clone(),
                "netns".into(),
                lan.b.clone(),
            ],
            vec![
                "-n".into(),
                lan.a.clone(),
                "addr".into(),
                "add".into(),
                format!("10.231.{net}.1/24"),
                "dev".into(),
                va.clone(),
            ],
            vec![
                "-n".into(),
                lan.b.clone(),
                "addr".into(),
                "add".into(),
                format!("10.231.{net}.2/24"),
                "dev".into(),
                vb.clone(),
            ],
            vec![
                "-n".into(),
                lan.a.clone(),
                "link".into(),
                "set".into(),
                va,
                "up".into(),
            ],
            vec![
                "-n".into(),
                lan.b.clone(),
                "link".into(),
                "set".into(),
                vb,
                "up".into(),
            ],
            vec![
                "-n".into(),
                lan.a.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                lan.b.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
        ];
        for s in &steps {
            let s: Vec<&str> = s.iter().map(String::as_str).collect();
            if !ok(&s) {
                return None;
            }
        }
        Some(lan)
    }

    /// `ndd ARGS` run in namespace `ns`.
    pub fn ndd(ns: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(env!("CARGO_BIN_EXE_ndd"))
            .args(args);
        c
    }

    /// The address of namespace `b` (`.2`) at `port`.
    pub fn b_addr(&self, port: u16) -> String {
        format!("10.231.{}.2:{port}", self.net)
    }

    /// Takes the wire down (`up = false`: nothing passes either way, as a pulled cable) or
    /// back up.
    pub fn wire(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let ok = Command::new("ip")
            .args(["-n", &self.a, "link", "set", &self.va, state])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(ok, "cannot set {} {state} in {}", self.va, self.a);
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// The app side's home trusting `n` device homes (named `lab0`…), each trusting the app.
pub fn lab_homes(dir: &Path, n: usize) -> (PathBuf, Vec<PathBuf>) {
    let app = dir.join("app");
    let afp = ok(ndd().args(["id", "--home"]).arg(&app))
        .trim()
        .to_string();
    let devs: Vec<PathBuf> = (0..n)
        .map(|i| {
            let d = dir.join(format!("dev{i}"));
            let dfp = ok(ndd().args(["id", "--home"]).arg(&d)).trim().to_string();
            ok(ndd()
                .args(["trust", &afp, "--name", "app", "--home"])
                .arg(&d));
            ok(ndd()
                .args(["trust", &dfp, "--name", &format!("lab{i}"), "--home"])
                .arg(&app));
            d
        })
        .collect();
    (app, devs)
}

/// A socat pty pair playing a serial device: `port` (what ndd opens) and `device` (the
/// test's end), both links in `dir`; socat is killed with the returned guard.
pub fn pty_pair(dir: &Path) -> (Killed, PathBuf, PathBuf) {
    let (port, device) = (dir.join("port"), dir.join("device"));
    let socat = Killed(
        Command::new("socat")
            .arg(format!("pty,raw,echo=0,link={}", port.display()))
            .arg(format!("pty,raw,echo=0,link={}", device.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("socat"),
    );
    wait_for("the pty pair", WAIT, || port.exists() && device.exists());
    (socat, port, device)
}

/// The keysyms of the key presses `wev` printed (its log), in order; wev says each press's
/// keysym twice, once kept.
pub fn wev_pressed_syms(log: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut pressed = false;
    for l in log.lines() {
        if l.contains("wl_keyboard] key:") {
            pressed = l.contains("(pressed)");
        } else if pressed && l.trim_start().starts_with("sym:") {
            let s = l.trim_start()["sym:".len()..].split_whitespace().next();
            out.push(s.unwrap_or("").to_string());
            pressed = false;
        }
    }
    out.dedup();
    out
}

/// The app side's X11 desktop: a 640×480 Xvfb whose screen is `#3366cc`.
pub fn blue_xvfb() -> ndd_procs::Xvfb {
    let x = ndd_procs::Xvfb::start("640x480x24").expect("Xvfb");
    assert!(std::process::Command::new("xsetroot")
        .args(["-display", &x.display, "-solid", "#3366cc"])
        .status()
        .unwrap()
        .success());
    x
}

/// `xev` over the whole of `x`'s screen, reporting key events: the process (killed on drop)
/// and what it printed so far.
pub fn xev_keyboard(x: &ndd_procs::Xvfb) -> (Killed, Arc<Mutex<String>>) {
    ndd_procs::spawn_collecting(
        std::process::Command::new("xev")
            .env("DISPLAY", &x.display)
            .args(["-geometry", "640x480+0+0", "-event", "keyboard"])
            .stderr(std::process::Stdio::null()),
    )
    .expect("xev")
}
