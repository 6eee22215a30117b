//! What a person does in the `wayland-window` viewer, as input records (sans-IO): the
//! window's keyboard and pointer events (`wl_keyboard`, `wl_pointer`) become the same
//! [input records](crate::input) an `x11-input` source makes of the X11 viewer, for the
//! `wayland-window-input` source of the same display in this process.
//!
//! Keys go by their Linux code (a `wl_keyboard` key is one) and, as from an `x11-input`
//! source, each press with the keysym it gives here: read from the keymap the compositor
//! sends and the modifiers it reports ([`XkbKeys`]), so the app side's `xtest` sink types what
//! the person's layout gives, whatever the app's layout. Positions
//! in the window (scaled to it) are mapped back onto the app's screen; buttons are Linux
//! button codes already; the wheel goes by notches (`axis_discrete`), or by 15 px of smooth
//! scrolling a notch. Keys still held when the window loses the keyboard are released, so no
//! key stays down on the app side.
//!
//! **Pointer lock** for programs that grab the pointer (games, 3D views, a VM inside the
//! remote desktop): Ctrl+Alt+G (as QEMU's viewer) asks the window to lock the pointer
//! (`zwp_pointer_constraints_v1`, where offered): while locked the pointer stays in the window
//! and its motion goes as relative moves (`REL_X`/`REL_Y`, from `zwp_relative_pointer_v1`),
//! which the app side's `xtest` sink makes relative XTEST motion; Ctrl+Alt+G again, or the
//! window losing focus, lets it go. The G of the combination is not sent.

use crate::input::xkb::XkbKeys;
use crate::input::{
    Capabilities, Event, InputMessage, ABS_X, ABS_Y, BTN_LEFT, EV_ABS, EV_KEY, EV_KEYSYM, EV_REL,
    REL_HWHEEL, REL_WHEEL, REL_X, REL_Y,
};
use std::collections::BTreeSet;

/// Control, Mod1 (Alt) and Mod4 (Super) as xkb's real modifier bits.
const SHORTCUT_MODS: u32 = (1 << 2) | (1 << 3) | (1 << 6);

/// Pixels of smooth scrolling per wheel notch.
const NOTCH_PX: f64 = 15.0;

/// Control and Mod1 (Alt): with G, the pointer lock's toggle.
const LOCK_MODS: u32 = (1 << 2) | (1 << 3);

/// `KEY_G`.
const KEY_G: u32 = 34;

/// The viewer's input, as records.
#[derive(Debug, Default)]
pub(crate) struct ViewerInput {
    /// The app's screen (the axes' ranges).
    screen: (u16, u16),
    /// The size the screen is shown at in the window.
    shown: (i32, i32),
    /// Keys and buttons down, by Linux code.
    held: BTreeSet<u16>,
    /// Events of the pointer frame being built.
    batch: Vec<Event>,
    /// Smooth scrolling not yet a whole notch (vertical, horizontal), px.
    smooth: (f64, f64),
    /// Whether this frame had notches (then smooth values are not counted again).
    notched: bool,
    /// Records ready to go.
    out: Vec<InputMessage>,
    /// The compositor's keymap, once sent.
    keymap: Option<XkbKeys>,
    /// The modifiers as the compositor reports them (depressed, latched, locked).
    mods: u32,
    /// The layout group in use (`us,ru` switched to `ru`: 1).
    group: u32,
    /// The pointer is locked: its motion goes as relative moves.
    locked: bool,
    /// The lock's toggle was pressed: the window is to lock (`true`) or let go (`false`).
    lock_wanted: Option<bool>,
    /// The toggle's G is down (its release is not sent either).
    toggle_held: bool,
    /// Relative motion not yet a whole pixel.
    sub_px: (f64, f64),
}

impl ViewerInput {
    /// The app's screen is `screen`, shown at `shown` in the window: new axis ranges.
    pub(crate) fn set_screen(&mut self, screen: (u16, u16), shown: (i32, i32)) {
        if screen != self.screen {
            self.screen = screen;
            self.out
                .push(InputMessage::Capabilities(self.capabilities()));
        }
        self.shown = shown;
    }

    fn capabilities(&self) -> Capabilities {
        let mut c = Capabilities::viewer(
            "ndd wayland-window".to_string(),
            self.screen.0,
            self.screen.1,
        );
        // Relative moves while the pointer is locked (ascending, before the wheels).
        c.rel.splice(0..0, [REL_X, REL_Y]);
        c
    }

    /// The screen's size is said again at the next [`ViewerInput::set_screen`] (a source
    /// that just attached has not heard it).
    pub(crate) fn forget_screen(&mut self) {
        self.screen = (0, 0);
    }

    /// The compositor's keymap (its xkb text).
    pub(crate) fn set_keymap(&mut self, text: &str) {
        let k = XkbKeys::parse(text);
        self.keymap = (!k.is_empty()).then_some(k);
    }

    /// The modifiers now (`wl_keyboard.modifiers`: depressed, latched, locked) and the
    /// layout group in use.
    pub(crate) fn modifiers(&mut self, depressed: u32, latched: u32, locked: u32, group: u32) {
        self.mods = depressed | latched | locked;
        self.group = group;
    }

    /// A key pressed or released (`wl_keyboard.key`: a Linux code).
    pub(crate) fn key(&mut self, code: u32, down: bool) {
        if code == KEY_G && down && self.mods & LOCK_MODS == LOCK_MODS {
            self.toggle_held = true;
            self.lock_wanted = Some(!self.locked);
            return;
        }
        if code == KEY_G && !down && std::mem::take(&mut self.toggle_held) {
            return;
        }
        let sym = if down {
            self.keymap.as_ref().and_then(|k| {
                // Shortcuts (Control, Alt, Super held) by the first layout's keysym, as
                // most programs match them: Ctrl+C on `ru` is Ctrl+C, not Ctrl+с.
                let group = if self.mods & SHORTCUT_MODS != 0 {
                    0
                } else {
                    self.group
                };
                k.keysym_in(code, self.mods, group)
            })
        } else {
            None
        };
        let Ok(code) = u16::try_from(code) else {
            return;
        };
        if down == self.held.contains(&code) {
            return;
        }
        if down {
            self.held.insert(code);
        } else {
            self.held.remove(&code);
        }
        let mut events = Vec::with_capacity(2);
        if let Some(s) = sym {
            events.push(Event::new(EV_KEYSYM, code, s as i32));
        }
        events.push(Event::new(EV_KEY, code, i32::from(down)));
        self.out.push(InputMessage::Events(events));
    }

    /// The seat lost its pointer: the buttons held are released (a drag under way ends).
    pub(crate) fn pointer_left(&mut self) {
        let buttons: Vec<u16> = self
            .held
            .iter()
            .copied()
            .filter(|k| (BTN_LEFT..BTN_LEFT + 0x10).contains(k))
            .collect();
        if buttons.is_empty() {
            return;
        }
        for b in &buttons {
            self.held.remove(b);
        }
        self.out.push(InputMessage::Events(
            buttons
                .into_iter()
                .map(|b| Event::new(EV_KEY, b, 0))
                .collect(),
        ));
    }

    /// The window lost the keyboard: what is held is released.
    pub(crate) fn keyboard_left(&mut self) {
        // (The lock's G, if still down, is forgotten: a later G's release must go.)
        self.toggle_held = false;
        let keys: Vec<u16> = self
            .held
            .iter()
            .copied()
            .filter(|&k| !(BTN_LEFT..BTN_LEFT + 0x10).contains(&k))
            .collect();
        if keys.is_empty() {
            return;
        }
        for k in &keys {
            self.held.remove(k);
        }
        self.out.push(InputMessage::Events(
            keys.into_iter().map(|k| Event::new(EV_KEY, k, 0)).collect(),
        ));
    }

    /// Whether the person asked to lock (`Some(true)`) or let go of (`Some(false)`) the
    /// pointer since the last call.
    pub(crate) fn take_lock_wanted(&mut self) -> Option<bool> {
        self.lock_wanted.take()
    }

    /// The compositor locked the pointer (`true`) or let it go (`false`).
    pub(crate) fn set_locked(&mut self, locked: bool) {
        self.locked = locked;
        self.sub_px = (0.0, 0.0);
    }

    /// Whether the pointer is locked.
    pub(crate) fn locked(&self) -> bool {
        self.locked
    }

    /// Relative motion (`zwp_relative_pointer_v1.relative_motion`): a relative move while the
    /// pointer is locked (nothing otherwise: the absolute position goes).
    pub(crate) fn relative(&mut self, dx: f64, dy: f64) {
        if !self.locked {
            return;
        }
        self.sub_px.0 += dx;
        self.sub_px.1 += dy;
        let (x, y) = (self.sub_px.0.trunc(), self.sub_px.1.trunc());
        self.sub_px.0 -= x;
        self.sub_px.1 -= y;
        if x != 0.0 {
            self.batch.push(Event::new(EV_REL, REL_X, x as i32));
        }
        if y != 0.0 {
            self.batch.push(Event::new(EV_REL, REL_Y, y as i32));
        }
    }

    /// The pointer at `(x, y)` in the window's surface.
    pub(crate) fn motion(&mut self, x: f64, y: f64) {
        if self.locked {
            // (A compositor may say where the locked pointer is: it does not move.)
            return;
        }
        let map = |v: f64, shown: i32, size: u16| -> i32 {
            let max = i32::from(size.max(1)) - 1;
            if shown <= 0 {
                return 0;
            }
            ((v * f64::from(size) / f64::from(shown)) as i32).clamp(0, max)
        };
        let (sx, sy) = (
            map(x, self.shown.0, self.screen.0),
            map(y, self.shown.1, self.screen.1),
        );
        self.batch.retain(|e| e.ty != EV_ABS);
        self.batch.push(Event::new(EV_ABS, ABS_X, sx));
        self.batch.push(Event::new(EV_ABS, ABS_Y, sy));
    }

    /// A button (`wl_pointer.button`: a Linux button code).
    pub(crate) fn button(&mut self, code: u32, down: bool) {
        let Ok(code) = u16::try_from(code) else {
            return;
        };
        if down == self.held.contains(&code) {
            return;
        }
        if down {
            self.held.insert(code);
        } else {
            self.held.remove(&code);
        }
        self.batch.push(Event::new(EV_KEY, code, i32::from(down)));
    }

    /// Wheel notches (`axis_discrete`; Wayland's down is positive, Linux's wheel up).
    pub(crate) fn notches(&mut self, vertical: bool, n: i32) {
        self.notched = true;
        if vertical {
            self.batch.push(Event::new(EV_REL, REL_WHEEL, -n));
        } else {
            self.batch.push(Event::new(EV_REL, REL_HWHEEL, n));
        }
    }

    /// Smooth scrolling of `px` (counted only in frames without notches).
    pub(crate) fn scroll(&mut self, vertical: bool, px: f64) {
        if vertical {
            self.smooth.0 += px;
        } else {
            self.smooth.1 += px;
        }
    }

    /// The end of a pointer frame: its events as one record.
    pub(crate) fn frame(&mut self) {
        if !self.notched {
            for (vertical, acc) in [(true, &mut self.smooth.0), (false, &mut self.smooth.1)] {
                let n = (*acc / NOTCH_PX).trunc();
                if n != 0.0 {
                    *acc -= n * NOTCH_PX;
                    let n = n as i32;
                    self.batch.push(if vertical {
                        Event::new(EV_REL, REL_WHEEL, -n)
                    } else {
                        Event::new(EV_REL, REL_HWHEEL, n)
                    });
                }
            }
        } else {
            self.smooth = (0.0, 0.0);
        }
        self.notched = false;
        if !self.batch.is_empty() {
            self.out
                .push(InputMessage::Events(std::mem::take(&mut self.batch)));
        }
    }

    /// The records made since the last call.
    pub(crate) fn take(&mut self) -> Vec<InputMessage> {
        std::mem::take(&mut self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(m: &[InputMessage]) -> Vec<(u16, u16, i32)> {
        m.iter()
            .flat_map(|m| match m {
                InputMessage::Events(e) => e.iter().map(|e| (e.ty, e.code, e.value)).collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn positions_in_a_scaled_window_land_on_the_app_screen() {
        let mut v = ViewerInput::default();
        v.set_screen((1920, 1080), (960, 540));
        let caps = v.take();
        assert!(
            matches!(&caps[..], [InputMessage::Capabilities(c)] if c.abs[0].max == 1919 && c.abs[1].max == 1079)
        );
        v.motion(480.0, 270.0);
        v.frame();
        v.motion(2000.0, -5.0);
        v.button(u32::from(BTN_LEFT), true);
        v.frame();
        assert_eq!(
            events(&v.take()),
            vec![
                (EV_ABS, ABS_X, 960),
                (EV_ABS, ABS_Y, 540),
                (EV_ABS, ABS_X, 1919),
                (EV_ABS, ABS_Y, 0),
                (EV_KEY, BTN_LEFT, 1)
            ]
        );
        // The same size again: no new capabilities.
        v.set_screen((1920, 1080), (1920, 1080));
        assert!(v.take().is_empty());
    }

    #[test]
    fn keys_go_by_code_and_are_released_when_the_keyboard_leaves() {
        let mut v = ViewerInput::default();
        v.key(30, true);
        v.key(30, true); // a repeat of a held key: nothing
        v.key(42, true);
        v.key(42, false);
        v.button(u32::from(BTN_LEFT), true);
        v.frame();
        v.take();
        v.keyboard_left();
        assert_eq!(
            events(&v.take()),
            vec![(EV_KEY, 30, 0)],
            "the key, not the button"
        );
        v.key(30, false);
        assert!(v.take().is_empty(), "already released");
    }

    #[test]
    fn buttons_held_are_released_when_the_seat_loses_its_pointer() {
        let mut v = ViewerInput::default();
        v.key(30, true);
        v.button(u32::from(BTN_LEFT), true);
        v.frame();
        v.take();
        v.pointer_left();
        assert_eq!(
            events(&v.take()),
            vec![(EV_KEY, BTN_LEFT, 0)],
            "the button, not the key"
        );
        v.button(u32::from(BTN_LEFT), false);
        v.frame();
        assert!(v.take().is_empty(), "already released");
    }

    #[test]
    fn presses_carry_the_keysym_the_compositors_keymap_gives() {
        let mut v = ViewerInput::default();
        v.key(30, true);
        v.key(30, false);
        assert_eq!(
            events(&v.take()),
            vec![(EV_KEY, 30, 1), (EV_KEY, 30, 0)],
            "no keymap yet: by code"
        );
        v.set_keymap(crate::input::xkb::KEYMAP_US);
        v.modifiers(1, 0, 0, 0);
        v.key(3, true);
        v.key(3, false);
        assert_eq!(
            events(&v.take()),
            vec![(EV_KEYSYM, 3, 0x40), (EV_KEY, 3, 1), (EV_KEY, 3, 0)],
            "Shift+2 is @, said with the press only"
        );
        // A keymap of two layouts (`us,ru`), switched to the second: its keysyms.
        let two = "xkb_keymap {\nxkb_keycodes \"x\" {\n<AC01> = 38;\n};\nxkb_symbols \"us+ru:2\" {\nkey <AC01> { [ a, A ], [ Cyrillic_ef, Cyrillic_EF ] };\n};\n};\n";
        v.set_keymap(two);
        v.modifiers(0, 0, 0, 1);
        v.key(30, true);
        assert_eq!(
            events(&v.take()),
            vec![(EV_KEYSYM, 30, 0x6c6), (EV_KEY, 30, 1)],
            "Cyrillic_ef"
        );
        v.key(30, false);
        v.modifiers(1 << 2, 0, 0, 1);
        v.key(30, true);
        assert_eq!(
            events(&v.take()),
            vec![(EV_KEY, 30, 0), (EV_KEYSYM, 30, 0x61), (EV_KEY, 30, 1)],
            "Ctrl+a stays a shortcut"
        );
    }

    #[test]
    fn the_wheel_goes_by_notches_or_by_15_px_of_smooth_scrolling() {
        let mut v = ViewerInput::default();
        v.notches(true, 1);
        v.scroll(true, 10.0);
        v.frame();
        assert_eq!(events(&v.take()), vec![(EV_REL, REL_WHEEL, -1)]);
        v.scroll(true, 10.0);
        v.frame();
        assert!(v.take().is_empty(), "not a notch yet");
        v.scroll(true, 10.0);
        v.scroll(false, -31.0);
        v.frame();
        assert_eq!(
            events(&v.take()),
            vec![(EV_REL, REL_WHEEL, -1), (EV_REL, REL_HWHEEL, -2)]
        );
    }

    #[test]
    fn ctrl_alt_g_asks_for_the_lock_and_a_locked_pointer_moves_by_relative_steps() {
        let mut v = ViewerInput::default();
        v.set_screen((1920, 1080), (960, 540));
        let caps = v.take();
        let [InputMessage::Capabilities(c)] = &caps[..] else {
            panic!("capabilities first");
        };
        assert_eq!(c.rel, vec![REL_X, REL_Y, REL_HWHEEL, REL_WHEEL]);
        c.check().unwrap();
        // Unlocked, relative motion says nothing (the absolute position goes).
        v.relative(5.0, 5.0);
        v.motion(480.0, 270.0);
        v.frame();
        assert_eq!(
            events(&v.take()),
            vec![(EV_ABS, ABS_X, 960), (EV_ABS, ABS_Y, 540)]
        );
        // G alone types a g; with Control and Alt held it asks for the lock, and neither its
        // press nor its release goes.
        v.key(KEY_G, true);
        v.key(KEY_G, false);
        assert_eq!(events(&v.take()), vec![(EV_KEY, 34, 1), (EV_KEY, 34, 0)]);
        v.key(29, true);
        v.key(56, true);
        v.modifiers(LOCK_MODS, 0, 0, 0);
        v.key(KEY_G, true);
        v.modifiers(0, 0, 0, 0);
        v.key(KEY_G, false);
        assert_eq!(
            events(&v.take()),
            vec![(EV_KEY, 29, 1), (EV_KEY, 56, 1)],
            "the combination's G is not sent"
        );
        assert_eq!(v.take_lock_wanted(), Some(true));
        assert_eq!(v.take_lock_wanted(), None);
        // Locked: relative steps, fractions kept for the next; absolute positions say nothing.
        v.set_locked(true);
        v.relative(2.5, -1.25);
        v.motion(10.0, 10.0);
        v.frame();
        v.relative(0.75, -0.75);
        v.frame();
        assert_eq!(
            events(&v.take()),
            vec![
                (EV_REL, REL_X, 2),
                (EV_REL, REL_Y, -1),
                (EV_REL, REL_X, 1),
                (EV_REL, REL_Y, -1)
            ]
        );
        // Ctrl+Alt+G again lets go.
        v.modifiers(LOCK_MODS, 0, 0, 0);
        v.key(KEY_G, true);
        assert_eq!(v.take_lock_wanted(), Some(false));
        // The window loses the keyboard before that G comes up: a later plain g goes whole
        // (its release is not taken for the combination's).
        v.keyboard_left();
        v.take();
        v.modifiers(0, 0, 0, 0);
        v.key(KEY_G, true);
        v.key(KEY_G, false);
        assert_eq!(events(&v.take()), vec![(EV_KEY, 34, 1), (EV_KEY, 34, 0)]);
    }
}
