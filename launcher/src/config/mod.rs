//! The `[launch]` table of the cluster file, typed and checked against the
//! nodes it launches on.
//!
//! `xfer` keeps `[launch]` as an opaque table; this module reads it again
//! from the file's text so that every complaint carries the line it is
//! about. The result, a [`Setup`], holds everything [`crate::plan`] needs:
//! the nodes in rank order (head first) with their fabric interface, address
//! and RDMA device, the parallel sizes, the model path every node will load,
//! the ports, and what passes through to the engine.
//!
//! ```toml
//! [launch]
//! engine = "vllm"                # vllm | vllm-ray | sglang | custom
//! model = "Qwen/Qwen3-8B"        # or "/abs/path", or { repo = "...", revision = "..." }
//! revision = "0123...cdef"       # (optional) the commit; see below
//! tp = 2                         # default 1
//! pp = 1                         # default: the number of nodes
//! head = "spark-a"               # default: the first node
//! nodes = ["spark-a", "spark-b"] # default: every node of the file
//! master_port = 29500            # vLLM multiprocess rendezvous
//! api_port = 8000                # the OpenAI-compatible API
//! ray_port = 6379                # vllm-ray: the Ray head
//! dist_port = 20000              # sglang: --dist-init-addr
//! extra_args = ["--max-model-len", "32768"]
//! template = "..."               # custom engine only
//! image = "xt/vllm:0.11"         # (optional) run every rank in this image
//! gpus = "all"                   # with image: "all" | "none" | ["/dev/nvidia0", ...]
//! shm_size = "16GiB"             # with image: the containers' /dev/shm
//! stream_weights = true          # vllm: start while the weights land (the `xfer` loader plugin)
//! caches = ["vllm"]              # compile caches delivered to every node: vllm | inductor | triton | flashinfer
//!
//! [launch.env]
//! NCCL_DEBUG = "INFO"
//! ```
//!
//! A model given as `ORG/NAME` lives in each node's root, as `xfer sync`
//! and `xfer pull` leave it: `<root>/models--ORG--NAME/snapshots/<commit>`.
//! With a 40-hex `revision` (or `ORG/NAME@<commit>`) the path is complete;
//! with a branch or tag, or none (`main`), the commit is only known on the
//! nodes, so the path keeps a `<COMMIT>` placeholder that `xfer-launch check`
//! is to resolve from `refs/<revision>`. Engines need the model at the same
//! absolute path on every node, so nodes whose roots differ are refused.
//!
//! With `image`, every rank runs inside that container image, which each
//! agent starts itself (`xfer serve --container-engine docker`): the
//! launcher only says which image, which GPUs (`gpus`: `--gpus all`, none,
//! or `--device` each) and how much shared memory (`shm_size`).
//!
//! `[launch.env]` keys that change which code a process loads (`PATH`,
//! `LD_*`, `DOCKER_*`, `PYTHONPATH`, ...) and `gpus` devices other than
//! GPU and RDMA device nodes or CDI names are refused here with their
//! line, as every agent refuses them ([`xfer_proto::launch_rules`]).
//!
//! The reading is split by table: `launch.rs` walks `[launch]` key by
//! key; the model (`model.rs`), `[launch.env]` (`env.rs`), the container
//! keys (`image.rs`) and a custom `template` (`template.rs`) are checked
//! each in their own file, and `resolve.rs` binds the result to the
//! cluster's nodes. Positions and wording come from
//! [`xfer::config::toml_reader`], the reader the cluster file uses.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use xfer::config::cluster::{Cluster, ClusterError, Rdma};
use xfer::config::toml_reader::{TomlError, TomlReader};
use xfer_proto::launch::GpuAccess;

mod env;
mod image;
mod launch;
mod model;
mod resolve;
mod template;
#[cfg(test)]
pub(crate) mod tests;

pub use template::{parse_template, split_words, SplitError, TemplateError};

/// vLLM multiprocess rendezvous port (`master_port`) unless set.
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// The API server's port (`api_port`) unless set.
pub const DEFAULT_API_PORT: u16 = 8000;
/// The Ray head's port (`ray_port`) unless set.
pub const DEFAULT_RAY_PORT: u16 = 6379;
/// SGLang's `--dist-init-addr` port (`dist_port`) unless set.
pub const DEFAULT_DIST_PORT: u16 = 20000;
/// What a repo's path holds until its commit is known.
pub const COMMIT_PLACEHOLDER: &str = "<COMMIT>";
/// Largest tp or pp accepted (a typo guard, not an engine limit).
pub(crate) const MAX_PARALLEL: i128 = 4096;

/// Which engine, and how it is started across nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Engine {
    /// `vllm serve` on every node, multiprocess backend (`--nnodes`,
    /// `--node-rank`, `--master-addr`; `--headless` off the head).
    Vllm,
    /// `ray start` on every node, then `vllm serve` with the Ray backend on
    /// the head.
    VllmRay,
    /// `python -m sglang.launch_server` on every node.
    Sglang,
    /// The `template` command on every node, placeholders filled in.
    Custom,
}

impl Engine {
    pub(crate) const ALL: [(&'static str, Engine); 4] = [
        ("vllm", Engine::Vllm),
        ("vllm-ray", Engine::VllmRay),
        ("sglang", Engine::Sglang),
        ("custom", Engine::Custom),
    ];

    /// The name `engine =` takes.
    pub fn as_str(self) -> &'static str {
        Self::ALL.iter().find(|(_, e)| *e == self).unwrap().0
    }

    pub(crate) fn parse(s: &str) -> Option<Engine> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|(_, e)| *e)
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A placeholder of a custom template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Var {
    /// `{rank}`: the node's rank, 0 on the head.
    Rank,
    /// `{nnodes}`: how many nodes launch.
    Nnodes,
    /// `{head_ip}`: the head's fabric address.
    HeadIp,
    /// `{fabric_ip}`: this node's fabric address.
    FabricIp,
    /// `{fabric_if}`: this node's fabric interface.
    FabricIf,
    /// `{model}`: the model path.
    Model,
    /// `{master_port}`.
    MasterPort,
    /// `{api_port}`.
    ApiPort,
    /// `{ray_port}`.
    RayPort,
    /// `{dist_port}`.
    DistPort,
    /// `{tp}`: the tensor-parallel size.
    Tp,
    /// `{pp}`: the pipeline-parallel size.
    Pp,
    /// `{node}`: this node's name.
    Node,
    /// `{head}`: the head's name.
    Head,
}

/// Every placeholder, as written between braces.
pub const VARS: &[(&str, Var)] = &[
    ("rank", Var::Rank),
    ("nnodes", Var::Nnodes),
    ("head_ip", Var::HeadIp),
    ("fabric_ip", Var::FabricIp),
    ("fabric_if", Var::FabricIf),
    ("model", Var::Model),
    ("master_port", Var::MasterPort),
    ("api_port", Var::ApiPort),
    ("ray_port", Var::RayPort),
    ("dist_port", Var::DistPort),
    ("tp", Var::Tp),
    ("pp", Var::Pp),
    ("node", Var::Node),
    ("head", Var::Head),
];

/// A piece of a template word.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Literal text.
    Lit(String),
    /// A placeholder, filled in per node.
    Var(Var),
}

/// A custom engine's command: words, each a run of literals and
/// placeholders. Placeholders are filled in after the command is split into
/// words, so a value never splits or merges words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// The command's words, each a run of pieces.
    pub words: Vec<Vec<Piece>>,
}

/// The ports the engines listen on (on the head, except where noted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Ports {
    /// vLLM multiprocess: `--master-port`.
    pub master: u16,
    /// The API server: `--port`.
    pub api: u16,
    /// vllm-ray: the Ray head's GCS port.
    pub ray: u16,
    /// SGLang: the port of `--dist-init-addr`.
    pub dist: u16,
}

/// One node as the launch uses it: everything per node comes from its own
/// `[[node]]`, nothing from another's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankNode {
    /// The node's name in the cluster file.
    pub name: String,
    /// Where its xfer agent listens (`HOST:PORT`).
    pub agent: String,
    /// The line of its `[[node]]`, for messages.
    pub line: usize,
    /// Its fabric interface (NCCL's and Gloo's socket interface).
    pub fabric_if: String,
    /// Its address on `fabric_if`.
    pub fabric_ip: IpAddr,
    /// Its RDMA device, if any.
    pub rdma: Option<Rdma>,
    /// Its agent's root (where its compile caches live).
    pub root: PathBuf,
}

/// The model as every node will load it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPath {
    /// The absolute path, the same on every node; may hold
    /// [`COMMIT_PLACEHOLDER`].
    pub path: String,
    /// Set when the path holds [`COMMIT_PLACEHOLDER`]: what resolves it.
    pub unresolved: Option<String>,
    /// The revision whose `refs/` file names the commit, when unresolved.
    pub revision: Option<String>,
    /// The Hub repo (at its revision) the model was named by, if it was:
    /// what `deploy` syncs to the nodes that lack it.
    pub repo: Option<xfer_proto::repo::RepoRef>,
}

impl ModelPath {
    /// The path at `commit`, when it holds [`COMMIT_PLACEHOLDER`] (a repo
    /// at a revision): what `deploy` loads while the sync still runs, before
    /// any node's `refs/` names the commit.
    pub fn at_commit(&mut self, commit: &str) {
        if self.unresolved.is_some() {
            self.path = self.path.replace(COMMIT_PLACEHOLDER, commit);
            self.unresolved = None;
            self.revision = None;
        }
    }
}

/// How the ranks run in a container (`[launch] image`); the agents build
/// the `docker run` themselves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerConfig {
    /// The image reference, as `docker images` lists it.
    pub image: String,
    /// How the GPUs reach the container (default [`GpuAccess::All`]).
    pub gpus: GpuAccess,
    /// `--shm-size`, in bytes (default: the engine's).
    pub shm_bytes: Option<u64>,
}

/// A checked `[launch]` table bound to its nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setup {
    /// Which engine runs.
    pub engine: Engine,
    /// In rank order: `nodes[0]` is the head.
    pub nodes: Vec<RankNode>,
    /// Tensor-parallel size.
    pub tp: u32,
    /// Pipeline-parallel size.
    pub pp: u32,
    /// The model every node loads.
    pub model: ModelPath,
    /// The head's ports.
    pub ports: Ports,
    /// Passed through to the engine, after the launcher's own flags.
    pub extra_args: Vec<String>,
    /// `[launch.env]`, set on every rank.
    pub env: BTreeMap<String, String>,
    /// Set exactly when `engine` is [`Engine::Custom`].
    pub template: Option<Template>,
    /// Set when `[launch] image` is: every rank runs in that image.
    pub container: Option<ContainerConfig>,
    /// The cluster credential (resolved against the file's folder).
    pub key: PathBuf,
    /// The cluster file.
    pub path: PathBuf,
    /// `stream_weights = true` (vllm only): `up` starts the ranks once the
    /// small files are verified on every node, with `--load-format xfer`,
    /// and each rank's loader waits for each shard's verification
    /// ([`crate::stream`]).
    pub stream_weights: bool,
    /// `caches = [...]`: the kinds of compile cache delivered with the
    /// launch ([`crate::caches`]); empty when none.
    pub caches: Vec<String>,
    /// Who starts the ranks once the preflight passed.
    pub runner: Runner,
}

/// Who starts the ranks (`[launch] runner`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Runner {
    /// Each node's xfer agent starts and supervises its rank.
    #[default]
    Agents,
    /// One `srun` step inside the Slurm job `xfer-launch` runs in: Slurm
    /// owns the processes ([`crate::srun`]).
    Srun,
}

impl Runner {
    /// `agents` or `srun`.
    pub fn parse(s: &str) -> Option<Runner> {
        match s {
            "agents" => Some(Runner::Agents),
            "srun" => Some(Runner::Srun),
            _ => None,
        }
    }
}

/// Why a launch could not be planned. Every variant is one line.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The cluster file itself (read, syntax, nodes) was refused.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// Something at a place in the file.
    #[error(transparent)]
    At(#[from] TomlError),
    /// The file has no `[launch]` table.
    #[error("{}: no [launch] table; add one naming the engine and the model: [launch], then engine = \"vllm\" and model = \"Qwen/Qwen3-8B\" (or an absolute path)", path.display())]
    NoLaunchTable {
        /// The cluster file.
        path: PathBuf,
    },
}

impl LaunchError {
    /// The line the error points at, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Cluster(e) => e.line(),
            Self::At(e) => Some(e.line),
            Self::NoLaunchTable { .. } => None,
        }
    }
}

/// Reads the cluster file at `path` and checks its `[launch]` table.
/// Inside a Slurm job, a file with `[slurm]` makes the job's hosts the
/// nodes; `slurm` names the shared file (`Cluster::locate`).
pub fn load(path: impl AsRef<Path>) -> Result<Setup, LaunchError> {
    let (path, job) = Cluster::locate(path.as_ref())?;
    parse_in(&Cluster::read(&path)?, &path, job.as_ref())
}

/// Checks `text`, a whole cluster file (`path` names it in messages).
pub fn parse(text: &str, path: impl AsRef<Path>) -> Result<Setup, LaunchError> {
    parse_in(text, path, None)
}

/// [`parse`] inside the Slurm job `job`.
pub fn parse_in(
    text: &str,
    path: impl AsRef<Path>,
    job: Option<&xfer::config::slurm::Allocation>,
) -> Result<Setup, LaunchError> {
    let path = path.as_ref();
    let p = Parser {
        r: TomlReader::new(text, path),
    };
    // The cluster's own checks come first (its syntax, nodes and fabric),
    // then [launch] from the same parse.
    let (cluster, launch) =
        Cluster::parse_with_launch_in(text, path, job, |launch| match launch {
            Some((header, table)) => p.launch(table, header),
            None => Err(LaunchError::NoLaunchTable {
                path: path.to_path_buf(),
            }),
        })?;
    p.resolve(&cluster, launch?)
}

/// Reads `[launch]`; its methods live in the files of this folder, one
/// group of keys each.
struct Parser<'a> {
    r: TomlReader<'a>,
}

impl Parser<'_> {
    fn err(&self, at: usize, message: impl Into<String>) -> LaunchError {
        self.r.err(at, message).into()
    }
}

/// `"a", "b" or "c"`.
fn quoted_list(items: &[&str]) -> String {
    let q: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
    match q.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}
