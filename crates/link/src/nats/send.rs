//! One fan-out stream's sending half (sans-IO): its [`Outbox`] (records, message ids,
//! acknowledgements, retries, the window sent again after a reconnect) and the group key it
//! seals under, with the rules between them that the binary's publishers and the simulations
//! once each wrote out:
//!
//! - every frame is sealed under the run key as it stands, bound to the subject sequence its
//!   record will carry (a receiver keeps the sender's order, not one written into a header);
//! - a reliable frame an app side publishes is kept as it was before sealing, to be sealed
//!   again after a rotation or a device restart;
//! - new keys are followed only once every publish is acknowledged (so each kept frame's
//!   stream sequence is known), and then what the device no longer opens
//!   ([`GroupKey::resend_after`]) comes back to be sealed and published again under them.
//!
//! The driver hands frames and keys in, takes [`Publish`](crate::nats::outbox::Publish)es out of [`Sender::outbox`] for
//! the broker and feeds its acknowledgements back there.

use super::keys::GroupKey;
use super::outbox::Outbox;
use bytes::Bytes;
use ndd_core::{Frame, ModuleError, Output};
use std::time::Instant;

/// A sealing half under one run key (the `encrypt` pair's forward half in [`crate::nats::drive`]).
pub trait RunSeal: Sized {
    /// The half under `key` (a run key).
    fn under(key: [u8; 32]) -> Result<Self, ModuleError>;
    /// Seals `frame` bound to subject sequence `wseq` (the `encrypt` pair's `seal_bound`)
    /// into `out`.
    fn seal(&mut self, frame: Frame, wseq: u64, out: &mut Output) -> Result<(), ModuleError>;
}

/// What following new keys takes.
#[derive(Debug, PartialEq, Eq)]
pub enum Follow<K> {
    /// Nothing to seal again (the run key is the same; the keys are taken).
    Same,
    /// Publishes wait for their acknowledgement: follow again once [`Outbox::is_settled`].
    Settle,
    /// The keys are taken; these kept frames are to be sealed and published again (with
    /// [`Sender::send`], kept again), before anything new.
    Again(Vec<K>),
}

/// One source stream's sending half (see the module's documentation); `K` is a frame as it
/// was before sealing, `S` the half that seals under a run key.
pub struct Sender<S, K> {
    keys: GroupKey,
    seal: S,
    /// The stream's outbox: what goes to the broker, and its acknowledgements.
    pub outbox: Outbox<K>,
    out: Output,
}

impl<S, K> std::fmt::Debug for Sender<S, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("keys", &self.keys)
            .field("in_flight", &self.outbox.in_flight())
            .finish_non_exhaustive()
    }
}

impl<S: RunSeal, K> Sender<S, K> {
    /// The sending half of stream `stream` under `keys`; `stored`, `sender` and `keep` as
    /// [`Outbox::new`].
    pub fn new(
        stream: u16,
        keys: GroupKey,
        stored: bool,
        sender: Option<u64>,
        keep: bool,
    ) -> Result<Self, ModuleError> {
        let mut outbox = Outbox::new(stream, keys.run, stored, sender, keep);
        outbox.set_id_key(&keys.run_key());
        Ok(Sender {
            keys,
            seal: S::under(keys.run_key())?,
            outbox,
            out: Output::new(),
        })
    }

    /// The keys it seals under.
    pub fn keys(&self) -> GroupKey {
        self.keys
    }

    /// Seals `frame` for `subject` (`part`: its part of a split stream) and publishes it; with
    /// `keep` (the frame before sealing, and its length) a stored one is kept to be sealed
    /// again after a rotation. Its message id (stored frames), and the sealed frame's length.
    pub fn send(
        &mut self,
        now: Instant,
        subject: &str,
        part: Option<u16>,
        frame: Frame,
        keep: Option<(usize, K)>,
    ) -> Result<(Option<String>, usize), ModuleError> {
        let wseq = self.outbox.next_wseq(subject);
        self.seal.seal(frame, wseq, &mut self.out)?;
        let (mut id, mut len) = (None, 0);
        for f in self.out.take_frames() {
            len += f.len();
            id = self.outbox.publish(now, subject, part, f);
        }
        if let (Some(id), Some((n, item))) = (&id, keep) {
            self.outbox.keep(now, id.clone(), n, item);
        }
        Ok((id, len))
    }

    /// `frame` sealed for `subject` as a record that does not go through the outbox (the END
    /// every round-robin member hears on core NATS).
    pub fn record(&mut self, subject: &str, frame: Frame) -> Result<Option<Bytes>, ModuleError> {
        let wseq = self.outbox.next_wseq(subject);
        self.seal.seal(frame, wseq, &mut self.out)?;
        Ok(self
            .out
            .take_frames()
            .pop()
            .map(|f| self.outbox.record(subject, f)))
    }

    /// Follows `keys` (a rotation, a join's answer naming a new run): see [`Follow`].
    pub fn follow(&mut self, keys: GroupKey) -> Result<Follow<K>, ModuleError> {
        let Some(after) = keys.resend_after(&self.keys) else {
            self.keys = keys;
            return Ok(Follow::Same);
        };
        if self.outbox.keeps() && !self.outbox.is_settled() {
            return Ok(Follow::Settle);
        }
        self.seal = S::under(keys.run_key())?;
        self.outbox.set_id_key(&keys.run_key());
        self.keys = keys;
        Ok(Follow::Again(self.outbox.rotate(keys.run, after)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nats::record::FrameRecord;
    use crate::nats::runs::Run;
    use crate::nats::toy::ToySeal as Toy;
    use ndd_core::Meta;

    const RUN: Run = Run { id: 7, began: 0 };

    fn frame(seq: u64) -> Frame {
        Frame::new(
            Meta {
                stream: 2,
                seq,
                timestamp_ns: 0,
                flags: 0,
            },
            b"x",
        )
    }

    fn sealed(p: &Publish) -> (u8, u64, u64) {
        let r = FrameRecord::parse(&p.body).unwrap();
        let wseq = u64::from_be_bytes(r.payload[1..9].try_into().unwrap());
        assert_eq!(
            wseq, r.wseq,
            "sealed bound to the record's subject sequence"
        );
        (r.payload[0], r.seq, r.wseq)
    }

    use crate::nats::outbox::Publish;

    #[test]
    fn frames_are_sealed_bound_in_order_and_new_keys_wait_for_the_acknowledgements() {
        let t = Instant::now();
        let k1 = GroupKey::first([1; 32], RUN);
        let k1_key = k1.run_key()[0];
        let mut s: Sender<Toy, u64> = Sender::new(2, k1, true, Some(9), true).unwrap();
        for n in 0..3 {
            let (id, len) = s.send(t, "up", None, frame(n), Some((1, n))).unwrap();
            assert!(id.is_some());
            assert_eq!(len, 1 + 8 + 1);
        }
        let sent: Vec<Publish> = std::iter::from_fn(|| s.outbox.poll_transmit()).collect();
        let seen: Vec<_> = sent.iter().map(sealed).collect();
        assert_eq!(seen, vec![(k1_key, 0, 0), (k1_key, 1, 1), (k1_key, 2, 2)]);
        // The same keys (where a rotation began coming in): nothing again.
        assert_eq!(s.follow(k1).unwrap(), Follow::Same);
        // A rotation that began after stream sequence 11: not followed while 2 wait.
        let mut k2 = GroupKey::first([2; 32], RUN);
        k2.previous = Some(k1.key);
        k2.since = 11;
        s.outbox.handle_ack(t, sent[0].token, Ok(10));
        assert_eq!(s.follow(k2).unwrap(), Follow::Settle);
        s.outbox.handle_ack(t, sent[1].token, Ok(12));
        s.outbox.handle_ack(t, sent[2].token, Ok(13));
        // Stored at 12 and 13, after it began: sealed again under the new run key.
        assert_eq!(s.follow(k2).unwrap(), Follow::Again(vec![1, 2]));
        assert_eq!(s.keys(), k2);
        s.send(t, "up", None, frame(1), Some((1, 1))).unwrap();
        let p = s.outbox.poll_transmit().unwrap();
        assert_eq!(sealed(&p), (k2.run_key()[0], 1, 3));
        // A device restart named by a join: from the new run's start.
        let k3 = k2.next_run(Run { id: 8, began: 20 });
        s.outbox.handle_ack(t, p.token, Ok(21));
        assert_eq!(s.follow(k3).unwrap(), Follow::Again(vec![1]));
    }
}
