//! ndd endpoints: the dissertation's device and application communication modules.
//!
//! Layer: the edges of a stream. A *source* endpoint produces a stream's frames on one side
//! (reading a device, a file, stdin, or simulating a device); a *sink* endpoint consumes them on
//! the other (writing a file, stdout, or verifying them). Together with links, this is the only
//! layer that owns files, timers and tasks (tokio); everything below it is sans-IO.
//!
//! - [`config`]: [`SourceConfig`] / [`SinkConfig`], as written in a config file
//!   (`{ type = "synthetic", size = 100 }`), and the [`SOURCES`] / [`SINKS`] catalogue;
//! - [`source`] / [`sink`]: [`SourceConfig::spawn`] and [`SinkConfig::spawn`] run them as
//!   tokio tasks over an `mpsc` channel of [`ndd_core::Frame`]s; [`SinkConfig::spawn_tracked`]
//!   also reports, through a [`Delivered`], the highest frame the sink has completed;
//! - sans-IO pieces, usable and tested without tokio: [`framing`] (raw / lines / length
//!   decoders and encoder), [`check`] (the [`Checker`]), [`synthetic`] (the benchmark
//!   payload), [`spacenav`] (the 3D-mouse record and motion), [`serial`] (the typed payloads
//!   of serial streams: data, line settings, modem lines);
//! - [`input`] (sans-IO): the versioned input records (event batches, capabilities,
//!   release-all), kernel `input_event` parsing and batching, held-key tracking and the
//!   X11 ↔ Linux code mapping; the `evdev` / `x11-input` sources and `uinput` / `xtest`
//!   sinks that use it run as blocking tasks (evdev crate, x11rb) and have no unsafe code;
//! - [`tty`]: the `serial` (a tty) and `pty` (a pseudo-terminal symlinked where the app
//!   expects a port) endpoints; their only unsafe code (modem-line ioctls, registering a
//!   descriptor with tokio) is in `sys`;
//! - [`display`] (sans-IO): the versioned display records (updates: rectangles of BGRX
//!   pixels), a client-side [`Framebuffer`], damage coalescing and cutting captures into
//!   frames; the `x11-screen` source (DAMAGE, MIT-SHM `ShmGetImage`) and the `x11-window` and
//!   `framebuffer` sinks that use it run as blocking tasks, their shared-memory segments being
//!   the only unsafe code (in `sys`).
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

pub mod check;
mod common;
pub mod display;
pub mod file;
pub mod input;
pub mod registry;
pub mod serial;
pub mod stdio;
pub mod synthetic;
mod sys;

pub use check::{CheckConfig, Checker, NullConfig};
pub use common::report::{CheckReport, SinkReport, SinkTask, SourceReport, SourceTask};
pub use common::{clock, delivered, error, framing, report};
pub use delivered::Delivered;
pub use display::{
    DisplayFrameError, Framebuffer, FramebufferConfig, PixelFormat, Rect, Update, X11ScreenConfig,
    X11WindowConfig,
};
pub use error::EndpointError;
pub use file::{FileSinkConfig, FileSourceConfig};
pub use framing::{encode, FrameDecoder, Framing, FramingError};
pub use input::{
    Capabilities, EvdevConfig, Event, InputFrameError, InputMessage, UinputConfig, X11InputConfig,
    X11Window, XtestConfig,
};
pub use registry::{EndpointInfo, SinkConfig, SourceConfig, SINKS, SOURCES};
pub use serial::{
    Flow, LineSettings, ModemLines, Parity, PtyConfig, SerialConfig, SerialFrameError,
    SerialMessage,
};
pub use stdio::{StdinConfig, StdoutConfig};
pub use synthetic::{SpacenavSimConfig, SyntheticConfig};
