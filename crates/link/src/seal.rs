//! Authenticated UDP, sans-IO: the key exchange that gives a UDP link its keys from the two
//! sides' identities, and the AEAD that then seals every datagram (as WireGuard and QUIC do).
//!
//! A UDP link that is not `--insecure` runs three messages before anything else:
//!
//! ```text
//! initiator (connects)                                  responder (listens)
//!   INIT   initiator index, ephemeral X25519 key   ──►
//!                                                  ◄──  REPLY  responder index, ephemeral key,
//!                                                        its SPKI, signature over INIT‖REPLY
//!   FINISH our SPKI, signature over INIT‖REPLY‖FINISH ──►
//!                                                  ◄──  DATA (empty): confirms the keys
//! ```
//!
//! Keys: HKDF-SHA256 with salt = SHA-256(INIT ‖ REPLY ‖ FINISH) over the X25519 shared secret,
//! one ChaCha20-Poly1305 key per direction. Both identities are in that transcript, so a man in
//! the middle who swaps either one ends with keys that match nobody's. Each side then checks
//! the other's fingerprint (SHA-256 of its SPKI) against `known_peers`, exactly as on TLS.
//!
//! Datagram formats (all integers big-endian):
//!
//! ```text
//! off size  every datagram
//!  0   2    magic "NS" (ndd sealed; plain fragments start with "ND")
//!  2   1    version 1
//!  3   1    type: 1 INIT, 2 REPLY, 3 FINISH, 4 DATA
//! INIT    4 4 initiator index · 8 32 ephemeral key                                  (40 bytes)
//! REPLY   4 4 responder index · 8 4 initiator index · 12 32 ephemeral key ·
//!         44 2 SPKI length, SPKI · 2 signature scheme · 2 signature length, signature
//! FINISH  4 4 responder index · 8 4 initiator index ·
//!         12 2 SPKI length, SPKI · 2 signature scheme · 2 signature length, signature
//! DATA    4 4 receiver index · 8 8 counter · 16 … ciphertext, 16-byte tag
//! ```
//!
//! A signature covers a label (`ndd udp v1 reply` / `ndd udp v1 finish`), the earlier
//! messages whole, and its own message up to its scheme field; schemes are TLS
//! `SignatureScheme` codes, checked with rustls' ring verifiers. DATA's nonce is four zero
//! bytes and the counter; its 16-byte header is the associated data. The receiver keeps a
//! window of [`REPLAY_WINDOW`] counters: a counter seen before or older than the window is a
//! replay and is dropped. Nothing here panics on any input.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
use ring::agreement::{self, EphemeralPrivateKey, UnparsedPublicKey, X25519};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::pki_types::SubjectPublicKeyInfoDer;
use rustls::sign::SigningKey;
use rustls::SignatureScheme;

/// First two bytes of every sealed or key-exchange datagram.
pub const SEAL_MAGIC: [u8; 2] = *b"NS";
/// Format version.
pub const SEAL_VERSION: u8 = 1;
/// DATA header length (the associated data).
pub const DATA_HEADER_LEN: usize = 16;
/// AEAD tag length.
pub const TAG_LEN: usize = 16;
/// Bytes a sealed datagram adds to what it carries.
pub const SEAL_OVERHEAD: usize = DATA_HEADER_LEN + TAG_LEN;
/// Counters remembered by the receiver to drop replays.
pub const REPLAY_WINDOW: u64 = 4096;
/// Largest SPKI or signature accepted (an RSA-8192 key is about 1.1 KB).
const MAX_FIELD: usize = 2048;

const INIT: u8 = 1;
const REPLY: u8 = 2;
const FINISH: u8 = 3;
const DATA: u8 = 4;
const KEY_LEN: usize = 32;
const INIT_LEN: usize = 8 + KEY_LEN;

const LABEL_REPLY: &[u8] = b"ndd udp v1 reply\0";
const LABEL_FINISH: &[u8] = b"ndd udp v1 finish\0";
const INFO_I2R: &[u8] = b"ndd udp v1 initiator to responder";
const INFO_R2I: &[u8] = b"ndd udp v1 responder to initiator";

/// Schemes we sign with, best first (whatever key type the identity has).
const SIGN_SCHEMES: &[SignatureScheme] = &[
    SignatureScheme::ED25519,
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::RSA_PSS_SHA256,
];

/// What went wrong with a sealed or key-exchange datagram.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Shorter than its header.
    #[error("datagram of {0} bytes is too short")]
    Short(usize),
    /// Not "NS": a plain fragment, or not ndd at all.
    #[error("not an authenticated ndd datagram (bad magic)")]
    Magic,
    /// Another format version.
    #[error("unknown sealed datagram version {0}")]
    Version(u8),
    /// Unknown type byte.
    #[error("unknown sealed datagram type {0}")]
    Type(u8),
    /// A key-exchange message whose lengths do not add up.
    #[error("malformed {0} datagram")]
    Malformed(&'static str),
    /// A key-exchange message that does not answer ours.
    #[error("{0} for another key exchange")]
    Unrelated(&'static str),
    /// The peer's signature does not verify with the key it showed.
    #[error("the peer's signature over the key exchange does not verify")]
    BadSignature,
    /// A REPLY signed by an identity the caller does not trust (its fingerprint).
    #[error("a reply signed by {0}, not trusted here")]
    Untrusted(String),
    /// A key or scheme we cannot verify.
    #[error("the peer's key cannot be checked: {0}")]
    BadKey(String),
    /// Our key cannot sign.
    #[error("this identity's key cannot sign the UDP key exchange: {0}")]
    Sign(String),
    /// The X25519 agreement failed (a bad public key).
    #[error("key agreement failed (bad ephemeral key)")]
    Agreement,
    /// No randomness.
    #[error("the system random number generator failed")]
    Random,
    /// A DATA datagram that does not decrypt: forged, damaged, or for other keys.
    #[error("authentication failed (forged, damaged or for another session)")]
    Auth,
    /// A DATA counter already seen, or older than the window.
    #[error("replayed or too old (counter {0})")]
    Replay(u64),
    /// A DATA datagram for another session's index.
    #[error("for another session (index {0})")]
    Index(u32),
    /// 2^64 datagrams sealed with one key.
    #[error("the datagram counter is exhausted; reconnect for new keys")]
    Exhausted,
}

/// One parsed sealed datagram (borrowing the datagram).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sealed<'a> {
    /// First key-exchange message.
    Init {
        /// The initiator's index (DATA to it carries this).
        initiator: u32,
        /// Its ephemeral X25519 public key.
        ephemeral: [u8; KEY_LEN],
    },
    /// The responder's answer.
    Reply {
        /// The responder's index.
        responder: u32,
        /// The index of the INIT answered.
        initiator: u32,
        /// Its ephemeral key.
        ephemeral: [u8; KEY_LEN],
        /// The responder's identity and signature.
        signed: Signed<'a>,
    },
    /// The initiator's identity.
    Finish {
        /// The responder index it answers.
        responder: u32,
        /// The initiator's index.
        initiator: u32,
        /// Identity and signature.
        signed: Signed<'a>,
    },
    /// Sealed payload.
    Data {
        /// Index of the receiving side.
        receiver: u32,
        /// Per-direction counter (the nonce).
        counter: u64,
    },
}

/// An identity and its signature in REPLY or FINISH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed<'a> {
    /// DER SubjectPublicKeyInfo.
    pub spki: &'a [u8],
    /// TLS SignatureScheme code.
    pub scheme: u16,
    /// The signature.
    pub signature: &'a [u8],
    /// Length of the datagram's prefix the signature covers (up to the scheme field).
    pub signed_len: usize,
}

/// Whether `datagram` is in the sealed format (magic "NS"), without parsing the rest.
pub fn is_sealed(datagram: &[u8]) -> bool {
    datagram.starts_with(&SEAL_MAGIC)
}

impl<'a> Sealed<'a> {
    /// Parses a datagram. DATA is only its header: the ciphertext is checked by
    /// [`SealRx::open`].
    pub fn parse(d: &'a [u8]) -> Result<Sealed<'a>, SealError> {
        let Some(head) = d.get(..4) else {
            return Err(SealError::Short(d.len()));
        };
        if head[..2] != SEAL_MAGIC {
            return Err(SealError::Magic);
        }
        if head[2] != SEAL_VERSION {
            return Err(SealError::Version(head[2]));
        }
        let mut r = Reader { d, at: 4 };
        match head[3] {
            INIT => {
                let initiator = r.u32("INIT")?;
                let ephemeral = r.key("INIT")?;
                r.end("INIT")?;
                Ok(Sealed::Init {
                    initiator,
                    ephemeral,
                })
            }
            REPLY => {
                let responder = r.u32("REPLY")?;
                let initiator = r.u32("REPLY")?;
                let ephemeral = r.key("REPLY")?;
                let signed = r.signed("REPLY")?;
                Ok(Sealed::Reply {
                    responder,
                    initiator,
                    ephemeral,
                    signed,
                })
            }
            FINISH => {
                let responder = r.u32("FINISH")?;
                let initiator = r.u32("FINISH")?;
                let signed = r.signed("FINISH")?;
                Ok(Sealed::Finish {
                    responder,
                    initiator,
                    signed,
                })
            }
            DATA => {
                if d.len() < SEAL_OVERHEAD {
                    return Err(SealError::Short(d.len()));
                }
                let receiver = r.u32("DATA")?;
                let counter = r.u64("DATA")?;
                Ok(Sealed::Data { receiver, counter })
            }
            t => Err(SealError::Type(t)),
        }
    }
}

struct Reader<'a> {
    d: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], SealError> {
        let end = self.at.checked_add(n).ok_or(SealError::Malformed(what))?;
        let s = self.d.get(self.at..end).ok_or(SealError::Malformed(what))?;
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, SealError> {
        let s = self.take(2, what)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, SealError> {
        let s = self.take(4, what)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, SealError> {
        let s = self.take(8, what)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(s);
        Ok(u64::from_be_bytes(b))
    }
    fn key(&mut self, what: &'static str) -> Result<[u8; KEY_LEN], SealError> {
        let mut k = [0u8; KEY_LEN];
        k.copy_from_slice(self.take(KEY_LEN, what)?);
        Ok(k)
    }
    fn field(&mut self, what: &'static str) -> Result<&'a [u8], SealError> {
        let n = usize::from(self.u16(what)?);
        if n == 0 || n > MAX_FIELD {
            return Err(SealError::Malformed(what));
        }
        self.take(n, what)
    }
    fn signed(&mut self, what: &'static str) -> Result<Signed<'a>, SealError> {
        let spki = self.field(what)?;
        let signed_len = self.at;
        let scheme = self.u16(what)?;
        let signature = self.field(what)?;
        self.end(what)?;
        Ok(Signed {
            spki,
            scheme,
            signature,
            signed_len,
        })
    }
    fn end(&self, what: &'static str) -> Result<(), SealError> {
        if self.at == self.d.len() {
            Ok(())
        } else {
            Err(SealError::Malformed(what))
        }
    }
}

fn header(kind: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(256);
    v.extend_from_slice(&SEAL_MAGIC);
    v.push(SEAL_VERSION);
    v.push(kind);
    v
}

fn random_index(rng: &SystemRandom) -> Result<u32, SealError> {
    let mut b = [0u8; 4];
    rng.fill(&mut b).map_err(|_| SealError::Random)?;
    Ok(u32::from_be_bytes(b))
}

/// The key this side signs the exchange with, and the SPKI it shows.
#[derive(Clone)]
pub struct LocalIdentity {
    spki: Vec<u8>,
    key: Arc<dyn SigningKey>,
}

impl std::fmt::Debug for LocalIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalIdentity").finish_non_exhaustive()
    }
}

impl LocalIdentity {
    /// From an install's identity.
    pub fn new(id: &crate::Identity) -> Result<LocalIdentity, SealError> {
        let provider = crate::tls::provider();
        let key = provider
            .key_provider
            .load_private_key(id.key_der().clone_key())
            .map_err(|e| SealError::Sign(e.to_string()))?;
        if key.choose_scheme(SIGN_SCHEMES).is_none() {
            return Err(SealError::Sign(format!(
                "no usable signature scheme for a {:?} key",
                key.algorithm()
            )));
        }
        Ok(LocalIdentity {
            spki: id.spki_der().to_vec(),
            key,
        })
    }

    /// The fingerprint peers pin (`SHA256:…` of the SPKI).
    pub fn fingerprint(&self) -> String {
        crate::fingerprint_of_spki(&self.spki)
    }

    /// Appends SPKI, scheme and signature over `label ‖ before ‖ out` (out up to the scheme).
    fn append_signed(
        &self,
        out: &mut Vec<u8>,
        label: &[u8],
        before: &[&[u8]],
    ) -> Result<(), SealError> {
        put_field(out, &self.spki);
        let mut msg = label.to_vec();
        for b in before {
            msg.extend_from_slice(b);
        }
        msg.extend_from_slice(out);
        let signer = self
            .key
            .choose_scheme(SIGN_SCHEMES)
            .ok_or_else(|| SealError::Sign("no usable signature scheme".into()))?;
        let sig = signer
            .sign(&msg)
            .map_err(|e| SealError::Sign(e.to_string()))?;
        out.extend_from_slice(&u16::from(signer.scheme()).to_be_bytes());
        put_field(out, &sig);
        Ok(())
    }
}

impl LocalIdentity {
    /// A short message signed with this identity: `body`, then the SPKI, scheme and a
    /// signature over `label ‖ body ‖ SPKI` (the label, never sent, keeps a note of one kind
    /// from passing for another). [`open_note`] checks it.
    pub fn sign_note(&self, label: &[u8], body: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut out = Vec::with_capacity(body.len() + 256);
        put_field(&mut out, body);
        self.append_signed(&mut out, label, &[])?;
        Ok(out)
    }
}

/// Checks a note made by [`LocalIdentity::sign_note`] with `label`: its body and the signer's
/// fingerprint (the caller compares it with whom it trusts).
pub fn open_note<'a>(note: &'a [u8], label: &[u8]) -> Result<(&'a [u8], String), SealError> {
    let mut r = Reader { d: note, at: 0 };
    let body = r.field("note body")?;
    let signed = r.signed("note signature")?;
    let fingerprint = verify(&signed, note, label, &[])?;
    Ok((body, fingerprint))
}

fn put_field(out: &mut Vec<u8>, v: &[u8]) {
    // SPKIs and signatures are far below 64 KiB (MAX_FIELD on the receiving side).
    out.extend_from_slice(&(v.len().min(usize::from(u16::MAX)) as u16).to_be_bytes());
    out.extend_from_slice(v);
}

/// Checks `signed` over `label ‖ before ‖ datagram[..signed_len]`; returns the fingerprint.
fn verify(
    signed: &Signed<'_>,
    datagram: &[u8],
    label: &[u8],
    before: &[&[u8]],
) -> Result<String, SealError> {
    let algorithms = crate::tls::provider().signature_verification_algorithms;
    let scheme = SignatureScheme::from(signed.scheme);
    let candidates = algorithms
        .mapping
        .iter()
        .find(|(s, _)| *s == scheme)
        .map(|(_, algs)| *algs)
        .ok_or_else(|| SealError::BadKey(format!("unsupported signature scheme {scheme:?}")))?;
    let der = SubjectPublicKeyInfoDer::from(signed.spki);
    let entity = webpki::RawPublicKeyEntity::try_from(&der)
        .map_err(|e| SealError::BadKey(format!("bad public key: {e}")))?;
    let mut msg = label.to_vec();
    for b in before {
        msg.extend_from_slice(b);
    }
    msg.extend_from_slice(&datagram[..signed.signed_len]);
    if candidates.iter().any(|alg| {
        entity
            .verify_signature(*alg, &msg, signed.signature)
            .is_ok()
    }) {
        Ok(crate::fingerprint_of_spki(signed.spki))
    } else {
        Err(SealError::BadSignature)
    }
}

/// Keys for one direction each, from the shared secret and the whole transcript.
fn derive(
    shared: &[u8],
    transcript: &[&[u8]],
    initiator: bool,
    local: u32,
    peer: u32,
) -> (SealTx, SealRx) {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for m in transcript {
        ctx.update(m);
    }
    let th = ctx.finish();
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, th.as_ref()).extract(shared);
    let key = |info: &[u8]| {
        let info = [info];
        // The output length is the AEAD's key length, which HKDF-SHA256 always gives.
        let okm = prk
            .expand(&info, &CHACHA20_POLY1305)
            .expect("HKDF-SHA256 gives 32 bytes");
        LessSafeKey::new(UnboundKey::from(okm))
    };
    let (send, recv) = if initiator {
        (key(INFO_I2R), key(INFO_R2I))
    } else {
        (key(INFO_R2I), key(INFO_I2R))
    };
    (
        SealTx {
            key: send,
            receiver: peer,
            counter: AtomicU64::new(0),
        },
        SealRx {
            key: recv,
            index: local,
            window: ReplayWindow::default(),
        },
    )
}

/// A finished exchange: both directions' keys and the peer's fingerprint.
#[derive(Debug)]
pub struct Keys {
    /// Sealing for what we send.
    pub tx: SealTx,
    /// Opening what we receive.
    pub rx: SealRx,
    /// The peer's fingerprint (`SHA256:…`), to check against `known_peers`.
    pub peer_fingerprint: String,
}

/// The connecting side's exchange.
pub struct Initiator {
    index: u32,
    secret: Option<EphemeralPrivateKey>,
    init: Vec<u8>,
    finish: Option<Vec<u8>>,
}

impl std::fmt::Debug for Initiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Initiator")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Initiator {
    /// A fresh exchange: a new index and ephemeral key.
    pub fn new() -> Result<Initiator, SealError> {
        let rng = SystemRandom::new();
        let index = random_index(&rng)?;
        let secret = EphemeralPrivateKey::generate(&X25519, &rng).map_err(|_| SealError::Random)?;
        let public = secret.compute_public_key().map_err(|_| SealError::Random)?;
        let mut init = header(INIT);
        init.extend_from_slice(&index.to_be_bytes());
        init.extend_from_slice(public.as_ref());
        debug_assert_eq!(init.len(), INIT_LEN);
        Ok(Initiator {
            index,
            secret: Some(secret),
            init,
            finish: None,
        })
    }

    /// INIT, to send (again until a REPLY comes).
    pub fn init(&self) -> &[u8] {
        &self.init
    }

    /// FINISH, once a REPLY was accepted (to send again until the keys are confirmed).
    pub fn finish(&self) -> Option<&[u8]> {
        self.finish.as_deref()
    }

    /// Takes the responder's REPLY: checks its signature, answers with FINISH (see
    /// [`Initiator::finish`]) and gives the keys. Only the first good REPLY counts; an
    /// unrelated or forged one is an error and changes nothing.
    pub fn handle_reply(&mut self, me: &LocalIdentity, reply: &[u8]) -> Result<Keys, SealError> {
        self.handle_reply_from(me, reply, |_| true)
    }

    /// [`Initiator::handle_reply`], taking only a REPLY whose signer `trusted` accepts: one
    /// signed by another identity is [`SealError::Untrusted`] and changes nothing (a later
    /// REPLY can still count). Where anyone may answer (NATS), the first answer may be a
    /// stranger's.
    pub fn handle_reply_from(
        &mut self,
        me: &LocalIdentity,
        reply: &[u8],
        trusted: impl Fn(&str) -> bool,
    ) -> Result<Keys, SealError> {
        let Sealed::Reply {
            responder,
            initiator,
            ephemeral,
            signed,
        } = Sealed::parse(reply)?
        else {
            return Err(SealError::Malformed("REPLY"));
        };
        if initiator != self.index || self.secret.is_none() {
            return Err(SealError::Unrelated("REPLY"));
        }
        let peer_fingerprint = verify(&signed, reply, LABEL_REPLY, &[&self.init])?;
        if !trusted(&peer_fingerprint) {
            return Err(SealError::Untrusted(peer_fingerprint));
        }
        let mut finish = header(FINISH);
        finish.extend_from_slice(&responder.to_be_bytes());
        finish.extend_from_slice(&self.index.to_be_bytes());
        me.append_signed(&mut finish, LABEL_FINISH, &[&self.init, reply])?;
        let secret = self.secret.take().ok_or(SealError::Unrelated("REPLY"))?;
        let transcript = [self.init.as_slice(), reply, finish.as_slice()];
        let (tx, rx) = agreement::agree_ephemeral(
            secret,
            &UnparsedPublicKey::new(&X25519, ephemeral),
            |shared| derive(shared, &transcript, true, self.index, responder),
        )
        .map_err(|_| SealError::Agreement)?;
        self.finish = Some(finish);
        Ok(Keys {
            tx,
            rx,
            peer_fingerprint,
        })
    }
}

/// The listening side's half of one exchange, from an INIT.
pub struct Responder {
    index: u32,
    initiator: u32,
    init: Vec<u8>,
    reply: Vec<u8>,
    shared: Vec<u8>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("index", &self.index)
            .field("initiator", &self.initiator)
            .finish_non_exhaustive()
    }
}

impl Responder {
    /// Answers an INIT: a new index and ephemeral key, the shared secret, and a signed REPLY.
    pub fn new(me: &LocalIdentity, init: &[u8]) -> Result<Responder, SealError> {
        let Sealed::Init {
            initiator,
            ephemeral,
        } = Sealed::parse(init)?
        else {
            return Err(SealError::Malformed("INIT"));
        };
        let rng = SystemRandom::new();
        let index = random_index(&rng)?;
        let secret = EphemeralPrivateKey::generate(&X25519, &rng).map_err(|_| SealError::Random)?;
        let public = secret.compute_public_key().map_err(|_| SealError::Random)?;
        let shared =
            agreement::agree_ephemeral(secret, &UnparsedPublicKey::new(&X25519, ephemeral), |s| {
                s.to_vec()
            })
            .map_err(|_| SealError::Agreement)?;
        let mut reply = header(REPLY);
        reply.extend_from_slice(&index.to_be_bytes());
        reply.extend_from_slice(&initiator.to_be_bytes());
        reply.extend_from_slice(public.as_ref());
        me.append_signed(&mut reply, LABEL_REPLY, &[init])?;
        Ok(Responder {
            index,
            initiator,
            init: init.to_vec(),
            reply,
            shared,
        })
    }

    /// This exchange's index (FINISH names it).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// REPLY, to send (again when the same INIT comes again).
    pub fn reply(&self) -> &[u8] {
        &self.reply
    }

    /// Whether `init` is the INIT this answers (a retransmission).
    pub fn answers(&self, init: &[u8]) -> bool {
        self.init == init
    }

    /// Takes the initiator's FINISH: checks its signature and gives the keys.
    pub fn handle_finish(&self, finish: &[u8]) -> Result<Keys, SealError> {
        let Sealed::Finish {
            responder,
            initiator,
            signed,
        } = Sealed::parse(finish)?
        else {
            return Err(SealError::Malformed("FINISH"));
        };
        if responder != self.index || initiator != self.initiator {
            return Err(SealError::Unrelated("FINISH"));
        }
        let peer_fingerprint = verify(&signed, finish, LABEL_FINISH, &[&self.init, &self.reply])?;
        let transcript = [self.init.as_slice(), self.reply.as_slice(), finish];
        let (tx, rx) = derive(&self.shared, &transcript, false, self.index, self.initiator);
        Ok(Keys {
            tx,
            rx,
            peer_fingerprint,
        })
    }
}

/// Seals what one side sends. Shared by the link's senders (`&self`).
pub struct SealTx {
    key: LessSafeKey,
    receiver: u32,
    counter: AtomicU64,
}

impl std::fmt::Debug for SealTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealTx")
            .field("receiver", &self.receiver)
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

impl SealTx {
    /// A DATA datagram carrying `payload` (which may be empty: a confirmation).
    pub fn seal(&self, payload: &[u8]) -> Result<Vec<u8>, SealError> {
        let counter = self.counter.fetch_add(1, Ordering::Relaxed);
        if counter == u64::MAX {
            return Err(SealError::Exhausted);
        }
        let mut out = Vec::with_capacity(payload.len() + SEAL_OVERHEAD);
        out.extend_from_slice(&[SEAL_MAGIC[0], SEAL_MAGIC[1], SEAL_VERSION, DATA]);
        out.extend_from_slice(&self.receiver.to_be_bytes());
        out.extend_from_slice(&counter.to_be_bytes());
        out.extend_from_slice(payload);
        let (head, body) = out.split_at_mut(DATA_HEADER_LEN);
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(counter), Aad::from(&*head), body)
            .map_err(|_| SealError::Exhausted)?;
        out.extend_from_slice(tag.as_ref());
        Ok(out)
    }

    /// Datagrams sealed so far.
    pub fn sent(&self) -> u64 {
        self.counter.load(Ordering::Relaxed)
    }
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Opens what one side receives, dropping forgeries and replays.
pub struct SealRx {
    key: LessSafeKey,
    index: u32,
    window: ReplayWindow,
}

impl std::fmt::Debug for SealRx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealRx")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl SealRx {
    /// Checks and decrypts a DATA datagram in place; returns the payload's range in it. The
    /// counter counts as seen only once the datagram authenticated, so a forgery cannot burn
    /// a counter of the real peer.
    pub fn open(&mut self, datagram: &mut [u8]) -> Result<std::ops::Range<usize>, SealError> {
        let Sealed::Data { receiver, counter } = Sealed::parse(datagram)? else {
            return Err(SealError::Malformed("DATA"));
        };
        if receiver != self.index {
            return Err(SealError::Index(receiver));
        }
        if !self.window.fresh(counter) {
            return Err(SealError::Replay(counter));
        }
        let (head, body) = datagram.split_at_mut(DATA_HEADER_LEN);
        let plain = self
            .key
            .open_in_place(nonce(counter), Aad::from(&*head), body)
            .map_err(|_| SealError::Auth)?;
        let len = plain.len();
        self.window.mark(counter);
        Ok(DATA_HEADER_LEN..DATA_HEADER_LEN + len)
    }

    /// Our index: DATA for us carries it.
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// Which of the last [`REPLAY_WINDOW`] counters were seen: a ring of bits, like WireGuard's.
#[derive(Debug, Clone)]
struct ReplayWindow {
    /// One past the highest counter seen (0: none yet).
    top: u64,
    bits: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            top: 0,
            bits: [0; (REPLAY_WINDOW / 64) as usize],
        }
    }
}

impl ReplayWindow {
    fn slot(c: u64) -> (usize, u64) {
        let s = c % REPLAY_WINDOW;
        ((s / 64) as usize, 1u64 << (s % 64))
    }

    fn fresh(&self, c: u64) -> bool {
        if c >= self.top {
            return true;
        }
        if self.top - c > REPLAY_WINDOW {
            return false;
        }
        let (w, b) = Self::slot(c);
        self.bits[w] & b == 0
    }

    fn mark(&mut self, c: u64) {
        if c >= self.top {
            if c - self.top >= REPLAY_WINDOW {
                self.bits = [0; (REPLAY_WINDOW / 64) as usize];
            } else {
                for n in self.top..=c {
                    let (w, b) = Self::slot(n);
                    self.bits[w] &= !b;
                }
            }
            self.top = c + 1;
        }
        let (w, b) = Self::slot(c);
        self.bits[w] |= b;
    }
}

#[cfg(test)]
mod tests;
