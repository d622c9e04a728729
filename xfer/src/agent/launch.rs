//! The launch service: the launcher's requests (and the agents' own group
//! stops). A preflight gathers this node's facts, a reach probe listens
//! and connects for a window, and the rank requests start, report, stop
//! and read the logs of this node's ranks ([`super::ranks`]). All of it is
//! an operator's, except that a node may ask about and stop the runs it
//! is a member of (a failed rank stops its group).

use std::time::Duration;

use anyhow::Result;

use super::{answer, read_or_refuse, Caller, LaunchCtx as Ctx};
use xfer_proto::admin::ModelState;
use xfer_proto::frame::REQUEST_LIMIT;
use xfer_proto::launch::{LaunchReply, LaunchRequest, Probe, RankSpec};
use xfer_proto::refusal::Refusal;

/// Answers the one request on a launch stream.
pub(super) async fn serve(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    ctx: &Ctx,
    caller: &Caller,
) -> Result<()> {
    let request: LaunchRequest =
        read_or_refuse(ctx, &mut send, &mut recv, REQUEST_LIMIT, "launch request").await?;
    let me = ctx.runner.me().unwrap_or_else(|| "this node".into());
    let own_run = |run: &Option<String>| {
        let node = caller.peer.name();
        matches!((run, node), (Some(run), Some(node)) if ctx.ranks.in_group(run, node.as_str()))
    };
    let what = match &request {
        LaunchRequest::StopRun { run, .. } if own_run(run) => None,
        LaunchRequest::StopRun { .. } => Some("stop a run it is not a member of"),
        LaunchRequest::RunQuery { .. } => Some("ask about runs"),
        LaunchRequest::Preflight(_) => Some("run a preflight"),
        LaunchRequest::Reach { .. } => Some("run a reach probe"),
        LaunchRequest::StartRank(_) => Some("start a rank"),
        LaunchRequest::ReadLog { .. } => Some("read a rank's log"),
        LaunchRequest::Rendezvous(_) => Some("run a rendezvous probe"),
        LaunchRequest::HeldRendezvous { .. } => Some("read a held rank's rendezvous"),
        LaunchRequest::Release { .. } => Some("release a held rank"),
    };
    if let Some(Err(r)) = what.map(|what| caller.operator_only(&me, what)) {
        return answer(&conn, send, &LaunchReply::Failed(r)).await;
    }
    let reply = match request {
        LaunchRequest::Preflight(request) => {
            let states = model_states(ctx);
            let node = request.node.to_string();
            let permits = ctx.permits.clone();
            let may_run = move |argv: &[String]| permits.may_run(&node, argv);
            let image = request.image.clone();
            let loader_link = request.loader_link;
            let mut facts =
                super::preflight::gather(*request, ctx.store.clone(), states, &may_run).await;
            facts.containers = match ctx.permits.engine() {
                None => Probe::Skipped(super::images::engine_off(&me)),
                Some(engine) => engine.facts(image.as_deref()).await,
            };
            if loader_link {
                let socket = super::local::socket_path(ctx.store.root());
                let model = facts.weights.model.clone().unwrap_or_default();
                facts.loader_link = super::local::probe(&socket, &model).await;
            }
            LaunchReply::PreflightReport(Box::new(facts))
        }
        LaunchRequest::Reach {
            listen,
            peers,
            window_ms,
        } => {
            let window = Duration::from_millis(window_ms.min(60_000));
            let (listen, reach) = super::preflight::reach::probe(listen, &peers, window).await;
            LaunchReply::Reached { listen, reach }
        }
        LaunchRequest::StartRank(spec) => {
            let peer = caller;
            let (rank, run) = (spec.rank, spec.run.clone());
            match admit(ctx, *spec).await {
                Err(why) => {
                    tracing::warn!("refused rank {rank} of run {run} for {peer}: {why}");
                    LaunchReply::Failed(Refusal::Forbidden(why.to_string()))
                }
                Ok(spec) => {
                    let argv: Vec<String> = spec.procs.iter().map(|p| p.argv.join(" ")).collect();
                    tracing::info!(
                        "starting rank {} of run {} for {peer}: {}",
                        spec.rank,
                        spec.run,
                        argv.join(" ; ")
                    );
                    if let (true, Some(gate)) = (spec.evict_page_cache, &spec.weights) {
                        let dir = std::path::PathBuf::from(&gate.path);
                        let evicted = tokio::task::spawn_blocking(move || {
                            crate::sysinfo::pagecache::evict_model(&dir)
                        })
                        .await;
                        match evicted {
                            Ok(Ok(bytes)) => tracing::info!(
                                "dropped {} of {} from the page cache before rank {}",
                                xfer_proto::units::Bytes(bytes),
                                gate.path,
                                spec.rank
                            ),
                            Ok(Err(why)) => tracing::warn!("{why}"),
                            Err(e) => tracing::warn!("the page-cache eviction failed: {e}"),
                        }
                    }
                    let used = spec
                        .weights
                        .as_ref()
                        .and_then(|w| ctx.keeper.model_of(&w.path));
                    match ctx.ranks.start(spec) {
                        Ok(report) => {
                            if let Some(name) = used {
                                let keeper = ctx.keeper.clone();
                                let _ =
                                    tokio::task::spawn_blocking(move || keeper.touch(&name)).await;
                            }
                            LaunchReply::Runs(vec![report])
                        }
                        Err(e) => LaunchReply::Failed(Refusal::Busy(e.to_string())),
                    }
                }
            }
        }
        LaunchRequest::RunQuery { run } => LaunchReply::Runs(ctx.ranks.reports(run.as_deref())),
        LaunchRequest::StopRun {
            run,
            grace_ms,
            reason,
        } => {
            tracing::info!(
                "stopping run {} for {caller}: {reason}",
                run.as_deref().unwrap_or("(all)")
            );
            let grace = Duration::from_millis(grace_ms.min(600_000));
            LaunchReply::Runs(ctx.ranks.stop(run.as_deref(), grace, &reason).await)
        }
        LaunchRequest::HeldRendezvous { run, timeout_ms } => {
            let timeout = Duration::from_millis(timeout_ms.clamp(1_000, 600_000));
            let met = ctx.ranks.held_rendezvous(&run, timeout).await;
            match &met {
                Probe::Ok(ms) => tracing::info!(
                    "the rendezvous of run {run} was met by its held engine in {ms} ms"
                ),
                other => tracing::warn!("the rendezvous of run {run}: {other:?}"),
            }
            LaunchReply::Rendezvoused(met)
        }
        LaunchRequest::Rendezvous(req) => {
            match ctx
                .permits
                .may_run(req.node.as_str(), std::slice::from_ref(&req.python_of))
            {
                Err(why) => LaunchReply::Rendezvoused(Probe::Failed(why.to_string())),
                Ok(program) => {
                    let mut req = *req;
                    req.python_of = program[0].clone();
                    LaunchReply::Rendezvoused(super::preflight::rendezvous::probe(&req).await)
                }
            }
        }
        LaunchRequest::Release { run } => match ctx.ranks.release(&run) {
            Ok(report) => {
                tracing::info!("released run {run} for {caller}: its preflight passed");
                LaunchReply::Runs(vec![report])
            }
            Err(e) => LaunchReply::Failed(Refusal::Protocol(e.to_string())),
        },
        LaunchRequest::ReadLog { run, offset, max } => {
            match ctx.ranks.read_log(&run, offset, max) {
                Ok(chunk) => LaunchReply::Log(Box::new(chunk)),
                Err(e) => LaunchReply::Failed(Refusal::Protocol(e.to_string())),
            }
        }
    };
    answer(&conn, send, &reply).await
}

/// Why this agent starts no rank of a spec: one line naming the node and
/// the fix, sent back as the refusal.
#[derive(Debug, thiserror::Error)]
enum AdmitError {
    /// A program the permits refuse.
    #[error(transparent)]
    Permit(#[from] super::permit::PermitError),
    /// Outside [`xfer_proto::launch_rules`].
    #[error("{node}: {source}")]
    Rules {
        /// This node.
        node: String,
        /// Why.
        source: xfer_proto::launch_rules::Refused,
    },
    /// The weights check found a problem.
    #[error("{node}: not starting rank {rank} on {path}: {problem}")]
    WeightsProblem {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// The weights' path.
        path: String,
        /// The check's line.
        problem: String,
    },
    /// The weights are not held with the root the launch checked.
    #[error("{node}: not starting rank {rank} on {path}: it is {state} with root {root}, where the launch checked root {want}; wait for xfer sync to finish, then run xfer-launch up again")]
    WeightsChanged {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// The weights' path.
        path: String,
        /// Their state's label, or `not held`.
        state: &'static str,
        /// Their root (short), or `none`.
        root: String,
        /// The gate's root (short).
        want: String,
    },
    /// The compile caches cannot be used.
    #[error(transparent)]
    Caches(#[from] super::caches::CacheError),
    /// The compile caches' copy did not finish.
    #[error("{node}: the compile caches' copy failed: {source}")]
    CacheTask {
        /// This node.
        node: String,
        /// Why.
        source: tokio::task::JoinError,
    },
    /// The spec names an image and this agent has no container engine.
    #[error("{}", super::images::engine_off(node))]
    EngineOff {
        /// This node.
        node: String,
    },
    /// The engine cannot say which image the reference is.
    #[error("{node}: {source}")]
    Engine {
        /// This node.
        node: String,
        /// Why.
        source: crate::image::runtime::RuntimeError,
    },
    /// The image changed since the launch's gate saw it.
    #[error("{node}: not starting rank {rank}: image {image} is {now} here, where the launch checked {want}; run `xfer image push {image} --cluster FILE`, then xfer-launch up again")]
    ImageChanged {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// The image reference.
        image: String,
        /// Its id here (short), or `not loaded`.
        now: String,
        /// The id the launch checked (short).
        want: String,
    },
    /// The container form cannot be built.
    #[error(transparent)]
    Container(#[from] super::containers::ContainerError),
}

/// The spec as this agent starts it, or why it starts nothing: every
/// program allowed by `--allow-exec` and, on the host, replaced by its
/// absolute path on the agent's own `PATH`; the environment and devices
/// within [`xfer_proto::launch_rules`] (checked here whatever the launcher
/// checked); the weights still held; in its container when it names one.
async fn admit(ctx: &Ctx, mut spec: RankSpec) -> Result<RankSpec, AdmitError> {
    let node = spec.node.to_string();
    let permits = &ctx.permits;
    if spec.container.is_some() {
        // The programs are the image's; the host runs the engine's own,
        // resolved when the agent started.
        for argv in spec.procs.iter().map(|p| &p.argv).chain(&spec.on_stop) {
            permits.may_name(&node, argv)?;
        }
    } else {
        for p in spec.procs.iter_mut() {
            p.argv = permits.may_run(&node, &p.argv)?;
        }
        for argv in spec.on_stop.iter_mut() {
            *argv = permits.may_run(&node, argv)?;
        }
    }
    xfer_proto::launch_rules::check_spec(&spec)
        .map_err(|source| AdmitError::Rules { node, source })?;
    weights_still_held(ctx, &spec)?;
    caches_materialised(ctx, &spec).await?;
    in_container(ctx, spec).await
}

/// The launcher's weight gate, checked again here, right before a rank
/// starts: this node must hold the weights at the gate's path, complete
/// and verified, with the root every node had. A model removed, resynced
/// or damaged since the preflight stops the launch here.
fn weights_still_held(ctx: &Ctx, spec: &RankSpec) -> Result<(), AdmitError> {
    let Some(gate) = &spec.weights else {
        return Ok(());
    };
    let facts =
        super::preflight::weights::weights(&ctx.store, &model_states(ctx), &gate.path, None);
    let node = spec.node.to_string();
    if let Some(problem) = facts.problems.first() {
        return Err(AdmitError::WeightsProblem {
            node,
            rank: spec.rank,
            path: gate.path.clone(),
            problem: problem.clone(),
        });
    }
    let held = matches!(
        facts.state,
        Some(ModelState::Complete | ModelState::Verifying)
    );
    if !held || facts.root != Some(gate.root) {
        return Err(AdmitError::WeightsChanged {
            node,
            rank: spec.rank,
            path: gate.path.clone(),
            state: facts.state.map_or("not held", |s| s.label()),
            root: facts
                .root
                .map_or("none".to_string(), |r| r.short().to_string()),
            want: gate.root.short().to_string(),
        });
    }
    Ok(())
}

/// The rank's compile caches copied from their verified snapshot into
/// the live folder its engine uses ([`super::caches`]), before it starts.
async fn caches_materialised(ctx: &Ctx, spec: &RankSpec) -> Result<(), AdmitError> {
    let Some(gate) = spec.caches.clone() else {
        return Ok(());
    };
    let (store, states) = (ctx.store.clone(), model_states(ctx));
    let (node, rank) = (spec.node.to_string(), spec.rank);
    let done = tokio::task::spawn_blocking(move || {
        super::caches::materialise(&store, &states, &node, rank, &gate)
    })
    .await
    .map_err(|source| AdmitError::CacheTask {
        node: spec.node.to_string(),
        source,
    })??;
    tracing::info!(
        "rank {} of run {}: compile caches ready ({} file(s), {} copied from the verified snapshot, {} already live)",
        spec.rank,
        spec.run,
        done.copied + done.kept,
        xfer_proto::units::Bytes(done.bytes),
        done.kept
    );
    Ok(())
}

/// The spec as this agent runs it: inside its image when it names one
/// (the image checked again, right before the start, to be the id the
/// launch's gate saw on every node).
async fn in_container(ctx: &Ctx, spec: RankSpec) -> Result<RankSpec, AdmitError> {
    let Some(c) = spec.container.clone() else {
        return Ok(spec);
    };
    let node = spec.node.to_string();
    let Some(engine) = ctx.permits.engine() else {
        return Err(AdmitError::EngineOff { node });
    };
    let now = engine
        .image_id(&c.image)
        .await
        .map_err(|source| AdmitError::Engine {
            node: node.clone(),
            source,
        })?;
    if let Some(want) = c.image_id {
        if now != Some(want) {
            return Err(AdmitError::ImageChanged {
                node,
                rank: spec.rank,
                image: c.image.clone(),
                now: now.map_or("not loaded".to_string(), |d| d.short()),
                want: want.short(),
            });
        }
    }
    Ok(super::containers::wrap(spec, &c, engine, ctx.store.root())?)
}

/// What `xfer status` says of each model on this node, by name: the
/// weight checks read it.
fn model_states(ctx: &Ctx) -> std::collections::HashMap<String, ModelState> {
    ctx.activity
        .report(&ctx.store, ctx.runner.me(), &ctx.runner.records())
        .models
        .into_iter()
        .map(|m| (m.name, m.state))
        .collect()
}
