//! Compile caches (`[launch] caches`): the kinds a launch may name, the
//! variable each engine reads for it, and where each lives under an
//! agent's root. Shared by the launcher (which plans the variables and
//! offers the snapshots) and the agent (which materialises a verified
//! snapshot into the live folder before a rank starts, and is the
//! boundary: it trusts no path a launcher sends, only a [`CacheGate`]'s
//! name and kinds, checked here).
//!
//! On every node, under the agent's root `R`:
//! - `R/.xfer-caches/<name>/<kind>`: the live cache the engine reads and
//!   writes (the rank's variable points there); never a model, never
//!   verified, since the engine changes it while it runs;
//! - `R/<name>`: the verified snapshot, an ordinary model synced by the
//!   agents (`<kind>/...` inside), which nothing writes after it is placed.
//!
//! `<name>` is [`CACHE_PREFIX`] and 12 hex digits, so neither path can
//! leave the root whatever the cluster file says.

use serde::{Deserialize, Serialize};

use crate::hash::Hash;
use crate::names::ModelName;

/// Every snapshot's model name starts with this.
pub const CACHE_PREFIX: &str = "xfer-caches-";

/// The folder under an agent's root holding the live caches.
pub const LIVE_DIR: &str = ".xfer-caches";

/// A kind of compile cache, as `[launch] caches` names it, and the
/// variable that points the engine at it.
pub const KINDS: &[(&str, &str)] = &[
    // vLLM: its torch.compile artifacts, with inductor's and Triton's
    // caches under torch_compile_cache/<hash>/ (vLLM sets
    // TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR there itself).
    ("vllm", "VLLM_CACHE_ROOT"),
    // torch.compile's inductor outside vLLM (SGLang, custom engines).
    ("inductor", "TORCHINDUCTOR_CACHE_DIR"),
    // Triton's kernel cache.
    ("triton", "TRITON_CACHE_DIR"),
    // FlashInfer's JIT workspace (its cache is `<base>/.cache/flashinfer`).
    ("flashinfer", "FLASHINFER_WORKSPACE_BASE"),
];

/// The variable of `kind`, if it is one of [`KINDS`].
pub fn variable(kind: &str) -> Option<&'static str> {
    KINDS.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

/// The caches a rank runs with: the agent checks that it holds the
/// snapshot `name` complete and verified with `root`, copies each file of
/// each kind that its live folder lacks (hashing it again as it copies),
/// and starts the rank only if every copied file matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheGate {
    /// The snapshot's model name ([`CACHE_PREFIX`] and 12 hex digits).
    pub name: String,
    /// The snapshot's manifest root, as the launcher found it on the
    /// node that delivered it.
    pub root: Hash,
    /// The kinds to materialise (each one of [`KINDS`]).
    pub kinds: Vec<String>,
}

/// Why a [`CacheGate`] is refused before anything is read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheGateError {
    /// The name is not a snapshot's.
    #[error("compile cache name `{0}` is not {CACHE_PREFIX} and 12 hex digits; a launcher of this version writes those only")]
    Name(String),
    /// A kind that is not one of [`KINDS`].
    #[error("compile cache kind `{0}` is not one of vllm, inductor, triton, flashinfer; a launcher of this version writes those only")]
    Kind(String),
}

impl CacheGate {
    /// The gate's name as a model name, once it and every kind are checked.
    pub fn check(&self) -> Result<ModelName, CacheGateError> {
        let hex = self.name.strip_prefix(CACHE_PREFIX).unwrap_or("");
        let ok = hex.len() == 12
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
        if !ok {
            return Err(CacheGateError::Name(self.name.escape_default().to_string()));
        }
        if let Some(k) = self.kinds.iter().find(|k| variable(k).is_none()) {
            return Err(CacheGateError::Kind(k.escape_default().to_string()));
        }
        ModelName::new(&self.name).map_err(|_| CacheGateError::Name(self.name.clone()))
    }
}

/// The snapshot name of a launch's caches: the prefix and the first 12
/// hex digits of a BLAKE3 over `engine` and the sorted `kinds`.
pub fn snapshot_name(engine: &str, kinds: &[String]) -> String {
    let mut sorted: Vec<&str> = kinds.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    let mut h = blake3::Hasher::new_derive_key("xfer-launch caches v1");
    h.update(engine.as_bytes());
    for k in sorted {
        h.update(b"\n");
        h.update(k.as_bytes());
    }
    format!("{CACHE_PREFIX}{}", &h.finalize().to_hex()[..12])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(name: &str, kinds: &[&str]) -> CacheGate {
        CacheGate {
            name: name.into(),
            root: Hash([0; 32]),
            kinds: kinds.iter().map(|k| k.to_string()).collect(),
        }
    }

    #[test]
    fn only_a_snapshot_name_and_known_kinds_pass() {
        let name = snapshot_name("vllm", &["vllm".into()]);
        assert_eq!(name.len(), CACHE_PREFIX.len() + 12);
        assert_eq!(gate(&name, &["vllm"]).check().unwrap().as_str(), name);
        for bad in [
            "../etc",
            "/etc",
            "xfer-caches-../../x",
            "xfer-caches-ABCDEF123456",
            "models--a--b",
        ] {
            assert!(
                matches!(gate(bad, &["vllm"]).check(), Err(CacheGateError::Name(_))),
                "{bad}"
            );
        }
        let e = gate(&name, &["vllm", "../../etc"]).check().unwrap_err();
        assert_eq!(e, CacheGateError::Kind("../../etc".into()));
    }

    #[test]
    fn the_name_ignores_the_order_of_the_kinds() {
        let a = snapshot_name("vllm", &["vllm".into(), "triton".into()]);
        assert_eq!(a, snapshot_name("vllm", &["triton".into(), "vllm".into()]));
        assert_ne!(
            a,
            snapshot_name("sglang", &["vllm".into(), "triton".into()])
        );
    }
}
