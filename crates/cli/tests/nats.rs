//! The NATS link with real processes and Debian's `nats-server`: one device side feeding
//! three app sides (every frame to each, on core NATS and on JetStream), round-robin and
//! split spreading, strangers that get nothing they can read, and the faults that must lose
//! nothing on reliable streams: an app side killed and started again, the server restarted.

mod common;

use common::*;
use ndd_procs::Nats;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn nats_or_skip() -> bool {
    if let Some(m) = missing(&["nats-server"]) {
        eprintln!("SKIPPED: {m} not installed (./run installs Debian's nats-server)");
        return false;
    }
    true
}

/// `ndd run` with the NATS driver's log lines on.
fn side(cfg: &Path, side: &str, home: &Path, extra: &[&str]) -> Side {
    let mut c = run_cmd(cfg, side, home, extra);
    // NDD_TEST_LOG=debug (say) when a test fails and its sides' stderr must say more.
    let log = std::env::var("NDD_TEST_LOG")
        .unwrap_or_else(|_| "warn,ndd::fanout=info,ndd_link::nats::drive=info".into());
    c.env("NDD_LOG", log);
    Side::spawn(c)
}

/// A device home and `n` app homes, each app trusting the device and trusted by it.
fn homes_n(dir: &Path, n: usize) -> (PathBuf, Vec<PathBuf>) {
    let d = dir.join("dev");
    let dfp = ok(ndd().args(["id", "--home"]).arg(&d)).trim().to_string();
    let apps = (0..n)
        .map(|i| {
            let a = dir.join(format!("app{i}"));
            let afp = ok(ndd().args(["id", "--home"]).arg(&a)).trim().to_string();
            ok(ndd()
                .args(["trust", &afp, "--name", &format!("app{i}"), "--home"])
                .arg(&d));
            ok(ndd()
                .args(["trust", &dfp, "--name", "device", "--home"])
                .arg(&a));
            a
        })
        .collect();
    (d, apps)
}

/// `"a", "b"`: strings as the items of a TOML array.
fn toml_list(items: &[String]) -> String {
    items
        .iter()
        .map(|u| format!("{u:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A driver with one synthetic stream (`direction`, `count` frames of `size` bytes every
/// `interval_ms`) into a length-framed file the sink appends to.
fn one_stream_to_file(
    dir: &Path,
    driver: &str,
    url: &str,
    direction: &str,
    source: (usize, f64, u64, u64),
    out: &Path,
) -> PathBuf {
    stream_to_file_as(
        dir,
        &format!("{driver}.toml"),
        driver,
        url,
        direction,
        source,
        out,
    )
}

/// The same in the config file `file` (several configs of one driver: app sides whose sources
/// differ).
fn stream_to_file_as(
    dir: &Path,
    file: &str,
    driver: &str,
    url: &str,
    direction: &str,
    (size, interval_ms, count, seed): (usize, f64, u64, u64),
    out: &Path,
) -> PathBuf {
    fan_config_as(
        dir,
        file,
        driver,
        url,
        1,
        &format!(
            "[[stream]]\nname = \"s\"\ndirection = \"{direction}\"\nsource = {{ type = \"synthetic\", size = {size}, interval_ms = {interval_ms:?}, count = {count}, seed = {seed} }}\nsink = {{ type = \"file\", path = \"{}\", framing = \"length\", append = true }}\n",
            out.display()
        ),
    )
}

/// `DRIVER.toml` in `dir`: one lossy stream `s` of small synthetic frames every 10 ms, for
/// ever, into a `null` sink.
fn ticker(dir: &Path, driver: &str, url: &str, min: usize) -> PathBuf {
    fan_config(
        dir,
        driver,
        url,
        min,
        r#"
[[stream]]
name = "s"
direction = "device-to-app"
reliability = "lossy"
source = { type = "synthetic", size = 20, interval_ms = 10.0 }
sink = { type = "null" }
"#,
    )
}

/// `DRIVER.toml` in `dir`: driver `driver` on the NATS server at `url` (waiting for `min` app
/// sides) with `streams` (TOML of `[[stream]]` tables).
fn fan_config(dir: &Path, driver: &str, url: &str, min: usize, streams: &str) -> PathBuf {
    fan_config_as(dir, &format!("{driver}.toml"), driver, url, min, streams)
}

/// The same in the config file `file`.
fn fan_config_as(
    dir: &Path,
    file: &str,
    driver: &str,
    url: &str,
    min: usize,
    streams: &str,
) -> PathBuf {
    write(
        dir,
        file,
        &format!("driver = \"{driver}\"\n{}\n{streams}", link(url, min)),
    )
}

fn link(url: &str, min: usize) -> String {
    format!(
        "[link]\ntransport = \"nats\"\nconnect_timeout_ms = 20000\n[link.nats]\nservers = [\"{url}\"]\nmin_app_sides = {min}\n"
    )
}

#[test]
fn every_app_side_gets_every_frame_on_core_nats_and_on_jetstream() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-all");
    let nats = Nats::start("all", &[]);
    let (dev, apps) = homes_n(&dir.0, 3);
    let cfg = fan_config(
        &dir.0,
        "fan",
        &nats.url(),
        3,
        r#"
[[stream]]
name = "lossy"
direction = "device-to-app"
reliability = "lossy"
source = { type = "synthetic", size = 100, interval_ms = 4.0, count = 300, seed = 1 }
sink = { type = "check", seed = 1, size = 100, expect = 300 }
stack = [{ type = "checksum" }, { type = "multiplex", mode = "all" }]

[[stream]]
name = "reliable"
direction = "device-to-app"
source = { type = "synthetic", size = 1000, interval_ms = 2.0, count = 600, seed = 2 }
sink = { type = "check", seed = 2, size = 1000, expect = 600 }
stack = [{ type = "compress" }]
"#,
    );
    let app_sides: Vec<Side> = apps
        .iter()
        .map(|a| side(&cfg, "app", a, &["--once"]))
        .collect();
    let d = side(&cfg, "device", &dev, &["--once"]);
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    assert_eq!(derr.matches("joined").count(), 3, "{derr}");
    for (i, a) in app_sides.into_iter().enumerate() {
        let (s, _, err) = a.finish();
        assert!(s.success(), "app {i}: {err}");
        assert!(err.contains(&check_ok("lossy", 300)), "app {i}: {err}");
        assert!(err.contains(&check_ok("reliable", 600)), "app {i}: {err}");
        assert!(err.contains("joined device device through NATS"), "{err}");
    }
}

/// Whole length-framed records in a file a sink is still writing (a partial last one is not
/// counted).
fn complete_frames(path: &Path) -> usize {
    frames_in(path).len()
}

/// Synthetic frames of `size` bytes, the sequence numbers of those in a length-framed file.
fn frames_in(path: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).unwrap_or_default();
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= bytes.len() {
        let n = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let Some(p) = bytes.get(at + 4..at + 4 + n) else {
            break;
        };
        out.push(p.to_vec());
        at += 4 + n;
    }
    out
}

#[test]
fn round_robin_gives_each_frame_to_one_app_side_and_split_cuts_frames_across_slots() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-rr");
    let nats = Nats::start("rr", &[]);
    let (dev, apps) = homes_n(&dir.0, 2);
    let n = 400u64;
    let mut cfgs = Vec::new();
    for (i, _) in apps.iter().enumerate() {
        let out = dir.0.join(format!("rr{i}.bin"));
        let pieces = dir.0.join(format!("split{i}.bin"));
        cfgs.push(write(
            &dir.0,
            &format!("rr{i}.toml"),
            &format!(
                "driver = \"spread\"\n{}\n{}",
                link(&nats.url(), 2),
                format_args!(
                    r#"
[[stream]]
name = "rr"
direction = "device-to-app"
source = {{ type = "synthetic", size = 64, interval_ms = 3.0, count = {n}, seed = 5 }}
sink = {{ type = "file", path = "{}", framing = "length" }}
stack = [{{ type = "multiplex", mode = "round-robin" }}]

[[stream]]
name = "split"
direction = "device-to-app"
source = {{ type = "synthetic", size = 100, interval_ms = 3.0, count = {n}, seed = 6 }}
sink = {{ type = "file", path = "{}", framing = "length" }}
stack = [{{ type = "multiplex", mode = "split", parts = 2 }}]
"#,
                    out.display(),
                    pieces.display()
                )
            ),
        ));
    }
    let app_sides: Vec<Side> = apps
        .iter()
        .zip(&cfgs)
        .map(|(a, c)| side(c, "app", a, &["--once"]))
        .collect();
    let d = side(&cfgs[0], "device", &dev, &["--once"]);
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(
        derr.contains("(split slot 0)") && derr.contains("(split slot 1)"),
        "{derr}"
    );
    let mut slot_of = Vec::new();
    for (i, a) in app_sides.into_iter().enumerate() {
        let (s, _, err) = a.finish();
        assert!(s.success(), "app {i}: {err}");
        println!("app {i}: {err}");
        slot_of.push(if err.contains("split slot 0") { 0 } else { 1 });
    }
    // Round-robin: every frame at exactly one app side, and both got some.
    let mut all = Vec::new();
    for i in 0..2 {
        let seqs = synthetic_seqs_in(&dir.0.join(format!("rr{i}.bin")), 5, n);
        assert!(seqs.len() > 50, "app {i} got {} frames", seqs.len());
        all.extend(seqs);
    }
    all.sort();
    assert_eq!(all, (0..n).collect::<Vec<_>>(), "each frame exactly once");
    // Split: piece k of slot 0 followed by piece k of slot 1 is synthetic frame k.
    let by_slot: Vec<Vec<Vec<u8>>> = {
        let mut v = vec![Vec::new(), Vec::new()];
        for i in 0..2 {
            v[slot_of[i]] = frames_in(&dir.0.join(format!("split{i}.bin")));
        }
        v
    };
    assert_eq!(by_slot[0].len() as u64, n);
    assert_eq!(by_slot[1].len() as u64, n);
    for (k, (first, second)) in by_slot[0].iter().zip(&by_slot[1]).enumerate() {
        assert_eq!(first.len(), 50);
        let whole = [first.as_slice(), second.as_slice()].concat();
        assert!(
            ndd_endpoint::synthetic::verify(6, k as u64, &whole),
            "frame {k} reassembled from its two pieces"
        );
    }
}

/// Everything a plain NATS subscriber sees under `ndd.>` (the server's own protocol, no
/// client library): the bytes of every MSG.
fn eavesdrop(port: u16) -> (std::thread::JoinHandle<Vec<u8>>, std::net::TcpStream) {
    let (t, s) = subscribe_raw(port, "ndd.>");
    let t = std::thread::spawn(move || t.join().unwrap().concat());
    (t, s)
}

/// The body of every message a plain NATS subscriber to `subject` gets, until the returned
/// connection is shut down.
fn subscribe_raw(
    port: u16,
    subject: &str,
) -> (std::thread::JoinHandle<Vec<Vec<u8>>>, std::net::TcpStream) {
    let (t, s) = record_raw(port, subject);
    let t = std::thread::spawn(move || t.join().unwrap().into_iter().map(|m| m.1).collect());
    (t, s)
}

/// Every message (subject, body) a plain NATS subscriber to `subject` gets, until the returned
/// connection is shut down: what anyone who may subscribe on the server can record.
#[allow(clippy::type_complexity)]
fn record_raw(
    port: u16,
    subject: &str,
) -> (
    std::thread::JoinHandle<Vec<(String, Vec<u8>)>>,
    std::net::TcpStream,
) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(format!("CONNECT {{\"verbose\":false}}\r\nSUB {subject} 1\r\nPING\r\n").as_bytes())
        .unwrap();
    let r = s.try_clone().unwrap();
    let mut w = s.try_clone().unwrap();
    let t = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut rd = BufReader::new(r);
        let mut line = String::new();
        while rd.read_line(&mut line).is_ok_and(|n| n > 0) {
            if line.starts_with("PING") {
                let _ = w.write_all(b"PONG\r\n");
            } else if line.starts_with("MSG ") {
                let words: Vec<&str> = line.split_whitespace().collect();
                let len: usize = words.last().unwrap().parse().unwrap();
                let mut body = vec![0u8; len + 2];
                std::io::Read::read_exact(&mut rd, &mut body).unwrap();
                body.truncate(len);
                seen.push((words[1].to_string(), body));
            }
            line.clear();
        }
        seen
    });
    (t, s)
}

#[test]
fn strangers_get_nothing_they_can_read() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-stranger");
    let nats = Nats::start("stranger", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    // An app side the device does not trust (it trusts the device).
    let stranger = dir.0.join("stranger");
    let dfp = ok(ndd().args(["id", "--home"]).arg(&dev))
        .trim()
        .to_string();
    let sfp = ok(ndd().args(["id", "--home"]).arg(&stranger))
        .trim()
        .to_string();
    ok(ndd()
        .args(["trust", &dfp, "--name", "device", "--home"])
        .arg(&stranger));
    let secret = dir.0.join("secret.txt");
    let text: String = (0..200)
        .map(|i| format!("the secret line number {i:04}\n"))
        .collect();
    std::fs::write(&secret, &text).unwrap();
    let out = dir.0.join("out.txt");
    let cfg = fan_config(
        &dir.0,
        "secret",
        &nats.url(),
        1,
        &format!(
            r#"
[[stream]]
name = "lines"
direction = "device-to-app"
source = {{ type = "file", path = "{}", framing = "lines" }}
sink = {{ type = "file", path = "{}", framing = "lines" }}
"#,
            secret.display(),
            out.display()
        ),
    );
    let (spy, conn) = eavesdrop(nats.port);
    // The stranger is refused by name, with the command that would trust it.
    let s = side(&cfg, "app", &stranger, &["--once"]);
    let d = side(&cfg, "device", &dev, &["--once"]);
    let (ss, _, serr) = s.finish();
    assert!(!ss.success());
    assert!(
        serr.contains(&format!(
            "the device side refused this side: this install ({sfp}) is not trusted by the device side"
        )) && serr.contains(&format!("ndd trust {sfp}")),
        "{serr}"
    );
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "{derr}");
    assert!(derr.contains("refused untrusted app side"), "{derr}");
    let (as_, _, aerr) = a.finish();
    assert!(as_.success(), "{aerr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);
    // What went through the server: the frames (all of them), but no line of the text.
    std::thread::sleep(Duration::from_millis(200));
    conn.shutdown(std::net::Shutdown::Both).unwrap();
    let seen = spy.join().unwrap();
    assert!(seen.len() > text.len(), "the eavesdropper saw the traffic");
    assert!(
        !seen.windows(11).any(|w| w == b"secret line"),
        "plaintext went through the server"
    );
}

#[test]
fn reliable_streams_lose_nothing_when_an_app_side_is_killed_or_the_server_restarts() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-faults");
    let mut nats = Nats::start("faults", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let n = 1500u64;
    let out = dir.0.join("out.bin");
    let cfg = one_stream_to_file(
        &dir.0,
        "faults",
        &nats.url(),
        "device-to-app",
        (200, 4.0, n, 9),
        &out,
    );
    let got = || complete_frames(&out);
    let a1 = side(&cfg, "app", &apps[0], &[]);
    let mut c = run_cmd(&cfg, "device", &dev, &["--once"]);
    c.env(
        "NDD_LOG",
        std::env::var("NDD_TEST_LOG")
            .unwrap_or("warn,ndd::fanout=info,ndd_link::nats::drive=info".into()),
    );
    let d = Side::spawn(c);
    wait_for("frames to flow", WAIT, || got() > 100);
    // The app side dies without a goodbye; its frames wait in JetStream meanwhile.
    a1.kill();
    // What it kept for its next process: where the stream stood when it last acknowledged
    // (one file per durable consumer, 56 bytes with its check; docs/links.md).
    let kept: Vec<u64> = std::fs::read_dir(&apps[0])
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("nats-position-")
        })
        .map(|e| e.metadata().unwrap().len())
        .collect();
    assert_eq!(kept, vec![56], "the app side's position file");
    std::thread::sleep(Duration::from_millis(500));
    let mut c = run_cmd(&cfg, "app", &apps[0], &["--once"]);
    c.env(
        "NDD_LOG",
        std::env::var("NDD_TEST_LOG")
            .unwrap_or("warn,ndd::fanout=info,ndd_link::nats::drive=info".into()),
    );
    let a2 = Side::spawn(c);
    wait_for("frames to flow again", WAIT, || got() > 500);
    // The server is restarted (as `systemctl restart nats-server` would) and comes back a
    // second later on the same store.
    nats.stop();
    std::thread::sleep(Duration::from_secs(1));
    nats.restart();
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    let (as_, _, aerr) = a2.finish();
    assert!(as_.success(), "app: {aerr}");
    // The loss and the reconnect are both said.
    for (who, err) in [("device", &derr), ("app", &aerr)] {
        assert!(
            err.contains("lost the NATS server; reconnecting")
                && err.contains("reconnected to the NATS server (connection 2)"),
            "{who}: {err}"
        );
    }
    let seqs = synthetic_seqs_in(&out, 9, n);
    let (next, dups, lost) = order(seqs.iter().copied());
    assert_eq!(next, n, "every frame up to the last");
    assert!(
        lost.is_empty(),
        "frames lost: {lost:?}\napp: {aerr}\ndevice: {derr}"
    );
    // Frames the killed side had written but not yet acknowledged come again (at most
    // a few); the server restart duplicates nothing.
    println!("duplicates after the kill: {dups}");
    assert!(dups < 64, "{dups} duplicates");
}

#[test]
fn bad_nats_settings_are_named_at_check_time() {
    let dir = Dir::new("nats-check");
    let stream = "[[stream]]\nname = \"s\"\ndirection = \"device-to-app\"\nsource = { type = \"synthetic\", size = 10, interval_ms = 10.0, count = 1 }\nsink = { type = \"check\", size = 10, expect = 1 }\n";
    let split = "stack = [{ type = \"checksum\" }, { type = \"multiplex\", mode = \"split\", parts = 2 }]\n";
    for (link, stack, expect) in [
        (
            "[link]\ntransport = \"nats\"\n[link.nats]\nservers = [\"127.0.0.1:4222\"]\n",
            "",
            "link.nats.servers: \"127.0.0.1:4222\" is not a NATS URL (nats://HOST:PORT or tls://HOST:PORT)",
        ),
        (
            "[link]\ntransport = \"nats\"\n[link.nats]\nsubject_prefix = \"a.b\"\n",
            "",
            "'.' cannot be part of a NATS subject token",
        ),
        (
            "[link]\ntransport = \"nats\"\n[link.nats]\nreplicas = 2\n",
            "",
            "link.nats.replicas = 2: JetStream keeps 1, 3 or 5 copies (3 in a cluster of three servers)",
        ),
        (
            "[link]\ntransport = \"nats\"\n[link.nats]\nuser = \"u\"\n",
            "",
            "link.nats: user and password_file go together",
        ),
        // split leaves every app side a piece: no pair may come before it.
        (
            "[link]\ntransport = \"nats\"\n",
            split,
            "with mode = \"split\", `multiplex` must be the only layer",
        ),
        // multiplex needs the NATS link.
        (
            "",
            "stack = [{ type = \"multiplex\" }]\n",
            "`multiplex` sends frames to many app sides, which only the NATS link has",
        ),
    ] {
        let cfg = write(
            &dir.0,
            "c.toml",
            &format!("driver = \"d\"\n{link}{stream}{stack}"),
        );
        let out = ndd().arg("check").arg(&cfg).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(expect), "{err}");
    }
    // A NATS server that is not there: a clear error within the connect timeout.
    let cfg = write(
        &dir.0,
        "gone.toml",
        &format!(
            "driver = \"d\"\n[link]\ntransport = \"nats\"\nconnect_timeout_ms = 1000\n[link.nats]\nservers = [\"nats://127.0.0.1:{}\"]\n{stream}",
            free_addr().rsplit(':').next().unwrap()
        ),
    );
    let home = dir.0.join("h");
    let out = run_cmd(&cfg, "device", &home, &["--once"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("cannot connect to NATS at nats://127.0.0.1:")
            && err.contains("is nats-server running?"),
        "{err}"
    );
}

/// A CA and a server certificate for 127.0.0.1 (openssl), and a nats-server config with TLS
/// and a user whose password is `password`.
fn tls_server_config(dir: &Path, password: &str) -> PathBuf {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=ndd test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        "server-key.pem",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
    write(
        dir,
        "nats.conf",
        &format!(
            "tls {{ cert_file: \"{}\", key_file: \"{}\" }}\nauthorization {{ users = [ {{ user: ndd, password: \"{password}\" }} ] }}\n",
            dir.join("server.pem").display(),
            dir.join("server-key.pem").display()
        ),
    )
}

#[test]
fn the_server_connection_uses_tls_and_a_password_and_wrong_ones_are_named() {
    if !nats_or_skip() || missing(&["openssl"]).is_some() {
        return;
    }
    let dir = Dir::new("nats-tls");
    let conf = tls_server_config(&dir.0, "s3cret-pass");
    let nats = Nats::start("tls", &["-c", conf.to_str().unwrap()]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let pass = dir.0.join("pass");
    std::fs::write(&pass, "s3cret-pass\n").unwrap();
    let wrong = dir.0.join("wrong");
    std::fs::write(&wrong, "nope\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    for p in [&pass, &wrong] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let cfg_with = |password: &Path, ca: bool| {
        let ca = if ca {
            format!("ca_file = \"{}\"\n", dir.0.join("ca.pem").display())
        } else {
            String::new()
        };
        write(
            &dir.0,
            "tls.toml",
            &format!(
                "driver = \"tls\"\n[link]\ntransport = \"nats\"\nconnect_timeout_ms = 5000\n[link.nats]\nservers = [\"tls://127.0.0.1:{}\"]\nmin_app_sides = 1\nuser = \"ndd\"\npassword_file = \"{}\"\n{ca}{}",
                nats.port,
                password.display(),
                r#"
[[stream]]
name = "s"
direction = "device-to-app"
source = { type = "synthetic", size = 100, interval_ms = 2.0, count = 200, seed = 3 }
sink = { type = "check", seed = 3, size = 100, expect = 200 }
"#
            ),
        )
    };
    // Right CA and password: through.
    let cfg = cfg_with(&pass, true);
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    let d = side(&cfg, "device", &dev, &["--once"]);
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "{derr}");
    let (as_, _, aerr) = a.finish();
    assert!(
        as_.success() && aerr.contains(&check_ok("s", 200)),
        "{aerr}"
    );
    assert!(!aerr.contains("plain TCP"), "{aerr}");
    // A wrong password: refused at once, by name.
    let cfg = cfg_with(&wrong, true);
    let out = run_cmd(&cfg, "device", &dev, &["--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("refused the credentials"), "{err}");
    // Without the CA the server's certificate cannot be checked.
    let cfg = cfg_with(&pass, false);
    let out = run_cmd(&cfg, "device", &dev, &["--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("TLS with NATS at tls://127.0.0.1:"), "{err}");
    // A password file others can read is refused before connecting.
    std::fs::set_permissions(&pass, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cfg = cfg_with(&pass, true);
    let out = run_cmd(&cfg, "device", &dev, &["--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has permissions 0644, but it must be readable by its owner only"),
        "{err}"
    );
}

#[test]
fn an_nkey_user_connects_with_its_seed_file() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-nkey");
    let user = nkeys::KeyPair::new_user();
    let conf = write(
        &dir.0,
        "nats.conf",
        &format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
            user.public_key()
        ),
    );
    let nats = Nats::start("nkey", &["-c", conf.to_str().unwrap()]);
    let seed = dir.0.join("user.nk");
    std::fs::write(&seed, format!("{}\n", user.seed().unwrap())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&seed, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (dev, apps) = homes_n(&dir.0, 1);
    let cfg = write(
        &dir.0,
        "nk.toml",
        &format!(
            "driver = \"nk\"\n[link]\ntransport = \"nats\"\nconnect_timeout_ms = 5000\n[link.nats]\nservers = [\"{}\"]\nmin_app_sides = 1\nnkey_file = \"{}\"\n{}",
            nats.url(),
            seed.display(),
            r#"
[[stream]]
name = "s"
direction = "device-to-app"
source = { type = "synthetic", size = 100, interval_ms = 2.0, count = 100, seed = 3 }
sink = { type = "check", seed = 3, size = 100, expect = 100 }
"#
        ),
    );
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    let d = side(&cfg, "device", &dev, &["--once"]);
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "{derr}");
    let (as_, _, aerr) = a.finish();
    assert!(
        as_.success() && aerr.contains(&check_ok("s", 100)),
        "{aerr}"
    );
    // Another user's seed: refused by name.
    let other = nkeys::KeyPair::new_user();
    std::fs::write(&seed, format!("{}\n", other.seed().unwrap())).unwrap();
    let out = run_cmd(&cfg, "device", &dev, &["--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("refused the credentials"), "{err}");
}

#[test]
fn reliable_app_to_device_frames_wait_in_jetstream_while_the_device_is_away() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-up");
    let nats = Nats::start("up", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let n = 600u64;
    let out = dir.0.join("up.bin");
    let cfg = one_stream_to_file(
        &dir.0,
        "up",
        &nats.url(),
        "app-to-device",
        (120, 5.0, n, 12),
        &out,
    );
    let got = || complete_frames(&out);
    let d1 = side(&cfg, "device", &dev, &["--once"]);
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    wait_for("frames to flow", WAIT, || got() > 300);
    // The device dies; the app side goes on sending into JetStream.
    d1.kill();
    std::thread::sleep(Duration::from_millis(800));
    let d2 = side(&cfg, "device", &dev, &["--once"]);
    let (as_, _, aerr) = a.finish();
    assert!(as_.success(), "app: {aerr}");
    let (ds, _, derr) = d2.finish();
    assert!(ds.success(), "device: {derr}");
    let seqs = synthetic_seqs_in(&out, 12, n);
    let (next, dups, lost) = order(seqs.iter().copied());
    assert_eq!(next, n, "every frame up to the last");
    assert!(lost.is_empty(), "frames lost: {lost:?}");
    println!("duplicates after the device's kill: {dups}");
    // What the killed process took and had not acknowledged comes again (0-10 here; 99 once
    // in a CI run, whose load kept the sink from being through, so from acknowledging, for
    // half a second): the next process resumed where the first stood, not from the start
    // (more than 300 would come again).
    assert!(dups < 150, "{dups} duplicates");
}

/// The device side restarts just before an app side's reliable stream ends: the new device
/// run begins (it reads where the stream stands), spends its claim's 500 ms, and the app side's
/// last frames and END, sealed for the run before and stored after the new one began, are
/// refused by it. The app side confirms the device's run before its stream is done and seals
/// them again for the new run; the device side, deaf to joins no longer while it claims,
/// answers. Before, the app side ended unaware and the new device side waited for the frames
/// for good (seen once in a loaded run of the test above).
#[test]
fn an_app_side_ending_while_the_device_restarts_leaves_nothing_behind() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-up-end");
    let nats = Nats::start("upend", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    // 400 frames, one every 5 ms: the source ends 2 s after it starts.
    let n = 400u64;
    let out = dir.0.join("up.bin");
    let cfg = one_stream_to_file(
        &dir.0,
        "upend",
        &nats.url(),
        "app-to-device",
        (120, 5.0, n, 14),
        &out,
    );
    let d1 = side(&cfg, "device", &dev, &["--once"]);
    wait_for("the first device side serves", WAIT, || {
        d1.stderr_now().contains("serving app sides through NATS")
    });
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    let started = std::time::Instant::now();
    wait_for("frames to flow", WAIT, || complete_frames(&out) > 20);
    d1.kill();
    // The next device side starts some 200 ms before the app side's source ends: it is
    // still claiming the driver when the last frames and the END are stored.
    let ends = Duration::from_secs(2);
    let start_at = ends.saturating_sub(Duration::from_millis(200));
    std::thread::sleep(start_at.saturating_sub(started.elapsed()));
    let d2 = side(&cfg, "device", &dev, &["--once"]);
    let (as_, _, aerr) = a.finish();
    assert!(as_.success(), "app: {aerr}");
    let (ds, _, derr) = d2.finish();
    assert!(ds.success(), "device: {derr}");
    let seqs = synthetic_seqs_in(&out, 14, n);
    let (next, _, lost) = order(seqs.iter().copied());
    assert_eq!(next, n, "every frame up to the last: {derr}");
    assert!(lost.is_empty(), "frames lost: {lost:?}");
}

/// A device run's mark (`Subjects::run_mark`) signed by the identity in `home`.
fn run_mark(home: &Path, driver: &str, run: u64) -> Vec<u8> {
    use ndd_link::nats::follow::{mark_label, notice_body, Notice};
    let (id, _) = ndd_link::Identity::load_or_create(home).unwrap();
    let who = ndd_link::seal::LocalIdentity::new(&id).unwrap();
    let subjects = ndd_link::nats::subjects::Subjects::new("ndd", driver).unwrap();
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let n = Notice {
        run,
        clock,
        key: [0; 8],
    };
    who.sign_note(&mark_label(&subjects), &notice_body(&n))
        .unwrap()
}

/// An app side whose reliable stream ends while no device side serves is done at once when
/// the run it sealed for is the device's newest
/// (`reliable_app_to_device_frames_wait_in_jetstream_while_the_device_is_away`), but not
/// when the JetStream stream holds the device's mark of a newer run (a process that marked
/// its run and died, or one whose notices this side missed): that run may have refused its
/// last frames, so it asks again until a device side answers, then is done; the device side
/// gets every frame. A mark signed by anyone else changes nothing.
#[test]
fn an_app_side_ending_while_a_newer_device_run_is_marked_waits_for_a_device_side() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-up-mark");
    let nats = Nats::start("upmark", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    // 200 frames, one every 5 ms: the source ends 1 s after it starts.
    let n = 200u64;
    let out = dir.0.join("up.bin");
    let cfg = one_stream_to_file(
        &dir.0,
        "upmark",
        &nats.url(),
        "app-to-device",
        (120, 5.0, n, 14),
        &out,
    );
    let d1 = side(&cfg, "device", &dev, &["--once"]);
    wait_for("the first device side serves", WAIT, || {
        d1.stderr_now().contains("serving app sides through NATS")
    });
    let mut a = side(&cfg, "app", &apps[0], &["--once"]);
    wait_for("frames to flow", WAIT, || complete_frames(&out) > 20);
    d1.kill();
    // The next run's id, marked by the device's identity; a stranger marks one newer still.
    let home = ndd_link::nats::home::Home::new(&dev, "ndd", "upmark");
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let run = home.reserve_run_id(clock, 7).unwrap();
    let subjects = ndd_link::nats::subjects::Subjects::new("ndd", "upmark").unwrap();
    let stranger = dir.0.join("stranger");
    ok(ndd().args(["id", "--home"]).arg(&stranger));
    for (who, r) in [(&stranger, run + 1), (&dev, run)] {
        let ack = ask(
            nats.port,
            &subjects.run_mark(r),
            &run_mark(who, "upmark", r),
        );
        let ack = String::from_utf8_lossy(&ack);
        assert!(ack.contains("\"seq\""), "stored: {ack}");
    }
    // The source ended long ago: the app side still asks for a device side.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        a.running(),
        "the app side finished with a newer run marked: {}",
        a.stderr_now()
    );
    let d2 = side(&cfg, "device", &dev, &["--once"]);
    let (as_, _, aerr) = a.finish();
    assert!(as_.success(), "app: {aerr}");
    assert!(
        aerr.contains("the device marked a run newer than the one this side sealed for"),
        "{aerr}"
    );
    let (ds, _, derr) = d2.finish();
    assert!(ds.success(), "device: {derr}");
    let seqs = synthetic_seqs_in(&out, 14, n);
    let (next, _, lost) = order(seqs.iter().copied());
    assert_eq!(next, n, "every frame up to the last: {derr}");
    assert!(lost.is_empty(), "frames lost: {lost:?}");
    // Four marks were stored (the first run's, the stranger's, the reserved run's, the second
    // device side's): the second device side purged those before its own.
    let info = ask(
        nats.port,
        &format!("$JS.API.STREAM.INFO.{}", subjects.jetstream()),
        format!(r#"{{"subjects_filter":"{}"}}"#, subjects.run_marks()).as_bytes(),
    );
    let info: serde_json::Value = serde_json::from_slice(&info).unwrap();
    let marks = info["state"]["subjects"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        marks.len(),
        1,
        "run-mark subjects left: {marks:?}; device: {derr}"
    );
}

/// The same with only a stranger's mark: done without waiting for a device side.
#[test]
fn a_run_mark_signed_by_a_stranger_keeps_no_app_side_waiting() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-up-forged-mark");
    let nats = Nats::start("upfmark", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let n = 100u64;
    let out = dir.0.join("up.bin");
    let cfg = one_stream_to_file(
        &dir.0,
        "upfmark",
        &nats.url(),
        "app-to-device",
        (120, 5.0, n, 14),
        &out,
    );
    let d1 = side(&cfg, "device", &dev, &["--once"]);
    wait_for("the device side serves", WAIT, || {
        d1.stderr_now().contains("serving app sides through NATS")
    });
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    wait_for("frames to flow", WAIT, || complete_frames(&out) > 20);
    d1.kill();
    let subjects = ndd_link::nats::subjects::Subjects::new("ndd", "upfmark").unwrap();
    let stranger = dir.0.join("stranger");
    ok(ndd().args(["id", "--home"]).arg(&stranger));
    let r = u64::MAX - 1;
    let ack = ask(
        nats.port,
        &subjects.run_mark(r),
        &run_mark(&stranger, "upfmark", r),
    );
    assert!(String::from_utf8_lossy(&ack).contains("\"seq\""));
    let (as_, _, aerr) = a.finish();
    assert!(as_.success(), "app: {aerr}");
    // Said by an app side that counts a newer run's mark, then by one whose confirmation
    // ran out: neither here (events, not a duration: the app side did not wait).
    assert!(
        !aerr.contains("the device marked a run newer")
            && !aerr.contains("no device side answered"),
        "the stranger's mark kept the app side waiting: {aerr}"
    );
}

/// The first `n` messages on `subject` (a wildcard may be), subject and body, as anyone who
/// may subscribe records them (in a thread).
fn record(port: u16, subject: &str, n: usize) -> std::thread::JoinHandle<Vec<(String, Vec<u8>)>> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(format!("CONNECT {{\"verbose\":false}}\r\nSUB {subject} 1\r\nPING\r\n").as_bytes())
        .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    // Subscribed once the server answers the PING.
    while !line.starts_with("PONG") {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
    std::thread::spawn(move || {
        let mut got = Vec::new();
        while got.len() < n {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.first() == Some(&"MSG") {
                let len: usize = w.last().unwrap().parse().unwrap();
                let mut body = vec![0; len + 2];
                r.read_exact(&mut body).unwrap();
                body.truncate(len);
                got.push((w[1].to_string(), body));
            }
        }
        got
    })
}

/// A copy of an app frame the device side took and acknowledged, stored by someone who may
/// publish while the device side restarts (before its next run begins, where frames of its
/// earlier run still count), is dropped by the next process: it knows from the home what the
/// one before opened (`ndd_link::nats::opened`). Before, the copy was delivered again.
#[test]
fn a_copy_stored_while_the_device_restarts_is_not_taken_again() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-up-copy");
    let nats = Nats::start("upcopy", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let n = 300u64;
    let out = dir.0.join("up.bin");
    let cfg = one_stream_to_file(
        &dir.0,
        "upcopy",
        &nats.url(),
        "app-to-device",
        (120, 5.0, n, 14),
        &out,
    );
    let d1 = side(&cfg, "device", &dev, &["--once"]);
    wait_for("the first device side serves", WAIT, || {
        d1.stderr_now().contains("serving app sides through NATS")
    });
    let recorder = record(nats.port, "ndd.upcopy.r.u.>", 10);
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    let recorded = recorder.join().unwrap();
    let (subject, copy) = recorded.last().unwrap().clone();
    let seq = u64::from_be_bytes(copy[20..28].try_into().unwrap());
    // Well past it: taken and acknowledged.
    wait_for("frames to flow", WAIT, || complete_frames(&out) > 100);
    assert_eq!(
        synthetic_seqs_in(&out, 14, n)
            .iter()
            .filter(|&&s| s == seq)
            .count(),
        1
    );
    d1.kill();
    let ack = ask(nats.port, &subject, &copy);
    assert!(String::from_utf8_lossy(&ack).contains("\"seq\""), "stored");
    let d2 = side(&cfg, "device", &dev, &["--once"]);
    let (as_, _, aerr) = a.finish();
    assert!(as_.success(), "app: {aerr}");
    let (ds, _, derr) = d2.finish();
    assert!(ds.success(), "device: {derr}");
    let seqs = synthetic_seqs_in(&out, 14, n);
    assert_eq!(
        seqs.iter().filter(|&&s| s == seq).count(),
        1,
        "frame {seq} taken again from its copy: {derr}"
    );
    let (next, _, lost) = order(seqs.iter().copied());
    assert_eq!(next, n, "every frame up to the last: {derr}");
    assert!(lost.is_empty(), "frames lost: {lost:?}");
}

/// `slots.toml` in `dir`: a lossy stream split between two app sides (heartbeats every 300 ms).
fn split_config(dir: &Path, url: &str) -> PathBuf {
    write(
        dir,
        "slots.toml",
        &format!(
            "driver = \"slots\"\n[link]\ntransport = \"nats\"\nkeepalive_timeout_ms = 1500\nping_interval_ms = 300\n[link.nats]\nservers = [\"{url}\"]\n{}",
            r#"
[[stream]]
name = "bands"
direction = "device-to-app"
reliability = "lossy"
source = { type = "synthetic", size = 100, interval_ms = 20.0, seed = 2 }
sink = { type = "null" }
stack = [{ type = "multiplex", mode = "split", parts = 2 }]
"#
        ),
    )
}

#[test]
fn a_split_slot_is_free_again_once_its_app_side_left() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-slots");
    let nats = Nats::start("slots", &[]);
    let (dev, apps) = homes_n(&dir.0, 3);
    let cfg = split_config(&dir.0, &nats.url());
    let d = side(&cfg, "device", &dev, &[]);
    let a0 = side(&cfg, "app", &apps[0], &[]);
    wait_for("app 0 joined", WAIT, || {
        d.stderr_now().contains("(split slot 0)")
    });
    let a1 = side(&cfg, "app", &apps[1], &[]);
    wait_for("app 1 joined", WAIT, || {
        d.stderr_now().contains("(split slot 1)")
    });
    // A third one finds both slots taken, by name.
    let out = run_cmd(&cfg, "app", &apps[2], &["--once"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("all 2 split slots are taken"), "{err}");
    // App 0 goes away; after 5 s of silence (the floor over NATS, above the keepalive) its
    // slot is app 2's.
    a0.kill();
    std::thread::sleep(Duration::from_millis(5500));
    let a2 = side(&cfg, "app", &apps[2], &[]);
    wait_for("app 2 took slot 0", WAIT, || {
        d.stderr_now().contains("split slot 0 is free again")
            && d.stderr_now().matches("(split slot 0)").count() == 2
    });
    assert!(
        a2.stderr_now().contains("split slot 0") || {
            wait_for("app 2's line", WAIT, || {
                a2.stderr_now().contains("split slot 0")
            });
            true
        }
    );
    drop((a1, a2, d));
}

/// A restarted device side gives each app side of a split driver its slot back: the one that
/// held slot 1 joins the new run first (the other is paused meanwhile) and keeps slot 1, and
/// both go on. Before, the first to join took slot 0, and an app side whose slot changed
/// ends: a restart ended about half the app sides.
#[test]
fn a_restarted_device_side_gives_each_app_side_its_split_slot_back() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-slots-restart");
    let nats = Nats::start("slots-restart", &[]);
    let (dev, apps) = homes_n(&dir.0, 2);
    let cfg = split_config(&dir.0, &nats.url());
    let d = side(&cfg, "device", &dev, &[]);
    let mut a0 = side(&cfg, "app", &apps[0], &[]);
    wait_for("app 0 joined", WAIT, || {
        d.stderr_now().contains("(split slot 0)")
    });
    let mut a1 = side(&cfg, "app", &apps[1], &[]);
    wait_for("app 1 joined", WAIT, || {
        d.stderr_now().contains("(split slot 1)")
    });
    d.kill();
    a0.pause();
    let d = side(&cfg, "device", &dev, &[]);
    wait_for("app 1 joined the new run", WAIT, || {
        d.stderr_now().contains("(split slot 1)")
    });
    a0.resume();
    wait_for("app 0 joined the new run", WAIT, || {
        d.stderr_now().contains("(split slot 0)")
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(a0.running(), "app 0 ended: {}", a0.stderr_now());
    assert!(a1.running(), "app 1 ended: {}", a1.stderr_now());
    drop((a0, a1, d));
}

#[test]
fn an_app_side_told_to_stop_hands_over_what_it_holds_and_its_sinks_report() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-stop");
    let nats = Nats::start("stop", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let cfg = fan_config(
        &dir.0,
        "stop",
        &nats.url(),
        1,
        r#"
[[stream]]
name = "s"
direction = "device-to-app"
source = { type = "synthetic", size = 50, interval_ms = 5.0, seed = 4 }
sink = { type = "check", seed = 4, size = 50 }
"#,
    );
    let d = side(&cfg, "device", &dev, &[]);
    let a = side(&cfg, "app", &apps[0], &["--stats"]);
    // Its live lines name the device as its `known_peers` does.
    wait_for("frames to flow", WAIT, || {
        a.stderr_now().contains("[app@device] s ")
    });
    a.terminate();
    let (s, _, err) = a.finish();
    assert!(s.success(), "{err}");
    assert!(
        err.contains("stream \"s\": check:") && err.contains("0 missing, 0 duplicate"),
        "{err}"
    );
    drop(d);
}

/// `ndd untrust` of an app side that holds the group key: the device draws a new key at once
/// and says so, the app side still trusted follows it (joining again by itself) and loses no
/// stored frame across the change, the untrusted one is refused when it asks and ends with
/// the reason; it never gets the new key.
#[test]
fn untrusting_an_app_side_rotates_the_group_key_and_the_others_follow_without_loss() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-rotate");
    let nats = Nats::start("rotate", &[]);
    let (dev, apps) = homes_n(&dir.0, 2);
    let n = 2000u64;
    let cfg = fan_config(
        &dir.0,
        "rotate",
        &nats.url(),
        2,
        &format!(
            r#"
[[stream]]
name = "s"
direction = "device-to-app"
source = {{ type = "synthetic", size = 200, interval_ms = 3.0, count = {n}, seed = 4 }}
sink = {{ type = "check", seed = 4, size = 200, expect = {n} }}
"#
        ),
    );
    let keep = side(&cfg, "app", &apps[0], &["--once"]);
    let mut gone = side(&cfg, "app", &apps[1], &["--once"]);
    let d = side(&cfg, "device", &dev, &["--once"]);
    wait_for("both app sides to join", WAIT, || {
        d.stderr_now().matches("joined").count() >= 2
    });
    let key_file = dev.join("nats-group-ndd-rotate.key");
    let old_key = std::fs::read(&key_file).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let out = ok(ndd().args(["untrust", "app1", "--home"]).arg(&dev));
    assert!(out.starts_with("no longer trusted: SHA256:"), "{out}");
    wait_for("the untrusted app side to end", WAIT, || !gone.running());
    let (gs, _, gerr) = gone.finish();
    assert!(
        !gs.success(),
        "the untrusted app side ends with an error: {gerr}"
    );
    assert!(
        gerr.contains("no longer admits this side")
            && gerr.contains("is not trusted by the device side"),
        "it is told why: {gerr}"
    );
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(
        derr.contains("rotated the group key: SHA256:")
            && derr.contains("held it and is no longer trusted"),
        "the device says it rotated the key: {derr}"
    );
    assert_ne!(
        std::fs::read(&key_file).unwrap(),
        old_key,
        "a new key is on disk"
    );
    let (ks, _, kerr) = keep.finish();
    assert!(ks.success(), "app 0: {kerr}");
    assert!(
        kerr.contains("the device side rotated its group key; this side has the new one"),
        "{kerr}"
    );
    // The device's notice is signed and checks out (a forged one is warned about).
    assert!(!kerr.contains("ignored a rekey notice"), "{kerr}");
    // A rotation is no alarm: frames under the new key wait for it, none is warned about.
    assert!(!kerr.contains("failed authentication"), "{kerr}");
    assert!(!kerr.contains("opens under no group key"), "{kerr}");
    assert!(
        kerr.contains(&check_ok("s", n)),
        "nothing lost across the rotation: {kerr}"
    );
}

/// Many app sides feeding one app → device stream: every app side's frames reach the device,
/// each once and in its order (their frames interleave on the one subject, each app side
/// sealing under its own epoch of the group key).
#[test]
fn four_app_sides_feed_one_device_stream_without_loss() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-fan-in");
    let nats = Nats::start("fan-in", &[]);
    let (dev, apps) = homes_n(&dir.0, 4);
    let m = 300u64;
    let out = dir.0.join("in.bin");
    let cfg = |i: usize, count: u64| {
        let file = format!("in{i}.toml");
        let source = (100, 3.0, count, 10 + i as u64);
        stream_to_file_as(
            &dir.0,
            &file,
            "fanin",
            &nats.url(),
            "app-to-device",
            source,
            &out,
        )
    };
    let d = side(&cfg(0, m), "device", &dev, &[]);
    wait_for("the device side to serve", WAIT, || {
        d.stderr_now().contains("serving app sides")
    });
    let sides: Vec<Side> = (0..4)
        .map(|i| side(&cfg(i, m), "app", &apps[i], &["--once"]))
        .collect();
    for s in sides {
        let (st, _, err) = s.finish();
        assert!(st.success(), "app side: {err}");
    }
    // Every frame is stored; the device's sink takes them in.
    wait_for("every frame at the device", WAIT, || {
        complete_frames(&out) as u64 >= 4 * m
    });
    d.terminate();
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    let got = seeded_frames_in(&out, &[10, 11, 12, 13], m);
    assert_eq!(got.len() as u64, 4 * m, "no frame more: {derr}");
    for seed in 10..=13u64 {
        let seqs: Vec<u64> = got.iter().filter(|f| f.0 == seed).map(|f| f.1).collect();
        let (next, dups, lost) = order(seqs.iter().copied());
        assert!(
            next == m && dups == 0 && lost.is_empty(),
            "app side with seed {seed}: up to {next}, {dups} twice, lost {lost:?}; device: {derr}"
        );
    }
    assert!(!derr.contains("replayed frame dropped"), "{derr}");
}

/// App → device frames across a key rotation: those sealed under the old key that the device
/// had not read when it rotated still open (they were stored before it), and those a trusted
/// app side sealed under the old key after it are published again under the new key; the
/// revoked app side's frames after the rotation open nowhere.
#[test]
fn app_to_device_frames_cross_a_key_rotation_without_loss() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-rotate-up");
    let nats = Nats::start("rotate-up", &[]);
    let (dev, apps) = homes_n(&dir.0, 2);
    let m = 1500u64;
    let out = dir.0.join("up.bin");
    let cfg = |file: &str, seed: u64, count: u64, interval: f64| {
        let source = (200, interval, count, seed);
        stream_to_file_as(
            &dir.0,
            file,
            "rotup",
            &nats.url(),
            "app-to-device",
            source,
            &out,
        )
    };
    let keep_cfg = cfg("keep.toml", 5, m, 3.0);
    let gone_cfg = cfg("gone.toml", 6, 1_000_000, 20.0);
    let d = side(&keep_cfg, "device", &dev, &["--once"]);
    wait_for("the device side to serve", WAIT, || {
        d.stderr_now().contains("serving app sides")
    });
    let keep = side(&keep_cfg, "app", &apps[0], &["--once"]);
    let mut gone = side(&gone_cfg, "app", &apps[1], &["--once"]);
    wait_for("both app sides to join", WAIT, || {
        d.stderr_now().matches("joined").count() >= 2
    });
    std::thread::sleep(Duration::from_millis(1500));
    let said = ok(ndd().args(["untrust", "app1", "--home"]).arg(&dev));
    assert!(said.starts_with("no longer trusted: SHA256:"), "{said}");
    wait_for("the untrusted app side to end", WAIT, || !gone.running());
    let (gs, _, gerr) = gone.finish();
    assert!(
        !gs.success(),
        "the untrusted app side ends with an error: {gerr}"
    );
    let (ks, _, kerr) = keep.finish();
    assert!(ks.success(), "app 0: {kerr}");
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(derr.contains("rotated the group key"), "{derr}");
    // Frames under the old key stored after the rotation are expected (published again):
    // no warning.
    assert!(!derr.contains("failed authentication"), "{derr}");
    assert!(!derr.contains("opens under no group key"), "{derr}");
    let got = seeded_frames_in(&out, &[5, 6], m);
    let kept: Vec<u64> = got.iter().filter(|f| f.0 == 5).map(|f| f.1).collect();
    let (next, dups, lost) = order(kept.iter().copied());
    assert_eq!(
        next, m,
        "every frame of the trusted app side up to the last"
    );
    assert!(lost.is_empty(), "frames lost across the rotation: {lost:?}");
    assert_eq!(dups, 0, "no frame twice");
    let theirs = got.iter().filter(|f| f.0 == 6).count();
    assert!(
        theirs > 0,
        "the other app side's frames came too before the rotation"
    );
    println!("frames of the revoked app side before the rotation: {theirs}; again: {kerr}");
}

/// `name` in `dir`: driver `screen` on the NATS server at `url`: `camera-sim` (640×480, 30 fps,
/// then `count`, e.g. `, count = 150`) → `image` in broadcast (keyframes every 500 ms) →
/// `multiplex` all → a `y4m` sink writing the existing (emptied) file `y4m`. No lossless
/// refinement (`refine_ms = 0`): on a busy machine the camera may pause longer than
/// `refine_ms`, and the refinement would show a picture again.
fn screen_config(dir: &Path, name: &str, url: &str, count: &str, y4m: &Path) -> PathBuf {
    std::fs::write(y4m, b"").unwrap();
    write(
        dir,
        name,
        &format!(
            "driver = \"screen\"\n{}\n[[stream]]\nname = \"screen\"\ndirection = \"device-to-app\"\nsource = {{ type = \"camera-sim\", width = 640, height = 480, fps = 30{count} }}\nstack = [{{ type = \"image\", quality = \"high\", keyframe_ms = 500, refine_ms = 0 }}, {{ type = \"multiplex\", mode = \"all\" }}]\nsink = {{ type = \"y4m\", path = \"{}\", fps = 30 }}\n",
            link(url, 1),
            y4m.display()
        ),
    )
}

/// The luma plane of a 640×480 picture, and a whole picture in a C420jpeg `y4m` stream (its
/// `FRAME` line, then Y, U and V).
const LUMA: usize = 640 * 480;
const PICTURE: usize = 6 + LUMA * 3 / 2;

/// Pictures a `y4m` sink has written whole to the regular file `path` so far (640×480
/// C420jpeg: a `FRAME` line and 460 800 bytes each, after the header line): how far a screen
/// stream has come, for tests that wait on that and not on the clock.
fn y4m_pictures(path: &Path) -> usize {
    let len = std::fs::metadata(path).map_or(0, |m| m.len() as usize);
    let header = std::fs::File::open(path)
        .ok()
        .and_then(|f| {
            let mut line = String::new();
            BufReader::new(f.take(200)).read_line(&mut line).ok()?;
            line.ends_with('\n').then_some(line.len())
        })
        .unwrap_or(len);
    len.saturating_sub(header) / PICTURE
}

/// The frame numbers of the pictures written whole to the `y4m` file `path` so far, read from
/// their luma planes as `frame_numbers` reads ffmpeg's output: where a stream has come to,
/// picture by picture, while it is written.
fn y4m_numbers(path: &Path) -> Vec<u32> {
    let bytes = std::fs::read(path).unwrap_or_default();
    let Some(header) = bytes.iter().position(|&b| b == b'\n') else {
        return Vec::new();
    };
    bytes[header + 1..]
        .chunks_exact(PICTURE)
        .filter_map(|p| ndd_endpoint::camera::pattern::read_number(&p[6..6 + LUMA], 640))
        .collect()
}

/// A device side whose source is a blocking task (`x11-screen` polls its X connection on a
/// thread of its own; aborting the task does not stop it) stops when told: its stream's END
/// reaches the app side, whose sink then ends with `--once`. (Before, the device side waited
/// 2 s for the stream to end, gave up and left without the END: the app side waited on.)
#[test]
fn a_device_side_with_an_x11_screen_stops_when_told_and_says_end() {
    if !nats_or_skip() {
        return;
    }
    if let Some(m) = missing(&["Xvfb"]) {
        println!("SKIPPED: needs {m} (apt-get install xvfb)");
        return;
    }
    let x = Xvfb::start("320x240x24").expect("start Xvfb");
    let dir = Dir::new("nats-x11-stop");
    let nats = Nats::start("x11-stop", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let cfg = write(
        &dir.0,
        "x.toml",
        &format!(
            "driver = \"xstop\"\n{}\n[[stream]]\nname = \"screen\"\ndirection = \"device-to-app\"\n\
             source = {{ type = \"x11-screen\", display = \"{}\" }}\n\
             stack = [{{ type = \"image\", keyframe_ms = 500 }}, {{ type = \"multiplex\", mode = \"all\" }}]\n\
             sink = {{ type = \"null\" }}\n",
            link(&nats.url(), 1),
            x.display
        ),
    );
    let d = side(&cfg, "device", &dev, &[]);
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    a.wait_says("streams agreed", &[&d]);
    // A keyframe or two on their way.
    std::thread::sleep(Duration::from_millis(1200));
    d.terminate();
    let (as_, _, aerr) = a.finish();
    assert!(as_.success(), "app: {aerr}");
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
}

/// One screen to many app sides: `camera-sim` → `image` in broadcast (`keyframe_ms`) →
/// `multiplex` all → JetStream → `y4m` files read by an unmodified ffmpeg. The app side there
/// from the start shows every picture; one that joins 1.5 s later starts at the next keyframe
/// and shows every picture from there on, in order (the frame number in each picture read back).
#[test]
fn a_screen_broadcast_reaches_an_app_side_that_joins_late_from_its_next_keyframe() {
    if !nats_or_skip() {
        return;
    }
    if let Some(m) = missing(&["ffmpeg"]) {
        println!("SKIPPED: needs {m} (apt-get install ffmpeg)");
        return;
    }
    let dir = Dir::new("nats-screen");
    let nats = Nats::start("screen", &[]);
    let (dev, apps) = homes_n(&dir.0, 2);
    let config =
        |name: &str, y4m: &Path| screen_config(&dir.0, name, &nats.url(), ", count = 240", y4m);
    let (ya, yb) = (dir.0.join("a.y4m"), dir.0.join("b.y4m"));
    let (ca, cb) = (config("a.toml", &ya), config("b.toml", &yb));
    let a = side(&ca, "app", &apps[0], &["--once"]);
    let d = side(&ca, "device", &dev, &["--once"]);
    // The second app side joins once the first has shown a second of pictures (past the first
    // keyframe at 500 ms), with 7 s of pictures still to come.
    wait_for("a second of pictures at the first app side", WAIT, || {
        y4m_pictures(&ya) >= 30
    });
    let b = side(&cb, "app", &apps[1], &["--once"]);
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    let (sa, _, aerr) = a.finish();
    let (sb, _, berr) = b.finish();
    assert!(sa.success() && sb.success(), "app a: {aerr}\napp b: {berr}");
    let (out, first) = frame_numbers(&ya, &dir.0.join("a.strip"), None, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(first, (0..240).map(Some).collect::<Vec<_>>(), "app a");
    let (out, late) = frame_numbers(&yb, &dir.0.join("b.strip"), None, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from = late
        .first()
        .copied()
        .flatten()
        .expect("app b showed no picture");
    println!("app b started at frame {from}");
    assert!(
        (30..230).contains(&from),
        "app b joined late: started at {from}"
    );
    assert_eq!(
        late,
        (from..240).map(Some).collect::<Vec<_>>(),
        "app b: every picture from its first keyframe on, in order"
    );
}

/// A viewer of a broadcast screen that stops and comes back shows the screen as it is then,
/// from the next keyframe, not a replay of what it missed: its durable consumer starts at
/// what is stored after it joined again, not where it stopped.
#[test]
fn a_viewer_back_on_a_broadcast_screen_shows_the_screen_now() {
    if !nats_or_skip() {
        return;
    }
    if let Some(m) = missing(&["ffmpeg"]) {
        println!("SKIPPED: needs {m} (apt-get install ffmpeg)");
        return;
    }
    let dir = Dir::new("nats-screen-back");
    let nats = Nats::start("screen-back", &[]);
    let (dev, apps) = homes_n(&dir.0, 2);
    let (y1, y2, yw) = (
        dir.0.join("1.y4m"),
        dir.0.join("2.y4m"),
        dir.0.join("watch.y4m"),
    );
    let c1 = screen_config(&dir.0, "1.toml", &nats.url(), ", count = 600", &y1);
    let c2 = screen_config(&dir.0, "2.toml", &nats.url(), ", count = 600", &y2);
    let cw = screen_config(&dir.0, "watch.toml", &nats.url(), ", count = 600", &yw);
    let a = side(&c1, "app", &apps[0], &[]);
    // A second viewer that stays: how far the screen has come, in pictures.
    let w = side(&cw, "app", &apps[1], &["--once"]);
    let d = side(&c1, "device", &dev, &["--once"]);
    wait_for("a second of pictures at the viewer", WAIT, || {
        y4m_pictures(&y1) >= 30
    });
    a.terminate();
    let (sa, _, aerr) = a.finish();
    assert!(sa.success(), "app, first run: {aerr}");
    let shown = y4m_pictures(&y1);
    // Away for 90 pictures (3 s) of the staying viewer's, then back with the same identity
    // (its consumer).
    let watched = y4m_pictures(&yw);
    wait_for("90 more pictures at the staying viewer", WAIT, || {
        y4m_pictures(&yw) >= watched + 90
    });
    // (600 pictures: 20 s of screen, so the device still runs when the viewer comes back on a
    // loaded machine, where the staying viewer can fall seconds behind the device; with 360
    // the device had ended twice in CI-like runs beside the cluster test.)
    // Where the staying viewer is as the other comes back (its picture number, read from its
    // file afterwards): the screen now, or later, is what the one coming back must show.
    let back_at = y4m_pictures(&yw);
    let b = side(&c2, "app", &apps[0], &["--once"]);
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    let (sb, _, berr) = b.finish();
    assert!(sb.success(), "app, second run: {berr}");
    let (sw, _, werr) = w.finish();
    assert!(sw.success(), "staying viewer: {werr}");
    let (_, first) = frame_numbers(&y1, &dir.0.join("1.strip"), None, None);
    assert!(
        first.len() >= shown,
        "{} pictures, {shown} seen",
        first.len()
    );
    let (out, second) = frame_numbers(&y2, &dir.0.join("2.strip"), None, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stopped = first
        .iter()
        .flatten()
        .max()
        .copied()
        .expect("pictures before the stop");
    let from = second
        .first()
        .copied()
        .flatten()
        .expect("pictures after coming back");
    let (_, staying) = frame_numbers(&yw, &dir.0.join("watch.strip"), None, None);
    let now = staying
        .get(back_at.saturating_sub(1))
        .copied()
        .flatten()
        .expect("the staying viewer's picture as the other came back");
    println!(
        "stopped at picture {stopped}, came back at {from}; the staying viewer showed {now} then"
    );
    // (Measured on the staying viewer, not as `stopped + 90`: it may lag the one that stopped
    // by a few pictures; CI once had stopped 30, back at 119.)
    assert!(
        now >= stopped + 30,
        "the staying viewer showed picture {now} as the other came back, not 90 of its pictures after {stopped}"
    );
    assert!(
        from >= now,
        "came back at picture {from}, before the screen the staying viewer already showed ({now}); it stopped at {stopped}"
    );
    assert_eq!(
        second,
        (from..600).map(Some).collect::<Vec<_>>(),
        "every picture from there on, in order\nAPP2 {berr}\nDEV {derr}"
    );
}

/// A device side started twice on one driver is refused (both would publish on its subjects,
/// and every app side would get two runs interleaved); once the first is gone, the next one
/// starts.
#[test]
fn a_second_device_side_on_the_same_driver_is_refused() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-two-devices");
    let nats = Nats::start("two-devices", &[]);
    let (dev, _) = homes_n(&dir.0, 1);
    let cfg = ticker(&dir.0, "twice", &nats.url(), 0);
    let first = side(&cfg, "device", &dev, &[]);
    wait_for("the first device side serves", WAIT, || {
        first
            .stderr_now()
            .contains("serving app sides through NATS")
    });
    let out = run_cmd(&cfg, "device", &dev, &["--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("another device side is already serving driver \"twice\" through this NATS server (run "),
        "{err}"
    );
    assert!(err.contains("stop it first"), "{err}");
    first.terminate();
    drop(first.finish());
    let again = side(&cfg, "device", &dev, &[]);
    wait_for("a device side after the first stopped", WAIT, || {
        again
            .stderr_now()
            .contains("serving app sides through NATS")
    });
}

/// An app side whose device side never comes ends at its `--duration`, saying so, as a direct
/// link's side with no peer does (it waited for good, found by hand).
#[test]
fn an_app_side_with_no_device_side_ends_at_its_duration() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-no-device");
    let nats = Nats::start("no-device", &[]);
    let (_, apps) = homes_n(&dir.0, 1);
    let cfg = ticker(&dir.0, "alone", &nats.url(), 0);
    // (Bounded: a side that does not end fails the test with what it said.)
    let (status, _, err) = side(&cfg, "app", &apps[0], &["--duration", "2"]).finish();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("no device side admitted this side within --duration"),
        "{err}"
    );
}

/// A side whose server went away stops when told (SIGTERM), saying what may not have gone;
/// before, its last flush waited for the server to come back, for good.
#[test]
fn a_side_whose_server_is_gone_stops_when_told() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-server-gone");
    let mut nats = Nats::start("server-gone", &[]);
    let (dev, _) = homes_n(&dir.0, 1);
    let cfg = ticker(&dir.0, "gone", &nats.url(), 0);
    let device = side(&cfg, "device", &dev, &[]);
    device.wait_says("serving app sides through NATS", &[]);
    nats.kill();
    device.wait_says("lost the NATS server", &[]);
    device.terminate();
    // (Bounded: a side that does not end fails the test with what it said.)
    let (status, _, err) = device.finish();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("may not have reached the NATS server: the server did not take it within 2 s"),
        "{err}"
    );
}

/// A device side that dies and comes back: an app side's pairs start afresh with the new run
/// (an `image` inverse would otherwise refuse its frames: `credit number did not increase`),
/// and the pictures go on, readable, numbered from the new run's start.
#[test]
fn an_app_side_follows_a_restarted_device_side_with_fresh_pairs() {
    if !nats_or_skip() {
        return;
    }
    if let Some(m) = missing(&["ffmpeg"]) {
        println!("SKIPPED: needs {m} (apt-get install ffmpeg)");
        return;
    }
    let dir = Dir::new("nats-device-restart");
    let nats = Nats::start("device-restart", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let y4m = dir.0.join("a.y4m");
    let cfg = screen_config(&dir.0, "restart.toml", &nats.url(), "", &y4m);
    let a = side(&cfg, "app", &apps[0], &[]);
    let d = side(&cfg, "device", &dev, &[]);
    wait_for("30 pictures of the first run", WAIT, || {
        y4m_pictures(&y4m) >= 30
    });
    drop(d.kill());
    let d = side(&cfg, "device", &dev, &[]);
    wait_for("the app side follows the new run", WAIT, || {
        a.stderr_now()
            .contains("the device side restarted; this stream's pairs start afresh")
    });
    // Pictures of the new run: those after the number drops back (the old run's last ones may
    // still be on their way after the app side has heard of the new run).
    wait_for("30 pictures of the new run", WAIT, || {
        let n = y4m_numbers(&y4m);
        (1..n.len())
            .find(|&i| n[i] < n[i - 1])
            .is_some_and(|i| n.len() - i >= 30)
    });
    drop(d.kill());
    let err = a.kill();
    assert!(!err.contains("credit number did not increase"), "{err}");
    assert!(!err.contains("frame dropped"), "{err}");
    let (out, numbers) = frame_numbers(&y4m, &dir.0.join("a.strip"), None, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let numbers: Vec<u32> = numbers
        .into_iter()
        .map(|n| n.expect("every picture readable"))
        .collect();
    // One drop back to a new start, rising runs on either side.
    let back: Vec<usize> = (1..numbers.len())
        .filter(|&i| numbers[i] < numbers[i - 1])
        .collect();
    assert_eq!(back.len(), 1, "one restart: {numbers:?}");
    let i = back[0];
    assert!(i >= 20 && numbers.len() - i >= 20, "{numbers:?}");
    assert!(
        numbers[i..].windows(2).all(|w| w[1] == w[0] + 1),
        "the new run's pictures in order: {numbers:?}"
    );
}

/// Anyone who may publish on the server could send a rekey notice and make every app side join
/// again: notices are signed by the device side. A forged one (and a second, within the
/// warning's 10 s) is ignored with one warning, and frames go on.
#[test]
fn a_forged_rekey_notice_is_ignored_with_a_warning() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-forged-rekey");
    let nats = Nats::start("forged-rekey", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let cfg = ticker(&dir.0, "forged", &nats.url(), 1);
    let d = side(&cfg, "device", &dev, &[]);
    let a = side(&cfg, "app", &apps[0], &["--stats"]);
    wait_for("frames to flow", WAIT, || a.stderr_now().contains("] s "));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", nats.port)).unwrap();
    s.write_all(
        b"CONNECT {\"verbose\":false}\r\nPUB ndd.forged.rekey 5\r\nrekey\r\nPUB ndd.forged.rekey 5\r\nrekey\r\nPING\r\n",
    )
    .unwrap();
    wait_for("the app side's warning", WAIT, || {
        a.stderr_now()
            .contains("ignored a rekey notice: not a signed notice of this driver")
    });
    // A forged frame on the stream's subject (a record header, then bytes no key opens):
    // dropped with one warning that says what it is.
    let mut forged = b"PUB ndd.forged.d.1 100\r\n".to_vec();
    let mut body = vec![0x5au8; 100];
    body[..44].fill(0);
    body[1] = 1;
    // It names a newer device run than the one going (an earlier one is refused unopened).
    body[4..12].fill(0xff);
    forged.extend_from_slice(&body);
    forged.extend_from_slice(b"\r\nPING\r\n");
    s.write_all(&forged).unwrap();
    wait_for(
        "the app side's warning about the forged frame",
        WAIT,
        || {
            a.stderr_now()
                .contains("dropped a frame that opens under no group key")
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    let err = a.kill();
    assert_eq!(err.matches("ignored a rekey notice").count(), 1, "{err}");
    assert!(!err.contains("rotated its group key"), "{err}");
    assert_eq!(err.matches("opens under no group key").count(), 1, "{err}");
    // The half's own warning is not repeated beside it.
    assert!(!err.contains("failed authentication"), "{err}");
    drop(d);
}

/// Anyone who may publish on the server can put garbage on a stream's subject at line rate:
/// the app side says so at most five times a second, and a later line says how many such
/// lines it held back (issue 31 item 5); frames keep flowing.
#[test]
fn garbage_on_a_streams_subject_at_line_rate_is_five_lines_a_second() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-garbage");
    let nats = Nats::start("garbage", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let cfg = ticker(&dir.0, "garbage", &nats.url(), 1);
    let d = side(&cfg, "device", &dev, &[]);
    let a = side(&cfg, "app", &apps[0], &["--stats"]);
    wait_for("frames to flow", WAIT, || a.stderr_now().contains("] s "));
    let mut s = std::net::TcpStream::connect(("127.0.0.1", nats.port)).unwrap();
    s.write_all(b"CONNECT {\"verbose\":false}\r\n").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let batch = b"PUB ndd.garbage.d.1 3\r\nabc\r\n".repeat(100);
    let what = "dropped a NATS message shorter than a frame record";
    let counted = |err: &str| {
        err.lines()
            .any(|l| l.contains(what) && l.contains("suppressed=") && !l.contains("suppressed=0"))
    };
    let started = std::time::Instant::now();
    let mut sent = 0;
    while !counted(&a.stderr_now()) {
        assert!(started.elapsed() < Duration::from_secs(10), "no count");
        s.write_all(&batch).unwrap();
        // The server has taken the batch before the next one.
        s.write_all(b"PING\r\n").unwrap();
        let mut line = String::new();
        while !line.starts_with("PONG") {
            line.clear();
            r.read_line(&mut line).unwrap();
        }
        sent += 100;
    }
    let secs = started.elapsed().as_secs_f64().ceil() as usize;
    let err = a.kill();
    let lines = err.matches(what).count();
    assert!(lines <= 5 * (secs + 1), "{sent} sent, {lines} lines: {err}");
    drop(d);
}

/// Anyone who may publish on the server could answer a device side's "is anyone serving this
/// driver?" and keep it from starting (issue 31: an unsigned answer stopped a device side after
/// 4.9 s, the attacker's escape codes printed raw). Answers are signed notes now: an unsigned
/// one is ignored with one warning, its text escaped, and the device side serves.
#[test]
fn an_unsigned_answer_on_the_device_subject_does_not_stop_a_device_side() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-forged-claim");
    let nats = Nats::start("forged-claim", &[]);
    let (dev, _) = homes_n(&dir.0, 1);
    let cfg = ticker(&dir.0, "claimed", &nats.url(), 0);
    // The attacker: answers every question on the subject, at once and again and again.
    let answering = answer_every_question(
        nats.port,
        "ndd.claimed.device",
        b"evil\x1b[2J\x1b[31m\nndd: error: forged".to_vec(),
    );
    let d = side(&cfg, "device", &dev, &[]);
    wait_for("the device side serves", WAIT, || {
        d.stderr_now().contains("serving app sides through NATS")
    });
    let err = d.kill();
    assert!(!err.contains("already serving"), "{err}");
    assert_eq!(
        err.matches("ignored an answer on ndd.claimed.device: not a signed claim of a device side")
            .count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("evil\\u{1b}[2J\\u{1b}[31m\\nndd: error: forged"),
        "{err}"
    );
    assert!(!err.contains('\x1b'), "{err}");
    drop(nats);
    assert!(answering.join().unwrap() >= 1);
}

/// Raw NATS on `port`: answers every message on `subject` that has a reply subject with
/// `payload`, until the server goes; how many it answered.
fn answer_every_question(
    port: u16,
    subject: &str,
    payload: Vec<u8>,
) -> std::thread::JoinHandle<usize> {
    answer_with(port, subject, move |_| Some(payload.clone()))
}

/// Raw NATS on `port`: answers each message on `subject` that has a reply subject with what
/// `answer` makes of its payload (nothing for `None`), until the server goes; how many it
/// answered.
fn answer_with(
    port: u16,
    subject: &str,
    answer: impl Fn(&[u8]) -> Option<Vec<u8>> + Send + 'static,
) -> std::thread::JoinHandle<usize> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(format!("CONNECT {{\"verbose\":false}}\r\nSUB {subject} 1\r\nPING\r\n").as_bytes())
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    while !line.starts_with("PONG") {
        line.clear();
        r.read_line(&mut line).unwrap();
    }
    std::thread::spawn(move || {
        let mut line = String::new();
        let mut answered = 0;
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            // MSG <subject> <sid> [<reply>] <len>
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.first() == Some(&"MSG") && (w.len() == 4 || w.len() == 5) {
                let n: usize = w[w.len() - 1].parse().unwrap();
                let mut body = vec![0; n + 2];
                if r.read_exact(&mut body).is_err() {
                    break;
                }
                body.truncate(n);
                if let (5, Some(payload)) = (w.len(), answer(&body)) {
                    let mut pubmsg = format!("PUB {} {}\r\n", w[3], payload.len()).into_bytes();
                    pubmsg.extend_from_slice(&payload);
                    pubmsg.extend_from_slice(b"\r\n");
                    if s.write_all(&pubmsg).is_err() {
                        break;
                    }
                    answered += 1;
                }
            }
            line.clear();
        }
        answered
    })
}

/// Raw NATS on `port`: asks on `subject` with `question` and returns the first answer.
fn ask(port: u16, subject: &str, question: &[u8]) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut msg = format!(
        "CONNECT {{\"verbose\":false}}\r\nSUB _INBOX.rec 1\r\nPUB {subject} _INBOX.rec {}\r\n",
        question.len()
    )
    .into_bytes();
    msg.extend_from_slice(question);
    msg.extend_from_slice(b"\r\n");
    s.write_all(&msg).unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("an answer");
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() == Some(&"MSG") {
            let n: usize = w.last().unwrap().parse().unwrap();
            let mut body = vec![0; n + 2];
            r.read_exact(&mut body).unwrap();
            body.truncate(n);
            return body;
        }
    }
}

/// Anyone who may publish on the server can answer an app side's join with a reply signed
/// by an identity of its own, before the device side does: the app side leaves it aside and
/// joins the device side it trusts. Before, the first such answer ended the app side
/// ("refused untrusted device side").
#[test]
fn a_join_answered_first_by_a_stranger_still_joins_the_trusted_device_side() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-stranger-reply");
    let nats = Nats::start("stranger-reply", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let m = 200u64;
    let out = dir.0.join("down.bin");
    let cfg = stream_to_file_as(
        &dir.0,
        "stranger.toml",
        "stranger",
        &nats.url(),
        "device-to-app",
        (100, 5.0, m, 12),
        &out,
    );
    // The stranger: an identity of its own, answering every INIT at once.
    let home = dir.0.join("stranger");
    std::fs::create_dir_all(&home).unwrap();
    let (id, _) = ndd_link::Identity::load_or_create(&home).unwrap();
    let me = ndd_link::seal::LocalIdentity::new(&id).unwrap();
    let host = std::sync::Mutex::new(ndd_link::nats::join::Host::new(Duration::from_secs(10)));
    let answering = answer_with(nats.port, "ndd.stranger.join", move |msg| {
        (ndd_link::nats::join::message_type(msg) == Some(1)).then(|| {
            host.lock()
                .unwrap()
                .handle_init(std::time::Instant::now(), &me, msg)
                .unwrap()
        })
    });
    let d = side(&cfg, "device", &dev, &["--once"]);
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    let (s, _, aerr) = a.finish();
    assert!(s.success(), "app: {aerr}");
    drop(d);
    let got = seeded_frames_in(&out, &[12], m);
    assert_eq!(order(got.iter().map(|f| f.1)).0, m, "every frame: {aerr}");
    drop(nats);
    assert!(answering.join().unwrap() >= 1, "the stranger answered");
}

/// Anyone who may publish can store messages on the driver's JetStream subjects with the
/// message ids a source's next publishes would carry (JetStream drops a publish whose id it
/// holds, on any of the stream's subjects). With ids as they were (`run-stream-frame-part`,
/// all readable in every record's header) the genuine frames were dropped as copies; the ids
/// are keyed now, and the stream is exact.
#[test]
fn messages_stored_under_predicted_ids_drop_no_genuine_frame() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-squat");
    let nats = Nats::start("squat", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let m = 600u64;
    let out = dir.0.join("down.bin");
    let cfg = stream_to_file_as(
        &dir.0,
        "squat.toml",
        "squat",
        &nats.url(),
        "device-to-app",
        (100, 5.0, m, 13),
        &out,
    );
    // The squatter reads a record's header off the wire and stores junk under the ids of the
    // frames to come, as the ids were made before.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", nats.port)).unwrap();
    s.write_all(b"CONNECT {\"verbose\":false,\"headers\":true}\r\nSUB ndd.squat.r.> 1\r\nPING\r\n")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let d = side(&cfg, "device", &dev, &["--once"]);
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    let mut line = String::new();
    let header = loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "the server closed");
        if line.starts_with("PING") {
            s.write_all(b"PONG\r\n").unwrap();
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() == Some(&"MSG") || w.first() == Some(&"HMSG") {
            let n: usize = w.last().unwrap().parse().unwrap();
            let mut body = vec![0; n + 2];
            r.read_exact(&mut body).unwrap();
            let skip = if w[0] == "HMSG" {
                w[w.len() - 2].parse().unwrap()
            } else {
                0
            };
            body.truncate(n);
            if let Some(rec) =
                ndd_link::nats::record::FrameRecord::parse(&body[skip..].to_vec().into())
            {
                break rec;
            }
        }
    };
    let mut junk = Vec::new();
    for seq in header.seq + 5..m + 5 {
        let h = format!(
            "NATS/1.0\r\nNats-Msg-Id: {:x}-{}-{seq}-\r\n\r\n",
            header.run, header.stream
        );
        junk.extend_from_slice(
            format!(
                "HPUB ndd.squat.r.junk {} {}\r\n{h}x\r\n",
                h.len(),
                h.len() + 1
            )
            .as_bytes(),
        );
    }
    s.write_all(&junk).unwrap();
    s.write_all(b"PING\r\n").unwrap();
    let (st, _, aerr) = a.finish();
    assert!(st.success(), "app: {aerr}");
    drop(d);
    let got = seeded_frames_in(&out, &[13], m);
    let (next, dups, lost) = order(got.iter().map(|f| f.1));
    assert_eq!(next, m, "every frame: {aerr}");
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert_eq!(dups, 0);
}

/// Every JetStream consumer of the driver deleted mid-stream (by anyone with the JetStream
/// API, or a status on a pull's inbox saying so): each side attaches again where it
/// acknowledged last, and the reliable stream is exact. Before, a sink took the end of its
/// consumer's messages for the stream's end and stopped for good.
#[test]
fn consumers_deleted_mid_stream_are_attached_again_and_nothing_is_lost() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-cdel");
    let nats = Nats::start("cdel", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let m = 1000u64;
    let out = dir.0.join("down.bin");
    let cfg = stream_to_file_as(
        &dir.0,
        "cdel.toml",
        "cdel",
        &nats.url(),
        "device-to-app",
        (100, 3.0, m, 11),
        &out,
    );
    let d = side(&cfg, "device", &dev, &["--once"]);
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    wait_for("frames to flow", WAIT, || {
        std::fs::metadata(&out).is_ok_and(|md| md.len() > 100 * 104)
    });
    let names =
        String::from_utf8_lossy(&ask(nats.port, "$JS.API.CONSUMER.NAMES.NDD_ndd_cdel", b""))
            .into_owned();
    let consumers: Vec<&str> = names
        .split('"')
        .skip_while(|w| *w != "consumers")
        .skip(1)
        .filter(|w| w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    assert!(!consumers.is_empty(), "{names}");
    for c in &consumers {
        // nats-server's file store can fail a delete racing its own writes ("unlinkat …:
        // directory not empty", code 500); the consumer is gone from the server by then or
        // goes on a second try, which then answers "consumer not found" (10014).
        let mut said = String::new();
        for attempt in 0..10 {
            said = String::from_utf8_lossy(&ask(
                nats.port,
                &format!("$JS.API.CONSUMER.DELETE.NDD_ndd_cdel.{c}"),
                b"",
            ))
            .into_owned();
            if said.contains("\"success\":true") || (attempt > 0 && said.contains("10014")) {
                break;
            }
            assert!(said.contains("\"code\":500"), "{said}");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            said.contains("\"success\":true") || said.contains("10014"),
            "{said}"
        );
    }
    let (s, _, aerr) = a.finish();
    assert!(s.success(), "app: {aerr}");
    assert!(
        aerr.contains("stopped delivering; attaching again"),
        "{aerr}"
    );
    drop(d);
    let got = seeded_frames_in(&out, &[11], m);
    let (next, dups, lost) = order(got.iter().map(|f| f.1));
    assert_eq!(
        next, m,
        "every frame up to the last ({consumers:?} deleted)"
    );
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert_eq!(dups, 0);
}

/// A device side's signed answer on `P.D.device`, recorded (anyone may ask the side serving)
/// and played to every question of a later device side once the first is gone, does not stop
/// it: the answer signs the question's random bytes.
#[test]
fn a_recorded_claim_played_to_a_later_device_side_does_not_stop_it() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-replayed-claim");
    let nats = Nats::start("replayed-claim", &[]);
    let (dev, _) = homes_n(&dir.0, 1);
    let cfg = ticker(&dir.0, "claimed", &nats.url(), 0);
    let first = side(&cfg, "device", &dev, &[]);
    wait_for("the first device side serves", WAIT, || {
        first
            .stderr_now()
            .contains("serving app sides through NATS")
    });
    let recorded = ask(nats.port, "ndd.claimed.device", &[9; 16]);
    assert!(!recorded.is_empty());
    first.kill();
    let answering = answer_every_question(nats.port, "ndd.claimed.device", recorded);
    let d = side(&cfg, "device", &dev, &[]);
    wait_for("the later device side serves", WAIT, || {
        d.stderr_now().contains("serving app sides through NATS")
    });
    let err = d.kill();
    assert!(!err.contains("already serving"), "{err}");
    assert!(
        err.contains("for another question (played again?)"),
        "{err}"
    );
    drop(nats);
    assert!(answering.join().unwrap() >= 1);
}

/// A lossy stream's END travels on core NATS, which may lose a message: it goes three times,
/// and an app side that outlives it says once that the device's source ended.
#[test]
fn a_lossy_streams_end_goes_three_times_and_an_app_side_says_it_once() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-lossy-end");
    let nats = Nats::start("lossy-end", &[]);
    let (dev, apps) = homes_n(&dir.0, 2);
    let cfg = fan_config(
        &dir.0,
        "lend",
        &nats.url(),
        2,
        r#"
[[stream]]
name = "s"
direction = "device-to-app"
reliability = "lossy"
source = { type = "synthetic", size = 100, interval_ms = 5.0, count = 100, seed = 3 }
sink = { type = "check", seed = 3, size = 100, expect = 100 }
"#,
    );
    let (spy, conn) = subscribe_raw(nats.port, "ndd.lend.d.1");
    let once = side(&cfg, "app", &apps[0], &["--once"]);
    let stays = side(&cfg, "app", &apps[1], &[]);
    let d = side(&cfg, "device", &dev, &["--once"]);
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    let (s, _, err) = once.finish();
    assert!(s.success(), "app under --once: {err}");
    assert!(err.contains(&check_ok("s", 100)), "{err}");
    wait_for("the other app side to see the end", WAIT, || {
        stays.stderr_now().contains("source of this stream ended")
    });
    std::thread::sleep(Duration::from_millis(500));
    let err = stays.kill();
    assert_eq!(
        err.matches("source of this stream ended").count(),
        1,
        "said once: {err}"
    );
    conn.shutdown(std::net::Shutdown::Both).unwrap();
    let ends = spy
        .join()
        .unwrap()
        .iter()
        .filter(|m| m.len() >= 28 && m[20..28] == [0xff; 8])
        .count();
    assert_eq!(ends, 3, "END records on the stream's subject");
}

/// Publishes `msgs` (subject, body) as a plain NATS client: what anyone who may publish on the
/// server can do with a recording.
fn replay_raw(port: u16, msgs: &[(String, Vec<u8>)]) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut out = b"CONNECT {\"verbose\":false}\r\n".to_vec();
    for (subject, body) in msgs {
        out.extend_from_slice(format!("PUB {subject} {}\r\n", body.len()).as_bytes());
        out.extend_from_slice(body);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"PING\r\n");
    s.write_all(&out).unwrap();
    let mut pong = [0u8; 64];
    let _ = s.read(&mut pong);
}

/// The group key outlives a device run, so anyone who may publish on the server could record
/// a run and play it into a later one (found by hostile testing: 1145 duplicate frames on an
/// app side's reliable stream; two recorded ENDs cut reliable streams short). Frames are
/// sealed under a key of their run and a run never goes back: everything recorded from both
/// runs, ENDs included, played in after the second one ended, delivers nothing more, and the
/// app side counts what it refused.
#[test]
fn a_recorded_run_played_into_a_later_one_delivers_nothing() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-replay");
    let nats = Nats::start("replay", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let (rel, lossy) = (dir.0.join("rel.bin"), dir.0.join("lossy.bin"));
    let n = 300u64;
    let cfg = fan_config(
        &dir.0,
        "replay",
        &nats.url(),
        1,
        &format!(
            r#"
[[stream]]
name = "rel"
direction = "device-to-app"
source = {{ type = "synthetic", size = 64, interval_ms = 4.0, count = {n}, seed = 21 }}
sink = {{ type = "file", path = "{}", framing = "length", append = true }}

[[stream]]
name = "lossy"
direction = "device-to-app"
reliability = "lossy"
source = {{ type = "synthetic", size = 64, interval_ms = 4.0, count = {n}, seed = 22 }}
sink = {{ type = "file", path = "{}", framing = "length", append = true }}
"#,
            rel.display(),
            lossy.display()
        ),
    );
    let a = side(&cfg, "app", &apps[0], &["--stats"]);
    let mut recorded = Vec::new();
    for run in 1..=2u64 {
        let (rec, conn) = record_raw(nats.port, "ndd.replay.>");
        let d = side(&cfg, "device", &dev, &["--once"]);
        let (ds, _, derr) = d.finish();
        assert!(ds.success(), "device run {run}: {derr}");
        wait_for("the run's reliable frames", WAIT, || {
            complete_frames(&rel) as u64 >= run * n
        });
        std::thread::sleep(Duration::from_millis(300));
        conn.shutdown(std::net::Shutdown::Both).unwrap();
        recorded.extend(rec.join().unwrap());
    }
    let restarts = a
        .stderr_now()
        .matches("the device side restarted; this stream's pairs start afresh")
        .count();
    let lossy_before = complete_frames(&lossy);
    let frames = recorded.iter().filter(|(s, _)| s.contains(".d.")).count();
    assert!(frames as u64 >= 2 * n, "recorded {frames} frames");
    replay_raw(nats.port, &recorded);
    wait_for("the app side to refuse the replays", WAIT, || {
        a.stderr_now().contains("refused ")
    });
    std::thread::sleep(Duration::from_millis(1500));
    let err = a.kill();
    let seqs = synthetic_seqs_in(&rel, 21, n);
    assert_eq!(
        seqs.len() as u64,
        2 * n,
        "each run's reliable frames once, nothing replayed: {err}"
    );
    assert!(
        seqs[..n as usize].iter().copied().eq(0..n) && seqs[n as usize..].iter().copied().eq(0..n),
        "both runs in order"
    );
    assert_eq!(
        complete_frames(&lossy),
        lossy_before,
        "no lossy frame replayed"
    );
    assert_eq!(
        err.matches("the device side restarted; this stream's pairs start afresh")
            .count(),
        restarts,
        "a replayed run is not taken for a restart: {err}"
    );
    assert!(
        err.contains("dropped a frame of an earlier device run"),
        "said why: {err}"
    );
}

/// Watches the sizes of `files` every 10 ms from another thread; `gaps(from, to)` is each
/// file's longest time without growth between the two instants (a stream that stalled).
struct Growth {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Vec<std::time::Instant>>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Growth {
    fn watch(files: Vec<PathBuf>) -> Growth {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(vec![Vec::new(); files.len()]));
        let (s, v) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let mut sizes = vec![0u64; files.len()];
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                for (i, f) in files.iter().enumerate() {
                    let n = std::fs::metadata(f).map_or(0, |m| m.len());
                    if n > sizes[i] {
                        sizes[i] = n;
                        v.lock().unwrap()[i].push(std::time::Instant::now());
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Growth {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Per file, the longest time in `[from, to]` in which it did not grow.
    fn gaps(&self, from: std::time::Instant, to: std::time::Instant) -> Vec<Duration> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|times| {
                let mut last = from;
                let mut worst = Duration::ZERO;
                for &t in times.iter().filter(|t| **t > from && **t <= to) {
                    worst = worst.max(t - last);
                    last = t;
                }
                worst.max(to.saturating_duration_since(last))
            })
            .collect()
    }
}

impl Drop for Growth {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Issue 31, item 3: a three-node nats-server cluster (routes; JetStream keeping three
/// replicas). Mid-stream, the node the device side is connected to is killed (`kill -9`) and
/// started again, then the node leading the driver's JetStream stream: both app sides get
/// the reliable stream exactly (every frame, in order, none twice) and the lossy stream flows
/// again within 2 s of each kill.
///
/// It failed about one run in eight before the publisher became `ndd_link::nats::outbox`
/// (frame 302 of 4000 lost on one app side: `stored frames that never came were given up
/// after 10s`): a publish that failed around the kill was retried only once 256
/// acknowledgements were outstanding, and stored more than 10 s behind newer ones. Now each
/// failure goes again after its own backoff, and the app side waits 30 s behind a gap
/// (`testkit/tests/nats_publish.rs` explores both over 1000 schedules).
#[test]
fn a_cluster_node_killed_mid_stream_loses_no_reliable_frame_and_lossy_frames_flow_again() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-cluster");
    let mut cluster = ndd_procs::NatsCluster::start("cluster");
    let (dev, apps) = homes_n(&dir.0, 2);
    let servers = toml_list(&cluster.urls());
    let (n, lossy_n) = (4000u64, 2500u64);
    let config = |i: usize| {
        let reliable = dir.0.join(format!("reliable{i}.bin"));
        let lossy = dir.0.join(format!("lossy{i}.bin"));
        let cfg = write(
            &dir.0,
            &format!("c{i}.toml"),
            &format!(
                r#"driver = "clu"
[link]
transport = "nats"
connect_timeout_ms = 20000
[link.nats]
servers = [{servers}]
replicas = 3
min_app_sides = 2

[[stream]]
name = "reliable"
direction = "device-to-app"
source = {{ type = "synthetic", size = 200, interval_ms = 4.0, count = {n}, seed = 7 }}
sink = {{ type = "file", path = "{}", framing = "length" }}

[[stream]]
name = "lossy"
direction = "device-to-app"
reliability = "lossy"
source = {{ type = "synthetic", size = 20, interval_ms = 8.0, count = {lossy_n}, seed = 8 }}
sink = {{ type = "file", path = "{}", framing = "length" }}
"#,
                reliable.display(),
                lossy.display()
            ),
        );
        (cfg, reliable, lossy)
    };
    let (c0, r0, l0) = config(0);
    let (c1, r1, l1) = config(1);
    let growth = Growth::watch(vec![l0.clone(), l1.clone()]);
    let json = |who: &str| dir.0.join(format!("{who}-stats.json"));
    let (j0, j1, jd) = (json("app0"), json("app1"), json("device"));
    let arg = |p: &Path| p.display().to_string();
    let a0 = side(&c0, "app", &apps[0], &["--once", "--stats-json", &arg(&j0)]);
    let a1 = side(&c1, "app", &apps[1], &["--once", "--stats-json", &arg(&j1)]);
    let d = side(&c0, "device", &dev, &["--once", "--stats-json", &arg(&jd)]);
    wait_for("reliable frames to flow", WAIT, || {
        complete_frames(&r0) > 300 && complete_frames(&r1) > 300
    });
    let mut kills = Vec::new();
    // First the node the device side publishes through, then the one leading the stream's
    // replicas (found after the first came back: the leader may have moved).
    for what in ["the device's node", "the stream's leader"] {
        let node = if kills.is_empty() {
            cluster.node_of("ndd device clu")
        } else {
            cluster.leader_of("NDD_ndd_clu")
        }
        .unwrap_or_else(|| panic!("found {what}"));
        let t = std::time::Instant::now();
        cluster.nodes[node].kill();
        println!("killed node n{} ({what})", node + 1);
        std::thread::sleep(Duration::from_secs(3));
        cluster.nodes[node].restart();
        cluster.wait_ready();
        kills.push((what, t));
        std::thread::sleep(Duration::from_secs(1));
    }
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    // Nobody else answered on the device subject: the servers' own "no responders" status
    // is not taken for a malformed claim (it was, through a cluster).
    assert!(!derr.contains("ignored an answer"), "device: {derr}");
    // The device side's own server was killed under it: it failed over and said so.
    assert!(
        derr.contains("lost the NATS server; reconnecting")
            && derr.contains("reconnected to the NATS server (connection 2)"),
        "device: {derr}"
    );
    // Its counters say what it did: publishes sent again after the kills (the reconnect's
    // window, the failed ones).
    let stream = |path: &Path, name: &str| -> serde_json::Value {
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("stats json")).unwrap();
        j["streams"]
            .as_array()
            .and_then(|v| v.iter().find(|s| s["name"] == name).cloned())
            .unwrap_or_else(|| panic!("no stream {name} in {j}"))
    };
    let sent_again = stream(&jd, "reliable")["retransmits"].as_u64().unwrap();
    println!("device: {sent_again} reliable publishes sent again");
    assert!(sent_again > 0, "device: {derr}");
    for (i, (a, r)) in [(a0, &r0), (a1, &r1)].into_iter().enumerate() {
        let (s, _, err) = a.finish();
        assert!(s.success(), "app {i}: {err}\ndevice: {derr}");
        let given_up = stream([&j0, &j1][i], "reliable")["given_up"].as_u64();
        assert_eq!(given_up, Some(0), "app {i}: {err}");
        let (next, dups, lost) = order(synthetic_seqs_in(r, 7, n));
        assert_eq!(
            next, n,
            "app {i}: every reliable frame up to the last\n{err}"
        );
        assert!(
            lost.is_empty(),
            "app {i}: reliable frames lost: {lost:?}\n{err}\ndevice: {derr}"
        );
        assert_eq!(dups, 0, "app {i}: reliable frames twice\n{err}");
    }
    for (what, t) in kills {
        let gaps = growth.gaps(t, t + Duration::from_secs(3));
        println!("lossy stream's longest stall after killing {what}: {gaps:?}");
        for (i, g) in gaps.iter().enumerate() {
            assert!(
                *g < Duration::from_secs(2),
                "app {i}: the lossy stream stalled {g:?} after killing {what}"
            );
        }
    }
}

/// The node leading the stream's replicas is killed as soon as the device side made the
/// stream, and an app side starts then: every frame arrives. When the device side's start was
/// on that node (about one run in four here), its mark met the election ("no stream found for
/// given subject") and, before `DeviceStart::handle_failed`, the device side exited with those
/// words; it now tries again (`nats_ending` explores the retries).
#[test]
fn an_app_side_started_while_the_streams_leader_is_down_gets_every_frame() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-leader-down");
    let mut cluster = ndd_procs::NatsCluster::start("leaderdown");
    let (dev, apps) = homes_n(&dir.0, 1);
    let servers = toml_list(&cluster.urls());
    let n = 500u64;
    let out = dir.0.join("reliable.bin");
    let cfg = write(
        &dir.0,
        "c.toml",
        &format!(
            r#"driver = "ld"
[link]
transport = "nats"
connect_timeout_ms = 20000
[link.nats]
servers = [{servers}]
replicas = 3
min_app_sides = 1

[[stream]]
name = "reliable"
direction = "device-to-app"
source = {{ type = "synthetic", size = 100, interval_ms = 4.0, count = {n}, seed = 7 }}
sink = {{ type = "file", path = "{}", framing = "length" }}
"#,
            out.display()
        ),
    );
    let d = side(&cfg, "device", &dev, &[]);
    let leader = std::cell::Cell::new(None);
    wait_for("the device's stream to have a leader", WAIT, || {
        leader.set(cluster.leader_of("NDD_ndd_ld"));
        leader.get().is_some()
    });
    let leader = leader.get().expect("a leader");
    cluster.nodes[leader].kill();
    println!("killed node n{} (the stream's leader)", leader + 1);
    let a = side(&cfg, "app", &apps[0], &["--once"]);
    std::thread::sleep(Duration::from_secs(3));
    cluster.nodes[leader].restart();
    let (s, _, err) = a.finish();
    let derr = d.stderr_now();
    let again = |e: &str| e.matches("trying again").count();
    println!(
        "JetStream steps tried again: device {}, app {}",
        again(&derr),
        again(&err)
    );
    assert!(s.success(), "app: {err}\ndevice: {derr}");
    let (next, dups, lost) = order(synthetic_seqs_in(&out, 7, n));
    assert_eq!(next, n, "every frame up to the last\n{err}");
    assert!(lost.is_empty(), "lost: {lost:?}\n{err}");
    assert_eq!(dups, 0, "twice\n{err}");
}

/// `replicas = 3` on a single server: the device side says what to change, at once.
#[test]
fn more_replicas_than_servers_are_named() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-replicas");
    let nats = Nats::start("replicas", &[]);
    let (dev, _) = homes_n(&dir.0, 0);
    let cfg = write(
        &dir.0,
        "r.toml",
        &format!(
            "driver = \"r\"\n{}replicas = 3\n[[stream]]\nname = \"s\"\ndirection = \"device-to-app\"\nsource = {{ type = \"synthetic\", size = 10, interval_ms = 10.0, count = 1 }}\nsink = {{ type = \"null\" }}\n",
            link(&nats.url(), 0)
        ),
    );
    let out = run_cmd(&cfg, "device", &dev, &["--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("link.nats.replicas = 3 needs a JetStream cluster of at least that many servers; one server keeps one copy: replicas = 1"),
        "{err}"
    );
}

#[test]
fn a_server_without_room_for_store_mib_is_named() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-room");
    // A server offering 16 MiB of JetStream file storage; the driver reserves the default
    // store_mib = 256.
    let conf = write(
        &dir.0,
        "small.conf",
        "jetstream { max_file_store: 16MB, max_memory_store: 16MB }\n",
    );
    let nats = Nats::start("room", &["-c", &conf.to_string_lossy()]);
    let (dev, _) = homes_n(&dir.0, 0);
    let cfg = write(
        &dir.0,
        "r.toml",
        &format!(
            "driver = \"r\"\n{}[[stream]]\nname = \"s\"\ndirection = \"device-to-app\"\nsource = {{ type = \"synthetic\", size = 10, interval_ms = 10.0, count = 1 }}\nsink = {{ type = \"null\" }}\n",
            link(&nats.url(), 0)
        ),
    );
    let out = run_cmd(&cfg, "device", &dev, &["--once"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("insufficient storage") && err.contains("link.nats.store_mib = 256 reserves"),
        "{err}"
    );
}

/// `ndd status` sees NATS sides too: both answer, with their link to the server and their
/// stream's frames moving.
#[test]
fn ndd_status_shows_both_sides_of_a_nats_driver() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-status");
    let nats = Nats::start("status", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let sockets = dir.0.join("run");
    let out = dir.0.join("out.bin");
    let cfg = one_stream_to_file(
        &dir.0,
        "natstat",
        &nats.url(),
        "device-to-app",
        (64, 10.0, 100_000, 4),
        &out,
    );
    let spawn = |side: &str, home: &Path| {
        let mut c = run_cmd(&cfg, side, home, &[]);
        c.env("NDD_STATUS_DIR", &sockets);
        Side::spawn(c)
    };
    let d = spawn("device", &dev);
    let a = spawn("app", &apps[0]);
    wait_for("both NATS sides in ndd status", WAIT, || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ndd"))
            .args(["status", "--json"])
            .env("NDD_STATUS_DIR", &sockets)
            .output()
            .unwrap();
        let sides: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        sides.len() == 2
            && sides.iter().all(|s| {
                s["driver"] == "natstat"
                    && s["link"] == "up (NATS)"
                    && s["streams"][0]["frames"].as_u64().unwrap_or(0) > 10
            })
            // The app side names its device; the device side says how many app sides are
            // there.
            && sides.iter().any(|s| s["side"] == "app" && s["peer"] == "device")
            && sides.iter().any(|s| {
                s["side"] == "device"
                    && s["peer"]
                        .as_str()
                        .is_some_and(|p| p.starts_with("1 app side, NATS nats://"))
            })
    });
    a.kill();
    d.kill();
}

/// A device side whose source fails while it runs (the X server it captures is gone) ends
/// with the source's own words, not as if the stream were done (it said nothing, and a daemon
/// had no failure to start the driver again for).
#[test]
fn a_source_that_fails_ends_the_device_side_with_its_error() {
    if !nats_or_skip() {
        return;
    }
    if let Some(m) = missing(&["Xvfb"]) {
        println!("SKIPPED: needs {m} (apt-get install xvfb)");
        return;
    }
    let x = ndd_procs::Xvfb::start("320x240x24").expect("start Xvfb");
    let dir = Dir::new("nats-source-fails");
    let nats = Nats::start("source-fails", &[]);
    let (dev, apps) = homes_n(&dir.0, 1);
    let fb = dir.0.join("screen.bgrx");
    let cfg = write(
        &dir.0,
        "screen.toml",
        &format!(
            "driver = \"x-screen\"\n{}\n[[stream]]\nname = \"screen\"\ndirection = \"device-to-app\"\nsource = {{ type = \"x11-screen\", display = \"{}\", max_fps = 10 }}\nstack = [{{ type = \"image\", quality = \"high\", keyframe_ms = 500 }}]\nsink = {{ type = \"framebuffer\", path = \"{}\" }}\n",
            link(&nats.url(), 1),
            x.display,
            fb.display()
        ),
    );
    let a = side(&cfg, "app", &apps[0], &[]);
    let d = side(&cfg, "device", &dev, &[]);
    wait_for("the first picture at the app side", WAIT, || {
        std::fs::metadata(&fb).is_ok_and(|m| m.len() == 320 * 240 * 4)
    });
    drop(x);
    let (status, _, err) = d.finish();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("stream \"screen\": source x11-screen") && err.contains("failed"),
        "{err}"
    );
    a.kill();
}

/// Every line a raw NATS client logged in as `user` gets back within 1.5 s after sending
/// `ops` (the server's `-ERR 'Permissions Violation …'` lines among them).
fn raw_as(port: u16, user: &str, password: &str, ops: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    s.write_all(
        format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"user\":\"{user}\",\"pass\":\"{password}\"}}\r\n{ops}PING\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    while let Ok(n) = s.read(&mut b) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&b[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// One NATS user per side with the permissions `ndd nats-permissions` prints (issue 31: the
/// JetStream answers a side is sent must not be forgeable by other clients): the device and
/// two app sides run the driver through them, reliable and lossy streams exact on both app
/// sides; an app side's user (a revoked app side, say) can neither read nor publish into
/// another side's inboxes, publish device frames, nor delete the JetStream stream.
#[test]
fn one_nats_user_per_side_keeps_each_sides_inboxes_its_own() {
    if !nats_or_skip() {
        return;
    }
    let dir = Dir::new("nats-perms");
    let count = 400;
    let (dev, apps) = homes_n(&dir.0, 2);
    let up = dir.0.join("up.bin");
    let text = |url: &str, user: &str, pw: &Path| {
        format!(
            "driver = \"perm\"\n[link]\ntransport = \"nats\"\nconnect_timeout_ms = 20000\n[link.nats]\nservers = [\"{url}\"]\nmin_app_sides = 2\nuser = \"{user}\"\npassword_file = \"{}\"\ninbox_prefix = \"_INBOX_{user}\"\n\
             [[stream]]\nname = \"r\"\ndirection = \"device-to-app\"\nsource = {{ type = \"synthetic\", size = 100, interval_ms = 2.0, count = {count}, seed = 3 }}\nsink = {{ type = \"check\", seed = 3, size = 100, expect = {count} }}\n\
             [[stream]]\nname = \"l\"\ndirection = \"device-to-app\"\nreliability = \"lossy\"\nsource = {{ type = \"synthetic\", size = 50, interval_ms = 10.0, count = 100 }}\nsink = {{ type = \"null\" }}\n\
             [[stream]]\nname = \"up\"\ndirection = \"app-to-device\"\nsource = {{ type = \"synthetic\", size = 30, interval_ms = 5.0, count = 100 }}\nsink = {{ type = \"file\", path = \"{}\", framing = \"length\", append = true }}\n",
            pw.display(),
            up.display()
        )
    };
    // The permissions as the command prints them, for this driver (the app sides named as the
    // device's known_peers names them).
    let template = write(
        &dir.0,
        "perm.toml",
        &text("nats://127.0.0.1:4222", "dev", &dir.0.join("dev.pw")),
    );
    let perms = ok(ndd()
        .arg("nats-permissions")
        .arg(&template)
        .args([
            "--device",
            "dev",
            "--app",
            "app0=app0",
            "--app",
            "app1=app1",
            "--home",
        ])
        .arg(&dev));
    // And the device's as an ndd before 2026-12-01 printed them: no purge.
    let dev_perms = perms
        .split("\nNDD_DEV_DEVICE = ")
        .nth(1)
        .and_then(|p| p.split("\n}").next())
        .expect("the device's permissions");
    let purge = ", \"$JS.API.STREAM.PURGE.NDD_ndd_perm\"";
    assert!(dev_perms.contains(purge), "{dev_perms}");
    let old_perms = format!("NDD_OLD_DEVICE = {}\n}}", dev_perms.replace(purge, ""));
    let conf = write(
        &dir.0,
        "nats.conf",
        &format!(
            "{perms}\n{old_perms}\nauthorization {{ users = [\n\
             {{ user: \"dev\", password: \"pw-dev\", permissions: $NDD_DEV_DEVICE }}\n\
             {{ user: \"old\", password: \"pw-old\", permissions: $NDD_OLD_DEVICE }}\n\
             {{ user: \"app0\", password: \"pw-app0\", permissions: $NDD_APP0_APP }}\n\
             {{ user: \"app1\", password: \"pw-app1\", permissions: $NDD_APP1_APP }}\n] }}\n"
        ),
    );
    let nats = Nats::start("perms", &["-c", conf.to_str().unwrap()]);
    let side_cfg = |user: &str| {
        let pw = write(&dir.0, &format!("{user}.pw"), &format!("pw-{user}\n"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        write(
            &dir.0,
            &format!("perm-{user}.toml"),
            &text(&nats.url(), user, &pw),
        )
    };
    let a0 = side(&side_cfg("app0"), "app", &apps[0], &["--once"]);
    let a1 = side(&side_cfg("app1"), "app", &apps[1], &["--once"]);
    // The device side runs until told (its sinks take app frames as long as app sides send).
    let d = side(&side_cfg("dev"), "device", &dev, &[]);
    // While the driver runs, app1's user tries what a revoked app side would.
    a1.wait_says("joined device", &[&d, &a0]);
    let tries = raw_as(
        nats.port,
        "app1",
        "pw-app1",
        "SUB _INBOX_app0.> 1\r\nSUB _INBOX.> 2\r\nPUB _INBOX_app0.forged 1\r\nx\r\n\
         PUB ndd.perm.r.1 1\r\nx\r\nPUB $JS.API.STREAM.DELETE.NDD_ndd_perm 0\r\n\r\n\
         PUB $JS.API.CONSUMER.MSG.NEXT.NDD_ndd_perm.device_3 _INBOX_app1.x 1\r\n1\r\n\
         PUB $JS.API.CONSUMER.DELETE.NDD_ndd_perm.device_3 0\r\n\r\n\
         PUB $JS.ACK.NDD_ndd_perm.device_3.1.1.1.1.0 4\r\n+ACK\r\n\
         PUB $JS.API.CONSUMER.CREATE.NDD_ndd_perm.mine.ndd.perm.r.1 2\r\n{}\r\n",
    );
    for refused in [
        "Permissions Violation for Subscription to \"_INBOX_app0.>\"",
        "Permissions Violation for Subscription to \"_INBOX.>\"",
        "Permissions Violation for Publish to \"_INBOX_app0.forged\"",
        "Permissions Violation for Publish to \"ndd.perm.r.1\"",
        "Permissions Violation for Publish to \"$JS.API.STREAM.DELETE.NDD_ndd_perm\"",
        // The device's consumer: not pulled from, deleted or acknowledged on by an app side.
        "Permissions Violation for Publish to \"$JS.API.CONSUMER.MSG.NEXT.NDD_ndd_perm.device_3\"",
        "Permissions Violation for Publish to \"$JS.API.CONSUMER.DELETE.NDD_ndd_perm.device_3\"",
        "Permissions Violation for Publish to \"$JS.ACK.NDD_ndd_perm.device_3.1.1.1.1.0\"",
        // Nor a consumer of a name not its own (one could deliver anywhere).
        "Permissions Violation for Publish to \"$JS.API.CONSUMER.CREATE.NDD_ndd_perm.mine.ndd.perm.r.1\"",
    ] {
        assert!(tries.contains(refused), "not refused: {refused}\n{tries}");
    }
    for (i, a) in [a0, a1].into_iter().enumerate() {
        let (st, _, err) = a.finish();
        assert!(
            st.success() && err.contains(&check_ok("r", count)),
            "app{i}: {err}"
        );
        assert!(!err.contains("Permissions Violation"), "app{i}: {err}");
    }
    // Both app sides' reliable frames reach the device through JetStream.
    wait_for("every app frame at the device", WAIT, || {
        up.exists() && frames_in(&up).len() >= 200
    });
    d.terminate();
    let (ds, _, derr) = d.finish();
    assert!(ds.success(), "device: {derr}");
    assert!(!derr.contains("Permissions Violation"), "device: {derr}");
    assert_eq!(frames_in(&up).len(), 200, "{derr}");
    // A second device run purges the first one's mark: allowed too (it waits for its app
    // sides after that).
    let mut c = run_cmd(&side_cfg("dev"), "device", &dev, &[]);
    c.env(
        "NDD_LOG",
        "warn,ndd::fanout=debug,ndd_link::nats::drive=debug",
    );
    let d = Side::spawn(c);
    d.wait_says("waiting for 2 app side(s) to join", &[]);
    d.terminate();
    let (_, _, derr) = d.finish();
    assert!(
        derr.contains("earlier run marks purged") && !derr.contains("cannot purge"),
        "device: {derr}"
    );
    // A device user whose permissions predate the purge: the server never answers it (the
    // request waits out its 10 s), and the run does not wait for it; the side says so.
    let old_cfg = std::fs::read_to_string(side_cfg("old"))
        .unwrap()
        .replace("_INBOX_old", "_INBOX_dev");
    let old_cfg = write(&dir.0, "perm-old-device.toml", &old_cfg);
    let d = side(&old_cfg, "device", &dev, &[]);
    d.wait_says("cannot purge the earlier runs' marks", &[]);
    d.terminate();
    let (_, _, derr) = d.finish();
    let (waiting, refused) = (
        derr.find("waiting for 2 app side(s) to join"),
        derr.find("cannot purge the earlier runs' marks"),
    );
    assert!(
        waiting.is_some() && waiting < refused && derr.contains("print them again"),
        "device: {derr}"
    );
    // app0's user with inbox_prefix left out: the server refuses its inboxes, and the side
    // says so and where to look, not only that nobody answered.
    let forgot = std::fs::read_to_string(side_cfg("app0"))
        .unwrap()
        .replace("inbox_prefix = \"_INBOX_app0\"\n", "")
        .replace("connect_timeout_ms = 20000", "connect_timeout_ms = 3000");
    let forgot = write(&dir.0, "forgot.toml", &forgot);
    let out = run_cmd(&forgot, "app", &apps[0], &["--once"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("the NATS server refused this side: Permissions Violation for Subscription to \"_INBOX.")
            && err.contains("link.nats.inbox_prefix is the one printed for this user"),
        "{err}"
    );
}

/// `ndd nats-permissions` with wrong input: one clear line each, exit code 1.
#[test]
fn nats_permissions_names_what_is_wrong() {
    let dir = Dir::new("nats-perms-bad");
    let nats = fan_config(
        &dir.0,
        "p",
        "nats://127.0.0.1:4222",
        0,
        "[[stream]]\nname = \"s\"\ndirection = \"device-to-app\"\nsource = { type = \"synthetic\", size = 10, interval_ms = 10.0 }\nsink = { type = \"null\" }\n",
    );
    let direct = write(
        &dir.0,
        "direct.toml",
        "driver = \"d\"\n[[stream]]\nname = \"s\"\ndirection = \"device-to-app\"\nsource = { type = \"synthetic\", size = 10, interval_ms = 10.0 }\nsink = { type = \"null\" }\n",
    );
    let err = |cfg: &Path, users: &[&str]| {
        let out = ndd()
            .arg("nats-permissions")
            .arg(cfg)
            .args(users)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(err(&direct, &["--device", "a", "--app", "b"])
        .contains("does not use the NATS link (set transport = \"nats\" in [link])"));
    assert!(err(&nats, &["--device", "a", "--app", "a"]).contains("user \"a\" given twice"));
    assert!(err(&nats, &["--device", "a.b", "--app", "c"])
        .contains("'.' cannot be part of a NATS subject token"));
    // The driver has a reliable device → app stream: an app side's identity is needed.
    assert!(err(&nats, &["--device", "a", "--app", "c"])
        .contains("--app c: give the app side's identity too, --app c=NAME"));
    assert!(err(
        &nats,
        &[
            "--device",
            "a",
            "--app",
            "c=nobody",
            "--home",
            dir.0.to_str().unwrap()
        ]
    )
    .contains("--app c=nobody: no peer named nobody in"));
    assert!(err(
        &nats,
        &["--device", "a", "--app", "A-b=x", "--app", "a_B=y"]
    )
    .contains("given twice (or two users that differ only in case or - and _)"));
}
