//! The commands that talk to a cluster's agents: `xfer sync` (hand a job
//! over and return, or follow it with `--wait`), `xfer status` (one table
//! across nodes; an unreachable agent shows as such within the timeout),
//! `xfer cancel` and `xfer rm`. Each asks every agent over the cluster's
//! mutually authenticated QUIC, one short exchange per agent, in parallel.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::job::{new_id, JobMember, JobSource, JobSpec};
use super::status::{AgentStatus, ModelState, ModelStatus};
use crate::agent::client::{admin, ASK_TIMEOUT};
use crate::config::auth::Credential;
use crate::config::cluster::{Cluster, Node};
use crate::transport::select::TransportChoice;
use xfer_proto::admin::{AdminReply, AdminRequest, JobState};
use xfer_proto::names::ModelName;
use xfer_proto::repo::{RepoRef, RepoType};
use xfer_proto::text::{wrap, Table};
use xfer_proto::units::{Bytes, Rate};

/// What `xfer sync` was asked to do.
#[derive(Debug, Clone)]
pub struct SyncRequest {
    /// An absolute path on the source node, or `ORG/NAME[@REV]`.
    pub source: String,
    /// The nodes to hold the model (`--nodes`; empty: all).
    pub nodes: Vec<String>,
    /// The node that holds the path or pulls the repo (default: the first
    /// selected node).
    pub from: Option<String>,
    /// The model's name on the nodes (`--name`).
    pub name: Option<String>,
    /// The kind of Hub repo (`--repo-type`).
    pub repo_type: RepoType,
    /// The chunk size, in bytes.
    pub chunk_size: u64,
    /// Caps the source's send rate, in bytes per second.
    pub limit_rate: Option<u64>,
    /// The data plane the source node offers.
    pub transport: TransportChoice,
    /// Peer links per receiver, at most.
    pub peers: Option<u32>,
}

/// Builds the job and hands it to every agent involved, asking with
/// `cred` (the cluster's credential, loaded once by the caller). Returns
/// the job.
pub async fn sync(cluster: &Cluster, cred: &Arc<Credential>, req: &SyncRequest) -> Result<JobSpec> {
    let members = cluster.select(&req.nodes)?;
    let source_node = match &req.from {
        Some(n) => cluster
            .node(n)
            .with_context(|| format!("--from {n}: no such node in {}", cluster.path.display()))?,
        None => members[0],
    };
    let (source, name) = if req.source.starts_with('/') {
        let path = PathBuf::from(&req.source);
        let name = match &req.name {
            Some(n) => n.clone(),
            None => path
                .file_name()
                .and_then(|n| n.to_str())
                .context("the source path has no folder name; pass --name")?
                .to_string(),
        };
        (JobSource::Path(path), name)
    } else if req.source.contains('/') {
        let repo = RepoRef::parse(&req.source, req.repo_type).map_err(anyhow::Error::msg)?;
        let folder = repo.cache_folder();
        if req.name.as_ref().is_some_and(|n| n != &folder) {
            bail!("a Hub repo is stored as {folder} (the HF cache layout); drop --name");
        }
        (
            JobSource::Hub {
                repo: req.source.clone(),
                repo_type: req.repo_type.as_str().to_string(),
            },
            folder,
        )
    } else {
        bail!(
            "`{}` is neither an absolute path on {} nor ORG/NAME[@REV]; give one of those",
            req.source,
            source_node.name
        );
    };
    let spec = JobSpec {
        id: new_id(),
        name: ModelName::new(&name).map_err(anyhow::Error::msg)?,
        source,
        source_node: source_node.name.to_string(),
        members: members
            .iter()
            .map(|n| JobMember {
                node: n.name.to_string(),
                agent: n.agent.clone(),
                data: n.data_addr(),
            })
            .collect(),
        chunk_size: req.chunk_size,
        limit_rate: req.limit_rate,
        transport: req.transport,
        peers: req.peers,
    };
    spec.validate().map_err(anyhow::Error::msg)?;
    let mut involved: Vec<&Node> = members.clone();
    if !involved.iter().any(|n| n.name == source_node.name) {
        involved.push(source_node);
    }
    let asks = involved.iter().map(|n| {
        let msg = AdminRequest::SyncJob {
            node: n.name.to_string(),
            job: spec.clone(),
        };
        let (cred, agent, node) = (cred.clone(), n.agent.clone(), n.name.to_string());
        async move {
            let reply = admin(&cred, &node, &agent, &msg, Duration::from_secs(5)).await;
            (node, reply)
        }
    });
    let replies = futures_join(asks).await;
    for (node, r) in replies {
        match r {
            Ok(AdminReply::JobAccepted { .. }) => {}
            Ok(AdminReply::Failed(why)) if node == spec.source_node => {
                bail!("{node} refused the job: {why}")
            }
            Ok(AdminReply::Failed(why)) => eprintln!("warning: {node} refused the job: {why}"),
            Ok(other) => bail!("{node} answered {} to a sync job; upgrade xfer there", other.kind()),
            Err(e) if node == spec.source_node => bail!(
                "the source node {node} did not take the job: {e}; is its agent running?"
            ),
            Err(e) => eprintln!(
                "warning: {node} did not take the job now ({e}); the source delivers to it when it is back"
            ),
        }
    }
    Ok(spec)
}

/// Runs futures concurrently and collects their outputs in order.
async fn futures_join<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("status task"));
    }
    out
}

/// One node's answer to `xfer status`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct NodeReport {
    /// The node's name.
    pub node: String,
    /// Its agent's address.
    pub agent: String,
    /// Whether its agent answered.
    pub reachable: bool,
    /// Why it did not, or what it answered instead of a status.
    pub error: Option<String>,
    /// Its status, when it answered.
    pub status: Option<AgentStatus>,
}

/// Asks every selected node for its status, in parallel.
pub async fn status(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    nodes: &[String],
) -> Result<Vec<NodeReport>> {
    let asks = cluster.select(nodes)?.into_iter().map(|n| {
        let (cred, node, agent) = (cred.clone(), n.name.to_string(), n.agent.clone());
        async move {
            match admin(&cred, &node, &agent, &AdminRequest::Status, ASK_TIMEOUT).await {
                Ok(AdminReply::Status(s)) => NodeReport {
                    node,
                    agent,
                    reachable: true,
                    error: None,
                    status: Some(s),
                },
                Ok(other) => NodeReport {
                    node,
                    agent,
                    reachable: true,
                    error: Some(format!("answered {}; upgrade xfer there", other.kind())),
                    status: None,
                },
                Err(e) => NodeReport {
                    node,
                    agent,
                    reachable: false,
                    error: Some(e.to_string()),
                    status: None,
                },
            }
        }
    });
    Ok(futures_join(asks).await)
}

/// The status table, one line per node and model, fitted to `width`
/// columns (`None`: no limit): a model name too long is elided (it is whole
/// in `--json`), a root shown by its first 12 hex digits, and an error or a
/// fallback wrapped on indented lines under its row, never cut.
pub fn render(reports: &[NodeReport], width: Option<usize>) -> String {
    let mut t = Table::new(
        &["NODE", "MODEL", "ROOT", "STATE", "DONE", "RATE", "ETA"],
        &[1, 0],
    );
    let dash = || "-".to_string();
    for r in reports {
        let Some(s) = &r.status else {
            t.row(
                vec![
                    r.node.clone(),
                    dash(),
                    dash(),
                    "unreachable".into(),
                    dash(),
                    dash(),
                    dash(),
                ],
                r.error.iter().map(|e| format!("error: {e}")).collect(),
            );
            continue;
        };
        if s.models.is_empty() {
            t.row(
                vec![
                    r.node.clone(),
                    dash(),
                    dash(),
                    "idle".into(),
                    dash(),
                    dash(),
                    dash(),
                ],
                Vec::new(),
            );
        }
        // A complete blob of an image shows as its image, below.
        for m in s.models.iter().filter(|m| {
            m.state != ModelState::Complete
                || xfer_proto::image::Digest::of_model(&m.name).is_none()
        }) {
            let details = m
                .last_error
                .iter()
                .map(|e| format!("last error: {e}"))
                .collect();
            t.row(row(&r.node, m), details);
        }
    }
    let mut out = t.render(width);
    out.push_str(&render_images(reports, width));
    // Never silent: every pair whose data went over management.
    let mut seen = Vec::new();
    for m in reports
        .iter()
        .filter_map(|r| r.status.as_ref())
        .flat_map(|s| &s.models)
    {
        for f in &m.fallbacks {
            let line = format!("{}: {f}", m.name);
            if !seen.contains(&line) {
                out.push_str(&wrap(&line, width, 4));
                out.push('\n');
                seen.push(line);
            }
        }
    }
    out
}

/// The images table: one line per node and image it loaded; a state that
/// is an error goes on an indented line under its row.
fn render_images(reports: &[NodeReport], width: Option<usize>) -> String {
    let mut t = Table::new(&["NODE", "IMAGE", "ID", "SIZE", "LAYERS", "STATE"], &[1, 0]);
    let mut any = false;
    for r in reports {
        for i in r.status.iter().flat_map(|s| &s.images) {
            any = true;
            let (state, detail) = match &i.engine_id {
                None => (
                    "loaded".to_string(),
                    Some("no engine to ask now".to_string()),
                ),
                Some(Ok(id)) if *id == i.id => ("loaded".to_string(), None),
                Some(Ok(id)) => (
                    "replaced".to_string(),
                    Some(format!(
                        "the engine now holds {} under this name",
                        id.short()
                    )),
                ),
                Some(Err(e)) => ("unknown".to_string(), Some(e.clone())),
            };
            t.row(
                vec![
                    r.node.clone(),
                    i.reference.clone(),
                    i.id.short(),
                    Bytes(i.bytes).to_string(),
                    i.layers.to_string(),
                    state,
                ],
                detail.into_iter().collect(),
            );
        }
    }
    if !any {
        return String::new();
    }
    format!("\n{}", t.render(width))
}

fn row(node: &str, m: &ModelStatus) -> Vec<String> {
    let pct = if m.bytes_total == 0 {
        if m.state == ModelState::Complete {
            "100%".into()
        } else {
            "-".into()
        }
    } else {
        format!("{:.1}%", m.bytes_held as f64 * 100.0 / m.bytes_total as f64)
    };
    vec![
        node.to_string(),
        m.name.clone(),
        m.root.map(|r| r.short()).unwrap_or_else(|| "-".into()),
        m.state.label().to_string(),
        pct,
        if m.rate_bps > 0.0 {
            Rate(m.rate_bps).to_string()
        } else {
            "-".into()
        },
        m.eta_s
            .map(|e| format!("{e:.0}s"))
            .unwrap_or_else(|| "-".into()),
    ]
}

/// Follows job `spec` until every member holds its model complete with one
/// root (or the job fails); prints progress on stderr when it is a terminal.
pub async fn wait(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    spec: &JobSpec,
    progress: &crate::util::progress::Progress,
) -> Result<String> {
    let names: Vec<String> = spec.members.iter().map(|m| m.node.clone()).collect();
    let bars: Vec<_> = names.iter().map(|n| progress.bytes(n, 0)).collect();
    let started = Instant::now();
    let mut started_at = vec![false; names.len()];
    loop {
        let reports = status(cluster, cred, &names).await?;
        let mut roots = Vec::new();
        for (i, (r, bar)) in reports.iter().zip(&bars).enumerate() {
            let m = r
                .status
                .as_ref()
                .and_then(|s| s.models.iter().find(|m| m.name == spec.name.as_str()));
            match m {
                Some(m) => {
                    bar.set_length(m.bytes_total);
                    if !started_at[i] {
                        // What the node held before counts as held, not
                        // as moved now.
                        started_at[i] = true;
                        bar.resume_at(m.bytes_held);
                    }
                    bar.set_position(m.bytes_held);
                    bar.set_message(m.state.label());
                    if m.state == ModelState::Complete {
                        roots.push(m.root);
                    }
                }
                None => bar.set_message(if r.reachable { "queued" } else { "unreachable" }),
            }
        }
        let source = status(cluster, cred, std::slice::from_ref(&spec.source_node)).await?;
        let job = source
            .first()
            .and_then(|r| r.status.as_ref())
            .and_then(|s| s.jobs.iter().find(|j| j.id == spec.id).cloned());
        if let Some(j) = &job {
            if matches!(j.state, JobState::Failed { .. } | JobState::Cancelled) {
                bail!("job {} {}", spec.id, j.shown());
            }
        }
        let all_done = roots.len() == names.len()
            && roots.iter().all(|r| r.is_some() && *r == roots[0])
            && job
                .as_ref()
                .is_some_and(|j| matches!(j.state, JobState::Complete { .. }));
        if all_done {
            for b in &bars {
                b.finish_with_message("complete");
            }
            return Ok(roots[0].map(|r| r.to_hex()).unwrap_or_default());
        }
        if started.elapsed() > Duration::from_secs(7 * 24 * 3600) {
            bail!("gave up waiting");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Why one node did not do what `cancel` or `remove` asked.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// The node refused, saying why.
    #[error("{0}")]
    Refused(xfer_proto::refusal::Refusal),
    /// The node answered with another kind of reply.
    #[error("answered {0}")]
    Unexpected(&'static str),
    /// The node could not be asked (the client's words).
    #[error(transparent)]
    Unreachable(crate::agent::client::AskError),
}

/// Cancels job `id` on every node; returns the nodes that knew it.
pub async fn cancel(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    id: &str,
) -> Result<Vec<(String, Result<bool, AskError>)>> {
    let asks = cluster.nodes.iter().map(|n| {
        let (cred, node, agent) = (cred.clone(), n.name.to_string(), n.agent.clone());
        let msg = AdminRequest::CancelJob { id: id.to_string() };
        async move {
            let r = match admin(&cred, &node, &agent, &msg, ASK_TIMEOUT).await {
                Ok(AdminReply::JobCancelled { known, .. }) => Ok(known),
                Ok(AdminReply::Failed(why)) => Err(AskError::Refused(why)),
                Ok(other) => Err(AskError::Unexpected(other.kind())),
                Err(e) => Err(AskError::Unreachable(e)),
            };
            (node, r)
        }
    });
    Ok(futures_join(asks).await)
}

/// Removes model `name` from the selected nodes.
pub async fn remove(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    nodes: &[String],
    name: &ModelName,
    force: bool,
) -> Result<Vec<(String, Result<bool, AskError>)>> {
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
                Err(e) => Err(AskError::Unreachable(e)),
            };
            (node, r)
        }
    });
    Ok(futures_join(asks).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's status as the wire carries it (built from JSON so fields
    /// added later with `#[serde(default)]` need no edit here).
    fn node(name: &str, models: serde_json::Value) -> NodeReport {
        let status: AgentStatus = serde_json::from_value(serde_json::json!({
            "node": name, "root": "/models", "models": models, "jobs": [], "images": []
        }))
        .expect("a status");
        NodeReport {
            node: name.into(),
            agent: "127.0.0.1:7000".into(),
            reachable: true,
            error: None,
            status: Some(status),
        }
    }

    /// At 100 columns no line of the table is wider, a long model name is
    /// elided, and an error is wrapped under its row with every word kept.
    #[test]
    fn the_status_table_fits_100_columns_and_keeps_errors_whole() {
        let error = "cannot write /models/.staging/meta-llama--Llama-3.1-70B-Instruct/model-00017-of-00030.safetensors: No space left on device (os error 28); free 40.2 GiB on /models or move --root";
        let model = serde_json::json!({
            "name": "meta-llama--Llama-3.1-70B-Instruct-with-a-much-longer-name-than-fits",
            "root": null, "state": "syncing", "bytes_total": 141_000_000_000u64,
            "bytes_held": 70_000_000_000u64, "rate_bps": 21_000_000.0, "eta_s": 3400.0,
            "from_source": 0, "from_peers": 0, "last_error": error, "repaired_files": 0
        });
        let mut unreachable = node("node-b", serde_json::json!([]));
        unreachable.status = None;
        unreachable.reachable = false;
        unreachable.error = Some(format!("{}: {error}", "x".repeat(130)));
        let reports = [node("node-a", serde_json::json!([model])), unreachable];
        let shown = render(&reports, Some(100));
        for l in shown.lines() {
            assert!(
                l.chars().count() <= 100,
                "{} columns: {l:?}",
                l.chars().count()
            );
        }
        let words: Vec<&str> = shown.split_whitespace().collect();
        for w in error.split_whitespace() {
            assert!(words.contains(&w), "{w} lost:\n{shown}");
        }
        assert!(shown.contains('…'), "{shown}");
        assert!(shown.contains("20.0 MiB/s"), "{shown}");
        // Without a terminal nothing is elided.
        assert!(render(&reports, None).contains("with-a-much-longer-name-than-fits"));
    }
}
