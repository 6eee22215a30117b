//! Control messages go straight to the twin half and never wait behind queued frames.

use bytes::Bytes;
use ndd_core::{ControlError, Frame, Half, HalfStats, ModuleError, Output, Role, Stack};
use ndd_testkit::{LinkConfig, Pipeline};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The source half announces every frame to its twin with a control message carrying the
/// sequence number; the sink half records when each announcement arrives.
struct Echo {
    inverse: bool,
    arrivals: Arc<Mutex<Vec<(u64, Instant)>>>,
}

impl Half for Echo {
    fn handle_frame(
        &mut self,
        _now: Instant,
        f: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        if !self.inverse {
            out.control(Bytes::copy_from_slice(&f.meta.seq.to_be_bytes()));
        }
        out.push(f);
        Ok(())
    }
    fn handle_control(
        &mut self,
        now: Instant,
        msg: Bytes,
        _out: &mut Output,
    ) -> Result<(), ModuleError> {
        let seq =
            u64::from_be_bytes(msg[..8].try_into().map_err(|_| ControlError::WrongLength {
                pair: "echo",
                what: "announcement",
                len: msg.len(),
                expected: 8,
            })?);
        self.arrivals.lock().unwrap().push((seq, now));
        Ok(())
    }
    fn stats(&self) -> HalfStats {
        HalfStats::default()
    }
}

#[test]
fn control_is_not_queued_behind_a_data_backlog() {
    let arrivals = Arc::new(Mutex::new(vec![]));
    let mk = |inverse| -> Vec<(&'static str, Box<dyn Half>)> {
        vec![(
            "echo",
            Box::new(Echo {
                inverse,
                arrivals: arrivals.clone(),
            }),
        )]
    };
    let src = Stack::from_halves(Role::Source, "s", mk(false));
    let sink = Stack::from_halves(Role::Sink, "s", mk(true));
    // 80 kbit/s data link: each 10 kB frame takes 1 s to serialise, so data piles up.
    let link = LinkConfig {
        bandwidth_bps: Some(80_000),
        ..LinkConfig::tcp(Duration::from_millis(25), Duration::ZERO)
    };
    let mut p = Pipeline::with_stacks(src, sink, link, 1);
    for i in 0..5 {
        p.send_at(Duration::from_millis(i), vec![0u8; 10_000 - 26]); // + 26-byte wire header = 10 kB
    }
    p.run().unwrap();
    let t0 = p.clock.at(Duration::ZERO);
    let got: Vec<(u64, Duration)> = arrivals
        .lock()
        .unwrap()
        .iter()
        .map(|(s, t)| (*s, *t - t0))
        .collect();
    let deliveries: Vec<Duration> = p.deliveries().iter().map(|d| d.released).collect();
    assert_eq!(deliveries.len(), 5);
    for k in 0..5u64 {
        // Data frame k waits behind k frames of 1 s each; its control message does not.
        assert_eq!(
            deliveries[k as usize],
            Duration::from_millis(1000 * (k + 1) + 25),
            "data {k}"
        );
        assert_eq!(
            got[k as usize],
            (k, Duration::from_millis(k + 25)),
            "control {k}"
        );
    }
}
