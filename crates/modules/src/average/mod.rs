//! `average`: combines windows of typed records into one record (dissertation §4.8.2
//! "Averaging"); the inverse is a no-op.
//!
//! Synopsis: `{ type = "average", preset = "spacenav", count = 4, window_ms = 0 }` or
//! `{ type = "average", fields = ["i16:sum", "i16:sum", "u8:or"], endian = "big", count = 4, window_ms = 0 }`
//!
//! Averaging needs to know the message format: a record is a fixed list of typed fields
//! ([`layout`]), each combined by its own rule: `avg` for absolute values (3D-mouse axes),
//! `sum` for relative deltas (mouse motion: averaging would lose distance), `or` for button
//! masks (a button pressed at any time in the window is not lost), `last`, `max`, `min`.
//!
//! - forward half: every frame must hold one or more whole records (any other length is a
//!   `MalformedFrame` naming the expected length: it is the device's data that is wrong). It
//!   adds the frame's records to the current window and emits one combined record, in one
//!   frame, when the window holds `count` records (`count` ≠ 0) or when `window_ms`
//!   (≠ 0) has passed since the window's first frame; flushing emits a partial window.
//!   A window always takes whole frames: a frame is never split between two windows (with
//!   several records per frame, a window closes at the end of the frame that brings it to
//!   `count` or more).
//! - The emitted frame carries the meta (seq, timestamp, flags) of the window's **last**
//!   frame: the record is as new as its newest sample, so its timestamp tells the sink (and
//!   the latency statistics) the age of the freshest data in it, not of the stalest. And since
//!   every frame belongs to exactly one window, no two emitted frames share a seq: seq keeps
//!   growing within the stream (docs/protocol.md §4.1).
//! - inverse half: passes frames on untouched (averaging changes content, not form).
//!
//! No control messages (one received is `MalformedControl`). Stats: forward `records_in`,
//! `records_out`, queue depth (frames in the open window).

mod forward;
mod inverse;
pub mod layout;
#[cfg(test)]
mod tests;

pub use forward::AverageForward;
pub use inverse::AverageInverse;
pub use layout::{Accumulator, Endian, Field, FieldError, FieldType, Mode, Preset};

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use layout::fields_text;
use ndd_core::{ControlError, Half, ModuleError, Pair, ParamError};
use serde::Deserialize;
use std::time::Duration;

/// Most fields a record may have.
pub const MAX_FIELDS: usize = 256;

/// Parameters of `average`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AverageConfig {
    /// A named layout (exclusive with `fields`). With neither, the `spacenav` layout.
    pub preset: Option<Preset>,
    /// The record layout, one `TYPE:MODE` per field (exclusive with `preset`).
    pub fields: Option<Vec<Field>>,
    /// Byte order of the multi-byte fields.
    pub endian: Endian,
    /// Records per window; 0 = no record limit.
    pub count: u32,
    /// Longest window, in ms from its first frame; 0 = no time limit.
    pub window_ms: u64,
}

impl Default for AverageConfig {
    fn default() -> Self {
        AverageConfig {
            preset: None,
            fields: None,
            endian: Endian::Big,
            count: 4,
            window_ms: 0,
        }
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "average";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.average,
    summary: "combines N records or T ms of typed records into one (avg, sum, or, last, max, min per field)",
    params: &[
        ParamInfo {
            name: "preset",
            ty: "\"spacenav\" | \"rel-mouse\"",
            default: "\"spacenav\"",
            doc: "named layout, used when `fields` is absent; exclusive with `fields`",
        },
        ParamInfo {
            name: "fields",
            ty: "1..=256 of \"TYPE:MODE\", TYPE u8 i8 u16 i16 u32 i32 f32 f64, MODE avg sum last or max min",
            default: "the preset's",
            doc: "record layout, one entry per field in byte order (`or` needs an integer type)",
        },
        ParamInfo {
            name: "endian",
            ty: "\"big\" | \"little\"",
            default: "\"big\"",
            doc: "byte order of multi-byte fields",
        },
        ParamInfo {
            name: "count",
            ty: "integer 0..=65535",
            default: "4",
            doc: "records per window (0: no limit)",
        },
        ParamInfo {
            name: "window_ms",
            ty: "integer 0..=60000",
            default: "0",
            doc: "longest window from its first frame (0: no limit); count or window_ms must be > 0",
        },
    ],
};

/// The error for a control message to a pair that defines none.
fn no_control(len: usize) -> ModuleError {
    ModuleError::from(ControlError::NoControl {
        pair: Some(PAIR),
        len: Some(len),
    })
}

impl AverageConfig {
    /// The record layout in effect: `fields`, else the preset's, else `spacenav`'s.
    pub fn layout(&self) -> Vec<Field> {
        match (&self.fields, self.preset) {
            (Some(f), _) => f.clone(),
            (None, Some(p)) => p.fields(),
            (None, None) => Preset::Spacenav.fields(),
        }
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        if let (Some(_), Some(p)) = (&self.fields, self.preset) {
            return Err(ParamError::Exclusive {
                pair: PAIR,
                param: "preset",
                value: p.name().to_string(),
                other: "fields",
            });
        }
        let fields = self.layout();
        if !(1..=MAX_FIELDS).contains(&fields.len()) {
            return Err(ParamError::Count {
                pair: PAIR,
                param: "fields",
                len: fields.len(),
                min: 1,
                max: MAX_FIELDS,
            });
        }
        for f in &fields {
            f.check()?;
        }
        ParamError::check_range(PAIR, "count", self.count, 0..=65535)?;
        ParamError::check_range(PAIR, "window_ms", self.window_ms, 0..=60_000)?;
        if self.count == 0 && self.window_ms == 0 {
            return Err(ParamError::BothZero {
                pair: PAIR,
                first: "count",
                first_max: 65535,
                second: "window_ms",
                second_max: 60_000,
            });
        }
        Ok(())
    }
}

impl Pair for AverageConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    /// The preset is expanded into `fields`, so a preset and the same explicit list announce
    /// the same parameter hash.
    fn describe(&self) -> String {
        format!(
            "average(fields=[{}], endian={}, count={}, window_ms={})",
            fields_text(&self.layout()),
            self.endian.name(),
            self.count,
            self.window_ms
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        let fields = self.layout();
        let window = (self.window_ms > 0).then(|| Duration::from_millis(self.window_ms));
        Ok(Box::new(AverageForward::new(
            Accumulator::new(&fields, self.endian),
            &fields,
            u64::from(self.count),
            window,
        )))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(AverageInverse))
    }
}
