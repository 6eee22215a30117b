//! The `serial` and `pty` sinks: a serial sink writes data frames to the tty, applies
//! line-settings frames and sets DTR/RTS from modem-line frames; a pty sink writes data frames
//! for the app to read and drops what a pty cannot show.

use super::config::{PtyConfig, SerialConfig};
use super::record::{ModemLines, SerialMessage, PURGE_RECEIVED, PURGE_TO_SEND};
use super::tty::{apply_settings, open_pty, open_tty, write_all, Pty, Tty};
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask};
use crate::sys;
use ndd_core::{Frame, RateLimit};
use rustix::termios::OptionalActions;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::Receiver;

/// Opens (or shares) the tty of a `serial` sink and starts it.
pub(crate) fn spawn_serial_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &SerialConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let tty = open_tty(endpoint, c)?;
    Ok(rt.spawn(run_tty_sink(endpoint, tty, rx, delivered)))
}

/// Creates (or shares) the pty of a `pty` sink and starts it.
pub(crate) fn spawn_pty_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &PtyConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let pty = open_pty(endpoint, c)?;
    Ok(rt.spawn(run_pty_sink(endpoint, pty, rx, delivered)))
}

/// A serial sink's record, or the error that ends the sink (a bad record is rejected:
/// nothing more will ever be done with it, so it counts as completed).
fn parse_or_reject<'a>(
    endpoint: &'static str,
    frame: &'a Frame,
    delivered: &Delivered,
) -> Result<SerialMessage<'a>, EndpointError> {
    SerialMessage::parse(frame.payload()).map_err(|source| {
        delivered.mark(frame.meta.seq);
        EndpointError::BadFrame {
            endpoint,
            seq: frame.meta.seq,
            source,
        }
    })
}

fn write_err(endpoint: &'static str, what: &str, source: io::Error) -> EndpointError {
    EndpointError::Write {
        endpoint,
        what: what.to_string(),
        source,
    }
}

/// What the tty refused of the peer's control frames, each kind said at most five times a
/// second with the count held back: the peer sends them as fast as it likes.
struct Refusals {
    settings: RateLimit,
    brk: RateLimit,
    purge: RateLimit,
}

impl Default for Refusals {
    fn default() -> Self {
        let limit = || RateLimit::with_burst(Duration::from_secs(1), 5);
        Refusals {
            settings: limit(),
            brk: limit(),
            purge: limit(),
        }
    }
}

/// `serial` sink: writes data, applies line settings and DTR/RTS.
async fn run_tty_sink(
    endpoint: &'static str,
    tty: Arc<Tty>,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let what = tty.path.display().to_string();
    let mut report = SinkReport::default();
    let mut modem_warned = false;
    let mut refused = Refusals::default();
    while let Some(frame) = rx.recv().await {
        report.frames += 1;
        report.bytes += frame.len() as u64;
        match parse_or_reject(endpoint, &frame, &delivered)? {
            SerialMessage::Data(d) => write_all(&tty.fd, d)
                .await
                .map_err(|source| write_err(endpoint, &what, source))?,
            SerialMessage::Settings(s) => {
                let shared = tty.clone();
                // TCSADRAIN waits until the bytes written so far have left the port: off the
                // runtime's threads.
                let applied = tokio::task::spawn_blocking(move || -> io::Result<()> {
                    let fd = shared.fd.get_ref();
                    let mut t = rustix::termios::tcgetattr(fd)?;
                    apply_settings(&mut t, &s)?;
                    rustix::termios::tcsetattr(fd, OptionalActions::Drain, &t)?;
                    Ok(())
                })
                .await
                .unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
                match applied {
                    Ok(()) => {
                        tracing::debug!(endpoint, path = %what, settings = %s, "line settings applied")
                    }
                    // The app was already told yes by its pty: report and carry on with the
                    // old settings rather than end the stream.
                    Err(e) => {
                        if let Some(suppressed) = refused.settings.admit(Instant::now()) {
                            tracing::warn!(endpoint, path = %what, settings = %s, error = %e, suppressed,
                                "cannot apply line settings; the port keeps its previous ones")
                        }
                    }
                }
            }
            SerialMessage::Break(on) => {
                if let Err(e) = sys::set_break(tty.fd.get_ref(), on) {
                    if let Some(suppressed) = refused.brk.admit(Instant::now()) {
                        tracing::warn!(endpoint, path = %what, on, error = %e, suppressed,
                            "cannot set the break condition on this tty; ignored");
                    }
                } else {
                    tracing::debug!(endpoint, path = %what, on, "break condition set");
                }
            }
            SerialMessage::Purge(which) => {
                use rustix::termios::QueueSelector;
                let queue = match which {
                    PURGE_RECEIVED => QueueSelector::IFlush,
                    PURGE_TO_SEND => QueueSelector::OFlush,
                    _ => QueueSelector::IOFlush,
                };
                if let Err(e) = rustix::termios::tcflush(tty.fd.get_ref(), queue) {
                    if let Some(suppressed) = refused.purge.admit(Instant::now()) {
                        tracing::warn!(endpoint, path = %what, which, error = %e, suppressed,
                            "cannot purge this tty's buffers; ignored");
                    }
                } else {
                    tracing::debug!(endpoint, path = %what, which, "buffers purged");
                }
            }
            SerialMessage::Modem(m) => {
                for (bit, tiocm) in [
                    (ModemLines::DTR, libc::TIOCM_DTR),
                    (ModemLines::RTS, libc::TIOCM_RTS),
                ] {
                    if m.valid & bit == 0 {
                        continue;
                    }
                    if let Err(e) = sys::tiocm_set(tty.fd.get_ref(), tiocm, m.state & bit != 0) {
                        if !modem_warned {
                            modem_warned = true;
                            tracing::warn!(endpoint, path = %what, error = %e,
                                "cannot set DTR/RTS on this tty; modem-line frames are ignored");
                        }
                    }
                }
            }
        }
        // Written to the tty (or line settings / modem lines applied, or refused by the port
        // and reported): as complete as this process can make it.
        delivered.mark(frame.meta.seq);
    }
    tracing::debug!(
        endpoint,
        frames = report.frames,
        bytes = report.bytes,
        "sink ended"
    );
    Ok(report)
}

/// `pty` sink: writes data for the app to read; settings, modem lines, break and purge are not
/// representable on a pty and are dropped (counted in the report like every frame).
async fn run_pty_sink(
    endpoint: &'static str,
    pty: Arc<Pty>,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let what = pty.link.display().to_string();
    let mut report = SinkReport::default();
    while let Some(frame) = rx.recv().await {
        report.frames += 1;
        report.bytes += frame.len() as u64;
        let (seq, ts) = (frame.meta.seq, frame.meta.timestamp_ns);
        match parse_or_reject(endpoint, &frame, &delivered)? {
            // Sent again by the device after this side restarted: the last run wrote it into
            // the kept pty already.
            SerialMessage::Data(_) if pty.mark.as_ref().is_some_and(|m| m.written(seq, ts)) => {
                tracing::debug!(endpoint, seq, "written by this side's last run; not again");
            }
            SerialMessage::Data(d) => {
                write_all(&pty.master, d)
                    .await
                    .map_err(|source| write_err(endpoint, &what, source))?;
                if let Some(m) = &pty.mark {
                    m.record(seq, ts);
                }
            }
            SerialMessage::Settings(s) => {
                tracing::trace!(endpoint, settings = %s, "line settings frame ignored by a pty")
            }
            SerialMessage::Modem(m) => {
                tracing::trace!(
                    endpoint,
                    state = m.state,
                    "modem lines cannot be shown on a pty"
                )
            }
            SerialMessage::Break(_) | SerialMessage::Purge(_) => {
                tracing::trace!(endpoint, "break and purge have no meaning on a pty")
            }
        }
        // Written to the pty's master (or dropped, not representable).
        delivered.mark(frame.meta.seq);
    }
    tracing::debug!(
        endpoint,
        frames = report.frames,
        bytes = report.bytes,
        "sink ended"
    );
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serial::record::LineSettings;
    use ndd_core::testlog::Captured;

    /// The peer sends line settings, break and purge frames as fast as it can to a port that
    /// refuses them all (a pipe here), for over a second: each kind is said at most five times
    /// a second and a later line says how many were not shown; every frame is completed.
    #[tokio::test]
    async fn a_flood_of_refused_control_frames_is_five_lines_a_second_each() {
        let (log, _guard) = Captured::start();
        let (_r, w) = rustix::pipe::pipe().unwrap();
        let tty = Arc::new(Tty::over(w, "/test/pipe".into()));
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let delivered = Delivered::default();
        let started = Instant::now();
        let kinds = [
            "cannot apply line settings",
            "cannot set the break condition",
            "cannot purge",
        ];
        let counted = |what: &str| log.counted(what);
        let peer = async {
            let msgs = [
                SerialMessage::Settings(LineSettings::default()).emit(),
                SerialMessage::Break(true).emit(),
                SerialMessage::Purge(3).emit(),
            ];
            let mut seq = 0u64;
            while !kinds.iter().all(|k| counted(k)) {
                assert!(started.elapsed() < Duration::from_secs(10), "no count");
                for m in &msgs {
                    let meta = ndd_core::Meta {
                        seq,
                        ..Default::default()
                    };
                    tx.send(Frame::new(meta, m)).await.unwrap();
                    seq += 1;
                }
            }
            drop(tx);
            seq
        };
        let (report, sent) = tokio::join!(run_tty_sink("serial", tty, rx, delivered.clone()), peer);
        assert_eq!(report.unwrap().frames, sent);
        assert_eq!(delivered.count(), sent);
        let secs = started.elapsed().as_secs_f64().ceil() as usize;
        for k in kinds {
            let lines = log.matching(k);
            assert!(
                lines.len() <= 5 * (secs + 1),
                "{sent} frames, {} lines in {secs} s: {lines:#?}",
                lines.len()
            );
        }
    }
}
