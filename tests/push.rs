//! End-to-end pushes to real agents: a full copy to two nodes, a no-op
//! re-push, an incremental re-push, and unreachable agents.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

/// Push a ~20 MiB tree to two agents: both copies are byte-identical, the
/// JSON summary adds up (every node stored the whole tree, from the source or
/// its peer; the source sent between one and two copies), and `xfer verify`
/// passes on each.
#[test]
fn push_to_two_agents_is_byte_identical() {
    let t = tempdir("push");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("llama-test");
    gen_model(&src, 20 * MIB, 1);
    let a = Agent::start("127.0.0.2:0", &t.path().join("root-a"), &key);
    let b = Agent::start("127.0.0.3:0", &t.path().join("root-b"), &key);
    let to = [a.addr.as_str(), b.addr.as_str()];
    let total = tree_bytes(&src);
    let expected_root = manifest_root(&src);

    let s = push_ok(&src, &to, &key, &[]);
    assert_eq!(s.name, "llama-test", "name defaults to the folder's name");
    assert_eq!(
        s.root.to_hex(),
        expected_root,
        "push root == `xfer manifest` root"
    );
    assert_eq!(s.bytes_total, total);
    assert_eq!(s.files, 7, "files counted: {s:#?}");
    assert!(
        s.bytes_sent >= total && s.bytes_sent <= source_ceiling(2, total),
        "the source sends each chunk to one node or both, plus endgame duplicates: {s:#?}"
    );
    assert_eq!(s.bytes_skipped, 0);
    assert!(s.hash_s >= 0.0 && s.duration_s >= s.hash_s, "{s:#?}");
    assert_eq!(s.nodes.len(), 2);
    for (n, addr) in s.nodes.iter().zip(to) {
        assert_eq!(n.addr, addr, "nodes are reported in --to order");
        assert!(n.ok, "{n:#?}");
        assert_eq!(n.root.map(|r| r.to_hex()), Some(expected_root.clone()));
        assert_eq!(n.from_source + n.from_peers, total, "{n:#?}");
        assert!(n.bytes_sent >= n.from_source, "{n:#?}");
        assert_eq!(n.bytes_skipped, 0);
        assert_eq!(n.corrupt_chunks, 0);
    }
    for agent in [&a, &b] {
        let dst = agent.model_dir("llama-test");
        assert_same_tree(&src, &dst);
        // The details assert_same_tree covers, spelled out.
        let link = std::fs::symlink_metadata(dst.join(LINK)).unwrap();
        assert!(link.file_type().is_symlink(), "symlink kept as a symlink");
        assert_eq!(
            std::fs::read_link(dst.join(LINK)).unwrap(),
            std::path::Path::new(LINK_TARGET)
        );
        assert!(dst.join(EMPTY_DIR).is_dir());
        assert_eq!(std::fs::metadata(dst.join(EMPTY_FILE)).unwrap().len(), 0);
        assert!(agent.root.join(".xfer/models/llama-test.json").is_file());
        assert!(
            !agent.staging_dir("llama-test").exists(),
            "staging is removed once the model is complete"
        );
        let (r, v) = verify(&dst);
        assert!(r.success(), "verify failed: {r:#?}");
        assert_eq!(v["ok"], true);
        assert_eq!(v["root"], expected_root.as_str());
    }
}

/// The most a source may upload when `nodes` receivers each need `bytes`:
/// one copy per receiver, plus the scheduler's endgame, in which each
/// receiver may ask a second holder (which can be the source again) for
/// each of its last chunks (`endgame` in the agents' swarm policy). Which
/// holder answers first is timing, so a test may assert only this ceiling;
/// what each node stores is exact (asserted separately).
fn source_ceiling(nodes: u64, bytes: u64) -> u64 {
    let base = xfer::engine::scheduler::Config::default();
    let endgame = u64::from(xfer::engine::policy::swarm_config(base, 0).endgame);
    nodes * (bytes + bytes.min(endgame * DEFAULT_CHUNK))
}

/// Re-pushes to two agents: the same tree again sends nothing; after one
/// file changes, only that file is sent.
///
/// The tree has no empty folder: with one, every re-push fails (see
/// `repush_of_a_model_with_an_empty_dir_sends_nothing`).
#[test]
fn repush_sends_nothing_then_only_the_changed_file() {
    let t = tempdir("push-again");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model_opts(&src, 20 * MIB, 4, false);
    let a = Agent::start("127.0.0.6:0", &t.path().join("root-a"), &key);
    let b = Agent::start("127.0.0.7:0", &t.path().join("root-b"), &key);
    let to = [a.addr.as_str(), b.addr.as_str()];
    let total = tree_bytes(&src);
    let first = push_ok(&src, &to, &key, &[]);
    let stored = |s: &PushJson| {
        s.nodes
            .iter()
            .map(|n| n.from_source + n.from_peers)
            .sum::<u64>()
    };
    assert_eq!(stored(&first), 2 * total, "{first:#?}");

    // Same tree again: nothing is sent.
    let s = push_ok(&src, &to, &key, &[]);
    assert_eq!(s.bytes_sent, 0, "{s:#?}");
    assert_eq!(stored(&s), 0, "{s:#?}");
    assert_eq!(s.bytes_skipped, 2 * total, "{s:#?}");
    assert_eq!(s.root, first.root);
    for agent in [&a, &b] {
        assert_same_tree(&src, &agent.model_dir("m"));
    }

    // Change a few bytes of one file: only that file is sent again.
    let changed = src.join(SHARD2);
    let len = std::fs::metadata(&changed).unwrap().len();
    scribble(&changed, len / 2, 100, 7);
    let s = push_ok(&src, &to, &key, &[]);
    assert_ne!(s.root, first.root, "content changed, so the root did");
    assert_eq!(s.root.to_hex(), manifest_root(&src));
    assert!(
        s.bytes_sent >= len && s.bytes_sent <= source_ceiling(2, len),
        "only {SHARD2} is resent: {s:#?}"
    );
    assert_eq!(s.bytes_skipped, 2 * (total - len), "{s:#?}");
    for n in &s.nodes {
        assert_eq!(n.from_source + n.from_peers, len, "{n:#?}");
    }
    for agent in [&a, &b] {
        let dst = agent.model_dir("m");
        assert_same_tree(&src, &dst);
        let (r, _) = verify(&dst);
        assert!(r.success(), "verify after the incremental push: {r:#?}");
    }
}

/// Pushing a tree with an empty folder twice: the second push must succeed
/// and send nothing.
#[test]
fn repush_of_a_model_with_an_empty_dir_sends_nothing() {
    let t = tempdir("push-emptydir");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 5);
    let a = Agent::start("127.0.0.8:0", &t.path().join("root"), &key);
    let total = tree_bytes(&src);
    assert_eq!(push_ok(&src, &[&a.addr], &key, &[]).bytes_sent, total);
    let s = push_ok(&src, &[&a.addr], &key, &[]);
    assert_eq!(s.bytes_sent, 0, "{s:#?}");
    assert_eq!(s.bytes_skipped, total, "{s:#?}");
    assert_same_tree(&src, &a.model_dir("m"));
}

/// `--name` chooses where the model lands; `--chunk-size` is honoured.
#[test]
fn push_with_name_and_small_chunks() {
    let t = tempdir("push-name");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("src");
    gen_model(&src, 3 * MIB, 2);
    let a = Agent::start("127.0.0.4:0", &t.path().join("root"), &key);
    let s = push_ok(
        &src,
        &[&a.addr],
        &key,
        &["--name", "org--model@v2", "--chunk-size", "64KiB"],
    );
    assert_eq!(s.name, "org--model@v2");
    assert_eq!(s.bytes_sent, tree_bytes(&src));
    assert!(!a.root.join("src").exists());
    assert_same_tree(&src, &a.model_dir("org--model@v2"));
    let rec: serde_json::Value = serde_json::from_slice(
        &std::fs::read(a.root.join(".xfer/models/org--model@v2.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["manifest"]["chunk_size"], 64 * KIB, "{rec}");
    let (r, _) = verify(&a.model_dir("org--model@v2"));
    assert!(r.success(), "{r:#?}");

    // An unusable name is refused before anything is sent.
    let r = push(&src, &[&a.addr], &key, &["--name", "../evil"]);
    assert!(!r.success(), "{r:#?}");
    assert!(r.stderr.contains("--name"), "{r:#?}");
    assert!(!t.path().join("evil").exists());
}

/// A dead agent fails fast, with its address in the error; a live agent in
/// the same push still gets the model.
#[test]
fn dead_agent_fails_fast_and_names_the_address() {
    let t = tempdir("push-dead");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, MIB, 3);
    let dead = format!("127.0.0.1:{}", unused_udp_port());

    let started = Instant::now();
    let r = push(&src, &[&dead], &key, &["--connect-timeout", "2"]);
    let elapsed = started.elapsed();
    assert!(!r.success(), "{r:#?}");
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(
        elapsed < Duration::from_secs(10),
        "took {elapsed:?} to give up on a dead agent"
    );
    assert!(
        r.stderr.contains("error:") && r.stderr.contains(&dead),
        "the error must name {dead}: {r:#?}"
    );
    let s: PushJson = r.json();
    let n = s.node(&dead);
    assert!(!n.ok);
    assert!(n.error.as_deref().unwrap_or("").contains(&dead), "{n:#?}");
    assert_eq!(n.bytes_sent, 0);

    // One dead and one live agent: the live one is served, the push fails.
    let live = Agent::start("127.0.0.5:0", &t.path().join("root"), &key);
    let started = Instant::now();
    let r = push(
        &src,
        &[&dead, &live.addr],
        &key,
        &["--connect-timeout", "2"],
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{r:#?}");
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    let s: PushJson = r.json();
    assert!(!s.node(&dead).ok);
    assert!(s.node(&live.addr).ok, "{s:#?}");
    assert_eq!(s.bytes_sent, tree_bytes(&src));
    assert_same_tree(&src, &live.model_dir("m"));
}

/// `--connections 3`: the pusher opens two more connections to the agent,
/// each from a socket of its own, the agent attaches them to the running
/// transfer and fetches chunks over all three (each carried some of the
/// bytes), and the copy is identical. Out-of-range counts are refused in
/// one line that names the range.
#[test]
fn push_over_three_connections_uses_all_three() {
    let t = tempdir("push-conns");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 16 * MIB, 1);
    let a = Agent::start("127.0.0.6:0", &t.path().join("root"), &key);
    let total = tree_bytes(&src);

    // Small chunks, and a rate cap so the push lasts about a second: time
    // for the extra connections to attach and carry their share.
    let s = push_ok(
        &src,
        &[&a.addr],
        &key,
        &[
            "--connections",
            "3",
            "--chunk-size",
            "256KiB",
            "--limit-rate",
            "16MiB",
        ],
    );
    let n = s.node(&a.addr);
    assert_eq!(n.bytes_per_connection.len(), 3, "{n:#?}");
    assert!(n.bytes_per_connection.iter().all(|&b| b > 0), "{n:#?}");
    assert_eq!(
        n.bytes_per_connection.iter().sum::<u64>(),
        n.bytes_sent,
        "{n:#?}"
    );
    assert_eq!(n.from_source, total, "{n:#?}");
    assert_same_tree(&src, &a.model_dir("m"));

    // One connection unless asked: the summary counts just it.
    let b = Agent::start("127.0.0.7:0", &t.path().join("root-b"), &key);
    let s = push_ok(&src, &[&b.addr], &key, &["--connections", "1"]);
    assert_eq!(s.node(&b.addr).bytes_per_connection, vec![total]);

    for bad in ["0", "65", "many"] {
        let r = push(&src, &[&a.addr], &key, &["--connections", bad]);
        assert_eq!(r.status.code(), Some(2), "{r:#?}");
        let first = r.stderr.lines().next().unwrap_or_default();
        assert!(
            first.contains("--connections") && first.contains("pass --connections 1 to 64"),
            "{r:#?}"
        );
    }
}
