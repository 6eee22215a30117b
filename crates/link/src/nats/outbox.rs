//! The publishing half of one fan-out stream (sans-IO): what a source's sealed frames become
//! on the server, and the JetStream bookkeeping that makes a reliable stream exact.
//!
//! - Every frame becomes a [`FrameRecord`] naming the device run it is sealed for and its
//!   position on its subject (`wseq`, per subject, from 0 in each run).
//! - A stored (JetStream) frame gets a message id that is the same in every copy
//!   (`run-stream-seq-part`, the part empty unless the stream is split, then `-a<sender>` for an app side, `-k<n>` after the n-th key
//!   rotation): the server drops a copy of an id it has stored within its duplicate window.
//! - Every stored publish waits for its acknowledgement; one that fails (the connection went,
//!   the server or the cluster's leader changed, the ack timed out) is published again with
//!   the same id after a backoff of its own, 50 ms doubling to 2 s, as soon as it fails: a
//!   failed publish never waits behind the ones after it (found by the three-node cluster
//!   test: a publish failed at a node's kill was retried only once 256 later ones were
//!   outstanding, stored more than 10 s behind them, and the app sides gave up waiting for it).
//! - After a reconnect, everything of the last [`REPUBLISH_WINDOW`] (at most
//!   [`REPUBLISH_BYTES`]) goes again, in order, before anything new: a server that died may
//!   have acknowledged messages it had not written yet.
//! - An app side keeps its reliable frames of the last [`KEPT_WINDOW`] as they were before
//!   sealing (`K`),
//!   with the stream sequence the server gave each: after a key rotation the ones stored after
//!   it go again under the new key ([`Outbox::rotate`]).
//!
//! The driver hands each [`Publish`] to the client, feeds its acknowledgement back
//! ([`Outbox::handle_ack`]), a reconnect ([`Outbox::handle_reconnect`]) and the time
//! ([`Outbox::handle_timeout`]); it waits while [`Outbox::in_flight`] is over its limit.

use super::record::FrameRecord;
use super::runs::Run;
use bytes::Bytes;
use ndd_core::Frame;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// How far back a publisher sends again after a reconnect.
pub const REPUBLISH_WINDOW: Duration = Duration::from_secs(5);
/// How long an app side keeps its reliable frames as they were before sealing, to seal them
/// again after a rotation it hears of late (at most [`REPUBLISH_BYTES`] of them): a rotation's
/// notice may be lost, and the next one comes [`super::follow::NOTICE_EVERY`] later (found by
/// `testkit/tests/nats_keys.rs` with notices lost: frames sealed under the rotated key were
/// no longer kept when the side heard of it, and lost).
pub const KEPT_WINDOW: Duration = Duration::from_secs(60);
/// At most this much of it.
pub const REPUBLISH_BYTES: usize = 64 << 20;
/// The first wait before a failed publish goes again; it doubles up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_millis(50);
/// The longest wait before a failed publish goes again.
pub const RETRY_MAX: Duration = Duration::from_secs(2);

/// The message of sealed `frame` of `run`, `wseq`-th on its subject: the record header goes
/// into the frame's headroom, the payload is not copied.
pub fn record(mut frame: Frame, run: Run, wseq: u64) -> Bytes {
    let header = FrameRecord {
        stream: frame.meta.stream,
        flags: frame.meta.flags,
        run: run.id,
        began: run.began,
        seq: frame.meta.seq,
        timestamp_ns: frame.meta.timestamp_ns,
        wseq,
        payload: Bytes::new(),
    }
    .header();
    frame.push_header(&header);
    frame.into_bytes()
}

/// A message for the server: `id` set for a stored one (its acknowledgement comes back with
/// `token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// Names this publish in [`Outbox::handle_ack`].
    pub token: u64,
    /// The subject.
    pub subject: String,
    /// The JetStream message id (stored frames only).
    pub id: Option<String>,
    /// The record.
    pub body: Bytes,
}

/// Items of the last `window`, at most [`REPUBLISH_BYTES`] of them, oldest first.
#[derive(Debug)]
struct Recent<T> {
    items: VecDeque<(Instant, usize, T)>,
    bytes: usize,
    window: Duration,
}

impl<T> Recent<T> {
    fn new(window: Duration) -> Recent<T> {
        Recent {
            items: VecDeque::new(),
            bytes: 0,
            window,
        }
    }

    fn push(&mut self, now: Instant, len: usize, item: T) {
        self.bytes += len;
        self.items.push_back((now, len, item));
        while self.items.front().is_some_and(|(t, ..)| {
            now.saturating_duration_since(*t) > self.window || self.bytes > REPUBLISH_BYTES
        }) {
            if let Some((_, n, _)) = self.items.pop_front() {
                self.bytes -= n;
            }
        }
    }

    /// Drops the items `gone` names.
    fn forget(&mut self, gone: impl Fn(&T) -> bool) {
        let mut freed = 0;
        self.items.retain(|(_, n, x)| {
            let keep = !gone(x);
            if !keep {
                freed += n;
            }
            keep
        });
        self.bytes -= freed;
    }

    fn take(&mut self) -> Vec<T> {
        self.bytes = 0;
        self.items.drain(..).map(|(_, _, x)| x).collect()
    }
}

/// A frame an app side stored, as it was before sealing.
#[derive(Debug)]
struct Kept<K> {
    id: String,
    stored: Option<u64>,
    item: K,
}

/// A stored publish waiting for its acknowledgement.
#[derive(Debug)]
struct Pending {
    subject: String,
    id: String,
    body: Bytes,
    /// Failures so far (the backoff doubles with each).
    tries: u32,
    /// The token of its latest attempt (a failure of an earlier one is stale).
    attempt: u64,
    /// Whether it waits in the queue.
    queued: bool,
    /// When its next try is due, after a failure.
    retry_at: Option<Instant>,
    /// Whether it went more than once (after a failure, a reconnect, or again from the
    /// window a reconnect sends).
    again: bool,
}

/// What one source stream publishes, and what is still owed of it.
#[derive(Debug)]
pub struct Outbox<K> {
    stream: u16,
    run: Run,
    /// Whether frames are stored (JetStream) rather than on core NATS.
    stored: bool,
    /// App side: this process's own id in its message ids (many app sides publish on one up
    /// subject with the same frame numbers).
    sender: Option<u64>,
    rotations: u32,
    /// Message ids are an HMAC of what names the frame under a key derived from the run key
    /// ([`Outbox::set_id_key`]): JetStream drops a publish whose id it already holds, on any
    /// subject of the stream, and anyone who may publish could otherwise store messages under
    /// the ids coming next and have genuine frames and ENDs dropped as copies (found by a
    /// review: the run id, stream and frame number are in every record header).
    id_key: Option<ring::hmac::Key>,
    /// Next subject sequence, per subject.
    wseq: HashMap<String, u64>,
    next_token: u64,
    /// Stored publishes not yet acknowledged, by key (in publishing order).
    pending: BTreeMap<u64, Pending>,
    /// Each attempt's token → its publish's key.
    attempts: HashMap<u64, u64>,
    /// Pending publishes by message id.
    by_id: HashMap<String, u64>,
    /// Failed ones waiting for their next try: (when, key).
    retries: BTreeSet<(Instant, u64)>,
    /// To be handed to the client, in order (keys).
    queue: VecDeque<u64>,
    /// Core NATS messages to hand out (no acknowledgement).
    unstored: VecDeque<Publish>,
    /// What went out lately: (subject, id, body).
    recent: Recent<(String, String, Bytes)>,
    kept: Option<Recent<Kept<K>>>,
    /// Publishes that failed and went again.
    pub retried: u64,
    /// Messages published again after a reconnect.
    pub republished: u64,
}

impl<K> Outbox<K> {
    /// The outbox of stream `stream` sealed for `run`; `stored`: a reliable stream on
    /// JetStream; `sender`: an app side's own id; `keep`: keep frames before sealing for a
    /// rotation (an app side's reliable streams).
    pub fn new(stream: u16, run: Run, stored: bool, sender: Option<u64>, keep: bool) -> Outbox<K> {
        Outbox {
            stream,
            run,
            stored,
            sender,
            rotations: 0,
            id_key: None,
            wseq: HashMap::new(),
            next_token: 0,
            pending: BTreeMap::new(),
            attempts: HashMap::new(),
            by_id: HashMap::new(),
            retries: BTreeSet::new(),
            queue: VecDeque::new(),
            unstored: VecDeque::new(),
            recent: Recent::new(REPUBLISH_WINDOW),
            kept: (keep && stored).then(|| Recent::new(KEPT_WINDOW)),
            retried: 0,
            republished: 0,
        }
    }

    /// Message ids from now on are hidden under a key derived from `run_key` (the one frames
    /// are sealed under): the same frame gets the same id (a publish again is a copy to
    /// JetStream), and nobody without the key can tell the next one.
    pub fn set_id_key(&mut self, run_key: &[u8; 32]) {
        let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, run_key);
        let derived = ring::hmac::sign(&k, b"ndd nats message id v1");
        self.id_key = Some(ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            derived.as_ref(),
        ));
    }

    /// The run frames are sealed for.
    pub fn run(&self) -> Run {
        self.run
    }

    /// Whether frames before sealing are kept (see [`Outbox::keep`]).
    pub fn keeps(&self) -> bool {
        self.kept.is_some()
    }

    /// Stops keeping frames (the key can no longer rotate).
    pub fn stop_keeping(&mut self) {
        self.kept = None;
    }

    /// The subject sequence the next record on `subject` carries: a frame is sealed with it in
    /// front ([`super::record`]), then published on that subject.
    pub fn next_wseq(&self, subject: &str) -> u64 {
        self.wseq.get(subject).copied().unwrap_or(0)
    }

    /// The record of sealed `frame`, next on `subject`.
    pub fn record(&mut self, subject: &str, frame: Frame) -> Bytes {
        // No allocation per frame: the subject's key is made once.
        let wseq = match self.wseq.get_mut(subject) {
            Some(c) => {
                *c += 1;
                *c - 1
            }
            None => {
                self.wseq.insert(subject.to_string(), 1);
                0
            }
        };
        record(frame, self.run, wseq)
    }

    /// Sealed `frame` on `subject` (`part`: its part of a split stream): a [`Publish`] to
    /// poll; its message id when stored.
    pub fn publish(
        &mut self,
        now: Instant,
        subject: &str,
        part: Option<u16>,
        frame: Frame,
    ) -> Option<String> {
        let seq = frame.meta.seq;
        let body = self.record(subject, frame);
        if !self.stored {
            let token = self.token();
            self.unstored.push_back(Publish {
                token,
                subject: subject.to_string(),
                id: None,
                body,
            });
            return None;
        }
        let part = part.map(|p| p.to_string()).unwrap_or_default();
        let mut id = format!("{:x}-{}-{}-{part}", self.run.id, self.stream, seq);
        if let Some(me) = self.sender {
            id.push_str(&format!("-a{me:x}"));
        }
        if self.rotations > 0 {
            id.push_str(&format!("-k{}", self.rotations));
        }
        if let Some(k) = &self.id_key {
            let tag = ring::hmac::sign(k, id.as_bytes());
            let mut first = [0u8; 16];
            first.copy_from_slice(&tag.as_ref()[..16]);
            id = format!("{:032x}", u128::from_be_bytes(first));
        }
        self.recent.push(
            now,
            body.len(),
            (subject.to_string(), id.clone(), body.clone()),
        );
        self.send(subject.to_string(), id.clone(), body, false);
        Some(id)
    }

    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.next_token
    }

    fn send(&mut self, subject: String, id: String, body: Bytes, again: bool) {
        if let Some(&key) = self.by_id.get(&id) {
            // Still waiting for its acknowledgement: it goes again now (a reconnect).
            self.requeue(key);
            return;
        }
        let key = self.token();
        self.by_id.insert(id.clone(), key);
        self.pending.insert(
            key,
            Pending {
                subject,
                id,
                body,
                tries: 0,
                attempt: 0,
                queued: true,
                retry_at: None,
                again,
            },
        );
        self.queue.push_back(key);
    }

    fn requeue(&mut self, key: u64) {
        if let Some(p) = self.pending.get_mut(&key) {
            p.again = true;
            if let Some(t) = p.retry_at.take() {
                self.retries.remove(&(t, key));
            }
            if !p.queued {
                p.queued = true;
                self.queue.push_back(key);
            }
        }
    }

    /// Notes frame `item` as it was before sealing, published as `id`.
    pub fn keep(&mut self, now: Instant, id: String, len: usize, item: K) {
        if let Some(kept) = self.kept.as_mut() {
            kept.push(
                now,
                len,
                Kept {
                    id,
                    stored: None,
                    item,
                },
            );
        }
    }

    /// The next message for the client.
    pub fn poll_transmit(&mut self) -> Option<Publish> {
        if let Some(p) = self.unstored.pop_front() {
            return Some(p);
        }
        while let Some(key) = self.queue.pop_front() {
            self.next_token += 1;
            let token = self.next_token;
            if let Some(p) = self.pending.get_mut(&key) {
                p.queued = false;
                p.attempt = token;
                self.attempts.insert(token, key);
                return Some(Publish {
                    token,
                    subject: p.subject.clone(),
                    id: Some(p.id.clone()),
                    body: p.body.clone(),
                });
            }
        }
        None
    }

    /// The server's answer to publish `token`: `Ok(stream sequence)` stored; `Err(())` not
    /// (the publish could not be sent, or its acknowledgement failed or timed out): it goes
    /// again after its backoff. A failure of an attempt that was made again since is stale.
    pub fn handle_ack(&mut self, now: Instant, token: u64, result: Result<u64, ()>) {
        let Some(key) = self.attempts.remove(&token) else {
            return;
        };
        match result {
            Ok(sequence) => {
                let Some(p) = self.pending.remove(&key) else {
                    return;
                };
                self.by_id.remove(&p.id);
                if p.again {
                    // Stored only now, after it went again: a server that restarts before it
                    // wrote it loses it as it loses the last moments' publishes, so it goes
                    // with the window sent again after a reconnect, from now (found by
                    // `testkit/tests/nats_publish.rs` over 10 000 and 20 000 schedules: a
                    // frame sent again through an outage, stored just before a restart, was
                    // never sent again and its place given up after 30 s).
                    self.recent.forget(|(_, id, _)| *id == p.id);
                    self.recent.push(
                        now,
                        p.body.len(),
                        (p.subject.clone(), p.id.clone(), p.body.clone()),
                    );
                }
                if let Some(k) = self
                    .kept
                    .as_mut()
                    .and_then(|k| k.items.iter_mut().rev().find(|(_, _, k)| k.id == p.id))
                {
                    k.2.stored = Some(sequence);
                }
            }
            Err(()) => {
                let Some(p) = self.pending.get_mut(&key) else {
                    return;
                };
                if p.attempt != token || p.queued {
                    return;
                }
                let wait = RETRY_FIRST
                    .saturating_mul(1u32 << p.tries.min(16))
                    .min(RETRY_MAX);
                p.tries += 1;
                p.retry_at = Some(now + wait);
                self.retries.insert((now + wait, key));
            }
        }
    }

    /// The connection to the server was made again: the last few seconds go again, in
    /// order, before anything new (they stay recent: another reconnect sends them again).
    pub fn handle_reconnect(&mut self) {
        if !self.stored {
            return;
        }
        for key in std::mem::take(&mut self.queue) {
            if let Some(p) = self.pending.get_mut(&key) {
                p.queued = false;
            }
        }
        let again: Vec<(String, String, Bytes)> = self
            .recent
            .items
            .iter()
            .map(|(_, _, x)| x.clone())
            .collect();
        let recent: std::collections::HashSet<&str> =
            again.iter().map(|(_, id, _)| id.as_str()).collect();
        // Older ones still waiting go first, then the window in order.
        let older: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| !recent.contains(p.id.as_str()))
            .map(|(k, _)| *k)
            .collect();
        for key in older {
            self.requeue(key);
        }
        for (subject, id, body) in again {
            self.republished += 1;
            self.send(subject, id, body, true);
        }
    }

    /// When a failed publish is due again.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.retries.first().map(|(t, _)| *t)
    }

    /// Failed publishes whose backoff is over are queued again.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(t, key)) = self.retries.first() {
            if t > now {
                break;
            }
            self.retries.pop_first();
            if let Some(p) = self.pending.get_mut(&key) {
                p.retry_at = None;
            }
            if self.pending.get(&key).is_some_and(|p| !p.queued) {
                self.retried += 1;
                self.requeue(key);
            }
        }
    }

    /// Stored publishes not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Whether everything published was acknowledged (and nothing waits to be handed out).
    pub fn is_settled(&self) -> bool {
        self.pending.is_empty() && self.unstored.is_empty()
    }

    /// A key rotation (the new key drawn when the device's stream stood at `since`) or a new
    /// device run: frames are sealed for `run` from now on; the kept frames stored after
    /// `since` (or not known to be stored) come back, oldest first, to be sealed under the
    /// new key and published again. Call once everything is acknowledged
    /// ([`Outbox::is_settled`]), so each kept frame's stream sequence is known.
    pub fn rotate(&mut self, run: Run, since: u64) -> Vec<K> {
        self.run = run;
        let Some(kept) = self.kept.as_mut().filter(|k| !k.items.is_empty()) else {
            return Vec::new();
        };
        self.rotations += 1;
        kept.take()
            .into_iter()
            .filter(|k| k.stored.is_none_or(|s| s > since))
            .map(|k| k.item)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndd_core::Meta;

    fn frame(seq: u64) -> Frame {
        let meta = Meta {
            stream: 3,
            seq,
            timestamp_ns: 9,
            flags: 0,
        };
        Frame::new(meta, b"sealed")
    }

    const RUN: Run = Run { id: 0xab, began: 4 };

    fn drain<K>(o: &mut Outbox<K>) -> Vec<Publish> {
        std::iter::from_fn(|| o.poll_transmit()).collect()
    }

    #[test]
    fn records_name_the_run_and_number_each_subject_from_zero() {
        let mut o: Outbox<()> = Outbox::new(3, RUN, false, None, false);
        assert_eq!(o.publish(Instant::now(), "s.a", None, frame(7)), None);
        o.publish(Instant::now(), "s.b", None, frame(8));
        o.publish(Instant::now(), "s.a", None, frame(9));
        let p = drain(&mut o);
        let recs: Vec<FrameRecord> = p
            .iter()
            .map(|p| FrameRecord::parse(&p.body).unwrap())
            .collect();
        assert_eq!(
            recs.iter().map(|r| (r.seq, r.wseq)).collect::<Vec<_>>(),
            vec![(7, 0), (8, 0), (9, 1)]
        );
        assert!(recs
            .iter()
            .all(|r| r.run == 0xab && r.began == 4 && &r.payload[..] == b"sealed"));
        assert!(p.iter().all(|p| p.id.is_none()));
        assert!(o.is_settled(), "core NATS waits for no acknowledgement");
    }

    #[test]
    fn message_ids_under_the_run_key_are_stable_per_frame_and_tell_nothing() {
        let t = Instant::now();
        let ids = |key: Option<[u8; 32]>| -> Vec<String> {
            let mut o: Outbox<()> = Outbox::new(3, RUN, true, Some(0x11), false);
            if let Some(k) = key {
                o.set_id_key(&k);
            }
            (0..3)
                .map(|s| o.publish(t, "s.r", Some(1), frame(s)).unwrap())
                .collect()
        };
        let plain = ids(None);
        assert_eq!(plain[1], "ab-3-1-1-a11");
        let hidden = ids(Some([5; 32]));
        assert_eq!(hidden, ids(Some([5; 32])), "the same frame, the same id");
        assert_ne!(hidden, ids(Some([6; 32])), "another key, other ids");
        assert!(hidden
            .iter()
            .all(|i| i.len() == 32 && i.chars().all(|c| c.is_ascii_hexdigit())));
        assert!(hidden.iter().all(|i| !plain.contains(i)));
    }

    #[test]
    fn a_failed_publish_goes_again_after_its_own_backoff_not_behind_later_ones() {
        let t = Instant::now();
        let mut o: Outbox<()> = Outbox::new(3, RUN, true, Some(0x11), false);
        let ids: Vec<_> = (0..300)
            .map(|s| o.publish(t, "s.r", Some(1), frame(s)).unwrap())
            .collect();
        assert_eq!(ids[5], "ab-3-5-1-a11");
        let sent = drain(&mut o);
        assert_eq!(sent.len(), 300);
        assert_eq!(o.in_flight(), 300);
        // The first fails while 299 later ones are outstanding: it is due again at once.
        o.handle_ack(t, sent[0].token, Err(()));
        assert_eq!(o.poll_timeout(), Some(t + RETRY_FIRST));
        o.handle_timeout(t + RETRY_FIRST);
        let again = drain(&mut o);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].id, sent[0].id, "the same message id");
        assert_eq!(again[0].body, sent[0].body);
        // Fails again: twice the wait.
        o.handle_ack(t, again[0].token, Err(()));
        assert_eq!(o.poll_timeout(), Some(t + RETRY_FIRST * 2));
        o.handle_timeout(t + RETRY_FIRST * 2);
        let third = drain(&mut o);
        for p in sent.iter().skip(1).chain(&third) {
            o.handle_ack(t, p.token, Ok(p.token));
        }
        assert!(o.is_settled());
        assert_eq!(o.retried, 2);
    }

    #[test]
    fn a_publish_stored_only_after_it_went_again_is_in_the_window_from_then() {
        let t = Instant::now();
        let mut o: Outbox<()> = Outbox::new(3, RUN, true, None, false);
        o.publish(t, "s.r", None, frame(0));
        let first = drain(&mut o);
        // A reconnect 6 s later (the first attempt's answer never came): it goes again …
        let t6 = t + Duration::from_secs(6);
        o.handle_reconnect();
        let again = drain(&mut o);
        assert_eq!(again.len(), 1);
        // … and is stored now; the stale failure of the first attempt changes nothing.
        o.handle_ack(t6, again[0].token, Ok(5));
        o.handle_ack(t6, first[0].token, Err(()));
        assert!(o.is_settled());
        o.publish(t6, "s.r", None, frame(1));
        let one = drain(&mut o);
        o.handle_ack(t6, one[0].token, Ok(6));
        // The server restarts before it wrote them: the next reconnect sends both again,
        // 0 although it was first published more than the window ago.
        o.handle_reconnect();
        let ids: Vec<_> = drain(&mut o)
            .iter()
            .map(|p| p.id.clone().unwrap())
            .collect();
        assert_eq!(ids, vec!["ab-3-0-", "ab-3-1-"]);
    }

    #[test]
    fn a_reconnect_sends_the_recent_frames_again_in_order_before_anything_new() {
        let t = Instant::now();
        let mut o: Outbox<()> = Outbox::new(3, RUN, true, None, false);
        o.publish(t, "s.r", None, frame(0));
        let old = drain(&mut o);
        o.handle_ack(t, old[0].token, Ok(1));
        let t6 = t + Duration::from_secs(6);
        o.publish(t6, "s.r", None, frame(1));
        let one = drain(&mut o);
        o.handle_ack(t6, one[0].token, Ok(2));
        o.publish(t6, "s.r", None, frame(2));
        let two = drain(&mut o);
        o.publish(t6, "s.r", None, frame(3));
        o.handle_reconnect();
        let again = drain(&mut o);
        let ids: Vec<_> = again.iter().map(|p| p.id.clone().unwrap()).collect();
        assert_eq!(
            ids,
            vec!["ab-3-1-", "ab-3-2-", "ab-3-3-"],
            "0 is older than the window; 1 was stored (it goes again), 2 waits for its \
             acknowledgement (it goes again once), 3 was not sent yet (it goes once)"
        );
        assert_eq!(o.in_flight(), 3);
        // The failure of 2's attempt before the reconnect is stale: no retry of its own.
        o.handle_ack(t6, two[0].token, Err(()));
        assert_eq!(o.poll_timeout(), None);
        for p in &again {
            o.handle_ack(t6, p.token, Ok(9));
        }
        assert!(o.is_settled());
    }

    #[test]
    fn a_rotation_gives_back_the_kept_frames_stored_after_it() {
        let t = Instant::now();
        let mut o: Outbox<u64> = Outbox::new(3, RUN, true, Some(1), true);
        for s in 0..4 {
            let id = o.publish(t, "s.up", None, frame(s)).unwrap();
            o.keep(t, id, 6, s);
        }
        for (i, p) in drain(&mut o).into_iter().enumerate() {
            o.handle_ack(t, p.token, Ok(10 + i as u64));
        }
        let next = Run {
            id: 0xac,
            began: 20,
        };
        assert_eq!(
            o.rotate(next, 11),
            vec![2, 3],
            "stored at 12 and 13, after 11"
        );
        assert_eq!(o.run(), next);
        let id = o.publish(t, "s.up", None, frame(2)).unwrap();
        assert_eq!(id, "ac-3-2--a1-k1", "a new id after the rotation");
        assert!(o.rotate(next, 0).is_empty(), "nothing kept since");
    }
}
