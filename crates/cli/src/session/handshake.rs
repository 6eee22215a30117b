//! Establishing a link: connecting with backoff or accepting, the trust check and the
//! HELLO/READY handshake (docs/protocol.md §5).

use super::transport::{Rx, Tx};
use super::{close_msg, Tls};
use anyhow::{anyhow, Result};
use ndd_link::{Incoming, KnownPeers, Listener, PeerInfo, QuicListener};
use ndd_wire::{CloseCode, Message, OwnedMessage, WireError};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What every handshake needs, shared by the first connection and every reconnect.
pub(super) struct Ctx {
    pub hello: ndd_wire::HelloRepr,
    pub max_body: u32,
    pub tls: Option<Arc<Tls>>,
    pub home: PathBuf,
    pub timeout: Duration,
    pub side: crate::config::SideName,
    pub max_backoff: Duration,
}

/// A link that passed the handshake.
pub(super) struct Established {
    pub rx: Rx,
    pub tx: Tx,
    pub peer: String,
}

/// Where links come from: a listener we accept on, or an address we connect to.
pub(super) enum Connector {
    Listen(Listener),
    Connect(String),
    QuicListen(QuicListener),
    QuicConnect(String),
    /// UDP has no connections: the listening side binds afresh for every session.
    UdpListen(String),
    UdpConnect(String),
}

/// Connection errors worth retrying while the peer may still be starting or is coming back.
fn retryable(e: &ndd_link::LinkError) -> bool {
    matches!(
        e,
        ndd_link::LinkError::Connect { .. }
            | ndd_link::LinkError::ConnectTimeout { .. }
            | ndd_link::LinkError::Handshake { .. }
            | ndd_link::LinkError::HandshakeTimeout { .. }
            | ndd_link::LinkError::Io(_)
            | ndd_link::LinkError::QuicConnect { .. }
            | ndd_link::LinkError::QuicHandshake { .. }
            | ndd_link::LinkError::QuicConnection { .. }
    )
}

impl Connector {
    /// The next link. The first connection gives up on the connect timeout and on any fatal
    /// handshake error (mismatch, untrusted); later ones (reconnects) keep trying, with
    /// capped exponential backoff and jitter, and only log what goes wrong.
    pub(super) async fn establish(&self, ctx: &Ctx, first: bool) -> Result<Established> {
        let side = ctx.side;
        match self {
            Connector::QuicConnect(addr) | Connector::UdpConnect(addr) => {
                let deadline = Instant::now() + ctx.timeout;
                let mut backoff = Duration::from_millis(20);
                loop {
                    let attempt = async {
                        let garbage = |e: ndd_link::LinkError| HandshakeError::Garbage(anyhow!(e));
                        let (rx, tx, info) = match self {
                            Connector::QuicConnect(_) => {
                                let Some(tls) = ctx.tls.as_ref() else {
                                    return Err(HandshakeError::Fatal(anyhow!(
                                        "QUIC needs TLS identities: it cannot run with --insecure"
                                    )));
                                };
                                let (c, info) =
                                    ndd_link::quic_connect(addr, &tls.identity, ctx.timeout)
                                        .await
                                        .map_err(garbage)?;
                                let s = c.sender();
                                (Rx::Quic(c), Tx::Quic(s), info)
                            }
                            _ => {
                                let u = ndd_link::udp_connect(addr).await.map_err(garbage)?;
                                let s = u.sender();
                                let addr = s.peer_addr().ok_or_else(|| {
                                    HandshakeError::Fatal(anyhow!(
                                        "UDP link without a peer address"
                                    ))
                                })?;
                                (
                                    Rx::Udp(u),
                                    Tx::Udp(s),
                                    PeerInfo {
                                        addr,
                                        fingerprint: None,
                                    },
                                )
                            }
                        };
                        handshake(rx, tx, info, ctx).await
                    };
                    match attempt.await {
                        Ok(e) => return Ok(e),
                        Err(HandshakeError::Fatal(e)) if first => return Err(e),
                        Err(e) => {
                            let e = e.into_inner();
                            if first && Instant::now() + backoff >= deadline {
                                return Err(e.context(format!("cannot connect to {addr}")));
                            }
                            tracing::debug!(%addr, error = %format!("{e:#}"), "connect failed; retrying");
                        }
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(ctx.max_backoff);
                }
            }
            Connector::QuicListen(l) => loop {
                let (c, info) = match l.accept(ctx.timeout).await {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("ndd [{side}]: rejected a connection: {e}");
                        continue;
                    }
                };
                let s = c.sender();
                match handshake(Rx::Quic(c), Tx::Quic(s), info, ctx).await {
                    Ok(x) => return Ok(x),
                    Err(HandshakeError::Garbage(e)) => {
                        eprintln!("ndd [{side}]: rejected a connection: {e:#}")
                    }
                    Err(HandshakeError::Fatal(e)) if first => return Err(e),
                    Err(HandshakeError::Fatal(e)) => {
                        eprintln!("ndd [{side}]: refused a connection: {e:#}")
                    }
                }
            },
            Connector::UdpListen(addr) => loop {
                let u = ndd_link::udp_bind(addr)
                    .await
                    .map_err(|e| anyhow!(e).context(format!("cannot bind UDP {addr}")))?;
                let s = u.sender();
                let local = u.local_addr().map_err(|e| anyhow!(e))?;
                let info = PeerInfo {
                    addr: local,
                    fingerprint: None,
                };
                // Wait as long as it takes for a peer's HELLO (bounded per attempt).
                match handshake(Rx::Udp(u), Tx::Udp(s), info, ctx).await {
                    Ok(x) => return Ok(x),
                    Err(HandshakeError::Garbage(e)) => {
                        tracing::debug!(error = %format!("{e:#}"), "no UDP peer yet")
                    }
                    Err(HandshakeError::Fatal(e)) if first => return Err(e),
                    Err(HandshakeError::Fatal(e)) => {
                        eprintln!("ndd [{side}]: refused a peer: {e:#}")
                    }
                }
            },
            Connector::Connect(addr) => {
                let deadline = Instant::now() + ctx.timeout;
                let mut backoff = Duration::from_millis(20);
                let mut n: u64 = 0;
                loop {
                    n += 1;
                    let tls = ctx.tls.as_ref().map(|t| &t.client);
                    let err = match ndd_link::connect(addr, tls, ctx.timeout).await {
                        Ok((conn, info)) => match split_tcp(conn, info, ctx).await {
                            Ok(e) => return Ok(e),
                            Err(HandshakeError::Fatal(e)) if first => return Err(e),
                            Err(e) => e.into_inner(),
                        },
                        Err(e) if retryable(&e) => anyhow!(e),
                        Err(e) if first => {
                            return Err(anyhow!(e).context(format!("cannot connect to {addr}")))
                        }
                        Err(e) => anyhow!(e),
                    };
                    if first && Instant::now() + backoff >= deadline {
                        return Err(err.context(format!("cannot connect to {addr}")));
                    }
                    tracing::debug!(%addr, error = %format!("{err:#}"), "connect failed; retrying");
                    // ±20 % jitter so many clients do not retry in step.
                    let jitter = 0.8
                        + 0.4
                            * ((crate::session::wall_ns() ^ n.wrapping_mul(0x9e37_79b9)) % 1000)
                                as f64
                            / 1000.0;
                    tokio::time::sleep(backoff.mul_f64(jitter)).await;
                    backoff = (backoff * 2).min(ctx.max_backoff);
                }
            }
            Connector::Listen(listener) => loop {
                let tls = ctx.tls.as_ref().map(|t| &t.server);
                let (conn, info) = match listener.accept(tls, ctx.timeout).await {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("ndd [{side}]: rejected a connection: {e}");
                        continue;
                    }
                };
                match split_tcp(conn, info, ctx).await {
                    Ok(x) => return Ok(x),
                    Err(HandshakeError::Garbage(e)) => {
                        eprintln!("ndd [{side}]: rejected a connection: {e:#}");
                    }
                    Err(HandshakeError::Fatal(e)) if first => return Err(e),
                    Err(HandshakeError::Fatal(e)) => {
                        eprintln!("ndd [{side}]: refused a connection: {e:#}");
                    }
                }
            },
        }
    }
}

/// Why a handshake failed: garbage from something that is not an ndd peer (the listener
/// goes on serving), or a real peer we cannot work with (fatal, reported on both sides).
pub(super) enum HandshakeError {
    Garbage(anyhow::Error),
    Fatal(anyhow::Error),
}

impl HandshakeError {
    pub(super) fn into_inner(self) -> anyhow::Error {
        match self {
            HandshakeError::Garbage(e) | HandshakeError::Fatal(e) => e,
        }
    }
}

async fn split_tcp(
    conn: ndd_link::Conn,
    info: PeerInfo,
    ctx: &Ctx,
) -> std::result::Result<Established, HandshakeError> {
    let (r, w) = conn.split();
    handshake(Rx::Tcp(r), Tx::Tcp(w), info, ctx).await
}

/// Runs the handshake on a fresh connection: trust, HELLO, READY.
pub(super) async fn handshake(
    rx: Rx,
    tx: Tx,
    info: PeerInfo,
    ctx: &Ctx,
) -> std::result::Result<Established, HandshakeError> {
    use HandshakeError::{Fatal, Garbage};
    let hello = &ctx.hello;
    let home = ctx.home.as_path();
    let timeout = ctx.timeout;
    let tls = ctx.tls.as_deref();
    // Reloaded on every connection: a peer trusted meanwhile is admitted on reconnect.
    let known = match tls {
        Some(_) => Some(KnownPeers::load(home).map_err(|e| {
            Fatal(anyhow!(e).context(format!("cannot read known_peers in {}", home.display())))
        })?),
        None => None,
    };
    let known = known.as_ref();
    let (mut reader, mut writer) = (rx, tx);
    reader.set_max_body(ctx.max_body);
    let home_arg = format!(" --home {}", home.display());
    // Trust: pinned fingerprints.
    let peer_name = match (tls, known, &info.fingerprint) {
        (Some(tls), Some(known), Some(fp)) => match known.lookup(fp) {
            Some(t) => t.name.clone().unwrap_or_else(|| fp.clone()),
            None => {
                // Told to the refused peer, about itself: its own fingerprint and how we would
                // come to trust it.
                let reason = format!(
                    "this install ({fp}) is not trusted by the peer ({}); on the peer's machine run: ndd trust {fp}",
                    tls.identity.fingerprint()
                );
                let _ = writer
                    .write_message(&close_msg(CloseCode::UntrustedPeer, &reason).as_message())
                    .await;
                let _ = writer.flush().await;
                let _ = writer.shutdown().await;
                return Err(Fatal(anyhow!(
                    "refused untrusted peer {} with fingerprint {fp}; if you trust it, run: ndd trust {fp}{home_arg}",
                    info.addr
                )));
            }
        },
        _ => info.addr.to_string(),
    };
    // A UDP listener learns its peer from the first datagram: it can only answer after that.
    let udp_listener = matches!(&writer, Tx::Udp(s) if s.peer_addr().is_none());
    let early = if udp_listener {
        Some(reader.read().await)
    } else {
        None
    };
    let send = async {
        writer.write_message(&Message::Hello(hello.clone())).await?;
        writer.flush().await
    };
    send.await
        .map_err(|e| Garbage(anyhow!(e).context("sending HELLO")))?;
    let first = match early {
        Some(r) => r,
        None => tokio::time::timeout(timeout, reader.read())
            .await
            .map_err(|_| {
                Garbage(anyhow!(
                    "{}: no HELLO within {} ms",
                    info.addr,
                    timeout.as_millis()
                ))
            })?,
    };
    let theirs = match first {
        Ok(Some(Incoming::Other(OwnedMessage::Hello(h)))) => h,
        Ok(Some(Incoming::Other(OwnedMessage::Close { code, reason }))) => {
            return Err(Fatal(anyhow!(
                "the peer refused the session ({code}): {reason}"
            )));
        }
        Ok(Some(_)) => {
            return Err(Garbage(anyhow!(
                "{}: the first message was not a HELLO",
                info.addr
            )))
        }
        Ok(None) => {
            return Err(Garbage(anyhow!(
                "{}: closed the connection before its HELLO",
                info.addr
            )))
        }
        Err(e) => {
            // A first byte that could be a future version of ours is a version mismatch;
            // anything else (an HTTP request, random bytes) is just not an ndd.
            if let ndd_link::LinkError::Wire(WireError::UnknownVersion {
                got: got @ 2..=15,
                expected,
            }) = &e
            {
                let reason = format!(
                    "peer speaks protocol version {got}, this side speaks version {expected}"
                );
                let _ = writer
                    .write_message(&close_msg(CloseCode::VersionMismatch, &reason).as_message())
                    .await;
                let _ = writer.flush().await;
                return Err(Fatal(anyhow!(reason)));
            }
            return Err(Garbage(
                anyhow!(e).context(format!("{}: bad handshake", info.addr)),
            ));
        }
    };
    writer.set_peer_max_body(theirs.max_body);
    if let Err(m) = ndd_wire::compare_hello(hello, &theirs) {
        let reason = m.to_string();
        let _ = writer
            .write_message(&close_msg(CloseCode::StackMismatch, &reason).as_message())
            .await;
        let _ = writer.flush().await;
        let _ = writer.shutdown().await;
        return Err(Fatal(anyhow!(reason)));
    }
    let ready = async {
        writer.write_message(&Message::Ready).await?;
        writer.flush().await
    };
    ready
        .await
        .map_err(|e| Fatal(anyhow!(e).context("sending READY")))?;
    match tokio::time::timeout(timeout, reader.read()).await {
        Ok(Ok(Some(Incoming::Other(OwnedMessage::Ready)))) => Ok(Established {
            rx: reader,
            tx: writer,
            peer: peer_name,
        }),
        Ok(Ok(Some(Incoming::Other(OwnedMessage::Close { code, reason })))) => Err(Fatal(anyhow!(
            "the peer refused the session ({code}): {reason}"
        ))),
        Ok(Ok(Some(_))) => Err(Fatal(anyhow!(
            "the peer sent something else than READY after HELLO"
        ))),
        Ok(Ok(None)) => Err(Fatal(anyhow!(
            "the peer closed the connection during the handshake"
        ))),
        Ok(Err(e)) => Err(Fatal(anyhow!(e).context("handshake"))),
        Err(_) => Err(Fatal(anyhow!(
            "the peer did not confirm the handshake within {} ms",
            timeout.as_millis()
        ))),
    }
}
