//! A registry blob fanned out while it downloads: the fetch's growing
//! partial file ([`BlobWatch`]) becomes a one-file draft ([`DraftFeed`]),
//! each chunk's BLAKE3 hash announced as soon as the chunk is whole, the
//! blob sealed once it hashed to its registry digest, and withdrawn when
//! the fetch starts over (a corrupt whole, an overlong file). The stream of
//! the draft ([`crate::flow::stream`]) serves the chunks from the partial
//! file, then from the blob's place in the cache. Nothing is placed on a
//! node before the seal, and each node checks every chunk's hash.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use xfer_proto::draft::{Draft, DraftError, DraftEvent};
use xfer_proto::hash::{chunk_count, hash_chunk, Hash};
use xfer_proto::image::{Digest, BLOB_FILE};
use xfer_proto::relpath::RelPath;

use crate::flow::feed::DraftFeed;
use crate::hub::announce::DraftPaths;
use crate::image::archive;
use crate::image::registry::client::BlobWatch;

/// Chunks announced at most per event.
const PER_EVENT: u64 = 64;

/// One blob's draft (or one file of a shared draft), fed by its fetch.
pub struct LayerFeed {
    feed: Arc<DraftFeed>,
    /// The blob's file in the draft.
    file: u32,
    paths: DraftPaths,
    size: u64,
    chunk_size: u64,
    cursor: Mutex<Cursor>,
}

/// How far the announcements went.
#[derive(Default)]
struct Cursor {
    /// The fetch's try the hashes are of.
    generation: u32,
    /// Chunks announced (from the first).
    hashed: u64,
    /// An announcement failed (a read error): the stream then waits for
    /// the push after it.
    broken: bool,
    /// The file was sealed (a second seal says only whether it was).
    sealed: bool,
}

impl LayerFeed {
    /// The draft of blob `digest` of `size` bytes, fetched into the
    /// partial file `part` and placed in `cache`, at `chunk_size`.
    pub fn new(
        digest: Digest,
        size: u64,
        chunk_size: u64,
        cache: &Path,
        part: PathBuf,
    ) -> Result<LayerFeed, DraftError> {
        let file = RelPath::new(BLOB_FILE).expect("BLOB_FILE is a tree path");
        let draft = Draft::new(chunk_size, vec![(file, size)])?;
        Ok(LayerFeed::file_of(
            DraftFeed::new(draft, &digest.to_string()),
            (0, chunk_size),
            digest,
            size,
            cache,
            part,
        ))
    }

    /// File `file` of `feed`'s draft, whose chunk size is `chunk_size` (a
    /// model artifact's raw layer: one file of the model), which is blob
    /// `digest` of `size` bytes fetched into the partial file `part` and
    /// placed in `cache`.
    pub fn file_of(
        feed: Arc<DraftFeed>,
        (file, chunk_size): (u32, u64),
        digest: Digest,
        size: u64,
        cache: &Path,
        part: PathBuf,
    ) -> LayerFeed {
        LayerFeed {
            feed,
            file,
            paths: DraftPaths {
                content: archive::blob_path(cache, &digest),
                incomplete: part,
            },
            size,
            chunk_size,
            cursor: Mutex::new(Cursor::default()),
        }
    }

    /// The draft the stream offers.
    pub fn feed(&self) -> Arc<DraftFeed> {
        self.feed.clone()
    }

    /// The blob's file in the draft.
    pub fn file(&self) -> u32 {
        self.file
    }

    /// Where the stream reads the blob's bytes.
    pub fn paths(&self) -> Vec<DraftPaths> {
        vec![self.paths.clone()]
    }

    /// The blob was checked against its digest (in its place in the cache,
    /// or still in its partial file, about to move): the rest of its chunks
    /// are announced and it is sealed, once. False when an announcement
    /// failed (the push after the stream then delivers it).
    pub fn seal(&self) -> bool {
        let mut c = self.cursor.lock().unwrap();
        if c.sealed || c.broken {
            return c.sealed;
        }
        let from = match self.paths.content.exists() {
            true => &self.paths.content,
            false => &self.paths.incomplete,
        };
        // The fetch that moves it is the one that calls this, or ended.
        self.announce(&mut c, self.size, from);
        if c.broken {
            return false;
        }
        let sealed = DraftEvent::Sealed {
            file: self.file,
            generation: c.generation,
        };
        if let Err(e) = self.feed.push(sealed) {
            tracing::warn!("the seal of a layer's draft was refused: {e}");
            c.broken = true;
        }
        c.sealed = !c.broken;
        c.sealed
    }

    /// Announces the chunks whole within the first `len` bytes of `from`.
    fn announce(&self, c: &mut Cursor, len: u64, from: &Path) {
        if c.broken {
            return;
        }
        let count = chunk_count(self.size, self.chunk_size);
        let whole = if len >= self.size {
            count
        } else {
            len / self.chunk_size
        };
        if c.hashed >= whole {
            return;
        }
        let file = match std::fs::File::open(from) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("cannot read {} to announce its chunks: {e}", from.display());
                c.broken = true;
                return;
            }
        };
        let mut buf = Vec::new();
        while c.hashed < whole {
            let first = c.hashed;
            let last = whole.min(first + PER_EVENT);
            let mut hashes: Vec<Hash> = Vec::with_capacity((last - first) as usize);
            for i in first..last {
                let at = i * self.chunk_size;
                let n = (self.size - at).min(self.chunk_size) as usize;
                buf.resize(n, 0);
                if let Err(e) = file.read_exact_at(&mut buf, at) {
                    tracing::warn!("cannot read {} to announce its chunks: {e}", from.display());
                    c.broken = true;
                    return;
                }
                hashes.push(hash_chunk(&buf, i, count, self.chunk_size));
            }
            let ev = DraftEvent::Hashed {
                file: self.file,
                generation: c.generation,
                first: first as u32,
                hashes,
            };
            if let Err(e) = self.feed.push(ev) {
                tracing::warn!("a layer's chunk announcement was refused: {e}");
                c.broken = true;
                return;
            }
            c.hashed = last;
        }
    }
}

impl BlobWatch for LayerFeed {
    fn grew(&self, len: u64) {
        let mut c = self.cursor.lock().unwrap();
        self.announce(&mut c, len, &self.paths.incomplete);
    }

    /// Sealed before the blob is made durable and moved: the stream needs
    /// only its bytes, which it reads from either place.
    fn matched(&self) {
        self.seal();
    }

    fn restarted(&self) {
        let mut c = self.cursor.lock().unwrap();
        if c.broken || c.hashed == 0 {
            return;
        }
        let ev = DraftEvent::Withdrawn {
            file: self.file,
            generation: c.generation,
        };
        match self.feed.push(ev) {
            Ok(()) => {
                c.generation += 1;
                c.hashed = 0;
            }
            Err(e) => {
                tracing::warn!("a layer's withdrawal was refused: {e}");
                c.broken = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob fed in uneven steps, restarted once with other bytes, then
    /// sealed: the draft ends sealed with the hashes of the final bytes,
    /// which are those a push of the finished blob would send.
    #[test]
    fn a_restarted_fetch_is_withdrawn_and_the_seal_names_the_final_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let digest = Digest([7; 32]);
        let part = dir.path().join("x.part");
        let size = 5 * 65536 + 123;
        let lf = LayerFeed::new(digest, size, 65536, &cache, part.clone()).unwrap();
        let bad: Vec<u8> = (0..size).map(|i| (i % 7) as u8).collect();
        std::fs::write(&part, &bad[..200_000]).unwrap();
        lf.grew(200_000);
        assert_eq!(lf.cursor.lock().unwrap().hashed, 3);
        lf.restarted();
        assert_eq!(lf.cursor.lock().unwrap().generation, 1);
        let good: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        std::fs::write(&part, &good).unwrap();
        lf.grew(size);
        let content = archive::blob_path(&cache, &digest);
        std::fs::create_dir_all(content.parent().unwrap()).unwrap();
        std::fs::rename(&part, &content).unwrap();
        assert!(lf.seal());
        let m = lf.feed().manifest().expect("sealed");
        let count = chunk_count(size, 65536);
        let want: Vec<Hash> = (0..count)
            .map(|i| {
                let at = (i * 65536) as usize;
                let end = (at + 65536).min(size as usize);
                hash_chunk(&good[at..end], i, count, 65536)
            })
            .collect();
        match m.entries.as_slice() {
            [xfer_proto::manifest::Entry::File(f)] => assert_eq!(f.chunks, want),
            other => panic!("{other:?}"),
        }
    }

    /// A layer that matched its digest is sealed from its partial file,
    /// before it moves into the cache; the fetch's own seal after the move
    /// says it was, and seals nothing twice.
    #[test]
    fn a_matched_layer_is_sealed_from_its_partial_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let digest = Digest([9; 32]);
        let part = dir.path().join("y.part");
        let size = 3 * 65536 + 5;
        let lf = LayerFeed::new(digest, size, 65536, &cache, part.clone()).unwrap();
        let bytes: Vec<u8> = (0..size).map(|i| (i % 13) as u8).collect();
        std::fs::write(&part, &bytes[..65536]).unwrap();
        lf.grew(65536);
        std::fs::write(&part, &bytes).unwrap();
        lf.matched();
        assert!(lf.feed().manifest().is_some(), "sealed before the move");
        let content = archive::blob_path(&cache, &digest);
        std::fs::create_dir_all(content.parent().unwrap()).unwrap();
        std::fs::rename(&part, &content).unwrap();
        assert!(lf.seal(), "the second seal says it is sealed");
        let c = lf.cursor.lock().unwrap();
        assert!(c.sealed && !c.broken);
    }
}
