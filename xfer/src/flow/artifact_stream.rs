//! A ModelPack artifact fanned out while it downloads (`xfer sync
//! oci://`, on the job's source node): its raw layers, each one file of
//! the model, are the files of one draft; each layer's fetch feeds its
//! file ([`LayerFeed`]: every chunk's BLAKE3 hash announced as soon as the
//! chunk is in, the file sealed once the whole layer matched its registry
//! digest, withdrawn when the fetch starts over), and the draft streams to
//! the nodes ([`crate::flow::stream`]) as the layers arrive, in the
//! manifest's order. Tar layers (configs, tokenizers: small) are fetched
//! and unpacked with the rest, and reach the nodes in the round after the
//! stream, which delivers the whole placed folder (moving only what a node
//! still lacks). Nothing is placed on a node before its seal.

use std::path::Path;

use xfer_proto::draft::{Draft, DraftError};
use xfer_proto::relpath::RelPath;

use futures_util::{FutureExt as _, StreamExt as _};

use crate::flow::feed::DraftFeed;
use crate::flow::layer_stream::LayerFeed;
use crate::flow::push::{self, NodeSummary, PushError, PushOptions};
use crate::flow::stream;
use crate::image::registry::artifact::{self, ModelPlan, Placing};
use crate::image::registry::client::{BlobWatch, Registry, RegistryFailure};
use crate::util::permanence::Permanence;
use crate::util::progress::Progress;

/// Layers fetched at once (dockerd's default `max-concurrent-downloads`).
pub const LAYERS_AT_ONCE: usize = 3;

/// Why [`fetch_streaming`] did not fetch and place the artifact.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactStreamError {
    /// The push names no model.
    #[error("a streamed artifact needs its model's name")]
    NoName,
    /// The raw layers do not make a draft.
    #[error("{0}")]
    Draft(DraftError),
    /// A layer could not be fetched, or the model's files placed (a
    /// refusal of the registry, a layer that leaves the folder, a planted
    /// symlink: permanent).
    #[error("{0}")]
    Registry(RegistryFailure),
    /// The stream to the nodes failed.
    #[error("{0}")]
    Stream(PushError),
    /// The stream's task failed (panicked or was cancelled).
    #[error("the stream task failed: {0}")]
    Task(tokio::task::JoinError),
}

impl Permanence for ArtifactStreamError {
    fn is_permanent(&self) -> bool {
        match self {
            ArtifactStreamError::Registry(e) => e.is_permanent(),
            ArtifactStreamError::Stream(e) => e.is_permanent(),
            ArtifactStreamError::NoName
            | ArtifactStreamError::Draft(_)
            | ArtifactStreamError::Task(_) => false,
        }
    }
}

/// What [`fetch_streaming`] did.
#[derive(Debug)]
pub struct Fetched {
    /// When the last layer was in (fetched and checked).
    pub downloaded_at: std::time::Instant,
    /// Files placed in the folder, and their bytes.
    pub files: usize,
    /// The bytes of those files.
    pub bytes: u64,
    /// Bytes downloaded from the registry (0: all were cached).
    pub bytes_fetched: u64,
    /// The stream's outcome per node (empty: nothing was streamed).
    pub streamed: Vec<NodeSummary>,
}

/// Fetches `plan`'s layers from `reg` into the blob cache `blobs` while
/// streaming its raw layers to `push.to` as `push.name` at `chunk_size`,
/// then places the model's files under `model` (linked from the blobs).
pub async fn fetch_streaming(
    reg: &Registry,
    plan: &ModelPlan,
    blobs: &Path,
    model: &Path,
    push: &PushOptions,
    chunk_size: u64,
) -> Result<Fetched, ArtifactStreamError> {
    let layers = plan.layers();
    let mut raw: Vec<(RelPath, u64)> = layers
        .iter()
        .filter_map(|(l, p)| Some((p.clone()?, l.size)))
        .collect();
    raw.sort();
    let name = push.name.clone().ok_or(ArtifactStreamError::NoName)?;
    // Each raw layer's file in the draft (its index in path order).
    let mut feeds: Vec<Option<LayerFeed>> = Vec::new();
    let mut streaming = None;
    if !raw.is_empty() && !push.to.is_empty() {
        let draft = Draft::new(chunk_size, raw.clone()).map_err(ArtifactStreamError::Draft)?;
        let feed = DraftFeed::new(draft, &plan.manifest.to_string());
        for (l, p) in &layers {
            feeds.push(p.as_ref().map(|p| {
                let file = raw.iter().position(|(q, _)| q == p).expect("listed") as u32;
                LayerFeed::file_of(
                    feed.clone(),
                    (file, chunk_size),
                    l.digest,
                    l.size,
                    blobs,
                    Registry::partial_path(blobs, l),
                )
            }));
        }
        let mut paths: Vec<_> = feeds
            .iter()
            .flatten()
            .map(|f| (f.file(), f.paths().remove(0)))
            .collect();
        paths.sort_by_key(|(i, _)| *i);
        let paths = paths.into_iter().map(|(_, p)| p).collect();
        let (push, name) = (push.clone(), name.clone());
        // Dropped (a failed fetch, a cancelled job) closes the stream; the
        // nodes keep what they staged for the next round.
        streaming = Some(push::AbortOnDrop(tokio::spawn(async move {
            stream::stream(&push, &name, feed, paths, &Progress::new(false)).await
        })));
    }
    let mut fetched = 0;
    let mut all_sealed = true;
    // A few layers at once, as dockerd pulls: a registry (or the CDN
    // behind it) that caps each connection is not read one layer at a
    // time, and a layer's last steps (made durable, moved into the cache)
    // overlap the next one's bytes. Each is sealed as soon as it matched
    // its digest.
    let mut fetches = Vec::with_capacity(layers.len());
    for (i, (l, _)) in layers.iter().enumerate() {
        let watch: Option<&LayerFeed> = feeds.get(i).and_then(|f| f.as_ref());
        fetches.push(
            async move {
                let got = reg
                    .blob_watched(l, blobs, watch.map(|w| w as &dyn BlobWatch))
                    .await;
                (l, watch, got)
            }
            .boxed(),
        );
    }
    let mut fetching = futures_util::stream::iter(fetches).buffer_unordered(LAYERS_AT_ONCE);
    while let Some((l, watch, got)) = fetching.next().await {
        fetched += got.map_err(|e| ArtifactStreamError::Registry(e.into()))?;
        if let Some(w) = watch {
            if !w.seal() {
                all_sealed = false;
                tracing::warn!(
                    "layer {} could not be sealed in the stream; the round after it delivers it",
                    l.digest
                );
            }
        }
    }
    let downloaded_at = std::time::Instant::now();
    let (files, bytes) = artifact::place_model(plan, blobs, model, Placing::Link)
        .await
        .map_err(|e| ArtifactStreamError::Registry(e.into()))?;
    // A draft that cannot be sealed whole never ends: its stream is
    // dropped, and the round after it delivers everything.
    let streamed = match streaming.filter(|_| all_sealed) {
        Some(mut s) => (&mut s.0)
            .await
            .map_err(ArtifactStreamError::Task)?
            .map_err(ArtifactStreamError::Stream)?,
        None => Vec::new(),
    };
    Ok(Fetched {
        downloaded_at,
        files,
        bytes,
        bytes_fetched: fetched,
        streamed,
    })
}
