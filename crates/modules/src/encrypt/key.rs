//! Key material of `encrypt`: reading the key or passphrase file, PBKDF2, the key id, and
//! the per-epoch subkey. Nothing here runs in the data path except `subkey`, which the
//! inverse calls once per new epoch.

use super::{hex, Cipher, EPOCH_LEN, PAIR};
use ndd_core::{ForeignError, SetupError};
use ring::{aead, digest, hkdf, pbkdf2};
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Key length of both ciphers.
pub const KEY_LEN: usize = 32;
/// Salt of the passphrase derivation. Fixed (both sides must derive the same key without
/// exchanging anything); see the docs for what that implies.
pub const PBKDF2_SALT: &[u8] = b"ndd-encrypt passphrase v1";
/// PBKDF2-HMAC-SHA256 iterations (OWASP's 2023 recommendation).
pub const PBKDF2_ITERATIONS: u32 = 600_000;
/// Shortest passphrase accepted, in bytes.
pub const MIN_PASSPHRASE: usize = 8;
/// Longest passphrase file accepted, in bytes.
pub const MAX_PASSPHRASE: usize = 1024;
/// Prefix hashed with the key to make the key id.
pub const KEY_ID_LABEL: &[u8] = b"ndd-encrypt key id";
/// First part of the HKDF info; the cipher name follows.
pub const HKDF_INFO: &[u8] = b"ndd-encrypt v1";

const ITERATIONS: NonZeroU32 = match NonZeroU32::new(PBKDF2_ITERATIONS) {
    Some(n) => n,
    None => panic!("PBKDF2_ITERATIONS is not zero"),
};

/// Where a key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    KeyFile(PathBuf),
    Passphrase(PathBuf),
    /// Handed over in memory (a link's key exchange), never read from a file.
    Given,
}

/// A loaded key with its id. Its `Debug` shows the id only; its bytes are overwritten with
/// zeros when it is dropped (best effort: copies the compiler or `ring` made are not).
pub struct Key {
    bytes: [u8; KEY_LEN],
    id: [u8; 8],
    source: Source,
}

impl Key {
    pub(crate) fn from_bytes(bytes: [u8; KEY_LEN], source: Source) -> Key {
        Key {
            id: key_id(&bytes),
            bytes,
            source,
        }
    }

    pub(crate) fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.bytes
    }

    /// A key handed over in memory: the NATS link's group key, which the device draws and
    /// gives every admitted app side in its join handshake.
    pub fn given(bytes: [u8; KEY_LEN]) -> Key {
        Key::from_bytes(bytes, Source::Given)
    }

    /// The key id in hex (16 digits).
    pub fn id_hex(&self) -> String {
        hex(&self.id)
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        self.bytes.fill(0);
        std::hint::black_box(&self.bytes);
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(id {})", self.id_hex())
    }
}

/// The key of an [`EncryptConfig`](super::EncryptConfig), loaded once and shared by
/// `describe()` and both halves, so the key id announced in the handshake is the id of the key
/// the halves use. Remembers where the key came from: a config cloned and then pointed at
/// another file loads that file instead of reusing the old key. Compares equal to any other
/// cache; its `Debug` never shows the key.
#[derive(Default)]
pub struct KeyCache(Mutex<Option<Arc<Key>>>);

impl KeyCache {
    pub(crate) fn get_or_load(&self, source: &Source) -> Result<Arc<Key>, SetupError> {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = slot.as_ref().filter(|k| &k.source == source) {
            return Ok(Arc::clone(k));
        }
        let key = Arc::new(load(source)?);
        *slot = Some(Arc::clone(&key));
        Ok(key)
    }

    fn peek(&self) -> Option<Arc<Key>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Clone for KeyCache {
    fn clone(&self) -> Self {
        KeyCache(Mutex::new(self.peek()))
    }
}

impl PartialEq for KeyCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.peek() {
            Some(k) => write!(f, "KeyCache({k:?})"),
            None => f.write_str("KeyCache(empty)"),
        }
    }
}

fn load(source: &Source) -> Result<Key, SetupError> {
    match source {
        Source::KeyFile(path) => {
            let max = 2 * KEY_LEN + 2;
            let bytes = read_private(path, "key file", max, |len| SetupError::KeySize {
                pair: PAIR,
                path: path.clone(),
                len,
                key_len: KEY_LEN,
            })?;
            Ok(Key::from_bytes(parse_key(path, &bytes)?, source.clone()))
        }
        Source::Passphrase(path) => {
            let bytes = read_private(path, "passphrase file", MAX_PASSPHRASE, |len| {
                SetupError::PassphraseTooLong {
                    pair: PAIR,
                    path: path.clone(),
                    len,
                    max: MAX_PASSPHRASE,
                }
            })?;
            let pass = strip_newline(&bytes);
            if pass.len() < MIN_PASSPHRASE {
                return Err(SetupError::PassphraseTooShort {
                    pair: PAIR,
                    path: path.clone(),
                    len: pass.len(),
                    min: MIN_PASSPHRASE,
                });
            }
            Ok(Key::from_bytes(passphrase_key(pass), source.clone()))
        }
        // Only `Key::given` makes such a key, and no config points at one.
        Source::Given => Err(SetupError::NotAFile {
            pair: PAIR,
            what: "key handed over in memory",
            path: PathBuf::from("(none)"),
        }),
    }
}

fn wrong_size(path: &Path, len: u64) -> SetupError {
    SetupError::KeySize {
        pair: PAIR,
        path: path.to_path_buf(),
        len,
        key_len: KEY_LEN,
    }
}

/// Reads a secret file: a regular file that only its owner may read or write, of at most
/// `max` bytes (`too_big(len)` is the error otherwise).
fn read_private(
    path: &Path,
    what: &'static str,
    max: usize,
    too_big: impl Fn(u64) -> SetupError,
) -> Result<Vec<u8>, SetupError> {
    let io = |e: std::io::Error| SetupError::Read {
        pair: PAIR,
        what,
        path: path.to_path_buf(),
        source: ForeignError::new(e),
    };
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(SetupError::NotAFile {
            pair: PAIR,
            what,
            path: path.to_path_buf(),
        });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(SetupError::Permissions {
                pair: PAIR,
                what,
                path: path.to_path_buf(),
                mode,
            });
        }
    }
    if meta.len() > max as u64 {
        return Err(too_big(meta.len()));
    }
    let mut buf = Vec::with_capacity(max + 1);
    file.take(max as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(io)?;
    if buf.len() > max {
        return Err(too_big(buf.len() as u64));
    }
    Ok(buf)
}

/// One trailing `\n` (or `\r\n`) removed.
fn strip_newline(b: &[u8]) -> &[u8] {
    let b = b.strip_suffix(b"\n").unwrap_or(b);
    b.strip_suffix(b"\r").unwrap_or(b)
}

/// A key file's contents: exactly 32 raw bytes, or 64 hex digits plus an optional newline.
fn parse_key(path: &Path, bytes: &[u8]) -> Result<[u8; KEY_LEN], SetupError> {
    if let Ok(raw) = <[u8; KEY_LEN]>::try_from(bytes) {
        if raw.iter().all(u8::is_ascii_hexdigit) {
            return Err(SetupError::HalfKey {
                pair: PAIR,
                path: path.to_path_buf(),
                key_len: KEY_LEN,
            });
        }
        return Ok(raw);
    }
    let digits = strip_newline(bytes);
    if digits.len() != 2 * KEY_LEN {
        return Err(wrong_size(path, bytes.len() as u64));
    }
    let mut key = [0u8; KEY_LEN];
    for (k, pair) in key.iter_mut().zip(digits.chunks_exact(2)) {
        match pair {
            [hi, lo] => match (nibble(*hi), nibble(*lo)) {
                (Some(h), Some(l)) => *k = h << 4 | l,
                _ => {
                    return Err(SetupError::NotHex {
                        pair: PAIR,
                        path: path.to_path_buf(),
                        key_len: KEY_LEN,
                    })
                }
            },
            _ => return Err(wrong_size(path, bytes.len() as u64)),
        }
    }
    Ok(key)
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The key derived from a passphrase: PBKDF2-HMAC-SHA256(passphrase, [`PBKDF2_SALT`],
/// [`PBKDF2_ITERATIONS`], 32 bytes).
pub fn passphrase_key(passphrase: &[u8]) -> [u8; KEY_LEN] {
    let mut out = [0u8; KEY_LEN];
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        ITERATIONS,
        PBKDF2_SALT,
        passphrase,
        &mut out,
    );
    out
}

/// The key id: the first 8 bytes of SHA-256([`KEY_ID_LABEL`] ‖ key).
pub fn key_id(key: &[u8; KEY_LEN]) -> [u8; 8] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(KEY_ID_LABEL);
    ctx.update(key);
    let d = ctx.finish();
    let mut id = [0u8; 8];
    for (o, i) in id.iter_mut().zip(d.as_ref()) {
        *o = *i;
    }
    id
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// The subkey of an epoch: HKDF-SHA256(ikm = key, salt = epoch, info = [`HKDF_INFO`] ‖ cipher
/// name), 32 bytes. (`ring` reports an error only for outputs above 255 × 32 bytes, so this
/// is always `Some`.)
pub fn subkey_bytes(
    key: &[u8; KEY_LEN],
    epoch: &[u8; EPOCH_LEN],
    cipher: Cipher,
) -> Option<[u8; KEY_LEN]> {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, epoch).extract(key);
    let info = [HKDF_INFO, cipher.name().as_bytes()];
    let mut out = [0u8; KEY_LEN];
    prk.expand(&info, Len(KEY_LEN))
        .and_then(|okm| okm.fill(&mut out))
        .ok()?;
    Some(out)
}

/// The sealing/opening key of an epoch (see [`subkey_bytes`]); `None` only if `ring` refuses
/// a 32-byte key, which it does not for either cipher.
pub(crate) fn subkey(
    key: &Key,
    epoch: &[u8; EPOCH_LEN],
    cipher: Cipher,
) -> Option<aead::LessSafeKey> {
    let mut bytes = subkey_bytes(key.bytes(), epoch, cipher)?;
    let k = aead::UnboundKey::new(cipher.algorithm(), &bytes).ok();
    bytes.fill(0);
    std::hint::black_box(&bytes);
    k.map(aead::LessSafeKey::new)
}
