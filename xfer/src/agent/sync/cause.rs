//! What a failed round of a sync job means for the job: permanent (fail
//! it at once: no such repo or revision, 401/403, no space on the source
//! or a member, a refused path, a bad Hub setting) or transient (retry it
//! with backoff: DNS, refused or reset connections, timeouts, 5xx, 429).
//! Read from the typed errors of the Hub client ([`Failure`],
//! [`DownloadError`], [`NotEnoughSpace`], [`HubEnvError`]) and the
//! members' [`Refusal`]s, never from their text. Anything not known to be
//! permanent is retried: the job shows the cause and the retry count.

use std::time::Duration;

use crate::flow::push::NodeSummary;
use crate::hub::download::{DiskError, DownloadError};
use crate::hub::env::HubEnvError;
use crate::hub::http::Failure;
use crate::hub::pull::NotEnoughSpace;
use xfer_proto::admin::JobSpec;
use xfer_proto::refusal::Refusal;

/// Why a round did not complete the job, and what the job does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoundError {
    /// Try again later (after `wait`, when the server asked for one).
    Retry {
        /// The cause, in one line.
        why: String,
        /// How long the Hub asked to wait (`Retry-After`), if it did.
        wait: Option<Duration>,
    },
    /// The job cannot go on until someone acts; the line says what to do.
    Fatal(String),
}

impl RoundError {
    /// A transient failure with no wait asked for.
    pub fn retry(why: impl Into<String>) -> RoundError {
        RoundError::Retry {
            why: why.into(),
            wait: None,
        }
    }
}

/// The round error an error of the source's own work stands for: its
/// whole chain on one line, permanent if any link of the chain is.
pub fn of_error(e: &anyhow::Error) -> RoundError {
    let why = format!("{e:#}");
    if e.chain().any(is_permanent) {
        return RoundError::Fatal(why);
    }
    let wait = e.chain().find_map(|c| match c.downcast_ref::<Failure>() {
        Some(Failure::Transient { wait, .. }) => *wait,
        _ => None,
    });
    RoundError::Retry { why, wait }
}

/// Whether one error of a chain is one that retrying cannot fix.
fn is_permanent(e: &(dyn std::error::Error + 'static)) -> bool {
    if let Some(f) = e.downcast_ref::<Failure>() {
        return matches!(f, Failure::Refused { .. });
    }
    if let Some(d) = e.downcast_ref::<DownloadError>() {
        return matches!(
            d,
            DownloadError::Refused { .. } | DownloadError::Disk(DiskError::Full { .. })
        );
    }
    if let Some(r) = e.downcast_ref::<Refusal>() {
        return r.is_permanent();
    }
    e.is::<NotEnoughSpace>() || e.is::<HubEnvError>()
}

/// The round error of the members that did not complete (`None`: every
/// member did): fatal if one of them refused for good (no space, a
/// refused path, another version), else a retry. Each member is named,
/// with its own words.
pub fn of_members(spec: &JobSpec, nodes: &[NodeSummary]) -> Option<RoundError> {
    let failed: Vec<&NodeSummary> = nodes.iter().filter(|n| !n.ok).collect();
    if failed.is_empty() {
        return None;
    }
    let line = |n: &&NodeSummary| {
        format!(
            "{}: {}",
            node_of(spec, &n.addr),
            n.error.as_deref().unwrap_or("failed")
        )
    };
    let permanent: Vec<String> = failed
        .iter()
        .filter(|n| n.refusal.as_ref().is_some_and(Refusal::is_permanent))
        .map(line)
        .collect();
    if !permanent.is_empty() {
        return Some(RoundError::Fatal(permanent.join("; ")));
    }
    Some(RoundError::retry(
        failed.iter().map(line).collect::<Vec<_>>().join("; "),
    ))
}

/// The member name of `addr` in `spec` (or `addr` itself).
pub fn node_of(spec: &JobSpec, addr: &str) -> String {
    spec.members
        .iter()
        .find(|m| m.agent == addr)
        .map(|m| m.node.clone())
        .unwrap_or_else(|| addr.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::admin::{JobMember, JobSource, TransportChoice};
    use xfer_proto::names::ModelName;

    fn spec() -> JobSpec {
        JobSpec {
            id: "j".into(),
            name: ModelName::new("m").unwrap(),
            source: JobSource::Path("/m".into()),
            source_node: "a".into(),
            members: vec![
                JobMember {
                    node: "b".into(),
                    agent: "10.0.0.2:7470".into(),
                    data: None,
                },
                JobMember {
                    node: "c".into(),
                    agent: "10.0.0.3:7470".into(),
                    data: None,
                },
            ],
            chunk_size: xfer_proto::manifest::ChunkSize::Auto,
            limit_rate: None,
            transport: TransportChoice::Auto,
            peers: None,
            hub_endpoint: None,
            intake: Vec::new(),
            give_up: Default::default(),
        }
    }

    #[test]
    fn hub_refusals_and_full_disks_are_permanent_the_rest_retries() {
        let not_found = anyhow::Error::new(Failure::Refused {
            status: 401,
            why: "o/nope was not found (HTTP 401; the Hub says: Repository not found)".into(),
        })
        .context("pulling o/nope");
        match of_error(&not_found) {
            RoundError::Fatal(why) => {
                assert!(why.contains("Repository not found"), "{why}");
                assert!(why.starts_with("pulling o/nope: "), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let space = anyhow::Error::new(NotEnoughSpace {
            need: 10,
            have: 1,
            dir: "/r".into(),
        });
        assert!(matches!(of_error(&space), RoundError::Fatal(_)));

        let refused = anyhow::Error::new(Failure::Transient {
            why: "127.0.0.1:9: Connection refused (6 tries)".into(),
            wait: None,
        });
        assert_eq!(
            of_error(&refused),
            RoundError::retry("127.0.0.1:9: Connection refused (6 tries)")
        );
        let busy = anyhow::Error::new(Failure::Transient {
            why: "HTTP 429".into(),
            wait: Some(Duration::from_secs(7)),
        });
        assert!(matches!(
            of_error(&busy),
            RoundError::Retry { wait: Some(w), .. } if w == Duration::from_secs(7)
        ));
        // Unknown errors retry, with their words.
        let other = anyhow::anyhow!("something odd").context("round");
        assert_eq!(of_error(&other), RoundError::retry("round: something odd"));
    }

    #[test]
    fn a_member_without_space_fails_the_job_naming_it() {
        let s = spec();
        let ok = NodeSummary {
            addr: "10.0.0.3:7470".into(),
            ok: true,
            ..Default::default()
        };
        assert_eq!(of_members(&s, std::slice::from_ref(&ok)), None);
        let full = NodeSummary {
            addr: "10.0.0.2:7470".into(),
            error: Some("10.0.0.2:7470: no space: need 24 MiB".into()),
            refusal: Some(Refusal::NoSpace {
                need: 24 << 20,
                have: 1,
                path: "/r".into(),
            }),
            ..Default::default()
        };
        let lost = NodeSummary {
            addr: "10.0.0.3:7470".into(),
            error: Some("timed out".into()),
            ..Default::default()
        };
        match of_members(&s, &[full.clone(), lost.clone()]) {
            Some(RoundError::Fatal(why)) => {
                assert_eq!(why, "b: 10.0.0.2:7470: no space: need 24 MiB")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            of_members(&s, &[ok, lost]),
            Some(RoundError::retry("c: timed out"))
        );
    }
}
