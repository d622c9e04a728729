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

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod host;
pub mod net;
pub mod rdma;
pub mod reach;
pub mod versions;
pub mod weights;

/// Runs every probe of `req` on this node. `states` maps the store's
/// models to what `xfer status` says of them ("complete", "syncing", ...).
///
/// The ports are checked before the reachability listener binds (it
/// listens on one of them); the version commands and the reachability
/// window run at the same time, and the blocking probes (the weights'
/// stat, nvidia-smi, sysfs) on blocking threads meanwhile.
pub async fn gather(
    req: PreflightRequest,
    store: crate::store::Store,
    states: HashMap<String, String>,
) -> NodeFacts {
    let blocking = |what: &'static str| {
        move |e: tokio::task::JoinError| format!("the {what} probe failed: {e}; report this bug")
    };
    let root = store.root().to_path_buf();
    let (model_path, revision) = (req.model_path.clone(), req.revision.clone());
    let weights = tokio::task::spawn_blocking(move || {
        weights::weights(&store, &states, &model_path, revision.as_deref())
    });
    let gpus = tokio::task::spawn_blocking(host::gpus);
    let rdma_need = req.rdma.clone();
    let host = tokio::task::spawn_blocking(move || {
        let ifaces = net::interfaces();
        (
            host::disk(&root),
            host::memory(),
            net::default_route(),
            rdma::rdma(Path::new("/sys"), rdma_need.as_ref()),
            ifaces,
        )
    });

    // Before the listener takes one of them.
    let needs = req.ports.clone();
    let ports = tokio::task::spawn_blocking(move || {
        needs
            .iter()
            .map(|p| net::port_free(&p.what, p.port))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_else(|e| {
        let why = blocking("port")(e);
        req.ports
            .iter()
            .map(|p| PortFacts {
                what: p.what.clone(),
                port: p.port,
                free: Probe::Failed(why.clone()),
            })
            .collect()
    });

    let version_tasks: Vec<_> = req
        .versions
        .iter()
        .cloned()
        .map(|v| tokio::spawn(async move { versions::run(&v, versions::DEFAULT_TIMEOUT).await }))
        .collect();
    let listen = req.listen_port.map(|p| SocketAddr::new(req.fabric_ip, p));
    let (listen, reach) =
        reach::probe(listen, &req.peers, Duration::from_millis(req.window_ms)).await;
    let mut version_facts = Vec::with_capacity(version_tasks.len());
    for (v, t) in req.versions.iter().zip(version_tasks) {
        version_facts.push(t.await.unwrap_or_else(|e| VersionFacts {
            what: v.what.clone(),
            version: Probe::Failed(blocking("version")(e)),
        }));
    }

    let weights = weights.await.unwrap_or_else(|e| WeightFacts {
        path: req.model_path.clone(),
        problems: vec![blocking("weights")(e)],
        ..WeightFacts::default()
    });
    let gpus = gpus
        .await
        .unwrap_or_else(|e| Probe::Failed(blocking("GPU")(e)));
    let (disk, memory, default_route, rdma, interfaces) = match host.await {
        Ok(h) => h,
        Err(e) => {
            let why = blocking("host")(e);
            (
                Probe::Failed(why.clone()),
                Probe::Failed(why.clone()),
                Probe::Failed(why.clone()),
                Probe::Failed(why),
                Vec::new(),
            )
        }
    };
    NodeFacts {
        hostname: hostname(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        weights,
        disk,
        memory,
        gpus,
        fabric: net::fabric(&req.fabric_if, &interfaces),
        interfaces,
        default_route,
        ports,
        listen,
        reach,
        versions: version_facts,
        rdma,
    }
}

/// This machine's hostname.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; gethostname NUL-terminates
    // within it on success (we also stop at the end).
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if end > 0 {
            return String::from_utf8_lossy(&buf[..end]).into_owned();
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

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
    /// connecting to every peer, for `window_ms` at most. The launcher
    /// leaves these empty and sends a separate `Control::Reach` to every
    /// node once every node's ports were checked, so that no port check
    /// ever sees another node's probe listener (nodes may share a host).
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

/// A version to ask for: run `argv`, take the last non-empty line of its
/// stdout (warnings come first; see [`versions`]).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gather_checks_the_ports_before_listening_on_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let req = PreflightRequest {
            node: "n1".into(),
            fabric_if: "lo".into(),
            fabric_ip: "127.0.0.1".parse().unwrap(),
            model_path: dir.path().join("m").display().to_string(),
            revision: None,
            ports: vec![PortNeed {
                what: "master".into(),
                port,
            }],
            listen_port: Some(port),
            peers: vec![ReachTarget {
                node: "n1".into(),
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
            }],
            window_ms: 300,
            versions: vec![VersionProbe {
                what: "engine".into(),
                argv: vec!["sh".into(), "-c".into(), "echo 1.2.3".into()],
            }],
            rdma: None,
        };
        let f = gather(req, store, HashMap::new()).await;
        assert_eq!(f.ports[0].free, Probe::Ok(()), "{:?}", f.ports);
        assert_eq!(
            f.listen,
            Probe::Ok(SocketAddr::from(([127, 0, 0, 1], port)))
        );
        assert!(matches!(f.reach[0].result, Probe::Ok(_)), "{:?}", f.reach);
        assert_eq!(f.versions[0].version, Probe::Ok("1.2.3".into()));
        assert!(matches!(f.fabric, Probe::Ok(ref i) if i.name == "lo"));
        assert!(matches!(f.disk, Probe::Ok(_)));
        assert!(matches!(f.rdma, Probe::Skipped(_)));
        assert_eq!(f.weights.model.as_deref(), Some("m"));
        assert!(
            f.weights.problems[0].contains("is not held"),
            "{:?}",
            f.weights
        );
        assert!(!f.hostname.is_empty());
        assert_eq!(f.agent_version, env!("CARGO_PKG_VERSION"));
        // The reply survives the wire.
        let back: NodeFacts = serde_json::from_str(&serde_json::to_string(&f).unwrap()).unwrap();
        assert_eq!(back, f);
    }
}
