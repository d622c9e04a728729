//! Damage is found and named: `xfer verify` reports flipped bytes by chunk
//! and deleted files; chunks corrupted in transit are caught by the agent,
//! fetched again and counted; a source that only sends garbage fails the
//! push without placing anything.

use crate::common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::*;

/// Flip one byte of a received file: `verify` exits 1 and names the file and
/// the chunk; delete a file: `verify` lists it as missing; a re-push repairs
/// exactly those two files.
///
/// The tree has no empty folder because re-pushing one fails (see the
/// ignored test in push.rs).
#[test]
fn verify_names_the_damaged_chunk_and_the_missing_file() {
    let t = tempdir("corrupt-verify");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model_opts(&src, 12 * MIB, 40, false);
    let agent = Agent::start("127.0.0.40:0", &t.path().join("root"), &key);
    push_ok(&src, &[&agent.addr], &key, &["--chunk-size", "1MiB"]);
    let dst = agent.model_dir("m");
    let (r, v) = verify(&dst);
    assert!(r.success(), "{r:#?}");
    assert_eq!(v["mismatched"], serde_json::json!([]));

    // One byte in chunk 5 (1 MiB chunks) of the largest file.
    let shard = dst.join(SHARD1);
    let shard_len = std::fs::metadata(&shard).unwrap().len();
    assert!(shard_len > 6 * MIB);
    let offset = 5 * MIB + 777;
    {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&shard)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, offset).unwrap();
        b[0] ^= 0x01;
        f.write_all_at(&b, offset).unwrap();
    }
    let (r, v) = verify(&dst);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert_eq!(v["ok"], false);
    assert_eq!(v["missing"], serde_json::json!([]), "{v}");
    let mismatched = v["mismatched"].as_array().unwrap();
    assert_eq!(mismatched.len(), 1, "{v}");
    assert_eq!(mismatched[0]["path"], SHARD1);
    assert_eq!(mismatched[0]["bad_chunks"], serde_json::json!([5]), "{v}");

    // A deleted file is missing.
    std::fs::remove_file(dst.join(NESTED)).unwrap();
    let (r, v) = verify(&dst);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert_eq!(v["missing"], serde_json::json!([NESTED]), "{v}");
    assert_eq!(v["mismatched"][0]["path"], SHARD1);

    // The human-readable form says the same.
    let r = run(xfer().arg("verify").arg(&dst), Duration::from_secs(60));
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(
        r.stdout.contains(NESTED) && r.stdout.contains(SHARD1),
        "{r:#?}"
    );

    // A re-push sends exactly the two damaged files and repairs the tree.
    let nested_len = std::fs::metadata(src.join(NESTED)).unwrap().len();
    let s = push_ok(&src, &[&agent.addr], &key, &["--chunk-size", "1MiB"]);
    assert_eq!(s.bytes_sent, shard_len + nested_len, "{s:#?}");
    assert_same_tree(&src, &dst);
    let (r, _) = verify(&dst);
    assert!(r.success(), "{r:#?}");
}

/// Two chunks corrupted in transit: the agent rejects them, fetches them
/// again, reports them, and the tree is exact.
#[test]
fn chunks_corrupted_in_transit_are_refetched() {
    let t = tempdir("corrupt-transit");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 6 * MIB, 41);
    let agent = Agent::start("127.0.0.41:0", &t.path().join("root"), &key);
    let total = tree_bytes(&src);
    let cs = MIB;
    let r = run(
        push_cmd(&src, &[&agent.addr], &key, &["--chunk-size", "1MiB"])
            .env("XFER_FAULT_CORRUPT_SENDS", "2"),
        Duration::from_secs(120),
    );
    r.assert_ok("push with 2 corrupted chunks");
    let s: PushJson = r.json();
    let n = s.node(&agent.addr);
    assert!(n.ok, "{n:#?}");
    assert_eq!(n.corrupt_chunks, 2, "{n:#?}");
    assert!(
        s.bytes_sent > total && s.bytes_sent <= total + 2 * cs,
        "the two bad chunks are sent twice: {s:#?}"
    );
    agent.wait_log("failed its BLAKE3 check");
    assert_same_tree(&src, &agent.model_dir("m"));
    let (r, _) = verify(&agent.model_dir("m"));
    assert!(r.success(), "{r:#?}");
}

/// A source whose every chunk is corrupt: the push fails with a clear error
/// and no file is ever placed.
#[test]
fn a_source_that_only_sends_garbage_fails_and_places_nothing() {
    let t = tempdir("corrupt-all");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 42);
    let agent = Agent::start("127.0.0.42:0", &t.path().join("root"), &key);
    let r = run(
        push_cmd(&src, &[&agent.addr], &key, &["--chunk-size", "64KiB"])
            .env("XFER_FAULT_CORRUPT_SENDS", "1000000"),
        Duration::from_secs(120),
    );
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(r.stderr.contains("error:"), "{r:#?}");
    let s: PushJson = r.json();
    let n = s.node(&agent.addr);
    assert!(!n.ok && n.error.is_some(), "{n:#?}");
    assert_no_wrong_files(&src, &agent.model_dir("m"));
    for (rel, node) in walk(&agent.root) {
        if let Node::File { .. } = node {
            assert!(
                rel.starts_with(".xfer/"),
                "{rel} was placed from corrupt data"
            );
        }
    }
    assert!(!agent.root.join(".xfer/models/m.json").exists());

    // The same agent then takes a clean push.
    push_ok(&src, &[&agent.addr], &key, &["--chunk-size", "64KiB"]);
    assert_same_tree(&src, &agent.model_dir("m"));
}

/// When the agent gives up on a source that sends only corrupt chunks, the
/// error must say so (not "lost the source ... run the push again", which
/// would fail the same way).
#[test]
fn a_source_that_only_sends_garbage_gets_a_corruption_error() {
    let t = tempdir("corrupt-msg");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 43);
    let agent = Agent::start("127.0.0.43:0", &t.path().join("root"), &key);
    let r = run(
        push_cmd(&src, &[&agent.addr], &key, &["--chunk-size", "64KiB"])
            .env("XFER_FAULT_CORRUPT_SENDS", "1000000"),
        Duration::from_secs(120),
    );
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    let s: PushJson = r.json();
    let n = s.node(&agent.addr);
    let err = n.error.as_deref().unwrap_or_default().to_lowercase();
    assert!(
        err.contains("blake3") || err.contains("corrupt"),
        "the error should say the data was corrupt: {n:#?}"
    );
    assert!(!err.contains("run the push again"), "{n:#?}");
}
