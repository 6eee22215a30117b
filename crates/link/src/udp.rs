//! The UDP link, for LAN input devices: one ndd message per datagram, fragmented when larger.
//!
//! **No encryption, no authentication, no retransmission.** Anyone on the path can read,
//! forge, drop or replay datagrams. Confidentiality and integrity on UDP come only from the
//! `encrypt` pair in the stream's stack (which also rejects replays); `docs/links.md` says
//! this loudly and the session warns when a UDP link carries a stream without it.
//!
//! Each datagram is a [`crate::frag`] fragment: a 20-byte header (magic, version, session id,
//! message id, fragment index and count) and a slice of one message in the wire format. The
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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use ndd_core::Frame;
use ndd_wire::{Message, HEADER_LEN};
use tokio::net::UdpSocket;

use crate::conn::{decode_message, frame_to_message, Incoming, DEFAULT_MAX_BODY};
use crate::frag::{
    fragment, max_fragmented_len, DatagramStats, FragHeader, Reassembler, ReassemblyConfig,
    FRAG_HEADER_LEN,
};
use crate::{LinkError, Result};

/// Default datagram size (header included): fits a 1500-byte Ethernet MTU over IPv6
/// (1500 − 40 − 8) and IPv4.
pub const DEFAULT_MAX_DATAGRAM: usize = 1452;
/// Largest UDP payload over IPv4.
pub const MAX_UDP_PAYLOAD: usize = 65_507;
/// Socket buffer size requested (the kernel may cap it, see `net.core.rmem_max`).
const SOCKET_BUFFER: usize = 4 * 1024 * 1024;

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
}

/// A UDP link: send and receive whole messages over datagrams. See the module docs.
#[derive(Debug)]
pub struct UdpLink {
    tx: UdpSender,
    reassembler: Reassembler,
    buf: BytesMut,
    max_body: u32,
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
                }),
            },
            reassembler: Reassembler::new(ReassemblyConfig::default()),
            buf: BytesMut::new(),
            max_body: DEFAULT_MAX_BODY,
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
        s.messages_sent = self.tx.inner.messages_sent.load(Ordering::Relaxed);
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
            self.buf.clear();
            self.buf.reserve(MAX_UDP_PAYLOAD + 1);
            let (n, from) = self.tx.inner.socket.recv_buf_from(&mut self.buf).await?;
            let datagram = self.buf.split_to(n).freeze();
            if !self.accept_source(from, &datagram) {
                continue;
            }
            let Some((_, message)) = self.reassembler.push(Instant::now(), datagram) else {
                continue;
            };
            match decode_message(message, self.max_body) {
                Ok(incoming) => return Ok(Some(incoming)),
                Err(error) => {
                    tracing::debug!(%error, %from, "dropping an invalid message");
                    self.reassembler.stats_mut().bad_messages += 1;
                }
            }
        }
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
                self.reassembler.stats_mut().datagrams += 1;
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

    /// Send any message (copies it once into datagrams).
    pub async fn send_message(&self, msg: &Message<'_>) -> Result<()> {
        self.check_peer_limit(msg.body_len())?;
        let bytes = msg.emit_to_vec()?;
        self.send_bytes(&bytes).await
    }

    /// Send `frame` as a DATA message. UDP gives no delivery guarantee whatever `reliable`
    /// says: the argument exists so that every link has the same call shape.
    pub async fn send_frame(&self, frame: Frame, reliable: bool) -> Result<()> {
        let _ = reliable;
        self.check_peer_limit(frame.len().saturating_add(16))?;
        let bytes = frame_to_message(frame, 0)?;
        self.send_bytes(&bytes).await
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

    async fn send_bytes(&self, message: &[u8]) -> Result<()> {
        let max_datagram = self.inner.max_datagram.load(Ordering::Relaxed);
        let id = self.inner.next_message.fetch_add(1, Ordering::Relaxed);
        let datagrams = fragment(self.inner.session, id, message, max_datagram).ok_or(
            LinkError::DatagramTooLarge {
                len: message.len(),
                max: max_fragmented_len(max_datagram),
            },
        )?;
        let peer = if self.inner.connected {
            None
        } else {
            Some(self.peer_addr().ok_or(LinkError::NoPeer)?)
        };
        for d in &datagrams {
            match peer {
                None => self.inner.socket.send(d).await?,
                Some(peer) => self.inner.socket.send_to(d, peer).await?,
            };
        }
        self.inner.messages_sent.fetch_add(1, Ordering::Relaxed);
        self.inner
            .datagrams_sent
            .fetch_add(datagrams.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}
