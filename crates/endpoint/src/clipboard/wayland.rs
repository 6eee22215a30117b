//! The `wayland-clipboard` source and sink: the clipboard (and the primary selection) of a
//! wlroots Wayland session (sway, Hyprland, river, labwc) through `ext-data-control-v1` where
//! the compositor offers it (sway 1.11, wlroots 0.19 and later), else `wlr-data-control`
//! (the same protocol under its older name: both run the same code here, [`Offer`],
//! [`Source`], [`Control`]), as the same [`Contents`] records as `x11-clipboard`, so an X11
//! side and a Wayland side share one clipboard.
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
use crate::display::WaylandProtocol;
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
use wayland_protocols::ext::data_control::v1::client::{
    ext_data_control_device_v1 as ext_device, ext_data_control_manager_v1 as ext_manager,
    ext_data_control_offer_v1 as ext_offer, ext_data_control_source_v1 as ext_source,
};
use wayland_protocols_wlr::data_control::v1::client::{
    zwlr_data_control_device_v1 as wlr_device, zwlr_data_control_manager_v1 as wlr_manager,
    zwlr_data_control_offer_v1 as wlr_offer, zwlr_data_control_source_v1 as wlr_source,
};

/// How long the endpoints wait for the compositor at a time.
const POLL: Duration = Duration::from_millis(20);

/// How long a source waits for a program to hand over one format.
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// An offer of a selection, in either protocol.
#[derive(Clone)]
enum Offer {
    Ext(ext_offer::ExtDataControlOfferV1),
    Wlr(wlr_offer::ZwlrDataControlOfferV1),
}

/// A data source this sink made, in either protocol.
#[derive(Clone)]
enum Source {
    Ext(ext_source::ExtDataControlSourceV1),
    Wlr(wlr_source::ZwlrDataControlSourceV1),
}

/// The manager and the seat's data device, in either protocol.
enum Control {
    Ext(
        ext_manager::ExtDataControlManagerV1,
        ext_device::ExtDataControlDeviceV1,
    ),
    Wlr(
        wlr_manager::ZwlrDataControlManagerV1,
        wlr_device::ZwlrDataControlDeviceV1,
    ),
}

impl Offer {
    fn id(&self) -> ObjectId {
        match self {
            Offer::Ext(o) => o.id(),
            Offer::Wlr(o) => o.id(),
        }
    }

    fn receive(&self, mime: String, fd: std::os::fd::BorrowedFd<'_>) {
        match self {
            Offer::Ext(o) => o.receive(mime, fd),
            Offer::Wlr(o) => o.receive(mime, fd),
        }
    }

    fn destroy(&self) {
        match self {
            Offer::Ext(o) => o.destroy(),
            Offer::Wlr(o) => o.destroy(),
        }
    }
}

impl Source {
    fn id(&self) -> ObjectId {
        match self {
            Source::Ext(o) => o.id(),
            Source::Wlr(o) => o.id(),
        }
    }

    fn offer(&self, mime: String) {
        match self {
            Source::Ext(o) => o.offer(mime),
            Source::Wlr(o) => o.offer(mime),
        }
    }

    fn destroy(&self) {
        match self {
            Source::Ext(o) => o.destroy(),
            Source::Wlr(o) => o.destroy(),
        }
    }
}

impl Control {
    /// Whether it has the primary selection (every ext version; wlr's from version 2).
    fn has_primary(&self) -> bool {
        match self {
            Control::Ext(..) => true,
            Control::Wlr(m, _) => m.version() >= 2,
        }
    }

    fn create_source(&self, qh: &QueueHandle<State>) -> Source {
        match self {
            Control::Ext(m, _) => Source::Ext(m.create_data_source(qh, ())),
            Control::Wlr(m, _) => Source::Wlr(m.create_data_source(qh, ())),
        }
    }

    /// Makes `source` (none: nothing) the selection `sel`.
    fn set(&self, sel: Selection, source: Option<&Source>) {
        match (self, sel) {
            (Control::Ext(_, d), Selection::Clipboard) => d.set_selection(ext_of(source)),
            (Control::Ext(_, d), Selection::Primary) => d.set_primary_selection(ext_of(source)),
            (Control::Wlr(_, d), Selection::Clipboard) => d.set_selection(wlr_of(source)),
            (Control::Wlr(_, d), Selection::Primary) => d.set_primary_selection(wlr_of(source)),
        }
    }
}

/// The ext source of `s` (a sink makes its sources with its own protocol's manager).
fn ext_of(s: Option<&Source>) -> Option<&ext_source::ExtDataControlSourceV1> {
    match s {
        Some(Source::Ext(s)) => Some(s),
        _ => None,
    }
}

/// The wlr source of `s`.
fn wlr_of(s: Option<&Source>) -> Option<&wlr_source::ZwlrDataControlSourceV1> {
    match s {
        Some(Source::Wlr(s)) => Some(s),
        _ => None,
    }
}

/// What the compositor told this endpoint.
#[derive(Default)]
struct State {
    /// Each live offer's MIME types.
    offers: HashMap<ObjectId, Vec<String>>,
    /// New selections not yet read: which, and its offer (`None`: cleared).
    changed: Vec<(Selection, Option<Offer>)>,
    /// Sink: the data of each of its data sources, by source.
    serving: HashMap<ObjectId, Vec<(String, Vec<u8>)>>,
    /// Sink: data sources the compositor cancelled (another program took the selection).
    cancelled: Vec<Source>,
    /// The device is gone (`finished`): the seat went away.
    finished: bool,
}

ignore_events!(
    State;
    wl_seat::WlSeat,
    wlr_manager::ZwlrDataControlManagerV1,
    ext_manager::ExtDataControlManagerV1,
);

impl State {
    /// A new offer (its MIME types come next).
    fn offered(&mut self, id: ObjectId) {
        self.offers.insert(id, Vec::new());
    }

    /// One MIME type of an offer.
    fn offer_type(&mut self, id: ObjectId, mime_type: String) {
        let types = self.offers.entry(id).or_default();
        if types.len() < 64 {
            types.push(mime_type);
        }
    }

    /// A program pastes from `source` in `mime_type`: written to `fd`.
    fn send(&mut self, source: ObjectId, mime_type: &str, fd: std::os::fd::OwnedFd) {
        let data = self.serving.get(&source).and_then(|formats| {
            let want = if TEXT_TYPES.contains(&mime_type) {
                TEXT
            } else {
                mime_type
            };
            formats
                .iter()
                .find(|(n, _)| n == want)
                .map(|(_, d)| d.clone())
        });
        if let Some(data) = data {
            // A slow reader must not hold up the session: the write has a thread of its
            // own, at most WRITERS at once, each given up after WRITE_WAIT (a program that
            // asks and never reads kept a thread and a copy for good: found by review).
            if WRITING.fetch_add(1, Ordering::AcqRel) < WRITERS {
                std::thread::spawn(move || {
                    let _ = write_within(fd, &data, WRITE_WAIT);
                    WRITING.fetch_sub(1, Ordering::AcqRel);
                });
            } else {
                WRITING.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!("{WRITERS} pastes are still being written: this one is refused");
            }
        }
    }

    /// Another program took the selection from `source`.
    fn cancel(&mut self, source: Source) {
        self.serving.remove(&source.id());
        self.cancelled.push(source);
    }
}

/// The `Dispatch` of one protocol's device, offer and source: the same events under two
/// names, handed to [`State`].
macro_rules! data_control_events {
    ($device:ident :: $Device:ident, $offer:ident :: $Offer:ident, $source:ident :: $Source:ident, $wrap_offer:path, $wrap_source:path) => {
        impl Dispatch<$device::$Device, ()> for State {
            fn event(
                s: &mut State,
                _: &$device::$Device,
                e: $device::Event,
                _: &(),
                _: &Connection,
                _: &QueueHandle<State>,
            ) {
                match e {
                    $device::Event::DataOffer { id } => s.offered(id.id()),
                    $device::Event::Selection { id } => {
                        s.changed.push((Selection::Clipboard, id.map($wrap_offer)))
                    }
                    $device::Event::PrimarySelection { id } => {
                        s.changed.push((Selection::Primary, id.map($wrap_offer)))
                    }
                    $device::Event::Finished => s.finished = true,
                    _ => {}
                }
            }

            wayland_client::event_created_child!(State, $device::$Device, [
                $device::EVT_DATA_OFFER_OPCODE => ($offer::$Offer, ()),
            ]);
        }

        impl Dispatch<$offer::$Offer, ()> for State {
            fn event(
                s: &mut State,
                offer: &$offer::$Offer,
                e: $offer::Event,
                _: &(),
                _: &Connection,
                _: &QueueHandle<State>,
            ) {
                if let $offer::Event::Offer { mime_type } = e {
                    s.offer_type(offer.id(), mime_type);
                }
            }
        }

        impl Dispatch<$source::$Source, ()> for State {
            fn event(
                s: &mut State,
                source: &$source::$Source,
                e: $source::Event,
                _: &(),
                _: &Connection,
                _: &QueueHandle<State>,
            ) {
                match e {
                    $source::Event::Send { mime_type, fd } => s.send(source.id(), &mime_type, fd),
                    $source::Event::Cancelled => s.cancel($wrap_source(source.clone())),
                    _ => {}
                }
            }
        }
    };
}

data_control_events!(
    ext_device::ExtDataControlDeviceV1,
    ext_offer::ExtDataControlOfferV1,
    ext_source::ExtDataControlSourceV1,
    Offer::Ext,
    Source::Ext
);
data_control_events!(
    wlr_device::ZwlrDataControlDeviceV1,
    wlr_offer::ZwlrDataControlOfferV1,
    wlr_source::ZwlrDataControlSourceV1,
    Offer::Wlr,
    Source::Wlr
);

static WRITING: AtomicUsize = AtomicUsize::new(0);

/// One endpoint's connection: the queue, the manager and the seat's device.
struct Session {
    endpoint: &'static str,
    display: String,
    conn: Connection,
    queue: EventQueue<State>,
    state: State,
    control: Control,
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
    // ext-data-control where offered (and wanted), else wlr-data-control.
    let ext = match c.protocol {
        WaylandProtocol::Wlr => None,
        WaylandProtocol::Auto | WaylandProtocol::Ext => {
            match globals.bind::<ext_manager::ExtDataControlManagerV1, _, _>(&qh, 1..=1, ()) {
                Ok(m) => Some(m),
                Err(e) if c.protocol == WaylandProtocol::Ext => {
                    return Err(unavailable(
                        endpoint,
                        d,
                        format!("no ext_data_control_manager_v1 ({e})"),
                        "protocol = \"ext\" needs a compositor offering ext-data-control-v1 (sway 1.11, wlroots 0.19 and later); leave protocol out (auto) to take wlr-data-control where it is not",
                    ))
                }
                Err(_) => None,
            }
        }
    };
    let control = match ext {
        Some(m) => {
            let device = m.get_data_device(&seat, &qh, ());
            Control::Ext(m, device)
        }
        None => {
            // Version 2 has the primary selection.
            let m: wlr_manager::ZwlrDataControlManagerV1 =
                globals.bind(&qh, 1..=2, ()).map_err(|e| {
                    unavailable(
                        endpoint,
                        d,
                        format!("no zwlr_data_control_manager_v1 ({e})"),
                        "the wayland-clipboard endpoints need a compositor with ext-data-control or wlr-data-control: a wlroots one (sway, Hyprland, river, labwc, wayfire) or KDE Plasma's KWin; on GNOME use gnome-clipboard",
                    )
                })?;
            let device = m.get_data_device(&seat, &qh, ());
            Control::Wlr(m, device)
        }
    };
    if !control.has_primary() && selections.contains(&Selection::Primary) {
        tracing::info!(
            endpoint,
            display = d,
            "the compositor's data-control has no primary selection (version 1): CLIPBOARD only"
        );
    }
    tracing::debug!(
        endpoint,
        display = d,
        protocol = match control {
            Control::Ext(..) => "ext-data-control-v1",
            Control::Wlr(..) => "wlr-data-control-unstable-v1",
        },
        "clipboard"
    );
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
        control,
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
        offer: &Offer,
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
    let mut held: HashMap<Selection, Source> = HashMap::new();
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
                    Ok(c) if c.selection == Selection::Primary && !s.control.has_primary() => {}
                    Ok(c) => {
                        let source = if c.formats.is_empty() {
                            None
                        } else {
                            let src = s.control.create_source(&s.queue.handle());
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
                        s.control.set(c.selection, source.as_ref());
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
