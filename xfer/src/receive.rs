//! Drives one incoming transfer: the scheduler decides, fetchers fetch, the
//! store verifies and writes.
//!
//! This is the glue between the sans-IO [`Scheduler`] and the I/O: it turns
//! `Fetch` actions into fetch tasks on a [`ChunkFetcher`], feeds their results
//! back as events, commits the journal on a timer, and finishes the
//! [`Transfer`] when the scheduler reports completion. It knows nothing about
//! QUIC, so an RDMA fetcher plugs in unchanged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::chunkset::ChunkSet;
use crate::hash::Hash;
use crate::scheduler::{self, Action, Event, PeerId, Scheduler, StuckReason};
use crate::store::{ChunkError, Transfer};
use crate::transport::{ChunkFetcher, FetchError};
use crate::wire::Refusal;

/// What a finished transfer reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub root: Hash,
    /// Chunk bytes that arrived and passed their check.
    pub received_bytes: u64,
    /// Chunks that failed their check and were fetched again.
    pub corrupt_chunks: u64,
}

/// How often written chunks are made durable against power loss.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

enum Outcome {
    Stored(u64),
    Corrupt,
    Fetch(FetchError),
    Refused(Refusal),
}

/// Receives every missing chunk of `transfer` from `peers`, then places the
/// tree. Stops early with a [`Refusal`] on disk errors, repeated corruption,
/// loss of every source, or cancellation.
pub async fn receive<F: ChunkFetcher>(
    transfer: Arc<Transfer>,
    peers: Vec<(PeerId, F, ChunkSet)>,
    cfg: scheduler::Config,
    cancel: CancellationToken,
) -> Result<Received, Refusal> {
    let mut sched = Scheduler::new(transfer.held(), cfg);
    let mut fetchers: HashMap<PeerId, F> = HashMap::new();
    for (id, f, has) in peers {
        fetchers.insert(id, f);
        sched.handle(Event::PeerJoined { peer: id, has });
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<(PeerId, u64, Outcome)>();
    let mut tick = tokio::time::interval(CHECKPOINT_EVERY);
    let mut received_bytes = 0;
    let mut corrupt_chunks = 0;
    let mut last_loss = String::new();
    loop {
        while let Some(action) = sched.poll_action() {
            match action {
                Action::Fetch { peer, chunk } => {
                    let Some(fetcher) = fetchers.get(&peer).cloned() else {
                        sched.handle(Event::PeerGone { peer });
                        continue;
                    };
                    let (t, tx) = (transfer.clone(), tx.clone());
                    tokio::spawn(async move {
                        let id = t.map().id(chunk);
                        let len = t.map().chunk_len(id) as usize;
                        let outcome = match fetcher.fetch(id, len).await {
                            Err(e) => Outcome::Fetch(e),
                            Ok(bytes) => {
                                let t2 = t.clone();
                                let written =
                                    tokio::task::spawn_blocking(move || t2.write_chunk(id, &bytes))
                                        .await;
                                match written {
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
                Action::DropPeer { peer, reason } => {
                    tracing::warn!("dropping peer {peer}: {reason:?}");
                    fetchers.remove(&peer);
                }
                Action::Complete => {
                    let t = transfer.clone();
                    let root = tokio::task::spawn_blocking(move || t.finish())
                        .await
                        .map_err(|e| Refusal::Io {
                            path: transfer.name().to_string(),
                            message: format!("finishing panicked: {e}"),
                        })??;
                    return Ok(Received {
                        root,
                        received_bytes,
                        corrupt_chunks,
                    });
                }
                Action::Stuck(StuckReason::ChunkKeepsFailing { chunk, failures }) => {
                    let id = transfer.map().id(chunk);
                    let _ = transfer.commit();
                    return Err(Refusal::Corrupt {
                        file: id.file,
                        index: id.index,
                        times: failures,
                    });
                }
                Action::Stuck(StuckReason::NoSource { missing }) => {
                    let _ = transfer.commit();
                    return Err(Refusal::SourceLost(format!(
                        "{missing} chunks still missing and no connected peer has them ({last_loss})"
                    )));
                }
            }
        }
        tokio::select! {
            Some((peer, chunk, outcome)) = rx.recv() => match outcome {
                Outcome::Stored(n) => {
                    received_bytes += n;
                    sched.handle(Event::Verified { peer, chunk });
                }
                Outcome::Corrupt => {
                    corrupt_chunks += 1;
                    let id = transfer.map().id(chunk);
                    tracing::warn!("chunk {}/{} from peer {peer} failed its BLAKE3 check; fetching it again", id.file, id.index);
                    sched.handle(Event::Corrupt { peer, chunk });
                }
                Outcome::Fetch(FetchError::Connection(why)) => {
                    last_loss = why;
                    fetchers.remove(&peer);
                    sched.handle(Event::PeerGone { peer });
                }
                Outcome::Fetch(e) => {
                    tracing::warn!("fetch from peer {peer} failed: {e}");
                    sched.handle(Event::FetchFailed { peer, chunk });
                }
                Outcome::Refused(r) => {
                    let _ = transfer.commit();
                    return Err(r);
                }
            },
            _ = tick.tick() => {
                let t = transfer.clone();
                if let Ok(Err(r)) = tokio::task::spawn_blocking(move || t.commit()).await {
                    return Err(r);
                }
            }
            _ = cancel.cancelled() => {
                let _ = transfer.commit();
                return Err(Refusal::Superseded);
            }
        }
    }
}
