//! The `huggingface_hub` cache layout, byte for byte, so vLLM and
//! transformers load what `xfer pull` wrote with `HF_HUB_OFFLINE=1`:
//!
//! ```text
//! <cache>/models--org--name/blobs/<etag>                 file contents
//! <cache>/models--org--name/snapshots/<commit>/<path>    relative symlink to ../../blobs/<etag>
//! <cache>/models--org--name/refs/<revision>              the commit, no trailing newline
//! ```
//!
//! The etag is the file's sha256 for LFS files and its git blob sha1
//! otherwise. Blobs are written as `<etag>.<unique>.incomplete` and renamed
//! into place once verified.
//!
//! Durability, in the order that keeps a ref from ever naming a snapshot a
//! power cut lost: each blob is fsynced and renamed in, and `blobs/`
//! fsynced (`hub::pull`); each snapshot link is renamed in and its folder
//! fsynced, and each folder created has its parent fsynced
//! ([`Root::symlink_durable`]); only then is `refs/<revision>` written to a
//! temporary file, renamed in and `refs/` fsynced ([`RepoCache::write_ref`],
//! which refuses a commit whose snapshot is missing). Paths below the repo
//! folder are resolved without following symlinks.

use std::fs;
use std::path::{Path, PathBuf};

use crate::util::beneath::Root;
use xfer_proto::relpath::RelPath;

#[cfg(test)]
thread_local! {
    /// Makes [`RepoCache::write_ref`] fail after the snapshot is synced and
    /// before the ref is renamed in: a power cut at the worst moment.
    static CUT_BEFORE_REF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    dir: PathBuf,
}

impl RepoCache {
    /// `cache_root/folder` (see [`super::repo::RepoRef::cache_folder`]).
    pub fn new(cache_root: &Path, folder: &str) -> Self {
        RepoCache {
            dir: cache_root.join(folder),
        }
    }

    /// The repo's cache folder (`models--org--name`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where a verified blob lives.
    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir.join("blobs").join(etag)
    }

    /// A blob being downloaded by the process `unique` names.
    pub fn incomplete_blob(&self, etag: &str, unique: &str) -> PathBuf {
        self.dir
            .join("blobs")
            .join(format!("{etag}.{unique}.incomplete"))
    }

    /// The snapshot folder of a commit.
    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.dir.join("snapshots").join(commit)
    }

    /// Links `snapshots/<commit>/<path>` to its blob with a relative
    /// symlink, replacing whatever was there (atomically, via a rename).
    /// The repo folder, created if missing, for paths beneath it.
    fn root(&self) -> std::io::Result<Root> {
        fs::create_dir_all(&self.dir)?;
        Root::open(&self.dir)
    }

    /// Links `snapshots/<commit>/<path>` to its blob with a relative
    /// symlink, replacing whatever was there (atomically, via a rename),
    /// durably (its folder is fsynced).
    pub fn link(&self, commit: &str, path: &RelPath, etag: &str) -> std::io::Result<PathBuf> {
        let rel = Path::new("snapshots").join(commit).join(path.as_str());
        self.root()?
            .symlink_durable(&rel, Path::new(&link_target(path, etag)))?;
        Ok(self.dir.join(rel))
    }

    /// Writes `refs/<revision>` = `commit`, with no trailing newline,
    /// atomically and durably. `revision` may contain `/` (`refs/pr/1`).
    /// Call once every link of the snapshot is in place: the snapshot is
    /// fsynced first, so a ref never survives a power cut without it.
    pub fn write_ref(&self, revision: &str, commit: &str) -> std::io::Result<()> {
        let rel = RelPath::new(revision).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("revision: {e}"))
        })?;
        let root = self.root()?;
        let snapshot = Path::new("snapshots").join(commit);
        let snap = root.dir(&snapshot).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "refusing to write refs/{revision}: its snapshot {} is not there ({e})",
                    self.snapshot(commit).display()
                ),
            )
        })?;
        snap.sync_all()?;
        root.dir(Path::new("snapshots"))?.sync_all()?;
        #[cfg(test)]
        if CUT_BEFORE_REF.with(|c| c.get()) {
            return Err(std::io::Error::other("power cut (test)"));
        }
        root.write_durable_shared(&Path::new("refs").join(rel.as_str()), commit.as_bytes())
    }

    /// The commit `refs/<revision>` names, if recorded.
    pub fn read_ref(&self, revision: &str) -> Option<String> {
        let rel = RelPath::new(revision).ok()?;
        fs::read_to_string(rel.under(&self.dir.join("refs"))).ok()
    }
}

/// `refs/<revision>`, relative to the repo's folder: the file that names
/// the revision's commit.
pub fn ref_file(revision: &str) -> Result<RelPath, xfer_proto::relpath::PathError> {
    RelPath::new(&format!("refs/{revision}"))
}

/// `../../blobs/<etag>` with one more `../` per folder `path` is inside.
pub fn link_target(path: &RelPath, etag: &str) -> String {
    let depth = path.as_str().matches('/').count();
    format!("{}../../blobs/{etag}", "../".repeat(depth))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ref_is_written_only_after_its_snapshot_and_never_without_it() {
        let t = tempfile::tempdir().unwrap();
        let c = RepoCache::new(t.path(), "models--org--m");
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let etag = "a".repeat(64);
        let refs_main = t.path().join("models--org--m/refs/main");
        // No snapshot: no ref.
        let e = c.write_ref("main", commit).unwrap_err();
        assert!(e.to_string().contains("snapshot"), "{e}");
        assert!(!refs_main.exists());
        // The cut falls after the snapshot is durable and before the ref
        // is renamed in: the snapshot is there, the ref is not, and no
        // temporary file is left in refs/.
        let top = RelPath::new("model.safetensors").unwrap();
        let at = c.link(commit, &top, &etag).unwrap();
        CUT_BEFORE_REF.with(|x| x.set(true));
        assert!(c.write_ref("main", commit).is_err());
        CUT_BEFORE_REF.with(|x| x.set(false));
        assert!(fs::symlink_metadata(&at).unwrap().file_type().is_symlink());
        assert!(!refs_main.exists());
        assert!(fs::read_dir(t.path().join("models--org--m/refs"))
            .map(|d| d.count() == 0)
            .unwrap_or(true));
        c.write_ref("main", commit).unwrap();
        assert_eq!(fs::read(&refs_main).unwrap(), commit.as_bytes());
    }

    #[test]
    fn a_planted_symlink_in_the_snapshot_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let c = RepoCache::new(t.path(), "models--org--m");
        let commit = "0123456789abcdef0123456789abcdef01234567";
        fs::create_dir_all(c.snapshot(commit)).unwrap();
        std::os::unix::fs::symlink(outside.path(), c.snapshot(commit).join("original")).unwrap();
        let deep = RelPath::new("original/params.json").unwrap();
        let e = c.link(commit, &deep, &"a".repeat(64)).unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn layout_matches_huggingface_hub() {
        let t = tempfile::tempdir().unwrap();
        let c = RepoCache::new(t.path(), "models--org--m");
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let etag = "a".repeat(64);
        fs::create_dir_all(c.blob(&etag).parent().unwrap()).unwrap();
        fs::write(c.blob(&etag), b"weights").unwrap();
        assert!(c
            .incomplete_blob(&etag, "42")
            .ends_with(format!("blobs/{etag}.42.incomplete")));

        let top = RelPath::new("model.safetensors").unwrap();
        let deep = RelPath::new("original/sub/consolidated.pth").unwrap();
        assert_eq!(link_target(&top, &etag), format!("../../blobs/{etag}"));
        assert_eq!(
            link_target(&deep, &etag),
            format!("../../../../blobs/{etag}")
        );
        for p in [&top, &deep] {
            let at = c.link(commit, p, &etag).unwrap();
            assert_eq!(
                fs::read_link(&at).unwrap(),
                PathBuf::from(link_target(p, &etag))
            );
            assert_eq!(fs::read(&at).unwrap(), b"weights", "the link resolves");
        }
        // Re-linking replaces the old link.
        let other = "b".repeat(64);
        fs::write(c.blob(&other), b"new").unwrap();
        let at = c.link(commit, &top, &other).unwrap();
        assert_eq!(fs::read(&at).unwrap(), b"new");

        c.write_ref("main", commit).unwrap();
        c.write_ref("refs/pr/1", commit).unwrap();
        assert!(
            c.write_ref("main", "ffffffffffffffffffffffffffffffffffffffff")
                .is_err(),
            "no snapshot"
        );
        let raw = fs::read(t.path().join("models--org--m/refs/main")).unwrap();
        assert_eq!(raw, commit.as_bytes(), "no trailing newline");
        assert_eq!(c.read_ref("refs/pr/1").as_deref(), Some(commit));
        assert!(c.write_ref("../escape", commit).is_err());
        let leftovers: Vec<_> = fs::read_dir(t.path().join("models--org--m/refs"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains("xfer"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
