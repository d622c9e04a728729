//! A file of a model staged from a copy on this node's own disk instead of
//! chunks from the network (a sync's source node that is also one of its
//! members). The copy is cloned (`FICLONE`, a reflink) where the
//! filesystem shares extents, else copied in the kernel
//! (`copy_file_range`, through `std::io::copy`), under a temporary name
//! beside the file's staging file; then every chunk is hashed again and
//! compared with the manifest, and only a copy that matches becomes the
//! staging file, its chunks held and journaled, and is placed as a
//! received file is ([`Transfer::place_file`]). The model's record comes
//! from [`Transfer::finish`], as for any transfer.
//!
//! A hard link only for a file the agent staged itself under its root
//! and removes when the job ends ([`LocalSource::Staged`]: an artifact
//! job's fetched layers, which nothing writes once checked): an export is
//! not known to be read-only, and a placed file must not change when its
//! source does.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::journal::Record;
use super::readback::chunk_hashes;
use super::{io_refusal, preallocate, StoreError, Transfer};

/// Whose file a local copy is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalSource {
    /// A folder the operator named (an export): it may change after the
    /// copy, so the copy never shares its inode (cloned or copied).
    Foreign,
    /// A file the agent staged itself beneath its root, checked, never
    /// written again and removed when its job ends: linked where the
    /// filesystem allows, so its bytes are not written a second time.
    Staged,
}

/// How a file's staged copy was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copied {
    /// Linked: the agent's own staged file, under a second name.
    Link,
    /// Nothing to copy: it was held already (or is empty, placed at the
    /// finish).
    Held,
    /// Cloned: the copy shares the source's extents until either changes.
    Reflink,
    /// Copied byte for byte, in the kernel.
    Copy,
}

/// Why a file could not be staged from its local source.
#[derive(Debug, thiserror::Error)]
pub enum LocalCopyError {
    /// The source no longer holds what the manifest says.
    #[error("{path} changed after it was hashed ({what}); the next round hashes it again")]
    Changed {
        /// The source file.
        path: PathBuf,
        /// What differs.
        what: String,
    },
    /// The source could not be read.
    #[error("cannot read {path}: {message}; check the file and run the job again")]
    Source {
        /// The source file.
        path: PathBuf,
        /// What the system said.
        message: String,
    },
    /// The store refused or failed (no space, an unsafe path, ...).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Transfer {
    /// Stages manifest file `file` from `src`, a file on this node (whose,
    /// `whose` says), and places it once its every chunk matches the
    /// manifest. A file held already is left as it is. On a mismatch
    /// nothing of the copy stays and what was held before is untouched.
    pub fn stage_local(
        &self,
        file: u32,
        src: &Path,
        whose: LocalSource,
    ) -> Result<Copied, LocalCopyError> {
        if self.draft.is_some() {
            return Err(StoreError::Invalid(format!(
                "a local copy of `{}` needs its manifest, not a draft",
                self.name
            ))
            .into());
        }
        let entry = self.map_file(file).clone();
        if entry.size == 0 || self.state.lock().unwrap().done[file as usize] {
            return Ok(Copied::Held);
        }
        let source = |e: std::io::Error| LocalCopyError::Source {
            path: src.to_path_buf(),
            message: e.to_string(),
        };
        let from = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(src)
            .map_err(source)?;
        let len = from.metadata().map_err(source)?.len();
        if len != entry.size {
            return Err(LocalCopyError::Changed {
                path: src.to_path_buf(),
                what: format!("{len} bytes now, {} in the manifest", entry.size),
            });
        }
        let data = self.data_rel(file);
        let tmp = self.staging_rel.join("data").join(format!("{file}.local"));
        let shown = self.fs.show(&tmp);
        let linked = whose == LocalSource::Staged && self.fs.link_open_file(&from, &tmp).is_ok();
        let copied = if linked {
            Ok((Copied::Link, from))
        } else {
            self.fs
                .create_temp(&tmp)
                .map_err(|e| LocalCopyError::from(io_refusal(&shown, e)))
                .and_then(|to| {
                    self.copy_into((&from, src), &to, &shown, entry.size)
                        .map(|how| (how, to))
                })
        };
        let checked = copied.and_then(|(how, to)| {
            to.sync_all().map_err(|e| io_refusal(&shown, e))?;
            drop(to);
            let got = chunk_hashes(&self.fs, &tmp, entry.size, self.manifest.chunk_size);
            match got {
                Some(h) if h == entry.chunks => Ok(how),
                Some(h) => {
                    let first = h.iter().zip(&entry.chunks).position(|(a, b)| a != b);
                    Err(LocalCopyError::Changed {
                        path: src.to_path_buf(),
                        what: format!(
                            "chunk {} of {} differs from the manifest",
                            first.unwrap_or(0),
                            entry.chunks.len()
                        ),
                    })
                }
                None => Err(LocalCopyError::Changed {
                    path: src.to_path_buf(),
                    what: "its copy could not be read back whole".into(),
                }),
            }
        });
        let how = match checked {
            Ok(how) => how,
            Err(e) => {
                let _ = self.fs.remove_file(&tmp);
                return Err(e);
            }
        };
        let _recording = self.recording[file as usize].lock().unwrap();
        // A handle on the staging file it replaces would place that one.
        self.handles[file as usize].lock().unwrap().take();
        self.fs
            .rename_within(&tmp, &data)
            .map_err(|e| io_refusal(&self.fs.show(&data), e))?;
        let fresh: Vec<Record> = {
            let mut st = self.state.lock().unwrap();
            let fresh = self
                .map
                .file_range(file)
                .filter(|&n| st.held.insert(n))
                .map(|n| Record::Chunk(self.map.id(n)))
                .collect();
            st.remaining[file as usize] = 0;
            fresh
        };
        // The copy is fsynced: its records may be marked durable.
        self.journal
            .lock()
            .unwrap()
            .append(&fresh)
            .map_err(|e| io_refusal(&self.staging.join("journal"), e))?;
        self.place_file(file)?;
        Ok(how)
    }

    /// Fills `to` (empty; `shown` in errors) with the `size` bytes of
    /// `from` (the file `src`): a clone where
    /// the filesystem can, else a copy, its space reserved first so a full
    /// disk is said as such.
    fn copy_into(
        &self,
        (from, src): (&File, &Path),
        to: &File,
        shown: &Path,
        size: u64,
    ) -> Result<Copied, LocalCopyError> {
        // SAFETY: FICLONE on two descriptors we own; it fails cleanly where
        // the filesystem cannot share extents (EOPNOTSUPP, EXDEV, EINVAL).
        let r = unsafe { libc::ioctl(to.as_raw_fd(), libc::FICLONE, from.as_raw_fd()) };
        if r == 0 {
            return Ok(Copied::Reflink);
        }
        let e = std::io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
            return Err(self.disk_refusal(shown, e, size).into());
        }
        preallocate(to, size).map_err(|e| self.disk_refusal(shown, e, size))?;
        let n = std::io::copy(&mut from.take(size), &mut &*to)
            .map_err(|e| self.disk_refusal(shown, e, size))?;
        if n != size {
            return Err(LocalCopyError::Changed {
                path: src.to_path_buf(),
                what: format!("{n} bytes left of {size}"),
            });
        }
        Ok(Copied::Copy)
    }
}

impl LocalCopyError {
    /// The refusal a remote member would have answered with, for a store's
    /// error (so a full disk fails the job as it would there).
    pub fn refusal(&self) -> Option<xfer_proto::refusal::Refusal> {
        match self {
            LocalCopyError::Store(e) => Some(e.clone().into()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use std::sync::Arc;
    use xfer_proto::hash::MIN_CHUNK_SIZE;
    use xfer_proto::manifest::ChunkId;
    use xfer_proto::names::ModelName;

    #[test]
    fn a_changed_copy_leaves_what_was_held_and_a_good_one_completes_it() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        let data: Vec<u8> = (0..3 * MIN_CHUNK_SIZE + 9)
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(src.join("w.bin"), &data).unwrap();
        let tree = crate::store::scan::scan(&src, MIN_CHUNK_SIZE, &|_| {}).unwrap();
        let store = Store::open(&t.path().join("root")).unwrap();
        let name = ModelName::new("m").unwrap();
        let tr = store.begin(&name, Arc::new(tree.manifest.clone())).unwrap();
        // Chunk 0 came from the network earlier.
        let c0 = ChunkId { file: 0, index: 0 };
        tr.write_chunk(c0, &data[..MIN_CHUNK_SIZE as usize])
            .unwrap();

        let mut changed = data.clone();
        changed[(2 * MIN_CHUNK_SIZE + 1) as usize] ^= 1;
        let bad = t.path().join("changed.bin");
        std::fs::write(&bad, &changed).unwrap();
        let e = tr.stage_local(0, &bad, LocalSource::Foreign).unwrap_err();
        assert!(
            e.to_string()
                .contains("chunk 2 of 4 differs from the manifest"),
            "{e}"
        );
        assert!(e.refusal().is_none(), "a changed source is not a refusal");
        assert_eq!(tr.held().count(), 1, "what was held before stays held");
        let (mut f, _) = tr.open_held(c0).unwrap();
        let mut back = vec![0; MIN_CHUNK_SIZE as usize];
        std::io::Read::read_exact(&mut f, &mut back).unwrap();
        assert_eq!(back, data[..MIN_CHUNK_SIZE as usize], "and its bytes too");
        let staged: Vec<String> = std::fs::read_dir(store.root().join(".xfer/staging/m/data"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(staged, ["0"], "the failed copy is gone");

        let short = t.path().join("short.bin");
        std::fs::write(&short, &data[1..]).unwrap();
        let e = tr.stage_local(0, &short, LocalSource::Foreign).unwrap_err();
        assert!(matches!(e, LocalCopyError::Changed { .. }), "{e}");

        let how = tr
            .stage_local(0, &src.join("w.bin"), LocalSource::Foreign)
            .unwrap();
        assert!(
            matches!(how, Copied::Copy | Copied::Reflink),
            "an export is never linked: {how:?}"
        );
        assert!(tr.is_complete());
        assert_eq!(tr.finish().unwrap(), tree.manifest.root());
        assert_eq!(
            std::fs::read(store.model_dir(&name).join("w.bin")).unwrap(),
            data
        );
        assert_eq!(
            tr.stage_local(0, &bad, LocalSource::Foreign).unwrap(),
            Copied::Held
        );
    }

    /// The agent's own staged file is linked, not copied: the placed file
    /// is that inode; one whose bytes are not the manifest's is refused,
    /// its second name removed and the staged file left as it was.
    #[test]
    fn a_staged_file_is_linked_and_a_changed_one_is_refused_leaving_it_whole() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let store = Store::open(&root).unwrap();
        let stage = root.join(".xfer/oci/job/model");
        std::fs::create_dir_all(&stage).unwrap();
        let data: Vec<u8> = (0..2 * MIN_CHUNK_SIZE + 3)
            .map(|i| (i % 241) as u8)
            .collect();
        std::fs::write(stage.join("w.bin"), &data).unwrap();
        let tree = crate::store::scan::scan(&stage, MIN_CHUNK_SIZE, &|_| {}).unwrap();
        let name = ModelName::new("m").unwrap();

        let mut lie = data.clone();
        lie[5] ^= 1;
        let liar = root.join(".xfer/oci/job/liar.bin");
        std::fs::write(&liar, &lie).unwrap();
        let tr = store.begin(&name, Arc::new(tree.manifest.clone())).unwrap();
        let e = tr.stage_local(0, &liar, LocalSource::Staged).unwrap_err();
        assert!(matches!(e, LocalCopyError::Changed { .. }), "{e}");
        assert_eq!(
            std::fs::read(&liar).unwrap(),
            lie,
            "the staged file is left whole"
        );
        assert_eq!(
            std::fs::metadata(&liar).unwrap().nlink(),
            1,
            "its second name is gone"
        );

        let how = tr
            .stage_local(0, &stage.join("w.bin"), LocalSource::Staged)
            .unwrap();
        assert_eq!(how, Copied::Link);
        assert_eq!(tr.finish().unwrap(), tree.manifest.root());
        let placed = std::fs::metadata(store.model_dir(&name).join("w.bin")).unwrap();
        let staged = std::fs::metadata(stage.join("w.bin")).unwrap();
        assert_eq!((placed.ino(), placed.nlink()), (staged.ino(), 2));
        assert_eq!(
            std::fs::read(store.model_dir(&name).join("w.bin")).unwrap(),
            data
        );
    }
}
