//! Turns a directory on disk into a [`Manifest`], hashing in parallel.
//!
//! The walk keeps symlinks whose target stays inside the tree (the Hugging
//! Face cache's `snapshots/* -> ../../blobs/*`) and follows the others, sending
//! what they point to as plain files. Hashing maps one chunk at a time
//! (memmap2) and spreads chunks over all cores with rayon, so memory stays
//! bounded by the number of cores times the chunk size, not by the model.

use std::collections::HashSet;
use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use memmap2::MmapOptions;
use rayon::prelude::*;

use crate::store::hashcache::{FileStamp, HashCache};
use xfer_proto::hash::{self, Hash};
use xfer_proto::manifest::{
    dots_only_leading, ChunkSize, Entry, FileEntry, Manifest, MANIFEST_VERSION,
};
use xfer_proto::relpath::RelPath;

/// A scanned tree: its manifest, and where each file's bytes live on disk
/// (indexed like [`Manifest::files`]).
#[derive(Debug, Clone)]
pub struct SourceTree {
    /// The tree's manifest.
    pub manifest: Manifest,
    /// Each file's path on disk, in manifest order.
    pub sources: Vec<PathBuf>,
}

/// Walks `root` and hashes every file with the given chunk size.
/// `progress` is called with the byte count of each chunk as it is hashed.
pub fn scan(
    root: &Path,
    chunk_size: impl Into<ChunkSize>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SourceTree> {
    scan_cached(root, chunk_size, None, progress)
}

/// Like [`scan`], but reuses chunk hashes from `cache` for files whose
/// identity (device, inode, size, mtime, ctime) is unchanged, and records
/// the new ones in it.
pub fn scan_cached(
    root: &Path,
    chunk_size: impl Into<ChunkSize>,
    cache: Option<&mut HashCache>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SourceTree> {
    scan_selected(root, chunk_size, cache, &|_| true, progress)
}

/// Like [`scan_cached`], but only files and links for which `keep` says yes
/// (folders are walked regardless): a subset of a tree that is still being
/// written, such as a Hugging Face cache folder mid-download.
pub fn scan_selected(
    root: &Path,
    chunk_size: impl Into<ChunkSize>,
    mut cache: Option<&mut HashCache>,
    keep: &dyn Fn(&RelPath) -> bool,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SourceTree> {
    let chunk_size: ChunkSize = chunk_size.into();
    if !chunk_size.is_valid() {
        bail!("chunk size {chunk_size:?} is not a power of two between 64 KiB and 256 MiB; pick e.g. 4MiB, or auto");
    }
    let meta = fs::metadata(root).with_context(|| format!("cannot read {}", root.display()))?;
    if !meta.is_dir() {
        bail!(
            "{} is not a directory; point xfer at the model folder",
            root.display()
        );
    }
    let mut walk = Walk {
        entries: Vec::new(),
        visited: HashSet::new(),
        keep,
    };
    walk.visited.insert((meta.dev(), meta.ino()));
    walk.dir(root, None)?;

    let mut pending = walk.entries;
    pending.sort_by(|a, b| a.0.path().cmp(b.0.path()));
    let mut sources = Vec::new();
    let mut sorted = Vec::with_capacity(pending.len());
    for (entry, source) in pending {
        sources.extend(source);
        sorted.push(entry);
    }
    let sizes: Vec<u64> = sorted
        .iter()
        .filter_map(|e| match e {
            Entry::File(f) => Some(f.size),
            _ => None,
        })
        .collect();
    // Auto picks from the tree's size, known now, before any hashing.
    let chunk_size = chunk_size.for_bytes(sizes.iter().sum());

    // Take what the cache knows; hash every other chunk in parallel.
    let mut known: Vec<Option<Vec<Hash>>> = vec![None; sizes.len()];
    let mut stamps = vec![None; sizes.len()];
    if let Some(cache) = cache.as_deref() {
        for (fi, src) in sources.iter().enumerate() {
            stamps[fi] = FileStamp::of(src);
            known[fi] = stamps[fi]
                .as_ref()
                .and_then(|st| cache.get(src, st, chunk_size));
            if known[fi].is_some() {
                progress(sizes[fi]);
            }
        }
    }
    let jobs: Vec<(usize, u64, u64)> = (0..sizes.len())
        .filter(|&fi| known[fi].is_none())
        .flat_map(|fi| hash_jobs(sizes[fi], chunk_size).map(move |(first, n)| (fi, first, n)))
        .collect();
    let hashes: Vec<Hash> = jobs
        .par_iter()
        .map(|&(fi, first, n)| {
            let h = hash_chunks(&sources[fi], sizes[fi], first, n, chunk_size)?;
            progress((n * chunk_size).min(sizes[fi] - first * chunk_size));
            Ok(h)
        })
        .collect::<Result<Vec<Vec<Hash>>>>()?
        .into_iter()
        .flatten()
        .collect();

    let mut next = 0;
    let mut fi = 0;
    for e in sorted.iter_mut() {
        if let Entry::File(f) = e {
            f.chunks = match known[fi].take() {
                Some(chunks) => chunks,
                None => {
                    let n = hash::chunk_count(f.size, chunk_size) as usize;
                    next += n;
                    let chunks = hashes[next - n..next].to_vec();
                    if let (Some(cache), Some(st)) = (cache.as_deref_mut(), &stamps[fi]) {
                        cache.put(&sources[fi], st, chunk_size, chunks.clone());
                    }
                    chunks
                }
            };
            f.hash = hash::file_hash_from_chunks(&f.chunks);
            fi += 1;
        }
    }
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        chunk_size,
        entries: sorted,
    };
    manifest
        .validate()
        .with_context(|| format!("{} cannot be described safely", root.display()))?;
    Ok(SourceTree { manifest, sources })
}

/// Bytes mapped and hashed per job: a few chunks at once, so the cost of
/// mapping is spread (b3sum maps whole files) while memory stays bounded by
/// the number of threads times this.
pub(crate) const HASH_SPAN: u64 = 16 << 20;

/// Jobs of at most [`HASH_SPAN`] bytes over a file of `size` bytes:
/// `(first_chunk, chunk_count)`.
pub(crate) fn hash_jobs(size: u64, chunk_size: u64) -> impl Iterator<Item = (u64, u64)> {
    let per_job = (HASH_SPAN / chunk_size).max(1);
    let chunks = hash::chunk_count(size, chunk_size);
    (0..chunks)
        .step_by(per_job as usize)
        .map(move |first| (first, per_job.min(chunks - first)))
}

/// Hashes `count` chunks of the file at `path` (of `size` bytes, as the
/// manifest says), starting with chunk `first`.
pub(crate) fn hash_chunks(
    path: &Path,
    size: u64,
    first: u64,
    count: u64,
    chunk_size: u64,
) -> Result<Vec<Hash>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    hash_chunks_of(&file, path, size, first, count, chunk_size)
}

/// [`hash_chunks`] of a file already open (`path` names it in messages).
pub(crate) fn hash_chunks_of(
    file: &File,
    path: &Path,
    size: u64,
    first: u64,
    count: u64,
    chunk_size: u64,
) -> Result<Vec<Hash>> {
    let chunks = hash::chunk_count(size, chunk_size);
    let offset = first * chunk_size;
    let len = (count * chunk_size).min(size - offset);
    let actual = file.metadata()?.len();
    if actual < offset + len {
        bail!(
            "{} is shorter than expected ({actual} bytes); is something still writing it?",
            path.display()
        );
    }
    let hash_all = |data: &[u8]| {
        data.chunks(chunk_size as usize)
            .enumerate()
            .map(|(i, c)| hash::hash_chunk(c, first + i as u64, chunks, chunk_size))
            .collect()
    };
    if len < 64 * 1024 {
        let mut buf = vec![0u8; len as usize];
        std::os::unix::fs::FileExt::read_exact_at(file, &mut buf, offset)?;
        return Ok(hash_all(&buf));
    }
    // SAFETY: the map is read-only and dropped before returning; a concurrent
    // writer could change the bytes under us, which the receiver's per-chunk
    // check would then catch.
    let map = unsafe {
        MmapOptions::new()
            .offset(offset)
            .len(len as usize)
            .populate()
            .map(file)
    }
    .with_context(|| format!("cannot map {}", path.display()))?;
    Ok(hash_all(&map))
}

type Pending = (Entry, Option<PathBuf>);

struct Walk<'a> {
    entries: Vec<Pending>,
    visited: HashSet<(u64, u64)>,
    keep: &'a dyn Fn(&RelPath) -> bool,
}

impl Walk<'_> {
    /// Walks `dir`, whose path inside the tree is `rel` (None at the top).
    fn dir(&mut self, dir: &Path, rel: Option<&RelPath>) -> Result<()> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .with_context(|| format!("cannot list {}", dir.display()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        if names.is_empty() {
            if let Some(rel) = rel.filter(|r| (self.keep)(r)) {
                self.entries.push((Entry::Dir { path: rel.clone() }, None));
            }
            return Ok(());
        }
        for name in names {
            let name_str = name.to_str().with_context(|| {
                format!(
                    "{} has a name that is not UTF-8; rename it",
                    dir.join(&name).display()
                )
            })?;
            let child_rel = match rel {
                Some(r) => RelPath::new(&format!("{r}/{name_str}")),
                None => RelPath::new(name_str),
            }
            .with_context(|| format!("unusable name in {}", dir.display()))?;
            self.entry(&dir.join(&name), child_rel)?;
        }
        Ok(())
    }

    fn entry(&mut self, path: &Path, rel: RelPath) -> Result<()> {
        let lmeta = match fs::symlink_metadata(path) {
            Ok(m) => m,
            // Something we would not have kept vanished between listing and
            // looking (a tree still being written): not our business.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !(self.keep)(&rel) => {
                return Ok(())
            }
            Err(e) => return Err(e).with_context(|| format!("cannot stat {}", path.display())),
        };
        if !lmeta.is_dir() && !(self.keep)(&rel) {
            return Ok(());
        }
        if lmeta.file_type().is_symlink() {
            let target = fs::read_link(path)?;
            if let Some(t) = target.to_str() {
                if !t.starts_with('/') && rel.resolve_link(t).is_some() && dots_only_leading(t) {
                    self.entries.push((
                        Entry::Symlink {
                            path: rel,
                            target: t.to_string(),
                        },
                        None,
                    ));
                    return Ok(());
                }
            }
            // Points outside the tree: follow it.
            let meta = fs::metadata(path).with_context(|| {
                format!(
                    "{} is a broken symlink to {}; fix or remove it",
                    path.display(),
                    target.display()
                )
            })?;
            return self.followed(path, rel, meta);
        }
        self.followed(path, rel, lmeta)
    }

    fn followed(&mut self, path: &Path, rel: RelPath, meta: fs::Metadata) -> Result<()> {
        if meta.is_dir() {
            if !self.visited.insert((meta.dev(), meta.ino())) {
                bail!(
                    "{} leads back into a directory already walked (symlink loop); remove the loop",
                    path.display()
                );
            }
            return self.dir(path, Some(&rel));
        }
        if meta.is_file() {
            self.entries.push((
                Entry::File(FileEntry {
                    path: rel,
                    size: meta.len(),
                    hash: Hash::default(),
                    executable: meta.permissions().mode() & 0o111 != 0,
                    chunks: Vec::new(),
                }),
                Some(path.to_path_buf()),
            ));
            return Ok(());
        }
        tracing::warn!(
            "skipping {}: not a regular file, directory or symlink",
            path.display()
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn scans_files_links_and_empty_dirs() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("ext.bin"), vec![7u8; 100_000]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        fs::create_dir_all(r.join("blobs")).unwrap();
        fs::create_dir_all(r.join("snapshots/c1")).unwrap();
        fs::create_dir_all(r.join("empty")).unwrap();
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 241) as u8).collect();
        fs::write(r.join("blobs/abc"), &data).unwrap();
        fs::write(r.join("zero"), b"").unwrap();
        symlink("../../blobs/abc", r.join("snapshots/c1/model.safetensors")).unwrap();
        symlink(outside.path().join("ext.bin"), r.join("ext")).unwrap();

        let tree = scan(r, hash::MIN_CHUNK_SIZE, &|_| {}).unwrap();
        let m = &tree.manifest;
        let paths: Vec<&str> = m.entries.iter().map(|e| e.path().as_str()).collect();
        assert_eq!(
            paths,
            [
                "blobs/abc",
                "empty",
                "ext",
                "snapshots/c1/model.safetensors",
                "zero"
            ]
        );
        match &m.entries[0] {
            Entry::File(f) => {
                assert_eq!(f.hash, blake3::hash(&data).into());
                assert_eq!(f.chunks.len(), 16);
            }
            e => panic!("{e:?}"),
        }
        assert!(matches!(&m.entries[1], Entry::Dir { .. }));
        match &m.entries[2] {
            Entry::File(f) => assert_eq!(f.hash, blake3::hash(&[7u8; 100_000]).into()),
            e => panic!("outside link must be followed: {e:?}"),
        }
        assert!(
            matches!(&m.entries[3], Entry::Symlink { target, .. } if target == "../../blobs/abc")
        );
        assert_eq!(tree.sources.len(), 3);
        assert!(tree.sources[1].ends_with("ext"));
    }

    #[test]
    fn refuses_a_file_argument() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let err = scan(f.path(), hash::MIN_CHUNK_SIZE, &|_| {}).unwrap_err();
        assert!(err.to_string().contains("not a directory"));
    }
}
