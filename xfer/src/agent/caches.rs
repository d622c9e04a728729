//! A rank's compile caches, materialised from their verified snapshot
//! before the rank starts ([`CacheGate`], `[launch] caches`).
//!
//! The snapshot `<root>/<name>` is an ordinary model: delivered by the
//! agents, verified chunk by chunk, recorded. The engine never sees it: it
//! reads and writes the live folder `<root>/.xfer-caches/<name>/<kind>`,
//! which its variable (`VLLM_CACHE_ROOT`, ...) names. Before the rank
//! starts, every file of the snapshot under a gate's kind that the live
//! folder lacks is read (never through a symlink), hashed again against
//! the snapshot's manifest, and written into the live folder; a file the
//! engine already has is kept (compile caches name their entries by the
//! hash of what they hold). Both paths are built here from the gate's
//! checked name and kinds: nothing a launcher sends names a path.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use xfer_proto::admin::ModelState;
use xfer_proto::compile_cache::{CacheGate, LIVE_DIR};
use xfer_proto::manifest::Entry;

use crate::store::Store;
use crate::util::beneath::Root;

/// What materialising did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Materialised {
    /// Files copied into the live folder.
    pub copied: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Files the live folder already had.
    pub kept: usize,
}

/// Materialises `gate` on this node (see the module's header), or says in
/// one line why the rank must not start: the snapshot is not held
/// complete with the gate's root, or a file of it no longer matches its
/// verified hash.
pub fn materialise(
    store: &Store,
    states: &HashMap<String, ModelState>,
    node: &str,
    rank: u32,
    gate: &CacheGate,
) -> Result<Materialised, String> {
    let name = gate
        .check()
        .map_err(|e| format!("{node}: not starting rank {rank}: {e}"))?;
    let snapshot = store.root().join(name.as_str());
    let facts =
        super::preflight::weights::weights(store, states, &snapshot.display().to_string(), None);
    let fix = format!(
        "remove it with `xfer rm {name} --nodes {node}` and run xfer-launch up again (the rank then starts with a cold cache, and the head offers its own after the start)"
    );
    if let Some(problem) = facts.problems.first() {
        return Err(format!(
            "{node}: not starting rank {rank}: compile cache {name}: {problem}; {fix}"
        ));
    }
    let record = store.record(&name).filter(|r| r.manifest.root == gate.root);
    let (Some(record), Some(ModelState::Complete)) = (record, facts.state) else {
        return Err(format!(
            "{node}: not starting rank {rank}: compile cache {name} is {} with root {}, where the launch checked root {}; {fix}",
            facts.state.map_or("not held", |s| s.label()),
            facts.root.map_or("none".to_string(), |r| r.short().to_string()),
            gate.root.short()
        ));
    };
    let fs = Root::open(store.root()).map_err(|e| {
        format!(
            "{node}: not starting rank {rank}: cannot open the root {}: {e}",
            store.root().display()
        )
    })?;
    let live = Path::new(LIVE_DIR).join(name.as_str());
    let mut done = Materialised::default();
    for kind in &gate.kinds {
        fs.create_dir_all(&live.join(kind))
            .map_err(|e| format!("{node}: not starting rank {rank}: {e}"))?;
    }
    for entry in &record.manifest.manifest.entries {
        let Entry::File(f) = entry else { continue };
        let rel = f.path.as_str();
        let in_kind = gate.kinds.iter().any(|k| {
            rel.strip_prefix(k.as_str())
                .is_some_and(|r| r.starts_with('/'))
        });
        if !in_kind {
            continue;
        }
        let dest: PathBuf = live.join(rel);
        if fs.open_read(&dest).is_ok() {
            done.kept += 1;
            continue;
        }
        let src = Path::new(name.as_str()).join(rel);
        let bytes = read_all(&fs, &src).map_err(|e| {
            format!("{node}: not starting rank {rank}: compile cache {name}: {e}; {fix}")
        })?;
        if blake3::hash(&bytes).as_bytes() != &f.hash.0 {
            return Err(format!(
                "{node}: not starting rank {rank}: compile cache {name}: {rel} does not match its verified hash (it changed on disk after it was delivered), so none of it is used; {fix}"
            ));
        }
        fs.write_durable(&dest, &bytes)
            .map_err(|e| format!("{node}: not starting rank {rank}: {e}"))?;
        if f.executable {
            use std::os::unix::fs::PermissionsExt;
            let _ =
                std::fs::set_permissions(fs.show(&dest), std::fs::Permissions::from_mode(0o755));
        }
        done.copied += 1;
        done.bytes += f.size;
    }
    Ok(done)
}

/// The whole of `rel` beneath `fs`, never through a symlink.
fn read_all(fs: &Root, rel: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    fs.open_read(rel)?.read_to_end(&mut buf)?;
    Ok(buf)
}
