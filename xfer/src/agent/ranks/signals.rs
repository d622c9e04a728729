//! Stopping a rank and signalling its process groups: SIGTERM, SIGKILL
//! after the grace period, then the `on_stop` commands. A group is
//! signalled only while its leader is still the process recorded (same
//! boot, same start time), checked before every signal; once the leader
//! has exited, the members listed while it was verified are signalled one
//! by one, each checked the same way.

use std::time::Duration;

use super::spawn::shell_words;
use super::supervisor::Run;
use super::ProcState;
use super::RunState;
use crate::sysinfo::proc;

/// How long each `on_stop` command may take.
const ON_STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a recorded group leader is still the process recorded.
pub(super) enum Leader {
    /// The same process (it may be a zombie not yet reaped).
    Ours,
    /// No process has the pid now.
    Gone,
    /// Another process has the pid, or it cannot be checked: why.
    Unknown(String),
}

impl Run {
    /// Stops every process group of the rank: SIGTERM, SIGKILL after
    /// `grace`, then the `on_stop` commands. Ends in `last`.
    pub(super) async fn halt(&self, grace: Duration, last: RunState) {
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

    pub(super) async fn run_on_stop(&self, argv: &[String]) {
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

    /// The started processes: index, pid and recorded start time.
    pub(super) fn leaders(&self) -> Vec<(usize, u32, Option<u64>)> {
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
    pub(super) fn leader(&self, pid: u32, start: Option<u64>) -> Leader {
        check_leader(&self.same_boot, pid, start)
    }

    /// Stops trusting process `i`: its group is never signalled again.
    pub(super) fn distrust(&self, i: usize, pid: u32, why: &str) {
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
    pub(super) fn list_members(&self) {
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
    pub(super) fn listed_members(&self, pgid: u32) -> Vec<u32> {
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
    pub(super) fn signal_all(&self, sig: i32) {
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
    pub(super) fn any_group_alive(&self) -> bool {
        self.leaders()
            .into_iter()
            .any(|(_, pid, start)| match self.leader(pid, start) {
                Leader::Ours => group_has_live_member(pid),
                Leader::Gone => !self.listed_members(pid).is_empty(),
                Leader::Unknown(_) => false,
            })
    }
}

/// Whether `pid` is still the process started at `start`, in a record
/// whose boot is this one (`same_boot`).
pub(super) fn check_leader(
    same_boot: &Result<(), super::supervisor::BootError>,
    pid: u32,
    start: Option<u64>,
) -> Leader {
    if let Err(e) = same_boot {
        return Leader::Unknown(e.to_string());
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
pub(super) fn group_members(pgid: u32) -> Vec<(u32, u64)> {
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
pub(super) fn group_has_live_member(pgid: u32) -> bool {
    let Ok(pids) = proc::pids() else {
        return true;
    };
    pids.filter_map(|pid| proc::stat(pid).ok().flatten())
        .any(|s| s.pgrp == pgid && s.state != 'Z')
}
