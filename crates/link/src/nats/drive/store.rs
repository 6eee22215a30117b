//! The driver's JetStream stream: made or changed to the config, and where it stands.

use super::*;

/// How long a device side waits for JetStream to elect its leaders (a cluster starting, or
/// one that lost a node) before it gives up on the driver's stream.
pub(super) const JS_READY_WAIT: Duration = Duration::from_secs(15);
/// How long JetStream keeps a message id to drop a republished duplicate.
pub(super) const JS_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The JetStream stream of the driver's reliable streams, with the copies and room the
/// config asks for (an existing stream is changed to them). What a failure means (wait for a
/// cluster's leaders up to `JS_READY_WAIT`, or give up saying what to change) is
/// `crate::nats::store::after_failure`'s.
pub(super) async fn ensure_jetstream(ctx: &Ctx, nats: &NatsConfig) -> Result<jetstream::Context> {
    let js = jetstream::new(ctx.client.clone());
    let name = ctx.subjects.jetstream();
    let config = jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![ctx.subjects.jetstream_subjects()],
        storage: jetstream::stream::StorageType::File,
        max_bytes: i64::try_from(nats.store_mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX),
        discard: jetstream::stream::DiscardPolicy::Old,
        duplicate_window: JS_DUPLICATE_WINDOW,
        num_replicas: usize::from(nats.replicas),
        ..Default::default()
    };
    let give_up = Instant::now() + JS_READY_WAIT;
    loop {
        let attempt = async {
            match js.get_stream(&name).await {
                Ok(mut s) => {
                    let have = s.info().await.map_err(|e| e.to_string())?.config.clone();
                    if have.num_replicas != config.num_replicas
                        || have.max_bytes != config.max_bytes
                    {
                        tracing::info!(
                            stream = %name,
                            replicas = config.num_replicas,
                            was = have.num_replicas,
                            "changing the JetStream stream's replicas and room to the config's"
                        );
                        js.update_stream(&config).await.map_err(|e| e.to_string())?;
                    }
                    Ok(())
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        jetstream::context::GetStreamErrorKind::JetStream(_)
                    ) && e.to_string().contains("not found") =>
                {
                    js.create_stream(config.clone())
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            }
        }
        .await;
        let e = match attempt {
            Ok(()) => return Ok(js),
            Err(e) => e,
        };
        // A cluster electing its leaders is waited out; anything else does not fix itself.
        let waited_out = Instant::now() >= give_up;
        match crate::nats::store::after_failure(&e, nats.replicas, nats.store_mib, waited_out) {
            crate::nats::store::Attempt::Again => {}
            crate::nats::store::Attempt::GiveUp(hint) => {
                return Err(fail!("JetStream stream {name}: {e} ({hint})"))
            }
        }
        tracing::debug!(stream = %name, error = %e, "JetStream not ready yet");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The driver's JetStream stream and the sequence of the last message it holds.
pub(super) async fn stored_up_to(
    ctx: &Ctx,
    js: &jetstream::Context,
) -> Result<(jetstream::stream::Stream, u64)> {
    let name = ctx.subjects.jetstream();
    let stream = js
        .get_stream(&name)
        .await
        .map_err(|e| fail!("JetStream stream {name}: {e}"))?;
    let last = stream
        .get_info()
        .await
        .map_err(|e| fail!("JetStream stream {name}: {e}"))?
        .state
        .last_sequence;
    Ok((stream, last))
}

/// The runs the device's run-mark subjects in `stream` name. At most
/// [`MARK_SUBJECTS`](crate::nats::follow::MARK_SUBJECTS) are listed: more is an error (anyone
/// who may publish on the server can make them; listing them all would not end).
pub(super) async fn mark_runs(
    stream: &jetstream::stream::Stream,
    subjects: &Subjects,
) -> Result<Vec<u64>, String> {
    use crate::nats::follow::MARK_SUBJECTS;
    let mut listed = stream
        .info_with_subjects(subjects.run_marks())
        .await
        .map_err(|e| e.to_string())?;
    let (mut runs, mut n) = (Vec::new(), 0usize);
    while let Some(subject) = listed.next().await {
        let (subject, _) = subject.map_err(|e| e.to_string())?;
        n += 1;
        if n > MARK_SUBJECTS {
            return Err(format!("more than {MARK_SUBJECTS} run-mark subjects"));
        }
        runs.extend(subjects.run_of_mark(&subject));
    }
    Ok(runs)
}

/// After a failed JetStream step (`wait`: before it is tried again, as its machine says):
/// says so, the server's words escaped, and gives `None`; or, given up, the error to fail
/// with, saying how long `tried` (what, for how long) tried an error that passes by itself.
pub(super) fn again_or_given_up(
    e: DriveError,
    wait: Option<Duration>,
    tried: Option<(&str, Duration)>,
) -> Option<DriveError> {
    match (wait, tried) {
        (Some(wait), _) => {
            tracing::warn!(
                "{}; trying again in {} ms",
                printable(&format!("{e:#}"), MAX_REASON),
                wait.as_millis()
            );
            None
        }
        (None, Some((what, tried))) => Some(e.context(format!(
            "{what} gave up after trying for {} s",
            tried.as_secs()
        ))),
        (None, None) => Some(e),
    }
}
