//! A pinned TLS byte tunnel: another protocol's TCP bytes (the RFB accelerator's slow leg)
//! carried with ndd's identities, TLS 1.3 configuration and `known_peers`, so they never cross
//! the network in plaintext and only pinned peers get through.
//!
//! The TLS configuration is [`crate::tls`]'s with its own ALPN id per purpose
//! (`ndd-tunnel/<purpose>`), so an `ndd run` listener and a tunnel refuse each other in the TLS
//! handshake. After TLS, both sides check the other's fingerprint; the accepting side then
//! writes one status line before any payload byte, `ok\n` or `refused: <reason>\n`, so a
//! refused peer reads why (and the command that fixes it) instead of a bare hang-up.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::{client, server, TlsAcceptor};

use crate::conn::{connect_tcp, tls_connect};
use crate::identity::Identity;
use crate::tls::{client_config, peer_fingerprint, server_config};
use crate::trust::KnownPeers;
use crate::{LinkError, Result};

/// The longest status line a tunnel client reads.
const MAX_STATUS: usize = 1024;

/// The ALPN id of a tunnel for `purpose` (e.g. `rfb`).
pub fn alpn(purpose: &str) -> Vec<u8> {
    format!("ndd-tunnel/{purpose}").into_bytes()
}

/// The accepting side's TLS configuration for tunnels of `purpose`.
pub fn tunnel_server_config(
    identity: &Identity,
    purpose: &str,
) -> Result<Arc<rustls::ServerConfig>> {
    let mut c = (*server_config(identity)?).clone();
    c.alpn_protocols = vec![alpn(purpose)];
    Ok(Arc::new(c))
}

/// The connecting side's TLS configuration for tunnels of `purpose`.
pub fn tunnel_client_config(
    identity: &Identity,
    purpose: &str,
) -> Result<Arc<rustls::ClientConfig>> {
    let mut c = (*client_config(identity)?).clone();
    c.alpn_protocols = vec![alpn(purpose)];
    Ok(Arc::new(c))
}

/// A tunnel whose peer is pinned: bytes in, bytes out.
#[derive(Debug)]
pub struct Tunnel<S> {
    /// The TLS stream (plaintext in and out).
    pub stream: S,
    /// The peer's name in `known_peers`, or its fingerprint.
    pub peer: String,
    /// The peer's address.
    pub addr: SocketAddr,
}

fn name_of(peers: &KnownPeers, fp: &str) -> String {
    peers
        .lookup(fp)
        .and_then(|t| t.name.clone())
        .unwrap_or_else(|| fp.to_string())
}

/// Accept a tunnel on `tcp`: TLS, then the peer's fingerprint against `home`'s `known_peers`
/// (re-read for every connection, so a peer trusted meanwhile gets in). An untrusted peer is
/// told why and the error names the command that would trust it.
pub async fn accept_tunnel(
    tcp: TcpStream,
    config: &Arc<rustls::ServerConfig>,
    home: &Path,
    timeout: Duration,
) -> Result<Tunnel<server::TlsStream<TcpStream>>> {
    let addr = tcp.peer_addr()?;
    let _ = tcp.set_nodelay(true);
    let run = async {
        let mut stream = TlsAcceptor::from(Arc::clone(config))
            .accept(tcp)
            .await
            .map_err(|source| LinkError::Handshake { addr, source })?;
        let fp = peer_fingerprint(stream.get_ref().1)?;
        let peers = KnownPeers::load(home)?;
        if let Err(e) = peers.verify(&fp) {
            let line = format!(
                "refused: {fp} is not in its known_peers; to let it in, run on that machine: {}\n",
                peers.trust_command(&fp)
            );
            let _ = stream.write_all(line.as_bytes()).await;
            let _ = stream.shutdown().await;
            return Err(e);
        }
        stream.write_all(b"ok\n").await?;
        stream.flush().await?;
        Ok(Tunnel {
            peer: name_of(&peers, &fp),
            stream,
            addr,
        })
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| LinkError::HandshakeTimeout { addr, timeout })?
}

/// Connect a tunnel to `addr`: TCP, TLS, the server's fingerprint against `home`'s
/// `known_peers`, then its status line.
pub async fn connect_tunnel(
    addr: &str,
    config: &Arc<rustls::ClientConfig>,
    home: &Path,
    timeout: Duration,
) -> Result<Tunnel<client::TlsStream<TcpStream>>> {
    let run = async {
        let tcp = connect_tcp(addr).await?;
        let peer_addr = tcp.peer_addr()?;
        let mut stream = tls_connect(tcp, config, peer_addr).await?;
        let fp = peer_fingerprint(stream.get_ref().1)?;
        let peers = KnownPeers::load(home)?;
        peers.verify(&fp)?;
        // The status line, a byte at a time (nothing past it may be consumed).
        let mut line = Vec::new();
        loop {
            let b = stream.read_u8().await.map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    LinkError::TunnelRefused {
                        addr: peer_addr,
                        reason: "it closed the connection without a word".into(),
                    }
                } else {
                    e.into()
                }
            })?;
            if b == b'\n' || line.len() >= MAX_STATUS {
                break;
            }
            line.push(b);
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        if line != "ok" {
            // The peer's words go to the log and to a viewer: escaped and bounded.
            let said = line.strip_prefix("refused: ").unwrap_or(&line);
            return Err(LinkError::TunnelRefused {
                addr: peer_addr,
                reason: ndd_wire::text::printable(said, ndd_wire::text::MAX_REASON),
            });
        }
        Ok(Tunnel {
            peer: name_of(&peers, &fp),
            stream,
            addr: peer_addr,
        })
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| LinkError::ConnectTimeout {
            addr: addr.to_owned(),
            timeout,
        })?
}
