//! A randomized, deterministic model check of a sync job's life ([`life`]),
//! in the style of `store/model_check.rs`: a seeded generator drives one
//! Hub job's source through sequences of events, with the agent's own
//! decisions ([`life`], [`Policy::AGENT`]) and its own status code path
//! ([`crate::client::status::problems`] over the [`JobView`] an agent reports), and checks
//! the invariants after every event.
//!
//! Events: `xfer sync` (a new job, or the same one handed over again),
//! `xfer cancel`, the Hub going up, down, answering 500, 404 or slowly, a
//! new revision on the Hub, the member going down and coming back, the
//! source's disk filling, the agent killed (`kill -9`) and restarted, a
//! round's steps, and the clock running to the next retry.
//!
//! A round is three steps, so every other event can fall between them:
//! start (the record says syncing), fetch (the pull: nothing written when
//! the revision is in place, else the model's folder changes), deliver
//! (the member gets it; the record is adopted complete).
//!
//! Invariants, checked after every event:
//! 1. **A model that was fine stays fine**: once the source's record is
//!    complete at a revision, it stays complete unless bytes of another
//!    revision were written into the model's folder since.
//! 2. **Every job ends within its budget**: a job whose rounds made no
//!    progress for longer than its budget (plus the longest pause) is
//!    final.
//! 3. **Status is non-zero exactly while some job is not well**: failed,
//!    or retrying after a failed round.
//! 4. **A final job holds nothing**: no round runs for it, no round's
//!    files are locked, no token is kept.
//!
//! The check is also run with each fix reverted ([`MarkAt::RoundStart`],
//! no budget), and must then find a violation.
//! `XFER_LIFE_SEED=<seed>` replays one sequence.

use super::cause::RoundError;
use super::job::{JobRecord, JobState};
use super::life::{self, MarkAt, Next, Policy, RoundEnd, MAX_BACKOFF};
use crate::client::status::{problems, NodeReport};
use crate::util::seeded::Rng;
use xfer_proto::admin::{AgentStatus, GiveUp, JobMember, JobSource, JobSpec, JobView};
use xfer_proto::hash::Hash;
use xfer_proto::names::ModelName;

const SEQUENCES: u64 = 2000;
const STEPS: usize = 80;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hub {
    Up,
    Down,
    Err500,
    NotFound,
    /// Answers, too slowly for a round to fetch anything.
    Slow,
}

/// The source's copy of the model: its revision and whether its record
/// vouches for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    rev: u8,
    complete: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Fetch,
    Deliver { wrote: bool },
}

struct World {
    policy: Policy,
    now: u64,
    hub: Hub,
    hub_rev: u8,
    member_up: bool,
    disk_full: bool,
    held: Option<Held>,
    /// Ghost: the revision the record last vouched for, while no bytes of
    /// another revision were written since.
    fine_at: Option<u8>,
    job: Option<JobRecord>,
    /// The round in flight, if any, and whether its files are locked.
    round: Option<Step>,
    locked: bool,
    token: bool,
    /// Ghost: whether the job's last round failed (status must say so).
    last_failed: bool,
    next_round_at: Option<u64>,
    log: Vec<String>,
}

impl World {
    fn new(policy: Policy) -> World {
        World {
            policy,
            now: 1_000,
            hub: Hub::Up,
            hub_rev: 1,
            member_up: true,
            disk_full: false,
            held: None,
            fine_at: None,
            job: None,
            round: None,
            locked: false,
            token: false,
            last_failed: false,
            next_round_at: None,
            log: Vec::new(),
        }
    }

    fn spec(give_up: GiveUp, n: u64) -> JobSpec {
        JobSpec {
            id: format!("{n:012x}"),
            name: ModelName::new("models--acme--m").unwrap(),
            source: JobSource::Hub {
                repo: xfer_proto::repo::RepoRef::parse("acme/m", xfer_proto::repo::RepoType::Model)
                    .unwrap(),
                pin: None,
            },
            source_node: "a".into(),
            members: ["a", "b"]
                .iter()
                .map(|n| JobMember {
                    node: n.to_string(),
                    agent: format!("{n}:7470"),
                    data: None,
                })
                .collect(),
            chunk_size: xfer_proto::manifest::ChunkSize::Auto,
            limit_rate: None,
            transport: Default::default(),
            peers: None,
            hub_endpoint: None,
            intake: Vec::new(),
            give_up,
        }
    }

    /// The agent drops the round (cancel, kill): its tasks are aborted and
    /// its files' locks go with it.
    fn drop_round(&mut self) {
        self.round = None;
        self.locked = false;
    }

    /// The driver's work once the life says the job ended.
    fn release(&mut self) {
        self.drop_round();
        self.token = false;
        self.next_round_at = None;
    }

    fn start_round(&mut self) {
        let rec = self.job.as_mut().expect("a job");
        life::begin_round(rec);
        self.locked = true;
        self.round = Some(Step::Fetch);
        self.next_round_at = None;
        if self.policy.mark_at == MarkAt::RoundStart {
            self.mark();
        }
    }

    /// The record stops vouching (`replacing`).
    fn mark(&mut self) {
        if let Some(h) = &mut self.held {
            h.complete = false;
        }
    }

    fn end_round(&mut self, end: RoundEnd) {
        self.last_failed = matches!(end, RoundEnd::Failed { .. });
        self.drop_round();
        let rec = self.job.as_mut().expect("a job");
        match life::end_round(rec, end, self.now, self.policy) {
            Next::Ended => self.release(),
            Next::RetryIn(p) => self.next_round_at = Some(self.now + p.as_secs()),
        }
    }

    fn step(&mut self) {
        match self.round {
            None => {}
            Some(Step::Fetch) => match self.hub {
                Hub::Down | Hub::Err500 | Hub::Slow => self.end_round(RoundEnd::Failed {
                    error: RoundError::retry(format!("{:?}", self.hub)),
                    progressed: false,
                }),
                Hub::NotFound => self.end_round(RoundEnd::Failed {
                    error: RoundError::Fatal("acme/m was not found".into()),
                    progressed: false,
                }),
                Hub::Up => {
                    let in_place = self
                        .held
                        .is_some_and(|h| h.rev == self.hub_rev && h.complete);
                    if in_place {
                        self.round = Some(Step::Deliver { wrote: false });
                        return;
                    }
                    // The pull changes the folder: the hook marks first.
                    self.mark();
                    if self.fine_at != Some(self.hub_rev) {
                        self.fine_at = None;
                    }
                    if self.disk_full {
                        self.held.get_or_insert(Held {
                            rev: self.hub_rev,
                            complete: false,
                        });
                        return self.end_round(RoundEnd::Failed {
                            error: RoundError::Fatal("no space".into()),
                            progressed: false,
                        });
                    }
                    self.held = Some(Held {
                        rev: self.hub_rev,
                        complete: false,
                    });
                    self.round = Some(Step::Deliver { wrote: true });
                }
            },
            Some(Step::Deliver { wrote }) => {
                // The source adopts what it pulled (it is a member).
                self.held = Some(Held {
                    rev: self.hub_rev,
                    complete: true,
                });
                self.fine_at = Some(self.hub_rev);
                if self.member_up {
                    self.end_round(RoundEnd::Complete {
                        root: Hash([self.hub_rev; 32]),
                    })
                } else {
                    self.end_round(RoundEnd::Failed {
                        error: RoundError::retry("b: unreachable"),
                        progressed: wrote,
                    })
                }
            }
        }
    }

    fn event(&mut self, rng: &mut Rng, n: u64) {
        let what = rng.below(16);
        self.log.push(format!("t={} {what}", self.now));
        match what {
            0 | 1 => {
                // `xfer sync`: a new job when none runs, else the same
                // one handed over again (as a retry of a failed one is).
                match &mut self.job {
                    Some(rec) if !rec.state.is_final() => {}
                    Some(rec) if rng.below(2) == 0 => {
                        life::restart(rec);
                        if !rec.state.is_final() {
                            self.token = true;
                            self.last_failed = false;
                            self.start_round();
                        }
                    }
                    _ => {
                        let give_up = match rng.below(3) {
                            0 => GiveUp::AfterSecs(20 + rng.below(60)),
                            1 => GiveUp::Default,
                            _ => GiveUp::AfterSecs(5),
                        };
                        self.job = Some(JobRecord::new(Self::spec(give_up, n)));
                        self.token = true;
                        self.last_failed = false;
                        self.start_round();
                    }
                }
            }
            2 => {
                if let Some(rec) = &mut self.job {
                    if life::cancel(rec) {
                        self.last_failed = false;
                    }
                    if rec.state.is_final() {
                        self.release();
                    }
                }
            }
            3 => self.hub = Hub::Up,
            4 => self.hub = Hub::Down,
            5 => self.hub = Hub::Err500,
            6 => self.hub = Hub::NotFound,
            7 => self.hub = Hub::Slow,
            8 => self.hub_rev = 3 - self.hub_rev,
            9 => self.member_up = !self.member_up,
            10 => self.disk_full = rng.below(4) == 0,
            11 => {
                // kill -9 and restart: the round dies with the process;
                // an unfinished job resumes with a new round.
                self.drop_round();
                if self.job.as_ref().is_some_and(|r| !r.state.is_final()) {
                    self.start_round();
                }
            }
            _ => {
                if self.round.is_some() {
                    self.step();
                } else if let Some(at) = self.next_round_at {
                    self.now = self.now.max(at);
                    self.start_round();
                } else {
                    self.now += 1 + rng.below(30);
                }
            }
        }
    }

    fn check(&self) -> Result<(), String> {
        // 1. A model that was fine stays fine.
        if let Some(rev) = self.fine_at {
            if self.held
                != Some(Held {
                    rev,
                    complete: true,
                })
            {
                return Err(format!(
                    "the model was complete at revision {rev} and nothing else was written, but it is {:?}",
                    self.held
                ));
            }
        }
        let Some(rec) = &self.job else {
            return Ok(());
        };
        // 2. Within its budget.
        if let (Some(since), Some(limit)) = (rec.stalled_since_unix, rec.spec.give_up.secs()) {
            let over = self.now.saturating_sub(since);
            if !rec.state.is_final() && over > limit + MAX_BACKOFF.as_secs() + 30 {
                return Err(format!(
                    "job retried {over}s without progress, budget {limit}s: {rec:?}"
                ));
            }
        }
        // 3. Status says not well exactly while a job is failed or retrying.
        let not_well = matches!(rec.state, JobState::Failed { .. })
            || (!rec.state.is_final() && self.last_failed);
        let report = NodeReport {
            node: "a".into(),
            agent: "a:7470".into(),
            reachable: true,
            error: None,
            status: Some(AgentStatus {
                node: Some("a".into()),
                data: None,
                root: "/r".into(),
                models: Vec::new(),
                jobs: vec![JobView::from(rec)],
                images: Vec::new(),
                platform: None,
            }),
        };
        let said = !problems(&[report]).is_empty();
        if said != not_well {
            return Err(format!(
                "status says {} while the job is {}: {rec:?}",
                if said { "a problem" } else { "nothing" },
                if not_well { "not well" } else { "well" }
            ));
        }
        // 4. A final job holds nothing.
        if rec.state.is_final() && (self.round.is_some() || self.locked || self.token) {
            return Err(format!(
                "the ended job still holds: round {:?}, locked {}, token {}",
                self.round, self.locked, self.token
            ));
        }
        Ok(())
    }
}

/// Runs `sequences` seeded sequences under `policy`; the first violation.
fn run(policy: Policy, seeds: impl Iterator<Item = u64>) -> Option<(u64, String)> {
    for seed in seeds {
        let mut rng = Rng(seed);
        let mut w = World::new(policy);
        for i in 0..STEPS {
            w.event(&mut rng, seed * 1000 + i as u64);
            if let Err(why) = w.check() {
                return Some((seed, format!("{why}\nevents: {}", w.log.join(", "))));
            }
        }
    }
    None
}

fn seeds() -> Box<dyn Iterator<Item = u64>> {
    match std::env::var("XFER_LIFE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(s) => Box::new(std::iter::once(s)),
        None => Box::new(0..SEQUENCES),
    }
}

#[test]
fn a_jobs_life_keeps_fine_models_fine_ends_within_budget_and_reports_truly() {
    if let Some((seed, why)) = run(Policy::AGENT, seeds()) {
        panic!("seed {seed} (XFER_LIFE_SEED={seed} replays it): {why}");
    }
}

#[test]
fn the_check_finds_each_reverted_fix() {
    let early = Policy {
        mark_at: MarkAt::RoundStart,
        ..Policy::AGENT
    };
    let (_, why) = run(early, 0..SEQUENCES).expect("marking at round start is caught");
    assert!(why.contains("was complete at revision"), "{why}");
    let endless = Policy {
        budget: false,
        ..Policy::AGENT
    };
    let (_, why) = run(endless, 0..SEQUENCES).expect("retrying for ever is caught");
    assert!(why.contains("without progress"), "{why}");
}
