//! The run record `xfer-launch up` writes: what ran where (the rendered
//! plan and its digest), what every node reported before, and how the
//! launch went. One JSON file per run, rewritten as the launch proceeds,
//! so a failed launch leaves its record too.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::check::Checked;
use crate::plan::Plan;
use crate::ready::Readiness;

/// A launch, as recorded.
#[derive(Debug, Serialize)]
pub struct Record<'a> {
    /// The run's id.
    pub run: &'a str,
    /// The cluster file it was launched from.
    pub cluster_file: String,
    /// When it started (seconds since the epoch).
    pub started_unix: u64,
    /// "starting", "ready", or "failed: why".
    pub outcome: String,
    /// The plan's BLAKE3 digest: the same digest, the same commands.
    pub config_digest: &'a str,
    /// What every node runs.
    pub plan: &'a Plan,
    /// What the check before it found.
    pub check: &'a Checked,
    /// The launch unit every node started (`None`: the nodes differed,
    /// which the check refuses unless only a warned field differs).
    pub unit: Option<&'a crate::unit::LaunchUnit>,
    /// Seconds from start to ready, once ready.
    pub time_to_ready_s: Option<f64>,
    /// What readiness measured, once ready.
    pub readiness: Option<Readiness>,
    /// The reports of the ranks that failed (the first failure first), or
    /// of every rank when the launch timed out.
    pub failure: Vec<serde_json::Value>,
}

/// Where records go: `$XDG_STATE_HOME/xfer-launch`, else
/// `~/.local/state/xfer-launch`, else `./.xfer-launch`.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("xfer-launch");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".local/state/xfer-launch");
    }
    PathBuf::from(".xfer-launch")
}

/// Why a record could not be written; each names the fix (`--record`).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The record's folder could not be created.
    #[error("cannot create {}: {source}; pass --record FILE", dir.display())]
    CreateDir {
        /// The folder.
        dir: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// The record itself could not be written.
    #[error("cannot write {}: {source}; pass --record FILE", path.display())]
    Write {
        /// The record file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
}

/// Writes the record atomically, mode 0600: the plan holds the
/// `[launch.env]` values.
pub fn write(path: &Path, rec: &Record) -> Result<(), RecordError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|source| RecordError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    let body = serde_json::to_vec_pretty(rec).expect("a record always serializes");
    write_private(path, &body).map_err(|source| RecordError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Replaces `path` with `body` durably and privately: a fresh `PATH.tmp`
/// (a leftover is unlinked first; created exclusively, so never through a
/// symlink) made mode 0600, fsynced, renamed over `path`, and the folder
/// fsynced so the rename survives a power cut.
fn write_private(path: &Path, body: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    if let Err(e) = fs::remove_file(&tmp) {
        if e.kind() != io::ErrorKind::NotFound {
            return Err(e);
        }
    }
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    // The mode is filtered by the umask; 0600 is what is meant.
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    f.write_all(body)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn private_writes_are_0600_and_never_through_a_planted_tmp() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("r.json");
        let victim = d.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join("r.json.tmp")).unwrap();
        write_private(&path, b"one").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert!(!d.path().join("r.json.tmp").exists());
    }
}
