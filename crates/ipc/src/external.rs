//! `external`: a pair whose halves are separate programs.
//!
//! Synopsis:
//! `{ type = "external", name = "upper", forward = ["python3", "upper.py"], inverse =
//! ["python3", "lower.py"], placement = "pipe", timeout_ms = 1000, restart = "never" }`.
//!
//! | key | type | default | meaning |
//! |---|---|---|---|
//! | `name` | string | required | module name: in errors, logs and the handshake |
//! | `forward` | [string] | required | argv of the source-side program |
//! | `inverse` | [string] | required | argv of the sink-side program |
//! | `placement` | `"pipe"` \| `"shm"` | `"pipe"` | how frames reach the child |
//! | `timeout_ms` | 1..=600000 | 1000 | longest wait for a reply to one request (its start, the answer to `HELLO`, may take up to [`HELLO_WAIT`] = 10 s) |
//! | `restart` | `"never"` \| `"on-failure"` | `"never"` | restart a child that died, hung or wrote garbage, once per failure |
//! | `ring_kib` | power of two, 4..=1048576 | 1024 | shm: bytes per ring direction |
//! | `spin` | 0..=1000000 | 2000 | shm: polls of the ring index before sleeping on the futex |
//! | `arena_kib` | 0..=1048576, a multiple of 4 | 4096 | shm: the frame area where a child transforms frames in place (0 = off; larger frames go through the ring) |
//!
//! Handshake: [`Pair::describe`] is `external(name=…)`. Only the name takes part: commands,
//! placement, timeout, restart and ring settings are local choices that may differ between the
//! two machines (paths differ; one side may use shm and the other pipes) without changing what
//! the frames look like. Rename the module when you change its format.

use crate::child::{self, Handler};
use crate::error::{ChildFault, ExternalError, Failure, StartError, Who};
use crate::proto::{HalfRole, ProtoError, Reply, Request};
use crate::shm;
use crate::transport::{Liveness, PipeTransport, ShmTransport, Transport, TransportError};
use bytes::Bytes;
use ndd_core::frame::DEFAULT_HEADROOM;
use ndd_core::{
    ControlError, ForeignError, Frame, FrameError, Half, HalfStats, Meta, ModuleError, Output,
    Pair, ParamError, SetupError,
};
use serde::Deserialize;
use std::io::BufRead;
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The pair's name, first in its parameter errors.
const PAIR: &str = "external";

/// Module id of `external` in the handshake.
pub const EXTERNAL_ID: u16 = 100;
/// The parameters of `external` as `(key, type, default, doc)`, in canonical order, for the
/// module catalogue (`ndd modules`).
pub const PARAMS: &[(&str, &str, &str, &str)] = &[
    (
        "name",
        "string",
        "(required)",
        "module name: in errors, logs and the handshake",
    ),
    (
        "forward",
        "[string]",
        "(required)",
        "argv of the source-side program",
    ),
    (
        "inverse",
        "[string]",
        "(required)",
        "argv of the sink-side program",
    ),
    (
        "placement",
        "\"pipe\" | \"shm\"",
        "\"pipe\"",
        "how frames reach the child",
    ),
    (
        "timeout_ms",
        "1..=600000",
        "1000",
        "longest wait for the reply to one request",
    ),
    (
        "restart",
        "\"never\" | \"on-failure\"",
        "\"never\"",
        "restart a child that died, hung or wrote garbage, once per failure",
    ),
    (
        "ring_kib",
        "power of two, 4..=1048576",
        "1024",
        "shm: bytes per ring direction",
    ),
    (
        "spin",
        "0..=1000000",
        "2000",
        "shm: polls before sleeping on the futex",
    ),
    (
        "arena_kib",
        "0..=1048576, a multiple of 4",
        "4096",
        "shm: frame area where a child transforms frames in place (0 = off)",
    ),
];

/// Default `spin`.
pub const DEFAULT_SPIN: u32 = 2000;

/// How frames reach the child.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Length-prefixed messages on the child's stdin/stdout.
    #[default]
    Pipe,
    /// The same messages through a shared-memory ring (the child needs a ring library).
    Shm,
}

impl Placement {
    /// `pipe` or `shm`.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Pipe => "pipe",
            Placement::Shm => "shm",
        }
    }
}

/// What happens after a child fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Restart {
    /// The failure is a module error (fatal for the stream).
    #[default]
    Never,
    /// Start a new child and retry the request once; a second failure is a module error.
    OnFailure,
}

/// How long a child may take to answer `HELLO` at least (its start), whatever `timeout_ms`.
pub const HELLO_WAIT: Duration = Duration::from_secs(10);

fn default_timeout_ms() -> u64 {
    1000
}
fn default_ring_kib() -> u32 {
    1024
}
fn default_spin() -> u32 {
    DEFAULT_SPIN
}
fn default_arena_kib() -> u32 {
    4096
}

/// Parameters of `external`. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalConfig {
    /// Module name.
    pub name: String,
    /// Source-side argv.
    pub forward: Vec<String>,
    /// Sink-side argv.
    pub inverse: Vec<String>,
    /// Pipe or shared memory.
    #[serde(default)]
    pub placement: Placement,
    /// Reply timeout.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Restart policy.
    #[serde(default)]
    pub restart: Restart,
    /// shm ring size per direction, KiB.
    #[serde(default = "default_ring_kib")]
    pub ring_kib: u32,
    /// shm spin count.
    #[serde(default = "default_spin")]
    pub spin: u32,
    /// shm frame area, KiB (0 = none).
    #[serde(default = "default_arena_kib")]
    pub arena_kib: u32,
}

impl ExternalConfig {
    /// A config with defaults for everything but the name and the two commands.
    pub fn new(name: &str, forward: &[&str], inverse: &[&str]) -> ExternalConfig {
        ExternalConfig {
            name: name.to_string(),
            forward: forward.iter().map(|s| s.to_string()).collect(),
            inverse: inverse.iter().map(|s| s.to_string()).collect(),
            placement: Placement::Pipe,
            timeout_ms: default_timeout_ms(),
            restart: Restart::Never,
            ring_kib: default_ring_kib(),
            spin: default_spin(),
            arena_kib: default_arena_kib(),
        }
    }

    /// Checks ranges; the error names the parameter.
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(ParamError::Invalid {
                pair: PAIR,
                param: "name",
                value: self.name.clone(),
                reason: "must be non-empty ASCII letters, digits, '-', '_' or '.'",
            });
        }
        for (param, argv) in [("forward", &self.forward), ("inverse", &self.inverse)] {
            if argv.is_empty() {
                return Err(ParamError::Missing {
                    pair: PAIR,
                    param,
                    what: "a program",
                });
            }
        }
        ParamError::check_range(PAIR, "timeout_ms", self.timeout_ms, 1..=600_000)?;
        ParamError::check_range(PAIR, "ring_kib", self.ring_kib, 4..=1 << 20)?;
        if !self.ring_kib.is_power_of_two() {
            return Err(ParamError::NotPowerOfTwo {
                pair: PAIR,
                param: "ring_kib",
                value: self.ring_kib.into(),
            });
        }
        ParamError::check_range(PAIR, "arena_kib", self.arena_kib, 0..=1 << 20)?;
        if self.arena_kib & 3 != 0 {
            return Err(ParamError::Invalid {
                pair: PAIR,
                param: "arena_kib",
                value: self.arena_kib.to_string(),
                reason: "must be a multiple of 4 (whole 4 KiB pages)",
            });
        }
        ParamError::check_range(PAIR, "spin", self.spin, 0..=1_000_000)
    }

    fn argv(&self, role: HalfRole) -> &[String] {
        match role {
            HalfRole::Forward => &self.forward,
            HalfRole::Inverse => &self.inverse,
        }
    }
}

impl Pair for ExternalConfig {
    fn name(&self) -> &'static str {
        PAIR
    }
    fn id(&self) -> u16 {
        EXTERNAL_ID
    }
    fn describe(&self) -> String {
        format!("external(name={})", self.name)
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        Ok(Box::new(ExternalHalf::spawn(self, HalfRole::Forward)?))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        Ok(Box::new(ExternalHalf::spawn(self, HalfRole::Inverse)?))
    }
}

/// Makes a fresh handler for an in-process child (called again on restart).
pub type HandlerFactory = Arc<dyn Fn() -> Box<dyn Handler> + Send + Sync>;

enum Launcher {
    Process(Vec<String>),
    Thread(HandlerFactory),
}

/// A running child and the channel to it. Dropping it closes the channel, kills and reaps a
/// process child, and joins a thread child that ends within 100 ms.
struct Conn {
    transport: Option<Box<dyn Transport>>,
    process: Option<Child>,
    thread: Option<JoinHandle<()>>,
    /// The shared frame area (shm with `arena_kib` > 0).
    arena: Option<shm::Arena>,
    /// The child said (before its answer to `HELLO`) that it takes frames in the area.
    in_place: bool,
}

impl Conn {
    /// For a frame to a child that takes frames in place, when it fits the frame area: puts
    /// its payload there and returns the `FRAME_IN_ARENA` request to send instead.
    fn put_in_arena(&self, req: &Request<'_>) -> Option<Vec<u8>> {
        let Request::Frame {
            now_ns,
            meta,
            payload,
        } = *req
        else {
            return None;
        };
        let arena = self.arena.as_ref().filter(|_| self.in_place)?;
        arena.put(payload).then(|| {
            let len = payload.len() as u32;
            Request::FrameInArena { now_ns, meta, len }.encode().0
        })
    }

    fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|c| c.id())
    }

    /// After the channel closed: how the child ended, if it did within 200 ms.
    fn exit_status(&mut self) -> ChildFault {
        if let Some(c) = &mut self.process {
            for _ in 0..200 {
                match c.try_wait() {
                    Ok(Some(st)) => return ChildFault::Exited(st),
                    Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                    Err(e) => return ChildFault::WaitFailed(e),
                }
            }
            return ChildFault::StillRunning;
        }
        ChildFault::ThreadEnded
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.transport = None;
        if let Some(mut c) = self.process.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(t) = self.thread.take() {
            for _ in 0..100 {
                if t.is_finished() {
                    let _ = t.join();
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            tracing::warn!("external: in-process child thread did not end; detached");
        }
    }
}

/// The host half of an external module: each call becomes one request to the child and
/// blocks until its `DONE` (or the timeout).
pub struct ExternalHalf {
    name: String,
    role: HalfRole,
    placement: Placement,
    launcher: Launcher,
    conn: Option<Conn>,
    epoch: Instant,
    wake: Option<Instant>,
    timeout: Duration,
    restart: Restart,
    ring_bytes: usize,
    arena_bytes: usize,
    spin: u32,
    restarts: u64,
    failures: u64,
    poisoned: Option<ModuleError>,
    frames: Vec<Frame>,
    control: Vec<Bytes>,
}

impl std::fmt::Debug for ExternalHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalHalf")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("placement", &self.placement)
            .field("pid", &self.pid())
            .finish()
    }
}

impl ExternalHalf {
    fn new(cfg: &ExternalConfig, role: HalfRole, launcher: Launcher) -> ExternalHalf {
        ExternalHalf {
            name: cfg.name.clone(),
            role,
            placement: cfg.placement,
            launcher,
            conn: None,
            epoch: Instant::now(),
            wake: None,
            timeout: Duration::from_millis(cfg.timeout_ms.max(1)),
            restart: cfg.restart,
            ring_bytes: (cfg.ring_kib as usize) << 10,
            arena_bytes: (cfg.arena_kib as usize) << 10,
            spin: cfg.spin,
            restarts: 0,
            failures: 0,
            poisoned: None,
            frames: Vec::new(),
            control: Vec::new(),
        }
    }

    /// Starts the program of `role` and greets it.
    pub fn spawn(cfg: &ExternalConfig, role: HalfRole) -> Result<ExternalHalf, ModuleError> {
        cfg.validate()?;
        let mut h = ExternalHalf::new(cfg, role, Launcher::Process(cfg.argv(role).to_vec()));
        h.connect()?;
        Ok(h)
    }

    /// Runs the same protocol with an in-process child: a thread serving `make()`'s handler
    /// over real pipes or a real shared-memory region (`cfg.placement`; the commands in `cfg`
    /// are ignored). For tests and for measuring placement overhead.
    pub fn in_process(
        cfg: &ExternalConfig,
        role: HalfRole,
        make: impl Fn() -> Box<dyn Handler> + Send + Sync + 'static,
    ) -> Result<ExternalHalf, ModuleError> {
        let mut h = ExternalHalf::new(cfg, role, Launcher::Thread(Arc::new(make)));
        h.connect()?;
        Ok(h)
    }

    /// Pid of the current child process (none for in-process children or between restarts).
    pub fn pid(&self) -> Option<u32> {
        self.conn.as_ref().and_then(|c| c.pid())
    }

    /// Restarts so far.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    fn who(&self) -> Who {
        Who {
            name: self.name.clone(),
            role: self.role,
            placement: self.placement,
            pid: self.pid(),
        }
    }

    fn start(&self) -> Result<Conn, StartError> {
        match &self.launcher {
            Launcher::Process(argv) => self.start_process(argv),
            Launcher::Thread(make) => self.start_thread(make.clone()),
        }
    }

    fn start_process(&self, argv: &[String]) -> Result<Conn, StartError> {
        let (prog, args) = argv.split_first().ok_or(StartError::EmptyCommand)?;
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .env("NDD_MODULE_NAME", &self.name)
            .env("NDD_MODULE_ROLE", self.role.as_str())
            .stderr(Stdio::piped());
        let mut region = None;
        match self.placement {
            Placement::Pipe => {
                cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
            }
            Placement::Shm => {
                let (fd, p, c) =
                    shm::create_with_arena(self.ring_bytes, self.arena_bytes, self.spin)
                        .map_err(StartError::Ring)?;
                shm::pass_fd(&mut cmd, &fd, 3);
                cmd.env("NDD_SHM_FD", "3")
                    .env("NDD_SHM_SPIN", self.spin.to_string())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null());
                region = Some((fd, p, c));
            }
        }
        let mut child = cmd.spawn().map_err(|source| StartError::Spawn {
            argv: argv.to_vec(),
            source,
        })?;
        if let Some(err) = child.stderr.take() {
            let name = self.name.clone();
            let role = self.role.as_str();
            let pid = child.id();
            let _ = std::thread::Builder::new()
                .name(format!("ndd-ipc-stderr-{name}"))
                .spawn(move || {
                    for line in std::io::BufReader::new(err).lines() {
                        match line {
                            Ok(l) => tracing::info!(module = %name, role, pid, "{l}"),
                            Err(_) => break,
                        }
                    }
                });
        }
        let arena = region.as_ref().and_then(|(_, p, _)| p.arena());
        let transport: Box<dyn Transport> = match region {
            None => {
                let (Some(out), Some(inp)) = (child.stdout.take(), child.stdin.take()) else {
                    return Err(StartError::NoStdio);
                };
                // 1 MiB pipe buffers (the default is 64 KiB) cut wake-ups for big frames;
                // refused above /proc/sys/fs/pipe-max-size, which is harmless.
                let _ = rustix::pipe::fcntl_setpipe_size(&out, 1 << 20);
                let _ = rustix::pipe::fcntl_setpipe_size(&inp, 1 << 20);
                Box::new(PipeTransport::new(OwnedFd::from(out), OwnedFd::from(inp))?)
            }
            Some((fd, p, c)) => {
                drop(fd); // the child has its copy; our mapping keeps the memory
                let pid = rustix::process::Pid::from_raw(child.id() as i32);
                let live = pid
                    .and_then(|p| {
                        rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
                    })
                    .map(Liveness::Pidfd)
                    .unwrap_or(Liveness::None);
                Box::new(ShmTransport::new(p, c, live))
            }
        };
        Ok(Conn {
            transport: Some(transport),
            process: Some(child),
            thread: None,
            arena,
            in_place: false,
        })
    }

    fn start_thread(&self, make: HandlerFactory) -> Result<Conn, StartError> {
        let name = format!("ndd-ipc-{}", self.name);
        let mut arena = None;
        let (host, thread): (Box<dyn Transport>, JoinHandle<()>) = match self.placement {
            Placement::Pipe => {
                let (host, mut child_t) = PipeTransport::pair()?;
                let t = std::thread::Builder::new().name(name).spawn(move || {
                    let mut h = make();
                    if let Err(e) = child::serve(&mut child_t, h.as_mut()) {
                        tracing::debug!(error = %e, "in-process child ended");
                    }
                })?;
                (Box::new(host), t)
            }
            Placement::Shm => {
                let (fd, p, c) =
                    shm::create_with_arena(self.ring_bytes, self.arena_bytes, self.spin)?;
                let (cp, cc) = shm::open_in_process(&fd, self.spin)?;
                arena = p.arena();
                let alive = Arc::new(AtomicBool::new(true));
                let flag = alive.clone();
                let t = std::thread::Builder::new().name(name).spawn(move || {
                    struct Bye(Arc<AtomicBool>);
                    impl Drop for Bye {
                        fn drop(&mut self) {
                            self.0.store(false, Ordering::SeqCst);
                        }
                    }
                    let _bye = Bye(flag);
                    let child_arena = cp.child_arena();
                    let mut t = ShmTransport::new(cp, cc, Liveness::None);
                    let mut h = make();
                    if let Err(e) = child::serve_with_arena(&mut t, child_arena, h.as_mut()) {
                        tracing::debug!(error = %e, "in-process child ended");
                    }
                })?;
                (Box::new(ShmTransport::new(p, c, Liveness::Flag(alive))), t)
            }
        };
        Ok(Conn {
            transport: Some(host),
            process: None,
            thread: Some(thread),
            arena,
            in_place: false,
        })
    }

    /// Starts the child and sends `HELLO`, waiting up to `timeout_ms` or [`HELLO_WAIT`],
    /// whichever is longer, for its answer.
    fn connect(&mut self) -> Result<(), ModuleError> {
        let conn = self.start().map_err(|source| {
            setup_error(ExternalError::Start {
                who: self.who(),
                source,
            })
        })?;
        self.conn = Some(conn);
        self.wake = None;
        let name = self.name.clone();
        let hello = Request::Hello {
            version: crate::proto::VERSION,
            role: self.role,
            name: &name,
        };
        let (h, t) = hello.encode();
        // A program's start (exec, an interpreter's imports) is not a request's reply: under
        // load a Python module took more than the default 1 s to answer HELLO (a loaded suite
        // run, 2026-12-01), and setting up failed.
        let timeout = self.timeout;
        self.timeout = timeout.max(HELLO_WAIT);
        let hello = self.exchange(&h, t);
        self.timeout = timeout;
        match hello {
            Ok(()) => {
                if let Some(c) = &mut self.conn {
                    c.in_place = c.arena.as_ref().is_some_and(|a| a.child_in_place());
                }
                Ok(())
            }
            Err(failure) => {
                let who = self.who();
                self.conn = None;
                Err(setup_error(ExternalError::Hello { who, failure }))
            }
        }
    }

    fn now_ns(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// One request/response exchange; outputs land in `self.frames`/`self.control`.
    fn exchange(&mut self, head: &[u8], tail: &[u8]) -> Result<(), Failure> {
        self.frames.clear();
        self.control.clear();
        let timeout = self.timeout;
        let Some(conn) = self.conn.as_mut() else {
            return Err(ChildFault::NotRunning.into());
        };
        let deadline = Instant::now() + timeout;
        let describe = |conn: &mut Conn, e: TransportError| -> Failure {
            Failure::Broken(match e {
                TransportError::Timeout => ChildFault::Timeout {
                    ms: timeout.as_millis(),
                },
                TransportError::Closed => conn.exit_status(),
                TransportError::Garbage(g) => ChildFault::Garbage(g),
                TransportError::Io(e) => ChildFault::Io(e),
            })
        };
        let Some(t) = conn.transport.as_mut() else {
            return Err(ChildFault::NotRunning.into());
        };
        if let Err(e) = t.send(&[head, tail], deadline) {
            return Err(describe(conn, e));
        }
        loop {
            let Some(t) = conn.transport.as_mut() else {
                return Err(ChildFault::NotRunning.into());
            };
            let msg = match t.recv(deadline) {
                Ok(m) => m,
                Err(e) => return Err(describe(conn, e)),
            };
            match Reply::parse(&msg) {
                Ok(Reply::Frame { meta, payload }) => {
                    let f = if payload.len() >= BIG_FRAME {
                        // Big: keep the received buffer, no copy (a later header push copies).
                        let off = Reply::FRAME_PAYLOAD_OFFSET;
                        Frame::from_bytes(meta, Bytes::from(msg).slice(off..))
                    } else {
                        let mut f = Frame::zeroed(meta, DEFAULT_HEADROOM, payload.len());
                        f.payload_mut().copy_from_slice(payload);
                        f
                    };
                    self.frames.push(f);
                }
                Ok(Reply::Control { msg: m }) => self.control.push(Bytes::copy_from_slice(m)),
                Ok(Reply::FrameInArena { meta, off, len }) => {
                    let f = conn
                        .arena
                        .as_ref()
                        .and_then(|a| arena_frame(a, meta, off as usize, len as usize));
                    let Some(f) = f else {
                        return Err(ChildFault::BadReply(ProtoError::Invalid(
                            "OUT_FRAME_IN_ARENA outside the frame area",
                        ))
                        .into());
                    };
                    self.frames.push(f);
                }
                Ok(Reply::Done { wake_ns }) => {
                    self.wake = wake_ns.map(|ns| self.epoch + Duration::from_nanos(ns));
                    return Ok(());
                }
                Ok(Reply::Error { message }) => return Err(Failure::Reported(message.to_string())),
                Err(e) => return Err(ChildFault::BadReply(e).into()),
            }
        }
    }

    fn call(
        &mut self,
        req: Request<'_>,
        what: &'static str,
        out: &mut Output,
        mk: fn(ExternalError) -> ModuleError,
    ) -> Result<(), ModuleError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let (head, tail) = req.encode();
        for attempt in 0..2 {
            if self.conn.is_none() {
                self.connect()?;
            }
            // A frame for a child that takes frames in place goes into the frame area (again
            // after a restart: a new child has a new area); the request carries its length.
            let in_arena = self.conn.as_ref().and_then(|c| c.put_in_arena(&req));
            let sent = match &in_arena {
                Some(h) => self.exchange(h, &[]),
                None => self.exchange(&head, tail),
            };
            match sent {
                Ok(()) => {
                    for f in self.frames.drain(..) {
                        out.push(f);
                    }
                    for c in self.control.drain(..) {
                        out.control(c);
                    }
                    return Ok(());
                }
                Err(Failure::Reported(message)) => {
                    return Err(mk(ExternalError::Reported {
                        who: self.who(),
                        request: what,
                        message,
                    }));
                }
                Err(Failure::Broken(fault)) => {
                    let who = self.who();
                    self.failures += 1;
                    self.conn = None; // kill and reap
                    self.wake = None;
                    if self.restart == Restart::OnFailure && attempt == 0 {
                        self.restarts += 1;
                        tracing::warn!(module = %self.name, role = self.role.as_str(),
                            restarts = self.restarts, "{who} {fault} on a {what}; restarting it");
                        continue;
                    }
                    return Err(mk(ExternalError::Broken {
                        who,
                        fault,
                        request: what,
                        restart: self.restart,
                    }));
                }
            }
        }
        unreachable!("the loop returns on its second attempt")
    }

    fn poison(&mut self, r: Result<(), ModuleError>) {
        if let Err(e) = r {
            tracing::error!(module = %self.name, error = %e, "external module failed");
            self.poisoned = Some(e);
        }
    }
}

fn setup_error(e: ExternalError) -> ModuleError {
    ModuleError::from(SetupError::Foreign(ForeignError::new(e)))
}

fn frame_error(e: ExternalError) -> ModuleError {
    ModuleError::from(FrameError::Foreign(ForeignError::new(e)))
}

fn control_error(e: ExternalError) -> ModuleError {
    ModuleError::from(ControlError::Foreign(ForeignError::new(e)))
}

/// From this size on a child's result becomes a frame without headroom over bytes made once
/// (no zero-fill, no second copy; a later header push copies); smaller ones get headroom.
const BIG_FRAME: usize = 64 << 10;

/// A frame of the `len` bytes at `off` in the frame area; `None` when they are not inside it.
fn arena_frame(arena: &shm::Arena, meta: Meta, off: usize, len: usize) -> Option<Frame> {
    if len >= BIG_FRAME {
        let v = arena.copy_out_vec(off, len)?;
        return Some(Frame::from_bytes(meta, Bytes::from(v)));
    }
    let mut f = Frame::zeroed(meta, DEFAULT_HEADROOM, len);
    arena.copy_out(off, f.payload_mut()).then_some(f)
}

impl Half for ExternalHalf {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let req = Request::Frame {
            now_ns: self.now_ns(now),
            meta: frame.meta,
            payload: frame.payload(),
        };
        self.call(req, "frame", out, frame_error)
    }

    fn handle_control(
        &mut self,
        now: Instant,
        msg: Bytes,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let req = Request::Control {
            now_ns: self.now_ns(now),
            msg: &msg,
        };
        self.call(req, "control message", out, control_error)
    }

    fn handle_timeout(&mut self, now: Instant, out: &mut Output) {
        if self.wake.is_some_and(|w| w <= now) {
            self.wake = None;
            let req = Request::Timeout {
                now_ns: self.now_ns(now),
            };
            let r = self.call(req, "timeout", out, frame_error);
            self.poison(r);
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.wake
    }

    fn flush(&mut self, out: &mut Output) {
        let req = Request::Flush {
            now_ns: self.now_ns(Instant::now()),
        };
        let r = self.call(req, "flush", out, frame_error);
        self.poison(r);
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: 0,
            counters: vec![("restarts", self.restarts), ("failures", self.failures)],
        }
    }
}
