//! [`RateLimit`]: at most one report per interval, counting what it held back.
//!
//! A half that drops frames it cannot trust (a bad checksum, a failed authentication) must say
//! so, but a peer sending garbage at line rate must not turn that into a log flood. A half
//! keeps one `RateLimit` per kind of report and asks it, with the `now` it was given, whether
//! this occurrence may be logged; the answer carries how many were suppressed since the last
//! one, so the log still adds up. Sans-IO: time comes in as `now`.

use std::time::{Duration, Instant};

/// Default interval between two reports of the same kind.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Admits one occurrence per interval and counts the others.
#[derive(Debug, Clone)]
pub struct RateLimit {
    interval: Duration,
    /// Reports admitted per interval.
    burst: u32,
    /// Start of the current interval and reports admitted in it.
    window: Option<(Instant, u32)>,
    suppressed: u64,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit::new(DEFAULT_INTERVAL)
    }
}

impl RateLimit {
    /// At most one admitted occurrence per `interval`.
    pub fn new(interval: Duration) -> RateLimit {
        RateLimit::with_burst(interval, 1)
    }

    /// At most `burst` admitted occurrences per `interval` (a few distinct events in a row
    /// are each worth a line; a flood is not).
    pub fn with_burst(interval: Duration, burst: u32) -> RateLimit {
        RateLimit {
            interval,
            burst: burst.max(1),
            window: None,
            suppressed: 0,
        }
    }

    /// One occurrence at `now`: `Some(n)` when it may be reported, `n` being the occurrences
    /// suppressed since the previous report; `None` when it must stay quiet (it is counted).
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        let (start, admitted) = match self.window {
            Some((start, n)) if now.saturating_duration_since(start) < self.interval => (start, n),
            Some((start, _)) if now < start => (start, self.burst), // the clock went back
            _ => (now, 0),
        };
        if admitted < self.burst {
            self.window = Some((start, admitted + 1));
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }

    /// Occurrences suppressed since the last admitted one.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_one_per_interval_and_counts_the_rest() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = RateLimit::new(ms(1000));
        assert_eq!(r.admit(t0), Some(0));
        for i in 1..=5 {
            assert_eq!(r.admit(t0 + ms(i * 100)), None);
        }
        assert_eq!(r.suppressed(), 5);
        assert_eq!(r.admit(t0 + ms(999)), None);
        assert_eq!(r.admit(t0 + ms(1000)), Some(6));
        assert_eq!(r.suppressed(), 0);
        // A clock that goes backwards is not a reason to report.
        assert_eq!(r.admit(t0), None);
        assert_eq!(r.admit(t0 + ms(2500)), Some(1));
    }

    #[test]
    fn a_burst_is_admitted_whole_then_the_rest_is_counted() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = RateLimit::with_burst(ms(1000), 3);
        assert_eq!(r.admit(t0), Some(0));
        assert_eq!(r.admit(t0 + ms(10)), Some(0));
        assert_eq!(r.admit(t0 + ms(20)), Some(0));
        assert_eq!(r.admit(t0 + ms(30)), None);
        assert_eq!(r.admit(t0 + ms(40)), None);
        assert_eq!(r.admit(t0 + ms(1000)), Some(2));
    }
}
