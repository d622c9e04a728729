//! `xfer verify`: re-hash a received tree against its manifest.
//!
//! Every file is hashed chunk by chunk in parallel, so a report names not
//! only damaged files but the damaged chunks, which is what a repair needs.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use rayon::prelude::*;
use serde::Serialize;

use crate::store::scan::{hash_chunks, hash_jobs};
use crate::store::ModelRecord;
use xfer_proto::hash::Hash;
use xfer_proto::manifest::{Entry, Manifest};

/// What `xfer verify` found.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct VerifyReport {
    /// The manifest's root.
    pub root: Hash,
    /// Whether every file matched.
    pub ok: bool,
    /// Files checked.
    pub files: usize,
    /// Bytes checked.
    pub bytes: u64,
    /// Files of the manifest that are not there.
    pub missing: Vec<String>,
    /// Files whose content differs.
    pub mismatched: Vec<Mismatch>,
}

/// A file whose content differs from the manifest.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Mismatch {
    /// The file's path in the tree.
    pub path: String,
    /// Indices of chunks that differ; empty when the size is already wrong.
    pub bad_chunks: Vec<u32>,
    /// What differs.
    pub reason: String,
}

/// The manifest the agent recorded for the model in `dir`
/// (`<root>/.xfer/models/<name>.json`).
pub fn recorded_manifest(dir: &Path) -> Result<Manifest> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("cannot open {}", dir.display()))?;
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let record = dir
        .parent()
        .map(|p| p.join(".xfer/models").join(format!("{name}.json")))
        .context("a model directory has a parent")?;
    let rec = ModelRecord::load(&record).with_context(|| {
        format!(
            "no usable manifest recorded for {}; pass --manifest FILE from `xfer manifest --json`",
            dir.display()
        )
    })?;
    Ok(rec.manifest.manifest)
}

/// Checks every entry of `manifest` under `dir`.
pub fn verify(dir: &Path, manifest: &Manifest) -> Result<VerifyReport> {
    let cs = manifest.chunk_size;
    let mut missing = Vec::new();
    let mut mismatched = Vec::new();
    let mut jobs = Vec::new();
    for e in &manifest.entries {
        let path = e.path().under(dir);
        let meta = fs::symlink_metadata(&path);
        match (e, meta) {
            (_, Err(_)) => missing.push(e.path().to_string()),
            (Entry::File(f), Ok(m)) if !m.is_file() || m.len() != f.size => {
                mismatched.push(Mismatch {
                    path: f.path.to_string(),
                    bad_chunks: vec![],
                    reason: if m.is_file() {
                        format!("size {} instead of {}", m.len(), f.size)
                    } else {
                        "not a regular file".into()
                    },
                })
            }
            (Entry::File(f), Ok(_)) => {
                for (first, n) in hash_jobs(f.size, cs) {
                    jobs.push((f, path.clone(), first, n));
                }
            }
            (Entry::Symlink { target, .. }, Ok(_)) => {
                if fs::read_link(&path).ok().as_deref() != Some(Path::new(target)) {
                    mismatched.push(Mismatch {
                        path: e.path().to_string(),
                        bad_chunks: vec![],
                        reason: format!("not a symlink to {target}"),
                    });
                }
            }
            (Entry::Dir { .. }, Ok(m)) => {
                if !m.is_dir() {
                    mismatched.push(Mismatch {
                        path: e.path().to_string(),
                        bad_chunks: vec![],
                        reason: "not a directory".into(),
                    });
                }
            }
        }
    }
    let bad: Vec<(String, u32)> = jobs
        .par_iter()
        .flat_map_iter(|(f, path, first, n)| {
            let got = hash_chunks(path, f.size, *first, *n, cs).ok();
            (*first..first + n)
                .filter(move |&i| {
                    got.as_ref().map(|g| g[(i - first) as usize]) != Some(f.chunks[i as usize])
                })
                .map(|i| (f.path.to_string(), i as u32))
                .collect::<Vec<_>>()
        })
        .collect();
    for (path, i) in bad {
        match mismatched.iter_mut().find(|m| m.path == path) {
            Some(m) => m.bad_chunks.push(i),
            None => mismatched.push(Mismatch {
                path,
                bad_chunks: vec![i],
                reason: "content differs".into(),
            }),
        }
    }
    for m in &mut mismatched {
        m.bad_chunks.sort_unstable();
    }
    mismatched.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(VerifyReport {
        root: manifest.root(),
        ok: missing.is_empty() && mismatched.is_empty(),
        files: manifest.file_count(),
        bytes: manifest.total_bytes(),
        missing,
        mismatched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scan::scan;
    use xfer_proto::hash;

    #[test]
    fn finds_flipped_bytes_missing_files_and_changed_links() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let data: Vec<u8> = (0..700_000u32).map(|i| (i % 199) as u8).collect();
        fs::write(r.join("a"), &data).unwrap();
        fs::write(r.join("b"), b"bee").unwrap();
        std::os::unix::fs::symlink("a", r.join("l")).unwrap();
        let m = scan(r, hash::MIN_CHUNK_SIZE, &|_| {}).unwrap().manifest;
        assert!(verify(r, &m).unwrap().ok);

        let mut d = data.clone();
        d[3 * 65536 + 1] ^= 1;
        fs::write(r.join("a"), &d).unwrap();
        fs::remove_file(r.join("b")).unwrap();
        fs::remove_file(r.join("l")).unwrap();
        std::os::unix::fs::symlink("b", r.join("l")).unwrap();
        let rep = verify(r, &m).unwrap();
        assert!(!rep.ok);
        assert_eq!(rep.missing, ["b"]);
        assert_eq!(rep.mismatched.len(), 2);
        assert_eq!(rep.mismatched[0].path, "a");
        assert_eq!(rep.mismatched[0].bad_chunks, [3]);
        assert_eq!(rep.mismatched[1].path, "l");
    }
}
