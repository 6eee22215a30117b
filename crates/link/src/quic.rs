//! The QUIC link (quinn 0.11, rustls with ring): same identities, verifiers and pinning as
//! TLS ([`crate::tls`]: TLS 1.3, ALPN `ndd/1`, client certificate required), one UDP port.
//!
//! Mapping (`docs/links.md` has the full story):
//!
//! - **session stream**: the first unidirectional stream each side opens carries its
//!   session-level messages and CONTROL/ACK messages (and END of lossy streams), in the wire
//!   format, back to back. (One unidirectional stream per direction rather than one
//!   bidirectional stream, so that both sides can send HELLO at once without either waiting
//!   to accept the other's stream.) It has a higher send priority than data streams, so
//!   control never waits behind data.
//! - **reliable ndd stream**: one unidirectional QUIC stream per ndd stream and direction,
//!   opened on its first DATA, carrying its DATA messages and then its END, in the wire
//!   format. END travels behind the DATA it counts, so "no DATA follows END" holds.
//! - **lossy ndd stream**: one DATA message per QUIC datagram, fragmented with the
//!   [`crate::frag`] header (session id 0) when larger than the datagram limit; reassembly has
//!   a timeout and a memory cap, drops are counted ([`QuicConn::stats`]).
//!
//! Receiving merges all of these in [`QuicConn::recv`]. Two ordering rules are enforced here:
//! DATA (from data streams and datagrams) is held back until the peer's READY has been
//! delivered (§5 of the protocol: no DATA before READY), and a CLOSE, or the end of the peer's
//! session stream, is delivered only after every data stream the peer opened has been read to
//! its end (the sender finishes its data streams and waits until the peer has them before it
//! writes CLOSE). So, as on TCP, nothing sent before CLOSE is lost or reordered after it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ndd_core::Frame;
use ndd_wire::{peek_message_len, Message, HEADER_LEN};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Connection, ConnectionError, Endpoint, RecvStream, SendStream, TransportConfig};
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, Notify};

use crate::conn::{decode_message, frame_to_message, Incoming, PeerInfo, DEFAULT_MAX_BODY};
use crate::frag::{fragment, max_fragmented_len, DatagramStats, Reassembler, ReassemblyConfig};
use crate::identity::{fingerprint_of_cert, Identity};
use crate::tls::{client_config, server_config, SERVER_NAME};
use crate::{LinkError, Result};

/// Most reliable ndd streams per direction on one connection (plus the session stream).
pub const MAX_DATA_STREAMS: u32 = 1023;
/// How long [`QuicSender::send_message`] with CLOSE, and [`QuicConn::close`], wait for the
/// peer to acknowledge what was sent before giving up on it.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Application error code of a normal close.
const CLOSE_NORMAL: u32 = 0;
/// Messages queued between the stream readers and [`QuicConn::recv`] (backpressure beyond).
const CHANNEL: usize = 64;
/// Read size from a QUIC stream.
const READ_CHUNK: usize = 64 * 1024;

fn transport() -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.max_concurrent_uni_streams(quinn::VarInt::from_u32(MAX_DATA_STREAMS + 1));
    t.max_concurrent_bidi_streams(quinn::VarInt::from_u32(0));
    t.datagram_receive_buffer_size(Some(4 * 1024 * 1024));
    t.datagram_send_buffer_size(4 * 1024 * 1024);
    t.stream_receive_window(quinn::VarInt::from_u32(8 * 1024 * 1024));
    t.receive_window(quinn::VarInt::from_u32(32 * 1024 * 1024));
    t.send_window(32 * 1024 * 1024);
    Arc::new(t)
}

fn quic_server_config(tls: Arc<ServerConfig>) -> Result<quinn::ServerConfig> {
    let crypto =
        QuicServerConfig::try_from(tls).map_err(|e| LinkError::QuicConfig(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(transport());
    // Follow a client whose address changes (quinn's default, stated because the link
    // promises it: tests/quic_migration.rs).
    config.migration(true);
    Ok(config)
}

fn quic_client_config(tls: Arc<ClientConfig>) -> Result<quinn::ClientConfig> {
    let crypto =
        QuicClientConfig::try_from(tls).map_err(|e| LinkError::QuicConfig(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(crypto));
    config.transport_config(transport());
    Ok(config)
}

/// The fingerprint of the peer's certificate on a QUIC connection.
pub fn quic_peer_fingerprint(conn: &Connection) -> Result<String> {
    let identity = conn.peer_identity().ok_or(LinkError::NoPeerCertificate)?;
    let certs = identity
        .downcast::<Vec<CertificateDer<'static>>>()
        .map_err(|_| LinkError::NoPeerCertificate)?;
    fingerprint_of_cert(certs.first().ok_or(LinkError::NoPeerCertificate)?)
}

/// A QUIC endpoint accepting connections on one UDP port.
#[derive(Debug)]
pub struct QuicListener {
    endpoint: Endpoint,
}

/// Listen for QUIC connections on `addr` (`ip:port`; port 0 picks one) with this identity.
pub async fn quic_listen(addr: &str, identity: &Identity) -> Result<QuicListener> {
    quic_listen_with(addr, server_config(identity)?).await
}

/// [`quic_listen`] with a given rustls configuration (normally [`server_config`]).
pub async fn quic_listen_with(addr: &str, tls: Arc<ServerConfig>) -> Result<QuicListener> {
    let bind_err = |source| LinkError::Bind {
        addr: addr.to_owned(),
        source,
    };
    let sock = resolve(addr).await.map_err(bind_err)?;
    let endpoint = Endpoint::server(quic_server_config(tls)?, sock).map_err(bind_err)?;
    Ok(QuicListener { endpoint })
}

async fn resolve(addr: &str) -> std::io::Result<SocketAddr> {
    tokio::net::lookup_host(addr).await?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the name resolves to no address",
        )
    })
}

impl QuicListener {
    /// The address actually bound.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    /// Accept one connection and run the server side of the handshake (bounded by
    /// `handshake_timeout`). As with TCP, a failed handshake ([`LinkError::QuicHandshake`],
    /// [`LinkError::HandshakeTimeout`]) concerns that connection only; loop and serve the
    /// next. The fingerprint is not checked against `known_peers` yet.
    pub async fn accept(&self, handshake_timeout: Duration) -> Result<(QuicConn, PeerInfo)> {
        let incoming = self.accept_incoming().await?;
        quic_secure(incoming, handshake_timeout).await
    }

    /// The next incoming connection attempt, before its handshake.
    pub async fn accept_incoming(&self) -> Result<quinn::Incoming> {
        self.endpoint.accept().await.ok_or(LinkError::Closed)
    }

    /// Stop accepting and close every connection of this endpoint.
    pub fn close(&self) {
        self.endpoint
            .close(quinn::VarInt::from_u32(CLOSE_NORMAL), b"");
    }
}

/// The server side of an incoming QUIC connection: its handshake, bounded by
/// `handshake_timeout`, and the session streams.
pub async fn quic_secure(
    incoming: quinn::Incoming,
    handshake_timeout: Duration,
) -> Result<(QuicConn, PeerInfo)> {
    let addr = incoming.remote_address();
    let conn = match tokio::time::timeout(handshake_timeout, incoming).await {
        Err(_) => {
            return Err(LinkError::HandshakeTimeout {
                addr,
                timeout: handshake_timeout,
            })
        }
        Ok(Err(source)) => {
            tracing::debug!(%addr, error = %source, "QUIC handshake failed");
            return Err(LinkError::QuicHandshake {
                addr,
                error: source,
            });
        }
        Ok(Ok(conn)) => conn,
    };
    let fingerprint = quic_peer_fingerprint(&conn)?;
    tracing::debug!(%addr, %fingerprint, "accepted QUIC connection");
    let quic = QuicConn::start(conn, None).await?;
    Ok((
        quic,
        PeerInfo {
            addr,
            fingerprint: Some(fingerprint),
        },
    ))
}

/// Connect over QUIC to `addr` with this identity; `timeout` bounds the handshake. The
/// fingerprint is not checked against `known_peers` yet.
pub async fn quic_connect(
    addr: &str,
    identity: &Identity,
    timeout: Duration,
) -> Result<(QuicConn, PeerInfo)> {
    quic_connect_with(addr, client_config(identity)?, timeout).await
}

/// [`quic_connect`] with a given rustls configuration (normally [`client_config`]).
pub async fn quic_connect_with(
    addr: &str,
    tls: Arc<ClientConfig>,
    timeout: Duration,
) -> Result<(QuicConn, PeerInfo)> {
    let connect_err = |source| LinkError::Connect {
        addr: addr.to_owned(),
        source,
    };
    let attempt = async {
        let peer = resolve(addr).await.map_err(connect_err)?;
        let local: SocketAddr = if peer.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let mut endpoint = Endpoint::client(local).map_err(connect_err)?;
        endpoint.set_default_client_config(quic_client_config(tls)?);
        let connecting =
            endpoint
                .connect(peer, SERVER_NAME)
                .map_err(|source| LinkError::QuicConnect {
                    addr: addr.to_owned(),
                    source,
                })?;
        let conn = connecting
            .await
            .map_err(|error| LinkError::QuicHandshake { addr: peer, error })?;
        let fingerprint = quic_peer_fingerprint(&conn)?;
        tracing::debug!(addr = %peer, %fingerprint, "connected with QUIC");
        let quic = QuicConn::start(conn, Some(endpoint)).await?;
        Ok((
            quic,
            PeerInfo {
                addr: peer,
                fingerprint: Some(fingerprint),
            },
        ))
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| LinkError::ConnectTimeout {
            addr: addr.to_owned(),
            timeout,
        })?
}

/// What the reader tasks tell [`QuicConn::recv`].
#[derive(Debug)]
enum Event {
    Msg(Incoming),
    /// A data stream was accepted (sent before any of its messages).
    UniOpened,
    /// A data stream ended cleanly.
    UniEnded,
    /// The accept task had no unaccepted stream when asked.
    AcceptIdle,
    /// The peer's session stream ended cleanly.
    End,
    Failed(LinkError),
}

/// One QUIC connection carrying one ndd session. Send through it (or a [`QuicSender`] from
/// [`QuicConn::sender`], in another task) and [`QuicConn::recv`] in one task.
#[derive(Debug)]
pub struct QuicConn {
    tx: QuicSender,
    session_rx: mpsc::Receiver<Event>,
    data_rx: mpsc::Receiver<Event>,
    flush: Arc<Notify>,
    max_body: Arc<AtomicU32>,
    ready_seen: bool,
    session_done: bool,
    data_done: bool,
    open_streams: usize,
    accept_idle: bool,
    /// CLOSE (`Some`) or the end of the session stream (`None`), held until the data
    /// streams are drained.
    pending_final: Option<(Option<Incoming>, tokio::time::Instant)>,
}

/// The sending side of a [`QuicConn`]; cheap to clone.
#[derive(Debug, Clone)]
pub struct QuicSender {
    inner: Arc<SenderInner>,
}

#[derive(Debug)]
struct SenderInner {
    conn: Connection,
    endpoint: Option<Endpoint>,
    session: tokio::sync::Mutex<SendStream>,
    streams: tokio::sync::Mutex<HashMap<u16, Arc<tokio::sync::Mutex<SendStream>>>>,
    /// QUIC send priority of each ndd stream's QUIC stream (absent: 0, normal).
    priorities: Mutex<HashMap<u16, i32>>,
    next_datagram: AtomicU64,
    peer_max_body: AtomicU32,
    stats: Arc<Mutex<DatagramStats>>,
}

impl QuicConn {
    async fn start(conn: Connection, endpoint: Option<Endpoint>) -> Result<QuicConn> {
        let session = conn.open_uni().await?;
        // Control first: a higher priority than every data stream (whose QUIC priority is
        // their ndd stream's: 1 high, 0 normal, -1 low).
        let _ = session.set_priority(SESSION_PRIORITY);
        let stats = Arc::new(Mutex::new(DatagramStats::default()));
        let max_body = Arc::new(AtomicU32::new(DEFAULT_MAX_BODY));
        let flush = Arc::new(Notify::new());
        let (session_tx, session_rx) = mpsc::channel(CHANNEL);
        let (data_tx, data_rx) = mpsc::channel(CHANNEL);
        tokio::spawn(accept_streams(
            conn.clone(),
            session_tx,
            data_tx.clone(),
            Arc::clone(&flush),
            Arc::clone(&max_body),
        ));
        tokio::spawn(read_datagrams(
            conn.clone(),
            data_tx,
            Arc::clone(&stats),
            Arc::clone(&max_body),
        ));
        Ok(QuicConn {
            tx: QuicSender {
                inner: Arc::new(SenderInner {
                    conn,
                    endpoint,
                    session: tokio::sync::Mutex::new(session),
                    streams: tokio::sync::Mutex::new(HashMap::new()),
                    priorities: Mutex::new(HashMap::new()),
                    next_datagram: AtomicU64::new(1),
                    peer_max_body: AtomicU32::new(u32::MAX),
                    stats,
                }),
            },
            session_rx,
            data_rx,
            flush,
            max_body,
            ready_seen: false,
            session_done: false,
            data_done: false,
            open_streams: 0,
            accept_idle: false,
            pending_final: None,
        })
    }

    /// A handle that sends on this connection from another task.
    pub fn sender(&self) -> QuicSender {
        self.tx.clone()
    }

    /// The underlying quinn connection (RTT, path statistics, migration).
    pub fn connection(&self) -> &Connection {
        &self.tx.inner.conn
    }

    /// The peer's current address (it can change: QUIC follows a migrating peer).
    pub fn peer_addr(&self) -> SocketAddr {
        self.tx.inner.conn.remote_address()
    }

    /// Moves this side to a new UDP socket while the connection goes on: connection
    /// migration, for a side whose address changes (another network, a NAT rebinding). The
    /// peer validates the new path and follows it ([`QuicConn::peer_addr`]); data in flight is
    /// resent on the new path by QUIC. Only the connecting side owns its endpoint: on an
    /// accepted connection (the listener's one socket serves every connection) this fails
    /// with an I/O error of kind `Unsupported`. On error the old socket stays in use.
    pub fn rebind(&self, socket: std::net::UdpSocket) -> Result<()> {
        match &self.tx.inner.endpoint {
            Some(endpoint) => Ok(endpoint.rebind(socket)?),
            None => Err(LinkError::Io(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "an accepted QUIC connection shares its listener's socket: only the connecting side can rebind",
            ))),
        }
    }

    /// Largest body accepted on every stream and in datagrams (default 16 MiB).
    pub fn set_max_body(&mut self, max_body: u32) {
        self.max_body.store(max_body, Ordering::Relaxed);
    }

    /// Datagram counters (lossy streams): received, delivered, dropped, sent.
    pub fn stats(&self) -> DatagramStats {
        self.tx.stats()
    }

    /// See [`QuicSender::set_peer_max_body`].
    pub fn set_peer_max_body(&self, max_body: u32) {
        self.tx.set_peer_max_body(max_body);
    }

    /// See [`QuicSender::send_message`].
    pub async fn send_message(&self, msg: &Message<'_>) -> Result<()> {
        self.tx.send_message(msg).await
    }

    /// See [`QuicSender::send_frame`].
    pub async fn send_frame(&self, frame: Frame, reliable: bool) -> Result<()> {
        self.tx.send_frame(frame, reliable).await
    }

    /// See [`QuicSender::max_datagram_size`].
    pub fn max_datagram_size(&self) -> Option<usize> {
        self.tx.max_datagram_size()
    }

    /// See [`QuicSender::shutdown`].
    pub async fn shutdown(&self) -> Result<()> {
        self.tx.shutdown().await
    }

    /// See [`QuicSender::close`].
    pub async fn close(&self) {
        self.tx.close().await
    }

    /// The next message from any stream or datagram; `Ok(None)` once the peer ended its
    /// session stream (or closed the connection normally) and every data stream has been
    /// read to its end.
    ///
    /// Errors: a malformed message or mapping violation from the peer, a connection lost or
    /// closed with an error. Bad datagrams are not errors: they are counted in
    /// [`QuicConn::stats`]. Cancel safe.
    pub async fn recv(&mut self) -> Result<Option<Incoming>> {
        loop {
            if let Some(deadline) = self.pending_final.as_ref().map(|(_, d)| *d) {
                let drained = self.data_done || (self.accept_idle && self.open_streams == 0);
                if drained || tokio::time::Instant::now() >= deadline {
                    return Ok(self.pending_final.take().and_then(|(last, _)| last));
                }
            } else if self.session_done {
                return Ok(None);
            }
            let data_open = (self.ready_seen || self.pending_final.is_some()) && !self.data_done;
            let session_open = !self.session_done && self.pending_final.is_none();
            let deadline = self.pending_final.as_ref().map(|(_, d)| *d);
            if !data_open && !session_open && deadline.is_none() {
                return Ok(None);
            }
            tokio::select! {
                biased;
                ev = self.session_rx.recv(), if session_open => match ev {
                    Some(Event::Msg(msg)) => {
                        match &msg {
                            Incoming::Other(ndd_wire::OwnedMessage::Ready) => self.ready_seen = true,
                            Incoming::Other(ndd_wire::OwnedMessage::Close { .. }) => {
                                self.hold_final(Some(msg));
                                continue;
                            }
                            _ => {}
                        }
                        return Ok(Some(msg));
                    }
                    Some(Event::Failed(e)) => return Err(e),
                    Some(Event::End) | None => {
                        self.session_done = true;
                        self.hold_final(None);
                    }
                    Some(_) => {}
                },
                ev = self.data_rx.recv(), if data_open => match ev {
                    Some(Event::Msg(msg)) => return Ok(Some(msg)),
                    Some(Event::UniOpened) => self.open_streams += 1,
                    Some(Event::UniEnded) => self.open_streams = self.open_streams.saturating_sub(1),
                    Some(Event::AcceptIdle) => self.accept_idle = true,
                    Some(Event::Failed(e)) => return Err(e),
                    Some(Event::End) => {}
                    None => self.data_done = true,
                },
                () = sleep_until_opt(deadline) => {}
            }
        }
    }

    fn hold_final(&mut self, last: Option<Incoming>) {
        self.accept_idle = false;
        self.flush.notify_one();
        self.pending_final = Some((last, tokio::time::Instant::now() + DRAIN_TIMEOUT));
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Whether a connection error is the normal end of a connection.
fn clean_close(e: &ConnectionError) -> bool {
    match e {
        ConnectionError::ApplicationClosed(close) => {
            close.error_code == quinn::VarInt::from_u32(CLOSE_NORMAL)
        }
        ConnectionError::LocallyClosed => true,
        _ => false,
    }
}

/// Accept the peer's unidirectional streams: the first is its session stream, the others
/// data streams. Answers flush requests with `AcceptIdle` when no stream is waiting.
async fn accept_streams(
    conn: Connection,
    session_tx: mpsc::Sender<Event>,
    data_tx: mpsc::Sender<Event>,
    flush: Arc<Notify>,
    max_body: Arc<AtomicU32>,
) {
    let mut first = true;
    loop {
        let accepted = tokio::select! {
            biased;
            r = conn.accept_uni() => r,
            () = flush.notified() => {
                if data_tx.send(Event::AcceptIdle).await.is_err() {
                    return;
                }
                continue;
            }
        };
        match accepted {
            Ok(stream) if first => {
                first = false;
                tokio::spawn(read_stream(
                    stream,
                    session_tx.clone(),
                    true,
                    Arc::clone(&max_body),
                ));
            }
            Ok(stream) => {
                if data_tx.send(Event::UniOpened).await.is_err() {
                    return;
                }
                tokio::spawn(read_stream(
                    stream,
                    data_tx.clone(),
                    false,
                    Arc::clone(&max_body),
                ));
            }
            Err(e) => {
                if first {
                    // The peer never opened its session stream.
                    let event = if clean_close(&e) {
                        Event::End
                    } else {
                        Event::Failed(e.into())
                    };
                    let _ = session_tx.send(event).await;
                } else if !clean_close(&e) {
                    let _ = session_tx.send(Event::Failed(e.into())).await;
                }
                return;
            }
        }
    }
}

/// Read whole messages from one QUIC stream into `tx`.
async fn read_stream(
    mut stream: RecvStream,
    tx: mpsc::Sender<Event>,
    session: bool,
    max_body: Arc<AtomicU32>,
) {
    let mut buf = BytesMut::new();
    let mut data_stream: Option<u16> = None;
    loop {
        let max = max_body.load(Ordering::Relaxed);
        let event = match peek_message_len(&buf, max) {
            Err(e) => Event::Failed(e.into()),
            Ok(Some(total)) if buf.len() >= total => {
                let msg = buf.split_to(total).freeze();
                match decode_message(msg, max) {
                    Err(e) => Event::Failed(e),
                    Ok(incoming) if session => Event::Msg(incoming),
                    Ok(incoming) => match check_data_stream(&incoming, &mut data_stream) {
                        Ok(()) => Event::Msg(incoming),
                        Err(e) => Event::Failed(e),
                    },
                }
            }
            Ok(_) => {
                buf.reserve(READ_CHUNK);
                match stream.read_buf(&mut buf).await {
                    Ok(0) if buf.is_empty() => end_event(session),
                    Ok(0) => Event::Failed(LinkError::ClosedMidMessage {
                        got: buf.len(),
                        need: peek_message_len(&buf, max)
                            .ok()
                            .flatten()
                            .unwrap_or(HEADER_LEN),
                    }),
                    Ok(_) => continue,
                    Err(e) => match e.downcast::<quinn::ReadError>() {
                        Ok(quinn::ReadError::ConnectionLost(c)) if clean_close(&c) => {
                            end_event(session)
                        }
                        Ok(e) => Event::Failed(e.into()),
                        Err(e) => Event::Failed(e.into()),
                    },
                }
            }
        };
        let last = !matches!(event, Event::Msg(_));
        if tx.send(event).await.is_err() || last {
            return;
        }
    }
}

fn end_event(session: bool) -> Event {
    if session {
        Event::End
    } else {
        Event::UniEnded
    }
}

/// A data stream carries DATA and END of one ndd stream only.
fn check_data_stream(incoming: &Incoming, stream: &mut Option<u16>) -> Result<()> {
    let id = match incoming {
        Incoming::Data { header, .. } => header.stream_id,
        Incoming::Other(ndd_wire::OwnedMessage::End { stream, .. }) => *stream,
        Incoming::Other(_) => {
            return Err(LinkError::Wire(ndd_wire::WireError::Malformed(
                "a QUIC data stream carried a message other than DATA or END",
            )))
        }
    };
    match *stream {
        None => *stream = Some(id),
        Some(s) if s != id => {
            return Err(LinkError::Wire(ndd_wire::WireError::Malformed(
                "a QUIC data stream carried DATA of two ndd streams",
            )))
        }
        Some(_) => {}
    }
    Ok(())
}

/// Reassemble datagrams into DATA messages.
async fn read_datagrams(
    conn: Connection,
    tx: mpsc::Sender<Event>,
    stats: Arc<Mutex<DatagramStats>>,
    max_body: Arc<AtomicU32>,
) {
    let mut reassembler = Reassembler::new(ReassemblyConfig::default());
    loop {
        let deadline = reassembler
            .poll_timeout()
            .map(tokio::time::Instant::from_std);
        let received = tokio::select! {
            d = conn.read_datagram() => d,
            () = sleep_until_opt(deadline) => {
                reassembler.handle_timeout(Instant::now());
                publish(&stats, &reassembler);
                continue;
            }
        };
        let Ok(datagram) = received else { return };
        let max = max_body.load(Ordering::Relaxed);
        reassembler.set_max_message((max as usize).saturating_add(HEADER_LEN));
        let out = reassembler.push(Instant::now(), datagram);
        let event = match out.map(|(_, m)| decode_message(m, max)) {
            Some(Ok(incoming @ Incoming::Data { .. })) => Some(Event::Msg(incoming)),
            Some(_) => {
                reassembler.stats_mut().bad_messages += 1;
                None
            }
            None => None,
        };
        publish(&stats, &reassembler);
        if let Some(event) = event {
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}

fn publish(stats: &Mutex<DatagramStats>, reassembler: &Reassembler) {
    let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
    let r = reassembler.stats();
    let (sent_m, sent_d) = (s.messages_sent, s.datagrams_sent);
    *s = r;
    s.messages_sent = sent_m;
    s.datagrams_sent = sent_d;
}

/// The session stream's QUIC send priority: above every data stream's.
const SESSION_PRIORITY: i32 = 2;

impl QuicSender {
    /// The send priority of ndd stream `stream`'s QUIC stream, given to it when it opens at
    /// the stream's first frame (the session sets it on each new connection, before any
    /// frame): quinn sends a higher priority's buffered bytes first.
    pub fn set_stream_priority(&self, stream: u16, priority: ndd_core::session::Priority) {
        use ndd_core::session::Priority;
        let p = match priority {
            Priority::High => 1,
            Priority::Normal => 0,
            Priority::Low => -1,
        };
        self.inner
            .priorities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(stream, p);
    }

    /// The peer's `max_body` (from its HELLO): larger messages are refused locally with
    /// [`LinkError::TooLargeForPeer`]. Unlimited until set.
    pub fn set_peer_max_body(&self, max_body: u32) {
        self.inner.peer_max_body.store(max_body, Ordering::Relaxed);
    }

    /// Largest QUIC datagram the path takes now (`None` if the peer does not accept
    /// datagrams). Lossy messages larger than this minus 20 are fragmented.
    pub fn max_datagram_size(&self) -> Option<usize> {
        self.inner.conn.max_datagram_size()
    }

    /// Datagram counters.
    pub fn stats(&self) -> DatagramStats {
        *self.inner.stats.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Send a message on the stream the mapping gives it: DATA (reliable) and the END of a
    /// stream that has a data stream on that data stream (END then finishes it); CLOSE after
    /// every data stream is finished and acknowledged by the peer (bounded by
    /// [`DRAIN_TIMEOUT`]); everything else on the session stream.
    pub async fn send_message(&self, msg: &Message<'_>) -> Result<()> {
        self.check_peer_limit(msg.body_len())?;
        let bytes = Bytes::from(msg.emit_to_vec()?);
        match *msg {
            Message::Data { stream, .. } => self.write_data(stream, bytes).await,
            Message::End { stream, .. } => {
                let existing = self.inner.streams.lock().await.get(&stream).cloned();
                match existing {
                    Some(s) => {
                        let mut s = s.lock().await;
                        s.write_all_chunks(&mut [bytes]).await?;
                        let _ = s.finish();
                        Ok(())
                    }
                    None => self.write_session(bytes).await,
                }
            }
            Message::Close { .. } => {
                self.drain_data_streams().await;
                self.write_session(bytes).await
            }
            _ => self.write_session(bytes).await,
        }
    }

    /// Send `frame` as a DATA message: on its ndd stream's QUIC stream when `reliable`, as
    /// QUIC datagrams (fragmented above [`QuicSender::max_datagram_size`]) when not.
    /// Datagrams are dropped by QUIC when its send buffer is full (oldest first): lossy.
    pub async fn send_frame(&self, frame: Frame, reliable: bool) -> Result<()> {
        self.check_peer_limit(frame.len().saturating_add(16))?;
        let stream = frame.meta.stream;
        let bytes = frame_to_message(frame, 0)?;
        if reliable {
            self.write_data(stream, bytes).await
        } else {
            self.send_datagrams(&bytes)
        }
    }

    fn send_datagrams(&self, message: &[u8]) -> Result<()> {
        let max = self
            .inner
            .conn
            .max_datagram_size()
            .ok_or(quinn::SendDatagramError::UnsupportedByPeer)?;
        let id = self.inner.next_datagram.fetch_add(1, Ordering::Relaxed);
        let datagrams = fragment(0, id, message, max).ok_or(LinkError::DatagramTooLarge {
            len: message.len(),
            max: max_fragmented_len(max),
        })?;
        let n = datagrams.len() as u64;
        for d in datagrams {
            self.inner.conn.send_datagram(d)?;
        }
        let mut s = self.inner.stats.lock().unwrap_or_else(|p| p.into_inner());
        s.messages_sent += 1;
        s.datagrams_sent += n;
        Ok(())
    }

    async fn write_session(&self, bytes: Bytes) -> Result<()> {
        let mut s = self.inner.session.lock().await;
        s.write_all_chunks(&mut [bytes]).await?;
        Ok(())
    }

    async fn write_data(&self, stream: u16, bytes: Bytes) -> Result<()> {
        let send = {
            let mut streams = self.inner.streams.lock().await;
            match streams.get(&stream) {
                Some(s) => Arc::clone(s),
                None => {
                    let s = self.inner.conn.open_uni().await?;
                    let p = self
                        .inner
                        .priorities
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&stream)
                        .copied()
                        .unwrap_or(0);
                    let _ = s.set_priority(p);
                    let s = Arc::new(tokio::sync::Mutex::new(s));
                    streams.insert(stream, Arc::clone(&s));
                    s
                }
            }
        };
        let mut send = send.lock().await;
        send.write_all_chunks(&mut [bytes]).await?;
        Ok(())
    }

    /// Finish every data stream and wait (at most [`DRAIN_TIMEOUT`]) until the peer has
    /// acknowledged all of it.
    async fn drain_data_streams(&self) {
        let streams: Vec<_> = self.inner.streams.lock().await.values().cloned().collect();
        let mut waits = Vec::new();
        for s in streams {
            let mut s = s.lock().await;
            let _ = s.finish();
            waits.push(s.stopped());
        }
        let all = async {
            for w in waits {
                let _ = w.await;
            }
        };
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, all).await;
    }

    /// End this side's sending: finish the data streams, wait until the peer has them, then
    /// finish the session stream. The peer's [`QuicConn::recv`] then reads everything sent
    /// and `Ok(None)`.
    pub async fn shutdown(&self) -> Result<()> {
        self.drain_data_streams().await;
        let mut s = self.inner.session.lock().await;
        let _ = s.finish();
        Ok(())
    }

    /// [`QuicSender::shutdown`], wait (at most [`DRAIN_TIMEOUT`]) until the peer has the
    /// session stream, then close the connection normally and let the endpoint send the
    /// close.
    pub async fn close(&self) {
        let _ = self.shutdown().await;
        let stopped = self.inner.session.lock().await.stopped();
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, stopped).await;
        self.inner
            .conn
            .close(quinn::VarInt::from_u32(CLOSE_NORMAL), b"");
        if let Some(endpoint) = &self.inner.endpoint {
            let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.wait_idle()).await;
        }
    }
}
