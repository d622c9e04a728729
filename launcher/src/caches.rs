//! Compile caches (`[launch] caches`): where each node's engine keeps
//! them, which nodes hold the verified snapshot, its delivery before the
//! ranks start, and the head's offer after its first successful start.
//!
//! On a node whose agent's root is `R`, the engine's variable of each
//! kind (`VLLM_CACHE_ROOT`, ...) names the live folder
//! `R/.xfer-caches/<name>/<kind>`, which the engine writes as it runs; the
//! snapshot `R/<name>` is an ordinary model, synced and verified by the
//! agents, and never written by an engine. `<name>` is
//! [`snapshot_name`]: `xfer-caches-` and 12 hex digits of the engine and
//! the kinds, so no entry of the cluster file becomes a path.
//!
//! - **Stands** ([`stands`]): each node's agent status says whether it
//!   holds the snapshot complete, and with which root; the `caches` row
//!   passes when every node holds one root and warns otherwise (a cold
//!   cache makes a slower start, not a wrong one).
//! - **Delivery** ([`deliver`]): before the ranks start, the nodes that
//!   lack the root the head holds (or, without one on the head, the root
//!   most nodes hold) get it by `xfer sync <R>/<name> --from HOLDER`; each
//!   rank's spec carries a [`CacheGate`] for the nodes holding that root,
//!   and its agent copies the snapshot into the live folder, hashing every
//!   file again, before the rank starts.
//! - **Offer** ([`offer`]): once `up` is ready, when some node was cold,
//!   the head's live folder is synced to every launch node (the head's own
//!   copy placed from its disk) as the new snapshot.

use std::path::PathBuf;
use std::sync::Arc;

use xfer::client::sync::{sync, SyncRequest, TransportChoice};
use xfer::client::wait::wait;
use xfer::config::auth::Credential;
use xfer::config::cluster::Cluster;
use xfer::util::progress::Progress;
use xfer_proto::admin::{AdminReply, AdminRequest, ModelState};
use xfer_proto::compile_cache::{self, CacheGate, LIVE_DIR};
use xfer_proto::hash::Hash;
use xfer_proto::repo::RepoType;

use crate::agents::Agents;
use crate::config::{RankNode, Setup};
use crate::preflight::{Row, Verdict};

/// The check's name in the table.
pub const CHECK: &str = "caches";

/// The snapshot's model name for this launch, when it has caches.
pub fn snapshot_name(setup: &Setup) -> Option<String> {
    (!setup.caches.is_empty())
        .then(|| compile_cache::snapshot_name(setup.engine.as_str(), &setup.caches))
}

/// Each kind with its variable and its live folder on `node`.
pub fn live_dirs(setup: &Setup, node: &RankNode) -> Vec<(String, &'static str, PathBuf)> {
    let Some(name) = snapshot_name(setup) else {
        return Vec::new();
    };
    setup
        .caches
        .iter()
        .filter_map(|k| {
            let var = compile_cache::variable(k)?;
            Some((k.clone(), var, node.root.join(LIVE_DIR).join(&name).join(k)))
        })
        .collect()
}

/// Each launch node's snapshot root, in rank order: `Some` when its agent
/// reports the snapshot complete.
pub async fn stands(setup: &Setup, agents: &Agents) -> Vec<Option<Hash>> {
    let Some(name) = snapshot_name(setup) else {
        return vec![None; setup.nodes.len()];
    };
    agents
        .admin_all(&AdminRequest::Status, crate::agents::QUICK)
        .await
        .into_iter()
        .map(|a| match a {
            Ok(AdminReply::Status(s)) => s
                .models
                .iter()
                .find(|m| m.name == name && m.state == ModelState::Complete)
                .and_then(|m| m.root),
            _ => None,
        })
        .collect()
}

/// The `caches` row: one root on every node passes; anything else warns.
pub fn row(setup: &Setup, roots: &[Option<Hash>]) -> Option<Row> {
    let name = snapshot_name(setup)?;
    let mut by_root: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for (n, r) in setup.nodes.iter().zip(roots) {
        let key = r.map_or("none".to_string(), |r| r.short().to_string());
        by_root.entry(key).or_default().push(&n.name);
    }
    let spread = by_root
        .iter()
        .map(|(r, ns)| format!("{r} on {}", ns.join(", ")))
        .collect::<Vec<_>>()
        .join("; ");
    let one = by_root.len() == 1 && !by_root.contains_key("none");
    Some(Row {
        check: CHECK,
        node: "*".into(),
        verdict: if one { Verdict::Pass } else { Verdict::Warn },
        detail: if one {
            format!("compile caches {name} ({}) verified with one root on every node: {spread}", setup.caches.join(", "))
        } else {
            format!("compile caches {name} ({}) differ across nodes (a cold cache starts slower, not wrong): {spread}", setup.caches.join(", "))
        },
        fix: (!one).then(|| {
            "nothing to do: up delivers the head's snapshot to the nodes that lack it before the ranks start, and offers the head's caches after its first successful start".to_string()
        }),
    })
}

/// The root every node should run with: the head's, else the one most
/// nodes hold (`None`: no node holds a snapshot).
fn chosen(roots: &[Option<Hash>]) -> Option<(usize, Hash)> {
    if let Some(Some(r)) = roots.first() {
        return Some((0, *r));
    }
    let mut best: Option<(usize, Hash, usize)> = None;
    for (i, r) in roots.iter().enumerate() {
        let Some(r) = r else { continue };
        let count = roots.iter().filter(|o| **o == Some(*r)).count();
        if best.is_none_or(|(_, _, c)| count > c) {
            best = Some((i, *r, count));
        }
    }
    best.map(|(i, r, _)| (i, r))
}

/// Why a cache sync did not happen. One line.
#[derive(Debug, thiserror::Error)]
pub enum CacheSyncError {
    /// The cluster file or key could not be read again.
    #[error("cannot start the compile caches' sync: {0}")]
    Setup(String),
    /// The sync failed.
    #[error("the compile caches' sync from {from} failed: {why}; the ranks run with what each node has (a cold cache is slower, not wrong)")]
    Sync {
        /// The source node.
        from: String,
        /// Why.
        why: String,
    },
}

/// Syncs `source` (a folder on `from`) to `nodes` as `name`; the root.
async fn sync_to(
    setup: &Setup,
    source: String,
    from: &str,
    nodes: Vec<String>,
    name: &str,
    progress: &Progress,
) -> Result<Hash, CacheSyncError> {
    let cluster =
        Cluster::load(&setup.path).map_err(|e| CacheSyncError::Setup(format!("{e:#}")))?;
    let cred = Arc::new(
        Credential::load(&setup.key).map_err(|e| CacheSyncError::Setup(format!("{e:#}")))?,
    );
    let req = SyncRequest {
        source,
        cwd: PathBuf::from("/"),
        nodes,
        from: Some(from.to_string()),
        name: Some(name.to_string()),
        repo_type: RepoType::Model,
        chunk_size: xfer_proto::manifest::ChunkSize::Auto,
        limit_rate: None,
        transport: TransportChoice::Auto,
        peers: None,
        registry: Default::default(),
        give_up: Default::default(),
        pin: None,
    };
    let failed = |why: String| CacheSyncError::Sync {
        from: from.to_string(),
        why,
    };
    let spec = sync(&cluster, &cred, &req)
        .await
        .map_err(|e| failed(format!("{e:#}")))?;
    let root = wait(&cluster, &cred, &spec, progress)
        .await
        .map_err(|e| failed(format!("{e:#}")))?;
    progress.end();
    Hash::from_hex(&root).map_err(|_| CacheSyncError::Sync {
        from: from.to_string(),
        why: format!("the agents reported root {root:?}, not a hash"),
    })
}

/// Before the ranks start: delivers the chosen snapshot to the nodes that
/// lack it, and returns each node's gate (`None` for a node that starts
/// cold). `roots` are [`stands`]' answers, updated in place.
pub async fn deliver(
    setup: &Setup,
    roots: &mut [Option<Hash>],
    progress: &Progress,
) -> (Vec<Option<CacheGate>>, Option<CacheSyncError>) {
    let none = vec![None; setup.nodes.len()];
    let Some(name) = snapshot_name(setup) else {
        return (none, None);
    };
    let Some((from, root)) = chosen(roots) else {
        eprintln!("compile caches {name}: no node holds them yet; the ranks start cold and the head offers its caches once ready");
        return (none, None);
    };
    let lacking: Vec<String> = setup
        .nodes
        .iter()
        .zip(roots.iter())
        .filter(|(_, r)| **r != Some(root))
        .map(|(n, _)| n.name.clone())
        .collect();
    let mut error = None;
    if !lacking.is_empty() {
        let src = &setup.nodes[from];
        eprintln!(
            "compile caches {name}: delivering root {} from {} to {}",
            root.short(),
            src.name,
            lacking.join(", ")
        );
        let source = src.root.join(&name).display().to_string();
        match sync_to(setup, source, &src.name, lacking.clone(), &name, progress).await {
            Ok(got) if got == root => {
                for (n, r) in setup.nodes.iter().zip(roots.iter_mut()) {
                    if lacking.contains(&n.name) {
                        *r = Some(root);
                    }
                }
            }
            Ok(got) => {
                error = Some(CacheSyncError::Sync {
                    from: src.name.clone(),
                    why: format!("it delivered root {}, not {}", got.short(), root.short()),
                })
            }
            Err(e) => error = Some(e),
        }
    }
    let gates = roots
        .iter()
        .map(|r| {
            (*r == Some(root)).then(|| CacheGate {
                name: name.clone(),
                root,
                kinds: setup.caches.clone(),
            })
        })
        .collect();
    (gates, error)
}

/// After the first successful start: the head's live caches synced to
/// every launch node as the snapshot (its root), when any node started
/// without the one root (`roots`, as the ranks started).
pub async fn offer(
    setup: &Setup,
    roots: &[Option<Hash>],
    progress: &Progress,
) -> Result<Option<Hash>, CacheSyncError> {
    let Some(name) = snapshot_name(setup) else {
        return Ok(None);
    };
    let first = roots.first().copied().flatten();
    if first.is_some() && roots.iter().all(|r| *r == first) {
        return Ok(None);
    }
    let head = &setup.nodes[0];
    let source = head.root.join(LIVE_DIR).join(&name);
    eprintln!(
        "compile caches {name}: offering {}'s ({}) to every node",
        head.name,
        source.display()
    );
    let nodes = setup.nodes.iter().map(|n| n.name.clone()).collect();
    let root = sync_to(
        setup,
        source.display().to_string(),
        &head.name,
        nodes,
        &name,
        progress,
    )
    .await?;
    eprintln!(
        "compile caches {name}: root {} verified on {} node(s)",
        root.short(),
        setup.nodes.len()
    );
    Ok(Some(root))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{setup, COMMIT};

    fn with_caches(caches: &str) -> Setup {
        setup(&format!(
            "engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\"\ncaches = {caches}"
        ))
    }

    #[test]
    fn each_kind_lives_under_its_nodes_root_and_the_plan_points_the_engine_there() {
        let s = with_caches("[\"vllm\", \"triton\"]");
        let name = snapshot_name(&s).unwrap();
        let dirs = live_dirs(&s, &s.nodes[1]);
        assert_eq!(dirs.len(), 2);
        for (kind, var, dir) in &dirs {
            assert!(dir.starts_with(s.nodes[1].root.join(LIVE_DIR).join(&name)));
            assert!(dir.ends_with(kind));
            let plan = crate::plan::plan(&s);
            assert_eq!(plan.ranks[1].env[*var], dir.display().to_string());
        }
        assert!(snapshot_name(&with_caches("[]")).is_none());
    }

    #[test]
    fn the_head_root_wins_and_a_node_without_one_is_a_warning() {
        let (a, b) = (Hash([1; 32]), Hash([2; 32]));
        assert_eq!(chosen(&[Some(a), Some(b), Some(b)]), Some((0, a)));
        assert_eq!(chosen(&[None, Some(b), Some(a), Some(b)]), Some((1, b)));
        assert_eq!(chosen(&[None, None]), None);
        let s = with_caches("[\"vllm\"]");
        let r = row(&s, &[Some(a), None]).unwrap();
        assert_eq!(r.verdict, Verdict::Warn);
        assert!(r.detail.contains("none on spark-b"), "{}", r.detail);
        assert_eq!(row(&s, &[Some(a), Some(a)]).unwrap().verdict, Verdict::Pass);
    }
}
