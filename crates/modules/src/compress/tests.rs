use super::format::{Header, METHOD_LZ4, METHOD_STORED, METHOD_ZSTD};
use super::*;
use ndd_core::frame::copies_on_this_thread;
use ndd_core::{Frame, Meta, Output, Role, Stack};
use ndd_testkit::{LinkConfig, Pipeline, SimRng, EPOCH_NS};
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn meta(seq: u64) -> Meta {
    Meta {
        stream: 4,
        seq,
        timestamp_ns: 5_000 + seq,
        flags: 0x8001,
    }
}

fn cfg(codec: Codec) -> CompressConfig {
    CompressConfig {
        codec,
        ..CompressConfig::default()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn forward_one(c: &CompressConfig, payload: &[u8]) -> Frame {
    let mut fwd = c.forward().unwrap();
    let mut out = Output::new();
    fwd.handle_frame(Instant::now(), Frame::new(meta(1), payload), &mut out)
        .unwrap();
    let mut v = out.take_frames();
    assert_eq!(v.len(), 1);
    v.pop().unwrap()
}

fn inverse_one(c: &CompressConfig, wire: &[u8]) -> Result<Frame, ModuleError> {
    let mut inv = c.inverse().unwrap();
    let mut out = Output::new();
    inv.handle_frame(
        Instant::now(),
        Frame::from_bytes(meta(1), bytes::Bytes::copy_from_slice(wire)),
        &mut out,
    )?;
    Ok(out.take_frames().pop().unwrap())
}

fn text(n: usize) -> Vec<u8> {
    b"The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. "
        .iter()
        .copied()
        .cycle()
        .take(n)
        .collect()
}

/// A 128×96 RGBA "screen": a desktop colour, a window with a title bar and some text-like
/// noise in a few rows, as a remote display frame looks.
fn screen() -> Vec<u8> {
    let (w, h) = (128usize, 96usize);
    let mut rng = SimRng::new(7);
    let mut px = vec![0u8; w * h * 4];
    for y in 0..h {
        for x in 0..w {
            let c: [u8; 4] = if (20..80).contains(&y) && (16..112).contains(&x) {
                if y < 28 {
                    [0x20, 0x40, 0xa0, 0xff]
                } else if y % 8 == 3 && x % 5 != 0 {
                    [rng.next_u64() as u8 & 0x1f, 0, 0, 0xff]
                } else {
                    [0xf0, 0xf0, 0xf0, 0xff]
                }
            } else {
                [0x3a, 0x6e, 0xa5, 0xff]
            };
            px[(y * w + x) * 4..(y * w + x + 1) * 4].copy_from_slice(&c);
        }
    }
    px
}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0; n];
    SimRng::new(seed).fill(&mut v);
    v
}

#[test]
fn describe_lists_every_parameter_in_order() {
    assert_eq!(
        CompressConfig::default().describe(),
        "compress(codec=lz4, level=3, min_size=64, max_size=67108864)"
    );
    let z = CompressConfig {
        codec: Codec::Zstd,
        level: 19,
        min_size: 0,
        max_size: 1024,
    };
    assert_eq!(
        z.describe(),
        "compress(codec=zstd, level=19, min_size=0, max_size=1024)"
    );
    let names: Vec<&str> = INFO.params.iter().map(|p| p.name).collect();
    assert_eq!(names, ["codec", "level", "min_size", "max_size"]);
    assert_eq!(INFO.id, 4);
}

#[test]
fn config_parses_and_validation_names_the_parameter() {
    let c: CompressConfig = toml::from_str(r#"codec = "zstd""#).unwrap();
    assert_eq!(c, cfg(Codec::Zstd));
    let e = toml::from_str::<CompressConfig>(r#"codec = "gzip""#).unwrap_err();
    assert!(e.to_string().contains("unknown variant `gzip`"), "{e}");
    let e = toml::from_str::<CompressConfig>("levle = 3").unwrap_err();
    assert!(e.to_string().contains("unknown field `levle`"), "{e}");
    let bad = [
        (
            CompressConfig {
                level: 0,
                ..Default::default()
            },
            "compress: level = 0 is out of range 1..=19",
        ),
        (
            CompressConfig {
                level: 20,
                ..Default::default()
            },
            "compress: level = 20 is out of range 1..=19",
        ),
        (
            CompressConfig {
                min_size: (1 << 30) + 1,
                ..Default::default()
            },
            "compress: min_size = 1073741825 is out of range 0..=1073741824",
        ),
        (
            CompressConfig {
                max_size: 63,
                ..Default::default()
            },
            "compress: max_size = 63 is out of range 64..=1073741824",
        ),
    ];
    for (c, want) in bad {
        assert_eq!(c.validate().unwrap_err().to_string(), want);
        assert_eq!(
            c.forward().err(),
            Some(ModuleError::from(c.validate().unwrap_err()))
        );
        assert_eq!(
            c.inverse().err(),
            Some(ModuleError::from(c.validate().unwrap_err()))
        );
    }
}

#[test]
fn header_vectors() {
    // Stored: method 0, then the payload as is.
    let f = forward_one(&CompressConfig::default(), b"abc");
    assert_eq!(hex(f.payload()), "00616263");
    // LZ4: method 1, original length 100 (u32 BE), then one lz4_flex block: token 0x1f
    // (1 literal, match length 15 + more), literal 'a', offset 0x0001 (LE), extra match length
    // 0x4a (4 + 15 + 74 = 93 bytes), token 0x60 (6 final literals), 'a' × 6.
    let f = forward_one(&CompressConfig::default(), &[b'a'; 100]);
    assert_eq!(hex(f.payload()), "01000000641f6101004a60616161616161");
    assert_eq!(
        inverse_one(&CompressConfig::default(), f.payload())
            .unwrap()
            .payload(),
        [b'a'; 100]
    );
    // zstd: method 2, original length, then a zstd frame (magic 28 b5 2f fd).
    let f = forward_one(&cfg(Codec::Zstd), &[b'a'; 100]);
    assert_eq!(hex(&f.payload()[..9]), "020000006428b52ffd");
    // Parse/emit round trip.
    for h in [
        Header::Stored,
        Header::Compressed {
            codec: Codec::Lz4,
            original_len: 0x0102_0304,
        },
        Header::Compressed {
            codec: Codec::Zstd,
            original_len: u32::MAX,
        },
    ] {
        let mut buf = vec![0u8; h.buffer_len()];
        h.emit(&mut buf);
        assert_eq!(Header::parse(&buf), Ok(h));
    }
    assert_eq!(
        (METHOD_STORED, METHOD_LZ4, METHOD_ZSTD),
        (0, 1, 2),
        "method numbers are wire format"
    );
}

#[test]
fn compressible_frames_shrink_with_both_codecs_and_round_trip() {
    for codec in [Codec::Lz4, Codec::Zstd] {
        let c = cfg(codec);
        for (what, data, max_ratio) in [("text", text(8192), 0.10), ("screen", screen(), 0.15)] {
            let wire = forward_one(&c, &data);
            let ratio = wire.len() as f64 / data.len() as f64;
            eprintln!(
                "{codec} {what}: {} -> {} bytes ({:.2}%)",
                data.len(),
                wire.len(),
                100.0 * ratio
            );
            assert!(
                ratio < max_ratio,
                "{codec} {what}: {} -> {} bytes",
                data.len(),
                wire.len()
            );
            assert_ne!(wire.payload()[0], METHOD_STORED);
            let back = inverse_one(&c, wire.payload()).unwrap();
            assert_eq!(back.payload(), &data[..], "{codec} {what}");
            assert_eq!(back.meta, meta(1));
        }
    }
}

#[test]
fn random_and_small_frames_are_stored_without_a_copy() {
    for codec in [Codec::Lz4, Codec::Zstd] {
        let c = cfg(codec);
        let mut fwd = c.forward().unwrap();
        let mut inv = c.inverse().unwrap();
        for payload in [random(4096, 3), text(63)] {
            let now = Instant::now();
            let frame = Frame::new(meta(9), &payload);
            let ptr = frame.payload().as_ptr();
            let before = copies_on_this_thread();
            let mut out = Output::new();
            fwd.handle_frame(now, frame, &mut out).unwrap();
            let wire = out.take_frames().pop().unwrap();
            assert_eq!(wire.payload()[0], METHOD_STORED, "{codec}");
            assert_eq!(wire.payload()[1..].as_ptr(), ptr, "same payload buffer");
            assert_eq!(wire.len(), payload.len() + 1);
            inv.handle_frame(now, wire, &mut out).unwrap();
            let back = out.take_frames().pop().unwrap();
            assert_eq!(back.payload().as_ptr(), ptr, "inverse pops in place");
            assert_eq!(back.payload(), &payload[..]);
            assert_eq!(back.meta, meta(9));
            assert_eq!(copies_on_this_thread(), before, "{codec}: no payload copy");
        }
        assert_eq!(
            fwd.stats().counters,
            vec![("stored", 2), ("compressed", 0), ("bytes_saved", 0)]
        );
        assert_eq!(
            inv.stats().counters,
            vec![("stored", 2), ("decompressed", 0)]
        );
    }
}

#[test]
fn frames_above_max_size_are_sent_stored() {
    let c = CompressConfig {
        max_size: 64,
        min_size: 0,
        ..Default::default()
    };
    assert_eq!(forward_one(&c, &[0; 64]).payload()[0], METHOD_LZ4);
    assert_eq!(forward_one(&c, &[0; 65]).payload()[0], METHOD_STORED);
}

#[test]
fn bad_frames_fail_with_clear_errors() {
    let lz4 = CompressConfig::default();
    let zstd = cfg(Codec::Zstd);
    let text300 = text(300);
    let mut lz4_300 = forward_one(&lz4, &text300).payload().to_vec();
    let mut zstd_300 = forward_one(&zstd, &text300).payload().to_vec();
    assert_eq!(lz4_300[..5], [1, 0, 0, 1, 44]);
    assert_eq!(zstd_300[..5], [2, 0, 0, 1, 44]);
    let announce = |v: &mut Vec<u8>, n: u32| v[1..5].copy_from_slice(&n.to_be_bytes());
    let mut cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![], "compress: empty frame (no method byte)"),
        (vec![3, 0, 0, 0, 1, 0], "compress: unknown method 3"),
        (vec![0xff], "compress: unknown method 255"),
        (
            vec![1, 0, 0],
            "compress: frame of 3 bytes is shorter than the 5-byte lz4 header",
        ),
        (
            vec![2],
            "compress: frame of 1 bytes is shorter than the 5-byte zstd header",
        ),
        // A crafted header claiming 4 GiB: refused before any allocation.
        (
            vec![1, 0xff, 0xff, 0xff, 0xff, 0x00],
            "compress: original length 4294967295 exceeds max_size 67108864",
        ),
        (
            vec![2, 0xff, 0xff, 0xff, 0xff, 0x28, 0xb5, 0x2f, 0xfd],
            "compress: original length 4294967295 exceeds max_size 67108864",
        ),
        (
            vec![1, 0x04, 0x00, 0x00, 0x01],
            "compress: original length 67108865 exceeds max_size 67108864",
        ),
    ];
    announce(&mut lz4_300, 600);
    cases.push((
        lz4_300.clone(),
        "compress: lz4 data decompressed to 300 bytes, 600 announced",
    ));
    announce(&mut lz4_300, 50);
    cases.push((lz4_300.clone(), "compress: corrupt lz4 data:"));
    announce(&mut zstd_300, 50);
    cases.push((zstd_300.clone(), "compress: corrupt zstd data:"));
    announce(&mut zstd_300, 300);
    zstd_300[9] ^= 0xff;
    cases.push((zstd_300, "compress: corrupt zstd data:"));
    cases.push((
        vec![1, 0, 0, 0, 10, 0xf0, 0xff, 0xff],
        "compress: corrupt lz4 data:",
    ));
    cases.push((
        vec![2, 0, 0, 0, 10, 1, 2, 3],
        "compress: corrupt zstd data:",
    ));
    for (wire, want) in cases {
        let e = inverse_one(&lz4, &wire).unwrap_err();
        let ModuleError::MalformedFrame(msg) = &e else {
            panic!("{wire:02x?}: not a malformed frame: {e:?}");
        };
        let msg = msg.to_string();
        assert!(
            msg.starts_with(want),
            "{wire:02x?}: got {msg:?}, want {want:?}"
        );
    }
    // A real bomb: honest data whose original length is above max_size.
    let small = CompressConfig {
        max_size: 64,
        min_size: 0,
        ..Default::default()
    };
    let wire = forward_one(&lz4, &vec![0u8; 100_000]);
    assert!(wire.len() < 1000);
    assert_eq!(
        inverse_one(&small, wire.payload()).unwrap_err().to_string(),
        "malformed frame: compress: original length 100000 exceeds max_size 64"
    );
}

#[test]
fn any_control_message_is_refused_with_the_layer_named() {
    let c = CompressConfig::default();
    let now = Instant::now();
    for role in [Role::Source, Role::Sink] {
        let mut s = Stack::build(role, "screen", &[&c]).unwrap();
        let e = s
            .handle_control(now, 0, bytes::Bytes::from_static(b"\x01"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "stream \"screen\" layer 0 (compress, {role} side): malformed control message: compress: this pair has no control messages"
            )
        );
    }
    // The halves never send one.
    let mut p = Pipeline::new(&[&c], LinkConfig::default(), 1).unwrap();
    for i in 0..10u64 {
        p.send_at(Duration::from_millis(i), text(500));
    }
    p.run().unwrap();
    assert_eq!(p.deliveries().len(), 10);
    assert!(p.source_stats()[0].control_out == 0 && p.sink_stats()[0].control_out == 0);
}

#[test]
fn stats_show_the_ratio_and_the_counters() {
    for codec in [Codec::Lz4, Codec::Zstd] {
        let c = cfg(codec);
        let mut p = Pipeline::new(&[&c], LinkConfig::default(), 2).unwrap();
        let frames = [screen(), random(3000, 1), text(10), text(4000)];
        for (i, f) in frames.iter().enumerate() {
            p.send_at(Duration::from_millis(i as u64), f.clone());
        }
        p.run().unwrap();
        let got: Vec<&[u8]> = p.deliveries().iter().map(|d| &d.payload[..]).collect();
        let want: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
        assert_eq!(got, want);
        let src = &p.source_stats()[0];
        let total: u64 = frames.iter().map(|f| f.len() as u64).sum();
        assert_eq!(src.bytes_in, total);
        let counters: HashMap<_, _> = src.half.counters.iter().copied().collect();
        assert_eq!(counters["stored"], 2, "{codec}: random and small");
        assert_eq!(counters["compressed"], 2);
        // Saved bytes are what the compressed frames lost; stored frames cost 1 byte each.
        assert_eq!(src.bytes_out, total - counters["bytes_saved"] + 2);
        assert!(
            (src.bytes_out as f64) < 0.5 * total as f64,
            "{codec}: {} of {total}",
            src.bytes_out
        );
        let sink = &p.sink_stats()[0];
        assert_eq!(sink.bytes_out, total);
        assert_eq!(sink.half.counters, vec![("stored", 2), ("decompressed", 2)]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Over a lossy, reordering datagram link: every delivered frame is exactly the frame sent
    /// with that sequence number, meta included (the pair is stateless per frame).
    #[test]
    fn round_trip_over_a_lossy_link(
        frames in proptest::collection::vec((0usize..3000, 0u8..3, any::<u64>()), 1..40),
        zstd in any::<bool>(),
        min_size in 0u32..200,
        seed in any::<u64>(),
    ) {
        let c = CompressConfig {
            codec: if zstd { Codec::Zstd } else { Codec::Lz4 },
            min_size,
            ..Default::default()
        };
        let link = LinkConfig {
            duplicate: 0.05,
            ..LinkConfig::datagram(Duration::from_millis(5), Duration::from_millis(20), 0.1)
        };
        let mut p = Pipeline::new(&[&c], link, seed).unwrap();
        let payloads: Vec<Vec<u8>> = frames
            .iter()
            .map(|&(n, kind, s)| match kind {
                0 => random(n, s),
                1 => text(n),
                _ => screen()[..n].to_vec(),
            })
            .collect();
        for (i, data) in payloads.iter().enumerate() {
            p.send_at(Duration::from_millis(2 * i as u64), data.clone());
        }
        p.run().unwrap();
        let lost = p.data_link().lost;
        prop_assert!(p.deliveries().len() as u64 + lost >= payloads.len() as u64);
        for d in p.deliveries() {
            let seq = d.meta.seq as usize;
            prop_assert_eq!(&d.payload[..], &payloads[seq][..]);
            prop_assert_eq!(d.meta, Meta {
                stream: 1,
                seq: seq as u64,
                timestamp_ns: EPOCH_NS + 2_000_000 * seq as u64,
                flags: 0,
            });
        }
    }

    #[test]
    fn inverse_never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..64), method in 0u8..4) {
        let mut wire = bytes;
        if let Some(b) = wire.first_mut() {
            *b = method;
        }
        let _ = inverse_one(&CompressConfig { max_size: 4096, ..Default::default() }, &wire);
    }
}

#[test]
fn stacked_stores_are_zero_copy_through_a_stack() {
    // Random data through [compress, compress] on both sides: pointer moves only.
    let c = CompressConfig::default();
    let mut src = Stack::build(Role::Source, "s", &[&c, &c]).unwrap();
    let mut sink = Stack::build(Role::Sink, "s", &[&c, &c]).unwrap();
    let now = Instant::now();
    let data = random(1 << 16, 11);
    let f = Frame::new(meta(0), &data);
    let ptr = f.payload().as_ptr();
    let before = copies_on_this_thread();
    src.handle_frame(now, f).unwrap();
    let wire = src.poll_frame().unwrap();
    assert_eq!(&wire.payload()[..2], &[0, 0]);
    sink.handle_frame(now, wire).unwrap();
    let back = sink.poll_frame().unwrap();
    assert_eq!(back.payload().as_ptr(), ptr);
    assert_eq!(copies_on_this_thread(), before);
}
