//! The device's admission rules, sans-IO: which app side the join service admits, which
//! split slot each one holds, who is still there, and what it says about it.
//!
//! The key exchange itself is [`super::join::Host`]; once it has told who asks (a
//! fingerprint) and what its HELLO says, [`Admitter::decide`] applies, in this order:
//!
//! 1. **trust**: the fingerprint must be in `known_peers` (the caller reads it: [`Trust`]);
//! 2. **agreement**: the app side's HELLO must agree with the device's, as on a direct link
//!    (`ndd_core::session::decide_handshake`);
//! 3. **a split slot**, when the driver splits its frames among app sides: the one it holds
//!    already, else the lowest free one; a slot whose holder has not said it is there (its
//!    ready heartbeat, [`Admitter::handle_ready`]) for `gone_after` is free again; none free
//!    refuses, naming who holds them.
//!
//! Admitted, a side counts as present from that moment; then each of its ready heartbeats
//! ([`Ready`]: sealed under the run key by the caller) says it is still there, but only one
//! newer than the last taken from that side: a process of the app side numbers its beats from
//! 0 under its own process number (its wall clock when it started), so a beat recorded and
//! played again later — by anyone who may publish on the server — says nothing (before, each
//! beat was told from a replay only by the `encrypt` pair's memory of 258 epochs: a
//! recording older than that kept an app side that had left "present", holding its split
//! slot from the others, for as long as it was played). Anyone who may publish on the server
//! can make an identity and ask to join as often as it likes, and a rekey notice (which
//! carries nothing secret) makes every app side join again: the lines about refusals are at
//! most five a second of each kind, with the count held back, and a side's join is said once
//! per [`SAY_JOINED_EVERY`]; the caller takes them with [`Admitter::poll_line`] and logs
//! them. Nothing here reads a clock or a file: the caller passes `now`, the trust lookup and
//! the HELLO, and writes who holds the key.

use ndd_core::session::{decide_handshake, HandshakeDecision, PeerOpening};
use ndd_core::RateLimit;
use ndd_wire::{CloseCode, HelloRepr, Message};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A side's join is said at most once per this (it joins again to follow every rotation).
pub const SAY_JOINED_EVERY: Duration = Duration::from_secs(10);

/// What `known_peers` says of the fingerprint that asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// In it, under this name (the fingerprint when it has none).
    Trusted(String),
    /// Not in it.
    Untrusted,
    /// `known_peers` could not be read (why).
    Unreadable(String),
}

/// How much a [`Line`] matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Worth a user's attention (a refusal).
    Warn,
    /// What happened (a side joined, a slot is free again).
    Info,
    /// Detail (a side joined again).
    Debug,
}

/// A line for the device's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// How much it matters.
    pub level: Level,
    /// The text (fingerprints and names are the caller's own `known_peers` entries or
    /// hex fingerprints: nothing from the network raw).
    pub text: String,
    /// Lines like it held back since the last one said (rate limit).
    pub suppressed: u64,
}

/// What a [`Ready`] body begins with: its kind and format.
const READY_TAG: &[u8] = b"NR\x01";

/// The most bytes of a fingerprint a [`Ready`] carries.
pub const READY_FINGERPRINT_MAX: usize = 128;

/// An app side's ready heartbeat, the body the caller seals under the run key:
/// `"NR" 1 ‖ process (u64 BE) ‖ count (u64 BE) ‖ fingerprint (UTF-8, at most`
/// [`READY_FINGERPRINT_MAX`] `bytes)`. (Join version 8; before, the fingerprint alone.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// The app side's process: its wall clock (ns) when it started, so a later process of
    /// the same side numbers higher (a clock set back between two processes leaves the later
    /// one unheard until it passes the earlier one's start: its slot may go to another side).
    pub process: u64,
    /// The beat's number within the process, from 0.
    pub count: u64,
    /// Who beats.
    pub fingerprint: String,
}

impl Ready {
    /// The body.
    pub fn emit(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(READY_TAG.len() + 16 + self.fingerprint.len());
        b.extend_from_slice(READY_TAG);
        b.extend_from_slice(&self.process.to_be_bytes());
        b.extend_from_slice(&self.count.to_be_bytes());
        b.extend_from_slice(self.fingerprint.as_bytes());
        b
    }

    /// Reads a body; `None` unless it is one.
    pub fn parse(b: &[u8]) -> Option<Ready> {
        let b = b.strip_prefix(READY_TAG)?;
        let (process, rest) = b.split_first_chunk::<8>()?;
        let (count, fp) = rest.split_first_chunk::<8>()?;
        if fp.is_empty() || fp.len() > READY_FINGERPRINT_MAX {
            return None;
        }
        Some(Ready {
            process: u64::from_be_bytes(*process),
            count: u64::from_be_bytes(*count),
            fingerprint: std::str::from_utf8(fp).ok()?.to_string(),
        })
    }
}

/// The split slots held, as the device's home keeps them: a line `SLOT FINGERPRINT` each.
pub fn encode_slots(held: &[(u16, String)]) -> String {
    held.iter().map(|(s, f)| format!("{s} {f}\n")).collect()
}

/// Reads what [`encode_slots`] wrote; lines that are not a slot and a fingerprint are left
/// out (how many: the second value).
pub fn parse_slots(text: &str) -> (Vec<(u16, String)>, usize) {
    let mut bad = 0;
    let mut held = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match line
            .split_once(' ')
            .and_then(|(s, f)| Some((s.parse().ok()?, f.trim())))
        {
            Some((s, f)) if !f.is_empty() && !f.contains(char::is_whitespace) => {
                held.push((s, f.to_string()))
            }
            _ => bad += 1,
        }
    }
    (held, bad)
}

/// What [`Admitter::handle_ready`] made of a beat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// A side not known here before (it joined before this device side started).
    New,
    /// A side known here, still there.
    Again,
    /// Not newer than the last beat taken from that side (played again, or late): ignored.
    Stale,
}

/// App sides whose last beat is remembered at most (beats come only from sides that hold the
/// run key; past this the side heard longest ago is forgotten).
const BEATS_KEPT: usize = 4096;

/// What the join service answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Admitted, in this split slot (none when the driver does not split).
    Admitted {
        /// Its slot.
        slot: Option<u16>,
    },
    /// Refused, with the close code and reason the app side is told.
    Refused {
        /// The close code.
        code: CloseCode,
        /// Why, for the app side's user.
        reason: String,
    },
}

/// See the module docs.
#[derive(Debug)]
pub struct Admitter {
    /// The device's own HELLO.
    hello: HelloRepr,
    /// The device's fingerprint and home, for the hints in refusals.
    fingerprint: String,
    home: String,
    /// Split slots (0: the driver does not split).
    slots: u16,
    /// Slot of each app side that holds one, by fingerprint.
    taken: HashMap<String, u16>,
    /// When each app side last said it is there (admitted, or its ready heartbeat).
    seen: HashMap<String, Instant>,
    /// The last beat taken from each app side: (process, count).
    beats: HashMap<String, (u64, u64)>,
    /// An app side not heard from for this long has left.
    gone_after: Duration,
    /// When each app side's join was last said.
    said_joined: HashMap<String, Instant>,
    quiet: bool,
    untrusted: RateLimit,
    refused: RateLimit,
    lines: std::collections::VecDeque<Line>,
}

impl Admitter {
    /// The rules of a device side with HELLO `hello`, fingerprint `fingerprint` and ndd home
    /// `home` (named in hints), splitting frames among `slots` app sides (0: no split); an app
    /// side silent for `gone_after` has left. `quiet`: joins and refusals of trusted sides
    /// are not said at info level.
    pub fn new(
        hello: HelloRepr,
        fingerprint: &str,
        home: &str,
        slots: u16,
        gone_after: Duration,
        quiet: bool,
    ) -> Admitter {
        let limit = || RateLimit::with_burst(Duration::from_secs(1), 5);
        Admitter {
            hello,
            fingerprint: fingerprint.to_string(),
            home: home.to_string(),
            slots,
            taken: HashMap::new(),
            seen: HashMap::new(),
            beats: HashMap::new(),
            gone_after,
            said_joined: HashMap::new(),
            quiet,
            untrusted: limit(),
            refused: limit(),
            lines: std::collections::VecDeque::new(),
        }
    }

    /// The next line for the log, if any.
    pub fn poll_line(&mut self) -> Option<Line> {
        self.lines.pop_front()
    }

    fn say(&mut self, level: Level, text: String, suppressed: u64) {
        // Bounded: a caller that never polls loses the oldest.
        if self.lines.len() >= 64 {
            self.lines.pop_front();
        }
        self.lines.push_back(Line {
            level,
            text,
            suppressed,
        });
    }

    /// An app side said it is there: `beat`, opened under the run key. Taken only if newer
    /// than the last one taken from that side.
    pub fn handle_ready(&mut self, now: Instant, beat: &Ready) -> Heard {
        let this = (beat.process, beat.count);
        if self
            .beats
            .get(&beat.fingerprint)
            .is_some_and(|last| this <= *last)
        {
            return Heard::Stale;
        }
        if self.beats.len() >= BEATS_KEPT && !self.beats.contains_key(&beat.fingerprint) {
            let oldest = self
                .beats
                .keys()
                .min_by_key(|fp| self.seen.get(*fp).copied())
                .cloned();
            if let Some(fp) = oldest {
                self.beats.remove(&fp);
            }
        }
        self.beats.insert(beat.fingerprint.clone(), this);
        match self.seen.insert(beat.fingerprint.clone(), now) {
            None => Heard::New,
            Some(_) => Heard::Again,
        }
    }

    /// Whether app side `fingerprint` was heard from within `gone_after` of `now`.
    pub fn present(&self, now: Instant, fingerprint: &str) -> bool {
        self.seen
            .get(fingerprint)
            .is_some_and(|t| now.saturating_duration_since(*t) < self.gone_after)
    }

    /// How many app sides are there now: each beat within `gone_after` of `now` (what
    /// `min_app_sides` waits for). A side the run before left a slot to ([`Admitter::restore`])
    /// counts once it beats. Before, the device counted every side ever heard, so one that
    /// beat once and left still counted and the sources started with fewer sides there than
    /// asked (found by a review).
    pub fn ready_present(&self, now: Instant) -> usize {
        self.beats.keys().filter(|fp| self.present(now, fp)).count()
    }

    /// The split slot `fingerprint` holds, if any.
    pub fn slot_of(&self, fingerprint: &str) -> Option<u16> {
        self.taken.get(fingerprint).copied()
    }

    /// The split slots as they are held, by slot (what a restarted device side gives back:
    /// [`Admitter::restore`], the file [`encode_slots`]).
    pub fn slots_held(&self) -> Vec<(u16, String)> {
        let mut v: Vec<(u16, String)> = self.taken.iter().map(|(f, s)| (*s, f.clone())).collect();
        v.sort_unstable();
        v
    }

    /// A restarted device side: the slots held before it, each kept for its app side, which
    /// counts as present from `now` (it joins again once it hears of the new run; silent for
    /// `gone_after`, its slot is free again). Before, every slot was free after a restart,
    /// and the app side that joined first took slot 0 whichever it had held: an app side
    /// whose slot changed ends, so a restart ended about half the app sides of a split
    /// driver (found by a review). Slots beyond this driver's, and a second holder of one,
    /// are left out.
    pub fn restore(&mut self, now: Instant, held: &[(u16, String)]) {
        for (slot, fp) in held {
            if *slot >= self.slots
                || self.taken.contains_key(fp)
                || self.taken.values().any(|s| s == slot)
            {
                continue;
            }
            self.taken.insert(fp.clone(), *slot);
            self.seen.insert(fp.clone(), now);
        }
    }

    /// The answer to app side `fingerprint` (as `known_peers` has it: `trust`) asking to join
    /// with HELLO message `hello`, at `now`.
    pub fn decide(
        &mut self,
        now: Instant,
        fingerprint: &str,
        trust: Trust,
        hello: &[u8],
    ) -> Decision {
        let name = match trust {
            Trust::Trusted(name) => name,
            Trust::Unreadable(why) => {
                return self.refuse(
                    now,
                    CloseCode::InternalError,
                    format!("the device side cannot read its known_peers: {why}"),
                )
            }
            Trust::Untrusted => {
                if let Some(suppressed) = self.untrusted.admit(now) {
                    let text = format!(
                        "refused untrusted app side with fingerprint {fingerprint}; if you trust it, run: ndd trust {fingerprint} --home {}",
                        self.home
                    );
                    self.say(Level::Warn, text, suppressed);
                }
                return Decision::Refused {
                    code: CloseCode::UntrustedPeer,
                    reason: format!(
                        "this install ({fingerprint}) is not trusted by the device side ({}); on the device's machine run: ndd trust {fingerprint}",
                        self.fingerprint
                    ),
                };
            }
        };
        let decision = match Message::parse(hello, 1 << 20) {
            Ok((m, _)) => {
                let m = m.to_owned_message();
                decide_handshake(&self.hello, PeerOpening::Message(&m))
            }
            Err(_) => HandshakeDecision::NotAPeer("its HELLO does not parse".into()),
        };
        match decision {
            HandshakeDecision::Agree(_) => {}
            HandshakeDecision::Refuse { code, reason } => return self.refuse(now, code, reason),
            HandshakeDecision::RefusedByPeer { reason, .. }
            | HandshakeDecision::NotAPeer(reason) => {
                return self.refuse(now, CloseCode::ProtocolError, reason)
            }
        }
        let slot = match self.slot(now, fingerprint) {
            Ok(s) => s,
            Err(reason) => return self.refuse(now, CloseCode::InternalError, reason),
        };
        // Admitted now: it counts as present until its heartbeat says otherwise.
        self.seen.insert(fingerprint.to_string(), now);
        let said = self
            .said_joined
            .get(fingerprint)
            .is_some_and(|t| now.saturating_duration_since(*t) < SAY_JOINED_EVERY);
        if !said {
            self.said_joined.insert(fingerprint.to_string(), now);
        }
        let s = slot
            .map(|s| format!(" (split slot {s})"))
            .unwrap_or_default();
        if !self.quiet && !said {
            self.say(Level::Info, format!("app side {name} joined{s}"), 0);
        } else {
            self.say(Level::Debug, format!("app side {name} joined again{s}"), 0);
        }
        Decision::Admitted { slot }
    }

    /// The slot for `fingerprint`: the one it holds, else the lowest free one, else the lowest
    /// one whose holder left (silent for `gone_after`). A holder loses its slot only when it
    /// is given to another: one that was silent for a while and speaks again before that
    /// keeps it.
    fn slot(&mut self, now: Instant, fingerprint: &str) -> Result<Option<u16>, String> {
        if self.slots == 0 {
            return Ok(None);
        }
        if let Some(s) = self.taken.get(fingerprint) {
            return Ok(Some(*s));
        }
        let holder = |s: u16| {
            self.taken
                .iter()
                .find(|(_, t)| **t == s)
                .map(|(h, _)| h.clone())
        };
        let free = (0..self.slots).find(|s| holder(*s).is_none());
        let slot = match free {
            Some(s) => s,
            None => {
                let left = (0..self.slots).find_map(|s| {
                    let h = holder(s)?;
                    (!self.present(now, &h)).then_some((s, h))
                });
                let Some((s, h)) = left else {
                    let mut holders: Vec<&str> = self.taken.keys().map(String::as_str).collect();
                    holders.sort_unstable();
                    return Err(format!(
                        "all {} split slots are taken (by {}); a slot is free again once its app side has been silent for link.keepalive_timeout_ms",
                        self.slots,
                        holders.join(", ")
                    ));
                };
                self.say(
                    Level::Info,
                    format!("split slot {s} is free again: its app side {h} left"),
                    0,
                );
                self.taken.remove(&h);
                s
            }
        };
        self.taken.insert(fingerprint.to_string(), slot);
        Ok(Some(slot))
    }

    /// A refusal of a trusted side (or of anyone, when `known_peers` cannot be read), said at
    /// most five times a second.
    fn refuse(&mut self, now: Instant, code: CloseCode, reason: String) -> Decision {
        if !self.quiet {
            if let Some(suppressed) = self.refused.admit(now) {
                self.say(
                    Level::Warn,
                    format!("refused an app side: {reason}"),
                    suppressed,
                );
            }
        }
        Decision::Refused { code, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_wire::{OwnedMessage, Side};

    fn hello(side: Side, driver: &str) -> HelloRepr {
        HelloRepr {
            side,
            max_body: 1 << 20,
            driver: driver.into(),
            streams: vec![],
        }
    }

    fn app_hello(driver: &str) -> Vec<u8> {
        OwnedMessage::Hello(hello(Side::App, driver))
            .as_message()
            .emit_to_vec()
            .unwrap()
    }

    fn admitter(slots: u16) -> Admitter {
        Admitter::new(
            hello(Side::Device, "d"),
            "devfp",
            "/home",
            slots,
            Duration::from_secs(5),
            true,
        )
    }

    fn trusted() -> Trust {
        Trust::Trusted("x".into())
    }

    fn join(a: &mut Admitter, t: Instant, fp: &str) -> Decision {
        a.decide(t, fp, trusted(), &app_hello("d"))
    }

    #[test]
    fn only_a_trusted_side_whose_hello_agrees_is_admitted() {
        let now = Instant::now();
        let mut a = admitter(0);
        assert_eq!(
            a.decide(now, "fp", trusted(), &app_hello("d")),
            Decision::Admitted { slot: None }
        );
        match a.decide(now, "stranger", Trust::Untrusted, &app_hello("d")) {
            Decision::Refused { code, reason } => {
                assert_eq!(code, CloseCode::UntrustedPeer);
                assert!(reason.contains("ndd trust stranger"), "{reason}");
                assert!(reason.contains("devfp"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
        assert!(!a.present(now, "stranger"));
        match a.decide(now, "fp2", trusted(), &app_hello("other")) {
            Decision::Refused { reason, .. } => assert!(reason.contains("other"), "{reason}"),
            d => panic!("{d:?}"),
        }
        match a.decide(now, "fp3", trusted(), b"garbage") {
            Decision::Refused { code, reason } => {
                assert_eq!(code, CloseCode::ProtocolError);
                assert!(reason.contains("does not parse"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
        match a.decide(
            now,
            "fp",
            Trust::Unreadable("denied".into()),
            &app_hello("d"),
        ) {
            Decision::Refused { code, reason } => {
                assert_eq!(code, CloseCode::InternalError);
                assert!(reason.contains("denied"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn a_split_slot_is_kept_by_its_side_and_freed_once_it_is_silent() {
        let t0 = Instant::now();
        let mut a = admitter(2);
        assert_eq!(join(&mut a, t0, "a"), Decision::Admitted { slot: Some(0) });
        assert_eq!(join(&mut a, t0, "b"), Decision::Admitted { slot: Some(1) });
        // Joining again (a rotation) keeps the slot.
        assert_eq!(join(&mut a, t0, "a"), Decision::Admitted { slot: Some(0) });
        match join(&mut a, t0, "c") {
            Decision::Refused { reason, .. } => {
                assert!(
                    reason.contains("all 2 split slots are taken (by a, b)"),
                    "{reason}"
                )
            }
            d => panic!("{d:?}"),
        }
        // "a" keeps saying it is there, "b" goes quiet: after 5 s its slot is "c"'s.
        let t = t0 + Duration::from_secs(4);
        assert_eq!(a.handle_ready(t, &beat("a", 1, 0)), Heard::Again);
        let t = t0 + Duration::from_secs(6);
        assert!(a.present(t, "a") && !a.present(t, "b"));
        assert_eq!(join(&mut a, t, "c"), Decision::Admitted { slot: Some(1) });
        assert_eq!(a.slot_of("b"), None);
        assert_eq!(
            a.handle_ready(t, &beat("d", 1, 0)),
            Heard::New,
            "a side never admitted here is new"
        );
        // Quiet: joins are detail, the freed slot is said.
        let lines: Vec<Line> = std::iter::from_fn(|| a.poll_line()).collect();
        assert!(lines.iter().any(|l| l.level == Level::Info
            && l.text == "split slot 1 is free again: its app side b left"));
        assert!(lines
            .iter()
            .filter(|l| l.text.contains("joined"))
            .all(|l| l.level == Level::Debug));
    }

    #[test]
    fn refusals_are_a_few_lines_a_second_with_the_count_held_back() {
        let t0 = Instant::now();
        let mut a = Admitter::new(
            hello(Side::Device, "d"),
            "devfp",
            "/home",
            0,
            Duration::from_secs(5),
            false,
        );
        for i in 0..1000u64 {
            let t = t0 + Duration::from_millis(if i == 999 { 2000 } else { i / 2 });
            a.decide(t, "stranger", Trust::Untrusted, &app_hello("d"));
        }
        let lines: Vec<Line> = std::iter::from_fn(|| a.poll_line()).collect();
        assert_eq!(lines.len(), 6, "{lines:#?}");
        assert!(lines.iter().all(|l| l.level == Level::Warn
            && l.text
                .starts_with("refused untrusted app side with fingerprint stranger")
            && l.text.ends_with("--home /home")));
        assert_eq!(lines[5].suppressed, 994);
        assert_eq!(
            a.decide(t0, "x", trusted(), &app_hello("d")),
            Decision::Admitted { slot: None }
        );
        assert_eq!(a.poll_line().unwrap().text, "app side x joined");
    }

    #[test]
    fn only_sides_beating_now_count_as_there() {
        let t0 = Instant::now();
        let mut a = admitter(2);
        // "r" held a slot in the run before: kept for it, but not there until it beats.
        a.restore(t0, &[(1, "r".into())]);
        assert_eq!(a.ready_present(t0), 0);
        a.handle_ready(t0, &beat("a", 1, 0));
        a.handle_ready(t0, &beat("b", 1, 0));
        assert_eq!(a.ready_present(t0), 2);
        // "a" goes quiet; "b" and "r" beat. Three were heard, two are there.
        let t = t0 + Duration::from_secs(6);
        a.handle_ready(t, &beat("b", 1, 1));
        a.handle_ready(t, &beat("r", 1, 0));
        assert_eq!(a.ready_present(t), 2);
        // A beat played again makes no one there again.
        assert_eq!(a.handle_ready(t, &beat("a", 1, 0)), Heard::Stale);
        assert_eq!(a.ready_present(t), 2);
        assert_eq!(a.ready_present(t + Duration::from_secs(6)), 0);
    }

    fn beat(fp: &str, process: u64, count: u64) -> Ready {
        Ready {
            process,
            count,
            fingerprint: fp.into(),
        }
    }

    #[test]
    fn a_beat_played_again_or_of_an_earlier_process_says_nothing() {
        let t0 = Instant::now();
        let mut a = admitter(1);
        assert_eq!(join(&mut a, t0, "a"), Decision::Admitted { slot: Some(0) });
        let mut recorded = Vec::new();
        for n in 0..300u64 {
            let t = t0 + Duration::from_secs(n);
            let b = beat("a", 10, n);
            assert_eq!(a.handle_ready(t, &b), Heard::Again);
            recorded.push(b);
        }
        // "a" left. Every beat it sent, played again long after, is stale: it is not
        // present, and its slot goes to "b".
        let t = t0 + Duration::from_secs(400);
        for b in &recorded {
            assert_eq!(a.handle_ready(t, b), Heard::Stale);
        }
        assert!(!a.present(t, "a"));
        assert_eq!(join(&mut a, t, "b"), Decision::Admitted { slot: Some(0) });
        // A later process of "a" starts its count over and is heard; the earlier one's beats
        // are not, even numbered higher.
        assert_eq!(a.handle_ready(t, &beat("a", 11, 0)), Heard::Again);
        assert_eq!(a.handle_ready(t, &beat("a", 10, 999)), Heard::Stale);
        assert_eq!(a.handle_ready(t, &beat("a", 11, 0)), Heard::Stale);
        assert_eq!(a.handle_ready(t, &beat("a", 11, 1)), Heard::Again);
    }

    #[test]
    fn a_ready_body_reads_back_and_anything_else_is_refused() {
        let b = beat("SHA256:abc", 7, 3);
        assert_eq!(Ready::parse(&b.emit()), Some(b));
        assert_eq!(
            Ready::parse(b"SHA256:NRVErCYXAxUNmJUzcdV+m3XydGbJzvqEGtNg+Dbdrd4"),
            None,
            "the earlier body (a fingerprint alone)"
        );
        let body = |rest: &[u8]| [READY_TAG, &[0; 16], rest].concat();
        assert_eq!(Ready::parse(&body(b"")), None, "no fingerprint");
        assert_eq!(
            Ready::parse(&body(&[b'a'; READY_FINGERPRINT_MAX + 1])),
            None
        );
        assert_eq!(Ready::parse(&body(&[0xff, 0xfe])), None, "not UTF-8");
        assert!(Ready::parse(&body(b"x")).is_some());
    }

    #[test]
    fn a_restarted_device_side_gives_each_app_side_its_slot_back() {
        let t0 = Instant::now();
        let mut a = admitter(2);
        assert_eq!(join(&mut a, t0, "a"), Decision::Admitted { slot: Some(0) });
        assert_eq!(join(&mut a, t0, "b"), Decision::Admitted { slot: Some(1) });
        let file = encode_slots(&a.slots_held());
        assert_eq!(file, "0 a\n1 b\n");
        // The restart: "b" joins again first, and keeps slot 1; a stranger finds none free.
        let t1 = t0 + Duration::from_secs(60);
        let mut a = admitter(2);
        let (held, bad) = parse_slots(&(file + "junk\n9x y\n"));
        assert_eq!(bad, 2);
        a.restore(t1, &held);
        assert_eq!(join(&mut a, t1, "b"), Decision::Admitted { slot: Some(1) });
        assert!(matches!(join(&mut a, t1, "c"), Decision::Refused { .. }));
        assert_eq!(join(&mut a, t1, "a"), Decision::Admitted { slot: Some(0) });
        // One that does not come back within gone_after leaves its slot.
        let mut a = admitter(2);
        a.restore(t1, &held);
        let t2 = t1 + Duration::from_secs(6);
        assert_eq!(join(&mut a, t2, "c"), Decision::Admitted { slot: Some(0) });
        // Slots beyond the driver's, and a second holder of one, are left out.
        let mut a = admitter(1);
        a.restore(t1, &[(0, "a".into()), (0, "b".into()), (3, "c".into())]);
        assert_eq!(a.slots_held(), vec![(0, "a".to_string())]);
    }
}
