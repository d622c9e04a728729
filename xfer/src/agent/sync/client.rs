//! The commands that talk to a cluster's agents: `xfer sync` (hand a job
//! over and return, or follow it with `--wait`), `xfer status` (one table
//! across nodes; an unreachable agent shows as such within the timeout),
//! `xfer cancel`, `xfer rm` and `xfer prune` (ended jobs off every node).
//! Each asks every agent over the cluster's mutually authenticated QUIC,
//! one short exchange per agent, in parallel.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

/// What [`sync`] returns and [`wait`] follows.
pub use super::job::JobSpec;
use super::job::{new_id, JobMember, JobSource, Secret};
use super::source::{Reading, Verdict};
use super::status::{AgentStatus, JobView, ModelState, ModelStatus};
use crate::agent::client::{admin, ASK_TIMEOUT};
use crate::config::auth::Credential;
use crate::config::cluster::{Cluster, Node};
use crate::hub::env::HubSettings;
pub use crate::transport::select::TransportChoice;
use xfer_proto::admin::{AdminReply, AdminRequest, GiveUp, JobState};
use xfer_proto::manifest::ChunkSize;
use xfer_proto::names::ModelName;
use xfer_proto::repo::RepoType;
use xfer_proto::text::{wrap, Table};
use xfer_proto::units::{Bytes, Rate};

/// What `xfer sync` was asked to do.
#[derive(Debug, Clone)]
pub struct SyncRequest {
    /// SOURCE as written: a folder on the source node or a Hub repo, as
    /// [`super::source::read_source`] reads it.
    pub source: String,
    /// The operator's working directory, which `./x` and `ORG/NAME`
    /// folders are relative to.
    pub cwd: PathBuf,
    /// The nodes to hold the model (`--nodes`; empty: all).
    pub nodes: Vec<String>,
    /// The node that holds the path or pulls the repo (default: the first
    /// selected node); for a Hub repo, `a,b,c` (the first drives the job,
    /// all fetch ranges from the origin) or `all` (every member).
    pub from: Option<String>,
    /// The model's name on the nodes (`--name`).
    pub name: Option<String>,
    /// The kind of Hub repo (`--repo-type`).
    pub repo_type: RepoType,
    /// The chunk size (auto: from the model's size).
    pub chunk_size: ChunkSize,
    /// Caps the source's send rate, in bytes per second.
    pub limit_rate: Option<u64>,
    /// The data plane the source node offers.
    pub transport: TransportChoice,
    /// Peer links per receiver, at most.
    pub peers: Option<u32>,
    /// How the source node reaches an `oci://` source's registry.
    pub registry: RegistryAccess,
    /// How long the job retries without progress before it fails.
    pub give_up: GiveUp,
    /// For a Hub repo: the commit to sync the revision at, whatever the
    /// branch names when the job runs (`xfer-launch deploy` pins the one
    /// it read); `None`: the revision as the Hub resolves it then.
    pub pin: Option<String>,
}

/// How the source node reaches the registry of an `oci://` source.
#[derive(Debug, Clone, Default)]
pub struct RegistryAccess {
    /// Plain HTTP (`--insecure`).
    pub insecure: bool,
    /// A PEM file of CAs, read here and sent with the job (`--ca-file`).
    pub ca_file: Option<PathBuf>,
}

/// The prefix of a model artifact's SOURCE.
pub const OCI_PREFIX: &str = "oci://";

/// The job source and model name of `oci://REFERENCE`: the reference is
/// checked here, the model is named after the repository's last part
/// (`oci://reg/models/tiny:v2` is `tiny`, so a new tag updates it in
/// place) unless `--name` says otherwise.
fn oci_source(reference: &str, req: &SyncRequest) -> Result<(JobSource, String)> {
    let image = crate::image::registry::reference::ImageRef::parse(reference)
        .map_err(anyhow::Error::msg)?;
    let name = match &req.name {
        Some(n) => n.clone(),
        None => image
            .repository
            .rsplit('/')
            .next()
            .unwrap_or(&image.repository)
            .to_string(),
    };
    let ca_pem = match &req.registry.ca_file {
        Some(f) => {
            let pem = std::fs::read(f)
                .with_context(|| format!("--ca-file {}: cannot read it", f.display()))?;
            if pem.len() > xfer_proto::admin::MAX_OCI_CA_PEM {
                bail!(
                    "--ca-file {} has {} bytes; a job carries at most {} of CA certificates: give only the registry's CA",
                    f.display(),
                    pem.len(),
                    xfer_proto::admin::MAX_OCI_CA_PEM
                );
            }
            Some(
                String::from_utf8(pem)
                    .with_context(|| format!("--ca-file {} is not PEM text", f.display()))?,
            )
        }
        None => None,
    };
    Ok((
        JobSource::Oci {
            reference: reference.to_string(),
            insecure: req.registry.insecure,
            ca_pem,
        },
        name,
    ))
}

/// Builds the job and hands it to every agent involved, asking with
/// `cred` (the cluster's credential, loaded once by the caller). A Hub
/// job carries this process's own Hub settings ([`HubSettings::from_process`]:
/// `HF_ENDPOINT`, `HF_TOKEN` or the token file). Returns the job.
pub async fn sync(cluster: &Cluster, cred: &Arc<Credential>, req: &SyncRequest) -> Result<JobSpec> {
    let hub = if is_repo(&req.source) {
        HubSettings::from_process()?
    } else {
        HubSettings::default()
    };
    sync_with_hub(cluster, cred, req, &hub).await
}

/// The size of Hub repo `repo` at `revision` (`ORG/NAME`), read from the
/// listing with this process's Hub settings (`HF_ENDPOINT`, `HF_TOKEN`):
/// its commit and total bytes. Nothing is downloaded.
pub async fn hub_size(repo: &str, revision: &str, repo_type: RepoType) -> Result<(String, u64)> {
    let r = xfer_proto::repo::RepoRef::parse(&format!("{repo}@{revision}"), repo_type)
        .map_err(anyhow::Error::msg)?;
    let env = crate::hub::env::HubEnv::from_process()?;
    crate::hub::pull::listing_size(&r, &env).await
}

/// Whether `source` names a Hub repo (not an absolute path).
fn is_repo(source: &str) -> bool {
    !source.starts_with('/') && !source.starts_with('.') && source.contains('/')
}

/// [`sync`] with the operator's Hub settings given: the endpoint goes in
/// the job (every member sees it; `status` shows it), the token only in
/// the request to the source node, over the cluster's authenticated
/// channel, never in the job.
pub async fn sync_with_hub(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    req: &SyncRequest,
    hub: &HubSettings,
) -> Result<JobSpec> {
    let members = cluster.select(&req.nodes)?;
    let froms: Vec<&str> = match req.from.as_deref() {
        Some("all") => members.iter().map(|n| n.name.as_str()).collect(),
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect(),
        None => Vec::new(),
    };
    let source_node = match froms.first() {
        Some(n) => cluster
            .node(n)
            .with_context(|| format!("--from {n}: no such node in {}", cluster.path.display()))?,
        None => members[0],
    };
    let mut intake = Vec::new();
    for n in froms.iter().skip(1) {
        if !members.iter().any(|m| m.name.as_str() == *n) {
            bail!(
                "--from {n}: a node that fetches ranges from the Hub must be one that receives the model; add it to --nodes"
            );
        }
        if *n != source_node.name.as_str() && !intake.iter().any(|i: &String| i == n) {
            intake.push(n.to_string());
        }
    }
    let (source, name) = if let Some(reference) = req.source.strip_prefix(OCI_PREFIX) {
        oci_source(reference, req)?
    } else {
        let path = match super::source::read_source(&req.source, &req.cwd, req.repo_type)? {
            Reading::Folder(p) => Ok(p),
            Reading::Hub(repo) => Err(repo),
            Reading::Ask { text, cwd } => {
                let found = find_folder(cred, source_node, &text, &cwd).await?;
                let here = cwd.join(&text);
                let here = here.is_dir().then_some(here.as_path());
                match super::source::decide(
                    &text,
                    req.repo_type,
                    source_node.name.as_str(),
                    &found,
                    here,
                )? {
                    Verdict::Folder(p) => Ok(p),
                    Verdict::Hub(repo) => Err(repo),
                }
            }
        };
        match path {
            Ok(path) => {
                let name = match &req.name {
                    Some(n) => ModelName::from_user(n, req.repo_type)
                        .with_context(|| format!("--name {n}"))?
                        .to_string(),
                    None => path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .context("the source path has no folder name; name the model with --name")?
                        .to_string(),
                };
                (JobSource::Path(path), name)
            }
            Err(repo) => {
                crate::hub::env::check_online(&repo.id)?;
                let folder = repo.cache_folder();
                let given = match &req.name {
                    Some(n) => Some(
                        ModelName::from_user(n, req.repo_type)
                            .with_context(|| format!("--name {n}"))?,
                    ),
                    None => None,
                };
                if given.is_some_and(|n| n.as_str() != folder) {
                    bail!("a Hub repo is stored as {folder} (the HF cache layout); drop --name");
                }
                let text = if repo.revision == "main" && !req.source.contains('@') {
                    repo.id.clone()
                } else {
                    format!("{}@{}", repo.id, repo.revision)
                };
                (
                    JobSource::Hub {
                        repo: text,
                        repo_type: req.repo_type.as_str().to_string(),
                        pin: req.pin.clone(),
                    },
                    folder,
                )
            }
        }
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
        hub_endpoint: None,
        intake: Vec::new(),
        give_up: req.give_up,
    };
    let spec = match spec.source {
        JobSource::Hub { .. } => JobSpec {
            hub_endpoint: hub.endpoint.clone(),
            intake,
            ..spec
        },
        JobSource::Oci { .. } if !intake.is_empty() => bail!(
            "--from names several nodes, but {} is a registry artifact: only a Hub repo is fetched by several nodes; name one --from node",
            req.source
        ),
        _ if !intake.is_empty() => bail!(
            "--from names several nodes, but {} is a folder on {}: only a Hub repo is fetched by several nodes; name one --from node",
            req.source,
            source_node.name
        ),
        _ => spec,
    };
    let hub_token = match spec.source {
        JobSource::Hub { .. } => hub
            .token
            .as_ref()
            .map(|t| Secret::new(t.expose().to_string())),
        _ => None,
    };
    spec.validate().map_err(anyhow::Error::msg)?;
    let mut involved: Vec<&Node> = members.clone();
    if !involved.iter().any(|n| n.name == source_node.name) {
        involved.push(source_node);
    }
    let asks = involved.iter().map(|n| {
        let msg = AdminRequest::SyncJob {
            node: n.name.to_string(),
            job: Box::new(spec.clone()),
            hub_token: hub_token
                .clone()
                .filter(|_| n.name.as_str() == spec.source_node),
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
            Err(e) if node == spec.source_node && e.explains_itself() => {
                bail!("the source node {node} did not take the job: {e}")
            }
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

/// Asks the source node which folders `ORG/NAME` names there
/// ([`AdminRequest::FindFolder`]).
async fn find_folder(
    cred: &Arc<Credential>,
    node: &Node,
    text: &str,
    cwd: &std::path::Path,
) -> Result<Vec<PathBuf>> {
    let msg = AdminRequest::FindFolder {
        text: text.to_string(),
        cwd: cwd.to_path_buf(),
    };
    let name = node.name.to_string();
    match admin(cred, &name, &node.agent, &msg, ASK_TIMEOUT).await {
        Ok(AdminReply::FoldersFound { paths }) => Ok(paths),
        // A refusal of the caller (its credential's role) is the cause,
        // not the ambiguity between a folder and a repo.
        Ok(AdminReply::Failed(why @ xfer_proto::refusal::Refusal::Forbidden(_))) => {
            bail!("{name} refused: {why}")
        }
        Ok(AdminReply::Failed(why)) => bail!(
            "{name} cannot say whether `{text}` is a folder there ({why}); write ./{text} or an absolute path for a folder, hf://{text} for the Hub repo"
        ),
        Ok(other) => bail!("{name} answered {} to a folder lookup; upgrade xfer there", other.kind()),
        Err(e) if e.explains_itself() => bail!("cannot ask the source node {name}: {e}"),
        Err(e) => bail!(
            "cannot ask the source node {name} whether `{text}` is a folder there: {e}; is its agent running?"
        ),
    }
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
    let mut reports = futures_join(asks).await;
    attach_job_errors(&mut reports, unix_now());
    Ok(reports)
}

/// Now, in Unix seconds.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The jobs as their source nodes report them (a member's copy is not
/// kept up to date).
fn source_jobs(reports: &[NodeReport]) -> Vec<JobView> {
    reports
        .iter()
        .filter_map(|r| r.status.as_ref())
        .flat_map(|s| {
            s.jobs
                .iter()
                .filter(|j| s.node.as_deref() == Some(j.source_node.as_str()))
                .cloned()
        })
        .collect()
}

/// Gives each node's row of a model that an unfinished job is delivering
/// the job's error when the node has none of its own to show: the
/// member's own words from the job's last round (no space there, not
/// reachable), else the job's cause (why it failed, or what it is
/// retrying), so a node waiting on a failing source never shows an empty
/// error column.
pub fn attach_job_errors(reports: &mut [NodeReport], now_unix: u64) {
    let jobs = source_jobs(reports);
    for j in &jobs {
        // An ended job's cause is history once another job delivers the
        // same model: the rows show the running job's words, not it.
        let superseded = j.state.is_final()
            && jobs
                .iter()
                .any(|o| o.id != j.id && o.name == j.name && !o.state.is_final());
        if superseded {
            continue;
        }
        let cause = match &j.state {
            JobState::Failed { reason } => Some(format!("job {} failed: {reason}", j.id)),
            JobState::Complete { .. } | JobState::Cancelled => continue,
            _ => j.retry_line(now_unix),
        };
        for r in reports.iter_mut().filter(|r| j.nodes.contains(&r.node)) {
            let Some(m) = r
                .status
                .as_mut()
                .and_then(|s| s.models.iter_mut().find(|m| m.name == j.name))
            else {
                continue;
            };
            if m.state == ModelState::Complete || m.last_error.is_some() {
                continue;
            }
            let own = j
                .delivered
                .iter()
                .find(|t| t.node == r.node && !t.ok)
                .and_then(|t| t.error.clone());
            m.last_error = own.or_else(|| cause.clone());
        }
    }
}

/// The line `xfer status` prints for a job its source reports: id, model,
/// nodes, the Hub endpoint it pulls from, its state, and while it retries
/// the cause, the retry count and the next attempt.
pub fn job_line(j: &JobView, now_unix: u64) -> String {
    let via = j
        .hub_endpoint
        .as_deref()
        .map(|e| format!(" via {e}"))
        .unwrap_or_default();
    // While it retries, the retry line is its state: no `syncing`
    // beside a cause that says it is not.
    let (shown, detail) = match (j.retry_line(now_unix), &j.last_error, &j.state) {
        (Some(retry), _, _) => (retry, String::new()),
        (None, _, JobState::Failed { .. }) => (j.shown(), String::new()),
        (None, Some(e), _) => (j.shown(), format!(" (last error: {e})")),
        (None, None, _) => (j.shown(), String::new()),
    };
    let striped = if j.intake.is_empty() {
        String::new()
    } else {
        format!(" (striped with {})", j.intake.join(","))
    };
    format!(
        "job {} {} from {}{striped} to {}{via}: {shown}{detail}{}",
        j.id,
        xfer_proto::names::for_people(&j.name),
        j.source_node,
        j.nodes.join(","),
        intake_detail(j)
    )
}

/// For a striped job: what each node fetched from the Hub in the last
/// round, and each node named, with why.
fn intake_detail(j: &JobView) -> String {
    if j.intake.is_empty() {
        return String::new();
    }
    let shares: Vec<String> = j
        .delivered
        .iter()
        .filter(|t| t.from_origin > 0)
        .map(|t| format!("{} {}", t.node, xfer_proto::units::Bytes(t.from_origin)))
        .collect();
    let mut out = String::new();
    if !shares.is_empty() {
        out.push_str(&format!("; from the Hub: {}", shares.join(", ")));
    }
    for t in &j.delivered {
        if let Some(why) = &t.named {
            out.push_str(&format!("; {} named: {why}", t.node));
        }
    }
    out
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
        xfer_proto::names::for_people(&m.name),
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

/// How often [`wait`] asks the source about the job.
const JOB_EVERY: Duration = Duration::from_millis(200);
/// How often [`wait`] asks every member how it is doing.
const MEMBERS_EVERY: Duration = Duration::from_secs(1);

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
    // No total yet: an empty bar, never a full one.
    for b in &bars {
        b.unset_length();
    }
    let started = Instant::now();
    let mut started_at = vec![false; names.len()];
    let mut members_asked: Option<Instant> = None;
    loop {
        let source = status(cluster, cred, std::slice::from_ref(&spec.source_node)).await?;
        let job = source
            .first()
            .and_then(|r| r.status.as_ref())
            .and_then(|s| s.jobs.iter().find(|j| j.id == spec.id).cloned());
        if let Some(j) = &job {
            if matches!(j.state, JobState::Failed { .. } | JobState::Cancelled) {
                for b in &bars {
                    b.abandon_with_message(j.state.label());
                }
                bail!("job {} {}", spec.id, j.shown());
            }
        }
        // The source's job is asked often (its end is what we wait for);
        // every member's status, for the bars and the roots, once a
        // second, and at once when the job says complete.
        let complete = job
            .as_ref()
            .is_some_and(|j| matches!(j.state, JobState::Complete { .. }));
        if !complete && members_asked.is_some_and(|t| t.elapsed() < MEMBERS_EVERY) {
            tokio::time::sleep(JOB_EVERY).await;
            continue;
        }
        members_asked = Some(Instant::now());
        // While the source retries, every bar says why and when.
        let retrying = job.as_ref().and_then(|j| j.retry_line(unix_now()));
        let reports = status(cluster, cred, &names).await?;
        let mut roots = Vec::new();
        for (i, (r, bar)) in reports.iter().zip(&bars).enumerate() {
            let m = r
                .status
                .as_ref()
                .and_then(|s| s.models.iter().find(|m| m.name == spec.name.as_str()));
            let waiting = |why: &str| match &retrying {
                Some(line) => format!("{why}: {line}"),
                None => why.to_string(),
            };
            if bar.is_finished() {
                // A node that is done stays as it ended, no rate running
                // on, unless it turns out to take another revision after
                // all (its complete copy was the old one).
                match m.filter(|m| m.state == ModelState::Complete) {
                    Some(m) => {
                        roots.push(m.root);
                        continue;
                    }
                    None => bar.reopen(m.map_or(0, |m| m.bytes_held)),
                }
            }
            match m {
                Some(m) => {
                    if m.bytes_total == 0 && m.state != ModelState::Complete {
                        bar.unset_length();
                    } else {
                        bar.set_length(m.bytes_total);
                    }
                    if !started_at[i] {
                        // What the node held before counts as held, not
                        // as moved now.
                        started_at[i] = true;
                        bar.resume_at(m.bytes_held);
                    }
                    bar.set_position(m.bytes_held);
                    if m.state == ModelState::Complete {
                        bar.finish_with_message(m.state.label());
                        roots.push(m.root);
                    } else {
                        bar.set_message(waiting(m.state.label()));
                    }
                }
                None => bar.set_message(if r.reachable {
                    waiting("queued")
                } else {
                    "unreachable".to_string()
                }),
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
        tokio::time::sleep(JOB_EVERY).await;
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

/// What makes `xfer status` exit 1, one phrase each: every node that did
/// not answer with a status, every failed job (once, whichever nodes
/// report it), and every job its source is retrying after a failed round.
pub fn problems(reports: &[NodeReport]) -> Vec<String> {
    let mut out = Vec::new();
    for r in reports.iter().filter(|r| r.status.is_none()) {
        out.push(if r.reachable {
            format!("node {} answered no status", r.node)
        } else {
            format!("node {} unreachable", r.node)
        });
    }
    let mut seen: Vec<&str> = Vec::new();
    for j in reports
        .iter()
        .filter_map(|r| r.status.as_ref())
        .flat_map(|s| &s.jobs)
    {
        if matches!(j.state, JobState::Failed { .. }) && !seen.contains(&j.id.as_str()) {
            seen.push(&j.id);
            out.push(format!(
                "job {} ({}) failed",
                j.id,
                xfer_proto::names::for_people(&j.name)
            ));
        }
    }
    // A member's copy of a job is not kept up to date: its source says
    // whether it retries.
    for (node, j) in reports
        .iter()
        .filter_map(|r| r.status.as_ref())
        .flat_map(|s| s.jobs.iter().map(move |j| (s.node.as_deref(), j)))
    {
        let retrying = !j.state.is_final() && j.attempt > 0;
        if retrying && node == Some(j.source_node.as_str()) && !seen.contains(&j.id.as_str()) {
            seen.push(&j.id);
            out.push(format!(
                "job {} ({}) retrying (attempt {})",
                j.id,
                xfer_proto::names::for_people(&j.name),
                j.attempt
            ));
        }
    }
    out
}

/// The last line `xfer status` prints when there are `problems`, with
/// what clears a failed job; `None` when there are none.
pub fn problems_line(problems: &[String]) -> Option<String> {
    if problems.is_empty() {
        return None;
    }
    let n = problems.len();
    let mut line = format!(
        "{n} problem{}: {}",
        if n == 1 { "" } else { "s" },
        problems.join("; ")
    );
    if problems.iter().any(|p| p.ends_with(" failed")) {
        line.push_str(" (fix the cause and sync again; `xfer prune` removes ended jobs)");
    }
    if problems.iter().any(|p| p.contains(") retrying (attempt ")) {
        line.push_str(
            " (a retrying job fails by itself once its --give-up-after passes without progress; `xfer cancel ID` stops it now)",
        );
    }
    Some(line)
}

/// The jobs `reports` show ended, with their final state: final on any
/// node (the source's state first), or not final on a member whose
/// source answered and no longer knows the job (it was pruned or removed
/// there, so no end will come).
pub fn ended_jobs(reports: &[NodeReport]) -> Vec<(String, JobState)> {
    let statuses: Vec<(&str, &AgentStatus)> = reports
        .iter()
        .filter_map(|r| r.status.as_ref().map(|s| (r.node.as_str(), s)))
        .collect();
    let mut out: Vec<(String, JobState)> = Vec::new();
    let mut add = |id: &str, state: JobState| {
        if !out.iter().any(|(i, _)| i == id) {
            out.push((id.to_string(), state));
        }
    };
    // The source's own record first: it is the one that ended the job.
    for (node, s) in &statuses {
        for j in s.jobs.iter().filter(|j| j.source_node == *node) {
            if j.state.is_final() {
                add(&j.id, j.state.clone());
            }
        }
    }
    for (_, s) in &statuses {
        for j in &s.jobs {
            if j.state.is_final() {
                add(&j.id, j.state.clone());
                continue;
            }
            let source = statuses.iter().find(|(n, _)| *n == j.source_node);
            if let Some((src, st)) = source {
                if !st.jobs.iter().any(|k| k.id == j.id) {
                    add(
                        &j.id,
                        JobState::Failed {
                            reason: format!("its source {src} no longer knows the job"),
                        },
                    );
                }
            }
        }
    }
    out
}

/// One node's answer to `xfer prune`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct PruneReport {
    /// The node's name.
    pub node: String,
    /// The job records it removed.
    pub pruned: Vec<xfer_proto::admin::PrunedJob>,
    /// Why it removed nothing: unreachable, refused, or another answer.
    pub error: Option<String>,
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
) -> Result<Vec<PruneReport>> {
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
                Err(e) => (Vec::new(), Some(AskError::Unreachable(e))),
            };
            PruneReport {
                node,
                pruned,
                error: error.map(|e| e.to_string()),
            }
        }
    });
    Ok(futures_join(asks).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::admin::JobView;

    fn job(id: &str, source: &str, state: JobState) -> JobView {
        JobView {
            id: id.into(),
            name: format!("m-{id}"),
            source_node: source.into(),
            nodes: vec!["b".into()],
            state,
            here: None,
            last_error: None,
            rounds: 1,
            delivered: Vec::new(),
            attempt: 0,
            next_attempt_unix: None,
            hub_endpoint: None,
            intake: Vec::new(),
            give_up_unix: None,
        }
    }

    fn node(name: &str, jobs: Option<Vec<JobView>>) -> NodeReport {
        NodeReport {
            node: name.into(),
            agent: format!("{name}:7470"),
            reachable: jobs.is_some(),
            error: jobs.is_none().then(|| "no answer".into()),
            status: jobs.map(|jobs| AgentStatus {
                node: Some(name.into()),
                data: None,
                root: "/r".into(),
                models: Vec::new(),
                jobs,
                images: Vec::new(),
                platform: None,
            }),
        }
    }

    fn failed() -> JobState {
        JobState::Failed {
            reason: "gone".into(),
        }
    }

    #[test]
    fn problems_name_each_unreachable_node_and_each_failed_job_once() {
        let reports = [
            node(
                "a",
                Some(vec![
                    job("f1", "a", failed()),
                    job("ok", "a", JobState::Cancelled),
                ]),
            ),
            node(
                "b",
                Some(vec![
                    job("f1", "a", failed()),
                    job("q", "a", JobState::Queued),
                ]),
            ),
            node("c", None),
        ];
        let p = problems(&reports);
        assert_eq!(p, ["node c unreachable", "job f1 (m-f1) failed"]);
        let line = problems_line(&p).unwrap();
        assert!(
            line.starts_with("2 problems: node c unreachable; job f1 (m-f1) failed")
                && line.contains("xfer prune"),
            "{line}"
        );
        assert_eq!(
            problems_line(&problems(&[node("c", None)])).as_deref(),
            Some("1 problem: node c unreachable")
        );
        assert!(problems(
            &reports[..1]
                .iter()
                .map(|r| {
                    let mut r = r.clone();
                    r.status.as_mut().unwrap().jobs.retain(|j| j.id == "ok");
                    r
                })
                .collect::<Vec<_>>()
        )
        .is_empty());
    }

    #[test]
    fn ended_jobs_take_the_sources_state_and_catch_jobs_their_source_forgot() {
        let reports = [
            // a, the source: f1 failed, q still running, c1 cancelled.
            node(
                "a",
                Some(vec![
                    job("f1", "a", failed()),
                    job("q", "a", JobState::Syncing),
                    job("c1", "a", JobState::Cancelled),
                ]),
            ),
            // b, a member: f1 never heard of its end; o is a job a no
            // longer knows; x is from a source that is down.
            node(
                "b",
                Some(vec![
                    job("f1", "a", JobState::Queued),
                    job("q", "a", JobState::Queued),
                    job("o", "a", JobState::Queued),
                    job("x", "d", JobState::Queued),
                ]),
            ),
            node("d", None),
        ];
        let ended = ended_jobs(&reports);
        let ids: Vec<&str> = ended.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(ids, ["f1", "c1", "o"], "{ended:#?}");
        assert_eq!(ended[0].1, failed());
        assert_eq!(ended[1].1, JobState::Cancelled);
        let JobState::Failed { reason } = &ended[2].1 else {
            panic!("{ended:#?}")
        };
        assert!(
            reason.contains("its source a no longer knows the job"),
            "{reason}"
        );
    }
}

#[cfg(test)]
mod job_error_tests {
    use super::*;
    use xfer_proto::admin::MemberTally;

    fn model(name: &str, state: ModelState) -> ModelStatus {
        ModelStatus {
            name: name.into(),
            root: None,
            state,
            bytes_total: 0,
            bytes_held: 0,
            rate_bps: 0.0,
            eta_s: None,
            from_source: 0,
            from_peers: 0,
            last_error: None,
            repaired_files: 0,
            fallbacks: Vec::new(),
            pending: Vec::new(),
            draft: None,
        }
    }

    fn report(node: &str, models: Vec<ModelStatus>, jobs: Vec<JobView>) -> NodeReport {
        NodeReport {
            node: node.into(),
            agent: format!("{node}:7470"),
            reachable: true,
            error: None,
            status: Some(AgentStatus {
                node: Some(node.into()),
                data: None,
                root: "/r".into(),
                models,
                jobs,
                images: Vec::new(),
                platform: None,
            }),
        }
    }

    fn job(state: JobState) -> JobView {
        JobView {
            id: "j1".into(),
            name: "models--o--m".into(),
            source_node: "a".into(),
            nodes: vec!["a".into(), "b".into(), "c".into()],
            state,
            here: None,
            last_error: Some("127.0.0.1:9: connection refused".into()),
            rounds: 3,
            delivered: vec![MemberTally {
                node: "c".into(),
                error: Some("c:7470: no answer within 5s".into()),
                ..Default::default()
            }],
            attempt: 2,
            next_attempt_unix: Some(1_004),
            hub_endpoint: Some("http://127.0.0.1:9".into()),
            intake: Vec::new(),
            give_up_unix: None,
        }
    }

    #[test]
    fn waiting_nodes_show_the_jobs_cause_and_their_own_words() {
        let name = "models--o--m";
        let mut own = model(name, ModelState::Failed);
        own.last_error = Some("b's own error".into());
        let mut reports = vec![
            report(
                "a",
                vec![model(name, ModelState::Queued)],
                vec![job(JobState::Syncing)],
            ),
            report("b", vec![own], Vec::new()),
            report("c", vec![model(name, ModelState::Queued)], Vec::new()),
            report("d", vec![model(name, ModelState::Queued)], Vec::new()),
        ];
        attach_job_errors(&mut reports, 1_000);
        let err = |i: usize| {
            reports[i].status.as_ref().unwrap().models[0]
                .last_error
                .clone()
        };
        assert_eq!(
            err(0).as_deref(),
            Some("retrying (attempt 2, next in 4s): 127.0.0.1:9: connection refused")
        );
        assert_eq!(
            err(1).as_deref(),
            Some("b's own error"),
            "its own words stay"
        );
        assert_eq!(err(2).as_deref(), Some("c:7470: no answer within 5s"));
        assert_eq!(err(3), None, "d is not in the job");
        let text = render(&reports, None);
        assert!(text.contains("retrying (attempt 2, next in 4s):"), "{text}");

        let line = job_line(&job(JobState::Syncing), 1_000);
        assert_eq!(
            line,
            "job j1 o/m from a to a,b,c via http://127.0.0.1:9: \
             retrying (attempt 2, next in 4s): 127.0.0.1:9: connection refused"
        );
        let failed = job(JobState::Failed {
            reason: "o/m was not found".into(),
        });
        assert!(
            job_line(&failed, 1_000).ends_with(": failed: o/m was not found"),
            "{}",
            job_line(&failed, 1_000)
        );
        let mut reports = vec![
            report("a", Vec::new(), vec![failed]),
            report("b", vec![model(name, ModelState::Queued)], Vec::new()),
        ];
        attach_job_errors(&mut reports, 1_000);
        assert_eq!(
            reports[1].status.as_ref().unwrap().models[0]
                .last_error
                .as_deref(),
            Some("job j1 failed: o/m was not found")
        );
    }
}

#[cfg(test)]
mod table_tests {
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
