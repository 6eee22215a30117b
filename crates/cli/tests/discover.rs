//! LAN discovery (issue 34 item 3) between two network namespaces joined by a veth pair, as
//! two machines on one LAN: an app side listening with `announce = true` is listed by
//! `ndd discover` on the other "machine" with its address, trusted or not, and the line that
//! connects; a side listening on loopback is not announced; once stopped it is gone. Skips,
//! printing `SKIPPED: …`, where network namespaces cannot be made (not root, no `ip`).

mod common;

use common::*;
use std::process::Command;

/// Two network namespaces joined by a veth pair (10.231.N.1 and .2), removed on drop.
struct Lan {
    a: String,
    b: String,
}

impl Lan {
    fn new() -> Option<Lan> {
        let id = std::process::id() % 100_000;
        let (a, b) = (format!("nddda{id}"), format!("ndddb{id}"));
        let (va, vb) = (format!("dva{id}"), format!("dvb{id}"));
        let net = id % 200 + 20;
        let ok = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !ok(&["netns", "add", &a]) {
            return None;
        }
        let lan = Lan { a, b };
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), lan.b.clone()],
            vec![
                "link".into(),
                "add".into(),
                va.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                vb.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                va.clone(),
                "netns".into(),
                lan.a.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                vb.clone(),
                "netns".into(),
                lan.b.clone(),
            ],
            vec![
                "-n".into(),
                lan.a.clone(),
                "addr".into(),
                "add".into(),
                format!("10.231.{net}.1/24"),
                "dev".into(),
                va.clone(),
            ],
            vec![
                "-n".into(),
                lan.b.clone(),
                "addr".into(),
                "add".into(),
                format!("10.231.{net}.2/24"),
                "dev".into(),
                vb.clone(),
            ],
            vec![
                "-n".into(),
                lan.a.clone(),
                "link".into(),
                "set".into(),
                va,
                "up".into(),
            ],
            vec![
                "-n".into(),
                lan.b.clone(),
                "link".into(),
                "set".into(),
                vb,
                "up".into(),
            ],
            vec![
                "-n".into(),
                lan.a.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                lan.b.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
        ];
        for s in &steps {
            let s: Vec<&str> = s.iter().map(String::as_str).collect();
            if !ok(&s) {
                return None;
            }
        }
        Some(lan)
    }

    /// `ndd ARGS` run in namespace `ns`.
    fn ndd(ns: &str, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(env!("CARGO_BIN_EXE_ndd"))
            .args(args);
        c
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

#[test]
fn a_side_that_announces_itself_is_listed_on_the_other_machine_and_gone_once_stopped() {
    let Some(lan) = Lan::new() else {
        println!("SKIPPED: LAN discovery test needs network namespaces (root and `ip`)");
        return;
    };
    let dir = Dir::new("discover");
    let (dev_home, app_home, _, afp) = homes(&dir.0, true, true);
    let cfg = dir.0.join("lab.toml");
    std::fs::write(
        &cfg,
        r#"driver = "lab"
[link]
announce = true
[[stream]]
name = "console"
direction = "device-to-app"
source = { type = "synthetic", size = 32, interval_ms = 100.0, count = 100000 }
sink = { type = "null" }
"#,
    )
    .unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let app_home_s = app_home.to_str().unwrap();
    let app = Side::spawn(Lan::ndd(
        &lan.a,
        &[
            "run",
            cfg_s,
            "--side",
            "app",
            "--home",
            app_home_s,
            "--listen",
            "0.0.0.0:7902",
        ],
    ));
    wait_for("the announcement", WAIT, || {
        app.stderr_now().contains("announced on the local network")
    });
    let discover = |home: &std::path::Path| {
        let out = Lan::ndd(
            &lan.b,
            &[
                "discover",
                "--seconds",
                "3",
                "--home",
                home.to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The device's machine trusts the app side: listed as trusted (by its name there).
    let seen = discover(&dev_home);
    let row = seen
        .lines()
        .find(|l| l.starts_with("lab "))
        .unwrap_or_else(|| panic!("the app side is not listed: {seen}"));
    assert!(
        row.contains(":7902") && row.contains(" app ") && row.contains("yes (app)"),
        "{seen}"
    );
    assert!(
        seen.contains("ndd run CONFIG --side device --connect 10.231."),
        "{seen}"
    );
    // A machine that does not trust it sees it untrusted, with the fingerprint to check.
    let stranger = dir.0.join("stranger");
    let seen = discover(&stranger);
    assert!(
        seen.lines()
            .any(|l| l.starts_with("lab ") && l.ends_with(" no")),
        "{seen}"
    );
    assert!(seen.contains(&format!("ndd trust {afp}")), "{seen}");
    app.terminate();
    let _ = app.finish();
    let seen = discover(&dev_home);
    assert!(
        seen.contains("no ndd side announced itself"),
        "gone once stopped: {seen}"
    );
    // On loopback nothing is announced, and it says so.
    let local = Side::spawn(Lan::ndd(
        &lan.a,
        &[
            "run",
            cfg_s,
            "--side",
            "app",
            "--home",
            app_home_s,
            "--listen",
            "127.0.0.1:7903",
        ],
    ));
    wait_for("the loopback note", WAIT, || {
        local
            .stderr_now()
            .contains("is this machine only, not announced")
    });
}
