//! Pairing by code (`ndd_link::pair`) over 300 random schedules (issue 34, item 3): an
//! offering side shows a code; an honest joining side types it (in some schedules wrongly
//! first); an adversary on the network, who does not know the code, tries what it can:
//!
//! - it connects first and guesses codes (each guess a whole exchange of its own), or goes
//!   silent after the Hello, or sends garbage;
//! - it sits between the honest sides and relays, tampers a byte, drops the connection,
//!   replays a Hello, Reply or Proof recorded in an earlier exchange, or answers the joining
//!   side itself with a code of its own;
//! - bytes arrive split anywhere, with time passing in between (sometimes past the waits).
//!
//! Properties: the offering side only ever pairs with the honest joining side's identity, and
//! only when that side typed the right code; the joining side only ever pairs with the
//! offering side's identity; the adversary's identity is never paired; after three wrong codes
//! nothing pairs any more (void); an exchange the adversary did not touch, with the right
//! code, pairs both sides; and no exchange ends without a reason or hangs past its deadline.
//!
//! `SEED=n cargo test -p ndd-testkit --test pair_sim` replays one schedule.

use ndd_link::pair::{Exchange, Offer, PairError, Peer, Signer, CODE_LIFETIME, STEP_WAIT, TRIES};
use ndd_link::seal::LocalIdentity;
use ndd_testkit::SimRng;
use std::time::{Duration, Instant};

thread_local! {
    /// The offering side, the honest joining side and the adversary.
    static IDS: [Signer; 3] = {
        let make = |name: &str| {
            let d = std::env::temp_dir().join(format!(
                "ndd-pair-sim-{name}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).expect("temp dir");
            let (id, _) = ndd_link::Identity::load_or_create(&d).expect("identity");
            let local = LocalIdentity::new(&id).expect("local identity");
            let _ = std::fs::remove_dir_all(&d);
            Signer {
                id: local,
                name: name.to_string(),
            }
        };
        [make("offer"), make("join"), make("adversary")]
    };
}

fn ids() -> [Signer; 3] {
    IDS.with(|i| i.clone())
}

/// Delivers `bytes` into `x` in random pieces, time moving on by up to `step` between them.
fn deliver(rng: &mut SimRng, x: &mut Exchange, now: &mut Instant, bytes: &[u8], step: u64) {
    let mut at = 0;
    while at < bytes.len() && x.end().is_none() {
        let n = (rng.range(1, 64) as usize).min(bytes.len() - at);
        x.handle_data(*now, &bytes[at..at + n]);
        at += n;
        *now += Duration::from_millis(rng.range(0, step));
        x.handle_timeout(*now);
    }
}

/// Everything `x` has to send.
fn drain(x: &mut Exchange) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| x.poll_transmit()).collect()
}

/// A code other than `code`.
fn wrong(rng: &mut SimRng, code: &str) -> String {
    loop {
        let c = format!("{:08}", rng.range(0, 99_999_999));
        if c != code.replace('-', "") {
            return c;
        }
    }
}

/// How one side's exchange ended.
type Ended = Result<Peer, PairError>;

/// How one connection to the offering side is played.
#[derive(Debug, Clone, Copy)]
enum Play {
    /// The honest joining side with the right code, untouched.
    Honest,
    /// The honest joining side with a wrong code.
    HonestWrong,
    /// The adversary guessing a code.
    Guess,
    /// The adversary sends a Hello and then nothing.
    Silent,
    /// Garbage bytes.
    Garbage,
    /// The honest side with the right code, one byte of one message flipped on the way.
    Tamper,
    /// The honest side with the right code; the adversary replays a message recorded in an
    /// earlier exchange in place of one of this one's.
    Replay,
    /// The honest side with the right code, the connection cut after a few messages.
    Cut,
}

/// Plays one connection; returns how each side ended (the joining side `None` when it was
/// the adversary, or when the connection was cut before it ended).
#[allow(clippy::too_many_arguments)]
fn connection(
    rng: &mut SimRng,
    offer: &Offer,
    code: &str,
    play: Play,
    now: &mut Instant,
    recorded: &mut Vec<Vec<u8>>,
) -> Result<(Ended, Option<Ended>), String> {
    let [o_id, j_id, a_id] = ids();
    let mut o = offer.exchange(*now, o_id, ndd_link::pair::OsRng);
    let (who, typed) = match play {
        Play::Guess | Play::Silent => (a_id, wrong(rng, code)),
        Play::HonestWrong => (j_id, wrong(rng, code)),
        _ => (j_id, code.to_string()),
    };
    if let Play::Garbage = play {
        let mut g = vec![0u8; rng.range(1, 300) as usize];
        rng.fill(&mut g);
        deliver(rng, &mut o, now, &g, 50);
        if o.end().is_none() {
            *now += STEP_WAIT;
            o.handle_timeout(*now);
        }
        return Ok((
            o.end().cloned().ok_or("garbage left the exchange open")?,
            None,
        ));
    }
    let mut j =
        Exchange::join(&typed, *now, who, ndd_link::pair::OsRng).map_err(|e| e.to_string())?;
    let tamper_at = rng.range(0, 2);
    let replay_at = rng.range(0, 2);
    let cut_after = rng.range(0, 3);
    let mut sent = 0u64;
    // Messages go back and forth until both ended or nothing moves.
    for _ in 0..10 {
        let mut moved = false;
        for m in drain(&mut j) {
            moved = true;
            let mut m = m;
            recorded.push(m.clone());
            if let Play::Silent = play {
                if sent > 0 {
                    continue;
                }
            }
            if let (Play::Tamper, true) = (play, sent == tamper_at) {
                let i = rng.range(0, m.len() as u64 - 1) as usize;
                m[i] ^= 1 << rng.range(0, 7);
            }
            if let (Play::Replay, true) = (play, sent == replay_at) {
                if !recorded.is_empty() {
                    m = recorded[rng.range(0, recorded.len() as u64 - 1) as usize].clone();
                }
            }
            if let (Play::Cut, true) = (play, sent >= cut_after) {
                o.handle_closed();
                j.handle_closed();
                break;
            }
            sent += 1;
            deliver(rng, &mut o, now, &m, 30);
        }
        for m in drain(&mut o) {
            moved = true;
            recorded.push(m.clone());
            if matches!(play, Play::Cut) && sent >= cut_after {
                break;
            }
            deliver(rng, &mut j, now, &m, 30);
        }
        if o.end().is_some() && j.end().is_some() {
            break;
        }
        if !moved {
            // Nothing more comes: time runs out for whoever still waits.
            *now += STEP_WAIT;
            o.handle_timeout(*now);
            *now += ndd_link::pair::EXCHANGE_TIMEOUT;
            j.handle_timeout(*now);
        }
    }
    let oe = o
        .end()
        .cloned()
        .ok_or_else(|| format!("{play:?}: the offering side never ended"))?;
    let je = j.end().cloned();
    Ok((oe, je))
}

fn run(seed: u64) -> Result<String, String> {
    let mut rng = SimRng::new(seed);
    let t0 = Instant::now();
    let mut now = t0;
    let code = ndd_link::pair::new_code();
    let mut offer = Offer::new(&code, now).map_err(|e| e.to_string())?;
    let [o_id, j_id, a_id] = ids();
    let (o_fp, j_fp, a_fp) = (
        o_id.id.fingerprint(),
        j_id.id.fingerprint(),
        a_id.id.fingerprint(),
    );
    let mut recorded = Vec::new();
    let mut wrong_seen = 0u32;
    let plays = rng.range(1, 6);
    let mut log = Vec::new();
    for _ in 0..plays {
        let play = match rng.range(0, 7) {
            0 => Play::Honest,
            1 => Play::HonestWrong,
            2 => Play::Guess,
            3 => Play::Silent,
            4 => Play::Garbage,
            5 => Play::Tamper,
            6 => Play::Replay,
            _ => Play::Cut,
        };
        let void_before = offer.check(now).is_err();
        let (oe, je) = connection(&mut rng, &offer, &code, play, &mut now, &mut recorded)?;
        offer.handle_end(&oe);
        log.push(format!("{play:?}: {oe:?} / {je:?}"));
        if let Ok(p) = &oe {
            if p.fingerprint != j_fp {
                return Err(format!(
                    "the offering side paired with {} ({log:?})",
                    p.fingerprint
                ));
            }
            if !matches!(play, Play::Honest | Play::Tamper | Play::Replay | Play::Cut) {
                return Err(format!("paired on a {play:?} connection ({log:?})"));
            }
            if void_before {
                return Err(format!("paired after the code was void ({log:?})"));
            }
        }
        if let Some(Ok(p)) = &je {
            if p.fingerprint != o_fp {
                return Err(format!(
                    "the joining side paired with {} ({log:?})",
                    p.fingerprint
                ));
            }
        }
        for p in [Some(&oe), je.as_ref()].into_iter().flatten().flatten() {
            if p.fingerprint == a_fp {
                return Err(format!("the adversary was paired ({log:?})"));
            }
        }
        if matches!(oe, Err(PairError::WrongCode(_)))
            || (matches!(oe, Err(PairError::Void)) && !void_before)
        {
            wrong_seen += 1;
        }
        // An untouched honest exchange with a live code pairs both sides.
        if matches!(play, Play::Honest) && !void_before && now < t0 + CODE_LIFETIME {
            if oe.as_ref().map(|p| &p.fingerprint) != Ok(&j_fp) || !matches!(&je, Some(Ok(_))) {
                return Err(format!(
                    "an untouched exchange with the right code did not pair ({log:?})"
                ));
            }
            return Ok(format!("paired after {} connection(s)", log.len()));
        }
        if oe.is_ok() {
            return Ok(format!("paired after {} connection(s)", log.len()));
        }
    }
    if wrong_seen > TRIES {
        return Err(format!(
            "{wrong_seen} wrong codes counted, more than {TRIES} ({log:?})"
        ));
    }
    if wrong_seen >= TRIES && offer.check(now).is_ok() {
        return Err(format!(
            "{TRIES} wrong codes and the code still takes connections ({log:?})"
        ));
    }
    Ok(format!("{} connection(s), {wrong_seen} wrong", log.len()))
}

#[test]
fn only_the_holder_of_the_code_pairs_whatever_an_adversary_does() {
    ndd_testkit::explore("pair_sim", 300, run);
}
