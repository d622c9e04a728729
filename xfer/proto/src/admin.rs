//! The admin service: the operator's requests ([`AdminRequest`]: hand over
//! a sync job, report status, cancel a job, remove a model) and their
//! replies ([`AdminReply`]), with the vocabulary they carry: sync jobs as
//! the CLI hands them to the agents ([`JobSpec`]), where they stand
//! ([`JobState`]), and what an agent reports when asked ([`AgentStatus`]:
//! its models and jobs).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::hash::Hash;
use crate::image::{ImageDesc, ImageLoadReport, ImageStatus};
use crate::manifest::ChunkSize;
use crate::names::ModelName;
pub use crate::refusal::Refusal;
pub use crate::secret::Secret;
use crate::transfer::FallbackRoute;

/// CLI → agent, after a [`crate::hello::Hello`] for
/// [`crate::hello::Service::Admin`]. Each is answered by one
/// [`AdminReply`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AdminRequest {
    /// Own this sync job; you are `node` in it.
    SyncJob {
        /// This agent's name in the job.
        node: String,
        /// The job (boxed: it is most of the request's size).
        job: Box<JobSpec>,
        /// The operator's Hub token, for a Hub job's source node only
        /// (the members' copies carry `None`); never in the [`JobSpec`].
        #[serde(default)]
        hub_token: Option<Secret>,
    },
    /// Report your models and jobs.
    Status,
    /// Stop sync job `id`.
    CancelJob {
        /// The job's id.
        id: String,
    },
    /// Delete the model `name` from your root. Without `force`, only a
    /// model this agent holds a record of (or is receiving).
    RemoveModel {
        /// The model's name.
        name: ModelName,
        /// Remove it even without a record of it.
        force: bool,
    },
    /// Check the blobs of this image (each a model you hold, see
    /// [`crate::image`]) against their sha256 digests and load the image
    /// into your container engine.
    LoadImage(Box<ImageDesc>),
    /// Job `id` ended on its source in `state` (complete, failed or
    /// cancelled): record it, so this member stops expecting the model.
    /// Accepted only from the job's source node or an operator.
    JobEnded {
        /// The job's id.
        id: String,
        /// Its final state on the source.
        state: JobState,
    },
    /// Remove the records of ended jobs: every final one here, and those
    /// named in `ended` (jobs their source reports final), except a job
    /// running here. Model data is never touched. Operators only.
    PruneJobs {
        /// Jobs known to be final elsewhere (on their source): id and
        /// final state.
        ended: Vec<(String, JobState)>,
    },
    /// Say which of `CWD/TEXT` and `ROOT/TEXT` (your root) are folders on
    /// this node: how `xfer sync` tells a folder `ORG/NAME` from a Hub
    /// repo of that id before it hands the job over. Answered by
    /// [`AdminReply::FoldersFound`].
    FindFolder {
        /// The SOURCE as the operator wrote it: relative, no `..`.
        text: String,
        /// The operator's working directory (absolute).
        cwd: PathBuf,
    },
    /// Bring your root within its budget: evict, least recently used
    /// first, what is not held, down to the low watermark (or, with
    /// `need`, until `need` more bytes fit under the budget); with
    /// `dry_run`, only say what would go. Answered by
    /// [`AdminReply::Gc`]. Operators only.
    Gc {
        /// Only plan.
        dry_run: bool,
        /// Make room for this many more bytes instead of the watermarks.
        need: Option<u64>,
    },
    /// Pin model `name` (never evicted) or unpin it. Operators only.
    Pin {
        /// The model's stored name.
        name: ModelName,
        /// Pin (true) or unpin.
        pinned: bool,
    },
}

/// Agent → CLI: the answer to an [`AdminRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AdminReply {
    /// Refused or failed. First, at tag 0, in every service's replies:
    /// see [`crate::refusal::FailedReply`].
    Failed(Refusal),
    /// The job is stored (and started, on its source node).
    JobAccepted {
        /// The job's id.
        id: String,
    },
    /// The agent's models and jobs.
    Status(AgentStatus),
    /// `known` says whether this agent had the job.
    JobCancelled {
        /// The job's id.
        id: String,
        /// Whether this agent had the job.
        known: bool,
    },
    /// Removed (`existed` false: there was nothing to remove).
    ModelRemoved {
        /// The model's name.
        name: ModelName,
        /// Whether there was anything to remove.
        existed: bool,
    },
    /// The image is loaded into the container engine.
    ImageLoaded(Box<ImageLoadReport>),
    /// The answer to [`AdminRequest::FindFolder`]: the absolute paths,
    /// among the two asked about, that are folders here (none, one, or
    /// both when they differ).
    FoldersFound {
        /// The folders found, `CWD/TEXT` first.
        paths: Vec<PathBuf>,
    },
    /// The answer to [`AdminRequest::JobEnded`]: `known` says whether
    /// this agent had the job.
    JobEndedNoted {
        /// The job's id.
        id: String,
        /// Whether this agent had the job.
        known: bool,
    },
    /// The job records [`AdminRequest::PruneJobs`] removed.
    JobsPruned {
        /// Each removed job.
        jobs: Vec<PrunedJob>,
    },
    /// The answer to [`AdminRequest::Gc`].
    Gc(GcReport),
    /// The answer to [`AdminRequest::Pin`]: the model's state now.
    Pinned {
        /// The model's name.
        name: ModelName,
        /// Whether it is pinned now.
        pinned: bool,
    },
}

/// A root's budget, its models and what a [`AdminRequest::Gc`] evicted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// The most the root may hold (bytes).
    pub limit: u64,
    /// The high watermark (bytes).
    pub high: u64,
    /// The low watermark (bytes).
    pub low: u64,
    /// What the root's models take now (after the evictions, unless a
    /// dry run).
    pub used: u64,
    /// Each model the root holds now.
    pub models: Vec<GcRow>,
    /// Evicted (or, in a dry run, to be): name, bytes, why.
    pub evicted: Vec<(String, u64, String)>,
    /// Evictions that failed when tried: `NAME: why`.
    pub failed: Vec<String>,
    /// Whether this was only a plan.
    pub dry_run: bool,
}

/// One model of a [`GcReport`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcRow {
    /// Its stored name.
    pub name: String,
    /// Bytes it takes.
    pub bytes: u64,
    /// When it was last used (unix milliseconds).
    pub last_used_ms: u64,
    /// Whether it is pinned.
    pub pinned: bool,
    /// Why it may not be evicted now, if so.
    pub held: Option<String>,
}

/// One job record removed by [`AdminRequest::PruneJobs`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrunedJob {
    /// The job's id.
    pub id: String,
    /// The model it named.
    pub name: String,
    /// Its state when removed (as this agent or the job's source knew it).
    pub state: JobState,
}

impl AdminReply {
    /// The reply's name, for errors.
    pub fn kind(&self) -> &'static str {
        match self {
            AdminReply::JobAccepted { .. } => "JobAccepted",
            AdminReply::Status(_) => "Status",
            AdminReply::JobCancelled { .. } => "JobCancelled",
            AdminReply::ModelRemoved { .. } => "ModelRemoved",
            AdminReply::ImageLoaded(_) => "ImageLoaded",
            AdminReply::JobEndedNoted { .. } => "JobEndedNoted",
            AdminReply::JobsPruned { .. } => "JobsPruned",
            AdminReply::FoldersFound { .. } => "FoldersFound",
            AdminReply::Gc(_) => "Gc",
            AdminReply::Pinned { .. } => "Pinned",
            AdminReply::Failed(_) => "Failed",
        }
    }
}

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum TransportChoice {
    /// RDMA when this node has an active RDMA port, else QUIC.
    #[default]
    Auto,
    /// QUIC only.
    Quic,
    /// RDMA only.
    Rdma,
}

/// Where a job's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobSource {
    /// A folder on the source node.
    Path(PathBuf),
    /// `ORG/NAME[@REV]` of the given type (`model`, `dataset`), pulled once
    /// by the source node into its root as an HF cache.
    Hub {
        /// The repo, its type and revision.
        repo: crate::repo::RepoRef,
        /// The commit the revision is synced at, whatever the Hub's branch
        /// names by the time the job runs (`xfer-launch deploy` pins what
        /// it read): the files are fetched at it and `refs/<REV>` is
        /// written to it. 40 lowercase hex digits.
        #[serde(default)]
        pin: Option<String>,
    },
    /// `REGISTRY/NAME[:TAG][@DIGEST]`, a ModelPack model artifact fetched
    /// once by the source node from its registry (`xfer sync oci://...`)
    /// and delivered as a folder.
    Oci {
        /// The reference, without `oci://`.
        reference: String,
        /// Plain HTTP to the registry (`--insecure`).
        insecure: bool,
        /// CAs to trust for the registry besides the system's (the PEM
        /// text of the operator's `--ca-file`).
        ca_pem: Option<String>,
    },
}

/// Longest `oci://` reference a job may carry.
pub const MAX_OCI_REFERENCE: usize = 1024;
/// Most bytes of CA certificates a job may carry.
pub const MAX_OCI_CA_PEM: usize = 64 << 10;

/// One node of a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobMember {
    /// The node's name in the cluster file.
    pub node: String,
    /// `HOST:PORT` of its agent: management traffic only.
    pub agent: String,
    /// `HOST:PORT` its data goes to (its `fabric_ip`), when it has one;
    /// else the source asks the agent for the address it advertises, and
    /// uses `agent` if it advertises none.
    #[serde(default)]
    pub data: Option<String>,
}

/// What `xfer sync` hands to the agents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The job's id ([`check_job_id`]); it names a file in the agents' jobs folder.
    pub id: String,
    /// The model's name on every node (`<root>/<name>`).
    pub name: ModelName,
    /// Where the bytes come from.
    pub source: JobSource,
    /// The node that reads the source and drives the job.
    pub source_node: String,
    /// Every node that must end with the model (may include the source node).
    pub members: Vec<JobMember>,
    /// Chunk size of the model's manifest (auto: from its size).
    pub chunk_size: ChunkSize,
    /// Cap on the source's send rate, bytes per second.
    pub limit_rate: Option<u64>,
    /// The data plane the source node offers (`xfer sync --transport`).
    #[serde(default)]
    pub transport: TransportChoice,
    /// Peer links per receiver, at most (`xfer sync --peers`); `None`:
    /// the source's default.
    #[serde(default)]
    pub peers: Option<u32>,
    /// The operator's `HF_ENDPOINT` for a Hub job; `None`: the source
    /// agent's own environment decides.
    #[serde(default)]
    pub hub_endpoint: Option<String>,
    /// Members that fetch a Hub job's ranges from the origin beside the
    /// source node (striped intake, `xfer sync --from a,b,c`); empty: the
    /// source alone.
    #[serde(default)]
    pub intake: Vec<String>,
    /// How long the job may go without progress, retrying, before it
    /// fails with its last cause (`xfer sync --give-up-after`).
    #[serde(default)]
    pub give_up: GiveUp,
}

/// How long a sync job retries without progress before it fails with its
/// last cause (`xfer sync --give-up-after`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum GiveUp {
    /// The agents' default, [`GiveUp::DEFAULT_SECS`].
    #[default]
    Default,
    /// After this many seconds without progress.
    AfterSecs(u64),
    /// Never: retry until the job completes or is cancelled.
    Never,
}

/// Why a `--give-up-after` value is refused; the line names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GiveUpError {
    /// No number first.
    #[error("--give-up-after {0:?}: give a duration such as 90s, 5m or 2h, or `never`")]
    NotADuration(String),
    /// A unit other than s, m or h.
    #[error("--give-up-after {0:?}: the unit is s, m or h (e.g. 90s, 5m, 2h), or say `never`")]
    Unit(String),
}

impl GiveUp {
    /// The default budget: five minutes without progress.
    pub const DEFAULT_SECS: u64 = 300;

    /// Seconds without progress before the job fails; `None`: never.
    pub fn secs(self) -> Option<u64> {
        match self {
            GiveUp::Default => Some(Self::DEFAULT_SECS),
            GiveUp::AfterSecs(s) => Some(s),
            GiveUp::Never => None,
        }
    }

    /// Reads `--give-up-after` (clap's value parser): `never`, or a
    /// duration such as `90s`, `5m`, `2h` (a bare number is seconds).
    pub fn parse(text: &str) -> Result<GiveUp, GiveUpError> {
        let t = text.trim();
        if t == "never" {
            return Ok(GiveUp::Never);
        }
        let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
        let n: u64 = digits
            .parse()
            .map_err(|_| GiveUpError::NotADuration(text.to_string()))?;
        let secs = match unit {
            "" | "s" => n,
            "m" => n.saturating_mul(60),
            "h" => n.saturating_mul(3600),
            _ => return Err(GiveUpError::Unit(text.to_string())),
        };
        Ok(GiveUp::AfterSecs(secs))
    }
}

impl JobSpec {
    /// Checks what an agent cannot trust blindly: the id (it names a file)
    /// and that the source node and members make sense.
    pub fn validate(&self) -> Result<(), JobSpecError> {
        check_job_id(&self.id)?;
        if self.members.is_empty() {
            return Err(JobSpecError::NoMembers);
        }
        if let JobSource::Path(p) = &self.source {
            if !p.is_absolute() {
                return Err(JobSpecError::RelativeSource {
                    path: p.clone(),
                    node: self.source_node.clone(),
                });
            }
        }
        if let JobSource::Oci {
            reference, ca_pem, ..
        } = &self.source
        {
            if reference.is_empty()
                || reference.len() > MAX_OCI_REFERENCE
                || ca_pem.as_ref().is_some_and(|p| p.len() > MAX_OCI_CA_PEM)
            {
                return Err(JobSpecError::OciSource);
            }
        }
        if let JobSource::Hub { pin: Some(c), .. } = &self.source {
            if !is_commit(c) {
                return Err(JobSpecError::Pin(c.chars().take(64).collect()));
            }
        }
        if !self.chunk_size.is_valid() {
            return Err(JobSpecError::ChunkSize(self.chunk_size));
        }
        Ok(())
    }

    /// The members other than `node`, and `node` itself when it is one.
    pub fn is_member(&self, node: &str) -> bool {
        self.members.iter().any(|m| m.node == node)
    }
}

/// Whether `s` is a full commit id: 40 lowercase hex digits.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What is wrong with a job ([`JobSpec::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobSpecError {
    /// The id is not a safe file name.
    #[error(transparent)]
    Id(#[from] JobIdError),
    /// The job names no node.
    #[error("a job needs at least one node")]
    NoMembers,
    /// A Hub job's pinned commit is not a commit id.
    #[error("the pinned commit `{0}` is not a commit id (40 lowercase hex digits)")]
    Pin(String),
    /// The source path is relative.
    #[error("source {} is relative; give the absolute path on {node}", path.display())]
    RelativeSource {
        /// The path as given.
        path: PathBuf,
        /// The node the path is on.
        node: String,
    },
    /// The chunk size is not one xfer uses.
    #[error("chunk size {0} is not valid")]
    ChunkSize(ChunkSize),
    /// An `oci://` source that is empty or too long, or CAs too large.
    #[error("the oci:// reference is empty or longer than {MAX_OCI_REFERENCE} bytes, or its --ca-file is over {MAX_OCI_CA_PEM} bytes; check the reference and the CA file")]
    OciSource,
}

/// A job id that is not 1-64 of `[A-Za-z0-9-]` ([`check_job_id`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job id `{0}` is not [A-Za-z0-9-]{{1,64}}; list the jobs with `xfer status`")]
pub struct JobIdError(
    /// The id as given, escaped for printing.
    pub String,
);

/// Checks a job id, which names a file in the agents' jobs folder: 1-64
/// of `[A-Za-z0-9-]`, so no id can point outside it.
pub fn check_job_id(id: &str) -> Result<(), JobIdError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(JobIdError(id.escape_default().to_string()))
    }
}

/// Where a job stands, as the source node sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Handed over; the source has not started a round yet.
    Queued,
    /// Rounds are running (and retried until every member completes).
    Syncing,
    /// Every member reported `root`.
    Complete {
        /// The model's root hash.
        root: Hash,
    },
    /// Stopped by `xfer cancel`.
    Cancelled,
    /// Cannot go on without the user (bad source path, ...).
    Failed {
        /// Why, and what to do.
        reason: String,
    },
}

impl JobState {
    /// Whether the job will not change state any more.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            JobState::Complete { .. } | JobState::Cancelled | JobState::Failed { .. }
        )
    }

    /// The state's name, as `xfer status` prints it.
    pub fn label(&self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Syncing => "syncing",
            JobState::Complete { .. } => "complete",
            JobState::Cancelled => "cancelled",
            JobState::Failed { .. } => "failed",
        }
    }
}

/// What one member got in the last round.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberTally {
    /// The member's node name.
    pub node: String,
    /// Verified bytes it got from the source.
    pub from_source: u64,
    /// Verified bytes it got from other members.
    pub from_peers: u64,
    /// Bytes it fetched from the origin (the Hub) for a Hub job: the
    /// source's, and each intake node's with `--from a,b,c`.
    #[serde(default)]
    pub from_origin: u64,
    /// Why a striped pull named it: its ranges differed from the origin's,
    /// or it stopped answering and its ranges went to the others.
    #[serde(default)]
    pub named: Option<String>,
    /// Whether it ended with the model complete.
    pub ok: bool,
    /// Why not, when it did not: the member's own words (a refusal such
    /// as no space, or why it could not be reached).
    #[serde(default)]
    pub error: Option<String>,
}

/// A model's state on one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelState {
    /// A job names it here but nothing has arrived yet.
    Queued,
    /// A transfer of it is running.
    Syncing,
    /// Re-hashing a complete model (periodic verify).
    Verifying,
    /// A verify found damage; fetching the damaged files from peers.
    Repairing,
    /// Every file is here and verified.
    Complete,
    /// The last transfer failed (see `last_error`).
    Failed,
    /// A transfer of another manifest began replacing the model's files
    /// and has not finished: neither version is complete here. The next
    /// run of that transfer (or of the old one) completes it.
    Replacing,
}

/// One model on one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelStatus {
    /// The model's name.
    pub name: String,
    /// The root hash once complete (or of the transfer running).
    pub root: Option<Hash>,
    /// Where it stands.
    pub state: ModelState,
    /// Bytes of the whole model.
    pub bytes_total: u64,
    /// Verified bytes held here.
    pub bytes_held: u64,
    /// Bytes per second over the last few seconds.
    pub rate_bps: f64,
    /// Seconds until complete at the current rate, if it is moving.
    pub eta_s: Option<f64>,
    /// Verified bytes of the running (or last) transfer from the source
    /// and from other nodes.
    pub from_source: u64,
    /// Verified bytes from other nodes (see `from_source`).
    pub from_peers: u64,
    /// Why the last transfer failed, if it did.
    pub last_error: Option<String>,
    /// Files repaired from peers since the agent started.
    pub repaired_files: u64,
    /// Pairs of nodes whose data for this model went over management
    /// (this node's own links, and, on a job's source, every member's).
    #[serde(default)]
    pub fallbacks: Vec<FallbackRoute>,
    /// While a transfer of a known root runs (`Syncing` with `root`): the
    /// files (manifest paths) not yet verified and under their final name;
    /// every other file of that manifest is. A rank that loads while the
    /// weights land reads a file only once it has left this list
    /// (`launcher/python/xfer_vllm_loader`). Empty otherwise.
    #[serde(default)]
    pub pending: Vec<String>,
    /// The streamed draft (a Hub pull still downloading) this model is, or
    /// whose every file and link it holds unchanged: what names the model
    /// before its root is known (`Syncing` without `root`), and after, for
    /// a rank that started while it streamed. `pending` then lists its
    /// files not yet verified and in place, and the links to them.
    #[serde(default)]
    pub draft: Option<Hash>,
}

/// Where a job's last round spent its seconds, on its source's clock:
/// seconds from the round's start to each mark it reached (`None`: not a
/// mark of this kind of source, or not reached).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoundTimeline {
    /// The source's listing was read (the registry's manifest).
    #[serde(default)]
    pub listed_s: Option<f64>,
    /// A folder source was hashed.
    #[serde(default)]
    pub hashed_s: Option<f64>,
    /// The download from the origin (the Hub, a registry) ended.
    #[serde(default)]
    pub downloaded_s: Option<f64>,
    /// The stream to the members ended: each held what was streamed.
    #[serde(default)]
    pub streamed_s: Option<f64>,
    /// The round ended: every member complete, or why not.
    pub done_s: f64,
}

/// A job as one agent knows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// The job's id.
    pub id: String,
    /// The model's name.
    pub name: String,
    /// The node that reads the source and drives the job.
    pub source_node: String,
    /// The member nodes.
    pub nodes: Vec<String>,
    /// The job's state in this agent's record of it. A member's record is
    /// not updated by the source, so until it is final, `here` says more.
    pub state: JobState,
    /// The model's state on this node, for a job this node is a member of
    /// but not the source of.
    pub here: Option<ModelState>,
    /// Why the last round failed, if it did.
    pub last_error: Option<String>,
    /// Rounds run so far.
    pub rounds: u64,
    /// What each member got in the last round.
    pub delivered: Vec<MemberTally>,
    /// Rounds that failed in a row and are being retried (0: none).
    #[serde(default)]
    pub attempt: u32,
    /// When the next round starts (Unix seconds), while waiting to retry.
    #[serde(default)]
    pub next_attempt_unix: Option<u64>,
    /// The Hub endpoint a Hub job pulls from (the operator's, or the
    /// source agent's own once it ran a round); `None` for a folder job.
    #[serde(default)]
    pub hub_endpoint: Option<String>,
    /// The members that fetch ranges from the Hub beside the source
    /// (`--from a,b,c`).
    #[serde(default)]
    pub intake: Vec<String>,
    /// While the job retries: when it fails if no round makes progress
    /// before then (Unix seconds); `None`: it is not retrying, or never
    /// gives up.
    #[serde(default)]
    pub give_up_unix: Option<u64>,
    /// On the source: where its last round's seconds went.
    #[serde(default)]
    pub last_round: Option<RoundTimeline>,
}

impl ModelState {
    /// The state's name, as `xfer status` prints it.
    pub fn label(&self) -> &'static str {
        match self {
            ModelState::Queued => "queued",
            ModelState::Syncing => "syncing",
            ModelState::Verifying => "verifying",
            ModelState::Repairing => "repairing",
            ModelState::Complete => "complete",
            ModelState::Failed => "failed",
            ModelState::Replacing => "replacing",
        }
    }
}

impl JobView {
    /// The state to show: the record's once final (or on the source), else
    /// the model's state on this node.
    pub fn shown(&self) -> String {
        match (&self.state, self.here) {
            (JobState::Failed { reason }, _) => format!("failed: {reason}"),
            (s, _) if s.is_final() => s.label().to_string(),
            (_, Some(here)) => here.label().to_string(),
            (s, None) => s.label().to_string(),
        }
    }

    /// While the job retries after a failure: the retry count, when the
    /// next round starts and when it gives up, and its cause, as one line,
    /// e.g. `retrying (attempt 3, next in 4s, gives up in 280s): connection
    /// refused (...)`; `now_unix` is the
    /// current time in Unix seconds.
    pub fn retry_line(&self, now_unix: u64) -> Option<String> {
        if self.state.is_final() || self.attempt == 0 {
            return None;
        }
        let cause = self
            .last_error
            .as_deref()
            .unwrap_or("the last round failed");
        let when = match self.next_attempt_unix {
            Some(at) => format!("next in {}s", at.saturating_sub(now_unix)),
            None => "running now".to_string(),
        };
        let budget = match self.give_up_unix {
            Some(at) => format!(", gives up in {}s", at.saturating_sub(now_unix)),
            None => String::new(),
        };
        Some(format!(
            "retrying (attempt {}, {when}{budget}): {cause}",
            self.attempt
        ))
    }
}

/// The reply to a status query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    /// The node's name as its jobs call it, if it knows one.
    pub node: Option<String>,
    /// The data address this agent advertises (`--data`, `--fabric-if`);
    /// `None`: its agent address carries data too.
    #[serde(default)]
    pub data: Option<SocketAddr>,
    /// The agent's root folder.
    pub root: String,
    /// Every model under the root.
    pub models: Vec<ModelStatus>,
    /// Every job this agent knows.
    pub jobs: Vec<JobView>,
    /// The images this agent loaded (their blobs are among `models`).
    pub images: Vec<ImageStatus>,
    /// The platform images are pulled for on this node (`linux/arm64`):
    /// its machine's, or what `XFER_PLATFORM` says.
    #[serde(default)]
    pub platform: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_frame, encode};

    #[test]
    fn find_folder_and_its_answer_round_trip() {
        let ask = AdminRequest::FindFolder {
            text: "local/my-model".into(),
            cwd: "/home/op".into(),
        };
        assert_eq!(decode_frame::<AdminRequest>(&encode(&ask)).unwrap(), ask);
        let found = AdminReply::FoldersFound {
            paths: vec!["/home/op/local/my-model".into()],
        };
        assert_eq!(decode_frame::<AdminReply>(&encode(&found)).unwrap(), found);
        assert_eq!(found.kind(), "FoldersFound");
    }

    #[test]
    fn job_end_and_prune_messages_round_trip() {
        let reqs = [
            AdminRequest::JobEnded {
                id: "1a2b".into(),
                state: JobState::Failed {
                    reason: "gone".into(),
                },
            },
            AdminRequest::PruneJobs {
                ended: vec![("1a2b".into(), JobState::Cancelled)],
            },
        ];
        for r in reqs {
            assert_eq!(decode_frame::<AdminRequest>(&encode(&r)).unwrap(), r);
        }
        let replies = [
            AdminReply::JobEndedNoted {
                id: "1a2b".into(),
                known: true,
            },
            AdminReply::JobsPruned {
                jobs: vec![PrunedJob {
                    id: "1a2b".into(),
                    name: "m".into(),
                    state: JobState::Cancelled,
                }],
            },
        ];
        for r in replies {
            assert_eq!(decode_frame::<AdminReply>(&encode(&r)).unwrap(), r);
        }
    }
    fn view() -> JobView {
        JobView {
            id: "j1".into(),
            name: "models--o--m".into(),
            source_node: "a".into(),
            nodes: vec!["a".into(), "b".into()],
            state: JobState::Syncing,
            here: None,
            last_error: Some("connection refused".into()),
            rounds: 3,
            delivered: vec![MemberTally {
                node: "b".into(),
                error: Some("no space".into()),
                ..Default::default()
            }],
            attempt: 3,
            next_attempt_unix: Some(104),
            hub_endpoint: Some("http://127.0.0.1:9".into()),
            intake: Vec::new(),
            give_up_unix: None,
            last_round: None,
        }
    }

    #[test]
    fn a_sync_job_round_trips_with_its_hub_settings_and_the_token_never_shows() {
        let job = JobSpec {
            id: "j1".into(),
            name: ModelName::new("models--o--m").unwrap(),
            source: JobSource::Hub {
                repo: crate::repo::RepoRef::parse("o/m@v1", crate::repo::RepoType::Model).unwrap(),
                pin: None,
            },
            source_node: "a".into(),
            members: vec![JobMember {
                node: "b".into(),
                agent: "10.0.0.2:7470".into(),
                data: None,
            }],
            chunk_size: ChunkSize::Auto,
            limit_rate: None,
            transport: TransportChoice::Auto,
            peers: None,
            hub_endpoint: Some("https://hf-mirror.example".into()),
            intake: vec!["b".into()],
            give_up: GiveUp::AfterSecs(90),
        };
        let req = AdminRequest::SyncJob {
            node: "a".into(),
            job: Box::new(job),
            hub_token: Some(Secret::new("hf_secret".into())),
        };
        let back: AdminRequest = decode_frame(&encode(&req)).unwrap();
        assert_eq!(back, req);
        // A pin is a full commit id or nothing.
        let AdminRequest::SyncJob { job, .. } = &req else {
            unreachable!()
        };
        let pinned = |pin: &str| JobSpec {
            source: JobSource::Hub {
                repo: crate::repo::RepoRef::parse("o/m", crate::repo::RepoType::Model).unwrap(),
                pin: Some(pin.into()),
            },
            ..(**job).clone()
        };
        assert_eq!(pinned(&"a".repeat(40)).validate(), Ok(()));
        for bad in [
            "main",
            "ABCDEF0123456789ABCDEF0123456789ABCDEF01",
            "../../x",
        ] {
            assert!(
                matches!(pinned(bad).validate(), Err(JobSpecError::Pin(_))),
                "{bad}"
            );
        }
        let shown = format!("{req:?}");
        assert!(!shown.contains("hf_secret"), "{shown}");
        assert!(shown.contains("hf-mirror.example"), "{shown}");
        let status = AdminReply::Status(AgentStatus {
            node: Some("a".into()),
            data: None,
            root: "/r".into(),
            models: Vec::new(),
            jobs: vec![view()],
            images: Vec::new(),
            platform: None,
        });
        assert_eq!(
            decode_frame::<AdminReply>(&encode(&status)).unwrap(),
            status
        );
    }

    #[test]
    fn give_up_after_reads_durations_and_never_and_says_what_it_takes() {
        assert_eq!(GiveUp::parse("90s"), Ok(GiveUp::AfterSecs(90)));
        assert_eq!(GiveUp::parse("5m"), Ok(GiveUp::AfterSecs(300)));
        assert_eq!(GiveUp::parse("2h"), Ok(GiveUp::AfterSecs(7200)));
        assert_eq!(GiveUp::parse("45"), Ok(GiveUp::AfterSecs(45)));
        assert_eq!(GiveUp::parse("never"), Ok(GiveUp::Never));
        assert_eq!(GiveUp::Never.secs(), None);
        assert_eq!(GiveUp::Default.secs(), Some(300));
        for bad in ["", "5d", "m", "-1s", "1.5h"] {
            let e = GiveUp::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--give-up-after") && e.contains("5m"), "{e}");
        }
    }

    #[test]
    fn a_retrying_job_says_its_cause_attempt_and_next_try() {
        let v = view();
        assert_eq!(
            v.retry_line(100).as_deref(),
            Some("retrying (attempt 3, next in 4s): connection refused")
        );
        let running = JobView {
            next_attempt_unix: None,
            ..view()
        };
        assert!(running
            .retry_line(100)
            .unwrap()
            .starts_with("retrying (attempt 3, running now): "));
        let first = JobView {
            attempt: 0,
            ..view()
        };
        assert_eq!(first.retry_line(100), None);
        let failed = JobView {
            state: JobState::Failed { reason: "x".into() },
            ..view()
        };
        assert_eq!(failed.retry_line(100), None);
        assert!(Refusal::NoSpace {
            need: 1,
            have: 0,
            path: "/r".into()
        }
        .is_permanent());
        assert!(!Refusal::SourceLost("gone".into()).is_permanent());
    }
}
