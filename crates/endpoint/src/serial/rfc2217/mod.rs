//! RFC 2217 (telnet COM-port control) on the serial path, so ndd interoperates with the serial
//! tools people already run:
//!
//! - `rfc2217-server` listens on a TCP address and is, to any RFC 2217 client (pyserial's
//!   `rfc2217://host:port`, or a Windows COM-port redirector), the serial port: what the
//!   client writes, the baud rate, parity, data bits, stop bits, flow control and DTR/RTS it
//!   sets become the stream's serial messages; the data and CTS/DSR/DCD/RI changes of the
//!   other stream go back to it. It takes one client at a time (another is told the port is
//!   busy), and keeps listening when a client leaves.
//! - `rfc2217-client` connects to an RFC 2217 server (ser2net in telnet mode, pyserial's
//!   `PortManager`) and uses its port as the device: the stream's data, line settings and
//!   DTR/RTS are sent as RFC 2217 commands, the server's data and modem state come back. It
//!   reconnects (0.5 s doubling to 5 s) when the server goes away, and sends its settings
//!   and DTR/RTS again.
//!
//! Both endpoints of a driver (the source of one stream, the sink of the other) name the
//! same `listen` / `address` and share one connection, as `serial` and `pty` endpoints
//! share their port. The codec is sans-IO (`telnet.rs`); this file and `port.rs` do the I/O.

mod port;
pub mod telnet;

pub(crate) use port::{spawn_rfc2217_sink, spawn_rfc2217_source, Rfc2217};
