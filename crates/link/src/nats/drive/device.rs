//! The device side's start: what it sets up before its streams run, and its streams.

use super::*;
use crate::nats::start::{DeviceStart, StartIo, STEP_RETRY_FOR};

/// Starts the device side: its JetStream stream, run and group key, the key keeper, the claim
/// on the driver, the join service and its streams (sources once enough app sides joined).
/// Returns who the peer is.
pub(super) async fn start(
    s: &Start<'_>,
    ctx: &Ctx,
    t: &mut (dyn Run + Send),
    stop: &mut watch::Receiver<bool>,
) -> Result<PeerView> {
    let (setup, side, quiet) = (s.setup, ctx.side, ctx.quiet);
    let (nats, plans, local) = (&setup.nats, &setup.plans, s.local);
    // The JetStream stream exists before any app side can join (they read where it
    // stands when they join), and before a rotation notes where it stands.
    // (It waits up to `JS_READY_WAIT` for a cluster's leaders: a stop ends the wait.)
    let js = if plans.iter().any(|p| p.reliable) {
        Some(tokio::select! {
            r = ensure_jetstream(ctx, nats) => r?,
            _ = stop.changed() => bail!("stopped during the device side's start"),
        })
    } else {
        None
    };
    // What comes before the run begins, in the order `DeviceStart` gives and explains: joins
    // heard from, the run's id reserved, the driver claimed (a second device side stops
    // here), the run marked in the stream (earlier marks purged beside it), where the stream
    // stands read, the run begun.
    let files = Home::new(&setup.home, &nats.subject_prefix, &setup.driver);
    let mut start = DeviceStart::new(js.is_some());
    let (mut join_sub, mut begun) = (None, None);
    let no_js = || fail!("the device's start asked for JetStream without a stream");
    while !start.is_done() {
        let Some(io) = start.poll_io(Instant::now()) else {
            match start.poll_timeout() {
                // A failed JetStream step, asked again once its wait passed (or the side
                // stops meanwhile).
                Some(at) => tokio::select! {
                    _ = tokio::time::sleep_until(at.into()) => {}
                    _ = stop.changed() => bail!("stopped during the device side's start"),
                },
                None => bail!("the device's start ended before its run began"),
            }
            continue;
        };
        match io {
            StartIo::SubscribeJoins => {
                join_sub = Some(ctx.subscribe(&ctx.subjects.join()).await?);
                start.handle_subscribed();
            }
            StartIo::ReserveRun => {
                start.handle_reserved(files.reserve_run_id(wall_ns(), random_u64() as u16)?)
            }
            StartIo::Claim { run } => {
                // (Its answers are waited for: a stop ends the wait.)
                tokio::select! {
                    r = claim_device(ctx, &setup.driver, run, local, &setup.home) => {
                        t.service("claim's answers", Box::pin(r?));
                    }
                    _ = stop.changed() => bail!("stopped during the device side's start"),
                }
                start.handle_claimed();
            }
            StartIo::Mark { run } => {
                let js = js.as_ref().ok_or_else(no_js)?;
                match mark_run(ctx, js, local, run).await {
                    // (nats-server 2.10 answers a copy of a message still being replicated
                    // as a duplicate at sequence 0: not stored yet, asked again.)
                    Ok(0) => again_or_fail(
                        &mut start,
                        true,
                        fail!("marking this run in JetStream: a duplicate not yet stored"),
                    )?,
                    Ok(seq) => start.handle_marked(seq),
                    Err(e) => again_or_fail(&mut start, passes(&e), e)?,
                }
            }
            StartIo::PurgeEarlierMarks { run, before } => {
                let js = js.clone().ok_or_else(no_js)?;
                tokio::spawn(purge_earlier_marks(js, ctx.subjects.clone(), run, before));
            }
            StartIo::ReadEnd => {
                let js = js.as_ref().ok_or_else(no_js)?;
                match stored_up_to(ctx, js).await {
                    Ok((_, last)) => start.handle_end(last),
                    Err(e) => again_or_fail(&mut start, passes(&e), e)?,
                }
            }
            StartIo::Begin { run, began } => {
                begun = Some(files.begin_run(run, began)?);
                start.handle_begun();
            }
        }
    }
    let (Some(join_sub), Some((run, earlier))) = (join_sub, begun) else {
        bail!("the device's start ended before its run began");
    };
    let (key_tx, key) = watch::channel(files.group_key(run, earlier)?);
    // Checks at least 0.5 s apart: each reads known_peers and the holders file.
    let every = setup
        .timing
        .ping_interval
        .clamp(Duration::from_millis(500), Duration::from_secs(2));
    let mut keeper = KeyKeeper {
        files: files.clone(),
        js: js.clone(),
        local: local.clone(),
        keeper: Keeper::new(Instant::now(), *key.borrow(), every),
        tx: key_tx,
    };
    // An app side revoked while this side was away never sees a frame under its key.
    keeper.start(ctx).await?;
    let slots = plans.iter().filter_map(|p| p.split).max().unwrap_or(0);
    // How many app sides are there (beating), for `min_app_sides`.
    let (joined, mut joined_rx) = watch::channel(0usize);
    let admitter: Shared<Admitter> = Arc::new(Mutex::new(Admitter::new(
        setup.hello.clone(),
        &local.fingerprint(),
        &setup.home.display().to_string(),
        slots,
        // A split slot is given to another app side only after 5 s of silence at least: the
        // heartbeats cross the NATS server, whose hiccups the direct link's 1.5 s keepalive
        // would turn into a holder losing its slot (and ending).
        setup.timing.keepalive.max(Duration::from_secs(5)),
        ctx.quiet,
    )));
    // The split slots the run before this one left: each app side gets its own back.
    if slots > 0 {
        lock(&admitter).restore(Instant::now(), &files.slots());
    }
    let held = lock(&admitter).slots_held();
    let admitter_view = admitter.clone();
    t.service(
        "ready heartbeats' listener",
        Box::pin(serve_ready(ctx, key.clone(), joined, admitter.clone()).await?),
    );
    let host = JoinService {
        admitter,
        ctx: ctx.clone(),
        local: local.clone(),
        home: setup.home.clone(),
        key: key.clone(),
        files: files.clone(),
        expiry: setup.timing.handshake.max(Duration::from_secs(1)) * 2,
        slots: (slots > 0).then_some(held),
    };
    t.service("join service", Box::pin(host.serve(join_sub)));
    // The keeper runs once the driver is claimed and joins are served: its notices send app
    // sides joining.
    let kctx = ctx.clone();
    t.service("key keeper", Box::pin(keeper.watch(kctx)));
    // Sinks at once (what app sides send, and sent while this side was away, comes
    // in now); sources once enough app sides are there to get their frames.
    let want = nats.min_app_sides as usize;
    for sources in [false, true] {
        if sources && want > 0 && plans.iter().any(|p| p.source) {
            if !quiet {
                tracing::info!(side = %side, "waiting for {want} app side(s) to join before starting the sources");
            }
            let enough = joined_rx.wait_for(|there| *there >= want);
            tokio::select! {
                r = enough => { r.map_err(|_| fail!("the join service stopped"))?; }
                _ = stop.changed() => bail!("stopped while waiting for {want} app side(s) to join"),
                _ = sleep_until_opt(setup.deadline) => bail!("fewer than {want} app side(s) joined within --duration"),
            }
        }
        for p in plans.iter().filter(|p| p.source == sources) {
            let half = stream_half(s, ctx, p, &key, None, js.clone(), None).await?;
            t.stream(half)?;
        }
    }
    if !quiet {
        tracing::info!(side = %side, join = %ctx.subjects.join(), "serving app sides through NATS");
    }
    Ok(PeerView {
        name: format!("NATS {}", nats.servers.join(",")),
        admitter: Some(admitter_view),
    })
}

/// A JetStream step of the start failed with `e` (`passing`: an error that passes by
/// itself, `crate::nats::store::passes`): tried again as [`DeviceStart`] says (a cluster
/// electing the stream's leader answers "no stream found" for a few seconds), or the start
/// fails with `e`.
fn again_or_fail(start: &mut DeviceStart, passing: bool, e: DriveError) -> Result<()> {
    let wait = start.handle_failed(Instant::now(), passing).ok();
    let tried = passing.then_some(("the device's start", STEP_RETRY_FOR));
    again_or_given_up(e, wait, tried).map_or(Ok(()), Err)
}

/// Marks run `id` in the JetStream stream ([`crate::nats::subjects::Subjects::run_mark`]):
/// a rekey notice naming it, signed by this side's identity. The stream sequence it was
/// stored at.
async fn mark_run(
    ctx: &Ctx,
    js: &jetstream::Context,
    local: &LocalIdentity,
    id: u64,
) -> Result<u64> {
    let notice = Notice {
        run: id,
        clock: wall_ns(),
        // The run's keys are not known yet (its key id covers where it begins).
        key: [0; 8],
    };
    let note = local
        .sign_note(&mark_label(&ctx.subjects), &notice_body(&notice))
        .context("signing this run's mark")?;
    let subject = ctx.subjects.run_mark(id);
    // Its message id names the run: a mark tried again after its acknowledgement was lost is
    // not stored twice.
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, subject.as_str());
    let stored = js
        .publish_with_headers(subject.clone(), headers, note.into())
        .await
        .map_err(|e| fail!("marking this run in JetStream ({subject}): {e}"))?
        .await
        .map_err(|e| fail!("marking this run in JetStream ({subject}): {e}"))?;
    Ok(stored.sequence)
}

/// Purges the marks of runs before run `id` stored before its own mark (stream sequence
/// `seq`): an app side needs one genuine mark newer than its run, and this run's is newer
/// than theirs (before, every device start left its mark for good, and after 4096 starts every
/// confirmation that found no device side waited its 20 s). Subject by subject, only runs
/// below `id`: a newer run's mark stays whatever the order marks were stored in. Beside the
/// run, never before it: a user whose permissions predate the purge gets no answer (a
/// permissions violation is not one; the request waits out its 10 s), and the marks then
/// stay, said once.
async fn purge_earlier_marks(js: jetstream::Context, subjects: Subjects, id: u64, seq: u64) {
    // (Never "below" sequence 1, nats-server's purge of the whole subject: `DeviceStart`.)
    let name = subjects.jetstream();
    let purged = async {
        let stream = js.get_stream(&name).await.map_err(|e| e.to_string())?;
        let earlier = mark_runs(&stream, &subjects).await?;
        let earlier = earlier.into_iter().filter(|&run| run < id);
        let mut purged = 0;
        for run in earlier {
            purged += stream
                .purge()
                .filter(subjects.run_mark(run))
                .sequence(seq)
                .await
                .map_err(|e| e.to_string())?
                .purged;
        }
        Ok::<u64, String>(purged)
    };
    match purged.await {
        Ok(n) => tracing::debug!(side = "device", purged = n, "earlier run marks purged"),
        Err(e) => tracing::info!(
            side = "device",
            "cannot purge the earlier runs' marks from JetStream stream {name} ({}): they stay; if this side's NATS user lacks $JS.API.STREAM.PURGE (permissions printed by an earlier ndd), print them again (ndd nats-permissions)",
            printable(&e, MAX_REASON)
        ),
    }
}
