//! What a pull tells a streaming fan-out (issue 17), in the vocabulary of
//! [`xfer_proto::draft`]: first the draft of the files it pulls (paths and
//! sizes from the listing), then, per file, each chunk's BLAKE3 hash as the
//! download's single hashing pass completes it, and the file's seal once
//! its Hub hash matched, or its withdrawal when it did not (the new
//! download's chunks then come under the next generation). The draft lists
//! contents (in the Hub cache, blobs), so paths sharing a blob are one file.
//! Files already in the cache are hashed once and sealed at the start.
//!
//! An [`Announcer`] sits between the downloader and the pull's progress
//! bars as their [`Watch`]; it only adds the announcements.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use xfer_proto::draft::{Draft, DraftEvent, FileIndex};
use xfer_proto::hash::Hash;
use xfer_proto::relpath::RelPath;

use super::download::Watch;

/// What the pull says, in order.
#[derive(Debug, Clone)]
pub enum DraftUpdate {
    /// The files it pulls, by where their contents go relative to the
    /// pull's folder (in the Hub cache, `blobs/<hash>`: paths that share
    /// a blob are one file); every later event's file index is into this.
    /// `paths` gives, per file in the draft's order, where its bytes are.
    Listed {
        /// The draft manifest of the files.
        draft: Draft,
        /// The commit pulled.
        commit: String,
        /// Where each file's bytes are, in the draft's order.
        paths: Vec<DraftPaths>,
    },
    /// A file's chunks were hashed, or its download was withdrawn.
    Event(DraftEvent),
    /// The first downloaded byte landed (what `first_byte_s` counts from).
    FirstByte,
}

/// Where one drafted file's bytes are on the pulling node: at `content`
/// once it is placed, in `incomplete` while it downloads.
#[derive(Debug, Clone)]
pub struct DraftPaths {
    /// Where the file is once placed.
    pub content: std::path::PathBuf,
    /// Where it is while it downloads.
    pub incomplete: std::path::PathBuf,
}

/// Told of every [`DraftUpdate`], from the pull's tasks and threads.
pub type OnDraft = Arc<dyn Fn(DraftUpdate) + Send + Sync>;

/// One downloaded file as the draft knows it.
struct Job {
    file: FileIndex,
    generation: AtomicU32,
}

/// The downloader's [`Watch`] that also announces.
pub struct Announcer {
    inner: Arc<dyn Watch>,
    on: OnDraft,
    jobs: Vec<Job>,
    /// Whether [`DraftUpdate::FirstByte`] was said.
    started: std::sync::atomic::AtomicBool,
}

impl Announcer {
    /// For downloads of `jobs` (the draft's paths, in the downloader's
    /// order) over `draft`'s files.
    pub fn new(inner: Arc<dyn Watch>, on: OnDraft, draft: &Draft, jobs: &[RelPath]) -> Announcer {
        let index = |p: &RelPath| {
            draft
                .index_of(p)
                .expect("the draft lists every pulled file")
        };
        Announcer {
            inner,
            on,
            jobs: jobs
                .iter()
                .map(|p| Job {
                    file: index(p),
                    generation: AtomicU32::new(0),
                })
                .collect(),
            started: Default::default(),
        }
    }
}

/// Announces a file whose chunk hashes are all known and whose Hub hash
/// matched (one already in the cache, or a twin of one just placed).
pub fn announce_sealed(on: &OnDraft, file: FileIndex, generation: u32, hashes: &[Hash]) {
    if !hashes.is_empty() {
        on(DraftUpdate::Event(DraftEvent::Hashed {
            file,
            generation,
            first: 0,
            hashes: hashes.to_vec(),
        }));
    }
    on(DraftUpdate::Event(DraftEvent::Sealed { file, generation }));
}

impl Watch for Announcer {
    fn written(&self, index: usize, n: u64) {
        if n > 0 && !self.started.swap(true, Ordering::SeqCst) {
            (self.on)(DraftUpdate::FirstByte);
        }
        self.inner.written(index, n);
    }

    fn resumed(&self, index: usize, n: u64) {
        self.inner.resumed(index, n);
    }

    fn hashed(&self, index: usize, first: u32, hashes: &[Hash]) {
        let job = &self.jobs[index];
        (self.on)(DraftUpdate::Event(DraftEvent::Hashed {
            file: job.file,
            generation: job.generation.load(Ordering::SeqCst),
            first,
            hashes: hashes.to_vec(),
        }));
        self.inner.hashed(index, first, hashes);
    }

    fn finished(&self, index: usize, ok: bool) {
        let job = &self.jobs[index];
        let generation = job.generation.load(Ordering::SeqCst);
        if ok {
            (self.on)(DraftUpdate::Event(DraftEvent::Sealed {
                file: job.file,
                generation,
            }));
        } else {
            (self.on)(DraftUpdate::Event(DraftEvent::Withdrawn {
                file: job.file,
                generation,
            }));
            job.generation.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.finished(index, ok);
    }
}
