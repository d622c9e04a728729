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

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use xfer_proto::relpath::RelPath;

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
    pub fn link(&self, commit: &str, path: &RelPath, etag: &str) -> std::io::Result<PathBuf> {
        let at = path.under(&self.snapshot(commit));
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent)?;
        }
        let tmp = at.with_file_name(format!(
            ".{}.xfer-link-{}",
            at.file_name().and_then(|n| n.to_str()).unwrap_or("f"),
            std::process::id()
        ));
        let _ = fs::remove_file(&tmp);
        std::os::unix::fs::symlink(link_target(path, etag), &tmp)?;
        fs::rename(&tmp, &at)?;
        Ok(at)
    }

    /// Writes `refs/<revision>` = `commit`, with no trailing newline,
    /// atomically. `revision` may contain `/` (`refs/pr/1`).
    pub fn write_ref(&self, revision: &str, commit: &str) -> std::io::Result<()> {
        let rel = RelPath::new(revision).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("revision: {e}"))
        })?;
        let at = rel.under(&self.dir.join("refs"));
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent)?;
        }
        let tmp = at.with_extension(format!("xfer-{}", std::process::id()));
        {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(commit.as_bytes())?;
            f.sync_all()?;
        }
        fs::rename(&tmp, &at)
    }

    /// The commit `refs/<revision>` names, if recorded.
    pub fn read_ref(&self, revision: &str) -> Option<String> {
        let rel = RelPath::new(revision).ok()?;
        fs::read_to_string(rel.under(&self.dir.join("refs"))).ok()
    }
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
