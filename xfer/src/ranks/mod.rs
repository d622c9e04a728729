//! Ranks: the engine processes an agent starts, watches and stops for the
//! launcher.
//!
//! The launcher sends each node's agent a [`RankSpec`]: the processes of
//! that node's rank (in order, each optionally waiting until an address
//! accepts TCP, e.g. `vllm serve` after `ray start --head`), the
//! environment, and the agents of the other ranks. The agent
//! ([`supervisor`]) starts them in their own process groups with stdout
//! and stderr in one log per rank, and owns them from then on: when one
//! exits on its own, it stops the rest of its rank and tells every other
//! agent of the group to stop theirs, so a group never limps on without a
//! rank, whether or not the launcher is still attached. Stopping is
//! SIGTERM to each process group, SIGKILL after a grace period (SGLang's
//! workers ignore SIGTERM), then the rank's `on_stop` commands (`ray stop`).
//! [`signatures`] reads a rank's log for the known ways engines hang or die
//! and says what to do about each.
//!
//! These types travel in postcard frames, which cannot carry serde's
//! tagged or flattened forms, so they use none.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

pub mod signatures;
pub mod supervisor;

pub use signatures::Hint;

/// What one node runs for a launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSpec {
    /// The launch this rank belongs to: 1-64 of `[a-z0-9-]`.
    pub run: String,
    pub node: String,
    pub rank: u32,
    /// Added to the agent's own environment.
    pub env: BTreeMap<String, String>,
    /// Started in order; every one is expected to run until stopped.
    pub procs: Vec<ProcSpec>,
    /// Run after the processes are stopped (e.g. `ray stop --force`).
    pub on_stop: Vec<Vec<String>>,
    /// The other ranks' agents, told to stop their rank when this one fails.
    pub group: Vec<GroupPeer>,
    /// How long a process may wait for its `wait_tcp` address.
    pub wait_timeout_ms: u64,
    /// SIGTERM to SIGKILL, when the rank stops because one of its processes
    /// failed.
    pub grace_ms: u64,
}

/// Another rank's agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPeer {
    pub node: String,
    /// Where it may be reached (`HOST:PORT`), all tried at once: its
    /// address in the cluster file, which may be a management network the
    /// nodes cannot use between each other, and its fabric address.
    pub addrs: Vec<String>,
}

/// One long-running process of a rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcSpec {
    pub argv: Vec<String>,
    /// Start only once this address accepts a TCP connection.
    pub wait_tcp: Option<SocketAddr>,
}

/// Where one process is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcState {
    /// Not started yet: waiting for its `wait_tcp` address.
    Waiting {
        on: SocketAddr,
    },
    Running {
        pid: u32,
    },
    /// Exited with a code, or killed by a signal.
    Exited {
        pid: u32,
        code: Option<i32>,
        signal: Option<i32>,
    },
    /// Never started: why.
    NotStarted {
        why: String,
    },
}

/// One process in a report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcReport {
    pub argv: Vec<String>,
    pub state: ProcState,
}

/// Where a rank is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunState {
    Running,
    /// Stopping its processes.
    Stopping(String),
    /// Stopped on request: whose.
    Stopped(String),
    /// A process exited on its own, or could not start: which and how.
    Failed(String),
}

impl RunState {
    pub fn is_live(&self) -> bool {
        matches!(self, RunState::Running | RunState::Stopping(_))
    }
}

/// What an agent says about one rank it runs (or ran).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankReport {
    pub run: String,
    pub node: String,
    pub rank: u32,
    /// Seconds since the Unix epoch.
    pub started_unix: u64,
    pub state: RunState,
    /// When the rank failed (Unix milliseconds): the moment its first
    /// process exited on its own. Across a group the earliest is the cause.
    pub failed_ms: Option<u64>,
    pub procs: Vec<ProcReport>,
    /// The log file on the node, and its size.
    pub log: String,
    pub log_bytes: u64,
    /// The last lines of the log.
    pub tail: Vec<String>,
    /// Known failure signatures found in the log.
    pub hints: Vec<Hint>,
}

/// A piece of a rank's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    pub run: String,
    pub node: String,
    pub offset: u64,
    pub data: Vec<u8>,
    /// The log's size when read.
    pub size: u64,
    /// Whether the rank is still running (more may come).
    pub live: bool,
}

/// Checks a run id: 1-64 of `[a-z0-9-]`, so it is a safe folder name.
pub fn check_run_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('-')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "run id `{}` must be 1-64 of a-z, 0-9 and '-', not starting with '-'",
            id.escape_default()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_safe_folder_names() {
        for ok in ["a", "run-1", "0123abcd-20261201t031500"] {
            assert!(check_run_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-x", "../x", "A", "a/b", "a b", &"a".repeat(65)] {
            assert!(check_run_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn reports_round_trip_through_postcard_and_json() {
        let r = RankReport {
            run: "r1".into(),
            node: "a".into(),
            rank: 1,
            started_unix: 5,
            state: RunState::Failed("x".into()),
            failed_ms: Some(7),
            procs: vec![ProcReport {
                argv: vec!["vllm".into()],
                state: ProcState::Exited {
                    pid: 3,
                    code: Some(17),
                    signal: None,
                },
            }],
            log: "/l".into(),
            log_bytes: 9,
            tail: vec!["t".into()],
            hints: vec![],
        };
        let bytes = postcard::to_stdvec(&r).unwrap();
        assert_eq!(postcard::from_bytes::<RankReport>(&bytes).unwrap(), r);
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<RankReport>(&json).unwrap(), r);
    }
}
