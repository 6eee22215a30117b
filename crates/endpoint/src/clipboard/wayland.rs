//! The `wayland-clipboard` source and sink: the clipboard (and the primary selection) of a
//! wlroots Wayland session (sway, Hyprland, river, labwc) through `wlr-data-control`, as the
//! same [`Contents`] records as `x11-clipboard`, so an X11 side and a Wayland side share one
//! clipboard.
//!
//! - source: a data-control device on the seat hears every new selection (an offer with its
//!   MIME types); the source reads its text (`text/plain;charset=utf-8`, else `UTF8_STRING`,
//!   `text/plain`, `STRING`, `TEXT`) and, with `images`, its `image/png` through a pipe, and
//!   sends a record; a cleared selection is sent as cleared.
//! - sink: for each record, a data-control source offering the record's formats (text under
//!   every text type programs ask for) becomes the selection; the compositor asks it for the
//!   data when a program pastes. Another program taking the selection ends it (`cancelled`).
//!
//! **Loops**: the sink's offers carry the extra type [`OWN_MIME`]; a source ignores a
//! selection offering it, so what a sink installed is never sent back.

use super::pipe::{read_formats, write_within, TEXT_TYPES, WRITERS, WRITE_WAIT};
use super::{WaylandClipboardConfig, OWN_MIME, PNG, TEXT};
use crate::common::delivered::Delivered;
use crate::common::emitter::Emitter;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask, SourceReport, SourceTask};
use crate::common::wayland::{ignore_events, pump, readable, unavailable, wayland_connect};
use ndd_core::{Frame, RateLimit};
use ndd_wire::clipboard::{Contents, Selection};
use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{Receiver, Sender};
use wayland_client::backend::ObjectId;
use wayland_client::globals::registry_queue_init;
use wayland_client::protocol::wl_seat;
use wayland_client::{Connection, Dispatch, EventQueue, Proxy, QueueHandle};
use wayland_protocols_wlr::data_control::v1::client::{
    zwlr_data_control_device_v1 as device_v1, zwlr_data_control_manager_v1 as manager_v1,
    zwlr_data_control_offer_v1 as offer_v1, zwlr_data_control_source_v1 as source_v1,
};

/// How long the endpoints wait for the compositor at a time.
const POLL: Duration = Duration::from_millis(20);

/// How long a source waits for a program to hand over one format.
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// What the compositor told this endpoint.
#[derive(Default)]
struct State {
    /// Each live offer's MIME types.
    offers: HashMap<ObjectId, Vec<String>>,
    /// New selections not yet read: which, and its offer (`None`: cleared).
    changed: Vec<(Selection, Option<offer_v1::ZwlrDataControlOfferV1>)>,
    /// Sink: the data of each of its data sources, by source.
    serving: HashMap<ObjectId, Vec<(String, Vec<u8>)>>,
    /// Sink: data sources the compositor cancelled (another program took the selection).
    cancelled: Vec<source_v1::ZwlrDataControlSourceV1>,
    /// The device is gone (`finished`): the seat went away.
    finished: bool,
}

ignore_events!(State; wl_seat::WlSeat, manager_v1::ZwlrDataControlManagerV1);

impl Dispatch<device_v1::ZwlrDataControlDeviceV1, ()> for State {
    fn event(
        s: &mut State,
        _: &device_v1::ZwlrDataControlDeviceV1,
        e: device_v1::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        match e {
            device_v1::Event::DataOffer { id } => {
                s.offers.insert(id.id(), Vec::new());
            }
            device_v1::Event::Selection { id } => s.changed.push((Selection::Clipboard, id)),
            device_v1::Event::PrimarySelection { id } => s.changed.push((Selection::Primary, id)),
            device_v1::Event::Finished => s.finished = true,
            _ => {}
        }
    }

    wayland_client::event_created_child!(State, device_v1::ZwlrDataControlDeviceV1, [
        device_v1::EVT_DATA_OFFER_OPCODE => (offer_v1::ZwlrDataControlOfferV1, ()),
    ]);
}

impl Dispatch<offer_v1::ZwlrDataControlOfferV1, ()> for State {
    fn event(
        s: &mut State,
        offer: &offer_v1::ZwlrDataControlOfferV1,
        e: offer_v1::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        if let offer_v1::Event::Offer { mime_type } = e {
            let types = s.offers.entry(offer.id()).or_default();
            if types.len() < 64 {
                types.push(mime_type);
            }
        }
    }
}

impl Dispatch<source_v1::ZwlrDataControlSourceV1, ()> for State {
    fn event(
        s: &mut State,
        source: &source_v1::ZwlrDataControlSourceV1,
        e: source_v1::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<State>,
    ) {
        match e {
            source_v1::Event::Send { mime_type, fd } => {
                let data = s.serving.get(&source.id()).and_then(|formats| {
                    let want = if TEXT_TYPES.contains(&mime_type.as_str()) {
                        TEXT
                    } else {
                        mime_type.as_str()
                    };
                    formats
                        .iter()
                        .find(|(n, _)| n == want)
                        .map(|(_, d)| d.clone())
                });
                if let Some(data) = data {
                    // A slow reader must not hold up the session: the write has a thread of
                    // its own, at most WRITERS at once, each given up after WRITE_WAIT (a
                    // program that asks and never reads kept a thread and a copy for good:
                    // found by review).
                    if WRITING.fetch_add(1, Ordering::AcqRel) < WRITERS {
                        std::thread::spawn(move || {
                            let _ = write_within(fd, &data, WRITE_WAIT);
                            WRITING.fetch_sub(1, Ordering::AcqRel);
                        });
                    } else {
                        WRITING.fetch_sub(1, Ordering::AcqRel);
                        tracing::warn!(
                            "{WRITERS} pastes are still being written: this one is refused"
                        );
                    }
                }
            }
            source_v1::Event::Cancelled => {
                s.serving.remove(&source.id());
                s.cancelled.push(source.clone());
            }
            _ => {}
        }
    }
}

static WRITING: AtomicUsize = AtomicUsize::new(0);

/// One endpoint's connection: the queue, the manager and the seat's device.
struct Session {
    endpoint: &'static str,
    display: String,
    conn: Connection,
    queue: EventQueue<State>,
    state: State,
    manager: manager_v1::ZwlrDataControlManagerV1,
    device: device_v1::ZwlrDataControlDeviceV1,
    selections: Vec<Selection>,
    max_bytes: u64,
    images: bool,
}

fn open(endpoint: &'static str, c: &WaylandClipboardConfig) -> Result<Session, EndpointError> {
    let d = c.display.as_str();
    let selections = c
        .parsed_selections()
        .map_err(|reason| EndpointError::Config {
            endpoint,
            param: "selections",
            reason,
        })?;
    let conn = wayland_connect(endpoint, d)?;
    let broken = |e: String| unavailable(endpoint, d, e, "the compositor closed the connection");
    let (globals, mut queue) =
        registry_queue_init::<State>(&conn).map_err(|e| broken(e.to_string()))?;
    let qh = queue.handle();
    let seat: wl_seat::WlSeat = globals.bind(&qh, 1..=1, ()).map_err(|e| {
        unavailable(
            endpoint,
            d,
            format!("no wl_seat ({e})"),
            "every compositor has one",
        )
    })?;
    // Version 2 has the primary selection.
    let manager: manager_v1::ZwlrDataControlManagerV1 =
        globals.bind(&qh, 1..=2, ()).map_err(|e| {
            unavailable(
                endpoint,
                d,
                format!("no zwlr_data_control_manager_v1 ({e})"),
                "the wayland-clipboard endpoints need a compositor with wlr-data-control: a wlroots one (sway, Hyprland, river, labwc, wayfire) or KDE Plasma's KWin; on GNOME use gnome-clipboard",
            )
        })?;
    if manager.version() < 2 && selections.contains(&Selection::Primary) {
        tracing::info!(
            endpoint,
            display = d,
            "the compositor's data-control has no primary selection (version 1): CLIPBOARD only"
        );
    }
    let device = manager.get_data_device(&seat, &qh, ());
    let mut state = State::default();
    queue
        .roundtrip(&mut state)
        .map_err(|e| broken(e.to_string()))?;
    Ok(Session {
        endpoint,
        display: d.to_string(),
        conn,
        queue,
        state,
        manager,
        device,
        selections,
        max_bytes: c.max_bytes,
        images: c.images,
    })
}

impl Session {
    fn fatal(&self, e: impl std::fmt::Display) -> EndpointError {
        unavailable(
            self.endpoint,
            &self.display,
            e.to_string(),
            "the compositor closed the connection or refused a request",
        )
    }

    /// Dispatches what came, waiting at most `wait` for more.
    fn pump(&mut self, wait: Duration) -> Result<(), EndpointError> {
        pump(&mut self.queue, &mut self.state, wait).map_err(|e| self.fatal(e))?;
        if self.state.finished {
            return Err(self.fatal("the seat's data device went away"));
        }
        Ok(())
    }

    /// One format of `offer`, read through a pipe (at most `limit` bytes); `None` when the
    /// owner did not hand it over in time.
    fn receive(
        &mut self,
        offer: &offer_v1::ZwlrDataControlOfferV1,
        mime: &str,
        limit: u64,
    ) -> Result<Option<Vec<u8>>, EndpointError> {
        let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| self.fatal(format!("pipe: {e}")))?;
        offer.receive(mime.to_string(), w.as_fd());
        drop(w);
        self.conn.flush().map_err(|e| self.fatal(e))?;
        let mut f = std::fs::File::from(r);
        let mut data = Vec::new();
        let t0 = Instant::now();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if t0.elapsed() > ANSWER_WAIT {
                return Ok(None);
            }
            if !readable(f.as_fd(), POLL).unwrap_or(false) {
                // Keep the session going (the owner may be this compositor's other client).
                self.pump(Duration::ZERO)?;
                continue;
            }
            match f.read(&mut buf) {
                Ok(0) => return Ok(Some(data)),
                Ok(n) => {
                    data.extend_from_slice(&buf[..n]);
                    if data.len() as u64 > limit {
                        return Ok(None);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Ok(None),
            }
        }
    }
}

/// Connects a `wayland-clipboard` source and starts it.
pub(crate) fn spawn_wayland_clipboard_source(
    rt: &Handle,
    endpoint: &'static str,
    c: &WaylandClipboardConfig,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceTask, EndpointError> {
    let s = open(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_source(s, stream, tx)))
}

/// Connects a `wayland-clipboard` sink and starts it.
pub(crate) fn spawn_wayland_clipboard_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &WaylandClipboardConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let s = open(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_sink(s, rx, delivered)))
}

/// Checks the compositor offers what the endpoints need (for `ndd check`).
pub(crate) fn probe(
    endpoint: &'static str,
    c: &WaylandClipboardConfig,
) -> Result<(), EndpointError> {
    open(endpoint, c).map(drop)
}

fn run_source(
    mut s: Session,
    stream: u16,
    tx: Sender<Frame>,
) -> Result<SourceReport, EndpointError> {
    let mut em = Emitter::new(stream, tx);
    let mut skipped = RateLimit::default();
    loop {
        if em.tx.is_closed() {
            return Ok(em.report);
        }
        for (sel, offer) in std::mem::take(&mut s.state.changed) {
            let types = offer
                .as_ref()
                .and_then(|o| s.state.offers.get(&o.id()).cloned())
                .unwrap_or_default();
            let contents = if !s.selections.contains(&sel) {
                None
            } else if offer.is_none() {
                Some(Contents {
                    selection: sel,
                    formats: Vec::new(),
                })
            } else if types.iter().any(|t| t == OWN_MIME) {
                // What a sink installed: never sent back.
                None
            } else {
                let o = offer.as_ref().expect("an offer");
                let (images, max_bytes) = (s.images, s.max_bytes);
                let formats =
                    read_formats(&types, images, max_bytes, |t, room| s.receive(o, t, room))?;
                if formats.is_empty() {
                    if let Some(suppressed) = skipped.admit(Instant::now()) {
                        tracing::warn!(endpoint = s.endpoint, selection = %sel, suppressed, "selection not sent: no text or PNG handed over in time, or larger than max_bytes");
                    }
                    None
                } else {
                    Some(Contents {
                        selection: sel,
                        formats,
                    })
                }
            };
            if let Some(o) = offer {
                s.state.offers.remove(&o.id());
                o.destroy();
            }
            if let Some(c) = contents {
                match c.emit() {
                    Ok(bytes) => {
                        if !em.send_blocking(Frame::new(em.next_meta(), &bytes)) {
                            return Ok(em.report);
                        }
                        tracing::debug!(endpoint = s.endpoint, selection = %sel, bytes = c.data_len(), "selection sent");
                    }
                    Err(e) => {
                        if let Some(suppressed) = skipped.admit(Instant::now()) {
                            tracing::warn!(endpoint = s.endpoint, error = %e, suppressed, "selection not sent");
                        }
                    }
                }
            }
        }
        s.pump(POLL)?;
    }
}

fn run_sink(
    mut s: Session,
    mut rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let mut report = SinkReport::default();
    let mut dropped = RateLimit::default();
    // The data source holding each selection now.
    let mut held: HashMap<Selection, source_v1::ZwlrDataControlSourceV1> = HashMap::new();
    loop {
        match rx.try_recv() {
            Ok(frame) => {
                report.frames += 1;
                report.bytes += frame.len() as u64;
                match Contents::parse(frame.payload()) {
                    Err(e) => {
                        if let Some(suppressed) = dropped.admit(Instant::now()) {
                            tracing::warn!(endpoint = s.endpoint, error = %e, suppressed, "bad clipboard record dropped");
                        }
                    }
                    Ok(c) if !s.selections.contains(&c.selection) => {}
                    Ok(c) if c.data_len() as u64 > s.max_bytes => {
                        if let Some(suppressed) = dropped.admit(Instant::now()) {
                            tracing::warn!(endpoint = s.endpoint, selection = %c.selection, bytes = c.data_len(), max_bytes = s.max_bytes, suppressed, "clipboard record larger than max_bytes dropped");
                        }
                    }
                    Ok(c) if c.selection == Selection::Primary && s.manager.version() < 2 => {}
                    Ok(c) => {
                        let source = if c.formats.is_empty() {
                            None
                        } else {
                            let src = s.manager.create_data_source(&s.queue.handle(), ());
                            for (name, _) in &c.formats {
                                if name == TEXT {
                                    for t in TEXT_TYPES {
                                        src.offer(t.to_string());
                                    }
                                } else if name == PNG && !s.images {
                                    continue;
                                } else {
                                    src.offer(name.clone());
                                }
                            }
                            src.offer(OWN_MIME.to_string());
                            s.state.serving.insert(src.id(), c.formats.clone());
                            Some(src)
                        };
                        match c.selection {
                            Selection::Clipboard => s.device.set_selection(source.as_ref()),
                            Selection::Primary => s.device.set_primary_selection(source.as_ref()),
                        }
                        if let Some(old) = held.remove(&c.selection) {
                            s.state.serving.remove(&old.id());
                            old.destroy();
                        }
                        if let Some(src) = source {
                            held.insert(c.selection, src);
                        }
                    }
                }
                s.conn.flush().map_err(|e| s.fatal(e))?;
                delivered.mark(frame.meta.seq);
                continue;
            }
            Err(TryRecvError::Disconnected) => return Ok(report),
            Err(TryRecvError::Empty) => {}
        }
        for src in std::mem::take(&mut s.state.cancelled) {
            held.retain(|_, h| h.id() != src.id());
            src.destroy();
        }
        // Selections the device reports are this sink's own or other programs': not its
        // business (a source endpoint reads them).
        for (_, offer) in std::mem::take(&mut s.state.changed) {
            if let Some(o) = offer {
                s.state.offers.remove(&o.id());
                o.destroy();
            }
        }
        s.pump(POLL)?;
    }
}
