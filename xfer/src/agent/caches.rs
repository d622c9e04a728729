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
use xfer_proto::names::ModelName;

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

/// Why a rank must not start with its compile caches: one line naming
/// the node, the rank and the fix (the launch service's refusal).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The gate names no compile cache.
    #[error("{node}: not starting rank {rank}: {source}")]
    Gate {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// Why.
        source: xfer_proto::compile_cache::CacheGateError,
    },
    /// The snapshot's weights check found a problem.
    #[error(
        "{node}: not starting rank {rank}: compile cache {name}: {problem}; {}",
        fix(name, node)
    )]
    Problem {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// The snapshot.
        name: ModelName,
        /// The check's line.
        problem: String,
    },
    /// The snapshot is not held complete with the gate's root.
    #[error("{node}: not starting rank {rank}: compile cache {name} is {state} with root {root}, where the launch checked root {want}; {}", fix(name, node))]
    NotHeld {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// The snapshot.
        name: ModelName,
        /// Its state's label, or `not held`.
        state: &'static str,
        /// Its root (short), or `none`.
        root: String,
        /// The gate's root (short).
        want: String,
    },
    /// The agent's root cannot be opened.
    #[error("{node}: not starting rank {rank}: cannot open the root {}: {source}", root.display())]
    Root {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// The agent's root.
        root: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A live folder or file cannot be written.
    #[error("{node}: not starting rank {rank}: {source}")]
    Write {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// Why.
        source: std::io::Error,
    },
    /// A snapshot file cannot be read.
    #[error(
        "{node}: not starting rank {rank}: compile cache {name}: {source}; {}",
        fix(name, node)
    )]
    Read {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// The snapshot.
        name: ModelName,
        /// Why.
        source: std::io::Error,
    },
    /// A snapshot file changed on disk after it was verified.
    #[error("{node}: not starting rank {rank}: compile cache {name}: {rel} does not match its verified hash (it changed on disk after it was delivered), so none of it is used; {}", fix(name, node))]
    Changed {
        /// This node.
        node: String,
        /// The rank.
        rank: u32,
        /// The snapshot.
        name: ModelName,
        /// The file, in the snapshot.
        rel: String,
    },
}

/// What the operator does about a bad snapshot.
fn fix(name: &ModelName, node: &str) -> String {
    format!(
        "remove it with `xfer rm {name} --nodes {node}` and run xfer-launch up again (the rank then starts with a cold cache, and the head offers its own after the start)"
    )
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
) -> Result<Materialised, CacheError> {
    let node_s = node.to_string();
    let name = gate.check().map_err(|source| CacheError::Gate {
        node: node_s.clone(),
        rank,
        source,
    })?;
    let node = node_s;
    let snapshot = store.root().join(name.as_str());
    let facts =
        super::preflight::weights::weights(store, states, &snapshot.display().to_string(), None);
    if let Some(problem) = facts.problems.first() {
        return Err(CacheError::Problem {
            node,
            rank,
            name,
            problem: problem.clone(),
        });
    }
    let record = store.record(&name).filter(|r| r.manifest.root == gate.root);
    let (Some(record), Some(ModelState::Complete)) = (record, facts.state) else {
        return Err(CacheError::NotHeld {
            node,
            rank,
            name,
            state: facts.state.map_or("not held", |s| s.label()),
            root: facts
                .root
                .map_or("none".to_string(), |r| r.short().to_string()),
            want: gate.root.short().to_string(),
        });
    };
    let fs = Root::open(store.root()).map_err(|source| CacheError::Root {
        node: node.clone(),
        rank,
        root: store.root().to_path_buf(),
        source,
    })?;
    let write = |source| CacheError::Write {
        node: node.clone(),
        rank,
        source,
    };
    let live = Path::new(LIVE_DIR).join(name.as_str());
    let mut done = Materialised::default();
    for kind in &gate.kinds {
        fs.create_dir_all(&live.join(kind)).map_err(write)?;
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
        let bytes = read_all(&fs, &src).map_err(|source| CacheError::Read {
            node: node.clone(),
            rank,
            name: name.clone(),
            source,
        })?;
        if blake3::hash(&bytes).as_bytes() != &f.hash.0 {
            return Err(CacheError::Changed {
                node: node.clone(),
                rank,
                name,
                rel: rel.to_string(),
            });
        }
        fs.write_durable(&dest, &bytes).map_err(write)?;
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
