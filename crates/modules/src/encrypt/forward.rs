//! Source half of `encrypt`: seals every frame in place under this half's epoch subkey.

use super::key::{self, Key};
use super::{aad, nonce, Cipher, Header, EPOCH_LEN, HEADER_LEN, PAIR, TAG_LEN};
use ndd_core::{Frame, FrameError, Half, HalfStats, ModuleError, Output, SetupError};
use ring::aead::{Aad, LessSafeKey};
use ring::rand::{SecureRandom, SystemRandom};
use std::fmt;
use std::time::Instant;

/// Seals frames: draws a random epoch when built, then numbers frames 0, 1, 2, … .
pub struct EncryptForward {
    key: LessSafeKey,
    cipher: Cipher,
    epoch: [u8; EPOCH_LEN],
    counter: u64,
    frames: u64,
}

impl fmt::Debug for EncryptForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptForward")
            .field("cipher", &self.cipher)
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

impl EncryptForward {
    /// A forward half with a fresh random epoch (from the operating system's generator).
    pub fn new(key: &Key, cipher: Cipher) -> Result<EncryptForward, ModuleError> {
        let mut epoch = [0u8; EPOCH_LEN];
        SystemRandom::new()
            .fill(&mut epoch)
            .map_err(|_| SetupError::Failed {
                pair: PAIR,
                what: "the system random number generator failed",
            })?;
        EncryptForward::with_epoch(key, cipher, epoch)
    }

    /// A forward half with a given epoch. Only for test vectors: an epoch must never be
    /// reused with the same key.
    pub(crate) fn with_epoch(
        key: &Key,
        cipher: Cipher,
        epoch: [u8; EPOCH_LEN],
    ) -> Result<EncryptForward, ModuleError> {
        let key = key::subkey(key, &epoch, cipher).ok_or(SetupError::Failed {
            pair: PAIR,
            what: "cannot derive the epoch key",
        })?;
        Ok(EncryptForward {
            key,
            cipher,
            epoch,
            counter: 0,
            frames: 0,
        })
    }
}

impl EncryptForward {
    /// Seals `frame` bound to `bound` ([`super::aad_bound`]): it opens only through
    /// [`super::EncryptInverse::open_bound`] with the same `bound`.
    pub fn seal_bound(
        &mut self,
        frame: Frame,
        bound: u64,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let aad = super::aad_bound(&frame.meta, bound);
        self.seal(frame, &aad, out)
    }

    fn seal(&mut self, mut frame: Frame, aad: &[u8], out: &mut Output) -> Result<(), ModuleError> {
        let counter = self.counter;
        // Never reached (2^64 frames), but a nonce must never repeat.
        self.counter = counter.checked_add(1).ok_or(SetupError::Failed {
            pair: PAIR,
            what: "nonce counter exhausted; restart the stream",
        })?;
        // Header space first, so that a frame without headroom is copied at most once; then
        // seal the body in place behind it.
        frame.push_header_with(HEADER_LEN, |h| h.fill(0));
        let buf = frame.payload_mut();
        let Some((hdr, body)) = buf.split_first_chunk_mut::<HEADER_LEN>() else {
            return Err(ModuleError::from(FrameError::Invalid {
                pair: PAIR,
                rule: "header space missing after push",
            }));
        };
        let len = body.len();
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(counter), Aad::from(aad), body)
            .map_err(|_| FrameError::TooLargeToSeal { pair: PAIR, len })?;
        let tag = <[u8; TAG_LEN]>::try_from(tag.as_ref()).map_err(|_| FrameError::Invalid {
            pair: PAIR,
            rule: "the cipher returned a tag of another size",
        })?;
        Header {
            epoch: self.epoch,
            counter,
            tag,
        }
        .emit(hdr);
        self.frames += 1;
        out.push(frame);
        Ok(())
    }
}

impl Half for EncryptForward {
    fn handle_frame(
        &mut self,
        _now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        let aad = aad(&frame.meta);
        self.seal(frame, &aad, out)
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: 0,
            queue_depth: 0,
            counters: vec![("frames", self.frames)],
        }
    }
}
