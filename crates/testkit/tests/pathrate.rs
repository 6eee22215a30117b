//! `ndd_core::PathRate` over a path model, in simulated time, over 1000 random schedules
//! (issue 31, item 1): a bottleneck of 1–1000 Mbit/s (log-uniform) that changes once mid-run
//! (to between a quarter and four times), 0–300 ms each way, a shaper queue in front of it,
//! a sender whose first message is far larger than the rest, and a bulk or an app-limited
//! source. Properties:
//!
//! - from the start and from the change, the estimate reaches 70 % of the path within 2 s or
//!   10 round trips, whichever is longer, while the sender has data to send;
//! - once reached, it never stays under 50 % of the path for more than 1 s while the sender
//!   has data to send (it probes upward);
//! - an app-limited source's estimate never falls below 70 % of what it sends, and its window
//!   never holds it back (it sends 95 % of what it offers or more).
//!
//! A failure prints its seed; `SEED=n cargo test -p ndd-testkit --test pathrate` replays it
//! (with `TRACE=1`, each phase change of the estimator is printed).

use ndd_core::pathrate::{PathRate, SendState};
use ndd_testkit::SimRng;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

struct Schedule {
    mbit: f64,
    mbit_after: f64,
    change_at: Duration,
    one_way: Duration,
    /// None: bulk; Some(fraction): the source offers this fraction of the first path's rate.
    app_limited: Option<f64>,
}

impl Schedule {
    fn random(rng: &mut SimRng) -> Schedule {
        let log_uniform = |rng: &mut SimRng, lo: f64, hi: f64| lo * (hi / lo).powf(rng.unit());
        let mbit = log_uniform(rng, 1.0, 1000.0);
        let one_way = Duration::from_millis(rng.range(0, 301));
        let settle = (2 * one_way * 10).max(Duration::from_secs(2));
        Schedule {
            mbit,
            mbit_after: mbit * log_uniform(rng, 0.25, 4.0),
            change_at: settle + Duration::from_millis(500 + rng.range(0, 1000)),
            one_way,
            app_limited: (rng.chance(0.25)).then(|| 0.1 + 0.6 * rng.unit()),
        }
    }

    fn bps_at(&self, t: Duration) -> f64 {
        (if t < self.change_at {
            self.mbit
        } else {
            self.mbit_after
        }) * 1e6
            / 8.0
    }
}

/// What went wrong in one schedule, if anything.
fn run(s: &Schedule) -> Result<(), String> {
    let t0 = Instant::now();
    let rtt = 2 * s.one_way;
    let settle = (rtt * 10).max(Duration::from_secs(2));
    let end = s.change_at + settle + Duration::from_secs(2);
    // Messages of about 2 ms of the first path (so a run is a few thousand events), the first
    // 50 times that.
    let size = ((s.mbit * 1e6 / 8.0) * 0.002).max(1500.0) as u64;
    let mut p = PathRate::new();
    let mut flight: VecDeque<(Duration, u64, SendState)> = VecDeque::new();
    let (mut in_flight, mut link_free, mut next_offer) = (0u64, Duration::ZERO, Duration::ZERO);
    let offer_every = s
        .app_limited
        .map(|f| Duration::from_secs_f64(size as f64 / (f * s.mbit * 1e6 / 8.0)));
    let mut first = true;
    let mut now = Duration::ZERO;
    // When the estimate was last at or above half the path (for the "never stays under").
    let mut last_above_half = Duration::ZERO;
    let mut reached = [false, false];
    // What an app-limited source sent between settling and the change.
    let mut sent_settled = 0u64;
    while now < end {
        // Acknowledgements due.
        while flight.front().is_some_and(|f| f.0 <= now) {
            let Some((_, n, st)) = flight.pop_front() else {
                break;
            };
            in_flight -= n;
            let before = p.phase();
            p.on_ack(t0 + now, n, &st);
            if std::env::var("TRACE").is_ok() && p.phase() != before {
                eprintln!(
                    "{now:?}: {before:?} -> {:?}, rate {:.1} Mbit/s, min rtt {:?}, this rtt {:?}, in flight {in_flight}",
                    p.phase(),
                    p.rate().unwrap_or(0.0) * 8e-6,
                    p.min_rtt(),
                    (t0 + now).saturating_duration_since(st.sent_at)
                );
            }
        }
        // Sends: bulk whenever the window allows; app-limited at its offers.
        loop {
            let window = p.window(size).unwrap_or(4 * size);
            let offered = offer_every.is_none_or(|_| now >= next_offer);
            if !offered {
                break;
            }
            if in_flight >= window {
                break;
            }
            let n = if first { 50 * size } else { size };
            first = false;
            let st = p.on_send(t0 + now, in_flight, n);
            let start = link_free.max(now);
            link_free = start + Duration::from_secs_f64(n as f64 / s.bps_at(start));
            flight.push_back((link_free + rtt, n, st));
            in_flight += n;
            if now >= settle && now < s.change_at {
                sent_settled += n;
            }
            if let Some(every) = offer_every {
                next_offer = now + every;
                break;
            }
        }
        // The properties, for a bulk sender.
        if s.app_limited.is_none() {
            let path = s.bps_at(now);
            let rate = p.rate().unwrap_or(0.0);
            let phase = usize::from(now >= s.change_at);
            let since = if phase == 0 { now } else { now - s.change_at };
            if rate >= 0.7 * path {
                reached[phase] = true;
            }
            if since >= settle && !reached[phase] {
                return Err(format!(
                    "the estimate did not reach 70 % of the path within {settle:?} (phase {phase}): {:.1} of {:.1} Mbit/s",
                    rate * 8e-6,
                    path * 8e-6
                ));
            }
            if rate >= 0.5 * path || !reached[phase] {
                last_above_half = now;
            } else if now - last_above_half > Duration::from_secs(1) {
                return Err(format!(
                    "the estimate stayed under half the path for over 1 s at {now:?}: {:.1} of {:.1} Mbit/s",
                    rate * 8e-6,
                    path * 8e-6
                ));
            }
        } else if let Some(f) = s.app_limited {
            // What the source sends is a lower bound of the path: the estimate keeps it.
            let sends = f * s.mbit * 1e6 / 8.0;
            if now > settle && p.rate().unwrap_or(0.0) < 0.7 * sends.min(s.bps_at(now)) {
                return Err(format!(
                    "an app-limited source's estimate fell to {:.2} Mbit/s; it sends {:.2}",
                    p.rate().unwrap_or(0.0) * 8e-6,
                    sends * 8e-6
                ));
            }
        }
        // Next event: an ACK, an offer, or a 1 ms tick for the checks.
        let mut next = now + Duration::from_millis(1);
        if let Some(f) = flight.front() {
            next = next.min(f.0.max(now));
        }
        if offer_every.is_some() {
            next = next.min(next_offer.max(now));
        }
        now = if next > now {
            next
        } else {
            now + Duration::from_micros(10)
        };
    }
    if let Some(f) = s.app_limited {
        // Its window never held the source back: it sent what it offered (the path carries
        // more), within one message.
        let offered = f * s.mbit * 1e6 / 8.0 * (s.change_at - settle).as_secs_f64();
        if ((sent_settled + size) as f64) < 0.95 * offered {
            return Err(format!(
                "the app-limited source sent {sent_settled} of the {offered:.0} bytes it offered"
            ));
        }
    }
    Ok(())
}

#[test]
fn the_path_estimate_finds_the_path_and_never_stays_locked_under_it() {
    let seeds: Vec<u64> = match std::env::var("SEED") {
        Ok(s) => vec![s.parse().expect("SEED is a number")],
        Err(_) => (0..1000).collect(),
    };
    let mut failures = Vec::new();
    for seed in seeds {
        let mut rng = SimRng::new(seed);
        let s = Schedule::random(&mut rng);
        if let Err(e) = run(&s) {
            failures.push(format!(
                "seed {seed}: {:.1} -> {:.1} Mbit/s at {:?}, {} ms each way, {}: {e}",
                s.mbit,
                s.mbit_after,
                s.change_at,
                s.one_way.as_millis(),
                s.app_limited.map_or("bulk".to_string(), |f| format!(
                    "app-limited at {:.0} %",
                    f * 100.0
                ))
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of the schedules failed:\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
