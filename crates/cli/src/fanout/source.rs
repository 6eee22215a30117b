//! A source stream's sending half: its stack's frames sealed and published (core NATS or
//! JetStream), with the byte budget and the acknowledgements.

use super::*;

/// JetStream publishes awaiting their acknowledgement, per stream, at most.
pub(super) const JS_IN_FLIGHT: usize = 256;

/// After a lossy stream's END, the pauses before it goes again (core NATS may lose one).
pub(super) const END_REPEATS: [Duration; 2] =
    [Duration::from_millis(20), Duration::from_millis(100)];

/// The `encrypt` pair's forward half as one run's sealing half ([`Sender`]).
pub(super) struct RunSealer(pub(super) EncryptForward);

impl RunSeal for RunSealer {
    fn under(key: [u8; 32]) -> Result<RunSealer, ndd_core::ModuleError> {
        EncryptForward::new(&Key::given(key), Cipher::Aes256Gcm).map(RunSealer)
    }

    fn seal(
        &mut self,
        frame: Frame,
        wseq: u64,
        out: &mut Output,
    ) -> Result<(), ndd_core::ModuleError> {
        self.0.seal_bound(frame, wseq, out)
    }
}

/// Bytes of one stream's frames in the NATS client's queue (handed to it, not yet written to
/// its socket), at most. The client queues whatever it is given (8192 messages: 800 MB of
/// 100 KB frames, found by a fan-out run whose device side grew to 1.2 GB and whose frames
/// came 0.1–0.4 s late); past this a reliable stream waits and a lossy one drops the frame.
pub(super) const QUEUED_BYTES: usize = 4 << 20;

/// One stream's share of the NATS client's queue ([`QUEUED_BYTES`]): a message handed to the
/// client holds permits for its bytes until the client has written it and let it go.
#[derive(Clone)]
pub(super) struct Budget(pub(super) Arc<tokio::sync::Semaphore>);

/// A message's bytes and the permits they hold (given back when the client drops them).
pub(super) struct Held {
    pub(super) bytes: Bytes,
    pub(super) _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Held {
    /// `bytes` as shared bytes that hold `permit` until the last copy goes.
    pub(super) fn wrap(bytes: Bytes, permit: tokio::sync::OwnedSemaphorePermit) -> Bytes {
        Bytes::from_owner(Held {
            bytes,
            _permit: permit,
        })
    }
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Budget {
    pub(super) fn new() -> Budget {
        Budget(Arc::new(tokio::sync::Semaphore::new(QUEUED_BYTES)))
    }

    pub(super) fn permits(rec: &Bytes) -> u32 {
        rec.len().clamp(1, QUEUED_BYTES) as u32
    }

    /// `rec` for the client, once there is room for it.
    pub(super) async fn wrap(&self, rec: Bytes) -> Bytes {
        match self.0.clone().acquire_many_owned(Self::permits(&rec)).await {
            Ok(p) => Held::wrap(rec, p),
            Err(_) => rec,
        }
    }

    /// `rec` for the client if there is room for it now.
    pub(super) fn try_wrap(&self, rec: Bytes) -> Option<Bytes> {
        self.0
            .clone()
            .try_acquire_many_owned(Self::permits(&rec))
            .ok()
            .map(|p| Held::wrap(rec, p))
    }
}

/// What a stream's [`Outbox`] keeps of an app side's reliable frame before sealing.
pub(super) type Plain = (Meta, Bytes, Route);

/// A stored publish's outcome: its token and the stream sequence it was stored at.
pub(super) type AckResult = (u64, Result<u64, ()>);

/// Where a source's frames go: the stream's [`Outbox`] (records, message ids, retries) and
/// the client.
pub(super) struct Publisher {
    /// This stream's room in the client's queue.
    pub(super) budget: Budget,
    /// Lossy frames dropped for want of it (the connection to the server is behind).
    pub(super) dropped: u64,
    /// The stream's END is on its way: it waits for room, never dropped.
    pub(super) ending: bool,
    pub(super) ctx: Ctx,
    pub(super) plan: Plan,
    pub(super) js: Option<jetstream::Context>,
    /// The sans-IO sending half: sealing, the outbox, following the keys.
    pub(super) sender: Sender<RunSealer, Plain>,
    /// Acknowledgements as they come (each ack waited for by a task of its own, so a failed
    /// one goes again at once, not after the ones published before it).
    pub(super) acks_tx: mpsc::UnboundedSender<AckResult>,
    pub(super) acks_rx: mpsc::UnboundedReceiver<AckResult>,
    /// The connection count when this publisher last looked.
    pub(super) connects: u64,
    /// Device side, a reliable stream: its place in the rotation's gate.
    pub(super) gate: Option<GateTicket>,
}

impl Publisher {
    pub(super) fn new(
        ctx: &Ctx,
        plan: &Plan,
        keys: GroupKey,
        js: Option<jetstream::Context>,
    ) -> Result<Publisher> {
        let js = js.filter(|_| plan.reliable);
        let app = ctx.side == SideName::App;
        // Many app sides publish on one up subject with the device's run id and their own
        // frame numbers: their message ids must differ, or JetStream drops all but the first
        // app side's frame of each number as a duplicate (found by the rotation test: a second
        // app side's frames never reached the device). Both sides keep their reliable frames
        // a while, to seal them again after a rotation (a device side's are all stored before
        // its rotation reads where the stream stands: [`RotationGate`]).
        let sender = Sender::new(
            plan.id,
            keys,
            js.is_some(),
            app.then(random_u64),
            plan.reliable,
        )?;
        let gate = (!app && js.is_some()).then(|| ctx.gate.join());
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        Ok(Publisher {
            gate,
            budget: Budget::new(),
            dropped: 0,
            ending: false,
            ctx: ctx.clone(),
            plan: plan.clone(),
            js,
            sender,
            acks_tx,
            acks_rx,
            connects: ctx.connects.load(std::sync::atomic::Ordering::Acquire),
        })
    }

    pub(super) fn subject(&self, route: Route) -> (String, Option<u16>) {
        let part = match route {
            Route::Part { part, .. } => Some(part),
            Route::All | Route::Any => None,
        };
        let s = if self.plan.source && self.ctx.side == SideName::App {
            if self.js.is_some() {
                self.ctx.subjects.up_stored(self.plan.id)
            } else {
                self.ctx.subjects.up(self.plan.id)
            }
        } else {
            self.ctx
                .subjects
                .down(self.plan.id, self.js.is_some(), part)
        };
        (s, part)
    }

    /// Seals `frame` for `subject` (`part`: its part of a split stream; both from
    /// [`Publisher::subject`], worked out once per frame) and publishes it, kept with `keep`
    /// to be sealed again after a rotation (app side, reliable streams); waits while too many
    /// publishes wait for their acknowledgement. The sealed frame's length.
    pub(super) async fn publish(
        &mut self,
        frame: Frame,
        subject: &str,
        part: Option<u16>,
        keep: Option<(usize, Plain)>,
    ) -> Result<usize> {
        self.catch_up();
        let (_, len) = self
            .sender
            .send(Instant::now(), subject, part, frame, keep)
            .map_err(|e| anyhow!("stream \"{}\": encrypt: {e}", self.plan.name))?;
        if len + HEADER_LEN > self.ctx.max_payload {
            bail!(
                "stream \"{}\": a frame of {} bytes exceeds the NATS server's max_payload ({} bytes); raise max_payload in the server's configuration, or cut frames with multiplex split",
                self.plan.name,
                len + HEADER_LEN,
                self.ctx.max_payload
            );
        }
        self.transmit().await?;
        while self.sender.outbox.in_flight() > JS_IN_FLIGHT {
            let ev = self.next_event().await;
            self.on_event(ev).await?;
        }
        Ok(len)
    }

    /// Takes what happened meanwhile: a reconnect, acknowledgements, retries now due.
    pub(super) fn catch_up(&mut self) {
        let now = self.ctx.connects.load(std::sync::atomic::Ordering::Acquire);
        if now != self.connects {
            self.connects = now;
            tracing::debug!(
                stream = %self.plan.name,
                "reconnected to NATS: publishing the recent frames again"
            );
            self.sender.outbox.handle_reconnect();
        }
        while let Ok((token, r)) = self.acks_rx.try_recv() {
            self.sender.outbox.handle_ack(Instant::now(), token, r);
        }
        self.sender.outbox.handle_timeout(Instant::now());
    }

    /// Its counters into the stream's stats: lossy frames dropped for want of room, and
    /// publishes sent again (failed, or after a reconnect).
    pub(super) fn report(&self, stats: &Shared<StreamStats>) {
        let mut s = lock(stats);
        s.overflow = self.dropped;
        s.retransmits = self.sender.outbox.retried + self.sender.outbox.republished;
    }

    /// Whether stored publishes wait for their acknowledgement.
    pub(super) fn busy(&self) -> bool {
        self.sender.outbox.in_flight() > 0
    }

    /// The next acknowledgement, or `None` when a retry is due (cancel-safe).
    pub(super) async fn next_event(&mut self) -> Option<AckResult> {
        let wake = self.sender.outbox.poll_timeout();
        tokio::select! {
            r = self.acks_rx.recv() => r,
            _ = sleep_until_opt(wake) => None,
        }
    }

    pub(super) async fn on_event(&mut self, ev: Option<AckResult>) -> Result<()> {
        if let Some((token, r)) = ev {
            self.sender.outbox.handle_ack(Instant::now(), token, r);
        }
        self.catch_up();
        self.transmit().await
    }

    /// Hands the outbox's messages to the client; a stored one's acknowledgement is waited
    /// for by a task of its own.
    pub(super) async fn transmit(&mut self) -> Result<()> {
        while let Some(p) = self.sender.outbox.poll_transmit() {
            let (Some(js), Some(id)) = (self.js.as_ref(), p.id) else {
                let rec = if self.ending {
                    self.budget.wrap(p.body).await
                } else {
                    match self.budget.try_wrap(p.body) {
                        Some(r) => r,
                        None => {
                            // The newest frames go; this one would only wait behind others.
                            self.dropped += 1;
                            continue;
                        }
                    }
                };
                self.ctx
                    .client
                    .publish(p.subject, rec)
                    .await
                    .map_err(|e| anyhow!("stream \"{}\": publish: {e}", self.plan.name))?;
                continue;
            };
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
            let held = self.budget.wrap(p.body).await;
            match js
                .publish_with_headers(p.subject.clone(), headers, held)
                .await
            {
                Ok(fut) => {
                    let tx = self.acks_tx.clone();
                    let subject = p.subject;
                    tokio::spawn(async move {
                        let r = fut.await.map(|a| a.sequence).map_err(|e| {
                            tracing::debug!(%subject, error = %e, "JetStream publish not acknowledged; again");
                        });
                        let _ = tx.send((p.token, r));
                    });
                }
                Err(e) => {
                    tracing::debug!(subject = %p.subject, error = %e, "JetStream publish failed; again");
                    self.sender
                        .outbox
                        .handle_ack(Instant::now(), p.token, Err(()));
                }
            }
        }
        Ok(())
    }

    /// Follows the keys to a rotated group key or a new device run: what the device no longer
    /// opens goes again under the new run key (the frames this side sealed under the old key
    /// that were stored after the rotation began, or after the first run it missed began).
    pub(super) async fn follow(&mut self, key: &mut watch::Receiver<GroupKey>) -> Result<()> {
        if !key.has_changed().unwrap_or(false) {
            return Ok(());
        }
        if self.gate.is_some() && key.borrow().since == SINCE_PENDING {
            // The device's rotation, a reliable stream: everything sealed under the old key is
            // stored before it reads where the stream stands ([`RotationGate`]); nothing new
            // is sealed meanwhile. (A lossy stream goes on under the new key at once.)
            self.settle_all().await?;
            if let Some(g) = &self.gate {
                g.0.settled();
            }
            let _ = key.wait_for(|k| k.since != SINCE_PENDING).await;
        }
        let keys = *key.borrow_and_update();
        let again = loop {
            match self.sender.follow(keys).map_err(|e| anyhow!("{e}"))? {
                Follow::Same => return Ok(()),
                // Every publish acknowledged first: the stream sequence of each kept frame is
                // known.
                Follow::Settle => self.settle_all().await?,
                Follow::Again(again) => break again,
            }
        };
        let n = again.len();
        for (meta, payload, route) in again {
            let (subject, part) = self.subject(route);
            let frame = Frame::from_bytes(meta, payload.clone());
            let keep = Some((payload.len(), (meta, payload, route)));
            self.publish(frame, &subject, part, keep).await?;
        }
        if n > 0 {
            tracing::info!(
                stream = %self.plan.name,
                frames = n,
                "published again under the new group key what the device received under the old one after its rotation"
            );
        }
        Ok(())
    }

    /// Tells the app sides the stream ended: a sealed empty frame numbered [`END_SEQ`] on
    /// every subject the stream uses, after everything else. On core NATS (a lossy stream)
    /// a message may be lost (a slow consumer's, or one the server drops): the END goes
    /// [`END_REPEATS`] more times, so an app side under `--once` does not wait for it for
    /// good; app sides take the first and pass over the others.
    pub(super) async fn end(&mut self) -> Result<()> {
        self.ending = true;
        self.send_end().await?;
        self.flush().await?;
        if self.js.is_none() {
            for pause in END_REPEATS {
                tokio::time::sleep(pause).await;
                self.send_end().await?;
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// One END on every subject of the stream.
    pub(super) async fn send_end(&mut self) -> Result<()> {
        let routes: Vec<Route> = match self.plan.split {
            Some(parts) => (0..parts).map(|part| Route::Part { part, parts }).collect(),
            None => vec![Route::All],
        };
        for route in routes {
            let meta = Meta {
                stream: self.plan.id,
                seq: END_SEQ,
                timestamp_ns: wall_ns(),
                flags: 0,
            };
            if self.plan.round_robin {
                // Every member hears it (on core NATS), sealed with that subject's sequence.
                let subject = self.ctx.subjects.end(self.plan.id);
                let rec = self
                    .sender
                    .record(&subject, Frame::new(meta, &[]))
                    .map_err(|e| anyhow!("stream \"{}\": encrypt: {e}", self.plan.name))?;
                if let Some(rec) = rec {
                    let _ = self.ctx.client.publish(subject.clone(), rec).await;
                }
            }
            let (subject, part) = self.subject(route);
            self.publish(Frame::new(meta, &[]), &subject, part, None)
                .await?;
        }
        Ok(())
    }

    /// Waits until JetStream acknowledged everything published.
    pub(super) async fn settle_all(&mut self) -> Result<()> {
        loop {
            self.catch_up();
            self.transmit().await?;
            if self.sender.outbox.is_settled() {
                return Ok(());
            }
            let ev = self.next_event().await;
            self.on_event(ev).await?;
        }
    }

    pub(super) async fn flush(&mut self) -> Result<()> {
        self.settle_all().await?;
        let _ = self.ctx.client.flush().await;
        Ok(())
    }
}

/// Source endpoint → stack → route → group key → NATS. When this side stops (`finish`) the
/// channel closes: the source sees it and ends (a blocking one, such as `x11-screen`, too:
/// aborting its task does not stop it), what it sent goes out, then the stream's END.
pub(super) async fn pump_source(
    mut rx: mpsc::Receiver<Frame>,
    mut finish: watch::Receiver<bool>,
    stack: &mut Stack,
    mut keys: watch::Receiver<GroupKey>,
    mut out: Publisher,
    stats: Shared<StreamStats>,
) -> Result<()> {
    let name = out.plan.name.clone();
    let mut closed = false;
    // A rotation also reaches a stream with nothing to send (its kept frames go again).
    let mut rotation = keys.clone();
    loop {
        let wake = stack.poll_timeout();
        let frame = tokio::select! {
            f = rx.recv() => f,
            r = finish.changed(), if !closed => {
                if r.is_err() || *finish.borrow() {
                    closed = true;
                    rx.close();
                }
                continue;
            }
            ev = out.next_event(), if out.busy() => {
                // Acknowledgements and retries go on while the source is quiet.
                out.on_event(ev).await?;
                out.report(&stats);
                continue;
            }
            r = rotation.changed(), if out.sender.outbox.keeps() => {
                if r.is_err() {
                    out.sender.outbox.stop_keeping();
                } else {
                    out.follow(&mut keys).await?;
                }
                continue;
            }
            _ = sleep_until_opt(wake) => {
                stack.handle_timeout(Instant::now()).map_err(|e| anyhow!("{e}"))?;
                drain(stack, &mut keys, &mut out, &stats, &name).await?;
                continue;
            }
        };
        let Some(frame) = frame else {
            stack.flush(Instant::now()).map_err(|e| anyhow!("{e}"))?;
            drain(stack, &mut keys, &mut out, &stats, &name).await?;
            out.flush().await?;
            out.follow(&mut keys).await?;
            out.end().await?;
            return Ok(());
        };
        lock(&stats).produced(frame.len());
        stack
            .handle_frame(Instant::now(), frame)
            .map_err(|e| anyhow!("{e}"))?;
        drain(stack, &mut keys, &mut out, &stats, &name).await?;
    }
}

pub(super) async fn drain(
    stack: &mut Stack,
    keys: &mut watch::Receiver<GroupKey>,
    out: &mut Publisher,
    stats: &Shared<StreamStats>,
    name: &str,
) -> Result<()> {
    while let Some(f) = stack.poll_frame() {
        let route = if out.plan.split.is_some() || out.plan.round_robin || has_mux(stack) {
            route_of(f.payload()).map_err(|e| anyhow!("stream \"{name}\": {e}"))?
        } else {
            Route::All
        };
        out.follow(keys).await?;
        // Kept as it is before sealing (the seal then copies it: app → device frames only).
        let (f, keep) = if out.sender.outbox.keeps() {
            let meta = f.meta;
            let b = f.into_bytes();
            (
                Frame::from_bytes(meta, b.clone()),
                Some((b.len(), (meta, b, route))),
            )
        } else {
            (f, None)
        };
        let (subject, part) = out.subject(route);
        let len = out.publish(f, &subject, part, keep).await?;
        {
            let mut s = lock(stats);
            s.wire_frames += 1;
            s.wire_bytes += len as u64;
            if s.layers_due(Instant::now()) {
                s.layers = stack.stats();
            }
        }
        out.report(stats);
    }
    Ok(())
}

pub(super) fn has_mux(stack: &Stack) -> bool {
    stack.modules().last() == Some(&"multiplex")
}
