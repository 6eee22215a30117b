//! Delivery progress: which frames a sink has *completed*.
//!
//! A sink marks a frame's sequence number once the frame's effect is complete as far as this
//! process can tell (written and flushed, injected, drawn, checked, counted — or dropped as an
//! invalid record). The session acknowledges to the remote source only frames up to
//! [`Delivered::get`], so a crash of this process loses nothing that was acknowledged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The sequence number of records the session injects itself (release-all on a link drop):
/// not frames of the peer's, so sinks never count them as completed.
pub const INJECTED_SEQ: u64 = u64::MAX;

/// What a sink has completed, shared between the sink task and whoever acknowledges (clones
/// share the same counters): the highest sequence number, and how many frames.
///
/// Sinks complete frames in the order they receive them, so the count tells the session
/// exactly which of the frames it handed over are done, whatever their numbering.
#[derive(Clone, Debug, Default)]
pub struct Delivered(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    /// `seq + 1` of the highest completed frame, 0 meaning none yet; it only grows.
    highest: AtomicU64,
    /// Frames completed.
    count: AtomicU64,
}

impl Delivered {
    /// Records that frame `seq` is complete (and that the sink is done with every frame it
    /// received before it). [`INJECTED_SEQ`] — records the session injects itself, such as
    /// release-all — is ignored.
    pub fn mark(&self, seq: u64) {
        self.mark_batch(seq, 1);
    }

    /// Records that `frames` frames, the highest numbered `seq`, are complete (a batch
    /// written with one flush).
    pub fn mark_batch(&self, seq: u64, frames: u64) {
        if seq == INJECTED_SEQ {
            return;
        }
        self.0.highest.fetch_max(seq + 1, Ordering::Release);
        self.0.count.fetch_add(frames, Ordering::Release);
    }

    /// The highest completed sequence number, `None` before the first.
    pub fn get(&self) -> Option<u64> {
        self.0.highest.load(Ordering::Acquire).checked_sub(1)
    }

    /// How many frames were completed ([`INJECTED_SEQ`] records not counted).
    pub fn count(&self) -> u64 {
        self.0.count.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_empty_and_keeps_the_maximum() {
        let d = Delivered::default();
        assert_eq!(d.get(), None);
        d.mark(0);
        assert_eq!(d.get(), Some(0));
        d.mark(5);
        assert_eq!(d.get(), Some(5));
        d.mark(3);
        assert_eq!(d.get(), Some(5));
        assert_eq!(d.count(), 3);
        d.mark_batch(9, 4);
        assert_eq!((d.get(), d.count()), (Some(9), 7));
    }

    #[test]
    fn clones_share_and_max_seq_is_ignored() {
        let d = Delivered::default();
        let other = d.clone();
        d.mark(u64::MAX);
        assert_eq!(other.get(), None);
        other.mark(u64::MAX - 1);
        assert_eq!(d.get(), Some(u64::MAX - 1));
        d.mark(u64::MAX);
        assert_eq!(d.get(), Some(u64::MAX - 1));
        assert_eq!(d.count(), 1);
    }
}
