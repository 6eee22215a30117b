//! `multiplex`: one device stream to many application machines (003 §4.8.2). The forward half
//! marks (and for `split` cuts) every frame; the link that fans out (the NATS link, the only
//! one with more than one app side) reads the mark with [`route_of`] and sends the frame to
//! every app side, to one of them, or part `i` to the app side holding slot `i`.
//!
//! Synopsis: `{ type = "multiplex", mode = "all", parts = 2 }`
//!
//! - `mode = "all"`: every frame to every app side (a copy each).
//! - `mode = "round-robin"`: each frame to exactly one app side, in turn (NATS queue group:
//!   the broker picks the next free member).
//! - `mode = "split"`: each frame cut into `parts` contiguous pieces of (nearly) equal length;
//!   piece `i` goes to the app side holding slot `i` (slots are handed out at the handshake,
//!   lowest free first). Every piece keeps the frame's sequence number and timestamp, and its
//!   header names its index and the count, so a later join can put the frame back together
//!   (image tiles: cut a frame of rows, each machine works on its band).
//!
//! Header (5 bytes, pushed in the headroom; all integers big-endian):
//!
//! ```text
//! off size
//!  0   1   mode: 0 all, 1 round-robin, 2 split
//!  1   2   part index (0 unless split)
//!  3   2   parts (1 unless split)
//! ```
//!
//! The inverse half checks the header against its own parameters (a piece of another split,
//! an index out of range, a mode it was not set up for: dropped with one error line), pops
//! it, and hands the frame (or piece) on. No control messages. Stats: forward `frames`,
//! `pieces`; inverse `frames`, and per split the index of the last piece seen (`part`).
//!
//! The pair must be the last one of its stream (it decides where a frame goes, so nothing
//! may wrap it), and it needs a link with many app sides: `ndd check` refuses it elsewhere.

mod forward;
mod inverse;
#[cfg(test)]
mod tests;

pub use forward::MultiplexForward;
pub use inverse::MultiplexInverse;

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{FrameError, Half, ModuleError, Pair, ParamError};
use serde::Deserialize;

/// Length of the pair header.
pub const HEADER_LEN: usize = 5;
/// Most pieces a frame may be cut into.
pub const MAX_PARTS: u16 = 256;

/// The pair's name, first in its error texts.
const PAIR: &str = "multiplex";

/// Where frames go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Every frame to every app side.
    #[default]
    All,
    /// Each frame to one app side, in turn.
    RoundRobin,
    /// Each frame cut into `parts` pieces, piece `i` to slot `i`.
    Split,
}

impl Mode {
    /// As written in config files.
    pub fn name(self) -> &'static str {
        match self {
            Mode::All => "all",
            Mode::RoundRobin => "round-robin",
            Mode::Split => "split",
        }
    }

    fn code(self) -> u8 {
        match self {
            Mode::All => 0,
            Mode::RoundRobin => 1,
            Mode::Split => 2,
        }
    }

    fn from_code(c: u8) -> Option<Mode> {
        match c {
            0 => Some(Mode::All),
            1 => Some(Mode::RoundRobin),
            2 => Some(Mode::Split),
            _ => None,
        }
    }
}

/// Where one frame goes, read from its header by the fanning-out link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To every app side.
    All,
    /// To one app side.
    Any,
    /// To the app side holding slot `part` (of `parts`).
    Part {
        /// Index of the piece.
        part: u16,
        /// Pieces per frame.
        parts: u16,
    },
}

/// The pair header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Mode of the forward half.
    pub mode: Mode,
    /// Piece index.
    pub part: u16,
    /// Pieces per frame.
    pub parts: u16,
}

impl Header {
    /// Parses the first [`HEADER_LEN`] bytes; the error names what is wrong.
    pub fn parse(b: &[u8]) -> Result<Header, FrameError> {
        let Some(h) = b.get(..HEADER_LEN) else {
            return Err(if b.is_empty() {
                FrameError::Empty {
                    pair: PAIR,
                    missing: "mode byte",
                }
            } else {
                FrameError::ShortHeader {
                    pair: PAIR,
                    len: b.len(),
                    need: HEADER_LEN,
                    header: "multiplex",
                }
            });
        };
        let mode = Mode::from_code(h[0]).ok_or(FrameError::UnknownValue {
            pair: PAIR,
            field: "mode",
            value: u64::from(h[0]),
        })?;
        let part = u16::from_be_bytes([h[1], h[2]]);
        let parts = u16::from_be_bytes([h[3], h[4]]);
        let expected_parts_ok = match mode {
            Mode::Split => (1..=MAX_PARTS).contains(&parts),
            Mode::All | Mode::RoundRobin => parts == 1,
        };
        if !expected_parts_ok {
            return Err(FrameError::UnknownValue {
                pair: PAIR,
                field: "part count",
                value: u64::from(parts),
            });
        }
        if part >= parts {
            return Err(FrameError::UnknownValue {
                pair: PAIR,
                field: "part index",
                value: u64::from(part),
            });
        }
        Ok(Header { mode, part, parts })
    }

    /// The 5 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let p = self.part.to_be_bytes();
        let n = self.parts.to_be_bytes();
        [self.mode.code(), p[0], p[1], n[0], n[1]]
    }

    /// Where the frame goes.
    pub fn route(&self) -> Route {
        match self.mode {
            Mode::All => Route::All,
            Mode::RoundRobin => Route::Any,
            Mode::Split => Route::Part {
                part: self.part,
                parts: self.parts,
            },
        }
    }
}

/// Where a frame that left a `multiplex` forward half goes (its payload starts with the pair
/// header).
pub fn route_of(payload: &[u8]) -> Result<Route, FrameError> {
    Header::parse(payload).map(|h| h.route())
}

/// Parameters of `multiplex`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MultiplexConfig {
    /// `all`, `round-robin` or `split`.
    pub mode: Mode,
    /// Pieces per frame (`split`); must be 1 for the other modes.
    pub parts: u16,
}

impl Default for MultiplexConfig {
    fn default() -> Self {
        MultiplexConfig {
            mode: Mode::All,
            parts: 1,
        }
    }
}

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.multiplex,
    summary: "one device stream to many app sides (NATS link): a copy to all, round-robin, or \
              each frame split in parts across them",
    params: &[
        ParamInfo {
            name: "mode",
            ty: "\"all\" | \"round-robin\" | \"split\"",
            default: "\"all\"",
            doc: "every frame to every app side, each to one, or pieces to slots",
        },
        ParamInfo {
            name: "parts",
            ty: "integer 1..=256",
            default: "1",
            doc: "pieces per frame with mode = \"split\" (1 otherwise)",
        },
    ],
};

impl MultiplexConfig {
    /// Checks ranges and that `parts` fits the mode.
    pub fn validate(&self) -> Result<(), ParamError> {
        match self.mode {
            Mode::Split => ParamError::check_range(PAIR, "parts", self.parts, 1..=MAX_PARTS),
            Mode::All | Mode::RoundRobin => {
                ParamError::check_range(PAIR, "parts", self.parts, 1..=1)
            }
        }
    }

    /// How many app sides hold a slot (`parts` for split, otherwise 0: any number join).
    pub fn slots(&self) -> u16 {
        match self.mode {
            Mode::Split => self.parts,
            Mode::All | Mode::RoundRobin => 0,
        }
    }
}

impl Pair for MultiplexConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!("multiplex(mode={}, parts={})", self.mode.name(), self.parts)
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(MultiplexForward::new(self.mode, self.parts)))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(MultiplexInverse::new(self.mode, self.parts)))
    }
}
