//! The operator's side of an image delivery to a cluster's nodes:
//! [`crate::flow::image::push`] driven with the admin client as the loader. `xfer image push --cluster`
//! and `xfer-launch deploy` (a node lacking `[launch] image`) both use it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::ask::{admin, AskError};
use crate::config::auth::Credential;
use crate::config::cluster::Cluster;
use crate::engine::topology::DEFAULT_DEGREE;
use crate::flow::image::{push, ImagePushOptions};
pub use crate::flow::image::{ImagePushSummary, NodeImage, Note};
use crate::flow::route::Destination;
use crate::image::runtime::Runtime;
use crate::transport::select::TransportChoice;
use crate::util::progress::Progress;
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::image::ContainerRuntime;

/// `$XDG_CACHE_HOME/xfer/images`, else `~/.cache/xfer/images`: where the
/// operator's machine keeps the blobs it saved, so a second delivery
/// saves nothing again.
pub fn default_cache() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or_else(|| {
            anyhow::anyhow!("neither XDG_CACHE_HOME nor HOME is set; give --cache DIR")
        })?;
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
) -> Result<ImagePushSummary> {
    xfer_proto::image::check_reference(reference).map_err(anyhow::Error::msg)?;
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
