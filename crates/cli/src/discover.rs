//! LAN discovery (issue 34 item 3): a listening side with `[link] announce = true` says on
//! the local network (mDNS, DNS-SD service `_ndd._tcp`) which driver it serves, which side it
//! is, its address and port and its fingerprint; `ndd discover` lists the ndd sides nearby,
//! whether this machine trusts each, and the line that connects to it.
//!
//! What an announcement gives away is public: the fingerprint is a hash of a public key, and
//! trust still comes only from `known_peers` (or `ndd pair`): a side found this way is refused
//! until its fingerprint is trusted, as any other.

use anyhow::{Context, Result};
use mdns_sd::{ServiceDaemon, ServiceEvent, ServiceInfo};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The DNS-SD service type of an ndd side.
pub const SERVICE: &str = "_ndd._tcp.local.";

/// The DNS-SD service type of a machine showing a pairing code (`ndd pair`): what
/// `ndd pair CODE` without `--connect` looks for.
pub const PAIR_SERVICE: &str = "_ndd-pair._tcp.local.";

/// A side announced on the network, while this lives.
pub struct Announcement {
    daemon: ServiceDaemon,
    fullname: String,
}

impl std::fmt::Debug for Announcement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Announcement({})", self.fullname)
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        // Says goodbye, so browsers drop it at once rather than after the record's lifetime.
        if let Ok(rx) = self.daemon.unregister(&self.fullname) {
            let _ = rx.recv_timeout(Duration::from_millis(500));
        }
        let _ = self.daemon.shutdown();
    }
}

/// What an announcement says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    /// The driver (the config's `driver`).
    pub driver: String,
    /// `app` or `device`: the side that listens.
    pub side: String,
    /// `tcp` or `quic`.
    pub transport: String,
    /// Its identity's fingerprint (`SHA256:…`); none with `--insecure`.
    pub fingerprint: Option<String>,
    /// The machine's name.
    pub host: String,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "ndd".into())
}

/// A DNS label: at most 63 bytes of letters, digits and `-`.
fn label(s: &str) -> String {
    let l: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63)
        .collect();
    if l.is_empty() {
        "ndd".into()
    } else {
        l
    }
}

/// Announces `side` listening on `ip` (unspecified: every address of this machine) `port`.
pub fn announce(side: &Side, ip: IpAddr, port: u16) -> Result<Announcement> {
    announce_as(SERVICE, side, ip, port)
}

/// [`announce`] as a `service` (DNS-SD type).
pub fn announce_as(service: &str, side: &Side, ip: IpAddr, port: u16) -> Result<Announcement> {
    let daemon = ServiceDaemon::new().context("cannot start mDNS")?;
    // One instance per driver, side and machine: "lab app on bench3".
    let instance: String = format!("{} {} on {}", side.driver, side.side, side.host)
        .chars()
        .take(63)
        .collect();
    let host = format!("{}.local.", label(&side.host));
    let mut props: Vec<(&str, &str)> = vec![
        ("driver", &side.driver),
        ("side", &side.side),
        ("transport", &side.transport),
        ("host", &side.host),
    ];
    if let Some(fp) = &side.fingerprint {
        props.push(("fp", fp));
    }
    let addr = if ip.is_unspecified() {
        String::new()
    } else {
        ip.to_string()
    };
    let mut info = ServiceInfo::new(service, &instance, &host, addr.as_str(), port, &props[..])
        .context("cannot describe this side for mDNS")?;
    if ip.is_unspecified() {
        info = info.enable_addr_auto();
    }
    let fullname = info.get_fullname().to_string();
    daemon
        .register(info)
        .context("cannot announce this side with mDNS")?;
    Ok(Announcement { daemon, fullname })
}

/// A side found on the network.
#[derive(Debug, Clone)]
pub struct Found {
    /// What it announced.
    pub side: Side,
    /// Where it listens (non-loopback addresses first).
    pub addrs: Vec<IpAddr>,
    /// Its port.
    pub port: u16,
}

/// Listens for `wait` and returns every ndd side that answered, by name.
pub fn browse(wait: Duration) -> Result<Vec<Found>> {
    browse_for(SERVICE, wait)
}

/// [`browse`] for a `service` (DNS-SD type).
pub fn browse_for(service: &str, wait: Duration) -> Result<Vec<Found>> {
    let daemon = ServiceDaemon::new().context("cannot start mDNS")?;
    let rx = daemon.browse(service).context("cannot browse with mDNS")?;
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    let until = Instant::now() + wait;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        let ev = match rx.recv_timeout(left.min(Duration::from_millis(200))) {
            Ok(ev) => ev,
            Err(_) if rx.is_disconnected() => break,
            Err(_) => continue,
        };
        match ev {
            ServiceEvent::ServiceResolved(info) => {
                // Anyone on the LAN writes these: escaped and bounded before they reach a
                // terminal, and a fingerprint that is not one is left out.
                let get = |k: &str| {
                    info.get_property_val_str(k)
                        .map(|v| ndd_wire::text::printable(v, 64))
                };
                let mut addrs: Vec<IpAddr> = info
                    .get_addresses()
                    .iter()
                    .map(|a| a.to_ip_addr())
                    .collect();
                addrs.sort_by_key(|a| (a.is_loopback(), a.is_ipv6(), *a));
                addrs.dedup();
                let f = Found {
                    side: Side {
                        driver: get("driver").unwrap_or_default(),
                        side: get("side").unwrap_or_default(),
                        transport: get("transport").unwrap_or_else(|| "tcp".into()),
                        fingerprint: info
                            .get_property_val_str("fp")
                            .filter(|fp| ndd_link::validate_fingerprint(fp).is_ok())
                            .map(str::to_string),
                        host: get("host").unwrap_or_default(),
                    },
                    addrs,
                    port: info.get_port(),
                };
                // The last answer has every address seen so far.
                let e = found
                    .entry(info.get_fullname().to_string())
                    .or_insert(f.clone());
                for a in f.addrs {
                    if !e.addrs.contains(&a) {
                        e.addrs.push(a);
                    }
                }
                e.addrs.sort_by_key(|a| (a.is_loopback(), a.is_ipv6(), *a));
            }
            ServiceEvent::ServiceRemoved(_, name) => {
                found.remove(&name);
            }
            _ => {}
        }
    }
    let _ = daemon.shutdown();
    Ok(found.into_values().collect())
}

/// `ndd discover`: the sides nearby, whether `home` trusts each, and how to reach it.
pub fn run(home: &std::path::Path, wait: Duration) -> Result<i32> {
    let found = browse(wait)?;
    if found.is_empty() {
        println!(
            "no ndd side announced itself within {:.0} s (a listening side announces with `announce = true` in [link]; mDNS needs UDP port 5353 open between the machines)",
            wait.as_secs_f64()
        );
        return Ok(0);
    }
    let known = ndd_link::KnownPeers::load(home).ok();
    println!(
        "{:<16} {:<6} {:<22} {:<5} {:<18} TRUSTED",
        "DRIVER", "SIDE", "ADDRESS", "LINK", "HOST"
    );
    let mut hints = Vec::new();
    for f in &found {
        let addr = f
            .addrs
            .first()
            .map(|a| match a {
                IpAddr::V6(v6) => format!("[{v6}]:{}", f.port),
                IpAddr::V4(v4) => format!("{v4}:{}", f.port),
            })
            .unwrap_or_else(|| format!("?:{}", f.port));
        let trusted = match (&f.side.fingerprint, &known) {
            (Some(fp), Some(k)) => match k.lookup(fp) {
                Some(t) => format!(
                    "yes ({})",
                    t.name.clone().unwrap_or_else(|| "unnamed".into())
                ),
                None => "no".into(),
            },
            (None, _) => "insecure".into(),
            (Some(_), None) => "?".into(),
        };
        println!(
            "{:<16} {:<6} {:<22} {:<5} {:<18} {trusted}",
            f.side.driver, f.side.side, addr, f.side.transport, f.side.host
        );
        let other = if f.side.side == "app" {
            "device"
        } else {
            "app"
        };
        let mut h = format!(
            "  {} {} on {}: ndd run CONFIG --side {other} --connect {addr}",
            f.side.driver, f.side.side, f.side.host
        );
        if trusted == "no" {
            if let Some(fp) = &f.side.fingerprint {
                h += &format!(" (first: ndd trust {fp} --name {}, after checking the fingerprint with its owner, or ndd pair)", label(&f.side.host));
            }
        }
        hints.push(h);
    }
    println!("\nto connect:");
    for h in hints {
        println!("{h}");
    }
    Ok(0)
}

/// What a listening side announces about itself.
pub fn this_side(driver: &str, side: &str, transport: &str, fingerprint: Option<String>) -> Side {
    Side {
        driver: driver.to_string(),
        side: side.to_string(),
        transport: transport.to_string(),
        fingerprint,
        host: hostname(),
    }
}
