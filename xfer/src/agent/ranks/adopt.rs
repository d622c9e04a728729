//! Adopting ranks after an agent restart: each `rank.json` read back,
//! its processes checked against this boot and their start times (a record
//! that cannot be verified is stale and never signalled), and the live
//! ones polled, since they are not this agent's children.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::check_run_id;
use super::records::Record;
use super::signals::{check_leader, group_has_live_member, Leader};
use super::supervisor::{BootError, Inner, Run, Supervisor};
use super::{ProcState, RunState};

impl Supervisor {
    pub(super) fn adopt_all(self: &Arc<Self>) {
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
    pub(super) fn adopt(self: &Arc<Self>, dir: PathBuf, rec: Record) -> Option<Arc<Run>> {
        let same_boot = match (&self.boot, &rec.boot_id) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), None) => Err(BootError::NotRecorded),
            (Ok(now), Some(then)) if now != then => Err(BootError::OtherBoot {
                then: then.clone(),
                now: now.clone(),
            }),
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
    pub(super) async fn poll_adopted(self: Arc<Self>, run: Arc<Run>) {
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
