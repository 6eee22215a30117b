use super::*;
use crate::pass::PassHalf;
use ndd_core::{Frame, Meta, Output, Role, Stack};
use ndd_testkit::{LinkConfig, Pipeline, EPOCH_NS};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

/// Frame `seq` created at `ts_ms`; its payload names it.
fn frame(seq: u64, ts_ms: u64) -> Frame {
    let meta = Meta {
        stream: 4,
        seq,
        timestamp_ns: ts_ms * MS,
        flags: 0,
    };
    Frame::new(meta, &seq.to_be_bytes())
}

/// Drives a forward half as the runtime does: at each instant, frames first, then the timer.
struct Driver {
    half: Box<dyn ndd_core::Half>,
    t0: Instant,
    /// (time ms, seq, timestamp ms, payload seq)
    out: Vec<(u64, u64, u64, u64)>,
}

impl Driver {
    fn new(interval_ms: u64, repeat: bool) -> Driver {
        let c = PeriodicConfig {
            interval_ms,
            repeat,
        };
        Driver {
            half: c.forward().unwrap(),
            t0: Instant::now(),
            out: Vec::new(),
        }
    }

    fn collect(&mut self, at: u64, out: &mut Output) {
        for f in out.take_frames() {
            let p = f.payload();
            let mut b = [0u8; 8];
            b.copy_from_slice(p);
            self.out.push((
                at,
                f.meta.seq,
                f.meta.timestamp_ns / MS,
                u64::from_be_bytes(b),
            ));
        }
    }

    /// Runs timers up to `until` ms (inclusive), exactly when they are due.
    fn run_until(&mut self, until: u64) {
        let end = self.t0 + ms(until);
        while let Some(t) = self.half.poll_timeout().filter(|t| *t <= end) {
            let mut out = Output::new();
            self.half.handle_timeout(t, &mut out);
            self.collect((t - self.t0).as_millis() as u64, &mut out);
        }
    }

    fn send(&mut self, at: u64, f: Frame) {
        // Timers strictly before `at` first, then the frame, then a timer at `at`.
        self.run_until(at.saturating_sub(1));
        let mut out = Output::new();
        self.half
            .handle_frame(self.t0 + ms(at), f, &mut out)
            .unwrap();
        self.collect(at, &mut out);
        self.run_until(at);
    }
}

#[test]
fn a_1ms_source_through_periodic_16_gives_the_newest_frame_every_16ms() {
    let mut d = Driver::new(16, false);
    for t in 0..=200 {
        d.send(t, frame(t, t));
    }
    let want: Vec<(u64, u64, u64, u64)> =
        (1..=12).map(|k| (16 * k, 16 * k, 16 * k, 16 * k)).collect();
    assert_eq!(d.out, want, "(time, seq, timestamp, payload)");
    let st = d.half.stats();
    // 201 frames: 12 emitted, 1 held (200), the rest replaced before a tick.
    assert_eq!(st.drops, 188);
    assert_eq!(st.queue_depth, 1);
    assert_eq!(
        st.counters,
        vec![("superseded", 188), ("emitted", 12), ("repeats", 0)]
    );
}

#[test]
fn over_a_link_the_sink_gets_one_frame_per_interval_on_a_fixed_grid() {
    let c = PeriodicConfig {
        interval_ms: 16,
        repeat: false,
    };
    let mut p = Pipeline::new(&[&c], LinkConfig::tcp(ms(2), Duration::ZERO), 3).unwrap();
    for t in 0..1000u64 {
        p.send_at(ms(t), t.to_be_bytes().to_vec());
    }
    p.finish().unwrap();
    let got: Vec<(u64, u64, Duration)> = p
        .deliveries()
        .iter()
        .map(|d| (d.meta.seq, d.meta.timestamp_ns - EPOCH_NS, d.released))
        .collect();
    // Ticks at 16, 32, …, 1008 ms; each carries the frame created at that very instant
    // (frame 999 at the last one); released after the 2 ms link.
    let want: Vec<(u64, u64, Duration)> = (1..=63u64)
        .map(|k| {
            let seq = (16 * k).min(999);
            (seq, seq * MS, ms(16 * k + 2))
        })
        .collect();
    assert_eq!(got, want);
    for d in p.deliveries() {
        assert_eq!(&d.payload[..], &d.meta.seq.to_be_bytes());
    }
    let st = &p.source_stats()[0].half;
    assert_eq!(st.drops, 1000 - 63);
}

#[test]
fn repeat_re_emits_with_growing_seq_and_the_original_timestamp() {
    let inputs = [(0, 0), (5, 1), (50, 2)];
    let mut d = Driver::new(16, true);
    for (t, seq) in inputs {
        d.send(t, frame(seq, t));
    }
    // A fast burst afterwards: fresh frames get their own (higher) seq back.
    for t in 70..=100 {
        d.send(t, frame(t - 67, t));
    }
    d.run_until(130);
    assert_eq!(
        d.out,
        vec![
            (16, 1, 5, 1),    // newest at 16 ms: frame 1 (frame 0 superseded)
            (32, 2, 5, 1),    // repeat of frame 1: seq last + 1, timestamp 5 ms
            (48, 3, 5, 1),    // repeat
            (64, 4, 50, 2),   // fresh frame 2, renumbered: 2 is not above 3
            (80, 13, 80, 13), // fresh frame 13 keeps its seq
            (96, 29, 96, 29),
            (112, 33, 100, 33), // frame 33 (the last) arrived at 100 ms
            (128, 34, 100, 33), // repeat
        ]
    );
    let st = d.half.stats();
    assert_eq!(st.counters[2], ("repeats", 3));
    assert_eq!(st.counters[1], ("emitted", 8));

    // The same input without repeat: empty ticks emit nothing, fresh frames keep their seq,
    // and no timer runs while nothing is held.
    let mut d = Driver::new(16, false);
    for (t, seq) in inputs {
        d.send(t, frame(seq, t));
    }
    d.run_until(1000);
    assert_eq!(d.out, vec![(16, 1, 5, 1), (64, 2, 50, 2)]);
    assert_eq!(d.half.poll_timeout(), None);
}

#[test]
fn a_late_tick_emits_once_and_the_grid_does_not_drift() {
    let t0 = Instant::now();
    let at = |v: u64| t0 + ms(v);
    let mut h = PeriodicForward::new(ms(16), true);
    let mut out = Output::new();
    h.handle_frame(at(0), frame(0, 0), &mut out).unwrap();
    assert_eq!(h.poll_timeout(), Some(at(16)));
    // Serviced at 50 ms instead of 16: one frame, next tick back on the grid at 64.
    h.handle_timeout(at(50), &mut out);
    assert_eq!(out.take_frames().len(), 1);
    assert_eq!(h.poll_timeout(), Some(at(64)));
    // Repeats: serviced at 100 ms: one repeat, next at 112.
    h.handle_timeout(at(100), &mut out);
    assert_eq!(out.take_frames().len(), 1);
    assert_eq!(h.poll_timeout(), Some(at(112)));
    // A frame arriving after a missed tick: the held frame goes out first.
    let mut h = PeriodicForward::new(ms(16), false);
    h.handle_frame(at(0), frame(0, 0), &mut out).unwrap();
    h.handle_frame(at(20), frame(1, 20), &mut out).unwrap();
    let f = out.take_frames();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].meta.seq, 0);
    assert_eq!(h.poll_timeout(), Some(at(32)));
    // A frame arriving exactly at a tick belongs to that tick.
    h.handle_frame(at(32), frame(2, 32), &mut out).unwrap();
    assert!(out.take_frames().is_empty());
    h.handle_timeout(at(32), &mut out);
    let f = out.take_frames();
    assert_eq!(f[0].meta.seq, 2);
    assert_eq!(h.stats().counters[0], ("superseded", 1));
    // Idle without repeat: the next frame lands on the grid (first tick after it).
    h.handle_frame(at(1000), frame(3, 1000), &mut out).unwrap();
    assert_eq!(h.poll_timeout(), Some(at(1008)));
}

#[test]
fn flush_emits_the_held_frame_and_stops_the_grid() {
    let t0 = Instant::now();
    let mut h = PeriodicForward::new(ms(16), true);
    let mut out = Output::new();
    h.handle_frame(t0, frame(7, 0), &mut out).unwrap();
    h.flush(&mut out);
    let f = out.take_frames();
    assert_eq!((f.len(), f[0].meta.seq), (1, 7));
    assert_eq!(f[0].payload(), 7u64.to_be_bytes());
    assert_eq!(
        h.poll_timeout(),
        None,
        "no repeats after the end of the stream"
    );
    h.flush(&mut out);
    assert!(out.take_frames().is_empty());
    // After a flush the seq still only grows.
    h.handle_frame(t0 + ms(100), frame(3, 100), &mut out)
        .unwrap();
    h.handle_timeout(t0 + ms(116), &mut out);
    assert_eq!(out.take_frames()[0].meta.seq, 8);
}

#[test]
fn config_parses_validates_and_describes() {
    let parse = |s: &str| toml::from_str::<PeriodicConfig>(s).map_err(|e| e.to_string());
    let d = PeriodicConfig::default();
    d.validate().unwrap();
    assert_eq!(d.describe(), "periodic(interval_ms=16, repeat=false)");
    let c = parse("interval_ms = 100\nrepeat = true").unwrap();
    assert_eq!(c.describe(), "periodic(interval_ms=100, repeat=true)");
    assert_ne!(
        ndd_wire::param_hash(&c.describe()),
        ndd_wire::param_hash(&d.describe())
    );
    for (s, want) in [
        (
            "interval_ms = 0",
            "periodic: interval_ms = 0 is out of range 1..=60000",
        ),
        (
            "interval_ms = 60001",
            "periodic: interval_ms = 60001 is out of range 1..=60000",
        ),
    ] {
        let c = parse(s).unwrap();
        assert_eq!(c.validate().unwrap_err().to_string(), want);
        assert_eq!(
            c.inverse().err(),
            Some(ModuleError::from(c.validate().unwrap_err()))
        );
    }
    assert!(parse("intervall_ms = 3")
        .unwrap_err()
        .contains("unknown field `intervall_ms`"));
    assert!(parse("repeat = 1").is_err());
    assert_eq!(INFO.id, 8);
    let names: Vec<&str> = INFO.params.iter().map(|p| p.name).collect();
    assert_eq!(names, ["interval_ms", "repeat"]);
}

#[test]
fn control_messages_are_refused_by_both_halves() {
    let c = PeriodicConfig::default();
    let mut src = Stack::build(Role::Source, "s", &[&c]).unwrap();
    let e = src
        .handle_control(Instant::now(), 0, bytes::Bytes::from_static(b"\x01"))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream \"s\" layer 0 (periodic, source side): malformed control message: periodic: \
         defines no control messages, got one of 1 bytes"
    );
    let mut inv = c.inverse().unwrap();
    assert!(matches!(
        inv.handle_control(Instant::now(), bytes::Bytes::new(), &mut Output::new()),
        Err(ModuleError::MalformedControl(_))
    ));
}

/// (when, meta, payload) of every frame the forward half emitted.
type Tapped = Arc<Mutex<Vec<(Instant, Meta, Vec<u8>)>>>;

/// Records what the forward half emitted, and when.
struct Tap(Tapped);

impl ndd_core::Half for Tap {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        if let Ok(mut v) = self.0.lock() {
            v.push((now, frame.meta, frame.payload().to_vec()));
        }
        out.push(frame);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn over_a_lossy_link_the_sink_gets_only_emitted_frames_in_order(
        interval_ms in 1u64..40,
        repeat in any::<bool>(),
        gaps in proptest::collection::vec(0u64..30, 1..80),
        loss in prop_oneof![Just(0.0), 0.0f64..0.5],
        seed in any::<u64>(),
    ) {
        let c = PeriodicConfig { interval_ms, repeat };
        let tapped = Arc::new(Mutex::new(Vec::new()));
        let src = Stack::from_halves(
            Role::Source,
            "sim",
            vec![("periodic", c.forward().unwrap()), ("tap", Box::new(Tap(tapped.clone())))],
        );
        let sink = Stack::from_halves(
            Role::Sink,
            "sim",
            vec![("periodic", c.inverse().unwrap()), ("tap", Box::new(PassHalf))],
        );
        let link = LinkConfig { loss, ..LinkConfig::tcp(ms(3), ms(5)) };
        let mut p = Pipeline::with_stacks(src, sink, link, seed);
        let mut at = 0;
        let mut created = Vec::new();
        for (i, g) in gaps.iter().enumerate() {
            at += g;
            created.push(at);
            p.send_at(ms(at), (i as u64).to_be_bytes().to_vec());
        }
        if repeat {
            // Repeats never stop: run a while past the last frame.
            p.run_until(ms(at + 10 * interval_ms)).unwrap();
        } else {
            p.finish().unwrap();
        }
        let tapped = tapped.lock().unwrap().clone();
        let got: Vec<(Meta, Vec<u8>)> =
            p.deliveries().iter().map(|d| (d.meta, d.payload.to_vec())).collect();
        let emitted: Vec<(Meta, Vec<u8>)> =
            tapped.iter().map(|(_, m, b)| (*m, b.clone())).collect();

        // What the forward half emitted: strictly growing seq, ticks on the grid, and each
        // the newest frame at its tick (or a repeat of the last one emitted).
        let t0 = created[0];
        let mut last: Option<(u64, u64)> = None; // (seq, source index)
        for (t, m, b) in &tapped {
            let t_ms = p.clock.since_start(*t).as_millis() as u64;
            let idx = u64::from_be_bytes(b[..8].try_into().unwrap());
            prop_assert!(last.is_none_or(|(s, _)| m.seq > s), "seq grows");
            prop_assert_eq!(m.timestamp_ns, EPOCH_NS + created[idx as usize] * MS);
            // (finish() runs the timers before it flushes, so every emission is on a tick.)
            prop_assert!(t_ms > t0 && (t_ms - t0).is_multiple_of(interval_ms), "on the grid: {}", t_ms);
            let newest = created.iter().rposition(|&c| c <= t_ms).unwrap() as u64;
            if last.is_some_and(|(_, i)| i == newest) {
                prop_assert!(repeat, "re-emitted only with repeat");
            } else {
                prop_assert_eq!(idx, newest, "the newest frame at {} ms", t_ms);
            }
            if !repeat {
                prop_assert_eq!(m.seq, idx, "without repeat, seq is the frame's own");
            }
            last = Some((m.seq, idx));
        }
        // What the sink got: only emitted frames, in order, bytes and meta intact.
        let mut it = emitted.iter();
        for g in &got {
            prop_assert!(it.any(|e| e == g), "{:?} was not emitted (or out of order)", g.0);
        }
        if loss == 0.0 {
            prop_assert_eq!(&got[..], &emitted[..got.len()]);
            if !repeat {
                prop_assert_eq!(got.len(), emitted.len());
            }
        }
    }
}
