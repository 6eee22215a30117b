//! Unit tests of the session's single steps; whole sessions against each other under faults
//! are in `crates/testkit/tests/session.rs`.

use super::*;
use crate::frame::Meta;
use crate::stack::Role;
use ndd_wire::DataHeader;

fn plan(id: u16, role: Role, reliable: bool) -> StreamPlan {
    StreamPlan {
        id,
        name: format!("s{id}"),
        role,
        reliable,
        release_on_loss: role == Role::Sink,
        replay_outage: true,
        keeps_frames: true,
        priority: Default::default(),
        pairs: vec![],
    }
}

/// A session past both RESUMEs with a reliable source stream at each of `priorities`
/// (stream ids 1, 2, …).
fn sources_at(priorities: &[Priority], budget: usize, now: Instant) -> Session {
    let plans = (1u16..)
        .zip(priorities)
        .map(|(id, &priority)| StreamPlan {
            priority,
            ..plan(id, Role::Source, true)
        })
        .collect();
    resumed(session(plans, budget), now)
}

/// Three frames of `bytes` on stream 1 (index 0) written at `t0` and acknowledged at 5, 10
/// and 15 ms: the path's rate is `bytes` per 5 ms (each ACK a delivery-rate sample from `t0`).
fn acked_at_rate(s: &mut Session, t0: Instant, bytes: usize) {
    for seq in 0..3 {
        s.handle_source_frame(t0, 0, frame(1, seq, bytes)).unwrap();
    }
    drain(s, t0);
    for (seq, ms) in [(0, 5), (1, 10), (2, 15)] {
        let at = t0 + Duration::from_millis(ms);
        s.handle_message(at, 1, Incoming::Other(OwnedMessage::Ack { stream: 1, seq }))
            .unwrap();
    }
}

fn session(plans: Vec<StreamPlan>, budget: usize) -> Session {
    let cfg = SessionConfig {
        resume_buffer_bytes: budget,
        ..SessionConfig::default()
    };
    Session::new(cfg, plans, 7).unwrap()
}

fn frame(stream: u16, seq: u64, len: usize) -> Frame {
    Frame::new(
        Meta {
            stream,
            seq,
            timestamp_ns: 0,
            flags: 0,
        },
        &vec![1; len],
    )
}

fn drain(s: &mut Session, now: Instant) -> Vec<Transmit> {
    std::iter::from_fn(|| s.poll_transmit(now, 1)).collect()
}

/// DATA `seq` on `stream`, one byte.
fn data(stream: u16, seq: u64) -> Incoming {
    Incoming::Data {
        header: DataHeader {
            stream_id: stream,
            retransmit: false,
            more: false,
            seq,
            timestamp_ns: 0,
        },
        payload: Bytes::from_static(b"x"),
    }
}

fn resume(instance: u64) -> Incoming {
    Incoming::Other(OwnedMessage::Resume { instance })
}

/// A sink that took in DATA 5 from peer run 9, lost the link and has a new one.
fn sink_reconnected_after_seq_5(now: Instant) -> Session {
    let mut s = session(vec![plan(1, Role::Sink, true)], 1 << 20);
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(9)).unwrap();
    s.handle_message(now, 1, data(1, 5)).unwrap();
    s.handle_link_lost(now, "cut").unwrap();
    s.handle_link_up(now, 0);
    s
}

#[test]
fn a_new_link_says_only_resume_until_the_peer_has_said_who_it_is() {
    let now = Instant::now();
    let mut s = sink_reconnected_after_seq_5(now);
    // Only RESUME (and the link's first PING), no ACK about seq 5 before the peer's RESUME.
    let first = drain(&mut s, now);
    assert_eq!(
        first,
        vec![
            Transmit::Message(OwnedMessage::Resume { instance: 7 }),
            Transmit::Message(OwnedMessage::Ping { t1: 1 })
        ]
    );
    // Not when the ACK timer comes due either (found by the simulation, seed 122260).
    let later = now + Duration::from_millis(50);
    s.handle_timeout(later).unwrap();
    let acks = drain(&mut s, later)
        .into_iter()
        .filter(|t| matches!(t, Transmit::Message(OwnedMessage::Ack { .. })))
        .count();
    assert_eq!(acks, 0);
    assert!(
        s.poll_timeout().is_some_and(|t| t > later),
        "no spin on a held-back ACK"
    );
    // A restarted peer gets no stale ACK either: just our second RESUME.
    s.handle_message(now, 1, resume(10)).unwrap();
    let second = drain(&mut s, now);
    assert_eq!(
        second,
        vec![Transmit::Message(OwnedMessage::Resume { instance: 7 })]
    );
}

#[test]
fn the_same_peer_gets_its_acks_between_the_two_resumes() {
    let now = Instant::now();
    let mut s = sink_reconnected_after_seq_5(now);
    drain(&mut s, now);
    s.handle_message(now, 1, resume(9)).unwrap();
    assert_eq!(
        drain(&mut s, now),
        vec![
            Transmit::Message(OwnedMessage::Ack { stream: 1, seq: 5 }),
            Transmit::Message(OwnedMessage::Resume { instance: 7 }),
        ]
    );
}

#[test]
fn a_full_resume_buffer_stops_a_reliable_source_but_not_a_lossy_one() {
    let now = Instant::now();
    let mut s = session(
        vec![plan(1, Role::Source, true), plan(2, Role::Source, false)],
        1000,
    );
    s.handle_link_up(now, 0);
    for seq in 0..3 {
        assert!(s.source_ready(0));
        s.handle_source_frame(now, 0, frame(1, seq, 400)).unwrap();
        s.handle_source_frame(now, 1, frame(2, seq, 400)).unwrap();
    }
    assert!(
        !s.source_ready(0),
        "1200 bytes kept over a 1000-byte budget"
    );
    assert!(s.source_ready(1));
    assert_eq!(s.counters(0).overflow, 0);
    assert_eq!(
        s.counters(1).overflow,
        1,
        "the lossy stream dropped its oldest"
    );
    // The peer acknowledges and completes everything: room again.
    s.handle_message(now, 1, resume(9)).unwrap();
    s.handle_message(now, 1, resume(9)).unwrap();
    drain(&mut s, now);
    s.handle_message(
        now,
        1,
        Incoming::Other(OwnedMessage::Ack { stream: 1, seq: 2 }),
    )
    .unwrap();
    s.handle_message(
        now,
        1,
        Incoming::Other(OwnedMessage::Delivered { stream: 1, seq: 2 }),
    )
    .unwrap();
    assert!(s.source_ready(0));
}

/// A session with one reliable source that keeps no frames (a screen), resumed, its resume
/// budget 1000 bytes.
fn screen_source(now: Instant) -> Session {
    let mut s = session(
        vec![StreamPlan {
            keeps_frames: false,
            ..plan(1, Role::Source, true)
        }],
        1000,
    );
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(9)).unwrap();
    s.handle_message(now, 1, resume(9)).unwrap();
    s
}

/// However its frames are stamped, such a source has at most [`stream::UNDELIVERED_FRAMES`]
/// the peer has not completed.
#[test]
fn frames_stamped_alike_are_still_bounded_by_their_number() {
    let now = Instant::now();
    let mut s = screen_source(now);
    for seq in 0..stream::UNDELIVERED_FRAMES as u64 {
        assert!(s.source_ready(0), "frame {seq}");
        s.handle_source_frame(now, 0, frame(1, seq, 10)).unwrap();
        drain(&mut s, now);
        let ack = OwnedMessage::Ack { stream: 1, seq };
        s.handle_message(now, 1, Incoming::Other(ack)).unwrap();
    }
    assert!(!s.source_ready(0));
}

/// A source that sends its whole state to a restarted peer (`keeps_frames = false`, the
/// screen) is not held back by the bytes of its frames (a 1920×1080 capture is 8 MB) but by
/// how many captures the peer has not completed (a capture's frames carry one time), and a
/// restarted peer gets none of them again.
#[test]
fn a_source_that_keeps_no_frames_is_bounded_by_its_captures_not_their_bytes() {
    let now = Instant::now();
    let mut s = screen_source(now);
    // Captures of four frames each (2560×1440), each frame over the byte budget: the last
    // capture the bound lets start holds the source once its first frame went.
    let mut seq = 0u64;
    let last = stream::UNDELIVERED_CAPTURES as u64 - 1;
    for capture in 0..=last {
        for part in 0..4 {
            if capture == last && part > 0 {
                break;
            }
            assert!(
                s.source_ready(0),
                "capture {capture}, frame {seq}: 4000 bytes over a 1000-byte budget"
            );
            let mut f = frame(1, seq, 4000);
            f.meta.timestamp_ns = 1_000 + capture;
            s.handle_source_frame(now, 0, f).unwrap();
            drain(&mut s, now);
            let ack = OwnedMessage::Ack { stream: 1, seq };
            s.handle_message(now, 1, Incoming::Other(ack)).unwrap();
            seq += 1;
        }
    }
    assert!(
        !s.source_ready(0),
        "{} captures the peer has not completed",
        stream::UNDELIVERED_CAPTURES
    );
    // The peer completed the first capture's four frames.
    s.handle_message(
        now,
        1,
        Incoming::Other(OwnedMessage::Delivered { stream: 1, seq: 3 }),
    )
    .unwrap();
    assert!(s.source_ready(0));
    // The peer restarts: nothing is encoded again for it.
    s.handle_link_lost(now, "gone").unwrap();
    drain(&mut s, now);
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(10)).unwrap();
    s.handle_message(now, 1, resume(10)).unwrap();
    let sent = drain(&mut s, now);
    assert!(
        !sent.iter().any(|t| matches!(t, Transmit::Data { .. })),
        "{sent:?}"
    );
    assert!(s.source_ready(0));
}

#[test]
fn a_stray_hello_is_a_warning_and_an_unknown_stream_closes_with_a_reason() {
    let now = Instant::now();
    let mut s = session(vec![plan(1, Role::Sink, true)], 1 << 20);
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, Incoming::Other(OwnedMessage::Ready))
        .unwrap();
    assert!(matches!(s.poll_event(), Some(Event::Warning(w)) if w.contains("handshake")));
    let e = s
        .handle_message(
            now,
            1,
            Incoming::Other(OwnedMessage::Ack { stream: 4, seq: 0 }),
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "the peer sent a message for stream id 4, which is not configured"
    );
    assert_eq!(s.state(), State::Closed);
    let out = drain(&mut s, now);
    assert_eq!(
        out,
        vec![Transmit::Message(OwnedMessage::Close {
            code: CloseCode::ProtocolError,
            reason: e.to_string()
        })]
    );
}

#[test]
fn losing_the_link_releases_input_sinks_and_asks_for_a_new_link() {
    let now = Instant::now();
    let mut s = session(
        vec![plan(1, Role::Sink, true), plan(2, Role::Source, true)],
        1 << 20,
    );
    s.handle_link_up(now, 0);
    s.handle_link_lost(now, "cut").unwrap();
    assert!(matches!(
        s.poll_event(),
        Some(Event::ReleaseInputs { stream: 0 })
    ));
    assert!(matches!(s.poll_event(), Some(Event::LinkLost { reason }) if reason == "cut"));
    assert_eq!(s.state(), State::Disconnected);
    let mut once = session(vec![plan(1, Role::Sink, true)], 1 << 20);
    once.cfg.reconnect = false;
    once.handle_link_up(now, 0);
    assert_eq!(
        once.handle_link_lost(now, "cut").unwrap_err().to_string(),
        "link to the peer failed: cut"
    );
}

#[test]
fn keepalive_declares_a_silent_link_lost() {
    let now = Instant::now();
    let mut s = session(vec![plan(1, Role::Sink, true)], 1 << 20);
    s.handle_link_up(now, 0);
    assert!(
        drain(&mut s, now).contains(&Transmit::Message(OwnedMessage::Ping { t1: 1 })),
        "the first PING goes at once, behind the RESUME"
    );
    s.handle_timeout(now).unwrap();
    let later = now + Duration::from_secs(5);
    s.handle_timeout(later).unwrap();
    let mut reasons = vec![];
    while let Some(e) = s.poll_event() {
        if let Event::LinkLost { reason } = e {
            reasons.push(reason);
        }
    }
    assert_eq!(
        reasons,
        vec!["no message from the peer for 5000 ms".to_string()]
    );
}

/// Sessions that outlive their peer.
fn outliving(plans: Vec<StreamPlan>) -> Session {
    let cfg = SessionConfig {
        outlive_peer: true,
        ..SessionConfig::default()
    };
    Session::new(cfg, plans, 7).unwrap()
}

#[test]
fn told_to_stop_an_outliving_side_sends_its_frames_no_end_and_going_away() {
    let now = Instant::now();
    let mut s = outliving(vec![plan(1, Role::Source, true), plan(2, Role::Sink, true)]);
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(9)).unwrap();
    s.handle_message(now, 1, resume(9)).unwrap();
    drain(&mut s, now);
    s.handle_source_frame(now, 0, frame(1, 0, 3)).unwrap();
    s.close(now).unwrap();
    assert!(!s.source_ready(0), "no new frames once stopping");
    s.handle_source_frame(now, 0, frame(1, 1, 3)).unwrap();
    let out = drain(&mut s, now);
    let kinds: Vec<String> = out
        .iter()
        .map(|t| match t {
            Transmit::Data { seq, .. } => format!("data {seq}"),
            Transmit::Message(m) => format!("{m:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "data 0".to_string(),
            format!(
                "{:?}",
                OwnedMessage::Close {
                    code: CloseCode::GoingAway,
                    reason: "stopped".into()
                }
            )
        ],
        "the frame, no END, then going away"
    );
    assert_eq!(s.state(), State::Closed);
    assert!(!std::iter::from_fn(|| s.poll_event()).any(|e| matches!(e, Event::StreamEnded { .. })));
}

#[test]
fn a_peer_going_away_is_a_lost_link_for_an_outliving_side_and_the_end_with_once() {
    let now = Instant::now();
    let going = Incoming::Other(OwnedMessage::Close {
        code: CloseCode::GoingAway,
        reason: "stopped".into(),
    });
    let mut s = outliving(vec![plan(1, Role::Sink, true), plan(2, Role::Source, true)]);
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(9)).unwrap();
    s.handle_message(now, 1, data(1, 0)).unwrap();
    s.handle_message(now, 1, going.clone()).unwrap();
    let events: Vec<Event> = std::iter::from_fn(|| s.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::PeerStopped { reason } if reason == "the peer stopped")),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::StreamEnded { .. })),
        "the sink stays: {events:?}"
    );
    assert_eq!(s.state(), State::Disconnected, "waiting for the peer");
    // It comes back as a new run: its streams start again.
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(10)).unwrap();
    assert!(std::iter::from_fn(|| s.poll_event()).any(|e| matches!(e, Event::PeerRestarted { .. })));

    // With --once (not outliving), going away ends the session as a normal close does.
    let mut once = session(vec![plan(1, Role::Sink, true)], 1 << 20);
    once.handle_link_up(now, 0);
    once.handle_message(now, 1, resume(9)).unwrap();
    once.handle_message(now, 1, going).unwrap();
    let events: Vec<Event> = std::iter::from_fn(|| once.poll_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::StreamEnded { stream: 0 })),
        "{events:?}"
    );
    assert!(!events
        .iter()
        .any(|e| matches!(e, Event::PeerStopped { .. })));
}

#[test]
fn a_reliable_source_stops_at_its_in_flight_window_and_a_sink_acks_by_bytes() {
    let now = Instant::now();
    // Source: resume buffer 16 MiB, window 1000 bytes.
    let cfg = SessionConfig {
        flight_min_bytes: 1000,
        ..SessionConfig::default()
    };
    let mut s = Session::new(cfg, vec![plan(1, Role::Source, true)], 7).unwrap();
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(9)).unwrap();
    s.handle_message(now, 1, resume(9)).unwrap();
    s.handle_source_frame(now, 0, frame(1, 0, 600)).unwrap();
    assert!(s.source_ready(0), "600 bytes in flight, window 1000");
    s.handle_source_frame(now, 0, frame(1, 1, 600)).unwrap();
    assert!(
        !s.source_ready(0),
        "1200 bytes in flight: no more until an ACK, though the resume buffer has room"
    );
    drain(&mut s, now);
    s.handle_message(
        now,
        1,
        Incoming::Other(OwnedMessage::Ack { stream: 1, seq: 1 }),
    )
    .unwrap();
    assert!(s.source_ready(0), "acknowledged: room again");

    // Sink: ACKs after `ack_bytes` without waiting for `ack_every`.
    let cfg = SessionConfig {
        ack_bytes: 3,
        ..SessionConfig::default()
    };
    let mut k = Session::new(cfg, vec![plan(1, Role::Sink, true)], 8).unwrap();
    k.handle_link_up(now, 0);
    k.handle_message(now, 1, resume(9)).unwrap();
    k.handle_message(now, 1, resume(9)).unwrap();
    drain(&mut k, now);
    let acks = |k: &mut Session| {
        drain(k, now)
            .into_iter()
            .filter(|t| matches!(t, Transmit::Message(OwnedMessage::Ack { .. })))
            .count()
    };
    k.handle_message(now, 1, data(1, 0)).unwrap();
    k.handle_message(now, 1, data(1, 1)).unwrap();
    assert_eq!(acks(&mut k), 0, "2 bytes in: the timer decides");
    k.handle_message(now, 1, data(1, 2)).unwrap();
    assert_eq!(acks(&mut k), 1, "3 bytes in: ACK at once");
}

#[test]
fn a_sink_acks_a_window_floor_of_bytes_at_once_so_a_source_at_its_floor_is_never_starved() {
    // The smallest window a reliable source can have is 64 KiB (flight.rs FLOOR_BYTES). If
    // the sink waited for more than that before an ACK, a source at its floor would send one
    // window per `ack_every` (20 ms): 100 KB frames between two processes ran at 4.7 MB/s.
    let now = Instant::now();
    let mut k = session(vec![plan(1, Role::Sink, true)], 1 << 20);
    k.handle_link_up(now, 0);
    k.handle_message(now, 1, resume(9)).unwrap();
    k.handle_message(now, 1, resume(9)).unwrap();
    drain(&mut k, now);
    let frame = Incoming::Data {
        header: DataHeader {
            stream_id: 1,
            retransmit: false,
            more: false,
            seq: 0,
            timestamp_ns: 0,
        },
        payload: Bytes::from(vec![0u8; 64 << 10]),
    };
    k.handle_message(now, 1, frame).unwrap();
    let acks = drain(&mut k, now)
        .into_iter()
        .filter(|t| matches!(t, Transmit::Message(OwnedMessage::Ack { .. })))
        .count();
    assert_eq!(
        acks, 1,
        "one window floor in: ACK at once, not on the next tick"
    );
}

#[test]
fn a_peer_that_revokes_us_mid_session_is_a_lost_link_with_its_reason_and_the_end_with_once() {
    let now = Instant::now();
    let revoked = Incoming::Other(OwnedMessage::Close {
        code: CloseCode::UntrustedPeer,
        reason: "removed from known_peers".into(),
    });
    let mut s = session(vec![plan(1, Role::Source, true)], 1 << 20);
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(9)).unwrap();
    s.handle_message(now, 1, revoked.clone()).unwrap();
    let events: Vec<Event> = std::iter::from_fn(|| s.poll_event()).collect();
    assert!(
        events.iter().any(|e| matches!(e, Event::LinkLost { reason }
            if reason == "the peer no longer trusts this side: removed from known_peers")),
        "{events:?}"
    );
    assert_eq!(s.state(), State::Disconnected, "reconnecting");

    // Without reconnecting, it ends the session with the peer's code and reason.
    let mut once = Session::new(
        SessionConfig {
            reconnect: false,
            ..SessionConfig::default()
        },
        vec![plan(1, Role::Source, true)],
        7,
    )
    .unwrap();
    once.handle_link_up(now, 0);
    once.handle_message(now, 1, resume(9)).unwrap();
    let e = once.handle_message(now, 1, revoked).unwrap_err();
    assert!(
        matches!(&e, SessionError::PeerClosed { code: CloseCode::UntrustedPeer, reason }
            if reason == "removed from known_peers"),
        "{e:?}"
    );
}

/// A peer's reason reaches a terminal and the log: escape codes and newlines in it are shown
/// as text, and a long one is cut (issue 31, item 5).
#[test]
fn a_peers_close_reason_is_escaped_and_bounded() {
    let now = Instant::now();
    let hostile = format!("bye\x1b[2J\nndd: error: forged line{}", "x".repeat(5000));
    let mut s = Session::new(
        SessionConfig {
            reconnect: false,
            ..SessionConfig::default()
        },
        vec![plan(1, Role::Source, true)],
        7,
    )
    .unwrap();
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(9)).unwrap();
    let e = s
        .handle_message(
            now,
            1,
            Incoming::Other(OwnedMessage::Close {
                code: CloseCode::InternalError,
                reason: hostile,
            }),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("the peer closed the session (")
            && e.contains("): bye\\u{1b}[2J\\nndd: error: forged linexxx"),
        "{e}"
    );
    assert!(e.ends_with("x… (4031 more bytes)"), "{e}");
    assert!(!e.contains('\x1b') && !e.contains('\n'), "{e}");
}

#[test]
fn a_high_priority_stream_goes_before_normal_and_low_ones_round_robin_within_a_class() {
    let now = Instant::now();
    let mut s = sources_at(
        &[
            Priority::Low,
            Priority::Normal,
            Priority::High,
            Priority::High,
        ],
        1 << 20,
        now,
    );
    // Low and normal frames were ready first; the high ones came after them.
    for seq in 0..2 {
        for (i, id) in [(0, 1), (1, 2), (2, 3), (3, 4)] {
            s.handle_source_frame(now, i, frame(id, seq, 3)).unwrap();
        }
    }
    let order: Vec<(u16, u64)> = drain(&mut s, now)
        .into_iter()
        .filter_map(|t| match t {
            Transmit::Data { stream, seq, .. } => Some((stream, seq)),
            Transmit::Message(_) => None,
        })
        .collect();
    assert_eq!(
        order,
        vec![
            (3, 0),
            (4, 0),
            (3, 1),
            (4, 1),
            (2, 0),
            (2, 1),
            (1, 0),
            (1, 1)
        ]
    );
}

#[test]
fn the_in_flight_window_is_sized_by_the_shortest_round_trip_since_the_link_came_up() {
    // A bulk stream that fills a shaper's queue makes every later PONG wait in it: sized by
    // those round trips, the window would keep the queue full (and every small frame in it).
    let t0 = Instant::now();
    let mut s = session(vec![plan(1, Role::Source, true)], 64 << 20);
    s.handle_link_up(t0, 0);
    s.handle_message(t0, 1, resume(9)).unwrap();
    s.handle_message(t0, 1, resume(9)).unwrap();
    // PING at 0, answered at once, back 20 ms later: the path's own round trip.
    let pong = |t4_ms: u64, rtt_ms: u64| {
        let t1 = (t4_ms - rtt_ms) * 1_000_000;
        (
            t4_ms * 1_000_000,
            Incoming::Other(OwnedMessage::Pong {
                t1,
                t2: t1 + 5,
                t3: t1 + 5,
            }),
        )
    };
    let (at, p) = pong(20, 20);
    s.handle_message(t0, at, p).unwrap();
    // 200 MB/s acknowledged: 1 MB every 5 ms.
    acked_at_rate(&mut s, t0, 1_000_000);
    let path = s.flight_window();
    assert!(
        (7_900_000..=8_100_000).contains(&path),
        "2 × 200 MB/s × 20 ms, got {path}"
    );
    // Now 40 PONGs that waited 200 ms in the queue: more than the clock filter keeps.
    for k in 0..40 {
        let (at, p) = pong(1000 + k * 250, 200);
        s.handle_message(t0, at, p).unwrap();
    }
    assert_eq!(
        s.clock().map(|c| c.rtt_ns),
        Some(200_000_000),
        "the clock filter follows the recent round trips"
    );
    assert_eq!(s.flight_window(), path, "the window does not");
    // A new connection measures its path afresh.
    s.handle_link_lost(t0, "cut").unwrap();
    s.handle_link_up(t0, 0);
    let (at, p) = pong(20_000, 200);
    s.handle_message(t0, at, p).unwrap();
    assert!(s.flight_window() > 30_000_000, "{}", s.flight_window());
}

#[test]
fn a_bulk_stream_keeps_a_smaller_window_while_a_more_urgent_stream_is_live() {
    // On a fast short path the window is its 2 MiB floor: an input frame would wait behind
    // that much bulk. While the input stream sends, the bulk stream keeps 200 µs of the path.
    let t0 = Instant::now();
    let mut s = sources_at(
        &[Priority::Normal, Priority::High, Priority::Low],
        64 << 20,
        t0,
    );
    // 1 GB/s acknowledged: 5 MB frames, one every 5 ms.
    acked_at_rate(&mut s, t0, 5_000_000);
    let t = t0 + Duration::from_millis(20);
    s.handle_source_frame(t, 0, frame(1, 3, 1_000_000)).unwrap();
    drain(&mut s, t);
    let full = 2 << 20;
    assert_eq!(s.window_for(0), full, "no input yet");
    assert!(s.source_ready(0), "1 MB in flight, under 2 MiB");

    // The input stream sends a frame: the normal and low streams are held to 200 µs of the
    // path (200 kB at 1 GB/s); the input stream itself is not.
    let t = t + Duration::from_millis(5);
    s.handle_source_frame(t, 1, frame(2, 0, 64)).unwrap();
    drain(&mut s, t);
    for i in [0, 2] {
        let w = s.window_for(i);
        assert!((199_000..=201_000).contains(&w), "stream {i}: {w}");
    }
    assert_eq!(s.window_for(1), full);
    assert!(!s.source_ready(0), "1 MB in flight is over 200 kB");

    // A normal stream's frame holds back only the low one.
    s.handle_timeout(t + Duration::from_millis(300)).unwrap();
    assert_eq!(s.window_for(0), full, "input quiet for 300 ms");
    assert!(s.source_ready(0));
    assert_eq!(s.window_for(2), full);
    let t = t + Duration::from_millis(300);
    s.handle_source_frame(t, 0, frame(1, 4, 10)).unwrap();
    assert_eq!(s.window_for(0), full);
    assert!(s.window_for(2) < full);
}

/// A session past both RESUMEs of peer run 9, its first transmits drained.
fn resumed(mut s: Session, now: Instant) -> Session {
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(9)).unwrap();
    s.handle_message(now, 1, resume(9)).unwrap();
    drain(&mut s, now);
    s
}

/// A new link to the same peer run 9, up to its second RESUME (what it resends not drained).
fn reconnected(mut s: Session, now: Instant) -> Session {
    s.handle_link_up(now, 0);
    s.handle_message(now, 1, resume(9)).unwrap();
    let greeting = drain(&mut s, now);
    assert!(data_shape(&greeting).is_empty());
    s.handle_message(now, 1, resume(9)).unwrap();
    s
}

fn chunked(mut cfg: SessionConfig, plans: Vec<StreamPlan>) -> Session {
    cfg.chunk_bytes = 100;
    Session::new(cfg, plans, 7).unwrap()
}

/// (stream, seq, more, payload length) of each DATA transmit.
fn data_shape(ts: &[Transmit]) -> Vec<(u16, u64, bool, usize)> {
    ts.iter()
        .filter_map(|t| match t {
            Transmit::Data {
                stream,
                seq,
                more,
                payload,
                ..
            } => Some((*stream, *seq, *more, payload.len())),
            Transmit::Message(_) => None,
        })
        .collect()
}

fn delivered(s: &mut Session) -> Vec<(usize, Vec<u8>)> {
    std::iter::from_fn(|| s.poll_event())
        .filter_map(|e| match e {
            Event::Deliver { stream, frame } => Some((stream, frame.payload().to_vec())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_large_frame_goes_out_in_chunks_and_a_small_frame_goes_between_them() {
    let now = Instant::now();
    let high = StreamPlan {
        priority: Priority::High,
        ..plan(2, Role::Source, true)
    };
    let mut src = resumed(
        chunked(
            SessionConfig::default(),
            vec![plan(1, Role::Source, true), high],
        ),
        now,
    );
    let big: Vec<u8> = (0..250u32).map(|i| i as u8).collect();
    src.handle_source_frame(
        now,
        0,
        Frame::new(
            Meta {
                stream: 1,
                seq: 0,
                timestamp_ns: 5,
                flags: 0,
            },
            &big,
        ),
    )
    .unwrap();
    let first = src.poll_transmit(now, 1).unwrap();
    assert_eq!(
        data_shape(std::slice::from_ref(&first)),
        vec![(1, 0, true, 100)]
    );
    // A small frame of a more urgent stream comes while the big one is half out.
    src.handle_source_frame(now, 1, frame(2, 0, 3)).unwrap();
    let rest = drain(&mut src, now);
    assert_eq!(
        data_shape(&rest),
        vec![(2, 0, false, 3), (1, 0, true, 100), (1, 0, false, 50)]
    );
    // The peer joins the chunks into the frame as it was, and takes the small one whole.
    let mut sink = resumed(
        chunked(
            SessionConfig::default(),
            vec![plan(1, Role::Sink, true), plan(2, Role::Sink, true)],
        ),
        now,
    );
    for t in std::iter::once(first).chain(rest) {
        sink.handle_message(now, 1, t.into_incoming()).unwrap();
    }
    assert_eq!(delivered(&mut sink), vec![(1, vec![1; 3]), (0, big)]);
    assert_eq!(sink.counters(0).wire_frames, 1);
    assert_eq!(sink.counters(0).wire_bytes, 250);
}

#[test]
fn a_frame_cut_short_by_a_lost_link_comes_again_whole_and_once() {
    let now = Instant::now();
    let mut src = resumed(
        chunked(SessionConfig::default(), vec![plan(1, Role::Source, true)]),
        now,
    );
    let mut sink = resumed(
        chunked(SessionConfig::default(), vec![plan(1, Role::Sink, true)]),
        now,
    );
    let big: Vec<u8> = (0..250u32).map(|i| (i * 7) as u8).collect();
    src.handle_source_frame(
        now,
        0,
        Frame::new(
            Meta {
                stream: 1,
                seq: 0,
                timestamp_ns: 5,
                flags: 0,
            },
            &big,
        ),
    )
    .unwrap();
    let first = src.poll_transmit(now, 1).unwrap();
    sink.handle_message(now, 1, first.into_incoming()).unwrap();
    // The link goes after the first chunk.
    src.handle_link_lost(now, "cut").unwrap();
    sink.handle_link_lost(now, "cut").unwrap();
    assert!(delivered(&mut sink).is_empty());
    let (mut src, mut sink) = (reconnected(src, now), resumed(sink, now));
    let again = drain(&mut src, now);
    // From its first byte, not from where the old link stopped.
    assert_eq!(
        data_shape(&again),
        vec![(1, 0, true, 100), (1, 0, true, 100), (1, 0, false, 50)]
    );
    for t in again {
        sink.handle_message(now, 1, t.into_incoming()).unwrap();
    }
    assert_eq!(delivered(&mut sink), vec![(0, big.clone())]);
    // Resent once more whole (its ACK was lost with a link), it is a duplicate, not a frame.
    src.handle_link_lost(now, "cut").unwrap();
    let mut src = reconnected(src, now);
    for t in drain(&mut src, now) {
        sink.handle_message(now, 1, t.into_incoming()).unwrap();
    }
    assert!(delivered(&mut sink).is_empty());
    assert_eq!(sink.counters(0).duplicates, 1);
}

#[test]
fn chunks_that_do_not_make_a_frame_close_the_session_with_the_reason() {
    let now = Instant::now();
    let chunk = |seq: u64, more: bool, ts: u64, len: usize| Incoming::Data {
        header: DataHeader {
            stream_id: 1,
            retransmit: false,
            more,
            seq,
            timestamp_ns: ts,
        },
        payload: Bytes::from(vec![0u8; len]),
    };
    let sink = || {
        let cfg = SessionConfig {
            max_frame_bytes: 150,
            ..SessionConfig::default()
        };
        resumed(chunked(cfg, vec![plan(1, Role::Sink, true)]), now)
    };
    let cases: [(Vec<Incoming>, &str); 4] = [
        (
            vec![chunk(3, true, 0, 10), chunk(4, false, 0, 10)],
            "the peer sent a broken frame on stream \"s1\": frame 3 began in chunks and frame 4 \
             came before its last chunk",
        ),
        (
            vec![chunk(3, true, 0, 10), chunk(3, false, 1, 10)],
            "the peer sent a broken frame on stream \"s1\": the chunks of frame 3 carry \
             different timestamps",
        ),
        (
            vec![chunk(3, true, 0, 100), chunk(3, true, 0, 100)],
            "the peer sent a broken frame on stream \"s1\": frame 3 in chunks is over 150 bytes, \
             the largest frame this side takes (link.max_frame_bytes)",
        ),
        (
            vec![
                chunk(3, true, 0, 10),
                Incoming::Other(OwnedMessage::End {
                    stream: 1,
                    frames: 4,
                }),
            ],
            "the peer sent a broken frame on stream \"s1\": the stream ended before the last \
             chunk of frame 3",
        ),
    ];
    for (msgs, want) in cases {
        let mut s = sink();
        let mut got = None;
        for m in msgs {
            if let Err(e) = s.handle_message(now, 1, m) {
                got = Some(e.to_string());
                break;
            }
        }
        assert_eq!(got.as_deref(), Some(want));
        assert!(delivered(&mut s).is_empty());
        // The CLOSE says why, as a protocol error.
        let close = drain(&mut s, now).into_iter().find_map(|t| match t {
            Transmit::Message(OwnedMessage::Close { code, reason }) => Some((code, reason)),
            _ => None,
        });
        assert_eq!(close, Some((CloseCode::ProtocolError, want.to_string())));
    }
}

#[test]
fn a_lossy_stream_never_drops_a_frame_it_has_half_written() {
    let now = Instant::now();
    let mut src = resumed(
        chunked(
            SessionConfig {
                resume_buffer_bytes: 1 << 20,
                ..SessionConfig::default()
            },
            vec![plan(1, Role::Source, false)],
        ),
        now,
    );
    // Budget 1 MiB; frames of 300 KiB: the fourth pushes the oldest unwritten one out.
    let f = |seq| frame(1, seq, 300 << 10);
    src.handle_source_frame(now, 0, f(0)).unwrap();
    let first = src.poll_transmit(now, 1).unwrap();
    assert_eq!(data_shape(&[first]), vec![(1, 0, true, 100)]);
    for seq in 1..4 {
        src.handle_source_frame(now, 0, f(seq)).unwrap();
    }
    let rest = drain(&mut src, now);
    let seqs: Vec<u64> = data_shape(&rest).iter().map(|d| d.1).collect();
    // Frame 0 finishes (no other frame's chunk comes between its chunks); 1 was dropped.
    let firsts: Vec<u64> = seqs.iter().copied().fold(Vec::new(), |mut v, s| {
        if v.last() != Some(&s) {
            v.push(s);
        }
        v
    });
    assert_eq!(firsts, vec![0, 2, 3]);
    assert_eq!(src.counters(0).overflow, 1);
}

#[test]
fn a_frame_begun_in_chunks_ends_in_chunks_when_the_chunk_size_grows_meanwhile() {
    let now = Instant::now();
    let mut src = resumed(
        chunked(SessionConfig::default(), vec![plan(1, Role::Source, true)]),
        now,
    );
    src.handle_source_frame(now, 0, frame(1, 0, 250)).unwrap();
    src.handle_source_frame(now, 0, frame(1, 1, 250)).unwrap();
    let first = src.poll_transmit(now, 1).unwrap();
    assert_eq!(data_shape(&[first]), vec![(1, 0, true, 100)]);
    // The path turned out fast: a chunk is now larger than the frame.
    src.set_chunking(1000, usize::MAX);
    // (Bounded: the bug this guards against sent the whole frame with MORE, forever.)
    let rest: Vec<Transmit> = std::iter::from_fn(|| src.poll_transmit(now, 1))
        .take(10)
        .collect();
    assert_eq!(
        data_shape(&rest),
        vec![(1, 0, false, 150), (1, 1, false, 250)],
        "the rest of frame 0 in one last chunk, then frame 1 whole"
    );
}

#[test]
fn a_recovery_counts_from_when_the_peer_went_silent_not_from_when_it_was_noticed() {
    let t0 = Instant::now();
    let mut s = resumed(session(vec![plan(1, Role::Sink, true)], 1 << 20), t0);
    // Last heard at 1 s; the cut is noticed at the keepalive timeout, 5 s later.
    let heard = t0 + Duration::from_secs(1);
    s.handle_message(heard, 1, data(1, 0)).unwrap();
    let noticed = heard + Duration::from_secs(5);
    s.handle_link_lost(noticed, "keepalive").unwrap();
    let back = noticed + Duration::from_millis(700);
    let mut s = reconnected(s, back);
    let after = std::iter::from_fn(|| s.poll_event())
        .find_map(|e| match e {
            Event::Resumed { after, .. } => Some(after),
            _ => None,
        })
        .expect("resumed");
    assert_eq!(after, Duration::from_millis(5700));
    assert_eq!(s.recoveries(), &[Duration::from_millis(5700)]);
}

/// A frame of a stream that does not replay its outage, stamped `ts` on the wall clock.
fn stamped(seq: u64, ts: u64) -> Frame {
    Frame::new(
        Meta {
            stream: 1,
            seq,
            timestamp_ns: ts,
            flags: 0,
        },
        &[1; 8],
    )
}

#[test]
fn input_made_before_the_first_link_goes_and_input_made_during_an_outage_does_not() {
    let now = Instant::now();
    let mut s = session(
        vec![StreamPlan {
            replay_outage: false,
            ..plan(1, Role::Source, false)
        }],
        1 << 20,
    );
    // The first link comes up as the sources start: a record they made just before it (an
    // input device's capabilities) is no history.
    s.handle_link_up(now, 1_000);
    s.handle_source_frame(now, 0, stamped(0, 500)).unwrap();
    assert_eq!(s.counters(0).stale, 0, "made before the first link: sent");
    // An outage: made during it and handed over after the link came back is history.
    s.handle_link_lost(now, "cut").unwrap();
    // (What was unacknowledged when the link went counts as stale too.)
    let base = s.counters(0).stale;
    let later = now + Duration::from_millis(10);
    s.handle_link_up(later, 5_000);
    s.handle_source_frame(later, 0, stamped(1, 4_000)).unwrap();
    assert_eq!(
        s.counters(0).stale,
        base + 1,
        "made during the outage: stale"
    );
    s.handle_source_frame(later, 0, stamped(2, 6_000)).unwrap();
    assert_eq!(s.counters(0).stale, base + 1, "made after: sent");
    // Past the hand-over window the stamp is not looked at (a wall clock set back).
    let much_later = later + HANDOFF_WINDOW + Duration::from_millis(1);
    s.handle_source_frame(much_later, 0, stamped(3, 4_500))
        .unwrap();
    assert_eq!(s.counters(0).stale, base + 1, "the window is bounded");
}
