//! A cache of chunk hashes for source files, so a re-run of `xfer push`
//! (after an interruption, or to a new node) does not re-read a 100 GB model
//! before sending the first byte.
//!
//! Entries are keyed by the file's absolute path and trusted only while its
//! device, inode, size, mtime and ctime are all unchanged; ctime cannot be
//! set back by a user, so any write invalidates the entry. A stale entry could
//! only ever cause the receiver's per-chunk check to fail, never a bad file;
//! `--rehash` ignores the cache. The cache lives in
//! `$XDG_CACHE_HOME/xfer` (default `~/.cache/xfer`), one file per tree,
//! replaced durably.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::util::stamp::FileStamp;
use xfer_proto::hash::Hash;

#[derive(Debug, Serialize, Deserialize)]
struct Cached {
    stamp: FileStamp,
    chunk_size: u64,
    chunks: Vec<Hash>,
}

/// Chunk hashes of the files under one source tree.
#[derive(Debug, Default)]
pub struct HashCache {
    file: Option<PathBuf>,
    entries: HashMap<PathBuf, Cached>,
    dirty: bool,
}

impl HashCache {
    /// The cache for the tree at `root`, loaded from the user's cache folder
    /// (empty if there is none or it cannot be read).
    pub fn for_tree(root: &Path) -> HashCache {
        let dir = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("xfer"));
        let Some(dir) = dir else {
            return HashCache::default();
        };
        let abs = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        let key = blake3::hash(abs.as_os_str().as_encoded_bytes());
        HashCache::load(dir.join(format!("hashes-{}.bin", &key.to_hex()[..16])))
    }

    /// Loads a cache file (empty if missing or unreadable).
    pub fn load(file: PathBuf) -> HashCache {
        let entries = fs::read(&file)
            .ok()
            .and_then(|b| postcard::from_bytes::<Vec<(PathBuf, Cached)>>(&b).ok())
            .map(|v| v.into_iter().collect())
            .unwrap_or_default();
        HashCache {
            file: Some(file),
            entries,
            dirty: false,
        }
    }

    /// Chunk hashes of `path` if its stamp and chunk size match.
    pub fn get(&self, path: &Path, stamp: &FileStamp, chunk_size: u64) -> Option<Vec<Hash>> {
        let c = self.entries.get(path)?;
        (c.stamp == *stamp && c.chunk_size == chunk_size).then(|| c.chunks.clone())
    }

    /// Records the chunk hashes of `path`.
    pub fn put(&mut self, path: &Path, stamp: &FileStamp, chunk_size: u64, chunks: Vec<Hash>) {
        self.entries.insert(
            path.to_path_buf(),
            Cached {
                stamp: stamp.clone(),
                chunk_size,
                chunks,
            },
        );
        self.dirty = true;
    }

    /// Writes the cache back if it changed. Failure only costs a re-hash
    /// next time, so it is logged, not returned.
    pub fn save(&self) {
        let Some(file) = &self.file else { return };
        if !self.dirty {
            return;
        }
        let entries: Vec<(&PathBuf, &Cached)> = self.entries.iter().collect();
        // Durably (temporary, fsync, rename, folder fsync): a power cut
        // leaves the old cache or the new one, never a torn file.
        let write = || -> std::io::Result<()> {
            let bytes = postcard::to_stdvec(&entries).map_err(std::io::Error::other)?;
            crate::util::beneath::write_file_durable(file, &bytes, 0o644)
        };
        if let Err(e) = write() {
            tracing::warn!("cannot save hash cache {}: {e}", file.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scan::scan_cached;

    #[test]
    fn unchanged_files_are_not_rehashed_and_changed_ones_are() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("t");
        fs::create_dir(&tree).unwrap();
        fs::write(tree.join("a"), vec![1u8; 200_000]).unwrap();
        fs::write(tree.join("b"), vec![2u8; 100]).unwrap();
        let cache_file = dir.path().join("cache.bin");
        let cs = xfer_proto::hash::MIN_CHUNK_SIZE;

        let mut cache = HashCache::load(cache_file.clone());
        let first = scan_cached(&tree, cs, Some(&mut cache), &|_| {}).unwrap();
        cache.save();

        // Poison the cached entry for `a` with the stamp intact: a rescan
        // that trusts the cache must return the poisoned hashes.
        let mut cache = HashCache::load(cache_file.clone());
        let a = tree.join("a");
        let st = FileStamp::of(&a).unwrap();
        let mut poisoned = cache.get(&a, &st, cs).expect("cached");
        poisoned[0].0[0] ^= 1;
        cache.put(&a, &st, cs, poisoned.clone());
        let second = scan_cached(&tree, cs, Some(&mut cache), &|_| {}).unwrap();
        match &second.manifest.entries[0] {
            xfer_proto::manifest::Entry::File(f) => assert_eq!(f.chunks, poisoned),
            e => panic!("{e:?}"),
        }
        assert_ne!(second.manifest.root(), first.manifest.root());

        // Rewriting the file changes its stamp: it is hashed again.
        fs::write(&a, vec![3u8; 200_000]).unwrap();
        let third = scan_cached(&tree, cs, Some(&mut cache), &|_| {}).unwrap();
        let plain = crate::store::scan::scan(&tree, cs, &|_| {}).unwrap();
        assert_eq!(third.manifest, plain.manifest);
        assert_ne!(third.manifest.root(), first.manifest.root());
    }
}
