//! The manifest: what a model tree contains, chunk by chunk, and its root hash.
//!
//! A manifest lists regular files (size, `b3sum`-compatible BLAKE3 and one hash
//! per chunk), symlinks that stay inside the tree, and empty directories. Its
//! root hash is BLAKE3 over a canonical encoding of paths, sizes, file hashes
//! and link targets: the model's content id. It does not depend on the chunk
//! size, so two nodes agree on the root however they chunked.
//!
//! Manifests arrive from peers, so [`Manifest::validate`] treats them as
//! hostile: paths, links, sizes and counts are all bounded and checked here,
//! once, before anything touches a disk.

use std::collections::HashSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::hash::{self, Hash};
use crate::relpath::{control_char, shown, RelPath};

/// Manifest format version.
pub const MANIFEST_VERSION: u32 = 1;
/// Largest chunk size [`ChunkSize::Auto`] picks, and the size a model of
/// at least [`AUTO_TARGET_CHUNKS`] × 4 MiB gets: 4 MiB. See
/// docs/how-it-works.md, "Chunk size", for the measurements behind it.
pub const DEFAULT_CHUNK_SIZE: u64 = 4 << 20;
/// Smallest chunk size [`ChunkSize::Auto`] picks: 256 KiB.
pub const AUTO_MIN_CHUNK_SIZE: u64 = 256 << 10;
/// How many chunks [`ChunkSize::Auto`] gives a model at least, between
/// its bounds: a swarm pipelines chunk by chunk, so a model of few chunks
/// leaves every link idle while its first chunks spread.
pub const AUTO_TARGET_CHUNKS: u64 = 512;

/// How a manifest's chunk size is chosen (`--chunk-size`). The root does
/// not depend on it (chunks are BLAKE3 subtrees), so nodes agree on a
/// model however it was chunked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChunkSize {
    /// From the model's size: [`auto_chunk_size`].
    #[default]
    Auto,
    /// This many bytes (a valid chunk size, [`crate::hash::is_valid_chunk_size`]).
    Fixed(u64),
}

impl ChunkSize {
    /// The chunk size for a model of `total_bytes`.
    pub fn for_bytes(self, total_bytes: u64) -> u64 {
        match self {
            ChunkSize::Auto => auto_chunk_size(total_bytes),
            ChunkSize::Fixed(n) => n,
        }
    }

    /// Whether a fixed size is a legal one (auto always is).
    pub fn is_valid(self) -> bool {
        match self {
            ChunkSize::Auto => true,
            ChunkSize::Fixed(n) => hash::is_valid_chunk_size(n),
        }
    }
}

impl From<u64> for ChunkSize {
    fn from(n: u64) -> ChunkSize {
        ChunkSize::Fixed(n)
    }
}

impl std::fmt::Display for ChunkSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChunkSize::Auto => f.write_str("auto"),
            ChunkSize::Fixed(n) if n % (1 << 20) == 0 => write!(f, "{}MiB", n >> 20),
            ChunkSize::Fixed(n) => write!(f, "{}KiB", n >> 10),
        }
    }
}

/// The chunk size for a model of `total_bytes`: the largest power of two
/// that still gives [`AUTO_TARGET_CHUNKS`] chunks, within
/// [`AUTO_MIN_CHUNK_SIZE`]..=[`DEFAULT_CHUNK_SIZE`]. A model of 2 GiB or
/// more gets 4 MiB; 128 MiB gets 256 KiB (measured on 8 nodes at 100
/// Mbit/s: 1.14 × S/B against 1.55 × at 4 MiB).
pub fn auto_chunk_size(total_bytes: u64) -> u64 {
    let per = total_bytes / AUTO_TARGET_CHUNKS;
    let pow = if per == 0 {
        1
    } else {
        1u64 << (63 - per.leading_zeros())
    };
    pow.clamp(AUTO_MIN_CHUNK_SIZE, DEFAULT_CHUNK_SIZE)
}
/// Most entries (files, symlinks and empty directories) a manifest may
/// hold; a larger count is refused while decoding, before the entries are
/// read, and again by [`Manifest::validate`].
pub const MAX_ENTRIES: usize = 1_000_000;
/// Largest single file: 1 PiB.
pub const MAX_FILE_SIZE: u64 = 1 << 50;
/// Most chunks in one manifest (64 TiB at the 4 MiB default); one file
/// claiming more chunk hashes is refused while decoding.
pub const MAX_TOTAL_CHUNKS: u64 = 1 << 24;
/// Longest symlink target.
pub const MAX_LINK_LEN: usize = 4096;

/// One regular file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The file's path in the tree.
    pub path: RelPath,
    /// Its size in bytes.
    pub size: u64,
    /// Whole-file BLAKE3, as `b3sum` prints it.
    pub hash: Hash,
    /// Whether it has an execute bit.
    pub executable: bool,
    /// One hash per chunk; see [`crate::hash::hash_chunk`]. Decoding
    /// refuses more than [`MAX_TOTAL_CHUNKS`] before reading them.
    #[serde(deserialize_with = "bounded::chunk_hashes")]
    pub chunks: Vec<Hash>,
}

/// One entry of a tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Entry {
    /// A regular file.
    File(FileEntry),
    /// A symlink kept as a link; `target` is relative and stays in the tree.
    Symlink {
        /// The link's path in the tree.
        path: RelPath,
        /// Where it points.
        target: String,
    },
    /// An empty directory.
    Dir {
        /// The directory's path in the tree.
        path: RelPath,
    },
}

impl Entry {
    /// The entry's path in the tree.
    pub fn path(&self) -> &RelPath {
        match self {
            Entry::File(f) => &f.path,
            Entry::Symlink { path, .. } | Entry::Dir { path } => path,
        }
    }
}

/// A tree description. Entries are sorted by path, which makes the encoding
/// canonical.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The manifest format version.
    pub version: u32,
    /// Chunk size in bytes: a power of two.
    pub chunk_size: u64,
    /// Decoding refuses more than [`MAX_ENTRIES`] before reading them.
    #[serde(deserialize_with = "bounded::entries")]
    pub entries: Vec<Entry>,
}

/// Decoding a manifest's lists with their counts checked first.
///
/// A peer's manifest states how many entries (and, per file, how many
/// chunk hashes) follow, as a varint. serde's own `Vec` decoding already
/// caps what it reserves up front at 1 MiB whatever the claim (and
/// postcard states no count at all when fewer bytes remain than the claim),
/// so a claim alone cannot make us allocate; but each decoded entry takes
/// several times its wire size in memory, so a 64 MiB frame of tiny
/// entries would become gigabytes before [`Manifest::validate`] could
/// count them. These decoders refuse a claim over the limit before reading
/// an element, and stop at the limit when the claim was not stated.
mod bounded {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};

    use super::{Entry, MAX_ENTRIES, MAX_TOTAL_CHUNKS};
    use crate::hash::Hash;

    /// What serde reserves up front at most, as in its own `Vec` decoding.
    const MAX_PREALLOC_BYTES: usize = 1 << 20;

    struct Bounded<T> {
        max: usize,
        what: &'static str,
        limit: &'static str,
        item: PhantomData<T>,
    }

    impl<T> Bounded<T> {
        fn too_many<E: de::Error>(&self, n: impl fmt::Display) -> E {
            let why = format!(
                "a manifest with {n} {}: more than the limit of {} ({})",
                self.what, self.max, self.limit
            );
            crate::frame::refused_because(&why);
            E::custom(why)
        }
    }

    impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "at most {} {}", self.max, self.what)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let hint = seq.size_hint();
            if let Some(n) = hint.filter(|&n| n > self.max) {
                return Err(self.too_many(n));
            }
            let reserve = hint
                .unwrap_or(0)
                .min(MAX_PREALLOC_BYTES / std::mem::size_of::<T>().max(1));
            let mut out = Vec::with_capacity(reserve);
            while let Some(item) = seq.next_element()? {
                if out.len() == self.max {
                    return Err(self.too_many(format!("more than {}", self.max)));
                }
                out.push(item);
            }
            Ok(out)
        }
    }

    pub fn entries<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Entry>, D::Error> {
        d.deserialize_seq(Bounded {
            max: MAX_ENTRIES,
            what: "entries",
            limit: "MAX_ENTRIES",
            item: PhantomData,
        })
    }

    pub fn chunk_hashes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Hash>, D::Error> {
        d.deserialize_seq(Bounded {
            max: MAX_TOTAL_CHUNKS as usize,
            what: "chunk hashes in one file",
            limit: "MAX_TOTAL_CHUNKS",
            item: PhantomData,
        })
    }
}

/// Identifies one chunk: the file's index among the manifest's files, and the
/// chunk's index within that file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ChunkId {
    /// The file's index among the manifest's files.
    pub file: u32,
    /// The chunk's index within the file.
    pub index: u32,
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("unsupported manifest version {0} (this xfer reads version {MANIFEST_VERSION}); upgrade xfer on both ends")]
    /// Another format version.
    Version(u32),
    #[error("chunk size {0} is not a power of two between 64 KiB and 256 MiB")]
    /// A chunk size xfer does not use.
    ChunkSize(u64),
    #[error("{0} entries is more than the limit of {MAX_ENTRIES}")]
    /// More entries than [`MAX_ENTRIES`].
    TooManyEntries(usize),
    #[error(
        "entries are not in strictly increasing path order at `{0}` (duplicate or unsorted path)"
    )]
    /// Entries not sorted, or a path twice.
    Order(String),
    #[error("`{0}` is inside `{1}`, which is a file or symlink")]
    /// An entry under a file or symlink.
    UnderNonDir(String, String),
    #[error("file `{0}` claims {1} bytes, more than the 1 PiB limit")]
    /// A file over the 1 PiB limit.
    FileTooLarge(String, u64),
    #[error("file `{path}` has {got} chunk hashes but {want} chunks")]
    /// A file's chunk hashes do not match its size.
    ChunkCount {
        /// The file's path.
        path: String,
        /// Chunk hashes given.
        got: usize,
        /// Chunks its size needs.
        want: u64,
    },
    #[error("manifest has more than {MAX_TOTAL_CHUNKS} chunks")]
    /// More chunks than [`MAX_TOTAL_CHUNKS`].
    TooManyChunks,
    #[error("file `{0}`: chunk hashes do not combine to the file hash")]
    /// A file's chunk hashes do not combine to its hash.
    TreeMismatch(String),
    #[error("symlink `{0}` points outside the tree or through another symlink: `{1}`")]
    /// A symlink that leaves the tree.
    LinkEscape(String, String),
    #[error("symlink `{0}` has the control character {2:?} in its target `{1}`; a link's target names a path of the tree")]
    /// A symlink whose target holds a control character.
    LinkControl(String, String, char),
    #[error("stated root {stated} does not match the computed root {computed}")]
    /// The stated root is not the manifest's.
    Root {
        /// The root given.
        stated: Hash,
        /// The root of the entries.
        computed: Hash,
    },
}

impl Manifest {
    /// BLAKE3 over the canonical encoding: the model's content id.
    pub fn root(&self) -> Hash {
        let mut h = blake3::Hasher::new_derive_key("xfer manifest root v1");
        h.update(&(self.entries.len() as u64).to_le_bytes());
        for e in &self.entries {
            let (tag, path) = match e {
                Entry::File(_) => (b'f', e.path()),
                Entry::Symlink { .. } => (b'l', e.path()),
                Entry::Dir { .. } => (b'd', e.path()),
            };
            h.update(&[tag]);
            h.update(&(path.as_str().len() as u64).to_le_bytes());
            h.update(path.as_str().as_bytes());
            match e {
                Entry::File(f) => {
                    h.update(&f.size.to_le_bytes());
                    h.update(&f.hash.0);
                    h.update(&[f.executable as u8]);
                }
                Entry::Symlink { target, .. } => {
                    h.update(&(target.len() as u64).to_le_bytes());
                    h.update(target.as_bytes());
                }
                Entry::Dir { .. } => {}
            }
        }
        h.finalize().into()
    }

    /// The files, in manifest order; a file's position is its `ChunkId::file`.
    pub fn files(&self) -> impl Iterator<Item = &FileEntry> {
        self.entries.iter().filter_map(|e| match e {
            Entry::File(f) => Some(f),
            _ => None,
        })
    }

    /// Number of regular files.
    pub fn file_count(&self) -> usize {
        self.files().count()
    }

    /// Sum of file sizes.
    pub fn total_bytes(&self) -> u64 {
        self.files().map(|f| f.size).sum()
    }

    /// Sum of chunk counts.
    pub fn total_chunks(&self) -> u64 {
        self.files().map(|f| f.chunks.len() as u64).sum()
    }

    /// Byte length of one chunk.
    pub fn chunk_len(&self, file: &FileEntry, index: u32) -> u64 {
        let start = index as u64 * self.chunk_size;
        self.chunk_size.min(file.size.saturating_sub(start))
    }

    /// Checks everything a hostile peer could get wrong. Only a validated
    /// manifest may be used to write files.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.version != MANIFEST_VERSION {
            return Err(ManifestError::Version(self.version));
        }
        if !hash::is_valid_chunk_size(self.chunk_size) {
            return Err(ManifestError::ChunkSize(self.chunk_size));
        }
        if self.entries.len() > MAX_ENTRIES {
            return Err(ManifestError::TooManyEntries(self.entries.len()));
        }
        let mut leaves: HashSet<&str> = HashSet::new();
        let mut links: HashSet<&str> = HashSet::new();
        let mut prev: Option<&RelPath> = None;
        let mut total_chunks = 0u64;
        for e in &self.entries {
            let path = e.path();
            if prev.is_some_and(|p| p >= path) {
                return Err(ManifestError::Order(path.to_string()));
            }
            prev = Some(path);
            for anc in path.ancestors() {
                if leaves.contains(anc) {
                    return Err(ManifestError::UnderNonDir(path.to_string(), anc.into()));
                }
            }
            match e {
                Entry::File(f) => {
                    leaves.insert(path.as_str());
                    if f.size > MAX_FILE_SIZE {
                        return Err(ManifestError::FileTooLarge(path.to_string(), f.size));
                    }
                    let want = hash::chunk_count(f.size, self.chunk_size);
                    if f.chunks.len() as u64 != want {
                        return Err(ManifestError::ChunkCount {
                            path: path.to_string(),
                            got: f.chunks.len(),
                            want,
                        });
                    }
                    total_chunks += want;
                    if total_chunks > MAX_TOTAL_CHUNKS {
                        return Err(ManifestError::TooManyChunks);
                    }
                    if want > 1 && hash::file_hash_from_chunks(&f.chunks) != f.hash {
                        return Err(ManifestError::TreeMismatch(path.to_string()));
                    }
                    if want == 1 && f.chunks[0] != f.hash {
                        return Err(ManifestError::TreeMismatch(path.to_string()));
                    }
                    if want == 0 && f.hash != hash::file_hash_from_chunks(&[]) {
                        return Err(ManifestError::TreeMismatch(path.to_string()));
                    }
                }
                Entry::Symlink { .. } => {
                    leaves.insert(path.as_str());
                    links.insert(path.as_str());
                }
                Entry::Dir { .. } => {}
            }
        }
        // Links are checked once all link paths are known: a target must
        // resolve inside the tree, use `..` only as leading components, and
        // not pass through another symlink (which could move it elsewhere).
        for e in &self.entries {
            if let Entry::Symlink { path, target } = e {
                if let Some(c) = control_char(target) {
                    return Err(ManifestError::LinkControl(
                        path.to_string(),
                        shown(target),
                        c,
                    ));
                }
                let escape = || ManifestError::LinkEscape(path.to_string(), shown(target));
                if target.len() > MAX_LINK_LEN || !dots_only_leading(target) {
                    return Err(escape());
                }
                let resolved = path.resolve_link(target).ok_or_else(escape)?;
                if resolved.ancestors().any(|a| links.contains(a)) {
                    return Err(escape());
                }
            }
        }
        Ok(())
    }

    /// Reads a manifest written by `xfer manifest --json` and checks it,
    /// including its stated root.
    pub fn load_json(path: &Path) -> anyhow::Result<Manifest> {
        use anyhow::Context;
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot open manifest {}", path.display()))?;
        Self::parse_json(&bytes, path)
    }

    /// [`Manifest::load_json`] on bytes already read; `path` names them in
    /// messages.
    pub fn parse_json(bytes: &[u8], path: &Path) -> anyhow::Result<Manifest> {
        use anyhow::Context;
        let doc: ManifestDoc = serde_json::from_slice(bytes).with_context(|| {
            format!(
                "{} is not an xfer manifest (make one with `xfer manifest DIR --json`)",
                path.display()
            )
        })?;
        doc.manifest
            .validate()
            .with_context(|| format!("manifest {} is invalid", path.display()))?;
        let computed = doc.manifest.root();
        if computed != doc.root {
            return Err(ManifestError::Root {
                stated: doc.root,
                computed,
            })
            .with_context(|| format!("manifest {} was altered", path.display()));
        }
        Ok(doc.manifest)
    }

    /// The JSON document form, with the root and totals up front.
    pub fn to_doc(&self) -> ManifestDoc {
        ManifestDoc {
            root: self.root(),
            files: self.file_count(),
            bytes: self.total_bytes(),
            manifest: self.clone(),
        }
    }
}

/// `..` may only lead a link target; a `..` after a normal component could be
/// resolved by the kernel through a symlink to somewhere else entirely.
pub fn dots_only_leading(target: &str) -> bool {
    let mut seen_normal = false;
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." if seen_normal => return false,
            ".." => {}
            _ => seen_normal = true,
        }
    }
    true
}

/// The JSON form of a manifest, as `xfer manifest --json` prints it.
#[derive(Debug, Serialize, Deserialize)]
pub struct ManifestDoc {
    /// The manifest's root hash.
    pub root: Hash,
    /// Number of regular files.
    pub files: usize,
    /// Total bytes of the files.
    pub bytes: u64,
    #[serde(flatten)]
    /// The manifest itself.
    pub manifest: Manifest,
}

/// The entry of a file of these bytes, hashed in memory (small files:
/// tests and generated fixtures).
pub fn file(path: &str, data: &[u8], chunk_size: u64) -> Entry {
    let n = hash::chunk_count(data.len() as u64, chunk_size);
    let chunks: Vec<Hash> = data
        .chunks(chunk_size as usize)
        .enumerate()
        .map(|(i, c)| hash::hash_chunk(c, i as u64, n, chunk_size))
        .collect();
    Entry::File(FileEntry {
        path: RelPath::new(path).unwrap(),
        size: data.len() as u64,
        hash: blake3::hash(data).into(),
        executable: false,
        chunks,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub use super::file;

    fn link(path: &str, target: &str) -> Entry {
        Entry::Symlink {
            path: RelPath::new(path).unwrap(),
            target: target.into(),
        }
    }

    fn manifest(entries: Vec<Entry>) -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            chunk_size: hash::MIN_CHUNK_SIZE,
            entries,
        }
    }

    fn big() -> Vec<u8> {
        (0..300_000u32).map(|i| (i % 253) as u8).collect()
    }

    #[test]
    fn a_good_manifest_passes_and_has_a_stable_root() {
        let m = manifest(vec![
            file("blobs/a", &big(), hash::MIN_CHUNK_SIZE),
            Entry::Dir {
                path: RelPath::new("empty").unwrap(),
            },
            link("snapshots/c1/model.safetensors", "../../blobs/a"),
        ]);
        m.validate().unwrap();
        assert_eq!(m.root(), m.clone().root());
        let mut other = m.clone();
        other.chunk_size *= 2;
        if let Entry::File(f) = &mut other.entries[0] {
            *f = match file("blobs/a", &big(), other.chunk_size) {
                Entry::File(f) => f,
                _ => unreachable!(),
            };
        }
        other.validate().unwrap();
        assert_eq!(m.root(), other.root(), "root must not depend on chunk size");
    }

    #[test]
    fn hostile_manifests_are_refused() {
        let cs = hash::MIN_CHUNK_SIZE;
        let dup = manifest(vec![file("a", b"1", cs), file("a", b"1", cs)]);
        assert!(matches!(dup.validate(), Err(ManifestError::Order(_))));

        let under = manifest(vec![file("a", b"1", cs), file("a/b", b"1", cs)]);
        assert!(matches!(
            under.validate(),
            Err(ManifestError::UnderNonDir(..))
        ));

        let through_link = manifest(vec![link("a", "b"), file("a/x", b"1", cs)]);
        assert!(through_link.validate().is_err());

        for target in [
            "../../x",
            "/etc/passwd",
            "a/../../x",
            "s/../../x",
            "",
            "../..",
        ] {
            let m = manifest(vec![link("d/l", target)]);
            assert!(m.validate().is_err(), "target {target:?} should be refused");
        }
        // A control character in a link's target: refused, shown escaped.
        for target in ["x\ny", "\u{1b}[31mRED", "b\u{9b}"] {
            let m = manifest(vec![link("d/l", target)]);
            let e = m.validate().unwrap_err();
            assert!(
                matches!(e, ManifestError::LinkControl(..)),
                "{target:?}: {e}"
            );
            let e = e.to_string();
            assert!(!e.chars().any(char::is_control), "{e:?}");
            assert!(e.contains(&target.escape_debug().to_string()), "{e}");
        }
        // A link whose target passes through another link.
        let chain = manifest(vec![link("a/b/s", "../../c"), link("a/b/x", "s/y")]);
        assert!(matches!(
            chain.validate(),
            Err(ManifestError::LinkEscape(..))
        ));

        let mut huge = manifest(vec![file("a", b"1", cs)]);
        if let Entry::File(f) = &mut huge.entries[0] {
            f.size = u64::MAX;
        }
        assert!(matches!(
            huge.validate(),
            Err(ManifestError::FileTooLarge(..))
        ));

        let mut wrong_count = manifest(vec![file("a", &big(), cs)]);
        if let Entry::File(f) = &mut wrong_count.entries[0] {
            f.chunks.pop();
        }
        assert!(matches!(
            wrong_count.validate(),
            Err(ManifestError::ChunkCount { .. })
        ));

        let mut forged = manifest(vec![file("a", &big(), cs)]);
        if let Entry::File(f) = &mut forged.entries[0] {
            f.chunks[1].0[0] ^= 1;
        }
        assert!(matches!(
            forged.validate(),
            Err(ManifestError::TreeMismatch(_))
        ));

        let mut zero = manifest(vec![]);
        zero.chunk_size = 0;
        assert!(matches!(zero.validate(), Err(ManifestError::ChunkSize(0))));
    }

    #[test]
    fn sizes_and_counts_that_would_overflow_are_refused() {
        let cs = hash::MIN_CHUNK_SIZE;
        // Just over the limit: refused by size, before any arithmetic.
        let mut over = manifest(vec![file("a", b"1", cs)]);
        if let Entry::File(f) = &mut over.entries[0] {
            f.size = MAX_FILE_SIZE + 1;
        }
        let e = over.validate().unwrap_err();
        assert!(e.to_string().contains("more than the 1 PiB limit"), "{e}");
        // At the limit, a file needs 2^34 chunk hashes; the claim is only
        // as good as the hashes sent, so sizes summing past u64::MAX (16 Ki
        // files of 1 PiB) never reach a sum.
        let mut pib = match file("a", b"1", cs) {
            Entry::File(f) => f,
            _ => unreachable!(),
        };
        pib.size = MAX_FILE_SIZE;
        let entries = (0..(1u32 << 14) + 1)
            .map(|i| {
                let mut f = pib.clone();
                f.path = RelPath::new(&format!("f{i:05}")).unwrap();
                Entry::File(f)
            })
            .collect();
        let e = manifest(entries).validate().unwrap_err();
        assert_eq!(
            e,
            ManifestError::ChunkCount {
                path: "f00000".into(),
                got: 1,
                want: MAX_FILE_SIZE / cs
            }
        );
        assert!(e
            .to_string()
            .contains("has 1 chunk hashes but 17179869184 chunks"));
        // A validated manifest's totals cannot overflow: each file's bytes
        // are bounded by its chunks, and the chunks by MAX_TOTAL_CHUNKS.
        const { assert!(MAX_TOTAL_CHUNKS.checked_mul(hash::MAX_CHUNK_SIZE).is_some()) };
        const { assert!(MAX_TOTAL_CHUNKS <= u32::MAX as u64) };
    }

    /// Hand-edited JSON manifests (`xfer verify --manifest`) are refused
    /// with their reason, whatever is wrong: traversal, absolute paths,
    /// escaping links, duplicates, oversized files, a zero chunk size.
    #[test]
    fn crafted_json_manifests_say_what_is_wrong() {
        let cs = hash::MIN_CHUNK_SIZE;
        let good = manifest(vec![file("a", b"hello", cs)]);
        let doc = serde_json::to_value(good.to_doc()).unwrap();
        let with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut d = doc.clone();
            edit(&mut d);
            serde_json::to_vec(&d).unwrap()
        };
        let entry = doc["entries"][0].clone();
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "traversal",
                with(&|d| d["entries"][0]["file"]["path"] = "../../etc/x".into()),
                "path `../../etc/x` climbs out of the tree",
            ),
            (
                "absolute path",
                with(&|d| d["entries"][0]["file"]["path"] = "/etc/x".into()),
                "absolute path `/etc/x`",
            ),
            (
                "symlink escape",
                with(&|d| {
                    d["entries"][0] =
                        serde_json::json!({"symlink": {"path": "l", "target": "../x"}})
                }),
                "symlink `l` points outside the tree",
            ),
            (
                "duplicate",
                with(&|d| d["entries"] = serde_json::json!([entry, entry])),
                "duplicate or unsorted path",
            ),
            (
                "size past u64",
                with(&|d| d["entries"][0]["file"]["size"] = serde_json::json!(u64::MAX)),
                "more than the 1 PiB limit",
            ),
            (
                "size past u64, as a bigger number",
                with(&|d| {
                    d["entries"][0]["file"]["size"] =
                        serde_json::Value::Number("18446744073709551616".parse().unwrap())
                }),
                "is not an xfer manifest",
            ),
            (
                "zero chunk size",
                with(&|d| d["chunk_size"] = 0.into()),
                "chunk size 0 is not a power of two",
            ),
        ];
        for (what, bytes, says) in cases {
            let e = Manifest::parse_json(&bytes, Path::new("m.json")).expect_err(what);
            let e = format!("{e:#}");
            assert!(e.contains(says), "{what}: `{e}` should say `{says}`");
            assert!(e.contains("m.json"), "{what}: `{e}` should name the file");
        }
    }

    #[test]
    fn json_roundtrip_checks_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let m = manifest(vec![file("a", b"hello", hash::MIN_CHUNK_SIZE)]);
        let p = dir.path().join("m.json");
        std::fs::write(&p, serde_json::to_vec(&m.to_doc()).unwrap()).unwrap();
        assert_eq!(Manifest::load_json(&p).unwrap(), m);
        let mut doc = m.to_doc();
        doc.root.0[0] ^= 1;
        std::fs::write(&p, serde_json::to_vec(&doc).unwrap()).unwrap();
        let err = format!("{:#}", Manifest::load_json(&p).unwrap_err());
        assert!(err.contains("altered"), "{err}");
    }

    /// Counts the bytes this thread allocates, so a test can tell that a
    /// decode allocated next to nothing.
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        thread_local! {
            static ALLOCATED: Cell<usize> = const { Cell::new(0) };
        }

        pub struct Counting;

        fn count(n: usize) {
            let _ = ALLOCATED.try_with(|a| a.set(a.get().saturating_add(n)));
        }

        // SAFETY: forwards to the system allocator unchanged.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, l: Layout) -> *mut u8 {
                count(l.size());
                System.alloc(l)
            }
            unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
                count(l.size());
                System.alloc_zeroed(l)
            }
            unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
                count(new);
                System.realloc(p, l, new)
            }
            unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
                System.dealloc(p, l)
            }
        }

        #[global_allocator]
        static GLOBAL: Counting = Counting;

        /// `f`'s result and the bytes this thread allocated while it ran.
        pub fn allocated_by<R>(f: impl FnOnce() -> R) -> (R, usize) {
            let before = ALLOCATED.with(Cell::get);
            let r = f();
            (r, ALLOCATED.with(Cell::get) - before)
        }
    }

    /// The start of a postcard manifest claiming `entries` entries.
    fn claiming(entries: u64) -> Vec<u8> {
        let mut b = postcard::to_stdvec(&(MANIFEST_VERSION, hash::MIN_CHUNK_SIZE)).unwrap();
        // A sequence length is a varint, as a u64 is.
        b.extend(postcard::to_stdvec(&entries).unwrap());
        b
    }

    #[test]
    fn a_claim_of_2_pow_32_entries_is_refused_quickly_without_allocating() {
        use crate::frame;
        // Alone, and inside the offer that carries a manifest.
        let mut body = claiming(1 << 32);
        body.extend([0u8; 64]);
        let mut offer = postcard::to_stdvec(&(1u32, "m")).unwrap(); // Offer
        offer.extend(&body);
        let started = std::time::Instant::now();
        let (r, bytes) = counting::allocated_by(|| frame::decode::<Manifest>(&body));
        assert!(r.is_err(), "{r:?}");
        assert!(
            bytes < 64 << 10,
            "decoding the claim allocated {bytes} bytes"
        );
        let (r, bytes) =
            counting::allocated_by(|| frame::decode::<crate::transfer::TransferMsg>(&offer));
        assert!(r.is_err(), "{r:?}");
        assert!(
            bytes < 64 << 10,
            "decoding the offer allocated {bytes} bytes"
        );
        // The same claim followed by more (tiny) entries than the limit:
        // refused at the limit, not when the bytes run out, having
        // allocated no more than the limit's worth.
        let mut big = claiming(1 << 32);
        for _ in 0..=MAX_ENTRIES {
            big.extend([2, 1, b'a']); // Dir { path: "a" }
        }
        let (r, bytes) = counting::allocated_by(|| frame::decode::<Manifest>(&big));
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("more than 1000000 entries: more than the limit of 1000000 (MAX_ENTRIES)"),
            "{e}"
        );
        let worth = MAX_ENTRIES * (std::mem::size_of::<Entry>() + 1);
        assert!(
            bytes < 3 * worth,
            "decoding allocated {bytes} bytes, the limit's worth is {worth}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_stated_count_over_the_limit_is_refused_before_any_entry_is_read() {
        use crate::frame;
        let mut body = claiming(MAX_ENTRIES as u64 + 1);
        // Enough bytes that the claim is stated (postcard states no count
        // when fewer bytes remain than it claims).
        body.resize(body.len() + MAX_ENTRIES + 1, 0);
        let (r, bytes) = counting::allocated_by(|| frame::decode::<Manifest>(&body));
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains(
                "a manifest with 1000001 entries: more than the limit of 1000000 (MAX_ENTRIES)"
            ),
            "{e}"
        );
        assert!(
            bytes < 64 << 10,
            "refusing the claim allocated {bytes} bytes"
        );

        // One file claiming 2^32 chunk hashes, the bytes for them not sent.
        let mut body = claiming(1);
        let path = postcard::to_stdvec(&(0u32, "a", 1u64 << 40, [0u8; 32], false)).unwrap();
        body.extend(path);
        body.extend(postcard::to_stdvec(&(1u64 << 32)).unwrap());
        body.extend([0u8; 64]);
        let (r, bytes) = counting::allocated_by(|| frame::decode::<Manifest>(&body));
        assert!(r.is_err(), "{r:?}");
        assert!(
            bytes < 64 << 10,
            "decoding the claim allocated {bytes} bytes"
        );
        // Stated and over the limit.
        let mut body = claiming(1);
        body.extend(postcard::to_stdvec(&(0u32, "a", 1u64 << 40, [0u8; 32], false)).unwrap());
        body.extend(postcard::to_stdvec(&(MAX_TOTAL_CHUNKS + 1)).unwrap());
        body.resize(body.len() + MAX_TOTAL_CHUNKS as usize + 1, 0);
        let e = frame::decode::<Manifest>(&body).unwrap_err().to_string();
        assert!(e.contains("(MAX_TOTAL_CHUNKS)"), "{e}");
    }

    #[test]
    fn a_manifest_at_the_limit_still_decodes() {
        let m = manifest(vec![file("a", &big(), hash::MIN_CHUNK_SIZE)]);
        let bytes = postcard::to_stdvec(&m).unwrap();
        assert_eq!(crate::frame::decode::<Manifest>(&bytes).unwrap(), m);
        let json = serde_json::to_vec(&m).unwrap();
        assert_eq!(serde_json::from_slice::<Manifest>(&json).unwrap(), m);
    }
    #[test]
    fn auto_chunk_size_gives_small_models_more_chunks_and_large_ones_4_mib() {
        const MIB: u64 = 1 << 20;
        assert_eq!(auto_chunk_size(0), AUTO_MIN_CHUNK_SIZE);
        assert_eq!(auto_chunk_size(10 * MIB), 256 << 10);
        assert_eq!(auto_chunk_size(128 * MIB), 256 << 10);
        assert_eq!(auto_chunk_size(256 * MIB), 512 << 10);
        assert_eq!(auto_chunk_size(512 * MIB), MIB);
        assert_eq!(auto_chunk_size(1024 * MIB - 1), MIB);
        assert_eq!(auto_chunk_size(2048 * MIB), 4 * MIB);
        assert_eq!(auto_chunk_size(119_000 * MIB), 4 * MIB);
        for total in [1, 300 * MIB, 777 * MIB, 5 << 40] {
            let cs = auto_chunk_size(total);
            assert!(hash::is_valid_chunk_size(cs), "{total}: {cs}");
        }
        assert_eq!(ChunkSize::Fixed(MIB).for_bytes(128 * MIB), MIB);
        assert_eq!(ChunkSize::Auto.to_string(), "auto");
        assert_eq!(ChunkSize::Fixed(256 << 10).to_string(), "256KiB");
    }
}
