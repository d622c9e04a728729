//! The `resolver` check: how long each node's resolver took for the
//! lookups the engine's collective libraries will make (the agent's
//! bounded probe, `xfer::agent::preflight::resolver`).
//!
//! torch.distributed's c10d reverse-looks-up the address of every socket
//! it opens (`getnameinfo`, to name it in logs): the store's client the
//! master's fabric address, the store's server every rank's. A lookup that
//! *answers* slowly (a first name server that does not answer, a second
//! that does) is paid again on every connection, by every torch; one that
//! *fails* (no name server answers: `EAI_AGAIN`, vLLM's `err=-3`) is paid
//! on every connection before torch 2.9, and once per process from 2.9 on
//! (pytorch#159596), which with vLLM's several processes per node is still
//! once per process at every start. Gloo and Python's `socket.getfqdn`
//! look up the host name.
//!
//! Verdicts, per node:
//! - **fail** when a reverse lookup took more than [`SLOW_MS`] and the
//!   engine would clearly pay it on every connection: it answered (any
//!   torch), or the node's torch is older than 2.9. The launch would still
//!   start, but every rendezvous, every rank's store traffic and every
//!   restart would wait it out, which is the 20 s start the issue measured
//!   and a timeout risk; the fix is one command's output in `/etc/hosts`,
//!   so refusing is cheaper than a slow launch nobody explains;
//! - **warn** when a lookup took more than [`SLOW_MS`] otherwise (it
//!   failed or was still waiting at the probe's cap with torch 2.9 or
//!   later, or torch's version is unknown; or the host name's forward
//!   lookup): each process pays it once as it starts;
//! - **pass** when every lookup took at most [`SLOW_MS`];
//! - **skip** when the node was not asked (a single node) or its agent
//!   does not probe.

use std::collections::BTreeMap;
use std::net::IpAddr;

use xfer_proto::launch::{Lookup, LookupAnswer, NodeFacts, Probe, ResolverFacts};

use crate::preflight::{Ctx, Rows, Verdict};

/// A lookup slower than this is reported (a resolver that answers takes
/// milliseconds).
pub const SLOW_MS: u64 = 1_000;

/// The first torch whose c10d stops reverse lookups after one fails.
const TORCH_ASKS_ONCE: (u32, u32) = (2, 9);

/// `resolver`: every node's lookups of the fabric addresses and of its
/// host name, each within [`SLOW_MS`].
pub fn resolver(ctx: &Ctx, rows: &mut Rows) {
    let owner: BTreeMap<IpAddr, &str> = ctx
        .setup
        .nodes
        .iter()
        .map(|n| (n.fabric_ip, n.name.as_str()))
        .collect();
    for (n, f) in &ctx.nodes {
        match &f.resolver {
            Probe::Ok(r) => judge_node(ctx, rows, &n.name, n.fabric_ip, f, r, &owner),
            Probe::Skipped(why) => rows.add(
                "resolver",
                &n.name,
                Verdict::Skip,
                format!("skipped: {why}"),
                None,
            ),
            Probe::Failed(why) => rows.add(
                "resolver",
                &n.name,
                Verdict::Warn,
                format!("the lookups could not be timed: {why}"),
                Some(format!(
                    "time them by hand on {}: `getent hosts ADDRESS` for each fabric address",
                    n.name
                )),
            ),
        }
    }
}

/// The row of one node that answered.
fn judge_node(
    ctx: &Ctx,
    rows: &mut Rows,
    node: &str,
    own_ip: IpAddr,
    f: &NodeFacts,
    r: &ResolverFacts,
    owner: &BTreeMap<IpAddr, &str>,
) {
    let slow = |l: &&Lookup| l.ms > SLOW_MS || l.answer == LookupAnswer::Pending;
    let slow_reverse: Vec<&Lookup> = r.reverse.iter().filter(slow).collect();
    let slow_forward = slow(&&r.forward);
    if slow_reverse.is_empty() && !slow_forward {
        let worst = r.reverse.iter().map(|l| l.ms).max().unwrap_or(0);
        rows.add(
            "resolver",
            node,
            Verdict::Pass,
            format!(
                "host name {} in {} ms; {} fabric address{} looked up in at most {worst} ms",
                r.forward.query,
                r.forward.ms,
                r.reverse.len(),
                if r.reverse.len() == 1 { "" } else { "es" }
            ),
            None,
        );
        return;
    }
    let torch = torch_version(f);
    let mut said = Vec::new();
    let mut fixes = Vec::new();
    let mut verdict = Verdict::Warn;
    if !slow_reverse.is_empty() {
        let answered = slow_reverse
            .iter()
            .any(|l| matches!(l.answer, LookupAnswer::Found(_)));
        let old_torch = torch.as_ref().is_some_and(|(v, _)| *v < TORCH_ASKS_ONCE);
        let cost = if answered {
            verdict = Verdict::Fail;
            "it answers, slowly, so torch.distributed waits it out on every connection".to_string()
        } else if old_torch {
            verdict = Verdict::Fail;
            format!(
                "torch {} waits it out on every connection (2.9 and later only once per process)",
                torch.map(|(_, s)| s).unwrap_or_default()
            )
        } else {
            "every engine process waits it out once as it starts".to_string()
        };
        let each = slow_reverse
            .iter()
            .map(|l| {
                let whose = l
                    .query
                    .parse::<IpAddr>()
                    .ok()
                    .and_then(|ip| owner.get(&ip))
                    .map(|o| format!(" ({o})"))
                    .unwrap_or_default();
                format!("{}{whose} {}", l.query, took(l, r.cap_ms))
            })
            .collect::<Vec<_>>()
            .join(", ");
        said.push(format!("reverse lookup of {each}: {cost}"));
        fixes.push(format!(
            "add the fabric addresses to /etc/hosts on every node: run `xfer-launch hosts {}` to print the lines",
            ctx.file
        ));
    }
    if slow_forward {
        said.push(format!(
            "forward lookup of the host name {} {}: Gloo and Python's socket.getfqdn wait it out",
            r.forward.query,
            took(&r.forward, r.cap_ms)
        ));
        fixes.push(format!(
            "add `{own_ip} {}` to /etc/hosts on {node}",
            r.forward.query
        ));
    }
    rows.add(
        "resolver",
        node,
        verdict,
        said.join("; "),
        Some(fixes.join("; ")),
    );
}

/// "took 1.2 s", "took 1.1 s and failed: WHY", "got no answer within 1.5 s".
fn took(l: &Lookup, cap_ms: u64) -> String {
    let secs = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
    match &l.answer {
        LookupAnswer::Pending => format!("got no answer within {}", secs(cap_ms)),
        LookupAnswer::Found(_) => format!("took {}", secs(l.ms)),
        LookupAnswer::Error(why) => format!("took {} and failed: {why}", secs(l.ms)),
    }
}

/// The node's torch version, as (major, minor) and as reported.
fn torch_version(f: &NodeFacts) -> Option<((u32, u32), String)> {
    let v = f.versions.iter().find(|v| v.what == "torch")?;
    let Probe::Ok(s) = &v.version else {
        return None;
    };
    let mut parts = s.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some(((major, minor), s.clone()))
}
