//! Held keys are released when the link drops (DESIGN.md §2, principle 7), end to end with
//! real processes: the device side's `file` source reads input records from a named pipe the
//! test keeps open (so the stream never ends on its own), the app side's `xtest` sink injects
//! them into an Xvfb display, and a proxy the test controls cuts or blackholes the link. The
//! keys must come up on the app display while the session is still reconnecting (the proxy
//! lets nothing through yet, both processes run, the pipe is open), and the stream must go on
//! after the link is back. Release and recovery times are printed (`--nocapture`). Skips,
//! printing `SKIPPED: …`, where Xvfb is missing.

mod common;

use common::*;
use ndd_endpoint::input::{Capabilities, Event, InputMessage, BTN_LEFT, EV_KEY, KEY_A};
use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{ConnectionExt as _, KeyButMask};

const KEY_LEFTSHIFT: u16 = 42;
const KEY_B: u16 = 48;
const KEY_C: u16 = 46;

/// The X keycode of a Linux key code (what the `xtest` sink injects).
fn x(code: u16) -> u8 {
    (code + 8) as u8
}

/// X keycodes held on the display, among `keys`.
fn held(conn: &impl Connection, keys: &[u16]) -> Vec<u16> {
    let km = conn.query_keymap().unwrap().reply().unwrap();
    keys.iter()
        .copied()
        .filter(|&k| km.keys[usize::from(x(k) / 8)] & (1 << (x(k) % 8)) != 0)
        .collect()
}

fn button1_down(conn: &impl Connection) -> bool {
    let root = conn.setup().roots[0].root;
    let p = conn.query_pointer(root).unwrap().reply().unwrap();
    u16::from(p.mask) & u16::from(KeyButMask::BUTTON1) != 0
}

/// Writes one input record to the pipe, `length`-framed.
fn send(pipe: &mut File, m: &InputMessage) {
    let p = m.emit().unwrap();
    pipe.write_all(&(p.len() as u32).to_be_bytes()).unwrap();
    pipe.write_all(&p).unwrap();
    pipe.flush().unwrap();
}

fn keys(codes: &[u16], value: i32) -> InputMessage {
    InputMessage::Events(
        codes
            .iter()
            .map(|&c| Event::new(EV_KEY, c, value))
            .collect(),
    )
}

fn count(text: &str, what: &str) -> usize {
    text.matches(what).count()
}

#[test]
fn held_keys_are_released_while_the_link_is_down_and_the_stream_goes_on() {
    if !have("Xvfb") || !have("mkfifo") {
        println!("SKIPPED: the input release test needs Xvfb and mkfifo (apt-get install xvfb)");
        return;
    }
    let xvfb = Xvfb::start("640x480x24").expect("start Xvfb");
    let (conn, _) = x11rb::connect(Some(&xvfb.display)).expect("connect to Xvfb");
    let dir = Dir::new("input-release");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let (fifo, mut pipe) = fifo(&dir.0, "keys.fifo");
    let cfg = dir.0.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "keys"
[link]
ping_interval_ms = 100
keepalive_timeout_ms = 600
max_backoff_ms = 200
[[stream]]
name = "keys"
direction = "device-to-app"
source = {{ type = "file", path = "{}", framing = "length" }}
sink = {{ type = "xtest", display = "{}" }}
"#,
            fifo.display(),
            xvfb.display
        ),
    )
    .unwrap();
    let mut app = Side::spawn(run_cmd(
        &cfg,
        "app",
        &app_home,
        &["--listen", "127.0.0.1:0"],
    ));
    let proxy = Proxy::start(app.addr());
    let mut dev = Side::spawn(run_cmd(
        &cfg,
        "device",
        &dev_home,
        &["--connect", &proxy.addr],
    ));

    // A recorded key-down stream: capabilities, then shift + A + the left button pressed,
    // never released.
    send(
        &mut pipe,
        &InputMessage::Capabilities(Capabilities::keyboard_and_mouse("test keyboard")),
    );
    send(&mut pipe, &keys(&[KEY_LEFTSHIFT, KEY_A, BTN_LEFT], 1));
    wait_for(
        "shift, A and button 1 held",
        Duration::from_secs(60),
        || held(&conn, &[KEY_LEFTSHIFT, KEY_A]).len() == 2 && button1_down(&conn),
    );

    // 1. The connection is cut and the peer stays unreachable: the app side sees the end of
    // the connection and must release at once, long before any reconnect.
    let lost_before = count(&app.stderr_now(), "link lost");
    let restored_before = count(&dev.stderr_now(), "link restored after");
    proxy.set(REFUSE);
    let t = Instant::now();
    proxy.cut();
    wait_for("release after the cut", Duration::from_secs(20), || {
        held(&conn, &[KEY_LEFTSHIFT, KEY_A]).is_empty() && !button1_down(&conn)
    });
    let release_cut = t.elapsed();
    assert!(app.running() && dev.running(), "both sides still run");
    assert_eq!(
        count(&dev.stderr_now(), "link restored after"),
        restored_before,
        "released before any reconnect (the proxy refuses every connection)"
    );
    wait_for(
        "the app side to report the loss",
        Duration::from_secs(10),
        || count(&app.stderr_now(), "link lost") > lost_before,
    );
    // Still reconnecting a while later; nothing pressed the keys again.
    std::thread::sleep(Duration::from_millis(300));
    assert!(held(&conn, &[KEY_LEFTSHIFT, KEY_A]).is_empty() && !button1_down(&conn));
    let t = Instant::now();
    proxy.set(PASS);
    wait_for("reconnect after the cut", Duration::from_secs(30), || {
        count(&dev.stderr_now(), "link restored after") > restored_before
    });
    let recover_cut = t.elapsed();
    // The stream goes on: a new key press arrives, and the old ones stay released (the
    // resent key-down, if any, is a duplicate the sink drops).
    send(&mut pipe, &keys(&[KEY_B], 1));
    wait_for(
        "B held after the reconnect",
        Duration::from_secs(30),
        || held(&conn, &[KEY_B]) == [KEY_B],
    );
    assert!(held(&conn, &[KEY_LEFTSHIFT, KEY_A]).is_empty() && !button1_down(&conn));

    // 2. A blackhole: nothing is closed, nothing gets through; only the keepalive timeout
    // (600 ms) can tell the app side that the link is gone.
    let lost_before = count(&app.stderr_now(), "link lost");
    let restored_before = count(&dev.stderr_now(), "link restored after");
    proxy.set(BLOCK);
    let t = Instant::now();
    wait_for(
        "release after the blackhole",
        Duration::from_secs(20),
        || held(&conn, &[KEY_B]).is_empty(),
    );
    let release_block = t.elapsed();
    assert!(app.running() && dev.running(), "both sides still run");
    assert_eq!(
        count(&dev.stderr_now(), "link restored after"),
        restored_before,
        "released before any reconnect (the proxy forwards nothing)"
    );
    wait_for("the app side's keepalive", Duration::from_secs(10), || {
        let err = app.stderr_now();
        count(&err, "link lost") > lost_before && err.contains("no message from the peer")
    });
    let t = Instant::now();
    proxy.cut();
    proxy.set(PASS);
    wait_for(
        "reconnect after the blackhole",
        Duration::from_secs(30),
        || count(&dev.stderr_now(), "link restored after") > restored_before,
    );
    let recover_block = t.elapsed();
    send(&mut pipe, &keys(&[KEY_C], 1));
    wait_for(
        "C held after the reconnect",
        Duration::from_secs(30),
        || held(&conn, &[KEY_C]) == [KEY_C],
    );
    assert!(held(&conn, &[KEY_B]).is_empty());

    // The end: C released, the pipe closed, both sides finish normally.
    send(&mut pipe, &keys(&[KEY_C], 0));
    drop(pipe);
    let (ds, _, derr) = dev.finish();
    let (as_, _, aerr) = app.finish();
    println!(
        "released {:.0} ms after the cut, {:.0} ms after the blackhole began (keepalive 600 ms); \
         reconnected {:.0} ms / {:.0} ms after the path came back; device recoveries {:?}",
        release_cut.as_secs_f64() * 1e3,
        release_block.as_secs_f64() * 1e3,
        recover_cut.as_secs_f64() * 1e3,
        recover_block.as_secs_f64() * 1e3,
        recoveries(&derr)
    );
    assert!(ds.success(), "device: {derr}");
    assert!(as_.success(), "app: {aerr}");
    assert!(held(&conn, &[KEY_LEFTSHIFT, KEY_A, KEY_B, KEY_C]).is_empty() && !button1_down(&conn));
}
