//! The `serial` class: serial ports and the pseudo-terminals apps open in their place.
//!
//! - A `serial` endpoint opens a tty (`/dev/ttyUSB0`) raw with the configured line settings.
//!   As a source it emits data frames (`0x00`) with the bytes read and modem-line frames
//!   (`0x02`, CTS/DSR/DCD/RI) when `TIOCMGET` works; as a sink it writes data frames, applies
//!   line-settings frames (`0x01`) with `tcsetattr` (any baud rate on Linux, via `BOTHER`) and
//!   DTR/RTS from modem-line frames.
//! - A `pty` endpoint creates a pseudo-terminal, keeps its own slave fd open (so the app can
//!   open and close the slave as often as it likes without the master seeing a hang-up) and
//!   symlinks the slave at `link`. As a sink it writes data frames to the master; as a source
//!   it emits the bytes the app writes, and polls the slave's termios every
//!   [`SETTINGS_POLL`] to emit a line-settings frame whenever the app changes them.
//!
//! Every frame of a serial stream carries one [`SerialMessage`] (data, line settings or modem
//! lines; the format is in `record.rs`, re-exported here). Both streams of a driver name the
//! same port, and share its open file.
//!
//! - `rfc2217-server` and `rfc2217-client` speak RFC 2217 (telnet COM-port control) instead:
//!   the first is the port to RFC 2217 clients such as pyserial's `rfc2217://`, the second
//!   uses an RFC 2217 server such as ser2net as the device (`rfc2217/`).
//!
//! A pty outlives its side for `keep_s` seconds (a holder process keeps its master for the
//! side's next run: `hold.rs`).
//!
//! Files: `config.rs` ([`SerialConfig`], [`PtyConfig`]), `record.rs` (the sans-IO
//! [`SerialMessage`] and [`LineSettings`]), `tty.rs` (opening and sharing the tty or pty,
//! termios, non-blocking I/O; its only unsafe code, modem-line ioctls and registering a
//! descriptor with tokio, is in `sys`), `source.rs` and `sink.rs` (the tasks).

mod config;
pub mod hold;
mod record;
pub mod rfc2217;
mod sink;
mod source;
mod tty;

pub(crate) use config::{check_address, check_listen};
pub use config::{PtyConfig, Rfc2217ClientConfig, Rfc2217ServerConfig, SerialConfig};
pub use record::*;
pub(crate) use sink::{spawn_pty_sink, spawn_serial_sink};
pub(crate) use source::{spawn_pty_source, spawn_serial_source};
pub use tty::SETTINGS_POLL;
