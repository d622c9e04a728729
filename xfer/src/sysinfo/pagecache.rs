//! The model's pages in the page cache: how much of it sits there
//! (`mincore` over a read-only mapping, a window at a time so memory does
//! not grow with the file) and dropping it (`posix_fadvise(DONTNEED)` per
//! file, never a global `drop_caches`).
//!
//! A transfer leaves the model in the page cache. On unified-memory
//! machines (GB10, GH200) that memory is the GPU's too, which is why
//! NVIDIA's DGX Spark guides drop caches before loading a large model.
//! Eviction only drops clean pages: what is still being written stays.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use xfer_proto::launch::{PageCacheFacts, Probe};

/// The mapping `mincore` looks at, at most (256 MiB: 64 Ki page flags).
const WINDOW: u64 = 256 << 20;

/// At most this many files are looked at under one model path.
const MAX_FILES: usize = 100_000;

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Bytes of `path` resident in the page cache, and its size.
pub fn resident(path: &Path) -> io::Result<(u64, u64)> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let page = page_size();
    let mut flags = vec![0u8; (WINDOW / page) as usize];
    let mut resident = 0u64;
    let mut off = 0u64;
    while off < len {
        let n = WINDOW.min(len - off);
        // SAFETY: a read-only shared mapping of `n` bytes of an open file
        // at a page-aligned offset (WINDOW is a multiple of the page); it
        // is only passed to mincore and unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n as usize,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let pages = n.div_ceil(page) as usize;
        // SAFETY: `p` maps `n` bytes; `flags` holds at least one byte per
        // page of it.
        let rc = unsafe { libc::mincore(p, n as usize, flags.as_mut_ptr()) };
        let err = io::Error::last_os_error();
        // SAFETY: unmapping exactly the mapping made above.
        unsafe { libc::munmap(p, n as usize) };
        if rc != 0 {
            return Err(err);
        }
        let in_cache = flags[..pages].iter().filter(|f| *f & 1 == 1).count() as u64;
        resident += (in_cache * page).min(n);
        off += n;
    }
    Ok((resident, len))
}

/// Drops `path`'s clean pages from the page cache.
pub fn evict(path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    // SAFETY: advice on an open descriptor; offset 0, length 0 = all.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// The regular files under `dir` (or `dir` itself when it is a file),
/// following symbolic links to files (a snapshot's files are links to
/// blobs) but not into linked folders.
pub fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&d) {
                todo.extend(entries.flatten().map(|e| e.path()));
            }
        } else if std::fs::metadata(&d).is_ok_and(|m| m.is_file()) {
            out.push(d);
            if out.len() >= MAX_FILES {
                break;
            }
        }
    }
    out.sort();
    out
}

/// How much of the model at `dir` is in the page cache.
pub fn model_resident(dir: &Path) -> Probe<PageCacheFacts> {
    let files = files(dir);
    if files.is_empty() {
        return Probe::Skipped(format!("no files under {}", dir.display()));
    }
    let mut facts = PageCacheFacts {
        resident_bytes: 0,
        total_bytes: 0,
        files: 0,
    };
    for f in &files {
        match resident(f) {
            Ok((r, t)) => {
                facts.resident_bytes += r;
                facts.total_bytes += t;
                facts.files += 1;
            }
            Err(e) => {
                return Probe::Failed(format!(
                    "cannot look at {} in the page cache: {e}",
                    f.display()
                ))
            }
        }
    }
    Probe::Ok(facts)
}

/// A file of a model that could not be dropped from the page cache.
#[derive(Debug, thiserror::Error)]
#[error("cannot drop {} from the page cache: {source}; check the agent may read it", .path.display())]
pub struct EvictError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub source: io::Error,
}

/// Drops the model at `dir` from the page cache; the bytes it held before.
pub fn evict_model(dir: &Path) -> Result<u64, EvictError> {
    let mut before = 0;
    for f in files(dir) {
        before += resident(&f).map(|(r, _)| r).unwrap_or(0);
        evict(&f).map_err(|source| EvictError {
            path: f.clone(),
            source,
        })?;
    }
    Ok(before)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A folder on a disk filesystem (tmpfs pages cannot be dropped).
    fn disk_dir(tag: &str) -> PathBuf {
        let d = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/pagecache-test")
            .join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_read_file_is_resident_and_eviction_drops_it() {
        let d = disk_dir("evict");
        let path = d.join("model.safetensors");
        // More than one window, and not a whole number of pages.
        let len = (WINDOW + (3 << 20) + 123) as usize;
        let mut f = File::create(&path).unwrap();
        let block: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len());
            f.write_all(&block[..n]).unwrap();
            left -= n;
        }
        // Written pages are dirty until synced, and only clean ones go.
        f.sync_all().unwrap();
        drop(f);
        let mut buf = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut buf).unwrap();
        let (before, total) = resident(&path).unwrap();
        assert_eq!(total, len as u64);
        assert!(
            before > total / 2,
            "after a read: {before} of {total} resident"
        );

        // A snapshot-style link to it is followed.
        std::os::unix::fs::symlink(&path, d.join("link.safetensors")).unwrap();
        let Probe::Ok(m) = model_resident(&d) else {
            panic!("{:?}", model_resident(&d))
        };
        assert_eq!((m.files, m.total_bytes), (2, 2 * len as u64));

        let held = evict_model(&d).unwrap();
        assert!(held >= before, "{held} < {before}");
        let (after, _) = resident(&path).unwrap();
        assert!(
            after < total / 10,
            "after eviction: {after} of {total} still resident"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn no_files_and_unreadable_files_say_so() {
        let d = disk_dir("empty");
        assert!(matches!(model_resident(&d), Probe::Skipped(_)));
        assert!(resident(&d.join("missing")).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
