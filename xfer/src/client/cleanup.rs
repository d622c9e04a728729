//! `xfer cancel` (a job stopped on every node), `xfer rm` (a model off
//! the selected nodes) and `xfer prune` (ended jobs off the selected
//! nodes, after every node is asked which jobs ended). Each node answers
//! for itself: its outcome, or the [`AskError`] of why not.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::ask::{admin, all, AskError, ASK_TIMEOUT};
use super::status::{ended_jobs, status};
use crate::config::auth::Credential;
use crate::config::cluster::{Cluster, ClusterError};
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::names::ModelName;

/// Cancels job `id` on every node; returns the nodes that knew it.
pub async fn cancel(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    id: &str,
) -> Vec<(String, Result<bool, AskError>)> {
    let asks = cluster.nodes.iter().map(|n| {
        let (cred, node, agent) = (cred.clone(), n.name.to_string(), n.agent.clone());
        let msg = AdminRequest::CancelJob { id: id.to_string() };
        async move {
            let r = match admin(&cred, &node, &agent, &msg, ASK_TIMEOUT).await {
                Ok(AdminReply::JobCancelled { known, .. }) => Ok(known),
                Ok(AdminReply::Failed(why)) => Err(AskError::Refused(why)),
                Ok(other) => Err(AskError::Unexpected(other.kind())),
                Err(e) => Err(e),
            };
            (node, r)
        }
    });
    all(asks).await
}

/// Removes model `name` from the selected nodes.
pub async fn remove(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    nodes: &[String],
    name: &ModelName,
    force: bool,
) -> Result<Vec<(String, Result<bool, AskError>)>, ClusterError> {
    let asks = cluster.select(nodes)?.into_iter().map(|n| {
        let (cred, node, agent) = (cred.clone(), n.name.to_string(), n.agent.clone());
        let msg = AdminRequest::RemoveModel {
            name: name.clone(),
            force,
        };
        async move {
            let r = match admin(&cred, &node, &agent, &msg, Duration::from_secs(30)).await {
                Ok(AdminReply::ModelRemoved { existed, .. }) => Ok(existed),
                Ok(AdminReply::Failed(why)) => Err(AskError::Refused(why)),
                Ok(other) => Err(AskError::Unexpected(other.kind())),
                Err(e) => Err(e),
            };
            (node, r)
        }
    });
    Ok(all(asks).await)
}

/// One node's answer to `xfer prune`; `--json` prints it, the error as
/// its one line.
#[derive(Debug, Serialize)]
pub struct PruneReport {
    /// The node's name.
    pub node: String,
    /// The job records it removed.
    pub pruned: Vec<xfer_proto::admin::PrunedJob>,
    /// Why it removed nothing: unreachable, refused, or another answer.
    #[serde(serialize_with = "as_line")]
    pub error: Option<AskError>,
}

/// An error as the line it reads as (`null` when there is none).
fn as_line<S: serde::Serializer>(e: &Option<AskError>, s: S) -> Result<S::Ok, S::Error> {
    match e {
        Some(e) => s.collect_str(e),
        None => s.serialize_none(),
    }
}

/// Removes ended jobs (complete, cancelled, failed) from the selected
/// nodes: first asks every node of the cluster for its jobs, so a member
/// whose copy of a job never heard of its end learns it from the source's
/// record ([`ended_jobs`]); a running job and model data are never
/// touched.
pub async fn prune(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    nodes: &[String],
) -> Result<Vec<PruneReport>, ClusterError> {
    let targets = cluster.select(nodes)?;
    let ended = ended_jobs(&status(cluster, cred, &[]).await?);
    let asks = targets.into_iter().map(|n| {
        let (cred, node, agent) = (cred.clone(), n.name.to_string(), n.agent.clone());
        let msg = AdminRequest::PruneJobs {
            ended: ended.clone(),
        };
        async move {
            let (pruned, error) = match admin(&cred, &node, &agent, &msg, ASK_TIMEOUT).await {
                Ok(AdminReply::JobsPruned { jobs }) => (jobs, None),
                Ok(AdminReply::Failed(why)) => (Vec::new(), Some(AskError::Refused(why))),
                Ok(other) => (Vec::new(), Some(AskError::Unexpected(other.kind()))),
                Err(e) => (Vec::new(), Some(e)),
            };
            PruneReport {
                node,
                pruned,
                error,
            }
        }
    });
    Ok(all(asks).await)
}

/// One node's answer to `xfer gc`: its report, or why not.
#[derive(Debug, Serialize)]
pub struct GcAnswer {
    /// The node's name.
    pub node: String,
    /// Its budget, models and evictions.
    pub report: Option<xfer_proto::admin::GcReport>,
    /// Why there is no report: unreachable, refused (nothing could make
    /// the room, naming what holds it), or another answer.
    #[serde(serialize_with = "as_line")]
    pub error: Option<AskError>,
}

/// Asks the selected nodes to evict within their budgets (`need`: room
/// for that many more bytes; else down to the low watermark), or with
/// `dry_run` only to say what would go.
pub async fn gc(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    nodes: &[String],
    dry_run: bool,
    need: Option<u64>,
) -> Result<Vec<GcAnswer>, ClusterError> {
    let asks = cluster.select(nodes)?.into_iter().map(|n| {
        let (cred, node, agent) = (cred.clone(), n.name.to_string(), n.agent.clone());
        let msg = AdminRequest::Gc { dry_run, need };
        async move {
            let (report, error) =
                match admin(&cred, &node, &agent, &msg, Duration::from_secs(120)).await {
                    Ok(AdminReply::Gc(r)) => (Some(r), None),
                    Ok(AdminReply::Failed(why)) => (None, Some(AskError::Refused(why))),
                    Ok(other) => (None, Some(AskError::Unexpected(other.kind()))),
                    Err(e) => (None, Some(e)),
                };
            GcAnswer {
                node,
                report,
                error,
            }
        }
    });
    Ok(all(asks).await)
}

/// Pins (or unpins) model `name` on the selected nodes.
pub async fn pin(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    nodes: &[String],
    name: &ModelName,
    pinned: bool,
) -> Result<Vec<(String, Result<bool, AskError>)>, ClusterError> {
    let asks = cluster.select(nodes)?.into_iter().map(|n| {
        let (cred, node, agent) = (cred.clone(), n.name.to_string(), n.agent.clone());
        let msg = AdminRequest::Pin {
            name: name.clone(),
            pinned,
        };
        async move {
            let r = match admin(&cred, &node, &agent, &msg, ASK_TIMEOUT).await {
                Ok(AdminReply::Pinned { pinned, .. }) => Ok(pinned),
                Ok(AdminReply::Failed(why)) => Err(AskError::Refused(why)),
                Ok(other) => Err(AskError::Unexpected(other.kind())),
                Err(e) => Err(e),
            };
            (node, r)
        }
    });
    Ok(all(asks).await)
}
