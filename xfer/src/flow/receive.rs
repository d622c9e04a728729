//! Drives one incoming transfer: the scheduler decides, fetchers fetch, the
//! store verifies and writes.
//!
//! This is the glue between the sans-IO [`Scheduler`] and the I/O: it turns
//! `Fetch` actions into fetch tasks on a [`ChunkFetcher`], feeds their results
//! back as events, checkpoints the journal on a timer, and finishes the
//! [`Transfer`] when the scheduler reports completion. It knows nothing about
//! QUIC, so an RDMA fetcher plugs in unchanged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::util::lograte::{LogBudget, Verdict};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::engine::policy::SlowPeerDetector;
use crate::engine::scheduler::{
    self, Action, DropReason, Event, Homes, PeerId, Scheduler, StuckReason,
};
use crate::store::{ChunkError, DraftChange, Transfer, Written};
use crate::transport::{ChunkFetcher, FetchError};
use xfer_proto::chunkset::ChunkSet;
use xfer_proto::draft::DraftEvent;
use xfer_proto::hash::Hash;
use xfer_proto::refusal::Refusal;
use xfer_proto::transfer::FallbackRoute;

/// How often written chunks are made durable against power loss.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// What a finished transfer reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The tree's root.
    pub root: Hash,
    /// Chunk bytes that arrived and passed their check.
    pub received_bytes: u64,
    /// Chunks that failed their check and were fetched again.
    pub corrupt_chunks: u64,
}

/// The peer id of the source: bytes from it count as `from_source`.
pub const SOURCE: PeerId = 0;

/// A change in the swarm, reported by the runtime's peer links while the
/// transfer runs.
pub enum PeerUpdate<F> {
    /// A peer link is up; the peer holds `has`.
    Joined {
        /// The peer.
        peer: PeerId,
        /// What fetches from it.
        fetcher: F,
        /// The chunks it holds.
        has: ChunkSet,
    },
    /// The peer verified more chunks.
    Has {
        /// The peer.
        peer: PeerId,
        /// The chunks' numbers.
        chunks: Vec<u64>,
    },
    /// The link broke.
    Gone {
        /// The peer.
        peer: PeerId,
        /// Why the link broke.
        why: String,
    },
    /// The swarm's coordinator (the source) assigned the chunks this node
    /// fetches from the source (none: it fetches from peers only).
    Homes(Homes),
    /// The source's control connection is gone: no rewiring will come.
    CoordinatorLost,
    /// What the source's download learnt (a draft's transfer only), and
    /// its share of the queue's budget, given back once it is applied.
    Draft(DraftEvent, Queued),
}

/// A queued event's share of a bounded budget (bytes of draft events not
/// yet applied): the reader of the source's stream waits for a share
/// before it reads on, so a source that floods events is slowed to the
/// pace they are applied at, and memory stays bounded.
#[derive(Debug, Default)]
pub struct Queued {
    /// Released on drop.
    _share: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Queued {
    /// A share held until the event is applied.
    pub fn new(share: tokio::sync::OwnedSemaphorePermit) -> Queued {
        Queued {
            _share: Some(share),
        }
    }
}

/// Counters a running transfer keeps for whoever reports on it.
#[derive(Debug, Default)]
pub struct Tally {
    /// Verified bytes that came from [`SOURCE`].
    pub from_source: AtomicU64,
    /// Verified bytes that came from other peers.
    pub from_peers: AtomicU64,
    /// Told once, when the first fetched chunk is verified (the reporter
    /// tells the source at once, for its `first_byte_s`).
    pub first_chunk: tokio::sync::Notify,
    /// Peers dropped, with why; drained by the reporter.
    dropped: Mutex<Vec<(PeerId, String)>>,
    /// Peers found slow; drained by the reporter (the source rewires).
    slow: Mutex<Vec<PeerId>>,
    /// Peers no link could be made to; drained by the reporter. Each link
    /// reports its peer once, so this holds at most one entry per peer.
    unreachable: Mutex<Vec<PeerId>>,
    /// This node's links to peers that go over management, in the order
    /// they were made (at most one per peer and [`MAX_FALLBACKS`]).
    fallbacks: Mutex<Vec<FallbackRoute>>,
    links: Mutex<LinkSet>,
    /// Told when the source links or unlinks a peer.
    told_changed: tokio::sync::Notify,
}

/// The peers a node is linked with, either way, and the most at once.
#[derive(Debug, Default)]
struct LinkSet {
    /// Peers the source linked this node with (and not unlinked since):
    /// only these may fetch from it, so with the source's degree bound no
    /// node ever holds more than `K` links.
    told: std::collections::HashSet<PeerId>,
    /// Peers this node fetches from.
    out: std::collections::HashSet<PeerId>,
    /// Peers fetching from this node, with how many links each.
    inc: HashMap<PeerId, u32>,
    max: u32,
}

impl LinkSet {
    fn now(&self) -> u32 {
        let extra = self.inc.keys().filter(|p| !self.out.contains(p)).count();
        (self.out.len() + extra) as u32
    }
}

/// Fallbacks a tally keeps: a swarm of thousands cannot grow it unbounded.
pub const MAX_FALLBACKS: usize = 64;

impl Tally {
    /// Records a link that goes over management; false if already known.
    pub fn fell_back(&self, route: FallbackRoute) -> bool {
        let mut all = self.fallbacks.lock().unwrap();
        if all.len() >= MAX_FALLBACKS || all.iter().any(|r| r.to == route.to) {
            return false;
        }
        all.push(route);
        true
    }

    /// A link with `peer` is up: one this node fetches over (`incoming`
    /// false), or one `peer` fetches from this node over.
    pub fn link_up(&self, peer: PeerId, incoming: bool) {
        let mut l = self.links.lock().unwrap();
        if incoming {
            *l.inc.entry(peer).or_default() += 1;
        } else {
            l.out.insert(peer);
        }
        l.max = l.max.max(l.now());
    }

    /// That link is down.
    pub fn link_down(&self, peer: PeerId, incoming: bool) {
        let mut l = self.links.lock().unwrap();
        if !incoming {
            l.out.remove(&peer);
        } else if let Some(n) = l.inc.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                l.inc.remove(&peer);
            }
        }
    }

    /// The source linked this node with `peer` (`linked`), or unlinked it.
    pub fn told(&self, peer: PeerId, linked: bool) {
        {
            let mut l = self.links.lock().unwrap();
            if linked {
                l.told.insert(peer);
            } else {
                // The link ends now, both ways: its tasks see the same
                // word and stop, but a link the source makes in the same
                // rewiring may come up before they have (measured: 9
                // links at K = 8 at N = 24 with churn). Their
                // `link_down`s are then no-ops.
                l.told.remove(&peer);
                l.out.remove(&peer);
                l.inc.remove(&peer);
            }
        }
        self.told_changed.notify_waiters();
    }

    /// Waits until `peer` is linked with this node (`linked`) or not, up
    /// to `within` (`None`: for as long as it takes); whether it is.
    pub async fn wait_told(&self, peer: PeerId, linked: bool, within: Option<Duration>) -> bool {
        let deadline = within.map(|w| tokio::time::Instant::now() + w);
        loop {
            let changed = self.told_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.links.lock().unwrap().told.contains(&peer) == linked {
                return true;
            }
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, changed).await.is_err() {
                        return false;
                    }
                }
                None => changed.await,
            }
        }
    }

    /// Peers linked now either way, and the most at once so far.
    pub fn links(&self) -> (u32, u32) {
        let l = self.links.lock().unwrap();
        (l.now(), l.max)
    }

    /// The fallbacks from the `skip`th on.
    pub fn fallbacks_from(&self, skip: usize) -> Vec<FallbackRoute> {
        self.fallbacks
            .lock()
            .unwrap()
            .iter()
            .skip(skip)
            .cloned()
            .collect()
    }

    /// No link to `peer` could be made at all: reported to the source
    /// (it serves this node what only that peer holds, and rewires).
    pub fn unreachable(&self, peer: PeerId) {
        self.unreachable.lock().unwrap().push(peer);
    }

    /// Peers found unreachable since the last call.
    pub fn take_unreachable(&self) -> Vec<PeerId> {
        std::mem::take(&mut self.unreachable.lock().unwrap())
    }

    /// Peers found slow since the last call.
    pub fn take_slow(&self) -> Vec<PeerId> {
        std::mem::take(&mut self.slow.lock().unwrap())
    }

    /// Peers dropped since the last call.
    pub fn take_dropped(&self) -> Vec<(PeerId, String)> {
        std::mem::take(&mut self.dropped.lock().unwrap())
    }
}

/// How a transfer is wired into a swarm. [`Links::none`] for a transfer
/// from fixed peers only.
pub struct Links<F> {
    /// Peers joining, announcing and leaving after the start.
    pub updates: Option<mpsc::UnboundedReceiver<PeerUpdate<F>>>,
    /// Told each chunk number as soon as it is verified and stored, for
    /// announcing to peers.
    pub verified: Option<broadcast::Sender<u64>>,
    /// Counters for whoever reports on the transfer.
    pub tally: Arc<Tally>,
    /// The chunks the coordinator made this node home to, before any peer
    /// joins; `None`: homes from the roster (a swarm without one).
    pub homes: Option<Homes>,
}

impl<F> Links<F> {
    /// No swarm: fixed peers only.
    pub fn none() -> Self {
        Links {
            updates: None,
            verified: None,
            tally: Arc::default(),
            homes: None,
        }
    }
}

enum Outcome {
    /// Stored, with its length; 0 if another copy got there first.
    Stored(u64),
    Corrupt,
    /// A draft's chunk whose hash is not announced (its file was withdrawn
    /// while it was fetched): asked for again once it is.
    Unannounced,
    Fetch(FetchError),
    Refused(Refusal),
}

type Report = (PeerId, u64, Outcome, Duration);

/// Receives every missing chunk of `transfer` from `peers` (partial peers
/// first, then seeds: the scheduler's home partition is built from the
/// partial peers known when the first seed joins) and from peers that join
/// through `links`, then places the tree. Stops early with a [`Refusal`] on
/// disk errors, repeated corruption, loss of every source, or cancellation.
/// When it returns, no fetch task of this transfer is left running.
pub async fn receive<F: ChunkFetcher>(
    transfer: Arc<Transfer>,
    peers: Vec<(PeerId, F, ChunkSet)>,
    links: Links<F>,
    cfg: scheduler::Config,
    cancel: CancellationToken,
) -> Result<Received, Refusal> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut driver = Driver {
        updates: links.updates,
        verified: links.verified,
        tally: links.tally,
        speed: SlowPeerDetector::default(),
        sched: Scheduler::new(transfer.held(), cfg),
        transfer,
        fetchers: HashMap::new(),
        tasks: JoinSet::new(),
        running: HashMap::new(),
        tx,
        rx,
        corrupt_chunks: 0,
        last_loss: String::new(),
        dropped_corrupt: None,
        hashed: None,
        warnings: HashMap::new(),
        pending: Vec::new(),
        waiting_for_seal: false,
        told_complete: false,
    };
    if driver.transfer.is_draft() {
        driver.hashed = Some(ChunkSet::empty(driver.transfer.map().len()));
    }
    if let Some(homes) = links.homes {
        driver.sched.handle(Event::Homes(homes));
    }
    for (id, f, has) in peers {
        driver.fetchers.insert(id, f);
        let has = driver.announced(id, has);
        driver.sched.handle(Event::PeerJoined { peer: id, has });
    }
    let result = driver.run(cancel).await;
    // A superseding transfer of the same model must find this one closed.
    driver.tasks.shutdown().await;
    if result.is_err() {
        let _ = driver.transfer.commit();
    }
    result
}

struct Driver<F> {
    updates: Option<mpsc::UnboundedReceiver<PeerUpdate<F>>>,
    verified: Option<broadcast::Sender<u64>>,
    tally: Arc<Tally>,
    speed: SlowPeerDetector,
    transfer: Arc<Transfer>,
    sched: Scheduler,
    fetchers: HashMap<PeerId, F>,
    tasks: JoinSet<()>,
    /// Fetches in flight, to stop on `Cancel`.
    running: HashMap<(PeerId, u64), CancellationToken>,
    tx: mpsc::UnboundedSender<Report>,
    rx: mpsc::UnboundedReceiver<Report>,
    corrupt_chunks: u64,
    last_loss: String,
    /// Strikes of the last peer dropped for serving corrupt chunks.
    dropped_corrupt: Option<u32>,
    /// A draft's chunks whose hashes are announced (the source has them);
    /// `None` for a manifest's transfer, where every chunk's is known.
    hashed: Option<ChunkSet>,
    /// Per peer, the budget of its failure warnings: a peer that fails
    /// every request cannot flood the log.
    warnings: HashMap<PeerId, LogBudget>,
    /// Peers' announcements of chunks whose hashes this node has not heard
    /// yet (the source's events may trail a fast peer's): held back until
    /// it has, so every chunk asked for can be checked.
    pending: Vec<(PeerId, u64)>,
    /// Every chunk is held but the draft is not sealed yet.
    waiting_for_seal: bool,
    /// The scheduler was told the growing source has every chunk.
    told_complete: bool,
}

impl<F: ChunkFetcher> Driver<F> {
    async fn run(&mut self, cancel: CancellationToken) -> Result<Received, Refusal> {
        let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
        loop {
            while let Some(action) = self.sched.poll_action() {
                if let Some(done) = self.act(action).await {
                    return done;
                }
            }
            tokio::select! {
                Some((peer, chunk, outcome, took)) = self.rx.recv() => self.report(peer, chunk, outcome, took)?,
                Some(update) = next_update(&mut self.updates) => {
                    if let PeerUpdate::Draft(ev, share) = update {
                        let done = self.draft_event(ev).await;
                        drop(share);
                        if let Some(done) = done {
                            return done;
                        }
                    } else {
                        self.update(update);
                    }
                }
                _ = tick.tick() => {
                    tracing::debug!(
                        "{}: {} of {} chunks held, {} in flight, {} MiB from the source, {} MiB from peers",
                        self.transfer.name(),
                        self.sched.held().count(),
                        self.sched.held().capacity(),
                        self.sched.in_flight(),
                        self.tally.from_source.load(Ordering::Relaxed) >> 20,
                        self.tally.from_peers.load(Ordering::Relaxed) >> 20,
                    );
                    let t = self.transfer.clone();
                    if let Ok(Err(r)) = tokio::task::spawn_blocking(move || t.commit()).await {
                        return Err(r.into());
                    }
                }
                _ = cancel.cancelled() => return Err(Refusal::Superseded),
            }
        }
    }

    /// Carries out one scheduler action; `Some` ends the transfer.
    async fn act(&mut self, action: Action) -> Option<Result<Received, Refusal>> {
        match action {
            Action::Fetch { peer, chunk } => match self.fetchers.get(&peer).cloned() {
                Some(fetcher) => self.spawn_fetch(fetcher, peer, chunk),
                None => self.sched.handle(Event::PeerGone { peer }),
            },
            // Another copy arrived first: abort this fetch, which stops the
            // stream so the peer stops sending. A fetch that completed just
            // before reports a chunk already held, which is ignored.
            Action::Cancel { peer, chunk } => {
                if let Some(stop) = self.running.remove(&(peer, chunk)) {
                    stop.cancel();
                }
            }
            Action::DropPeer { peer, reason } => {
                let DropReason::Corrupt { strikes } = reason;
                let why = format!("it served {strikes} chunk(s) that failed their BLAKE3 check");
                tracing::warn!("dropping peer {peer} from this transfer: {why}");
                if peer == SOURCE {
                    self.dropped_corrupt = Some(strikes);
                }
                self.tally.dropped.lock().unwrap().push((peer, why));
                self.fetchers.remove(&peer);
                // Its other answers in flight are not wanted either.
                self.running.retain(|&(p, _), stop| {
                    if p == peer {
                        stop.cancel();
                    }
                    p != peer
                });
            }
            Action::Complete => {
                // A draft's files may still be waiting for their seals.
                if !self.transfer.is_sealed() {
                    self.waiting_for_seal = true;
                    return None;
                }
                return Some(self.complete().await);
            }
            Action::Stuck(StuckReason::ChunkKeepsFailing { chunk, failures }) => {
                let id = self.transfer.map().id(chunk);
                return Some(Err(Refusal::Corrupt {
                    file: id.file,
                    index: id.index,
                    times: failures,
                }));
            }
            Action::Stuck(StuckReason::NoSource { missing }) => {
                return Some(Err(match self.dropped_corrupt {
                    Some(strikes) => Refusal::CorruptSource { strikes },
                    None => Refusal::SourceLost(format!(
                        "{missing} chunks still missing and no connected peer has them ({})",
                        self.last_loss
                    )),
                }));
            }
        }
        None
    }

    /// Every chunk is held (and a draft sealed): lets the copies still
    /// being written land, and places what is left.
    async fn complete(&mut self) -> Result<Received, Refusal> {
        // Let copies still being written land, and count them, so
        // the tally is exact and nothing writes after `finish`.
        for (_, stop) in self.running.drain() {
            stop.cancel();
        }
        while self.tasks.join_next().await.is_some() {}
        while let Ok((peer, _, outcome, _)) = self.rx.try_recv() {
            if let Outcome::Stored(n) = outcome {
                self.count(peer, n);
            }
        }
        let t = self.transfer.clone();
        let finished = tokio::task::spawn_blocking(move || t.finish()).await;
        let root = match finished {
            Ok(r) => r.map_err(Refusal::from),
            Err(e) => Err(Refusal::Io {
                path: self.transfer.name().to_string(),
                message: format!("finishing panicked: {e}"),
            }),
        };
        root.map(|root| Received {
            root,
            received_bytes: self.tally.from_source.load(Ordering::Relaxed)
                + self.tally.from_peers.load(Ordering::Relaxed),
            corrupt_chunks: self.corrupt_chunks,
        })
    }

    fn spawn_fetch(&mut self, fetcher: F, peer: PeerId, chunk: u64) {
        let (t, tx) = (self.transfer.clone(), self.tx.clone());
        let stop = CancellationToken::new();
        self.running.insert((peer, chunk), stop.clone());
        self.tasks.spawn(async move {
            let started = Instant::now();
            let id = t.map().id(chunk);
            let len = t.map().chunk_len(id) as usize;
            // Only the network part is cancelled (dropping the stream tells
            // the peer to stop sending); a write that started completes and
            // reports, so every stored byte is counted once.
            let fetched = tokio::select! {
                r = fetcher.fetch(id, len) => r,
                _ = stop.cancelled() => return,
            };
            let outcome = match fetched {
                Err(e) => Outcome::Fetch(e),
                Ok(bytes) => {
                    let t2 = t.clone();
                    match tokio::task::spawn_blocking(move || t2.write_chunk(id, &bytes)).await {
                        Ok(Ok(Written::Duplicate)) => Outcome::Stored(0),
                        Ok(Ok(_)) => Outcome::Stored(len as u64),
                        Ok(Err(ChunkError::Corrupt(_))) => Outcome::Corrupt,
                        Ok(Err(ChunkError::Unannounced(_))) => Outcome::Unannounced,
                        Ok(Err(ChunkError::Refused(r))) => Outcome::Refused(r.into()),
                        Err(e) => Outcome::Refused(Refusal::Io {
                            path: t.name().to_string(),
                            message: format!("writer panicked: {e}"),
                        }),
                    }
                }
            };
            let _ = tx.send((peer, chunk, outcome, started.elapsed()));
        });
    }

    /// Feeds a fetch result back to the scheduler.
    fn report(
        &mut self,
        peer: PeerId,
        chunk: u64,
        outcome: Outcome,
        took: Duration,
    ) -> Result<(), Refusal> {
        self.running.remove(&(peer, chunk));
        // Reap finished tasks, so the set stays as small as what is in flight.
        while self.tasks.try_join_next().is_some() {}
        match outcome {
            Outcome::Stored(n) => {
                self.count(peer, n);
                if n > 0 {
                    let label = if peer == SOURCE {
                        "source".to_string()
                    } else {
                        format!("peer{peer}")
                    };
                    crate::util::metrics::verified(&label, n);
                }
                if n > 0 {
                    if let Some(v) = &self.verified {
                        let _ = v.send(chunk);
                    }
                    if peer != SOURCE && self.speed.record(peer, n, took) {
                        tracing::info!(
                            "peer {peer} serves far slower than the others; preferring them"
                        );
                        self.sched.handle(Event::PeerSlow { peer });
                        self.tally.slow.lock().unwrap().push(peer);
                    }
                }
                self.sched.handle(Event::Verified { peer, chunk });
            }
            Outcome::Corrupt => {
                self.corrupt_chunks += 1;
                crate::util::metrics::failed();
                let id = self.transfer.map().id(chunk);
                self.warn(peer, || {
                    format!(
                        "chunk {}/{} from peer {peer} failed its BLAKE3 check; fetching it again",
                        id.file, id.index
                    )
                });
                self.sched.handle(Event::Corrupt { peer, chunk });
            }
            Outcome::Unannounced => self.sched.handle(Event::FetchFailed { peer, chunk }),
            Outcome::Fetch(FetchError::Connection(why)) => {
                self.last_loss = why;
                self.fetchers.remove(&peer);
                self.sched.handle(Event::PeerGone { peer });
            }
            Outcome::Fetch(e) => {
                self.warn(peer, || format!("fetch from peer {peer} failed: {e}"));
                let lacks = matches!(e, FetchError::Unavailable(..));
                self.sched.handle(if lacks {
                    Event::PeerLacks { peer, chunk }
                } else {
                    Event::FetchFailed { peer, chunk }
                });
            }
            Outcome::Refused(r) => return Err(r),
        }
        Ok(())
    }
}

impl<F: ChunkFetcher> Driver<F> {
    /// Logs a warning about `peer` within its budget: a few lines every
    /// ten seconds, then one line counting those not shown.
    fn warn(&mut self, peer: PeerId, line: impl FnOnce() -> String) {
        let budget = self
            .warnings
            .entry(peer)
            .or_insert_with(|| LogBudget::new(5, Duration::from_secs(10)));
        if let Verdict::Log { hidden } = budget.admit(std::time::Instant::now()) {
            if hidden > 0 {
                tracing::warn!(
                    "{hidden} more failures from peer {peer} in the last {} s (not logged one by one)",
                    budget.window().as_secs()
                );
            }
            tracing::warn!("{}", line());
        }
    }

    /// Counts `n` stored bytes that came from `peer`.
    fn count(&mut self, peer: PeerId, n: u64) {
        let counter = if peer == SOURCE {
            &self.tally.from_source
        } else {
            &self.tally.from_peers
        };
        let before = counter.fetch_add(n, Ordering::Relaxed);
        let other = if peer == SOURCE {
            &self.tally.from_peers
        } else {
            &self.tally.from_source
        };
        if n > 0 && before == 0 && other.load(Ordering::Relaxed) == 0 {
            self.tally.first_chunk.notify_one();
        }
    }

    /// Feeds a change in the swarm to the scheduler.
    fn update(&mut self, update: PeerUpdate<F>) {
        match update {
            PeerUpdate::Joined { peer, fetcher, has } => {
                self.fetchers.insert(peer, fetcher);
                let has = self.announced(peer, has);
                self.sched.handle(Event::PeerJoined { peer, has });
            }
            PeerUpdate::Has { peer, chunks } => {
                for chunk in chunks {
                    if self.hashed.as_ref().is_none_or(|h| h.contains(chunk)) {
                        self.sched.handle(Event::PeerHas { peer, chunk });
                    } else if self.pending.len() < PENDING_MAX {
                        self.pending.push((peer, chunk));
                    }
                }
            }
            PeerUpdate::Gone { peer, why } => {
                tracing::info!("peer {peer} left: {why}");
                if self.fetchers.remove(&peer).is_some() {
                    self.sched.handle(Event::PeerGone { peer });
                }
            }
            PeerUpdate::Homes(homes) => self.sched.handle(Event::Homes(homes)),
            PeerUpdate::CoordinatorLost => self.sched.handle(Event::CoordinatorLost),
            PeerUpdate::Draft(..) => unreachable!("draft events are applied in `draft_event`"),
        }
    }

    /// Of what `peer` holds, what the scheduler may know of: for a draft,
    /// the chunks whose hashes are announced; a peer's others wait in
    /// `pending` (the source announces its own as it hashes them).
    fn announced(&mut self, peer: PeerId, has: ChunkSet) -> ChunkSet {
        let Some(hashed) = &self.hashed else {
            return has;
        };
        let mut known = ChunkSet::empty(has.capacity());
        for c in has.iter() {
            if hashed.contains(c) {
                known.insert(c);
            } else if peer != SOURCE && self.pending.len() < PENDING_MAX {
                self.pending.push((peer, c));
            }
        }
        known
    }

    /// Applies one event of the source's draft to the store, then tells
    /// the scheduler what changed; `Some` ends the transfer.
    async fn draft_event(&mut self, ev: DraftEvent) -> Option<Result<Received, Refusal>> {
        let t = self.transfer.clone();
        let changes = match tokio::task::spawn_blocking(move || t.apply_draft(&ev)).await {
            Ok(Ok(c)) => c,
            Ok(Err(ChunkError::Refused(r))) => return Some(Err(r.into())),
            Ok(Err(e)) => return Some(Err(Refusal::Protocol(e.to_string()))),
            Err(e) => {
                return Some(Err(Refusal::Io {
                    path: self.transfer.name().to_string(),
                    message: format!("applying the draft panicked: {e}"),
                }))
            }
        };
        for change in changes {
            match change {
                DraftChange::Hashed { chunks, adopted } => {
                    for &chunk in &adopted {
                        self.sched.handle(Event::Verified {
                            peer: SOURCE,
                            chunk,
                        });
                        if let Some(v) = &self.verified {
                            let _ = v.send(chunk);
                        }
                    }
                    if let Some(h) = &mut self.hashed {
                        for c in chunks.clone() {
                            h.insert(c);
                        }
                    }
                    for chunk in chunks.clone() {
                        self.sched.handle(Event::PeerHas {
                            peer: SOURCE,
                            chunk,
                        });
                    }
                    let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
                        .into_iter()
                        .partition(|(_, c)| chunks.contains(c));
                    self.pending = later;
                    for (peer, chunk) in now {
                        self.sched.handle(Event::PeerHas { peer, chunk });
                    }
                }
                DraftChange::Dropped(chunks) => {
                    if let Some(h) = &mut self.hashed {
                        for c in chunks.clone() {
                            h.remove(c);
                        }
                    }
                    self.pending.retain(|(_, c)| !chunks.contains(c));
                    self.waiting_for_seal = false;
                    self.sched.handle(Event::Withdrawn {
                        first: chunks.start,
                        end: chunks.end,
                    });
                }
                DraftChange::Sealed(_) | DraftChange::Stale => {}
            }
        }
        if self.transfer.is_sealed() {
            if !self.told_complete {
                self.told_complete = true;
                self.sched.handle(Event::SourceComplete);
            }
            if self.waiting_for_seal {
                return Some(self.complete().await);
            }
        }
        None
    }
}

/// Announcements a receiver holds back at most (a peer cannot grow it
/// without bound; one dropped only delays that chunk to the source's).
const PENDING_MAX: usize = 1 << 20;

/// The next swarm update, or never if there is no swarm.
async fn next_update<F>(
    updates: &mut Option<mpsc::UnboundedReceiver<PeerUpdate<F>>>,
) -> Option<PeerUpdate<F>> {
    match updates {
        Some(rx) => match rx.recv().await {
            Some(u) => Some(u),
            None => {
                *updates = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}
