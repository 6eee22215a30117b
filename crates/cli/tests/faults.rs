//! Fault smoke tests with real processes over loopback: the connection is cut mid-frame
//! through a proxy the test controls, and the app side is killed with SIGKILL and started
//! again. (Blackholes, stateful pairs, lossy streams and thousands of other fault schedules
//! run in virtual time: `crates/testkit/tests/session.rs`.) The `check` sink proves that no reliable frame is lost or duplicated; the time
//! to recover is printed (run with `--nocapture` to see it).

mod common;

use common::*;
use std::time::Duration;

const CFG: &str = r#"
driver = "faults"
[link]
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 200
[[stream]]
name = "events"
direction = "device-to-app"
source = { type = "synthetic", size = 300, interval_ms = 1.0, count = 3000, seed = 9 }
sink = { type = "check", seed = 9, size = 300, expect = 3000 }
stack = [{ type = "checksum" }, { type = "bundle", count = 3, max_delay_ms = 5 }]
[[stream]]
name = "back"
direction = "app-to-device"
source = { type = "synthetic", size = 40, interval_ms = 2.0, count = 1500, seed = 4 }
sink = { type = "check", seed = 4, size = 40, expect = 1500 }
"#;

#[test]
fn cut_connections_mid_frame_lose_and_duplicate_nothing() {
    let dir = Dir::new("fault-cut");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, CFG).unwrap();
    let (derr, aerr) = run_with_cuts(&cfg, &dev_home, &app_home, 3, Duration::from_millis(400));
    assert!(aerr.contains("stream \"events\": check: 3000 frames, seq 0..=2999, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"), "{aerr}");
    assert!(derr.contains("stream \"back\": check: 1500 frames, seq 0..=1499, 0 missing, 0 duplicate, 0 reordered, 0 corrupt: OK"), "{derr}");
    assert!(
        recoveries(&derr).len() >= 3,
        "three cuts, three recoveries: {derr}"
    );
}

#[test]
fn a_killed_and_restarted_app_side_gets_everything_the_first_did_not() {
    let dir = Dir::new("fault-restart");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    let out = dir.0.join("received.bin");
    // The app side appends every frame to one file (length-prefixed), across both of its lives.
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "restart"
[link]
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 100
[[stream]]
name = "events"
direction = "device-to-app"
source = {{ type = "synthetic", size = 64, interval_ms = 1.0, count = 2000, seed = 12 }}
sink = {{ type = "file", path = "{}", framing = "length", append = true }}
"#,
            out.display()
        ),
    )
    .unwrap();
    let (_, _, written1) = run_with_app_restart(
        &cfg,
        &dev_home,
        &app_home,
        || std::fs::metadata(&out).is_ok_and(|m| m.len() > 30_000),
        // What the first app wrote, to the byte: its life ends here.
        || std::fs::metadata(&out).map_or(0, |m| m.len()) as usize,
    );
    // Every frame, in order, none lost: the device keeps what the app's sink had not completed
    // and sends it again to the new app. A frame the first app completed in its last moments
    // (before its DELIVERED went out) may come twice: at least once across a process restart
    // (docs/protocol.md §5a).
    let bytes = std::fs::read(&out).unwrap();
    let mut seqs = Vec::new();
    let mut last1 = None;
    let mut at = 0;
    while at + 4 <= bytes.len() {
        let n = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let p = &bytes[at + 4..at + 4 + n];
        let seq = (0..2000u64)
            .find(|&s| ndd_endpoint::synthetic::verify(12, s, p))
            .expect("a frame the source made");
        seqs.push(seq);
        at += 4 + n;
        if at <= written1 {
            last1 = Some(seq);
        }
    }
    assert_eq!(at, bytes.len(), "whole frames only");
    let (expect, dups, lost) = order(seqs.iter().copied());
    assert_eq!(expect, 2000, "the stream went on to its end");
    assert!(
        lost.is_empty(),
        "lost {lost:?} across the restart (the first app wrote up to {last1:?})"
    );
    assert!(
        dups <= 100,
        "{dups} duplicates: more than the unacknowledged window"
    );
    println!(
        "frames: {} delivered, {dups} delivered twice across the restart",
        seqs.len()
    );
}
