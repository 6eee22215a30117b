//! The `x11-clipboard` source and sink: the X selections (CLIPBOARD, PRIMARY) of one display
//! shared with another, text (UTF-8) and images (PNG), as [`Contents`] records; the same
//! records for wlroots compositors (`wayland.rs`: `wayland-clipboard`) and GNOME (`gnome.rs`:
//! `gnome-clipboard`), whose pipes `pipe.rs` reads and writes.
//!
//! - source: an unmapped window asks XFIXES for every change of a selection's owner; when a
//!   program takes a selection, the source asks it for its `TARGETS`, then for its text
//!   (`UTF8_STRING`, else `text/plain;charset=utf-8`, else Latin-1 `STRING`) and, with
//!   `images`, its `image/png`, reading large answers incrementally (ICCCM `INCR`); a record
//!   goes out with what it got. A selection given up (its owner quit) is sent as cleared.
//! - sink: takes ownership of the selection on its display for each record and answers the
//!   programs that paste: `TARGETS`, `TIMESTAMP`, text as `UTF8_STRING`, `STRING`, `TEXT` and
//!   the `text/plain` types, `image/png`; answers larger than one X request go out with
//!   `INCR`. A program that takes the selection over ends the sink's ownership.
//!
//! **Loops**: the sink's window is named `ndd clipboard`; a source ignores an owner with that
//! name, so what a sink installed is never sent back, whatever process owns it. Its targets
//! also name [`OWN_MIME`], which a Wayland source seeing the selection through Xwayland
//! ignores (as it does a Wayland sink's); a source ignores an owner offering it too (a
//! Wayland sink's selection seen through Xwayland).
//! **Size**: a selection whose data exceeds `max_bytes` is not sent (one warning); a record
//! larger than that is dropped by the sink.
//!
//! Both run as blocking tasks, like the other X endpoints.

#[cfg(feature = "wayland")]
mod gnome;
#[cfg(feature = "wayland")]
mod pipe;
#[cfg(feature = "wayland")]
mod wayland;

#[cfg(not(feature = "wayland"))]
pub(crate) use crate::common::no_wayland::{
    probe_gnome_clipboard, spawn_gnome_clipboard_sink, spawn_gnome_clipboard_source,
};
#[cfg(not(feature = "wayland"))]
pub(crate) use crate::common::no_wayland::{
    probe_wayland, spawn_wayland_clipboard_sink, spawn_wayland_clipboard_source,
};
#[cfg(feature = "wayland")]
pub(crate) use gnome::{
    probe as probe_gnome_clipboard, spawn_gnome_clipboard_sink, spawn_gnome_clipboard_source,
};
#[cfg(feature = "wayland")]
pub(crate) use wayland::{
    probe as probe_wayland, spawn_wayland_clipboard_sink, spawn_wayland_clipboard_source,
};

/// The MIME type every offer of a `wayland-clipboard` or `gnome-clipboard` sink carries: a
/// source of either ignores such a selection.
pub const OWN_MIME: &str = "application/x-ndd-clipboard";

use crate::common::delivered::Delivered;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask, SourceReport, SourceTask};
use crate::common::x11::{default_display, wait_readable_for, x11_connect, x11_err};
use ndd_core::{Frame, RateLimit};
use ndd_wire::clipboard::{Contents, Selection};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{Receiver, Sender};
use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::xfixes::{self, ConnectionExt as _};
use x11rb::protocol::xproto::{self, AtomEnum, ConnectionExt as _, EventMask, PropMode, Property};
use x11rb::protocol::Event as XEvent;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// The name of every sink's window: what a source recognises as ndd's own.
pub const OWN_WINDOW_NAME: &[u8] = b"ndd clipboard";
/// The wire name of text (always UTF-8).
pub const TEXT: &str = "text/plain;charset=utf-8";
/// The wire name of PNG images.
pub const PNG: &str = "image/png";
/// How long the endpoints wait for X events at a time (they notice a closed stream then).
const POLL: Duration = Duration::from_millis(20);
/// How long a source waits for a program to answer one conversion (or one INCR chunk).
const ANSWER_WAIT: Duration = Duration::from_secs(2);

fn default_selections() -> Vec<String> {
    vec!["CLIPBOARD".into(), "PRIMARY".into()]
}
fn default_max_bytes() -> u64 {
    8 << 20
}
fn yes() -> bool {
    true
}

/// `x11-clipboard` parameters (source and sink).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct X11ClipboardConfig {
    /// The X display whose selections are shared.
    #[serde(default = "default_display")]
    pub display: String,
    /// Which selections: `CLIPBOARD`, `PRIMARY`; an empty list turns the endpoint off.
    #[serde(default = "default_selections")]
    pub selections: Vec<String>,
    /// Largest selection (all formats together) sent or accepted, in bytes.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Share PNG images too (text always).
    #[serde(default = "yes")]
    pub images: bool,
}

impl Default for X11ClipboardConfig {
    fn default() -> Self {
        X11ClipboardConfig {
            display: default_display(),
            selections: default_selections(),
            max_bytes: default_max_bytes(),
            images: true,
        }
    }
}

impl X11ClipboardConfig {
    /// The selections, checked.
    pub fn parsed_selections(&self) -> Result<Vec<Selection>, String> {
        parse_selections(&self.selections)
    }
}

/// `wayland-clipboard` parameters (source and sink).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaylandClipboardConfig {
    /// The compositor's socket: a name in `$XDG_RUNTIME_DIR` or a full path; empty:
    /// `$WAYLAND_DISPLAY`.
    #[serde(default)]
    pub display: String,
    /// Which selections: `CLIPBOARD`, `PRIMARY`; an empty list turns the endpoint off.
    #[serde(default = "default_selections")]
    pub selections: Vec<String>,
    /// Largest selection (all formats together) sent or accepted, in bytes.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Share PNG images too (text always).
    #[serde(default = "yes")]
    pub images: bool,
    /// The data-control protocol: `auto` (the default) takes `ext-data-control-v1` where
    /// the compositor offers it, else `wlr-data-control-unstable-v1`; `ext` or `wlr` only
    /// that one.
    #[serde(default)]
    pub protocol: crate::display::WaylandProtocol,
}

impl Default for WaylandClipboardConfig {
    fn default() -> Self {
        WaylandClipboardConfig {
            display: String::new(),
            selections: default_selections(),
            max_bytes: default_max_bytes(),
            images: true,
            protocol: crate::display::WaylandProtocol::Auto,
        }
    }
}

impl WaylandClipboardConfig {
    /// The selections, checked.
    pub fn parsed_selections(&self) -> Result<Vec<Selection>, String> {
        parse_selections(&self.selections)
    }
}

/// `gnome-clipboard` parameters (source and sink).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GnomeClipboardConfig {
    /// The GNOME session's D-Bus address; empty: `$DBUS_SESSION_BUS_ADDRESS`.
    #[serde(default)]
    pub bus: String,
    /// Largest clipboard (all formats together) sent or accepted, in bytes.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Share PNG images too (text always).
    #[serde(default = "yes")]
    pub images: bool,
}

impl Default for GnomeClipboardConfig {
    fn default() -> Self {
        GnomeClipboardConfig {
            bus: String::new(),
            max_bytes: default_max_bytes(),
            images: true,
        }
    }
}

/// Selection names (`CLIPBOARD`, `PRIMARY`), checked, without repeats.
pub fn parse_selections(names: &[String]) -> Result<Vec<Selection>, String> {
    let mut out = Vec::new();
    for s in names {
        let sel = match s.as_str() {
            "CLIPBOARD" => Selection::Clipboard,
            "PRIMARY" => Selection::Primary,
            other => {
                return Err(format!(
                    "unknown selection {other:?} (known: \"CLIPBOARD\", \"PRIMARY\")"
                ))
            }
        };
        if !out.contains(&sel) {
            out.push(sel);
        }
    }
    Ok(out)
}

/// The atoms both ends use.
struct Atoms {
    selection: HashMap<Selection, xproto::Atom>,
    targets: xproto::Atom,
    timestamp: xproto::Atom,
    incr: xproto::Atom,
    utf8: xproto::Atom,
    text: xproto::Atom,
    text_plain_utf8: xproto::Atom,
    text_plain: xproto::Atom,
    png: xproto::Atom,
    /// The property a source receives conversions in.
    transfer: xproto::Atom,
    /// [`OWN_MIME`]: among a sink's targets, so a Wayland source that sees the selection
    /// through Xwayland (`gnome-clipboard`, `wayland-clipboard`) knows it for ndd's own.
    own: xproto::Atom,
}

impl Atoms {
    fn intern(conn: &RustConnection) -> Result<Atoms, String> {
        let names: [&[u8]; 12] = [
            b"CLIPBOARD",
            b"PRIMARY",
            b"TARGETS",
            b"TIMESTAMP",
            b"INCR",
            b"UTF8_STRING",
            b"TEXT",
            b"text/plain;charset=utf-8",
            b"text/plain",
            b"image/png",
            b"NDD_CLIPBOARD_TRANSFER",
            OWN_MIME.as_bytes(),
        ];
        let cookies = names
            .iter()
            .map(|n| conn.intern_atom(false, n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let mut a = Vec::with_capacity(names.len());
        for c in cookies {
            a.push(c.reply().map_err(|e| e.to_string())?.atom);
        }
        Ok(Atoms {
            selection: HashMap::from([(Selection::Clipboard, a[0]), (Selection::Primary, a[1])]),
            targets: a[2],
            timestamp: a[3],
            incr: a[4],
            utf8: a[5],
            text: a[6],
            text_plain_utf8: a[7],
            text_plain: a[8],
            png: a[9],
            transfer: a[10],
            own: a[11],
        })
    }

    fn which(&self, atom: xproto::Atom) -> Option<Selection> {
        self.selection
            .iter()
            .find(|(_, &a)| a == atom)
            .map(|(s, _)| *s)
    }
}

/// Connects, checks XFIXES, interns the atoms and makes the endpoint's window.
fn open(
    endpoint: &'static str,
    display: &str,
    name: Option<&[u8]>,
) -> Result<(RustConnection, Atoms, xproto::Window), EndpointError> {
    let (conn, screen) = x11_connect(endpoint, display)?;
    let err = |e: String| x11_err(endpoint, display, e);
    conn.xfixes_query_version(5, 0)
        .map_err(|e| err(e.to_string()))?
        .reply()
        .map_err(|e| EndpointError::Unavailable {
            endpoint,
            what: format!("X display {display}: no XFIXES extension ({e})"),
            hint: "x11-clipboard needs XFIXES 1 or later (Xorg, Xvfb and Xwayland have it)".into(),
        })?;
    let atoms = Atoms::intern(&conn).map_err(err)?;
    let root = conn.setup().roots[screen].root;
    let window = conn.generate_id().map_err(|e| err(e.to_string()))?;
    conn.create_window(
        x11rb::COPY_DEPTH_FROM_PARENT,
        window,
        root,
        0,
        0,
        1,
        1,
        0,
        xproto::WindowClass::INPUT_OUTPUT,
        x11rb::COPY_FROM_PARENT,
        &xproto::CreateWindowAux::new().event_mask(EventMask::PROPERTY_CHANGE),
    )
    .map_err(|e| err(e.to_string()))?
    .check()
    .map_err(|e| err(format!("cannot create a window: {e:?}")))?;
    if let Some(name) = name {
        conn.change_property8(
            PropMode::REPLACE,
            window,
            AtomEnum::WM_NAME,
            AtomEnum::STRING,
            name,
        )
        .map_err(|e| err(e.to_string()))?;
    }
    conn.flush().map_err(|e| err(e.to_string()))?;
    Ok((conn, atoms, window))
}

fn check_config(
    endpoint: &'static str,
    c: &X11ClipboardConfig,
) -> Result<Vec<Selection>, EndpointError> {
    c.parsed_selections()
        .map_err(|e| EndpointError::Unavailable {
            endpoint,
            what: format!("key `selections`: {e}"),
            hint: "list \"CLIPBOARD\" and/or \"PRIMARY\", or none to turn the endpoint off".into(),
        })
}

// ---- source ----

/// Connects an `x11-clipboard` source and starts it.
pub(crate) fn spawn_x11_clipboard_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &X11ClipboardConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let selections = check_config(endpoint, c)?;
    let (conn, atoms, window) = open(endpoint, &c.display, None)?;
    let err = |e: String| x11_err(endpoint, &c.display, e);
    let mask = xfixes::SelectionEventMask::SET_SELECTION_OWNER
        | xfixes::SelectionEventMask::SELECTION_WINDOW_DESTROY
        | xfixes::SelectionEventMask::SELECTION_CLIENT_CLOSE;
    for s in &selections {
        conn.xfixes_select_selection_input(window, atoms.selection[s], mask)
            .map_err(|e| err(e.to_string()))?;
    }
    conn.flush().map_err(|e| err(e.to_string()))?;
    let src = Source {
        endpoint,
        conn,
        atoms,
        window,
        display: c.display.clone(),
        max_bytes: c.max_bytes,
        images: c.images,
        stashed: Vec::new(),
        skipped: Skipped::default(),
    };
    Ok(rt.spawn_blocking(move || src.run(selections, stream, tx)))
}

struct Source {
    endpoint: &'static str,
    conn: RustConnection,
    atoms: Atoms,
    window: xproto::Window,
    display: String,
    max_bytes: u64,
    images: bool,
    /// Owner changes seen while waiting for an answer, handled next.
    stashed: Vec<XEvent>,
    /// Selections not shared: any program on the display may take a selection as often as
    /// it likes.
    skipped: Skipped,
}

/// Lines about selections or records not shared, each kind at most five a second with the
/// count held back (a program on the display, or the peer, makes them as fast as it likes).
struct Skipped {
    /// Source: too large; sink: a record too large.
    large: RateLimit,
    /// Source: not read, or not sent; sink: a bad record.
    bad: RateLimit,
    /// Sink: the selection could not be taken.
    untaken: RateLimit,
}

impl Default for Skipped {
    fn default() -> Self {
        let limit = || RateLimit::with_burst(Duration::from_secs(1), 5);
        Skipped {
            large: limit(),
            bad: limit(),
            untaken: limit(),
        }
    }
}

/// Why a selection was not read.
enum Skip {
    /// Too large (the warning names the size).
    TooLarge(u64),
    /// The owner did not answer, or refused.
    NoAnswer(String),
}

impl Source {
    fn fatal(&self, e: impl std::fmt::Display) -> EndpointError {
        x11_err(self.endpoint, &self.display, e)
    }

    fn run(
        mut self,
        selections: Vec<Selection>,
        stream: u16,
        tx: Sender<Frame>,
    ) -> Result<SourceReport, EndpointError> {
        let mut em = Emitter::new(stream, tx);
        // What the selections hold now is shared at start.
        let mut dirty: Vec<(Selection, xproto::Window)> = Vec::new();
        for &s in &selections {
            let owner = self
                .conn
                .get_selection_owner(self.atoms.selection[&s])
                .map_err(|e| self.fatal(e))?
                .reply()
                .map_err(|e| self.fatal(e))?
                .owner;
            if owner != x11rb::NONE {
                dirty.push((s, owner));
            }
        }
        loop {
            for (s, owner) in std::mem::take(&mut dirty) {
                if let Some(c) = self.contents(s, owner)? {
                    match c.emit() {
                        Ok(bytes) => {
                            if !em.send_blocking(Frame::new(em.next_meta(), &bytes)) {
                                return Ok(em.report);
                            }
                            tracing::debug!(
                                endpoint = self.endpoint,
                                selection = %s,
                                bytes = c.data_len(),
                                "selection sent"
                            );
                        }
                        Err(e) => {
                            if let Some(suppressed) = self.skipped.bad.admit(Instant::now()) {
                                tracing::warn!(endpoint = self.endpoint, error = %e, suppressed, "selection not sent")
                            }
                        }
                    }
                }
            }
            let mut events = std::mem::take(&mut self.stashed);
            while let Some(ev) = self.conn.poll_for_event().map_err(|e| self.fatal(e))? {
                events.push(ev);
            }
            for ev in events {
                if let XEvent::XfixesSelectionNotify(n) = ev {
                    if let Some(s) = self.atoms.which(n.selection) {
                        dirty.retain(|(d, _)| *d != s);
                        dirty.push((s, n.owner));
                    }
                }
            }
            if em.tx.is_closed() {
                return Ok(em.report);
            }
            if dirty.is_empty() {
                wait_readable_for(self.conn.stream(), POLL).map_err(|e| self.fatal(e))?;
            }
        }
    }

    /// The record to send for `s` now owned by `owner`; `None` for ndd's own windows and for
    /// selections that could not be read (after a warning).
    fn contents(
        &mut self,
        s: Selection,
        owner: xproto::Window,
    ) -> Result<Option<Contents>, EndpointError> {
        if owner == x11rb::NONE {
            return Ok(Some(Contents {
                selection: s,
                formats: vec![],
            }));
        }
        if self.is_ours(owner) {
            return Ok(None);
        }
        match self.read_all(s) {
            Ok(c) if c.formats.is_empty() => Ok(None),
            Ok(c) => Ok(Some(c)),
            Err(Err(e)) => Err(e),
            Err(Ok(Skip::TooLarge(n))) => {
                if let Some(suppressed) = self.skipped.large.admit(Instant::now()) {
                    tracing::warn!(
                        endpoint = self.endpoint,
                        selection = %s,
                        bytes = n,
                        max_bytes = self.max_bytes,
                        suppressed,
                        "selection not shared: larger than max_bytes"
                    );
                }
                Ok(None)
            }
            Err(Ok(Skip::NoAnswer(why))) => {
                if let Some(suppressed) = self.skipped.bad.admit(Instant::now()) {
                    tracing::warn!(endpoint = self.endpoint, selection = %s, suppressed, "selection not read: {why}");
                }
                Ok(None)
            }
        }
    }

    /// Whether `w` is a sink's window (named [`OWN_WINDOW_NAME`]).
    fn is_ours(&self, w: xproto::Window) -> bool {
        let name = self
            .conn
            .get_property(false, w, AtomEnum::WM_NAME, AtomEnum::STRING, 0, 16)
            .ok()
            .and_then(|c| c.reply().ok());
        name.is_some_and(|r| r.value == OWN_WINDOW_NAME)
    }

    fn read_all(&mut self, s: Selection) -> Result<Contents, Result<Skip, EndpointError>> {
        let targets = self.convert(s, self.atoms.targets)?;
        let offered: Vec<xproto::Atom> = targets
            .chunks_exact(4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if offered.contains(&self.atoms.own) {
            // What a sink installed, seen through another process (a Wayland sink's
            // selection through Xwayland): never sent back.
            return Ok(Contents {
                selection: s,
                formats: vec![],
            });
        }
        let mut formats = Vec::new();
        let mut total = 0u64;
        let text_target = [
            self.atoms.utf8,
            self.atoms.text_plain_utf8,
            AtomEnum::STRING.into(),
        ]
        .into_iter()
        .find(|t| offered.contains(t));
        if let Some(t) = text_target {
            let data = self.convert(s, t)?;
            let text = if t == u32::from(AtomEnum::STRING) {
                // Latin-1: every byte is the code point.
                data.iter()
                    .map(|&b| char::from(b))
                    .collect::<String>()
                    .into_bytes()
            } else {
                data
            };
            total += text.len() as u64;
            formats.push((TEXT.to_string(), text));
        }
        if self.images && offered.contains(&self.atoms.png) {
            let data = self.convert(s, self.atoms.png)?;
            total += data.len() as u64;
            formats.push((PNG.to_string(), data));
        }
        if total > self.max_bytes {
            return Err(Ok(Skip::TooLarge(total)));
        }
        Ok(Contents {
            selection: s,
            formats,
        })
    }

    /// Asks the owner of `s` for `target` and reads the answer (incrementally if it says
    /// INCR), bounded by `max_bytes`.
    fn convert(
        &mut self,
        s: Selection,
        target: xproto::Atom,
    ) -> Result<Vec<u8>, Result<Skip, EndpointError>> {
        let fatal = |e: &dyn std::fmt::Display| Err(self.fatal(e));
        let prop = self.atoms.transfer;
        self.conn
            .delete_property(self.window, prop)
            .map_err(|e| fatal(&e))?;
        self.conn
            .convert_selection(
                self.window,
                self.atoms.selection[&s],
                target,
                prop,
                x11rb::CURRENT_TIME,
            )
            .map_err(|e| fatal(&e))?;
        self.conn.flush().map_err(|e| fatal(&e))?;
        let window = self.window;
        let notify =
            self.wait_for(|ev| matches!(ev, XEvent::SelectionNotify(n) if n.requestor == window))?;
        let XEvent::SelectionNotify(n) = notify else {
            return Err(Ok(Skip::NoAnswer("no answer".into())));
        };
        if n.property == x11rb::NONE {
            return Err(Ok(Skip::NoAnswer(format!(
                "the owner refused target {target}"
            ))));
        }
        let first = self.take_property(prop)?;
        if first.0 != self.atoms.incr {
            if first.1.len() as u64 > self.max_bytes {
                return Err(Ok(Skip::TooLarge(first.1.len() as u64)));
            }
            return Ok(first.1);
        }
        // INCR: the property was deleted by reading it; the owner now writes chunks, each
        // awaited as a new value and deleted by reading it, until an empty one.
        let mut data = Vec::new();
        loop {
            self.wait_for(|ev| {
                matches!(ev, XEvent::PropertyNotify(p)
                    if p.window == window && p.atom == prop && p.state == Property::NEW_VALUE)
            })?;
            let (_, chunk) = self.take_property(prop)?;
            if chunk.is_empty() {
                return Ok(data);
            }
            data.extend_from_slice(&chunk);
            if data.len() as u64 > self.max_bytes {
                return Err(Ok(Skip::TooLarge(data.len() as u64)));
            }
        }
    }

    /// Reads and deletes `prop` of the source's window: its type and bytes.
    fn take_property(
        &self,
        prop: xproto::Atom,
    ) -> Result<(xproto::Atom, Vec<u8>), Result<Skip, EndpointError>> {
        let words = u32::try_from(self.max_bytes / 4 + 1).unwrap_or(u32::MAX);
        let r = self
            .conn
            .get_property(true, self.window, prop, AtomEnum::ANY, 0, words)
            .map_err(|e| Err(self.fatal(e)))?
            .reply()
            .map_err(|e| Err(self.fatal(e)))?;
        if r.bytes_after > 0 {
            return Err(Ok(Skip::TooLarge(
                r.value.len() as u64 + u64::from(r.bytes_after),
            )));
        }
        Ok((r.type_, r.value))
    }

    /// Waits (at most [`ANSWER_WAIT`]) for the event `want` picks; owner changes seen
    /// meanwhile are kept for later, other events dropped.
    fn wait_for(
        &mut self,
        want: impl Fn(&XEvent) -> bool,
    ) -> Result<XEvent, Result<Skip, EndpointError>> {
        let deadline = Instant::now() + ANSWER_WAIT;
        loop {
            while let Some(ev) = self.conn.poll_for_event().map_err(|e| Err(self.fatal(e)))? {
                if want(&ev) {
                    return Ok(ev);
                }
                if matches!(ev, XEvent::XfixesSelectionNotify(_)) {
                    self.stashed.push(ev);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Ok(Skip::NoAnswer(format!(
                    "the owner did not answer within {} s",
                    ANSWER_WAIT.as_secs()
                ))));
            }
            wait_readable_for(self.conn.stream(), deadline - now)
                .map_err(|e| Err(self.fatal(e)))?;
        }
    }
}

// ---- sink ----

/// Connects an `x11-clipboard` sink and starts it.
pub(crate) fn spawn_x11_clipboard_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &X11ClipboardConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let sink = Sink::new(endpoint, c)?;
    Ok(rt.spawn_blocking(move || sink.run(rx, delivered)))
}

/// An INCR answer in progress: the requestor deletes the property, the next chunk follows.
struct Transfer {
    requestor: xproto::Window,
    property: xproto::Atom,
    kind: xproto::Atom,
    data: Vec<u8>,
    sent: usize,
    /// Sent the empty end chunk already.
    done: bool,
}

struct Sink {
    endpoint: &'static str,
    conn: RustConnection,
    atoms: Atoms,
    window: xproto::Window,
    display: String,
    max_bytes: u64,
    selections: Vec<Selection>,
    /// What the sink owns and serves, per selection.
    held: HashMap<Selection, Contents>,
    transfers: Vec<Transfer>,
    /// Largest property written at once.
    chunk: usize,
    /// Records dropped: the peer sends as many as it likes.
    dropped: Skipped,
}

impl Sink {
    /// Connects to the display and makes the sink's window.
    fn new(endpoint: &'static str, c: &X11ClipboardConfig) -> Result<Sink, EndpointError> {
        let selections = check_config(endpoint, c)?;
        let (conn, atoms, window) = open(endpoint, &c.display, Some(OWN_WINDOW_NAME))?;
        Ok(Sink {
            endpoint,
            chunk: (conn.maximum_request_bytes() / 4).clamp(4096, 256 << 10),
            conn,
            atoms,
            window,
            display: c.display.clone(),
            max_bytes: c.max_bytes,
            selections,
            held: HashMap::new(),
            transfers: Vec::new(),
            dropped: Skipped::default(),
        })
    }

    fn fatal(&self, e: impl std::fmt::Display) -> EndpointError {
        x11_err(self.endpoint, &self.display, e)
    }

    fn run(
        mut self,
        mut rx: Receiver<Frame>,
        delivered: Delivered,
    ) -> Result<SinkReport, EndpointError> {
        let mut report = SinkReport::default();
        loop {
            while let Some(ev) = self.conn.poll_for_event().map_err(|e| self.fatal(e))? {
                self.on_event(ev)?;
            }
            match rx.try_recv() {
                Ok(frame) => {
                    report.frames += 1;
                    report.bytes += frame.len() as u64;
                    self.on_record(frame.payload(), Instant::now())?;
                    delivered.mark(frame.meta.seq);
                    continue;
                }
                Err(TryRecvError::Disconnected) => return Ok(report),
                Err(TryRecvError::Empty) => {}
            }
            self.conn.flush().map_err(|e| self.fatal(e))?;
            wait_readable_for(self.conn.stream(), POLL).map_err(|e| self.fatal(e))?;
        }
    }

    /// The peer's record `p`, taken at `now`.
    fn on_record(&mut self, p: &[u8], now: Instant) -> Result<(), EndpointError> {
        let c = match Contents::parse(p) {
            Ok(c) => c,
            Err(e) => {
                if let Some(suppressed) = self.dropped.bad.admit(now) {
                    tracing::warn!(endpoint = self.endpoint, error = %e, suppressed, "bad clipboard record dropped");
                }
                return Ok(());
            }
        };
        if !self.selections.contains(&c.selection) {
            return Ok(());
        }
        if c.data_len() as u64 > self.max_bytes {
            if let Some(suppressed) = self.dropped.large.admit(now) {
                tracing::warn!(
                    endpoint = self.endpoint,
                    selection = %c.selection,
                    bytes = c.data_len(),
                    max_bytes = self.max_bytes,
                    suppressed,
                    "clipboard record larger than max_bytes dropped"
                );
            }
            return Ok(());
        }
        let atom = self.atoms.selection[&c.selection];
        if c.formats.is_empty() {
            // The peer's selection was cleared: give ours up if we hold it.
            if self.held.remove(&c.selection).is_some() {
                self.conn
                    .set_selection_owner(x11rb::NONE, atom, x11rb::CURRENT_TIME)
                    .map_err(|e| self.fatal(e))?;
            }
            return Ok(());
        }
        self.conn
            .set_selection_owner(self.window, atom, x11rb::CURRENT_TIME)
            .map_err(|e| self.fatal(e))?;
        let owner = self
            .conn
            .get_selection_owner(atom)
            .map_err(|e| self.fatal(e))?
            .reply()
            .map_err(|e| self.fatal(e))?
            .owner;
        if owner != self.window {
            if let Some(suppressed) = self.dropped.untaken.admit(now) {
                tracing::warn!(endpoint = self.endpoint, selection = %c.selection, suppressed, "could not take the selection");
            }
            return Ok(());
        }
        tracing::debug!(endpoint = self.endpoint, selection = %c.selection, bytes = c.data_len(), "selection held");
        self.held.insert(c.selection, c);
        Ok(())
    }

    fn on_event(&mut self, ev: XEvent) -> Result<(), EndpointError> {
        match ev {
            XEvent::SelectionRequest(r) => self.answer(r),
            XEvent::SelectionClear(c) => {
                if let Some(s) = self.atoms.which(c.selection) {
                    self.held.remove(&s);
                }
                Ok(())
            }
            XEvent::PropertyNotify(p) if p.state == Property::DELETE => {
                self.next_chunk(p.window, p.atom)
            }
            _ => Ok(()),
        }
    }

    /// The targets offered for `c`, and the data and type of each.
    fn offer(&self, c: &Contents, target: xproto::Atom) -> Option<(xproto::Atom, Vec<u8>)> {
        let a = &self.atoms;
        let text = c.get(TEXT);
        if let Some(t) = text {
            if target == a.utf8 || target == a.text || target == a.text_plain_utf8 {
                let kind = if target == a.text { a.utf8 } else { target };
                return Some((kind, t.to_vec()));
            }
            if target == u32::from(AtomEnum::STRING) || target == a.text_plain {
                // Latin-1, with `?` for what it cannot show.
                let latin1 = String::from_utf8_lossy(t)
                    .chars()
                    .map(|ch| u8::try_from(u32::from(ch)).unwrap_or(b'?'))
                    .collect();
                return Some((target, latin1));
            }
        }
        if target == a.png {
            return c.get(PNG).map(|d| (a.png, d.to_vec()));
        }
        None
    }

    fn targets(&self, c: &Contents) -> Vec<xproto::Atom> {
        let a = &self.atoms;
        let mut t = vec![a.targets, a.timestamp, a.own];
        if c.get(TEXT).is_some() {
            t.extend([
                a.utf8,
                a.text_plain_utf8,
                AtomEnum::STRING.into(),
                a.text,
                a.text_plain,
            ]);
        }
        if c.get(PNG).is_some() {
            t.push(a.png);
        }
        t
    }

    fn answer(&mut self, r: xproto::SelectionRequestEvent) -> Result<(), EndpointError> {
        // Obsolete clients name no property: the target is the property then.
        let property = if r.property == x11rb::NONE {
            r.target
        } else {
            r.property
        };
        let held = self
            .atoms
            .which(r.selection)
            .and_then(|s| self.held.get(&s));
        let mut answered = x11rb::NONE;
        if let Some(c) = held {
            if r.target == self.atoms.targets {
                let t = self.targets(c);
                self.conn
                    .change_property32(PropMode::REPLACE, r.requestor, property, AtomEnum::ATOM, &t)
                    .map_err(|e| self.fatal(e))?;
                answered = property;
            } else if r.target == self.atoms.timestamp {
                self.conn
                    .change_property32(
                        PropMode::REPLACE,
                        r.requestor,
                        property,
                        AtomEnum::INTEGER,
                        &[0],
                    )
                    .map_err(|e| self.fatal(e))?;
                answered = property;
            } else if let Some((kind, data)) = self.offer(c, r.target) {
                if data.len() <= self.chunk {
                    self.conn
                        .change_property8(PropMode::REPLACE, r.requestor, property, kind, &data)
                        .map_err(|e| self.fatal(e))?;
                } else {
                    // INCR: announce the size, then a chunk each time the requestor deletes
                    // the property.
                    self.conn
                        .change_window_attributes(
                            r.requestor,
                            &xproto::ChangeWindowAttributesAux::new()
                                .event_mask(EventMask::PROPERTY_CHANGE),
                        )
                        .map_err(|e| self.fatal(e))?;
                    let size = u32::try_from(data.len()).unwrap_or(u32::MAX);
                    self.conn
                        .change_property32(
                            PropMode::REPLACE,
                            r.requestor,
                            property,
                            self.atoms.incr,
                            &[size],
                        )
                        .map_err(|e| self.fatal(e))?;
                    self.transfers
                        .retain(|t| (t.requestor, t.property) != (r.requestor, property));
                    self.transfers.push(Transfer {
                        requestor: r.requestor,
                        property,
                        kind,
                        data,
                        sent: 0,
                        done: false,
                    });
                }
                answered = property;
            }
        }
        let notify = xproto::SelectionNotifyEvent {
            response_type: xproto::SELECTION_NOTIFY_EVENT,
            sequence: 0,
            time: r.time,
            requestor: r.requestor,
            selection: r.selection,
            target: r.target,
            property: answered,
        };
        self.conn
            .send_event(false, r.requestor, EventMask::NO_EVENT, notify)
            .map_err(|e| self.fatal(e))?;
        self.conn.flush().map_err(|e| self.fatal(e))?;
        Ok(())
    }

    /// The requestor of an INCR answer deleted the property: the next chunk, or the end.
    fn next_chunk(
        &mut self,
        window: xproto::Window,
        atom: xproto::Atom,
    ) -> Result<(), EndpointError> {
        let Some(i) = self
            .transfers
            .iter()
            .position(|t| t.requestor == window && t.property == atom)
        else {
            return Ok(());
        };
        let t = &mut self.transfers[i];
        if t.done {
            self.transfers.remove(i);
            return Ok(());
        }
        let end = (t.sent + self.chunk).min(t.data.len());
        let piece = &t.data[t.sent..end];
        self.conn
            .change_property8(PropMode::REPLACE, t.requestor, t.property, t.kind, piece)
            .map_err(|e| x11_err(self.endpoint, &self.display, e))?;
        t.done = piece.is_empty();
        t.sent = end;
        self.conn.flush().map_err(|e| self.fatal(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_core::testlog::Captured;

    /// The peer sends a thousand bad records and a thousand too large ones within a second:
    /// five lines of each kind, then one with the count held back; the sink goes on.
    #[test]
    fn a_thousand_bad_records_in_a_second_are_a_few_lines() {
        if let Some(m) = ndd_procs::missing(&["Xvfb"]) {
            println!("SKIPPED: needs {m} (apt-get install xvfb)");
            return;
        }
        let x = ndd_procs::Xvfb::start("64x64x24").expect("Xvfb starts");
        let c = X11ClipboardConfig {
            display: x.display.clone(),
            max_bytes: 4,
            ..X11ClipboardConfig::default()
        };
        let mut sink = Sink::new("x11-clipboard", &c).expect("sink");
        let large = Contents {
            selection: Selection::Clipboard,
            formats: vec![("UTF8_STRING".into(), b"more than four".to_vec())],
        }
        .emit()
        .unwrap();
        let t0 = Instant::now();
        let ((), log) = Captured::run(|| {
            for i in 0..=1000u64 {
                let now = t0 + Duration::from_millis(if i == 1000 { 2000 } else { i });
                sink.on_record(b"\x01\xff garbage \x1b[2J", now).unwrap();
                sink.on_record(&large, now).unwrap();
            }
        });
        for what in [
            "bad clipboard record dropped",
            "larger than max_bytes dropped",
        ] {
            let lines = log.matching(what);
            assert_eq!(lines.len(), 6, "{lines:#?}");
            assert!(lines[5].contains("suppressed=995"), "{lines:#?}");
        }
    }
}
