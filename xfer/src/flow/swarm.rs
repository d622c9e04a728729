//! Peer links between the receivers of one transfer.
//!
//! The source tells each receiver who the other receivers are
//! ([`TransferMsg::Swarm`]). Every receiver then opens one mutually authenticated
//! QUIC connection to each other receiver and sends [`TransferMsg::Join`]; the
//! other side answers with a [`TransferMsg::Bitfield`] of the chunks it has
//! verified, then a [`TransferMsg::Has`] for each batch it verifies later, and
//! serves chunk requests on the same connection from its staging files
//! ([`HeldChunkReader`]). Whatever arrives is checked against the manifest by
//! the store before it is stored or served again, so a chunk is verified on
//! every hop.
//!
//! This module owns both halves: [`link_peers`] (the fetching side, which
//! turns links into [`PeerUpdate`]s for [`crate::flow::receive`]) and
//! [`serve_peer`] (the serving side, driven by the agent).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{Connection, Endpoint};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::engine::scheduler::PeerId;
use crate::flow::receive::{PeerUpdate, Tally};
use crate::flow::route;
use crate::store::{Store, Transfer};
use crate::transport::files::{HeldChunkReader, HeldModel};
use crate::transport::lanes::Lanes;
use crate::transport::quic::{self, read_frame, write_frame, OpenServiceError};
use crate::transport::rdma::link::{Nic, Offer};
use crate::transport::serve::{serve, Serving};
use crate::transport::Fetcher;
use crate::util::chain::Chain;
use xfer_proto::chunkset::ChunkSet;
use xfer_proto::hash::Hash;
use xfer_proto::hello::Service;
use xfer_proto::names::ModelName;
use xfer_proto::transfer::{FallbackRoute, Refusal, SwarmPeer, TransferMsg};

/// How long a joining peer waits for this node to start the same transfer
/// (the source's offers reach the receivers at about the same time).
const JOIN_WAIT: Duration = Duration::from_secs(10);
/// How long a receiver waits for its first peer links before it starts
/// fetching; later links join the running transfer.
const FIRST_LINKS_WAIT: Duration = Duration::from_secs(3);
/// Pause before the first retry to link a peer; doubled after each try
/// that fails in a row, up to [`RELINK_MAX`] (a peer that does not answer,
/// or refuses, is not dialled every second).
const RELINK_EVERY: Duration = Duration::from_secs(1);
/// The longest pause between two tries to link one peer.
const RELINK_MAX: Duration = Duration::from_secs(60);
/// The most peers a receiver links at once in one transfer: the largest
/// `--peers` (64) and a slack for the source's rewiring. A `Swarm` that
/// lists more is refused; a `Links` that would go past it is cut.
pub const MAX_LINKS: usize = 64 + 8;
/// The most distinct peers one transfer links over its whole life (the
/// source rewires a receiver as members come and go): past it, `Links`
/// additions are ignored, so a source cannot make a receiver dial an
/// endless list of addresses.
pub const MAX_PEERS_PER_TRANSFER: usize = 4 * MAX_LINKS;
/// How long one such try may take.
const REPROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most chunk numbers in one `Has` message.
const HAS_BATCH: usize = 4096;

/// A transfer this node is running, offered to the other receivers.
#[derive(Debug)]
pub struct Share {
    /// The transfer's root (or a draft's id).
    pub root: Hash,
    /// The transfer.
    pub transfer: Arc<Transfer>,
    /// Chunk numbers as they are verified.
    pub verified: broadcast::Sender<u64>,
    /// Cancelled when the transfer ends, whatever the outcome.
    pub ended: CancellationToken,
    /// Where the links peers open to us are counted.
    pub tally: Arc<Tally>,
}

/// Counts a peer's link to us while it lives.
struct Incoming(Arc<Tally>, PeerId);

impl Drop for Incoming {
    fn drop(&mut self) {
        self.0.link_down(self.1, true);
    }
}

/// The transfers this node is running, by model name.
#[derive(Debug, Default)]
pub struct Shares {
    by_name: Mutex<HashMap<ModelName, Arc<Share>>>,
}

impl Shares {
    /// Offers `share` as the running transfer of `name`.
    pub fn publish(&self, name: &ModelName, share: Arc<Share>) {
        self.by_name.lock().unwrap().insert(name.clone(), share);
    }

    /// Removes `share` unless a newer transfer replaced it.
    pub fn withdraw(&self, name: &ModelName, share: &Arc<Share>) {
        let mut map = self.by_name.lock().unwrap();
        if map.get(name).is_some_and(|s| Arc::ptr_eq(s, share)) {
            map.remove(name);
        }
    }

    /// The running transfer of `name`, whatever its root.
    pub fn transfer(&self, name: &ModelName) -> Option<Arc<Transfer>> {
        let found = self.by_name.lock().unwrap().get(name).cloned();
        found
            .filter(|s| !s.ended.is_cancelled())
            .map(|s| s.transfer.clone())
    }

    /// The running transfer of `name` with root `root`.
    fn running(&self, name: &ModelName, root: Hash) -> Option<Arc<Share>> {
        let found = self.by_name.lock().unwrap().get(name).cloned();
        found.filter(|s| s.root == root && !s.ended.is_cancelled())
    }
}

/// What a joining peer is served from.
enum Source {
    /// The model is complete and placed here.
    Held(HeldModel),
    /// This node is receiving it too.
    Running(Arc<Share>),
}

/// The model `name` with root `root` as this node has it, waiting up to
/// `within` for the transfer to start here. Both are checked each time: a
/// small transfer can start and finish between two looks.
async fn source_for(
    store: &Store,
    shares: &Shares,
    name: &ModelName,
    root: Hash,
    within: Duration,
) -> Option<Source> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(s) = shares.running(name, root) {
            return Some(Source::Running(s));
        }
        if let Some(m) = HeldModel::open(store, name).filter(|m| m.manifest.root() == root) {
            return Some(Source::Held(m));
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Why a link between two receivers was not made or ended early.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The peer cannot be reached.
    #[error("{0}")]
    Connect(route::ConnectError),
    /// The peer does not open its transfer service.
    #[error("{0}")]
    Open(OpenServiceError),
    /// A frame cannot be written or read.
    #[error("{0}")]
    Frame(Chain),
    /// The peer did not answer the join in time.
    #[error("{0} did not answer the join")]
    NoAnswer(SocketAddr),
    /// The peer does not receive this model (its transfer ended, or the
    /// source has not offered it there yet).
    #[error("{addr} refused the join: {why}")]
    NotServing {
        /// The peer.
        addr: SocketAddr,
        /// Its words.
        why: String,
    },
    /// The peer refused the join otherwise.
    #[error("{addr} refused the join: {refusal}")]
    Refused {
        /// The peer.
        addr: SocketAddr,
        /// Its refusal.
        refusal: Refusal,
    },
    /// The peer answered something else than its chunks.
    #[error("{addr} answered a join with a bad {kind}")]
    Unexpected {
        /// The peer.
        addr: SocketAddr,
        /// What it sent.
        kind: &'static str,
    },
    /// This node refused a peer's join (and told it so).
    #[error("{0}")]
    Refusing(Refusal),
}

impl LinkError {
    fn frame(e: impl Into<Chain>) -> LinkError {
        LinkError::Frame(e.into())
    }
}

/// A peer's [`TransferMsg::Join`]: it is `from` in the swarm of `name`
/// with root `root`.
pub struct Joining {
    /// The model.
    pub name: ModelName,
    /// Its root (or a draft's id).
    pub root: Hash,
    /// The joiner's id in the swarm.
    pub from: u32,
}

/// Serving side: answers a peer's [`TransferMsg::Join`] on `conn`, then serves
/// it chunks and announces new ones until it disconnects (or, if this
/// node's transfer fails or is superseded, until then).
pub async fn serve_peer(
    conn: Connection,
    mut send: quinn::SendStream,
    store: Store,
    shares: Arc<Shares>,
    join: Joining,
    nic: Option<Arc<dyn Nic>>,
) -> Result<(), LinkError> {
    let Joining { name, root, from } = join;
    tracing::debug!(
        "join for {name} root {} from {}",
        root.short(),
        conn.remote_address()
    );
    let share = match source_for(&store, &shares, &name, root, JOIN_WAIT).await {
        Some(Source::Running(share)) => share,
        Some(Source::Held(m)) => {
            let has = ChunkSet::full(m.map.len());
            write_frame(&mut send, &TransferMsg::Bitfield { has })
                .await
                .map_err(LinkError::frame)?;
            let rdma = Offer {
                nic,
                files: Some(m.paths),
            };
            serve(conn, Serving::new(m.map, m.reader, rdma)).await;
            return Ok(());
        }
        None => {
            let r = Refusal::NotServing(format!(
                "not receiving `{name}` with root {} (its transfer here ended, or the source has not offered it here yet)",
                root.short()
            ));
            write_frame(&mut send, &TransferMsg::Failed(r.clone()))
                .await
                .map_err(LinkError::frame)?;
            let _ = send.finish();
            return Err(LinkError::Refusing(r));
        }
    };
    // Only a peer the source linked this node with may fetch from it (its
    // `Links` may still be on its way): so the degree bound holds here too.
    if !share.tally.wait_told(from, true, Some(JOIN_WAIT)).await {
        let r = Refusal::Busy(format!(
            "this node is not linked with peer {from} in the swarm of `{name}`; the source \
             links peers"
        ));
        write_frame(&mut send, &TransferMsg::Failed(r.clone()))
            .await
            .map_err(LinkError::frame)?;
        let _ = send.finish();
        return Err(LinkError::Refusing(r));
    }
    share.tally.link_up(from, true);
    let _counted = Incoming(share.tally.clone(), from);
    // Subscribe before the snapshot, so no chunk falls between the two.
    let mut verified = share.verified.subscribe();
    let has = share.transfer.held();
    write_frame(&mut send, &TransferMsg::Bitfield { has })
        .await
        .map_err(LinkError::frame)?;
    let map = Arc::new(share.transfer.map().clone());
    let reader = Arc::new(HeldChunkReader::new(share.transfer.clone()));
    // Still arriving: over RDMA, verified chunks go through a bounce pool.
    let rdma = Offer { nic, files: None };
    let serving = tokio::spawn(serve(conn.clone(), Serving::new(map, reader, rdma)));
    // Unlinked by the source: the link goes, at once.
    let unlinked = share.tally.wait_told(from, false, None);
    let outcome = tokio::select! {
        r = announce(&conn, &mut send, &share, &mut verified) => r,
        _ = unlinked => {
            conn.close(0u32.into(), b"unlinked");
            serving.abort();
            return Ok(());
        }
    };
    if outcome.is_ok() && share.transfer.is_complete() {
        // Complete: keep serving until the peer is done with us.
        conn.closed().await;
    } else {
        conn.close(0u32.into(), b"transfer ended");
    }
    serving.abort();
    outcome
}

/// Sends `Has` batches until the transfer ends or the peer leaves.
async fn announce(
    conn: &Connection,
    send: &mut quinn::SendStream,
    share: &Share,
    verified: &mut broadcast::Receiver<u64>,
) -> Result<(), LinkError> {
    loop {
        let first = tokio::select! {
            r = verified.recv() => r,
            _ = share.ended.cancelled() => {
                // Flush what was verified before the end.
                let chunks = drain(verified, Vec::new());
                if !chunks.is_empty() {
                    write_frame(send, &TransferMsg::Has { chunks }).await.map_err(LinkError::frame)?;
                }
                return Ok(());
            }
            _ = conn.closed() => return Ok(()),
        };
        match first {
            Ok(c) => {
                let chunks = drain(verified, vec![c]);
                write_frame(send, &TransferMsg::Has { chunks })
                    .await
                    .map_err(LinkError::frame)?;
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let has = share.transfer.held();
                write_frame(send, &TransferMsg::Bitfield { has })
                    .await
                    .map_err(LinkError::frame)?;
            }
            Err(broadcast::error::RecvError::Closed) => return Ok(()),
        }
    }
}

fn drain(rx: &mut broadcast::Receiver<u64>, mut chunks: Vec<u64>) -> Vec<u64> {
    while chunks.len() < HAS_BATCH {
        match rx.try_recv() {
            Ok(c) => chunks.push(c),
            Err(_) => break,
        }
    }
    chunks
}

/// What a receiver needs to link to the rest of its swarm.
#[derive(Debug, Clone)]
pub struct LinkPlan {
    /// The agent's endpoint for data addresses (it connects from its
    /// listening socket, or its data address's own).
    pub endpoint: Endpoint,
    /// The endpoint for peers' management addresses, to fall back to.
    pub fallback_endpoint: Endpoint,
    /// This node's id in the swarm.
    pub me: u32,
    /// What fallback notes call this node.
    pub label: String,
    /// Where the links that go over management are recorded.
    pub tally: Arc<Tally>,
    /// The swarm's first members, this node among them.
    pub peers: Vec<SwarmPeer>,
    /// The model.
    pub name: ModelName,
    /// Its root (or a draft's id).
    pub root: Hash,
    /// Chunks in the manifest: a peer's bitfield must match.
    pub chunks: u64,
    /// The manifest's chunk size (an RDMA ring slot's).
    pub chunk_size: u64,
    /// This node's RDMA NIC, to fetch from peers over; `None`: QUIC.
    pub nic: Option<Arc<dyn Nic>>,
    /// Connections per peer link (the push's `--connections`): the first
    /// carries the peer's announcements, and chunk requests spread over
    /// all of them.
    pub connections: u32,
    /// The addresses this node may dial for peers (the agent's cluster
    /// file's nodes); `None`: any address the source names.
    pub allowed: Option<Arc<PeerAddrs>>,
}

/// The IP addresses of a cluster's nodes (agent and fabric), the only
/// ones a receiver with a cluster file dials for peers.
#[derive(Debug, Default, Clone)]
pub struct PeerAddrs(pub std::collections::HashSet<std::net::IpAddr>);

impl PeerAddrs {
    /// `peer` with only the addresses this set allows (its fallback
    /// dropped when only that one is outside); `None` when its data
    /// address is outside.
    fn admit(&self, mut peer: SwarmPeer) -> Option<SwarmPeer> {
        if !self.0.contains(&peer.addr.ip()) {
            return None;
        }
        peer.fallback = peer.fallback.filter(|f| self.0.contains(&f.ip()));
        Some(peer)
    }
}

type Joined = (PeerId, Fetcher, ChunkSet);

/// This receiver's peer links, as the source rewires them: [`Linker::add`]
/// links (and keeps re-linking) a peer, [`Linker::remove`] drops one, whose
/// departure then reaches the transfer as [`PeerUpdate::Gone`].
pub struct Linker {
    plan: Arc<LinkPlan>,
    tx: mpsc::UnboundedSender<PeerUpdate<Fetcher>>,
    links: HashMap<u32, CancellationToken>,
    cancel: CancellationToken,
    /// Every peer id linked so far ([`MAX_PEERS_PER_TRANSFER`]).
    ever: std::collections::HashSet<u32>,
    /// Whether a refused peer was logged already (once per transfer).
    said_refused: bool,
}

impl Linker {
    /// Links `peer` (a no-op for this node or a peer already linked); a
    /// peer past the bounds ([`MAX_LINKS`], [`MAX_PEERS_PER_TRANSFER`]) or
    /// outside the cluster's addresses is not dialled (logged once).
    pub fn add(&mut self, peer: SwarmPeer) {
        if let Some((peer, token)) = self.admit(peer) {
            tokio::spawn(keep_linked(
                self.plan.clone(),
                peer,
                None,
                self.tx.clone(),
                token,
            ));
        }
    }

    /// Registers a link to `peer` if it may be made: the peer as it is to
    /// be dialled (a fallback outside the cluster dropped) and the link's
    /// token.
    fn admit(&mut self, peer: SwarmPeer) -> Option<(SwarmPeer, CancellationToken)> {
        if peer.id == self.plan.me || self.links.contains_key(&peer.id) {
            return None;
        }
        let (id, addr) = (peer.id, peer.addr);
        let admitted = match &self.plan.allowed {
            Some(a) => a.admit(peer),
            None => Some(peer),
        };
        let why = match admitted {
            None => format!("its address {addr} is not a node of this agent's cluster file"),
            Some(_) if self.links.len() >= MAX_LINKS => {
                format!("this transfer links {MAX_LINKS} peers already")
            }
            Some(_) if !self.ever.contains(&id) && self.ever.len() >= MAX_PEERS_PER_TRANSFER => {
                format!("this transfer linked {MAX_PEERS_PER_TRANSFER} peers already")
            }
            Some(peer) => {
                self.ever.insert(id);
                let token = self.cancel.child_token();
                self.links.insert(id, token.clone());
                self.plan.tally.told(id, true);
                return Some((peer, token));
            }
        };
        if !self.said_refused {
            self.said_refused = true;
            tracing::warn!(
                "{}: not linking peer {id} at {addr} that the source named: {why} (logged once per transfer)",
                self.plan.name
            );
        }
        None
    }

    /// Passes `update` to the transfer as if a link had sent it (the
    /// source's own joins and departures, and homes, go this way).
    pub fn tell(&self, update: PeerUpdate<Fetcher>) {
        let _ = self.tx.send(update);
    }

    /// Drops the link to peer `id`.
    pub fn remove(&mut self, id: u32) {
        self.plan.tally.told(id, false);
        if let Some(token) = self.links.remove(&id) {
            token.cancel();
        }
    }
}

/// Fetching side: links to the peers in `plan`. Returns the peers linked
/// within a short wait (to join the scheduler before the source), a
/// channel of later changes (late joins, announcements, departures,
/// re-joins of peers that come back) and the [`Linker`] that adds and
/// drops links later. Links are kept (and broken ones retried) until
/// `cancel` or their removal.
pub async fn link_peers(
    plan: LinkPlan,
    cancel: CancellationToken,
) -> (
    Vec<Joined>,
    mpsc::UnboundedReceiver<PeerUpdate<Fetcher>>,
    Linker,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let plan = Arc::new(plan);
    let mut linker = Linker {
        plan: plan.clone(),
        tx: tx.clone(),
        links: HashMap::new(),
        cancel: cancel.clone(),
        ever: Default::default(),
        said_refused: false,
    };
    let mut firsts = Vec::new();
    for peer in plan.peers.iter().filter(|p| p.id != plan.me) {
        let Some((peer, token)) = linker.admit(peer.clone()) else {
            continue;
        };
        let (first_tx, first_rx) = oneshot::channel();
        firsts.push(first_rx);
        tokio::spawn(keep_linked(
            plan.clone(),
            peer,
            Some(first_tx),
            tx.clone(),
            token,
        ));
    }
    let deadline = tokio::time::Instant::now() + FIRST_LINKS_WAIT;
    let mut joined = Vec::new();
    for first in firsts {
        if let Ok(Ok(j)) = tokio::time::timeout_at(deadline, first).await {
            joined.push(j);
        }
    }
    (joined, rx, linker)
}

/// One peer link, re-established whenever it breaks, until `cancel` (the
/// transfer ended, or the source unlinked us).
async fn keep_linked(
    plan: Arc<LinkPlan>,
    peer: SwarmPeer,
    mut first: Option<oneshot::Sender<Joined>>,
    tx: mpsc::UnboundedSender<PeerUpdate<Fetcher>>,
    cancel: CancellationToken,
) {
    let id = peer.id as PeerId;
    let mut reported = false;
    let mut pause = RELINK_EVERY;
    while !cancel.is_cancelled() {
        let linked = tokio::select! {
            r = handshake(&plan, &peer) => r,
            _ = cancel.cancelled() => return,
        };
        let mut at_once = false;
        let mut failed = false;
        match linked {
            Ok(Handshook {
                conn,
                mut recv,
                has,
                over_management,
            }) => {
                let lanes = Lanes::new(conn.clone());
                let fetcher =
                    Fetcher::connect_lanes(lanes.clone(), plan.nic.as_ref(), plan.chunk_size).await;
                // The link's other connections join it as they open;
                // they end with it.
                let extra = cancel.child_token();
                let _extra_guard = extra.clone().drop_guard();
                if plan.connections > 1 {
                    tokio::spawn(more_lanes(plan.clone(), peer.clone(), lanes, extra));
                }
                let joined = (id, fetcher.clone(), has.clone());
                let late = match first.take() {
                    Some(f) => f.send(joined).is_err(),
                    None => true,
                };
                if late {
                    let _ = tx.send(PeerUpdate::Joined {
                        peer: id,
                        fetcher,
                        has,
                    });
                }
                plan.tally.link_up(id, false);
                pause = RELINK_EVERY;
                // Over management, the data address is tried again; once it
                // answers, the link is made again over it (the fabric
                // carries the rest; chunks in flight are asked again).
                let why = tokio::select! {
                    why = follow(&mut recv, id, plan.chunks, &tx) => why,
                    () = data_answers(&plan.endpoint, peer.addr), if over_management => {
                        tracing::info!(
                            "peer {id}: its data address {} answers again; linking over it",
                            peer.addr
                        );
                        at_once = true;
                        "its data address answers again".to_string()
                    }
                    _ = cancel.cancelled() => "unlinked by the source".to_string(),
                };
                plan.tally.link_down(id, false);
                conn.close(0u32.into(), b"link ended");
                let _ = tx.send(PeerUpdate::Gone { peer: id, why });
            }
            Err(e) => {
                // Not linked in time for the start: it may join later.
                first.take();
                failed = true;
                tracing::debug!("no link to peer {id} at {}: {e:#}", peer.addr);
                // Nothing answered at any of its addresses, or the peer
                // no longer runs this transfer (its own ended: a draft's
                // receiver that completed serves the model, not the
                // draft): the source hears of it once, so it rewires us
                // and stops holding back copies of the chunks that peer
                // got first. A join refused otherwise is not this: the
                // peer is up and may link later.
                if !reported && matches!(e, LinkError::Connect(_) | LinkError::NotServing { .. }) {
                    reported = true;
                    tracing::warn!(
                        "peer {id} at {} is unreachable ({e:#}); telling the source",
                        peer.addr
                    );
                    plan.tally.unreachable(id);
                }
            }
        }
        if at_once {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = cancel.cancelled() => return,
        }
        // Backed off: a peer that does not answer (or refuses) is not
        // dialled every second for the rest of the transfer.
        if failed {
            pause = (pause * 2).min(RELINK_MAX);
        }
    }
}

/// Opens the `plan.connections - 1` other connections of the link to
/// `peer`, each joined like the first, and adds each to `lanes` (chunk
/// requests then spread over them); reads and drops what the peer
/// announces on them (the first connection carries that) until `done`,
/// then closes them. One that cannot be opened is only logged.
async fn more_lanes(plan: Arc<LinkPlan>, peer: SwarmPeer, lanes: Lanes, done: CancellationToken) {
    let id = peer.id;
    let mut open = Vec::new();
    for _ in 1..plan.connections {
        let made = tokio::select! {
            r = handshake(&plan, &peer) => r,
            _ = done.cancelled() => break,
        };
        match made {
            Ok(Handshook { conn, mut recv, .. }) => {
                let n = lanes.add(conn.clone());
                open.push(conn);
                tokio::spawn(
                    async move { while read_frame::<TransferMsg>(&mut recv).await.is_ok() {} },
                );
                if n as u32 == plan.connections {
                    tracing::info!("peer {id}: linked over {n} connections");
                }
            }
            Err(e) => {
                tracing::warn!(
                    "peer {id}: connection {} of {} not opened: {e:#}",
                    lanes.len() + 1,
                    plan.connections
                );
                break;
            }
        }
    }
    done.cancelled().await;
    for conn in open {
        conn.close(0u32.into(), b"link ended");
    }
}

/// Returns once `data` answers a QUIC handshake, tried every
/// [`route::REPROBE_EVERY`]; the probe's connection is closed at once.
async fn data_answers(ep: &Endpoint, data: SocketAddr) {
    loop {
        tokio::time::sleep(route::REPROBE_EVERY).await;
        match route::connect(ep, data, None, REPROBE_TIMEOUT).await {
            Ok(c) => {
                c.conn.close(0u32.into(), b"probe");
                return;
            }
            Err(e) => tracing::debug!("{data}: the data address still does not answer: {e}"),
        }
    }
}

/// A link made: the connection, its announcement stream, the peer's
/// bitfield, and whether it goes over management.
struct Handshook {
    conn: Connection,
    recv: quinn::RecvStream,
    has: ChunkSet,
    over_management: bool,
}

/// Connects to a peer (its data address, else its management address,
/// recorded in the tally), joins, and reads its bitfield.
async fn handshake(plan: &LinkPlan, peer: &SwarmPeer) -> Result<Handshook, LinkError> {
    let connected = route::connect(
        &plan.endpoint,
        peer.addr,
        peer.fallback.map(|f| (&plan.fallback_endpoint, f)),
        Duration::from_secs(5),
    )
    .await
    .map_err(LinkError::Connect)?;
    let conn = connected.conn;
    let addr = conn.remote_address();
    let over_management = connected.fell_back.is_some();
    if let Some(error) = connected.fell_back {
        let route = FallbackRoute {
            from: plan.label.clone(),
            to: peer.label.clone(),
            data: peer.addr,
            error,
        };
        if plan.tally.fell_back(route.clone()) {
            tracing::warn!("{route}");
        }
    }
    let (mut send, mut recv) = quic::open_service(&conn, Service::Transfer)
        .await
        .map_err(LinkError::Open)?;
    let join = TransferMsg::Join {
        name: plan.name.clone(),
        root: plan.root,
        from: plan.me,
    };
    write_frame(&mut send, &join)
        .await
        .map_err(LinkError::frame)?;
    let _ = send.finish();
    tracing::debug!("sent join to {addr}");
    let reply = tokio::time::timeout(JOIN_WAIT + Duration::from_secs(5), read_frame(&mut recv))
        .await
        .map_err(|_| LinkError::NoAnswer(addr))?
        .map_err(LinkError::frame)?;
    match reply {
        TransferMsg::Bitfield { has } if has.is_well_formed() && has.capacity() == plan.chunks => {
            Ok(Handshook {
                conn,
                recv,
                has,
                over_management,
            })
        }
        TransferMsg::Failed(Refusal::NotServing(why)) => {
            conn.close(0u32.into(), b"refused");
            Err(LinkError::NotServing { addr, why })
        }
        TransferMsg::Failed(r) => {
            conn.close(0u32.into(), b"refused");
            Err(LinkError::Refused { addr, refusal: r })
        }
        other => {
            conn.close(0u32.into(), b"protocol error");
            Err(LinkError::Unexpected {
                addr,
                kind: other.kind(),
            })
        }
    }
}

/// Forwards a linked peer's announcements until the link ends; returns why.
async fn follow(
    recv: &mut quinn::RecvStream,
    id: PeerId,
    chunks: u64,
    tx: &mpsc::UnboundedSender<PeerUpdate<Fetcher>>,
) -> String {
    loop {
        let msg = match read_frame::<TransferMsg>(recv).await {
            Ok(m) => m,
            Err(e) => return format!("{e:#}"),
        };
        let update = match msg {
            TransferMsg::Has { chunks: c } if c.iter().all(|&n| n < chunks) => PeerUpdate::Has {
                peer: id,
                chunks: c,
            },
            TransferMsg::Bitfield { has } if has.is_well_formed() && has.capacity() == chunks => {
                PeerUpdate::Has {
                    peer: id,
                    chunks: has.iter().collect(),
                }
            }
            TransferMsg::Failed(r) => return r.to_string(),
            other => return format!("protocol error: unexpected {}", other.kind()),
        };
        if tx.send(update).is_err() {
            return "transfer ended".into();
        }
    }
}
