//! When each model of a root was last used, and which are pinned:
//! `<root>/.xfer/usage.json`, what eviction ([`super::evict`]) orders by
//! and must keep.
//!
//! A model is used when a launch's ranks start on it, when it is placed or
//! sent by a transfer, and when an operator touches or pins it. A model
//! with no entry counts as used when its record was last written. The file
//! is rewritten whole and durably (renamed in, its folder fsynced), read
//! with a size cap, and holds entries only for names the root holds (the
//! rest are dropped when it is written), so it stays small.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::util::beneath::Root;
use xfer_proto::names::ModelName;

/// Where the file lives under the root.
const USAGE_REL: &str = ".xfer/usage.json";
/// The most of it ever read.
const MAX_USAGE_FILE: u64 = 16 << 20;

/// One model's entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Use {
    /// Unix milliseconds of its last use.
    #[serde(default)]
    pub last_used_ms: u64,
    /// Whether an operator pinned it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

/// The file's content.
#[derive(Debug, Default, Serialize, Deserialize)]
struct UsageFile {
    models: BTreeMap<String, Use>,
}

/// A root's usage book. One per agent: its updates are serialized.
#[derive(Debug)]
pub struct Usage {
    fs: Root,
    lock: Mutex<()>,
}

impl Usage {
    /// The book of the root `fs` opens.
    pub fn new(fs: Root) -> Usage {
        Usage {
            fs,
            lock: Mutex::new(()),
        }
    }

    /// Every entry (a damaged or missing file reads as none).
    pub fn all(&self) -> BTreeMap<String, Use> {
        self.read().models
    }

    fn read(&self) -> UsageFile {
        let mut bytes = Vec::new();
        let Ok(f) = self.fs.open_read(Path::new(USAGE_REL)) else {
            return UsageFile::default();
        };
        if f.take(MAX_USAGE_FILE).read_to_end(&mut bytes).is_err() {
            return UsageFile::default();
        }
        serde_json::from_slice(&bytes).unwrap_or_default()
    }

    /// Applies `change` to `name`'s entry, keeping only the names `keep`
    /// says the root holds.
    fn update(
        &self,
        name: &ModelName,
        keep: impl Fn(&str) -> bool,
        change: impl FnOnce(&mut Use),
    ) -> std::io::Result<Use> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut file = self.read();
        file.models.retain(|n, _| n == name.as_str() || keep(n));
        let e = file.models.entry(name.to_string()).or_default();
        change(e);
        let now = *e;
        let bytes = serde_json::to_vec(&file).expect("usage serializes");
        self.fs.write_durable(Path::new(USAGE_REL), &bytes)?;
        Ok(now)
    }

    /// `name` was used at `now` (unix milliseconds).
    pub fn touch(
        &self,
        name: &ModelName,
        now: u64,
        keep: impl Fn(&str) -> bool,
    ) -> std::io::Result<Use> {
        self.update(name, keep, |e| e.last_used_ms = e.last_used_ms.max(now))
    }

    /// Pins or unpins `name` (a touch too).
    pub fn pin(
        &self,
        name: &ModelName,
        pinned: bool,
        now: u64,
        keep: impl Fn(&str) -> bool,
    ) -> std::io::Result<Use> {
        self.update(name, keep, |e| {
            e.pinned = pinned;
            e.last_used_ms = e.last_used_ms.max(now);
        })
    }

    /// Drops `name`'s entry (it was removed).
    pub fn forget(&self, name: &ModelName) -> std::io::Result<()> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut file = self.read();
        if file.models.remove(name.as_str()).is_some() {
            let bytes = serde_json::to_vec(&file).expect("usage serializes");
            self.fs.write_durable(Path::new(USAGE_REL), &bytes)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touches_and_pins_survive_a_reopen_and_drop_names_the_root_lost() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join(".xfer")).unwrap();
        let u = Usage::new(Root::open(t.path()).unwrap());
        let a = ModelName::new("a").unwrap();
        let b = ModelName::new("b").unwrap();
        u.touch(&a, 10, |_| true).unwrap();
        u.touch(&a, 5, |_| true).unwrap();
        u.pin(&b, true, 7, |_| true).unwrap();
        let again = Usage::new(Root::open(t.path()).unwrap());
        let all = again.all();
        assert_eq!(
            all["a"],
            Use {
                last_used_ms: 10,
                pinned: false
            }
        );
        assert_eq!(
            all["b"],
            Use {
                last_used_ms: 7,
                pinned: true
            }
        );
        // `a` is gone from the root: the next write drops it.
        again.touch(&b, 8, |n| n != "a").unwrap();
        assert!(!again.all().contains_key("a"));
        again.forget(&b).unwrap();
        assert!(again.all().is_empty());
        // A damaged file reads as empty, and is replaced on the next write.
        std::fs::write(t.path().join(".xfer/usage.json"), b"{not json").unwrap();
        assert!(again.all().is_empty());
        again.touch(&a, 1, |_| true).unwrap();
        assert_eq!(again.all()["a"].last_used_ms, 1);
    }
}
