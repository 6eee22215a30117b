//! Device side: the group key's keeper ([`crate::nats::rotate::Keeper`], the rules,
//! sans-IO) driven on the files, the streams' keys, the rotation's gate and the client.

use super::*;
pub(super) use crate::nats::rotate::Keeper;
use crate::nats::rotate::{Action as KeeperAction, Gate, GATE_WAIT};

/// The device side's group key and who holds it. When a holder is no longer in
/// `known_peers` (`ndd untrust`), the key is rotated: a new one is drawn and written, every
/// stream seals under it from its next frame, nobody holds it until they join again (the
/// trusted app sides do so by themselves; the untrusted one is refused), and `P.D.rekey`
/// tells the app sides.
pub(super) struct KeyKeeper {
    pub(super) files: Home,
    pub(super) tx: watch::Sender<GroupKey>,
    /// Where app → device reliable frames are stored: a rotation notes its sequence.
    pub(super) js: Option<jetstream::Context>,
    pub(super) local: LocalIdentity,
    pub(super) keeper: Keeper,
}

/// Tells the app sides which keys this side holds (`P.D.rekey`): those holding others (the
/// group key rotated, or this device side started a new run) join again. Signed by this
/// side: only a device side the app sides trust can send them joining again (the notice
/// names the keys by a one-way id, nothing secret).
async fn rekey_notice(ctx: &Ctx, local: &LocalIdentity, keys: &GroupKey) {
    let notice = Notice {
        run: keys.run.id,
        clock: wall_ns(),
        key: key_id(keys),
    };
    match local.sign_note(&notice_label(&ctx.subjects), &notice_body(&notice)) {
        Ok(note) => {
            let _ = ctx
                .client
                .publish(ctx.subjects.rekey(), Bytes::from(note))
                .await;
        }
        Err(e) => tracing::warn!(side = "device", "cannot sign the rekey notice: {e}"),
    }
}

impl KeyKeeper {
    /// The first check, before the streams start (an app side revoked while this side was
    /// away never sees a frame under its key): a rotation it brings completes at once (no
    /// publisher waits at the gate yet). The notice waits for [`KeyKeeper::watch`], once the
    /// driver is claimed.
    pub(super) async fn start(&mut self, ctx: &Ctx) -> Result<()> {
        loop {
            match self.next(ctx) {
                Some(KeeperAction::Announce(_)) => {}
                Some(a) => self.act(ctx, a).await?,
                None if self.keeper.rotating() => {
                    bail!("the group key's rotation did not complete at start")
                }
                None => return Ok(()),
            }
        }
    }

    /// Runs the keeper for as long as the side runs: checks, rotations, notices.
    pub(super) async fn watch(mut self, ctx: Ctx) -> Result<()> {
        // A check that keeps failing (an unreadable known_peers) is said once a minute.
        let mut said = ndd_core::RateLimit::new(Duration::from_secs(60));
        // The notice at once: the app sides that ran on join again to learn this run.
        self.keeper.handle_stale(Instant::now());
        loop {
            // Registered before the count is read: a publisher settling in between wakes it.
            let changed = ctx.gate.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            while let Some(a) = self.next(&ctx) {
                if let Err(e) = self.act(&ctx, a).await {
                    if let Some(n) = said.admit(Instant::now()) {
                        let more = match n {
                            0 => String::new(),
                            n => format!(" ({n} more failed checks since the last warning)"),
                        };
                        tracing::warn!(
                            side = "device",
                            "cannot check who holds the group key: {}{more}",
                            ndd_wire::text::terminal_safe(&e.to_string())
                        );
                    }
                }
            }
            tokio::select! {
                _ = sleep_until_opt(self.keeper.poll_timeout()) => {}
                _ = changed => {}
                _ = ctx.run_stale.notified() => self.keeper.handle_stale(Instant::now()),
            }
        }
    }

    /// The keeper's next step, the gate's count read just before (a rotation's `Rotate`
    /// starts it over).
    fn next(&mut self, ctx: &Ctx) -> Option<KeeperAction> {
        let (publishers, settled) = ctx.gate.counts();
        self.keeper.handle_gate(publishers, settled);
        self.keeper.poll(Instant::now())
    }

    /// Does what the keeper asks.
    async fn act(&mut self, ctx: &Ctx, a: KeeperAction) -> Result<()> {
        match a {
            KeeperAction::Check => {
                let known = KnownPeers::load(self.files.dir())?;
                let holders = self.files.holders()?;
                let fresh = draw_key()?;
                self.keeper.handle_check(
                    Instant::now(),
                    &holders,
                    |h| known.lookup(h).is_some(),
                    fresh,
                );
            }
            KeeperAction::Rotate { keys, revoked } => {
                // The revoked side is cut off now, whether or not the files can be written.
                ctx.gate.begin();
                self.tx.send_replace(keys);
                tracing::warn!(
                    side = "device",
                    "rotated the group key: {} held it and is no longer trusted; trusted app sides get the new key by joining again",
                    revoked.join(", ")
                );
                // Where the stream stands as the rotation begins: if this side stops before
                // the rotation completes, the next process completes it there (nothing the
                // revoked side stores later opens, however long this side is away).
                let began = match &self.js {
                    None => Ok(0),
                    Some(js) => stored_up_to(ctx, js).await.map(|(_, n)| n),
                };
                let began = began.unwrap_or_else(|e| {
                    tracing::warn!(
                        side = "device",
                        "cannot read where the JetStream stream stands ({e:#}): should this side stop before the rotation completes, frames stored under the old group key in this run and not yet read will not open"
                    );
                    keys.run.began
                });
                if let Err(e) = self.files.rotated(&keys, began) {
                    tracing::warn!(side = "device", "the rotated group key: {e}: the new key is used, but a restart of this side would go back to the old one");
                }
            }
            KeeperAction::ReadPosition { settled } => {
                if !settled {
                    tracing::warn!(
                        side = "device",
                        "the reliable streams did not settle within {} s of the rotation: device frames published just before it may not reach the app sides",
                        GATE_WAIT.as_secs()
                    );
                }
                let since = match &self.js {
                    None => Ok(0),
                    Some(js) => stored_up_to(ctx, js).await.map(|(_, n)| n),
                };
                let since = since.unwrap_or_else(|e| {
                    tracing::warn!(
                        side = "device",
                        "cannot read where the JetStream stream stands ({e:#}): app → device frames sealed under the old group key and not yet read are dropped"
                    );
                    0
                });
                self.keeper.handle_position(Instant::now(), since);
            }
            KeeperAction::Complete { keys, retired } => {
                // The old key stays for the app → device frames stored before the rotation,
                // in memory and in the `.previous` file: up to the JetStream stream's last
                // sequence once this side's sinks open under the new key.
                if let Err(e) = write_private(&self.files.previous_path(), &retired) {
                    tracing::warn!(side = "device", "{e:#}: app → device frames sealed under the old group key and not yet read are dropped if this side restarts");
                }
                self.tx.send_replace(keys);
            }
            KeeperAction::Announce(keys) => rekey_notice(ctx, &self.local, &keys).await,
        }
        Ok(())
    }
}

/// Device side: the reliable publishers' [`Gate`] (the count a rotation waits for), shared by
/// the streams' publishers and the keeper, with a wake-up for the keeper when it changes.
#[derive(Default)]
pub(super) struct RotationGate {
    gate: Mutex<Gate>,
    pub(super) changed: tokio::sync::Notify,
}

impl RotationGate {
    pub(super) fn join(self: &Arc<Self>) -> GateTicket {
        let id = lock(&self.gate).join();
        GateTicket {
            gate: self.clone(),
            id,
        }
    }

    /// A rotation begins: the count starts over.
    pub(super) fn begin(&self) {
        lock(&self.gate).begin();
    }

    /// Publishers, and those settled.
    pub(super) fn counts(&self) -> (usize, usize) {
        lock(&self.gate).counts()
    }

    fn with(&self, f: impl FnOnce(&mut Gate)) {
        f(&mut lock(&self.gate));
        self.changed.notify_waiters();
    }
}

/// A reliable publisher's place in the [`RotationGate`], given back when it ends.
pub(super) struct GateTicket {
    gate: Arc<RotationGate>,
    id: u64,
}

impl GateTicket {
    /// Everything this publisher sealed under the old key is stored.
    pub(super) fn settled(&mut self) {
        let id = self.id;
        self.gate.with(|g| g.settled(id));
    }
}

impl Drop for GateTicket {
    fn drop(&mut self) {
        let id = self.id;
        self.gate.with(|g| g.leave(id));
    }
}
