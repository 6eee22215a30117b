//! The session state machine (`ndd_core::session`) fed whatever a peer could send: the input
//! is cut into messages (a one-byte opcode, then a whole wire message where the opcode asks
//! for one) and each is handed to a session with a reliable sink stream (checksum + bundle),
//! a reliable source stream (bundle) and a lossy sink, interleaved with source frames, link
//! losses and reconnects, and time moving on. Nothing may panic; a session that returns an
//! error is closed and yields nothing but its CLOSE.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use ndd_core::session::{Incoming, Session, SessionConfig, State, StreamPlan};
use ndd_core::{Frame, Meta, Pair, Role};
use ndd_modules::ModuleConfig;
use ndd_wire::{DataHeader, Message};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAX_BODY: u32 = 1 << 20;

fn pairs(texts: &[&str]) -> Vec<Arc<dyn Pair + Send + Sync>> {
    texts
        .iter()
        .map(|t| {
            let m: ModuleConfig = toml::from_str(t).expect("pair config");
            Arc::new(m) as Arc<dyn Pair + Send + Sync>
        })
        .collect()
}

/// The session under test; `keeps`: whether its source keeps its frames for a restarted
/// peer (`StreamPlan::keeps_frames`; the screen's does not).
fn session(keeps: bool) -> Session {
    let plans = vec![
        StreamPlan {
            id: 1,
            name: "in".into(),
            role: Role::Sink,
            reliable: true,
            release_on_loss: true,
            replay_outage: true,
            keeps_frames: true,
            priority: Default::default(),
            pairs: pairs(&["type = \"checksum\"", "type = \"bundle\"\ncount = 3"]),
        },
        StreamPlan {
            id: 2,
            name: "out".into(),
            role: Role::Source,
            reliable: true,
            release_on_loss: false,
            replay_outage: true,
            keeps_frames: keeps,
            priority: Default::default(),
            pairs: pairs(&["type = \"bundle\"\ncount = 2"]),
        },
        StreamPlan {
            id: 3,
            name: "lossy".into(),
            role: Role::Sink,
            reliable: false,
            release_on_loss: false,
            replay_outage: false,
            keeps_frames: true,
            priority: Default::default(),
            pairs: vec![],
        },
    ];
    let cfg = SessionConfig {
        resume_buffer_bytes: 4096,
        // Small chunks and a small largest frame: the fuzzer reaches cutting and joining.
        chunk_bytes: 16,
        max_frame_bytes: 4096,
        ..SessionConfig::default()
    };
    Session::new(cfg, plans, 7).expect("plans build")
}

fuzz_target!(|data: &[u8]| {
    let t0 = Instant::now();
    let mut now = t0;
    // The first byte's low bit: a source that keeps its frames, or one that does not.
    let mut s = session(data.first().is_none_or(|b| b & 1 == 0));
    // A simulated wall clock (ns), far from zero so frames can be stamped before "now".
    let wall = |now: Instant| 10_000_000_000 + (now - t0).as_nanos() as u64;
    s.handle_link_up(now, wall(now));
    let mut rest = data;
    let mut seq = 0u64;
    while let Some((&op, tail)) = rest.split_first() {
        rest = tail;
        now += Duration::from_millis(u64::from(op & 0x0f));
        let r = match op >> 4 {
            0..=9 => match Message::parse(rest, MAX_BODY) {
                Ok((m, used)) => {
                    let incoming = match m {
                        Message::Data {
                            stream,
                            retransmit,
                            more,
                            seq,
                            timestamp_ns,
                            payload,
                        } => Incoming::Data {
                            header: DataHeader {
                                stream_id: stream,
                                retransmit,
                                more,
                                seq,
                                timestamp_ns,
                            },
                            payload: Bytes::copy_from_slice(payload),
                        },
                        other => Incoming::Other(other.to_owned_message()),
                    };
                    rest = &rest[used..];
                    s.handle_message(now, 1, incoming)
                }
                Err(_) => break,
            },
            10 => {
                seq += 1;
                // Made up to 15 × 97 ms before it is handed over: the fuzzer reaches the rule
                // that input made during an outage and handed over late is stale.
                let meta = Meta {
                    stream: 2,
                    seq,
                    timestamp_ns: wall(now) - u64::from(op & 0x0f) * 97_000_000,
                    flags: 0,
                };
                let len = usize::from(op & 0x0f) * 97;
                if s.source_ready(1) {
                    s.handle_source_frame(now, 1, Frame::new(meta, &vec![op; len]))
                } else {
                    Ok(())
                }
            }
            11 => s.handle_source_end(now, 1),
            12 => s.handle_link_lost(now, "fuzz"),
            13 => {
                s.handle_link_up(now, wall(now));
                Ok(())
            }
            14 => s.handle_timeout(now),
            _ => {
                s.handle_sink_completed(0, u64::from(op));
                s.close(now)
            }
        };
        while s.poll_transmit(now, 2).is_some() {}
        while s.poll_event().is_some() {}
        if r.is_err() {
            assert_eq!(s.state(), State::Closed, "an error closes the session");
            break;
        }
        if let Some(t) = s.poll_timeout() {
            assert!(t >= t0, "a deadline before the start");
        }
    }
});
