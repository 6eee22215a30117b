//! The NATS link: each side talks to a NATS server (Debian's `nats-server`) instead of to its
//! peer, so one device's streams reach many app sides (the `multiplex` pair says how).
//!
//! The broker is not trusted. Every app side joins with the same key exchange as the sealed
//! UDP link ([`crate::seal`]), run as NATS request/reply on the driver's join subject
//! ([`join`]): both identities sign the transcript, each side checks the other's fingerprint
//! against `known_peers`, and the device compares the app side's HELLO as on a direct link.
//! Only then does the device hand the app side, sealed under their pairwise keys, the
//! driver's *group key*: every frame travels encrypted under it (the `encrypt` pair's format),
//! so the server and any subscriber that was not admitted see ciphertext only.
//!
//! - [`subjects`]: the subject layout (sans-IO);
//! - [`join`]: the join handshake (sans-IO);
//! - [`record`]: the frame record every data message carries (packet/repr);
//! - [`outbox`]: a source stream's records, message ids, acknowledgements and retries
//!   (sans-IO);
//! - [`source`]: a source stream from its stack to the broker: room, the rotation's gate, the
//!   END and its repeats (sans-IO);
//! - [`intake`]: a sink stream's records: copies, order, END, acknowledgements (sans-IO);
//! - [`attach`]: a sink's JetStream consumer: where it starts, the one left behind deleted,
//!   attached again after a reconnect (sans-IO);
//! - [`deliver`]: a sink stream from its receiver through its stack to the sink: backpressure,
//!   acknowledgements once the sink completed, device restarts, the END (sans-IO);
//! - [`runs`]: which device run a frame may come from, and its run key (sans-IO);
//! - [`keys`]: the group key, its rotation, and the opening of frames under it (sans-IO);
//! - [`rotate`]: the device side's keeper of the key: checks, the rotation and its gate, the
//!   rekey notices (sans-IO);
//! - [`follow`]: an app side's following of the key: rekey notices, joins, answers (sans-IO);
//! - [`claim`]: one device side per driver: the signed claim and the wait (sans-IO);
//! - [`start`]: a device side's start: joins heard, its run reserved, the driver claimed, the
//!   run marked, where it begins (sans-IO);
//! - [`NatsConfig`] / [`connect`]: the connection to the server (TLS, credentials);
//! - [`drive`]: all of the above run on async-nats: a side's tasks, the streams' halves.

pub mod admit;
pub mod attach;
pub mod claim;
pub mod deliver;
pub mod drive;
pub mod follow;
pub mod home;
pub mod input;
pub mod intake;
pub mod join;
pub mod keys;
pub mod opened;
pub mod outbox;
pub mod receive;
pub mod record;
pub mod rotate;
pub mod runs;
pub mod send;
pub mod source;
pub mod start;
pub mod store;
pub mod subjects;
#[cfg(test)]
mod toy;

use crate::LinkError;
use std::path::PathBuf;
use std::time::Duration;

/// `[link.nats]`: how to reach the NATS server and which subjects to use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// Server URLs (`nats://host:4222`, `tls://host:4222`); the client fails over between
    /// them.
    pub servers: Vec<String>,
    /// First token of every subject (`PREFIX.DRIVER.…`).
    pub subject_prefix: String,
    /// A NATS credentials file (`.creds`: user JWT and nkey seed), as `nsc` writes them.
    pub credentials: PathBuf,
    /// A file holding an nkey seed (`SU…`), for servers that list users by nkey.
    pub nkey_file: PathBuf,
    /// User name for user/password authentication (with `password_file`).
    pub user: String,
    /// File holding the password (one line; mode 0600).
    pub password_file: PathBuf,
    /// PEM file of the CA that signed the server's certificate; setting it requires TLS.
    pub ca_file: PathBuf,
    /// Refuse a server that does not offer TLS (on by default unless every server is on
    /// loopback).
    pub require_tls: Option<bool>,
    /// JetStream storage the device asks for its reliable streams, in MiB.
    pub store_mib: u64,
    /// Copies JetStream keeps of the reliable streams (1, 3 or 5; in a cluster of three
    /// servers, 3 keeps them through the loss of any one).
    pub replicas: u8,
    /// The device side starts its sources once this many app sides joined (0: at once).
    pub min_app_sides: u32,
    /// First token of this side's reply subjects (NATS inboxes): each side its own
    /// (`_INBOX_app1`), with server permissions that let a user subscribe to its own inboxes
    /// only and publish into none (`ndd nats-permissions`), and nobody else can read or forge
    /// the answers this side is sent (JetStream's included). Default `_INBOX`, shared.
    pub inbox_prefix: String,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            servers: vec!["nats://127.0.0.1:4222".into()],
            subject_prefix: "ndd".into(),
            credentials: PathBuf::new(),
            nkey_file: PathBuf::new(),
            user: String::new(),
            password_file: PathBuf::new(),
            ca_file: PathBuf::new(),
            require_tls: None,
            store_mib: 256,
            replicas: 1,
            min_app_sides: 0,
            inbox_prefix: "_INBOX".into(),
        }
    }
}

fn set(p: &std::path::Path) -> bool {
    !p.as_os_str().is_empty()
}

impl NatsConfig {
    /// Checks what can be checked without the network: server URLs, subject tokens, one
    /// authentication method at most. Errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.servers.is_empty() {
            return Err("link.nats.servers is empty: name at least one server, e.g. servers = [\"nats://127.0.0.1:4222\"]".into());
        }
        for s in &self.servers {
            let rest = s
                .strip_prefix("nats://")
                .or_else(|| s.strip_prefix("tls://"))
                .ok_or_else(|| {
                    format!("link.nats.servers: {s:?} is not a NATS URL (nats://HOST:PORT or tls://HOST:PORT)")
                })?;
            let hostport = rest.rsplit('@').next().unwrap_or(rest);
            let ok = hostport
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(format!(
                    "link.nats.servers: {s:?} has no HOST:PORT (e.g. nats://127.0.0.1:4222)"
                ));
            }
            if let Err(e) = s.parse::<async_nats::ServerAddr>() {
                return Err(format!("link.nats.servers: {s:?}: {e}"));
            }
        }
        subjects::check_token("link.nats.subject_prefix", &self.subject_prefix)?;
        subjects::check_token("link.nats.inbox_prefix", &self.inbox_prefix)?;
        let methods = [
            set(&self.credentials),
            set(&self.nkey_file),
            !self.user.is_empty() || set(&self.password_file),
        ];
        if methods.iter().filter(|m| **m).count() > 1 {
            return Err(
                "link.nats: set one of credentials, nkey_file, and user + password_file".into(),
            );
        }
        if self.user.is_empty() == set(&self.password_file) {
            return Err("link.nats: user and password_file go together".into());
        }
        if self.store_mib == 0 {
            return Err(
                "link.nats.store_mib = 0: JetStream needs room for reliable streams (default 256)"
                    .into(),
            );
        }
        if !matches!(self.replicas, 1 | 3 | 5) {
            return Err(format!(
                "link.nats.replicas = {}: JetStream keeps 1, 3 or 5 copies (3 in a cluster of three servers)",
                self.replicas
            ));
        }
        Ok(())
    }

    /// Whether every server is on loopback (then plain NATS is allowed by default).
    pub fn all_loopback(&self) -> bool {
        self.servers.iter().all(|s| {
            let rest = s.split("://").nth(1).unwrap_or(s);
            let host = rest
                .rsplit('@')
                .next()
                .unwrap_or(rest)
                .rsplit_once(':')
                .map_or(rest, |(h, _)| h);
            matches!(host, "127.0.0.1" | "localhost" | "[::1]" | "::1")
        })
    }

    /// Whether the connection must be TLS.
    pub fn tls_required(&self) -> bool {
        self.require_tls.unwrap_or(!self.all_loopback())
            || set(&self.ca_file)
            || self.servers.iter().any(|s| s.starts_with("tls://"))
    }
}

/// A password file's first line (mode 0600 required, as for keys).
fn read_secret(path: &std::path::Path, what: &str) -> Result<String, LinkError> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |reason: String| LinkError::Nats(format!("{what} {}: {reason}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "has permissions {mode:04o}, but it must be readable by its owner only; fix it with: chmod 600 {}",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if line.is_empty() {
        return Err(bad("is empty".into()));
    }
    Ok(line)
}

/// The NATS client's connection events as log lines. A server that takes the connection
/// and drops it again and again has the client reconnect at once, every time: each kind of
/// line comes at most five times a second, with the count of those held back.
#[derive(Debug)]
struct ServerEvents {
    lost: ndd_core::RateLimit,
    back: ndd_core::RateLimit,
    refused: ndd_core::RateLimit,
}

impl Default for ServerEvents {
    fn default() -> Self {
        let limit = || ndd_core::RateLimit::with_burst(Duration::from_secs(1), 5);
        ServerEvents {
            lost: limit(),
            back: limit(),
            // Each refusal said once in 10 s: a side refused a subscription keeps asking.
            refused: ndd_core::RateLimit::with_burst(Duration::from_secs(10), 1),
        }
    }
}

impl ServerEvents {
    /// `ev` at `now`; `before`: the connections made before this one.
    fn note(&mut self, who: &str, ev: &async_nats::Event, before: u64, now: std::time::Instant) {
        match ev {
            async_nats::Event::Disconnected => {
                if let Some(suppressed) = self.lost.admit(now) {
                    tracing::warn!(suppressed, "{who}: lost the NATS server; reconnecting")
                }
            }
            async_nats::Event::Connected if before > 0 => {
                if let Some(suppressed) = self.back.admit(now) {
                    tracing::warn!(
                        suppressed,
                        "{who}: reconnected to the NATS server (connection {})",
                        before + 1
                    )
                }
            }
            async_nats::Event::Connected => tracing::info!("{who}: connected to NATS"),
            // The server's permissions refused a subscription or a publish: the side waits
            // for answers that never come (an inbox_prefix left out, say), so say why.
            async_nats::Event::ServerError(async_nats::ServerError::Other(e))
                if e.to_ascii_lowercase().contains("permissions violation") =>
            {
                if let Some(suppressed) = self.refused.admit(now) {
                    tracing::warn!(
                        suppressed,
                        "{who}: the NATS server refused this side: {}; check this user's permissions (ndd nats-permissions prints them) and that link.nats.inbox_prefix is the one printed for this user",
                        ndd_wire::text::printable(e, ndd_wire::text::MAX_REASON)
                    )
                }
            }
            // A server error carries the server's words.
            ev => tracing::debug!(
                event = %ndd_wire::text::printable(&ev.to_string(), ndd_wire::text::MAX_REASON),
                "{who}: NATS"
            ),
        }
    }
}

/// Connects to the NATS server(s) with the configured TLS and credentials; `name` is how
/// the connection shows in the server's monitoring. Fails (with the server's words) when
/// the server is unreachable within `timeout` or refuses the credentials.
///
/// `connects` counts the connections made (the first and every reconnect), for callers that
/// act on a reconnect.
pub async fn connect(
    cfg: &NatsConfig,
    name: &str,
    timeout: Duration,
    connects: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Result<async_nats::Client, LinkError> {
    cfg.validate().map_err(LinkError::Nats)?;
    let mut opts = async_nats::ConnectOptions::new()
        .name(name)
        .max_reconnects(None)
        .ping_interval(Duration::from_secs(2))
        .client_capacity(8192)
        .subscription_capacity(1 << 16)
        .custom_inbox_prefix(&cfg.inbox_prefix);
    if set(&cfg.credentials) {
        opts = opts.credentials_file(&cfg.credentials).await.map_err(|e| {
            LinkError::Nats(format!(
                "link.nats.credentials {}: {e}",
                cfg.credentials.display()
            ))
        })?;
    }
    if set(&cfg.nkey_file) {
        opts = opts.nkey(read_secret(&cfg.nkey_file, "link.nats.nkey_file")?);
    }
    if !cfg.user.is_empty() {
        let password = read_secret(&cfg.password_file, "link.nats.password_file")?;
        opts = opts.user_and_password(cfg.user.clone(), password);
    }
    if set(&cfg.ca_file) {
        if !cfg.ca_file.is_file() {
            return Err(LinkError::Nats(format!(
                "link.nats.ca_file {}: no such file",
                cfg.ca_file.display()
            )));
        }
        opts = opts.add_root_certificates(cfg.ca_file.clone());
    }
    if cfg.tls_required() {
        opts = opts.require_tls(true);
    }
    let servers = cfg.servers.join(",");
    // Each URL on its own: the client does not split a comma-separated list (it read
    // "16231,nats://…" as a port).
    let addrs = cfg
        .servers
        .iter()
        .map(|s| {
            s.parse::<async_nats::ServerAddr>()
                .map_err(|e| LinkError::Nats(format!("link.nats.servers: {s:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let who = name.to_string();
    let said = std::sync::Arc::new(std::sync::Mutex::new(ServerEvents::default()));
    opts = opts.event_callback(move |ev| {
        // Connections before this one (a reconnect is said as loudly as the loss it ends).
        let before = match ev {
            async_nats::Event::Connected => {
                connects.fetch_add(1, std::sync::atomic::Ordering::Release)
            }
            _ => 0,
        };
        said.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .note(&who, &ev, before, std::time::Instant::now());
        async {}
    });
    // Once connected the client reconnects by itself, forever; the first connection is
    // tried again until `timeout` (the server may be starting too), except when the server
    // refuses us: credentials and TLS problems do not fix themselves.
    let started = std::time::Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        let attempt = opts
            .clone()
            .connection_timeout(left.max(Duration::from_millis(100)))
            .connect(addrs.as_slice())
            .await;
        let e = match attempt {
            Ok(c) => return Ok(c),
            Err(e) => e,
        };
        use async_nats::ConnectErrorKind as K;
        // The client reports a certificate it cannot check as an IO error.
        let text = e.to_string();
        let tls = matches!(e.kind(), K::Tls)
            || text.contains("certificate")
            || text.contains("TLS")
            || text.contains("tls");
        // A plain server answering our TLS handshake: its INFO line reads as a corrupt record.
        if text.contains("InvalidContentType") || text.contains("corrupt message") {
            return Err(LinkError::Nats(format!(
                "NATS at {servers} does not speak TLS, and the NATS link requires TLS to a server off loopback: give the server a certificate (docs/links.md, \"Running nats-server with TLS\"), or set link.nats.require_tls = false on a network you trust (frames stay encrypted end to end either way; the credentials would not be)"
            )));
        }
        match e.kind() {
            _ if tls => {
                return Err(LinkError::Nats(format!(
                    "TLS with NATS at {servers} failed: {e} (link.nats.ca_file must name the CA that signed the server's certificate; a server without TLS cannot serve require_tls)"
                )))
            }
            K::Authentication | K::AuthorizationViolation => {
                return Err(LinkError::Nats(format!(
                    "NATS at {servers} refused the credentials: {e} (check link.nats credentials, nkey_file or user/password_file against the server's authorization block)"
                )))
            }
            K::ServerParse | K::Dns => {
                return Err(LinkError::Nats(format!(
                    "cannot connect to NATS at {servers}: {e}"
                )))
            }
            K::Tls | K::TimedOut | K::Io | K::MaxReconnects => {}
        }
        if started.elapsed() + backoff >= timeout {
            return Err(LinkError::Nats(format!(
                "cannot connect to NATS at {servers} within {:.1} s: {e} (is nats-server running? `nats-server -a 127.0.0.1 -p 4222 -js` starts one)",
                timeout.as_secs_f64()
            )));
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

pub use async_nats;

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_core::testlog::Captured;
    use std::time::Instant;

    /// A server that takes the connection and drops it, a thousand times in a second: five
    /// lines of each kind, then one with the count held back; the connection count goes on.
    #[test]
    fn a_thousand_lost_connections_in_a_second_are_a_few_lines() {
        let mut said = ServerEvents::default();
        let t0 = Instant::now();
        let ((), log) = Captured::run(|| {
            for i in 0..=1000u64 {
                let now = t0 + Duration::from_millis(if i == 1000 { 2000 } else { i });
                said.note("device", &async_nats::Event::Disconnected, 0, now);
                said.note("device", &async_nats::Event::Connected, i + 1, now);
            }
        });
        for what in ["lost the NATS server", "reconnected to the NATS server"] {
            let lines = log.matching(what);
            assert_eq!(lines.len(), 6, "{lines:#?}");
            assert!(lines[5].contains("suppressed=995"), "{lines:#?}");
        }
        assert!(log.lines()[11].contains("(connection 1002)"));
    }
}
