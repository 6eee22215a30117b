//! A sink stream's receiving half: subscriptions or JetStream consumers, the [`Receiver`]
//! with its keys, and frames handed to the endpoint.

use super::*;
use crate::nats::attach::{device_start, Attach, AttachIo, Reattach, StartRetry, FIRST_ATTACH_FOR};
use crate::nats::deliver::{Action, Mode, Notice, Rebuild, SinkFlow, ENDING_WAIT, FINISH_WAIT};

/// Replay window of the group key's inverse halves, in frames.
pub(super) const SEAL_WINDOW: u32 = crate::nats::opened::WINDOW as u32;
/// Sending halves (epochs) a group key's inverse keeps at once: one per app side feeding an
/// app → device stream, and one more for each rotation it follows. With the `encrypt`
/// pair's default of two, a third app side's frames retired the first one's epoch and the
/// device refused the rest of them as replays (found by a four-app-side test).
pub(super) const SENDERS: usize = 128;

/// The `encrypt` pair's inverse as one run's receiving half. This side warns about a frame
/// that opens under no key it has (not the half). Every app side feeding an app → device
/// stream seals under its own epoch: the device keeps [`SENDERS`] of them live.
pub(super) struct RunInverse(pub(super) EncryptInverse);

impl RunHalf for RunInverse {
    fn under(key: [u8; 32]) -> RunInverse {
        RunInverse(
            EncryptInverse::new(Arc::new(Key::given(key)), Cipher::Aes256Gcm, SEAL_WINDOW)
                .without_auth_warnings()
                .with_live_epochs(SENDERS),
        )
    }

    fn open(
        &mut self,
        now: Instant,
        frame: Frame,
        wseq: u64,
        out: &mut Output,
    ) -> Result<Outcome, ndd_core::ModuleError> {
        Ok(match self.0.open_bound(now, frame, wseq, out)? {
            Opening::Opened => Outcome::Opened,
            Opening::Replayed => Outcome::Replayed,
            Opening::Rejected => Outcome::Rejected,
        })
    }
}

/// The key side of a sink's [`Receiver`] (the rules live there, sans-IO): it hands in the
/// keys as they change, asks the device for the key when the receiver waits for it (an app
/// side), waits for where a rotation began, joins again on a newer run (an app side) and
/// tells the app sides of this run (a device side) when the receiver says so.
pub(super) struct KeyWatch {
    pub(super) key: watch::Receiver<GroupKey>,
    pub(super) refresh: Option<Refresh>,
    /// Device side: rung when a genuine frame of an earlier run is refused (app sides that did
    /// not hear of this run are told to join again).
    pub(super) stale: Option<Arc<tokio::sync::Notify>>,
}

/// A sink's receiving half.
pub(super) type SinkReceiver = Receiver<RunInverse, jetstream::Message>;

/// A sink's ask for keys in flight ([`KeyWatch::ask`]).
pub(super) type Asked = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

impl KeyWatch {
    /// The receiver of stream `id` under the keys as they stand.
    pub(super) fn receiver(&mut self, side: Side, id: u16, ordered: bool) -> SinkReceiver {
        let k = *self.key.borrow_and_update();
        Receiver::new(id, side == Side::App, k, ordered, REORDER_WAIT)
    }

    /// Hands the keys to `rx` if they changed.
    pub(super) fn follow(&mut self, rx: &mut SinkReceiver) {
        if self.key.has_changed().unwrap_or(false) {
            let k = *self.key.borrow_and_update();
            rx.handle_keys(Instant::now(), k);
        }
    }

    /// What `rx` waits for, as a future the sink's loop waits on beside its stop, ticks and
    /// acknowledgements (a join that takes seconds must not stall them): `false` once the
    /// keys are gone (the side stops). [`KeyWatch::brought`] hands in what came.
    pub(super) fn ask(&self, wait: Wait) -> Asked {
        match wait {
            Wait::Rotation => {
                // Mid-rotation: where it began decides; it comes in a moment.
                let mut key = self.key.clone();
                Box::pin(async move { key.wait_for(|k| k.since != SINCE_PENDING).await.is_ok() })
            }
            Wait::Key => {
                let refresh = self.refresh.clone();
                Box::pin(async move {
                    if let Some(r) = refresh {
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        if r.send(tx).await.is_ok() {
                            let _ = rx.await;
                        }
                    }
                    true
                })
            }
        }
    }

    /// Hands `rx` what the [`KeyWatch::ask`] for `wait` brought. An error names a record that
    /// did not open (dropped).
    pub(super) fn brought(
        &mut self,
        rx: &mut SinkReceiver,
        wait: Wait,
    ) -> Result<(), ndd_core::ModuleError> {
        match wait {
            Wait::Rotation => {
                let k = *self.key.borrow_and_update();
                rx.handle_keys(Instant::now(), k);
            }
            Wait::Key => {
                self.follow(rx);
                rx.asked(Instant::now())?;
            }
        }
        Ok(())
    }

    /// A newer run opened (an app side joins again to learn it, so what it sends follows,
    /// without waiting), or a genuine frame of an earlier run came (a device side tells the
    /// app sides).
    pub(super) fn said(&self, e: &Event) {
        match e {
            Event::NewerRun => {
                if let Some(r) = &self.refresh {
                    let (tx, _) = tokio::sync::oneshot::channel();
                    let _ = r.try_send(tx);
                }
            }
            Event::TellRun => {
                if let Some(n) = &self.stale {
                    n.notify_one();
                }
            }
            _ => {}
        }
    }
}

/// Where a sink's records come from.
pub(super) enum Input {
    Core(async_nats::Subscriber),
    Stored(Box<Stored>),
}

/// A sink's input: an app side's (`app`: its admission, its name, where the stored streams
/// stood when it joined) or the device side's, whose new consumer starts after stream
/// sequence `began` ([`GroupKey::oldest_began`]), or after what the process before noted as
/// through its sink, if later.
pub(super) async fn subscribe(
    ctx: &Ctx,
    plan: &Plan,
    js: Option<jetstream::Context>,
    app: Option<(&Admission, &str, u64)>,
    began: u64,
    stop: &watch::Receiver<bool>,
) -> Result<Input> {
    use crate::nats::input::{sink_input, Reader, SinkInput};
    // Which subject or consumer, and what it keeps: ndd_link's rules (sans-IO).
    let reader = match app {
        Some((adm, me, _)) => Reader::App { me, slot: adm.slot },
        None => Reader::Device,
    };
    let how = sink_input(&ctx.subjects, &plan.shape(), reader, js.is_some())
        .map_err(|e| fail!("stream \"{}\": {e}", plan.name))?;
    let (durable, filter, flags, keeps_position, keeps_windows) = match how {
        SinkInput::Core { subject, queue } => {
            let sub = match queue {
                Some(q) => ctx.client.queue_subscribe(subject.clone(), q).await,
                None => ctx.client.subscribe(subject.clone()).await,
            }
            .map_err(|e| fail!("cannot subscribe to {subject}: {e}"))?;
            return Ok(Input::Core(sub));
        }
        SinkInput::Stored {
            durable,
            filter,
            shared,
            resume,
            ordered,
            keeps_position,
            keeps_windows,
        } => (
            durable,
            filter,
            Flags {
                shared,
                resume,
                ordered,
            },
            keeps_position,
            keeps_windows,
        ),
    };
    let js = js.ok_or_else(|| fail!("JetStream consumer {durable} without JetStream"))?;
    let name = ctx.subjects.jetstream();
    // (The device side made the stream; an app side may start before it has.)
    let made_by = if app.is_some() {
        " (the device side creates it when it starts)"
    } else {
        ""
    };
    let stream = retried(stop, || async {
        js.get_stream(&name)
            .await
            .map_err(|e| fail!("JetStream stream {name}: {e}{made_by}"))
    })
    .await?;
    let files = Home::new(&ctx.home, ctx.subjects.prefix(), ctx.subjects.driver());
    // Where an app side's own consumer stood, for its next process.
    let position = if keeps_position {
        Some(PositionFile::open(&files, &durable)?)
    } else {
        None
    };
    // What the device's consumer opened, for its next process.
    let windows = if keeps_windows {
        Some(WindowsFile::open(&files, &durable)?)
    } else {
        None
    };
    let start = match app {
        // The first message stored after this app side asked to join.
        Some((_, _, start)) => start,
        // A new device consumer starts where the oldest run the keys name began
        // ([`GroupKey::oldest_began`]), or after what the process before noted as through its
        // sink, if later: one made afresh while the process before had one (lost between its
        // delete and its make, or by the server) starts after what that process's windows say
        // went through its sink (`OpenedWindows::through`).
        None => {
            let through = windows
                .as_ref()
                .and_then(|w| w.read().ok().flatten())
                .map_or(0, |w| w.through());
            device_start(began, through)
        }
    };
    let mut stored = Stored::new(
        ctx,
        stream,
        (durable, filter),
        flags,
        (position, windows),
        stop,
    );
    stored.attach(start, true).await?;
    Ok(Input::Stored(Box::new(stored)))
}

/// A JetStream consumer of one app side (or the shared one of a round-robin stream).
pub(super) struct Stored {
    pub(super) stream: jetstream::stream::Stream,
    pub(super) durable: String,
    pub(super) filter: String,
    /// Round-robin: shared with the other members, never deleted.
    pub(super) shared: bool,
    /// A consumer this side left behind resumes where it stopped (else it starts afresh at
    /// the start given: see [`Plan::now_only`]).
    pub(super) resume: bool,
    /// One publisher whose subject sequence orders the frames (not round-robin members, not
    /// the many app sides of an app → device stream).
    pub(super) ordered: bool,
    pub(super) messages: Option<jetstream::consumer::pull::Stream>,
    pub(super) connects: Arc<std::sync::atomic::AtomicU64>,
    pub(super) seen: u64,
    /// The stream sequence the consumer delivers from (as attached last).
    pub(super) start: u64,
    /// It took up a consumer this side left behind (at its first unacknowledged message).
    pub(super) resumed: bool,
    /// Where the stream stands, kept for the next process (an app side's ordered consumer).
    pub(super) position: Option<PositionFile>,
    /// What it opened, kept for the next process (a device side's: copies of frames taken
    /// already are dropped, `crate::nats::opened`).
    pub(super) windows: Option<WindowsFile>,
    /// When it is attached again ([`Reattach`]).
    pub(super) again: Reattach,
    /// This side stops: a wait between attempts ends.
    pub(super) stop: watch::Receiver<bool>,
}

/// How a [`Stored`] consumer is shared, resumed and ordered (its fields of the same names).
pub(super) struct Flags {
    pub(super) shared: bool,
    pub(super) resume: bool,
    pub(super) ordered: bool,
}

impl Stored {
    /// Not attached yet: the consumer `durable` of `stream` on `filter`, with where it
    /// stands kept in a position file (an app side's) or a windows file (the device's).
    fn new(
        ctx: &Ctx,
        stream: jetstream::stream::Stream,
        (durable, filter): (String, String),
        f: Flags,
        (position, windows): (Option<PositionFile>, Option<WindowsFile>),
        stop: &watch::Receiver<bool>,
    ) -> Stored {
        Stored {
            stream,
            durable,
            filter,
            shared: f.shared,
            resume: f.resume,
            ordered: f.ordered,
            messages: None,
            connects: ctx.connects.clone(),
            seen: ctx.connects.load(std::sync::atomic::Ordering::Acquire),
            start: 0,
            resumed: false,
            position,
            windows,
            again: Reattach::default(),
            stop: stop.clone(),
        }
    }
}

/// What a sink's start says when it gives up on an error that passes by itself.
const FIRST_TRIES: (&str, Duration) = ("this stream's start", FIRST_ATTACH_FOR);

/// A JetStream step of a sink's start, tried again while it fails as [`StartRetry`] says
/// (or until this side stops); then the stream fails with the last error.
async fn retried<T, F, Fut>(stop: &watch::Receiver<bool>, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut retry = StartRetry::new(Instant::now());
    loop {
        let e = match f().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let passing = passes(&e);
        let wait = retry.handle_failed(Instant::now(), passing);
        if let Some(e) = again_or_given_up(e, wait, passing.then_some(FIRST_TRIES)) {
            return Err(e);
        }
        stopped_or_slept(stop, Instant::now() + wait.unwrap_or_default()).await?;
    }
}

/// Sleeps until `at`, or fails once this side stops.
async fn stopped_or_slept(stop: &watch::Receiver<bool>, at: Instant) -> Result<()> {
    let mut stop = stop.clone();
    tokio::select! {
        _ = tokio::time::sleep_until(at.into()) => Ok(()),
        _ = stop.changed() => bail!("stopped while this stream started"),
    }
}

impl Stored {
    /// (Re)attaches, as [`Attach`] asks (the rules live there, sans-IO): this side's own
    /// consumer, if it exists, resumes where it stood; a new one starts at `start` (the first
    /// message stored after this side asked to join, or [`device_start`]). `first`: the
    /// stream's first attach, whose failed steps are tried again ([`StartRetry`]).
    pub(super) async fn attach(&mut self, start: u64, first: bool) -> Result<()> {
        let durable = self.durable.clone();
        let mut a = Attach::new(start, self.resume, self.shared);
        if first {
            a = a.retrying(Instant::now());
        }
        let mut last_err = None;
        let attached = loop {
            if let Some(end) = a.poll_end() {
                break end;
            }
            let Some(io) = a.poll_io(Instant::now()) else {
                match a.poll_timeout() {
                    Some(at) => stopped_or_slept(&self.stop, at).await?,
                    None => bail!("JetStream consumer {durable}: its attach stalled"),
                }
                continue;
            };
            match io {
                AttachIo::Look => {
                    use jetstream::context::ConsumerInfoErrorKind;
                    match self.stream.consumer_info(&durable).await {
                        Ok(info) => {
                            // Records acknowledged and kept aside for a key, not yet opened,
                            // come again (the process that kept them may be gone).
                            let kept = self.position.as_ref().and_then(PositionFile::read);
                            let floor = info.ack_floor.stream_sequence;
                            a.handle_looked(Some(floor), kept.as_ref(), Instant::now());
                        }
                        // (Only the consumer's absence: a stream not found, or any other
                        // error, is a look that failed and makes nothing.)
                        Err(e) if e.kind() == ConsumerInfoErrorKind::NotFound => {
                            a.handle_looked(None, None, Instant::now())
                        }
                        Err(e) => {
                            let e = fail!("JetStream consumer {durable}: {e}");
                            let passing = passes(&e);
                            let wait = a.handle_look_failed(Instant::now(), passing);
                            last_err = again_or_given_up(
                                e,
                                wait,
                                (first && passing).then_some(FIRST_TRIES),
                            );
                        }
                    }
                }
                AttachIo::Delete => {
                    let r = self.stream.delete_consumer(&durable).await;
                    if let Err(e) = &r {
                        tracing::debug!(%durable, error = %e, "consumer delete failed");
                    }
                    a.handle_deleted(r.is_ok());
                }
                AttachIo::Make { start } => match self.make(start).await {
                    Ok(()) => a.handle_made(true),
                    Err(e) => {
                        let passing = passes(&e);
                        let wait = a.handle_make_failed(Instant::now(), passing);
                        last_err =
                            again_or_given_up(e, wait, (first && passing).then_some(FIRST_TRIES));
                    }
                },
            }
        };
        let Ok(attached) = attached else {
            return Err(last_err.unwrap_or_else(|| fail!("JetStream consumer {durable}")));
        };
        self.resumed |= attached.resumed;
        if !self.resumed {
            if let Some(p) = self.position.as_mut() {
                p.clear();
            }
        }
        self.start = attached.start;
        Ok(())
    }

    /// Makes the durable consumer delivering from `start` (or takes the one there) and pulls
    /// from it.
    async fn make(&mut self, start: u64) -> Result<()> {
        let durable = &self.durable;
        let config = jetstream::consumer::pull::Config {
            durable_name: Some(durable.clone()),
            filter_subject: self.filter.clone(),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: start,
            },
            ack_wait: Duration::from_secs(5),
            max_ack_pending: 4096,
            ..Default::default()
        };
        let consumer = self
            .stream
            .get_or_create_consumer(durable, config)
            .await
            .map_err(|e| fail!("JetStream consumer {durable}: {e}"))?;
        self.messages = Some(
            consumer
                .messages()
                .await
                .map_err(|e| fail!("JetStream consumer {durable}: {e}"))?,
        );
        Ok(())
    }

    /// Whether nothing is left for this consumer: every stored frame delivered and
    /// acknowledged (by this side or, round-robin, by another member).
    pub(super) async fn drained(&mut self) -> bool {
        match self.stream.consumer_info(&self.durable).await {
            Ok(i) => i.num_pending == 0 && i.num_ack_pending == 0,
            Err(_) => false,
        }
    }

    /// Whether the connection to the server was made again since the last look.
    pub(super) fn reconnected(&mut self) -> bool {
        let now = self.connects.load(std::sync::atomic::Ordering::Acquire);
        std::mem::replace(&mut self.seen, now) != now
    }

    pub(super) async fn next(&mut self) -> Option<Result<jetstream::Message>> {
        match self.messages.as_mut() {
            Some(m) => m
                .next()
                .await
                .map(|r| r.map_err(|e| fail!("JetStream: {e}"))),
            None => std::future::pending().await,
        }
    }
}

/// A sink stream's NATS half: its subscription or JetStream consumer, its keys.
pub struct SinkHalf {
    pub(super) plan: Plan,
    pub(super) input: Input,
    pub(super) end_sub: Option<async_nats::Subscriber>,
    pub(super) once: bool,
    pub(super) finish: watch::Receiver<bool>,
    pub(super) keys: KeyWatch,
    pub(super) side: Side,
    pub(super) peer: &'static str,
}

/// How many frames the sink endpoint completed so far.
pub type Completed = Box<dyn Fn() -> u64 + Send + Sync>;

impl SinkHalf {
    /// The stream.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Takes the stream's records through `stack` (built afresh by `rebuild` for a restarted
    /// device side) to the sink endpoint's `frames`, acknowledging what it `completed`, until
    /// the stream's END or the side stops.
    pub async fn run(
        self,
        frames: mpsc::Sender<Frame>,
        stack: Stack,
        rebuild: Rebuild,
        completed: Completed,
        tally: Arc<dyn Tally>,
    ) -> Result<()> {
        pump_sink(self, stack, rebuild, frames, completed, tally).await
    }
}

/// NATS → [`SinkFlow`] (the rules: backpressure, acknowledgements, restarts, the END; sans-IO
/// in `ndd-link`) → sink endpoint. This loop only moves messages, keys, the sink's
/// completions and time in, and frames, acknowledgements and log lines out.
async fn pump_sink(
    half: SinkHalf,
    stack: Stack,
    rebuild: Rebuild,
    tx: mpsc::Sender<Frame>,
    done: Completed,
    stats: Arc<dyn Tally>,
) -> Result<()> {
    let SinkHalf {
        plan,
        mut input,
        mut end_sub,
        once,
        mut finish,
        mut keys,
        side,
        peer,
    } = half;
    let (stream, lossy) = (plan.id, !plan.reliable);
    // Stored frames of this side's own consumer come back in their order after a server
    // restart (round-robin members each see only some of a subject's frames: no order).
    let ordered = matches!(&input, Input::Stored(s) if s.ordered);
    let mut rx = keys.receiver(side, stream, ordered);
    if let Input::Stored(s) = &input {
        rx.intake().consumer_start(s.start);
        // Where the process before this one stood when it acknowledged last: what it handed
        // on is behind the order.
        if let Some(p) = s
            .position
            .as_ref()
            .filter(|_| s.resumed)
            .and_then(PositionFile::read)
        {
            rx.intake().take_up(p);
        }
        // What the process before this one had opened when it acknowledged last: copies of
        // those frames stored since are dropped.
        match s.windows.as_ref().map(WindowsFile::read) {
            Some(Ok(Some(w))) => rx.intake().carry(w),
            Some(Err(path)) => tracing::warn!(
                side = "device",
                "{} is damaged (cut short by a crash of the machine, or not ndd's): this side does not know what the process before it opened, and copies of frames it took may be taken again",
                path.display()
            ),
            _ => {}
        }
    }
    let mode = Mode {
        once,
        lossy,
        stored: matches!(&input, Input::Stored(_)),
    };
    let mut flow = SinkFlow::new(rx, stack, rebuild, mode);
    let mut pump = SinkPump {
        tx: Some(tx),
        stats,
        logs: Logs::default(),
        told: FlowTold::default(),
        peer,
    };
    let r = pump
        .run(
            &mut flow,
            &mut input,
            &mut end_sub,
            &mut finish,
            &mut keys,
            &done,
        )
        .await;
    pump.stats.layers(flow.stack());
    r
}

/// Rate limits of what a sink's stream says in the log: what the server says goes wrong may
/// come with every message, or every 20 ms tick.
#[derive(Default)]
struct Logs {
    bad: ndd_core::RateLimit,
    gaps: ndd_core::RateLimit,
    attach_failed: ndd_core::RateLimit,
    server_errors: ndd_core::RateLimit,
}

/// What the stats were last told of the flow's counters.
#[derive(Default)]
struct FlowTold {
    records: u64,
    bytes: u64,
    dropped: u64,
    stale: u64,
}

struct SinkPump {
    /// The sink's channel; closed when the END is final.
    tx: Option<mpsc::Sender<Frame>>,
    stats: Arc<dyn Tally>,
    logs: Logs,
    told: FlowTold,
    peer: &'static str,
}

type Flow = SinkFlow<RunInverse, jetstream::Message>;

impl SinkPump {
    async fn run(
        &mut self,
        flow: &mut Flow,
        input: &mut Input,
        end_sub: &mut Option<async_nats::Subscriber>,
        finish: &mut watch::Receiver<bool>,
        keys: &mut KeyWatch,
        done: &Completed,
    ) -> Result<()> {
        self.logs.bad = ndd_core::RateLimit::with_burst(Duration::from_secs(1), 5);
        let mut check = tokio::time::interval(Duration::from_millis(20));
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopping = false;
        let mut asking: Option<(Wait, Asked)> = None;
        loop {
            keys.follow(flow.receiver());
            self.count(flow);
            self.hand_ready(flow)?;
            match flow.poll(Instant::now()).map_err(|e| fail!("{e}"))? {
                Some(Action::Frames) => continue,
                Some(Action::Done) => return Ok(()),
                Some(Action::Wait(w)) => {
                    // Asked once, and waited for in the select beside the rest (the receiver
                    // says the same until what it waits for is brought).
                    asking.get_or_insert_with(|| (w, keys.ask(w)));
                }
                Some(Action::Said(e)) => {
                    keys.said(&e);
                    continue;
                }
                Some(Action::Notice(n)) => {
                    self.notice(n);
                    continue;
                }
                Some(Action::Ack(a)) => {
                    if let Input::Stored(s) = &mut *input {
                        if let (Some(f), Some(k)) = (s.position.as_mut(), a.kept) {
                            f.write(k);
                        }
                        if let (Some(f), Some(w)) = (s.windows.as_mut(), &a.windows) {
                            f.write(w);
                        }
                    }
                    ack_in_order(flow.receiver().intake(), a.msgs).await;
                    continue;
                }
                Some(Action::CheckDrained) => {
                    let drained = match &mut *input {
                        Input::Stored(s) => s.drained().await,
                        Input::Core(_) => true,
                    };
                    flow.handle_drained(Instant::now(), drained);
                    continue;
                }
                Some(Action::EndSink) => {
                    self.tx = None;
                    continue;
                }
                None => {}
            }
            // Nothing to do at once: wait for what comes first.
            let wake = flow.poll_timeout();
            let waiting_tx = self.tx.clone().filter(|_| flow.has_frame());
            let reading = flow.wants_input();
            tokio::select! {
                _ = finish.changed(), if !stopping => {
                    // This side stops: what the stack holds goes to the sink, and the
                    // stream ends (its sink finishes and reports).
                    stopping = true;
                    flow.handle_finish(Instant::now()).map_err(|e| fail!("{e}"))?;
                }
                // The frame that waited for a busy sink goes once it has room.
                permit = async { waiting_tx.as_ref().expect("waiting").reserve().await }, if waiting_tx.is_some() => {
                    let permit = permit.map_err(|_| fail!("the sink endpoint stopped accepting frames"))?;
                    if let Some(f) = flow.poll_frame() {
                        self.delivered(&f, flow);
                        permit.send(f);
                    }
                }
                m = next_input(input), if reading => match (m, &mut *input) {
                    (None, Input::Stored(s)) => self.consumer_ended(s),
                    (m, _) => self.take(flow, m),
                },
                Some(m) = async {
                    match end_sub.as_mut() {
                        Some(s) => s.next().await,
                        None => std::future::pending().await,
                    }
                }, if reading => {
                    flow.handle_message(Instant::now(), &m.payload, None);
                }
                _ = sleep_until_opt(wake) => {
                    flow.handle_timeout(Instant::now()).map_err(|e| fail!("{e}"))?;
                }
                _ = check.tick() => {
                    let now = Instant::now();
                    flow.handle_completed(now, done());
                    flow.handle_tick(now);
                    self.reattach(flow, input).await;
                }
                ok = async { asking.as_mut().expect("asking").1.as_mut().await }, if asking.is_some() => {
                    let (w, _) = asking.take().expect("asking");
                    if !ok {
                        return Ok(());
                    }
                    if let Err(e) = keys.brought(flow.receiver(), w) {
                        unopened(&mut self.logs.bad, &e);
                    }
                }
            }
        }
    }

    /// Hands the frames that wait to the sink while it has room (a reliable stream's reads no
    /// message meanwhile: backpressure; a lossy one's newest replaces the one waiting).
    fn hand_ready(&mut self, flow: &mut Flow) -> Result<()> {
        let Some(tx) = self.tx.clone() else {
            return Ok(());
        };
        let closed = || fail!("the sink endpoint stopped accepting frames");
        while flow.has_frame() {
            // Never waited for here: a sink with no room is waited for in the select, beside
            // the stop, the ticks and the timers (a stuck sink must not hang the side).
            let permit = match tx.try_reserve() {
                Ok(p) => p,
                Err(mpsc::error::TrySendError::Full(())) => break,
                Err(mpsc::error::TrySendError::Closed(())) => return Err(closed()),
            };
            if let Some(f) = flow.poll_frame() {
                self.delivered(&f, flow);
                permit.send(f);
            }
        }
        Ok(())
    }

    fn delivered(&self, f: &Frame, flow: &Flow) {
        self.stats
            .delivered(f.len(), f.meta.timestamp_ns, flow.stack());
    }

    /// The receiver's and the flow's counters into the stream's stats.
    fn count(&mut self, flow: &mut Flow) {
        let stale = flow.counters().stale;
        let rx = flow.receiver();
        let t = &mut self.told;
        if rx.records != t.records || rx.dropped() != t.dropped || stale != t.stale {
            self.stats
                .wire(rx.records - t.records, rx.record_bytes - t.bytes);
            self.stats
                .dropped(rx.dropped() - t.dropped, stale - t.stale, 0);
            (t.records, t.bytes, t.dropped, t.stale) =
                (rx.records, rx.record_bytes, rx.dropped(), stale);
        }
    }

    /// A message off a subscription or a JetStream consumer.
    fn take(&mut self, flow: &mut Flow, m: Option<Result<(Bytes, Option<jetstream::Message>)>>) {
        let (payload, stored) = match m {
            // The subscription ended (the connection is gone for good): so does the stream.
            None => {
                let _ = flow.handle_finish(Instant::now());
                return;
            }
            Some(Ok(x)) => x,
            Some(Err(e)) => {
                // The server's words in it: escaped.
                if let Some(suppressed) = self.logs.server_errors.admit(Instant::now()) {
                    tracing::warn!(
                        suppressed,
                        "JetStream: {}; going on",
                        printable(&e.to_string(), MAX_REASON)
                    );
                }
                return;
            }
        };
        let stored = stored.map(|m| {
            let seq = m.info().ok().map(|i| i.stream_sequence);
            tracing::trace!(stream_seq = seq, "stored frame");
            (seq, m)
        });
        match flow.handle_message(Instant::now(), &payload, stored) {
            Taken::Queued => {}
            Taken::Copy => self.stats.dropped(0, 0, 1),
            Taken::Malformed => {
                if let Some(suppressed) = self.logs.bad.admit(Instant::now()) {
                    tracing::warn!(
                        suppressed,
                        "dropped a NATS message shorter than a frame record"
                    );
                }
            }
            Taken::Foreign => {
                // Every stream has subjects of its own: a record naming another stream was
                // moved here by someone who may publish.
                self.stats.dropped(1, 0, 0);
                if let Some(suppressed) = self.logs.bad.admit(Instant::now()) {
                    tracing::warn!(
                        suppressed,
                        "dropped a frame of another stream published on this stream's subject"
                    );
                }
            }
        }
    }

    fn notice(&mut self, n: Notice) {
        let now = Instant::now();
        match n {
            Notice::Unopened(e) => unopened(&mut self.logs.bad, &e),
            Notice::Refused(e) => {
                if let Some(suppressed) = self.logs.bad.admit(now) {
                    tracing::warn!(
                        suppressed,
                        "{}; frame dropped",
                        printable(&e.to_string(), MAX_REASON)
                    );
                }
            }
            Notice::GaveUp { skipped } => {
                self.stats.given_up(skipped);
                if let Some(suppressed) = self.logs.gaps.admit(now) {
                    tracing::warn!(
                        skipped,
                        suppressed,
                        "stored frames that never came were given up after {REORDER_WAIT:?}"
                    );
                }
            }
            // (Found by hand: after a device restart every app side's `image` inverse
            // refused the new run's frames, `credit number did not increase`.)
            Notice::Restarted { old, new } => tracing::info!(
                old = format_args!("{:016x}", old.0),
                old_seq = old.1,
                new = format_args!("{:016x}", new.0),
                seq = new.1,
                "the device side restarted; this stream's pairs start afresh"
            ),
            Notice::SourceEnded => tracing::info!(
                "{} source of this stream ended; waiting for it to start again",
                self.peer
            ),
            Notice::EndingTimedOut => tracing::warn!(
                "the stream ended with stored frames still unacknowledged after {ENDING_WAIT:?}; stopping anyway"
            ),
            Notice::SinkUnfinished { handed, completed } => tracing::warn!(
                handed,
                completed,
                "the stream ended but the sink did not complete what it was handed within {FINISH_WAIT:?}; what it did not is left unacknowledged (it comes again)"
            ),
        }
    }

    /// The consumer's messages ended (the consumer deleted, or a status saying so — which
    /// anyone who may publish on the pull's inbox can send): attached again at the next tick,
    /// where this side acknowledged last. Before, the stream took it as its end and stopped
    /// for good (found by a review).
    fn consumer_ended(&mut self, s: &mut Stored) {
        if let Some(suppressed) = self.logs.attach_failed.admit(Instant::now()) {
            tracing::warn!(
                suppressed,
                "the JetStream consumer {} stopped delivering; attaching again",
                printable(&s.durable, MAX_REASON)
            );
        }
        s.messages = None;
        s.again.handle_lost();
    }

    /// Back from a server restart, or the consumer stopped: attached again as [`Reattach`]
    /// says (what was on its way to this side when the server went comes again at once and
    /// in order, not after the ack wait).
    async fn reattach(&mut self, flow: &mut Flow, input: &mut Input) {
        let Input::Stored(s) = input else {
            return;
        };
        if s.reconnected() {
            s.again.handle_lost();
        }
        let now = Instant::now();
        if !s.again.due(now) {
            return;
        }
        let intake = flow.receiver().intake();
        let from = Reattach::from(intake.acked_to(), intake.through(), s.start);
        let r = s.attach(from, false).await;
        if *s.stop.borrow() {
            // (Ended by this side's stop: nothing to try again or say.)
            return;
        }
        flow.receiver().intake().consumer_start(s.start);
        let wait = s.again.handle_attached(Instant::now(), r.is_ok());
        if let (Err(e), Some(wait)) = (r, wait) {
            // The server's words in it: escaped.
            if let Some(suppressed) = self.logs.attach_failed.admit(Instant::now()) {
                tracing::warn!(
                    suppressed,
                    "{}; trying again in {} ms",
                    printable(&e.to_string(), MAX_REASON),
                    wait.as_millis()
                );
            }
        }
    }
}

/// The next message of a sink's input.
async fn next_input(input: &mut Input) -> Option<Result<(Bytes, Option<jetstream::Message>)>> {
    match input {
        Input::Core(s) => s.next().await.map(|m| Ok((m.payload, None))),
        Input::Stored(s) => s
            .next()
            .await
            .map(|r| r.map(|m| (m.payload.clone(), Some(m)))),
    }
}

/// Says (a few times a second at most) that a record did not open under the group key.
pub(super) fn unopened(bad: &mut ndd_core::RateLimit, e: &ndd_core::ModuleError) {
    if let Some(suppressed) = bad.admit(Instant::now()) {
        tracing::warn!(
            suppressed,
            "dropped a frame that does not open under the group key: {}",
            printable(&e.to_string(), MAX_REASON)
        );
    }
}

/// Acknowledges `msgs` in order; the last one waits for the server's confirmation, which
/// covers the others.
pub(super) async fn ack_in_order(
    intake: &mut Intake<jetstream::Message>,
    msgs: Vec<jetstream::Message>,
) {
    let n = msgs.len();
    for (i, m) in msgs.into_iter().enumerate() {
        let r = if i + 1 == n {
            m.double_ack().await
        } else {
            m.ack().await
        };
        if r.is_ok() {
            if let Ok(info) = m.info() {
                intake.acked(info.stream_sequence);
            }
        }
    }
}
