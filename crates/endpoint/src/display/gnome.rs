//! The `gnome-screen` source: a monitor of a GNOME Wayland session as display updates.
//!
//! GNOME's compositor (mutter) offers no wlroots screencopy; it shares its screen through its
//! screen-cast API on the session bus (`org.gnome.Mutter.ScreenCast`, the API GNOME's own
//! remote desktop uses, and under the xdg-desktop-portal's ScreenCast for sandboxed programs)
//! as a PipeWire video stream. This source opens a screen-cast session for one monitor
//! (`RecordMonitor`, the cursor drawn in), and reads the PipeWire stream through GStreamer's
//! `pipewiresrc` (Debian's gstreamer1.0-pipewire), run as `gst-launch-1.0` with BGRx frames of
//! the monitor's size on its standard output: no PipeWire or GStreamer code is built into ndd.
//!
//! mutter sends a frame when the screen changed (nothing when it is still); the tiles that
//! differ from the last frame sent go as the update's rectangles ([`changed_tiles`]), so a
//! still screen costs nothing on the link, as with `x11-screen` and `wayland-screen`. The same
//! frame spoiling: a frame is taken only when the path can take an update (the driver's
//! [`Demand`]); the frames mutter sends meanwhile replace each other. A monitor whose size
//! changes is captured at its new size (the pipeline is started again; a keyframe follows).
//!
//! mutter ends a screen cast when the D-Bus connection that made it closes: the connection
//! lives as long as the source, which stops the cast when it ends.

use super::config::GnomeScreenConfig;
use crate::common::clock::pacing;
use crate::common::demand::Demand;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::gnome::{
    check_monitor, closed_by_reconfiguration, closed_within, connect, dbus_text, monitor_size,
    not_gnome, record_monitor, reopen, unavailable, watch_closed, watch_monitors, Reconfigured,
    Reopens, CALL, CLOSED_WAIT,
};
use crate::common::report::{SourceReport, SourceTask};
use dbus::arg::{PropMap, RefArg, Variant};
use dbus::blocking::Connection;
use dbus::message::MatchRule;
use ndd_core::Frame;
use ndd_wire::display::{coalesce, Rect, UpdateLayout};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::Sender;

use super::pacer::{CapturePacer, Pace};
use crate::common::gnome::{CAST as SERVICE, CAST_SESSION as SESSION, CAST_STREAM as STREAM};
const ROOT: &str = "/org/gnome/Mutter/ScreenCast";

/// Longest wait for a frame in one go.
const POLL: Duration = Duration::from_millis(100);

/// How often the monitor's size is read again.
const SIZE_EVERY: Duration = Duration::from_secs(1);

/// Side of the square tiles compared to find what changed.
const TILE: usize = 64;

/// Most rects one update sends after coalescing.
const MAX_RECTS: usize = 32;

/// What to install when GStreamer's PipeWire source is missing.
const GST_HINT: &str =
    "apt-get install gstreamer1.0-tools gstreamer1.0-pipewire gstreamer1.0-plugins-base";

/// The tiles ([`TILE`] pixels square, cut at the edges) where `cur` differs from `prev`, two
/// BGRx pictures of `w`x`h` packed rows, as rectangles (neighbours on a row of tiles merged).
pub(crate) fn changed_tiles(prev: &[u8], cur: &[u8], w: usize, h: usize) -> Vec<Rect> {
    let stride = w * 4;
    let mut out = Vec::new();
    if prev.len() != cur.len() || cur.len() < stride * h {
        return vec![Rect::new(0, 0, w as u16, h as u16)];
    }
    for ty in (0..h).step_by(TILE) {
        let th = TILE.min(h - ty);
        let mut run: Option<(usize, usize)> = None;
        for tx in (0..w).step_by(TILE) {
            let tw = TILE.min(w - tx);
            let differs = (ty..ty + th).any(|y| {
                let at = y * stride + tx * 4;
                prev[at..at + tw * 4] != cur[at..at + tw * 4]
            });
            run = match (differs, run) {
                (true, Some((x0, _))) => Some((x0, tx + tw)),
                (true, None) => Some((tx, tx + tw)),
                (false, Some((x0, x1))) => {
                    out.push(Rect::new(x0 as u16, ty as u16, (x1 - x0) as u16, th as u16));
                    None
                }
                (false, None) => None,
            };
        }
        if let Some((x0, x1)) = run {
            out.push(Rect::new(x0 as u16, ty as u16, (x1 - x0) as u16, th as u16));
        }
    }
    out
}

/// A screen cast of one monitor, as mutter (or the xdg-desktop-portal) keeps it for this
/// connection.
pub(super) struct Cast {
    pub(super) conn: Connection,
    pub(super) session: dbus::Path<'static>,
    pub(super) via: Via,
    pub(super) node: u32,
    /// mutter (the portal) closed the session (the monitor went, the session ended).
    pub(super) closed: Arc<AtomicBool>,
    /// When mutter last said its monitors changed (a close then is theirs, not the person's).
    pub(super) reconfigured: Reconfigured,
}

/// Whose screen cast a [`Cast`] is.
pub(super) enum Via {
    /// mutter's own API: the stream's object, whose parameters say the monitor's size.
    Mutter { stream: dbus::Path<'static> },
    /// The xdg-desktop-portal's ScreenCast (`portal-screen`): the PipeWire connection it
    /// opened for this session (`OpenPipeWireRemote`), handed to GStreamer (kept while the
    /// cast lasts).
    Portal { _remote: std::os::fd::OwnedFd },
}

impl Drop for Cast {
    fn drop(&mut self) {
        let _: Result<(), _> = match &self.via {
            Via::Mutter { .. } => self
                .conn
                .with_proxy(SERVICE, &self.session, CALL)
                .method_call(SESSION, "Stop", ()),
            Via::Portal { .. } => self
                .conn
                .with_proxy(crate::common::portal::PORTAL, &self.session, CALL)
                .method_call(crate::common::portal::PORTAL_SESSION, "Close", ()),
        };
    }
}

/// The frames `gst-launch-1.0` puts out, the newest kept by a thread that reads them as
/// they come.
pub(super) struct Pipeline {
    child: Child,
    size: (usize, usize),
    shared: Arc<(Mutex<Frames>, Condvar)>,
}

#[derive(Default)]
struct Frames {
    newest: Option<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    /// Frames replaced by a newer one before they were taken.
    replaced: u64,
    /// Why the pipeline ended, once it did (its last words).
    ended: Option<String>,
    /// Its standard error's last lines.
    said: Vec<String>,
}

impl Pipeline {
    /// Reads node `node` of the PipeWire daemon at `remote` (empty: the session's), or
    /// through the connection `fd` the portal opened.
    pub(super) fn start(
        node: u32,
        (w, h): (usize, usize),
        remote: &str,
        fd: Option<&std::os::fd::OwnedFd>,
    ) -> std::io::Result<Pipeline> {
        let caps = format!("video/x-raw,format=BGRx,width={w},height={h}");
        let mut cmd = Command::new("gst-launch-1.0");
        if !remote.is_empty() {
            cmd.env("PIPEWIRE_REMOTE", remote);
        }
        cmd.args(["-q", "pipewiresrc"]);
        use std::os::unix::process::CommandExt;
        let raw = fd.map(std::os::fd::AsRawFd::as_raw_fd);
        let parent = std::process::id();
        // SAFETY: between fork and exec the child runs only `prctl`, `getppid`, `dup2` and
        // `fcntl`, all async-signal-safe. It asks to be killed when the thread that started
        // it ends (this source's own thread, or ndd killed: before, a `kill -9` of ndd left
        // gst-launch reading the screen for good), gives up if ndd is already gone, and the
        // portal's PipeWire connection (a descriptor this process keeps open for the
        // child's life: the `Cast` owns it) becomes its fd 3, without close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if u32::try_from(libc::getppid()).ok() != Some(parent) {
                    return Err(std::io::Error::other("ndd ended"));
                }
                let r = match raw {
                    None => 0,
                    Some(3) => {
                        let flags = libc::fcntl(3, libc::F_GETFD);
                        libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC)
                    }
                    Some(raw) => libc::dup2(raw, 3),
                };
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        if fd.is_some() {
            cmd.arg("fd=3");
        }
        let mut child = cmd
            .args([&format!("path={node}"), "always-copy=true"])
            .args(["!", "videoconvert", "!", "videoscale", "!", &caps])
            .args(["!", "fdsink", "fd=1", "sync=false"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let shared = Arc::new((Mutex::new(Frames::default()), Condvar::new()));
        let (mut out, err) = (
            child.stdout.take().expect("piped"),
            child.stderr.take().expect("piped"),
        );
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("ndd-gst-err".into())
            .spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    let mut f = s.0.lock().unwrap_or_else(|p| p.into_inner());
                    if f.said.len() == 8 {
                        f.said.remove(0);
                    }
                    f.said.push(line);
                }
            })?;
        let s = Arc::clone(&shared);
        let len = w * h * 4;
        std::thread::Builder::new()
            .name("ndd-gst-frames".into())
            .spawn(move || loop {
                let mut buf = {
                    let mut f = s.0.lock().unwrap_or_else(|p| p.into_inner());
                    f.spare.pop().unwrap_or_default()
                };
                buf.resize(len, 0);
                let r = out.read_exact(&mut buf);
                let (lock, cv) = &*s;
                let mut f = lock.lock().unwrap_or_else(|p| p.into_inner());
                match r {
                    Ok(()) => {
                        if let Some(old) = f.newest.replace(buf) {
                            f.replaced += 1;
                            f.spare.push(old);
                        }
                    }
                    Err(e) => {
                        f.ended = Some(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                            "it ended".to_string()
                        } else {
                            e.to_string()
                        });
                        cv.notify_all();
                        return;
                    }
                }
                cv.notify_all();
            })?;
        Ok(Pipeline {
            child,
            size: (w, h),
            shared,
        })
    }

    /// The newest frame, waiting at most `wait` for one; `Err` once the pipeline ended.
    fn next(&self, wait: Duration) -> Result<Option<Vec<u8>>, String> {
        let (lock, cv) = &*self.shared;
        let mut f = lock.lock().unwrap_or_else(|p| p.into_inner());
        if f.newest.is_none() && f.ended.is_none() {
            f = cv
                .wait_timeout(f, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if let Some(b) = f.newest.take() {
            return Ok(Some(b));
        }
        match f.ended.clone() {
            Some(why) => {
                // Its words come a moment after its output closes.
                drop(f);
                std::thread::sleep(Duration::from_millis(50));
                let f = lock.lock().unwrap_or_else(|p| p.into_inner());
                Err(format!(
                    "GStreamer's pipewiresrc stopped: {why}{}",
                    if f.said.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", f.said.join(" / "))
                    }
                ))
            }
            None => Ok(None),
        }
    }

    /// A frame's buffer back, for the reader to fill again.
    fn recycle(&self, b: Vec<u8>) {
        let mut f = self.shared.0.lock().unwrap_or_else(|p| p.into_inner());
        if f.spare.len() < 3 {
            f.spare.push(b);
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An open `gnome-screen` (or `portal-screen`) source.
pub(crate) struct GnomeScreen {
    pub(super) bus: String,
    /// The PipeWire socket (empty: the session's).
    pub(super) pipewire: String,
    pub(super) cast: Cast,
    pub(super) pipeline: Pipeline,
    pub(super) min_gap: Duration,
    pub(super) refresh: Option<Duration>,
    /// What to say when the cast ends under it.
    pub(super) ended: &'static str,
}

impl std::fmt::Debug for GnomeScreen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GnomeScreen({}, node {})", self.bus, self.cast.node)
    }
}

/// Whether the session offers mutter's screen cast and this machine GStreamer's PipeWire
/// source; without starting a cast (`ndd check`).
pub(crate) fn probe_gnome_screen(
    endpoint: &'static str,
    c: &GnomeScreenConfig,
) -> Result<(), EndpointError> {
    let (bus, conn) = connect(endpoint, &c.bus)?;
    let (has,): (bool,) = conn
        .with_proxy("org.freedesktop.DBus", "/org/freedesktop/DBus", CALL)
        .method_call("org.freedesktop.DBus", "NameHasOwner", (SERVICE,))
        .map_err(|e| {
            unavailable(
                endpoint,
                &bus,
                dbus_text(&e),
                "the session bus did not answer",
            )
        })?;
    if !has {
        return Err(not_gnome(endpoint, &bus, SERVICE));
    }
    check_monitor(&conn, endpoint, &bus, c.monitor.as_deref())?;
    gstreamer_here(endpoint)
}

/// Whether `gst-launch-1.0` and its `pipewiresrc` element are installed.
pub(super) fn gstreamer_here(endpoint: &'static str) -> Result<(), EndpointError> {
    // (Not `--exists`: it also asks for a plugin version at least GStreamer's own, which
    // the PipeWire plugin, versioned as PipeWire, never has.)
    let ok = Command::new("gst-inspect-1.0")
        .arg("pipewiresrc")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let launch = Command::new("gst-launch-1.0")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok && launch {
        Ok(())
    } else {
        Err(unavailable(
            endpoint,
            "GStreamer",
            "GStreamer's PipeWire source (gst-launch-1.0 with pipewiresrc) is not installed".into(),
            GST_HINT,
        ))
    }
}

/// Opens a screen cast of the configured monitor and starts reading it.
pub(crate) fn open_gnome_screen(
    endpoint: &'static str,
    c: &GnomeScreenConfig,
) -> Result<GnomeScreen, EndpointError> {
    gstreamer_here(endpoint)?;
    let (bus, conn) = connect(endpoint, &c.bus)?;
    let fail = |what: String| {
        unavailable(
            endpoint,
            &bus,
            what,
            "mutter refused the screen cast (is this GNOME 40 or later on Wayland?)",
        )
    };
    let root = conn.with_proxy(SERVICE, ROOT, CALL);
    let (session,): (dbus::Path<'static>,) = root
        .method_call(SERVICE, "CreateSession", (PropMap::new(),))
        .map_err(|e| {
            if e.name() == Some("org.freedesktop.DBus.Error.ServiceUnknown") {
                not_gnome(endpoint, &bus, SERVICE)
            } else {
                fail(format!("CreateSession: {}", dbus_text(&e)))
            }
        })?;
    let mut props = PropMap::new();
    // The cursor drawn into the picture (1: embedded).
    props.insert(
        "cursor-mode".into(),
        Variant(Box::new(1u32) as Box<dyn RefArg>),
    );
    let stream = record_monitor(&conn, endpoint, &bus, &session, c.monitor.as_deref(), props)?;
    let node = Arc::new(Mutex::new(None::<u32>));
    let n = Arc::clone(&node);
    conn.add_match(
        MatchRule::new_signal(STREAM, "PipeWireStreamAdded").with_path(stream.clone()),
        move |(id,): (u32,), _, _| {
            *n.lock().unwrap_or_else(|p| p.into_inner()) = Some(id);
            true
        },
    )
    .map_err(|e| fail(dbus_text(&e)))?;
    let closed = watch_closed(&conn, SESSION, &session).map_err(|e| fail(dbus_text(&e)))?;
    conn.with_proxy(SERVICE, &session, CALL)
        .method_call::<(), _, _, _>(SESSION, "Start", ())
        .map_err(|e| fail(format!("Start: {}", dbus_text(&e))))?;
    let t0 = Instant::now();
    let node = loop {
        if let Some(n) = *node.lock().unwrap_or_else(|p| p.into_inner()) {
            break n;
        }
        if closed.load(Ordering::Acquire) || t0.elapsed() > CALL {
            return Err(fail("mutter started no PipeWire stream".into()));
        }
        conn.process(Duration::from_millis(50))
            .map_err(|e| fail(dbus_text(&e)))?;
    };
    let size = monitor_size(&conn, &stream).map_err(fail)?;
    let cast = Cast {
        reconfigured: watch_monitors(&conn).unwrap_or_default(),
        conn,
        session,
        via: Via::Mutter { stream },
        node,
        closed,
    };
    let pipeline = Pipeline::start(node, size, &c.pipewire, None).map_err(gst_failed(endpoint))?;
    tracing::info!(
        endpoint,
        bus = %bus,
        node,
        width = size.0,
        height = size.1,
        "capturing the monitor through mutter's screen cast"
    );
    Ok(GnomeScreen {
        bus,
        pipewire: c.pipewire.clone(),
        cast,
        pipeline,
        min_gap: Duration::try_from_secs_f64(1.0 / c.max_fps).unwrap_or(Duration::ZERO),
        refresh: pacing(c.refresh_s),
        ended: "the GNOME session ended, or its screen cast stopped",
    })
}

/// Opens a `gnome-screen` source and starts it.
pub(crate) fn spawn_gnome_screen_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &GnomeScreenConfig,
    stream: u16,
    tx: Sender<Frame>,
    demand: Option<Demand>,
) -> Result<SourceTask, EndpointError> {
    let c = c.clone();
    spawn_cast(
        rt,
        endpoint,
        (stream, tx, demand),
        move || open_gnome_screen(endpoint, &c),
        || true,
    )
}

/// Starts a screen-cast source (`gnome-screen`, `portal-screen`) whose cast `open` makes:
/// opened in the source's own thread, as GStreamer is killed when the thread that started it
/// ends (`Pipeline::start`), and a portal's dialog may take the person minutes.
/// `reopenable` says whether a cast mutter closed on a new monitor configuration may be
/// opened again without asking anyone (the portal's: only with a kept grant).
pub(super) fn spawn_cast(
    rt: &Handle,
    endpoint: &'static str,
    (stream, tx, demand): (u16, Sender<Frame>, Option<Demand>),
    open: impl Fn() -> Result<GnomeScreen, EndpointError> + Send + 'static,
    reopenable: impl Fn() -> bool + Send + 'static,
) -> Result<SourceTask, EndpointError> {
    gstreamer_here(endpoint)?;
    Ok(rt.spawn_blocking(move || {
        run_gnome_screen(endpoint, (&open, &reopenable), stream, tx, demand)
    }))
}

/// A pipeline that did not start, said as what to install.
pub(super) fn gst_failed(endpoint: &'static str) -> impl Fn(std::io::Error) -> EndpointError {
    move |e| {
        unavailable(
            endpoint,
            "GStreamer",
            format!("cannot start gst-launch-1.0: {e}"),
            GST_HINT,
        )
    }
}

/// Sends the cast's frames until the other side or the cast ends (`gnome-screen` and
/// `portal-screen`).
pub(super) fn run_gnome_screen(
    endpoint: &'static str,
    (open, reopenable): (
        &dyn Fn() -> Result<GnomeScreen, EndpointError>,
        &dyn Fn() -> bool,
    ),
    stream: u16,
    tx: Sender<Frame>,
    demand: Option<Demand>,
) -> Result<SourceReport, EndpointError> {
    let mut s = open()?;
    let (bus, ended) = (s.bus.clone(), s.ended);
    let fatal = |e: String| unavailable(endpoint, &bus, e, ended);
    let mut em = Emitter::new(stream, tx);
    let mut pace = CapturePacer::new(s.min_gap, s.refresh, Instant::now());
    let mut next_size = Instant::now() + SIZE_EVERY;
    // The picture the other side has (what the next update is compared with).
    let mut shown: Option<Vec<u8>> = None;
    let mut reopens = Reopens::default();
    loop {
        if em.tx.is_closed() {
            break;
        }
        s.cast
            .conn
            .process(Duration::ZERO)
            .map_err(|e| fatal(dbus_text(&e)))?;
        if s.cast.closed.load(Ordering::Acquire) {
            let why = match s.cast.via {
                Via::Mutter { .. } => "mutter closed the screen cast",
                Via::Portal { .. } => "the xdg-desktop-portal closed the screen cast",
            };
            // Only a close that came with a new monitor configuration is undone: a person
            // who stopped the share at the desktop is not overridden, and a portal without a
            // kept grant would ask at the desktop again.
            if !closed_by_reconfiguration(&s.cast.conn, &s.cast.reconfigured) {
                let stopped = crate::common::STOPPED_AT_THE_DESKTOP;
                return Err(fatal(format!("{why}: {stopped}")));
            }
            if !reopenable() {
                return Err(fatal(format!(
                    "{why} as the monitors were reconfigured; opening it again would ask at the desktop (no kept grant)"
                )));
            }
            if let Err(too_many) = reopens.admit(Instant::now()) {
                return Err(fatal(format!("{why} {too_many}")));
            }
            tracing::info!(
                endpoint,
                "{why} as the monitors were reconfigured: opening it again"
            );
            // The old cast and its pipeline go first (one reader of the monitor at a time).
            drop(s);
            s = match reopen(endpoint, "the screen cast", open) {
                Ok(s) => s,
                // Declined at the desktop: said as such (the side ends with its own code).
                Err(Some(declined)) => return Err(declined),
                Err(None) => return Err(fatal(why.to_string())),
            };
            // The other side gets the whole picture, of whatever size it now is.
            shown = None;
            pace.keyframe();
            next_size = Instant::now() + SIZE_EVERY;
            continue;
        }
        let now = Instant::now();
        // (mutter's stream says the monitor's size; the portal's does not, and a monitor
        // that changes size under it is scaled to the size it had.)
        if let (true, Via::Mutter { stream }) = (now >= next_size, &s.cast.via) {
            next_size = now + SIZE_EVERY;
            let size = match monitor_size(&s.cast.conn, stream) {
                Ok(size) => size,
                // (The stream goes with a closing cast, often before its Closed is read.)
                Err(e) => {
                    if closed_within(&s.cast.conn, &s.cast.closed, CLOSED_WAIT) {
                        continue;
                    }
                    return Err(fatal(e));
                }
            };
            if size != s.pipeline.size {
                tracing::info!(
                    endpoint,
                    width = size.0,
                    height = size.1,
                    "monitor size changed"
                );
                // The old pipeline goes first (one reader of the stream at a time).
                let _ = s.pipeline.child.kill();
                s.pipeline = Pipeline::start(s.cast.node, size, &s.pipewire, None)
                    .map_err(|e| fatal(format!("cannot start gst-launch-1.0 again: {e}")))?;
                shown = None;
                pace.keyframe();
            }
        }
        if demand.as_ref().is_some_and(Demand::take_keyframe) {
            pace.keyframe();
        }
        let path_free = match &demand {
            Some(d) => d.wanted(),
            None => em.tx.capacity() == em.tx.max_capacity(),
        };
        let keyframe_due = match pace.poll(now, path_free) {
            Pace::Capture { whole } => whole,
            Pace::Wait(wait) => {
                std::thread::sleep(wait.clamp(Duration::from_millis(1), POLL));
                continue;
            }
        };
        // A keyframe of the picture shown when the screen is still; otherwise the newest.
        let cur = match s.pipeline.next(if keyframe_due && shown.is_some() {
            Duration::ZERO
        } else {
            POLL
        }) {
            Ok(Some(f)) => f,
            Ok(None) => match (&shown, keyframe_due) {
                (Some(p), true) => p.clone(),
                _ => continue,
            },
            Err(e) => {
                // mutter closing the cast ends the pipeline too, often before its Closed
                // signal is read: it is waited for a moment (the loop then says why).
                if closed_within(&s.cast.conn, &s.cast.closed, CLOSED_WAIT) {
                    continue;
                }
                return Err(fatal(e));
            }
        };
        let (w, h) = s.pipeline.size;
        let whole = keyframe_due || shown.is_none();
        let rects = if whole {
            vec![Rect::new(0, 0, w as u16, h as u16)]
        } else {
            let prev = shown.as_deref().expect("shown");
            coalesce(
                &changed_tiles(prev, &cur, w, h),
                w as u16,
                h as u16,
                MAX_RECTS,
            )
        };
        if rects.is_empty() {
            s.pipeline.recycle(cur);
            continue;
        }
        if let Some(d) = &demand {
            d.take();
        }
        pace.captured(Instant::now(), whole);
        let sent = super::source::send_update(
            &mut em,
            (w as u16, h as u16),
            &rects,
            whole,
            |layout: &UpdateLayout, payload: &mut [u8]| {
                pixels_into(&cur, w, layout, payload);
                Ok::<(), String>(())
            },
        )
        .map_err(fatal)?;
        if let Some(old) = shown.replace(cur) {
            s.pipeline.recycle(old);
        }
        if !sent {
            break;
        }
    }
    let replaced = s.pipeline.shared.0.lock().map(|f| f.replaced).unwrap_or(0);
    tracing::debug!(
        endpoint,
        replaced,
        "frames replaced by newer ones before they were taken"
    );
    Ok(em.report)
}

/// The pixels of every rect of `layout`, from the packed BGRx picture `pic` (`w` wide).
fn pixels_into(pic: &[u8], w: usize, layout: &UpdateLayout, payload: &mut [u8]) {
    let stride = w * 4;
    for (i, r) in layout.rects().iter().enumerate() {
        let out = &mut payload[layout.pixels(i)];
        let row = usize::from(r.w) * 4;
        for dy in 0..usize::from(r.h) {
            let at = (usize::from(r.y) + dy) * stride + usize::from(r.x) * 4;
            out[dy * row..(dy + 1) * row].copy_from_slice(&pic[at..at + row]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picture(w: usize, h: usize, v: u8) -> Vec<u8> {
        vec![v; w * h * 4]
    }

    fn set(p: &mut [u8], w: usize, x: usize, y: usize) {
        p[(y * w + x) * 4] ^= 0xff;
    }

    #[test]
    fn a_still_picture_has_no_changed_tiles() {
        let p = picture(200, 100, 7);
        assert!(changed_tiles(&p, &p.clone(), 200, 100).is_empty());
    }

    #[test]
    fn one_changed_pixel_is_its_tile_and_neighbours_on_a_row_merge() {
        let (w, h) = (200, 150);
        let prev = picture(w, h, 0);
        let mut cur = prev.clone();
        set(&mut cur, w, 70, 10);
        assert_eq!(
            changed_tiles(&prev, &cur, w, h),
            vec![Rect::new(64, 0, 64, 64)]
        );
        // Two neighbouring tiles on a row are one rect; the edge tile is cut at the edge.
        set(&mut cur, w, 199, 20);
        set(&mut cur, w, 130, 20);
        assert_eq!(
            changed_tiles(&prev, &cur, w, h),
            vec![Rect::new(64, 0, 136, 64)]
        );
        // The last row of tiles is cut at the bottom.
        set(&mut cur, w, 0, 149);
        assert_eq!(
            changed_tiles(&prev, &cur, w, h),
            vec![Rect::new(64, 0, 136, 64), Rect::new(0, 128, 64, 22)]
        );
    }

    #[test]
    fn pictures_of_another_size_are_changed_whole() {
        let prev = picture(100, 100, 0);
        let cur = picture(120, 100, 0);
        assert_eq!(
            changed_tiles(&prev, &cur, 120, 100),
            vec![Rect::new(0, 0, 120, 100)]
        );
    }

    #[test]
    fn the_changed_tiles_rebuild_the_new_picture() {
        // Applying the rects' pixels of `cur` onto `prev` gives `cur`, whatever changed.
        let (w, h) = (333, 97);
        let mut seed = 0x2545_f491_u32;
        let mut rnd = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for _ in 0..50 {
            let prev: Vec<u8> = (0..w * h * 4).map(|_| rnd() as u8).collect();
            let mut cur = prev.clone();
            for _ in 0..(rnd() % 20) {
                let (x, y) = (rnd() as usize % w, rnd() as usize % h);
                set(&mut cur, w, x, y);
            }
            let mut rebuilt = prev.clone();
            for r in changed_tiles(&prev, &cur, w, h) {
                for y in usize::from(r.y)..usize::from(r.y + r.h) {
                    let a = (y * w + usize::from(r.x)) * 4;
                    let b = a + usize::from(r.w) * 4;
                    rebuilt[a..b].copy_from_slice(&cur[a..b]);
                }
            }
            assert!(rebuilt == cur);
        }
    }
}
