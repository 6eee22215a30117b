//! The input sinks: `uinput` (a virtual input device with the capabilities the source sent)
//! and `xtest` (injection into an X display). Both run the same loop over an [`Injector`]:
//! decode each record, track the keys and buttons held, apply it.
//!
//! Both run as blocking tasks (`spawn_blocking`). Every sink releases the keys and buttons it
//! still holds when its channel closes, on a release-all record, and before it reports an
//! error.

use super::config::{UinputConfig, XtestConfig};
use super::keymap::{is_lock, is_modifier, Keymap, Place, XK_ISO_LEVEL3_SHIFT, XK_SHIFT_L};
use super::record::{
    x_keycode_to_linux, Capabilities, Event, Held, InputMessage, XAction, XMapper, EV_KEY,
    EV_KEYSYM,
};
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::{SinkReport, SinkTask};
use crate::common::x11::{x11_connect, x11_err};
use ndd_core::Frame;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use tokio::runtime::Handle;
use tokio::sync::mpsc::Receiver;
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{self, ConnectionExt as _};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

/// Checks for `/dev/uinput` and starts a `uinput` sink (the device is created on the first
/// capabilities record).
pub(crate) fn spawn_uinput_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &UinputConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let u = open_uinput(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_uinput_sink(endpoint, u, rx, delivered)))
}

/// Connects an `xtest` sink to its display and starts it.
pub(crate) fn spawn_xtest_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &XtestConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let x = open_xtest(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_xtest_sink(endpoint, x, rx, delivered)))
}

/// What a sink endpoint does with decoded records.
pub(crate) trait Injector {
    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError>;
    /// Applies one batch (already observed by `held`).
    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError>;
    /// Whether a frame of events stamped as `meta` is stale (typed before the sink could
    /// inject anything: dropped, never injected late); no sink's but `portal-input`'s.
    fn stale(&mut self, _meta: &ndd_core::Meta) -> bool {
        false
    }
    /// The viewer asks for the screen to be this size; a sink with no screen ignores it.
    fn screen_size(&mut self, width: u16, height: u16) -> Result<(), EndpointError> {
        tracing::debug!(
            width,
            height,
            "a screen size asked of a sink with no screen; ignored"
        );
        Ok(())
    }
}

/// Decodes records and applies them; releases everything held at a release-all record, at
/// the end of the stream and before returning an error. Marks each frame in `delivered` once
/// applied (injected and flushed; a bad record, which stops the sink, once rejected).
pub(crate) fn run_injector(
    endpoint: &'static str,
    inj: &mut dyn Injector,
    mut rx: Receiver<Frame>,
    delivered: &Delivered,
) -> Result<SinkReport, EndpointError> {
    let mut held = Held::default();
    let mut report = SinkReport::default();
    let release = |inj: &mut dyn Injector, held: &mut Held| {
        let ev = held.release_all();
        if ev.is_empty() {
            return Ok(());
        }
        tracing::debug!(endpoint, keys = ev.len(), "releasing held keys and buttons");
        inj.events(&ev)
    };
    let result = (|| {
        while let Some(frame) = rx.blocking_recv() {
            report.frames += 1;
            report.bytes += frame.len() as u64;
            let msg = match InputMessage::parse(frame.payload()) {
                Ok(msg) => msg,
                Err(source) => {
                    // Rejected: nothing more will ever be done with it.
                    delivered.mark(frame.meta.seq);
                    return Err(EndpointError::BadInput {
                        endpoint,
                        seq: frame.meta.seq,
                        source,
                    });
                }
            };
            match msg {
                InputMessage::Capabilities(c) => {
                    release(inj, &mut held)?;
                    inj.capabilities(&c)?;
                }
                // (A stale key press dropped, its release is not held: not applied either.)
                InputMessage::Events(_) if inj.stale(&frame.meta) => {}
                InputMessage::Events(mut ev) => {
                    // A release of a key this sink does not hold (released already when the
                    // link went) is not applied: the application sees one release per press.
                    ev.retain(|e| e.ty != EV_KEY || e.value != 0 || held.holds(e.code));
                    for e in &ev {
                        held.observe(e);
                    }
                    if !ev.is_empty() {
                        inj.events(&ev)?;
                    }
                }
                InputMessage::ReleaseAll => release(inj, &mut held)?,
                InputMessage::ScreenSize { width, height } => inj.screen_size(width, height)?,
            }
            // Injected and flushed (xtest flushes, uinput writes, in `events`). The session's
            // own release-all records (seq `INJECTED_SEQ`) are not marked.
            delivered.mark(frame.meta.seq);
        }
        Ok(())
    })();
    let released = release(inj, &mut held);
    result?;
    released?;
    tracing::debug!(endpoint, frames = report.frames, "sink ended");
    Ok(report)
}

// ---------------------------------------------------------------------------------------
// xtest sink

pub(crate) struct Xtest {
    conn: RustConnection,
    root: xproto::Window,
    mapper: XMapper,
    display: String,
    endpoint: &'static str,
    actions: Vec<XAction>,
    /// This display's layout, for keysyms (refreshed on `MappingNotify`).
    keymap: Keymap,
    /// The key pressed for each source key typed by keysym (released with it); `None` for
    /// a lock key, which is not pressed here (the source applied it to its keysyms).
    typed: HashMap<u16, Option<u8>>,
    /// Keycodes this sink holds down.
    down: BTreeSet<u8>,
    /// Spare keycodes this sink gave a keysym, oldest first (given back at the end).
    remapped: Vec<u8>,
    /// The Shift/AltGr changes made for the key typed last (by source key code), undone when
    /// it is released or anything else happens: while it is held alone, the X server's
    /// autorepeat repeats it as typed (`@` as Shift+2 repeats `@`, not `2`).
    held_with: Option<(u16, Vec<(u8, bool)>)>,
    /// What the server refused to resize to, said once a second at most.
    resize_refused: ndd_core::ratelimit::RateLimit,
}

impl std::fmt::Debug for Xtest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Xtest({})", self.display)
    }
}

/// Reads a display's keyboard and modifier mapping.
pub(crate) fn read_keymap(conn: &RustConnection) -> Result<Keymap, String> {
    let setup = conn.setup();
    let (min, max) = (setup.min_keycode, setup.max_keycode);
    let map = conn
        .get_keyboard_mapping(min, max - min + 1)
        .map_err(|e| e.to_string())?
        .reply()
        .map_err(|e| e.to_string())?;
    let mods = conn
        .get_modifier_mapping()
        .map_err(|e| e.to_string())?
        .reply()
        .map_err(|e| e.to_string())?;
    Ok(Keymap::new(
        min,
        usize::from(map.keysyms_per_keycode),
        map.keysyms,
        &mods.keycodes,
    ))
}

/// Connects and checks for the XTEST extension.
fn open_xtest(endpoint: &'static str, c: &XtestConfig) -> Result<Xtest, EndpointError> {
    let (conn, screen_num) = x11_connect(endpoint, &c.display)?;
    let screen = conn
        .setup()
        .roots
        .get(screen_num)
        .cloned()
        .ok_or_else(|| x11_err(endpoint, &c.display, format!("no screen {screen_num}")))?;
    conn.xtest_get_version(2, 2)
        .map_err(|e| x11_err(endpoint, &c.display, e))?
        .reply()
        .map_err(|e| EndpointError::Unavailable {
            endpoint,
            what: format!("X display {}: no XTEST extension ({e})", c.display),
            hint: "start the X server with XTEST enabled (Xorg and Xvfb have it by default)"
                .to_string(),
        })?;
    let keymap = read_keymap(&conn).map_err(|e| x11_err(endpoint, &c.display, e))?;
    Ok(Xtest {
        conn,
        root: screen.root,
        mapper: XMapper::new(screen.width_in_pixels, screen.height_in_pixels),
        display: c.display.clone(),
        endpoint,
        actions: Vec::new(),
        keymap,
        typed: HashMap::new(),
        down: BTreeSet::new(),
        remapped: Vec::new(),
        held_with: None,
        resize_refused: ndd_core::ratelimit::RateLimit::default(),
    })
}

impl Xtest {
    fn fake(&mut self, ty: u8, detail: u8, x: i16, y: i16) -> Result<(), EndpointError> {
        let root = if ty == xproto::MOTION_NOTIFY_EVENT && detail == 0 {
            self.root
        } else {
            x11rb::NONE
        };
        self.conn
            .xtest_fake_input(ty, detail, x11rb::CURRENT_TIME, root, x, y, 0)
            .map_err(|e| x11_err(self.endpoint, &self.display, e))?;
        Ok(())
    }

    fn key(&mut self, keycode: u8, press: bool) -> Result<(), EndpointError> {
        if press {
            self.down.insert(keycode);
            self.fake(xproto::KEY_PRESS_EVENT, keycode, 0, 0)
        } else {
            self.down.remove(&keycode);
            self.fake(xproto::KEY_RELEASE_EVENT, keycode, 0, 0)
        }
    }

    /// Undoes the modifier changes made for the key typed last, if any.
    fn settle(&mut self) -> Result<(), EndpointError> {
        if let Some((_, undo)) = self.held_with.take() {
            for (k, press) in undo.into_iter().rev() {
                self.key(k, press)?;
            }
        }
        Ok(())
    }

    /// Takes in `MappingNotify` (another program, or `setxkbmap`, changed the layout).
    fn refresh_keymap(&mut self) -> Result<(), EndpointError> {
        let mut changed = false;
        while let Some(ev) = self
            .conn
            .poll_for_event()
            .map_err(|e| x11_err(self.endpoint, &self.display, e))?
        {
            changed |= matches!(ev, x11rb::protocol::Event::MappingNotify(_));
        }
        if changed {
            self.keymap =
                read_keymap(&self.conn).map_err(|e| x11_err(self.endpoint, &self.display, e))?;
        }
        Ok(())
    }

    /// Gives a spare keycode `keysym` (every level), for a keysym this layout lacks.
    fn remap_spare(&mut self, keysym: u32) -> Result<Option<Place>, EndpointError> {
        let spares: Vec<u8> = self
            .keymap
            .spare_keycodes()
            .into_iter()
            .chain(self.remapped.iter().copied())
            .filter(|c| !self.down.contains(c))
            .collect();
        // A never-used spare first, else the one given a keysym longest ago.
        let Some(&keycode) = spares
            .iter()
            .find(|c| !self.remapped.contains(c))
            .or_else(|| self.remapped.iter().find(|c| spares.contains(c)))
        else {
            return Ok(None);
        };
        let per = self.keymap.per().max(1);
        self.conn
            .change_keyboard_mapping(1, keycode, per as u8, &vec![keysym; per])
            .map_err(|e| x11_err(self.endpoint, &self.display, e))?;
        self.keymap.remap(keycode, keysym);
        self.remapped.retain(|&c| c != keycode);
        self.remapped.push(keycode);
        tracing::debug!(
            endpoint = self.endpoint,
            keycode,
            keysym,
            "spare key given a keysym this layout lacks"
        );
        Ok(Some(Place {
            keycode,
            shift: None,
            level3: false,
        }))
    }

    /// Types `keysym` for source key `code`: its key, with Shift and AltGr set as this
    /// layout needs for the press only (then as they were), so held modifiers keep working
    /// for shortcuts and clicks.
    fn press_sym(&mut self, code: u16, keysym: u32, hint: Option<u8>) -> Result<(), EndpointError> {
        self.settle()?;
        if let Some(old) = self.typed.remove(&code).flatten() {
            self.key(old, false)?;
        }
        if is_lock(keysym) {
            self.typed.insert(code, None);
            return Ok(());
        }
        let place = match self.keymap.find(keysym, hint) {
            Some(p) => p,
            None => match self.remap_spare(keysym)? {
                Some(p) => p,
                None => {
                    self.mapper.unmapped += 1;
                    return Ok(());
                }
            },
        };
        let mut undo: Vec<(u8, bool)> = Vec::new();
        if !is_modifier(keysym) {
            let shift_keys = self.keymap.shift_keycodes().to_vec();
            let l3_keys = self.keymap.level3_keycodes();
            let shift_key = self
                .keymap
                .key_of(XK_SHIFT_L)
                .or(shift_keys.first().copied());
            let l3_key = self
                .keymap
                .key_of(XK_ISO_LEVEL3_SHIFT)
                .or(l3_keys.first().copied());
            for (want, keys, key) in [
                (place.shift, shift_keys, shift_key),
                (Some(place.level3), l3_keys, l3_key),
            ] {
                let held: Vec<u8> = keys
                    .iter()
                    .copied()
                    .filter(|k| self.down.contains(k))
                    .collect();
                match want {
                    Some(true) if held.is_empty() => {
                        if let Some(k) = key {
                            self.key(k, true)?;
                            undo.push((k, false));
                        }
                    }
                    Some(false) => {
                        for k in held {
                            self.key(k, false)?;
                            undo.push((k, true));
                        }
                    }
                    _ => {}
                }
            }
        }
        self.key(place.keycode, true)?;
        // Undone at its release or at the next event (see `held_with`).
        if !undo.is_empty() {
            self.held_with = Some((code, undo));
        }
        self.typed.insert(code, Some(place.keycode));
        Ok(())
    }

    /// Gives the spare keycodes back their NoSymbol.
    fn restore_spares(&mut self) {
        let per = self.keymap.per().max(1);
        for keycode in std::mem::take(&mut self.remapped) {
            let _ = self
                .conn
                .change_keyboard_mapping(1, keycode, per as u8, &vec![0; per]);
        }
    }
}

/// Gives the screen of `root` the size `width` × `height` with RandR, as `xrandr --output O
/// --mode WxH --fb WxH` would: the mode is made and added to the active output if it has
/// none of that size, the screen grown to hold both the old and the new mode, the output's
/// CRTC set to the mode, and the screen cut to the new size. `Ok(None)`: it has that size
/// already. A server that cannot (Xvfb's one fixed mode, a size beyond its range) says why.
fn resize_screen(
    conn: &RustConnection,
    root: xproto::Window,
    width: u16,
    height: u16,
) -> Result<Option<(u16, u16)>, String> {
    use x11rb::protocol::randr::{self, ConnectionExt as _};
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let g = conn
        .get_geometry(root)
        .map_err(|x| e(&x))?
        .reply()
        .map_err(|x| e(&x))?;
    if (g.width, g.height) == (width, height) {
        return Ok(None);
    }
    conn.randr_query_version(1, 3)
        .map_err(|x| e(&x))?
        .reply()
        .map_err(|x| format!("no RandR 1.3 on this X server: {x}"))?;
    let range = conn
        .randr_get_screen_size_range(root)
        .map_err(|x| e(&x))?
        .reply()
        .map_err(|x| e(&x))?;
    if !(range.min_width..=range.max_width).contains(&width)
        || !(range.min_height..=range.max_height).contains(&height)
    {
        return Err(format!(
            "its X server takes screens of {}x{} to {}x{}",
            range.min_width, range.min_height, range.max_width, range.max_height
        ));
    }
    // Millimetres at 96 dpi.
    let mm = |px: u16| (f64::from(px) * 25.4 / 96.0).round() as u32;
    let set_size = |w: u16, h: u16| -> Result<(), String> {
        conn.randr_set_screen_size(root, w, h, mm(w), mm(h))
            .map_err(|x| e(&x))?
            .check()
            .map_err(|x| format!("screen size {w}x{h}: {x}"))
    };
    let res = conn
        .randr_get_screen_resources_current(root)
        .map_err(|x| e(&x))?
        .reply()
        .map_err(|x| e(&x))?;
    let mut active = None;
    for &o in &res.outputs {
        let info = conn
            .randr_get_output_info(o, res.config_timestamp)
            .map_err(|x| e(&x))?
            .reply()
            .map_err(|x| e(&x))?;
        if info.crtc != x11rb::NONE {
            active = Some((o, info));
            break;
        }
    }
    let Some((output, info)) = active else {
        // No output to drive: the screen alone.
        set_size(width, height)?;
        return Ok(Some((width, height)));
    };
    let sized = |m: &&randr::ModeInfo| m.width == width && m.height == height;
    let mode = match res
        .modes
        .iter()
        .filter(sized)
        .find(|m| info.modes.contains(&m.id))
    {
        Some(m) => m.id,
        None => {
            let id = match res.modes.iter().find(sized) {
                Some(m) => m.id,
                None => {
                    let name = format!("{width}x{height}");
                    let mode = randr::ModeInfo {
                        id: 0,
                        width,
                        height,
                        // 60 Hz (a virtual output: the clock is nominal).
                        dot_clock: (u64::from(width) * u64::from(height) * 60)
                            .min(u64::from(u32::MAX)) as u32,
                        hsync_start: width,
                        hsync_end: width,
                        htotal: width,
                        hskew: 0,
                        vsync_start: height,
                        vsync_end: height,
                        vtotal: height,
                        name_len: name.len() as u16,
                        mode_flags: randr::ModeFlag::from(0u32),
                    };
                    conn.randr_create_mode(root, mode, name.as_bytes())
                        .map_err(|x| e(&x))?
                        .reply()
                        .map_err(|x| format!("cannot make a {name} mode: {x}"))?
                        .mode
                }
            };
            conn.randr_add_output_mode(output, id)
                .map_err(|x| e(&x))?
                .check()
                .map_err(|x| format!("cannot give the output a {width}x{height} mode: {x}"))?;
            id
        }
    };
    let crtc = conn
        .randr_get_crtc_info(info.crtc, res.config_timestamp)
        .map_err(|x| e(&x))?
        .reply()
        .map_err(|x| e(&x))?;
    // Large enough for the old mode and the new one while the CRTC changes.
    let (bw, bh) = (width.max(g.width), height.max(g.height));
    if (bw, bh) != (g.width, g.height) {
        set_size(bw, bh)?;
    }
    let set = conn
        .randr_set_crtc_config(
            info.crtc,
            x11rb::CURRENT_TIME,
            res.config_timestamp,
            0,
            0,
            mode,
            crtc.rotation,
            &[output],
        )
        .map_err(|x| e(&x))?
        .reply()
        .map_err(|x| format!("cannot set the output to {width}x{height}: {x}"))?;
    if set.status != randr::SetConfig::SUCCESS {
        return Err(format!(
            "the X server answered {:?} to the new mode",
            set.status
        ));
    }
    if (bw, bh) != (width, height) {
        set_size(width, height)?;
    }
    Ok(Some((width, height)))
}

impl Injector for Xtest {
    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError> {
        self.mapper.set_capabilities(caps);
        // A viewer resized follows the app's screen, which may have changed size meanwhile
        // (xrandr on this machine): positions scale to the screen as it is now.
        if let Some(g) = self
            .conn
            .get_geometry(self.root)
            .ok()
            .and_then(|c| c.reply().ok())
        {
            self.mapper.set_screen(g.width, g.height);
        }
        Ok(())
    }

    fn screen_size(&mut self, width: u16, height: u16) -> Result<(), EndpointError> {
        match resize_screen(&self.conn, self.root, width, height) {
            Ok(Some((w, h))) => {
                self.mapper.set_screen(w, h);
                tracing::info!(endpoint = self.endpoint, display = %self.display, width = w, height = h, "the screen takes the viewer's size");
            }
            Ok(None) => {}
            Err(e) => {
                if let Some(suppressed) = self.resize_refused.admit(std::time::Instant::now()) {
                    tracing::warn!(endpoint = self.endpoint, display = %self.display, suppressed,
                        "cannot give the screen the viewer's size {width}x{height}: {e}; the viewer shows it scaled");
                }
            }
        }
        Ok(())
    }

    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
        self.refresh_keymap()?;
        let mut actions = std::mem::take(&mut self.actions);
        actions.clear();
        self.mapper.map(events, &mut actions);
        for a in &actions {
            match *a {
                XAction::Sym { code, keysym, hint } => self.press_sym(code, keysym, hint)?,
                XAction::Key { keycode, press } => {
                    // A key typed by keysym is released where it was pressed.
                    let typed = x_keycode_to_linux(keycode).and_then(|c| {
                        if press {
                            None
                        } else {
                            self.typed.remove(&c)
                        }
                    });
                    match typed {
                        Some(Some(k)) => {
                            self.key(k, false)?;
                            self.settle()?;
                        }
                        Some(None) => {}
                        None => {
                            self.settle()?;
                            self.key(keycode, press)?
                        }
                    }
                }
                XAction::Button { button, press } => {
                    self.settle()?;
                    let ty = if press {
                        xproto::BUTTON_PRESS_EVENT
                    } else {
                        xproto::BUTTON_RELEASE_EVENT
                    };
                    self.fake(ty, button, 0, 0)?;
                }
                XAction::MoveTo { x, y } => self.fake(xproto::MOTION_NOTIFY_EVENT, 0, x, y)?,
                XAction::MoveBy { dx, dy } => self.fake(xproto::MOTION_NOTIFY_EVENT, 1, dx, dy)?,
            }
        }
        self.actions = actions;
        self.conn
            .flush()
            .map_err(|e| x11_err(self.endpoint, &self.display, e))?;
        Ok(())
    }
}

/// The `xtest` sink loop.
fn run_xtest_sink(
    endpoint: &'static str,
    mut x: Xtest,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    let r = run_injector(endpoint, &mut x, rx, &delivered);
    x.restore_spares();
    // Make sure the server has processed everything (the releases above all) before the
    // connection closes.
    let _ = x.conn.sync();
    if x.mapper.unmapped > 0 {
        tracing::info!(
            endpoint,
            unmapped = x.mapper.unmapped,
            "events XTEST cannot express"
        );
    }
    r
}

// ---------------------------------------------------------------------------------------
// uinput sink

/// Where uinput lives.
pub const UINPUT_PATH: &str = "/dev/uinput";

/// Checks that `/dev/uinput` can be opened read-write, with an error that says how to fix it.
pub(crate) fn check_uinput(endpoint: &'static str, path: &Path) -> Result<(), EndpointError> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) => {
            let hint = match e.kind() {
                std::io::ErrorKind::NotFound => format!(
                    "this kernel has no uinput device: load the module (`sudo modprobe uinput`, \
                     and `uinput` in /etc/modules-load.d/ to keep it), or use the `xtest` sink \
                     on X11 (see docs/devices.md#input); {} is absent here",
                    path.display()
                ),
                std::io::ErrorKind::PermissionDenied => "add the user to group `input` and \
                     install the udev rule KERNEL==\"uinput\", GROUP=\"input\", MODE=\"0660\" \
                     (see docs/devices.md#input)"
                    .to_string(),
                _ => "see docs/devices.md#input".to_string(),
            };
            Err(EndpointError::Unavailable {
                endpoint,
                what: format!("cannot open {}: {e}", path.display()),
                hint,
            })
        }
    }
}

pub(crate) struct Uinput {
    name: String,
    endpoint: &'static str,
    dev: Option<evdev::uinput::VirtualDevice>,
    buf: Vec<evdev::InputEvent>,
}

impl std::fmt::Debug for Uinput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Uinput({})", self.name)
    }
}

fn build_virtual_device(
    name: &str,
    caps: &Capabilities,
) -> std::io::Result<evdev::uinput::VirtualDevice> {
    use evdev::{AbsInfo, AbsoluteAxisCode, AttributeSet, KeyCode, RelativeAxisCode};
    let keys: AttributeSet<KeyCode> = caps.keys.iter().map(|&k| KeyCode(k)).collect();
    let rel: AttributeSet<RelativeAxisCode> =
        caps.rel.iter().map(|&r| RelativeAxisCode(r)).collect();
    let mut b = evdev::uinput::VirtualDevice::builder()?
        .name(name)
        .input_id(evdev::InputId::new(
            evdev::BusType(caps.bustype),
            caps.vendor,
            caps.product,
            caps.version,
        ));
    if !caps.keys.is_empty() {
        b = b.with_keys(&keys)?;
    }
    if !caps.rel.is_empty() {
        b = b.with_relative_axes(&rel)?;
    }
    for a in &caps.abs {
        let info = AbsInfo::new(a.value, a.min, a.max, a.fuzz, a.flat, a.resolution);
        b = b.with_absolute_axis(&evdev::UinputAbsSetup::new(AbsoluteAxisCode(a.code), info))?;
    }
    b.build()
}

impl Injector for Uinput {
    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError> {
        // A new capabilities record (the source restarted, maybe another device): a new
        // virtual device, the old one is destroyed.
        self.dev = None;
        let dev =
            build_virtual_device(&self.name, caps).map_err(|e| EndpointError::Unavailable {
                endpoint: self.endpoint,
                what: format!("cannot create uinput device {:?}: {e}", self.name),
                hint: "see docs/devices.md#input".to_string(),
            })?;
        tracing::info!(endpoint = self.endpoint, name = %self.name, "uinput device created");
        self.dev = Some(dev);
        Ok(())
    }

    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
        if self.dev.is_none() {
            // Events before any capabilities record: a keyboard and wheel mouse.
            self.capabilities(&Capabilities::keyboard_and_mouse(""))?;
        }
        let Some(dev) = self.dev.as_mut() else {
            return Ok(());
        };
        self.buf.clear();
        self.buf.extend(
            events
                .iter()
                // Keysyms are for X sinks; a virtual device has keys only.
                .filter(|e| e.ty != EV_KEYSYM)
                .map(|e| evdev::InputEvent::new(e.ty, e.code, e.value)),
        );
        // `emit` appends the SYN_REPORT that ends the batch.
        dev.emit(&self.buf).map_err(|source| EndpointError::Write {
            endpoint: self.endpoint,
            what: UINPUT_PATH.to_string(),
            source,
        })?;
        Ok(())
    }
}

fn open_uinput(endpoint: &'static str, c: &UinputConfig) -> Result<Uinput, EndpointError> {
    check_uinput(endpoint, Path::new(UINPUT_PATH))?;
    Ok(Uinput {
        name: c.name.clone(),
        endpoint,
        dev: None,
        buf: Vec::new(),
    })
}

/// The `uinput` sink loop.
fn run_uinput_sink(
    endpoint: &'static str,
    mut u: Uinput,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkReport, EndpointError> {
    run_injector(endpoint, &mut u, rx, &delivered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::record::{BTN_LEFT, EV_KEY};

    #[test]
    fn missing_uinput_names_the_fix() {
        let e = check_uinput("uinput sink", Path::new("/nonexistent/uinput")).unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with("uinput sink: cannot open /nonexistent/uinput: No such file"),
            "{s}"
        );
        assert!(s.contains("modprobe uinput"), "{s}");
    }

    /// Records what a sink would inject.
    #[derive(Default)]
    struct Log(Vec<Event>, u32);
    impl Injector for Log {
        fn capabilities(&mut self, _: &Capabilities) -> Result<(), EndpointError> {
            self.1 += 1;
            Ok(())
        }
        fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
            self.0.extend_from_slice(events);
            Ok(())
        }
    }

    fn frame(seq: u64, m: &InputMessage) -> Frame {
        Frame::new(
            ndd_core::Meta {
                seq,
                ..Default::default()
            },
            &m.emit().unwrap(),
        )
    }

    #[test]
    fn injector_marks_applied_frames_but_not_injected_release_alls() {
        let press = |c| Event::new(EV_KEY, c, 1);
        let delivered = Delivered::default();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.try_send(frame(u64::MAX, &InputMessage::ReleaseAll))
            .unwrap();
        drop(tx);
        run_injector("test sink", &mut Log::default(), rx, &delivered).unwrap();
        assert_eq!(delivered.get(), None);

        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.try_send(frame(
            0,
            &InputMessage::Capabilities(Capabilities::default()),
        ))
        .unwrap();
        tx.try_send(frame(1, &InputMessage::Events(vec![press(30)])))
            .unwrap();
        tx.try_send(frame(u64::MAX, &InputMessage::ReleaseAll))
            .unwrap();
        drop(tx);
        let mut log = Log::default();
        let r = run_injector("test sink", &mut log, rx, &delivered).unwrap();
        assert_eq!(r.frames, 3);
        assert_eq!(log.0, vec![press(30), Event::new(EV_KEY, 30, 0)]);
        assert_eq!(delivered.get(), Some(1));
    }

    #[test]
    fn injector_releases_at_release_all_end_and_error() {
        let press = |c| Event::new(EV_KEY, c, 1);
        let up = |c| Event::new(EV_KEY, c, 0);
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.try_send(frame(
            0,
            &InputMessage::Capabilities(Capabilities::default()),
        ))
        .unwrap();
        tx.try_send(frame(
            1,
            &InputMessage::Events(vec![press(30), press(BTN_LEFT)]),
        ))
        .unwrap();
        tx.try_send(frame(2, &InputMessage::ReleaseAll)).unwrap();
        tx.try_send(frame(3, &InputMessage::Events(vec![press(31)])))
            .unwrap();
        drop(tx);
        let mut log = Log::default();
        let r = run_injector("test sink", &mut log, rx, &Delivered::default()).unwrap();
        assert_eq!(r.frames, 4);
        assert_eq!(log.1, 1);
        assert_eq!(
            log.0,
            vec![
                press(30),
                press(BTN_LEFT),
                up(30),
                up(BTN_LEFT),
                press(31),
                up(31)
            ]
        );

        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tx.try_send(frame(0, &InputMessage::Events(vec![press(44)])))
            .unwrap();
        let mut bad = Frame::new(
            ndd_core::Meta {
                seq: 1,
                ..Default::default()
            },
            &[1, 9],
        );
        bad.meta.seq = 1;
        tx.try_send(bad).unwrap();
        drop(tx);
        let mut log = Log::default();
        let delivered = Delivered::default();
        let e = run_injector("test sink", &mut log, rx, &delivered).unwrap_err();
        // The bad record stopped the sink: rejected, it is done with too.
        assert_eq!(delivered.get(), Some(1));
        assert_eq!(
            e.to_string(),
            "test sink: bad input record (seq 1): input record: unknown kind 0x09 \
             (expected 0x00 events, 0x01 capabilities, 0x02 release-all, 0x03 screen size)"
        );
        assert_eq!(log.0, vec![press(44), up(44)]);
    }
}
