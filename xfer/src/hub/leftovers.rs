//! Incomplete downloads nobody will finish: the `*.xfer.incomplete` files
//! and `*.xfer.parts` sidecars of files the current revision no longer has
//! (the repo changed on the server between an interrupted pull and its
//! re-run). Removed after a pull completes, unless another pull holds the
//! file's lock, so a cache does not keep dead partial blobs forever; and
//! all of them after a pull was cancelled ([`remove_unheld`]).

use std::collections::HashSet;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Suffixes of what `hub::download` leaves while a file downloads.
const INCOMPLETE: &str = ".xfer.incomplete";
const SIDECAR: &str = ".xfer.parts";

/// Removes, under `dir` (recursively), every incomplete file and sidecar
/// not in `keep` and not locked by a running pull. Returns what it removed.
pub fn remove_stale(dir: &Path, keep: &HashSet<PathBuf>) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    walk(dir, keep, &mut removed);
    removed
}

/// After a cancelled pull: removes, under `dir`, every incomplete file
/// and sidecar no running pull holds; whether none is left held (the
/// cancelled pull's own tasks may still be letting go of theirs).
pub fn remove_unheld(dir: &Path) -> bool {
    remove_stale(dir, &HashSet::new());
    let mut held = false;
    any_held(dir, &mut held);
    !held
}

fn any_held(dir: &Path, held: &mut bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        match e.file_type() {
            Ok(k) if k.is_dir() => any_held(&path, held),
            Ok(k) if k.is_file() => {
                *held |= path.to_string_lossy().ends_with(INCOMPLETE) && locked(&path)
            }
            _ => {}
        }
    }
}

fn walk(dir: &Path, keep: &HashSet<PathBuf>, removed: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            walk(&path, keep, removed);
            continue;
        }
        if !kind.is_file() || keep.contains(&path) {
            continue;
        }
        let name = e.file_name();
        let name = name.to_string_lossy();
        let incomplete = if name.ends_with(INCOMPLETE) {
            path.clone()
        } else if let Some(stem) = name.strip_suffix(SIDECAR) {
            path.with_file_name(format!("{stem}{INCOMPLETE}"))
        } else {
            continue;
        };
        if keep.contains(&incomplete) || locked(&incomplete) {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            tracing::info!(
                "removed {}: no file of this revision needs it",
                path.display()
            );
            removed.push(path);
        }
    }
}

/// Whether a running pull holds `incomplete` (it keeps an exclusive flock
/// on the files it downloads).
fn locked(incomplete: &Path) -> bool {
    let Ok(f) = std::fs::File::open(incomplete) else {
        return false;
    };
    // SAFETY: flock on an fd we own; released when `f` closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_partials_go_and_kept_or_locked_ones_stay() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let w = |n: &str| {
            let p = d.join(n);
            std::fs::write(&p, b"x").unwrap();
            p
        };
        let old = w("aaaa.xfer.incomplete");
        let old_parts = w("aaaa.xfer.parts");
        let mine = w("bbbb.xfer.incomplete");
        let mine_parts = w("bbbb.xfer.parts");
        let busy = w("cccc.xfer.incomplete");
        let blob = w("dddd");
        let hold = std::fs::File::open(&busy).unwrap();
        assert_eq!(unsafe { libc::flock(hold.as_raw_fd(), libc::LOCK_EX) }, 0);
        let keep: HashSet<PathBuf> = [mine.clone(), mine_parts.clone()].into();
        let mut gone = remove_stale(d, &keep);
        gone.sort();
        assert_eq!(gone, vec![old, old_parts]);
        for p in [&mine, &mine_parts, &busy, &blob] {
            assert!(p.exists(), "{} must stay", p.display());
        }
    }
}
