//! `xfer sync`: the job built from what the operator asked (SOURCE read
//! with [`super::source`], a bare `ORG/NAME` asked of the source node) and
//! handed to every agent involved, which then drive it themselves; and
//! the Hub listing's size, for `xfer-launch deploy`'s space check. Following
//! the job is [`super::wait`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::ask::AskError;
use super::ask::{admin, all, ASK_TIMEOUT};
use super::source::{Ambiguous, Reading, SourceError, Verdict};
use crate::config::auth::Credential;
use crate::config::cluster::{Cluster, ClusterError, Node};
use crate::hub::env::{HubEnvError, HubSettings};
pub use crate::transport::select::TransportChoice;
use crate::util::chain::Chain;
/// What [`sync`] returns and [`super::wait::wait`] follows.
pub use xfer_proto::admin::JobSpec;
use xfer_proto::admin::{
    AdminReply, AdminRequest, GiveUp, JobMember, JobSource, JobSpecError, Secret,
};
use xfer_proto::manifest::ChunkSize;
use xfer_proto::names::{ModelName, ModelNameError};
use xfer_proto::refusal::Refusal;
use xfer_proto::repo::{RepoRefError, RepoType};

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

/// Why a sync job was not made or not handed over: one line each, naming
/// the option or the node and what to do.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// `--nodes` names a node the cluster file lacks, or the file is bad.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The operator's Hub settings (token file, offline mode, endpoint).
    #[error(transparent)]
    HubEnv(#[from] HubEnvError),
    /// SOURCE cannot be read as a folder or a repo.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// `ORG/NAME` could be a folder and a repo alike.
    #[error(transparent)]
    Ambiguous(#[from] Ambiguous),
    /// `oci://REFERENCE` is not an image reference.
    #[error(transparent)]
    Reference(#[from] crate::image::registry::reference::RefError),
    /// `REPO@REVISION` is not a repo reference.
    #[error(transparent)]
    RepoRef(#[from] RepoRefError),
    /// The job does not hold together (its id, nodes, name, settings).
    #[error(transparent)]
    Spec(#[from] JobSpecError),
    /// The model's name (from the folder or the artifact) is not one a
    /// node may hold.
    #[error(transparent)]
    Name(#[from] ModelNameError),
    /// `--name` is not a model name.
    #[error("--name {given}: {why}")]
    BadName {
        /// What `--name` said.
        given: String,
        /// Why it is not a name.
        why: ModelNameError,
    },
    /// The folder has no name to name the model after.
    #[error("the source path has no folder name; name the model with --name")]
    NoFolderName,
    /// `--name` differs from the Hub cache folder a repo is stored as.
    #[error("a Hub repo is stored as {0} (the HF cache layout); drop --name")]
    HubName(String),
    /// `--from` names a node the cluster file lacks.
    #[error("--from {node}: no such node in {}", file.display())]
    NoSuchFrom {
        /// The node named.
        node: String,
        /// The cluster file.
        file: PathBuf,
    },
    /// `--from` names an intake node that does not receive the model.
    #[error("--from {0}: a node that fetches ranges from the Hub must be one that receives the model; add it to --nodes")]
    IntakeNotMember(String),
    /// `--from` names several nodes for a source only one node can fetch.
    #[error("--from names several nodes, but {source_text} is {what}: only a Hub repo is fetched by several nodes; name one --from node")]
    OneFromOnly {
        /// SOURCE as written.
        source_text: String,
        /// "a registry artifact", "a folder on NODE".
        what: String,
    },
    /// `--ca-file` cannot be read.
    #[error("--ca-file {}: cannot read it: {why}", path.display())]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What the system said.
        why: std::io::Error,
    },
    /// `--ca-file` is larger than a job carries.
    #[error("--ca-file {} has {bytes} bytes; a job carries at most {} of CA certificates: give only the registry's CA", path.display(), xfer_proto::admin::MAX_OCI_CA_PEM)]
    CaTooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: usize,
    },
    /// `--ca-file` is not text.
    #[error("--ca-file {} is not PEM text: {why}", path.display())]
    CaNotText {
        /// The file.
        path: PathBuf,
        /// Where it stops being UTF-8.
        why: std::string::FromUtf8Error,
    },
    /// A node refused the job (the source node: the job is not made).
    #[error("{node} refused the job: {why}")]
    Refused {
        /// The node.
        node: String,
        /// Its refusal.
        why: Refusal,
    },
    /// A node answered with another kind of reply.
    #[error("{node} answered {kind} to {asked}; upgrade xfer there")]
    Answered {
        /// The node.
        node: String,
        /// The reply's kind.
        kind: &'static str,
        /// What it was asked: "a sync job", "a folder lookup".
        asked: &'static str,
    },
    /// The source node could not be asked to take the job.
    #[error(
        "the source node {node} did not take the job: {why}{}",
        running_hint(why)
    )]
    NotTaken {
        /// The node.
        node: String,
        /// Why the ask failed.
        why: Box<AskError>,
    },
    /// The source node refused to say whether `ORG/NAME` is a folder.
    #[error("{node} refused: {why}")]
    LookupForbidden {
        /// The node.
        node: String,
        /// Its refusal.
        why: Refusal,
    },
    /// The source node could not say whether `ORG/NAME` is a folder.
    #[error("{node} cannot say whether `{text}` is a folder there ({why}); write ./{text} or an absolute path for a folder, hf://{text} for the Hub repo")]
    LookupFailed {
        /// The node.
        node: String,
        /// `ORG/NAME` as written.
        text: String,
        /// Its refusal.
        why: Refusal,
    },
    /// The source node could not be asked whether `ORG/NAME` is a folder.
    #[error(
        "cannot ask the source node {node}{}: {why}{}",
        lookup_of(text, why),
        running_hint(why)
    )]
    LookupUnasked {
        /// The node.
        node: String,
        /// `ORG/NAME` as written.
        text: String,
        /// Why the ask failed.
        why: Box<AskError>,
    },
    /// The Hub's listing of the repo could not be read.
    #[error(transparent)]
    Listing(Chain),
}

/// "; is its agent running?" unless the ask's error explains itself.
fn running_hint(e: &AskError) -> &'static str {
    if e.explains_itself() {
        ""
    } else {
        "; is its agent running?"
    }
}

/// " whether `TEXT` is a folder there" unless the ask's error explains
/// itself.
fn lookup_of(text: &str, e: &AskError) -> String {
    if e.explains_itself() {
        String::new()
    } else {
        format!(" whether `{text}` is a folder there")
    }
}

/// The prefix of a model artifact's SOURCE.
pub const OCI_PREFIX: &str = "oci://";

/// The job source and model name of `oci://REFERENCE`: the reference is
/// checked here, the model is named after the repository's last part
/// (`oci://reg/models/tiny:v2` is `tiny`, so a new tag updates it in
/// place) unless `--name` says otherwise.
fn oci_source(reference: &str, req: &SyncRequest) -> Result<(JobSource, String), SyncError> {
    let image = crate::image::registry::reference::ImageRef::parse(reference)?;
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
            let pem = std::fs::read(f).map_err(|why| SyncError::CaFile {
                path: f.clone(),
                why,
            })?;
            if pem.len() > xfer_proto::admin::MAX_OCI_CA_PEM {
                return Err(SyncError::CaTooLarge {
                    path: f.clone(),
                    bytes: pem.len(),
                });
            }
            Some(String::from_utf8(pem).map_err(|why| SyncError::CaNotText {
                path: f.clone(),
                why,
            })?)
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
pub async fn sync(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    req: &SyncRequest,
) -> Result<JobSpec, SyncError> {
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
pub async fn hub_size(
    repo: &str,
    revision: &str,
    repo_type: RepoType,
) -> Result<(String, u64), SyncError> {
    let r = xfer_proto::repo::RepoRef::parse(&format!("{repo}@{revision}"), repo_type)?;
    let env = crate::hub::env::HubEnv::from_process()?;
    crate::hub::pull::listing_size(&r, &env)
        .await
        .map_err(|e| SyncError::Listing(e.into()))
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
) -> Result<JobSpec, SyncError> {
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
        Some(n) => cluster.node(n).ok_or_else(|| SyncError::NoSuchFrom {
            node: n.to_string(),
            file: cluster.path.clone(),
        })?,
        None => members[0],
    };
    let mut intake = Vec::new();
    for n in froms.iter().skip(1) {
        if !members.iter().any(|m| m.name.as_str() == *n) {
            return Err(SyncError::IntakeNotMember(n.to_string()));
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
                        .map_err(|why| bad_name(n, why))?
                        .to_string(),
                    None => path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .ok_or(SyncError::NoFolderName)?
                        .to_string(),
                };
                (JobSource::Path(path), name)
            }
            Err(repo) => {
                crate::hub::env::check_online(&repo.id)?;
                let folder = repo.cache_folder();
                let given = match &req.name {
                    Some(n) => Some(
                        ModelName::from_user(n, req.repo_type).map_err(|why| bad_name(n, why))?,
                    ),
                    None => None,
                };
                if given.is_some_and(|n| n.as_str() != folder) {
                    return Err(SyncError::HubName(folder));
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
        name: ModelName::new(&name)?,
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
        JobSource::Oci { .. } if !intake.is_empty() => {
            return Err(SyncError::OneFromOnly {
                source_text: req.source.clone(),
                what: "a registry artifact".into(),
            })
        }
        _ if !intake.is_empty() => {
            return Err(SyncError::OneFromOnly {
                source_text: req.source.clone(),
                what: format!("a folder on {}", source_node.name),
            })
        }
        _ => spec,
    };
    let hub_token = match spec.source {
        JobSource::Hub { .. } => hub
            .token
            .as_ref()
            .map(|t| Secret::new(t.expose().to_string())),
        _ => None,
    };
    spec.validate()?;
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
                return Err(SyncError::Refused { node, why })
            }
            Ok(AdminReply::Failed(why)) => eprintln!("warning: {node} refused the job: {why}"),
            Ok(other) => {
                return Err(SyncError::Answered {
                    node,
                    kind: other.kind(),
                    asked: "a sync job",
                })
            }
            Err(why) if node == spec.source_node => {
                return Err(SyncError::NotTaken {
                    node,
                    why: Box::new(why),
                })
            }
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
) -> Result<Vec<PathBuf>, SyncError> {
    let msg = AdminRequest::FindFolder {
        text: text.to_string(),
        cwd: cwd.to_path_buf(),
    };
    let name = node.name.to_string();
    match admin(cred, &name, &node.agent, &msg, ASK_TIMEOUT).await {
        Ok(AdminReply::FoldersFound { paths }) => Ok(paths),
        // A refusal of the caller (its credential's role) is the cause,
        // not the ambiguity between a folder and a repo.
        Ok(AdminReply::Failed(why @ Refusal::Forbidden(_))) => {
            Err(SyncError::LookupForbidden { node: name, why })
        }
        Ok(AdminReply::Failed(why)) => Err(SyncError::LookupFailed {
            node: name,
            text: text.to_string(),
            why,
        }),
        Ok(other) => Err(SyncError::Answered {
            node: name,
            kind: other.kind(),
            asked: "a folder lookup",
        }),
        Err(why) => Err(SyncError::LookupUnasked {
            node: name,
            text: text.to_string(),
            why: Box::new(why),
        }),
    }
}

/// `--name`'s error.
fn bad_name(given: &str, why: ModelNameError) -> SyncError {
    SyncError::BadName {
        given: given.to_string(),
        why,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ask_that_explains_itself_gets_no_hint_and_one_that_does_not_gets_it() {
        let refused = || Box::new(AskError::Refused(Refusal::Forbidden("no".into())));
        let mute = || Box::new(AskError::Unexpected("Status"));
        let taken = |why| SyncError::NotTaken {
            node: "a".into(),
            why,
        };
        assert_eq!(
            taken(refused()).to_string(),
            format!("the source node a did not take the job: {}", refused())
        );
        assert_eq!(
            taken(mute()).to_string(),
            "the source node a did not take the job: answered Status; is its agent running?"
        );
        let lookup = |why| SyncError::LookupUnasked {
            node: "a".into(),
            text: "org/m".into(),
            why,
        };
        assert_eq!(
            lookup(refused()).to_string(),
            format!("cannot ask the source node a: {}", refused())
        );
        assert_eq!(
            lookup(mute()).to_string(),
            "cannot ask the source node a whether `org/m` is a folder there: answered Status; is its agent running?"
        );
    }
}
