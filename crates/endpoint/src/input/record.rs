//! Input stream records, sans-IO: the versioned payloads that `evdev` / `x11-input` sources
//! and `uinput` / `xtest` sinks exchange, plus the pure pieces of those endpoints (parsing the
//! kernel's `struct input_event` bytes, cutting them into SYN-delimited batches, tracking held
//! keys, and mapping between X11 and Linux codes).
//!
//! Every payload starts with two bytes, **version** (`1`) and **kind** (docs/endpoints.md,
//! "Input records"):
//!
//! | kind | body | meaning |
//! |---|---|---|
//! | `0x00` events | count u16 BE, then per event type u16, code u16, value i32, dt_us u32 (12 bytes, BE) | one batch: the events between two `SYN_REPORT`s (the `SYN_REPORT` itself is implied by the frame's end) |
//! | `0x01` capabilities | name, ids, keys, relative axes, absolute axes with ranges | what the device can report; a source sends it first |
//! | `0x02` release-all | empty | the sink releases every key and button it holds |
//!
//! [`InputMessage::parse`] checks the version, kind, lengths and every code; nothing it is
//! given makes it panic. [`InputMessage::emit`] writes the same bytes back.

pub use crate::common::error::InputFrameError;
use std::collections::BTreeSet;
use std::fmt;

/// Version byte of every input record.
pub const VERSION: u8 = 1;
/// Kind byte: a batch of events.
pub const KIND_EVENTS: u8 = 0x00;
/// Kind byte: the device's capabilities.
pub const KIND_CAPABILITIES: u8 = 0x01;
/// Kind byte: release every held key and button.
pub const KIND_RELEASE_ALL: u8 = 0x02;
/// Kind: the viewer asks for the app's screen to be this size (`resize = "remote"`):
/// width and height, u16 each, big-endian.
pub const KIND_SCREEN_SIZE: u8 = 0x03;
/// Largest screen side a screen-size record may ask for (X's coordinate range).
pub const MAX_SCREEN: u16 = 32767;
/// Bytes of one event in an events record.
pub const EVENT_LEN: usize = 12;
/// Bytes of one absolute axis in a capabilities record.
pub const ABS_LEN: usize = 26;

/// Linux event type: synchronisation.
pub const EV_SYN: u16 = 0x00;
/// Linux event type: keys and buttons.
pub const EV_KEY: u16 = 0x01;
/// Linux event type: relative axes.
pub const EV_REL: u16 = 0x02;
/// Linux event type: absolute axes.
pub const EV_ABS: u16 = 0x03;
/// Linux event type: miscellaneous (scan codes).
pub const EV_MSC: u16 = 0x04;
/// Highest Linux event type.
pub const EV_MAX: u16 = 0x1f;
/// ndd's own event type, above Linux's: the keysym (`value`) that the key press right after
/// it in the batch (`code`, the same key) gives on the source's X display, with its layout,
/// Shift, AltGr and Caps Lock state. `x11-input` sources send it; the `xtest` sink types that
/// keysym with its own display's layout (`keymap.rs`); `uinput` ignores it.
pub const EV_KEYSYM: u16 = 0x20;
/// `SYN_REPORT`: end of a batch.
pub const SYN_REPORT: u16 = 0;
/// `SYN_DROPPED`: the kernel's buffer overran; events were lost.
pub const SYN_DROPPED: u16 = 3;
/// Highest key code (`KEY_MAX`).
pub const KEY_MAX: u16 = 0x2ff;
/// Highest relative axis (`REL_MAX`).
pub const REL_MAX: u16 = 0x0f;
/// Highest absolute axis (`ABS_MAX`).
pub const ABS_MAX: u16 = 0x3f;
/// `KEY_A`.
pub const KEY_A: u16 = 30;
/// `BTN_LEFT`.
pub const BTN_LEFT: u16 = 0x110;
/// `BTN_RIGHT`.
pub const BTN_RIGHT: u16 = 0x111;
/// `BTN_MIDDLE`.
pub const BTN_MIDDLE: u16 = 0x112;
/// `BTN_SIDE` (X button 8, "back").
pub const BTN_SIDE: u16 = 0x113;
/// `BTN_EXTRA` (X button 9, "forward").
pub const BTN_EXTRA: u16 = 0x114;
/// `REL_X`.
pub const REL_X: u16 = 0x00;
/// `REL_Y`.
pub const REL_Y: u16 = 0x01;
/// `REL_HWHEEL`.
pub const REL_HWHEEL: u16 = 0x06;
/// `REL_WHEEL`.
pub const REL_WHEEL: u16 = 0x08;
/// `ABS_X`.
pub const ABS_X: u16 = 0x00;
/// `ABS_Y`.
pub const ABS_Y: u16 = 0x01;

/// One input event of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    /// Linux event type (`EV_KEY`, `EV_REL`, `EV_ABS`, …).
    pub ty: u16,
    /// Code within the type (`KEY_A`, `REL_X`, …).
    pub code: u16,
    /// Value: 1 press / 0 release / 2 autorepeat for keys, a delta for `EV_REL`, a position
    /// for `EV_ABS`.
    pub value: i32,
    /// Microseconds since the batch's first event (saturating).
    pub dt_us: u32,
}

impl Event {
    /// An event at the batch start.
    pub fn new(ty: u16, code: u16, value: i32) -> Event {
        Event {
            ty,
            code,
            value,
            dt_us: 0,
        }
    }
}

/// Range of an absolute axis (the kernel's `input_absinfo`, with its code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AbsAxis {
    /// `ABS_X` …, at most [`ABS_MAX`].
    pub code: u16,
    /// Current value.
    pub value: i32,
    /// Minimum.
    pub min: i32,
    /// Maximum (≥ `min`).
    pub max: i32,
    /// Noise filter.
    pub fuzz: i32,
    /// Dead zone.
    pub flat: i32,
    /// Units per mm (per radian for rotations).
    pub resolution: i32,
}

/// What an input device can report: enough to create a matching uinput device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Capabilities {
    /// Device name, at most 255 bytes of UTF-8.
    pub name: String,
    /// `BUS_USB` …
    pub bustype: u16,
    /// Vendor id.
    pub vendor: u16,
    /// Product id.
    pub product: u16,
    /// Version.
    pub version: u16,
    /// Key and button codes, strictly ascending, each ≤ [`KEY_MAX`].
    pub keys: Vec<u16>,
    /// Relative axes, strictly ascending, each ≤ [`REL_MAX`].
    pub rel: Vec<u16>,
    /// Absolute axes, strictly ascending by code, each ≤ [`ABS_MAX`].
    pub abs: Vec<AbsAxis>,
}

impl Capabilities {
    /// The capability set assumed for a recording that carries none: keys `KEY_ESC`..=
    /// `KEY_MICMUTE` (1..=248), buttons `BTN_LEFT`..=`BTN_TASK` (0x110..=0x117), `REL_X`,
    /// `REL_Y`, `REL_HWHEEL`, `REL_WHEEL`: a keyboard and a wheel mouse.
    pub fn keyboard_and_mouse(name: &str) -> Capabilities {
        Capabilities {
            name: name.to_string(),
            keys: (1..=248).chain(0x110..=0x117).collect(),
            rel: vec![REL_X, REL_Y, REL_HWHEEL, REL_WHEEL],
            ..Default::default()
        }
    }

    /// The range of absolute axis `code`, if the device has it.
    pub fn abs_axis(&self, code: u16) -> Option<&AbsAxis> {
        self.abs.iter().find(|a| a.code == code)
    }

    fn body_len(&self) -> usize {
        1 + self.name.len().min(255)
            + 8
            + 2
            + 2 * self.keys.len()
            + 2
            + 2 * self.rel.len()
            + 2
            + ABS_LEN * self.abs.len()
    }
}

/// One decoded input-stream payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum InputMessage {
    /// A SYN-delimited batch of events (may be empty: a lone `SYN_REPORT`).
    Events(Vec<Event>),
    /// The device's capabilities.
    Capabilities(Capabilities),
    /// Release every held key and button (the link dropped, or the source stopped).
    ReleaseAll,
    /// The viewer's window was resized to this (`x11-window` with `resize = "remote"`): the
    /// app's screen is to take its size (RandR), as RDP and xpra resize a remote desktop.
    ScreenSize {
        /// Pixels, 1..=32767.
        width: u16,
        /// Pixels, 1..=32767.
        height: u16,
    },
}

/// A checked reader over a body.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    kind: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], InputFrameError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(InputFrameError::Length {
                kind: self.kind,
                want: self.pos.saturating_add(n),
                got: self.buf.len(),
            });
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, InputFrameError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, InputFrameError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, InputFrameError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i32(&mut self) -> Result<i32, InputFrameError> {
        Ok(self.u32()? as i32)
    }
    fn finish(&self) -> Result<(), InputFrameError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(InputFrameError::Length {
                kind: self.kind,
                want: self.pos,
                got: self.buf.len(),
            })
        }
    }
}

/// Whether `(ty, code)` may appear inside a batch: a Linux type other than `SYN_REPORT` /
/// `SYN_DROPPED` (batch boundaries are frame boundaries), or [`EV_KEYSYM`], and a code ≤
/// [`KEY_MAX`].
pub fn valid_event(ty: u16, code: u16) -> bool {
    (ty <= EV_MAX || ty == EV_KEYSYM)
        && code <= KEY_MAX
        && !(ty == EV_SYN && (code == SYN_REPORT || code == SYN_DROPPED))
}

fn ascending(
    codes: impl Iterator<Item = u16>,
    max: u16,
    what: &'static str,
) -> Result<(), InputFrameError> {
    let mut prev: Option<u16> = None;
    for code in codes {
        if code > max || prev.is_some_and(|p| p >= code) {
            return Err(InputFrameError::Code { what, code });
        }
        prev = Some(code);
    }
    Ok(())
}

fn count(n: usize, what: &'static str) -> Result<u16, InputFrameError> {
    u16::try_from(n).map_err(|_| InputFrameError::TooMany(what))
}

impl Capabilities {
    /// A viewer window's keyboard and mouse (`x11-input`'s viewer, `wayland-window-input`):
    /// keys 1–247, five buttons, both wheels, and absolute `ABS_X`/`ABS_Y` over a `width` ×
    /// `height` screen.
    pub fn viewer(name: String, width: u16, height: u16) -> Capabilities {
        let axis = |code, size: u16| AbsAxis {
            code,
            max: i32::from(size.max(1)) - 1,
            ..Default::default()
        };
        Capabilities {
            name,
            keys: (1..=247)
                .chain([
                    BTN_LEFT,
                    BTN_LEFT + 1,
                    BTN_LEFT + 2,
                    BTN_LEFT + 3,
                    BTN_EXTRA,
                ])
                .collect(),
            rel: vec![REL_HWHEEL, REL_WHEEL],
            abs: vec![axis(ABS_X, width), axis(ABS_Y, height)],
            ..Default::default()
        }
    }

    /// Checks codes, order and ranges (what [`InputMessage::parse`] checks).
    pub fn check(&self) -> Result<(), InputFrameError> {
        ascending(self.keys.iter().copied(), KEY_MAX, "key")?;
        ascending(self.rel.iter().copied(), REL_MAX, "rel")?;
        ascending(self.abs.iter().map(|a| a.code), ABS_MAX, "abs")?;
        for a in &self.abs {
            if a.min > a.max {
                return Err(InputFrameError::AbsRange {
                    code: a.code,
                    min: a.min,
                    max: a.max,
                });
            }
        }
        count(self.keys.len(), "keys")?;
        Ok(())
    }
}

impl InputMessage {
    /// Parses a payload: version, kind, body.
    pub fn parse(payload: &[u8]) -> Result<InputMessage, InputFrameError> {
        let [version, kind, body @ ..] = payload else {
            return Err(InputFrameError::Short(payload.len()));
        };
        if *version != VERSION {
            return Err(InputFrameError::Version(*version));
        }
        match *kind {
            KIND_EVENTS => {
                let mut r = Reader {
                    buf: body,
                    pos: 0,
                    kind: "events",
                };
                let n = usize::from(r.u16()?);
                if body.len() != 2 + n * EVENT_LEN {
                    return Err(InputFrameError::Length {
                        kind: "events",
                        want: 2 + n * EVENT_LEN,
                        got: body.len(),
                    });
                }
                let mut events = Vec::with_capacity(n);
                for index in 0..n {
                    let (ty, code) = (r.u16()?, r.u16()?);
                    if !valid_event(ty, code) {
                        return Err(InputFrameError::Event { index, ty, code });
                    }
                    let value = r.i32()?;
                    let dt_us = r.u32()?;
                    events.push(Event {
                        ty,
                        code,
                        value,
                        dt_us,
                    });
                }
                Ok(InputMessage::Events(events))
            }
            KIND_CAPABILITIES => {
                let mut r = Reader {
                    buf: body,
                    pos: 0,
                    kind: "capabilities",
                };
                let name_len = usize::from(r.u8()?);
                let name = std::str::from_utf8(r.take(name_len)?)
                    .map_err(|_| InputFrameError::Name)?
                    .to_string();
                let (bustype, vendor, product, version) = (r.u16()?, r.u16()?, r.u16()?, r.u16()?);
                let nkeys = usize::from(r.u16()?);
                let mut keys = Vec::with_capacity(nkeys.min(body.len() / 2));
                for _ in 0..nkeys {
                    keys.push(r.u16()?);
                }
                let nrel = usize::from(r.u16()?);
                let mut rel = Vec::with_capacity(nrel.min(body.len() / 2));
                for _ in 0..nrel {
                    rel.push(r.u16()?);
                }
                let nabs = usize::from(r.u16()?);
                let mut abs = Vec::with_capacity(nabs.min(body.len() / ABS_LEN));
                for _ in 0..nabs {
                    abs.push(AbsAxis {
                        code: r.u16()?,
                        value: r.i32()?,
                        min: r.i32()?,
                        max: r.i32()?,
                        fuzz: r.i32()?,
                        flat: r.i32()?,
                        resolution: r.i32()?,
                    });
                }
                r.finish()?;
                let caps = Capabilities {
                    name,
                    bustype,
                    vendor,
                    product,
                    version,
                    keys,
                    rel,
                    abs,
                };
                caps.check()?;
                Ok(InputMessage::Capabilities(caps))
            }
            KIND_RELEASE_ALL => {
                if body.is_empty() {
                    Ok(InputMessage::ReleaseAll)
                } else {
                    Err(InputFrameError::Length {
                        kind: "release-all",
                        want: 0,
                        got: body.len(),
                    })
                }
            }
            KIND_SCREEN_SIZE => {
                let mut r = Reader {
                    buf: body,
                    pos: 0,
                    kind: "screen-size",
                };
                let (width, height) = (r.u16()?, r.u16()?);
                r.finish()?;
                if !(1..=MAX_SCREEN).contains(&width) || !(1..=MAX_SCREEN).contains(&height) {
                    return Err(InputFrameError::ScreenSize { width, height });
                }
                Ok(InputMessage::ScreenSize { width, height })
            }
            other => Err(InputFrameError::UnknownKind(other)),
        }
    }

    /// The payload bytes. Fails only for more than 65535 events or codes of one kind, or
    /// capabilities that [`Capabilities::check`] refuses. A name longer than 255 bytes is cut
    /// at a character boundary.
    pub fn emit(&self) -> Result<Vec<u8>, InputFrameError> {
        let mut out = vec![VERSION];
        match self {
            InputMessage::Events(events) => {
                out.reserve(3 + EVENT_LEN * events.len());
                out.push(KIND_EVENTS);
                out.extend_from_slice(&count(events.len(), "events")?.to_be_bytes());
                for (index, e) in events.iter().enumerate() {
                    if !valid_event(e.ty, e.code) {
                        return Err(InputFrameError::Event {
                            index,
                            ty: e.ty,
                            code: e.code,
                        });
                    }
                    out.extend_from_slice(&e.ty.to_be_bytes());
                    out.extend_from_slice(&e.code.to_be_bytes());
                    out.extend_from_slice(&e.value.to_be_bytes());
                    out.extend_from_slice(&e.dt_us.to_be_bytes());
                }
            }
            InputMessage::Capabilities(c) => {
                c.check()?;
                out.reserve(1 + c.body_len());
                out.push(KIND_CAPABILITIES);
                let mut end = c.name.len().min(255);
                while !c.name.is_char_boundary(end) {
                    end -= 1;
                }
                out.push(end as u8);
                out.extend_from_slice(&c.name.as_bytes()[..end]);
                for v in [c.bustype, c.vendor, c.product, c.version] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                for list in [&c.keys, &c.rel] {
                    out.extend_from_slice(&count(list.len(), "codes")?.to_be_bytes());
                    for k in list {
                        out.extend_from_slice(&k.to_be_bytes());
                    }
                }
                out.extend_from_slice(&count(c.abs.len(), "abs axes")?.to_be_bytes());
                for a in &c.abs {
                    out.extend_from_slice(&a.code.to_be_bytes());
                    for v in [a.value, a.min, a.max, a.fuzz, a.flat, a.resolution] {
                        out.extend_from_slice(&v.to_be_bytes());
                    }
                }
            }
            InputMessage::ReleaseAll => out.push(KIND_RELEASE_ALL),
            InputMessage::ScreenSize { width, height } => {
                if !(1..=MAX_SCREEN).contains(width) || !(1..=MAX_SCREEN).contains(height) {
                    return Err(InputFrameError::ScreenSize {
                        width: *width,
                        height: *height,
                    });
                }
                out.push(KIND_SCREEN_SIZE);
                out.extend_from_slice(&width.to_be_bytes());
                out.extend_from_slice(&height.to_be_bytes());
            }
        }
        Ok(out)
    }

    /// The release-all payload, `01 02`: what a session injects into an input stream's sink
    /// when the link drops.
    pub fn release_all_payload() -> [u8; 2] {
        [VERSION, KIND_RELEASE_ALL]
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "type {:#x} code {:#x} value {} +{}us",
            self.ty, self.code, self.value, self.dt_us
        )
    }
}

// ---------------------------------------------------------------------------------------
// Held keys

/// Keys and buttons currently held down, from the events a sink has applied; what to
/// release when the stream ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    keys: BTreeSet<u16>,
}

impl Held {
    /// Notes an applied event (`EV_KEY`: value 0 releases, any other value holds).
    pub fn observe(&mut self, e: &Event) {
        if e.ty == EV_KEY {
            if e.value == 0 {
                self.keys.remove(&e.code);
            } else {
                self.keys.insert(e.code);
            }
        }
    }

    /// Whether `code` is held.
    pub fn holds(&self, code: u16) -> bool {
        self.keys.contains(&code)
    }

    /// The held key and button codes, ascending.
    pub fn held(&self) -> impl Iterator<Item = u16> + '_ {
        self.keys.iter().copied()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Release events for everything held (ascending codes), and forgets them.
    pub fn release_all(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.keys)
            .into_iter()
            .map(|code| Event::new(EV_KEY, code, 0))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// Kernel `struct input_event` bytes (evdev device nodes and recordings of them)

/// Bytes of one `struct input_event` on 64-bit Linux: `tv_sec` i64, `tv_usec` i64, type u16,
/// code u16, value i32, native byte order.
pub const RAW_EVENT_LEN: usize = 24;

/// One kernel input event, as read from `/dev/input/eventN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    /// Event time, µs since the Unix epoch (or since boot, with a monotonic clock).
    pub time_us: i64,
    /// Type.
    pub ty: u16,
    /// Code.
    pub code: u16,
    /// Value.
    pub value: i32,
}

impl RawEvent {
    /// Parses one 24-byte record.
    pub fn parse(b: &[u8; RAW_EVENT_LEN]) -> RawEvent {
        let i64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            i64::from_ne_bytes(a)
        };
        RawEvent {
            time_us: i64_at(0)
                .saturating_mul(1_000_000)
                .saturating_add(i64_at(8)),
            ty: u16::from_ne_bytes([b[16], b[17]]),
            code: u16::from_ne_bytes([b[18], b[19]]),
            value: i32::from_ne_bytes([b[20], b[21], b[22], b[23]]),
        }
    }

    /// The 24-byte record (native byte order), for recordings and tests.
    pub fn emit(&self) -> [u8; RAW_EVENT_LEN] {
        let mut b = [0u8; RAW_EVENT_LEN];
        b[0..8].copy_from_slice(&self.time_us.div_euclid(1_000_000).to_ne_bytes());
        b[8..16].copy_from_slice(&self.time_us.rem_euclid(1_000_000).to_ne_bytes());
        b[16..18].copy_from_slice(&self.ty.to_ne_bytes());
        b[18..20].copy_from_slice(&self.code.to_ne_bytes());
        b[20..24].copy_from_slice(&self.value.to_ne_bytes());
        b
    }
}

/// Cuts kernel events into batches at each `SYN_REPORT`. After a `SYN_DROPPED` (the kernel
/// lost events) the partial batch and everything up to the next `SYN_REPORT` are discarded,
/// as the kernel documentation asks; [`Batcher::dropped`] counts those resyncs. Events that
/// cannot travel ([`valid_event`] false) are skipped and counted in [`Batcher::skipped`].
#[derive(Debug, Clone, Default)]
pub struct Batcher {
    batch: Vec<Event>,
    start_us: Option<i64>,
    in_drop: bool,
    /// `SYN_DROPPED` seen.
    pub dropped: u64,
    /// Events skipped.
    pub skipped: u64,
    /// Autorepeat presses (`EV_KEY` value 2) left out: the app side's X server or kernel
    /// repeats held keys by itself, and repeats replayed after a stall would type stale
    /// characters.
    pub repeats: u64,
    /// The batch being built lost a repeat (a batch of repeats only is not sent at all).
    repeat_in_batch: bool,
}

/// Most events in one batch; a longer run without `SYN_REPORT` is cut there.
pub const MAX_BATCH: usize = 4096;

impl Batcher {
    /// A new, empty batcher.
    pub fn new() -> Batcher {
        Batcher::default()
    }

    /// Feeds one kernel event; returns a finished batch at `SYN_REPORT` (or when the batch
    /// reaches [`MAX_BATCH`] events).
    pub fn push(&mut self, e: RawEvent) -> Option<Vec<Event>> {
        if e.ty == EV_SYN && e.code == SYN_DROPPED {
            self.dropped += 1;
            self.in_drop = true;
            self.batch.clear();
            self.start_us = None;
            return None;
        }
        if e.ty == EV_SYN && e.code == SYN_REPORT {
            let was_dropping = std::mem::replace(&mut self.in_drop, false);
            let only_repeats = std::mem::take(&mut self.repeat_in_batch) && self.batch.is_empty();
            self.start_us = None;
            let batch = std::mem::take(&mut self.batch);
            return (!was_dropping && !only_repeats).then_some(batch);
        }
        if self.in_drop {
            return None;
        }
        if !valid_event(e.ty, e.code) {
            self.skipped += 1;
            return None;
        }
        if e.ty == EV_KEY && e.value == 2 {
            self.repeats += 1;
            self.repeat_in_batch = true;
            return None;
        }
        let start = *self.start_us.get_or_insert(e.time_us);
        let dt = e
            .time_us
            .saturating_sub(start)
            .clamp(0, i64::from(u32::MAX));
        self.batch.push(Event {
            ty: e.ty,
            code: e.code,
            value: e.value,
            dt_us: dt as u32,
        });
        if self.batch.len() >= MAX_BATCH {
            self.start_us = None;
            return Some(std::mem::take(&mut self.batch));
        }
        None
    }
}

/// Reassembles 24-byte kernel records from arbitrary read chunks.
#[derive(Debug, Clone, Default)]
pub struct RawDecoder {
    partial: Vec<u8>,
}

impl RawDecoder {
    /// A new decoder.
    pub fn new() -> RawDecoder {
        RawDecoder::default()
    }

    /// Feeds bytes; calls `each` for every complete record.
    pub fn push(&mut self, mut bytes: &[u8], mut each: impl FnMut(RawEvent)) {
        if !self.partial.is_empty() {
            let need = RAW_EVENT_LEN - self.partial.len();
            let n = need.min(bytes.len());
            self.partial.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if let Ok(rec) = <&[u8; RAW_EVENT_LEN]>::try_from(self.partial.as_slice()) {
                each(RawEvent::parse(rec));
                self.partial.clear();
            }
        }
        let mut chunks = bytes.chunks_exact(RAW_EVENT_LEN);
        for c in &mut chunks {
            if let Ok(rec) = <&[u8; RAW_EVENT_LEN]>::try_from(c) {
                each(RawEvent::parse(rec));
            }
        }
        self.partial.extend_from_slice(chunks.remainder());
    }

    /// Bytes of an incomplete record held back (non-zero at end of input = truncated).
    pub fn pending(&self) -> usize {
        self.partial.len()
    }
}

// ---------------------------------------------------------------------------------------
// X11 <-> Linux codes

/// Offset between X keycodes and Linux key codes (X keycode = Linux code + 8, for the evdev
/// keymap every current X server uses).
pub const X_KEYCODE_OFFSET: u16 = 8;

/// The Linux key code of X keycode `keycode` (9..=255 → 1..=247).
pub fn x_keycode_to_linux(keycode: u8) -> Option<u16> {
    u16::from(keycode)
        .checked_sub(X_KEYCODE_OFFSET)
        .filter(|&c| c > 0)
}

/// The X keycode of Linux key `code`, if it fits X's 8-bit keycodes (1..=247).
pub fn linux_to_x_keycode(code: u16) -> Option<u8> {
    u8::try_from(code.checked_add(X_KEYCODE_OFFSET)?)
        .ok()
        .filter(|_| code > 0)
}

/// The Linux button of X pointer button `button` (1 left, 2 middle, 3 right, 8 side,
/// 9 extra); buttons 4–7 are wheels ([`x_wheel`]).
pub fn x_button_to_linux(button: u8) -> Option<u16> {
    Some(match button {
        1 => BTN_LEFT,
        2 => BTN_MIDDLE,
        3 => BTN_RIGHT,
        8 => BTN_SIDE,
        9 => BTN_EXTRA,
        _ => return None,
    })
}

/// The X button of Linux button `code` (inverse of [`x_button_to_linux`]).
pub fn linux_to_x_button(code: u16) -> Option<u8> {
    Some(match code {
        BTN_LEFT => 1,
        BTN_MIDDLE => 2,
        BTN_RIGHT => 3,
        BTN_SIDE => 8,
        BTN_EXTRA => 9,
        _ => return None,
    })
}

/// The wheel event of X button `button` pressed: 4 up (`REL_WHEEL` +1), 5 down (−1),
/// 6 left (`REL_HWHEEL` −1), 7 right (+1).
pub fn x_wheel(button: u8) -> Option<Event> {
    Some(match button {
        4 => Event::new(EV_REL, REL_WHEEL, 1),
        5 => Event::new(EV_REL, REL_WHEEL, -1),
        6 => Event::new(EV_REL, REL_HWHEEL, -1),
        7 => Event::new(EV_REL, REL_HWHEEL, 1),
        _ => return None,
    })
}

/// Scales `v` in `[min, max]` to `[0, size - 1]` (clamped); identity when the ranges agree.
pub fn scale_abs(v: i32, min: i32, max: i32, size: u16) -> i16 {
    let top = i64::from(size.max(1)) - 1;
    let span = i64::from(max) - i64::from(min);
    let scaled = if span <= 0 {
        0
    } else {
        let off = (i64::from(v) - i64::from(min)).clamp(0, span);
        (off * top + span / 2) / span
    };
    scaled.clamp(0, top.min(i64::from(i16::MAX))) as i16
}

/// One XTEST request a sink makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAction {
    /// `FakeInput` KeyPress / KeyRelease.
    Key {
        /// X keycode.
        keycode: u8,
        /// Press or release.
        press: bool,
    },
    /// A key press that should type `keysym` (an [`EV_KEYSYM`] annotation): the sink finds
    /// the key and Shift/AltGr state that give it on its display, and remembers which key it
    /// pressed for `code`'s release.
    Sym {
        /// The source's key (Linux code).
        code: u16,
        /// What the source's layout gave.
        keysym: u32,
        /// The source's X keycode, tried first.
        hint: Option<u8>,
    },
    /// `FakeInput` ButtonPress / ButtonRelease.
    Button {
        /// X button.
        button: u8,
        /// Press or release.
        press: bool,
    },
    /// `FakeInput` MotionNotify, absolute, in screen pixels.
    MoveTo {
        /// x.
        x: i16,
        /// y.
        y: i16,
    },
    /// `FakeInput` MotionNotify, relative.
    MoveBy {
        /// dx.
        dx: i16,
        /// dy.
        dy: i16,
    },
}

/// Turns event batches into XTEST requests for a screen of `width` × `height`: keys become
/// keycode + 8, buttons X buttons, wheel clicks press-and-release of buttons 4–7, `ABS_X` /
/// `ABS_Y` an absolute move scaled from the capabilities' range to the screen, `REL_X` /
/// `REL_Y` a relative move. Motion within a batch is merged into one move, placed where the
/// batch's first motion event was, so it is never reordered across a key or button.
#[derive(Debug, Clone)]
pub struct XMapper {
    width: u16,
    height: u16,
    abs_x: (i32, i32),
    abs_y: (i32, i32),
    pos: (i32, i32),
    /// Events no XTEST request can express (unknown keys above 247, other types).
    pub unmapped: u64,
}

impl XMapper {
    /// The screen changed size (RandR): absolute positions scale to the new one.
    pub fn set_screen(&mut self, width: u16, height: u16) {
        self.width = width;
        self.height = height;
    }

    /// A mapper for a screen of `width` × `height`; absolute axes default to the screen's
    /// own range until capabilities say otherwise.
    pub fn new(width: u16, height: u16) -> XMapper {
        XMapper {
            width,
            height,
            abs_x: (0, i32::from(width.max(1)) - 1),
            abs_y: (0, i32::from(height.max(1)) - 1),
            pos: (0, 0),
            unmapped: 0,
        }
    }

    /// Takes the absolute ranges of `ABS_X` / `ABS_Y` from `caps`.
    pub fn set_capabilities(&mut self, caps: &Capabilities) {
        if let Some(a) = caps.abs_axis(ABS_X) {
            self.abs_x = (a.min, a.max);
            self.pos.0 = a.value;
        }
        if let Some(a) = caps.abs_axis(ABS_Y) {
            self.abs_y = (a.min, a.max);
            self.pos.1 = a.value;
        }
    }

    /// The XTEST requests for one batch, in order.
    pub fn map(&mut self, events: &[Event], out: &mut Vec<XAction>) {
        let mut motion_at: Option<usize> = None;
        let (mut abs_moved, mut rel) = (false, (0i32, 0i32));
        let mut keysym: Option<(u16, u32)> = None;
        for e in events {
            match (e.ty, e.code) {
                (EV_KEYSYM, code) => keysym = Some((code, e.value as u32)),
                (EV_KEY, code) => {
                    let press = e.value != 0;
                    if e.value == 2 {
                        // Autorepeat: the target X server repeats by itself.
                        continue;
                    }
                    let sym = keysym.take().filter(|&(c, k)| c == code && k != 0);
                    if let Some(button) = linux_to_x_button(code) {
                        out.push(XAction::Button { button, press });
                    } else if let (Some((_, keysym)), true) = (sym, press) {
                        out.push(XAction::Sym {
                            code,
                            keysym,
                            hint: linux_to_x_keycode(code),
                        });
                    } else if let Some(keycode) = linux_to_x_keycode(code) {
                        out.push(XAction::Key { keycode, press });
                    } else {
                        self.unmapped += 1;
                    }
                }
                (EV_REL, REL_WHEEL | REL_HWHEEL) => {
                    let (pos, neg) = if e.code == REL_WHEEL { (4, 5) } else { (7, 6) };
                    let button = if e.value > 0 { pos } else { neg };
                    for _ in 0..e.value.unsigned_abs().min(64) {
                        out.push(XAction::Button {
                            button,
                            press: true,
                        });
                        out.push(XAction::Button {
                            button,
                            press: false,
                        });
                    }
                }
                (EV_REL, REL_X | REL_Y) => {
                    motion_at.get_or_insert(out.len());
                    if e.code == REL_X {
                        rel.0 = rel.0.saturating_add(e.value);
                    } else {
                        rel.1 = rel.1.saturating_add(e.value);
                    }
                }
                (EV_ABS, ABS_X | ABS_Y) => {
                    motion_at.get_or_insert(out.len());
                    abs_moved = true;
                    if e.code == ABS_X {
                        self.pos.0 = e.value;
                    } else {
                        self.pos.1 = e.value;
                    }
                }
                (EV_MSC, _) => {}
                _ => self.unmapped += 1,
            }
        }
        if let Some(at) = motion_at {
            let action = if abs_moved {
                XAction::MoveTo {
                    x: scale_abs(self.pos.0, self.abs_x.0, self.abs_x.1, self.width),
                    y: scale_abs(self.pos.1, self.abs_y.0, self.abs_y.1, self.height),
                }
            } else {
                let c = |v: i32| v.clamp(i32::from(i16::MIN), i32::from(i16::MAX)) as i16;
                XAction::MoveBy {
                    dx: c(rel.0),
                    dy: c(rel.1),
                }
            };
            out.insert(at, action);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn a_screen_size_record_round_trips_and_bad_ones_are_named() {
        // 1280x720: the docs' vector.
        let p = hex("01 03 0500 02d0");
        let m = InputMessage::ScreenSize {
            width: 1280,
            height: 720,
        };
        assert_eq!(InputMessage::parse(&p), Ok(m.clone()));
        assert_eq!(m.emit().unwrap(), p);
        assert_eq!(
            InputMessage::parse(&hex("01 03 0000 02d0")),
            Err(InputFrameError::ScreenSize {
                width: 0,
                height: 720
            })
        );
        assert_eq!(
            InputMessage::parse(&hex("01 03 8000 02d0"))
                .unwrap_err()
                .to_string(),
            "input record: screen size 32768x720 out of range (1..=32767 each)"
        );
        assert!(matches!(
            InputMessage::parse(&hex("01 03 0500")),
            Err(InputFrameError::Length { .. })
        ));
        assert!(matches!(
            InputMessage::parse(&hex("01 03 0500 02d0 00")),
            Err(InputFrameError::Length { .. })
        ));
        assert!(InputMessage::ScreenSize {
            width: 40000,
            height: 1
        }
        .emit()
        .is_err());
    }

    #[test]
    fn parse_emit_events() {
        // KEY_A press, REL_X -3 at +1000 us.
        let p = hex("01 00 0002 0001 001e 00000001 00000000 0002 0000 fffffffd 000003e8");
        let m = InputMessage::Events(vec![
            Event::new(EV_KEY, KEY_A, 1),
            Event {
                ty: EV_REL,
                code: REL_X,
                value: -3,
                dt_us: 1000,
            },
        ]);
        assert_eq!(InputMessage::parse(&p), Ok(m.clone()));
        assert_eq!(m.emit().unwrap(), p);
        // An empty batch (a lone SYN_REPORT).
        assert_eq!(
            InputMessage::parse(&hex("01 00 0000")),
            Ok(InputMessage::Events(vec![]))
        );
        // The docs' keysym vector: KEY_A's key giving @, then its press.
        let p = hex("01 00 0002 0020 001e 00000040 00000000 0001 001e 00000001 00000000");
        let m = InputMessage::Events(vec![
            Event::new(EV_KEYSYM, KEY_A, 0x40),
            Event::new(EV_KEY, KEY_A, 1),
        ]);
        assert_eq!(InputMessage::parse(&p), Ok(m.clone()));
        assert_eq!(m.emit().unwrap(), p);
        // The xtest mapping types the keysym; the release goes by keycode.
        let mut x = XMapper::new(640, 480);
        let mut out = Vec::new();
        let InputMessage::Events(ev) = m else {
            unreachable!()
        };
        x.map(&ev, &mut out);
        x.map(&[Event::new(EV_KEY, KEY_A, 0)], &mut out);
        assert_eq!(
            out,
            vec![
                XAction::Sym {
                    code: KEY_A,
                    keysym: 0x40,
                    hint: Some(38)
                },
                XAction::Key {
                    keycode: 38,
                    press: false
                }
            ]
        );
        assert_eq!(x.unmapped, 0);
    }

    #[test]
    fn parse_emit_capabilities() {
        let p = hex(
            "01 01 02 6b62 0003 046d c52b 0111 0002 001e 0110 0001 0008 0001 \
             0000 00000000 00000000 0000027f 00000000 00000000 00000000",
        );
        let caps = Capabilities {
            name: "kb".into(),
            bustype: 3,
            vendor: 0x046d,
            product: 0xc52b,
            version: 0x0111,
            keys: vec![KEY_A, BTN_LEFT],
            rel: vec![REL_WHEEL],
            abs: vec![AbsAxis {
                code: ABS_X,
                max: 639,
                ..Default::default()
            }],
        };
        assert_eq!(
            InputMessage::parse(&p),
            Ok(InputMessage::Capabilities(caps.clone()))
        );
        assert_eq!(InputMessage::Capabilities(caps).emit().unwrap(), p);
    }

    #[test]
    fn parse_emit_release_all() {
        assert_eq!(
            InputMessage::parse(&hex("01 02")),
            Ok(InputMessage::ReleaseAll)
        );
        assert_eq!(InputMessage::ReleaseAll.emit().unwrap(), hex("01 02"));
        assert_eq!(InputMessage::release_all_payload(), [1, 2]);
    }

    #[test]
    fn malformed_records_are_errors() {
        let cases: &[(&str, &str)] = &[
            ("", "input record: 0 bytes, shorter than the 2-byte header"),
            ("01", "input record: 1 bytes, shorter than the 2-byte header"),
            ("02 00 0000", "input record: unsupported version 2 (this build speaks version 1)"),
            ("01 07", "input record: unknown kind 0x07 (expected 0x00 events, 0x01 capabilities, 0x02 release-all, 0x03 screen size)"),
            ("01 00 00", "input record: events body must be 2 bytes, got 1"),
            ("01 00 0001 0001 001e 00000001", "input record: events body must be 14 bytes, got 10"),
            ("01 00 0000 00", "input record: events body must be 2 bytes, got 3"),
            ("01 00 0001 0021 0000 00000000 00000000", "input record: event 0: invalid type 0x21 / code 0x0"),
            ("01 00 0001 0020 0300 00000061 00000000", "input record: event 0: invalid type 0x20 / code 0x300"),
            ("01 00 0001 0001 0300 00000000 00000000", "input record: event 0: invalid type 0x1 / code 0x300"),
            ("01 00 0001 0000 0000 00000000 00000000", "input record: event 0: invalid type 0x0 / code 0x0"),
            ("01 02 00", "input record: release-all body must be 0 bytes, got 1"),
            ("01 01 05 6b62", "input record: capabilities body must be 6 bytes, got 3"),
            ("01 01 01 ff 0000 0000 0000 0000 0000 0000 0000", "input record: capabilities: device name is not UTF-8"),
            ("01 01 00 0000 0000 0000 0000 0002 0002 0001 0000 0000", "input record: capabilities: key code 0x1 out of range or not ascending"),
            ("01 01 00 0000 0000 0000 0000 0000 0001 0010 0000", "input record: capabilities: rel code 0x10 out of range or not ascending"),
            ("01 01 00 0000 0000 0000 0000 0000 0000 0001 0000 00000000 00000005 00000001 00000000 00000000 00000000",
             "input record: capabilities: abs axis 0x0 has min 5 > max 1"),
            ("01 01 00 0000 0000 0000 0000 0000 0000 0000 00", "input record: capabilities body must be 15 bytes, got 16"),
        ];
        for (input, want) in cases {
            let e = InputMessage::parse(&hex(input)).unwrap_err();
            assert_eq!(e.to_string(), *want, "{input}");
        }
    }

    #[test]
    fn held_keys_are_released() {
        let mut h = Held::default();
        for e in [
            Event::new(EV_KEY, KEY_A, 1),
            Event::new(EV_KEY, BTN_LEFT, 1),
            Event::new(EV_KEY, 42, 1),
            Event::new(EV_KEY, 42, 0),
            Event::new(EV_REL, REL_X, 5),
            Event::new(EV_KEY, KEY_A, 2),
        ] {
            h.observe(&e);
        }
        assert_eq!(h.held().collect::<Vec<_>>(), vec![KEY_A, BTN_LEFT]);
        assert_eq!(
            h.release_all(),
            vec![
                Event::new(EV_KEY, KEY_A, 0),
                Event::new(EV_KEY, BTN_LEFT, 0)
            ]
        );
        assert!(h.is_empty());
        assert!(h.release_all().is_empty());
    }

    fn raw(t: i64, ty: u16, code: u16, value: i32) -> RawEvent {
        RawEvent {
            time_us: t,
            ty,
            code,
            value,
        }
    }

    #[test]
    fn autorepeat_is_never_forwarded() {
        let mut b = Batcher::new();
        let t = 1_700_000_000_000_000;
        let mut batches = Vec::new();
        for e in [
            raw(t, EV_KEY, KEY_A, 1),
            raw(t, EV_SYN, SYN_REPORT, 0),
            raw(t + 500_000, EV_KEY, KEY_A, 2), // the kernel's repeats: a batch of its own
            raw(t + 500_000, EV_SYN, SYN_REPORT, 0),
            raw(t + 533_000, EV_KEY, KEY_A, 2),
            raw(t + 533_000, EV_REL, REL_X, 3), // a repeat next to motion: the motion goes
            raw(t + 533_000, EV_SYN, SYN_REPORT, 0),
            raw(t + 600_000, EV_KEY, KEY_A, 0),
            raw(t + 600_000, EV_SYN, SYN_REPORT, 0),
        ] {
            batches.extend(b.push(e));
        }
        assert_eq!(
            batches,
            vec![
                vec![Event::new(EV_KEY, KEY_A, 1)],
                vec![Event::new(EV_REL, REL_X, 3)],
                vec![Event::new(EV_KEY, KEY_A, 0)],
            ]
        );
        assert_eq!(b.repeats, 2);
    }

    #[test]
    fn raw_records_parse_in_any_chunking_and_batch_at_syn_report() {
        let events = [
            raw(1_700_000_000_000_000, EV_MSC, 4, 0x70004),
            raw(1_700_000_000_000_000, EV_KEY, KEY_A, 1),
            raw(1_700_000_000_000_000, EV_SYN, SYN_REPORT, 0),
            raw(1_700_000_000_008_000, EV_REL, REL_X, 2),
            raw(1_700_000_000_008_250, EV_REL, REL_Y, -1),
            raw(1_700_000_000_008_250, EV_SYN, SYN_REPORT, 0),
            raw(1_700_000_000_009_000, EV_KEY, KEY_A, 1),
            raw(1_700_000_000_009_000, EV_SYN, SYN_DROPPED, 0),
            raw(1_700_000_000_009_000, EV_KEY, KEY_A, 0),
            raw(1_700_000_000_009_000, EV_SYN, SYN_REPORT, 0),
            raw(1_700_000_000_010_000, EV_KEY, KEY_A, 0),
            raw(1_700_000_000_010_000, EV_SYN, SYN_REPORT, 0),
        ];
        let bytes: Vec<u8> = events.iter().flat_map(|e| e.emit()).collect();
        assert_eq!(bytes.len(), 12 * RAW_EVENT_LEN);
        for chunk in [1, 5, 24, 25, 100, bytes.len()] {
            let mut dec = RawDecoder::new();
            let mut batcher = Batcher::new();
            let mut batches = Vec::new();
            for c in bytes.chunks(chunk) {
                dec.push(c, |e| batches.extend(batcher.push(e)));
            }
            assert_eq!(dec.pending(), 0);
            assert_eq!(batcher.dropped, 1);
            assert_eq!(
                batches,
                vec![
                    vec![Event::new(EV_MSC, 4, 0x70004), Event::new(EV_KEY, KEY_A, 1)],
                    vec![
                        Event::new(EV_REL, REL_X, 2),
                        Event {
                            ty: EV_REL,
                            code: REL_Y,
                            value: -1,
                            dt_us: 250
                        }
                    ],
                    vec![Event::new(EV_KEY, KEY_A, 0)],
                ],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn raw_record_layout_is_the_kernels() {
        if cfg!(target_endian = "little") {
            let b = raw(1_000_002, EV_KEY, KEY_A, 1).emit();
            assert_eq!(
                b.to_vec(),
                hex("0100000000000000 0200000000000000 0100 1e00 01000000")
            );
        }
    }

    #[test]
    fn x_codes_map_both_ways() {
        assert_eq!(x_keycode_to_linux(38), Some(KEY_A));
        assert_eq!(linux_to_x_keycode(KEY_A), Some(38));
        assert_eq!(x_keycode_to_linux(8), None);
        assert_eq!(linux_to_x_keycode(0), None);
        assert_eq!(linux_to_x_keycode(248), None);
        assert_eq!(linux_to_x_keycode(247), Some(255));
        for b in [1, 2, 3, 8, 9] {
            assert_eq!(linux_to_x_button(x_button_to_linux(b).unwrap()), Some(b));
        }
        assert_eq!(x_wheel(5), Some(Event::new(EV_REL, REL_WHEEL, -1)));
    }

    #[test]
    fn xmapper_orders_and_scales() {
        let mut m = XMapper::new(1280, 1024);
        m.set_capabilities(&Capabilities {
            abs: vec![
                AbsAxis {
                    code: ABS_X,
                    max: 639,
                    ..Default::default()
                },
                AbsAxis {
                    code: ABS_Y,
                    max: 479,
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let mut out = Vec::new();
        m.map(
            &[
                Event::new(EV_ABS, ABS_X, 639),
                Event::new(EV_ABS, ABS_Y, 240),
                Event::new(EV_KEY, BTN_LEFT, 1),
            ],
            &mut out,
        );
        m.map(&[Event::new(EV_REL, REL_WHEEL, -2)], &mut out);
        m.map(
            &[Event::new(EV_KEY, KEY_A, 1), Event::new(EV_KEY, KEY_A, 2)],
            &mut out,
        );
        m.map(
            &[Event::new(EV_REL, REL_X, 3), Event::new(EV_REL, REL_Y, -4)],
            &mut out,
        );
        m.map(&[Event::new(EV_KEY, 600, 1)], &mut out);
        assert_eq!(
            out,
            vec![
                XAction::MoveTo { x: 1279, y: 513 },
                XAction::Button {
                    button: 1,
                    press: true
                },
                XAction::Button {
                    button: 5,
                    press: true
                },
                XAction::Button {
                    button: 5,
                    press: false
                },
                XAction::Button {
                    button: 5,
                    press: true
                },
                XAction::Button {
                    button: 5,
                    press: false
                },
                XAction::Key {
                    keycode: 38,
                    press: true
                },
                XAction::MoveBy { dx: 3, dy: -4 },
            ]
        );
        assert_eq!(m.unmapped, 1);
        assert_eq!(scale_abs(5, 0, 0, 100), 0);
        assert_eq!(scale_abs(-100, 0, 10, 100), 0);
        assert_eq!(scale_abs(i32::MAX, i32::MIN, i32::MAX, 640), 639);
    }

    fn event() -> impl Strategy<Value = Event> {
        (0..=EV_MAX, 0..=KEY_MAX, any::<i32>(), any::<u32>())
            .prop_filter("valid", |(t, c, _, _)| valid_event(*t, *c))
            .prop_map(|(ty, code, value, dt_us)| Event {
                ty,
                code,
                value,
                dt_us,
            })
    }

    fn caps() -> impl Strategy<Value = Capabilities> {
        (
            "[a-z é]{0,40}",
            any::<[u16; 4]>(),
            proptest::collection::btree_set(0..=KEY_MAX, 0..50),
            proptest::collection::btree_set(0..=REL_MAX, 0..5),
            proptest::collection::btree_map(
                0..=ABS_MAX,
                (any::<i32>(), any::<i32>(), any::<i32>(), any::<[i32; 3]>()),
                0..5,
            ),
        )
            .prop_map(|(name, ids, keys, rel, abs)| Capabilities {
                name,
                bustype: ids[0],
                vendor: ids[1],
                product: ids[2],
                version: ids[3],
                keys: keys.into_iter().collect(),
                rel: rel.into_iter().collect(),
                abs: abs
                    .into_iter()
                    .map(|(code, (value, a, b, [fuzz, flat, resolution]))| AbsAxis {
                        code,
                        value,
                        min: a.min(b),
                        max: a.max(b),
                        fuzz,
                        flat,
                        resolution,
                    })
                    .collect(),
            })
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = InputMessage::parse(&bytes);
        }

        #[test]
        fn parse_never_panics_on_plausible_headers(
            kind in 0u8..4,
            body in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut p = vec![VERSION, kind];
            p.extend(body);
            let _ = InputMessage::parse(&p);
        }

        #[test]
        fn events_round_trip(events in proptest::collection::vec(event(), 0..40)) {
            let m = InputMessage::Events(events);
            let bytes = m.emit().unwrap();
            prop_assert_eq!(bytes.len(), 4 + EVENT_LEN * match &m { InputMessage::Events(e) => e.len(), _ => 0 });
            prop_assert_eq!(InputMessage::parse(&bytes).unwrap(), m);
        }

        #[test]
        fn screen_sizes_round_trip(width in 1u16..=MAX_SCREEN, height in 1u16..=MAX_SCREEN) {
            let m = InputMessage::ScreenSize { width, height };
            let bytes = m.emit().unwrap();
            prop_assert_eq!(bytes.len(), 6);
            prop_assert_eq!(InputMessage::parse(&bytes).unwrap(), m);
        }

        #[test]
        fn capabilities_round_trip(c in caps()) {
            let m = InputMessage::Capabilities(c);
            let bytes = m.emit().unwrap();
            prop_assert_eq!(InputMessage::parse(&bytes).unwrap(), m);
        }

        #[test]
        fn raw_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut dec = RawDecoder::new();
            let mut b = Batcher::new();
            dec.push(&bytes, |e| { let _ = b.push(e); });
            prop_assert_eq!(dec.pending(), bytes.len() % RAW_EVENT_LEN);
        }
    }
}
