//! Streams whose pairs keep state (`delta`, `buffer`, `encrypt`) and lossy streams across link
//! faults, with real processes over loopback and the proxy of `common` (issue 8):
//!
//! - reliable streams through `delta`, `buffer` and `encrypt` (alone and stacked) survive
//!   several cuts mid-frame: every frame once, in order, byte-exact (`check` sinks);
//! - the same device→app streams survive a `kill -9` and restart of the app side: in order,
//!   byte-exact, complete, nothing lost, a frame at most twice (the device keeps its endpoint
//!   frames until the app's sink completes them, DELIVERED, and encodes them again for the
//!   new app with a fresh stack);
//! - a lossy stream resumes from its newest frame: sequence numbers only grow, nothing is
//!   resent, and the gap is reported.
//!
//! Recovery times and counts are printed (`--nocapture`), never asserted.

mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

const LINK: &str = r#"
[link]
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 200
"#;

/// A 32-byte key file, mode 0600, as the `encrypt` pair requires.
fn key_file(dir: &Path) -> String {
    let p = dir.join("stream.key");
    std::fs::write(&p, random(32, 77)).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.display().to_string()
}

/// A synthetic stream: its source, and a stack.
struct Spec {
    name: &'static str,
    seed: u64,
    size: usize,
    count: u64,
    interval_ms: f64,
    stack: String,
}

impl Spec {
    fn toml(&self, direction: &str, sink: &str) -> String {
        let Spec {
            name,
            seed,
            size,
            count,
            interval_ms,
            stack,
        } = self;
        format!(
            r#"
[[stream]]
name = "{name}"
direction = "{direction}"
source = {{ type = "synthetic", size = {size}, interval_ms = {interval_ms:.1}, count = {count}, seed = {seed} }}
sink = {sink}
stack = {stack}
"#
        )
    }

    fn check_sink(&self) -> String {
        format!(
            "{{ type = \"check\", seed = {}, size = {}, expect = {} }}",
            self.seed, self.size, self.count
        )
    }
}

/// The device→app streams with stateful pairs. `keyframe_interval = 0`: `delta` sends key
/// frames only at the start and on request, so any divergence of its two halves would last.
fn stateful_streams(key: &str) -> Vec<Spec> {
    let delta = r#"{ type = "delta", keyframe_interval = 0 }"#;
    vec![
        Spec {
            name: "delta",
            seed: 21,
            size: 256,
            count: 3000,
            interval_ms: 1.0,
            stack: format!(r#"[{delta}, {{ type = "compress", codec = "lz4" }}]"#),
        },
        Spec {
            name: "buffer",
            seed: 22,
            size: 64,
            count: 1500,
            interval_ms: 2.0,
            stack: r#"[{ type = "buffer", min = 5, max = 20, source_max = 100000 }]"#.to_string(),
        },
        Spec {
            name: "encrypt",
            seed: 23,
            size: 128,
            count: 3000,
            interval_ms: 1.0,
            stack: format!(r#"[{{ type = "encrypt", key_file = "{key}", window = 64 }}]"#),
        },
        Spec {
            name: "stacked",
            seed: 24,
            size: 512,
            count: 1500,
            interval_ms: 2.0,
            stack: format!(
                r#"[{delta}, {{ type = "buffer", min = 5, max = 10, source_max = 100000 }}, {{ type = "encrypt", cipher = "chacha20-poly1305", key_file = "{key}" }}]"#
            ),
        },
    ]
}

#[test]
fn stateful_pairs_resynchronise_across_cuts_mid_frame() {
    let dir = Dir::new("resync-cut");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let key = key_file(&dir.0);
    let mut cfg_text = format!("driver = \"resync\"\n{LINK}");
    let mut expect = Vec::new();
    for s in stateful_streams(&key) {
        cfg_text += &s.toml("device-to-app", &s.check_sink());
        expect.push((s.name, s.count));
    }
    // The other way too, everything stacked, so both sides resend and resynchronise.
    let back = Spec {
        name: "back",
        seed: 25,
        size: 300,
        count: 1500,
        interval_ms: 2.0,
        stack: format!(
            r#"[{{ type = "delta", keyframe_interval = 0 }}, {{ type = "buffer", min = 5, max = 10, source_max = 100000 }}, {{ type = "encrypt", key_file = "{key}" }}]"#
        ),
    };
    cfg_text += &back.toml("app-to-device", &back.check_sink());
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, cfg_text).unwrap();
    let (derr, aerr) = run_with_cuts(&cfg, &dev_home, &app_home, 4, Duration::from_millis(350));
    for (name, count) in expect {
        assert!(aerr.contains(&check_ok(name, count)), "{name}: {aerr}");
    }
    assert!(derr.contains(&check_ok("back", 1500)), "back: {derr}");
    assert!(
        recoveries(&derr).len() >= 4,
        "four cuts, four recoveries: {derr}"
    );
}

/// Sequence numbers of the frames in a `length`-framed file of synthetic payloads, in file
/// order, each with the offset where it ends; panics on a payload the source cannot have
/// made (corrupt, or rebuilt wrong).
fn seqs_in(path: &Path, seed: u64, count: u64) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(path).unwrap();
    let mut seqs = Vec::new();
    let mut at = 0;
    let mut next = 0u64;
    while at + 4 <= bytes.len() {
        let n = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        assert!(
            at + 4 + n <= bytes.len(),
            "{}: a torn frame",
            path.display()
        );
        let p = &bytes[at + 4..at + 4 + n];
        // Mostly the next one; after a restart an earlier one (resent), or a later one (lost).
        let seq = std::iter::once(next)
            .chain((0..next).rev())
            .chain(next + 1..count)
            .find(|&s| ndd_endpoint::synthetic::verify(seed, s, p))
            .unwrap_or_else(|| {
                panic!(
                    "{}: frame {} (after seq {next}) is no frame the source made",
                    path.display(),
                    seqs.len()
                )
            });
        at += 4 + n;
        seqs.push((seq, at as u64));
        next = seq + 1;
    }
    assert_eq!(at, bytes.len(), "whole frames only");
    seqs
}

#[test]
fn stateful_pairs_resynchronise_across_a_restart_of_the_app_side() {
    let dir = Dir::new("resync-restart");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let key = key_file(&dir.0);
    let mut cfg_text = format!("driver = \"resync-restart\"\n{LINK}max_backoff_ms = 100\n")
        .replace("max_backoff_ms = 200\n", "");
    let mut outs = Vec::new();
    for s in stateful_streams(&key) {
        // Every life of the app side appends to one file per stream.
        let out = dir.0.join(format!("{}.bin", s.name));
        let sink = format!(
            "{{ type = \"file\", path = \"{}\", framing = \"length\", append = true }}",
            out.display()
        );
        cfg_text += &s.toml("device-to-app", &sink);
        outs.push((s.name, s.seed, s.count, out));
    }
    let cfg = dir.0.join("c.toml");
    std::fs::write(&cfg, cfg_text).unwrap();
    let delta_out = outs[0].3.clone();
    let (_, _, written1) = run_with_app_restart(
        &cfg,
        &dev_home,
        &app_home,
        || std::fs::metadata(&delta_out).is_ok_and(|m| m.len() > 100_000),
        // What the first app wrote, to the byte: its life ends here.
        || -> Vec<u64> {
            outs.iter()
                .map(|o| std::fs::metadata(&o.3).map_or(0, |m| m.len()))
                .collect()
        },
    );
    let mut failures = Vec::new();
    for ((name, seed, count, out), written1) in outs.into_iter().zip(written1) {
        let frames = seqs_in(&out, seed, count);
        // The last frame the first app wrote.
        let last1 = frames
            .iter()
            .take_while(|(_, end)| *end <= written1)
            .last()
            .map(|(s, _)| *s);
        // In order; a frame the first app took in but had not acknowledged when it died may
        // come twice (protocol §5a).
        let (expect, dups, lost) = order(frames.iter().map(|(s, _)| *s));
        println!(
            "{name}: {} frames written ({} by the first app), {dups} twice across the restart, lost {lost:?}",
            frames.len(),
            last1.map_or(0, |l| l + 1),
        );
        if expect != count {
            failures.push(format!("{name}: the stream stopped at {expect} of {count}"));
        }
        if dups > 200 {
            failures.push(format!(
                "{name}: {dups} duplicates, more than the unacknowledged window"
            ));
        }
        // Nothing lost: the device keeps its endpoint frames until the app's sink has
        // completed them, and encodes them again with a fresh stack for the new app (a new
        // delta key frame, a new encrypt epoch). Duplicates are what the dead app completed
        // just before it died (protocol §5a).
        if !lost.is_empty() {
            failures.push(format!(
                "{name}: lost {lost:?} (the first app wrote up to {last1:?})"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `(frames, first seq, last seq, missing, duplicate, reordered, corrupt)` from a check line.
fn parse_check(err: &str, stream: &str) -> (u64, u64, u64, u64, u64, u64, u64) {
    let tag = format!("stream \"{stream}\": check: ");
    let line = err
        .lines()
        .find_map(|l| l.split(&tag).nth(1))
        .unwrap_or_else(|| panic!("no check line for {stream}: {err}"));
    let num = |after: &str| -> u64 {
        let i = line
            .find(after)
            .unwrap_or_else(|| panic!("{after:?} in {line}"));
        line[..i]
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let range = line
        .split("seq ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap();
    let (a, b) = range.split_once("..=").unwrap();
    (
        num(" frames"),
        a.parse().unwrap(),
        b.parse().unwrap(),
        num(" missing"),
        num(" duplicate"),
        num(" reordered"),
        num(" corrupt"),
    )
}

/// A counter from a `--stats-json` file: `key` of stream `name`.
fn stat(json: &Path, name: &str, key: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("stream {name} in {v}"))[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} of {name} in {v}"))
}

#[test]
fn a_lossy_stream_resumes_from_its_newest_frame() {
    let dir = Dir::new("resync-lossy");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let cfg = dir.0.join("c.toml");
    const N: u64 = 2500;
    std::fs::write(
        &cfg,
        format!(
            r#"driver = "lossy"
{LINK}
[[stream]]
name = "motion"
direction = "device-to-app"
reliability = "lossy"
source = {{ type = "synthetic", size = 32, interval_ms = 2.0, count = {N}, seed = 31 }}
sink = {{ type = "check", seed = 31, size = 32, expect = {N} }}
[[stream]]
name = "events"
direction = "device-to-app"
source = {{ type = "synthetic", size = 64, interval_ms = 2.0, count = {N}, seed = 32 }}
sink = {{ type = "check", seed = 32, size = 64, expect = {N} }}
"#
        ),
    )
    .unwrap();
    let (dev_json, app_json) = (dir.0.join("dev.json"), dir.0.join("app.json"));
    let app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &[
            "--listen",
            "127.0.0.1:0",
            "--stats-json",
            app_json.to_str().unwrap(),
        ],
    ));
    let proxy = Proxy::start(app.addr());
    let mut dev = Side::spawn(run_cmd(
        &cfg,
        "device",
        &dev_home,
        &[
            "--connect",
            &proxy.addr,
            "--stats-json",
            dev_json.to_str().unwrap(),
        ],
    ));
    let restored = |dev: &Side| dev.stderr_now().matches("link restored after").count();
    wait_for("a connection", Duration::from_secs(30), || {
        proxy.accepted() >= 1
    });
    thread::sleep(Duration::from_millis(400));
    // 1. Cut, and unreachable for half a second: frames made meanwhile are replaced by newer.
    proxy.set(REFUSE);
    proxy.cut();
    thread::sleep(Duration::from_millis(500));
    proxy.set(PASS);
    let t = Instant::now();
    wait_for("the first recovery", Duration::from_secs(30), || {
        restored(&dev) >= 1
    });
    let back1 = t.elapsed();
    thread::sleep(Duration::from_millis(300));
    // 2. Blackhole until the keepalive declares the link dead, then a while longer.
    proxy.set(BLOCK);
    wait_for("keepalive to fire", Duration::from_secs(10), || {
        dev.stderr_now().contains("no message from the peer")
    });
    thread::sleep(Duration::from_millis(400));
    proxy.cut();
    proxy.set(PASS);
    let t = Instant::now();
    wait_for("the second recovery", Duration::from_secs(30), || {
        restored(&dev) >= 2
    });
    let back2 = t.elapsed();
    assert!(
        dev.running(),
        "the faults came before the end of the stream"
    );
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    println!(
        "recoveries (device side, from the loss): {:?}; resumed {:.0} ms / {:.0} ms after the \
         path came back",
        recoveries(&derr),
        back1.as_secs_f64() * 1e3,
        back2.as_secs_f64() * 1e3
    );
    assert!(ds.success(), "device: {derr}");
    // The app's check of the lossy stream fails (frames are missing): exit status 3.
    assert_eq!(as_.code(), Some(3), "app: {aerr}");
    assert!(aerr.contains(&check_ok("events", N)), "{aerr}");
    let (frames, first, last, missing, dup, reordered, corrupt) = parse_check(&aerr, "motion");
    let overflow = stat(&dev_json, "motion", "overflow");
    println!(
        "lossy stream: {frames} of {N} frames delivered, {missing} skipped (gaps: {}); \
         {overflow} replaced by a newer frame while the link was down",
        aerr.lines()
            .find(|l| l.contains("stream \"motion\": check:"))
            .and_then(|l| l.split("missing ").last())
            .map(|g| g.trim_end_matches(')'))
            .unwrap_or("")
    );
    assert_eq!(
        (dup, reordered, corrupt),
        (0, 0, 0),
        "sequence numbers only grow"
    );
    assert_eq!((first, last), (0, N - 1), "the newest frame arrives");
    assert_eq!(
        frames + missing,
        N,
        "every frame delivered or reported missing"
    );
    assert!(missing > 0, "the outage shows as a gap");
    assert!(
        overflow > 0,
        "frames made while the link was down were replaced"
    );
    assert!(
        missing >= overflow,
        "a replaced frame is never delivered ({missing} missing, {overflow} replaced)"
    );
    // Nothing of the lossy stream was resent, so the sink had nothing to drop as a duplicate.
    assert_eq!(stat(&dev_json, "motion", "retransmits"), 0);
    assert_eq!(stat(&app_json, "motion", "duplicates"), 0);
}
