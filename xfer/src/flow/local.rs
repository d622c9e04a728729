//! A model placed from a hashed tree on this node's own disk into its own
//! store, outside the swarm: a sync's source node that is also a member
//! gets its copy this way while the others are pushed theirs. The transfer
//! is the store's own ([`Store::begin`], [`Transfer::stage_local`] per
//! file, [`Transfer::finish`]), so the copy ends as a received model does:
//! staged, every chunk checked against the manifest, placed, recorded. A
//! [`Watcher`] follows it as it follows a received transfer.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::flow::receiver::Watcher;
use crate::store::local::{Copied, LocalCopyError, LocalSource};
use crate::store::scan::SourceTree;
use crate::store::{Store, StoreError, Transfer};
use xfer_proto::hash::Hash;
use xfer_proto::names::ModelName;

/// What a local placement did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Placed {
    /// The model's root.
    pub root: Hash,
    /// Files linked (the agent's own staged files).
    pub linked: usize,
    /// Files cloned (reflink).
    pub reflinked: usize,
    /// Files copied byte for byte.
    pub copied: usize,
    /// Bytes of the files cloned or copied (not those held already).
    pub bytes: u64,
}

/// Places `tree` as `name` in `store`, file by file from its sources;
/// stops before the next file once `cancel` is cancelled. Blocking: call
/// it off the runtime's threads.
pub fn place(
    store: &Store,
    name: &ModelName,
    (tree, source): (&SourceTree, LocalSource),
    watcher: &dyn Watcher,
    cancel: &CancellationToken,
) -> Result<Placed, LocalCopyError> {
    let transfer = Arc::new(store.begin(name, Arc::new(tree.manifest.clone()))?);
    watcher.receiving(name, transfer.clone(), Arc::default());
    let placed = place_files(&transfer, (tree, source), cancel);
    transfer.release();
    watcher.ended(name, placed.as_ref().err().map(|e| e.to_string()));
    placed
}

fn place_files(
    transfer: &Transfer,
    (tree, source): (&SourceTree, LocalSource),
    cancel: &CancellationToken,
) -> Result<Placed, LocalCopyError> {
    let mut placed = Placed::default();
    for (i, (src, entry)) in tree.sources.iter().zip(tree.manifest.files()).enumerate() {
        if cancel.is_cancelled() {
            return Err(StoreError::Invalid(format!(
                "the local copy of `{}` was cancelled",
                transfer.name()
            ))
            .into());
        }
        match transfer.stage_local(i as u32, src, source)? {
            Copied::Held => continue,
            Copied::Link => placed.linked += 1,
            Copied::Reflink => placed.reflinked += 1,
            Copied::Copy => placed.copied += 1,
        }
        placed.bytes += entry.size;
    }
    placed.root = transfer.finish()?;
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::receive::Tally;
    use std::sync::Mutex;

    /// Records what it is told.
    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);

    impl Watcher for Seen {
        fn receiving(&self, name: &ModelName, _: Arc<Transfer>, _: Arc<Tally>) {
            self.0.lock().unwrap().push(format!("receiving {name}"));
        }
        fn ended(&self, name: &ModelName, error: Option<String>) {
            let e = error.unwrap_or_else(|| "ok".into());
            self.0.lock().unwrap().push(format!("ended {name}: {e}"));
        }
    }

    fn tree(dir: &std::path::Path) -> SourceTree {
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let big: Vec<u8> = (0..(3 << 16) + 5).map(|i| (i * 7) as u8).collect();
        std::fs::write(dir.join("sub/w.bin"), &big).unwrap();
        std::fs::write(dir.join("config.json"), b"{}").unwrap();
        std::fs::write(dir.join("empty"), b"").unwrap();
        std::os::unix::fs::symlink("sub/w.bin", dir.join("link")).unwrap();
        crate::store::scan::scan(dir, xfer_proto::hash::MIN_CHUNK_SIZE, &|_| {}).unwrap()
    }

    #[test]
    fn a_local_tree_is_placed_and_recorded_as_a_received_one() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        let tree = tree(&src);
        let store = Store::open(&t.path().join("root")).unwrap();
        let name = ModelName::new("m").unwrap();
        let seen = Seen::default();
        let cancel = CancellationToken::new();
        let placed = place(&store, &name, (&tree, LocalSource::Foreign), &seen, &cancel).unwrap();
        assert_eq!(placed.root, tree.manifest.root());
        assert_eq!(placed.reflinked + placed.copied, 2, "{placed:?}");
        assert_eq!(placed.bytes, (3 << 16) + 5 + 2);
        let rec = store.record(&name).expect("a complete record");
        assert_eq!(rec.manifest.root, tree.manifest.root());
        let dir = store.model_dir(&name);
        for f in ["sub/w.bin", "config.json", "empty"] {
            assert_eq!(
                std::fs::read(dir.join(f)).unwrap(),
                std::fs::read(src.join(f)).unwrap(),
                "{f}"
            );
        }
        assert_eq!(
            std::fs::read_link(dir.join("link")).unwrap(),
            std::path::Path::new("sub/w.bin")
        );
        assert!(!store.root().join(".xfer/staging/m").exists());
        assert_eq!(*seen.0.lock().unwrap(), ["receiving m", "ended m: ok"]);
        // Again: everything is held, nothing is copied.
        let again = place(&store, &name, (&tree, LocalSource::Foreign), &seen, &cancel).unwrap();
        assert_eq!((again.reflinked, again.copied, again.bytes), (0, 0, 0));
    }

    #[test]
    fn a_cancelled_placement_copies_nothing_and_records_nothing() {
        let t = tempfile::tempdir().unwrap();
        let tree = tree(&t.path().join("src"));
        let store = Store::open(&t.path().join("root")).unwrap();
        let name = ModelName::new("m").unwrap();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let e = place(
            &store,
            &name,
            (&tree, LocalSource::Foreign),
            &Seen::default(),
            &cancel,
        )
        .unwrap_err();
        assert!(e.to_string().contains("cancelled"), "{e}");
        assert!(store.record_any(&name).is_none());
        assert!(!store.model_dir(&name).join("sub/w.bin").exists());
    }
}
