//! [`Demand`]: the session's "send me one now" to a source that captures on demand (the
//! `x11-screen` source), so a capture is taken when the path can carry it, not before it has
//! to wait behind the frames in flight (VirtualGL's frame spoiling).
//!
//! The driver sets it on every turn of its loop: wanted when the session takes the stream's
//! next frame now and none is waiting in the channel; not wanted otherwise. The source takes
//! it (clearing it) when it captures, so one signal gives at most one capture.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared "one frame wanted" flag. Clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct Demand(Arc<AtomicBool>);

impl Demand {
    /// Not wanted yet.
    pub fn new() -> Demand {
        Demand::default()
    }

    /// Driver side: whether the session wants a frame now.
    pub fn set(&self, wanted: bool) {
        self.0.store(wanted, Ordering::Release);
    }

    /// Source side: whether a frame is wanted; clears the flag when it was.
    pub fn take(&self) -> bool {
        self.0.swap(false, Ordering::AcqRel)
    }

    /// Whether a frame is wanted (without clearing it).
    pub fn wanted(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_signal_gives_one_capture() {
        let d = Demand::new();
        let src = d.clone();
        assert!(!src.take());
        d.set(true);
        assert!(src.wanted());
        assert!(src.take());
        assert!(!src.take(), "taken once");
        d.set(true);
        d.set(false);
        assert!(!src.take(), "withdrawn before the source looked");
    }
}
