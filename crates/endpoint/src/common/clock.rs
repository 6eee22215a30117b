//! The source clock and pacing: the timestamp every source stamps on its frames
//! ([`now_ns`], through `meta`), and the delay between frames of a timer-driven source
//! (`pacing`, at most [`MAX_PERIOD`]).

use ndd_core::Meta;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

pub(crate) fn meta(stream: u16, seq: u64) -> Meta {
    Meta {
        stream,
        seq,
        timestamp_ns: now_ns(),
        flags: 0,
    }
}

/// Longest delay between frames: longer periods are clamped to it (a timer deadline must stay
/// representable).
pub const MAX_PERIOD: Duration = Duration::from_secs(365 * 24 * 3600);

/// The delay between frames for a period in seconds; `None` when unpaced (zero, or too small
/// for the timer).
pub(crate) fn pacing(seconds: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(seconds.min(MAX_PERIOD.as_secs_f64()))
        .ok()
        .filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_handles_zero_tiny_and_huge_periods() {
        assert_eq!(pacing(0.0), None);
        assert_eq!(pacing(1e-12), None);
        assert_eq!(pacing(-1.0), None);
        assert_eq!(pacing(f64::INFINITY), Some(MAX_PERIOD));
        assert_eq!(pacing(1e300), Some(MAX_PERIOD));
        assert_eq!(pacing(0.016), Some(Duration::from_millis(16)));
    }
}
