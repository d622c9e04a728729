//! `xfer push`: deliver a local tree to one or more agents.
//!
//! The pusher hashes the tree once, offers the manifest to every agent over
//! its own QUIC connection (its own endpoint and socket), tells each who the
//! other agents are ([`TransferMsg::Swarm`]), then serves the chunks each agent
//! asks for. Agents fetch most chunks from each other, so the source uploads
//! about one copy whatever the number of agents; they decide what they still
//! need, so a re-run after an interruption sends only what is missing.
//!
//! Each agent is reached at its data address when it has one
//! ([`Destination`]), and every receiver is told the others' data
//! addresses, so the chunks ride the fabric; a data address that cannot be
//! reached falls back to the management address, reported as a
//! [`FallbackRoute`] (in the summary's notes and to [`PushOptions::routes`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::auth::Credential;
use crate::flow::coordinator::{Coordinator, SeedGate};
use crate::flow::feed::DraftFeed;
use crate::flow::route::{self, Destination, DestinationError};
use crate::flow::timeline::{Clock, NodeMarks, Timeline};
use crate::store::hashcache::HashCache;
use crate::store::scan::{scan_cached, SourceTree};
use crate::transport::files::FileChunkReader;
use crate::transport::quic::{self, read_frame, write_frame};
use crate::transport::rdma::link::{Nic, Offer};
use crate::transport::serve::{serve, Serving};
use crate::transport::ChunkReader;
use crate::util::chain::Chain;
use crate::util::permanence::Permanence;
use crate::util::progress::Progress;
use crate::util::rate::RateLimiter;
use xfer_proto::chunkset::ChunkMap;
use xfer_proto::hash::Hash;
use xfer_proto::hello::Service;
use xfer_proto::manifest::ChunkSize;
use xfer_proto::names::{ModelName, ModelNameError, NodeName};
use xfer_proto::transfer::{FallbackRoute, HomeSlots, SwarmPeer, TransferMsg};

/// Why a push (or its hashing, or a delivery) did not run to its end. A
/// node that refused or was lost is not one: it is in that node's
/// [`NodeSummary`].
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// The source folder cannot be opened.
    #[error("cannot open {}: {error}", path.display())]
    Open {
        /// The folder.
        path: PathBuf,
        /// What the system said.
        error: std::io::Error,
    },
    /// The folder's name is not a model name (and none was given).
    #[error("{0}")]
    Name(ModelNameError),
    /// A destination's address does not resolve.
    #[error("{0}")]
    Destination(DestinationError),
    /// The tree cannot be hashed (a file cannot be read, a bad chunk
    /// size, ...), in the scan's words.
    #[error("{0}")]
    Scan(Chain),
    /// A node holds another tree than the one pushed.
    #[error("{node} reports root {got}, expected {want}")]
    Root {
        /// The node's address.
        node: String,
        /// The root it reports.
        got: Hash,
        /// The pushed tree's root.
        want: Hash,
    },
    /// A task of the push failed (panicked or was cancelled).
    #[error("{0}")]
    Task(tokio::task::JoinError),
}

/// A push's own errors are all worth another round: a node's permanent
/// refusal is in its [`NodeSummary`], not here.
impl Permanence for PushError {
    fn is_permanent(&self) -> bool {
        match self {
            PushError::Destination(e) => e.is_permanent(),
            PushError::Scan(e) => e.is_permanent(),
            PushError::Open { .. }
            | PushError::Name(_)
            | PushError::Root { .. }
            | PushError::Task(_) => false,
        }
    }
}

/// Notes kept per node: one per pair at most, and a receiver cannot grow
/// the summary without bound.
const MAX_NOTES: usize = 64;

/// What to push where.
#[derive(Debug, Clone)]
pub struct PushOptions {
    /// The folder to push.
    pub src: PathBuf,
    /// The agents to push to.
    pub to: Vec<Destination>,
    /// What notes call the source (its node name); `None`: "source".
    pub me: Option<NodeName>,
    /// Told of every pair whose data goes over management.
    pub routes: Option<RouteSink>,
    /// The cluster credential, loaded once by the caller.
    pub cred: Arc<Credential>,
    /// The model's name on the agents (default: the source folder's name).
    pub name: Option<ModelName>,
    /// The chunk size (auto: from the tree's size).
    pub chunk_size: ChunkSize,
    /// Caps the send rate, in bytes per second (`--limit-rate`).
    pub limit_rate: Option<u64>,
    /// How long connecting to an agent may take.
    pub connect_timeout: Duration,
    /// QUIC connections per agent (`--connections`): the first, and as
    /// many more that the agent fetches over too.
    pub connections: usize,
    /// Ignore the hash cache and re-read every file.
    pub rehash: bool,
    /// The RDMA NIC receivers may fetch over; `None`: QUIC only.
    pub nic: Option<Arc<dyn Nic>>,
    /// Peer links per receiver, at most (`--peers`).
    pub peers: u32,
}

/// Where a push reports its fallbacks to management as they happen (an
/// agent's status shows them while the transfer runs).
#[derive(Clone)]
pub struct RouteSink(pub Arc<dyn Fn(FallbackRoute) + Send + Sync>);

impl std::fmt::Debug for RouteSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouteSink")
    }
}

/// The `--json` summary (read back by the integration tests).
#[derive(Debug, Serialize, Deserialize)]
pub struct PushSummary {
    /// The model's name on the agents.
    pub name: String,
    /// The tree's root.
    pub root: Hash,
    /// Files in the tree.
    pub files: usize,
    /// The tree's size in bytes.
    pub bytes_total: u64,
    /// Chunk bytes the source sent, summed over nodes.
    pub bytes_sent: u64,
    /// `bytes_sent` as a multiple of `bytes_total`: about 1 for a swarm
    /// that started empty, whatever the number of nodes.
    pub source_sent_x: f64,
    /// Bytes the nodes already held, summed over nodes.
    pub bytes_skipped: u64,
    /// Seconds hashing took.
    pub hash_s: f64,
    /// Seconds the whole push took, hashing included.
    pub duration_s: f64,
    /// Where those seconds went, on a clock that starts with hashing.
    #[serde(default)]
    pub timeline: Timeline,
    /// The outcome per agent, in `--to`'s order.
    pub nodes: Vec<NodeSummary>,
}

/// One destination's outcome.
#[derive(Debug, Serialize, Deserialize, Clone, Default)]
pub struct NodeSummary {
    /// Its agent's address.
    pub addr: String,
    /// Its data address, when it has one apart from `addr`.
    pub data_addr: Option<String>,
    /// How the source reached it: `fabric` (its data address, or its only
    /// address) or `management` (its data address failed).
    pub over: Over,
    /// Every pair of nodes whose data for it went over management, one
    /// line each (the source's link to it, and its own links to peers).
    pub notes: Vec<String>,
    /// Whether it holds the tree complete and verified.
    pub ok: bool,
    /// Why not, if it does not.
    pub error: Option<String>,
    /// The node's own refusal, when it refused (typed, so a caller can
    /// tell a full disk from a lost connection).
    #[serde(default)]
    pub refusal: Option<xfer_proto::refusal::Refusal>,
    /// The root it reported.
    pub root: Option<Hash>,
    /// Chunk bytes the source sent it.
    pub bytes_sent: u64,
    /// Of `bytes_sent`, what went by RDMA write (0: all over QUIC).
    pub bytes_sent_rdma: u64,
    /// Bytes it already held.
    pub bytes_skipped: u64,
    /// Verified bytes this node received from the source.
    pub from_source: u64,
    /// Verified bytes this node received from other nodes.
    pub from_peers: u64,
    /// Bytes this node fetched from the origin (a Hub job's source, or an
    /// intake node of a striped pull).
    #[serde(default)]
    pub from_origin: u64,
    /// Why a striped pull named this node (it sent bytes that differ from
    /// the origin's, or stopped answering).
    #[serde(default)]
    pub named: Option<String>,
    /// Peers this node excluded, with why (e.g. they served corrupt chunks).
    pub dropped_peers: Vec<String>,
    /// The most peer links it held at once (either way), as it reported.
    pub max_peer_links: u32,
    /// Chunks that failed their check and were fetched again.
    pub corrupt_chunks: u64,
    /// Seconds from the start of its delivery until it reported the model
    /// verified (`Done`); for a node that failed, until it was given up.
    /// The connection's close after `Done` is not in it.
    pub duration_s: f64,
    /// Chunk bytes sent over each QUIC connection to it, the first being
    /// the one the offer went on (`--connections`).
    pub bytes_per_connection: Vec<u64>,
    /// In `xfer pull --to`: seconds from the first byte downloaded from
    /// the Hub to this node's first verified chunk.
    #[serde(default)]
    pub first_byte_s: Option<f64>,
    /// In `xfer pull --to`: seconds from the last byte downloaded to this
    /// node holding everything.
    #[serde(default)]
    pub tail_s: Option<f64>,
    /// Its delivery's marks, on the push's clock.
    #[serde(default)]
    pub marks: NodeMarks,
    /// When it first reported a verified chunk.
    #[serde(skip)]
    pub first_chunk_at: Option<Instant>,
    /// When it was done (for `tail_s`).
    #[serde(skip)]
    pub done_at: Option<Instant>,
}

/// Which network a node's data went over.
#[derive(Debug, Serialize, Deserialize, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Over {
    /// Its data address (or, without one, its only address).
    #[default]
    Fabric,
    /// Its management address, because the data address failed.
    Management,
}

impl PushSummary {
    /// Whether every agent holds the tree.
    pub fn ok(&self) -> bool {
        self.nodes.iter().all(|n| n.ok)
    }
}

/// Hashes `opts.src` and delivers it to every agent in `opts.to`.
pub async fn push(opts: &PushOptions, progress: &Progress) -> Result<PushSummary, PushError> {
    let name = match &opts.name {
        Some(n) => n.clone(),
        None => {
            let dir = opts.src.canonicalize().map_err(|error| PushError::Open {
                path: opts.src.clone(),
                error,
            })?;
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("model");
            ModelName::new(name).map_err(PushError::Name)?
        }
    };
    // Catch address typos before spending time hashing.
    members(&opts.to)?;
    let started = Instant::now();
    let tree = hash_tree(opts, progress).await?;
    deliver(
        opts,
        &name,
        &tree,
        started.elapsed().as_secs_f64(),
        progress,
    )
    .await
}

/// The swarm: every destination with its peer id (its index in `to`, from
/// 1), its data address and its management one to fall back to.
fn members(to: &[Destination]) -> Result<Vec<SwarmPeer>, PushError> {
    to.iter()
        .enumerate()
        .map(|(i, d)| {
            let (addr, fallback) = d.resolve().map_err(PushError::Destination)?;
            Ok(SwarmPeer {
                id: i as u32 + 1,
                label: d.label().to_string(),
                addr,
                fallback,
            })
        })
        .collect()
}

/// A spawned task that is aborted when its handle is dropped: a push whose
/// future is dropped (a cancelled sync job) must stop sending, not leave its
/// per-node tasks and chunk servers running.
pub(crate) struct AbortOnDrop<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Delivers an already hashed tree to every agent in `opts.to` under
/// `name`. `hash_s` is how long hashing took, for the summary.
pub async fn deliver(
    opts: &PushOptions,
    name: &ModelName,
    tree: &SourceTree,
    hash_s: f64,
    progress: &Progress,
) -> Result<PushSummary, PushError> {
    let manifest = &tree.manifest;
    let map = Arc::new(ChunkMap::new(manifest));
    let root = manifest.root();
    let plan = Plan {
        offer: TransferMsg::Offer {
            name: name.clone(),
            manifest: manifest.clone(),
        },
        name: name.clone(),
        key: root,
        reader: Arc::new(FileChunkReader::new(tree.sources.clone(), map.clone())),
        map,
        rdma_files: Some(tree.sources.clone()),
        total_bytes: manifest.total_bytes(),
        events: None,
        clock: Clock::since(
            Instant::now()
                .checked_sub(Duration::from_secs_f64(hash_s))
                .unwrap_or_else(Instant::now),
        ),
    };
    let clock = plan.clock;
    let send_started = Instant::now();
    let nodes = deliver_plan(opts, plan, progress).await?;
    for node in &nodes {
        if let Some(r) = &node.root {
            if *r != root {
                return Err(PushError::Root {
                    node: node.addr.clone(),
                    got: *r,
                    want: root,
                });
            }
        }
    }
    let bytes_sent = nodes.iter().map(|n| n.bytes_sent).sum();
    Ok(PushSummary {
        name: name.to_string(),
        root,
        files: manifest.file_count(),
        bytes_total: manifest.total_bytes(),
        bytes_sent,
        source_sent_x: bytes_sent as f64 / manifest.total_bytes().max(1) as f64,
        bytes_skipped: nodes.iter().map(|n| n.bytes_skipped).sum(),
        hash_s,
        duration_s: send_started.elapsed().as_secs_f64() + hash_s,
        timeline: Timeline::of(hash_s, nodes.iter().map(|n| &n.marks), clock.now()),
        nodes,
    })
}

/// What a delivery offers: a hashed tree, or a draft that grows while it
/// is delivered ([`crate::flow::stream`]).
pub(crate) struct Plan {
    /// The opener: `Offer` or `OfferDraft`.
    pub offer: TransferMsg,
    pub name: ModelName,
    /// The manifest's root, or the draft's id.
    pub key: Hash,
    pub map: Arc<ChunkMap>,
    pub reader: Arc<dyn ChunkReader>,
    /// The files an RDMA data plane may register (`None`: QUIC only).
    pub rdma_files: Option<Vec<PathBuf>>,
    pub total_bytes: u64,
    /// A draft's events, sent to every receiver after its swarm.
    pub events: Option<Arc<DraftFeed>>,
    /// The clock its receivers' marks are read on.
    pub clock: Clock,
}

/// Offers `plan` to every agent in `opts.to` and serves their chunks
/// until each is done or failed: the outcome per agent, in `to`'s order.
pub(crate) async fn deliver_plan(
    opts: &PushOptions,
    plan: Plan,
    progress: &Progress,
) -> Result<Vec<NodeSummary>, PushError> {
    let cred = opts.cred.clone();
    let members = members(&opts.to)?;
    let limiter = opts.limit_rate.map(|r| Arc::new(RateLimiter::new(r)));
    let offer = Arc::new(plan.offer);
    let lane = Arc::new((plan.name.clone(), plan.key));
    let mut tasks = Vec::new();
    // One swarm per group (`swarms`): each with its own coordinator, its
    // members numbered from 1.
    let mut coordinators = Vec::new();
    let mut slots: Vec<Option<(Arc<Coordinator>, SwarmPeer, _)>> =
        (0..members.len()).map(|_| None).collect();
    for group in swarms(&members) {
        let numbered: Vec<SwarmPeer> = group
            .iter()
            .enumerate()
            .map(|(k, &i)| SwarmPeer {
                id: k as u32 + 1,
                ..members[i].clone()
            })
            .collect();
        let (coordinator, outboxes) = Coordinator::new(
            numbered.clone(),
            opts.peers,
            opts.connections as u32,
            plan.key,
            plan.map.len(),
        );
        let coordinator = Arc::new(coordinator);
        coordinators.push(coordinator.clone());
        for ((&i, member), outbox) in group.iter().zip(numbered).zip(outboxes) {
            slots[i] = Some((coordinator.clone(), member, outbox));
        }
    }
    // A withdrawn file's chunks were sent to their first holders as the
    // failed download's: the seeding ledgers forget them.
    let _forgetting = plan.events.clone().map(|feed| {
        let coordinators = coordinators.clone();
        AbortOnDrop(tokio::spawn(async move {
            let mut more = feed.subscribe();
            let mut seen = 0;
            loop {
                for chunks in feed.withdrawn_from(seen) {
                    seen += 1;
                    for c in &coordinators {
                        c.withdrawn(chunks.clone());
                    }
                }
                if more.changed().await.is_err() {
                    return;
                }
            }
        }))
    });
    let live = Arc::new(AtomicUsize::new(members.len()));
    for (dest, slot) in opts.to.iter().zip(slots) {
        let (coordinator, member, outbox) = slot.expect("every member is in one swarm");
        let swarm = coordinator.swarm_for(member.id);
        let ctx = NodeCtx {
            id: member.id,
            coordinator: coordinator.clone(),
            outbox: Arc::new(tokio::sync::Mutex::new(outbox)),
            dest: dest.clone(),
            me: opts
                .me
                .as_ref()
                .map_or_else(|| "source".into(), NodeName::to_string),
            routes: opts.routes.clone(),
            swarm,
            cred: cred.clone(),
            offer: offer.clone(),
            lane: lane.clone(),
            events: plan.events.clone(),
            map: plan.map.clone(),
            reader: plan.reader.clone(),
            limiter: limiter.clone(),
            rdma: Offer {
                nic: plan.rdma_files.as_ref().and(opts.nic.clone()),
                files: plan.rdma_files.clone(),
            },
            timeout: opts.connect_timeout,
            connections: opts.connections.max(1),
            bar: progress.bytes(dest.label(), plan.total_bytes),
            live: live.clone(),
            counted: true,
            clock: plan.clock,
        };
        tasks.push(AbortOnDrop(tokio::spawn(ctx.run())));
    }
    let mut nodes = Vec::new();
    for mut t in tasks {
        nodes.push((&mut t.0).await.map_err(PushError::Task)?);
    }
    Ok(nodes)
}

/// The swarms a delivery runs, as indexes into `members`: one, unless
/// some receivers run on this very host (the pusher runs inside the
/// allocation it pushes to, as a Slurm job's batch script does) and others
/// do not. Then each of those takes every chunk from the source over
/// loopback, in a swarm of its own: as a peer it would send the others,
/// over this host's uplink, bytes the source sends them over that same
/// link, and take from them over the network what the source holds here.
fn swarms(members: &[SwarmPeer]) -> Vec<Vec<usize>> {
    let (here, away): (Vec<usize>, Vec<usize>) = (0..members.len())
        .partition(|&i| crate::sysinfo::net::is_own_address(members[i].addr.ip()));
    if here.is_empty() || away.is_empty() {
        return vec![(0..members.len()).collect()];
    }
    let mut groups: Vec<Vec<usize>> = here.into_iter().map(|i| vec![i]).collect();
    groups.push(away);
    groups
}

/// Hashes `opts.src` (through its hash cache unless `opts.rehash`): the
/// tree [`deliver`] offers.
pub async fn hash_tree(opts: &PushOptions, progress: &Progress) -> Result<SourceTree, PushError> {
    let bar = progress.counter("hashing");
    let (src, cs, b, rehash) = (opts.src.clone(), opts.chunk_size, bar.clone(), opts.rehash);
    let tree = tokio::task::spawn_blocking(move || {
        let mut cache = (!rehash).then(|| HashCache::for_tree(&src));
        let tree = scan_cached(&src, cs, cache.as_mut(), &|n| b.inc(n));
        if let (Ok(_), Some(c)) = (&tree, &cache) {
            c.save();
        }
        tree
    })
    .await
    .map_err(PushError::Task)?
    .map_err(|e| PushError::Scan(e.into()))?;
    bar.finish_and_clear();
    Ok(tree)
}

struct NodeCtx {
    /// Its id in the swarm.
    id: u32,
    coordinator: Arc<Coordinator>,
    /// The source's rewiring for it, to send on its control stream.
    outbox: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<TransferMsg>>>,
    dest: Destination,
    /// What notes call the source.
    me: String,
    routes: Option<RouteSink>,
    swarm: TransferMsg,
    cred: Arc<Credential>,
    offer: Arc<TransferMsg>,
    /// The transfer an extra connection attaches to: its name and root.
    lane: Arc<(ModelName, Hash)>,
    /// A draft's events, to send after the swarm.
    events: Option<Arc<DraftFeed>>,
    map: Arc<ChunkMap>,
    reader: Arc<dyn ChunkReader>,
    limiter: Option<Arc<RateLimiter>>,
    rdma: Offer,
    timeout: Duration,
    connections: usize,
    bar: crate::util::progress::Bar,
    /// Receivers whose delivery runs and whose agent answers: a lost one
    /// leaves the count until it answers again (so two dead receivers do
    /// not keep each other's retries going), a finished one for good.
    live: Arc<AtomicUsize>,
    /// Whether this receiver is in `live`.
    counted: bool,
    /// The delivery's clock, for its marks.
    clock: Clock,
}

/// Why one attempt to deliver to a node ended early.
enum Attempt {
    /// The agent refused, broke the protocol, or the destination is wrong:
    /// final.
    Refused(String),
    /// The agent could not be reached, or the connection was lost.
    Lost(String),
}

/// `swarm`, with the receiver fetching from the source whatever no peer
/// has: a receiver offered a stream again rejoins the graph without homes
/// (slots never move to a newcomer), and its peers may be done by then.
fn fed_by_source(swarm: TransferMsg) -> TransferMsg {
    match swarm {
        TransferMsg::Swarm {
            me,
            peers,
            homes: None,
            bounded,
            connections,
        } => TransferMsg::Swarm {
            me,
            peers,
            homes: Some(HomeSlots {
                of: 1,
                slots: vec![0],
            }),
            bounded,
            connections,
        },
        other => other,
    }
}

/// How often a streamed delivery offers its draft again to an agent it
/// lost while the download runs, and how many times once it is over
/// (then the final round brings the agent what it lacks, but without its
/// staged chunks).
const STREAM_RETRY_EVERY: Duration = Duration::from_secs(1);

const STREAM_RETRIES_AFTER: u32 = 2;

/// Writes the source's later messages to one receiver: the coordinator's
/// rewiring as it comes, and every event of a draft in order, until both
/// are over or the stream breaks. Holds the outbox while it runs (a later
/// attempt at the same receiver takes it over).
async fn write_control(
    mut send: quinn::SendStream,
    outbox: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<TransferMsg>>>,
    events: Option<Arc<DraftFeed>>,
) {
    let mut outbox = outbox.lock().await;
    let mut grew = events.as_ref().map(|f| f.subscribe());
    let mut sent = 0;
    let mut rewiring = true;
    loop {
        if let Some(feed) = &events {
            for ev in feed.events_from(sent) {
                if write_frame(&mut send, &TransferMsg::Draft(ev))
                    .await
                    .is_err()
                {
                    return;
                }
                sent += 1;
            }
        }
        tokio::select! {
            m = outbox.recv(), if rewiring => match m {
                Some(msg) => {
                    if write_frame(&mut send, &msg).await.is_err() {
                        return;
                    }
                }
                None => rewiring = false,
            },
            r = async { grew.as_mut().expect("guarded").changed().await }, if grew.is_some() => {
                if r.is_err() {
                    // The feed is gone: what it had is sent on the next pass.
                    grew = None;
                }
            }
            else => return,
        }
    }
}

impl NodeCtx {
    /// What a connection to the agent serves; its chunk bytes count in
    /// `sent` and in a counter of its own, pushed onto `per_conn`.
    fn serving(
        &self,
        sent: &Arc<AtomicU64>,
        rdma_sent: &Arc<AtomicU64>,
        per_conn: &Mutex<Vec<Arc<AtomicU64>>>,
    ) -> Serving {
        let (total, mine) = (sent.clone(), Arc::new(AtomicU64::new(0)));
        per_conn.lock().unwrap().push(mine.clone());
        Serving {
            map: self.map.clone(),
            reader: self.reader.clone(),
            limiter: self.limiter.clone(),
            on_sent: Arc::new(move |n| {
                total.fetch_add(n, Ordering::Relaxed);
                mine.fetch_add(n, Ordering::Relaxed);
            }),
            rdma: self.rdma.clone(),
            rdma_sent: rdma_sent.clone(),
            admission: Some(Arc::new(SeedGate {
                coordinator: self.coordinator.clone(),
                id: self.id,
            })),
        }
    }

    /// Opens one more connection to the agent at `addr`, from an endpoint
    /// (a socket) of its own, and attaches it to the transfer as a lane.
    async fn open_lane(
        &self,
        addr: SocketAddr,
        key: [u8; 16],
    ) -> Result<(quinn::Endpoint, quinn::Connection, quinn::SendStream), String> {
        let ep = quic::client_endpoint(&self.cred, addr).map_err(|e| format!("{e:#}"))?;
        let conn = quic::connect(&ep, addr, self.timeout)
            .await
            .map_err(|e| e.to_string())?;
        let (mut send, mut recv) = quic::open_service(&conn, Service::Transfer)
            .await
            .map_err(|e| e.to_string())?;
        let (name, root) = self.lane.as_ref();
        let lane = TransferMsg::Lane {
            name: name.clone(),
            root: *root,
            key,
        };
        write_frame(&mut send, &lane)
            .await
            .map_err(|e| format!("{e:#}"))?;
        match read_frame::<TransferMsg>(&mut recv)
            .await
            .map_err(|e| format!("{e:#}"))?
        {
            TransferMsg::LaneAttached { .. } => Ok((ep, conn, send)),
            TransferMsg::Failed(r) => Err(r.to_string()),
            other => Err(format!("protocol error: unexpected {}", other.kind())),
        }
    }

    /// Opens the agent's connections after the first (`--connections`),
    /// each from an endpoint (a socket) of its own, attaches each to the
    /// transfer, and serves chunks on them until `done`. One that cannot
    /// be opened is only logged: the transfer runs on the others.
    ///
    /// When the transfer fell back to management, `reprobe` is the data
    /// address that did not answer: it is tried again every
    /// [`route::REPROBE_EVERY`] until it answers (a cable plugged back, a firewall
    /// rule lifted), and then attached as one more lane. The node's
    /// requests go to the lane with the fewest in flight, so the faster
    /// fabric takes most of the rest; the management connection stays the
    /// primary (its loss is the node's). `fabric_back` is told when.
    #[allow(clippy::too_many_arguments)]
    async fn extra_lanes(
        &self,
        addr: SocketAddr,
        key: [u8; 16],
        reprobe: Option<SocketAddr>,
        fabric_back: &Mutex<Option<Instant>>,
        sent: Arc<AtomicU64>,
        rdma_sent: Arc<AtomicU64>,
        per_conn: Arc<Mutex<Vec<Arc<AtomicU64>>>>,
        done: CancellationToken,
    ) {
        let mut open = Vec::new();
        for i in 1..self.connections {
            let (ep, conn, send) = tokio::select! {
                r = self.open_lane(addr, key) => match r {
                    Ok(lane) => lane,
                    Err(e) => {
                        tracing::warn!("{addr}: connection {} of {} not opened: {e}", i + 1, self.connections);
                        break;
                    }
                },
                _ = done.cancelled() => break,
            };
            let serving = AbortOnDrop(tokio::spawn(serve(
                conn.clone(),
                self.serving(&sent, &rdma_sent, &per_conn),
            )));
            open.push((ep, conn, send, serving));
        }
        if let Some(data) = reprobe {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(route::REPROBE_EVERY) => {}
                    _ = done.cancelled() => break,
                }
                let (ep, conn, send) = tokio::select! {
                    r = self.open_lane(data, key) => match r {
                        Ok(lane) => lane,
                        Err(e) => {
                            tracing::debug!("{data}: the data address still does not answer: {e}");
                            continue;
                        }
                    },
                    _ = done.cancelled() => break,
                };
                tracing::info!(
                    "{data}: the data address answers again; a lane over it carries the rest"
                );
                *fabric_back.lock().unwrap() = Some(Instant::now());
                let serving = AbortOnDrop(tokio::spawn(serve(
                    conn.clone(),
                    self.serving(&sent, &rdma_sent, &per_conn),
                )));
                open.push((ep, conn, send, serving));
                break;
            }
        }
        done.cancelled().await;
        for (ep, conn, _, _) in open {
            quic::close_done(ep, &conn).await;
        }
    }

    /// Records a pair whose data goes over management: never silent.
    fn note(&self, summary: &mut NodeSummary, route: FallbackRoute) {
        let line = route.to_string();
        if summary.notes.contains(&line) || summary.notes.len() >= MAX_NOTES {
            return;
        }
        tracing::warn!("{line}");
        summary.notes.push(line);
        if let Some(sink) = &self.routes {
            (sink.0)(route);
        }
    }

    async fn run(mut self) -> NodeSummary {
        let started = Instant::now();
        let sent = Arc::new(AtomicU64::new(0));
        let rdma_sent = Arc::new(AtomicU64::new(0));
        let mut summary = NodeSummary {
            addr: self.dest.agent.clone(),
            data_addr: self.dest.data.clone(),
            ..Default::default()
        };
        let bar = self.bar.clone();
        let (id, coordinator, clock) = (self.id, self.coordinator.clone(), self.clock);
        let (mut tries, mut tries_after) = (0, 0);
        let outcome = loop {
            match self.deliver(&sent, &rdma_sent, &mut summary).await {
                // A streamed delivery outlives a restart of the agent: it
                // is offered the draft again and resumes from its journal.
                // While the download runs, and a few times after it.
                Err(Attempt::Lost(why))
                    if self.events.as_ref().is_some_and(|f| {
                        !f.is_sealed_all() || tries_after < STREAM_RETRIES_AFTER
                    }) =>
                {
                    tries += 1;
                    if self.events.as_ref().is_some_and(|f| f.is_sealed_all()) {
                        tries_after += 1;
                    }
                    tracing::warn!("{why}; offering the stream again (try {tries})");
                    coordinator.gone(id);
                    self.set_live(false);
                    tokio::time::sleep(STREAM_RETRY_EVERY).await;
                }
                // A finished tree: a receiver lost (killed, or not up yet)
                // is offered it again while the others still receive, so
                // a restarted or late agent joins the running swarm. It
                // rejoins the graph only once it answers: peers are never
                // sent to a node that is down.
                Err(Attempt::Lost(why)) if self.events.is_none() && self.others_live() => {
                    tries += 1;
                    tracing::warn!(
                        "{why}; offering the model again while the others receive (try {tries})"
                    );
                    coordinator.gone(id);
                    self.set_live(false);
                    tokio::time::sleep(STREAM_RETRY_EVERY).await;
                }
                Err(Attempt::Lost(e) | Attempt::Refused(e)) => break Err(e),
                Ok(()) => break Ok(()),
            }
        };
        self.set_live(false);
        match outcome {
            Ok(()) => {
                summary.ok = true;
                summary.error = None;
                summary.refusal = None;
                bar.finish_with_message("verified");
            }
            Err(e) => {
                summary.error = Some(e.clone());
                bar.abandon_with_message("failed");
                // Its peers get other links; its homes go to another.
                coordinator.gone(id);
            }
        }
        summary.bytes_sent = sent.load(Ordering::Relaxed);
        summary.bytes_sent_rdma = rdma_sent.load(Ordering::Relaxed);
        let ended = match (summary.ok, summary.done_at) {
            (true, Some(done)) => done,
            _ => Instant::now(),
        };
        summary.duration_s = ended.saturating_duration_since(started).as_secs_f64();
        summary.marks.first_chunk_s = summary.first_chunk_at.map(|t| clock.at(t));
        summary.marks.done_s = summary.done_at.map(|t| clock.at(t));
        summary
    }

    /// Enters or leaves the live count; returns whether it was in it.
    fn set_live(&mut self, live: bool) -> bool {
        let was = self.counted;
        if live && !was {
            self.live.fetch_add(1, Ordering::AcqRel);
        } else if !live && was {
            self.live.fetch_sub(1, Ordering::AcqRel);
        }
        self.counted = live;
        was
    }

    /// Whether another receiver's delivery still runs with its agent up.
    fn others_live(&self) -> bool {
        self.live.load(Ordering::Acquire) > usize::from(self.counted)
    }

    async fn deliver(
        &mut self,
        sent: &Arc<AtomicU64>,
        rdma_sent: &Arc<AtomicU64>,
        summary: &mut NodeSummary,
    ) -> Result<(), Attempt> {
        let refused = |e: &dyn std::fmt::Display| Attempt::Refused(format!("{e:#}"));
        let (data, fallback) = self.dest.resolve().map_err(|e| refused(&e))?;
        let ep = quic::client_endpoint(&self.cred, data).map_err(|e| refused(&e))?;
        let fallback_ep = match fallback {
            Some(f) if f.is_ipv4() != data.is_ipv4() => {
                Some(quic::client_endpoint(&self.cred, f).map_err(|e| refused(&e))?)
            }
            _ => None,
        };
        let connected = route::connect(
            &ep,
            data,
            fallback.map(|f| (fallback_ep.as_ref().unwrap_or(&ep), f)),
            self.timeout,
        )
        .await
        .map_err(|e| Attempt::Lost(e.to_string()))?;
        summary.marks.connected_s = Some(self.clock.now());
        let conn = connected.conn;
        let addr = conn.remote_address();
        if let Some(error) = connected.fell_back {
            summary.over = Over::Management;
            self.note(
                summary,
                FallbackRoute {
                    from: self.me.clone(),
                    to: self.dest.label().to_string(),
                    data,
                    error,
                },
            );
        }
        let lost = |e: &dyn std::fmt::Display| match conn.close_reason() {
            Some(reason) => quic::describe(addr, &reason),
            None => format!("{addr}: {e:#}"),
        };
        let lost_now = |e: &dyn std::fmt::Display| Attempt::Lost(lost(e));
        if !self.set_live(true) {
            // It answers again: back into the graph, with fresh peers.
            self.coordinator.rejoined(self.id);
            self.swarm = fed_by_source(self.coordinator.swarm_for(self.id));
            // Rewiring meant for the lost connection is stale.
            while self.outbox.lock().await.try_recv().is_ok() {}
        }
        let (mut send, mut recv) = quic::open_service(&conn, Service::Transfer)
            .await
            .map_err(|e| Attempt::Lost(e.to_string()))?;
        let wrote = match write_frame(&mut send, self.offer.as_ref()).await {
            Ok(()) => write_frame(&mut send, &self.swarm).await,
            Err(e) => Err(e),
        };
        if let Err(e) = wrote {
            // A node that refuses the offer stops reading it at once and
            // says why on the reply stream: a large manifest still being
            // written then fails with "stopped by peer". Its reason, not
            // the write's, is the answer.
            return Err(refusal_after_stop(&mut recv, addr, summary)
                .await
                .unwrap_or_else(|| lost_now(&e)));
        }
        // From here on only the rewiring (and a draft's events) is
        // written, by its own task.
        let _writer = AbortOnDrop(tokio::spawn(write_control(
            send,
            self.outbox.clone(),
            self.events.clone(),
        )));
        let key = match read_frame::<TransferMsg>(&mut recv)
            .await
            .map_err(|e| lost_now(&e))?
        {
            TransferMsg::Accepted {
                held_bytes,
                lane_key,
                ..
            } => {
                summary.bytes_skipped = held_bytes;
                summary.marks.accepted_s = Some(self.clock.now());
                // Rate and ETA count only what this run moves.
                self.bar.resume_at(held_bytes);
                lane_key
            }
            TransferMsg::Failed(r) => {
                let why = format!("{addr}: {r}");
                summary.refusal = Some(r);
                return Err(Attempt::Refused(why));
            }
            other => {
                return Err(Attempt::Refused(format!(
                    "{addr}: protocol error: unexpected {}",
                    other.kind()
                )))
            }
        };
        let per_conn: Arc<Mutex<Vec<Arc<AtomicU64>>>> = Arc::default();
        let serving = AbortOnDrop(tokio::spawn(serve(
            conn.clone(),
            self.serving(sent, rdma_sent, &per_conn),
        )));
        let done = CancellationToken::new();
        let reprobe = (summary.over == Over::Management).then_some(data);
        let fabric_back: Mutex<Option<Instant>> = Mutex::new(None);
        let started = Instant::now();
        let lanes = self.extra_lanes(
            addr,
            key,
            reprobe,
            &fabric_back,
            sent.clone(),
            rdma_sent.clone(),
            per_conn.clone(),
            done.clone(),
        );
        let progress = async {
            let result = self.follow(&mut recv, addr, &lost, summary).await;
            done.cancel();
            result
        };
        let (result, ()) = tokio::join!(progress, lanes);
        tracing::debug!("{addr}: {:?}", conn.stats().path);
        drop(fallback_ep);
        drop(serving);
        if let Some(at) = *fabric_back.lock().unwrap() {
            summary.notes.push(format!(
                "{} -> {}: the data address {data} answered again after {:.1}s; a second connection over it shared the rest",
                self.me,
                self.dest.label(),
                at.duration_since(started).as_secs_f64()
            ));
        }
        summary.bytes_per_connection = per_conn
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        quic::close_done(ep, &conn).await;
        summary.marks.closed_s = Some(self.clock.now());
        result
    }

    /// Reads the agent's reports on `recv` until it is done or fails.
    async fn follow(
        &self,
        recv: &mut quinn::RecvStream,
        addr: SocketAddr,
        lost: &(dyn Fn(&dyn std::fmt::Display) -> String + Sync),
        summary: &mut NodeSummary,
    ) -> Result<(), Attempt> {
        loop {
            match read_frame::<TransferMsg>(recv).await.map_err(|e| lost(&e)) {
                Ok(TransferMsg::Progress {
                    held_bytes,
                    from_source,
                    from_peers,
                    links: _,
                    max_links,
                }) => {
                    self.bar.set_position(held_bytes);
                    if held_bytes > summary.bytes_skipped && summary.first_chunk_at.is_none() {
                        summary.first_chunk_at = Some(Instant::now());
                    }
                    summary.from_source = from_source;
                    summary.from_peers = from_peers;
                    summary.max_peer_links = summary.max_peer_links.max(max_links);
                }
                Ok(TransferMsg::Slow { peer }) => self.coordinator.slow(self.id, peer),
                Ok(TransferMsg::Unreachable { peer }) => {
                    self.coordinator.unreachable(self.id, peer)
                }
                Ok(TransferMsg::PeerDropped { peer, reason }) => {
                    tracing::warn!("{addr} dropped peer {peer}: {reason}");
                    summary.dropped_peers.push(format!("{peer}: {reason}"));
                    self.coordinator.dropped(self.id, peer);
                }
                Ok(TransferMsg::Fallback(route)) => self.note(summary, route),
                Ok(TransferMsg::Done {
                    root,
                    corrupt_chunks,
                    ..
                }) => {
                    summary.root = Some(root);
                    summary.corrupt_chunks = corrupt_chunks;
                    summary.done_at = Some(Instant::now());
                    break Ok(());
                }
                Ok(TransferMsg::Failed(r)) => {
                    let why = format!("{addr}: {r}");
                    summary.refusal = Some(r);
                    break Err(Attempt::Refused(why));
                }
                Ok(other) => {
                    break Err(Attempt::Refused(format!(
                        "{addr}: protocol error: unexpected {}",
                        other.kind()
                    )))
                }
                Err(e) => break Err(Attempt::Lost(e)),
            }
        }
    }
}

/// After a write to the node failed: the node's refusal, if it sent one
/// before it stopped reading (bounded, so a node that neither answers nor
/// closes cannot hold the push).
async fn refusal_after_stop(
    recv: &mut quinn::RecvStream,
    addr: SocketAddr,
    summary: &mut NodeSummary,
) -> Option<Attempt> {
    let reply = tokio::time::timeout(Duration::from_secs(5), read_frame::<TransferMsg>(recv)).await;
    match reply {
        Ok(Ok(TransferMsg::Failed(r))) => {
            let why = format!("{addr}: {r}");
            summary.refusal = Some(r);
            Some(Attempt::Refused(why))
        }
        _ => None,
    }
}

#[cfg(test)]
mod swarm_groups {
    use super::*;

    fn peer(addr: &str) -> SwarmPeer {
        SwarmPeer {
            id: 0,
            label: addr.into(),
            addr: addr.parse().unwrap(),
            fallback: None,
        }
    }

    #[test]
    fn a_receiver_on_the_pushers_own_host_gets_a_swarm_of_its_own() {
        // An address no interface of this host holds (a test asserts it).
        let away = |last: u8| {
            let a = format!("203.0.113.{last}:7470");
            assert!(!crate::sysinfo::net::is_own_address(
                a.parse::<SocketAddr>().unwrap().ip()
            ));
            peer(&a)
        };
        let mixed = [away(1), peer("127.0.0.1:7470"), away(2)];
        assert_eq!(swarms(&mixed), vec![vec![1], vec![0, 2]]);
        // All here (agents on loopback) or none: one swarm, as ever.
        let here = [peer("127.0.0.1:7470"), peer("127.0.0.2:7470")];
        assert_eq!(swarms(&here), vec![vec![0, 1]]);
        assert_eq!(swarms(&[away(1), away(2)]), vec![vec![0, 1]]);
    }
}
