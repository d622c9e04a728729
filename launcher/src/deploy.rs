//! `deploy`, the day before `up`: the preflight runs first and must pass
//! but for the weights; then the model, when it is a Hub repo, is synced to
//! every launch node (pulled once by the head's agent and fanned out to
//! the others while it downloads; a node that already holds it verified
//! keeps it). `up` does the rest. Each phase is timed. Run again after an
//! interruption, the sync resumes from the agents' journals and a complete
//! model is not moved again.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use xfer::agent::sync::client::{sync, wait, SyncRequest, TransportChoice};
use xfer::config::auth::Credential;
use xfer::config::cluster::Cluster;
use xfer::util::progress::Progress;

use crate::agents::Agents;
use crate::check;
use crate::config::Setup;
use crate::preflight::{self, Verdict};

/// The check whose failure a sync can fix.
const WEIGHTS: &str = "weights";

/// Chunk size of the sync (the `xfer sync` default).
const CHUNK_SIZE: u64 = 4 << 20;

/// How the phases before `up` went.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phases {
    /// The first preflight, seconds.
    pub check_s: f64,
    /// The sync, seconds (0 when every node held the model).
    pub sync_s: f64,
    /// The nodes that lacked the model, by name.
    pub lacking: Vec<String>,
    /// The synced model's root, when a sync ran.
    pub root: Option<String>,
}

/// Why `deploy` stopped before `up`. Every variant is one line.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// A check a sync cannot fix failed.
    #[error("{failed} check(s) besides the weights failed (the table above says which, and the fix); fix them, then run deploy again")]
    ChecksFailed {
        /// How many rows failed.
        failed: usize,
    },
    /// Nodes lack a model that is a folder, not a repo.
    #[error("{nodes} lack {path}, which is a folder, not a Hub repo: deploy syncs only a model named by ORG/NAME; copy it with `xfer sync {path} --cluster {file} --nodes {nodes}` (or set model = \"ORG/NAME\"), then run deploy again")]
    NotARepo {
        /// The model's path.
        path: String,
        /// The nodes that lack it, comma separated.
        nodes: String,
        /// The cluster file.
        file: String,
    },
    /// The cluster file or key could not be read for the sync.
    #[error("cannot start the sync: {0}")]
    Setup(String),
    /// The sync failed.
    #[error("the sync of {repo} failed: {why}; once that is fixed, run deploy again (the nodes keep what they verified)")]
    Sync {
        /// What was synced (`hf://ORG/NAME@REV`).
        repo: String,
        /// Why it failed.
        why: String,
    },
}

/// The preflight, then the sync of the model to the launch nodes that
/// lack it. `progress` shows the sync.
pub async fn prepare(
    setup: &Setup,
    agents: &Agents,
    progress: &Progress,
) -> Result<Phases, DeployError> {
    let t0 = Instant::now();
    eprintln!("checking {} node(s) before the sync...", setup.nodes.len());
    let checked = check::run(setup, agents).await;
    eprint!(
        "{}",
        preflight::render(&checked.rows, crate::term::stderr_width())
    );
    let failing = |weights: bool| {
        checked
            .rows
            .iter()
            .filter(move |r| r.verdict == Verdict::Fail && (r.check == WEIGHTS) == weights)
    };
    let others = failing(false).count();
    if others > 0 {
        return Err(DeployError::ChecksFailed { failed: others });
    }
    let mut lacking: Vec<String> = failing(true).map(|r| r.node.clone()).collect();
    lacking.dedup();
    let mut phases = Phases {
        check_s: t0.elapsed().as_secs_f64(),
        lacking: lacking.clone(),
        ..Phases::default()
    };
    if lacking.is_empty() {
        eprintln!("every node holds the model verified: nothing to sync");
        return Ok(phases);
    }
    let Some(repo) = &setup.model.repo else {
        return Err(DeployError::NotARepo {
            path: setup.model.path.clone(),
            nodes: lacking.join(","),
            file: setup.path.display().to_string(),
        });
    };
    let source = format!("hf://{}@{}", repo.id, repo.revision);
    eprintln!(
        "syncing {source} to {} (lacking on {})",
        setup
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        lacking.join(", ")
    );
    let t1 = Instant::now();
    let cluster = Cluster::load(&setup.path).map_err(|e| DeployError::Setup(format!("{e:#}")))?;
    let cred =
        Arc::new(Credential::load(&setup.key).map_err(|e| DeployError::Setup(format!("{e:#}")))?);
    let req = SyncRequest {
        source: source.clone(),
        cwd: std::env::current_dir().unwrap_or_else(|_| "/".into()),
        // Every launch node, head first: the head pulls, and a node that
        // holds the model verified already takes nothing.
        nodes: setup.nodes.iter().map(|n| n.name.clone()).collect(),
        from: None,
        name: None,
        repo_type: repo.repo_type,
        chunk_size: CHUNK_SIZE,
        limit_rate: None,
        transport: TransportChoice::Auto,
        peers: None,
    };
    let failed = |why: String| DeployError::Sync {
        repo: source.clone(),
        why,
    };
    let spec = sync(&cluster, &cred, &req)
        .await
        .map_err(|e| failed(format!("{e:#}")))?;
    let root = wait(&cluster, &cred, &spec, progress)
        .await
        .map_err(|e| failed(format!("{e:#}")))?;
    progress.end();
    phases.sync_s = t1.elapsed().as_secs_f64();
    eprintln!(
        "{source}: complete on {} node(s) in {:.1}s, root {root}",
        spec.members.len(),
        phases.sync_s
    );
    phases.root = Some(root);
    Ok(phases)
}
