//! One-line shares: `ndd share serial /dev/ttyUSB0 --to HOST` on the machine with the port,
//! `ndd attach serial --link /dev/ttyREMOTE` on the machine with the program; the same for a
//! desktop (`share desktop` where the programs run, `attach desktop` where the person sits)
//! and for sound (`share audio` where the microphone and speakers are), and a keyboard and
//! mouse (`share input` where they are, `attach input` where the programs run). Each builds its driver
//! from the config in `examples/` (embedded here, so both sides agree and the examples stay
//! the one definition), runs it as `ndd run` would, and `--print-config` writes the TOML
//! instead, so a share becomes a service.

use crate::config::SideName;

/// What can be shared in one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A serial port (`examples/serial.toml`): shared by the device side.
    Serial,
    /// An X desktop (`examples/desktop.toml`): shared by the app side (where the programs
    /// run), attached by the device side (the screen, keyboard and mouse a person uses).
    Desktop,
    /// A microphone and speakers (`examples/audio.toml`): shared by the device side.
    Audio,
    /// A keyboard and mouse (`examples/input.toml`): shared by the device side, driving the
    /// app side's X display.
    Input,
}

/// The kind of desktop a desktop share shows: both sides name the same one (its example
/// decides the streams, which both sides must agree on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Session {
    /// An X11 desktop (`examples/desktop.toml`).
    #[default]
    X11,
    /// A wlroots compositor: sway, Hyprland, river, labwc (`examples/wayland-desktop.toml`).
    Wayland,
    /// GNOME on Wayland (`examples/gnome-desktop.toml`).
    Gnome,
}

impl Session {
    /// As `--session` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Session::X11 => "x11",
            Session::Wayland => "wayland",
            Session::Gnome => "gnome",
        }
    }
}

/// A desktop attached in a Wayland session: the native viewer window (`wayland-window`,
/// keys and pointer through `wayland-window-input`) on `display`, the remote cursor's shapes
/// not shown (the person's own pointer is), and the clipboard shared as this desktop does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaylandViewer {
    /// The compositor (`$WAYLAND_DISPLAY`).
    pub display: String,
    /// How this desktop's clipboard is reached.
    pub clipboard: ViewerClipboard,
}

/// How a Wayland viewer's desktop shares its clipboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewerClipboard {
    /// The data-control protocol (wlroots, KWin): `wayland-clipboard`.
    DataControl,
    /// mutter's remote-desktop API: `gnome-clipboard`.
    Gnome,
    /// Through Xwayland (`x11-clipboard` on `$DISPLAY`, as the example has it).
    Xwayland,
}

impl Kind {
    fn example(self) -> &'static str {
        self.example_for(Session::X11)
    }

    /// The example a share of this kind is built from; a desktop's by its `session`.
    fn example_for(self, session: Session) -> &'static str {
        match (self, session) {
            (Kind::Serial, _) => include_str!("../../../examples/serial.toml"),
            (Kind::Desktop, Session::X11) => include_str!("../../../examples/desktop.toml"),
            (Kind::Desktop, Session::Wayland) => {
                include_str!("../../../examples/wayland-desktop.toml")
            }
            (Kind::Desktop, Session::Gnome) => include_str!("../../../examples/gnome-desktop.toml"),
            (Kind::Audio, _) => include_str!("../../../examples/audio.toml"),
            (Kind::Input, _) => include_str!("../../../examples/input.toml"),
        }
    }

    /// The side that shares (the other one attaches).
    pub fn sharing_side(self) -> SideName {
        match self {
            Kind::Desktop => SideName::App,
            Kind::Serial | Kind::Audio | Kind::Input => SideName::Device,
        }
    }

    /// The port of the example's `link.address`: the share's default.
    pub fn port(self) -> u16 {
        self.example()
            .lines()
            .find_map(|l| l.trim().strip_prefix("address = \""))
            .and_then(|a| a.trim_end_matches('"').rsplit_once(':'))
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or(7878)
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Serial => "serial",
            Kind::Desktop => "desktop",
            Kind::Audio => "audio",
            Kind::Input => "input",
        }
    }
}

/// Where a one-line share's link goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// This side listens on the address.
    Listen(String),
    /// This side connects to the address.
    Connect(String),
}

/// What this machine brings to a share (the rest stays as the example has it: it is the
/// other machine's).
#[derive(Debug, Clone, Default)]
pub struct Local {
    /// Serial: the port (device side).
    pub port: Option<String>,
    /// Serial: where the pty appears (app side).
    pub pty: Option<String>,
    /// Serial: line speed.
    pub baud: Option<u32>,
    /// Desktop, input: this machine's X display.
    pub display: Option<String>,
    /// Desktop: which kind of desktop is shared (both sides say the same).
    pub session: Session,
    /// Desktop shared from a wlroots compositor: its Wayland display (`$WAYLAND_DISPLAY`).
    pub wayland: Option<String>,
    /// Desktop attached in a Wayland session: the native viewer on this compositor, and the
    /// clipboard its way.
    pub viewer: Option<WaylandViewer>,
    /// Input: a Linux event device to share instead of the X display (taken exclusively).
    pub device: Option<String>,
    /// Input: a virtual input device (uinput) instead of the X display.
    pub uinput: bool,
    /// A listening side serving several machines at once (`link.peers`).
    pub peers: Option<u32>,
    /// A listening side announces itself on the LAN (`link.announce`).
    pub announce: bool,
}

/// `HOST` or `HOST:PORT` as an address, `port` when none is given; an IPv6 address without a
/// port is bracketed. A port written is kept as written, in range or not, so the address's
/// check names it (`port 99999 is not a number from 0 to 65535`); before, `host:99999` became
/// `host:99999:7882`, said as a host that does not resolve (found by trying it).
pub fn with_port(host: &str, port: u16) -> String {
    if let Some(v6) = host.strip_prefix('[') {
        // `[v6]:port`, or `[v6]` alone.
        return if v6.ends_with(']') {
            format!("{host}:{port}")
        } else {
            host.to_string()
        };
    }
    match host.matches(':').count() {
        0 => format!("{host}:{port}"),
        1 => host.to_string(),
        // A bare IPv6 address.
        _ => format!("[{host}]:{port}"),
    }
}

/// A TOML basic string holding `s`.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The one line that starts the other side of a share of `kind` whose `side` listens on
/// `listen` (`THIS_HOST` stands for this machine): what a listener left alone suggests. A
/// desktop other than X11 is named (`--session`): the other side must build the same streams.
pub fn peer_command(kind: Kind, side: SideName, listen: &str, session: Session) -> String {
    let port = listen
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|&p| p != kind.port())
        .map_or(String::new(), |p| format!(":{p}"));
    let name = kind.name();
    // (An X11 desktop is said by its display: `--display` means X11 to a share run in a
    // Wayland session, which would find out another desktop.)
    let session = match (kind, session) {
        (Kind::Desktop, Session::Wayland | Session::Gnome) => {
            format!(" --session {}", session.name())
        }
        _ => String::new(),
    };
    if side == kind.sharing_side() {
        let what = match kind {
            Kind::Serial => " --link /dev/ttyREMOTE",
            _ => "",
        };
        format!("ndd attach {name}{what}{session} --from THIS_HOST{port}")
    } else {
        let what = match kind {
            Kind::Serial => " PORT",
            Kind::Desktop if session.is_empty() => " --display :0",
            Kind::Desktop | Kind::Audio | Kind::Input => "",
        };
        format!("ndd share {name}{what}{session} --to THIS_HOST{port}")
    }
}

/// A device-side line of a desktop example (its X display is `:0`) with the Wayland viewer's
/// endpoints in place of the X11 viewer's.
fn viewer_line(line: &str, v: &WaylandViewer) -> String {
    let t = line.trim_start();
    let display = quoted(&v.display);
    // (The rest of the table, `selections` included, is kept where the endpoint takes it.)
    let clipboard = |end: &str| match v.clipboard {
        ViewerClipboard::DataControl => Some(t.replacen(
            "type = \"x11-clipboard\", display = \":0\"",
            &format!("type = \"wayland-clipboard\", display = {display}"),
            1,
        )),
        ViewerClipboard::Gnome => Some(format!(
            "{end} = {{ type = \"gnome-clipboard\", bus = \"\" }}"
        )),
        ViewerClipboard::Xwayland => None,
    };
    let replaced = if t.starts_with("sink = { type = \"x11-window\"") {
        let title = t
            .split_once("title = ")
            .and_then(|(_, r)| r.split('"').nth(1))
            .unwrap_or("ndd desktop");
        Some(format!(
            "sink = {{ type = \"wayland-window\", display = {display}, title = {} }}",
            quoted(title)
        ))
    } else if t.starts_with("source = { type = \"x11-input\"") {
        Some(format!(
            "source = {{ type = \"wayland-window-input\", display = {display} }}"
        ))
    } else if t.starts_with("sink = { type = \"x11-cursor\"") {
        // The person's own pointer is shown over the window.
        Some("sink = { type = \"null\" }".to_string())
    } else if t.starts_with("source = { type = \"x11-clipboard\"") && t.contains("\":0\"") {
        clipboard("source")
    } else if t.starts_with("sink = { type = \"x11-clipboard\"") && t.contains("\":0\"") {
        clipboard("sink")
    } else {
        None
    };
    replaced.unwrap_or_else(|| line.to_string())
}

/// The driver of `kind`'s example for `side`, linked as `link`, with what this machine
/// brings (`local`) in place of the example's values for this side.
pub fn config(kind: Kind, side: SideName, link: &Link, local: &Local) -> String {
    let (address, listener) = match link {
        Link::Listen(a) => (a, side),
        Link::Connect(a) => (a, side.other()),
    };
    let mut text = String::new();
    let verb = if side == kind.sharing_side() {
        "share"
    } else {
        "attach"
    };
    let example = match (kind, local.session) {
        (Kind::Desktop, Session::Wayland) => "wayland-desktop",
        (Kind::Desktop, Session::Gnome) => "gnome-desktop",
        _ => kind.name(),
    };
    text.push_str(&format!(
        "# examples/{example}.toml as `ndd {verb} {} … --print-config` wrote it for the {side} side.\n",
        kind.name()
    ));
    text.push_str(if kind == Kind::Desktop {
        "# Run it with: ndd run THIS_FILE, or as your user in your desktop session: ~/.config/ndd/NAME.toml and `systemctl --user enable --now ndd-session@NAME` (docs/service.md).\n"
    } else {
        "# Run it with: ndd run THIS_FILE, or put it in /etc/ndd for `ndd serve`.\n"
    });
    let mut in_link = false;
    for line in kind.example_for(local.session).lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            in_link = t.starts_with("[link]");
            text.push_str(line);
            text.push('\n');
            if in_link {
                text.push_str(&format!(
                    "address = {}\nlistener = \"{listener}\"\n",
                    quoted(address)
                ));
                if let Some(n) = local.peers.filter(|_| listener == side) {
                    text.push_str(&format!("peers = {n}\n"));
                }
                if local.announce && listener == side {
                    text.push_str("announce = true\n");
                }
            }
            continue;
        }
        if in_link && (t.starts_with("address") || t.starts_with("listener")) {
            continue;
        }
        if t.starts_with("driver") && !in_link {
            text.push_str(line);
            text.push_str(&format!(
                "\nside = \"{side}\"                      # this machine's side\n"
            ));
            continue;
        }
        let mut l = line.to_string();
        if let Some(p) = &local.port {
            l = l.replace("\"/dev/ttyUSB0\"", &quoted(p));
        }
        if let Some(p) = &local.pty {
            l = l.replace("\"/tmp/ttyREMOTE\"", &quoted(p));
        }
        if let Some(b) = local.baud {
            l = l.replace("baud = 115200", &format!("baud = {b}"));
        }
        if let (Some(w), SideName::App) = (&local.wayland, side) {
            // The wlroots example's compositor is wayland-1.
            l = l.replace(
                "display = \"wayland-1\"",
                &format!("display = {}", quoted(w)),
            );
        }
        if let (Some(v), SideName::Device) = (&local.viewer, side) {
            l = viewer_line(&l, v);
        }
        if let Some(d) = &local.display {
            // The example's app display is :1, the device's :0.
            let mine = match side {
                SideName::App => "display = \":1\"",
                SideName::Device => "display = \":0\"",
            };
            l = l.replace(mine, &format!("display = {}", quoted(d)));
        }
        if let (Some(dev), true) = (
            &local.device,
            t.starts_with("source = { type = \"x11-input\""),
        ) {
            l = format!(
                "source = {{ type = \"evdev\", path = {}, grab = true }}",
                quoted(dev)
            );
        }
        if local.uinput && t.starts_with("sink = { type = \"xtest\"") {
            l = "sink = { type = \"uinput\", name = \"ndd remote input\" }".to_string();
        }
        text.push_str(&l);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::path::Path;

    fn both(kind: Kind, local_share: &Local, local_attach: &Local) -> (Config, Config) {
        let share = kind.sharing_side();
        let attach = share.other();
        let port = kind.port();
        let a = config(
            kind,
            share,
            &Link::Connect(with_port("10.0.0.5", port)),
            local_share,
        );
        let b = config(
            kind,
            attach,
            &Link::Listen(format!("0.0.0.0:{port}")),
            local_attach,
        );
        (
            Config::parse(&a, Path::new("share.toml")).unwrap(),
            Config::parse(&b, Path::new("attach.toml")).unwrap(),
        )
    }

    #[test]
    fn an_attaching_side_for_several_machines_says_so_in_its_link() {
        let local = Local {
            pty: Some("/dev/ttyLAB-{peer}".into()),
            peers: Some(8),
            announce: true,
            ..Local::default()
        };
        let text = config(
            Kind::Serial,
            SideName::App,
            &Link::Listen("0.0.0.0:7882".into()),
            &local,
        );
        let cfg = Config::parse(&text, Path::new("attach.toml")).unwrap();
        assert_eq!((cfg.link.peers, cfg.link.announce), (8, true));
        assert!(text.contains("\"/dev/ttyLAB-{peer}\""), "{text}");
        let lab3 = cfg.for_peer("lab3").unwrap();
        assert!(
            format!("{:?}", lab3.streams).contains("/dev/ttyLAB-lab3"),
            "{:?}",
            lab3.streams
        );
    }

    #[test]
    fn a_lonely_side_names_the_other_sides_one_line() {
        assert_eq!(
            peer_command(Kind::Serial, SideName::App, "0.0.0.0:7882", Session::X11),
            "ndd share serial PORT --to THIS_HOST"
        );
        assert_eq!(
            peer_command(
                Kind::Desktop,
                SideName::Device,
                "0.0.0.0:9000",
                Session::X11
            ),
            "ndd share desktop --display :0 --to THIS_HOST:9000"
        );
        assert_eq!(
            peer_command(Kind::Serial, SideName::Device, "0.0.0.0:7882", Session::X11),
            "ndd attach serial --link /dev/ttyREMOTE --from THIS_HOST"
        );
        assert_eq!(
            peer_command(Kind::Audio, SideName::Device, "[::]:7884", Session::X11),
            "ndd attach audio --from THIS_HOST"
        );
    }

    #[test]
    fn a_wayland_or_gnome_desktop_share_names_its_session_for_the_other_side() {
        assert_eq!(
            peer_command(Kind::Desktop, SideName::App, "0.0.0.0:7890", Session::Gnome),
            "ndd attach desktop --session gnome --from THIS_HOST"
        );
        assert_eq!(
            peer_command(
                Kind::Desktop,
                SideName::Device,
                "0.0.0.0:7890",
                Session::Wayland
            ),
            "ndd share desktop --session wayland --to THIS_HOST"
        );
    }

    /// Each desktop session's share and attach: both parse, the share side's compositor is
    /// the one given, and their HELLOs agree (the same streams, directions and stacks).
    #[test]
    fn a_desktop_share_and_its_attach_agree_for_each_session() {
        for session in [Session::X11, Session::Wayland, Session::Gnome] {
            // Attached in a Wayland session: the native viewer, the clipboard each way.
            for clipboard in [
                ViewerClipboard::DataControl,
                ViewerClipboard::Gnome,
                ViewerClipboard::Xwayland,
            ] {
                let viewer = WaylandViewer {
                    display: "wayland-3".into(),
                    clipboard,
                };
                let attach = Local {
                    session,
                    display: Some(":7".into()),
                    viewer: Some(viewer),
                    ..Local::default()
                };
                let (a, d) = both(
                    Kind::Desktop,
                    &Local {
                        session,
                        ..Local::default()
                    },
                    &attach,
                );
                ndd_wire::compare_hello(&a.hello(SideName::App), &d.hello(SideName::Device))
                    .unwrap_or_else(|e| panic!("{session:?} {clipboard:?}: {e}"));
                // The device side's own end of each stream.
                let ends: Vec<(String, &str)> = d
                    .streams
                    .iter()
                    .map(|st| {
                        let end = if st.direction.source_side() == SideName::Device {
                            st.source.name()
                        } else {
                            st.sink.name()
                        };
                        (st.name().to_string(), end)
                    })
                    .collect();
                let clip = match clipboard {
                    ViewerClipboard::DataControl => "wayland-clipboard",
                    ViewerClipboard::Gnome => "gnome-clipboard",
                    ViewerClipboard::Xwayland => "x11-clipboard",
                };
                for (name, end) in &ends {
                    let want = match name.as_str() {
                        "screen" => "wayland-window",
                        "input" => "wayland-window-input",
                        "cursor" => "null",
                        _ => clip,
                    };
                    assert_eq!(*end, want, "{session:?} {clipboard:?}: stream {name}");
                }
                let text = format!("{:?}", d.streams);
                assert!(text.contains("\"wayland-3\""), "{text}");
                match clipboard {
                    // Xwayland's clipboard on the display given.
                    ViewerClipboard::Xwayland => assert!(text.contains("\":7\""), "{text}"),
                    // The GNOME example's one selection kept.
                    ViewerClipboard::DataControl if session == Session::Gnome => {
                        assert!(text.contains("selections: [\"CLIPBOARD\"]"), "{text}")
                    }
                    _ => {}
                }
            }
            let share = Local {
                session,
                wayland: Some("wayland-7".into()),
                display: Some(":0".into()),
                ..Local::default()
            };
            let attach = Local {
                session,
                display: Some(":5".into()),
                ..Local::default()
            };
            let (a, d) = both(Kind::Desktop, &share, &attach);
            ndd_wire::compare_hello(&a.hello(SideName::App), &d.hello(SideName::Device))
                .unwrap_or_else(|e| panic!("{session:?}: {e}"));
            let streams = format!("{:?} {:?}", a.streams, d.streams);
            match session {
                Session::X11 => assert!(streams.contains("X11Screen"), "{streams}"),
                Session::Wayland => assert!(
                    streams.contains("WaylandScreen") && streams.contains("wayland-7"),
                    "{streams}"
                ),
                Session::Gnome => assert!(streams.contains("GnomeScreen"), "{streams}"),
            }
            // The viewer opens on the attaching side's display.
            assert!(streams.contains("\":5\""), "{session:?}: {streams}");
        }
    }

    #[test]
    fn each_share_and_its_attach_are_one_driver_that_checks_and_agrees() {
        assert_eq!(with_port("10.0.0.5", 7882), "10.0.0.5:7882");
        assert_eq!(with_port("pi.local", 7882), "pi.local:7882");
        assert_eq!(with_port("pi.local:9000", 7882), "pi.local:9000");
        assert_eq!(with_port("::1", 7882), "[::1]:7882");
        assert_eq!(with_port("[::1]:9000", 7882), "[::1]:9000");
        assert_eq!(with_port("[fe80::1]", 7882), "[fe80::1]:7882");
        // A port out of range stays for the check to name.
        assert_eq!(with_port("10.0.0.5:99999", 7882), "10.0.0.5:99999");
        assert_eq!(with_port("pi.local:", 7882), "pi.local:");
        assert_eq!(
            (
                Kind::Serial.port(),
                Kind::Desktop.port(),
                Kind::Audio.port()
            ),
            (7882, 7890, 7884)
        );
        for kind in [Kind::Serial, Kind::Desktop, Kind::Audio, Kind::Input] {
            let (a, b) = both(kind, &Local::default(), &Local::default());
            // The attaching side listens in both files; the sharing side connects there.
            let attach = kind.sharing_side().other();
            assert_eq!(a.link.listener, attach, "{kind:?}");
            assert_eq!(b.link.listener, attach, "{kind:?}");
            // Each file names its machine's side: `ndd run FILE` and `ndd serve` need no more.
            assert_eq!(a.side, Some(kind.sharing_side()), "{kind:?}");
            assert_eq!(b.side, Some(attach), "{kind:?}");
            assert_eq!(a.link.address, format!("10.0.0.5:{}", kind.port()));
            for s in [SideName::Device, SideName::App] {
                assert_eq!(a.hello(s), b.hello(s), "{kind:?}: the sides agree");
            }
        }
        // What this machine brings replaces the example's values for its side only.
        let port = Local {
            port: Some("/dev/serial/by-id/usb \"x\"".into()),
            baud: Some(9600),
            ..Local::default()
        };
        let pty = Local {
            pty: Some("/tmp/ttyR".into()),
            baud: Some(9600),
            ..Local::default()
        };
        let share = config(
            Kind::Serial,
            SideName::Device,
            &Link::Listen("0.0.0.0:1".into()),
            &port,
        );
        assert!(
            share.contains(r#"path = "/dev/serial/by-id/usb \"x\"", baud = 9600"#),
            "{share}"
        );
        let (a, b) = both(Kind::Serial, &port, &pty);
        assert_eq!(a.hello(SideName::App), b.hello(SideName::App));
        let shown = Local {
            display: Some(":5".into()),
            ..Local::default()
        };
        let d = config(
            Kind::Desktop,
            SideName::App,
            &Link::Connect("v:7890".into()),
            &shown,
        );
        assert!(d.contains(r#"type = "x11-screen", display = ":5""#), "{d}");
        assert!(d.contains(r#"type = "xtest", display = ":5""#), "{d}");
        assert!(d.contains(r#"type = "x11-window", display = ":0""#), "{d}");
        // Input: an event device instead of the X display here, a uinput device there; the
        // sides still agree.
        let kbd = Local {
            device: Some("/dev/input/by-id/kbd".into()),
            ..Local::default()
        };
        let virt = Local {
            uinput: true,
            ..Local::default()
        };
        let (a, b) = both(Kind::Input, &kbd, &virt);
        for s in [SideName::Device, SideName::App] {
            assert_eq!(a.hello(s), b.hello(s));
        }
        let share = config(
            Kind::Input,
            SideName::Device,
            &Link::Connect("h:1".into()),
            &kbd,
        );
        assert!(
            share.contains(
                r#"source = { type = "evdev", path = "/dev/input/by-id/kbd", grab = true }"#
            ),
            "{share}"
        );
        let attach = config(
            Kind::Input,
            SideName::App,
            &Link::Listen("0.0.0.0:1".into()),
            &virt,
        );
        assert!(
            attach.contains(r#"sink = { type = "uinput", name = "ndd remote input" }"#),
            "{attach}"
        );
        assert_eq!(Kind::Input.port(), 7886);
        assert_eq!(
            peer_command(Kind::Input, SideName::App, "0.0.0.0:7886", Session::X11),
            "ndd share input --to THIS_HOST"
        );
    }
}
