//! Checking a downloaded file against the hash the Hub lists for it: the
//! sha256 (`lfs.oid`) of an LFS file, or the git blob sha1 (`oid`) of a
//! regular one. [`Digester`] takes the bytes in order as they land, so a
//! download is checked in the same pass that writes it, and it can produce
//! the file's BLAKE3 chunk hashes (what a push sends) from that same pass.
//! Never holds a file in memory.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use blake3::hazmat::HasherExt as _;
use sha1::Digest as _;
use xfer_proto::hash::{self as chunk_hash, Hash};

/// The hash a file must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// sha256 of the contents (LFS files), 64 hex digits.
    Sha256(String),
    /// sha1 of `blob <len>\0<contents>` (regular git files), 40 hex digits.
    GitSha1(String),
}

impl Expected {
    /// The etag the cache names the blob by (the hex digest).
    pub fn etag(&self) -> &str {
        match self {
            Expected::Sha256(h) | Expected::GitSha1(h) => h,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Expected::Sha256(_) => "sha256",
            Expected::GitSha1(_) => "git sha1",
        }
    }
}

/// The Hub hash of a file and, optionally, its BLAKE3 chunk hashes,
/// computed from its bytes fed in order.
pub struct Digester {
    expected: Expected,
    size: u64,
    at: u64,
    sha256: sha2::Sha256,
    sha1: sha1::Sha1,
    chunks: Option<Chunks>,
}

/// BLAKE3 chunk hashes in the making: the manifest's layout (see
/// `xfer_proto::hash::hash_chunk`).
struct Chunks {
    size: u64,
    count: u64,
    done: Vec<Hash>,
    current: blake3::Hasher,
    in_current: u64,
}

impl Chunks {
    fn new(file_size: u64, size: u64) -> Chunks {
        let count = chunk_hash::chunk_count(file_size, size);
        let mut c = Chunks {
            size,
            count,
            done: Vec::with_capacity(count as usize),
            current: blake3::Hasher::new(),
            in_current: 0,
        };
        c.start(0);
        c
    }

    fn start(&mut self, index: u64) {
        self.current = blake3::Hasher::new();
        if self.count > 1 {
            self.current.set_input_offset(index * self.size);
        }
        self.in_current = 0;
    }

    fn update(&mut self, mut bytes: &[u8], file_size: u64) {
        while !bytes.is_empty() {
            let index = self.done.len() as u64;
            let len = (file_size - index * self.size).min(self.size);
            let take = ((len - self.in_current) as usize).min(bytes.len());
            self.current.update(&bytes[..take]);
            self.in_current += take as u64;
            bytes = &bytes[take..];
            if self.in_current == len {
                let h = if self.count > 1 {
                    Hash(self.current.finalize_non_root())
                } else {
                    self.current.finalize().into()
                };
                self.done.push(h);
                self.start(index + 1);
            }
        }
    }
}

/// Why a file's hash check failed ([`Digester::finish`], [`check`]).
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// The file was not fed to its end.
    #[error("{} was hashed to byte {at} of {size}", path.display())]
    Short {
        /// The file.
        path: PathBuf,
        /// Bytes hashed.
        at: u64,
        /// The file's size.
        size: u64,
    },
    /// The hash differs from the listing's.
    #[error("{} has {kind} {got}, the Hub lists {listed}", path.display())]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// Which hash (`git sha1` or `sha256`).
        kind: &'static str,
        /// The hash the file has.
        got: String,
        /// The hash the Hub lists.
        listed: String,
    },
    /// The file could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file's size could not be read.
    #[error("{0}")]
    Stat(std::io::Error),
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// What a finished [`Digester`] found.
pub struct Digest {
    /// `Err` says which hash differed, for the user.
    pub verdict: Result<(), DigestError>,
    /// The BLAKE3 chunk hashes, if asked for (and the file matched).
    pub chunks: Option<(u64, Vec<Hash>)>,
}

impl Digester {
    /// For a file of `size` bytes that must have `expected`; with
    /// `chunk_size`, also its BLAKE3 chunk hashes at that chunk size.
    pub fn new(expected: &Expected, size: u64, chunk_size: Option<u64>) -> Digester {
        let mut sha1 = sha1::Sha1::new();
        if matches!(expected, Expected::GitSha1(_)) {
            sha1.update(format!("blob {size}\0").as_bytes());
        }
        Digester {
            expected: expected.clone(),
            size,
            at: 0,
            sha256: sha2::Sha256::new(),
            sha1,
            chunks: chunk_size.map(|c| Chunks::new(size, c)),
        }
    }

    /// How many bytes from the start have been fed.
    pub fn at(&self) -> u64 {
        self.at
    }

    /// The BLAKE3 hashes of the chunks fed whole so far (none when chunk
    /// hashes were not asked for).
    pub fn chunks_done(&self) -> &[Hash] {
        self.chunks
            .as_ref()
            .map(|c| c.done.as_slice())
            .unwrap_or(&[])
    }

    /// Feeds the next bytes of the file (those at [`Digester::at`]).
    /// Bytes past the file's size are a caller bug and are refused.
    pub fn update(&mut self, bytes: &[u8]) {
        assert!(
            self.at + bytes.len() as u64 <= self.size,
            "fed past the end"
        );
        match self.expected {
            Expected::GitSha1(_) => self.sha1.update(bytes),
            Expected::Sha256(_) => self.sha256.update(bytes),
        }
        if let Some(c) = &mut self.chunks {
            c.update(bytes, self.size);
        }
        self.at += bytes.len() as u64;
    }

    /// Compares with the expected hash; `what` names the file in the error.
    /// A file not fed to its end is a mismatch.
    pub fn finish(self, what: &Path) -> Digest {
        if self.at != self.size {
            return Digest {
                verdict: Err(DigestError::Short {
                    path: what.to_path_buf(),
                    at: self.at,
                    size: self.size,
                }),
                chunks: None,
            };
        }
        let got = match self.expected {
            Expected::GitSha1(_) => hex::encode(self.sha1.finalize()),
            Expected::Sha256(_) => hex::encode(self.sha256.finalize()),
        };
        if !got.eq_ignore_ascii_case(self.expected.etag()) {
            return Digest {
                verdict: Err(DigestError::Mismatch {
                    path: what.to_path_buf(),
                    kind: self.expected.kind(),
                    got,
                    listed: self.expected.etag().to_string(),
                }),
                chunks: None,
            };
        }
        Digest {
            verdict: Ok(()),
            chunks: self.chunks.map(|c| (c.size, c.done)),
        }
    }
}

/// Feeds `d` from `file` up to byte `upto`, reading through `buf`.
pub fn feed_from(d: &mut Digester, file: &File, upto: u64, buf: &mut [u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    while d.at() < upto {
        let n = ((upto - d.at()) as usize).min(buf.len());
        file.read_exact_at(&mut buf[..n], d.at())?;
        d.update(&buf[..n]);
    }
    Ok(())
}

/// Hashes `path` and compares; the error says which hash differed.
pub fn check(path: &Path, expected: &Expected) -> Result<(), DigestError> {
    let mut f = File::open(path).map_err(|source| DigestError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let len = f.metadata().map_err(DigestError::Stat)?.len();
    let mut d = Digester::new(expected, len, None);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|source| DigestError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        if n == 0 || d.at() + n as u64 > len {
            break;
        }
        d.update(&buf[..n]);
    }
    d.finish(path).verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, b"hello\n").unwrap();
        // `git hash-object` and `sha256sum` of "hello\n".
        let git = Expected::GitSha1("ce013625030ba8dba906f756967f9e9ca394464a".into());
        let sha = Expected::Sha256(
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03".into(),
        );
        check(&p, &git).unwrap();
        check(&p, &sha).unwrap();
        std::fs::write(&p, b"hellO\n").unwrap();
        let e = check(&p, &git).unwrap_err().to_string();
        assert!(e.contains("git sha1") && e.contains("ce013625"), "{e}");
        assert!(check(&p, &sha).unwrap_err().to_string().contains("sha256"));
        // Empty file: git's well-known empty blob.
        std::fs::write(&p, b"").unwrap();
        check(
            &p,
            &Expected::GitSha1("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391".into()),
        )
        .unwrap();
    }

    #[test]
    fn chunk_hashes_from_the_stream_equal_the_scanners() {
        // 3.5 chunks of 64 KiB fed in odd pieces.
        let cs = 64 * 1024;
        let data: Vec<u8> = (0..(cs * 7 / 2) as u32)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        use sha2::Digest as _;
        let sha = Expected::Sha256(hex::encode(sha2::Sha256::digest(&data)));
        let mut d = Digester::new(&sha, data.len() as u64, Some(cs as u64));
        for piece in data.chunks(10_007) {
            d.update(piece);
        }
        let out = d.finish(Path::new("f"));
        out.verdict.unwrap();
        let (size, chunks) = out.chunks.unwrap();
        assert_eq!(size, cs as u64);
        let want: Vec<Hash> = data
            .chunks(cs)
            .enumerate()
            .map(|(i, c)| chunk_hash::hash_chunk(c, i as u64, 4, cs as u64))
            .collect();
        assert_eq!(chunks, want);
        assert_eq!(
            chunk_hash::file_hash_from_chunks(&chunks),
            Hash::from(blake3::hash(&data))
        );
        // One chunk: the file hash itself; a short feed is a mismatch.
        let mut d = Digester::new(&sha, data.len() as u64, Some(1 << 20));
        d.update(&data);
        assert_eq!(
            d.finish(Path::new("f")).chunks.unwrap().1,
            vec![Hash::from(blake3::hash(&data))]
        );
        let mut d = Digester::new(&sha, data.len() as u64, None);
        d.update(&data[..100]);
        assert!(d
            .finish(Path::new("f"))
            .verdict
            .unwrap_err()
            .to_string()
            .contains("byte 100"));
    }
}
