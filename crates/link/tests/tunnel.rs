//! The pinned TLS tunnel: trusted peers exchange bytes both ways; an untrusted one is told
//! why with the command that fixes it, on both machines; an `ndd run` listener is not a
//! tunnel.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ndd_link::tunnel::{
    accept_tunnel, connect_tunnel, tunnel_client_config, tunnel_server_config, Tunnel,
};
use ndd_link::{server_config, Identity, KnownPeers, LinkError, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server;

const T: Duration = Duration::from_secs(10);

struct Home(PathBuf);

impl Home {
    fn new(name: &str) -> Home {
        let dir = std::env::temp_dir().join(format!("ndd-tunnel-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Home(dir)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn identity(home: &Home) -> Identity {
    Identity::load_or_create(&home.0).expect("identity").0
}

/// Two installs (server, client), each trusting the other as asked; a bound listener, its
/// address and the server's tunnel configuration.
struct Pair {
    server: Home,
    client: Home,
    sid: Identity,
    cid: Identity,
    listener: TcpListener,
    addr: String,
}

/// Accepts one tunnel on `listener` in a task.
fn accept_one(
    listener: TcpListener,
    scfg: Arc<ServerConfig>,
    home: PathBuf,
) -> tokio::task::JoinHandle<ndd_link::Result<Tunnel<server::TlsStream<TcpStream>>>> {
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        accept_tunnel(tcp, &scfg, &home, T).await
    })
}

/// Connects a tunnel as `cid` with `home`'s known_peers.
async fn dial(
    addr: &str,
    cid: &Identity,
    home: &std::path::Path,
) -> ndd_link::Result<Tunnel<tokio_rustls::client::TlsStream<TcpStream>>> {
    let ccfg = tunnel_client_config(cid, "rfb").expect("config");
    connect_tunnel(addr, &ccfg, home, T).await
}

async fn pair(name: &str, server_trusts: Option<&str>, client_trusts: Option<&str>) -> Pair {
    let (server, client) = (
        Home::new(&format!("{name}-server")),
        Home::new(&format!("{name}-client")),
    );
    let (sid, cid) = (identity(&server), identity(&client));
    if let Some(n) = server_trusts {
        KnownPeers::trust(
            &server.0,
            &cid.fingerprint(),
            Some(n).filter(|n| !n.is_empty()),
        )
        .expect("trust");
    }
    if let Some(n) = client_trusts {
        KnownPeers::trust(
            &client.0,
            &sid.fingerprint(),
            Some(n).filter(|n| !n.is_empty()),
        )
        .expect("trust");
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    Pair {
        server,
        client,
        sid,
        cid,
        listener,
        addr,
    }
}

#[tokio::test]
async fn trusted_peers_exchange_bytes_both_ways() {
    let Pair {
        server: sh,
        client: ch,
        sid,
        cid,
        listener,
        addr,
    } = pair("ok", Some("viewer-host"), Some("vnc-host")).await;
    let scfg = tunnel_server_config(&sid, "rfb").expect("config");
    let server_home = sh.0.clone();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut t = accept_tunnel(tcp, &scfg, &server_home, T)
            .await
            .expect("tunnel");
        assert_eq!(t.peer, "viewer-host");
        // The server speaks first (as an RFB server does), then echoes what it reads, +1.
        t.stream.write_all(b"RFB 003.008\n").await.expect("write");
        let mut b = vec![0u8; 100_000];
        t.stream.read_exact(&mut b).await.expect("read");
        for x in &mut b {
            *x = x.wrapping_add(1);
        }
        t.stream.write_all(&b).await.expect("write");
        t.stream.shutdown().await.expect("shutdown");
    });
    let ccfg = tunnel_client_config(&cid, "rfb").expect("config");
    let mut t = connect_tunnel(&addr, &ccfg, &ch.0, T)
        .await
        .expect("tunnel");
    assert_eq!(t.peer, "vnc-host");
    let mut hello = [0u8; 12];
    t.stream.read_exact(&mut hello).await.expect("hello");
    assert_eq!(&hello, b"RFB 003.008\n");
    let sent: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    t.stream.write_all(&sent).await.expect("send");
    let mut back = Vec::new();
    t.stream.read_to_end(&mut back).await.expect("read back");
    let want: Vec<u8> = sent.iter().map(|x| x.wrapping_add(1)).collect();
    assert!(
        back == want,
        "{} bytes back, not the {} sent (+1)",
        back.len(),
        want.len()
    );
    server.await.expect("server");
}

#[tokio::test]
async fn an_untrusted_client_is_told_the_command_that_trusts_it() {
    let Pair {
        server: sh,
        client: ch,
        sid,
        cid,
        listener,
        addr,
    } = pair("refuse", None, Some("")).await;
    let scfg = tunnel_server_config(&sid, "rfb").expect("config");
    let server = accept_one(listener, scfg, sh.0.clone());
    let err = dial(&addr, &cid, &ch.0).await.expect_err("refused");
    let text = err.to_string();
    assert!(matches!(err, LinkError::TunnelRefused { .. }), "{text}");
    assert!(text.contains(&cid.fingerprint()), "{text}");
    assert!(
        text.contains(&format!("ndd trust {}", cid.fingerprint())),
        "{text}"
    );
    let here = server.await.expect("server").expect_err("refused");
    assert!(matches!(here, LinkError::UnknownPeer { .. }), "{here}");
}

#[tokio::test]
async fn a_client_does_not_go_through_to_an_untrusted_server() {
    let Pair {
        server: sh,
        client: ch,
        sid,
        cid,
        listener,
        addr,
    } = pair("pin", Some(""), None).await;
    let scfg = tunnel_server_config(&sid, "rfb").expect("config");
    let _server = accept_one(listener, scfg, sh.0.clone());
    let err = dial(&addr, &cid, &ch.0).await.expect_err("refused");
    assert!(matches!(err, LinkError::UnknownPeer { .. }), "{err}");
    assert!(err.to_string().contains(&sid.fingerprint()), "{err}");
}

#[tokio::test]
async fn an_ndd_run_listener_is_not_a_tunnel() {
    let Pair {
        server: sh,
        client: ch,
        sid,
        cid,
        listener,
        addr,
    } = pair("alpn", Some(""), Some("")).await;
    // A plain ndd link configuration (ALPN ndd/1) on the accepting side.
    let scfg = server_config(&sid).expect("config");
    let _server = accept_one(listener, scfg, sh.0.clone());
    let err = dial(&addr, &cid, &ch.0).await.expect_err("no common ALPN");
    assert!(matches!(err, LinkError::Handshake { .. }), "{err}");
}

/// A trusted server whose status line is not `ok`: what it says comes back escaped (it goes
/// to the log and into the viewer's refusal), escape codes and forged lines shown as text.
#[tokio::test]
async fn a_refusal_from_the_tunnel_peer_is_escaped() {
    let Pair {
        server: _sh,
        client: ch,
        sid,
        cid,
        listener,
        addr,
    } = pair("evil", Some(""), Some("")).await;
    let scfg = tunnel_server_config(&sid, "rfb").expect("config");
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let mut s = tokio_rustls::TlsAcceptor::from(scfg)
            .accept(tcp)
            .await
            .expect("tls");
        s.write_all(b"refused: busy\x1b[2J\x1b[31m\rndd: error: forged\xe2\x80\xae\n")
            .await
            .expect("write");
        s.shutdown().await.expect("shutdown");
    });
    let err = dial(&addr, &cid, &ch.0).await.expect_err("refused");
    let text = err.to_string();
    assert!(matches!(err, LinkError::TunnelRefused { .. }), "{text}");
    assert!(
        text.contains("busy\\u{1b}[2J\\u{1b}[31m\\rndd: error: forged\\u{202e}"),
        "{text}"
    );
    assert!(!text.contains(['\x1b', '\r', '\u{202e}']), "{text}");
    server.await.expect("server");
}
