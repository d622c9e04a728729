//! A rank's files: `rank.json`, the record that survives an agent restart
//! (written durably, mode 0600), and `rank.log`, its processes' output and
//! the agent's own lines; a report reads the log's last lines.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::supervisor::{Inner, Run};
use super::{ProcReport, ProcState, RankReport, RankSpec, RunState};
use crate::util::private;

/// How much of the end of the log a report reads for its last lines.
const TAIL_BYTES: u64 = 256 << 10;
/// Lines of log in a report.
const TAIL_LINES: usize = 25;

/// What `rank.json` holds. A record without `boot_id` or `starts` (from
/// an older xfer) is stale on adoption.
#[derive(Serialize, Deserialize)]
pub(super) struct Record {
    pub(super) spec: RankSpec,
    pub(super) started_unix: u64,
    pub(super) state: RunState,
    pub(super) procs: Vec<ProcState>,
    #[serde(default)]
    pub(super) failed_ms: Option<u64>,
    #[serde(default)]
    pub(super) boot_id: Option<String>,
    #[serde(default)]
    pub(super) starts: Vec<Option<u64>>,
}

impl Run {
    pub(super) fn log(&self) -> PathBuf {
        self.dir.join("rank.log")
    }

    /// The loader link's socket ([`crate::agent::local`]) of the agent
    /// whose root holds this rank's folder (`ROOT/.xfer/runs/RUN`).
    pub(super) fn loader_socket(&self) -> PathBuf {
        let root = self
            .dir
            .ancestors()
            .nth(3)
            .unwrap_or(std::path::Path::new("/"));
        crate::agent::local::socket_path(root)
    }

    /// The file whose existence releases a held rank
    /// ([`RankSpec::held`](xfer_proto::launch::RankSpec::held)): in the
    /// rank's own folder, created only by [`Supervisor::release`](super::supervisor::Supervisor::release).
    pub(super) fn hold_file(&self) -> PathBuf {
        self.dir.join("released")
    }

    /// Where a held rank's loader plugin reports the rendezvous it met for
    /// the preflight ([`RankSpec::rendezvous`](xfer_proto::launch::RankSpec::rendezvous)).
    pub(super) fn rendezvous_file(&self) -> PathBuf {
        self.dir.join("rendezvous")
    }

    /// Opens the rank's log to append (created mode 0600: engines print
    /// their environment), never through a symlink.
    pub(super) fn open_log(&self) -> std::io::Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.log())
    }

    /// Appends an agent line to the rank's log.
    pub(super) fn note(&self, line: &str) {
        use std::io::Write;
        if let Ok(mut f) = self.open_log() {
            let _ = writeln!(f, "[xfer agent] {line}");
        }
    }

    pub(super) fn save(&self) {
        let inner = self.inner.lock().unwrap();
        self.save_with(&inner);
    }

    /// [`Run::save`] with the state already locked.
    pub(super) fn save_with(&self, inner: &Inner) {
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

    pub(super) fn report(&self) -> RankReport {
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

/// The last `max` bytes of a file as text, and the file's size.
pub(super) fn read_tail(path: &Path, max: u64) -> (u64, String) {
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
