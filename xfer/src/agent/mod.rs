//! `xfer serve`: the node agent.
//!
//! Accepts mutually authenticated QUIC connections and reads the first
//! message of the control stream. An offer opens a
//! [`Transfer`](crate::store::Transfer) in the store and pulls the missing
//! chunks from the offering source and, in a swarm, from the other receivers
//! ([`crate::flow::swarm`]), reporting progress back to the source; a join from
//! another receiver is served from this node's verified chunks; a want
//! serves a complete model it holds. A newer offer for the same model
//! supersedes a running one (a restarted push resumes instead of waiting for
//! the old connection to time out).

pub mod preflight;
pub mod ranks;
pub mod sync;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

use crate::agent::ranks::supervisor::Supervisor;
use crate::agent::sync::runner::Runner;
use crate::agent::sync::status::Activity;
use crate::config::auth::Credential;
use crate::engine::policy;
use crate::engine::scheduler;
use crate::flow::receive::{receive, Links, Received, Tally, SOURCE};
use crate::flow::swarm::{self, LinkPlan, Share, Shares};
use crate::store::{Store, Transfer};
use crate::transport::files::HeldModel;
use crate::transport::quic::{self, read_frame, write_frame};
use crate::transport::rdma::link::{Nic, Offer};
use crate::transport::serve::{serve, Serving};
use crate::transport::Fetcher;
use xfer_proto::chunkset::ChunkSet;
use xfer_proto::control::{Control, Refusal, SwarmPeer};
use xfer_proto::names::{ModelName, PROTOCOL_VERSION};

/// How often a receiver reports its progress to the source.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// How the agent is started.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub listen: SocketAddr,
    pub root: PathBuf,
    pub key: PathBuf,
    pub scheduler: scheduler::Config,
    /// Re-hash complete models this often and repair damage from peers.
    pub verify_every: Option<Duration>,
    /// Serve Prometheus metrics here.
    pub metrics: Option<SocketAddr>,
    /// The RDMA NIC transfers use (`--transport`); `None`: QUIC only.
    pub nic: Option<Arc<dyn Nic>>,
}

/// Refused connections, logged so that a storm of them cannot grow the
/// log without bound: the first few of every window one line each, the
/// rest as one count when the next window starts.
#[derive(Default)]
struct RefusalLog {
    window: Option<std::time::Instant>,
    shown: u32,
    hidden: u64,
}

impl RefusalLog {
    /// Refusals logged one by one per window.
    const SHOWN: u32 = 5;
    const WINDOW: Duration = Duration::from_secs(10);

    fn refused(&mut self, remote: SocketAddr, why: &str) {
        let now = std::time::Instant::now();
        if self
            .window
            .is_none_or(|w| now.duration_since(w) >= Self::WINDOW)
        {
            if self.hidden > 0 {
                tracing::warn!(
                    "refused {} more connections in the last {} s (not logged one by one)",
                    self.hidden,
                    Self::WINDOW.as_secs()
                );
            }
            *self = RefusalLog {
                window: Some(now),
                ..RefusalLog::default()
            };
        }
        if self.shown < Self::SHOWN {
            self.shown += 1;
            tracing::warn!("refused connection from {remote}: {why}");
        } else {
            self.hidden += 1;
        }
    }
}

/// Running jobs by model name: a token to cancel each, and a lock the job
/// holds while it runs.
#[derive(Default)]
struct Jobs {
    by_name: Mutex<HashMap<ModelName, Job>>,
    next_id: std::sync::atomic::AtomicU64,
}

struct Job {
    id: u64,
    cancel: CancellationToken,
    slot: Arc<tokio::sync::Mutex<()>>,
}

/// Runs the agent until the process is stopped.
pub async fn run(opts: AgentOptions) -> Result<()> {
    let cred = Arc::new(Credential::load(&opts.key)?);
    let store = Store::open(&opts.root)?;
    let ep = quic::server_endpoint(opts.listen, &cred)?;
    println!(
        "xfer agent listening on {} root {} cluster {}",
        ep.local_addr()?,
        opts.root.display(),
        cred.cluster_id().short()
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    if let Some(addr) = opts.metrics {
        let listener = crate::util::metrics::serve(addr);
        tokio::spawn(async move {
            if let Err(e) = listener.await {
                tracing::error!("{e:#}");
            }
        });
    }
    let activity = Arc::new(Activity::default());
    {
        let activity = activity.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                activity.tick();
            }
        });
    }
    let ranks = Supervisor::open(&opts.root, cred.clone());
    let runner = Runner::new(
        store.clone(),
        opts.key.clone(),
        activity.clone(),
        opts.nic.clone(),
    );
    runner.resume_all();
    if let Some(every) = opts.verify_every {
        let runner = runner.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                runner.verify_all().await;
            }
        });
    }
    let ctx = Arc::new(Ctx {
        store,
        jobs: Jobs::default(),
        shares: Arc::default(),
        cfg: opts.scheduler,
        endpoint: ep.clone(),
        activity,
        runner,
        ranks,
        nic: opts.nic,
    });
    let refusals = Arc::new(Mutex::new(RefusalLog::default()));
    while let Some(incoming) = ep.accept().await {
        let ctx = ctx.clone();
        let refusals = refusals.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    let why = quic::describe(remote, &e);
                    refusals.lock().unwrap().refused(remote, &why);
                    return;
                }
            };
            if let Err(why) = quic::refuse_other_version(&conn, &format!("the node at {remote}")) {
                refusals.lock().unwrap().refused(remote, &why);
                return;
            }
            if let Err(e) = handle(conn.clone(), ctx).await {
                tracing::warn!("session with {remote} ended: {e:#}");
            }
            // Give the peer a moment to read our last message and close.
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
        });
    }
    Ok(())
}

/// What every connection handler shares.
struct Ctx {
    store: Store,
    jobs: Jobs,
    shares: Arc<Shares>,
    cfg: scheduler::Config,
    endpoint: quinn::Endpoint,
    activity: Arc<Activity>,
    runner: Arc<Runner>,
    ranks: Arc<Supervisor>,
    nic: Option<Arc<dyn Nic>>,
}

async fn handle(conn: quinn::Connection, ctx: Arc<Ctx>) -> Result<()> {
    let (mut send, mut recv) =
        tokio::time::timeout(Duration::from_secs(10), conn.accept_bi()).await??;
    let offer: Control = match read_frame(&mut recv).await {
        Ok(m) => m,
        Err(e) => {
            let r = Refusal::Protocol(format!("unreadable offer: {e:#}"));
            write_frame(&mut send, &Control::Failed(r.clone())).await?;
            let _ = send.finish();
            anyhow::bail!(r);
        }
    };
    let (name, manifest) = match offer {
        Control::Offer { version, .. }
        | Control::Want { version, .. }
        | Control::Join { version, .. }
        | Control::SyncJob { version, .. }
        | Control::StatusQuery { version }
        | Control::CancelJob { version, .. }
        | Control::RemoveModel { version, .. }
        | Control::Preflight { version, .. }
        | Control::StartRank { version, .. }
        | Control::RunQuery { version, .. }
        | Control::StopRun { version, .. }
        | Control::ReadLog { version, .. }
        | Control::Reach { version, .. }
            if version != PROTOCOL_VERSION =>
        {
            return refuse(
                &mut send,
                Refusal::Version {
                    ours: PROTOCOL_VERSION,
                    theirs: version,
                },
            )
            .await;
        }
        Control::Offer { name, manifest, .. } => (name, manifest),
        Control::Want { name, .. } => {
            return serve_model(conn, send, ctx.store.clone(), name, ctx.nic.clone()).await
        }
        Control::Join { name, root, .. } => {
            let (store, shares) = (ctx.store.clone(), ctx.shares.clone());
            return swarm::serve_peer(conn, send, store, shares, name, root, ctx.nic.clone()).await;
        }
        Control::SyncJob { node, job, .. } => {
            let id = job.id.clone();
            let reply = match ctx.runner.accept(node, job) {
                Ok(()) => Control::JobAccepted { id },
                Err(e) => Control::Failed(Refusal::Protocol(e)),
            };
            return answer(&conn, send, &reply).await;
        }
        Control::StatusQuery { .. } => {
            let report = ctx
                .activity
                .report(&ctx.store, ctx.runner.me(), &ctx.runner.records());
            return answer(&conn, send, &Control::StatusReport(report)).await;
        }
        Control::CancelJob { id, .. } => {
            let known = ctx.runner.cancel(&id);
            return answer(&conn, send, &Control::JobCancelled { id, known }).await;
        }
        Control::RemoveModel { name, .. } => {
            let store = ctx.store.clone();
            let n = name.clone();
            let reply = match tokio::task::spawn_blocking(move || store.remove(&n)).await? {
                Ok(existed) => {
                    tracing::info!("removed {name}");
                    ctx.activity.forget(&name);
                    ctx.runner.forget_model(&name);
                    Control::ModelRemoved { name, existed }
                }
                Err(r) => Control::Failed(r),
            };
            return answer(&conn, send, &reply).await;
        }
        Control::Preflight { request, .. } => {
            let status = ctx
                .activity
                .report(&ctx.store, ctx.runner.me(), &ctx.runner.records());
            let states = status
                .models
                .iter()
                .map(|m| {
                    let state = serde_json::to_value(m.state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default();
                    (m.name.clone(), state)
                })
                .collect();
            let facts = crate::agent::preflight::gather(*request, ctx.store.clone(), states).await;
            return answer(&conn, send, &Control::PreflightReport(Box::new(facts))).await;
        }
        Control::Reach {
            listen,
            peers,
            window_ms,
            ..
        } => {
            let window = Duration::from_millis(window_ms.min(60_000));
            let (listen, reach) =
                crate::agent::preflight::reach::probe(listen, &peers, window).await;
            return answer(&conn, send, &Control::Reached { listen, reach }).await;
        }
        Control::StartRank { spec, .. } => {
            tracing::info!("starting rank {} of run {}", spec.rank, spec.run);
            let reply = match ctx.ranks.start(*spec) {
                Ok(report) => Control::Runs(vec![report]),
                Err(e) => Control::Failed(Refusal::Busy(e)),
            };
            return answer(&conn, send, &reply).await;
        }
        Control::RunQuery { run, .. } => {
            let reports = ctx.ranks.reports(run.as_deref());
            return answer(&conn, send, &Control::Runs(reports)).await;
        }
        Control::StopRun {
            run,
            grace_ms,
            reason,
            ..
        } => {
            tracing::info!(
                "stopping run {}: {reason}",
                run.as_deref().unwrap_or("(all)")
            );
            let grace = Duration::from_millis(grace_ms.min(600_000));
            let reports = ctx.ranks.stop(run.as_deref(), grace, &reason).await;
            return answer(&conn, send, &Control::Runs(reports)).await;
        }
        Control::ReadLog {
            run, offset, max, ..
        } => {
            let reply = match ctx.ranks.read_log(&run, offset, max) {
                Ok(chunk) => Control::Log(Box::new(chunk)),
                Err(e) => Control::Failed(Refusal::Protocol(e)),
            };
            return answer(&conn, send, &reply).await;
        }
        other => {
            return refuse(
                &mut send,
                Refusal::Protocol(format!("expected an offer, got {}", other.kind())),
            )
            .await;
        }
    };
    if let Err(e) = manifest.validate() {
        return refuse(&mut send, Refusal::BadManifest(e.to_string())).await;
    }
    let manifest = Arc::new(manifest);

    // Supersede a running transfer of the same model, then wait for it.
    let token = CancellationToken::new();
    let jobs = &ctx.jobs;
    let id = jobs.next_id.fetch_add(1, Ordering::Relaxed);
    let slot = {
        let mut map = jobs.by_name.lock().unwrap();
        let slot = map.get(&name).map(|j| j.slot.clone()).unwrap_or_default();
        let job = Job {
            id,
            cancel: token.clone(),
            slot: slot.clone(),
        };
        if let Some(old) = map.insert(name.clone(), job) {
            old.cancel.cancel();
        }
        slot
    };
    let _running = slot.lock().await;

    let begun = {
        let (store, name, manifest) = (ctx.store.clone(), name.clone(), manifest.clone());
        tokio::task::spawn_blocking(move || store.begin(&name, manifest)).await?
    };
    let transfer = match begun {
        Ok(t) => Arc::new(t),
        Err(r) => return refuse(&mut send, r).await,
    };
    let held = transfer.held();
    let held_bytes = transfer.held_bytes();
    write_frame(
        &mut send,
        &Control::Accepted {
            held_bytes,
            held_chunks: held.count(),
            need_bytes: manifest.total_bytes() - held_bytes,
        },
    )
    .await?;
    tracing::info!(
        "receiving {name} ({} files, root {}) from {}",
        manifest.file_count(),
        manifest.root().short(),
        conn.remote_address()
    );
    // The source sends its swarm right after the offer; an older or
    // single-destination source sends none.
    let swarm = match tokio::time::timeout(Duration::from_secs(5), read_frame(&mut recv)).await {
        Ok(Ok(Control::Swarm { me, peers })) => Some((me, peers)),
        _ => None,
    };
    let result = run_transfer(&ctx, &conn, &mut send, transfer.clone(), swarm, token).await;
    transfer.release();
    {
        let mut map = jobs.by_name.lock().unwrap();
        if map.get(&name).is_some_and(|j| j.id == id) {
            map.remove(&name);
        }
    }
    let reply = match result {
        Ok(r) => {
            tracing::info!("{name} complete, root {}", r.root);
            Control::Done {
                root: r.root,
                received_bytes: r.received_bytes,
                corrupt_chunks: r.corrupt_chunks,
            }
        }
        Err(r) => {
            tracing::warn!("{name} failed: {r}");
            Control::Failed(r)
        }
    };
    write_frame(&mut send, &reply).await?;
    let _ = send.finish();
    Ok(())
}

/// Receives `transfer` from the source on `conn` and, with a swarm, from the
/// other receivers, reporting progress on `send` while it runs.
async fn run_transfer(
    ctx: &Ctx,
    conn: &quinn::Connection,
    send: &mut quinn::SendStream,
    transfer: Arc<Transfer>,
    swarm: Option<(u32, Vec<SwarmPeer>)>,
    token: CancellationToken,
) -> Result<Received, Refusal> {
    let name = transfer.name().clone();
    let chunks = transfer.map().len();
    let tally = Arc::new(Tally::default());
    let mut cfg = ctx.cfg;
    let mut links = Links::none();
    links.tally = tally.clone();
    ctx.activity
        .receiving(&name, transfer.clone(), tally.clone());
    let mut peers = Vec::new();
    let mut addrs = HashMap::new();
    let linking = CancellationToken::new();
    let mut share = None;
    // Only a source that sent a swarm (even of one) reads progress reports.
    let reporting = swarm.is_some();
    let swarm = swarm
        .filter(|(me, members)| !transfer.is_complete() && members.iter().any(|p| p.id != *me));
    if let Some((me, members)) = swarm {
        cfg = policy::swarm_config(cfg, me);
        addrs = members.iter().map(|p| (p.id, p.addr)).collect();
        let (verified, _) = tokio::sync::broadcast::channel(4096);
        let s = Arc::new(Share {
            root: transfer.manifest().root(),
            transfer: transfer.clone(),
            verified: verified.clone(),
            ended: CancellationToken::new(),
        });
        ctx.shares.publish(&name, s.clone());
        share = Some(s);
        let plan = LinkPlan {
            endpoint: ctx.endpoint.clone(),
            me,
            peers: members,
            name: name.clone(),
            root: transfer.manifest().root(),
            chunks,
            chunk_size: transfer.map().chunk_size(),
            nic: ctx.nic.clone(),
        };
        let (joined, updates) = swarm::link_peers(plan, linking.clone()).await;
        tracing::info!("{name}: linked to {} peers", joined.len());
        peers = joined;
        links.updates = Some(updates);
        links.verified = Some(verified);
    }
    // Partial peers first, then the source: see `receive`.
    let source =
        Fetcher::connect(conn.clone(), ctx.nic.as_ref(), transfer.map().chunk_size()).await;
    peers.push((SOURCE, source, ChunkSet::full(chunks)));
    let receiving = receive(transfer.clone(), peers, links, cfg, token);
    tokio::pin!(receiving);
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    let result = loop {
        tokio::select! {
            r = &mut receiving => break r,
            _ = tick.tick(), if reporting => {
                // The source may be gone while peers still serve us.
                let _ = report(send, &transfer, &tally, &addrs).await;
            }
        }
    };
    linking.cancel();
    if let Some(s) = share {
        s.ended.cancel();
        ctx.shares.withdraw(&name, &s);
    }
    if reporting {
        let _ = report(send, &transfer, &tally, &addrs).await;
    }
    ctx.activity
        .ended(&name, result.as_ref().err().map(|r| r.to_string()));
    result
}

/// Sends the source a progress report and any peers dropped since the last.
async fn report(
    send: &mut quinn::SendStream,
    transfer: &Transfer,
    tally: &Tally,
    addrs: &HashMap<u32, SocketAddr>,
) -> Result<()> {
    for (peer, reason) in tally.take_dropped() {
        if let Some(&addr) = addrs.get(&peer) {
            write_frame(send, &Control::PeerDropped { peer: addr, reason }).await?;
        }
    }
    let progress = Control::Progress {
        held_bytes: transfer.held_bytes(),
        from_source: tally.from_source.load(Ordering::Relaxed),
        from_peers: tally.from_peers.load(Ordering::Relaxed),
    };
    write_frame(send, &progress).await
}

/// Serves a complete model this agent holds to a peer that asked for it.
async fn serve_model(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    store: Store,
    name: ModelName,
    nic: Option<Arc<dyn Nic>>,
) -> Result<()> {
    let Some(HeldModel {
        manifest,
        map,
        reader,
        paths,
    }) = HeldModel::open(&store, &name)
    else {
        return refuse(&mut send, Refusal::NotHeld(name.to_string())).await;
    };
    write_frame(&mut send, &Control::Have { manifest }).await?;
    let _ = send.finish();
    tracing::info!("serving {name} to {}", conn.remote_address());
    let rdma = Offer {
        nic,
        files: Some(paths),
    };
    serve(conn, Serving::new(map, reader, rdma)).await;
    Ok(())
}

/// Sends a one-message reply and waits (briefly) for the asker to close.
async fn answer(
    conn: &quinn::Connection,
    mut send: quinn::SendStream,
    reply: &Control,
) -> Result<()> {
    write_frame(&mut send, reply).await?;
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
    Ok(())
}

async fn refuse(send: &mut quinn::SendStream, r: Refusal) -> Result<()> {
    write_frame(send, &Control::Failed(r.clone())).await?;
    let _ = send.finish();
    anyhow::bail!("refused: {r}")
}
