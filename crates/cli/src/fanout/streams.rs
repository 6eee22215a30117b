//! What each stream is on the NATS link and the task that runs it.

use super::*;

/// What a stream is on the NATS link.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) index: usize,
    pub(super) id: u16,
    pub(super) name: String,
    pub(super) reliable: bool,
    /// This side runs the stream's source.
    pub(super) source: bool,
    /// `split` pieces per frame, if the stream splits.
    pub(super) split: Option<u16>,
    /// The stream goes round-robin.
    pub(super) round_robin: bool,
    /// A picture in broadcast (`image` with `keyframe_ms`): an app side that comes back
    /// starts at what is stored after it joined (from its next keyframe: the screen now), not
    /// where it stopped (a replay of everything it missed, older runs of the device included).
    pub(super) now_only: bool,
}

impl Plan {
    /// The stream as a sink sees it ([`ndd_link::nats::input::sink_input`]).
    pub(super) fn shape(&self) -> ndd_link::nats::input::SinkShape {
        ndd_link::nats::input::SinkShape {
            id: self.id,
            reliable: self.reliable,
            split: self.split,
            round_robin: self.round_robin,
            now_only: self.now_only,
        }
    }
}

pub(super) fn plans(cfg: &Config, side: SideName) -> Vec<Plan> {
    cfg.streams
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mux = s.pairs().into_iter().find_map(|m| match m {
                ModuleConfig::Multiplex(c) => Some(c.clone()),
                _ => None,
            });
            Plan {
                index: i,
                id: Config::stream_id(i),
                name: s.name().to_string(),
                reliable: s.reliability == Reliability::Reliable,
                source: s.direction.source_side() == side,
                split: mux
                    .as_ref()
                    .filter(|m| m.mode == ndd_modules::multiplex::Mode::Split)
                    .map(|m| m.parts),
                round_robin: mux
                    .as_ref()
                    .is_some_and(|m| m.mode == ndd_modules::multiplex::Mode::RoundRobin),
                now_only: s
                    .pairs()
                    .into_iter()
                    .any(|m| matches!(m, ModuleConfig::Image(c) if c.keyframe_ms > 0)),
            }
        })
        .collect()
}

pub(super) fn user_stack(cfg: &Config, plan: &Plan, role: Role) -> Result<Stack> {
    let pairs: Vec<&dyn Pair> = cfg.streams[plan.index]
        .pairs()
        .into_iter()
        .map(|m| m as &dyn Pair)
        .collect();
    Stack::build(role, &plan.name, &pairs).map_err(|e| anyhow!("{e}"))
}

/// Starts one stream's endpoint and its task.
#[allow(clippy::too_many_arguments)]
pub(super) async fn spawn_stream(
    cfg: &Config,
    ctx: &Ctx,
    plan: &Plan,
    key: &watch::Receiver<GroupKey>,
    refresh: Option<&Refresh>,
    js: Option<jetstream::Context>,
    app: Option<(&Admission, &str, u64)>,
    once: bool,
    finish: &watch::Receiver<bool>,
    stats: &[Shared<StreamStats>],
    tasks: &mut JoinSet<Result<Option<(String, ndd_endpoint::CheckReport)>>>,
) -> Result<Option<tokio::task::AbortHandle>> {
    let s = &cfg.streams[plan.index];
    let stats = stats[plan.index].clone();
    let name = plan.name.clone();
    let (tx, rx) = mpsc::channel::<Frame>(64);
    if plan.source {
        let source = s
            .source
            .spawn_on_demand(plan.id, tx, None)
            .with_context(|| {
                format!(
                    "stream \"{name}\": cannot start source {}",
                    s.source.describe()
                )
            })?;
        let stack = user_stack(cfg, plan, Role::Source)?;
        let mut keys = key.clone();
        let out = Publisher::new(ctx, plan, *keys.borrow_and_update(), js, refresh.cloned())?;
        let endpoint = source.abort_handle();
        let finish = finish.clone();
        let described = s.source.describe();
        tasks.spawn(async move {
            let mut stack = stack;
            let mut source = source;
            let r = pump_source(rx, finish, &mut stack, keys, out, stats.clone()).await;
            lock(&stats).layers = stack.stats();
            // A source that failed fails the side with its words (its stream's END went).
            let failed = match r {
                Ok(()) => crate::session::source_failure(&mut source, &name, &described).await,
                Err(_) => None,
            };
            source.abort();
            match failed {
                Some(e) => Err(e),
                None => r.map(|()| None),
            }
        });
        return Ok(Some(endpoint));
    } else {
        let done = Delivered::default();
        let sink = s.sink.spawn_tracked(rx, done.clone()).with_context(|| {
            format!("stream \"{name}\": cannot start sink {}", s.sink.describe())
        })?;
        let stack = user_stack(cfg, plan, Role::Sink)?;
        // For a restarted device side: the same pairs, afresh.
        let rebuild: ndd_link::nats::deliver::Rebuild = {
            let pairs: Vec<ModuleConfig> = cfg.streams[plan.index]
                .pairs()
                .into_iter()
                .cloned()
                .collect();
            let name = plan.name.clone();
            Box::new(move || {
                let pairs: Vec<&dyn Pair> = pairs.iter().map(|m| m as &dyn Pair).collect();
                Stack::build(Role::Sink, &name, &pairs)
            })
        };
        let stale = (ctx.side == SideName::Device).then(|| ctx.run_stale.clone());
        let keys = KeyWatch {
            key: key.clone(),
            refresh: refresh.cloned(),
            stale,
        };
        let began = key.borrow().oldest_began();
        let input = subscribe(ctx, plan, js, app, began, finish).await?;
        let lossy = !plan.reliable;
        let end_sub = if plan.round_robin && app.is_some() {
            let subject = ctx.subjects.end(plan.id);
            Some(ctx.subscribe(&subject).await?)
        } else {
            None
        };
        let finish = finish.clone();
        let id = plan.id;
        let side = ctx.side;
        let peer = if app.is_some() {
            "the device side's"
        } else {
            "an app side's"
        };
        tasks.spawn(async move {
            let r = pump_sink(
                id,
                input,
                end_sub,
                once,
                finish,
                lossy,
                stack,
                rebuild,
                keys,
                side,
                tx,
                done,
                stats.clone(),
                peer,
            )
            .await;
            let report = match sink.await {
                Ok(Ok(rep)) => rep.check.map(|c| (name.clone(), c)),
                Ok(Err(e)) => {
                    return Err(anyhow!(e).context(format!("stream \"{name}\": sink failed")))
                }
                Err(_) => None,
            };
            r?;
            Ok(report)
        });
    }
    Ok(None)
}
