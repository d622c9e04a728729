//! A manifest that grows while its source is still downloading (issue 17,
//! streaming from the Hub): the sans-IO state both ends keep, events in and
//! answers out.
//!
//! The Hub's listing gives every file's path and size before the first
//! byte, so the chunk layout is fixed from the start. What arrives later,
//! per file, is each chunk's BLAKE3 hash (as the puller hashes the bytes it
//! downloads), then the file's *seal* (its Hub hash, sha256 or git sha1,
//! matched) or its *withdrawal* (it did not: every node forgets the file's
//! chunks, and the bytes downloaded again are announced afresh under the
//! next generation). A receiver checks a chunk only against an announced
//! hash, may place a file only once it is sealed, and learns the root only
//! when every file is: [`Draft::manifest`] is then the ordinary manifest.
//!
//! A draft may also list symlinks to its files (a Hub snapshot's names:
//! `snapshots/<commit>/<path>` to `../../blobs/<hash>`). They are part of
//! its shape and its id, and a receiver places each one as soon as the file
//! it leads to is placed, so a snapshot is readable file by file while the
//! rest still downloads.
//!
//! The source is trusted to announce hashes, as it is trusted with the
//! manifest today, but not to be consistent: an announcement out of range,
//! a hash changed without a withdrawal, or a seal with hashes missing is
//! refused with a [`DraftError`], never applied in part.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::hash::{self, Hash};
use crate::manifest::{
    Entry, FileEntry, Manifest, ManifestError, MANIFEST_VERSION, MAX_ENTRIES, MAX_TOTAL_CHUNKS,
};
use crate::relpath::RelPath;

/// Most chunks a draft may have: as many hashes as one offer frame could
/// carry (2 Mi; 8 TiB at the default 4 MiB chunk). A listing is a few bytes
/// a file, so without this bound a 60-byte offer could make a receiver
/// build chunk state for 2^24 chunks (about 1 GB) before any other check.
pub const MAX_DRAFT_CHUNKS: u64 = (crate::frame::MAX_FRAME / 32) as u64;

/// Index of a file in the draft (its position in the listing, sorted).
pub type FileIndex = u32;

/// What the source says about the draft; every event names the file's
/// generation, so one about a withdrawn download is recognised as stale.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DraftEvent {
    /// Chunks `first..first + hashes.len()` of `file` have these hashes.
    Hashed {
        /// The file.
        file: FileIndex,
        /// The file's download the hashes are of.
        generation: u32,
        /// The file's chunk the first hash is of.
        first: u32,
        /// The chunks' hashes, in order.
        hashes: Vec<Hash>,
    },
    /// `file` matched its Hub hash: it may be placed.
    Sealed {
        /// The file.
        file: FileIndex,
        /// The download that matched.
        generation: u32,
    },
    /// `file` failed its Hub hash: forget its chunks; generation + 1 follows.
    Withdrawn {
        /// The file.
        file: FileIndex,
        /// The download that failed.
        generation: u32,
    },
}

/// What applying an event changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// These chunks (draft-wide indices) can now be checked and fetched.
    Hashed(Range<u64>),
    /// The file may be placed once all its chunks are verified.
    Sealed(FileIndex),
    /// Discard every staged chunk in this range (draft-wide indices).
    Withdrawn(FileIndex, Range<u64>),
    /// About an earlier generation of the file: ignored.
    Stale,
}

/// Why an event or a listing was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DraftError {
    /// An event names a file the listing does not have.
    #[error("the draft names file {0}, which the listing does not have")]
    NoSuchFile(FileIndex),
    /// Hashes for chunks past the file's end.
    #[error("chunks {first}..{end} of {path} are past its {count} chunks")]
    OutOfRange {
        /// The file.
        path: RelPath,
        /// The first chunk announced.
        first: u32,
        /// One past the last chunk announced.
        end: u64,
        /// The file's chunk count.
        count: u32,
    },
    /// A chunk announced again with another hash.
    #[error("chunk {index} of {path} was announced with another hash before; a source must withdraw a file to change it")]
    Changed {
        /// The file.
        path: RelPath,
        /// The chunk, within the file.
        index: u32,
    },
    /// A file sealed before all its hashes came.
    #[error("{path} was sealed with {missing} chunk hashes not yet announced")]
    Unhashed {
        /// The file.
        path: RelPath,
        /// Chunks without a hash.
        missing: u32,
    },
    /// An event about a sealed file.
    #[error("{path} is sealed; it cannot change")]
    AlreadySealed {
        /// The file.
        path: RelPath,
    },
    /// An event about a download of the file not started yet.
    #[error("event for generation {got} of {path}, which is only at {now}")]
    FutureGeneration {
        /// The file.
        path: RelPath,
        /// The event's generation.
        got: u32,
        /// The file's generation.
        now: u32,
    },
    /// A listed symlink that leads to none of the draft's files.
    #[error("the listing's link {path} -> {target} leads to none of its files")]
    LinkNotToAFile {
        /// The link.
        path: RelPath,
        /// Its target (cut at 200 characters).
        target: String,
    },
    /// A listing of more chunks than a draft may have.
    #[error("the listing has {0} chunks, more than the {MAX_DRAFT_CHUNKS} a draft may; stream it with a larger chunk size")]
    TooManyChunks(u64),
    /// A listing's chunk size out of bounds.
    #[error("the listing's chunk size {0} is not a power of two between 64 KiB and 256 MiB")]
    ChunkSize(u64),
    /// A listing that is no valid manifest shape.
    #[error("the listing: {0}")]
    Listing(#[from] ManifestError),
}

#[derive(Clone, Debug)]
struct DraftFile {
    path: RelPath,
    size: u64,
    /// Draft-wide index of its first chunk.
    offset: u64,
    hashes: Vec<Option<Hash>>,
    generation: u32,
    sealed: bool,
}

/// A draft as the source offers it: the files' paths and sizes, and the
/// chunk size (the events then fill in the rest).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraftListing {
    /// The chunk size, in bytes.
    pub chunk_size: u64,
    /// Sorted by path, as [`Draft::listing`] gives them.
    pub files: Vec<(RelPath, u64)>,
    /// Symlinks (path, target) to the files, sorted by path.
    #[serde(default)]
    pub links: Vec<(RelPath, String)>,
}

/// The growing manifest.
#[derive(Clone, Debug)]
pub struct Draft {
    chunk_size: u64,
    files: Vec<DraftFile>,
    /// Symlinks (path, target), sorted by path; each leads to a file.
    links: Vec<(RelPath, String)>,
}

impl Draft {
    /// A draft of `files` (path and size, any order; sorted here as a
    /// manifest is) at `chunk_size`. Checked like a manifest's entries.
    pub fn new(chunk_size: u64, mut files: Vec<(RelPath, u64)>) -> Result<Draft, DraftError> {
        if !hash::is_valid_chunk_size(chunk_size) {
            return Err(DraftError::ChunkSize(chunk_size));
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        let mut offset = 0u64;
        let mut out = Vec::with_capacity(files.len());
        for (path, size) in files {
            let count = hash::chunk_count(size, chunk_size);
            if offset + count > MAX_DRAFT_CHUNKS.min(MAX_TOTAL_CHUNKS) {
                return Err(DraftError::TooManyChunks(offset + count));
            }
            out.push(DraftFile {
                path,
                size,
                offset,
                hashes: vec![None; count as usize],
                generation: 0,
                sealed: false,
            });
            offset += count;
        }
        let draft = Draft {
            chunk_size,
            files: out,
            links: Vec::new(),
        };
        // The shape (paths, sizes, counts, chunk size) is a manifest's.
        draft.shape().validate()?;
        Ok(draft)
    }

    /// The draft with these symlinks (path, target) beside its files. Each
    /// must lead to one of its files; the whole is checked like a
    /// manifest (no link leaves the tree or passes through another).
    pub fn with_links(mut self, mut links: Vec<(RelPath, String)>) -> Result<Draft, DraftError> {
        if links.len() > MAX_ENTRIES {
            return Err(DraftError::Listing(ManifestError::TooManyEntries(
                links.len(),
            )));
        }
        links.sort_by(|a, b| a.0.cmp(&b.0));
        for (path, target) in &links {
            let to = path.resolve_link(target);
            if to.as_ref().and_then(|t| self.index_of(t)).is_none() {
                return Err(DraftError::LinkNotToAFile {
                    path: path.clone(),
                    target: target.chars().take(200).collect(),
                });
            }
        }
        self.links = links;
        self.shape().validate()?;
        Ok(self)
    }

    /// The draft a receiver builds from the source's listing.
    pub fn from_listing(listing: &DraftListing) -> Result<Draft, DraftError> {
        Draft::new(listing.chunk_size, listing.files.clone())?.with_links(listing.links.clone())
    }

    /// Its total bytes and chunks, checked against [`MAX_DRAFT_CHUNKS`]
    /// without allocating anything per chunk: a receiver asks this (and
    /// checks its free space) before it builds the draft.
    pub fn extent(listing: &DraftListing) -> Result<(u64, u64), DraftError> {
        if !hash::is_valid_chunk_size(listing.chunk_size) {
            return Err(DraftError::ChunkSize(listing.chunk_size));
        }
        let (mut bytes, mut chunks) = (0u64, 0u64);
        for (_, size) in &listing.files {
            bytes = bytes.saturating_add(*size);
            chunks = chunks.saturating_add(hash::chunk_count(*size, listing.chunk_size));
            if chunks > MAX_DRAFT_CHUNKS.min(MAX_TOTAL_CHUNKS) {
                return Err(DraftError::TooManyChunks(chunks));
            }
        }
        Ok((bytes, chunks))
    }

    /// What a receiver needs to build the same draft.
    pub fn listing(&self) -> DraftListing {
        DraftListing {
            chunk_size: self.chunk_size,
            files: self
                .files
                .iter()
                .map(|f| (f.path.clone(), f.size))
                .collect(),
            links: self.links.clone(),
        }
    }

    /// A name for this draft that both ends compute alike and a re-run of
    /// the same pull finds again (its staged chunks are kept under it):
    /// the root of its shape, keyed by `salt` (the commit).
    pub fn id(&self, salt: &str) -> Hash {
        let shape = self.shape().root();
        let mut h = blake3::Hasher::new();
        h.update(b"xfer draft\0");
        h.update(salt.as_bytes());
        h.update(&shape.0);
        Hash::from(h.finalize())
    }

    /// How many files the draft lists.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Draft-wide chunk numbers of `file`.
    pub fn chunks_of(&self, file: FileIndex) -> Range<u64> {
        self.files
            .get(file as usize)
            .map_or(0..0, |f| f.offset..f.offset + f.hashes.len() as u64)
    }

    /// Whether every file is sealed (the root is known).
    pub fn is_sealed_all(&self) -> bool {
        self.files.iter().all(|f| f.sealed)
    }

    /// What a reader must not open yet: the files not sealed, and the
    /// symlinks that lead to them, in path order within each kind.
    pub fn pending(&self) -> Vec<RelPath> {
        let mut out: Vec<RelPath> = self
            .files
            .iter()
            .filter(|f| !f.sealed)
            .map(|f| f.path.clone())
            .collect();
        if out.is_empty() {
            return out;
        }
        out.extend(
            self.links
                .iter()
                .filter(|(path, target)| {
                    path.resolve_link(target)
                        .and_then(|t| self.index_of(&t))
                        .is_none_or(|i| !self.files[i as usize].sealed)
                })
                .map(|(path, _)| path.clone()),
        );
        out
    }

    /// Bytes of the sealed files, and of all files.
    pub fn sealed_bytes(&self) -> (u64, u64) {
        let total = self.files.iter().map(|f| f.size).sum();
        let sealed = self.files.iter().filter(|f| f.sealed).map(|f| f.size).sum();
        (sealed, total)
    }

    /// Draft-wide chunk count.
    pub fn total_chunks(&self) -> u64 {
        self.files
            .last()
            .map(|f| f.offset + f.hashes.len() as u64)
            .unwrap_or(0)
    }

    /// The file `path` is, if listed.
    pub fn index_of(&self, path: &RelPath) -> Option<FileIndex> {
        self.files
            .binary_search_by(|f| f.path.cmp(path))
            .ok()
            .map(|i| i as FileIndex)
    }

    /// The hash chunk `chunk` (draft-wide) must have, once announced.
    pub fn expected(&self, chunk: u64) -> Option<Hash> {
        let f = self.file_of(chunk)?;
        f.hashes[(chunk - f.offset) as usize]
    }

    /// The file holding draft-wide chunk `chunk`.
    fn file_of(&self, chunk: u64) -> Option<&DraftFile> {
        let i = self.files.partition_point(|f| f.offset <= chunk);
        let f = self.files.get(i.checked_sub(1)?)?;
        (chunk < f.offset + f.hashes.len() as u64).then_some(f)
    }

    /// Whether `file` is sealed (matched its Hub hash).
    pub fn is_sealed(&self, file: FileIndex) -> bool {
        self.files.get(file as usize).is_some_and(|f| f.sealed)
    }

    /// Which download of `file` the draft is at, if listed.
    pub fn generation(&self, file: FileIndex) -> Option<u32> {
        self.files.get(file as usize).map(|f| f.generation)
    }

    /// Applies one event from the source. A refused event changes nothing.
    pub fn apply(&mut self, event: &DraftEvent) -> Result<Applied, DraftError> {
        let (file, generation) = match event {
            DraftEvent::Hashed {
                file, generation, ..
            }
            | DraftEvent::Sealed { file, generation }
            | DraftEvent::Withdrawn { file, generation } => (*file, *generation),
        };
        let f = self
            .files
            .get_mut(file as usize)
            .ok_or(DraftError::NoSuchFile(file))?;
        if generation < f.generation {
            return Ok(Applied::Stale);
        }
        if generation > f.generation {
            return Err(DraftError::FutureGeneration {
                path: f.path.clone(),
                got: generation,
                now: f.generation,
            });
        }
        let chunks = f.offset..f.offset + f.hashes.len() as u64;
        match event {
            DraftEvent::Hashed { first, hashes, .. } => {
                let end = *first as u64 + hashes.len() as u64;
                if end > f.hashes.len() as u64 {
                    return Err(DraftError::OutOfRange {
                        path: f.path.clone(),
                        first: *first,
                        end,
                        count: f.hashes.len() as u32,
                    });
                }
                if f.sealed {
                    return Err(DraftError::AlreadySealed {
                        path: f.path.clone(),
                    });
                }
                let slots = &mut f.hashes[*first as usize..end as usize];
                if let Some(i) = slots
                    .iter()
                    .zip(hashes)
                    .position(|(had, new)| had.is_some_and(|h| h != *new))
                {
                    return Err(DraftError::Changed {
                        path: f.path.clone(),
                        index: *first + i as u32,
                    });
                }
                for (slot, h) in slots.iter_mut().zip(hashes) {
                    *slot = Some(*h);
                }
                Ok(Applied::Hashed(f.offset + *first as u64..f.offset + end))
            }
            DraftEvent::Sealed { .. } => {
                let missing = f.hashes.iter().filter(|h| h.is_none()).count() as u32;
                if missing > 0 {
                    return Err(DraftError::Unhashed {
                        path: f.path.clone(),
                        missing,
                    });
                }
                f.sealed = true;
                Ok(Applied::Sealed(file))
            }
            DraftEvent::Withdrawn { .. } => {
                if f.sealed {
                    return Err(DraftError::AlreadySealed {
                        path: f.path.clone(),
                    });
                }
                f.hashes.iter_mut().for_each(|h| *h = None);
                f.generation += 1;
                Ok(Applied::Withdrawn(file, chunks))
            }
        }
    }

    /// The manifest, once every file is sealed: what the root is taken of.
    pub fn manifest(&self) -> Option<Manifest> {
        if !self.files.iter().all(|f| f.sealed) {
            return None;
        }
        Some(self.with_chunks(|f| f.hashes.iter().map(|h| h.expect("sealed")).collect()))
    }

    /// The files' shape as a manifest with placeholder hashes: paths,
    /// sizes and chunk layout, for the store's chunk map.
    pub fn shape(&self) -> Manifest {
        self.with_chunks(|f| vec![Hash([0; 32]); f.hashes.len()])
    }

    /// A manifest of the files with the chunk hashes `chunks` gives.
    fn with_chunks(&self, chunks: impl Fn(&DraftFile) -> Vec<Hash>) -> Manifest {
        let mut entries: Vec<Entry> = self
            .files
            .iter()
            .map(|f| {
                let chunks = chunks(f);
                Entry::File(FileEntry {
                    path: f.path.clone(),
                    size: f.size,
                    hash: hash::file_hash_from_chunks(&chunks),
                    executable: false,
                    chunks,
                })
            })
            .collect();
        if !self.links.is_empty() {
            entries.extend(self.links.iter().map(|(path, target)| Entry::Symlink {
                path: path.clone(),
                target: target.clone(),
            }));
            entries.sort_by(|a, b| a.path().cmp(b.path()));
        }
        Manifest {
            version: MANIFEST_VERSION,
            chunk_size: self.chunk_size,
            entries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CS: u64 = 64 * 1024;

    fn draft() -> Draft {
        Draft::new(
            CS,
            vec![
                (RelPath::new("w.safetensors").unwrap(), 3 * CS + 1),
                (RelPath::new("config.json").unwrap(), 10),
            ],
        )
        .unwrap()
    }

    fn h(b: u8) -> Hash {
        Hash([b; 32])
    }

    #[test]
    fn links_to_its_files_are_part_of_the_shape_and_the_id() {
        let blobs = Draft::new(
            CS,
            vec![
                (RelPath::new("blobs/aa").unwrap(), 10),
                (RelPath::new("blobs/bb").unwrap(), 3 * CS),
            ],
        )
        .unwrap();
        let links = vec![
            (
                RelPath::new("snapshots/c1/sub/w.safetensors").unwrap(),
                "../../../blobs/bb".to_string(),
            ),
            (
                RelPath::new("snapshots/c1/config.json").unwrap(),
                "../../blobs/aa".to_string(),
            ),
        ];
        let d = blobs.clone().with_links(links.clone()).unwrap();
        // Sorted among the files; file indices are the files' alone.
        let shape = d.shape();
        let paths: Vec<&str> = shape.entries.iter().map(|e| e.path().as_str()).collect();
        assert_eq!(
            paths,
            [
                "blobs/aa",
                "blobs/bb",
                "snapshots/c1/config.json",
                "snapshots/c1/sub/w.safetensors"
            ]
        );
        assert_eq!(d.file_count(), 2);
        assert_ne!(d.id("c1"), blobs.id("c1"), "the links are in the id");
        // A receiver rebuilds the same draft from the listing.
        let again = Draft::from_listing(&d.listing()).unwrap();
        assert_eq!(again.id("c1"), d.id("c1"));
        // A link that leads elsewhere, or out of the tree, is refused.
        for target in ["../../blobs/zz", "../../../../etc/passwd", "/etc/passwd"] {
            let bad = vec![(RelPath::new("snapshots/c1/x").unwrap(), target.to_string())];
            assert!(
                matches!(
                    blobs.clone().with_links(bad),
                    Err(DraftError::LinkNotToAFile { .. })
                ),
                "{target}"
            );
        }
    }

    #[test]
    fn hashes_then_a_seal_give_the_manifest_and_its_root() {
        let mut d = draft();
        // Sorted: config.json is file 0 (chunk 0), the weights file 1.
        assert_eq!(d.index_of(&RelPath::new("config.json").unwrap()), Some(0));
        assert_eq!(d.total_chunks(), 5);
        let data = vec![7u8; (3 * CS + 1) as usize];
        let real: Vec<Hash> = data
            .chunks(CS as usize)
            .enumerate()
            .map(|(i, c)| hash::hash_chunk(c, i as u64, 4, CS))
            .collect();
        let ev = |first: u32, hashes: &[Hash]| DraftEvent::Hashed {
            file: 1,
            generation: 0,
            first,
            hashes: hashes.to_vec(),
        };
        assert_eq!(d.apply(&ev(0, &real[..2])), Ok(Applied::Hashed(1..3)));
        assert_eq!(d.expected(2), Some(real[1]));
        assert_eq!(d.expected(3), None, "not announced yet");
        // Sealing with chunks unannounced is refused and changes nothing.
        let seal = DraftEvent::Sealed {
            file: 1,
            generation: 0,
        };
        assert!(matches!(
            d.apply(&seal),
            Err(DraftError::Unhashed { missing: 2, .. })
        ));
        assert!(!d.is_sealed(1));
        d.apply(&ev(2, &real[2..])).unwrap();
        assert_eq!(d.apply(&seal), Ok(Applied::Sealed(1)));
        assert!(d.manifest().is_none(), "config.json is not sealed yet");
        let cfg = hash::hash_chunk(&[1; 10], 0, 1, CS);
        d.apply(&DraftEvent::Hashed {
            file: 0,
            generation: 0,
            first: 0,
            hashes: vec![cfg],
        })
        .unwrap();
        d.apply(&DraftEvent::Sealed {
            file: 0,
            generation: 0,
        })
        .unwrap();
        let m = d.manifest().unwrap();
        m.validate().unwrap();
        let Entry::File(w) = &m.entries[1] else {
            panic!()
        };
        assert_eq!(w.hash, Hash::from(blake3::hash(&data)), "b3sum of the file");
    }

    #[test]
    fn a_withdrawn_file_forgets_its_chunks_and_stale_events_are_ignored() {
        let mut d = draft();
        d.apply(&DraftEvent::Hashed {
            file: 1,
            generation: 0,
            first: 0,
            hashes: vec![h(1), h(2)],
        })
        .unwrap();
        assert_eq!(
            d.apply(&DraftEvent::Withdrawn {
                file: 1,
                generation: 0
            }),
            Ok(Applied::Withdrawn(1, 1..5))
        );
        assert_eq!(d.expected(1), None);
        assert_eq!(d.generation(1), Some(1));
        // A late announcement of the bad download is stale, not applied.
        let late = DraftEvent::Hashed {
            file: 1,
            generation: 0,
            first: 2,
            hashes: vec![h(3)],
        };
        assert_eq!(d.apply(&late), Ok(Applied::Stale));
        assert_eq!(d.expected(3), None);
        // The new download announces other hashes under generation 1.
        d.apply(&DraftEvent::Hashed {
            file: 1,
            generation: 1,
            first: 0,
            hashes: vec![h(9)],
        })
        .unwrap();
        assert_eq!(d.expected(1), Some(h(9)));
    }

    #[test]
    fn an_inconsistent_source_is_refused_without_a_change() {
        let mut d = draft();
        let at = |first: u32, hashes: Vec<Hash>| DraftEvent::Hashed {
            file: 1,
            generation: 0,
            first,
            hashes,
        };
        d.apply(&at(0, vec![h(1)])).unwrap();
        // Another hash for an announced chunk, in the same generation.
        assert!(matches!(
            d.apply(&at(0, vec![h(2)])),
            Err(DraftError::Changed { index: 0, .. })
        ));
        assert_eq!(d.expected(1), Some(h(1)));
        // The same hash again is fine (a re-sent announcement).
        d.apply(&at(0, vec![h(1)])).unwrap();
        // Past the file's 4 chunks: refused, and chunk 1 was not written.
        assert!(matches!(
            d.apply(&at(1, vec![h(5); 4])),
            Err(DraftError::OutOfRange { end: 5, .. })
        ));
        assert_eq!(d.expected(2), None);
        assert_eq!(
            d.apply(&DraftEvent::Sealed {
                file: 7,
                generation: 0
            }),
            Err(DraftError::NoSuchFile(7))
        );
        assert!(matches!(
            d.apply(&DraftEvent::Sealed {
                file: 1,
                generation: 3
            }),
            Err(DraftError::FutureGeneration { got: 3, now: 0, .. })
        ));
        // A listing that could not be a manifest is refused up front.
        let dup = vec![
            (RelPath::new("a").unwrap(), 1),
            (RelPath::new("a").unwrap(), 2),
        ];
        assert!(matches!(Draft::new(CS, dup), Err(DraftError::Listing(_))));
    }
}
