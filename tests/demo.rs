//! `xfer demo`, the README's first command, at a small size: it pulls its
//! generated model from its own Hub look-alike, measures the download
//! alone and S/B, streams the model to its agents and every node verifies.

use crate::common;

use std::time::Duration;

use common::*;

#[test]
fn the_demo_streams_its_model_to_every_node_and_prints_the_ratio() {
    let t = tempdir("demo");
    let dir = t.path().join("demo");
    let mut c = xfer();
    // The real-engine step (vLLM across two nodes) is tested in
    // tests/engines.rs; here the demo stops at the check.
    c.args([
        "demo",
        "--size",
        "40MiB",
        "--nodes",
        "2",
        "--no-engine",
        "--dir",
    ])
    .arg(&dir);
    // A fresh machine: no vLLM (command 2 installs it). The demo still
    // passes, saying in one line why the engine's rows cannot.
    c.env("XFER_ENGINES_VENV", t.path().join("no-engines-here"));
    let r = run(&mut c, Duration::from_secs(300));
    r.assert_ok("xfer demo");
    let out = &r.stdout;
    assert!(!out.contains("unexpected failures"), "{out}");
    if std::path::Path::new(bin())
        .with_file_name("xfer-launch")
        .exists()
    {
        assert!(
            out.contains("launch: no vLLM here") && out.contains("scripts/test.sh"),
            "the one line on the missing engine:\n{out}"
        );
    }
    assert!(out.contains("chunks of "), "the chunk size it used:\n{out}");
    for want in [
        "1. the download alone",
        "2. S/B",
        "3. streamed",
        "x max(download, S/B)",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
    let ok_rows = out
        .lines()
        .filter(|l| l.starts_with("127.0.0.") && l.split_whitespace().nth(1) == Some("ok"))
        .count();
    assert_eq!(ok_rows, 2, "every node verified:\n{out}");
    // The streamed model is the cache huggingface_hub reads, on each node.
    for n in ["node1", "node2"] {
        let snaps = dir.join(n).join("models--xfer-demo--model/snapshots");
        assert_eq!(std::fs::read_dir(&snaps).unwrap().count(), 1, "{n}");
    }
}
