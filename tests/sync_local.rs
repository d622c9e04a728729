//! A sync's source node that is also a member places its own copy from
//! its disk, outside the swarm (issue 33): the copy is byte-identical and
//! recorded complete, the node got no chunk over the network for it, and
//! the other members are complete; a source file changed after it was
//! hashed fails that copy naming the file, with nothing under its final
//! name and no record.

use crate::common;

use std::fs;
use std::path::Path;

use tokio_util::sync::CancellationToken;
use xfer::flow::local::place;
use xfer::flow::receive::Tally;
use xfer::flow::receiver::Watcher;
use xfer::store::local::{LocalCopyError, LocalSource};
use xfer::store::{Store, Transfer};
use xfer_proto::names::ModelName;

use common::cluster::*;
use common::*;

/// 1. `xfer sync --from a --nodes a,b,c` of an exported folder: a's copy
///    is the folder's, byte for byte, with a complete record, and none of
///    it came from the source or a peer (today a pushed it to itself over
///    QUIC); b and c got theirs through the swarm.
#[test]
fn the_source_node_places_its_own_copy_outside_the_swarm() {
    let c = Cluster::start("sync-local", 21, &["a", "b", "c"], &[]);
    let src = c.dir.path().join("src/ml");
    gen_model(&src, 24 * MIB, 21);
    let want = manifest_root(&src);
    let total = tree_bytes(&src);

    let (id, _) = c.sync(&src, &["--from", "a", "--nodes", "a,b,c"]);
    let root = c.wait_complete(&id, "a", &["a", "b", "c"], "ml");
    assert_eq!(root, want, "the root the nodes report is the source's");

    let s = c.status();
    for n in ["a", "b", "c"] {
        assert_same_tree(&src, &c.root(n).join("ml"));
        let m = s.model(n, "ml").unwrap();
        assert_eq!(m.bytes_held, total, "{n}: {m:#?}");
    }
    assert!(
        c.root("a").join(".xfer/models/ml.json").is_file(),
        "a's copy has its record"
    );
    assert!(
        !c.root("a").join(".xfer/staging/ml").exists(),
        "a's staging area is gone"
    );
    let a = s.model("a", "ml").unwrap();
    assert_eq!(
        (a.from_source, a.from_peers),
        (0, 0),
        "a received chunks over the network for its own copy: {a:#?}\n{}",
        c.logs()
    );
    let job = s.job("a", &id).expect("the source knows the job");
    for n in ["a", "b", "c"] {
        let t = job
            .delivered
            .iter()
            .find(|t| t.node == n)
            .unwrap_or_else(|| panic!("no tally of {n}: {job:#?}"));
        assert!(t.ok && t.error.is_none(), "{n}: {t:#?}");
        let moved = t.from_source + t.from_peers;
        if n == "a" {
            assert_eq!(moved, 0, "a's tally: {t:#?}");
        } else {
            assert_eq!(moved, total, "{n}'s tally: {t:#?}");
        }
    }
    assert!(
        c.member("a")
            .agent
            .as_ref()
            .unwrap()
            .log()
            .contains("ml placed here from"),
        "a's log says how it got its copy:\n{}",
        c.logs()
    );
}

/// Follows nothing.
struct Nobody;

impl Watcher for Nobody {
    fn receiving(&self, _: &ModelName, _: std::sync::Arc<Transfer>, _: std::sync::Arc<Tally>) {}
    fn ended(&self, _: &ModelName, _: Option<String>) {}
}

/// The largest file of `dir`, relative to it.
fn largest(dir: &Path) -> String {
    let tree = walk(dir);
    tree.iter()
        .filter_map(|(p, n)| match n {
            Node::File { len, .. } => Some((*len, p.clone())),
            _ => None,
        })
        .max()
        .expect("a file")
        .1
}

/// 2. A source file changed (same size, one byte) after the tree was
///    hashed: the local copy fails naming the file and the chunk, and
///    leaves nothing under the file's final name, no record and no
///    staged copy.
#[test]
fn a_source_file_changed_after_hashing_fails_the_local_copy() {
    let t = tempdir("sync-local-changed");
    let src = t.path().join("src/mc");
    gen_model(&src, 12 * MIB, 22);
    let tree = xfer::store::scan::scan(&src, 4 << 20, &|_| {}).unwrap();
    let rel = largest(&src);
    let path = src.join(&rel);
    let mut bytes = fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5a;
    fs::write(&path, &bytes).unwrap();

    let store = Store::open(&t.path().join("root")).unwrap();
    let name = ModelName::new("mc").unwrap();
    let err = place(
        &store,
        &name,
        (&tree, LocalSource::Foreign),
        &Nobody,
        &CancellationToken::new(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, LocalCopyError::Changed { path: p, .. } if p == &path),
        "{err:?}"
    );
    let line = err.to_string();
    assert!(
        line.contains(&path.display().to_string())
            && line.contains("changed after it was hashed")
            && line.contains(&format!("chunk {}", at as u64 / (4 << 20))),
        "{line}"
    );
    assert!(!line.contains('\n'), "one line: {line}");
    assert!(
        !store.model_dir(&name).join(&rel).exists(),
        "{rel} is under its final name"
    );
    assert!(store.record_any(&name).is_none(), "a record was written");
    let staged = t.path().join("root/.xfer/staging/mc/data");
    let leftovers: Vec<_> = fs::read_dir(&staged)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        leftovers
            .iter()
            .all(|n| !n.to_string_lossy().ends_with(".local")),
        "a copy that failed its check stays staged: {leftovers:?}"
    );
}
