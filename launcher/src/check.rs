//! `xfer-launch check`: ask every agent for its facts at once, judge them
//! ([`crate::preflight`]), and settle the model's path (`<COMMIT>` resolved
//! from the nodes' `refs/`).

use std::time::Duration;

use serde::Serialize;
use xfer::preflight::NodeFacts;
use xfer::wire::{Control, PROTOCOL_VERSION};

use crate::agents::{unexpected, Agents};
use crate::config::{Setup, COMMIT_PLACEHOLDER};
use crate::preflight::{self, Row};

/// How long an agent gets for its preflight (versions run the engine,
/// which imports torch: tens of seconds on a cold cache).
pub const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(90);

/// Everything a check found.
#[derive(Clone, Debug, Serialize)]
pub struct Checked {
    pub ok: bool,
    pub rows: Vec<Row>,
    /// Node name and its facts (or why there are none), in rank order.
    pub nodes: Vec<(String, Result<NodeFacts, String>)>,
    /// The model path with `<COMMIT>` resolved, when the nodes agree.
    pub model_path: String,
}

/// Runs the preflight on every node.
pub async fn run(setup: &Setup, agents: &Agents) -> Checked {
    let reqs = preflight::requests(setup);
    let answers = agents
        .ask_all(
            |i, _| Control::Preflight {
                version: PROTOCOL_VERSION,
                request: Box::new(reqs[i].clone()),
            },
            PREFLIGHT_TIMEOUT,
        )
        .await;
    let facts: Vec<Result<NodeFacts, String>> = answers
        .into_iter()
        .map(|a| match a? {
            Control::PreflightReport(f) => Ok(*f),
            other => Err(unexpected(&other)),
        })
        .collect();
    let rows = preflight::judge(setup, &facts);
    let model_path = resolved_path(setup, &facts);
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
    }
}

/// The model path, with the commit the nodes resolved (when they all
/// resolved the same one).
fn resolved_path(setup: &Setup, facts: &[Result<NodeFacts, String>]) -> String {
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

/// The setup with the model path settled by a check.
pub fn settled(setup: &Setup, checked: &Checked) -> Setup {
    let mut s = setup.clone();
    if !checked.model_path.contains(COMMIT_PLACEHOLDER) {
        s.model.path = checked.model_path.clone();
        s.model.unresolved = None;
    }
    s
}
