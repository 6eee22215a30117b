//! The `gnome-clipboard` source and sink: the clipboard of a GNOME Wayland session through
//! mutter's remote-desktop API (`EnableClipboard`, `SetSelection`, `SelectionRead`,
//! `SelectionWrite`: what GNOME's own remote desktop uses; mutter has no data-control
//! protocol for `wayland-clipboard`), as the same [`Contents`] records as `x11-clipboard`
//! and `wayland-clipboard`, so an X11, a wlroots and a GNOME side share one clipboard.
//!
//! - source: a remote-desktop session with its clipboard enabled hears every new owner of the
//!   clipboard (`SelectionOwnerChanged` with its MIME types); the source reads its text
//!   (`text/plain;charset=utf-8`, else `UTF8_STRING`, `text/plain`, `STRING`, `TEXT`) and,
//!   with `images`, its `image/png` through the pipe mutter hands back (`SelectionRead`), and
//!   sends a record. GNOME has no primary selection on this API: CLIPBOARD only.
//! - sink: for each record the session becomes the clipboard's owner for the record's
//!   formats (`SetSelection`; text under every text type programs ask for); when a program
//!   pastes, mutter asks (`SelectionTransfer`) and the sink writes the data to the pipe it
//!   gets (`SelectionWrite`), saying how it went (`SelectionWriteDone`). A cleared record
//!   leaves the clipboard as it is (GNOME keeps a clipboard whose owner quit; mutter 43
//!   cannot take a selection back).
//!
//! **Loops**: the sink's selection carries the extra type [`OWN_MIME`]; a source ignores an
//! owner offering it (or its own session), so what a sink installed is never sent back.

use super::pipe::{read_formats, read_within, write_within, TEXT_TYPES, WRITERS, WRITE_WAIT};
use super::{GnomeClipboardConfig, OWN_MIME, PNG, TEXT};
use crate::common::delivered::Delivered;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::gnome::{
    connect, create_remote_session, dbus_text, probe_remote_desktop, unavailable, watch_closed,
    CALL, REMOTE, REMOTE_SESSION,
};
use crate::common::report::{SinkReport, SinkTask, SourceReport, SourceTask};
use dbus::arg::{prop_cast, PropMap, RefArg, Variant};
use dbus::blocking::Connection;
use dbus::message::MatchRule;
use ndd_core::{Frame, RateLimit};
use ndd_wire::clipboard::{Contents, Selection};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{Receiver, Sender};

/// How long the endpoints wait for the bus at a time (they notice a closed stream then).
const POLL: Duration = Duration::from_millis(20);
/// How long a source waits for the clipboard's owner to hand one format over.
const ANSWER_WAIT: Duration = Duration::from_secs(2);
/// Most MIME types of one owner kept, and the longest kept.
const MAX_TYPES: usize = 64;
const MAX_TYPE_LEN: usize = 255;

/// What mutter said on the session, taken by the endpoint's loop.
#[derive(Default)]
struct Heard {
    /// New owners of the clipboard: their MIME types, and whether it is this session.
    owners: Vec<(Vec<String>, bool)>,
    /// Pastes asking this session's data: the MIME type and the serial to answer with.
    transfers: Vec<(String, u32)>,
}

/// The MIME types in a `mime-types` option (mutter sends them as `(as)`; `as` is taken too),
/// at most [`MAX_TYPES`], each at most [`MAX_TYPE_LEN`] bytes.
fn mime_types(opts: &PropMap) -> Vec<String> {
    fn collect(v: &dyn RefArg, depth: u8, out: &mut Vec<String>) {
        if let Some(s) = v.as_str() {
            if out.len() < MAX_TYPES && s.len() <= MAX_TYPE_LEN {
                out.push(s.to_string());
            }
        } else if depth > 0 {
            if let Some(items) = v.as_iter() {
                for x in items {
                    collect(x, depth - 1, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    if let Some(v) = opts.get("mime-types") {
        collect(&v.0, 2, &mut out);
    }
    out
}

/// An open `gnome-clipboard` endpoint: a remote-desktop session of mutter's with its
/// clipboard enabled.
pub(crate) struct GnomeClipboard {
    endpoint: &'static str,
    bus: String,
    conn: Connection,
    session: dbus::Path<'static>,
    heard: Arc<Mutex<Heard>>,
    closed: Arc<AtomicBool>,
    max_bytes: u64,
    images: bool,
}

impl Drop for GnomeClipboard {
    fn drop(&mut self) {
        let _: Result<(), _> = self.proxy().method_call(REMOTE_SESSION, "Stop", ());
    }
}

fn lock(h: &Mutex<Heard>) -> std::sync::MutexGuard<'_, Heard> {
    h.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Opens a remote-desktop session on the bus, with its clipboard enabled.
fn open(endpoint: &'static str, c: &GnomeClipboardConfig) -> Result<GnomeClipboard, EndpointError> {
    let (bus, conn) = connect(endpoint, &c.bus)?;
    let fail = |what: String| {
        unavailable(
            endpoint,
            &bus,
            what,
            "mutter refused the remote-desktop session's clipboard (GNOME 40 or later on Wayland has it)",
        )
    };
    let session = create_remote_session(&conn, endpoint, &bus, &fail)?;
    let closed = watch_closed(&conn, REMOTE_SESSION, &session).map_err(|e| fail(dbus_text(&e)))?;
    let heard = Arc::new(Mutex::new(Heard::default()));
    let h = Arc::clone(&heard);
    conn.add_match(
        MatchRule::new_signal(REMOTE_SESSION, "SelectionOwnerChanged").with_path(session.clone()),
        move |(opts,): (PropMap,), _, _| {
            let own = prop_cast::<bool>(&opts, "session-is-owner").copied() == Some(true);
            let mut h = lock(&h);
            // Only the newest owners matter to a source that fell behind.
            if h.owners.len() >= 16 {
                h.owners.remove(0);
            }
            h.owners.push((mime_types(&opts), own));
            true
        },
    )
    .map_err(|e| fail(dbus_text(&e)))?;
    let h = Arc::clone(&heard);
    conn.add_match(
        MatchRule::new_signal(REMOTE_SESSION, "SelectionTransfer").with_path(session.clone()),
        move |(mime, serial): (String, u32), _, _| {
            let mut h = lock(&h);
            if h.transfers.len() < 64 {
                h.transfers.push((mime, serial));
            }
            true
        },
    )
    .map_err(|e| fail(dbus_text(&e)))?;
    let g = GnomeClipboard {
        endpoint,
        bus: bus.clone(),
        conn,
        session,
        heard,
        closed,
        max_bytes: c.max_bytes,
        images: c.images,
    };
    g.proxy()
        .method_call::<(), _, _, _>(REMOTE_SESSION, "Start", ())
        .map_err(|e| fail(format!("Start: {}", dbus_text(&e))))?;
    g.enable()?;
    tracing::info!(endpoint, bus = %bus, "GNOME clipboard ready");
    Ok(g)
}

impl GnomeClipboard {
    fn proxy(&self) -> dbus::blocking::Proxy<'_, &Connection> {
        self.conn.with_proxy(REMOTE, &self.session, CALL)
    }

    fn fatal(&self, what: String) -> EndpointError {
        unavailable(
            self.endpoint,
            &self.bus,
            what,
            "mutter ended the remote-desktop session (GNOME stopped, or the session was closed from its menu)",
        )
    }

    fn enable(&self) -> Result<(), EndpointError> {
        self.proxy()
            .method_call::<(), _, _, _>(REMOTE_SESSION, "EnableClipboard", (PropMap::new(),))
            .map_err(|e| self.fatal(format!("EnableClipboard: {}", dbus_text(&e))))
    }

    /// Processes what came on the bus, waiting at most `wait` for it.
    fn pump(&self, wait: Duration) -> Result<(), EndpointError> {
        self.conn
            .process(wait)
            .map_err(|e| self.fatal(format!("the session bus: {}", dbus_text(&e))))?;
        if self.closed.load(Ordering::Acquire) {
            return Err(self.fatal("mutter closed the remote-desktop session".into()));
        }
        Ok(())
    }

    /// One format of the clipboard, read through the pipe mutter hands back (at most `limit`
    /// bytes); `None` when the owner did not hand it over in time, or refused.
    fn read(&self, mime: &str, limit: u64) -> Result<Option<Vec<u8>>, EndpointError> {
        let r: Result<(OwnedFd,), _> =
            self.proxy()
                .method_call(REMOTE_SESSION, "SelectionRead", (mime,));
        let fd = match r {
            Ok((fd,)) => fd,
            Err(e) => {
                tracing::debug!(endpoint = self.endpoint, mime, error = %dbus_text(&e), "SelectionRead refused");
                return Ok(None);
            }
        };
        Ok(read_within(fd, limit, ANSWER_WAIT))
    }
}

/// Connects a `gnome-clipboard` source and starts it.
pub(crate) fn spawn_gnome_clipboard_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &GnomeClipboardConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let g = open(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_source(g, stream, tx)))
}

/// Connects a `gnome-clipboard` sink and starts it.
pub(crate) fn spawn_gnome_clipboard_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &GnomeClipboardConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let g = open(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_sink(g, rx, delivered)))
}

/// Checks mutter's remote-desktop API answers on the bus (for `ndd check`), without opening
/// a session (that would show the person GNOME's sharing indicator).
pub(crate) fn probe(endpoint: &'static str, c: &GnomeClipboardConfig) -> Result<(), EndpointError> {
    probe_remote_desktop(endpoint, &c.bus).map(drop)
}

fn run_source(
    g: GnomeClipboard,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let mut em = Emitter::new(stream, tx);
    let mut skipped = RateLimit::default();
    loop {
        if em.tx.is_closed() {
            return Ok(em.report);
        }
        let owners = std::mem::take(&mut lock(&g.heard).owners);
        for (types, own) in owners {
            let contents = if own || types.iter().any(|t| t == OWN_MIME) {
                // This session's own selection, or what a sink installed: never sent back.
                None
            } else if types.is_empty() {
                Some(Contents {
                    selection: Selection::Clipboard,
                    formats: Vec::new(),
                })
            } else {
                let formats =
                    read_formats(&types, g.images, g.max_bytes, |t, room| g.read(t, room))?;
                if formats.is_empty() {
                    if let Some(suppressed) = skipped.admit(Instant::now()) {
                        tracing::warn!(endpoint = g.endpoint, suppressed, "clipboard not sent: no text or PNG handed over in time, or larger than max_bytes");
                    }
                    None
                } else {
                    Some(Contents {
                        selection: Selection::Clipboard,
                        formats,
                    })
                }
            };
            let Some(c) = contents else { continue };
            match c.emit() {
                Ok(bytes) => {
                    if !em.send_blocking(Frame::new(em.next_meta(), &bytes)) {
                        return Ok(em.report);
                    }
                    tracing::debug!(
                        endpoint = g.endpoint,
                        bytes = c.data_len(),
                        "clipboard sent"
                    );
                }
                Err(e) => {
                    if let Some(suppressed) = skipped.admit(Instant::now()) {
                        tracing::warn!(endpoint = g.endpoint, error = %e, suppressed, "clipboard not sent");
                    }
                }
            }
        }
        // Pastes are the sink's business; a source's session owns nothing.
        lock(&g.heard).transfers.clear();
        g.pump(POLL)?;
    }
}

/// The MIME types a selection of `formats` is offered under.
fn offered(formats: &[(String, Vec<u8>)], images: bool) -> Vec<String> {
    let mut types = Vec::new();
    for (name, _) in formats {
        if name == TEXT {
            types.extend(TEXT_TYPES.iter().map(|t| t.to_string()));
        } else if name == PNG && !images {
            continue;
        } else {
            types.push(name.clone());
        }
    }
    types.push(OWN_MIME.to_string());
    types
}

/// The data of `formats` a paste of `mime` gets.
fn answer<'a>(formats: &'a [(String, Vec<u8>)], mime: &str) -> Option<&'a [u8]> {
    let want = if TEXT_TYPES.contains(&mime) {
        TEXT
    } else {
        mime
    };
    formats
        .iter()
        .find(|(n, _)| n == want)
        .map(|(_, d)| d.as_slice())
}

fn run_sink(
    g: GnomeClipboard,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let mut report = SinkReport::default();
    let mut dropped = RateLimit::default();
    let mut refused = RateLimit::default();
    // What this session offers now (empty: it owns nothing).
    let mut serving: Vec<(String, Vec<u8>)> = Vec::new();
    // Writes that finished, to be said to mutter: (serial, whether all was written).
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(u32, bool)>();
    let writing = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let say_done = |serial: u32, ok: bool| {
        let r: Result<(), _> =
            g.proxy()
                .method_call(REMOTE_SESSION, "SelectionWriteDone", (serial, ok));
        if let Err(e) = r {
            tracing::debug!(endpoint = g.endpoint, serial, error = %dbus_text(&e), "SelectionWriteDone refused");
        }
    };
    loop {
        match rx.try_recv() {
            Ok(frame) => {
                report.frames += 1;
                report.bytes += frame.len() as u64;
                match Contents::parse(frame.payload()) {
                    Err(e) => {
                        if let Some(suppressed) = dropped.admit(Instant::now()) {
                            tracing::warn!(endpoint = g.endpoint, error = %e, suppressed, "bad clipboard record dropped");
                        }
                    }
                    // GNOME has no primary selection on this API.
                    Ok(c) if c.selection != Selection::Clipboard => {}
                    Ok(c) if c.data_len() as u64 > g.max_bytes => {
                        if let Some(suppressed) = dropped.admit(Instant::now()) {
                            tracing::warn!(
                                endpoint = g.endpoint,
                                bytes = c.data_len(),
                                max_bytes = g.max_bytes,
                                suppressed,
                                "clipboard record larger than max_bytes dropped"
                            );
                        }
                    }
                    Ok(c) => {
                        // Cleared (its owner quit), or nothing this sink may offer but its
                        // marker: the clipboard stays as it is, as GNOME keeps a clipboard
                        // whose owner quit. (mutter 43 cannot take it back either:
                        // SetSelection refuses an empty list, and DisableClipboard keeps the
                        // selection and makes EnableClipboard fail with "Already enabled" —
                        // which ended the stream, found by review.)
                        let types = offered(&c.formats, g.images);
                        if types.len() > 1 {
                            let mut opts = PropMap::new();
                            opts.insert(
                                "mime-types".into(),
                                Variant(Box::new(types) as Box<dyn RefArg>),
                            );
                            g.proxy()
                                .method_call::<(), _, _, _>(REMOTE_SESSION, "SetSelection", (opts,))
                                .map_err(|e| g.fatal(format!("SetSelection: {}", dbus_text(&e))))?;
                            serving = c.formats;
                        }
                    }
                }
                delivered.mark(frame.meta.seq);
                continue;
            }
            Err(TryRecvError::Disconnected) => return Ok(report),
            Err(TryRecvError::Empty) => {}
        }
        // Owners are a source's business.
        lock(&g.heard).owners.clear();
        let transfers = std::mem::take(&mut lock(&g.heard).transfers);
        for (mime, serial) in transfers {
            // Every paste takes its pipe first, answerable or not: mutter forgets a transfer
            // only once SelectionWrite took its serial (SelectionWriteDone alone left the
            // program pasting waiting some 15 s, found by review); one this sink cannot answer
            // gets the pipe closed empty.
            let r: Result<(OwnedFd,), _> =
                g.proxy()
                    .method_call(REMOTE_SESSION, "SelectionWrite", (serial,));
            let fd = match r {
                Ok((fd,)) => fd,
                Err(e) => {
                    tracing::debug!(endpoint = g.endpoint, serial, error = %dbus_text(&e), "SelectionWrite refused");
                    say_done(serial, false);
                    continue;
                }
            };
            let Some(data) = answer(&serving, &mime).map(<[u8]>::to_vec) else {
                drop(fd);
                say_done(serial, false);
                continue;
            };
            // A slow reader must not hold up the session: the write has a thread of its own,
            // at most WRITERS at once, each given up after WRITE_WAIT.
            if writing.fetch_add(1, Ordering::AcqRel) < WRITERS {
                let (done, writing) = (done_tx.clone(), Arc::clone(&writing));
                std::thread::spawn(move || {
                    let ok = write_within(fd, &data, WRITE_WAIT);
                    writing.fetch_sub(1, Ordering::AcqRel);
                    let _ = done.send((serial, ok));
                });
            } else {
                writing.fetch_sub(1, Ordering::AcqRel);
                drop(fd);
                say_done(serial, false);
                if let Some(suppressed) = refused.admit(Instant::now()) {
                    tracing::warn!(
                        endpoint = g.endpoint,
                        suppressed,
                        "{WRITERS} pastes are still being written: this one is refused"
                    );
                }
            }
        }
        while let Ok((serial, ok)) = done_rx.try_recv() {
            say_done(serial, ok);
        }
        g.pump(POLL)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_types_are_read_as_mutter_sends_them_and_bounded() {
        let mut opts = PropMap::new();
        // mutter: `(as)`.
        let inner: Vec<String> = vec!["UTF8_STRING".into(), TEXT.into()];
        opts.insert(
            "mime-types".into(),
            Variant(Box::new((inner,)) as Box<dyn RefArg>),
        );
        assert_eq!(mime_types(&opts), ["UTF8_STRING", TEXT]);
        // A plain `as`, and far too many, far too long.
        let mut many: Vec<String> = (0..200).map(|i| format!("type/{i}")).collect();
        many.insert(0, "x".repeat(300));
        opts.insert(
            "mime-types".into(),
            Variant(Box::new(many) as Box<dyn RefArg>),
        );
        let got = mime_types(&opts);
        assert_eq!(got.len(), MAX_TYPES);
        assert_eq!(got[0], "type/0", "the over-long type is left out");
        // Something else entirely.
        opts.insert(
            "mime-types".into(),
            Variant(Box::new(7u32) as Box<dyn RefArg>),
        );
        assert!(mime_types(&opts).is_empty());
    }

    #[test]
    fn text_is_offered_under_every_text_type_and_answered_as_utf8() {
        let formats = vec![
            (TEXT.to_string(), b"hi".to_vec()),
            (PNG.to_string(), vec![0x89, b'P']),
        ];
        let types = offered(&formats, true);
        for t in TEXT_TYPES {
            assert!(types.iter().any(|x| x == t), "{t} offered");
            assert_eq!(answer(&formats, t), Some(&b"hi"[..]));
        }
        assert!(types.iter().any(|x| x == PNG));
        assert_eq!(types.last().map(String::as_str), Some(OWN_MIME));
        assert!(!offered(&formats, false).iter().any(|x| x == PNG));
        assert_eq!(answer(&formats, "image/jpeg"), None);
        assert_eq!(
            offered(&[], true),
            [OWN_MIME],
            "nothing to offer but the marker"
        );
    }
}
