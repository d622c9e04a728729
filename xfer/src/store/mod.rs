//! The receiving node's disk: staging, verified chunk writes, atomic
//! placement, and the record of complete models.
//!
//! Layout under an agent's `--root`:
//!
//! ```text
//! <root>/<name>/...                    final files, only ever complete and verified
//! <root>/.xfer/staging/<name>/data/<i> file i of the manifest, preallocated, written at offsets
//! <root>/.xfer/staging/<name>/journal  durable chunks (see `journal`)
//! <root>/.xfer/staging/<name>.lock     flock held while a transfer runs
//! <root>/.xfer/models/<name>.json      manifest and stamps of the complete model
//! ```
//!
//! [`Transfer::write_chunk`] is the only way bytes from the network reach
//! the disk, and it checks the chunk's BLAKE3 first; a copy from this
//! node's own disk ([`Transfer::stage_local`], in `local`) is hashed again
//! chunk by chunk before it counts; bytes this node fetched from the origin
//! itself for a striped pull ([`fetched`]) are only candidates until read
//! back and checked against the hash the source announced. A file is renamed into place only when all
//! its chunks are verified and fsynced, and never through a symlink.
//!
//! Everything under `<root>/.xfer` is opened through [`Root`]: a symlink
//! planted anywhere there is refused (never followed), temporary files are
//! created exclusively, and every rename that makes a record or journal
//! durable is followed by an fsync of its directory.

mod draft;
mod error;
pub mod evict;
pub mod fetched;
pub mod hashcache;
pub mod hub_layout;
pub mod journal;
pub mod local;
#[cfg(test)]
mod model_check;
pub mod place;
mod readback;
mod record;
mod resume;
pub mod scan;
pub mod usage;
pub mod verify;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::store::journal::{Journal, Record};
use crate::util::beneath::{Planted, Root};
use xfer_proto::chunkset::{ChunkMap, ChunkSet};
use xfer_proto::hash::{self, Hash};
use xfer_proto::manifest::{ChunkId, Entry, FileEntry, Manifest};
use xfer_proto::names::ModelName;

pub use draft::DraftChange;
pub use error::{OpenHeldError, StoreError};
pub use place::{place, place_dir};
pub use record::{ModelRecord, Stamp};
use xfer_proto::relpath::RelPath;

/// An agent's root directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    /// `root`, for everything under `.xfer`.
    fs: Root,
}

/// Reads the record at `rel` (beneath `fs`), complete or being replaced.
fn read_record(fs: &Root, rel: &Path) -> Option<ModelRecord> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let f = fs.open_read(rel).ok()?;
    // A record is a manifest and its stamps: bounded like a manifest.
    f.take(xfer_proto::frame::MAX_FRAME as u64 * 2)
        .read_to_end(&mut bytes)
        .ok()?;
    ModelRecord::parse(&bytes, &fs.show(rel)).ok()
}

/// Marks the complete record at `rel` as being replaced by `by`, durably;
/// a record of `by` itself is left alone.
fn mark_replacing(fs: &Root, rel: &Path, by: Hash) -> Result<(), StoreError> {
    let Some(mut rec) = read_record(fs, rel).filter(ModelRecord::is_complete) else {
        return Ok(());
    };
    if rec.manifest.root == by {
        return Ok(());
    }
    rec.replacing = Some(by);
    write_record(fs, rel, &rec)
}

/// Writes the record at `rel` (beneath `fs`), durably.
fn write_record(fs: &Root, rel: &Path, rec: &ModelRecord) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec(rec).expect("record serializes");
    fs.write_durable(rel, &bytes)
        .map_err(|e| io_refusal(&fs.show(rel), e))
}

fn io_refusal(path: &Path, e: std::io::Error) -> StoreError {
    if let Some(p) = Planted::of(&e) {
        return StoreError::Unsafe {
            path: p.path.display().to_string(),
            reason: p.reason(),
        };
    }
    StoreError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

pub use crate::sysinfo::host::free_space;

impl Store {
    /// Opens (creating if needed) the store at `root`.
    pub fn open(root: &Path) -> anyhow::Result<Store> {
        use anyhow::Context;
        let cannot = |d: &Path| {
            format!(
                "cannot create {}; check --root and its permissions",
                d.display()
            )
        };
        fs::create_dir_all(root).with_context(|| cannot(root))?;
        let fs = Root::open(root).with_context(|| cannot(root))?;
        for d in [".xfer/staging", ".xfer/models"] {
            if let Err(e) = fs.create_dir_all(Path::new(d)) {
                if Planted::of(&e).is_some() {
                    anyhow::bail!("{e}");
                }
                return Err(e).with_context(|| cannot(&root.join(d)));
            }
        }
        Ok(Store {
            root: root.to_path_buf(),
            fs,
        })
    }

    fn record_rel(name: &ModelName) -> PathBuf {
        Path::new(".xfer/models").join(format!("{name}.json"))
    }

    fn staging_rel(name: &ModelName) -> PathBuf {
        Path::new(".xfer/staging").join(name.as_str())
    }

    fn lock_rel(name: &ModelName) -> PathBuf {
        Path::new(".xfer/staging").join(format!("{name}.lock"))
    }

    /// Writes the record of `name`, durably.
    fn write_record(&self, name: &ModelName, rec: &ModelRecord) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(rec).expect("record serializes");
        self.fs.write_durable(&Self::record_rel(name), &bytes)
    }

    /// The store's root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where a model's final files live.
    pub fn model_dir(&self, name: &ModelName) -> PathBuf {
        self.root.join(name.as_str())
    }

    fn staging_dir(&self, name: &ModelName) -> PathBuf {
        self.root.join(".xfer/staging").join(name.as_str())
    }

    /// The record of a complete model.
    pub fn record_path(&self, name: &ModelName) -> PathBuf {
        self.root.join(".xfer/models").join(format!("{name}.json"))
    }

    /// Reads the record of a complete model, if there is a valid one. A
    /// record that a transfer of another manifest began replacing is not
    /// one: see [`record`].
    pub fn record(&self, name: &ModelName) -> Option<ModelRecord> {
        self.record_any(name).filter(ModelRecord::is_complete)
    }

    /// Reads the record of `name`, complete or being replaced.
    pub fn record_any(&self, name: &ModelName) -> Option<ModelRecord> {
        read_record(&self.fs, &Self::record_rel(name))
    }

    /// Marks the record of `name`, if it is complete, as being replaced by
    /// `by` (durably), unless `by` is its own root. Called before anything
    /// writes over the model's files in place (a Hub pull into the root).
    pub fn mark_replacing(&self, name: &ModelName, by: Hash) -> Result<(), StoreError> {
        mark_replacing(&self.fs, &Self::record_rel(name), by)
    }

    /// Names whose record a transfer of another manifest began replacing
    /// and did not finish.
    pub fn replacing(&self) -> Vec<ModelName> {
        self.records_any()
            .into_iter()
            .filter(|(_, r)| !r.is_complete())
            .map(|(n, _)| n)
            .collect()
    }

    /// Opens `rel` of model `name` for reading, never through a symlink.
    pub fn open_model_file(&self, name: &ModelName, rel: &str) -> std::io::Result<File> {
        self.fs.open_read(&Path::new(name.as_str()).join(rel))
    }

    /// Writes `.xfer/<area>/<file>` durably: the records other layers keep
    /// beside the store's (the images an agent loaded).
    pub fn write_note(&self, area: &str, file: &str, bytes: &[u8]) -> std::io::Result<()> {
        let dir = Path::new(".xfer").join(area);
        self.fs.create_dir_all(&dir)?;
        self.fs.write_durable(&dir.join(file), bytes)
    }

    /// Every `.xfer/<area>/*.json` written by [`Store::write_note`], by file name.
    pub fn read_notes(&self, area: &str) -> Vec<(String, Vec<u8>)> {
        use std::io::Read;
        let dir = Path::new(".xfer").join(area);
        let Ok(entries) = fs::read_dir(self.root.join(&dir)) else {
            return Vec::new();
        };
        let mut out: Vec<(String, Vec<u8>)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name().to_str()?.to_string();
                if !file.ends_with(".json") {
                    return None;
                }
                let mut bytes = Vec::new();
                let mut f = self.fs.open_read(&dir.join(&file)).ok()?;
                f.by_ref().take(1 << 20).read_to_end(&mut bytes).ok()?;
                Some((file, bytes))
            })
            .collect();
        out.sort();
        out
    }

    /// Removes `.xfer/<area>/<file>`, if there.
    pub fn remove_note(&self, area: &str, file: &str) {
        let _ = self
            .fs
            .remove_file(&Path::new(".xfer").join(area).join(file));
    }

    /// Every complete model recorded here, by name.
    pub fn models(&self) -> Vec<(ModelName, ModelRecord)> {
        let mut out = self.records_any();
        out.retain(|(_, r)| r.is_complete());
        out
    }

    /// Every model recorded here (complete or being replaced), with the
    /// bytes its files take and when its record was last written (unix
    /// milliseconds): what eviction weighs ([`evict`]).
    pub fn sizes(&self) -> Vec<(ModelName, u64, u64)> {
        self.records_any()
            .into_iter()
            .map(|(name, rec)| {
                let bytes = rec.stamps.values().map(|s| s.size).sum();
                let written = fs::metadata(self.record_path(&name))
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_millis() as u64);
                (name, bytes, written)
            })
            .collect()
    }

    /// Whether a transfer of `name` holds its lock here now.
    pub fn is_busy(&self, name: &ModelName) -> bool {
        let Ok(lock) = self.fs.open_read(&Self::lock_rel(name)) else {
            return false;
        };
        // SAFETY: flock on an fd we own; released when it closes.
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) != 0 }
    }

    /// The names of every record here (none read), sorted.
    pub fn model_names(&self) -> Vec<ModelName> {
        let Ok(entries) = fs::read_dir(self.root.join(".xfer/models")) else {
            return Vec::new();
        };
        let mut out: Vec<ModelName> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name().to_str()?.to_string();
                ModelName::new(file.strip_suffix(".json")?).ok()
            })
            .collect();
        out.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        out
    }

    /// Every record here, complete or being replaced, by name.
    fn records_any(&self) -> Vec<(ModelName, ModelRecord)> {
        self.model_names()
            .into_iter()
            .filter_map(|name| {
                let rec = self.record_any(&name)?;
                Some((name, rec))
            })
            .collect()
    }

    /// Records the folder `<root>/<name>`, already complete and verified
    /// by other means (`xfer pull` checked it against the Hub's hashes and
    /// hashed it into `manifest`), as the complete model `name`; `draft`
    /// is the streamed draft it holds every file and link of, if any.
    /// `unhashed` are the files the pull found in place and did not hash:
    /// for a Hub-named model each such blob is checked against its name
    /// here, unless the old record had checked it and it is unchanged.
    pub fn adopt(
        &self,
        name: &ModelName,
        manifest: &Manifest,
        draft: Option<Hash>,
        unhashed: &[RelPath],
    ) -> std::io::Result<()> {
        let dir = self.model_dir(name);
        let hub_named = hub_layout::is_hub_name(name);
        if hub_named {
            let vouched = self
                .record_any(name)
                .filter(|r| r.blobs_checked)
                .map(|r| r.stamps)
                .unwrap_or_default();
            let unchecked = unhashed.iter().filter(|p| {
                vouched
                    .get(*p)
                    .is_none_or(|v| Stamp::of(&p.under(&dir)).as_ref() != Some(v))
            });
            hub_layout::check_blobs(&dir, unchecked).map_err(|why| {
                std::io::Error::other(format!(
                    "{name}: {why}; remove it (`xfer rm {name}`) and sync it from the Hub again"
                ))
            })?;
        }
        let mut stamps = BTreeMap::new();
        for f in manifest.files() {
            let p = f.path.under(&dir);
            match Stamp::of(&p) {
                Some(st) if st.size == f.size => {
                    stamps.insert(f.path.clone(), st);
                }
                _ => {
                    return Err(std::io::Error::new(
                        ErrorKind::NotFound,
                        format!("{} is missing or has another size", p.display()),
                    ))
                }
            }
        }
        let record = ModelRecord {
            manifest: manifest.to_doc(),
            stamps,
            replacing: None,
            draft,
            blobs_checked: hub_named,
        };
        self.write_record(name, &record)
    }

    /// Checks each blob of the Hub-named model `name`, complete and not
    /// yet vouched for that way (its record from an older xfer), against
    /// its name, and marks the record when all pass ([`ModelRecord::blobs_checked`]).
    /// `Ok(false)`: nothing to do. Call after a verify found every file
    /// as recorded.
    pub fn check_hub_blobs(&self, name: &ModelName) -> Result<bool, String> {
        let Some(mut rec) = self
            .record(name)
            .filter(|r| hub_layout::is_hub_name(name) && !r.blobs_checked)
        else {
            return Ok(false);
        };
        let dir = self.model_dir(name);
        hub_layout::check_blobs(&dir, rec.manifest.manifest.files().map(|f| &f.path)).map_err(
            |why| format!("{why}; remove it (`xfer rm {name}`) and sync it from the Hub again"),
        )?;
        rec.blobs_checked = true;
        self.write_record(name, &rec)
            .map_err(|e| format!("cannot write the record of {name}: {e}"))?;
        Ok(true)
    }

    /// Makes the next transfer of `name` fetch `paths` again even if their
    /// size and mtime look untouched (a verify found them damaged).
    pub fn forget_files(&self, name: &ModelName, paths: &[RelPath]) -> std::io::Result<()> {
        let Some(mut rec) = self.record_any(name) else {
            return Ok(());
        };
        for p in paths {
            rec.stamps.remove(p);
        }
        self.write_record(name, &rec)
    }

    /// Deletes model `name` (its files, record and staging). Refused while a
    /// transfer of it runs here.
    /// Without `force`, a folder under the root that xfer did not place
    /// (no model record, nothing being received) is refused, not deleted.
    pub fn remove(&self, name: &ModelName, force: bool) -> Result<bool, StoreError> {
        let lock_path = self.root.join(Self::lock_rel(name));
        let lock = self
            .fs
            .open_rw(&Self::lock_rel(name))
            .map_err(|e| io_refusal(&lock_path, e))?;
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(StoreError::Busy(format!(
                "`{name}` is being transferred here; cancel its job first"
            )));
        }
        let dir = self.model_dir(name);
        // A folder holding no file at all (what a failed first sync of a
        // typo'd repo leaves) loses nothing: it goes without --force.
        let ours = self.record_path(name).exists()
            || self.staging_dir(name).exists()
            || holds_no_file(&dir, 8);
        if dir.exists() && !ours && !force {
            return Err(StoreError::Invalid(format!(
                "{} was not placed by xfer (no model record of `{name}` on this node); pass --force to delete it anyway",
                dir.display()
            )));
        }
        let existed = dir.exists() || self.record_path(name).exists();
        let _ = self.fs.remove_file(&Self::record_rel(name));
        let _ = self.fs.remove_dir_all(&Self::staging_rel(name));
        if dir.exists() {
            self.fs
                .remove_dir_all(Path::new(name.as_str()))
                .map_err(|e| io_refusal(&dir, e))?;
        }
        Ok(existed)
    }

    /// Checks, before anything is built for it, that `bytes` of model
    /// `name` could fit: free space, plus what this node already holds of
    /// `name` (staged files, and the files its record lists). The exact
    /// check follows in [`Store::begin`]; this one keeps a listing that
    /// claims terabytes from costing memory and CPU first.
    pub fn room_for(&self, name: &ModelName, bytes: u64) -> Result<(), StoreError> {
        let staging = self.staging_dir(name);
        let have = free_space(&self.root).map_err(|e| io_refusal(&self.root, e))?;
        let staged: u64 = fs::read_dir(staging.join("data"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.metadata().ok())
            .map(|m| m.len())
            .sum();
        let placed: u64 = self
            .record_any(name)
            .map_or(0, |r| r.stamps.values().map(|s| s.size).sum());
        let have = have.saturating_add(staged).saturating_add(placed);
        if bytes > have {
            return Err(StoreError::NoSpace {
                need: bytes,
                have,
                path: self.root.display().to_string(),
            });
        }
        Ok(())
    }

    /// Starts (or resumes) receiving `manifest` as `name`. The manifest must
    /// already be validated.
    pub fn begin(&self, name: &ModelName, manifest: Arc<Manifest>) -> Result<Transfer, StoreError> {
        let root = manifest.root();
        self.begin_with(name, manifest, root, None)
    }

    /// Starts (or resumes) receiving the files of `draft` (a pull still
    /// downloading them) as `name`; `id` is the draft's, which a resumed
    /// transfer must match. See [`draft`] for what differs.
    pub fn begin_draft(
        &self,
        name: &ModelName,
        id: Hash,
        draft: xfer_proto::draft::Draft,
    ) -> Result<Transfer, StoreError> {
        self.begin_with(name, Arc::new(draft.shape()), id, Some(draft))
    }

    fn begin_with(
        &self,
        name: &ModelName,
        manifest: Arc<Manifest>,
        key: Hash,
        plan: Option<xfer_proto::draft::Draft>,
    ) -> Result<Transfer, StoreError> {
        if hub_layout::is_hub_name(name) {
            hub_layout::check_manifest(&manifest).map_err(|why| {
                StoreError::NotHubs(format!(
                    "`{name}` is a Hub cache name, and this tree is not a Hub cache repo: {why}; a model of another shape takes another name (`--name`)"
                ))
            })?;
        }
        let staging = self.staging_dir(name);
        let lock = self.lock_model(name)?;
        let staging_rel = Self::staging_rel(name);
        let (journal, records) = self.open_journal(&staging, &staging_rel, &key, plan.is_some())?;
        let map = ChunkMap::new(&manifest);
        let final_dir = self.model_dir(name);
        let files: Vec<&FileEntry> = manifest.files().collect();
        let n = files.len();

        let resume::Journaled {
            mut held,
            placed_before,
        } = self.journaled(&map, &files, &staging_rel, &records);
        // A draft's journaled chunks are only candidates: their hashes are
        // not known yet (and may be of a withdrawn download), so each is
        // read back and checked once its hash is announced.
        let mut candidates = ChunkSet::empty(map.len());
        if plan.is_some() {
            for c in held.iter() {
                candidates.insert(c);
            }
            held = ChunkSet::empty(map.len());
        }
        let resume::Unchanged {
            mut done,
            mut stamps,
            mut on_trust,
        } = self.unchanged(name, &files, &final_dir, plan.is_some());
        let readback =
            self.read_back_placed(name, &files, manifest.chunk_size, &placed_before, &done);
        for (i, got) in readback {
            match (got, &plan) {
                // A draft's hashes come later: hold it on trust, checked
                // against each hash the source announces.
                (Some(chunks), Some(_)) => {
                    done[i] = true;
                    on_trust[i] = Some(chunks);
                }
                (Some(chunks), None) if chunks == files[i].chunks => done[i] = true,
                _ => {}
            }
        }
        for (i, d) in done.iter().enumerate() {
            if *d {
                let p = &files[i].path;
                if !stamps.contains_key(p) {
                    if let Some(st) = Stamp::of(&p.under(&final_dir)) {
                        stamps.insert(p.clone(), st);
                    }
                }
                for num in map.file_range(i as u32) {
                    held.insert(num);
                }
                let _ = fs::remove_file(staging.join("data").join(i.to_string()));
            }
        }
        self.check_space(&files, &done, &staging)?;

        let remaining: Vec<u64> = (0..n)
            .map(|i| {
                map.file_range(i as u32)
                    .filter(|&c| !held.contains(c))
                    .count() as u64
            })
            .collect();
        let (links_of, orphan_links) = links_by_file(&manifest, &files);
        // A Hub blob received from its first chunk is checked as its chunks
        // land in order (a draft's withdrawn file starts its check over,
        // see `draft::forget`). A resumed file's held chunks were not fed:
        // it is read back whole when placed.
        let hub_named = hub_layout::is_hub_name(name);
        let prefix = files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let fresh = remaining[i] == map.file_range(i as u32).count() as u64;
                let hasher = (hub_named && fresh)
                    .then(|| hub_layout::blob_hash(&f.path))
                    .flatten()
                    .map(|want| InOrder::new(want, f.size));
                Mutex::new(hasher)
            })
            .collect();
        let lineage = match plan {
            Some(_) => None,
            None => self.lineage(name, &manifest, key),
        };
        let transfer = Transfer {
            hub_named,
            in_order: prefix,
            name: name.clone(),
            manifest: manifest.clone(),
            map,
            store_root: self.root.clone(),
            fs: self.fs.clone(),
            staging,
            staging_rel,
            final_dir,
            record_rel: Self::record_rel(name),
            handles: (0..n).map(|_| Mutex::new(None)).collect(),
            recording: (0..n).map(|_| Mutex::new(())).collect(),
            file_entries: manifest
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| matches!(e, Entry::File(_)))
                .map(|(i, _)| i)
                .collect(),
            links_of,
            orphan_links,
            lineage,
            journal: Mutex::new(journal),
            checkpoint: Mutex::new(()),
            state: Mutex::new(State {
                held,
                done,
                remaining,
                dirty: Default::default(),
                stamps,
            }),
            lock: Mutex::new(Some(lock)),
            key,
            draft: plan.map(|d| Mutex::new(draft::DraftPart::new(d, candidates, on_trust))),
            replacing: Mutex::new(Replacing::Unknown),
        };
        // Files fully staged but never placed (the agent died between the
        // last chunk and the rename, or placing failed): place them now.
        let staged: Vec<u32> = {
            let st = transfer.state.lock().unwrap();
            (0..n)
                .filter(|&i| !st.done[i] && st.remaining[i] == 0 && files[i].size > 0)
                .map(|i| i as u32)
                .collect()
        };
        for file in staged {
            transfer.place_file(file)?;
        }
        // The links of files held already (unchanged, or read back).
        let held: Vec<u32> = {
            let st = transfer.state.lock().unwrap();
            (0..n).filter(|&i| st.done[i]).map(|i| i as u32).collect()
        };
        for file in held {
            transfer.place_links_to(file)?;
        }
        Ok(transfer)
    }
}

/// Per file of `manifest` (`files`, in order), the positions of the
/// symlinks that lead to it; and those that lead to no file.
fn links_by_file(manifest: &Manifest, files: &[&FileEntry]) -> (Vec<Vec<usize>>, Vec<usize>) {
    let index: std::collections::HashMap<&RelPath, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (&f.path, i))
        .collect();
    let mut of = vec![Vec::new(); files.len()];
    let mut orphans = Vec::new();
    for (e, entry) in manifest.entries.iter().enumerate() {
        if let Entry::Symlink { path, target } = entry {
            match path
                .resolve_link(target)
                .and_then(|t| index.get(&t).copied())
            {
                Some(i) => of[i].push(e),
                None => orphans.push(e),
            }
        }
    }
    (of, orphans)
}

#[derive(Debug)]
struct State {
    held: ChunkSet,
    done: Vec<bool>,
    remaining: Vec<u64>,
    dirty: std::collections::BTreeSet<u32>,
    stamps: BTreeMap<RelPath, Stamp>,
}

/// A staging file open for writing: buffered, and also with `O_DIRECT`
/// where the filesystem supports it (not tmpfs), so aligned chunks skip the
/// page cache entirely.
#[derive(Debug)]
struct StagedFile {
    buffered: File,
    direct: Option<File>,
}

impl StagedFile {
    fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        if let Some(d) = &self.direct {
            if crate::util::aligned::direct_ok(data, offset) {
                match d.write_all_at(data, offset) {
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                    r => return r,
                }
            }
        }
        self.buffered.write_all_at(data, offset)?;
        start_writeback(&self.buffered, offset, data.len());
        Ok(())
    }
}

/// What a successful [`Transfer::write_chunk`] led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Stored; the file still misses chunks.
    Stored,
    /// Stored, and the file it belongs to is now complete and in place.
    FilePlaced(u32),
    /// Already held (a duplicate delivery); nothing written.
    Duplicate,
}

/// Why a chunk was not stored.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("chunk {0:?} failed its BLAKE3 check")]
    /// The chunk failed its BLAKE3 check.
    Corrupt(ChunkId),
    /// A draft's chunk whose hash the source has not announced (yet, or
    /// any more: its file was withdrawn).
    #[error("chunk {0:?} has no announced hash yet")]
    Unannounced(ChunkId),
    #[error("{0}")]
    /// The store refused or failed.
    Refused(StoreError),
}

/// A blob's check, fed its file's chunks `0..next`.
#[derive(Debug)]
struct InOrder {
    hasher: hub_layout::BlobHasher,
    next: u32,
}

impl InOrder {
    /// The check of a blob named `want` of `size` bytes, fed nothing yet.
    fn new(want: hub_layout::BlobHash, size: u64) -> InOrder {
        InOrder {
            hasher: hub_layout::BlobHasher::new(want, size),
            next: 0,
        }
    }
}

/// One model being received into a [`Store`].
#[derive(Debug)]
pub struct Transfer {
    name: ModelName,
    /// `name` is a Hub cache name: each blob is checked against its name
    /// before it is placed ([`hub_layout`]).
    hub_named: bool,
    /// Per file of a Hub-named transfer: its blob's check, fed the file's
    /// chunks in order as they land (`None`: checked from the disk when
    /// placed).
    in_order: Vec<Mutex<Option<InOrder>>>,
    manifest: Arc<Manifest>,
    map: ChunkMap,
    store_root: PathBuf,
    /// The store's root, for everything under `.xfer`.
    fs: Root,
    staging: PathBuf,
    /// `staging`, relative to the root.
    staging_rel: PathBuf,
    final_dir: PathBuf,
    /// The model record, relative to the root.
    record_rel: PathBuf,
    handles: Vec<Mutex<Option<Arc<StagedFile>>>>,
    /// Per file: held while a written chunk is recorded (and, if it
    /// completes the file, while the file is placed), so a second copy of
    /// the chunk reports `Duplicate` only once the first is fully recorded.
    recording: Vec<Mutex<()>>,
    /// Position in `manifest.entries` of each file.
    file_entries: Vec<usize>,
    /// Per file: the positions in `manifest.entries` of the symlinks that
    /// lead to it, placed right after it.
    links_of: Vec<Vec<usize>>,
    /// The symlinks that lead to no file, placed at the end.
    orphan_links: Vec<usize>,
    /// For a manifest: the draft the name's record came from, when this
    /// manifest keeps every file and link of it (see [`ModelRecord::draft`]).
    lineage: Option<Hash>,
    journal: Mutex<Journal>,
    /// Serialises checkpoints.
    checkpoint: Mutex<()>,
    state: Mutex<State>,
    /// The staging lock; dropped by [`Transfer::release`].
    lock: Mutex<Option<File>>,
    /// The manifest's root, or the draft's id: what the journal, peer
    /// links and extra connections know this transfer by.
    key: Hash,
    /// For a draft: its hashes so far, seals and staged candidates
    /// (`manifest` is then only its shape).
    draft: Option<Mutex<draft::DraftPart>>,
    /// The name's record as this transfer last wrote or read it; held
    /// while a file is placed, so no file is renamed in before the record
    /// stopped vouching for the file it replaces.
    replacing: Mutex<Replacing>,
}

/// What placing a file does to the name's record.
#[derive(Debug)]
enum Replacing {
    /// Not looked at yet.
    Unknown,
    /// No record, or a complete record of this very manifest: placing
    /// verified bytes of it changes nothing it vouches for.
    Nothing,
    /// A record this transfer marked as being replaced (or found so): each
    /// placed file's old stamp is dropped from it first.
    Marked(ModelRecord),
}

impl Transfer {
    /// The manifest; for a draft, its shape (placeholder hashes).
    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    /// The manifest's root, or the draft's id.
    pub fn key(&self) -> Hash {
        self.key
    }

    /// The chunk numbering of the transfer's manifest.
    pub fn map(&self) -> &ChunkMap {
        &self.map
    }

    /// The model's name.
    pub fn name(&self) -> &ModelName {
        &self.name
    }

    /// Chunks held and verified (durable or about to be).
    pub fn held(&self) -> ChunkSet {
        self.state.lock().unwrap().held.clone()
    }

    /// The files not yet verified and under their final name, in manifest
    /// order; every other file is (placed by this transfer, or an earlier
    /// copy read back and found identical).
    pub fn pending(&self) -> Vec<RelPath> {
        let st = self.state.lock().unwrap();
        let mut out: Vec<RelPath> = self
            .manifest
            .files()
            .zip(&st.done)
            .filter(|(_, d)| !**d)
            .map(|(f, _)| f.path.clone())
            .collect();
        // A symlink is placed with its file; one that leads to no file, at
        // the end.
        let unplaced = self
            .links_of
            .iter()
            .zip(&st.done)
            .filter(|(_, d)| !**d)
            .flat_map(|(links, _)| links.iter().copied())
            .chain(self.orphan_links.iter().copied());
        out.extend(unplaced.map(|e| self.manifest.entries[e].path().clone()));
        out
    }

    /// Bytes of the chunks held.
    pub fn held_bytes(&self) -> u64 {
        let st = self.state.lock().unwrap();
        st.held
            .iter()
            .map(|n| self.map.chunk_len(self.map.id(n)))
            .sum()
    }

    fn data_path(&self, file: u32) -> PathBuf {
        self.staging.join("data").join(file.to_string())
    }

    /// [`Self::data_path`], relative to the root.
    fn data_rel(&self, file: u32) -> PathBuf {
        self.staging_rel.join("data").join(file.to_string())
    }

    fn handle(&self, file: u32) -> Result<Arc<StagedFile>, StoreError> {
        let mut slot = self.handles[file as usize].lock().unwrap();
        if let Some(f) = slot.as_ref() {
            return Ok(f.clone());
        }
        let path = self.data_path(file);
        let f = self
            .fs
            .open_rw(&self.data_rel(file))
            .map_err(|e| io_refusal(&path, e))?;
        let size = self.map_file(file).size;
        let len = f.metadata().map_err(|e| io_refusal(&path, e))?.len();
        if len > size {
            // Left by a transfer of another manifest: its tail would be
            // placed with this file's verified chunks.
            f.set_len(size).map_err(|e| io_refusal(&path, e))?;
        }
        if len != size {
            preallocate(&f, size).map_err(|e| self.disk_refusal(&path, e, size))?;
        }
        let direct = self.fs.open_direct(&self.data_rel(file)).ok();
        let f = Arc::new(StagedFile {
            buffered: f,
            direct,
        });
        *slot = Some(f.clone());
        Ok(f)
    }

    fn map_file(&self, file: u32) -> &FileEntry {
        match &self.manifest.entries[self.file_entries[file as usize]] {
            Entry::File(f) => f,
            _ => unreachable!("file_entries only lists files"),
        }
    }

    fn disk_refusal(&self, path: &Path, e: std::io::Error, need: u64) -> StoreError {
        if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
            StoreError::NoSpace {
                need,
                have: free_space(&self.staging).unwrap_or(0),
                path: self.store_root.display().to_string(),
            }
        } else {
            io_refusal(path, e)
        }
    }

    /// Verifies a chunk against the manifest and, only if it matches, writes
    /// it to the staging file. When it completes its file, the file is
    /// committed and renamed into place before this returns.
    pub fn write_chunk(&self, id: ChunkId, data: &[u8]) -> Result<Written, ChunkError> {
        let num = self.map.number(id).ok_or_else(|| {
            ChunkError::Refused(StoreError::Invalid(format!(
                "chunk {id:?} is not in the manifest"
            )))
        })?;
        let file = self.map_file(id.file);
        if data.len() as u64 != self.map.chunk_len(id) {
            return Err(ChunkError::Corrupt(id));
        }
        let expected = match &self.draft {
            None => file.chunks[id.index as usize],
            Some(d) => d
                .lock()
                .unwrap()
                .expected(num)
                .ok_or(ChunkError::Unannounced(id))?,
        };
        if hash::hash_chunk(
            data,
            id.index as u64,
            file.chunks.len() as u64,
            self.manifest.chunk_size,
        ) != expected
        {
            return Err(ChunkError::Corrupt(id));
        }
        if self.state.lock().unwrap().held.contains(num) {
            let _recorded = self.recording[id.file as usize].lock().unwrap();
            return Ok(Written::Duplicate);
        }
        let f = self.handle(id.file).map_err(ChunkError::Refused)?;
        let path = self.data_path(id.file);
        f.write_at(data, self.map.offset(id))
            .map_err(|e| ChunkError::Refused(self.disk_refusal(&path, e, data.len() as u64)))?;
        let _recording = self.recording[id.file as usize].lock().unwrap();
        if !self.still_expected(num, expected) {
            // Its file was withdrawn meanwhile: what was written is stale.
            return Err(ChunkError::Unannounced(id));
        }
        let complete = {
            let mut st = self.state.lock().unwrap();
            if !st.held.insert(num) {
                return Ok(Written::Duplicate);
            }
            st.remaining[id.file as usize] -= 1;
            st.dirty.insert(id.file);
            st.remaining[id.file as usize] == 0
        };
        // Journal after the write: a record never precedes its data.
        self.journal
            .lock()
            .unwrap()
            .append(&[Record::Chunk(id)])
            .map_err(|e| ChunkError::Refused(io_refusal(&self.staging.join("journal"), e)))?;
        self.feed_in_order(id, data);
        // A draft's file waits for its seal (see `draft`).
        if complete && self.may_place(id.file) {
            self.place_file(id.file).map_err(ChunkError::Refused)?;
            return Ok(Written::FilePlaced(id.file));
        }
        Ok(Written::Stored)
    }

    /// Feeds a Hub blob's check every chunk from the next one it lacks on
    /// that is held: `data` for chunk `id`, the others read back (those
    /// held after it, and after a draft's withdrawal started the check
    /// over, the ones held before it). Called with the file's `recording`
    /// lock held, after the chunk is recorded held. A read that fails
    /// drops the check: the file is then read whole when placed.
    fn feed_in_order(&self, id: ChunkId, data: &[u8]) {
        let mut slot = self.in_order[id.file as usize].lock().unwrap();
        let Some(at) = slot.as_mut() else { return };
        let chunks = self.map_file(id.file).chunks.len() as u32;
        let mut buf = Vec::new();
        while at.next < chunks {
            let next = ChunkId {
                file: id.file,
                index: at.next,
            };
            if next == id {
                at.hasher.update(data);
                at.next += 1;
                continue;
            }
            let held = self
                .map
                .number(next)
                .is_some_and(|n| self.state.lock().unwrap().held.contains(n));
            if !held {
                return;
            }
            buf.resize(self.map.chunk_len(next) as usize, 0);
            let read = self.handle(id.file).ok().and_then(|f| {
                f.buffered
                    .read_exact_at(&mut buf, self.map.offset(next))
                    .ok()
            });
            if read.is_none() {
                *slot = None;
                return;
            }
            at.hasher.update(&buf);
            at.next += 1;
        }
    }

    /// A checkpoint: fsyncs the data written so far and marks it durable in
    /// the journal, so it survives a power cut too. Writers keep going
    /// meanwhile; the agent calls this every couple of seconds.
    pub fn commit(&self) -> Result<(), StoreError> {
        let _one_at_a_time = self.checkpoint.lock().unwrap();
        let durable = self.journal.lock().unwrap().len();
        let dirty = std::mem::take(&mut self.state.lock().unwrap().dirty);
        for file in dirty {
            let handle = self.handles[file as usize].lock().unwrap().clone();
            if let Some(f) = handle {
                f.buffered
                    .sync_data()
                    .map_err(|e| io_refusal(&self.data_path(file), e))?;
            }
        }
        self.journal
            .lock()
            .unwrap()
            .sync(durable)
            .map_err(|e| io_refusal(&self.staging.join("journal"), e))
    }

    /// Moves a complete staging file to its final path.
    fn place_file(&self, file: u32) -> Result<(), StoreError> {
        let entry = self.map_file(file);
        let from = self.data_path(file);
        let open = self.handles[file as usize].lock().unwrap().take();
        let rel = self.data_rel(file);
        let staged = match open {
            Some(f) => f.buffered.try_clone(),
            None if entry.size == 0 => self.fs.open_rw(&rel),
            None => self.fs.open_read(&rel),
        }
        .and_then(|f| f.sync_all().map(|_| f))
        .map_err(|e| io_refusal(&from, e))?;
        let mode = if entry.executable { 0o755 } else { 0o644 };
        // On the open file: a path could have been swapped for a link.
        staged
            .set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| io_refusal(&from, e))?;
        // A Hub-named model's blob must be the bytes its name hashes to,
        // whatever manifest the source sent.
        if let (true, Some(want)) = (self.hub_named, hub_layout::blob_hash(&entry.path)) {
            use std::io::{Seek, SeekFrom};
            let fed = self.in_order[file as usize]
                .lock()
                .unwrap()
                .take()
                .filter(|at| at.next as usize == entry.chunks.len());
            let checked = match fed {
                // Every chunk was fed in order as it landed.
                Some(at) => at.hasher.finish(),
                None => {
                    let mut f = &staged;
                    f.seek(SeekFrom::Start(0))
                        .and_then(|_| hub_layout::check_blob(&mut f, entry.size, want))
                        .map_err(|e| io_refusal(&from, e))?
                }
            };
            if let Err(got) = checked {
                return Err(StoreError::NotHubs(format!(
                    "`{}` of `{}` hashes to {got}, not to its name: a Hub-named model holds the Hub's bytes, and the source sent others; not placed (sync it from the Hub again)",
                    entry.path, self.name
                )));
            }
        }
        drop(staged);
        let mut replacing = self.replacing.lock().unwrap();
        self.before_placing(&mut replacing, &entry.path)?;
        let to = place(&self.final_dir, &entry.path, |to| {
            self.fs.rename_to(&rel, to)
        })?;
        drop(replacing);
        let stamp = Stamp::of(&to).ok_or_else(|| StoreError::Io {
            path: to.display().to_string(),
            message: "file vanished right after it was placed".into(),
        })?;
        {
            let mut st = self.state.lock().unwrap();
            st.done[file as usize] = true;
            st.stamps.insert(entry.path.clone(), stamp);
        }
        self.journal
            .lock()
            .unwrap()
            .append(&[Record::FileDone(file)])
            .map_err(|e| io_refusal(&self.staging.join("journal"), e))?;
        self.place_links_to(file)
    }

    /// Places the symlinks that lead to `file`, which is in place: a Hub
    /// snapshot's names appear with their blobs, not at the end.
    fn place_links_to(&self, file: u32) -> Result<(), StoreError> {
        for &e in &self.links_of[file as usize] {
            if let Entry::Symlink { path, target } = &self.manifest.entries[e] {
                self.place_link(path, target)?;
            }
        }
        Ok(())
    }

    /// Puts the symlink `path` -> `target` in place (atomically, never
    /// through a link), unless that very link is there already.
    fn place_link(&self, path: &RelPath, target: &str) -> Result<(), StoreError> {
        let at = path.under(&self.final_dir);
        if fs::read_link(&at).is_ok_and(|t| t == Path::new(target)) {
            return Ok(());
        }
        let mut replacing = self.replacing.lock().unwrap();
        self.before_placing(&mut replacing, path)?;
        place(&self.final_dir, path, |to| {
            // Named after the link itself, not the process: a run killed
            // between the two steps leaves it where the next run of the
            // same link removes it, never as litter in the model's tree.
            let name = to.file_name().unwrap_or_default().to_string_lossy();
            let tmp = to.with_file_name(format!(".{name}.xfer-link"));
            let _ = fs::remove_file(&tmp);
            std::os::unix::fs::symlink(target, &tmp)?;
            fs::rename(&tmp, to)
        })?;
        Ok(())
    }

    /// The streamed draft whose every file and link this transfer holds
    /// once complete: its own id for a draft, or, for a manifest, the
    /// draft of the record it updates when it keeps all of that
    /// ([`ModelRecord::draft`]).
    pub fn draft_lineage(&self) -> Option<Hash> {
        match &self.draft {
            Some(_) => Some(self.key),
            None => self.lineage,
        }
    }

    /// Before `path` is renamed over the name's files: a complete record of
    /// another manifest stops certifying them (see `record`), and the old
    /// file's stamp leaves the record, durably, so a resumed transfer never
    /// takes the new bytes for the old file (a stamp cannot tell two writes
    /// within one clock tick apart).
    fn before_placing(&self, state: &mut Replacing, path: &RelPath) -> Result<(), StoreError> {
        if matches!(state, Replacing::Unknown) {
            *state = match read_record(&self.fs, &self.record_rel) {
                None => Replacing::Nothing,
                Some(rec)
                    if rec.is_complete()
                        && self.draft.is_none()
                        && rec.manifest.root == self.key =>
                {
                    Replacing::Nothing
                }
                Some(mut rec) => {
                    let was_complete = rec.is_complete();
                    rec.replacing.get_or_insert(self.key);
                    if was_complete {
                        self.write_record(&rec)?;
                    }
                    Replacing::Marked(rec)
                }
            };
        }
        if let Replacing::Marked(rec) = state {
            if rec.stamps.remove(path).is_some() {
                self.write_record(rec)?;
            }
        }
        Ok(())
    }

    /// Writes the name's record, durably.
    fn write_record(&self, rec: &ModelRecord) -> Result<(), StoreError> {
        write_record(&self.fs, &self.record_rel, rec)
    }

    /// Opens the file that holds verified chunk `id`, for serving it to a
    /// peer: the staging file while it is incomplete, the placed file after.
    /// Fails if the chunk is not held.
    pub fn open_held(&self, id: ChunkId) -> Result<(File, PathBuf), OpenHeldError> {
        let num = self.map.number(id).ok_or(OpenHeldError::NoSuchChunk)?;
        let done = {
            let st = self.state.lock().unwrap();
            if !st.held.contains(num) {
                return Err(OpenHeldError::NotHeld);
            }
            st.done[id.file as usize]
        };
        let staged = self.data_path(id.file);
        let placed = || {
            let rel = &self.map_file(id.file).path;
            let p = rel.under(&self.final_dir);
            File::open(&p)
                .map(|f| (f, p.clone()))
                .map_err(|source| OpenHeldError::Open { path: p, source })
        };
        if done {
            return placed();
        }
        match self.fs.open_read(&self.data_rel(id.file)) {
            Ok(f) => Ok((f, staged)),
            // Renamed into place since the check above.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => placed(),
            Err(source) => Err(OpenHeldError::Open {
                path: staged,
                source,
            }),
        }
    }

    /// Releases the staging lock early, so a later transfer of the same
    /// model can begin while this object is still referenced (by peers it
    /// serves). Called when the transfer ends, whatever the outcome.
    pub fn release(&self) {
        self.lock.lock().unwrap().take();
    }

    /// Whether every chunk is held.
    pub fn is_complete(&self) -> bool {
        self.state.lock().unwrap().held.is_complete()
    }

    /// Places empty files, directories and symlinks, records the complete
    /// model and removes the staging area. Call once every chunk is held.
    pub fn finish(&self) -> Result<Hash, StoreError> {
        if let Some(d) = &self.draft {
            if !d.lock().unwrap().is_sealed_all() {
                return Err(StoreError::Invalid(format!(
                    "finish called on the draft of `{}` before every file was sealed",
                    self.name
                )));
            }
        }
        for (i, f) in self.manifest.files().enumerate() {
            let done = self.state.lock().unwrap().done[i];
            if !done {
                if f.size == 0 {
                    self.place_file(i as u32)?;
                } else {
                    return Err(StoreError::Invalid(format!(
                        "finish called while `{}` is incomplete",
                        f.path
                    )));
                }
            }
        }
        for e in &self.manifest.entries {
            match e {
                Entry::Dir { path } => {
                    place_dir(&self.final_dir, path)?;
                }
                Entry::Symlink { path, target } => self.place_link(path, target)?,
                Entry::File(_) => {}
            }
        }
        self.commit()?;
        let stamps = self.state.lock().unwrap().stamps.clone();
        let manifest = match &self.draft {
            None => self.manifest.to_doc(),
            Some(d) => d
                .lock()
                .unwrap()
                .manifest()
                .ok_or_else(|| {
                    StoreError::Invalid(format!(
                        "finish called on the draft of `{}` before every file was sealed",
                        self.name
                    ))
                })?
                .to_doc(),
        };
        // A streamed draft that placed nothing (a re-sync of what this
        // node holds) leaves a complete record that already vouches for
        // all of it as it was, naming the draft: its root does not flicker
        // to the draft's, which covers fewer files.
        let placed_nothing = matches!(*self.replacing.lock().unwrap(), Replacing::Unknown);
        if self.draft.is_some() && placed_nothing {
            if let Some(mut held) = read_record(&self.fs, &self.record_rel)
                .filter(|r| r.is_complete() && covers(&r.manifest.manifest, &manifest.manifest))
            {
                held.draft = self.draft_lineage();
                // Every kept blob was checked when this transfer began.
                held.blobs_checked = self.hub_named;
                self.write_record(&held)?;
                let _ = self.fs.remove_dir_all(&self.staging_rel);
                // What the source sealed: the draft's root, as ever.
                return Ok(manifest.root);
            }
        }
        let record = ModelRecord {
            manifest,
            stamps,
            replacing: None,
            draft: self.draft_lineage(),
            // Each blob placed was checked at `place_file`, each kept one
            // when this transfer began ([`resume`]).
            blobs_checked: self.hub_named,
        };
        self.write_record(&record)?;
        let _ = self.fs.remove_dir_all(&self.staging_rel);
        Ok(record.manifest.root)
    }
}

/// Whether every file and link of `part` is in `whole`, the same.
fn covers(whole: &Manifest, part: &Manifest) -> bool {
    part.entries.iter().all(|e| match e {
        Entry::Dir { .. } => true,
        e => whole.entries.contains(e),
    })
}

/// Starts writing a just-written range back to disk without waiting, so the
/// disk works while the network does and checkpoints find little left to
/// flush. Purely advisory: errors surface at the next fsync.
fn start_writeback(f: &File, offset: u64, len: usize) {
    // SAFETY: sync_file_range on an fd we own, with a valid range.
    unsafe {
        libc::sync_file_range(
            f.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

/// Whether `dir` holds only folders, `depth` deep at most (no file, no
/// link, nothing deeper): deleting it loses nothing.
fn holds_no_file(dir: &Path, depth: usize) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().all(|e| {
        e.file_type().is_ok_and(|t| t.is_dir()) && depth > 0 && holds_no_file(&e.path(), depth - 1)
    })
}

/// Reserves `size` bytes for a staging file so a full disk shows up before
/// the transfer, not in the middle of it.
pub fn preallocate(f: &File, size: u64) -> std::io::Result<()> {
    if size == 0 {
        return Ok(());
    }
    // SAFETY: plain fallocate on an fd we own.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return f.set_len(size);
    }
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::manifest::file;
    use xfer_proto::manifest::MANIFEST_VERSION;

    const CS: u64 = hash::MIN_CHUNK_SIZE;

    #[test]
    fn an_empty_folder_goes_without_force_and_one_with_a_file_needs_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let typo = ModelName::new("models--acme--big-modle").unwrap();
        fs::create_dir_all(dir.path().join("models--acme--big-modle/blobs")).unwrap();
        assert!(store.remove(&typo, false).unwrap());
        assert!(!dir.path().join("models--acme--big-modle").exists());
        let theirs = ModelName::new("theirs").unwrap();
        fs::create_dir_all(dir.path().join("theirs/sub")).unwrap();
        fs::write(dir.path().join("theirs/sub/w.bin"), b"keep").unwrap();
        let e = store.remove(&theirs, false).unwrap_err().to_string();
        assert!(e.contains("--force"), "{e}");
        assert!(dir.path().join("theirs/sub/w.bin").exists());
    }

    fn data(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect()
    }

    fn setup() -> (
        tempfile::TempDir,
        Store,
        ModelName,
        Arc<Manifest>,
        Vec<Vec<u8>>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let a = data(3 * CS as usize + 5, 3);
        let b = data(100, 7);
        let m = Manifest {
            version: MANIFEST_VERSION,
            chunk_size: CS,
            entries: vec![
                file("d/a.bin", &a, CS),
                file("e", b"", CS),
                Entry::Dir {
                    path: RelPath::new("empty").unwrap(),
                },
                Entry::Symlink {
                    path: RelPath::new("link").unwrap(),
                    target: "d/a.bin".into(),
                },
                file("z", &b, CS),
            ],
        };
        m.validate().unwrap();
        (
            dir,
            store,
            ModelName::new("m").unwrap(),
            Arc::new(m),
            vec![a, b],
        )
    }

    fn chunk(d: &[u8], i: u32) -> &[u8] {
        let s = i as usize * CS as usize;
        &d[s..(s + CS as usize).min(d.len())]
    }

    #[test]
    fn a_link_half_placed_by_a_killed_run_leaves_no_litter() {
        let (dir, store, name, m, files) = setup();
        // A run killed between making the temporary link and renaming it
        // left this (the temporary is named after the link).
        fs::create_dir_all(dir.path().join("m")).unwrap();
        let litter = dir.path().join("m/.link.xfer-link");
        std::os::unix::fs::symlink("d/a.bin", &litter).unwrap();
        let t = store.begin(&name, m.clone()).unwrap();
        for (f, data) in [(0u32, &files[0]), (2, &files[1])] {
            let chunks = data.len().div_ceil(CS as usize) as u32;
            for i in 0..chunks {
                t.write_chunk(ChunkId { file: f, index: i }, chunk(data, i))
                    .unwrap();
            }
        }
        t.finish().unwrap();
        assert!(
            fs::symlink_metadata(&litter).is_err(),
            "the half-placed link stayed"
        );
        let names: Vec<String> = fs::read_dir(dir.path().join("m"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(names.is_empty(), "litter in the model's folder: {names:?}");
    }

    #[test]
    fn a_second_copy_reports_duplicate_only_once_the_first_is_placed() {
        // Two peers deliver the last chunk of a file at once (an endgame
        // duplicate). Whichever loses must not report before the winner has
        // placed the file, or the transfer would finish with it missing.
        for _ in 0..20 {
            let (dir, store, name, m, files) = setup();
            let t = Arc::new(store.begin(&name, m.clone()).unwrap());
            for i in 0..3 {
                t.write_chunk(ChunkId { file: 0, index: i }, chunk(&files[0], i))
                    .unwrap();
            }
            let last = chunk(&files[0], 3).to_vec();
            let placed = dir.path().join("m/d/a.bin");
            // The second copy arrives just after the first is counted as
            // held, while the first is still placing the file.
            let num = t.map().number(ChunkId { file: 0, index: 3 }).unwrap();
            let racers: Vec<_> = [false, true]
                .into_iter()
                .map(|second| {
                    let (t, last, placed) = (t.clone(), last.clone(), placed.clone());
                    std::thread::spawn(move || {
                        while second && !t.held().contains(num) {
                            std::hint::spin_loop();
                        }
                        let w = t.write_chunk(ChunkId { file: 0, index: 3 }, &last);
                        // Checked the moment it returns.
                        let was_placed = placed.exists();
                        let readable = t.open_held(ChunkId { file: 0, index: 3 }).is_ok();
                        (w.unwrap(), was_placed, readable)
                    })
                })
                .collect();
            let results: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
            for (w, was_placed, readable) in &results {
                assert!(was_placed, "{w:?} returned before the file was placed");
                assert!(readable, "{w:?}: the held chunk cannot be served");
            }
            let kinds: Vec<_> = results.iter().map(|(w, _, _)| *w).collect();
            assert!(kinds.contains(&Written::FilePlaced(0)), "{kinds:?}");
        }
    }

    #[test]
    fn a_full_transfer_places_everything() {
        let (dir, store, name, m, files) = setup();
        let t = store.begin(&name, m.clone()).unwrap();
        for i in 0..4 {
            let w = t
                .write_chunk(ChunkId { file: 0, index: i }, chunk(&files[0], i))
                .unwrap();
            assert_eq!(w == Written::FilePlaced(0), i == 3);
            assert_eq!(
                dir.path().join("m/d/a.bin").exists(),
                i == 3,
                "final path only when complete"
            );
        }
        t.write_chunk(ChunkId { file: 2, index: 0 }, &files[1])
            .unwrap();
        assert!(t.is_complete());
        let root = t.finish().unwrap();
        drop(t);
        assert_eq!(root, m.root());
        assert_eq!(fs::read(dir.path().join("m/d/a.bin")).unwrap(), files[0]);
        assert_eq!(fs::read(dir.path().join("m/link")).unwrap(), files[0]);
        assert!(dir.path().join("m/empty").is_dir());
        assert_eq!(fs::read(dir.path().join("m/e")).unwrap(), b"");
        assert!(!dir.path().join(".xfer/staging/m").exists());
        // A second transfer of the same model holds everything already.
        let t = store.begin(&name, m.clone()).unwrap();
        assert!(t.is_complete());
        drop(t);
        // Touching a file makes it needed again.
        fs::write(dir.path().join("m/z"), b"changed").unwrap();
        let t = store.begin(&name, m).unwrap();
        assert!(!t.is_complete());
        assert_eq!(t.held().count(), 4);
    }

    #[test]
    fn corrupt_chunks_are_never_written() {
        let (dir, store, name, m, files) = setup();
        let t = store.begin(&name, m).unwrap();
        let mut bad = chunk(&files[0], 1).to_vec();
        bad[10] ^= 0xff;
        assert!(matches!(
            t.write_chunk(ChunkId { file: 0, index: 1 }, &bad),
            Err(ChunkError::Corrupt(_))
        ));
        assert!(matches!(
            t.write_chunk(ChunkId { file: 0, index: 1 }, &bad[..5]),
            Err(ChunkError::Corrupt(_))
        ));
        assert!(matches!(
            t.write_chunk(ChunkId { file: 9, index: 0 }, &bad),
            Err(ChunkError::Refused(StoreError::Invalid(_)))
        ));
        assert_eq!(t.held().count(), 0);
        assert!(!dir.path().join("m/d/a.bin").exists());
    }

    #[test]
    fn a_crashed_process_resumes_with_every_written_chunk() {
        let (_dir, store, name, m, files) = setup();
        let t = store.begin(&name, m.clone()).unwrap();
        t.write_chunk(ChunkId { file: 0, index: 0 }, chunk(&files[0], 0))
            .unwrap();
        t.write_chunk(ChunkId { file: 0, index: 2 }, chunk(&files[0], 2))
            .unwrap();
        t.commit().unwrap();
        t.write_chunk(ChunkId { file: 0, index: 1 }, chunk(&files[0], 1))
            .unwrap();
        drop(t); // process crash: chunk 1 was never checkpointed, but the
                 // kernel has it (a reboot is covered in `journal`)
        let t = store.begin(&name, m).unwrap();
        assert_eq!(t.held().iter().collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn placement_never_follows_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let model = dir.path().join("m");
        fs::create_dir(&model).unwrap();
        std::os::unix::fs::symlink(outside.path(), model.join("d")).unwrap();
        let r = place(&model, &RelPath::new("d/x").unwrap(), |p| {
            fs::write(p, b"x")
        });
        assert!(matches!(r, Err(StoreError::Unsafe { .. })), "{r:?}");
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_second_concurrent_transfer_is_refused() {
        let (_dir, store, name, m, _) = setup();
        let _t = store.begin(&name, m.clone()).unwrap();
        assert!(matches!(store.begin(&name, m), Err(StoreError::Busy(_))));
    }
}
