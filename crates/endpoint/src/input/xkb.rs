//! Layouts on a Wayland virtual keyboard, sans-IO: a key press annotated with the keysym the
//! source's layout gave (`EV_KEYSYM`, from an `x11-input` source) types that keysym on a
//! wlroots compositor, whatever the source's layout (`de`, `fr`, dead keys).
//!
//! A virtual keyboard brings its own keymap (xkeyboard-config's `us`, [`KEYMAP_US`]). A press
//! whose keysym the `us` layout gives on the same key goes by its key (so shortcuts and games
//! see the usual keys), with Shift set or cleared for that press when the keysym is on the
//! key's other level (the source's Caps Lock, the keypad under its Num Lock). A keysym `us`
//! has on another key (`z` on a German keyboard's `y` key, `@` from AltGr+q, Control on Caps
//! Lock with `ctrl:nocaps`, Colemak's letters) goes to that key, Shift set as it needs. Any
//! other keysym (`ü`, `ß`, `dead_circumflex`) is given to a spare keycode of the keymap, which
//! is uploaded again, and that key is pressed with Shift cleared: one level, so it types that
//! keysym and nothing else, as `wtype` does.
//! Lock keys (Caps Lock, Num Lock) and AltGr are not pressed: the source already applied them
//! to its keysyms. A spare given a keysym keeps it (no upload while the same keysyms are
//! typed); when every spare is given, the one given longest ago and not held goes to the
//! new keysym.

use super::keymap::{is_keypad, is_lock, is_modifier, XK_ISO_LEVEL3_SHIFT, XK_MODE_SWITCH};
use std::collections::HashMap;

/// xkeyboard-config's `us` layout as one resolved keymap (xkbcomp's output).
pub const KEYMAP_US: &str = include_str!("keymap-us.xkb");

/// Keycodes (xkb, Linux code + 8) of the `us` keymap free for keysyms it lacks: first those
/// with no symbols, then some launcher and radio keys (XF86Mail…XF86UWB, XF86Next_VMode…
/// XF86RFKill) that a source rarely presses; their names are looked up in the keymap.
const SPARES: [u16; 35] = [
    97, 103, 120, 132, 149, 154, 168, 178, 183, 184, 197, 202, 217, 219, 222, 230, 248, 237, 238,
    239, 240, 241, 242, 243, 244, 245, 246, 247, 249, 250, 251, 252, 253, 254, 255,
];

/// How a press is typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Press {
    /// Not pressed at all (a lock key or AltGr: the source applied it to its keysyms).
    Skip,
    /// Key `code` (Linux code), with Shift as it is (`None`) or set / cleared for this press
    /// (`Some`); the modifiers go back as they were after it.
    Key {
        /// Linux code to press.
        code: u16,
        /// Shift for this press, if it differs from the keys held.
        shift: Option<bool>,
        /// The keymap to upload first (a spare given a new keysym).
        keymap: Option<String>,
    },
}

/// The keys of a virtual keyboard and the keysyms its spares were given.
#[derive(Debug)]
pub struct Typist {
    /// Spare keys: (xkb keycode, its name in the keymap).
    spares: Vec<(u16, String)>,
    /// The keysym each spare holds (same order as `spares`), and when it was last given or
    /// typed (a counter).
    given: Vec<Option<(u32, u64)>>,
    clock: u64,
    /// Source key (Linux code) → the key pressed for it (`None`: skipped).
    held: HashMap<u16, Option<u16>>,
    /// What the `us` keymap's keys give.
    us: XkbKeys,
}

impl Default for Typist {
    fn default() -> Self {
        Typist::new()
    }
}

impl Typist {
    /// A typist over the `us` keymap.
    pub fn new() -> Typist {
        let names = keycode_names(KEYMAP_US);
        let spares: Vec<(u16, String)> = SPARES
            .iter()
            .filter_map(|&k| names.get(&k).map(|n| (k, n.clone())))
            .collect();
        Typist {
            given: vec![None; spares.len()],
            spares,
            clock: 0,
            held: HashMap::new(),
            us: XkbKeys::parse(KEYMAP_US),
        }
    }

    /// How to type the press of source key `code` annotated with `keysym`, while Shift is
    /// `shift` (held on this keyboard).
    pub fn press(&mut self, code: u16, keysym: u32, shift: bool) -> Press {
        self.clock += 1;
        if is_lock(keysym) || keysym == XK_ISO_LEVEL3_SHIFT || keysym == XK_MODE_SWITCH {
            self.held.insert(code, None);
            return Press::Skip;
        }
        let by_key = |shift: Option<bool>| Press::Key {
            code,
            shift,
            keymap: None,
        };
        let at = |c: u16, shift: bool| self.us.keysym(u32::from(c), u32::from(shift));
        let p = if at(code, shift) == Some(keysym) {
            by_key(None)
        } else if at(code, !shift) == Some(keysym) && !is_modifier(keysym) {
            // The source's Caps Lock, or the keypad under its Num Lock.
            by_key(Some(!shift))
        } else if let Some((c, needs_shift)) = self
            .us
            .find(keysym)
            // A key another source key holds down (`"` and `'` both on the us `'` key for
            // AZERTY, typed in a roll): a spare instead, so each releases its own.
            .filter(|&(c, _)| {
                !self
                    .held
                    .iter()
                    .any(|(src, h)| *src != code && *h == Some(c as u16))
            })
        {
            // On another key here (`ctrl:nocaps`, `caps:escape`, Colemak, Dvorak): that key.
            Press::Key {
                code: c as u16,
                shift: (!is_modifier(keysym) && needs_shift != shift).then_some(needs_shift),
                keymap: None,
            }
        } else {
            self.spare(keysym)
        };
        if p == Press::Skip {
            // Not pressed here: nothing to release either.
            self.held.insert(code, None);
        }
        if let Press::Key { code: sent, .. } = &p {
            self.held.insert(code, Some(*sent));
        }
        p
    }

    /// The key to release for source key `code`: the one pressed for it (`None`: nothing, it
    /// was skipped); a key never annotated goes by its own code.
    pub fn release(&mut self, code: u16) -> Option<u16> {
        self.held.remove(&code).unwrap_or(Some(code))
    }

    /// A spare key typing `keysym` (given it now if none holds it).
    fn spare(&mut self, keysym: u32) -> Press {
        let now = self.clock;
        if let Some(i) = self
            .given
            .iter()
            .position(|g| g.is_some_and(|(k, _)| k == keysym))
        {
            self.given[i] = Some((keysym, now));
            return Press::Key {
                code: self.spares[i].0 - 8,
                shift: Some(false),
                keymap: None,
            };
        }
        let held: Vec<u16> = self.held.values().flatten().copied().collect();
        // A spare never given, else the one given or typed longest ago that is not held.
        let free = self.given.iter().position(|g| g.is_none()).or_else(|| {
            (0..self.spares.len())
                .filter(|&i| !held.contains(&(self.spares[i].0 - 8)))
                .min_by_key(|&i| self.given[i].map_or(0, |(_, t)| t))
        });
        let Some(i) = free else {
            // Every spare held at once (35 keys): this one is not typed.
            return Press::Skip;
        };
        self.given[i] = Some((keysym, now));
        Press::Key {
            code: self.spares[i].0 - 8,
            shift: Some(false),
            keymap: Some(self.keymap()),
        }
    }

    /// The keymap with each spare's keysym: its own symbols (if it had any) left out, one
    /// level with the keysym added at the end of `xkb_symbols`.
    pub fn keymap(&self) -> String {
        let mut ours: Vec<(&str, u32)> = Vec::new();
        for ((_, name), g) in self.spares.iter().zip(&self.given) {
            if let Some((k, _)) = g {
                ours.push((name.as_str(), *k));
            }
        }
        with_symbols(KEYMAP_US, &ours)
    }
}

/// xkb keycode → its name, from a keymap's `xkb_keycodes` section.
fn keycode_names(keymap: &str) -> HashMap<u16, String> {
    let section = section(keymap, "xkb_keycodes").unwrap_or("");
    section
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let (name, rest) = l.strip_prefix('<')?.split_once('>')?;
            let code = rest.trim().strip_prefix('=')?.trim().strip_suffix(';')?;
            Some((code.trim().parse().ok()?, name.to_string()))
        })
        .collect()
}

/// The text of section `name` (from its keyword to its closing `};` at the start of a line).
fn section<'a>(keymap: &'a str, name: &str) -> Option<&'a str> {
    let start = keymap.find(name)?;
    let end = keymap[start..].find("\n};")? + start;
    Some(&keymap[start..end])
}

/// `keymap` with `ours` (key name, keysym) as one-level keys at the end of `xkb_symbols`,
/// those keys' own entries left out.
fn with_symbols(keymap: &str, ours: &[(&str, u32)]) -> String {
    let Some(start) = keymap.find("xkb_symbols") else {
        return keymap.to_string();
    };
    let Some(end) = keymap[start..].find("\n};").map(|e| e + start) else {
        return keymap.to_string();
    };
    let mut out = String::with_capacity(keymap.len() + ours.len() * 40);
    out.push_str(&keymap[..start]);
    let mut rest = &keymap[start..end];
    // Leave out `key <NAME> { … };` of each spare (entries may span lines).
    while let Some(at) = rest.find("key <") {
        let name_end = rest[at + 5..].find('>').map(|e| at + 5 + e);
        let entry_end = rest[at..].find("};").map(|e| at + e + 2);
        let (Some(name_end), Some(entry_end)) = (name_end, entry_end) else {
            break;
        };
        let name = &rest[at + 5..name_end];
        out.push_str(&rest[..at]);
        if !ours.iter().any(|(n, _)| *n == name) {
            out.push_str(&rest[at..entry_end]);
        }
        rest = &rest[entry_end..];
    }
    out.push_str(rest);
    for (name, k) in ours {
        out.push_str(&format!("\n    key <{name}> {{ [ 0x{k:x} ] }};"));
    }
    out.push_str(&keymap[end..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: u32 = 0x40;
    const Z: u32 = 0x7a;
    const UDIAERESIS: u32 = 0xfc;
    const SSHARP: u32 = 0xdf;
    const F1: u32 = 0xffbe;
    const KP_1: u32 = 0xffb1;

    fn key(p: &Press) -> (u16, Option<bool>, bool) {
        match p {
            Press::Key {
                code,
                shift,
                keymap,
            } => (*code, *shift, keymap.is_some()),
            Press::Skip => panic!("skipped"),
        }
    }

    #[test]
    fn keys_the_us_layout_types_the_same_go_by_their_key() {
        let mut t = Typist::new();
        // `a` on the a key; `A` with Shift held; `A` under the source's Caps Lock (Shift set
        // for the press); Return, F1 and Shift itself by their keys.
        assert_eq!(key(&t.press(30, 0x61, false)), (30, None, false));
        assert_eq!(key(&t.press(30, 0x41, true)), (30, None, false));
        assert_eq!(key(&t.press(30, 0x41, false)), (30, Some(true), false));
        assert_eq!(key(&t.press(28, 0xff0d, false)), (28, None, false));
        assert_eq!(key(&t.press(59, F1, false)), (59, None, false));
        assert_eq!(key(&t.press(42, 0xffe1, false)), (42, None, false));
        assert_eq!(t.release(30), Some(30));
        assert_eq!(
            t.release(99),
            Some(99),
            "a key never annotated goes by its code"
        );
    }

    #[test]
    fn other_layouts_keysyms_go_to_spare_keys_given_them_in_the_keymap() {
        let mut t = Typist::new();
        // A German keyboard: `z` on the us `y` key (Linux 21) and `@` from AltGr+q (16) go
        // to the us keys that give them; `ü` and `ß`, which us lacks, to spare keys.
        assert_eq!(t.press(100, XK_ISO_LEVEL3_SHIFT, false), Press::Skip);
        assert_eq!(key(&t.press(21, Z, false)), (44, None, false));
        assert_eq!(key(&t.press(16, AT, false)), (3, Some(true), false));
        let (u_key, shift, upload) = key(&t.press(26, UDIAERESIS, false));
        assert_eq!((shift, upload), (Some(false), true));
        assert_eq!(u_key, 97 - 8, "the first spare (keycode 97)");
        let Press::Key {
            keymap: Some(km), ..
        } = t.press(12, SSHARP, false)
        else {
            panic!("a new keysym uploads the keymap")
        };
        assert!(
            km.contains("key <AB11> { [ 0xfc ] };"),
            "ü on the first spare"
        );
        assert!(km.contains("key <JPCM> { [ 0xdf ] };"), "ß on the second");
        assert!(
            km.contains("XF86KbdBrightnessUp"),
            "spares not given keep theirs"
        );
        // A spare's own symbols are left out (I237: XF86KbdBrightnessDown).
        let mut u = Typist::new();
        for k in 0..18u32 {
            u.press(0, 0x1000100 + k, false);
            u.release(0);
        }
        let km = u.keymap();
        assert!(
            !km.contains("XF86KbdBrightnessDown"),
            "the spare's own symbol went"
        );
        assert!(km.contains("key <I237> { [ 0x1000111 ] };"));
        // The same keysym again: the same spare, no upload.
        assert_eq!(t.release(26), Some(u_key));
        assert_eq!(
            key(&t.press(26, UDIAERESIS, true)),
            (u_key, Some(false), false)
        );
        assert_eq!(t.release(26), Some(u_key));
        assert_eq!(t.release(100), None, "AltGr was not pressed here");
        // The keypad's digits under the source's Num Lock (its key with Shift), and Caps Lock
        // itself (not pressed: the source applied it).
        assert_eq!(key(&t.press(79, KP_1, false)), (79, Some(true), false));
        assert_eq!(t.press(58, 0xffe5, false), Press::Skip);
        assert_eq!(t.release(58), None);
    }

    /// Layouts and options that move keys: `ctrl:nocaps` (Caps is Control), `caps:escape`,
    /// Colemak's `s` on the us `d` key; each goes to the key that gives it here.
    #[test]
    fn keysyms_on_other_keys_go_to_the_key_that_gives_them_here() {
        let mut t = Typist::new();
        assert_eq!(
            key(&t.press(58, 0xffe3, false)),
            (29, None, false),
            "Control_L"
        );
        assert_eq!(t.release(58), Some(29));
        assert_eq!(key(&t.press(58, 0xff1b, false)), (1, None, false), "Escape");
        assert_eq!(key(&t.press(32, 0x73, false)), (31, None, false), "s");
        assert_eq!(key(&t.press(32, 0x53, false)), (31, Some(true), false), "S");
        assert_eq!(
            key(&t.press(32, 0x53, true)),
            (31, None, false),
            "S, Shift held"
        );
        // AZERTY's `"` (key 4) held while `'` (key 5) is pressed: both are on the us `'` key;
        // the second goes to a spare, so each key releases its own.
        let mut t = Typist::new();
        assert_eq!(key(&t.press(4, 0x22, false)), (40, Some(true), false));
        let (second, _, upload) = key(&t.press(5, 0x27, false));
        assert!(upload && second != 40, "a spare: {second}");
        assert_eq!(t.release(4), Some(40));
        assert_eq!(t.release(5), Some(second));
    }

    #[test]
    fn when_every_spare_is_given_the_longest_unused_one_not_held_goes() {
        let mut t = Typist::new();
        let n = t.spares.len() as u32;
        assert_eq!(n, 35, "every spare named in the keymap");
        // Spare 0 held down while all are given.
        let (first, ..) = key(&t.press(1, 0x1000100, false));
        for k in 1..n {
            t.press(2, 0x1000100 + k, false);
            t.release(2);
        }
        // Typing keysym 1 again makes spare 1 recent: the next new keysym takes spare 2.
        t.press(2, 0x1000101, false);
        t.release(2);
        let (code, _, upload) = key(&t.press(3, 0x1000200, false));
        assert!(upload);
        assert_ne!(code, first, "a held spare is never taken");
        assert_eq!(code, t.spares[2].0 - 8);
    }

    #[test]
    fn the_keymap_stays_one_keymap() {
        let mut t = Typist::new();
        t.press(26, UDIAERESIS, false);
        let km = t.keymap();
        assert!(km.starts_with("xkb_keymap {"));
        assert_eq!(km.matches("xkb_symbols").count(), 1);
        assert_eq!(km.matches("xkb_geometry").count(), 1);
        let symbols = section(&km, "xkb_symbols").unwrap();
        assert!(
            symbols.ends_with("key <AB11> { [ 0xfc ] };"),
            "{}",
            &symbols[symbols.len() - 80..]
        );
        assert_eq!(
            km.len(),
            KEYMAP_US.len() + "\n    key <AB11> { [ 0xfc ] };".len(),
            "nothing else changed (keycode 97, AB11, had no symbols)"
        );
    }
}

/// The keysym named `name` in an xkb keymap: a name of keysymdef.h (`udiaeresis`), `Uxxxx` (a
/// Unicode character), a number (`0x1000040`), or one character (`a`, `5`).
pub fn keysym_by_name(name: &str) -> Option<u32> {
    use super::keysyms::KEYSYMS;
    if let Ok(i) = KEYSYMS.binary_search_by(|(n, _)| n.as_bytes().cmp(name.as_bytes())) {
        return Some(KEYSYMS[i].1);
    }
    if let Some(hex) = name.strip_prefix("0x") {
        return u32::from_str_radix(hex, 16).ok();
    }
    if let Some(hex) = name.strip_prefix('U') {
        if let Ok(c) = u32::from_str_radix(hex, 16) {
            // Latin-1 characters are their own keysyms; others are 0x01000000 + code point.
            return Some(
                if (0x20..=0x7e).contains(&c) || (0xa0..=0xff).contains(&c) {
                    c
                } else {
                    0x0100_0000 + c
                },
            );
        }
    }
    let mut chars = name.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) if c.is_ascii_graphic() => Some(c as u32),
        _ => None,
    }
}

/// A key entry's groups of keysyms: `symbols[GroupN]= [ … ]` lists by their group, or, in the
/// plain form, every `[ … ]` list in order (`[ a, A ], [ Cyrillic_ef, Cyrillic_EF ]`).
fn groups_of(body: &str) -> Vec<Vec<u32>> {
    let list = |s: &str| -> Option<Vec<u32>> {
        let open = s.find('[')?;
        let close = s[open..].find(']')? + open;
        // Levels split at top-level commas; a level of several keysyms (`{ a, b }`, which
        // xkbcommon can write) counts as its first.
        let mut levels = Vec::new();
        let (mut depth, mut start) = (0usize, open + 1);
        for (i, c) in s[open + 1..close].char_indices() {
            let at = open + 1 + i;
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                ',' if depth == 0 => {
                    levels.push(&s[start..at]);
                    start = at + 1;
                }
                _ => {}
            }
        }
        levels.push(&s[start..close]);
        Some(
            levels
                .into_iter()
                .map(|l| {
                    let first = l.trim().trim_start_matches('{').split([',', '}']).next();
                    keysym_by_name(first.unwrap_or("").trim()).unwrap_or(0)
                })
                .collect(),
        )
    };
    let mut groups: Vec<Vec<u32>> = Vec::new();
    if body.contains("symbols[") {
        let mut rest = body;
        while let Some(at) = rest.find("symbols[") {
            let tail = &rest[at + "symbols[".len()..];
            let Some(close) = tail.find(']') else { break };
            let n: usize = tail[..close]
                .trim()
                .trim_start_matches(['G', 'g'])
                .trim_start_matches("roup")
                .parse()
                .unwrap_or(1);
            let after = &tail[close + 1..];
            if let Some(levels) = list(after) {
                let i = n.clamp(1, 4) - 1;
                if groups.len() <= i {
                    groups.resize(i + 1, Vec::new());
                }
                groups[i] = levels;
            }
            rest = after;
        }
    } else {
        let mut rest = body;
        while let Some(open) = rest.find('[') {
            let Some(levels) = list(&rest[open..]) else {
                break;
            };
            groups.push(levels);
            rest = &rest[open + 1..];
            rest = rest.find(']').map_or("", |c| &rest[c + 1..]);
        }
    }
    groups
}

/// A compositor's keymap (the xkb text a `wl_keyboard` gets), read as far as telling which
/// keysym each key gives: every group's levels of every key, and the modifier bits of Shift,
/// Caps Lock, AltGr and Num Lock (xkb's real modifiers, in the `wl_keyboard.modifiers` masks).
#[derive(Debug, Default, Clone)]
pub struct XkbKeys {
    /// Each group's levels, by Linux code (xkb keycode − 8).
    keys: HashMap<u32, Vec<Vec<u32>>>,
    /// Those codes, lowest first (where [`XkbKeys::find`] looks).
    order: Vec<u32>,
    level3: u32,
    num_lock: u32,
}

/// Shift and Lock (Caps Lock) as xkb's real modifier bits.
const MOD_SHIFT: u32 = 1;
const MOD_LOCK: u32 = 2;

impl XkbKeys {
    /// Reads `text`; keys and names it does not know are left out (they go without keysym).
    pub fn parse(text: &str) -> XkbKeys {
        let mut codes: HashMap<String, u32> = HashMap::new();
        let kc = section(text, "xkb_keycodes").unwrap_or("");
        for l in kc.lines() {
            let l = l.trim();
            if let Some((name, rest)) = l.strip_prefix('<').and_then(|l| l.split_once('>')) {
                let v = rest
                    .trim()
                    .trim_start_matches('=')
                    .trim()
                    .trim_end_matches(';');
                if let Ok(code) = v.trim().parse::<u32>() {
                    codes.insert(name.to_string(), code);
                }
            }
        }
        for l in kc.lines() {
            let l = l.trim();
            if let Some(rest) = l.strip_prefix("alias") {
                let parts: Vec<&str> = rest
                    .split(['<', '>', '=', ';', ' '])
                    .filter(|s| !s.is_empty())
                    .collect();
                if let [alias, real] = parts[..] {
                    if let Some(&c) = codes.get(real) {
                        codes.insert(alias.to_string(), c);
                    }
                }
            }
        }
        let mut keys: HashMap<u32, Vec<Vec<u32>>> = HashMap::new();
        let syms = section(text, "xkb_symbols").unwrap_or("");
        let mut rest = syms;
        let mut modmaps: Vec<(u32, Vec<String>)> = Vec::new();
        while let Some(at) = rest.find(['k', 'm']) {
            let tail = &rest[at..];
            if let Some(entry) = tail
                .strip_prefix("key")
                .and_then(|t| t.trim_start().strip_prefix('<'))
            {
                let Some(end) = entry.find("};") else {
                    break;
                };
                let body = &entry[..end];
                if let Some(&code) = body.split_once('>').and_then(|(n, _)| codes.get(n)) {
                    let groups = groups_of(body);
                    if code >= 8 && !groups.is_empty() {
                        keys.insert(code - 8, groups);
                    }
                }
                rest = &entry[end..];
            } else if let Some(entry) = tail.strip_prefix("modifier_map ") {
                let Some(end) = entry.find(';') else {
                    break;
                };
                let body = &entry[..end];
                let bit = [
                    "Shift", "Lock", "Control", "Mod1", "Mod2", "Mod3", "Mod4", "Mod5",
                ]
                .iter()
                .position(|m| body.starts_with(m));
                if let Some(bit) = bit {
                    let names = body
                        .split(['{', '}', ',', '<', '>', ' '])
                        .skip(1)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect();
                    modmaps.push((1 << bit, names));
                }
                rest = &entry[end..];
            } else {
                rest = &tail[1..];
            }
        }
        // The modifier a keysym's key sets (by the key names in `modifier_map`).
        let mask_of = |keysym: u32, default: u32| {
            modmaps
                .iter()
                .find(|(_, names)| {
                    names.iter().any(|n| {
                        codes
                            .get(n.as_str())
                            .and_then(|c| keys.get(&c.wrapping_sub(8)))
                            .is_some_and(|g| g.iter().any(|l| l.contains(&keysym)))
                    })
                })
                .map_or(default, |(m, _)| *m)
        };
        let mut order: Vec<u32> = keys.keys().copied().collect();
        order.sort_unstable();
        XkbKeys {
            level3: mask_of(XK_ISO_LEVEL3_SHIFT, 1 << 7),
            num_lock: mask_of(super::keymap::XK_NUM_LOCK, 1 << 4),
            keys,
            order,
        }
    }

    /// A key giving `keysym` at its first or second level (the lowest such code): the key,
    /// and whether it needs Shift.
    pub fn find(&self, keysym: u32) -> Option<(u32, bool)> {
        self.order.iter().copied().find_map(|c| {
            self.keys[&c]
                .first()?
                .iter()
                .take(2)
                .position(|&k| k == keysym)
                .map(|i| (c, i == 1))
        })
    }

    /// Whether it knows any key (a keymap was read).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keysym key `code` (Linux) gives with modifiers `mods` (depressed, latched and
    /// locked together), as `XLookupKeysym` picks levels: Shift (and Caps Lock for letters,
    /// Num Lock for the keypad) the second, AltGr the third and fourth.
    pub fn keysym(&self, code: u32, mods: u32) -> Option<u32> {
        self.keysym_in(code, mods, 0)
    }

    /// [`XkbKeys::keysym`] in layout group `group` (0 is the first; past the key's last group
    /// it wraps, as xkb's default does).
    pub fn keysym_in(&self, code: u32, mods: u32, group: u32) -> Option<u32> {
        let groups = self.keys.get(&code)?;
        let levels = groups.get(group as usize % groups.len())?;
        let first = *levels.first()?;
        let (lo, up) = super::keymap::case_pair(first);
        let alphabetic = lo != up && levels.get(1).is_none_or(|&s| s == up);
        let mut shift = mods & MOD_SHIFT != 0;
        if (alphabetic && mods & MOD_LOCK != 0)
            || (is_keypad(levels.get(1).copied().unwrap_or(0)) && mods & self.num_lock != 0)
        {
            shift = !shift;
        }
        let base = if mods & self.level3 != 0 { 2 } else { 0 };
        let pick = |i: usize| levels.get(i).copied().filter(|&s| s != 0);
        let k = pick(base + usize::from(shift))
            .or_else(|| pick(base))
            .or_else(|| pick(usize::from(shift)))
            .or(Some(first).filter(|&s| s != 0))?;
        // A letter on a key without a second level: Shift or Caps Lock make it upper case.
        if levels.len() == 1 && alphabetic && shift {
            return Some(up);
        }
        Some(k)
    }
}

#[cfg(test)]
mod keymap_tests {
    use super::*;

    #[test]
    fn keysym_names_as_keymaps_write_them() {
        assert_eq!(keysym_by_name("a"), Some(0x61));
        assert_eq!(keysym_by_name("udiaeresis"), Some(0xfc));
        assert_eq!(keysym_by_name("ISO_Level3_Shift"), Some(0xfe03));
        assert_eq!(keysym_by_name("EuroSign"), Some(0x20ac));
        assert_eq!(keysym_by_name("dead_circumflex"), Some(0xfe52));
        assert_eq!(keysym_by_name("Cyrillic_a"), Some(0x6c1));
        assert_eq!(keysym_by_name("U263A"), Some(0x100263a));
        assert_eq!(keysym_by_name("U00E4"), Some(0xe4));
        assert_eq!(keysym_by_name("0x1000040"), Some(0x1000040));
        assert_eq!(keysym_by_name("NoSuchKeysym"), None);
    }

    /// xkbcomp's `us` keymap read as a compositor would send it: letters, Shift, Caps Lock,
    /// digits and their symbols, the keypad under Num Lock.
    #[test]
    fn the_us_keymap_gives_the_keysyms_xlib_does() {
        let k = XkbKeys::parse(KEYMAP_US);
        assert!(!k.is_empty());
        assert_eq!(k.keysym(30, 0), Some(0x61), "a");
        assert_eq!(k.keysym(30, MOD_SHIFT), Some(0x41), "A");
        assert_eq!(k.keysym(30, MOD_LOCK), Some(0x41), "Caps Lock");
        assert_eq!(k.keysym(30, MOD_LOCK | MOD_SHIFT), Some(0x61));
        assert_eq!(k.keysym(3, MOD_SHIFT), Some(0x40), "@ on 2");
        assert_eq!(k.keysym(3, MOD_LOCK), Some(0x32), "Caps Lock leaves digits");
        assert_eq!(k.keysym(1, 0), Some(0xff1b), "Escape");
        assert_eq!(k.keysym(125, 0), Some(0xffeb), "Super_L");
        assert_eq!(k.keysym(79, 0), Some(0xff9c), "KP_End");
        assert_eq!(k.keysym(79, 1 << 4), Some(0xffb1), "KP_1 under Num Lock");
        assert_eq!(k.keysym(250, 0), None, "no such key");
    }

    /// A German keymap's fragment as xkbcommon writes it (types, levels, AltGr on Mod5), and
    /// the keymap `wtype` uploads (one level per key, keys numbered from 9).
    #[test]
    fn other_layouts_and_one_level_keymaps_are_read() {
        let de = r#"xkb_keymap {
xkb_keycodes "evdev+aliases(qwertz)" {
    minimum = 8;
    maximum = 255;
    <AD01> = 24;
    <AD06> = 29;
    <AB01> = 52;
    <RALT> = 108;
    alias <LatZ> = <AB01>;
};
xkb_types "complete" { };
xkb_symbols "pc+de" {
    key <AD01> {
        type= "FOUR_LEVEL_SEMIALPHABETIC",
        symbols[Group1]= [               q,               Q,              at,     Greek_OMEGA ]
    };
    key <AD06> { type= "FOUR_LEVEL_ALPHABETIC", symbols[Group1]= [ z, Z, leftarrow, yen ] };
    key <LatZ> { [ y, Y, guillemotright, U203A ] };
    key <RALT> { type= "ONE_LEVEL", symbols[Group1]= [ ISO_Level3_Shift ] };
    modifier_map Mod5 { <RALT> };
};
};"#;
        let k = XkbKeys::parse(de);
        assert_eq!(k.keysym(21, 0), Some(0x7a), "z on de's y key");
        assert_eq!(k.keysym(44, MOD_SHIFT), Some(0x59), "Y through an alias");
        assert_eq!(k.keysym(16, 1 << 7), Some(0x40), "AltGr+q is @");
        assert_eq!(k.keysym(44, (1 << 7) | MOD_SHIFT), Some(0x100203a));
        assert_eq!(k.keysym(100, 0), Some(0xfe03));
        // Two groups, as xkbcommon writes them with a type: each its own list.
        let two = "xkb_keymap {\nxkb_keycodes \"x\" {\n<AD01> = 24;\n};\nxkb_symbols \"x\" {\n    key <AD01> {\n        type[Group1]= \"ALPHABETIC\",\n        type[Group2]= \"ALPHABETIC\",\n        symbols[Group1]= [ q, Q ],\n        symbols[Group2]= [ Cyrillic_shorti, Cyrillic_SHORTI ]\n    };\n};\n};\n";
        let k = XkbKeys::parse(two);
        assert_eq!(k.keysym_in(16, 0, 0), Some(0x71));
        // A level of several keysyms counts as its first; the levels after it stay in place.
        let multi = "xkb_keymap {\nxkb_keycodes \"x\" {\n<AD01> = 24;\n};\nxkb_symbols \"x\" {\n    key <AD01> { [ { q, x }, Q ] };\n};\n};\n";
        let m = XkbKeys::parse(multi);
        assert_eq!(m.keysym(16, 0), Some(0x71));
        assert_eq!(m.keysym(16, MOD_SHIFT), Some(0x51));
        assert_eq!(
            k.keysym_in(16, MOD_SHIFT, 1),
            Some(0x6ea),
            "Cyrillic_SHORTI"
        );
        assert_eq!(
            k.keysym_in(16, 0, 2),
            Some(0x71),
            "a group past the last wraps"
        );
        let wtype = "xkb_keymap {\nxkb_keycodes \"(unnamed)\" {\nminimum = 8;\nmaximum = 11;\n<K1> = 9;\n<K2> = 10;\n};\nxkb_types \"(unnamed)\" { include \"complete\" };\nxkb_compatibility \"(unnamed)\" { include \"complete\" };\nxkb_symbols \"(unnamed)\" {\nkey <K1> {[ h ]};\nkey <K2> {[ i ]};\n};\n};\n";
        let k = XkbKeys::parse(wtype);
        assert_eq!(
            k.keysym(1, 0),
            Some(0x68),
            "wtype's h on the Escape key's code"
        );
        assert_eq!(
            k.keysym(2, MOD_SHIFT),
            Some(0x49),
            "one level: Shift makes a capital"
        );
    }
}
