//! A source stack and a sink stack joined by simulated links, driven in virtual time.

use crate::clock::SimClock;
use crate::link::{LinkConfig, SimLink};
use bytes::Bytes;
use ndd_core::{Frame, LayerStats, Meta, Pair, Role, Stack, StackError};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// A frame as the sink endpoint received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Meta as delivered (must equal the meta the source created).
    pub meta: Meta,
    /// Payload as delivered.
    pub payload: Bytes,
    /// Virtual time the source created it.
    pub created: Duration,
    /// Virtual time the sink endpoint got it.
    pub released: Duration,
}

/// Runs frames from a source stack over a simulated link into a sink stack.
///
/// Data frames cross `data`; control messages cross their own links (same delay and jitter,
/// in order, never queued behind data), as the real link sends them ahead of queued frames.
#[derive(Debug)]
pub struct Pipeline {
    /// The virtual clock.
    pub clock: SimClock,
    src: Stack,
    sink: Stack,
    data: SimLink<(Meta, Bytes)>,
    ctl_fwd: SimLink<(usize, Bytes)>,
    ctl_back: SimLink<(usize, Bytes)>,
    pending: VecDeque<(Instant, Bytes)>,
    stream: u16,
    next_seq: u64,
    created: Vec<(u64, Duration)>,
    deliveries: Vec<Delivery>,
    /// Safety net against a half that never stops asking for timeouts.
    pub max_events: u64,
}

impl Pipeline {
    /// Builds both stacks of `pairs` (the user's list order) around a link.
    pub fn new(pairs: &[&dyn Pair], link: LinkConfig, seed: u64) -> Result<Pipeline, StackError> {
        let src = Stack::build(Role::Source, "sim", pairs)?;
        let sink = Stack::build(Role::Sink, "sim", pairs)?;
        Ok(Pipeline::with_stacks(src, sink, link, seed))
    }

    /// Joins two stacks already built.
    pub fn with_stacks(src: Stack, sink: Stack, link: LinkConfig, seed: u64) -> Pipeline {
        let ctl = LinkConfig {
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            in_order: true,
            bandwidth_bps: None,
            ..link.clone()
        };
        Pipeline {
            clock: SimClock::new(),
            src,
            sink,
            data: SimLink::new(link, seed),
            ctl_fwd: SimLink::new(ctl.clone(), seed ^ 0x5555),
            ctl_back: SimLink::new(ctl, seed ^ 0xaaaa),
            pending: VecDeque::new(),
            stream: 1,
            next_seq: 0,
            created: Vec::new(),
            deliveries: Vec::new(),
            max_events: 10_000_000,
        }
    }

    /// Schedules the source endpoint to produce `payload` at virtual time `at` (calls must
    /// come in time order).
    pub fn send_at(&mut self, at: Duration, payload: impl Into<Bytes>) {
        let t = self.clock.at(at);
        debug_assert!(
            self.pending.back().is_none_or(|(b, _)| *b <= t),
            "send_at out of order"
        );
        self.pending.push_back((t, payload.into()));
    }

    /// Whether the source stack takes another frame now (a pair with a window, as `image`,
    /// says no while the path holds what it can carry): a source that captures on demand
    /// (frame spoiling) produces only then.
    pub fn source_ready(&self) -> bool {
        self.src.ready()
    }

    /// What the sink endpoint received, in order.
    pub fn deliveries(&self) -> &[Delivery] {
        &self.deliveries
    }

    /// Creation times of every frame produced so far, by sequence number.
    pub fn created(&self) -> &[(u64, Duration)] {
        &self.created
    }

    /// Source stack statistics.
    pub fn source_stats(&self) -> Vec<LayerStats> {
        self.src.stats()
    }

    /// Sink stack statistics.
    pub fn sink_stats(&self) -> Vec<LayerStats> {
        self.sink.stats()
    }

    /// The data link (for its counters).
    pub fn data_link(&self) -> &SimLink<(Meta, Bytes)> {
        &self.data
    }

    fn next_event(&self) -> Option<Instant> {
        [
            self.pending.front().map(|(t, _)| *t),
            self.src.poll_timeout(),
            self.sink.poll_timeout(),
            self.data.next_arrival(),
            self.ctl_fwd.next_arrival(),
            self.ctl_back.next_arrival(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs until nothing is scheduled, in flight or held with a deadline.
    pub fn run(&mut self) -> Result<(), StackError> {
        self.run_until(Duration::MAX)
    }

    /// Runs every event up to virtual time `until`.
    pub fn run_until(&mut self, until: Duration) -> Result<(), StackError> {
        let mut events = 0u64;
        while let Some(t) = self.next_event() {
            if self.clock.since_start(t) > until {
                break;
            }
            events += 1;
            assert!(
                events <= self.max_events,
                "simulation did not settle after {events} events"
            );
            self.clock.advance_to(t);
            self.step()?;
        }
        Ok(())
    }

    /// Flushes both stacks (end of stream) and delivers what they held.
    pub fn finish(&mut self) -> Result<(), StackError> {
        self.run()?;
        let now = self.clock.now();
        self.src.flush(now)?;
        self.pump_source(now);
        self.run()?;
        self.sink.flush(self.clock.now())?;
        self.pump_sink(self.clock.now());
        Ok(())
    }

    fn step(&mut self) -> Result<(), StackError> {
        let now = self.clock.now();
        while self.pending.front().is_some_and(|(t, _)| *t <= now) {
            let Some((_, payload)) = self.pending.pop_front() else {
                break;
            };
            let meta = Meta {
                stream: self.stream,
                seq: self.next_seq,
                timestamp_ns: self.clock.timestamp_ns(now),
                flags: 0,
            };
            self.created.push((self.next_seq, self.clock.elapsed()));
            self.next_seq += 1;
            self.src.handle_frame(now, Frame::new(meta, &payload))?;
        }
        while let Some((layer, msg)) = self.ctl_back.recv(now) {
            self.src.handle_control(now, layer, msg)?;
        }
        self.src.handle_timeout(now)?;
        self.pump_source(now);
        while let Some((meta, bytes)) = self.data.recv(now) {
            self.sink
                .handle_frame(now, Frame::from_bytes(meta, bytes))?;
        }
        while let Some((layer, msg)) = self.ctl_fwd.recv(now) {
            self.sink.handle_control(now, layer, msg)?;
        }
        self.sink.handle_timeout(now)?;
        self.pump_sink(now);
        Ok(())
    }

    fn pump_source(&mut self, now: Instant) {
        while let Some((layer, msg)) = self.src.poll_control() {
            let n = msg.len();
            self.ctl_fwd.send(now, (layer, msg), n);
        }
        while let Some(f) = self.src.poll_frame() {
            let meta = f.meta;
            let bytes = f.into_bytes();
            let n = bytes.len() + 26;
            self.data.send_with(now, (meta, bytes), n, |(_, b), r| {
                if !b.is_empty() {
                    let mut v = b.to_vec();
                    let bit = (r % (v.len() as u64 * 8)) as usize;
                    v[bit / 8] ^= 1 << (bit % 8);
                    *b = Bytes::from(v);
                }
            });
        }
    }

    fn pump_sink(&mut self, now: Instant) {
        while let Some((layer, msg)) = self.sink.poll_control() {
            let n = msg.len();
            self.ctl_back.send(now, (layer, msg), n);
        }
        let released = self.clock.since_start(now);
        while let Some(f) = self.sink.poll_frame() {
            let created = self
                .created
                .get(f.meta.seq as usize)
                .map_or(Duration::ZERO, |c| c.1);
            self.deliveries.push(Delivery {
                meta: f.meta,
                payload: f.into_bytes(),
                created,
                released,
            });
        }
    }
}

/// The dissertation's jitter metric (§6.7): for consecutive deliveries, the absolute
/// difference between their spacing at creation and their spacing at release.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpacingError {
    /// Mean, in ms.
    pub mean_ms: f64,
    /// Standard deviation, in ms.
    pub sd_ms: f64,
    /// Largest, in ms.
    pub max_ms: f64,
    /// Pairs measured.
    pub n: usize,
}

/// Computes [`SpacingError`] over `deliveries`.
pub fn spacing_error(deliveries: &[Delivery]) -> SpacingError {
    let errs: Vec<f64> = deliveries
        .windows(2)
        .map(|w| {
            let gen = w[1].created.as_secs_f64() - w[0].created.as_secs_f64();
            let rel = w[1].released.as_secs_f64() - w[0].released.as_secs_f64();
            (rel - gen).abs() * 1e3
        })
        .collect();
    let n = errs.len();
    if n == 0 {
        return SpacingError {
            mean_ms: 0.0,
            sd_ms: 0.0,
            max_ms: 0.0,
            n,
        };
    }
    let mean = errs.iter().sum::<f64>() / n as f64;
    let var = errs.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / n as f64;
    SpacingError {
        mean_ms: mean,
        sd_ms: var.sqrt(),
        max_ms: errs.iter().cloned().fold(0.0, f64::max),
        n,
    }
}
