//! Bytes this node fetched from the origin itself, as an intake node of a
//! striped pull (issue 36), kept in its own transfer of the same draft:
//! the swarm then need not send them back to it.
//!
//! Nothing written here is trusted. A chunk a range covers whole becomes a
//! *candidate* of the draft, like a chunk a resumed journal names: it is
//! read back and checked against the hash the source announces for it
//! ([`Transfer::apply_draft`]) and only then held; until then the
//! scheduler fetches nothing for it, and once announced a chunk that did
//! not check out is fetched as any other.
//!
//! Nothing verified is overwritten: bytes are written only into chunks the
//! source has not announced yet (so no verified write of them can be under
//! way), that this node does not hold and that are no candidate already,
//! while the transfer still holds its staging lock (a later transfer of
//! the same name, which may hold these chunks, cannot have begun). The
//! piece that completes a chunk goes out to the source only after the
//! chunk is written here, so the source cannot announce a chunk before it
//! is a candidate. Pieces are gathered (at most [`GATHER`] bytes) and
//! written at each chunk's end, not one small write per piece.

use std::sync::Arc;

use super::{StoreError, Transfer};

/// Most bytes a [`Fetched`] gathers before it writes them.
pub const GATHER: usize = 1 << 20;

/// A writer of one range's bytes into its file's staging, in order.
#[derive(Debug)]
pub struct Fetched {
    transfer: Arc<Transfer>,
    file: u32,
    /// The file offset of the next byte.
    at: u64,
    /// Bytes gathered, not written yet: they end at `at`.
    gathered: Vec<u8>,
    /// Every byte from here up to `at` was written by this writer.
    whole_from: u64,
    /// Chunks made candidates.
    kept: u64,
}

impl Transfer {
    /// The size of the draft's file `file`, when this transfer receives a
    /// draft that lists it.
    pub fn draft_file_size(&self, file: u32) -> Option<u64> {
        self.draft.as_ref()?;
        ((file as usize) < self.file_entries.len()).then(|| self.map_file(file).size)
    }

    /// A writer of `file`'s bytes from `from` on: `None` unless this is a
    /// draft transfer with that file, `from` inside it.
    pub fn keep_fetched(self: &Arc<Self>, file: u32, from: u64) -> Option<Fetched> {
        self.draft.as_ref()?;
        if file as usize >= self.file_entries.len() || from >= self.map_file(file).size {
            return None;
        }
        let cs = self.manifest.chunk_size;
        Some(Fetched {
            transfer: self.clone(),
            file,
            at: from,
            gathered: Vec::new(),
            whole_from: from.div_ceil(cs) * cs,
            kept: 0,
        })
    }
}

/// Why a [`Fetched`] stopped keeping: the relay goes on regardless.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    /// The transfer ended; a later one may hold these chunks.
    #[error("the transfer ended")]
    Ended,
    /// Writing the staging file failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Fetched {
    /// Takes `data`, the range's next bytes (past the file's end ignored),
    /// and writes what it gathered once it reaches a chunk's end or
    /// [`GATHER`] bytes: a chunk is written, and a candidate, before this
    /// returns for the piece that completes it. A half-gathered chunk
    /// when the range ends is not written (it could not be a candidate).
    pub fn write(&mut self, data: &[u8]) -> Result<(), KeepError> {
        let size = self.transfer.map_file(self.file).size;
        let take = data.len().min(size.saturating_sub(self.at) as usize);
        if take == 0 {
            return Ok(());
        }
        self.gathered.extend_from_slice(&data[..take]);
        self.at += take as u64;
        let cs = self.transfer.manifest.chunk_size;
        let start = self.at - self.gathered.len() as u64;
        let chunk_end = if self.at == size {
            size
        } else {
            self.at / cs * cs
        };
        if chunk_end > start {
            self.flush(start, (chunk_end - start) as usize)?;
        }
        if self.gathered.len() >= GATHER {
            self.flush(self.at - self.gathered.len() as u64, self.gathered.len())?;
        }
        Ok(())
    }

    /// Writes the first `n` gathered bytes (at file offset `offset`) and
    /// keeps the rest, in the same buffer: its capacity stays, so a byte is
    /// copied once on its way in, not again each time the buffer regrows.
    fn flush(&mut self, offset: u64, n: usize) -> Result<(), KeepError> {
        let mut buf = std::mem::take(&mut self.gathered);
        let written = self.put(offset, &buf[..n]);
        buf.drain(..n);
        self.gathered = buf;
        written
    }

    /// Writes `data` at `offset` where no announced, held or candidate
    /// chunk lies, and makes each chunk it completes whole a candidate.
    fn put(&mut self, offset: u64, data: &[u8]) -> Result<(), KeepError> {
        let t = &self.transfer;
        let size = t.map_file(self.file).size;
        let end = offset + data.len() as u64;
        let cs = t.manifest.chunk_size;
        let base = t.map.file_range(self.file).start;
        let (first, last) = (offset / cs, (end - 1) / cs);
        let Some(draft) = &t.draft else {
            return Ok(());
        };
        let _recording = t.recording[self.file as usize].lock().unwrap();
        let live = t.lock.lock().unwrap();
        if live.is_none() {
            return Err(KeepError::Ended);
        }
        let mut part = draft.lock().unwrap();
        let free = {
            let st = t.state.lock().unwrap();
            (first..=last).all(|i| {
                let n = base + i;
                part.expected(n).is_none() && !part.is_candidate(n) && !st.held.contains(n)
            })
        };
        if free {
            let f = t.handle(self.file)?;
            f.write_at(data, offset)
                .map_err(|e| t.disk_refusal(&t.data_path(self.file), e, data.len() as u64))?;
            for i in first..=last {
                let chunk_end = ((i + 1) * cs).min(size);
                if i * cs >= self.whole_from && chunk_end <= end {
                    part.add_candidate(base + i);
                    self.kept += 1;
                }
            }
        } else {
            // The chunks it touches are not this writer's to complete.
            self.whole_from = (last + 1) * cs;
        }
        Ok(())
    }

    /// Chunks made candidates so far.
    pub fn kept(&self) -> u64 {
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use xfer_proto::draft::{Draft, DraftEvent};
    use xfer_proto::hash;
    use xfer_proto::names::ModelName;
    use xfer_proto::relpath::RelPath;

    const CS: u64 = hash::MIN_CHUNK_SIZE;

    fn bytes(n: u64, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn hashes(data: &[u8]) -> Vec<hash::Hash> {
        let count = data.len().div_ceil(CS as usize) as u64;
        data.chunks(CS as usize)
            .enumerate()
            .map(|(i, c)| hash::hash_chunk(c, i as u64, count, CS))
            .collect()
    }

    fn transfer(dir: &std::path::Path, size: u64) -> (Arc<Transfer>, Draft) {
        let store = Store::open(dir).unwrap();
        let draft = Draft::new(CS, vec![(RelPath::new("w.bin").unwrap(), size)]).unwrap();
        let name = ModelName::new("m").unwrap();
        let t = store
            .begin_draft(&name, draft.id("test"), draft.clone())
            .unwrap();
        (Arc::new(t), draft)
    }

    fn announce(t: &Transfer, d: &Draft, first: u64, hashes: &[hash::Hash]) -> Vec<u64> {
        let ev = DraftEvent::Hashed {
            generation: d.generation(0).unwrap(),
            file: 0,
            first: first as u32,
            hashes: hashes.to_vec(),
        };
        match t.apply_draft(&ev).unwrap().pop() {
            Some(crate::store::DraftChange::Hashed { adopted, .. }) => adopted,
            other => panic!("{other:?}"),
        }
    }

    /// A range that starts mid-chunk and ends at the file's end, in odd
    /// pieces: the chunks it covers whole are adopted when announced, the
    /// first (half covered) is not, and nothing is held before its hash
    /// is announced.
    #[test]
    fn the_chunks_a_range_covers_whole_are_adopted_once_announced() {
        let dir = tempfile::tempdir().unwrap();
        let size = 5 * CS + 100;
        let (t, d) = transfer(dir.path(), size);
        let data = bytes(size, 7);
        let from = CS / 2;
        let mut w = t.keep_fetched(0, from).unwrap();
        for piece in data[from as usize..].chunks(10_000) {
            w.write(piece).unwrap();
        }
        assert_eq!(w.kept(), 5, "chunks 1..=5 are whole");
        assert_eq!(t.held().count(), 0, "nothing held before it is announced");
        let adopted = announce(&t, &d, 0, &hashes(&data));
        assert_eq!(adopted, vec![1, 2, 3, 4, 5]);
        assert!(!t.held().contains(0));
    }

    /// Bytes that differ from what the source announces (a lying or
    /// unlucky intake): never held.
    #[test]
    fn kept_bytes_that_differ_from_the_announced_hash_are_not_held() {
        let dir = tempfile::tempdir().unwrap();
        let size = 2 * CS;
        let (t, d) = transfer(dir.path(), size);
        let mut bad = bytes(size, 1);
        bad[10] ^= 0xFF;
        let mut w = t.keep_fetched(0, 0).unwrap();
        w.write(&bad).unwrap();
        assert_eq!(w.kept(), 2);
        let adopted = announce(&t, &d, 0, &hashes(&bytes(size, 1)));
        assert_eq!(adopted, vec![1], "only the intact chunk");
    }

    /// A chunk already announced (or held) is never written: a verified
    /// write of it may be under way, and the held bytes stay as verified.
    #[test]
    fn an_announced_or_held_chunk_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let size = 3 * CS;
        let (t, d) = transfer(dir.path(), size);
        let good = bytes(size, 3);
        let h = hashes(&good);
        announce(&t, &d, 0, &h[..1]);
        let id = t.map().id(0);
        t.write_chunk(id, &good[..CS as usize]).unwrap();
        let mut w = t.keep_fetched(0, 0).unwrap();
        // Wrong bytes over a held chunk and the start of the next.
        w.write(&vec![0xAA; CS as usize + 10]).unwrap();
        w.write(&good[CS as usize + 10..]).unwrap();
        // Chunk 0 is skipped; 1 and 2 are written whole (1 with 10 wrong
        // bytes, so its hash will not match).
        assert_eq!(w.kept(), 2, "chunks 1 and 2 were written whole");
        let (f, _) = t.open_held(id).unwrap();
        let mut back = vec![0; CS as usize];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
        assert_eq!(back, good[..CS as usize], "the held chunk is as verified");
        assert_eq!(
            announce(&t, &d, 1, &h[1..]),
            vec![2],
            "the wrong chunk 1 is not held"
        );
    }

    /// Once the transfer ended (its staging lock released), nothing is
    /// written: a later transfer of the name may hold these chunks.
    #[test]
    fn an_ended_transfer_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (t, _) = transfer(dir.path(), 2 * CS);
        let mut w = t.keep_fetched(0, 0).unwrap();
        t.release();
        assert!(matches!(w.write(&bytes(2 * CS, 0)), Err(KeepError::Ended)));
        assert_eq!(w.kept(), 0);
        assert!(t.keep_fetched(1, 0).is_none(), "no such file");
        assert!(t.keep_fetched(0, 2 * CS).is_none(), "past its end");
    }
}
