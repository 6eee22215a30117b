//! `encrypt`: authenticated encryption of every frame (AES-256-GCM or ChaCha20-Poly1305, from
//! `ring`). The sink drops and counts tampered, truncated and replayed frames.
//!
//! Synopsis: `{ type = "encrypt", cipher = "aes-256-gcm", key_file = "/etc/ndd/mouse.key", passphrase_file = "", window = 1024 }`
//!
//! - **Key**: exactly one of `key_file` (32 raw bytes, or 64 hex digits plus an optional
//!   newline) and `passphrase_file` (PBKDF2-HMAC-SHA256, [`key::PBKDF2_ITERATIONS`]
//!   iterations, fixed salt [`key::PBKDF2_SALT`]). Either file must be a regular file that only
//!   its owner may read or write (mode `0600` or stricter). The file is read when the config
//!   is first described or a half is built, never in the data path; the key is then cached in
//!   the config ([`KeyCache`]).
//! - **Epochs**: every forward half draws a random 16-byte *epoch* when it is built and
//!   encrypts under its own subkey `HKDF-SHA256(ikm = key, salt = epoch, info = "ndd-encrypt v1"
//!   ‖ cipher name)`, with nonce `00000000 ‖ counter (u64 BE)` and its own counter starting at
//!   0. A (subkey, nonce) pair therefore never repeats: not across frames (the counter), not
//!   across restarts or two sources sharing a key file (the epoch), not when an upper pair emits
//!   two frames with one sequence number (the counter is the pair's own, not `meta.seq`).
//! - **Header** (40 bytes, pushed in the headroom): `epoch (16) ‖ counter (u64 BE, 8) ‖ tag
//!   (16)`, then the ciphertext, which is as long as the plaintext. AAD: `stream (u16 BE) ‖
//!   seq (u64 BE) ‖ timestamp_ns (u64 BE)`; flags are not authenticated (a link may set
//!   RETRANSMIT). The tag sits in the header rather than after the ciphertext so that
//!   encryption and decryption are entirely in place: `Frame` has headroom but no tailroom,
//!   and appending 16 bytes would copy every payload.
//! - **Inverse**: keeps the subkeys and replay windows of the [`LIVE_EPOCHS`] most recently
//!   used epochs (re-deriving only when a new epoch authenticates). A counter already seen, or
//!   `window` or more below the highest one seen in its epoch, is a replay. An epoch whose
//!   state was evicted is *retired*: its frames are refused from then on (the last
//!   [`RETIRED_EPOCHS`] are remembered). Tampered frames (`auth_failed`), frames shorter than
//!   the header (`truncated`) and replays (`replayed`) are dropped, counted and logged with
//!   one WARN event each; nothing unauthenticated is ever delivered.
//! - **describe**: `encrypt(cipher=…, window=…, key_id=…)` where `key_id` is the first 8
//!   bytes of SHA-256("ndd-encrypt key id" ‖ key), in hex. It never contains a path or the
//!   key, and differs when the keys differ, so mismatched keys fail the handshake.
//!
//! No control messages (any received is refused by the default `handle_control`). Stats:
//! forward `frames`; inverse `auth_failed`, `replayed`, `truncated` (their sum is `drops`) and
//! `epochs` (distinct epochs that authenticated).

mod forward;
mod inverse;
pub mod key;
#[cfg(test)]
mod tests;
mod window;

pub use forward::EncryptForward;
pub use inverse::{EncryptInverse, Opening, LIVE_EPOCHS, RETIRED_EPOCHS};
pub use key::KeyCache;

use crate::registry::{ModuleInfo, ParamInfo, IDS};
use ndd_core::{Half, Meta, ModuleError, Pair, ParamError, SetupError};
use ring::aead;
use serde::Deserialize;
use std::path::PathBuf;

/// Bytes of the epoch in the pair header.
pub const EPOCH_LEN: usize = 16;
/// Bytes of the counter in the pair header.
pub const COUNTER_LEN: usize = 8;
/// Bytes of the authentication tag in the pair header.
pub const TAG_LEN: usize = 16;
/// Length of the pair header: epoch ‖ counter ‖ tag.
pub const HEADER_LEN: usize = EPOCH_LEN + COUNTER_LEN + TAG_LEN;

/// Largest `window`.
pub const MAX_WINDOW: u32 = 65_536;

/// The AEAD algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum Cipher {
    /// AES-256 in Galois/counter mode (fastest where the CPU has AES instructions).
    #[default]
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
    /// ChaCha20-Poly1305 (fast everywhere, constant time without AES instructions).
    #[serde(rename = "chacha20-poly1305")]
    Chacha20Poly1305,
}

impl Cipher {
    /// Name as written in config files (and in the HKDF info).
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Aes256Gcm => "aes-256-gcm",
            Cipher::Chacha20Poly1305 => "chacha20-poly1305",
        }
    }

    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }
}

/// Parameters of `encrypt`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EncryptConfig {
    /// AEAD algorithm.
    pub cipher: Cipher,
    /// File holding the key: 32 raw bytes, or 64 hex digits plus an optional newline. Empty
    /// when the key comes from `passphrase_file`.
    pub key_file: PathBuf,
    /// File holding a passphrase the key is derived from. Empty when `key_file` is used.
    pub passphrase_file: PathBuf,
    /// Replay window of the inverse, in counters.
    pub window: u32,
    /// The key once loaded (not a parameter; leave it `Default`). Two configs compare equal
    /// whatever their caches hold.
    #[serde(skip)]
    pub key_cache: KeyCache,
}

impl Default for EncryptConfig {
    fn default() -> Self {
        EncryptConfig {
            cipher: Cipher::Aes256Gcm,
            key_file: PathBuf::new(),
            passphrase_file: PathBuf::new(),
            window: 1024,
            key_cache: KeyCache::default(),
        }
    }
}

/// The pair's name, first in its error texts.
const PAIR: &str = "encrypt";

/// Catalogue entry.
pub const INFO: ModuleInfo = ModuleInfo {
    name: PAIR,
    id: IDS.encrypt,
    summary: "AEAD (AES-256-GCM / ChaCha20-Poly1305) per frame; the inverse drops and counts \
              tampered, truncated and replayed frames",
    params: &[
        ParamInfo {
            name: "cipher",
            ty: "\"aes-256-gcm\" | \"chacha20-poly1305\"",
            default: "\"aes-256-gcm\"",
            doc: "AEAD algorithm",
        },
        ParamInfo {
            name: "key_file",
            ty: "path to a mode-0600 file: 32 raw bytes or 64 hex digits",
            default: "\"\"",
            doc: "the key (set exactly one of key_file and passphrase_file)",
        },
        ParamInfo {
            name: "passphrase_file",
            ty: "path to a mode-0600 file: 8..=1024 bytes",
            default: "\"\"",
            doc: "passphrase the key is derived from (PBKDF2-HMAC-SHA256, 600000 iterations)",
        },
        ParamInfo {
            name: "window",
            ty: "integer 1..=65536",
            default: "1024",
            doc: "replay window of the sink, in frames (reordering it tolerates)",
        },
    ],
};

impl EncryptConfig {
    /// Checks ranges and that exactly one key source is set. Reads no file.
    pub fn validate(&self) -> Result<(), ParamError> {
        ParamError::check_range(PAIR, "window", self.window, 1..=MAX_WINDOW)?;
        match (
            self.key_file.as_os_str().is_empty(),
            self.passphrase_file.as_os_str().is_empty(),
        ) {
            (true, true) | (false, false) => Err(ParamError::ExactlyOne {
                pair: PAIR,
                first: "key_file",
                second: "passphrase_file",
                both: !self.key_file.as_os_str().is_empty(),
            }),
            _ => Ok(()),
        }
    }

    /// The key, loaded from its file on first use and cached (see [`KeyCache`]).
    fn key(&self) -> Result<std::sync::Arc<key::Key>, SetupError> {
        self.validate()?;
        let source = if self.key_file.as_os_str().is_empty() {
            key::Source::Passphrase(self.passphrase_file.clone())
        } else {
            key::Source::KeyFile(self.key_file.clone())
        };
        self.key_cache.get_or_load(&source)
    }

    /// `key_id` as shown in [`Pair::describe`], or the reason the key cannot be loaded.
    pub fn key_id(&self) -> Result<String, SetupError> {
        self.key().map(|k| k.id_hex())
    }
}

impl Pair for EncryptConfig {
    fn name(&self) -> &'static str {
        INFO.name
    }
    fn id(&self) -> u16 {
        INFO.id
    }
    /// `encrypt(cipher=aes-256-gcm, window=1024, key_id=1c806d436b26621b)`. The key source
    /// paths are left out (they are local and may differ between the sides); the key enters
    /// only as its `key_id`. When the key cannot be loaded the `key_id` reads `unavailable`
    /// (building the halves then fails with the reason).
    fn describe(&self) -> String {
        let id = self.key_id().unwrap_or_else(|_| "unavailable".to_string());
        format!(
            "encrypt(cipher={}, window={}, key_id={id})",
            self.cipher.name(),
            self.window
        )
    }
    fn forward(&self) -> Result<Box<dyn Half>, ModuleError> {
        let key = self.key()?;
        Ok(Box::new(EncryptForward::new(&key, self.cipher)?))
    }
    fn inverse(&self) -> Result<Box<dyn Half>, ModuleError> {
        let key = self.key()?;
        Ok(Box::new(EncryptInverse::new(key, self.cipher, self.window)))
    }
}

/// The associated data of a frame: `stream (u16 BE) ‖ seq (u64 BE) ‖ timestamp_ns (u64 BE)`.
pub fn aad(meta: &Meta) -> [u8; 18] {
    let mut a = [0u8; 18];
    let (stream, rest) = a.split_at_mut(2);
    let (seq, ts) = rest.split_at_mut(8);
    stream.copy_from_slice(&meta.stream.to_be_bytes());
    seq.copy_from_slice(&meta.seq.to_be_bytes());
    ts.copy_from_slice(&meta.timestamp_ns.to_be_bytes());
    a
}

/// The associated data of a frame bound to a context the carrier keeps outside the frame:
/// [`aad`] followed by `bound` (u64 BE). The NATS link binds each frame to its place in its
/// subject's order this way (`ndd_link::nats::record`): a copy whose record names another
/// place does not authenticate, and so cannot use up its frame's counter.
pub fn aad_bound(meta: &Meta, bound: u64) -> [u8; 26] {
    let mut a = [0u8; 26];
    let (head, tail) = a.split_at_mut(18);
    head.copy_from_slice(&aad(meta));
    tail.copy_from_slice(&bound.to_be_bytes());
    a
}

/// The nonce of `counter`: four zero bytes, then the counter (u64 BE).
pub fn nonce(counter: u64) -> aead::Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    aead::Nonce::assume_unique_for_key(n)
}

/// The pair header, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The forward half's epoch.
    pub epoch: [u8; EPOCH_LEN],
    /// The forward half's frame counter (the nonce).
    pub counter: u64,
    /// The AEAD tag.
    pub tag: [u8; TAG_LEN],
}

impl Header {
    /// Parses exactly [`HEADER_LEN`] bytes; `None` for any other length.
    pub fn parse(b: &[u8]) -> Option<Header> {
        let (epoch, rest) = b.split_first_chunk::<EPOCH_LEN>()?;
        let (counter, rest) = rest.split_first_chunk::<COUNTER_LEN>()?;
        let tag: &[u8; TAG_LEN] = rest.try_into().ok()?;
        Some(Header {
            epoch: *epoch,
            counter: u64::from_be_bytes(*counter),
            tag: *tag,
        })
    }

    /// Writes the header into exactly [`HEADER_LEN`] bytes.
    pub fn emit(&self, out: &mut [u8; HEADER_LEN]) {
        let (epoch, rest) = out.split_at_mut(EPOCH_LEN);
        let (counter, tag) = rest.split_at_mut(COUNTER_LEN);
        epoch.copy_from_slice(&self.epoch);
        counter.copy_from_slice(&self.counter.to_be_bytes());
        tag.copy_from_slice(&self.tag);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
