//! `xfer pull --to`: download once and fan out while downloading.
//!
//! The pull places files one after another (its connections work through
//! the files in order). Each placed file is added to the set of paths that
//! may be sent; whenever the set grew, a push round offers the agents the
//! repository folder restricted to that set. Agents keep the files of the
//! previous round (their record says they are complete and unchanged), so a
//! round moves only the new files, peer to peer as any push. After the last
//! file and the ref, one final round delivers the complete folder and every
//! agent reports the same root. The fan-out starts with the first verified
//! file and the last round waits for the one running when the download
//! ends, so the total lies between the larger of the two and their sum
//! (measured: 1.5x the ideal, where pull-then-push takes 2.0x).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::flow::feed::{DraftFeed, OnFeed};
use crate::flow::push::{self, NodeSummary, PushError, PushOptions};
use crate::flow::stream;
use crate::hub::announce::{DraftUpdate, OnDraft};
use crate::hub::env::HubEnv;
use crate::hub::pull::{self, OnPlaced, PlacedFile, PullFailure, PullOptions, PullSummary};
use crate::store::hashcache::{FileStamp, HashCache};
use crate::store::scan::{scan_selected, SourceTree};
use crate::util::permanence::Permanence;
use crate::util::progress::Progress;
use xfer_proto::hash::Hash;
use xfer_proto::manifest::ChunkSize;
use xfer_proto::names::{ModelName, ModelNameError};
use xfer_proto::relpath::{PathError, RelPath};

/// Why a pull fanned out to the nodes did not complete: the pull's own
/// failure (a refusal of the Hub, a full disk: permanent), a delivery's,
/// or the folder's.
#[derive(Debug, thiserror::Error)]
pub enum FanOutError {
    /// The model's folder cannot be created.
    #[error("cannot create {}: {error}", path.display())]
    Create {
        /// The folder.
        path: PathBuf,
        /// What the system said.
        error: std::io::Error,
    },
    /// The model's folder cannot be resolved.
    #[error("{0}")]
    Resolve(std::io::Error),
    /// The folder's name is not a model name.
    #[error("{0}")]
    Name(ModelNameError),
    /// The folder has no name at all.
    #[error("the destination folder has no usable name")]
    NoName,
    /// A path of the pull's folder is not a tree path.
    #[error("{0}")]
    Path(PathError),
    /// The pull failed.
    #[error("{0}")]
    Pull(PullFailure),
    /// The pull's task failed (panicked or was cancelled).
    #[error("the download task failed: {0}")]
    PullTask(tokio::task::JoinError),
    /// The pull ended before it listed its files.
    #[error("the pull ended without listing its files")]
    NotListed,
    /// The pull ended with files it never sealed.
    #[error("the pull finished with files it never sealed")]
    NotSealed,
    /// The stream's task failed (panicked or was cancelled).
    #[error("the stream task failed: {0}")]
    StreamTask(tokio::task::JoinError),
    /// A delivery (the stream, a round) failed.
    #[error("{0}")]
    Push(PushError),
}

impl FanOutError {
    /// The pull's failure, if that is why.
    pub fn pull(&self) -> Option<&PullFailure> {
        match self {
            FanOutError::Pull(p) => Some(p),
            _ => None,
        }
    }
}

impl Permanence for FanOutError {
    fn is_permanent(&self) -> bool {
        match self {
            FanOutError::Pull(e) => e.is_permanent(),
            FanOutError::Push(e) => e.is_permanent(),
            _ => false,
        }
    }

    fn retry_after(&self) -> Option<std::time::Duration> {
        self.pull().and_then(Permanence::retry_after)
    }
}

impl From<PushError> for FanOutError {
    fn from(e: PushError) -> FanOutError {
        FanOutError::Push(e)
    }
}

/// The `--json` summary of `xfer pull --to`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PullFanoutSummary {
    /// The pull's own summary.
    pub pull: PullSummary,
    /// The name the agents hold it under (the cache folder's name).
    pub name: String,
    /// The root of the complete folder, as every agent reported it.
    pub root: Hash,
    /// Push rounds run, the last one with the complete folder.
    pub rounds: usize,
    /// Bytes the source sent over all rounds, summed over agents.
    pub bytes_sent: u64,
    /// `bytes_sent` over the folder's size.
    pub source_sent_x: f64,
    /// The final round's outcome per agent.
    pub nodes: Vec<NodeSummary>,
    /// The stream's outcome per agent (the files' contents, chunk by
    /// chunk while they downloaded).
    pub streamed: Vec<NodeSummary>,
    /// Seconds from the last downloaded byte to every agent complete.
    pub tail_s: f64,
    /// Seconds the final round took (after the stream ended: the folder's
    /// links, listing and ref, and what a node still lacked).
    #[serde(default)]
    pub final_round_s: f64,
    /// Seconds from the start to every agent complete.
    pub duration_s: f64,
    /// The complete folder's manifest, as the agents received it.
    #[serde(skip, default = "no_manifest")]
    pub manifest: xfer_proto::manifest::Manifest,
}

/// What a summary read back from `--json` holds in place of the manifest,
/// which the JSON does not carry.
fn no_manifest() -> xfer_proto::manifest::Manifest {
    xfer_proto::manifest::Manifest {
        version: xfer_proto::manifest::MANIFEST_VERSION,
        chunk_size: xfer_proto::manifest::DEFAULT_CHUNK_SIZE,
        entries: Vec::new(),
    }
}

impl PullFanoutSummary {
    /// Whether every agent got the complete folder.
    pub fn ok(&self) -> bool {
        self.nodes.iter().all(|n| n.ok)
    }
}

/// How `xfer pull --to` overlaps the download and the fan-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FanOut {
    /// Chunk by chunk: each verified chunk goes out as it lands.
    #[default]
    Stream,
    /// File by file, in push rounds (the older way, kept to compare).
    Files,
}

/// Pulls `opts` and delivers the result to `push.to` while it downloads.
/// `push.src` and `push.name` are set here.
pub async fn pull_and_fan_out(
    mut opts: PullOptions,
    env: HubEnv,
    mut push: PushOptions,
    mode: FanOut,
    progress: Progress,
    on_feed: Option<OnFeed>,
) -> Result<PullFanoutSummary, FanOutError> {
    let started = Instant::now();
    let repo = opts.repo.clone();
    let root = match &opts.local_dir {
        Some(d) => d.clone(),
        None => env.cache_root.join(repo.cache_folder()),
    };
    std::fs::create_dir_all(&root).map_err(|error| FanOutError::Create {
        path: root.clone(),
        error,
    })?;
    let root = root.canonicalize().map_err(FanOutError::Resolve)?;
    let name = root
        .file_name()
        .and_then(|n| n.to_str())
        .map(ModelName::new)
        .transpose()
        .map_err(FanOutError::Name)?
        .ok_or(FanOutError::NoName)?;
    push.src = root.clone();
    push.name = Some(name.clone());

    // The pull hashes chunks as it downloads; the final round takes them
    // from here instead of reading the files again.
    // File by file, every round must hash at one size, fixed before the
    // listing is known: auto is the default size there.
    if mode == FanOut::Files && push.chunk_size == ChunkSize::Auto {
        push.chunk_size = ChunkSize::Fixed(xfer_proto::manifest::DEFAULT_CHUNK_SIZE);
    }
    opts.chunk_size = Some(push.chunk_size);
    let hashes = Arc::new(Mutex::new(HashCache::for_tree(&root)));
    let ready: Arc<Mutex<BTreeSet<RelPath>>> = Default::default();
    let grew = Arc::new(tokio::sync::Notify::new());
    let on_placed: OnPlaced = {
        let (ready, root, hashes) = (ready.clone(), root.clone(), hashes.clone());
        let grew = grew.clone();
        Arc::new(move |placed| {
            for f in placed {
                record_chunks(&hashes, f);
            }
            let mut set = ready.lock().unwrap();
            for f in placed {
                set.extend(f.visible.iter().filter_map(|p| relative(&root, p)));
            }
            grew.notify_one();
        })
    };
    // The pull's announcements feed the stream; its listing starts it.
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let first_byte: Arc<Mutex<Option<Instant>>> = Default::default();
    let listed_at: Arc<Mutex<Option<Instant>>> = Default::default();
    let on_draft: OnDraft = {
        let (first_byte, listed_at) = (first_byte.clone(), listed_at.clone());
        let feed: Arc<Mutex<Option<Arc<DraftFeed>>>> = Default::default();
        let listed_tx = Mutex::new(Some(listed_tx));
        Arc::new(move |update| match update {
            DraftUpdate::Listed {
                draft,
                commit,
                paths,
            } => {
                listed_at.lock().unwrap().get_or_insert_with(Instant::now);
                let f = DraftFeed::new(draft, &commit);
                *feed.lock().unwrap() = Some(f.clone());
                if let Some(on) = &on_feed {
                    on(f.clone());
                }
                if let Some(tx) = listed_tx.lock().unwrap().take() {
                    let _ = tx.send((f, paths));
                }
            }
            DraftUpdate::FirstByte => {
                first_byte.lock().unwrap().get_or_insert_with(Instant::now);
            }
            DraftUpdate::Event(ev) => {
                if let Some(f) = feed.lock().unwrap().as_ref() {
                    if let Err(e) = f.push(ev) {
                        tracing::error!("the pull's announcement was refused: {e}");
                    }
                }
            }
        })
    };
    let revision = repo.revision.clone();
    let local_dir = opts.local_dir.is_some();
    let mut pulling = {
        let progress = progress.clone();
        // Dropped (a cancelled sync job) stops the download too.
        push::AbortOnDrop(tokio::spawn(async move {
            let on_draft = (mode == FanOut::Stream).then_some(on_draft);
            let r = pull::pull(&opts, &env, &progress, Some(on_placed), on_draft)
                .await
                .map_err(PullFailure::from);
            (r, Instant::now())
        }))
    };

    let (summary, downloaded_at, streamed, mut bytes_sent, mut rounds) = match mode {
        FanOut::Stream => {
            let (summary, at, streamed) =
                streamed(&mut pulling, listed, &push, &name, &progress).await?;
            let sent = streamed.iter().map(|n| n.bytes_sent).sum();
            (summary, at, streamed, sent, 0)
        }
        FanOut::Files => {
            let (summary, at, sent, rounds) =
                by_file(&mut pulling, &grew, &ready, &root, &push, &name, &hashes).await?;
            (summary, at, Vec::new(), sent, rounds)
        }
    };

    let streamed_at = Instant::now();
    // The rest of the folder (snapshot links, the listing, the ref) and
    // whatever an agent that failed the stream still lacks.
    let mut set = ready.lock().unwrap().clone();
    set.insert(RelPath::new(&summary.tree_cache).map_err(FanOutError::Path)?);
    if !local_dir && revision != summary.commit {
        set.insert(crate::hub::cache::ref_file(&revision).map_err(FanOutError::Path)?);
    }
    // At the size the pull hashed at (auto resolved from its listing).
    let chunk_size = summary.chunk_size.map_or(push.chunk_size, ChunkSize::Fixed);
    let tree = select(&root, chunk_size, set, &hashes).await?;
    let quiet = Progress::new(false);
    let last = push::deliver(&push, &name, &tree, 0.0, &quiet).await?;
    bytes_sent += last.bytes_sent;
    rounds += 1;
    // Per node: how soon its first chunk followed the first byte, how long
    // after the last one it held everything, and where its bytes came
    // from over both rounds.
    let first_byte = *first_byte.lock().unwrap();
    let mut nodes = last.nodes;
    for (n, st) in nodes.iter_mut().zip(&streamed) {
        n.from_source += st.from_source;
        n.from_peers += st.from_peers;
        let since = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => Some(b.saturating_duration_since(a).as_secs_f64()),
            _ => None,
        };
        n.first_byte_s = since(first_byte, st.first_chunk_at);
        n.tail_s = since(Some(downloaded_at), st.done_at.or(n.done_at));
    }
    let total = tree.manifest.total_bytes().max(1);
    let after = |t: Option<Instant>| {
        t.map_or("-".to_string(), |t| {
            format!("{:.2}", t.saturating_duration_since(started).as_secs_f64())
        })
    };
    tracing::info!(
        "{name}: streamed, then completed in a final round (seconds from the start: listed {}, first byte {}, downloaded {}, every node streamed {}, final round done {})",
        after(*listed_at.lock().unwrap()),
        after(first_byte),
        after(Some(downloaded_at)),
        after(Some(streamed_at)),
        after(Some(Instant::now())),
    );
    Ok(PullFanoutSummary {
        pull: summary,
        name: name.to_string(),
        root: last.root,
        rounds,
        bytes_sent,
        source_sent_x: bytes_sent as f64 / total as f64,
        nodes,
        streamed,
        tail_s: downloaded_at.elapsed().as_secs_f64(),
        final_round_s: streamed_at.elapsed().as_secs_f64(),
        duration_s: started.elapsed().as_secs_f64(),
        manifest: tree.manifest,
    })
}

/// The pull's task: its summary and when the download ended.
type Pulling = push::AbortOnDrop<(
    Result<(PullSummary, Vec<crate::hub::api::RemoteFile>), PullFailure>,
    Instant,
)>;

/// Streams the pull's files to the agents chunk by chunk, from its listing
/// on; returns when the pull is done and every agent has the contents.
async fn streamed(
    pulling: &mut Pulling,
    listed: tokio::sync::oneshot::Receiver<(Arc<DraftFeed>, Vec<crate::hub::announce::DraftPaths>)>,
    push: &PushOptions,
    name: &ModelName,
    progress: &Progress,
) -> Result<(PullSummary, Instant, Vec<NodeSummary>), FanOutError> {
    // The stream starts with the listing, before the first byte.
    let (feed, streaming, pulled) = tokio::select! {
        r = &mut pulling.0 => {
            // Failed (or had nothing to list) before the listing.
            let (r, _) = r.map_err(FanOutError::PullTask)?;
            r.map_err(FanOutError::Pull)?;
            return Err(FanOutError::NotListed);
        }
        l = listed => {
            let Ok((feed, paths)) = l else {
                // The pull dropped the listing's sender: it failed (or
                // ended) before listing. Its own error is the cause.
                let (r, _) = (&mut pulling.0).await.map_err(FanOutError::PullTask)?;
                r.map_err(FanOutError::Pull)?;
                return Err(FanOutError::NotListed);
            };
            let (push2, name2, feed2, progress2) = (push.clone(), name.clone(), feed.clone(), progress.clone());
            let streaming = push::AbortOnDrop(tokio::spawn(async move {
                stream::stream(&push2, &name2, feed2, paths, &progress2).await
            }));
            let (r, at) = (&mut pulling.0).await.map_err(FanOutError::PullTask)?;
            (feed, streaming, (r, at))
        }
    };
    // A failed pull ends the stream (dropping it closes the connections);
    // the agents keep their staged chunks for a re-run.
    let ((summary, _), downloaded_at) = (pulled.0.map_err(FanOutError::Pull)?, pulled.1);
    let draft_manifest = feed.manifest().ok_or(FanOutError::NotSealed)?;
    let mut streaming = streaming;
    let streamed = (&mut streaming.0)
        .await
        .map_err(FanOutError::StreamTask)??;
    for n in &streamed {
        match (&n.error, n.root) {
            (Some(e), _) => tracing::warn!("{}: {e} (the final round retries)", n.addr),
            (None, Some(r)) if r != draft_manifest.root() => {
                return Err(PushError::Root {
                    node: n.addr.clone(),
                    got: r,
                    want: draft_manifest.root(),
                }
                .into())
            }
            _ => {}
        }
    }

    Ok((summary, downloaded_at, streamed))
}

/// Pushes the pull's placed files to the agents in rounds, one whenever
/// more are placed, until the download ends.
async fn by_file(
    pulling: &mut Pulling,
    grew: &tokio::sync::Notify,
    ready: &Mutex<BTreeSet<RelPath>>,
    root: &Path,
    push: &PushOptions,
    name: &ModelName,
    hashes: &Arc<Mutex<HashCache>>,
) -> Result<(PullSummary, Instant, u64, usize), FanOutError> {
    let quiet = Progress::new(false);
    let (mut rounds, mut bytes_sent, mut pushed) = (0, 0, 0);
    let (pulled, at) = loop {
        tokio::select! {
            r = &mut pulling.0 => {
                let (r, at) = r.map_err(FanOutError::PullTask)?;
                break (r.map_err(FanOutError::Pull)?, at);
            }
            _ = grew.notified() => {}
        }
        let set = ready.lock().unwrap().clone();
        if set.len() == pushed {
            continue;
        }
        let tree = select(root, push.chunk_size, set.clone(), hashes).await?;
        let s = push::deliver(push, name, &tree, 0.0, &quiet).await?;
        rounds += 1;
        bytes_sent += s.bytes_sent;
        for n in s.nodes.iter().filter(|n| !n.ok) {
            let why = n.error.as_deref().unwrap_or("failed");
            tracing::warn!("{}: {why} (the next round retries)", n.addr);
        }
        pushed = set.len();
    };
    Ok((pulled.0, at, bytes_sent, rounds))
}

/// `path` inside `root`, as a tree path.
fn relative(root: &Path, path: &Path) -> Option<RelPath> {
    let rel = path.strip_prefix(root).ok()?;
    RelPath::new(rel.to_str()?).ok()
}

/// Keeps the chunk hashes the pull computed for `f`, under the path the
/// scan of the folder will look them up by.
fn record_chunks(hashes: &Mutex<HashCache>, f: &PlacedFile) {
    let Some((chunk_size, chunks)) = &f.chunks else {
        return;
    };
    let Ok(path) = f.content.canonicalize() else {
        return;
    };
    if let Some(stamp) = FileStamp::of(&path) {
        hashes
            .lock()
            .unwrap()
            .put(&path, &stamp, *chunk_size, chunks.clone());
    }
}

/// The manifest of `root` restricted to `paths`, hashing only files whose
/// chunk hashes neither the pull nor an earlier round recorded.
async fn select(
    root: &Path,
    chunk_size: ChunkSize,
    paths: BTreeSet<RelPath>,
    hashes: &Arc<Mutex<HashCache>>,
) -> Result<SourceTree, PushError> {
    let root = root.to_path_buf();
    let hashes = hashes.clone();
    tokio::task::spawn_blocking(move || {
        let mut cache = hashes.lock().unwrap();
        let tree = scan_selected(
            &root,
            chunk_size,
            Some(&mut *cache),
            &|p| paths.contains(p),
            &|_| {},
        );
        if tree.is_ok() {
            cache.save();
        }
        tree
    })
    .await
    .map_err(PushError::Task)?
    .map_err(|e| PushError::Scan(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::manifest::Entry;

    #[tokio::test]
    async fn a_round_takes_the_chunk_hashes_the_pull_computed_without_reading_the_file() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("blobs")).unwrap();
        let blob = root.join("blobs/abc");
        std::fs::write(&blob, vec![1u8; 3 * 65536]).unwrap();
        // Hashes no read of the file could produce: if the round used them,
        // it did not hash the file again.
        let planted = vec![Hash([7; 32]), Hash([8; 32]), Hash([9; 32])];
        let hashes = Arc::new(Mutex::new(HashCache::default()));
        record_chunks(
            &hashes,
            &PlacedFile {
                path: RelPath::new("x").unwrap(),
                visible: vec![blob.clone()],
                content: blob.clone(),
                chunks: Some((65536, planted.clone())),
            },
        );
        let only: BTreeSet<RelPath> = [RelPath::new("blobs/abc").unwrap()].into();
        let tree = select(&root, 65536.into(), only.clone(), &hashes)
            .await
            .unwrap();
        let Entry::File(f) = &tree.manifest.entries[0] else {
            panic!("{:?}", tree.manifest.entries)
        };
        assert_eq!(f.chunks, planted);
        // At another chunk size they do not apply: the file is hashed.
        let tree = select(&root, 131072.into(), only, &hashes).await.unwrap();
        let Entry::File(f) = &tree.manifest.entries[0] else {
            panic!()
        };
        assert_eq!(f.hash, Hash::from(blake3::hash(&vec![1u8; 3 * 65536])));
    }
}
