//! Device side: one device side per driver (the signed claim on `P.D.device`) and the app
//! sides' ready heartbeats.

use super::*;

/// An app side's READY: its fingerprint in a frame sealed under the run key (a READY
/// recorded in an earlier device run does not open in a later one).
pub(super) fn ready_message(key: &GroupKey, fingerprint: &str) -> Result<Bytes> {
    let mut seal = EncryptForward::new(&Key::given(key.run_key()), Cipher::Aes256Gcm)?;
    let mut out = Output::new();
    let meta = Meta {
        stream: 0,
        seq: 0,
        timestamp_ns: wall_ns(),
        flags: 0,
    };
    seal.handle_frame(
        Instant::now(),
        Frame::new(meta, fingerprint.as_bytes()),
        &mut out,
    )?;
    out.take_frames()
        .pop()
        .map(|f| ndd_link::nats::outbox::record(f, key.run, 0))
        .ok_or_else(|| anyhow!("encrypt made no frame"))
}

/// Makes sure no other device side serves the driver on this server, then answers for this
/// one (run `run`) as long as the side runs. Two device sides on one driver would both
/// publish on its subjects: every app side would get two interleaved runs (found by hand: a
/// device side started twice went unnoticed, and the app sides' pairs restarted at every
/// frame). Two that start within the same few milliseconds are not caught.
///
/// Answers are signed notes (`device_claim_label`): only one signed by this install or by a
/// peer in `known_peers` counts. Anyone who may publish on the server could answer otherwise
/// and keep every device side from starting (found by hostile testing: a fake answer stopped a
/// device side, its text, escape codes included, printed raw). Every answer within the wait
/// is read, so a fast forged one cannot hide a real one.
pub(super) async fn claim_device(
    ctx: &Ctx,
    driver: &str,
    run: u64,
    local: &LocalIdentity,
    home: &std::path::Path,
) -> Result<()> {
    let subject = ctx.subjects.device();
    let label = device_claim_label(&ctx.subjects);
    let mut ignored = ndd_core::RateLimit::with_burst(Duration::from_secs(10), 1);
    // One that was just told to stop answers until it is gone: it gets a few seconds.
    let give_up = Instant::now() + Duration::from_secs(5);
    loop {
        let inbox = ctx.client.new_inbox();
        let mut answers = ctx
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| anyhow!("cannot subscribe to {inbox}: {e}"))?;
        ctx.client
            .publish_with_reply(subject.clone(), inbox, Bytes::new())
            .await
            .map_err(|e| anyhow!("cannot ask on {subject}: {e}"))?;
        let _ = ctx.client.flush().await;
        let until = tokio::time::Instant::now() + Duration::from_millis(500);
        let mut serving = None;
        while let Ok(Some(m)) = tokio::time::timeout_at(until, answers.next()).await {
            // The server's own status (503, no responders: nobody serves the driver yet) is
            // no answer; warned about as a malformed claim before, by a cluster's servers.
            if m.status.is_some() {
                continue;
            }
            match check_claim(&m.payload, &label, local, home) {
                Ok(who) => serving = Some(who),
                Err(why) => {
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
        match serving {
            Some(who) if Instant::now() >= give_up => bail!(
                "another device side is already serving driver \"{driver}\" through this \
                 NATS server ({who}); stop it first, or give this one another driver name \
                 or link.nats.subject_prefix"
            ),
            Some(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            // Nobody trusted answers: this side is the only one.
            None => break,
        }
    }
    let mut sub = ctx
        .client
        .subscribe(subject.clone())
        .await
        .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))?;
    let client = ctx.client.clone();
    let me = format!(
        "run {run:016x}, process {} on {}",
        std::process::id(),
        hostname()
    );
    let note = local
        .sign_note(&label, me.as_bytes())
        .map_err(|e| anyhow!("cannot sign this side's claim on {subject}: {e}"))?;
    tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            if let Some(reply) = m.reply {
                let _ = client.publish(reply, Bytes::from(note.clone())).await;
            }
        }
    });
    Ok(())
}

/// What a device side's claim on `P.D.device` is signed over besides its body: the kind of
/// note and the driver's subjects.
pub(super) fn device_claim_label(subjects: &Subjects) -> Vec<u8> {
    format!("ndd nats device claim v1 {}", subjects.device()).into_bytes()
}

/// Who serves the driver, from a signed claim by this install or a known peer (its text
/// escaped and bounded); or why the answer does not count.
pub(super) fn check_claim(
    note: &[u8],
    label: &[u8],
    local: &LocalIdentity,
    home: &std::path::Path,
) -> std::result::Result<String, String> {
    let shown = |b: &[u8]| ndd_wire::text::printable_bytes(b, 80);
    let (body, fp) = ndd_link::seal::open_note(note, label)
        .map_err(|e| format!("not a signed claim of a device side ({e}): {}", shown(note)))?;
    let known =
        fp == local.fingerprint() || KnownPeers::load(home).is_ok_and(|k| k.lookup(&fp).is_some());
    if !known {
        return Err(format!(
            "signed by {fp}, which is neither this install nor in known_peers"
        ));
    }
    Ok(ndd_wire::text::printable_bytes(
        body,
        ndd_wire::text::MAX_SHOWN,
    ))
}

/// This machine's name, for messages (`?` if unknown).
pub(super) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

pub(super) async fn serve_ready(
    ctx: &Ctx,
    mut key: watch::Receiver<GroupKey>,
    joined: watch::Sender<std::collections::HashSet<String>>,
    admitter: Shared<Admitter>,
) -> Result<()> {
    let subject = ctx.subjects.ready();
    let mut sub = ctx
        .client
        .subscribe(subject.clone())
        .await
        .map_err(|e| anyhow!("cannot subscribe to {subject}: {e}"))?;
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
    tokio::spawn(async move {
        let mut out = Output::new();
        while let Some(m) = sub.next().await {
            if key.has_changed().unwrap_or(false) {
                open = inverse(&key.borrow_and_update());
            }
            let Some(rec) = FrameRecord::parse(&m.payload) else {
                continue;
            };
            let meta = Meta {
                stream: rec.stream,
                seq: rec.seq,
                timestamp_ns: rec.timestamp_ns,
                flags: rec.flags,
            };
            if open
                .handle_frame(
                    Instant::now(),
                    Frame::from_bytes(meta, rec.payload),
                    &mut out,
                )
                .is_err()
            {
                continue;
            }
            for f in out.take_frames() {
                let fp = String::from_utf8_lossy(f.payload()).into_owned();
                lock(&admitter).handle_ready(Instant::now(), &fp);
                joined.send_if_modified(|j| j.insert(fp));
            }
        }
    });
    Ok(())
}
