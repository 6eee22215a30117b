//! A source stream's sending half, the driver of the sans-IO [`SourceFlow`]: its stack's
//! frames sealed and published (core NATS or JetStream), with the byte budget and the
//! acknowledgements.

use super::*;
use crate::nats::outbox::Publish;
use crate::nats::source::{EndPlan, SendError, SourceFlow, SourceIo};

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

/// Where a source's frames go: the sans-IO [`SourceFlow`] (sealing, the outbox, the keys, the
/// rotation's gate, the END) and the client.
pub(super) struct Publisher {
    /// This stream's room in the client's queue.
    pub(super) budget: Budget,
    /// Lossy frames dropped for want of it (the connection to the server is behind).
    pub(super) dropped: u64,
    pub(super) ctx: Ctx,
    pub(super) plan: Plan,
    pub(super) js: Option<jetstream::Context>,
    pub(super) flow: SourceFlow<RunSealer, Plain>,
    /// Acknowledgements as they come (each ack waited for by a task of its own, so a failed
    /// one goes again at once, not after the ones published before it).
    pub(super) acks_tx: mpsc::UnboundedSender<AckResult>,
    pub(super) acks_rx: mpsc::UnboundedReceiver<AckResult>,
    /// The connection count when this publisher last looked.
    pub(super) connects: u64,
    /// Device side, a reliable stream: its place in the rotation's gate.
    pub(super) gate: Option<GateTicket>,
    /// The side's keys went (it stops).
    pub(super) keys_gone: bool,
    /// App side: asks the key follower to join again (the device's run confirmed before a
    /// reliable stream is done), and the answer waited for.
    refresh: Option<Refresh>,
    confirming: Option<tokio::sync::oneshot::Receiver<bool>>,
}

/// What a [`Publisher`] waits for besides frames.
pub(super) enum Wake {
    Ack(AckResult),
    Time,
    Keys(Result<(), watch::error::RecvError>),
    /// The join asked for to confirm the device's run is through: settled (answered, or no
    /// device side serving) or not (no answer within the try).
    Confirmed(bool),
}

/// The subject of `plan`'s frames on `route` (and its part of a split stream).
fn subject_of(ctx: &Ctx, plan: &Plan, stored: bool, route: Route) -> (String, Option<u16>) {
    let part = match route {
        Route::Part { part, .. } => Some(part),
        Route::All | Route::Any => None,
    };
    let s = if plan.source && ctx.side == Side::App {
        if stored {
            ctx.subjects.up_stored(plan.id)
        } else {
            ctx.subjects.up(plan.id)
        }
    } else {
        ctx.subjects.down(plan.id, stored, part)
    };
    (s, part)
}

impl Publisher {
    pub(super) fn new(
        ctx: &Ctx,
        plan: &Plan,
        keys: GroupKey,
        js: Option<jetstream::Context>,
        refresh: Option<Refresh>,
    ) -> Result<Publisher> {
        let js = js.filter(|_| plan.reliable);
        let stored = js.is_some();
        let app = ctx.side == Side::App;
        // Many app sides publish on one up subject with the device's run id and their own
        // frame numbers: their message ids must differ, or JetStream drops all but the first
        // app side's frame of each number as a duplicate (found by the rotation test: a second
        // app side's frames never reached the device). Both sides keep their reliable frames
        // a while, to seal them again after a rotation (a device side's are all stored before
        // its rotation reads where the stream stands: [`RotationGate`]).
        let sender = Sender::new(plan.id, keys, stored, app.then(random_u64), plan.reliable)?;
        let gate = (!app && stored).then(|| ctx.gate.join());
        let routes: Vec<Route> = match plan.split {
            Some(parts) => (0..parts).map(|part| Route::Part { part, parts }).collect(),
            None => vec![Route::All],
        };
        let end = EndPlan {
            subjects: routes
                .into_iter()
                .map(|r| subject_of(ctx, plan, stored, r))
                .collect(),
            // Every round-robin member hears it (on core NATS).
            broadcast: plan.round_robin.then(|| ctx.subjects.end(plan.id)),
        };
        let flow = SourceFlow::new(
            sender,
            plan.id,
            stored,
            gate.is_some(),
            ctx.max_payload,
            end,
        );
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        Ok(Publisher {
            gate,
            budget: Budget::new(),
            dropped: 0,
            ctx: ctx.clone(),
            plan: plan.clone(),
            js,
            flow,
            acks_tx,
            acks_rx,
            connects: ctx.connects.load(std::sync::atomic::Ordering::Acquire),
            keys_gone: false,
            refresh,
            confirming: None,
        })
    }

    fn err(&self, e: SendError) -> DriveError {
        fail!("stream \"{}\": {e}", self.plan.name)
    }

    /// Seals and publishes `frame` on `route`, kept with `keep` to be sealed again after a
    /// rotation (app side, reliable streams). The sealed frame's length.
    pub(super) async fn publish(
        &mut self,
        frame: Frame,
        route: Route,
        keep: Option<(usize, Plain)>,
    ) -> Result<usize> {
        let (subject, part) = subject_of(&self.ctx, &self.plan, self.js.is_some(), route);
        let len = self
            .flow
            .handle_frame(Instant::now(), &subject, part, frame, keep)
            .map_err(|e| self.err(e))?;
        self.step().await?;
        Ok(len)
    }

    /// Takes what happened meanwhile (a reconnect, acknowledgements, retries due) and does
    /// what the flow asks ([`SourceFlow::poll_io`]): messages to the client, the gate told,
    /// the client flushed, the device's run confirmed, kept frames sealed again under new
    /// keys.
    pub(super) async fn step(&mut self) -> Result<()> {
        let mut again = 0usize;
        'step: loop {
            let now = self.ctx.connects.load(std::sync::atomic::Ordering::Acquire);
            if now != self.connects {
                self.connects = now;
                tracing::debug!(
                    stream = %self.plan.name,
                    "reconnected to NATS: publishing the recent frames again"
                );
                self.flow.handle_reconnect();
            }
            while let Ok((token, r)) = self.acks_rx.try_recv() {
                self.flow
                    .handle_ack(Instant::now(), token, r)
                    .map_err(|e| self.err(e))?;
            }
            self.flow
                .handle_timeout(Instant::now())
                .map_err(|e| self.err(e))?;
            while let Some(io) = self.flow.poll_io() {
                match io {
                    SourceIo::Transmit(p) => self.transmit(p).await?,
                    SourceIo::GateSettled => {
                        if let Some(g) = &mut self.gate {
                            g.settled();
                        }
                    }
                    SourceIo::Flush => {
                        // Said, not hidden: an END the server may not have (a core NATS
                        // stream's app sides then end theirs only when they stop).
                        if let Err(e) = flushed(&self.ctx.client).await {
                            tracing::warn!(
                                stream = %self.plan.name,
                                "the END may not have reached the NATS server (flushing the client failed: {e})"
                            );
                        }
                        self.flow
                            .handle_flushed(Instant::now())
                            .map_err(|e| self.err(e))?;
                        continue 'step;
                    }
                    // The device may have restarted while the last frames went: the key
                    // follower joins again and says when it is through; without one (or with
                    // it gone) the keys as they stand are the answer.
                    SourceIo::Confirm => {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        let asked = match &self.refresh {
                            Some(r) => r.send(tx).await.is_ok(),
                            None => false,
                        };
                        if asked {
                            self.confirming = Some(rx);
                        } else {
                            let k = self.flow.sender.keys();
                            self.flow
                                .handle_confirmed(Instant::now(), k)
                                .map_err(|e| self.err(e))?;
                            continue 'step;
                        }
                    }
                    SourceIo::Again((meta, payload, route)) => {
                        let (subject, part) =
                            subject_of(&self.ctx, &self.plan, self.js.is_some(), route);
                        let frame = Frame::from_bytes(meta, payload.clone());
                        let keep = Some((payload.len(), (meta, payload, route)));
                        self.flow
                            .handle_frame(Instant::now(), &subject, part, frame, keep)
                            .map_err(|e| self.err(e))?;
                        again += 1;
                        continue 'step;
                    }
                }
            }
            break;
        }
        if again > 0 {
            tracing::info!(
                stream = %self.plan.name,
                frames = again,
                "published again, sealed anew, what the device side no longer opens since it restarted or rotated its key"
            );
        }
        Ok(())
    }

    /// Its counters into the stream's stats: lossy frames dropped for want of room, and
    /// publishes sent again (failed, or after a reconnect).
    pub(super) fn report(&self, tally: &dyn Tally) {
        let outbox = &self.flow.sender.outbox;
        tally.sending(self.dropped, outbox.retried + outbox.republished);
    }

    /// The next acknowledgement, retry or END repeat due, or change of keys (cancel-safe).
    pub(super) async fn next(&mut self, keys: &mut watch::Receiver<GroupKey>) -> Wake {
        let wake = self.flow.poll_timeout();
        let confirming = &mut self.confirming;
        tokio::select! {
            Some(a) = self.acks_rx.recv() => Wake::Ack(a),
            _ = sleep_until_opt(wake) => Wake::Time,
            r = keys.changed(), if !self.keys_gone => Wake::Keys(r),
            settled = async {
                match confirming.as_mut() {
                    // The follower gone: the keys as they stand are all there is.
                    Some(rx) => rx.await.unwrap_or(true),
                    None => std::future::pending().await,
                }
            }, if confirming.is_some() => Wake::Confirmed(settled),
        }
    }

    /// Takes what [`Publisher::next`] gave and does what follows from it.
    pub(super) async fn take(
        &mut self,
        w: Wake,
        keys: &mut watch::Receiver<GroupKey>,
    ) -> Result<()> {
        match w {
            Wake::Ack((token, r)) => self
                .flow
                .handle_ack(Instant::now(), token, r)
                .map_err(|e| self.err(e))?,
            // Retries and END repeats are taken by the step.
            Wake::Time => {}
            Wake::Keys(r) => self.keys_changed(r, keys)?,
            Wake::Confirmed(settled) => {
                self.confirming = None;
                let now = Instant::now();
                if settled {
                    // (Not marked seen: a change of keys still comes as `Wake::Keys`.)
                    let k = *keys.borrow();
                    self.flow
                        .handle_confirmed(now, k)
                        .map_err(|e| self.err(e))?;
                } else if self.flow.handle_unconfirmed(now) {
                    tracing::warn!(
                        stream = %self.plan.name,
                        "no device side answered within {:?} to confirm its run before this stream ended: if it restarted meanwhile, it may wait for this stream's last frames",
                        crate::nats::source::CONFIRM_WAIT
                    );
                }
            }
        }
        self.step().await
    }

    /// Waits for the next [`Wake`] and takes it.
    pub(super) async fn wait(&mut self, keys: &mut watch::Receiver<GroupKey>) -> Result<()> {
        let w = self.next(keys).await;
        self.take(w, keys).await
    }

    /// The side's keys changed (a rotation, a new device run) or went.
    pub(super) fn keys_changed(
        &mut self,
        r: Result<(), watch::error::RecvError>,
        keys: &mut watch::Receiver<GroupKey>,
    ) -> Result<()> {
        let now = Instant::now();
        let r = if r.is_err() {
            self.keys_gone = true;
            self.flow.handle_keys_gone(now)
        } else {
            let k = *keys.borrow_and_update();
            self.flow.handle_keys(now, k)
        };
        r.map_err(|e| self.err(e))
    }

    /// Hands one of the flow's messages to the client; a stored one's acknowledgement is
    /// waited for by a task of its own.
    pub(super) async fn transmit(&mut self, p: Publish) -> Result<()> {
        let (Some(js), Some(id)) = (self.js.as_ref(), p.id) else {
            let rec = if self.flow.is_ending() {
                // The END waits for room, never dropped.
                self.budget.wrap(p.body).await
            } else {
                match self.budget.try_wrap(p.body) {
                    Some(r) => r,
                    None => {
                        // The newest frames go; this one would only wait behind others.
                        self.dropped += 1;
                        return Ok(());
                    }
                }
            };
            return self
                .ctx
                .client
                .publish(p.subject, rec)
                .await
                .map_err(|e| fail!("stream \"{}\": publish: {e}", self.plan.name));
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
                self.flow
                    .handle_ack(Instant::now(), p.token, Err(()))
                    .map_err(|e| self.err(e))?;
            }
        }
        Ok(())
    }
}

/// A source stream's NATS half: its frames sealed and published.
pub struct SourceHalf {
    pub(super) keys: watch::Receiver<GroupKey>,
    pub(super) out: Publisher,
    pub(super) finish: watch::Receiver<bool>,
}

impl SourceHalf {
    /// The stream.
    pub fn plan(&self) -> &Plan {
        &self.out.plan
    }

    /// Takes the source endpoint's `frames` through `stack` to the server until the
    /// endpoint ends (its END published and acknowledged) or the side stops (`finish`: the
    /// channel is closed, what the source sent goes out, then the END).
    pub async fn run(
        self: Box<Self>,
        frames: mpsc::Receiver<Frame>,
        stack: &mut Stack,
        tally: Arc<dyn Tally>,
    ) -> Result<()> {
        let r = pump_source(frames, self.finish, stack, self.keys, self.out, &*tally).await;
        tally.layers(stack);
        r
    }
}

/// Source endpoint → stack → route → [`Publisher`] → NATS. When this side stops (`finish`)
/// the channel closes: the source sees it and ends (a blocking one, such as `x11-screen`,
/// too: aborting its task does not stop it), what it sent goes out, then the stream's END.
pub(super) async fn pump_source(
    mut rx: mpsc::Receiver<Frame>,
    mut finish: watch::Receiver<bool>,
    stack: &mut Stack,
    mut keys: watch::Receiver<GroupKey>,
    mut out: Publisher,
    stats: &dyn Tally,
) -> Result<()> {
    let name = out.plan.name.clone();
    let mut closed = false;
    loop {
        let wake = stack.poll_timeout();
        let ready = out.flow.ready();
        let frame = tokio::select! {
            f = rx.recv(), if ready => f,
            r = finish.changed(), if !closed => {
                if r.is_err() || *finish.borrow() {
                    closed = true;
                    rx.close();
                }
                continue;
            }
            // Acknowledgements, retries and new keys go on while the source is quiet (or
            // while the flow has no room).
            w = out.next(&mut keys) => {
                out.take(w, &mut keys).await?;
                out.report(stats);
                continue;
            }
            _ = sleep_until_opt(wake), if ready => {
                stack.handle_timeout(Instant::now())?;
                drain(stack, &mut keys, &mut out, stats, &name).await?;
                continue;
            }
        };
        let Some(frame) = frame else {
            stack.flush(Instant::now())?;
            drain(stack, &mut keys, &mut out, stats, &name).await?;
            out.flow
                .handle_end(Instant::now(), wall_ns())
                .map_err(|e| out.err(e))?;
            out.step().await?;
            while !out.flow.is_done() {
                out.wait(&mut keys).await?;
            }
            out.report(stats);
            return Ok(());
        };
        stats.produced(frame.len());
        stack.handle_frame(Instant::now(), frame)?;
        drain(stack, &mut keys, &mut out, stats, &name).await?;
    }
}

/// The stack's frames to the publisher, each once the flow has room for it.
pub(super) async fn drain(
    stack: &mut Stack,
    keys: &mut watch::Receiver<GroupKey>,
    out: &mut Publisher,
    stats: &dyn Tally,
    name: &str,
) -> Result<()> {
    loop {
        // New keys are followed before the next frame is sealed.
        // (Then what the flow asks: a rotation's gate may be told at once.)
        match keys.has_changed() {
            Ok(true) => {
                out.keys_changed(Ok(()), keys)?;
                out.step().await?;
            }
            Err(e) if !out.keys_gone => {
                out.keys_changed(Err(e), keys)?;
                out.step().await?;
            }
            _ => {}
        }
        while !out.flow.ready() {
            out.wait(keys).await?;
        }
        let Some(f) = stack.poll_frame() else {
            return Ok(());
        };
        let route = if out.plan.split.is_some() || out.plan.round_robin || has_mux(stack) {
            route_of(f.payload()).map_err(|e| fail!("stream \"{name}\": {e}"))?
        } else {
            Route::All
        };
        // Kept as it is before sealing (the seal then copies it: app → device frames only).
        let (f, keep) = if out.flow.sender.outbox.keeps() {
            let meta = f.meta;
            let b = f.into_bytes();
            (
                Frame::from_bytes(meta, b.clone()),
                Some((b.len(), (meta, b, route))),
            )
        } else {
            (f, None)
        };
        let len = out.publish(f, route, keep).await?;
        stats.sent(len as u64, stack);
        out.report(stats);
    }
}

pub(super) fn has_mux(stack: &Stack) -> bool {
    stack.modules().last() == Some(&"multiplex")
}
