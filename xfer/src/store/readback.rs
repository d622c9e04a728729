//! Reading back what a transfer placed before it was interrupted.
//!
//! A journal says a file was placed (`FileDone`, or every chunk recorded
//! and the staging file gone), but not that the final file still holds
//! those bytes: another transfer may have written over it since, or a peer
//! that chose the same draft id may have placed it. So such a file counts
//! as held only once its chunks are hashed again here and match the
//! manifest being received (for a draft: the hashes the source announces).

use std::path::Path;

use crate::store::scan::{hash_chunks_of, hash_jobs};
use crate::util::beneath::Root;
use xfer_proto::hash::Hash;

/// The BLAKE3 chunk hashes of the regular file `rel` (beneath `fs`, never
/// through a symlink) if it is exactly `size` bytes; `None` if it is
/// missing, another size or unreadable. Hashed in spans on every core, as
/// `xfer manifest` hashes a tree.
pub(super) fn chunk_hashes(fs: &Root, rel: &Path, size: u64, chunk_size: u64) -> Option<Vec<Hash>> {
    use rayon::prelude::*;
    let f = fs.open_read(rel).ok()?;
    let meta = f.metadata().ok()?;
    if !meta.is_file() || meta.len() != size {
        return None;
    }
    let shown = fs.show(rel);
    let spans: Vec<(u64, u64)> = hash_jobs(size, chunk_size).collect();
    let parts: Vec<Vec<Hash>> = spans
        .into_par_iter()
        .map(|(first, n)| hash_chunks_of(&f, &shown, size, first, n, chunk_size).ok())
        .collect::<Option<_>>()?;
    Some(parts.into_iter().flatten().collect())
}

/// The key a draft's journal is opened under: its id, in a namespace of
/// its own, so no draft id a peer picks can equal a manifest's root and
/// resume that manifest's transfer from chunks the draft wrote.
pub(super) fn draft_journal_key(id: &Hash) -> Hash {
    Hash(blake3::derive_key("xfer 2026-12 draft journal", &id.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::hash;

    #[test]
    fn hashes_match_the_manifest_and_wrong_sizes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fs = Root::open(dir.path()).unwrap();
        let cs = hash::MIN_CHUNK_SIZE;
        let data: Vec<u8> = (0..(2 * cs + 17) as usize).map(|i| i as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let entry = xfer_proto::manifest::file("f", &data, cs);
        let xfer_proto::manifest::Entry::File(f) = entry else {
            unreachable!()
        };
        let got = chunk_hashes(&fs, Path::new("f"), data.len() as u64, cs).unwrap();
        assert_eq!(got, f.chunks);
        assert!(chunk_hashes(&fs, Path::new("f"), data.len() as u64 + 1, cs).is_none());
        std::os::unix::fs::symlink("f", dir.path().join("l")).unwrap();
        assert!(
            chunk_hashes(&fs, Path::new("l"), data.len() as u64, cs).is_none(),
            "never through a symlink"
        );
    }

    #[test]
    fn a_draft_key_never_equals_the_id_it_comes_from() {
        let id = Hash([9; 32]);
        assert_ne!(draft_journal_key(&id), id);
    }
}
