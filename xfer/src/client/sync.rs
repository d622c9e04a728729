//! `xfer sync`: the job built from what the operator asked (SOURCE read
//! with [`super::source`], a bare `ORG/NAME` asked of the source node) and
//! handed to every agent involved, which then drive it themselves; and
//! the Hub listing's size, for `xfer-launch deploy`'s space check. Following
//! the job is [`super::wait`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::ask::{admin, all, ASK_TIMEOUT};
use super::source::{Reading, Verdict};
use crate::config::auth::Credential;
use crate::config::cluster::{Cluster, Node};
use crate::hub::env::HubSettings;
pub use crate::transport::select::TransportChoice;
/// What [`sync`] returns and [`super::wait::wait`] follows.
pub use xfer_proto::admin::JobSpec;
use xfer_proto::admin::{AdminReply, AdminRequest, GiveUp, JobMember, JobSource, Secret};
use xfer_proto::manifest::ChunkSize;
use xfer_proto::names::ModelName;
use xfer_proto::repo::RepoType;

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
                (
                    JobSource::Hub {
                        repo: repo.clone(),
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
    let replies = all(asks).await;
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

/// A fresh job id: 12 hex digits.
pub fn new_id() -> String {
    use rand::Rng;
    format!(
        "{:012x}",
        rand::thread_rng().gen::<u64>() & 0xffff_ffff_ffff
    )
}
