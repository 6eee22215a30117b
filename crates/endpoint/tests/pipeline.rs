//! End to end over tokio channels: sources feeding sinks through the public API.

use ndd_endpoint::framing::{MAX_LINE, RAW_CHUNK};
use ndd_endpoint::{
    encode, synthetic, CheckConfig, FileSinkConfig, FileSourceConfig, Framing, SinkConfig,
    SourceConfig, SyntheticConfig,
};
use std::path::PathBuf;
use tokio::sync::mpsc;

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ndd-endpoint-it-{}-{name}", std::process::id()))
}

#[tokio::test(start_paused = true)]
async fn synthetic_to_check_over_a_channel() {
    let source: SourceConfig = toml::from_str::<toml::Table>(
        r#"type = "synthetic"
           count = 50
           interval_ms = 1.0
           size = 37
           seed = 5"#,
    )
    .unwrap()
    .try_into()
    .unwrap();
    let sink = SinkConfig::Check(CheckConfig {
        seed: Some(5),
        size: Some(37),
        expect: Some(50),
    });
    let (tx, rx) = mpsc::channel(4);
    let sink_task = sink.spawn(rx).unwrap();
    let source_task = source.spawn(2, tx).unwrap();
    let sent = source_task.await.unwrap().unwrap();
    let got = sink_task.await.unwrap().unwrap();
    assert_eq!((sent.frames, sent.bytes), (50, 50 * 37));
    assert_eq!((got.frames, got.bytes), (50, 50 * 37));
    let check = got.check.unwrap();
    assert!(check.is_ok(), "{check}");
    assert_eq!(
        check.to_string(),
        "check: 50 frames, seq 0..=49, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"
    );
}

#[tokio::test(start_paused = true)]
async fn check_with_another_seed_finds_every_frame_corrupt() {
    let source = SourceConfig::Synthetic(SyntheticConfig {
        count: Some(10),
        interval_ms: 1.0,
        ..Default::default()
    });
    let sink = SinkConfig::Check(CheckConfig {
        seed: Some(2),
        ..Default::default()
    });
    let (tx, rx) = mpsc::channel(4);
    let sink_task = sink.spawn(rx).unwrap();
    source.spawn(0, tx).unwrap().await.unwrap().unwrap();
    let check = sink_task.await.unwrap().unwrap().check.unwrap();
    assert_eq!(check.corrupt, 10);
    assert!(
        check.to_string().ends_with("FAILED (10 corrupt)"),
        "{check}"
    );
}

/// Input for each framing: several read chunks, odd sizes, and for lines a line longer than
/// the split length and no final newline.
fn input_for(framing: Framing) -> Vec<u8> {
    match framing {
        Framing::Raw => synthetic::payload(1, 0, 3 * RAW_CHUNK + 123),
        Framing::Lines => {
            let mut v = b"first\n\nthird line\n".to_vec();
            v.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
            v.extend_from_slice(b"\nno newline at the end");
            v
        }
        Framing::Length => {
            let mut v = Vec::new();
            for (i, size) in [0usize, 1, 100, RAW_CHUNK + 7, 3, 200_000]
                .iter()
                .enumerate()
            {
                encode(
                    Framing::Length,
                    &synthetic::payload(9, i as u64, *size),
                    &mut v,
                )
                .unwrap();
            }
            v
        }
    }
}

#[tokio::test]
async fn file_to_file_round_trip_is_byte_identical_for_every_framing() {
    for framing in [Framing::Raw, Framing::Lines, Framing::Length] {
        let input = input_for(framing);
        let src_path = temp_path(&format!("in-{framing}"));
        let dst_path = temp_path(&format!("out-{framing}"));
        std::fs::write(&src_path, &input).unwrap();
        let source = SourceConfig::File(FileSourceConfig {
            path: src_path.clone(),
            framing,
        });
        let sink = SinkConfig::File(FileSinkConfig {
            path: dst_path.clone(),
            framing,
            append: false,
        });
        let (tx, rx) = mpsc::channel(8);
        let sink_task = sink.spawn(rx).unwrap();
        let sent = source.spawn(0, tx).unwrap().await.unwrap().unwrap();
        let got = sink_task.await.unwrap().unwrap();
        let output = std::fs::read(&dst_path).unwrap();
        std::fs::remove_file(&src_path).unwrap();
        std::fs::remove_file(&dst_path).unwrap();
        assert_eq!(sent.frames, got.frames, "{framing}");
        assert_eq!(sent.bytes, got.bytes, "{framing}");
        let expected_frames = match framing {
            Framing::Raw => None,
            Framing::Lines => Some(6), // three lines, the long one in two, the last
            Framing::Length => Some(6),
        };
        if let Some(n) = expected_frames {
            assert_eq!(sent.frames, n, "{framing}");
        }
        assert!(output == input, "{framing}: output differs from input");
    }
}
