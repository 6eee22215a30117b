//! `ndd pair`: two homes that never met trust each other after one shows a code and the other
//! types it; a driver then runs between them with no `ndd trust`. Wrong codes are counted and
//! the third voids the code; garbage on the pairing port costs no try; a code that is not one
//! is refused before anything is sent. Real processes over loopback.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::time::Duration;

/// An offering side: its process and the code it shows.
struct Offering {
    child: Child,
    code: String,
    stdout: BufReader<std::process::ChildStdout>,
}

fn offer(home: &std::path::Path, addr: &str) -> Offering {
    let mut child = ndd()
        .args(["pair", "--listen", addr, "--home"])
        .arg(home)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ndd pair");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let code = line
        .strip_prefix("pairing code: ")
        .unwrap_or_else(|| panic!("first line: {line:?}"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert!(line.contains("valid 5 min, 3 wrong tries"), "{line}");
    // The line to type on the other machine names this address.
    let mut all = String::new();
    while !all.contains("waiting on") {
        let mut l = String::new();
        assert!(stdout.read_line(&mut l).unwrap() > 0, "stdout ended: {all}");
        all.push_str(&l);
    }
    assert!(
        all.contains(&format!("ndd pair {code} --connect 127.0.0.1:")),
        "{all}"
    );
    Offering {
        child,
        code,
        stdout,
    }
}

impl Offering {
    /// Waits for the exit: (success, stdout rest, stderr).
    fn finish(mut self) -> (bool, String, String) {
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(t0.elapsed() < WAIT, "ndd pair did not end");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut self.stdout, &mut out);
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(self.child.stderr.as_mut().unwrap(), &mut err);
        (status.success(), out, err)
    }
}

fn join(home: &std::path::Path, code: &str, addr: &str, extra: &[&str]) -> std::process::Output {
    ndd()
        .args(["pair", code, "--connect", addr, "--home"])
        .arg(home)
        .args(extra)
        .output()
        .expect("ndd pair CODE runs")
}

fn fingerprint(home: &std::path::Path) -> String {
    ok(ndd().args(["id", "--home"]).arg(home))
        .trim()
        .to_string()
}

fn known(home: &std::path::Path) -> String {
    std::fs::read_to_string(home.join("known_peers")).unwrap_or_default()
}

#[test]
fn the_code_pairs_two_homes_and_a_driver_then_runs_between_them() {
    let dir = Dir::new("pair-ok");
    let (a, b) = (dir.0.join("a"), dir.0.join("b"));
    let (fa, fb) = (fingerprint(&a), fingerprint(&b));
    let addr = free_addr();
    let o = offer(&a, &addr);
    // Typed as two words (a space instead of the dash, unquoted), remembered under a name of
    // our choosing.
    let (first, second) = o.code.split_once('-').unwrap();
    let j = ndd()
        .args(["pair", first, second, "--connect", &addr, "--home"])
        .arg(&b)
        .args(["--name", "lab-server"])
        .output()
        .unwrap();
    let jout = String::from_utf8_lossy(&j.stdout);
    assert!(
        j.status.success(),
        "{jout}{}",
        String::from_utf8_lossy(&j.stderr)
    );
    assert!(
        jout.contains(&format!("paired: trusted {fa} (lab-server)")),
        "{jout}"
    );
    let (okay, out, err) = o.finish();
    assert!(okay, "{out}{err}");
    assert!(out.contains(&format!("paired: trusted {fb} (")), "{out}");
    assert!(known(&a).contains(&fb), "{}", known(&a));
    assert!(
        known(&b).contains(&format!("{fa} lab-server")),
        "{}",
        known(&b)
    );

    // The two homes now run a driver with each other, nothing else trusted by hand.
    let link = free_addr();
    let cfg = dir.0.join("events.toml");
    std::fs::write(
        &cfg,
        format!(
            "driver = \"paired\"\n[link]\naddress = \"{link}\"\nlistener = \"app\"\n\
             [[stream]]\nname = \"events\"\ndirection = \"device-to-app\"\n\
             source = {{ type = \"synthetic\", size = 32, interval_ms = 1.0, count = 200, seed = 5 }}\n\
             sink = {{ type = \"check\", seed = 5, size = 32, expect = 200 }}\n"
        ),
    )
    .unwrap();
    let app = Side::spawn(run_cmd(&cfg, "app", &a, &["--once"]));
    let dev = Side::spawn(run_cmd(&cfg, "device", &b, &["--once"]));
    let (s, _, e) = app.finish();
    assert!(s.success(), "{e}\ndevice:\n{}", dev.kill());
    assert!(e.contains(&check_ok("events", 200)), "{e}");
}

#[test]
fn wrong_codes_are_counted_garbage_costs_nothing_and_the_third_voids_the_code() {
    let dir = Dir::new("pair-wrong");
    let (a, b) = (dir.0.join("a"), dir.0.join("b"));
    let addr = free_addr();
    let o = offer(&a, &addr);
    // Not a pairing hello, with escape codes: refused, said escaped, no try taken.
    {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(b"\x00\x10\x01\x1b[2Jhello there!!").unwrap();
        let mut back = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut back);
        assert_eq!(back.get(2), Some(&4), "a refusal: {back:?}");
    }
    let wrong = if o.code == "0000-0000" {
        "1111-1111"
    } else {
        "0000-0000"
    };
    for (want, left) in [("(2 tries left)", 2), ("(1 try left)", 1)] {
        let j = join(&b, wrong, &addr, &[]);
        let err = String::from_utf8_lossy(&j.stderr);
        assert!(!j.status.success());
        assert!(
            err.contains("the code does not match the one shown on the other machine")
                && err.contains(want),
            "{left}: {err}"
        );
    }
    let j = join(&b, wrong, &addr, &[]);
    let err = String::from_utf8_lossy(&j.stderr);
    assert!(err.contains("that was its last try"), "{err}");
    let (okay, out, err) = o.finish();
    assert!(!okay, "{out}");
    assert!(err.contains("too many wrong codes (3)"), "{err}");
    assert!(
        err.contains("typed a wrong code (2 wrong tries left)"),
        "{err}"
    );
    assert!(err.contains("not ndd pairing"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "escape codes reached the terminal: {err:?}"
    );
    assert_eq!(known(&a), "");
    assert_eq!(known(&b), "");
    // The right code now finds nobody, and says what to do.
    let j = join(&b, "1234-5678", &addr, &[]);
    let err = String::from_utf8_lossy(&j.stderr);
    assert!(
        err.contains("nothing listens at") && err.contains("run `ndd pair` there first"),
        "{err}"
    );
}

#[test]
fn a_code_that_is_not_one_is_refused_before_connecting() {
    let dir = Dir::new("pair-bad");
    let j = join(&dir.0.join("b"), "12x4", "127.0.0.1:1", &[]);
    assert!(!j.status.success());
    let err = String::from_utf8_lossy(&j.stderr);
    assert!(err.contains("a pairing code is 8 digits"), "{err}");
    assert!(!err.contains("cannot reach"), "{err}");
}

/// A port out of range is named as such, before connecting (it became `HOST:99999:7870`,
/// said as a host that does not resolve).
#[test]
fn a_port_out_of_range_is_named() {
    let dir = Dir::new("pair-port");
    let j = join(&dir.0.join("b"), "1234-5678", "127.0.0.1:99999", &[]);
    assert!(!j.status.success());
    let err = String::from_utf8_lossy(&j.stderr);
    assert!(
        err.contains("--connect: \"127.0.0.1:99999\": port 99999 is not a number from 0 to 65535"),
        "{err}"
    );
}
