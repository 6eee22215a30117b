//! The `serial` and `pty` sources: data frames with the bytes read from the tty (or what the
//! app writes to the pty), modem-line frames when the tty's CTS/DSR/DCD/RI change, and
//! line-settings frames when the app changes the pty's settings.

use super::config::{PtyConfig, SerialConfig};
use super::record::{ModemLines, SerialMessage};
use super::tty::{open_pty, open_tty, read_some, tiocm_to_lines, Pty, Tty, SETTINGS_POLL};
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::framing::RAW_CHUNK;
use crate::common::report::{SourceReport, SourceTask};
use crate::sys;
use ndd_core::Frame;
use std::sync::Arc;
use tokio::runtime::Handle;
use tokio::sync::mpsc::Sender;
use tokio::time::MissedTickBehavior;

/// Opens (or shares) the tty of a `serial` source and starts it.
pub(crate) fn spawn_serial_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &SerialConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let tty = open_tty(endpoint, c)?;
    Ok(rt.spawn(run_tty_source(endpoint, tty, stream, tx)))
}

/// Creates (or shares) the pty of a `pty` source and starts it.
pub(crate) fn spawn_pty_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &PtyConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let pty = open_pty(endpoint, c)?;
    Ok(rt.spawn(run_pty_source(endpoint, pty, stream, tx)))
}

/// Sends one serial message; `false` when the session no longer takes frames.
async fn send(out: &mut Emitter, msg: SerialMessage<'_>) -> bool {
    let mut frame = Frame::zeroed(
        out.next_meta(),
        ndd_core::frame::DEFAULT_HEADROOM,
        msg.len(),
    );
    msg.emit_into(frame.payload_mut());
    out.send(frame).await
}

/// `serial` source: bytes read from the tty, plus modem-line changes.
async fn run_tty_source(
    endpoint: &'static str,
    tty: Arc<Tty>,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let what = tty.path.display().to_string();
    let mut out = Emitter::new(stream, tx);
    let mut buf = vec![0u8; RAW_CHUNK];
    let mut poll = tokio::time::interval(SETTINGS_POLL);
    poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut modem_ok = true;
    let mut last_modem: Option<ModemLines> = None;
    loop {
        tokio::select! {
            _ = out.tx.closed() => break,
            r = read_some(&tty.fd, &mut buf) => {
                let n = r.map_err(|source| EndpointError::Read { endpoint, what: what.clone(), source })?;
                if n == 0 {
                    tracing::debug!(endpoint, path = %what, "tty hung up, source ends");
                    break;
                }
                if !send(&mut out, SerialMessage::Data(&buf[..n])).await {
                    break;
                }
            }
            _ = poll.tick(), if modem_ok => {
                match sys::tiocmget(tty.fd.get_ref()) {
                    Ok(bits) => {
                        let lines = tiocm_to_lines(bits);
                        if last_modem != Some(lines) {
                            last_modem = Some(lines);
                            if !send(&mut out, SerialMessage::Modem(lines)).await {
                                break;
                            }
                        }
                    }
                    Err(e) => {
                        modem_ok = false;
                        tracing::debug!(endpoint, path = %what, error = %e,
                            "modem lines cannot be read here; CTS/DSR/DCD/RI are not forwarded");
                    }
                }
            }
        }
    }
    tracing::debug!(
        endpoint,
        stream,
        frames = out.report.frames,
        bytes = out.report.bytes,
        "source ended"
    );
    Ok(out.report)
}

/// `pty` source: what the app writes to the slave, plus its line-settings changes.
async fn run_pty_source(
    endpoint: &'static str,
    pty: Arc<Pty>,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let what = pty.link.display().to_string();
    let mut out = Emitter::new(stream, tx);
    let mut buf = vec![0u8; RAW_CHUNK];
    let mut poll = tokio::time::interval(SETTINGS_POLL);
    poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // What the pty showed right after it was set up, not when this task first runs: a
    // change the app makes in between must still be sent.
    let mut last = pty.baseline;
    loop {
        tokio::select! {
            _ = out.tx.closed() => break,
            r = read_some(&pty.master, &mut buf) => {
                let n = r.map_err(|source| EndpointError::Read { endpoint, what: what.clone(), source })?;
                if n == 0 {
                    break;
                }
                if !send(&mut out, SerialMessage::Data(&buf[..n])).await {
                    break;
                }
            }
            _ = poll.tick() => {
                let t = rustix::termios::tcgetattr(&pty.slave).map_err(|e| EndpointError::Read {
                    endpoint,
                    what: format!("{what} line settings"),
                    source: e.into(),
                })?;
                let now = pty.seen(&t);
                // Baud 0 (B0) means "hang up" on a real port: not a line setting.
                if now != last && now.baud != 0 && now.check().is_ok() {
                    last = now;
                    // Bytes the app wrote before the change go out first, with the old
                    // settings.
                    loop {
                        match rustix::io::read(pty.master.get_ref(), &mut buf[..]) {
                            Ok(n) if n > 0 => {
                                if !send(&mut out, SerialMessage::Data(&buf[..n])).await {
                                    return Ok(out.report);
                                }
                            }
                            _ => break,
                        }
                    }
                    tracing::debug!(endpoint, link = %what, settings = %now, "app changed line settings");
                    if !send(&mut out, SerialMessage::Settings(now)).await {
                        break;
                    }
                }
            }
        }
    }
    tracing::debug!(
        endpoint,
        stream,
        frames = out.report.frames,
        bytes = out.report.bytes,
        "source ended"
    );
    Ok(out.report)
}
