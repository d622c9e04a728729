//! The transfer service: moving models. A stream opens with one of
//! - an offer: open a [`Transfer`] in the store and pull the missing
//!   chunks from the offering source and, in a swarm, from the other
//!   receivers ([`crate::flow::swarm`]), reporting progress back to the
//!   source. A newer offer for the same model supersedes a running one (a
//!   restarted push resumes instead of waiting for the old connection to
//!   time out);
//! - a join from another receiver: served from this node's verified chunks;
//! - a want: serve a complete model this node holds.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

use super::{read_or_refuse, refuse, Caller, Ctx};
use crate::config::auth::identity::Peer;
use crate::engine::policy;
use crate::engine::scheduler::{self, Homes};
use crate::flow::receive::{receive, Links, PeerUpdate, Queued, Received, Tally, SOURCE};
use crate::flow::swarm::{self, LinkPlan, Share};
use crate::store::{Store, Transfer};
use crate::transport::files::HeldModel;
use crate::transport::lanes::{Lanes, MAX_CONNECTIONS};
use crate::transport::quic;
use crate::transport::quic::{read_frame_within, write_frame};
use crate::transport::rdma::link::{Nic, Offer};
use crate::transport::serve::{serve as serve_chunks, Serving};
use crate::transport::Fetcher;
use xfer_proto::chunkset::ChunkSet;
use xfer_proto::draft::Draft;
use xfer_proto::frame::{MAX_FRAME, REQUEST_LIMIT};
use xfer_proto::hash::Hash;
use xfer_proto::manifest::Manifest;
use xfer_proto::names::ModelName;
use xfer_proto::transfer::{HomeSlots, Refusal, SwarmPeer, TransferMsg};

/// Bytes of the source's draft events read but not yet applied, at most:
/// a source that floods events is read no faster than they are applied.
const DRAFT_QUEUE_BYTES: u32 = 16 << 20;

/// Messages from the source read but not yet handled, at most.
const CONTROL_QUEUE: usize = 256;

/// What a draft event weighs in the queue's budget: its hashes, and a
/// little for the rest.
fn draft_event_weight(ev: &xfer_proto::draft::DraftEvent) -> u32 {
    let hashes = match ev {
        xfer_proto::draft::DraftEvent::Hashed { hashes, .. } => hashes.len(),
        _ => 0,
    };
    (hashes.saturating_mul(32).saturating_add(64)).min(u32::MAX as usize) as u32
}

/// How often a receiver reports its progress to the source.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// Running jobs by model name: a token to cancel each, and a lock the job
/// holds while it runs.
#[derive(Default)]
pub(super) struct Jobs {
    by_name: Mutex<HashMap<ModelName, Job>>,
    next_id: std::sync::atomic::AtomicU64,
}

struct Job {
    id: u64,
    cancel: CancellationToken,
    slot: Arc<tokio::sync::Mutex<()>>,
    /// The connections to the source (`--connections`), the first being
    /// the one the offer came on; the source may attach more.
    lanes: Lanes,
    root: Hash,
    /// Who offered it.
    by: Peer,
}

/// Serves one transfer stream, whose first message is an opener.
pub(super) async fn serve(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    ctx: &Ctx,
    caller: &Caller,
) -> Result<()> {
    let opener: TransferMsg = read_or_refuse(ctx, &mut send, &mut recv, MAX_FRAME, "offer").await?;
    let (name, plan) = match opener {
        TransferMsg::Offer { name, manifest } => {
            if let Err(e) = manifest.validate() {
                return refuse(&mut send, Refusal::BadManifest(e.to_string())).await;
            }
            (name, Plan::Manifest(Arc::new(manifest)))
        }
        TransferMsg::OfferDraft { name, id, listing } => {
            // Bounds and free space first: nothing is built per chunk for
            // a listing this node could not hold anyway.
            let room = Draft::extent(&listing)
                .map_err(|e| Refusal::BadManifest(e.to_string()))
                .and_then(|(bytes, _)| ctx.store.room_for(&name, bytes).map_err(Refusal::from));
            if let Err(r) = room {
                return refuse(&mut send, r).await;
            }
            match Draft::from_listing(&listing) {
                Ok(draft) => (name, Plan::Draft(id, draft)),
                Err(e) => return refuse(&mut send, Refusal::BadManifest(e.to_string())).await,
            }
        }
        TransferMsg::Want { name } => {
            return serve_model(conn, send, ctx.store.clone(), name, ctx.nic.clone()).await
        }
        TransferMsg::Join { name, root, from } => {
            let (store, shares) = (ctx.store.clone(), ctx.shares.clone());
            let join = swarm::Joining { name, root, from };
            return swarm::serve_peer(conn, send, store, shares, join, ctx.nic.clone()).await;
        }
        TransferMsg::Lane { name, root } => return attach_lane(conn, send, ctx, name, root).await,
        other => {
            return refuse(
                &mut send,
                Refusal::Protocol(format!("expected an offer, got {}", other.kind())),
            )
            .await;
        }
    };
    let key = match &plan {
        Plan::Manifest(m) => m.root(),
        Plan::Draft(id, _) => *id,
    };

    if let Err(why) = may_offer(ctx, caller, &name) {
        tracing::warn!("refused an offer of {name} from {caller}: {why}");
        return refuse(&mut send, Refusal::Forbidden(why)).await;
    }

    // Supersede a running transfer of the same model, then wait for it.
    let token = CancellationToken::new();
    let jobs = &ctx.jobs;
    let id = jobs.next_id.fetch_add(1, Ordering::Relaxed);
    let lanes = Lanes::new(conn.clone());
    let superseding = {
        let map = jobs.by_name.lock().unwrap();
        map.get(&name).map(|j| j.by.clone())
    };
    if let Some(running) = superseding {
        if let Err(why) = may_supersede(ctx, caller, &name, &running) {
            tracing::warn!("refused an offer of {name} from {caller}: {why}");
            return refuse(&mut send, Refusal::Busy(why)).await;
        }
    }
    let slot = {
        let mut map = jobs.by_name.lock().unwrap();
        let slot = map.get(&name).map(|j| j.slot.clone()).unwrap_or_default();
        let job = Job {
            id,
            cancel: token.clone(),
            slot: slot.clone(),
            lanes: lanes.clone(),
            root: key,
            by: caller.peer.clone(),
        };
        if let Some(old) = map.insert(name.clone(), job) {
            old.cancel.cancel();
        }
        slot
    };
    let _running = slot.lock().await;

    let begun = {
        let (store, name) = (ctx.store.clone(), name.clone());
        tokio::task::spawn_blocking(move || match plan {
            Plan::Manifest(m) => store.begin(&name, m),
            Plan::Draft(id, d) => store.begin_draft(&name, id, d),
        })
        .await?
    };
    let transfer = match begun {
        Ok(t) => Arc::new(t),
        Err(r) => return refuse(&mut send, r.into()).await,
    };
    let manifest = transfer.manifest().clone();
    let held = transfer.held();
    let held_bytes = transfer.held_bytes();
    write_frame(
        &mut send,
        &TransferMsg::Accepted {
            held_bytes,
            held_chunks: held.count(),
            need_bytes: manifest.total_bytes() - held_bytes,
        },
    )
    .await?;
    tracing::info!(
        "receiving {name} ({} files, {} {}) from {}",
        manifest.file_count(),
        if transfer.is_draft() { "draft" } else { "root" },
        key.short(),
        conn.remote_address()
    );
    // The source sends its swarm right after the offer; an older or
    // single-destination source sends none. A swarm is a few bytes a node,
    // so it is read within the request limit, not the manifest's.
    let swarm = tokio::time::timeout(
        Duration::from_secs(5),
        read_frame_within(&mut recv, REQUEST_LIMIT),
    );
    let swarm = match swarm.await {
        Ok(Ok(TransferMsg::Swarm {
            me,
            peers,
            homes,
            bounded,
        })) => Some(SwarmPlan {
            me,
            peers,
            homes,
            bounded,
        }),
        _ => None,
    };
    let result = run_transfer(ctx, lanes, &mut send, recv, transfer.clone(), swarm, token).await;
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
            TransferMsg::Done {
                root: r.root,
                received_bytes: r.received_bytes,
                corrupt_chunks: r.corrupt_chunks,
            }
        }
        Err(r) => {
            tracing::warn!("{name} failed: {r}");
            TransferMsg::Failed(r)
        }
    };
    write_frame(&mut send, &reply).await?;
    let _ = send.finish();
    Ok(())
}

/// Whether `caller` may deliver `name` here. An operator (or, in simple
/// mode, a holder of the cluster key) may deliver anything. A node
/// credential may deliver a model this node does not hold, or resume one
/// it is receiving; replacing a model held here (complete, or left half
/// replaced) takes a transfer the operator started: an operator's push, or
/// a sync job handed to this agent that names the caller as its source.
fn may_offer(ctx: &Ctx, caller: &Caller, name: &ModelName) -> Result<(), String> {
    if caller.peer.is_operator() || ctx.store.record_any(name).is_none() {
        return Ok(());
    }
    if is_job_source(ctx, &caller.peer, name) {
        return Ok(());
    }
    Err(format!(
        "{caller} may not replace the model `{name}` held on this node; only an operator's push or an `xfer sync` job from that node may (push it with an operator credential, or run `xfer sync`)"
    ))
}

/// Whether a new offer from `caller` may cut short the transfer of `name`
/// that `running` offered: an operator's may, and so may the same peer (a
/// restarted push) or the source of a sync job for it; no other node.
fn may_supersede(
    ctx: &Ctx,
    caller: &Caller,
    name: &ModelName,
    running: &Peer,
) -> Result<(), String> {
    if caller.peer.is_operator()
        || caller.peer == *running
        || is_job_source(ctx, &caller.peer, name)
    {
        return Ok(());
    }
    Err(format!(
        "`{name}` is being received here from {running}; {caller} may not interrupt it (wait for it to end, or push as the operator)"
    ))
}

/// Whether this agent holds a running sync job for `name` whose source is
/// the node `peer` names.
fn is_job_source(ctx: &Ctx, peer: &Peer, name: &ModelName) -> bool {
    let Some(node) = peer.name() else {
        return false;
    };
    ctx.runner
        .records()
        .iter()
        .any(|j| !j.state.is_final() && j.spec.name == *name && j.spec.source_node == node.as_str())
}

/// What an offer asks this node to store.
enum Plan {
    Manifest(Arc<Manifest>),
    /// A pull's files while it still downloads them: the draft's id and
    /// its listing.
    Draft(Hash, Draft),
}

/// A receiver's place in a swarm, as the source's `Swarm` gave it.
struct SwarmPlan {
    me: u32,
    /// Its first peers, and itself.
    peers: Vec<SwarmPeer>,
    /// The chunks it fetches from the source; `None`: from peers only.
    homes: Option<HomeSlots>,
    /// It sees only a few of the swarm's receivers.
    bounded: bool,
}

/// Homes as the scheduler takes them; a malformed set is none.
fn homes_of(h: Option<HomeSlots>) -> Homes {
    match h.filter(HomeSlots::is_well_formed) {
        Some(h) => Homes {
            of: h.of,
            slots: h.slots,
        },
        None => Homes::default(),
    }
}

/// Receives `transfer` from the source on `conn` and, with a swarm, from
/// the peers the source links this node to, reporting progress on `send`
/// and applying the source's rewiring (`Links`, `Feed`) read from `recv`
/// while it runs.
async fn run_transfer(
    ctx: &Ctx,
    lanes: Lanes,
    send: &mut quinn::SendStream,
    recv: quinn::RecvStream,
    transfer: Arc<Transfer>,
    swarm: Option<SwarmPlan>,
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
    let mut linker = None;
    // Only a source that sent a swarm (even of one) reads progress reports.
    let reporting = swarm.is_some();
    let swarm = swarm.filter(|p| !transfer.is_complete() && p.peers.iter().any(|m| m.id != p.me));
    let conn = lanes.primary();
    let source = Fetcher::connect_lanes(lanes, ctx.nic.as_ref(), transfer.map().chunk_size()).await;
    let mut fed = true;
    let draft = transfer.is_draft();
    let (control_tx, mut control) = tokio::sync::mpsc::channel(CONTROL_QUEUE);
    // A draft's events reach the transfer through the linker, or, with no
    // peers to link to, through a channel of their own.
    let mut draft_tx = None;
    if draft {
        cfg.growing = true;
        cfg.source = Some(SOURCE);
    }
    if let Some(SwarmPlan {
        me,
        peers: members,
        homes,
        bounded,
    }) = swarm
    {
        // The policy the simulator measured for each kind of swarm.
        let policy = if bounded {
            policy::bounded_swarm_config(cfg, me)
        } else {
            policy::swarm_config(cfg, me)
        };
        cfg = scheduler::Config {
            // A peer that finished is asked like any other, not rationed.
            source: Some(SOURCE),
            growing: draft,
            ..policy
        };
        addrs = members.iter().map(|p| (p.id, p.addr)).collect();
        let (verified, _) = tokio::sync::broadcast::channel(4096);
        let s = Arc::new(Share {
            root: transfer.key(),
            transfer: transfer.clone(),
            verified: verified.clone(),
            ended: CancellationToken::new(),
            tally: tally.clone(),
        });
        ctx.shares.publish(&name, s.clone());
        share = Some(s);
        let label = members
            .iter()
            .find(|p| p.id == me)
            .map_or_else(|| format!("peer {me}"), |p| p.label.clone());
        let plan = LinkPlan {
            endpoint: ctx.data_endpoint.as_ref().unwrap_or(&ctx.endpoint).clone(),
            fallback_endpoint: ctx.endpoint.clone(),
            me,
            label,
            tally: tally.clone(),
            peers: members,
            name: name.clone(),
            root: transfer.key(),
            chunks,
            chunk_size: transfer.map().chunk_size(),
            nic: ctx.nic.clone(),
        };
        let (joined, updates, l) = swarm::link_peers(plan, linking.clone()).await;
        tracing::info!("{name}: linked to {} peers", joined.len());
        peers = joined;
        linker = Some(l);
        links.updates = Some(updates);
        links.verified = Some(verified);
        fed = homes.is_some();
        links.homes = Some(homes_of(homes));
    } else if draft {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        links.updates = Some(rx);
        draft_tx = Some(tx);
    }
    if linker.is_some() || draft {
        // The source's rewiring and draft events, read apart so no read is
        // ever cut short. A draft event carries a file's chunk hashes so
        // far, up to the manifest's limit.
        let limit = if draft { MAX_FRAME } else { REQUEST_LIMIT };
        let mut recv = recv;
        let stop = linking.clone();
        let budget = Arc::new(tokio::sync::Semaphore::new(DRAFT_QUEUE_BYTES as usize));
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    m = read_frame_within::<TransferMsg>(&mut recv, limit) => m,
                    _ = stop.cancelled() => return,
                };
                let Ok(m) = msg else { return };
                // A draft event waits for its share of the budget before
                // the next frame is read (see `Queued`).
                let share = match &m {
                    TransferMsg::Draft(ev) => {
                        let bytes = draft_event_weight(ev).min(DRAFT_QUEUE_BYTES);
                        let permit = tokio::select! {
                            p = budget.clone().acquire_many_owned(bytes) => p,
                            _ = stop.cancelled() => return,
                        };
                        match permit {
                            Ok(p) => Queued::new(p),
                            Err(_) => return,
                        }
                    }
                    _ => Queued::default(),
                };
                if control_tx.send((m, share)).await.is_err() {
                    return;
                }
            }
        });
    }
    // Partial peers first, then the source: see `receive`.
    if fed {
        peers.push((SOURCE, source.clone(), ChunkSet::full(chunks)));
    }
    let receiving = receive(transfer.clone(), peers, links, cfg, token);
    tokio::pin!(receiving);
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    let mut told = 0;
    let mut source_lost = false;
    let result = loop {
        tokio::select! {
            r = &mut receiving => break r,
            _ = conn.closed(), if !source_lost && (linker.is_some() || draft) => {
                source_lost = true;
                // Only the source seals a draft: without it, it cannot end.
                if !transfer.is_sealed() {
                    break Err(Refusal::SourceLost(
                        "the pull streaming it stopped before every file was sealed; run it again to resume (staged chunks are kept)".into(),
                    ));
                }
                // Peers may still finish it; if they cannot, it ends.
                if let Some(l) = &linker {
                    l.tell(PeerUpdate::CoordinatorLost);
                }
            }
            _ = tally.first_chunk.notified(), if reporting => {
                let _ = report(send, &transfer, &tally, &addrs, &mut told).await;
            }
            _ = tick.tick(), if reporting => {
                // The source may be gone while peers still serve us.
                let _ = report(send, &transfer, &tally, &addrs, &mut told).await;
            }
            Some((msg, share)) = control.recv() => {
                if let TransferMsg::Draft(ev) = msg {
                    match (&linker, &draft_tx) {
                        (Some(l), _) => l.tell(PeerUpdate::Draft(ev, share)),
                        (None, Some(tx)) => {
                            let _ = tx.send(PeerUpdate::Draft(ev, share));
                        }
                        (None, None) => {}
                    }
                    continue;
                }
                let Some(linker) = linker.as_mut() else { continue };
                match msg {
                    TransferMsg::Links { add, remove } => {
                        for id in remove {
                            linker.remove(id);
                        }
                        for p in add {
                            addrs.insert(p.id, p.addr);
                            linker.add(p);
                        }
                    }
                    TransferMsg::Feed(homes) => {
                        let feeding = homes.is_some();
                        if feeding && !fed {
                            linker.tell(PeerUpdate::Joined {
                                peer: SOURCE,
                                fetcher: source.clone(),
                                has: ChunkSet::full(chunks),
                            });
                        }
                        linker.tell(PeerUpdate::Homes(homes_of(homes)));
                        if !feeding && fed {
                            linker.tell(PeerUpdate::Gone {
                                peer: SOURCE,
                                why: "the source feeds other receivers".into(),
                            });
                        }
                        fed = feeding;
                    }
                    other => tracing::debug!("{name}: ignored {} from the source", other.kind()),
                }
            }
        }
    };
    linking.cancel();
    if let Some(s) = share {
        s.ended.cancel();
        ctx.shares.withdraw(&name, &s);
    }
    if reporting {
        let _ = report(send, &transfer, &tally, &addrs, &mut told).await;
    }
    ctx.activity
        .ended(&name, result.as_ref().err().map(|r| r.to_string()));
    result
}

/// Sends the source a progress report, any peers dropped since the last,
/// and the links gone over management since the `told`th.
async fn report(
    send: &mut quinn::SendStream,
    transfer: &Transfer,
    tally: &Tally,
    addrs: &HashMap<u32, SocketAddr>,
    told: &mut usize,
) -> Result<()> {
    for route in tally.fallbacks_from(*told) {
        write_frame(send, &TransferMsg::Fallback(route)).await?;
        *told += 1;
    }
    for peer in tally.take_slow() {
        write_frame(send, &TransferMsg::Slow { peer }).await?;
    }
    for (peer, reason) in tally.take_dropped() {
        if let Some(&addr) = addrs.get(&peer) {
            write_frame(send, &TransferMsg::PeerDropped { peer: addr, reason }).await?;
        }
    }
    let (links, max_links) = tally.links();
    let progress = TransferMsg::Progress {
        held_bytes: transfer.held_bytes(),
        from_source: tally.from_source.load(Ordering::Relaxed),
        from_peers: tally.from_peers.load(Ordering::Relaxed),
        links,
        max_links,
    };
    write_frame(send, &progress).await
}

/// Attaches `conn` to the running transfer of `name` as one more
/// connection to its source, and holds it until it closes. Only the
/// source's own node may: the same address and certificate as the
/// connection the offer came on.
async fn attach_lane(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    ctx: &Ctx,
    name: ModelName,
    root: Hash,
) -> Result<()> {
    let lanes = {
        let map = ctx.jobs.by_name.lock().unwrap();
        map.get(&name)
            .filter(|j| j.root == root)
            .map(|j| j.lanes.clone())
    };
    let Some(lanes) = lanes else {
        let why = format!(
            "no transfer of {name} with root {} is running here to add a connection to",
            root.short()
        );
        return refuse(&mut send, Refusal::Protocol(why)).await;
    };
    let source = lanes.primary();
    if source.remote_address().ip() != conn.remote_address().ip()
        || quic::peer_certificate(&source) != quic::peer_certificate(&conn)
    {
        let why = format!(
            "{} is not the source of the transfer of {name}; only its source may add connections to it",
            conn.remote_address()
        );
        return refuse(&mut send, Refusal::Forbidden(why)).await;
    }
    if lanes.len() >= MAX_CONNECTIONS {
        let why =
            format!("the transfer of {name} has {MAX_CONNECTIONS} connections, the most one may");
        return refuse(&mut send, Refusal::Busy(why)).await;
    }
    let n = lanes.add(conn.clone());
    tracing::debug!(
        "{name}: connection {n} to the source {}",
        conn.remote_address()
    );
    write_frame(&mut send, &TransferMsg::LaneAttached { lanes: n as u32 }).await?;
    // Until the source closes it (the transfer ended) or the transfer's
    // own connection goes.
    tokio::select! {
        _ = conn.closed() => {}
        _ = source.closed() => {}
    }
    Ok(())
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
    write_frame(&mut send, &TransferMsg::Have { manifest }).await?;
    let _ = send.finish();
    tracing::info!("serving {name} to {}", conn.remote_address());
    let rdma = Offer {
        nic,
        files: Some(paths),
    };
    serve_chunks(conn, Serving::new(map, reader, rdma)).await;
    Ok(())
}
