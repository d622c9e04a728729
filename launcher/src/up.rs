//! `xfer-launch up`: check, then start every rank through its agent at
//! once, and wait for the engine to be ready, or for the first rank to
//! fail, or for the init timeout; on anything but ready the whole group is
//! stopped and the failed ranks' last log lines shown, with the hints found
//! in their logs ([`crate::diagnose`]).
//!
//! Once started, the agents own the ranks: if one dies later, its agent
//! stops the others (see `xfer::agent::ranks`), with or without this process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use xfer_proto::launch::{LaunchReply, LaunchRequest};
use xfer_proto::launch::{RankReport, RunState};

use crate::agents::{unexpected, Agents, NodeError};
use crate::check::{self, Checked};
use crate::config::{Runner, Setup};
use crate::diagnose::{diagnose, with_root_cause, Diagnosed};
use crate::plan::{self, Plan};
use crate::preflight;
use crate::ready::{Api, Readiness};
use crate::record::{self, Record};
use crate::specs;

/// How `up` runs.
pub struct UpOptions {
    /// How long the engine may take to become ready.
    pub init_timeout: Duration,
    /// SIGTERM to SIGKILL when stopping.
    pub grace: Duration,
    /// The run record (default: [`record::default_dir`]/RUN.json).
    pub record: Option<PathBuf>,
    /// The API's base URL (default: http://HEAD_AGENT_HOST:API_PORT).
    pub api_url: Option<String>,
    /// Drop the model's pages from every node's page cache before the
    /// ranks start (always done on nodes with unified memory).
    pub evict_page_cache: bool,
}

/// What became of the launch.
pub struct UpOutcome {
    /// The run's id (as the agents know it).
    pub run: String,
    /// Where the run record is.
    pub record: PathBuf,
    /// Ready (and how), or why not: the message shown and recorded.
    pub result: Result<Readiness, String>,
    /// The rounds of the preflight that ran beside held ranks
    /// ([`Before::Running`]), for `deploy --json`'s phases.
    pub held_check: Option<check::Rounds>,
}

/// Why `up` did not get as far as starting the ranks, or could not record
/// how it went.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// The checks failed (they are printed above); `failed` counts them.
    #[error("refusing to start: {failed} check(s) failed (above); fix them and run `xfer-launch up` again")]
    ChecksFailed {
        /// How many checks failed.
        failed: usize,
    },
    /// The run record could not be written.
    #[error(transparent)]
    Record(#[from] record::RecordError),
}

use xfer::util::clock::unix_now as now_unix;

/// The host part of `HOST:PORT` (brackets kept for IPv6).
fn host_of(agent: &str) -> &str {
    agent.rsplit_once(':').map_or(agent, |(h, _)| h)
}

/// The preflight `up` goes by.
pub enum Before<'a> {
    /// None ran in this command: `up` runs the whole preflight.
    Fresh,
    /// One passed earlier in this command (`deploy`'s): only what a sync
    /// changes is asked again ([`check::recheck`]).
    Passed(&'a Checked),
    /// One still runs ([`crate::deploy::Preflight::Running`]): `up` plans
    /// on the light facts, starts the ranks held
    /// ([`xfer_proto::launch::RankSpec::held`]) and releases them only once
    /// it passed; otherwise it stops them, before they read or bind
    /// anything. The sender tells the preflight the ranks started held:
    /// it then leaves the rendezvous to their workers, which meet it once
    /// released ([`check::RendezvousBy::HeldRanks`]); dropped, the agents'
    /// probe meets it.
    Running(check::Running<'a>, check::HeldStarted),
}

/// Runs the check; refuses to start on any failure.
///
/// With [`Before::Running`] the ranks start held beside the rest of the
/// preflight, and are released only once it passed.
pub async fn up(
    setup: &Setup,
    agents: &Agents,
    opts: &UpOptions,
    before: Before<'_>,
) -> Result<UpOutcome, UpError> {
    let mut held_started = None;
    let (checked, running) = match before {
        Before::Passed(before) => {
            eprintln!(
                "checking {} node(s) again (the weights, disk, memory, ports and image; the rest passed above)...",
                setup.nodes.len()
            );
            (check::recheck(setup, agents, before).await, None)
        }
        Before::Fresh => {
            eprintln!("checking {} node(s)...", setup.nodes.len());
            (check::run(setup, agents).await, None)
        }
        Before::Running(full, started) => {
            let mut beside = Beside::new(full);
            let light = beside.drive(check::light_checked(setup, agents)).await;
            let blockers = check::hold_blockers(&light);
            if blockers.is_empty() {
                held_started = Some(started);
                (light, Some(beside))
            } else {
                drop(started);
                eprintln!(
                    "not starting the ranks held ({} failed); waiting for the whole preflight...",
                    blockers.join(", ")
                );
                let full = beside.finish().await;
                (check::recheck(setup, agents, &full).await, None)
            }
        }
    };
    if running.is_none() {
        render(&checked);
        if !checked.ok {
            return Err(UpError::ChecksFailed {
                failed: failed_rows(&checked),
            });
        }
    }
    let mut checked = checked;
    let setup = check::settled(setup, &checked);
    // The compile caches: the nodes that lack the chosen snapshot get it
    // now (the unit then names the root every node starts with); each
    // agent copies it into its live folder before its rank starts.
    let mut running = running;
    let caches = drive(&mut running, Caches::deliver(&setup, &mut checked)).await;
    let plan = plan::plan(&setup);
    let started = now_unix();
    let run = specs::run_id(&plan, started);
    let record_path = opts
        .record
        .clone()
        .unwrap_or_else(|| record::default_dir().join(format!("{run}.json")));
    // The verdict of a preflight that ran beside held ranks.
    let mut verdict: Option<Checked> = None;
    let mut rec = Record {
        run: &run,
        cluster_file: setup.path.display().to_string(),
        started_unix: started,
        outcome: "starting".into(),
        config_digest: &plan.digest,
        plan: &plan,
        check: &checked,
        unit: checked.unit(),
        time_to_ready_s: None,
        readiness: None,
        failure: Vec::new(),
    };
    record::write(&record_path, &rec)?;
    let t0 = Instant::now();
    let result = if setup.runner == Runner::Srun {
        srun_until_ready(&setup, opts, &plan, &run, &record_path, t0).await
    } else {
        let held = running.is_some();
        let starting = drive(
            &mut running,
            start_ranks(&setup, agents, opts, &plan, &run, &checked, &caches, held),
        )
        .await;
        // Started held, the ranks meet the preflight's rendezvous themselves
        // once released: the preflight leaves it to them.
        let left_rendezvous = match (&starting, held_started) {
            (Ok(()), Some(started)) => started.send(()).is_ok(),
            _ => false,
        };
        match (starting, running) {
            (Err(failure), _) => Err(failure),
            (Ok(()), None) => until_ready(&setup, agents, opts, &run, &caches, t0).await,
            (Ok(()), Some(full)) => {
                let mut passed = release(&setup, agents, opts, &run, full.finish(), &caches).await;
                let result = match passed.ok {
                    false => None,
                    true if left_rendezvous => Some(
                        ready_and_met(&setup, agents, opts, &run, &caches, t0, &mut passed).await,
                    ),
                    true => Some(until_ready(&setup, agents, opts, &run, &caches, t0).await),
                };
                verdict = Some(passed);
                let passed = verdict.as_ref().expect("set just above");
                rec.check = passed;
                rec.unit = passed.unit();
                match result {
                    Some(result) if passed.ok => result,
                    _ => {
                        rec.outcome = match result {
                        None => "failed: the preflight failed; the held ranks were stopped",
                        Some(_) => "failed: the held ranks did not meet at the rendezvous; they were stopped",
                    }
                    .into();
                        record::write(&record_path, &rec)?;
                        return Err(UpError::ChecksFailed {
                            failed: failed_rows(passed),
                        });
                    }
                }
            }
        }
    };
    match &result {
        Ok((secs, r)) => {
            rec.outcome = "ready".into();
            rec.time_to_ready_s = Some(*secs);
            rec.readiness = Some(r.clone());
        }
        Err((why, failing)) => {
            rec.outcome = format!("failed: {why}");
            rec.failure = failing
                .iter()
                .map(|f| serde_json::to_value(f).unwrap_or_default())
                .collect();
        }
    }
    record::write(&record_path, &rec)?;
    Ok(UpOutcome {
        run,
        record: record_path,
        result: result.map(|(_, r)| r).map_err(|(why, _)| why),
        held_check: verdict.map(|c| c.rounds),
    })
}

/// `runner = "srun"`: starts the ranks as one step of this Slurm job
/// ([`crate::srun`]) and waits for the API, or for the step to end (a
/// rank that exits takes it down: `--kill-on-bad-exit`), or for the init
/// timeout (the step is cancelled).
async fn srun_until_ready(
    setup: &Setup,
    opts: &UpOptions,
    plan: &Plan,
    run: &str,
    record: &std::path::Path,
    t0: Instant,
) -> Result<(f64, Readiness), Failure> {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("xfer-launch"));
    let dir = crate::srun::step_dir(record);
    let mut step =
        crate::srun::start(plan, run, &dir, &exe).map_err(|e| (e.to_string(), Vec::new()))?;
    eprintln!(
        "started {} ranks as Slurm step {} (logs in {})",
        plan.ranks.len(),
        step.name,
        dir.display()
    );
    let api = Api::new(
        opts.api_url.clone().unwrap_or_else(|| {
            format!(
                "http://{}:{}",
                host_of(&setup.nodes[0].agent),
                setup.ports.api
            )
        }),
        setup.model.path.clone(),
    );
    let deadline = t0 + opts.init_timeout;
    loop {
        if let Some(status) = step.exited() {
            let (why, tail) = step.failure(status);
            if let Some(tail) = tail {
                eprintln!("--- the failed ranks' logs, last lines:\n{tail}\n---");
            }
            return Err((why, Vec::new()));
        }
        if api.healthy().await.is_ok() {
            match api.measure().await {
                Ok(r) => return Ok((t0.elapsed().as_secs_f64(), r)),
                Err(e) => {
                    step.cancel();
                    return Err((format!("the API answered /health but not a completion: {e}; the step was cancelled"), Vec::new()));
                }
            }
        }
        if Instant::now() >= deadline {
            step.cancel();
            return Err((
                format!(
                    "not ready within {}s (--init-timeout); the step was cancelled; the ranks' logs are in {}",
                    opts.init_timeout.as_secs(),
                    dir.display()
                ),
                Vec::new(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The whole preflight, driven while `up` readies held ranks beside it
/// (a future runs only while polled: each step `up` awaits polls it too).
pub struct Beside<'a> {
    running: Option<check::Running<'a>>,
    done: Option<Checked>,
}

impl<'a> Beside<'a> {
    fn new(running: check::Running<'a>) -> Self {
        Beside {
            running: Some(running),
            done: None,
        }
    }

    /// Awaits `step`, driving the preflight meanwhile (kept if it ends).
    async fn drive<T>(&mut self, step: impl std::future::Future<Output = T>) -> T {
        tokio::pin!(step);
        loop {
            let Some(running) = self.running.as_mut() else {
                return step.await;
            };
            tokio::select! {
                checked = running => {
                    self.done = Some(checked);
                    self.running = None;
                }
                out = &mut step => return out,
            }
        }
    }

    /// The preflight's verdict, once it ended.
    async fn finish(self) -> Checked {
        match (self.done, self.running) {
            (Some(checked), _) => checked,
            (None, Some(running)) => running.await,
            (None, None) => unreachable!("a preflight is either running or done"),
        }
    }
}

/// Awaits `step`, driving `beside`'s preflight meanwhile, if any.
async fn drive<T>(
    beside: &mut Option<Beside<'_>>,
    step: impl std::future::Future<Output = T>,
) -> T {
    match beside {
        Some(b) => b.drive(step).await,
        None => step.await,
    }
}

/// The check table and the launch unit's line, on stderr.
fn render(checked: &Checked) {
    eprint!(
        "{}",
        preflight::render(&checked.rows, xfer::util::term::stderr_width())
    );
    if let Some(line) = checked.unit_line() {
        let width = xfer::util::term::stderr_width();
        eprintln!("{}", xfer_proto::text::wrap(&line, width, 4));
    }
}

/// How many rows of `checked` failed.
fn failed_rows(checked: &Checked) -> usize {
    checked
        .rows
        .iter()
        .filter(|r| r.verdict == preflight::Verdict::Fail)
        .count()
}

/// The compile caches as the ranks start ([`crate::caches`]).
struct Caches {
    /// Each node's gate, in rank order (`None`: it starts cold).
    gates: Vec<Option<xfer_proto::compile_cache::CacheGate>>,
    /// Each node's snapshot root once delivered, in rank order.
    started_with: Vec<Option<xfer_proto::hash::Hash>>,
    /// The syncs' progress (quiet).
    progress: xfer::util::progress::Progress,
}

impl Caches {
    /// Delivers the snapshot to the nodes that lack it; `checked`'s
    /// roots and units then say what each node starts with.
    async fn deliver(setup: &Setup, checked: &mut Checked) -> Caches {
        let progress = xfer::util::progress::Progress::new(false);
        let (gates, error) = crate::caches::deliver(setup, &mut checked.caches, &progress).await;
        if let Some(e) = error {
            eprintln!("warning: {e}");
        }
        let caches = Caches {
            gates,
            started_with: checked.caches.clone(),
            progress,
        };
        caches.stamp(setup, checked);
        caches
    }

    /// Names each node's snapshot root in its launch unit.
    fn stamp(&self, setup: &Setup, checked: &mut Checked) {
        for (node, unit) in checked.units.iter_mut() {
            let rank = setup.nodes.iter().position(|n| n.name == *node);
            if let Some(root) = rank.and_then(|r| self.started_with.get(r)) {
                *unit = unit.clone().with_caches(*root);
            }
        }
    }
}

/// How often `up` asks the agents how the ranks are doing while it waits.
const RANK_POLL: Duration = Duration::from_secs(1);

/// How long the ranks get to fail on their own after a failed completion.
const FAILURE_SETTLE: Duration = Duration::from_secs(10);

/// Why a launch failed, and the ranks to show (the most telling first).
type Failure = (String, Vec<Diagnosed>);

/// Starts every rank of `run` (held: see [`Before::Running`]) once the
/// stream gate passed under `stream_weights`; on any refusal the ranks
/// that started are stopped.
#[allow(clippy::too_many_arguments)]
async fn start_ranks(
    setup: &Setup,
    agents: &Agents,
    opts: &UpOptions,
    plan: &Plan,
    run: &str,
    checked: &Checked,
    caches: &Caches,
    held: bool,
) -> Result<(), Failure> {
    let t0 = Instant::now();
    let mut specs = specs::rank_specs(
        setup,
        plan,
        run,
        checked.weight_gate(),
        checked.image_id(),
        opts.init_timeout,
        opts.grace,
    );
    for (spec, (_, facts)) in specs.iter_mut().zip(&checked.nodes) {
        let unified = facts.as_ref().is_ok_and(|f| f.unified_memory == Some(true));
        spec.evict_page_cache = opts.evict_page_cache || unified;
    }
    for (spec, gate) in specs.iter_mut().zip(&caches.gates) {
        spec.caches = gate.clone();
    }
    let rendezvous = match held {
        true => preflight::held_rendezvous_requests(setup),
        false => Vec::new(),
    };
    for (i, spec) in specs.iter_mut().enumerate() {
        spec.held = held;
        // Met by the held rank's vLLM worker, for the preflight.
        spec.rendezvous = rendezvous.get(i).cloned();
    }
    if setup.stream_weights {
        // The small files verified on every node, one root; the shards are
        // each rank's loader's to wait for.
        let deadline = t0 + opts.init_timeout;
        let streamed = crate::stream::gate(setup, agents, &checked.nodes, deadline)
            .await
            .map_err(|why| (why.to_string(), Vec::new()))?;
        for (spec, env) in specs.iter_mut().zip(streamed.env) {
            spec.env.extend(env);
        }
    }
    eprintln!(
        "starting run {run}: {} on {} node(s), plan {}{}",
        plan.engine.as_str(),
        plan.nnodes,
        &plan.digest[..16],
        if held {
            "; held (the engine imports its Python, then waits for the preflight's verdict)"
        } else {
            ""
        }
    );
    let started = agents
        .ask_all(
            |i, _| LaunchRequest::StartRank(Box::new(specs[i].clone())),
            crate::agents::QUICK,
        )
        .await;
    let refused = refusals(agents, &started);
    if !refused.is_empty() {
        stop_run(
            agents,
            run,
            opts.grace,
            "the launch could not start every rank",
        )
        .await;
        return Err((
            format!("could not start every rank: {}", refused.join("; ")),
            Vec::new(),
        ));
    }
    Ok(())
}

/// Every node whose answer to a rank request was not `Runs`, as
/// `NODE: why`.
fn refusals(agents: &Agents, answers: &[Result<LaunchReply, NodeError>]) -> Vec<String> {
    agents
        .nodes
        .iter()
        .zip(answers)
        .filter_map(|(n, r)| match r {
            Ok(LaunchReply::Runs(_)) => None,
            Ok(other) => Some(format!("{}: {}", n.name, unexpected(other))),
            Err(e) => Some(format!("{}: {e}", n.name)),
        })
        .collect()
}

/// The whole preflight that ran beside `run`'s held ranks, judged with
/// the facts a sync changes asked again ([`check::recheck`]) and printed:
/// passed, every rank is released; failed (or a release refused), the
/// ranks are stopped before they read or bind anything.
async fn release(
    setup: &Setup,
    agents: &Agents,
    opts: &UpOptions,
    run: &str,
    full: impl std::future::Future<Output = Checked>,
    caches: &Caches,
) -> Checked {
    let full = full.await;
    let mut checked = check::recheck(setup, agents, &full).await;
    checked.rounds = full.rounds;
    caches.stamp(setup, &mut checked);
    render(&checked);
    if !checked.ok {
        stop_run(
            agents,
            run,
            opts.grace,
            "its preflight failed while it was held",
        )
        .await;
        return checked;
    }
    let released = agents
        .ask_all(
            |_, _| LaunchRequest::Release {
                run: run.to_string(),
            },
            crate::agents::QUICK,
        )
        .await;
    let refused = refusals(agents, &released);
    if !refused.is_empty() {
        let why = format!("could not release every held rank: {}", refused.join("; "));
        stop_run(agents, run, opts.grace, &why).await;
        checked.ok = false;
        checked.rows.push(preflight::Row {
            check: "release",
            node: "*".into(),
            verdict: preflight::Verdict::Fail,
            detail: why,
            fix: Some("run `xfer-launch up` again".into()),
        });
        return checked;
    }
    eprintln!("the preflight passed: released the held ranks of run {run}");
    checked
}

/// [`until_ready`], while the released ranks of `run` meet the
/// preflight's rendezvous in their workers ([`check::held_rendezvous`],
/// judged into `checked` and shown): a failed rendezvous stops the ranks
/// at once, with the rendezvous row saying why (then `checked.ok` is
/// false and the readiness returned means nothing).
async fn ready_and_met(
    setup: &Setup,
    agents: &Agents,
    opts: &UpOptions,
    run: &str,
    caches: &Caches,
    t0: Instant,
    checked: &mut Checked,
) -> Result<(f64, Readiness), Failure> {
    let ready = until_ready(setup, agents, opts, run, caches, t0);
    tokio::pin!(ready);
    let early = {
        let met = check::held_rendezvous(setup, agents, run, checked, false);
        tokio::pin!(met);
        tokio::select! {
            () = &mut met => None,
            r = &mut ready => Some(r),
        }
    };
    if let Some(r) = &early {
        // A rank that ended has its report read at once; an engine that
        // answered met its peers, and its report was written before.
        check::held_rendezvous(setup, agents, run, checked, r.is_ok()).await;
    }
    let rows: Vec<_> = checked
        .rows
        .iter()
        .filter(|r| r.check == "rendezvous")
        .cloned()
        .collect();
    eprint!(
        "{}",
        preflight::render(&rows, xfer::util::term::stderr_width())
    );
    if !checked.ok {
        stop_run(
            agents,
            run,
            opts.grace,
            "its ranks did not meet at the preflight's rendezvous",
        )
        .await;
        return Err((
            "the held ranks did not meet at the preflight's rendezvous".into(),
            Vec::new(),
        ));
    }
    match early {
        Some(r) => r,
        None => ready.await,
    }
}

/// Waits until `run`'s engine answers its first completion, a rank stops,
/// or the init timeout (counted from `t0`) passes.
async fn until_ready(
    setup: &Setup,
    agents: &Agents,
    opts: &UpOptions,
    run: &str,
    caches: &Caches,
    t0: Instant,
) -> Result<(f64, Readiness), Failure> {
    let api = Api::new(
        opts.api_url.clone().unwrap_or_else(|| {
            format!(
                "http://{}:{}",
                host_of(&setup.nodes[0].agent),
                setup.ports.api
            )
        }),
        setup.model.path.clone(),
    );
    eprintln!(
        "waiting up to {}s for {}/health ...",
        opts.init_timeout.as_secs(),
        api.base()
    );
    let deadline = t0 + opts.init_timeout;
    let mut last_note = Instant::now();
    let mut last_query: Option<Instant> = None;
    // What a rank said last, shown beside the health wait.
    let mut rank_said: Option<String> = None;
    loop {
        // A rank that stopped ends the launch. Asked once a second, not at
        // every health poll: each question is a mutually authenticated
        // QUIC handshake on both sides, CPU the loading engine wants.
        let reports = if last_query.is_none_or(|t| t.elapsed() >= RANK_POLL) {
            last_query = Some(Instant::now());
            query(agents, run).await
        } else {
            Vec::new()
        };
        if let Some(said) = last_word(&reports) {
            rank_said = Some(said);
        }
        if let Some(bad) = reports.iter().flatten().find(|r| !r.state.is_live()) {
            let why = match &bad.state {
                RunState::Failed(w) | RunState::Stopped(w) => w.clone(),
                _ => "stopped".into(),
            };
            stop_run(agents, run, opts.grace, &format!("stopped because {why}")).await;
            // Every rank that failed on its own, first first: when one
            // rank dies the others often die of it within milliseconds, and
            // clocks across nodes are not finer than that, so all are shown.
            let mut failed: Vec<RankReport> = query(agents, run)
                .await
                .into_iter()
                .flatten()
                .filter(|r| matches!(r.state, RunState::Failed(_)))
                .collect();
            failed.sort_by_key(|r| r.failed_ms.unwrap_or(u64::MAX));
            if failed.is_empty() {
                failed.push(bad.clone());
            }
            let first = failed[0].failed_ms.unwrap_or(0);
            let whys: Vec<String> = failed
                .iter()
                .map(|r| {
                    let w = match &r.state {
                        RunState::Failed(w) | RunState::Stopped(w) => w.clone(),
                        _ => why.clone(),
                    };
                    match r.failed_ms {
                        Some(ms) if ms > first => format!("{w} (+{} ms)", ms - first),
                        _ => w,
                    }
                })
                .collect();
            let label = if failed.len() == 1 {
                "a rank failed"
            } else {
                "ranks failed"
            };
            let failed = diagnose(agents, failed).await;
            let why = with_root_cause(format!("{label}: {}", whys.join("; ")), &failed);
            return Err((why, failed));
        }
        let last_health = match api.healthy().await {
            Ok(()) => break,
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            let reports = query(agents, run).await;
            stop_run(agents, run, opts.grace, "the engine was not ready in time").await;
            let quiet = reports
                .iter()
                .flatten()
                .map(|r| format!("{} ({} log bytes)", r.node, r.log_bytes))
                .collect::<Vec<_>>()
                .join(", ");
            // The logs as the reports saw them, before the stop; ranks
            // with a known signature first.
            let mut all = diagnose(agents, reports.into_iter().flatten().collect()).await;
            all.sort_by_key(|d| (d.hints.is_empty(), d.report.rank));
            let why = format!(
                "not ready within {}s (last: {last_health}); ranks: {quiet}; stopped the group",
                opts.init_timeout.as_secs()
            );
            return Err((with_root_cause(why, &all), all));
        }
        if last_note.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "  still waiting ({:.0}s): {last_health}{}",
                t0.elapsed().as_secs_f64(),
                rank_said
                    .as_deref()
                    .map(|s| format!("; {s}"))
                    .unwrap_or_default()
            );
            last_note = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let readiness = match api.measure().await {
        Ok(r) => r,
        Err(e) => {
            // The engine usually dies of it: give its ranks a moment to
            // fail on their own, so that the first to fail is known.
            let settle = Instant::now() + FAILURE_SETTLE;
            while Instant::now() < settle
                && query(agents, run)
                    .await
                    .iter()
                    .flatten()
                    .all(|r| r.state.is_live())
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            stop_run(
                agents,
                run,
                opts.grace,
                "the engine failed its first completion",
            )
            .await;
            let mut ranks: Vec<RankReport> =
                query(agents, run).await.into_iter().flatten().collect();
            ranks.sort_by_key(|r| {
                (
                    !matches!(r.state, RunState::Failed(_)),
                    r.failed_ms.unwrap_or(u64::MAX),
                    r.rank,
                )
            });
            let ranks = diagnose(agents, ranks).await;
            let why = with_root_cause(
                format!("/health answered 200 but the first completion failed: {e}"),
                &ranks,
            );
            return Err((why, ranks));
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    // The first successful start offers its caches to the nodes that
    // started without them.
    match crate::caches::offer(setup, &caches.started_with, &caches.progress).await {
        Ok(_) => {}
        Err(e) => eprintln!("warning: {e}"),
    }
    Ok((secs, readiness))
}

/// The line a waiting operator most wants from the ranks' logs: the
/// loader plugin's last (`xfer loader: waiting for shard ...`), else the
/// head rank's last, as `rank R on NODE: LINE`.
fn last_word(reports: &[Option<RankReport>]) -> Option<String> {
    let ranks: Vec<&RankReport> = reports.iter().flatten().collect();
    let last = |r: &RankReport, loader: bool| {
        r.tail
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty() && (!loader || l.contains("xfer loader:")))
            .map(|l| {
                let l = l.trim();
                let cut: String = l.chars().take(240).collect();
                let cut = if cut.len() < l.len() {
                    cut + "…"
                } else {
                    cut
                };
                format!("rank {} on {}: {cut}", r.rank, r.node)
            })
    };
    ranks.iter().find_map(|r| last(r, true)).or_else(|| {
        ranks
            .iter()
            .min_by_key(|r| r.rank)
            .and_then(|r| last(r, false))
    })
}

/// Every node's report of `run` (`None` where the agent did not answer or
/// does not know it).
pub async fn query(agents: &Agents, run: &str) -> Vec<Option<RankReport>> {
    agents
        .ask_all(
            |_, _| LaunchRequest::RunQuery {
                run: Some(run.to_string()),
            },
            crate::agents::QUICK,
        )
        .await
        .into_iter()
        .map(|a| match a {
            Ok(LaunchReply::Runs(mut r)) if !r.is_empty() => Some(r.remove(0)),
            _ => None,
        })
        .collect()
}

/// Stops `run` (or every live run, with `None`) on every node; returns
/// each node's answer.
pub async fn stop(
    agents: &Agents,
    run: Option<&str>,
    grace: Duration,
    reason: &str,
) -> Vec<Result<Vec<RankReport>, NodeError>> {
    agents
        .ask_all(
            |_, _| LaunchRequest::StopRun {
                run: run.map(str::to_string),
                grace_ms: grace.as_millis() as u64,
                reason: reason.to_string(),
            },
            grace + Duration::from_secs(45),
        )
        .await
        .into_iter()
        .map(|a| match a? {
            LaunchReply::Runs(r) => Ok(r),
            other => Err(unexpected(&other)),
        })
        .collect()
}

async fn stop_run(agents: &Agents, run: &str, grace: Duration, reason: &str) {
    eprintln!("stopping run {run} on every node: {reason}");
    stop(agents, Some(run), grace, reason).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rank: u32, node: &str, tail: &[&str]) -> Option<RankReport> {
        Some(RankReport {
            run: "r1".into(),
            node: node.parse().unwrap(),
            rank,
            started_unix: 5,
            state: RunState::Running,
            failed_ms: None,
            procs: Vec::new(),
            log: "/l".into(),
            log_bytes: 9,
            tail: tail.iter().map(|l| l.to_string()).collect(),
        })
    }

    #[test]
    fn the_health_wait_shows_the_loaders_last_line_else_the_heads() {
        let loader = "INFO 12-07 [agent.py:3] xfer loader: waiting for shard b.safetensors: the agent reports syncing";
        let reports = [
            report(0, "n1", &["INFO starting", ""]),
            None,
            report(1, "n2", &[loader, "INFO other"]),
        ];
        assert_eq!(
            last_word(&reports).unwrap(),
            format!("rank 1 on n2: {loader}")
        );
        let reports = [
            report(1, "n2", &["b said"]),
            report(0, "n1", &["a said", "  "]),
        ];
        assert_eq!(last_word(&reports).unwrap(), "rank 0 on n1: a said");
        assert_eq!(last_word(&[None, report(0, "n1", &[])]), None);
        let long = "x".repeat(500);
        let cut = last_word(&[report(0, "n1", &[&long])]).unwrap();
        assert!(cut.ends_with('…') && cut.chars().count() < 270, "{cut}");
    }
}
