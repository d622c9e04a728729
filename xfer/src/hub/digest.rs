//! Checking a downloaded file against the hash the Hub lists for it: the
//! sha256 (`lfs.oid`) of an LFS file, or the git blob sha1 (`oid`) of a
//! regular one. Streams the file; never holds it in memory.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use sha1::Digest as _;

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

/// Hashes `path` and compares; the error says which hash differed.
pub fn check(path: &Path, expected: &Expected) -> Result<(), String> {
    let mut f = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut sha256 = sha2::Sha256::new();
    let mut sha1 = sha1::Sha1::new();
    let git = matches!(expected, Expected::GitSha1(_));
    if git {
        sha1.update(format!("blob {len}\0").as_bytes());
    }
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        if git {
            sha1.update(&buf[..n]);
        } else {
            sha256.update(&buf[..n]);
        }
    }
    let got = if git {
        hex::encode(sha1.finalize())
    } else {
        hex::encode(sha256.finalize())
    };
    if got.eq_ignore_ascii_case(expected.etag()) {
        Ok(())
    } else {
        Err(format!(
            "{} has {} {got}, the Hub lists {}",
            path.display(),
            expected.kind(),
            expected.etag()
        ))
    }
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
        let e = check(&p, &git).unwrap_err();
        assert!(e.contains("git sha1") && e.contains("ce013625"), "{e}");
        assert!(check(&p, &sha).unwrap_err().contains("sha256"));
        // Empty file: git's well-known empty blob.
        std::fs::write(&p, b"").unwrap();
        check(
            &p,
            &Expected::GitSha1("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391".into()),
        )
        .unwrap();
    }
}
