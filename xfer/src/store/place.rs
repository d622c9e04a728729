//! Placing files in a model's folder: the folders leading to a path are
//! made one by one and never through a symlink, and a file or symlink is
//! put in place by an atomic `make` (a rename), with its folder fsynced.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::{io_refusal, StoreError};
use xfer_proto::relpath::RelPath;

fn unsafe_path(p: &Path, reason: &str) -> StoreError {
    StoreError::Unsafe {
        path: p.display().to_string(),
        reason: reason.into(),
    }
}

/// Makes sure `p` is a real directory, creating it if missing. Refuses a
/// symlink or a file in its place.
fn ensure_dir(p: &Path) -> Result<(), StoreError> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_symlink() => Err(unsafe_path(
            p,
            "it is a symlink; xfer never writes through links (remove it)",
        )),
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(unsafe_path(
            p,
            "a file is in the way of a directory (remove it)",
        )),
        Err(e) if e.kind() == ErrorKind::NotFound => match fs::create_dir(p) {
            Err(e) if e.kind() != ErrorKind::AlreadyExists => Err(io_refusal(p, e)),
            _ => ensure_dir_exists_now(p),
        },
        Err(e) => Err(io_refusal(p, e)),
    }
}

/// After a racing `create_dir`, checks what is there now.
fn ensure_dir_exists_now(p: &Path) -> Result<(), StoreError> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() && !m.file_type().is_symlink() => Ok(()),
        Ok(_) => Err(unsafe_path(
            p,
            "something other than a directory appeared here (remove it)",
        )),
        Err(e) => Err(io_refusal(p, e)),
    }
}

/// Creates the directories leading to `rel` under `dir`, one by one and
/// never through a symlink, and returns the path of `rel`.
fn prepare(dir: &Path, rel: &RelPath) -> Result<PathBuf, StoreError> {
    ensure_dir(dir)?;
    for anc in rel.ancestors() {
        ensure_dir(&dir.join(anc))?;
    }
    Ok(rel.under(dir))
}

/// Puts a file or symlink at `rel` under `dir` with `make(final_path)`
/// (which must replace atomically, e.g. by rename). Refuses to go through a
/// symlink or to replace a directory, so nothing outside `dir` is reached.
pub fn place(
    dir: &Path,
    rel: &RelPath,
    make: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<PathBuf, StoreError> {
    let to = prepare(dir, rel)?;
    if let Ok(m) = fs::symlink_metadata(&to) {
        if m.is_dir() {
            return Err(unsafe_path(
                &to,
                "a directory is in the way of a file (remove it)",
            ));
        }
    }
    make(&to).map_err(|e| io_refusal(&to, e))?;
    if let Some(parent) = to.parent() {
        if let Ok(d) = File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok(to)
}

/// Makes sure the directory `rel` exists under `dir` (an existing one is fine).
pub fn place_dir(dir: &Path, rel: &RelPath) -> Result<PathBuf, StoreError> {
    let to = prepare(dir, rel)?;
    ensure_dir(&to)?;
    Ok(to)
}
