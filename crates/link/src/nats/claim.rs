//! One device side per driver on a server (sans-IO): before a device side serves a driver it
//! asks on `P.D.device` whether another one does, and while it runs it answers that question
//! with a note signed by its identity ([`claim_label`]).
//!
//! - An answer counts only if it is a note signed under this driver's label by this install or
//!   by a peer in `known_peers` ([`check_claim`]): anyone who may publish on the server could
//!   otherwise keep every device side from starting (found by hostile testing: a fake answer
//!   stopped a device side, its text, escape codes included, printed raw). Its text is escaped
//!   and bounded before anyone shows it.
//! - Each question carries [`QUESTION_LEN`] random bytes and the answer signs them
//!   ([`answer_body`]): an answer signed for another question does not count. Anyone may ask,
//!   and the side serving answers everyone, so without it a signed answer recorded once could
//!   be played to every later device side's question and keep the driver from ever starting
//!   again once that side is gone.
//! - [`Claim`] asks, reads every answer for [`ROUND`] (so a fast forged one cannot hide a real
//!   one), and asks again [`AGAIN_AFTER`] later while one that was just told to stop still
//!   answers, for at most [`GIVE_UP`]; then this side serves, or stops naming who does.
//!
//! Two device sides that start within the same few milliseconds are not caught.

use super::subjects::Subjects;
use std::time::{Duration, Instant};

/// How long every answer to one question is read.
pub const ROUND: Duration = Duration::from_millis(500);

/// The pause before asking again while another device side answers.
pub const AGAIN_AFTER: Duration = Duration::from_millis(250);

/// How long a device side that was just told to stop gets to go away.
pub const GIVE_UP: Duration = Duration::from_secs(5);

/// What a device side's answer on `P.D.device` is signed over besides its body: the kind of
/// note and the driver's subjects.
/// (Version 2: the answer signs the question's random bytes.)
pub fn claim_label(subjects: &Subjects) -> Vec<u8> {
    format!("ndd nats device claim v2 {}", subjects.device()).into_bytes()
}

/// Random bytes a question carries.
pub const QUESTION_LEN: usize = 16;

/// What the side serving signs to answer `question` (its bytes, then who it is: `me`); `None`
/// for a question that is not [`QUESTION_LEN`] bytes (not one this version asks).
pub fn answer_body(question: &[u8], me: &[u8]) -> Option<Vec<u8>> {
    (question.len() == QUESTION_LEN).then(|| [question, me].concat())
}

/// Who serves the driver, from a note answering `question`, signed under `label` by an
/// identity `trusted` accepts (its text escaped and bounded); or why the answer does not count
/// (escaped too).
pub fn check_claim(
    note: &[u8],
    label: &[u8],
    question: &[u8; QUESTION_LEN],
    trusted: impl Fn(&str) -> bool,
) -> Result<String, String> {
    let shown = |b: &[u8]| ndd_wire::text::printable_bytes(b, 80);
    let (body, fp) = match crate::seal::open_note(note, label) {
        Ok(x) => x,
        Err(e) => {
            // A device side of an ndd before claim v2 (join version 8) signs no question:
            // said for what it is, not counted (it cannot be told from a recording).
            let v1 = String::from_utf8_lossy(label).replacen(" claim v2 ", " claim v1 ", 1);
            if let Ok((_, fp)) = crate::seal::open_note(note, v1.as_bytes()) {
                if trusted(&fp) {
                    return Err(format!(
                        "a device side of an earlier ndd (signed by {fp}) answers; it cannot be told from a recording: if it serves this driver, stop it or update it"
                    ));
                }
            }
            return Err(format!(
                "not a signed claim of a device side ({e}): {}",
                shown(note)
            ));
        }
    };
    if !trusted(&fp) {
        return Err(format!(
            "signed by {fp}, which is neither this install nor in known_peers"
        ));
    }
    let Some(who) = body.strip_prefix(question.as_slice()) else {
        return Err(format!(
            "a claim signed by {fp} for another question (played again?)"
        ));
    };
    Ok(ndd_wire::text::printable_bytes(
        who,
        ndd_wire::text::MAX_SHOWN,
    ))
}

/// What the caller does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Ask on `P.D.device` now (a fresh inbox: answers to an earlier question are old), with
    /// fresh random bytes: tell them with [`Claim::asked`].
    Ask,
    /// Nothing until this instant (or an answer).
    Wait(Instant),
    /// Nobody else serves the driver: serve it, and answer for it.
    Serve,
    /// Another device side serves it (who, as its answer says): stop, naming it.
    Stop(String),
}

/// A device side's claim on its driver, from its start until it serves or stops.
#[derive(Debug)]
pub struct Claim {
    label: Vec<u8>,
    give_up: Instant,
    /// When the round of the question asked last ends.
    round_end: Option<Instant>,
    /// When to ask again.
    next_ask: Instant,
    /// Who answered in this round.
    serving: Option<String>,
    /// The question asked last.
    question: Option<[u8; QUESTION_LEN]>,
    done: bool,
}

impl Claim {
    /// A claim under `label` ([`claim_label`]) starting at `now`.
    pub fn new(label: Vec<u8>, now: Instant) -> Claim {
        Claim {
            label,
            give_up: now + GIVE_UP,
            round_end: None,
            next_ask: now,
            serving: None,
            question: None,
            done: false,
        }
    }

    /// The question asked after [`Step::Ask`]: its random bytes.
    pub fn asked(&mut self, question: [u8; QUESTION_LEN]) {
        self.question = Some(question);
    }

    /// An answer to the question asked last. A trusted claim makes this side wait (and stop,
    /// once [`GIVE_UP`] passed); anything else is ignored, with why (escaped, for a
    /// rate-limited warning).
    pub fn handle_answer(
        &mut self,
        note: &[u8],
        trusted: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        let Some(q) = &self.question else {
            return Err("an answer before any question".into());
        };
        let who = check_claim(note, &self.label, q, trusted)?;
        if self.round_end.is_some() {
            self.serving = Some(who);
        }
        Ok(())
    }

    /// What to do at `now`.
    pub fn poll(&mut self, now: Instant) -> Step {
        if self.done {
            return Step::Serve;
        }
        let Some(end) = self.round_end else {
            if now < self.next_ask {
                return Step::Wait(self.next_ask);
            }
            self.round_end = Some(now + ROUND);
            self.serving = None;
            return Step::Ask;
        };
        if now < end {
            return Step::Wait(end);
        }
        self.round_end = None;
        match self.serving.take() {
            Some(who) if now >= self.give_up => Step::Stop(who),
            Some(_) => {
                self.next_ask = now + AGAIN_AFTER;
                Step::Wait(self.next_ask)
            }
            None => {
                self.done = true;
                Step::Serve
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::LocalIdentity;

    fn identity(name: &str) -> LocalIdentity {
        let d = std::env::temp_dir().join(format!("ndd-claim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let (id, _) = crate::Identity::load_or_create(&d).unwrap();
        LocalIdentity::new(&id).unwrap()
    }

    #[test]
    fn alone_it_serves_after_one_round_and_forged_answers_change_nothing() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let me = identity("alone");
        let stranger = identity("alone-stranger");
        let trusted = |fp: &str| fp == me.fingerprint();
        let t0 = Instant::now();
        let mut c = Claim::new(claim_label(&subjects), t0);
        assert_eq!(c.poll(t0), Step::Ask);
        let q = [7; QUESTION_LEN];
        c.asked(q);
        assert_eq!(c.poll(t0), Step::Wait(t0 + ROUND));
        // Garbage with escape codes, a stranger's signed claim, a claim for another driver:
        // ignored, said escaped.
        let why = c
            .handle_answer(b"\x1b[2Jyou are hacked\n", trusted)
            .unwrap_err();
        assert!(
            why.starts_with("not a signed claim of a device side"),
            "{why}"
        );
        assert!(!why.contains('\x1b') && !why.contains('\n'), "{why:?}");
        let note = stranger
            .sign_note(
                &claim_label(&subjects),
                &answer_body(&q, b"run 1, process 2 on x").unwrap(),
            )
            .unwrap();
        assert!(c
            .handle_answer(&note, trusted)
            .unwrap_err()
            .contains("neither this install nor in known_peers"));
        let other = claim_label(&Subjects::new("ndd", "camera").unwrap());
        let note = me
            .sign_note(&other, &answer_body(&q, b"run 1").unwrap())
            .unwrap();
        assert!(c.handle_answer(&note, trusted).is_err());
        // A genuine answer recorded from another question (anyone may ask the side that
        // serves, and play its answer to later questions).
        let note = me
            .sign_note(
                &claim_label(&subjects),
                &answer_body(&[8; QUESTION_LEN], b"run 1").unwrap(),
            )
            .unwrap();
        assert!(c
            .handle_answer(&note, trusted)
            .unwrap_err()
            .contains("for another question (played again?)"));
        // A device side of an earlier ndd (claim v1: no question signed) is said for what it
        // is, and not counted.
        let v1 = format!("ndd nats device claim v1 {}", subjects.device());
        let note = me.sign_note(v1.as_bytes(), b"run 1").unwrap();
        assert!(c
            .handle_answer(&note, trusted)
            .unwrap_err()
            .contains("a device side of an earlier ndd"));
        assert_eq!(answer_body(b"", b"x"), None, "an earlier ndd's question");
        assert_eq!(c.poll(t0 + ROUND), Step::Serve);
        assert_eq!(c.poll(t0 + ROUND * 10), Step::Serve);
    }

    #[test]
    fn a_trusted_answer_makes_it_wait_and_stop_after_five_seconds_naming_who_serves() {
        let subjects = Subjects::new("ndd", "serial").unwrap();
        let label = claim_label(&subjects);
        let peer = identity("peer");
        let trusted = |fp: &str| fp == peer.fingerprint();
        let who = "run 00ab, process 42 on pi\x1b[31m";
        let t0 = Instant::now();
        let mut c = Claim::new(label.clone(), t0);
        let mut now = t0;
        let mut asks = 0u8;
        let stopped = loop {
            match c.poll(now) {
                Step::Ask => {
                    asks += 1;
                    let q = [asks; QUESTION_LEN];
                    c.asked(q);
                    let body = answer_body(&q, who.as_bytes()).unwrap();
                    c.handle_answer(&peer.sign_note(&label, &body).unwrap(), trusted)
                        .unwrap();
                }
                Step::Wait(t) => {
                    assert!(t > now);
                    now = t;
                }
                Step::Serve => panic!("served while another side answers"),
                Step::Stop(who) => break who,
            }
        };
        assert!(now >= t0 + GIVE_UP && now < t0 + GIVE_UP + ROUND + AGAIN_AFTER);
        assert_eq!(asks, 7, "asked every 0.75 s for 5 s");
        assert!(stopped.starts_with("run 00ab, process 42 on pi") && !stopped.contains('\x1b'));
        // One that was told to stop and goes away in time: this side serves.
        let mut c = Claim::new(claim_label(&subjects), t0);
        assert_eq!(c.poll(t0), Step::Ask);
        c.asked([1; QUESTION_LEN]);
        let body = answer_body(&[1; QUESTION_LEN], b"old").unwrap();
        c.handle_answer(
            &peer.sign_note(&claim_label(&subjects), &body).unwrap(),
            trusted,
        )
        .unwrap();
        assert_eq!(c.poll(t0 + ROUND), Step::Wait(t0 + ROUND + AGAIN_AFTER));
        assert_eq!(c.poll(t0 + ROUND + AGAIN_AFTER), Step::Ask);
        assert_eq!(c.poll(t0 + ROUND * 2 + AGAIN_AFTER), Step::Serve);
    }
}
