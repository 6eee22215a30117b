//! Endpoint configuration, as written in a config file: `{ type = "synthetic", size = 100 }`.
//!
//! Config types are plain data (serde), separate from the tasks that run them
//! ([`SourceConfig::spawn`], [`SinkConfig::spawn`]). Every variant rejects unknown keys, and
//! [`SOURCES`] / [`SINKS`] list every endpoint with its parameters for `ndd modules`.

use crate::check::{CheckConfig, NullConfig};
use crate::common::error::EndpointError;
use crate::common::framing::MAX_LENGTH_FRAME;
use crate::display::{FramebufferConfig, X11ScreenConfig, X11WindowConfig};
use crate::file::{FileSinkConfig, FileSourceConfig};
use crate::input::{EvdevConfig, UinputConfig, X11InputConfig, XtestConfig};
use crate::serial::{LineSettings, PtyConfig, SerialConfig};
use crate::stdio::{StdinConfig, StdoutConfig};
use crate::synthetic::{SpacenavSimConfig, SyntheticConfig};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::PathBuf;

/// Catalogue entry of an endpoint, for `ndd modules` and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointInfo {
    /// `type = "…"` in config files.
    pub name: &'static str,
    /// One line.
    pub summary: &'static str,
    /// `(key, type, default, doc)` for every parameter; default `required` marks a key that
    /// must be given, `none` an optional key that is off when absent.
    pub params: &'static [(&'static str, &'static str, &'static str, &'static str)],
}

/// Default of a key that must be given.
pub const REQUIRED: &str = "required";

/// Every source endpoint.
pub const SOURCES: &[EndpointInfo] = &[
    EndpointInfo {
        name: "synthetic",
        summary: "benchmark device: `size` seeded pseudo-random bytes every `interval_ms`",
        params: &[
            (
                "size",
                "integer, 0..=67108864",
                "100",
                "payload bytes per frame",
            ),
            (
                "interval_ms",
                "float >= 0",
                "16.0",
                "time between frames; 0 = as fast as the stream takes them",
            ),
            (
                "count",
                "integer",
                "none",
                "frames to send, then end the stream; unlimited when absent",
            ),
            (
                "seed",
                "integer",
                "1",
                "content seed; a `check` sink with the same seed verifies every byte",
            ),
        ],
    },
    EndpointInfo {
        name: "spacenav-sim",
        summary: "simulated six-axis 3D mouse: one 14-byte record (6 axes, buttons) per frame",
        params: &[
            ("rate_hz", "float > 0", "62.5", "records per second"),
            (
                "count",
                "integer",
                "none",
                "records to send, then end the stream; unlimited when absent",
            ),
            ("seed", "integer", "1", "motion seed"),
        ],
    },
    EndpointInfo {
        name: "stdin",
        summary: "reads standard input until end of file",
        params: &[(
            "framing",
            "raw | lines | length",
            "raw",
            "how the bytes are cut into frames",
        )],
    },
    EndpointInfo {
        name: "file",
        summary: "reads a file (or named pipe) to its end, then ends the stream",
        params: &[
            ("path", "path", REQUIRED, "file to read"),
            (
                "framing",
                "raw | lines | length",
                "raw",
                "how the bytes are cut into frames",
            ),
        ],
    },
    EndpointInfo {
        name: "serial",
        summary: "a tty (serial port) opened raw: bytes read, and CTS/DSR/DCD/RI changes where the port reports them",
        params: &[
            ("path", "path", REQUIRED, "the tty, e.g. /dev/ttyUSB0; the serial sink of the other stream shares it"),
            ("baud", "integer > 0", "115200", "bits per second; any rate the port accepts (Linux: arbitrary rates via BOTHER)"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
        ],
    },
    EndpointInfo {
        name: "pty",
        summary: "what the app writes to the pty at `link`, and the line settings it sets there",
        params: &[
            ("link", "path", REQUIRED, "where the pty's slave is symlinked for the app to open; the pty sink of the other stream shares it"),
            ("baud", "integer > 0", "115200", "initial line settings the app finds on the pty"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
        ],
    },
    EndpointInfo {
        name: "evdev",
        summary: "a Linux input device (/dev/input/eventN): its capabilities, then one input record per SYN_REPORT batch",
        params: &[
            ("path", "path", REQUIRED, "the event device, e.g. /dev/input/by-id/…-event-kbd; a file or pipe of recorded `struct input_event`s works too"),
            ("grab", "bool", "false", "take the device exclusively (EVIOCGRAB): local programs stop seeing its events"),
        ],
    },
    EndpointInfo {
        name: "x11-input",
        summary: "keyboard and pointer events of an X display, as input records (keys, buttons, wheel, absolute motion)",
        params: &[
            ("display", "string", ":0", "the X display, e.g. :1"),
            ("window", "root | create | viewer", "create", "root: XInput2 raw events of the whole display; create: a window of the screen's size whose events are captured; viewer: the window of this process's x11-window sink on the same display (a remote desktop)"),
        ],
    },
    EndpointInfo {
        name: "x11-screen",
        summary: "the screen of an X display as display updates: the rectangles DAMAGE reports changed, captured with MIT-SHM",
        params: &[
            ("display", "string", ":0", "the X display the application draws on, e.g. :1"),
            ("max_fps", "float > 0", "30", "at most this many updates per second; damage between two captures is merged"),
            ("refresh_s", "float >= 0", "0", "a keyframe of the whole screen every this many seconds (heals a lossy or spoiling stack); 0 = only the first"),
        ],
    },
];

/// Every sink endpoint.
pub const SINKS: &[EndpointInfo] = &[
    EndpointInfo {
        name: "stdout",
        summary: "writes frames to standard output",
        params: &[("framing", "raw | lines | length", "raw", "how frames are written")],
    },
    EndpointInfo {
        name: "file",
        summary: "writes frames to a file, created or truncated unless `append`",
        params: &[
            ("path", "path", REQUIRED, "file to write"),
            ("framing", "raw | lines | length", "raw", "how frames are written"),
            ("append", "bool", "false", "append instead of truncating"),
        ],
    },
    EndpointInfo {
        name: "check",
        summary: "verifies order, completeness and content; reports gaps, duplicates, reordered and corrupt frames",
        params: &[
            ("seed", "integer", "none", "verify synthetic content made with this seed"),
            ("size", "integer", "none", "expected payload length; default: each frame's own length"),
            ("expect", "integer", "none", "expected number of frames"),
        ],
    },
    EndpointInfo {
        name: "null",
        summary: "counts frames and discards them",
        params: &[],
    },
    EndpointInfo {
        name: "serial",
        summary: "a tty (serial port) opened raw: writes data, applies line settings and DTR/RTS",
        params: &[
            ("path", "path", REQUIRED, "the tty, e.g. /dev/ttyUSB0; the serial source of the other stream shares it"),
            ("baud", "integer > 0", "115200", "bits per second; any rate the port accepts (Linux: arbitrary rates via BOTHER)"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
        ],
    },
    EndpointInfo {
        name: "pty",
        summary: "a pty whose slave is symlinked at `link`: the app reads the stream's bytes there",
        params: &[
            ("link", "path", REQUIRED, "where the pty's slave is symlinked for the app to open; the pty source of the other stream shares it"),
            ("baud", "integer > 0", "115200", "initial line settings the app finds on the pty"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
        ],
    },
    EndpointInfo {
        name: "uinput",
        summary: "a uinput virtual input device with the capabilities the source sent; the app sees a new /dev/input/eventN",
        params: &[("name", "string", "ndd remote input", "device name the app sees (at most 79 bytes)")],
    },
    EndpointInfo {
        name: "xtest",
        summary: "injects input records into an X display with XTEST (keys, buttons, wheel, absolute or relative motion)",
        params: &[("display", "string", ":0", "the X display, e.g. :2")],
    },
    EndpointInfo {
        name: "x11-window",
        summary: "shows display updates in a window of an X display (MIT-SHM PutImage), sized like the app's screen",
        params: &[
            ("display", "string", ":0", "the X display the person looks at, e.g. :0"),
            ("title", "string", "ndd display", "the window's title (WM_NAME)"),
        ],
    },
    EndpointInfo {
        name: "framebuffer",
        summary: "writes display updates into a raw 32-bpp framebuffer file (BGRX, row-major, no header) or a /dev/fbN of the same size",
        params: &[("path", "path", REQUIRED, "the file, created and sized on the first update, or a framebuffer device such as /dev/fb0")],
    },
];

fn check_settings(endpoint: &'static str, s: &LineSettings) -> Result<(), EndpointError> {
    s.check().map_err(|(param, reason)| EndpointError::Config {
        endpoint,
        param,
        reason: reason.to_string(),
    })
}

/// Where a stream's frames come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum SourceConfig {
    /// Seeded bytes at a fixed rate.
    Synthetic(SyntheticConfig),
    /// Simulated 3D mouse.
    SpacenavSim(SpacenavSimConfig),
    /// Standard input.
    Stdin(StdinConfig),
    /// A file.
    File(FileSourceConfig),
    /// A serial port (device side).
    Serial(SerialConfig),
    /// A pty the app writes to (app side).
    Pty(PtyConfig),
    /// A Linux input device (device side).
    Evdev(EvdevConfig),
    /// Input events of an X display (device side).
    #[serde(rename = "x11-input")]
    X11Input(X11InputConfig),
    /// The screen of an X display (app side).
    #[serde(rename = "x11-screen")]
    X11Screen(X11ScreenConfig),
}

/// Where a stream's frames go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum SinkConfig {
    /// Standard output.
    Stdout(StdoutConfig),
    /// A file.
    File(FileSinkConfig),
    /// The checker.
    Check(CheckConfig),
    /// Counts and discards.
    Null(NullConfig),
    /// A serial port (device side).
    Serial(SerialConfig),
    /// A pty the app reads from (app side).
    Pty(PtyConfig),
    /// A uinput virtual input device (app side).
    Uinput(UinputConfig),
    /// XTEST injection into an X display (app side).
    Xtest(XtestConfig),
    /// A window showing display updates (device side).
    #[serde(rename = "x11-window")]
    X11Window(X11WindowConfig),
    /// A raw framebuffer file or device (device side).
    Framebuffer(FramebufferConfig),
}

fn fmt_opt<T: std::fmt::Display>(out: &mut String, key: &str, v: Option<T>) {
    if let Some(v) = v {
        let _ = write!(out, ", {key}={v}");
    }
}

/// `serial(path=/dev/ttyUSB0, 115200 8N1)` (flow control appended when on).
fn describe_serial(c: &SerialConfig) -> String {
    format!("serial(path={}, {})", c.path.display(), c.settings())
}

/// `pty(link=/tmp/ttyREMOTE)`, with the initial settings when they are not the default.
fn describe_pty(c: &PtyConfig) -> String {
    let s = c.settings();
    if s == LineSettings::default() {
        format!("pty(link={})", c.link.display())
    } else {
        format!("pty(link={}, {s})", c.link.display())
    }
}

impl SourceConfig {
    /// The `type` key.
    pub fn name(&self) -> &'static str {
        self.info().name
    }

    /// Every file-system path among the parameters (so a config loader can resolve relative
    /// ones against the config file's directory).
    pub fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        match self {
            SourceConfig::File(c) => vec![&mut c.path],
            SourceConfig::Serial(c) => vec![&mut c.path],
            SourceConfig::Pty(c) => vec![&mut c.link],
            SourceConfig::Evdev(c) => vec![&mut c.path],
            SourceConfig::Synthetic(_)
            | SourceConfig::SpacenavSim(_)
            | SourceConfig::Stdin(_)
            | SourceConfig::X11Input(_)
            | SourceConfig::X11Screen(_) => vec![],
        }
    }

    /// The catalogue entry.
    pub fn info(&self) -> &'static EndpointInfo {
        match self {
            SourceConfig::Synthetic(_) => &SOURCES[0],
            SourceConfig::SpacenavSim(_) => &SOURCES[1],
            SourceConfig::Stdin(_) => &SOURCES[2],
            SourceConfig::File(_) => &SOURCES[3],
            SourceConfig::Serial(_) => &SOURCES[4],
            SourceConfig::Pty(_) => &SOURCES[5],
            SourceConfig::Evdev(_) => &SOURCES[6],
            SourceConfig::X11Input(_) => &SOURCES[7],
            SourceConfig::X11Screen(_) => &SOURCES[8],
        }
    }

    /// The name used in error messages and logs, e.g. `file source`.
    pub fn endpoint(&self) -> &'static str {
        match self {
            SourceConfig::Synthetic(_) => "synthetic source",
            SourceConfig::SpacenavSim(_) => "spacenav-sim source",
            SourceConfig::Stdin(_) => "stdin source",
            SourceConfig::File(_) => "file source",
            SourceConfig::Serial(_) => "serial source",
            SourceConfig::Pty(_) => "pty source",
            SourceConfig::Evdev(_) => "evdev source",
            SourceConfig::X11Input(_) => "x11-input source",
            SourceConfig::X11Screen(_) => "x11-screen source",
        }
    }

    /// Short human text, e.g. `synthetic(size=100, interval_ms=16)`.
    pub fn describe(&self) -> String {
        match self {
            SourceConfig::Synthetic(c) => {
                let mut s = format!("synthetic(size={}, interval_ms={}", c.size, c.interval_ms);
                fmt_opt(&mut s, "count", c.count);
                fmt_opt(&mut s, "seed", Some(c.seed).filter(|&s| s != 1));
                s + ")"
            }
            SourceConfig::SpacenavSim(c) => {
                let mut s = format!("spacenav-sim(rate_hz={}", c.rate_hz);
                fmt_opt(&mut s, "count", c.count);
                fmt_opt(&mut s, "seed", Some(c.seed).filter(|&s| s != 1));
                s + ")"
            }
            SourceConfig::Stdin(c) => format!("stdin(framing={})", c.framing),
            SourceConfig::File(c) => {
                format!("file(path={}, framing={})", c.path.display(), c.framing)
            }
            SourceConfig::Serial(c) => describe_serial(c),
            SourceConfig::Pty(c) => describe_pty(c),
            SourceConfig::Evdev(c) => format!(
                "evdev(path={}{})",
                c.path.display(),
                if c.grab { ", grab" } else { "" }
            ),
            SourceConfig::X11Input(c) => {
                format!("x11-input(display={}, window={})", c.display, c.window)
            }
            SourceConfig::X11Screen(c) => {
                let mut s = format!("x11-screen(display={}, max_fps={}", c.display, c.max_fps);
                fmt_opt(&mut s, "refresh_s", Some(c.refresh_s).filter(|&r| r != 0.0));
                s + ")"
            }
        }
    }

    /// Checks parameter ranges; the error names the endpoint, the key and the allowed range.
    pub fn validate(&self) -> Result<(), EndpointError> {
        let endpoint = self.endpoint();
        let bad = |param, reason: &str| {
            Err(EndpointError::Config {
                endpoint,
                param,
                reason: reason.to_string(),
            })
        };
        match self {
            SourceConfig::Synthetic(c) => {
                if c.size > MAX_LENGTH_FRAME {
                    return bad("size", "must be at most 67108864 (64 MiB)");
                }
                if !(c.interval_ms.is_finite() && c.interval_ms >= 0.0) {
                    return bad("interval_ms", "must be a finite number >= 0");
                }
            }
            SourceConfig::SpacenavSim(c) => {
                if !(c.rate_hz.is_finite() && c.rate_hz > 0.0) {
                    return bad("rate_hz", "must be a finite number > 0");
                }
            }
            SourceConfig::X11Screen(c) => {
                if !(c.max_fps.is_finite() && c.max_fps > 0.0) {
                    return bad("max_fps", "must be a finite number > 0");
                }
                if !(c.refresh_s.is_finite() && c.refresh_s >= 0.0) {
                    return bad("refresh_s", "must be a finite number >= 0 (0 = off)");
                }
            }
            SourceConfig::Stdin(_)
            | SourceConfig::File(_)
            | SourceConfig::Evdev(_)
            | SourceConfig::X11Input(_) => {}
            SourceConfig::Serial(c) => check_settings(endpoint, &c.settings())?,
            SourceConfig::Pty(c) => check_settings(endpoint, &c.settings())?,
        }
        Ok(())
    }
}

impl SinkConfig {
    /// The `type` key.
    pub fn name(&self) -> &'static str {
        self.info().name
    }

    /// Every file-system path among the parameters (see [`SourceConfig::paths_mut`]).
    pub fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        match self {
            SinkConfig::File(c) => vec![&mut c.path],
            SinkConfig::Serial(c) => vec![&mut c.path],
            SinkConfig::Pty(c) => vec![&mut c.link],
            SinkConfig::Framebuffer(c) => vec![&mut c.path],
            SinkConfig::Stdout(_)
            | SinkConfig::Check(_)
            | SinkConfig::Null(_)
            | SinkConfig::Uinput(_)
            | SinkConfig::Xtest(_)
            | SinkConfig::X11Window(_) => vec![],
        }
    }

    /// The catalogue entry.
    pub fn info(&self) -> &'static EndpointInfo {
        match self {
            SinkConfig::Stdout(_) => &SINKS[0],
            SinkConfig::File(_) => &SINKS[1],
            SinkConfig::Check(_) => &SINKS[2],
            SinkConfig::Null(_) => &SINKS[3],
            SinkConfig::Serial(_) => &SINKS[4],
            SinkConfig::Pty(_) => &SINKS[5],
            SinkConfig::Uinput(_) => &SINKS[6],
            SinkConfig::Xtest(_) => &SINKS[7],
            SinkConfig::X11Window(_) => &SINKS[8],
            SinkConfig::Framebuffer(_) => &SINKS[9],
        }
    }

    /// The name used in error messages and logs, e.g. `file sink`.
    pub fn endpoint(&self) -> &'static str {
        match self {
            SinkConfig::Stdout(_) => "stdout sink",
            SinkConfig::File(_) => "file sink",
            SinkConfig::Check(_) => "check sink",
            SinkConfig::Null(_) => "null sink",
            SinkConfig::Serial(_) => "serial sink",
            SinkConfig::Pty(_) => "pty sink",
            SinkConfig::Uinput(_) => "uinput sink",
            SinkConfig::Xtest(_) => "xtest sink",
            SinkConfig::X11Window(_) => "x11-window sink",
            SinkConfig::Framebuffer(_) => "framebuffer sink",
        }
    }

    /// Short human text, e.g. `file(path=/tmp/out, framing=lines, append)`.
    pub fn describe(&self) -> String {
        match self {
            SinkConfig::Stdout(c) => format!("stdout(framing={})", c.framing),
            SinkConfig::File(c) => format!(
                "file(path={}, framing={}{})",
                c.path.display(),
                c.framing,
                if c.append { ", append" } else { "" }
            ),
            SinkConfig::Check(c) => {
                let mut s = String::new();
                fmt_opt(&mut s, "seed", c.seed);
                fmt_opt(&mut s, "size", c.size);
                fmt_opt(&mut s, "expect", c.expect);
                match s.strip_prefix(", ") {
                    Some(args) => format!("check({args})"),
                    None => "check".to_string(),
                }
            }
            SinkConfig::Null(_) => "null".to_string(),
            SinkConfig::Serial(c) => describe_serial(c),
            SinkConfig::Pty(c) => describe_pty(c),
            SinkConfig::Uinput(c) => format!("uinput(name={})", c.name),
            SinkConfig::Xtest(c) => format!("xtest(display={})", c.display),
            SinkConfig::X11Window(c) => {
                format!("x11-window(display={}, title={})", c.display, c.title)
            }
            SinkConfig::Framebuffer(c) => format!("framebuffer(path={})", c.path.display()),
        }
    }

    /// Checks parameter ranges; the error names the endpoint, the key and the allowed range.
    pub fn validate(&self) -> Result<(), EndpointError> {
        let endpoint = self.endpoint();
        match self {
            SinkConfig::Serial(c) => check_settings(endpoint, &c.settings()),
            SinkConfig::Pty(c) => check_settings(endpoint, &c.settings()),
            SinkConfig::Uinput(c) => {
                if c.name.is_empty() || c.name.len() > 79 || c.name.contains('\0') {
                    Err(EndpointError::Config {
                        endpoint,
                        param: "name",
                        reason: "must be 1 to 79 bytes without NUL".to_string(),
                    })
                } else {
                    Ok(())
                }
            }
            SinkConfig::X11Window(c) => {
                if c.title.contains('\0') {
                    Err(EndpointError::Config {
                        endpoint,
                        param: "title",
                        reason: "must not contain NUL".to_string(),
                    })
                } else {
                    Ok(())
                }
            }
            SinkConfig::Stdout(_)
            | SinkConfig::File(_)
            | SinkConfig::Check(_)
            | SinkConfig::Null(_)
            | SinkConfig::Xtest(_)
            | SinkConfig::Framebuffer(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
                assert_eq!(*ty, "path", "test knows how to fill paths only");
                s += &format!(", {key} = \"/tmp/ndd-example\"");
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
            SourceConfig::X11Screen(X11ScreenConfig {
                refresh_s: 5.0,
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
            SinkConfig::X11Window(X11WindowConfig::default()),
            SinkConfig::Framebuffer(FramebufferConfig {
                path: "/dev/fb0".into(),
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
        for info in SOURCES {
            let mut c: SourceConfig = parse(&minimal(info, "")).expect(info.name);
            let want = info.params.iter().filter(|p| p.1 == "path").count();
            assert_eq!(c.paths_mut().len(), want, "{}", info.name);
            for p in c.paths_mut() {
                assert_eq!(*p, PathBuf::from("/tmp/ndd-example"), "{}", info.name);
            }
        }
        for info in SINKS {
            let mut c: SinkConfig = parse(&minimal(info, "")).expect(info.name);
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
            parse(r#"{ type = "file", path = "/tmp/o", framing = "length", append = true }"#)
                .unwrap();
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
            parse(r#"{ type = "pty", link = "/tmp/ttyREMOTE", baud = 9600, parity = "odd" }"#)
                .unwrap();
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
}
