//! The receiving side of one transfer, once the agent has accepted its
//! offer: the swarm the source places this node in, the scheduler policy
//! for it, the fetcher to the source, the links to the other receivers
//! ([`crate::flow::swarm`]), and the loop that runs [`receive`] while it
//! applies the source's rewiring (`Links`, `Feed`) and draft events and
//! reports progress back to the source.
//!
//! The agent authorises and opens the [`Transfer`]; what the receiver
//! needs of the node (shares, scheduler policy, endpoints, NIC, who
//! follows its progress) it gets once as a [`Receiver`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::engine::policy;
use crate::engine::scheduler::{self, Homes};
use crate::flow::receive::{receive, Links, PeerUpdate, Queued, Received, Tally, SOURCE};
use crate::flow::swarm::{self, LinkPlan, Share, Shares};
use crate::store::Transfer;
use crate::transport::lanes::Lanes;
use crate::transport::quic::{read_frame_within, write_frame};
use crate::transport::rdma::link::Nic;
use crate::transport::Fetcher;
use crate::util::chain::Chain;
use xfer_proto::chunkset::ChunkSet;
use xfer_proto::frame::{MAX_FRAME, REQUEST_LIMIT};
use xfer_proto::names::ModelName;
use xfer_proto::transfer::{HomeSlots, Refusal, SwarmPeer, TransferMsg, MAX_PEER_CONNECTIONS};

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

/// How long the source's `Swarm` may take after the offer is accepted.
const SWARM_WAIT: Duration = Duration::from_secs(5);

/// Who follows this node's transfers while they run (the agent's status).
pub trait Watcher: Send + Sync {
    /// `transfer` of `name` started; `tally` counts where its bytes came from.
    fn receiving(&self, name: &ModelName, transfer: Arc<Transfer>, tally: Arc<Tally>);
    /// The transfer of `name` ended; `error` says why if it failed.
    fn ended(&self, name: &ModelName, error: Option<String>);
}

/// What every transfer this node receives shares, given once by the agent.
pub struct Receiver {
    /// The transfers running here, offered to the other receivers.
    pub shares: Arc<Shares>,
    /// The scheduler policy a transfer starts from.
    pub scheduler: scheduler::Config,
    /// Where links to peers go out from: the data address's socket.
    pub endpoint: quinn::Endpoint,
    /// Where a link the data address cannot make goes out from.
    pub fallback_endpoint: quinn::Endpoint,
    /// The RDMA NIC transfers use; `None`: QUIC only.
    pub nic: Option<Arc<dyn Nic>>,
    /// Told when a transfer starts and ends.
    pub watcher: Arc<dyn Watcher>,
    /// The only addresses peers are dialled at (the agent's cluster
    /// file's nodes); `None`: any the source names.
    pub peer_addrs: Option<Arc<swarm::PeerAddrs>>,
}

/// One accepted offer, handed from the agent to the receiver.
pub struct Offered<'a> {
    /// The transfer the store opened for it.
    pub transfer: Arc<Transfer>,
    /// The connections to the source, the offer's first.
    pub lanes: Lanes,
    /// The control stream's sending half: progress goes back on it.
    pub send: &'a mut quinn::SendStream,
    /// The control stream's receiving half: the swarm, rewiring and draft
    /// events come on it.
    pub recv: quinn::RecvStream,
    /// Cancelled when a newer offer supersedes this one.
    pub token: CancellationToken,
}

impl Receiver {
    /// Receives `offered` from the source and, when the source places this
    /// node in a swarm (the `Swarm` it sends right after the offer is
    /// accepted), from the peers it links this node to.
    pub async fn run(&self, offered: Offered<'_>) -> Result<Received, Refusal> {
        let Offered {
            transfer,
            lanes,
            send,
            mut recv,
            token,
        } = offered;
        let swarm = read_swarm(&mut recv).await?;
        run_transfer(self, lanes, send, recv, transfer, swarm, token).await
    }
}

/// The swarm the source sends right after the offer; an older or
/// single-destination source sends none. A swarm is a few bytes a node,
/// so it is read within the request limit, not the manifest's. One that
/// names more peers than a receiver links ([`swarm::MAX_LINKS`]) is
/// refused before any is dialled: a receiver is not a source's reflector.
async fn read_swarm(recv: &mut quinn::RecvStream) -> Result<Option<SwarmPlan>, Refusal> {
    let swarm = tokio::time::timeout(SWARM_WAIT, read_frame_within(recv, REQUEST_LIMIT));
    match swarm.await {
        Ok(Ok(TransferMsg::Swarm { peers, .. })) if peers.len() > swarm::MAX_LINKS + 1 => {
            Err(Refusal::Protocol(format!(
                "the swarm names {} peers; a receiver links at most {} (`--peers` is 2 to 64)",
                peers.len(),
                swarm::MAX_LINKS
            )))
        }
        Ok(Ok(TransferMsg::Swarm {
            me,
            peers,
            homes,
            bounded,
            connections,
        })) => Ok(Some(SwarmPlan {
            me,
            peers,
            homes,
            bounded,
            connections: connections.clamp(1, MAX_PEER_CONNECTIONS),
        })),
        _ => Ok(None),
    }
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
    /// Connections per peer link.
    connections: u32,
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

/// Receives `transfer` from the source over `lanes` and, with a swarm, from
/// the peers the source links this node to, reporting progress on `send`
/// and applying the source's rewiring (`Links`, `Feed`) read from `recv`
/// while it runs.
async fn run_transfer(
    ctx: &Receiver,
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
    let mut cfg = ctx.scheduler;
    let mut links = Links::none();
    links.tally = tally.clone();
    ctx.watcher
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
        connections,
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
            endpoint: ctx.endpoint.clone(),
            fallback_endpoint: ctx.fallback_endpoint.clone(),
            me,
            label,
            tally: tally.clone(),
            peers: members,
            name: name.clone(),
            root: transfer.key(),
            chunks,
            chunk_size: transfer.map().chunk_size(),
            nic: ctx.nic.clone(),
            connections,
            allowed: ctx.peer_addrs.clone(),
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
    ctx.watcher
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
) -> Result<(), Chain> {
    for route in tally.fallbacks_from(*told) {
        write_frame(send, &TransferMsg::Fallback(route))
            .await
            .map_err(Chain::from)?;
        *told += 1;
    }
    for peer in tally.take_slow() {
        write_frame(send, &TransferMsg::Slow { peer })
            .await
            .map_err(Chain::from)?;
    }
    for peer in tally.take_unreachable() {
        write_frame(send, &TransferMsg::Unreachable { peer })
            .await
            .map_err(Chain::from)?;
    }
    for (peer, reason) in tally.take_dropped() {
        if let Some(&addr) = addrs.get(&peer) {
            write_frame(send, &TransferMsg::PeerDropped { peer: addr, reason })
                .await
                .map_err(Chain::from)?;
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
    write_frame(send, &progress).await.map_err(Chain::from)
}
