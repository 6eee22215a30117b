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
        }
    }
}
