use super::*;
use crate::bundle::BundleConfig;
use bytes::Bytes;
use ndd_core::{Frame, Half, Meta, Output, Role, Stack};
use ndd_testkit::{experiments, spacing_error, LinkConfig, Pipeline, EPOCH_NS};
use proptest::prelude::*;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;

fn meta(seq: u64, ts_ms: u64) -> Meta {
    Meta {
        stream: 6,
        seq,
        timestamp_ns: ts_ms * MS,
        flags: (seq % 3) as u16,
    }
}

fn counter(c: &[(&'static str, u64)], name: &str) -> u64 {
    c.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn seqs(out: &mut Output) -> Vec<u64> {
    out.take_frames().iter().map(|f| f.meta.seq).collect()
}

fn refill(n: u32) -> Bytes {
    Bytes::copy_from_slice(&encode_refill(n))
}

fn stacks(p: &dyn Pair) -> (Stack, Stack) {
    (
        Stack::build(Role::Source, "jitter", &[p]).unwrap(),
        Stack::build(Role::Sink, "jitter", &[p]).unwrap(),
    )
}

/// What a sink half did: releases as (seq, ms after t0), control messages as (ms, bytes).
#[derive(Debug, Default)]
struct Trace {
    released: Vec<(u64, u64)>,
    control: Vec<(u64, String)>,
}

/// Feeds `arrivals` (arrival ms, seq, timestamp ms) to a sink half, serving its timeouts, until
/// nothing is left to do.
fn drive(h: &mut BufferInverse, arrivals: &[(u64, u64, u64)]) -> Trace {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let mut tr = Trace::default();
    let mut out = Output::new();
    let mut next = 0;
    loop {
        let arrival = arrivals.get(next).map(|a| at(a.0));
        let now = match (arrival, h.poll_timeout()) {
            (Some(a), Some(t)) => a.min(t),
            (Some(a), None) => a,
            (None, Some(t)) => t,
            (None, None) => break,
        };
        if arrival == Some(now) {
            let (_, seq, ts) = arrivals[next];
            next += 1;
            h.handle_frame(now, Frame::new(meta(seq, ts), b"f"), &mut out)
                .unwrap();
        } else {
            h.handle_timeout(now, &mut out);
        }
        let ms = (now - t0).as_millis() as u64;
        for f in out.take_frames() {
            tr.released.push((f.meta.seq, ms));
        }
        for c in out.take_control() {
            tr.control.push((ms, hex(&c)));
        }
        if tr.released.len() > 1000 {
            panic!("runaway: {tr:?}");
        }
    }
    tr
}

#[test]
fn refill_format_matches_vector_and_rejects_garbage() {
    assert_eq!(hex(&encode_refill(7)), "0100000007");
    assert_eq!(hex(&encode_refill(0x0102_0304)), "0101020304");
    assert_eq!(decode_refill(&encode_refill(65_535)), Ok(65_535));
    let text = |msg: &[u8]| decode_refill(msg).map_err(|e| e.to_string());
    assert_eq!(text(&[]), Err("buffer: empty control message".to_string()));
    assert_eq!(
        text(&[1, 0, 0, 7]),
        Err("buffer: refill message is 4 bytes, expected 5".to_string())
    );
    assert_eq!(
        text(&[2, 0, 0, 0, 7]),
        Err("buffer: unknown control message type 0x02".to_string())
    );
}

#[test]
fn config_validates_and_describes_every_parameter() {
    let c = BufferConfig::default();
    assert_eq!(
        c.describe(),
        "buffer(min=5, max=10, source_max=400, playout_ms=0)"
    );
    assert_eq!(c.id(), 6);
    let names: Vec<&str> = INFO.params.iter().map(|p| p.name).collect();
    assert_eq!(names, ["min", "max", "source_max", "playout_ms"]);
    let cases = [
        (
            BufferConfig {
                min: 11,
                ..c.clone()
            },
            "buffer: min = 11 is out of range 1..=10 (1..=max)",
        ),
        (
            BufferConfig {
                min: 0,
                ..c.clone()
            },
            "buffer: min = 0 is out of range 1..=10 (1..=max)",
        ),
        (
            BufferConfig {
                max: 0,
                ..c.clone()
            },
            "buffer: max = 0 is out of range 1..=65535",
        ),
        (
            BufferConfig {
                source_max: 0,
                ..c.clone()
            },
            "buffer: source_max = 0 is out of range 1..=1000000",
        ),
        (
            BufferConfig {
                playout_ms: 60_001,
                ..c.clone()
            },
            "buffer: playout_ms = 60001 is out of range 0..=60000",
        ),
    ];
    for (cfg, want) in cases {
        assert_eq!(
            cfg.validate().map_err(|e| e.to_string()),
            Err(want.to_string())
        );
        assert_eq!(
            cfg.inverse().err().map(|e| e.to_string()),
            Some(format!("cannot start: {want}"))
        );
    }
}

#[test]
fn source_releases_against_credit_and_drops_the_oldest() {
    let t0 = Instant::now();
    let mut src = BufferForward::new(3, 4);
    let mut out = Output::new();
    for seq in 0..10 {
        src.handle_frame(t0, Frame::new(meta(seq, seq), b"s"), &mut out)
            .unwrap();
    }
    assert_eq!(seqs(&mut out), vec![0, 1, 2], "initial credit = max");
    let st = src.stats();
    assert_eq!(
        (st.drops, st.queue_depth),
        (3, 4),
        "holds 6..=9, dropped 3..=5"
    );
    src.handle_control(t0, refill(2), &mut out).unwrap();
    assert_eq!(seqs(&mut out), vec![6, 7]);
    // Credit never exceeds max: of 100, 3 remain after releasing 8 and 9... capped first.
    src.handle_control(t0, refill(100), &mut out).unwrap();
    assert_eq!(seqs(&mut out), vec![8, 9]);
    let st = src.stats();
    assert_eq!(counter(&st.counters, "credit"), 1, "min(0 + 100, 3) − 2");
    assert_eq!(counter(&st.counters, "released"), 7);
    assert_eq!(counter(&st.counters, "dropped_oldest"), 3);
    assert_eq!(counter(&st.counters, "refills"), 2);
    src.handle_frame(t0, Frame::new(meta(10, 10), b"s"), &mut out)
        .unwrap();
    assert_eq!(seqs(&mut out), vec![10], "remaining credit used at once");
    // End of stream: everything held goes.
    for seq in 11..13 {
        src.handle_frame(t0, Frame::new(meta(seq, seq), b"s"), &mut out)
            .unwrap();
    }
    assert!(out.take_frames().is_empty());
    src.flush(&mut out);
    assert_eq!(seqs(&mut out), vec![11, 12]);
}

#[test]
fn a_lost_refill_cannot_stall_the_source_for_good() {
    let t0 = Instant::now();
    let mut src = BufferForward::new(2, 100);
    let mut out = Output::new();
    for seq in 0..5 {
        src.handle_frame(t0, Frame::new(meta(seq, seq), b"s"), &mut out)
            .unwrap();
    }
    assert_eq!(seqs(&mut out), vec![0, 1]);
    assert_eq!(src.poll_timeout(), Some(t0 + SOURCE_STALL));
    src.handle_timeout(t0 + SOURCE_STALL - Duration::from_millis(1), &mut out);
    assert!(out.take_frames().is_empty());
    src.handle_timeout(t0 + SOURCE_STALL, &mut out);
    assert_eq!(seqs(&mut out), vec![2, 3], "grants itself max");
    assert_eq!(src.poll_timeout(), Some(t0 + 2 * SOURCE_STALL));
    assert_eq!(counter(&src.stats().counters, "self_refills"), 1);
    // A refill that does arrive stops the timer.
    src.handle_control(t0 + SOURCE_STALL, refill(5), &mut out)
        .unwrap();
    assert_eq!(seqs(&mut out), vec![4]);
    assert_eq!(src.poll_timeout(), None);
}

#[test]
fn sink_plays_out_with_original_spacing_refills_and_reanchors_when_late() {
    // min 3, max 5, playout at most 100 ms after the first arrival.
    let mut sink = BufferInverse::new(3, 5, Duration::from_millis(100));
    // (arrival ms, seq, timestamp ms): frames every 16 ms with jitter; 4 comes very late.
    let arrivals = [
        (10, 0, 0),
        (40, 1, 16),
        (41, 2, 32), // three held: playout starts, anchor (41 ms, ts 0)
        (60, 3, 48),
        (200, 4, 64), // due at 105: late, the schedule restarts from it
        (201, 5, 80),
        (240, 6, 96),
    ];
    let tr = drive(&mut sink, &arrivals);
    assert_eq!(
        tr.released,
        vec![
            (0, 41),
            (1, 57),
            (2, 73),
            (3, 89),
            (4, 200),
            (5, 216),
            (6, 240), // 232 was its due time, it came at 240: late again
        ]
    );
    let r = |n| hex(&encode_refill(n));
    assert_eq!(
        tr.control,
        vec![
            (41, r(3)),  // released 0, holds 2 (< min 3): ask for 5 − 2
            (57, r(4)),  // holds 1 (3 arrived at 60)
            (73, r(4)),  // holds 1
            (89, r(5)),  // holds 0
            (105, r(5)), // the next frame was due and the queue is empty: underrun
            (200, r(5)),
            (216, r(5)),
            (232, r(5)), // underrun again: 6 was due at 232
            (240, r(5)),
            (256, r(5)), // the stream ended: one more underrun
        ]
    );
    let st = sink.stats();
    assert_eq!(counter(&st.counters, "late"), 2);
    assert_eq!(counter(&st.counters, "underruns"), 3);
    assert_eq!(counter(&st.counters, "requests"), 10);
    // Fastest transit: frame 2 (9 ms); the anchor now is frame 6, whose transit was 144 ms.
    assert_eq!(counter(&st.counters, "delay_us"), 135_000);
    assert_eq!(st.queue_depth, 0);
}

#[test]
fn after_a_stall_the_backlog_goes_out_and_the_delay_comes_back_down() {
    // Frames every 16 ms, 5 ms transit; a 2 s stall holds frames 10..135 back, then they
    // arrive at once (resent after a reconnect), then the stream goes on as before.
    let mut sink = BufferInverse::new(2, 5, Duration::ZERO);
    let mut arrivals = vec![];
    for seq in 0..150u64 {
        let ts = seq * 16;
        let arrival = if (10..135).contains(&seq) {
            2170
        } else {
            ts + 5
        };
        arrivals.push((arrival, seq, ts));
    }
    let tr = drive(&mut sink, &arrivals);
    let order: Vec<u64> = tr.released.iter().map(|r| r.0).collect();
    assert_eq!(order, (0..150).collect::<Vec<_>>(), "every frame, in order");
    // The last frame arrives at 2389 ms: with the backlog played at its original spacing it
    // would leave about 2 s later (4394 ms); caught up, it leaves within twice `max` frames
    // (160 ms).
    let (_, last) = tr.released[149];
    assert!(last <= 2389 + 160, "frame 149 released at {last} ms");
    let st = sink.stats();
    assert!(counter(&st.counters, "reanchors") >= 1);
}

#[test]
fn playout_waits_for_min_frames_or_the_playout_time() {
    // Only two frames ever come; min 3: playout starts 100 ms after the first arrival.
    let mut sink = BufferInverse::new(3, 5, Duration::from_millis(100));
    let tr = drive(&mut sink, &[(10, 0, 0), (20, 1, 16)]);
    assert_eq!(tr.released, vec![(0, 110), (1, 126)]);
    // With playout 0 the first frame goes at once.
    let mut sink = BufferInverse::new(3, 5, Duration::ZERO);
    let tr = drive(&mut sink, &[(10, 0, 0), (20, 1, 16)]);
    assert_eq!(tr.released, vec![(0, 10), (1, 26)]);
    // Flushed before playout started: everything goes, and no timer is left behind.
    let mut sink = BufferInverse::new(3, 5, Duration::from_millis(100));
    let mut out = Output::new();
    sink.handle_frame(Instant::now(), Frame::new(meta(0, 0), b"f"), &mut out)
        .unwrap();
    assert!(sink.poll_timeout().is_some());
    sink.flush(&mut out);
    assert_eq!(seqs(&mut out), vec![0]);
    assert_eq!(sink.poll_timeout(), None);
}

#[test]
fn reordered_frames_are_sorted_stale_ones_dropped_and_clock_jumps_restart() {
    let mut sink = BufferInverse::new(2, 4, Duration::from_millis(50));
    let hour = 3_600_000;
    let tr = drive(
        &mut sink,
        &[
            (10, 1, 16), // arrives before 0
            (12, 0, 0),  // two held: anchor (12 ms, ts 0)
            (13, 3, 48),
            (50, 2, 32),   // due at 44: late, re-anchors; 3 now due at 66
            (51, 9, 1),    // older than 2, which is out: stale, dropped
            (52, 2, 32),   // 2 again (resent after a reconnect): stale, dropped
            (70, 4, hour), // source clock jumped an hour: the schedule restarts
            (80, 5, hour + 16),
        ],
    );
    assert_eq!(
        tr.released,
        vec![(0, 12), (1, 28), (2, 50), (3, 66), (4, 70), (5, 86)]
    );
    let st = sink.stats();
    assert_eq!(st.drops, 2);
    assert_eq!(counter(&st.counters, "stale"), 2);
    assert_eq!(counter(&st.counters, "restarts"), 1);
    assert_eq!(counter(&st.counters, "late"), 1);
}

#[test]
fn refills_cross_the_stack_by_layer_and_a_bad_one_fails_the_stream() {
    let c = BufferConfig {
        min: 2,
        max: 2,
        source_max: 10,
        playout_ms: 0,
    };
    let (mut src, mut sink) = stacks(&c);
    let t0 = Instant::now();
    for seq in 0..4 {
        src.handle_frame(t0, Frame::new(meta(seq, 16 * seq), b"z"))
            .unwrap();
    }
    let wire: Vec<Frame> = std::iter::from_fn(|| src.poll_frame()).collect();
    assert_eq!(wire.len(), 2, "initial credit 2");
    for f in wire {
        sink.handle_frame(t0, f).unwrap();
    }
    // Playout started on frame 0 and released it before 1 came: 0 held < min 2, ask for 2.
    assert_eq!(sink.poll_frame().map(|f| f.meta), Some(meta(0, 0)));
    let (layer, msg) = sink.poll_control().unwrap();
    assert_eq!((layer, hex(&msg)), (0, "0100000002".to_string()));
    assert_eq!(
        sink.poll_control(),
        None,
        "1 is queued, not released: no request"
    );
    src.handle_control(t0, layer, msg).unwrap();
    let metas: Vec<Meta> = std::iter::from_fn(|| src.poll_frame())
        .map(|f| f.meta)
        .collect();
    assert_eq!(metas, vec![meta(2, 32), meta(3, 48)]);
    assert_eq!(src.stats()[0].control_in, 1);
    assert_eq!(sink.stats()[0].control_out, 1);
    let e = src
        .handle_control(t0, 0, Bytes::from_static(&[9]))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream \"jitter\" layer 0 (buffer, source side): malformed control message: buffer: unknown control message type 0x09"
    );
    // The source half sends none, so the sink half refuses any.
    let e = sink.handle_control(t0, 0, refill(1)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "stream \"jitter\" layer 0 (buffer, sink side): malformed control message: this pair defines no control messages (got one of 5 bytes)"
    );
}

#[test]
fn spacing_is_exact_despite_loss_once_the_buffer_covers_the_jitter() {
    let c = BufferConfig {
        min: 5,
        max: 10,
        source_max: 400,
        playout_ms: 100,
    };
    let link = LinkConfig {
        loss: 0.1,
        ..LinkConfig::tcp(Duration::from_millis(10), Duration::from_millis(20))
    };
    let mut p = Pipeline::new(&[&c], link, 11).unwrap();
    for i in 0..500u64 {
        p.send_at(Duration::from_millis(16 * i), vec![i as u8; 8]);
    }
    p.finish().unwrap();
    let lost = p.data_link().lost;
    assert!(lost > 20, "the link did lose frames: {lost}");
    assert_eq!(p.deliveries().len() as u64, 500 - lost);
    let e = spacing_error(p.deliveries());
    assert!(e.max_ms < 1e-6, "{e:?}");
    let st = &p.sink_stats()[0].half;
    assert_eq!(counter(&st.counters, "late"), 0);
}

proptest! {
    /// Over a lossy link (in order, or reordering): the sink sees the frames in timestamp
    /// order, byte- and meta-exact, and every frame is accounted for: delivered, lost by the
    /// link, dropped as stale by the sink, or dropped as the oldest by the source.
    #[test]
    fn round_trip_delivers_every_surviving_frame_exactly_and_in_order(
        sizes in proptest::collection::vec(0usize..200, 1..80),
        gap_ms in 1u64..20,
        loss in 0.0f64..0.25,
        jitter_ms in 0u64..40,
        in_order in any::<bool>(),
        min in 1u32..6,
        extra in 0u32..6,
        source_max in 1u32..50,
        playout_ms in 0u64..80,
        seed in any::<u64>(),
    ) {
        let c = BufferConfig { min, max: min + extra, source_max, playout_ms };
        let link = LinkConfig {
            in_order,
            ..LinkConfig::datagram(Duration::from_millis(5), Duration::from_millis(jitter_ms), loss)
        };
        let mut p = Pipeline::new(&[&c], link, seed).unwrap();
        let payloads: Vec<Vec<u8>> = sizes.iter().enumerate()
            .map(|(i, &n)| (0..n).map(|b| (b * 3 + i) as u8).collect()).collect();
        for (i, pl) in payloads.iter().enumerate() {
            p.send_at(Duration::from_millis(gap_ms * i as u64), pl.clone());
        }
        p.finish().unwrap();
        let d = p.deliveries();
        for w in d.windows(2) {
            prop_assert!(w[0].meta.seq < w[1].meta.seq, "timestamp order");
        }
        for x in d {
            prop_assert_eq!(&x.payload[..], &payloads[x.meta.seq as usize][..]);
            prop_assert_eq!(x.meta.timestamp_ns, EPOCH_NS + x.created.as_nanos() as u64);
            prop_assert_eq!((x.meta.stream, x.meta.flags), (1, 0));
        }
        let dropped = p.source_stats()[0].half.drops;
        let stale = p.sink_stats()[0].half.drops;
        let lost = p.data_link().lost;
        prop_assert_eq!(d.len() as u64 + dropped + stale + lost, sizes.len() as u64);
        if in_order {
            prop_assert_eq!(stale, 0);
        }
    }
}

/// Stacks for the jitter experiment's variants.
fn jitter_variant(name: &str) -> (Stack, Stack) {
    match name {
        // Sized for the worst case, 200 ms of jitter: playout starts 250 ms after the first
        // arrival (or with 20 frames held), and a refill is asked for while 20 frames (320 ms)
        // remain, which covers a refill round trip of 2 × (10 + jitter) ms nearly always.
        "buffer" => stacks(&BufferConfig {
            min: 20,
            max: 32,
            source_max: 400,
            playout_ms: 250,
        }),
        // The dissertation's sink size (max 10, source 400); playout at the first frame.
        "buffer max 10" => stacks(&BufferConfig {
            min: 10,
            max: 10,
            source_max: 400,
            playout_ms: 0,
        }),
        "bundle" => stacks(&BundleConfig {
            count: 10,
            max_delay_ms: 500,
            ..BundleConfig::default()
        }),
        other => panic!("no variant {other}"),
    }
}

/// The experiment (dissertation Fig. 6.12 and 6.14): 16 ms frames over a TCP-like link
/// with 10 ms delay and 5–200 ms of uniform jitter, 1000 frames. Run with `--nocapture` for
/// the table.
#[test]
fn jitter_experiment_buffer_removes_jitter_at_every_level() {
    let jitters = [5, 10, 25, 50, 100, 200];
    let rows = experiments::jitter_table(
        &jitter_variant,
        &["bare", "buffer", "buffer max 10", "bundle"],
        &jitters,
        1000,
        1,
    )
    .unwrap();
    println!("{}", experiments::markdown(&rows));
    // NDD_JITTER_OUT=dir writes the table and the plot there.
    if let Some(dir) = std::env::var_os("NDD_JITTER_OUT") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::write(dir.join("jitter.md"), experiments::markdown(&rows)).unwrap();
        std::fs::write(dir.join("jitter.svg"), experiments::svg(&rows)).unwrap();
    }
    for r in &rows {
        let j = r.jitter_ms as f64;
        assert_eq!(r.delivered, 1000, "{r:?}");
        match r.variant.as_str() {
            "bare" => assert!(r.mean_ms > j / 12.0, "{r:?}"),
            "buffer" => {
                assert!(r.mean_ms < 0.1, "{r:?}");
                assert!(r.added_delay_ms < 500.0, "{r:?}");
            }
            // The dissertation: < 0.1 ms up to 50 ms of jitter, 1.5 ms at 200 ms.
            "buffer max 10" if r.jitter_ms <= 100 => assert!(r.mean_ms < 0.1, "{r:?}"),
            "buffer max 10" => assert!(r.mean_ms < 1.5, "{r:?}"),
            "bundle" => assert!(r.mean_ms < 1.0, "{r:?}"),
            _ => unreachable!(),
        }
    }
}

#[test]
fn an_audio_rate_stream_never_waits_for_the_self_refill() {
    // 10 ms sound blocks over a fast link: the refills keep the source going.
    let c = BufferConfig {
        min: 4,
        max: 8,
        source_max: 400,
        playout_ms: 40,
    };
    let link = LinkConfig::tcp(Duration::from_micros(200), Duration::from_millis(15));
    let mut p = Pipeline::new(&[&c], link, 3).unwrap();
    for i in 0..600u64 {
        p.send_at(Duration::from_millis(10 * i), vec![i as u8; 960]);
    }
    p.finish().unwrap();
    let src = &p.source_stats()[0].half;
    assert_eq!(counter(&src.counters, "self_refills"), 0, "{src:?}");
    let worst = p
        .deliveries()
        .iter()
        .map(|d| d.released - d.created)
        .max()
        .unwrap();
    assert!(worst < Duration::from_millis(100), "{worst:?}");
}
