//! `xfer sync --wait` (and `xfer-launch deploy`): a job followed until
//! every member holds its model complete with one root, or it fails, with
//! a bar per member saying where it stands and, while the source retries,
//! why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::status::{status, unix_now};
use crate::config::auth::Credential;
use crate::config::cluster::{Cluster, ClusterError};
use xfer_proto::admin::{JobSpec, JobState, ModelState};

/// How often [`wait`] asks the source about the job.
const JOB_EVERY: Duration = Duration::from_millis(200);
/// How often [`wait`] asks every member how it is doing.
const MEMBERS_EVERY: Duration = Duration::from_secs(1);

/// Why [`wait`] stopped before the job completed.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The cluster file does not name the job's nodes.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The job failed or was cancelled; `shown` is its state and reason
    /// as `xfer status` shows them.
    #[error("job {id} {shown}")]
    Ended {
        /// The job's id.
        id: String,
        /// Its state and reason.
        shown: String,
    },
    /// A week went by without an end.
    #[error("gave up waiting")]
    GaveUp,
}

/// Follows job `spec` until every member holds its model complete with one
/// root (or the job fails); prints progress on stderr when it is a terminal.
pub async fn wait(
    cluster: &Cluster,
    cred: &Arc<Credential>,
    spec: &JobSpec,
    progress: &crate::util::progress::Progress,
) -> Result<String, WaitError> {
    let names: Vec<String> = spec.members.iter().map(|m| m.node.clone()).collect();
    let bars: Vec<_> = names.iter().map(|n| progress.bytes(n, 0)).collect();
    // No total yet: an empty bar, never a full one.
    for b in &bars {
        b.unset_length();
    }
    let started = Instant::now();
    let mut started_at = vec![false; names.len()];
    let mut members_asked: Option<Instant> = None;
    loop {
        let source = status(cluster, cred, std::slice::from_ref(&spec.source_node)).await?;
        let job = source
            .first()
            .and_then(|r| r.status.as_ref())
            .and_then(|s| s.jobs.iter().find(|j| j.id == spec.id).cloned());
        if let Some(j) = &job {
            if matches!(j.state, JobState::Failed { .. } | JobState::Cancelled) {
                for b in &bars {
                    b.abandon_with_message(j.state.label());
                }
                return Err(WaitError::Ended {
                    id: spec.id.clone(),
                    shown: j.shown(),
                });
            }
        }
        // The source's job is asked often (its end is what we wait for);
        // every member's status, for the bars and the roots, once a
        // second, and at once when the job says complete.
        let complete = job
            .as_ref()
            .is_some_and(|j| matches!(j.state, JobState::Complete { .. }));
        if !complete && members_asked.is_some_and(|t| t.elapsed() < MEMBERS_EVERY) {
            tokio::time::sleep(JOB_EVERY).await;
            continue;
        }
        members_asked = Some(Instant::now());
        // While the source retries, every bar says why and when.
        let retrying = job.as_ref().and_then(|j| j.retry_line(unix_now()));
        let reports = status(cluster, cred, &names).await?;
        let mut roots = Vec::new();
        for (i, (r, bar)) in reports.iter().zip(&bars).enumerate() {
            let m = r
                .status
                .as_ref()
                .and_then(|s| s.models.iter().find(|m| m.name == spec.name.as_str()));
            let waiting = |why: &str| match &retrying {
                Some(line) => format!("{why}: {line}"),
                None => why.to_string(),
            };
            if bar.is_finished() {
                // A node that is done stays as it ended, no rate running
                // on, unless it turns out to take another revision after
                // all (its complete copy was the old one).
                match m.filter(|m| m.state == ModelState::Complete) {
                    Some(m) => {
                        roots.push(m.root);
                        continue;
                    }
                    None => bar.reopen(m.map_or(0, |m| m.bytes_held)),
                }
            }
            match m {
                Some(m) => {
                    if m.bytes_total == 0 && m.state != ModelState::Complete {
                        bar.unset_length();
                    } else {
                        bar.set_length(m.bytes_total);
                    }
                    if !started_at[i] {
                        // What the node held before counts as held, not
                        // as moved now.
                        started_at[i] = true;
                        bar.resume_at(m.bytes_held);
                    }
                    bar.set_position(m.bytes_held);
                    if m.state == ModelState::Complete {
                        bar.finish_with_message(m.state.label());
                        roots.push(m.root);
                    } else {
                        bar.set_message(waiting(m.state.label()));
                    }
                }
                None => bar.set_message(if r.reachable {
                    waiting("queued")
                } else {
                    "unreachable".to_string()
                }),
            }
        }
        let all_done = roots.len() == names.len()
            && roots.iter().all(|r| r.is_some() && *r == roots[0])
            && job
                .as_ref()
                .is_some_and(|j| matches!(j.state, JobState::Complete { .. }));
        if all_done {
            for b in &bars {
                b.finish_with_message("complete");
            }
            return Ok(roots[0].map(|r| r.to_hex()).unwrap_or_default());
        }
        if started.elapsed() > Duration::from_secs(7 * 24 * 3600) {
            return Err(WaitError::GaveUp);
        }
        tokio::time::sleep(JOB_EVERY).await;
    }
}
