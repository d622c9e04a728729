//! Sets of chunks across a whole manifest, as compact bitsets.
//!
//! Chunks are numbered globally, file after file; [`ChunkMap`] converts
//! between that number and a [`ChunkId`]. A [`ChunkSet`] is what a node holds
//! or still needs, and is what peers will exchange as their bitfield.

use serde::{Deserialize, Serialize};

use crate::manifest::{ChunkId, Manifest};

/// Maps [`ChunkId`]s of one manifest to global chunk numbers and back.
#[derive(Debug, Clone)]
pub struct ChunkMap {
    /// First global number of each file; one extra entry holds the total.
    starts: Vec<u64>,
    chunk_size: u64,
    sizes: Vec<u64>,
}

impl ChunkMap {
    /// The map of `manifest`'s chunks, in file order.
    pub fn new(manifest: &Manifest) -> Self {
        let mut starts = Vec::new();
        let mut sizes = Vec::new();
        let mut n = 0u64;
        for f in manifest.files() {
            starts.push(n);
            sizes.push(f.size);
            n += f.chunks.len() as u64;
        }
        starts.push(n);
        ChunkMap {
            starts,
            chunk_size: manifest.chunk_size,
            sizes,
        }
    }

    /// Number of chunks in the manifest.
    pub fn len(&self) -> u64 {
        *self.starts.last().unwrap_or(&0)
    }

    /// Whether the manifest has no chunk.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of files in the manifest.
    pub fn files(&self) -> usize {
        self.sizes.len()
    }

    /// The manifest's chunk size: the length of every chunk but each
    /// file's last.
    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Global number of a chunk, or `None` if the id is out of range.
    pub fn number(&self, id: ChunkId) -> Option<u64> {
        let f = id.file as usize;
        let start = *self.starts.get(f)?;
        let end = *self.starts.get(f + 1)?;
        let n = start + id.index as u64;
        (n < end).then_some(n)
    }

    /// The chunk with a global number.
    pub fn id(&self, n: u64) -> ChunkId {
        let file = self.starts.partition_point(|&s| s <= n) - 1;
        ChunkId {
            file: file as u32,
            index: (n - self.starts[file]) as u32,
        }
    }

    /// Chunks of one file, as global numbers.
    pub fn file_range(&self, file: u32) -> std::ops::Range<u64> {
        self.starts[file as usize]..self.starts[file as usize + 1]
    }

    /// Byte length of a chunk.
    pub fn chunk_len(&self, id: ChunkId) -> u64 {
        let start = id.index as u64 * self.chunk_size;
        self.chunk_size
            .min(self.sizes[id.file as usize].saturating_sub(start))
    }

    /// Byte offset of a chunk within its file.
    pub fn offset(&self, id: ChunkId) -> u64 {
        id.index as u64 * self.chunk_size
    }
}

/// A set of global chunk numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkSet {
    len: u64,
    words: Vec<u64>,
}

impl ChunkSet {
    /// A set of none of `len` chunks.
    pub fn empty(len: u64) -> Self {
        ChunkSet {
            len,
            words: vec![0; len.div_ceil(64) as usize],
        }
    }

    /// A set of all of `len` chunks.
    pub fn full(len: u64) -> Self {
        let mut s = Self::empty(len);
        for n in 0..len {
            s.insert(n);
        }
        s
    }

    /// Capacity: the manifest's chunk count.
    pub fn capacity(&self) -> u64 {
        self.len
    }

    /// Whether chunk `n` is in the set.
    pub fn contains(&self, n: u64) -> bool {
        n < self.len && self.words[(n / 64) as usize] & (1 << (n % 64)) != 0
    }

    /// Adds a chunk; returns whether it was new.
    pub fn insert(&mut self, n: u64) -> bool {
        assert!(n < self.len, "chunk {n} out of range {}", self.len);
        let w = &mut self.words[(n / 64) as usize];
        let bit = 1 << (n % 64);
        let new = *w & bit == 0;
        *w |= bit;
        new
    }

    /// Takes chunk `n` out of the set.
    pub fn remove(&mut self, n: u64) {
        if n < self.len {
            self.words[(n / 64) as usize] &= !(1 << (n % 64));
        }
    }

    /// Number of chunks in the set.
    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// Whether every chunk is in the set.
    pub fn is_complete(&self) -> bool {
        self.count() == self.len
    }

    /// The chunk numbers in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len).filter(|&n| self.contains(n))
    }

    /// Whether a set received from a peer fits this manifest (no stray bits).
    pub fn is_well_formed(&self) -> bool {
        self.words.len() as u64 == self.len.div_ceil(64)
            && (self.len % 64 == 0 || self.words.last().is_none_or(|w| w >> (self.len % 64) == 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::tests::file;
    use crate::manifest::MANIFEST_VERSION;

    #[test]
    fn numbers_and_ids_round_trip() {
        let cs = crate::hash::MIN_CHUNK_SIZE;
        let m = Manifest {
            version: MANIFEST_VERSION,
            chunk_size: cs,
            entries: vec![
                file("a", &[1u8; (3 * crate::hash::MIN_CHUNK_SIZE) as usize], cs),
                file("b", b"", cs),
                file("c", &[2u8; 10], cs),
            ],
        };
        let map = ChunkMap::new(&m);
        assert_eq!(map.len(), 4);
        for n in 0..4 {
            assert_eq!(map.number(map.id(n)), Some(n));
        }
        assert_eq!(map.id(3), ChunkId { file: 2, index: 0 });
        assert_eq!(map.number(ChunkId { file: 1, index: 0 }), None);
        assert_eq!(map.number(ChunkId { file: 9, index: 0 }), None);
        assert_eq!(map.chunk_len(ChunkId { file: 2, index: 0 }), 10);
        assert_eq!(map.file_range(0), 0..3);
    }

    #[test]
    fn set_operations() {
        let mut s = ChunkSet::empty(130);
        assert!(s.insert(129));
        assert!(!s.insert(129));
        s.insert(0);
        assert_eq!(s.count(), 2);
        assert_eq!(s.iter().collect::<Vec<_>>(), [0, 129]);
        s.remove(0);
        assert!(!s.contains(0));
        assert!(s.is_well_formed());
        assert!(ChunkSet::full(130).is_complete());
        let forged = ChunkSet {
            len: 3,
            words: vec![u64::MAX],
        };
        assert!(!forged.is_well_formed());
    }
}
