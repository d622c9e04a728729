//! `[launch] stream_weights`: the gate `up` holds before it starts the
//! ranks while the weights still land, and the environment it hands the
//! ranks' loader plugin (`launcher/python/xfer_vllm_loader`, vLLM's load
//! format `xfer`).
//!
//! The gate asks every node's agent for its status (the admin service, the
//! same answer `xfer status` prints) until each holds the model with one
//! root, the same on every node, either complete or receiving with every
//! small file (config, tokenizer, index: all but the weight files) verified
//! and under its final name. vLLM reads those at start; the shards are the
//! loader's to wait for, each asked of the node's agent again. So no rank
//! reads a byte the agent has not verified.
//!
//! A Hub repo pulled by the sync streams as a *draft*: its root is known
//! only once every file is sealed, so until then the draft's id names it
//! (the same on every node, and kept by each node's record once complete).
//! A snapshot's names are links the agents place with their blobs, listed
//! as pending until then.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use xfer_proto::admin::{AdminReply, AdminRequest, AgentStatus, ModelState};
use xfer_proto::hash::Hash;
use xfer_proto::launch::NodeFacts;

use crate::agents::{Agents, NodeError};
use crate::config::Setup;

/// Where the model is on one node: its name in the store and the model
/// path below that model's folder (`""` for the folder itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The model's name in the node's store.
    pub name: String,
    /// The model path below the model's folder.
    pub prefix: String,
}

/// `model_path` as a store name and prefix, given the store's root.
pub fn held(store_root: &str, model_path: &str) -> Option<Held> {
    let rest = model_path
        .strip_prefix(store_root.trim_end_matches('/'))?
        .strip_prefix('/')?;
    let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    (!name.is_empty()).then(|| Held {
        name: name.to_string(),
        prefix: prefix.trim_end_matches('/').to_string(),
    })
}

/// What names the model a node holds or receives: its root once known,
/// and the streamed draft it is (or holds every file of), if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ident {
    /// The manifest root, once known.
    pub root: Option<Hash>,
    /// The streamed draft's id ([`xfer_proto::admin::ModelStatus::draft`]).
    pub draft: Option<Hash>,
}

/// The identity every rank's loader checks: a root, or, while a streamed
/// Hub pull still lands somewhere, the draft's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Planned {
    /// Every node holds or receives this root.
    Root(Hash),
    /// Every node receives, or holds every file of, this draft.
    Draft(Hash),
}

impl Planned {
    fn show(&self) -> String {
        match self {
            Planned::Root(r) => format!("root {}", r.short()),
            Planned::Draft(d) => format!("streamed draft {}", d.short()),
        }
    }
}

/// Where one node stands for the gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stand {
    /// The small files are verified (or the whole model is), named so.
    Ready(Ident),
    /// Not yet: what the agent reports.
    Waiting(String),
}

/// One node's stand, from its agent's status.
pub fn stand(status: &AgentStatus, h: &Held) -> Stand {
    let Some(m) = status.models.iter().find(|m| m.name == h.name) else {
        return Stand::Waiting(format!(
            "{} is not held by the agent yet (no transfer of it has begun)",
            h.name
        ));
    };
    let said = || {
        let mut s = format!("{} is {}", h.name, m.state.label());
        if let Some(e) = &m.last_error {
            s += &format!(" (last error: {e})");
        }
        s
    };
    let ident = Ident {
        root: m.root,
        draft: m.draft,
    };
    let name = match (m.root, m.draft) {
        (Some(r), _) => format!("root {}", r.short()),
        (None, Some(d)) => format!("streamed draft {}", d.short()),
        (None, None) => return Stand::Waiting(format!("{}, its root not known yet", said())),
    };
    match m.state {
        ModelState::Complete | ModelState::Verifying if m.root.is_some() => Stand::Ready(ident),
        ModelState::Syncing => {
            let under = |p: &&String| {
                h.prefix.is_empty()
                    || p.strip_prefix(&h.prefix)
                        .is_some_and(|r| r.starts_with('/'))
            };
            let small: Vec<&String> = m
                .pending
                .iter()
                .filter(under)
                .filter(|p| !xfer_proto::repo::is_weight_file(p))
                .collect();
            if small.is_empty() {
                Stand::Ready(ident)
            } else {
                let more = small.len().saturating_sub(3);
                let mut list: Vec<&str> = small.iter().take(3).map(|s| s.as_str()).collect();
                let more = format!(" and {more} more");
                if small.len() > 3 {
                    list.push(&more);
                }
                Stand::Waiting(format!(
                    "{}, {name}; small files still arriving: {}",
                    said(),
                    list.join(", ")
                ))
            }
        }
        _ => Stand::Waiting(said()),
    }
}

/// What the nodes that stand ready agree on: `Ok(Some)` once all do, with
/// one root (preferred) or one draft; `Ok(None)` while they may still
/// converge (one node still streams the draft whose final root another
/// holds); `Err` with the two that never will.
pub fn agree(idents: &[Ident]) -> Result<Option<Planned>, (usize, usize)> {
    for (i, a) in idents.iter().enumerate() {
        for (j, b) in idents.iter().enumerate().skip(i + 1) {
            let roots_differ = matches!((a.root, b.root), (Some(x), Some(y)) if x != y);
            let drafts_differ = matches!((a.draft, b.draft), (Some(x), Some(y)) if x != y);
            let share_draft = matches!((a.draft, b.draft), (Some(x), Some(y)) if x == y);
            let share_root = matches!((a.root, b.root), (Some(x), Some(y)) if x == y);
            if (roots_differ && !share_draft) || (drafts_differ && !share_root) {
                return Err((i, j));
            }
        }
    }
    let first = idents.first().copied();
    if let Some(r) = first.and_then(|f| f.root) {
        if idents.iter().all(|x| x.root == Some(r)) {
            return Ok(Some(Planned::Root(r)));
        }
    }
    if let Some(d) = first.and_then(|f| f.draft) {
        if idents.iter().all(|x| x.draft == Some(d)) {
            return Ok(Some(Planned::Draft(d)));
        }
    }
    Ok(None)
}

/// What the gate found: the identity every node agrees on, and each
/// node's environment for its rank.
#[derive(Clone, Debug)]
pub struct Streamed {
    /// The root (or streamed draft) every node receives or holds.
    pub planned: Planned,
    /// Per node, in rank order: what the loader plugin reads.
    pub env: Vec<BTreeMap<String, String>>,
}

/// Why the gate did not open: `up` records it as the run's failure.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// A node has no facts: its agent did not answer the preflight.
    #[error("{node}: {why}")]
    NoFacts {
        /// The node.
        node: String,
        /// Why it has none.
        why: NodeError,
    },
    /// The model's path on a node is not under its agent's store.
    #[error("{node}: {path} is not under the agent's root {root}; stream_weights loads a model xfer delivers")]
    NotDelivered {
        /// The node.
        node: String,
        /// The model's path there.
        path: String,
        /// Its agent's store root.
        root: String,
    },
    /// Two nodes receive different models.
    #[error("the nodes receive different models at {path}: {a} on {a_node}, {b} on {b_node}; sync one model to every node, then run xfer-launch up again")]
    Differ {
        /// The model's path.
        path: String,
        /// What the first node receives.
        a: String,
        /// The first node.
        a_node: String,
        /// What the second node receives.
        b: String,
        /// The second node.
        b_node: String,
    },
    /// The deadline came first; each waiting node as `NODE: why`.
    #[error("the small files were not verified on every node in time: {}", .0.join("; "))]
    Timeout(Vec<String>),
}

/// How often the gate asks.
const POLL: Duration = Duration::from_millis(500);

/// Waits until every node stands ready with one root, or `deadline`.
pub async fn gate(
    setup: &Setup,
    agents: &Agents,
    facts: &[(String, Result<NodeFacts, NodeError>)],
    deadline: Instant,
) -> Result<Streamed, GateError> {
    let mut helds = Vec::new();
    for (node, f) in facts {
        let w = &f
            .as_ref()
            .map_err(|why| GateError::NoFacts {
                node: node.clone(),
                why: why.clone(),
            })?
            .weights;
        let h = held(&w.store_root, &w.path).ok_or_else(|| GateError::NotDelivered {
            node: node.clone(),
            path: w.path.clone(),
            root: w.store_root.to_string(),
        })?;
        helds.push(h);
    }
    let t0 = Instant::now();
    let mut last_note = t0;
    loop {
        let answers = agents
            .admin_all(&AdminRequest::Status, crate::agents::QUICK)
            .await;
        let stands: Vec<Stand> = answers
            .iter()
            .zip(&helds)
            .map(|(a, h)| match a {
                Ok(AdminReply::Status(s)) => stand(s, h),
                Ok(other) => Stand::Waiting(format!(
                    "the agent answered {other:?}; run the same xfer version on every node"
                )),
                Err(e) => Stand::Waiting(format!("the agent did not answer: {e}")),
            })
            .collect();
        let mut idents: Vec<(Ident, &str)> = Vec::new();
        let mut waiting = Vec::new();
        for (s, n) in stands.iter().zip(&setup.nodes) {
            match s {
                Stand::Ready(id) => idents.push((*id, &n.name)),
                Stand::Waiting(w) => waiting.push(format!("{}: {w}", n.name)),
            }
        }
        let ids: Vec<Ident> = idents.iter().map(|(i, _)| *i).collect();
        let show = |i: &Ident| match (i.root, i.draft) {
            (Some(r), _) => format!("root {}", r.short()),
            (None, Some(d)) => format!("streamed draft {}", d.short()),
            (None, None) => "nothing".into(),
        };
        match agree(&ids) {
            Err((a, b)) => {
                return Err(GateError::Differ {
                    path: setup.model.path.clone(),
                    a: show(&ids[a]),
                    a_node: idents[a].1.to_string(),
                    b: show(&ids[b]),
                    b_node: idents[b].1.to_string(),
                })
            }
            Ok(Some(planned)) if waiting.is_empty() => {
                let env = setup
                    .nodes
                    .iter()
                    .zip(&helds)
                    .map(|(n, h)| env_of(&n.name, h, planned))
                    .collect();
                eprintln!(
                    "  stream gate: small files verified on {} node(s), {}, after {:.1}s; starting the ranks while the weights land",
                    setup.nodes.len(),
                    planned.show(),
                    t0.elapsed().as_secs_f64()
                );
                return Ok(Streamed { planned, env });
            }
            Ok(Some(_)) => {}
            Ok(None) => waiting.push(format!(
                "the nodes hold {} (one still streams what another holds complete)",
                idents
                    .iter()
                    .map(|(i, n)| format!("{} on {n}", show(i)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
        if Instant::now() >= deadline {
            return Err(GateError::Timeout(waiting));
        }
        if last_note.elapsed() >= Duration::from_secs(10) || last_note == t0 {
            eprintln!("  stream gate: waiting: {}", waiting.join("; "));
            last_note = Instant::now();
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The loader plugin's environment on one node (the agent adds its
/// socket, `XFER_AGENT_SOCKET`, which the plugin asks).
fn env_of(node: &str, h: &Held, planned: Planned) -> BTreeMap<String, String> {
    let expect = match planned {
        Planned::Root(r) => ("XFER_EXPECT_ROOT", r),
        Planned::Draft(d) => ("XFER_EXPECT_DRAFT", d),
    };
    BTreeMap::from([
        (expect.0.to_string(), expect.1.to_hex()),
        ("XFER_MODEL_NAME".to_string(), h.name.clone()),
        ("XFER_MODEL_PREFIX".to_string(), h.prefix.clone()),
        ("XFER_NODE".to_string(), node.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::admin::ModelStatus;

    fn status(state: ModelState, root: Option<Hash>, pending: &[&str]) -> AgentStatus {
        AgentStatus {
            node: Some("n1".into()),
            data: None,
            root: "/r".into(),
            models: vec![ModelStatus {
                name: "tiny".into(),
                root,
                state,
                bytes_total: 10,
                bytes_held: 5,
                rate_bps: 0.0,
                eta_s: None,
                from_source: 0,
                from_peers: 0,
                last_error: None,
                repaired_files: 0,
                fallbacks: Vec::new(),
                pending: pending.iter().map(|s| s.to_string()).collect(),
                draft: None,
            }],
            jobs: Vec::new(),
            images: Vec::new(),
            platform: None,
        }
    }

    #[test]
    fn a_model_path_as_store_name_and_prefix() {
        let h = |p| held("/r/", p);
        assert_eq!(
            h("/r/tiny"),
            Some(Held {
                name: "tiny".into(),
                prefix: "".into()
            })
        );
        assert_eq!(
            h("/r/models--o--m/snapshots/abc/"),
            Some(Held {
                name: "models--o--m".into(),
                prefix: "snapshots/abc".into()
            })
        );
        assert_eq!(h("/elsewhere/tiny"), None);
        assert_eq!(h("/rr/tiny"), None);
    }

    #[test]
    fn ready_once_only_weights_are_pending() {
        let root = Hash([7; 32]);
        let h = held("/r", "/r/tiny").unwrap();
        let s = status(
            ModelState::Syncing,
            Some(root),
            &["config.json", "model-00001-of-00002.safetensors"],
        );
        match stand(&s, &h) {
            Stand::Waiting(w) => {
                assert!(w.contains("small files still arriving: config.json"), "{w}")
            }
            other => panic!("{other:?}"),
        }
        let s = status(
            ModelState::Syncing,
            Some(root),
            &["model-00001-of-00002.safetensors"],
        );
        let ready = Stand::Ready(Ident {
            root: Some(root),
            draft: None,
        });
        assert_eq!(stand(&s, &h), ready);
        assert_eq!(
            stand(&status(ModelState::Complete, Some(root), &[]), &h),
            ready
        );
    }

    #[test]
    fn no_root_a_snapshot_or_no_model_waits() {
        let h = held("/r", "/r/tiny").unwrap();
        assert!(matches!(
            stand(&status(ModelState::Syncing, None, &[]), &h),
            Stand::Waiting(w) if w.contains("root not known yet")
        ));
        assert!(matches!(
            stand(&status(ModelState::Replacing, Some(Hash([1; 32])), &[]), &h),
            Stand::Waiting(w) if w.contains("replacing")
        ));
        let other = held("/r", "/r/other").unwrap();
        assert!(matches!(
            stand(&status(ModelState::Complete, Some(Hash([1; 32])), &[]), &other),
            Stand::Waiting(w) if w.contains("not held by the agent yet")
        ));
    }

    #[test]
    fn a_streamed_snapshot_is_ready_by_its_draft_once_its_small_links_are_placed() {
        let d = Hash([5; 32]);
        let snap = held("/r", "/r/models--o--m/snapshots/abc").unwrap();
        let mut s = status(
            ModelState::Syncing,
            None,
            &[
                "blobs/1111",
                "snapshots/abc/config.json",
                "blobs/2222",
                "snapshots/abc/model.safetensors",
            ],
        );
        s.models[0].name = "models--o--m".into();
        s.models[0].draft = Some(d);
        // The config's link is still pending: not yet (a blob's own path,
        // outside the snapshot, does not count).
        assert!(matches!(stand(&s, &snap),
            Stand::Waiting(w) if w.contains("streamed draft") && w.contains("snapshots/abc/config.json")));
        s.models[0].pending = vec![
            "blobs/2222".into(),
            "snapshots/abc/model.safetensors".into(),
        ];
        assert_eq!(
            stand(&s, &snap),
            Stand::Ready(Ident {
                root: None,
                draft: Some(d)
            })
        );
    }

    #[test]
    fn nodes_agree_on_a_root_or_a_draft_and_a_conflict_is_named() {
        let (d, d2, r, r2) = (Hash([1; 32]), Hash([2; 32]), Hash([3; 32]), Hash([4; 32]));
        let id = |root, draft| Ident { root, draft };
        // All complete with one root: the root, though they share a draft.
        assert_eq!(
            agree(&[id(Some(r), Some(d)), id(Some(r), None)]),
            Ok(Some(Planned::Root(r)))
        );
        // One still streams the draft the other completed: the draft.
        assert_eq!(
            agree(&[id(None, Some(d)), id(Some(r), Some(d))]),
            Ok(Some(Planned::Draft(d)))
        );
        // One streams, the other got the final round alone (no draft): they
        // converge once the stream completes.
        assert_eq!(agree(&[id(None, Some(d)), id(Some(r), None)]), Ok(None));
        // Two drafts (two commits), or two roots with nothing shared: never.
        assert_eq!(agree(&[id(None, Some(d)), id(None, Some(d2))]), Err((0, 1)));
        assert_eq!(
            agree(&[id(Some(r), None), id(Some(r), None), id(Some(r2), None)]),
            Err((0, 2))
        );
        // Roots that differ but one draft in common: the final round of
        // one node is still running.
        assert_eq!(
            agree(&[id(Some(r), Some(d)), id(Some(r2), Some(d))]),
            Ok(Some(Planned::Draft(d)))
        );
    }
}
