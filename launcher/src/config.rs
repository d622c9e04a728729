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

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use toml::de::{DeTable, DeValue};
use toml::Spanned;
use xfer::config::cluster::{Cluster, ClusterError, Node};
use xfer::config::tomltext::{and_list, in_file_order, kind, line_col, suggest};
use xfer_proto::launch::GpuAccess;
use xfer_proto::launch_rules;
use xfer_proto::repo::{RepoRef, RepoType};

pub const DEFAULT_MASTER_PORT: u16 = 29500;
pub const DEFAULT_API_PORT: u16 = 8000;
pub const DEFAULT_RAY_PORT: u16 = 6379;
pub const DEFAULT_DIST_PORT: u16 = 20000;
/// What a repo's path holds until its commit is known.
pub const COMMIT_PLACEHOLDER: &str = "<COMMIT>";
/// Largest tp or pp accepted (a typo guard, not an engine limit).
const MAX_PARALLEL: i128 = 4096;

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
    const ALL: [(&'static str, Engine); 4] = [
        ("vllm", Engine::Vllm),
        ("vllm-ray", Engine::VllmRay),
        ("sglang", Engine::Sglang),
        ("custom", Engine::Custom),
    ];

    pub fn as_str(self) -> &'static str {
        Self::ALL.iter().find(|(_, e)| *e == self).unwrap().0
    }

    fn parse(s: &str) -> Option<Engine> {
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
    Rank,
    Nnodes,
    HeadIp,
    FabricIp,
    FabricIf,
    Model,
    MasterPort,
    ApiPort,
    RayPort,
    DistPort,
    Tp,
    Pp,
    Node,
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
    Lit(String),
    Var(Var),
}

/// A custom engine's command: words, each a run of literals and
/// placeholders. Placeholders are filled in after the command is split into
/// words, so a value never splits or merges words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
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
    pub name: String,
    /// Where its xfer agent listens (`HOST:PORT`).
    pub agent: String,
    /// The line of its `[[node]]`, for messages.
    pub line: usize,
    pub fabric_if: String,
    pub fabric_ip: IpAddr,
    pub rdma: Option<xfer::config::cluster::Rdma>,
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
    pub engine: Engine,
    /// In rank order: `nodes[0]` is the head.
    pub nodes: Vec<RankNode>,
    pub tp: u32,
    pub pp: u32,
    pub model: ModelPath,
    pub ports: Ports,
    pub extra_args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Set exactly when `engine` is [`Engine::Custom`].
    pub template: Option<Template>,
    /// Set when `[launch] image` is: every rank runs in that image.
    pub container: Option<ContainerConfig>,
    /// The cluster credential (resolved against the file's folder).
    pub key: PathBuf,
    /// The cluster file.
    pub path: PathBuf,
}

/// Why a launch could not be planned. Every variant is one line.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// Something at a place in the file; `line` and `col` are 1-based.
    #[error("{}:{line}:{col}: {message}", path.display())]
    At {
        path: PathBuf,
        line: usize,
        col: usize,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
}

impl LaunchError {
    /// The line the error points at, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Cluster(e) => e.line(),
            Self::At { line, .. } => Some(*line),
            Self::File { .. } => None,
        }
    }
}

/// Reads the cluster file at `path` and checks its `[launch]` table.
pub fn load(path: impl AsRef<Path>) -> Result<Setup, LaunchError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|err| ClusterError::Read {
        path: path.to_path_buf(),
        err,
    })?;
    parse(&text, path)
}

/// Checks `text`, a whole cluster file (`path` names it in messages).
pub fn parse(text: &str, path: impl AsRef<Path>) -> Result<Setup, LaunchError> {
    let path = path.as_ref();
    let p = Parser { text, path };
    // The cluster's own checks come first (its syntax, nodes and fabric),
    // then [launch] from the same parse.
    let (cluster, launch) = Cluster::parse_with_launch(text, path, |launch| {
        match launch {
        Some((header, table)) => p.launch(table, header),
        None => Err(LaunchError::File {
            path: path.to_path_buf(),
            message: "no [launch] table; add one naming the engine and the model: [launch], then engine = \"vllm\" and model = \"Qwen/Qwen3-8B\" (or an absolute path)".into(),
        }),
    }
    })?;
    p.resolve(&cluster, launch?)
}

/// A value and the byte offset where it is written.
#[derive(Clone, Debug)]
struct At<T> {
    v: T,
    at: usize,
}

/// The model as written.
#[derive(Clone, Debug)]
enum ModelSpec {
    Path(String),
    /// `explicit` when the repo string carried `@REVISION` itself.
    Repo {
        repo: RepoRef,
        explicit: bool,
    },
}

/// `[launch]` as written, each value checked alone.
#[derive(Debug)]
struct Launch {
    header: usize,
    engine: Option<At<Engine>>,
    model: Option<At<ModelSpec>>,
    /// `revision` next to a string `model`.
    revision: Option<At<String>>,
    tp: Option<At<u32>>,
    pp: Option<At<u32>>,
    head: Option<At<String>>,
    nodes: Option<Vec<At<String>>>,
    ports: Ports,
    port_at: BTreeMap<&'static str, usize>,
    extra_args: Vec<At<String>>,
    env: BTreeMap<String, String>,
    template: Option<At<Template>>,
    image: Option<At<String>>,
    gpus: Option<At<GpuAccess>>,
    shm_size: Option<At<u64>>,
}

/// Keys of `[launch]`.
const LAUNCH_KEYS: &[&str] = &[
    "engine",
    "model",
    "revision",
    "tp",
    "pp",
    "head",
    "nodes",
    "master_port",
    "api_port",
    "ray_port",
    "dist_port",
    "extra_args",
    "env",
    "template",
    "image",
    "gpus",
    "shm_size",
];
/// Keys of a `model = { ... }` table.
const MODEL_KEYS: &[&str] = &["path", "repo", "revision"];
/// Other words for `[launch]` keys, tried before edit distance.
const ALIASES: &[(&str, &str)] = &[
    ("tensor_parallel_size", "tp"),
    ("tensor_parallel", "tp"),
    ("tp_size", "tp"),
    ("pipeline_parallel_size", "pp"),
    ("pipeline_parallel", "pp"),
    ("pp_size", "pp"),
    ("backend", "engine"),
    ("model_path", "model"),
    ("path", "model"),
    ("repo", "model"),
    ("args", "extra_args"),
    ("extra", "extra_args"),
    ("engine_args", "extra_args"),
    ("environment", "env"),
    ("command", "template"),
    ("cmd", "template"),
    ("port", "api_port"),
    ("head_node", "head"),
    ("master", "head"),
    ("container", "image"),
    ("container_image", "image"),
    ("docker_image", "image"),
    ("gpu", "gpus"),
    ("devices", "gpus"),
    ("shm", "shm_size"),
    ("shm_bytes", "shm_size"),
    ("shared_memory", "shm_size"),
];
/// Environment variables the launcher sets per node from the cluster file.
const RESERVED_ENV: &[(&str, &str)] = &[
    ("VLLM_HOST_IP", "fabric_ip of each [[node]]"),
    ("SGLANG_HOST_IP", "fabric_ip of each [[node]]"),
    ("NCCL_SOCKET_IFNAME", "fabric_if of each [[node]]"),
    ("GLOO_SOCKET_IFNAME", "fabric_if of each [[node]]"),
    ("NCCL_IB_HCA", "rdma_device of each [[node]]"),
    ("NCCL_IB_GID_INDEX", "gid_index of each [[node]]"),
    (
        "HF_HUB_OFFLINE",
        "the launcher (always 1: the model is already on every node)",
    ),
    (
        "RAY_memory_monitor_refresh_ms",
        "the launcher (always 0 with vllm-ray)",
    ),
];

type Val<'i> = Spanned<DeValue<'i>>;

struct Parser<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Parser<'_> {
    fn err(&self, at: usize, message: impl Into<String>) -> LaunchError {
        let (line, col) = line_col(self.text, at);
        LaunchError::At {
            path: self.path.to_path_buf(),
            line,
            col,
            message: message.into(),
        }
    }

    fn launch(&self, table: &DeTable, header: usize) -> Result<Launch, LaunchError> {
        let mut l = Launch {
            header,
            engine: None,
            model: None,
            revision: None,
            tp: None,
            pp: None,
            head: None,
            nodes: None,
            ports: Ports {
                master: DEFAULT_MASTER_PORT,
                api: DEFAULT_API_PORT,
                ray: DEFAULT_RAY_PORT,
                dist: DEFAULT_DIST_PORT,
            },
            port_at: BTreeMap::new(),
            extra_args: Vec::new(),
            env: BTreeMap::new(),
            template: None,
            image: None,
            gpus: None,
            shm_size: None,
        };
        for (k, v) in in_file_order(table) {
            let key: &str = k.get_ref();
            let at = v.span().start;
            match key {
                "engine" => {
                    let s = self.string(key, v, "\"vllm\"")?;
                    let e = Engine::parse(s).ok_or_else(|| {
                        let names: Vec<&str> = Engine::ALL.iter().map(|(n, _)| *n).collect();
                        let hint = suggest(s, &names, &[("ray", "vllm-ray"), ("sgl", "sglang")])
                            .map(|n| format!("did you mean \"{n}\"? "))
                            .unwrap_or_default();
                        self.err(
                            at,
                            format!(
                                "unknown engine {s:?}; {hint}engine is one of {}",
                                quoted_list(&names)
                            ),
                        )
                    })?;
                    l.engine = Some(At { v: e, at });
                }
                "model" => {
                    l.model = Some(At {
                        v: self.model(v)?,
                        at,
                    })
                }
                "revision" => {
                    let s = self.string(key, v, "\"main\"")?;
                    l.revision = Some(At {
                        v: self.revision(s, at)?,
                        at,
                    });
                }
                "tp" | "pp" => {
                    let n = self.integer(key, v, "2")?;
                    if !(1..=MAX_PARALLEL).contains(&n) {
                        return Err(self.err(
                            at,
                            format!("{key} = {n} is out of range; it counts GPUs, from 1 to {MAX_PARALLEL}"),
                        ));
                    }
                    let n = At { v: n as u32, at };
                    if key == "tp" {
                        l.tp = Some(n);
                    } else {
                        l.pp = Some(n);
                    }
                }
                "head" => {
                    let s = self.string(key, v, "\"spark-a\"")?;
                    l.head = Some(At {
                        v: s.to_string(),
                        at,
                    });
                }
                "nodes" => {
                    let DeValue::Array(items) = v.get_ref() else {
                        return Err(self.err(
                            at,
                            format!(
                                "nodes is {}; write a list of node names, like nodes = [\"spark-a\", \"spark-b\"]",
                                kind(v.get_ref())
                            ),
                        ));
                    };
                    if items.is_empty() {
                        return Err(self.err(
                            at,
                            "nodes is empty; list the nodes to launch on, or drop nodes to use every node",
                        ));
                    }
                    let mut names = Vec::new();
                    for item in items.iter() {
                        let s = self.string("a node name in nodes", item, "\"spark-a\"")?;
                        names.push(At {
                            v: s.to_string(),
                            at: item.span().start,
                        });
                    }
                    l.nodes = Some(names);
                }
                "master_port" | "api_port" | "ray_port" | "dist_port" => {
                    let n = self.integer(key, v, "8000")?;
                    let port = match u16::try_from(n) {
                        Ok(p) if p > 0 => p,
                        _ => {
                            return Err(self
                                .err(at, format!("{key} = {n} is not a port; ports run 1-65535")))
                        }
                    };
                    let (name, slot) = match key {
                        "master_port" => ("master_port", &mut l.ports.master),
                        "api_port" => ("api_port", &mut l.ports.api),
                        "ray_port" => ("ray_port", &mut l.ports.ray),
                        _ => ("dist_port", &mut l.ports.dist),
                    };
                    *slot = port;
                    l.port_at.insert(name, at);
                }
                "extra_args" => {
                    let DeValue::Array(items) = v.get_ref() else {
                        return Err(self.err(
                            at,
                            format!(
                                "extra_args is {}; write a list with one argument per item, like extra_args = [\"--max-model-len\", \"32768\"]",
                                kind(v.get_ref())
                            ),
                        ));
                    };
                    for item in items.iter() {
                        let s = match item.get_ref() {
                            DeValue::String(s) => s.to_string(),
                            DeValue::Integer(i) => int_value(i).to_string(),
                            DeValue::Float(f) => f.as_str().to_string(),
                            other => {
                                return Err(self.err(
                                    item.span().start,
                                    format!(
                                        "an item of extra_args is {}; write each argument as a string, like \"--enforce-eager\"",
                                        kind(other)
                                    ),
                                ))
                            }
                        };
                        if s.contains('\0') {
                            return Err(self.err(
                                item.span().start,
                                "an item of extra_args holds a NUL character, which no command line can carry",
                            ));
                        }
                        l.extra_args.push(At {
                            v: s,
                            at: item.span().start,
                        });
                    }
                }
                "env" => l.env = self.env(v)?,
                "image" => {
                    let s = self.string(key, v, "\"nvcr.io/nvidia/vllm:25.09-py3\"")?;
                    xfer_proto::image::check_reference(s).map_err(|e| {
                        self.err(
                            at,
                            format!("image: {e}; write the reference the image has in `docker images` on the operator's machine, like image = \"nvcr.io/nvidia/vllm:25.09-py3\""),
                        )
                    })?;
                    l.image = Some(At {
                        v: s.to_string(),
                        at,
                    });
                }
                "gpus" => {
                    l.gpus = Some(At {
                        v: self.gpus(v)?,
                        at,
                    })
                }
                "shm_size" => {
                    l.shm_size = Some(At {
                        v: self.shm_size(v)?,
                        at,
                    })
                }
                "template" => {
                    l.template = Some(At {
                        v: self.template(v)?,
                        at,
                    })
                }
                other => {
                    let hint = match suggest(other, LAUNCH_KEYS, ALIASES) {
                        Some(s) => format!("did you mean {s:?}?"),
                        None => format!("[launch] takes {}", and_list(LAUNCH_KEYS)),
                    };
                    return Err(self.err(
                        k.span().start,
                        format!("unknown key {other:?} in [launch]; {hint}"),
                    ));
                }
            }
        }
        Ok(l)
    }

    fn model(&self, v: &Val) -> Result<ModelSpec, LaunchError> {
        let at = v.span().start;
        match v.get_ref() {
            DeValue::String(s) => self.model_string(s, at),
            DeValue::Table(t) => {
                let mut path = None;
                let mut repo = None;
                let mut revision = None;
                for (k, v) in in_file_order(t) {
                    let key: &str = k.get_ref();
                    match key {
                        "path" => {
                            let s = self.string("model.path", v, "\"/models/Qwen3-8B\"")?;
                            path = Some(At {
                                v: self.abs_path(s, v.span().start)?,
                                at: v.span().start,
                            });
                        }
                        "repo" => {
                            let s = self.string("model.repo", v, "\"Qwen/Qwen3-8B\"")?;
                            repo = Some(self.repo(s, v.span().start)?);
                        }
                        "revision" => {
                            let s = self.string("model.revision", v, "\"main\"")?;
                            revision = Some(At {
                                v: self.revision(s, v.span().start)?,
                                at: v.span().start,
                            });
                        }
                        other => {
                            let hint = match suggest(other, MODEL_KEYS, &[("commit", "revision")]) {
                                Some(s) => format!("did you mean {s:?}?"),
                                None => "model takes path, or repo and an optional revision".into(),
                            };
                            return Err(self.err(
                                k.span().start,
                                format!("unknown key {other:?} in model; {hint}"),
                            ));
                        }
                    }
                }
                match (path, repo, revision) {
                    (Some(p), Some(_), _) => Err(self.err(
                        p.at,
                        "model has both path and repo; keep one: path for a folder at the same absolute path on every node, repo for ORG/NAME in each node's root",
                    )),
                    (Some(_), None, Some(r)) => Err(self.err(
                        r.at,
                        "model has a revision but no repo; a revision only applies to repo = \"ORG/NAME\"",
                    )),
                    (Some(p), None, None) => Ok(ModelSpec::Path(p.v)),
                    (None, Some(r), rev) => self.with_revision(r, rev),
                    (None, None, _) => Err(self.err(
                        at,
                        "model names no model; write model = { path = \"/abs/path\" } or model = { repo = \"ORG/NAME\" }",
                    )),
                }
            }
            other => Err(self.err(
                at,
                format!(
                    "model is {}; write an absolute path or ORG/NAME, like model = \"Qwen/Qwen3-8B\"",
                    kind(other)
                ),
            )),
        }
    }

    fn model_string(&self, s: &str, at: usize) -> Result<ModelSpec, LaunchError> {
        if s.starts_with('/') {
            return Ok(ModelSpec::Path(self.abs_path(s, at)?));
        }
        match RepoRef::parse(s, RepoType::Model) {
            Ok(_) => self.repo(s, at),
            Err(_) => Err(self.err(
                at,
                format!(
                    "model {s:?} is neither an absolute path nor a Hub repo; write the folder's absolute path (the same on every node), e.g. \"/models/Qwen3-8B\", or ORG/NAME[@REVISION], e.g. \"Qwen/Qwen3-8B\""
                ),
            )),
        }
    }

    /// Applies a separate `revision` to a repo model.
    fn with_revision(
        &self,
        model: ModelSpec,
        revision: Option<At<String>>,
    ) -> Result<ModelSpec, LaunchError> {
        match (model, revision) {
            (m, None) => Ok(m),
            (ModelSpec::Path(_), Some(r)) => Err(self.err(
                r.at,
                "revision applies to a Hub repo, but model is a path; drop revision or write model = \"ORG/NAME\"",
            )),
            (ModelSpec::Repo { repo, explicit: true }, Some(r)) => Err(self.err(
                r.at,
                format!(
                    "the revision is given twice (@{} in the repo, {:?} here); keep one",
                    repo.revision, r.v
                ),
            )),
            (ModelSpec::Repo { repo, .. }, Some(r)) => Ok(ModelSpec::Repo {
                repo: RepoRef {
                    revision: r.v,
                    ..repo
                },
                explicit: true,
            }),
        }
    }

    /// `ORG/NAME[@REVISION]`.
    fn repo(&self, s: &str, at: usize) -> Result<ModelSpec, LaunchError> {
        let r = RepoRef::parse(s, RepoType::Model).map_err(|e| self.err(at, e.to_string()))?;
        let rev = r.revision.clone();
        Ok(ModelSpec::Repo {
            repo: RepoRef {
                revision: self.revision(&rev, at)?,
                ..r
            },
            explicit: s.contains('@'),
        })
    }

    fn revision(&self, s: &str, at: usize) -> Result<String, LaunchError> {
        if s.is_empty() || s.contains(['\0', '\n']) || s.contains("..") {
            return Err(self.err(
                at,
                format!("revision {s:?} is not a branch, tag or commit; write e.g. \"main\" or the 40-hex commit"),
            ));
        }
        Ok(s.to_string())
    }

    fn abs_path(&self, s: &str, at: usize) -> Result<String, LaunchError> {
        if !s.starts_with('/') {
            return Err(self.err(
                at,
                format!(
                    "model path {s:?} is relative; write the absolute path, the same on every node"
                ),
            ));
        }
        if s.contains('\0') || s.split('/').any(|c| c == "..") {
            return Err(self.err(
                at,
                format!("model path {s:?} has a NUL or a \"..\" component; write the plain absolute path"),
            ));
        }
        Ok(s.to_string())
    }

    fn env(&self, v: &Val) -> Result<BTreeMap<String, String>, LaunchError> {
        let DeValue::Table(t) = v.get_ref() else {
            return Err(self.err(
                v.span().start,
                format!(
                    "env is {}; write a table of NAME = \"value\", e.g. env = {{ NCCL_DEBUG = \"INFO\" }}",
                    kind(v.get_ref())
                ),
            ));
        };
        let mut env = BTreeMap::new();
        for (k, v) in in_file_order(t) {
            let name: &str = k.get_ref();
            let at = k.span().start;
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(self.err(
                    at,
                    format!("env name {name:?} is not a variable name; use letters, digits and '_', not starting with a digit"),
                ));
            }
            if let Some((_, from)) = RESERVED_ENV.iter().find(|(n, _)| *n == name) {
                return Err(self.err(
                    at,
                    format!(
                        "env sets {name}, which xfer-launch sets itself from the {from}; drop it from [launch.env]"
                    ),
                ));
            }
            let value = match v.get_ref() {
                DeValue::String(s) => s.to_string(),
                DeValue::Integer(i) => int_value(i).to_string(),
                other => {
                    return Err(self.err(
                        v.span().start,
                        format!(
                            "env {name} is {}; write it as a string, like {name} = \"1\"",
                            kind(other)
                        ),
                    ))
                }
            };
            if value.contains('\0') {
                return Err(self.err(
                    v.span().start,
                    format!("env {name} holds a NUL character, which no environment can carry"),
                ));
            }
            // What every agent refuses too (its check is the boundary).
            launch_rules::check_env(name, &value).map_err(|e| self.err(at, e.to_string()))?;
            env.insert(name.to_string(), value);
        }
        Ok(env)
    }

    /// `gpus = "all" | "none" | ["DEVICE", ...]`.
    fn gpus(&self, v: &Val) -> Result<GpuAccess, LaunchError> {
        let at = v.span().start;
        const FORMS: &str = "gpus = \"all\" (--gpus all, the NVIDIA runtime), gpus = \"none\", or a list of devices, like gpus = [\"nvidia.com/gpu=all\"] or [\"/dev/nvidia0\"]";
        match v.get_ref() {
            DeValue::String(s) => match s.as_ref() {
                "all" => Ok(GpuAccess::All),
                "none" => Ok(GpuAccess::None),
                other => {
                    let hint = suggest(
                        other,
                        &["all", "none"],
                        &[
                            ("yes", "all"),
                            ("no", "none"),
                            ("true", "all"),
                            ("false", "none"),
                        ],
                    )
                    .map(|n| format!("did you mean \"{n}\"? "))
                    .unwrap_or_default();
                    Err(self.err(
                        at,
                        format!("gpus = {other:?} is not a choice; {hint}write {FORMS}"),
                    ))
                }
            },
            DeValue::Array(items) => {
                if items.is_empty() {
                    return Err(self.err(
                        at,
                        "gpus is an empty list; write gpus = \"none\" for no GPU, or list the devices",
                    ));
                }
                let mut devices = Vec::with_capacity(items.len());
                for item in items.iter() {
                    let d = self.string("a device in gpus", item, "\"/dev/nvidia0\"")?;
                    if d.is_empty()
                        || d.starts_with('-')
                        || d.contains(|c: char| c.is_whitespace() || c == '\0')
                    {
                        return Err(self.err(
                            item.span().start,
                            format!("gpus lists {d:?}, which is not a device; write a CDI name or a path, like \"nvidia.com/gpu=all\" or \"/dev/nvidia0\""),
                        ));
                    }
                    launch_rules::check_device(d)
                        .map_err(|e| self.err(item.span().start, e.to_string()))?;
                    devices.push(d.to_string());
                }
                Ok(GpuAccess::Devices(devices))
            }
            other => Err(self.err(at, format!("gpus is {}; write {FORMS}", kind(other)))),
        }
    }

    /// `shm_size = "16GiB"` (or a number of bytes).
    fn shm_size(&self, v: &Val) -> Result<u64, LaunchError> {
        let at = v.span().start;
        let n = match v.get_ref() {
            DeValue::String(s) => xfer_proto::units::parse_size(s)
                .map_err(|e| self.err(at, format!("shm_size: {e}")))?,
            DeValue::Integer(i) => u64::try_from(int_value(i)).map_err(|_| {
                self.err(
                    at,
                    "shm_size is negative; write a size, like shm_size = \"16GiB\"",
                )
            })?,
            other => {
                return Err(self.err(
                    at,
                    format!(
                        "shm_size is {}; write a size, like shm_size = \"16GiB\"",
                        kind(other)
                    ),
                ))
            }
        };
        if n == 0 {
            return Err(self.err(
                at,
                "shm_size is 0; write a size, like shm_size = \"16GiB\", or remove shm_size for the engine's default",
            ));
        }
        Ok(n)
    }

    /// The container settings: `gpus` and `shm_size` only with `image`.
    fn container(&self, l: &Launch) -> Result<Option<ContainerConfig>, LaunchError> {
        let Some(image) = &l.image else {
            if let Some(s) = &l.shm_size {
                return Err(self.err(
                    s.at,
                    "shm_size only applies to the ranks' containers, but [launch] has no image; add image = \"NAME:TAG\", or remove shm_size",
                ));
            }
            if let Some(g) = &l.gpus {
                return Err(self.err(
                    g.at,
                    "gpus only applies to the ranks' containers, but [launch] has no image (on the host every rank sees every GPU); add image = \"NAME:TAG\", or remove gpus",
                ));
            }
            return Ok(None);
        };
        Ok(Some(ContainerConfig {
            image: image.v.clone(),
            gpus: l.gpus.as_ref().map_or(GpuAccess::All, |g| g.v.clone()),
            shm_bytes: l.shm_size.as_ref().map(|s| s.v),
        }))
    }

    fn template(&self, v: &Val) -> Result<Template, LaunchError> {
        let at = v.span().start;
        let words: Vec<String> = match v.get_ref() {
            DeValue::String(s) => split_words(s).map_err(|e| self.err(at, format!("template: {e}")))?,
            DeValue::Array(items) => items
                .iter()
                .map(|item| {
                    self.string("an item of template", item, "\"--port\"")
                        .map(str::to_string)
                })
                .collect::<Result<_, _>>()?,
            other => {
                return Err(self.err(
                    at,
                    format!(
                        "template is {}; write the command as a string with placeholders, like template = \"my-engine --rank {{rank}} --head {{head_ip}}\"",
                        kind(other)
                    ),
                ))
            }
        };
        if words.is_empty() {
            return Err(self.err(at, "template is empty; write the command each node runs"));
        }
        parse_template(&words).map_err(|e| self.err(at, format!("template: {e}")))
    }

    /// Binds the table to the cluster's nodes and checks what depends on them.
    fn resolve(&self, cluster: &Cluster, l: Launch) -> Result<Setup, LaunchError> {
        let engine = l.engine.as_ref().map(|e| e.v).ok_or_else(|| {
            self.err(
                l.header,
                "[launch] has no engine; add engine = \"vllm\" (or \"vllm-ray\", \"sglang\", \"custom\")",
            )
        })?;
        let model_spec = l.model.clone().ok_or_else(|| {
            self.err(
                l.header,
                "[launch] has no model; add model = \"/abs/path\" (the same on every node) or model = \"ORG/NAME\" (in each node's root)",
            )
        })?;
        let model_spec = At {
            v: self.with_revision(model_spec.v, l.revision.clone())?,
            at: model_spec.at,
        };
        match (&l.template, engine) {
            (None, Engine::Custom) => {
                return Err(self.err(
                    l.engine.as_ref().map_or(l.header, |e| e.at),
                    "engine = \"custom\" needs a template; add template = \"COMMAND {rank} {head_ip} ...\" (placeholders: ".to_string()
                        + &VARS.iter().map(|(n, _)| format!("{{{n}}}")).collect::<Vec<_>>().join(", ")
                        + ")",
                ))
            }
            (Some(t), e) if e != Engine::Custom => {
                return Err(self.err(
                    t.at,
                    format!("template only applies to engine = \"custom\", but engine is \"{e}\"; drop template or set engine = \"custom\""),
                ))
            }
            _ => {}
        }

        // The nodes, head first.
        let mut picked: Vec<&Node> = Vec::new();
        match &l.nodes {
            None => picked.extend(cluster.nodes.iter()),
            Some(names) => {
                for name in names {
                    let Some(node) = cluster.node(&name.v) else {
                        let known: Vec<&str> =
                            cluster.nodes.iter().map(|n| n.name.as_str()).collect();
                        return Err(self.err(
                            name.at,
                            format!(
                                "nodes names {:?}, which is not a [[node]] of this file; the nodes are {}",
                                name.v,
                                known.join(", ")
                            ),
                        ));
                    };
                    if picked.iter().any(|n| n.name == node.name) {
                        return Err(self.err(
                            name.at,
                            format!("nodes lists {:?} twice; list each node once", name.v),
                        ));
                    }
                    picked.push(node);
                }
            }
        }
        if let Some(head) = &l.head {
            let Some(i) = picked.iter().position(|n| n.name.as_str() == head.v) else {
                let names: Vec<&str> = picked.iter().map(|n| n.name.as_str()).collect();
                let why = if cluster.node(&head.v).is_some() {
                    "is not in nodes"
                } else {
                    "is not a [[node]] of this file"
                };
                return Err(self.err(
                    head.at,
                    format!(
                        "head {:?} {why}; the head must be one of the launch nodes: {}",
                        head.v,
                        names.join(", ")
                    ),
                ));
            };
            let h = picked.remove(i);
            picked.insert(0, h);
        }
        let mut nodes = Vec::with_capacity(picked.len());
        for node in &picked {
            let (Some(fabric_if), Some(fabric_ip)) = (&node.fabric_if, node.fabric_ip) else {
                return Err(self.at_line(
                    node.line,
                    format!(
                        "node {:?} has no fabric_ip; NCCL/Ray would pick an interface by themselves, which is the hang this tool prevents: add fabric_if and fabric_ip (its address on the fabric, see `ip -br addr`) to its [[node]], or leave it out of [launch] nodes",
                        node.name.as_str()
                    ),
                ));
            };
            nodes.push(RankNode {
                name: node.name.to_string(),
                agent: node.agent.clone(),
                line: node.line,
                fabric_if: fabric_if.clone(),
                fabric_ip,
                rdma: node.rdma.clone(),
            });
        }
        let nnodes = nodes.len() as u32;

        let tp = l.tp.as_ref().map_or(1, |t| t.v);
        let pp = l.pp.as_ref().map_or(nnodes, |p| p.v);
        if engine != Engine::Custom && (tp * pp) % nnodes != 0 {
            let at = l.tp.as_ref().or(l.pp.as_ref()).map_or(l.header, |v| v.at);
            return Err(self.err(
                at,
                format!(
                    "tp × pp = {tp} × {pp} = {} GPUs do not split evenly over {nnodes} nodes; every node runs (tp × pp) / {nnodes} of them, so make tp × pp a multiple of {nnodes} (e.g. tp = GPUs per node and pp = {nnodes})",
                    tp * pp
                ),
            ));
        }

        let used: &[(&str, u16)] = match engine {
            Engine::Vllm => &[("master_port", l.ports.master), ("api_port", l.ports.api)],
            Engine::VllmRay => &[("ray_port", l.ports.ray), ("api_port", l.ports.api)],
            Engine::Sglang => &[("dist_port", l.ports.dist), ("api_port", l.ports.api)],
            Engine::Custom => &[],
        };
        if let [(a, pa), (b, pb)] = used {
            if pa == pb {
                let at = l
                    .port_at
                    .get(b)
                    .or(l.port_at.get(a))
                    .copied()
                    .unwrap_or(l.header);
                return Err(self.err(
                    at,
                    format!("{a} and {b} are both {pa}; the head listens on both, so give them different ports"),
                ));
            }
        }

        for arg in &l.extra_args {
            if let Some((flag, fix)) = managed_flag(engine, &arg.v) {
                return Err(self.err(
                    arg.at,
                    format!("extra_args has {flag}, which xfer-launch sets itself; {fix}"),
                ));
            }
        }

        let model = self.model_path(&picked, model_spec)?;
        let container = self.container(&l)?;
        Ok(Setup {
            engine,
            nodes,
            tp,
            pp,
            model,
            ports: l.ports,
            extra_args: l.extra_args.into_iter().map(|a| a.v).collect(),
            env: l.env,
            template: l.template.map(|t| t.v),
            container,
            key: cluster.key.clone(),
            path: cluster.path.clone(),
        })
    }

    /// The one absolute path every launch node loads the model from.
    fn model_path(&self, nodes: &[&Node], model: At<ModelSpec>) -> Result<ModelPath, LaunchError> {
        let repo = match model.v {
            ModelSpec::Path(p) => {
                return Ok(ModelPath {
                    path: p,
                    unresolved: None,
                    revision: None,
                })
            }
            ModelSpec::Repo { repo, .. } => repo,
        };
        let commit = is_commit(&repo.revision).then(|| repo.revision.clone());
        let leaf = commit.clone().unwrap_or_else(|| COMMIT_PLACEHOLDER.into());
        let path_on = |n: &Node| {
            n.root
                .join(repo.cache_folder())
                .join("snapshots")
                .join(&leaf)
                .display()
                .to_string()
        };
        let first = nodes[0];
        let path = path_on(first);
        if let Some(other) = nodes.iter().find(|n| path_on(n) != path) {
            return Err(self.err(
                model.at,
                format!(
                    "model {} resolves to {} on {} (line {}) but to {} on {} (line {}); the engine loads one absolute path on every node: give these nodes the same root, or make the snapshot reachable at one path everywhere and set model = \"/that/path\"",
                    repo.id,
                    path,
                    first.name,
                    first.line,
                    path_on(other),
                    other.name,
                    other.line
                ),
            ));
        }
        let unresolved = commit.is_none().then(|| {
            format!(
                "{} is at a revision ({}), not a commit: the path holds {COMMIT_PLACEHOLDER}; `xfer-launch check` resolves it from {}/{}/refs/{} on each node (or set revision = \"<40-hex commit>\")",
                repo.id,
                repo.revision,
                first.root.display(),
                repo.cache_folder(),
                repo.revision
            )
        });
        let revision = commit.is_none().then(|| repo.revision.clone());
        Ok(ModelPath {
            path,
            unresolved,
            revision,
        })
    }

    fn at_line(&self, line: usize, message: String) -> LaunchError {
        LaunchError::At {
            path: self.path.to_path_buf(),
            line,
            col: 1,
            message,
        }
    }

    fn string<'v>(&self, key: &str, v: &'v Val, example: &str) -> Result<&'v str, LaunchError> {
        match v.get_ref() {
            DeValue::String(s) => Ok(s),
            other => Err(self.err(
                v.span().start,
                format!(
                    "{key} is {}; write a quoted string, like {example}",
                    kind(other)
                ),
            )),
        }
    }

    fn integer(&self, key: &str, v: &Val, example: &str) -> Result<i128, LaunchError> {
        match v.get_ref() {
            DeValue::Integer(i) => Ok(int_value(i)),
            other => Err(self.err(
                v.span().start,
                format!(
                    "{key} is {}; write a whole number, like {key} = {example}",
                    kind(other)
                ),
            )),
        }
    }
}

fn int_value(i: &toml::de::DeInteger) -> i128 {
    // Beyond i128 is out of every range here anyway.
    i128::from_str_radix(i.as_str(), i.radix()).unwrap_or(i128::MAX)
}

/// A full 40-hex commit id.
fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A flag of `extra_args` that the launcher sets itself, and the fix.
fn managed_flag(engine: Engine, arg: &str) -> Option<(&'static str, &'static str)> {
    const TP: &str = "set tp = N in [launch] instead";
    const PP: &str = "set pp = N in [launch] instead";
    const NODES: &str = "it follows from the launch nodes and the head";
    const API: &str = "set api_port in [launch] instead";
    const MODEL: &str = "set model in [launch] instead";
    const BACKEND: &str = "choose engine = \"vllm\" (multiprocess) or \"vllm-ray\" instead";
    let vllm: &[(&str, &str)] = &[
        ("--tensor-parallel-size", TP),
        ("-tp", TP),
        ("--pipeline-parallel-size", PP),
        ("-pp", PP),
        ("--nnodes", NODES),
        ("--node-rank", NODES),
        ("--master-addr", NODES),
        ("--master-port", "set master_port in [launch] instead"),
        ("--headless", NODES),
        ("--distributed-executor-backend", BACKEND),
        ("--port", API),
        ("--model", MODEL),
    ];
    let sglang: &[(&str, &str)] = &[
        ("--tp", TP),
        ("--tp-size", TP),
        ("--tensor-parallel-size", TP),
        ("--pp-size", PP),
        ("--pipeline-parallel-size", PP),
        ("--nnodes", NODES),
        ("--node-rank", NODES),
        (
            "--dist-init-addr",
            "set dist_port in [launch]; the address is the head's fabric_ip",
        ),
        ("--port", API),
        ("--model-path", MODEL),
        ("--model", MODEL),
    ];
    let flags = match engine {
        Engine::Vllm | Engine::VllmRay => vllm,
        Engine::Sglang => sglang,
        Engine::Custom => return None,
    };
    // Both engines accept `--a_b` for `--a-b` and `--flag=value`.
    let name = arg.split_once('=').map_or(arg, |(n, _)| n);
    let name = if name.starts_with("--") {
        name.replace('_', "-")
    } else {
        name.to_string()
    };
    flags
        .iter()
        .find(|(f, _)| *f == name)
        .map(|(f, fix)| (*f, *fix))
}

/// Splits a command into words as a POSIX shell would, without expanding
/// anything: blanks separate words, `'...'` keeps everything, `"..."` keeps
/// everything but `\"`, `\\`, `\$` and `` \` ``, and `\` outside quotes
/// keeps the next character. What a shell would expand or interpret (`$`,
/// `` ` ``, `|`, `&`, `;`, `<`, `>`, `(`, `)` outside single quotes) is
/// refused, since the command runs without a shell.
pub fn split_words(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur: Option<String> = None;
    let mut chars = s.chars().peekable();
    let shell_only = |c: char| {
        format!(
            "{c:?} needs a shell, but the command runs without one; quote it with '...' for a literal, or write the command as bash -c '...'"
        )
    };
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = cur.take() {
                    words.push(w);
                }
            }
            '\'' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("a ' is never closed".into()),
                    }
                }
            }
            '"' => {
                let w = cur.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => w.push(c),
                            Some('\n') => {}
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => return Err("a \" is never closed".into()),
                        },
                        Some(c @ ('$' | '`')) => return Err(shell_only(c)),
                        Some(c) => w.push(c),
                        None => return Err("a \" is never closed".into()),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(c) => cur.get_or_insert_with(String::new).push(c),
                None => return Err("it ends with a lone \\".into()),
            },
            '$' | '`' | '|' | '&' | ';' | '<' | '>' | '(' | ')' => return Err(shell_only(c)),
            c => cur.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(w) = cur {
        words.push(w);
    }
    Ok(words)
}

/// Parses the placeholders of each word: `{name}` is a placeholder, `{{`
/// and `}}` are literal braces. Every unknown name is reported at once.
pub fn parse_template(words: &[String]) -> Result<Template, String> {
    let names: Vec<&str> = VARS.iter().map(|(n, _)| *n).collect();
    let mut unknown: Vec<String> = Vec::new();
    let mut out = Vec::with_capacity(words.len());
    for word in words {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut chars = word.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    lit.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    lit.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => {
                                return Err(format!(
                                    "{word:?} opens a {{ that is never closed; write {{{{ for a literal brace"
                                ))
                            }
                        }
                    }
                    match VARS.iter().find(|(n, _)| *n == name) {
                        Some((_, v)) => {
                            if !lit.is_empty() {
                                pieces.push(Piece::Lit(std::mem::take(&mut lit)));
                            }
                            pieces.push(Piece::Var(*v));
                        }
                        None => {
                            let shown = match suggest(&name, &names, &[("ip", "fabric_ip")]) {
                                Some(s) => format!("{{{name}}} (did you mean {{{s}}}?)"),
                                None => format!("{{{name}}}"),
                            };
                            if !unknown.contains(&shown) {
                                unknown.push(shown);
                            }
                        }
                    }
                }
                '}' => {
                    return Err(format!(
                        "{word:?} has a }} that closes nothing; write }}}} for a literal brace"
                    ))
                }
                c => lit.push(c),
            }
        }
        if !lit.is_empty() {
            pieces.push(Piece::Lit(lit));
        }
        out.push(pieces);
    }
    if !unknown.is_empty() {
        let what = if unknown.len() == 1 {
            "unknown placeholder"
        } else {
            "unknown placeholders"
        };
        let known: Vec<String> = names.iter().map(|n| format!("{{{n}}}")).collect();
        return Err(format!(
            "{what} {}; the placeholders are {}",
            unknown.join(", "),
            known.join(", ")
        ));
    }
    Ok(Template { words: out })
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

    /// Two DGX Sparks joined by one cable, cross-wired: the interface and
    /// RDMA device names differ per node, and so do the GID indexes.
    pub const TWO_NODES: &str = r#"key = "/etc/xfer/cluster.key"

[defaults]
root = "/var/lib/xfer/hub"
gid_index = 3

[[node]]
name = "spark-a"
agent = "10.0.0.1"
fabric_if = "enp1s0f1np1"
fabric_ip = "192.168.100.1"
rdma_device = "rocep1s0f1"

[[node]]
name = "spark-b"
agent = "10.0.0.2"
fabric_if = "enp1s0f0np0"
fabric_ip = "192.168.100.2"
rdma_device = "rocep1s0f0"
gid_index = 1
"#;

    /// The two nodes and a `[launch]` table with `launch` in it.
    pub fn file(launch: &str) -> String {
        format!("{TWO_NODES}\n[launch]\n{launch}\n")
    }

    pub fn setup(launch: &str) -> Setup {
        match parse(&file(launch), "cluster.toml") {
            Ok(s) => s,
            Err(e) => panic!("refused: {e}"),
        }
    }

    /// The one-line message for a file, which must be refused.
    pub fn refused_file(text: &str) -> String {
        match parse(text, "cluster.toml") {
            Ok(s) => panic!("accepted: {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    pub fn refused(launch: &str) -> String {
        refused_file(&file(launch))
    }

    /// The 1-based line of the first line of `text` containing `needle`.
    pub fn line_of(text: &str, needle: &str) -> usize {
        text.lines()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle:?} not in the text"))
            + 1
    }

    #[test]
    fn defaults_apply_and_nodes_keep_their_own_fabric() {
        let s = setup("engine = \"vllm\"\nmodel = \"/models/qwen\"");
        assert_eq!(s.engine, Engine::Vllm);
        assert_eq!((s.tp, s.pp), (1, 2), "tp 1, pp = the number of nodes");
        assert_eq!(
            s.ports,
            Ports {
                master: 29500,
                api: 8000,
                ray: 6379,
                dist: 20000
            }
        );
        assert_eq!(s.nodes.len(), 2);
        let (a, b) = (&s.nodes[0], &s.nodes[1]);
        assert_eq!(
            (a.name.as_str(), a.fabric_if.as_str()),
            ("spark-a", "enp1s0f1np1")
        );
        assert_eq!(
            (b.name.as_str(), b.fabric_if.as_str()),
            ("spark-b", "enp1s0f0np0")
        );
        assert_eq!(a.rdma.as_ref().unwrap().gid_index, Some(3));
        assert_eq!(b.rdma.as_ref().unwrap().device, "rocep1s0f0");
        assert_eq!(b.rdma.as_ref().unwrap().gid_index, Some(1));
        assert_eq!(s.model.path, "/models/qwen");
        assert_eq!(s.model.unresolved, None);
        assert!(s.extra_args.is_empty() && s.env.is_empty() && s.template.is_none());
    }

    #[test]
    fn every_key_is_read() {
        let s = setup(
            r#"engine = "sglang"
model = "/models/qwen"
tp = 4
pp = 1
head = "spark-b"
nodes = ["spark-a", "spark-b"]
master_port = 29600
api_port = 30000
ray_port = 6380
dist_port = 20001
extra_args = ["--mem-fraction-static", 0.8, "--context-length", 8192]
env = { NCCL_DEBUG = "INFO", NCCL_IB_TIMEOUT = 22 }"#,
        );
        assert_eq!((s.engine, s.tp, s.pp), (Engine::Sglang, 4, 1));
        assert_eq!(s.nodes[0].name, "spark-b", "the head is rank 0");
        assert_eq!(s.nodes[1].name, "spark-a");
        assert_eq!(
            s.ports,
            Ports {
                master: 29600,
                api: 30000,
                ray: 6380,
                dist: 20001
            }
        );
        assert_eq!(
            s.extra_args,
            ["--mem-fraction-static", "0.8", "--context-length", "8192"]
        );
        assert_eq!(s.env["NCCL_DEBUG"], "INFO");
        assert_eq!(s.env["NCCL_IB_TIMEOUT"], "22");
    }

    #[test]
    fn a_repo_resolves_in_the_nodes_root() {
        let path = format!("/var/lib/xfer/hub/models--Qwen--Qwen3-8B/snapshots/{COMMIT}");
        for launch in [
            format!("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\""),
            format!("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B\"\nrevision = \"{COMMIT}\""),
            format!("engine = \"vllm\"\nmodel = {{ repo = \"Qwen/Qwen3-8B\", revision = \"{COMMIT}\" }}"),
            format!("engine = \"vllm\"\n[launch.model]\nrepo = \"Qwen/Qwen3-8B@{COMMIT}\""),
        ] {
            let s = setup(&launch);
            assert_eq!(s.model.path, path, "{launch}");
            assert_eq!(s.model.unresolved, None, "{launch}");
        }
        let s = setup("engine = \"vllm\"\nmodel = { path = \"/srv/m\" }");
        assert_eq!(s.model.path, "/srv/m");
    }

    #[test]
    fn a_repo_without_a_commit_keeps_a_placeholder_for_check() {
        let s = setup("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B\"");
        assert_eq!(
            s.model.path,
            "/var/lib/xfer/hub/models--Qwen--Qwen3-8B/snapshots/<COMMIT>"
        );
        let note = s.model.unresolved.unwrap();
        assert!(note.contains("xfer-launch check"), "{note}");
        assert!(
            note.contains("/var/lib/xfer/hub/models--Qwen--Qwen3-8B/refs/main"),
            "{note}"
        );
        let s = setup("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@v1.0\"");
        assert!(s.model.path.ends_with("/snapshots/<COMMIT>"));
        assert!(s.model.unresolved.unwrap().contains("refs/v1.0"));
    }

    #[test]
    fn a_repo_on_differing_roots_is_refused() {
        let text = file("engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B\"").replace(
            "name = \"spark-b\"\n",
            "name = \"spark-b\"\nroot = \"/data/hf/hub\"\n",
        );
        let msg = refused_file(&text);
        let line = line_of(&text, "model = ");
        assert!(
            msg.starts_with(&format!("cluster.toml:{line}:9: ")),
            "{msg}"
        );
        assert!(
            msg.contains("/var/lib/xfer/hub/models--Qwen--Qwen3-8B/snapshots/<COMMIT> on spark-a"),
            "{msg}"
        );
        assert!(
            msg.contains("/data/hf/hub/models--Qwen--Qwen3-8B/snapshots/<COMMIT> on spark-b"),
            "{msg}"
        );
        assert!(msg.contains("same root"), "{msg}");
        // An explicit path is the same everywhere by definition.
        let ok = text.replace("model = \"Qwen/Qwen3-8B\"", "model = \"/models/q\"");
        assert!(parse(&ok, "cluster.toml").is_ok());
    }

    #[test]
    fn model_mistakes_are_refused_with_the_fix() {
        for (launch, want) in [
            ("engine = \"vllm\"", "[launch] has no model; add model = "),
            (
                "model = \"/m\"",
                "[launch] has no engine; add engine = \"vllm\"",
            ),
            (
                "engine = \"vllm\"\nmodel = \"models/../x\"",
                "neither an absolute path nor a Hub repo",
            ),
            (
                "engine = \"vllm\"\nmodel = \"~/models/x\"",
                "neither an absolute path nor a Hub repo",
            ),
            ("engine = \"vllm\"\nmodel = \"/a/../b\"", "\"..\" component"),
            (
                "engine = \"vllm\"\nmodel = 3",
                "model is an integer; write an absolute path or ORG/NAME",
            ),
            (
                "engine = \"vllm\"\nmodel = \"/m\"\nrevision = \"main\"",
                "revision applies to a Hub repo, but model is a path",
            ),
            (
                "engine = \"vllm\"\nmodel = \"org/m@main\"\nrevision = \"v2\"",
                "the revision is given twice (@main in the repo, \"v2\" here); keep one",
            ),
            (
                "engine = \"vllm\"\nmodel = { path = \"/m\", repo = \"org/m\" }",
                "model has both path and repo",
            ),
            (
                "engine = \"vllm\"\nmodel = { path = \"m\" }",
                "model path \"m\" is relative",
            ),
            (
                "engine = \"vllm\"\nmodel = { commit = \"x\" }",
                "unknown key \"commit\" in model; did you mean \"revision\"?",
            ),
            ("engine = \"vllm\"\nmodel = {}", "model names no model"),
        ] {
            let msg = refused(launch);
            assert!(msg.contains(want), "{launch}\n=> {msg}");
            assert!(msg.starts_with("cluster.toml:"), "{msg}");
        }
    }

    #[test]
    fn unknown_keys_and_values_name_the_line_and_the_fix() {
        let text = file("engine = \"vllm\"\nmodel = \"/m\"\ntensor_parallel_size = 2");
        let msg = refused_file(&text);
        let line = line_of(&text, "tensor_parallel_size");
        assert_eq!(
            msg,
            format!("cluster.toml:{line}:1: unknown key \"tensor_parallel_size\" in [launch]; did you mean \"tp\"?")
        );
        for (launch, want) in [
            ("engine = \"vlm\"\nmodel = \"/m\"", "unknown engine \"vlm\"; did you mean \"vllm\"? engine is one of \"vllm\", \"vllm-ray\", \"sglang\" or \"custom\""),
            ("engine = \"ray\"\nmodel = \"/m\"", "did you mean \"vllm-ray\"?"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nextra_arg = []", "did you mean \"extra_args\"?"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nfoo = 1", "[launch] takes engine, model, revision, tp, pp, head, nodes"),
            ("engine = \"vllm\"\nmodel = \"/m\"\ntp = 0", "tp = 0 is out of range"),
            ("engine = \"vllm\"\nmodel = \"/m\"\ntp = \"2\"", "tp is a string; write a whole number, like tp = 2"),
            ("engine = \"vllm\"\nmodel = \"/m\"\napi_port = 70000", "api_port = 70000 is not a port"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nextra_args = \"--enforce-eager\"", "extra_args is a string; write a list"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nextra_args = [true]", "an item of extra_args is a boolean"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nnodes = []", "nodes is empty"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { \"1X\" = \"a\" }", "env name \"1X\" is not a variable name"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { X = true }", "env X is a boolean; write it as a string"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { PATH = \"/root/m/tools\" }", "[launch.env] sets PATH, which chooses the program a name runs, around the agent's --allow-exec; drop it, or set it in the environment of `xfer serve`"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { LD_PRELOAD = \"/root/m/x.so\" }", "[launch.env] sets LD_PRELOAD, which makes the dynamic loader map libraries"),
            ("engine = \"vllm\"\nmodel = \"/m\"\nenv = { DOCKER_HOST = \"tcp://10.0.0.9:2375\" }", "[launch.env] sets DOCKER_HOST, which chooses the container client's daemon"),
        ] {
            let msg = refused(launch);
            assert!(msg.contains(want), "{launch}\n=> {msg}");
            assert!(msg.starts_with("cluster.toml:"), "{msg}");
        }
    }

    #[test]
    fn env_keys_and_devices_around_allow_exec_are_refused_at_their_place() {
        let text =
            file("engine = \"vllm\"\nmodel = \"/m\"\n[launch.env]\nNCCL_DEBUG = \"INFO\"\nLD_PRELOAD = \"/root/m/x.so\"");
        let line = line_of(&text, "LD_PRELOAD");
        let msg = refused_file(&text);
        assert!(
            msg.starts_with(&format!(
                "cluster.toml:{line}:1: [launch.env] sets LD_PRELOAD, which "
            )),
            "{msg}"
        );
        assert_eq!(msg.lines().count(), 1, "{msg}");
        let text = file(
            "engine = \"vllm\"\nmodel = \"/m\"\nimage = \"x:1\"\ngpus = [\"/dev/nvidia0\", \"/dev/mem\"]",
        );
        let line = line_of(&text, "gpus = ");
        let msg = refused_file(&text);
        assert!(
            msg.starts_with(&format!("cluster.toml:{line}:25: gpus lists \"/dev/mem\", which is not a GPU or RDMA device node")),
            "{msg}"
        );
        // What engines do set still passes.
        let s = setup("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"x:1\"\ngpus = [\"/dev/nvidia0\", \"/dev/nvidiactl\", \"/dev/infiniband/uverbs0\", \"nvidia.com/gpu=0\"]\nenv = { NCCL_DEBUG = \"INFO\", CUDA_VISIBLE_DEVICES = \"0\", NCCL_NET_PLUGIN = \"aws-ofi\" }");
        assert_eq!(s.env.len(), 3);
    }

    #[test]
    fn an_image_runs_every_rank_in_a_container() {
        let s = setup("engine = \"vllm\"\nmodel = \"/m\"");
        assert_eq!(s.container, None, "on the host without an image");
        let s =
            setup("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"nvcr.io/nvidia/vllm:25.09-py3\"");
        assert_eq!(
            s.container,
            Some(ContainerConfig {
                image: "nvcr.io/nvidia/vllm:25.09-py3".into(),
                gpus: GpuAccess::All,
                shm_bytes: None,
            }),
            "gpus default to all"
        );
        let s = setup(
            "engine = \"sglang\"\nmodel = \"/m\"\nimage = \"xt/app:1\"\ngpus = [\"nvidia.com/gpu=all\", \"/dev/nvidia0\"]\nshm_size = \"16GiB\"",
        );
        let c = s.container.unwrap();
        assert_eq!(
            c.gpus,
            GpuAccess::Devices(vec!["nvidia.com/gpu=all".into(), "/dev/nvidia0".into()])
        );
        assert_eq!(c.shm_bytes, Some(16 << 30));
        let c = setup("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"xt/app:1\"\ngpus = \"none\"\nshm_size = 1048576")
            .container
            .unwrap();
        assert_eq!((c.gpus, c.shm_bytes), (GpuAccess::None, Some(1 << 20)));
    }

    #[test]
    fn container_mistakes_name_the_line_and_the_fix() {
        let text = file("engine = \"vllm\"\nmodel = \"/m\"\nimage = \"-rm\"");
        let line = line_of(&text, "image = ");
        assert_eq!(
            refused_file(&text),
            format!("cluster.toml:{line}:9: image: `-rm` is not an image reference (NAME[:TAG] of a-z, 0-9, . _ - / : @); write the reference the image has in `docker images` on the operator's machine, like image = \"nvcr.io/nvidia/vllm:25.09-py3\"")
        );
        let text = file("engine = \"vllm\"\nmodel = \"/m\"\nshm_size = \"16GiB\"");
        let line = line_of(&text, "shm_size = ");
        assert_eq!(
            refused_file(&text),
            format!("cluster.toml:{line}:12: shm_size only applies to the ranks' containers, but [launch] has no image; add image = \"NAME:TAG\", or remove shm_size")
        );
        for (launch, want) in [
            ("image = \"a b\"", "image: `a b` is not an image reference"),
            ("image = 3", "image is an integer; write a quoted string, like \"nvcr.io/nvidia/vllm:25.09-py3\""),
            ("image = \"x:1\"\ngpus = \"al\"", "gpus = \"al\" is not a choice; did you mean \"all\"? write gpus = \"all\""),
            ("image = \"x:1\"\ngpus = \"some\"", "gpus = \"some\" is not a choice; write gpus = \"all\" (--gpus all, the NVIDIA runtime), gpus = \"none\", or a list of devices"),
            ("image = \"x:1\"\ngpus = 2", "gpus is an integer; write gpus = \"all\""),
            ("image = \"x:1\"\ngpus = []", "gpus is an empty list; write gpus = \"none\" for no GPU"),
            ("image = \"x:1\"\ngpus = [\"--privileged\"]", "gpus lists \"--privileged\", which is not a device"),
            ("image = \"x:1\"\ngpus = [\"/dev/a b\"]", "gpus lists \"/dev/a b\", which is not a device"),
            ("image = \"x:1\"\ngpus = [\"/dev/nvidia0\", \"/dev/mem\"]", "gpus lists \"/dev/mem\", which is not a GPU or RDMA device node; list GPU or RDMA device nodes"),
            ("image = \"x:1\"\ngpus = [\"/dev/sda:/dev/sda:rwm\"]", "gpus lists \"/dev/sda:/dev/sda:rwm\", which adds a container path or permissions to the host path"),
            ("image = \"x:1\"\ngpus = [\"/dev/kmsg\"]", "gpus lists \"/dev/kmsg\", which is not a GPU or RDMA device node"),
            ("image = \"x:1\"\ngpus = [0]", "a device in gpus is an integer; write a quoted string"),
            ("image = \"x:1\"\nshm_size = \"lots\"", "shm_size: `lots` is not a size; write e.g. 4MiB, 512M or 2GiB"),
            ("image = \"x:1\"\nshm_size = \"16 parsecs\"", "shm_size: unknown unit in `16 parsecs`"),
            ("image = \"x:1\"\nshm_size = \"0\"", "shm_size is 0; write a size"),
            ("image = \"x:1\"\nshm_size = -1", "shm_size is negative"),
            ("image = \"x:1\"\nshm_size = true", "shm_size is a boolean; write a size, like shm_size = \"16GiB\""),
            ("gpus = \"all\"", "gpus only applies to the ranks' containers, but [launch] has no image (on the host every rank sees every GPU); add image = \"NAME:TAG\", or remove gpus"),
            ("imag = \"x:1\"", "unknown key \"imag\" in [launch]; did you mean \"image\"?"),
            ("container = \"x:1\"", "unknown key \"container\" in [launch]; did you mean \"image\"?"),
            ("gpu = \"all\"", "unknown key \"gpu\" in [launch]; did you mean \"gpus\"?"),
            ("shm = \"1G\"", "unknown key \"shm\" in [launch]; did you mean \"shm_size\"?"),
            ("shm_sise = \"1G\"", "unknown key \"shm_sise\" in [launch]; did you mean \"shm_size\"?"),
            ("zzz = 1", "[launch] takes engine, model, revision, tp, pp, head, nodes, master_port, api_port, ray_port, dist_port, extra_args, env, template, image, gpus and shm_size"),
        ] {
            let msg = refused(&format!("engine = \"vllm\"\nmodel = \"/m\"\n{launch}"));
            assert!(msg.contains(want), "{launch}\n=> {msg}");
            assert!(msg.starts_with("cluster.toml:"), "{msg}");
        }
    }

    #[test]
    fn no_launch_table_is_refused() {
        let msg = refused_file(TWO_NODES);
        assert!(
            msg.starts_with("cluster.toml: no [launch] table; add one"),
            "{msg}"
        );
        // The cluster's own errors come first, with their line.
        let msg =
            refused_file(&file("engine = \"vllm\"").replace("fabric_if = \"enp1s0f0np0\"\n", ""));
        assert!(msg.contains("has fabric_ip but no fabric_if"), "{msg}");
    }

    #[test]
    fn a_node_without_fabric_is_refused() {
        let text = format!(
            "{TWO_NODES}\n[[node]]\nname = \"spark-c\"\nagent = \"10.0.0.3\"\n\n[launch]\nengine = \"vllm\"\nmodel = \"/m\"\n"
        );
        let msg = refused_file(&text);
        let line = line_of(&text, "name = \"spark-c\"") - 1;
        assert!(
            msg.starts_with(&format!(
                "cluster.toml:{line}:1: node \"spark-c\" has no fabric_ip; NCCL/Ray would pick an interface by themselves, which is the hang this tool prevents"
            )),
            "{msg}"
        );
        assert!(msg.contains("add fabric_if and fabric_ip"), "{msg}");
        // Leaving it out of the launch is the other fix.
        let ok = text.replace(
            "model = \"/m\"",
            "model = \"/m\"\nnodes = [\"spark-a\", \"spark-b\"]",
        );
        let s = parse(&ok, "cluster.toml").unwrap();
        assert_eq!(s.nodes.len(), 2);
    }

    #[test]
    fn node_selection_and_head_are_checked() {
        for (launch, want) in [
            ("nodes = [\"spark-a\", \"spark-x\"]", "nodes names \"spark-x\", which is not a [[node]] of this file; the nodes are spark-a, spark-b"),
            ("nodes = [\"spark-a\", \"spark-a\"]", "nodes lists \"spark-a\" twice"),
            ("head = \"spark-x\"", "head \"spark-x\" is not a [[node]] of this file; the head must be one of the launch nodes: spark-a, spark-b"),
            ("nodes = [\"spark-a\"]\nhead = \"spark-b\"", "head \"spark-b\" is not in nodes"),
        ] {
            let msg = refused(&format!("engine = \"vllm\"\nmodel = \"/m\"\n{launch}"));
            assert!(msg.contains(want), "{launch}\n=> {msg}");
        }
        let s = setup("engine = \"vllm\"\nmodel = \"/m\"\nnodes = [\"spark-b\"]");
        assert_eq!(s.nodes.len(), 1);
        assert_eq!((s.tp, s.pp), (1, 1));
    }

    #[test]
    fn parallel_sizes_must_split_over_the_nodes() {
        let text = file("engine = \"vllm\"\nmodel = \"/m\"\ntp = 1\npp = 3");
        let msg = refused_file(&text);
        assert!(
            msg.starts_with(&format!(
                "cluster.toml:{}:6: tp × pp = 1 × 3 = 3 GPUs do not split evenly over 2 nodes",
                line_of(&text, "tp = 1")
            )),
            "{msg}"
        );
        // 2 GPUs per node.
        let s = setup("engine = \"vllm-ray\"\nmodel = \"/m\"\ntp = 2");
        assert_eq!((s.tp, s.pp), (2, 2));
        // The custom engine decides for itself.
        setup("engine = \"custom\"\nmodel = \"/m\"\ntp = 3\npp = 1\ntemplate = \"x\"");
    }

    #[test]
    fn managed_flags_and_variables_are_refused() {
        for (engine, arg, want) in [
            (
                "vllm",
                "--tensor-parallel-size",
                "extra_args has --tensor-parallel-size, which xfer-launch sets itself; set tp = N",
            ),
            (
                "vllm",
                "--tensor_parallel_size=4",
                "has --tensor-parallel-size",
            ),
            ("vllm", "-tp", "has -tp"),
            (
                "vllm-ray",
                "--distributed-executor-backend=mp",
                "choose engine = \\\"vllm\\\" (multiprocess) or \\\"vllm-ray\\\"",
            ),
            ("vllm", "--port", "set api_port"),
            ("vllm", "--headless", "it follows from the launch nodes"),
            ("sglang", "--tp", "has --tp,"),
            ("sglang", "--dist-init-addr", "set dist_port"),
            ("sglang", "--model-path", "set model in [launch]"),
        ] {
            let msg = refused(&format!(
                "engine = \"{engine}\"\nmodel = \"/m\"\nextra_args = [\"--enforce-eager\", \"{arg}\"]"
            ));
            let want = want.replace("\\\"", "\"");
            assert!(msg.contains(&want), "{engine} {arg}\n=> {msg}");
        }
        // Flags of other engines, and anything for custom, pass.
        setup("engine = \"vllm\"\nmodel = \"/m\"\nextra_args = [\"--tp-size-hint\", \"--tp\"]");
        setup("engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"x\"\nextra_args = [\"--port\", \"1\"]");

        let msg = refused(
            "engine = \"vllm\"\nmodel = \"/m\"\n[launch.env]\nNCCL_SOCKET_IFNAME = \"eth0\"",
        );
        assert!(
            msg.contains("env sets NCCL_SOCKET_IFNAME, which xfer-launch sets itself from the fabric_if of each [[node]]"),
            "{msg}"
        );
        let msg = refused("engine = \"vllm\"\nmodel = \"/m\"\nenv = { HF_HUB_OFFLINE = \"0\" }");
        assert!(msg.contains("env sets HF_HUB_OFFLINE"), "{msg}");
    }

    #[test]
    fn head_ports_must_differ() {
        let msg = refused("engine = \"vllm\"\nmodel = \"/m\"\napi_port = 29500");
        assert!(
            msg.contains("master_port and api_port are both 29500"),
            "{msg}"
        );
        let msg = refused("engine = \"sglang\"\nmodel = \"/m\"\ndist_port = 8000");
        assert!(
            msg.contains("dist_port and api_port are both 8000"),
            "{msg}"
        );
        // vLLM multiprocess does not use the Ray port.
        setup("engine = \"vllm\"\nmodel = \"/m\"\nray_port = 8000");
    }

    #[test]
    fn template_belongs_to_the_custom_engine() {
        let msg = refused("engine = \"vllm\"\nmodel = \"/m\"\ntemplate = \"x {rank}\"");
        assert!(
            msg.contains("template only applies to engine = \"custom\", but engine is \"vllm\""),
            "{msg}"
        );
        let msg = refused("engine = \"custom\"\nmodel = \"/m\"");
        assert!(
            msg.contains("engine = \"custom\" needs a template"),
            "{msg}"
        );
        assert!(msg.contains("{head_ip}"), "{msg}");
    }

    #[test]
    fn unknown_placeholders_are_all_named_at_the_template_line() {
        let text = file("engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"run --r {rank} --g {gpu} --h {hed_ip} --x {gpu}\"");
        let msg = refused_file(&text);
        let line = line_of(&text, "template = ");
        assert!(
            msg.starts_with(&format!(
                "cluster.toml:{line}:12: template: unknown placeholders {{gpu}}, {{hed_ip}} (did you mean {{head_ip}}?); the placeholders are {{rank}}, {{nnodes}}, {{head_ip}}"
            )),
            "{msg}"
        );
        let msg = refused("engine = \"custom\"\nmodel = \"/m\"\ntemplate = [\"run\", \"{nodes}\"]");
        assert!(
            msg.contains("unknown placeholder {nodes} (did you mean {nnodes}?)"),
            "{msg}"
        );
        let msg = refused("engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"run {rank\"");
        assert!(msg.contains("opens a { that is never closed"), "{msg}");
        let msg = refused("engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"run rank}\"");
        assert!(msg.contains("has a } that closes nothing"), "{msg}");
        let msg = refused("engine = \"custom\"\nmodel = \"/m\"\ntemplate = \"  \"");
        assert!(msg.contains("template is empty"), "{msg}");
    }

    #[test]
    fn template_words_split_like_a_shell_without_expanding() {
        let w = split_words(r#"a 'b c' "d \"e\" \$f" g\ h '' x'y'"z""#).unwrap();
        assert_eq!(w, ["a", "b c", "d \"e\" $f", "g h", "", "xyz"]);
        assert_eq!(split_words("  a\n\tb  ").unwrap(), ["a", "b"]);
        assert_eq!(
            split_words("bash -c 'echo $HOME | wc'").unwrap(),
            ["bash", "-c", "echo $HOME | wc"]
        );
        for (bad, want) in [
            ("run $HOME", "'$' needs a shell"),
            ("run \"$HOME\"", "'$' needs a shell"),
            ("a | b", "'|' needs a shell"),
            ("a; b", "';' needs a shell"),
            ("a > f", "'>' needs a shell"),
            ("a 'b", "a ' is never closed"),
            ("a \"b", "a \" is never closed"),
            ("a \\", "lone \\"),
        ] {
            let e = split_words(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
        let t =
            parse_template(&["--x={{{rank}}}".to_string(), "{node}{head}".to_string()]).unwrap();
        assert_eq!(
            t.words,
            [
                vec![
                    Piece::Lit("--x={".into()),
                    Piece::Var(Var::Rank),
                    Piece::Lit("}".into())
                ],
                vec![Piece::Var(Var::Node), Piece::Var(Var::Head)],
            ]
        );
    }
}
