use super::*;
use ndd_core::{Frame, Meta, Output, Role, Stack};
use ndd_testkit::{LinkConfig, Pipeline, EPOCH_NS};
use proptest::prelude::*;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;

fn field(s: &str) -> Field {
    s.parse().expect("valid field")
}

fn fields(list: &[&str]) -> Vec<Field> {
    list.iter().map(|s| field(s)).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Combines `records` through the accumulator under test.
fn combine(list: &[&str], endian: Endian, records: &[Vec<u8>]) -> Vec<u8> {
    let mut acc = Accumulator::new(&fields(list), endian);
    for r in records {
        acc.add(r);
    }
    let mut out = vec![0xaa; acc.record_len()];
    assert!(acc.finish(&mut out));
    assert!(acc.is_empty(), "finish starts a new window");
    out
}

/// One-field windows: each value encoded big-endian by the caller's closure.
fn one<T: Copy>(spec: &str, values: &[T], enc: impl Fn(T) -> Vec<u8>) -> Vec<u8> {
    let recs: Vec<Vec<u8>> = values.iter().map(|&v| enc(v)).collect();
    combine(&[spec], Endian::Big, &recs)
}

fn i16s(spec: &str, v: &[i16]) -> i16 {
    let b = one(spec, v, |x| x.to_be_bytes().to_vec());
    i16::from_be_bytes([b[0], b[1]])
}

fn cfg_fields(list: &[&str], count: u32, window_ms: u64) -> AverageConfig {
    AverageConfig {
        fields: Some(fields(list)),
        count,
        window_ms,
        ..AverageConfig::default()
    }
}

fn spacenav(count: u32, window_ms: u64) -> AverageConfig {
    AverageConfig {
        preset: Some(Preset::Spacenav),
        count,
        window_ms,
        ..AverageConfig::default()
    }
}

/// The `spacenav-sim` wire record: six i16 axes then the u16 button mask, big-endian.
fn spacenav_record(axes: [i16; 6], buttons: u16) -> Vec<u8> {
    let mut v: Vec<u8> = axes.iter().flat_map(|a| a.to_be_bytes()).collect();
    v.extend_from_slice(&buttons.to_be_bytes());
    v
}

#[test]
fn field_text_parses_prints_and_rejects_with_clear_messages() {
    for ty in ["u8", "i8", "u16", "i16", "u32", "i32", "f32", "f64"] {
        for mode in ["avg", "sum", "last", "or", "max", "min"] {
            let s = format!("{ty}:{mode}");
            match s.parse::<Field>() {
                Ok(f) => assert_eq!(f.to_string(), s),
                Err(e) => {
                    assert!(ty.starts_with('f') && mode == "or", "{s}: {e}");
                    assert_eq!(
                        e.to_string(),
                        format!("average: field \"{s}\": mode \"or\" needs an integer type")
                    );
                }
            }
        }
    }
    assert_eq!(
        field("i16:avg"),
        Field::new(FieldType::I16, Mode::Avg),
        "i16:avg"
    );
    let cases = [
        ("i16", "average: field \"i16\" must be TYPE:MODE, e.g. \"i16:avg\""),
        (
            "i17:avg",
            "average: field \"i17:avg\": unknown type \"i17\" (allowed: u8, i8, u16, i16, u32, i32, f32, f64)",
        ),
        (
            "i16:mean",
            "average: field \"i16:mean\": unknown mode \"mean\" (allowed: avg, sum, last, or, max, min)",
        ),
    ];
    for (s, want) in cases {
        assert_eq!(s.parse::<Field>().unwrap_err().to_string(), want);
    }
}

#[test]
fn mean_rounds_to_nearest_ties_away_from_zero() {
    assert_eq!(i16s("i16:avg", &[1, 2]), 2, "1.5");
    assert_eq!(i16s("i16:avg", &[-1, -2]), -2, "-1.5");
    assert_eq!(i16s("i16:avg", &[1, 2, 2]), 2, "1.67");
    assert_eq!(i16s("i16:avg", &[1, 1, 2]), 1, "1.33");
    assert_eq!(i16s("i16:avg", &[-1, -1, -2]), -1, "-1.33");
    assert_eq!(i16s("i16:avg", &[-3, 4]), 1, "0.5");
    assert_eq!(i16s("i16:avg", &[3, -4]), -1, "-0.5");
    assert_eq!(i16s("i16:avg", &[32767, 32767, 32766]), 32767, "32766.67");
    assert_eq!(i16s("i16:avg", &[-32768, -32768]), -32768);
    assert_eq!(i16s("i16:avg", &[7]), 7, "one record");
    assert_eq!(one("u8:avg", &[255u8, 255, 254, 254], |x| vec![x]), [255]);
    assert_eq!(one("u8:avg", &[0u8, 1], |x| vec![x]), [1]);
    // u32 values are unsigned, not -1.
    let b = one("u32:avg", &[u32::MAX, u32::MAX - 2], |x| {
        x.to_be_bytes().to_vec()
    });
    assert_eq!(u32::from_be_bytes([b[0], b[1], b[2], b[3]]), u32::MAX - 1);
    let b = one("i32:avg", &[i32::MIN, i32::MIN + 1], |x| {
        x.to_be_bytes().to_vec()
    });
    // −2147483647.5 rounds away from zero.
    assert_eq!(i32::from_be_bytes([b[0], b[1], b[2], b[3]]), i32::MIN);
}

#[test]
fn sum_is_exact_then_saturates() {
    assert_eq!(i16s("i16:sum", &[3, -5, 10]), 8);
    assert_eq!(one("i8:sum", &[100i8, 100], |x| vec![x as u8]), [127]);
    assert_eq!(
        one("i8:sum", &[-100i8, -100], |x| vec![x as u8]),
        [(-128i8) as u8]
    );
    // Exact sum, then clamp: not clamped step by step.
    assert_eq!(one("i8:sum", &[100i8, 100, -100], |x| vec![x as u8]), [100]);
    assert_eq!(
        one("u16:sum", &[60000u16, 60000], |x| x.to_be_bytes().to_vec()),
        [0xff, 0xff]
    );
    assert_eq!(
        one("u32:sum", &[u32::MAX, u32::MAX], |x| x
            .to_be_bytes()
            .to_vec()),
        [0xff; 4]
    );
    assert_eq!(
        one("i32:sum", &[i32::MIN, -1], |x| x.to_be_bytes().to_vec()),
        i32::MIN.to_be_bytes()
    );
}

#[test]
fn or_last_max_min_are_exact() {
    assert_eq!(one("u8:or", &[0x01u8, 0x04, 0x80], |x| vec![x]), [0x85]);
    assert_eq!(one("i8:or", &[0x80u8, 0x01], |x| vec![x]), [0x81]);
    assert_eq!(
        one("u16:or", &[0x8000u16, 0x0001, 0], |x| x
            .to_be_bytes()
            .to_vec()),
        [0x80, 0x01]
    );
    assert_eq!(
        one("u16:last", &[1u16, 2, 3], |x| x.to_be_bytes().to_vec()),
        [0, 3]
    );
    // `last` copies the bytes: a NaN payload survives.
    let nan = 0x7fc0_1234u32;
    assert_eq!(
        one("f32:last", &[0u32, nan], |x| x.to_be_bytes().to_vec()),
        nan.to_be_bytes()
    );
    let i32s = |spec: &str| {
        let b = one(spec, &[-5i32, 3, -7], |x| x.to_be_bytes().to_vec());
        i32::from_be_bytes([b[0], b[1], b[2], b[3]])
    };
    assert_eq!(i32s("i32:max"), 3);
    assert_eq!(i32s("i32:min"), -7);
    assert_eq!(
        one("u32:max", &[u32::MAX, 0], |x| x.to_be_bytes().to_vec()),
        [0xff; 4],
        "unsigned, not -1"
    );
    assert_eq!(one("i8:min", &[-1i8, 5], |x| vec![x as u8]), [0xff]);
}

#[test]
fn floats_combine_in_f64_and_round_to_the_field_type() {
    let f32s = |spec: &str, v: &[f32]| {
        let b = one(spec, v, |x| x.to_be_bytes().to_vec());
        f32::from_be_bytes([b[0], b[1], b[2], b[3]])
    };
    assert_eq!(f32s("f32:avg", &[1.0, 2.0]), 1.5);
    assert_eq!(f32s("f32:sum", &[0.5, 0.25, -1.0]), -0.25);
    assert_eq!(f32s("f32:sum", &[3e38, 3e38]), f32::INFINITY);
    assert_eq!(f32s("f32:min", &[1.0, f32::NAN, -2.0]), -2.0, "NaN skipped");
    assert_eq!(f32s("f32:max", &[1.0, f32::NAN, -2.0]), 1.0);
    assert!(f32s("f32:avg", &[1.0, f32::NAN]).is_nan());
    let b = one("f64:avg", &[0.1f64, 0.2, 0.3], |x| x.to_be_bytes().to_vec());
    let mut a = [0u8; 8];
    a.copy_from_slice(&b);
    assert_eq!(f64::from_be_bytes(a), (0.1 + 0.2 + 0.3) / 3.0);
}

#[test]
fn little_endian_and_multi_field_records() {
    // u16 LE 0x0100 and 0x0300 average to 0x0200.
    assert_eq!(
        combine(&["u16:avg"], Endian::Little, &[vec![0, 1], vec![0, 3]]),
        [0, 2]
    );
    // [i16:avg, u8:or, i8:sum] big-endian: (258, 0x01, 127) and (-2, 0x10, 5)
    // → (128, 0x11, 132 clamped to 127).
    let out = combine(
        &["i16:avg", "u8:or", "i8:sum"],
        Endian::Big,
        &[vec![0x01, 0x02, 0x01, 0x7f], vec![0xff, 0xfe, 0x10, 0x05]],
    );
    assert_eq!(hex(&out), "0080117f");
}

#[test]
fn spacenav_window_matches_the_documented_test_vector() {
    let recs = [
        spacenav_record([10, -10, 100, 0, 1, -1], 0x0000),
        spacenav_record([11, -11, 101, 0, 2, -2], 0x0001),
        spacenav_record([12, -12, 102, 1, 2, -2], 0x0000),
        spacenav_record([13, -13, 103, 1, 2, -3], 0x0002),
    ];
    let ins: Vec<String> = recs.iter().map(|r| hex(r)).collect();
    assert_eq!(
        ins,
        [
            "000afff600640000 0001ffff0000".replace(' ', ""),
            "000bfff500650000 0002fffe0001".replace(' ', ""),
            "000cfff400660001 0002fffe0000".replace(' ', ""),
            "000dfff300670001 0002fffd0002".replace(' ', ""),
        ]
    );
    let names: Vec<String> = Preset::Spacenav
        .fields()
        .iter()
        .map(|f| f.to_string())
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // Means 11.5 -11.5 101.5 0.5 1.75 -2 → 12 -12 102 1 2 -2; buttons 0|1|0|2 = 3.
    assert_eq!(
        hex(&combine(&names, Endian::Big, &recs)),
        "000cfff400660001 0002fffe0003".replace(' ', "")
    );
    // Through the forward half: four 14-byte frames in, one out, with the last one's meta.
    let mut fwd = spacenav(4, 0).forward().unwrap();
    let mut out = Output::new();
    let now = Instant::now();
    for (i, r) in recs.iter().enumerate() {
        let m = Meta {
            stream: 1,
            seq: 10 + i as u64,
            timestamp_ns: 1000 + i as u64,
            flags: i as u16,
        };
        fwd.handle_frame(now, Frame::new(m, r), &mut out).unwrap();
    }
    let got = out.take_frames();
    assert_eq!(got.len(), 1);
    assert_eq!(hex(got[0].payload()), "000cfff4006600010002fffe0003");
    assert_eq!(
        got[0].meta,
        Meta {
            stream: 1,
            seq: 13,
            timestamp_ns: 1003,
            flags: 3
        }
    );
}

#[test]
fn config_parses_validates_and_describes_presets_as_their_fields() {
    let parse = |s: &str| toml::from_str::<AverageConfig>(s).map_err(|e| e.to_string());
    let d = AverageConfig::default();
    d.validate().expect("defaults are valid");
    let explicit = parse(
        r#"fields = ["i16:avg", "i16:avg", "i16:avg", "i16:avg", "i16:avg", "i16:avg", "u16:or"]
           endian = "big"
           count = 4
           window_ms = 0"#,
    )
    .unwrap();
    let preset = parse(r#"preset = "spacenav""#).unwrap();
    let want = "average(fields=[i16:avg, i16:avg, i16:avg, i16:avg, i16:avg, i16:avg, u16:or], endian=big, count=4, window_ms=0)";
    for c in [&d, &explicit, &preset] {
        assert_eq!(c.describe(), want);
    }
    assert_eq!(
        ndd_wire::param_hash(&preset.describe()),
        ndd_wire::param_hash(&explicit.describe())
    );
    let mouse = parse(
        r#"preset = "rel-mouse"
                         count = 0
                         window_ms = 8"#,
    )
    .unwrap();
    mouse.validate().unwrap();
    assert_eq!(
        mouse.describe(),
        "average(fields=[i16:sum, i16:sum, i8:sum, u8:or], endian=big, count=0, window_ms=8)"
    );
    assert_eq!(
        Accumulator::new(&mouse.layout(), Endian::Big).record_len(),
        6
    );

    let both = parse(
        r#"preset = "spacenav"
                        fields = ["u8:or"]"#,
    )
    .unwrap();
    assert_eq!(
        both.validate().unwrap_err().to_string(),
        "average: preset = \"spacenav\" and fields are mutually exclusive; give one"
    );
    assert_eq!(
        both.forward().err(),
        Some(ModuleError::from(both.validate().unwrap_err()))
    );
    let errs = [
        (r#"fields = []"#, "average: fields lists 0 fields; allowed 1..=256"),
        (r#"count = 65536"#, "average: count = 65536 is out of range 0..=65535"),
        (
            r#"window_ms = 60001"#,
            "average: window_ms = 60001 is out of range 0..=60000",
        ),
        (
            r#"count = 0"#,
            "average: count and window_ms are both 0; set count (1..=65535) or window_ms (1..=60000)",
        ),
    ];
    for (s, want) in errs {
        assert_eq!(
            parse(s).unwrap().validate().unwrap_err().to_string(),
            want,
            "{s}"
        );
    }
    let e = parse(r#"fields = ["i16:mean"]"#).unwrap_err();
    assert!(e.contains("unknown mode \"mean\""), "{e}");
    let e = parse(r#"preset = "joystick""#).unwrap_err();
    assert!(e.contains("unknown variant `joystick`"), "{e}");
    let e = parse(r#"endian = "middle""#).unwrap_err();
    assert!(e.contains("unknown variant `middle`"), "{e}");
    let e = parse(r#"cuont = 4"#).unwrap_err();
    assert!(e.contains("unknown field `cuont`"), "{e}");
    // Built in code, `or` on a float is caught by validate.
    let c = AverageConfig {
        fields: Some(vec![Field::new(FieldType::F32, Mode::Or)]),
        ..AverageConfig::default()
    };
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "average: field \"f32:or\": mode \"or\" needs an integer type"
    );
    assert_eq!(INFO.id, 7);
    let names: Vec<&str> = INFO.params.iter().map(|p| p.name).collect();
    assert_eq!(names, ["preset", "fields", "endian", "count", "window_ms"]);
}

#[test]
fn a_frame_that_is_not_whole_records_fails_the_stream_naming_the_expected_length() {
    let mut src = Stack::build(Role::Source, "s", &[&spacenav(4, 0)]).unwrap();
    let now = Instant::now();
    let m = Meta::default();
    src.handle_frame(now, Frame::new(m, &[0; 28]))
        .expect("two whole records");
    let layout = "i16:avg, i16:avg, i16:avg, i16:avg, i16:avg, i16:avg, u16:or";
    for len in [13usize, 15, 0] {
        let e = src
            .handle_frame(now, Frame::new(m, &vec![0; len]))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "stream \"s\" layer 0 (average, source side): malformed frame: average: frame of \
                 {len} bytes is not a whole number of 14-byte records (expected 14, 28, … bytes \
                 for layout [{layout}])"
            )
        );
    }
    let st = &src.stats()[0].half;
    assert_eq!(st.counters, vec![("records_in", 2), ("records_out", 0)]);
}

#[test]
fn control_messages_are_refused_by_both_halves() {
    let c = spacenav(4, 0);
    let now = Instant::now();
    let want = ModuleError::from(ControlError::NoControl {
        pair: Some("average"),
        len: Some(3),
    });
    for mut h in [c.forward().unwrap(), c.inverse().unwrap()] {
        let e = h
            .handle_control(now, bytes::Bytes::from_static(b"abc"), &mut Output::new())
            .unwrap_err();
        assert_eq!(e, want);
    }
}

#[test]
fn several_records_per_frame_stay_in_one_window() {
    // count 4, frames of 3 records: a window closes at the end of the frame that reaches 4.
    let mut fwd = cfg_fields(&["u8:sum"], 4, 0).forward().unwrap();
    let mut out = Output::new();
    let now = Instant::now();
    for (seq, recs) in [[1u8, 2, 3], [4, 5, 6], [7, 8, 9]].iter().enumerate() {
        let m = Meta {
            seq: seq as u64,
            ..Meta::default()
        };
        fwd.handle_frame(now, Frame::new(m, recs), &mut out)
            .unwrap();
    }
    fwd.flush(&mut out);
    let got: Vec<(u64, Vec<u8>)> = out
        .take_frames()
        .into_iter()
        .map(|f| (f.meta.seq, f.payload().to_vec()))
        .collect();
    assert_eq!(got, vec![(1, vec![21]), (2, vec![24])]);
    assert_eq!(
        fwd.stats().counters,
        vec![("records_in", 9), ("records_out", 2)]
    );
}

#[test]
fn windows_close_by_time_in_virtual_time() {
    // 16 ms frames, 50 ms windows, no count: frames 0,16,32,48 close at 50 ms; the next window
    // opens at 64 ms and closes at 114 ms, and so on.
    let c = cfg_fields(&["u16:last", "u8:sum"], 0, 50);
    let mut p = Pipeline::new(
        &[&c],
        LinkConfig::tcp(Duration::from_millis(1), Duration::ZERO),
        7,
    )
    .unwrap();
    for i in 0..16u64 {
        p.send_at(Duration::from_millis(16 * i), vec![0, i as u8, 1]);
    }
    p.finish().unwrap();
    let got: Vec<(u64, u64, Vec<u8>, Duration)> = p
        .deliveries()
        .iter()
        .map(|d| {
            (
                d.meta.seq,
                d.meta.timestamp_ns - EPOCH_NS,
                d.payload.to_vec(),
                d.released,
            )
        })
        .collect();
    let ms = Duration::from_millis;
    assert_eq!(
        got,
        vec![
            (3, 48 * MS, vec![0, 3, 4], ms(51)),
            (7, 112 * MS, vec![0, 7, 4], ms(115)),
            (11, 176 * MS, vec![0, 11, 4], ms(179)),
            (15, 240 * MS, vec![0, 15, 4], ms(243)),
        ]
    );
    let st = &p.source_stats()[0].half;
    assert_eq!(st.counters, vec![("records_in", 16), ("records_out", 4)]);
}

#[test]
fn a_frame_at_the_deadline_opens_the_next_window_and_count_wins_when_first() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let m = |seq: u64| Meta {
        seq,
        ..Meta::default()
    };
    let mut fwd = cfg_fields(&["u8:sum"], 3, 50).forward().unwrap();
    let mut out = Output::new();
    fwd.handle_frame(at(0), Frame::new(m(0), &[1]), &mut out)
        .unwrap();
    assert_eq!(fwd.poll_timeout(), Some(at(50)));
    fwd.handle_frame(at(10), Frame::new(m(1), &[2]), &mut out)
        .unwrap();
    // Arrives exactly at the deadline, before the timer ran: the old window closes first.
    fwd.handle_frame(at(50), Frame::new(m(2), &[4]), &mut out)
        .unwrap();
    let f = out.take_frames();
    assert_eq!((f.len(), f[0].meta.seq, f[0].payload()), (1, 1, &[3u8][..]));
    assert_eq!(fwd.poll_timeout(), Some(at(100)));
    // count reached before the deadline.
    fwd.handle_frame(at(60), Frame::new(m(3), &[8]), &mut out)
        .unwrap();
    fwd.handle_frame(at(70), Frame::new(m(4), &[16]), &mut out)
        .unwrap();
    let f = out.take_frames();
    assert_eq!(
        (f.len(), f[0].meta.seq, f[0].payload()),
        (1, 4, &[28u8][..])
    );
    assert_eq!(fwd.poll_timeout(), None);
    fwd.handle_timeout(at(1000), &mut out);
    fwd.flush(&mut out);
    assert!(out.take_frames().is_empty(), "nothing held");
}

/// A little 62.5 Hz six-axis motion with a button held now and then, encoded as the
/// `spacenav-sim` endpoint does (not the endpoint's own generator: this crate does not depend
/// on it).
fn sim_record(i: u64) -> Vec<u8> {
    let t = i as f64 / 62.5;
    let mut axes = [0i16; 6];
    for (k, a) in axes.iter_mut().enumerate() {
        let v = 200.0 * (0.3 * (k as f64 + 1.0) * t).sin() + 80.0 * (1.7 * t + k as f64).cos();
        *a = v.round().clamp(-350.0, 350.0) as i16;
    }
    spacenav_record(axes, u16::from(i % 23 < 3))
}

#[test]
fn spacenav_preset_on_simulated_3d_mouse_records_over_a_link() {
    let c = spacenav(4, 0);
    let mut p = Pipeline::new(
        &[&c],
        LinkConfig::tcp(Duration::from_millis(2), Duration::from_millis(5)),
        11,
    )
    .unwrap();
    let recs: Vec<Vec<u8>> = (0..100).map(sim_record).collect();
    for (i, r) in recs.iter().enumerate() {
        p.send_at(Duration::from_millis(16 * i as u64), r.clone());
    }
    p.finish().unwrap();
    let d = p.deliveries();
    assert_eq!(d.len(), 25);
    for (k, got) in d.iter().enumerate() {
        let win = &recs[4 * k..4 * k + 4];
        let mut want = Vec::new();
        for axis in 0..6 {
            let s: i32 = win
                .iter()
                .map(|r| i32::from(i16::from_be_bytes([r[2 * axis], r[2 * axis + 1]])))
                .sum();
            want.extend_from_slice(&(ref_mean(i128::from(s), 4) as i16).to_be_bytes());
        }
        let buttons = win
            .iter()
            .fold(0u16, |a, r| a | u16::from_be_bytes([r[12], r[13]]));
        want.extend_from_slice(&buttons.to_be_bytes());
        assert_eq!(&got.payload[..], &want[..], "window {k}");
        assert_eq!(got.meta.seq, 4 * k as u64 + 3);
        assert_eq!(
            got.meta.timestamp_ns,
            EPOCH_NS + (4 * k as u64 + 3) * 16 * MS
        );
    }
    assert!(d.iter().any(|x| x.payload[13] & 1 == 1), "a press survives");
    let st = &p.source_stats()[0].half;
    assert_eq!(st.counters, vec![("records_in", 100), ("records_out", 25)]);
}

// ---- Reference implementation for the property test, written independently of layout.rs.

/// Mean of integers rounded half away from zero: (2s ± n) / 2n, truncating.
fn ref_mean(s: i128, n: i128) -> i128 {
    if s >= 0 {
        (2 * s + n) / (2 * n)
    } else {
        -((-2 * s + n) / (2 * n))
    }
}

#[derive(Debug, Clone, Copy)]
enum RefVal {
    I(i128),
    F(f64),
}

fn ref_decode(ty: &str, b: &[u8], big: bool) -> RefVal {
    macro_rules! get {
        ($t:ty, $n:expr) => {{
            let mut a = [0u8; $n];
            a.copy_from_slice(b);
            if big {
                <$t>::from_be_bytes(a)
            } else {
                <$t>::from_le_bytes(a)
            }
        }};
    }
    match ty {
        "u8" => RefVal::I(i128::from(b[0])),
        "i8" => RefVal::I(i128::from(b[0] as i8)),
        "u16" => RefVal::I(i128::from(get!(u16, 2))),
        "i16" => RefVal::I(i128::from(get!(i16, 2))),
        "u32" => RefVal::I(i128::from(get!(u32, 4))),
        "i32" => RefVal::I(i128::from(get!(i32, 4))),
        "f32" => RefVal::F(f64::from(get!(f32, 4))),
        _ => RefVal::F(get!(f64, 8)),
    }
}

fn ref_encode(ty: &str, v: RefVal, big: bool) -> Vec<u8> {
    macro_rules! put {
        ($x:expr) => {
            if big {
                $x.to_be_bytes().to_vec()
            } else {
                $x.to_le_bytes().to_vec()
            }
        };
    }
    let clamp = |v: i128, lo: i128, hi: i128| v.max(lo).min(hi);
    match (ty, v) {
        ("u8", RefVal::I(v)) => vec![clamp(v, 0, 255) as u8],
        ("i8", RefVal::I(v)) => vec![clamp(v, -128, 127) as i8 as u8],
        ("u16", RefVal::I(v)) => put!(clamp(v, 0, 65535) as u16),
        ("i16", RefVal::I(v)) => put!(clamp(v, -32768, 32767) as i16),
        ("u32", RefVal::I(v)) => put!(clamp(v, 0, u32::MAX.into()) as u32),
        ("i32", RefVal::I(v)) => put!(clamp(v, i32::MIN.into(), i32::MAX.into()) as i32),
        ("f32", RefVal::F(v)) => put!(v as f32),
        (_, RefVal::F(v)) => put!(v),
        _ => unreachable!("reference: type and value disagree"),
    }
}

fn size_of(ty: &str) -> usize {
    match ty {
        "u8" | "i8" => 1,
        "u16" | "i16" => 2,
        "f64" => 8,
        _ => 4,
    }
}

/// The combined record of a window, field by field.
fn ref_window(spec: &[(&str, &str)], big: bool, records: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut off = 0;
    for &(ty, mode) in spec {
        let n = size_of(ty);
        let raw: Vec<&[u8]> = records.iter().map(|r| &r[off..off + n]).collect();
        off += n;
        match mode {
            "last" => out.extend_from_slice(raw[raw.len() - 1]),
            "or" => {
                let mut acc = vec![0u8; n];
                for r in &raw {
                    for (a, b) in acc.iter_mut().zip(r.iter()) {
                        *a |= b;
                    }
                }
                out.extend_from_slice(&acc);
            }
            _ => {
                let vals: Vec<RefVal> = raw.iter().map(|r| ref_decode(ty, r, big)).collect();
                let v = match (mode, vals[0]) {
                    ("sum" | "avg", RefVal::I(_)) => {
                        let s: i128 = vals
                            .iter()
                            .map(|v| match v {
                                RefVal::I(i) => *i,
                                RefVal::F(_) => 0,
                            })
                            .sum();
                        RefVal::I(if mode == "avg" {
                            ref_mean(s, vals.len() as i128)
                        } else {
                            s
                        })
                    }
                    ("sum" | "avg", RefVal::F(_)) => {
                        let s: f64 = vals
                            .iter()
                            .map(|v| match v {
                                RefVal::F(f) => *f,
                                RefVal::I(_) => 0.0,
                            })
                            .sum();
                        RefVal::F(if mode == "avg" {
                            s / vals.len() as f64
                        } else {
                            s
                        })
                    }
                    (_, RefVal::I(_)) => {
                        let it = vals.iter().map(|v| match v {
                            RefVal::I(i) => *i,
                            RefVal::F(_) => 0,
                        });
                        RefVal::I(if mode == "max" {
                            it.max().unwrap_or(0)
                        } else {
                            it.min().unwrap_or(0)
                        })
                    }
                    (_, RefVal::F(_)) => {
                        let fs: Vec<f64> = vals
                            .iter()
                            .map(|v| match v {
                                RefVal::F(f) => *f,
                                RefVal::I(_) => 0.0,
                            })
                            .collect();
                        let best = fs.iter().copied().fold(fs[0], |a, b| {
                            if (mode == "max") == (b > a) {
                                b
                            } else {
                                a
                            }
                        });
                        RefVal::F(best)
                    }
                };
                out.extend_from_slice(&ref_encode(ty, v, big));
            }
        }
    }
    out
}

/// Frames sent (time ms, payload) → the (seq, timestamp, payload) the sink must get.
fn ref_stream(
    spec: &[(&str, &str)],
    big: bool,
    count: u64,
    window_ms: u64,
    sent: &[(u64, Vec<u8>)],
) -> Vec<(u64, u64, Vec<u8>)> {
    let rec: usize = spec.iter().map(|(t, _)| size_of(t)).sum();
    let mut out = Vec::new();
    let mut win: Vec<usize> = Vec::new();
    let mut start = 0;
    let close = |win: &mut Vec<usize>, out: &mut Vec<(u64, u64, Vec<u8>)>| {
        let Some(&last) = win.last() else { return };
        let records: Vec<&[u8]> = win.iter().flat_map(|&i| sent[i].1.chunks(rec)).collect();
        out.push((
            last as u64,
            EPOCH_NS + sent[last].0 * MS,
            ref_window(spec, big, &records),
        ));
        win.clear();
    };
    for (i, (at, _)) in sent.iter().enumerate() {
        if !win.is_empty() && window_ms > 0 && *at >= start + window_ms {
            close(&mut win, &mut out);
        }
        if win.is_empty() {
            start = *at;
        }
        win.push(i);
        let held: usize = win.iter().map(|&j| sent[j].1.len() / rec).sum();
        if count > 0 && held as u64 >= count {
            close(&mut win, &mut out);
        }
    }
    close(&mut win, &mut out);
    out
}

const SPECS: &[(&str, &str)] = &[
    ("u8", "avg"),
    ("i8", "sum"),
    ("u16", "or"),
    ("i16", "avg"),
    ("u32", "max"),
    ("i32", "min"),
    ("i16", "last"),
    ("f32", "avg"),
    ("f64", "sum"),
    ("f32", "max"),
    ("f64", "min"),
    ("u8", "or"),
    ("i8", "avg"),
    ("u16", "sum"),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn sink_receives_exactly_the_reference_average(
        layout in proptest::collection::vec(0..SPECS.len(), 1..5),
        big in any::<bool>(),
        count in 0u32..6,
        window_ms in 0u64..40,
        frames in proptest::collection::vec((0u64..20, 1usize..4, any::<u64>()), 1..40),
        lossy in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let window_ms = if count == 0 && window_ms == 0 { 16 } else { window_ms };
        let spec: Vec<(&str, &str)> = layout.iter().map(|&i| SPECS[i]).collect();
        let names: Vec<String> = spec.iter().map(|(t, m)| format!("{t}:{m}")).collect();
        let c = AverageConfig {
            fields: Some(names.iter().map(|s| field(s)).collect()),
            endian: if big { Endian::Big } else { Endian::Little },
            count,
            window_ms,
            ..AverageConfig::default()
        };
        // Records with arbitrary integer bits; floats hold small integers (exact sums).
        let mut rng = ndd_testkit::SimRng::new(seed);
        let mut sent: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut at = 0;
        for &(gap, nrec, _) in &frames {
            at += gap;
            let mut payload = Vec::new();
            for _ in 0..nrec {
                for (ty, _) in &spec {
                    let v = rng.next_u64();
                    let small = (v % 2001) as f64 - 1000.0;
                    let b = match *ty {
                        "f32" => ref_encode("f32", RefVal::F(small), big),
                        "f64" => ref_encode("f64", RefVal::F(small), big),
                        t => v.to_le_bytes()[..size_of(t)].to_vec(),
                    };
                    payload.extend_from_slice(&b);
                }
            }
            sent.push((at, payload));
        }
        let want = ref_stream(&spec, big, u64::from(count), window_ms, &sent);
        let link = LinkConfig {
            loss: if lossy { 0.3 } else { 0.0 },
            ..LinkConfig::tcp(Duration::from_millis(3), Duration::from_millis(4))
        };
        let mut p = Pipeline::new(&[&c], link, seed).unwrap();
        for (at, payload) in &sent {
            p.send_at(Duration::from_millis(*at), payload.clone());
        }
        p.finish().unwrap();
        let got: Vec<(u64, u64, Vec<u8>)> = p
            .deliveries()
            .iter()
            .map(|d| (d.meta.seq, d.meta.timestamp_ns, d.payload.to_vec()))
            .collect();
        prop_assert!(p.deliveries().iter().all(|d| d.meta.stream == 1 && d.meta.flags == 0));
        if lossy {
            // Every delivered frame is the reference frame of its seq, in order.
            let mut it = want.iter();
            for g in &got {
                prop_assert!(it.any(|w| w == g), "{:?} not in order in {:?}", g, want);
            }
        } else {
            prop_assert_eq!(got, want);
        }
    }
}

#[test]
fn parses_inside_a_stack_as_the_registry_will_read_it() {
    // The registry's `ModuleConfig` is an internally tagged enum; fields must parse there too.
    #[derive(Debug, serde::Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum M {
        Average(AverageConfig),
    }
    #[derive(Debug, serde::Deserialize)]
    struct Doc {
        stack: Vec<M>,
    }
    let d: Doc = toml::from_str(
        r#"stack = [
             { type = "average", preset = "spacenav", count = 4 },
             { type = "average", fields = ["i16:sum", "i16:sum", "i8:sum", "u8:or"], endian = "little", count = 0, window_ms = 8 },
           ]"#,
    )
    .unwrap();
    let M::Average(a) = &d.stack[0];
    assert_eq!(a, &spacenav(4, 0));
    let M::Average(b) = &d.stack[1];
    assert_eq!(
        b.describe(),
        "average(fields=[i16:sum, i16:sum, i8:sum, u8:or], endian=little, count=0, window_ms=8)"
    );
    let e = toml::from_str::<Doc>(r#"stack = [{ type = "average", fields = ["f64:or"] }]"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("average: field \"f64:or\": mode \"or\" needs an integer type"),
        "{e}"
    );
}
