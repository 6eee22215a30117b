//! `ndd-cli`: the `ndd` binary's library: config, the wiring of endpoints, stacks and links
//! into a running side (`session`), the NATS fan-out driver, stats, the demo and the RFB
//! accelerator. The binary (`main.rs`) is its command line; `ndd-bench` (crates/bench) drives
//! the same code for the benchmarks, so the production binary carries no benchmark or test
//! support crate.
//!
//! Layer: the top. Errors are `anyhow` with context; every error ends the process with one
//! clear line on stderr and a non-zero exit code, never a panic.

pub mod board;
pub mod cli;
pub mod config;
pub mod demo;
pub mod discover;
pub mod fanout;
pub mod logfmt;
pub mod pair;
pub mod rfbaccel;
pub mod serve;
pub mod session;
pub mod share;
pub mod stats;
pub mod status;

use anyhow::{Context, Result};
use std::path::Path;

/// A watch channel that turns true on Ctrl-C (SIGINT) or SIGTERM: either stops the side
/// cleanly (stacks flushed, peer told, pty symlinks removed).
pub fn ctrl_c() -> tokio::sync::watch::Receiver<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let term = async {
            match signal(SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            r = tokio::signal::ctrl_c() => if r.is_ok() { let _ = tx.send(true); },
            _ = term => { let _ = tx.send(true); },
        }
        // Keep the sender alive so receivers do not see a closed channel.
        std::future::pending::<()>().await;
    });
    rx
}

/// Writes `value` as pretty JSON to `path` (`--stats-json`).
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n")
        .with_context(|| format!("cannot write stats to {}", path.display()))
}
