//! [`Demand`]: the session's "send me one now" to a source that captures on demand (the
//! `x11-screen` source), so a capture is taken when the path can carry it, not before it has
//! to wait behind the frames in flight (VirtualGL's frame spoiling).
//!
//! The driver sets it on every turn of its loop: wanted when the session takes the stream's
//! next frame now and none is waiting in the channel; not wanted otherwise. The source takes
//! it (clearing it) when it captures, so one signal gives at most one capture.
//!
//! It also carries a keyframe request: when the peer restarted, its sink (and the stack's
//! pairs, rebuilt for it) know nothing of the screen, so the source sends the whole of it
//! next instead of only what changed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared "one frame wanted" flag, and a "whole keyframe wanted" flag. Clones share them.
#[derive(Debug, Clone, Default)]
pub struct Demand(Arc<Flags>);

#[derive(Debug, Default)]
struct Flags {
    frame: AtomicBool,
    keyframe: AtomicBool,
}

impl Demand {
    /// Not wanted yet.
    pub fn new() -> Demand {
        Demand::default()
    }

    /// Driver side: whether the session wants a frame now.
    pub fn set(&self, wanted: bool) {
        self.0.frame.store(wanted, Ordering::Release);
    }

    /// Source side: whether a frame is wanted; clears the flag when it was.
    pub fn take(&self) -> bool {
        self.0.frame.swap(false, Ordering::AcqRel)
    }

    /// Whether a frame is wanted (without clearing it).
    pub fn wanted(&self) -> bool {
        self.0.frame.load(Ordering::Acquire)
    }

    /// Driver side: the next frame should be a whole keyframe (the peer restarted).
    pub fn request_keyframe(&self) {
        self.0.keyframe.store(true, Ordering::Release);
    }

    /// Source side: whether a keyframe was requested; clears the request.
    pub fn take_keyframe(&self) -> bool {
        self.0.keyframe.swap(false, Ordering::AcqRel)
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
        assert!(!src.take_keyframe());
        d.request_keyframe();
        assert!(src.take_keyframe());
        assert!(!src.take_keyframe(), "one request, one keyframe");
    }
}
