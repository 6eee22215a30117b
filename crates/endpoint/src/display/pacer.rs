//! When a screen source that captures whole pictures (`wayland-screen`, `gnome-screen`) takes
//! the next one: sans-IO, its clock and the session's wishes passed in.
//!
//! A capture goes when the path takes an update now (frame spoiling: the driver's
//! [`Demand`](crate::common::demand::Demand), or an empty channel without one) and no sooner
//! than 0.8 of `1 / max_fps` after the last (content changing `max_fps` times a second is still
//! caught every time); it is a keyframe (the whole screen) first, when the peer asks, and every
//! `refresh` when set. (`x11-screen` paces by DAMAGE on a grid of slots: `source.rs`.)

use std::time::{Duration, Instant};

/// The least spacing of two captures, as a fraction of `1 / max_fps`.
const MIN_SPACING: f64 = 0.8;
/// How soon to look again while the path holds the source back.
pub(super) const SPOIL_POLL: Duration = Duration::from_millis(2);

/// What the source does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pace {
    /// Capture now; `whole`: a keyframe of the whole screen.
    Capture { whole: bool },
    /// Nothing before this long (serve the connection meanwhile).
    Wait(Duration),
}

/// A capturing source's pacing.
#[derive(Debug)]
pub(super) struct CapturePacer {
    min_gap: Duration,
    refresh: Option<Duration>,
    keyframe_due: bool,
    next_capture: Instant,
    last_keyframe: Instant,
}

impl CapturePacer {
    /// At most `max_fps` captures a second (the gap of `1 / max_fps` given as `min_gap`), a
    /// keyframe every `refresh` when set; the first capture a keyframe.
    pub(super) fn new(min_gap: Duration, refresh: Option<Duration>, now: Instant) -> Self {
        CapturePacer {
            min_gap,
            refresh,
            keyframe_due: true,
            next_capture: now,
            last_keyframe: now,
        }
    }

    /// The next capture is the whole screen (the peer restarted, the screen changed size, a
    /// capture failed).
    pub(super) fn keyframe(&mut self) {
        self.keyframe_due = true;
    }

    /// Whether the next capture is the whole screen, as things stand at `now`.
    pub(super) fn keyframe_due(&self, now: Instant) -> bool {
        self.keyframe_due || self.refresh.is_some_and(|r| now >= self.last_keyframe + r)
    }

    /// What to do at `now`; `path_free`: the path takes an update now.
    pub(super) fn poll(&mut self, now: Instant, path_free: bool) -> Pace {
        self.keyframe_due = self.keyframe_due(now);
        if !path_free {
            Pace::Wait(SPOIL_POLL)
        } else if now < self.next_capture {
            Pace::Wait(self.next_capture - now)
        } else {
            Pace::Capture {
                whole: self.keyframe_due,
            }
        }
    }

    /// A capture was sent at `now` (`whole`: all of the screen).
    pub(super) fn captured(&mut self, now: Instant, whole: bool) {
        if whole {
            self.keyframe_due = false;
            self.last_keyframe = now;
        }
        self.next_capture = now + self.min_gap.mul_f64(MIN_SPACING);
    }

    /// Nothing was captured (a failure): try again no sooner than `after`.
    pub(super) fn retry_after(&mut self, now: Instant, after: Duration) {
        self.next_capture = now + after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn captures_keep_the_spacing_and_wait_for_the_path() {
        let t0 = Instant::now();
        let gap = Duration::from_secs_f64(1.0 / 30.0);
        let mut p = CapturePacer::new(gap, None, t0);
        assert_eq!(
            p.poll(t0, false),
            Pace::Wait(SPOIL_POLL),
            "the path holds it back"
        );
        assert_eq!(
            p.poll(t0, true),
            Pace::Capture { whole: true },
            "a keyframe first"
        );
        p.captured(t0, true);
        // 0.8 of a frame interval: 26.7 ms.
        let next = t0 + gap.mul_f64(MIN_SPACING);
        assert_eq!(
            p.poll(t0 + 10 * MS, true),
            Pace::Wait(next - (t0 + 10 * MS))
        );
        assert_eq!(p.poll(next, true), Pace::Capture { whole: false });
        p.captured(next, false);
        // A keyframe asked for: the next capture is whole, once, and keeps the spacing.
        p.keyframe();
        assert!(p.keyframe_due(next));
        let later = next + gap;
        assert_eq!(p.poll(later, true), Pace::Capture { whole: true });
        p.captured(later, true);
        assert!(!p.keyframe_due(later));
        // A failure: nothing for the time asked.
        p.retry_after(later, 100 * MS);
        assert_eq!(p.poll(later + gap, true), Pace::Wait(100 * MS - gap));
    }

    #[test]
    fn a_refresh_makes_a_keyframe_every_so_often() {
        let t0 = Instant::now();
        let mut p = CapturePacer::new(10 * MS, Some(Duration::from_secs(2)), t0);
        p.captured(t0, true);
        let t = t0 + Duration::from_millis(1500);
        assert_eq!(p.poll(t, true), Pace::Capture { whole: false });
        p.captured(t, false);
        let t = t0 + Duration::from_secs(2);
        assert!(p.keyframe_due(t));
        // Due while the path is busy: still due when it frees.
        assert_eq!(p.poll(t, false), Pace::Wait(SPOIL_POLL));
        assert_eq!(p.poll(t + MS, true), Pace::Capture { whole: true });
        p.captured(t + MS, true);
        assert_eq!(p.poll(t + 20 * MS, true), Pace::Capture { whole: false });
    }
}
