//! The steps of [`Store::begin`](super::Store::begin) that find what a
//! transfer resumes from: the model's lock, the staging folder's journal,
//! the chunks it records, the files of an earlier model that are unchanged,
//! the files placed before an interruption (read back), and whether the
//! rest fits on the disk.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use super::journal::{Journal, Record};
use super::{free_space, io_refusal, readback, Stamp, Store, StoreError};
use xfer_proto::chunkset::{ChunkMap, ChunkSet};
use xfer_proto::hash::Hash;
use xfer_proto::manifest::{Entry, FileEntry, Manifest};
use xfer_proto::names::ModelName;
use xfer_proto::relpath::RelPath;

/// What the journal says of the staging folder.
pub(super) struct Journaled {
    /// Chunks recorded whose staging file still has the right size.
    pub(super) held: ChunkSet,
    /// Per file: placed before (recorded done, or all its chunks recorded
    /// while its staging file is gone); only a candidate, read back later.
    pub(super) placed_before: Vec<bool>,
}

/// Files of an earlier complete model that are unchanged on disk.
pub(super) struct Unchanged {
    /// Per file: held already.
    pub(super) done: Vec<bool>,
    /// The stamps of the files held.
    pub(super) stamps: BTreeMap<RelPath, Stamp>,
    /// Per file of a draft: the chunk hashes it is held on trust with.
    pub(super) on_trust: Vec<Option<Vec<Hash>>>,
}

impl Store {
    /// Takes `name`'s lock, waiting up to 5 s for a transfer that was just
    /// superseded to let go.
    pub(super) fn lock_model(&self, name: &ModelName) -> Result<File, StoreError> {
        let lock_path = self.root.join(Self::lock_rel(name));
        let lock = self
            .fs
            .open_rw(&Self::lock_rel(name))
            .map_err(|e| io_refusal(&lock_path, e))?;
        // A transfer of this model that was just superseded may take a moment
        // to let go; wait a little before calling the model busy.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        // SAFETY: flock on an fd we own.
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            if std::time::Instant::now() >= deadline {
                return Err(StoreError::Busy(format!(
                    "another transfer of `{name}` into {} is still running (lock {}); wait for it or stop it",
                    self.root.display(),
                    lock_path.display()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(lock)
    }

    /// Creates the staging folder and opens its journal, under `key` (a
    /// draft's journal lives in a namespace of its own, see `readback`).
    pub(super) fn open_journal(
        &self,
        staging: &Path,
        staging_rel: &Path,
        key: &Hash,
        is_draft: bool,
    ) -> Result<(Journal, Vec<Record>), StoreError> {
        self.fs
            .create_dir_all(&staging_rel.join("data"))
            .map_err(|e| io_refusal(staging, e))?;
        let journal_key = if is_draft {
            readback::draft_journal_key(key)
        } else {
            *key
        };
        Journal::open(
            &self.fs,
            &staging_rel.join("journal"),
            &journal_key,
            crate::store::journal::boot_id(),
        )
        .map_err(|e| io_refusal(staging, e))
    }

    /// Chunks recorded in the journal count while their staging file still
    /// has the right size. A file the journal says was placed (or whose
    /// chunks were all recorded while its staging file is gone: renamed
    /// into place just before a crash) is only a candidate: it is read
    /// back later, since its final file may hold other bytes by now.
    pub(super) fn journaled(
        &self,
        map: &ChunkMap,
        files: &[&FileEntry],
        staging_rel: &Path,
        records: &[Record],
    ) -> Journaled {
        let n = files.len();
        let mut held = ChunkSet::empty(map.len());
        let mut journaled = ChunkSet::empty(map.len());
        let mut placed_before = vec![false; n];
        for r in records {
            match *r {
                Record::Chunk(id) => {
                    if let Some(num) = map.number(id) {
                        journaled.insert(num);
                    }
                }
                Record::FileDone(f) if (f as usize) < n => placed_before[f as usize] = true,
                Record::FileDone(_) | Record::Synced(_) => {}
            }
        }
        for (i, f) in files.iter().enumerate() {
            let range = map.file_range(i as u32);
            let data = staging_rel.join("data").join(i.to_string());
            let staged = self
                .fs
                .open_read(&data)
                .and_then(|d| d.metadata())
                .ok()
                .map(|m| m.len())
                == Some(f.size);
            if staged {
                for num in range.filter(|&c| journaled.contains(c)) {
                    held.insert(num);
                }
            } else if !range.is_empty() && range.clone().all(|c| journaled.contains(c)) {
                placed_before[i] = true;
            }
        }
        Journaled {
            held,
            placed_before,
        }
    }

    /// Files of an earlier complete model that are unchanged on disk. A
    /// draft's hashes are not known yet: such a file is held on trust, and
    /// taken back if an announced hash differs (`draft`). A record being
    /// replaced still says which files are the old, verified ones (their
    /// stamps are unchanged); it certifies nothing.
    pub(super) fn unchanged(
        &self,
        name: &ModelName,
        files: &[&FileEntry],
        final_dir: &Path,
        is_draft: bool,
    ) -> Unchanged {
        let n = files.len();
        let mut done = vec![false; n];
        let mut on_trust: Vec<Option<Vec<Hash>>> = vec![None; n];
        let mut stamps = BTreeMap::new();
        if let Some(rec) = self.record_any(name) {
            // A Hub-named record that never had its blobs checked against
            // their names (an older xfer's): a kept blob is checked now,
            // and one that fails is fetched again.
            let check_kept = super::hub_layout::is_hub_name(name) && !rec.blobs_checked;
            let old: BTreeMap<&RelPath, &Hash> = rec
                .manifest
                .manifest
                .files()
                .map(|f| (&f.path, &f.hash))
                .collect();
            for (i, f) in files.iter().enumerate() {
                let Some(recorded) = rec.stamps.get(&f.path) else {
                    continue;
                };
                let same = if is_draft {
                    rec.manifest
                        .manifest
                        .files()
                        .find(|o| o.path == f.path && o.size == f.size)
                        .map(|o| o.chunks.clone())
                } else {
                    (old.get(&f.path) == Some(&&f.hash)).then(Vec::new)
                };
                if let Some(chunks) =
                    same.filter(|_| Stamp::of(&f.path.under(final_dir)).as_ref() == Some(recorded))
                {
                    if check_kept && super::hub_layout::check_blobs(final_dir, [&f.path]).is_err() {
                        continue;
                    }
                    done[i] = true;
                    stamps.insert(f.path.clone(), *recorded);
                    if is_draft {
                        on_trust[i] = Some(chunks);
                    }
                }
            }
        }
        Unchanged {
            done,
            stamps,
            on_trust,
        }
    }

    /// The streamed draft `name`'s record came from, if `manifest` (a
    /// transfer under `key`) keeps every file and symlink of that record
    /// as it is: the record's files then stay what the draft's ranks were
    /// told they are (a file touched since is pending again, like any).
    pub(super) fn lineage(&self, name: &ModelName, manifest: &Manifest, key: Hash) -> Option<Hash> {
        let rec = self.record_any(name)?;
        let draft = rec.draft?;
        if rec.replacing.is_some_and(|by| by != key) {
            return None;
        }
        let kept = rec.manifest.manifest.entries.iter().all(|old| match old {
            Entry::Dir { .. } => true,
            _ => manifest
                .entries
                .binary_search_by(|e| e.path().cmp(old.path()))
                .is_ok_and(|i| same_content(&manifest.entries[i], old)),
        });
        kept.then_some(draft)
    }

    /// Reads back the chunk hashes of each file the journal says was placed
    /// and that is not held yet, one file after the other (each on every
    /// core): reading several files at once defeats the disk's readahead.
    pub(super) fn read_back_placed(
        &self,
        name: &ModelName,
        files: &[&FileEntry],
        chunk_size: u64,
        placed_before: &[bool],
        done: &[bool],
    ) -> Vec<(usize, Option<Vec<Hash>>)> {
        let todo: Vec<usize> = (0..files.len())
            .filter(|&i| placed_before[i] && !done[i] && files[i].size > 0)
            .collect();
        let started = std::time::Instant::now();
        let bytes: u64 = todo.iter().map(|&i| files[i].size).sum();
        let got: Vec<(usize, Option<Vec<Hash>>)> = todo
            .into_iter()
            .map(|i| {
                let rel = Path::new(name.as_str()).join(files[i].path.as_str());
                let got = readback::chunk_hashes(&self.fs, &rel, files[i].size, chunk_size);
                (i, got)
            })
            .collect();
        if !got.is_empty() {
            tracing::info!(
                "{name}: read back {} file(s), {}, placed before an interruption, in {:.2} s",
                got.len(),
                xfer_proto::units::Bytes(bytes),
                started.elapsed().as_secs_f64()
            );
        }
        got
    }

    /// Fails unless every file not yet placed and not yet preallocated
    /// fits in the free space at `staging`.
    pub(super) fn check_space(
        &self,
        files: &[&FileEntry],
        done: &[bool],
        staging: &Path,
    ) -> Result<(), StoreError> {
        let need: u64 = files
            .iter()
            .enumerate()
            .filter(|(i, _)| !done[*i])
            .filter(|(i, f)| {
                fs::metadata(staging.join("data").join(i.to_string()))
                    .ok()
                    .map(|m| m.len())
                    != Some(f.size)
            })
            .map(|(_, f)| f.size)
            .sum();
        let have = free_space(staging).map_err(|e| io_refusal(staging, e))?;
        if need > have {
            return Err(StoreError::NoSpace {
                need,
                have,
                path: self.root.display().to_string(),
            });
        }
        Ok(())
    }
}

/// Whether two entries at one path hold the same thing (a file's hash, a
/// link's target).
fn same_content(a: &Entry, b: &Entry) -> bool {
    match (a, b) {
        (Entry::File(x), Entry::File(y)) => x.hash == y.hash && x.size == y.size,
        (Entry::Symlink { target: x, .. }, Entry::Symlink { target: y, .. }) => x == y,
        (Entry::Dir { .. }, Entry::Dir { .. }) => true,
        _ => false,
    }
}
