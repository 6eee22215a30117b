//! The `upper` example module in Rust, for pipe and shm placement (and the tests' misbehaving
//! children). Usage: `ndd-ipc-upper [--inverse | --pass | --crash-after N | --hang | --garbage]`.

use ndd_ipc::child::{from_fn, run};

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
        "--inverse" => run(from_fn(|_, meta, p, out| {
            out.frame_owned(meta, p.to_ascii_lowercase());
            Ok(())
        })),
        _ => run(from_fn(|_, meta, p, out| {
            out.frame_owned(meta, p.to_ascii_uppercase());
            Ok(())
        })),
    }
}
