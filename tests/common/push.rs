//! `xfer push --json`: the command line and its summary, read through the product's own type.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::*;

/// What `xfer push --json` prints, read through the product's own type.
pub use xfer::flow::push::{NodeSummary as NodeJson, PushSummary as PushJson};

/// One node of a push summary, by its address.
pub trait NodeByAddr {
    fn node(&self, addr: &str) -> &NodeJson;
}

impl NodeByAddr for PushJson {
    fn node(&self, addr: &str) -> &NodeJson {
        self.nodes
            .iter()
            .find(|n| n.addr == addr)
            .unwrap_or_else(|| panic!("no node {addr} in {self:#?}"))
    }
}

/// The command line of `xfer push SRC --to A,B --key KEY --json EXTRA...`.
pub fn push_cmd(src: &Path, to: &[&str], key: &Path, extra: &[&str]) -> Command {
    let mut c = xfer();
    // Keep the pusher's hash cache inside the test's temp dir.
    if let Some(parent) = src.parent() {
        c.env("XDG_CACHE_HOME", parent.join("xdg-cache"));
    }
    c.arg("push")
        .arg(src)
        .arg("--to")
        .arg(to.join(","))
        .arg("--key")
        .arg(key)
        .arg("--json")
        .args(extra);
    c
}

/// Runs a push (at most 120 s).
pub fn push(src: &Path, to: &[&str], key: &Path, extra: &[&str]) -> Run {
    run(&mut push_cmd(src, to, key, extra), Duration::from_secs(120))
}

/// Runs a push that must succeed and returns its summary.
pub fn push_ok(src: &Path, to: &[&str], key: &Path, extra: &[&str]) -> PushJson {
    let r = push(src, to, key, extra);
    r.assert_ok("xfer push");
    let s: PushJson = r.json();
    assert!(
        s.nodes.iter().all(|n| n.ok && n.error.is_none()),
        "a node failed although push exited 0: {s:#?}"
    );
    s
}

/// `xfer manifest DIR --json`'s root.
pub fn manifest_root(dir: &Path) -> String {
    let r = run(
        xfer().arg("manifest").arg(dir).arg("--json"),
        Duration::from_secs(60),
    );
    r.assert_ok("xfer manifest");
    let v: serde_json::Value = r.json();
    v["root"]
        .as_str()
        .expect("root in manifest JSON")
        .to_string()
}

/// `xfer verify DIR --json`.
pub fn verify(dir: &Path) -> (Run, serde_json::Value) {
    let r = run(
        xfer().arg("verify").arg(dir).arg("--json"),
        Duration::from_secs(60),
    );
    let v = if r.stdout.trim().is_empty() {
        serde_json::Value::Null
    } else {
        r.json()
    };
    (r, v)
}

/// The manifest of a source tree, as the pusher computes it.
pub fn scan(dir: &Path, chunk_size: u64) -> xfer_proto::manifest::Manifest {
    xfer::store::scan::scan(dir, chunk_size, &|_| {})
        .expect("scan")
        .manifest
}
