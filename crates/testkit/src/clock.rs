//! Virtual time.

use std::time::{Duration, Instant};

/// Source timestamps of a simulation start here (2026-01-01T00:00:00Z, in ns).
pub const EPOCH_NS: u64 = 1_767_225_600_000_000_000;

/// A virtual clock. Time only moves when the simulation moves it.
#[derive(Debug, Clone)]
pub struct SimClock {
    base: Instant,
    elapsed: Duration,
}

impl Default for SimClock {
    fn default() -> Self {
        SimClock::new()
    }
}

impl SimClock {
    /// A clock at virtual time zero.
    pub fn new() -> SimClock {
        SimClock {
            base: Instant::now(),
            elapsed: Duration::ZERO,
        }
    }

    /// The current virtual instant.
    pub fn now(&self) -> Instant {
        self.base + self.elapsed
    }

    /// Virtual time since the start.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// The instant `d` after the start.
    pub fn at(&self, d: Duration) -> Instant {
        self.base + d
    }

    /// Time of `t` since the start (zero for instants before it).
    pub fn since_start(&self, t: Instant) -> Duration {
        t.saturating_duration_since(self.base)
    }

    /// Moves the clock forward to `t` (never backward).
    pub fn advance_to(&mut self, t: Instant) {
        let d = t.saturating_duration_since(self.base);
        if d > self.elapsed {
            self.elapsed = d;
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&mut self, d: Duration) {
        self.elapsed += d;
    }

    /// The source timestamp (ns since the Unix epoch) of virtual instant `t`.
    pub fn timestamp_ns(&self, t: Instant) -> u64 {
        EPOCH_NS + self.since_start(t).as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advances_only_forward_and_maps_timestamps() {
        let mut c = SimClock::new();
        let t = c.at(Duration::from_millis(5));
        c.advance_to(t);
        assert_eq!(c.elapsed(), Duration::from_millis(5));
        c.advance_to(c.at(Duration::from_millis(1)));
        assert_eq!(c.now(), t);
        assert_eq!(c.timestamp_ns(t), EPOCH_NS + 5_000_000);
    }
}
