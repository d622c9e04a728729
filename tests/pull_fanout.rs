//! `xfer pull --to`: one download from the Hub test server, delivered to two
//! real agents (whose roots are their HF caches) while it downloads. Every
//! node ends with the same cache folder and root hash, and the real
//! `huggingface_hub` loads the snapshot offline from each node's cache.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::hub::*;
use common::*;

/// What `xfer pull --to --json` prints, read through the product's type.
use xfer::flow::pull_fanout::PullFanoutSummary as FanoutJson;

#[test]
fn pull_fans_out_to_agents_while_downloading() {
    hf_python();
    let t = tempdir("pull-fanout");
    let repos = t.path().join("repos");
    let src = gen_repo(
        &repos,
        "acme/fan",
        21,
        &[
            ("config.json", 400),
            ("tokenizer.json", 150_000),
            ("model-00001-of-00003.safetensors", 6 * MIB + 1),
            ("model-00002-of-00003.safetensors", 6 * MIB + 2),
            ("sub/model-00003-of-00003.safetensors", 6 * MIB + 3),
        ],
    );
    // 4 MB/s per connection and two connections: the download takes about
    // 2.5 s, long enough for push rounds to run while it goes on.
    let server = HubServer::start(&repos, &["--rate", "4000000"]);
    let meta = server.repo("acme/fan");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let agents: Vec<Agent> = (0..2)
        .map(|i| {
            let root = t.path().join(format!("node{i}/hub"));
            std::fs::create_dir_all(&root).unwrap();
            let port = unused_udp_port();
            Agent::start(&format!("127.0.0.{}:{port}", 2 + i), &root, &key)
        })
        .collect();
    let to: Vec<&str> = agents.iter().map(|a| a.addr.as_str()).collect();
    let env = PullEnv::new(&server.endpoint(), t.path());
    let mut c = env.cmd(
        "acme/fan",
        &[
            "--connections",
            "2",
            "--part-size",
            "1MiB",
            "--to",
            &to.join(","),
            "--key",
            key.to_str().unwrap(),
        ],
    );
    let r = run(&mut c, Duration::from_secs(120));
    r.assert_ok("xfer pull --to");
    let s: FanoutJson = r.json();

    assert_all_verified(&s.pull, &meta);
    let source = env.repo_dir("acme/fan");
    assert_cache(&source, &src, &meta);
    assert_eq!(s.name, "models--acme--fan");
    assert!(
        s.streamed
            .iter()
            .all(|n| n.ok && n.from_source + n.from_peers > 0),
        "the contents were streamed while they downloaded: {s:#?}"
    );
    assert!(
        s.tail_s < s.pull.duration_s,
        "most of the fan-out overlapped the download: {s:#?}"
    );
    // Rounds of one 6 MiB file (two chunks) leave the swarm little to
    // split, so a star's 2 copies (plus a few endgame duplicates) is the
    // bound; a round that re-sent the files of earlier rounds would send
    // 3 or more.
    assert!(
        s.source_sent_x < 2.6,
        "rounds re-sent files the agents already had: {s:#?}"
    );
    assert_eq!(s.nodes.len(), 2);
    let want = walk(&source);
    for (a, n) in agents.iter().zip(&s.nodes) {
        assert!(n.ok, "{n:#?}");
        assert_eq!(n.root, Some(s.root), "{n:#?}");
        let held = a.root.join("models--acme--fan");
        assert_eq!(walk(&held), want, "{} differs from the source", a.addr);
        assert_cache(&held, &src, &meta);
        // The real client loads it offline from the agent's cache.
        let node_env = env.clone().with_cache(&a.root);
        let snap = offline_snapshot(&node_env, "acme/fan");
        assert_eq!(
            Path::new(&snap),
            held.join("snapshots").join(&meta.commit),
            "{}",
            a.addr
        );
    }
}
