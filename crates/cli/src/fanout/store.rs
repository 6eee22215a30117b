//! The driver's JetStream stream: made or changed to the config, and where it stands.

use super::*;

/// How long a device side waits for JetStream to elect its leaders (a cluster starting, or
/// one that lost a node) before it gives up on the driver's stream.
pub(super) const JS_READY_WAIT: Duration = Duration::from_secs(15);
/// How long JetStream keeps a message id to drop a republished duplicate.
pub(super) const JS_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The JetStream stream of the driver's reliable streams, with the copies and room the
/// config asks for (an existing stream is changed to them). In a cluster that has just
/// started or lost a node, JetStream answers "temporarily unavailable" (or not at all) until
/// its leaders are elected: that is waited out for up to `JS_READY_WAIT`.
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
        // A cluster electing its leaders; anything else does not fix itself.
        let passing = e.contains("temporarily unavailable")
            || e.contains("timed out")
            || e.contains("no responders")
            || e.contains("insufficient resources") && nats.replicas > 1;
        if !passing || Instant::now() >= give_up {
            let replicas = e.contains("insufficient resources") || e.contains("replicas");
            let hint = if e.contains("insufficient storage") {
                format!(
                    "the server has less JetStream room left than link.nats.store_mib = {} reserves (its other streams hold the rest, and it offers at most 75% of its free disk by default): lower store_mib, delete streams no driver uses (nats stream rm), or raise the server's jetstream max_file_store",
                    nats.store_mib
                )
            } else if replicas && nats.replicas > 1 {
                format!(
                    "link.nats.replicas = {} needs a JetStream cluster of at least that many servers; one server keeps one copy: replicas = 1",
                    nats.replicas
                )
            } else {
                "reliable streams need JetStream: start nats-server with -js, or set reliability = \"lossy\"".into()
            };
            return Err(anyhow!("JetStream stream {name}: {e} ({hint})"));
        }
        tracing::debug!(stream = %name, error = %e, "JetStream not ready yet");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Counts the app sides that said they are ready (a frame sealed under the group key
/// carrying their fingerprint: nobody else can make one).
/// The driver's JetStream stream and the sequence of the last message it holds.
pub(super) async fn stored_up_to(
    ctx: &Ctx,
    js: &jetstream::Context,
) -> Result<(jetstream::stream::Stream, u64)> {
    let name = ctx.subjects.jetstream();
    let stream = js
        .get_stream(&name)
        .await
        .map_err(|e| anyhow!("JetStream stream {name}: {e}"))?;
    let last = stream
        .get_info()
        .await
        .map_err(|e| anyhow!("JetStream stream {name}: {e}"))?
        .state
        .last_sequence;
    Ok((stream, last))
}
