//! Pairing by code (sans-IO): two installs that have never met trust each other after a person
//! reads a short one-time code off one machine and types it on the other (`ndd pair`).
//!
//! The code is never sent. Both sides run SPAKE2 (the `spake2` crate, Ed25519 group) with it
//! as the password over a plain connection, then each proves it derived the same key: a
//! `Proof` is a note signed by the install's identity over the exchange's transcript (so it
//! holds the key behind the fingerprint it shows) and a MAC under the PAKE key (so it knew the
//! code). Only then does either side learn the other's fingerprint as trustworthy.
//!
//! - One connection tests one guess of the code: SPAKE2 gives an active attacker no offline
//!   test. The side that shows the code (the [`Offer`]) checks the other's proof before it
//!   sends anything that depends on the key, counts a wrong one, and after [`TRIES`] wrong
//!   ones the code is void. A code lives [`CODE_LIFETIME`].
//! - The joining side sends its proof first and trusts the offering side only if that side's
//!   proof checks: someone who answers in its place without the code is found out.
//! - Every message is length-bounded ([`MAX_MESSAGE`]); the name a peer gives is only
//!   suggested (the caller checks it) and shown escaped.
//!
//! Wire: each message is `len: u16 BE ‖ kind: u8 ‖ body` (`len` counts kind and body).
//! `Hello` (joining → offering): `"ndd-pair" ‖ version 1 ‖ SPAKE2 message`; `Reply`: the
//! offering side's SPAKE2 message; `Proof`: `note_len: u16 ‖ note ‖ MAC(32)`, joining side
//! first; `Refused`: a reason byte.

use rand_core::{CryptoRng, RngCore};
use ring::hmac;
use spake2::{Ed25519Group, Identity as SpakeId, Password, Spake2};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The random source the exchange's callers use outside tests (the operating system's).
pub use rand_core::OsRng;

/// How long a code shown by `ndd pair` can be used.
pub const CODE_LIFETIME: Duration = Duration::from_secs(300);

/// Wrong codes an offer takes before it is void.
pub const TRIES: u32 = 3;

/// How long one exchange may take, from its first byte to its end.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the offering side waits for a connection's Hello, then for its Proof after the
/// Reply: a joining side sends each at once, and connections are taken one at a time (a
/// silent one must not hold the code for long).
pub const STEP_WAIT: Duration = Duration::from_secs(3);

/// Digits in a code (shown as `1234-5678`).
pub const CODE_DIGITS: usize = 8;

/// Largest message either side accepts (a note with an RSA SPKI and signature fits).
pub const MAX_MESSAGE: usize = 4096;

const MAGIC: &[u8] = b"ndd-pair";
const VERSION: u8 = 1;
const SPAKE_MSG_LEN: usize = 33;
const MAC_LEN: usize = 32;
const ID_JOIN: &[u8] = b"ndd pair v1 joining side";
const ID_OFFER: &[u8] = b"ndd pair v1 offering side";

/// A message's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The joining side's SPAKE2 message.
    Hello = 1,
    /// The offering side's SPAKE2 message.
    Reply = 2,
    /// A signed note and a MAC under the PAKE key.
    Proof = 3,
    /// The offering side ends the exchange (a [`Refusal`]).
    Refused = 4,
}

/// Why the offering side ended an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Refusal {
    /// The joining side's proof did not check: it typed another code.
    WrongCode = 1,
    /// The code's time is over.
    Expired = 2,
    /// Too many wrong codes: this code is void.
    Void = 3,
    /// The message did not parse.
    Malformed = 4,
    /// The joining side's identity proof did not check (its MAC did: it knew the code).
    BadSignature = 5,
    /// The joining side is the offering side's own install.
    SelfPair = 6,
}

impl Refusal {
    fn from_u8(b: u8) -> Option<Refusal> {
        Some(match b {
            1 => Refusal::WrongCode,
            2 => Refusal::Expired,
            3 => Refusal::Void,
            4 => Refusal::Malformed,
            5 => Refusal::BadSignature,
            6 => Refusal::SelfPair,
            _ => return None,
        })
    }
}

/// How a pairing failed. Texts are shown to the person pairing as they are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    /// The code typed is not one `ndd pair` shows: wrong length or characters.
    #[error("a pairing code is {CODE_DIGITS} digits, as `ndd pair` shows it (e.g. 1234-5678); got {0:?}")]
    BadCode(String),
    /// The joining side typed another code (seen by the offering side, or told by it).
    #[error("the code does not match the one shown on the other machine; check it and try again ({0} {tries} left)", tries = if *.0 == 1 { "try" } else { "tries" })]
    WrongCode(u32),
    /// The other machine says the code typed there does not match, and this was the last try.
    #[error(
        "the code does not match, and that was its last try: run `ndd pair` again for a new code"
    )]
    LastTry,
    /// The code's time is over.
    #[error("this pairing code expired (codes last {} min): run `ndd pair` again for a new one", CODE_LIFETIME.as_secs() / 60)]
    Expired,
    /// Too many wrong codes.
    #[error(
        "too many wrong codes ({TRIES}): this code is void; run `ndd pair` again for a new one"
    )]
    Void,
    /// The offering side's proof does not check: whoever answered did not have the code.
    #[error("the machine that answered does not know the code: not the one showing it (a wrong address, or someone in between)")]
    Impostor,
    /// A proof's MAC checked but its signature did not.
    #[error("the other side's identity proof does not check: {0}")]
    BadSignature(String),
    /// The peer is this install (the same key pair).
    #[error(
        "the other side is this same install (same identity {0}): pair two different ndd homes"
    )]
    SelfPair(String),
    /// A message that does not parse, or comes out of turn.
    #[error("the other side sent something that is not ndd pairing: {0}")]
    Malformed(String),
    /// The peer went away mid-exchange.
    #[error("the other side closed the connection before pairing finished")]
    Closed,
    /// The exchange took too long.
    #[error("the other side stopped answering ({}s without pairing)", EXCHANGE_TIMEOUT.as_secs())]
    TimedOut,
    /// This install could not sign.
    #[error("cannot sign with this install's identity: {0}")]
    Sign(String),
}

/// Who the other side is, once pairing succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its fingerprint (`SHA256:…`), proven by its signature and the code.
    pub fingerprint: String,
    /// The name it gave (its host name, usually): raw, at most 64 bytes; check it before use.
    pub name: Vec<u8>,
}

/// Normalizes a code as typed (digits, with any `-` or spaces between), or says why not.
pub fn parse_code(typed: &str) -> Result<String, PairError> {
    let digits: String = typed
        .chars()
        .filter(|c| !matches!(c, '-' | ' ' | '_'))
        .collect();
    if digits.len() != CODE_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PairError::BadCode(ndd_wire::text::printable(typed, 40)));
    }
    Ok(digits)
}

/// A fresh code from the system's random source, as shown (`1234-5678`).
pub fn new_code() -> String {
    use ring::rand::SecureRandom;
    let rng = ring::rand::SystemRandom::new();
    let mut digits = String::with_capacity(CODE_DIGITS + 1);
    while digits.len() < CODE_DIGITS + 1 {
        if digits.len() == CODE_DIGITS / 2 {
            digits.push('-');
            continue;
        }
        let mut b = [0u8; 1];
        rng.fill(&mut b).expect("the system's random source");
        // Rejection sampling: 250 = 25 × 10, so each digit is equally likely.
        if b[0] < 250 {
            digits.push(char::from(b'0' + b[0] % 10));
        }
    }
    digits
}

/// The offering side's bookkeeping across connections: the code, its time, its tries.
#[derive(Debug)]
pub struct Offer {
    code: String,
    expires: Instant,
    wrong_left: u32,
}

impl Offer {
    /// An offer of `code` (as shown or normalized) made at `now`.
    pub fn new(code: &str, now: Instant) -> Result<Offer, PairError> {
        Ok(Offer {
            code: parse_code(code)?,
            expires: now + CODE_LIFETIME,
            wrong_left: TRIES,
        })
    }

    /// When the code expires.
    pub fn expires(&self) -> Instant {
        self.expires
    }

    /// Wrong codes it still takes.
    pub fn tries_left(&self) -> u32 {
        self.wrong_left
    }

    /// Whether the offer still takes connections at `now` (else why not).
    pub fn check(&self, now: Instant) -> Result<(), PairError> {
        if self.wrong_left == 0 {
            Err(PairError::Void)
        } else if now >= self.expires {
            Err(PairError::Expired)
        } else {
            Ok(())
        }
    }

    /// The exchange of one new connection, or (if the offer is over) one that only says why.
    pub fn exchange(&self, now: Instant, me: Signer, rng: impl CryptoRng + RngCore) -> Exchange {
        let mut x = Exchange::new(Role::Offer, &self.code, now, me, rng, self.check(now).err());
        x.left_if_wrong = self.wrong_left.saturating_sub(1);
        x
    }

    /// Counts how one exchange ended (a wrong code takes a try).
    pub fn handle_end(&mut self, end: &Result<Peer, PairError>) {
        if matches!(end, Err(PairError::WrongCode(_) | PairError::Void)) {
            self.wrong_left = self.wrong_left.saturating_sub(1);
        }
    }
}

/// What signs this side's proof: its identity and the name it gives.
#[derive(Debug, Clone)]
pub struct Signer {
    /// The install's identity.
    pub id: crate::seal::LocalIdentity,
    /// The name it suggests to the peer (its host name).
    pub name: String,
}

/// Which side of the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Shows the code and listens (`ndd pair`).
    Offer,
    /// Types the code and connects (`ndd pair CODE --connect HOST`).
    Join,
}

#[derive(Debug)]
enum State {
    /// Joining: Hello sent, waiting for the Reply. Offering: waiting for the Hello.
    Start,
    /// The key is agreed: waiting for the peer's proof.
    Agreed {
        keys: Box<Keys>,
    },
    Done,
}

struct Keys {
    /// The MAC key of the joining side's proof, and of the offering side's.
    join: hmac::Key,
    offer: hmac::Key,
    /// SHA-256 of Hello ‖ Reply.
    transcript: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").finish_non_exhaustive()
    }
}

/// One connection's exchange, either side: bytes in ([`Exchange::handle_data`]), bytes out
/// ([`Exchange::poll_transmit`]), its end ([`Exchange::end`]).
pub struct Exchange {
    role: Role,
    me: Signer,
    spake: Option<Spake2<Ed25519Group>>,
    /// This side's SPAKE2 message (Hello or Reply body).
    mine: Vec<u8>,
    hello: Vec<u8>,
    state: State,
    input: Vec<u8>,
    out: VecDeque<Vec<u8>>,
    deadline: Instant,
    end: Option<Result<Peer, PairError>>,
    /// What the offering side's peer is told when the offer is over at the start.
    over: Option<PairError>,
    /// Offering side: the tries its offer has left if this one's code is wrong.
    left_if_wrong: u32,
}

impl std::fmt::Debug for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exchange")
            .field("role", &self.role)
            .field("state", &self.state)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl Exchange {
    /// The joining side's exchange for `code` as typed (it sends its Hello at once).
    pub fn join(
        code: &str,
        now: Instant,
        me: Signer,
        rng: impl CryptoRng + RngCore,
    ) -> Result<Exchange, PairError> {
        let code = parse_code(code)?;
        Ok(Exchange::new(Role::Join, &code, now, me, rng, None))
    }

    fn new(
        role: Role,
        code: &str,
        now: Instant,
        me: Signer,
        rng: impl CryptoRng + RngCore,
        over: Option<PairError>,
    ) -> Exchange {
        let pw = Password::new(code.as_bytes());
        let (a, b) = (SpakeId::new(ID_JOIN), SpakeId::new(ID_OFFER));
        let (spake, mine) = match role {
            Role::Join => Spake2::<Ed25519Group>::start_a_with_rng(&pw, &a, &b, rng),
            Role::Offer => Spake2::<Ed25519Group>::start_b_with_rng(&pw, &a, &b, rng),
        };
        let mut x = Exchange {
            role,
            me,
            spake: Some(spake),
            mine,
            hello: Vec::new(),
            state: State::Start,
            input: Vec::new(),
            out: VecDeque::new(),
            deadline: now
                + match role {
                    Role::Offer => STEP_WAIT,
                    Role::Join => EXCHANGE_TIMEOUT,
                },
            end: None,
            over,
            left_if_wrong: 0,
        };
        if role == Role::Join {
            let mut body = MAGIC.to_vec();
            body.push(VERSION);
            body.extend_from_slice(&x.mine);
            x.hello = body.clone();
            x.send(Kind::Hello, &body);
        }
        x
    }

    /// Which side this is.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Bytes from the peer (any split).
    pub fn handle_data(&mut self, now: Instant, data: &[u8]) {
        if self.end.is_some() {
            return;
        }
        if now >= self.deadline {
            self.finish(Err(PairError::TimedOut));
            return;
        }
        if self.input.len() + data.len() > 2 * MAX_MESSAGE {
            self.refuse(
                Refusal::Malformed,
                "more than a pairing message at once".into(),
            );
            return;
        }
        self.input.extend_from_slice(data);
        while self.end.is_none() {
            let Some(len) = self
                .input
                .get(..2)
                .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
            else {
                return;
            };
            if len == 0 || len > MAX_MESSAGE {
                self.refuse(Refusal::Malformed, format!("a message of {len} bytes"));
                return;
            }
            if self.input.len() < 2 + len {
                return;
            }
            let msg: Vec<u8> = self.input.drain(..2 + len).skip(2).collect();
            self.handle_message(now, msg[0], &msg[1..]);
        }
    }

    /// The peer closed the connection.
    pub fn handle_closed(&mut self) {
        if self.end.is_none() {
            self.finish(Err(PairError::Closed));
        }
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.end.is_none() && now >= self.deadline {
            self.finish(Err(PairError::TimedOut));
        }
    }

    /// When [`Exchange::handle_timeout`] is due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.end.is_none().then_some(self.deadline)
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    /// How the exchange ended, once it has (send what [`Exchange::poll_transmit`] still
    /// gives, then close).
    pub fn end(&self) -> Option<&Result<Peer, PairError>> {
        self.end.as_ref()
    }

    fn send(&mut self, kind: Kind, body: &[u8]) {
        let mut m = Vec::with_capacity(3 + body.len());
        m.extend_from_slice(&((body.len() + 1) as u16).to_be_bytes());
        m.push(kind as u8);
        m.extend_from_slice(body);
        self.out.push_back(m);
    }

    fn finish(&mut self, end: Result<Peer, PairError>) {
        self.state = State::Done;
        self.spake = None;
        self.end = Some(end);
    }

    /// Ends the exchange, telling the peer why if this is the offering side.
    fn refuse(&mut self, why: Refusal, detail: String) {
        if self.role == Role::Offer {
            let left = u8::try_from(self.left_if_wrong).unwrap_or(u8::MAX);
            self.send(Kind::Refused, &[why as u8, left]);
        }
        let err = match why {
            Refusal::WrongCode if self.left_if_wrong == 0 => PairError::Void,
            Refusal::WrongCode => PairError::WrongCode(self.left_if_wrong),
            Refusal::Expired => PairError::Expired,
            Refusal::Void => PairError::Void,
            Refusal::Malformed => PairError::Malformed(detail),
            Refusal::BadSignature => PairError::BadSignature(detail),
            Refusal::SelfPair => PairError::SelfPair(detail),
        };
        self.finish(Err(err));
    }

    fn handle_message(&mut self, now: Instant, kind: u8, body: &[u8]) {
        let state = std::mem::replace(&mut self.state, State::Done);
        match (self.role, kind, state) {
            (Role::Join, k, _) if k == Kind::Refused as u8 => {
                let err = match body.first().copied().and_then(Refusal::from_u8) {
                    Some(Refusal::WrongCode) if body.get(1) == Some(&0) => PairError::LastTry,
                    Some(Refusal::WrongCode) => {
                        PairError::WrongCode(u32::from(body.get(1).copied().unwrap_or(0)))
                    }
                    Some(Refusal::Expired) => PairError::Expired,
                    Some(Refusal::Void) => PairError::Void,
                    Some(Refusal::BadSignature) => PairError::BadSignature(
                        "the other side could not check this install's signature".into(),
                    ),
                    Some(Refusal::SelfPair) => PairError::SelfPair(self.me.id.fingerprint()),
                    Some(Refusal::Malformed) | None => PairError::Malformed(
                        "the other side could not read what this side sent (another ndd version?)"
                            .into(),
                    ),
                };
                self.finish(Err(err));
            }
            (Role::Offer, k, State::Start) if k == Kind::Hello as u8 => {
                let Some(theirs) = body
                    .strip_prefix(MAGIC)
                    .and_then(|b| b.split_first())
                    .filter(|(v, rest)| **v == VERSION && rest.len() == SPAKE_MSG_LEN)
                    .map(|(_, rest)| rest)
                else {
                    self.refuse(Refusal::Malformed, "not a pairing hello".into());
                    return;
                };
                if let Some(over) = self.over.take() {
                    let why = if over == PairError::Void {
                        Refusal::Void
                    } else {
                        Refusal::Expired
                    };
                    self.send(Kind::Refused, &[why as u8, 0]);
                    self.finish(Err(over));
                    return;
                }
                self.hello = body.to_vec();
                // The Proof comes right after the Reply.
                self.deadline = now + STEP_WAIT;
                let mine = self.mine.clone();
                self.send(Kind::Reply, &mine);
                self.agree(theirs, &mine);
            }
            (Role::Join, k, State::Start) if k == Kind::Reply as u8 => {
                if body.len() != SPAKE_MSG_LEN {
                    self.finish(Err(PairError::Malformed(format!(
                        "an answer of {} bytes",
                        body.len()
                    ))));
                    return;
                }
                self.agree(body, body);
                if let State::Agreed { keys } = &self.state {
                    let (key, transcript) = (keys.join.clone(), keys.transcript);
                    match self.proof(&key, &transcript) {
                        Ok(p) => self.send(Kind::Proof, &p),
                        Err(e) => self.finish(Err(e)),
                    }
                }
            }
            (_, k, State::Agreed { keys }) if k == Kind::Proof as u8 => {
                let theirs = match self.role {
                    Role::Offer => &keys.join,
                    Role::Join => &keys.offer,
                };
                let Some((note, mac)) = split_proof(body) else {
                    self.refuse(Refusal::Malformed, "a proof that does not parse".into());
                    return;
                };
                let mut signed = keys.transcript.to_vec();
                signed.extend_from_slice(note);
                if hmac::verify(theirs, &signed, mac).is_err() {
                    match self.role {
                        Role::Offer => self.refuse(Refusal::WrongCode, String::new()),
                        Role::Join => self.finish(Err(PairError::Impostor)),
                    }
                    return;
                }
                let peer_role = match self.role {
                    Role::Offer => Role::Join,
                    Role::Join => Role::Offer,
                };
                let peer =
                    match crate::seal::open_note(note, &note_label(peer_role, &keys.transcript)) {
                        Ok((name, fingerprint)) => Peer {
                            fingerprint,
                            name: name.iter().take(64).copied().collect(),
                        },
                        Err(e) => {
                            self.refuse(Refusal::BadSignature, e.to_string());
                            return;
                        }
                    };
                if peer.fingerprint == self.me.id.fingerprint() {
                    self.refuse(Refusal::SelfPair, peer.fingerprint);
                    return;
                }
                if self.role == Role::Offer {
                    let (key, transcript) = (keys.offer.clone(), keys.transcript);
                    match self.proof(&key, &transcript) {
                        Ok(p) => self.send(Kind::Proof, &p),
                        Err(e) => {
                            self.finish(Err(e));
                            return;
                        }
                    }
                }
                self.finish(Ok(peer));
            }
            (_, k, _) => {
                let what = match k {
                    1 => "a hello",
                    2 => "an answer",
                    3 => "a proof",
                    4 => "a refusal",
                    _ => "an unknown message",
                };
                self.refuse(Refusal::Malformed, format!("{what} out of turn"));
            }
        }
    }

    /// Finishes SPAKE2 with the peer's message; `reply` is the Reply's body.
    fn agree(&mut self, theirs: &[u8], reply: &[u8]) {
        let Some(spake) = self.spake.take() else {
            return;
        };
        let key = match spake.finish(theirs) {
            Ok(k) => k,
            Err(e) => {
                self.refuse(
                    Refusal::Malformed,
                    format!("a key-exchange message that does not check ({e:?})"),
                );
                return;
            }
        };
        let mut t = ring::digest::Context::new(&ring::digest::SHA256);
        t.update(&(self.hello.len() as u16).to_be_bytes());
        t.update(&self.hello);
        t.update(reply);
        let mut transcript = [0u8; 32];
        transcript.copy_from_slice(t.finish().as_ref());
        let prk = hmac::Key::new(hmac::HMAC_SHA256, &key);
        let derive = |what: &[u8]| {
            let mut info = what.to_vec();
            info.extend_from_slice(&transcript);
            hmac::Key::new(hmac::HMAC_SHA256, hmac::sign(&prk, &info).as_ref())
        };
        self.state = State::Agreed {
            keys: Box::new(Keys {
                join: derive(b"ndd pair v1 proof of the joining side"),
                offer: derive(b"ndd pair v1 proof of the offering side"),
                transcript,
            }),
        };
    }

    /// This side's proof: its signed note (its name) and a MAC of transcript ‖ note.
    fn proof(&self, key: &hmac::Key, transcript: &[u8; 32]) -> Result<Vec<u8>, PairError> {
        let note = self
            .me
            .id
            .sign_note(&note_label(self.role, transcript), self.me.name.as_bytes())
            .map_err(|e| PairError::Sign(e.to_string()))?;
        let mut signed = transcript.to_vec();
        signed.extend_from_slice(&note);
        let mac = hmac::sign(key, &signed);
        let mut p = Vec::with_capacity(2 + note.len() + MAC_LEN);
        p.extend_from_slice(&(note.len() as u16).to_be_bytes());
        p.extend_from_slice(&note);
        p.extend_from_slice(mac.as_ref());
        Ok(p)
    }
}

/// What a side's note is signed under: the kind, its role and the transcript.
fn note_label(role: Role, transcript: &[u8; 32]) -> Vec<u8> {
    let mut l = match role {
        Role::Join => b"ndd pair v1 note of the joining side ".to_vec(),
        Role::Offer => b"ndd pair v1 note of the offering side ".to_vec(),
    };
    l.extend_from_slice(transcript);
    l
}

fn split_proof(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = usize::from(u16::from_be_bytes([*body.first()?, *body.get(1)?]));
    let rest = body.get(2..)?;
    (rest.len() == len + MAC_LEN).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::LocalIdentity;
    use rand_chacha::rand_core::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn signer(name: &str) -> Signer {
        let d = std::env::temp_dir().join(format!("ndd-pair-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let (id, _) = crate::Identity::load_or_create(&d).unwrap();
        Signer {
            id: LocalIdentity::new(&id).unwrap(),
            name: name.into(),
        }
    }

    fn rng(seed: u64) -> ChaCha20Rng {
        ChaCha20Rng::seed_from_u64(seed)
    }

    /// Runs two exchanges against each other, delivering bytes in pieces of `chunk`.
    fn relay(a: &mut Exchange, b: &mut Exchange, now: Instant, chunk: usize) {
        for _ in 0..20 {
            let mut moved = false;
            for flip in [false, true] {
                let (from, to) = if flip {
                    (&mut *b, &mut *a)
                } else {
                    (&mut *a, &mut *b)
                };
                while let Some(m) = from.poll_transmit() {
                    for piece in m.chunks(chunk) {
                        to.handle_data(now, piece);
                    }
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
    }

    #[test]
    fn the_right_code_pairs_both_sides_with_each_others_identity() {
        let (alice, bob) = (signer("alice"), signer("bob"));
        let t0 = Instant::now();
        let code = new_code();
        assert_eq!(code.len(), CODE_DIGITS + 1);
        let offer = Offer::new(&code, t0).unwrap();
        for chunk in [1, 3, 4096] {
            let mut o = offer.exchange(t0, alice.clone(), rng(1));
            // Typed with spaces instead of the dash.
            let mut j = Exchange::join(&code.replace('-', " "), t0, bob.clone(), rng(2)).unwrap();
            relay(&mut j, &mut o, t0, chunk);
            let po = o.end().unwrap().clone().unwrap();
            let pj = j.end().unwrap().clone().unwrap();
            assert_eq!(po.fingerprint, bob.id.fingerprint());
            assert_eq!(po.name, b"bob");
            assert_eq!(pj.fingerprint, alice.id.fingerprint());
            assert_eq!(pj.name, b"alice");
        }
    }

    #[test]
    fn a_wrong_code_takes_a_try_and_the_third_voids_the_offer() {
        let (alice, bob) = (signer("alice2"), signer("bob2"));
        let t0 = Instant::now();
        let mut offer = Offer::new("1234-5678", t0).unwrap();
        for (i, left) in [(0, 2u32), (1, 1)] {
            let mut o = offer.exchange(t0, alice.clone(), rng(10 + i));
            let mut j = Exchange::join("1234-5679", t0, bob.clone(), rng(20 + i)).unwrap();
            relay(&mut j, &mut o, t0, 7);
            assert_eq!(o.end(), Some(&Err(PairError::WrongCode(left))));
            assert_eq!(j.end(), Some(&Err(PairError::WrongCode(left))));
            assert!(j
                .end()
                .unwrap()
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains(&format!("{left} tr")));
            offer.handle_end(o.end().unwrap());
            assert_eq!(offer.tries_left(), left);
        }
        let mut o = offer.exchange(t0, alice.clone(), rng(30));
        let mut j = Exchange::join("0000-0000", t0, bob.clone(), rng(31)).unwrap();
        relay(&mut j, &mut o, t0, 7);
        assert_eq!(o.end(), Some(&Err(PairError::Void)));
        assert_eq!(j.end(), Some(&Err(PairError::LastTry)));
        offer.handle_end(o.end().unwrap());
        assert_eq!(offer.check(t0), Err(PairError::Void));
        // Even the right code is refused now, and nothing keyed goes out.
        let mut o = offer.exchange(t0, alice, rng(40));
        let mut j = Exchange::join("1234-5678", t0, bob, rng(41)).unwrap();
        relay(&mut j, &mut o, t0, 7);
        assert_eq!(o.end(), Some(&Err(PairError::Void)));
        assert_eq!(j.end(), Some(&Err(PairError::Void)));
    }

    #[test]
    fn an_expired_code_is_refused_and_a_silent_peer_times_out() {
        let (alice, bob) = (signer("alice3"), signer("bob3"));
        let t0 = Instant::now();
        let offer = Offer::new("12345678", t0).unwrap();
        let late = t0 + CODE_LIFETIME;
        let mut o = offer.exchange(late, alice.clone(), rng(1));
        let mut j = Exchange::join("1234-5678", late, bob.clone(), rng(2)).unwrap();
        relay(&mut j, &mut o, late, 100);
        assert_eq!(j.end(), Some(&Err(PairError::Expired)));
        let mut o = offer.exchange(t0, alice, rng(3));
        // A connection that says nothing holds the offer 3 s, not the exchange's 10.
        assert_eq!(o.poll_timeout(), Some(t0 + STEP_WAIT));
        o.handle_timeout(t0 + STEP_WAIT);
        assert_eq!(o.end(), Some(&Err(PairError::TimedOut)));
        let mut j = Exchange::join("1234-5678", t0, bob, rng(4)).unwrap();
        j.handle_closed();
        assert_eq!(j.end(), Some(&Err(PairError::Closed)));
    }

    #[test]
    fn codes_that_are_not_codes_are_refused_with_what_was_typed_escaped() {
        for bad in ["123", "1234-567x", "12345678901", "\u{1b}[2J1234"] {
            let e = parse_code(bad).unwrap_err().to_string();
            assert!(e.contains("8 digits"), "{e}");
            assert!(!e.contains('\u{1b}'), "{e}");
        }
        assert_eq!(parse_code(" 1234 - 5678 ").unwrap(), "12345678");
    }

    #[test]
    fn an_impostor_without_the_code_is_found_out_by_the_joining_side() {
        let (alice, bob, mallory) = (signer("alice4"), signer("bob4"), signer("mallory4"));
        let t0 = Instant::now();
        // Mallory answers at Alice's address with a code of her own: Bob's proof goes to her,
        // hers does not check for Bob.
        let fake = Offer::new("1111-1111", t0).unwrap();
        let mut m = fake.exchange(t0, mallory, rng(5));
        let mut j = Exchange::join("2222-2222", t0, bob.clone(), rng(6)).unwrap();
        relay(&mut j, &mut m, t0, 50);
        assert!(matches!(m.end(), Some(Err(PairError::WrongCode(_)))));
        assert!(matches!(j.end(), Some(Err(PairError::WrongCode(_)))));
        // Mallory relays Bob's bytes to Alice but swaps in her own proof: its MAC needs the key.
        let real = Offer::new("2222-2222", t0).unwrap();
        let mut o = real.exchange(t0, alice, rng(7));
        let mut j = Exchange::join("2222-2222", t0, bob, rng(8)).unwrap();
        let hello = j.poll_transmit().unwrap();
        o.handle_data(t0, &hello);
        let reply = o.poll_transmit().unwrap();
        j.handle_data(t0, &reply);
        let mut proof = j.poll_transmit().unwrap();
        let n = proof.len();
        proof[n - 1] ^= 1;
        o.handle_data(t0, &proof);
        assert!(matches!(o.end(), Some(Err(PairError::WrongCode(_)))));
    }

    #[test]
    fn garbage_messages_out_of_turn_and_oversized_ones_end_the_exchange_with_a_reason() {
        let alice = signer("alice5");
        let t0 = Instant::now();
        let offer = Offer::new("1234-5678", t0).unwrap();
        for (bytes, want) in [
            (vec![0u8, 0], "a message of 0 bytes"),
            (vec![0xff, 0xff], "a message of 65535 bytes"),
            (vec![0, 2, 3, 0], "a proof out of turn"),
            (vec![0, 3, 1, b'x', b'y'], "not a pairing hello"),
            (vec![0, 1, 9], "an unknown message out of turn"),
        ] {
            let mut o = offer.exchange(t0, alice.clone(), rng(1));
            o.handle_data(t0, &bytes);
            match o.end() {
                Some(Err(PairError::Malformed(m))) => assert!(m.contains(want), "{m}"),
                e => panic!("{e:?}"),
            }
            // The joining side is told the offering side could not read it.
            assert_eq!(o.poll_transmit().unwrap()[2], Kind::Refused as u8);
        }
    }
}
