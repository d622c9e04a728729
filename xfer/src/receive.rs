//! Drives one incoming transfer: the scheduler decides, fetchers fetch, the
//! store verifies and writes.
//!
//! This is the glue between the sans-IO [`Scheduler`] and the I/O: it turns
//! `Fetch` actions into fetch tasks on a [`ChunkFetcher`], feeds their results
//! back as events, checkpoints the journal on a timer, and finishes the
//! [`Transfer`] when the scheduler reports completion. It knows nothing about
//! QUIC, so an RDMA fetcher plugs in unchanged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::chunkset::ChunkSet;
use crate::hash::Hash;
use crate::scheduler::{self, Action, DropReason, Event, PeerId, Scheduler, StuckReason};
use crate::store::{ChunkError, Transfer};
use crate::transport::{ChunkFetcher, FetchError};
use crate::wire::Refusal;

/// How often written chunks are made durable against power loss.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

/// What a finished transfer reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub root: Hash,
    /// Chunk bytes that arrived and passed their check.
    pub received_bytes: u64,
    /// Chunks that failed their check and were fetched again.
    pub corrupt_chunks: u64,
}

enum Outcome {
    Stored(u64),
    Corrupt,
    Fetch(FetchError),
    Refused(Refusal),
}

type Report = (PeerId, u64, Outcome);

/// Receives every missing chunk of `transfer` from `peers`, then places the
/// tree. Stops early with a [`Refusal`] on disk errors, repeated corruption,
/// loss of every source, or cancellation. When it returns, no fetch task of
/// this transfer is left running.
pub async fn receive<F: ChunkFetcher>(
    transfer: Arc<Transfer>,
    peers: Vec<(PeerId, F, ChunkSet)>,
    cfg: scheduler::Config,
    cancel: CancellationToken,
) -> Result<Received, Refusal> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut driver = Driver {
        sched: Scheduler::new(transfer.held(), cfg),
        transfer,
        fetchers: HashMap::new(),
        tasks: JoinSet::new(),
        tx,
        rx,
        received_bytes: 0,
        corrupt_chunks: 0,
        last_loss: String::new(),
        dropped_corrupt: None,
    };
    for (id, f, has) in peers {
        driver.fetchers.insert(id, f);
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
    transfer: Arc<Transfer>,
    sched: Scheduler,
    fetchers: HashMap<PeerId, F>,
    tasks: JoinSet<()>,
    tx: mpsc::UnboundedSender<Report>,
    rx: mpsc::UnboundedReceiver<Report>,
    received_bytes: u64,
    corrupt_chunks: u64,
    last_loss: String,
    /// Strikes of the last peer dropped for serving corrupt chunks.
    dropped_corrupt: Option<u32>,
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
                Some((peer, chunk, outcome)) = self.rx.recv() => self.report(peer, chunk, outcome)?,
                _ = tick.tick() => {
                    let t = self.transfer.clone();
                    if let Ok(Err(r)) = tokio::task::spawn_blocking(move || t.commit()).await {
                        return Err(r);
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
            // Endgame duplicates only arise with several holders; a fetch
            // that still completes reports a chunk already held, which the
            // scheduler ignores.
            Action::Cancel { .. } => {}
            Action::DropPeer { peer, reason } => {
                let DropReason::Corrupt { strikes } = reason;
                tracing::warn!("dropping peer {peer}: it served {strikes} chunks that failed their BLAKE3 check");
                self.dropped_corrupt = Some(strikes);
                self.fetchers.remove(&peer);
            }
            Action::Complete => {
                let t = self.transfer.clone();
                let finished = tokio::task::spawn_blocking(move || t.finish()).await;
                let root = match finished {
                    Ok(r) => r,
                    Err(e) => Err(Refusal::Io {
                        path: self.transfer.name().to_string(),
                        message: format!("finishing panicked: {e}"),
                    }),
                };
                return Some(root.map(|root| Received {
                    root,
                    received_bytes: self.received_bytes,
                    corrupt_chunks: self.corrupt_chunks,
                }));
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

    fn spawn_fetch(&mut self, fetcher: F, peer: PeerId, chunk: u64) {
        let (t, tx) = (self.transfer.clone(), self.tx.clone());
        self.tasks.spawn(async move {
            let id = t.map().id(chunk);
            let len = t.map().chunk_len(id) as usize;
            let outcome = match fetcher.fetch(id, len).await {
                Err(e) => Outcome::Fetch(e),
                Ok(bytes) => {
                    let t2 = t.clone();
                    match tokio::task::spawn_blocking(move || t2.write_chunk(id, &bytes)).await {
                        Ok(Ok(_)) => Outcome::Stored(len as u64),
                        Ok(Err(ChunkError::Corrupt(_))) => Outcome::Corrupt,
                        Ok(Err(ChunkError::Refused(r))) => Outcome::Refused(r),
                        Err(e) => Outcome::Refused(Refusal::Io {
                            path: t.name().to_string(),
                            message: format!("writer panicked: {e}"),
                        }),
                    }
                }
            };
            let _ = tx.send((peer, chunk, outcome));
        });
    }

    /// Feeds a fetch result back to the scheduler.
    fn report(&mut self, peer: PeerId, chunk: u64, outcome: Outcome) -> Result<(), Refusal> {
        match outcome {
            Outcome::Stored(n) => {
                self.received_bytes += n;
                self.sched.handle(Event::Verified { peer, chunk });
            }
            Outcome::Corrupt => {
                self.corrupt_chunks += 1;
                let id = self.transfer.map().id(chunk);
                tracing::warn!(
                    "chunk {}/{} from peer {peer} failed its BLAKE3 check; fetching it again",
                    id.file,
                    id.index
                );
                self.sched.handle(Event::Corrupt { peer, chunk });
            }
            Outcome::Fetch(FetchError::Connection(why)) => {
                self.last_loss = why;
                self.fetchers.remove(&peer);
                self.sched.handle(Event::PeerGone { peer });
            }
            Outcome::Fetch(e) => {
                tracing::warn!("fetch from peer {peer} failed: {e}");
                self.sched.handle(Event::FetchFailed { peer, chunk });
            }
            Outcome::Refused(r) => return Err(r),
        }
        Ok(())
    }
}
