//! The `portal-input` sink's EIS link: where the portal offers `ConnectToEIS`
//! (xdg-desktop-portal 1.18 and later, with a compositor speaking libei's protocol: GNOME 46
//! and later, KDE Plasma 6.1 and later), input goes over the socket it hands out, in libei's
//! protocol (the `reis` crate), instead of one D-Bus call per event.
//!
//! The client binds the seat's keyboard, pointer, absolute pointer, button and scroll
//! capabilities; each device the compositor then adds is used once it is resumed (it starts
//! emulating), and every event is followed by the device's frame. Keys a source annotated
//! with their keysym go by the key that gives that keysym in the keymap the compositor sent
//! with its keyboard (Shift pressed around it where the keysym is on the key's second level),
//! so the person's layout travels as through `NotifyKeyboardKeysym`; a keysym the session's
//! layout lacks is not typed (the same rule). Other keys go by their Linux code.

use super::xkb::XkbKeys;
use reis::ei;
use reis::handshake::EiHandshaker;
use reis::PendingRequestResult;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

/// How long the compositor may take to set the link up (handshake, devices resumed).
const SETUP_WAIT: Duration = Duration::from_secs(5);

/// Linux's KEY_LEFTSHIFT and KEY_RIGHTSHIFT.
const KEY_LEFTSHIFT: u32 = 42;
const KEY_RIGHTSHIFT: u32 = 54;

/// The capabilities bound on each seat, by their interfaces.
const WANTED: [&str; 5] = [
    "ei_keyboard",
    "ei_pointer",
    "ei_pointer_absolute",
    "ei_button",
    "ei_scroll",
];

/// One device the compositor added: its interfaces, its regions, and whether it may send
/// now (resumed).
#[derive(Default)]
struct Dev {
    interfaces: HashMap<String, reis::Object>,
    regions: Vec<Region>,
    /// The mapping id said for the region that comes next.
    next_mapping: Option<String>,
    emulating: bool,
}

/// A region of an absolute device: a monitor's place in the desktop, in logical pixels, and
/// the mapping id that pairs it with a screen-cast stream (where the compositor says one).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Region {
    pub(super) x: u32,
    pub(super) y: u32,
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) mapping: Option<String>,
}

/// The region absolute positions go to: the one paired with the portal's stream (its
/// `mapping_id`), else the one of the stream's size, else the first. (With several monitors,
/// the first region is not necessarily the monitor the person shared.)
pub(super) fn region_for<'a>(
    regions: &'a [Region],
    mapping: Option<&str>,
    size: (f64, f64),
) -> Option<&'a Region> {
    mapping
        .and_then(|m| regions.iter().find(|r| r.mapping.as_deref() == Some(m)))
        .or_else(|| {
            regions
                .iter()
                .find(|r| (f64::from(r.width), f64::from(r.height)) == size)
        })
        .or_else(|| regions.first())
}

/// What a [`Eis`] link sends: the same events as the portal's Notify calls.
#[derive(Debug, Clone, Copy)]
pub(super) enum Sent {
    /// A key by keysym (looked up in the session's keymap), down or up.
    Keysym(u32, bool),
    /// A key by Linux code.
    Keycode(u32, bool),
    /// A button (Linux code), down or up.
    Button(u32, bool),
    /// Wheel steps, vertical (positive down) and horizontal (positive right).
    Wheel(i32, i32),
    /// Relative motion.
    Relative(f64, f64),
    /// A position on the monitor, in its pixels (of `size`, the monitor as shared).
    Absolute(f64, f64, (f64, f64)),
}

/// A key or button held, by its Linux code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Held {
    Key(u32),
    Button(u32),
}

/// An open EIS link.
pub(super) struct Eis {
    context: ei::Context,
    /// Each seat and the capability bits it offers of [`WANTED`].
    seats: HashMap<ei::Seat, u64>,
    /// The devices in the order the compositor added them (the first that can send an event
    /// sends it: the same one each time).
    devices: Vec<(ei::Device, Dev)>,
    /// The last serial the compositor sent (frames name it).
    serial: u32,
    sequence: u32,
    /// The keyboard's keymap, once sent.
    keys: XkbKeys,
    /// Keys pressed by keysym: the code each went by.
    pressed: HashMap<u32, u32>,
    /// Keys and buttons held, and the device each went to (its release goes there too).
    held: HashMap<Held, ei::Device>,
    /// The portal stream's `mapping_id`, if it said one ([`region_for`]).
    pub(super) mapping: Option<String>,
}

impl std::fmt::Debug for Eis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Eis({} devices)", self.devices.len())
    }
}

/// The next events of `context`, waiting at most `wait` for them to be readable.
fn read(context: &ei::Context, wait: Duration) -> Result<(), String> {
    if crate::common::wayland::readable(context.as_fd(), wait).map_err(|e| e.to_string())? {
        match context.read() {
            // (reis says the end as UnexpectedEof; 0 is a wake-up with nothing to read.)
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err("the compositor closed the EIS connection".into())
            }
            Err(e) => return Err(format!("reading the EIS connection: {e}")),
        }
    }
    Ok(())
}

/// Sends what is queued. A full socket keeps the rest queued for the next flush (a
/// compositor that stalls for a moment does not end the input).
fn flush(context: &ei::Context) -> Result<(), String> {
    match context.flush() {
        Ok(()) | Err(rustix::io::Errno::AGAIN) => Ok(()),
        Err(e) => Err(format!("writing the EIS connection: {e}")),
    }
}

impl Eis {
    /// Sets the link up on `fd` (from `ConnectToEIS`): the handshake, the seats bound, and
    /// the devices the compositor adds resumed (a keyboard, buttons and a pointer, or what
    /// came within [`SETUP_WAIT`]).
    pub(super) fn connect(fd: OwnedFd) -> Result<Eis, String> {
        let stream = std::os::unix::net::UnixStream::from(fd);
        let context = ei::Context::new(stream).map_err(|e| format!("the EIS socket: {e}"))?;
        let t0 = Instant::now();
        let mut hs = EiHandshaker::new("ndd", ei::handshake::ContextType::Sender);
        let resp = 'shake: loop {
            if t0.elapsed() > SETUP_WAIT {
                return Err(format!(
                    "the compositor did not finish the EIS handshake within {SETUP_WAIT:?}"
                ));
            }
            read(&context, Duration::from_millis(100))?;
            while let Some(r) = context.pending_event() {
                match r {
                    PendingRequestResult::Request(e) => {
                        if let Some(resp) = hs.handle_event(e).map_err(|e| e.to_string())? {
                            break 'shake resp;
                        }
                    }
                    PendingRequestResult::ParseError(e) => {
                        return Err(format!("the EIS handshake: {e}"))
                    }
                    PendingRequestResult::InvalidObject(_) => {}
                }
            }
            flush(&context)?;
        };
        flush(&context)?;
        let mut eis = Eis {
            context,
            seats: HashMap::new(),
            devices: Vec::new(),
            serial: resp.serial,
            sequence: 0,
            keys: XkbKeys::default(),
            pressed: HashMap::new(),
            held: HashMap::new(),
            mapping: None,
        };
        while t0.elapsed() < SETUP_WAIT {
            eis.pump(Duration::from_millis(50))?;
            let can = |i: &str| eis.device(i).is_some();
            if can("ei_keyboard")
                && can("ei_button")
                && (can("ei_pointer") || can("ei_pointer_absolute"))
            {
                break;
            }
        }
        if !eis.devices.iter().any(|(_, d)| d.emulating) {
            return Err(format!(
                "the compositor resumed no EIS device within {SETUP_WAIT:?}"
            ));
        }
        Ok(eis)
    }

    /// Takes what the compositor sent (waiting at most `wait` for it): seats bound, devices
    /// resumed and paused, its pings answered.
    pub(super) fn pump(&mut self, wait: Duration) -> Result<(), String> {
        read(&self.context, wait)?;
        while let Some(r) = self.context.pending_event() {
            match r {
                PendingRequestResult::Request(e) => self.take(e)?,
                PendingRequestResult::ParseError(e) => return Err(format!("EIS: {e}")),
                PendingRequestResult::InvalidObject(_) => {}
            }
        }
        flush(&self.context)
    }

    fn take(&mut self, e: ei::Event) -> Result<(), String> {
        use ei::{connection, device, keyboard, seat};
        match e {
            ei::Event::Connection(_, connection::Event::Seat { seat }) => {
                self.seats.insert(seat, 0);
            }
            ei::Event::Connection(_, connection::Event::Ping { ping }) => ping.done(0),
            ei::Event::Connection(_, connection::Event::InvalidObject { last_serial, .. }) => {
                self.serial = last_serial;
            }
            ei::Event::Connection(
                _,
                connection::Event::Disconnected {
                    reason,
                    explanation,
                    ..
                },
            ) => {
                return Err(format!(
                    "the compositor ended the EIS connection ({reason:?}{})",
                    explanation
                        .map(|e| format!(": {}", ndd_wire::text::printable(&e, 200)))
                        .unwrap_or_default()
                ))
            }
            ei::Event::Seat(s, seat::Event::Capability { mask, interface })
                if WANTED.contains(&interface.as_str()) =>
            {
                *self.seats.entry(s).or_default() |= mask;
            }
            ei::Event::Seat(s, seat::Event::Done) => {
                s.bind(self.seats.get(&s).copied().unwrap_or(0));
            }
            ei::Event::Seat(_, seat::Event::Device { device }) => {
                self.devices.push((device, Dev::default()));
            }
            ei::Event::Seat(s, seat::Event::Destroyed { serial }) => {
                self.serial = serial;
                self.seats.remove(&s);
            }
            ei::Event::Device(d, e) => {
                let Some(dev) = self
                    .devices
                    .iter_mut()
                    .find(|(x, _)| *x == d)
                    .map(|(_, dev)| dev)
                else {
                    return Ok(());
                };
                match e {
                    device::Event::Interface { object } => {
                        dev.interfaces
                            .insert(object.interface().to_string(), object);
                    }
                    device::Event::RegionMappingId { mapping_id } => {
                        dev.next_mapping = Some(mapping_id);
                    }
                    device::Event::Region {
                        offset_x,
                        offset_y,
                        width,
                        hight,
                        ..
                    } => dev.regions.push(Region {
                        x: offset_x,
                        y: offset_y,
                        width,
                        height: hight,
                        mapping: dev.next_mapping.take(),
                    }),
                    device::Event::Resumed { serial } => {
                        self.serial = serial;
                        d.start_emulating(serial, self.sequence);
                        self.sequence = self.sequence.wrapping_add(1);
                        dev.emulating = true;
                    }
                    // (What it held is the compositor's to release; it is forgotten here.)
                    device::Event::Paused { serial } => {
                        self.serial = serial;
                        dev.emulating = false;
                        self.held.retain(|_, h| *h != d);
                    }
                    device::Event::Destroyed { serial } => {
                        self.serial = serial;
                        self.devices.retain(|(x, _)| *x != d);
                        self.held.retain(|_, h| *h != d);
                    }
                    _ => {}
                }
            }
            ei::Event::Keyboard(
                _,
                keyboard::Event::Keymap {
                    keymap_type: keyboard::KeymapType::Xkb,
                    size,
                    keymap: fd,
                },
            ) => match crate::common::wayland::read_keymap(fd, size) {
                Some(text) => self.keys = XkbKeys::parse(&text),
                None => tracing::warn!(
                    "the compositor's keymap could not be read: keys typed by keysym are not typed"
                ),
            },
            ei::Event::Keyboard(_, keyboard::Event::Modifiers { serial, .. }) => {
                self.serial = serial;
            }
            _ => {}
        }
        Ok(())
    }

    /// The device that may send through interface `name` now: the first added, so the same
    /// one each time.
    fn device(&self, name: &str) -> Option<&ei::Device> {
        self.devices
            .iter()
            .find(|(_, d)| d.emulating && d.interfaces.contains_key(name))
            .map(|(x, _)| x)
    }

    /// Interface `name` of `device`, while it may send.
    fn interface<T: reis::Interface>(&self, device: &ei::Device, name: &str) -> Option<T> {
        self.devices
            .iter()
            .find(|(x, d)| x == device && d.emulating)
            .and_then(|(_, d)| d.interfaces.get(name).cloned())
            .and_then(|o| o.downcast::<T>())
    }

    /// The end of one event of `device`.
    fn frame(&self, device: &ei::Device) {
        device.frame(self.serial, monotonic_us());
    }

    /// A press or release of `what` on `device` (its keyboard or buttons): the press
    /// remembered with its device, so the release goes where it went.
    fn press(&mut self, device: &ei::Device, what: Held, down: bool) -> bool {
        let sent = match what {
            Held::Key(code) => self
                .interface::<ei::Keyboard>(device, "ei_keyboard")
                .map(|k| k.key(code, key_state(down)))
                .is_some(),
            Held::Button(code) => self
                .interface::<ei::Button>(device, "ei_button")
                .map(|b| {
                    b.button(
                        code,
                        if down {
                            ei::button::ButtonState::Press
                        } else {
                            ei::button::ButtonState::Released
                        },
                    )
                })
                .is_some(),
        };
        if sent {
            self.frame(device);
            if down {
                self.held.insert(what, device.clone());
            } else {
                self.held.remove(&what);
            }
        }
        sent
    }

    /// A press or release of `what`: a release goes to the device its press went to.
    fn press_or_release(&mut self, what: Held, down: bool) -> bool {
        let name = match what {
            Held::Key(_) => "ei_keyboard",
            Held::Button(_) => "ei_button",
        };
        let device = if down {
            self.device(name).cloned()
        } else {
            self.held.get(&what).cloned()
        };
        match device {
            Some(d) => self.press(&d, what, down),
            None => false,
        }
    }

    /// Sends `s`, each key or button event followed by its device's frame (libei changes
    /// nothing before the frame, and one key twice within a frame is a client's error). An
    /// event no device can send now (paused, or the compositor offers none) is dropped:
    /// `Ok(false)`.
    pub(super) fn send(&mut self, s: Sent) -> Result<bool, String> {
        self.pump(Duration::ZERO)?;
        let sent = match s {
            Sent::Keysym(sym, true) => {
                let Some((code, shift)) = self.keys.find(sym) else {
                    tracing::debug!(
                        keysym = sym,
                        "no key gives this keysym in the session's layout: not typed"
                    );
                    return Ok(false);
                };
                let Some(d) = self.device("ei_keyboard").cloned() else {
                    return Ok(false);
                };
                // Shift around the press where the keysym is on the key's second level and
                // no Shift is held already (the source's own, held on: left as it is).
                let shift = shift
                    && !self.held.contains_key(&Held::Key(KEY_LEFTSHIFT))
                    && !self.held.contains_key(&Held::Key(KEY_RIGHTSHIFT));
                if shift {
                    self.press(&d, Held::Key(KEY_LEFTSHIFT), true);
                }
                let sent = self.press(&d, Held::Key(code), true);
                if shift {
                    self.press(&d, Held::Key(KEY_LEFTSHIFT), false);
                }
                if sent {
                    self.pressed.insert(sym, code);
                }
                sent
            }
            Sent::Keysym(sym, false) => match self.pressed.remove(&sym) {
                Some(code) => self.press_or_release(Held::Key(code), false),
                None => false,
            },
            Sent::Keycode(code, down) => self.press_or_release(Held::Key(code), down),
            Sent::Button(b, down) => self.press_or_release(Held::Button(b), down),
            Sent::Wheel(y, x) => match self.device("ei_scroll").cloned() {
                Some(d) => match self.interface::<ei::Scroll>(&d, "ei_scroll") {
                    Some(w) => {
                        // One notch is 120.
                        w.scroll_discrete(x.saturating_mul(120), y.saturating_mul(120));
                        self.frame(&d);
                        true
                    }
                    None => false,
                },
                None => false,
            },
            Sent::Relative(x, y) => match self.device("ei_pointer").cloned() {
                Some(d) => match self.interface::<ei::Pointer>(&d, "ei_pointer") {
                    Some(p) => {
                        p.motion_relative(x as f32, y as f32);
                        self.frame(&d);
                        true
                    }
                    None => false,
                },
                None => false,
            },
            Sent::Absolute(x, y, (w, h)) => match self.device("ei_pointer_absolute").cloned() {
                Some(d) => {
                    // The shared monitor's region (logical pixels).
                    let region = self
                        .devices
                        .iter()
                        .find(|(x, _)| *x == d)
                        .and_then(|(_, dev)| {
                            region_for(&dev.regions, self.mapping.as_deref(), (w, h))
                        })
                        .map(|r| {
                            (
                                f64::from(r.x),
                                f64::from(r.y),
                                f64::from(r.width),
                                f64::from(r.height),
                            )
                        });
                    match self.interface::<ei::PointerAbsolute>(&d, "ei_pointer_absolute") {
                        Some(p) => {
                            let (rx, ry, rw, rh) = region.unwrap_or((0.0, 0.0, w, h));
                            let (sx, sy) = (rw / w.max(1.0), rh / h.max(1.0));
                            p.motion_absolute((rx + x * sx) as f32, (ry + y * sy) as f32);
                            self.frame(&d);
                            true
                        }
                        None => false,
                    }
                }
                None => false,
            },
        };
        flush(&self.context)?;
        Ok(sent)
    }
}

fn key_state(down: bool) -> ei::keyboard::KeyState {
    if down {
        ei::keyboard::KeyState::Press
    } else {
        ei::keyboard::KeyState::Released
    }
}

/// CLOCK_MONOTONIC now, in microseconds (EIS frames are stamped with it).
fn monotonic_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000 + (t.tv_nsec as u64) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(x: u32, width: u32, height: u32, mapping: Option<&str>) -> Region {
        Region {
            x,
            y: 0,
            width,
            height,
            mapping: mapping.map(String::from),
        }
    }

    #[test]
    fn absolute_positions_go_to_the_shared_monitors_region() {
        let two = [
            region(0, 1920, 1080, Some("monitor-a")),
            region(1920, 1280, 1024, Some("monitor-b")),
        ];
        // Paired by the stream's mapping id, whatever the order.
        assert_eq!(
            region_for(&two, Some("monitor-b"), (1920.0, 1080.0)),
            Some(&two[1])
        );
        // No mapping id (an older portal), or one no region has: the stream's size.
        assert_eq!(region_for(&two, None, (1280.0, 1024.0)), Some(&two[1]));
        assert_eq!(
            region_for(&two, Some("gone"), (1280.0, 1024.0)),
            Some(&two[1])
        );
        // Nothing pairs: the first.
        assert_eq!(region_for(&two, None, (800.0, 600.0)), Some(&two[0]));
        assert_eq!(region_for(&[], Some("monitor-a"), (800.0, 600.0)), None);
    }
}
