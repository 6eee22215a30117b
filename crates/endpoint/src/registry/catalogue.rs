//! The catalogue: every source and sink endpoint with its parameters, in the order of the
//! [`SourceConfig`](super::SourceConfig) / [`SinkConfig`](super::SinkConfig) variants, for
//! `ndd modules` and the docs (a test checks it against the config structs).

/// Catalogue entry of an endpoint, for `ndd modules` and the docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointInfo {
    /// `type = "…"` in config files.
    pub name: &'static str,
    /// One line.
    pub summary: &'static str,
    /// `(key, type, default, doc)` for every parameter; default `required` marks a key that
    /// must be given, `none` an optional key that is off when absent.
    pub params: &'static [(&'static str, &'static str, &'static str, &'static str)],
}

/// Default of a key that must be given.
pub const REQUIRED: &str = "required";

/// The parameters of the `x11-clipboard` source and sink (the same for both).
const CLIPBOARD_PARAMS: &[(&str, &str, &str, &str)] = &[
    (
        "display",
        "string",
        ":0",
        "the X display whose selections are shared",
    ),
    (
        "selections",
        "list of CLIPBOARD | PRIMARY",
        "[\"CLIPBOARD\", \"PRIMARY\"]",
        "which selections; an empty list turns the endpoint off",
    ),
    (
        "max_bytes",
        "integer, 1..=67108864",
        "8388608",
        "largest selection (all formats together) sent or accepted",
    ),
    (
        "images",
        "bool",
        "true",
        "share PNG images too (text always)",
    ),
];

const WAYLAND_CLIPBOARD_PARAMS: &[(&str, &str, &str, &str)] = &[
    (
        "display",
        "string",
        "$WAYLAND_DISPLAY",
        "the compositor's socket: a name in $XDG_RUNTIME_DIR (wayland-1) or a full path",
    ),
    CLIPBOARD_PARAMS[1],
    CLIPBOARD_PARAMS[2],
    CLIPBOARD_PARAMS[3],
    (
        "protocol",
        "auto, ext, wlr",
        "auto",
        "the data-control protocol: auto takes ext-data-control-v1 where the compositor offers it (sway 1.11 and later), else wlr-data-control-unstable-v1; ext or wlr only that one",
    ),
];

const WAYLAND_CLIPBOARD: &str = "the clipboard (and primary selection) of a wlroots Wayland session through ext-data-control or wlr-data-control: text and PNG images, the same records as x11-clipboard (an X11 side and a Wayland side share one clipboard)";

const GNOME_CLIPBOARD_PARAMS: &[(&str, &str, &str, &str)] = &[
    (
        "bus",
        "string",
        "$DBUS_SESSION_BUS_ADDRESS",
        "the GNOME session's D-Bus address, e.g. unix:path=/run/user/1000/bus",
    ),
    CLIPBOARD_PARAMS[2],
    CLIPBOARD_PARAMS[3],
];

const GNOME_CLIPBOARD: &str = "the clipboard of a GNOME Wayland session through mutter's remote-desktop API: text and PNG images, the same records as x11-clipboard and wayland-clipboard (GNOME has no primary selection there)";

/// Every source endpoint.
pub const SOURCES: &[EndpointInfo] = &[
    EndpointInfo {
        name: "synthetic",
        summary: "benchmark device: `size` seeded pseudo-random bytes every `interval_ms`",
        params: &[
            (
                "size",
                "integer, 0..=67108864",
                "100",
                "payload bytes per frame",
            ),
            (
                "interval_ms",
                "float >= 0",
                "16.0",
                "time between frames; 0 = as fast as the stream takes them",
            ),
            (
                "count",
                "integer",
                "none",
                "frames to send, then end the stream; unlimited when absent",
            ),
            (
                "seed",
                "integer",
                "1",
                "content seed; a `check` sink with the same seed verifies every byte",
            ),
            (
                "repeat",
                "bool",
                "false",
                "every frame carries frame 0's payload, made once (throughput benchmarks)",
            ),
        ],
    },
    EndpointInfo {
        name: "spacenav-sim",
        summary: "simulated six-axis 3D mouse: one 14-byte record (6 axes, buttons) per frame",
        params: &[
            ("rate_hz", "float > 0", "62.5", "records per second"),
            (
                "count",
                "integer",
                "none",
                "records to send, then end the stream; unlimited when absent",
            ),
            ("seed", "integer", "1", "motion seed"),
        ],
    },
    EndpointInfo {
        name: "stdin",
        summary: "reads standard input until end of file",
        params: &[(
            "framing",
            "raw | lines | length",
            "raw",
            "how the bytes are cut into frames",
        )],
    },
    EndpointInfo {
        name: "file",
        summary: "reads a file (or named pipe) to its end, then ends the stream",
        params: &[
            ("path", "path", REQUIRED, "file to read"),
            (
                "framing",
                "raw | lines | length",
                "raw",
                "how the bytes are cut into frames",
            ),
        ],
    },
    EndpointInfo {
        name: "serial",
        summary: "a tty (serial port) opened raw: bytes read, and CTS/DSR/DCD/RI changes where the port reports them",
        params: &[
            ("path", "path", REQUIRED, "the tty, e.g. /dev/ttyUSB0; the serial sink of the other stream shares it"),
            ("baud", "integer > 0", "115200", "bits per second; any rate the port accepts (Linux: arbitrary rates via BOTHER)"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
        ],
    },
    EndpointInfo {
        name: "pty",
        summary: "what the app writes to the pty at `link`, and the line settings it sets there",
        params: &[
            ("link", "path", REQUIRED, "where the pty's slave is symlinked for the app to open; the pty sink of the other stream shares it"),
            ("baud", "integer > 0", "115200", "initial line settings the app finds on the pty"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
            ("keep_s", "0..=86400", "60", "seconds the pty is kept for this side's next run after it ends or dies (a program holding it keeps a working port); 0: it goes with the side"),
        ],
    },
    EndpointInfo {
        name: "evdev",
        summary: "a Linux input device (/dev/input/eventN): its capabilities, then one input record per SYN_REPORT batch",
        params: &[
            ("path", "path", REQUIRED, "the event device, e.g. /dev/input/by-id/…-event-kbd; a file or pipe of recorded `struct input_event`s works too"),
            ("grab", "bool", "false", "take the device exclusively (EVIOCGRAB): local programs stop seeing its events"),
        ],
    },
    EndpointInfo {
        name: "x11-input",
        summary: "keyboard and pointer events of an X display, as input records (keys, buttons, wheel, absolute motion)",
        params: &[
            ("display", "string", ":0", "the X display, e.g. :1"),
            ("window", "root | create | viewer", "create", "root: XInput2 raw events of the whole display; create: a window of the screen's size whose events are captured; viewer: the window of this process's x11-window sink on the same display (a remote desktop)"),
        ],
    },
    EndpointInfo {
        name: "x11-screen",
        summary: "the screen of an X display as display updates: the rectangles DAMAGE reports changed, captured with MIT-SHM",
        params: &[
            ("display", "string", ":0", "the X display the application draws on, e.g. :1"),
            ("max_fps", "float > 0", "30", "at most this many updates per second; damage between two captures is merged"),
            ("refresh_s", "float >= 0", "0", "a keyframe of the whole screen every this many seconds (heals a lossy or spoiling stack); 0 = only the first"),
        ],
    },
    EndpointInfo {
        name: "x11-cursor",
        summary: "the cursor image of an X display (XFIXES), each time its shape changes",
        params: &[("display", "string", ":0", "the X display the application draws on, e.g. :1")],
    },
    EndpointInfo {
        name: "x11-clipboard",
        summary: "the X selections (CLIPBOARD, PRIMARY) of a display: text and PNG images each time a program takes one (XFIXES), never what an x11-clipboard sink put there",
        params: CLIPBOARD_PARAMS,
    },
    EndpointInfo {
        name: "rfc2217-server",
        summary: "what an RFC 2217 client writes to the port, the line settings and DTR/RTS it sets",
        params: &[
            ("listen", "IP:PORT", REQUIRED, "where RFC 2217 clients (pyserial `rfc2217://HOST:PORT`, …) connect; one client at a time; the other RFC 2217 endpoint of the driver shares it"),
            ("baud", "integer > 0", "115200", "line settings a client finds before it sets its own"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
            ("stall_timeout_ms", "integer", "10000", "a client that stopped reading is let go after this long (0: never)"),
        ],
    },
    EndpointInfo {
        name: "rfc2217-client",
        summary: "what the RFC 2217 server's port receives, and its CTS/DSR/DCD/RI",
        params: &[
            ("address", "HOST:PORT", REQUIRED, "the RFC 2217 server (ser2net in telnet mode, pyserial's PortManager, …); reconnects when it goes away; the other RFC 2217 endpoint of the driver shares it"),
            ("baud", "integer > 0", "115200", "bits per second asked for on connecting"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
        ],
    },
    EndpointInfo {
        name: "pulse-capture",
        summary: "sound recorded from PulseAudio (a microphone, a sink's monitor, or a virtual sink programs play into), one PCM audio record per block",
        params: &[
            ("device", "string", "none", "the PulseAudio source to record (`pactl list short sources`); the default source when absent"),
            ("virtual_sink", "string", "none", "create a null sink of this name on this side (programs play into it) and record what they play"),
            ("rate", "integer, 8000..=192000", "48000", "samples per second"),
            ("channels", "1..=8", "2", "channels"),
            ("frame_ms", "1..=100", "10", "length of one block (one frame), ms"),
            ("max_wait_ms", "10..=10000", "60", "recorded sound that waited longer than this to be read is skipped (back to the present after a stall)"),
            ("server", "string", "none", "the PulseAudio server (`unix:/run/user/1000/pulse/native`); the session's when absent"),
        ],
    },
    EndpointInfo {
        name: "camera-sim",
        summary: "a synthetic camera: a moving test pattern as display records (BGRX keyframes), its frame number written in the picture",
        params: &[
            ("width", "even, 32..=4096", "640", "picture width"),
            ("height", "even, 16..=4096", "480", "picture height"),
            ("fps", "number in (0, 1000]", "30", "frames per second"),
            ("count", "integer", "none", "frames to send, then end; endless when absent"),
        ],
    },
    EndpointInfo {
        name: "v4l2",
        summary: "a Video4Linux2 camera (a webcam's YUYV or MJPEG, streaming I/O) as display records (BGRX keyframes)",
        params: &[
            ("path", "path", REQUIRED, "the camera's device node, e.g. /dev/video0 or /dev/v4l/by-id/…"),
            ("width", "even, 16..=8192", "640", "width asked for (the camera may give the nearest it has)"),
            ("height", "even, 16..=8192", "480", "height asked for"),
            ("fps", "number in (0, 1000]", "30", "frame rate asked for"),
            ("format", "auto | yuyv | mjpeg", "auto", "pixel format asked for; auto: YUYV, else MJPEG"),
            ("count", "integer", "none", "frames to send, then end; endless when absent"),
        ],
    },
    EndpointInfo {
        name: "wayland-screen",
        summary: "an output of a wlroots Wayland compositor (sway, Hyprland, river, labwc) as display updates: the rectangles the compositor reports changed (ext-image-copy-capture or wlr-screencopy, with damage)",
        params: &[
            ("display", "string", "$WAYLAND_DISPLAY", "the compositor's socket: a name in $XDG_RUNTIME_DIR (wayland-1) or a full path"),
            ("output", "string", "the first", "the output captured, by name (HEADLESS-1, DP-1: `swaymsg -t get_outputs`)"),
            ("max_fps", "float > 0", "30", "at most this many updates per second; damage between two captures is merged"),
            ("refresh_s", "float >= 0", "0", "a keyframe of the whole output every this many seconds; 0 = only the first"),
            ("protocol", "auto, ext, wlr", "auto", "the capture protocol: auto takes ext-image-copy-capture-v1 where the compositor offers it (sway 1.11 and later), else wlr-screencopy-unstable-v1; ext or wlr only that one"),
        ],
    },
    EndpointInfo {
        name: "wayland-clipboard",
        summary: WAYLAND_CLIPBOARD,
        params: WAYLAND_CLIPBOARD_PARAMS,
    },
    EndpointInfo {
        name: "wayland-window-input",
        summary: "what the person does in the wayland-window viewer of the same display in this process (keys by code, the pointer on the app's screen, buttons, the wheel) as input records; the compositor's shortcuts go to the viewer while it has the keyboard",
        params: &[("display", "string", "", "the viewer's compositor, as its wayland-window sink names it; empty: $WAYLAND_DISPLAY")],
    },
    EndpointInfo {
        name: "gnome-screen",
        summary: "a monitor of a GNOME Wayland session (mutter's screen-cast API, its PipeWire stream read by GStreamer's pipewiresrc) as display updates: the tiles that changed",
        params: &[
            ("bus", "string", "$DBUS_SESSION_BUS_ADDRESS", "the GNOME session's D-Bus address, e.g. unix:path=/run/user/1000/bus"),
            ("monitor", "string", "the primary", "the monitor captured, by connector (DP-1, eDP-1; `gnome-monitor-config list`)"),
            ("pipewire", "string", "the session's", "the session's PipeWire socket, e.g. /run/user/1000/pipewire-0; empty: $PIPEWIRE_REMOTE or pipewire-0 in $XDG_RUNTIME_DIR"),
            ("max_fps", "float > 0", "30", "at most this many updates per second"),
            ("refresh_s", "float >= 0", "0", "a keyframe of the whole monitor every this many seconds; 0 = only the first"),
        ],
    },
    EndpointInfo {
        name: "gnome-clipboard",
        summary: GNOME_CLIPBOARD,
        params: GNOME_CLIPBOARD_PARAMS,
    },
    EndpointInfo {
        name: "portal-screen",
        summary: "a monitor the desktop shares through the xdg-desktop-portal's ScreenCast (GNOME, KDE Plasma, wlroots with xdg-desktop-portal-wlr), its PipeWire stream read by GStreamer's pipewiresrc, as display updates: the tiles that changed; asked once at the desktop, then started unattended with the portal's restore token",
        params: &[
            ("bus", "string", "$DBUS_SESSION_BUS_ADDRESS", "the desktop session's D-Bus address, e.g. unix:path=/run/user/1000/bus"),
            ("token_file", "path", "$XDG_STATE_HOME/ndd/portal-screen.token", "where the portal's restore token (the grant given once in the screen-share dialog) is kept between starts"),
            ("grant_wait_s", "float in (0, 86400]", "300", "how long a start waits for the person to answer the screen-share dialog"),
            ("max_fps", "float > 0", "30", "at most this many updates per second"),
            ("refresh_s", "float >= 0", "0", "a keyframe of the whole monitor every this many seconds; 0 = only the first"),
        ],
    },
];

/// Every sink endpoint.
pub const SINKS: &[EndpointInfo] = &[
    EndpointInfo {
        name: "stdout",
        summary: "writes frames to standard output",
        params: &[("framing", "raw | lines | length", "raw", "how frames are written")],
    },
    EndpointInfo {
        name: "file",
        summary: "writes frames to a file, created or truncated unless `append`",
        params: &[
            ("path", "path", REQUIRED, "file to write"),
            ("framing", "raw | lines | length", "raw", "how frames are written"),
            ("append", "bool", "false", "append instead of truncating"),
        ],
    },
    EndpointInfo {
        name: "check",
        summary: "verifies order, completeness and content; reports gaps, duplicates, reordered and corrupt frames",
        params: &[
            ("seed", "integer", "none", "verify synthetic content made with this seed"),
            ("size", "integer", "none", "expected payload length; default: each frame's own length"),
            ("expect", "integer", "none", "expected number of frames"),
        ],
    },
    EndpointInfo {
        name: "null",
        summary: "counts frames and discards them",
        params: &[],
    },
    EndpointInfo {
        name: "serial",
        summary: "a tty (serial port) opened raw: writes data, applies line settings and DTR/RTS",
        params: &[
            ("path", "path", REQUIRED, "the tty, e.g. /dev/ttyUSB0; the serial source of the other stream shares it"),
            ("baud", "integer > 0", "115200", "bits per second; any rate the port accepts (Linux: arbitrary rates via BOTHER)"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
        ],
    },
    EndpointInfo {
        name: "pty",
        summary: "a pty whose slave is symlinked at `link`: the app reads the stream's bytes there",
        params: &[
            ("link", "path", REQUIRED, "where the pty's slave is symlinked for the app to open; the pty source of the other stream shares it"),
            ("baud", "integer > 0", "115200", "initial line settings the app finds on the pty"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
            ("keep_s", "0..=86400", "60", "seconds the pty is kept for this side's next run after it ends or dies (a program holding it keeps a working port); 0: it goes with the side"),
        ],
    },
    EndpointInfo {
        name: "uinput",
        summary: "a uinput virtual input device with the capabilities the source sent; the app sees a new /dev/input/eventN",
        params: &[("name", "string", "ndd remote input", "device name the app sees (at most 79 bytes)")],
    },
    EndpointInfo {
        name: "xtest",
        summary: "injects input records into an X display with XTEST (keys, buttons, wheel, absolute or relative motion)",
        params: &[("display", "string", ":0", "the X display, e.g. :2")],
    },
    EndpointInfo {
        name: "x11-window",
        summary: "shows display updates in a window of an X display (MIT-SHM PutImage), sized like the app's screen",
        params: &[
            ("display", "string", ":0", "the X display the person looks at, e.g. :0"),
            ("title", "string", "ndd display", "the window's title (WM_NAME)"),
            ("resize", "scale | remote", "scale", "resizing the window: scale shows the app's screen scaled to it; remote asks the app side for the window's size (RandR)"),
            ("scale", "auto | number 1..4", "auto", "HiDPI: the window's first size is the app's screen at this factor (auto: the display's Xft.dpi / 96)"),
        ],
    },
    EndpointInfo {
        name: "framebuffer",
        summary: "writes display updates into a raw 32-bpp framebuffer file (BGRX, row-major, no header) or a /dev/fbN of the same size",
        params: &[("path", "path", REQUIRED, "the file, created and sized on the first update, or a framebuffer device such as /dev/fb0")],
    },
    EndpointInfo {
        name: "x11-cursor",
        summary: "sets cursor images as the cursor of the viewer window (the x11-window sink of the same display in this process): the viewer's X server draws the pointer, with no network delay",
        params: &[("display", "string", ":0", "the X display of the viewer window")],
    },
    EndpointInfo {
        name: "x11-clipboard",
        summary: "owns the selections on a display with what the peer's x11-clipboard source sent, and answers the programs that paste (text as UTF8_STRING/STRING/TEXT, image/png; INCR for large ones)",
        params: CLIPBOARD_PARAMS,
    },
    EndpointInfo {
        name: "rfc2217-server",
        summary: "data and CTS/DSR/DCD/RI for the RFC 2217 client (dropped while none is connected)",
        params: &[
            ("listen", "IP:PORT", REQUIRED, "where RFC 2217 clients (pyserial `rfc2217://HOST:PORT`, …) connect; one client at a time; the other RFC 2217 endpoint of the driver shares it"),
            ("baud", "integer > 0", "115200", "line settings a client finds before it sets its own"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
            ("stall_timeout_ms", "integer", "10000", "a client that stopped reading is let go after this long (0: never)"),
        ],
    },
    EndpointInfo {
        name: "rfc2217-client",
        summary: "data, line settings and DTR/RTS for the RFC 2217 server's port",
        params: &[
            ("address", "HOST:PORT", REQUIRED, "the RFC 2217 server (ser2net in telnet mode, pyserial's PortManager, …); reconnects when it goes away; the other RFC 2217 endpoint of the driver shares it"),
            ("baud", "integer > 0", "115200", "bits per second asked for on connecting"),
            ("data_bits", "5..=8", "8", "bits per character"),
            ("parity", "none | odd | even | mark | space", "none", "parity bit"),
            ("stop_bits", "1 | 2", "1", "stop bits"),
            ("flow", "none | rtscts | xonxoff", "none", "flow control"),
        ],
    },
    EndpointInfo {
        name: "pulse-playback",
        summary: "PCM audio records played through PulseAudio (the speakers, or a virtual source programs record from)",
        params: &[
            ("device", "string", "none", "the PulseAudio sink to play into (`pactl list short sinks`); the default sink when absent"),
            ("virtual_source", "string", "none", "create a source of this name on this side that programs record from (`parecord -d NAME`), and play into it"),
            ("latency_ms", "1..=2000", "30", "sound PulseAudio keeps buffered ahead of the speaker, ms"),
            ("rate", "integer, 8000..=192000", "48000", "with `virtual_source`: its sample rate (the capture's)"),
            ("channels", "1..=8", "2", "with `virtual_source`: its channels (the capture's)"),
            ("max_wait_ms", "10..=10000", "none", "with `virtual_source`: sound that may wait in its FIFO before a block is dropped; absent: under one block (the freshest sound)"),
            ("server", "string", "none", "the PulseAudio server; the session's when absent"),
        ],
    },
    EndpointInfo {
        name: "y4m",
        summary: "display records as a YUV4MPEG2 stream (C420jpeg) on a named pipe it makes: ffplay, ffmpeg and GStreamer read it",
        params: &[
            ("path", "path", REQUIRED, "where the stream goes; a named pipe is made there if nothing is"),
            ("fps", "number in (0, 1000]", "30", "the frame rate written in the stream's header"),
        ],
    },
    EndpointInfo {
        name: "v4l2loopback",
        summary: "display records written as YUYV to a v4l2loopback device: the remote camera as /dev/videoN for browsers and video-call programs",
        params: &[
            ("path", "path", REQUIRED, "the v4l2loopback node (`modprobe v4l2loopback video_nr=10 exclusive_caps=1`: /dev/video10)"),
        ],
    },
    EndpointInfo {
        name: "wayland-input",
        summary: "types and moves input records into a wlroots Wayland session (sway, Hyprland): a virtual keyboard (US layout) and a virtual pointer",
        params: &[("display", "string", "$WAYLAND_DISPLAY", "the compositor's socket: a name in $XDG_RUNTIME_DIR (wayland-1) or a full path")],
    },
    EndpointInfo {
        name: "wayland-clipboard",
        summary: WAYLAND_CLIPBOARD,
        params: WAYLAND_CLIPBOARD_PARAMS,
    },
    EndpointInfo {
        name: "wayland-window",
        summary: "shows display updates in a window of a Wayland compositor (xdg-shell, wl_shm; scaled to the window with wp_viewporter): the viewer on a Wayland desktop without Xwayland",
        params: &[
            ("display", "string", "", "the compositor's socket (wayland-1, or a full path); empty: $WAYLAND_DISPLAY"),
            ("title", "string", "ndd display", "the window's title"),
        ],
    },
    EndpointInfo {
        name: "gnome-input",
        summary: "types and moves input records into a GNOME Wayland session through mutter's remote-desktop API: keys by their keysym (the session's layout types them) or code, buttons, motion, the wheel",
        params: &[
            ("bus", "string", "$DBUS_SESSION_BUS_ADDRESS", "the GNOME session's D-Bus address, e.g. unix:path=/run/user/1000/bus"),
            ("monitor", "string", "the primary", "the monitor absolute pointer positions are on, by connector (DP-1, eDP-1)"),
        ],
    },
    EndpointInfo {
        name: "gnome-clipboard",
        summary: GNOME_CLIPBOARD,
        params: GNOME_CLIPBOARD_PARAMS,
    },
    EndpointInfo {
        name: "kde-input",
        summary: "input records typed and moved into a KDE Plasma Wayland session through KWin's fake input (keys by Linux code in the session's layout, buttons, relative and absolute motion, the wheel); KWin offers it to programs a .desktop file lists (Debian's package installs one)",
        params: &[("display", "string", "$WAYLAND_DISPLAY", "KWin's socket: a name in $XDG_RUNTIME_DIR (wayland-0) or a full path")],
    },
    EndpointInfo {
        name: "portal-input",
        summary: "types and moves input records into a desktop session through the xdg-desktop-portal's RemoteDesktop (GNOME, KDE Plasma): keys by their keysym (the session's layout types them) or code, buttons, motion, the wheel; the desktop asks at each start unless its portal keeps grants (RemoteDesktop version 2)",
        params: &[
            ("bus", "string", "$DBUS_SESSION_BUS_ADDRESS", "the desktop session's D-Bus address, e.g. unix:path=/run/user/1000/bus"),
            ("token_file", "path", "$XDG_STATE_HOME/ndd/portal-input.token", "where the portal's restore token is kept between starts (portals that keep grants)"),
            ("grant_wait_s", "float in (0, 86400]", "300", "how long a start waits for the person to answer the desktop's remote-desktop dialog"),
            ("via", "auto, eis, notify", "auto", "how input goes into the session: auto over EIS where the portal offers ConnectToEIS (xdg-desktop-portal 1.18 and later), else by its Notify calls; eis or notify only that way"),
        ],
    },
];
