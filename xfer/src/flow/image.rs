//! Image delivery: a local container image delivered to nodes like a model
//! (`xfer image push`). The image is saved once (`docker save`) into
//! content-addressed blobs under a local cache ([`crate::image::archive`]),
//! each blob is pushed as a model of its own through the swarm as soon as
//! it is saved (a blob a node already holds is not sent again, an
//! interrupted one resumes), and then every node's agent checks the blobs
//! against their sha256 digests and loads the image into its own container
//! runtime. Every node must report the image's id.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::auth::Credential;
use crate::flow::push::{NodeSummary, PushError, PushOptions, PushSummary};
use crate::flow::route::Destination;
use crate::image::archive;
use crate::image::runtime::{Runtime, RuntimeError};
use crate::transport::rdma::link::Nic;
use crate::transport::select::TransportChoice;
use crate::util::chain::Chain;
use crate::util::progress::Progress;
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::image::{Digest, ImageDesc};
use xfer_proto::manifest::ChunkSize;
use xfer_proto::units::Bytes;

/// How long one node may take to check and load an image.
const LOAD_TIMEOUT: Duration = Duration::from_secs(3600);

/// What an image push did: the `--json` summary of `xfer image push`.
#[derive(Debug, Serialize)]
pub struct ImagePushSummary {
    /// The image reference pushed, as given.
    pub image: String,
    /// The image's id (its config digest).
    pub id: Digest,
    /// How many layers it has.
    pub layers: usize,
    /// The bytes of all its blobs.
    pub bytes_total: u64,
    /// Chunk bytes the source sent, summed over blobs and nodes.
    pub bytes_sent: u64,
    /// Bytes the nodes already held, summed over blobs and nodes.
    pub bytes_skipped: u64,
    /// Whether the local blob cache already held the image (no `docker save`).
    pub cached: bool,
    /// `docker save` into the cache (0 when cached).
    pub save_s: f64,
    /// From the first blob's push to the last's end: the pushes start while
    /// the save still runs, so `save_s` and `push_s` overlap.
    pub push_s: f64,
    /// From the first load's request to the last node's answer.
    pub load_s: f64,
    /// The whole push, from start to the last answer.
    pub duration_s: f64,
    /// Each blob pushed.
    pub blobs: Vec<BlobSummary>,
    /// What each node got.
    pub nodes: Vec<NodeImage>,
    /// For `xfer image pull`: what came from the registry (`save_s` is
    /// then the fetch's time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryTally>,
}

/// What an image pull took from its registry.
#[derive(Debug, Serialize)]
pub struct RegistryTally {
    /// The reference pulled, in full.
    pub source: String,
    /// The image manifest's digest.
    pub manifest: Digest,
    /// The platform picked from an index, if it was one.
    pub platform: Option<String>,
    /// Bytes downloaded from the registry this run (0: all cached).
    pub bytes_fetched: u64,
}

/// One blob's push.
#[derive(Debug, Serialize)]
pub struct BlobSummary {
    /// The blob's sha256.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
    /// Chunk bytes the source sent of it, summed over nodes.
    pub bytes_sent: u64,
    /// Bytes of it the nodes already held, summed over nodes.
    pub bytes_skipped: u64,
}

/// What one node got, and whether it loaded the image.
#[derive(Debug, Serialize, Default)]
pub struct NodeImage {
    /// The node's name or address.
    pub node: String,
    /// Whether every blob reached it and it loaded the image as the id.
    pub ok: bool,
    /// Why not, when not ok, with the node's name in front.
    pub error: Option<String>,
    /// The id the node's engine reports.
    pub id: Option<Digest>,
    /// The container runtime that loaded it, as the node names it.
    pub engine: Option<String>,
    /// Chunk bytes it got from the source.
    pub bytes_sent: u64,
    /// Chunk bytes it got from its peers.
    pub from_peers: u64,
    /// Bytes it already held.
    pub bytes_skipped: u64,
    /// Bytes streamed into its engine (0: it held the image already).
    pub loaded_bytes: u64,
    /// How long its load took.
    pub load_s: f64,
}

/// What to push where, and how.
#[derive(Clone)]
pub struct ImagePushOptions {
    /// The image reference, checked (e.g. `repo/name:tag`).
    pub reference: String,
    /// The local container runtime the image is saved from.
    pub engine: Runtime,
    /// The nodes to deliver to.
    pub dests: Vec<Destination>,
    /// The cluster credential, loaded once by the caller.
    pub cred: Arc<Credential>,
    /// The local blob cache.
    pub cache: PathBuf,
    /// QUIC or RDMA, and which NIC (chosen after the image is found).
    pub transport: TransportChoice,
    /// Chunk size of each blob's push.
    pub chunk_size: ChunkSize,
    /// `--limit-rate` of each blob's push.
    pub limit_rate: Option<u64>,
    /// How long to wait for each connection.
    pub connect_timeout: Duration,
    /// Connections per node.
    pub connections: usize,
    /// Swarm degree.
    pub peers: u32,
}

/// What a delivery says as it goes, in words, for its caller to show.
#[derive(Debug)]
pub enum Note {
    /// Worth telling always (damage found in the cache and repaired).
    Warning(String),
    /// Progress (the save starting, the image's size).
    Progress(String),
}

/// Delivers `opts.reference` to every node: saves it into the cache (unless
/// held there already), pushes each blob as it is saved, and has every node
/// load it. A node's failure is in its [`NodeImage`]; an `Err` is a failure
/// of the whole push (the image missing, the save failing, a blob missing).
///
/// `load` sends one node's agent the admin request to load the image
/// (`LoadImage`) and returns its reply: the caller passes the agent
/// Why an image's delivery failed as a whole (a node's failure is in its
/// [`NodeImage`]): the image is not there, the engine or the registry
/// failed, a blob is missing or its push failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The local engine holds no such image.
    #[error("image {reference} does not exist locally ({program} holds no such image); build or pull it first, or check `{program} images`")]
    NotLocal {
        /// The image.
        reference: String,
        /// The engine's program.
        program: &'static str,
    },
    /// The local engine cannot be asked.
    #[error("cannot ask the local engine for {reference}: {error}")]
    Engine {
        /// The image.
        reference: String,
        /// What went wrong.
        error: RuntimeError,
    },
    /// The engine's save cannot start (its words).
    #[error("{0}")]
    SaveStart(String),
    /// The engine's save cannot be waited for.
    #[error("{0}")]
    SaveWait(std::io::Error),
    /// The engine's save failed.
    #[error("{program} save {reference} failed: {why}")]
    SaveFailed {
        /// The engine's program.
        program: &'static str,
        /// The image.
        reference: String,
        /// What the engine said, explained.
        why: String,
    },
    /// The image changed while it was saved.
    #[error("{program} saved {reference} as {saved}, but it was {was} a moment ago (retagged meanwhile?); run xfer image push again")]
    Retagged {
        /// The engine's program.
        program: &'static str,
        /// The image.
        reference: String,
        /// The id saved (short).
        saved: String,
        /// The id asked before (short).
        was: String,
    },
    /// The blob cache, the transport or the registry failed, in their
    /// words.
    #[error("{0}")]
    Lower(Chain),
    /// A blob the delivery needs is not in the cache.
    #[error("blob {digest:?} of {reference} is not in the cache: {error}")]
    NotCached {
        /// The blob.
        digest: Digest,
        /// The image.
        reference: String,
        /// What the system said.
        error: std::io::Error,
    },
    /// A blob's push failed.
    #[error("pushing blob {digest:?} of {reference}: {error}")]
    Push {
        /// The blob.
        digest: Digest,
        /// The image.
        reference: String,
        /// Why.
        error: Box<PushError>,
    },
    /// A task of the delivery failed (panicked or was cancelled).
    #[error("{0}")]
    Task(tokio::task::JoinError),
    /// What the registry serves is not an image xfer loads (its words).
    #[error("{0}")]
    NotLoadable(String),
    /// The image's description does not hold together.
    #[error("{0}")]
    BadImage(xfer_proto::image::BadImage),
    /// A layer's stream cannot be drafted.
    #[error("{0}")]
    Draft(xfer_proto::draft::DraftError),
}

impl ImageError {
    pub(super) fn lower(e: impl Into<Chain>) -> ImageError {
        ImageError::Lower(e.into())
    }
}

/// client, a layer above this one.
pub async fn push<L, F, E>(
    opts: &ImagePushOptions,
    progress: Progress,
    note: &(dyn Fn(Note) + Sync),
    load: L,
) -> Result<ImagePushSummary, ImageError>
where
    L: Fn(Arc<Credential>, Destination, AdminRequest, Duration) -> F,
    F: std::future::Future<Output = Result<AdminReply, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let started = Instant::now();
    let engine = opts.engine.clone();
    let reference = opts.reference.clone();
    let dests = &opts.dests;
    let cred = &opts.cred;
    let id = match engine.image_id(&reference).await {
        Ok(Some(id)) => id,
        Ok(None) => {
            return Err(ImageError::NotLocal {
                reference,
                program: engine.program(),
            })
        }
        Err(error) => return Err(ImageError::Engine { reference, error }),
    };
    let cache = opts.cache.clone();
    // The image's blobs, known before the save: its config (the id) and
    // its layers. Each is pushed as soon as `docker save` has written it to
    // the cache, while the save goes on with the next.
    let layers = engine
        .layers(&reference)
        .await
        .map_err(|error| ImageError::Engine {
            reference: reference.clone(),
            error,
        })?;
    let expected: BTreeSet<Digest> = layers.iter().copied().chain([id]).collect();
    let nic = crate::transport::select::choose(opts.transport).map_err(ImageError::lower)?;
    let mut delivery = Delivery::new(dests, cred.clone(), nic, progress, cache.clone());
    let (tx, mut saved) = tokio::sync::mpsc::unbounded_channel::<Digest>();
    let lookup = archive::cached(&cache, &id, &reference);
    for b in &lookup.discarded {
        note(Note::Warning(format!(
            "blob {} of {reference} in {} no longer hashes to its digest (damaged on disk); discarded, saving the image again",
            b.digest,
            cache.display()
        )));
    }
    let (saving, cached) = match lookup.desc {
        Some(d) => {
            for b in d.blobs() {
                let _ = tx.send(b.digest);
            }
            drop(tx);
            (tokio::spawn(async move { Ok((d, Duration::ZERO)) }), true)
        }
        None => {
            note(Note::Progress(format!(
                "{reference} ({}): {} layers; saving, each blob pushed once saved",
                id.short(),
                layers.len()
            )));
            let (r, c, e) = (reference.clone(), cache.clone(), engine.clone());
            let saving = tokio::spawn(async move {
                let t = Instant::now();
                let desc = save(e, r, c, tx).await?;
                Ok::<_, ImageError>((desc, t.elapsed()))
            });
            (saving, false)
        }
    };
    let mut pushed = BTreeSet::new();
    let mut first_push: Option<Instant> = None;
    while let Some(d) = saved.recv().await {
        if expected.contains(&d) && pushed.insert(d) {
            first_push.get_or_insert_with(Instant::now);
            delivery.blob(opts, d, &reference, Round::Push).await?;
        }
    }
    let (desc, save_took) = saving.await.map_err(ImageError::Task)??;
    let save_s = save_took.as_secs_f64();
    if desc.id() != id {
        return Err(ImageError::Retagged {
            program: engine.program(),
            reference,
            saved: desc.id().short().to_string(),
            was: id.short().to_string(),
        });
    }
    note(Note::Progress(format!(
        "{reference} ({}): {} layers, {}{}",
        id.short(),
        desc.layers.len(),
        Bytes(desc.bytes()),
        if cached { ", blobs already saved" } else { "" }
    )));
    // Whatever the save named that was not expected (none, unless the
    // image changed under the same id).
    for b in desc.blobs() {
        if pushed.insert(b.digest) {
            first_push.get_or_insert_with(Instant::now);
            delivery
                .blob(opts, b.digest, &reference, Round::Push)
                .await?;
        }
    }
    let push_started = first_push.unwrap_or_else(Instant::now);
    let Delivery {
        mut nodes, blobs, ..
    } = delivery;
    let push_s = push_started.elapsed().as_secs_f64();

    // Every node loads it into its own engine, at once.
    let load_started = Instant::now();
    load_everywhere(dests, &mut nodes, &desc, &reference, cred, &load).await;
    let summary = ImagePushSummary {
        image: reference.clone(),
        id,
        layers: desc.layers.len(),
        bytes_total: desc.bytes(),
        bytes_sent: blobs.iter().map(|b| b.bytes_sent).sum(),
        bytes_skipped: blobs.iter().map(|b| b.bytes_skipped).sum(),
        cached,
        save_s,
        push_s,
        load_s: load_started.elapsed().as_secs_f64(),
        duration_s: started.elapsed().as_secs_f64(),
        blobs,
        nodes,
        registry: None,
    };
    if summary.nodes.iter().any(|n| !n.ok) {
        // Whatever failed, the next push hashes every blob again before
        // sending it, so damage the stamps missed cannot be sent twice.
        archive::distrust(&cache, &desc);
    }
    Ok(summary)
}

/// Has every node that got every blob load `desc` into its own engine, at
/// once, and records in `nodes` what each reports (the id must be the
/// config's digest).
pub(super) async fn load_everywhere<L, F, E>(
    dests: &[Destination],
    nodes: &mut [NodeImage],
    desc: &ImageDesc,
    reference: &str,
    cred: &Arc<Credential>,
    load: &L,
) where
    L: Fn(Arc<Credential>, Destination, AdminRequest, Duration) -> F,
    F: std::future::Future<Output = Result<AdminReply, E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    let id = desc.id();
    let loads = dests
        .iter()
        .zip(nodes.iter())
        .filter(|(_, n)| n.ok)
        .map(|(d, _)| {
            let req = AdminRequest::LoadImage(Box::new(desc.clone()));
            let reply = load(cred.clone(), d.clone(), req, LOAD_TIMEOUT);
            let label = d.label().to_string();
            async move { (label, reply.await) }
        });
    for (label, reply) in futures_join(loads).await {
        let n = nodes
            .iter_mut()
            .find(|n| n.node == label)
            .expect("a node we asked");
        match reply {
            Ok(AdminReply::ImageLoaded(r)) => {
                n.id = Some(r.id);
                n.engine = Some(r.engine.clone());
                n.loaded_bytes = r.loaded_bytes;
                n.load_s = r.load_s;
                if r.id != id {
                    n.ok = false;
                    n.error = Some(format!(
                        "{label}: holds {reference} as {}, not {}; remove it there and push again",
                        r.id.short(),
                        id.short()
                    ));
                }
            }
            Ok(AdminReply::Failed(r)) => {
                n.ok = false;
                n.error = Some(with_node(&label, r.to_string()));
            }
            Ok(other) => {
                n.ok = false;
                n.error = Some(format!(
                    "{label}: answered {}; run the same xfer version on every node",
                    other.kind()
                ));
            }
            Err(e) => {
                n.ok = false;
                n.error = Some(with_node(&label, e.to_string()));
            }
        }
    }
}

/// The blobs pushed so far, and what each node got.
pub(super) struct Delivery {
    dests: Vec<Destination>,
    pub(super) nodes: Vec<NodeImage>,
    pub(super) blobs: Vec<BlobSummary>,
    cred: Arc<Credential>,
    nic: Option<Arc<dyn Nic>>,
    progress: Progress,
    cache: PathBuf,
}

impl Delivery {
    /// A delivery to `dests`, none of them failed yet.
    pub(super) fn new(
        dests: &[Destination],
        cred: Arc<Credential>,
        nic: Option<Arc<dyn Nic>>,
        progress: Progress,
        cache: PathBuf,
    ) -> Delivery {
        Delivery {
            nodes: dests
                .iter()
                .map(|d| NodeImage {
                    node: d.label().to_string(),
                    ok: true,
                    ..NodeImage::default()
                })
                .collect(),
            dests: dests.to_vec(),
            blobs: Vec::new(),
            cred,
            nic,
            progress,
            cache,
        }
    }

    /// The push of blob `digest` (a model of one file, from the cache) to
    /// every node that has not failed yet; `None` when every node failed.
    pub(super) fn push_options(
        &self,
        opts: &ImagePushOptions,
        digest: Digest,
    ) -> Option<PushOptions> {
        let live: Vec<Destination> = self
            .dests
            .iter()
            .zip(&self.nodes)
            .filter(|(_, n)| n.ok)
            .map(|(d, _)| d.clone())
            .collect();
        if live.is_empty() {
            return None;
        }
        let file = archive::blob_path(&self.cache, &digest);
        Some(PushOptions {
            src: file.parent().expect("a blob has a folder").to_path_buf(),
            to: live,
            me: None,
            routes: None,
            cred: self.cred.clone(),
            name: Some(digest.model()),
            chunk_size: opts.chunk_size,
            limit_rate: opts.limit_rate,
            connect_timeout: opts.connect_timeout,
            rehash: false,
            connections: opts.connections,
            nic: self.nic.clone(),
            peers: opts.peers,
        })
    }

    /// The progress bars pushes draw.
    pub(super) fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Pushes blob `digest` from the cache, as a model through the swarm,
    /// to every node that has not failed yet (after a stream of it, what a
    /// node still lacks: nothing, when the stream went well).
    pub(super) async fn blob(
        &mut self,
        opts: &ImagePushOptions,
        digest: Digest,
        reference: &str,
        round: Round,
    ) -> Result<(), ImageError> {
        let Some(push) = self.push_options(opts, digest) else {
            return Ok(());
        };
        let size = std::fs::metadata(archive::blob_path(&self.cache, &digest))
            .map_err(|error| ImageError::NotCached {
                digest,
                reference: reference.to_string(),
                error,
            })?
            .len();
        let s: PushSummary = crate::flow::push::push(&push, &self.progress)
            .await
            .map_err(|error| ImageError::Push {
                digest,
                reference: reference.to_string(),
                error: Box::new(error),
            })?;
        self.tally(digest, size, &s.nodes, round);
        Ok(())
    }

    /// Counts what `nodes` (one push's or stream's per-node outcome) moved
    /// of blob `digest`.
    pub(super) fn tally(&mut self, digest: Digest, size: u64, nodes: &[NodeSummary], round: Round) {
        let counted = |n: &NodeSummary| match round {
            // What a node held before is what the stream did not send;
            // the push after it finds the whole blob held.
            Round::Push | Round::Stream => n.bytes_skipped,
            Round::AfterStream => 0,
        };
        let sent: u64 = nodes.iter().map(|n| n.bytes_sent).sum();
        let skipped: u64 = nodes.iter().map(counted).sum();
        match self.blobs.iter_mut().find(|b| b.digest == digest) {
            Some(b) => {
                b.bytes_sent += sent;
                b.bytes_skipped += skipped;
            }
            None => self.blobs.push(BlobSummary {
                digest,
                size,
                bytes_sent: sent,
                bytes_skipped: skipped,
            }),
        }
        for ns in nodes {
            let Some(n) = self
                .nodes
                .iter_mut()
                .zip(&self.dests)
                .find(|(_, d)| d.label() == ns.addr || d.agent == ns.addr)
                .map(|(n, _)| n)
            else {
                continue;
            };
            n.bytes_sent += ns.bytes_sent;
            n.from_peers += ns.from_peers;
            n.bytes_skipped += counted(ns);
            // A stream's failures are left to the push after it.
            if round != Round::Stream && !ns.ok {
                n.ok = false;
                n.error = Some(format!(
                    "{}: blob {digest:?} was not delivered: {}",
                    n.node,
                    ns.error.as_deref().unwrap_or("failed")
                ));
            }
        }
    }
}

/// Which delivery of a blob a tally counts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Round {
    /// A push of the whole blob.
    Push,
    /// A stream of the blob while it downloads.
    Stream,
    /// The push that follows a stream, for what a node still lacks.
    AfterStream,
}

/// `msg` with the node's name in front, unless it already names it.
fn with_node(node: &str, msg: String) -> String {
    if msg.starts_with(node) {
        msg
    } else {
        format!("{node}: {msg}")
    }
}

/// `docker save` of `reference`, unpacked as it streams into `cache`;
/// each blob's digest goes to `saved` once the blob is complete there.
async fn save(
    engine: Runtime,
    reference: String,
    cache: PathBuf,
    saved: tokio::sync::mpsc::UnboundedSender<Digest>,
) -> Result<ImageDesc, ImageError> {
    tokio::task::spawn_blocking(move || -> Result<ImageDesc, ImageError> {
        let r = reference;
        let mut child = engine
            .std_command()
            .args(["save", "--", &r])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| ImageError::SaveStart(engine.spawn_error(&e)))?;
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let err = std::thread::spawn(move || {
            use std::io::Read;
            let mut s = String::new();
            let _ = stderr.by_ref().take(1 << 20).read_to_string(&mut s);
            s
        });
        let unpacked = archive::unpack(stdout, &cache, &r, |d| {
            let _ = saved.send(d);
        });
        let status = child.wait().map_err(ImageError::SaveWait)?;
        let err = err.join().unwrap_or_default();
        if !status.success() {
            return Err(ImageError::SaveFailed {
                program: engine.program(),
                reference: r,
                why: engine.explain(&err),
            });
        }
        let desc = unpacked.map_err(ImageError::lower)?;
        archive::remember(&cache, &desc).map_err(ImageError::lower)?;
        Ok(desc)
    })
    .await
    .map_err(ImageError::Task)?
}

/// Runs every future at once and returns their outputs in order.
async fn futures_join<F>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("a load task panicked"));
    }
    out
}
