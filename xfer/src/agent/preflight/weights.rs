//! The model at the plan's path on this node, as the agent's store knows
//! it: `<COMMIT>` resolved from the repo's `refs/`, the store model that
//! holds the path, its state and manifest root, and every manifest file
//! under the path present on disk with its size (snapshot symlinks
//! followed into `blobs/`).

use std::collections::HashMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

use super::WeightFacts;
use crate::store::Store;
use xfer_proto::admin::ModelState;
use xfer_proto::manifest::{Entry, Manifest};
use xfer_proto::names::ModelName;
use xfer_proto::relpath::RelPath;

/// The placeholder the launcher writes for a snapshot's commit.
const COMMIT_PLACEHOLDER: &str = "<COMMIT>";

/// Most missing or wrong-size files listed one by one.
const MAX_FILE_PROBLEMS: usize = 5;

/// Looks at `model_path` on this node. `states` maps model names to what
/// `xfer status` says of them.
pub fn weights(
    store: &Store,
    states: &HashMap<String, ModelState>,
    model_path: &str,
    revision: Option<&str>,
) -> WeightFacts {
    let root = store.root();
    let mut f = WeightFacts {
        path: model_path.to_string(),
        store_root: root.display().to_string(),
        ..WeightFacts::default()
    };

    // The path to look at: `<COMMIT>` resolved, or None when it cannot be.
    let resolved = match resolve_commit(model_path, revision) {
        Ok(None) => Some(PathBuf::from(model_path)),
        Ok(Some((path, commit))) => {
            f.path = path.clone();
            f.commit = Some(commit);
            Some(PathBuf::from(path))
        }
        Err(problem) => {
            f.problems.push(problem.to_string());
            None
        }
    };
    // Which model holds it: the first component below the root (the
    // repo folder tells when `<COMMIT>` could not be resolved).
    let lookup = resolved.clone().unwrap_or_else(|| {
        PathBuf::from(model_path.split(COMMIT_PLACEHOLDER).next().unwrap_or(""))
    });
    let Some(rel) = below(root, &lookup) else {
        f.problems.push(format!(
            "{model_path} is not under the agent's root {}; sync the model with xfer so every node holds it at the same path",
            root.display()
        ));
        return f;
    };
    let mut parts = rel.iter();
    let Some(name) = parts.next().map(|s| s.as_str()) else {
        f.problems.push(format!(
            "{model_path} is the agent's root itself; point the model path at a model folder under it"
        ));
        return f;
    };
    let sub: Vec<&str> = parts.map(|s| s.as_str()).collect();
    f.model = Some(name.to_string());

    let record = ModelName::new(name).ok().and_then(|n| store.record(&n));
    f.state = states
        .get(name)
        .copied()
        .or_else(|| record.as_ref().map(|_| ModelState::Complete));
    f.root = record.as_ref().map(|r| r.manifest.root);
    let Some(state) = f.state else {
        f.problems.push(format!(
            "{name} is not held by the xfer agent on this node (root {}); run `xfer sync` to it",
            root.display()
        ));
        return f;
    };
    if !matches!(state, ModelState::Complete | ModelState::Verifying) {
        f.problems.push(format!(
            "{name} is {} on this node, not complete; see `xfer status` and wait for it or sync it again",
            state.label()
        ));
    }
    let hub_named = ModelName::new(name).is_ok_and(|n| crate::store::hub_layout::is_hub_name(&n));
    if hub_named && record.as_ref().is_some_and(|r| !r.blobs_checked) {
        let repo = name.splitn(3, "--").skip(1).collect::<Vec<_>>().join("/");
        f.problems.push(format!(
            "{name} is a Hub cache name, and its record does not say each blob was checked against its name (an older xfer placed it); sync it again (`xfer sync hf://{repo}`), which checks the blobs it keeps"
        ));
    }
    let (Some(record), Some(_)) = (record, resolved) else {
        return f;
    };
    let manifest = &record.manifest.manifest;
    let dir = store.root().join(name);
    let wanted = files_under(manifest, &sub.join("/"));
    if wanted.is_empty() {
        f.problems.push(format!(
            "{} holds none of the files of {name} (its manifest has nothing under `{}`); check the model path and revision",
            f.path,
            sub.join("/")
        ));
        return f;
    }
    let strip = if sub.is_empty() {
        0
    } else {
        sub.join("/").len() + 1
    };
    let mut bad = Vec::new();
    for (path, file, size) in wanted {
        f.bytes_total += size;
        // Follows the snapshot's symlinks into blobs/.
        let shown = path.as_str().get(strip..).unwrap_or(path.as_str());
        let shown = if shown.is_empty() {
            path.as_str()
        } else {
            shown
        };
        match fs::metadata(path.under(&dir)) {
            // The bytes the record verified, by their stamps: a file
            // replaced or rewritten since is not vouched for.
            Ok(m) if m.is_file() && m.len() == size => match record.changed(&dir, &file) {
                None => f.bytes_present += size,
                Some(why) => bad.push(format!(
                    "{why}; run `xfer verify {}` or sync the model again",
                    dir.display()
                )),
            },
            Ok(m) if m.is_file() => bad.push(format!(
                "{shown}: {} bytes, the manifest says {size}",
                m.len()
            )),
            Ok(_) => bad.push(format!("{shown}: not a file")),
            Err(_) => bad.push(format!("{shown}: missing")),
        }
    }
    let more = bad.len().saturating_sub(MAX_FILE_PROBLEMS);
    f.problems.extend(bad.into_iter().take(MAX_FILE_PROBLEMS));
    if more > 0 {
        f.problems.push(format!("... and {more} more"));
    }
    f
}

/// Why a model path's `<COMMIT>` does not resolve: one of the weights
/// check's problems.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum CommitError {
    /// `<COMMIT>` not right under `snapshots/`.
    #[error("{0}: {COMMIT_PLACEHOLDER} must stand for the folder under `<repo>/snapshots/`; fix the model path")]
    Misplaced(String),
    /// No such ref (nor a commit given as the revision).
    #[error(
        "refs/{rev} not found in {dir}: the repo is not on this node; run `xfer sync ORG/NAME`"
    )]
    NoRef {
        /// The revision.
        rev: String,
        /// The repo's folder.
        dir: String,
    },
}

/// Resolves `<dir>/snapshots/<COMMIT>[/...]` from `<dir>/refs/<revision>`
/// (`main` by default): the path and the commit, or None when there is no
/// placeholder.
fn resolve_commit(
    model_path: &str,
    revision: Option<&str>,
) -> Result<Option<(String, String)>, CommitError> {
    let Some((before, after)) = model_path.split_once(COMMIT_PLACEHOLDER) else {
        return Ok(None);
    };
    let Some(dir) = before.strip_suffix("/snapshots/") else {
        return Err(CommitError::Misplaced(model_path.to_string()));
    };
    let rev = revision.unwrap_or("main");
    let refs = Path::new(dir).join("refs");
    // A revision that climbs out of refs/ would read some other file.
    let commit = if rev.is_empty() || rev.starts_with('/') || rev.split('/').any(|c| c == "..") {
        None
    } else {
        fs::read_to_string(refs.join(rev))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    // Downloading by commit writes no ref: the revision is the commit.
    let commit = commit.or_else(|| xfer_proto::repo::is_commit_sha(rev).then(|| rev.to_string()));
    match commit {
        Some(c) if !c.contains('/') && c != "." && c != ".." => {
            Ok(Some((format!("{before}{c}{after}"), c)))
        }
        _ => Err(CommitError::NoRef {
            rev: rev.to_string(),
            dir: dir.to_string(),
        }),
    }
}

/// `path` relative to `root`, as names; None when it is not below it.
fn below(root: &Path, path: &Path) -> Option<Vec<String>> {
    fn names(p: &Path) -> Option<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        for c in p.components() {
            match c {
                Component::Normal(s) => out.push(s.to_str()?.to_string()),
                Component::ParentDir => {
                    out.pop()?;
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        Some(out)
    }
    if !path.is_absolute() {
        return None;
    }
    let lexical = |root: &Path| -> Option<Vec<String>> {
        let (r, p) = (names(root)?, names(path)?);
        p.starts_with(&r).then(|| p[r.len()..].to_vec())
    };
    lexical(root).or_else(|| {
        // The root through a symlink (`/var/lib/xfer -> /data/xfer`).
        let real = fs::canonicalize(root).ok()?;
        lexical(&real)
    })
}

/// The manifest's files at or under `sub` (all when empty), with symlinks
/// resolved to the file they name: (path as listed, that file, its size).
fn files_under(m: &Manifest, sub: &str) -> Vec<(RelPath, RelPath, u64)> {
    let under = |p: &RelPath| {
        sub.is_empty()
            || p.as_str() == sub
            || p.as_str()
                .strip_prefix(sub)
                .is_some_and(|r| r.starts_with('/'))
    };
    let by_path: HashMap<&str, &Entry> = m.entries.iter().map(|e| (e.path().as_str(), e)).collect();
    fn file_of<'a>(by_path: &HashMap<&str, &'a Entry>, mut e: &'a Entry) -> Option<(RelPath, u64)> {
        // Links to links, a few deep at most.
        for _ in 0..8 {
            match e {
                Entry::File(f) => return Some((f.path.clone(), f.size)),
                Entry::Symlink { path, target } => {
                    let to = path.resolve_link(target)?;
                    e = by_path.get(to.as_str())?;
                }
                Entry::Dir { .. } => return None,
            }
        }
        None
    }
    m.entries
        .iter()
        .filter(|e| under(e.path()))
        .filter_map(|e| {
            let (file, size) = file_of(&by_path, e)?;
            Some((e.path().clone(), file, size))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
    const REPO: &str = "models--Qwen--Qwen3-8B";

    /// A store holding a Hugging Face cache folder of two weights files
    /// and a config, recorded complete.
    fn hub_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let repo = dir.path().join(REPO);
        fs::create_dir_all(repo.join("blobs")).unwrap();
        fs::create_dir_all(repo.join("refs")).unwrap();
        let snap = repo.join("snapshots").join(COMMIT);
        fs::create_dir_all(&snap).unwrap();
        fs::write(repo.join("refs/main"), format!("{COMMIT}\n")).unwrap();
        for (name, blob, len) in [
            ("config.json", "aaaa", 10usize),
            ("model-00001-of-00002.safetensors", "bbbb", 3000),
            ("model-00002-of-00002.safetensors", "cccc", 2000),
        ] {
            fs::write(repo.join("blobs").join(blob), vec![7u8; len]).unwrap();
            std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snap.join(name)).unwrap();
        }
        let tree =
            crate::store::scan::scan(&repo, xfer_proto::hash::MIN_CHUNK_SIZE, &|_| {}).unwrap();
        store
            .adopt(&ModelName::new(REPO).unwrap(), &tree.manifest, None, &[])
            .unwrap();
        (dir, store)
    }

    fn snapshot(store: &Store, commit: &str) -> String {
        format!("{}/{REPO}/snapshots/{commit}", store.root().display())
    }

    #[test]
    fn a_complete_snapshot_through_commit() {
        let (_dir, store) = hub_store();
        let f = weights(
            &store,
            &HashMap::new(),
            &snapshot(&store, COMMIT_PLACEHOLDER),
            None,
        );
        assert_eq!(f.problems, Vec::<String>::new());
        assert_eq!(f.path, snapshot(&store, COMMIT));
        assert_eq!(f.commit.as_deref(), Some(COMMIT));
        assert_eq!(f.model.as_deref(), Some(REPO));
        assert_eq!(f.state, Some(ModelState::Complete));
        let rec = store.record(&ModelName::new(REPO).unwrap()).unwrap();
        assert_eq!(f.root, Some(rec.manifest.root));
        assert_eq!(f.bytes_total, 5010);
        assert_eq!(f.bytes_present, 5010);
        assert_eq!(f.store_root, store.root().display().to_string());
        // The whole repo folder counts blobs and the ref too.
        let whole = format!("{}/{REPO}", store.root().display());
        let f = weights(&store, &HashMap::new(), &whole, None);
        assert!(f.problems.is_empty(), "{:?}", f.problems);
        assert!(f.bytes_total > 5010);
    }

    #[test]
    fn a_hub_named_record_without_its_blob_check_is_refused() {
        let (_dir, store) = hub_store();
        let name = ModelName::new(REPO).unwrap();
        let rec_path = store.record_path(&name);
        let mut rec: serde_json::Value =
            serde_json::from_slice(&fs::read(&rec_path).unwrap()).unwrap();
        rec.as_object_mut().unwrap().remove("blobs_checked");
        fs::write(&rec_path, serde_json::to_vec(&rec).unwrap()).unwrap();
        let f = weights(&store, &HashMap::new(), &snapshot(&store, COMMIT), None);
        assert_eq!(f.problems.len(), 1, "{:?}", f.problems);
        assert!(
            f.problems[0].contains("does not say each blob was checked")
                && f.problems[0].contains("xfer sync hf://Qwen/Qwen3-8B"),
            "{}",
            f.problems[0]
        );
    }

    #[test]
    fn missing_and_wrong_size_files() {
        let (_dir, store) = hub_store();
        let blobs = store.root().join(REPO).join("blobs");
        fs::remove_file(blobs.join("bbbb")).unwrap();
        fs::write(blobs.join("cccc"), b"short").unwrap();
        let states = HashMap::from([(REPO.to_string(), ModelState::Complete)]);
        let f = weights(&store, &states, &snapshot(&store, COMMIT), None);
        assert_eq!(
            f.problems,
            vec![
                "model-00001-of-00002.safetensors: missing".to_string(),
                "model-00002-of-00002.safetensors: 5 bytes, the manifest says 2000".to_string(),
            ]
        );
        assert_eq!((f.bytes_total, f.bytes_present), (5010, 10));
    }

    #[test]
    fn at_most_five_files_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let m = dir.path().join("m");
        fs::create_dir_all(&m).unwrap();
        for i in 0..8 {
            fs::write(m.join(format!("f{i}")), [i as u8; 3]).unwrap();
        }
        let tree = crate::store::scan::scan(&m, xfer_proto::hash::MIN_CHUNK_SIZE, &|_| {}).unwrap();
        store
            .adopt(&ModelName::new("m").unwrap(), &tree.manifest, None, &[])
            .unwrap();
        fs::remove_dir_all(&m).unwrap();
        let f = weights(&store, &HashMap::new(), &m.display().to_string(), None);
        assert_eq!(f.problems.len(), 6, "{:?}", f.problems);
        assert_eq!(f.problems[0], "f0: missing");
        assert_eq!(f.problems[5], "... and 3 more");
        assert_eq!((f.bytes_total, f.bytes_present), (24, 0));
    }

    #[test]
    fn an_unknown_revision() {
        let (_dir, store) = hub_store();
        let f = weights(
            &store,
            &HashMap::new(),
            &snapshot(&store, COMMIT_PLACEHOLDER),
            Some("v2"),
        );
        let dir = format!("{}/{REPO}", store.root().display());
        assert_eq!(
            f.problems,
            vec![format!(
                "refs/v2 not found in {dir}: the repo is not on this node; run `xfer sync ORG/NAME`"
            )]
        );
        // The model is still named, with its state.
        assert_eq!(f.model.as_deref(), Some(REPO));
        assert_eq!(f.state, Some(ModelState::Complete));
        assert_eq!(f.commit, None);
        // A commit as the revision needs no ref.
        let f = weights(
            &store,
            &HashMap::new(),
            &snapshot(&store, COMMIT_PLACEHOLDER),
            Some(COMMIT),
        );
        assert!(f.problems.is_empty(), "{:?}", f.problems);
        // A snapshot the manifest does not have.
        let other = "f".repeat(40);
        let f = weights(&store, &HashMap::new(), &snapshot(&store, &other), None);
        assert_eq!(f.problems.len(), 1);
        assert!(
            f.problems[0].contains("holds none of the files"),
            "{:?}",
            f.problems
        );
    }

    #[test]
    fn outside_the_root_or_not_held() {
        let (_dir, store) = hub_store();
        let f = weights(&store, &HashMap::new(), "/elsewhere/model", None);
        assert_eq!(
            f.problems,
            vec![format!(
                "/elsewhere/model is not under the agent's root {}; sync the model with xfer so every node holds it at the same path",
                store.root().display()
            )]
        );
        assert_eq!(f.model, None);
        let escape = format!("{}/../x", store.root().display());
        assert!(weights(&store, &HashMap::new(), &escape, None).problems[0]
            .contains("is not under the agent's root"));
        let path = format!("{}/models--Other--M/snapshots/x", store.root().display());
        let f = weights(&store, &HashMap::new(), &path, None);
        assert_eq!(
            f.problems,
            vec![format!(
                "models--Other--M is not held by the xfer agent on this node (root {}); run `xfer sync` to it",
                store.root().display()
            )]
        );
        assert_eq!(f.model.as_deref(), Some("models--Other--M"));
        assert_eq!(f.state, None);
    }

    #[test]
    fn a_model_still_syncing() {
        let (_dir, store) = hub_store();
        let path = format!("{}/models--Other--M", store.root().display());
        let states = HashMap::from([("models--Other--M".to_string(), ModelState::Syncing)]);
        let f = weights(&store, &states, &path, None);
        assert_eq!(f.state, Some(ModelState::Syncing));
        assert_eq!(f.root, None);
        assert_eq!(f.problems.len(), 1);
        assert!(f.problems[0].starts_with("models--Other--M is syncing on this node, not complete"));
    }

    #[test]
    fn commit_placeholder_must_be_a_snapshot() {
        assert!(resolve_commit("/a/<COMMIT>", None)
            .unwrap_err()
            .to_string()
            .contains("must stand for the folder under"));
        assert_eq!(resolve_commit("/a/b", None), Ok(None));
        assert!(resolve_commit("/a/snapshots/<COMMIT>", Some("../../etc/passwd")).is_err());
    }
}
