//! Joining: the device side's join service and an app side's join and key follower.

use super::*;
use crate::nats::follow::{FollowEvent, FollowIo, Joined};
use crate::nats::join::HandOut;

/// The device's join service: the key exchange ([`Host`]) and the admission rules
/// ([`Admitter`]) driven on `P.D.join`; who is handed the key is noted in the home's holders file.
pub(super) struct JoinService {
    pub(super) ctx: Ctx,
    pub(super) local: LocalIdentity,
    pub(super) home: PathBuf,
    /// The group key as it stands (rotated by [`KeyKeeper`]).
    pub(super) key: watch::Receiver<GroupKey>,
    /// Who was handed it, and the split slots held.
    pub(super) files: Home,
    /// Shared with the ready heartbeats ([`serve_ready`]).
    pub(super) admitter: Shared<Admitter>,
    pub(super) expiry: Duration,
    /// The split slots held as written last (a driver that splits).
    pub(super) slots: Option<Vec<(u16, String)>>,
}

/// Join INITs a device side answers a second at most.
const JOIN_INITS_PER_S: u32 = 100;

impl JoinService {
    /// Answers the joins that come on `sub` (the join subject, subscribed to before this
    /// side's run began: see [`super::device::start`]).
    /// (The loop is the side's service itself: before, a task of its own, which went on
    /// answering after the side stopped its services, found by a review.)
    pub(super) async fn serve(mut self, mut sub: async_nats::Subscriber) -> Result<()> {
        let subject = self.ctx.subjects.join();
        let mut host = Host::new(self.expiry);
        let mut logs = ndd_core::RateLimit::with_burst(Duration::from_secs(1), 5);
        // Each INIT costs a key pair, an agreement and a signature, and anyone who may
        // publish can send thousands: at most this many a second are answered (as the
        // UDP link's 200); a FINISH needs an INIT answered before.
        let mut inits = ndd_core::RateLimit::with_burst(Duration::from_secs(1), JOIN_INITS_PER_S);
        let mut flood = ndd_core::RateLimit::new(Duration::from_secs(10));
        while let Some(m) = sub.next().await {
            let Some(reply) = m.reply.clone() else {
                continue;
            };
            if crate::nats::join::message_type(&m.payload) == Some(1)
                && inits.admit(Instant::now()).is_none()
            {
                if let Some(n) = flood.admit(Instant::now()) {
                    tracing::warn!(side = "device", suppressed = n, "more than {JOIN_INITS_PER_S} join requests a second on {subject}: the rest are not answered");
                }
                continue;
            }
            // Mid-rotation: an app side learns the new key with where it began. The keys
            // are taken here, before the app side is noted as a holder (`HandOut`).
            let Ok(keys) = self
                .key
                .wait_for(|k| k.since != SINCE_PENDING)
                .await
                .map(|k| *k)
            else {
                return Ok(());
            };
            let answer = self.answer(&mut host, &m.payload, keys, Instant::now());
            match answer {
                Ok(a) => {
                    let _ = self.ctx.client.publish(reply, a.into()).await;
                }
                Err(e) => {
                    if let Some(n) = logs.admit(Instant::now()) {
                        let more = if n > 0 {
                            format!(" ({n} more like it not shown)")
                        } else {
                            String::new()
                        };
                        tracing::warn!(side = "device", "rejected a join request: {e}{more}");
                    }
                }
            }
        }
        Ok(())
    }

    /// The answer to the join message `msg`, taken at `now` with the keys as they stood
    /// before (no rotation under way).
    pub(super) fn answer(
        &mut self,
        host: &mut Host,
        msg: &[u8],
        keys: GroupKey,
        now: Instant,
    ) -> Result<Vec<u8>> {
        match crate::nats::join::message_type(msg) {
            Some(1) => Ok(host.handle_init(now, &self.local, msg)?),
            Some(3) => {
                let f = host.handle_finish(now, msg)?;
                let welcome = self.decide(&f.peer_fingerprint, &f.hello, keys, now);
                Ok(f.welcome(&welcome)?)
            }
            _ => bail!("not a join message"),
        }
    }

    pub(super) fn decide(
        &mut self,
        fp: &str,
        hello: &[u8],
        keys: GroupKey,
        now: Instant,
    ) -> Welcome {
        let trust = match KnownPeers::load(&self.home) {
            Ok(k) => match k.lookup(fp) {
                Some(t) => Trust::Trusted(t.name.clone().unwrap_or_else(|| fp.to_string())),
                None => Trust::Untrusted,
            },
            Err(e) => Trust::Unreadable(e.to_string()),
        };
        let (decision, held) = {
            let mut a = lock(&self.admitter);
            let d = a.decide(now, fp, trust, hello);
            while let Some(l) = a.poll_line() {
                log_admission(&l);
            }
            (d, a.slots_held())
        };
        if let Some(written) = self.slots.as_mut().filter(|w| **w != held) {
            // A restarted device side gives each app side its slot back.
            let path = self.files.slots_path();
            match write_private(&path, crate::nats::admit::encode_slots(&held).as_bytes()) {
                Ok(()) => *written = held,
                Err(e) => tracing::warn!(side = "device", "{e:#}: a restart of this side would not give the app sides their split slots back"),
            }
        }
        let slot = match decision {
            Decision::Admitted { slot } => slot,
            Decision::Refused { code, reason } => {
                return Welcome::Refused {
                    code: code.to_u16(),
                    reason,
                }
            }
        };
        // The keys taken before the note, never read after it (`HandOut`).
        // (`serve` waited for the rotation to complete: not reached.)
        let Some(out) = HandOut::take(keys, slot) else {
            return Welcome::Refused {
                code: CloseCode::InternalError.to_u16(),
                reason: "internal error: the device side took its keys mid-rotation".into(),
            };
        };
        let noted = self.files.add_holder(fp).map_err(|e| e.to_string());
        if let Err(e) = &noted {
            tracing::warn!(
                side = "device",
                "refused app side {fp}: cannot note who holds the group key: {e}"
            );
        }
        out.noted(noted)
    }
}

/// A line of the admission rules in the device's log.
pub(super) fn log_admission(l: &AdmitLine) {
    let s = l.suppressed;
    match l.level {
        Level::Warn if s > 0 => tracing::warn!(side = "device", suppressed = s, "{}", l.text),
        Level::Warn => tracing::warn!(side = "device", "{}", l.text),
        Level::Info => tracing::info!(side = "device", "{}", l.text),
        Level::Debug => tracing::debug!(side = "device", "{}", l.text),
    }
}

/// The app side's join: retried while no device side it trusts answers (unless `--once` and
/// the connect timeout passed), an untrusted one said with the `ndd trust` line every 30 s;
/// a refusal ends it.
pub(super) async fn join(
    ctx: &Ctx,
    local: &LocalIdentity,
    hello: &[u8],
    setup: &Setup,
    js: Option<&jetstream::Context>,
) -> Result<(Admission, String, u64)> {
    let per_try = setup.timing.handshake;
    let subject = ctx.subjects.join();
    // The rules (backoff, what is said, when to give up) are `JoinRetry`'s.
    let mut retry = JoinRetry::new(
        Instant::now(),
        setup.once.then_some(setup.timing.connect),
        setup.timing.max_backoff,
    );
    loop {
        let attempt = join_once(ctx, local, hello, &setup.home, js, per_try);
        let e = match attempt.await {
            Ok(final_answer) => return final_answer,
            Err(e) => e,
        };
        let untrusted = matches!(e, DriveError::UntrustedDevice(_));
        match retry.handle_failure(Instant::now(), untrusted) {
            Retry::GiveUp { untrusted, within } => {
                let whom = if untrusted { " it trusts" } else { "" };
                return Err(e.context(format_args!(
                    "no device side{whom} answered on {subject} within {:.1} s",
                    within.as_secs_f64()
                )));
            }
            Retry::Again { after, say } => {
                match say {
                    Some(Say::Untrusted) => tracing::warn!(side = "app", "{e}; still trying"),
                    Some(Say::Waiting) if !ctx.quiet => tracing::info!(
                        side = "app",
                        "waiting for the device side on {subject}: {e}"
                    ),
                    _ => {}
                }
                tokio::time::sleep(after).await;
            }
        }
    }
}

/// One join: `Err` when it could not be done (nobody answered, the server, an answer signed
/// by an identity not trusted here), `Ok(Err)` when the device side refused this side
/// (final), `Ok(Ok)` admitted: the admission, the device's name, and (with `js`) where its
/// stored streams stood.
///
/// An untrusted signer is [`DriveError::UntrustedDevice`]: anyone who may publish on the server can
/// answer a join with a reply signed by an identity of its own, and before, the first such
/// answer ended the app side (found by a review). Every answer within the try is read, so the
/// device side it trusts is taken when it answers too; [`join`] says the `ndd trust` line and
/// asks again, a join to follow the key ends the side (the device is no longer trusted).
pub(super) async fn join_once(
    ctx: &Ctx,
    local: &LocalIdentity,
    hello: &[u8],
    home: &Path,
    js: Option<&jetstream::Context>,
    per_try: Duration,
) -> Result<Result<(Admission, String, u64)>> {
    let subject = ctx.subjects.join();
    let mut j = Joiner::new()?;
    let known = KnownPeers::load(home)?;
    // Every answer within the try is read: the first one signed by a device side trusted
    // here counts; one signed by another identity (anyone may answer) is left aside.
    let mut untrusted: Option<String> = None;
    let taken = answers(ctx, &subject, j.init(), per_try, |reply| {
        match j.handle_reply_from(local, reply, hello, |fp| known.lookup(fp).is_some()) {
            Ok(x) => Some(x),
            Err(crate::nats::join::JoinError::Seal(crate::seal::SealError::Untrusted(fp))) => {
                untrusted.get_or_insert(fp);
                None
            }
            Err(_) => None,
        }
    })
    .await;
    let (fp, finish) = match (taken, untrusted) {
        (Ok(x), _) => x,
        (Err(_), Some(fp)) => {
            return Err(DriveError::UntrustedDevice(format!(
                "refused an answer from an untrusted device side with fingerprint {fp} (on {subject}); if you trust it, run: ndd trust {fp} --home {}",
                home.display()
            )))
        }
        (Err(e), None) => return Err(e),
    };
    let name = known.lookup(&fp).and_then(|t| t.name.clone()).unwrap_or(fp);
    // Where the device's stored streams stand before it admits us: everything after this
    // is ours.
    let start = match js {
        Some(js) => stored_up_to(ctx, js).await?.1 + 1,
        None => 1,
    };
    // The WELCOME is sealed for this exchange: one that does not open is someone else's.
    let welcome = answers(ctx, &subject, finish, per_try, |w| j.handle_welcome(w).ok()).await?;
    Ok(match welcome {
        Welcome::Admitted(a) => Ok((*a, name, start)),
        Welcome::Refused { reason, .. } => {
            Err(fail!("the device side refused this side: {reason}"))
        }
    })
}

/// An app side's follower of the group key: the driver of [`Follower`] (the rules and their
/// sequencing live there, sans-IO: this does the I/O it asks for). Joins again when the
/// device says it rotated the key or restarted (`P.D.rekey`) or a stream asks (a frame that
/// does not open; a reliable source confirming the device's run at its END), at most every
/// [`crate::nats::follow::REJOIN_SPACING`]. A refusal (this side is no longer trusted)
/// ends the app side.
pub(super) struct KeyFollower {
    pub(super) ctx: Ctx,
    pub(super) local: LocalIdentity,
    pub(super) hello: Vec<u8>,
    pub(super) home: PathBuf,
    pub(super) per_try: Duration,
    pub(super) key: watch::Sender<GroupKey>,
    pub(super) follower: Follower,
}

/// A stream's question to the key follower: answered `true` once settled.
type Asker = tokio::sync::oneshot::Sender<bool>;

impl KeyFollower {
    pub(super) async fn subscribe(&self) -> Result<async_nats::Subscriber> {
        let subject = self.ctx.subjects.rekey();
        self.ctx.subscribe(&subject).await
    }

    pub(super) async fn serve(
        mut self,
        mut notices: async_nats::Subscriber,
        mut asks: mpsc::Receiver<Asker>,
    ) -> Result<()> {
        // No stream may ask (the streams gone): then notices alone. (Sinks ask for a frame
        // under no key they have; reliable sources to confirm the device's run at their END.)
        let mut asking = true;
        let mut ignored = ndd_core::RateLimit::with_burst(Duration::from_secs(10), 1);
        // The device says one every 2 s; a signature check costs some 50 µs, so a flood costs
        // at most a tenth of a core (a flood larger still crowds genuine notices out: a side
        // with sink streams also learns of a rotation from a frame that does not open).
        let mut checks = ndd_core::RateLimit::with_burst(Duration::from_secs(1), 2000);
        // Who asked, and who asked before the question under way went (they get its answer).
        let (mut waiting, mut answering) = (Vec::new(), Vec::new());
        let mut stream = None;
        loop {
            // One question at a time, then back to the notices and asks (joins that keep
            // failing follow one another at once when a try outlasts the spacing: before, the
            // asks that came meanwhile waited for them all, found by a review).
            let mut through = false;
            while !through {
                // Whoever asked before a join goes gets its answer.
                while let Ok(a) = asks.try_recv() {
                    waiting.push(a);
                    self.follower.handle_ask();
                }
                let Some(io) = self.follower.poll_io(Instant::now()) else {
                    break;
                };
                match io {
                    FollowIo::Join => {
                        answering.append(&mut waiting);
                        let joined = self.join().await;
                        self.follower.handle_join(joined)?;
                    }
                    FollowIo::ListMarks => {
                        let listed = self.list_marks(&mut stream).await;
                        self.follower.handle_listed(listed);
                    }
                    FollowIo::ReadMark(run) => self.read_mark(stream.as_ref(), run).await,
                }
                while let Some(e) = self.follower.poll_event() {
                    through |= matches!(e, FollowEvent::Answered { .. });
                    self.take(e, &mut answering);
                }
            }
            let wake = self.follower.poll_timeout(Instant::now());
            tokio::select! {
                a = asks.recv(), if asking => match a {
                    Some(a) => {
                        waiting.push(a);
                        self.follower.handle_ask();
                    }
                    None => asking = false,
                },
                n = notices.next() => {
                    let Some(m) = n else { return Ok(()) };
                    // Anyone may publish here: at most so many a second are checked (each a
                    // signature), and known_peers is read only for one whose signature holds.
                    if checks.admit(Instant::now()).is_none() {
                        continue;
                    }
                    let known = std::cell::OnceCell::new();
                    let taken = self.follower.handle_notice(&m.payload, |fp| {
                        known
                            .get_or_init(|| KnownPeers::load(&self.home))
                            .as_ref()
                            .is_ok_and(|k| k.lookup(fp).is_some())
                    });
                    if let Err(why) = taken {
                        if let Some(more) = ignored.admit(Instant::now()) {
                            let more = match more {
                                0 => String::new(),
                                n => format!(" ({n} more since the last warning)"),
                            };
                            let known = match known.get() {
                                Some(Err(e)) => format!("; cannot read known_peers: {e:#}"),
                                _ => String::new(),
                            };
                            tracing::warn!(side = "app", "ignored a rekey notice: {why}{known}{more}");
                        }
                    }
                }
                _ = sleep_until_opt(wake) => {}
            }
        }
    }

    /// Does what the follower says.
    fn take(&mut self, e: FollowEvent, answering: &mut Vec<Asker>) {
        match e {
            FollowEvent::Followed(f) => {
                self.key.send_if_modified(|k| {
                    let changed = *k != f.keys;
                    *k = f.keys;
                    changed
                });
                if f.rotated && !self.ctx.quiet {
                    tracing::info!(
                        side = "app",
                        "the device side rotated its group key; this side has the new one"
                    );
                }
                if f.restarted && !self.ctx.quiet {
                    tracing::info!(
                        side = "app",
                        run = format_args!("{:016x}", f.keys.run.id),
                        "the device side restarted; this side seals for its new run"
                    );
                }
            }
            FollowEvent::Answered { settled } => {
                for a in answering.drain(..) {
                    let _ = a.send(settled);
                }
            }
            FollowEvent::Behind { run } if !self.ctx.quiet => tracing::info!(
                side = "app",
                run = format_args!("{run:016x}"),
                "no device side serves, and the device marked a run newer than the one this side sealed for: a stream that ended waits (up to {:?}) for a device side to say what it must send again",
                crate::nats::source::CONFIRM_WAIT
            ),
            FollowEvent::Behind { .. } => {}
        }
    }

    /// Asks the device for the keys ([`FollowIo::Join`]).
    async fn join(&self) -> Joined {
        let answer = join_once(
            &self.ctx,
            &self.local,
            &self.hello,
            &self.home,
            None,
            self.per_try,
        )
        .await;
        match answer {
            Ok(Ok((a, _, _))) => Joined::Admitted {
                keys: Box::new(a.keys()),
                slot: a.slot,
            },
            Ok(Err(refused)) => Joined::Refused(refused.to_string()),
            // Only an untrusted device side answered within the try (`ndd untrust` of the
            // device here, or its identity changed): this side takes nothing more from it.
            Err(e @ DriveError::UntrustedDevice(_)) => Joined::Untrusted(e.to_string()),
            Err(DriveError::NoDeviceServing(_)) => Joined::NoDeviceServing,
            Err(e) => {
                tracing::debug!(
                    side = "app",
                    "asking the device side for its group key: {e}"
                );
                Joined::Failed
            }
        }
    }

    /// The runs the device's run-mark subjects name ([`FollowIo::ListMarks`]; `None`: too
    /// many, or they could not be listed); keeps the stream for the marks' reading.
    async fn list_marks(&self, stream: &mut Option<jetstream::stream::Stream>) -> Option<Vec<u64>> {
        let name = self.ctx.subjects.jetstream();
        let s = match jetstream::new(self.ctx.client.clone())
            .get_stream(&name)
            .await
        {
            Ok(s) => stream.insert(s),
            Err(e) => {
                tracing::debug!(side = "app", "JetStream stream {name}: {e}");
                return None;
            }
        };
        let listed = mark_runs(s, &self.ctx.subjects).await;
        listed
            .inspect_err(|e| {
                tracing::debug!(
                    side = "app",
                    "listing the device's run marks in {name}: {e}"
                )
            })
            .ok()
    }

    /// Reads run `run`'s mark ([`FollowIo::ReadMark`]) and hands it to the follower.
    async fn read_mark(&mut self, stream: Option<&jetstream::stream::Stream>, run: u64) {
        let subject = self.ctx.subjects.run_mark(run);
        let note = match stream {
            Some(s) => s
                .get_last_raw_message_by_subject(&subject)
                .await
                .inspect_err(|e| tracing::debug!(side = "app", "JetStream, {subject}: {e}"))
                .ok(),
            None => None,
        };
        let known = KnownPeers::load(&self.home).ok();
        let taken =
            self.follower
                .handle_mark_read(run, note.as_ref().map(|m| &m.payload[..]), |fp| {
                    known.as_ref().is_some_and(|k| k.lookup(fp).is_some())
                });
        tracing::debug!(
            side = "app",
            run = format_args!("{run:016x}"),
            ?taken,
            "the device's run mark"
        );
    }
}

/// Asks on `subject` and reads every answer for at most `limit` until `take` takes one.
async fn answers<T>(
    ctx: &Ctx,
    subject: &str,
    body: Vec<u8>,
    limit: Duration,
    mut take: impl FnMut(&[u8]) -> Option<T>,
) -> Result<T> {
    let deadline = tokio::time::Instant::now() + limit;
    let no_answer = || fail!("no answer within {:.1} s", limit.as_secs_f64());
    // (Bounded as a whole: while the server is away the client waits to reconnect.) The
    // subscription goes to the server before the question, on the same connection.
    let mut sub = tokio::time::timeout_at(deadline, async {
        let inbox = ctx.client.new_inbox();
        let sub = ctx.subscribe(&inbox).await?;
        ctx.client
            .publish_with_reply(subject.to_string(), inbox, body.into())
            .await
            .map_err(|e| fail!("join request on {subject}: {e}"))?;
        Ok::<_, DriveError>(sub)
    })
    .await
    .map_err(|_| no_answer())??;
    let mut answered = false;
    loop {
        let Ok(m) = tokio::time::timeout_at(deadline, sub.next()).await else {
            bail!(
                "no answer {}within {:.1} s",
                if answered { "that counts " } else { "" },
                limit.as_secs_f64()
            );
        };
        let Some(m) = m else {
            bail!("join request on {subject}: the connection closed");
        };
        if m.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            return Err(DriveError::NoDeviceServing(subject.to_string()));
        }
        if m.status.is_some() {
            continue;
        }
        answered = true;
        if let Some(t) = take(&m.payload) {
            return Ok(t);
        }
    }
}
