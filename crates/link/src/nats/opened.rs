//! What a device side's stored app → device frames opened under, kept for its next process
//! (sans-IO): per sealing epoch (the `encrypt` pair's header: `epoch (16) ‖ counter (u64)`),
//! the highest counter opened and which of the [`WINDOW`] below it were, as the `encrypt`
//! inverse's replay window keeps them — for the [`EPOCHS`] epochs opened most recently.
//!
//! A device side takes frames of its earlier run that were stored before its new run began
//! (`super::runs`: they waited for it while it restarted). Its new process has fresh replay
//! windows, so a copy of a frame the process before opened and acknowledged, stored by anyone
//! who may publish while no process had read that far, would open again and be delivered
//! twice (found by `testkit/tests/nats_ending.rs`, whose adversary stores copies of recorded
//! frames). The device's sink writes these windows to its home before each acknowledgement
//! ([`OpenedWindows::encode`]); its next process takes them up, and a stored record whose
//! sealed header they cover is a copy: dropped and counted, never opened.
//!
//! What is not covered: an epoch pushed out by [`EPOCHS`] newer ones is forgotten (more app
//! side processes sealing for the device within one window of frames than that).

use std::collections::VecDeque;

/// Counters below an epoch's highest that its window covers: the driver's `encrypt` inverse
/// for the fan-out keeps the same window (its `SEAL_WINDOW` is this), so a counter further
/// behind does not open there either.
pub const WINDOW: u64 = 4096;

/// Epochs kept (the most recently opened).
pub const EPOCHS: usize = 64;

/// Bitmap words of one window: `WINDOW / 64 + 1`, indexed by `counter / 64` modulo their
/// number, so sliding forward clears whole words (RFC 6479).
const WORDS: usize = (WINDOW / 64) as usize + 1;

/// The encoding's first bytes (a version): the first one had no [`OpenedWindows::through`].
const MAGIC_V1: &[u8; 8] = b"nddopen1";
const MAGIC: &[u8; 8] = b"nddopen2";

/// One epoch's window.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Window {
    epoch: [u8; 16],
    top: u64,
    bits: [u64; WORDS],
}

impl Window {
    fn slot(counter: u64) -> (usize, u64) {
        (
            ((counter / 64) % WORDS as u64) as usize,
            1u64 << (counter % 64),
        )
    }

    fn covers(&self, counter: u64) -> bool {
        if counter > self.top {
            return false;
        }
        if self.top - counter >= WINDOW {
            return true;
        }
        let (w, b) = Self::slot(counter);
        self.bits[w] & b != 0
    }

    fn mark(&mut self, counter: u64) {
        if counter > self.top {
            let (old, new) = (self.top / 64, counter / 64);
            if new - old >= WORDS as u64 {
                self.bits = [0; WORDS];
            } else {
                for w in old + 1..=new {
                    self.bits[(w % WORDS as u64) as usize] = 0;
                }
            }
            self.top = counter;
        } else if self.top - counter >= WINDOW {
            return;
        }
        let (w, b) = Self::slot(counter);
        self.bits[w] |= b;
    }
}

/// The sealed header of a record's payload: its epoch and counter.
fn header(sealed: &[u8]) -> Option<([u8; 16], u64)> {
    let epoch = <[u8; 16]>::try_from(sealed.get(..16)?).ok()?;
    let counter = u64::from_be_bytes(sealed.get(16..24)?.try_into().ok()?);
    Some((epoch, counter))
}

/// The windows of the epochs opened most recently (see the module's documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenedWindows {
    /// Oldest first.
    epochs: VecDeque<Window>,
    /// Every stored message up to this stream sequence went through the sink.
    through: u64,
}

impl OpenedWindows {
    /// Whether a record with sealed payload `sealed` opened already (its counter is in its
    /// epoch's window, or too far behind it): a copy.
    pub fn covers(&self, sealed: &[u8]) -> bool {
        let Some((epoch, counter)) = header(sealed) else {
            return false;
        };
        self.epochs
            .iter()
            .any(|w| w.epoch == epoch && w.covers(counter))
    }

    /// A record with sealed payload `sealed` opened.
    pub fn mark(&mut self, sealed: &[u8]) {
        let Some((epoch, counter)) = header(sealed) else {
            return;
        };
        let mut w = match self.epochs.iter().position(|w| w.epoch == epoch) {
            Some(i) => self.epochs.remove(i).unwrap_or_else(|| unreachable!()),
            None => Window {
                epoch,
                top: counter,
                bits: [0; WORDS],
            },
        };
        w.mark(counter);
        self.epochs.push_back(w);
        while self.epochs.len() > EPOCHS {
            self.epochs.pop_front();
        }
    }

    /// The stream sequence up to which every stored message the consumer delivered went
    /// through the sink when these windows were written (they are written before those
    /// messages are acknowledged): a consumer made afresh (the last one lost between its
    /// delete and its make, or by the server) starts after it, not where the oldest run the
    /// keys name began, so it does not read up to nine runs again with only the windows
    /// between their frames and the sink.
    pub fn through(&self) -> u64 {
        self.through
    }

    /// Everything up to stream sequence `seq` went through the sink.
    pub fn handle_through(&mut self, seq: u64) {
        self.through = self.through.max(seq);
    }

    /// Epochs kept.
    pub fn len(&self) -> usize {
        self.epochs.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.epochs.is_empty()
    }

    /// The bytes kept in the home: `nddopen2`, the number of epochs (u32 BE),
    /// [`OpenedWindows::through`] (u64), each epoch's `epoch (16) ‖ top (u64) ‖ 17 words
    /// (u64)`, then a check (u64), all big-endian. (`nddopen1`, without `through`, is read
    /// too.)
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MAGIC.len() + 12 + self.epochs.len() * 160 + 8);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&(self.epochs.len() as u32).to_be_bytes());
        b.extend_from_slice(&self.through.to_be_bytes());
        for w in &self.epochs {
            b.extend_from_slice(&w.epoch);
            b.extend_from_slice(&w.top.to_be_bytes());
            for x in w.bits {
                b.extend_from_slice(&x.to_be_bytes());
            }
        }
        let check = check(&b);
        b.extend_from_slice(&check.to_be_bytes());
        b
    }

    /// `None` unless `b` is one whole encoding (a torn or foreign file keeps nothing).
    pub fn parse(b: &[u8]) -> Option<OpenedWindows> {
        let (body, tail) = b.split_at_checked(b.len().checked_sub(8)?)?;
        if check(body) != u64::from_be_bytes(tail.try_into().ok()?) {
            return None;
        }
        let (rest, v2) = match body.strip_prefix(MAGIC) {
            Some(r) => (r, true),
            None => (body.strip_prefix(MAGIC_V1)?, false),
        };
        let n = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let (through, rest) = if v2 {
            let t = u64::from_be_bytes(rest.get(4..12)?.try_into().ok()?);
            (t, &rest[12..])
        } else {
            (0, &rest[4..])
        };
        const ONE: usize = 16 + 8 + WORDS * 8;
        if n > EPOCHS || rest.len() != n * ONE {
            return None;
        }
        let u = |b: &[u8]| u64::from_be_bytes(b.try_into().unwrap_or_default());
        let epochs = rest
            .chunks_exact(ONE)
            .map(|c| {
                let mut bits = [0u64; WORDS];
                for (i, x) in bits.iter_mut().enumerate() {
                    *x = u(&c[24 + i * 8..32 + i * 8]);
                }
                Window {
                    epoch: c[..16].try_into().unwrap_or_default(),
                    top: u(&c[16..24]),
                    bits,
                }
            })
            .collect();
        Some(OpenedWindows { epochs, through })
    }
}

fn check(b: &[u8]) -> u64 {
    b.iter().fold(0x6e64_646f_7065_6e31u64, |h, &x| {
        (h ^ u64::from(x))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(23)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(epoch: u8, counter: u64) -> Vec<u8> {
        let mut b = vec![epoch; 16];
        b.extend_from_slice(&counter.to_be_bytes());
        b.extend_from_slice(&[0xAA; 20]);
        b
    }

    #[test]
    fn what_opened_is_covered_and_nothing_else_and_far_behind_is_too_old() {
        let mut w = OpenedWindows::default();
        for c in [0, 1, 5, 3] {
            w.mark(&sealed(1, c));
        }
        for c in [0, 1, 3, 5] {
            assert!(w.covers(&sealed(1, c)), "{c}");
        }
        for c in [2, 4, 6, 1000] {
            assert!(!w.covers(&sealed(1, c)), "{c}");
        }
        assert!(!w.covers(&sealed(2, 0)), "another epoch");
        assert!(!w.covers(&[1; 10]), "too short for a header");
        // The window slides: far behind the top is a copy (it would not open either).
        w.mark(&sealed(1, 5000));
        assert!(w.covers(&sealed(1, 5000 - WINDOW)));
        assert!(!w.covers(&sealed(1, 5000 - WINDOW + 1)));
        assert!(w.covers(&sealed(1, 2)), "below the window");
        // A slide of more than the whole bitmap forgets the words it passes: 90 and 4250 share
        // a word and a bit.
        let mut v = OpenedWindows::default();
        v.mark(&sealed(3, 90));
        v.mark(&sealed(3, 90 + 64 * WORDS as u64 + 10));
        assert!(!v.covers(&sealed(3, 4250)));
        assert!(v.covers(&sealed(3, 90)), "too old by now");
    }

    #[test]
    fn the_most_recent_epochs_are_kept_and_survive_their_encoding() {
        let mut w = OpenedWindows::default();
        for e in 0..(EPOCHS as u8 + 3) {
            w.mark(&sealed(e, u64::from(e) * 7));
        }
        assert_eq!(w.len(), EPOCHS);
        assert!(!w.covers(&sealed(0, 0)), "the oldest epochs are forgotten");
        assert!(w.covers(&sealed(EPOCHS as u8 + 2, (EPOCHS as u64 + 2) * 7)));
        // Marking an epoch again makes it the newest.
        w.mark(&sealed(3, 100));
        w.mark(&sealed(200, 1));
        assert!(w.covers(&sealed(3, 21)));
        let b = w.encode();
        assert_eq!(OpenedWindows::parse(&b), Some(w.clone()));
        // Torn, altered, foreign or empty bytes keep nothing.
        assert_eq!(OpenedWindows::parse(&b[..b.len() - 1]), None);
        let mut x = b.clone();
        x[30] ^= 1;
        assert_eq!(OpenedWindows::parse(&x), None);
        assert_eq!(OpenedWindows::parse(b"nddopen2"), None);
        assert_eq!(OpenedWindows::parse(&[]), None);
        assert_eq!(
            OpenedWindows::parse(&OpenedWindows::default().encode()),
            Some(OpenedWindows::default())
        );
    }

    #[test]
    fn through_survives_the_encoding_and_the_first_version_still_reads() {
        let mut w = OpenedWindows::default();
        w.mark(&sealed(1, 5));
        w.handle_through(40);
        w.handle_through(12);
        assert_eq!(w.through(), 40, "never back");
        let back = OpenedWindows::parse(&w.encode()).unwrap();
        assert_eq!(back.through(), 40);
        assert!(back.covers(&sealed(1, 5)));
        // A file an earlier ndd wrote (`nddopen1`, no `through`): its windows, through 0.
        let mut v1 = MAGIC_V1.to_vec();
        v1.extend_from_slice(&1u32.to_be_bytes());
        let v2 = w.encode();
        v1.extend_from_slice(&v2[MAGIC.len() + 12..v2.len() - 8]);
        let c = check(&v1);
        v1.extend_from_slice(&c.to_be_bytes());
        let old = OpenedWindows::parse(&v1).unwrap();
        assert_eq!(old.through(), 0);
        assert!(old.covers(&sealed(1, 5)));
    }
}
