//! What a running endpoint resolves to: [`SourceReport`] / [`SinkReport`] (with the `check`
//! sink's [`CheckReport`]), and the task handles [`SourceTask`] / [`SinkTask`].

use super::error::EndpointError;
use std::fmt;
use tokio::task::JoinHandle;

/// What a source produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceReport {
    /// Frames handed to the channel.
    pub frames: u64,
    /// Payload bytes in those frames.
    pub bytes: u64,
}

/// A running source: resolves to its report, or the error that stopped it.
pub type SourceTask = JoinHandle<Result<SourceReport, EndpointError>>;

/// What a sink consumed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkReport {
    /// Frames received.
    pub frames: u64,
    /// Payload bytes received.
    pub bytes: u64,
    /// The checker's verdict (`check` sinks only).
    pub check: Option<CheckReport>,
}

/// A running sink: resolves to its report, or the error that stopped it.
pub type SinkTask = JoinHandle<Result<SinkReport, EndpointError>>;

/// Gap ranges listed in a [`CheckReport`]; all of them are counted.
pub const MAX_LISTED_GAPS: usize = 100;

/// Result of a check (the rules are in the `check` module's docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Frames received, duplicates included.
    pub received: u64,
    /// Lowest seq received.
    pub first_seq: Option<u64>,
    /// Highest seq received.
    pub last_seq: Option<u64>,
    /// Missing inclusive seq ranges between `first_seq` and `last_seq`, in order; at most
    /// [`MAX_LISTED_GAPS`] (see `gap_count`).
    pub gaps: Vec<(u64, u64)>,
    /// Number of missing ranges, all of them.
    pub gap_count: u64,
    /// Seqs never received between `first_seq` and `last_seq`.
    pub missing: u64,
    /// Frames whose seq was already received.
    pub duplicates: u64,
    /// Frames that arrived after a higher seq.
    pub reordered: u64,
    /// Frames whose content or length was wrong.
    pub corrupt: u64,
    /// Expected frame count, when configured.
    pub expect: Option<u64>,
}

impl CheckReport {
    /// No gaps, duplicates, reordered or corrupt frames, and `received == expect` when an
    /// expected count is set.
    pub fn is_ok(&self) -> bool {
        self.missing == 0
            && self.duplicates == 0
            && self.reordered == 0
            && self.corrupt == 0
            && match self.expect {
                Some(e) => e == self.received,
                None => true,
            }
    }
}

impl fmt::Display for CheckReport {
    /// `check: 1000 frames, seq 0..=999, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "check: {} frames, ", self.received)?;
        match (self.first_seq, self.last_seq) {
            (Some(a), Some(b)) => write!(f, "seq {a}..={b}, ")?,
            _ => write!(f, "no seq, ")?,
        }
        write!(
            f,
            "{} missing, {} duplicate, {} reordered, {} corrupt: ",
            self.missing, self.duplicates, self.reordered, self.corrupt
        )?;
        if self.is_ok() {
            return f.write_str("OK");
        }
        f.write_str("FAILED (")?;
        let mut sep = "";
        if !self.gaps.is_empty() {
            f.write_str("missing ")?;
            for (i, (a, b)) in self.gaps.iter().take(5).enumerate() {
                write!(f, "{}{a}..={b}", if i > 0 { ", " } else { "" })?;
            }
            if self.gap_count > 5 {
                write!(f, " and {} more ranges", self.gap_count - 5)?;
            }
            sep = "; ";
        }
        for (n, what) in [
            (self.duplicates, "duplicate"),
            (self.reordered, "reordered"),
            (self.corrupt, "corrupt"),
        ] {
            if n > 0 {
                write!(f, "{sep}{n} {what}")?;
                sep = "; ";
            }
        }
        if let Some(e) = self.expect {
            if e != self.received {
                write!(f, "{sep}expected {e} frames, got {}", self.received)?;
            }
        }
        f.write_str(")")
    }
}

/// One endpoint kind as a session's compositor offers it (`wayland_session`, for `ndd check --side`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    /// The endpoint (`wayland-screen`, `wayland-input (keys)`…).
    pub what: &'static str,
    /// The protocol it needs (said when missing: the globals the compositor lacks).
    pub needs: String,
    /// The compositor has it.
    pub ok: bool,
    /// Where it can speak either of two protocols: the one it takes here.
    pub via: Option<&'static str>,
}
