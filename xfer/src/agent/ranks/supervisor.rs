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
//!
//! A held rank reports the rendezvous it met in a file of its run folder,
//! whose contents the engine owns: the agent opens it without following
//! a symlink or blocking (an engine could make it a FIFO), reads it only
//! when it is a regular file, at most 4 KiB, on the blocking pool rather
//! than a runtime worker, and takes anything else as no valid report,
//! with that reason.

//!
//! This file holds the types and the service's own calls (start, report,
//! stop, read the log, a rank's failure told to its group); the other jobs
//! are in their own files: starting processes (`ranks::spawn`), the run's
//! record and log (`ranks::records`), adopting ranks after a restart
//! (`ranks::adopt`), and stopping and signalling process groups
//! (`ranks::signals`).

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{check_run_id, LogChunk, ProcState, RankReport, RankSpec, RunState};
use crate::config::auth::Credential;
use crate::sysinfo::proc;
use crate::util::private;
use xfer_proto::launch::{BadRunId, LaunchRequest, Probe};

/// The most log bytes one read returns.
pub const MAX_LOG_READ: u64 = 1 << 20;

/// Why a rank did not start; the text is the refusal the launcher shows.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The run id is no safe folder name.
    #[error(transparent)]
    RunId(#[from] BadRunId),
    /// A process without a command.
    #[error("rank {rank} of run {run} has no command to run; check the plan (`xfer-launch plan`)")]
    NoCommand {
        /// The run.
        run: String,
        /// The rank.
        rank: u32,
    },
    /// This boot's id is unknown (the reason), so no pid could be trusted.
    #[error("{0}; the agent starts no process it could not tell apart later from another with the same pid")]
    NoBootId(BootError),
    /// The same run is already live here.
    #[error("run {0} is already running on this node")]
    AlreadyRunning(String),
    /// Another run is live here.
    #[error("run {0} is still running on this node; stop it first (`xfer-launch down`)")]
    OtherRunning(String),
    /// The run's folder could not be made.
    #[error("cannot create {}: {source}", .dir.display())]
    Folder {
        /// The folder.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why a held rank could not be released.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// No such run on this node.
    #[error("no run {0} on this node to release; `xfer-launch status` lists the runs")]
    NoRun(String),
    /// The run is no longer live: there is nothing to release.
    #[error("run {0} is no longer running on this node; start it again with `xfer-launch up`")]
    Ended(String),
    /// The release file could not be written.
    #[error("cannot write {}: {source}; check the agent's root", .path.display())]
    Write {
        /// The release file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why a rank's log could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadLogError {
    /// No such run on this node.
    #[error("no run {0} on this node; `xfer-launch logs` lists the runs")]
    NoRun(String),
    /// The log file could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        /// The log file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why a recorded pid cannot be trusted to be the process it names: this
/// boot's id is unknown, or the record's boot is not this one.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BootError {
    /// This machine's boot id cannot be read.
    #[error("cannot read this machine's boot id (/proc/sys/kernel/random/boot_id): {0}")]
    Unreadable(Arc<std::io::Error>),
    /// The record names no boot.
    #[error("rank.json records no boot id (it was written by an older xfer)")]
    NotRecorded,
    /// The record was written in another boot.
    #[error("rank.json was written in another boot (boot id {then}; this boot is {now})")]
    OtherBoot {
        /// The record's boot id.
        then: String,
        /// This boot's id.
        now: String,
    },
}

/// The ranks this agent runs.
pub struct Supervisor {
    pub(super) dir: PathBuf,
    pub(super) cred: Arc<Credential>,
    pub(super) runs: Mutex<HashMap<String, Arc<Run>>>,
    /// This boot's id, or why it cannot be read (then no adopted process
    /// is ever signalled, and no rank starts).
    pub(super) boot: Result<String, BootError>,
}

/// One rank this agent runs or ran, and its live state.
pub(super) struct Run {
    pub(super) spec: RankSpec,
    pub(super) dir: PathBuf,
    pub(super) started_unix: u64,
    /// The boot the record was written in.
    pub(super) boot_id: Option<String>,
    /// `Ok` when that boot is this one: the recorded pids may be checked.
    pub(super) same_boot: Result<(), BootError>,
    /// Why an adopted record was not trusted: its processes were never
    /// signalled. Such a run is in every reply to a stop of all runs.
    pub(super) stale: Option<String>,
    pub(super) inner: Mutex<Inner>,
    /// Fired when stopping begins: processes still waiting never start.
    pub(super) stopping: CancellationToken,
    /// Fired when stopping ends: this agent's children may be reaped.
    pub(super) stopped: CancellationToken,
    /// Held while stopping, so two stops do not interleave.
    pub(super) halt: tokio::sync::Mutex<()>,
}

/// What changes while a rank runs.
pub(super) struct Inner {
    pub(super) state: RunState,
    pub(super) procs: Vec<ProcState>,
    /// Each process's start time (clock ticks since boot); `None` for one
    /// never started, or no longer known to be the process recorded: its
    /// group is never signalled.
    pub(super) starts: Vec<Option<u64>>,
    /// The members of each group (pgid -> pid and start time), listed
    /// while its leader was verified: signalled one by one, each checked,
    /// once the leader has exited.
    pub(super) members: HashMap<u32, Vec<(u32, u64)>>,
    pub(super) failed_ms: Option<u64>,
}

impl Supervisor {
    /// Opens `<root>/.xfer/runs`, adopting ranks whose processes outlived
    /// an earlier agent.
    pub fn open(root: &Path, cred: Arc<Credential>) -> Arc<Supervisor> {
        let boot = proc::boot_id().map_err(|e| BootError::Unreadable(Arc::new(e)));
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
    pub fn start(self: &Arc<Self>, spec: RankSpec) -> Result<RankReport, StartError> {
        check_run_id(&spec.run)?;
        if spec.procs.is_empty() || spec.procs.iter().any(|p| p.argv.is_empty()) {
            return Err(StartError::NoCommand {
                run: spec.run.clone(),
                rank: spec.rank,
            });
        }
        let boot = self.boot.clone().map_err(StartError::NoBootId)?;
        let run = {
            let mut runs = self.runs.lock().unwrap();
            if let Some((id, _)) = runs.iter().find(|(_, r)| r.state().is_live()) {
                return Err(if *id == spec.run {
                    StartError::AlreadyRunning(id.clone())
                } else {
                    StartError::OtherRunning(id.clone())
                });
            }
            let dir = self.dir.join(&spec.run);
            private::create_dir(&self.dir)
                .and_then(|_| private::create_dir(&dir))
                .map_err(|source| StartError::Folder {
                    dir: dir.clone(),
                    source,
                })?;
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

    /// The runs still live here and the model path each one's ranks were
    /// gated on (`RankSpec::weights`, else the argv's paths): what must
    /// not be evicted while they live.
    pub fn live_models(&self) -> Vec<(String, Vec<String>)> {
        self.runs
            .lock()
            .unwrap()
            .values()
            .filter(|r| r.state().is_live())
            .map(|r| {
                let mut paths: Vec<String> =
                    r.spec.weights.iter().map(|w| w.path.clone()).collect();
                for p in &r.spec.procs {
                    paths.extend(p.argv.iter().filter(|a| a.starts_with('/')).cloned());
                }
                (r.spec.run.clone(), paths)
            })
            .collect()
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

    /// The run `run`, if this agent knows it.
    fn run(&self, run: &str) -> Option<Arc<Run>> {
        self.runs.lock().unwrap().get(run).cloned()
    }

    /// Lets the held rank of `run` go on: creates its release file, which
    /// its processes wait for (a rank not started held has nothing to
    /// wait for: the same answer).
    pub fn release(&self, run: &str) -> Result<RankReport, ReleaseError> {
        let r = self
            .run(run)
            .ok_or_else(|| ReleaseError::NoRun(run.to_string()))?;
        if !r.state().is_live() {
            return Err(ReleaseError::Ended(run.to_string()));
        }
        if r.spec.held {
            let path = r.hold_file();
            private::write_atomic(&path, b"released by the launcher: its preflight passed\n")
                .map_err(|source| ReleaseError::Write { path, source })?;
        }
        Ok(r.report())
    }

    /// The rendezvous the held rank of `run` met for the preflight
    /// ([`RankSpec::rendezvous`]): its loader plugin's report, waited for
    /// up to `timeout` (the engine imports its Python first), and failed at
    /// once when the rank ended without one or its report is no regular
    /// file (`read_report`).
    pub async fn held_rendezvous(&self, run: &str, timeout: Duration) -> Probe<u64> {
        let Some(r) = self.run(run) else {
            return Probe::Failed(format!(
                "no run {run} on this node to meet the rendezvous; `xfer-launch up` starts it held first"
            ));
        };
        let store = match (&r.spec.rendezvous, r.spec.held) {
            (Some(rdv), true) => rdv.master,
            _ => {
                return Probe::Failed(format!(
                    "run {run} was not started held with a rendezvous to meet; this agent and its launcher disagree: update both"
                ))
            }
        };
        let path = r.rendezvous_file();
        let since = std::time::Instant::now();
        let outcome = |read: Result<Option<String>, ReportError>| match read {
            Ok(Some(report)) => Some(crate::agent::preflight::rendezvous::held_outcome(
                &report, store,
            )),
            Ok(None) => None,
            Err(why) => Some(Probe::Failed(why.to_string())),
        };
        loop {
            if let Some(met) = outcome(read_report(&path).await) {
                return met;
            }
            if !r.state().is_live() {
                // It may have reported, then ended, since the read above.
                if let Some(met) = outcome(read_report(&path).await) {
                    return met;
                }
                return Probe::Failed(format!(
                    "the held engine of run {run} ended before it met the other ranks; see `xfer-launch logs`"
                ));
            }
            if since.elapsed() >= timeout {
                return Probe::Failed(format!(
                    "the held engine of run {run} did not report its rendezvous within {}s: is the xfer loader plugin installed in its Python (`--load-format xfer`)? see `xfer-launch logs`",
                    timeout.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Reads up to `max` bytes of a rank's log from `offset`.
    pub fn read_log(&self, run: &str, offset: u64, max: u64) -> Result<LogChunk, ReadLogError> {
        let r = self
            .run(run)
            .ok_or_else(|| ReadLogError::NoRun(run.to_string()))?;
        let path = r.log();
        let mut f = std::fs::File::open(&path).map_err(|source| ReadLogError::Read {
            path: path.clone(),
            source,
        })?;
        let size = f.metadata().map(|m| m.len()).unwrap_or(0);
        let offset = offset.min(size);
        let take = max.min(MAX_LOG_READ).min(size - offset);
        let mut data = vec![0; take as usize];
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| f.read_exact(&mut data))
            .map_err(|source| ReadLogError::Read {
                path: path.clone(),
                source,
            })?;
        Ok(LogChunk {
            run: run.to_string(),
            node: r.spec.node.clone(),
            offset,
            data,
            size,
            live: r.state().is_live(),
        })
    }

    /// A process of `run` failed: tell the group, then stop this rank.
    pub(super) async fn failed(&self, run: &Arc<Run>, why: String) {
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
                let (id, node) = (run.spec.run.clone(), peer.node.to_string());
                tokio::spawn(async move {
                    let limit = grace + Duration::from_secs(15);
                    match crate::transport::ask::launch(&cred, &node, &addr, &msg, limit).await {
                        Ok(_) => tracing::info!("run {id}: {node} ({addr}) stopped its rank"),
                        Err(e) => tracing::info!("run {id}: {node} at {addr}: {e}"),
                    }
                });
            }
        }
        run.halt(grace, RunState::Failed(why)).await;
    }
}

/// The most bytes of a held rank's report read (the report is one short
/// line).
const MAX_REPORT: u64 = 4 << 10;

/// Why a held rank's report file is no valid report: one line naming the
/// file (the rendezvous probe's failure).
#[derive(Debug, thiserror::Error)]
pub(super) enum ReportError {
    /// Not a regular file.
    #[error("{} is {what}, not a regular file: no valid report of the held engine's rendezvous (the engine's loader plugin writes a file there); see `xfer-launch logs`", path.display())]
    NotRegular {
        /// The report's path.
        path: PathBuf,
        /// What it is instead (`a FIFO`, ...).
        what: &'static str,
    },
    /// It cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The report's path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The read on the blocking pool did not finish.
    #[error("cannot read {}: {source}", path.display())]
    Task {
        /// The report's path.
        path: PathBuf,
        /// Why.
        source: tokio::task::JoinError,
    },
}

/// A held rank's report: its first [`MAX_REPORT`] bytes, `Ok(None)` while
/// it has written none, or `Err` with why it is no valid report (one
/// line naming the file). Read on the blocking pool, off the async
/// runtime's workers.
async fn read_report(path: &Path) -> Result<Option<String>, ReportError> {
    let owned = path.to_path_buf();
    tokio::task::spawn_blocking(move || read_report_now(&owned))
        .await
        .unwrap_or_else(|source| {
            Err(ReportError::Task {
                path: path.to_path_buf(),
                source,
            })
        })
}

/// [`read_report`] itself. The engine owns the run folder's contents, so
/// the file is opened without following a symlink and without blocking
/// (an open of a FIFO for reading would wait for a writer forever), and
/// only a regular file is read.
fn read_report_now(path: &Path) -> Result<Option<String>, ReportError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let not_regular = |kind: std::fs::FileType| {
        let what = if kind.is_symlink() {
            "a symbolic link"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_dir() {
            "a folder"
        } else {
            "a device"
        };
        ReportError::NotRegular {
            path: path.to_path_buf(),
            what,
        }
    };
    let unreadable = |source| ReportError::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // A symlink (ELOOP), a socket (ENXIO): said as what they are.
        Err(e) => {
            return Err(match std::fs::symlink_metadata(path) {
                Ok(m) if !m.is_file() => not_regular(m.file_type()),
                _ => unreadable(e),
            })
        }
    };
    let meta = f.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    let mut buf = Vec::new();
    f.take(MAX_REPORT)
        .read_to_end(&mut buf)
        .map_err(unreadable)?;
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

impl Run {
    pub(super) fn state(&self) -> RunState {
        self.inner.lock().unwrap().state.clone()
    }

    pub(super) fn set_proc(&self, i: usize, s: ProcState) {
        self.inner.lock().unwrap().procs[i] = s;
        self.save();
    }
}

pub(super) use crate::util::clock::{unix_now as now_unix, unix_now_ms as now_ms};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::ranks::records::Record;
    use crate::agent::ranks::signals::group_has_live_member;
    use crate::agent::ranks::ProcSpec;
    use xfer_proto::names::NodeName;

    fn sup(dir: &Path) -> Arc<Supervisor> {
        let cred = crate::config::auth::keygen(&dir.join("key"), true).unwrap();
        Supervisor::open(dir, Arc::new(cred))
    }

    fn spec(run: &str, procs: &[&str]) -> RankSpec {
        RankSpec {
            run: run.into(),
            node: NodeName::new("n1").unwrap(),
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
            caches: None,
            held: false,
            rendezvous: None,
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
        let again = s
            .start(spec("r3", &["exec sleep 30"]))
            .unwrap_err()
            .to_string();
        assert!(again.contains("run r2 is still running"), "{again}");
        s.stop(Some("r2"), Duration::from_millis(300), "test").await;
    }

    /// Whether `run`'s log ends with a line `line` among its last ones.
    fn said(s: &Supervisor, run: &str, line: &str) -> bool {
        s.reports(Some(run))[0].tail.iter().any(|l| l == line)
    }

    /// A held rank's processes get `XFER_HOLD_FILE` in the rank's own
    /// folder, absent until `release`; a rank not held gets none (and a
    /// spec cannot set it: `launch_rules`); an unknown or ended run is
    /// refused with its reason.
    #[tokio::test]
    async fn a_held_rank_waits_for_its_release_file_and_only_release_creates_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = sup(dir.path());
        let waiter = "echo hold=$XFER_HOLD_FILE; while [ ! -e \"$XFER_HOLD_FILE\" ]; do sleep 0.02; done; echo released; exec sleep 30";
        let mut held = spec("h1", &[waiter]);
        held.held = true;
        s.start(held).unwrap();
        let hold = dir.path().join(".xfer/runs/h1/released");
        until("the held process to say where it waits", || {
            s.reports(Some("h1"))[0]
                .tail
                .iter()
                .any(|l| l.starts_with("hold="))
        })
        .await;
        let tail = s.reports(Some("h1"))[0].tail.clone();
        assert!(
            tail.contains(&format!("hold={}", hold.display())),
            "{tail:?}"
        );
        assert!(!hold.exists());
        assert!(!tail.iter().any(|l| l == "released"), "{tail:?}");
        s.release("h1").unwrap();
        until("the held process to go on", || said(&s, "h1", "released")).await;
        assert_eq!(mode(&hold), 0o600);
        let err = s.release("nope").unwrap_err().to_string();
        assert!(err.contains("no run nope on this node"), "{err}");
        s.stop(Some("h1"), Duration::from_millis(300), "test").await;
        let err = s.release("h1").unwrap_err().to_string();
        assert!(err.contains("no longer running"), "{err}");

        s.start(spec(
            "n1",
            &["echo hold=${XFER_HOLD_FILE:-none}; exec sleep 30"],
        ))
        .unwrap();
        until("the rank not held to start", || said(&s, "n1", "hold=none")).await;
        s.stop(Some("n1"), Duration::from_millis(300), "test").await;
        // Every rank gets its agent's loader-link socket, under the root.
        s.start(spec("b1", &["echo sock=$XFER_AGENT_SOCKET; exec sleep 30"]))
            .unwrap();
        let sock = dir.path().join(".xfer/agent.sock");
        until("the rank to say its XFER_AGENT_SOCKET", || {
            said(&s, "b1", &format!("sock={}", sock.display()))
        })
        .await;
        s.stop(Some("b1"), Duration::from_millis(300), "test").await;
        assert!(xfer_proto::launch_rules::check_env("XFER_AGENT_SOCKET", "/tmp/evil").is_err());
        s.start(spec("n1", &["exec sleep 30"])).unwrap();
        s.release("n1").unwrap();
        assert!(!dir.path().join(".xfer/runs/n1/released").exists());
        s.stop(Some("n1"), Duration::from_millis(300), "test").await;
        assert!(xfer_proto::launch_rules::check_env("XFER_HOLD_FILE", "/tmp/x").is_err());
    }

    /// The rendezvous a held rank of node n2 is started to meet.
    fn held_rendezvous() -> xfer_proto::launch::RendezvousRequest {
        xfer_proto::launch::RendezvousRequest {
            node: "n2".parse().unwrap(),
            python_of: "vllm".into(),
            rank: 1,
            world: 2,
            master: "10.0.0.1:8000".parse().unwrap(),
            fabric_if: "fab0".into(),
            timeout_ms: 25_000,
        }
    }

    /// A held rank with a rendezvous to meet gets what to meet and where to
    /// report it (variables no spec may set); the agent reads the report,
    /// says at once when the rank ended without one, and refuses a run that
    /// was not started to meet it.
    #[tokio::test]
    async fn a_held_ranks_rendezvous_is_read_from_its_report() {
        let dir = tempfile::tempdir().unwrap();
        let s = sup(dir.path());
        let rdv = held_rendezvous();
        let held = |run: &str, script: &str| {
            let mut h = spec(run, &[script]);
            h.held = true;
            h.rendezvous = Some(rdv.clone());
            h
        };
        let reporter = "echo \"meet=$XFER_RENDEZVOUS\"; echo 'ok 12' > \"$XFER_RENDEZVOUS_FILE\"; exec sleep 30";
        s.start(held("m1", reporter)).unwrap();
        let long = Duration::from_secs(120);
        assert_eq!(s.held_rendezvous("m1", long).await, Probe::Ok(12));
        assert!(said(&s, "m1", "meet=10.0.0.1:8000 1 2 22.0"));
        s.stop(Some("m1"), Duration::from_millis(300), "test").await;

        s.start(held("m2", "echo 'failed RuntimeError: Connection refused' > \"$XFER_RENDEZVOUS_FILE\"; exec sleep 30"))
            .unwrap();
        match s.held_rendezvous("m2", long).await {
            Probe::Failed(why) => {
                assert_eq!(why, "in the held engine's worker, through the store at 10.0.0.1:8000: RuntimeError: Connection refused")
            }
            other => panic!("{other:?}"),
        }
        s.stop(Some("m2"), Duration::from_millis(300), "test").await;

        s.start(held("m3", "exit 3")).unwrap();
        match s.held_rendezvous("m3", long).await {
            Probe::Failed(why) => {
                assert!(why.contains("ended before it met the other ranks"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        s.stop(Some("m3"), Duration::from_millis(300), "test").await;

        // A rank that reported, then ended (a worker's failed meeting):
        // its report, not "ended before", however the two interleave.
        s.start(held(
            "m5",
            "echo 'failed OSError: refused' > \"$XFER_RENDEZVOUS_FILE\"; exit 1",
        ))
        .unwrap();
        match s.held_rendezvous("m5", long).await {
            Probe::Failed(why) => assert!(why.ends_with("OSError: refused"), "{why}"),
            other => panic!("{other:?}"),
        }
        s.stop(Some("m5"), Duration::from_millis(300), "test").await;

        s.start(spec("m4", &["exec sleep 30"])).unwrap();
        match s.held_rendezvous("m4", long).await {
            Probe::Failed(why) => assert!(why.contains("was not started held"), "{why}"),
            other => panic!("{other:?}"),
        }
        s.stop(Some("m4"), Duration::from_millis(300), "test").await;
        match s.held_rendezvous("nope", long).await {
            Probe::Failed(why) => assert!(why.contains("no run nope on this node"), "{why}"),
            other => panic!("{other:?}"),
        }
        for key in ["XFER_RENDEZVOUS", "XFER_RENDEZVOUS_FILE"] {
            assert!(xfer_proto::launch_rules::check_env(key, "x").is_err());
        }
    }

    /// Issue 53, finding 8: a held rank that makes its report a FIFO (or
    /// a symlink, or a folder) does not hang the agent's read; the read
    /// says at once that the file is not a regular file, and changes
    /// nothing (the rank still runs, the FIFO is still there). The read
    /// runs in its own task on a runtime of two workers, as on a 2-core
    /// agent, and the test waits for it on its own thread, so that a read
    /// that blocks a worker fails the test within 10 s rather than hang.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_ranks_report_that_is_no_regular_file_is_refused_at_once() {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        let dir = tempfile::tempdir().unwrap();
        let s = sup(dir.path());
        let held = |run: &str, script: &str| {
            let mut h = spec(run, &[script]);
            h.held = true;
            h.rendezvous = Some(held_rendezvous());
            h
        };
        for (run, make, what) in [
            ("q1", "mkfifo \"$XFER_RENDEZVOUS_FILE\"", "a FIFO"),
            (
                "q2",
                "ln -s /etc/hostname \"$XFER_RENDEZVOUS_FILE\"",
                "a symbolic link",
            ),
            ("q3", "mkdir \"$XFER_RENDEZVOUS_FILE\"", "a folder"),
        ] {
            s.start(held(run, &format!("{make}; echo made; exec sleep 30")))
                .unwrap();
            let report = dir.path().join(".xfer/runs").join(run).join("rendezvous");
            let sup = s.clone();
            let id = run.to_string();
            let (tx, rx) = std::sync::mpsc::channel();
            tokio::spawn(async move {
                let _ = tx.send(sup.held_rendezvous(&id, Duration::from_secs(120)).await);
            });
            // Waited for on this thread, not the runtime's: a worker
            // blocked in the read stalls the runtime's timers too.
            let met = match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(met) => met,
                Err(_) => {
                    // Let a read blocked in open(2) go (a writer came and
                    // left), so the runtime can shut down, then fail.
                    drop(
                        std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .custom_flags(libc::O_NONBLOCK)
                            .open(&report),
                    );
                    panic!("{run}: the agent's read of a held rank's report hung on {what}");
                }
            };
            match met {
                Probe::Failed(why) => {
                    assert_eq!(
                        why,
                        format!(
                            "{} is {what}, not a regular file: no valid report of the held engine's rendezvous (the engine's loader plugin writes a file there); see `xfer-launch logs`",
                            report.display()
                        )
                    );
                    assert!(!why.contains('\n'), "{why}");
                }
                other => panic!("{run}: {other:?}"),
            }
            until("the rank to go on", || said(&s, run, "made")).await;
            assert_eq!(s.reports(Some(run))[0].state, RunState::Running, "{run}");
            let kind = std::fs::symlink_metadata(&report).unwrap().file_type();
            let unchanged = match what {
                "a FIFO" => kind.is_fifo(),
                "a symbolic link" => kind.is_symlink(),
                _ => kind.is_dir(),
            };
            assert!(unchanged, "{run}: {kind:?}");
            s.stop(Some(run), Duration::from_millis(300), "test").await;
        }
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
            boot: Err(BootError::Unreadable(Arc::new(std::io::Error::other(
                "test",
            )))),
        });
        s.adopt_all();
        let reports = s.stop(None, Duration::from_millis(300), "down").await;
        let why = failed_why(&reports[0]);
        assert!(why.contains("cannot read this machine's boot id"), "{why}");
        assert!(v.alive(), "an unrelated process was killed");
        let refused = s
            .start(spec("b", &["exec sleep 30"]))
            .unwrap_err()
            .to_string();
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
