//! RFC 2217 on the serial path, with real processes and pyserial's own RFC 2217 classes on
//! both ends: an unmodified pyserial program opens `rfc2217://` on the app side's
//! `rfc2217-server`; the device side's `rfc2217-client` uses pyserial's `PortManager` (the
//! reference RFC 2217 server, standing in for ser2net) over a loop:// port. Bytes (every
//! value, 255 included), baud/parity/data bits/stop bits and RTS→CTS, DTR→DSR travel the
//! whole way and back, a break and purges reach the far port; the server restarting, a second client and bad addresses are handled.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn python_with_pyserial() -> Option<&'static str> {
    python_with("serial.rfc2217")
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
}

/// pyserial's PortManager on a loop:// port at `addr`; its stdout lines are collected.
fn loop_server(python: &str, addr: &str) -> (Killed, Arc<Mutex<String>>) {
    let mut child = Command::new(python)
        .arg(script("rfc2217-loop-server.py"))
        .arg(addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python runs");
    let out = child.stdout.take().unwrap();
    let lines = Arc::new(Mutex::new(String::new()));
    let l = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let mut l = l.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    let server = Killed(child);
    wait_for("the RFC 2217 loop server", WAIT, || {
        lines.lock().unwrap().contains("listening")
    });
    (server, lines)
}

fn config(dir: &Path, server: &str, listen: &str) -> PathBuf {
    let cfg = dir.join("rfc2217.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
driver = "rfc2217"
[[stream]]
name = "rx"
direction = "device-to-app"
source = {{ type = "rfc2217-client", address = "{server}" }}
sink = {{ type = "rfc2217-server", listen = "{listen}" }}
[[stream]]
name = "tx"
direction = "app-to-device"
source = {{ type = "rfc2217-server", listen = "{listen}" }}
sink = {{ type = "rfc2217-client", address = "{server}" }}
"#
        ),
    )
    .unwrap();
    cfg
}

/// The unmodified pyserial program: `ok …` lines, exit 0 when every check passed.
fn client_check(python: &str, listen: &str) -> (bool, String) {
    let out = Command::new(python)
        .arg(script("rfc2217-client-check.py"))
        .arg(listen)
        .output()
        .expect("python runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn pyserial_uses_a_port_behind_an_rfc2217_server_through_ndd() {
    let Some(python) = python_with_pyserial() else {
        println!("SKIPPED: no python3 with pyserial (Debian: apt-get install python3-serial)");
        return;
    };
    let dir = Dir::new("rfc2217");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let (server_addr, listen, link) = (free_addr(), free_addr(), free_addr());
    let (server, server_says) = loop_server(python, &server_addr);
    let cfg = config(&dir.0, &server_addr, &listen);
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &link]));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &link]));
    dev.wait_says("streams agreed", &[&app]);

    // 1. Everything there and back.
    let (ok, said) = client_check(python, &listen);
    assert!(
        ok,
        "pyserial program: {said}\nserver: {}\napp: {}\ndevice: {}",
        server_says.lock().unwrap(),
        app.stderr_now(),
        dev.stderr_now()
    );
    for line in [
        "ok echo 1030 bytes",
        "ok cts=False after rts=False",
        "ok dsr=True after dtr=True",
        "ok echo after settings",
        "ok break and purge sent",
    ] {
        assert!(said.contains(line), "{line:?} missing: {said}");
    }
    // The far port got the settings the program set, through both ndd sides.
    let says = server_says.lock().unwrap().clone();
    assert!(says.contains("settings 9600 8 N 1"), "{says}");
    assert!(says.contains("settings 57600 7 E 2"), "{says}");
    // The break and the purges too, in order (the server prints a changed state as its
    // reader thread polls it: the break is held 0.3 s).
    wait_for("the purges at the far port", WAIT, || {
        server_says.lock().unwrap().contains("purge output")
    });
    let says = server_says.lock().unwrap().clone();
    // (pyserial's client also purges both buffers when it opens the port: those come first.)
    let after_break = says
        .find("break=True")
        .map(|i| &says[i..])
        .unwrap_or_else(|| panic!("no break at the far port: {says}"));
    let (end, input, output) = (
        after_break.find("break=False"),
        after_break.find("purge input"),
        after_break.find("purge output"),
    );
    assert!(
        end.is_some() && end < input && input < output,
        "the break ends, then both purges, in order: {says}"
    );

    // 2. The RFC 2217 server goes away and comes back: the device side reconnects and the
    //    program's next session works again, the far port set as the program asks.
    drop(server);
    let (server, server_says) = loop_server(python, &server_addr);
    wait_for("the device side to reconnect", WAIT, || {
        server_says.lock().unwrap().contains("client ")
    });
    let (ok, said) = client_check(python, &listen);
    assert!(
        ok,
        "after the server's restart: {said}\napp: {}\ndevice: {}",
        app.stderr_now(),
        dev.stderr_now()
    );
    assert!(
        dev.stderr_now().contains("reconnecting"),
        "{}",
        dev.stderr_now()
    );

    // 3. One client at a time: a second one is told the port is busy.
    let first = std::net::TcpStream::connect(&listen).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut second = std::net::TcpStream::connect(&listen).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut busy = String::new();
    let _ = std::io::Read::read_to_string(&mut second, &mut busy);
    assert!(busy.contains("in use by another client"), "{busy:?}");
    drop(first);
    drop(server);
    drop(app.kill());
    drop(dev.kill());
}

#[test]
fn bad_addresses_are_refused_at_check_time_with_the_key_and_an_example() {
    let dir = Dir::new("rfc2217-bad");
    for (source, want) in [
        (
            r#"{ type = "rfc2217-server", listen = "localhost" }"#,
            "rfc2217-server source: invalid parameter listen: \"localhost\" is not IP:PORT (e.g. \"127.0.0.1:2217\"",
        ),
        (
            r#"{ type = "rfc2217-client", address = "ser2net-host" }"#,
            "rfc2217-client source: invalid parameter address: \"ser2net-host\" is not HOST:PORT (e.g. \"ser2net-host:2000\")",
        ),
        (
            r#"{ type = "rfc2217-client", address = "h:2000", data_bits = 9 }"#,
            "rfc2217-client source: invalid parameter data_bits: must be 5, 6, 7 or 8",
        ),
    ] {
        let cfg = dir.0.join("bad.toml");
        std::fs::write(
            &cfg,
            format!(
                "driver = \"x\"\n[[stream]]\nname = \"s\"\ndirection = \"device-to-app\"\n\
                 source = {source}\nsink = {{ type = \"null\" }}\n"
            ),
        )
        .unwrap();
        let out = ndd().arg("check").arg(&cfg).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{source} passed");
        assert!(err.contains(want), "{source}: {err}");
    }
    // A port in use fails on the machine that has it, before any peer connects.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let cfg = config(&dir.0, "127.0.0.1:9", &addr);
    let out = ndd()
        .arg("check")
        .arg(&cfg)
        .args(["--side", "app"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("key `listen`: cannot listen on {addr}")),
        "{err}"
    );
}

/// Debian's ser2net (4.x, `telnet(rfc2217)` accepter) sharing one end of a pty pair made by
/// socat; the test plays the device on the other end. An unmodified pyserial program on the
/// app side's `rfc2217-server` talks through both ndd sides and ser2net to the "device", and
/// its baud rate change reaches the port ser2net holds.
#[test]
fn a_real_ser2net_port_is_the_device() {
    let Some(python) = python_with_pyserial() else {
        println!("SKIPPED: no python3 with pyserial (Debian: apt-get install python3-serial)");
        return;
    };
    if let Some(m) = missing(&["ser2net", "socat", "stty"]) {
        println!("SKIPPED: needs {m} (apt-get install ser2net socat)");
        return;
    }
    let dir = Dir::new("rfc2217-ser2net");
    let (_pair, port, device) = pty_pair(&dir.0);
    let server_addr = free_addr();
    let (host, tcp) = server_addr.rsplit_once(':').unwrap();
    let yaml = dir.0.join("ser2net.yaml");
    std::fs::write(
        &yaml,
        format!(
            "connection: &con0\n  accepter: telnet(rfc2217),tcp,{host},{tcp}\n  connector: \
             serialdev,{},9600n81,local\n",
            port.display()
        ),
    )
    .unwrap();
    let _ser2net = Killed(
        Command::new("ser2net")
            .args(["-n", "-d", "-c"])
            .arg(&yaml)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ser2net"),
    );
    wait_for("ser2net to listen", WAIT, || {
        std::net::TcpStream::connect(&server_addr).is_ok()
    });
    let listen = free_addr();
    let cfg = config(&dir.0, &server_addr, &listen);
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let link = free_addr();
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &link]));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &link]));
    dev.wait_says("streams agreed", &[&app]);
    // The "device": answers one line with another.
    let dev_path = device.clone();
    let device_side = std::thread::spawn(move || {
        use std::io::{BufRead, Write};
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev_path)
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(f.try_clone().unwrap())
            .read_line(&mut line)
            .unwrap();
        (&f).write_all(b"pong from the device\n").unwrap();
        line
    });
    let program = format!(
        "import serial, subprocess, time\n\
         s = serial.serial_for_url('rfc2217://{listen}', baudrate=9600, timeout=5)\n\
         s.write(b'ping from the program\\n')\n\
         print(s.readline().decode().strip())\n\
         s.baudrate = 57600\n\
         time.sleep(0.5)\n\
         print(subprocess.run(['stty', '-F', '{}', 'speed'], capture_output=True, text=True).stdout.strip())\n\
         s.close()\n",
        port.display()
    );
    let out = Command::new(python)
        .args(["-c", &program])
        .output()
        .expect("python");
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}\napp: {}\ndevice: {}",
        String::from_utf8_lossy(&out.stderr),
        app.stderr_now(),
        dev.stderr_now()
    );
    assert_eq!(device_side.join().unwrap(), "ping from the program\n");
    assert_eq!(said, "pong from the device\n57600\n", "the program saw");
    drop(app.kill());
    drop(dev.kill());
}

/// A client that connects, writes and never reads (issue 31, item 4): what the port echoes
/// back piles up for it until the kernel's buffers hold no more; the server lets it go after
/// `stall_timeout_ms` with a warning that says why, and the next client has the port.
#[test]
fn a_client_that_stops_reading_is_let_go_and_the_port_is_free_again() {
    let Some(python) = python_with_pyserial() else {
        println!("SKIPPED: no python3 with pyserial (Debian: apt-get install python3-serial)");
        return;
    };
    let dir = Dir::new("rfc2217-stall");
    let (dev_home, app_home, _, _) = homes(&dir.0, true, true);
    let (server_addr, listen, link) = (free_addr(), free_addr(), free_addr());
    let (_server, _) = loop_server(python, &server_addr);
    let cfg = config(&dir.0, &server_addr, &listen);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(
            &format!("listen = \"{listen}\""),
            &format!("listen = \"{listen}\", baud = 115200, stall_timeout_ms = 2000"),
        )
        .replace(
            &format!("address = \"{server_addr}\""),
            &format!("address = \"{server_addr}\", baud = 115200"),
        );
    std::fs::write(&cfg, text).unwrap();
    let app = Side::spawn(run_cmd(&cfg, "app", &app_home, &["--listen", &link]));
    let dev = Side::spawn(run_cmd(&cfg, "device", &dev_home, &["--connect", &link]));
    dev.wait_says("streams agreed", &[&app]);
    // Telnet's COM-PORT option asked for, 40 KB written, never a byte read (a small receive
    // buffer: the echo fills it soon, then waits in the server's socket).
    let silent = Command::new(python)
        .arg("-c")
        .arg(format!(
            "import socket, time\n\
             s = socket.socket()\n\
             s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)\n\
             s.connect(('{}', {}))\n\
             s.sendall(bytes([255, 251, 44, 255, 253, 44]) + b'x' * 40000)\n\
             time.sleep(120)\n",
            listen.rsplit_once(':').unwrap().0,
            listen.rsplit_once(':').unwrap().1
        ))
        .spawn()
        .expect("python runs");
    let silent = Killed(silent);
    wait_for("the server to let the silent client go", WAIT, || {
        app.stderr_now()
            .contains("the RFC 2217 client has not read for 2.0 s: let go")
    });
    drop(silent);
    // What the port still echoes of the silent client's bytes (the ones on their way through
    // both sides) is the port's real output: a client takes it until the port is quiet.
    let mut drain = std::net::TcpStream::connect(&listen).unwrap();
    drain
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut drained = 0usize;
    while let Ok(n) = std::io::Read::read(&mut drain, &mut buf) {
        if n == 0 {
            break;
        }
        drained += n;
    }
    drop(drain);
    println!("drained {drained} bytes of the silent client's echo");
    std::thread::sleep(Duration::from_millis(500));
    // The next program has the port, and everything works for it.
    let (ok, said) = client_check(python, &listen);
    assert!(
        ok,
        "the next client: {said}\napp: {}\ndevice: {}",
        app.stderr_now(),
        dev.stderr_now()
    );
    drop(app.kill());
    drop(dev.kill());
}
