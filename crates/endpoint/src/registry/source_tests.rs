//! Tests of [`SourceConfig::spawn`](super::SourceConfig::spawn) over the synthetic,
//! spacenav-sim and file sources.

use super::*;
use crate::common::clock::now_ns;
use crate::common::framing::Framing;
use crate::common::report::SourceReport;
use crate::file::FileSourceConfig;
use crate::synthetic::spacenav::{Motion, Record};
use crate::synthetic::{SpacenavSimConfig, SyntheticConfig};
use ndd_core::frame::DEFAULT_HEADROOM;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ndd-endpoint-src-{}-{name}", std::process::id()))
}

async fn collect(mut rx: mpsc::Receiver<Frame>) -> Vec<Frame> {
    let mut out = Vec::new();
    while let Some(f) = rx.recv().await {
        out.push(f);
    }
    out
}

#[tokio::test(start_paused = true)]
async fn synthetic_numbers_stamps_and_fills_frames() {
    let (tx, rx) = mpsc::channel(8);
    let cfg = SourceConfig::Synthetic(SyntheticConfig {
        size: 13,
        interval_ms: 16.0,
        count: Some(5),
        seed: 4,
        repeat: false,
    });
    let before = now_ns();
    let start = tokio::time::Instant::now();
    let task = cfg.spawn(7, tx).unwrap();
    let frames = collect(rx).await;
    // First frame at once, then one per interval: four intervals of (paused) time.
    assert_eq!(start.elapsed(), Duration::from_millis(64));
    let report = task.await.unwrap().unwrap();
    assert_eq!(
        report,
        SourceReport {
            frames: 5,
            bytes: 65
        }
    );
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f.meta.seq, i as u64);
        assert_eq!(f.meta.stream, 7);
        assert_eq!(f.meta.flags, 0);
        assert!(f.meta.timestamp_ns >= before);
        assert_eq!(f.payload(), synthetic::payload(4, i as u64, 13));
        assert!(f.headroom() >= DEFAULT_HEADROOM);
    }
}

#[tokio::test(start_paused = true)]
async fn spacenav_sends_records_at_its_rate() {
    let (tx, rx) = mpsc::channel(8);
    let cfg = SourceConfig::SpacenavSim(SpacenavSimConfig {
        count: Some(63),
        ..Default::default()
    });
    let start = tokio::time::Instant::now();
    let task = cfg.spawn(1, tx).unwrap();
    let frames = collect(rx).await;
    assert_eq!(start.elapsed(), Duration::from_millis(62 * 16));
    assert_eq!(task.await.unwrap().unwrap().frames, 63);
    let motion = Motion::new(1, 62.5);
    for f in &frames {
        let r = Record::decode(f.payload()).unwrap();
        assert_eq!(r, motion.record(f.meta.seq));
    }
}

#[tokio::test]
async fn unpaced_source_stops_quietly_when_receiver_drops() {
    let (tx, mut rx) = mpsc::channel(4);
    let cfg = SourceConfig::Synthetic(SyntheticConfig {
        interval_ms: 0.0,
        ..Default::default()
    });
    let task = cfg.spawn(0, tx).unwrap();
    for _ in 0..10 {
        rx.recv().await.unwrap();
    }
    drop(rx);
    let report = task.await.unwrap().unwrap();
    assert!(report.frames >= 10);
}

#[tokio::test(start_paused = true)]
async fn paced_source_stops_while_waiting_for_its_tick() {
    let (tx, mut rx) = mpsc::channel(4);
    let cfg = SourceConfig::Synthetic(SyntheticConfig {
        interval_ms: 3_600_000.0,
        ..Default::default()
    });
    let task = cfg.spawn(0, tx).unwrap();
    rx.recv().await.unwrap();
    let start = tokio::time::Instant::now();
    drop(rx);
    assert_eq!(task.await.unwrap().unwrap().frames, 1);
    assert_eq!(start.elapsed(), Duration::ZERO, "no wait for the next tick");
}

#[tokio::test]
async fn missing_file_is_an_error_before_spawning() {
    let (tx, _rx) = mpsc::channel(1);
    let path = temp_path("does-not-exist");
    let cfg = SourceConfig::File(FileSourceConfig {
        path: path.clone(),
        framing: Framing::Raw,
    });
    let e = cfg.spawn(0, tx).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "file source: cannot open {}: No such file or directory (os error 2)",
            path.display()
        )
    );
    let (tx, _rx) = mpsc::channel(1);
    let cfg = SourceConfig::File(FileSourceConfig {
        path: std::env::temp_dir(),
        framing: Framing::Raw,
    });
    let e = cfg.spawn(0, tx).unwrap_err().to_string();
    assert!(e.ends_with("is a directory"), "{e}");
}

#[tokio::test]
async fn truncated_length_file_is_an_error_naming_the_offset() {
    let path = temp_path("truncated");
    std::fs::write(&path, [0, 0, 0, 2, b'o', b'k', 0, 0, 0, 9, b'x']).unwrap();
    let (tx, rx) = mpsc::channel(8);
    let cfg = SourceConfig::File(FileSourceConfig {
        path: path.clone(),
        framing: Framing::Length,
    });
    let task = cfg.spawn(0, tx).unwrap();
    let frames = collect(rx).await;
    let e = task.await.unwrap().unwrap_err().to_string();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].payload(), b"ok");
    assert_eq!(
        e,
        format!(
            "file source: {}: length framing: truncated frame at byte offset 6: \
             prefix says 9 bytes, input ends after 1",
            path.display()
        )
    );
}

#[tokio::test]
async fn lines_file_yields_numbered_lines() {
    let path = temp_path("lines");
    std::fs::write(&path, "a\nbb\n\nlast").unwrap();
    let (tx, rx) = mpsc::channel(8);
    let cfg = SourceConfig::File(FileSourceConfig {
        path: path.clone(),
        framing: Framing::Lines,
    });
    let task = cfg.spawn(3, tx).unwrap();
    let frames = collect(rx).await;
    std::fs::remove_file(&path).unwrap();
    let got: Vec<(u64, &[u8])> = frames.iter().map(|f| (f.meta.seq, f.payload())).collect();
    assert_eq!(
        got,
        vec![(0, &b"a\n"[..]), (1, b"bb\n"), (2, b"\n"), (3, b"last")]
    );
    assert_eq!(
        task.await.unwrap().unwrap(),
        SourceReport {
            frames: 4,
            bytes: 10
        }
    );
}

#[test]
fn spawn_outside_a_runtime_is_an_error() {
    let (tx, _rx) = mpsc::channel(1);
    let e = SourceConfig::Synthetic(SyntheticConfig::default())
        .spawn(0, tx)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "synthetic source: must be started from within a tokio runtime"
    );
}

#[test]
fn invalid_parameters_are_refused_by_spawn() {
    let (tx, _rx) = mpsc::channel(1);
    let e = SourceConfig::SpacenavSim(SpacenavSimConfig {
        rate_hz: f64::NAN,
        ..Default::default()
    })
    .spawn(0, tx)
    .unwrap_err();
    assert!(
        matches!(
            e,
            EndpointError::Config {
                param: "rate_hz",
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test]
async fn repeat_sends_frame_zeros_payload_every_time_from_one_buffer() {
    let (tx, rx) = mpsc::channel(8);
    let cfg = SourceConfig::Synthetic(SyntheticConfig {
        size: 4096,
        interval_ms: 0.0,
        count: Some(3),
        seed: 7,
        repeat: true,
    });
    assert_eq!(
        cfg.describe(),
        "synthetic(size=4096, interval_ms=0, count=3, seed=7, repeat=true)"
    );
    let task = cfg.spawn(0, tx).unwrap();
    let frames = collect(rx).await;
    assert_eq!(task.await.unwrap().unwrap().frames, 3);
    let want = crate::synthetic::payload(7, 0, 4096);
    let seqs: Vec<u64> = frames.iter().map(|f| f.meta.seq).collect();
    assert_eq!(seqs, [0, 1, 2]);
    for f in &frames {
        assert_eq!(f.payload(), want.as_slice());
        // Shared, not copied per frame.
        assert_eq!(f.payload().as_ptr(), frames[0].payload().as_ptr());
    }
}
