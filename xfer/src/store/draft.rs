//! A transfer of a draft: the files of a pull that is still downloading
//! them (issue 17, streaming). What differs from a transfer of a manifest:
//!
//! - a chunk is checked against the hash the source announced for it; one
//!   not announced yet is refused as [`ChunkError::Unannounced`] (and asked
//!   for again once it is);
//! - a complete file is placed under its final name only once the source
//!   sealed it (its Hub hash matched); sealing a complete file places it;
//! - a withdrawal (the download failed its Hub hash) forgets the file's
//!   staged chunks and removes its staging file;
//! - chunks the journal recorded (a resumed transfer) are only candidates:
//!   each is read back and checked when its hash is announced, so a chunk
//!   of a withdrawn download never counts;
//! - a file an earlier complete model left unchanged is held on trust, and
//!   taken back (fetched again) if an announced hash differs from the one
//!   its record holds.

use std::ops::Range;
use std::os::unix::fs::FileExt;

use super::{ChunkError, InOrder, StoreError, Transfer};
use xfer_proto::chunkset::ChunkSet;
use xfer_proto::draft::{Applied, Draft, DraftEvent, FileIndex};
use xfer_proto::hash::{self, Hash};
use xfer_proto::manifest::Manifest;

/// A draft transfer's own state, beside the store's.
#[derive(Debug)]
pub(super) struct DraftPart {
    draft: Draft,
    /// Journaled chunks not yet checked against an announced hash.
    candidates: ChunkSet,
    /// Per file held on trust: its chunk hashes as recorded.
    on_trust: Vec<Option<Vec<Hash>>>,
}

impl DraftPart {
    pub(super) fn new(
        draft: Draft,
        candidates: ChunkSet,
        on_trust: Vec<Option<Vec<Hash>>>,
    ) -> DraftPart {
        DraftPart {
            draft,
            candidates,
            on_trust,
        }
    }

    pub(super) fn expected(&self, chunk: u64) -> Option<Hash> {
        self.draft.expected(chunk)
    }

    pub(super) fn is_sealed_all(&self) -> bool {
        self.draft.is_sealed_all()
    }

    pub(super) fn manifest(&self) -> Option<Manifest> {
        self.draft.manifest()
    }

    pub(super) fn is_candidate(&self, chunk: u64) -> bool {
        self.candidates.contains(chunk)
    }

    /// `chunk`'s staged bytes are to be checked when its hash is announced.
    pub(super) fn add_candidate(&mut self, chunk: u64) {
        self.candidates.insert(chunk);
    }
}

/// What a draft event changed, for the transfer's scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DraftChange {
    /// These chunks are announced (the source has them); `adopted` are
    /// those of them this node had staged already and that checked out.
    Hashed {
        /// The chunks announced.
        chunks: Range<u64>,
        /// Those this node had staged and that checked out.
        adopted: Vec<u64>,
    },
    /// Chunks this node held no longer count (a withdrawn download, or a
    /// file held on trust whose announced hash differs).
    Dropped(Range<u64>),
    /// A file was sealed (and placed, if complete).
    Sealed(FileIndex),
    /// About a withdrawn generation: nothing changed.
    Stale,
}

fn event_file(ev: &DraftEvent) -> FileIndex {
    match ev {
        DraftEvent::Hashed { file, .. }
        | DraftEvent::Sealed { file, .. }
        | DraftEvent::Withdrawn { file, .. } => *file,
    }
}

impl Transfer {
    /// Whether this transfer receives a draft.
    pub fn is_draft(&self) -> bool {
        self.draft.is_some()
    }

    /// Whether every file is sealed (always, for a manifest's transfer):
    /// only then may it finish.
    pub fn is_sealed(&self) -> bool {
        self.draft
            .as_ref()
            .is_none_or(|d| d.lock().unwrap().is_sealed_all())
    }

    /// Whether a complete `file` may be placed now.
    pub(super) fn may_place(&self, file: u32) -> bool {
        self.draft
            .as_ref()
            .is_none_or(|d| d.lock().unwrap().draft.is_sealed(file))
    }

    /// Whether `expected` is still the announced hash of `chunk` (a draft's
    /// file may have been withdrawn while its chunk was being written).
    pub(super) fn still_expected(&self, chunk: u64, expected: Hash) -> bool {
        self.draft
            .as_ref()
            .is_none_or(|d| d.lock().unwrap().expected(chunk) == Some(expected))
    }

    /// Applies one event from the source, reading back staged candidates
    /// and placing sealed files as it goes (blocking I/O).
    pub fn apply_draft(&self, ev: &DraftEvent) -> Result<Vec<DraftChange>, ChunkError> {
        let part = self.draft.as_ref().ok_or_else(|| {
            ChunkError::Refused(StoreError::Invalid(
                "a draft event for a transfer of a complete manifest".into(),
            ))
        })?;
        let file = event_file(ev);
        let applied = part.lock().unwrap().draft.apply(ev).map_err(|e| {
            ChunkError::Refused(StoreError::Invalid(format!("the source's draft: {e}")))
        })?;
        let refused = ChunkError::Refused;
        match applied {
            Applied::Stale => Ok(vec![DraftChange::Stale]),
            Applied::Sealed(file) => {
                let _recording = self.recording[file as usize].lock().unwrap();
                let complete = {
                    let st = self.state.lock().unwrap();
                    st.remaining[file as usize] == 0 && !st.done[file as usize]
                };
                if complete && self.map_file(file).size > 0 {
                    self.place_file(file).map_err(refused)?;
                }
                Ok(vec![DraftChange::Sealed(file)])
            }
            Applied::Withdrawn(file, chunks) => {
                if part.lock().unwrap().on_trust[file as usize].is_some() {
                    // Its placed copy was verified once; the next
                    // generation's hashes are compared with it.
                    return Ok(Vec::new());
                }
                self.forget(file, chunks.clone());
                let _ = self.fs.remove_file(&self.data_rel(file));
                Ok(vec![DraftChange::Dropped(chunks)])
            }
            Applied::Hashed(chunks) => {
                let mut out = Vec::new();
                if let DraftEvent::Hashed { first, hashes, .. } = ev {
                    let differs = {
                        let mut p = part.lock().unwrap();
                        let trust = &mut p.on_trust[file as usize];
                        let differs = trust.as_ref().is_some_and(|rec| {
                            hashes
                                .iter()
                                .enumerate()
                                .any(|(i, h)| rec.get(*first as usize + i) != Some(h))
                        });
                        if differs {
                            *trust = None;
                        }
                        differs
                    };
                    if differs {
                        let all = self.map.file_range(file);
                        self.forget(file, all.clone());
                        let path = self.map_file(file).path.clone();
                        self.state.lock().unwrap().stamps.remove(&path);
                        out.push(DraftChange::Dropped(all));
                    }
                }
                let adopted = self.adopt(file, chunks.clone())?;
                out.push(DraftChange::Hashed { chunks, adopted });
                Ok(out)
            }
        }
    }

    /// Forgets every chunk of `file` in `chunks`: not held, not a candidate.
    fn forget(&self, file: u32, chunks: Range<u64>) {
        let _recording = self.recording[file as usize].lock().unwrap();
        if let Some(d) = &self.draft {
            let mut d = d.lock().unwrap();
            for c in chunks.clone() {
                d.candidates.remove(c);
            }
        }
        let mut st = self.state.lock().unwrap();
        for c in chunks {
            if st.held.contains(c) {
                st.held.remove(c);
                st.remaining[file as usize] += 1;
            }
        }
        st.done[file as usize] = false;
        drop(st);
        self.handles[file as usize].lock().unwrap().take();
        // Bytes fed to the blob's check may be among the forgotten: it
        // starts over, from what is still held.
        let mut check = self.in_order[file as usize].lock().unwrap();
        if let Some(at) = check.as_mut() {
            *at = InOrder::new(at.hasher.want(), self.map_file(file).size);
        }
    }

    /// Reads back the staged candidates among `chunks` (now announced) and
    /// holds those that match; places the file if that completed it and it
    /// is sealed.
    fn adopt(&self, file: u32, chunks: Range<u64>) -> Result<Vec<u64>, ChunkError> {
        let Some(part) = &self.draft else {
            return Ok(Vec::new());
        };
        let todo: Vec<(u64, Hash)> = {
            let p = part.lock().unwrap();
            chunks
                .filter(|&c| p.candidates.contains(c))
                .filter_map(|c| p.expected(c).map(|h| (c, h)))
                .collect()
        };
        if todo.is_empty() {
            return Ok(Vec::new());
        }
        let staged = self.fs.open_read(&self.data_rel(file)).ok();
        let mut adopted = Vec::new();
        let mut buf = Vec::new();
        let count = self.map.file_range(file).count() as u64;
        for (c, expected) in todo {
            part.lock().unwrap().candidates.remove(c);
            let Some(f) = &staged else { continue };
            let id = self.map.id(c);
            buf.resize(self.map.chunk_len(id) as usize, 0);
            if f.read_exact_at(&mut buf, self.map.offset(id)).is_err()
                || hash::hash_chunk(&buf, id.index as u64, count, self.manifest.chunk_size)
                    != expected
            {
                continue;
            }
            let _recording = self.recording[file as usize].lock().unwrap();
            let complete = {
                let mut st = self.state.lock().unwrap();
                if !st.held.insert(c) {
                    continue;
                }
                st.remaining[file as usize] -= 1;
                st.remaining[file as usize] == 0
            };
            adopted.push(c);
            if complete && self.may_place(file) {
                self.place_file(file).map_err(ChunkError::Refused)?;
            }
        }
        Ok(adopted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, Written};
    use xfer_proto::manifest::ChunkId;
    use xfer_proto::names::ModelName;
    use xfer_proto::relpath::RelPath;

    const CS: u64 = hash::MIN_CHUNK_SIZE;

    /// A store, and a draft of one 3-chunk file `blobs/w` whose bytes are
    /// `data`, with the chunk hashes the source would announce.
    fn setup() -> (tempfile::TempDir, Store, Draft, Vec<u8>, Vec<Hash>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let data: Vec<u8> = (0..3 * CS as usize - 7)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let hashes = data
            .chunks(CS as usize)
            .enumerate()
            .map(|(i, c)| hash::hash_chunk(c, i as u64, 3, CS))
            .collect();
        let draft = Draft::new(
            CS,
            vec![(RelPath::new("blobs/w").unwrap(), data.len() as u64)],
        )
        .unwrap();
        (dir, store, draft, data, hashes)
    }

    fn name() -> ModelName {
        ModelName::new("m").unwrap()
    }

    fn hashed(first: u32, hashes: &[Hash], generation: u32) -> DraftEvent {
        DraftEvent::Hashed {
            file: 0,
            generation,
            first,
            hashes: hashes.to_vec(),
        }
    }

    fn part(data: &[u8], i: u32) -> &[u8] {
        let s = i as usize * CS as usize;
        &data[s..(s + CS as usize).min(data.len())]
    }

    fn id(index: u32) -> ChunkId {
        ChunkId { file: 0, index }
    }

    #[test]
    fn a_chunk_waits_for_its_hash_and_a_complete_file_for_its_seal() {
        let (dir, store, draft, data, hashes) = setup();
        let key = draft.id("c");
        let t = store.begin_draft(&name(), key, draft).unwrap();
        assert!(matches!(
            t.write_chunk(id(0), part(&data, 0)),
            Err(ChunkError::Unannounced(_))
        ));
        t.apply_draft(&hashed(0, &hashes, 0)).unwrap();
        // A chunk that does not match what was announced is still corrupt.
        assert!(matches!(
            t.write_chunk(id(1), part(&data, 0)),
            Err(ChunkError::Corrupt(_))
        ));
        for i in 0..3 {
            assert_eq!(
                t.write_chunk(id(i), part(&data, i)).unwrap(),
                Written::Stored
            );
        }
        let placed = dir.path().join("m/blobs/w");
        assert!(
            t.is_complete() && !placed.exists(),
            "complete, but not sealed"
        );
        let seal = DraftEvent::Sealed {
            file: 0,
            generation: 0,
        };
        assert_eq!(t.apply_draft(&seal).unwrap(), vec![DraftChange::Sealed(0)]);
        assert_eq!(std::fs::read(&placed).unwrap(), data, "placed at the seal");
        assert!(t.is_sealed());
        let root = t.finish().unwrap();
        let rec = store.record(&name()).unwrap();
        assert_eq!(
            rec.manifest.root, root,
            "the record is of the sealed manifest"
        );
    }

    /// A snapshot's link appears with its blob, not before and not at the
    /// end; the complete record keeps the draft's id, and a later manifest
    /// (the pull's final round) that keeps every file and link keeps it too,
    /// while one that drops a link does not.
    #[test]
    fn a_link_is_placed_with_its_file_and_the_draft_is_kept_by_a_superset() {
        let (dir, store, draft, data, hashes) = setup();
        let link = RelPath::new("snapshots/c1/w.safetensors").unwrap();
        let draft = draft
            .with_links(vec![(link.clone(), "../../blobs/w".into())])
            .unwrap();
        let key = draft.id("c1");
        let t = store.begin_draft(&name(), key, draft).unwrap();
        let at = dir.path().join("m/snapshots/c1/w.safetensors");
        assert_eq!(
            t.pending(),
            vec![RelPath::new("blobs/w").unwrap(), link.clone()]
        );
        assert_eq!(t.draft_lineage(), Some(key));
        t.apply_draft(&hashed(0, &hashes, 0)).unwrap();
        for i in 0..3 {
            t.write_chunk(id(i), part(&data, i)).unwrap();
        }
        assert!(
            std::fs::symlink_metadata(&at).is_err(),
            "no link before the seal"
        );
        t.apply_draft(&DraftEvent::Sealed {
            file: 0,
            generation: 0,
        })
        .unwrap();
        assert_eq!(
            std::fs::read(&at).unwrap(),
            data,
            "the link leads to the placed blob"
        );
        assert!(t.pending().is_empty());
        t.finish().unwrap();
        drop(t);
        let rec = store.record(&name()).unwrap();
        assert_eq!(rec.draft, Some(key));

        // The final round: the same blob and link, plus a ref.
        std::fs::create_dir_all(dir.path().join("src/blobs")).unwrap();
        std::fs::create_dir_all(dir.path().join("src/snapshots/c1")).unwrap();
        std::fs::create_dir_all(dir.path().join("src/refs")).unwrap();
        std::fs::write(dir.path().join("src/blobs/w"), &data).unwrap();
        std::fs::write(dir.path().join("src/refs/main"), b"c1").unwrap();
        std::os::unix::fs::symlink(
            "../../blobs/w",
            dir.path().join("src/snapshots/c1/w.safetensors"),
        )
        .unwrap();
        let full = crate::store::scan::scan(&dir.path().join("src"), CS, &|_| {})
            .unwrap()
            .manifest;
        let t = store
            .begin(&name(), std::sync::Arc::new(full.clone()))
            .unwrap();
        assert_eq!(t.draft_lineage(), Some(key), "every file and link kept");
        assert_eq!(t.pending(), vec![RelPath::new("refs/main").unwrap()]);
        drop(t);
        // A manifest without the link does not vouch for the draft.
        let mut less = full;
        less.entries.retain(|e| e.path() != &link);
        let t = store.begin(&name(), std::sync::Arc::new(less)).unwrap();
        assert_eq!(t.draft_lineage(), None);
    }

    /// A Hub-named draft's blob is checked against its name as its chunks
    /// land: a withdrawal after bad bytes were fed starts the check over
    /// (without that, the good file would be refused), and a file whose
    /// announced bytes are not its name's is refused at its seal.
    #[test]
    fn a_hub_blob_of_a_draft_is_checked_as_it_lands_and_a_withdrawal_starts_the_check_over() {
        use sha2::Digest as _;
        let (dir, store, _, data, hashes) = setup();
        let hub = ModelName::new("models--o--m").unwrap();
        let blob = format!("blobs/{}", hex::encode(sha2::Sha256::digest(&data)));
        let draft =
            Draft::new(CS, vec![(RelPath::new(&blob).unwrap(), data.len() as u64)]).unwrap();
        let t = store
            .begin_draft(&hub, draft.id("c"), draft.clone())
            .unwrap();
        let mut bad = data.clone();
        bad[CS as usize] ^= 0xff;
        let bad_hash = hash::hash_chunk(part(&bad, 1), 1, 3, CS);
        t.apply_draft(&hashed(0, &[hashes[0], bad_hash], 0))
            .unwrap();
        t.write_chunk(id(0), part(&data, 0)).unwrap();
        t.write_chunk(id(1), part(&bad, 1)).unwrap();
        t.apply_draft(&DraftEvent::Withdrawn {
            file: 0,
            generation: 0,
        })
        .unwrap();
        t.apply_draft(&hashed(0, &hashes, 1)).unwrap();
        for i in [2, 0, 1] {
            t.write_chunk(id(i), part(&data, i)).unwrap();
        }
        t.apply_draft(&DraftEvent::Sealed {
            file: 0,
            generation: 1,
        })
        .unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("models--o--m").join(&blob)).unwrap(),
            data
        );
        t.finish().unwrap();
        drop(t);

        // Bytes whose chunks match what the source announced, but not the
        // blob's name.
        let other = ModelName::new("models--o--n").unwrap();
        let t = store.begin_draft(&other, draft.id("d"), draft).unwrap();
        let lie: Vec<Hash> = (0..3)
            .map(|i| hash::hash_chunk(part(&bad, i), i as u64, 3, CS))
            .collect();
        t.apply_draft(&hashed(0, &lie, 0)).unwrap();
        for i in 0..3 {
            t.write_chunk(id(i), part(&bad, i)).unwrap();
        }
        let refused = t.apply_draft(&DraftEvent::Sealed {
            file: 0,
            generation: 0,
        });
        let why = format!("{:?}", refused.expect_err("a lying blob is refused"));
        assert!(why.contains("not to its name"), "{why}");
        assert!(!dir.path().join("models--o--n").join(&blob).exists());
    }

    #[test]
    fn a_withdrawal_forgets_staged_chunks_and_a_resume_rechecks_what_the_journal_holds() {
        let (dir, store, draft, data, hashes) = setup();
        let key = draft.id("c");
        {
            let t = store.begin_draft(&name(), key, draft.clone()).unwrap();
            // Generation 0 announced other bytes for chunk 2 (a bad download).
            let mut bad = data.clone();
            bad[2 * CS as usize] ^= 0xff;
            let bad_hash = hash::hash_chunk(part(&bad, 2), 2, 3, CS);
            t.apply_draft(&hashed(0, &[hashes[0], hashes[1], bad_hash], 0))
                .unwrap();
            t.write_chunk(id(0), part(&data, 0)).unwrap();
            t.write_chunk(id(2), part(&bad, 2)).unwrap();
            let out = t
                .apply_draft(&DraftEvent::Withdrawn {
                    file: 0,
                    generation: 0,
                })
                .unwrap();
            assert_eq!(out, vec![DraftChange::Dropped(0..3)]);
            assert_eq!(
                t.held().count(),
                0,
                "nothing of the withdrawn download counts"
            );
            // Generation 1 stages the good chunk 0 again, and chunk 1.
            t.apply_draft(&hashed(0, &hashes[..2], 1)).unwrap();
            t.write_chunk(id(0), part(&data, 0)).unwrap();
            t.write_chunk(id(1), part(&data, 1)).unwrap();
            t.commit().unwrap();
            // The agent dies here: the journal still records the bad chunk 2.
        }
        let t = store.begin_draft(&name(), key, draft).unwrap();
        assert_eq!(
            t.held().count(),
            0,
            "journaled chunks are candidates until announced"
        );
        // The resumed source announces generation 0 afresh (its own restart).
        let out = t.apply_draft(&hashed(0, &hashes, 0)).unwrap();
        assert_eq!(
            out,
            vec![DraftChange::Hashed {
                chunks: 0..3,
                adopted: vec![0, 1]
            }],
            "the good staged chunks are kept; the stale bad chunk 2 is not"
        );
        t.write_chunk(id(2), part(&data, 2)).unwrap();
        t.apply_draft(&DraftEvent::Sealed {
            file: 0,
            generation: 0,
        })
        .unwrap();
        assert_eq!(std::fs::read(dir.path().join("m/blobs/w")).unwrap(), data);
    }

    #[test]
    fn an_inconsistent_source_is_refused_naming_the_cause() {
        let (_dir, store, draft, _data, hashes) = setup();
        let t = store.begin_draft(&name(), draft.id("c"), draft).unwrap();
        t.apply_draft(&hashed(0, &hashes[..1], 0)).unwrap();
        let e = t.apply_draft(&hashed(0, &hashes[1..2], 0)).unwrap_err();
        assert!(e.to_string().contains("announced with another hash"), "{e}");
        let e = t
            .apply_draft(&DraftEvent::Sealed {
                file: 0,
                generation: 0,
            })
            .unwrap_err();
        assert!(e.to_string().contains("not yet announced"), "{e}");
        assert!(t.finish().is_err(), "an unsealed draft cannot finish");
    }
}
