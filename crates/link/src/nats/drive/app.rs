//! An app side's start: joining, following the group key, its streams and its ready heartbeat.

use super::*;

/// Starts an app side: joins the device side, follows its group key, runs its streams and
/// says it is ready (and keeps saying so). Returns the device side joined.
pub(super) async fn start(
    s: &Start<'_>,
    ctx: &Ctx,
    t: &mut (dyn Run + Send),
    stop: &mut watch::Receiver<bool>,
) -> Result<PeerView> {
    let (setup, side, quiet) = (s.setup, ctx.side, ctx.quiet);
    let (plans, local) = (&setup.plans, s.local);
    let hello = OwnedMessage::Hello(setup.hello.clone())
        .as_message()
        .emit_to_vec()
        .context("encoding HELLO")?;
    let js = if plans.iter().any(|p| p.reliable) {
        Some(jetstream::new(ctx.client.clone()))
    } else {
        None
    };
    let (admission, device, start) = tokio::select! {
        a = join(ctx, local, &hello, setup, js.as_ref()) => a?,
        _ = stop.changed() => bail!("stopped before the device side admitted this side"),
        // (As a direct link's side with no peer: before, the side waited past its
        // `--duration` for good, found by hand on two network namespaces.)
        _ = sleep_until_opt(setup.deadline) => bail!("no device side admitted this side within --duration"),
    };
    if !quiet {
        let slot = admission
            .slot
            .map(|s| format!(", split slot {s}"))
            .unwrap_or_default();
        tracing::info!(side = %side, "joined device {device} through NATS{slot}; streams agreed");
    }
    let me = short_id(&local.fingerprint());
    // The device may rotate the group key: follow it (joining again when told, or
    // when a frame does not open).
    let (key_tx, key) = watch::channel(admission.keys());
    let (refresh, asks) = mpsc::channel(16);
    let follower = KeyFollower {
        ctx: ctx.clone(),
        local: local.clone(),
        hello: hello.clone(),
        home: setup.home.clone(),
        per_try: setup.timing.handshake,
        key: key_tx,
        follower: Follower::new(&ctx.subjects, admission.keys(), admission.slot),
    };
    let notices = follower.subscribe().await?;
    t.service(
        "key follower",
        Box::pin(async move { follower.serve(notices, asks).await }),
    );
    for p in plans {
        let app = Some((&admission, me.as_str(), start));
        let half = stream_half(s, ctx, p, &key, Some(&refresh), js.clone(), app).await?;
        t.stream(half)?;
    }
    // Every subscription is in place at the server: tell the device, and keep telling
    // it (a device that restarts learns who is there).
    // (Bounded: with the server away the beats say it again once it is back.)
    if let Err(e) = flushed(&ctx.client).await {
        tracing::debug!(side = "app", "before the first ready heartbeat: {e}");
    }
    // This process's beats: numbered from 0 under its start time (a beat played again by
    // someone else says nothing: `Admitter::handle_ready`).
    let mut beat = Ready {
        process: wall_ns(),
        count: 0,
        fingerprint: local.fingerprint(),
    };
    let ready = ready_message(&key.borrow(), &beat)?;
    ctx.client
        .publish(ctx.subjects.ready(), ready)
        .await
        .map_err(|e| fail!("NATS: {e}"))?;
    let (c, subject) = (ctx.client.clone(), ctx.subjects.ready());
    let every = setup.timing.ping_interval.max(Duration::from_millis(100));
    t.service(
        "ready heartbeat",
        Box::pin(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                // Sealed under the key as it stands (the device may have rotated it).
                beat.count += 1;
                let ready = ready_message(&key.borrow(), &beat)?;
                let _ = c.publish(subject.clone(), ready).await;
            }
        }),
    );
    Ok(PeerView {
        name: device,
        admitter: None,
    })
}
