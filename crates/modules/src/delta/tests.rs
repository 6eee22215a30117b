use super::format::{Header, KeyRequest, KIND_DELTA, KIND_KEY};
use super::*;
use crate::compress::CompressConfig;
use crate::pass::PassHalf;
use bytes::Bytes;
use ndd_core::{Frame, Meta, Output, Role, Stack};
use ndd_testkit::{LinkConfig, Pipeline, SimRng, EPOCH_NS};
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn meta(seq: u64) -> Meta {
    Meta {
        stream: 10,
        seq,
        timestamp_ns: 7_000 + seq,
        flags: 0x0102,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn counters(c: &[(&'static str, u64)]) -> HashMap<&'static str, u64> {
    c.iter().copied().collect()
}

/// `n` frames of `len` bytes: random at first, then a few bytes change per frame.
fn slowly_changing(n: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = SimRng::new(seed);
    let mut cur = vec![0u8; len];
    rng.fill(&mut cur);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(cur.clone());
        for _ in 0..4 {
            if len > 0 {
                let i = rng.range(0, len as u64 - 1) as usize;
                cur[i] = cur[i].wrapping_add(1 + rng.range(0, 254) as u8);
            }
        }
    }
    v
}

/// Records (seq, first payload byte = delta kind) of every frame the source sends.
struct Spy(Arc<Mutex<Vec<(u64, u8)>>>);

impl ndd_core::Half for Spy {
    fn handle_frame(
        &mut self,
        _now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        if let Ok(mut log) = self.0.lock() {
            log.push((frame.meta.seq, frame.payload()[0]));
        }
        out.push(frame);
        Ok(())
    }
}

#[test]
fn describe_config_and_validation() {
    assert_eq!(
        DeltaConfig::default().describe(),
        "delta(keyframe_interval=100)"
    );
    assert_eq!(INFO.id, 10);
    assert_eq!(INFO.params.len(), 1);
    assert_eq!(INFO.params[0].name, "keyframe_interval");
    let c: DeltaConfig = toml::from_str("keyframe_interval = 0").unwrap();
    assert_eq!(c.describe(), "delta(keyframe_interval=0)");
    let e = toml::from_str::<DeltaConfig>("interval = 3").unwrap_err();
    assert!(e.to_string().contains("unknown field `interval`"), "{e}");
    let bad = DeltaConfig {
        keyframe_interval: 1_000_001,
    };
    let want = "delta: keyframe_interval = 1000001 is out of range 0..=1000000";
    assert_eq!(bad.validate().unwrap_err().to_string(), want);
    let setup = ModuleError::from(bad.validate().unwrap_err());
    assert_eq!(bad.forward().err(), Some(setup.clone()));
    assert_eq!(bad.inverse().err(), Some(setup));
}

#[test]
fn header_and_control_vectors() {
    let mut fwd = DeltaForward::new(100);
    let mut out = Output::new();
    let now = Instant::now();
    for (seq, p) in [(7u64, &b"abcd"[..]), (8, b"abce"), (9, b"xyz")] {
        fwd.handle_frame(now, Frame::new(meta(seq), p), &mut out)
            .unwrap();
    }
    let wire: Vec<String> = out.take_frames().iter().map(|f| hex(f.payload())).collect();
    assert_eq!(
        wire,
        [
            "0061626364",                 // key frame: kind 0, "abcd"
            "01000000000000000700000001", // delta against seq 7: "abcd" ^ "abce"
            "0078797a",                   // size changed: key frame "xyz"
        ]
    );
    assert_eq!(
        hex(&KeyRequest { last: Some(0x0102) }.emit()),
        "010000000000000102"
    );
    assert_eq!(hex(&KeyRequest { last: None }.emit()), "01ffffffffffffffff");
    assert_eq!(
        KeyRequest::parse(&[1, 0, 0, 0, 0, 0, 0, 0, 5]),
        Ok(KeyRequest { last: Some(5) })
    );
    assert_eq!(
        KeyRequest::parse(&[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
        Ok(KeyRequest { last: None })
    );
    for h in [
        Header::Key,
        Header::Delta {
            reference: u64::MAX - 1,
        },
    ] {
        let mut b = vec![0; h.buffer_len()];
        h.emit(&mut b);
        assert_eq!(Header::parse(&b), Ok(h));
    }
    assert_eq!((KIND_KEY, KIND_DELTA), (0, 1));
}

#[test]
fn forward_chooses_key_frames() {
    let kinds = |interval: u32, sizes: &[usize], request_before: Option<usize>| {
        let mut fwd = DeltaForward::new(interval);
        let mut out = Output::new();
        let now = Instant::now();
        let mut v = String::new();
        for (i, &n) in sizes.iter().enumerate() {
            if request_before == Some(i) {
                fwd.handle_control(
                    now,
                    Bytes::from_static(&[1, 0, 0, 0, 0, 0, 0, 0, 0]),
                    &mut out,
                )
                .unwrap();
            }
            fwd.handle_frame(now, Frame::new(meta(i as u64), &vec![i as u8; n]), &mut out)
                .unwrap();
            v.push(if out.take_frames()[0].payload()[0] == 0 {
                'K'
            } else {
                'd'
            });
        }
        (v, counters(&fwd.stats().counters))
    };
    assert_eq!(kinds(3, &[8; 8], None).0, "KddKddKd");
    assert_eq!(kinds(1, &[8; 4], None).0, "KKKK");
    assert_eq!(kinds(0, &[8; 6], None).0, "Kddddd");
    assert_eq!(kinds(0, &[8, 8, 9, 9, 0, 0], None).0, "KdKdKd");
    let (v, c) = kinds(100, &[8; 6], Some(3));
    assert_eq!(v, "KddKdd");
    assert_eq!(c["key_requests"], 1);
    assert_eq!((c["key_frames"], c["delta_frames"]), (2, 4));
}

/// Drives a source and a sink stack by hand: frame 3 is lost; the sink drops the deltas after
/// it, sends exactly one key request, and delivery resumes at the key frame it triggers.
#[test]
fn a_lost_frame_triggers_one_key_request_and_delivery_resumes_at_the_key_frame() {
    let c = DeltaConfig {
        keyframe_interval: 0,
    };
    let mut src = Stack::build(Role::Source, "screen", &[&c]).unwrap();
    let mut sink = Stack::build(Role::Sink, "screen", &[&c]).unwrap();
    let now = Instant::now();
    let frames = slowly_changing(12, 256, 1);
    let mut delivered = vec![];
    let mut controls = vec![];
    for (i, p) in frames.iter().enumerate() {
        let seq = i as u64;
        // The request sent when frame 4 arrived reaches the source before frame 7.
        if seq == 7 {
            for (layer, msg) in controls.drain(..) {
                src.handle_control(now, layer, msg).unwrap();
            }
        }
        src.handle_frame(now, Frame::new(meta(seq), p)).unwrap();
        let wire = src.poll_frame().unwrap();
        let kind = wire.payload()[0];
        assert_eq!(kind, if seq == 0 || seq == 7 { 0 } else { 1 }, "seq {seq}");
        if seq == 3 {
            continue; // lost
        }
        sink.handle_frame(now, Frame::from_bytes(wire.meta, wire.into_bytes()))
            .unwrap();
        while let Some(f) = sink.poll_frame() {
            assert_eq!(f.payload(), &frames[f.meta.seq as usize][..]);
            assert_eq!(f.meta, meta(f.meta.seq));
            delivered.push(f.meta.seq);
        }
        while let Some(ctl) = sink.poll_control() {
            controls.push(ctl);
        }
        if seq == 4 {
            // Exactly one request, for layer 0: "send key frame, I last rebuilt seq 2".
            assert_eq!(controls.len(), 1);
            assert_eq!(controls[0].0, 0);
            assert_eq!(hex(&controls[0].1), "010000000000000002");
        }
    }
    assert_eq!(delivered, [0, 1, 2, 7, 8, 9, 10, 11]);
    let sink_st = &sink.stats()[0];
    assert_eq!(sink_st.half.drops, 3, "4, 5, 6 could not be rebuilt");
    assert_eq!(
        counters(&sink_st.half.counters),
        counters(&[
            ("key_frames", 2),
            ("delta_frames", 6),
            ("missing_reference", 3),
            ("key_requests", 1),
        ])
    );
    assert_eq!(
        sink_st.control_out, 1,
        "no flood: one request for three drops"
    );
    let src_st = &src.stats()[0];
    assert_eq!(src_st.control_in, 1);
    assert_eq!(
        counters(&src_st.half.counters),
        counters(&[("key_frames", 2), ("delta_frames", 10), ("key_requests", 1)])
    );
}

#[test]
fn requests_are_repeated_only_every_retry_interval_while_stuck() {
    let mut inv = DeltaInverse::default();
    let mut out = Output::new();
    let now = Instant::now();
    // No key frame ever arrives: deltas 1..=70 against missing references.
    for seq in 1..=70u64 {
        let mut f = Frame::new(meta(seq), &[0; 4]);
        Header::Delta { reference: seq - 1 }.emit_into(&mut f);
        inv.handle_frame(now, f, &mut out).unwrap();
    }
    assert!(out.take_frames().is_empty());
    let ctl = out.take_control();
    // Drops 1, 33 and 65.
    assert_eq!(ctl.len(), 3);
    assert_eq!(hex(&ctl[0]), "01ffffffffffffffff", "nothing rebuilt yet");
    let c = counters(&inv.stats().counters);
    assert_eq!((c["missing_reference"], c["key_requests"]), (70, 3));
    // A key frame ends the episode; a new loss asks again at once.
    let mut k = Frame::new(meta(71), &[1; 4]);
    Header::Key.emit_into(&mut k);
    inv.handle_frame(now, k, &mut out).unwrap();
    assert_eq!(out.take_frames().len(), 1);
    let mut d = Frame::new(meta(73), &[0; 4]);
    Header::Delta { reference: 72 }.emit_into(&mut d);
    inv.handle_frame(now, d, &mut out).unwrap();
    assert_eq!(hex(&out.take_control()[0]), "010000000000000047");
}

#[test]
fn a_request_is_repeated_after_twice_the_measured_response_time() {
    let mut inv = DeltaInverse::default();
    let mut out = Output::new();
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let frame = |seq: u64, h: Header| {
        let mut f = Frame::new(meta(seq), &[seq as u8; 8]);
        h.emit_into(&mut f);
        f
    };
    // Stuck at 0 ms; the key frame answering the request arrives at 20 ms.
    inv.handle_frame(ms(0), frame(1, Header::Delta { reference: 0 }), &mut out)
        .unwrap();
    assert_eq!(out.take_control().len(), 1);
    inv.handle_frame(ms(20), frame(5, Header::Key), &mut out)
        .unwrap();
    // Stuck again at 100 ms; that key frame is lost too: no repeat before 100 + 2 × 20 ms.
    let mut sent = vec![];
    for (i, t) in [100u64, 110, 120, 130, 140, 150, 160, 170]
        .into_iter()
        .enumerate()
    {
        let seq = 10 + i as u64;
        inv.handle_frame(
            ms(t),
            frame(seq, Header::Delta { reference: seq - 1 }),
            &mut out,
        )
        .unwrap();
        if !out.take_control().is_empty() {
            sent.push(t);
        }
    }
    assert_eq!(sent, [100, 150]);
}

/// A peer that sends a key frame, then a delta against a frame it never sent, a thousand
/// times in a second: every delta asks for a key frame (as it should), but the log says so
/// once, then with the count of the warnings held back.
#[test]
fn a_thousand_deltas_without_their_reference_in_a_second_are_one_warning() {
    let mut inv = DeltaInverse::default();
    let mut out = Output::new();
    let t0 = Instant::now();
    let ((), log) = ndd_core::testlog::Captured::run(|| {
        for i in 0..=1000u64 {
            // 1000 rounds within the first second, the last one a second in.
            let now = t0 + Duration::from_micros(i * 1000);
            let mut k = Frame::new(meta(3 * i + 1), &[1; 4]);
            Header::Key.emit_into(&mut k);
            inv.handle_frame(now, k, &mut out).unwrap();
            let mut d = Frame::new(meta(3 * i + 3), &[0; 4]);
            Header::Delta {
                reference: 3 * i + 2,
            }
            .emit_into(&mut d);
            inv.handle_frame(now, d, &mut out).unwrap();
        }
    });
    assert_eq!(out.take_control().len(), 1001, "every episode still asks");
    let lines = log.matching("delta: reference frame missing");
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[1].contains("suppressed=999"), "{lines:#?}");
}

impl Header {
    fn emit_into(&self, f: &mut Frame) {
        f.push_header_with(self.buffer_len(), |h| self.emit(h));
    }
}

#[test]
fn stale_and_resized_deltas_are_dropped_never_rebuilt_wrong() {
    let mut inv = DeltaInverse::default();
    let mut out = Output::new();
    let now = Instant::now();
    let mut k = Frame::new(meta(10), b"abcd");
    Header::Key.emit_into(&mut k);
    inv.handle_frame(now, k, &mut out).unwrap();
    // A delta against seq 10 but of another size: dropped, counted, key frame requested.
    let mut d = Frame::new(meta(11), b"abc");
    Header::Delta { reference: 10 }.emit_into(&mut d);
    inv.handle_frame(now, d, &mut out).unwrap();
    assert_eq!(out.take_control().len(), 1);
    // A late delta older than the frame held: dropped without a request.
    let mut late = Frame::new(meta(9), b"abcd");
    Header::Delta { reference: 8 }.emit_into(&mut late);
    inv.handle_frame(now, late, &mut out).unwrap();
    assert!(out.take_control().is_empty());
    // A late key frame is delivered but does not replace the newer reference.
    let mut k5 = Frame::new(meta(5), b"zzzz");
    Header::Key.emit_into(&mut k5);
    inv.handle_frame(now, k5, &mut out).unwrap();
    let mut d11 = Frame::new(meta(11), &[0, 0, 0, 1]);
    Header::Delta { reference: 10 }.emit_into(&mut d11);
    inv.handle_frame(now, d11, &mut out).unwrap();
    let got: Vec<(u64, Vec<u8>)> = out
        .take_frames()
        .into_iter()
        .map(|f| (f.meta.seq, f.payload().to_vec()))
        .collect();
    assert_eq!(
        got,
        [
            (10, b"abcd".to_vec()),
            (5, b"zzzz".to_vec()),
            (11, b"abce".to_vec())
        ]
    );
    let st = inv.stats();
    assert_eq!(st.drops, 2);
    assert_eq!(counters(&st.counters)["missing_reference"], 2);
}

#[test]
fn malformed_frames_and_control_messages_fail_with_clear_errors() {
    let c = DeltaConfig::default();
    let now = Instant::now();
    let cases: &[(&[u8], &str)] = &[
        (b"", "malformed frame: delta: empty frame (no kind byte)"),
        (b"\x02abc", "malformed frame: delta: unknown kind 2"),
        (
            b"\x01\x00\x00\x00",
            "malformed frame: delta: frame of 4 bytes is shorter than the 9-byte delta header",
        ),
    ];
    for (bytes, want) in cases {
        let mut sink = Stack::build(Role::Sink, "screen", &[&c]).unwrap();
        let e = sink
            .handle_frame(now, Frame::new(meta(1), bytes))
            .unwrap_err();
        assert_eq!(e.error.to_string(), *want);
        assert_eq!((e.layer, e.module), (0, "delta"));
    }
    let ctl: &[(&[u8], &str)] = &[
        (
            b"",
            "malformed control message: delta: key request of 0 bytes, expected 9",
        ),
        (
            b"\x01\x00",
            "malformed control message: delta: key request of 2 bytes, expected 9",
        ),
        (
            b"\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00",
            "malformed control message: delta: key request of 10 bytes, expected 9",
        ),
        (
            b"\x07\x00\x00\x00\x00\x00\x00\x00\x00",
            "malformed control message: delta: unknown control message type 7",
        ),
    ];
    for (bytes, want) in ctl {
        let mut src = Stack::build(Role::Source, "screen", &[&c]).unwrap();
        let e = src
            .handle_control(now, 0, Bytes::copy_from_slice(bytes))
            .unwrap_err();
        assert_eq!(e.error.to_string(), *want);
    }
}

/// Over a lossy datagram link (no jitter, so no reordering) with no scheduled key frames:
/// a spy below the source's delta layer records which frames went out as key frames.
/// Every key frame after the first answers a key request, and after every loss delivery
/// resumes exactly at a key frame.
#[test]
fn over_a_lossy_link_delivery_resumes_at_the_requested_key_frame() {
    let c = DeltaConfig {
        keyframe_interval: 0,
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let src = Stack::from_halves(
        Role::Source,
        "sim",
        vec![
            ("delta", c.forward().unwrap()),
            ("spy", Box::new(Spy(log.clone()))),
        ],
    );
    let sink = Stack::from_halves(
        Role::Sink,
        "sim",
        vec![("delta", c.inverse().unwrap()), ("spy", Box::new(PassHalf))],
    );
    let link = LinkConfig::datagram(Duration::from_millis(10), Duration::ZERO, 0.04);
    let mut p = Pipeline::with_stacks(src, sink, link, 42);
    let frames = slowly_changing(400, 1024, 9);
    for (i, f) in frames.iter().enumerate() {
        p.send_at(Duration::from_millis(5 * i as u64), f.clone());
    }
    p.run().unwrap();
    let delivered: BTreeSet<u64> = p.deliveries().iter().map(|d| d.meta.seq).collect();
    for d in p.deliveries() {
        assert_eq!(&d.payload[..], &frames[d.meta.seq as usize][..]);
    }
    let keys: BTreeSet<u64> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, kind)| *kind == KIND_KEY)
        .map(|(s, _)| *s)
        .collect();
    let lost = p.data_link().lost;
    let src_c = counters(&p.source_stats()[0].half.counters);
    let sink_st = &p.sink_stats()[0];
    let sink_c = counters(&sink_st.half.counters);
    assert!(lost >= 5, "the seed loses frames: {lost}");
    assert!(sink_c["key_requests"] >= 2);
    assert_eq!(src_c["key_requests"], sink_c["key_requests"]);
    assert_eq!(src_c["key_frames"] as usize, keys.len());
    assert!(keys.len() as u64 <= 1 + src_c["key_requests"], "{keys:?}");
    assert!(keys.len() >= 3);
    // Resumption: a delivered frame whose predecessor was not delivered is a key frame.
    for &s in &delivered {
        if s > 0 && !delivered.contains(&(s - 1)) {
            assert!(
                keys.contains(&s),
                "seq {s} resumed delivery but is no key frame"
            );
        }
    }
    // Every frame is accounted for: delivered, lost on the link, or dropped as unrebuildable.
    assert_eq!(
        delivered.len() as u64 + lost + sink_c["missing_reference"],
        frames.len() as u64
    );
    assert_eq!(sink_st.half.drops, sink_c["missing_reference"]);
    // A loss costs about one round trip (20 ms = 4 frames) of drops, not the rest of the stream.
    assert!(
        sink_c["missing_reference"] <= 6 * lost,
        "{} drops for {lost} losses",
        sink_c["missing_reference"]
    );
    eprintln!(
        "delta over 4% loss: {} sent, {lost} lost, {} dropped, {} delivered, {} key frames, {} requests",
        frames.len(),
        sink_c["missing_reference"],
        delivered.len(),
        keys.len(),
        src_c["key_requests"]
    );
}

#[test]
fn delta_above_compress_shrinks_slowly_changing_frames_drastically() {
    let frames = slowly_changing(120, 64 << 10, 5);
    let total = (frames.len() * (64 << 10)) as u64;
    let run = |pairs: &[&dyn ndd_core::Pair]| {
        let mut p = Pipeline::new(pairs, LinkConfig::default(), 3).unwrap();
        for (i, f) in frames.iter().enumerate() {
            p.send_at(Duration::from_millis(16 * i as u64), f.clone());
        }
        p.run().unwrap();
        assert_eq!(p.deliveries().len(), frames.len());
        for d in p.deliveries() {
            assert_eq!(&d.payload[..], &frames[d.meta.seq as usize][..]);
        }
        let st = p.source_stats();
        assert_eq!(st[0].bytes_in, total);
        st.last().unwrap().bytes_out
    };
    let delta = DeltaConfig::default();
    let compress = CompressConfig::default();
    let alone = run(&[&compress]);
    let stacked = run(&[&delta, &compress]);
    let (r_alone, r_stacked) = (alone as f64 / total as f64, stacked as f64 / total as f64);
    eprintln!(
        "120 × 64 KiB random frames, 4 bytes change per frame: compress alone {:.2}%, delta+compress {:.2}%",
        100.0 * r_alone,
        100.0 * r_stacked
    );
    assert!(r_alone > 0.99, "random data does not compress: {r_alone}");
    // Two key frames (seq 0 and 100) and 118 deltas of ~0.3 KiB each.
    assert!(r_stacked < 0.03, "{r_stacked}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Over a lossy, reordering, duplicating datagram link: every delivered frame is exactly
    /// the frame sent with that sequence number, meta included; every frame that arrived and
    /// was not delivered is counted.
    #[test]
    fn round_trip_over_a_lossy_reordering_link_never_rebuilds_wrong(
        n in 1usize..120,
        len in 0usize..300,
        resize_every in 5usize..60,
        interval in 0u32..40,
        loss in 0.0f64..0.2,
        seed in any::<u64>(),
    ) {
        let c = DeltaConfig { keyframe_interval: interval };
        let link = LinkConfig {
            duplicate: 0.05,
            ..LinkConfig::datagram(Duration::from_millis(5), Duration::from_millis(15), loss)
        };
        let mut p = Pipeline::new(&[&c], link, seed).unwrap();
        let mut frames = slowly_changing(n, len, seed);
        for (i, f) in frames.iter_mut().enumerate() {
            if (i / resize_every) % 2 == 1 {
                f.push(i as u8);
            }
        }
        for (i, f) in frames.iter().enumerate() {
            p.send_at(Duration::from_millis(4 * i as u64), f.clone());
        }
        p.run().unwrap();
        for d in p.deliveries() {
            let seq = d.meta.seq;
            prop_assert_eq!(&d.payload[..], &frames[seq as usize][..]);
            prop_assert_eq!(d.meta, Meta {
                stream: 1,
                seq,
                timestamp_ns: EPOCH_NS + 4_000_000 * seq,
                flags: 0,
            });
        }
        let sink = &p.sink_stats()[0];
        let sc = counters(&sink.half.counters);
        let link = p.data_link();
        prop_assert_eq!(sink.frames_in, n as u64 - link.lost + link.duplicated);
        prop_assert_eq!(p.deliveries().len() as u64, sink.frames_in - sc["missing_reference"]);
        prop_assert_eq!(sink.half.drops, sc["missing_reference"]);
        prop_assert_eq!(p.source_stats()[0].half.counters[2].1, sc["key_requests"]);
    }

    #[test]
    fn inverse_never_panics_on_garbage(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..24), 1..12)) {
        let mut inv = DeltaInverse::default();
        let mut out = Output::new();
        for (i, f) in frames.iter().enumerate() {
            let _ = inv.handle_frame(Instant::now(), Frame::new(meta(i as u64), f), &mut out);
        }
    }
}
