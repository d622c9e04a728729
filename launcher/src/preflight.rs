//! Preflight: what to ask every node before a launch, and the verdict on
//! what they answered.
//!
//! [`requests`] turns a [`Setup`] into one [`PreflightRequest`] per node
//! (ports to find free, peers to reach over the fabric on the rendezvous
//! port, versions to ask for, the RDMA device). The agents answer with
//! facts ([`NodeFacts`]); [`judge`] turns all nodes' facts into rows of
//! pass / warn / fail / skip, each saying what it saw and, when it is not a
//! pass, what to do. Both are pure: the tests feed them facts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;
use xfer::agent::preflight::{
    NodeFacts, PortNeed, PreflightRequest, Probe, RdmaNeed, ReachTarget, VersionProbe,
};
use xfer_proto::units::Bytes;

use crate::config::{Engine, Setup};

/// How long the nodes try to reach each other.
pub const REACH_WINDOW_MS: u64 = 3_000;
/// Disk below this on a node's root fails the check; below `DISK_WARN` warns.
pub const DISK_FAIL: u64 = 2 << 30;
pub const DISK_WARN: u64 = 10 << 30;

/// The port the ranks meet on, which the reachability probe uses.
pub fn rendezvous_port(setup: &Setup) -> (u16, &'static str) {
    match setup.engine {
        Engine::Vllm | Engine::Custom => (setup.ports.master, "master"),
        Engine::VllmRay => (setup.ports.ray, "ray"),
        Engine::Sglang => (setup.ports.dist, "dist"),
    }
}

/// The ports the engine binds on the head (the workers bind none of these).
fn head_ports(setup: &Setup) -> Vec<PortNeed> {
    let (rdv, what) = rendezvous_port(setup);
    let mut ports = vec![PortNeed {
        what: what.into(),
        port: rdv,
    }];
    ports.push(PortNeed {
        what: "api".into(),
        port: setup.ports.api,
    });
    ports
}

/// The version probes for this engine.
fn version_probes(engine: Engine) -> Vec<VersionProbe> {
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect();
    match engine {
        Engine::Vllm => vec![VersionProbe {
            what: "vllm".into(),
            argv: argv(&["vllm", "--version"]),
        }],
        Engine::VllmRay => vec![
            VersionProbe {
                what: "vllm".into(),
                argv: argv(&["vllm", "--version"]),
            },
            VersionProbe {
                what: "ray".into(),
                argv: argv(&["ray", "--version"]),
            },
        ],
        Engine::Sglang => vec![VersionProbe {
            what: "sglang".into(),
            argv: argv(&["python", "-c", "import sglang; print(sglang.__version__)"]),
        }],
        Engine::Custom => Vec::new(),
    }
}

/// The reachability round of node `i`'s request: where it listens, whom
/// it connects to. [`requests`] carries it; the launcher sends it apart
/// (`LaunchRequest::Reach`), after every node's port checks.
pub fn reach_of(req: &PreflightRequest) -> (Option<SocketAddr>, Vec<ReachTarget>, u64) {
    (
        req.listen_port.map(|p| SocketAddr::new(req.fabric_ip, p)),
        req.peers.clone(),
        req.window_ms,
    )
}

/// One request per node, in rank order.
pub fn requests(setup: &Setup) -> Vec<PreflightRequest> {
    let (rdv, _) = rendezvous_port(setup);
    setup
        .nodes
        .iter()
        .enumerate()
        .map(|(rank, node)| PreflightRequest {
            node: node.name.clone(),
            fabric_if: node.fabric_if.clone(),
            fabric_ip: node.fabric_ip,
            model_path: setup.model.path.clone(),
            revision: setup.model.revision.clone(),
            ports: if rank == 0 {
                head_ports(setup)
            } else {
                Vec::new()
            },
            // Nobody would connect to a lone node's listener.
            listen_port: (setup.nodes.len() > 1).then_some(rdv),
            peers: setup
                .nodes
                .iter()
                .filter(|p| p.name != node.name)
                .map(|p| ReachTarget {
                    node: p.name.clone(),
                    addr: SocketAddr::new(p.fabric_ip, rdv),
                })
                .collect(),
            window_ms: REACH_WINDOW_MS,
            versions: version_probes(setup.engine),
            rdma: node.rdma.as_ref().map(|r| RdmaNeed {
                device: r.device.clone(),
                gid_index: r.gid_index,
            }),
        })
        .collect()
}

/// A verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Skip,
    Warn,
    Fail,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Skip => "skip",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        }
    }
}

/// One line of the check table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    pub check: &'static str,
    /// The node, or "*" for a comparison across nodes.
    pub node: String,
    pub verdict: Verdict,
    pub detail: String,
    /// What to do, for everything but a pass.
    pub fix: Option<String>,
}

/// The checks, in the order the table lists them.
pub const CHECKS: &[&str] = &[
    "agent", "weights", "disk", "memory", "gpu", "fabric", "route", "reach", "links", "ports",
    "versions", "rdma",
];

/// The verdict on every node's answer (`Err`: the agent did not answer).
/// `answers` is in rank order, like `setup.nodes`.
pub fn judge(setup: &Setup, answers: &[Result<NodeFacts, String>]) -> Vec<Row> {
    let mut rows = Vec::new();
    let file = setup.path.display().to_string();
    let mut row =
        |check: &'static str, node: &str, verdict: Verdict, detail: String, fix: Option<String>| {
            rows.push(Row {
                check,
                node: node.to_string(),
                verdict,
                detail,
                fix,
            })
        };
    let nodes: Vec<(&crate::config::RankNode, &NodeFacts)> = setup
        .nodes
        .iter()
        .zip(answers)
        .filter_map(|(n, a)| a.as_ref().ok().map(|f| (n, f)))
        .collect();

    // agent
    for (n, a) in setup.nodes.iter().zip(answers) {
        match a {
            Ok(f) => row(
                "agent",
                &n.name,
                Verdict::Pass,
                format!("{} answered (host {}, xfer {})", n.agent, f.hostname, f.agent_version),
                None,
            ),
            Err(e) => row(
                "agent",
                &n.name,
                Verdict::Fail,
                format!("agent at {} did not answer: {e}", n.agent),
                Some(format!(
                    "start `xfer serve --key KEY --root ROOT` on {} (scripts/xfer-agent.service), or correct `agent` at {file}:{}; every other check of this node was skipped",
                    n.name, n.line
                )),
            ),
        }
    }

    // weights
    let sync_fix = |node: &str| {
        format!(
            "sync the model to it: `xfer sync {} --cluster {file} --nodes {node}` (or its ORG/NAME), then check again",
            setup.model.path
        )
    };
    for (n, f) in &nodes {
        let w = &f.weights;
        let complete = w.state.as_deref() == Some("complete");
        if w.problems.is_empty() && complete && w.root.is_some() {
            row(
                "weights",
                &n.name,
                Verdict::Pass,
                format!(
                    "{} complete and verified, root {}, {}",
                    w.path,
                    short(w.root.as_deref().unwrap_or("")),
                    Bytes(w.bytes_present)
                ),
                None,
            );
        } else {
            let mut what: Vec<String> = w.problems.iter().take(4).cloned().collect();
            if !complete {
                what.insert(
                    0,
                    match &w.state {
                        Some(s) => format!(
                            "{} is {s} ({} of {} present)",
                            w.model.as_deref().unwrap_or(&w.path),
                            Bytes(w.bytes_present),
                            Bytes(w.bytes_total)
                        ),
                        None => format!("{} is not held by this node's agent", w.path),
                    },
                );
            }
            what.dedup();
            row(
                "weights",
                &n.name,
                Verdict::Fail,
                what.join("; "),
                Some(sync_fix(&n.name)),
            );
        }
    }
    // One root hash (and one commit) across nodes.
    let roots = by_value(
        nodes
            .iter()
            .filter_map(|(n, f)| f.weights.root.as_deref().map(|r| (r, n.name.as_str()))),
    );
    if roots.len() > 1 {
        let (major, _) = roots
            .iter()
            .max_by_key(|(r, ns)| (ns.len(), ns.contains(&setup.nodes[0].name.as_str()), *r))
            .map(|(r, ns)| (*r, ns.clone()))
            .unwrap_or_default();
        let list = spread(&roots, |r| short(r).to_string(), ", root ");
        let odd: Vec<&str> = roots
            .iter()
            .filter(|(r, _)| **r != major)
            .flat_map(|(_, ns)| ns.iter().copied())
            .collect();
        row(
            "weights",
            "*",
            Verdict::Fail,
            format!(
                "the nodes hold different models at {}: root {}; {} differ",
                setup.model.path,
                list,
                odd.join(", ")
            ),
            Some(format!(
                "make every node hold the same model: `xfer sync` it again from the node with the intended version to {}",
                odd.join(", ")
            )),
        );
    }
    let commits = by_value(
        nodes
            .iter()
            .filter_map(|(n, f)| f.weights.commit.as_deref().map(|c| (c, n.name.as_str()))),
    );
    if commits.len() > 1 {
        let list = spread(&commits, |c| short(c).to_string(), "; ");
        row(
            "weights",
            "*",
            Verdict::Fail,
            format!(
                "refs/{} names different commits: {}",
                setup.model.revision.as_deref().unwrap_or("main"),
                list
            ),
            Some("pin one commit: set revision = \"<40-hex commit>\" in [launch], or sync the same revision to every node".into()),
        );
    }

    // disk
    for (n, f) in &nodes {
        match &f.disk {
            Probe::Ok(d) => {
                let (v, fix) = if d.free_bytes < DISK_FAIL {
                    (Verdict::Fail, Some(format!("free space on the filesystem of {} (engines write compile caches and logs there)", d.path)))
                } else if d.free_bytes < DISK_WARN {
                    (Verdict::Warn, Some(format!("free some space on the filesystem of {}; torch.compile and CUDA graph caches take several GiB", d.path)))
                } else {
                    (Verdict::Pass, None)
                };
                row(
                    "disk",
                    &n.name,
                    v,
                    format!(
                        "{} free of {} at {}",
                        Bytes(d.free_bytes),
                        Bytes(d.total_bytes),
                        d.path
                    ),
                    fix,
                );
            }
            p => skip_or_fail(
                &mut row,
                "disk",
                &n.name,
                p,
                "check that the agent's root is readable",
            ),
        }
    }

    // memory: each node holds its share of the weights in memory
    let nnodes = setup.nodes.len().max(1) as u64;
    for (n, f) in &nodes {
        match &f.memory {
            Probe::Ok(m) => {
                let share = f.weights.bytes_present / nnodes;
                let (v, fix) = if m.mem_available < share {
                    (
                        Verdict::Fail,
                        Some("free memory on this node (stop other processes; drop the page cache: `sync; echo 1 > /proc/sys/vm/drop_caches`), or spread the model over more nodes".to_string()),
                    )
                } else if (m.mem_available as f64) < share as f64 * 1.2 {
                    (
                        Verdict::Warn,
                        Some("little headroom: the OOM killer may stop a rank while it loads; free memory or drop the page cache".to_string()),
                    )
                } else {
                    (Verdict::Pass, None)
                };
                row(
                    "memory",
                    &n.name,
                    v,
                    format!(
                        "MemAvailable {} of {} for a {} share of the weights",
                        Bytes(m.mem_available),
                        Bytes(m.mem_total),
                        Bytes(share)
                    ),
                    fix,
                );
            }
            p => skip_or_fail(
                &mut row,
                "memory",
                &n.name,
                p,
                "check /proc/meminfo on this node",
            ),
        }
    }

    // gpu
    for (n, f) in &nodes {
        match &f.gpus {
            Probe::Ok(g) if !g.processes.is_empty() => {
                let list: Vec<String> = g
                    .processes
                    .iter()
                    .map(|p| match p.used_mib {
                        Some(m) => format!("{} (pid {}, {m} MiB)", p.name, p.pid),
                        None => format!("{} (pid {})", p.name, p.pid),
                    })
                    .collect();
                row(
                    "gpu",
                    &n.name,
                    Verdict::Fail,
                    format!("the GPUs are busy: {}", list.join(", ")),
                    Some("stop those processes (`xfer-launch down` if they are an earlier launch), then check again".into()),
                );
            }
            Probe::Ok(g) => {
                let names: Vec<&str> = g.gpus.iter().map(|g| g.name.as_str()).collect();
                row(
                    "gpu",
                    &n.name,
                    if g.gpus.is_empty() {
                        Verdict::Warn
                    } else {
                        Verdict::Pass
                    },
                    format!(
                        "{} GPU(s) idle{}{}",
                        g.gpus.len(),
                        if names.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", names.join(", "))
                        },
                        g.driver
                            .as_deref()
                            .map(|d| format!(", driver {d}"))
                            .unwrap_or_default()
                    ),
                    g.gpus.is_empty().then(|| {
                        "nvidia-smi lists no GPU: check the driver (`nvidia-smi`)".to_string()
                    }),
                );
            }
            p => skip_or_fail(
                &mut row,
                "gpu",
                &n.name,
                p,
                "run `nvidia-smi` on this node to see why it fails",
            ),
        }
    }

    // fabric: the fabric_ip is on fabric_if, which is up
    for (n, f) in &nodes {
        let fix_at = format!("correct fabric_if / fabric_ip at {file}:{}", n.line);
        match &f.fabric {
            Probe::Ok(i) => {
                let has = i.addrs.iter().any(|(a, p)| {
                    *a == n.fabric_ip
                        // Linux answers for all of 127/8 on the loopback.
                        || (a.is_loopback() && n.fabric_ip.is_loopback() && in_prefix(*a, *p, n.fabric_ip))
                });
                let up =
                    i.operstate == "up" || (i.operstate == "unknown" && i.carrier != Some(false));
                if !has {
                    let elsewhere = f
                        .interfaces
                        .iter()
                        .find(|o| o.addrs.iter().any(|(a, _)| *a == n.fabric_ip))
                        .map(|o| format!("; {} is on {}", n.fabric_ip, o.name))
                        .unwrap_or_else(|| {
                            format!("; no interface of this node has {}", n.fabric_ip)
                        });
                    row(
                        "fabric",
                        &n.name,
                        Verdict::Fail,
                        format!(
                            "{} is not on {} (it has {}){elsewhere}",
                            n.fabric_ip,
                            i.name,
                            addrs(&i.addrs)
                        ),
                        Some(fix_at),
                    );
                } else if !up || i.carrier == Some(false) {
                    row(
                        "fabric",
                        &n.name,
                        Verdict::Fail,
                        format!("{} is {} (carrier {})", i.name, i.operstate, i.carrier.map_or("unknown", |c| if c { "on" } else { "off" })),
                        Some(format!("bring it up (`ip link set {} up`) and check the cable and the switch port", i.name)),
                    );
                } else {
                    row(
                        "fabric",
                        &n.name,
                        Verdict::Pass,
                        format!(
                            "{} on {}, {}, mtu {}",
                            n.fabric_ip, i.name, i.operstate, i.mtu
                        ),
                        None,
                    );
                }
            }
            Probe::Failed(why) | Probe::Skipped(why) => {
                let names: Vec<&str> = f.interfaces.iter().map(|i| i.name.as_str()).collect();
                row(
                    "fabric",
                    &n.name,
                    Verdict::Fail,
                    format!("{why} (interfaces: {})", names.join(", ")),
                    Some(fix_at),
                );
            }
        }
    }

    // route: what an engine would pick by itself
    for (n, f) in &nodes {
        match &f.default_route {
            Probe::Ok(r) => match r.src {
                Some(src) if src != n.fabric_ip => row(
                    "route",
                    &n.name,
                    Verdict::Warn,
                    format!(
                        "the default route goes through {} ({src}), not the fabric: Ray, NCCL or SGLang left to themselves would pick {src}; the plan pins {} on {} (VLLM_HOST_IP/SGLANG_HOST_IP, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)",
                        r.iface, n.fabric_ip, n.fabric_if
                    ),
                    Some("nothing to do for xfer-launch; keep fabric_ip set, and pin the same variables in anything started by hand".into()),
                ),
                _ => row(
                    "route",
                    &n.name,
                    Verdict::Pass,
                    format!("the default route goes through {} ({})", r.iface, n.fabric_ip),
                    None,
                ),
            },
            Probe::Skipped(why) => row("route", &n.name, Verdict::Pass, format!("{why}: nothing to pick by mistake"), None),
            Probe::Failed(why) => row("route", &n.name, Verdict::Skip, format!("skipped: {why}"), None),
        }
    }

    // reach: every node connects to every other over the fabric
    let (rdv, rdv_what) = rendezvous_port(setup);
    for (n, f) in &nodes {
        let mut bad = Vec::new();
        let mut good = Vec::new();
        for r in &f.reach {
            match &r.result {
                Probe::Ok(us) => good.push(format!(
                    "{} ({}) in {:.1} ms",
                    r.node,
                    r.addr,
                    *us as f64 / 1000.0
                )),
                Probe::Failed(e) | Probe::Skipped(e) => {
                    let peer_listen = nodes
                        .iter()
                        .find(|(p, _)| p.name == r.node)
                        .and_then(|(_, pf)| match &pf.listen {
                            Probe::Ok(_) => None,
                            Probe::Failed(w) | Probe::Skipped(w) => {
                                Some(format!(" ({} could not listen: {w})", r.node))
                            }
                        })
                        .unwrap_or_default();
                    bad.push(format!("{} at {}: {e}{peer_listen}", r.node, r.addr))
                }
            }
        }
        if !bad.is_empty() {
            row(
                "reach",
                &n.name,
                Verdict::Fail,
                format!("cannot reach {} over {} on the {rdv_what} port {rdv}", bad.join("; "), n.fabric_if),
                Some(format!(
                    "the ranks meet there: check the fabric between these nodes (cable, VLAN, `nft list ruleset`/iptables on port {rdv}), e.g. `ping -I {} <peer fabric_ip>` on {}",
                    n.fabric_if, n.name
                )),
            );
        } else if good.is_empty() && setup.nodes.len() > 1 {
            let why = match &f.listen {
                Probe::Failed(w) | Probe::Skipped(w) => w.clone(),
                Probe::Ok(_) => "no result".into(),
            };
            row(
                "reach",
                &n.name,
                Verdict::Fail,
                format!("the reachability round did not run: {why}"),
                Some("check that the agent is still running, then check again".into()),
            );
        } else if good.is_empty() {
            row(
                "reach",
                &n.name,
                Verdict::Skip,
                "skipped: a single node has no peer to reach".into(),
                None,
            );
        } else {
            row(
                "reach",
                &n.name,
                Verdict::Pass,
                format!("reaches {}", good.join(", ")),
                None,
            );
        }
    }

    // links: one MTU on the fabric
    let mtus = by_value(nodes.iter().filter_map(|(n, f)| match &f.fabric {
        Probe::Ok(i) => Some((i.mtu, n.name.as_str())),
        _ => None,
    }));
    match mtus.len() {
        0 => {}
        1 => {
            let mtu = mtus.keys().next().copied().unwrap_or(0);
            row(
                "links",
                "*",
                Verdict::Pass,
                format!("mtu {mtu} on every fabric interface"),
                None,
            )
        }
        _ => {
            let list = spread(&mtus, |m| m.to_string(), "; ");
            row(
                "links",
                "*",
                Verdict::Fail,
                format!("the fabric MTUs differ: {list}"),
                Some("set one MTU on every fabric interface (`ip link set IF mtu 9000`, and on the switch): NCCL hangs when large frames are dropped".into()),
            );
        }
    }

    // ports
    for (n, f) in &nodes {
        let taken: Vec<String> = f
            .ports
            .iter()
            .filter_map(|p| match &p.free {
                Probe::Ok(()) => None,
                Probe::Failed(w) | Probe::Skipped(w) => {
                    Some(format!("{} port {} {w}", p.what, p.port))
                }
            })
            .collect();
        if f.ports.is_empty() {
            continue;
        }
        if taken.is_empty() {
            let list: Vec<String> = f
                .ports
                .iter()
                .map(|p| format!("{} {}", p.what, p.port))
                .collect();
            row(
                "ports",
                &n.name,
                Verdict::Pass,
                format!("free: {}", list.join(", ")),
                None,
            );
        } else {
            row(
                "ports",
                &n.name,
                Verdict::Fail,
                taken.join("; "),
                Some(format!(
                    "stop what holds it (`xfer-launch down` if it is an earlier launch), or choose another port in [launch] of {file} (master_port, api_port, ray_port, dist_port)"
                )),
            );
        }
    }

    // versions: one engine build everywhere (and one driver)
    let probes = version_probes(setup.engine);
    if probes.is_empty() {
        row(
            "versions",
            "*",
            Verdict::Skip,
            "skipped: a custom engine has no version to ask for".into(),
            None,
        );
    }
    for p in &probes {
        let mut seen: Vec<(String, &str)> = Vec::new();
        let mut missing = Vec::new();
        for (n, f) in &nodes {
            match f
                .versions
                .iter()
                .find(|v| v.what == p.what)
                .map(|v| &v.version)
            {
                Some(Probe::Ok(v)) => seen.push((v.clone(), &n.name)),
                Some(Probe::Failed(w) | Probe::Skipped(w)) => {
                    missing.push(format!("{}: {w}", n.name))
                }
                None => missing.push(format!("{}: not asked", n.name)),
            }
        }
        let seen = by_value(seen);
        if !missing.is_empty() {
            row(
                "versions",
                "*",
                Verdict::Fail,
                format!("{} on every node: {}", p.what, missing.join("; ")),
                Some(format!("install the same {} on every node, on the PATH the xfer agent runs with (the ranks inherit it)", p.what)),
            );
        } else if seen.len() > 1 {
            let list = spread(&seen, |v| v.clone(), "; ");
            row(
                "versions",
                "*",
                Verdict::Fail,
                format!("{} differs: {list}", p.what),
                Some(format!(
                    "install one {} version on every node; mixed builds hang or fail at init",
                    p.what
                )),
            );
        } else if let Some(v) = seen.keys().next() {
            row(
                "versions",
                "*",
                Verdict::Pass,
                format!("{} {v} on every node", p.what),
                None,
            );
        }
    }
    let drivers = by_value(nodes.iter().filter_map(|(n, f)| match &f.gpus {
        Probe::Ok(g) => g.driver.as_deref().map(|d| (d, n.name.as_str())),
        _ => None,
    }));
    if drivers.len() > 1 {
        let list = spread(&drivers, |d| d.to_string(), "; ");
        row(
            "versions",
            "*",
            Verdict::Warn,
            format!("NVIDIA drivers differ: {list}"),
            Some("install one driver version on every node".into()),
        );
    }

    // rdma
    for (n, f) in &nodes {
        match &f.rdma {
            Probe::Ok(r) => {
                let ports: Vec<String> = r
                    .ports
                    .iter()
                    .map(|p| format!("port {} {} ({})", p.port, p.state, p.link_layer))
                    .collect();
                row(
                    "rdma",
                    &n.name,
                    Verdict::Pass,
                    format!(
                        "{}: {}{}",
                        r.device,
                        ports.join(", "),
                        r.gid.as_deref().map(|g| format!(", gid {g}")).unwrap_or_default()
                    ),
                    None,
                );
            }
            Probe::Skipped(why) => row("rdma", &n.name, Verdict::Skip, format!("skipped: {why}"), None),
            Probe::Failed(why) => row(
                "rdma",
                &n.name,
                Verdict::Fail,
                match &n.rdma {
                    Some(r) if !why.contains(&r.device) => format!("rdma_device {}: {why}", r.device),
                    _ => why.clone(),
                },
                Some(format!(
                    "fix the device, or correct rdma_device / gid_index at {file}:{} (remove them to run NCCL over TCP)",
                    n.line
                )),
            ),
        }
    }

    let order = |c: &str| CHECKS.iter().position(|x| *x == c).unwrap_or(CHECKS.len());
    rows.sort_by_key(|r| order(r.check));
    rows
}

fn skip_or_fail(
    row: &mut impl FnMut(&'static str, &str, Verdict, String, Option<String>),
    check: &'static str,
    node: &str,
    p: &Probe<impl Sized>,
    fix: &str,
) {
    match p {
        Probe::Skipped(why) => row(check, node, Verdict::Skip, format!("skipped: {why}"), None),
        Probe::Failed(why) => row(
            check,
            node,
            Verdict::Fail,
            why.clone(),
            Some(fix.to_string()),
        ),
        Probe::Ok(_) => {}
    }
}

/// Node names grouped by the value each reported, values in order.
fn by_value<'a, K: Ord>(
    pairs: impl IntoIterator<Item = (K, &'a str)>,
) -> BTreeMap<K, Vec<&'a str>> {
    let mut m: BTreeMap<K, Vec<&'a str>> = BTreeMap::new();
    for (k, node) in pairs {
        m.entry(k).or_default().push(node);
    }
    m
}

/// "A on n1, n2; B on n3", each value shown by `show`, groups joined by `sep`.
fn spread<K>(groups: &BTreeMap<K, Vec<&str>>, show: impl Fn(&K) -> String, sep: &str) -> String {
    groups
        .iter()
        .map(|(k, ns)| format!("{} on {}", show(k), ns.join(", ")))
        .collect::<Vec<_>>()
        .join(sep)
}

fn in_prefix(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

fn addrs(a: &[(IpAddr, u8)]) -> String {
    if a.is_empty() {
        return "no address".into();
    }
    a.iter()
        .map(|(ip, p)| format!("{ip}/{p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn short(h: &str) -> &str {
    &h[..h.len().min(12)]
}

/// Whether any row fails.
pub fn failed(rows: &[Row]) -> bool {
    rows.iter().any(|r| r.verdict == Verdict::Fail)
}

/// The table `xfer-launch check` prints.
pub fn render(rows: &[Row]) -> String {
    let wc = rows.iter().map(|r| r.check.len()).max().unwrap_or(5).max(5);
    let wn = rows.iter().map(|r| r.node.len()).max().unwrap_or(4).max(4);
    let mut o = String::new();
    let _ = writeln!(o, "{:<4}  {:<wc$}  {:<wn$}  DETAIL", "", "CHECK", "NODE");
    for r in rows {
        let _ = writeln!(
            o,
            "{:<4}  {:<wc$}  {:<wn$}  {}",
            r.verdict.label(),
            r.check,
            r.node,
            r.detail
        );
        if let Some(fix) = &r.fix {
            let _ = writeln!(o, "{:<4}  {:<wc$}  {:<wn$}    fix: {fix}", "", "", "");
        }
    }
    let count = |v| rows.iter().filter(|r| r.verdict == v).count();
    let _ = writeln!(
        o,
        "{} passed, {} warnings, {} failed, {} skipped",
        count(Verdict::Pass),
        count(Verdict::Warn),
        count(Verdict::Fail),
        count(Verdict::Skip)
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{setup, COMMIT};
    use xfer::agent::preflight::*;

    fn s() -> Setup {
        setup(&format!(
            "engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\""
        ))
    }

    fn iface(name: &str, ip: IpAddr, mtu: u32) -> IfaceFacts {
        IfaceFacts {
            name: name.into(),
            operstate: "up".into(),
            carrier: Some(true),
            mtu,
            addrs: vec![(ip, 24)],
        }
    }

    /// A healthy node as the agent would describe it.
    fn good(setup: &Setup, i: usize) -> NodeFacts {
        let n = &setup.nodes[i];
        let req = &requests(setup)[i];
        let fabric = iface(&n.fabric_if, n.fabric_ip, 9000);
        let mgmt_ip: IpAddr = format!("10.0.0.{}", i + 1).parse().unwrap();
        NodeFacts {
            hostname: n.name.clone(),
            agent_version: "0.1.0".into(),
            weights: WeightFacts {
                path: setup.model.path.clone(),
                commit: None,
                store_root: "/var/lib/xfer/hub".into(),
                model: Some("models--Qwen--Qwen3-8B".into()),
                state: Some("complete".into()),
                root: Some("ab".repeat(32)),
                bytes_total: 16 << 30,
                bytes_present: 16 << 30,
                problems: vec![],
            },
            disk: Probe::Ok(DiskFacts {
                path: "/var/lib/xfer/hub".into(),
                free_bytes: 500 << 30,
                total_bytes: 1 << 40,
            }),
            memory: Probe::Ok(MemFacts {
                mem_total: 128 << 30,
                mem_available: 100 << 30,
            }),
            gpus: Probe::Ok(GpuFacts {
                gpus: vec![GpuInfo {
                    index: 0,
                    name: "NVIDIA GB10".into(),
                    memory_total_mib: None,
                    memory_used_mib: None,
                }],
                processes: vec![],
                driver: Some("580.95.05".into()),
            }),
            fabric: Probe::Ok(fabric.clone()),
            interfaces: vec![iface("enP7s7", mgmt_ip, 1500), fabric],
            default_route: Probe::Ok(RouteFacts {
                iface: "enP7s7".into(),
                gateway: None,
                src: Some(mgmt_ip),
            }),
            ports: req
                .ports
                .iter()
                .map(|p| PortFacts {
                    what: p.what.clone(),
                    port: p.port,
                    free: Probe::Ok(()),
                })
                .collect(),
            listen: Probe::Ok(SocketAddr::new(n.fabric_ip, 29500)),
            reach: req
                .peers
                .iter()
                .map(|p| ReachFacts {
                    node: p.node.clone(),
                    addr: p.addr,
                    result: Probe::Ok(250),
                })
                .collect(),
            versions: vec![VersionFacts {
                what: "vllm".into(),
                version: Probe::Ok("0.11.0".into()),
            }],
            rdma: Probe::Ok(RdmaFacts {
                device: n
                    .rdma
                    .as_ref()
                    .map(|r| r.device.clone())
                    .unwrap_or_default(),
                ports: vec![RdmaPort {
                    port: 1,
                    state: "4: ACTIVE".into(),
                    link_layer: "Ethernet".into(),
                    active_mtu: None,
                }],
                gid: None,
            }),
        }
    }

    fn judged(setup: &Setup, f: impl Fn(usize, &mut NodeFacts)) -> Vec<Row> {
        let answers: Vec<Result<NodeFacts, String>> = (0..setup.nodes.len())
            .map(|i| {
                let mut facts = good(setup, i);
                f(i, &mut facts);
                Ok(facts)
            })
            .collect();
        judge(setup, &answers)
    }

    fn fails(rows: &[Row]) -> Vec<(&str, &str, &str)> {
        rows.iter()
            .filter(|r| r.verdict == Verdict::Fail)
            .map(|r| (r.check, r.node.as_str(), r.detail.as_str()))
            .collect()
    }

    #[test]
    fn a_healthy_cluster_passes_and_flags_the_management_route() {
        let s = s();
        let rows = judged(&s, |_, _| {});
        assert!(!failed(&rows), "{}", render(&rows));
        let warn: Vec<&Row> = rows.iter().filter(|r| r.verdict == Verdict::Warn).collect();
        assert_eq!(warn.len(), 2, "{}", render(&rows));
        assert!(
            warn[0].detail.contains("would pick 10.0.0.1"),
            "{}",
            warn[0].detail
        );
        assert!(
            warn[0].detail.contains("pins 192.168.100.1"),
            "{}",
            warn[0].detail
        );
        // Every check has a row, in the table's order.
        let checks: Vec<&str> = rows.iter().map(|r| r.check).collect();
        let mut sorted = checks.clone();
        sorted.sort_by_key(|c| CHECKS.iter().position(|x| x == c));
        assert_eq!(checks, sorted);
        for c in CHECKS {
            assert!(checks.contains(c), "no {c} row");
        }
        assert!(render(&rows).contains("0 failed"));
    }

    #[test]
    fn the_weight_gate_names_the_node_and_what_is_missing() {
        let s = s();
        let rows = judged(&s, |i, f| {
            if i == 1 {
                f.weights.state = Some("syncing".into());
                f.weights.root = None;
                f.weights.bytes_present = 4 << 30;
                f.weights.problems = vec!["model-00003-of-00004.safetensors: missing".into()];
            }
        });
        let f = fails(&rows);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].0, f[0].1), ("weights", "spark-b"));
        assert!(
            f[0].2.contains("is syncing (4.0 GiB of 16.0 GiB present)"),
            "{}",
            f[0].2
        );
        assert!(f[0].2.contains("model-00003-of-00004.safetensors: missing"));

        let rows = judged(&s, |i, f| {
            if i == 1 {
                f.weights.root = Some("cd".repeat(32));
            }
        });
        let f = fails(&rows);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].0, f[0].1), ("weights", "*"));
        assert!(f[0].2.contains("spark-b differ"), "{}", f[0].2);
    }

    #[test]
    fn an_unreachable_agent_fails_with_its_line() {
        let s = s();
        let answers = vec![Ok(good(&s, 0)), Err("no answer within 5s".to_string())];
        let rows = judge(&s, &answers);
        let f = fails(&rows);
        assert!(f
            .iter()
            .any(|(c, n, d)| *c == "agent" && *n == "spark-b" && d.contains("no answer")));
        let fix = rows
            .iter()
            .find(|r| r.check == "agent" && r.node == "spark-b")
            .unwrap();
        assert!(fix
            .fix
            .as_ref()
            .unwrap()
            .contains(&format!("cluster.toml:{}", s.nodes[1].line)));
        // spark-a still reaches spark-b, whose agent said nothing: only agent fails.
        assert_eq!(f.len(), 1, "{f:?}");
    }

    #[test]
    fn network_ports_versions_and_gpus_fail_clearly() {
        let s = s();
        let rows = judged(&s, |i, f| {
            if i == 0 {
                f.ports[1].free = Probe::Failed("in use by python3 (pid 4242)".into());
                f.gpus = Probe::Ok(GpuFacts {
                    gpus: vec![],
                    processes: vec![GpuProcess {
                        pid: 77,
                        name: "python3".into(),
                        used_mib: Some(90000),
                    }],
                    driver: None,
                });
            } else {
                f.reach[0].result = Probe::Failed("timed out after 3s".into());
                if let Probe::Ok(i) = &mut f.fabric {
                    i.mtu = 1500;
                }
                f.versions[0].version = Probe::Ok("0.10.2".into());
            }
        });
        let f = fails(&rows);
        let has = |c: &str, n: &str, needle: &str| {
            f.iter()
                .any(|(fc, fnode, d)| *fc == c && *fnode == n && d.contains(needle))
        };
        assert!(
            has(
                "ports",
                "spark-a",
                "api port 8000 in use by python3 (pid 4242)"
            ),
            "{f:?}"
        );
        assert!(
            has("gpu", "spark-a", "python3 (pid 77, 90000 MiB)"),
            "{f:?}"
        );
        assert!(
            has(
                "reach",
                "spark-b",
                "spark-a at 192.168.100.1:29500: timed out"
            ),
            "{f:?}"
        );
        assert!(
            has("links", "*", "1500 on spark-b; 9000 on spark-a"),
            "{f:?}"
        );
        assert!(
            has("versions", "*", "0.10.2 on spark-b; 0.11.0 on spark-a"),
            "{f:?}"
        );
        assert_eq!(f.len(), 5, "{f:?}");
    }

    #[test]
    fn a_fabric_ip_on_the_wrong_interface_says_where_it_is() {
        let s = s();
        let rows = judged(&s, |i, f| {
            if i == 0 {
                let wrong: IpAddr = "10.9.9.9".parse().unwrap();
                if let Probe::Ok(x) = &mut f.fabric {
                    x.addrs = vec![(wrong, 24)];
                }
                f.interfaces[0].addrs.push((s.nodes[0].fabric_ip, 24));
            }
        });
        let f = fails(&rows);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].2.contains("192.168.100.1 is not on enp1s0f1np1 (it has 10.9.9.9/24); 192.168.100.1 is on enP7s7"), "{}", f[0].2);
    }

    #[test]
    fn skipped_probes_say_why_and_never_pass() {
        let s = s();
        let rows = judged(&s, |_, f| {
            f.gpus = Probe::Skipped("nvidia-smi not found on PATH; no NVIDIA GPU check".into());
            f.rdma = Probe::Skipped("no rdma_device for this node in the cluster file".into());
        });
        let gpu: Vec<&Row> = rows.iter().filter(|r| r.check == "gpu").collect();
        assert!(gpu
            .iter()
            .all(|r| r.verdict == Verdict::Skip
                && r.detail.starts_with("skipped: nvidia-smi not found")));
        assert!(!failed(&rows));
    }

    #[test]
    fn requests_probe_the_rendezvous_port_and_bind_ports_on_the_head_only() {
        let s = s();
        let r = requests(&s);
        assert_eq!(r[0].listen_port, Some(29500));
        assert_eq!(r[0].peers[0].addr, "192.168.100.2:29500".parse().unwrap());
        assert_eq!(
            r[0].ports.iter().map(|p| p.port).collect::<Vec<_>>(),
            [29500, 8000]
        );
        assert!(r[1].ports.is_empty());
        assert_eq!(r[0].versions[0].argv, ["vllm", "--version"]);
        assert_eq!(
            r[1].rdma.as_ref().unwrap().device,
            s.nodes[1].rdma.as_ref().unwrap().device
        );
        let sg = setup(&format!(
            "engine = \"sglang\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\""
        ));
        assert_eq!(requests(&sg)[1].listen_port, Some(20000));
    }
}
