//! The `upper` example module in Rust, for pipe and shm placement (and the tests' misbehaving
//! children). Usage:
//! `ndd-ipc-upper [--inverse | --pass | --crash-after N | --hang | --garbage | --bad-arena]`.
//!
//! Over shm, `upper` and `--inverse` rewrite each frame in place in the shared frame area
//! (no copy on either side of the module); over pipes they build a new payload.

use ndd_core::Meta;
use ndd_ipc::child::{from_fn, run, Handler, HandlerError, Replies};

/// Upper-cases (or, inverse, lower-cases) ASCII letters.
struct Case {
    inverse: bool,
}

impl Case {
    fn apply(&self, p: &mut [u8]) {
        if self.inverse {
            p.make_ascii_lowercase()
        } else {
            p.make_ascii_uppercase()
        }
    }
}

impl Handler for Case {
    fn frame<'a>(
        &mut self,
        _now_ns: u64,
        meta: Meta,
        payload: &'a [u8],
        out: &mut Replies<'a>,
    ) -> Result<(), HandlerError> {
        let mut v = payload.to_vec();
        self.apply(&mut v);
        out.frame_owned(meta, v);
        Ok(())
    }

    fn frame_in_place<'a>(
        &mut self,
        _now_ns: u64,
        meta: Meta,
        payload: &'a mut [u8],
        out: &mut Replies<'a>,
    ) -> Result<(), HandlerError> {
        self.apply(payload);
        out.frame(meta, payload);
        Ok(())
    }
}

/// Over shm: answers every request with a frame said to lie past the end of the frame area
/// (a hostile or buggy child), then `DONE`.
fn bad_arena() -> std::io::Result<()> {
    use ndd_ipc::proto::Reply;
    use ndd_ipc::shm::{self, Waiter};
    let fd: i32 = std::env::var("NDD_SHM_FD")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| std::io::Error::other("--bad-arena needs shm placement"))?;
    let fd = shm::take_inherited_fd(fd)?;
    let (mut p, mut c) = shm::open(&fd, 0)?;
    let arena = p.child_arena().map_or(0, |a| a.len());
    let mut ok = || Ok(());
    let mut first = true;
    loop {
        let mut w = Waiter {
            deadline: std::time::Instant::now() + std::time::Duration::from_secs(3600),
            check: &mut ok,
        };
        if c.read_message(&mut w).is_err() {
            return Ok(());
        }
        let (done, _) = Reply::Done { wake_ns: None }.encode();
        let res = if first {
            first = false;
            p.write(&[&done], &mut w)
        } else {
            let (bad, _) = Reply::FrameInArena {
                meta: Meta::default(),
                off: (arena as u32).wrapping_sub(2),
                len: 3,
            }
            .encode();
            p.write(&[&bad, &done], &mut w)
        };
        if res.is_err() {
            return Ok(());
        }
    }
}

fn main() -> std::io::Result<()> {
    let arg = std::env::args().nth(1).unwrap_or_default();
    let n: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut count = 0u64;
    match arg.as_str() {
        "--pass" => run(from_fn(|_, meta, p, out| {
            out.frame(meta, p);
            Ok(())
        })),
        "--hang" => run(from_fn(|_, _, _, _| {
            std::thread::sleep(std::time::Duration::from_secs(3600));
            Ok(())
        })),
        "--garbage" => {
            use std::io::Write;
            let mut s = std::io::stdout();
            s.write_all(b"hello, I am not a module\n")?;
            s.flush()?;
            std::thread::sleep(std::time::Duration::from_secs(3600));
            Ok(())
        }
        "--crash-after" => run(from_fn(move |_, meta, p, out| {
            count += 1;
            if count > n {
                eprintln!("crashing on purpose after {n} frames");
                std::process::exit(3);
            }
            out.frame_owned(meta, p.to_ascii_uppercase());
            Ok(())
        })),
        "--bad-arena" => bad_arena(),
        "--inverse" => run(Case { inverse: true }),
        _ => run(Case { inverse: false }),
    }
}
