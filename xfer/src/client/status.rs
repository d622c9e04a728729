//! `xfer status`: every selected node asked for its status at once (an
//! unreachable agent shows as such within the timeout), each node's rows
//! given the cause of the job delivering to it, and what makes the
//! command exit 1 ([`problems`]); [`ended_jobs`] is what `xfer prune`
//! tells the nodes. The table itself is [`super::render`].

use std::sync::Arc;

use serde::Serialize;

use super::ask::{admin, all, ASK_TIMEOUT};
use crate::config::auth::Credential;
use crate::config::cluster::{Cluster, ClusterError};
use xfer_proto::admin::{AdminReply, AdminRequest, AgentStatus, JobState, JobView, ModelState};

/// One node's answer to `xfer status`.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct NodeReport {
    /// The node's name.
    pub node: String,
    /// Its agent's address.
    pub agent: String,
    /// Whether its agent answered.
    pub reachable: bool,
    /// Why it did not, or what it answered instead of a status.
    pub error: Option<String>,
    /// Its status, when it answered.
    pub status: Option<AgentStatus>,
}

/// Asks every selected node for its status, in parallel.
pub async fn status(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    nodes: &[String],
) -> Result<Vec<NodeReport>, ClusterError> {
    let asks = cluster.select(nodes)?.into_iter().map(|n| {
        let (cred, node, agent) = (cred.clone(), n.name.to_string(), n.agent.clone());
        async move {
            match admin(&cred, &node, &agent, &AdminRequest::Status, ASK_TIMEOUT).await {
                Ok(AdminReply::Status(s)) => NodeReport {
                    node,
                    agent,
                    reachable: true,
                    error: None,
                    status: Some(s),
                },
                Ok(other) => NodeReport {
                    node,
                    agent,
                    reachable: true,
                    error: Some(format!("answered {}; upgrade xfer there", other.kind())),
                    status: None,
                },
                Err(e) => NodeReport {
                    node,
                    agent,
                    reachable: false,
                    error: Some(e.to_string()),
                    status: None,
                },
            }
        }
    });
    let mut reports = all(asks).await;
    attach_job_errors(&mut reports, unix_now());
    Ok(reports)
}

pub(super) use crate::util::clock::unix_now;

/// The jobs as their source nodes report them (a member's copy is not
/// kept up to date).
fn source_jobs(reports: &[NodeReport]) -> Vec<JobView> {
    reports
        .iter()
        .filter_map(|r| r.status.as_ref())
        .flat_map(|s| {
            s.jobs
                .iter()
                .filter(|j| s.node.as_deref() == Some(j.source_node.as_str()))
                .cloned()
        })
        .collect()
}

/// Gives each node's row of a model that an unfinished job is delivering
/// the job's error when the node has none of its own to show: the
/// member's own words from the job's last round (no space there, not
/// reachable), else the job's cause (why it failed, or what it is
/// retrying), so a node waiting on a failing source never shows an empty
/// error column.
pub fn attach_job_errors(reports: &mut [NodeReport], now_unix: u64) {
    let jobs = source_jobs(reports);
    for j in &jobs {
        // An ended job's cause is history once another job delivers the
        // same model: the rows show the running job's words, not it.
        let superseded = j.state.is_final()
            && jobs
                .iter()
                .any(|o| o.id != j.id && o.name == j.name && !o.state.is_final());
        if superseded {
            continue;
        }
        let cause = match &j.state {
            JobState::Failed { reason } => Some(format!("job {} failed: {reason}", j.id)),
            JobState::Complete { .. } | JobState::Cancelled => continue,
            _ => j.retry_line(now_unix),
        };
        for r in reports.iter_mut().filter(|r| j.nodes.contains(&r.node)) {
            let Some(m) = r
                .status
                .as_mut()
                .and_then(|s| s.models.iter_mut().find(|m| m.name == j.name))
            else {
                continue;
            };
            if m.state == ModelState::Complete || m.last_error.is_some() {
                continue;
            }
            let own = j
                .delivered
                .iter()
                .find(|t| t.node == r.node && !t.ok)
                .and_then(|t| t.error.clone());
            m.last_error = own.or_else(|| cause.clone());
        }
    }
}

/// What makes `xfer status` exit 1, one phrase each: every node that did
/// not answer with a status, every failed job (once, whichever nodes
/// report it), and every job its source is retrying after a failed round.
pub fn problems(reports: &[NodeReport]) -> Vec<String> {
    let mut out = Vec::new();
    for r in reports.iter().filter(|r| r.status.is_none()) {
        out.push(if r.reachable {
            format!("node {} answered no status", r.node)
        } else {
            format!("node {} unreachable", r.node)
        });
    }
    let mut seen: Vec<&str> = Vec::new();
    for j in reports
        .iter()
        .filter_map(|r| r.status.as_ref())
        .flat_map(|s| &s.jobs)
    {
        if matches!(j.state, JobState::Failed { .. }) && !seen.contains(&j.id.as_str()) {
            seen.push(&j.id);
            out.push(format!(
                "job {} ({}) failed",
                j.id,
                xfer_proto::names::for_people(&j.name)
            ));
        }
    }
    // A member's copy of a job is not kept up to date: its source says
    // whether it retries.
    for (node, j) in reports
        .iter()
        .filter_map(|r| r.status.as_ref())
        .flat_map(|s| s.jobs.iter().map(move |j| (s.node.as_deref(), j)))
    {
        let retrying = !j.state.is_final() && j.attempt > 0;
        if retrying && node == Some(j.source_node.as_str()) && !seen.contains(&j.id.as_str()) {
            seen.push(&j.id);
            out.push(format!(
                "job {} ({}) retrying (attempt {})",
                j.id,
                xfer_proto::names::for_people(&j.name),
                j.attempt
            ));
        }
    }
    out
}

/// The last line `xfer status` prints when there are `problems`, with
/// what clears a failed job; `None` when there are none.
pub fn problems_line(problems: &[String]) -> Option<String> {
    if problems.is_empty() {
        return None;
    }
    let n = problems.len();
    let mut line = format!(
        "{n} problem{}: {}",
        if n == 1 { "" } else { "s" },
        problems.join("; ")
    );
    if problems.iter().any(|p| p.ends_with(" failed")) {
        line.push_str(" (fix the cause and sync again; `xfer prune` removes ended jobs)");
    }
    if problems.iter().any(|p| p.contains(") retrying (attempt ")) {
        line.push_str(
            " (a retrying job fails by itself once its --give-up-after passes without progress; `xfer cancel ID` stops it now)",
        );
    }
    Some(line)
}

/// The jobs `reports` show ended, with their final state: final on any
/// node (the source's state first), or not final on a member whose
/// source answered and no longer knows the job (it was pruned or removed
/// there, so no end will come).
pub fn ended_jobs(reports: &[NodeReport]) -> Vec<(String, JobState)> {
    let statuses: Vec<(&str, &AgentStatus)> = reports
        .iter()
        .filter_map(|r| r.status.as_ref().map(|s| (r.node.as_str(), s)))
        .collect();
    let mut out: Vec<(String, JobState)> = Vec::new();
    let mut add = |id: &str, state: JobState| {
        if !out.iter().any(|(i, _)| i == id) {
            out.push((id.to_string(), state));
        }
    };
    // The source's own record first: it is the one that ended the job.
    for (node, s) in &statuses {
        for j in s.jobs.iter().filter(|j| j.source_node == *node) {
            if j.state.is_final() {
                add(&j.id, j.state.clone());
            }
        }
    }
    for (_, s) in &statuses {
        for j in &s.jobs {
            if j.state.is_final() {
                add(&j.id, j.state.clone());
                continue;
            }
            let source = statuses.iter().find(|(n, _)| *n == j.source_node);
            if let Some((src, st)) = source {
                if !st.jobs.iter().any(|k| k.id == j.id) {
                    add(
                        &j.id,
                        JobState::Failed {
                            reason: format!("its source {src} no longer knows the job"),
                        },
                    );
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::admin::JobView;

    fn job(id: &str, source: &str, state: JobState) -> JobView {
        JobView {
            id: id.into(),
            name: format!("m-{id}"),
            source_node: source.into(),
            nodes: vec!["b".into()],
            state,
            here: None,
            last_error: None,
            rounds: 1,
            delivered: Vec::new(),
            attempt: 0,
            next_attempt_unix: None,
            hub_endpoint: None,
            intake: Vec::new(),
            give_up_unix: None,
            last_round: None,
        }
    }

    fn node(name: &str, jobs: Option<Vec<JobView>>) -> NodeReport {
        NodeReport {
            node: name.into(),
            agent: format!("{name}:7470"),
            reachable: jobs.is_some(),
            error: jobs.is_none().then(|| "no answer".into()),
            status: jobs.map(|jobs| AgentStatus {
                node: Some(name.into()),
                data: None,
                root: "/r".into(),
                models: Vec::new(),
                jobs,
                images: Vec::new(),
                platform: None,
            }),
        }
    }

    fn failed() -> JobState {
        JobState::Failed {
            reason: "gone".into(),
        }
    }

    #[test]
    fn problems_name_each_unreachable_node_and_each_failed_job_once() {
        let reports = [
            node(
                "a",
                Some(vec![
                    job("f1", "a", failed()),
                    job("ok", "a", JobState::Cancelled),
                ]),
            ),
            node(
                "b",
                Some(vec![
                    job("f1", "a", failed()),
                    job("q", "a", JobState::Queued),
                ]),
            ),
            node("c", None),
        ];
        let p = problems(&reports);
        assert_eq!(p, ["node c unreachable", "job f1 (m-f1) failed"]);
        let line = problems_line(&p).unwrap();
        assert!(
            line.starts_with("2 problems: node c unreachable; job f1 (m-f1) failed")
                && line.contains("xfer prune"),
            "{line}"
        );
        assert_eq!(
            problems_line(&problems(&[node("c", None)])).as_deref(),
            Some("1 problem: node c unreachable")
        );
        assert!(problems(
            &reports[..1]
                .iter()
                .map(|r| {
                    let mut r = r.clone();
                    r.status.as_mut().unwrap().jobs.retain(|j| j.id == "ok");
                    r
                })
                .collect::<Vec<_>>()
        )
        .is_empty());
    }

    #[test]
    fn ended_jobs_take_the_sources_state_and_catch_jobs_their_source_forgot() {
        let reports = [
            // a, the source: f1 failed, q still running, c1 cancelled.
            node(
                "a",
                Some(vec![
                    job("f1", "a", failed()),
                    job("q", "a", JobState::Syncing),
                    job("c1", "a", JobState::Cancelled),
                ]),
            ),
            // b, a member: f1 never heard of its end; o is a job a no
            // longer knows; x is from a source that is down.
            node(
                "b",
                Some(vec![
                    job("f1", "a", JobState::Queued),
                    job("q", "a", JobState::Queued),
                    job("o", "a", JobState::Queued),
                    job("x", "d", JobState::Queued),
                ]),
            ),
            node("d", None),
        ];
        let ended = ended_jobs(&reports);
        let ids: Vec<&str> = ended.iter().map(|(i, _)| i.as_str()).collect();
        assert_eq!(ids, ["f1", "c1", "o"], "{ended:#?}");
        assert_eq!(ended[0].1, failed());
        assert_eq!(ended[1].1, JobState::Cancelled);
        let JobState::Failed { reason } = &ended[2].1 else {
            panic!("{ended:#?}")
        };
        assert!(
            reason.contains("its source a no longer knows the job"),
            "{reason}"
        );
    }
}

#[cfg(test)]
mod job_error_tests {
    use super::super::render::{job_line, render};
    use super::*;
    use xfer_proto::admin::{MemberTally, ModelStatus};

    fn model(name: &str, state: ModelState) -> ModelStatus {
        ModelStatus {
            name: name.into(),
            root: None,
            state,
            bytes_total: 0,
            bytes_held: 0,
            rate_bps: 0.0,
            eta_s: None,
            from_source: 0,
            from_peers: 0,
            last_error: None,
            repaired_files: 0,
            fallbacks: Vec::new(),
            pending: Vec::new(),
            draft: None,
        }
    }

    fn report(node: &str, models: Vec<ModelStatus>, jobs: Vec<JobView>) -> NodeReport {
        NodeReport {
            node: node.into(),
            agent: format!("{node}:7470"),
            reachable: true,
            error: None,
            status: Some(AgentStatus {
                node: Some(node.into()),
                data: None,
                root: "/r".into(),
                models,
                jobs,
                images: Vec::new(),
                platform: None,
            }),
        }
    }

    fn job(state: JobState) -> JobView {
        JobView {
            id: "j1".into(),
            name: "models--o--m".into(),
            source_node: "a".into(),
            nodes: vec!["a".into(), "b".into(), "c".into()],
            state,
            here: None,
            last_error: Some("127.0.0.1:9: connection refused".into()),
            rounds: 3,
            delivered: vec![MemberTally {
                node: "c".into(),
                error: Some("c:7470: no answer within 5s".into()),
                ..Default::default()
            }],
            attempt: 2,
            next_attempt_unix: Some(1_004),
            hub_endpoint: Some("http://127.0.0.1:9".into()),
            intake: Vec::new(),
            give_up_unix: None,
            last_round: None,
        }
    }

    #[test]
    fn waiting_nodes_show_the_jobs_cause_and_their_own_words() {
        let name = "models--o--m";
        let mut own = model(name, ModelState::Failed);
        own.last_error = Some("b's own error".into());
        let mut reports = vec![
            report(
                "a",
                vec![model(name, ModelState::Queued)],
                vec![job(JobState::Syncing)],
            ),
            report("b", vec![own], Vec::new()),
            report("c", vec![model(name, ModelState::Queued)], Vec::new()),
            report("d", vec![model(name, ModelState::Queued)], Vec::new()),
        ];
        attach_job_errors(&mut reports, 1_000);
        let err = |i: usize| {
            reports[i].status.as_ref().unwrap().models[0]
                .last_error
                .clone()
        };
        assert_eq!(
            err(0).as_deref(),
            Some("retrying (attempt 2, next in 4s): 127.0.0.1:9: connection refused")
        );
        assert_eq!(
            err(1).as_deref(),
            Some("b's own error"),
            "its own words stay"
        );
        assert_eq!(err(2).as_deref(), Some("c:7470: no answer within 5s"));
        assert_eq!(err(3), None, "d is not in the job");
        let text = render(&reports, None);
        assert!(text.contains("retrying (attempt 2, next in 4s):"), "{text}");

        let line = job_line(&job(JobState::Syncing), 1_000);
        assert_eq!(
            line,
            "job j1 o/m from a to a,b,c via http://127.0.0.1:9: \
             retrying (attempt 2, next in 4s): 127.0.0.1:9: connection refused"
        );
        let failed = job(JobState::Failed {
            reason: "o/m was not found".into(),
        });
        assert!(
            job_line(&failed, 1_000).ends_with(": failed: o/m was not found"),
            "{}",
            job_line(&failed, 1_000)
        );
        let mut reports = vec![
            report("a", Vec::new(), vec![failed]),
            report("b", vec![model(name, ModelState::Queued)], Vec::new()),
        ];
        attach_job_errors(&mut reports, 1_000);
        assert_eq!(
            reports[1].status.as_ref().unwrap().models[0]
                .last_error
                .as_deref(),
            Some("job j1 failed: o/m was not found")
        );
    }
}
