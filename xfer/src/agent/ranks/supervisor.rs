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

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{check_run_id, LogChunk, ProcReport, ProcState, RankReport, RankSpec, RunState};
use crate::config::auth::Credential;
use crate::util::beneath::Root;
use xfer_proto::launch::LaunchRequest;

/// How much of the end of the log a report reads for its last lines.
const TAIL_BYTES: u64 = 256 << 10;
/// Lines of log in a report.
const TAIL_LINES: usize = 25;
/// The most log bytes one read returns.
pub const MAX_LOG_READ: u64 = 1 << 20;
/// How long each `on_stop` command may take.
const ON_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Where runs live, relative to the agent's root.
const RUNS: &str = ".xfer/runs";

/// The ranks this agent runs.
pub struct Supervisor {
    /// The agent's root; runs live in `.xfer/runs` beneath it.
    root: PathBuf,
    dir: PathBuf,
    cred: Arc<Credential>,
    runs: Mutex<HashMap<String, Arc<Run>>>,
}

struct Run {
    spec: RankSpec,
    /// The agent's root, and the run's folder relative to it (opened
    /// through [`Root`], never through a planted symlink), and in full.
    root: PathBuf,
    rel: PathBuf,
    dir: PathBuf,
    started_unix: u64,
    inner: Mutex<Inner>,
    /// Fired when stopping begins: processes still waiting never start.
    stopping: CancellationToken,
    /// Held while stopping, so two stops do not interleave.
    halt: tokio::sync::Mutex<()>,
}

struct Inner {
    state: RunState,
    procs: Vec<ProcState>,
    failed_ms: Option<u64>,
}

/// What `rank.json` holds.
#[derive(Serialize, Deserialize)]
struct Record {
    spec: RankSpec,
    started_unix: u64,
    state: RunState,
    procs: Vec<ProcState>,
    #[serde(default)]
    failed_ms: Option<u64>,
}

impl Supervisor {
    /// Opens `<root>/.xfer/runs`, adopting ranks whose processes outlived
    /// an earlier agent.
    pub fn open(root: &Path, cred: Arc<Credential>) -> Arc<Supervisor> {
        let sup = Arc::new(Supervisor {
            root: root.to_path_buf(),
            dir: root.join(RUNS),
            cred,
            runs: Mutex::default(),
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
            let rel = Path::new(RUNS).join(&spec.run);
            Root::open(&self.root)
                .and_then(|r| r.create_dir_all(&rel))
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let run = Arc::new(Run {
                started_unix: now_unix(),
                inner: Mutex::new(Inner {
                    state: RunState::Running,
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
                root: self.root.clone(),
                rel,
                dir,
                spec,
                stopping: CancellationToken::new(),
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

    /// Stops one run, or every live run, and reports them once stopped.
    pub async fn stop(&self, run: Option<&str>, grace: Duration, reason: &str) -> Vec<RankReport> {
        let runs: Vec<Arc<Run>> = self
            .runs
            .lock()
            .unwrap()
            .values()
            .filter(|r| run.map_or(r.state().is_live(), |id| r.spec.run == id))
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
        let mut f = Root::open(&r.root)
            .and_then(|fs| fs.open_read(&r.rel.join("rank.log")))
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
                Ok(child) => {
                    let sup = self.clone();
                    let watched = run.clone();
                    tokio::spawn(async move { sup.watch(watched, i, child).await });
                }
                Err(e) => {
                    run.set_proc(i, ProcState::NotStarted { why: e.clone() });
                    self.failed(&run, e).await;
                    return;
                }
            }
        }
    }

    async fn watch(self: Arc<Self>, run: Arc<Run>, i: usize, mut child: tokio::process::Child) {
        let pid = child.id().unwrap_or(0);
        let status = child.wait().await;
        let (code, signal) = match &status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                (s.code(), s.signal())
            }
            Err(_) => (None, None),
        };
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
                    match crate::agent::client::launch(&cred, &addr, &msg, limit).await {
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
        let Ok(fs) = Root::open(&self.root) else {
            return;
        };
        for e in entries.flatten() {
            let dir = e.path();
            let rel = Path::new(RUNS).join(e.file_name());
            let mut text = Vec::new();
            let read = fs
                .open_read(&rel.join("rank.json"))
                .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut text));
            if read.is_err() {
                continue;
            }
            let Ok(rec) = serde_json::from_slice::<Record>(&text) else {
                continue;
            };
            if check_run_id(&rec.spec.run).is_err() {
                continue;
            }
            let alive: Vec<bool> = rec.procs.iter().map(group_alive).collect();
            let live = rec.state.is_live() && alive.iter().any(|a| *a);
            let state = match (&rec.state, live) {
                (s, _) if !s.is_live() => rec.state.clone(),
                (_, true) => RunState::Running,
                (_, false) => {
                    RunState::Failed("its processes ended while the agent was down".into())
                }
            };
            let run = Arc::new(Run {
                spec: rec.spec,
                root: self.root.clone(),
                rel,
                dir,
                started_unix: rec.started_unix,
                inner: Mutex::new(Inner {
                    state,
                    procs: rec.procs,
                    failed_ms: rec.failed_ms,
                }),
                stopping: CancellationToken::new(),
                halt: tokio::sync::Mutex::new(()),
            });
            run.save();
            if live {
                tracing::info!("adopted run {} (rank {})", run.spec.run, run.spec.rank);
                let sup = self.clone();
                let polled = run.clone();
                tokio::spawn(async move { sup.poll_adopted(polled).await });
            }
            self.runs.lock().unwrap().insert(run.spec.run.clone(), run);
        }
    }

    /// Watches processes that are not this agent's children.
    async fn poll_adopted(self: Arc<Self>, run: Arc<Run>) {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if run.state() != RunState::Running {
                return;
            }
            let procs = run.inner.lock().unwrap().procs.clone();
            for (i, p) in procs.iter().enumerate() {
                if let ProcState::Running { pid } = *p {
                    if !group_alive(p) {
                        run.set_proc(
                            i,
                            ProcState::Exited {
                                pid,
                                code: None,
                                signal: None,
                            },
                        );
                        let why = format!(
                            "rank {} on {}: `{}` (pid {pid}) exited while the agent was restarting",
                            run.spec.rank, run.spec.node, run.spec.procs[i].argv[0]
                        );
                        self.failed(&run, why).await;
                        return;
                    }
                }
            }
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

    /// Opens the rank's log for appending (creating it), never through a
    /// planted symlink.
    fn open_log(&self) -> std::io::Result<std::fs::File> {
        Root::open(&self.root)?.open_append(&self.rel.join("rank.log"))
    }

    fn set_proc(&self, i: usize, s: ProcState) {
        self.inner.lock().unwrap().procs[i] = s;
        self.save();
    }

    /// Appends an agent line to the rank's log.
    fn note(&self, line: &str) {
        use std::io::Write;
        if let Ok(mut f) = self.open_log() {
            let _ = writeln!(f, "[xfer agent] {line}");
        }
    }

    fn spawn(&self, i: usize) -> Result<tokio::process::Child, String> {
        let argv = &self.spec.procs[i].argv;
        let open = || {
            self.open_log()
                .map_err(|e| format!("cannot open {}: {e}", self.log().display()))
        };
        self.note(&format!("starting {}", shell_words(argv)));
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(&self.spec.env)
            .stdin(std::process::Stdio::null())
            .stdout(open()?)
            .stderr(open()?)
            .process_group(0)
            .kill_on_drop(false);
        let child = cmd.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "`{}` is not on the PATH of the xfer agent on {}; install the engine there or start the agent with its PATH",
                argv[0], self.spec.node
            ),
            _ => format!("cannot start `{}` on {}: {e}", argv[0], self.spec.node),
        })?;
        let pid = child.id().unwrap_or(0);
        self.set_proc(i, ProcState::Running { pid });
        Ok(child)
    }

    /// Stops every process group of the rank: SIGTERM, SIGKILL after
    /// `grace`, then the `on_stop` commands. Ends in `last`.
    async fn halt(&self, grace: Duration, last: RunState) {
        let _one = self.halt.lock().await;
        if !self.state().is_live() {
            return;
        }
        let reason = match &last {
            RunState::Stopped(r) | RunState::Failed(r) | RunState::Stopping(r) => r.clone(),
            RunState::Running => String::new(),
        };
        self.inner.lock().unwrap().state = RunState::Stopping(reason.clone());
        self.stopping.cancel();
        self.note(&format!("stopping: {reason}"));
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
    }

    async fn run_on_stop(&self, argv: &[String]) {
        if argv.is_empty() {
            return;
        }
        self.note(&format!("running {}", shell_words(argv)));
        let log = || self.open_log();
        let (Ok(out), Ok(err)) = (log(), log()) else {
            return;
        };
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(&self.spec.env)
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

    fn pgids(&self) -> Vec<i32> {
        self.inner
            .lock()
            .unwrap()
            .procs
            .iter()
            .filter_map(|p| match *p {
                ProcState::Running { pid } | ProcState::Exited { pid, .. } if pid > 0 => {
                    Some(pid as i32)
                }
                _ => None,
            })
            .collect()
    }

    fn signal_all(&self, sig: i32) {
        for pgid in self.pgids() {
            // SAFETY: killpg only sends a signal; ESRCH (group gone) is fine.
            unsafe {
                libc::killpg(pgid, sig);
            }
        }
    }

    fn any_group_alive(&self) -> bool {
        let procs = self.inner.lock().unwrap().procs.clone();
        procs.iter().any(group_alive)
    }

    fn save(&self) {
        let rec = {
            let inner = self.inner.lock().unwrap();
            Record {
                spec: self.spec.clone(),
                started_unix: self.started_unix,
                state: inner.state.clone(),
                procs: inner.procs.clone(),
                failed_ms: inner.failed_ms,
            }
        };
        let written = serde_json::to_vec_pretty(&rec)
            .map_err(std::io::Error::other)
            .and_then(|b| Root::open(&self.root)?.write_durable(&self.rel.join("rank.json"), &b));
        if let Err(e) = written {
            tracing::warn!(
                "cannot record run {} in {}: {e}",
                self.spec.run,
                self.dir.join("rank.json").display()
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

/// Whether the process group led by a started process still has members
/// (its leader may have exited while forked workers live on).
fn group_alive(p: &ProcState) -> bool {
    let pid = match *p {
        ProcState::Running { pid } | ProcState::Exited { pid, .. } => pid,
        _ => return false,
    };
    if pid == 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the group exists.
    let r = unsafe { libc::killpg(pid as i32, 0) };
    if r != 0 {
        return false;
    }
    // A zombie leader keeps the group "existing" until reaped; count the
    // group as alive only if some member is not a zombie.
    group_has_live_member(pid)
}

fn group_has_live_member(pgid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the last ')': state ppid pgrp ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (state, _ppid, pgrp) = (f.next(), f.next(), f.next());
        if pgrp.and_then(|g| g.parse::<u32>().ok()) == Some(pgid) && state != Some("Z") {
            return true;
        }
    }
    false
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
        s2.stop(None, Duration::from_millis(300), "down").await;
        assert!(!group_has_live_member(pid));
        drop(s);
    }
}
