//! Device side: one device side per driver (the signed claim on `P.D.device`) and the app
//! sides' ready heartbeats.

use super::*;

/// An app side's READY ([`Ready`]) in a frame sealed under the run key (a READY recorded in an
/// earlier device run does not open in a later one; one played again in this run is older
/// than the last one taken).
pub(super) fn ready_message(key: &GroupKey, beat: &Ready) -> Result<Bytes> {
    let mut seal = EncryptForward::new(&Key::given(key.run_key()), Cipher::Aes256Gcm)?;
    let mut out = Output::new();
    let meta = Meta {
        stream: 0,
        seq: 0,
        timestamp_ns: wall_ns(),
        flags: 0,
    };
    seal.handle_frame(Instant::now(), Frame::new(meta, &beat.emit()), &mut out)?;
    out.take_frames()
        .pop()
        .map(|f| crate::nats::outbox::record(f, key.run, 0))
        .ok_or_else(|| fail!("encrypt made no frame"))
}

/// Makes sure no other device side serves the driver on this server, then answers for this
/// one (run `run`) as long as the side runs. Two device sides on one driver would both
/// publish on its subjects: every app side would get two interleaved runs (found by hand: a
/// device side started twice went unnoticed, and the app sides' pairs restarted at every
/// frame). The rules (signed answers only, every answer read, 5 s for one told to stop) are
/// [`crate::nats::claim::Claim`]'s; this drives it on the client. Gives the answering, a
/// service of the side ([`Run::service`]: if its subscription ends, the side fails rather
/// than let a second device side in without a word).
pub(super) async fn claim_device(
    ctx: &Ctx,
    driver: &str,
    run: u64,
    local: &LocalIdentity,
    home: &std::path::Path,
) -> Result<impl std::future::Future<Output = Result<()>> + Send + 'static> {
    use crate::nats::claim::{answer_body, claim_label, Claim, Step, QUESTION_LEN};
    let subject = ctx.subjects.device();
    let label = claim_label(&ctx.subjects);
    let mut ignored = ndd_core::RateLimit::with_burst(Duration::from_secs(10), 1);
    let mut claim = Claim::new(label.clone(), Instant::now());
    let mut answers: Option<async_nats::Subscriber> = None;
    loop {
        match claim.poll(Instant::now()) {
            Step::Serve => break,
            Step::Stop(who) => bail!(
                "another device side is already serving driver \"{driver}\" through this \
                 NATS server ({who}); stop it first, or give this one another driver name \
                 or link.nats.subject_prefix"
            ),
            Step::Ask => {
                // Random bytes the answer must sign (a recorded answer does not count).
                let mut q = [0u8; QUESTION_LEN];
                q.copy_from_slice(&draw_key()?[..QUESTION_LEN]);
                claim.asked(q);
                let inbox = ctx.client.new_inbox();
                answers = Some(ctx.subscribe(&inbox).await?);
                ctx.client
                    .publish_with_reply(subject.clone(), inbox, Bytes::copy_from_slice(&q))
                    .await
                    .map_err(|e| fail!("cannot ask on {subject}: {e}"))?;
                let _ = flushed(&ctx.client).await;
            }
            Step::Wait(until) => {
                let next = async {
                    match answers.as_mut() {
                        Some(a) => a.next().await,
                        None => std::future::pending().await,
                    }
                };
                let m = match tokio::time::timeout_at(until.into(), next).await {
                    Ok(Some(m)) => m,
                    // The answers' subscription closed: nothing more comes; the wait runs
                    // out (before, the loop spun on the closed subscription until then).
                    Ok(None) => {
                        answers = None;
                        continue;
                    }
                    Err(_) => continue,
                };
                // The server's own status (503, no responders: nobody serves the driver
                // yet) is no answer; warned about as a malformed claim before, by a
                // cluster's servers.
                if m.status.is_some() {
                    continue;
                }
                let known = KnownPeers::load(home);
                let trusted = |fp: &str| {
                    fp == local.fingerprint()
                        || known.as_ref().is_ok_and(|k| k.lookup(fp).is_some())
                };
                if let Err(why) = claim.handle_answer(&m.payload, trusted) {
                    if let Some(suppressed) = ignored.admit(Instant::now()) {
                        tracing::warn!(
                            side = "device",
                            suppressed,
                            "ignored an answer on {subject}: {why}"
                        );
                    }
                }
            }
        }
    }
    let mut sub = ctx.subscribe(&subject).await?;
    let client = ctx.client.clone();
    let me = format!(
        "run {run:016x}, process {} on {}",
        std::process::id(),
        hostname()
    );
    // Signed once per question (its random bytes in it); anyone may ask, so at most 50 a
    // second.
    local
        .sign_note(&label, me.as_bytes())
        .map_err(|e| fail!("cannot sign this side's claim on {subject}: {e}"))?;
    let local = local.clone();
    Ok(async move {
        let mut room = ndd_core::RateLimit::with_burst(Duration::from_secs(1), 50);
        while let Some(m) = sub.next().await {
            let (Some(reply), Some(body)) = (m.reply, answer_body(&m.payload, me.as_bytes()))
            else {
                continue;
            };
            if room.admit(Instant::now()).is_none() {
                continue;
            }
            if let Ok(note) = local.sign_note(&label, &body) {
                let _ = client.publish(reply, Bytes::from(note)).await;
            }
        }
        Ok(())
    })
}

/// This machine's name, for messages (`?` if unknown).
pub(super) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Hears the app sides' READY heartbeats (how many are there, for `min_app_sides` and the
/// split slots): a service of the side ([`Run::service`]).
pub(super) async fn serve_ready(
    ctx: &Ctx,
    mut key: watch::Receiver<GroupKey>,
    joined: watch::Sender<usize>,
    admitter: Shared<Admitter>,
) -> Result<impl std::future::Future<Output = Result<()>> + Send + 'static> {
    let subject = ctx.subjects.ready();
    let mut sub = ctx.subscribe(&subject).await?;
    // A ready that does not open (an app side still under the key before a rotation or of an
    // earlier run, or anyone publishing there) is ignored without a word.
    let inverse = |k: &GroupKey| {
        EncryptInverse::new(
            Arc::new(Key::given(k.run_key())),
            Cipher::Aes256Gcm,
            SEAL_WINDOW,
        )
        .without_auth_warnings()
    };
    let mut open = inverse(&key.borrow_and_update());
    Ok(async move {
        let mut out = Output::new();
        while let Some(m) = sub.next().await {
            if key.has_changed().unwrap_or(false) {
                open = inverse(&key.borrow_and_update());
            }
            let Some(rec) = FrameRecord::parse(&m.payload) else {
                continue;
            };
            if open
                .handle_frame(
                    Instant::now(),
                    Frame::from_bytes(rec.meta(), rec.payload),
                    &mut out,
                )
                .is_err()
            {
                continue;
            }
            for f in out.take_frames() {
                let Some(beat) = Ready::parse(f.payload()) else {
                    continue;
                };
                let now = Instant::now();
                let mut a = lock(&admitter);
                if a.handle_ready(now, &beat) != Heard::Stale {
                    let there = a.ready_present(now);
                    joined.send_if_modified(|j| std::mem::replace(j, there) != there);
                }
            }
        }
        Ok(())
    })
}
