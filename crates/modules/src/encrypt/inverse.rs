//! Sink half of `encrypt`: authenticates, decrypts in place and strips the header; drops and
//! counts tampered, truncated and replayed frames.

use super::key::{self, Key};
use super::window::ReplayWindow;
use super::{aad, hex, nonce, Cipher, Header, EPOCH_LEN, HEADER_LEN};
use ndd_core::{Frame, Half, HalfStats, Meta, ModuleError, Output, RateLimit};
use ring::aead::{Aad, LessSafeKey, Tag};
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

/// Epochs whose subkey and replay window the inverse keeps. Two: the current source and the
/// one before it, so frames still in flight when a source restarts are delivered (and their
/// replays caught) rather than refused.
pub const LIVE_EPOCHS: usize = 2;
/// Retired epochs remembered (and refused); 16 bytes each.
pub const RETIRED_EPOCHS: usize = 256;

struct EpochState {
    epoch: [u8; EPOCH_LEN],
    key: LessSafeKey,
    window: ReplayWindow,
    last_used: u64,
}

/// Opens frames. See the [module docs](super).
pub struct EncryptInverse {
    master: Arc<Key>,
    cipher: Cipher,
    window: u32,
    live: Vec<EpochState>,
    retired: VecDeque<[u8; EPOCH_LEN]>,
    tick: u64,
    auth_failed: u64,
    replayed: u64,
    truncated: u64,
    epochs: u64,
    /// One warning a second for dropped frames, however many a peer forges.
    noisy: RateLimit,
    /// A few lines a second about new epochs: a frame of an epoch older than the retired
    /// ones kept authenticates as a new one, and whoever recorded many can replay them.
    epochs_said: RateLimit,
    /// Whether a frame that fails authentication is warned about here (else only counted).
    warn_auth: bool,
    /// Live epochs kept ([`LIVE_EPOCHS`] unless set).
    live_max: usize,
}

impl fmt::Debug for EncryptInverse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptInverse")
            .field("cipher", &self.cipher)
            .field("window", &self.window)
            .field("live_epochs", &self.live.len())
            .field("retired_epochs", &self.retired.len())
            .finish_non_exhaustive()
    }
}

/// Decrypts the frame's payload in place; false when it does not authenticate. `bound`: the
/// context it was sealed bound to ([`super::aad_bound`]), if any.
fn open(
    key: &LessSafeKey,
    hdr: &Header,
    meta: &Meta,
    bound: Option<u64>,
    frame: &mut Frame,
) -> bool {
    let mut buf = [0u8; 26];
    let aad: &[u8] = match bound {
        Some(b) => {
            buf = super::aad_bound(meta, b);
            &buf
        }
        None => {
            buf[..18].copy_from_slice(&aad(meta));
            &buf[..18]
        }
    };
    key.open_in_place_separate_tag(
        nonce(hdr.counter),
        Aad::from(aad),
        Tag::from(hdr.tag),
        frame.payload_mut(),
        0..,
    )
    .is_ok()
}

impl EncryptInverse {
    /// An inverse half for `key` with a replay window of `window` counters per epoch.
    pub fn new(key: Arc<Key>, cipher: Cipher, window: u32) -> EncryptInverse {
        EncryptInverse {
            master: key,
            cipher,
            window,
            live: Vec::with_capacity(LIVE_EPOCHS),
            retired: VecDeque::new(),
            tick: 0,
            auth_failed: 0,
            replayed: 0,
            truncated: 0,
            epochs: 0,
            noisy: RateLimit::default(),
            epochs_said: RateLimit::with_burst(std::time::Duration::from_secs(1), 5),
            warn_auth: true,
            live_max: LIVE_EPOCHS,
        }
    }

    /// Keeps `n` live epochs instead of [`LIVE_EPOCHS`]: for a stream many sending halves
    /// feed at once (app sides sharing one NATS subject, each sealing under its own epoch),
    /// where two would retire a sender's epoch while it still sends and refuse the rest of
    /// its frames.
    pub fn with_live_epochs(mut self, n: usize) -> EncryptInverse {
        self.live_max = n.max(1);
        self
    }

    /// Counts frames that fail authentication without warning about them: for a caller that
    /// tries another key next (a key rotation) and says itself what became of the frame.
    pub fn without_auth_warnings(mut self) -> EncryptInverse {
        self.warn_auth = false;
        self
    }

    /// Frames dropped so far because they failed authentication (tampered, or sealed under
    /// another key): a caller that may hold an outdated key asks for the new one when this
    /// grows.
    pub fn auth_failures(&self) -> u64 {
        self.auth_failed
    }

    fn fail_auth(&mut self, now: Instant, meta: &Meta, hdr: &Header) {
        self.auth_failed += 1;
        if !self.warn_auth {
            return;
        }
        let Some(suppressed) = self.noisy.admit(now) else {
            return;
        };
        tracing::warn!(
            suppressed,
            stream = meta.stream,
            seq = meta.seq,
            counter = hdr.counter,
            epoch = %hex(&hdr.epoch[..4]),
            "encrypt: frame failed authentication (tampered, or the peer uses another key); dropped"
        );
    }

    fn replay(&mut self, now: Instant, meta: &Meta, hdr: &Header, reason: &str) {
        self.replayed += 1;
        let Some(suppressed) = self.noisy.admit(now) else {
            return;
        };
        tracing::warn!(
            suppressed,
            stream = meta.stream,
            seq = meta.seq,
            counter = hdr.counter,
            epoch = %hex(&hdr.epoch[..4]),
            reason,
            "encrypt: replayed frame dropped"
        );
    }

    /// Makes room for a new epoch: the least recently used one is retired.
    fn retire_oldest(&mut self) {
        while self.live.len() >= self.live_max {
            let Some(idx) = self
                .live
                .iter()
                .enumerate()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(i, _)| i)
            else {
                return;
            };
            let old = self.live.swap_remove(idx);
            if self.retired.len() >= RETIRED_EPOCHS {
                self.retired.pop_front();
            }
            self.retired.push_back(old.epoch);
        }
    }
}

/// What became of a frame handed to [`EncryptInverse::open_bound`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// It authenticated and went out.
    Opened,
    /// Its epoch and counter were taken already (the replay window, or a retired epoch):
    /// dropped before authentication, so its body may be anything.
    Replayed,
    /// It did not authenticate, or is too short to carry the header.
    Rejected,
}

impl EncryptInverse {
    /// Opens `frame` sealed bound to `bound` ([`super::EncryptForward::seal_bound`]) into
    /// `out`. One sealed bound to another value fails to authenticate (counted), and leaves
    /// the replay window as it was.
    pub fn open_bound(
        &mut self,
        now: Instant,
        frame: Frame,
        bound: u64,
        out: &mut Output,
    ) -> Result<Opening, ModuleError> {
        self.take(now, frame, Some(bound), out)
    }

    fn take(
        &mut self,
        now: Instant,
        mut frame: Frame,
        bound: Option<u64>,
        out: &mut Output,
    ) -> Result<Opening, ModuleError> {
        let meta = frame.meta;
        let Some(hdr) = frame.pop_header(HEADER_LEN).and_then(Header::parse) else {
            self.truncated += 1;
            let Some(suppressed) = self.noisy.admit(now) else {
                return Ok(Opening::Rejected);
            };
            tracing::warn!(
                suppressed,
                stream = meta.stream,
                seq = meta.seq,
                len = frame.len(),
                "encrypt: frame shorter than its 40-byte header; dropped"
            );
            return Ok(Opening::Rejected);
        };
        self.tick += 1;
        let tick = self.tick;

        if let Some(st) = self.live.iter_mut().find(|s| s.epoch == hdr.epoch) {
            // Known epoch: the replay check is cheap and comes first; the window records a
            // counter only once its frame authenticated, so forgeries cannot move it.
            if let Err(why) = st.window.check(hdr.counter) {
                self.replay(now, &meta, &hdr, why.as_str());
                return Ok(Opening::Replayed);
            }
            if !open(&st.key, &hdr, &meta, bound, &mut frame) {
                self.fail_auth(now, &meta, &hdr);
                return Ok(Opening::Rejected);
            }
            st.window.mark(hdr.counter);
            st.last_used = tick;
            out.push(frame);
            return Ok(Opening::Opened);
        }

        if self.retired.contains(&hdr.epoch) {
            self.replay(now, &meta, &hdr, "epoch retired");
            return Ok(Opening::Replayed);
        }
        // A new epoch: derive its subkey, and adopt it only if the frame authenticates.
        let Some(key) = key::subkey(&self.master, &hdr.epoch, self.cipher) else {
            self.fail_auth(now, &meta, &hdr);
            return Ok(Opening::Rejected);
        };
        if !open(&key, &hdr, &meta, bound, &mut frame) {
            self.fail_auth(now, &meta, &hdr);
            return Ok(Opening::Rejected);
        }
        self.retire_oldest();
        let mut window = ReplayWindow::new(self.window);
        window.mark(hdr.counter);
        self.live.push(EpochState {
            epoch: hdr.epoch,
            key,
            window,
            last_used: tick,
        });
        self.epochs += 1;
        if self.epochs > 1 {
            if let Some(suppressed) = self.epochs_said.admit(now) {
                tracing::info!(
                        suppressed,
                        stream = meta.stream,
                    seq = meta.seq,
                    epoch = %hex(&hdr.epoch[..4]),
                    "encrypt: new key epoch (the source restarted)"
                );
            }
        }
        out.push(frame);
        Ok(Opening::Opened)
    }
}

impl Half for EncryptInverse {
    fn handle_frame(
        &mut self,
        now: Instant,
        frame: Frame,
        out: &mut Output,
    ) -> Result<(), ModuleError> {
        self.take(now, frame, None, out).map(|_| ())
    }

    fn stats(&self) -> HalfStats {
        HalfStats {
            drops: self.auth_failed + self.replayed + self.truncated,
            queue_depth: 0,
            counters: vec![
                ("auth_failed", self.auth_failed),
                ("replayed", self.replayed),
                ("truncated", self.truncated),
                ("epochs", self.epochs),
            ],
        }
    }
}
