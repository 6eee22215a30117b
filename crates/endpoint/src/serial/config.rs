//! Parameters of the `serial` and `pty` endpoints (the same for source and sink: both streams
//! of a driver name the same port), as written in a config file.

use super::record::{Flow, LineSettings, Parity};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

fn default_baud() -> u32 {
    115_200
}
fn default_data_bits() -> u8 {
    8
}
fn default_stop_bits() -> u8 {
    1
}

/// `serial` source and sink parameters: a tty and its line settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialConfig {
    /// The tty, e.g. `/dev/ttyUSB0`.
    pub path: PathBuf,
    /// Bits per second.
    #[serde(default = "default_baud")]
    pub baud: u32,
    /// 5..=8.
    #[serde(default = "default_data_bits")]
    pub data_bits: u8,
    /// Parity.
    #[serde(default)]
    pub parity: Parity,
    /// 1 or 2.
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u8,
    /// Flow control.
    #[serde(default)]
    pub flow: Flow,
}

/// `pty` source and sink parameters: where the slave is linked, and its initial settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyConfig {
    /// Symlink to the pty's slave, e.g. `/tmp/ttyREMOTE`.
    pub link: PathBuf,
    /// Initial bits per second.
    #[serde(default = "default_baud")]
    pub baud: u32,
    /// Initial character size, 5..=8.
    #[serde(default = "default_data_bits")]
    pub data_bits: u8,
    /// Initial parity.
    #[serde(default)]
    pub parity: Parity,
    /// Initial stop bits, 1 or 2.
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u8,
    /// Initial flow control.
    #[serde(default)]
    pub flow: Flow,
    /// Seconds the pty is kept for the next run of this side after it ends or dies, so a
    /// program holding the port never sees it go (0: it goes with the side).
    #[serde(default = "default_keep_s")]
    pub keep_s: u32,
}

fn default_keep_s() -> u32 {
    super::hold::DEFAULT_KEEP_S
}

/// `rfc2217-server` source and sink parameters: where RFC 2217 clients connect, and the line
/// settings a client finds before it sets its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rfc2217ServerConfig {
    /// `IP:PORT` to listen on, e.g. `127.0.0.1:2217`.
    pub listen: String,
    /// Initial bits per second.
    #[serde(default = "default_baud")]
    pub baud: u32,
    /// Initial character size, 5..=8.
    #[serde(default = "default_data_bits")]
    pub data_bits: u8,
    /// Initial parity.
    #[serde(default)]
    pub parity: Parity,
    /// Initial stop bits, 1 or 2.
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u8,
    /// Initial flow control.
    #[serde(default)]
    pub flow: Flow,
    /// A client that has not read what the server sends for this long (ms) is let go, and the
    /// port is free for the next one; 0: never.
    #[serde(default = "default_stall_timeout_ms")]
    pub stall_timeout_ms: u64,
}

fn default_stall_timeout_ms() -> u64 {
    10_000
}

/// `rfc2217-client` source and sink parameters: the RFC 2217 server (ser2net, …) whose port
/// is the device, and the line settings asked for when connecting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rfc2217ClientConfig {
    /// `HOST:PORT` of the server, e.g. `ser2net-host:2000`.
    pub address: String,
    /// Bits per second.
    #[serde(default = "default_baud")]
    pub baud: u32,
    /// 5..=8.
    #[serde(default = "default_data_bits")]
    pub data_bits: u8,
    /// Parity.
    #[serde(default)]
    pub parity: Parity,
    /// 1 or 2.
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u8,
    /// Flow control.
    #[serde(default)]
    pub flow: Flow,
}

macro_rules! settings_of {
    ($t:ty) => {
        impl $t {
            /// The configured line settings.
            pub fn settings(&self) -> LineSettings {
                LineSettings {
                    baud: self.baud,
                    data_bits: self.data_bits,
                    parity: self.parity,
                    stop_bits: self.stop_bits,
                    flow: self.flow,
                }
            }
        }
    };
}
settings_of!(SerialConfig);
settings_of!(PtyConfig);
settings_of!(Rfc2217ServerConfig);
settings_of!(Rfc2217ClientConfig);

/// Why `listen` is not an `IP:PORT` to listen on, if it is not.
pub(crate) fn check_listen(listen: &str) -> Result<(), String> {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(a) if a.port() != 0 => Ok(()),
        Ok(_) => Err(format!(
            "{listen:?}: port 0 is not a fixed port clients can find"
        )),
        Err(_) => Err(format!(
            "{listen:?} is not IP:PORT (e.g. \"127.0.0.1:2217\", or \"[::1]:2217\")"
        )),
    }
}

/// Why `address` is not a `HOST:PORT` to connect to, if it is not.
pub(crate) fn check_address(address: &str) -> Result<(), String> {
    let bad = || format!("{address:?} is not HOST:PORT (e.g. \"ser2net-host:2000\")");
    let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok(())
}

impl SerialConfig {
    /// A port at `path` with the default settings (115200 8N1, no flow control).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SerialConfig {
            path: path.into(),
            baud: default_baud(),
            data_bits: default_data_bits(),
            parity: Parity::None,
            stop_bits: default_stop_bits(),
            flow: Flow::None,
        }
    }
}

impl PtyConfig {
    /// A pty linked at `link` with the default settings (115200 8N1, no flow control).
    pub fn new(link: impl Into<PathBuf>) -> Self {
        PtyConfig {
            link: link.into(),
            baud: default_baud(),
            data_bits: default_data_bits(),
            parity: Parity::None,
            stop_bits: default_stop_bits(),
            flow: Flow::None,
            keep_s: default_keep_s(),
        }
    }

    /// Checks `keep_s` (the line settings are checked apart); the error names the key.
    pub(crate) fn check_keep(&self) -> Result<(), (&'static str, &'static str)> {
        if self.keep_s > 86_400 {
            return Err((
                "keep_s",
                "must be 0..=86400 (seconds; 0: the pty goes with the side)",
            ));
        }
        Ok(())
    }
}
