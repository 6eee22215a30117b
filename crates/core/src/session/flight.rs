//! How many bytes a reliable source stream may have written and not yet acknowledged: twice
//! what the path delivers in a round trip (its bandwidth-delay product, measured from the
//! peer's ACKs and the PING/PONG round trip), at least `min`, at most the resume buffer.
//!
//! Why: a TCP-like link delivers in order, so whatever a bulk stream has in the pipe (socket
//! buffers, the peer's read queue) is ahead of the next small frame of any other stream. With
//! the resume buffer (16 MiB) as the only bound, an input event waited behind up to 16 MiB of
//! display frames; bounded at about two round trips' worth, it waits at most that long, while
//! the bulk stream still fills the path (the window doubles every sample while the ACKs keep
//! up, like slow start, and settles at twice the bandwidth-delay product). The peer ACKs every
//! `ack_bytes` it takes in, not only every `ack_every`, so a small window is not starved of
//! ACKs.

use std::time::{Duration, Instant};

/// Shortest interval a delivery-rate sample covers.
const SAMPLE: Duration = Duration::from_millis(10);
/// The floor of the window is at most what the path delivers in this time…
const FLOOR_TIME: Duration = Duration::from_millis(10);
/// …and at least this.
const FLOOR_BYTES: usize = 64 << 10;
/// While a more urgent stream is live (see `Session::window_for`), the floor is what the path
/// delivers in this time instead (at least [`FLOOR_BYTES`]): a small frame of that stream then
/// waits behind about this much of the bulk stream's bytes, not behind 2 MiB.
const BESIDE_URGENT_TIME: Duration = Duration::from_micros(200);

/// The delivery rate estimate behind the window.
#[derive(Debug, Clone)]
pub(crate) struct Flight {
    min: usize,
    max: usize,
    /// Bytes per second the peer acknowledged, smoothed.
    rate: f64,
    /// Start of the current sample: when, and the acknowledged total then.
    mark: Option<(Instant, u64)>,
    acked: u64,
    /// Some ACK of the current sample found the stream keeping its window full.
    busy: bool,
}

impl Flight {
    pub(crate) fn new(min: usize, max: usize) -> Flight {
        Flight {
            min: min.min(max),
            max,
            rate: 0.0,
            mark: None,
            acked: 0,
            busy: false,
        }
    }

    /// The peer acknowledged `bytes` more; `busy`: the stream had at least half its window
    /// written or waiting (it sends as fast as the path takes, so the ACKs measure the path).
    /// A sample without any busy ACK measures only what the source offered (a display at
    /// 30 fps, a paced stream): it may raise the rate, never lower it; before, every paced
    /// stream's rate sank to its own pace, and its frames were cut into chunks of 1 ms of that
    /// (a 1 MB frame every 20 ms into 20 chunks of 50 kB, on a path of GB/s).
    pub(crate) fn on_acked(&mut self, now: Instant, bytes: usize, busy: bool) {
        self.acked += bytes as u64;
        self.busy |= busy;
        let Some((t0, b0)) = self.mark else {
            // The bytes of this first ACK came before the sample starts.
            self.mark = Some((now, self.acked));
            return;
        };
        let dt = now.saturating_duration_since(t0);
        if dt >= SAMPLE {
            let sample = (self.acked - b0) as f64 / dt.as_secs_f64();
            // Up at once (a window that just grew shows it in the next sample), down slowly
            // (an idle moment is not a slow path).
            self.rate = if sample >= self.rate {
                sample
            } else if self.busy {
                0.75 * self.rate + 0.25 * sample
            } else {
                self.rate
            };
            self.mark = Some((now, self.acked));
            self.busy = false;
        }
    }

    /// A frame of `bytes` written while nothing else was in flight was acknowledged `took`
    /// after its first byte went: the path carries at least `bytes / took` (its round trip
    /// included). Raises the rate, never lowers it: how an app-limited stream (one frame at a
    /// time) learns what the path could carry.
    pub(crate) fn on_lone_frame(&mut self, bytes: usize, took: Duration) {
        if took.is_zero() {
            return;
        }
        self.rate = self.rate.max(bytes as f64 / took.as_secs_f64());
    }

    /// The window for a path with round trip `rtt`: twice the bandwidth-delay product, at
    /// least the floor, at most the resume buffer. The floor is `min`, or less on a slow path:
    /// what the path delivers in [`FLOOR_TIME`] (at least [`FLOOR_BYTES`]), so on a 20 Mbit/s
    /// link a small frame does not wait behind `min` bytes (0.8 s there) when the
    /// bandwidth-delay product is far smaller. Before any ACK the floor is [`FLOOR_BYTES`],
    /// and the window doubles with each sample while the ACKs keep up.
    /// The delivery rate the ACKs report, bytes per second (0 before any).
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    pub(crate) fn limit(&self, rtt: Option<Duration>) -> usize {
        self.limit_with(rtt, FLOOR_TIME)
    }

    /// The window of a stream that a more urgent live stream shares the path with: the same
    /// twice the bandwidth-delay product, with a floor of [`BESIDE_URGENT_TIME`] of the path
    /// (on loopback or a LAN, where the floor is the window, 2 MiB is 0.7–17 ms of queue).
    pub(crate) fn limit_beside_urgent(&self, rtt: Option<Duration>) -> usize {
        self.limit_with(rtt, BESIDE_URGENT_TIME)
    }

    fn limit_with(&self, rtt: Option<Duration>, floor_time: Duration) -> usize {
        let bdp = rtt.map_or(0.0, |r| self.rate * r.as_secs_f64());
        let floor = ((self.rate * floor_time.as_secs_f64()) as usize)
            .max(FLOOR_BYTES)
            .min(self.min);
        ((2.0 * bdp) as usize).clamp(floor, self.max.max(floor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path of `rate` bytes/s and round trip `rtt`, driven by a sender that keeps its
    /// window full: returns (the window at the end, the throughput over the last second).
    fn run(rate: f64, rtt: Duration, secs: u64) -> (usize, f64) {
        let mut f = Flight::new(2 << 20, 64 << 20);
        let t0 = Instant::now();
        let step = Duration::from_micros(500);
        // Bytes in flight, each with the time its ACK comes back.
        let mut flight: std::collections::VecDeque<(Instant, usize)> = Default::default();
        let (mut in_flight, mut link_free) = (0usize, t0);
        let mut delivered_last_second = 0usize;
        let end = t0 + Duration::from_secs(secs);
        let mut now = t0;
        while now < end {
            while flight.front().is_some_and(|(t, _)| *t <= now) {
                let (_, n) = flight.pop_front().unwrap_or((now, 0));
                in_flight -= n;
                f.on_acked(now, n, true);
                if now + Duration::from_secs(1) >= end {
                    delivered_last_second += n;
                }
            }
            // The sender writes 64 KiB chunks while the window allows; the link serialises
            // them at `rate`, the ACK comes back half a round trip after the far end got it.
            while in_flight < f.limit(Some(rtt)) {
                let n = 64 << 10;
                let start = link_free.max(now);
                let arrive = start + Duration::from_secs_f64(n as f64 / rate) + rtt / 2;
                link_free = start + Duration::from_secs_f64(n as f64 / rate);
                flight.push_back((arrive + rtt / 2, n));
                in_flight += n;
            }
            now += step;
        }
        (f.limit(Some(rtt)), delivered_last_second as f64)
    }

    #[test]
    fn the_window_fills_a_long_fat_path_and_stays_small_on_a_short_one() {
        // 100 MB/s at 50 ms: the BDP is 5 MB; the path is kept full.
        let (w, got) = run(100e6, Duration::from_millis(50), 4);
        assert!((5_000_000..=12_000_000).contains(&w), "window {w}");
        assert!(got >= 0.9 * 100e6, "throughput {got}");
        // 1 GB/s at 0.1 ms (loopback): the BDP is 100 kB, the window stays at its 2 MiB
        // minimum, and that still fills the path.
        let (w, got) = run(1e9, Duration::from_micros(100), 2);
        assert_eq!(w, 2 << 20);
        assert!(got >= 0.9 * 1e9, "throughput {got}");
    }

    #[test]
    fn a_slow_path_gets_a_window_of_its_own_size_not_the_minimum() {
        // 2.5 MB/s (20 Mbit/s) at 50 ms: the BDP is 125 kB; the window stays near twice
        // that, far below the 2 MiB minimum (0.8 s of this link), and fills the path.
        let (w, got) = run(2.5e6, Duration::from_millis(50), 6);
        assert!((125_000..=600_000).contains(&w), "window {w}");
        assert!(got >= 0.9 * 2.5e6, "throughput {got}");
    }

    #[test]
    fn a_paced_stream_learns_the_path_not_its_own_pace() {
        // 1 MB every 20 ms (50 MB/s) on a path of 1 GB/s with a 0.1 ms round trip: each frame
        // goes alone and is acknowledged 1.1 ms after its first byte.
        let t0 = Instant::now();
        let paced = |lone: bool| {
            let mut f = Flight::new(2 << 20, 64 << 20);
            for k in 0..50u32 {
                let sent = t0 + Duration::from_millis(20) * k;
                let acked = sent + Duration::from_micros(1100);
                if lone {
                    f.on_lone_frame(1_000_000, acked - sent);
                }
                f.on_acked(acked, 1_000_000, false);
            }
            f
        };
        let mut f = paced(true);
        assert!((0.85e9..=0.95e9).contains(&f.rate()), "{}", f.rate());
        // Without the lone frames' samples, the ACKs alone give the stream's own pace.
        let g = paced(false);
        assert!((45e6..=55e6).contains(&g.rate()), "{}", g.rate());
        // A stream that keeps its window full measures the path: when that slows to 100 MB/s,
        // the rate follows.
        let t1 = t0 + Duration::from_secs(2);
        for k in 0..60u32 {
            f.on_acked(t1 + Duration::from_millis(10) * k, 1_000_000, true);
        }
        assert!((95e6..=110e6).contains(&f.rate()), "{}", f.rate());
    }

    #[test]
    fn without_acks_it_starts_small_and_never_exceeds_the_resume_buffer() {
        let f = Flight::new(2 << 20, 16 << 20);
        assert_eq!(f.limit(None), FLOOR_BYTES);
        assert_eq!(f.limit(Some(Duration::from_millis(100))), FLOOR_BYTES);
        // Never above the resume buffer.
        let mut f = Flight::new(2 << 20, 4 << 20);
        let t = Instant::now();
        f.on_acked(t, 0, true);
        f.on_acked(t + Duration::from_millis(20), 100 << 20, true);
        assert_eq!(f.limit(Some(Duration::from_secs(1))), 4 << 20);
    }
}
