//! External modules end to end: real processes (Python, C, Rust) and in-process children,
//! over pipes and shared memory; failures, restarts, zombies; interchangeability.

use ndd_core::{Frame, FrameError, Half, HalfStats, Meta, ModuleError, Output, Pair, Role, Stack};
use ndd_ipc::child::{from_fn, Handler, HandlerError, Replies};
use ndd_ipc::{ExternalConfig, ExternalHalf, HalfRole, Placement, Restart};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/modules")
}

fn rust_upper() -> String {
    env!("CARGO_BIN_EXE_ndd-ipc-upper").to_string()
}

fn meta(seq: u64) -> Meta {
    Meta {
        stream: 1,
        seq,
        timestamp_ns: 1000 + seq,
        flags: 0,
    }
}

fn python() -> ExternalConfig {
    let d = examples();
    ExternalConfig::new(
        "upper",
        &["python3", d.join("upper.py").to_str().unwrap()],
        &["python3", d.join("lower.py").to_str().unwrap()],
    )
}

fn c_module() -> ExternalConfig {
    let out = std::env::temp_dir().join(format!("ndd-ipc-upper-c-{}", std::process::id()));
    if !out.exists() {
        let st = std::process::Command::new("cc")
            .args(["-O2", "-Wall", "-Werror", "-o"])
            .arg(&out)
            .arg(examples().join("upper.c"))
            .status()
            .expect("cc runs");
        assert!(st.success(), "upper.c builds");
    }
    let p = out.to_str().unwrap();
    ExternalConfig::new("upper", &[p], &[p, "--inverse"])
}

fn rust(placement: Placement) -> ExternalConfig {
    let b = rust_upper();
    let mut c = ExternalConfig::new("upper", &[&b], &[&b, "--inverse"]);
    c.placement = placement;
    c
}

/// The in-process reference: plain halves, function calls.
struct Upper(bool);
impl Half for Upper {
    fn handle_frame(
        &mut self,
        _: Instant,
        mut f: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let p = f.payload_mut();
        if self.0 {
            p.make_ascii_lowercase()
        } else {
            p.make_ascii_uppercase()
        }
        out.push(f);
        Ok(())
    }
}

/// A checksum-like built-in layer: appends a byte sum, the inverse checks and strips it.
struct Sum(bool);
impl Half for Sum {
    fn handle_frame(
        &mut self,
        _: Instant,
        mut f: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        if !self.0 {
            let s: u32 = f.payload().iter().map(|&b| b as u32).sum();
            f.push_header(&s.to_be_bytes());
        } else {
            let h = f.pop_header(4).ok_or(FrameError::Invalid {
                pair: "sum",
                rule: "short",
            })?;
            let want = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
            let s: u32 = f.payload().iter().map(|&b| b as u32).sum();
            if s != want {
                return Err(ModuleError::from(FrameError::Invalid {
                    pair: "sum",
                    rule: "sum",
                }));
            }
        }
        out.push(f);
        Ok(())
    }
    fn stats(&self) -> HalfStats {
        HalfStats::default()
    }
}

fn upper_handler(inverse: bool) -> Box<dyn Handler> {
    Box::new(from_fn(move |_, meta, p: &[u8], out: &mut Replies<'_>| {
        out.frame_owned(
            meta,
            if inverse {
                p.to_ascii_lowercase()
            } else {
                p.to_ascii_uppercase()
            },
        );
        Ok(())
    }))
}

enum Variant {
    Builtin,
    Thread(Placement),
    Process(ExternalConfig),
}

fn halves(v: &Variant, role: HalfRole) -> Box<dyn Half> {
    let inv = role == HalfRole::Inverse;
    match v {
        Variant::Builtin => Box::new(Upper(inv)),
        Variant::Thread(p) => {
            let mut c = ExternalConfig::new("upper", &["-"], &["-"]);
            c.placement = *p;
            c.ring_kib = 16;
            Box::new(ExternalHalf::in_process(&c, role, move || upper_handler(inv)).unwrap())
        }
        Variant::Process(c) => match role {
            HalfRole::Forward => c.forward().unwrap(),
            HalfRole::Inverse => c.inverse().unwrap(),
        },
    }
}

/// Runs payloads through source stack [upper, sum] and sink stack; returns (wire, delivered).
type Delivered = Vec<(Meta, Vec<u8>)>;

fn run(v: &Variant, payloads: &[Vec<u8>]) -> (Vec<Vec<u8>>, Delivered) {
    let mut src = Stack::from_halves(
        Role::Source,
        "s",
        vec![
            ("external", halves(v, HalfRole::Forward)),
            ("sum", Box::new(Sum(false))),
        ],
    );
    let mut sink = Stack::from_halves(
        Role::Sink,
        "s",
        vec![
            ("external", halves(v, HalfRole::Inverse)),
            ("sum", Box::new(Sum(true))),
        ],
    );
    let now = Instant::now();
    let mut wire = vec![];
    let mut got = vec![];
    for (i, p) in payloads.iter().enumerate() {
        src.handle_frame(now, Frame::new(meta(i as u64), p))
            .unwrap();
        while let Some(f) = src.poll_frame() {
            let m = f.meta;
            let b = f.into_bytes();
            wire.push(b.to_vec());
            sink.handle_frame(now, Frame::from_bytes(m, b)).unwrap();
        }
        while let Some(f) = sink.poll_frame() {
            got.push((f.meta, f.payload().to_vec()));
        }
    }
    (wire, got)
}

fn sample_payloads() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![b"hello, world".to_vec(), vec![], b"abc xyz 0123".to_vec()];
    // Lower-case text of various sizes, one larger than a 16 KiB ring.
    for (i, n) in [100usize, 4095, 4096, 70_000, 300_000]
        .into_iter()
        .enumerate()
    {
        v.push((0..n).map(|j| b'a' + ((j * 7 + i) % 26) as u8).collect());
    }
    v
}

#[test]
fn placements_are_interchangeable_byte_for_byte() {
    let payloads = sample_payloads();
    let (ref_wire, ref_got) = run(&Variant::Builtin, &payloads);
    assert_eq!(ref_got.len(), payloads.len());
    for (i, (m, p)) in ref_got.iter().enumerate() {
        assert_eq!(*m, meta(i as u64));
        assert_eq!(p, &payloads[i], "round trip restores lower-case text");
    }
    let mut shm_small = rust(Placement::Shm);
    shm_small.ring_kib = 4; // frames up to 75x the ring
    shm_small.arena_kib = 64; // the 70 KB and 300 KB frames take the ring, the rest the area
    let mut shm_no_area = rust(Placement::Shm);
    shm_no_area.arena_kib = 0;
    let variants = [
        ("thread pipe", Variant::Thread(Placement::Pipe)),
        ("thread shm", Variant::Thread(Placement::Shm)),
        ("rust shm, no frame area", Variant::Process(shm_no_area)),
        ("python pipe", Variant::Process(python())),
        ("c pipe", Variant::Process(c_module())),
        ("rust pipe", Variant::Process(rust(Placement::Pipe))),
        ("rust shm", Variant::Process(rust(Placement::Shm))),
        ("rust shm 4 KiB ring", Variant::Process(shm_small)),
    ];
    for (name, v) in &variants {
        let (wire, got) = run(v, &payloads);
        assert!(
            wire == ref_wire,
            "{name}: wire bytes differ from in-process"
        );
        assert!(
            got == ref_got,
            "{name}: delivered frames differ from in-process"
        );
    }
}

#[test]
fn two_process_shm_stress_random_sizes_every_byte() {
    let b = rust_upper();
    let mut c = ExternalConfig::new("pass", &[&b, "--pass"], &[&b, "--pass"]);
    c.placement = Placement::Shm;
    c.ring_kib = 8;
    c.spin = 100;
    c.timeout_ms = 10_000;
    let mut h = ExternalHalf::spawn(&c, HalfRole::Forward).unwrap();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let now = Instant::now();
    for i in 0..400u64 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let n = (s % 40_000) as usize; // up to 5x the ring
        let p: Vec<u8> = (0..n).map(|j| (s >> (j % 50)) as u8 ^ j as u8).collect();
        let mut out = Output::new();
        h.handle_frame(now, Frame::new(meta(i), &p), &mut out)
            .unwrap();
        let f = out.take_frames();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].meta, meta(i));
        assert!(f[0].payload() == &p[..], "frame {i} of {n} bytes");
    }
}

/// Counts how the child got its frames: in place (`FRAME_IN_ARENA`) or copied (`FRAME`).
struct Counting {
    in_place: Arc<AtomicU64>,
    copied: Arc<AtomicU64>,
}

impl Handler for Counting {
    fn frame<'a>(
        &mut self,
        _: u64,
        meta: Meta,
        p: &'a [u8],
        out: &mut Replies<'a>,
    ) -> Result<(), HandlerError> {
        self.copied.fetch_add(1, Ordering::SeqCst);
        out.frame_owned(meta, p.to_ascii_uppercase());
        Ok(())
    }

    fn frame_in_place<'a>(
        &mut self,
        _: u64,
        meta: Meta,
        p: &'a mut [u8],
        out: &mut Replies<'a>,
    ) -> Result<(), HandlerError> {
        self.in_place.fetch_add(1, Ordering::SeqCst);
        p.make_ascii_uppercase();
        // Answer with a part of the area (the frame less its first byte): an offset too.
        out.frame(meta, &p[1..]);
        Ok(())
    }
}

#[test]
fn shm_children_rewrite_frames_in_place_and_larger_frames_take_the_ring() {
    for (placement, arena_kib, sizes, want_in_place) in [
        (Placement::Shm, 64, vec![1, 100, 65_536], 3),
        (Placement::Shm, 64, vec![65_537, 200_000], 0),
        (Placement::Shm, 0, vec![1, 100], 0),
        (Placement::Pipe, 64, vec![1, 100], 0),
    ] {
        let in_place = Arc::new(AtomicU64::new(0));
        let copied = Arc::new(AtomicU64::new(0));
        let mut c = ExternalConfig::new("count", &["-"], &["-"]);
        c.placement = placement;
        c.ring_kib = 16;
        c.arena_kib = arena_kib;
        let (a, b) = (in_place.clone(), copied.clone());
        let mut h = ExternalHalf::in_process(&c, HalfRole::Forward, move || {
            Box::new(Counting {
                in_place: a.clone(),
                copied: b.clone(),
            })
        })
        .unwrap();
        let now = Instant::now();
        for (i, &n) in sizes.iter().enumerate() {
            let p: Vec<u8> = (0..n).map(|j| b'a' + (j % 26) as u8).collect();
            let mut out = Output::new();
            h.handle_frame(now, Frame::new(meta(i as u64), &p), &mut out)
                .unwrap();
            let f = out.take_frames();
            assert_eq!(f.len(), 1);
            assert_eq!(f[0].meta, meta(i as u64));
            let mut want = p.to_ascii_uppercase();
            if want_in_place > 0 {
                want.remove(0);
            }
            assert!(f[0].payload() == &want[..], "{placement:?} {n} bytes");
        }
        let case = format!("{placement:?}, area {arena_kib} KiB, sizes {sizes:?}");
        assert_eq!(in_place.load(Ordering::SeqCst), want_in_place, "{case}");
        assert_eq!(
            copied.load(Ordering::SeqCst),
            sizes.len() as u64 - want_in_place,
            "{case}"
        );
    }
}

#[test]
fn a_frame_said_to_lie_outside_the_area_is_refused() {
    let b = rust_upper();
    let mut c = ExternalConfig::new("hostile", &[&b, "--bad-arena"], &[&b]);
    c.placement = Placement::Shm;
    c.arena_kib = 4;
    let mut h = ExternalHalf::spawn(&c, HalfRole::Forward).unwrap();
    let mut out = Output::new();
    let e = h
        .handle_frame(Instant::now(), Frame::new(meta(0), b"abc"), &mut out)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"hostile\"")
            && e.contains(
                "wrote garbage: invalid field: OUT_FRAME_IN_ARENA outside the frame area"
            ),
        "{e}"
    );
    assert!(out.take_frames().is_empty());
}

fn pid_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => {
            // A recycled pid would not be our child; a zombie shows state Z.
            let state = s
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .chars()
                .next();
            assert_ne!(state, Some('Z'), "pid {pid} is a zombie");
            !s.contains("ndd-ipc-upper") && !s.contains("python3")
        }
    }
}

#[test]
fn a_crashing_child_is_named_reaped_and_restarted_once() {
    let b = rust_upper();
    let mut c = ExternalConfig::new("crashy", &[&b, "--crash-after", "2"], &[&b]);
    let now = Instant::now();
    for placement in [Placement::Pipe, Placement::Shm] {
        c.placement = placement;
        c.restart = Restart::Never;
        let mut h = ExternalHalf::spawn(&c, HalfRole::Forward).unwrap();
        let pid = h.pid().unwrap();
        let mut out = Output::new();
        for i in 0..2 {
            h.handle_frame(now, Frame::new(meta(i), b"ab"), &mut out)
                .unwrap();
        }
        let e = h
            .handle_frame(now, Frame::new(meta(2), b"ab"), &mut out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("external module \"crashy\" (forward half"),
            "{e}"
        );
        assert!(e.contains("exited") && e.contains("3"), "{e}");
        assert!(pid_gone(pid), "crashed child reaped");

        c.restart = Restart::OnFailure;
        let mut h = ExternalHalf::spawn(&c, HalfRole::Forward).unwrap();
        let mut out = Output::new();
        let mut n = 0;
        for i in 0..5 {
            h.handle_frame(now, Frame::new(meta(i), b"ab"), &mut out)
                .unwrap();
            n += out.take_frames().len();
        }
        assert_eq!(n, 5, "every frame answered across restarts");
        // Crashes on frames 2 and 4: each failure restarts once.
        assert_eq!(h.restarts(), 2);
        assert!(h.stats().counters.contains(&("restarts", 2)));
    }
}

#[test]
fn a_hung_child_times_out_with_a_clear_error_and_is_killed() {
    let b = rust_upper();
    for placement in [Placement::Pipe, Placement::Shm] {
        let mut c = ExternalConfig::new("sleepy", &[&b, "--hang"], &[&b]);
        c.placement = placement;
        c.timeout_ms = 100;
        let mut h = ExternalHalf::spawn(&c, HalfRole::Forward).unwrap();
        let pid = h.pid().unwrap();
        let t = Instant::now();
        let e = h
            .handle_frame(
                Instant::now(),
                Frame::new(meta(0), b"x"),
                &mut Output::new(),
            )
            .unwrap_err()
            .to_string();
        assert!(t.elapsed() >= Duration::from_millis(100));
        assert!(
            e.contains("\"sleepy\"") && e.contains("did not answer within 100 ms"),
            "{e}"
        );
        assert!(pid_gone(pid));
    }
}

#[test]
fn a_child_writing_garbage_is_refused_at_start() {
    let b = rust_upper();
    let c = ExternalConfig::new("noisy", &[&b, "--garbage"], &[&b]);
    let e = ExternalHalf::spawn(&c, HalfRole::Forward)
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"noisy\"") && e.contains("garbage"), "{e}");
    let c = ExternalConfig::new("missing", &["/nonexistent/module"], &["x"]);
    let e = ExternalHalf::spawn(&c, HalfRole::Forward)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"missing\"") && e.contains("cannot start"),
        "{e}"
    );
}

#[test]
fn a_failing_program_is_a_typed_external_error() {
    use ndd_core::SetupError;
    use ndd_ipc::error::StartError;
    use ndd_ipc::ExternalError;
    let c = ExternalConfig::new("missing", &["/nonexistent/module"], &["x"]);
    let Err(ModuleError::Setup(e)) = ExternalHalf::spawn(&c, HalfRole::Forward) else {
        panic!("a missing program is a setup error");
    };
    let SetupError::Foreign(f) = &*e else {
        panic!("not an external module's error: {e:?}");
    };
    match f.downcast_ref::<ExternalError>() {
        Some(ExternalError::Start {
            who,
            source: StartError::Spawn { argv, source },
        }) => {
            assert_eq!(who.name, "missing");
            assert_eq!(argv, &["/nonexistent/module"]);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn dropping_halves_leaves_no_zombies() {
    let mut pids = vec![];
    for c in [python(), c_module(), rust(Placement::Shm)] {
        let f = ExternalHalf::spawn(&c, HalfRole::Forward).unwrap();
        let i = ExternalHalf::spawn(&c, HalfRole::Inverse).unwrap();
        pids.push(f.pid().unwrap());
        pids.push(i.pid().unwrap());
    }
    for p in pids {
        assert!(pid_gone(p), "pid {p} reaped");
    }
}

/// A handler that holds frames until a timer, and answers control messages.
struct Holder {
    held: Vec<(Meta, Vec<u8>)>,
}
impl Handler for Holder {
    fn frame<'a>(
        &mut self,
        now: u64,
        m: Meta,
        p: &'a [u8],
        out: &mut Replies<'a>,
    ) -> Result<(), HandlerError> {
        self.held.push((m, p.to_vec()));
        out.wake_at(Some(now + 5_000_000));
        Ok(())
    }
    fn control<'a>(
        &mut self,
        _: u64,
        msg: &'a [u8],
        out: &mut Replies<'a>,
    ) -> Result<(), HandlerError> {
        if msg == b"bad" {
            return Err(HandlerError::module("bad control"));
        }
        out.control(&[msg, b"!"].concat());
        Ok(())
    }
    fn timeout(&mut self, _: u64, out: &mut Replies<'_>) -> Result<(), HandlerError> {
        for (m, p) in self.held.drain(..) {
            out.frame_owned(m, p);
        }
        Ok(())
    }
}

#[test]
fn timers_and_control_messages_cross_the_boundary() {
    for placement in [Placement::Pipe, Placement::Shm] {
        let mut c = ExternalConfig::new("holder", &["-"], &["-"]);
        c.placement = placement;
        let mut h =
            ExternalHalf::in_process(&c, HalfRole::Inverse, || Box::new(Holder { held: vec![] }))
                .unwrap();
        let t0 = Instant::now();
        let mut out = Output::new();
        h.handle_frame(t0, Frame::new(meta(0), b"a"), &mut out)
            .unwrap();
        h.handle_frame(t0, Frame::new(meta(1), b"b"), &mut out)
            .unwrap();
        assert!(out.take_frames().is_empty());
        let wake = h.poll_timeout().expect("child asked for a wake-up");
        let d = wake - t0;
        assert!(
            d >= Duration::from_millis(5) && d < Duration::from_millis(6),
            "{d:?}"
        );
        h.handle_timeout(wake, &mut out);
        let f = out.take_frames();
        assert_eq!(f.len(), 2);
        assert_eq!(f[1].payload(), b"b");
        assert_eq!(h.poll_timeout(), None);
        h.handle_control(t0, bytes::Bytes::from_static(b"hi"), &mut out)
            .unwrap();
        assert_eq!(out.take_control(), vec![bytes::Bytes::from_static(b"hi!")]);
        let e = h
            .handle_control(t0, bytes::Bytes::from_static(b"bad"), &mut out)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "malformed control message: external module \"holder\" (inverse half, {}) \
                 failed on a control message: bad control",
                placement.as_str()
            )
        );
    }
}

#[test]
fn config_parses_with_defaults_and_refuses_unknown_keys() {
    let c: ExternalConfig = toml::from_str(
        r#"name = "upper"
forward = ["python3", "upper.py"]
inverse = ["python3", "lower.py"]
placement = "shm"
restart = "on-failure""#,
    )
    .unwrap();
    assert_eq!(c.placement, Placement::Shm);
    assert_eq!(c.restart, Restart::OnFailure);
    assert_eq!(c.timeout_ms, 1000);
    assert_eq!(c.describe(), "external(name=upper)");
    assert_eq!(c.id(), 100);
    assert_eq!(c.name(), "external");
    c.validate().unwrap();
    let e = toml::from_str::<ExternalConfig>(
        "name = \"u\"\nforward = [\"a\"]\ninverse = [\"b\"]\ntimeout = 5",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("unknown field `timeout`"), "{e}");
    let mut bad = c.clone();
    bad.ring_kib = 3;
    assert!(bad.validate().unwrap_err().to_string().contains("ring_kib"));
    assert_eq!(c.arena_kib, 4096);
    let mut bad = c.clone();
    bad.arena_kib = 6;
    let e = bad.validate().unwrap_err().to_string();
    assert!(
        e.contains("arena_kib") && e.contains("multiple of 4"),
        "{e}"
    );
}
