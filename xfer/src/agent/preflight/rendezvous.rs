//! The rendezvous probe: proof that the engine's ranks will meet, not
//! just that TCP connects. Every node runs, at once, what a rank does at
//! init reduced to its core: `torch.distributed` with Gloo, through a TCP
//! store on the head's fabric address, pinned to the fabric interface
//! (`GLOO_SOCKET_IFNAME`), then one all-reduce whose sum every rank checks.
//! It runs in the engine's own Python (the interpreter of its launcher
//! script), with the agent's own snippet: nothing the launcher sends is
//! executed.
//!
//! A wrong interface, a firewall that lets the store's port through but
//! not Gloo's own connections, or a host name that resolves to loopback
//! show up here in seconds, where the engine would hang after loading.
//!
//! The probe does not wait out the resolver. c10d reverse-looks-up the
//! address of every socket it opens (`getnameinfo` in `formatSockAddr`,
//! only to name it in logs); with a resolver that does not answer, each
//! such lookup took the resolver's whole timeout (2.04 s for an all-reduce
//! of 2 ranks behind a resolver with `timeout:2 attempts:1`, 40 ms with the
//! fix below, torch 2.13 on a network namespace; 20 s on the issue's
//! nodes). The probe runs with `RES_OPTIONS=attempts:0`: glibc then makes
//! no DNS query at all and fails a lookup that `/etc/hosts` does not
//! answer at once, with `EAI_AGAIN`, after which c10d (torch 2.9 and
//! later) stops asking and logs addresses. What the resolver costs the
//! engine itself is measured apart, bounded, by the preflight's resolver
//! probe (`super::resolver`), and judged in the launcher's `resolver` row.

use std::time::Duration;

use super::versions::{python_of, run_to_last_line, LastLine};
use super::{Probe, RendezvousRequest};

/// The snippet: argv is MASTER RANK WORLD TIMEOUT_S; prints the
/// milliseconds from the first store contact to the all-reduce's end.
const GLOO_ALL_REDUCE: &str = r#"
import datetime, sys, time
master, rank, world, timeout_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    sys.exit(f"no torch.distributed in {sys.executable}: {e}")
t0 = time.monotonic()
dist.init_process_group("gloo", init_method="tcp://" + master, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=timeout_s))
x = torch.tensor([float(rank + 1)])
dist.all_reduce(x)
want = world * (world + 1) / 2
if x.item() != want:
    sys.exit(f"the all-reduce gave {x.item()}, not {want}: a rank of another launch joined")
dist.barrier()
dist.destroy_process_group()
print(int((time.monotonic() - t0) * 1000))
"#;

/// Runs this node's part of the rendezvous.
pub async fn probe(req: &RendezvousRequest) -> Probe<u64> {
    let Some(mut argv) = python_of(&req.python_of) else {
        return Probe::Skipped(format!(
            "{}: not found on the agent's PATH, or not a Python script",
            req.python_of
        ));
    };
    let timeout = bounded(req.timeout_ms);
    let inner = inner_timeout(req.timeout_ms);
    argv.extend([
        "-c".into(),
        GLOO_ALL_REDUCE.into(),
        req.master.to_string(),
        req.rank.to_string(),
        req.world.to_string(),
        format!("{:.1}", inner.as_secs_f64()),
    ]);
    let env = [
        ("GLOO_SOCKET_IFNAME".to_string(), req.fabric_if.clone()),
        ("TORCH_CPP_LOG_LEVEL".to_string(), "ERROR".to_string()),
        // No DNS query: see the header. The store is at an address, so
        // the probe needs no name.
        ("RES_OPTIONS".to_string(), "attempts:0".to_string()),
    ];
    match run_to_last_line(&argv, &env, timeout).await {
        LastLine::Line(line) => match line.parse::<u64>() {
            Ok(ms) => Probe::Ok(ms),
            Err(_) => Probe::Failed(format!("the Gloo probe printed {line:?}, not a time")),
        },
        // The snippet's own exit when the engine's Python has no torch.
        LastLine::Exited { last, why, .. } if no_torch(&last) => Probe::Skipped(shorten(&why)),
        LastLine::Exited { why, .. } | LastLine::Failed(why) => Probe::Failed(format!(
            "through the store at {}: {}",
            req.master,
            shorten(&why)
        )),
        LastLine::NotFound(why) => Probe::Skipped(why),
    }
}

/// A request's timeout, within reason.
fn bounded(timeout_ms: u64) -> Duration {
    Duration::from_millis(timeout_ms.clamp(1_000, 600_000))
}

/// torch's own timeout for a probe of `timeout_ms`: shorter, so that
/// torch says what it waited for; the kill after it ends a hang it does
/// not notice.
pub fn inner_timeout(timeout_ms: u64) -> Duration {
    bounded(timeout_ms)
        .saturating_sub(Duration::from_secs(3))
        .max(Duration::from_secs(1))
}

/// What a held rank reported of the rendezvous it met through the store
/// at `store` ([`xfer_proto::launch::LaunchRequest::HeldRendezvous`]): the loader plugin writes
/// one line, `ok MS` or `failed WHY`.
pub fn held_outcome(report: &str, store: std::net::SocketAddr) -> Probe<u64> {
    let line = report.lines().next().unwrap_or("").trim();
    match line.split_once(' ') {
        Some(("ok", ms)) => match ms.trim().parse::<u64>() {
            Ok(ms) => Probe::Ok(ms),
            Err(_) => Probe::Failed(format!("the held rank reported {line:?}, not a time")),
        },
        Some(("failed", why)) => Probe::Failed(format!(
            "in the held engine's worker, through the store at {store}: {}",
            shorten(why)
        )),
        _ => Probe::Failed(format!(
            "the held rank reported {line:?}; is the engine's xfer loader plugin older than this agent? reinstall it"
        )),
    }
}

/// Whether the snippet's last words say the Python has no
/// `torch.distributed` (its `sys.exit` on the ImportError).
fn no_torch(last: &str) -> bool {
    last.starts_with("no torch.distributed in ") || last.contains(": no torch.distributed in ")
}

/// The Gloo probe's failure without the Python executable's path and the
/// snippet itself (which a timeout message would repeat).
fn shorten(why: &str) -> String {
    if why.contains("did not finish within") {
        let secs = why
            .split("did not finish within ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .unwrap_or("?");
        return format!("the Gloo all-reduce did not finish within {secs}: a rank waits for a peer it cannot reach");
    }
    match why.split_once(": ") {
        Some((_, rest)) if why.starts_with('/') || why.starts_with("python") => rest.to_string(),
        _ => why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::names::NodeName;

    #[test]
    fn failures_drop_the_interpreter_and_the_snippet() {
        assert_eq!(
            shorten("/v/bin/python3 exited with 1: RuntimeError: Connection refused"),
            "RuntimeError: Connection refused"
        );
        assert!(shorten(
            "/v/bin/python3 did not finish within 9s and was killed; run `/v/bin/python3 -c ...` on this node"
        )
        .starts_with("the Gloo all-reduce did not finish within 9s"));
    }

    #[test]
    fn a_held_ranks_report_is_one_line_ok_or_failed() {
        let at: std::net::SocketAddr = "10.0.0.2:29500".parse().unwrap();
        assert_eq!(held_outcome("ok 705\n", at), Probe::Ok(705));
        assert_eq!(
            held_outcome("failed RuntimeError: Connection refused\n", at),
            Probe::Failed(
                "in the held engine's worker, through the store at 10.0.0.2:29500: RuntimeError: Connection refused"
                    .into()
            )
        );
        for bad in ["", "ok soon", "done 3", "ok"] {
            match held_outcome(bad, at) {
                Probe::Failed(why) => assert!(why.contains("the held rank reported"), "{why}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn only_the_snippets_own_exit_says_no_torch() {
        assert!(no_torch(
            "no torch.distributed in /v/bin/python3: No module named 'torch'"
        ));
        assert!(!no_torch("RuntimeError: Connection refused"));
    }

    #[tokio::test]
    async fn a_program_that_is_not_there_is_skipped() {
        let req = RendezvousRequest {
            node: NodeName::new("a").unwrap(),
            python_of: "no-such-engine-xyz".into(),
            rank: 0,
            world: 2,
            master: "127.0.0.1:1".parse().unwrap(),
            fabric_if: "lo".into(),
            timeout_ms: 1_000,
        };
        assert!(matches!(probe(&req).await, Probe::Skipped(_)));
    }
}
