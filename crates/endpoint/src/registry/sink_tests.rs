//! Tests of [`SinkConfig::spawn`](super::SinkConfig::spawn) and
//! [`SinkConfig::spawn_tracked`](super::SinkConfig::spawn_tracked) over the file, check and
//! null sinks.

use super::*;
use crate::check::{CheckConfig, NullConfig};
use crate::common::framing::{encode, Framing, RAW_CHUNK};
use crate::common::report::SinkReport;
use crate::file::FileSinkConfig;
use ndd_core::Meta;
use std::path::PathBuf;
use tokio::sync::mpsc;

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ndd-endpoint-sink-{}-{name}", std::process::id()))
}

fn frame(seq: u64, payload: &[u8]) -> Frame {
    Frame::new(
        Meta {
            seq,
            ..Default::default()
        },
        payload,
    )
}

async fn feed(sink: &SinkConfig, frames: Vec<Frame>) -> Result<SinkReport, EndpointError> {
    let (tx, rx) = mpsc::channel(4);
    let task = sink.spawn(rx)?;
    for f in frames {
        tx.send(f).await.unwrap();
    }
    drop(tx);
    task.await.unwrap()
}

#[tokio::test]
async fn file_sink_truncates_or_appends() {
    let path = temp_path("append");
    std::fs::write(&path, "old contents\n").unwrap();
    let mut cfg = FileSinkConfig {
        path: path.clone(),
        framing: Framing::Length,
        append: false,
    };
    let r = feed(
        &SinkConfig::File(cfg.clone()),
        vec![frame(0, b"ab"), frame(1, b"")],
    )
    .await
    .unwrap();
    assert_eq!((r.frames, r.bytes, r.check), (2, 2, None));
    assert_eq!(
        std::fs::read(&path).unwrap(),
        [0, 0, 0, 2, b'a', b'b', 0, 0, 0, 0]
    );
    cfg.append = true;
    cfg.framing = Framing::Raw;
    feed(&SinkConfig::File(cfg), vec![frame(0, b"cd")])
        .await
        .unwrap();
    let got = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(got, [0, 0, 0, 2, b'a', b'b', 0, 0, 0, 0, b'c', b'd']);
}

#[tokio::test]
async fn large_frames_are_written_whole() {
    let path = temp_path("large");
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    let cfg = SinkConfig::File(FileSinkConfig {
        path: path.clone(),
        framing: Framing::Length,
        append: false,
    });
    feed(&cfg, vec![frame(0, b"s"), frame(1, &big), frame(2, b"t")])
        .await
        .unwrap();
    let got = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut want = Vec::new();
    for p in [&b"s"[..], &big, b"t"] {
        encode(Framing::Length, p, &mut want).unwrap();
    }
    assert_eq!(got, want);
}

#[tokio::test]
async fn file_sink_in_missing_directory_fails_before_spawning() {
    let path = temp_path("no-such-dir").join("out");
    let (_tx, rx) = mpsc::channel(1);
    let e = SinkConfig::File(FileSinkConfig {
        path: path.clone(),
        framing: Framing::Raw,
        append: false,
    })
    .spawn(rx)
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "file sink: cannot open {}: No such file or directory (os error 2)",
            path.display()
        )
    );
}

#[tokio::test]
async fn check_sink_reports_problems() {
    let cfg = SinkConfig::Check(CheckConfig {
        seed: None,
        size: None,
        expect: Some(4),
    });
    let frames = [0, 1, 3, 3].iter().map(|&s| frame(s, b"x")).collect();
    let r = feed(&cfg, frames).await.unwrap();
    let check = r.check.unwrap();
    assert_eq!((r.frames, r.bytes), (4, 4));
    assert!(!check.is_ok());
    assert_eq!(check.gaps, vec![(2, 2)]);
    assert_eq!(check.duplicates, 1);
}

#[tokio::test]
async fn null_sink_counts() {
    let r = feed(
        &SinkConfig::Null(NullConfig {}),
        vec![frame(0, b"abc"), frame(1, b"de")],
    )
    .await
    .unwrap();
    assert_eq!(
        r,
        SinkReport {
            frames: 2,
            bytes: 5,
            check: None
        }
    );
}

/// Feeds `frames` to a tracked sink and returns its report and what it marked delivered.
async fn feed_tracked(sink: &SinkConfig, frames: Vec<Frame>) -> (SinkReport, Delivered) {
    let (tx, rx) = mpsc::channel(4);
    let delivered = Delivered::default();
    let task = sink.spawn_tracked(rx, delivered.clone()).unwrap();
    for f in frames {
        tx.send(f).await.unwrap();
    }
    drop(tx);
    (task.await.unwrap().unwrap(), delivered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_sink_marks_frames_only_once_their_bytes_are_in_the_file() {
    const N: usize = 300;
    let path = temp_path("delivered");
    let sizes: Vec<usize> = (0..N)
        .map(|i| match i % 7 {
            0 => 0,
            1 => 1,
            2 => 100,
            3 => 4096,
            4 => RAW_CHUNK + 17,
            5 => 3 * RAW_CHUNK,
            _ => 777 + i,
        })
        .collect();
    // Bytes in the file once frames 0..=k are written (raw framing: just the payloads).
    let ends: Vec<u64> = sizes
        .iter()
        .scan(0u64, |sum, &n| {
            *sum += n as u64;
            Some(*sum)
        })
        .collect();
    let cfg = SinkConfig::File(FileSinkConfig {
        path: path.clone(),
        framing: Framing::Raw,
        append: false,
    });
    let (tx, rx) = mpsc::channel(4);
    let delivered = Delivered::default();
    let task = cfg.spawn_tracked(rx, delivered.clone()).unwrap();
    let feeder = tokio::spawn(async move {
        for (seq, &n) in sizes.iter().enumerate() {
            let payload: Vec<u8> = (0..n).map(|i| (i + seq) as u8).collect();
            tx.send(frame(seq as u64, &payload)).await.unwrap();
        }
    });
    let mut checks = 0u64;
    let mut seen = Vec::new();
    loop {
        let finished = feeder.is_finished();
        // Read the mark first, the file second: a mark must never run ahead of the data.
        if let Some(k) = delivered.get() {
            let len = std::fs::metadata(&path).unwrap().len();
            assert!(
                len >= ends[k as usize],
                "frame {k} marked delivered with {len} bytes in the file, {} needed",
                ends[k as usize]
            );
            checks += 1;
            if seen.last() != Some(&k) {
                seen.push(k);
            }
        }
        if finished {
            break;
        }
        tokio::task::yield_now().await;
    }
    feeder.await.unwrap();
    let r = task.await.unwrap().unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(r.frames, N as u64);
    assert_eq!(len, ends[N - 1]);
    assert_eq!(delivered.get(), Some(N as u64 - 1));
    assert!(checks > 0);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
}

#[tokio::test]
async fn check_and_null_sinks_mark_every_frame() {
    const N: u64 = 50;
    let frames = || (0..N).map(|s| frame(s, b"x")).collect::<Vec<_>>();
    let check = SinkConfig::Check(CheckConfig {
        seed: None,
        size: None,
        expect: Some(N),
    });
    let (r, delivered) = feed_tracked(&check, frames()).await;
    assert_eq!(r.frames, N);
    assert_eq!(delivered.get(), Some(N - 1));
    let (r, delivered) = feed_tracked(&SinkConfig::Null(NullConfig {}), frames()).await;
    assert_eq!(r.frames, N);
    assert_eq!(delivered.get(), Some(N - 1));
    // Nothing received, nothing delivered.
    let (_, delivered) = feed_tracked(&SinkConfig::Null(NullConfig {}), vec![]).await;
    assert_eq!(delivered.get(), None);
}

#[test]
fn spawn_outside_a_runtime_is_an_error() {
    let (_tx, rx) = mpsc::channel(1);
    let e = SinkConfig::Null(NullConfig {}).spawn(rx).unwrap_err();
    assert_eq!(
        e.to_string(),
        "null sink: must be started from within a tokio runtime"
    );
}
