//! `xfer manifest` against an independent tool: every file hash must be
//! exactly what `b3sum` prints, and the JSON form must round-trip through
//! `xfer verify --manifest`.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::*;

#[test]
fn file_hashes_equal_b3sum() {
    let t = tempdir("manifest-b3sum");
    let src = t.path().join("m");
    // Sizes straddle the chunk boundaries of a 64 KiB chunk size.
    gen_model(&src, 3 * MIB + 65_536 * 3 + 17, 71);
    let ours = run(
        xfer().args(["manifest", "--chunk-size", "64KiB"]).arg(&src),
        Duration::from_secs(60),
    );
    ours.assert_ok("xfer manifest");
    let mut lines: Vec<(String, String)> = ours
        .stdout
        .lines()
        .filter(|l| !l.starts_with("symlink") && !l.starts_with("dir"))
        .map(|l| {
            let (h, p) = l.split_once("  ").expect("HASH  PATH");
            (p.to_string(), h.to_string())
        })
        .collect();
    lines.sort();
    assert!(lines.len() >= 6, "{}", ours.stdout);

    let b3 = Command::new("b3sum")
        .arg("--no-names")
        .args(lines.iter().map(|(p, _)| src.join(p)))
        .output()
        .expect("b3sum must be installed (scripts/test.sh installs it)");
    assert!(b3.status.success(), "{b3:?}");
    let theirs: Vec<String> = String::from_utf8(b3.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let ours: Vec<String> = lines.iter().map(|(_, h)| h.clone()).collect();
    assert_eq!(ours, theirs, "xfer's file hashes must equal b3sum's");
}

#[test]
fn root_is_stable_and_json_manifest_verifies_a_copy() {
    let t = tempdir("manifest-json");
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 72);
    let json = run(
        xfer().args(["manifest", "--json"]).arg(&src),
        Duration::from_secs(60),
    );
    json.assert_ok("xfer manifest --json");
    let doc: serde_json::Value = json.json();
    // The root does not depend on the chunk size.
    let other = run(
        xfer()
            .args(["manifest", "--json", "--chunk-size", "1MiB"])
            .arg(&src),
        Duration::from_secs(60),
    );
    let other: serde_json::Value = other.json();
    assert_eq!(doc["root"], other["root"]);
    assert_ne!(doc["chunk_size"], other["chunk_size"]);

    let mfile = t.path().join("m.json");
    std::fs::write(&mfile, &json.stdout).unwrap();
    let ok = run(
        xfer().arg("verify").arg(&src).arg("--manifest").arg(&mfile),
        Duration::from_secs(60),
    );
    ok.assert_ok("verify against its own manifest");
    scribble(&src.join(SHARD1), 1000, 3, 9);
    let bad = run(
        xfer().arg("verify").arg(&src).arg("--manifest").arg(&mfile),
        Duration::from_secs(60),
    );
    assert_eq!(bad.status.code(), Some(1), "{bad:#?}");
    assert!(bad.stdout.contains(SHARD1), "{bad:#?}");
}
