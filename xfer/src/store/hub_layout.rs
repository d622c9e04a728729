//! A model stored under a Hub cache name (`models--ORG--NAME`, as
//! `huggingface_hub` and vLLM find it) holds the Hub's bytes, whoever
//! delivered it: each blob is named by its content hash (the sha256 of an
//! LFS file, 64 hex digits; the git blob sha1 of a regular one, 40), and
//! a receiver checks a blob against its name before it places it. What an
//! engine loads is a snapshot's name, which must be a link to a blob: a
//! manifest for such a name with a regular file under `snapshots/`, a
//! link that leads elsewhere, a blob not named by a hash, or a top-level
//! folder the cache does not have, is refused when it is offered
//! ([`check_manifest`]).
//!
//! What this cannot tell: which blob a snapshot's name should lead to
//! (that mapping is the Hub's listing for the commit, and the listing a
//! receiver has came from the same source).

use std::io::Read;
use std::path::{Component, Path};

use sha1::Digest as _;
use xfer_proto::manifest::{Entry, Manifest};
use xfer_proto::names::ModelName;
use xfer_proto::relpath::RelPath;

/// The top-level folders of a Hub cache repo folder (`trees/` is xfer's
/// copy of the Hub's listing).
const FOLDERS: [&str; 5] = ["blobs", "snapshots", "refs", "trees", ".no_exist"];

/// Whether `name` is a Hub cache folder's name.
pub fn is_hub_name(name: &ModelName) -> bool {
    ["models--", "datasets--", "spaces--"]
        .iter()
        .any(|p| name.as_str().starts_with(p))
}

/// The hash a blob's name says its content has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobHash {
    /// An LFS file: the sha256 of its bytes.
    Sha256([u8; 32]),
    /// A regular git file: the sha1 of `blob <len>\0<bytes>`.
    GitSha1([u8; 20]),
}

/// The hash `path` (`blobs/<hex>`) names, if it is a blob's path.
pub fn blob_hash(path: &RelPath) -> Option<BlobHash> {
    let name = path.as_str().strip_prefix("blobs/")?;
    if name
        .bytes()
        .any(|b| !matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let bytes = hex::decode(name).ok()?;
    match bytes.len() {
        32 => Some(BlobHash::Sha256(bytes.try_into().ok()?)),
        20 => Some(BlobHash::GitSha1(bytes.try_into().ok()?)),
        _ => None,
    }
}

/// Why a manifest does not have the shape of a Hub cache repo folder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// A path outside the cache's top-level folders.
    #[error("`{0}` is not under a folder of a Hub cache repo ({folders})", folders = FOLDERS.join(", "))]
    NotInFolder(RelPath),
    /// A blob not named by a hash.
    #[error("`{0}`: a blob is named by its sha256 (64 hex digits) or git sha1 (40)")]
    BlobName(RelPath),
    /// A regular file among a snapshot's names.
    #[error("`{0}` is a file; a snapshot's names are links to blobs")]
    SnapshotFile(RelPath),
    /// A snapshot's name that does not lead to a blob.
    #[error("`{path}` links to `{target}`, not to a blob of this repo folder")]
    NotToBlob {
        /// The link.
        path: RelPath,
        /// Where it leads.
        target: String,
    },
    /// A link outside `snapshots/`.
    #[error("`{path}` links to `{target}`; only a snapshot's names are links")]
    StrayLink {
        /// The link.
        path: RelPath,
        /// Where it leads.
        target: String,
    },
}

/// A blob's bytes hash to another value than its name: the hash they
/// have, in hex.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HashedTo(pub String);

/// Why a blob failed its check against its name.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// It could not be read.
    #[error("cannot read `{path}` to check it against its name: {why}")]
    Unreadable {
        /// The blob.
        path: RelPath,
        /// What the system said.
        why: std::io::Error,
    },
    /// Its bytes are not the ones its name says.
    #[error("`{path}` hashes to {got}, not to its name: it is not the Hub's file")]
    Mismatch {
        /// The blob.
        path: RelPath,
        /// What it hashes to.
        got: HashedTo,
    },
}

/// `Ok` when `m` has the shape of a Hub cache repo folder; else why not.
pub fn check_manifest(m: &Manifest) -> Result<(), ShapeError> {
    for e in &m.entries {
        let path = e.path();
        let top = path.as_str().split('/').next().unwrap_or_default();
        if !FOLDERS.contains(&top) {
            return Err(ShapeError::NotInFolder(path.clone()));
        }
        match e {
            Entry::File(_) if top == "blobs" && blob_hash(path).is_none() => {
                return Err(ShapeError::BlobName(path.clone()));
            }
            Entry::File(_) if top == "snapshots" => {
                return Err(ShapeError::SnapshotFile(path.clone()));
            }
            Entry::Symlink { target, .. } if top == "snapshots" => {
                let to = lexical_target(path, target);
                if to
                    .as_deref()
                    .and_then(|t| RelPath::new(t).ok())
                    .and_then(|t| blob_hash(&t))
                    .is_none()
                {
                    return Err(ShapeError::NotToBlob {
                        path: path.clone(),
                        target: target.clone(),
                    });
                }
            }
            Entry::Symlink { target, .. } => {
                return Err(ShapeError::StrayLink {
                    path: path.clone(),
                    target: target.clone(),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Where the link `path` -> `target` leads, relative to the repo folder
/// (`None` when it leaves it or is absolute).
fn lexical_target(path: &RelPath, target: &str) -> Option<String> {
    let mut parts: Vec<&str> = path.as_str().split('/').collect();
    parts.pop();
    for c in Path::new(target).components() {
        match c {
            Component::Normal(s) => parts.push(s.to_str()?),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts.join("/"))
}

/// Checks each blob among `paths` (relative to the repo folder `dir`;
/// paths that are not blobs are skipped) against its name; why the first
/// that fails does.
pub fn check_blobs<'a>(
    dir: &Path,
    paths: impl IntoIterator<Item = &'a RelPath>,
) -> Result<(), BlobError> {
    for path in paths {
        let Some(want) = blob_hash(path) else {
            continue;
        };
        let at = path.under(dir);
        let checked = std::fs::File::open(&at)
            .and_then(|mut f| {
                let size = f.metadata()?.len();
                check_blob(&mut f, size, want)
            })
            .map_err(|why| BlobError::Unreadable {
                path: path.clone(),
                why,
            })?;
        if let Err(got) = checked {
            return Err(BlobError::Mismatch {
                path: path.clone(),
                got,
            });
        }
    }
    Ok(())
}

/// Reads `file` (`size` bytes) to its end and checks it against `want`;
/// the hash it has, in hex, when it differs.
pub fn check_blob(
    file: &mut impl Read,
    size: u64,
    want: BlobHash,
) -> std::io::Result<Result<(), HashedTo>> {
    let mut buf = vec![0u8; 1 << 20];
    let mut h = BlobHasher::new(want, size);
    feed(file, &mut buf, |b| h.update(b))?;
    Ok(h.finish())
}

/// A blob's check fed its bytes in order, piece by piece (a receiver feeds
/// each file's chunks as they land in order, so the check is done when the
/// last one lands).
#[derive(Debug)]
pub struct BlobHasher {
    want: BlobHash,
    state: BlobState,
}

#[derive(Debug)]
enum BlobState {
    Sha256(sha2::Sha256),
    GitSha1(sha1::Sha1),
}

impl BlobHasher {
    /// The check of a blob of `size` bytes named `want`.
    pub fn new(want: BlobHash, size: u64) -> BlobHasher {
        let state = match want {
            BlobHash::Sha256(_) => BlobState::Sha256(sha2::Sha256::new()),
            BlobHash::GitSha1(_) => {
                let mut h = sha1::Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                BlobState::GitSha1(h)
            }
        };
        BlobHasher { want, state }
    }

    /// The hash the blob's name says it has.
    pub fn want(&self) -> BlobHash {
        self.want
    }

    /// The blob's next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        match &mut self.state {
            BlobState::Sha256(h) => h.update(bytes),
            BlobState::GitSha1(h) => h.update(bytes),
        }
    }

    /// Whether the bytes fed hash to the blob's name; the hash they have,
    /// in hex, when not.
    pub fn finish(self) -> Result<(), HashedTo> {
        let got = match (self.state, self.want) {
            (BlobState::Sha256(h), BlobHash::Sha256(w)) => {
                let got: [u8; 32] = h.finalize().into();
                (got != w).then(|| hex::encode(got))
            }
            (BlobState::GitSha1(h), BlobHash::GitSha1(w)) => {
                let got: [u8; 20] = h.finalize().into();
                (got != w).then(|| hex::encode(got))
            }
            _ => unreachable!("a BlobHasher's state is made from its want"),
        };
        match got {
            None => Ok(()),
            Some(hex) => Err(HashedTo(hex)),
        }
    }
}

fn feed(file: &mut impl Read, buf: &mut [u8], mut f: impl FnMut(&[u8])) -> std::io::Result<()> {
    loop {
        match file.read(buf)? {
            0 => return Ok(()),
            n => f(&buf[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::manifest::{FileEntry, MANIFEST_VERSION};

    fn rel(s: &str) -> RelPath {
        RelPath::new(s).unwrap()
    }

    #[test]
    fn a_blob_is_checked_against_the_hash_its_name_says() {
        let data = b"hello\n";
        let sha = hex::encode(sha2::Sha256::digest(data));
        let want = blob_hash(&rel(&format!("blobs/{sha}"))).unwrap();
        assert_eq!(check_blob(&mut &data[..], 6, want).unwrap(), Ok(()));
        assert!(check_blob(&mut &b"other!"[..], 6, want).unwrap().is_err());
        // git's own id of "hello\n"
        let git = blob_hash(&rel("blobs/ce013625030ba8dba906f756967f9e9ca394464a")).unwrap();
        assert_eq!(check_blob(&mut &data[..], 6, git).unwrap(), Ok(()));
        for bad in [
            "blobs/xyz",
            "blobs/ABCDEF0123456789ABCDEF0123456789ABCDEF01",
            "refs/main",
            "blobs/ce01",
        ] {
            assert_eq!(blob_hash(&rel(bad)), None, "{bad}");
        }
    }

    fn manifest(entries: Vec<Entry>) -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            chunk_size: 1 << 20,
            entries,
        }
    }

    fn file(p: &str) -> Entry {
        Entry::File(FileEntry {
            path: rel(p),
            size: 0,
            hash: xfer_proto::hash::Hash([0; 32]),
            executable: false,
            chunks: vec![],
        })
    }

    fn link(p: &str, t: &str) -> Entry {
        Entry::Symlink {
            path: rel(p),
            target: t.into(),
        }
    }

    #[test]
    fn only_a_hub_cache_shaped_tree_may_take_a_hub_name() {
        let blob = "blobs/ce013625030ba8dba906f756967f9e9ca394464a";
        let ok = manifest(vec![
            file(blob),
            file("refs/main"),
            link(
                "snapshots/c0/config.json",
                "../../blobs/ce013625030ba8dba906f756967f9e9ca394464a",
            ),
            link(
                "snapshots/c0/sub/a.json",
                "../../../blobs/ce013625030ba8dba906f756967f9e9ca394464a",
            ),
        ]);
        assert_eq!(check_manifest(&ok), Ok(()));
        for (bad, said) in [
            (file("snapshots/c0/model.safetensors"), "is a file"),
            (link("snapshots/c0/m", "../../refs/main"), "not to a blob"),
            (link("snapshots/c0/m", "/etc/passwd"), "not to a blob"),
            (
                link(
                    "snapshots/c0/m",
                    "../../../../x/blobs/ce013625030ba8dba906f756967f9e9ca394464a",
                ),
                "not to a blob",
            ),
            (file("blobs/not-a-hash"), "named by its sha256"),
            (file("model.safetensors"), "not under a folder"),
            (
                link("refs/main", "../blobs/x"),
                "only a snapshot's names are links",
            ),
        ] {
            let e = check_manifest(&manifest(vec![file(blob), bad])).unwrap_err();
            assert!(e.to_string().contains(said), "{e}");
        }
    }

    /// A store holding `models--o--m` with one blob named by its sha256,
    /// recorded complete; then its record's check mark taken away, as an
    /// older xfer wrote it, and the blob's bytes replaced by `bytes` (same
    /// size, stamp put back).
    fn unmarked_store(bytes: &[u8]) -> (tempfile::TempDir, super::super::Store, ModelName) {
        use super::super::Store;
        let good = b"the hub's own bytes";
        assert_eq!(bytes.len(), good.len());
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let name = ModelName::new("models--o--m").unwrap();
        let repo = dir.path().join(name.as_str());
        let blob = hex::encode(sha2::Sha256::digest(good));
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots/c0")).unwrap();
        std::fs::write(repo.join("blobs").join(&blob), good).unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{blob}"),
            repo.join("snapshots/c0/model.safetensors"),
        )
        .unwrap();
        let tree =
            crate::store::scan::scan(&repo, xfer_proto::hash::MIN_CHUNK_SIZE, &|_| {}).unwrap();
        store.adopt(&name, &tree.manifest, None, &[]).unwrap();
        assert!(store.record(&name).unwrap().blobs_checked);
        let at = repo.join("blobs").join(&blob);
        let mtime = std::fs::metadata(&at).unwrap().modified().unwrap();
        std::fs::write(&at, bytes).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&at)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let rec_path = store.record_path(&name);
        let mut rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
        rec.as_object_mut().unwrap().remove("blobs_checked");
        std::fs::write(&rec_path, serde_json::to_vec(&rec).unwrap()).unwrap();
        assert!(!store.record(&name).unwrap().blobs_checked);
        (dir, store, name)
    }

    /// A Hub repo whose one blob is named by the sha256 of `named` and
    /// holds `bytes`, received chunk by chunk in `order` into a fresh
    /// store: what the last write returned.
    fn receive_blob(
        named: &[u8],
        bytes: &[u8],
        order: &[u32],
    ) -> Result<super::super::Written, super::super::ChunkError> {
        use super::super::Store;
        use xfer_proto::hash::MIN_CHUNK_SIZE;
        use xfer_proto::manifest::ChunkId;
        let src = tempfile::tempdir().unwrap();
        let repo = src.path().join("models--o--m");
        let blob = hex::encode(sha2::Sha256::digest(named));
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots/c0")).unwrap();
        std::fs::write(repo.join("blobs").join(&blob), bytes).unwrap();
        std::os::unix::fs::symlink(
            format!("../../blobs/{blob}"),
            repo.join("snapshots/c0/model.safetensors"),
        )
        .unwrap();
        let tree = crate::store::scan::scan(&repo, MIN_CHUNK_SIZE, &|_| {}).unwrap();
        let manifest = std::sync::Arc::new(tree.manifest);
        let file = manifest
            .files()
            .position(|f| f.path.as_str().starts_with("blobs/"))
            .unwrap() as u32;
        assert_eq!(
            manifest.files().nth(file as usize).unwrap().chunks.len(),
            order.len()
        );
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let t = store
            .begin(&ModelName::new("models--o--m").unwrap(), manifest)
            .unwrap();
        let mut last = None;
        for &index in order {
            let at = index as usize * MIN_CHUNK_SIZE as usize;
            let end = (at + MIN_CHUNK_SIZE as usize).min(bytes.len());
            last = Some(t.write_chunk(ChunkId { file, index }, &bytes[at..end]));
        }
        last.unwrap()
    }

    #[test]
    fn a_blob_received_out_of_order_is_checked_as_its_chunks_land() {
        let chunk = xfer_proto::hash::MIN_CHUNK_SIZE as usize;
        let good: Vec<u8> = (0..5 * chunk + 100).map(|i| (i * 31 % 251) as u8).collect();
        let mut bad = good.clone();
        bad[3 * chunk + 7] ^= 1;
        for order in [[0, 1, 2, 3, 4, 5], [2, 0, 1, 5, 4, 3], [5, 4, 3, 2, 1, 0]] {
            assert!(
                matches!(
                    receive_blob(&good, &good, &order),
                    Ok(super::super::Written::FilePlaced(_))
                ),
                "{order:?}"
            );
            // The source's manifest matches the bytes it sent, but they are
            // not the ones the blob's name hashes to.
            let e = receive_blob(&good, &bad, &order).unwrap_err().to_string();
            assert!(e.contains("not to its name"), "{order:?}: {e}");
        }
    }

    #[test]
    fn an_older_record_is_checked_once_then_marked() {
        let (_dir, store, name) = unmarked_store(b"the hub's own bytes");
        assert_eq!(store.check_hub_blobs(&name), Ok(true));
        assert!(store.record(&name).unwrap().blobs_checked);
        assert_eq!(store.check_hub_blobs(&name), Ok(false));
    }

    #[test]
    fn an_older_record_over_other_bytes_is_never_marked() {
        let (_dir, store, name) = unmarked_store(b"an attacker's bytes");
        let e = store.check_hub_blobs(&name).unwrap_err();
        assert!(
            e.contains("not to its name") && e.contains("sync it from the Hub again"),
            "{e}"
        );
        assert!(!store.record(&name).unwrap().blobs_checked);
        // A sync of the same manifest does not keep the poisoned blob: it
        // is pending again, fetched from the source.
        let m = std::sync::Arc::new(store.record(&name).unwrap().manifest.manifest);
        let t = store.begin(&name, m).unwrap();
        let pending = t.pending();
        assert!(
            pending.iter().any(|p| p.as_str().starts_with("blobs/")),
            "{pending:?}"
        );
    }

    #[test]
    fn a_sync_over_an_older_clean_record_keeps_its_blobs() {
        let (_dir, store, name) = unmarked_store(b"the hub's own bytes");
        let m = std::sync::Arc::new(store.record(&name).unwrap().manifest.manifest);
        let t = store.begin(&name, m).unwrap();
        assert!(t.pending().is_empty(), "{:?}", t.pending());
        t.finish().unwrap();
        assert!(store.record(&name).unwrap().blobs_checked);
    }
}
