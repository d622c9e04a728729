//! Starting a rank's processes: each waits for its address if it names
//! one, starts from an absolute path as the leader of its own process
//! group with the rank's checked environment, and is watched (not reaped)
//! until its rank stops.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::supervisor::{Run, Supervisor};
use super::{ProcState, RunState};
use crate::sysinfo::proc;
use xfer_proto::launch_rules;

/// Why a rank's process did not start: one line, recorded as its
/// `NotStarted` reason and in the rank's failure.
#[derive(Debug, thiserror::Error)]
pub(super) enum SpawnError {
    /// Its program is not on the agent's `PATH`.
    #[error("{node}: {source}")]
    Program {
        /// This node.
        node: String,
        /// The lookup's error.
        source: crate::util::program::ResolveError,
    },
    /// The rank's log cannot be opened.
    #[error("cannot open {}: {source}", path.display())]
    Log {
        /// The log.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The kernel refused to start it.
    #[error("cannot start `{program}` on {node}: {source}")]
    Start {
        /// `argv[0]`.
        program: String,
        /// This node.
        node: String,
        /// Why.
        source: std::io::Error,
    },
    /// Started, but its start time is unreadable: killed.
    #[error("cannot read the start time of `{program}` (pid {pid}): {}; killed it, since it could not be stopped safely later", why.as_ref().map_or("no /proc entry".to_string(), |e| e.to_string()))]
    StartTime {
        /// `argv[0]`.
        program: String,
        /// Its pid.
        pid: u32,
        /// The read's error; `None`: no `/proc` entry.
        why: Option<std::io::Error>,
    },
    /// The address it waits for never accepted a connection.
    #[error("{addr} did not accept a TCP connection within {secs}s")]
    NotListening {
        /// The address.
        addr: std::net::SocketAddr,
        /// How long it was given.
        secs: u64,
    },
}

impl Supervisor {
    /// Starts the processes in order, then watches them.
    pub(super) async fn drive(self: Arc<Self>, run: Arc<Run>) {
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
                    run.set_proc(i, ProcState::NotStarted { why: e.to_string() });
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
                    let why = e.to_string();
                    run.set_proc(i, ProcState::NotStarted { why: why.clone() });
                    self.failed(&run, why).await;
                    return;
                }
            }
        }
    }

    /// Waits for this agent's child `pid` to exit, without reaping it:
    /// the zombie keeps its pid (and so its process group's id) from being
    /// handed out again until the rank has stopped.
    pub(super) async fn watch(self: Arc<Self>, run: Arc<Run>, i: usize, pid: u32) {
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
}

impl Run {
    /// Starts process `i` as the leader of its own process group, and
    /// records its pid and start time.
    pub(super) fn spawn(&self, i: usize) -> Result<u32, SpawnError> {
        use std::os::unix::process::CommandExt;
        let argv = &self.spec.procs[i].argv;
        let open = || {
            self.open_log().map_err(|source| SpawnError::Log {
                path: self.log(),
                source,
            })
        };
        let program = self.program(argv)?;
        self.note(&format!("starting {}", shell_words(argv)));
        // A std child: dropping it neither kills nor reaps; `watch` waits.
        let mut cmd = std::process::Command::new(program);
        // The rank's loader plugin asks this agent on its socket (a spec
        // may not set the key: `launch_rules`).
        cmd.env(xfer_proto::local::SOCKET_KEY, self.loader_socket());
        cmd.args(&argv[1..])
            .envs(self.env())
            .stdin(std::process::Stdio::null())
            .stdout(open()?)
            .stderr(open()?)
            .process_group(0);
        if self.spec.held {
            // The agent's own key (a spec may not set it): see RankSpec::held.
            cmd.env(launch_rules::HOLD_FILE_KEY, self.hold_file());
            if let Some(r) = &self.spec.rendezvous {
                let inner = crate::agent::preflight::rendezvous::inner_timeout(r.timeout_ms);
                cmd.env(
                    launch_rules::RENDEZVOUS_KEY,
                    format!(
                        "{} {} {} {:.1}",
                        r.master,
                        r.rank,
                        r.world,
                        inner.as_secs_f64()
                    ),
                )
                .env(launch_rules::RENDEZVOUS_FILE_KEY, self.rendezvous_file());
            }
        }
        let child = cmd.spawn().map_err(|source| SpawnError::Start {
            program: argv[0].clone(),
            node: self.spec.node.to_string(),
            source,
        })?;
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
                return Err(SpawnError::StartTime {
                    program: argv[0].clone(),
                    pid,
                    why: other.err(),
                });
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

    /// The program `argv` starts, by absolute path: as recorded, or a name
    /// (from an older record) looked up on the agent's own `PATH`.
    pub(super) fn program(&self, argv: &[String]) -> Result<PathBuf, SpawnError> {
        crate::util::program::resolve(&argv[0]).map_err(|source| SpawnError::Program {
            node: self.spec.node.to_string(),
            source,
        })
    }

    /// What the rank adds to the agent's environment: its keys within
    /// [`launch_rules`] (the launch service refused any other; a record
    /// may be older than the rules).
    pub(super) fn env(&self) -> impl Iterator<Item = (&String, &String)> {
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
}

/// Waits until this agent's child `pid` exits, leaving it unreaped; its
/// exit code or signal.
pub(super) fn wait_exit(pid: u32) -> (Option<i32>, Option<i32>) {
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
pub(super) fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: reaps our own child, which has exited (or is being killed).
    unsafe {
        libc::waitpid(pid as i32, &mut status, 0);
    }
}

/// Waits until `addr` accepts a TCP connection.
pub(super) async fn wait_tcp(
    addr: std::net::SocketAddr,
    limit: Duration,
) -> Result<(), SpawnError> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let attempt =
            tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
                .await;
        if let Ok(Ok(_)) = attempt {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(SpawnError::NotListening {
                addr,
                secs: limit.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(super) fn shell_words(argv: &[String]) -> String {
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
