//! The three links behind one face, and how a side gets one: TCP (plain or TLS) with a
//! byte-stream reader and writer, QUIC (a stream per reliable ndd stream, datagrams for lossy
//! ones) and UDP (datagrams, fragmented). A [`Connector`] listens or connects (with capped
//! exponential backoff), checks the peer's pinned identity and runs the HELLO/READY handshake
//! (docs/protocol.md §5) whose decision is `ndd_core::session::decide_handshake`; the driver
//! then reads with [`Rx`] and writes with [`Tx`].

use crate::{
    Incoming, KnownPeers, LinkError, Listener, MessageReader, MessageWriter, PeerInfo, QuicConn,
    QuicListener, QuicSender, UdpLink, UdpSender,
};
use ndd_core::session::{decide_handshake, HandshakeDecision, PeerOpening, Transmit};
use ndd_core::RateLimit;
use ndd_core::{Frame, Meta};
use ndd_wire::text::{printable, MAX_REASON};
use ndd_wire::{CloseCode, OwnedMessage, WireError};
use ndd_wire::{DataHeader, Message};
use std::collections::VecDeque;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::{AbortHandle, JoinSet};

/// Which link a side uses (`[link] transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// TCP, with TLS 1.3 unless `insecure`.
    #[default]
    Tcp,
    /// QUIC (always TLS 1.3, same identities).
    Quic,
    /// UDP datagrams, sealed with keys from a key exchange between the two identities
    /// (plain with `insecure`); reliable messages are retransmitted (`crate::arq`).
    Udp,
    /// Through a NATS server ([`crate::nats`]): one device, many app sides.
    Nats,
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Quic => "quic",
            TransportKind::Udp => "udp",
            TransportKind::Nats => "nats",
        })
    }
}

/// The receiving half of a connection.
#[derive(Debug)]
#[allow(missing_docs)]
pub enum Rx {
    Tcp(MessageReader),
    Quic(QuicConn),
    Udp(Box<UdpLink>),
}

impl Rx {
    /// The next message; `None` at a clean end.
    pub async fn read(&mut self) -> Result<Option<Incoming>, LinkError> {
        match self {
            Rx::Tcp(r) => r.read().await,
            Rx::Quic(c) => c.recv().await,
            Rx::Udp(u) => u.recv().await,
        }
    }

    /// A UDP link's drop counters (`None` on TCP and QUIC).
    pub fn drops(&self) -> Option<std::sync::Arc<crate::udp::LinkDrops>> {
        match self {
            Rx::Udp(u) => Some(u.drops()),
            _ => None,
        }
    }

    /// Largest body accepted from the peer.
    pub fn set_max_body(&mut self, max: u32) {
        match self {
            Rx::Tcp(r) => r.set_max_body(max),
            Rx::Quic(c) => c.set_max_body(max),
            Rx::Udp(u) => u.set_max_body(max),
        }
    }
}

/// The sending half of a connection.
#[derive(Debug)]
#[allow(missing_docs)]
pub enum Tx {
    Tcp(MessageWriter),
    Quic(QuicSender),
    Udp(UdpSender),
}

impl Tx {
    /// The send priority of ndd stream `stream`: on QUIC its QUIC stream's priority (a
    /// stream's bytes already handed to QUIC leave before a lower one's); nothing to do on
    /// TCP and UDP, where the session's order is the wire's.
    pub fn set_stream_priority(&mut self, stream: u16, priority: ndd_core::session::Priority) {
        if let Tx::Quic(s) = self {
            s.set_stream_priority(stream, priority);
        }
    }

    /// Any message but DATA.
    pub async fn write_message(&mut self, m: &Message<'_>) -> Result<(), LinkError> {
        match self {
            Tx::Tcp(w) => w.write_message(m).await,
            Tx::Quic(s) => s.send_message(m).await,
            Tx::Udp(s) => s.send_message(m).await,
        }
    }

    /// One message the session yielded. DATA on TCP goes in line with everything else; QUIC
    /// puts a reliable stream's frames on that stream's own QUIC stream and a lossy stream's
    /// in datagrams; UDP sends datagrams either way. The payload is not copied.
    pub async fn write_transmit(&mut self, t: &Transmit) -> Result<(), LinkError> {
        let (header, payload, reliable) = match t {
            Transmit::Message(m) => return self.write_message(&m.as_message()).await,
            Transmit::Data {
                stream,
                retransmit,
                more,
                seq,
                timestamp_ns,
                payload,
                reliable,
            } => (
                DataHeader {
                    stream_id: *stream,
                    retransmit: *retransmit,
                    more: *more,
                    seq: *seq,
                    timestamp_ns: *timestamp_ns,
                },
                payload,
                *reliable,
            ),
        };
        let frame = || {
            Frame::from_bytes(
                Meta {
                    stream: header.stream_id,
                    seq: header.seq,
                    timestamp_ns: header.timestamp_ns,
                    flags: header.flags(),
                },
                payload.clone(),
            )
        };
        match self {
            Tx::Tcp(w) => w.write_data(&header, payload).await,
            Tx::Quic(s) => s.send_frame(frame(), reliable).await,
            Tx::Udp(s) => s.send_frame(frame(), reliable).await,
        }
    }

    /// Pushes buffered bytes to the socket (TCP).
    pub async fn flush(&mut self) -> Result<(), LinkError> {
        match self {
            Tx::Tcp(w) => w.flush().await,
            Tx::Quic(_) | Tx::Udp(_) => Ok(()),
        }
    }

    /// Closes our direction (TLS close_notify).
    pub async fn shutdown(&mut self) -> Result<(), LinkError> {
        match self {
            Tx::Tcp(w) => w.shutdown().await,
            Tx::Quic(s) => s.shutdown().await,
            Tx::Udp(_) => Ok(()),
        }
    }

    /// Whether a session should cut large frames into chunks on this link, and the peer's
    /// `max_body`. TCP and TLS carry every stream on one byte stream in order, so a frame is
    /// cut into pieces (1 ms of the path, at least `link.chunk_bytes`) that another stream's
    /// frame can go between; QUIC gives each stream its own QUIC stream, and UDP fragments
    /// below the protocol.
    pub fn chunking(&self) -> (bool, usize) {
        match self {
            Tx::Tcp(w) => (true, w.peer_max_body() as usize),
            Tx::Quic(_) | Tx::Udp(_) => (false, usize::MAX),
        }
    }

    /// On TCP and TLS, how many written bytes may wait unsent in the socket (see
    /// [`MessageWriter::set_unsent_limit`](crate::MessageWriter::set_unsent_limit)); nothing
    /// to do on QUIC and UDP.
    pub fn set_unsent_limit(&mut self, bytes: usize) {
        if let Tx::Tcp(w) = self {
            w.set_unsent_limit(bytes);
        }
    }

    /// Largest body the peer accepts.
    pub fn set_peer_max_body(&mut self, max: u32) {
        match self {
            Tx::Tcp(w) => w.set_peer_max_body(max),
            Tx::Quic(s) => s.set_peer_max_body(max),
            Tx::Udp(s) => s.set_peer_max_body(max),
        }
    }
}

/// TLS material of a side: its identity and the rustls configurations built from it.
#[derive(Debug)]
pub struct Tls {
    /// This install's identity.
    pub identity: crate::Identity,
    /// Accepting side.
    pub server: Arc<crate::ServerConfig>,
    /// Connecting side.
    pub client: Arc<crate::ClientConfig>,
    /// What signs the UDP key exchange.
    pub udp: crate::seal::LocalIdentity,
}

impl Tls {
    /// Both configurations for `identity`.
    pub fn new(identity: crate::Identity) -> Result<Tls, LinkError> {
        Ok(Tls {
            server: crate::server_config(&identity)?,
            client: crate::client_config(&identity)?,
            udp: crate::seal::LocalIdentity::new(&identity)?,
            identity,
        })
    }
}

/// What every handshake needs, shared by the first connection and every reconnect.
#[derive(Debug, Clone)]
pub struct HandshakeCtx {
    /// Our HELLO.
    pub hello: ndd_wire::HelloRepr,
    /// Largest body we accept.
    pub max_body: u32,
    /// `None`: plain TCP (`--insecure`).
    pub tls: Option<Arc<Tls>>,
    /// Where `known_peers` lives (reloaded on every connection).
    pub home: PathBuf,
    /// How long the first connect keeps retrying (unless `keep_trying`); bound of one
    /// connect attempt.
    pub timeout: Duration,
    /// The first connect keeps retrying past `timeout` while the peer is unreachable (not
    /// when it refuses us): a side that outlives its peer may start before it.
    pub keep_trying: bool,
    /// Bound of one whole handshake (TLS, trust, HELLO, READY): a connection that has not
    /// finished by then is dropped.
    pub handshake_timeout: Duration,
    /// Longest wait between reconnect attempts.
    pub max_backoff: Duration,
    /// `device` or `app`, for log lines.
    pub side: &'static str,
    /// The peer this (listening) side serves now: a trusted peer that connects meanwhile is
    /// refused with CLOSE code 7 (busy), naming it, instead of waiting in the listen queue.
    pub busy_with: Option<String>,
    /// A listener serving several peers: asked about each trusted peer (by fingerprint, or
    /// address without TLS) once it is known; a reason refuses it as busy (CLOSE code 7).
    pub gate: Option<PeerGate>,
}

/// Whether a listener that serves several peers takes one more: `None`, or why not.
#[derive(Clone)]
pub struct PeerGate(pub Arc<GateFn>);

/// [`PeerGate`]'s question: the peer's fingerprint (or address) → why it is turned away.
pub type GateFn = dyn Fn(&str) -> Option<String> + Send + Sync;

impl std::fmt::Debug for PeerGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerGate")
    }
}

/// A link that passed the handshake.
#[derive(Debug)]
pub struct Established {
    /// Reading half.
    pub rx: Rx,
    /// Writing half.
    pub tx: Tx,
    /// The peer's trusted name or fingerprint (TLS), or its address.
    pub peer: String,
    /// The peer's fingerprint, checked against `known_peers` (`None` with `--insecure`).
    pub fingerprint: Option<String>,
    /// The peer's socket address.
    pub addr: std::net::SocketAddr,
}

/// The smallest chunk a session cuts large frames into on TCP and TLS (docs/protocol.md
/// §4.1; a chunk is 1 ms of the path's measured rate, at least this): 1.6 ms of a 20 Mbit/s
/// link. On a 20 Mbit/s link beside 100 KB frames a small frame's one-way p50 was 21 ms whole,
/// 16.8 ms with 16 KiB chunks, 14.3 ms with 4 KiB ones (`scripts/shaped-link.sh`).
pub const CHUNK_BYTES: usize = 4 << 10;

/// Why no link came of an attempt.
#[derive(Debug, thiserror::Error)]
pub enum EstablishError {
    /// Nobody there, a network failure, or something that is no ndd peer: worth retrying
    /// (connecting) or ignoring (listening).
    #[error("{0}")]
    Transient(String),
    /// A real peer we cannot work with: stack or version mismatch, untrusted identity, or it
    /// refused us. Both sides report it.
    #[error("{0}")]
    Refused(String),
    /// A local problem no retry fixes (a port that cannot be bound, unreadable trust file).
    #[error("{0}")]
    Local(String),
    /// A trusted peer this listener turned away because it serves another (CLOSE code 7).
    #[error("{0}")]
    Busy(String),
}

/// Where links come from: a listener we accept on, or an address we connect to.
#[derive(Debug)]
pub enum Connector {
    /// TCP (TLS unless insecure), accepting.
    Listen(Listener),
    /// TCP, connecting.
    Connect(String),
    /// QUIC, accepting.
    QuicListen(QuicListener),
    /// QUIC, connecting.
    QuicConnect(String),
    /// UDP has no connections: the listening side binds afresh for every session.
    UdpListen(String),
    /// UDP, sending to this address.
    UdpConnect(String),
}

/// Handshakes in flight on one listener, at most.
pub const MAX_PENDING: usize = 64;
/// Handshakes in flight from one source address, at most.
pub const MAX_PENDING_PER_ADDR: usize = 8;

/// A connection a listener accepted, before its handshake.
enum Accepted {
    Tcp(tokio::net::TcpStream, std::net::SocketAddr),
    Quic(Box<quinn::Incoming>),
}

impl Accepted {
    fn ip(&self) -> IpAddr {
        match self {
            Accepted::Tcp(_, a) => a.ip(),
            Accepted::Quic(i) => i.remote_address().ip(),
        }
    }

    /// TLS (or QUIC's handshake), trust, HELLO, READY.
    async fn handshake(self, ctx: &HandshakeCtx) -> Result<Established, EstablishError> {
        let (rx, tx, info) = match self {
            Accepted::Tcp(tcp, addr) => {
                let tls = ctx.tls.as_ref().map(|t| &t.server);
                let (conn, info) = crate::conn::secure(tcp, addr, tls, ctx.handshake_timeout)
                    .await
                    .map_err(transient)?;
                let (r, w) = conn.split();
                (Rx::Tcp(r), Tx::Tcp(w), info)
            }
            Accepted::Quic(incoming) => {
                let (c, info) = crate::quic::quic_secure(*incoming, ctx.handshake_timeout)
                    .await
                    .map_err(transient)?;
                let s = c.sender();
                (Rx::Quic(c), Tx::Quic(s), info)
            }
        };
        handshake(rx, tx, info, ctx).await
    }
}

/// A listener's log lines, each kind at most five a second with the count it held back:
/// strangers must not be able to flood the log.
struct ServeLogs {
    refused: RateLimit,
    /// Refusals said lately, by their text without port numbers: a refused peer that waits
    /// and retries (it does since 2026-11-29) is said once per [`REPEAT_SAID`], not at
    /// every attempt. (When it was said, and how many came since.)
    said: std::collections::HashMap<String, (Instant, u64)>,
    rejected: RateLimit,
    evicted: RateLimit,
    /// A peer waiting for a busy listener retries every few seconds: one line per 30 s.
    busy: RateLimit,
}

impl Default for ServeLogs {
    fn default() -> Self {
        let limit = || RateLimit::with_burst(std::time::Duration::from_secs(1), 5);
        ServeLogs {
            refused: limit(),
            said: std::collections::HashMap::new(),
            rejected: limit(),
            evicted: limit(),
            busy: RateLimit::new(std::time::Duration::from_secs(30)),
        }
    }
}

/// How often the same refusal (a peer that retries) is said again.
const REPEAT_SAID: Duration = Duration::from_secs(30);

/// Refusals remembered at once (distinct texts; the oldest goes first).
const SAID_KEPT: usize = 256;

/// `text` without the port numbers of the socket addresses in it (a retrying peer connects
/// from a new port each time).
fn without_ports(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            let core = w.trim_end_matches([';', ',', ':', ')']);
            match core.parse::<std::net::SocketAddr>() {
                Ok(a) => w.replacen(core, &a.ip().to_string(), 1),
                Err(_) => w.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl ServeLogs {
    /// Whether refusal `key` was said within [`REPEAT_SAID`] (then it is counted, not said).
    fn repeated(&mut self, key: &str, now: Instant) -> bool {
        match self.said.get_mut(key) {
            Some((at, n)) if now.saturating_duration_since(*at) < REPEAT_SAID => {
                *n += 1;
                true
            }
            _ => false,
        }
    }

    /// Refusal `key` is said now: how many like it went unsaid before.
    fn said_now(&mut self, key: String, now: Instant) -> u64 {
        let before = self.said.insert(key, (now, 0)).map_or(0, |(_, n)| n);
        if self.said.len() > SAID_KEPT {
            if let Some(oldest) = self
                .said
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone())
            {
                self.said.remove(&oldest);
            }
        }
        before
    }

    /// Whether refusal `e` is to be said now (not said within [`REPEAT_SAID`], and within the
    /// flood limit), and how many like it went unsaid before it. One the flood limit holds back
    /// is not taken as said.
    fn fresh(&mut self, e: &str, now: Instant) -> Option<(u64, u64)> {
        let key = without_ports(e);
        if self.repeated(&key, now) {
            return None;
        }
        let n = self.refused.admit(now)?;
        Some((n, self.said_now(key, now)))
    }

    fn refused(&mut self, side: &str, e: &str) {
        if let Some((n, again)) = self.fresh(e, Instant::now()) {
            tracing::warn!(side, "refused a connection: {e}{}{}", more(n), since(again));
        }
    }

    fn busy(&mut self, side: &str, e: &str) {
        if let Some(n) = self.busy.admit(Instant::now()) {
            tracing::warn!(side, "refused a connection: {e}{}", more(n));
        }
    }

    /// A peer past the trust check that this side refused (a UDP listener's handshake).
    fn refused_peer(&mut self, side: &str, e: &str) {
        if let Some((n, again)) = self.fresh(e, Instant::now()) {
            tracing::warn!(side, "refused a peer: {e}{}{}", more(n), since(again));
        }
    }

    fn rejected(&mut self, side: &str, e: &str) {
        if let Some(n) = self.rejected.admit(Instant::now()) {
            tracing::warn!(side, "rejected a connection: {e}{}", more(n));
        }
    }

    fn evicted(&mut self, side: &str, ip: IpAddr) {
        if let Some(n) = self.evicted.admit(Instant::now()) {
            tracing::warn!(
                side,
                "too many unfinished handshakes: dropped the oldest, from {ip}{}",
                more(n)
            );
        }
    }
}

fn more(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more like it not shown)")
    }
}

/// How many times the same refusal came since it was last said.
fn since(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" (refused {n} more time(s) since it was last said)")
    }
}

/// Connection errors worth retrying while the peer may still be starting or is coming back.
fn retryable(e: &LinkError) -> bool {
    matches!(
        e,
        LinkError::Connect { .. }
            | LinkError::ConnectTimeout { .. }
            | LinkError::Handshake { .. }
            | LinkError::HandshakeTimeout { .. }
            | LinkError::Io(_)
            | LinkError::QuicConnect { .. }
            | LinkError::QuicHandshake { .. }
            | LinkError::QuicConnection { .. }
            | LinkError::UdpKeyExchangeTimeout { .. }
    )
}

/// ±20 % jitter so many clients do not retry in step.
fn jittered(d: Duration, n: u64) -> Duration {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let x = (t ^ n.wrapping_mul(0x9e37_79b9)) % 1000;
    d.mul_f64(0.8 + 0.4 * x as f64 / 1000.0)
}

fn transient(e: LinkError) -> EstablishError {
    EstablishError::Transient(e.to_string())
}

impl Connector {
    /// A connector for `transport`: binds now when listening (so the port is known and its
    /// errors come at once).
    pub async fn new(
        transport: TransportKind,
        listen: bool,
        addr: &str,
        tls: Option<&Tls>,
    ) -> Result<Connector, EstablishError> {
        Ok(match (transport, listen) {
            (TransportKind::Tcp, false) => Connector::Connect(addr.to_string()),
            (TransportKind::Tcp, true) => Connector::Listen(
                crate::listen(addr)
                    .await
                    // The error names the address already.
                    .map_err(|e| EstablishError::Local(e.to_string()))?,
            ),
            (TransportKind::Quic, false) => Connector::QuicConnect(addr.to_string()),
            (TransportKind::Quic, true) => {
                let id = &tls
                    .ok_or_else(|| EstablishError::Local("QUIC needs an identity".into()))?
                    .identity;
                Connector::QuicListen(crate::quic_listen(addr, id).await.map_err(|e| {
                    EstablishError::Local(match e {
                        // The error names the address already.
                        LinkError::Bind { .. } => format!("QUIC: {e}"),
                        e => format!("cannot listen (QUIC) on {addr}: {e}"),
                    })
                })?)
            }
            (TransportKind::Udp, false) => Connector::UdpConnect(addr.to_string()),
            (TransportKind::Udp, true) => {
                // A UDP listener binds afresh for each peer (after a link is lost too), so an
                // ephemeral port would change under the peer's feet.
                if addr.rsplit_once(':').is_some_and(|(_, port)| port == "0") {
                    return Err(EstablishError::Local(format!(
                        "cannot listen (UDP) on {addr}: port 0 picks a new port at each \
                         bind, and a UDP listener binds again for every peer; name a fixed port"
                    )));
                }
                Connector::UdpListen(addr.to_string())
            }
            (TransportKind::Nats, _) => {
                return Err(EstablishError::Local(
                    "the NATS link has no peer connection; it runs through a NATS server".into(),
                ))
            }
        })
    }

    /// Where a listening connector waits, for the "listening on" line.
    pub fn local_addr(&self) -> Option<String> {
        match self {
            Connector::Listen(l) => l.local_addr().map(|a| a.to_string()).ok(),
            Connector::QuicListen(l) => l.local_addr().map(|a| format!("{a} (QUIC)")).ok(),
            Connector::UdpListen(a) => Some(format!("{a} (UDP)")),
            _ => None,
        }
    }

    /// One try: connect once, or accept one connection (a UDP listener binds and waits for
    /// a first datagram), then trust and handshake.
    ///
    /// `until`: a first connection's deadline, which bounds the UDP key exchange too.
    async fn attempt(
        &self,
        ctx: &HandshakeCtx,
        until: Option<Instant>,
    ) -> Result<Established, EstablishError> {
        let tls = ctx.tls.as_deref();
        // The link's own errors name the address already.
        let connect_error = |e: LinkError| {
            let text = e.to_string();
            if retryable(&e) {
                EstablishError::Transient(text)
            } else {
                EstablishError::Local(text)
            }
        };
        let (rx, tx, info) = match self {
            Connector::Connect(addr) => {
                let (conn, info) = crate::connect(addr, tls.map(|t| &t.client), ctx.timeout)
                    .await
                    .map_err(connect_error)?;
                let (r, w) = conn.split();
                (Rx::Tcp(r), Tx::Tcp(w), info)
            }
            Connector::QuicConnect(addr) => {
                let Some(tls) = tls else {
                    return Err(EstablishError::Local(
                        "QUIC needs TLS identities: it cannot run with --insecure".into(),
                    ));
                };
                let (c, info) = crate::quic_connect(addr, &tls.identity, ctx.timeout)
                    .await
                    .map_err(connect_error)?;
                let s = c.sender();
                (Rx::Quic(c), Tx::Quic(s), info)
            }
            Connector::UdpConnect(addr) => {
                let (u, fingerprint) = match tls {
                    Some(tls) => {
                        let limit = until.map_or(ctx.handshake_timeout, |u| {
                            u.saturating_duration_since(Instant::now())
                                .clamp(Duration::from_millis(200), ctx.handshake_timeout)
                        });
                        let (u, fp) = crate::udp_connect_secure(addr, &tls.udp, limit)
                            .await
                            .map_err(connect_error)?;
                        (u, Some(fp))
                    }
                    None => (crate::udp_connect(addr).await.map_err(connect_error)?, None),
                };
                let s = u.sender();
                let addr = s.peer_addr().ok_or_else(|| {
                    EstablishError::Local("UDP link without a peer address".into())
                })?;
                let info = PeerInfo { addr, fingerprint };
                (Rx::Udp(Box::new(u)), Tx::Udp(s), info)
            }
            Connector::UdpListen(addr) => {
                let u = crate::udp_bind(addr)
                    .await
                    .map_err(|e| EstablishError::Local(format!("cannot bind UDP {addr}: {e}")))?;
                let s = u.sender();
                let local = u
                    .local_addr()
                    .map_err(|e| EstablishError::Local(e.to_string()))?;
                let info = PeerInfo {
                    addr: local,
                    fingerprint: None,
                };
                (Rx::Udp(Box::new(u)), Tx::Udp(s), info)
            }
            Connector::Listen(_) | Connector::QuicListen(_) => {
                unreachable!("stream listeners accept in serve()")
            }
        };
        handshake(rx, tx, info, ctx).await
    }

    /// A listener's loop: serves on past anything a connection does (garbage, a stranger, a
    /// peer that disagrees, one that stalls), and stops only on a local problem.
    ///
    /// TCP and QUIC handshakes run concurrently, each bounded by `handshake_timeout`, at most
    /// [`MAX_PENDING`] at once and [`MAX_PENDING_PER_ADDR`] per source address; a new
    /// connection over a bound evicts the oldest one still in its handshake (from the same
    /// address first), so idle or dripping connections cannot keep a real peer out.
    ///
    /// A UDP listener binds afresh for every session: on a reconnect (`first` false) a bind
    /// that fails (the old socket not yet gone) is retried, not fatal.
    async fn serve(&self, ctx: &HandshakeCtx, first: bool) -> Result<Established, EstablishError> {
        let mut logs = ServeLogs::default();
        if let Connector::UdpListen(addr) = self {
            let mut backoff = Duration::from_millis(20);
            loop {
                let attempt = match ctx.tls.as_deref() {
                    Some(tls) => accept_udp_secure(addr, tls, ctx, &mut logs).await,
                    None => self.attempt(ctx, None).await,
                };
                match attempt {
                    Ok(x) => return Ok(x),
                    Err(e @ EstablishError::Local(_)) if first => return Err(e),
                    Err(EstablishError::Local(e)) => {
                        // The old link's socket may take a moment to go: say so only when
                        // it lasts.
                        if backoff >= Duration::from_millis(640) {
                            tracing::warn!(side = ctx.side, "{e}; retrying");
                        } else {
                            tracing::debug!(side = ctx.side, "{e}; retrying");
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(ctx.max_backoff);
                    }
                    Err(EstablishError::Refused(e)) => logs.refused_peer(ctx.side, &e),
                    Err(EstablishError::Busy(e)) => logs.busy(ctx.side, &e),
                    Err(EstablishError::Transient(e)) => {
                        tracing::debug!(error = %e, "no UDP peer yet")
                    }
                }
            }
        }
        self.serve_streams(ctx, None).await
    }

    /// The TCP and QUIC part of [`Connector::serve`]: the first link that passes its
    /// handshake, or with `each` every one, handed there.
    async fn serve_streams(
        &self,
        ctx: &HandshakeCtx,
        each: Option<&tokio::sync::mpsc::Sender<Established>>,
    ) -> Result<Established, EstablishError> {
        let mut logs = ServeLogs::default();
        let shared = Arc::new(ctx.clone());
        let mut tasks: JoinSet<Result<Established, EstablishError>> = JoinSet::new();
        // Oldest first: task id, source address, handle to evict it.
        let mut pending: VecDeque<(tokio::task::Id, IpAddr, AbortHandle)> = VecDeque::new();
        loop {
            tokio::select! {
                accepted = self.accept_one() => {
                    let accepted = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            logs.rejected(ctx.side, &e.to_string());
                            continue;
                        }
                    };
                    let ip = accepted.ip();
                    let from_ip = pending.iter().filter(|p| p.1 == ip).count();
                    let evict = if from_ip >= MAX_PENDING_PER_ADDR {
                        pending.iter().position(|p| p.1 == ip)
                    } else if pending.len() >= MAX_PENDING {
                        Some(0)
                    } else {
                        None
                    };
                    if let Some(k) = evict.and_then(|k| pending.remove(k)) {
                        k.2.abort();
                        logs.evicted(ctx.side, k.1);
                    }
                    let ctx = Arc::clone(&shared);
                    let handle = tasks.spawn(async move {
                        let timeout = ctx.handshake_timeout;
                        tokio::time::timeout(timeout, accepted.handshake(&ctx))
                            .await
                            .unwrap_or_else(|_| {
                                Err(EstablishError::Transient(format!(
                                    "{ip}: no complete handshake within {} ms",
                                    timeout.as_millis()
                                )))
                            })
                    });
                    pending.push_back((handle.id(), ip, handle));
                }
                Some(done) = tasks.join_next_with_id() => {
                    let id = match &done {
                        Ok((id, _)) => *id,
                        Err(e) => e.id(),
                    };
                    pending.retain(|p| p.0 != id);
                    match done {
                        Ok((_, Ok(x))) => match each {
                            Some(tx) => {
                                if let Err(lost) = tx.send(x).await {
                                    return Ok(lost.0);
                                }
                            }
                            None => return Ok(x),
                        },
                        Ok((_, Err(e @ EstablishError::Local(_)))) => return Err(e),
                        Ok((_, Err(EstablishError::Refused(e)))) => logs.refused(ctx.side, &e),
                        Ok((_, Err(EstablishError::Busy(e)))) => logs.busy(ctx.side, &e),
                        Ok((_, Err(EstablishError::Transient(e)))) => logs.rejected(ctx.side, &e),
                        Err(_) => {} // evicted
                    }
                }
            }
        }
    }

    /// While this side serves `serving`, a TCP or QUIC listener goes on accepting: a trusted
    /// peer that connects meanwhile is told at once that this side is busy (CLOSE code 7,
    /// naming whom it serves; the peer retries) instead of waiting unanswered in the listen
    /// queue; strangers are refused as ever. Returns only on a local problem of the listener.
    /// Other connectors have nothing to refuse and never return.
    pub async fn refuse_while_busy(&self, ctx: &HandshakeCtx, serving: String) -> EstablishError {
        if !matches!(self, Connector::Listen(_) | Connector::QuicListen(_)) {
            return std::future::pending().await;
        }
        let busy = HandshakeCtx {
            busy_with: Some(serving),
            ..ctx.clone()
        };
        loop {
            // Every handshake under `busy` ends refused: `Ok` cannot come, and serving on is
            // right if it did.
            if let Err(e) = self.serve(&busy, false).await {
                return e;
            }
        }
    }

    /// A TCP or QUIC listener serving several peers: every link that passes the handshake
    /// goes to `each`, and the listener serves on (handshakes in flight are never dropped for
    /// one that finished). Returns only on a local problem, or once `each` is closed.
    pub async fn serve_each(
        &self,
        ctx: &HandshakeCtx,
        each: tokio::sync::mpsc::Sender<Established>,
    ) -> EstablishError {
        if !matches!(self, Connector::Listen(_) | Connector::QuicListen(_)) {
            return EstablishError::Local(
                "only a TCP or QUIC listener serves several peers".into(),
            );
        }
        match self.serve_streams(ctx, Some(&each)).await {
            Err(e) => e,
            Ok(_) => EstablishError::Local("the listener's peers are no longer taken".into()),
        }
    }

    /// The next connection on a TCP or QUIC listener, before any handshake.
    async fn accept_one(&self) -> Result<Accepted, LinkError> {
        match self {
            Connector::Listen(l) => l.accept_tcp().await.map(|(t, a)| Accepted::Tcp(t, a)),
            Connector::QuicListen(l) => l
                .accept_incoming()
                .await
                .map(|i| Accepted::Quic(Box::new(i))),
            _ => unreachable!("only stream listeners accept"),
        }
    }

    /// The next link. The first connection gives up on a local problem and, when bounded
    /// (`keep_trying` off: `--once`), on the connect timeout and on any refusal (mismatch,
    /// untrusted); unbounded, it waits for the peer past both, saying so; later ones
    /// (reconnects) keep trying, with
    /// capped exponential backoff and ±20 % jitter, and only log what goes wrong. A listener
    /// serves on past anything a connection does, and stops only on a local problem.
    pub async fn establish(
        &self,
        ctx: &HandshakeCtx,
        first: bool,
    ) -> Result<Established, EstablishError> {
        let addr = match self {
            Connector::Connect(a) | Connector::QuicConnect(a) | Connector::UdpConnect(a) => a,
            _ => return self.serve(ctx, first).await,
        };
        let deadline = Instant::now() + ctx.timeout;
        let bounded = first && !ctx.keep_trying;
        let mut backoff = Duration::from_millis(20);
        let mut n: u64 = 0;
        // Once every 30 s each: nobody there, and a refusal (which says what to do: a
        // "nothing listens" line while the peer starts must not hide it).
        let mut told = RateLimit::new(Duration::from_secs(30));
        let mut told_refused = RateLimit::new(Duration::from_secs(30));
        // A first attempt nobody answers (a machine that is off, a firewall that drops) takes
        // the whole connect timeout to fail: said once after a few seconds, not after it.
        let mut said_slow = !first;
        loop {
            n += 1;
            let attempt = self.attempt(ctx, bounded.then_some(deadline));
            tokio::pin!(attempt);
            let result = if said_slow {
                attempt.await
            } else {
                tokio::select! {
                    r = &mut attempt => r,
                    _ = tokio::time::sleep(SLOW_CONNECT) => {
                        said_slow = true;
                        tracing::info!(
                            side = ctx.side,
                            "connecting to {addr}: no answer after {} s (a machine that is off or a firewall that drops the connection looks like this); still trying",
                            SLOW_CONNECT.as_secs()
                        );
                        attempt.await
                    }
                }
            };
            let err = match result {
                Ok(x) => return Ok(x),
                Err(e @ EstablishError::Local(_)) if first => return Err(e),
                // With a bound (`--once`), a refusal ends the first connection; without, the
                // side waits for the peer to accept it, as a listener does (the peer's user
                // runs `ndd trust`, or fixes a stack that disagrees).
                Err(e @ EstablishError::Refused(_)) if bounded => return Err(e),
                Err(e) => e,
            };
            if first && !bounded && matches!(err, EstablishError::Refused(_)) {
                if let Some(n) = told_refused.admit(Instant::now()) {
                    tracing::warn!(
                        side = ctx.side,
                        "{err}; waiting for the peer to accept this side, retrying every {} s at most{}",
                        ctx.max_backoff.as_secs_f64(),
                        more(n)
                    );
                }
            } else if first && (!bounded || matches!(err, EstablishError::Busy(_))) {
                if let Some(n) = told.admit(Instant::now()) {
                    // Refused at once: nothing listens there (the other side is not started,
                    // or started without --listen: both sides connecting wait for good).
                    let why = if err.to_string().contains("Connection refused") {
                        " (nothing listens there yet: start the other side with --listen on that address)"
                    } else {
                        ""
                    };
                    tracing::info!(
                        side = ctx.side,
                        "{err}{why}; waiting for the peer, retrying every {} s at most{}",
                        ctx.max_backoff.as_secs_f64(),
                        more(n)
                    );
                }
            } else if !first && matches!(err, EstablishError::Refused(_)) {
                // A reconnect the peer refuses (it no longer trusts this side, or its stack
                // changed) will not heal by itself: say so, once in a while.
                if let Some(n) = told_refused.admit(Instant::now()) {
                    tracing::warn!(
                        side = ctx.side,
                        "reconnecting: {err}; retrying every {} s at most{}",
                        ctx.max_backoff.as_secs_f64(),
                        more(n)
                    );
                }
            }
            if bounded && Instant::now() + backoff >= deadline {
                let text = err.to_string();
                return Err(EstablishError::Transient(if text.contains(addr.as_str()) {
                    text
                } else {
                    format!("cannot connect to {addr}: {text}")
                }));
            }
            tracing::debug!(%addr, error = %err, "connect failed; retrying");
            tokio::time::sleep(jittered(backoff, n)).await;
            backoff = (backoff * 2).min(ctx.max_backoff);
        }
    }
}

/// How long a first connection attempt may go unanswered before the side says so.
pub const SLOW_CONNECT: Duration = Duration::from_secs(3);

/// A sealed UDP link from the first peer on `addr` that finishes the key exchange and is in
/// `known_peers` (untrusted ones are told why and logged, and the wait goes on), then the
/// HELLO/READY handshake.
async fn accept_udp_secure(
    addr: &str,
    tls: &Tls,
    ctx: &HandshakeCtx,
    logs: &mut ServeLogs,
) -> Result<Established, EstablishError> {
    let home = ctx.home.as_path();
    let ours = tls.identity.fingerprint();
    let admit = |fp: &str, from: std::net::SocketAddr| {
        let known = KnownPeers::load(home)?;
        if known.lookup(fp).is_some() {
            return Ok(crate::Admission::Admit);
        }
        logs.refused(ctx.side, &untrusted_here(&from.to_string(), fp, home));
        Ok(crate::Admission::Refuse(untrusted_for_peer(fp, &ours)))
    };
    let (u, fingerprint) = crate::udp_accept_secure(addr, &tls.udp, ctx.handshake_timeout, admit)
        .await
        .map_err(|e| EstablishError::Local(format!("UDP on {addr}: {e}")))?;
    let s = u.sender();
    let peer = s
        .peer_addr()
        .ok_or_else(|| EstablishError::Local("UDP link without a peer address".into()))?;
    let info = PeerInfo {
        addr: peer,
        fingerprint: Some(fingerprint),
    };
    handshake(Rx::Udp(Box::new(u)), Tx::Udp(s), info, ctx).await
}

/// Told to a refused peer, about itself: its own fingerprint and how we would come to trust it.
pub(crate) fn untrusted_for_peer(fp: &str, ours: &str) -> String {
    format!(
        "this install ({fp}) is not trusted by the peer ({ours}); on the peer's machine run: ndd trust {fp}"
    )
}

/// Logged here about a refused peer.
pub(crate) fn untrusted_here(addr: &str, fp: &str, home: &std::path::Path) -> String {
    format!(
        "refused untrusted peer {addr} with fingerprint {fp}; if you trust it, run: ndd trust {fp} --home {}",
        home.display()
    )
}

/// Tells the peer why we refuse it (best effort) and closes our direction.
async fn refuse(writer: &mut Tx, code: CloseCode, reason: &str) {
    let close = OwnedMessage::Close {
        code,
        reason: reason.to_string(),
    };
    let _ = writer.write_message(&close.as_message()).await;
    let _ = writer.flush().await;
    let _ = writer.shutdown().await;
}

impl Established {
    /// What a listener serving several peers knows this peer by: its fingerprint, or its
    /// address's IP without TLS (a reconnect comes from another port).
    pub fn peer_key(&self) -> String {
        self.fingerprint
            .clone()
            .unwrap_or_else(|| self.addr.ip().to_string())
    }
}

/// Runs the handshake on a fresh connection: trust, HELLO, READY.
pub async fn handshake(
    rx: Rx,
    tx: Tx,
    info: PeerInfo,
    ctx: &HandshakeCtx,
) -> Result<Established, EstablishError> {
    use EstablishError::{Local, Refused, Transient};
    let home = ctx.home.as_path();
    let timeout = ctx.handshake_timeout;
    let tls = ctx.tls.as_deref();
    let (mut reader, mut writer) = (rx, tx);
    reader.set_max_body(ctx.max_body);
    // Trust: pinned fingerprints, reloaded on every connection (a peer trusted meanwhile is
    // admitted on reconnect).
    let peer_name = match (tls, &info.fingerprint) {
        (Some(tls), Some(fp)) => {
            let known = KnownPeers::load(home).map_err(|e| {
                Local(format!(
                    "cannot read known_peers in {}: {e}",
                    home.display()
                ))
            })?;
            match known.lookup(fp) {
                Some(t) => t.name.clone().unwrap_or_else(|| fp.clone()),
                None => {
                    let reason = untrusted_for_peer(fp, &tls.identity.fingerprint());
                    refuse(&mut writer, CloseCode::UntrustedPeer, &reason).await;
                    return Err(Refused(untrusted_here(&info.addr.to_string(), fp, home)));
                }
            }
        }
        _ => info.addr.to_string(),
    };
    if let Some(serving) = &ctx.busy_with {
        let reason = format!(
            "busy: the {} side already serves {serving} and takes one peer at a time",
            ctx.side
        );
        refuse(&mut writer, CloseCode::Busy, &reason).await;
        return Err(EstablishError::Busy(format!(
            "{peer_name} at {}: busy serving {serving}",
            info.addr
        )));
    }
    // The key a listener serving several peers knows a peer by (as `Established::peer_key`).
    let gate_key = info
        .fingerprint
        .clone()
        .unwrap_or_else(|| info.addr.ip().to_string());
    if let Some(why) = ctx.gate.as_ref().and_then(|g| (g.0)(&gate_key)) {
        let reason = format!("busy: the {} side {why}", ctx.side);
        refuse(&mut writer, CloseCode::Busy, &reason).await;
        return Err(EstablishError::Busy(format!(
            "{peer_name} at {}: {why}",
            info.addr
        )));
    }
    // A UDP listener learns its peer from the first datagram: it can only answer after that.
    let udp_listener = matches!(&writer, Tx::Udp(s) if s.peer_addr().is_none());
    let early = if udp_listener {
        Some(reader.read().await)
    } else {
        None
    };
    // A UDP listener's `info` is its own address; the peer is whoever sent that datagram.
    let peer_name = match &writer {
        Tx::Udp(s) if udp_listener => s.peer_addr().map_or(peer_name, |a| a.to_string()),
        _ => peer_name,
    };
    let hello = OwnedMessage::Hello(ctx.hello.clone());
    let sent = async {
        writer.write_message(&hello.as_message()).await?;
        writer.flush().await
    };
    sent.await
        .map_err(|e| Transient(format!("{}: sending HELLO: {e}", info.addr)))?;
    let first = match early {
        Some(r) => r,
        None => tokio::time::timeout(timeout, reader.read())
            .await
            .map_err(|_| {
                Transient(format!(
                    "{}: no HELLO within {} ms",
                    info.addr,
                    timeout.as_millis()
                ))
            })?,
    };
    let garbage_text;
    let opening = match &first {
        Ok(Some(Incoming::Other(m))) => PeerOpening::Message(m),
        Ok(Some(Incoming::Data { .. })) => PeerOpening::Message(&OwnedMessage::Ready),
        Ok(None) => PeerOpening::Closed,
        Err(LinkError::Wire(WireError::UnknownVersion { got, expected })) => PeerOpening::Version {
            got: *got,
            expected: *expected,
        },
        Err(e) => {
            garbage_text = format!("bad handshake: {e}");
            PeerOpening::Garbage(garbage_text)
        }
    };
    match decide_handshake(&ctx.hello, opening) {
        HandshakeDecision::Agree(theirs) => writer.set_peer_max_body(theirs.max_body),
        HandshakeDecision::Refuse { code, reason } => {
            refuse(&mut writer, code, &reason).await;
            return Err(Refused(reason));
        }
        // A busy listener may be free soon: retry as if nobody were there yet.
        HandshakeDecision::RefusedByPeer {
            code: CloseCode::Busy,
            reason,
        } => return Err(Transient(reason)),
        HandshakeDecision::RefusedByPeer { code, reason } => {
            return Err(Refused(format!(
                "the peer refused the session ({code}): {reason}"
            )))
        }
        HandshakeDecision::NotAPeer(why) => return Err(Transient(format!("{}: {why}", info.addr))),
    }
    let ready = async {
        writer
            .write_message(&OwnedMessage::Ready.as_message())
            .await?;
        writer.flush().await
    };
    ready
        .await
        .map_err(|e| Transient(format!("handshake: sending READY: {e}")))?;
    match tokio::time::timeout(timeout, reader.read()).await {
        Ok(Ok(Some(Incoming::Other(OwnedMessage::Ready)))) => Ok(Established {
            rx: reader,
            tx: writer,
            peer: peer_name,
            fingerprint: info.fingerprint.filter(|_| tls.is_some()),
            addr: info.addr,
        }),
        // The peer's words go to the log and the terminal: escaped and bounded.
        Ok(Ok(Some(Incoming::Other(OwnedMessage::Close { code, reason })))) => {
            Err(Refused(format!(
                "the peer refused the session ({code}): {}",
                printable(&reason, MAX_REASON)
            )))
        }
        Ok(Ok(Some(_))) => Err(Refused(
            "the peer sent something else than READY after HELLO".into(),
        )),
        Ok(Ok(None)) => Err(Transient(
            "the peer closed the connection during the handshake".into(),
        )),
        Ok(Err(e)) => Err(Transient(format!("handshake: {e}"))),
        Err(_) => Err(Transient(format!(
            "the peer did not confirm the handshake within {} ms",
            timeout.as_millis()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Conn;
    use ndd_core::testlog::Captured;

    #[test]
    fn a_peer_refused_again_and_again_is_said_once_per_30_s() {
        assert_eq!(
            without_ports("refused untrusted peer 10.9.0.1:52660 with fingerprint SHA256:x; run"),
            "refused untrusted peer 10.9.0.1 with fingerprint SHA256:x; run"
        );
        assert_eq!(without_ports("from [::1]:7000:"), "from ::1:");
        let mut logs = ServeLogs::default();
        let t0 = Instant::now();
        let e =
            |port: u16| format!("refused untrusted peer 10.9.0.1:{port} with fingerprint SHA256:x");
        assert_eq!(logs.fresh(&e(1000), t0), Some((0, 0)));
        for i in 1..10u16 {
            let at = t0 + Duration::from_millis(u64::from(i) * 500);
            assert_eq!(logs.fresh(&e(1000 + i), at), None, "retry {i} unsaid");
        }
        // Another peer is said at once.
        let other = "refused untrusted peer 10.9.0.7:5 with fingerprint SHA256:y";
        assert_eq!(logs.fresh(other, t0 + Duration::from_secs(1)), Some((0, 0)));
        // 30 s on: said again, with the count.
        assert_eq!(logs.fresh(&e(2000), t0 + REPEAT_SAID), Some((0, 9)));
        // One the flood limit holds back is not taken as said: it is said once allowed.
        let mut flood = ServeLogs::default();
        for i in 0..5 {
            assert!(flood.fresh(&format!("stranger {i}"), t0).is_some());
        }
        assert_eq!(flood.fresh("late one", t0), None, "over the flood limit");
        assert!(flood
            .fresh("late one", t0 + Duration::from_secs(2))
            .is_some());
        assert_eq!(since(9), " (refused 9 more time(s) since it was last said)");
        // The memory is bounded.
        for i in 0..(SAID_KEPT as u64 + 10) {
            logs.fresh(
                &format!("stranger {i}"),
                t0 + REPEAT_SAID + Duration::from_millis(i),
            );
        }
        assert!(logs.said.len() <= SAID_KEPT);
    }
    use ndd_wire::{HelloRepr, Side};

    fn hello(side: Side, driver: &str) -> HelloRepr {
        HelloRepr {
            side,
            max_body: 1 << 20,
            driver: driver.into(),
            streams: vec![],
        }
    }

    fn ctx(side: Side) -> HandshakeCtx {
        HandshakeCtx {
            hello: hello(side, "d"),
            max_body: 1 << 20,
            tls: None,
            home: std::env::temp_dir(),
            timeout: Duration::from_secs(5),
            keep_trying: false,
            handshake_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(1),
            side: "app",
            busy_with: None,
            gate: None,
        }
    }

    /// A peer that agrees on HELLO and then refuses with CLOSE: its reason, escape codes and
    /// a forged log line in it, comes out escaped.
    #[tokio::test]
    async fn a_close_after_hello_has_its_reason_escaped() {
        let l = crate::listen("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let peer = async {
            let (tcp, _) = l.accept_tcp().await.unwrap();
            let (mut r, mut w) = Conn::Plain(tcp).split();
            let _ = r.read().await.unwrap();
            let theirs = OwnedMessage::Hello(hello(Side::Device, "d"));
            w.write_message(&theirs.as_message()).await.unwrap();
            let close = OwnedMessage::Close {
                code: CloseCode::StackMismatch,
                reason: "no\x1b[2J\nndd: error: forged\u{202e}".into(),
            };
            w.write_message(&close.as_message()).await.unwrap();
            w.flush().await.unwrap();
            // Open until this side has read it all.
            (r, w)
        };
        let c = Connector::new(TransportKind::Tcp, false, &addr, None)
            .await
            .unwrap();
        let ctx = ctx(Side::App);
        let (r, _peer) = tokio::join!(c.establish(&ctx, true), peer);
        let e = r.expect_err("refused").to_string();
        assert!(
            e.contains("no\\u{1b}[2J\\nndd: error: forged\\u{202e}"),
            "{e}"
        );
        assert!(!e.contains(['\x1b', '\n', '\u{202e}']), "{e}");
    }

    /// Strangers at a plain UDP listener, each with a HELLO this side refuses, as fast as
    /// they can for over a second: at most five lines a second, and a later one says how
    /// many were not shown.
    #[tokio::test]
    async fn a_flood_of_refused_udp_peers_is_five_lines_a_second() {
        let (log, _guard) = Captured::start();
        let addr = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let c = Connector::new(TransportKind::Udp, true, &addr, None)
            .await
            .unwrap();
        let ctx = ctx(Side::App);
        let started = Instant::now();
        let strangers = async {
            let other = OwnedMessage::Hello(hello(Side::Device, "someone-else"));
            let mut tries = 0u32;
            // (The same refusal again and again is said once per 30 s since 2026-11-29.)
            while started.elapsed() < Duration::from_millis(1500) {
                let mut s = crate::udp_connect(&addr).await.unwrap();
                let _ = s.send_message(&other.as_message()).await;
                // Its CLOSE, or nothing while the listener binds again.
                let _ = tokio::time::timeout(Duration::from_millis(20), s.recv()).await;
                tries += 1;
            }
            tries
        };
        let tries = tokio::select! {
            r = c.establish(&ctx, true) => panic!("the listener stopped: {:?}", r.err()),
            n = strangers => n,
        };
        let secs = started.elapsed().as_secs_f64().ceil() as usize;
        let lines = log.matching("refused a peer");
        assert!(
            !lines.is_empty() && lines.len() <= 5 * (secs + 1) && (tries as usize) > lines.len(),
            "{tries} strangers, {} lines in {secs} s: {lines:#?}",
            lines.len()
        );
        assert!(lines.iter().all(|l| l.contains("driver")), "{lines:#?}");
    }
}
