//! A sync job's life on its source, as a state machine with no I/O: what a
//! round's start, a round's end, a cancel and the clock do to the job's
//! record, and what the driver ([`super::runner`]) does next.
//!
//! ```text
//! queued ─▶ syncing ─┬─▶ complete
//!    ▲         │  ▲  ├─▶ failed(cause)       a permanent cause, or a
//!    │         ▼  │  │                       budget spent without progress
//!    │      retrying ┴─▶ cancelled           from any state not final
//!    └── handed over again (a failed or cancelled job)
//! ```
//!
//! A transient cause is retried with a growing pause; a job whose rounds
//! made no progress for its budget ([`GiveUp`], `--give-up-after`) fails
//! with its last cause instead of retrying for ever. A job ends only
//! through [`end_round`] or [`cancel`]; on [`Next::Ended`] the driver
//! releases what the job held (its token, its staging folder, and the
//! round itself, whose drop frees its locks). A Hub job's pull marks the
//! model's record `replacing` only when [`Policy::mark_at`] says
//! ([`MarkAt::FirstChange`]: before it changes the model's folder), so a
//! job that writes nothing leaves a complete model complete.
//! `life_check` drives these functions through seeded sequences of
//! events and checks the invariants.

use std::time::Duration;

use super::cause::RoundError;
use super::job::{JobRecord, JobState};
use xfer_proto::hash::Hash;

/// Pause after the first failed round; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The longest pause between rounds (a Hub's `Retry-After` may ask for
/// longer).
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// When a Hub job's pull stops the model's record vouching for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkAt {
    /// Before the pull first changes the model's folder (a blob placed, a
    /// link, the listing or a ref written): a pull of what is in place, or
    /// one that fails first, leaves the record complete.
    FirstChange,
    /// When the round starts, whatever it then writes (before issue 52; kept
    /// for the model check, which must catch it).
    RoundStart,
}

/// The decisions a job's life makes that a model check can turn back to
/// what they were, to show it catches the old behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// When a pull marks the model's record `replacing`.
    pub mark_at: MarkAt,
    /// Whether a job gives up after its budget without progress.
    pub budget: bool,
}

impl Policy {
    /// What the agents run.
    pub const AGENT: Policy = Policy {
        mark_at: MarkAt::FirstChange,
        budget: true,
    };
}

/// How a round ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoundEnd {
    /// Every member holds the model with this root.
    Complete {
        /// The model's root hash.
        root: Hash,
    },
    /// The round did not complete the job.
    Failed {
        /// Why, and whether it may be retried.
        error: RoundError,
        /// Whether the round moved any bytes (downloaded, or delivered to a
        /// member): progress restarts the job's budget.
        progressed: bool,
    },
}

/// What the driver does after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The job is final: release what it held, tell its members.
    Ended,
    /// Run the next round after this pause.
    RetryIn(Duration),
}

/// How a job stands, for `xfer status`'s exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Running its first round, queued, or ended complete or cancelled.
    Well,
    /// Its last round failed and it is retrying.
    Retrying,
    /// It failed.
    Failed,
}

/// A round starts: the job is syncing.
pub fn begin_round(rec: &mut JobRecord) {
    rec.state = JobState::Syncing;
    rec.rounds += 1;
    rec.next_attempt_unix = None;
}

/// A round ended at `now` (Unix seconds) as `end`: the record's new state,
/// cause, retry count and budget, and what the driver does next.
pub fn end_round(rec: &mut JobRecord, end: RoundEnd, now: u64, policy: Policy) -> Next {
    match end {
        RoundEnd::Complete { root } => {
            rec.state = JobState::Complete { root };
            settle(rec);
            Next::Ended
        }
        RoundEnd::Failed {
            error: RoundError::Fatal(why),
            ..
        } => fail(rec, why),
        RoundEnd::Failed {
            error: RoundError::Retry { why, wait },
            progressed,
        } => {
            if progressed {
                rec.stalled_since_unix = Some(now);
            }
            let since = *rec.stalled_since_unix.get_or_insert(now);
            rec.attempt += 1;
            let stalled = now.saturating_sub(since);
            match rec.spec.give_up.secs().filter(|_| policy.budget) {
                Some(limit) if stalled >= limit => {
                    let why = format!(
                        "gave up after {} attempt{} and {stalled}s without progress: {why} (retry with `xfer sync --give-up-after 30m`, or `never`)",
                        rec.attempt,
                        if rec.attempt == 1 { "" } else { "s" }
                    );
                    fail(rec, why)
                }
                budget => {
                    let mut pause = backoff(rec.attempt).max(wait.unwrap_or_default());
                    // The last round runs when the budget runs out, not later.
                    if let Some(limit) = budget {
                        let left = Duration::from_secs(limit - stalled);
                        pause = pause.min(left).max(FIRST_BACKOFF);
                    }
                    rec.next_attempt_unix = Some(now + pause.as_secs_f64().ceil() as u64);
                    rec.last_error = Some(why);
                    Next::RetryIn(pause)
                }
            }
        }
    }
}

/// The job fails with `why`.
fn fail(rec: &mut JobRecord, why: String) -> Next {
    rec.state = JobState::Failed {
        reason: why.clone(),
    };
    rec.last_error = Some(why);
    settle(rec);
    Next::Ended
}

/// A final job keeps no retry schedule.
fn settle(rec: &mut JobRecord) {
    rec.attempt = 0;
    rec.next_attempt_unix = None;
    rec.stalled_since_unix = None;
}

/// `xfer cancel`: an unfinished job is cancelled; returns whether it was.
pub fn cancel(rec: &mut JobRecord) -> bool {
    if rec.state.is_final() {
        return false;
    }
    rec.state = JobState::Cancelled;
    settle(rec);
    true
}

/// A failed or cancelled job handed over again starts afresh.
pub fn restart(rec: &mut JobRecord) {
    if rec.state.is_final() && !matches!(rec.state, JobState::Complete { .. }) {
        rec.state = JobState::Queued;
        rec.told_ended.clear();
        settle(rec);
    }
}

/// The pause before attempt `attempt` + 1: 1 s, doubling, at most
/// [`MAX_BACKOFF`].
fn backoff(attempt: u32) -> Duration {
    let doubled = FIRST_BACKOFF.saturating_mul(1u32 << attempt.saturating_sub(1).min(8));
    doubled.min(MAX_BACKOFF)
}

/// When a retrying job fails if no round makes progress first.
pub fn give_up_unix(rec: &JobRecord) -> Option<u64> {
    if rec.state.is_final() || rec.attempt == 0 {
        return None;
    }
    Some(rec.stalled_since_unix? + rec.spec.give_up.secs()?)
}

/// How the job stands ([`Health`]).
pub fn health(rec: &JobRecord) -> Health {
    match rec.state {
        JobState::Failed { .. } => Health::Failed,
        _ if !rec.state.is_final() && rec.attempt > 0 => Health::Retrying,
        _ => Health::Well,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::admin::{GiveUp, JobMember, JobSource, JobSpec, TransportChoice};
    use xfer_proto::names::ModelName;

    pub(super) fn record(give_up: GiveUp) -> JobRecord {
        JobRecord::new(JobSpec {
            id: "0123456789ab".into(),
            name: ModelName::new("models--acme--m").unwrap(),
            source: JobSource::Hub {
                repo: xfer_proto::repo::RepoRef::parse("acme/m", xfer_proto::repo::RepoType::Model)
                    .unwrap(),
                pin: None,
            },
            source_node: "a".into(),
            members: vec![JobMember {
                node: "b".into(),
                agent: "127.0.0.1:7470".into(),
                data: None,
            }],
            chunk_size: xfer_proto::manifest::ChunkSize::Auto,
            limit_rate: None,
            transport: TransportChoice::Auto,
            peers: None,
            hub_endpoint: None,
            intake: Vec::new(),
            give_up,
        })
    }

    fn down() -> RoundEnd {
        RoundEnd::Failed {
            error: RoundError::retry("connection refused"),
            progressed: false,
        }
    }

    #[test]
    fn a_job_without_progress_fails_with_its_last_cause_when_its_budget_is_spent() {
        let mut rec = record(GiveUp::AfterSecs(30));
        let mut now = 1000;
        let mut rounds = 0;
        loop {
            begin_round(&mut rec);
            rounds += 1;
            match end_round(&mut rec, down(), now, Policy::AGENT) {
                Next::RetryIn(p) => {
                    assert_eq!(health(&rec), Health::Retrying);
                    assert!(give_up_unix(&rec).unwrap() <= 1030, "{rec:?}");
                    now += p.as_secs();
                }
                Next::Ended => break,
            }
            assert!(rounds < 100, "never gave up");
        }
        assert_eq!(now, 1030, "the last round runs when the budget runs out");
        let JobState::Failed { reason } = &rec.state else {
            panic!("{rec:?}")
        };
        assert!(reason.contains("gave up after") && reason.contains("connection refused"));
        assert!(reason.contains("--give-up-after"), "{reason}");
        assert_eq!(health(&rec), Health::Failed);
        assert_eq!(give_up_unix(&rec), None);

        // Reverted (no budget): it retries for ever.
        let mut rec = record(GiveUp::AfterSecs(30));
        let old = Policy {
            budget: false,
            ..Policy::AGENT
        };
        for i in 0..50 {
            begin_round(&mut rec);
            assert!(matches!(
                end_round(&mut rec, down(), 1000 + i * 10, old),
                Next::RetryIn(_)
            ));
        }
    }

    #[test]
    fn progress_restarts_the_budget_and_never_means_never() {
        let mut rec = record(GiveUp::AfterSecs(30));
        end_round(&mut rec, down(), 1000, Policy::AGENT);
        let moved = RoundEnd::Failed {
            error: RoundError::retry("reset"),
            progressed: true,
        };
        assert!(matches!(
            end_round(&mut rec, moved, 1025, Policy::AGENT),
            Next::RetryIn(_)
        ));
        assert_eq!(give_up_unix(&rec), Some(1055));
        assert!(matches!(
            end_round(&mut rec, down(), 1050, Policy::AGENT),
            Next::RetryIn(_)
        ));
        let mut never = record(GiveUp::Never);
        for i in 0..100 {
            assert!(matches!(
                end_round(&mut never, down(), 1000 + i * 3600, Policy::AGENT),
                Next::RetryIn(p) if p <= MAX_BACKOFF
            ));
        }
        assert_eq!(give_up_unix(&never), None);
    }

    #[test]
    fn cancel_and_complete_are_final_and_a_retried_job_starts_afresh() {
        let mut rec = record(GiveUp::Default);
        end_round(&mut rec, down(), 1000, Policy::AGENT);
        assert!(cancel(&mut rec));
        assert!(!cancel(&mut rec), "a final job is not cancelled twice");
        assert_eq!(health(&rec), Health::Well);
        assert_eq!((rec.attempt, rec.next_attempt_unix), (0, None));
        restart(&mut rec);
        assert_eq!(rec.state, JobState::Queued);
        let root = Hash([1; 32]);
        begin_round(&mut rec);
        assert_eq!(
            end_round(&mut rec, RoundEnd::Complete { root }, 1001, Policy::AGENT),
            Next::Ended
        );
        restart(&mut rec);
        assert_eq!(rec.state, JobState::Complete { root }, "complete stays");
        let wait = RoundEnd::Failed {
            error: RoundError::Retry {
                why: "429".into(),
                wait: Some(Duration::from_secs(40)),
            },
            progressed: false,
        };
        let mut rec = record(GiveUp::Default);
        assert_eq!(
            end_round(&mut rec, wait, 0, Policy::AGENT),
            Next::RetryIn(Duration::from_secs(40)),
            "the Hub's Retry-After is honoured"
        );
    }
}
