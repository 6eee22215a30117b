//! Which device run a NATS frame may come from (sans-IO): the rule that keeps a recording of
//! an earlier run out of a later one.
//!
//! The group key outlives a device run (a device side that restarts keeps it, so app sides
//! need not join again), so a frame sealed under the group key alone would open in every later
//! run: anyone who may publish on the server (it is not trusted) could record a run and play it
//! into the next (found by hostile testing: 1145 duplicate frames delivered to an app side's
//! reliable stream; two recorded ENDs cut two reliable streams short).
//!
//! So every frame of a run is sealed under the *run key* ([`run_key`]), derived from the group
//! key and the run's [`Run`] (its id and the JetStream stream sequence it began after), both
//! carried in every record's header: a header changed to name another run does not open. Run
//! ids only grow ([`next_run_id`]: the wall clock, never below the last run's id + 1, which the
//! device keeps in its home), and a receiver holds the newest run it knows ([`RunGuard`]):
//!
//! - a frame of that run is taken;
//! - a frame of a newer run, once it opens, makes it the run (an app side: the device
//!   restarted; a device side refuses it: there is no newer device run than its own);
//! - a frame of an earlier run is taken only if JetStream stored it at or before the stream
//!   sequence the current run began after (sent before the restart, waiting for this side);
//!   anything else of an earlier run is a replay, dropped and counted.
//!
//! Replays within one run are the encrypt pair's: each sending half's frame counter has a
//! sliding replay window, and a stream's frame numbers only grow.

use ring::hkdf;

/// A device run: its id and the JetStream stream sequence it began after (0 without stored
/// streams).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Run {
    /// The run's id: grows with every device start ([`next_run_id`]).
    pub id: u64,
    /// The last JetStream stream sequence stored when the run began.
    pub began: u64,
}

/// HKDF salt of run keys (a version, so a later derivation cannot collide).
const RUN_SALT: &[u8] = b"ndd nats run key v1";

struct Len32;

impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

/// The key frames of `run` are sealed under: HKDF-SHA256 of the group key, salt
/// `"ndd nats run key v1"`, info `run id ‖ began` (big-endian).
pub fn run_key(group: &[u8; 32], run: Run) -> [u8; 32] {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, RUN_SALT).extract(group);
    let id = run.id.to_be_bytes();
    let began = run.began.to_be_bytes();
    let info = [&id[..], &began[..]];
    let mut out = [0u8; 32];
    // Expanding 32 bytes of SHA-256 output cannot fail (the limit is 255 × 32).
    if let Ok(okm) = prk.expand(&info, Len32) {
        let _ = okm.fill(&mut out);
    }
    out
}

/// The id of a device run that starts at `wall_ns` (ns since the Unix epoch) after a run
/// numbered `last` (kept in the device's home): the wall clock with its low 16 bits replaced
/// by `random` (two device sides started in the same instant still differ), and never below
/// `last + 1`, so a clock set back cannot make a new run look older than a recorded one.
pub fn next_run_id(last: Option<u64>, wall_ns: u64, random: u16) -> u64 {
    let from_clock = (wall_ns & !0xFFFF) | u64::from(random);
    match last {
        Some(l) => from_clock.max(l.saturating_add(1)),
        None => from_clock,
    }
}

/// What a receiver does with a frame of a given run, before opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// The current run's frame.
    Current,
    /// A newer run's: open it; if it opens, [`RunGuard::opened`] makes it the current run.
    Newer,
    /// An earlier run's frame stored before the current run began: it waited for this side.
    Earlier,
    /// Dropped: why.
    Refused(Refusal),
}

/// Why a frame's run is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// An earlier run's frame that was not stored before the current run began: a replay.
    EarlierRun,
    /// The current run's id with another start: a forgery (it would not open either).
    OtherStart,
    /// A device side got a frame of a run newer than its own (there is none).
    NewerThanDevice,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::EarlierRun => {
                "a frame of an earlier device run that was not stored before this run began \
                 (sent just before a device restart, or a replay)"
            }
            Refusal::OtherStart => "a frame naming this run with another start (forged)",
            Refusal::NewerThanDevice => {
                "a frame naming a device run newer than this device side's own"
            }
        })
    }
}

/// Runs a guard remembers.
const KNOWN_RUNS: usize = 16;

/// The newest device run a receiver knows, and what it refused.
#[derive(Debug, Clone)]
pub struct RunGuard {
    current: Run,
    /// The runs this guard has known, oldest first (at most [`KNOWN_RUNS`]): a frame of an
    /// earlier run must have been stored before the *first* known run after it began (a frame
    /// of run 1 stored while run 2 went is a replay even once run 3 is the current one).
    known: Vec<Run>,
    /// App sides follow a newer run (the device restarted); a device side never does.
    follows: bool,
    /// Frames refused, by reason: earlier run, other start, newer than the device.
    pub refused: [u64; 3],
}

impl RunGuard {
    /// A device side's guard of its own run `run`.
    pub fn device(run: Run) -> RunGuard {
        RunGuard {
            current: run,
            known: vec![run],
            follows: false,
            refused: [0; 3],
        }
    }

    /// An app side's guard, starting at the run its join named.
    pub fn app(run: Run) -> RunGuard {
        RunGuard {
            current: run,
            known: vec![run],
            follows: true,
            refused: [0; 3],
        }
    }

    /// The run as it stands.
    pub fn current(&self) -> Run {
        self.current
    }

    /// Frames refused in all.
    pub fn refused_total(&self) -> u64 {
        self.refused.iter().sum()
    }

    /// Decides on a frame of `run`, stored at JetStream stream sequence `stored` (`None`:
    /// it came over core NATS). A refusal is counted.
    pub fn check(&mut self, run: Run, stored: Option<u64>) -> Admit {
        let verdict = if run.id == self.current.id {
            if run.began == self.current.began {
                Admit::Current
            } else {
                Admit::Refused(Refusal::OtherStart)
            }
        } else if run.id > self.current.id {
            if self.follows {
                Admit::Newer
            } else {
                Admit::Refused(Refusal::NewerThanDevice)
            }
        } else if stored.is_some_and(|s| {
            // The first run known after this one: its start bounds what may still come.
            let next = self
                .known
                .iter()
                .filter(|k| k.id > run.id)
                .min_by_key(|k| k.id)
                .unwrap_or(&self.current);
            s <= next.began
        }) {
            Admit::Earlier
        } else {
            Admit::Refused(Refusal::EarlierRun)
        };
        if let Admit::Refused(r) = verdict {
            self.refused[r as usize] += 1;
        }
        verdict
    }

    /// A frame of `run` opened (under its run key): a newer run becomes the current one.
    /// Whether it did.
    pub fn opened(&mut self, run: Run) -> bool {
        self.learn(run)
    }

    /// Runs before the current one, learnt from the keys (a device side's own earlier runs,
    /// or those a join named): a frame of a run before them must have been stored before the
    /// first of them after it began.
    pub fn know(&mut self, runs: impl IntoIterator<Item = Run>) {
        for r in runs {
            if r.id >= self.current.id || self.known.iter().any(|k| k.id == r.id) {
                continue;
            }
            let at = self.known.partition_point(|k| k.id < r.id);
            self.known.insert(at, r);
            if self.known.len() > KNOWN_RUNS {
                self.known.remove(0);
            }
        }
    }

    /// A run learnt otherwise (an app side's join again): taken if newer. Whether it was.
    pub fn learn(&mut self, run: Run) -> bool {
        if self.follows && run.id > self.current.id {
            self.current = run;
            self.known.push(run);
            if self.known.len() > KNOWN_RUNS {
                self.known.remove(0);
            }
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R1: Run = Run { id: 10, began: 5 };
    const R2: Run = Run { id: 20, began: 50 };

    #[test]
    fn run_keys_differ_by_every_input_and_are_stable() {
        let g = [7u8; 32];
        let k = run_key(&g, R1);
        assert_eq!(k, run_key(&g, R1));
        assert_ne!(k, run_key(&g, Run { id: 10, began: 6 }));
        assert_ne!(k, run_key(&g, Run { id: 11, began: 5 }));
        assert_ne!(k, run_key(&[8u8; 32], R1));
        assert_ne!(k, g);
    }

    #[test]
    fn run_ids_follow_the_clock_and_never_go_back() {
        let t = 1_800_000_000_000_000_000u64;
        let a = next_run_id(None, t, 0x1234);
        assert_eq!(a >> 16, t >> 16);
        assert_eq!(a & 0xFFFF, 0x1234);
        // The clock set back an hour: still after the last run.
        let b = next_run_id(Some(a), t - 3_600_000_000_000, 1);
        assert_eq!(b, a + 1);
        assert!(next_run_id(Some(b), t + 1_000_000_000, 1) > b);
        assert_eq!(next_run_id(Some(u64::MAX), 0, 0), u64::MAX);
    }

    #[test]
    fn a_device_side_that_knows_its_earlier_runs_refuses_an_old_runs_frame_stored_after_the_next_began(
    ) {
        let (a, b, c) = (
            Run { id: 1, began: 0 },
            Run { id: 2, began: 100 },
            Run { id: 3, began: 200 },
        );
        // Without the history, run 1's frame stored at 150 passes (before run 3 began) …
        let mut g = RunGuard::device(c);
        assert_eq!(g.check(a, Some(150)), Admit::Earlier);
        // … but run 2 refused it (it began at 100): with the history it is refused here too,
        // and its sender, told of run 2's start, sealed it again.
        g.know([b, a, c, Run { id: 9, began: 1 }]);
        assert_eq!(g.check(a, Some(150)), Admit::Refused(Refusal::EarlierRun));
        assert_eq!(g.check(a, Some(100)), Admit::Earlier);
        assert_eq!(g.check(b, Some(150)), Admit::Earlier);
        assert_eq!(g.check(b, Some(201)), Admit::Refused(Refusal::EarlierRun));
        // A newer run is not taken for an earlier one.
        assert_eq!(g.current(), c);
    }

    #[test]
    fn an_app_side_takes_its_run_follows_a_newer_one_and_refuses_replays_of_older_ones() {
        let mut g = RunGuard::app(R1);
        assert_eq!(g.check(R1, None), Admit::Current);
        assert_eq!(g.check(R2, None), Admit::Newer);
        assert_eq!(g.current(), R1, "not before it opened");
        assert!(g.opened(R2));
        assert_eq!(g.current(), R2);
        // R1's frames stored before R2 began waited for this side; later ones are replays.
        assert_eq!(g.check(R1, Some(50)), Admit::Earlier);
        assert_eq!(g.check(R1, Some(51)), Admit::Refused(Refusal::EarlierRun));
        assert_eq!(g.check(R1, None), Admit::Refused(Refusal::EarlierRun));
        assert_eq!(
            g.check(Run { id: 20, began: 49 }, Some(1)),
            Admit::Refused(Refusal::OtherStart)
        );
        assert_eq!(g.refused, [2, 1, 0]);
        assert!(!g.learn(R1), "an older run is never taken back");
        assert_eq!(g.current(), R2);
        // Run 3 follows: run 1's frames are still bounded by run 2's start, not run 3's.
        assert!(g.learn(Run { id: 30, began: 90 }));
        assert_eq!(g.check(R1, Some(50)), Admit::Earlier);
        assert_eq!(g.check(R1, Some(60)), Admit::Refused(Refusal::EarlierRun));
        assert_eq!(g.check(R2, Some(90)), Admit::Earlier);
    }

    #[test]
    fn a_device_side_refuses_runs_newer_than_its_own() {
        let mut g = RunGuard::device(R1);
        assert_eq!(
            g.check(R2, Some(1)),
            Admit::Refused(Refusal::NewerThanDevice)
        );
        assert!(!g.opened(R2));
        assert_eq!(g.current(), R1);
        assert_eq!(g.check(Run { id: 3, began: 0 }, Some(5)), Admit::Earlier);
        assert_eq!(g.refused_total(), 1);
    }
}
