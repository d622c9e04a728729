//! The `weights` check: the model is complete on every node, and the
//! same model everywhere; and the `loader` check: under `stream_weights`,
//! the ranks can ask their agent about it as it lands.

use xfer_proto::admin::ModelState;
use xfer_proto::launch::Probe;
use xfer_proto::units::Bytes;

use crate::preflight::{by_value, short, spread, Ctx, Rows, Verdict};

/// `weights`: every node holds the model complete and verified, and all
/// hold the same one (one root hash, one commit).
pub fn weights(ctx: &Ctx, rows: &mut Rows) {
    let (setup, nodes, file) = (ctx.setup, &ctx.nodes, &ctx.file);
    // A Hub repo is synced by `deploy`; a folder by `xfer sync`.
    let sync_fix = |node: &str| {
        match &setup.model.repo {
        Some(_) => format!(
            "`xfer-launch deploy --cluster {file}` syncs it to every node that lacks it (and resumes a sync that stopped), then starts"
        ),
        None => format!(
            "sync the model to it: `xfer sync {} --cluster {file} --nodes {node}` (or its ORG/NAME), then check again",
            setup.model.path
        ),
    }
    };
    // "4.0 GiB of 16.0 GiB present", or nothing while the size is unknown.
    let present = |w: &xfer_proto::launch::WeightFacts| {
        if w.bytes_total == 0 {
            "its size not known yet".to_string()
        } else {
            format!(
                "{} of {} present",
                Bytes(w.bytes_present),
                Bytes(w.bytes_total)
            )
        }
    };
    for (n, f) in nodes {
        let w = &f.weights;
        let complete = w.state == Some(ModelState::Complete);
        let arriving = matches!(
            w.state,
            Some(ModelState::Syncing | ModelState::Queued | ModelState::Replacing)
        );
        if setup.stream_weights && arriving && !w.path.contains(crate::config::COMMIT_PLACEHOLDER) {
            rows.add(
                "weights",
                &n.name,
                Verdict::Pass,
                format!(
                    "{} is arriving ({}); stream_weights: up starts the ranks once its small files are verified, and each rank loads a shard once the agent has verified it",
                    w.path,
                    present(w)
                ),
                None,
            );
            continue;
        }
        if w.problems.is_empty() && complete && w.root.is_some() {
            rows.add(
                "weights",
                &n.name,
                Verdict::Pass,
                format!(
                    "{} complete and verified, root {}, {}",
                    w.path,
                    w.root.map(|r| r.short()).unwrap_or_default(),
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
                            "{} is {} ({})",
                            w.model.as_deref().unwrap_or(&w.path),
                            s.label(),
                            present(w)
                        ),
                        None => format!("{} is not held by this node's agent", w.path),
                    },
                );
            }
            what.dedup();
            rows.add(
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
            .filter_map(|(n, f)| f.weights.root.map(|r| (r, n.name.as_str()))),
    );
    if roots.len() > 1 {
        let (major, _) = roots
            .iter()
            .max_by_key(|(r, ns)| (ns.len(), ns.contains(&setup.nodes[0].name.as_str()), *r))
            .map(|(r, ns)| (*r, ns.clone()))
            .unwrap_or_default();
        let list = spread(&roots, |r| r.short(), ", root ");
        let odd: Vec<&str> = roots
            .iter()
            .filter(|(r, _)| **r != major)
            .flat_map(|(_, ns)| ns.iter().copied())
            .collect();
        rows.add(
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
        rows.add(
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
}

/// `loader`: under `stream_weights`, each node's ranks reach their agent:
/// its loader link answered the question a rank asks, on the socket the
/// agent gives its ranks.
pub fn loader(ctx: &Ctx, rows: &mut Rows) {
    let (setup, nodes) = (ctx.setup, &ctx.nodes);
    for (n, f) in nodes {
        let (verdict, detail, fix) = match &f.loader_link {
            _ if !setup.stream_weights => (
                Verdict::Skip,
                "skipped: stream_weights is off (the ranks load a complete model)".to_string(),
                None,
            ),
            Probe::Ok(line) => (Verdict::Pass, format!("the ranks reach the agent: {line}"), None),
            Probe::Skipped(why) => (Verdict::Skip, format!("skipped: {why}"), None),
            Probe::Failed(why) => (
                Verdict::Fail,
                format!("the ranks cannot ask the agent: {why}"),
                Some(format!(
                    "the loader asks its node's agent on this socket before it reads a shard: restart `xfer serve` on {} and read its first lines, or set stream_weights = false to load a complete model",
                    n.name
                )),
            ),
        };
        rows.add("loader", &n.name, verdict, detail, fix);
    }
}
