//! What a failed launch shows of a rank: its agent's report (facts only:
//! state, exits, the log's size and last lines) with the hints the launcher
//! finds in the end of the rank's log ([`crate::signatures`]).
//!
//! The report's tail is a few lines; a signature may be further up (NCCL
//! says `NET/Socket` at init, long before a hang), so the launcher reads
//! the last [`SCAN_BYTES`] of the log as the report saw it, through the
//! agent's `ReadLog`, the way `xfer-launch logs` reads it.

use serde::{Deserialize, Serialize};
use xfer_proto::launch::RankReport;
use xfer_proto::launch::{LaunchReply, LaunchRequest};

use crate::agents::{unexpected, Agents, NodeError, QUICK};
use crate::signatures::{self, Hint, SCAN_BYTES};

/// A rank's report and the signatures found in its log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosed {
    /// What the rank's agent reported (state, exit, last log lines).
    #[serde(flatten)]
    pub report: RankReport,
    /// Known failure signatures found in the end of the log.
    pub hints: Vec<Hint>,
    /// The last line of the first Python traceback in the end of the log
    /// ([`crate::traceback`]).
    #[serde(default)]
    pub root_cause: Option<String>,
}

/// `why`, with the root cause of the first of `ranks` (most telling
/// first) whose log has one: "...; root cause on n1 (rank 0): KeyError: 'x'".
pub fn with_root_cause(why: String, ranks: &[Diagnosed]) -> String {
    match ranks
        .iter()
        .find_map(|d| d.root_cause.as_ref().map(|c| (d, c)))
    {
        Some((d, cause)) => format!(
            "{why}; root cause on {} (rank {}): {cause}",
            d.report.node, d.report.rank
        ),
        None => why,
    }
}

/// Each report with its hints, in the same order.
pub async fn diagnose(agents: &Agents, reports: Vec<RankReport>) -> Vec<Diagnosed> {
    let mut out = Vec::with_capacity(reports.len());
    for report in reports {
        let text = match log_end(agents, &report).await {
            Ok(text) => text,
            // The agent is gone: the tail it reported is all there is.
            Err(_) => report.tail.join("\n"),
        };
        let hints = signatures::scan(&text);
        let root_cause = crate::traceback::root_cause(&text);
        out.push(Diagnosed {
            report,
            hints,
            root_cause,
        });
    }
    out
}

/// Why a rank's log could not be read (its reported tail is used instead).
#[derive(Debug, thiserror::Error)]
enum LogError {
    /// The report names a node that is not in the launch.
    #[error("no node {0} in the launch")]
    NotInLaunch(String),
    /// The node did not answer, or not with its log.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// The last [`SCAN_BYTES`] of the rank's log up to the size in its report,
/// without the partial first line.
async fn log_end(agents: &Agents, report: &RankReport) -> Result<String, LogError> {
    let i = agents
        .nodes
        .iter()
        .position(|n| n.name == report.node.as_str())
        .ok_or_else(|| LogError::NotInLaunch(report.node.to_string()))?;
    let end = report.log_bytes;
    let from = end.saturating_sub(SCAN_BYTES);
    let mut data = Vec::with_capacity((end - from) as usize);
    while from + (data.len() as u64) < end {
        let offset = from + data.len() as u64;
        let msg = LaunchRequest::ReadLog {
            run: report.run.clone(),
            offset,
            max: end - offset,
        };
        let chunk = match agents.ask(i, &msg, QUICK).await? {
            LaunchReply::Log(l) => l,
            other => return Err(unexpected(&other).into()),
        };
        if chunk.data.is_empty() {
            break;
        }
        data.extend_from_slice(&chunk.data);
    }
    data.truncate((end - from) as usize);
    Ok(tail_text(&data, from > 0))
}

/// The bytes as text; `cut`: they start mid-file, so the first line is
/// partial and dropped.
fn tail_text(data: &[u8], cut: bool) -> String {
    let mut text = String::from_utf8_lossy(data).into_owned();
    if cut {
        if let Some(nl) = text.find('\n') {
            text.drain(..=nl);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::launch::{ProcReport, ProcState, RunState};

    #[test]
    fn the_record_keeps_the_hints_beside_the_report_fields() {
        let d = Diagnosed {
            report: RankReport {
                run: "r1".into(),
                node: "a".parse().unwrap(),
                rank: 1,
                started_unix: 5,
                state: RunState::Failed("x".into()),
                failed_ms: None,
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
                tail: vec!["OSError: [Errno 98] Address already in use".into()],
            },
            hints: signatures::scan("OSError: [Errno 98] Address already in use\n"),
            root_cause: Some("OSError: [Errno 98] Address already in use".into()),
        };
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["rank"], 1);
        assert_eq!(json["hints"][0]["id"], "port-in-use");
        assert_eq!(
            serde_json::from_value::<Diagnosed>(json).unwrap(),
            d.clone()
        );
        assert_eq!(
            with_root_cause("a rank failed: exited with 1".into(), &[d]),
            "a rank failed: exited with 1; root cause on a (rank 1): OSError: [Errno 98] Address already in use"
        );
    }

    #[test]
    fn a_cut_window_drops_its_partial_first_line() {
        assert_eq!(tail_text(b"ror: x\nNCCL error\n", true), "NCCL error\n");
        assert_eq!(tail_text(b"whole\nlines\n", false), "whole\nlines\n");
    }
}
