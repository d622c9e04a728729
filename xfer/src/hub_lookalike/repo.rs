//! The Hub look-alike's repo: one folder's files listed and hashed once at
//! start (git blob sha1 for all, sha256 for LFS files), the commit id derived
//! from that listing, and the server's shared state.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use sha1::Digest as _;
use tokio_util::sync::CancellationToken;
use xfer_proto::relpath::RelPath;

use super::{HASH_BUF, LFS_MIN_SIZE, LFS_SUFFIXES};

/// One file of the repo, hashed.
pub(super) struct Entry {
    /// The path inside the repo, `/`-separated.
    pub(super) path: String,
    pub(super) abs: PathBuf,
    pub(super) size: u64,
    /// The git blob sha1 of the contents.
    pub(super) sha1: String,
    /// The sha256 of the contents, for LFS files only.
    pub(super) sha256: Option<String>,
}

impl Entry {
    /// What `ETag` names: the sha256 of an LFS file, else the git sha1.
    pub(super) fn etag(&self) -> &str {
        self.sha256.as_deref().unwrap_or(&self.sha1)
    }

    /// The LFS pointer git stores in place of an LFS file.
    pub(super) fn pointer(&self) -> Option<String> {
        self.sha256.as_ref().map(|sha| {
            format!(
                "version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {}\n",
                self.size
            )
        })
    }

    /// The `oid` the tree lists: the git sha1 of the pointer for an LFS
    /// file, as the Hub does.
    pub(super) fn tree_oid(&self) -> String {
        match self.pointer() {
            Some(p) => git_blob_sha1(p.as_bytes()),
            None => self.sha1.clone(),
        }
    }
}

/// The served repo and the server's shared state.
pub(super) struct Repo {
    pub(super) id: String,
    pub(super) commit: String,
    pub(super) files: BTreeMap<String, Entry>,
    pub(super) dirs: BTreeSet<String>,
    /// `http://127.0.0.1:PORT`, for the `Link` header.
    pub(super) origin: String,
    pub(super) rate: u64,
    pub(super) served: Arc<AtomicU64>,
    pub(super) stop: CancellationToken,
}

impl Repo {
    pub(super) fn new(
        id: &str,
        files: Vec<Entry>,
        origin: String,
        rate: u64,
        served: Arc<AtomicU64>,
        stop: CancellationToken,
    ) -> Repo {
        let files: BTreeMap<String, Entry> =
            files.into_iter().map(|e| (e.path.clone(), e)).collect();
        let dirs = files
            .keys()
            .flat_map(|p| p.match_indices('/').map(|(i, _)| p[..i].to_string()))
            .collect();
        // As hub_server.py: a sha1 over the sorted (path, tree oid) list.
        let mut listing = sha1::Sha1::new();
        for e in files.values() {
            listing.update(format!("{}\0{}\n", e.path, e.tree_oid()));
        }
        Repo {
            id: id.to_string(),
            commit: hex::encode(listing.finalize()),
            files,
            dirs,
            origin,
            rate,
            served,
            stop,
        }
    }

    pub(super) fn is_lfs(path: &str, size: u64) -> bool {
        size >= LFS_MIN_SIZE || LFS_SUFFIXES.iter().any(|s| path.ends_with(s))
    }
}

/// Lists and hashes every file under `root` (`.git` folders skipped),
/// sorted by path, in parallel.
pub(super) fn scan(root: &Path) -> Result<Vec<Entry>> {
    let mut found = Vec::new();
    walk(root, root, &mut found)?;
    found.sort();
    found
        .into_par_iter()
        .map(|(path, abs, size)| {
            let lfs = Repo::is_lfs(&path, size);
            let (sha1, sha256) = hash_file(&abs, size, lfs)
                .with_context(|| format!("cannot hash {}", abs.display()))?;
            Ok(Entry {
                path,
                abs,
                size,
                sha1,
                sha256,
            })
        })
        .collect()
}

/// Collects `(repo path, absolute path, size)` of the files under `dir`.
fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf, u64)>) -> Result<()> {
    let listing =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for item in listing {
        let item = item.with_context(|| format!("cannot list {}", dir.display()))?;
        let abs = item.path();
        let kind = item
            .file_type()
            .with_context(|| format!("cannot stat {}", abs.display()))?;
        if kind.is_dir() {
            if item.file_name() != ".git" {
                walk(root, &abs, out)?;
            }
            continue;
        }
        // Symlinks are followed to files only (a folder link could loop).
        let meta =
            std::fs::metadata(&abs).with_context(|| format!("cannot stat {}", abs.display()))?;
        if !meta.is_file() {
            continue;
        }
        let rel = abs
            .strip_prefix(root)
            .ok()
            .and_then(|p| p.to_str())
            .with_context(|| format!("{} has a name that is not UTF-8", abs.display()))?
            .to_string();
        RelPath::new(&rel).map_err(|why| anyhow::anyhow!("cannot serve `{rel}`: {why}"))?;
        out.push((rel, abs, meta.len()));
    }
    Ok(())
}

/// The git blob sha1 of a file of `size` bytes and, if `lfs`, its sha256,
/// in one streaming pass.
fn hash_file(path: &Path, size: u64, lfs: bool) -> Result<(String, Option<String>)> {
    let mut file = File::open(path)?;
    let mut sha1 = sha1::Sha1::new();
    sha1.update(format!("blob {size}\0"));
    let mut sha256 = lfs.then(sha2::Sha256::new);
    let mut buf = vec![0u8; HASH_BUF];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sha1.update(&buf[..n]);
        if let Some(h) = &mut sha256 {
            h.update(&buf[..n]);
        }
        total += n as u64;
    }
    if total != size {
        bail!("it changed size while being hashed ({size} then {total} bytes)");
    }
    Ok((
        hex::encode(sha1.finalize()),
        sha256.map(|h| hex::encode(h.finalize())),
    ))
}

fn git_blob_sha1(bytes: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()));
    h.update(bytes);
    hex::encode(h.finalize())
}

// ---------------------------------------------------------------- server ---
