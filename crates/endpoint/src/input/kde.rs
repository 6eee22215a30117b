//! The `kde-input` sink: input records typed and moved into a KDE Plasma Wayland session
//! (KWin) through KWin's own fake-input protocol (`org_kde_kwin_fake_input`, version 4: keys,
//! buttons, relative and absolute motion, the wheel), as if from a keyboard and mouse plugged
//! in there; KWin has none of the wlroots virtual-input protocols. The same loop as `uinput`,
//! `xtest`, `wayland-input` and `gnome-input` ([`super::sink`]): held keys and buttons are
//! released when the stream ends, on a release-all record and before an error.
//!
//! KWin offers the protocol only to programs a `.desktop` file lists in
//! `X-KDE-Wayland-Interfaces` (Debian's package installs one for `/usr/bin/ndd`). Keys go by
//! their Linux code, typed in the session's own layout: fake input brings no keymap, so a
//! person whose layout differs from the session's gets the session's symbols (the keysym an
//! `x11-input` source annotates is not used). Absolute positions are scaled from the source's
//! axis ranges onto the first output, taken at the origin with its mode divided by its integer
//! scale (a fractionally scaled, rotated or second output is not placed right).

use super::config::KdeInputConfig;
use super::gnome::scale;
use super::record::{
    Capabilities, Event, ABS_X, ABS_Y, BTN_LEFT, EV_ABS, EV_KEY, EV_REL, REL_HWHEEL, REL_WHEEL,
    REL_X, REL_Y,
};
use super::sink::{run_injector, Injector};
use crate::common::delivered::Delivered;
use crate::common::error::EndpointError;
use crate::common::report::SinkTask;
use crate::common::wayland::{ignore_events, pump, unavailable, wayland_connect};
use ndd_core::Frame;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc::Receiver;
use wayland_client::globals::registry_queue_init;
use wayland_client::protocol::wl_output;
use wayland_client::{Connection, Dispatch, EventQueue, Proxy, QueueHandle, WEnum};
use wayland_protocols_plasma::fake_input::client::org_kde_kwin_fake_input as fake;

/// Pixels of scroll per wheel notch (what libinput reports for one click).
const WHEEL_STEP: f64 = 15.0;

/// What the hint says when KWin does not offer its fake input.
const RESTRICTED_HINT: &str = "KWin offers org_kde_kwin_fake_input (version 4 or later: KDE Plasma 5.27) only to programs a .desktop file lists in X-KDE-Wayland-Interfaces: install Debian's ndd package (its /usr/share/applications/ndd.desktop lists it for /usr/bin/ndd), or copy packaging/ndd.desktop to ~/.local/share/applications/ with Exec= naming this ndd; elsewhere the wayland-input sink (wlroots) or gnome-input (GNOME)";

#[derive(Default)]
struct State {
    /// The first output's current mode (pixels) and scale.
    mode: Option<(i32, i32)>,
    scale: i32,
}

ignore_events!(State; fake::OrgKdeKwinFakeInput);

impl Dispatch<wl_output::WlOutput, ()> for State {
    fn event(
        state: &mut Self,
        _: &wl_output::WlOutput,
        event: wl_output::Event,
        _: &(),
        _: &Connection,
        _: &QueueHandle<Self>,
    ) {
        match event {
            wl_output::Event::Mode {
                flags: WEnum::Value(f),
                width,
                height,
                ..
            } if f.contains(wl_output::Mode::Current) => state.mode = Some((width, height)),
            wl_output::Event::Scale { factor } => state.scale = factor,
            _ => {}
        }
    }
}

/// An open `kde-input` sink.
pub(crate) struct KdeInput {
    display: String,
    endpoint: &'static str,
    queue: EventQueue<State>,
    state: State,
    input: fake::OrgKdeKwinFakeInput,
    /// The source's absolute axis ranges (x, y), if it has them.
    abs: Option<((i32, i32), (i32, i32))>,
    /// The last absolute position (source units).
    at: (i32, i32),
}

impl std::fmt::Debug for KdeInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KdeInput({})", self.display)
    }
}

/// Whether the session's KWin offers its fake input to this program (`ndd check`).
pub(crate) fn probe_kde_input(
    endpoint: &'static str,
    c: &KdeInputConfig,
) -> Result<(), EndpointError> {
    open_kde_input(endpoint, c).map(|_| ())
}

/// Connects and starts a `kde-input` sink.
pub(crate) fn spawn_kde_input_sink(
    rt: &Handle,
    endpoint: &'static str,
    c: &KdeInputConfig,
    rx: Receiver<Frame>,
    delivered: Delivered,
) -> Result<SinkTask, EndpointError> {
    let mut k = open_kde_input(endpoint, c)?;
    Ok(rt.spawn_blocking(move || run_injector(endpoint, &mut k, rx, &delivered)))
}

/// Connects, binds KWin's fake input (version 4: keys) and the first output (its size, for
/// absolute motion), and says who is asking.
fn open_kde_input(endpoint: &'static str, c: &KdeInputConfig) -> Result<KdeInput, EndpointError> {
    let d = c.display.as_str();
    let conn = wayland_connect(endpoint, d)?;
    let broken = |e: String| unavailable(endpoint, d, e, "KWin closed the connection");
    let (globals, mut queue) =
        registry_queue_init::<State>(&conn).map_err(|e| broken(e.to_string()))?;
    let qh = queue.handle();
    let input: fake::OrgKdeKwinFakeInput = globals.bind(&qh, 4..=4, ()).map_err(|e| {
        unavailable(
            endpoint,
            d,
            format!("no org_kde_kwin_fake_input version 4 ({e})"),
            RESTRICTED_HINT,
        )
    })?;
    let mut state = State {
        scale: 1,
        ..State::default()
    };
    let registry = globals.registry();
    if let Some(g) = globals
        .contents()
        .clone_list()
        .into_iter()
        .find(|g| g.interface == wl_output::WlOutput::interface().name)
    {
        let _: wl_output::WlOutput = registry.bind(g.name, g.version.min(2), &qh, ());
    }
    input.authenticate("ndd".into(), "input from a networked device (ndd)".into());
    queue
        .roundtrip(&mut state)
        .map_err(|e| broken(format!("setting up KWin's fake input: {e}")))?;
    tracing::info!(endpoint, display = d, output = ?state.mode, "KWin's fake input ready");
    Ok(KdeInput {
        display: d.to_string(),
        endpoint,
        queue,
        state,
        input,
        abs: None,
        at: (0, 0),
    })
}

impl KdeInput {
    /// Sends the motion gathered so far (relative, then absolute) and clears it.
    fn flush_motion(&mut self, dx: &mut f64, dy: &mut f64, moved_abs: &mut bool) {
        if *dx != 0.0 || *dy != 0.0 {
            self.input.pointer_motion(*dx, *dy);
        }
        (*dx, *dy) = (0.0, 0.0);
        if let (true, Some((xr, yr)), Some((w, h))) =
            (std::mem::take(moved_abs), self.abs, self.state.mode)
        {
            let s = f64::from(self.state.scale.max(1));
            let (x, y) = (
                scale(self.at.0, xr, f64::from(w) / s),
                scale(self.at.1, yr, f64::from(h) / s),
            );
            self.input.pointer_motion_absolute(x, y);
        }
    }
}

impl Injector for KdeInput {
    fn capabilities(&mut self, caps: &Capabilities) -> Result<(), EndpointError> {
        self.abs = match (caps.abs_axis(ABS_X), caps.abs_axis(ABS_Y)) {
            (Some(x), Some(y)) => Some(((x.min, x.max), (y.min, y.max))),
            _ => None,
        };
        Ok(())
    }

    fn events(&mut self, events: &[Event]) -> Result<(), EndpointError> {
        let (mut dx, mut dy) = (0.0f64, 0.0f64);
        let mut moved_abs = false;
        for e in events {
            // Motion before a button or the wheel in one record goes first (a move, then a
            // click where it ended).
            let pointer = e.ty == EV_REL && (e.code == REL_WHEEL || e.code == REL_HWHEEL)
                || e.ty == EV_KEY && (BTN_LEFT..BTN_LEFT + 0x10).contains(&e.code);
            if pointer {
                self.flush_motion(&mut dx, &mut dy, &mut moved_abs);
            }
            match (e.ty, e.code) {
                (EV_KEY, code) if (BTN_LEFT..BTN_LEFT + 0x10).contains(&code) => {
                    self.input.button(u32::from(code), u32::from(e.value != 0));
                }
                // Autorepeat (2) is the compositor's own business.
                (EV_KEY, code) if e.value != 2 => {
                    self.input
                        .keyboard_key(u32::from(code), u32::from(e.value != 0));
                }
                (EV_REL, REL_X) => dx += f64::from(e.value),
                (EV_REL, REL_Y) => dy += f64::from(e.value),
                // KWin's vertical axis (0) runs down, the wheel's up.
                (EV_REL, REL_WHEEL) => self.input.axis(0, -f64::from(e.value) * WHEEL_STEP),
                (EV_REL, REL_HWHEEL) => self.input.axis(1, f64::from(e.value) * WHEEL_STEP),
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
        self.flush_motion(&mut dx, &mut dy, &mut moved_abs);
        pump(&mut self.queue, &mut self.state, Duration::ZERO).map_err(|e| {
            unavailable(
                self.endpoint,
                &self.display,
                e,
                "KWin closed the connection (the KDE session ended?)",
            )
        })
    }
}
