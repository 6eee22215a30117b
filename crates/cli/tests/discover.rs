//! LAN discovery (issue 34 item 3) between two network namespaces joined by a veth pair, as
//! two machines on one LAN: an app side listening with `announce = true` is listed by
//! `ndd discover` on the other "machine" with its address, trusted or not, and the line that
//! connects; a side listening on loopback is not announced; once stopped it is gone. Skips,
//! printing `SKIPPED: …`, where network namespaces cannot be made (not root, no `ip`).

mod common;

use common::*;

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

/// `ndd pair CODE` without `--connect`: the machine showing the code announces the pairing on
/// the LAN (never the code), the other finds it and pairs; both then trust each other. With
/// nothing announced the joining side says to give `--connect`.
#[test]
fn pair_without_an_address_finds_the_machine_showing_the_code() {
    use std::io::BufRead;
    let Some(lan) = Lan::new() else {
        println!("SKIPPED: pairing discovery test needs network namespaces (root and `ip`)");
        return;
    };
    let dir = Dir::new("pair-discover");
    let (a_home, b_home) = (dir.0.join("a"), dir.0.join("b"));
    // Nobody shows a code yet: told what to do.
    let out = Lan::ndd(
        &lan.b,
        &["pair", "1234-5678", "--home", b_home.to_str().unwrap()],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no machine nearby shows a pairing code") && err.contains("--connect"),
        "{err}"
    );
    let mut offer = Lan::ndd(
        &lan.a,
        &[
            "pair",
            "--listen",
            "0.0.0.0:7871",
            "--home",
            a_home.to_str().unwrap(),
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = std::io::BufReader::new(offer.stdout.take().unwrap());
    let mut all = String::new();
    while !all.contains("waiting on") {
        let mut l = String::new();
        assert!(stdout.read_line(&mut l).unwrap() > 0, "stdout ended: {all}");
        all.push_str(&l);
    }
    assert!(all.contains("announced on the local network"), "{all}");
    let code = all
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("pairing code: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    let out = Lan::ndd(&lan.b, &["pair", &code, "--home", b_home.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("the machine showing the code"), "{err}");
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = offer.try_wait().unwrap() {
            break s;
        }
        assert!(t0.elapsed() < WAIT, "the offering side did not end");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success());
    let fp = |h: &std::path::Path| ok(ndd().args(["id", "--home"]).arg(h)).trim().to_string();
    let known = |h: &std::path::Path| std::fs::read_to_string(h.join("known_peers")).unwrap();
    assert!(known(&a_home).contains(&fp(&b_home)));
    assert!(known(&b_home).contains(&fp(&a_home)));
}
