//! `ndd rfb-accel`: the RFB Message Accelerator ([`ndd_rfb`]) with its viewers reached in plain
//! RFB (`--listen`), over pinned TLS tunnels (`--tls-listen`), or, on a viewer's machine, a
//! local listener whose viewers are carried over a tunnel to an accelerator next to the server
//! (`--tls-connect`). The tunnel is [`ndd_link::tunnel`]: this install's identity, TLS 1.3,
//! `known_peers`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ndd_link::tunnel::{accept_tunnel, connect_tunnel, tunnel_client_config, tunnel_server_config};
use ndd_link::KnownPeers;
use ndd_rfb::AccelOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{info, warn};

/// The tunnels' ALPN purpose.
const PURPOSE: &str = "rfb";
/// TCP connect, TLS and the trust check of one tunnel.
const TUNNEL_TIMEOUT: Duration = Duration::from_secs(15);

/// What the command line asked for (clap has checked the combinations).
#[derive(Debug)]
pub struct Plan {
    pub listen: Option<String>,
    pub tls_listen: Option<String>,
    pub server: Option<String>,
    pub tls_connect: Option<String>,
    pub home: PathBuf,
}

async fn bind(addr: &str, what: &str) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} ({what})"))
}

/// Runs until an accept fails (or the caller stops it).
pub async fn run(plan: Plan, opts: AccelOptions) -> Result<()> {
    // Trust material first: a broken home or known_peers fails here, not at the first viewer.
    let tls = plan.tls_listen.is_some() || plan.tls_connect.is_some();
    let identity = if tls {
        let id = crate::session::load_identity(&plan.home)?;
        KnownPeers::load(&plan.home).context("cannot read the pinned peers")?;
        Some(id)
    } else {
        None
    };

    if let (Some(remote), Some(identity)) = (&plan.tls_connect, &identity) {
        let listen = plan
            .listen
            .as_deref()
            .context("--tls-connect needs --listen (where the viewers connect)")?;
        let listener = bind(listen, "viewers").await?;
        let cfg = tunnel_client_config(identity, PURPOSE)?;
        eprintln!(
            "ndd rfb-accel: viewers connect to {}, carried over TLS to the accelerator at {remote} \
             (this install: {})",
            listener.local_addr()?,
            identity.fingerprint()
        );
        let home = Arc::new(plan.home.clone());
        loop {
            let (viewer, from) = listener.accept().await.context("accepting a viewer")?;
            let (cfg, remote, home) = (cfg.clone(), remote.clone(), home.clone());
            tokio::spawn(async move {
                forward(viewer, from, &remote, &cfg, &home).await;
            });
        }
    }

    let server = plan
        .server
        .context("--server (the VNC server) or --tls-connect is needed")?;
    probe_server(&server).await;
    let opts = Arc::new(opts);
    let plain = match &plan.listen {
        Some(l) => {
            let listener = bind(l, "viewers").await?;
            let at = listener.local_addr()?;
            eprintln!("ndd rfb-accel: viewers connect to {at}, forwarded to {server}");
            if !at.ip().is_loopback() {
                warn!(
                    "viewers on {at} reach the accelerator in plain RFB (no encryption, no \
                     identity); across a network use --tls-listen here and --tls-connect on \
                     the viewer's machine"
                );
            }
            Some(tokio::spawn(ndd_rfb::serve_accel(
                listener,
                server.clone(),
                (*opts).clone(),
            )))
        }
        None => None,
    };
    let tunnels = match (&plan.tls_listen, &identity) {
        (Some(t), Some(identity)) => {
            let listener = bind(t, "tunnels").await?;
            let cfg = tunnel_server_config(identity, PURPOSE)?;
            eprintln!(
                "ndd rfb-accel: pinned peers connect over TLS to {}, forwarded to {server} \
                 (this install: {})",
                listener.local_addr()?,
                identity.fingerprint()
            );
            let (home, server, opts) = (plan.home.clone(), server.clone(), opts.clone());
            Some(tokio::spawn(async move {
                loop {
                    let (tcp, from) = listener.accept().await?;
                    let (cfg, home, server, opts) =
                        (cfg.clone(), home.clone(), server.clone(), opts.clone());
                    tokio::spawn(async move {
                        match accept_tunnel(tcp, &cfg, &home, TUNNEL_TIMEOUT).await {
                            Ok(t) => {
                                let who = format!("{} ({})", t.peer, t.addr);
                                info!(peer = %who, "viewer tunnel open");
                                match ndd_rfb::accel_client(t.stream, &who, &server, &opts).await {
                                    Ok(s) => info!(
                                        peer = %who,
                                        updates = s.updates,
                                        bytes_to_viewer = s.bytes_to_client,
                                        "viewer tunnel closed"
                                    ),
                                    Err(e) => warn!(peer = %who, "viewer session ended: {e}"),
                                }
                            }
                            Err(e) => warn!("tunnel from {from} refused: {e}"),
                        }
                    });
                }
                #[allow(unreachable_code)]
                Ok::<(), std::io::Error>(())
            }))
        }
        _ => None,
    };
    let done = async {
        match (plain, tunnels) {
            (Some(a), Some(b)) => tokio::select! {
                r = a => r.map(|r| r.map_err(anyhow::Error::from)),
                r = b => r.map(|r| r.map_err(anyhow::Error::from)),
            },
            (Some(a), None) => a.await.map(|r| r.map_err(anyhow::Error::from)),
            (None, Some(b)) => b.await.map(|r| r.map_err(anyhow::Error::from)),
            (None, None) => Ok(Ok(())),
        }
    };
    done.await
        .context("the accelerator task stopped")?
        .context("accepting a viewer")
}

/// Say at start when the VNC server does not answer (it may come later: not fatal).
async fn probe_server(server: &str) {
    let probe = tokio::time::timeout(Duration::from_secs(3), async {
        let mut s = TcpStream::connect(server).await?;
        let mut v = [0u8; 4];
        s.read_exact(&mut v).await?;
        Ok::<_, std::io::Error>(v)
    })
    .await;
    match probe {
        Ok(Ok(v)) if &v == b"RFB " => {}
        Ok(Ok(v)) => warn!(
            "{server} did not greet as a VNC server does (it sent {v:?}, not \"RFB \"); viewers will fail"
        ),
        Ok(Err(e)) => warn!(
            "the VNC server at {server} does not answer ({e}); viewers are refused until it does"
        ),
        Err(_) => warn!("the VNC server at {server} did not greet within 3 s"),
    }
}

/// One viewer on this machine, carried over a tunnel; a refused tunnel is shown in the viewer.
async fn forward(
    mut viewer: TcpStream,
    from: SocketAddr,
    remote: &str,
    cfg: &Arc<ndd_link::ClientConfig>,
    home: &std::path::Path,
) {
    let _ = viewer.set_nodelay(true);
    match connect_tunnel(remote, cfg, home, TUNNEL_TIMEOUT).await {
        Ok(mut t) => {
            info!(viewer = %from, peer = %t.peer, "viewer carried over TLS to {remote}");
            match tokio::io::copy_bidirectional(&mut viewer, &mut t.stream).await {
                Ok((up, down)) => info!(
                    viewer = %from,
                    bytes_to_server = up,
                    bytes_to_viewer = down,
                    "viewer closed"
                ),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => warn!(
                    viewer = %from,
                    "the tunnel to {remote} was cut (no TLS goodbye: the accelerator stopped or \
                     the network broke); the viewer's connection is closed, it may reconnect"
                ),
                Err(e) => warn!(viewer = %from, "viewer tunnel ended: {e}"),
            }
        }
        Err(e) => {
            warn!("viewer {from} refused: no tunnel to {remote}: {e}");
            refuse_viewer(
                viewer,
                &format!("ndd rfb-accel: no tunnel to {remote}: {e}"),
            )
            .await;
        }
    }
}

/// Tell a viewer why it gets no desktop, the way an RFB 3.3 server refuses a connection
/// (version, then security type 0 and a reason the viewer shows its user).
async fn refuse_viewer(mut viewer: TcpStream, reason: &str) {
    let tell = async {
        viewer.write_all(b"RFB 003.003\n").await?;
        let mut v = [0u8; 12];
        viewer.read_exact(&mut v).await?;
        let mut m = Vec::with_capacity(8 + reason.len());
        m.extend_from_slice(&0u32.to_be_bytes());
        m.extend_from_slice(&(reason.len() as u32).to_be_bytes());
        m.extend_from_slice(reason.as_bytes());
        viewer.write_all(&m).await?;
        viewer.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), tell).await;
}
