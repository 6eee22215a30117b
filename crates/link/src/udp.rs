//! The UDP link, for LAN input devices: one ndd message per datagram, fragmented when larger.
//!
//! **Sealed unless `--insecure`:** [`udp_connect_secure`] and [`udp_accept_secure`] run the
//! key exchange of [`crate::seal`] (both identities, pinned as on TLS) and then every datagram
//! is ChaCha20-Poly1305 sealed with a per-direction counter: forged, damaged and replayed
//! datagrams are dropped and counted (`unauthenticated`, `replayed` in [`UdpLink::stats`]),
//! never delivered, and a stranger's key exchange never touches a live link. A sealed link
//! follows its peer to a new address only on a datagram that authenticates.
//!
//! **Plain with `--insecure`** ([`udp_connect`], [`udp_bind`]): no encryption, no
//! authentication: anyone on the path can read, forge, drop or replay datagrams, and only the
//! `encrypt` pair protects a stream (the session warns).
//!
//! **Reliable messages are retransmitted** ([`crate::arq`]): every message but PING, PONG and
//! a lossy stream's DATA is numbered, acknowledged, sent again when lost and handed on in
//! order exactly once; a sender with a full window waits (the receiving half, [`UdpLink::recv`],
//! must be polled: it takes the acknowledgements in and runs the timers). A lossy stream's
//! DATA is sent once and delivered as it comes.
//!
//! Each datagram is a [`crate::frag`] fragment: a 20-byte header (magic, version, session id,
//! message id, fragment index and count) and a slice of one message in its envelope
//! ([`crate::arq`]: kind, and a sequence number when numbered) in the wire format. The
//! receiver reassembles with a timeout and a memory cap, and delivers each message at most
//! once; garbage, duplicates and stale fragments are dropped and counted
//! ([`UdpLink::stats`]), never reported as errors (anyone can send us a datagram, so a bad
//! one must not end the link).
//!
//! [`udp_connect`] gives a link with a fixed peer (the socket is connected; the kernel drops
//! datagrams from anyone else). [`udp_bind`] gives a link that learns its peer from the
//! first valid fragment; afterwards datagrams from another address are dropped (`foreign`)
//! unless they carry a new session id, which means the peer restarted: the link then follows
//! the new address and resets reassembly.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ndd_core::Frame;
use ndd_wire::{Message, HEADER_LEN};
use tokio::net::UdpSocket;

use crate::arq::{self, ArqConfig, ArqRx, ArqTx, Envelope};
use crate::conn::{data_frame, decode_message, Incoming, DEFAULT_MAX_BODY};
use crate::frag::{
    fragment, max_fragmented_len, DatagramStats, FragHeader, Reassembler, ReassemblyConfig,
    FRAG_HEADER_LEN,
};
use crate::seal::{Initiator, Keys, LocalIdentity, Responder, SealError, SealRx, SealTx, Sealed};
use crate::{LinkError, Result};

/// Default datagram size (header included): fits a 1500-byte Ethernet MTU over IPv6
/// (1500 − 40 − 8) and IPv4.
pub const DEFAULT_MAX_DATAGRAM: usize = 1452;
/// Largest UDP payload over IPv4.
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// Socket buffer size requested (the kernel may cap it, see `net.core.rmem_max`).
const SOCKET_BUFFER: usize = 4 * 1024 * 1024;
/// Key-exchange messages are sent again after this long without an answer.
const KX_RESEND: Duration = Duration::from_millis(200);
/// Least time a live peer gets to answer the probe a key exchange on a live link starts
/// (four round trips when longer).
const PROBE_MIN_WAIT: Duration = Duration::from_secs(1);
/// Key exchanges a listener answers per second, at most (each costs a signature).
const KX_PER_SECOND: u32 = 200;
/// Unfinished key exchanges a listener keeps, in total and per source address.
const KX_PENDING: usize = 64;
const KX_PENDING_PER_ADDR: usize = 8;

/// A listener's answer about a peer whose key exchange verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// A trusted peer: the link is theirs.
    Admit,
    /// Not trusted: this reason is sent to them (sealed) and the listener waits on.
    Refuse(String),
}

/// A sealed UDP link to `addr`: connects, runs the key exchange as its initiator (sending
/// again every 200 ms) and returns the link and the peer's fingerprint, to be checked against
/// `known_peers` by the caller. Fails with [`LinkError::UdpKeyExchangeTimeout`] when nothing
/// answers within `timeout`, or [`LinkError::Connect`] when the peer's host refuses.
pub async fn udp_connect_secure(
    addr: &str,
    me: &LocalIdentity,
    timeout: Duration,
) -> Result<(UdpLink, String)> {
    let mut link = udp_connect(addr).await?;
    let fingerprint = link.initiate(addr, me, timeout).await?;
    Ok((link, fingerprint))
}

/// Binds `addr` and serves key exchanges until one peer that `admit` accepts finishes one;
/// returns the sealed link to it and its fingerprint. Strangers, garbage, replays and
/// unfinished exchanges (dropped after `handshake_timeout`, at most 64 kept, 8 per address,
/// 200 answered a second) are counted and never end the wait; a refused peer is told why.
/// Errors come only from the socket or from `admit`.
pub async fn udp_accept_secure<F>(
    addr: &str,
    me: &LocalIdentity,
    handshake_timeout: Duration,
    admit: F,
) -> Result<(UdpLink, String)>
where
    F: FnMut(&str, SocketAddr) -> Result<Admission>,
{
    accept_secure(addr, me, handshake_timeout, admit, Instant::now).await
}

/// [`udp_accept_secure`] reading the time from `clock` once per datagram (a test's simulated
/// clock).
async fn accept_secure<F, C>(
    addr: &str,
    me: &LocalIdentity,
    handshake_timeout: Duration,
    mut admit: F,
    mut clock: C,
) -> Result<(UdpLink, String)>
where
    F: FnMut(&str, SocketAddr) -> Result<Admission>,
    C: FnMut() -> Instant,
{
    struct Pending {
        from: SocketAddr,
        responder: Responder,
        started: Instant,
    }
    let mut link = udp_bind(addr).await?;
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut budget = ndd_core::RateLimit::with_burst(Duration::from_secs(1), KX_PER_SECOND);
    let mut plain_log = ndd_core::RateLimit::new(Duration::from_secs(5));
    loop {
        let (d, from) = link.recv_datagram().await?;
        let now = clock();
        pending.retain(|p| now.saturating_duration_since(p.started) < handshake_timeout);
        match Sealed::parse(&d) {
            Ok(Sealed::Init { .. }) => {
                if let Some(p) = pending
                    .iter()
                    .find(|p| p.from == from && p.responder.answers(&d))
                {
                    link.send_raw(p.responder.reply(), from).await?;
                    continue;
                }
                if budget.admit(now).is_none() {
                    link.count_unauthenticated();
                    continue;
                }
                let responder = match Responder::new(me, &d) {
                    Ok(r) => r,
                    Err(e @ (SealError::Sign(_) | SealError::Random)) => return Err(e.into()),
                    Err(error) => {
                        tracing::debug!(%from, %error, "dropping a key-exchange datagram");
                        link.count_unauthenticated();
                        continue;
                    }
                };
                let same_addr = pending.iter().filter(|p| p.from.ip() == from.ip()).count();
                let evict = if same_addr >= KX_PENDING_PER_ADDR {
                    pending.iter().position(|p| p.from.ip() == from.ip())
                } else if pending.len() >= KX_PENDING {
                    Some(0)
                } else {
                    None
                };
                if let Some(k) = evict {
                    pending.remove(k);
                }
                link.send_raw(responder.reply(), from).await?;
                pending.push_back(Pending {
                    from,
                    responder,
                    started: now,
                });
            }
            Ok(Sealed::Finish { responder, .. }) => {
                let Some(k) = pending
                    .iter()
                    .position(|p| p.from == from && p.responder.index() == responder)
                else {
                    link.count_unauthenticated();
                    continue;
                };
                let keys = match pending[k].responder.handle_finish(&d) {
                    Ok(keys) => keys,
                    Err(error) => {
                        tracing::debug!(%from, %error, "dropping a key-exchange datagram");
                        link.count_unauthenticated();
                        continue;
                    }
                };
                pending.remove(k);
                let fingerprint = keys.peer_fingerprint.clone();
                match admit(&fingerprint, from)? {
                    Admission::Admit => {
                        link.install(keys, from, Some(d.to_vec()))?;
                        link.send_confirmation().await?;
                        return Ok((link, fingerprint));
                    }
                    Admission::Refuse(reason) => {
                        let close = ndd_wire::OwnedMessage::Close {
                            code: ndd_wire::CloseCode::UntrustedPeer,
                            reason,
                        };
                        let bytes = arq::plain(&close.as_message().emit_to_vec()?);
                        let max = link.tx.inner.max_datagram.load(Ordering::Relaxed);
                        for datagram in seal_message(&keys.tx, link.session_id(), 1, &bytes, max)? {
                            link.send_raw(&datagram, from).await?;
                        }
                    }
                }
            }
            Err(SealError::Magic) if FragHeader::parse(&d).is_ok() => {
                link.count_unauthenticated();
                if let Some(suppressed) = plain_log.admit(now) {
                    tracing::warn!(
                        %from,
                        suppressed,
                        "ignored a plain UDP datagram: the peer runs with --insecure and this \
                         side does not; both must agree"
                    );
                }
            }
            _ => link.count_unauthenticated(),
        }
    }
}

/// `message` as sealed datagrams of at most `max_datagram` bytes.
fn seal_message(
    seal: &SealTx,
    session: u32,
    id: u64,
    message: &[u8],
    max_datagram: usize,
) -> Result<Vec<Bytes>> {
    let room = max_datagram.saturating_sub(crate::seal::SEAL_OVERHEAD);
    let fragments = fragment(session, id, message, room).ok_or(LinkError::DatagramTooLarge {
        len: message.len(),
        max: max_fragmented_len(room),
    })?;
    fragments
        .iter()
        .map(|f| seal.seal(f).map(Bytes::from).map_err(LinkError::from))
        .collect()
}

/// Bind a UDP link on `addr` (`host:port`, port 0 picks one). Its peer is learned from the
/// first valid datagram; [`UdpLink::send_message`] fails with [`LinkError::NoPeer`] before.
pub async fn udp_bind(addr: &str) -> Result<UdpLink> {
    let socket = UdpSocket::bind(addr)
        .await
        .map_err(|source| LinkError::Bind {
            addr: addr.to_owned(),
            source,
        })?;
    Ok(UdpLink::new(socket, None))
}

/// A UDP link to `addr`, from an ephemeral local port.
pub async fn udp_connect(addr: &str) -> Result<UdpLink> {
    let connect_err = |source| LinkError::Connect {
        addr: addr.to_owned(),
        source,
    };
    let peer = tokio::net::lookup_host(addr)
        .await
        .map_err(connect_err)?
        .next()
        .ok_or_else(|| {
            connect_err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the name resolves to no address",
            ))
        })?;
    let local = if peer.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(local).await.map_err(connect_err)?;
    socket.connect(peer).await.map_err(connect_err)?;
    Ok(UdpLink::new(socket, Some(peer)))
}

/// The sending side of a [`UdpLink`]; cheap to clone, usable from another task.
#[derive(Debug, Clone)]
pub struct UdpSender {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    socket: UdpSocket,
    connected: bool,
    peer: Mutex<Option<SocketAddr>>,
    session: u32,
    next_message: AtomicU64,
    max_datagram: AtomicUsize,
    peer_max_body: AtomicU32,
    messages_sent: AtomicU64,
    datagrams_sent: AtomicU64,
    /// Set once the key exchange finished: every datagram is then sealed.
    seal: OnceLock<SealTx>,
    /// Numbered messages until the peer acknowledges them.
    arq: Mutex<ArqTx>,
    /// Woken when acknowledgements make room in the window.
    room: tokio::sync::Notify,
    /// Woken when a message goes with no retransmission timer running (the receiving half
    /// runs the timers).
    armed: tokio::sync::Notify,
    /// Whether the fragments of one message may leave in one `sendmsg` that the kernel cuts
    /// into datagrams (UDP GSO); cleared for good when the kernel or the device refuses it.
    gso: AtomicBool,
}

/// A UDP link: send and receive whole messages over datagrams. See the module docs.
#[derive(Debug)]
pub struct UdpLink {
    tx: UdpSender,
    reassembler: Reassembler,
    buf: BytesMut,
    max_body: u32,
    /// Set once the key exchange finished: only datagrams that open are taken.
    open: Option<Box<SealRx>>,
    /// The listener's copy of the FINISH it answered: the same FINISH again means our
    /// confirmation was lost.
    finish: Option<Vec<u8>>,
    /// Messages that completed during the key exchange (the peer's first datagram may carry
    /// data when our confirmation was lost).
    early: VecDeque<Incoming>,
    /// Numbered messages from the peer, handed on in order.
    arq: ArqRx,
    /// Envelopes to send again (from acknowledgements), sent on the next turn of `recv`.
    resend: Vec<Bytes>,
    /// Messages of one reassembled envelope ready to hand on (kept for its capacity).
    ready: Vec<Bytes>,
    /// Datagrams taken off the socket (the reassembler sees only those that carry fragments).
    received: u64,
    /// A key exchange began while this sealed link is up: until then an authenticated
    /// datagram must come, or the peer restarted ([`LinkError::PeerRekeyed`]).
    probe: Option<(Instant, Duration)>,
    probes: ndd_core::RateLimit,
    unauthenticated: u64,
    replayed: u64,
    /// At most one line every few seconds about dropped datagrams on a live sealed link.
    drop_log: ndd_core::RateLimit,
    /// The drop counters as the driver reads them, at any time ([`UdpLink::drops`]).
    shared: Arc<LinkDrops>,
}

/// A UDP link's dropped datagrams, readable from another task while the link is in use.
#[derive(Debug, Default)]
pub struct LinkDrops {
    unauthenticated: AtomicU64,
    replayed: AtomicU64,
    garbage: AtomicU64,
}

/// Datagrams a UDP link dropped, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DropCounts {
    /// Did not authenticate: forged, damaged, another peer's, a restarting peer's exchange.
    pub unauthenticated: u64,
    /// Authenticated copies of datagrams already taken (replays).
    pub replayed: u64,
    /// Not a datagram of ours, or one this side cannot use (a sealed one on `--insecure`).
    pub garbage: u64,
}

impl LinkDrops {
    /// The counts as they stand.
    pub fn counts(&self) -> DropCounts {
        DropCounts {
            unauthenticated: self.unauthenticated.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            garbage: self.garbage.load(Ordering::Relaxed),
        }
    }
}

impl DropCounts {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.unauthenticated + self.replayed + self.garbage
    }

    /// These and `other` added.
    pub fn plus(self, other: DropCounts) -> DropCounts {
        DropCounts {
            unauthenticated: self.unauthenticated + other.unauthenticated,
            replayed: self.replayed + other.replayed,
            garbage: self.garbage + other.garbage,
        }
    }
}

impl UdpLink {
    fn new(socket: UdpSocket, peer: Option<SocketAddr>) -> UdpLink {
        let sock = socket2::SockRef::from(&socket);
        for (what, result) in [
            ("receive", sock.set_recv_buffer_size(SOCKET_BUFFER)),
            ("send", sock.set_send_buffer_size(SOCKET_BUFFER)),
        ] {
            if let Err(error) = result {
                tracing::debug!(%error, what, "cannot enlarge the UDP socket buffer");
            }
        }
        let mut session = [0u8; 4];
        // A fixed session id only weakens restart detection; it is not a secret.
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut session);
        UdpLink {
            tx: UdpSender {
                inner: Arc::new(Shared {
                    socket,
                    connected: peer.is_some(),
                    peer: Mutex::new(peer),
                    session: u32::from_be_bytes(session),
                    next_message: AtomicU64::new(1),
                    max_datagram: AtomicUsize::new(DEFAULT_MAX_DATAGRAM),
                    peer_max_body: AtomicU32::new(u32::MAX),
                    messages_sent: AtomicU64::new(0),
                    datagrams_sent: AtomicU64::new(0),
                    seal: OnceLock::new(),
                    arq: Mutex::new(ArqTx::new(ArqConfig::default())),
                    room: tokio::sync::Notify::new(),
                    armed: tokio::sync::Notify::new(),
                    gso: AtomicBool::new(gso::AVAILABLE),
                }),
            },
            reassembler: Reassembler::new(ReassemblyConfig::default()),
            buf: BytesMut::new(),
            max_body: DEFAULT_MAX_BODY,
            open: None,
            finish: None,
            early: VecDeque::new(),
            arq: ArqRx::new(ArqConfig::default()),
            resend: Vec::new(),
            ready: Vec::new(),
            received: 0,
            probe: None,
            probes: ndd_core::RateLimit::new(Duration::from_secs(1)),
            unauthenticated: 0,
            replayed: 0,
            drop_log: ndd_core::RateLimit::new(Duration::from_secs(5)),
            shared: Arc::default(),
        }
    }

    /// The link's drop counters, to read from another task (they stay readable after the
    /// link is gone: the final counts).
    pub fn drops(&self) -> Arc<LinkDrops> {
        // What the key exchange dropped is in from the start.
        self.publish_drops();
        self.shared.clone()
    }

    /// Copies the drop counters where [`UdpLink::drops`] readers see them.
    fn publish_drops(&self) {
        let s = &self.shared;
        s.unauthenticated
            .store(self.unauthenticated, Ordering::Relaxed);
        s.replayed.store(self.replayed, Ordering::Relaxed);
        s.garbage
            .store(self.reassembler.stats().garbage, Ordering::Relaxed);
    }

    /// A live sealed link dropped a datagram at `now`: say so, at most every 5 s.
    fn note_dropped(&mut self, from: SocketAddr, now: Instant) {
        if let Some(suppressed) = self.drop_log.admit(now) {
            tracing::warn!(
                %from,
                unauthenticated = self.unauthenticated,
                replayed = self.replayed,
                suppressed,
                "UDP link: dropped datagrams that did not authenticate (forged, damaged, another \
                 peer's, or a restarting peer's key exchange) or were replays; the session is \
                 not affected"
            );
        }
    }

    /// Whether every datagram is sealed (the key exchange ran).
    pub fn is_sealed(&self) -> bool {
        self.open.is_some()
    }

    /// The key exchange as initiator, on a connected socket. See [`udp_connect_secure`].
    async fn initiate(
        &mut self,
        addr: &str,
        me: &LocalIdentity,
        timeout: Duration,
    ) -> Result<String> {
        let peer = self.peer_addr().ok_or(LinkError::NoPeer)?;
        let socket_err = |source| LinkError::Connect {
            addr: addr.to_owned(),
            source,
        };
        let mut kx = Initiator::new()?;
        let mut keys: Option<Keys> = None;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let out = kx.finish().unwrap_or(kx.init()).to_vec();
            self.tx.inner.socket.send(&out).await.map_err(socket_err)?;
            let resend = (tokio::time::Instant::now() + KX_RESEND).min(deadline);
            loop {
                self.buf.clear();
                self.buf.reserve(MAX_UDP_PAYLOAD + 1);
                let got =
                    tokio::time::timeout_at(resend, self.tx.inner.socket.recv_buf(&mut self.buf))
                        .await;
                let Ok(got) = got else { break };
                let n = got.map_err(socket_err)?;
                let mut d = self.buf.split_to(n);
                self.received += 1;
                match (&mut keys, Sealed::parse(&d)) {
                    (None, Ok(Sealed::Reply { .. })) => match kx.handle_reply(me, &d) {
                        Ok(k) => {
                            keys = Some(k);
                            let finish = kx.finish().unwrap_or_default().to_vec();
                            self.tx
                                .inner
                                .socket
                                .send(&finish)
                                .await
                                .map_err(socket_err)?;
                        }
                        Err(e @ (SealError::Sign(_) | SealError::Random)) => return Err(e.into()),
                        Err(error) => {
                            tracing::debug!(%error, "dropping a key-exchange datagram");
                            self.unauthenticated += 1;
                        }
                    },
                    (Some(k), Ok(Sealed::Data { .. })) => match k.rx.open(&mut d) {
                        Ok(range) => {
                            let Some(k) = keys.take() else { continue };
                            let fingerprint = k.peer_fingerprint.clone();
                            self.install(k, peer, None)?;
                            if !range.is_empty() {
                                let payload = d.freeze().slice(range);
                                self.reassemble(payload, peer);
                            }
                            return Ok(fingerprint);
                        }
                        Err(_) => self.unauthenticated += 1,
                    },
                    _ => self.unauthenticated += 1,
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(LinkError::UdpKeyExchangeTimeout {
                    addr: peer,
                    timeout,
                });
            }
        }
    }

    /// Makes the link sealed with `keys`, to `peer`.
    fn install(&mut self, keys: Keys, peer: SocketAddr, finish: Option<Vec<u8>>) -> Result<()> {
        *self
            .tx
            .inner
            .peer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(peer);
        self.tx
            .inner
            .seal
            .set(keys.tx)
            .map_err(|_| LinkError::Seal(SealError::Unrelated("second key exchange")))?;
        self.open = Some(Box::new(keys.rx));
        self.finish = finish;
        Ok(())
    }

    /// An empty sealed datagram: tells the initiator our keys match.
    async fn send_confirmation(&self) -> Result<()> {
        let Some(seal) = self.tx.inner.seal.get() else {
            return Ok(());
        };
        let peer = self.peer_addr().ok_or(LinkError::NoPeer)?;
        let d = seal.seal(&[])?;
        self.send_raw(&d, peer).await
    }

    /// One datagram, as is, to `to` (or to the connected peer).
    async fn send_raw(&self, d: &[u8], to: SocketAddr) -> Result<()> {
        if self.tx.inner.connected {
            self.tx.inner.socket.send(d).await?;
        } else {
            self.tx.inner.socket.send_to(d, to).await?;
        }
        Ok(())
    }

    /// The next datagram from anyone.
    async fn recv_datagram(&mut self) -> Result<(BytesMut, SocketAddr)> {
        self.buf.clear();
        self.buf.reserve(MAX_UDP_PAYLOAD + 1);
        let (n, from) = self.tx.inner.socket.recv_buf_from(&mut self.buf).await?;
        self.received += 1;
        Ok((self.buf.split_to(n), from))
    }

    fn count_unauthenticated(&mut self) {
        self.unauthenticated += 1;
    }

    /// A plain fragment (from an opened datagram) into reassembly; a completed message is
    /// taken in ([`UdpLink::take`]).
    fn reassemble(&mut self, fragment: Bytes, from: SocketAddr) {
        let now = Instant::now();
        let restarts = self.reassembler.stats().session_changes;
        let Some((_, message)) = self.reassembler.push(now, fragment) else {
            return;
        };
        if self.reassembler.stats().session_changes != restarts {
            // A plain link's peer restarted: its numbering starts again.
            self.arq.reset();
        }
        self.take(now, message, from);
    }

    /// One reassembled message: what it holds is queued for [`UdpLink::recv`] (in order, for
    /// numbered ones), or an acknowledgement is taken in.
    fn take(&mut self, now: Instant, message: Bytes, from: SocketAddr) {
        // Reused: no allocation per message.
        let mut ready = std::mem::take(&mut self.ready);
        match Envelope::parse(message) {
            Ok(Envelope::Plain(m)) => ready.push(m),
            Ok(Envelope::Sequenced { seq, message }) => {
                self.arq.handle(now, seq, message, &mut ready)
            }
            Ok(Envelope::Ack(ack)) => {
                let again = self.tx.arq().handle_ack(now, ack);
                self.resend.extend(again);
                self.tx.inner.room.notify_waiters();
            }
            Err(error) => {
                tracing::debug!(%error, %from, "dropping an invalid UDP message");
                self.reassembler.stats_mut().bad_messages += 1;
            }
        }
        for m in ready.drain(..) {
            match decode_message(m, self.max_body) {
                Ok(incoming) => self.early.push_back(incoming),
                Err(error) => {
                    tracing::debug!(%error, %from, "dropping an invalid message");
                    self.reassembler.stats_mut().bad_messages += 1;
                }
            }
        }
        self.ready = ready;
    }

    /// Sends what is due: our acknowledgement, and messages to send again (gaps the peer
    /// reported, the retransmission timer).
    async fn service(&mut self) -> Result<()> {
        let now = Instant::now();
        if let Some((_, waited)) = self.probe.filter(|p| now >= p.0) {
            self.probe = None;
            return Err(LinkError::PeerRekeyed { waited });
        }
        let timed_out = self.tx.arq().handle_timeout(now);
        if !timed_out.is_empty() {
            self.resend.extend(timed_out);
            self.tx.inner.room.notify_waiters();
        }
        if let Some(ack) = self.arq.poll_ack(now) {
            if self.tx.peer_addr().is_some() {
                self.tx.send_envelope(&ack.emit()).await?;
            }
        }
        for env in std::mem::take(&mut self.resend) {
            self.tx.send_envelope(&env).await?;
        }
        Ok(())
    }

    /// When [`UdpLink::service`] has something to do.
    fn next_deadline(&self) -> Option<Instant> {
        [
            self.tx.arq().poll_timeout(),
            self.arq.poll_timeout(),
            self.probe.map(|p| p.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// What a sealed link does with one received datagram: the plain fragment inside, or
    /// `None` (dropped and counted, or a repeated FINISH answered).
    async fn unseal(
        &mut self,
        mut d: BytesMut,
        from: SocketAddr,
        now: Instant,
    ) -> Result<Option<Bytes>> {
        let Some(rx) = self.open.as_mut() else {
            return Ok(None);
        };
        match Sealed::parse(&d) {
            Ok(Sealed::Data { .. }) => match rx.open(&mut d) {
                Ok(range) => {
                    self.probe = None;
                    if !self.tx.inner.connected && self.peer_addr() != Some(from) {
                        tracing::debug!(%from, "sealed UDP peer moved; following it");
                        *self
                            .tx
                            .inner
                            .peer
                            .lock()
                            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(from);
                    }
                    if range.is_empty() {
                        return Ok(None);
                    }
                    Ok(Some(d.freeze().slice(range)))
                }
                Err(SealError::Replay(_)) => {
                    self.replayed += 1;
                    self.note_dropped(from, now);
                    Ok(None)
                }
                Err(_) => {
                    self.unauthenticated += 1;
                    self.note_dropped(from, now);
                    Ok(None)
                }
            },
            Ok(Sealed::Finish { .. })
                if self.finish.as_deref() == Some(&d[..]) && self.peer_addr() == Some(from) =>
            {
                self.send_confirmation().await?;
                Ok(None)
            }
            Ok(Sealed::Init { .. }) => {
                // A restarted peer starts over; anyone can send this, so it only makes us
                // ask the peer on the live keys (at most once a second): a live peer answers
                // the PING, a restarted one cannot.
                self.unauthenticated += 1;
                self.note_dropped(from, now);
                if self.probe.is_none() && self.probes.admit(now).is_some() {
                    let srtt = self.tx.arq().srtt().unwrap_or_default();
                    let wait = (srtt * 4).max(PROBE_MIN_WAIT);
                    self.probe = Some((now + wait, wait));
                    let t1 = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64);
                    self.tx.send_message(&Message::Ping { t1 }).await?;
                }
                Ok(None)
            }
            _ => {
                self.unauthenticated += 1;
                self.note_dropped(from, now);
                Ok(None)
            }
        }
    }

    /// A handle that sends on this link from another task.
    pub fn sender(&self) -> UdpSender {
        self.tx.clone()
    }

    /// Our socket address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.tx.inner.socket.local_addr()?)
    }

    /// The peer's address, once known.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.tx.peer_addr()
    }

    /// This link's random session id (in every datagram it sends).
    pub fn session_id(&self) -> u32 {
        self.tx.inner.session
    }

    /// Largest body accepted (default 16 MiB); larger messages are dropped and counted.
    pub fn set_max_body(&mut self, max_body: u32) {
        self.max_body = max_body;
        self.reassembler
            .set_max_message((max_body as usize).saturating_add(HEADER_LEN));
    }

    /// Reassembly limits (timeout, memory cap). `max_message` is overridden by `max_body`.
    pub fn set_reassembly(&mut self, mut config: ReassemblyConfig) {
        config.max_message = (self.max_body as usize).saturating_add(HEADER_LEN);
        let stats = self.reassembler.stats();
        self.reassembler = Reassembler::new(config);
        *self.reassembler.stats_mut() = stats;
    }

    /// Counters: what was received, delivered, dropped and sent.
    pub fn stats(&self) -> DatagramStats {
        let mut s = self.reassembler.stats();
        s.datagrams = self.received;
        s.unauthenticated = self.unauthenticated;
        s.replayed = self.replayed;
        s.messages_sent = self.tx.inner.messages_sent.load(Ordering::Relaxed);
        let (tx, rx) = (self.tx.arq().stats(), self.arq.stats());
        s.retransmitted = tx.retransmitted;
        s.retransmit_timeouts = tx.timeouts;
        s.tail_probes = tx.probes;
        s.duplicates += rx.duplicates;
        s.out_of_order = rx.out_of_order;
        s.datagrams_sent = self.tx.inner.datagrams_sent.load(Ordering::Relaxed);
        s
    }

    /// Bytes currently held in incomplete messages.
    pub fn reassembly_held_bytes(&self) -> usize {
        self.reassembler.held_bytes()
    }

    /// See [`UdpSender::set_max_datagram`].
    pub fn set_max_datagram(&self, max_datagram: usize) {
        self.tx.set_max_datagram(max_datagram);
    }

    /// See [`UdpSender::set_peer_max_body`].
    pub fn set_peer_max_body(&self, max_body: u32) {
        self.tx.set_peer_max_body(max_body);
    }

    /// See [`UdpSender::send_message`].
    pub async fn send_message(&self, msg: &Message<'_>) -> Result<()> {
        self.tx.send_message(msg).await
    }

    /// See [`UdpSender::send_frame`].
    pub async fn send_frame(&self, frame: Frame, reliable: bool) -> Result<()> {
        self.tx.send_frame(frame, reliable).await
    }

    /// The next whole message. Never `Ok(None)`: UDP has no end; the session ends on CLOSE
    /// or on its keepalive timeout. Errors come only from the socket, never from what a peer
    /// sends (bad datagrams are counted in [`UdpLink::stats`]).
    ///
    /// Cancel safe.
    pub async fn recv(&mut self) -> Result<Option<Incoming>> {
        loop {
            if let Some(m) = self.early.pop_front() {
                return Ok(Some(m));
            }
            self.buf.clear();
            self.buf.reserve(MAX_UDP_PAYLOAD + 1);
            let socket = &self.tx.inner.socket;
            let armed = &self.tx.inner.armed;
            let got = match self.next_deadline() {
                Some(at) => tokio::select! {
                    r = socket.recv_buf_from(&mut self.buf) => Some(r),
                    () = tokio::time::sleep_until(at.into()) => None,
                },
                None => tokio::select! {
                    r = socket.recv_buf_from(&mut self.buf) => Some(r),
                    () = armed.notified() => None,
                },
            };
            if let Some(got) = got {
                let (n, from) = got?;
                self.received += 1;
                let r = self.datagram(n, from, Instant::now()).await;
                self.publish_drops();
                r?;
            }
            self.service().await?;
        }
    }

    /// The `n` bytes just received from `from` at `now`: opened (sealed link) or checked
    /// (plain), then into reassembly.
    async fn datagram(&mut self, n: usize, from: SocketAddr, now: Instant) -> Result<()> {
        let datagram = if self.open.is_some() {
            let d = self.buf.split_to(n);
            match self.unseal(d, from, now).await? {
                Some(fragment) => fragment,
                None => return Ok(()),
            }
        } else {
            let datagram = self.buf.split_to(n).freeze();
            if crate::seal::is_sealed(&datagram) {
                self.reassembler.stats_mut().garbage += 1;
                if let Some(suppressed) = self.drop_log.admit(now) {
                    tracing::warn!(
                        %from,
                        suppressed,
                        "ignored a sealed UDP datagram: this side runs with --insecure and \
                         the peer does not; both must agree"
                    );
                }
                return Ok(());
            }
            if !self.accept_source(from, &datagram) {
                return Ok(());
            }
            datagram
        };
        self.reassemble(datagram, from);
        Ok(())
    }

    /// Whether a datagram from `from` is from our peer (learning or following it on a bound
    /// link).
    fn accept_source(&mut self, from: SocketAddr, datagram: &Bytes) -> bool {
        if self.tx.inner.connected {
            return true;
        }
        let session = match FragHeader::parse(datagram) {
            Ok((h, _)) => h.session,
            // Garbage is counted by the reassembler.
            Err(_) => return true,
        };
        let mut peer = self
            .tx
            .inner
            .peer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match *peer {
            None => {
                tracing::debug!(%from, "UDP link learned its peer");
                *peer = Some(from);
                true
            }
            Some(p) if p == from => true,
            Some(_) if Some(session) != self.reassembler_session() => {
                tracing::debug!(%from, "UDP peer restarted with a new session; following it");
                *peer = Some(from);
                true
            }
            Some(_) => {
                drop(peer);
                self.reassembler.stats_mut().foreign += 1;
                false
            }
        }
    }

    fn reassembler_session(&self) -> Option<u32> {
        self.reassembler.session()
    }
}

impl UdpSender {
    /// The peer's address, once known.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        *self
            .inner
            .peer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Datagram size (fragment header included) for what this side sends; clamped to
    /// `[FRAG_HEADER_LEN + 1, 65507]`. Default [`DEFAULT_MAX_DATAGRAM`]; on loopback or with
    /// jumbo frames a larger one cuts the fragment count.
    pub fn set_max_datagram(&self, max_datagram: usize) {
        let v = max_datagram.clamp(FRAG_HEADER_LEN + 1, MAX_UDP_PAYLOAD);
        self.inner.max_datagram.store(v, Ordering::Relaxed);
    }

    /// The peer's `max_body` (from its HELLO): larger messages are refused locally.
    pub fn set_peer_max_body(&self, max_body: u32) {
        self.inner.peer_max_body.store(max_body, Ordering::Relaxed);
    }

    /// Send any message (copies it once into datagrams). PING and PONG go once; every other
    /// message is numbered and sent again until acknowledged (waits while the window is full).
    pub async fn send_message(&self, msg: &Message<'_>) -> Result<()> {
        self.check_peer_limit(msg.body_len())?;
        let bytes = msg.emit_to_vec()?;
        if matches!(msg, Message::Ping { .. } | Message::Pong { .. }) {
            return self.send_envelope(&arq::plain(&bytes)).await;
        }
        let env = self
            .numbered(bytes.len() + arq::SEQUENCED_HEADER_LEN, |seq| {
                arq::sequenced(seq, &bytes)
            })
            .await;
        self.send_envelope(&env).await
    }

    /// Send `frame` as a DATA message: numbered and sent again until acknowledged when
    /// `reliable` (waits while the window is full), sent once otherwise. The payload is not
    /// copied when the frame has headroom.
    pub async fn send_frame(&self, frame: Frame, reliable: bool) -> Result<()> {
        self.check_peer_limit(frame.len().saturating_add(16))?;
        let mut frame = data_frame(frame, 0)?;
        if !reliable {
            frame.push_header(&[arq::KIND_PLAIN]);
            return self.send_envelope(&frame.into_bytes()).await;
        }
        let len = frame.len() + arq::SEQUENCED_HEADER_LEN;
        let env = self
            .numbered(len, move |seq| {
                frame.push_header_with(arq::SEQUENCED_HEADER_LEN, |h| {
                    arq::write_sequenced_header(h, seq)
                });
                frame.into_bytes()
            })
            .await;
        self.send_envelope(&env).await
    }

    /// Waits for room for `len` bytes in the window, then numbers the envelope `build` makes
    /// and keeps it until acknowledged.
    async fn numbered(&self, len: usize, build: impl FnOnce(u64) -> Bytes) -> Bytes {
        let mut build = Some(build);
        loop {
            let notified = self.inner.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut arq = self.arq();
                if let Some(build) = build.take_if(|_| arq.has_room(len)) {
                    let env = build(arq.next_seq());
                    let idle = arq.poll_timeout().is_none();
                    arq.sent(Instant::now(), env.clone());
                    if idle {
                        // The receiving half may be waiting with no timer: it has one now.
                        self.inner.armed.notify_one();
                    }
                    return env;
                }
            }
            notified.await;
        }
    }

    fn arq(&self) -> std::sync::MutexGuard<'_, ArqTx> {
        self.inner
            .arq
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_peer_limit(&self, body_len: usize) -> Result<()> {
        let max = self.inner.peer_max_body.load(Ordering::Relaxed);
        if body_len as u64 > u64::from(max) {
            return Err(LinkError::TooLargeForPeer {
                len: body_len as u64,
                max,
            });
        }
        Ok(())
    }

    /// `run` (datagrams of `size` bytes, the last one maybe shorter) in one `sendmsg` with
    /// UDP GSO. `Ok(false)`: GSO is refused here (now switched off for this link): send them
    /// one by one.
    async fn send_gso(&self, run: &[Bytes], size: usize, peer: Option<SocketAddr>) -> Result<bool> {
        let Some(control) = gso::control(size) else {
            return Ok(false);
        };
        // At most gso::MAX_SEGMENTS slices: on the stack, no allocation per call.
        let mut slices = [std::io::IoSlice::new(&[]); gso::MAX_SEGMENTS];
        for (slot, d) in slices.iter_mut().zip(run) {
            *slot = std::io::IoSlice::new(d);
        }
        let bufs = &slices[..run.len().min(gso::MAX_SEGMENTS)];
        let addr = peer.map(socket2::SockAddr::from);
        let socket = &self.inner.socket;
        let sent = socket
            .async_io(tokio::io::Interest::WRITABLE, || {
                let mut msg = socket2::MsgHdr::new()
                    .with_buffers(bufs)
                    .with_control(&control);
                if let Some(a) = &addr {
                    msg = msg.with_addr(a);
                }
                socket2::SockRef::from(socket).sendmsg(&msg, 0)
            })
            .await;
        match sent {
            Ok(_) => Ok(true),
            Err(e) if gso::refused(&e) => {
                tracing::debug!(error = %e, "UDP GSO refused: sending datagrams one by one");
                self.inner.gso.store(false, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// One envelope (a message, numbered or not, or an acknowledgement) as datagrams.
    async fn send_envelope(&self, message: &[u8]) -> Result<()> {
        let max_datagram = self.inner.max_datagram.load(Ordering::Relaxed);
        let id = self.inner.next_message.fetch_add(1, Ordering::Relaxed);
        let datagrams = match self.inner.seal.get() {
            Some(seal) => seal_message(seal, self.inner.session, id, message, max_datagram)?,
            None => fragment(self.inner.session, id, message, max_datagram).ok_or(
                LinkError::DatagramTooLarge {
                    len: message.len(),
                    max: max_fragmented_len(max_datagram),
                },
            )?,
        };
        let peer = if self.inner.connected {
            None
        } else {
            Some(self.peer_addr().ok_or(LinkError::NoPeer)?)
        };
        let mut i = 0;
        while i < datagrams.len() {
            // A run of datagrams of one size (its last may be shorter) leaves in one call.
            let size = datagrams[i].len();
            let most = if self.inner.gso.load(Ordering::Relaxed) {
                gso::segments(size)
            } else {
                1
            };
            let mut j = i + 1;
            while j < datagrams.len()
                && j - i < most
                && datagrams[j - 1].len() == size
                && datagrams[j].len() <= size
            {
                j += 1;
            }
            if j - i > 1 && self.send_gso(&datagrams[i..j], size, peer).await? {
                i = j;
                continue;
            }
            for d in &datagrams[i..j] {
                match peer {
                    None => self.inner.socket.send(d).await?,
                    Some(peer) => self.inner.socket.send_to(d, peer).await?,
                };
            }
            i = j;
        }
        self.inner.messages_sent.fetch_add(1, Ordering::Relaxed);
        self.inner
            .datagrams_sent
            .fetch_add(datagrams.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// UDP generic segmentation offload (Linux): one `sendmsg` of up to 64 equal datagrams (the
/// last may be shorter) with a `UDP_SEGMENT` control message; the kernel (or the NIC) cuts
/// them. A datagram-per-syscall sender spent most of its time in `sendto` (`ndd bench links`).
mod gso {
    /// Built for a 64-bit Linux, whose `cmsghdr` layout [`control`] writes.
    pub(super) const AVAILABLE: bool = cfg!(all(target_os = "linux", target_pointer_width = "64"));
    /// `SOL_UDP` and `UDP_SEGMENT` from linux/udp.h.
    const SOL_UDP: i32 = 17;
    const UDP_SEGMENT: i32 = 103;
    /// The kernel's `UDP_MAX_SEGMENTS` (64 before Linux 6.1; 128 after).
    pub(super) const MAX_SEGMENTS: usize = 64;
    /// Most bytes in one call: one IPv4/IPv6 packet before segmentation.
    const MAX_BYTES: usize = 65_000;

    /// How many datagrams of `size` bytes one call may carry.
    pub(super) fn segments(size: usize) -> usize {
        (MAX_BYTES / size.max(1)).clamp(1, MAX_SEGMENTS)
    }

    /// The control message `UDP_SEGMENT = size`: a `cmsghdr` (length, level, type) and the
    /// u16, padded to 8 bytes (`CMSG_SPACE(2)` = 24, `CMSG_LEN(2)` = 18). The kernel copies
    /// it before reading, so the buffer's alignment does not matter.
    pub(super) fn control(size: usize) -> Option<[u8; 24]> {
        if !AVAILABLE {
            return None;
        }
        let size = u16::try_from(size).ok()?;
        let mut c = [0u8; 24];
        c[0..8].copy_from_slice(&18u64.to_ne_bytes());
        c[8..12].copy_from_slice(&SOL_UDP.to_ne_bytes());
        c[12..16].copy_from_slice(&UDP_SEGMENT.to_ne_bytes());
        c[16..18].copy_from_slice(&size.to_ne_bytes());
        Some(c)
    }

    /// Errors that mean "no GSO here" (an old kernel, a device without checksum offload),
    /// not a broken link.
    pub(super) fn refused(e: &std::io::Error) -> bool {
        // EIO (5): the device cannot; EINVAL (22), ENOPROTOOPT (92), EOPNOTSUPP (95): the
        // kernel does not know the option.
        matches!(e.raw_os_error(), Some(5 | 22 | 92 | 95))
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn a_call_carries_what_fits_one_packet_and_the_control_message_is_udp_segment() {
            assert_eq!(super::segments(1452), 44);
            assert_eq!(super::segments(100), 64);
            assert_eq!(super::segments(65_507), 1);
            if !super::AVAILABLE {
                assert_eq!(super::control(1452), None);
                return;
            }
            let c = super::control(1452).unwrap();
            assert_eq!(c.len(), 24);
            assert_eq!(u64::from_ne_bytes(c[0..8].try_into().unwrap()), 18);
            assert_eq!(i32::from_ne_bytes(c[8..12].try_into().unwrap()), 17);
            assert_eq!(i32::from_ne_bytes(c[12..16].try_into().unwrap()), 103);
            assert_eq!(u16::from_ne_bytes(c[16..18].try_into().unwrap()), 1452);
            assert_eq!(super::control(70_000), None, "a segment size fits u16");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_core::testlog::Captured;

    /// A stranger's plain datagrams at a sealed listener, a thousand in five simulated seconds
    /// (the warning's interval): the warning once, then once more with the count held back;
    /// every datagram is counted.
    #[tokio::test]
    async fn a_thousand_plain_datagrams_at_a_sealed_listener_are_two_warnings() {
        let (log, _guard) = Captured::start();
        let dir = std::env::temp_dir().join(format!("ndd-udp-plain-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (id, _) = crate::Identity::load_or_create(&dir).unwrap();
        let me = LocalIdentity::new(&id).unwrap();
        let addr = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // The clock the listener reads once per datagram: 5 ms further each time.
        let calls = Arc::new(AtomicU64::new(0));
        let t0 = Instant::now();
        let clock = {
            let calls = calls.clone();
            move || t0 + Duration::from_millis(5 * calls.fetch_add(1, Ordering::SeqCst))
        };
        let at = addr.to_string();
        let listen = accept_secure(
            &at,
            &me,
            Duration::from_secs(5),
            |_, _| panic!("nobody finishes a key exchange"),
            clock,
        );
        let plain = fragment(7, 1, b"hello", 1200).unwrap().remove(0);
        let stranger = async {
            let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            for n in 1..=1001 {
                // One at a time, each taken before the next (none lost to a full buffer).
                while calls.load(Ordering::SeqCst) < n - 1 {
                    tokio::task::yield_now().await;
                }
                s.send_to(&plain, addr).await.unwrap();
            }
            while calls.load(Ordering::SeqCst) < 1001 {
                tokio::task::yield_now().await;
            }
        };
        tokio::select! {
            r = listen => panic!("the listener ended: {:?}", r.map(|(_, fp)| fp)),
            () = stranger => {}
        }
        let lines = log.matching("ignored a plain UDP datagram");
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(lines[1].contains("suppressed=999"), "{lines:#?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Sealed datagrams at an `--insecure` link, a thousand within five simulated seconds:
    /// two warnings, the second with the count; every one counted as garbage.
    #[tokio::test]
    async fn a_thousand_sealed_datagrams_at_a_plain_link_are_two_warnings() {
        let (log, _guard) = Captured::start();
        let mut link = udp_bind("127.0.0.1:0").await.unwrap();
        let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let sealed = [b'N', b'S', 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let t0 = Instant::now();
        for i in 0..=1000u64 {
            link.buf.clear();
            link.buf.extend_from_slice(&sealed);
            link.datagram(sealed.len(), from, t0 + Duration::from_millis(5 * i))
                .await
                .unwrap();
        }
        assert_eq!(link.reassembler.stats().garbage, 1001);
        let lines = log.matching("ignored a sealed UDP datagram");
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(lines[1].contains("suppressed=999"), "{lines:#?}");
    }
}
