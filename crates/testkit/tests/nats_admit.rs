//! The NATS device's admission rules (`ndd_link::nats::admit::Admitter`) over 1000 random
//! schedules (issue 31, item 2): 0–4 split slots, 2–8 identities (some never trusted, some
//! untrusted and trusted again mid-run, some whose HELLO names another driver), each joining
//! again now and then (as every rotation makes them), sending its ready heartbeat at its own
//! pace or going silent for a while (a side that left, or one stalled longer than
//! `gone_after`), time running 100 ms a step for 60 s.
//!
//! Properties, checked after every join:
//!
//! - only a trusted identity whose HELLO agrees is admitted;
//! - two app sides that are both present (heard from within `gone_after`) never hold the same
//!   slot;
//! - a side keeps its slot until it is given to another, which happens only while it is not
//!   present (a side silent for longer than `gone_after` that speaks again before that keeps
//!   it: found by this simulation, the slot was freed at any other side's join);
//! - a trusted side with an agreeing HELLO is admitted whenever fewer sides than there are
//!   slots are present (a slot held by a side that left is free again);
//! - a refusal for lack of a slot names every present holder.
//!
//! An adversary records every heartbeat (it may publish on the server, and a beat it cannot
//! open it can still copy) and plays recorded ones again, a few at a time, in a third of the
//! schedules; a side that comes back after a silence is in some schedules a new process
//! (its beats numbered from 0 under a later process number). Checked after every step: only a
//! side genuinely heard within `gone_after` is present, and no genuine beat is refused.
//!
//! `SEED=n cargo test -p ndd-testkit --test nats_admit` replays one schedule.

use ndd_link::nats::admit::{encode_slots, parse_slots, Admitter, Decision, Heard, Ready, Trust};
use ndd_testkit::SimRng;
use ndd_wire::{HelloRepr, OwnedMessage, Side};
use std::time::{Duration, Instant};

const GONE_AFTER: Duration = Duration::from_secs(5);

fn hello(side: Side, driver: &str) -> HelloRepr {
    HelloRepr {
        side,
        max_body: 1 << 20,
        driver: driver.into(),
        streams: vec![],
    }
}

/// A device side's admission rules with `slots` split slots.
fn device(slots: u16) -> Admitter {
    Admitter::new(
        hello(Side::Device, "d"),
        "dev",
        "/h",
        slots,
        GONE_AFTER,
        true,
    )
}

struct Side_ {
    fp: String,
    trusted: bool,
    agrees: bool,
    /// Chance of a heartbeat per step (0: silent for now).
    beat: f64,
    /// When the device last heard from it (as the device sees it: admitted or a heartbeat).
    heard: Option<Instant>,
    /// The slot it was last admitted to, and since when it has been present without a break.
    slot: Option<u16>,
    /// Its process (a start time) and the number of its last beat.
    process: u64,
    count: u64,
}

fn run(seed: u64) -> Result<String, String> {
    let mut rng = SimRng::new(seed);
    let t0 = Instant::now();
    let slots = rng.range(0, 4) as u16;
    let n = rng.range(2, 8) as usize;
    let mut a = device(slots);
    let agreeing = OwnedMessage::Hello(hello(Side::App, "d"))
        .as_message()
        .emit_to_vec()
        .unwrap();
    let other = OwnedMessage::Hello(hello(Side::App, "other"))
        .as_message()
        .emit_to_vec()
        .unwrap();
    let mut sides: Vec<Side_> = (0..n)
        .map(|i| Side_ {
            fp: format!("fp{i}"),
            trusted: rng.chance(0.8),
            agrees: rng.chance(0.9),
            beat: if rng.chance(0.7) { 0.5 } else { 0.05 },
            heard: None,
            slot: None,
            process: 1_000 + rng.range(0, 100),
            count: 0,
        })
        .collect();
    let adversary = rng.chance(0.33);
    let mut recorded: Vec<Ready> = Vec::new();
    let mut restarts = 0u32;
    let (mut admitted, mut refused) = (0u64, 0u64);
    for step in 0..600u64 {
        let now = t0 + Duration::from_millis(100 * step);
        let present = |s: &Side_| {
            s.heard
                .is_some_and(|t| now.saturating_duration_since(t) < GONE_AFTER)
        };
        let i = rng.range(0, n as u64 - 1) as usize;
        // The device side restarts now and then: a new process gives each app side its
        // split slot back from the file the one before kept (each holder counts as present
        // from then, its grace to join again); beats recorded before no longer open (a new
        // run key).
        if rng.chance(0.01) {
            let (held, bad) = parse_slots(&encode_slots(&a.slots_held()));
            if bad > 0 {
                return Err(format!("step {step}: the slots file did not read back"));
            }
            a = device(slots);
            a.restore(now, &held);
            for s in sides.iter_mut() {
                let kept = held.iter().find(|(_, f)| *f == s.fp).map(|(sl, _)| *sl);
                if s.slot.is_some() && kept != s.slot && present(s) {
                    return Err(format!(
                        "step {step}: {} held slot {:?} and was present; the restart kept {kept:?}",
                        s.fp, s.slot
                    ));
                }
                s.slot = kept;
                if kept.is_some() {
                    s.heard = Some(now);
                }
            }
            recorded.clear();
            restarts += 1;
        }
        match rng.range(0, 9) {
            // Trust changes (ndd untrust / ndd trust).
            0 => sides[i].trusted = !sides[i].trusted,
            // Goes silent, or comes back (a new process in some schedules).
            1 => {
                let s = &mut sides[i];
                s.beat = if s.beat > 0.0 { 0.0 } else { 0.5 };
                if s.beat > 0.0 && rng.chance(0.5) {
                    s.process += rng.range(1, 1_000);
                    s.count = 0;
                }
            }
            // Joins (again).
            2..=4 => {
                let s = &sides[i];
                let trust = if s.trusted {
                    Trust::Trusted(s.fp.clone())
                } else {
                    Trust::Untrusted
                };
                let hello = if s.agrees { &agreeing } else { &other };
                let holders_present = sides
                    .iter()
                    .filter(|s| present(s) && s.slot.is_some())
                    .count();
                let was_present_with = sides[i].slot.filter(|_| present(&sides[i]));
                match a.decide(now, &sides[i].fp.clone(), trust, hello) {
                    Decision::Admitted { slot } => {
                        admitted += 1;
                        let s = &sides[i];
                        if !s.trusted || !s.agrees {
                            return Err(format!(
                                "step {step}: admitted {} (trusted {}, agrees {})",
                                s.fp, s.trusted, s.agrees
                            ));
                        }
                        if (slot.is_some()) != (slots > 0) {
                            return Err(format!("step {step}: slot {slot:?} with {slots} slots"));
                        }
                        if let Some(was) = was_present_with {
                            if slot != Some(was) {
                                return Err(format!(
                                    "step {step}: {} held slot {was} and stayed present, now given {slot:?}",
                                    s.fp
                                ));
                            }
                        }
                        if let Some(sl) = slot {
                            let holders: Vec<usize> = (0..n)
                                .filter(|j| *j != i && sides[*j].slot == Some(sl))
                                .collect();
                            for j in holders {
                                if present(&sides[j]) {
                                    return Err(format!(
                                        "step {step}: slot {sl} given to {} while {} holds it and is present",
                                        sides[i].fp, sides[j].fp
                                    ));
                                }
                                // It had left: its slot is free again.
                                sides[j].slot = None;
                            }
                        }
                        sides[i].slot = slot;
                        sides[i].heard = Some(now);
                    }
                    Decision::Refused { reason, .. } => {
                        refused += 1;
                        let s = &sides[i];
                        if s.trusted && s.agrees {
                            if slots == 0 || holders_present < slots as usize {
                                let state: Vec<String> = sides
                                    .iter()
                                    .map(|o| {
                                        format!(
                                            "{} slot {:?} heard {:?} ago, held by machine {:?}",
                                            o.fp,
                                            o.slot,
                                            o.heard.map(|h| now - h),
                                            a.slot_of(&o.fp)
                                        )
                                    })
                                    .collect();
                                return Err(format!(
                                    "step {step}: refused {} with {holders_present} of {slots} slots held by present sides: {reason}; {state:#?}",
                                    s.fp
                                ));
                            }
                            for o in sides.iter().filter(|o| present(o) && o.slot.is_some()) {
                                if !reason.contains(&o.fp) {
                                    return Err(format!(
                                        "step {step}: the refusal does not name holder {}: {reason}",
                                        o.fp
                                    ));
                                }
                            }
                        }
                    }
                }
            }
            _ => {}
        }
        // Heartbeats: only a side the device admitted sends them (it holds the key).
        for s in sides.iter_mut() {
            if s.heard.is_some() && s.beat > 0.0 && rng.chance(s.beat) {
                s.count += 1;
                let beat = Ready {
                    process: s.process,
                    count: s.count,
                    fingerprint: s.fp.clone(),
                };
                if a.handle_ready(now, &beat) == Heard::Stale {
                    return Err(format!("step {step}: a genuine beat refused: {beat:?}"));
                }
                recorded.push(beat);
                s.heard = Some(now);
            }
        }
        // The adversary plays recorded beats again.
        if adversary && !recorded.is_empty() {
            for _ in 0..rng.range(0, 3) {
                let b = &recorded[rng.range(0, recorded.len() as u64 - 1) as usize];
                if a.handle_ready(now, b) != Heard::Stale {
                    return Err(format!("step {step}: a beat played again was taken: {b:?}"));
                }
            }
        }
        for s in &sides {
            if a.present(now, &s.fp) && !present(s) {
                return Err(format!(
                    "step {step}: {} counts as present, last heard {:?} ago",
                    s.fp,
                    s.heard.map(|h| now - h)
                ));
            }
        }
    }
    Ok(format!(
        "{n} identities, {slots} slots: {admitted} admitted, {refused} refused, {restarts} device restarts"
    ))
}

#[test]
fn only_trusted_agreeing_sides_are_admitted_and_no_two_present_sides_share_a_slot() {
    ndd_testkit::explore("nats_admit", 1000, run);
}
