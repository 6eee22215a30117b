//! The config file: one TOML file describes a driver, its link and its streams, and both
//! sides run from the same file (`ndd run FILE --side device|app`).

use anyhow::{bail, Context, Result};
use ndd_core::Pair;
use ndd_endpoint::{SinkConfig, SourceConfig, X11Window};
use ndd_modules::ModuleConfig;
use ndd_wire::{Direction, LayerDecl, Side, StreamDecl};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// Default port of an ndd link.
pub const DEFAULT_PORT: u16 = 7878;

/// A whole config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Name of the driver (both sides must use the same).
    pub driver: String,
    /// Which side this machine runs (`device` or `app`), for `ndd serve` and for `ndd run`
    /// without `--side` (a file both sides share leaves it out).
    #[serde(default)]
    pub side: Option<SideName>,
    /// How the two sides connect.
    #[serde(default)]
    pub link: LinkConfig,
    /// The streams, each `[[stream]]` table.
    #[serde(rename = "stream", default)]
    pub streams: Vec<StreamConfig>,
    /// Where the file was read from (for error messages).
    #[serde(skip)]
    pub path: PathBuf,
    /// The text it was read from (a listener serving several peers reads it again for each,
    /// with `{peer}` replaced: [`Config::for_peer`]).
    #[serde(skip)]
    pub text: String,
}

/// `[link]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkConfig {
    /// Address the listening side binds and the connecting side connects to.
    pub address: String,
    /// Which side listens (`device` or `app`); the other connects.
    pub listener: SideName,
    /// `tcp` (default; TLS 1.3 unless `insecure`), `quic`, or `udp` (sealed datagrams unless
    /// `insecure`).
    pub transport: ndd_link::TransportKind,
    /// Plain TCP without TLS, plain UDP without sealing (prints a warning on every start).
    pub insecure: bool,
    /// How long the connecting side keeps retrying its first connection, in ms.
    pub connect_timeout_ms: u64,
    /// How long one handshake (TLS, trust, HELLO, READY) may take, in ms; a listener drops a
    /// connection that has not finished by then and serves the others meanwhile.
    pub handshake_timeout_ms: u64,
    /// Largest frame body accepted from the peer, in bytes.
    pub max_frame_bytes: u32,
    /// Interval of clock-offset and liveness pings, in ms.
    pub ping_interval_ms: u64,
    /// A link that carried nothing (not even a ping) for this long is dead, in ms.
    pub keepalive_timeout_ms: u64,
    /// Reconnect and resume after a link drop (otherwise a drop ends the run with an error).
    pub reconnect: bool,
    /// Longest wait between reconnect attempts (exponential backoff with jitter), in ms.
    pub max_backoff_ms: u64,
    /// Per stream, bytes kept until the peer acknowledges them. A reliable stream whose
    /// buffer is full stops reading its endpoint until the peer catches up (nothing dropped);
    /// a lossy one drops its oldest (`overflow`).
    pub resume_buffer_bytes: u64,
    /// `transport = "nats"`: the NATS server(s), credentials and subject prefix.
    pub nats: ndd_link::nats::NatsConfig,
    /// Per reliable stream, the smallest in-flight window: bytes written and not yet
    /// acknowledged. It grows to twice the path's bandwidth-delay product, at most
    /// `resume_buffer_bytes`; small, it keeps other streams' frames from waiting behind this
    /// one's in the link's byte stream.
    pub flight_min_bytes: u64,
    /// On TCP and TLS, large frames go out cut into chunks of what the path carries in 1 ms
    /// and at least this many bytes, so another stream's frame can go between them (a mouse
    /// event need not wait behind a whole screen update on a slow link); 0 never cuts. QUIC
    /// and UDP do not use it.
    pub chunk_bytes: u64,
    /// A listening side (TCP or QUIC) serves this many peers at once, each its own session,
    /// streams and endpoints (`{peer}` in the file names each peer's); 1: one at a time, any
    /// other is told the side is busy.
    pub peers: u32,
    /// A listening side (TCP or QUIC, not on loopback) says on the local network (mDNS) which
    /// driver and side it is, where, and its fingerprint, for `ndd discover`.
    pub announce: bool,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            address: format!("127.0.0.1:{DEFAULT_PORT}"),
            listener: SideName::App,
            transport: ndd_link::TransportKind::Tcp,
            insecure: false,
            connect_timeout_ms: 10_000,
            handshake_timeout_ms: 3_000,
            max_frame_bytes: 16 << 20,
            // A dead link is noticed within 1.5 s (issue 34 item 7; it took 5 s and more).
            ping_interval_ms: 250,
            keepalive_timeout_ms: 1500,
            reconnect: true,
            // A path that comes back is used within a second.
            max_backoff_ms: 1000,
            resume_buffer_bytes: 16 << 20,
            flight_min_bytes: 2 << 20,
            chunk_bytes: ndd_link::CHUNK_BYTES as u64,
            nats: ndd_link::nats::NatsConfig::default(),
            peers: 1,
            announce: false,
        }
    }
}

/// `device` or `app`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SideName {
    /// Where the physical device is.
    Device,
    /// Where the application runs.
    App,
}

impl SideName {
    /// The other side.
    pub fn other(self) -> SideName {
        match self {
            SideName::Device => SideName::App,
            SideName::App => SideName::Device,
        }
    }

    /// As the wire names it.
    pub fn wire(self) -> Side {
        match self {
            SideName::Device => Side::Device,
            SideName::App => Side::App,
        }
    }

    /// `device` or `app`.
    pub fn as_str(self) -> &'static str {
        match self {
            SideName::Device => "device",
            SideName::App => "app",
        }
    }
}

impl std::fmt::Display for SideName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which way a stream flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DirectionName {
    /// Events, frames, serial RX.
    DeviceToApp,
    /// LEDs, force feedback, serial TX.
    AppToDevice,
}

impl DirectionName {
    /// As the wire names it.
    pub fn wire(self) -> Direction {
        match self {
            DirectionName::DeviceToApp => Direction::DeviceToApp,
            DirectionName::AppToDevice => Direction::AppToDevice,
        }
    }

    /// The side that sources this stream.
    pub fn source_side(self) -> SideName {
        match self {
            DirectionName::DeviceToApp => SideName::Device,
            DirectionName::AppToDevice => SideName::App,
        }
    }

    /// The side that sinks this stream.
    pub fn sink_side(self) -> SideName {
        self.source_side().other()
    }
}

/// Whether a stream's frames must all arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reliability {
    /// Every frame, exactly once, in order, across reconnects.
    #[default]
    Reliable,
    /// Stale frames are dropped rather than queued while the link is down (mouse motion,
    /// video).
    Lossy,
}

/// Which stream's frames leave first when several are ready (`priority = …`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PriorityName {
    /// Before every `normal` and `low` stream (input devices, audio, serial lines).
    High,
    /// The default for screens, cameras, files, synthetic data.
    Normal,
    /// After everything else (bulk that may wait).
    Low,
}

/// One `[[stream]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// Stream name (unique in the file).
    pub name: Spanned<String>,
    /// `device-to-app` or `app-to-device`.
    pub direction: DirectionName,
    /// What produces the frames, on the source side.
    pub source: SourceConfig,
    /// What consumes them, on the sink side.
    pub sink: SinkConfig,
    /// The pairs, top to bottom.
    #[serde(default)]
    pub stack: Vec<Spanned<ModuleConfig>>,
    /// `reliable` (default) or `lossy`.
    #[serde(default)]
    pub reliability: Reliability,
    /// `high`, `normal` or `low`; by default `high` for interactive sources (input devices,
    /// audio, serial lines, the clipboard, the cursor) and `normal` for the others.
    #[serde(default)]
    pub priority: Option<PriorityName>,
}

impl StreamConfig {
    /// The stream's name.
    pub fn name(&self) -> &str {
        self.name.get_ref()
    }

    /// The send priority: as set, or `high` for an interactive source, else `normal`.
    pub fn priority(&self) -> ndd_core::session::Priority {
        use ndd_core::session::Priority;
        match self.priority {
            Some(PriorityName::High) => Priority::High,
            Some(PriorityName::Normal) => Priority::Normal,
            Some(PriorityName::Low) => Priority::Low,
            None if self.source.interactive() => Priority::High,
            None => Priority::Normal,
        }
    }

    /// The pairs, in list order.
    pub fn pairs(&self) -> Vec<&ModuleConfig> {
        self.stack.iter().map(|s| s.get_ref()).collect()
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The key a value at `offset` is given to (`key = value`), if the text there reads so: the
/// name of the key the parser's type errors leave out.
fn key_before(text: &str, offset: usize) -> Option<&str> {
    let before = text.get(..offset)?.trim_end();
    let before = before.strip_suffix('=')?.trim_end();
    let start = before
        .char_indices()
        .rev()
        .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'))
        .map_or(0, |(i, c)| i + c.len_utf8());
    let key = &before[start..];
    (!key.is_empty()).then_some(key)
}

/// Where in `span` the value a type error names (`string "often"`, `` integer `5` ``) is
/// written, when it is there once: a table or array the error's span covers as a whole
/// (a pair in `stack`) holds the key inside.
fn value_in(text: &str, span: std::ops::Range<usize>, msg: &str) -> Option<usize> {
    let token = if let Some(i) = msg.find("string \"") {
        let rest = &msg[i + "string ".len()..];
        let end = rest[1..].find('"')? + 2;
        &rest[..end]
    } else {
        let i = msg.find('`')?;
        let rest = &msg[i + 1..];
        &rest[..rest.find('`')?]
    };
    let inside = text.get(span.clone())?;
    let mut at = inside.match_indices(token);
    let (first, _) = at.next()?;
    at.next().is_none().then_some(span.start + first)
}

/// TOML allows `nan` and `inf`; no ndd parameter means them. The first one is an error that
/// names its key and line.
fn non_finite(text: &str, path: &Path) -> Result<()> {
    fn walk(v: &toml::Value, key: &str) -> Option<(String, f64)> {
        match v {
            toml::Value::Float(f) if !f.is_finite() => Some((key.to_string(), *f)),
            toml::Value::Table(t) => t.iter().find_map(|(k, v)| {
                walk(
                    v,
                    &if key.is_empty() {
                        k.clone()
                    } else {
                        format!("{key}.{k}")
                    },
                )
            }),
            toml::Value::Array(a) => a
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, &format!("{key}[{i}]"))),
            _ => None,
        }
    }
    let Ok(table) = text.parse::<toml::Table>() else {
        return Ok(());
    };
    let Some((key, value)) = walk(&toml::Value::Table(table), "") else {
        return Ok(());
    };
    let last = key.rsplit('.').next().unwrap_or(&key).to_string();
    let line = text
        .lines()
        .position(|l| l.contains(&last) && (l.contains("nan") || l.contains("inf")))
        .map(|i| format!(":{}", i + 1))
        .unwrap_or_default();
    bail!(
        "{}{line}: key `{key}`: {value} is not a number ndd can use; write a finite number",
        path.display()
    )
}

/// A `host:port` whose port is a number from 0 to 65535 (the host is checked when it is
/// resolved). `what` names the key or option in the error.
pub fn check_address(addr: &str, what: &str) -> Result<()> {
    let Some((host, port)) = addr.rsplit_once(':') else {
        bail!("{what}: \"{addr}\" has no port; write host:port, e.g. 0.0.0.0:{DEFAULT_PORT}");
    };
    if host.is_empty() {
        bail!("{what}: \"{addr}\" has no host; write host:port, e.g. 0.0.0.0:{port}");
    }
    if port.is_empty() {
        bail!("{what}: \"{addr}\" has no port after the ':'; write host:port");
    }
    if port.parse::<u16>().is_err() {
        bail!("{what}: \"{addr}\": port {port} is not a number from 0 to 65535");
    }
    Ok(())
}

/// An address this side connects to: a valid `host:port` whose port is not 0 and whose host
/// resolves now, so a typo is one line at start, not seconds of retries. (`what` names the
/// option or key.)
pub fn check_connect_target(addr: &str, what: &str) -> Result<()> {
    check_address(addr, what)?;
    let port = addr.rsplit_once(':').map_or("", |(_, p)| p);
    if port == "0" {
        bail!("{what}: \"{addr}\": port 0 is not a port one can connect to; give the port the other side listens on");
    }
    use std::net::ToSocketAddrs;
    match addr.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => bail!("{what}: \"{addr}\": the host has no address"),
        Err(e) => bail!("{what}: \"{addr}\": the host does not resolve ({e}); check the name, or give an IP address"),
    }
}

/// The largest config file read: a real one is a few kB; anything near this is a mistake
/// (`ndd check /dev/zero` grew to 8 GB before this bound).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads a config file of at most [`MAX_CONFIG_BYTES`] that is a regular file: a FIFO, a
/// device or a directory is refused before it is opened for reading (a FIFO would block until
/// a writer came), and a file that grows past the bound while read is refused too.
pub fn read_bounded(path: &Path) -> Result<String> {
    use std::io::Read;
    let what = || format!("cannot read config file {}", path.display());
    let meta = std::fs::metadata(path).with_context(what)?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            use std::os::unix::fs::FileTypeExt;
            let t = meta.file_type();
            if t.is_fifo() {
                "a named pipe"
            } else if t.is_char_device() || t.is_block_device() {
                "a device"
            } else if t.is_socket() {
                "a socket"
            } else {
                "not a regular file"
            }
        };
        bail!(
            "config file {} is {kind}, not a regular file: give the path of a .toml file",
            path.display()
        );
    }
    let too_big = || {
        anyhow::anyhow!(
            "config file {} is larger than {} KiB: that is not an ndd config (a real one is a few kB)",
            path.display(),
            MAX_CONFIG_BYTES >> 10
        )
    };
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)
        .with_context(what)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(what)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_big());
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "config file {} is not UTF-8 text (a bad byte at offset {}): a config is a TOML text file",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

impl Config {
    /// Reads and checks a config file. Errors name the file, the line and the key.
    pub fn load(path: &Path) -> Result<Config> {
        let text = read_bounded(path)?;
        Config::parse(&text, path)
    }

    /// Parses and checks config text read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Config> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| format!(":{}", line_of(text, s.start)))
                .unwrap_or_default();
            let msg = e.message().trim_end();
            // A value of the wrong type: the message names the type, not the key.
            let key = e
                .span()
                .and_then(|s| key_before(text, value_in(text, s.clone(), msg).unwrap_or(s.start)))
                .filter(|k| !msg.contains(&format!("`{k}`")))
                .map(|k| format!(" key `{k}`:"))
                .unwrap_or_default();
            anyhow::anyhow!("{}{line}:{key} {msg}", path.display())
        })?;
        cfg.path = path.to_path_buf();
        cfg.text = text.to_string();
        // A keepalive the file does not set follows its ping interval: six pings, at least
        // the default (a file that sets `ping_interval_ms = 2000` alone must not fail the
        // check below now that the default keepalive is 1.5 s).
        let sets_keepalive = toml::from_str::<toml::Table>(text)
            .ok()
            .and_then(|t| {
                t.get("link")
                    .and_then(|l| l.get("keepalive_timeout_ms"))
                    .cloned()
            })
            .is_some();
        if !sets_keepalive {
            cfg.link.keepalive_timeout_ms = cfg
                .link
                .keepalive_timeout_ms
                .max(cfg.link.ping_interval_ms.saturating_mul(6));
        }
        non_finite(text, path)?;
        cfg.resolve_paths();
        cfg.validate(text)?;
        cfg.join_sync_groups()?;
        Ok(cfg)
    }

    /// This config for the peer named `peer` of a listener serving several: the file read
    /// again with every `{peer}` replaced by the name (so each peer's endpoints are its own:
    /// `link = "/dev/ttyREMOTE-{peer}"`); the link settings stay this config's.
    pub fn for_peer(&self, peer: &str) -> Result<Config> {
        let name = peer_file_name(peer);
        let mut c = Config::parse(&self.text.replace("{peer}", &name), &self.path)
            .with_context(|| format!("the config for peer {name}"))?;
        c.link = self.link.clone();
        c.side = self.side;
        Ok(c)
    }

    /// Builds both halves of every pair once and drops them, so what only building finds (an
    /// `encrypt` key file that is missing or unreadable, a codec that will not start) is named
    /// now, with its stream and layer, before this side listens or connects, and by `ndd
    /// check`. `external` pairs are left out: building one starts its program (their command
    /// is checked when the config is read).
    pub fn build_pairs(&self) -> Result<()> {
        use ndd_core::Pair;
        for s in &self.streams {
            for (layer, m) in s.pairs().into_iter().enumerate() {
                if matches!(m, ModuleConfig::External(_)) {
                    continue;
                }
                let built = m.forward().and_then(|_| m.inverse());
                if let Err(e) = built {
                    bail!(
                        "{}: stream \"{}\" layer {layer} ({}): {e}",
                        self.path.display(),
                        s.name(),
                        m.name()
                    );
                }
            }
        }
        Ok(())
    }

    /// Relative paths in endpoint and pair parameters (files, ports, pty links, key files)
    /// are relative to the directory of the config file, not to where `ndd` runs, so
    /// `key_file = "mouse.key"` next to the config works from anywhere.
    fn resolve_paths(&mut self) {
        let Some(base) = self.path.parent().filter(|b| !b.as_os_str().is_empty()) else {
            return;
        };
        let base = base.to_path_buf();
        for s in &mut self.streams {
            let paths = s
                .source
                .paths_mut()
                .into_iter()
                .chain(s.sink.paths_mut())
                .chain(s.stack.iter_mut().flat_map(|m| m.get_mut().paths_mut()));
            for p in paths {
                if p.is_relative() && !p.as_os_str().is_empty() {
                    *p = base.join(&*p);
                }
            }
        }
    }

    fn validate(&self, text: &str) -> Result<()> {
        let file = self.path.display();
        if self.driver.is_empty() || self.driver.len() > 255 {
            bail!("{file}: key `driver`: must be 1 to 255 bytes long");
        }
        if self.streams.is_empty() {
            bail!("{file}: no `[[stream]]` configured; a driver needs at least one stream");
        }
        if self.streams.len() > 255 {
            bail!(
                "{file}: {} streams configured; at most 255 are allowed",
                self.streams.len()
            );
        }
        if self.link.keepalive_timeout_ms <= self.link.ping_interval_ms {
            bail!(
                "{file}: key `link.keepalive_timeout_ms`: {} must be larger than `link.ping_interval_ms` ({})",
                self.link.keepalive_timeout_ms,
                self.link.ping_interval_ms
            );
        }
        check_address(&self.link.address, &format!("{file}: key `link.address`"))?;
        if self.link.handshake_timeout_ms == 0 {
            bail!("{file}: key `link.handshake_timeout_ms`: must be at least 1 ms");
        }
        if !(1..=MAX_PEERS).contains(&self.link.peers) {
            bail!(
                "{file}: key `link.peers`: {} is out of range: 1 (one peer at a time) to {MAX_PEERS}",
                self.link.peers
            );
        }
        if self.link.chunk_bytes != 0 && self.link.chunk_bytes < 1024 {
            bail!(
                "{file}: key `link.chunk_bytes`: {} is too small: 0 (never cut frames) or at \
                 least 1024",
                self.link.chunk_bytes
            );
        }
        if self.link.max_frame_bytes < ndd_wire::MIN_MAX_BODY {
            bail!(
                "{file}: key `link.max_frame_bytes`: {} is below the minimum {}",
                self.link.max_frame_bytes,
                ndd_wire::MIN_MAX_BODY
            );
        }
        let nats = self.link.transport == ndd_link::TransportKind::Nats;
        if nats {
            if let Err(e) = self.link.nats.validate() {
                bail!("{file}: {e}");
            }
            if let Err(e) = ndd_link::nats::subjects::check_token("driver", &self.driver) {
                bail!("{file}: key `{e}` (the NATS link puts the driver's name in its subjects)");
            }
        }
        for (i, s) in self.streams.iter().enumerate() {
            let line = line_of(text, s.name.span().start);
            let name = s.name();
            if let Some((layer, m)) = s
                .stack
                .iter()
                .enumerate()
                .find(|(_, m)| matches!(m.get_ref(), ModuleConfig::Multiplex(_)))
            {
                let line = line_of(text, m.span().start);
                if !nats {
                    bail!(
                        "{file}:{line}: stream \"{name}\" layer {layer}: `multiplex` sends frames to many app sides, which only the NATS link has; set `transport = \"nats\"` in [link], or remove the layer"
                    );
                }
                if layer + 1 != s.stack.len() {
                    bail!(
                        "{file}:{line}: stream \"{name}\" layer {layer}: `multiplex` must be the last layer of its stack (it decides where each frame goes)"
                    );
                }
                if matches!(m.get_ref(), ModuleConfig::Multiplex(c) if c.mode == ndd_modules::multiplex::Mode::Split)
                    && layer > 0
                {
                    bail!(
                        "{file}:{line}: stream \"{name}\" layer {layer}: with mode = \"split\", `multiplex` \
                         must be the only layer: each app side gets one piece of every frame, so the \
                         inverse of a pair before it would never see the whole frame it made"
                    );
                }
                if s.direction != DirectionName::DeviceToApp {
                    bail!(
                        "{file}:{line}: stream \"{name}\" layer {layer}: `multiplex` spreads a device's frames over app sides; an app-to-device stream has no use for it"
                    );
                }
            }
            if nats {
                if let Some((layer, m)) = s.stack.iter().enumerate().find(|(_, m)| {
                    matches!(
                        m.get_ref(),
                        ModuleConfig::Latest(_) | ModuleConfig::Image(_)
                    )
                }) {
                    let line = line_of(text, m.span().start);
                    match m.get_ref() {
                        ModuleConfig::Image(c) if !c.broadcast() => bail!(
                            "{file}:{line}: stream \"{name}\" layer {layer}: `image` paces its \
                             source by one app side's credit, which the NATS link does not carry \
                             (many app sides); set `keyframe_ms` (e.g. 2000) to broadcast: a \
                             whole-screen keyframe that often, no credit"
                        ),
                        ModuleConfig::Image(_) => {}
                        other => bail!(
                            "{file}:{line}: stream \"{name}\" layer {layer}: `{}` paces its source \
                             by acknowledgements from the sink, which the NATS link does not carry \
                             (many app sides); use a direct link for it",
                            other.name()
                        ),
                    }
                }
            }
            if name.is_empty() || name.len() > 255 {
                bail!("{file}:{line}: key `name`: a stream name must be 1 to 255 bytes long");
            }
            if self.streams[..i].iter().any(|o| o.name() == name) {
                bail!("{file}:{line}: key `name`: stream \"{name}\" is configured twice");
            }
            // Endpoint parameters (ranges, addresses), here at check time rather than when
            // the endpoint starts after the link is up.
            if let Err(e) = s.source.validate() {
                bail!("{file}:{line}: stream \"{name}\": {e}");
            }
            if let Err(e) = s.sink.validate() {
                bail!("{file}:{line}: stream \"{name}\": {e}");
            }
            if s.stack.len() > 64 {
                bail!(
                    "{file}:{line}: key `stack`: stream \"{name}\" has {} layers; at most 64",
                    s.stack.len()
                );
            }
            for (layer, m) in s.stack.iter().enumerate() {
                let line = line_of(text, m.span().start);
                if let Err(e) = m.get_ref().validate() {
                    bail!(
                        "{file}:{line}: stream \"{name}\" layer {layer} ({}): {e}",
                        m.get_ref().name()
                    );
                }
                if let (Reliability::Reliable, Some(why)) =
                    (s.reliability, m.get_ref().drops_frames())
                {
                    bail!(
                        "{file}:{line}: stream \"{name}\" layer {layer}: {why}, but the stream is \
                         reliable (every frame must arrive); set `reliability = \"lossy\"` on it, \
                         or remove the layer"
                    );
                }
                if let (Reliability::Lossy, Some(why)) =
                    (s.reliability, m.get_ref().needs_every_frame())
                {
                    bail!(
                        "{file}:{line}: stream \"{name}\" layer {layer}: {why}, but the stream is \
                         lossy; remove `reliability = \"lossy\"` from it"
                    );
                }
            }
        }
        self.check_viewers(text)
    }

    /// Probes the endpoints `side` runs (files, device nodes, directories, X displays; see
    /// `ndd_endpoint`'s `probe`): a wrong path or display fails here, on the machine that can
    /// fix it, before any link is up. Errors name the file, the stream, the key and the fix.
    pub fn probe_side(&self, side: SideName) -> Result<()> {
        let file = self.path.display();
        for s in &self.streams {
            let name = s.name();
            if s.direction.source_side() == side {
                s.source
                    .probe()
                    .map_err(|e| anyhow::anyhow!("{file}: stream \"{name}\": {e}"))?;
            }
            if s.direction.sink_side() == side {
                s.sink
                    .probe()
                    .map_err(|e| anyhow::anyhow!("{file}: stream \"{name}\": {e}"))?;
            }
        }
        Ok(())
    }

    /// The endpoints that work in the viewer window of an `x11-window` sink (an `x11-cursor`
    /// sink, an `x11-input` source with `window = "viewer"`) need that sink, on the same
    /// display and the same side; without it they would wait 30 s at run time and fail.
    fn check_viewers(&self, text: &str) -> Result<()> {
        let file = self.path.display();
        let viewer_on = |side: SideName, display: &str| {
            self.streams.iter().any(|o| {
                o.direction.sink_side() == side
                    && matches!(&o.sink, SinkConfig::X11Window(w) if w.display == display)
            })
        };
        let wayland_viewer_on = |side: SideName, display: &str| {
            self.streams.iter().any(|o| {
                o.direction.sink_side() == side
                    && matches!(&o.sink, SinkConfig::WaylandWindow(w) if w.display == display)
            })
        };
        for s in &self.streams {
            let SourceConfig::WaylandWindowInput(c) = &s.source else {
                continue;
            };
            let side = s.direction.source_side();
            if !wayland_viewer_on(side, &c.display) {
                let line = line_of(text, s.name.span().start);
                let (side, display) = (
                    match side {
                        SideName::Device => "device",
                        SideName::App => "app",
                    },
                    &c.display,
                );
                bail!(
                    "{file}:{line}: stream \"{}\": the wayland-window-input source takes the input \
                     of the window of a wayland-window sink on display {display:?} on the {side} \
                     side, and no stream has one; add a stream with sink = {{ type = \
                     \"wayland-window\", display = \"{display}\" }}",
                    s.name()
                );
            }
        }
        for s in &self.streams {
            let (what, side, display) = match (&s.source, &s.sink) {
                (_, SinkConfig::X11Cursor(c)) => {
                    ("the x11-cursor sink", s.direction.sink_side(), &c.display)
                }
                (SourceConfig::X11Input(c), _) if c.window == X11Window::Viewer => (
                    "the x11-input source with window = \"viewer\"",
                    s.direction.source_side(),
                    &c.display,
                ),
                _ => continue,
            };
            if !viewer_on(side, display) {
                let line = line_of(text, s.name.span().start);
                let side = match side {
                    SideName::Device => "device",
                    SideName::App => "app",
                };
                bail!(
                    "{file}:{line}: stream \"{}\": {what} works in the viewer window of an \
                     x11-window sink on display {display} on the {side} side, and no stream has \
                     one; add a stream with sink = {{ type = \"x11-window\", display = \"{display}\" }}",
                    s.name()
                );
            }
        }
        Ok(())
    }

    /// Hands every `sync` layer the shared state of its group; a group spans streams of one
    /// direction and needs at least two of them.
    fn join_sync_groups(&mut self) -> Result<()> {
        use std::collections::BTreeMap;
        let file = self.path.display().to_string();
        let mut groups: BTreeMap<String, (DirectionName, Vec<String>)> = BTreeMap::new();
        for s in &self.streams {
            for m in &s.stack {
                if let ModuleConfig::Sync(c) = m.get_ref() {
                    let e = groups
                        .entry(c.group.clone())
                        .or_insert((s.direction, Vec::new()));
                    if e.0 != s.direction {
                        bail!(
                            "{file}: sync group \"{}\": stream \"{}\" flows the other way than stream \"{}\"; \
                             a group orders streams of one direction",
                            c.group,
                            s.name(),
                            e.1.first().map(String::as_str).unwrap_or("?")
                        );
                    }
                    e.1.push(s.name().to_string());
                }
            }
        }
        for (g, (_, members)) in &groups {
            if members.len() < 2 {
                bail!("{file}: sync group \"{g}\" has only stream \"{}\"; it orders two or more streams", members[0]);
            }
        }
        let shared: BTreeMap<String, _> = groups
            .keys()
            .map(|g| (g.clone(), ndd_modules::sync::SyncGroup::new_shared()))
            .collect();
        for s in &mut self.streams {
            for m in &mut s.stack {
                if let ModuleConfig::Sync(c) = m.get_mut() {
                    if let Some(g) = shared.get(&c.group) {
                        c.join(g.clone());
                    }
                }
            }
        }
        Ok(())
    }

    /// Stream id of the stream at `index` (ids are positions, from 1).
    pub fn stream_id(index: usize) -> u16 {
        (index + 1) as u16
    }

    /// What this side announces in its HELLO.
    pub fn hello(&self, side: SideName) -> ndd_wire::HelloRepr {
        ndd_wire::HelloRepr {
            side: side.wire(),
            max_body: self.link.max_frame_bytes,
            driver: self.driver.clone(),
            streams: self
                .streams
                .iter()
                .enumerate()
                .map(|(i, s)| StreamDecl {
                    id: Config::stream_id(i),
                    direction: s.direction.wire(),
                    name: s.name().to_string(),
                    layers: s
                        .pairs()
                        .iter()
                        .map(|m| LayerDecl {
                            module_id: m.id(),
                            param_hash: m.param_hash(),
                            description: m.describe(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// Most peers a listener serves at once (`link.peers`).
pub const MAX_PEERS: u32 = 1024;

/// A peer's name as `{peer}` puts it in a config: its `known_peers` name, or the first 12
/// characters of its fingerprint after `SHA256:` (or its address); only letters, digits, `.`,
/// `_` and `-` (others become `_`), so it is safe in a file name.
pub fn peer_file_name(peer: &str) -> String {
    let short: String = match peer.strip_prefix("SHA256:") {
        Some(fp) => fp.chars().take(12).collect(),
        None => peer.chars().take(64).collect(),
    };
    let name: String = short
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    // Never `.` or `..` (a directory of its own), never empty.
    if name.chars().all(|c| c == '.') {
        return format!("_{name}");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
driver = "spacenav"
[link]
address = "127.0.0.1:9000"
[[stream]]
name = "events"
direction = "device-to-app"
source = { type = "spacenav-sim" }
sink = { type = "check" }
stack = [{ type = "checksum" }, { type = "bundle", count = 4 }]
"#;

    fn err(text: &str) -> String {
        format!(
            "{:#}",
            Config::parse(text, Path::new("x.toml")).unwrap_err()
        )
    }

    /// A value of the wrong type names its key (the parser's text names only the type),
    /// inside a pair's inline table too; an unknown key keeps the parser's own text.
    #[test]
    fn a_value_of_the_wrong_type_names_its_key() {
        let e = err(&GOOD.replace("count = 4", "count = \"four\""));
        assert_eq!(
            e,
            "x.toml:10: key `count`: invalid type: string \"four\", expected u32"
        );
        let e = err(&GOOD.replace("address = \"127.0.0.1:9000\"", "chunk_bytes = -1"));
        assert_eq!(
            e,
            "x.toml:4: key `chunk_bytes`: invalid value: integer `-1`, expected u64"
        );
        let e = err(&GOOD.replace("name = \"events\"", "name = \"events\"\npairs = 3"));
        assert!(e.starts_with("x.toml:7: unknown field `pairs`"), "{e}");
        // Whatever stands before the key, the search stays on character boundaries.
        assert_eq!(key_before("é_count = 5", 11), Some("_count"));
        assert_eq!(key_before("x = 5", 99), None);
    }

    #[test]
    fn a_keepalive_the_file_does_not_set_follows_its_ping_interval() {
        let with = |link: &str| {
            Config::parse(
                &GOOD.replace("address = \"127.0.0.1:9000\"", link),
                Path::new("x.toml"),
            )
        };
        let c = with("address = \"127.0.0.1:9000\"").unwrap();
        assert_eq!(
            (c.link.ping_interval_ms, c.link.keepalive_timeout_ms),
            (250, 1500)
        );
        // An older file setting the ping alone: six pings, not a refusal.
        let c = with("ping_interval_ms = 2000").unwrap();
        assert_eq!(c.link.keepalive_timeout_ms, 12_000);
        // Set both, the check stands.
        let e = with("ping_interval_ms = 2000\nkeepalive_timeout_ms = 1500").unwrap_err();
        assert!(
            e.to_string()
                .contains("1500 must be larger than `link.ping_interval_ms` (2000)"),
            "{e}"
        );
    }

    #[test]
    fn good_config_parses() {
        let c = Config::parse(GOOD, Path::new("x.toml")).unwrap();
        assert_eq!(c.streams[0].name(), "events");
        assert_eq!(c.link.address, "127.0.0.1:9000");
        assert_eq!(c.link.listener, SideName::App);
        let h = c.hello(SideName::Device);
        assert_eq!(
            h.streams[0].layers[1].description,
            "bundle(count=4, max_delay_ms=100, max_bytes=1048576, playout_ms=0)"
        );
    }

    #[test]
    fn a_config_that_is_huge_or_not_a_regular_file_is_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("ndd-cfg-bounds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let load = |p: &Path| format!("{:#}", Config::load(p).unwrap_err());
        // A FIFO nobody writes: refused without opening it (opening would block for good).
        let fifo = dir.join("pipe.toml");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let e = load(&fifo);
        assert!(
            e.ends_with(
                "pipe.toml is a named pipe, not a regular file: give the path of a .toml file"
            ),
            "{e}"
        );
        // A device and a directory.
        let e = load(Path::new("/dev/zero"));
        assert_eq!(
            e,
            "config file /dev/zero is a device, not a regular file: give the path of a .toml file"
        );
        let e = load(&dir);
        assert!(e.contains("is a directory, not a regular file"), "{e}");
        // Over 1 MiB: refused by its size (a good config padded with a comment).
        let big = dir.join("big.toml");
        let mut text = GOOD.to_string();
        text.push('#');
        text.push_str(&"x".repeat(MAX_CONFIG_BYTES as usize));
        std::fs::write(&big, &text).unwrap();
        let e = load(&big);
        assert!(e.ends_with("big.toml is larger than 1024 KiB: that is not an ndd config (a real one is a few kB)"), "{e}");
        // Exactly the bound is read and parsed.
        text.truncate(MAX_CONFIG_BYTES as usize);
        std::fs::write(&big, &text).unwrap();
        Config::load(&big).unwrap();
        // Not UTF-8.
        std::fs::write(&big, b"driver = \"\xff\"\n").unwrap();
        let e = load(&big);
        assert!(e.ends_with("big.toml is not UTF-8 text (a bad byte at offset 10): a config is a TOML text file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn priority_defaults_by_source_and_a_wrong_one_is_named() {
        use ndd_core::session::Priority;
        let c = Config::parse(GOOD, Path::new("x.toml")).unwrap();
        assert_eq!(c.streams[0].priority(), Priority::High, "a 3D mouse");
        let synthetic = GOOD.replace("\"spacenav-sim\"", "\"synthetic\"");
        let c = Config::parse(&synthetic, Path::new("x.toml")).unwrap();
        assert_eq!(c.streams[0].priority(), Priority::Normal);
        let low = GOOD.replace("direction = ", "priority = \"low\"\ndirection = ");
        let c = Config::parse(&low, Path::new("x.toml")).unwrap();
        assert_eq!(c.streams[0].priority(), Priority::Low, "as set");
        let e = err(&GOOD.replace("direction = ", "priority = \"urgent\"\ndirection = "));
        assert!(
            e.starts_with("x.toml:7: ")
                && e.contains("unknown variant `urgent`, expected one of `high`, `normal`, `low`"),
            "{e}"
        );
    }

    #[test]
    fn image_over_nats_needs_broadcast_and_latest_is_refused_there() {
        let nats = |stack: &str| {
            format!(
                "driver = \"screen\"\n[link]\ntransport = \"nats\"\n[[stream]]\nname = \"screen\"\n\
                 direction = \"device-to-app\"\nsource = {{ type = \"camera-sim\" }}\n\
                 sink = {{ type = \"null\" }}\nstack = [{stack}]\n"
            )
        };
        let e = err(&nats(r#"{ type = "image" }"#));
        assert_eq!(
            e,
            "x.toml:9: stream \"screen\" layer 0: `image` paces its source by one app side's \
             credit, which the NATS link does not carry (many app sides); set `keyframe_ms` (e.g. \
             2000) to broadcast: a whole-screen keyframe that often, no credit"
        );
        Config::parse(
            &nats(
                r#"{ type = "image", keyframe_ms = 2000 }, { type = "multiplex", mode = "all" }"#,
            ),
            Path::new("x.toml"),
        )
        .unwrap();
        let e = err(&nats(r#"{ type = "latest" }"#));
        assert!(
            e.contains("`latest` paces its source by acknowledgements from the sink"),
            "{e}"
        );
    }

    #[test]
    fn chunk_bytes_defaults_to_4_kib_and_a_tiny_one_is_refused() {
        let c = Config::parse(GOOD, Path::new("x.toml")).unwrap();
        assert_eq!(c.link.chunk_bytes, 4096);
        let off = GOOD.replace("[link]\n", "[link]\nchunk_bytes = 0\n");
        assert_eq!(
            Config::parse(&off, Path::new("x.toml"))
                .unwrap()
                .link
                .chunk_bytes,
            0
        );
        let e = err(&GOOD.replace("[link]\n", "[link]\nchunk_bytes = 100\n"));
        assert_eq!(
            e,
            "x.toml: key `link.chunk_bytes`: 100 is too small: 0 (never cut frames) or at least \
             1024"
        );
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let text = GOOD.replace("direction = ", "colour = 1\ndirection = ");
        let e = err(&text);
        assert!(e.starts_with("x.toml:7: "), "{e}");
        assert!(e.contains("unknown field `colour`"), "{e}");
    }

    #[test]
    fn unknown_module_and_bad_parameter_name_line() {
        let e = err(&GOOD.replace("\"checksum\"", "\"chcksum\""));
        assert!(
            e.starts_with("x.toml:10: ") && e.contains("unknown variant `chcksum`"),
            "{e}"
        );
        let e = err(&GOOD.replace("count = 4", "count = 0"));
        assert_eq!(e, "x.toml:10: stream \"events\" layer 1 (bundle): bundle: count = 0 is out of range 1..=65535");
    }

    #[test]
    fn a_pair_that_drops_frames_is_refused_on_a_reliable_stream() {
        let latest = GOOD.replace("{ type = \"checksum\" }", "{ type = \"latest\" }");
        assert_eq!(
            err(&latest),
            "x.toml:10: stream \"events\" layer 0: `latest` drops the frames that are stale \
             while the link is busy, but the stream is reliable (every frame must arrive); set \
             `reliability = \"lossy\"` on it, or remove the layer"
        );
        let lossy = latest.replace("stack =", "reliability = \"lossy\"\nstack =");
        Config::parse(&lossy, Path::new("x.toml")).unwrap();
        let periodic = GOOD.replace(
            "{ type = \"checksum\" }",
            "{ type = \"periodic\", interval_ms = 16 }",
        );
        assert!(err(&periodic).contains("`periodic` forwards only the latest value"));
    }

    #[test]
    fn the_wayland_viewers_input_needs_its_wayland_window_sink() {
        let input = r#"
driver = "d"
[[stream]]
name = "input"
direction = "device-to-app"
source = { type = "wayland-window-input", display = "wayland-1" }
sink = { type = "xtest", display = ":1" }
"#;
        assert_eq!(
            err(input),
            "x.toml:4: stream \"input\": the wayland-window-input source takes the input of the \
             window of a wayland-window sink on display \"wayland-1\" on the device side, and no \
             stream has one; add a stream with sink = { type = \"wayland-window\", display = \
             \"wayland-1\" }"
        );
        let screen = r#"
[[stream]]
name = "screen"
direction = "app-to-device"
source = { type = "x11-screen", display = ":1" }
sink = { type = "wayland-window", display = "wayland-1" }
"#;
        Config::parse(&format!("{input}{screen}"), Path::new("x.toml")).unwrap();
    }

    #[test]
    fn viewer_endpoints_need_an_x11_window_sink_on_their_display_and_side() {
        let cursor = r#"
driver = "d"
[[stream]]
name = "cursor"
direction = "app-to-device"
source = { type = "x11-cursor", display = ":1" }
sink = { type = "x11-cursor", display = ":0" }
"#;
        assert_eq!(
            err(cursor),
            "x.toml:4: stream \"cursor\": the x11-cursor sink works in the viewer window of an \
             x11-window sink on display :0 on the device side, and no stream has one; add a \
             stream with sink = { type = \"x11-window\", display = \":0\" }"
        );
        let screen = r#"
[[stream]]
name = "screen"
direction = "app-to-device"
source = { type = "x11-screen", display = ":1" }
sink = { type = "x11-window", display = ":0" }
"#;
        Config::parse(&format!("{cursor}{screen}"), Path::new("x.toml")).unwrap();
        let input = r#"
driver = "d"
[[stream]]
name = "input"
direction = "device-to-app"
source = { type = "x11-input", display = ":0", window = "viewer" }
sink = { type = "xtest", display = ":1" }
"#;
        assert!(err(input).contains("the x11-input source with window = \"viewer\" works in"));
        Config::parse(&format!("{input}{screen}"), Path::new("x.toml")).unwrap();
        // A window on the other display does not count.
        assert!(err(&format!(
            "{input}{}",
            screen.replace("\":0\" }", "\":5\" }")
        ))
        .contains("display :0"));
    }

    #[test]
    fn the_image_codec_is_refused_on_a_lossy_stream() {
        let image = GOOD.replace("{ type = \"checksum\" }", "{ type = \"image\" }");
        Config::parse(&image, Path::new("x.toml")).unwrap();
        let lossy = image.replace("stack =", "reliability = \"lossy\"\nstack =");
        assert_eq!(
            err(&lossy),
            "x.toml:11: stream \"events\" layer 0: `image` sends only what changed since its \
             earlier frames, and paces the source by its credit, but the stream is lossy; remove \
             `reliability = \"lossy\"` from it"
        );
    }

    #[test]
    fn sync_groups_join_streams_of_one_direction() {
        let two = r#"
driver = "d"
[[stream]]
name = "keys"
direction = "device-to-app"
source = { type = "synthetic" }
sink = { type = "null" }
stack = [{ type = "sync", group = "input" }]
[[stream]]
name = "mouse"
direction = "DIR"
source = { type = "synthetic" }
sink = { type = "null" }
stack = [{ type = "bundle" }, { type = "sync", group = "input" }]
"#;
        let c = Config::parse(&two.replace("DIR", "device-to-app"), Path::new("x.toml")).unwrap();
        let joined = |i: usize, l: usize| match c.streams[i].stack[l].get_ref() {
            ModuleConfig::Sync(s) => s.shared.0.clone().expect("joined"),
            _ => panic!("not sync"),
        };
        assert!(std::sync::Arc::ptr_eq(&joined(0, 0), &joined(1, 1)));
        let e = err(&two.replace("DIR", "app-to-device"));
        assert!(
            e.contains("sync group \"input\": stream \"mouse\" flows the other way"),
            "{e}"
        );
        let one = two
            .replace(
                r#"{ type = "sync", group = "input" }]
[[stream]]"#,
                r#"{ type = "sync", group = "solo" }]
[[stream]]"#,
            )
            .replace("DIR", "device-to-app");
        assert!(
            err(&one).contains("sync group \"input\" has only stream \"mouse\""),
            "{}",
            err(&one)
        );
    }

    #[test]
    fn relative_paths_are_relative_to_the_config_file() {
        let text = r#"
driver = "paths"
[[stream]]
name = "a"
direction = "device-to-app"
source = { type = "file", path = "in.txt" }
sink = { type = "file", path = "/abs/out.txt" }
stack = [{ type = "encrypt", key_file = "keys/k.key" }]
[[stream]]
name = "b"
direction = "app-to-device"
source = { type = "pty", link = "../ttyX" }
sink = { type = "framebuffer", path = "fb.raw" }
"#;
        let c = Config::parse(text, Path::new("/etc/ndd/x.toml")).unwrap();
        let mut s0 = c.streams[0].source.clone();
        let mut k0 = c.streams[0].sink.clone();
        assert_eq!(*s0.paths_mut()[0], PathBuf::from("/etc/ndd/in.txt"));
        assert_eq!(*k0.paths_mut()[0], PathBuf::from("/abs/out.txt"));
        let mut m = c.streams[0].stack[0].get_ref().clone();
        assert_eq!(*m.paths_mut()[0], PathBuf::from("/etc/ndd/keys/k.key"));
        let mut s1 = c.streams[1].source.clone();
        let mut k1 = c.streams[1].sink.clone();
        assert_eq!(*s1.paths_mut()[0], PathBuf::from("/etc/ndd/../ttyX"));
        assert_eq!(*k1.paths_mut()[0], PathBuf::from("/etc/ndd/fb.raw"));
        // A config without a directory (embedded, or in the working directory) keeps them.
        let c = Config::parse(text, Path::new("x.toml")).unwrap();
        let mut s0 = c.streams[0].source.clone();
        assert_eq!(*s0.paths_mut()[0], PathBuf::from("in.txt"));
    }

    #[test]
    fn duplicate_stream_and_syntax_error() {
        let twice = format!("{GOOD}{}", &GOOD[GOOD.find("[[stream]]").unwrap()..]);
        assert!(err(&twice).contains("stream \"events\" is configured twice"));
        let e = err("driver = \"x\"\n[[stream]\n");
        assert!(e.starts_with("x.toml:2: "), "{e}");
    }

    #[test]
    fn nan_inf_and_out_of_range_ports_are_refused_with_their_key() {
        let nan = GOOD.replace(
            "source = { type = \"spacenav-sim\" }",
            "source = { type = \"synthetic\", interval_ms = nan }",
        );
        let e = err(&nan);
        assert_eq!(
            e,
            "x.toml:8: key `stream[0].source.interval_ms`: NaN is not a number ndd can use; write a finite number"
        );
        let inf = nan.replace("= nan", "= -inf");
        assert!(err(&inf).contains("key `stream[0].source.interval_ms`: -inf is not"));
        let port = GOOD.replace("127.0.0.1:9000", "127.0.0.1:78822");
        assert_eq!(
            err(&port),
            "x.toml: key `link.address`: \"127.0.0.1:78822\": port 78822 is not a number from 0 to 65535"
        );
        assert!(err(&GOOD.replace("127.0.0.1:9000", "localhost")).contains("has no port"));
        assert!(check_address("[::1]:7878", "x").is_ok());
        assert!(check_address(":7878", "x")
            .unwrap_err()
            .to_string()
            .contains("has no host"));
    }

    #[test]
    fn probing_a_side_names_the_stream_and_the_key() {
        let text = GOOD.replace(
            "sink = { type = \"check\" }",
            "sink = { type = \"file\", path = \"/nonexistent/dir/out\" }",
        );
        let c = Config::parse(&text, Path::new("x.toml")).unwrap();
        // The device side runs the source only: nothing to probe there.
        c.probe_side(SideName::Device).unwrap();
        let e = format!("{:#}", c.probe_side(SideName::App).unwrap_err());
        assert!(
            e.starts_with(
                "x.toml: stream \"events\": file sink: key `path`: directory /nonexistent/dir: "
            ),
            "{e}"
        );
    }

    #[test]
    fn a_peer_name_in_a_config_is_safe_in_a_file_name() {
        assert_eq!(peer_file_name("lab1"), "lab1");
        assert_eq!(
            peer_file_name("SHA256:/RV4GYERbd6IitM2UfsJhRZVTeZxzdLBw/OE4FDsRjM"),
            "_RV4GYERbd6I"
        );
        assert_eq!(peer_file_name("../../etc/x y"), ".._.._etc_x_y");
        assert_eq!(peer_file_name("10.0.0.7:40122"), "10.0.0.7_40122");
        assert_eq!(peer_file_name(".."), "_..");
        assert_eq!(peer_file_name(""), "_");
    }

    #[test]
    fn peers_out_of_range_are_named() {
        let e = Config::parse(
            "driver = \"d\"\n[link]\npeers = 0\n[[stream]]\nname = \"s\"\ndirection = \"device-to-app\"\nsource = { type = \"synthetic\" }\nsink = { type = \"null\" }\n",
            Path::new("x.toml"),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("key `link.peers`: 0 is out of range"),
            "{e}"
        );
    }
}
