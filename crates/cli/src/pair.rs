//! `ndd pair`: the driver of the sans-IO pairing exchange ([`ndd_link::pair`]) over TCP. One
//! machine shows a code and listens; the other types it and connects; each writes the other's
//! fingerprint into its `known_peers`.

use anyhow::{anyhow, bail, Context, Result};
use ndd_link::pair::{Exchange, Offer, PairError, Peer, Role, Signer, CODE_LIFETIME, TRIES};
use ndd_wire::text::printable;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// The port `ndd pair` listens on and connects to unless told otherwise.
pub const PORT: u16 = 7870;

/// How long the joining side tries to reach the offering one.
const CONNECT_WAIT: Duration = Duration::from_secs(5);

/// This install's signer: its identity and the name it suggests (the host name).
fn signer(home: &Path) -> Result<Signer> {
    let id = crate::session::load_identity(home)?;
    let id = ndd_link::seal::LocalIdentity::new(&id)
        .map_err(|e| anyhow!("cannot sign with the identity in {}: {e}", home.display()))?;
    Ok(Signer {
        id,
        name: host_name(),
    })
}

/// This machine's host name (what a peer remembers it by unless told otherwise).
fn host_name() -> String {
    let n = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let n = safe_name(n.trim().as_bytes());
    if n.is_empty() {
        "ndd-peer".into()
    } else {
        n
    }
}

/// A name from the network as `known_peers` may hold it: letters, digits, `.`, `_`, `-`, at
/// most 32; anything else becomes `_`.
pub fn safe_name(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .chars()
        .take(32)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes `peer` into `home`'s known_peers and says so.
fn trust(home: &Path, peer: &Peer, name: Option<&str>) -> Result<()> {
    let name = match name {
        Some(n) => n.to_string(),
        None => match safe_name(&peer.name) {
            n if n.is_empty() => "paired-peer".into(),
            n => n,
        },
    };
    let added = ndd_link::KnownPeers::trust(home, &peer.fingerprint, Some(&name))
        .with_context(|| format!("cannot update known_peers in {}", home.display()))?;
    let file = home.join(ndd_link::KNOWN_PEERS_FILE);
    if added {
        println!(
            "paired: trusted {} ({name}) in {}",
            peer.fingerprint,
            file.display()
        );
    } else {
        println!(
            "paired: {} was already trusted in {}",
            peer.fingerprint,
            file.display()
        );
    }
    Ok(())
}

/// Runs one exchange over `stream` to its end.
async fn drive(stream: &mut TcpStream, x: &mut Exchange) -> Result<Peer, PairError> {
    let mut buf = vec![0u8; 4096];
    loop {
        while let Some(m) = x.poll_transmit() {
            if stream.write_all(&m).await.is_err() {
                x.handle_closed();
            }
        }
        if let Some(end) = x.end() {
            let _ = stream.shutdown().await;
            return end.clone();
        }
        let deadline = x
            .poll_timeout()
            .map(Instant::from_std)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
        tokio::select! {
            r = stream.read(&mut buf) => match r {
                Ok(0) | Err(_) => x.handle_closed(),
                Ok(n) => x.handle_data(std::time::Instant::now(), &buf[..n]),
            },
            _ = tokio::time::sleep_until(deadline) => x.handle_timeout(std::time::Instant::now()),
        }
    }
}

/// Shows a fresh code and pairs with the first machine that types it.
pub async fn offer(listen: &str, home: &Path, name: Option<&str>) -> Result<i32> {
    let me = signer(home)?;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} for pairing"))?;
    let local = listener.local_addr()?;
    let code = ndd_link::pair::new_code();
    let mut offer = Offer::new(&code, std::time::Instant::now()).map_err(|e| anyhow!("{e}"))?;
    let port = if local.port() == PORT {
        String::new()
    } else {
        format!(":{}", local.port())
    };
    let hosts = if local.ip().is_unspecified() {
        local_addresses()
    } else {
        vec![local.ip().to_string()]
    };
    println!(
        "pairing code: {code}   (valid {} min, {TRIES} wrong tries)",
        CODE_LIFETIME.as_secs() / 60
    );
    println!("on the other machine, type:");
    if hosts.is_empty() {
        println!("  ndd pair {code} --connect THIS_HOST{port}");
    }
    for h in &hosts {
        println!("  ndd pair {code} --connect {h}{port}");
    }
    // Announced on the LAN (not on loopback): `ndd pair CODE` there finds this machine
    // without --connect. The code itself is never announced.
    let _announced = if local.ip().is_loopback() {
        None
    } else {
        let fp = signer_fingerprint(home);
        let side = crate::discover::this_side("pairing", "offer", "tcp", fp);
        match crate::discover::announce_as(
            crate::discover::PAIR_SERVICE,
            &side,
            local.ip(),
            local.port(),
        ) {
            Ok(a) => {
                println!(
                    "announced on the local network: `ndd pair {code}` there finds this machine"
                );
                Some(a)
            }
            Err(e) => {
                tracing::debug!(error = %e, "pairing not announced on the local network");
                None
            }
        }
    };
    println!("waiting on {local} (Ctrl-C stops)");
    let expires = Instant::from_std(offer.expires());
    loop {
        let (mut stream, from) = tokio::select! {
            a = listener.accept() => a.context("accepting a pairing connection")?,
            _ = tokio::time::sleep_until(expires) => bail!("{}", PairError::Expired),
            _ = tokio::signal::ctrl_c() => bail!("stopped before any machine paired (the code is void)"),
        };
        let mut x = offer.exchange(std::time::Instant::now(), me.clone(), spake2_rng());
        let end = tokio::select! {
            end = drive(&mut stream, &mut x) => end,
            _ = tokio::signal::ctrl_c() => bail!("stopped before any machine paired (the code is void)"),
        };
        offer.handle_end(&end);
        match end {
            Ok(peer) => {
                trust(home, &peer, name)?;
                return Ok(0);
            }
            Err(PairError::WrongCode(left)) => {
                eprintln!("ndd: {from} typed a wrong code ({left} wrong tries left)")
            }
            Err(e @ (PairError::Void | PairError::Expired)) => bail!("{e}"),
            Err(e) => eprintln!(
                "ndd: a pairing attempt from {from} failed: {}",
                printable(&e.to_string(), 200)
            ),
        }
    }
}

/// How long `ndd pair CODE` without `--connect` looks for the machine showing it.
const FIND_WAIT: Duration = Duration::from_secs(3);

/// The machine showing a pairing code on the local network, if exactly one does: its
/// addresses to try, in order (IPv4 first; loopback, unspecified, multicast and IPv6
/// link-local ones, whose scope mDNS does not carry, left out).
async fn find_offer() -> Result<Vec<String>> {
    let found = tokio::task::spawn_blocking(|| {
        crate::discover::browse_for(crate::discover::PAIR_SERVICE, FIND_WAIT)
    })
    .await
    .context("looking for the machine showing the code")??;
    let usable = |a: &std::net::IpAddr| match a {
        std::net::IpAddr::V4(v4) => {
            !(v4.is_loopback() || v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast())
        }
        std::net::IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80)
        }
    };
    let found: Vec<crate::discover::Found> = found
        .into_iter()
        .filter(|f| f.port != 0)
        .map(|mut f| {
            f.addrs.retain(usable);
            f
        })
        .filter(|f| !f.addrs.is_empty())
        .collect();
    let all = |f: &crate::discover::Found| -> Vec<String> {
        f.addrs
            .iter()
            .map(|a| match a {
                std::net::IpAddr::V6(v6) => format!("[{v6}]:{}", f.port),
                std::net::IpAddr::V4(v4) => format!("{v4}:{}", f.port),
            })
            .collect()
    };
    let at = |f: &crate::discover::Found| all(f).into_iter().next();
    match &found[..] {
        [] => bail!(
            "no machine nearby shows a pairing code (none announced itself on the local network within {} s; mDNS needs UDP port 5353 open between the machines): give --connect HOST, the machine where `ndd pair` runs",
            FIND_WAIT.as_secs()
        ),
        [one] => {
            let addrs = all(one);
            eprintln!(
                "ndd: the machine showing the code: {} at {}",
                one.side.host,
                addrs.join(", ")
            );
            Ok(addrs)
        }
        many => bail!(
            "{} machines nearby show a pairing code ({}): give --connect HOST for the one whose code you typed",
            many.len(),
            many.iter()
                .map(|f| format!("{} at {}", f.side.host, at(f).unwrap_or_else(|| "?".into())))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// This home's fingerprint, if it has an identity.
fn signer_fingerprint(home: &Path) -> Option<String> {
    crate::session::load_identity(home)
        .ok()
        .map(|id| id.fingerprint())
}

/// Types `code` to the machine at `connect` (found on the local network when `None`) and
/// pairs with it.
pub async fn join(
    code: &str,
    connect: Option<&str>,
    home: &Path,
    name: Option<&str>,
) -> Result<i32> {
    ndd_link::pair::parse_code(code).map_err(|e| anyhow!("{e}"))?;
    let me = signer(home)?;
    let addrs = match connect {
        Some(c) => {
            let a = with_port(c);
            // The port only: the name is resolved when connecting, within its timeout.
            crate::config::check_address(&a, "--connect")?;
            vec![a]
        }
        None => find_offer().await?,
    };
    // Each address in turn (a machine found on the LAN may have several); the last one's
    // failure is the one said.
    let (mut addr, mut stream) = (String::new(), None);
    for a in addrs {
        let r = tokio::time::timeout(CONNECT_WAIT, TcpStream::connect(&a)).await;
        let connected = matches!(r, Ok(Ok(_)));
        (addr, stream) = (a, Some(r));
        if connected {
            break;
        }
    }
    let Some(stream) = stream else {
        bail!("no address to connect to")
    };
    let mut stream = match stream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => bail!(
            "nothing listens at {addr}: run `ndd pair` there first (it shows the code and listens on port {PORT})"
        ),
        Ok(Err(e)) => bail!(
            "cannot reach {addr}: {e} (check the address, and that this machine can reach it)"
        ),
        Err(_) => bail!(
            "connecting to {addr}: no answer after {} s (a wrong address, or a firewall)",
            CONNECT_WAIT.as_secs()
        ),
    };
    let mut x = Exchange::join(code, std::time::Instant::now(), me, spake2_rng())
        .map_err(|e| anyhow!("{e}"))?;
    debug_assert_eq!(x.role(), Role::Join);
    match drive(&mut stream, &mut x).await {
        Ok(peer) => {
            trust(home, &peer, name)?;
            Ok(0)
        }
        Err(e) => bail!("pairing with {addr} failed: {e}"),
    }
}

/// `HOST` with pairing's port, unless it names one.
fn with_port(connect: &str) -> String {
    crate::share::with_port(connect, PORT)
}

/// The key exchange's random source: the operating system's.
fn spake2_rng() -> ndd_link::pair::OsRng {
    ndd_link::pair::OsRng
}

/// This machine's own IPv4 addresses but loopback (from /proc/net/fib_trie: no extra crate).
fn local_addresses() -> Vec<String> {
    let text = std::fs::read_to_string("/proc/net/fib_trie").unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    let mut last: Option<&str> = None;
    for line in text.lines() {
        let t = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if line.contains("|-- ") {
            last = Some(t);
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(ip) = last.filter(|ip| !ip.starts_with("127.")) {
                if !out.iter().any(|o| o == ip) {
                    out.push(ip.to_string());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_the_network_keep_only_safe_characters() {
        assert_eq!(safe_name(b"lab-pc.local"), "lab-pc.local");
        assert_eq!(safe_name(b"\x1b[2Jevil\nname"), "__2Jevil_name");
        assert_eq!(safe_name(&[b'a'; 100]).len(), 32);
    }

    #[test]
    fn the_pairing_port_is_added_unless_given() {
        assert_eq!(with_port("10.0.0.1"), "10.0.0.1:7870");
        assert_eq!(with_port("host:9000"), "host:9000");
        assert_eq!(with_port("::1"), "[::1]:7870");
        assert_eq!(with_port("[::1]:9"), "[::1]:9");
    }
}
