use super::*;
use ndd_core::{Frame, Meta, Output};
use proptest::prelude::*;
use std::time::Instant;

fn meta(seq: u64) -> Meta {
    Meta {
        stream: 3,
        seq,
        timestamp_ns: 77,
        flags: 0,
    }
}

fn run(half: &mut dyn Half, frame: Frame) -> Result<Vec<Frame>, ModuleError> {
    let mut out = Output::new();
    half.handle_frame(Instant::now(), frame, &mut out)?;
    Ok(out.take_frames())
}

#[test]
fn all_and_round_robin_mark_every_frame_and_the_sink_restores_it() {
    for mode in [Mode::All, Mode::RoundRobin] {
        let cfg = MultiplexConfig { mode, parts: 1 };
        let (mut f, mut i) = (cfg.forward().unwrap(), cfg.inverse().unwrap());
        let out = run(f.as_mut(), Frame::new(meta(9), b"hello")).unwrap();
        assert_eq!(out.len(), 1);
        let expect = if mode == Mode::All {
            Route::All
        } else {
            Route::Any
        };
        assert_eq!(route_of(out[0].payload()).unwrap(), expect);
        assert_eq!(&out[0].payload()[..HEADER_LEN], &[mode.code(), 0, 0, 0, 1]);
        let back = run(i.as_mut(), out.into_iter().next().unwrap()).unwrap();
        assert_eq!(back[0].payload(), b"hello");
        assert_eq!(back[0].meta, meta(9));
    }
}

#[test]
fn split_cuts_in_near_equal_pieces_routed_to_their_slot() {
    let cfg = MultiplexConfig {
        mode: Mode::Split,
        parts: 3,
    };
    let mut f = cfg.forward().unwrap();
    let out = run(f.as_mut(), Frame::new(meta(4), b"abcdefgh")).unwrap();
    let routes: Vec<Route> = out.iter().map(|p| route_of(p.payload()).unwrap()).collect();
    assert_eq!(
        routes,
        (0..3)
            .map(|part| Route::Part { part, parts: 3 })
            .collect::<Vec<_>>()
    );
    let mut joined = Vec::new();
    for p in out {
        assert_eq!(p.meta, meta(4), "every piece keeps the frame's meta");
        let mut i = cfg.inverse().unwrap();
        let back = run(i.as_mut(), p).unwrap();
        joined.push(back[0].payload().to_vec());
    }
    assert_eq!(
        joined,
        vec![b"abc".to_vec(), b"def".to_vec(), b"gh".to_vec()]
    );
}

#[test]
fn the_sink_refuses_a_mode_or_split_it_was_not_set_up_for_and_garbage() {
    let split = MultiplexConfig {
        mode: Mode::Split,
        parts: 2,
    };
    let mut i = split.inverse().unwrap();
    let e = run(i.as_mut(), Frame::new(meta(1), &[0, 0, 0, 0, 1, b'x'])).unwrap_err();
    assert!(
        e.to_string()
            .contains("mode (the sink was set up for another) 0"),
        "{e}"
    );
    let e = run(i.as_mut(), Frame::new(meta(1), &[2, 0, 0, 0, 3, b'x'])).unwrap_err();
    assert!(e.to_string().contains("part count"), "{e}");
    let e = run(i.as_mut(), Frame::new(meta(1), &[2, 0, 5, 0, 2])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "malformed frame: multiplex: unknown part index 5"
    );
    let e = run(i.as_mut(), Frame::new(meta(1), &[9, 0, 0, 0, 1])).unwrap_err();
    assert_eq!(e.to_string(), "malformed frame: multiplex: unknown mode 9");
    let e = run(i.as_mut(), Frame::new(meta(1), &[2, 0])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "malformed frame: multiplex: frame of 2 bytes is shorter than the 5-byte multiplex header"
    );
    let e = run(i.as_mut(), Frame::new(meta(1), &[])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "malformed frame: multiplex: empty frame (no mode byte)"
    );
}

#[test]
fn parts_must_fit_the_mode() {
    let bad = MultiplexConfig {
        mode: Mode::All,
        parts: 2,
    };
    assert_eq!(
        bad.validate().unwrap_err().to_string(),
        "multiplex: parts = 2 is out of range 1..=1"
    );
    let bad = MultiplexConfig {
        mode: Mode::Split,
        parts: 0,
    };
    assert!(bad.validate().is_err());
    assert_eq!(
        MultiplexConfig::default().describe(),
        "multiplex(mode=all, parts=1)"
    );
}

proptest! {
    #[test]
    fn split_pieces_join_to_the_frame(
        data in proptest::collection::vec(any::<u8>(), 0..2000),
        parts in 1u16..20,
    ) {
        let cfg = MultiplexConfig { mode: Mode::Split, parts };
        let mut f = cfg.forward().unwrap();
        let mut i = cfg.inverse().unwrap();
        let out = run(f.as_mut(), Frame::new(meta(1), &data)).unwrap();
        prop_assert_eq!(out.len(), usize::from(parts));
        let mut joined = Vec::new();
        let (mut shortest, mut longest) = (usize::MAX, 0);
        for p in out {
            let back = run(i.as_mut(), p).unwrap();
            shortest = shortest.min(back[0].len());
            longest = longest.max(back[0].len());
            joined.extend_from_slice(back[0].payload());
        }
        prop_assert_eq!(joined, data);
        prop_assert!(longest - shortest <= 1);
    }

    #[test]
    fn any_header_parses_or_errors_without_panicking(b in proptest::collection::vec(any::<u8>(), 0..8)) {
        let _ = Header::parse(&b);
    }
}
