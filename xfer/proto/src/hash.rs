//! BLAKE3 content hashes and the chunk tree.
//!
//! This module owns the one hashing rule of xfer: a file is cut into
//! power-of-two chunks that line up with BLAKE3's own tree, so every chunk has
//! a *chaining value* (the hash of its subtree) and merging those values
//! bottom-up yields exactly the hash `b3sum` prints for the whole file. A
//! receiver therefore checks each chunk on arrival and gets the file hash for
//! free, without reading the file a second time.
//!
//! A file that fits in one chunk has no interior tree; its single chunk is
//! identified by the file hash itself.

use std::fmt;

use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Text that is not a 64-digit hex hash ([`Hash::from_hex`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{text}` is not a 64-digit hex BLAKE3 hash ({why})")]
pub struct HexHashError {
    /// The text as given.
    pub text: String,
    /// What the hex decoder found wrong.
    pub why: hex::FromHexError,
}

/// A 32-byte BLAKE3 output: a file hash, a chunk chaining value or a root.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    /// Lower-case hex, as `b3sum` prints it.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, HexHashError> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|e| HexHashError {
            text: s.to_string(),
            why: e,
        })?;
        Ok(Hash(out))
    }

    /// First 12 hex digits, for tables and logs.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }
}

impl From<blake3::Hash> for Hash {
    fn from(h: blake3::Hash) -> Self {
        Hash(*h.as_bytes())
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.short())
    }
}

impl Serialize for Hash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&self.to_hex())
        } else {
            self.0.serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Hash {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            let s = String::deserialize(d)?;
            Hash::from_hex(&s).map_err(serde::de::Error::custom)
        } else {
            Ok(Hash(<[u8; 32]>::deserialize(d)?))
        }
    }
}

/// Smallest chunk size a manifest may use.
pub const MIN_CHUNK_SIZE: u64 = 64 * 1024;
/// Largest chunk size a manifest may use.
pub const MAX_CHUNK_SIZE: u64 = 256 * 1024 * 1024;

/// Whether `size` is a legal chunk size: a power of two in
/// [`MIN_CHUNK_SIZE`, `MAX_CHUNK_SIZE`], so chunks are whole BLAKE3 subtrees.
pub fn is_valid_chunk_size(size: u64) -> bool {
    size.is_power_of_two() && (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&size)
}

/// Number of chunks a file of `size` bytes has. An empty file has none.
pub fn chunk_count(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size)
}

/// Hashes one chunk of a file.
///
/// `index` is the chunk's position and `chunks` the file's chunk count. For a
/// file of more than one chunk the result is the chunk's chaining value at its
/// offset; for a one-chunk file it is the file hash.
pub fn hash_chunk(data: &[u8], index: u64, chunks: u64, chunk_size: u64) -> Hash {
    if chunks <= 1 {
        return blake3::hash(data).into();
    }
    let mut hasher = blake3::Hasher::new();
    hasher.set_input_offset(index * chunk_size);
    hasher.update(data);
    Hash(hasher.finalize_non_root())
}

/// The whole-file BLAKE3 hash from the hashes of its chunks, as produced by
/// [`hash_chunk`]. Equals `blake3::hash` of the file (what `b3sum` prints).
pub fn file_hash_from_chunks(chunks: &[Hash]) -> Hash {
    match chunks {
        [] => blake3::hash(b"").into(),
        [only] => *only,
        _ => {
            let split = left_len(chunks.len());
            let left = subtree_cv(&chunks[..split]);
            let right = subtree_cv(&chunks[split..]);
            merge_subtrees_root(&left, &right, Mode::Hash).into()
        }
    }
}

fn subtree_cv(chunks: &[Hash]) -> [u8; 32] {
    if chunks.len() == 1 {
        return chunks[0].0;
    }
    let split = left_len(chunks.len());
    let left = subtree_cv(&chunks[..split]);
    let right = subtree_cv(&chunks[split..]);
    merge_subtrees_non_root(&left, &right, Mode::Hash)
}

/// BLAKE3 puts the largest power of two strictly below `n` leaves on the left.
fn left_len(n: usize) -> usize {
    debug_assert!(n > 1);
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn file_hash(bytes: &[u8], chunk_size: u64) -> Hash {
        let chunks = chunk_count(bytes.len() as u64, chunk_size);
        let hashes: Vec<Hash> = bytes
            .chunks(chunk_size as usize)
            .enumerate()
            .map(|(i, c)| hash_chunk(c, i as u64, chunks, chunk_size))
            .collect();
        file_hash_from_chunks(&hashes)
    }

    #[test]
    fn merged_chunk_hashes_equal_b3sum() {
        let cs = MIN_CHUNK_SIZE;
        for len in [
            0usize,
            1,
            1024,
            cs as usize - 1,
            cs as usize,
            cs as usize + 1,
            2 * cs as usize,
            3 * cs as usize + 17,
            5 * cs as usize,
            8 * cs as usize,
            9 * cs as usize - 1,
            13 * cs as usize + 1000,
        ] {
            let d = data(len);
            assert_eq!(file_hash(&d, cs), blake3::hash(&d).into(), "len {len}");
        }
    }

    #[test]
    fn different_chunk_sizes_give_the_same_file_hash() {
        let d = data(1_000_000);
        let a = file_hash(&d, 64 * 1024);
        let b = file_hash(&d, 256 * 1024);
        assert_eq!(a, b);
    }

    #[test]
    fn a_flipped_byte_changes_the_chunk_hash() {
        let cs = MIN_CHUNK_SIZE;
        let mut d = data(3 * cs as usize);
        let before = hash_chunk(&d[cs as usize..2 * cs as usize], 1, 3, cs);
        d[cs as usize + 5] ^= 1;
        let after = hash_chunk(&d[cs as usize..2 * cs as usize], 1, 3, cs);
        assert_ne!(before, after);
        // The same bytes at another offset hash differently too.
        let moved = hash_chunk(&d[cs as usize..2 * cs as usize], 2, 3, cs);
        assert_ne!(after, moved);
    }

    #[test]
    fn chunk_size_rules() {
        assert!(is_valid_chunk_size(4 << 20));
        assert!(!is_valid_chunk_size(0));
        assert!(!is_valid_chunk_size(3 << 20));
        assert!(!is_valid_chunk_size(1024));
        assert!(!is_valid_chunk_size(1 << 30));
        assert_eq!(chunk_count(0, 1 << 20), 0);
        assert_eq!(chunk_count(1, 1 << 20), 1);
        assert_eq!(chunk_count((1 << 20) + 1, 1 << 20), 2);
    }

    #[test]
    fn hex_roundtrip_and_errors() {
        let h: Hash = blake3::hash(b"x").into();
        assert_eq!(Hash::from_hex(&h.to_hex()).unwrap(), h);
        assert!(Hash::from_hex("zz").is_err());
    }
}
