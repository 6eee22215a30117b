//! The join handshake of the NATS link (sans-IO): how an app side proves who it is to the
//! device through an untrusted broker and receives the driver's group key.
//!
//! It is the sealed UDP link's key exchange ([`crate::seal`]) carried as two NATS
//! request/reply rounds on `P.D.join`:
//!
//! ```text
//! app side                                              device side
//!   JOIN-INIT   seal INIT                          ──►
//!                                                  ◄──  JOIN-REPLY  seal REPLY (device's
//!                                                        identity, signed transcript)
//!   (checks the device's fingerprint: known_peers)
//!   JOIN-FINISH seal FINISH, sealed HELLO          ──►
//!                                                        (checks the app's fingerprint and
//!                                                         its HELLO against its own)
//!                                                  ◄──  JOIN-WELCOME sealed: group key,
//!                                                        slot, run id — or a refusal
//! ```
//!
//! Every message starts with `"NJ"`, the version ([`VERSION`]) and a type byte (1 INIT,
//! 2 REPLY, 3 FINISH, 4 WELCOME). FINISH: `u16 length ‖ seal FINISH ‖ seal DATA(HELLO
//! message)`. WELCOME: seal DATA of `0 ‖ group key (32) ‖ slot (u16, 0xFFFF: none) ‖ run id
//! (u64) ‖ run began (u64) ‖ key since (u64) ‖ previous key (32, zeros: none) ‖ older key
//! (32, zeros: none) ‖ older since (u64) ‖ 8 × (earlier run id (u64, 0: none) ‖ its began
//! (u64)) ‖ 6 × (retired key (32, zeros: none) ‖ where its rotation began (u64))` when
//! admitted (run began: the JetStream stream
//! sequence the device's run began after, [`super::runs::Run`]; key since: the device's
//! JetStream stream sequence when a rotation drew this key, 0 for a key no rotation drew;
//! previous key: the key before that rotation; older key and since: the key before the
//! previous one and where the rotation that retired it began; earlier runs: the device's runs
//! before this one, newest first), or
//! `1 ‖ close code (u16) ‖ reason (UTF-8)` when refused. All integers big-endian.
//!
//! The pairwise keys protect only the HELLO and the WELCOME; the frames then travel under
//! the group key, which only admitted app sides hold.

use crate::seal::{Initiator, Keys, LocalIdentity, Responder, SealError, Sealed};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// First bytes of every join message.
pub const MAGIC: [u8; 2] = *b"NJ";
/// Format version.
/// Version 2: the WELCOME names the run's start (frames are sealed under run keys).
/// Version 3: every frame is sealed bound to its record's subject sequence
/// ([`super::record`]: a side of version 2 opens none).
/// Version 4: the WELCOME names the key before the last rotation.
/// Version 5: … and the one before that, with where its rotation began.
/// Version 6: … and the device's runs before the current one, with where each began.
/// Version 7: … and the keys retired before the older one, with where each was retired;
/// eight earlier runs (not three).
/// Version 8: the app side's ready heartbeat carries its process and the beat's number
/// ([`super::admit::Ready`]; a version 7 device takes none of them).
pub const VERSION: u8 = 8;
/// Bytes of the group key.
pub const GROUP_KEY_LEN: usize = 32;
/// Slot value meaning "no slot" (modes other than split).
pub const NO_SLOT: u16 = 0xFFFF;
/// Exchanges the device keeps open between INIT and FINISH, at most.
pub const MAX_PENDING: usize = 256;

const INIT: u8 = 1;
const REPLY: u8 = 2;
const FINISH: u8 = 3;
const WELCOME: u8 = 4;

/// What went wrong in a join.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    /// Not a join message of ours.
    #[error("not an ndd join message ({0})")]
    NotJoin(&'static str),
    /// Another version.
    #[error("join message version {0}, this side speaks version {VERSION}")]
    Version(u8),
    /// The key exchange failed.
    #[error("key exchange: {0}")]
    Seal(#[from] SealError),
    /// A FINISH for an exchange the device no longer (or never) had.
    #[error("join FINISH for an unknown or expired exchange")]
    Expired,
    /// A WELCOME whose record does not parse.
    #[error("malformed WELCOME from the device")]
    BadWelcome,
}

fn head(ty: u8) -> Vec<u8> {
    vec![MAGIC[0], MAGIC[1], VERSION, ty]
}

fn body(msg: &[u8], ty: u8) -> Result<&[u8], JoinError> {
    let h = msg.get(..4).ok_or(JoinError::NotJoin("too short"))?;
    if h[..2] != MAGIC {
        return Err(JoinError::NotJoin("bad magic"));
    }
    if h[2] != VERSION {
        return Err(JoinError::Version(h[2]));
    }
    if h[3] != ty {
        return Err(JoinError::NotJoin("unexpected type"));
    }
    Ok(&msg[4..])
}

/// The message type of a join message (1 INIT, 3 FINISH are what the device receives).
pub fn message_type(msg: &[u8]) -> Option<u8> {
    (msg.len() >= 4 && msg[..2] == MAGIC).then(|| msg[3])
}

/// What the device gives an admitted app side.
#[derive(Clone, PartialEq, Eq)]
pub struct Admission {
    /// The group key every frame is encrypted under.
    pub group_key: [u8; GROUP_KEY_LEN],
    /// Its split slot, if the driver splits frames.
    pub slot: Option<u16>,
    /// The device run's id (a new one after a device restart).
    pub run: u64,
    /// The JetStream stream sequence that run began after.
    pub run_began: u64,
    /// The device's JetStream stream sequence when a rotation drew this group key (0: no
    /// rotation did). App → device frames sealed under the key before it and stored after
    /// this sequence are refused by the device; their sender publishes them again under
    /// this key.
    pub key_since: u64,
    /// The key before that rotation (`None`: no rotation did): device frames under it stored
    /// up to `key_since` still open on the app side (it may not have read them yet). The
    /// device's own, not whatever key the app side held: one that missed a rotation must not
    /// take the key two rotations back for it.
    pub previous_key: Option<[u8; GROUP_KEY_LEN]>,
    /// The key before `previous_key`, and where the rotation that retired it began: an app
    /// side that missed a rotation (or saw two as one) still opens the device frames under
    /// it stored up to there, and knows which of its own to publish again.
    pub older: Option<([u8; GROUP_KEY_LEN], u64)>,
    /// The device's runs before `run`, newest first ([`super::keys::GroupKey::earlier`]).
    pub earlier: [Option<super::runs::Run>; super::keys::EARLIER_RUNS],
    /// The keys retired before `older` ([`super::keys::GroupKey::retired`]).
    pub retired: [Option<([u8; GROUP_KEY_LEN], u64)>; super::keys::RETIRED_KEYS],
}

/// Bytes of an admitted WELCOME after its first byte.
const ADMITTED_LEN: usize = 3 * GROUP_KEY_LEN
    + 34
    + super::keys::EARLIER_RUNS * 16
    + super::keys::RETIRED_KEYS * (GROUP_KEY_LEN + 8);

impl Admission {
    /// What a device side holding `keys` hands an app side in `slot`.
    pub fn of(keys: &super::keys::GroupKey, slot: Option<u16>) -> Admission {
        Admission {
            group_key: keys.key,
            slot,
            run: keys.run.id,
            run_began: keys.run.began,
            key_since: keys.since,
            previous_key: keys.previous,
            older: keys.older,
            earlier: keys.earlier,
            retired: keys.retired,
        }
    }

    /// The keys it hands over.
    pub fn keys(&self) -> super::keys::GroupKey {
        super::keys::GroupKey {
            key: self.group_key,
            since: self.key_since,
            previous: self.previous_key,
            older: self.older,
            retired: self.retired,
            run: self.device_run(),
            earlier: self.earlier,
        }
    }

    /// The device run it names.
    pub fn device_run(&self) -> super::runs::Run {
        super::runs::Run {
            id: self.run,
            began: self.run_began,
        }
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("slot", &self.slot)
            .field("run", &self.run)
            .field("run_began", &self.run_began)
            .field("key_since", &self.key_since)
            .finish_non_exhaustive()
    }
}

/// The keys a device side hands an admitted app side, in the order that keeps its holders
/// file true (the file a revocation reads to know whether a rotation is needed): the keys are
/// taken as they stand when the app side is admitted, with no rotation under way
/// ([`HandOut::take`]); the app side is noted as a holder; then the answer carries the keys
/// taken ([`HandOut::noted`]), never keys read after the note. A rotation that begins in
/// between empties the holders file after the note (`Home::rotated`): the side holds the old
/// key, which it must join again to replace, and is noted then. Before, the device read the
/// keys after the note, so a rotation that began there handed the side the new key while
/// emptying the file of its name, and a later `ndd untrust` of that side rotated nothing (found
/// by a review; `testkit/tests/nats_keys.rs` interleaves a join's answer with a rotation's
/// files since).
#[derive(Debug, Clone)]
pub struct HandOut {
    keys: super::keys::GroupKey,
    slot: Option<u16>,
}

impl HandOut {
    /// The keys as they stand as an app side is admitted to `slot`: `None` while a rotation
    /// is under way (its `since` pending: the answer waits for the rotation to complete).
    pub fn take(keys: super::keys::GroupKey, slot: Option<u16>) -> Option<HandOut> {
        (keys.since != super::keys::SINCE_PENDING).then_some(HandOut { keys, slot })
    }

    /// The answer once the app side was noted as a holder of the key (`Err`: it could not be,
    /// why): the keys taken, or a refusal (a holder the device cannot note would be out of
    /// reach of a revocation).
    pub fn noted(self, noted: Result<(), String>) -> Welcome {
        match noted {
            Ok(()) => Welcome::Admitted(Box::new(Admission::of(&self.keys, self.slot))),
            Err(e) => Welcome::Refused {
                code: ndd_wire::CloseCode::InternalError.to_u16(),
                reason: format!("the device side cannot note who holds its group key: {e}"),
            },
        }
    }
}

/// How a join ended for the app side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Welcome {
    /// Admitted.
    Admitted(Box<Admission>),
    /// Refused, with the device's close code and reason.
    Refused {
        /// `ndd_wire::CloseCode` value.
        code: u16,
        /// Why.
        reason: String,
    },
}

impl Welcome {
    fn encode(&self) -> Vec<u8> {
        match self {
            Welcome::Admitted(a) => {
                let mut v = vec![0u8];
                v.extend_from_slice(&a.group_key);
                v.extend_from_slice(&a.slot.unwrap_or(NO_SLOT).to_be_bytes());
                v.extend_from_slice(&a.run.to_be_bytes());
                v.extend_from_slice(&a.run_began.to_be_bytes());
                v.extend_from_slice(&a.key_since.to_be_bytes());
                v.extend_from_slice(&a.previous_key.unwrap_or([0; GROUP_KEY_LEN]));
                let (older, older_since) = a.older.unwrap_or(([0; GROUP_KEY_LEN], 0));
                v.extend_from_slice(&older);
                v.extend_from_slice(&older_since.to_be_bytes());
                for r in a.earlier {
                    let r = r.unwrap_or(super::runs::Run { id: 0, began: 0 });
                    v.extend_from_slice(&r.id.to_be_bytes());
                    v.extend_from_slice(&r.began.to_be_bytes());
                }
                for r in a.retired {
                    let (key, since) = r.unwrap_or(([0; GROUP_KEY_LEN], 0));
                    v.extend_from_slice(&key);
                    v.extend_from_slice(&since.to_be_bytes());
                }
                v
            }
            Welcome::Refused { code, reason } => {
                let mut v = vec![1u8];
                v.extend_from_slice(&code.to_be_bytes());
                v.extend_from_slice(reason.as_bytes());
                v
            }
        }
    }

    fn parse(b: &[u8]) -> Result<Welcome, JoinError> {
        match b.split_first() {
            Some((0, rest)) if rest.len() == ADMITTED_LEN => {
                let mut group_key = [0u8; GROUP_KEY_LEN];
                group_key.copy_from_slice(&rest[..GROUP_KEY_LEN]);
                let slot = u16::from_be_bytes([rest[32], rest[33]]);
                let mut run = [0u8; 8];
                run.copy_from_slice(&rest[34..42]);
                let mut began = [0u8; 8];
                began.copy_from_slice(&rest[42..50]);
                let mut since = [0u8; 8];
                since.copy_from_slice(&rest[50..58]);
                let mut previous = [0u8; GROUP_KEY_LEN];
                previous.copy_from_slice(&rest[58..58 + GROUP_KEY_LEN]);
                let mut older = [0u8; GROUP_KEY_LEN];
                older.copy_from_slice(&rest[90..90 + GROUP_KEY_LEN]);
                let mut older_since = [0u8; 8];
                older_since.copy_from_slice(&rest[122..130]);
                let mut earlier = [None; super::keys::EARLIER_RUNS];
                for (i, e) in earlier.iter_mut().enumerate() {
                    let at = 130 + 16 * i;
                    let mut id = [0u8; 8];
                    id.copy_from_slice(&rest[at..at + 8]);
                    let mut began = [0u8; 8];
                    began.copy_from_slice(&rest[at + 8..at + 16]);
                    let id = u64::from_be_bytes(id);
                    *e = (id != 0).then_some(super::runs::Run {
                        id,
                        began: u64::from_be_bytes(began),
                    });
                }
                let u64_at = |at: usize| {
                    let mut n = [0u8; 8];
                    n.copy_from_slice(&rest[at..at + 8]);
                    u64::from_be_bytes(n)
                };
                let mut retired = [None; super::keys::RETIRED_KEYS];
                for (i, r) in retired.iter_mut().enumerate() {
                    let at = 130 + 16 * super::keys::EARLIER_RUNS + (GROUP_KEY_LEN + 8) * i;
                    let mut key = [0u8; GROUP_KEY_LEN];
                    key.copy_from_slice(&rest[at..at + GROUP_KEY_LEN]);
                    *r = (key != [0; GROUP_KEY_LEN]).then_some((key, u64_at(at + GROUP_KEY_LEN)));
                }
                Ok(Welcome::Admitted(Box::new(Admission {
                    group_key,
                    slot: (slot != NO_SLOT).then_some(slot),
                    run: u64::from_be_bytes(run),
                    run_began: u64::from_be_bytes(began),
                    key_since: u64::from_be_bytes(since),
                    previous_key: (previous != [0; GROUP_KEY_LEN]).then_some(previous),
                    older: (older != [0; GROUP_KEY_LEN])
                        .then_some((older, u64::from_be_bytes(older_since))),
                    earlier,
                    retired,
                })))
            }
            Some((1, rest)) if rest.len() >= 2 => Ok(Welcome::Refused {
                code: u16::from_be_bytes([rest[0], rest[1]]),
                reason: ndd_wire::text::printable_bytes(&rest[2..], ndd_wire::text::MAX_REASON),
            }),
            _ => Err(JoinError::BadWelcome),
        }
    }
}

/// The app side's join.
#[derive(Debug)]
pub struct Joiner {
    init: Initiator,
    keys: Option<Keys>,
}

impl Joiner {
    /// A fresh exchange.
    pub fn new() -> Result<Joiner, JoinError> {
        Ok(Joiner {
            init: Initiator::new()?,
            keys: None,
        })
    }

    /// JOIN-INIT, the first request.
    pub fn init(&self) -> Vec<u8> {
        let mut m = head(INIT);
        m.extend_from_slice(self.init.init());
        m
    }

    /// Takes JOIN-REPLY: gives the device's fingerprint (for the caller to check against
    /// `known_peers` before going on) and JOIN-FINISH carrying our `hello` (an encoded HELLO
    /// message), sealed.
    pub fn handle_reply(
        &mut self,
        me: &LocalIdentity,
        reply: &[u8],
        hello: &[u8],
    ) -> Result<(String, Vec<u8>), JoinError> {
        self.handle_reply_from(me, reply, hello, |_| true)
    }

    /// [`Joiner::handle_reply`], taking only a REPLY signed by an identity `trusted` accepts
    /// (another is `SealError::Untrusted` and changes nothing: anyone who may publish can
    /// answer a join).
    pub fn handle_reply_from(
        &mut self,
        me: &LocalIdentity,
        reply: &[u8],
        hello: &[u8],
        trusted: impl Fn(&str) -> bool,
    ) -> Result<(String, Vec<u8>), JoinError> {
        let reply = body(reply, REPLY)?;
        let keys = self.init.handle_reply_from(me, reply, trusted)?;
        let finish = self.init.finish().ok_or(JoinError::Expired)?;
        let sealed = keys.tx.seal(hello)?;
        let mut m = head(FINISH);
        m.extend_from_slice(&(finish.len() as u16).to_be_bytes());
        m.extend_from_slice(finish);
        m.extend_from_slice(&sealed);
        let fp = keys.peer_fingerprint.clone();
        self.keys = Some(keys);
        Ok((fp, m))
    }

    /// Takes JOIN-WELCOME.
    pub fn handle_welcome(&mut self, msg: &[u8]) -> Result<Welcome, JoinError> {
        let sealed = body(msg, WELCOME)?;
        let keys = self.keys.as_mut().ok_or(JoinError::Expired)?;
        let mut d = sealed.to_vec();
        let range = keys.rx.open(&mut d)?;
        Welcome::parse(&d[range])
    }
}

/// What the device learns from a JOIN-FINISH; answer it with [`Finished::welcome`].
#[derive(Debug)]
pub struct Finished {
    keys: Keys,
    /// The app side's fingerprint (check it against `known_peers`).
    pub peer_fingerprint: String,
    /// Its HELLO message, as sent.
    pub hello: Vec<u8>,
}

impl Finished {
    /// JOIN-WELCOME carrying `welcome`, sealed for this app side only.
    pub fn welcome(&self, welcome: &Welcome) -> Result<Vec<u8>, JoinError> {
        let mut m = head(WELCOME);
        m.extend_from_slice(&self.keys.tx.seal(&welcome.encode())?);
        Ok(m)
    }
}

/// The device side's joins in progress.
#[derive(Debug)]
pub struct Host {
    pending: HashMap<u32, (Responder, Instant)>,
    expiry: Duration,
}

impl Host {
    /// Exchanges not finished within `expiry` are forgotten.
    pub fn new(expiry: Duration) -> Host {
        Host {
            pending: HashMap::new(),
            expiry,
        }
    }

    /// Exchanges waiting for their FINISH.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Takes JOIN-INIT; gives JOIN-REPLY. The oldest exchange is forgotten when
    /// [`MAX_PENDING`] are open.
    pub fn handle_init(
        &mut self,
        now: Instant,
        me: &LocalIdentity,
        msg: &[u8],
    ) -> Result<Vec<u8>, JoinError> {
        let init = body(msg, INIT)?;
        self.expire(now);
        if self.pending.len() >= MAX_PENDING {
            if let Some(oldest) = self
                .pending
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(i, _)| *i)
            {
                self.pending.remove(&oldest);
            }
        }
        let r = Responder::new(me, init)?;
        let mut m = head(REPLY);
        m.extend_from_slice(r.reply());
        self.pending.insert(r.index(), (r, now));
        Ok(m)
    }

    /// Takes JOIN-FINISH: checks the app side's signature, opens its HELLO.
    pub fn handle_finish(&mut self, now: Instant, msg: &[u8]) -> Result<Finished, JoinError> {
        let b = body(msg, FINISH)?;
        self.expire(now);
        let len = b
            .get(..2)
            .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
            .ok_or(JoinError::NotJoin("short FINISH"))?;
        let finish = b
            .get(2..2 + len)
            .ok_or(JoinError::NotJoin("short FINISH"))?;
        let Sealed::Finish { responder, .. } = Sealed::parse(finish)? else {
            return Err(JoinError::NotJoin("FINISH expected"));
        };
        let (r, _) = self.pending.remove(&responder).ok_or(JoinError::Expired)?;
        let mut keys = r.handle_finish(finish)?;
        let mut hello = b[2 + len..].to_vec();
        let range = keys.rx.open(&mut hello)?;
        Ok(Finished {
            peer_fingerprint: keys.peer_fingerprint.clone(),
            hello: hello[range].to_vec(),
            keys,
        })
    }

    fn expire(&mut self, now: Instant) {
        let expiry = self.expiry;
        self.pending
            .retain(|_, (_, t)| now.saturating_duration_since(*t) < expiry);
    }
}

/// How long an app side waits after its first failed join.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// How often an app side says that only untrusted device sides answer (with the `ndd trust`
/// line: what the user must do).
pub const UNTRUSTED_EVERY: Duration = Duration::from_secs(30);

/// What a failed join leads to ([`JoinRetry::handle_failure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Try again after `after`, first saying `say` (if any).
    Again {
        /// The wait.
        after: Duration,
        /// What to tell the user first.
        say: Option<Say>,
    },
    /// Stop: no device side (`untrusted`: none this side trusts) answered within `within`.
    GiveUp {
        /// Only device sides this side does not trust answered.
        untrusted: bool,
        /// The time it was given.
        within: Duration,
    },
}

/// A line a failed join has the driver say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Say {
    /// Waiting for the device side (once, at info level; nothing when quiet).
    Waiting,
    /// Only untrusted device sides answer: the `ndd trust` line (at once, then every
    /// [`UNTRUSTED_EVERY`]; never quiet).
    Untrusted,
}

/// An app side's first join, tried again while no device side it trusts answers (sans-IO):
/// the backoff (from [`FIRST_RETRY`], doubling up to the configured most), what is said
/// meanwhile, and when to give up (only with `--once`, after the connect timeout). A refusal
/// or an admission ends it in the driver. `drive/join.rs` drives it.
#[derive(Debug)]
pub struct JoinRetry {
    started: Instant,
    give_up: Option<Duration>,
    backoff: Duration,
    max_backoff: Duration,
    said_waiting: bool,
    untrusted_said: ndd_core::RateLimit,
}

impl JoinRetry {
    /// Retries from `now`, giving up after `give_up` (none: never), waiting at most
    /// `max_backoff` (at least [`FIRST_RETRY`]) between tries.
    pub fn new(now: Instant, give_up: Option<Duration>, max_backoff: Duration) -> JoinRetry {
        JoinRetry {
            started: now,
            give_up,
            backoff: FIRST_RETRY,
            max_backoff: max_backoff.max(FIRST_RETRY),
            said_waiting: false,
            untrusted_said: ndd_core::RateLimit::new(UNTRUSTED_EVERY),
        }
    }

    /// A try failed at `now`; `untrusted`: only device sides this side does not trust
    /// answered it.
    pub fn handle_failure(&mut self, now: Instant, untrusted: bool) -> Retry {
        if let Some(within) = self.give_up {
            if now.saturating_duration_since(self.started) >= within {
                return Retry::GiveUp { untrusted, within };
            }
        }
        let say = if untrusted {
            self.untrusted_said.admit(now).map(|_| Say::Untrusted)
        } else if !self.said_waiting {
            self.said_waiting = true;
            Some(Say::Waiting)
        } else {
            None
        };
        let after = self.backoff;
        self.backoff = (self.backoff * 2).min(self.max_backoff);
        Retry::Again { after, say }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_not_taken_mid_rotation_and_a_holder_not_noted_is_refused() {
        use crate::nats::keys::{GroupKey, SINCE_PENDING};
        use crate::nats::runs::Run;
        let old = GroupKey::first([1; 32], Run { id: 3, began: 0 });
        let mut rotating = GroupKey::first([2; 32], old.run);
        rotating.since = SINCE_PENDING;
        assert!(HandOut::take(rotating, None).is_none(), "not mid-rotation");
        // (That the driver takes them before the note is `nats_keys`' to show: reading the
        // keys at the note fails it.)
        let out = HandOut::take(old, Some(1)).expect("no rotation under way");
        match out.clone().noted(Ok(())) {
            Welcome::Admitted(a) => {
                assert_eq!(a.keys(), old);
                assert_eq!(a.slot, Some(1));
            }
            w => panic!("{w:?}"),
        }
        match out.noted(Err("disk full".into())) {
            Welcome::Refused { code, reason } => {
                assert_eq!(code, ndd_wire::CloseCode::InternalError.to_u16());
                assert_eq!(
                    reason,
                    "the device side cannot note who holds its group key: disk full"
                );
            }
            w => panic!("{w:?}"),
        }
    }

    fn identity(dir: &std::path::Path) -> LocalIdentity {
        let (id, _) = crate::Identity::load_or_create(dir).unwrap();
        LocalIdentity::new(&id).unwrap()
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ndd-join-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_failed_join_waits_longer_each_time_says_why_and_gives_up_only_when_told() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = JoinRetry::new(t0, None, ms(500));
        let waits: Vec<Retry> = (0..5)
            .map(|i| r.handle_failure(t0 + ms(i), false))
            .collect();
        assert_eq!(
            waits,
            vec![
                Retry::Again {
                    after: ms(100),
                    say: Some(Say::Waiting)
                },
                Retry::Again {
                    after: ms(200),
                    say: None
                },
                Retry::Again {
                    after: ms(400),
                    say: None
                },
                Retry::Again {
                    after: ms(500),
                    say: None
                },
                Retry::Again {
                    after: ms(500),
                    say: None
                },
            ],
            "doubling up to the most, waiting said once"
        );
        // Only untrusted answers: the trust line at once, then not before 30 s, whatever
        // failed between; never a give-up without a limit.
        let t = t0 + ms(10);
        assert!(matches!(
            r.handle_failure(t, true),
            Retry::Again {
                say: Some(Say::Untrusted),
                ..
            }
        ));
        assert!(matches!(
            r.handle_failure(t + ms(1), false),
            Retry::Again { say: None, .. }
        ));
        assert!(matches!(
            r.handle_failure(t + ms(29_000), true),
            Retry::Again { say: None, .. }
        ));
        assert!(matches!(
            r.handle_failure(t + UNTRUSTED_EVERY, true),
            Retry::Again {
                say: Some(Say::Untrusted),
                ..
            }
        ));
        assert!(matches!(
            r.handle_failure(t + Duration::from_secs(3600), false),
            Retry::Again { .. }
        ));
        // With a limit (`--once`): tries until it passes, then gives up saying who answered.
        let mut r = JoinRetry::new(t0, Some(Duration::from_secs(5)), ms(50));
        assert!(matches!(
            r.handle_failure(t0 + ms(4999), true),
            Retry::Again { .. }
        ));
        assert_eq!(
            r.handle_failure(t0 + Duration::from_secs(5), true),
            Retry::GiveUp {
                untrusted: true,
                within: Duration::from_secs(5)
            }
        );
        assert_eq!(
            r.handle_failure(t0 + Duration::from_secs(6), false),
            Retry::GiveUp {
                untrusted: false,
                within: Duration::from_secs(5)
            }
        );
        // A most below the first wait is the first wait.
        let mut r = JoinRetry::new(t0, None, ms(10));
        assert!(
            matches!(r.handle_failure(t0, false), Retry::Again { after, .. } if after == ms(100))
        );
        assert!(
            matches!(r.handle_failure(t0, false), Retry::Again { after, .. } if after == ms(100))
        );
    }

    #[test]
    fn a_join_admits_with_the_group_key_and_both_learn_the_right_fingerprints() {
        let (a, d) = (tmp("a"), tmp("d"));
        let (app, dev) = (identity(&a), identity(&d));
        let now = Instant::now();
        let mut host = Host::new(Duration::from_secs(3));
        let mut j = Joiner::new().unwrap();
        let reply = host.handle_init(now, &dev, &j.init()).unwrap();
        let (dev_fp, finish) = j.handle_reply(&app, &reply, b"HELLO bytes").unwrap();
        assert_eq!(dev_fp, dev.fingerprint());
        let f = host.handle_finish(now, &finish).unwrap();
        assert_eq!(f.peer_fingerprint, app.fingerprint());
        assert_eq!(f.hello, b"HELLO bytes");
        assert_eq!(host.pending(), 0);
        let adm = Admission {
            group_key: [7; 32],
            slot: Some(2),
            run: 99,
            run_began: 77,
            key_since: 1234,
            previous_key: Some([6; 32]),
            older: Some(([5; 32], 1000)),
            earlier: [
                Some(crate::nats::runs::Run { id: 98, began: 50 }),
                Some(crate::nats::runs::Run { id: 90, began: 10 }),
                None,
                None,
                None,
                None,
                None,
                None,
            ],
            retired: [
                Some(([4; 32], 900)),
                Some(([3; 32], 800)),
                None,
                None,
                None,
                None,
            ],
        };
        let w = f
            .welcome(&Welcome::Admitted(Box::new(adm.clone())))
            .unwrap();
        assert!(
            !w.windows(32).any(|x| x == [7; 32]),
            "the group key never travels in the clear"
        );
        assert_eq!(
            j.handle_welcome(&w).unwrap(),
            Welcome::Admitted(Box::new(adm))
        );
        // A refusal reads back as sent.
        let refused = Welcome::Refused {
            code: 4,
            reason: "not trusted".into(),
        };
        let w = f.welcome(&refused).unwrap();
        assert_eq!(j.handle_welcome(&w).unwrap(), refused);
        let _ = std::fs::remove_dir_all(a);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn garbage_replays_and_expired_exchanges_are_errors_not_panics() {
        let d = tmp("g");
        let dev = identity(&d);
        let now = Instant::now();
        let mut host = Host::new(Duration::from_secs(3));
        assert!(matches!(
            host.handle_init(now, &dev, b"GET / HTTP/1.1"),
            Err(JoinError::NotJoin(_))
        ));
        assert_eq!(
            host.handle_init(now, &dev, &[b'N', b'J', 9, 1])
                .unwrap_err(),
            JoinError::Version(9)
        );
        let j = Joiner::new().unwrap();
        host.handle_init(now, &dev, &j.init()).unwrap();
        assert_eq!(host.pending(), 1);
        // Forgotten after the expiry.
        assert!(host
            .handle_finish(
                now + Duration::from_secs(4),
                &[b'N', b'J', VERSION, 3, 0, 0]
            )
            .is_err());
        assert_eq!(host.pending(), 0);
        for n in 0..64 {
            let junk: Vec<u8> = (0..n).map(|i| (i * 37) as u8).collect();
            let mut m = head(FINISH);
            m.extend_from_slice(&junk);
            let _ = host.handle_finish(now, &m);
        }
        let _ = std::fs::remove_dir_all(d);
    }
}
