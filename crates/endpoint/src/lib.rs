//! ndd endpoints: the dissertation's device and application communication modules.
//!
//! Layer: the edges of a stream. A *source* endpoint produces a stream's frames on one side
//! (reading a device, a file, stdin, or simulating a device); a *sink* endpoint consumes them on
//! the other (writing a file, stdout, or verifying them). Together with links, this is the only
//! layer that owns files, timers and tasks (tokio); everything below it is sans-IO.
//!
//! Layout: one folder per device class, the way vector keeps one folder per source and sink.
//! Each holds that class's config structs, its sources and sinks, its record format (sans-IO,
//! usable and tested without tokio) and their unit tests:
//!
//! | folder | endpoints | record format |
//! |---|---|---|
//! | [`synthetic`] | `synthetic` and `spacenav-sim` sources | the benchmark payload ([`synthetic::payload`]); the 3D-mouse record ([`synthetic::spacenav`]) |
//! | [`stdio`] | `stdin` source, `stdout` sink | bytes cut by a [`Framing`] |
//! | [`file`](mod@file) | `file` source and sink | bytes cut by a [`Framing`] |
//! | [`check`] | `check` and `null` sinks | — (the [`Checker`] verifies synthetic content) |
//! | [`serial`] | `serial` (a tty) and `pty` (symlinked where the app expects a port), both ways | [`SerialMessage`]: data, line settings, modem lines |
//! | [`input`] | `evdev` and `x11-input` sources, `uinput` and `xtest` sinks | [`InputMessage`]: event batches, capabilities, release-all |
//! | [`display`] | `x11-screen` source, `x11-window` and `framebuffer` sinks | [`Update`]: rectangles of BGRX pixels |
//!
//! Around them:
//! - [`registry`]: the one module that knows every endpoint: [`SourceConfig`] / [`SinkConfig`]
//!   as written in a config file (`{ type = "synthetic", size = 100 }`), the [`SOURCES`] /
//!   [`SINKS`] catalogue, and one `match` each for `describe`, `validate` and `spawn`
//!   ([`SourceConfig::spawn`], [`SinkConfig::spawn_tracked`], which also reports through a
//!   [`Delivered`] the frames the sink has completed); it imports the device folders, none of
//!   them imports it;
//! - `common/`, shared by every class and importing none: [`error`] ([`EndpointError`]),
//!   [`report`] ([`SourceReport`], [`SinkReport`], the task handles), [`delivered`],
//!   [`clock`] (the source clock and pacing), the emitter every source sends through
//!   (numbering, stamping, counting), [`framing`] (raw / lines / length decoders and
//!   encoder, sans-IO), the byte-stream reader and writer loops, and the X11 connection
//!   helpers;
//! - `sys/`: the only unsafe code (modem-line ioctls, registering a descriptor with tokio,
//!   the System V shared memory of MIT-SHM, Video4Linux2 ioctls and buffer mappings), every
//!   block with its `// SAFETY:` comment.
//!
//! Invariants:
//! - a source numbers its frames 0, 1, 2, … on the stream it is given, stamps each with its
//!   creation time (ns since the Unix epoch, source clock) and flags 0; it ends by dropping its
//!   sender (end of input, `count` reached) and stops quietly when the receiver is gone;
//! - opening errors (a missing file, a bad parameter, no runtime) come back from `spawn`
//!   before any task starts; later errors end the task with an [`EndpointError`] naming the
//!   endpoint and what failed; no input — bytes, config values, sequence numbers — panics;
//! - a sink consumes until every sender is gone, flushes, and only then reports;
//! - a sink marks a frame in its [`Delivered`] only once the frame's effect is complete
//!   (written and flushed, injected, drawn, checked, counted, or dropped as invalid), never
//!   before;
//! - a source reading bytes copies each frame's payload once (into its [`ndd_core::Frame`]).

pub mod audio;
pub mod camera;
pub mod check;
pub mod clipboard;
mod common;
pub mod display;
pub mod file;
pub mod input;
pub mod registry;
pub mod serial;
pub mod stdio;
pub mod synthetic;
mod sys;
pub use sys::{default_sigpipe, tune_allocator};

pub use check::{CheckConfig, Checker, NullConfig};
#[cfg(not(feature = "wayland"))]
pub use common::no_wayland::{portal_input_offers_eis, wayland_session};
pub use common::report::{CheckReport, Offered, SinkReport, SinkTask, SourceReport, SourceTask};
#[cfg(feature = "wayland")]
pub use common::wayland::wayland_session;
pub use common::{
    clock, delivered, demand, error, framing, refused_at_the_desktop, report,
    DECLINED_AT_THE_DESKTOP, STOPPED_AT_THE_DESKTOP,
};
pub use delivered::Delivered;
pub use demand::Demand;
pub use display::{
    DisplayFrameError, Framebuffer, FramebufferConfig, GnomeScreenConfig, PixelFormat,
    PortalScreenConfig, Rect, Update, WaylandProtocol, WaylandScreenConfig, WaylandWindowConfig,
    X11ScreenConfig, X11WindowConfig,
};
pub use error::EndpointError;
pub use file::{FileSinkConfig, FileSourceConfig};
pub use framing::{encode, FrameDecoder, Framing, FramingError};
#[cfg(feature = "wayland")]
pub use input::portal_input_offers_eis;
pub use input::{
    Capabilities, EvdevConfig, Event, GnomeInputConfig, InputFrameError, InputMessage,
    KdeInputConfig, PortalInputConfig, UinputConfig, WaylandInputConfig, WaylandWindowInputConfig,
    X11InputConfig, X11Window, XtestConfig,
};
pub use registry::{EndpointInfo, SinkConfig, SourceConfig, SINKS, SOURCES};
pub use serial::{
    Flow, LineSettings, ModemLines, Parity, PtyConfig, SerialConfig, SerialFrameError,
    SerialMessage,
};
pub use stdio::{StdinConfig, StdoutConfig};
pub use synthetic::{SpacenavSimConfig, SyntheticConfig};
