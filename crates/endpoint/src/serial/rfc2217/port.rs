//! The I/O of the RFC 2217 endpoints: one connection task per `listen` / `address`, shared
//! by the driver's source and sink, and the two endpoint tasks that talk to it.
//!
//! The connection task owns the socket and the sans-IO [`Telnet`] codec. The sink hands it
//! serial messages (bounded channel: a slow peer slows the stream, nothing is dropped while a
//! peer is connected); it hands the source what the peer sent. With no peer connected, data
//! for the peer is dropped and counted (a server with no client is a port with nothing
//! plugged in; a client waiting to reconnect keeps the last [`HOLD_WHILE_AWAY`] bytes and
//! sends them once it is back), while line settings and modem lines are kept and applied on
//! (re)connection.

use super::telnet::{Note, Role, Telnet};
use crate::common::delivered::Delivered;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::framing::RAW_CHUNK;
use crate::common::report::{SinkReport, SinkTask, SourceReport, SourceTask};
use crate::serial::config::{Rfc2217ClientConfig, Rfc2217ServerConfig};
use crate::serial::record::{LineSettings, ModemLines, SerialMessage};
use crate::serial::tty::{shared, Registry};
use ndd_core::ratelimit::RateLimit;
use ndd_core::Frame;
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::mpsc::{self, Receiver, Sender};

/// Bytes a client keeps for the server while reconnecting (the newest).
pub const HOLD_WHILE_AWAY: usize = 64 * 1024;
/// First and longest wait between two connection attempts of a client.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// What a second client reads before it is closed.
const BUSY: &[u8] = b"ndd rfc2217-server: the port is in use by another client\r\n";

/// A serial message the connection task and the endpoint tasks pass each other.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Msg {
    Data(Vec<u8>),
    Settings(LineSettings),
    Modem(ModemLines),
    Break(bool),
    Purge(u8),
}

/// The connection task's ends of the channels.
struct TaskEnds {
    to_peer: Receiver<Msg>,
    from_peer: Sender<Msg>,
    source_attached: Arc<AtomicBool>,
}

/// One RFC 2217 connection (server or client), shared by the driver's source and sink.
#[derive(Debug)]
pub(crate) struct Rfc2217 {
    what: String,
    to_peer: Sender<Msg>,
    from_peer: Mutex<Option<Receiver<Msg>>>,
    source_attached: Arc<AtomicBool>,
    opened_with: LineSettings,
}

fn registry() -> &'static Registry<Rfc2217> {
    static PORTS: OnceLock<Registry<Rfc2217>> = OnceLock::new();
    PORTS.get_or_init(Default::default)
}

impl Rfc2217 {
    /// Both endpoints of one port must ask for the same settings.
    fn same_settings(
        &self,
        endpoint: &'static str,
        want: &LineSettings,
    ) -> Result<(), EndpointError> {
        if self.opened_with == *want {
            return Ok(());
        }
        Err(EndpointError::Config {
            endpoint,
            param: "baud",
            reason: format!(
                "{} is already used by the other stream with settings {}, this one asks for \
                 {want}; both endpoints of one port must use the same settings",
                self.what, self.opened_with
            ),
        })
    }

    /// The server of `c.listen`: binds now (a taken port fails here, at start).
    pub(crate) fn server(
        rt: &Handle,
        endpoint: &'static str,
        c: &Rfc2217ServerConfig,
    ) -> Result<Arc<Rfc2217>, EndpointError> {
        let want = c.settings();
        let what = format!("RFC 2217 server on {}", c.listen);
        let key = PathBuf::from(format!("rfc2217-server {}", c.listen));
        shared(
            registry(),
            &key,
            || {
                let listener = std::net::TcpListener::bind(&c.listen)
                    .and_then(|l| l.set_nonblocking(true).map(|()| l))
                    .map_err(|e| EndpointError::Unavailable {
                        endpoint,
                        what: format!("key `listen`: cannot listen on {}: {e}", c.listen),
                        hint: "pick a free port (`ss -ltn` lists the ones in use)".into(),
                    })?;
                let listener = {
                    let _enter = rt.enter();
                    TcpListener::from_std(listener).map_err(|e| EndpointError::Unavailable {
                        endpoint,
                        what: format!("cannot listen on {}: {e}", c.listen),
                        hint: "report this".into(),
                    })?
                };
                if listener.local_addr().is_ok_and(|a| !a.ip().is_loopback()) {
                    tracing::warn!(
                        endpoint,
                        listen = %c.listen,
                        "RFC 2217 has no encryption and no authentication: anyone who reaches \
                         this address can use the port; prefer 127.0.0.1 and let the ndd link \
                         carry the port across the network"
                    );
                }
                tracing::info!(endpoint, listen = %c.listen, settings = %want,
                    "RFC 2217 clients (e.g. pyserial rfc2217://) connect here");
                let (port, ends) = Rfc2217::new(what.clone(), want);
                let stall =
                    (c.stall_timeout_ms > 0).then(|| Duration::from_millis(c.stall_timeout_ms));
                rt.spawn(serve(endpoint, listener, want, stall, ends));
                Ok(port)
            },
            |p| p.same_settings(endpoint, &want),
        )
    }

    /// The client of the RFC 2217 server at `c.address`: connects in the background, and
    /// again whenever the connection is lost.
    pub(crate) fn client(
        rt: &Handle,
        endpoint: &'static str,
        c: &Rfc2217ClientConfig,
    ) -> Result<Arc<Rfc2217>, EndpointError> {
        let want = c.settings();
        let what = format!("RFC 2217 server at {}", c.address);
        let key = PathBuf::from(format!("rfc2217-client {}", c.address));
        shared(
            registry(),
            &key,
            || {
                let (port, ends) = Rfc2217::new(what.clone(), want);
                rt.spawn(connect(endpoint, c.address.clone(), want, ends));
                Ok(port)
            },
            |p| p.same_settings(endpoint, &want),
        )
    }

    /// The shared half, and the connection task's ends: the sink's messages, the source's
    /// channel, and whether a source listens on it.
    fn new(what: String, settings: LineSettings) -> (Arc<Rfc2217>, TaskEnds) {
        let (to_peer, to_peer_rx) = mpsc::channel(64);
        let (from_peer_tx, from_peer) = mpsc::channel(64);
        let source_attached = Arc::new(AtomicBool::new(false));
        let port = Arc::new(Rfc2217 {
            what,
            to_peer,
            from_peer: Mutex::new(Some(from_peer)),
            source_attached: source_attached.clone(),
            opened_with: settings,
        });
        (
            port,
            TaskEnds {
                to_peer: to_peer_rx,
                from_peer: from_peer_tx,
                source_attached,
            },
        )
    }
}

/// Starts the source of an RFC 2217 connection: what the peer sends, as serial messages.
pub(crate) fn spawn_rfc2217_source(
    rt: &Handle,
    endpoint: &'static str,
    port: Arc<Rfc2217>,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let rx = port
        .from_peer
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .ok_or_else(|| EndpointError::Config {
            endpoint,
            param: "type",
            reason: format!(
                "{} already feeds another source; one source per port",
                port.what
            ),
        })?;
    port.source_attached.store(true, Ordering::Release);
    Ok(rt.spawn(run_source(endpoint, port, rx, stream, tx)))
}

async fn run_source(
    endpoint: &'static str,
    port: Arc<Rfc2217>,
    mut rx: Receiver<Msg>,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let mut out = Emitter::new(stream, tx);
    loop {
        let msg = tokio::select! {
            _ = out.tx.closed() => break,
            m = rx.recv() => match m {
                Some(m) => m,
                None => break,
            },
        };
        let msg = match &msg {
            Msg::Data(d) => SerialMessage::Data(d),
            Msg::Settings(s) => SerialMessage::Settings(*s),
            Msg::Modem(m) => SerialMessage::Modem(*m),
            Msg::Break(on) => SerialMessage::Break(*on),
            Msg::Purge(w) => SerialMessage::Purge(*w),
        };
        let mut frame = Frame::zeroed(
            out.next_meta(),
            ndd_core::frame::DEFAULT_HEADROOM,
            msg.len(),
        );
        msg.emit_into(frame.payload_mut());
        if !out.send(frame).await {
            break;
        }
    }
    drop(port);
    tracing::debug!(
        endpoint,
        stream,
        frames = out.report.frames,
        bytes = out.report.bytes,
        "source ended"
    );
    Ok(out.report)
}

/// Starts the sink of an RFC 2217 connection: serial messages for the peer.
pub(crate) fn spawn_rfc2217_sink(
    rt: &Handle,
    endpoint: &'static str,
    port: Arc<Rfc2217>,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    Ok(rt.spawn(run_sink(endpoint, port, rx, delivered)))
}

async fn run_sink(
    endpoint: &'static str,
    port: Arc<Rfc2217>,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let mut report = SinkReport::default();
    while let Some(frame) = rx.recv().await {
        report.frames += 1;
        report.bytes += frame.len() as u64;
        let msg = match SerialMessage::parse(frame.payload()) {
            Ok(SerialMessage::Data(d)) => Msg::Data(d.to_vec()),
            Ok(SerialMessage::Settings(s)) => Msg::Settings(s),
            Ok(SerialMessage::Modem(m)) => Msg::Modem(m),
            Ok(SerialMessage::Break(on)) => Msg::Break(on),
            Ok(SerialMessage::Purge(w)) => Msg::Purge(w),
            Err(source) => {
                delivered.mark(frame.meta.seq);
                return Err(EndpointError::BadFrame {
                    endpoint,
                    seq: frame.meta.seq,
                    source,
                });
            }
        };
        if port.to_peer.send(msg).await.is_err() {
            break;
        }
        // Handed to the connection task, which sends it in order or, with no peer, drops it
        // and says so.
        delivered.mark(frame.meta.seq);
    }
    tracing::debug!(
        endpoint,
        frames = report.frames,
        bytes = report.bytes,
        "sink ended"
    );
    Ok(report)
}

/// What the connection task keeps between peers.
struct Between {
    endpoint: &'static str,
    /// Server: CTS/DSR/DCD/RI of the device. Client: DTR/RTS asked for.
    modem: ModemLines,
    settings: LineSettings,
    held: VecDeque<u8>,
    dropped: u64,
    bad: RateLimit,
    logs: PortLogs,
    source_attached: Arc<AtomicBool>,
}

/// The connection task's lines about what the other end does, each kind at most five a
/// second with the count held back: anyone who reaches a server's `listen` address may
/// connect, hang up and connect again at line rate, and a server may answer or hang up as
/// fast.
struct PortLogs {
    /// The server set another value than asked.
    refused: RateLimit,
    /// A second client turned away.
    turned_away: RateLimit,
    /// A client connected, or the client connected to its server.
    came: RateLimit,
    /// The other end left, hung up or stalled.
    went: RateLimit,
    /// Bytes dropped while nobody was there (the count adds up until it is said).
    dropped: RateLimit,
}

impl Default for PortLogs {
    fn default() -> Self {
        let limit = || RateLimit::with_burst(Duration::from_secs(1), 5);
        PortLogs {
            refused: limit(),
            turned_away: limit(),
            came: limit(),
            went: limit(),
            dropped: limit(),
        }
    }
}

impl Between {
    /// Hands `m` to the source, waiting while it is busy; dropped when the driver has no
    /// source on this port (or it ended).
    async fn deliver(&mut self, from_peer: &Sender<Msg>, m: Msg) {
        if self.source_attached.load(Ordering::Acquire) {
            let _ = from_peer.send(m).await;
        }
    }

    /// What to do with the note `n` from `peer`, taken at `now`.
    fn note(&mut self, peer: &str, n: Note, now: Instant) -> Option<Msg> {
        match n {
            Note::Data(d) => Some(Msg::Data(d)),
            Note::Settings(s) => {
                tracing::debug!(endpoint = self.endpoint, peer, settings = %s, "client changed line settings");
                Some(Msg::Settings(s))
            }
            Note::Modem(m) => Some(Msg::Modem(m)),
            Note::Break(on) => {
                tracing::debug!(
                    endpoint = self.endpoint,
                    peer,
                    on,
                    "client set the break condition"
                );
                Some(Msg::Break(on))
            }
            Note::Purge(which) => {
                tracing::debug!(
                    endpoint = self.endpoint,
                    peer,
                    which,
                    "client purged the port's buffers"
                );
                Some(Msg::Purge(which))
            }
            Note::Refused(what, asked, got) => {
                // Parity travels as RFC 2217's code: say its name.
                let shown = |v: u32| match (
                    what,
                    u8::try_from(v).ok().and_then(super::telnet::parity_of),
                ) {
                    ("parity", Some(p)) => format!("{p:?}").to_lowercase(),
                    _ => v.to_string(),
                };
                let (asked, got) = (shown(asked), shown(got));
                if let Some(suppressed) = self.logs.refused.admit(now) {
                    tracing::warn!(
                        endpoint = self.endpoint,
                        peer,
                        suppressed,
                        "the RFC 2217 server set {what} {got}, not {asked} as asked"
                    );
                }
                None
            }
            Note::ComPortAgreed => {
                tracing::debug!(endpoint = self.endpoint, peer, "RFC 2217 agreed");
                None
            }
            Note::Bad(why) => {
                if let Some(suppressed) = self.bad.admit(now) {
                    tracing::warn!(
                        endpoint = self.endpoint,
                        peer,
                        suppressed,
                        "RFC 2217 peer: {why}"
                    );
                }
                None
            }
        }
    }
}

/// Reads from the peer, sends what the sink hands over, until the peer goes, or the
/// endpoints are gone (`Ok(false)`).
async fn session(
    b: &mut Between,
    sock: &mut TcpStream,
    peer: &str,
    mut t: Telnet,
    to_peer: &mut Receiver<Msg>,
    from_peer: &Sender<Msg>,
    (listener, stall): (Option<&TcpListener>, Option<Duration>),
) -> io::Result<bool> {
    // A write the peer does not take within `stall` ends the session (TimedOut): a client
    // that stopped reading must not hold the port, nor the stream behind it.
    // `written` counts what went into the socket (what the client took is that minus what the
    // kernel still holds).
    async fn send(
        sock: &mut TcpStream,
        bytes: &[u8],
        stall: Option<Duration>,
        written: &mut u64,
    ) -> io::Result<()> {
        *written += bytes.len() as u64;
        match stall {
            None => sock.write_all(bytes).await,
            Some(limit) => tokio::time::timeout(limit, sock.write_all(bytes))
                .await
                .unwrap_or_else(|_| Err(io::Error::new(io::ErrorKind::TimedOut, Stalled))),
        }
    }
    let mut written = 0u64;
    let mut buf = vec![0u8; RAW_CHUNK];
    let mut notes = Vec::new();
    let role = if listener.is_some() {
        Role::Server
    } else {
        Role::Client
    };
    send(sock, &t.take_out(), stall, &mut written).await?;
    // Whether the client reads: what the kernel still holds for it, looked at every second.
    let mut watch = Stall::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick(), if stall.is_some() => {
                if let Some(limit) = stall {
                    let taken = unsent(sock).map(|q| (written.saturating_sub(q as u64), q));
                    if watch.stalled(taken, Instant::now(), limit) {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, Stalled));
                    }
                }
            }
            r = sock.read(&mut buf) => {
                let n = r?;
                if n == 0 {
                    return Ok(true);
                }
                notes.clear();
                t.feed(&buf[..n], &mut notes);
                if role == Role::Client && notes.contains(&Note::ComPortAgreed) {
                    // Agreed: the port as this side wants it.
                    t.set_settings(b.settings);
                    t.set_outputs(b.modem);
                }
                let reply = t.take_out();
                if !reply.is_empty() {
                    send(sock, &reply, stall, &mut written).await?;
                }
                let now = Instant::now();
                for n in notes.drain(..) {
                    if let Some(m) = b.note(peer, n, now) {
                        b.deliver(from_peer, m).await;
                    }
                }
                if role == Role::Server {
                    b.settings = t.settings();
                }
            }
            m = to_peer.recv() => {
                let Some(m) = m else { return Ok(false) };
                match m {
                    Msg::Data(d) => t.send_data(&d),
                    Msg::Settings(s) => {
                        if role == Role::Client {
                            b.settings = s;
                            if t.agreed() {
                                t.set_settings(s);
                            }
                        }
                    }
                    Msg::Modem(m) => {
                        if role == Role::Server {
                            t.set_modem(m);
                            b.modem = merge(b.modem, m);
                        } else {
                            let outputs = ModemLines { valid: m.valid & (ModemLines::DTR | ModemLines::RTS), state: m.state };
                            if outputs.valid != 0 {
                                b.modem = merge(b.modem, outputs);
                                if t.agreed() {
                                    t.set_outputs(outputs);
                                }
                            }
                        }
                    }
                    // The far port's break and purge: the client asks its server; a server
                    // (the app side) has no use for them from the device.
                    Msg::Break(on) => {
                        if role == Role::Client && t.agreed() {
                            t.set_break(on);
                        }
                    }
                    Msg::Purge(which) => {
                        if role == Role::Client && t.agreed() {
                            t.purge(which);
                        }
                    }
                }
                send(sock, &t.take_out(), stall, &mut written).await?;
            }
            a = accept_other(listener) => {
                if let Ok((mut other, from)) = a {
                    if let Some(suppressed) = b.logs.turned_away.admit(Instant::now()) {
                        tracing::warn!(endpoint = b.endpoint, client = %from, busy_with = peer, suppressed, "a second RFC 2217 client was turned away: the port is in use");
                    }
                    let _ = other.write_all(BUSY).await;
                }
            }
        }
    }
}

/// Bytes written to `sock` the peer has not taken yet (`TIOCOUTQ`: unsent and unacknowledged);
/// `None` if the kernel does not say.
fn unsent(sock: &TcpStream) -> Option<usize> {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one c_int to the pointer, which points to `n`, alive and
    // writable for the call; the descriptor is the open socket `sock` owns.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    (r == 0).then_some(n.max(0) as usize)
}

/// The error a session ends with when its client stopped reading.
#[derive(Debug)]
struct Stalled;

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client stopped reading")
    }
}

impl std::error::Error for Stalled {}

/// Whether `e` is a session's [`Stalled`] end.
fn is_stall(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|i| i.is::<Stalled>())
}

/// Tells a client that stopped reading: bytes wait for it and it has taken none for the whole
/// limit (a client that reads, even slower than the port, takes some every second).
#[derive(Debug, Default)]
struct Stall {
    taken: u64,
    since: Option<Instant>,
}

impl Stall {
    /// `taken`: the bytes the peer has taken so far and the bytes still waiting for it.
    fn stalled(&mut self, taken: Option<(u64, usize)>, now: Instant, limit: Duration) -> bool {
        let Some((taken, waiting)) = taken else {
            return false;
        };
        if waiting == 0 || taken > self.taken {
            self.since = None;
        } else {
            let since = *self.since.get_or_insert(now);
            if now.duration_since(since) >= limit {
                return true;
            }
        }
        self.taken = taken;
        false
    }
}

async fn accept_other(
    listener: Option<&TcpListener>,
) -> io::Result<(TcpStream, std::net::SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

fn merge(old: ModemLines, new: ModemLines) -> ModemLines {
    ModemLines {
        valid: old.valid | new.valid,
        state: (old.state & !new.valid) | (new.state & new.valid),
    }
}

/// What to do with a message from the sink while no peer is connected: keep the state,
/// hold (client) or drop (server) the data. `false` when the endpoints are gone.
fn away(b: &mut Between, m: Option<Msg>, role: Role) -> bool {
    match m {
        None => return false,
        Some(Msg::Data(d)) => match role {
            Role::Server => b.dropped += d.len() as u64,
            Role::Client => {
                b.held.extend(d);
                let over = b.held.len().saturating_sub(HOLD_WHILE_AWAY);
                b.held.drain(..over);
                b.dropped += over as u64;
            }
        },
        Some(Msg::Settings(s)) => {
            if role == Role::Client {
                b.settings = s;
            }
        }
        // A break or purge of a port nobody is connected to: nothing to do.
        Some(Msg::Break(_) | Msg::Purge(_)) => {}
        Some(Msg::Modem(m)) => {
            let mine = match role {
                Role::Server => {
                    ModemLines::CTS | ModemLines::DSR | ModemLines::DCD | ModemLines::RI
                }
                Role::Client => ModemLines::DTR | ModemLines::RTS,
            };
            b.modem = merge(
                b.modem,
                ModemLines {
                    valid: m.valid & mine,
                    state: m.state,
                },
            );
        }
    }
    true
}

/// The server's connection task: one client at a time, for as long as the endpoints live.
async fn serve(
    endpoint: &'static str,
    listener: TcpListener,
    settings: LineSettings,
    stall: Option<Duration>,
    ends: TaskEnds,
) {
    let TaskEnds {
        mut to_peer,
        from_peer,
        source_attached,
    } = ends;
    let mut b = Between {
        endpoint,
        modem: ModemLines::default(),
        settings,
        held: VecDeque::new(),
        dropped: 0,
        bad: RateLimit::default(),
        logs: PortLogs::default(),
        source_attached,
    };
    loop {
        let (mut sock, from) = loop {
            tokio::select! {
                a = listener.accept() => match a {
                    Ok(c) => break c,
                    Err(e) => {
                        tracing::warn!(endpoint, error = %e, "accepting an RFC 2217 client");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                m = to_peer.recv() => if !away(&mut b, m, Role::Server) { return },
            }
        };
        let now = Instant::now();
        if b.dropped > 0 {
            if let Some(suppressed) = b.logs.dropped.admit(now) {
                tracing::warn!(
                    endpoint,
                    bytes = b.dropped,
                    suppressed,
                    "bytes from the device were dropped while no RFC 2217 client was connected"
                );
                b.dropped = 0;
            }
        }
        let _ = sock.set_nodelay(true);
        let peer = from.to_string();
        if let Some(suppressed) = b.logs.came.admit(now) {
            tracing::info!(endpoint, client = %peer, suppressed, "RFC 2217 client connected");
        }
        let mut t = Telnet::new(Role::Server, b.settings);
        t.set_modem(b.modem);
        let r = session(
            &mut b,
            &mut sock,
            &peer,
            t,
            &mut to_peer,
            &from_peer,
            (Some(&listener), stall),
        )
        .await;
        match (r, b.logs.went.admit(Instant::now())) {
            (Ok(false), _) => return,
            (_, None) => {}
            (Err(e), Some(suppressed)) if is_stall(&e) => {
                tracing::warn!(
                    endpoint,
                    client = %peer,
                    suppressed,
                    "the RFC 2217 client has not read for {:.1} s: let go, the port is free for the next client (stall_timeout_ms)",
                    stall.unwrap_or_default().as_secs_f64()
                )
            }
            (Ok(true), Some(suppressed)) => {
                tracing::info!(endpoint, client = %peer, suppressed, "RFC 2217 client left; waiting for the next")
            }
            (Err(e), Some(suppressed)) => {
                tracing::info!(endpoint, client = %peer, error = %e, suppressed, "RFC 2217 client lost; waiting for the next")
            }
        }
    }
}

/// The client's connection task: connect, serve, reconnect, for as long as the endpoints live.
async fn connect(endpoint: &'static str, address: String, settings: LineSettings, ends: TaskEnds) {
    let TaskEnds {
        mut to_peer,
        from_peer,
        source_attached,
    } = ends;
    let mut b = Between {
        endpoint,
        modem: ModemLines {
            valid: ModemLines::DTR | ModemLines::RTS,
            state: ModemLines::DTR | ModemLines::RTS,
        },
        settings,
        held: VecDeque::new(),
        dropped: 0,
        bad: RateLimit::default(),
        logs: PortLogs::default(),
        source_attached,
    };
    let mut wait = RETRY_FIRST;
    let mut failures = RateLimit::new(Duration::from_secs(30));
    loop {
        let attempt = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&address));
        let sock = tokio::select! {
            r = attempt => match r {
                Ok(Ok(s)) => Some(s),
                Ok(Err(e)) => {
                    if let Some(suppressed) = failures.admit(Instant::now()) {
                        tracing::warn!(endpoint, server = %address, error = %e, suppressed, "cannot reach the RFC 2217 server; retrying");
                    }
                    None
                }
                Err(_) => {
                    if let Some(suppressed) = failures.admit(Instant::now()) {
                        tracing::warn!(endpoint, server = %address, suppressed, "the RFC 2217 server did not answer within 5 s; retrying");
                    }
                    None
                }
            },
            m = to_peer.recv() => {
                if !away(&mut b, m, Role::Client) { return }
                continue;
            }
        };
        let Some(mut sock) = sock else {
            let until = tokio::time::Instant::now() + wait;
            wait = (wait * 2).min(RETRY_MAX);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => break,
                    m = to_peer.recv() => if !away(&mut b, m, Role::Client) { return },
                }
            }
            continue;
        };
        wait = RETRY_FIRST;
        let _ = sock.set_nodelay(true);
        let now = Instant::now();
        if let Some(suppressed) = b.logs.came.admit(now) {
            tracing::info!(endpoint, server = %address, settings = %b.settings, suppressed, "connected to the RFC 2217 server");
        }
        if b.dropped > 0 {
            if let Some(suppressed) = b.logs.dropped.admit(now) {
                tracing::warn!(endpoint, bytes = b.dropped, suppressed, "bytes for the port were dropped while the RFC 2217 server was away (the newest 64 KiB were kept)");
                b.dropped = 0;
            }
        }
        let mut t = Telnet::new(Role::Client, b.settings);
        let held: Vec<u8> = b.held.drain(..).collect();
        t.send_data(&held);
        match session(
            &mut b,
            &mut sock,
            &address,
            t,
            &mut to_peer,
            &from_peer,
            (None, None),
        )
        .await
        {
            Ok(false) => return,
            Ok(true) => {
                if let Some(suppressed) = b.logs.went.admit(Instant::now()) {
                    tracing::warn!(endpoint, server = %address, suppressed, "the RFC 2217 server closed the connection; reconnecting")
                }
            }
            Err(e) => {
                if let Some(suppressed) = b.logs.went.admit(Instant::now()) {
                    tracing::warn!(endpoint, server = %address, error = %e, suppressed, "the RFC 2217 connection broke; reconnecting")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_core::testlog::Captured;

    fn between() -> Between {
        Between {
            endpoint: "rfc2217-client",
            modem: ModemLines::default(),
            settings: LineSettings::default(),
            held: VecDeque::new(),
            dropped: 0,
            bad: RateLimit::default(),
            logs: PortLogs::default(),
            source_attached: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A server that answers every SET with another value, a thousand times in a second:
    /// five lines, then one with the count held back.
    #[test]
    fn a_thousand_refused_settings_in_a_second_are_a_few_lines() {
        let mut b = between();
        let t0 = Instant::now();
        let ((), log) = Captured::run(|| {
            for i in 0..=1000u64 {
                let now = t0 + Duration::from_millis(if i == 1000 { 2000 } else { i });
                assert!(b
                    .note("server", Note::Refused("baud", 9600, 1), now)
                    .is_none());
            }
        });
        let lines = log.matching("not 9600 as asked");
        assert_eq!(lines.len(), 6, "{lines:#?}");
        assert!(lines[5].contains("suppressed=995"), "{lines:#?}");
    }

    /// Strangers at a server's `listen` address connect and hang up as fast as they can, and
    /// others are turned away while one holds the port, for over a second: at most five
    /// lines of each kind a second, and later ones say how many were not shown.
    #[tokio::test]
    async fn strangers_connecting_at_line_rate_are_five_lines_a_second() {
        let (log, _guard) = Captured::start();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_port, ends) = Rfc2217::new("test".into(), LineSettings::default());
        let started = Instant::now();
        let counted = |what: &str| log.counted(what);
        let strangers = async {
            let mut n = 0u32;
            while !counted("RFC 2217 client connected") || !counted("client left") {
                assert!(started.elapsed() < Duration::from_secs(10), "no count");
                let mut s = TcpStream::connect(addr).await.unwrap();
                // Its greeting (telnet negotiation), then hang up.
                let _ = s.read(&mut [0u8; 64]).await;
                drop(s);
                n += 1;
            }
            let hold = TcpStream::connect(addr).await.unwrap();
            while !counted("turned away") {
                assert!(started.elapsed() < Duration::from_secs(10), "no count");
                let mut s = TcpStream::connect(addr).await.unwrap();
                let _ = s.read(&mut [0u8; 64]).await;
                n += 1;
            }
            drop(hold);
            n
        };
        let n = tokio::select! {
            () = serve("rfc2217-server", listener, LineSettings::default(), None, ends) => {
                panic!("the server stopped")
            }
            n = strangers => n,
        };
        let secs = started.elapsed().as_secs_f64().ceil() as usize;
        for what in ["client connected", "client left", "turned away"] {
            let lines = log.matching(what);
            assert!(
                lines.len() <= 5 * (secs + 1),
                "{n} strangers, {} lines in {secs} s: {lines:#?}",
                lines.len()
            );
        }
    }
}
