//! One-line shares: `ndd share serial /dev/ttyUSB0 --to HOST` on the machine with the port,
//! `ndd attach serial --link /dev/ttyREMOTE` on the machine with the program. Each builds the
//! same driver as `examples/serial.toml` (so both sides agree), runs it as `ndd run` would,
//! and `--print-config` writes the TOML instead, so a share becomes a service.

use crate::config::SideName;
use std::path::Path;

/// The port a one-line share listens on and connects to by default.
pub const SHARE_PORT: u16 = 7882;

/// Where a one-line share's link goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// This side listens on the address.
    Listen(String),
    /// This side connects to the address.
    Connect(String),
}

/// `HOST` or `HOST:PORT` as an address, the share's port when none is given; an IPv6
/// address without a port is bracketed.
pub fn with_port(host: &str) -> String {
    if host.parse::<std::net::SocketAddr>().is_ok() {
        return host.to_string();
    }
    if host.parse::<std::net::Ipv6Addr>().is_ok() {
        return format!("[{host}]:{SHARE_PORT}");
    }
    match host.rsplit_once(':') {
        Some((_, p)) if p.parse::<u16>().is_ok() => host.to_string(),
        _ => format!("{host}:{SHARE_PORT}"),
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

/// The serial driver of `examples/serial.toml` for side `side` linked as `link`: the port at
/// `port` (the device side's; the other side's file names it too, unused there), the pty at
/// `pty` (the app side's), both at `baud`.
pub fn serial_config(side: SideName, link: &Link, port: &Path, pty: &Path, baud: u32) -> String {
    let (address, listener) = match link {
        Link::Listen(a) => (a, side),
        Link::Connect(a) => (
            a,
            match side {
                SideName::Device => SideName::App,
                SideName::App => SideName::Device,
            },
        ),
    };
    let (port, pty) = (
        quoted(&port.display().to_string()),
        quoted(&pty.display().to_string()),
    );
    format!(
        r#"# A serial port shared over ndd (the driver of examples/serial.toml), written by
# `ndd {cmd} serial … --print-config`. Run it with: ndd run THIS_FILE --side {side}
driver = "serial"

[link]
address = {address}
listener = "{listener}"

[[stream]]
name = "rx"                          # what the device sends
direction = "device-to-app"
source = {{ type = "serial", path = {port}, baud = {baud} }}
sink = {{ type = "pty", link = {pty}, baud = {baud} }}

[[stream]]
name = "tx"                          # what the program sends, and its line settings
direction = "app-to-device"
source = {{ type = "pty", link = {pty}, baud = {baud} }}
sink = {{ type = "serial", path = {port}, baud = {baud} }}
"#,
        cmd = match side {
            SideName::Device => "share",
            SideName::App => "attach",
        },
        address = quoted(address),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn a_share_and_its_attach_are_one_driver_that_checks_and_agrees() {
        assert_eq!(with_port("10.0.0.5"), "10.0.0.5:7882");
        assert_eq!(with_port("pi.local"), "pi.local:7882");
        assert_eq!(with_port("pi.local:9000"), "pi.local:9000");
        assert_eq!(with_port("::1"), "[::1]:7882");
        assert_eq!(with_port("[::1]:9000"), "[::1]:9000");
        let (port, pty) = (Path::new("/dev/ttyUSB0"), Path::new("/tmp/tty \"odd\""));
        let share = serial_config(
            SideName::Device,
            &Link::Connect("10.0.0.5:7882".into()),
            port,
            pty,
            9600,
        );
        let attach = serial_config(
            SideName::App,
            &Link::Listen("0.0.0.0:7882".into()),
            port,
            pty,
            9600,
        );
        let a = Config::parse(&share, Path::new("share.toml")).unwrap();
        let b = Config::parse(&attach, Path::new("attach.toml")).unwrap();
        // The app side listens in both files; the device side connects there.
        assert_eq!(a.link.listener, SideName::App);
        assert_eq!(b.link.listener, SideName::App);
        assert_eq!(a.link.address, "10.0.0.5:7882");
        assert_eq!(
            a.hello(SideName::Device).streams,
            b.hello(SideName::Device).streams
        );
        assert!(
            attach.contains(r#"link = "/tmp/tty \"odd\"", baud = 9600"#),
            "{attach}"
        );
        // The reverse: the sharing side listens, the attaching side connects.
        let share = serial_config(
            SideName::Device,
            &Link::Listen("0.0.0.0:7882".into()),
            port,
            pty,
            9600,
        );
        assert_eq!(
            Config::parse(&share, Path::new("s.toml"))
                .unwrap()
                .link
                .listener,
            SideName::Device
        );
    }
}
