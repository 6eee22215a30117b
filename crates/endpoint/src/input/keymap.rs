//! Keyboard layouts, sans-IO: which keysym a key gives on one X display, and which key (and
//! which Shift / AltGr state) gives a keysym on another. So a key typed on a display with one
//! layout (`de`, `fr`, `us(intl)` with dead keys) arrives as the same character on an app
//! display with another: the `x11-input` source sends each key press's keysym with its
//! keycode, the `xtest` sink types that keysym with its own layout.
//!
//! A [`Keymap`] is the core-protocol keyboard mapping (`GetKeyboardMapping`) and modifier
//! mapping (`GetModifierMapping`) of a display. With XKB servers the core mapping of a
//! keycode lists group 1 level 1 and 2, group 2 level 1 and 2, then group 1 levels 3 and 4
//! (`xmodmap -pke` shows it: `keycode 24 = q Q q Q at Greek_OMEGA` on `de`). Levels are picked
//! the way Xlib's `XLookupKeysym` does: Shift (and Caps Lock for letters) selects level 2,
//! the modifier that holds `ISO_Level3_Shift` (AltGr) levels 3 and 4, the one that holds
//! `Mode_switch` group 2, and Num Lock the keypad's digits.

/// `NoSymbol`.
pub const NO_SYMBOL: u32 = 0;
/// `Shift_L`.
pub const XK_SHIFT_L: u32 = 0xffe1;
/// `Shift_R`.
pub const XK_SHIFT_R: u32 = 0xffe2;
/// `Caps_Lock`.
pub const XK_CAPS_LOCK: u32 = 0xffe5;
/// `Shift_Lock`.
pub const XK_SHIFT_LOCK: u32 = 0xffe6;
/// `Num_Lock`.
pub const XK_NUM_LOCK: u32 = 0xff7f;
/// `ISO_Level3_Shift` (AltGr).
pub const XK_ISO_LEVEL3_SHIFT: u32 = 0xfe03;
/// `Mode_switch`.
pub const XK_MODE_SWITCH: u32 = 0xff7e;

/// Core modifier bits.
const SHIFT: u16 = 1;
const LOCK: u16 = 2;

/// Whether `k` is a modifier keysym (Shift, Control, Caps Lock, Meta, Alt, Super, Hyper,
/// AltGr and the other ISO level and group keys, Mode_switch, Num Lock).
pub fn is_modifier(k: u32) -> bool {
    (0xffe1..=0xffee).contains(&k)
        || (0xfe01..=0xfe0f).contains(&k)
        || k == XK_MODE_SWITCH
        || k == XK_NUM_LOCK
}

/// Whether `k` is a lock key whose state the source side already applied to the keysyms it
/// sends (Caps Lock, Shift Lock, Num Lock): the sink does not toggle its own.
pub fn is_lock(k: u32) -> bool {
    matches!(k, XK_CAPS_LOCK | XK_SHIFT_LOCK | XK_NUM_LOCK)
}

/// Whether `k` is a keypad keysym.
pub fn is_keypad(k: u32) -> bool {
    (0xff80..=0xffbd).contains(&k) || (0x11000000..=0x1100ffff).contains(&k)
}

/// Lower and upper case of a keysym (Latin-1 letters and Unicode keysyms; others are their
/// own case).
pub fn case_pair(k: u32) -> (u32, u32) {
    match k {
        0x41..=0x5a => (k + 0x20, k),
        0x61..=0x7a => (k, k - 0x20),
        0xc0..=0xde if k != 0xd7 => (k + 0x20, k),
        0xe0..=0xfe if k != 0xf7 => (k, k - 0x20),
        0x0100_0000..=0x0110_ffff => {
            let Some(c) = char::from_u32(k - 0x0100_0000) else {
                return (k, k);
            };
            // Only one-to-one case mappings (ß has no one-character upper case).
            let one = |it: &mut dyn Iterator<Item = char>| match (it.next(), it.next()) {
                (Some(x), None) => x as u32 + 0x0100_0000,
                _ => k,
            };
            (one(&mut c.to_lowercase()), one(&mut c.to_uppercase()))
        }
        _ => (k, k),
    }
}

/// Where a keysym is on a display: the keycode, and the Shift and AltGr state it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// X keycode.
    pub keycode: u8,
    /// `Some(true)`: Shift down; `Some(false)`: Shift up; `None`: either gives the keysym.
    pub shift: Option<bool>,
    /// AltGr (the `ISO_Level3_Shift` modifier) down.
    pub level3: bool,
}

/// A display's keyboard and modifier mapping. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keymap {
    min_keycode: u8,
    per: usize,
    syms: Vec<u32>,
    /// Keycodes of each of the 8 modifiers (Shift, Lock, Control, Mod1..Mod5).
    modmap: [Vec<u8>; 8],
    level3_mask: u16,
    mode_switch_mask: u16,
    num_lock_mask: u16,
}

impl Keymap {
    /// From a `GetKeyboardMapping` reply for keycodes `min_keycode..` (`per` keysyms each)
    /// and a `GetModifierMapping` reply (keycodes per modifier, 0 = none, 8 modifiers).
    pub fn new(min_keycode: u8, per: usize, syms: Vec<u32>, modifier_keycodes: &[u8]) -> Keymap {
        let mut modmap: [Vec<u8>; 8] = Default::default();
        let per_mod = modifier_keycodes.len() / 8;
        if per_mod > 0 {
            for (m, codes) in modifier_keycodes.chunks(per_mod).take(8).enumerate() {
                modmap[m] = codes.iter().copied().filter(|&c| c != 0).collect();
            }
        }
        let mut k = Keymap {
            min_keycode,
            per,
            syms,
            modmap,
            ..Keymap::default()
        };
        k.level3_mask = k.mask_of(XK_ISO_LEVEL3_SHIFT);
        k.mode_switch_mask = k.mask_of(XK_MODE_SWITCH);
        k.num_lock_mask = k.mask_of(XK_NUM_LOCK);
        k
    }

    /// The modifier bits whose keys carry `keysym`.
    fn mask_of(&self, keysym: u32) -> u16 {
        let mut mask = 0;
        for (m, codes) in self.modmap.iter().enumerate() {
            if codes.iter().any(|&c| self.syms_of(c).contains(&keysym)) {
                mask |= 1 << m;
            }
        }
        mask
    }

    /// The keysyms of `keycode` (empty when it is outside the mapping).
    pub fn syms_of(&self, keycode: u8) -> &[u32] {
        let Some(i) = keycode.checked_sub(self.min_keycode) else {
            return &[];
        };
        let start = usize::from(i) * self.per;
        self.syms.get(start..start + self.per).unwrap_or(&[])
    }

    fn max_keycode(&self) -> u8 {
        let n = self.syms.len().checked_div(self.per).unwrap_or(0);
        (usize::from(self.min_keycode) + n.saturating_sub(1)).min(255) as u8
    }

    /// The two keysyms of a level pair starting at `i` (level 1/2, or 3/4), with Xlib's case
    /// rule: a pair whose second keysym is NoSymbol is the first's lower and upper case.
    fn pair(&self, syms: &[u32], i: usize) -> (u32, u32) {
        let a = syms.get(i).copied().unwrap_or(NO_SYMBOL);
        let b = syms.get(i + 1).copied().unwrap_or(NO_SYMBOL);
        if b == NO_SYMBOL {
            case_pair(a)
        } else {
            (a, b)
        }
    }

    /// The keysym key `keycode` gives with modifier state `state` (a core event's `state`,
    /// XKB group in bits 13–14), as Xlib's lookup does; `None` for NoSymbol.
    pub fn keysym(&self, keycode: u8, state: u16) -> Option<u32> {
        let syms = self.syms_of(keycode);
        if syms.is_empty() {
            return None;
        }
        let group2 = (state >> 13) & 3 != 0 || state & self.mode_switch_mask != 0;
        let has_group2 = syms.len() > 3 && (syms[2] != NO_SYMBOL || syms[3] != NO_SYMBOL);
        let level3 = state & self.level3_mask != 0 && self.level3_mask != 0;
        let i = match (level3, group2 && has_group2) {
            (true, false) if syms.len() > 4 => 4,
            (true, true) if syms.len() > 6 => 6,
            (_, true) => 2,
            _ => 0,
        };
        let (a, b) = self.pair(syms, i);
        let (shift, lock) = (state & SHIFT != 0, state & LOCK != 0);
        let k = if state & self.num_lock_mask != 0 && self.num_lock_mask != 0 && is_keypad(b) {
            if shift {
                a
            } else {
                b
            }
        } else if !shift && !lock {
            a
        } else if !shift {
            case_pair(a).1
        } else if lock {
            case_pair(b).1
        } else {
            b
        };
        (k != NO_SYMBOL).then_some(k)
    }

    /// Where `keysym` is on this display: `hint` first (the sender's keycode: with the same
    /// layout on both sides nothing moves), then the lowest level of any key (level 1 before
    /// 2, 3, 4; group 2 is not used). `None` when no key gives it.
    pub fn find(&self, keysym: u32, hint: Option<u8>) -> Option<Place> {
        if keysym == NO_SYMBOL {
            return None;
        }
        let place = |keycode: u8, level3: bool| -> Option<Place> {
            let syms = self.syms_of(keycode);
            let i = if level3 { 4 } else { 0 };
            if level3 && (syms.len() <= 5 || self.level3_mask == 0) {
                return None;
            }
            let (a, b) = self.pair(syms, i);
            let shift = match (a == keysym, b == keysym) {
                (true, true) => None,
                (true, false) => Some(false),
                (false, true) => Some(true),
                (false, false) => return None,
            };
            Some(Place {
                keycode,
                shift,
                level3,
            })
        };
        if let Some(h) = hint {
            if let Some(p) = place(h, false).or_else(|| place(h, true)) {
                return Some(p);
            }
        }
        let codes = self.min_keycode..=self.max_keycode();
        // Level 1, then 2, then 3, then 4.
        let rank = |p: &Place| u8::from(p.level3) * 2 + u8::from(p.shift == Some(true));
        codes
            .flat_map(|c| [place(c, false), place(c, true)])
            .flatten()
            .min_by_key(|p| (rank(p), p.keycode))
    }

    /// Keycodes with no keysym at all: free for a keysym this layout lacks.
    pub fn spare_keycodes(&self) -> Vec<u8> {
        (self.min_keycode..=self.max_keycode())
            .filter(|&c| {
                let s = self.syms_of(c);
                !s.is_empty() && s.iter().all(|&k| k == NO_SYMBOL)
            })
            .collect()
    }

    /// Keysyms per keycode.
    pub fn per(&self) -> usize {
        self.per
    }

    /// Sets every level of `keycode` to `keysym` (what this side just asked the server for).
    pub fn remap(&mut self, keycode: u8, keysym: u32) {
        let Some(i) = keycode.checked_sub(self.min_keycode) else {
            return;
        };
        let start = usize::from(i) * self.per;
        if let Some(s) = self.syms.get_mut(start..start + self.per) {
            s.fill(keysym);
        }
    }

    /// The keycodes of Shift (modifier 0).
    pub fn shift_keycodes(&self) -> &[u8] {
        &self.modmap[0]
    }

    /// The keycodes of the AltGr (`ISO_Level3_Shift`) modifier.
    pub fn level3_keycodes(&self) -> Vec<u8> {
        (0..8)
            .filter(|m| self.level3_mask & (1 << m) != 0)
            .flat_map(|m| self.modmap[m].iter().copied())
            .collect()
    }

    /// Whether `keycode` is a lock key: its first keysym is Caps Lock, Shift Lock or Num
    /// Lock (`shift:both_capslock` gives the Shift keys Caps_Lock at a higher level: they
    /// stay Shift keys).
    fn is_lock_key(&self, keycode: u8) -> bool {
        self.syms_of(keycode).first().is_some_and(|&k| is_lock(k))
    }

    /// The modifier bits a lock key toggles (Lock, and the modifiers of Caps Lock, Shift
    /// Lock and Num Lock keys): a core event's state holds them while locked, not while the
    /// key is held.
    pub fn lock_mask(&self) -> u16 {
        let mut mask = LOCK | self.num_lock_mask;
        for (m, codes) in self.modmap.iter().enumerate() {
            if codes.iter().any(|&c| self.is_lock_key(c)) {
                mask |= 1 << m;
            }
        }
        mask
    }

    /// The modifier bits [`Keymap::held_mask`] accounts for: those with a key that is not a
    /// lock key. The others (a modifier no key is mapped to, a lock) come from the server.
    pub fn held_bits(&self) -> u16 {
        let mut mask = 0;
        for (m, codes) in self.modmap.iter().enumerate() {
            if codes.iter().any(|&c| !self.is_lock_key(c)) {
                mask |= 1 << m;
            }
        }
        mask & !self.lock_mask()
    }

    /// The modifier bits held by the keys `held` (X keycodes), lock keys left out: what a
    /// core event's state says of the keys held before it. A source that sees raw events
    /// (which carry no state) tracks the keys itself, so a Shift pressed just after a key
    /// does not change the keysym that key gave. A key outside the modifier map whose first
    /// keysym is a modifier's holds the modifiers of the keys that carry that keysym: the
    /// right Alt key of `de`, `fr` and most AltGr layouts (`level3(ralt_switch)`) is
    /// ISO_Level3_Shift by an XKB action, and only keycode 92 is in Mod5.
    pub fn held_mask(&self, held: impl IntoIterator<Item = u8>) -> u16 {
        let mut mask = 0;
        for c in held {
            if self.is_lock_key(c) {
                continue;
            }
            let mut bits = 0;
            for (m, codes) in self.modmap.iter().enumerate() {
                if codes.contains(&c) {
                    bits |= 1 << m;
                }
            }
            if bits == 0 {
                if let Some(&k) = self.syms_of(c).first().filter(|&&k| is_modifier(k)) {
                    bits = self.mask_of(k);
                }
            }
            mask |= bits;
        }
        mask & self.held_bits()
    }

    /// A keycode that types `keysym` at level 1 (a modifier key to press), if any.
    pub fn key_of(&self, keysym: u32) -> Option<u8> {
        (self.min_keycode..=self.max_keycode()).find(|&c| self.syms_of(c).first() == Some(&keysym))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fragments of Xvfb's `us` and `de` core mappings (`xmodmap -pke`), 7 keysyms per key,
    /// keycodes 8..=108, and their modifier maps (Shift: 50, 62; Lock: 66; Mod2: Num_Lock 77;
    /// Mod5: ISO_Level3_Shift 92 (us) / 108 (de)).
    fn layout(de: bool) -> Keymap {
        let per = 7;
        let mut syms = vec![0u32; (108 - 8 + 1) * per];
        let mut set = |code: usize, s: &[u32]| {
            let at = (code - 8) * per;
            syms[at..at + s.len()].copy_from_slice(s);
        };
        set(50, &[XK_SHIFT_L]);
        set(62, &[XK_SHIFT_R]);
        set(66, &[XK_CAPS_LOCK]);
        set(77, &[XK_NUM_LOCK]);
        set(87, &[0xff9c, 0xffb1]); // KP_End KP_1
        set(26, &[0x65, 0x45, 0x65, 0x45, 0x20ac, 0x45]); // e E e E EuroSign E
        set(11, &[0x32, 0x40, 0x32, 0x40]); // 2 @ (us) — de below
        if de {
            set(29, &[0x7a, 0x5a, 0x7a, 0x5a, 0x2190, 0xa5]); // z Z … leftarrow yen
            set(52, &[0x79, 0x59, 0x79, 0x59]); // y Y
            set(24, &[0x71, 0x51, 0x71, 0x51, 0x40, 0x7d9]); // q Q q Q at Greek_OMEGA
            set(11, &[0x32, 0x22, 0x32, 0x22, 0xb2, 0xaf4]); // 2 " … twosuperior
            set(49, &[0xfe52, 0xb0, 0xfe52, 0xb0]); // dead_circumflex degree
            set(108, &[XK_ISO_LEVEL3_SHIFT]);
        } else {
            set(29, &[0x79, 0x59, 0x79, 0x59]); // y Y
            set(52, &[0x7a, 0x5a, 0x7a, 0x5a]); // z Z
            set(24, &[0x71, 0x51, 0x71, 0x51]); // q Q
            set(49, &[0x60, 0x7e, 0x60, 0x7e]); // grave asciitilde
            set(92, &[XK_ISO_LEVEL3_SHIFT]);
        }
        let l3 = if de { 108 } else { 92 };
        // Two keycodes per modifier: Shift, Lock, Control, Mod1, Mod2, Mod3, Mod4, Mod5.
        let modmap = [50, 62, 66, 0, 0, 0, 0, 0, 77, 0, 0, 0, 0, 0, l3, 0];
        Keymap::new(8, per, syms, &modmap)
    }

    #[test]
    fn lookup_follows_shift_lock_altgr_and_num_lock() {
        let de = layout(true);
        assert_eq!(de.keysym(29, 0), Some(0x7a), "z on de's y key");
        assert_eq!(de.keysym(29, SHIFT), Some(0x5a));
        assert_eq!(de.keysym(29, LOCK), Some(0x5a), "caps lock");
        assert_eq!(de.keysym(29, SHIFT | LOCK), Some(0x5a));
        assert_eq!(de.keysym(24, 0x80), Some(0x40), "AltGr+q = @ on de (Mod5)");
        assert_eq!(de.keysym(11, SHIFT), Some(0x22));
        assert_eq!(de.keysym(87, 0), Some(0xff9c), "KP_End");
        assert_eq!(
            de.keysym(87, 0x10),
            Some(0xffb1),
            "KP_1 with Num Lock (Mod2)"
        );
        assert_eq!(de.keysym(87, 0x10 | SHIFT), Some(0xff9c));
        assert_eq!(de.keysym(49, 0), Some(0xfe52), "dead_circumflex");
        assert_eq!(de.keysym(30, 0), None, "a key with no keysym");
        assert_eq!(de.keysym(255, 0), None, "outside the mapping");
    }

    #[test]
    fn held_and_lock_masks_follow_the_modifier_map() {
        let de = layout(true);
        assert_eq!(de.lock_mask(), LOCK | 0x10, "Lock and Num Lock's Mod2");
        assert_eq!(de.held_bits(), SHIFT | 0x80, "Shift and Mod5 have keys");
        let held = |codes: &[u8]| de.held_mask(codes.iter().copied());
        assert_eq!(held(&[]), 0);
        assert_eq!(held(&[62]), SHIFT, "either Shift key");
        assert_eq!(held(&[50, 108]), SHIFT | 0x80, "Shift and AltGr (Mod5)");
        assert_eq!(held(&[66, 77]), 0, "lock keys held are not their lock");
        assert_eq!(held(&[38, 24]), 0, "letters hold no modifier");
        // `a` typed and Shift pressed right after: the state before `a` had no Shift.
        assert_eq!(de.keysym(24, held(&[])), Some(0x71));
        assert_eq!(de.keysym(24, held(&[50])), Some(0x51));
    }

    #[test]
    fn a_right_alt_outside_the_modifier_map_holds_altgr_and_shift_keys_stay_shift() {
        // Xvfb's `de` as `xmodmap -pm` shows it: Mod5 holds keycode 92 (ISO_Level3_Shift)
        // only; the right Alt key (108) is ISO_Level3_Shift by an XKB action.
        let per = 7;
        let mut syms = vec![0u32; (108 - 8 + 1) * per];
        let mut set = |code: usize, s: &[u32]| {
            let at = (code - 8) * per;
            syms[at..at + s.len()].copy_from_slice(s);
        };
        set(24, &[0x71, 0x51, 0x71, 0x51, 0x40, 0x7d9]); // q Q q Q at Greek_OMEGA
        set(92, &[XK_ISO_LEVEL3_SHIFT]);
        set(108, &[XK_ISO_LEVEL3_SHIFT, NO_SYMBOL, XK_ISO_LEVEL3_SHIFT]);
        // `shift:both_capslock`: Caps_Lock on the Shift keys' second level.
        set(50, &[XK_SHIFT_L, XK_CAPS_LOCK]);
        set(62, &[XK_SHIFT_R, XK_CAPS_LOCK]);
        set(66, &[XK_CAPS_LOCK]);
        let modmap = [50, 62, 66, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 92, 0];
        let de = Keymap::new(8, per, syms, &modmap);
        assert_eq!(de.held_mask([108]), 0x80, "right Alt: Mod5");
        assert_eq!(
            de.keysym(24, de.held_mask([108])),
            Some(0x40),
            "AltGr+q = @"
        );
        assert_eq!(
            de.held_mask([50]),
            SHIFT,
            "a Shift key with Caps_Lock above"
        );
        assert_eq!(de.lock_mask(), LOCK);
    }

    #[test]
    fn find_gives_the_key_and_the_shift_and_altgr_it_needs() {
        let us = layout(false);
        let p = |keycode, shift, level3| Place {
            keycode,
            shift,
            level3,
        };
        // de's z (keycode 29) is us's keycode 52; @ is AltGr+q on de, Shift+2 on us.
        assert_eq!(us.find(0x7a, Some(29)), Some(p(52, Some(false), false)));
        assert_eq!(us.find(0x5a, Some(29)), Some(p(52, Some(true), false)));
        assert_eq!(us.find(0x40, Some(24)), Some(p(11, Some(true), false)));
        // The same layout on both sides: the sender's key.
        assert_eq!(us.find(0x71, Some(24)), Some(p(24, Some(false), false)));
        // Keys whose level 2 is the same keysym leave Shift as it is.
        assert_eq!(us.find(XK_SHIFT_L, None), Some(p(50, None, false)));
        // Level 3 of us: EuroSign on e.
        assert_eq!(us.find(0x20ac, None), Some(p(26, Some(false), true)));
        // What us lacks: de's dead_circumflex, twosuperior.
        assert_eq!(us.find(0xfe52, Some(49)), None);
        assert_eq!(us.find(0xb2, None), None);
        let de = layout(true);
        assert_eq!(de.find(0x40, Some(11)), Some(p(24, Some(false), true)));
    }

    #[test]
    fn spare_keys_take_a_missing_keysym() {
        let mut us = layout(false);
        let spare = us.spare_keycodes();
        assert!(spare.contains(&30) && !spare.contains(&26), "{spare:?}");
        us.remap(30, 0xb2);
        assert_eq!(
            us.find(0xb2, None),
            Some(Place {
                keycode: 30,
                shift: None,
                level3: false
            })
        );
        assert_eq!(us.keysym(30, SHIFT), Some(0xb2));
    }

    #[test]
    fn case_pairs_cover_latin1_and_unicode() {
        assert_eq!(case_pair(0x61), (0x61, 0x41));
        assert_eq!(case_pair(0xc9), (0xe9, 0xc9), "É é");
        assert_eq!(case_pair(0xf7), (0xf7, 0xf7), "division sign");
        assert_eq!(case_pair(0x1000000 + 0x3b1), (0x10003b1, 0x1000391), "α Α");
        assert_eq!(case_pair(0xfe52), (0xfe52, 0xfe52));
        assert!(is_modifier(XK_ISO_LEVEL3_SHIFT) && is_modifier(0xffe3) && !is_modifier(0x61));
        assert!(is_lock(XK_CAPS_LOCK) && !is_lock(XK_SHIFT_L));
    }
}
