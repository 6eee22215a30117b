use super::*;
use ndd_core::{Frame, Half, Meta, Output};
use ndd_wire::audio::{Block, Codec};
use std::time::Instant;

fn meta(seq: u64) -> Meta {
    Meta {
        stream: 3,
        seq,
        timestamp_ns: seq * 10_000_000,
        flags: 0,
    }
}

/// Block `k` of 10 ms of a `hz` sine at 48 kHz, `ch` channels, as a PCM record.
fn sine_block(k: u64, hz: f64, ch: u8) -> Vec<u8> {
    let mut data = Vec::new();
    for i in 0..480u64 {
        let t = (k * 480 + i) as f64 / 48_000.0;
        let v = ((t * hz * std::f64::consts::TAU).sin() * 12_000.0) as i16;
        for _ in 0..ch {
            data.extend_from_slice(&v.to_le_bytes());
        }
    }
    Block {
        codec: Codec::Pcm,
        rate: 48_000,
        channels: ch,
        samples: 480,
        data: &data,
    }
    .emit()
    .unwrap()
}

fn pcm(f: &Frame) -> (u16, Vec<i16>) {
    let b = Block::parse(f.payload()).unwrap();
    assert_eq!(b.codec, Codec::Pcm);
    let s = b
        .data
        .chunks_exact(2)
        .map(|x| i16::from_le_bytes([x[0], x[1]]))
        .collect();
    (b.samples, s)
}

fn crossings_hz(s: &[i16], ch: usize) -> f64 {
    let mono: Vec<i16> = s.iter().step_by(ch).copied().collect();
    let c = mono.windows(2).filter(|w| (w[0] < 0) != (w[1] < 0)).count();
    c as f64 / 2.0 / (mono.len() as f64 / 48_000.0)
}

fn run(c: &OpusConfig, blocks: &[(u64, Vec<u8>)]) -> (Vec<Frame>, Vec<Frame>, OpusInverse) {
    let now = Instant::now();
    let mut fwd = OpusForward::new(c.bitrate, c.application);
    let mut inv = OpusInverse::new();
    let (mut coded, mut decoded) = (Vec::new(), Vec::new());
    for (seq, b) in blocks {
        let mut out = Output::new();
        fwd.handle_frame(now, Frame::new(meta(*seq), b), &mut out)
            .unwrap();
        for f in out.take_frames() {
            coded.push(Frame::new(f.meta, f.payload()));
            let mut o2 = Output::new();
            inv.handle_frame(now, f, &mut o2).unwrap();
            decoded.extend(o2.take_frames());
        }
    }
    (coded, decoded, inv)
}

#[test]
fn a_tone_survives_coding_at_the_bitrate_asked() {
    for (ch, bitrate) in [(1u8, 32_000u32), (2, 64_000)] {
        let c = OpusConfig {
            bitrate,
            application: Application::Audio,
        };
        let blocks: Vec<(u64, Vec<u8>)> = (0..200).map(|k| (k, sine_block(k, 440.0, ch))).collect();
        let (coded, decoded, _) = run(&c, &blocks);
        assert_eq!(coded.len(), 200);
        // About bitrate / 100 blocks per second / 8 bits, per packet (VBR: within a factor).
        let avg = coded.iter().map(|f| f.len() - 9).sum::<usize>() as f64 / 200.0;
        let want = f64::from(bitrate) / 100.0 / 8.0;
        assert!(
            avg > want * 0.5 && avg < want * 1.5,
            "{avg} bytes/packet, {want} asked"
        );
        // Meta unchanged, PCM of the same length, the same tone (past the codec's start-up).
        let mut all = Vec::new();
        for (f, (seq, _)) in decoded.iter().zip(&blocks) {
            assert_eq!(f.meta, meta(*seq));
            let (n, s) = pcm(f);
            assert_eq!(n, 480);
            all.extend(s);
        }
        let hz = crossings_hz(&all[48_000 * usize::from(ch) / 10..], usize::from(ch));
        assert!((hz - 440.0).abs() < 2.0, "{ch} ch: {hz} Hz");
    }
}

#[test]
fn lost_blocks_are_concealed_in_front_of_the_next_one() {
    let c = OpusConfig::default();
    let blocks: Vec<(u64, Vec<u8>)> = (0..50u64)
        .filter(|k| !(20..23).contains(k))
        .map(|k| (k, sine_block(k, 440.0, 1)))
        .collect();
    let (_, decoded, inv) = run(&c, &blocks);
    let after = decoded.iter().find(|f| f.meta.seq == 23).unwrap();
    let (n, s) = pcm(after);
    assert_eq!(n, 4 * 480, "3 concealed blocks and the block itself");
    // The concealment is sound, not silence.
    let energy = s[..3 * 480]
        .iter()
        .map(|&x| i64::from(x).abs())
        .sum::<i64>();
    assert!(
        energy > 3 * 480 * 1000,
        "concealed blocks are near silent: {energy}"
    );
    assert!(inv.stats().counters.contains(&("concealed", 3)));
}

#[test]
fn what_opus_cannot_code_fails_with_what_it_takes() {
    let now = Instant::now();
    let mut fwd = OpusForward::new(64_000, Application::Voip);
    let mut out = Output::new();
    let at_44k = Block {
        codec: Codec::Pcm,
        rate: 44_100,
        channels: 1,
        samples: 441,
        data: &[0; 882],
    }
    .emit()
    .unwrap();
    let e = fwd
        .handle_frame(now, Frame::new(meta(0), &at_44k), &mut out)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("opus: 44100 Hz: Opus codes 8000, 12000, 16000, 24000 or 48000 Hz"),
        "{e}"
    );
    let odd = Block {
        codec: Codec::Pcm,
        rate: 48_000,
        channels: 1,
        samples: 100,
        data: &[0; 200],
    }
    .emit()
    .unwrap();
    let e = fwd
        .handle_frame(now, Frame::new(meta(1), &odd), &mut out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("blocks of 100 samples at 48000 Hz"), "{e}");
    let e = fwd
        .handle_frame(now, Frame::new(meta(2), b"junk"), &mut out)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("opus: audio record: 4 bytes, shorter than the 9-byte header"),
        "{e}"
    );
    // A corrupt packet at the inverse: an error or a decoded guess, never a panic.
    let mut inv = OpusInverse::new();
    let bad = Block {
        codec: Codec::Opus,
        rate: 48_000,
        channels: 1,
        samples: 480,
        data: &[0xff; 40],
    }
    .emit()
    .unwrap();
    let r = inv.handle_frame(now, Frame::new(meta(0), &bad), &mut out);
    assert!(r.is_err() || out.take_frames().len() == 1);
}

#[test]
fn config_validates_and_describes() {
    assert_eq!(
        OpusConfig::default().describe(),
        "opus(bitrate=64000, application=audio)"
    );
    let e = OpusConfig {
        bitrate: 100,
        ..OpusConfig::default()
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(e.contains("bitrate"), "{e}");
}
