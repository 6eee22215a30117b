//! `serial` and `pty` endpoints end to end, without hardware.
//!
//! A pty pair stands in for the real port: the device-side `serial` endpoints open its slave
//! (as they would `/dev/ttyUSB0`) while the test plays the device on its master. The app side
//! is the `pty` endpoint, whose slave the "application" (this test, `stty`, or a pyserial
//! program) opens through the symlink. The two streams are wired with plain channels:
//!
//! ```text
//! device (test, stand-in master) ⇄ serial source/sink ⇄ channels ⇄ pty sink/source ⇄ app (link)
//! ```

use ndd_core::{Frame, Meta};
use ndd_endpoint::{
    EndpointError, PtyConfig, SerialConfig, SerialMessage, SinkConfig, SinkReport, SourceConfig,
    SourceReport,
};
use rustix::termios::ControlModes;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Upper bound for anything that should happen "soon" (a failure deadline, not a speed claim).
const DEADLINE: Duration = Duration::from_secs(15);

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ndd-serial-it-{}-{name}", std::process::id()))
}

/// A pty pair standing in for a real serial port: `path` is what the device-side endpoint
/// opens, `device` is the other end of the cable.
struct StandIn {
    device: File,
    path: PathBuf,
}

fn stand_in() -> StandIn {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).unwrap();
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    StandIn {
        path: PathBuf::from(name.to_str().unwrap()),
        device: File::from(master),
    }
}

impl StandIn {
    /// The port's current termios, as the device-side endpoint left it.
    fn termios(&self) -> rustix::termios::Termios {
        rustix::termios::tcgetattr(&self.device).unwrap()
    }
}

/// The app opening the port the way a serial program does (raw mode is already set by the
/// pty endpoint; we do not touch termios).
fn app_open(link: &Path) -> File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(link)
        .unwrap_or_else(|e| panic!("open {}: {e}", link.display()))
}

/// Both streams of one serial driver, device and app side in one process.
struct Driver {
    dev_src: JoinHandle<Result<SourceReport, EndpointError>>,
    app_sink: JoinHandle<Result<SinkReport, EndpointError>>,
    app_src: JoinHandle<Result<SourceReport, EndpointError>>,
    dev_sink: JoinHandle<Result<SinkReport, EndpointError>>,
}

fn driver(port: &Path, link: &Path) -> Driver {
    let serial = SerialConfig::new(port);
    let pty = PtyConfig::new(link);
    // device→app: tty RX → pty
    let (tx1, rx1) = mpsc::channel(16);
    let app_sink = SinkConfig::Pty(pty.clone()).spawn(rx1).unwrap();
    let dev_src = SourceConfig::Serial(serial.clone()).spawn(1, tx1).unwrap();
    // app→device: pty → tty TX
    let (tx2, rx2) = mpsc::channel(16);
    let dev_sink = SinkConfig::Serial(serial).spawn(rx2).unwrap();
    let app_src = SourceConfig::Pty(pty).spawn(2, tx2).unwrap();
    Driver {
        dev_src,
        app_sink,
        app_src,
        dev_sink,
    }
}

impl Driver {
    /// Stops both sources (as a dropped link would); the sinks then drain and end.
    async fn stop(self) -> (SinkReport, SinkReport) {
        self.dev_src.abort();
        self.app_src.abort();
        let _ = self.dev_src.await;
        let _ = self.app_src.await;
        let app = self.app_sink.await.unwrap().unwrap();
        let dev = self.dev_sink.await.unwrap().unwrap();
        (app, dev)
    }
}

/// Deterministic test content that uses every byte value (XON/XOFF, CR, LF, NUL included).
fn pattern(len: usize, mul: usize, add: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * mul + add + (i >> 11)) & 0xff) as u8)
        .collect()
}

fn read_exact_within(mut f: File, n: usize) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut got = vec![0u8; n];
        f.read_exact(&mut got).unwrap();
        got
    })
}

async fn join<T: Send + 'static>(h: std::thread::JoinHandle<T>, what: &str) -> T {
    let joined = tokio::task::spawn_blocking(move || h.join().unwrap());
    tokio::time::timeout(DEADLINE, joined)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {DEADLINE:?}"))
        .unwrap()
}

/// Open descriptors of this process that refer to `path`.
fn fds_on(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t == path)
        .count()
}

/// One test at a time opens ptys: `/dev/pts/N` and fd numbers are the lowest free ones, so a
/// pty another test opens right after one closed here takes its name, and the check that this
/// test's pty was closed counted the other test's (seen with four test threads on two cores).
static PTYS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: not seen within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_megabyte_each_way_is_byte_identical() {
    let _ptys = PTYS.lock().await;
    const N: usize = 1 << 20;
    let port = stand_in();
    let link = temp_path("bytes");
    let d = driver(&port.path, &link);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());

    let to_dev = pattern(N, 7, 3);
    let to_app = pattern(N, 13, 5);
    let app = app_open(&link);
    let app_rx = read_exact_within(app.try_clone().unwrap(), N);
    let dev_rx = read_exact_within(port.device.try_clone().unwrap(), N);
    let (mut app_w, mut dev_w) = (app, port.device.try_clone().unwrap());
    let (a, b) = (to_dev.clone(), to_app.clone());
    let app_tx = std::thread::spawn(move || app_w.write_all(&a).unwrap());
    let dev_tx = std::thread::spawn(move || dev_w.write_all(&b).unwrap());
    join(app_tx, "app writes 1 MB").await;
    join(dev_tx, "device writes 1 MB").await;
    let at_dev = join(dev_rx, "device reads 1 MB").await;
    let at_app = join(app_rx, "app reads 1 MB").await;
    assert!(at_dev == to_dev, "app→device bytes differ");
    assert!(at_app == to_app, "device→app bytes differ");

    let (app_report, dev_report) = d.stop().await;
    // Every frame carries one type byte in front of its data.
    assert_eq!(app_report.bytes - app_report.frames, N as u64);
    assert!(dev_report.bytes - dev_report.frames >= N as u64);
    assert!(
        std::fs::symlink_metadata(&link).is_err(),
        "link removed at the end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_settings_set_by_the_app_reach_the_device_tty() {
    let _ptys = PTYS.lock().await;
    let port = stand_in();
    let link = temp_path("stty");
    let d = driver(&port.path, &link);
    assert_eq!(port.termios().output_speed(), 115_200);

    let stty = |args: &[&str]| {
        let out = std::process::Command::new("stty")
            .arg("-F")
            .arg(&link)
            .args(args)
            .output()
            .expect("stty runs");
        assert!(out.status.success(), "stty {args:?}: {out:?}");
    };
    stty(&["9600"]);
    wait_for("9600 baud on the device tty", || {
        port.termios().output_speed() == 9600
    })
    .await;
    // Data bits and parity cannot be seen on a Linux pty (it forces CS8, no parity), so
    // the test changes what a pty does keep: stop bits and flow control.
    stty(&["cstopb", "crtscts"]);
    wait_for("2 stop bits with RTS/CTS on the device tty", || {
        let cm = port.termios().control_modes;
        cm.contains(ControlModes::CSTOPB | ControlModes::CRTSCTS)
    })
    .await;
    stty(&["-crtscts", "ixon", "ixoff"]);
    wait_for("XON/XOFF on the device tty", || {
        let t = port.termios();
        !t.control_modes.contains(ControlModes::CRTSCTS)
            && t.input_modes
                .contains(rustix::termios::InputModes::IXON | rustix::termios::InputModes::IXOFF)
    })
    .await;
    // A rate with no B-constant, set the way a program does it on Linux (termios2, BOTHER;
    // this coreutils stty knows the B-constants only).
    let app = app_open(&link);
    let mut t = rustix::termios::tcgetattr(&app).unwrap();
    t.set_speed(250_000).unwrap();
    rustix::termios::tcsetattr(&app, rustix::termios::OptionalActions::Now, &t).unwrap();
    drop(app);
    wait_for("250000 baud on the device tty", || {
        port.termios().output_speed() == 250_000
    })
    .await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_can_close_and_reopen_the_port() {
    let _ptys = PTYS.lock().await;
    let port = stand_in();
    let link = temp_path("reopen");
    let d = driver(&port.path, &link);
    let mut device = port.device.try_clone().unwrap();
    for round in 0..5u8 {
        let mut app = app_open(&link);
        let msg = [b'u', b'p', round];
        app.write_all(&msg).unwrap();
        let got = join(read_exact_within(device.try_clone().unwrap(), 3), "up").await;
        assert_eq!(got, msg, "round {round}");
        let back = [b'd', b'n', round];
        device.write_all(&back).unwrap();
        let got = join(read_exact_within(app.try_clone().unwrap(), 3), "down").await;
        assert_eq!(got, back, "round {round}");
        drop(app);
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_streams_share_one_file_and_the_link_lives_until_both_end() {
    let _ptys = PTYS.lock().await;
    let port = stand_in();
    let link = temp_path("shared");
    let d = driver(&port.path, &link);
    let slave = std::fs::read_link(&link).unwrap();
    assert!(slave.starts_with("/dev/pts"), "{}", slave.display());
    assert_eq!(fds_on(&port.path), 1, "serial source and sink share one fd");
    assert_eq!(fds_on(&slave), 1, "pty source and sink share one slave fd");

    // One stream ending keeps the file and the link for the other.
    d.app_src.abort();
    let _ = d.app_src.await;
    d.dev_sink.await.unwrap().unwrap();
    assert_eq!(fds_on(&port.path), 1);
    assert!(
        std::fs::read_link(&link).is_ok(),
        "link kept for the other stream"
    );

    d.dev_src.abort();
    let _ = d.dev_src.await;
    d.app_sink.await.unwrap().unwrap();
    assert_eq!(fds_on(&port.path), 0, "tty closed when both are done");
    assert_eq!(fds_on(&slave), 0, "pty closed when both are done");
    assert!(std::fs::symlink_metadata(&link).is_err(), "link removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_symlink_is_replaced_but_a_regular_file_is_refused() {
    let _ptys = PTYS.lock().await;
    let link = temp_path("stale");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/dev/pts/does-not-exist", &link).unwrap();
    let (_tx, rx) = mpsc::channel::<Frame>(1);
    let sink = SinkConfig::Pty(PtyConfig::new(&link)).spawn(rx).unwrap();
    let target = std::fs::read_link(&link).unwrap();
    assert!(
        target.starts_with("/dev/pts/") && target.exists(),
        "{target:?}"
    );
    drop(_tx);
    sink.await.unwrap().unwrap();
    assert!(std::fs::symlink_metadata(&link).is_err());

    let file = temp_path("regular");
    std::fs::write(&file, "keep me").unwrap();
    let (_tx, rx) = mpsc::channel::<Frame>(1);
    let e = SinkConfig::Pty(PtyConfig::new(&file))
        .spawn(rx)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        format!(
            "pty sink: cannot open {}: a regular file is in the way; refusing to replace it \
             (only a symlink is replaced)",
            file.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    std::fs::remove_file(&file).unwrap();
}

#[tokio::test]
async fn opening_errors_are_clear() {
    let _ptys = PTYS.lock().await;
    let missing = temp_path("no-such-tty");
    let (tx, _rx) = mpsc::channel(1);
    let e = SourceConfig::Serial(SerialConfig::new(&missing))
        .spawn(0, tx)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "serial source: cannot open {}: No such file or directory (os error 2)",
            missing.display()
        )
    );

    let file = temp_path("not-a-tty");
    std::fs::write(&file, "").unwrap();
    let (_tx, rx) = mpsc::channel(1);
    let e = SinkConfig::Serial(SerialConfig::new(&file))
        .spawn(rx)
        .unwrap_err();
    std::fs::remove_file(&file).unwrap();
    assert_eq!(
        e.to_string(),
        format!(
            "serial sink: cannot open {}: not a terminal (tty)",
            file.display()
        )
    );

    // The two endpoints of one port must agree on its settings.
    let port = stand_in();
    let (tx, _rx) = mpsc::channel(1);
    let src = SourceConfig::Serial(SerialConfig::new(&port.path))
        .spawn(0, tx)
        .unwrap();
    let (_tx2, rx) = mpsc::channel(1);
    let mut other = SerialConfig::new(&port.path);
    other.baud = 9600;
    let e = SinkConfig::Serial(other).spawn(rx).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "serial sink: cannot open {}: already opened by the other stream with settings \
             115200 8N1, this one asks for 9600 8N1",
            port.path.display()
        )),
        "{e}"
    );
    src.abort();
}

#[test]
fn bad_settings_values_are_clear_errors() {
    #[derive(serde::Deserialize)]
    struct One {
        e: SourceConfig,
    }
    let parse = |t: &str| toml::from_str::<One>(&format!("e = {t}")).map(|o| o.e);
    let invalid = |t: &str| parse(t).unwrap().validate().unwrap_err().to_string();
    assert_eq!(
        invalid(r#"{ type = "serial", path = "/dev/ttyS0", data_bits = 9 }"#),
        "serial source: invalid parameter data_bits: must be 5, 6, 7 or 8"
    );
    assert_eq!(
        invalid(r#"{ type = "serial", path = "/dev/ttyS0", stop_bits = 3 }"#),
        "serial source: invalid parameter stop_bits: must be 1 or 2"
    );
    assert_eq!(
        invalid(r#"{ type = "pty", link = "/tmp/ttyX", baud = 0 }"#),
        "pty source: invalid parameter baud: must be > 0"
    );
    let e = parse(r#"{ type = "serial", path = "/dev/ttyS0", parity = "sometimes" }"#)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(
            "unknown variant `sometimes`, expected one of `none`, `odd`, `even`, `mark`, `space`"
        ),
        "{e}"
    );
    let e = parse(r#"{ type = "serial", path = "/dev/ttyS0", flow = "hardware" }"#)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("unknown variant `hardware`, expected one of `none`, `rtscts`, `xonxoff`"),
        "{e}"
    );
    let e = parse(r#"{ type = "serial", path = "/dev/ttyS0", baud = -1 }"#)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("baud") || e.contains("invalid value"), "{e}");
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

#[tokio::test]
async fn serial_sink_applies_settings_frames_and_refuses_malformed_ones() {
    let _ptys = PTYS.lock().await;
    let port = stand_in();
    let (tx, rx) = mpsc::channel(8);
    let sink = SinkConfig::Serial(SerialConfig::new(&port.path))
        .spawn(rx)
        .unwrap();
    let settings = ndd_endpoint::LineSettings {
        baud: 31_250,
        data_bits: 8,
        parity: ndd_endpoint::Parity::Odd,
        stop_bits: 2,
        flow: ndd_endpoint::Flow::None,
    };
    tx.send(frame(0, &SerialMessage::Settings(settings).emit()))
        .await
        .unwrap();
    // DTR/RTS cannot be set on a pty: ignored with a warning, not an error.
    tx.send(frame(1, &[0x02, 0x03, 0x01])).await.unwrap();
    tx.send(frame(2, b"\x00ok")).await.unwrap();
    let mut got = [0u8; 2];
    let mut dev = port.device.try_clone().unwrap();
    let reader = std::thread::spawn(move || {
        dev.read_exact(&mut got).unwrap();
        got
    });
    assert_eq!(&join(reader, "data after settings").await, b"ok");
    // (Parity is applied too, but the stand-in, a pty, does not keep it.)
    let t = port.termios();
    assert_eq!(t.output_speed(), 31_250);
    assert!(t.control_modes.contains(ControlModes::CSTOPB));

    tx.send(frame(3, &[0x07, 1, 2])).await.unwrap();
    let e = sink.await.unwrap().unwrap_err().to_string();
    assert_eq!(
        e,
        "serial sink: bad serial frame (seq 3): unknown type byte 0x07 \
         (expected 0x00 data, 0x01 line settings, 0x02 modem lines, 0x03 break, 0x04 purge)"
    );

    let link = temp_path("malformed");
    let (tx, rx) = mpsc::channel(8);
    let sink = SinkConfig::Pty(PtyConfig::new(&link)).spawn(rx).unwrap();
    tx.send(frame(9, &[0x01, 0, 0, 0x25, 0x80, 9, 0, 1, 0]))
        .await
        .unwrap();
    let e = sink.await.unwrap().unwrap_err().to_string();
    assert_eq!(
        e,
        "pty sink: bad serial frame (seq 9): line settings: invalid data_bits 9"
    );
    assert!(std::fs::symlink_metadata(&link).is_err());
    let (tx, rx) = mpsc::channel(8);
    let sink = SinkConfig::Pty(PtyConfig::new(&link)).spawn(rx).unwrap();
    tx.send(frame(0, &[])).await.unwrap();
    let e = sink.await.unwrap().unwrap_err().to_string();
    assert_eq!(
        e,
        "pty sink: bad serial frame (seq 0): empty payload (no type byte)"
    );
}

/// A python3 that has pyserial, if any.
fn python_with_pyserial() -> Option<&'static str> {
    ndd_procs::python_with("serial")
}

const PYSERIAL_APP: &str = r#"
import sys, threading, time, serial
link, n = sys.argv[1], int(sys.argv[2])
def pattern(n, mul, add):
    return bytes(((i * mul + add + (i >> 11)) & 0xff) for i in range(n))
ser = serial.Serial(link, 115200, timeout=1)
print("ready", flush=True)
out = pattern(n, 7, 3)
w = threading.Thread(target=lambda: ser.write(out))
w.start()
got = bytearray()
deadline = time.time() + 15
while len(got) < n and time.time() < deadline:
    got += ser.read(n - len(got))
w.join()
ser.flush()
if bytes(got) != pattern(n, 13, 5):
    print("rx mismatch: %d bytes" % len(got), flush=True)
    sys.exit(1)
ser.baudrate = 9600
ser.stopbits = serial.STOPBITS_TWO
print("rx ok, settings changed", flush=True)
sys.stdin.readline()
ser.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pyserial_program_talks_to_the_device_unmodified() {
    let _ptys = PTYS.lock().await;
    let Some(python) = python_with_pyserial() else {
        eprintln!("SKIPPED: no python3 with pyserial (Debian: apt-get install python3-serial)");
        return;
    };
    const N: usize = 1 << 20;
    let port = stand_in();
    let link = temp_path("pyserial");
    let d = driver(&port.path, &link);
    let mut child = std::process::Command::new(python)
        .args(["-c", PYSERIAL_APP])
        .arg(&link)
        .arg(N.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let line = |r: &mut std::io::BufReader<std::process::ChildStdout>| {
        let mut s = String::new();
        std::io::BufRead::read_line(r, &mut s).unwrap();
        s
    };
    let ready = std::thread::spawn(move || {
        let l = line(&mut stdout);
        (l, stdout)
    });
    let (l, mut stdout) = join(ready, "pyserial opens the port").await;
    assert_eq!(l.trim(), "ready");

    let dev_rx = read_exact_within(port.device.try_clone().unwrap(), N);
    let mut dev_w = port.device.try_clone().unwrap();
    let dev_tx = std::thread::spawn(move || dev_w.write_all(&pattern(N, 13, 5)).unwrap());
    join(dev_tx, "device writes 1 MB").await;
    let at_dev = join(dev_rx, "device reads 1 MB").await;
    assert!(at_dev == pattern(N, 7, 3), "app→device bytes differ");
    let verdict = join(
        std::thread::spawn(move || line(&mut stdout)),
        "pyserial verdict",
    )
    .await;
    assert_eq!(verdict.trim(), "rx ok, settings changed");
    wait_for("9600 baud, 2 stop bits on the device tty", || {
        let t = port.termios();
        t.output_speed() == 9600 && t.control_modes.contains(ControlModes::CSTOPB)
    })
    .await;
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    d.stop().await;
    assert!(std::fs::symlink_metadata(&link).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_sink_marks_every_frame_delivered_once_written() {
    let _ptys = PTYS.lock().await;
    const N: u64 = 40;
    let link = temp_path("delivered");
    let (tx, rx) = mpsc::channel(4);
    let delivered = ndd_endpoint::Delivered::default();
    let sink = SinkConfig::Pty(PtyConfig::new(&link))
        .spawn_tracked(rx, delivered.clone())
        .unwrap();
    wait_for("the pty link", || std::fs::symlink_metadata(&link).is_ok()).await;
    let app = app_open(&link);
    let data: Vec<Vec<u8>> = (0..N as usize).map(|i| pattern(1 + i * 37, 7, i)).collect();
    let total: usize = data.iter().map(Vec::len).sum();
    let reader = read_exact_within(app, total);
    assert_eq!(delivered.get(), None);
    for (seq, d) in data.iter().enumerate() {
        tx.send(frame(seq as u64, &SerialMessage::Data(d).emit()))
            .await
            .unwrap();
    }
    assert_eq!(join(reader, "the app's bytes").await, data.concat());
    wait_for("the last frame delivered", || {
        delivered.get() == Some(N - 1)
    })
    .await;
    drop(tx);
    let r = sink.await.unwrap().unwrap();
    assert_eq!(r.frames, N);
    assert_eq!(delivered.get(), Some(N - 1));
}
