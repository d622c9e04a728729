//! The launch service: the launcher's requests ([`LaunchRequest`]) and
//! their replies ([`LaunchReply`]), with the vocabulary they carry: what
//! the launcher asks a node to look at before a launch ([`PreflightRequest`]) and what the node found
//! ([`NodeFacts`], every probe a [`Probe`] that says why it was skipped),
//! the rank an agent starts ([`RankSpec`]) and how it is doing
//! ([`RankReport`], [`LogChunk`]).
//!
//! These types travel in postcard frames, which cannot carry serde's
//! tagged or flattened forms, so they use none.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::admin::ModelState;
use crate::hash::Hash;
use crate::image::Digest;
use crate::names::NodeName;
pub use crate::refusal::Refusal;

/// Launcher → agent (and agent → agent, to stop a group), after a
/// [`crate::hello::Hello`] for [`crate::hello::Service::Launch`]. Each is
/// answered by one [`LaunchReply`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LaunchRequest {
    /// Look at this node before a launch.
    Preflight(Box<PreflightRequest>),
    /// Listen on `listen` and connect to every peer for `window_ms` (run
    /// on every node at once, after the port checks).
    Reach {
        /// Where to listen (None: only connect).
        listen: Option<SocketAddr>,
        /// The peers to connect to.
        peers: Vec<ReachTarget>,
        /// How long to keep trying, in milliseconds.
        window_ms: u64,
    },
    /// Start your rank of a launch.
    StartRank(Box<RankSpec>),
    /// How the ranks of `run` are doing (None: every rank this agent knows).
    RunQuery {
        /// The run asked about; None: every rank this agent knows.
        run: Option<String>,
    },
    /// Stop a run's rank (`run` None: every live one), SIGKILL after
    /// `grace_ms`; answered with `Runs` once stopped.
    StopRun {
        /// The run to stop; None: every live run.
        run: Option<String>,
        /// How long SIGTERM has before SIGKILL, in milliseconds.
        grace_ms: u64,
        /// Why, for the log and the report.
        reason: String,
    },
    /// Part of a rank's log.
    ReadLog {
        /// The run.
        run: String,
        /// Where to start, in bytes.
        offset: u64,
        /// The most bytes to return.
        max: u64,
    },
    /// Meet the other nodes with the engine's own collective library (a
    /// Gloo all-reduce in the engine's Python), run on every node at once.
    Rendezvous(Box<RendezvousRequest>),
    /// What this node's held rank of `run` reported of the rendezvous it
    /// met itself: the rank was started with a [`RendezvousRequest`] in
    /// [`RankSpec::rendezvous`], and once released its loader plugin runs
    /// the all-reduce in the engine's own vLLM worker (torch already
    /// imported), before the engine's own distributed init. The agent
    /// starts nothing: it reads the rank's report, waiting up to
    /// `timeout_ms`. Answered with `Rendezvoused`.
    HeldRendezvous {
        /// The run whose held rank met it.
        run: String,
        /// How long to wait for the rank's report, in milliseconds.
        timeout_ms: u64,
    },
    /// Let this node's held rank of `run` ([`RankSpec::held`]) go on: the
    /// preflight passed. Answered with `Runs` (the rank's report).
    Release {
        /// The run whose rank is released.
        run: String,
    },
}

/// Agent → launcher: the answer to a [`LaunchRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LaunchReply {
    /// Refused or failed. First, at tag 0, in every service's replies:
    /// see [`crate::refusal::FailedReply`].
    Failed(Refusal),
    /// This node's facts for the preflight.
    PreflightReport(Box<NodeFacts>),
    /// Whether it could listen, and each peer's result.
    Reached {
        /// Whether it could listen on the address asked.
        listen: Probe<SocketAddr>,
        /// Each peer's connect result.
        reach: Vec<ReachFacts>,
    },
    /// Ranks, newest first.
    Runs(Vec<RankReport>),
    /// The part of the log asked for.
    Log(Box<LogChunk>),
    /// The rendezvous: the all-reduce's time in milliseconds, or why it
    /// failed.
    Rendezvoused(Probe<u64>),
}

impl LaunchReply {
    /// The reply's name, for errors.
    pub fn kind(&self) -> &'static str {
        match self {
            LaunchReply::PreflightReport(_) => "PreflightReport",
            LaunchReply::Reached { .. } => "Reached",
            LaunchReply::Runs(_) => "Runs",
            LaunchReply::Log(_) => "Log",
            LaunchReply::Rendezvoused(_) => "Rendezvoused",
            LaunchReply::Failed(_) => "Failed",
        }
    }
}

/// What the launcher asks one node to look at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightRequest {
    /// The node's name in the cluster file (for messages).
    pub node: NodeName,
    /// The interface and address the ranks will be pinned to.
    pub fabric_if: String,
    /// The fabric address the ranks will use.
    pub fabric_ip: IpAddr,
    /// The model every rank loads, as the plan has it: an absolute path,
    /// possibly with the `<COMMIT>` placeholder in place of a snapshot's
    /// commit, resolved from `refs/<revision>` of the repo's cache folder.
    pub model_path: String,
    /// The revision `<COMMIT>` resolves from (`refs/<revision>`).
    pub revision: Option<String>,
    /// Ports the engine will bind on this node; each must be free.
    pub ports: Vec<PortNeed>,
    /// The reachability probe: listen on `fabric_ip:listen_port` while
    /// connecting to every peer, for `window_ms` at most. The launcher
    /// leaves these empty and sends a separate `LaunchRequest::Reach` to every
    /// node once every node's ports were checked, so that no port check
    /// ever sees another node's probe listener (nodes may share a host).
    pub listen_port: Option<u16>,
    /// The peers the reachability probe connects to (empty here; see above).
    pub peers: Vec<ReachTarget>,
    /// How long the reachability probe tries, in milliseconds.
    pub window_ms: u64,
    /// Commands whose output is a version to compare across nodes.
    pub versions: Vec<VersionProbe>,
    /// The configured RDMA device, if any.
    pub rdma: Option<RdmaNeed>,
    /// The image the ranks run in (`[launch] image`): look up its id in
    /// this node's container engine.
    pub image: Option<String>,
    /// Every fabric address of the launch (this node's and its peers'):
    /// time the reverse lookup of each, and a forward lookup of this
    /// node's host name, as torch.distributed, Gloo and NCCL make them
    /// ([`ResolverFacts`]). Empty: no resolver probe.
    pub resolve: Vec<IpAddr>,
    /// The ranks will ask this agent about the model as it lands
    /// (`[launch] stream_weights`): ask the loader link's socket as a rank
    /// would ([`NodeFacts::loader_link`]).
    pub loader_link: bool,
}

/// A port the engine needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortNeed {
    /// What binds it: "master", "api", "ray", "dist".
    pub what: String,
    /// The port.
    pub port: u16,
}

/// A peer to connect to over the fabric.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReachTarget {
    /// The peer's node name.
    pub node: NodeName,
    /// Its fabric address and the probe's port.
    pub addr: SocketAddr,
}

/// A version to ask for: run `argv`, take the last non-empty line of its
/// stdout (warnings come first; see [`versions`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionProbe {
    /// "vllm", "sglang", "torch", ...: with `python_of`, the Python module.
    pub what: String,
    /// The command to run.
    pub argv: Vec<String>,
    /// Ask the Python that runs this program (a script on PATH, by its
    /// `#!` line) for the version of the module `what`, with the agent's
    /// own snippet, which reads the module's version file and imports
    /// nothing heavy. A program that is no Python script falls back to
    /// `argv`. (`vllm --version` imports all of vLLM: ten seconds.)
    pub python_of: Option<String>,
}

/// The rendezvous probe of one node: what a rank of the engine does at
/// init, reduced to one Gloo all-reduce of `world` ranks through a
/// TCP store on `master`, over `fabric_if` (`GLOO_SOCKET_IFNAME`), in the
/// Python that runs `python_of` (the engine's launcher script).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RendezvousRequest {
    /// This node's name, for messages.
    pub node: NodeName,
    /// The engine's launcher program; the probe runs in the Python that runs it.
    pub python_of: String,
    /// This node's rank in the all-reduce.
    pub rank: u32,
    /// How many ranks take part.
    pub world: u32,
    /// The TCP store's address, on the head's fabric.
    pub master: SocketAddr,
    /// The fabric interface (`GLOO_SOCKET_IFNAME`).
    pub fabric_if: String,
    /// How long the probe may take, in milliseconds.
    pub timeout_ms: u64,
}

/// The RDMA device the cluster file names for this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaNeed {
    /// The RDMA device's name (`mlx5_0`).
    pub device: String,
    /// The GID index to check, if configured.
    pub gid_index: Option<u32>,
}

/// The outcome of one probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe<T> {
    /// It ran and found this.
    Ok(T),
    /// The probe could not run here: why (e.g. "nvidia-smi not found").
    Skipped(String),
    /// The probe ran and something is wrong: what.
    Failed(String),
}

/// Everything one node reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeFacts {
    /// The node's host name.
    pub hostname: String,
    /// The xfer version of the agent.
    pub agent_version: String,
    /// The model at the plan's path.
    pub weights: WeightFacts,
    /// Free space on the filesystem of the agent's root.
    pub disk: Probe<DiskFacts>,
    /// Total and available memory.
    pub memory: Probe<MemFacts>,
    /// The GPUs and what runs on them.
    pub gpus: Probe<GpuFacts>,
    /// The named fabric interface.
    pub fabric: Probe<IfaceFacts>,
    /// Every interface with an address (to say where an address really is).
    pub interfaces: Vec<IfaceFacts>,
    /// The IPv4 default route, if any.
    pub default_route: Probe<RouteFacts>,
    /// Each port the engine needs, and whether it is free.
    pub ports: Vec<PortFacts>,
    /// Whether the reachability listener could bind.
    pub listen: Probe<SocketAddr>,
    /// Each peer's connect result.
    pub reach: Vec<ReachFacts>,
    /// Each version asked for.
    pub versions: Vec<VersionFacts>,
    /// The configured RDMA device.
    pub rdma: Probe<RdmaFacts>,
    /// The model's bytes in the page cache.
    pub page_cache: Probe<PageCacheFacts>,
    /// Whether the GPUs share the host's memory (GB10, GH200, GB200): then
    /// the page cache competes with GPU allocations. None: no GPU seen.
    pub unified_memory: Option<bool>,
    /// The rendezvous probe (filled in by the launcher's second round).
    pub rendezvous: Probe<u64>,
    /// How long this node's resolver takes for the lookups the engine's
    /// collective libraries make.
    pub resolver: Probe<ResolverFacts>,
    /// The container engine (`xfer serve --container-engine`).
    pub containers: Probe<ContainerFacts>,
    /// Whether a rank reaches this agent's loader link
    /// ([`crate::local`]): what its socket answered for the model.
    pub loader_link: Probe<String>,
}

/// How long this node's resolver took for the lookups torch.distributed
/// makes: c10d formats every socket's address with `getnameinfo` (a
/// reverse lookup of each peer's fabric address), and Gloo without a
/// matching interface looks up the host name. Each lookup is waited for
/// `cap_ms` at most: a resolver that does not answer would otherwise hold
/// the preflight for its whole timeout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolverFacts {
    /// The longest any one lookup was waited for, in milliseconds.
    pub cap_ms: u64,
    /// The forward lookup of this node's host name.
    pub forward: Lookup,
    /// The reverse lookup of each fabric address asked, in the request's order.
    pub reverse: Vec<Lookup>,
}

/// One name lookup and how long it took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lookup {
    /// What was looked up: a host name (forward) or an address (reverse).
    pub query: String,
    /// How long it took, in milliseconds (the cap when it had not answered).
    pub ms: u64,
    /// What it answered.
    pub answer: LookupAnswer,
}

/// What a lookup answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LookupAnswer {
    /// A name (reverse; the address itself when it has none) or the first
    /// address (forward).
    Found(String),
    /// The resolver's error (`Temporary failure in name resolution`).
    Error(String),
    /// No answer within the cap: the lookup was still waiting.
    Pending,
}

/// This node's container engine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerFacts {
    /// Docker or Podman.
    pub engine: crate::image::ContainerRuntime,
    /// The engine's server version.
    pub version: String,
    /// Whether the NVIDIA container runtime is configured: its name
    /// (`nvidia`), or why not / why it cannot be known.
    pub nvidia_runtime: Probe<String>,
    /// The id of the launch's image in this engine; `None`: none asked.
    pub image: Option<Probe<Digest>>,
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
    /// The model's state as `xfer status` says it; None if not held.
    pub state: Option<ModelState>,
    /// The model's manifest root hash, when complete.
    pub root: Option<Hash>,
    /// The bytes of every file of the manifest under `path`.
    pub bytes_total: u64,
    /// Bytes of the manifest's files under `path` present with their size.
    pub bytes_present: u64,
    /// What is wrong, one line each, most useful first: "refs/main not
    /// found", "model-00003-of-00004.safetensors: missing", ...
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// Free space on a filesystem.
pub struct DiskFacts {
    /// The folder it was asked for.
    pub path: String,
    /// Bytes free to the agent's user.
    pub free_bytes: u64,
    /// The filesystem's size in bytes.
    pub total_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// The host's memory (`/proc/meminfo`), in bytes.
pub struct MemFacts {
    /// `MemTotal`.
    pub mem_total: u64,
    /// `MemAvailable`.
    pub mem_available: u64,
}

/// How much of the model sits in this node's page cache (`mincore` over
/// its files): on unified-memory machines that memory is the GPU's too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageCacheFacts {
    /// Bytes of the model's files in the page cache.
    pub resident_bytes: u64,
    /// Bytes of the model's files.
    pub total_bytes: u64,
    /// How many files were looked at.
    pub files: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// The GPUs of this node (`nvidia-smi`).
pub struct GpuFacts {
    /// "NVIDIA GB10", ...
    pub gpus: Vec<GpuInfo>,
    /// Compute processes already on the GPUs.
    pub processes: Vec<GpuProcess>,
    /// The driver version.
    pub driver: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// One GPU.
pub struct GpuInfo {
    /// Its index (`nvidia-smi`'s).
    pub index: u32,
    /// Its name ("NVIDIA GB10").
    pub name: String,
    /// Its memory, in MiB, when it reports it.
    pub memory_total_mib: Option<u64>,
    /// Memory in use, in MiB, when it reports it.
    pub memory_used_mib: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// A compute process on a GPU.
pub struct GpuProcess {
    /// Its pid.
    pub pid: u32,
    /// Its program's name.
    pub name: String,
    /// The GPU memory it holds, in MiB, when known.
    pub used_mib: Option<u64>,
}

/// A network interface's `operstate` (RFC 2863), parsed; on the wire as
/// the kernel's own word ("up", "down", ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OperState {
    /// "up": it can pass packets.
    Up,
    /// "down".
    Down,
    /// "unknown": the driver does not say (loopback, many virtual
    /// interfaces), or it could not be read.
    Unknown,
    /// "dormant".
    Dormant,
    /// "lowerlayerdown".
    LowerLayerDown,
    /// "notpresent".
    NotPresent,
    /// "testing".
    Testing,
    /// Any other word, as written.
    Other(String),
}

impl OperState {
    /// Parses the kernel's word (surrounding whitespace ignored).
    pub fn parse(text: &str) -> OperState {
        match text.trim() {
            "up" => OperState::Up,
            "down" => OperState::Down,
            "unknown" => OperState::Unknown,
            "dormant" => OperState::Dormant,
            "lowerlayerdown" => OperState::LowerLayerDown,
            "notpresent" => OperState::NotPresent,
            "testing" => OperState::Testing,
            other => OperState::Other(other.to_string()),
        }
    }

    /// The kernel's word for it.
    pub fn as_str(&self) -> &str {
        match self {
            OperState::Up => "up",
            OperState::Down => "down",
            OperState::Unknown => "unknown",
            OperState::Dormant => "dormant",
            OperState::LowerLayerDown => "lowerlayerdown",
            OperState::NotPresent => "notpresent",
            OperState::Testing => "testing",
            OperState::Other(word) => word,
        }
    }
}

impl std::fmt::Display for OperState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses the word, as [`OperState::parse`].
impl From<&str> for OperState {
    fn from(text: &str) -> OperState {
        OperState::parse(text)
    }
}

/// Compares with the kernel's word.
impl PartialEq<&str> for OperState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for OperState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for OperState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(OperState::parse(&String::deserialize(d)?))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// A network interface of this node.
pub struct IfaceFacts {
    /// Its name (`eth0`).
    pub name: String,
    /// `/sys/class/net/IF/operstate`: up, down, unknown, ...
    pub operstate: OperState,
    /// `/sys/class/net/IF/carrier` (None when unreadable, e.g. link down).
    pub carrier: Option<bool>,
    /// Its MTU (0 when unknown).
    pub mtu: u32,
    /// Addresses with their prefix length.
    pub addrs: Vec<(IpAddr, u8)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// A default route.
pub struct RouteFacts {
    /// The interface it goes out of.
    pub iface: String,
    /// Its gateway, if any.
    pub gateway: Option<IpAddr>,
    /// The address this node would use for that route (the interface's
    /// first IPv4 address): what Ray, NCCL and SGLang pick by themselves.
    pub src: Option<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// A port the engine needs on this node, checked.
pub struct PortFacts {
    /// What binds it: "master", "api", "ray", "dist".
    pub what: String,
    /// The port.
    pub port: u16,
    /// Ok(()) when free; Failed("in use by python3 (pid 4242)") when not.
    pub free: Probe<()>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// One peer's reachability result.
pub struct ReachFacts {
    /// The peer's node name.
    pub node: NodeName,
    /// The address connected to.
    pub addr: SocketAddr,
    /// Connect time in microseconds, or why it failed.
    pub result: Probe<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// A version, as one node reports it.
pub struct VersionFacts {
    /// What was asked: "vllm", "torch", ...
    pub what: String,
    /// The version line, or why there is none ("vllm: not found on PATH").
    pub version: Probe<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// The configured RDMA device, as sysfs shows it.
pub struct RdmaFacts {
    /// Its name.
    pub device: String,
    /// Its ports.
    pub ports: Vec<RdmaPort>,
    /// The GID at the configured index, when one is configured.
    pub gid: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// One RDMA port.
pub struct RdmaPort {
    /// Its number.
    pub port: u32,
    /// Its state (ACTIVE: it can carry data).
    pub state: crate::rdma::PortState,
    /// InfiniBand or Ethernet (RoCE); `None` when sysfs could not say.
    pub link_layer: Option<crate::rdma::LinkLayer>,
    /// The active MTU, when known (sysfs does not show it).
    pub active_mtu: Option<u32>,
}

/// What one node runs for a launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSpec {
    /// The launch this rank belongs to: 1-64 of `[a-z0-9-]`.
    pub run: String,
    /// The node that runs this rank.
    pub node: NodeName,
    /// The rank's number (0: the head).
    pub rank: u32,
    /// Added to the agent's own environment.
    pub env: BTreeMap<String, String>,
    /// Started in order; every one is expected to run until stopped.
    pub procs: Vec<ProcSpec>,
    /// Run after the processes are stopped (e.g. `ray stop --force`).
    pub on_stop: Vec<Vec<String>>,
    /// The other ranks' agents, told to stop their rank when this one fails.
    pub group: Vec<GroupPeer>,
    /// How long a process may wait for its `wait_tcp` address.
    pub wait_timeout_ms: u64,
    /// SIGTERM to SIGKILL, when the rank stops because one of its processes
    /// failed.
    pub grace_ms: u64,
    /// The weights the launcher's gate found on every node: the agent
    /// checks again, right before it starts anything, that it holds them
    /// complete and verified with this root.
    pub weights: Option<WeightGate>,
    /// Drop the model's pages from the page cache before starting
    /// (`posix_fadvise(DONTNEED)` on the gate's files; never a global drop).
    pub evict_page_cache: bool,
    /// Run every process inside this image (`[launch] image`).
    pub container: Option<ContainerSpec>,
    /// The compile caches (`[launch] caches`) to materialise from their
    /// verified snapshot before anything starts.
    pub caches: Option<crate::compile_cache::CacheGate>,
    /// Started *held*: the agent gives every process `XFER_HOLD_FILE`, a
    /// file in the rank's own folder that does not exist yet, and creates
    /// it on [`LaunchRequest::Release`]. vLLM's loader plugin waits for it
    /// in `register()`, which vLLM runs while it parses its arguments:
    /// the engine has imported its Python and torch, and has not read the
    /// model, bound a port, touched a GPU or met a peer. `up` starts ranks
    /// held under `stream_weights` while its preflight still runs, and
    /// releases them only once it passed (else it stops them).
    #[serde(default)]
    pub held: bool,
    /// For a held rank: the preflight's rendezvous, met by the rank itself
    /// (read back with [`LaunchRequest::HeldRendezvous`]). The agent gives its processes
    /// `XFER_RENDEZVOUS` (`MASTER RANK WORLD TIMEOUT_S`) and
    /// `XFER_RENDEZVOUS_FILE` (in the rank's own folder), where the loader
    /// plugin writes the outcome.
    #[serde(default)]
    pub rendezvous: Option<RendezvousRequest>,
}

/// How a rank's processes run in a container, in the form NVIDIA's
/// guides use: host network and IPC, the GPUs passed through, the model's
/// folder mounted read-only at the same path, the rank's environment
/// passed explicitly. The agent builds the command line itself
/// (`agent::containers`): a launcher names no flag, mount or program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// The image reference to run.
    pub image: String,
    /// The id the launcher's gate found on every node, checked again
    /// right before the rank starts.
    pub image_id: Option<Digest>,
    /// How the GPUs reach the container.
    pub gpus: GpuAccess,
    /// `--shm-size`, in bytes.
    pub shm_bytes: Option<u64>,
}

/// How the GPUs reach a container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuAccess {
    /// No GPU (CPU engines, tests).
    None,
    /// `--gpus all` (Docker with the NVIDIA runtime).
    All,
    /// `--device` each (CDI names such as `nvidia.com/gpu=all`, or
    /// `/dev/...` paths).
    Devices(Vec<String>),
}

/// The weights a rank must run on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightGate {
    /// The model path, `<COMMIT>` resolved.
    pub path: String,
    /// The manifest root every node holds.
    pub root: Hash,
}

/// Another rank's agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPeer {
    /// The peer's node name.
    pub node: NodeName,
    /// Where it may be reached (`HOST:PORT`), all tried at once: its
    /// address in the cluster file, which may be a management network the
    /// nodes cannot use between each other, and its fabric address.
    pub addrs: Vec<String>,
}

/// One long-running process of a rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcSpec {
    /// The command, its program by absolute path once admitted.
    pub argv: Vec<String>,
    /// Start only once this address accepts a TCP connection.
    pub wait_tcp: Option<SocketAddr>,
}

/// Where one process is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcState {
    /// Not started yet: waiting for its `wait_tcp` address.
    Waiting {
        /// The address it waits for.
        on: SocketAddr,
    },
    /// Started and, as far as the agent knows, running.
    Running {
        /// Its pid (the leader of its own process group).
        pid: u32,
    },
    /// Exited with a code, or killed by a signal.
    Exited {
        /// Its pid.
        pid: u32,
        /// Its exit code, if it exited.
        code: Option<i32>,
        /// The signal that killed it, if one did.
        signal: Option<i32>,
    },
    /// Never started: why.
    NotStarted {
        /// Why.
        why: String,
    },
}

/// One process in a report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcReport {
    /// The command.
    pub argv: Vec<String>,
    /// Where it is.
    pub state: ProcState,
}

/// Where a rank is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunState {
    /// Its processes run.
    Running,
    /// Stopping its processes.
    Stopping(String),
    /// Stopped on request: whose.
    Stopped(String),
    /// A process exited on its own, or could not start: which and how.
    Failed(String),
}

impl RunState {
    /// Whether it runs or is stopping (not yet ended).
    pub fn is_live(&self) -> bool {
        matches!(self, RunState::Running | RunState::Stopping(_))
    }
}

/// What an agent says about one rank it runs (or ran).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankReport {
    /// The launch it belongs to.
    pub run: String,
    /// The node it runs on.
    pub node: NodeName,
    /// Its rank.
    pub rank: u32,
    /// Seconds since the Unix epoch.
    pub started_unix: u64,
    /// Where it is.
    pub state: RunState,
    /// When the rank failed (Unix milliseconds): the moment its first
    /// process exited on its own. Across a group the earliest is the cause.
    pub failed_ms: Option<u64>,
    /// Each process.
    pub procs: Vec<ProcReport>,
    /// The log file on the node, and its size.
    pub log: String,
    /// The log's size in bytes.
    pub log_bytes: u64,
    /// The last lines of the log.
    pub tail: Vec<String>,
}

/// A piece of a rank's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    /// The run.
    pub run: String,
    /// The node.
    pub node: NodeName,
    /// Where in the log this piece starts.
    pub offset: u64,
    /// The bytes.
    pub data: Vec<u8>,
    /// The log's size when read.
    pub size: u64,
    /// Whether the rank is still running (more may come).
    pub live: bool,
}

/// A run id that is no safe folder name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("run id `{}` must be 1-64 of a-z, 0-9 and '-', not starting with '-'", .0.escape_default())]
pub struct BadRunId(pub String);

/// Checks a run id: 1-64 of `[a-z0-9-]`, so it is a safe folder name.
pub fn check_run_id(id: &str) -> Result<(), BadRunId> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(BadRunId(id.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_frame, encode};

    /// A node name is on the wire as the plain string it was; a name that
    /// is no valid [`NodeName`] is refused when read.
    #[test]
    fn node_names_travel_as_plain_strings() {
        let t = ReachTarget {
            node: NodeName::new("spark-a").unwrap(),
            addr: "10.0.0.1:1".parse().unwrap(),
        };
        #[derive(Serialize)]
        struct Plain<'a> {
            node: &'a str,
            addr: SocketAddr,
        }
        let plain = Plain {
            node: "spark-a",
            addr: t.addr,
        };
        assert_eq!(
            postcard::to_stdvec(&t).unwrap(),
            postcard::to_stdvec(&plain).unwrap()
        );
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            serde_json::to_string(&plain).unwrap()
        );
        let bad = serde_json::to_string(&Plain {
            node: "a b",
            addr: t.addr,
        })
        .unwrap();
        assert!(serde_json::from_str::<ReachTarget>(&bad).is_err());
    }

    #[test]
    fn launch_messages_round_trip() {
        let facts = NodeFacts {
            hostname: "n1".into(),
            agent_version: "0.1.0".into(),
            weights: WeightFacts {
                problems: vec!["x: missing".into()],
                ..WeightFacts::default()
            },
            disk: Probe::Ok(DiskFacts {
                path: "/r".into(),
                free_bytes: 1,
                total_bytes: 2,
            }),
            memory: Probe::Skipped("why".into()),
            gpus: Probe::Failed("nvidia-smi exited with 9".into()),
            fabric: Probe::Ok(IfaceFacts {
                name: "fab0".into(),
                operstate: "up".into(),
                carrier: Some(true),
                mtu: 9000,
                addrs: vec![("10.0.0.1".parse().unwrap(), 24)],
            }),
            interfaces: vec![],
            default_route: Probe::Skipped("no IPv4 default route".into()),
            ports: vec![PortFacts {
                what: "api".into(),
                port: 8000,
                free: Probe::Ok(()),
            }],
            listen: Probe::Ok("10.0.0.1:29500".parse().unwrap()),
            reach: vec![ReachFacts {
                node: NodeName::new("n2").unwrap(),
                addr: "10.0.0.2:29500".parse().unwrap(),
                result: Probe::Ok(120),
            }],
            versions: vec![VersionFacts {
                what: "vllm".into(),
                version: Probe::Ok("0.11.0".into()),
            }],
            rdma: Probe::Skipped("none".into()),
            page_cache: Probe::Skipped("none".into()),
            unified_memory: None,
            rendezvous: Probe::Ok(42),
            resolver: Probe::Ok(ResolverFacts {
                cap_ms: 1_500,
                forward: Lookup {
                    query: "n1".into(),
                    ms: 1_500,
                    answer: LookupAnswer::Pending,
                },
                reverse: vec![
                    Lookup {
                        query: "10.0.0.2".into(),
                        ms: 3,
                        answer: LookupAnswer::Found("n2-fabric".into()),
                    },
                    Lookup {
                        query: "10.0.0.1".into(),
                        ms: 1_020,
                        answer: LookupAnswer::Error("Temporary failure in name resolution".into()),
                    },
                ],
            }),
            containers: Probe::Ok(ContainerFacts {
                engine: crate::image::ContainerRuntime::Docker,
                version: "20.10.24".into(),
                nvidia_runtime: Probe::Skipped("no nvidia runtime".into()),
                image: Some(Probe::Ok(Digest([7; 32]))),
            }),
            loader_link: Probe::Ok("/r/.xfer/agent.sock answers (m: syncing)".into()),
        };
        let spec = RankSpec {
            run: "r1".into(),
            node: NodeName::new("n1").unwrap(),
            rank: 0,
            env: [("A".to_string(), "B".to_string())].into(),
            procs: vec![ProcSpec {
                argv: vec!["vllm".into()],
                wait_tcp: Some("10.0.0.1:6379".parse().unwrap()),
            }],
            on_stop: vec![],
            group: vec![GroupPeer {
                node: NodeName::new("n2").unwrap(),
                addrs: vec!["10.0.0.2:7470".into()],
            }],
            wait_timeout_ms: 1,
            grace_ms: 2,
            weights: None,
            evict_page_cache: true,
            container: Some(ContainerSpec {
                image: "xt/app:1".into(),
                image_id: Some(Digest([7; 32])),
                gpus: GpuAccess::Devices(vec!["nvidia.com/gpu=all".into()]),
                shm_bytes: Some(1 << 30),
            }),
            caches: Some(crate::compile_cache::CacheGate {
                name: "xfer-caches-0123456789ab".into(),
                root: Hash([3; 32]),
                kinds: vec!["vllm".into()],
            }),
            held: true,
            rendezvous: None,
        };
        for m in [
            LaunchReply::PreflightReport(Box::new(facts)),
            LaunchReply::Reached {
                listen: Probe::Failed("in use".into()),
                reach: vec![],
            },
        ] {
            assert_eq!(
                decode_frame::<LaunchReply>(&encode(&m)).unwrap(),
                m,
                "{}",
                m.kind()
            );
        }
        for m in [
            LaunchRequest::StartRank(Box::new(spec)),
            LaunchRequest::StopRun {
                run: None,
                grace_ms: 5,
                reason: "down".into(),
            },
            LaunchRequest::Release { run: "r1".into() },
        ] {
            assert_eq!(decode_frame::<LaunchRequest>(&encode(&m)).unwrap(), m);
        }
    }
}
