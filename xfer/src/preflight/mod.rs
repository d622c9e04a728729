//! Preflight: the facts one node reports about itself before a launch.
//!
//! The launcher sends a [`PreflightRequest`] to every node's agent at once;
//! each agent answers with [`NodeFacts`]: what it found, never a verdict.
//! Judging the facts (is this enough memory, do the nodes agree) is the
//! launcher's job, where all nodes' answers meet. Every probe that could
//! not run says why ([`Probe::Skipped`]) instead of passing silently.
//!
//! The probes themselves are small Linux readers, one module each:
//! [`weights`] (the model at its path, from the agent's store), [`host`]
//! (disk, memory, GPUs), [`net`] (interfaces, default route, ports),
//! [`reach`] (TCP between the nodes over the fabric), [`versions`]
//! (running the engine to ask its version) and [`rdma`] (sysfs).
//!
//! These types travel in postcard frames, which cannot carry serde's
//! tagged or flattened forms, so they use none.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

// (probes: host, net, rdma, reach, versions, weights — being merged)

/// What the launcher asks one node to look at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightRequest {
    /// The node's name in the cluster file (for messages).
    pub node: String,
    /// The interface and address the ranks will be pinned to.
    pub fabric_if: String,
    pub fabric_ip: IpAddr,
    /// The model every rank loads, as the plan has it: an absolute path,
    /// possibly with the `<COMMIT>` placeholder in place of a snapshot's
    /// commit, resolved from `refs/<revision>` of the repo's cache folder.
    pub model_path: String,
    pub revision: Option<String>,
    /// Ports the engine will bind on this node; each must be free.
    pub ports: Vec<PortNeed>,
    /// The reachability probe: listen on `fabric_ip:listen_port` while
    /// connecting to every peer, for `window_ms` at most.
    pub listen_port: Option<u16>,
    pub peers: Vec<ReachTarget>,
    pub window_ms: u64,
    /// Commands whose output is a version to compare across nodes.
    pub versions: Vec<VersionProbe>,
    /// The configured RDMA device, if any.
    pub rdma: Option<RdmaNeed>,
}

/// A port the engine needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortNeed {
    /// What binds it: "master", "api", "ray", "dist".
    pub what: String,
    pub port: u16,
}

/// A peer to connect to over the fabric.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReachTarget {
    pub node: String,
    pub addr: SocketAddr,
}

/// A version to ask for: run `argv`, take the first line of output that
/// matches nothing of the noise (see [`versions`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionProbe {
    /// "vllm", "sglang", "torch", ...
    pub what: String,
    pub argv: Vec<String>,
}

/// The RDMA device the cluster file names for this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaNeed {
    pub device: String,
    pub gid_index: Option<u32>,
}

/// The outcome of one probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe<T> {
    Ok(T),
    /// The probe could not run here: why (e.g. "nvidia-smi not found").
    Skipped(String),
    /// The probe ran and something is wrong: what.
    Failed(String),
}

/// Everything one node reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeFacts {
    pub hostname: String,
    /// The xfer version of the agent.
    pub agent_version: String,
    pub weights: WeightFacts,
    /// Free space on the filesystem of the agent's root.
    pub disk: Probe<DiskFacts>,
    pub memory: Probe<MemFacts>,
    pub gpus: Probe<GpuFacts>,
    /// The named fabric interface.
    pub fabric: Probe<IfaceFacts>,
    /// Every interface with an address (to say where an address really is).
    pub interfaces: Vec<IfaceFacts>,
    /// The IPv4 default route, if any.
    pub default_route: Probe<RouteFacts>,
    pub ports: Vec<PortFacts>,
    /// Whether the reachability listener could bind.
    pub listen: Probe<SocketAddr>,
    pub reach: Vec<ReachFacts>,
    pub versions: Vec<VersionFacts>,
    pub rdma: Probe<RdmaFacts>,
}

/// The model at the plan's path on this node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WeightFacts {
    /// The path with `<COMMIT>` resolved (as given when nothing to resolve).
    pub path: String,
    /// The commit `<COMMIT>` resolved to, when it was there.
    pub commit: Option<String>,
    /// The agent's store root.
    pub store_root: String,
    /// The store model holding the path (its top folder under the root).
    pub model: Option<String>,
    /// "complete", "syncing", ... as `xfer status` says; None if not held.
    pub state: Option<String>,
    /// The model's manifest root hash, when complete.
    pub root: Option<String>,
    pub bytes_total: u64,
    /// Bytes of the manifest's files under `path` present with their size.
    pub bytes_present: u64,
    /// What is wrong, one line each, most useful first: "refs/main not
    /// found", "model-00003-of-00004.safetensors: missing", ...
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskFacts {
    pub path: String,
    pub free_bytes: u64,
    pub total_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemFacts {
    pub mem_total: u64,
    pub mem_available: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFacts {
    /// "NVIDIA GB10", ...
    pub gpus: Vec<GpuInfo>,
    /// Compute processes already on the GPUs.
    pub processes: Vec<GpuProcess>,
    pub driver: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub memory_total_mib: Option<u64>,
    pub memory_used_mib: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub name: String,
    pub used_mib: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfaceFacts {
    pub name: String,
    /// `/sys/class/net/IF/operstate`: "up", "down", "unknown", ...
    pub operstate: String,
    /// `/sys/class/net/IF/carrier` (None when unreadable, e.g. link down).
    pub carrier: Option<bool>,
    pub mtu: u32,
    /// Addresses with their prefix length.
    pub addrs: Vec<(IpAddr, u8)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteFacts {
    pub iface: String,
    pub gateway: Option<IpAddr>,
    /// The address this node would use for that route (the interface's
    /// first IPv4 address): what Ray, NCCL and SGLang pick by themselves.
    pub src: Option<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortFacts {
    pub what: String,
    pub port: u16,
    /// Ok(()) when free; Failed("in use by python3 (pid 4242)") when not.
    pub free: Probe<()>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReachFacts {
    pub node: String,
    pub addr: SocketAddr,
    /// Connect time in microseconds, or why it failed.
    pub result: Probe<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionFacts {
    pub what: String,
    /// The version line, or why there is none ("vllm: not found on PATH").
    pub version: Probe<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaFacts {
    pub device: String,
    pub ports: Vec<RdmaPort>,
    /// The GID at the configured index, when one is configured.
    pub gid: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaPort {
    pub port: u32,
    /// "4: ACTIVE" as sysfs has it.
    pub state: String,
    /// "InfiniBand" or "Ethernet" (RoCE).
    pub link_layer: String,
    pub active_mtu: Option<u32>,
}
