//! The agent's side of a launch: start a rank's processes, watch them,
//! stop them, and keep their log and a record that survives an agent
//! restart.
//!
//! Each rank lives in `<root>/.xfer/runs/<run>/`: `rank.log` (stdout and
//! stderr of every process, appended) and `rank.json` (the spec, the
//! process groups and the state). Every process is the leader of its own
//! process group, so stopping reaches the workers an engine forks. An
//! agent that restarts while a rank runs adopts it from `rank.json`
//! (polling its process groups instead of waiting on children), so `down`
//! still works.
//!
//! A pid names a process only until the number is handed out again, and
//! every number starts over at a reboot, so `rank.json` also holds this
//! boot's id and each process's start time ([`crate::sysinfo::proc`]).
//! A process group is signalled only while its leader is still the
//! process recorded (same boot, same start time), checked again before
//! every signal; an adopted record from another boot, or whose leader's
//! pid now belongs to another process, is stale: reported, logged and
//! never signalled. Once a leader has exited, the group's other members
//! are signalled one by one, each checked the same way, from the list
//! taken while the leader was alive. This agent's own children are
//! reaped only once their rank has stopped, so their pids cannot be
//! handed out again while the agent may still signal them. The run
//! folder is mode 0700 and `rank.json` 0600 (written durably: renamed
//! into place, then the folder fsynced): the spec holds the
//! `[launch.env]` values.
//!
//! Every process starts from an absolute path (the launch service
//! resolved each program on the agent's own `PATH` when it checked it;
//! a name from an older record is resolved the same way here), never
//! looked up on the rank's environment, and the environment it adds to
//! the agent's is kept within [`xfer_proto::launch_rules`].

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{check_run_id, LogChunk, ProcReport, ProcState, RankReport, RankSpec, RunState};
use crate::config::auth::Credential;
use crate::sysinfo::proc;
use crate::util::private;
use xfer_proto::launch::LaunchRequest;
use xfer_proto::launch_rules;

/// How much of the end of the log a report reads for its last lines.
const TAIL_BYTES: u64 = 256 << 10;
/// Lines of log in a report.
const TAIL_LINES: usize = 25;
/// The most log bytes one read returns.
pub const MAX_LOG_READ: u64 = 1 << 20;
/// How long each `on_stop` command may take.
const ON_STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// The ranks this agent runs.
pub struct Supervisor {
    dir: PathBuf,
    cred: Arc<Credential>,
    runs: Mutex<HashMap<String, Arc<Run>>>,
    /// This boot's id, or why it cannot be read (then no adopted process
    /// is ever signalled, and no rank starts).
    boot: Result<String, String>,
}

struct Run {
    spec: RankSpec,
    dir: PathBuf,
    started_unix: u64,
    /// The boot the record was written in.
    boot_id: Option<String>,
    /// `Ok` when that boot is this one: the recorded pids may be checked.
    same_boot: Result<(), String>,
    /// Why an adopted record was not trusted: its processes were never
    /// signalled. Such a run is in every reply to a stop of all runs.
    stale: Option<String>,
    inner: Mutex<Inner>,
    /// Fired when stopping begins: processes still waiting never start.
    stopping: CancellationToken,
    /// Fired when stopping ends: this agent's children may be reaped.
    stopped: CancellationToken,
    /// Held while stopping, so two stops do not interleave.
    halt: tokio::sync::Mutex<()>,
}

struct Inner {
    state: RunState,
    procs: Vec<ProcState>,
    /// Each process's start time (clock ticks since boot); `None` for one
    /// never started, or no longer known to be the process recorded: its
    /// group is never signalled.
    starts: Vec<Option<u64>>,
    /// The members of each group (pgid -> pid and start time), listed
    /// while its leader was verified: signalled one by one, each checked,
    /// once the leader has exited.
    members: HashMap<u32, Vec<(u32, u64)>>,
    failed_ms: Option<u64>,
}

/// What `rank.json` holds. A record without `boot_id` or `starts` (from
/// an older xfer) is stale on adoption.
#[derive(Serialize, Deserialize)]
struct Record {
    spec: RankSpec,
    started_unix: u64,
    state: RunState,
    procs: Vec<ProcState>,
    #[serde(default)]
    failed_ms: Option<u64>,
    #[serde(default)]
    boot_id: Option<String>,
    #[serde(default)]
    starts: Vec<Option<u64>>,
}

/// Whether a recorded group leader is still the process recorded.
enum Leader {
    /// The same process (it may be a zombie not yet reaped).
    Ours,
    /// No process has the pid now.
    Gone,
    /// Another process has the pid, or it cannot be checked: why.
    Unknown(String),
}

impl Supervisor {
    /// Opens `<root>/.xfer/runs`, adopting ranks whose processes outlived
    /// an earlier agent.
    pub fn open(root: &Path, cred: Arc<Credential>) -> Arc<Supervisor> {
        let boot = proc::boot_id().map_err(|e| {
            format!("cannot read this machine's boot id (/proc/sys/kernel/random/boot_id): {e}")
        });
        if let Err(e) = &boot {
            tracing::warn!("{e}; no rank will start, and no recorded process is signalled");
        }
        let sup = Arc::new(Supervisor {
            dir: root.join(".xfer").join("runs"),
            cred,
            runs: Mutex::default(),
            boot,
        });
        sup.adopt_all();
        sup
    }

    /// Starts a rank. Refused while another run is live on this node.
    pub fn start(self: &Arc<Self>, spec: RankSpec) -> Result<RankReport, String> {
        check_run_id(&spec.run)?;
        if spec.procs.is_empty() || spec.procs.iter().any(|p| p.argv.is_empty()) {
            return Err(format!(
                "rank {} of run {} has no command to run; check the plan (`xfer-launch plan`)",
                spec.rank, spec.run
            ));
        }
        let boot = self.boot.clone().map_err(|e| {
            format!("{e}; the agent starts no process it could not tell apart later from another with the same pid")
        })?;
        let run = {
            let mut runs = self.runs.lock().unwrap();
            if let Some((id, _)) = runs.iter().find(|(_, r)| r.state().is_live()) {
                return Err(if *id == spec.run {
                    format!("run {id} is already running on this node")
                } else {
                    format!(
                        "run {id} is still running on this node; stop it first (`xfer-launch down`)"
                    )
                });
            }
            let dir = self.dir.join(&spec.run);
            private::create_dir(&self.dir)
                .and_then(|_| private::create_dir(&dir))
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let run = Arc::new(Run {
                started_unix: now_unix(),
                boot_id: Some(boot),
                same_boot: Ok(()),
                stale: None,
                inner: Mutex::new(Inner {
                    state: RunState::Running,
                    starts: vec![None; spec.procs.len()],
                    members: HashMap::new(),
                    procs: spec
                        .procs
                        .iter()
                        .map(|p| match p.wait_tcp {
                            Some(on) => ProcState::Waiting { on },
                            None => ProcState::NotStarted {
                                why: "starting".into(),
                            },
                        })
                        .collect(),
                    failed_ms: None,
                }),
                dir,
                spec,
                stopping: CancellationToken::new(),
                stopped: CancellationToken::new(),
                halt: tokio::sync::Mutex::new(()),
            });
            runs.insert(run.spec.run.clone(), run.clone());
            run
        };
        run.save();
        let sup = self.clone();
        let driven = run.clone();
        tokio::spawn(async move { sup.drive(driven).await });
        Ok(run.report())
    }

    /// Reports one run, or every run this agent knows (newest first).
    pub fn reports(&self, run: Option<&str>) -> Vec<RankReport> {
        let mut runs: Vec<Arc<Run>> = self
            .runs
            .lock()
            .unwrap()
            .values()
            .filter(|r| run.is_none_or(|id| r.spec.run == id))
            .cloned()
            .collect();
        runs.sort_by_key(|r| std::cmp::Reverse(r.started_unix));
        runs.iter().map(|r| r.report()).collect()
    }

    /// Whether `node` is one of the nodes of run `run` (a node may ask
    /// the others of its own runs to stop).
    pub fn in_group(&self, run: &str, node: &str) -> bool {
        self.runs
            .lock()
            .unwrap()
            .get(run)
            .is_some_and(|r| r.spec.group.iter().any(|p| p.node == node))
    }

    /// Stops one run, or every live run, and reports them once stopped.
    /// Stopping every run also reports the stale records this agent
    /// adopted and never signalled.
    pub async fn stop(&self, run: Option<&str>, grace: Duration, reason: &str) -> Vec<RankReport> {
        let runs: Vec<Arc<Run>> = self
            .runs
            .lock()
            .unwrap()
            .values()
            .filter(|r| {
                run.map_or(r.state().is_live() || r.stale.is_some(), |id| {
                    r.spec.run == id
                })
            })
            .cloned()
            .collect();
        let halts = runs.iter().map(|r| {
            let r = r.clone();
            let reason = reason.to_string();
            tokio::spawn(async move { r.halt(grace, RunState::Stopped(reason)).await })
        });
        for h in halts.collect::<Vec<_>>() {
            let _ = h.await;
        }
        runs.iter().map(|r| r.report()).collect()
    }

    /// Reads up to `max` bytes of a rank's log from `offset`.
    pub fn read_log(&self, run: &str, offset: u64, max: u64) -> Result<LogChunk, String> {
        let r = self.runs.lock().unwrap().get(run).cloned().ok_or_else(|| {
            format!("no run {run} on this node; `xfer-launch logs` lists the runs")
        })?;
        let path = r.log();
        let mut f = std::fs::File::open(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let size = f.metadata().map(|m| m.len()).unwrap_or(0);
        let offset = offset.min(size);
        let take = max.min(MAX_LOG_READ).min(size - offset);
        let mut data = vec![0; take as usize];
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| f.read_exact(&mut data))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(LogChunk {
            run: run.to_string(),
            node: r.spec.node.clone(),
            offset,
            data,
            size,
            live: r.state().is_live(),
        })
    }

    /// Starts the processes in order, then watches them.
    async fn drive(self: Arc<Self>, run: Arc<Run>) {
        let wait_limit = Duration::from_millis(run.spec.wait_timeout_ms.max(1));
        for (i, proc) in run.spec.procs.iter().enumerate() {
            if let Some(addr) = proc.wait_tcp {
                run.note(&format!(
                    "waiting for {addr} before starting {}",
                    proc.argv[0]
                ));
                let waited = tokio::select! {
                    r = wait_tcp(addr, wait_limit) => r,
                    _ = run.stopping.cancelled() => return,
                };
                if let Err(e) = waited {
                    run.set_proc(i, ProcState::NotStarted { why: e.clone() });
                    self.failed(&run, format!("`{}` never started: {e}", proc.argv[0]))
                        .await;
                    return;
                }
            }
            if run.stopping.is_cancelled() {
                return;
            }
            match run.spawn(i) {
                Ok(pid) => {
                    let sup = self.clone();
                    let watched = run.clone();
                    tokio::spawn(async move { sup.watch(watched, i, pid).await });
                }
                Err(e) => {
                    run.set_proc(i, ProcState::NotStarted { why: e.clone() });
                    self.failed(&run, e).await;
                    return;
                }
            }
        }
    }

    /// Waits for this agent's child `pid` to exit, without reaping it:
    /// the zombie keeps its pid (and so its process group's id) from being
    /// handed out again until the rank has stopped.
    async fn watch(self: Arc<Self>, run: Arc<Run>, i: usize, pid: u32) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let _ = tx.send(wait_exit(pid));
        });
        let (code, signal) = rx.await.unwrap_or((None, None));
        run.set_proc(i, ProcState::Exited { pid, code, signal });
        if run.state() == RunState::Running {
            let how = match (code, signal) {
                (Some(c), _) => format!("exited with code {c}"),
                (None, Some(s)) => format!("was killed by signal {s}"),
                _ => "exited".to_string(),
            };
            let why = format!(
                "rank {} on {}: `{}` (pid {pid}) {how}",
                run.spec.rank, run.spec.node, run.spec.procs[i].argv[0]
            );
            self.failed(&run, why).await;
        }
        run.stopped.cancelled().await;
        // The group has been stopped; from here its leader's pid is free
        // and never signalled again.
        run.inner.lock().unwrap().starts[i] = None;
        reap(pid);
    }

    /// A process of `run` failed: tell the group, then stop this rank.
    async fn failed(&self, run: &Arc<Run>, why: String) {
        {
            let mut inner = run.inner.lock().unwrap();
            if inner.state != RunState::Running {
                return;
            }
            inner.failed_ms = Some(now_ms());
        }
        run.note(&format!("rank failed: {why}; stopping the group"));
        tracing::warn!("run {}: {why}; stopping the group", run.spec.run);
        let grace = Duration::from_millis(run.spec.grace_ms);
        let msg = LaunchRequest::StopRun {
            run: Some(run.spec.run.clone()),
            grace_ms: run.spec.grace_ms,
            reason: format!("stopped because {why}"),
        };
        // Every address of every peer at once: stopping is idempotent.
        for peer in run.spec.group.clone() {
            for addr in peer.addrs {
                let (cred, msg) = (self.cred.clone(), msg.clone());
                let (id, node) = (run.spec.run.clone(), peer.node.clone());
                tokio::spawn(async move {
                    let limit = grace + Duration::from_secs(15);
                    match crate::agent::client::launch(&cred, &node, &addr, &msg, limit).await {
                        Ok(_) => tracing::info!("run {id}: {node} ({addr}) stopped its rank"),
                        Err(e) => tracing::info!("run {id}: {node} at {addr}: {e}"),
                    }
                });
            }
        }
        run.halt(grace, RunState::Failed(why)).await;
    }

    fn adopt_all(self: &Arc<Self>) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let dir = e.path();
            let path = dir.join("rank.json");
            let Ok(text) = std::fs::read(&path) else {
                continue;
            };
            let rec = match serde_json::from_slice::<Record>(&text) {
                Ok(rec) => rec,
                Err(err) => {
                    tracing::warn!(
                        "ignoring {}: {err}; no process it names is signalled",
                        path.display()
                    );
                    continue;
                }
            };
            if check_run_id(&rec.spec.run).is_err() || rec.procs.len() != rec.spec.procs.len() {
                tracing::warn!(
                    "ignoring {}: not a rank record; no process it names is signalled",
                    path.display()
                );
                continue;
            }
            if let Some(run) = self.adopt(dir, rec) {
                self.runs.lock().unwrap().insert(run.spec.run.clone(), run);
            }
        }
    }

    /// Takes over a rank from its record. A live record whose processes
    /// cannot be verified (another boot, no boot id or start times, a pid
    /// that now belongs to another process) is stale: failed, reported
    /// as such, and never signalled.
    fn adopt(self: &Arc<Self>, dir: PathBuf, rec: Record) -> Option<Arc<Run>> {
        let same_boot = match (&self.boot, &rec.boot_id) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), None) => {
                Err("rank.json records no boot id (it was written by an older xfer)".to_string())
            }
            (Ok(now), Some(then)) if now != then => Err(format!(
                "rank.json was written in another boot (boot id {then}; this boot is {now})"
            )),
            (Ok(_), Some(_)) => Ok(()),
        };
        let mut starts = rec.starts.clone();
        starts.resize(rec.procs.len(), None);
        let mut procs = rec.procs.clone();
        let mut stale: Vec<String> = Vec::new();
        let mut alive = false;
        if rec.state.is_live() {
            for (i, p) in rec.procs.iter().enumerate() {
                let pid = match *p {
                    ProcState::Running { pid } | ProcState::Exited { pid, .. } if pid > 0 => pid,
                    _ => continue,
                };
                let why = match check_leader(&same_boot, pid, starts[i]) {
                    Leader::Ours if group_has_live_member(pid) => {
                        alive = true;
                        continue;
                    }
                    Leader::Ours => continue,
                    Leader::Gone if !group_has_live_member(pid) => continue,
                    Leader::Gone => format!(
                        "the leader of process group {pid} has exited and the group's other members cannot be told apart from unrelated processes"
                    ),
                    Leader::Unknown(why) => why,
                };
                starts[i] = None;
                if !stale.contains(&why) {
                    stale.push(why);
                }
            }
        }
        let live = rec.state.is_live() && alive;
        let stale = (!stale.is_empty()).then(|| stale.join("; "));
        let state = if !rec.state.is_live() {
            rec.state.clone()
        } else if live {
            RunState::Running
        } else {
            for p in procs.iter_mut() {
                if let ProcState::Running { pid } = *p {
                    *p = ProcState::Exited {
                        pid,
                        code: None,
                        signal: None,
                    };
                }
            }
            match &stale {
                Some(why) => RunState::Failed(format!(
                    "stale record: {why}; its processes were never signalled"
                )),
                None => RunState::Failed("its processes ended while the agent was down".into()),
            }
        };
        let run = Arc::new(Run {
            spec: rec.spec,
            dir,
            started_unix: rec.started_unix,
            boot_id: rec.boot_id,
            same_boot,
            stale: if live { None } else { stale.clone() },
            inner: Mutex::new(Inner {
                state,
                procs,
                starts,
                members: HashMap::new(),
                failed_ms: rec.failed_ms,
            }),
            stopping: CancellationToken::new(),
            stopped: CancellationToken::new(),
            halt: tokio::sync::Mutex::new(()),
        });
        if let Some(why) = &stale {
            run.note(&format!(
                "the agent restarted and does not trust this record: {why}; those processes are never signalled"
            ));
            tracing::warn!(
                "run {} (rank {}): stale record in {}: {why}; those processes are never signalled",
                run.spec.run,
                run.spec.rank,
                run.dir.display()
            );
        }
        run.save();
        if live {
            tracing::info!("adopted run {} (rank {})", run.spec.run, run.spec.rank);
            let sup = self.clone();
            let polled = run.clone();
            tokio::spawn(async move { sup.poll_adopted(polled).await });
        } else {
            run.stopped.cancel();
        }
        Some(run)
    }

    /// Watches processes that are not this agent's children, listing the
    /// members of their groups while each leader is verified.
    async fn poll_adopted(self: Arc<Self>, run: Arc<Run>) {
        loop {
            if run.state() != RunState::Running {
                return;
            }
            run.list_members();
            for (i, pid, start) in run.leaders() {
                if !matches!(
                    run.inner.lock().unwrap().procs[i],
                    ProcState::Running { .. }
                ) {
                    continue;
                }
                let how = match run.leader(pid, start) {
                    Leader::Ours if group_has_live_member(pid) => continue,
                    Leader::Ours | Leader::Gone => "exited".to_string(),
                    Leader::Unknown(why) => {
                        if start.is_some() {
                            run.distrust(i, pid, &why);
                        }
                        format!("is no longer known to be running ({why})")
                    }
                };
                run.set_proc(
                    i,
                    ProcState::Exited {
                        pid,
                        code: None,
                        signal: None,
                    },
                );
                let why = format!(
                    "rank {} on {}: `{}` (pid {pid}) {how} while the agent was restarting",
                    run.spec.rank, run.spec.node, run.spec.procs[i].argv[0]
                );
                self.failed(&run, why).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

impl Run {
    fn state(&self) -> RunState {
        self.inner.lock().unwrap().state.clone()
    }

    fn log(&self) -> PathBuf {
        self.dir.join("rank.log")
    }

    fn set_proc(&self, i: usize, s: ProcState) {
        self.inner.lock().unwrap().procs[i] = s;
        self.save();
    }

    /// Opens the rank's log to append (created mode 0600: engines print
    /// their environment), never through a symlink.
    fn open_log(&self) -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.log())
    }

    /// Appends an agent line to the rank's log.
    fn note(&self, line: &str) {
        use std::io::Write;
        if let Ok(mut f) = self.open_log() {
            let _ = writeln!(f, "[xfer agent] {line}");
        }
    }

    /// Starts process `i` as the leader of its own process group, and
    /// records its pid and start time.
    fn spawn(&self, i: usize) -> Result<u32, String> {
        use std::os::unix::process::CommandExt;
        let argv = &self.spec.procs[i].argv;
        let open = || {
            self.open_log()
                .map_err(|e| format!("cannot open {}: {e}", self.log().display()))
        };
        let program = self.program(argv)?;
        self.note(&format!("starting {}", shell_words(argv)));
        // A std child: dropping it neither kills nor reaps; `watch` waits.
        let mut cmd = std::process::Command::new(program);
        cmd.args(&argv[1..])
            .envs(self.env())
            .stdin(std::process::Stdio::null())
            .stdout(open()?)
            .stderr(open()?)
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start `{}` on {}: {e}", argv[0], self.spec.node))?;
        let pid = child.id();
        drop(child);
        // Unreaped, the child's /proc entry stays until `watch` reaps it.
        let start = match proc::start_ticks(pid) {
            Ok(Some(t)) => t,
            other => {
                // SAFETY: our unreaped child: its pid is still its own.
                unsafe {
                    libc::killpg(pid as i32, libc::SIGKILL);
                }
                reap(pid);
                let why = match other {
                    Err(e) => e.to_string(),
                    _ => "no /proc entry".to_string(),
                };
                return Err(format!(
                    "cannot read the start time of `{}` (pid {pid}): {why}; killed it, since it could not be stopped safely later",
                    argv[0]
                ));
            }
        };
        {
            let mut inner = self.inner.lock().unwrap();
            inner.procs[i] = ProcState::Running { pid };
            inner.starts[i] = Some(start);
            // Recorded before anyone can see it running: an agent killed
            // right after a query saw the pid still leaves a record that
            // names it, for the next agent to adopt.
            self.save_with(&inner);
        }
        Ok(pid)
    }

    /// Stops every process group of the rank: SIGTERM, SIGKILL after
    /// `grace`, then the `on_stop` commands. Ends in `last`.
    async fn halt(&self, grace: Duration, last: RunState) {
        let _one = self.halt.lock().await;
        if !self.state().is_live() {
            self.stopped.cancel();
            return;
        }
        let reason = match &last {
            RunState::Stopped(r) | RunState::Failed(r) | RunState::Stopping(r) => r.clone(),
            RunState::Running => String::new(),
        };
        self.inner.lock().unwrap().state = RunState::Stopping(reason.clone());
        self.stopping.cancel();
        self.note(&format!("stopping: {reason}"));
        self.list_members();
        self.signal_all(libc::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline && self.any_group_alive() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if self.any_group_alive() {
            self.note(&format!(
                "still running {:.1}s after SIGTERM; sending SIGKILL",
                grace.as_secs_f64()
            ));
            self.signal_all(libc::SIGKILL);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while tokio::time::Instant::now() < deadline && self.any_group_alive() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        for argv in &self.spec.on_stop {
            self.run_on_stop(argv).await;
        }
        self.note("stopped");
        self.inner.lock().unwrap().state = last;
        self.save();
        self.stopped.cancel();
    }

    async fn run_on_stop(&self, argv: &[String]) {
        if argv.is_empty() {
            return;
        }
        let program = match self.program(argv) {
            Ok(p) => p,
            Err(e) => return self.note(&format!("cannot run `{}`: {e}", argv[0])),
        };
        self.note(&format!("running {}", shell_words(argv)));
        let (Ok(out), Ok(err)) = (self.open_log(), self.open_log()) else {
            return;
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(&argv[1..])
            .envs(self.env())
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        match cmd.spawn() {
            Ok(mut child) => match tokio::time::timeout(ON_STOP_TIMEOUT, child.wait()).await {
                Ok(_) => {}
                Err(_) => self.note(&format!(
                    "`{}` did not finish within {}s; killed",
                    argv[0],
                    ON_STOP_TIMEOUT.as_secs()
                )),
            },
            Err(e) => self.note(&format!("cannot run `{}`: {e}", argv[0])),
        }
    }

    /// The program `argv` starts, by absolute path: as recorded, or a name
    /// (from an older record) looked up on the agent's own `PATH`.
    fn program(&self, argv: &[String]) -> Result<PathBuf, String> {
        crate::util::program::resolve(&argv[0]).map_err(|e| format!("{}: {e}", self.spec.node))
    }

    /// What the rank adds to the agent's environment: its keys within
    /// [`launch_rules`] (the launch service refused any other; a record
    /// may be older than the rules).
    fn env(&self) -> impl Iterator<Item = (&String, &String)> {
        self.spec
            .env
            .iter()
            .filter(|(k, v)| match launch_rules::check_env(k, v) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("run {}: not passing {k}: {e}", self.spec.run);
                    false
                }
            })
    }

    /// The started processes: index, pid and recorded start time.
    fn leaders(&self) -> Vec<(usize, u32, Option<u64>)> {
        let inner = self.inner.lock().unwrap();
        inner
            .procs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match *p {
                ProcState::Running { pid } | ProcState::Exited { pid, .. } if pid > 0 => {
                    Some((i, pid, inner.starts.get(i).copied().flatten()))
                }
                _ => None,
            })
            .collect()
    }

    /// Whether `pid` is still the process started at `start` in the boot
    /// the record was written in.
    fn leader(&self, pid: u32, start: Option<u64>) -> Leader {
        check_leader(&self.same_boot, pid, start)
    }

    /// Stops trusting process `i`: its group is never signalled again.
    fn distrust(&self, i: usize, pid: u32, why: &str) {
        {
            let mut inner = self.inner.lock().unwrap();
            inner.starts[i] = None;
            inner.members.remove(&pid);
        }
        self.note(&format!("not signalling process group {pid}: {why}"));
        tracing::warn!(
            "run {}: not signalling process group {pid}: {why}",
            self.spec.run
        );
        self.save();
    }

    /// Lists the members of every group whose leader is verified, checking
    /// the leader again afterwards (so the list is of the group recorded).
    fn list_members(&self) {
        for (_, pid, start) in self.leaders() {
            if !matches!(self.leader(pid, start), Leader::Ours) {
                continue;
            }
            let members = group_members(pid);
            let still = matches!(self.leader(pid, start), Leader::Ours);
            let mut inner = self.inner.lock().unwrap();
            if still {
                inner.members.insert(pid, members);
            }
        }
    }

    /// Members listed for group `pgid` that are still those processes.
    fn listed_members(&self, pgid: u32) -> Vec<u32> {
        let listed = self.inner.lock().unwrap().members.get(&pgid).cloned();
        listed
            .unwrap_or_default()
            .into_iter()
            .filter(|&(pid, start)| {
                matches!(proc::stat(pid), Ok(Some(s)) if s.start_ticks == start && s.pgrp == pgid && s.state != 'Z')
            })
            .map(|(pid, _)| pid)
            .collect()
    }

    /// Signals every process group of the rank whose leader is still the
    /// process recorded; a group whose leader has exited, member by member
    /// from the list; nothing else.
    fn signal_all(&self, sig: i32) {
        for (i, pid, start) in self.leaders() {
            match self.leader(pid, start) {
                // SAFETY: killpg only sends a signal; ESRCH (group gone) is fine.
                Leader::Ours => unsafe {
                    libc::killpg(pid as i32, sig);
                },
                Leader::Gone => {
                    for m in self.listed_members(pid) {
                        // SAFETY: as above, to one process just checked.
                        unsafe {
                            libc::kill(m as i32, sig);
                        }
                    }
                }
                Leader::Unknown(why) => {
                    if start.is_some() {
                        self.distrust(i, pid, &why);
                    }
                }
            }
        }
    }

    /// Whether a group the rank may signal still has a live member.
    fn any_group_alive(&self) -> bool {
        self.leaders()
            .into_iter()
            .any(|(_, pid, start)| match self.leader(pid, start) {
                Leader::Ours => group_has_live_member(pid),
                Leader::Gone => !self.listed_members(pid).is_empty(),
                Leader::Unknown(_) => false,
            })
    }

    fn save(&self) {
        let inner = self.inner.lock().unwrap();
        self.save_with(&inner);
    }

    /// [`Run::save`] with the state already locked.
    fn save_with(&self, inner: &Inner) {
        let rec = Record {
            spec: self.spec.clone(),
            started_unix: self.started_unix,
            state: inner.state.clone(),
            procs: inner.procs.clone(),
            failed_ms: inner.failed_ms,
            boot_id: self.boot_id.clone(),
            starts: inner.starts.clone(),
        };
        let path = self.dir.join("rank.json");
        let written = serde_json::to_vec_pretty(&rec)
            .map_err(std::io::Error::other)
            .and_then(|b| private::write_atomic(&path, &b));
        if let Err(e) = written {
            tracing::warn!(
                "cannot record run {} in {}: {e}",
                self.spec.run,
                path.display()
            );
        }
    }

    fn report(&self) -> RankReport {
        let (state, procs, failed_ms) = {
            let inner = self.inner.lock().unwrap();
            (inner.state.clone(), inner.procs.clone(), inner.failed_ms)
        };
        let log = self.log();
        let (log_bytes, recent) = read_tail(&log, TAIL_BYTES);
        let tail: Vec<String> = {
            let lines: Vec<&str> = recent.lines().collect();
            let from = lines.len().saturating_sub(TAIL_LINES);
            lines[from..].iter().map(|l| l.to_string()).collect()
        };
        RankReport {
            run: self.spec.run.clone(),
            node: self.spec.node.clone(),
            rank: self.spec.rank,
            started_unix: self.started_unix,
            state,
            failed_ms,
            procs: self
                .spec
                .procs
                .iter()
                .zip(procs)
                .map(|(p, state)| ProcReport {
                    argv: p.argv.clone(),
                    state,
                })
                .collect(),
            log: log.display().to_string(),
            log_bytes,
            tail,
        }
    }
}

/// Whether `pid` is still the process started at `start`, in a record
/// whose boot is this one (`same_boot`).
fn check_leader(same_boot: &Result<(), String>, pid: u32, start: Option<u64>) -> Leader {
    if let Err(e) = same_boot {
        return Leader::Unknown(e.clone());
    }
    let Some(start) = start else {
        return Leader::Unknown(format!("no start time is recorded for pid {pid}"));
    };
    match proc::start_ticks(pid) {
        Ok(Some(t)) if t == start => Leader::Ours,
        Ok(Some(t)) => Leader::Unknown(format!(
            "pid {pid} is now another process (started at tick {t}; the recorded one at tick {start})"
        )),
        Ok(None) => Leader::Gone,
        Err(e) => Leader::Unknown(format!("cannot read /proc/{pid}/stat: {e}")),
    }
}

/// The processes in group `pgid` (zombies too), with their start times.
fn group_members(pgid: u32) -> Vec<(u32, u64)> {
    let Ok(pids) = proc::pids() else {
        return Vec::new();
    };
    pids.filter_map(|pid| match proc::stat(pid) {
        Ok(Some(s)) if s.pgrp == pgid => Some((pid, s.start_ticks)),
        _ => None,
    })
    .collect()
}

/// Whether group `pgid` has a member that is not a zombie (a zombie
/// leader keeps the group existing until it is reaped).
fn group_has_live_member(pgid: u32) -> bool {
    let Ok(pids) = proc::pids() else {
        return true;
    };
    pids.filter_map(|pid| proc::stat(pid).ok().flatten())
        .any(|s| s.pgrp == pgid && s.state != 'Z')
}

/// Waits until this agent's child `pid` exits, leaving it unreaped; its
/// exit code or signal.
fn wait_exit(pid: u32) -> (Option<i32>, Option<i32>) {
    loop {
        // SAFETY: a zeroed siginfo_t is valid; waitid fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits on our own child; WNOWAIT leaves it a zombie.
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if r == 0 {
            // SAFETY: filled by a successful waitid for a child's exit.
            let status = unsafe { info.si_status() };
            return match info.si_code {
                libc::CLD_EXITED => (Some(status), None),
                libc::CLD_KILLED | libc::CLD_DUMPED => (None, Some(status)),
                _ => (None, None),
            };
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return (None, None);
        }
    }
}

/// Reaps this agent's exited child `pid`.
fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: reaps our own child, which has exited (or is being killed).
    unsafe {
        libc::waitpid(pid as i32, &mut status, 0);
    }
}

/// The last `max` bytes of a file as text, and the file's size.
fn read_tail(path: &Path, max: u64) -> (u64, String) {
    let Ok(mut f) = std::fs::File::open(path) else {
        return (0, String::new());
    };
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = size.saturating_sub(max);
    let mut buf = Vec::with_capacity((size - from) as usize);
    if f.seek(SeekFrom::Start(from)).is_err() || f.read_to_end(&mut buf).is_err() {
        return (size, String::new());
    }
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    if from > 0 {
        // Drop the partial first line.
        if let Some(nl) = text.find('\n') {
            text.drain(..=nl);
        }
    }
    (size, text)
}

/// Waits until `addr` accepts a TCP connection.
async fn wait_tcp(addr: std::net::SocketAddr, limit: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let attempt =
            tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
                .await;
        if let Ok(Ok(_)) = attempt {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "{addr} did not accept a TCP connection within {}s",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+".contains(&b))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::ranks::ProcSpec;

    fn sup(dir: &Path) -> Arc<Supervisor> {
        let cred = crate::config::auth::keygen(&dir.join("key"), true).unwrap();
        Supervisor::open(dir, Arc::new(cred))
    }

    fn spec(run: &str, procs: &[&str]) -> RankSpec {
        RankSpec {
            run: run.into(),
            node: "n1".into(),
            rank: 1,
            env: [("XFER_TEST_VALUE".to_string(), "42".to_string())].into(),
            procs: procs
                .iter()
                .map(|p| ProcSpec {
                    argv: vec!["sh".into(), "-c".into(), p.to_string()],
                    wait_tcp: None,
                })
                .collect(),
            on_stop: vec![vec!["sh".into(), "-c".into(), "echo on-stop ran".into()]],
            group: vec![],
            wait_timeout_ms: 5_000,
            grace_ms: 300,
            weights: None,
            evict_page_cache: false,
            container: None,
        }
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn pids(r: &RankReport) -> Vec<u32> {
        r.procs
            .iter()
            .filter_map(|p| match p.state {
                ProcState::Running { pid } | ProcState::Exited { pid, .. } => Some(pid),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn stop_escalates_to_sigkill_and_runs_on_stop() {
        let dir = tempfile::tempdir().unwrap();
        let s = sup(dir.path());
        s.start(spec(
            "r1",
            &[
                "echo value=$XFER_TEST_VALUE; exec sleep 30",
                "trap '' TERM; echo stubborn; sleep 30 & wait; sleep 30",
            ],
        ))
        .unwrap();
        until("both running and logged", || {
            let r = &s.reports(Some("r1"))[0];
            pids(r).len() == 2 && r.tail.iter().any(|l| l == "stubborn")
        })
        .await;
        let groups = pids(&s.reports(Some("r1"))[0]);
        let reports = s.stop(None, Duration::from_millis(300), "test").await;
        let r = &reports[0];
        assert_eq!(r.state, RunState::Stopped("test".into()));
        let log = std::fs::read_to_string(&r.log).unwrap();
        assert!(log.contains("value=42"), "{log}");
        assert!(log.contains("sending SIGKILL"), "{log}");
        assert!(log.contains("on-stop ran"), "{log}");
        for g in groups {
            assert!(!group_has_live_member(g), "group {g} survived");
        }
        // A second start is accepted now that nothing runs.
        s.start(spec("r2", &["exec sleep 30"])).unwrap();
        let again = s.start(spec("r3", &["exec sleep 30"])).unwrap_err();
        assert!(again.contains("run r2 is still running"), "{again}");
        s.stop(Some("r2"), Duration::from_millis(300), "test").await;
    }

    #[tokio::test]
    async fn a_failing_process_stops_its_rank() {
        let dir = tempfile::tempdir().unwrap();
        let s = sup(dir.path());
        s.start(spec(
            "r1",
            &[
                "exec sleep 30",
                "sleep 0.3; echo 'OSError: [Errno 98] Address already in use' >&2; exit 17",
            ],
        ))
        .unwrap();
        until("failed", || !s.reports(Some("r1"))[0].state.is_live()).await;
        let r = &s.reports(Some("r1"))[0];
        match &r.state {
            RunState::Failed(why) => assert!(why.contains("exited with code 17"), "{why}"),
            other => panic!("{other:?}"),
        }
        // The fact the launcher reads the port-in-use signature from.
        assert!(
            r.tail
                .iter()
                .any(|l| l == "OSError: [Errno 98] Address already in use"),
            "{:?}",
            r.tail
        );
        for g in pids(r) {
            assert!(!group_has_live_member(g), "group {g} survived");
        }
    }

    #[tokio::test]
    async fn waits_for_tcp_and_reports_a_missing_binary() {
        let dir = tempfile::tempdir().unwrap();
        let s = sup(dir.path());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let mut sp = spec("w1", &["exec sleep 30", "exec sleep 30"]);
        sp.procs[1].wait_tcp = Some(addr);
        s.start(sp).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = &s.reports(Some("w1"))[0];
        assert_eq!(r.procs[1].state, ProcState::Waiting { on: addr });
        let _l = std::net::TcpListener::bind(addr).unwrap();
        until("second started", || {
            matches!(
                s.reports(Some("w1"))[0].procs[1].state,
                ProcState::Running { .. }
            )
        })
        .await;
        s.stop(None, Duration::from_millis(300), "done").await;

        let mut sp = spec("m1", &["exec sleep 30"]);
        sp.procs.push(ProcSpec {
            argv: vec!["no-such-engine-xyz".into()],
            wait_tcp: None,
        });
        s.start(sp).unwrap();
        until("failed", || !s.reports(Some("m1"))[0].state.is_live()).await;
        match &s.reports(Some("m1"))[0].state {
            RunState::Failed(why) => {
                assert!(
                    why.contains("`no-such-engine-xyz` is not on the PATH"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_restarted_agent_adopts_and_stops_a_live_rank() {
        let dir = tempfile::tempdir().unwrap();
        let s = sup(dir.path());
        s.start(spec("a1", &["exec sleep 30"])).unwrap();
        until("running", || pids(&s.reports(Some("a1"))[0]).len() == 1).await;
        let pid = pids(&s.reports(Some("a1"))[0])[0];
        // A new supervisor over the same root, as after `kill -9` of the agent.
        let s2 = sup(dir.path());
        let r = &s2.reports(Some("a1"))[0];
        assert_eq!(r.state, RunState::Running);
        let chunk = s2.read_log("a1", 0, 100).unwrap();
        assert!(String::from_utf8_lossy(&chunk.data).contains("starting"));
        // The record names the process for good, and only its owner reads it.
        let run_dir = dir.path().join(".xfer/runs/a1");
        let rec: Record =
            serde_json::from_slice(&std::fs::read(run_dir.join("rank.json")).unwrap()).unwrap();
        assert_eq!(rec.boot_id, Some(proc::boot_id().unwrap()));
        assert_eq!(rec.starts, vec![proc::start_ticks(pid).unwrap()]);
        assert_eq!(mode(&run_dir), 0o700);
        assert_eq!(mode(&run_dir.join("rank.json")), 0o600);
        assert_eq!(mode(&run_dir.join("rank.log")), 0o600);
        let reports = s2.stop(None, Duration::from_millis(300), "down").await;
        assert_eq!(reports[0].state, RunState::Stopped("down".into()));
        assert!(!group_has_live_member(pid));
        drop(s);
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// An unrelated process: `sleep` leading its own process group.
    struct Victim(std::process::Child);

    impl Victim {
        fn start() -> Victim {
            use std::os::unix::process::CommandExt;
            let child = std::process::Command::new("sleep")
                .arg("1000")
                .process_group(0)
                .spawn()
                .unwrap();
            Victim(child)
        }
        fn pid(&self) -> u32 {
            self.0.id()
        }
        fn start_ticks(&self) -> u64 {
            proc::start_ticks(self.pid()).unwrap().unwrap()
        }
        fn alive(&mut self) -> bool {
            self.0.try_wait().unwrap().is_none()
        }
    }

    impl Drop for Victim {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Writes a live `rank.json` for run `run` whose one process is `pid`,
    /// with the identity fields given (`None`: left out, as an older xfer
    /// wrote it).
    fn plant(root: &Path, run: &str, pid: u32, boot: Option<&str>, start: Option<u64>) {
        let dir = root.join(".xfer/runs").join(run);
        std::fs::create_dir_all(&dir).unwrap();
        let mut rec = serde_json::json!({
            "spec": spec(run, &["exec sleep 30"]),
            "started_unix": 1,
            "state": RunState::Running,
            "procs": [ProcState::Running { pid }],
        });
        if let Some(b) = boot {
            rec["boot_id"] = b.into();
        }
        if let Some(t) = start {
            rec["starts"] = serde_json::json!([t]);
        }
        std::fs::write(dir.join("rank.json"), serde_json::to_vec(&rec).unwrap()).unwrap();
    }

    fn failed_why(r: &RankReport) -> &str {
        match &r.state {
            RunState::Failed(why) => why,
            other => panic!("{}: {other:?}", r.run),
        }
    }

    #[tokio::test]
    async fn a_record_that_names_another_process_is_stale_and_never_signalled() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = Victim::start();
        let boot = proc::boot_id().unwrap();
        let zero = "00000000-0000-0000-0000-000000000000";
        plant(
            dir.path(),
            "boot",
            v.pid(),
            Some(zero),
            Some(v.start_ticks()),
        );
        plant(
            dir.path(),
            "start",
            v.pid(),
            Some(&boot),
            Some(v.start_ticks() + 1),
        );
        plant(dir.path(), "old", v.pid(), None, None);
        let s = sup(dir.path());
        let reports = s.stop(None, Duration::from_millis(300), "down").await;
        let mut runs: Vec<&str> = reports.iter().map(|r| r.run.as_str()).collect();
        runs.sort();
        assert_eq!(runs, ["boot", "old", "start"]);
        for r in &reports {
            let why = failed_why(r);
            assert!(why.starts_with("stale record: "), "{why}");
            assert!(why.contains("never signalled"), "{why}");
            let expect = match r.run.as_str() {
                "boot" => "written in another boot",
                "start" => "is now another process",
                _ => "records no boot id",
            };
            assert!(why.contains(expect), "{}: {why}", r.run);
            assert!(
                matches!(r.procs[0].state, ProcState::Exited { code: None, .. }),
                "{r:?}"
            );
        }
        assert!(v.alive(), "an unrelated process was killed");
        // Rewritten as ended: the next agent has nothing to adopt either.
        let s2 = sup(dir.path());
        assert!(s2
            .stop(None, Duration::from_millis(300), "down")
            .await
            .is_empty());
        assert!(v.alive());
    }

    #[tokio::test]
    async fn the_leader_is_checked_again_before_every_signal() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = Victim::start();
        let boot = proc::boot_id().unwrap();
        // A record that does name the victim: it is adopted as running.
        plant(dir.path(), "a", v.pid(), Some(&boot), Some(v.start_ticks()));
        let s = sup(dir.path());
        assert_eq!(s.reports(Some("a"))[0].state, RunState::Running);
        // As if it exited later and its pid went to another process.
        let run = s.runs.lock().unwrap().get("a").cloned().unwrap();
        run.inner.lock().unwrap().starts[0] = Some(v.start_ticks() + 1);
        let r = &s.stop(Some("a"), Duration::from_millis(300), "down").await[0];
        assert!(!r.state.is_live(), "{r:?}");
        assert!(v.alive(), "an unrelated process was killed");
        let log = std::fs::read_to_string(&r.log).unwrap();
        assert!(
            log.contains(&format!("not signalling process group {}", v.pid())),
            "{log}"
        );
    }

    #[tokio::test]
    async fn without_a_boot_id_nothing_adopted_is_signalled_and_nothing_starts() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = Victim::start();
        let boot = proc::boot_id().unwrap();
        plant(dir.path(), "a", v.pid(), Some(&boot), Some(v.start_ticks()));
        let cred = crate::config::auth::keygen(&dir.path().join("key"), true).unwrap();
        let s = Arc::new(Supervisor {
            dir: dir.path().join(".xfer/runs"),
            cred: Arc::new(cred),
            runs: Mutex::default(),
            boot: Err("cannot read this machine's boot id: test".into()),
        });
        s.adopt_all();
        let reports = s.stop(None, Duration::from_millis(300), "down").await;
        let why = failed_why(&reports[0]);
        assert!(why.contains("cannot read this machine's boot id"), "{why}");
        assert!(v.alive(), "an unrelated process was killed");
        let refused = s.start(spec("b", &["exec sleep 30"])).unwrap_err();
        assert!(refused.contains("boot id"), "{refused}");
    }

    #[tokio::test]
    async fn a_leader_that_exits_leaves_its_group_stoppable_until_the_rank_stops() {
        let dir = tempfile::tempdir().unwrap();
        let s = sup(dir.path());
        // The leader forks a worker that ignores SIGTERM, then fails.
        s.start(spec(
            "f1",
            &["(trap '' TERM; echo worker; exec sleep 30) & sleep 0.5; exit 3"],
        ))
        .unwrap();
        until("failed", || !s.reports(Some("f1"))[0].state.is_live()).await;
        let r = &s.reports(Some("f1"))[0];
        assert!(failed_why(r).contains("exited with code 3"), "{r:?}");
        let log = std::fs::read_to_string(&r.log).unwrap();
        assert!(log.contains("worker"), "{log}");
        for g in pids(r) {
            assert!(!group_has_live_member(g), "group {g} survived");
        }
    }
}
