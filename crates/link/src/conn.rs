//! TCP connections, with or without TLS, framed into ndd messages.
//!
//! [`listen`] / [`Listener::accept`] and [`connect`] give a [`Conn`]; [`Conn::split`] gives a
//! [`MessageReader`] and a [`MessageWriter`] that can live in different tasks.
//!
//! Framing follows `docs/protocol.md` §3: the reader checks the version and the announced body
//! length against its `max_body` as soon as the 10-byte prefix is in, before buffering the
//! body. DATA payloads are handed out as slices of the read buffer ([`bytes::Bytes`]), never
//! copied; DATA headers are written into the frame's headroom, so a frame goes out as one
//! contiguous write without copying its payload.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ndd_core::Frame;
use ndd_wire::{
    peek_message_len, DataHeader, Kind, Message, DATA_HEADER_LEN, FLAG_MORE, FLAG_RETRANSMIT,
    HEADER_LEN,
};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

use crate::tls::{peer_fingerprint, SERVER_NAME};
use crate::{LinkError, Result};

/// The receive limit a [`MessageReader`] starts with: 16 MiB of body. The session lowers or
/// raises it to the `max_body` it announces in its HELLO ([`MessageReader::set_max_body`]).
pub const DEFAULT_MAX_BODY: u32 = 16 * 1024 * 1024;

/// First byte of a TLS connection (record type "handshake"); never a valid version byte.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Smallest free space the reader offers the socket per read.
const READ_CHUNK: usize = 64 * 1024;

/// Who is on the other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's socket address.
    pub addr: SocketAddr,
    /// The peer's key fingerprint (`SHA256:…`) on a TLS connection; `None` with `--insecure`.
    /// Not yet checked against `known_peers`: that is the caller's job
    /// ([`crate::KnownPeers::verify`]).
    pub fingerprint: Option<String>,
}

/// One connection: TLS (either end) or plain TCP (`--insecure`).
#[derive(Debug)]
pub enum Conn {
    /// Mutual TLS 1.3 over TCP.
    Tls(Box<TlsStream<TcpStream>>),
    /// Plain TCP: no authentication, no encryption.
    Plain(TcpStream),
}

impl Conn {
    /// Whether this connection is encrypted and authenticated.
    pub fn is_tls(&self) -> bool {
        matches!(self, Conn::Tls(_))
    }

    /// The peer's fingerprint (`None` on plain TCP).
    pub fn peer_fingerprint(&self) -> Result<Option<String>> {
        match self {
            Conn::Tls(tls) => peer_fingerprint(tls.get_ref().1).map(Some),
            Conn::Plain(_) => Ok(None),
        }
    }

    /// The peer's socket address.
    pub fn peer_addr(&self) -> Result<SocketAddr> {
        Ok(self.tcp().peer_addr()?)
    }

    /// Our socket address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.tcp().local_addr()?)
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Tls(tls) => tls.get_ref().0,
            Conn::Plain(tcp) => tcp,
        }
    }

    /// Split into a message reader and a message writer (with `tokio::io::split`).
    pub fn split(self) -> (MessageReader, MessageWriter) {
        let tls = self.is_tls();
        // A second descriptor of the socket, to set its options once it is split.
        let socket = {
            use std::os::fd::AsFd;
            self.tcp().as_fd().try_clone_to_owned().ok()
        };
        let (read, write) = tokio::io::split(self);
        (
            MessageReader {
                inner: read,
                buf: BytesMut::new(),
                max_body: DEFAULT_MAX_BODY,
                tls,
                first: true,
            },
            MessageWriter {
                inner: write,
                scratch: Vec::new(),
                peer_max_body: u32::MAX,
                socket,
                unsent_limit: None,
            },
        )
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Tls(s) => s.is_write_vectored(),
            Conn::Plain(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A listening TCP socket.
#[derive(Debug)]
pub struct Listener {
    inner: TcpListener,
}

/// Listen on `addr` (`host:port`; port 0 picks a free port).
pub async fn listen(addr: &str) -> Result<Listener> {
    let inner = TcpListener::bind(addr)
        .await
        .map_err(|source| LinkError::Bind {
            addr: addr.to_owned(),
            source,
        })?;
    Ok(Listener { inner })
}

impl Listener {
    /// The address actually bound.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.inner.local_addr()?)
    }

    /// Accept one connection and, with `tls`, run the server side of the TLS handshake
    /// (bounded by `handshake_timeout`).
    ///
    /// A failed or timed-out handshake ([`LinkError::Handshake`],
    /// [`LinkError::HandshakeTimeout`]) concerns that connection only, which is dropped: the
    /// listener stays usable, so a caller loops and serves the next peer. Only
    /// [`LinkError::Accept`] comes from the listening socket itself.
    ///
    /// The returned fingerprint is not checked against `known_peers` yet. A server that must
    /// not let one slow peer hold up the next uses [`Listener::accept_tcp`] and runs
    /// [`secure`] for each connection concurrently.
    pub async fn accept(
        &self,
        tls: Option<&Arc<ServerConfig>>,
        handshake_timeout: Duration,
    ) -> Result<(Conn, PeerInfo)> {
        let (tcp, addr) = self.accept_tcp().await?;
        secure(tcp, addr, tls, handshake_timeout).await
    }

    /// Accept one TCP connection, nothing more (no TLS yet).
    pub async fn accept_tcp(&self) -> Result<(TcpStream, SocketAddr)> {
        let (tcp, addr) = self.inner.accept().await.map_err(LinkError::Accept)?;
        set_nodelay(&tcp);
        Ok((tcp, addr))
    }
}

/// The server side of a freshly accepted connection: with `tls`, the TLS handshake (bounded
/// by `handshake_timeout`); without, the plain stream.
pub async fn secure(
    tcp: TcpStream,
    addr: SocketAddr,
    tls: Option<&Arc<ServerConfig>>,
    handshake_timeout: Duration,
) -> Result<(Conn, PeerInfo)> {
    let Some(config) = tls else {
        tracing::debug!(%addr, "accepted plain TCP connection");
        return Ok((
            Conn::Plain(tcp),
            PeerInfo {
                addr,
                fingerprint: None,
            },
        ));
    };
    let acceptor = TlsAcceptor::from(Arc::clone(config));
    let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
        Err(_) => {
            tracing::debug!(%addr, "TLS handshake timed out");
            return Err(LinkError::HandshakeTimeout {
                addr,
                timeout: handshake_timeout,
            });
        }
        Ok(Err(source)) => {
            tracing::debug!(%addr, error = %source, "TLS handshake failed");
            return Err(LinkError::Handshake { addr, source });
        }
        Ok(Ok(stream)) => stream,
    };
    let fingerprint = peer_fingerprint(stream.get_ref().1)?;
    tracing::debug!(%addr, %fingerprint, "accepted TLS connection");
    Ok((
        Conn::Tls(Box::new(TlsStream::Server(stream))),
        PeerInfo {
            addr,
            fingerprint: Some(fingerprint),
        },
    ))
}

/// Connect to `addr` (`host:port`) and, with `tls`, run the client side of the TLS handshake;
/// `timeout` bounds both together.
///
/// The returned fingerprint is not checked against `known_peers` yet.
pub async fn connect(
    addr: &str,
    tls: Option<&Arc<ClientConfig>>,
    timeout: Duration,
) -> Result<(Conn, PeerInfo)> {
    let attempt = async {
        let tcp = connect_tcp(addr).await?;
        let peer = tcp.peer_addr()?;
        let Some(config) = tls else {
            return Ok((
                Conn::Plain(tcp),
                PeerInfo {
                    addr: peer,
                    fingerprint: None,
                },
            ));
        };
        let stream = tls_connect(tcp, config, peer).await?;
        let fingerprint = peer_fingerprint(stream.get_ref().1)?;
        tracing::debug!(addr = %peer, %fingerprint, "connected with TLS");
        Ok((
            Conn::Tls(Box::new(TlsStream::Client(stream))),
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

/// A TCP connection to `addr` (`host:port`), without Nagle's delay.
pub(crate) async fn connect_tcp(addr: &str) -> Result<TcpStream> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|source| LinkError::Connect {
            addr: addr.to_owned(),
            source,
        })?;
    set_nodelay(&tcp);
    Ok(tcp)
}

/// The client side of ndd's TLS handshake on `tcp` (to `peer`, for the error text).
pub(crate) async fn tls_connect(
    tcp: TcpStream,
    config: &Arc<ClientConfig>,
    peer: SocketAddr,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let name = ServerName::try_from(SERVER_NAME)
        .map_err(|_| rustls::Error::General(format!("invalid SNI name {SERVER_NAME}")))?;
    TlsConnector::from(Arc::clone(config))
        .connect(name, tcp)
        .await
        .map_err(|source| LinkError::Handshake { addr: peer, source })
}

fn set_nodelay(tcp: &TcpStream) {
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::warn!(%error, "cannot set TCP_NODELAY");
    }
}

pub use ndd_core::Incoming;

/// The reading half of a [`Conn`]: yields whole messages.
#[derive(Debug)]
pub struct MessageReader {
    inner: ReadHalf<Conn>,
    buf: BytesMut,
    max_body: u32,
    tls: bool,
    /// No message has been read yet.
    first: bool,
}

impl MessageReader {
    /// Largest body accepted; a message announcing more is an error before its body is read.
    pub fn set_max_body(&mut self, max_body: u32) {
        self.max_body = max_body;
    }

    /// The current receive limit.
    pub fn max_body(&self) -> u32 {
        self.max_body
    }

    /// The next message; `Ok(None)` when the peer closed the connection cleanly between two
    /// messages.
    ///
    /// Errors: bad bytes ([`LinkError::Wire`], with the wire format's text), a connection
    /// closed inside a message ([`LinkError::ClosedMidMessage`]), a TLS stream cut without
    /// close_notify ([`LinkError::TlsTruncated`]), socket errors. After an error the
    /// connection is unusable.
    ///
    /// Cancel safe: bytes already read stay buffered for the next call, so this can sit in a
    /// `tokio::select!`.
    pub async fn read(&mut self) -> Result<Option<Incoming>> {
        loop {
            if self.first && !self.tls && self.buf.first() == Some(&TLS_HANDSHAKE_RECORD) {
                return Err(LinkError::PeerSpeaksTls);
            }
            let need = match peek_message_len(&self.buf, self.max_body)? {
                Some(total) if self.buf.len() >= total => return self.take(total).map(Some),
                Some(total) => total - self.buf.len(),
                None => HEADER_LEN - self.buf.len(),
            };
            self.buf.reserve(need.max(READ_CHUNK));
            match self.inner.read_buf(&mut self.buf).await {
                Ok(0) => return self.eof(),
                Ok(_) => {}
                Err(e) if self.tls && e.kind() == io::ErrorKind::UnexpectedEof => {
                    // Inside a message, that is the error to report; between messages,
                    // the missing close_notify is.
                    self.eof()?;
                    return Err(LinkError::TlsTruncated);
                }
                Err(e) => return Err(LinkError::Io(e)),
            }
        }
    }

    /// The connection ended: clean between messages, an error inside one.
    fn eof(&self) -> Result<Option<Incoming>> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        // The prefix has been checked when it is complete, so this cannot fail; if it did,
        // report the length as unknown.
        let need = match peek_message_len(&self.buf, self.max_body) {
            Ok(Some(total)) => total,
            _ => HEADER_LEN,
        };
        Err(LinkError::ClosedMidMessage {
            got: self.buf.len(),
            need,
        })
    }

    fn take(&mut self, total: usize) -> Result<Incoming> {
        self.first = false;
        let mut msg = self.buf.split_to(total);
        if msg.get(1) == Some(&(Kind::Data as u8)) {
            let (header, _) = DataHeader::parse(&msg, self.max_body)?;
            // `parse` succeeded, so the message holds the whole 26-byte header.
            let payload = msg.split_off(DATA_HEADER_LEN).freeze();
            tracing::trace!(
                stream = header.stream_id,
                seq = header.seq,
                len = payload.len(),
                "DATA in"
            );
            return Ok(Incoming::Data { header, payload });
        }
        let (message, _) = Message::parse(&msg, self.max_body)?;
        Ok(Incoming::Other(message.to_owned_message()))
    }
}

/// The writing half of a [`Conn`].
///
/// Writes are not buffered beyond what TLS does: each call is one write of the whole message,
/// and [`MessageWriter::flush`] pushes out anything TLS still holds.
#[derive(Debug)]
pub struct MessageWriter {
    inner: WriteHalf<Conn>,
    scratch: Vec<u8>,
    peer_max_body: u32,
    /// The socket (a second descriptor of it), for [`MessageWriter::set_unsent_limit`].
    socket: Option<std::os::fd::OwnedFd>,
    /// The TCP_NOTSENT_LOWAT last set.
    unsent_limit: Option<u32>,
}

impl MessageWriter {
    /// The peer's `max_body` (from its HELLO): larger messages are refused locally with
    /// [`LinkError::TooLargeForPeer`] instead of being sent. Unlimited until set.
    pub fn set_peer_max_body(&mut self, max_body: u32) {
        self.peer_max_body = max_body;
    }

    /// At most about `bytes` of what we wrote wait unsent in the socket (TCP_NOTSENT_LOWAT):
    /// a write blocks beyond that, so what we have not written yet (the rest of a cut frame)
    /// waits in ndd, where a more urgent stream's frame can still go before it. Set again
    /// only when it changes by more than a quarter (a system call).
    pub fn set_unsent_limit(&mut self, bytes: usize) {
        let want = u32::try_from(bytes).unwrap_or(u32::MAX);
        if self
            .unsent_limit
            .is_some_and(|have| want >= have - have / 4 && want <= have + have / 4)
        {
            return;
        }
        let Some(fd) = &self.socket else { return };
        match socket2::SockRef::from(fd).set_tcp_notsent_lowat(want) {
            Ok(()) => self.unsent_limit = Some(want),
            Err(error) => {
                tracing::debug!(%error, "cannot set TCP_NOTSENT_LOWAT");
                self.socket = None;
            }
        }
    }

    /// The socket's TCP_NOTSENT_LOWAT as the kernel reports it, `None` until
    /// [`MessageWriter::set_unsent_limit`] set one.
    pub fn unsent_limit(&self) -> Result<Option<u32>> {
        match (&self.socket, self.unsent_limit) {
            (Some(fd), Some(_)) => Ok(Some(socket2::SockRef::from(fd).tcp_notsent_lowat()?)),
            _ => Ok(None),
        }
    }

    /// The peer's `max_body` (`u32::MAX` until set).
    pub fn peer_max_body(&self) -> u32 {
        self.peer_max_body
    }

    /// Send `frame` as a DATA message on stream `frame.meta.stream`. The 26-byte DATA header
    /// goes into the frame's headroom, so header and payload leave in one write without
    /// copying the payload. The message's RETRANSMIT and MORE flags are set if `flags` or
    /// `frame.meta.flags` has them; other flag bits have no place on the wire.
    pub async fn write_frame(&mut self, mut frame: Frame, flags: u16) -> Result<()> {
        let header = DataHeader {
            stream_id: frame.meta.stream,
            retransmit: (flags | frame.meta.flags) & FLAG_RETRANSMIT != 0,
            more: (flags | frame.meta.flags) & FLAG_MORE != 0,
            seq: frame.meta.seq,
            timestamp_ns: frame.meta.timestamp_ns,
        };
        let payload_len = frame.len();
        self.check_peer_limit((DATA_HEADER_LEN - HEADER_LEN) as u64 + payload_len as u64)?;
        let mut emitted = Ok(());
        frame.push_header_with(DATA_HEADER_LEN, |buf| {
            emitted = header.emit(payload_len, buf);
        });
        emitted?;
        let bytes = frame.into_bytes();
        tracing::trace!(
            stream = header.stream_id,
            seq = header.seq,
            len = payload_len,
            "DATA out"
        );
        self.inner.write_all(&bytes).await?;
        Ok(())
    }

    /// Send a DATA message whose payload stays where it is (a frame kept for resending):
    /// the 26-byte header and the payload leave in vectored writes, without copying the
    /// payload (TLS still copies it once, into the records it encrypts).
    pub async fn write_data(&mut self, header: &DataHeader, payload: &[u8]) -> Result<()> {
        self.check_peer_limit((DATA_HEADER_LEN - HEADER_LEN) as u64 + payload.len() as u64)?;
        let mut head = [0u8; DATA_HEADER_LEN];
        header.emit(payload.len(), &mut head)?;
        tracing::trace!(
            stream = header.stream_id,
            seq = header.seq,
            len = payload.len(),
            "DATA out"
        );
        let (mut a, mut b): (&[u8], &[u8]) = (&head, payload);
        while !a.is_empty() || !b.is_empty() {
            let n = self
                .inner
                .write_vectored(&[io::IoSlice::new(a), io::IoSlice::new(b)])
                .await?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero).into());
            }
            let from_a = n.min(a.len());
            a = &a[from_a..];
            b = &b[n - from_a..];
        }
        Ok(())
    }

    /// Send any message (CONTROL, HELLO, …; a DATA message too, copying its payload).
    pub async fn write_message(&mut self, msg: &Message<'_>) -> Result<()> {
        self.check_peer_limit(msg.body_len() as u64)?;
        self.scratch.clear();
        msg.emit_append(&mut self.scratch)?;
        self.inner.write_all(&self.scratch).await?;
        if self.scratch.capacity() > READ_CHUNK {
            // Do not keep a large buffer around for one large message.
            self.scratch = Vec::new();
        }
        Ok(())
    }

    /// Push out anything still held (TLS records).
    pub async fn flush(&mut self) -> Result<()> {
        self.inner.flush().await?;
        Ok(())
    }

    /// Flush and close the sending direction: TLS sends close_notify, then TCP sends FIN.
    /// The peer's reader then sees a clean end (`Ok(None)`).
    pub async fn shutdown(&mut self) -> Result<()> {
        self.inner.shutdown().await?;
        Ok(())
    }

    fn check_peer_limit(&self, body_len: u64) -> Result<()> {
        if body_len > u64::from(self.peer_max_body) {
            return Err(LinkError::TooLargeForPeer {
                len: body_len,
                max: self.peer_max_body,
            });
        }
        Ok(())
    }
}

/// Decode one whole message held in `msg` (a datagram's reassembled message or a message
/// read from a QUIC stream) into an [`Incoming`]; DATA payloads are slices of `msg`. Bytes
/// after the message are an error ([`ndd_wire::WireError::TrailingBytes`]).
pub(crate) fn decode_message(msg: Bytes, max_body: u32) -> Result<Incoming> {
    let total = match peek_message_len(&msg, max_body)? {
        Some(total) => total,
        None => {
            return Err(ndd_wire::WireError::Truncated {
                need: HEADER_LEN,
                have: msg.len(),
            }
            .into())
        }
    };
    if total != msg.len() {
        if total > msg.len() {
            return Err(ndd_wire::WireError::Truncated {
                need: total,
                have: msg.len(),
            }
            .into());
        }
        return Err(ndd_wire::WireError::TrailingBytes {
            extra: msg.len() - total,
        }
        .into());
    }
    if msg.get(1) == Some(&(Kind::Data as u8)) {
        let (header, _) = DataHeader::parse(&msg, max_body)?;
        return Ok(Incoming::Data {
            header,
            payload: msg.slice(DATA_HEADER_LEN..),
        });
    }
    let (message, _) = Message::parse(&msg, max_body)?;
    Ok(Incoming::Other(message.to_owned_message()))
}

/// The bytes of `frame` as one DATA message (header written into its headroom, payload not
/// copied when there is headroom). Used by the datagram and QUIC links.
pub(crate) fn frame_to_message(frame: Frame, flags: u16) -> Result<Bytes> {
    Ok(data_frame(frame, flags)?.into_bytes())
}

/// `frame` with its DATA header written into its headroom: the whole message.
pub(crate) fn data_frame(mut frame: Frame, flags: u16) -> Result<Frame> {
    let header = DataHeader {
        stream_id: frame.meta.stream,
        retransmit: (flags | frame.meta.flags) & FLAG_RETRANSMIT != 0,
        more: (flags | frame.meta.flags) & FLAG_MORE != 0,
        seq: frame.meta.seq,
        timestamp_ns: frame.meta.timestamp_ns,
    };
    let payload_len = frame.len();
    let mut emitted = Ok(());
    frame.push_header_with(DATA_HEADER_LEN, |buf| {
        emitted = header.emit(payload_len, buf);
    });
    emitted?;
    Ok(frame)
}
