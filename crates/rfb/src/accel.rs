//! The accelerator proxy: many sessions, each a client socket proxied to the server.
//!
//! Per session, after the pass-through handshake, one task runs the paper's Algorithm 1 as a
//! readiness loop over both sockets:
//! - server readable: read what is there, delimit it with [`ServerStream`], queue it for the
//!   client; a completed update clears `unanswered`;
//! - client writable: write as much of the queue as the socket takes (streaming, never
//!   store-and-forward);
//! - client readable: input goes straight to the server queue; the client's incremental
//!   FramebufferUpdateRequest is saved;
//! - whenever no request is unanswered and everything received has been written to the client,
//!   the saved request is sent to the server again.
//!
//! At most one request is outstanding, so the proxy buffers at most one update, and input never
//! waits behind a backlog (the server queue holds only small client messages).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use ndd_core::RateLimit;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::client::{emit_set_encodings, ClientMessage, ClientMsg, ClientStream};
use crate::handshake::{self, ServerInit, Version, SEC_NONE, SEC_VNC_AUTH};
use crate::proto::{enc, encoding_supported, PixelFormat, UpdateRequest};
use crate::server::{Boundary, ServerEvent, ServerStream};
use crate::{ParseError, Peer, RfbError};

/// Settings of the accelerator.
#[derive(Debug, Clone)]
pub struct AccelOptions {
    /// Pipeline update requests (Algorithm 1). `false` makes a plain, parsing RFB proxy
    /// (useful as a control in benchmarks).
    pub accelerate: bool,
    /// Largest ClientCutText accepted from a client.
    pub max_cut_text: u64,
    /// Bytes of server data held for the client before the proxy stops reading the server.
    /// In accelerated mode one update is held at most anyway; this bounds continuous updates.
    pub max_buffered: usize,
    /// Time allowed for connecting to the server and for the whole handshake.
    pub handshake_timeout: Duration,
    /// Let clients negotiate ContinuousUpdates (TigerVNC's server push). When `false` the
    /// pseudo-encoding is dropped from SetEncodings, so every client runs client-pull through
    /// the accelerator's pipelining.
    pub continuous_updates: bool,
}

impl Default for AccelOptions {
    fn default() -> Self {
        AccelOptions {
            accelerate: true,
            max_cut_text: 16 << 20,
            max_buffered: 8 << 20,
            handshake_timeout: Duration::from_secs(60),
            continuous_updates: true,
        }
    }
}

/// Listen on `listen` and proxy every client to `server`, until an accept error.
pub async fn run_accel(listen: &str, server: &str, opts: AccelOptions) -> Result<(), RfbError> {
    let listener = TcpListener::bind(listen).await?;
    info!(listen = %listener.local_addr()?, server, accelerate = opts.accelerate, "rfb accelerator listening");
    serve_accel(listener, server.to_string(), opts).await
}

/// Serve clients from an already bound listener (tests and the benchmark bind port 0).
pub async fn serve_accel(
    listener: TcpListener,
    server: String,
    opts: AccelOptions,
) -> Result<(), RfbError> {
    let opts = Arc::new(opts);
    let ids = AtomicU64::new(0);
    let logs = Arc::new(Mutex::new(SessionLogs::default()));
    loop {
        let (client, peer) = listener.accept().await?;
        let id = ids.fetch_add(1, Ordering::Relaxed) + 1;
        let opts = opts.clone();
        let server = server.clone();
        let logs = logs.clone();
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            let r = accel_client(client, &peer.to_string(), &server, &opts).await;
            let mut logs = logs.lock().unwrap_or_else(PoisonError::into_inner);
            match r {
                Ok(stats) => {
                    if let Some(suppressed) = logs.ended.admit(Instant::now()) {
                        info!(
                            session = id,
                            %peer,
                            updates = stats.updates,
                            proxy_requests = stats.proxy_requests,
                            bytes_to_client = stats.bytes_to_client,
                            suppressed,
                            "rfb session ended"
                        )
                    }
                }
                Err(e) => {
                    if let Some(suppressed) = logs.closed.admit(Instant::now()) {
                        warn!(session = id, %peer, error = %e, suppressed, "rfb session closed")
                    }
                }
            }
        });
    }
}

/// The listener's line about each session, each kind at most five a second with the count
/// held back: whoever reaches the listener may connect and hang up at line rate.
struct SessionLogs {
    ended: RateLimit,
    closed: RateLimit,
}

impl Default for SessionLogs {
    fn default() -> Self {
        SessionLogs {
            ended: RateLimit::with_burst(Duration::from_secs(1), 5),
            closed: RateLimit::with_burst(Duration::from_secs(1), 5),
        }
    }
}

/// Per-session counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionStats {
    pub updates: u64,
    pub proxy_requests: u64,
    pub bytes_to_client: u64,
}

/// Accelerate one client already connected: any byte stream (a TCP socket, or the TLS stream
/// of an ndd tunnel), proxied to the server at `server_addr`. `peer` names the client in logs.
/// Returns when either side closes.
pub async fn accel_client<C>(
    mut client: C,
    peer: &str,
    server_addr: &str,
    opts: &AccelOptions,
) -> Result<SessionStats, RfbError>
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let setup = async {
        let mut server = TcpStream::connect(server_addr).await?;
        server.set_nodelay(true)?;
        let pf = handshake_passthrough(&mut client, &mut server).await?;
        Ok::<_, RfbError>((server, pf))
    };
    let (server, pf) = tokio::time::timeout(opts.handshake_timeout, setup)
        .await
        .map_err(|_| RfbError::Timeout("connect and handshake".into()))??;
    debug!(%peer, bits_per_pixel = pf.bits_per_pixel, "rfb handshake done");
    let mut s = Session::new(pf, opts);
    s.run(client, &server).await
}

/// Read `n` bytes from a peer, after flushing what was written to it (a TLS stream may hold
/// the last bytes the peer must see before it answers).
async fn read_n<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    n: usize,
) -> Result<Vec<u8>, RfbError> {
    s.flush().await?;
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).await?;
    Ok(b)
}

/// Relay a u32-length-prefixed reason string from `from` to `to`, returning it.
async fn relay_reason<A, B>(from: &mut A, to: &mut B) -> Result<String, RfbError>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncWrite + Unpin,
{
    let len = read_n(from, 4).await?;
    let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]).min(64 << 10);
    let text = read_n(from, n as usize).await?;
    to.write_all(&(n).to_be_bytes()).await?;
    to.write_all(&text).await?;
    to.flush().await?;
    // Relayed as it is; for the log, escaped and bounded.
    Ok(ndd_wire::text::printable_bytes(
        &text,
        ndd_wire::text::MAX_REASON,
    ))
}

fn hs_err(peer: Peer, error: ParseError) -> RfbError {
    RfbError::Malformed { peer, error }
}

/// Forward the initialisation phase; returns the server's pixel format.
async fn handshake_passthrough<C: AsyncRead + AsyncWrite + Unpin>(
    client: &mut C,
    server: &mut TcpStream,
) -> Result<PixelFormat, RfbError> {
    let sv = read_n(server, 12).await?;
    let server_version = handshake::parse_version(&sv).map_err(|e| hs_err(Peer::Server, e))?;
    client.write_all(&sv).await?;
    let cv = read_n(client, 12).await?;
    let client_version = handshake::parse_version(&cv).map_err(|e| hs_err(Peer::Client, e))?;
    server.write_all(&cv).await?;
    let version = server_version.min(client_version);

    let sec = if version == Version::V3_3 {
        let t = read_n(server, 4).await?;
        client.write_all(&t).await?;
        let t = u32::from_be_bytes([t[0], t[1], t[2], t[3]]);
        match t {
            0 => {
                let reason = relay_reason(server, client).await?;
                return Err(RfbError::Handshake(format!("server refused: {reason}")));
            }
            1 | 2 => t as u8,
            other => {
                return Err(RfbError::Handshake(format!(
                    "server chose security type {other}, which the accelerator cannot pass through"
                )))
            }
        }
    } else {
        let n = read_n(server, 1).await?[0];
        if n == 0 {
            client.write_all(&[0]).await?;
            let reason = relay_reason(server, client).await?;
            return Err(RfbError::Handshake(format!("server refused: {reason}")));
        }
        let offered = read_n(server, usize::from(n)).await?;
        let kept = handshake::filter_security_types(&offered);
        if kept.is_empty() {
            let reason = format!(
                "ndd rfb-accel: the server offers security types {offered:?}; the accelerator passes through only None (1) and VNC authentication (2)"
            );
            client.write_all(&[0]).await?;
            client
                .write_all(&(reason.len() as u32).to_be_bytes())
                .await?;
            client.write_all(reason.as_bytes()).await?;
            client.flush().await?;
            return Err(RfbError::Handshake(reason));
        }
        client.write_all(&[kept.len() as u8]).await?;
        client.write_all(&kept).await?;
        let choice = read_n(client, 1).await?[0];
        if !kept.contains(&choice) {
            return Err(RfbError::Handshake(format!(
                "client chose security type {choice}, not offered"
            )));
        }
        server.write_all(&[choice]).await?;
        choice
    };

    if sec == SEC_VNC_AUTH {
        let challenge = read_n(server, 16).await?;
        client.write_all(&challenge).await?;
        let response = read_n(client, 16).await?;
        server.write_all(&response).await?;
    }
    if sec == SEC_VNC_AUTH || (sec == SEC_NONE && version == Version::V3_8) {
        let r = read_n(server, 4).await?;
        client.write_all(&r).await?;
        if r != [0, 0, 0, 0] {
            let reason = if version == Version::V3_8 {
                relay_reason(server, client).await?
            } else {
                String::new()
            };
            return Err(RfbError::Handshake(format!(
                "authentication failed {reason}"
            )));
        }
    }

    let shared = read_n(client, 1).await?;
    server.write_all(&shared).await?;
    let fixed = read_n(server, ServerInit::FIXED_LEN).await?;
    let si = ServerInit::parse(&fixed).map_err(|e| hs_err(Peer::Server, e))?;
    if si.name_len > 1 << 20 {
        return Err(hs_err(
            Peer::Server,
            ParseError::TooLong(u64::from(si.name_len)),
        ));
    }
    let name = read_n(server, si.name_len as usize).await?;
    client.write_all(&fixed).await?;
    client.write_all(&name).await?;
    client.flush().await?;
    Ok(si.pixel_format)
}

#[derive(Debug, PartialEq, Eq)]
enum Mode {
    /// Classic client pull, accelerated by pipelining requests.
    Pipeline,
    /// The client drives requests itself (not accelerating, or continuous updates enabled).
    PassThrough,
}

struct Session {
    accelerate: bool,
    continuous_updates: bool,
    mode: Mode,
    server_stream: ServerStream,
    client_stream: ClientStream,
    to_client: BytesMut,
    to_server: BytesMut,
    /// Client messages waiting for a safe point (a SetPixelFormat and what follows it).
    held: std::collections::VecDeque<ClientMessage>,
    last_request: Option<UpdateRequest>,
    pending_full: Option<UpdateRequest>,
    unanswered: bool,
    max_buffered: usize,
    stats: SessionStats,
    events: Vec<Boundary>,
    msgs: Vec<ClientMessage>,
}

impl Session {
    fn new(pf: PixelFormat, opts: &AccelOptions) -> Self {
        Session {
            accelerate: opts.accelerate,
            continuous_updates: opts.continuous_updates,
            mode: if opts.accelerate {
                Mode::Pipeline
            } else {
                Mode::PassThrough
            },
            server_stream: ServerStream::new(pf),
            client_stream: ClientStream::new(opts.max_cut_text),
            to_client: BytesMut::with_capacity(1 << 20),
            to_server: BytesMut::with_capacity(4096),
            held: Default::default(),
            last_request: None,
            pending_full: None,
            unanswered: false,
            max_buffered: opts.max_buffered,
            stats: SessionStats::default(),
            events: Vec::new(),
            msgs: Vec::new(),
        }
    }

    async fn run<C: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        client: C,
        server: &TcpStream,
    ) -> Result<SessionStats, RfbError> {
        let (mut cr, mut cw) = tokio::io::split(client);
        let mut buf = vec![0u8; 256 << 10];
        let mut cbuf = vec![0u8; 64 << 10];
        // Bytes given to the client's stream that it may still hold (a TLS stream's records):
        // flushed as soon as nothing else is to be written.
        let mut unflushed = false;
        loop {
            self.pump();
            let read_server = self.to_client.len() < self.max_buffered;
            tokio::select! {
                biased;
                r = cr.read(&mut cbuf) => {
                    match r? {
                        0 => return Ok(self.stats),
                        n => self.on_client(&cbuf[..n])?,
                    }
                }
                r = server.writable(), if !self.to_server.is_empty() => {
                    r?;
                    match server.try_write(&self.to_server) {
                        Ok(n) => self.to_server.advance(n),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                // Write what is queued; once the queue is empty, flush.
                r = async {
                    if self.to_client.is_empty() {
                        cw.flush().await.map(|()| None)
                    } else {
                        cw.write(&self.to_client).await.map(Some)
                    }
                }, if !self.to_client.is_empty() || unflushed => {
                    match r? {
                        None => unflushed = false,
                        Some(0) => {
                            return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into())
                        }
                        Some(n) => {
                            self.to_client.advance(n);
                            self.stats.bytes_to_client += n as u64;
                            unflushed = true;
                        }
                    }
                }
                r = server.readable(), if read_server => {
                    r?;
                    match server.try_read(&mut buf) {
                        Ok(0) => {
                            self.flush_client(&mut cw).await;
                            return Ok(self.stats);
                        }
                        Ok(n) => self.on_server(&buf[..n])?,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }

    /// Best effort: the server closed; give the client what is left (5 s at most).
    async fn flush_client<W: AsyncWrite + Unpin>(&mut self, client: &mut W) {
        let rest = std::mem::take(&mut self.to_client);
        let give = async {
            client.write_all(&rest).await?;
            client.flush().await?;
            client.shutdown().await
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), give).await;
    }

    fn on_server(&mut self, data: &[u8]) -> Result<(), RfbError> {
        self.events.clear();
        self.server_stream
            .feed(data, &mut self.events)
            .map_err(|error| RfbError::Malformed {
                peer: Peer::Server,
                error,
            })?;
        self.to_client.extend_from_slice(data);
        for b in &self.events {
            if b.event == ServerEvent::UpdateEnd {
                self.stats.updates += 1;
                self.unanswered = false;
            }
        }
        Ok(())
    }

    fn on_client(&mut self, data: &[u8]) -> Result<(), RfbError> {
        let mut msgs = std::mem::take(&mut self.msgs);
        msgs.clear();
        self.client_stream
            .feed(data, &mut msgs)
            .map_err(|error| RfbError::Malformed {
                peer: Peer::Client,
                error,
            })?;
        for m in msgs.drain(..) {
            if m.msg.is_input() {
                self.to_server.extend_from_slice(&m.raw);
            } else if !self.held.is_empty() || matches!(m.msg, ClientMsg::SetPixelFormat(_)) {
                self.held.push_back(m);
            } else {
                self.control(m);
            }
        }
        self.msgs = msgs;
        Ok(())
    }

    /// A non-input client message, in order.
    fn control(&mut self, m: ClientMessage) {
        match m.msg {
            ClientMsg::SetPixelFormat(pf) => {
                self.server_stream.set_pixel_format(pf);
                self.to_server.extend_from_slice(&m.raw);
            }
            ClientMsg::SetEncodings(list) => {
                let cu = self.continuous_updates;
                let ok = |e: &i32| encoding_supported(*e) && (cu || *e != enc::CONTINUOUS_UPDATES);
                let kept: Vec<i32> = list.iter().copied().filter(ok).collect();
                if kept.len() != list.len() {
                    let dropped: Vec<i32> = list.iter().copied().filter(|e| !ok(e)).collect();
                    debug!(
                        ?dropped,
                        "SetEncodings: dropped encodings the accelerator cannot delimit"
                    );
                }
                self.to_server.extend_from_slice(&emit_set_encodings(&kept));
            }
            ClientMsg::UpdateRequest(r) => {
                if self.mode == Mode::Pipeline {
                    if !r.incremental {
                        self.pending_full = Some(r);
                    }
                    self.last_request = Some(UpdateRequest {
                        incremental: true,
                        ..r
                    });
                } else {
                    self.to_server.extend_from_slice(&m.raw);
                }
            }
            ClientMsg::EnableContinuousUpdates { enable } => {
                if enable && self.mode == Mode::Pipeline {
                    debug!("client enabled continuous updates: pipelining off");
                    self.mode = Mode::PassThrough;
                }
                self.to_server.extend_from_slice(&m.raw);
            }
            _ => self.to_server.extend_from_slice(&m.raw),
        }
    }

    /// Release held messages at a safe point, then run the accelerator's request step.
    fn pump(&mut self) {
        while let Some(front) = self.held.front() {
            if matches!(front.msg, ClientMsg::SetPixelFormat(_)) {
                // The new format applies to updates the server starts after reading it: forward
                // it only when no update is in flight or owed, so every update is parsed with the
                // format it was encoded in.
                let owed = self.mode == Mode::Pipeline && self.unanswered;
                if self.server_stream.in_update() || owed {
                    break;
                }
            }
            if let Some(m) = self.held.pop_front() {
                self.control(m);
            }
        }
        if self.accelerate
            && self.mode == Mode::Pipeline
            && !self.unanswered
            && self.held.is_empty()
            && !self.server_stream.in_update()
            && self.to_client.is_empty()
        {
            if let Some(r) = self.pending_full.take().or(self.last_request) {
                self.to_server.extend_from_slice(&r.emit());
                self.unanswered = true;
                self.stats.proxy_requests += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_core::testlog::Captured;

    /// Strangers connect to the accelerator and hang up as fast as they can, for over a
    /// second, while its server cannot be reached: at most five lines a second, and a later
    /// one says how many were not shown.
    #[tokio::test]
    async fn strangers_connecting_at_line_rate_are_five_lines_a_second() {
        let (log, _guard) = Captured::start();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        // A port nobody listens on: every session ends at once.
        let server = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let started = std::time::Instant::now();
        let strangers = async {
            let mut n = 0u32;
            while !log.counted("rfb session closed") {
                assert!(started.elapsed() < Duration::from_secs(10), "no count");
                drop(TcpStream::connect(at).await.unwrap());
                tokio::task::yield_now().await;
                n += 1;
            }
            n
        };
        let n = tokio::select! {
            r = serve_accel(listener, server, AccelOptions::default()) => panic!("{r:?}"),
            n = strangers => n,
        };
        let secs = started.elapsed().as_secs_f64().ceil() as usize;
        let lines = log.matching("rfb session");
        assert!(lines.len() <= 5 * (secs + 1), "{n} strangers: {lines:#?}");
    }

    /// A server's refusal reason goes to the viewer as it is and to the log escaped.
    #[tokio::test]
    async fn a_servers_refusal_reason_is_escaped_for_the_log() {
        let reason = b"go away\x1b[2J\nndd: error: forged";
        let mut from = Vec::new();
        from.extend_from_slice(&(reason.len() as u32).to_be_bytes());
        from.extend_from_slice(reason);
        let mut to = Vec::new();
        let text = relay_reason(&mut std::io::Cursor::new(from.clone()), &mut to)
            .await
            .unwrap();
        assert_eq!(to, from);
        assert_eq!(text, "go away\\u{1b}[2J\\nndd: error: forged");
    }
}
