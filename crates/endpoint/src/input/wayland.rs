//! The `wayland-input` sink: input records typed and moved into a wlroots Wayland session
//! (sway, Hyprland, river, labwc) through a virtual keyboard (`zwp_virtual_keyboard_v1`) and
//! a virtual pointer (`zwlr_virtual_pointer_v1`), as if from a keyboard and mouse plugged in
//! there. The same loop as `uinput` and `xtest` ([`super::sink`]): held keys and buttons are
//! released when the stream ends, on a release-all record and before an error.
//!
//! A virtual keyboard must bring its keymap: this one uploads xkeyboard-config's `us` layout
//! (`keymap-us.xkb`, compiled by `xkbcomp` from an Xvfb with the default rules). Keys of an
//! evdev source go by their Linux code (a key's position). Presses an `x11-input` source
//! annotated with their keysym type that keysym, whatever the source's layout: by their own
//! key where `us` has it there, else on a spare key given it in the keymap ([`super::xkb`]).
//! Buttons, relative motion, the wheel, and absolute motion (scaled from the source's axis
//! ranges to the output) go to the virtual pointer, one `frame` per record.

use super::config::WaylandInputConfig;
use super::record::{
    Capabilities, Event, ABS_X, ABS_Y, BTN_LEFT, EV_ABS, EV_KEY, EV_KEYSYM, EV_REL, REL_HWHEEL,
    REL_WHEEL, REL_X, REL_Y,
};
use super::sink::{run_injector, Injector};
use super::xkb::{Press, Typist, KEYMAP_US};
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::SinkTask;
use crate::common::wayland::{ignore_events, memfd, pump, unavailable, wayland_connect};
use ndd_core::Frame;
use std::io::Write;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc::Receiver;
use wayland_client::globals::registry_queue_init;
use wayland_client::protocol::{wl_pointer, wl_seat};
use wayland_client::{Connection, EventQueue};
use wayland_protocols_misc::zwp_virtual_keyboard_v1::client::{
    zwp_virtual_keyboard_manager_v1 as kbd_manager, zwp_virtual_keyboard_v1 as kbd,
};
use wayland_protocols_wlr::virtual_pointer::v1::client::{
    zwlr_virtual_pointer_manager_v1 as ptr_manager, zwlr_virtual_pointer_v1 as ptr,
};

/// Pixels of scroll per wheel notch (what libinput reports for one click).
const WHEEL_STEP: f64 = 15.0;

/// The range absolute motion is scaled into (the compositor maps it onto the output).
const ABS_EXTENT: u32 = 65_535;

/// The modifier a key sets in the `us` keymap, as its bit in the keymap's modifier mask
/// (Shift, Lock, Control, Mod1 … Mod5 are bits 0–7), and whether it locks (toggles) rather
/// than holds. wlroots passes a virtual keyboard's keys on without updating the modifier
/// state (`update_state = false`): the client says which modifiers are down (found by
/// review: Shift+a typed `a`, Ctrl+C a plain `c`).
fn modifier(code: u16) -> Option<(u32, bool)> {
    Some(match code {
        42 | 54 => (1 << 0, false),   // KEY_LEFTSHIFT, KEY_RIGHTSHIFT: Shift
        58 => (1 << 1, true),         // KEY_CAPSLOCK: Lock
        29 | 97 => (1 << 2, false),   // KEY_LEFTCTRL, KEY_RIGHTCTRL: Control
        56 | 100 => (1 << 3, false),  // KEY_LEFTALT, KEY_RIGHTALT: Mod1 (Alt_L, Alt_R in us)
        69 => (1 << 4, true),         // KEY_NUMLOCK: Mod2
        125 | 126 => (1 << 6, false), // KEY_LEFTMETA, KEY_RIGHTMETA: Mod4 (Super)
        _ => return None,
    })
}

/// The modifiers as the keys held and toggled make them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Mods {
    /// Modifier keys held, by Linux code (a bitmask over the few codes [`modifier`] knows:
    /// two keys for one modifier, one released, keep it down).
    held: u32,
    depressed: u32,
    locked: u32,
}

impl Mods {
    /// Applies a key press (`down`) or release; whether the modifiers changed.
    fn key(&mut self, code: u16, down: bool) -> bool {
        let Some((bit, locks)) = modifier(code) else {
            return false;
        };
        let before = (self.depressed, self.locked);
        if locks {
            if down {
                self.locked ^= bit;
            }
        } else {
            let slot = 1u32 << (MOD_CODES.iter().position(|&c| c == code).unwrap_or(0));
            if down {
                self.held |= slot;
            } else {
                self.held &= !slot;
            }
            self.depressed = MOD_CODES
                .iter()
                .enumerate()
                .filter(|(i, _)| self.held & (1 << i) != 0)
                .filter_map(|(_, &c)| modifier(c))
                .fold(0, |m, (b, _)| m | b);
        }
        before != (self.depressed, self.locked)
    }
}

/// The holding modifier keys [`Mods::held`] tracks.
const MOD_CODES: [u16; 8] = [42, 54, 29, 97, 56, 100, 125, 126];

struct State;

ignore_events!(
    State;
    wl_seat::WlSeat,
    kbd_manager::ZwpVirtualKeyboardManagerV1,
    kbd::ZwpVirtualKeyboardV1,
    ptr_manager::ZwlrVirtualPointerManagerV1,
    ptr::ZwlrVirtualPointerV1,
);

/// A connected `wayland-input` sink.
pub(crate) struct WaylandInput {
    display: String,
    endpoint: &'static str,
    conn: Connection,
    queue: EventQueue<State>,
    keyboard: kbd::ZwpVirtualKeyboardV1,
    pointer: ptr::ZwlrVirtualPointerV1,
    started: Instant,
    /// The source's absolute axes (min, max), when it has them.
    abs: Option<((i32, i32), (i32, i32))>,
    /// The last absolute position (a record may move one axis only).
    at: (i32, i32),
    mods: Mods,
    /// The source's keysyms on this keymap.
    typist: Typist,
}

impl std::fmt::Debug for WaylandInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WaylandInput({})", self.display)
    }
}

/// Connects and starts a `wayland-input` sink.
pub(crate) fn spawn_wayland_input_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &WaylandInputConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let mut w = open_wayland_input(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_injector(endpoint, &mut w, rx, &delivered)))
}

/// Connects, creates the virtual keyboard (with its keymap) and pointer.
pub(crate) fn open_wayland_input(
    endpoint: &'static str,
    c: &WaylandInputConfig,
) -> Result<WaylandInput, EndpointError> {
    let d = c.display.as_str();
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
    let missing = |what: &str, e: String| {
        unavailable(
            endpoint,
            d,
            format!("no {what} ({e})"),
            "the wayland-input sink needs a wlroots compositor (sway, Hyprland, river, labwc, wayfire); on GNOME use the gnome-input sink, on KDE Plasma the kde-input sink",
        )
    };
    let km: kbd_manager::ZwpVirtualKeyboardManagerV1 = globals
        .bind(&qh, 1..=1, ())
        .map_err(|e| missing("zwp_virtual_keyboard_manager_v1", e.to_string()))?;
    let pm: ptr_manager::ZwlrVirtualPointerManagerV1 = globals
        .bind(&qh, 1..=2, ())
        .map_err(|e| missing("zwlr_virtual_pointer_manager_v1", e.to_string()))?;
    let keyboard = km.create_virtual_keyboard(&seat, &qh, ());
    let pointer = pm.create_virtual_pointer(Some(&seat), &qh, ());
    upload_keymap(&keyboard, KEYMAP_US).map_err(broken)?;
    // Everything above reaches the compositor, and an error (the keymap refused) comes back.
    queue
        .roundtrip(&mut State)
        .map_err(|e| broken(format!("setting up the virtual keyboard and pointer: {e}")))?;
    tracing::info!(endpoint, display = d, "virtual keyboard and pointer ready");
    Ok(WaylandInput {
        display: d.to_string(),
        endpoint,
        conn,
        queue,
        keyboard,
        pointer,
        started: Instant::now(),
        abs: None,
        at: (0, 0),
        mods: Mods::default(),
        typist: Typist::new(),
    })
}

/// Gives the virtual keyboard `keymap` (NUL-terminated, in a memfd the compositor maps).
fn upload_keymap(keyboard: &kbd::ZwpVirtualKeyboardV1, keymap: &str) -> Result<(), String> {
    let mut file =
        memfd("ndd-keymap", keymap.len() + 1).map_err(|e| format!("the keymap's memfd: {e}"))?;
    file.write_all(keymap.as_bytes())
        .and_then(|()| file.write_all(&[0]))
        .map_err(|e| format!("writing the keymap: {e}"))?;
    keyboard.keymap(
        wayland_client::protocol::wl_keyboard::KeymapFormat::XkbV1.into(),
        std::os::fd::AsFd::as_fd(&file),
        (keymap.len() + 1) as u32,
    );
    Ok(())
}

impl WaylandInput {
    fn ms(&self) -> u32 {
        self.started.elapsed().as_millis() as u32
    }

    /// Presses or releases source key `code`, typing `sym` (its keysym on the source) if it
    /// was annotated.
    fn key(
        &mut self,
        t: u32,
        code: u16,
        down: bool,
        sym: Option<u32>,
    ) -> Result<(), EndpointError> {
        let (sent, shift) = match (down, sym) {
            (true, Some(sym)) => {
                let shift_held = self.mods.depressed & 1 != 0;
                match self.typist.press(code, sym, shift_held) {
                    Press::Skip => return Ok(()),
                    Press::Key {
                        code,
                        shift,
                        keymap,
                    } => {
                        if let Some(km) = keymap {
                            upload_keymap(&self.keyboard, &km).map_err(|e| self.err(e))?;
                            tracing::debug!(
                                endpoint = self.endpoint,
                                keysym = sym,
                                "spare key given a keysym the us layout lacks there"
                            );
                        }
                        (code, shift)
                    }
                }
            }
            (true, None) => (code, None),
            (false, _) => match self.typist.release(code) {
                Some(c) => (c, None),
                None => return Ok(()),
            },
        };
        if let Some(s) = shift {
            let depressed = if s {
                self.mods.depressed | 1
            } else {
                self.mods.depressed & !1
            };
            self.keyboard.modifiers(depressed, 0, self.mods.locked, 0);
        }
        self.keyboard.key(t, u32::from(sent), u32::from(down));
        if shift.is_some() || self.mods.key(sent, down) {
            self.keyboard
                .modifiers(self.mods.depressed, 0, self.mods.locked, 0);
        }
        Ok(())
    }

    fn err(&self, e: impl std::fmt::Display) -> EndpointError {
        unavailable(
            self.endpoint,
            &self.display,
            e.to_string(),
            "the compositor closed the connection or refused a request",
        )
    }
}

/// `v` in `[min, max]` scaled to `0..=ABS_EXTENT`.
fn scale(v: i32, (min, max): (i32, i32)) -> u32 {
    let span = i64::from(max) - i64::from(min);
    if span <= 0 {
        return 0;
    }
    let v = (i64::from(v) - i64::from(min)).clamp(0, span);
    (v * i64::from(ABS_EXTENT) / span) as u32
}

impl Injector for WaylandInput {
    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError> {
        self.abs = match (caps.abs_axis(ABS_X), caps.abs_axis(ABS_Y)) {
            (Some(x), Some(y)) => Some(((x.min, x.max), (y.min, y.max))),
            _ => None,
        };
        Ok(())
    }

    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
        let t = self.ms();
        let (mut dx, mut dy) = (0.0f64, 0.0f64);
        let mut moved_abs = false;
        let mut pointer = false;
        // The keysym the next press of a key types (an `x11-input` source's annotation).
        let mut sym: Option<(u16, u32)> = None;
        for e in events {
            match (e.ty, e.code) {
                (EV_KEYSYM, code) => sym = Some((code, e.value as u32)),
                (EV_KEY, code) if (BTN_LEFT..BTN_LEFT + 0x10).contains(&code) => {
                    let state = if e.value != 0 {
                        wl_pointer::ButtonState::Pressed
                    } else {
                        wl_pointer::ButtonState::Released
                    };
                    self.pointer.button(t, u32::from(code), state);
                    pointer = true;
                }
                // Autorepeat (2) is the compositor's own business.
                (EV_KEY, code) if e.value != 2 => {
                    let down = e.value != 0;
                    let s = sym
                        .take()
                        .filter(|&(c, k)| c == code && k != 0 && down)
                        .map(|(_, k)| k);
                    self.key(t, code, down, s)?;
                }
                (EV_REL, REL_X) => dx += f64::from(e.value),
                (EV_REL, REL_Y) => dy += f64::from(e.value),
                (EV_REL, REL_WHEEL) => {
                    self.pointer.axis(
                        t,
                        wl_pointer::Axis::VerticalScroll,
                        -f64::from(e.value) * WHEEL_STEP,
                    );
                    pointer = true;
                }
                (EV_REL, REL_HWHEEL) => {
                    self.pointer.axis(
                        t,
                        wl_pointer::Axis::HorizontalScroll,
                        f64::from(e.value) * WHEEL_STEP,
                    );
                    pointer = true;
                }
                (EV_ABS, ABS_X) => {
                    self.at.0 = e.value;
                    moved_abs = true;
                }
                (EV_ABS, ABS_Y) => {
                    self.at.1 = e.value;
                    moved_abs = true;
                }
                _ => {}
            }
        }
        if dx != 0.0 || dy != 0.0 {
            self.pointer.motion(t, dx, dy);
            pointer = true;
        }
        if let (true, Some((xr, yr))) = (moved_abs, self.abs) {
            self.pointer.motion_absolute(
                t,
                scale(self.at.0, xr),
                scale(self.at.1, yr),
                ABS_EXTENT,
                ABS_EXTENT,
            );
            pointer = true;
        }
        if pointer {
            self.pointer.frame();
        }
        self.conn.flush().map_err(|e| self.err(e))?;
        // A protocol error the compositor sent (a refused request) ends the sink, with the
        // compositor's words (read now, not later as a broken pipe).
        pump(&mut self.queue, &mut State, Duration::ZERO).map_err(|e| self.err(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_positions_scale_onto_the_whole_output() {
        assert_eq!(scale(0, (0, 639)), 0);
        assert_eq!(scale(639, (0, 639)), ABS_EXTENT);
        assert_eq!(scale(-5, (0, 639)), 0, "clamped");
        assert_eq!(scale(320, (0, 640)), ABS_EXTENT / 2);
        assert_eq!(scale(7, (3, 3)), 0, "an empty range");
    }

    #[test]
    fn modifier_keys_make_the_modifier_mask() {
        let mut m = Mods::default();
        assert!(m.key(42, true), "Shift down");
        assert_eq!(m.depressed, 1);
        assert!(!m.key(54, true), "the other Shift: no change");
        assert!(!m.key(42, false), "one Shift still held");
        assert!(m.key(54, false));
        assert_eq!(m.depressed, 0);
        assert!(m.key(29, true) && m.key(56, true));
        assert_eq!(m.depressed, 0b1100, "Control and Mod1");
        assert!(!m.key(30, true), "a letter changes nothing");
        assert!(m.key(58, true), "Caps Lock toggles");
        assert!(!m.key(58, false));
        assert_eq!(m.locked, 0b10);
        assert!(m.key(58, true));
        assert_eq!(m.locked, 0);
    }

    #[test]
    fn the_keymap_is_a_whole_xkb_keymap() {
        assert!(KEYMAP_US.starts_with("xkb_keymap {"));
        assert!(KEYMAP_US.contains("xkb_symbols"));
        assert!(!KEYMAP_US.contains('\0'));
    }
}
