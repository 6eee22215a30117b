//! The `ndd` command line (the binary's `main` calls [`main`]; it lives in the library so
//! the code it shares with the rest is compiled once, not again for the binary).
//!
//! Layer: the top. Loads config, wires endpoints, stacks and links together, prints stats,
//! runs the demo and the benchmarks. Errors are `anyhow` with context; every error ends the
//! process with one clear line on stderr and a non-zero exit code, never a panic.

use crate::{board, config, ctrl_c, demo, logfmt, rfbaccel, session, write_json};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use config::{Config, SideName};
use session::{Endpoint, RunOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `ndd --version`: the version, and what this build leaves out (`./run demo` builds
/// without the media pairs and Wayland).
const VERSION: &str = match (cfg!(feature = "media"), cfg!(feature = "wayland")) {
    (true, true) => env!("CARGO_PKG_VERSION"),
    (false, true) => concat!(env!("CARGO_PKG_VERSION"), " (built without the media pairs and endpoints)"),
    (true, false) => concat!(env!("CARGO_PKG_VERSION"), " (built without Wayland)"),
    (false, false) => concat!(
        env!("CARGO_PKG_VERSION"),
        " (built without the media pairs and endpoints, and without Wayland: `./run ndd` builds them)"
    ),
};

/// ndd — use an I/O device attached to another machine as if it were local.
///
/// Each side runs `ndd run CONFIG --side device|app` with the same config file. Streams flow
/// through stacks of paired transformation modules over a mutually authenticated TLS 1.3 link.
/// Try `ndd demo` first.
#[derive(Debug, Parser)]
#[command(name = "ndd", version = VERSION, about, long_about, max_term_width = 100)]
struct Cli {
    /// Log verbosity (repeat for more). NDD_LOG=target=level also works.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Debug, Args)]
struct HomeArg {
    /// Directory holding this install's identity and known_peers
    /// [default: $NDD_HOME, else $XDG_CONFIG_HOME/ndd, else ~/.config/ndd]
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
}

impl HomeArg {
    fn dir(&self) -> PathBuf {
        self.home.clone().unwrap_or_else(ndd_link::default_home)
    }
}

/// What a one-line share runs, beside its device.
#[derive(Debug, Args)]
struct ShareRun {
    /// Print the driver's config (TOML) instead of running it: save it under /etc/ndd to run
    /// the share as a service.
    #[arg(long)]
    print_config: bool,
    /// Print a live stats line per stream every second (on stderr).
    #[arg(long)]
    stats: bool,
    #[command(flatten)]
    home: HomeArg,
}

#[derive(Debug, Subcommand)]
enum ShareWhat {
    /// A serial port (the device side of examples/serial.toml).
    #[command(group(clap::ArgGroup::new("way").required(true).args(["to", "listen"])))]
    Serial {
        /// The port: /dev/ttyUSB0, /dev/ttyACM0, …
        port: PathBuf,
        /// Connect to HOST[:PORT] (default port 7882), where `ndd attach serial` runs.
        #[arg(long, value_name = "HOST")]
        to: Option<String>,
        /// Listen on ADDR instead (e.g. 0.0.0.0:7882), for `ndd attach serial --from`.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Line speed.
        #[arg(long, default_value_t = 115200)]
        baud: u32,
        #[command(flatten)]
        run: ShareRun,
    },
    /// This machine's X desktop, shown and used on the machine running `ndd attach
    /// desktop` (the app side of examples/desktop.toml).
    #[command(group(clap::ArgGroup::new("way").required(true).args(["to", "listen"])))]
    Desktop {
        /// Connect to HOST[:PORT] (default port 7890), where `ndd attach desktop` runs.
        #[arg(long, value_name = "HOST")]
        to: Option<String>,
        /// Listen on ADDR instead, for `ndd attach desktop --from`.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// The X display shared [default: :0]; given, the desktop is an X11 one.
        #[arg(long)]
        display: Option<String>,
        /// Which desktop this is: x11, wayland (sway, Hyprland, river…) or gnome; by default
        /// found out (WAYLAND_DISPLAY and what its compositor offers, else X11). The other
        /// machine says the same: `ndd attach desktop --session …`.
        #[arg(long, value_enum)]
        session: Option<crate::share::Session>,
        #[command(flatten)]
        run: ShareRun,
    },
    /// This machine's microphone and speakers, for the programs on the machine running `ndd
    /// attach audio` (the device side of examples/audio.toml).
    #[command(group(clap::ArgGroup::new("way").required(true).args(["to", "listen"])))]
    Audio {
        /// Connect to HOST[:PORT] (default port 7884), where `ndd attach audio` runs.
        #[arg(long, value_name = "HOST")]
        to: Option<String>,
        /// Listen on ADDR instead, for `ndd attach audio --from`.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        #[command(flatten)]
        run: ShareRun,
    },
    /// This machine's keyboard and mouse, driving the programs on the machine running `ndd
    /// attach input` (the device side of examples/input.toml): a window covering this X
    /// display takes what you type and click, or --device takes an event device.
    #[command(group(clap::ArgGroup::new("way").required(true).args(["to", "listen"])))]
    Input {
        /// Connect to HOST[:PORT] (default port 7886), where `ndd attach input` runs.
        #[arg(long, value_name = "HOST")]
        to: Option<String>,
        /// Listen on ADDR instead, for `ndd attach input --from`.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// The X display whose keyboard and mouse are shared.
        #[arg(long, default_value = ":0", conflicts_with = "device")]
        display: String,
        /// A Linux event device instead (/dev/input/by-id/…-event-kbd), taken exclusively
        /// while shared.
        #[arg(long, value_name = "PATH")]
        device: Option<PathBuf>,
        #[command(flatten)]
        run: ShareRun,
    },
}

/// Where an attaching side's link goes.
#[derive(Debug, Args)]
struct AttachWay {
    /// Connect to HOST[:PORT] (a share that listens) instead of listening.
    #[arg(long, value_name = "HOST", conflicts_with = "listen")]
    from: Option<String>,
    /// Listen on ADDR (default: 0.0.0.0 on the share's port).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Listening: attach up to N machines' devices at once, each its own session (a lab
    /// server); for a serial port, `{peer}` in --link names each one's (/dev/ttyLAB-{peer}).
    #[arg(long, value_name = "N", default_value_t = 1, conflicts_with = "from",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::config::MAX_PEERS)))]
    peers: u32,
    /// Listening: say on the local network (mDNS) that this side is here, for `ndd
    /// discover` on the sharing machine.
    #[arg(long, conflicts_with = "from")]
    announce: bool,
}

#[derive(Debug, Subcommand)]
enum AttachWhat {
    /// A serial port shared with `ndd share serial` (the app side of examples/serial.toml).
    Serial {
        /// Where the port appears (a symlink to a pty): /dev/ttyREMOTE, /tmp/ttyREMOTE, …
        #[arg(long, value_name = "PATH")]
        link: PathBuf,
        #[command(flatten)]
        way: AttachWay,
        /// Line speed.
        #[arg(long, default_value_t = 115200)]
        baud: u32,
        #[command(flatten)]
        run: ShareRun,
    },
    /// A desktop shared with `ndd share desktop`: shown in a window on this machine's X
    /// display, used with its keyboard and mouse (the device side of examples/desktop.toml).
    Desktop {
        #[command(flatten)]
        way: AttachWay,
        /// The X display the window opens on [default: :0; in a Wayland session $DISPLAY, for
        /// the clipboard through Xwayland]; given, the viewer is an X11 window.
        #[arg(long)]
        display: Option<String>,
        /// Which desktop the other machine shares, as its `ndd share desktop` said: x11,
        /// wayland (sway, Hyprland, river…) or gnome.
        #[arg(long, value_enum, default_value = "x11")]
        session: crate::share::Session,
        /// The viewer: a native Wayland window (wayland) or an X11 one on --display (x11);
        /// by default Wayland in a Wayland session (WAYLAND_DISPLAY), where it keeps the
        /// compositor's shortcuts for the remote desktop.
        #[arg(long, value_enum)]
        viewer: Option<ViewerKind>,
        #[command(flatten)]
        run: ShareRun,
    },
    /// A microphone and speakers shared with `ndd share audio`: a virtual microphone
    /// (ndd_mic) and speaker (ndd_speaker) in this machine's PulseAudio or PipeWire (the app
    /// side of examples/audio.toml).
    Audio {
        #[command(flatten)]
        way: AttachWay,
        #[command(flatten)]
        run: ShareRun,
    },
    /// A keyboard and mouse shared with `ndd share input`, typing and clicking into this
    /// machine's X display (XTEST), or into a virtual input device with --uinput (the app
    /// side of examples/input.toml).
    Input {
        #[command(flatten)]
        way: AttachWay,
        /// The X display the input goes to.
        #[arg(long, default_value = ":0", conflicts_with = "uinput")]
        display: String,
        /// A virtual input device (/dev/uinput) every program sees, X11, Wayland or console.
        #[arg(long)]
        uinput: bool,
        #[command(flatten)]
        run: ShareRun,
    },
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one side of a driver from a config file.
    ///
    /// Both sides use the same file. The side named by `link.listener` (default: app) listens
    /// on `link.address`; the other connects. `--listen`/`--connect` override that.
    Run {
        /// The driver's config file (TOML; see examples/).
        config: PathBuf,
        /// Which side this machine is (default: the file's `side`).
        #[arg(long, value_enum)]
        side: Option<SideName>,
        /// Listen on ADDR (e.g. 0.0.0.0:7878) instead of what the config says.
        #[arg(long, value_name = "ADDR", conflicts_with = "connect")]
        listen: Option<String>,
        /// Connect to ADDR instead of what the config says.
        #[arg(long, value_name = "ADDR")]
        connect: Option<String>,
        /// Plain TCP, no TLS: no authentication, no encryption. Prints a warning.
        #[arg(long)]
        insecure: bool,
        /// Print a live stats line per stream every second (on stderr).
        #[arg(long)]
        stats: bool,
        /// Write the final stats as JSON to FILE on exit.
        #[arg(long, value_name = "FILE")]
        stats_json: Option<PathBuf>,
        /// Stop after SECONDS.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        duration: Option<f64>,
        /// One session: give up connecting after link.connect_timeout_ms, stop when the peer
        /// stops, and end the peer's streams when this side stops. Without it a side outlives
        /// its peer (keeps its endpoints, waits and reconnects forever).
        #[arg(long)]
        once: bool,
        /// Serve the counters (per stream frames, bytes, drops, latency; link state) in
        /// Prometheus' text format at http://ADDR/metrics (e.g. 127.0.0.1:9187).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        #[command(flatten)]
        home: HomeArg,
    },
    /// Run every driver in DIR in this one process: each `NAME.toml` there that names its
    /// `side` (`ndd share … --print-config` writes one). One failing driver never stops
    /// another; a changed file restarts its driver alone, a new one starts, a removed one
    /// stops (the directory is read every 2 s, and at SIGHUP). `ndd status` shows them all.
    Serve {
        /// The directory of driver files.
        #[arg(value_name = "DIR", default_value = "/etc/ndd")]
        dir: PathBuf,
        #[command(flatten)]
        home: HomeArg,
    },
    /// Share a device on this machine in one line: `ndd share serial /dev/ttyUSB0 --to HOST`
    /// (the machine running `ndd attach serial`). The same driver as examples/serial.toml;
    /// trust is as for `ndd run` (`ndd id`, `ndd trust`).
    Share {
        #[command(subcommand)]
        what: ShareWhat,
    },
    /// Attach a device shared from another machine in one line: `ndd attach serial --link
    /// /dev/ttyREMOTE` listens for `ndd share serial … --to THIS_HOST` and makes the port
    /// appear at --link.
    Attach {
        #[command(subcommand)]
        what: AttachWhat,
    },
    /// Both halves on this machine over loopback TLS with a simulated 3D mouse, live stats.
    Demo {
        /// Stop after SECONDS (default: run until Ctrl-C).
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        duration: Option<f64>,
        /// One device side feeding three app sides through a private nats-server (Debian's
        /// nats-server) instead: the NATS link and the multiplex pair.
        #[arg(long)]
        fanout: bool,
        /// Write the final stats as JSON to FILE.
        #[arg(long, value_name = "FILE")]
        stats_json: Option<PathBuf>,
    },
    /// Create this install's key pair and self-signed certificate.
    Keygen {
        /// Replace an existing identity (peers that trusted the old one must trust the new).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        home: HomeArg,
    },
    /// Print this install's fingerprint (creating the identity on first use).
    Id {
        #[command(flatten)]
        home: HomeArg,
    },
    /// Trust a peer's fingerprint (adds it to known_peers).
    Trust {
        /// The peer's fingerprint, as `ndd id` prints it on the peer (SHA256:…).
        fingerprint: String,
        /// A name to remember the peer by.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        home: HomeArg,
    },
    /// Pair with another machine by a one-time code, no fingerprints to copy: `ndd pair` here
    /// shows a code and listens; `ndd pair CODE --connect THIS_HOST` there. Each side then
    /// trusts the other (known_peers), as `ndd trust` would. A code lasts 5 minutes and takes
    /// 3 wrong tries; it is never sent (SPAKE2).
    Pair {
        /// The code the other machine shows: join it (found on the local network, or at
        /// --connect); `1234-5678`, `12345678` and `1234 5678` are the same code. Without
        /// one: show a code and wait.
        #[arg(num_args = 1..=2, value_name = "CODE")]
        code: Vec<String>,
        /// The machine showing the code: HOST, or HOST:PORT (port 7870 by default); without
        /// it, the one machine on the local network announcing a pairing (mDNS).
        #[arg(long, value_name = "HOST", requires = "code")]
        connect: Option<String>,
        /// Where to listen while showing a code.
        #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:7870")]
        listen: String,
        /// The name to remember the peer by (default: the name it gives: its host name).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        home: HomeArg,
    },
    /// Stop trusting a peer (removes it from known_peers): its next connection or join is
    /// refused; a NATS device side also rotates its group key.
    Untrust {
        /// The peer's fingerprint (SHA256:…) or the name it was trusted with.
        peer: String,
        #[command(flatten)]
        home: HomeArg,
    },
    /// List every transformation pair and endpoint with its parameters.
    Modules,
    /// List the ndd sides on the local network that announce themselves (`announce = true`
    /// in [link], mDNS), whether this machine trusts each, and the line that connects to it.
    Discover {
        /// How long to listen for answers, in seconds.
        #[arg(long, default_value_t = 3.0, value_name = "S")]
        seconds: f64,
        #[command(flatten)]
        home: HomeArg,
    },
    /// What every ndd side running on this machine is doing: link, peer, round trip, each
    /// stream's frames, rate, latency and drops, the last error (asked over each side's
    /// socket in $NDD_STATUS_DIR, /run/ndd for root, $XDG_RUNTIME_DIR/ndd or /tmp/ndd-UID).
    Status {
        /// Redraw the table every second until Ctrl-C.
        #[arg(long)]
        watch: bool,
        /// Print each side's status as JSON (one document a line).
        #[arg(long, conflicts_with = "watch")]
        json: bool,
    },
    /// Check config files and print the plan for both sides; with --side, also probe that
    /// side's endpoints (files, device nodes, X displays) on this machine.
    Check {
        /// The config files (each is checked; the exit code is 1 if any fails).
        #[arg(required = true, num_args = 1..)]
        configs: Vec<PathBuf>,
        /// Probe the endpoints this side runs, as `ndd run --side` does before connecting
        /// (default: the side a file names, if it names one).
        #[arg(long, value_enum)]
        side: Option<SideName>,
        /// Also check the trust in this ndd home: this install's identity and the peers
        /// known_peers trusts (none trusted is an error: the peer would be refused).
        #[arg(long, value_name = "DIR")]
        home: Option<PathBuf>,
    },
    /// Print nats-server permissions for each side of a NATS driver, one user per side.
    ///
    /// With one user for every side, any side may read and publish into the others' inboxes
    /// (JetStream's answers to them included) and publish device frames. Each side its own
    /// user with these permissions may do only what its side does; give each side's
    /// [link.nats] its `user` and the `inbox_prefix` printed beside it (docs/links.md, "NATS").
    NatsPermissions {
        /// The driver's config file (`transport = "nats"`).
        config: PathBuf,
        /// The device side's NATS user.
        #[arg(long, value_name = "USER")]
        device: String,
        /// An app side's NATS user and its identity (its name in known_peers, or its
        /// fingerprint), once for each app side: its JetStream consumers are named after the
        /// identity, and its user may use those alone. The identity may be left out when the
        /// driver has no reliable device → app stream.
        #[arg(long = "app", value_name = "USER[=PEER]", required = true)]
        apps: Vec<String>,
        #[command(flatten)]
        home: HomeArg,
    },
    /// The RFB Message Accelerator: a VNC proxy, run next to the VNC server, that keeps a
    /// client-pull viewer fast at high latency (docs/rfb-accel.md).
    ///
    /// Point viewers at --listen instead of the server. Security types None and VNC
    /// authentication pass through untouched. To keep the network leg encrypted and limited to
    /// pinned peers, run it with --tls-listen next to the server, and on each viewer's machine
    /// `ndd rfb-accel --listen 127.0.0.1:5901 --tls-connect SERVER-HOST:PORT`.
    #[command(group(clap::ArgGroup::new("upstream").required(true).args(["server", "tls_connect"])))]
    #[command(group(clap::ArgGroup::new("viewers").required(true).multiple(true).args(["listen", "tls_listen"])))]
    RfbAccel {
        /// Where viewers connect in plain RFB (e.g. 127.0.0.1:5901).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Where `ndd rfb-accel --tls-connect` peers connect: TLS 1.3 with this install's
        /// identity, only peers in known_peers (e.g. 0.0.0.0:5902).
        #[arg(long, value_name = "ADDR")]
        tls_listen: Option<String>,
        /// The VNC server (e.g. 127.0.0.1:5900): accelerate here.
        #[arg(long, value_name = "ADDR")]
        server: Option<String>,
        /// Instead of a server: carry each viewer of --listen over a pinned TLS tunnel to the
        /// `ndd rfb-accel --tls-listen` at ADDR, which accelerates next to the server.
        #[arg(long, value_name = "ADDR", conflicts_with_all = ["server", "tls_listen", "no_accelerate"])]
        tls_connect: Option<String>,
        /// Proxy without pipelining requests (for comparison).
        #[arg(long)]
        no_accelerate: bool,
        #[command(flatten)]
        home: HomeArg,
    },
    /// Benchmarks; each prints figures next to a raw baseline measured in the same run
    /// (`ndd bench --help` lists them). They are the `ndd-bench` program, beside this one or
    /// on the PATH (`cargo build --release -p ndd-bench`; not in the Debian package).
    #[command(disable_help_flag = true)]
    Bench {
        /// The benchmark and its options, handed to `ndd-bench`.
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "ARGS"
        )]
        args: Vec<String>,
    },
    /// Print a shell completion script (e.g. `ndd completions bash > /etc/bash_completion.d/ndd`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (ndd.1 and one per subcommand, ndd-run.1 …) into DIR.
    Man {
        /// Where to write them.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Keeps a pty for a side's next run (started by a `pty` endpoint; see its `keep_s`).
    #[command(hide = true)]
    PtyHold {
        /// The Unix socket sides take the pty back from.
        socket: PathBuf,
        /// The pty's link (let go once it names another pty).
        link: PathBuf,
        /// Seconds kept after the last side let go.
        keep_s: u64,
    },
}

/// Starts `ndd pty-hold` (this executable) for a `pty` endpoint: in a process group of its
/// own (a Ctrl-C at the terminal is for the side, not for it), reaped by a thread.
fn spawn_pty_holder(
    socket: &std::path::Path,
    link: &std::path::Path,
    keep: std::time::Duration,
) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt as _;
    use std::process::Stdio;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("pty-hold")
        .arg(socket)
        .arg(link)
        .arg(keep.as_secs().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// The `ndd` command: parses the arguments, runs, and exits with its code.
pub fn main() {
    ndd_endpoint::tune_allocator();
    let cli = Cli::parse();
    // Commands that only print end quietly when their reader goes away (`| head`). Not
    // `check`: its probes talk to X servers and compositors, and one that resets under the
    // probe (a bare Xvfb when its last client leaves) killed `ndd check` by SIGPIPE without a
    // word (seen once in CI: `check --side` failing with nothing on stderr).
    if matches!(
        cli.cmd,
        Command::Modules | Command::Id { .. } | Command::Completions { .. }
    ) {
        ndd_endpoint::default_sigpipe();
    }
    init_tracing(cli.verbose);
    ndd_endpoint::serial::hold::set_spawner(spawn_pty_holder);
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ndd: error: {}", logfmt::error_text(&e));
            error_code(&e)
        }
    };
    // Virtual sound devices an endpoint thread still holds (one recording as the side ended)
    // are unloaded, or kept for `keep_s`, before the process goes.
    ndd_endpoint::audio::settle_modules();
    std::process::exit(code);
}

/// Exit code 4: the person at the desktop declined a portal's dialog or stopped a share there
/// (a service that starts the side again would only ask again, or share again with the kept
/// grant: `RestartPreventExitStatus=4` in ndd-session@); 1: any other error.
pub const EXIT_DECLINED: i32 = 4;

/// The exit code of a run that failed with `e`: [`EXIT_DECLINED`] when one of this side's
/// own endpoints was refused at the desktop (not when a peer's words say so: a peer ending
/// the session for it is no reason to stay stopped), else 1.
fn error_code(e: &anyhow::Error) -> i32 {
    let declined = e.chain().any(|c| {
        c.downcast_ref::<ndd_endpoint::EndpointError>()
            .is_some_and(|x| ndd_endpoint::refused_at_the_desktop(&x.to_string()))
    });
    if declined {
        EXIT_DECLINED
    } else {
        1
    }
}

fn init_tracing(verbose: u8) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    // The session's notes (connected, link lost, restored) are ndd's own INFO lines: shown by
    // default; other crates' only from -v (but the portal's: a dialog waits at the desktop;
    // the Wayland viewer's: whether the compositor let it keep its shortcuts, which GNOME
    // Shell asks the person first; GNOME's casts and sessions: opened again after a new
    // monitor configuration).
    let default = match verbose {
        0 => "warn,ndd::session=info,ndd::fanout=info,ndd_link::nats::drive=info,ndd::rfbaccel=info,ndd::serve=info,ndd_link::establish=info,ndd_endpoint::serial::tty=info,ndd_endpoint::display::portal=info,ndd_endpoint::input::portal=info,ndd_endpoint::common::portal=info,ndd_endpoint::display::wayland_window=info,ndd_endpoint::display::gnome=info,ndd_endpoint::input::gnome=info",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("NDD_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(board::LogWriter)
        .with_ansi(std::io::stderr().is_terminal())
        .event_format(logfmt::Compact)
        .try_init();
}

/// `ndd bench ARGS`: runs `ndd-bench ARGS` (the benchmarks live in their own program, so
/// this one carries no benchmark or test-support code), the one beside this executable if
/// there is one, else the one on the PATH; its exit code is ours.
fn bench(args: &[String]) -> Result<i32> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("ndd-bench")))
        .filter(|p| p.is_file());
    let program = beside.unwrap_or_else(|| PathBuf::from("ndd-bench"));
    let status = std::process::Command::new(&program)
        .args(args)
        .status()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                anyhow::anyhow!(
                    "ndd bench needs the ndd-bench program, beside ndd or on the PATH: build it with `cargo build --release -p ndd-bench` in ndd's source tree (it is not in the Debian package)"
                )
            } else {
                anyhow::anyhow!("cannot run {}: {e}", program.display())
            }
        })?;
    Ok(status.code().unwrap_or(1))
}

/// `ndd share …`: the sharing side of a one-line share.
fn share(what: ShareWhat) -> Result<i32> {
    use crate::share::{config, with_port, Kind, Link, Local};
    let (kind, to, listen, local, run) = match what {
        ShareWhat::Serial {
            port,
            to,
            listen,
            baud,
            run,
        } => (
            Kind::Serial,
            to,
            listen,
            Local {
                port: Some(port.display().to_string()),
                baud: Some(baud),
                ..Local::default()
            },
            run,
        ),
        ShareWhat::Desktop {
            to,
            listen,
            display,
            session,
            run,
        } => {
            // An X display named is an X11 desktop.
            let session = session.or(display.as_ref().map(|_| crate::share::Session::X11));
            let display = display.unwrap_or_else(|| ":0".into());
            let (session, wayland) = desktop_session(session)?;
            (
                Kind::Desktop,
                to,
                listen,
                Local {
                    display: Some(display),
                    session,
                    wayland,
                    ..Local::default()
                },
                run,
            )
        }
        ShareWhat::Audio { to, listen, run } => (Kind::Audio, to, listen, Local::default(), run),
        ShareWhat::Input {
            to,
            listen,
            display,
            device,
            run,
        } => (
            Kind::Input,
            to,
            listen,
            Local {
                display: Some(display),
                device: device.map(|d| d.display().to_string()),
                ..Local::default()
            },
            run,
        ),
    };
    let link = match (to, listen) {
        (Some(h), _) => Link::Connect(checked(with_port(&h, kind.port()), "--to")?),
        (None, Some(a)) => Link::Listen(checked(a, "--listen")?),
        (None, None) => bail!("say where the other machine is: --to HOST, or --listen ADDR"),
    };
    let side = kind.sharing_side();
    let peer = match &link {
        Link::Listen(a) => Some(crate::share::peer_command(kind, side, a, local.session)),
        Link::Connect(_) => None,
    };
    // A desktop other than X11: the other machine must say so too (its streams follow).
    if let (Kind::Desktop, Link::Connect(_), false) = (kind, &link, run.print_config) {
        if local.session != crate::share::Session::X11 {
            eprintln!(
                "ndd: sharing this {} desktop; on the other machine: ndd attach desktop --session {}",
                local.session.name(),
                local.session.name()
            );
        }
    }
    one_line(
        config(kind, side, &link, &local),
        side,
        "ndd share",
        run,
        peer,
    )
}

/// Which desktop `ndd share desktop` shares (`asked`, else found out) and, for a wlroots
/// compositor, its Wayland display: a Wayland session (WAYLAND_DISPLAY) whose compositor
/// offers capture and virtual input is `wayland`, one where mutter's screen cast answers is
/// `gnome`; another Wayland desktop is an error naming what to use; no Wayland session is X11.
fn desktop_session(
    asked: Option<crate::share::Session>,
) -> Result<(crate::share::Session, Option<String>)> {
    use crate::share::Session;
    let wayland = std::env::var("WAYLAND_DISPLAY")
        .ok()
        .filter(|d| !d.is_empty());
    let wlroots = |d: &str| -> Result<bool> {
        let offer = ndd_endpoint::wayland_session(d).map_err(|e| {
            anyhow::anyhow!(
                "this looks like a Wayland session (WAYLAND_DISPLAY={d}), but {e}; --session x11 shares an X display instead"
            )
        })?;
        let ok = |what: &str| offer.iter().any(|o| o.what == what && o.ok);
        Ok(ok("wayland-screen")
            && ok("wayland-input (keys)")
            && ok("wayland-input (pointer)")
            && ok("wayland-clipboard"))
    };
    // GNOME is whoever answers mutter's screen-cast API (what else is missing, GStreamer's
    // PipeWire source say, the run names).
    let gnome = || match ndd_endpoint::SourceConfig::GnomeScreen(Default::default()).probe() {
        Ok(()) => true,
        Err(e) => !e.to_string().contains("not a GNOME Wayland session"),
    };
    match (asked, wayland) {
        (Some(Session::Wayland), None) => bail!(
            "--session wayland: WAYLAND_DISPLAY is not set (run this in the Wayland session, or set it to the compositor's socket)"
        ),
        (Some(Session::Wayland), Some(d)) => Ok((Session::Wayland, Some(d))),
        (Some(s), _) => Ok((s, None)),
        (None, None) => Ok((Session::X11, None)),
        (None, Some(d)) => {
            if wlroots(&d)? {
                Ok((Session::Wayland, Some(d)))
            } else if gnome() {
                Ok((Session::Gnome, None))
            } else {
                bail!(
                    "this is a Wayland session (WAYLAND_DISPLAY={d}) whose compositor offers neither wlroots' screen capture and virtual input nor GNOME's screen cast: on KDE Plasma or another desktop share it with a config of portal-screen and kde-input or portal-input (docs/devices.md \"Wayland\"; `ndd check --side app FILE` says what this session offers), or share its X11 programs only with --session x11"
                )
            }
        }
    }
}

/// The viewer `ndd attach desktop --viewer` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ViewerKind {
    /// An X11 window on --display (Xwayland in a Wayland session).
    X11,
    /// A native Wayland window on WAYLAND_DISPLAY.
    Wayland,
}

/// The Wayland viewer `ndd attach desktop` opens (`asked`, else in a Wayland session), and
/// how that desktop's clipboard is reached: the data-control protocol where the compositor
/// offers it, GNOME's API on GNOME, else Xwayland's.
fn wayland_viewer(asked: Option<ViewerKind>) -> Result<Option<crate::share::WaylandViewer>> {
    use crate::share::{ViewerClipboard, WaylandViewer};
    let wayland = std::env::var("WAYLAND_DISPLAY")
        .ok()
        .filter(|d| !d.is_empty());
    let display = match (asked, wayland) {
        (Some(ViewerKind::X11), _) | (None, None) => return Ok(None),
        (Some(ViewerKind::Wayland), None) => bail!(
            "--viewer wayland: WAYLAND_DISPLAY is not set (run this in the Wayland session, or set it to the compositor's socket)"
        ),
        (_, Some(d)) => d,
    };
    let offer = match ndd_endpoint::wayland_session(&display) {
        Ok(offer) => offer,
        Err(e) => {
            if asked.is_some() {
                bail!("--viewer wayland: WAYLAND_DISPLAY={display}: {e}");
            }
            // (A stale WAYLAND_DISPLAY, a build without Wayland: the X11 window, as before.)
            eprintln!("ndd: WAYLAND_DISPLAY={display} does not answer ({e}): the viewer is an X11 window on --display");
            return Ok(None);
        }
    };
    let offered = |what: &str| offer.iter().any(|o| o.what == what && o.ok);
    // The clipboard: the compositor's data-control protocol, else Xwayland's (mutter bridges
    // it, PRIMARY included), else GNOME's remote-desktop API.
    let xwayland = std::env::var("DISPLAY").is_ok_and(|d| !d.is_empty());
    let clipboard = if offered("wayland-clipboard") {
        ViewerClipboard::DataControl
    } else if xwayland {
        ViewerClipboard::Xwayland
    } else if ndd_endpoint::SourceConfig::GnomeClipboard(Default::default())
        .probe()
        .is_ok()
    {
        ViewerClipboard::Gnome
    } else {
        bail!(
            "this Wayland session (WAYLAND_DISPLAY={display}) offers the clipboard no way ndd takes: no data-control protocol, no Xwayland (DISPLAY), no GNOME remote-desktop API; --viewer x11 --display … opens an X11 window instead"
        )
    };
    Ok(Some(WaylandViewer { display, clipboard }))
}

/// `ndd attach …`: the attaching side of a one-line share.
fn attach(what: AttachWhat) -> Result<i32> {
    use crate::share::{config, with_port, Kind, Link, Local};
    let (kind, way, local, run) = match what {
        AttachWhat::Serial {
            link,
            way,
            baud,
            run,
        } => (
            Kind::Serial,
            way,
            Local {
                pty: Some(link.display().to_string()),
                baud: Some(baud),
                ..Local::default()
            },
            run,
        ),
        AttachWhat::Desktop {
            way,
            display,
            session,
            viewer,
            run,
        } => {
            // An X display named is the X11 viewer's.
            let viewer = viewer.or(display.as_ref().map(|_| ViewerKind::X11));
            let viewer = wayland_viewer(viewer)?;
            // The clipboard through Xwayland: the session's X display.
            let display = match (display, &viewer, std::env::var("DISPLAY")) {
                (Some(d), _, _) => d,
                (None, Some(_), Ok(d)) if !d.is_empty() => d,
                _ => ":0".to_string(),
            };
            (
                Kind::Desktop,
                way,
                Local {
                    display: Some(display),
                    session,
                    viewer,
                    ..Local::default()
                },
                run,
            )
        }
        AttachWhat::Audio { way, run } => (Kind::Audio, way, Local::default(), run),
        AttachWhat::Input {
            way,
            display,
            uinput,
            run,
        } => (
            Kind::Input,
            way,
            Local {
                display: Some(display),
                uinput,
                ..Local::default()
            },
            run,
        ),
    };
    let mut local = local;
    if way.peers > 1 {
        match (kind, &local.pty) {
            (Kind::Audio, _) => bail!(
                "--peers {}: one machine's sound at a time (the virtual microphone and speaker have one name each)",
                way.peers
            ),
            (Kind::Serial, Some(p)) if !p.contains("{peer}") => bail!(
                "--peers {}: each machine's port needs a path of its own: put {{peer}} in --link, e.g. --link /dev/ttyLAB-{{peer}} (each machine's name in known_peers)",
                way.peers
            ),
            _ => {}
        }
        local.peers = Some(way.peers);
    } else if local.pty.as_deref().is_some_and(|p| p.contains("{peer}")) {
        bail!("--link with {{peer}} names one port per machine: give --peers N (how many at once)");
    }
    local.announce = way.announce;
    let link = match (way.from, way.listen) {
        (Some(h), _) => Link::Connect(checked(with_port(&h, kind.port()), "--from")?),
        (None, Some(a)) => Link::Listen(checked(a, "--listen")?),
        (None, None) => Link::Listen(format!("0.0.0.0:{}", kind.port())),
    };
    let side = kind.sharing_side().other();
    let peer = match &link {
        Link::Listen(a) => Some(crate::share::peer_command(kind, side, a, local.session)),
        Link::Connect(_) => None,
    };
    one_line(
        config(kind, side, &link, &local),
        side,
        "ndd attach",
        run,
        peer,
    )
}

/// Prints a one-line share's config, or runs it as `ndd run` would (outliving its peer).
/// `addr` once its port is a port (said under the option the user wrote, not the config key
/// the share writes it to).
fn checked(addr: String, option: &str) -> Result<String> {
    config::check_address(&addr, option)?;
    Ok(addr)
}

fn one_line(
    text: String,
    side: SideName,
    what: &str,
    run: ShareRun,
    peer_hint: Option<String>,
) -> Result<i32> {
    if run.print_config {
        print!("{text}");
        return Ok(0);
    }
    let cfg = Config::parse(&text, Path::new(what))?;
    run_config(
        cfg,
        RunArgs {
            side,
            listen: None,
            connect: None,
            insecure: false,
            stats: run.stats,
            stats_json: None,
            duration: None,
            once: false,
            metrics: None,
            home: run.home,
            peer_hint,
        },
    )
}

/// What `ndd run` (and a one-line share) does with a config: checks, runs the side, reports.
struct RunArgs {
    side: SideName,
    listen: Option<String>,
    connect: Option<String>,
    insecure: bool,
    stats: bool,
    stats_json: Option<PathBuf>,
    duration: Option<f64>,
    once: bool,
    metrics: Option<String>,
    home: HomeArg,
    /// How the peer starts, for the lonely hint (a one-line share's other line).
    peer_hint: Option<String>,
}

fn run_config(cfg: Config, a: RunArgs) -> Result<i32> {
    let RunArgs {
        side,
        listen,
        connect,
        insecure,
        stats,
        stats_json,
        duration: d,
        once,
        metrics,
        home,
        peer_hint,
    } = a;
    cfg.build_pairs()?;
    let d = duration(d)?;
    if let Some(a) = &listen {
        config::check_address(a, "--listen")?;
    }
    if let Some(a) = &connect {
        config::check_address(a, "--connect")?;
    }
    let from_flag = connect.is_some();
    let endpoint = match (listen, connect) {
        (Some(a), _) => Endpoint::Listen(a),
        (None, Some(a)) => Endpoint::Connect(a),
        (None, None) if cfg.link.listener == side => Endpoint::Listen(cfg.link.address.clone()),
        (None, None) => Endpoint::Connect(cfg.link.address.clone()),
    };
    if let (Endpoint::Connect(a), false) = (
        &endpoint,
        cfg.link.transport == session::TransportKind::Nats,
    ) {
        let what = if from_flag {
            "--connect"
        } else {
            "link.address"
        };
        config::check_connect_target(a, what)?;
    }
    if let Some(path) = &stats_json {
        check_writable(path, "--stats-json")?;
    }
    let opts = RunOptions {
        side,
        home: home.dir(),
        endpoint,
        insecure,
        live_stats: stats.then_some(Duration::from_secs(1)),
        duration: d,
        quiet: false,
        once,
        metrics,
        peer_hint,
        label: None,
    };
    let rt = runtime()?;
    let report = rt.block_on(async {
        let stop = ctrl_c();
        session::run_side_task(std::sync::Arc::new(cfg), opts, stop).await
    });
    // The side has ended and said what it left behind; an endpoint's thread still in a
    // system call (a FIFO nobody opens) is not waited for: dropped, the runtime waited
    // for it forever.
    rt.shutdown_timeout(Duration::from_secs(1));
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            // What was counted until the error, then the error.
            let failed = e.downcast_ref::<session::SideFailed>();
            if let Some(d) = failed.and_then(|f| f.report.link_drops) {
                say_drops(side, d);
            }
            if let Some(path) = &stats_json {
                let mut v = failed.map(|f| stats_value(side, &f.report)).unwrap_or_else(
                    || serde_json::json!({ "side": side.to_string(), "streams": [] }),
                );
                v["error"] = serde_json::Value::String(logfmt::error_text(&e));
                if let Err(w) = write_json(path, &v) {
                    eprintln!("ndd: warning: {}", logfmt::error_text(&w));
                }
            }
            return Err(e);
        }
    };
    if let Some(d) = report.link_drops {
        say_drops(side, d);
    }
    if let Some((off, rtt)) = report.clock_offset {
        eprintln!(
            "ndd [{side}]: clock offset to the peer {:+.3} ms (round trip {:.3} ms)",
            off as f64 / 1e6,
            rtt as f64 / 1e6
        );
    }
    if !report.recoveries.is_empty() {
        let ms: Vec<String> = report
            .recoveries
            .iter()
            .map(|d| format!("{:.0} ms", d.as_secs_f64() * 1e3))
            .collect();
        eprintln!(
            "ndd [{side}]: {} reconnect(s), recovered in {}",
            ms.len(),
            ms.join(", ")
        );
    }
    let mut ok = true;
    for (name, c) in &report.checks {
        if !report.checks_said {
            eprintln!("ndd [{side}]: stream \"{name}\": {c}");
        }
        ok &= c.is_ok();
    }
    if let Some(path) = stats_json {
        write_json(&path, &stats_value(side, &report))?;
    }
    Ok(if ok { 0 } else { 3 })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn duration(secs: Option<f64>) -> Result<Option<Duration>> {
    match secs {
        None => Ok(None),
        // At most a year: beyond that, leave --duration out (run until stopped).
        Some(s) if s.is_finite() && s > 0.0 && s <= 366.0 * 86400.0 => {
            Ok(Duration::try_from_secs_f64(s).ok())
        }
        Some(s) => anyhow::bail!(
            "--duration must be a positive number of seconds up to one year (31622400), not {s}; \
             leave it out to run until stopped"
        ),
    }
}

/// That a file can be written at `path` (made and removed if it was not there), so a run
/// that would end by failing to write its stats fails at start instead.
fn check_writable(path: &Path, what: &str) -> Result<()> {
    if path.is_dir() {
        anyhow::bail!(
            "{what} {}: is a directory; give a file's path",
            path.display()
        );
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("{what} {}: cannot write there", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// What `--stats-json` holds for one side.
fn stats_value(side: config::SideName, report: &session::RunReport) -> serde_json::Value {
    serde_json::json!({
        "side": side.to_string(),
        "peer": report.peer,
        "clock_offset_ns": report.clock_offset.map(|c| c.0),
        "rtt_ns": report.clock_offset.map(|c| c.1),
        "recoveries_ms": report.recoveries.iter().map(|d| d.as_secs_f64() * 1e3).collect::<Vec<_>>(),
        "link_dropped": report.link_drops,
        "streams": report.streams,
    })
}

/// The final count of datagrams a UDP link dropped, if any (the live warning comes at most
/// every 5 s: its last counts would never show).
fn say_drops(side: config::SideName, d: ndd_link::udp::DropCounts) {
    if d.total() > 0 {
        eprintln!(
            "ndd [{side}]: the UDP link dropped {} datagram(s): {} unauthenticated, {} replayed, {} garbage",
            d.total(),
            d.unauthenticated,
            d.replayed,
            d.garbage
        );
    }
}

fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Command::Run {
            config,
            side,
            listen,
            connect,
            insecure,
            stats,
            stats_json,
            duration,
            once,
            metrics,
            home,
        } => {
            let cfg = Config::load(&config)?;
            let side = side.or(cfg.side).ok_or_else(|| {
                anyhow::anyhow!(
                    "say which side this machine is: --side device or --side app (or side = \"device\" in {})",
                    config.display()
                )
            })?;
            run_config(
                cfg,
                RunArgs {
                    side,
                    listen,
                    connect,
                    insecure,
                    stats,
                    stats_json,
                    duration,
                    once,
                    metrics,
                    home,
                    peer_hint: None,
                },
            )
        }
        Command::Serve { dir, home } => {
            let rt = runtime()?;
            rt.block_on(async {
                let stop = ctrl_c();
                let reload = std::sync::Arc::new(tokio::sync::Notify::new());
                let hup = reload.clone();
                tokio::spawn(async move {
                    use tokio::signal::unix::{signal, SignalKind};
                    if let Ok(mut s) = signal(SignalKind::hangup()) {
                        while s.recv().await.is_some() {
                            hup.notify_one();
                        }
                    }
                });
                crate::serve::serve(dir, home.dir(), stop, reload).await
            })?;
            rt.shutdown_timeout(Duration::from_secs(1));
            Ok(0)
        }
        Command::Share { what } => share(what),
        Command::Attach { what } => attach(what),
        Command::Demo {
            duration: d,
            fanout,
            stats_json,
        } => {
            let rt = runtime()?;
            if fanout {
                if stats_json.is_some() {
                    anyhow::bail!("--stats-json is not available with --fanout");
                }
                rt.block_on(demo::run_fanout(duration(d)?))
            } else {
                rt.block_on(demo::run(duration(d)?, stats_json))
            }
        }
        Command::Keygen { force, home } => {
            let dir = home.dir();
            let id = ndd_link::Identity::create(&dir, force)
                .with_context(|| format!("cannot create an identity in {}", dir.display()))?;
            println!("created identity in {}", dir.display());
            println!("fingerprint: {}", id.fingerprint());
            Ok(0)
        }
        Command::Status { watch, json } => status_cmd(watch, json),
        Command::Discover { seconds, home } => {
            if !(0.1..=600.0).contains(&seconds) {
                anyhow::bail!("--seconds {seconds}: give 0.1 to 600");
            }
            crate::discover::run(&home.dir(), Duration::from_secs_f64(seconds))
        }
        Command::Id { home } => {
            let id = session::load_identity(&home.dir())?;
            println!("{}", id.fingerprint());
            Ok(0)
        }
        Command::Trust {
            fingerprint,
            name,
            home,
        } => {
            let dir = home.dir();
            let added = ndd_link::KnownPeers::trust(&dir, &fingerprint, name.as_deref())
                .with_context(|| format!("cannot update known_peers in {}", dir.display()))?;
            if added {
                println!(
                    "trusted {fingerprint}{}",
                    name.map(|n| format!(" ({n})")).unwrap_or_default()
                );
            } else {
                println!("{fingerprint} was already trusted");
            }
            Ok(0)
        }
        Command::Pair {
            code,
            connect,
            listen,
            name,
            home,
        } => {
            let rt = runtime()?;
            let dir = home.dir();
            if code.is_empty() {
                rt.block_on(crate::pair::offer(&listen, &dir, name.as_deref()))
            } else {
                rt.block_on(crate::pair::join(
                    &code.join(" "),
                    connect.as_deref(),
                    &dir,
                    name.as_deref(),
                ))
            }
        }
        Command::Untrust { peer, home } => {
            let dir = home.dir();
            let removed = ndd_link::KnownPeers::untrust(&dir, &peer)
                .with_context(|| format!("cannot update known_peers in {}", dir.display()))?;
            if removed.is_empty() {
                bail!(
                    "no peer with fingerprint or name {peer:?} in {}",
                    dir.join(ndd_link::KNOWN_PEERS_FILE).display()
                );
            }
            for fp in removed {
                println!("no longer trusted: {fp}");
            }
            Ok(0)
        }
        Command::Modules => {
            print!("{}", catalogue_text());
            Ok(0)
        }
        Command::NatsPermissions {
            config,
            device,
            apps,
            home,
        } => {
            print!(
                "{}",
                nats_permissions(&config, &device, &apps, &home.dir())?
            );
            Ok(0)
        }
        Command::Check {
            configs,
            side,
            home,
        } => {
            let mut failed = 0;
            if let Some(dir) = &home {
                if let Err(e) = check_trust(dir) {
                    failed += 1;
                    eprintln!("ndd: error: {}", logfmt::error_text(&e));
                }
            }
            for config in &configs {
                match check_one(config, side) {
                    Ok(()) => {}
                    Err(e) => {
                        failed += 1;
                        eprintln!("ndd: error: {}", logfmt::error_text(&e));
                    }
                }
            }
            if failed > 0 && configs.len() > 1 {
                eprintln!("ndd: {failed} of {} config files failed", configs.len());
            }
            Ok(if failed > 0 { 1 } else { 0 })
        }
        Command::RfbAccel {
            listen,
            tls_listen,
            server,
            tls_connect,
            no_accelerate,
            home,
        } => {
            let opts = ndd_rfb::AccelOptions {
                accelerate: !no_accelerate,
                ..ndd_rfb::AccelOptions::default()
            };
            let plan = rfbaccel::Plan {
                listen,
                tls_listen,
                server,
                tls_connect,
                home: home.dir(),
            };
            let rt = runtime()?;
            rt.block_on(async {
                tokio::select! {
                    r = rfbaccel::run(plan, opts) => r,
                    _ = tokio::signal::ctrl_c() => Ok(()),
                }
            })?;
            Ok(0)
        }
        Command::Bench { args } => bench(&args),
        Command::PtyHold {
            socket,
            link,
            keep_s,
        } => {
            ndd_endpoint::serial::hold::hold(&socket, &link, Duration::from_secs(keep_s))
                .with_context(|| format!("keeping the pty at {}", link.display()))?;
            Ok(0)
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "ndd", &mut std::io::stdout());
            Ok(0)
        }
        Command::Man { dir } => {
            use clap::CommandFactory;
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let cmd = Cli::command();
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("cannot write man pages into {}", dir.display()))?;
            println!("wrote the man pages into {}", dir.display());
            Ok(0)
        }
    }
}

/// `ndd check` of one file: the plan, and with `side` that side's endpoints probed.
/// `ndd check --home DIR`: this install's fingerprint and whom it trusts; none is an error.
fn check_trust(dir: &Path) -> Result<()> {
    let known = ndd_link::KnownPeers::load(dir)
        .with_context(|| format!("cannot read known_peers in {}", dir.display()))?;
    let mut peers: Vec<String> = known
        .iter()
        .map(|(fp, t)| match &t.name {
            Some(n) => format!("{n} ({fp})"),
            None => fp.to_string(),
        })
        .collect();
    peers.sort();
    let me = if dir.join("key.pem").exists() && dir.join("cert.pem").exists() {
        session::load_identity(dir)
            .map(|id| id.fingerprint())
            .unwrap_or_else(|e| format!("unreadable ({e:#})"))
    } else {
        "none yet (`ndd id --home DIR` creates it)".to_string()
    };
    println!("{}: this install {me}", dir.display());
    if peers.is_empty() {
        bail!(
            "{}: known_peers trusts nobody, so the peer would be refused: run `ndd id` on the other machine, then here `ndd trust FINGERPRINT --name NAME --home {}`",
            dir.display(),
            dir.display()
        );
    }
    println!("  trusts {} peer(s): {}", peers.len(), peers.join(", "));
    Ok(())
}

/// What desktop session this machine runs, for `ndd check --side`: the Wayland compositor's
/// offer (each Wayland endpoint and the protocol it needs) and the X display, and a hint when
/// the file uses X11 endpoints on `side` in a Wayland session (they reach only Xwayland
/// programs there).
fn session_here(cfg: &Config, side: SideName) {
    let wayland = std::env::var("WAYLAND_DISPLAY")
        .ok()
        .filter(|d| !d.is_empty());
    let x11 = std::env::var("DISPLAY").ok().filter(|d| !d.is_empty());
    // The compositor the file names (a Wayland endpoint's `display`), when it is not the
    // session's: a service run from a file has no WAYLAND_DISPLAY of its own.
    let named = cfg
        .streams
        .iter()
        .find_map(|s| {
            use ndd_endpoint::{SinkConfig as K, SourceConfig as S};
            match (&s.source, &s.sink) {
                (S::WaylandScreen(c), _) => Some(c.display.clone()),
                (S::WaylandClipboard(c), _) | (_, K::WaylandClipboard(c)) => {
                    Some(c.display.clone())
                }
                (_, K::WaylandInput(c)) => Some(c.display.clone()),
                _ => None,
            }
        })
        .filter(|d| !d.is_empty() && Some(d) != wayland.as_ref());
    let offer = |d: &str| {
        ndd_endpoint::wayland_session(d).map(|offer| {
            offer
                .iter()
                .map(|o| match (o.ok, o.via) {
                    (true, Some(via)) => format!("{} yes ({via})", o.what),
                    (true, None) => format!("{} yes", o.what),
                    (false, _) => format!("{} no ({} missing)", o.what, o.needs),
                })
                .collect::<Vec<String>>()
                .join(", ")
        })
    };
    // GNOME's screen cast and remote desktop are on the session bus, not Wayland globals.
    let gnome = || {
        use ndd_endpoint::SourceConfig as S;
        let said = |what: &str, probe: Result<(), ndd_endpoint::EndpointError>| match probe {
            Ok(()) => format!(", {what} yes"),
            Err(e) if e.to_string().contains("not a GNOME Wayland session") => {
                format!(", {what} no (not GNOME)")
            }
            Err(e) => format!(", {what} no ({e})"),
        };
        let screen = said("gnome-screen", S::GnomeScreen(Default::default()).probe());
        if screen.ends_with("(not GNOME)") {
            return screen;
        }
        let remote = S::GnomeClipboard(Default::default()).probe();
        screen + &said("gnome-input and gnome-clipboard", remote)
    };
    // The xdg-desktop-portal's ScreenCast and RemoteDesktop, on any desktop whose portal
    // offers them.
    let portal = || {
        use ndd_endpoint::{SinkConfig as K, SourceConfig as S};
        let said = |what: &str, probe: Result<(), ndd_endpoint::EndpointError>| match probe {
            Ok(()) => format!(", {what} yes"),
            Err(e) if e.to_string().contains("no xdg-desktop-portal") => {
                format!(", {what} no (no xdg-desktop-portal offering it)")
            }
            Err(e) => format!(", {what} no ({e})"),
        };
        let input = said("portal-input", K::PortalInput(Default::default()).probe());
        // (Which way input goes: over EIS where the portal offers ConnectToEIS.)
        let input = if input.ends_with(" yes") && ndd_endpoint::portal_input_offers_eis("") {
            input + " (EIS)"
        } else {
            input
        };
        said("portal-screen", S::PortalScreen(Default::default()).probe()) + &input
    };
    if let Some(d) = &wayland {
        match offer(d) {
            Ok(list) => println!(
                "session here: Wayland (WAYLAND_DISPLAY={d}): {list}{}{}",
                gnome(),
                portal()
            ),
            Err(e) => println!("session here: WAYLAND_DISPLAY={d} is set, but {e}"),
        }
    }
    if let Some(d) = &named {
        match offer(d) {
            Ok(list) => println!("the file's compositor {d}: {list}"),
            Err(e) => println!("the file's compositor {d}: {e}"),
        }
    }
    if let Some(d) = &x11 {
        println!("session here: X11 display {d} (DISPLAY)");
    }
    if wayland.is_none() && x11.is_none() && named.is_none() {
        println!("session here: no desktop session (neither WAYLAND_DISPLAY nor DISPLAY is set)");
    }
    // Only this side's endpoints: a GNOME app side's file names the device side's X11 viewer.
    let uses_x11 = cfg.streams.iter().any(|s| {
        (s.direction.source_side() == side && s.source.name().starts_with("x11-"))
            || (s.direction.sink_side() == side
                && (s.sink.name().starts_with("x11-") || s.sink.name() == "xtest"))
    });
    if wayland.is_some() && uses_x11 {
        println!(
            "note: this session runs Wayland: X11 endpoints reach only Xwayland programs here; on a wlroots compositor use wayland-screen, wayland-input and wayland-clipboard, on GNOME gnome-screen, gnome-input and gnome-clipboard, on KDE Plasma kde-input and wayland-clipboard, on any desktop with an xdg-desktop-portal portal-screen and portal-input (docs/devices.md \"Wayland\")"
        );
    }
}

/// `ndd nats-permissions`: the permission blocks (as nats-server variables) and the lines
/// each side's config needs. App sides' identities (`USER=PEER`) are looked up in `home`'s
/// known_peers when not fingerprints.
fn nats_permissions(config: &Path, device: &str, apps: &[String], home: &Path) -> Result<String> {
    use std::fmt::Write;
    let cfg = Config::load(config)?;
    if cfg.link.transport != session::TransportKind::Nats {
        bail!(
            "{}: driver \"{}\" does not use the NATS link (set transport = \"nats\" in [link])",
            config.display(),
            cfg.driver
        );
    }
    let subjects =
        ndd_link::nats::subjects::Subjects::new(&cfg.link.nats.subject_prefix, &cfg.driver)
            .map_err(|e| anyhow::anyhow!(e))?;
    // An app side's consumers are named after its identity: without one none can be named.
    let needs_identity = !crate::fanout::consumers(&cfg, SideName::App, "")?.is_empty();
    let known = std::cell::OnceCell::new();
    let identity = |user: &str, peer: Option<&str>| -> Result<String> {
        let Some(peer) = peer else {
            if needs_identity {
                bail!(
                    "--app {user}: give the app side's identity too, --app {user}=NAME (its name in known_peers) or --app {user}=FINGERPRINT: driver \"{}\" has reliable device → app streams, read through JetStream consumers named after it",
                    cfg.driver
                );
            }
            return Ok(String::new());
        };
        if ndd_link::trust::validate_fingerprint(peer).is_ok() {
            return Ok(peer.to_string());
        }
        let peers = known
            .get_or_init(|| ndd_link::KnownPeers::load(home).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("--app {user}={peer}: {e}"))?;
        let mut named = peers
            .iter()
            .filter(|(_, t)| t.name.as_deref() == Some(peer))
            .map(|(fp, _)| fp.to_string());
        match (named.next(), named.next()) {
            (Some(fp), None) => Ok(fp),
            (Some(_), Some(_)) => bail!(
                "--app {user}={peer}: {} names more than one peer {peer}; give its fingerprint",
                peers.path().display()
            ),
            (None, _) => bail!(
                "--app {user}={peer}: no peer named {peer} in {} (and it is not a fingerprint); `ndd trust FP --name {peer}` or give the fingerprint",
                peers.path().display()
            ),
        }
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut users = vec![(device.to_string(), None)];
    for a in apps {
        let (user, peer) = match a.split_once('=') {
            Some((u, p)) => (u.to_string(), Some(p)),
            None => (a.clone(), None),
        };
        users.push((user, Some(peer)));
    }
    let mut out = format!(
        "# nats-server permissions for ndd driver \"{}\" (subjects {}.{}.>, JetStream stream {}),\n\
         # one user per side. Put these lines before the server's authorization block and give\n\
         # each user its permissions there, e.g.\n\
         #   authorization {{ users = [ {{ user: \"{device}\", password: \"…\", permissions: $NDD_{}_DEVICE }} ] }}\n",
        cfg.driver,
        cfg.link.nats.subject_prefix,
        cfg.driver,
        subjects.jetstream(),
        var_token(device),
    );
    for (user, _) in &users {
        if !seen.insert(var_token(user)) {
            bail!("--device/--app: user \"{user}\" given twice (or two users that differ only in case or - and _): each side needs its own user");
        }
    }
    for (user, app) in users {
        let inbox = format!("_INBOX_{user}");
        let (side, consumers) = match app {
            None => (
                SideName::Device,
                crate::fanout::consumers(&cfg, SideName::Device, "")?,
            ),
            Some(peer) => {
                let fp = identity(&user, peer)?;
                (
                    SideName::App,
                    crate::fanout::consumers(&cfg, SideName::App, &fp)?,
                )
            }
        };
        let is_device = side == SideName::Device;
        let perms = subjects
            .permissions(is_device, &inbox, &consumers)
            .map_err(|e| {
                anyhow::anyhow!(
                    "user \"{user}\": {e} (a user name here is letters, digits, - and _)"
                )
            })?;
        let (var, side) = if is_device {
            (format!("NDD_{}_DEVICE", var_token(&user)), "device")
        } else {
            (format!("NDD_{}_APP", var_token(&user)), "app")
        };
        let _ = write!(
            out,
            "\n# the {side} side: [link.nats] user = \"{user}\", inbox_prefix = \"{inbox}\"\n{var} = {}\n",
            perms.to_conf()
        );
    }
    Ok(out)
}

/// A user name as part of a nats-server variable name (letters, digits and `_`).
fn var_token(user: &str) -> String {
    user.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn check_one(config: &Path, side: Option<SideName>) -> Result<()> {
    let cfg = Config::load(config)?;
    cfg.build_pairs()?;
    // A file that names its side (a driver for `ndd serve`) is checked as that side.
    let side = side.or(cfg.side);
    if let Some(side) = side {
        session_here(&cfg, side);
        cfg.probe_side(side)?;
    }
    println!(
        "{}: driver \"{}\", {} stream(s), link {}{}",
        config.display(),
        cfg.driver,
        cfg.streams.len(),
        if cfg.link.transport == session::TransportKind::Nats {
            format!(
                "nats {} (subjects {}.{}.*)",
                cfg.link.nats.servers.join(","),
                cfg.link.nats.subject_prefix,
                cfg.driver
            )
        } else {
            format!("{} {}", cfg.link.transport, cfg.link.address)
        },
        match side {
            Some(s) => format!("; the {s} side's endpoints are there"),
            None => String::new(),
        }
    );
    for (i, s) in cfg.streams.iter().enumerate() {
        let stack: Vec<String> = s
            .pairs()
            .iter()
            .map(|m| ndd_core::Pair::describe(*m))
            .collect();
        println!(
            "  stream {} \"{}\" {}, {}, priority {}: {} -> [{}] -> {}",
            Config::stream_id(i),
            s.name(),
            s.direction.wire(),
            match s.reliability {
                config::Reliability::Reliable => "reliable",
                config::Reliability::Lossy => "lossy",
            },
            s.priority().name(),
            s.source.describe(),
            stack.join(", "),
            s.sink.describe()
        );
    }
    Ok(())
}

fn catalogue_text() -> String {
    let mut out = String::from("Transformation pairs (stack = [{ type = \"…\", … }]):\n");
    for m in ndd_modules::CATALOGUE {
        out += &format!("\n  {:<10} id {:<3} {}\n", m.name, m.id, m.summary);
        for p in m.params {
            out += &format!(
                "      {:<14} {:<22} default {:<9} {}\n",
                p.name, p.ty, p.default, p.doc
            );
        }
    }
    for (title, list) in [
        ("Sources", ndd_endpoint::SOURCES),
        ("Sinks", ndd_endpoint::SINKS),
    ] {
        out += &format!(
            "\n{title} ({} = {{ type = \"…\", … }}):\n",
            title.to_lowercase().trim_end_matches('s')
        );
        for e in list {
            out += &format!("\n  {:<13} {}\n", e.name, e.summary);
            for (name, ty, default, doc) in e.params {
                out += &format!("      {name:<14} {ty:<22} default {default:<9} {doc}\n");
            }
        }
    }
    out
}

/// `ndd status`: the table of every side answering in the status directory.
fn status_cmd(watch: bool, json: bool) -> Result<i32> {
    let dir = crate::status::status_dir();
    loop {
        let all = crate::status::read_all(&dir)?;
        if json {
            for s in &all {
                println!("{}", serde_json::to_string(s)?);
            }
            return Ok(if all.is_empty() { 1 } else { 0 });
        }
        let text = if all.is_empty() {
            format!(
                "no ndd side is running here (none answers in {}; `ndd run` serves its status there)\n",
                dir.display()
            )
        } else {
            crate::status::table(&all)
        };
        if !watch {
            print!("{text}");
            return Ok(if all.is_empty() { 1 } else { 0 });
        }
        // Home, clear, the table.
        print!("\x1b[H\x1b[2J{text}");
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// A dialog declined at the desktop ends the run with the code the desktop session's unit
    /// does not restart on; any other error with 1.
    #[test]
    fn a_declined_dialog_exits_with_the_code_the_session_unit_does_not_restart_on() {
        let unit = include_str!("../../../packaging/user/ndd-session@.service");
        assert!(
            unit.contains(&format!("\nRestartPreventExitStatus={EXIT_DECLINED}\n")),
            "{unit}"
        );
        // This side's endpoint, as a source's failure reaches the side.
        let mine = anyhow::Error::new(ndd_endpoint::EndpointError::Unavailable {
            endpoint: "portal-screen",
            what: format!("Start: {}", ndd_endpoint::DECLINED_AT_THE_DESKTOP),
            hint: "run it again to be asked again".into(),
        })
        .context("stream \"screen\": source portal-screen failed");
        assert_eq!(error_code(&mine), EXIT_DECLINED);
        // A share stopped at the desktop (GNOME's indicator) is as final.
        let stopped = anyhow::Error::new(ndd_endpoint::EndpointError::Unavailable {
            endpoint: "gnome-screen",
            what: format!(
                "mutter closed the screen cast: {}",
                ndd_endpoint::STOPPED_AT_THE_DESKTOP
            ),
            hint: String::new(),
        });
        assert_eq!(error_code(&stopped), EXIT_DECLINED);
        // The peer's words (its CLOSE reason) say the same: not this side's refusal.
        let theirs = anyhow::anyhow!(
            "the peer closed the session (internal error): stream \"screen\": source portal-screen failed: portal-screen: Start: {}",
            ndd_endpoint::DECLINED_AT_THE_DESKTOP
        );
        assert_eq!(error_code(&theirs), 1);
        assert_eq!(
            error_code(&anyhow::anyhow!("cannot connect to 10.0.0.2:7000: refused")),
            1
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_example_config_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("examples/ exists") {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Config::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                n += 1;
            }
        }
        assert!(n >= 3, "expected example configs, found {n}");
    }

    #[test]
    fn modules_lists_every_pair_and_endpoint() {
        let text = catalogue_text();
        for m in ndd_modules::CATALOGUE {
            assert!(text.contains(m.name), "{}", m.name);
        }
        for e in ndd_endpoint::SOURCES.iter().chain(ndd_endpoint::SINKS) {
            assert!(text.contains(e.name), "{}", e.name);
        }
    }
}
