//! `opus`: codes sound with Opus (RFC 6716, libopus) on the wire: 48 kHz stereo PCM at
//! 1.5 Mbit/s becomes 64 kbit/s by default.
//!
//! Synopsis: `{ type = "opus", bitrate = 64000, application = "audio" }`
//!
//! - forward half: each PCM [audio record](ndd_wire::audio) (mono or stereo, at 8, 12, 16,
//!   24 or 48 kHz, a block of 2.5, 5, 10, 20, 40 or 60 ms) becomes one Opus record of the
//!   same rate, channels and length carrying one packet, coded at `bitrate` for
//!   `application`. Meta passes unchanged. A record Opus cannot code (another rate, more
//!   than two channels, another block length) fails the stream with what Opus takes.
//! - inverse half: decodes each Opus record back to PCM. When frames are missing before it
//!   (a lossy stream lost them: its sequence number jumped), Opus's packet-loss concealment
//!   fills up to [`MAX_CONCEALED`] blocks in front of it, so a lost block is heard as a short
//!   guess, not a gap. PCM records pass unchanged.
//!
//! One encoder and one decoder per stream, created at the first record (again when the
//! rate or channels change). No control messages. Stats: forward `coded`, `bytes_out`;
//! inverse `decoded`, `concealed`.

#[cfg(feature = "media")]
mod forward;
#[cfg(feature = "media")]
mod inverse;
#[cfg(all(test, feature = "media"))]
mod tests;

#[cfg(feature = "media")]
pub use forward::OpusForward;
#[cfg(feature = "media")]
pub use inverse::OpusInverse;

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{Half, ModuleError, Pair, ParamError};
use serde::Deserialize;
use std::fmt;

/// Blocks of concealment the inverse makes at most in front of a record after a loss.
pub const MAX_CONCEALED: u64 = 5;

/// What the encoder tunes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Application {
    /// Speech: intelligibility first.
    Voip,
    /// Music and everything else: fidelity first.
    Audio,
    /// The lowest coding delay (no speech mode).
    Lowdelay,
}

impl Application {
    fn name(self) -> &'static str {
        match self {
            Application::Voip => "voip",
            Application::Audio => "audio",
            Application::Lowdelay => "lowdelay",
        }
    }

    #[cfg(feature = "media")]
    fn opus(self) -> opus::Application {
        match self {
            Application::Voip => opus::Application::Voip,
            Application::Audio => opus::Application::Audio,
            Application::Lowdelay => opus::Application::LowDelay,
        }
    }
}

impl fmt::Display for Application {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parameters of `opus`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OpusConfig {
    /// Bits per second of the coded sound, 6000..=510000.
    pub bitrate: u32,
    /// `voip`, `audio` or `lowdelay`.
    pub application: Application,
}

impl Default for OpusConfig {
    fn default() -> Self {
        OpusConfig {
            bitrate: 64_000,
            application: Application::Audio,
        }
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "opus";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.opus,
    summary: "codes PCM audio records with Opus (libopus); the inverse conceals lost blocks",
    params: &[
        ParamInfo {
            name: "bitrate",
            ty: "integer 6000..=510000",
            default: "64000",
            doc: "bits per second of the coded sound",
        },
        ParamInfo {
            name: "application",
            ty: "\"voip\" | \"audio\" | \"lowdelay\"",
            default: "\"audio\"",
            doc: "speech, everything else, or the lowest coding delay",
        },
    ],
};

impl OpusConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        ParamError::check_range(PAIR, "bitrate", self.bitrate, 6_000..=510_000)
    }
}

impl Pair for OpusConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!(
            "opus(bitrate={}, application={})",
            self.bitrate, self.application
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        #[cfg(not(feature = "media"))]
        return Err(crate::registry::not_built_in(PAIR));
        #[cfg(feature = "media")]
        Ok(Box::new(OpusForward::new(self.bitrate, self.application)))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        #[cfg(not(feature = "media"))]
        return Err(crate::registry::not_built_in(PAIR));
        #[cfg(feature = "media")]
        Ok(Box::new(OpusInverse::new()))
    }
}

/// Opus's channel count for `channels`, if it codes it.
#[cfg(feature = "media")]
fn channels(channels: u8) -> Option<opus::Channels> {
    match channels {
        1 => Some(opus::Channels::Mono),
        2 => Some(opus::Channels::Stereo),
        _ => None,
    }
}
