//! The operator's side of an image delivery to a cluster's nodes:
//! [`crate::flow::image::push`] driven with the admin client as the loader. `xfer image push --cluster`
//! and `xfer-launch deploy` (a node lacking `[launch] image`) both use it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::ask::{admin, AskError};
use crate::config::auth::Credential;
use crate::config::cluster::{Cluster, ClusterError};
use crate::engine::topology::DEFAULT_DEGREE;
use crate::flow::image::{push, ImageError, ImagePushOptions};
pub use crate::flow::image::{ImagePushSummary, NodeImage, Note};
use crate::flow::route::Destination;
use crate::image::runtime::Runtime;
use crate::transport::select::TransportChoice;
use crate::util::progress::Progress;
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::image::{BadReference, ContainerRuntime};

/// Why an image was not delivered to the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterImageError {
    /// The reference is not one a node's engine may be asked for.
    #[error(transparent)]
    Reference(#[from] BadReference),
    /// `--nodes` names a node the cluster file lacks.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// No cache folder for the saved blobs.
    #[error(transparent)]
    Cache(#[from] NoCache),
    /// The delivery failed.
    #[error(transparent)]
    Push(#[from] ImageError),
}

/// Neither `XDG_CACHE_HOME` nor `HOME` is set.
#[derive(Debug, thiserror::Error)]
#[error("neither XDG_CACHE_HOME nor HOME is set; give --cache DIR")]
pub struct NoCache;

/// `$XDG_CACHE_HOME/xfer/images`, else `~/.cache/xfer/images`: where the
/// operator's machine keeps the blobs it saved, so a second delivery
/// saves nothing again.
pub fn default_cache() -> Result<PathBuf, NoCache> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or(NoCache)?;
    Ok(base.join("xfer").join("images"))
}

/// Delivers `reference`, as the operator's `engine` holds it, to `nodes` of
/// `cluster` with the defaults of `xfer image push`: every node loads it
/// and reports its id (a node that holds it already takes nothing).
pub async fn push_to_cluster(
    cluster: &Cluster,
    cred: Arc<Credential>,
    nodes: &[String],
    reference: &str,
    engine: ContainerRuntime,
    progress: Progress,
    note: &(dyn Fn(Note) + Sync),
) -> Result<ImagePushSummary, ClusterImageError> {
    xfer_proto::image::check_reference(reference)?;
    let opts = ImagePushOptions {
        reference: reference.to_string(),
        engine: Runtime::new(engine),
        dests: Destination::of_cluster(cluster, nodes)?,
        cred,
        cache: default_cache()?,
        transport: TransportChoice::Auto,
        chunk_size: xfer_proto::manifest::ChunkSize::Auto,
        limit_rate: None,
        connect_timeout: Duration::from_secs(5),
        connections: crate::transport::lanes::default_connections(),
        peers: DEFAULT_DEGREE,
    };
    Ok(push(&opts, progress, note, load).await?)
}

/// The loader [`push`] asks each node with: one admin exchange.
pub async fn load(
    cred: Arc<Credential>,
    d: Destination,
    req: AdminRequest,
    limit: Duration,
) -> Result<AdminReply, AskError> {
    admin(&cred, d.label(), &d.agent, &req, limit).await
}
