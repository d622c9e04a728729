//! The cluster file: the one TOML description of a cluster that xfer and the
//! launcher share. `docs/cluster.example.toml` is the format, with every
//! field explained (a unit test here parses it, so it cannot go stale).
//!
//! The file holds the credential path and, per `[[node]]`, its name, agent
//! address, model root, fabric interface and address, and an optional RDMA
//! device and GID index. Every field may differ per node; `[defaults]`
//! supplies the ones a node leaves out. [`Cluster::parse`] checks everything
//! up front, and every error is one line, `FILE:LINE:COL: what; the fix`:
//! TOML syntax, unknown keys (with the key probably meant), duplicate names,
//! agents or fabric addresses, malformed values, and settings that only make
//! sense together.
//!
//! A `[slurm]` table makes the nodes of the Slurm job a command runs in:
//! one node per host of `SLURM_JOB_NODELIST` ([`super::slurm`]), its
//! agent, fabric address and the rest from templates in which `{host}` is
//! the host's name, with `[slurm.host.NAME]` overriding any of them for one
//! host and a `[[node]]` of the same name replacing it whole. Inside a job,
//! a command with no `--nodes` means the job's hosts; outside one, the
//! file's `[[node]]` tables work as ever.
//!
//! The top level also reserves `[launch]` for the launcher. Until the
//! launcher gives it a type it is kept as an untyped [`toml::Table`]; every
//! other unknown top-level key stays an error.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use crate::config::slurm::{self, Allocation, HostlistError};
use crate::config::toml_reader::{
    and_list, did_you_mean, entries, At, Entry, TomlError, TomlReader, Val,
};
use xfer_proto::names::DEFAULT_PORT;
pub use xfer_proto::names::{NodeName, MAX_NAME_LEN};

/// Where the commented example of the format lives, for error messages.
const EXAMPLE: &str = "docs/cluster.example.toml";
/// Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
const MAX_IFNAME_LEN: usize = 15;
/// RDMA device names are at most 63 bytes (IB_DEVICE_NAME_MAX - 1).
const MAX_RDMA_NAME_LEN: usize = 63;

/// A node's RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rdma {
    /// The device name, as `ibv_devices` lists it (e.g. `rocep1s0f1`).
    pub device: String,
    /// The GID table entry to use; `None` leaves the choice to the
    /// transport (NCCL picks one itself).
    pub gid_index: Option<u32>,
}

/// One machine of the cluster, with `[defaults]` already applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Its `name`, unique in the file.
    pub name: NodeName,
    /// Where its agent listens, normalized to `HOST:PORT` (`[V6]:PORT` for
    /// IPv6; host names lower-cased). `transport::quic::resolve`
    /// takes it as is.
    pub agent: String,
    /// The node's model folder (its agent's `--root`); always absolute.
    pub root: PathBuf,
    /// The fabric interface on this node; set exactly when `fabric_ip` is.
    pub fabric_if: Option<String>,
    /// This node's address on `fabric_if`.
    pub fabric_ip: Option<IpAddr>,
    /// The port its agent takes data on at `fabric_ip` (`data_port`;
    /// default: the agent's port).
    pub data_port: u16,
    /// Its RDMA device and GID index, if it has one.
    pub rdma: Option<Rdma>,
    /// The line of the node's `[[node]]` header, for messages about it.
    pub line: usize,
}

impl Node {
    /// Where its data goes: `fabric_ip:data_port`, or `None` when the node
    /// has no fabric (its agent address then carries data too).
    pub fn data_addr(&self) -> Option<String> {
        self.fabric_ip
            .map(|ip| std::net::SocketAddr::new(ip, self.data_port).to_string())
    }
}

/// A parsed, checked cluster file.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// The credential file; a relative `key` is resolved against the
    /// cluster file's folder.
    pub key: PathBuf,
    /// The nodes, in file order.
    pub nodes: Vec<Node>,
    /// The launcher's `[launch]` table, unchecked until the launcher types it.
    pub launch: Option<toml::Table>,
    /// The file this came from (as given to [`Cluster::load`] or
    /// [`Cluster::parse`]).
    pub path: PathBuf,
    /// The Slurm job whose hosts are the nodes a command with no `--nodes`
    /// means: set when the file has `[slurm]` and the command runs inside
    /// a job.
    pub job: Option<Allocation>,
}

/// Why a cluster file was refused, or a node selection failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The file could not be read.
    #[error("cannot read cluster file {}: {err}; check the path (the format is in {EXAMPLE})", path.display())]
    Read {
        /// The cluster file.
        path: PathBuf,
        /// What the system said.
        err: std::io::Error,
    },
    /// Something in the file, at its line and column.
    #[error(transparent)]
    Invalid(#[from] TomlError),
    /// A selection named nodes the file does not have.
    #[error("{}: {}; the nodes are {}", path.display(), unknown_list(unknown), known.join(", "))]
    UnknownNodes {
        /// The cluster file.
        path: PathBuf,
        /// The names not in the file, in the order given.
        unknown: Vec<String>,
        /// The names that are.
        known: Vec<String>,
    },
    /// `SLURM_JOB_NODELIST` could not be read.
    #[error("{} (SLURM_JOB_NODELIST)", .0)]
    Hostlist(#[from] HostlistError),
    /// `--cluster slurm` outside a Slurm job.
    #[error("--cluster slurm means the nodes of the Slurm job this runs in, but SLURM_JOB_NODELIST is not set; run it inside sbatch, salloc or srun, or pass --cluster FILE")]
    NotInJob,
    /// Neither `--cluster` nor [`CLUSTER_ENV`] names a cluster file.
    #[error("no cluster file: pass --cluster FILE or set {CLUSTER_ENV}=FILE (the format is in {EXAMPLE})")]
    NoFile,
}

/// The environment variable naming the cluster file when `--cluster` is
/// not given, as `KUBECONFIG` names kubectl's.
pub const CLUSTER_ENV: &str = "XFER_CLUSTER";

/// The cluster file `--cluster` names (clap fills it from [`CLUSTER_ENV`]
/// when the flag is absent), or [`ClusterError::NoFile`].
pub fn cluster_file(given: Option<PathBuf>) -> Result<PathBuf, ClusterError> {
    given
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or(ClusterError::NoFile)
}

/// [`cluster_file`] from the environment alone: for commands where
/// `--cluster` is one of two ways to name the nodes (`push --to`).
pub fn cluster_file_from_env() -> Option<PathBuf> {
    std::env::var_os(CLUSTER_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl ClusterError {
    /// The line the error points at, if it is about the file's contents.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Invalid(e) => Some(e.line),
            _ => None,
        }
    }
}

fn unknown_list(unknown: &[String]) -> String {
    let quoted: Vec<String> = unknown.iter().map(|n| format!("{n:?}")).collect();
    match quoted.len() {
        1 => format!("no node named {}", quoted[0]),
        _ => format!("no nodes named {}", quoted.join(", ")),
    }
}

impl Cluster {
    /// Reads and checks the cluster file at `path`; inside a Slurm job, a
    /// file with `[slurm]` makes the job's hosts its nodes. The path
    /// `slurm` is [`slurm::SLURM_CLUSTER_FILE`], and only inside a job.
    pub fn load(path: impl AsRef<Path>) -> Result<Cluster, ClusterError> {
        let (path, job) = Self::locate(path.as_ref())?;
        Self::parse_in(&Self::read(&path)?, &path, job.as_ref())
    }

    /// The file a `--cluster` value names and the Slurm job this process
    /// runs in, if any: `slurm` is [`slurm::SLURM_CLUSTER_FILE`] and needs
    /// a job ([`ClusterError::NotInJob`]).
    pub fn locate(given: &Path) -> Result<(PathBuf, Option<Allocation>), ClusterError> {
        let job = Allocation::from_env()?;
        if given.as_os_str() == slurm::SLURM_WORD && job.is_none() {
            return Err(ClusterError::NotInJob);
        }
        Ok((slurm::cluster_path(given.to_path_buf()), job))
    }

    /// [`Cluster::parse`] inside the Slurm job `job` (none: outside one).
    pub fn parse_in(
        text: &str,
        path: impl AsRef<Path>,
        job: Option<&Allocation>,
    ) -> Result<Cluster, ClusterError> {
        Self::parse_with_launch_in(text, path, job, |_| ()).map(|(c, ())| c)
    }

    /// The text of the cluster file at `path`, for a reader that parses it
    /// with [`Cluster::parse_with_launch`].
    pub fn read(path: &Path) -> Result<String, ClusterError> {
        std::fs::read_to_string(path).map_err(|err| ClusterError::Read {
            path: path.to_path_buf(),
            err,
        })
    }

    /// Checks `text`, a cluster file; `path` names it in messages and is the
    /// base a relative `key` is resolved against.
    pub fn parse(text: &str, path: impl AsRef<Path>) -> Result<Cluster, ClusterError> {
        Self::parse_with_launch(text, path, |_| ()).map(|(c, ())| c)
    }

    /// Checks `text` like [`Cluster::parse`], then hands `launch` the
    /// `[launch]` table as written (with its spans) and the byte offset of
    /// its key, from the same parse, so the launcher that types the table
    /// does not parse the file again. `launch` runs once the rest of the
    /// file is valid, with `None` when there is no `[launch]`.
    pub fn parse_with_launch<R>(
        text: &str,
        path: impl AsRef<Path>,
        launch: impl FnOnce(Option<(usize, &DeTable<'_>)>) -> R,
    ) -> Result<(Cluster, R), ClusterError> {
        Self::parse_with_launch_in(text, path, None, launch)
    }

    /// [`Cluster::parse_with_launch`] inside the Slurm job `job`.
    pub fn parse_with_launch_in<R>(
        text: &str,
        path: impl AsRef<Path>,
        job: Option<&Allocation>,
        launch: impl FnOnce(Option<(usize, &DeTable<'_>)>) -> R,
    ) -> Result<(Cluster, R), ClusterError> {
        Parser {
            r: TomlReader::new(text, path.as_ref()),
        }
        .cluster(job, launch)
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name.as_str() == name)
    }

    /// The nodes called `names`, in that order and without repeats; every
    /// node when `names` is empty. Any name not in the file is an error that
    /// lists the names that are.
    pub fn select(&self, names: &[String]) -> Result<Vec<&Node>, ClusterError> {
        if names.is_empty() {
            return Ok(match &self.job {
                Some(job) => job.hosts.iter().filter_map(|h| self.node(h)).collect(),
                None => self.nodes.iter().collect(),
            });
        }
        let mut picked: Vec<&Node> = Vec::new();
        let mut unknown = Vec::new();
        for name in names {
            match self.node(name) {
                Some(n) if !picked.iter().any(|p| p.name == n.name) => picked.push(n),
                Some(_) => {}
                None if !unknown.contains(name) => unknown.push(name.clone()),
                None => {}
            }
        }
        if !unknown.is_empty() {
            return Err(ClusterError::UnknownNodes {
                path: self.path.clone(),
                unknown,
                known: self.nodes.iter().map(|n| n.name.to_string()).collect(),
            });
        }
        Ok(picked)
    }
}

/// Top-level keys.
const TOP_KEYS: &[&str] = &["key", "defaults", "node", "launch", "slurm"];
/// Keys of a `[[node]]` table.
const NODE_KEYS: &[&str] = &[
    "name",
    "agent",
    "port",
    "root",
    "fabric_if",
    "fabric_ip",
    "data_port",
    "rdma_device",
    "gid_index",
];
/// Keys of `[slurm]` (and, but `host`, of a `[slurm.host.NAME]`).
const SLURM_KEYS: &[&str] = &[
    "agent",
    "port",
    "root",
    "fabric_if",
    "fabric_ip",
    "data_port",
    "rdma_device",
    "gid_index",
    "host",
];
/// The placeholder a `[slurm]` template's host name replaces.
const HOST_PLACEHOLDER: &str = "{host}";
/// Node keys that `[defaults]` refuses: they must differ per node.
const PER_NODE_ONLY: &[&str] = &["name", "agent", "fabric_ip"];
/// Likely other words for known keys, tried before edit distance.
const ALIASES: &[(&str, &str)] = &[
    ("address", "agent"),
    ("addr", "agent"),
    ("host", "agent"),
    ("interface", "fabric_if"),
    ("iface", "fabric_if"),
    ("ip", "fabric_ip"),
    ("device", "rdma_device"),
    ("rdma", "rdma_device"),
    ("gid", "gid_index"),
    ("path", "root"),
    ("model_root", "root"),
    ("nodes", "node"),
    ("credential", "key"),
    ("key_file", "key"),
];

/// An agent address before the port default is applied.
#[derive(Clone, Debug)]
struct AgentAddr {
    /// Normalized host: lower-case name, IPv4, or `[V6]`.
    host: String,
    port: Option<u16>,
}

/// The fields of a `[[node]]` or `[defaults]` table, each checked alone.
#[derive(Clone, Debug, Default)]
struct Fields {
    name: Option<At<NodeName>>,
    agent: Option<At<AgentAddr>>,
    port: Option<At<u16>>,
    root: Option<At<PathBuf>>,
    fabric_if: Option<At<String>>,
    fabric_ip: Option<At<IpAddr>>,
    data_port: Option<At<u16>>,
    rdma_device: Option<At<String>>,
    gid_index: Option<At<u32>>,
    /// In `[slurm]`: `agent` and `fabric_ip` as written, with `{host}`.
    agent_template: Option<At<String>>,
    fabric_ip_template: Option<At<String>>,
}

/// The `[slurm]` table: its own fields and each `[slurm.host.NAME]`'s.
struct SlurmTables {
    /// Where `slurm` is written.
    at: usize,
    fields: Fields,
    hosts: Vec<(String, usize, Fields)>,
}

/// Which table a key is in, as messages name it.
#[derive(Clone, PartialEq, Eq)]
enum Section {
    Defaults,
    /// 1-based.
    Node(usize),
    Slurm,
    SlurmHost(String),
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Section::Defaults => f.write_str("[defaults]"),
            Section::Node(i) => write!(f, "[[node]] {i}"),
            Section::Slurm => f.write_str("[slurm]"),
            Section::SlurmHost(h) => write!(f, "[slurm.host.{h}]"),
        }
    }
}

struct Parser<'a> {
    r: TomlReader<'a>,
}

impl Parser<'_> {
    fn err(&self, at: usize, message: impl Into<String>) -> ClusterError {
        self.r.err(at, message).into()
    }

    fn line(&self, at: usize) -> usize {
        self.r.line(at)
    }

    fn cluster<R>(
        &self,
        job: Option<&Allocation>,
        launch_fn: impl FnOnce(Option<(usize, &DeTable<'_>)>) -> R,
    ) -> Result<(Cluster, R), ClusterError> {
        let doc = self.r.parse(EXAMPLE)?;
        let root = doc.get_ref();
        if root.is_empty() {
            return Err(self.err(
                0,
                format!(
                    "the cluster file is empty; it needs key = \"PATH\" and one [[node]] per machine (see {EXAMPLE})"
                ),
            ));
        }
        let mut key = None;
        let mut defaults = Fields::default();
        let mut launch = None;
        let mut launch_table = None;
        let mut node_vals: Option<&Val> = None;
        let mut slurm_tables = None;
        for e in entries(root) {
            let v = e.value;
            match e.key {
                "key" => {
                    let s = self.r.string("key", v, "key = \"/etc/xfer/cluster.key\"")?;
                    if s.is_empty() {
                        return Err(self.err(
                            v.span().start,
                            "key is empty; name your credential, the file `xfer ca issue NAME --role operator --dir CA --out FILE` wrote",
                        ));
                    }
                    let base = self.r.path.parent().unwrap_or(Path::new(""));
                    key = Some(base.join(s));
                }
                "defaults" => {
                    let t = self
                        .r
                        .table("defaults", v, "write it as a [defaults] table")?;
                    defaults = self.fields(t, Section::Defaults)?;
                }
                "node" => node_vals = Some(v),
                "slurm" => {
                    let t = self.r.table("slurm", v, "write it as a [slurm] table")?;
                    slurm_tables = Some(self.slurm_tables(e.key_at, t)?);
                }
                "launch" => {
                    let t = self.r.table("launch", v, "write it as a [launch] table")?;
                    let table = toml::Table::deserialize(ValueDeserializer::from(v.clone()))
                        .map_err(|e| {
                            self.err(
                                e.span().map_or(v.span().start, |s| s.start),
                                format!("in [launch]: {}", e.message()),
                            )
                        })?;
                    launch = Some(table);
                    launch_table = Some((e.key_at, t));
                }
                _ => return Err(self.unknown_top(&e)),
            }
        }
        let Some(key) = key else {
            return Err(self.err(
                0,
                "no key; add key = \"/etc/xfer/operator.pem\" at the top, naming your credential, the file `xfer ca issue NAME --role operator --dir CA --out FILE` wrote",
            ));
        };
        let no_nodes = format!(
            "no nodes; add a [[node]] table with name, agent and root for each machine (see {EXAMPLE})"
        );
        let tables: Vec<(usize, &DeTable)> = match node_vals {
            None if slurm_tables.is_some() => Vec::new(),
            None => return Err(self.err(0, no_nodes)),
            Some(node_vals) => match node_vals.get_ref() {
                DeValue::Array(a) if a.is_empty() => {
                    return Err(self.err(node_vals.span().start, no_nodes))
                }
                DeValue::Array(a) => a
                    .iter()
                    .map(|v| match v.get_ref() {
                        DeValue::Table(t) => Ok((v.span().start, t)),
                        _ => {
                            let fix = "write each node as a [[node]] table";
                            Err(ClusterError::from(self.r.wrong_kind("a node", v, fix)))
                        }
                    })
                    .collect::<Result<_, _>>()?,
                DeValue::Table(_) => return Err(self.err(
                    node_vals.span().start,
                    "[node] is a single table; write [[node]] (double brackets), once per machine",
                )),
                _ => {
                    let fix = "write each node as a [[node]] table";
                    return Err(self.r.wrong_kind("node", node_vals, fix).into());
                }
            },
        };
        // Every value is checked alone before any node is put together, so
        // a misspelt key is reported as such, not as the field it lacks.
        let mut owns: Vec<(usize, Fields)> = tables
            .iter()
            .enumerate()
            .map(|(i, (header, table))| Ok((*header, self.fields(table, Section::Node(i + 1))?)))
            .collect::<Result<_, ClusterError>>()?;
        let job = job.filter(|_| slurm_tables.is_some());
        if let Some(slurm) = &slurm_tables {
            match job {
                Some(job) => {
                    let listed: Vec<String> = owns
                        .iter()
                        .filter_map(|(_, f)| f.name.as_ref().map(|n| n.v.to_string()))
                        .collect();
                    for host in job.hosts.iter().filter(|h| !listed.contains(h)) {
                        owns.push((slurm.at, self.slurm_node(slurm, host, job)?));
                    }
                }
                None if owns.is_empty() => {
                    return Err(self.err(
                        slurm.at,
                        "[slurm] makes the nodes of a Slurm job, but this runs outside one (SLURM_JOB_NODELIST is not set) and the file has no [[node]]; run it inside sbatch, salloc or srun, or add [[node]] tables",
                    ))
                }
                None => {}
            }
        }
        let mut nodes = Vec::with_capacity(owns.len());
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut agents: HashMap<String, (String, usize)> = HashMap::new();
        let mut fabric_ips: HashMap<IpAddr, (String, usize)> = HashMap::new();
        for (i, (header, own)) in owns.into_iter().enumerate() {
            let fabric_ip_at = own.fabric_ip.as_ref().map(|ip| ip.at);
            let (node, name_at, agent_at) = self.node(i + 1, header, own, &defaults)?;
            let name = node.name.to_string();
            if let Some(first) = names.get(&name) {
                return Err(self.err(
                    name_at,
                    format!(
                        "duplicate node name {name:?} (first at line {first}); give every node its own name"
                    ),
                ));
            }
            names.insert(name.clone(), self.line(name_at));
            if let Some((other, line)) = agents.get(&node.agent) {
                return Err(self.err(
                    agent_at,
                    format!(
                        "duplicate agent address {} (node {other:?} has it, line {line}); give each node the address of its own agent",
                        node.agent
                    ),
                ));
            }
            agents.insert(node.agent.clone(), (name.clone(), self.line(agent_at)));
            if let (Some(ip), Some(at)) = (node.fabric_ip, fabric_ip_at) {
                if let Some((other, line)) = fabric_ips.get(&ip) {
                    return Err(self.err(
                        at,
                        format!(
                            "duplicate fabric_ip {ip} (node {other:?} has it, line {line}); give each node its own address on the fabric"
                        ),
                    ));
                }
                fabric_ips.insert(ip, (name.clone(), self.line(at)));
            }
            nodes.push(node);
        }
        if let Some(g) = &defaults.gid_index {
            if nodes.iter().all(|n| n.rdma.is_none()) {
                return Err(self.err(
                    g.at,
                    "[defaults] sets gid_index but no node has an rdma_device; add rdma_device to the nodes with RDMA, or drop gid_index",
                ));
            }
        }
        let cluster = Cluster {
            key,
            nodes,
            launch,
            path: self.r.path.to_path_buf(),
            job: job.cloned(),
        };
        Ok((cluster, launch_fn(launch_table)))
    }

    /// Applies `defaults` to one node's own fields and checks the fields
    /// that only make sense together. Also returns where its name and agent
    /// are written, for duplicate checks.
    fn node(
        &self,
        index: usize,
        header: usize,
        own: Fields,
        defaults: &Fields,
    ) -> Result<(Node, usize, usize), ClusterError> {
        let name = own.name.ok_or_else(|| {
            self.err(
                header,
                format!(
                    "[[node]] {index} has no name; add name = \"...\" (letters, digits, '.', '_', '-')"
                ),
            )
        })?;
        let who = format!("node {:?}", name.v.as_str());
        let agent = own.agent.ok_or_else(|| {
            self.err(
                header,
                format!(
                    "{who} has no agent; add agent = \"HOST[:PORT]\", the address its xfer agent listens on"
                ),
            )
        })?;
        let port = match (agent.v.port, &own.port) {
            (Some(a), Some(p)) if a != p.v => {
                return Err(self.err(
                    p.at,
                    format!(
                        "{who} sets port = {} but its agent names port {a}; drop one of them",
                        p.v
                    ),
                ))
            }
            (Some(a), _) => a,
            (None, Some(p)) => p.v,
            (None, None) => defaults.port.as_ref().map_or(DEFAULT_PORT, |p| p.v),
        };
        let root = own.root.or_else(|| defaults.root.clone()).ok_or_else(|| {
            self.err(
                header,
                format!(
                    "{who} has no root; add root = \"/absolute/path\" (its agent's --root) to it or to [defaults]"
                ),
            )
        })?;
        let from_defaults = own.fabric_if.is_none();
        let fabric_if = own.fabric_if.or_else(|| defaults.fabric_if.clone());
        match (&fabric_if, &own.fabric_ip) {
            (Some(i), None) if from_defaults => {
                return Err(self.err(
                    header,
                    format!(
                        "{who} has no fabric_ip but [defaults] sets fabric_if = {:?} (line {}); add fabric_ip = \"ADDRESS\", its address on that interface",
                        i.v,
                        self.line(i.at)
                    ),
                ))
            }
            (Some(i), None) => {
                return Err(self.err(
                    i.at,
                    format!(
                        "{who} has fabric_if but no fabric_ip; add fabric_ip = \"ADDRESS\" (its address on {}) or drop fabric_if",
                        i.v
                    ),
                ))
            }
            (None, Some(ip)) => {
                return Err(self.err(
                    ip.at,
                    format!(
                        "{who} has fabric_ip but no fabric_if; add fabric_if = \"IFACE\" (the interface holding {}, see `ip -br addr`) or drop fabric_ip",
                        ip.v
                    ),
                ))
            }
            _ => {}
        }
        let rdma_device = own.rdma_device.or_else(|| defaults.rdma_device.clone());
        if let (Some(g), None) = (&own.gid_index, &rdma_device) {
            return Err(self.err(
                g.at,
                format!(
                    "{who} sets gid_index but has no rdma_device; add rdma_device = \"DEVICE\" (see `ibv_devices`) or drop gid_index"
                ),
            ));
        }
        let gid_index = own.gid_index.or_else(|| defaults.gid_index.clone());
        let data_port = own.data_port.or_else(|| defaults.data_port.clone());
        if let (Some(p), None) = (&data_port, &own.fabric_ip) {
            return Err(self.err(
                p.at,
                format!(
                    "{who} sets data_port but has no fabric_ip; add fabric_ip = \"ADDRESS\" (its data address) or drop data_port"
                ),
            ));
        }
        let node = Node {
            name: name.v,
            agent: format!("{}:{port}", agent.v.host),
            root: root.v,
            fabric_if: fabric_if.map(|i| i.v),
            fabric_ip: own.fabric_ip.map(|ip| ip.v),
            data_port: data_port.map_or(port, |p| p.v),
            rdma: rdma_device.map(|d| Rdma {
                device: d.v,
                gid_index: gid_index.map(|g| g.v),
            }),
            line: self.line(header),
        };
        Ok((node, name.at, agent.at))
    }

    /// Reads and checks each field of a `[[node]]` or `[defaults]` table.
    fn fields(&self, table: &DeTable, section: Section) -> Result<Fields, ClusterError> {
        let mut f = Fields::default();
        for e in entries(table) {
            let (key, v, at) = (e.key, e.value, e.at);
            let bad = |msg: String| self.err(at, msg);
            if section == Section::Defaults && PER_NODE_ONLY.contains(&key) {
                return Err(self.err(
                    e.key_at,
                    format!(
                        "{key} cannot go in [defaults]: it differs from node to node; set it in each [[node]]"
                    ),
                ));
            }
            let templated = matches!(section, Section::Slurm | Section::SlurmHost(_));
            match key {
                "host" if section == Section::Slurm => {}
                "agent" | "fabric_ip" if templated => {
                    let example = if key == "agent" {
                        "agent = \"{host}:7470\""
                    } else {
                        "fabric_ip = \"{host}-ib\""
                    };
                    let s = self.r.string(key, v, example)?;
                    // A template is checked as it would be for a host named
                    // `node1`, so a malformed one fails before any job.
                    let sample = s.replace(HOST_PLACEHOLDER, "node1");
                    if key == "agent" {
                        parse_agent(&sample).map_err(|e| bad(e.to_string()))?;
                    } else if sample.parse::<IpAddr>().is_ok() || sample.contains('/') {
                        parse_fabric_ip(&sample).map_err(|e| bad(e.to_string()))?;
                    } else if !is_host_name(&sample) {
                        return Err(bad(format!(
                            "fabric_ip {s:?} is neither an address nor a host name; write an address, or a name each host's fabric address resolves from, e.g. \"{{host}}-ib\""
                        )));
                    }
                    let t = Some(At { v: s.to_string(), at });
                    if key == "agent" {
                        f.agent_template = t;
                    } else {
                        f.fabric_ip_template = t;
                    }
                }
                "name" if templated => {
                    return Err(self.err(
                        e.key_at,
                        format!("{section} takes no name: each host's node is named as Slurm names the host"),
                    ))
                }
                "name" => {
                    let s = self.r.string(key, v, "name = \"spark-a\"")?;
                    f.name = Some(At {
                        v: NodeName::new(s).map_err(|e| bad(e.to_string()))?,
                        at,
                    });
                }
                "agent" => {
                    let s = self.r.string(key, v, "agent = \"10.0.0.1:7470\"")?;
                    f.agent = Some(At {
                        v: parse_agent(s).map_err(|e| bad(e.to_string()))?,
                        at,
                    });
                }
                "port" | "data_port" => {
                    let n = self.r.integer(key, v, "7470")?;
                    let p = match u16::try_from(n) {
                        Ok(0) => {
                            return Err(bad(format!(
                                "port 0 is not a port; use the agent's --listen port ({DEFAULT_PORT} by default)"
                            )))
                        }
                        Ok(p) => p,
                        Err(_) => {
                            return Err(bad(format!(
                                "port {n} is out of range; ports run 1-65535"
                            )))
                        }
                    };
                    if key == "port" {
                        f.port = Some(At { v: p, at });
                    } else {
                        f.data_port = Some(At { v: p, at });
                    }
                }
                "root" => {
                    let s = self.r.string(key, v, "root = \"/var/lib/xfer/hub\"")?;
                    if !s.starts_with('/') {
                        let what = if s.is_empty() {
                            "root is empty".to_string()
                        } else {
                            format!("root {s:?} is relative")
                        };
                        return Err(bad(format!(
                            "{what}; write the absolute path of the node's model folder (its agent's --root), e.g. \"/var/lib/xfer/hub\""
                        )));
                    }
                    f.root = Some(At {
                        v: PathBuf::from(s),
                        at,
                    });
                }
                "fabric_if" => {
                    let s = self.r.string(key, v, "fabric_if = \"enp1s0f1np1\"")?;
                    if !is_ifname(s) {
                        return Err(bad(format!(
                            "fabric_if {s:?} is not an interface name (at most {MAX_IFNAME_LEN} characters, no '/', ':' or spaces); use the name `ip -br link` shows on that node"
                        )));
                    }
                    f.fabric_if = Some(At {
                        v: s.to_string(),
                        at,
                    });
                }
                "fabric_ip" => {
                    let s = self.r.string(key, v, "fabric_ip = \"192.168.100.1\"")?;
                    f.fabric_ip = Some(At {
                        v: parse_fabric_ip(s).map_err(|e| bad(e.to_string()))?,
                        at,
                    });
                }
                "rdma_device" => {
                    let s = self.r.string(key, v, "rdma_device = \"rocep1s0f1\"")?;
                    if s.is_empty()
                        || s.len() > MAX_RDMA_NAME_LEN
                        || s.contains(|c: char| c == '/' || c.is_whitespace() || c.is_control())
                    {
                        return Err(bad(format!(
                            "rdma_device {s:?} is not an RDMA device name; use the name `ibv_devices` lists on that node, e.g. \"rocep1s0f1\""
                        )));
                    }
                    f.rdma_device = Some(At {
                        v: s.to_string(),
                        at,
                    });
                }
                "gid_index" => {
                    let n = self.r.integer(key, v, "3")?;
                    if !(0..=255).contains(&n) {
                        return Err(bad(format!(
                            "gid_index {n} is out of range; GID indexes run 0-255 (see `show_gids` on that node)"
                        )));
                    }
                    f.gid_index = Some(At { v: n as u32, at });
                }
                _ => return Err(self.unknown_in(&e, section)),
            }
        }
        Ok(f)
    }

    /// Reads `[slurm]` and its `[slurm.host.NAME]` tables; `at` is where
    /// `slurm` is written.
    fn slurm_tables(&self, at: usize, table: &DeTable) -> Result<SlurmTables, ClusterError> {
        let fields = self.fields(table, Section::Slurm)?;
        if fields.agent_template.is_none() {
            return Err(self.err(
                at,
                "[slurm] has no agent; add agent = \"{host}:7470\", the address each host's agent listens on ({host} is the host's Slurm name)",
            ));
        }
        let mut hosts = Vec::new();
        if let Some(e) = entries(table).into_iter().find(|e| e.key == "host") {
            let t = self.r.table(
                "host",
                e.value,
                "write one [slurm.host.NAME] table per host that differs",
            )?;
            for h in entries(t) {
                let ht = self.r.table(
                    h.key,
                    h.value,
                    "write it as a [slurm.host.NAME] table of the settings that differ on that host",
                )?;
                NodeName::new(h.key).map_err(|err| self.err(h.key_at, err.to_string()))?;
                let f = self.fields(ht, Section::SlurmHost(h.key.to_string()))?;
                hosts.push((h.key.to_string(), h.key_at, f));
            }
        }
        Ok(SlurmTables { at, fields, hosts })
    }

    /// The fields of `host`'s node in the Slurm job `job`: its
    /// `[slurm.host.NAME]` over `[slurm]`, with `{host}` replaced (in
    /// agent, fabric_ip and root) and a fabric host name resolved to its
    /// address.
    fn slurm_node(
        &self,
        slurm: &SlurmTables,
        host: &str,
        job: &Allocation,
    ) -> Result<Fields, ClusterError> {
        let name = NodeName::new(host).map_err(|e| {
            self.err(
                slurm.at,
                format!("{}: host {host:?} cannot name a node: {e}", job.describe()),
            )
        })?;
        let base = &slurm.fields;
        let over = slurm
            .hosts
            .iter()
            .find(|(h, _, _)| h == host)
            .map(|(_, _, f)| f.clone())
            .unwrap_or_default();
        let fill = |text: &str| text.replace(HOST_PLACEHOLDER, host);
        let agent_t = over.agent_template.or_else(|| base.agent_template.clone());
        let agent = agent_t
            .map(|t| {
                parse_agent(&fill(&t.v))
                    .map(|v| At { v, at: t.at })
                    .map_err(|e| self.err(t.at, format!("for host {host:?}: {e}")))
            })
            .transpose()?;
        let fabric_t = over
            .fabric_ip_template
            .or_else(|| base.fabric_ip_template.clone());
        let fabric_ip = fabric_t
            .map(|t| {
                resolve_fabric(&fill(&t.v), host)
                    .map(|v| At { v, at: t.at })
                    .map_err(|e| self.err(t.at, e))
            })
            .transpose()?;
        Ok(Fields {
            name: Some(At {
                v: name,
                at: slurm.at,
            }),
            agent,
            port: over.port.or_else(|| base.port.clone()),
            root: over.root.or_else(|| base.root.clone()).map(|r| At {
                v: PathBuf::from(fill(&r.v.to_string_lossy())),
                at: r.at,
            }),
            fabric_if: over.fabric_if.or_else(|| base.fabric_if.clone()),
            fabric_ip,
            data_port: over.data_port.or_else(|| base.data_port.clone()),
            rdma_device: over.rdma_device.or_else(|| base.rdma_device.clone()),
            gid_index: over.gid_index.or_else(|| base.gid_index.clone()),
            agent_template: None,
            fabric_ip_template: None,
        })
    }

    fn unknown_in(&self, e: &Entry, section: Section) -> ClusterError {
        let allowed: Vec<&str> = match section {
            Section::Defaults => NODE_KEYS
                .iter()
                .copied()
                .filter(|k| !PER_NODE_ONLY.contains(k))
                .collect(),
            Section::Node(_) => NODE_KEYS.to_vec(),
            Section::Slurm => SLURM_KEYS.to_vec(),
            Section::SlurmHost(_) => SLURM_KEYS
                .iter()
                .copied()
                .filter(|k| *k != "host")
                .collect(),
        };
        let table = section.to_string();
        let otherwise = || format!("{section} takes {}", and_list(&allowed));
        self.r
            .unknown_key(e, &table, &allowed, ALIASES, otherwise)
            .into()
    }

    fn unknown_top(&self, e: &Entry) -> ClusterError {
        let key = e.key;
        let hint = if NODE_KEYS.contains(&key) {
            format!(
                "{key} is a node setting: put it in [defaults] (for every node) or in a [[node]] table"
            )
        } else if let Some(s) = did_you_mean(key, TOP_KEYS, ALIASES) {
            s
        } else {
            "the top level holds key, [defaults], [[node]] and [launch]".to_string()
        };
        self.err(e.key_at, format!("unknown top-level key {key:?}; {hint}"))
    }
}

/// The fix every malformed agent address is told.
const FIX_AGENT: &str =
    "write HOST[:PORT], e.g. \"10.0.0.1:7470\", \"[fd00::1]:7470\" or \"spark-a.lan\"";

/// Why a text is not an agent's `HOST[:PORT]`: one line naming the text and
/// the form expected (the cluster file's reader puts `FILE:LINE:COL`
/// before it; `--to`, `--from` and `--listen` their flag).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Nothing given.
    #[error("agent is empty; {FIX_AGENT}")]
    Empty,
    /// A URL or a path.
    #[error("agent {0:?} is not HOST[:PORT]; {FIX_AGENT}")]
    NotHostPort(String),
    /// `[` without its `]`.
    #[error("agent {0:?} opens '[' but never closes it; {FIX_AGENT}")]
    Unclosed(String),
    /// Brackets around something else than an IPv6 address.
    #[error("agent {text:?}: {host:?} is not an IPv6 address; {FIX_AGENT}")]
    NotIpv6 {
        /// The whole text.
        text: String,
        /// The part in brackets.
        host: String,
    },
    /// Something else than `:PORT` after the brackets.
    #[error("agent {text:?} has {rest:?} after the address; {FIX_AGENT}")]
    AfterAddress {
        /// The whole text.
        text: String,
        /// What follows `]`.
        rest: String,
    },
    /// An unbracketed IPv6 address with a port, or no address at all.
    #[error("agent {0:?} is not HOST[:PORT]; an IPv6 address with a port goes in brackets, e.g. \"[fd00::1]:7470\"")]
    BareIpv6(String),
    /// `:PORT` alone.
    #[error("agent {0:?} has no host; {FIX_AGENT}")]
    NoHost(String),
    /// Digits and dots that are no IPv4 address.
    #[error("agent {text:?}: {host:?} is not an IPv4 address; {FIX_AGENT}")]
    NotIpv4 {
        /// The whole text.
        text: String,
        /// The host part.
        host: String,
    },
    /// Characters no host name has.
    #[error("agent {text:?}: {host:?} is not a host name; {FIX_AGENT}")]
    NotHostName {
        /// The whole text.
        text: String,
        /// The host part.
        host: String,
    },
    /// An address that names no one machine.
    #[error("agent {text:?} cannot be connected to ({ip} is not one machine's address); write the node's own address")]
    NotOneMachine {
        /// The whole text.
        text: String,
        /// The address.
        ip: IpAddr,
    },
    /// Port 0.
    #[error("agent {0:?} has port 0; use the port its agent listens on (--listen, {DEFAULT_PORT} by default)")]
    PortZero(String),
    /// A port above 65535.
    #[error("agent {text:?} has port {port}; ports run 1-65535")]
    PortRange {
        /// The whole text.
        text: String,
        /// The number given.
        port: u32,
    },
    /// A port that is no number.
    #[error("agent {text:?}: {port:?} is not a port number; {FIX_AGENT}")]
    NotPort {
        /// The whole text.
        text: String,
        /// The port part.
        port: String,
    },
}

/// `HOST[:PORT]`: an IPv4 address, a bracketed (or bare, portless) IPv6
/// address, or a host name.
fn parse_agent(s: &str) -> Result<AgentAddr, AddressError> {
    let text = || s.to_string();
    if s.is_empty() {
        return Err(AddressError::Empty);
    }
    if s.contains("://") || s.contains('/') {
        return Err(AddressError::NotHostPort(text()));
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((h, after)) = rest.split_once(']') else {
            return Err(AddressError::Unclosed(text()));
        };
        let ip: Ipv6Addr = h.parse().map_err(|_| AddressError::NotIpv6 {
            text: text(),
            host: h.to_string(),
        })?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| AddressError::AfterAddress {
                        text: text(),
                        rest: p.to_string(),
                    })?,
            ),
        };
        (IpOrName::Ip(ip.into()), port)
    } else if s.matches(':').count() >= 2 {
        let ip: Ipv6Addr = s.parse().map_err(|_| AddressError::BareIpv6(text()))?;
        (IpOrName::Ip(ip.into()), None)
    } else {
        let (h, port) = match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        };
        if h.is_empty() {
            return Err(AddressError::NoHost(text()));
        }
        if h.chars().all(|c| c.is_ascii_digit() || c == '.') {
            let ip: Ipv4Addr = h.parse().map_err(|_| AddressError::NotIpv4 {
                text: text(),
                host: h.to_string(),
            })?;
            (IpOrName::Ip(ip.into()), port)
        } else if h.len() <= 253
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            (IpOrName::Name(h.to_ascii_lowercase()), port)
        } else {
            return Err(AddressError::NotHostName {
                text: text(),
                host: h.to_string(),
            });
        }
    };
    if let IpOrName::Ip(ip) = &host {
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(AddressError::NotOneMachine {
                text: text(),
                ip: *ip,
            });
        }
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u32>() {
            Ok(0) => return Err(AddressError::PortZero(text())),
            Ok(n) if n <= 65535 => Some(n as u16),
            Ok(n) => {
                return Err(AddressError::PortRange {
                    text: text(),
                    port: n,
                })
            }
            Err(_) => {
                return Err(AddressError::NotPort {
                    text: text(),
                    port: p.to_string(),
                })
            }
        },
    };
    let host = match host {
        IpOrName::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
        IpOrName::Ip(IpAddr::V4(ip)) => ip.to_string(),
        IpOrName::Name(n) => n,
    };
    Ok(AgentAddr { host, port })
}

/// An agent's address as every command takes it (the cluster file's
/// `agent`, `push --to`, `fetch --from`): `HOST[:PORT]` with a host name,
/// an IPv4 address or a bracketed IPv6 one, normalized to `HOST:PORT`
/// (the port defaults to [`DEFAULT_PORT`]). The error is one line naming
/// the form expected.
pub fn parse_address(s: &str) -> Result<String, AddressError> {
    let a = parse_agent(s)?;
    Ok(format!("{}:{}", a.host, a.port.unwrap_or(DEFAULT_PORT)))
}

/// Why a `--listen` value is refused: one line naming the form expected.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Not `HOST[:PORT]`.
    #[error("--listen: {0}")]
    Address(#[from] AddressError),
    /// The host does not resolve.
    #[error("--listen {text}: cannot resolve {host_port} ({source}); write HOST[:PORT] with one of this node's addresses, e.g. 0.0.0.0:{DEFAULT_PORT}")]
    Resolve {
        /// The text given (without a `:0`).
        text: String,
        /// It as `HOST:PORT`.
        host_port: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// The host resolves to nothing.
    #[error("--listen {text}: {host_port} resolves to no address; write HOST[:PORT], e.g. 0.0.0.0:{DEFAULT_PORT}")]
    NoAddress {
        /// The text given (without a `:0`).
        text: String,
        /// It as `HOST:PORT`.
        host_port: String,
    },
}

/// Where an agent listens (`serve --listen`, clap's value parser): the
/// syntax of [`parse_address`], plus the addresses that mean every
/// interface (`0.0.0.0`, `[::]`); a host name is resolved here, IPv4
/// first (`localhost:7470` listens on 127.0.0.1).
pub fn parse_listen(s: &str) -> Result<std::net::SocketAddr, ListenError> {
    use std::net::{SocketAddr, ToSocketAddrs};
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bare = s.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    // Port 0 (the kernel picks one) is fine to listen on, not to connect to.
    let (s, any_port) = match s.strip_suffix(":0") {
        Some(h) if !h.is_empty() && !h.ends_with(':') => (h, true),
        _ => (s, false),
    };
    let hp = parse_address(s)?;
    let addrs: Vec<SocketAddr> = hp
        .to_socket_addrs()
        .map_err(|source| ListenError::Resolve {
            text: s.to_string(),
            host_port: hp.clone(),
            source,
        })?
        .collect();
    let mut first = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied();
    if any_port {
        first.iter_mut().for_each(|a| a.set_port(0));
    }
    first.ok_or_else(|| ListenError::NoAddress {
        text: s.to_string(),
        host_port: hp,
    })
}

enum IpOrName {
    Ip(IpAddr),
    Name(String),
}

/// Why a `fabric_ip` is not this node's address on its fabric: one line
/// the cluster file's reader puts `FILE:LINE:COL` before.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum FabricIpError {
    /// `ADDR/LEN`.
    #[error("fabric_ip {text:?} has a prefix length; write the address alone: {addr:?}")]
    Prefix {
        /// The whole text.
        text: String,
        /// The address before `/`.
        addr: String,
    },
    /// Not an address.
    #[error("fabric_ip {0:?} is not an IP address; write this node's address on its fabric interface, e.g. \"192.168.100.1\" (see `ip -br addr`)")]
    NotIp(String),
    /// An address that names no one machine.
    #[error("fabric_ip {0:?} is not one machine's address; write this node's address on its fabric interface (see `ip -br addr`)")]
    NotOneMachine(String),
}

fn parse_fabric_ip(s: &str) -> Result<IpAddr, FabricIpError> {
    if let Some((addr, _)) = s.split_once('/') {
        return Err(FabricIpError::Prefix {
            text: s.to_string(),
            addr: addr.to_string(),
        });
    }
    let ip: IpAddr = s.parse().map_err(|_| FabricIpError::NotIp(s.to_string()))?;
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if ip.is_unspecified() || ip.is_multicast() || broadcast {
        return Err(FabricIpError::NotOneMachine(s.to_string()));
    }
    Ok(ip)
}

/// Whether `s` could be a DNS host name (letters, digits, '-', '.', '_').
fn is_host_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// A `[slurm]` fabric_ip, filled in for `host`: an address, or a name
/// resolved (by the system's resolver: /etc/hosts, DNS) to one.
fn resolve_fabric(text: &str, host: &str) -> Result<IpAddr, String> {
    if text.parse::<IpAddr>().is_ok() || text.contains('/') {
        return parse_fabric_ip(text).map_err(|e| format!("for host {host:?}: {e}"));
    }
    use std::net::ToSocketAddrs;
    let fix =
        format!("add it to /etc/hosts or DNS, or set [slurm.host.{host}] fabric_ip = \"ADDRESS\"");
    match (text, 0).to_socket_addrs() {
        Ok(mut addrs) => addrs.next().map(|a| a.ip()).ok_or_else(|| {
            format!("fabric_ip {text:?} (host {host:?}) resolves to no address; {fix}")
        }),
        Err(e) => Err(format!(
            "fabric_ip {text:?} (host {host:?}) cannot be resolved ({e}); {fix}"
        )),
    }
}

/// Whether Linux would accept `s` as an interface name.
fn is_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_IFNAME_LEN
        && s != "."
        && s != ".."
        && !s.contains(|c: char| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::toml_reader::{edit_distance, line_col, suggest};

    /// The one-line message for `text`, which must be refused.
    fn refused(text: &str) -> String {
        match Cluster::parse(text, "cluster.toml") {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    const VALID: &str = r#"# two boxes, cross-wired
key = "secrets/cluster.key"

[defaults]
root = "/var/lib/xfer/hub"
port = 7471
gid_index = 3

[[node]]
name = "spark-a"
agent = "10.0.0.1"
fabric_if = "enp1s0f1np1"
fabric_ip = "192.168.100.1"
rdma_device = "rocep1s0f1"

[[node]]
name = "spark-b"
agent = "[::1]:7470"
root = "/data/hf/hub"
fabric_if = "enP2p1s0f0np0"
fabric_ip = "fd00::2"
rdma_device = "roceP2p1s0f0"
gid_index = 1

[[node]]
name = "Box_3.lab"
agent = "Box3.LAN:9000"

[launch]
engine = "vllm"
tp = 2
"#;

    #[test]
    fn cluster_full_file_applies_defaults_and_overrides() {
        let c = Cluster::parse(VALID, "/etc/xfer/cluster.toml").unwrap();
        assert_eq!(c.key, PathBuf::from("/etc/xfer/secrets/cluster.key"));
        assert_eq!(c.path, PathBuf::from("/etc/xfer/cluster.toml"));
        assert_eq!(c.nodes.len(), 3);

        let a = &c.nodes[0];
        assert_eq!(a.name.as_str(), "spark-a");
        assert_eq!(a.agent, "10.0.0.1:7471", "port from [defaults]");
        assert_eq!(a.root, PathBuf::from("/var/lib/xfer/hub"));
        assert_eq!(a.fabric_if.as_deref(), Some("enp1s0f1np1"));
        assert_eq!(a.fabric_ip, Some("192.168.100.1".parse().unwrap()));
        assert_eq!(
            a.rdma,
            Some(Rdma {
                device: "rocep1s0f1".into(),
                gid_index: Some(3)
            })
        );
        assert_eq!(a.line, 9);

        let b = &c.nodes[1];
        assert_eq!(b.agent, "[::1]:7470", "the agent's own port wins");
        assert_eq!(b.root, PathBuf::from("/data/hf/hub"));
        assert_eq!(b.fabric_ip, Some("fd00::2".parse().unwrap()));
        assert_eq!(b.rdma.as_ref().unwrap().gid_index, Some(1));

        let third = &c.nodes[2];
        assert_eq!(third.agent, "box3.lan:9000");
        assert_eq!(third.fabric_if, None);
        assert_eq!(third.fabric_ip, None);
        assert_eq!(third.rdma, None);

        let launch = c.launch.as_ref().unwrap();
        assert_eq!(launch["engine"].as_str(), Some("vllm"));
        assert_eq!(launch["tp"].as_integer(), Some(2));
    }

    #[test]
    fn cluster_port_defaults_to_7470_and_bare_ipv6_is_bracketed() {
        let c = Cluster::parse(
            r#"key = "/k"
[[node]]
name = "a"
agent = "10.0.0.1"
root = "/r"
[[node]]
name = "b"
agent = "fd00::1"
port = 7000
root = "/r"
"#,
            "cluster.toml",
        )
        .unwrap();
        assert_eq!(c.nodes[0].agent, "10.0.0.1:7470");
        assert_eq!(c.nodes[1].agent, "[fd00::1]:7000");
        assert_eq!(c.launch, None);
        // A relative path for the file leaves a relative key relative to
        // the same folder.
        let c = Cluster::parse(VALID, "cluster.toml").unwrap();
        assert_eq!(c.key, PathBuf::from("secrets/cluster.key"));
    }

    #[test]
    fn cluster_example_in_docs_parses() {
        let text = include_str!("../../../docs/cluster.example.toml");
        let c = Cluster::parse(text, "docs/cluster.example.toml").unwrap();
        assert_eq!(c.key, PathBuf::from("/etc/xfer/operator.pem"));
        let names: Vec<&str> = c.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["spark-a", "spark-b"]);
        let (a, b) = (&c.nodes[0], &c.nodes[1]);
        assert_eq!(a.agent, "10.0.0.1:7470");
        assert_eq!(b.agent, "10.0.0.2:7470");
        assert_eq!(a.root, PathBuf::from("/data/hf/hub"));
        assert_eq!(b.root, PathBuf::from("/var/lib/xfer/hub"));
        assert_ne!(
            a.fabric_if, b.fabric_if,
            "cross-wired: names differ per node"
        );
        assert_eq!(a.rdma.as_ref().unwrap().gid_index, Some(3));
        assert_eq!(b.rdma.as_ref().unwrap().gid_index, Some(1));
        assert_eq!(c.launch, None);
        // Data rides the fabric; management and fabric are different subnets.
        assert_eq!(a.data_addr().as_deref(), Some("192.168.100.1:7470"));
        assert_eq!(b.data_addr().as_deref(), Some("192.168.100.2:7470"));
    }

    #[test]
    fn data_port_defaults_to_the_agent_port_and_needs_a_fabric() {
        let c = Cluster::parse(
            "key = \"k\"\n[[node]]\nname = \"a\"\nagent = \"10.0.0.1:7471\"\nroot = \"/r\"\nfabric_if = \"eth1\"\nfabric_ip = \"fd00::1\"\n[[node]]\nname = \"b\"\nagent = \"10.0.0.2\"\nroot = \"/r\"\nfabric_if = \"eth1\"\nfabric_ip = \"192.168.1.2\"\ndata_port = 9000\n[[node]]\nname = \"c\"\nagent = \"10.0.0.3\"\nroot = \"/r\"\n",
            "cluster.toml",
        )
        .unwrap();
        let data: Vec<Option<String>> = c.nodes.iter().map(|n| n.data_addr()).collect();
        assert_eq!(
            data,
            [
                Some("[fd00::1]:7471".to_string()),
                Some("192.168.1.2:9000".to_string()),
                None
            ]
        );
        let e = Cluster::parse(
            "key = \"k\"\n[[node]]\nname = \"a\"\nagent = \"10.0.0.1\"\nroot = \"/r\"\ndata_port = 9000\n",
            "cluster.toml",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "cluster.toml:6:13: node \"a\" sets data_port but has no fabric_ip; add fabric_ip = \"ADDRESS\" (its data address) or drop data_port"
        );
    }

    #[test]
    fn cluster_toml_syntax_error_has_its_line() {
        let text = r#"key = "/k"
[[node]]
name = "a"
agent = 10.0.0.1:7470
"#;
        assert_eq!(
            refused(text),
            "cluster.toml:4:13: invalid float; fix the TOML syntax (see docs/cluster.example.toml)"
        );
        let text = r#"key = "/k"
[[node]]
name = spark-a
"#;
        assert_eq!(
            refused(text),
            "cluster.toml:3:8: string values must be quoted, expected literal string; fix the TOML syntax (see docs/cluster.example.toml)"
        );
        assert_eq!(
            refused("key = \"/k\"\n\n[[node]\n"),
            "cluster.toml:3:8: unclosed array table, expected `]`; fix the TOML syntax (see docs/cluster.example.toml)"
        );
        assert_eq!(
            refused("key = \"/k\"\n[[node]]\nname = \"a\"\nname = \"b\"\n"),
            r#"cluster.toml:4:1: duplicate key "name"; keep one of them"#
        );
    }

    #[test]
    fn cluster_unknown_key_suggests_the_known_one() {
        let text = r#"key = "/k"
[[node]]
name = "a"
agent = "10.0.0.1"
root = "/r"

[[node]]
name = "b"
  fabric_iface = "enp1s0f0np0"
"#;
        assert_eq!(
            refused(text),
            r#"cluster.toml:9:3: unknown key "fabric_iface" in [[node]] 2; did you mean "fabric_if"?"#
        );
        // Reported before the fields the node lacks (agent, root).
        assert_eq!(
            refused("key = \"/k\"\n[[node]]\nnmae = \"a\"\n"),
            r#"cluster.toml:3:1: unknown key "nmae" in [[node]] 1; did you mean "name"?"#
        );
        assert_eq!(
            refused("key = \"/k\"\n[defaults]\ncolour = \"red\"\n"),
            "cluster.toml:3:1: unknown key \"colour\" in [defaults]; [defaults] takes port, root, fabric_if, data_port, rdma_device and gid_index"
        );
        assert_eq!(
            refused("key = \"/k\"\n[defaults]\nname = \"a\"\n"),
            "cluster.toml:3:1: name cannot go in [defaults]: it differs from node to node; set it in each [[node]]"
        );
    }

    #[test]
    fn cluster_unknown_top_level_key_is_refused_but_launch_is_reserved() {
        assert_eq!(
            refused("key = \"/k\"\n\n[nodes]\nname = \"a\"\n"),
            r#"cluster.toml:3:2: unknown top-level key "nodes"; did you mean "node"?"#
        );
        assert_eq!(
            refused("key = \"/k\"\nversion = 2\n"),
            r#"cluster.toml:2:1: unknown top-level key "version"; the top level holds key, [defaults], [[node]] and [launch]"#
        );
        assert_eq!(
            refused("key = \"/k\"\nroot = \"/r\"\n"),
            r#"cluster.toml:2:1: unknown top-level key "root"; root is a node setting: put it in [defaults] (for every node) or in a [[node]] table"#
        );
        assert_eq!(
            refused("key = \"/k\"\nlaunch = 3\n"),
            "cluster.toml:2:10: launch is an integer; write it as a [launch] table"
        );
    }

    #[test]
    fn cluster_duplicate_name_points_at_both() {
        let text = r#"key = "/k"
[defaults]
root = "/r"
[[node]]
name = "spark-a"
agent = "10.0.0.1"
[[node]]
name = "spark-b"
agent = "10.0.0.2"
[[node]]
name = "spark-a"
agent = "10.0.0.3"
"#;
        assert_eq!(
            refused(text),
            r#"cluster.toml:11:8: duplicate node name "spark-a" (first at line 5); give every node its own name"#
        );
    }

    #[test]
    fn cluster_duplicate_agent_after_normalizing() {
        let text = r#"key = "/k"
[defaults]
root = "/r"
[[node]]
name = "spark-a"
agent = "10.0.0.1"
[[node]]
name = "spark-b"
agent = "10.0.0.1:7470"
"#;
        assert_eq!(
            refused(text),
            r#"cluster.toml:9:9: duplicate agent address 10.0.0.1:7470 (node "spark-a" has it, line 6); give each node the address of its own agent"#
        );
    }

    #[test]
    fn cluster_duplicate_fabric_ip() {
        let text = r#"key = "/k"
[defaults]
root = "/r"
fabric_if = "eth1"
[[node]]
name = "a"
agent = "10.0.0.1"
fabric_ip = "192.168.100.1"
[[node]]
name = "b"
agent = "10.0.0.2"
fabric_ip = "192.168.100.1"
"#;
        assert_eq!(
            refused(text),
            r#"cluster.toml:12:13: duplicate fabric_ip 192.168.100.1 (node "a" has it, line 8); give each node its own address on the fabric"#
        );
    }

    /// A one-node file whose node has `extra` as its last lines (line 6 on).
    fn one_node(extra: &str) -> String {
        format!(
            "key = \"/k\"\n[[node]]\nname = \"a\"\nagent = \"10.0.0.1\"\nroot = \"/r\"\n{extra}"
        )
    }

    #[test]
    fn cluster_bad_fabric_ip() {
        assert_eq!(
            refused(&one_node("fabric_if = \"eth1\"\nfabric_ip = \"192.168.100.300\"\n")),
            "cluster.toml:7:13: fabric_ip \"192.168.100.300\" is not an IP address; write this node's address on its fabric interface, e.g. \"192.168.100.1\" (see `ip -br addr`)"
        );
        assert_eq!(
            refused(&one_node(
                "fabric_if = \"eth1\"\nfabric_ip = \"192.168.100.1/24\"\n"
            )),
            r#"cluster.toml:7:13: fabric_ip "192.168.100.1/24" has a prefix length; write the address alone: "192.168.100.1""#
        );
        assert_eq!(
            refused(&one_node("fabric_if = \"eth1\"\nfabric_ip = 3\n")),
            r#"cluster.toml:7:13: fabric_ip is an integer; write a quoted string, like fabric_ip = "192.168.100.1""#
        );
    }

    #[test]
    fn cluster_fabric_if_and_fabric_ip_come_together() {
        assert_eq!(
            refused(&one_node("fabric_if = \"enp1s0f1np1\"\n")),
            r#"cluster.toml:6:13: node "a" has fabric_if but no fabric_ip; add fabric_ip = "ADDRESS" (its address on enp1s0f1np1) or drop fabric_if"#
        );
        assert_eq!(
            refused(&one_node("fabric_ip = \"192.168.100.1\"\n")),
            "cluster.toml:6:13: node \"a\" has fabric_ip but no fabric_if; add fabric_if = \"IFACE\" (the interface holding 192.168.100.1, see `ip -br addr`) or drop fabric_ip"
        );
        let text = r#"key = "/k"
[defaults]
root = "/r"
fabric_if = "eth1"
[[node]]
name = "a"
agent = "10.0.0.1"
"#;
        assert_eq!(
            refused(text),
            r#"cluster.toml:5:1: node "a" has no fabric_ip but [defaults] sets fabric_if = "eth1" (line 4); add fabric_ip = "ADDRESS", its address on that interface"#
        );
        assert_eq!(
            refused(&one_node("fabric_if = \"a/b\"\n")),
            "cluster.toml:6:13: fabric_if \"a/b\" is not an interface name (at most 15 characters, no '/', ':' or spaces); use the name `ip -br link` shows on that node"
        );
    }

    #[test]
    fn cluster_gid_index_needs_rdma_device() {
        assert_eq!(
            refused(&one_node("gid_index = 3\n")),
            "cluster.toml:6:13: node \"a\" sets gid_index but has no rdma_device; add rdma_device = \"DEVICE\" (see `ibv_devices`) or drop gid_index"
        );
        let text = r#"key = "/k"
[defaults]
gid_index = 3
[[node]]
name = "a"
agent = "10.0.0.1"
root = "/r"
"#;
        assert_eq!(
            refused(text),
            "cluster.toml:3:13: [defaults] sets gid_index but no node has an rdma_device; add rdma_device to the nodes with RDMA, or drop gid_index"
        );
        assert_eq!(
            refused(&one_node("rdma_device = \"mlx5_0\"\ngid_index = 300\n")),
            "cluster.toml:7:13: gid_index 300 is out of range; GID indexes run 0-255 (see `show_gids` on that node)"
        );
        // An RDMA device without a GID index is fine: the transport picks.
        let c = Cluster::parse(&one_node("rdma_device = \"mlx5_0\"\n"), "c.toml").unwrap();
        assert_eq!(
            c.nodes[0].rdma,
            Some(Rdma {
                device: "mlx5_0".into(),
                gid_index: None
            })
        );
    }

    #[test]
    fn cluster_root_must_be_absolute() {
        let text = r#"key = "/k"
[[node]]
name = "a"
agent = "10.0.0.1"
root = "hf/hub"
"#;
        assert_eq!(
            refused(text),
            r#"cluster.toml:5:8: root "hf/hub" is relative; write the absolute path of the node's model folder (its agent's --root), e.g. "/var/lib/xfer/hub""#
        );
        assert_eq!(
            refused("key = \"/k\"\n[[node]]\nname = \"a\"\nagent = \"10.0.0.1\"\n"),
            r#"cluster.toml:2:1: node "a" has no root; add root = "/absolute/path" (its agent's --root) to it or to [defaults]"#
        );
    }

    #[test]
    fn cluster_without_nodes_or_key_or_anything() {
        assert_eq!(
            refused("key = \"/k\"\n[defaults]\nroot = \"/r\"\n"),
            "cluster.toml:1:1: no nodes; add a [[node]] table with name, agent and root for each machine (see docs/cluster.example.toml)"
        );
        assert_eq!(
            refused("key = \"/k\"\nnode = []\n"),
            "cluster.toml:2:8: no nodes; add a [[node]] table with name, agent and root for each machine (see docs/cluster.example.toml)"
        );
        assert_eq!(
            refused("# nothing yet\n\n"),
            "cluster.toml:1:1: the cluster file is empty; it needs key = \"PATH\" and one [[node]] per machine (see docs/cluster.example.toml)"
        );
        assert_eq!(
            refused("[[node]]\nname = \"a\"\nagent = \"h\"\nroot = \"/r\"\n"),
            "cluster.toml:1:1: no key; add key = \"/etc/xfer/operator.pem\" at the top, naming your credential, the file `xfer ca issue NAME --role operator --dir CA --out FILE` wrote"
        );
        assert_eq!(
            refused("key = \"/k\"\n[node]\nname = \"a\"\n"),
            "cluster.toml:2:1: [node] is a single table; write [[node]] (double brackets), once per machine"
        );
    }

    #[test]
    fn cluster_name_characters_are_checked() {
        let text = r#"key = "/k"
[[node]]
name = "spark a"
agent = "10.0.0.1"
root = "/r"
"#;
        assert_eq!(
            refused(text),
            r#"cluster.toml:3:8: node name "spark a" contains ' '; use only letters, digits, '.', '_' and '-'"#
        );
        assert!(NodeName::new(&"n".repeat(64)).is_ok());
        assert_eq!(
            NodeName::new(&"n".repeat(65)).unwrap_err().to_string(),
            format!(
                "node name {:?} is 65 characters long; use at most 64",
                "n".repeat(65)
            )
        );
        assert!(NodeName::new("").is_err());
        assert!(NodeName::new("gpu-01.rack_2").is_ok());
    }

    #[test]
    fn cluster_agent_address_and_port_are_checked() {
        let agent = |a: &str| {
            refused(&format!(
                "key = \"/k\"\n[[node]]\nname = \"a\"\nroot = \"/r\"\nagent = {a}\n"
            ))
        };
        assert_eq!(
            agent(r#""10.0.0.1:0""#),
            r#"cluster.toml:5:9: agent "10.0.0.1:0" has port 0; use the port its agent listens on (--listen, 7470 by default)"#
        );
        assert_eq!(
            agent(r#""10.0.0.1:7470:1""#),
            r#"cluster.toml:5:9: agent "10.0.0.1:7470:1" is not HOST[:PORT]; an IPv6 address with a port goes in brackets, e.g. "[fd00::1]:7470""#
        );
        assert_eq!(
            agent(r#""10.0.0.300""#),
            r#"cluster.toml:5:9: agent "10.0.0.300": "10.0.0.300" is not an IPv4 address; write HOST[:PORT], e.g. "10.0.0.1:7470", "[fd00::1]:7470" or "spark-a.lan""#
        );
        assert_eq!(
            agent(r#""http://10.0.0.1""#),
            r#"cluster.toml:5:9: agent "http://10.0.0.1" is not HOST[:PORT]; write HOST[:PORT], e.g. "10.0.0.1:7470", "[fd00::1]:7470" or "spark-a.lan""#
        );
        assert_eq!(
            agent(r#""0.0.0.0:7470""#),
            r#"cluster.toml:5:9: agent "0.0.0.0:7470" cannot be connected to (0.0.0.0 is not one machine's address); write the node's own address"#
        );
        assert_eq!(
            agent(r#""[::1:7470""#),
            r#"cluster.toml:5:9: agent "[::1:7470" opens '[' but never closes it; write HOST[:PORT], e.g. "10.0.0.1:7470", "[fd00::1]:7470" or "spark-a.lan""#
        );
        assert_eq!(
            refused(&one_node("port = 0\n")),
            "cluster.toml:6:8: port 0 is not a port; use the agent's --listen port (7470 by default)"
        );
        assert_eq!(
            refused(&one_node("port = \"7470\"\n")),
            "cluster.toml:6:8: port is a string; write a whole number, like port = 7470"
        );
        assert_eq!(
            refused(&one_node("port = 70000\n")),
            "cluster.toml:6:8: port 70000 is out of range; ports run 1-65535"
        );
        let text = r#"key = "/k"
[[node]]
name = "a"
agent = "10.0.0.1:7470"
port = 7471
root = "/r"
"#;
        assert_eq!(
            refused(text),
            r#"cluster.toml:5:8: node "a" sets port = 7471 but its agent names port 7470; drop one of them"#
        );
    }

    #[test]
    fn cluster_node_and_select() {
        let c = Cluster::parse(VALID, "cluster.toml").unwrap();
        assert_eq!(c.node("spark-b").unwrap().agent, "[::1]:7470");
        assert!(c.node("spark-c").is_none());
        let all: Vec<&str> = c
            .select(&[])
            .unwrap()
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(all, ["spark-a", "spark-b", "Box_3.lab"]);
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let picked: Vec<&str> = c
            .select(&names(&["spark-b", "spark-a", "spark-b"]))
            .unwrap()
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(picked, ["spark-b", "spark-a"]);
        assert_eq!(
            c.select(&names(&["spark-a", "spark-c"]))
                .unwrap_err()
                .to_string(),
            r#"cluster.toml: no node named "spark-c"; the nodes are spark-a, spark-b, Box_3.lab"#
        );
        assert_eq!(
            c.select(&names(&["x", "y"])).unwrap_err().to_string(),
            r#"cluster.toml: no nodes named "x", "y"; the nodes are spark-a, spark-b, Box_3.lab"#
        );
    }

    #[test]
    fn cluster_load_reads_the_file_and_resolves_the_key_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.toml");
        std::fs::write(&path, VALID).unwrap();
        let c = Cluster::load(&path).unwrap();
        assert_eq!(c.key, dir.path().join("secrets/cluster.key"));
        assert_eq!(c.path, path);

        let missing = dir.path().join("nope.toml");
        let e = Cluster::load(&missing).unwrap_err();
        assert!(matches!(e, ClusterError::Read { .. }));
        assert_eq!(e.line(), None);
        assert!(
            e.to_string()
                .starts_with(&format!("cannot read cluster file {}: ", missing.display())),
            "{e}"
        );

        std::fs::write(&path, "key = \"/k\"\n[[node]]\nname = \"a b\"\n").unwrap();
        let e = Cluster::load(&path).unwrap_err();
        assert_eq!(e.line(), Some(3));
        assert!(e
            .to_string()
            .starts_with(&format!("{}:3:8: ", path.display())));
    }

    #[test]
    fn cluster_suggestions_and_positions() {
        assert_eq!(
            suggest("fabric_iface", NODE_KEYS, ALIASES),
            Some("fabric_if")
        );
        assert_eq!(suggest("Name", NODE_KEYS, ALIASES), Some("name"));
        assert_eq!(suggest("address", NODE_KEYS, ALIASES), Some("agent"));
        assert_eq!(suggest("gpu", NODE_KEYS, ALIASES), None);
        assert_eq!(edit_distance("nmae", "name"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(line_col("ab\ncd\né x", 9), (3, 3));
        assert_eq!(line_col("ab", 99), (1, 3));
    }

    #[test]
    fn one_address_syntax_for_agents_and_listen() {
        assert_eq!(parse_address("localhost:7471").unwrap(), "localhost:7471");
        assert_eq!(parse_address("Spark-A.lan").unwrap(), "spark-a.lan:7470");
        assert_eq!(parse_address("10.0.0.2").unwrap(), "10.0.0.2:7470");
        assert_eq!(parse_address("[fd00::1]:9").unwrap(), "[fd00::1]:9");
        for bad in ["", "a b", "http://x", "10.0.0.2:x"] {
            assert!(
                parse_address(bad).unwrap_err().to_string().contains("HOST"),
                "{bad}"
            );
        }
        assert_eq!(
            parse_listen("localhost:7471").unwrap(),
            "127.0.0.1:7471".parse().unwrap()
        );
        assert_eq!(
            parse_listen("0.0.0.0").unwrap(),
            "0.0.0.0:7470".parse().unwrap()
        );
        assert_eq!(parse_listen("[::]:9").unwrap(), "[::]:9".parse().unwrap());
        assert_eq!(
            parse_listen("localhost:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        let e = parse_listen("no such host!").unwrap_err().to_string();
        assert!(
            e.starts_with("--listen") && e.contains("HOST[:PORT]"),
            "{e}"
        );
    }

    #[test]
    fn no_cluster_file_names_both_ways_to_give_one() {
        let e = cluster_file(None).unwrap_err().to_string();
        assert!(
            e.contains("--cluster FILE") && e.contains("XFER_CLUSTER=FILE"),
            "{e}"
        );
        assert_eq!(
            cluster_file(Some("c.toml".into())).unwrap(),
            PathBuf::from("c.toml")
        );
    }

    const SLURM: &str = r#"key = "op.pem"
[defaults]
root = "/var/lib/xfer/hub"
[slurm]
agent = "10.0.0.{host}:7471"
fabric_if = "ib0"
fabric_ip = "10.9.0.{host}"
[slurm.host.gpu03]
fabric_if = "ib1"
root = "/nvme/xfer/{host}"
[slurm.host.gpu04]
fabric_ip = "localhost"
[[node]]
name = "gpu02"
agent = "10.0.0.22:7470"
[[node]]
name = "login"
agent = "10.0.0.99"
"#;

    fn in_job(text: &str, nodelist: &str) -> Result<Cluster, ClusterError> {
        let job = Allocation::new(Some("7".into()), nodelist).unwrap();
        Cluster::parse_in(text, "cluster.toml", Some(&job))
    }

    #[test]
    fn inside_a_job_the_hosts_are_the_nodes_made_from_the_slurm_template() {
        // Host names that are numbers make the template's fabric_ip an
        // address here; names resolve through /etc/hosts in a real job.
        let text = SLURM
            .replace("gpu03", "3")
            .replace("gpu02", "2")
            .replace("gpu04", "4");
        let c = in_job(&text, "[1-4]").unwrap();
        let picked: Vec<_> = c.select(&[]).unwrap();
        let names: Vec<&str> = picked.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["1", "2", "3", "4"], "the job's hosts, in its order");
        let n1 = c.node("1").unwrap();
        assert_eq!(n1.agent, "10.0.0.1:7471");
        assert_eq!(n1.fabric_if.as_deref(), Some("ib0"));
        assert_eq!(n1.fabric_ip, Some("10.9.0.1".parse().unwrap()));
        assert_eq!(n1.root, PathBuf::from("/var/lib/xfer/hub"));
        // A [slurm.host.NAME] overrides the template for that host only.
        let n3 = c.node("3").unwrap();
        assert_eq!(n3.fabric_if.as_deref(), Some("ib1"));
        assert_eq!(n3.root, PathBuf::from("/nvme/xfer/3"));
        assert_eq!(n3.fabric_ip, Some("10.9.0.3".parse().unwrap()));
        // A fabric name resolves through the system's resolver.
        let n4 = c.node("4").unwrap().fabric_ip.unwrap();
        assert!(n4.is_loopback(), "{n4}");
        // A [[node]] of a host's name replaces the template whole.
        let n2 = c.node("2").unwrap();
        assert_eq!((n2.agent.as_str(), n2.fabric_ip), ("10.0.0.22:7470", None));
        // A listed node outside the job is still there by name, but not
        // in what "every node" means inside the job.
        assert!(c.node("login").is_some());
        assert_eq!(
            c.select(&["login".into()]).unwrap()[0].name.as_str(),
            "login"
        );
        assert_eq!(c.job.as_ref().unwrap().hosts.len(), 4);
    }

    #[test]
    fn outside_a_job_a_slurm_file_is_its_listed_nodes() {
        let c = Cluster::parse(SLURM, "cluster.toml").unwrap();
        let names: Vec<String> = c
            .select(&[])
            .unwrap()
            .iter()
            .map(|n| n.name.to_string())
            .collect();
        assert_eq!(names, ["gpu02", "login"]);
        assert!(c.job.is_none());
        // With no [[node]] there is nothing to select, and it says why.
        let only = "key = \"k\"\n[defaults]\nroot = \"/r\"\n[slurm]\nagent = \"{host}\"\n";
        let e = refused(only);
        assert!(
            e.contains("outside one (SLURM_JOB_NODELIST is not set)"),
            "{e}"
        );
        assert!(e.starts_with("cluster.toml:4:"), "{e}");
        // ...and inside a job it is the job's hosts.
        let c = in_job(only, "a,b").unwrap();
        assert_eq!(c.select(&[]).unwrap().len(), 2);
        assert_eq!(c.node("b").unwrap().agent, "b:7470");
        // A file without [slurm] ignores the job it runs in.
        let c = in_job(VALID, "x[1-9]").unwrap();
        assert!(c.job.is_none());
        assert_eq!(
            c.nodes,
            Cluster::parse(VALID, "cluster.toml").unwrap().nodes
        );
    }

    #[test]
    fn a_bad_slurm_table_is_refused_at_its_line_with_the_fix() {
        let base = "key = \"k\"\n[defaults]\nroot = \"/r\"\n[slurm]\n";
        for (body, want) in [
            (
                "fabric_if = \"ib0\"\n",
                "[slurm] has no agent; add agent = \"{host}:7470\"",
            ),
            ("agent = \"http://{host}\"\n", "is not HOST[:PORT]"),
            (
                "agent = \"{host}\"\nname = \"x\"\n",
                "[slurm] takes no name",
            ),
            (
                "agent = \"{host}\"\nfabric_ip = \"{host} ib\"\n",
                "neither an address nor a host name",
            ),
            (
                "agent = \"{host}\"\nfabric_ip = \"10.0.0.{host}/24\"\n",
                "/24",
            ),
            ("agent = \"{host}\"\nfabrc_if = \"ib0\"\n", "fabric_if"),
            (
                "agent = \"{host}\"\n[slurm.host.a]\nhost = \"x\"\n",
                "[slurm.host.a]",
            ),
            (
                "agent = \"{host}\"\n[slurm.host]\na = 1\n",
                "[slurm.host.NAME]",
            ),
        ] {
            let e = match in_job(&format!("{base}{body}"), "a,b") {
                Ok(c) => panic!("{body:?} accepted: {c:?}"),
                Err(e) => e.to_string(),
            };
            assert!(e.contains(want), "{body:?}: {e}");
            assert!(e.starts_with("cluster.toml:"), "{body:?}: {e}");
        }
        // Two hosts whose template gives both one agent: named as such.
        let e = in_job(&format!("{base}agent = \"10.0.0.1\"\n"), "a,b").unwrap_err();
        assert!(e.to_string().contains("duplicate agent address"), "{e}");
        // A fabric name that does not resolve names the host and the fix.
        let e = in_job(
            &format!("{base}agent = \"{{host}}\"\nfabric_if = \"ib0\"\nfabric_ip = \"{{host}}.invalid\"\n"),
            "a",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("\"a.invalid\" (host \"a\") cannot be resolved"),
            "{e}"
        );
        assert!(e.contains("[slurm.host.a] fabric_ip"), "{e}");
    }

    #[test]
    fn cluster_slurm_outside_a_job_says_to_run_inside_one() {
        // The test process runs outside Slurm: `slurm` is refused at once.
        if std::env::var_os("SLURM_JOB_NODELIST").is_some() {
            return;
        }
        let e = Cluster::load("slurm").unwrap_err().to_string();
        assert!(e.contains("SLURM_JOB_NODELIST is not set"), "{e}");
        assert!(e.contains("--cluster FILE"), "{e}");
    }
}
