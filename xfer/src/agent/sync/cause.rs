//! What a failed round of a sync job means for the job: permanent (fail
//! it at once: no such repo or revision, 401/403, no space on the source
//! or a member, a refused path, a bad Hub setting) or transient (retry it
//! with backoff: DNS, refused or reset connections, timeouts, 5xx, 429).
//! Each error says so itself ([`Permanence`]): the Hub client's
//! `Failure`, `DownloadError`, `NotEnoughSpace` and `HubEnvError`, the
//! members' [`Refusal`]s, and the flow errors that wrap them (a push's,
//! an artifact stream's) decide from their own facts, never from their
//! text. Anything not known to be permanent is retried: the job shows
//! the cause and the retry count.

use std::fmt::Display;
use std::time::Duration;

use crate::flow::push::NodeSummary;
use crate::util::permanence::Permanence;
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
/// line (which names its cause), fatal if the error says it is
/// permanent, else a retry after the wait it asked for.
pub fn of(e: &(impl Permanence + Display)) -> RoundError {
    let why = e.to_string();
    if e.is_permanent() {
        return RoundError::Fatal(why);
    }
    RoundError::Retry {
        why,
        wait: e.retry_after(),
    }
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
        use crate::hub::http::Failure;
        use crate::hub::pull::{NotEnoughSpace, PullFailure};
        let not_found = anyhow::Error::new(Failure::Refused {
            status: 401,
            why: "o/nope was not found (HTTP 401; the Hub says: Repository not found)".into(),
        })
        .context("pulling o/nope");
        match of(&PullFailure::from(not_found)) {
            RoundError::Fatal(why) => {
                assert!(why.contains("Repository not found"), "{why}");
                assert!(why.starts_with("pulling o/nope: "), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let space = NotEnoughSpace {
            need: 10,
            have: 1,
            dir: "/r".into(),
        };
        assert!(matches!(of(&space), RoundError::Fatal(_)));
        let space = anyhow::Error::new(space).context("pulling o/m");
        assert!(matches!(
            of(&PullFailure::from(space)),
            RoundError::Fatal(_)
        ));

        let refused = Failure::Transient {
            why: "127.0.0.1:9: Connection refused (6 tries)".into(),
            wait: None,
        };
        assert_eq!(
            of(&refused),
            RoundError::retry("127.0.0.1:9: Connection refused (6 tries)")
        );
        let busy = anyhow::Error::new(Failure::Transient {
            why: "HTTP 429".into(),
            wait: Some(Duration::from_secs(7)),
        })
        .context("pulling o/m");
        assert!(matches!(
            of(&PullFailure::from(busy)),
            RoundError::Retry { wait: Some(w), .. } if w == Duration::from_secs(7)
        ));
        // Unknown errors retry, with their words.
        let other = anyhow::anyhow!("something odd").context("round");
        assert_eq!(
            of(&PullFailure::from(
                anyhow::anyhow!("something odd").context("round")
            )),
            RoundError::retry("round: something odd")
        );
        assert_eq!(
            of(&crate::util::chain::Chain::from(other)),
            RoundError::retry("round: something odd")
        );
    }

    /// A permanent cause wrapped in a flow error fails the job; the same
    /// error with a transient cause is retried. A flow error that forgot
    /// to ask its cause fails here.
    #[test]
    fn a_permanent_cause_inside_a_flow_error_is_not_retried() {
        use crate::flow::artifact_stream::ArtifactStreamError;
        use crate::flow::fetch::FetchModelError;
        use crate::flow::push::PushError;
        use crate::image::registry::client::{Refused, RegistryFailure};

        let refused = anyhow::Error::new(Refused(
            "registry.example/m:v1: not found (HTTP 404); check the name and tag".into(),
        ))
        .context("layer sha256:ab");
        let e = ArtifactStreamError::Registry(RegistryFailure::from(refused));
        assert_eq!(
            of(&e),
            RoundError::Fatal(
                "layer sha256:ab: registry.example/m:v1: not found (HTTP 404); check the name and tag"
                    .into()
            )
        );
        let cut = anyhow::anyhow!("connection reset").context("layer sha256:ab");
        let e = ArtifactStreamError::Registry(RegistryFailure::from(cut));
        assert_eq!(
            of(&e),
            RoundError::retry("layer sha256:ab: connection reset")
        );

        let addr: std::net::SocketAddr = "10.0.0.2:7470".parse().unwrap();
        let full = FetchModelError::Refused {
            addr,
            refusal: Refusal::NoSpace {
                need: 24 << 20,
                have: 1,
                path: "/r".into(),
            },
        };
        assert!(matches!(of(&full), RoundError::Fatal(why) if why.starts_with("10.0.0.2:7470: ")));
        let busy = FetchModelError::Refused {
            addr,
            refusal: Refusal::Busy("another transfer".into()),
        };
        assert!(matches!(of(&busy), RoundError::Retry { .. }));

        // A push's own errors (a node's refusal is in its summary) retry,
        // and say their cause.
        let scan = anyhow::anyhow!("permission denied").context("cannot read /m/a");
        assert_eq!(
            of(&PushError::Scan(scan.into())),
            RoundError::retry("cannot read /m/a: permission denied")
        );
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
