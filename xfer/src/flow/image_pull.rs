//! `xfer image pull`: an image fetched once from its registry and
//! delivered to nodes like a model. The manifest is read (an index's entry
//! for the nodes' platform picked), then the config and the layers are
//! fetched into the same blob cache `xfer image push` keeps, each checked
//! against its registry digest, and each blob is pushed through the swarm
//! as soon as it is in (while the next downloads). Every node's agent then
//! checks every blob against its digest again and loads the image into its
//! own engine from a stream built from the blobs ([`crate::image::loadtar`]),
//! so no node runs `docker pull` or `docker save`. Every node must report
//! the config's digest as the image's id.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::config::auth::Credential;
use crate::flow::image::{
    load_everywhere, Delivery, ImageError, ImagePushOptions, ImagePushSummary, Note, RegistryTally,
    Round,
};
use crate::flow::layer_stream::LayerFeed;
use crate::flow::push::{AbortOnDrop, PushOptions};
use crate::flow::route::Destination;
use crate::flow::stream;
use crate::image::archive;
use crate::image::registry::client::{BlobWatch, Registry, RegistryOptions};
use crate::image::registry::manifest::{self, Descriptor, Platform};
use crate::image::registry::reference::ImageRef;
use crate::util::progress::Progress;
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::image::{BlobRef, Digest, ImageDesc};
use xfer_proto::units::Bytes;

/// Where to pull from, for which platform.
#[derive(Clone, Debug)]
pub struct PullSource {
    /// The reference, parsed.
    pub image: ImageRef,
    /// How to reach its registry.
    pub registry: RegistryOptions,
    /// The platform to pick from a multi-platform index.
    pub platform: Platform,
}

/// Whether `d`'s agent address is one of this machine's own (an IP
/// address a socket here can bind to); a host name is taken as elsewhere.
fn on_this_machine(d: &Destination) -> bool {
    let host = d
        .agent
        .rsplit_once(':')
        .map_or(d.agent.as_str(), |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => std::net::UdpSocket::bind((ip, 0)).is_ok(),
        Err(_) => false,
    }
}

/// The part of an image config that names its layers' uncompressed
/// digests.
#[derive(Deserialize)]
struct Config {
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    diff_ids: Vec<Digest>,
}

/// Pulls `src` from its registry into `opts.cache` and delivers it to
/// `opts.dests` (`opts.reference` is the name the nodes load it under;
/// `opts.engine` is not used). A node's failure is in its node summary; an
/// `Err` fails the whole pull.
pub async fn pull<L, F, E>(
    src: &PullSource,
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
    let reg = Registry::new(&src.image, &src.registry).map_err(ImageError::lower)?;
    let resolved = reg
        .resolve(&src.platform)
        .await
        .map_err(ImageError::lower)?;
    let m = &resolved.manifest;
    if !manifest::CONFIGS.contains(&m.config.media_type.as_str()) {
        return Err(ImageError::NotLoadable(format!(
            "{} is not a container image (its config is `{}`{}); `xfer image pull` takes images, and `xfer sync oci://...` model artifacts",
            src.image,
            m.config.media_type,
            m.artifact_type
                .as_deref()
                .map(|t| format!(", artifact type `{t}`"))
                .unwrap_or_default()
        )));
    }
    if let Some(l) = m
        .layers
        .iter()
        .find(|l| !manifest::LAYERS.contains(&l.media_type.as_str()))
    {
        return Err(ImageError::NotLoadable(format!(
            "{} has a layer of type `{}`, which xfer does not load (it loads {}); pull it with the engine itself",
            src.image,
            l.media_type,
            manifest::LAYERS.join(", ")
        )));
    }
    let cache = opts.cache.clone();
    let (config_bytes, config_fetched) = reg
        .config(&m.config, &cache)
        .await
        .map_err(ImageError::lower)?;
    let config: Config = serde_json::from_slice(&config_bytes).map_err(|e| {
        ImageError::NotLoadable(format!(
            "the config of {} names no layers (rootfs.diff_ids): {e}",
            src.image
        ))
    })?;
    if config.rootfs.diff_ids.len() != m.layers.len() {
        return Err(ImageError::NotLoadable(format!(
            "{} is inconsistent: its manifest has {} layers and its config {}; the registry holds a damaged image",
            src.image,
            m.layers.len(),
            config.rootfs.diff_ids.len()
        )));
    }
    let blob = |d: &Descriptor| BlobRef {
        digest: d.digest,
        size: d.size,
    };
    let desc = ImageDesc {
        reference: opts.reference.clone(),
        config: blob(&m.config),
        layers: m.layers.iter().map(blob).collect(),
        diff_ids: config.rootfs.diff_ids,
    };
    desc.check().map_err(ImageError::BadImage)?;
    note(Note::Progress(format!(
        "{} ({}{}): {} layers, {}; each layer streamed to the nodes as it downloads",
        src.image,
        desc.id().short(),
        resolved
            .platform
            .as_ref()
            .map(|p| format!(", {p}"))
            .unwrap_or_default(),
        desc.layers.len(),
        Bytes(desc.bytes())
    )));

    let nic = crate::transport::select::choose(opts.transport).map_err(ImageError::lower)?;
    let mut delivery = Delivery::new(&opts.dests, opts.cred.clone(), nic, progress, cache.clone());
    // Each layer the cache lacks is fetched in turn and streamed to the
    // nodes while it downloads, chunk by chunk as its bytes land; its
    // stream's tail runs while the next layer downloads.
    let fetch_started = Instant::now();
    let mut registry_bytes = config_fetched;
    let mut first_push: Option<Instant> = None;
    let mut streams = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for l in &m.layers {
        if !seen.insert(l.digest) || archive::holds(&cache, &l.digest, l.size) {
            continue;
        }
        let streaming = match delivery.push_options(opts, l.digest) {
            Some(push) => {
                let chunk_size = push.chunk_size.for_bytes(l.size);
                let part = Registry::partial_path(&cache, l);
                let lf = Arc::new(
                    LayerFeed::new(l.digest, l.size, chunk_size, &cache, part)
                        .map_err(ImageError::Draft)?,
                );
                first_push.get_or_insert_with(Instant::now);
                // A node on this machine gets its own stream, from here
                // alone: in the swarm it would take most chunks from its
                // peers over this machine's downlink, which the registry's
                // bytes fill (measured: the fetch took twice its time).
                let (here, away): (Vec<Destination>, Vec<Destination>) =
                    push.to.iter().cloned().partition(on_this_machine);
                let tasks: Vec<_> = [here, away]
                    .into_iter()
                    .filter(|to| !to.is_empty())
                    .map(|to| {
                        let push = PushOptions { to, ..push.clone() };
                        let (feed, paths, name) = (lf.feed(), lf.paths(), l.digest.model());
                        let quiet = delivery.progress().clone();
                        AbortOnDrop(tokio::spawn(async move {
                            stream::stream(&push, &name, feed, paths, &quiet).await
                        }))
                    })
                    .collect();
                Some((lf, tasks))
            }
            None => None,
        };
        let watch = streaming
            .as_ref()
            .map(|(lf, _)| lf.as_ref() as &dyn BlobWatch);
        registry_bytes += reg
            .blob_watched(l, &cache, watch)
            .await
            .map_err(ImageError::lower)?;
        if let Some((lf, tasks)) = streaming {
            if !lf.seal() {
                note(Note::Warning(format!(
                    "layer {} could not be streamed to the end; it is pushed whole",
                    l.digest
                )));
            }
            streams.extend(tasks.into_iter().map(|t| (l.digest, l.size, t)));
        }
    }
    let streamed: std::collections::BTreeSet<Digest> = streams.iter().map(|(d, _, _)| *d).collect();
    for (digest, size, mut task) in streams {
        match (&mut task.0).await {
            Ok(Ok(nodes)) => delivery.tally(digest, size, &nodes, Round::Stream),
            Ok(Err(e)) => {
                tracing::warn!("the stream of layer {digest} failed: {e:#}; it is pushed whole")
            }
            Err(e) => {
                tracing::warn!("the stream of layer {digest} stopped: {e}; it is pushed whole")
            }
        }
    }
    // Then every blob, the config first, as a push: a node the stream
    // completed holds it already (nothing moves), another gets what it
    // lacks.
    let mut pushed = std::collections::BTreeSet::new();
    for d in std::iter::once(m.config.digest).chain(m.layers.iter().map(|l| l.digest)) {
        if pushed.insert(d) {
            first_push.get_or_insert_with(Instant::now);
            let round = match streamed.contains(&d) {
                true => Round::AfterStream,
                false => Round::Push,
            };
            delivery.blob(opts, d, &opts.reference, round).await?;
        }
    }
    let fetch_s = fetch_started.elapsed().as_secs_f64();
    let push_s = first_push.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let Delivery {
        mut nodes, blobs, ..
    } = delivery;
    let load_started = Instant::now();
    load_everywhere(
        &opts.dests,
        &mut nodes,
        &desc,
        &opts.reference,
        &opts.cred,
        &load,
    )
    .await;
    let summary = ImagePushSummary {
        image: opts.reference.clone(),
        id: desc.id(),
        layers: desc.layers.len(),
        bytes_total: desc.bytes(),
        bytes_sent: blobs.iter().map(|b| b.bytes_sent).sum(),
        bytes_skipped: blobs.iter().map(|b| b.bytes_skipped).sum(),
        cached: registry_bytes == 0,
        save_s: fetch_s,
        push_s,
        load_s: load_started.elapsed().as_secs_f64(),
        duration_s: started.elapsed().as_secs_f64(),
        blobs,
        nodes,
        registry: Some(RegistryTally {
            source: src.image.to_string(),
            manifest: resolved.digest,
            platform: resolved.platform.map(|p| p.to_string()),
            bytes_fetched: registry_bytes,
        }),
    };
    if summary.nodes.iter().any(|n| !n.ok) {
        archive::distrust(&cache, &desc);
    }
    Ok(summary)
}
