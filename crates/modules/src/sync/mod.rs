//! `sync`: puts the frames of several streams back into their original order across
//! streams, by source timestamp, with a bounded playout delay (dissertation §4.8.2
//! "Synchronizing Multiple Data Streams", Figure 4.5).
//!
//! Synopsis: `{ type = "sync", group = "input", max_delay_ms = 50 }` on every stream of the
//! group (same direction, same peer, so their timestamps come from one clock).
//!
//! Streams travel separately, each with its own stack, so one can overtake another (a bundled
//! mouse stream behind an unbundled keyboard stream, a retransmission on one of them). The
//! inverse half of every member holds its frames until no earlier frame can still come from
//! the other members (each member's newest source timestamp so far is its *watermark*: a frame
//! with timestamp T is released once every other member's watermark has reached T), or until
//! it has waited `max_delay_ms`, whichever comes first. The application then sees the events
//! of the group in the order the devices produced them, at most `max_delay_ms` late. The
//! streams stay separate (each keeps its own sink).
//!
//! The forward half passes frames on untouched; there is no header and no control message.
//! The members of a group find each other through a shared [`SyncGroup`] the config loader
//! hands to each member's config ([`SyncConfig::join`]); a member built without one works
//! alone (everything is released at once).
//!
//! Stats (inverse): queue depth, `in_order` (released because the other members caught up),
//! `timed_out` (released by the delay bound).

mod inverse;
#[cfg(test)]
mod tests;

pub use inverse::SyncInverse;

use crate::pass::PassHalf;
use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{Half, ModuleError, Pair, ParamError};
use serde::Deserialize;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Parameters of `sync`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyncConfig {
    /// Name of the group; every stream with the same group is ordered together.
    pub group: String,
    /// Longest a frame is held waiting for the other members, in ms.
    pub max_delay_ms: u64,
    /// The group's shared state, handed over by the config loader (never from the file).
    #[serde(skip)]
    pub shared: SyncHandle,
}

impl Default for SyncConfig {
    fn default() -> Self {
        SyncConfig {
            group: "sync".into(),
            max_delay_ms: 50,
            shared: SyncHandle::default(),
        }
    }
}

/// Watermarks of a group's members (newest source timestamp seen per member).
#[derive(Debug, Default)]
pub struct SyncGroup {
    watermarks: Vec<Option<u64>>,
}

impl SyncGroup {
    /// A new, empty group, shared by its members.
    pub fn new_shared() -> Arc<Mutex<SyncGroup>> {
        Arc::new(Mutex::new(SyncGroup::default()))
    }

    fn join(&mut self) -> usize {
        self.watermarks.push(None);
        self.watermarks.len() - 1
    }

    fn advance(&mut self, member: usize, ts: u64) {
        if let Some(w) = self.watermarks.get_mut(member) {
            *w = Some(w.map_or(ts, |old| old.max(ts)));
        }
    }

    /// Whether every member other than `member` has reached `ts`.
    fn others_reached(&self, member: usize, ts: u64) -> bool {
        self.watermarks
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != member)
            .all(|(_, w)| w.is_some_and(|w| w >= ts))
    }
}

/// The shared state of a group, as held by a config (compares equal whatever it holds: it is
/// runtime wiring, not a parameter).
#[derive(Clone, Default)]
pub struct SyncHandle(pub Option<Arc<Mutex<SyncGroup>>>);

impl PartialEq for SyncHandle {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for SyncHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "SyncHandle(joined)"
        } else {
            "SyncHandle(alone)"
        })
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "sync";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.sync,
    summary: "orders the frames of several streams by source timestamp, at most T ms late",
    params: &[
        ParamInfo {
            name: "group",
            ty: "string, 1..=64 bytes",
            default: "sync",
            doc: "streams with the same group are ordered together",
        },
        ParamInfo {
            name: "max_delay_ms",
            ty: "integer 0..=10000",
            default: "50",
            doc: "longest a frame waits for the other members",
        },
    ],
};

impl SyncConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ParamError> {
        if self.group.is_empty() || self.group.len() > 64 {
            return Err(ParamError::Invalid {
                pair: PAIR,
                param: "group",
                value: self.group.clone(),
                reason: "must be 1 to 64 bytes long",
            });
        }
        ParamError::check_range(PAIR, "max_delay_ms", self.max_delay_ms, 0..=10_000)
    }

    /// Makes this member part of `group` (the config loader calls it for every member).
    pub fn join(&mut self, group: Arc<Mutex<SyncGroup>>) {
        self.shared = SyncHandle(Some(group));
    }
}

impl Pair for SyncConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    fn describe(&self) -> String {
        format!(
            "sync(group={}, max_delay_ms={})",
            self.group, self.max_delay_ms
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        Ok(Box::new(PassHalf))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        self.validate()?;
        let group = self.shared.0.clone().unwrap_or_else(SyncGroup::new_shared);
        Ok(Box::new(SyncInverse::new(
            group,
            Duration::from_millis(self.max_delay_ms),
        )))
    }
}
