//! `ndd rfb-accel`: the RFB Message Accelerator ([`ndd_rfb`]) with its viewers reached in plain
//! RFB (`--listen`), over pinned TLS tunnels (`--tls-listen`), or, on a viewer's machine, a
//! local listener whose viewers are carried over a tunnel to an accelerator next to the server
//! (`--tls-connect`). The tunnel is [`ndd_link::tunnel`]: this install's identity, TLS 1.3,
//! `known_peers`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ndd_core::RateLimit;
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

/// What a line about one connection says.
#[derive(Debug, Clone, Copy)]
enum Said {
    /// A tunnel or a viewer refused.
    Refused,
    /// A tunnel or a viewer's carriage open.
    Opened,
    /// Either ended.
    Ended,
}

/// The lines about connections, each kind at most five a second with the count held back:
/// whoever reaches a listener may connect and hang up at line rate.
#[derive(Clone)]
struct ConnLogs(Arc<Mutex<[RateLimit; 3]>>);

impl Default for ConnLogs {
    fn default() -> Self {
        let limit = || RateLimit::with_burst(Duration::from_secs(1), 5);
        ConnLogs(Arc::new(Mutex::new([limit(), limit(), limit()])))
    }
}

impl ConnLogs {
    /// `Some(suppressed)` when a line of this kind may be written now.
    fn admit(&self, kind: Said) -> Option<u64> {
        let mut l = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        l[kind as usize].admit(Instant::now())
    }
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
        return carry_viewers(listener, remote.clone(), cfg, Arc::new(plan.home.clone())).await;
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
            Some(tokio::spawn(serve_tunnels(
                listener, cfg, home, server, opts,
            )))
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

/// The accelerator's side of the tunnels: each pinned peer's viewer to `server`, until an
/// accept fails.
async fn serve_tunnels(
    listener: TcpListener,
    cfg: Arc<ndd_link::ServerConfig>,
    home: PathBuf,
    server: String,
    opts: Arc<AccelOptions>,
) -> std::io::Result<()> {
    let logs = ConnLogs::default();
    loop {
        let (tcp, from) = listener.accept().await?;
        let (cfg, home, server, opts, logs) = (
            cfg.clone(),
            home.clone(),
            server.clone(),
            opts.clone(),
            logs.clone(),
        );
        tokio::spawn(async move {
            match accept_tunnel(tcp, &cfg, &home, TUNNEL_TIMEOUT).await {
                Ok(t) => {
                    let who = format!("{} ({})", t.peer, t.addr);
                    if let Some(suppressed) = logs.admit(Said::Opened) {
                        info!(peer = %who, suppressed, "viewer tunnel open");
                    }
                    let r = ndd_rfb::accel_client(t.stream, &who, &server, &opts).await;
                    let Some(suppressed) = logs.admit(Said::Ended) else {
                        return;
                    };
                    match r {
                        Ok(s) => info!(
                            peer = %who,
                            updates = s.updates,
                            bytes_to_viewer = s.bytes_to_client,
                            suppressed,
                            "viewer tunnel closed"
                        ),
                        Err(e) => warn!(peer = %who, suppressed, "viewer session ended: {e}"),
                    }
                }
                Err(e) => {
                    if let Some(suppressed) = logs.admit(Said::Refused) {
                        warn!(suppressed, "tunnel from {from} refused: {e}")
                    }
                }
            }
        });
    }
}

/// The viewer's side: each viewer on `listener` carried over a tunnel to `remote`, until an
/// accept fails.
async fn carry_viewers(
    listener: TcpListener,
    remote: String,
    cfg: Arc<ndd_link::ClientConfig>,
    home: Arc<PathBuf>,
) -> Result<()> {
    let logs = ConnLogs::default();
    loop {
        let (viewer, from) = listener.accept().await.context("accepting a viewer")?;
        let (cfg, remote, home, logs) = (cfg.clone(), remote.clone(), home.clone(), logs.clone());
        tokio::spawn(async move {
            forward(viewer, from, &remote, &cfg, &home, &logs).await;
        });
    }
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
    logs: &ConnLogs,
) {
    let _ = viewer.set_nodelay(true);
    match connect_tunnel(remote, cfg, home, TUNNEL_TIMEOUT).await {
        Ok(mut t) => {
            if let Some(suppressed) = logs.admit(Said::Opened) {
                info!(viewer = %from, peer = %t.peer, suppressed, "viewer carried over TLS to {remote}");
            }
            let r = tokio::io::copy_bidirectional(&mut viewer, &mut t.stream).await;
            let Some(suppressed) = logs.admit(Said::Ended) else {
                return;
            };
            match r {
                Ok((up, down)) => info!(
                    viewer = %from,
                    bytes_to_server = up,
                    bytes_to_viewer = down,
                    suppressed,
                    "viewer closed"
                ),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => warn!(
                    viewer = %from,
                    suppressed,
                    "the tunnel to {remote} was cut (no TLS goodbye: the accelerator stopped or \
                     the network broke); the viewer's connection is closed, it may reconnect"
                ),
                Err(e) => warn!(viewer = %from, suppressed, "viewer tunnel ended: {e}"),
            }
        }
        Err(e) => {
            if let Some(suppressed) = logs.admit(Said::Refused) {
                warn!(
                    suppressed,
                    "viewer {from} refused: no tunnel to {remote}: {e}"
                );
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_core::testlog::Captured;

    fn home(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ndd-rfbaccel-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Connects to `at` and hangs up, as fast as it can, until a line with `what` says how
    /// many like it were not shown (10 s at most); then at most five lines a second.
    async fn strangers_until_counted(log: &Captured, at: SocketAddr, what: &str) {
        let started = Instant::now();
        let mut n = 0u32;
        while !log.counted(what) {
            assert!(started.elapsed() < Duration::from_secs(10), "no count");
            drop(TcpStream::connect(at).await.unwrap());
            tokio::task::yield_now().await;
            n += 1;
        }
        let secs = started.elapsed().as_secs_f64().ceil() as usize;
        let lines = log.matching(what);
        assert!(lines.len() <= 5 * (secs + 1), "{n} strangers: {lines:#?}");
    }

    /// Strangers at the accelerator's tunnel listener (no TLS at all) for over a second.
    #[tokio::test]
    async fn strangers_at_the_tunnel_listener_are_five_lines_a_second() {
        let (log, _guard) = Captured::start();
        let h = home("tunnels");
        let (id, _) = ndd_link::Identity::load_or_create(&h).unwrap();
        let cfg = tunnel_server_config(&id, PURPOSE).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let serve = serve_tunnels(
            listener,
            cfg,
            h.clone(),
            "127.0.0.1:9".into(),
            Arc::new(AccelOptions::default()),
        );
        tokio::select! {
            r = serve => panic!("{r:?}"),
            () = strangers_until_counted(&log, at, "refused") => {}
        }
        let _ = std::fs::remove_dir_all(&h);
    }

    /// Strangers at a viewer listener whose accelerator cannot be reached, for over a second.
    #[tokio::test]
    async fn strangers_at_the_viewer_listener_are_five_lines_a_second() {
        let (log, _guard) = Captured::start();
        let h = home("viewers");
        let (id, _) = ndd_link::Identity::load_or_create(&h).unwrap();
        let cfg = tunnel_client_config(&id, PURPOSE).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        // A port nobody listens on.
        let remote = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let serve = carry_viewers(listener, remote, cfg, Arc::new(h.clone()));
        tokio::select! {
            r = serve => panic!("{r:?}"),
            () = strangers_until_counted(&log, at, "refused: no tunnel") => {}
        }
        let _ = std::fs::remove_dir_all(&h);
    }
}
