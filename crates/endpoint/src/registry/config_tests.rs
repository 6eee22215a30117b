//! Tests of the config side of the registry: every catalogue entry parses with its defaults
//! and rejects unknown keys, the catalogue matches the config structs, and `describe` and
//! `validate` say what the docs say.

use super::*;
use crate::clipboard::X11ClipboardConfig;
use crate::common::framing::Framing;

#[derive(Debug, Deserialize)]
struct Doc<T> {
    e: T,
}

fn parse<T: serde::de::DeserializeOwned>(table: &str) -> Result<T, String> {
    toml::from_str::<Doc<T>>(&format!("e = {table}"))
        .map(|d| d.e)
        .map_err(|e| e.to_string())
}

/// An inline table for `info` with its required keys filled in.
fn minimal(info: &EndpointInfo, extra: &str) -> String {
    let mut s = format!("{{ type = \"{}\"", info.name);
    for (key, ty, default, _) in info.params {
        if *default == REQUIRED {
            let value = match *ty {
                "path" => "/tmp/ndd-example",
                "IP:PORT" => "127.0.0.1:2217",
                "HOST:PORT" => "localhost:2217",
                other => panic!("test knows how to fill paths and addresses, not {other}"),
            };
            s += &format!(", {key} = \"{value}\"");
        }
    }
    s + extra + " }"
}

#[test]
fn every_catalogue_entry_parses_with_defaults_and_rejects_unknown_keys() {
    for info in SOURCES {
        let c: SourceConfig = parse(&minimal(info, "")).expect(info.name);
        assert_eq!(c.name(), info.name);
        assert_eq!(c.info(), info);
        c.validate().expect("defaults are valid");
        let e = parse::<SourceConfig>(&minimal(info, ", bogus_key = 1")).unwrap_err();
        assert!(
            e.contains("unknown field `bogus_key`"),
            "{}: {e}",
            info.name
        );
    }
    for info in SINKS {
        let c: SinkConfig = parse(&minimal(info, "")).expect(info.name);
        assert_eq!(c.name(), info.name);
        assert_eq!(c.info(), info);
        c.validate().expect("defaults are valid");
        let e = parse::<SinkConfig>(&minimal(info, ", bogus_key = 1")).unwrap_err();
        assert!(
            e.contains("unknown field `bogus_key`"),
            "{}: {e}",
            info.name
        );
    }
}

#[test]
fn catalogue_params_match_the_config_keys() {
    // Serialising a fully populated config yields exactly the documented keys.
    let sources = [
        SourceConfig::Synthetic(SyntheticConfig {
            count: Some(1),
            repeat: true,
            ..Default::default()
        }),
        SourceConfig::SpacenavSim(SpacenavSimConfig {
            count: Some(1),
            ..Default::default()
        }),
        SourceConfig::Stdin(StdinConfig::default()),
        SourceConfig::File(FileSourceConfig {
            path: "/x".into(),
            framing: Framing::Raw,
        }),
        SourceConfig::Serial(SerialConfig::new("/dev/ttyS0")),
        SourceConfig::Pty(PtyConfig::new("/tmp/ttyX")),
        SourceConfig::Evdev(EvdevConfig {
            path: "/dev/input/event3".into(),
            grab: true,
        }),
        SourceConfig::X11Input(X11InputConfig::default()),
        SourceConfig::WaylandWindowInput(crate::input::WaylandWindowInputConfig::default()),
        SourceConfig::X11Screen(X11ScreenConfig {
            refresh_s: 5.0,
            ..Default::default()
        }),
        SourceConfig::X11Cursor(X11CursorSourceConfig::default()),
        SourceConfig::X11Clipboard(X11ClipboardConfig::default()),
        SourceConfig::WaylandClipboard(crate::clipboard::WaylandClipboardConfig::default()),
        SourceConfig::GnomeClipboard(crate::clipboard::GnomeClipboardConfig {
            bus: "unix:path=/run/user/1000/bus".into(),
            ..Default::default()
        }),
        SourceConfig::Rfc2217Server(parse("{ listen = \"127.0.0.1:2217\" }").unwrap()),
        SourceConfig::Rfc2217Client(parse("{ address = \"h:1\" }").unwrap()),
        SourceConfig::CameraSim(crate::camera::CameraSimConfig {
            count: Some(1),
            ..Default::default()
        }),
        SourceConfig::PulseCapture(crate::audio::PulseCaptureConfig {
            device: Some("d".into()),
            virtual_sink: Some("v".into()),
            server: Some("s".into()),
            ..Default::default()
        }),
        SourceConfig::V4l2(parse("{ path = \"/dev/video0\", count = 1 }").unwrap()),
        SourceConfig::WaylandScreen(crate::display::WaylandScreenConfig {
            output: Some("DP-1".into()),
            protocol: crate::display::WaylandProtocol::Ext,
            ..Default::default()
        }),
        SourceConfig::GnomeScreen(crate::display::GnomeScreenConfig {
            monitor: Some("DP-1".into()),
            pipewire: "/run/user/1000/pipewire-0".into(),
            ..Default::default()
        }),
        SourceConfig::PortalScreen(crate::display::PortalScreenConfig {
            token_file: Some("/var/lib/ndd/portal.token".into()),
            ..Default::default()
        }),
    ];
    let sinks = [
        SinkConfig::Stdout(StdoutConfig::default()),
        SinkConfig::File(FileSinkConfig {
            path: "/x".into(),
            framing: Framing::Raw,
            append: false,
        }),
        SinkConfig::Check(CheckConfig {
            seed: Some(1),
            size: Some(1),
            expect: Some(1),
        }),
        SinkConfig::Null(NullConfig {}),
        SinkConfig::Serial(SerialConfig::new("/dev/ttyS0")),
        SinkConfig::Pty(PtyConfig::new("/tmp/ttyX")),
        SinkConfig::Uinput(UinputConfig::default()),
        SinkConfig::Xtest(XtestConfig::default()),
        SinkConfig::WaylandInput(crate::input::WaylandInputConfig::default()),
        SinkConfig::GnomeInput(crate::input::GnomeInputConfig {
            monitor: Some("DP-1".into()),
            ..Default::default()
        }),
        SinkConfig::KdeInput(crate::input::KdeInputConfig::default()),
        SinkConfig::PortalInput(crate::input::PortalInputConfig {
            token_file: Some("/var/lib/ndd/input.token".into()),
            ..Default::default()
        }),
        SinkConfig::X11Window(X11WindowConfig {
            resize: crate::display::Resize::Remote,
            scale: crate::display::ViewScale::Hundredths(200),
            ..X11WindowConfig::default()
        }),
        SinkConfig::WaylandWindow(crate::display::WaylandWindowConfig::default()),
        SinkConfig::Framebuffer(FramebufferConfig {
            path: "/dev/fb0".into(),
        }),
        SinkConfig::X11Cursor(X11CursorSinkConfig::default()),
        SinkConfig::X11Clipboard(X11ClipboardConfig::default()),
        SinkConfig::WaylandClipboard(crate::clipboard::WaylandClipboardConfig::default()),
        SinkConfig::GnomeClipboard(crate::clipboard::GnomeClipboardConfig::default()),
        SinkConfig::Rfc2217Server(parse("{ listen = \"127.0.0.1:2217\" }").unwrap()),
        SinkConfig::Rfc2217Client(parse("{ address = \"h:1\" }").unwrap()),
        SinkConfig::Y4m(parse("{ path = \"/tmp/c.y4m\" }").unwrap()),
        SinkConfig::V4l2loopback(parse("{ path = \"/dev/video10\" }").unwrap()),
        SinkConfig::PulsePlayback(crate::audio::PulsePlaybackConfig {
            device: Some("d".into()),
            virtual_source: Some("v".into()),
            max_wait_ms: Some(100),
            server: Some("s".into()),
            ..Default::default()
        }),
    ];
    assert_eq!(sources.len(), SOURCES.len());
    assert_eq!(sinks.len(), SINKS.len());
    let keys = |v: toml::Value| -> Vec<String> {
        let mut k: Vec<String> = v
            .as_table()
            .expect("table")
            .keys()
            .filter(|k| *k != "type")
            .cloned()
            .collect();
        k.sort();
        k
    };
    let documented = |info: &EndpointInfo| -> Vec<String> {
        let mut k: Vec<String> = info.params.iter().map(|p| p.0.to_string()).collect();
        k.sort();
        k
    };
    for s in &sources {
        assert_eq!(
            keys(toml::Value::try_from(s).unwrap()),
            documented(s.info())
        );
    }
    for s in &sinks {
        assert_eq!(
            keys(toml::Value::try_from(s).unwrap()),
            documented(s.info())
        );
    }
}

#[test]
fn paths_mut_names_every_path_parameter() {
    // (Optional paths given too.)
    let optional = |info: &EndpointInfo| -> String {
        info.params
            .iter()
            .filter(|p| p.1 == "path" && p.2 != REQUIRED)
            .map(|p| format!(", {} = \"/tmp/ndd-example\"", p.0))
            .collect()
    };
    for info in SOURCES {
        let mut c: SourceConfig = parse(&minimal(info, &optional(info))).expect(info.name);
        let want = info.params.iter().filter(|p| p.1 == "path").count();
        assert_eq!(c.paths_mut().len(), want, "{}", info.name);
        for p in c.paths_mut() {
            assert_eq!(*p, PathBuf::from("/tmp/ndd-example"), "{}", info.name);
        }
    }
    for info in SINKS {
        let mut c: SinkConfig = parse(&minimal(info, &optional(info))).expect(info.name);
        let want = info.params.iter().filter(|p| p.1 == "path").count();
        assert_eq!(c.paths_mut().len(), want, "{}", info.name);
        for p in c.paths_mut() {
            assert_eq!(*p, PathBuf::from("/tmp/ndd-example"), "{}", info.name);
        }
    }
}

#[test]
fn defaults_are_the_documented_ones() {
    let c: SourceConfig = parse(r#"{ type = "synthetic" }"#).unwrap();
    assert_eq!(c, SourceConfig::Synthetic(SyntheticConfig::default()));
    assert_eq!(c.describe(), "synthetic(size=100, interval_ms=16)");
    let c: SourceConfig = parse(r#"{ type = "spacenav-sim" }"#).unwrap();
    assert_eq!(c.describe(), "spacenav-sim(rate_hz=62.5)");
    let c: SinkConfig = parse(r#"{ type = "file", path = "/tmp/o" }"#).unwrap();
    assert_eq!(
        c,
        SinkConfig::File(FileSinkConfig {
            path: "/tmp/o".into(),
            framing: Framing::Raw,
            append: false
        })
    );
    let c: SinkConfig = parse(r#"{ type = "check" }"#).unwrap();
    assert_eq!(c, SinkConfig::Check(CheckConfig::default()));
    assert_eq!(c.describe(), "check");
    let c: SourceConfig = parse(r#"{ type = "x11-screen" }"#).unwrap();
    assert_eq!(c, SourceConfig::X11Screen(X11ScreenConfig::default()));
    assert_eq!(c.describe(), "x11-screen(display=:0, max_fps=30)");
    let c: SinkConfig = parse(r#"{ type = "x11-window" }"#).unwrap();
    assert_eq!(c, SinkConfig::X11Window(X11WindowConfig::default()));
    assert_eq!(c.describe(), "x11-window(display=:0, title=ndd display)");
    let c: SinkConfig = parse(r#"{ type = "x11-window", scale = 1.5 }"#).unwrap();
    assert!(
        matches!(c, SinkConfig::X11Window(ref w) if w.scale.factor() == Some(1.5)),
        "{c:?}"
    );
    for bad in [r#""big""#, "0.5", "9"] {
        let e = parse::<SinkConfig>(&format!(r#"{{ type = "x11-window", scale = {bad} }}"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("give \"auto\" or a number from 1 to 4"), "{e}");
    }
    let c: SourceConfig = parse(r#"{ type = "x11-input" }"#).unwrap();
    assert_eq!(c.describe(), "x11-input(display=:0, window=create)");
}

#[test]
fn describe_shows_set_parameters() {
    let c: SourceConfig =
        parse(r#"{ type = "synthetic", size = 8, interval_ms = 0.5, count = 3, seed = 9 }"#)
            .unwrap();
    assert_eq!(
        c.describe(),
        "synthetic(size=8, interval_ms=0.5, count=3, seed=9)"
    );
    let c: SourceConfig =
        parse(r#"{ type = "file", path = "/tmp/in", framing = "lines" }"#).unwrap();
    assert_eq!(c.describe(), "file(path=/tmp/in, framing=lines)");
    let c: SourceConfig = parse(r#"{ type = "stdin", framing = "length" }"#).unwrap();
    assert_eq!(c.describe(), "stdin(framing=length)");
    let c: SinkConfig =
        parse(r#"{ type = "file", path = "/tmp/o", framing = "length", append = true }"#).unwrap();
    assert_eq!(c.describe(), "file(path=/tmp/o, framing=length, append)");
    let c: SinkConfig = parse(r#"{ type = "check", seed = 1, expect = 50 }"#).unwrap();
    assert_eq!(c.describe(), "check(seed=1, expect=50)");
    let c: SinkConfig = parse(r#"{ type = "stdout" }"#).unwrap();
    assert_eq!(c.describe(), "stdout(framing=raw)");
    let c: SinkConfig = parse(r#"{ type = "null" }"#).unwrap();
    assert_eq!(c.describe(), "null");
    let c: SourceConfig = parse(r#"{ type = "serial", path = "/dev/ttyUSB0" }"#).unwrap();
    assert_eq!(c.describe(), "serial(path=/dev/ttyUSB0, 115200 8N1)");
    let c: SinkConfig = parse(
        r#"{ type = "serial", path = "/dev/ttyS1", baud = 9600, data_bits = 7,
             parity = "even", stop_bits = 2, flow = "rtscts" }"#,
    )
    .unwrap();
    assert_eq!(c.describe(), "serial(path=/dev/ttyS1, 9600 7E2 rtscts)");
    let c: SinkConfig = parse(r#"{ type = "pty", link = "/tmp/ttyREMOTE" }"#).unwrap();
    assert_eq!(c, SinkConfig::Pty(PtyConfig::new("/tmp/ttyREMOTE")));
    assert_eq!(c.describe(), "pty(link=/tmp/ttyREMOTE)");
    let c: SourceConfig =
        parse(r#"{ type = "pty", link = "/tmp/ttyREMOTE", baud = 9600, parity = "odd" }"#).unwrap();
    assert_eq!(c.describe(), "pty(link=/tmp/ttyREMOTE, 9600 8O1)");
    let c: SourceConfig =
        parse(r#"{ type = "x11-screen", display = ":1", max_fps = 60.0, refresh_s = 2.5 }"#)
            .unwrap();
    assert_eq!(
        c.describe(),
        "x11-screen(display=:1, max_fps=60, refresh_s=2.5)"
    );
    let c: SinkConfig =
        parse(r#"{ type = "x11-window", display = ":2", title = "remote" }"#).unwrap();
    assert_eq!(c.describe(), "x11-window(display=:2, title=remote)");
    let c: SinkConfig = parse(r#"{ type = "framebuffer", path = "/dev/fb0" }"#).unwrap();
    assert_eq!(c.describe(), "framebuffer(path=/dev/fb0)");
    let c: SourceConfig = parse(r#"{ type = "x11-input", window = "viewer" }"#).unwrap();
    assert_eq!(c.describe(), "x11-input(display=:0, window=viewer)");
}

#[test]
fn bad_values_are_errors_that_name_them() {
    let e = parse::<SourceConfig>(r#"{ type = "file" }"#).unwrap_err();
    assert!(e.contains("missing field `path`"), "{e}");
    let e = parse::<SourceConfig>(r#"{ type = "stdin", framing = "csv" }"#).unwrap_err();
    assert!(e.contains("unknown variant `csv`"), "{e}");
    let e = parse::<SourceConfig>(r#"{ type = "webcam" }"#).unwrap_err();
    assert!(e.contains("unknown variant `webcam`"), "{e}");
    let e = parse::<SourceConfig>(r#"{ type = "synthetic", size = -1 }"#).unwrap_err();
    assert!(e.contains("size") || e.contains("invalid value"), "{e}");

    let c: SourceConfig = parse(r#"{ type = "synthetic", interval_ms = -1.0 }"#).unwrap();
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "synthetic source: invalid parameter interval_ms: must be a finite number >= 0"
    );
    let c: SourceConfig = parse(r#"{ type = "synthetic", interval_ms = nan }"#).unwrap();
    assert!(c.validate().is_err());
    let c: SourceConfig = parse(r#"{ type = "synthetic", size = 100000000 }"#).unwrap();
    assert!(c.validate().unwrap_err().to_string().contains("size"));
    let c: SourceConfig = parse(r#"{ type = "spacenav-sim", rate_hz = 0.0 }"#).unwrap();
    assert!(c.validate().unwrap_err().to_string().contains("rate_hz"));

    let c: SourceConfig = parse(r#"{ type = "x11-screen", max_fps = 0.0 }"#).unwrap();
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "x11-screen source: invalid parameter max_fps: must be a finite number > 0"
    );
    let c: SourceConfig = parse(r#"{ type = "x11-screen", max_fps = inf }"#).unwrap();
    assert!(c.validate().is_err());
    let c: SourceConfig = parse(r#"{ type = "x11-screen", refresh_s = -1.0 }"#).unwrap();
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "x11-screen source: invalid parameter refresh_s: must be a finite number >= 0 (0 = off)"
    );
    let c: SourceConfig = parse(r#"{ type = "pulse-capture", max_wait_ms = 5 }"#).unwrap();
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "pulse-capture source: invalid parameter max_wait_ms: must be 10..=10000"
    );
    let c: SinkConfig = parse(r#"{ type = "pulse-playback", max_wait_ms = 100 }"#).unwrap();
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "pulse-playback sink: invalid parameter max_wait_ms: applies to a `virtual_source` (its FIFO); a sink's buffer is `latency_ms`"
    );
    let c: SinkConfig =
        parse(r#"{ type = "pulse-playback", virtual_source = "m", max_wait_ms = 5 }"#).unwrap();
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "pulse-playback sink: invalid parameter max_wait_ms: must be 10..=10000"
    );
    let e = parse::<SinkConfig>(r#"{ type = "framebuffer" }"#).unwrap_err();
    assert!(e.contains("missing field `path`"), "{e}");
    let e = parse::<SourceConfig>(r#"{ type = "x11-input", window = "other" }"#).unwrap_err();
    assert!(e.contains("unknown variant `other`"), "{e}");
    let c = SinkConfig::X11Window(X11WindowConfig {
        title: "a\0b".into(),
        ..Default::default()
    });
    assert!(c.validate().unwrap_err().to_string().contains("title"));
}
