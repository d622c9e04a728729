//! Preflight: what to ask every node before a launch, and the verdict on
//! what they answered.
//!
//! [`requests`] turns a [`Setup`] into one [`PreflightRequest`] per node
//! (ports to find free, peers to reach over the fabric on the rendezvous
//! port, versions to ask for, the RDMA device). The agents answer with
//! facts ([`NodeFacts`]); [`judge`] turns all nodes' facts into rows of
//! pass / warn / fail / skip, each saying what it saw and, when it is not a
//! pass, what to do. Both are pure: the tests feed them facts.
//!
//! This file holds the requests, the row and verdict types, the table
//! ([`render`]) and the helpers the checks share; each check is one
//! function in [`checks`] (agent, weights, containers: containers/image,
//! host: disk/memory/gpu, net: fabric/route/reach/links/ports, resolver,
//! versions, unit: nccl/unit, rdma).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;

use serde::Serialize;
use xfer_proto::launch::{
    NodeFacts, PortNeed, PreflightRequest, Probe, RdmaNeed, ReachTarget, RendezvousRequest,
    VersionProbe,
};
use xfer_proto::text::wrap;

use crate::agents::NodeError;
use crate::config::{Engine, RankNode, Setup};

mod checks;
pub mod hosts;
#[cfg(test)]
mod tests;

/// How long the nodes try to reach each other.
pub const REACH_WINDOW_MS: u64 = 3_000;
/// Disk below this on a node's root fails the check; below `DISK_WARN` warns.
pub const DISK_FAIL: u64 = 2 << 30;
/// Disk below this on a node's root warns.
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

/// The version probes for this engine. The engines' Python packages are
/// asked through the Python that runs them (`python_of`: the agent reads
/// the module's version file, in milliseconds, where `vllm --version`
/// imports all of vLLM for ten seconds); the command is the fallback.
pub(crate) fn version_probes(engine: Engine) -> Vec<VersionProbe> {
    let probe = |what: &str, python_of: Option<&str>, argv: &[&str]| VersionProbe {
        what: what.into(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        python_of: python_of.map(str::to_string),
    };
    let torch = |of: &str| {
        probe(
            "torch",
            Some(of),
            &["python3", "-c", "import torch; print(torch.__version__)"],
        )
    };
    match engine {
        Engine::Vllm => vec![
            probe("vllm", Some("vllm"), &["vllm", "--version"]),
            torch("vllm"),
        ],
        Engine::VllmRay => vec![
            probe("vllm", Some("vllm"), &["vllm", "--version"]),
            probe("ray", Some("ray"), &["ray", "--version"]),
            torch("vllm"),
        ],
        Engine::Sglang => vec![
            probe(
                "sglang",
                Some("python3"),
                &["python3", "-c", "import sglang; print(sglang.__version__)"],
            ),
            torch("python3"),
        ],
        Engine::Custom => Vec::new(),
    }
}

/// How long the rendezvous probe may take: a Gloo all-reduce between
/// nodes that can meet takes well under a second after torch's import.
pub const RENDEZVOUS_TIMEOUT_MS: u64 = 25_000;

/// How long a held rank may take, once released, to reach the
/// rendezvous: its engine imports its Python and starts its workers first
/// (vLLM: 20-35 s on a busy 2-core node).
pub const HELD_IMPORT_MS: u64 = 180_000;

/// How long a held rank's worker waits for the others at the rendezvous
/// (torch's own timeout): longer than the agents' probe, since the
/// engines of two nodes reach it at different times (a node with a cold
/// page cache imports its Python seconds later).
pub const HELD_MEET_MS: u64 = 60_000;

/// The rendezvous probe of every node, in rank order (empty for a custom
/// engine, which may not use torch, and for a single node): a Gloo
/// all-reduce through a store on the head's fabric address at the API
/// port (free on the head, and not the reach round's port, so both rounds
/// run at once), in the Python that runs the engine.
pub fn rendezvous_requests(setup: &Setup) -> Vec<RendezvousRequest> {
    let python_of = match setup.engine {
        Engine::Vllm | Engine::VllmRay => "vllm",
        Engine::Sglang => "python3",
        Engine::Custom => return Vec::new(),
    };
    if setup.nodes.len() < 2 {
        return Vec::new();
    }
    let head = SocketAddr::new(setup.nodes[0].fabric_ip, setup.ports.api);
    setup
        .nodes
        .iter()
        .enumerate()
        .map(|(rank, n)| RendezvousRequest {
            node: n
                .name
                .parse()
                .expect("a [[node]] name, checked when the cluster file was read"),
            python_of: python_of.into(),
            rank: rank as u32,
            world: setup.nodes.len() as u32,
            master: head,
            fabric_if: n.fabric_if.clone(),
            timeout_ms: RENDEZVOUS_TIMEOUT_MS,
        })
        .collect()
}

/// The rendezvous that held ranks meet themselves
/// ([`crate::check::RendezvousBy::HeldRanks`]), in rank order (empty when
/// the probe has none): the same Gloo all-reduce, in each node's vLLM
/// worker, through a store the second node hosts on the engine's
/// rendezvous port. Not the head's: there the API server holds the API
/// port by then, and the engine's own store takes the rendezvous port
/// right after (a rank still closing the probe's store there could meet
/// the engine's peers in the wrong store). The second node binds neither
/// (vLLM runs it headless), and the reach round bound that port on every
/// node. So the second node is the store's rank 0 here; the others follow
/// in order, the head last.
pub fn held_rendezvous_requests(setup: &Setup) -> Vec<RendezvousRequest> {
    let mut reqs = rendezvous_requests(setup);
    let Some(host) = setup.nodes.get(1) else {
        return Vec::new();
    };
    let store = SocketAddr::new(host.fabric_ip, rendezvous_port(setup).0);
    let world = reqs.len() as u32;
    for r in &mut reqs {
        r.rank = (r.rank + world - 1) % world;
        r.master = store;
        r.timeout_ms = HELD_MEET_MS;
    }
    reqs
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
    // Every node looks up every fabric address: its own (c10d names its
    // sockets' local ends) and its peers'. A lone node makes no such
    // connection.
    let mut resolve: Vec<std::net::IpAddr> = Vec::new();
    if setup.nodes.len() > 1 {
        for n in &setup.nodes {
            if !resolve.contains(&n.fabric_ip) {
                resolve.push(n.fabric_ip);
            }
        }
    }
    setup
        .nodes
        .iter()
        .enumerate()
        .map(|(rank, node)| PreflightRequest {
            node: node
                .name
                .parse()
                .expect("a [[node]] name, checked when the cluster file was read"),
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
                    node: p
                        .name
                        .parse()
                        .expect("a [[node]] name, checked when the cluster file was read"),
                    addr: SocketAddr::new(p.fabric_ip, rdv),
                })
                .collect(),
            window_ms: REACH_WINDOW_MS,
            versions: version_probes(setup.engine)
                .into_iter()
                .chain(crate::unit::build_probe(setup))
                .collect(),
            rdma: node.rdma.as_ref().map(|r| RdmaNeed {
                device: r.device.clone(),
                gid_index: r.gid_index,
            }),
            image: setup.container.as_ref().map(|c| c.image.clone()),
            resolve: resolve.clone(),
            loader_link: setup.stream_weights,
        })
        .collect()
}

/// A verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Checked and fine.
    Pass,
    /// Not checked (does not apply, or nothing to check it on).
    Skip,
    /// The launch may start, but something looks wrong.
    Warn,
    /// The launch would fail: it does not start.
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
    /// Which check.
    pub check: &'static str,
    /// The node, or "*" for a comparison across nodes.
    pub node: String,
    /// How it went.
    pub verdict: Verdict,
    /// What was found.
    pub detail: String,
    /// What to do, for everything but a pass.
    pub fix: Option<String>,
}

/// The checks, in the order the table lists them.
pub const CHECKS: &[&str] = &[
    "agent",
    "weights",
    "loader",
    "containers",
    "image",
    "disk",
    "memory",
    "cache",
    "gpu",
    "fabric",
    "route",
    "reach",
    "resolver",
    "rendezvous",
    "links",
    "ports",
    "versions",
    "nccl",
    "unit",
    "rdma",
];

/// What every check reads: the setup and every node's answer.
pub(crate) struct Ctx<'a> {
    pub setup: &'a Setup,
    /// Every node's answer, in rank order (`Err`: the agent did not answer).
    pub answers: &'a [Result<NodeFacts, NodeError>],
    /// The nodes that answered, with their facts, in rank order.
    pub nodes: Vec<(&'a RankNode, &'a NodeFacts)>,
    /// The cluster file, for the `FILE:LINE` in the fixes.
    pub file: String,
}

/// The rows the checks append to.
#[derive(Default)]
pub(crate) struct Rows(Vec<Row>);

impl Rows {
    /// Appends one row.
    pub fn add(
        &mut self,
        check: &'static str,
        node: &str,
        verdict: Verdict,
        detail: String,
        fix: Option<String>,
    ) {
        self.0.push(Row {
            check,
            node: node.to_string(),
            verdict,
            detail,
            fix,
        })
    }

    /// The row of a probe that did not run (skip) or failed (fail, with `fix`).
    pub fn skip_or_fail(
        &mut self,
        check: &'static str,
        node: &str,
        p: &Probe<impl Sized>,
        fix: &str,
    ) {
        match p {
            Probe::Skipped(why) => {
                self.add(check, node, Verdict::Skip, format!("skipped: {why}"), None)
            }
            Probe::Failed(why) => self.add(
                check,
                node,
                Verdict::Fail,
                why.clone(),
                Some(fix.to_string()),
            ),
            Probe::Ok(_) => {}
        }
    }
}

/// One check: reads the facts, appends its rows.
type Check = fn(&Ctx, &mut Rows);

/// The checks, as [`CHECKS`] names them, in its order.
const JUDGES: [(&str, Check); 20] = [
    ("agent", checks::agent),
    ("weights", checks::weights),
    ("loader", checks::loader),
    ("containers", checks::containers),
    ("image", checks::image),
    ("disk", checks::disk),
    ("memory", checks::memory),
    ("cache", checks::cache),
    ("gpu", checks::gpu),
    ("fabric", checks::fabric),
    ("route", checks::route),
    ("reach", checks::reach),
    ("resolver", checks::resolver),
    ("rendezvous", checks::rendezvous),
    ("links", checks::links),
    ("ports", checks::ports),
    ("versions", checks::versions),
    ("nccl", checks::nccl),
    ("unit", checks::unit),
    ("rdma", checks::rdma),
];

/// The verdict on every node's answer (`Err`: the agent did not answer).
/// `answers` is in rank order, like `setup.nodes`.
pub fn judge(setup: &Setup, answers: &[Result<NodeFacts, NodeError>]) -> Vec<Row> {
    let ctx = Ctx::of(setup, answers);
    let mut rows = Rows::default();
    for (_, check) in JUDGES {
        check(&ctx, &mut rows);
    }
    let mut rows = rows.0;
    let order = |c: &str| CHECKS.iter().position(|x| *x == c).unwrap_or(CHECKS.len());
    rows.sort_by_key(|r| order(r.check));
    rows
}

impl<'a> Ctx<'a> {
    fn of(setup: &'a Setup, answers: &'a [Result<NodeFacts, NodeError>]) -> Self {
        Ctx {
            setup,
            answers,
            nodes: setup
                .nodes
                .iter()
                .zip(answers)
                .filter_map(|(n, a)| a.as_ref().ok().map(|f| (n, f)))
                .collect(),
            file: setup.path.display().to_string(),
        }
    }
}

/// The rows of one check (`name`, one of [`CHECKS`]) alone.
pub fn judge_only(setup: &Setup, answers: &[Result<NodeFacts, NodeError>], name: &str) -> Vec<Row> {
    let ctx = Ctx::of(setup, answers);
    let mut rows = Rows::default();
    for (_, check) in JUDGES.iter().filter(|(n, _)| *n == name) {
        check(&ctx, &mut rows);
    }
    rows.0
}

/// Node names grouped by the value each reported, values in order.
pub(crate) fn by_value<'a, K: Ord>(
    pairs: impl IntoIterator<Item = (K, &'a str)>,
) -> BTreeMap<K, Vec<&'a str>> {
    let mut m: BTreeMap<K, Vec<&'a str>> = BTreeMap::new();
    for (k, node) in pairs {
        m.entry(k).or_default().push(node);
    }
    m
}

/// "A on n1, n2; B on n3", each value shown by `show`, groups joined by `sep`.
pub(crate) fn spread<K>(
    groups: &BTreeMap<K, Vec<&str>>,
    show: impl Fn(&K) -> String,
    sep: &str,
) -> String {
    groups
        .iter()
        .map(|(k, ns)| format!("{} on {}", show(k), ns.join(", ")))
        .collect::<Vec<_>>()
        .join(sep)
}

/// The first 12 hex digits of a hash or commit.
pub(crate) fn short(h: &str) -> &str {
    &h[..h.len().min(12)]
}

/// Whether any row fails.
pub fn failed(rows: &[Row]) -> bool {
    rows.iter().any(|r| r.verdict == Verdict::Fail)
}

/// The table `xfer-launch check` prints, fitted to `width` columns (`None`:
/// no limit): a long detail or fix wraps onto indented lines, never cut.
pub fn render(rows: &[Row], width: Option<usize>) -> String {
    let wc = rows.iter().map(|r| r.check.len()).max().unwrap_or(5).max(5);
    let wn = rows.iter().map(|r| r.node.len()).max().unwrap_or(4).max(4);
    // A long detail or fix wraps under the detail column (or under a
    // shorter indent when the columns before it take half the width).
    let col = 4 + 2 + wc + 2 + wn + 2;
    let hang = match width {
        Some(w) if col > w / 2 => 8,
        _ => col,
    };
    let mut o = String::new();
    let _ = writeln!(o, "{:<4}  {:<wc$}  {:<wn$}  DETAIL", "", "CHECK", "NODE");
    for r in rows {
        let line = format!(
            "{:<4}  {:<wc$}  {:<wn$}  {}",
            r.verdict.label(),
            r.check,
            r.node,
            r.detail
        );
        let _ = writeln!(o, "{}", wrap(&line, width, hang));
        if let Some(fix) = &r.fix {
            let line = format!("{:<4}  {:<wc$}  {:<wn$}    fix: {fix}", "", "", "");
            let _ = writeln!(o, "{}", wrap(&line, width, hang + 4));
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
