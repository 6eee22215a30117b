//! Device side: the group key's rotation when a holder is no longer trusted, the notices that
//! send app sides joining again, and the gate a rotation waits at.

use super::*;

/// The device side's group key and who holds it. When a holder is no longer in
/// `known_peers` (`ndd untrust`), the key is rotated: a new one is drawn and written, every
/// stream seals under it from its next frame, nobody holds it until they join again (the
/// trusted app sides do so by themselves; the untrusted one is refused), and `P.D.rekey`
/// tells the app sides.
pub(super) struct KeyKeeper {
    pub(super) home: std::path::PathBuf,
    pub(super) prefix: String,
    pub(super) driver: String,
    pub(super) tx: watch::Sender<GroupKey>,
    /// Where app → device reliable frames are stored: a rotation notes its sequence.
    pub(super) js: Option<jetstream::Context>,
}

/// Tells the app sides which keys this side holds (`P.D.rekey`): those holding others (the
/// group key rotated, or this device side started a new run) join again. Signed by this
/// side: only a device side the app sides trust can send them joining again (the notice
/// names the keys by a one-way id, nothing secret).
pub(super) async fn rekey_notice(ctx: &Ctx, local: &LocalIdentity, keys: &GroupKey) {
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

/// The rekey notice, at once (a new run: the app sides that ran on join again to learn it),
/// every [`NOTICE_EVERY`] (an app side that missed one — core NATS may lose it — learns it
/// must join), when a rotation is complete, and when frames sealed for an earlier run or
/// under a rotated key come in (`stale`, said at most every [`ndd_link::nats::keys::RUN_NOTICE_SPACING`] by the
/// streams). Not while a rotation reads where the stream stands (joins wait then).
pub(super) async fn announce_keys(
    ctx: Ctx,
    local: LocalIdentity,
    mut key: watch::Receiver<GroupKey>,
    stale: Arc<tokio::sync::Notify>,
) {
    loop {
        let keys = *key.borrow_and_update();
        if keys.since != SINCE_PENDING {
            rekey_notice(&ctx, &local, &keys).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(NOTICE_EVERY) => {}
            _ = stale.notified() => {}
            changed = key.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

impl KeyKeeper {
    pub(super) fn holders_path(&self) -> std::path::PathBuf {
        holders_path(&self.home, &self.prefix, &self.driver)
    }

    /// Rotates the key if one of its holders is no longer trusted; returns who was revoked.
    /// The old key stays for the app → device frames stored before the rotation, in memory
    /// and in the `.previous` file: up to the JetStream stream's last sequence once this side's
    /// sinks open under the new key (any frame they took under the old one is at or below it,
    /// so nothing they took is published again by its sender, and nothing stored later under
    /// the old key opens).
    pub(super) async fn rotate_if_revoked(&self, ctx: &Ctx) -> Result<Vec<String>> {
        let known = KnownPeers::load(&self.home)?;
        let current = *self.tx.borrow();
        let holders = holders(&self.holders_path())?;
        let Some(r) = rotation(
            current,
            &holders,
            |h| known.lookup(h).is_some(),
            draw_key()?,
        ) else {
            return Ok(Vec::new());
        };
        let (old, k) = (current.key, r.keys.key);
        let path = key_path(&self.home, &self.prefix, &self.driver);
        write_private(&path, &k)
            .with_context(|| format!("cannot write the rotated group key {}", path.display()))?;
        write_private(&self.holders_path(), b"")?;
        ctx.gate.begin();
        self.tx.send_replace(r.keys);
        if !ctx.gate.wait().await {
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
        let mut previous = old.to_vec();
        previous.extend_from_slice(&since.to_be_bytes());
        if let Some((k, s)) = r.keys.older {
            previous.extend_from_slice(&k);
            previous.extend_from_slice(&s.to_be_bytes());
            for (k, s) in r.keys.retired.iter().flatten() {
                previous.extend_from_slice(k);
                previous.extend_from_slice(&s.to_be_bytes());
            }
        }
        if let Err(e) = write_private(
            &previous_path(&self.home, &self.prefix, &self.driver),
            &previous,
        ) {
            tracing::warn!(side = "device", "{e:#}: app → device frames sealed under the old group key and not yet read are dropped if this side restarts");
        }
        self.tx.send_replace(r.keys.since_at(since));
        Ok(r.revoked)
    }

    /// Rotates the key if a holder was revoked, and says so: in the log and, for the app
    /// sides, on `P.D.rekey`.
    pub(super) async fn check(&self, ctx: &Ctx) -> Result<()> {
        let revoked = self.rotate_if_revoked(ctx).await?;
        if !revoked.is_empty() {
            // (The notice goes from `announce_keys`, which sees the keys change.)
            tracing::warn!(
                side = "device",
                "rotated the group key: {} held it and is no longer trusted; trusted app sides get the new key by joining again",
                revoked.join(", ")
            );
        }
        Ok(())
    }

    /// Checks every `every` (the first check is the caller's, at start).
    pub(super) async fn watch(self, ctx: Ctx, every: Duration) -> Result<()> {
        // A check that keeps failing (an unreadable known_peers) is said once a minute.
        let mut said = ndd_core::RateLimit::new(Duration::from_secs(60));
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = self.check(&ctx).await {
                if let Some(n) = said.admit(Instant::now()) {
                    let more = match n {
                        0 => String::new(),
                        n => format!(" ({n} more failed checks since the last warning)"),
                    };
                    tracing::warn!(
                        side = "device",
                        "cannot check who holds the group key: {e:#}{more}"
                    );
                }
            }
        }
    }
}

/// Device side: how a rotation knows that nothing this side sealed under the old key is still
/// on its way to JetStream. It reads where the stream stands (the rotation's `since`) only
/// once every publisher of a reliable stream has had each publish under the old key
/// acknowledged, so every device frame under the old key is stored at or before `since`. An
/// app side drops a frame under the old key stored later (the revoked side holds that key):
/// before this, a frame the device published just before a rotation and stored just after it
/// was dropped by every app side, and an ordered stream could not take its copy sealed again
/// (its later frames were through already). Found by `testkit/tests/nats_keys.rs`.
#[derive(Default)]
pub(super) struct RotationGate {
    /// Publishers of reliable streams on this side.
    pub(super) publishers: std::sync::atomic::AtomicUsize,
    /// Of them, those settled under the old key since the rotation began.
    pub(super) settled: std::sync::atomic::AtomicUsize,
    pub(super) changed: tokio::sync::Notify,
}

/// How long a rotation waits for the reliable publishers to settle before it reads where the
/// stream stands anyway (a publisher whose acknowledgements do not come: the server is gone).
pub(super) const GATE_WAIT: Duration = Duration::from_secs(10);

impl RotationGate {
    pub(super) fn join(self: &Arc<Self>) -> GateTicket {
        self.publishers
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        GateTicket(self.clone())
    }

    pub(super) fn settled(&self) {
        self.settled
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// A rotation begins: the count starts over.
    pub(super) fn begin(&self) {
        self.settled.store(0, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until every reliable publisher settled, at most [`GATE_WAIT`]; whether they did.
    pub(super) async fn wait(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let deadline = tokio::time::Instant::now() + GATE_WAIT;
        loop {
            let changed = self.changed.notified();
            if self.settled.load(SeqCst) >= self.publishers.load(SeqCst) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return false;
            }
        }
    }
}

/// A reliable publisher's place in the [`RotationGate`], given back when it ends.
pub(super) struct GateTicket(pub(super) Arc<RotationGate>);

impl Drop for GateTicket {
    fn drop(&mut self) {
        self.0
            .publishers
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}
