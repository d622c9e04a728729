//! Peer-to-peer fan-out across a cluster of network namespaces with shaped
//! links (`scripts/netcluster.sh`): real processes on separate hosts, real
//! bandwidth limits. Host 0 pushes; hosts 1..N run agents that pass chunks
//! to each other. Needs root; on a machine without it each test says why and
//! returns.

use crate::common;

use std::time::Duration;

use common::netns::*;
use common::*;

#[test]
fn four_receivers_get_identical_trees_while_the_source_sends_about_one_copy() {
    let Some(cluster) = cluster("f", 4, 400) else {
        return;
    };
    let t = tempdir("fanout4");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 48 * MIB, 91);
    let _agents: Vec<_> = (1..=4)
        .map(|i| start_agent(&cluster, i, &t.path().join(format!("h{i}")), &key))
        .collect();
    let to = addrs(&cluster, 1..=4);
    let r = run(
        &mut push_from_source(&cluster, &src, &to, &key, &t.path().join("xdg")),
        Duration::from_secs(120),
    );
    r.assert_ok("fan-out across the netns cluster");
    let s: PushJson = r.json();
    let root = manifest_root(&src);
    assert_eq!(s.root.to_hex(), root);
    for (i, n) in (1..=4).zip(&s.nodes) {
        assert!(n.ok, "{n:#?}");
        assert_eq!(n.root.map(|r| r.to_hex()), Some(root.clone()), "{n:#?}");
        let dir = t.path().join(format!("h{i}/m"));
        assert_same_tree(&src, &dir);
        assert_eq!(manifest_root(&dir), root, "host {i}");
        assert_eq!(n.from_source + n.from_peers, s.bytes_total, "{n:#?}");
        assert!(
            n.from_peers > 0,
            "host {i} took nothing from its peers: {n:#?}"
        );
        assert!(n.dropped_peers.is_empty(), "{n:#?}");
    }
    // A star would send 4x; the swarm sends about one copy.
    assert!(
        s.source_sent_x <= 1.3,
        "the source sent {:.2}x the model: {s:#?}",
        s.source_sent_x
    );
    // And the shaping is real: nothing beats S/B through one 400 Mbit/s link.
    let floor = s.bytes_total as f64 / (400e6 / 8.0);
    let took = s.duration_s - s.hash_s;
    assert!(
        took >= 0.9 * floor,
        "{took:.2}s is faster than the shaped link allows ({floor:.2}s): shaping is not in effect"
    );
    // The timeline's marks come in order on one clock, and the stream
    // from the first chunk to the last node done cannot beat the link (less
    // the chunks before the first report).
    let tl = &s.timeline;
    let marks = [
        ("hashed", Some(tl.hashed_s)),
        ("connected", tl.connected_s),
        ("accepted", tl.accepted_s),
        ("first chunk", tl.first_chunk_s),
        ("done", tl.done_s),
        ("closed", tl.closed_s),
        ("returned", Some(tl.returned_s)),
    ];
    for pair in marks.windows(2) {
        let ((a, x), (b, y)) = (pair[0], pair[1]);
        let (x, y) = (x.expect(a), y.expect(b));
        assert!(x <= y, "{a} at {x:.3}s after {b} at {y:.3}s: {tl:#?}");
    }
    let stream = tl.done_s.unwrap() - tl.first_chunk_s.unwrap();
    assert!(
        stream >= 0.75 * floor,
        "{stream:.2}s < S/B {floor:.2}s: {tl:#?}"
    );
    for n in &s.nodes {
        assert!(n.marks.done_s <= tl.done_s, "{n:#?}");
        assert!(n.marks.first_chunk_s >= tl.first_chunk_s, "{n:#?}");
    }
    eprintln!(
        "4 receivers, 48 MiB at 400 Mbit/s: {took:.2}s = {:.2} x S/B, source sent {:.2} x S",
        took / floor,
        s.source_sent_x
    );
}

#[test]
fn a_receiver_killed_mid_transfer_does_not_stop_the_others_and_resumes_after_restart() {
    let Some(cluster) = cluster("k", 3, 200) else {
        return;
    };
    let t = tempdir("fanout-kill");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 96 * MIB, 92);
    let manifest = scan(&src, MIB);
    let total = tree_bytes(&src);
    let root = |i: u32| t.path().join(format!("h{i}"));
    let mut agents: Vec<_> = (1..=3)
        .map(|i| Some(start_agent(&cluster, i, &root(i), &key)))
        .collect();
    let to = addrs(&cluster, 1..=3);
    let cache = t.path().join("xdg");
    let pusher = Proc::spawn(&mut push_from_source(&cluster, &src, &to, &key, &cache));
    let journal = root(2).join(".xfer/staging/m/journal");
    wait_until("host 2 to hold 16 MiB", Duration::from_secs(60), || {
        journal_held_bytes(&journal, &manifest) >= 16 * MIB
    });
    agents[1].take().unwrap().kill9();
    let held = journal_held_bytes(&journal, &manifest);
    assert!(held < total, "host 2 finished before it was killed");

    let r = pusher.wait(Duration::from_secs(120));
    assert!(!r.success(), "push reported success with a dead node");
    let s: PushJson = r.json();
    for i in [1, 3] {
        let n = &s.nodes[i - 1];
        assert!(n.ok, "host {i} did not complete without host 2: {n:#?}");
        assert_same_tree(&src, &root(i as u32).join("m"));
    }
    let dead = &s.nodes[1];
    assert!(!dead.ok && dead.error.is_some(), "{dead:#?}");

    // Restarted, host 2 resumes from its journal and fills only the gaps,
    // from the source and the hosts that completed.
    agents[1] = Some(start_agent(&cluster, 2, &root(2), &key));
    let r = run(
        &mut push_from_source(&cluster, &src, &to, &key, &cache),
        Duration::from_secs(120),
    );
    r.assert_ok("re-run after host 2 was killed");
    let s: PushJson = r.json();
    let n = &s.nodes[1];
    assert!(n.ok, "{n:#?}");
    assert!(
        n.bytes_skipped >= held,
        "host 2 held {held} bytes before the restart but resumed from {}",
        n.bytes_skipped
    );
    assert_eq!(
        n.from_source + n.from_peers + n.bytes_skipped,
        total,
        "{n:#?}"
    );
    for i in [1, 3] {
        assert_eq!(s.nodes[i - 1].bytes_skipped, total, "host {i} re-received");
    }
    assert_same_tree(&src, &root(2).join("m"));
    drop(agents);
}

#[test]
fn a_peer_serving_corrupt_chunks_is_detected_excluded_and_the_transfer_completes() {
    let Some(cluster) = cluster("c", 3, 400) else {
        return;
    };
    let t = tempdir("fanout-corrupt");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 48 * MIB, 93);
    let root = |i: u32| t.path().join(format!("h{i}"));
    let _good: Vec<_> = (1..=2)
        .map(|i| start_agent(&cluster, i, &root(i), &key))
        .collect();
    // Host 3 receives correctly but flips a byte in every chunk it serves.
    let _bad = start_agent_env(
        &cluster,
        3,
        &root(3),
        &key,
        &[("XFER_FAULT_CORRUPT_SENDS", "1000000")],
    );
    let to = addrs(&cluster, 1..=3);
    let r = run(
        &mut push_from_source(&cluster, &src, &to, &key, &t.path().join("xdg")),
        Duration::from_secs(120),
    );
    r.assert_ok("fan-out with a corrupting peer");
    let s: PushJson = r.json();
    let bad = &to[2];
    let mut excluded = 0;
    for i in 1..=3u32 {
        let n = &s.nodes[i as usize - 1];
        assert!(n.ok, "{n:#?}");
        assert_same_tree(&src, &root(i).join("m"));
        for d in &n.dropped_peers {
            assert!(
                d.starts_with(bad.as_str()),
                "host {i} dropped a good peer: {d}"
            );
            assert!(d.contains("BLAKE3"), "{d}");
            excluded += 1;
        }
        if i < 3 {
            // The peer is dropped at its first bad chunk; at most the other
            // request already in flight to it (2 per peer) can follow.
            assert!(n.corrupt_chunks <= 2, "{n:#?}");
        }
    }
    assert!(excluded >= 1, "nobody excluded the corrupting peer: {s:#?}");
}

/// Issue 33's regression guard: on a swarm of 8 receivers the source
/// uploads each chunk about once (the super-seeding ledger), as its own
/// count says and as the bytes its link carried say, and no receiver holds
/// more than K peer links. The time is printed, not asserted.
#[test]
fn eight_receivers_and_the_source_uploads_each_chunk_about_once() {
    let Some(cluster) = cluster("e", 8, 100) else {
        return;
    };
    let t = tempdir("fanout8");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 24 * MIB, 93);
    let _agents: Vec<_> = (1..=8)
        .map(|i| start_agent(&cluster, i, &t.path().join(format!("h{i}")), &key))
        .collect();
    let to = addrs(&cluster, 1..=8);
    let wire_before = tx_bytes(&cluster, 0);
    let r = run(
        &mut push_from_source(&cluster, &src, &to, &key, &t.path().join("xdg")),
        Duration::from_secs(180),
    );
    r.assert_ok("fan-out to 8 receivers");
    let wire = tx_bytes(&cluster, 0) - wire_before;
    let s: PushJson = r.json();
    for (i, n) in (1..=8).zip(&s.nodes) {
        assert!(n.ok, "{n:#?}");
        assert_same_tree(&src, &t.path().join(format!("h{i}/m")));
        assert!(
            n.max_peer_links <= xfer::engine::topology::DEFAULT_DEGREE,
            "host {i} held {} peer links: {n:#?}",
            n.max_peer_links
        );
    }
    assert!(
        s.source_sent_x <= 1.1,
        "the source sent {:.3} x the model",
        s.source_sent_x
    );
    // The link's own count: the payload plus QUIC, UDP and IP headers
    // (about 5 % at MTU 1500) and the control streams.
    let wire_x = wire as f64 / s.bytes_total as f64;
    assert!(
        wire_x <= 1.1 * 1.08,
        "the source's link carried {wire_x:.3} x the model"
    );
    let floor = s.bytes_total as f64 / (100e6 / 8.0);
    let took = s.duration_s - s.hash_s;
    eprintln!(
        "8 receivers, 24 MiB at 100 Mbit/s: {took:.2}s = {:.2} x S/B; source sent {:.3} x S \
         ({wire_x:.3} x S on its link)",
        took / floor,
        s.source_sent_x
    );
}

/// Issue 33's churn, on real processes: two of eight receivers are
/// `kill -9`ed a third of the way through, and the eighth's agent is not
/// up when the push starts: it comes up then, and joins the running swarm.
/// The others complete without the dead; the joiner is fed mostly by its
/// peers, not by the source alone; the source still uploads about one
/// copy, and no node holds more than K links. The source is capped at
/// 1 MiB/s, so the swarm cannot finish before every chunk has left it:
/// the transfer still runs when the joiner answers (it is tried every
/// second with a 1 s connect timeout, and at the kills two thirds of the
/// source's 16 s remain).
#[test]
fn two_of_eight_killed_at_a_third_and_a_late_agent_joins_the_running_swarm() {
    let Some(cluster) = cluster("j", 8, 100) else {
        return;
    };
    let t = tempdir("churn8");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 16 * MIB, 94);
    let manifest = scan(&src, MIB);
    let total = tree_bytes(&src);
    let root = |i: u32| t.path().join(format!("h{i}"));
    let mut agents: Vec<_> = (1..=7)
        .map(|i| Some(start_agent(&cluster, i, &root(i), &key)))
        .collect();
    let to = addrs(&cluster, 1..=8);
    let pusher = Proc::spawn(
        push_from_source(&cluster, &src, &to, &key, &t.path().join("xdg")).args([
            "--limit-rate",
            "1MiB",
            "--connect-timeout",
            "1",
        ]),
    );
    let journal = root(1).join(".xfer/staging/m/journal");
    wait_until("host 1 to hold a third", Duration::from_secs(60), || {
        journal_held_bytes(&journal, &manifest) >= total / 3
    });
    for i in [2, 3] {
        agents[i - 1].take().unwrap().kill9();
    }
    let late = start_agent(&cluster, 8, &root(8), &key);

    let r = pusher.wait(Duration::from_secs(180));
    assert!(!r.success(), "push reported success with two dead nodes");
    let s: PushJson = r.json();
    for i in [2, 3] {
        let n = &s.nodes[i - 1];
        assert!(!n.ok && n.error.is_some(), "host {i}: {n:#?}");
    }
    for i in [1, 4, 5, 6, 7, 8] {
        let n = &s.nodes[i - 1];
        assert!(n.ok, "host {i} did not complete: {n:#?}");
        assert_same_tree(&src, &root(i as u32).join("m"));
        assert!(
            n.max_peer_links <= xfer::engine::topology::DEFAULT_DEGREE,
            "host {i} held {} links",
            n.max_peer_links
        );
    }
    let joiner = &s.nodes[7];
    assert_eq!(joiner.from_source + joiner.from_peers, total, "{joiner:#?}");
    assert!(
        joiner.from_peers > joiner.from_source,
        "the late node was fed by the source more than by its peers: {joiner:#?}"
    );
    // Each of the 16 chunks is 1/16 of S: the dead took first copies of
    // a few (those in flight to them, and those they held alone) that
    // must go out again. At 24 nodes and 128 MiB (issue 33's shape, in
    // scripts/bench-scale.sh CHURN=3) this is a small fraction.
    assert!(
        s.source_sent_x <= 1.25,
        "the source sent {:.3} x the model",
        s.source_sent_x
    );
    eprintln!(
        "churn: source sent {:.3} x S; the late node got {} of {total} bytes from peers",
        s.source_sent_x, joiner.from_peers
    );
    drop((agents, late));
}

/// Issue 33's leftover: two receivers that cannot reach each other at all
/// (a firewall drops everything between them; each reaches the source).
/// Each tells the source its peer is unreachable, so the source sends it
/// the chunks only the other holds instead of holding them back for the
/// other to serve: the push completes well before the ledger's patience
/// (60 s), which it waited out before this report existed (measured: 63 s
/// for a 2-node lab push).
#[test]
fn receivers_that_cannot_reach_each_other_tell_the_source_and_are_served_by_it() {
    let Some(cluster) = cluster("u", 2, 200) else {
        return;
    };
    let t = tempdir("unreach");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 16 * MIB, 95);
    let _agents: Vec<_> = (1..=2)
        .map(|i| start_agent(&cluster, i, &t.path().join(format!("h{i}")), &key))
        .collect();
    for (me, other) in [(1, 2), (2, 1)] {
        nft(
            &cluster,
            me,
            &format!(
                "table inet cut {{\n chain cut_in {{\n type filter hook input priority 0;\n ip saddr {} drop\n }}\n}}\n",
                cluster.ip(other)
            ),
        );
    }
    let to = addrs(&cluster, 1..=2);
    let r = run(
        &mut push_from_source(&cluster, &src, &to, &key, &t.path().join("xdg")),
        Duration::from_secs(180),
    );
    r.assert_ok("push to two receivers that cannot reach each other");
    let s: PushJson = r.json();
    let patience = xfer::engine::seeding::SeedLedger::DEFAULT_PATIENCE.as_secs_f64();
    for (i, n) in (1..=2).zip(&s.nodes) {
        assert_same_tree(&src, &t.path().join(format!("h{i}/m")));
        assert_eq!(
            n.from_peers, 0,
            "host {i} got bytes from an unreachable peer"
        );
        assert!(
            n.duration_s < patience / 2.0,
            "host {i} took {:.1}s: the source held copies back for a peer it could not reach",
            n.duration_s
        );
    }
    eprintln!(
        "unreachable peers: {:.1}s and {:.1}s; the source sent {:.2} x S",
        s.nodes[0].duration_s, s.nodes[1].duration_s, s.source_sent_x
    );
}
