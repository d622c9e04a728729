//! The `agent` check: which nodes answered at all.

use crate::preflight::{Ctx, Rows, Verdict};

/// `agent`: every node's agent answered (a node that did not is failed
/// here and skipped by every other check).
pub fn agent(ctx: &Ctx, rows: &mut Rows) {
    let (setup, answers, file) = (ctx.setup, ctx.answers, &ctx.file);
    for (n, a) in setup.nodes.iter().zip(answers) {
        match a {
            Ok(f) => rows.add(
                "agent",
                &n.name,
                Verdict::Pass,
                format!("{} answered (host {}, xfer {})", n.agent, f.hostname, f.agent_version),
                None,
            ),
            Err(e) => rows.add(
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
}
