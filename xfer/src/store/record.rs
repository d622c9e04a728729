//! The record of a model: `<root>/.xfer/models/<name>.json`, the manifest
//! a name was last verified against and each final file's stamp (size and
//! mtime) when it was placed.
//!
//! A record certifies bytes only while two things hold:
//! - it is not *replacing*: a transfer of another manifest marks the record
//!   durably before it renames its first file over the old ones, and only
//!   its `finish` writes a complete record again. An interrupted update is
//!   therefore visibly incomplete, never "complete with the old root";
//! - every file's stamp on disk is the one recorded ([`ModelRecord::changed`]):
//!   a file replaced, truncated or touched since is no longer vouched for.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use xfer_proto::hash::Hash;
use xfer_proto::manifest::ManifestDoc;
use xfer_proto::relpath::RelPath;

/// What `<root>/.xfer/models/<name>.json` holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct ModelRecord {
    /// The manifest, with its root and totals.
    pub manifest: ManifestDoc,
    /// Size and mtime of each final file when it was placed, to tell later
    /// whether it was touched since.
    pub stamps: BTreeMap<RelPath, Stamp>,
    /// Set (to the new transfer's key: a manifest root or a draft's id)
    /// before a transfer of another manifest places its first file under
    /// this name. Such a record certifies nothing; it only tells a resumed
    /// transfer which files are still the old, verified ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacing: Option<Hash>,
    /// The id of the streamed draft whose every file and link this model
    /// holds unchanged: set when a draft's transfer completes it, and kept
    /// by a later transfer (the pull's final round) whose manifest keeps
    /// them all. What a rank that started while the draft streamed checks
    /// (`launcher/python/xfer_vllm_loader`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<Hash>,
    /// Set on a Hub-named model (`models--ORG--NAME`) once every blob was
    /// checked against the hash its name says (when it was placed, pulled
    /// or kept). A Hub-named record without it (made by an xfer before
    /// this check) vouches for sizes and BLAKE3 hashes, not that the bytes
    /// are the Hub's: the launch gate refuses it until a sync or the
    /// periodic verify checks the blobs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blobs_checked: bool,
}

impl ModelRecord {
    /// Reads a record and checks its manifest and stated root.
    pub fn load(path: &Path) -> anyhow::Result<ModelRecord> {
        use anyhow::Context;
        let bytes = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse(&bytes, path)
    }

    /// [`ModelRecord::load`] on bytes already read; `path` names them in
    /// messages.
    pub fn parse(bytes: &[u8], path: &Path) -> anyhow::Result<ModelRecord> {
        use anyhow::Context;
        let rec: ModelRecord = serde_json::from_slice(bytes)
            .with_context(|| format!("{} is damaged", path.display()))?;
        let m = &rec.manifest.manifest;
        m.validate()
            .with_context(|| format!("{} is invalid", path.display()))?;
        anyhow::ensure!(
            m.root() == rec.manifest.root,
            "{} was altered (root mismatch)",
            path.display()
        );
        Ok(rec)
    }

    /// Whether this record vouches for its manifest (no transfer of another
    /// manifest began replacing its files).
    pub fn is_complete(&self) -> bool {
        self.replacing.is_none()
    }

    /// Why the final file `path` (under the model folder `dir`) is no longer
    /// the one this record verified, if it is not: missing, another size,
    /// or another mtime (replaced or written since), or never stamped.
    pub fn changed(&self, dir: &Path, path: &RelPath) -> Option<String> {
        let Some(recorded) = self.stamps.get(path) else {
            return Some(format!(
                "{path} has no verified stamp in the model's record (a verify found it damaged, or an older agent placed it)"
            ));
        };
        match Stamp::of(&path.under(dir)) {
            None => Some(format!("{path} is missing or not a regular file")),
            Some(now) if now.size != recorded.size => Some(format!(
                "{path} is {} bytes, {} when it was verified",
                now.size, recorded.size
            )),
            Some(now) if now != *recorded => {
                Some(format!("{path} was modified since it was verified"))
            }
            Some(_) => None,
        }
    }
}

/// A file's identity on disk when it was last verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, in nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl Stamp {
    /// The stamp of the regular file at `path` (never through a symlink at
    /// its last component); `None` if it is missing or not a regular file.
    pub fn of(path: &Path) -> Option<Stamp> {
        let m = fs::symlink_metadata(path).ok()?;
        m.is_file().then(|| Stamp {
            size: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        })
    }
}
