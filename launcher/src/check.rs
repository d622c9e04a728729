//! `xfer-launch check`: ask every agent for its facts at once, judge them
//! ([`crate::preflight`]), and settle the model's path (`<COMMIT>` resolved
//! from the nodes' `refs/`).

use std::time::Duration;

use serde::Serialize;
use xfer_proto::launch::{LaunchReply, LaunchRequest};
use xfer_proto::launch::{NodeFacts, Probe};

use crate::agents::{unexpected, Agents, NodeError};
use crate::config::{Setup, COMMIT_PLACEHOLDER};
use crate::preflight::{self, Row};
use crate::unit::LaunchUnit;

/// How long an agent gets for its preflight (versions run the engine,
/// which imports torch: tens of seconds on a cold cache).
pub const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(90);

/// Everything a check found.
#[derive(Clone, Debug, Serialize)]
pub struct Checked {
    /// No row failed: the launch may start.
    pub ok: bool,
    /// The check table, in the order it prints.
    pub rows: Vec<Row>,
    /// Node name and its facts (or why there are none), in rank order.
    pub nodes: Vec<(String, Result<NodeFacts, NodeError>)>,
    /// The model path with `<COMMIT>` resolved, when the nodes agree.
    pub model_path: String,
    /// Every answering node's launch unit, in rank order.
    pub units: Vec<(String, LaunchUnit)>,
    /// Each launch node's compile caches snapshot root, in rank order
    /// (`[launch] caches`; all `None` without).
    pub caches: Vec<Option<xfer_proto::hash::Hash>>,
    /// How long each round of the check took, seconds.
    pub rounds: Rounds,
}

/// How long each round of a check took, seconds (`deploy --json` shows
/// them under `phases.check_rounds`).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Rounds {
    /// The quick facts, the ports first among them (before any node
    /// listens on one): agents, weights, disk, memory, ports, image.
    pub ports_s: f64,
    /// The slow facts (the engine's versions run its Python, which may
    /// import torch; the resolver waits for its lookups), beside the
    /// reach round.
    pub facts_s: f64,
    /// Every node listening and connecting at once, beside the engine's
    /// own rendezvous (its library's store).
    pub reach_s: f64,
    /// The verdict: the table, the launch unit, the compile caches.
    pub conclude_s: f64,
}

impl Rounds {
    /// The whole check, seconds: the quick round, then the slower of the
    /// slow facts and the probes beside them, then the verdict.
    pub fn total_s(&self) -> f64 {
        self.ports_s + self.facts_s.max(self.reach_s) + self.conclude_s
    }
}

/// A whole preflight still running ([`run`]'s future), for `deploy` to
/// hand to `up`, which starts the ranks held beside it.
pub type Running<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Checked> + 'a>>;

/// The rows of a light round (see [`light`]) that its facts decide for
/// sure and that a held rank's import could make worse (an unreachable
/// agent, a full disk, too little memory): when one fails, `up` starts
/// nothing held and waits for the whole preflight. (The ports are checked
/// at the verdict: the preflight's own probes listen on them meanwhile.)
const HOLD_GATE: &[&str] = &["agent", "disk", "memory"];

/// Why ranks may not start held on these light facts: the failing rows of
/// [`HOLD_GATE`], as `CHECK NODE` words (empty: they may).
pub fn hold_blockers(light: &Checked) -> Vec<String> {
    light
        .rows
        .iter()
        .filter(|r| r.verdict == preflight::Verdict::Fail && HOLD_GATE.contains(&r.check))
        .map(|r| format!("{} {}", r.check, r.node))
        .collect()
}

/// The facts a sync changes from every node, concluded as [`run`] does
/// (the model's path settled, the compile caches read): what `up` needs
/// to plan and start held ranks while the whole preflight still runs. Its
/// rows lack the slow probes, so only [`hold_blockers`] reads them; the
/// verdict is the whole preflight's. The ports are not asked: the
/// preflight's reach and rendezvous probes may be listening on them.
pub async fn light_checked(setup: &Setup, agents: &Agents) -> Checked {
    let mut reqs = preflight::requests(setup);
    for r in &mut reqs {
        r.ports.clear();
    }
    let facts = first_round(agents, &reqs, Round::Light, crate::agents::QUICK).await;
    conclude(setup, agents, facts).await
}

impl Checked {
    /// The one launch unit every node would start (`None`: they differ,
    /// or no node answered).
    pub fn unit(&self) -> Option<&LaunchUnit> {
        crate::unit::common(&self.units)
    }

    /// What every node's agent must still hold when it starts its rank:
    /// the model path and the one root the gate saw on every node.
    pub fn weight_gate(&self) -> Option<xfer_proto::launch::WeightGate> {
        let mut roots = self
            .nodes
            .iter()
            .map(|(_, f)| f.as_ref().ok().and_then(|f| f.weights.root));
        let first = roots.next()??;
        roots
            .all(|r| r == Some(first))
            .then(|| xfer_proto::launch::WeightGate {
                path: self.model_path.clone(),
                root: first,
            })
    }

    /// The line under the check table: the one unit ("launch unit ID:
    /// ..."), or each node's unit id when they differ.
    pub fn unit_line(&self) -> Option<String> {
        if self.units.is_empty() {
            return None;
        }
        Some(match self.unit() {
            Some(u) => format!("launch {}", u.summary()),
            None => format!(
                "launch units differ: {}",
                self.units
                    .iter()
                    .map(|(n, u)| format!("{} on {n}", u.id))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        })
    }

    /// The id of `[launch] image` the gate saw on every node (`None` when
    /// a node does not hold it or the nodes differ).
    pub fn image_id(&self) -> Option<xfer_proto::image::Digest> {
        let mut ids = self.nodes.iter().map(|(_, f)| match f {
            Ok(NodeFacts {
                containers: Probe::Ok(c),
                ..
            }) => match &c.image {
                Some(Probe::Ok(id)) => Some(*id),
                _ => None,
            },
            _ => None,
        });
        let first = ids.next()??;
        ids.all(|id| id == Some(first)).then_some(first)
    }
}

/// Who meets the preflight's rendezvous.
pub enum RendezvousBy {
    /// A probe each agent starts (its own snippet in the engine's Python).
    Probe,
    /// The ranks `up` starts held, if it does: it says so once they
    /// started, and the preflight then leaves the rendezvous to them. Each
    /// rank's vLLM worker meets the others in its own process, with the
    /// torch it imported already, before the engine's own distributed
    /// init, once released ([`HELD_RENDEZVOUS`]); `up` reads what they
    /// report ([`held_rendezvous`]). The probe would import torch again on
    /// every node: seconds of CPU taken from the engine's own start.
    /// Nothing said (the ranks were not started held): the agents' probe.
    HeldRanks(tokio::sync::oneshot::Receiver<()>),
}

/// `up`'s word to a preflight that leaves the rendezvous to held ranks
/// ([`RendezvousBy::HeldRanks`]): sent once they started held.
pub type HeldStarted = tokio::sync::oneshot::Sender<()>;

/// The rendezvous row of a preflight that left it to held ranks, until
/// they report.
pub const HELD_RENDEZVOUS: &str = "left to the held engine: its worker meets the other ranks before the engine's own distributed init, once released (reported below)";

/// What the held ranks of `run` report of the rendezvous they met
/// ([`RendezvousBy::HeldRanks`]), every node's within the time a worker
/// needs to start and meet the others; judged into `checked` (its
/// rendezvous facts and rows replaced). Once the engine `answered`, its
/// ranks met: a report is then asked for briefly, and a missing one is a
/// skip that names the likely cause (a loader plugin older than this
/// launcher), not a failure.
pub async fn held_rendezvous(
    setup: &Setup,
    agents: &Agents,
    run: &str,
    checked: &mut Checked,
    answered: bool,
) {
    let reqs = preflight::held_rendezvous_requests(setup);
    if reqs.is_empty() {
        return;
    }
    let wait_ms = match answered {
        true => 1_000,
        false => preflight::HELD_IMPORT_MS + preflight::HELD_MEET_MS,
    };
    let met = agents
        .ask_all(
            |_, _| LaunchRequest::HeldRendezvous {
                run: run.to_string(),
                timeout_ms: wait_ms,
            },
            Duration::from_millis(wait_ms) + crate::agents::QUICK,
        )
        .await;
    for ((_, f), m) in checked.nodes.iter_mut().zip(met) {
        if let Ok(f) = f {
            f.rendezvous = match (met_probe(m), answered) {
                (xfer_proto::launch::Probe::Failed(why), true) => {
                    xfer_proto::launch::Probe::Skipped(format!(
                        "the engine answered, so its ranks met, but its worker reported no rendezvous ({why}); is the engine's xfer loader plugin older than this launcher? reinstall it (docs/launcher.md)"
                    ))
                }
                (p, _) => p,
            };
        }
    }
    let facts: Vec<_> = checked.nodes.iter().map(|(_, f)| f.clone()).collect();
    let fresh = preflight::judge_only(setup, &facts, "rendezvous");
    let at = checked.rows.iter().position(|r| r.check == "rendezvous");
    checked.rows.retain(|r| r.check != "rendezvous");
    let at = at.unwrap_or(checked.rows.len()).min(checked.rows.len());
    checked.rows.splice(at..at, fresh);
    checked.ok = !preflight::failed(&checked.rows);
}

/// A node's answer to a rendezvous request, as the row's probe.
fn met_probe(m: Result<LaunchReply, NodeError>) -> xfer_proto::launch::Probe<u64> {
    match m {
        Ok(LaunchReply::Rendezvoused(p)) => p,
        Ok(other) => xfer_proto::launch::Probe::Failed(unexpected(&other).to_string()),
        Err(e) => xfer_proto::launch::Probe::Failed(e.to_string()),
    }
}

/// Runs the preflight on every node.
pub async fn run(setup: &Setup, agents: &Agents) -> Checked {
    run_with(setup, agents, RendezvousBy::Probe).await
}

/// Runs the preflight on every node, the rendezvous met `by` whom.
pub async fn run_with(setup: &Setup, agents: &Agents, by: RendezvousBy) -> Checked {
    let reqs = preflight::requests(setup);
    let t0 = std::time::Instant::now();
    // First the quick facts, the ports among them: they are checked before
    // any node listens on one (the reach round on its port, the
    // rendezvous on the engine's).
    let quick = first_round(agents, &reqs, Round::Light, PREFLIGHT_TIMEOUT).await;
    let ports_s = t0.elapsed().as_secs_f64();
    // Then, at once: the slow facts (versions, resolver), every node
    // listening and connecting, and the engine's own rendezvous (the store
    // on another port than the reach round's). They share nothing.
    let t1 = std::time::Instant::now();
    let slow = async {
        let f = first_round(agents, &reqs, Round::Slow, PREFLIGHT_TIMEOUT).await;
        (f, t1.elapsed().as_secs_f64())
    };
    let rendezvous = preflight::rendezvous_requests(setup);
    let reach_round = agents.ask_all(
        |i, _| {
            let (listen, peers, window_ms) = preflight::reach_of(&reqs[i]);
            LaunchRequest::Reach {
                listen,
                peers,
                window_ms,
            }
        },
        Duration::from_millis(preflight::REACH_WINDOW_MS) + crate::agents::QUICK,
    );
    let rendezvous_round = async {
        if rendezvous.is_empty() {
            return Vec::new();
        }
        if let RendezvousBy::HeldRanks(started) = by {
            if started.await.is_ok() {
                let held = xfer_proto::launch::Probe::Skipped(HELD_RENDEZVOUS.into());
                return rendezvous
                    .iter()
                    .map(|_| Ok(LaunchReply::Rendezvoused(held.clone())))
                    .collect();
            }
        }
        agents
            .ask_all(
                |i, _| LaunchRequest::Rendezvous(Box::new(rendezvous[i].clone())),
                Duration::from_millis(preflight::RENDEZVOUS_TIMEOUT_MS) + crate::agents::QUICK,
            )
            .await
    };
    let probes = async {
        let r = tokio::join!(reach_round, rendezvous_round);
        (r, t1.elapsed().as_secs_f64())
    };
    let ((mut facts, facts_s), ((reached, met), reach_s)) = tokio::join!(slow, probes);
    // The ports as the quick round found them; a node that did not answer
    // it has no facts at all.
    for (f, q) in facts.iter_mut().zip(quick) {
        match q {
            Ok(q) => {
                if let Ok(f) = f {
                    f.ports = q.ports;
                }
            }
            Err(e) => *f = Err(e),
        }
    }
    for (f, m) in facts.iter_mut().zip(met) {
        if let Ok(f) = f {
            f.rendezvous = met_probe(m);
        }
    }
    if rendezvous.is_empty() {
        for f in facts.iter_mut().flatten() {
            f.rendezvous = xfer_proto::launch::Probe::Skipped(match setup.engine {
                crate::config::Engine::Custom => {
                    "a custom engine may not use torch.distributed".into()
                }
                _ => "a single node has no peer to meet".into(),
            });
        }
    }
    for (f, r) in facts.iter_mut().zip(reached) {
        if let Ok(f) = f {
            match r {
                Ok(LaunchReply::Reached { listen, reach }) => {
                    f.listen = listen;
                    f.reach = reach;
                }
                Ok(other) => {
                    f.listen = xfer_proto::launch::Probe::Failed(unexpected(&other).to_string())
                }
                Err(e) => f.listen = xfer_proto::launch::Probe::Failed(e.to_string()),
            }
        }
    }
    let t2 = std::time::Instant::now();
    let mut checked = conclude(setup, agents, facts).await;
    checked.rounds = Rounds {
        ports_s,
        facts_s,
        reach_s,
        conclude_s: t2.elapsed().as_secs_f64(),
    };
    checked
}

/// What a first round asks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Everything but reachability, the rendezvous and the ports (the
    /// quick round's, asked before anything listens).
    Slow,
    /// The facts a sync changes (the weights, the disk, memory, the image,
    /// the ports), without the probes that take seconds: the engine's
    /// versions (its Python, which may import torch) and the resolver's
    /// lookups.
    Light,
}

/// Every node's answer to the first round of `reqs`, each within
/// `timeout`.
async fn first_round(
    agents: &Agents,
    reqs: &[xfer_proto::launch::PreflightRequest],
    round: Round,
    timeout: Duration,
) -> Vec<Result<NodeFacts, NodeError>> {
    let answers = agents
        .ask_all(
            |i, _| {
                let mut r = reqs[i].clone();
                r.listen_port = None;
                r.peers.clear();
                match round {
                    Round::Light => {
                        r.versions.clear();
                        r.resolve.clear();
                    }
                    Round::Slow => r.ports.clear(),
                }
                LaunchRequest::Preflight(Box::new(r))
            },
            timeout,
        )
        .await;
    answers
        .into_iter()
        .map(|a| match a? {
            LaunchReply::PreflightReport(f) => Ok(*f),
            other => Err(unexpected(&other)),
        })
        .collect()
}

/// The facts a sync changes, from every node, judged, for `deploy` to
/// decide what to move while the whole preflight runs beside it: only the
/// rows about the weights and the image are meaningful (the others lack
/// their slow probes). Node name and facts, in rank order, and the rows.
pub async fn light(
    setup: &Setup,
    agents: &Agents,
) -> (Vec<(String, Result<NodeFacts, NodeError>)>, Vec<Row>) {
    let reqs = preflight::requests(setup);
    let facts = first_round(agents, &reqs, Round::Light, crate::agents::QUICK).await;
    let rows = preflight::judge(setup, &facts);
    let nodes = setup
        .nodes
        .iter()
        .map(|n| n.name.clone())
        .zip(facts)
        .collect();
    (nodes, rows)
}

/// The preflight again, seconds after `before` passed in the same
/// command (`deploy`, after its sync): the facts a sync changes are asked
/// again and judged afresh, while the slow probes' answers (the engine's
/// versions, the resolver, reachability, the rendezvous) are `before`'s.
/// A node `before` has no facts for gets the whole preflight.
pub async fn recheck(setup: &Setup, agents: &Agents, before: &Checked) -> Checked {
    if before.nodes.len() != setup.nodes.len() || before.nodes.iter().any(|(_, f)| f.is_err()) {
        return run(setup, agents).await;
    }
    let reqs = preflight::requests(setup);
    let mut facts = first_round(agents, &reqs, Round::Light, crate::agents::QUICK).await;
    for (now, (_, was)) in facts.iter_mut().zip(&before.nodes) {
        if let (Ok(now), Ok(was)) = (now, was) {
            now.versions = was.versions.clone();
            now.resolver = was.resolver.clone();
            now.listen = was.listen.clone();
            now.reach = was.reach.clone();
            now.rendezvous = was.rendezvous.clone();
        }
    }
    conclude(setup, agents, facts).await
}

/// Judges `facts`, settles the model's path and reads the compile caches.
async fn conclude(
    setup: &Setup,
    agents: &Agents,
    facts: Vec<Result<NodeFacts, NodeError>>,
) -> Checked {
    let mut rows = preflight::judge(setup, &facts);
    let model_path = resolved_path(setup, &facts);
    let caches = crate::caches::stands(setup, agents).await;
    rows.extend(crate::caches::row(setup, &caches));
    let units = setup
        .nodes
        .iter()
        .zip(&facts)
        .zip(&caches)
        .filter_map(|((n, f), c)| {
            f.as_ref()
                .ok()
                .map(|f| (n.name.to_string(), LaunchUnit::of(setup, f).with_caches(*c)))
        })
        .collect();
    Checked {
        ok: !preflight::failed(&rows),
        rows,
        nodes: setup
            .nodes
            .iter()
            .map(|n| n.name.clone())
            .zip(facts)
            .collect(),
        model_path,
        units,
        rounds: Rounds::default(),
        caches,
    }
}

/// The model path, with the commit the nodes resolved (when they all
/// resolved the same one).
fn resolved_path(setup: &Setup, facts: &[Result<NodeFacts, NodeError>]) -> String {
    if !setup.model.path.contains(COMMIT_PLACEHOLDER) {
        return setup.model.path.clone();
    }
    let mut commits = facts
        .iter()
        .filter_map(|f| f.as_ref().ok().and_then(|f| f.weights.commit.clone()));
    match commits.next() {
        Some(c) if commits.all(|o| o == c) => setup.model.path.replace(COMMIT_PLACEHOLDER, &c),
        _ => setup.model.path.clone(),
    }
}

/// Why the model path keeps `<COMMIT>` (`xfer-launch plan` says so in
/// one line).
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// A node holds no ref of the model yet.
    #[error("{0} does not hold the model's ref yet")]
    NoRef(String),
    /// A node answered another kind of reply.
    #[error("{node}: {why}")]
    Unexpected {
        /// The node.
        node: String,
        /// Its answer's kind.
        why: NodeError,
    },
    /// A node did not answer.
    #[error("{node} did not answer: {why}")]
    Unanswered {
        /// The node.
        node: String,
        /// Why.
        why: NodeError,
    },
    /// The nodes resolve the revision to different commits.
    #[error("the nodes hold different commits ({})", .0.iter().map(|(n, c)| format!("{n}: {c}")).collect::<Vec<_>>().join(", "))]
    Differ(Vec<(String, String)>),
    /// The launch has no node.
    #[error("no node to ask")]
    NoNode,
}

/// The model path with `<COMMIT>` resolved by asking every agent about
/// the weights alone (no ports, versions, image or reachability), for
/// `xfer-launch plan`.
pub async fn resolve_commit(setup: &Setup, agents: &Agents) -> Result<String, CommitError> {
    let reqs = preflight::requests(setup);
    let answers = agents
        .ask_all(
            |i, _| {
                let mut r = reqs[i].clone();
                r.ports.clear();
                r.listen_port = None;
                r.peers.clear();
                r.versions.clear();
                r.rdma = None;
                r.image = None;
                r.resolve.clear();
                LaunchRequest::Preflight(Box::new(r))
            },
            crate::agents::QUICK,
        )
        .await;
    let mut commits: Vec<(String, String)> = Vec::new();
    for (node, a) in setup.nodes.iter().zip(answers) {
        let node = node.name.to_string();
        match a {
            Ok(LaunchReply::PreflightReport(f)) => match f.weights.commit {
                Some(c) => commits.push((node, c)),
                None => return Err(CommitError::NoRef(node)),
            },
            Ok(other) => {
                return Err(CommitError::Unexpected {
                    node,
                    why: unexpected(&other),
                })
            }
            Err(why) => return Err(CommitError::Unanswered { node, why }),
        }
    }
    match commits.first() {
        Some((_, c)) if commits.iter().all(|(_, o)| o == c) => {
            Ok(setup.model.path.replace(COMMIT_PLACEHOLDER, c))
        }
        Some(_) => Err(CommitError::Differ(commits)),
        None => Err(CommitError::NoNode),
    }
}

/// The setup with the model path settled by a check.
pub fn settled(setup: &Setup, checked: &Checked) -> Setup {
    let mut s = setup.clone();
    if !checked.model_path.contains(COMMIT_PLACEHOLDER) {
        s.model.path = checked.model_path.clone();
        s.model.unresolved = None;
    }
    s
}
