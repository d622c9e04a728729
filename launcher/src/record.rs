//! The run record `xfer-launch up` writes: what ran where (the rendered
//! plan and its digest), what every node reported before, and how the
//! launch went. One JSON file per run, rewritten as the launch proceeds,
//! so a failed launch leaves its record too.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::check::Checked;
use crate::plan::Plan;
use crate::ready::Readiness;

/// A launch, as recorded.
#[derive(Debug, Serialize)]
pub struct Record<'a> {
    pub run: &'a str,
    pub cluster_file: String,
    pub started_unix: u64,
    /// "starting", "ready", or "failed: why".
    pub outcome: String,
    /// The plan's BLAKE3 digest: the same digest, the same commands.
    pub config_digest: &'a str,
    pub plan: &'a Plan,
    pub check: &'a Checked,
    pub time_to_ready_s: Option<f64>,
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

/// Writes the record atomically, mode 0600: the plan holds the
/// `[launch.env]` values.
pub fn write(path: &Path, rec: &Record) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}; pass --record FILE", dir.display()))?;
    }
    let body = serde_json::to_vec_pretty(rec).expect("a record always serializes");
    xfer::util::private::write_atomic(path, &body)
        .map_err(|e| format!("cannot write {}: {e}; pass --record FILE", path.display()))
}
