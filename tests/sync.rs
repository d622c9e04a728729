//! Background sync owned by the agents: `xfer sync` hands a job over and
//! returns, the agents finish it through `kill -9`s and restarts, a node
//! added later is fed by its peers, the periodic verify repairs a damaged
//! copy, `status` reports every node (an unreachable one quickly), a bad
//! cluster file is refused with its line, `cancel` and `rm` do what they
//! say, a Hub repo lands in every node's HF cache, and an ended job leaves
//! no row on its members, keeps `status` at exit 1 while it is a failure,
//! and goes with `prune`.
//!
//! Every test starts real agents on its own loopback addresses (127.0.N.x,
//! ports picked by the kernel), writes a cluster file naming them, and
//! drives the real `xfer` binary against it.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xfer::agent::sync::status::ModelState;
use xfer_proto::admin::JobState;

use common::cluster::*;
use common::hub::*;
use common::*;

/// `xfer manifest`'s root of a source folder.
/// The environment of agents that pull from `server`, with their own
/// `HF_HOME` under `dir`.
fn hub_agent_env(server: &HubServer, dir: &Path) -> Vec<(String, String)> {
    let hf_home = dir.join("hf-home");
    fs::create_dir_all(&hf_home).unwrap();
    [
        ("HF_ENDPOINT", server.endpoint()),
        ("HF_HOME", hf_home.display().to_string()),
        ("HF_HUB_DISABLE_XET", "1".into()),
        ("HF_HUB_DISABLE_TELEMETRY", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn source_root(src: &Path) -> String {
    manifest_root(src)
}

/// 1. `xfer sync` hands the job over and returns at once; the agents finish
///    it with the CLI gone: every member complete with the source's root and
///    the source's bytes.
#[test]
fn sync_returns_at_once_and_the_agents_finish_the_job() {
    let c = Cluster::start("sync-bg", 11, &["a", "b", "c"], &[]);
    let src = c.dir.path().join("src/m48");
    gen_model(&src, 48 * MIB, 11);
    let want = source_root(&src);

    let (id, r) = c.sync(
        &src,
        &["--from", "a", "--nodes", "a,b,c", "--limit-rate", "12MiB"],
    );
    assert!(
        r.elapsed < Duration::from_secs(5),
        "xfer sync took {:?}",
        r.elapsed
    );
    // The CLI is gone; the job is not done.
    let s = c.status();
    let pending: Vec<&str> = ["a", "b", "c"]
        .into_iter()
        .filter(|n| {
            s.model(n, "m48")
                .is_some_and(|m| matches!(m.state, ModelState::Queued | ModelState::Syncing))
        })
        .collect();
    assert!(
        !pending.is_empty(),
        "right after xfer sync returned, no member was queued or syncing: {s:#?}"
    );
    let job = s.job("a", &id).expect("the source knows the job");
    assert!(
        matches!(job.state, JobState::Queued | JobState::Syncing),
        "job state right after sync: {job:#?}"
    );
    assert_eq!(job.nodes, ["a", "b", "c"]);
    assert_eq!(job.source_node, "a");

    let root = c.wait_complete(&id, "a", &["a", "b", "c"], "m48");
    assert_eq!(root, want, "the root the nodes report is the source's");
    let s = c.status();
    for n in ["a", "b", "c"] {
        let m = s.model(n, "m48").unwrap();
        assert_eq!(m.bytes_total, tree_bytes(&src), "{n}: {m:#?}");
        assert_eq!(m.bytes_held, m.bytes_total, "{n}: {m:#?}");
        assert_same_tree(&src, &c.root(n).join("m48"));
    }
}

/// 2. `kill -9` a receiver and then the source mid-job; started again, the
///    agents finish the job with no further command.
#[test]
fn a_killed_receiver_and_source_finish_the_job_after_restarting() {
    let mut c = Cluster::start("sync-kill", 12, &["a", "b", "c", "d"], &[]);
    let src = c.dir.path().join("src/m48k");
    gen_model(&src, 48 * MIB, 12);
    let want = source_root(&src);
    let total = tree_bytes(&src);

    let (id, _) = c.sync(
        &src,
        &["--from", "a", "--nodes", "b,c,d", "--limit-rate", "8MiB"],
    );
    // Mid-job: b holds something, nobody holds everything.
    c.poll("b to hold part of m48k", Duration::from_secs(30), |s| {
        let m = s.model("b", "m48k")?;
        (m.state == ModelState::Syncing && m.bytes_held >= 4 * MIB).then_some(())
    });
    c.kill9("b");
    let before = c.status();
    c.kill9("a");
    for n in ["c", "d"] {
        let m = before.model(n, "m48k");
        assert!(
            m.is_none_or(|m| m.state != ModelState::Complete),
            "{n} was already complete when the source died; the test proves nothing: {before:#?}"
        );
    }
    assert!(
        !c.root("b").join("m48k").exists(),
        "b completed before it was killed"
    );
    std::thread::sleep(Duration::from_millis(500));

    c.restart("b");
    c.restart("a");
    let root = c.wait_complete(&id, "a", &["b", "c", "d"], "m48k");
    assert_eq!(root, want);
    let s = c.status();
    let job = s.job("a", &id).unwrap();
    assert!(
        job.rounds >= 2,
        "the restarted source ran a new round: {job:#?}"
    );
    for n in ["b", "c", "d"] {
        let m = s.model(n, "m48k").unwrap();
        assert_eq!(m.bytes_held, total);
        // The transfer the source's death cut short failed; the one that
        // completed made that error stale.
        assert_eq!(m.last_error, None, "{n}: {m:#?}");
        assert_same_tree(&src, &c.root(n).join("m48k"));
    }
    assert!(
        !c.root("a").join("m48k").exists(),
        "a is the source, not a member"
    );
}

/// 3. A node added later (sync again with it in --nodes) gets most of the
///    model from the nodes that hold it.
#[test]
fn a_node_added_later_is_fed_by_its_peers() {
    let c = Cluster::start("sync-add", 13, &["a", "b", "c", "d"], &[]);
    let src = c.dir.path().join("src/m32");
    gen_model(&src, 32 * MIB, 13);
    let want = source_root(&src);
    let total = tree_bytes(&src);

    let (first, _) = c.sync(&src, &["--from", "a", "--nodes", "a,b,c"]);
    assert_eq!(c.wait_complete(&first, "a", &["a", "b", "c"], "m32"), want);
    assert!(
        c.status().model("d", "m32").is_none(),
        "d is not a member yet"
    );

    let (second, _) = c.sync(
        &src,
        &["--from", "a", "--nodes", "a,b,c,d", "--limit-rate", "8MiB"],
    );
    assert_ne!(first, second);
    assert_eq!(
        c.wait_complete(&second, "a", &["a", "b", "c", "d"], "m32"),
        want
    );
    assert_same_tree(&src, &c.root("d").join("m32"));

    let s = c.status();
    let job = s.job("a", &second).unwrap();
    let d = job
        .delivered
        .iter()
        .find(|t| t.node == "d")
        .unwrap_or_else(|| panic!("no tally of d: {job:#?}"));
    assert!(d.ok, "{job:#?}");
    assert!(d.from_peers > 0, "d got nothing from peers: {job:#?}");
    assert!(
        d.from_source < total,
        "d got the whole model from the source: {job:#?}"
    );
    assert_eq!(
        d.from_source + d.from_peers,
        total,
        "d's bytes add up to the model: {job:#?}"
    );
    for t in job.delivered.iter().filter(|t| t.node != "d") {
        assert_eq!(
            t.from_source + t.from_peers,
            0,
            "{} already held the model: {job:#?}",
            t.node
        );
    }
    let m = s.model("d", "m32").unwrap();
    assert!(
        m.from_peers > 0 && m.from_source < total,
        "d's status: {m:#?}"
    );
}

/// 4. The periodic verify finds a file damaged behind the agent's back
///    (same size and mtime), repairs it from a peer and says so.
#[test]
fn periodic_verify_repairs_a_damaged_file_from_peers() {
    let c = Cluster::start(
        "sync-verify",
        14,
        &["a", "b", "c"],
        &["--verify-every", "1"],
    );
    let src = c.dir.path().join("src/m12");
    gen_model(&src, 12 * MIB, 14);
    let want = source_root(&src);
    let (id, _) = c.sync(&src, &["--from", "a", "--nodes", "a,b,c"]);
    assert_eq!(c.wait_complete(&id, "a", &["a", "b", "c"], "m12"), want);

    let bad = c.root("b").join("m12").join(SHARD1);
    flip_byte_keep_mtime(&bad, 3 * MIB + 12_345);
    assert!(same_bytes(&src.join(SHARD1), &bad).is_err());

    let m = c.poll(
        "b to repair the damaged shard",
        Duration::from_secs(30),
        |s| {
            let m = s.model("b", "m12")?;
            (m.repaired_files >= 1 && m.state == ModelState::Complete).then(|| m.clone())
        },
    );
    let err = m.last_error.clone().unwrap_or_default();
    assert!(
        err.contains(SHARD1) && err.contains("repaired"),
        "last_error names the file and the repair: {m:#?}"
    );
    assert!(!err.contains("failed"), "{m:#?}");
    assert_eq!(m.root.map(|r| r.to_hex()), Some(want.clone()));
    same_bytes(&src.join(SHARD1), &bad).unwrap();
    assert_same_tree(&src, &c.root("b").join("m12"));
    let (r, v) = verify(&c.root("b").join("m12"));
    assert!(
        r.success() && v["ok"] == true,
        "xfer verify after repair: {r:#?}"
    );
    // Nothing else was touched.
    let s = c.status();
    for n in ["a", "c"] {
        assert_eq!(s.model(n, "m12").unwrap().repaired_files, 0, "{s:#?}");
    }
}

/// Writes `text` to `dir/name` and returns its path.
fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, text).unwrap();
    p
}

/// 5. A malformed cluster file is refused by `status` and `sync` with the
///    line of the mistake.
#[test]
fn a_malformed_cluster_file_is_refused_with_its_line() {
    let t = tempdir("sync-badcluster");
    let src = t.path().join("src/m");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("x"), b"x").unwrap();
    let typo = write_file(
        t.path(),
        "typo.toml",
        "# a cluster with a typo\n\
         key = \"cluster.key\"\n\
         \n\
         [[node]]\n\
         name = \"a\"\n\
         agent = \"127.0.0.1:7001\"\n\
         fabirc_if = \"eth0\"\n\
         root = \"/srv/models\"\n",
    );
    let dup = write_file(
        t.path(),
        "dup.toml",
        "key = \"cluster.key\"\n\
         \n\
         [[node]]\n\
         name = \"a\"\n\
         agent = \"127.0.0.1:7001\"\n\
         root = \"/srv/models\"\n\
         \n\
         [[node]]\n\
         name = \"a\"\n\
         agent = \"127.0.0.1:7002\"\n\
         root = \"/srv/models\"\n",
    );
    let cases = [
        (&typo, 7, vec!["fabirc_if", "fabric_if"]),
        (&dup, 9, vec!["duplicate node name", "line 4"]),
    ];
    for (file, line, words) in &cases {
        let mut status = xfer();
        status.arg("status").arg("--cluster").arg(file);
        let mut sync = xfer();
        sync.arg("sync")
            .arg(&src)
            .arg("--cluster")
            .arg(file)
            .args(["--nodes", "a"]);
        for (what, mut cmd) in [("status", status), ("sync", sync)] {
            let r = run(&mut cmd, Duration::from_secs(20));
            let at = format!("{}:{line}:", file.display());
            let mut want: Vec<&str> = vec![&at];
            want.extend(words.iter().copied());
            let e = assert_error(&r, &want);
            assert!(
                e.starts_with(&format!("error: {at}")),
                "xfer {what}: the message starts with FILE:LINE: {e}"
            );
            assert!(r.stdout.is_empty(), "xfer {what}: {r:#?}");
        }
    }
}

/// 6. `status` reports a dead agent as unreachable within 5 s, and the
///    others as usual.
#[test]
fn status_reports_a_dead_agent_unreachable_quickly() {
    let mut c = Cluster::start("sync-down", 16, &["a", "b", "c"], &[]);
    c.kill9("b");
    let started = Instant::now();
    let r = run(&mut c.cmd("status", &["--json"]), Duration::from_secs(20));
    let took = started.elapsed();
    // A node down is a problem: exit 1, said on stderr; stdout stays the
    // one JSON document.
    assert_eq!(r.status.code(), Some(1), "xfer status --json: {r:#?}");
    assert_eq!(
        r.stderr.trim_end().lines().last(),
        Some("1 problem: node b unreachable"),
        "{r:#?}"
    );
    assert!(took < Duration::from_secs(5), "status took {took:?}");
    let s = Status(r.json());
    assert_eq!(s.0.len(), 3, "{s:#?}");
    let b = s.report("b");
    assert!(!b.reachable && b.status.is_none(), "{s:#?}");
    assert!(b.error.as_deref().is_some_and(|e| !e.is_empty()), "{s:#?}");
    assert_eq!(b.agent, c.member("b").addr);
    for n in ["a", "c"] {
        let r = s.report(n);
        assert!(r.reachable && r.error.is_none(), "{s:#?}");
        let st = r.status.as_ref().unwrap();
        assert_eq!(Path::new(&st.root), c.root(n));
    }

    // The table says so too, just as fast.
    let started = Instant::now();
    let r = run(&mut c.cmd("status", &[]), Duration::from_secs(20));
    let took = started.elapsed();
    assert_eq!(r.status.code(), Some(1), "xfer status: {r:#?}");
    assert!(took < Duration::from_secs(5), "status took {took:?}");
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("b "))
        .unwrap_or_else(|| panic!("no line of b: {r:#?}"));
    assert!(line.contains("unreachable"), "{line}");
    assert_eq!(
        r.stdout.trim_end().lines().last(),
        Some("1 problem: node b unreachable"),
        "{r:#?}"
    );

    // Back up: no problem, exit 0.
    c.restart("b");
    let r = run(&mut c.cmd("status", &[]), Duration::from_secs(20));
    r.assert_ok("xfer status with every node up");
    assert!(!r.stdout.contains("problem"), "{r:#?}");
}

/// 7. `cancel` stops a rate-limited job; `rm` refuses without --yes and no
///    terminal, and with --yes removes the model from the nodes.
#[test]
fn cancel_stops_a_job_and_rm_removes_the_model() {
    let c = Cluster::start("sync-cancel", 17, &["a", "b", "c"], &[]);
    let small = c.dir.path().join("src/small");
    gen_model(&small, 4 * MIB, 171);
    let big = c.dir.path().join("src/big");
    gen_model(&big, 48 * MIB, 172);
    let big_manifest = scan(&big, DEFAULT_CHUNK);
    let total = tree_bytes(&big);

    let (done, _) = c.sync(&small, &["--from", "a", "--nodes", "a,b,c"]);
    c.wait_complete(&done, "a", &["a", "b", "c"], "small");

    let (id, _) = c.sync(
        &big,
        &["--from", "a", "--nodes", "b,c", "--limit-rate", "4MiB"],
    );
    c.poll("b to receive part of big", Duration::from_secs(30), |s| {
        let m = s.model("b", "big")?;
        (m.state == ModelState::Syncing && m.bytes_held > 0).then_some(())
    });
    let r = run(&mut c.cmd("cancel", &[&id]), Duration::from_secs(20));
    r.assert_ok("xfer cancel");
    assert!(r.stdout.contains("a: cancelled"), "{r:#?}");

    let s = c.status();
    let job = s.job("a", &id).unwrap();
    assert_eq!(job.state, JobState::Cancelled, "{job:#?}");
    // Let what was in flight land, then nothing more arrives.
    let held =
        |n: &str| journal_held_bytes(&c.root(n).join(".xfer/staging/big/journal"), &big_manifest);
    c.poll("b and c to stop receiving", Duration::from_secs(15), |s| {
        ["b", "c"]
            .iter()
            .all(|n| {
                s.model(n, "big")
                    .is_none_or(|m| m.state != ModelState::Syncing)
            })
            .then_some(())
    });
    let before = (held("b"), held("c"));
    // The proof that b and c had the chance to keep receiving: a later
    // job from the same source reaches them both. Had the cancel left big
    // flowing, it would have flowed meanwhile.
    let later = c.dir.path().join("src/later");
    gen_model(&later, 4 * MIB, 173);
    let (after_id, _) = c.sync(&later, &["--from", "a", "--nodes", "b,c"]);
    c.wait_complete(&after_id, "a", &["b", "c"], "later");
    let after = (held("b"), held("c"));
    assert_eq!(before, after, "bytes kept arriving after the cancel");
    assert!(
        after.0 > 0 && after.0 < total && after.1 < total,
        "b holds part of the model, neither holds all of it: {after:?} of {total}"
    );
    let s = c.status();
    for n in ["b", "c"] {
        assert!(
            s.model(n, "big")
                .is_none_or(|m| m.state != ModelState::Complete),
            "{s:#?}"
        );
        assert!(!c.root(n).join("big").exists());
    }
    assert_eq!(s.job("a", &id).unwrap().state, JobState::Cancelled);

    // No --yes and no terminal: refused, nothing deleted.
    let r = run(&mut c.cmd("rm", &["small"]), Duration::from_secs(20));
    assert_error(&r, &["--yes", "small", "a, b, c"]);
    for n in ["a", "b", "c"] {
        assert_same_tree(&small, &c.root(n).join("small"));
    }

    // small from every node (a was its source too), big from b and c.
    let r = run(
        &mut c.cmd("rm", &["small", "--yes"]),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer rm small");
    for n in ["a", "b", "c"] {
        assert!(r.stdout.contains(&format!("{n}: removed small")), "{r:#?}");
    }
    let r = run(
        &mut c.cmd("rm", &["big", "--yes", "--nodes", "b,c"]),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer rm big");
    let s = c.status();
    for n in ["a", "b", "c"] {
        assert!(
            !c.root(n).join("small").exists(),
            "{n}: small is still there"
        );
        assert!(!c.root(n).join(".xfer/staging/big").exists());
        let models = &s.report(n).status.as_ref().unwrap().models;
        assert!(
            models.iter().all(|m| m.name != "small" && m.name != "big"),
            "{n} still lists a removed model: {models:#?}"
        );
    }
    assert!(small.is_dir() && big.is_dir(), "the sources stay");
}

/// 8. A Hub repo: the source node pulls it into its root (an HF cache) and
///    fans it out; every member ends with the same cache folder, which the
///    real client reads offline.
#[test]
fn a_hub_repo_lands_in_every_nodes_cache() {
    let t = tempdir("sync-hub-repos");
    let repos = t.path().join("repos");
    let repo_src = small_repo(&repos, "acme/tiny", 18);
    let server = HubServer::start(&repos, &[]);
    let env = hub_agent_env(&server, t.path());
    let c = Cluster::start_env("sync-hub", 18, &["a", "b"], &[], env);

    let r = run(
        c.cmd("sync", &["--json"])
            .arg("acme/tiny")
            .args(["--from", "a", "--nodes", "a,b"]),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer sync acme/tiny");
    let v: serde_json::Value = r.json();
    let id = v["job"].as_str().unwrap().to_string();
    assert_eq!(v["name"], "models--acme--tiny");
    let root = c.wait_complete(&id, "a", &["a", "b"], "models--acme--tiny");

    let meta = server.repo("acme/tiny");
    let (da, db) = (
        c.root("a").join("models--acme--tiny"),
        c.root("b").join("models--acme--tiny"),
    );
    assert_eq!(walk(&da), walk(&db), "the two caches differ");
    assert_eq!(manifest_root(&da), root);
    assert_eq!(manifest_root(&db), root);
    for (n, dir) in [("a", &da), ("b", &db)] {
        assert_cache(dir, &repo_src, &meta);
        let env = PullEnv::new(&server.endpoint(), t.path()).with_cache(c.root(n));
        let snap = offline_snapshot(&env, "acme/tiny");
        assert_eq!(
            Path::new(&snap),
            dir.join("snapshots").join(&meta.commit),
            "{n}"
        );
    }
    assert_eq!(
        server.stats()["resolve_get"],
        meta.files.len(),
        "the repo was pulled once, by a"
    );
}

/// 9. `xfer sync --transport`: the source's agent has no RDMA data plane
///    (started with `--transport quic`), so a job that demands RDMA fails
///    with the reason and delivers nothing; the same job over QUIC
///    completes.
#[test]
fn sync_transport_rdma_fails_where_the_agent_has_no_rdma_and_quic_completes() {
    let c = Cluster::start("sync-transport", 19, &["a", "b"], &["--transport", "quic"]);
    let src = c.dir.path().join("src/mt");
    gen_model(&src, 4 * MIB, 191);

    let (id, _) = c.sync(
        &src,
        &["--from", "a", "--nodes", "b", "--transport", "rdma"],
    );
    let state = c.poll("the rdma job to fail", Duration::from_secs(30), |s| {
        let job = s.job("a", &id)?;
        match &job.state {
            JobState::Failed { reason } => Some(reason.clone()),
            _ => None,
        }
    });
    assert!(
        state.contains("--transport rdma: the agent on a has no RDMA data plane"),
        "{state}"
    );
    assert!(
        state.contains("sync with --transport auto or quic"),
        "{state}"
    );
    assert!(!c.root("b").join("mt").exists(), "nothing may arrive");

    let (id, _) = c.sync(
        &src,
        &["--from", "a", "--nodes", "b", "--transport", "quic"],
    );
    let root = c.wait_complete(&id, "a", &["b"], "mt");
    assert_eq!(root, source_root(&src));
    assert_same_tree(&src, &c.root("b").join("mt"));
}

/// 10. A Hub sync job streams, and resumes after both its source (the
///     node pulling) and a member are `kill -9`'d mid-file: the download
///     is parked half-way by the Hub look-alike until both are back, and
///     the restarted job completes on every node without downloading the
///     written half again.
#[test]
fn a_streamed_hub_job_resumes_after_its_source_and_a_member_restart() {
    let t = tempdir("sync-hub-stream");
    let repos = t.path().join("repos");
    let big = "model-00001-of-00001.safetensors";
    let size = 8 * MIB + 99;
    let repo_src = gen_repo(
        &repos,
        "acme/parked",
        19,
        &[("config.json", 300), (big, size)],
    );
    let gate = t.path().join("gate");
    let hold = format!("hold:{big}:{}", gate.display());
    let server = HubServer::start(&repos, &["--rate", "20000000", "--fault", &hold]);
    let env = hub_agent_env(&server, t.path());
    let mut c = Cluster::start_env("sync-hub-stream", 19, &["a", "b", "c"], &[], env);
    let name = "models--acme--parked";
    let r = run(
        c.cmd("sync", &["--json"])
            .arg("acme/parked")
            .args(["--from", "a", "--nodes", "a,b,c"]),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer sync acme/parked");
    let v: serde_json::Value = r.json();
    let id = v["job"].as_str().unwrap().to_string();
    // The parked file's first half streams to the members.
    c.poll("b to hold streamed chunks", Duration::from_secs(60), |s| {
        let m = s.model("b", name)?;
        (m.state == ModelState::Syncing && m.bytes_held >= 2 * MIB).then_some(())
    });
    let blob = |n: &str| {
        c.root(n)
            .join(name)
            .join("blobs")
            .join(&server.repo("acme/parked").files[big].etag)
    };
    assert!(!blob("b").exists(), "placed before its sha256 matched");
    c.kill9("b");
    c.kill9("a");
    c.restart("a");
    c.restart("b");
    fs::write(&gate, b"go").unwrap();
    let root = c.wait_complete(&id, "a", &["a", "b", "c"], name);
    let meta = server.repo("acme/parked");
    for n in ["a", "b", "c"] {
        let dir = c.root(n).join(name);
        assert_eq!(manifest_root(&dir), root, "{n}");
        assert_cache(&dir, &repo_src, &meta);
    }
    // Half the file was written (and announced) before the kill: the
    // restarted pull resumes after it, so little is served twice.
    let served = server.stats()["bytes_served"].as_u64().unwrap();
    assert!(
        served <= meta.total() + 2 * MIB,
        "the Hub served {served} bytes for a {} byte repo",
        meta.total()
    );
}

/// `xfer status` with `args`, which must exit `code`; returns the run.
fn status_exits(c: &Cluster, args: &[&str], code: i32) -> common::Run {
    let r = run(&mut c.cmd("status", args), Duration::from_secs(20));
    assert_eq!(r.status.code(), Some(code), "xfer status {args:?}: {r:#?}");
    r
}

/// Whether `node` lists model `name` at all.
fn lists(s: &Status, node: &str, name: &str) -> bool {
    s.model(node, name).is_some()
}

/// 11. A job whose source folder does not exist fails; its source tells
///     the members, which then list no `queued` row of it; `status` exits
///     1 naming the job until `prune` removes it (and the complete job
///     before it) from every node, leaving a running job and every
///     model's data alone; then `status` exits 0.
#[test]
fn a_failed_job_leaves_no_row_and_status_fails_until_it_is_pruned() {
    let c = Cluster::start("sync-prune", 46, &["a", "b", "c"], &[]);
    let small = c.dir.path().join("src/small");
    gen_model(&small, 4 * MIB, 461);
    let (done, _) = c.sync(&small, &["--from", "a", "--nodes", "a,b,c"]);
    c.wait_complete(&done, "a", &["a", "b", "c"], "small");
    status_exits(&c, &[], 0);

    let nothing = c.dir.path().join("src/nothing");
    let (bad, _) = c.sync(&nothing, &["--from", "a", "--nodes", "b,c"]);
    c.poll("the members to learn the job failed", JOB_DEADLINE, |s| {
        ["a", "b", "c"]
            .iter()
            .all(|n| {
                s.job(n, &bad)
                    .is_some_and(|j| matches!(j.state, JobState::Failed { .. }))
            })
            .then_some(())
    });
    let s = c.status();
    for n in ["a", "b", "c"] {
        assert!(!lists(&s, n, "nothing"), "{n} lists a phantom row: {s:#?}");
    }
    let JobState::Failed { reason } = &s.job("b", &bad).unwrap().state else {
        unreachable!()
    };
    assert!(reason.contains("does not exist on a"), "{reason}");

    // The failed job is a problem, named on the last line; --json says it
    // on stderr and keeps stdout one document.
    let r = status_exits(&c, &[], 1);
    let last = r.stdout.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!("1 problem: job {bad} (nothing) failed"))
            && last.contains("xfer prune"),
        "{r:#?}"
    );
    let r = status_exits(&c, &["--json"], 1);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("one JSON document");
    assert_eq!(doc.as_array().map(Vec::len), Some(3), "{r:#?}");
    assert!(
        r.stderr.contains(&format!("job {bad} (nothing) failed")),
        "{r:#?}"
    );

    // A job still running when the prune comes.
    let big = c.dir.path().join("src/big");
    gen_model(&big, 32 * MIB, 462);
    let (running, _) = c.sync(
        &big,
        &["--from", "a", "--nodes", "b", "--limit-rate", "2MiB"],
    );
    c.poll("b to receive part of big", JOB_DEADLINE, |s| {
        let m = s.model("b", "big")?;
        (m.state == ModelState::Syncing && m.bytes_held > 0).then_some(())
    });

    let r = run(&mut c.cmd("prune", &[]), Duration::from_secs(30));
    r.assert_ok("xfer prune");
    for n in ["a", "b", "c"] {
        assert!(
            r.stdout
                .contains(&format!("{n}: removed job {bad} (nothing, failed)")),
            "{r:#?}"
        );
        assert!(
            r.stdout
                .contains(&format!("{n}: removed job {done} (small, complete)")),
            "{r:#?}"
        );
    }
    assert!(
        !r.stdout.contains(&running),
        "a running job was pruned: {r:#?}"
    );

    let s = c.status();
    for n in ["a", "b", "c"] {
        let st = s.report(n).status.as_ref().unwrap();
        assert!(
            st.jobs.iter().all(|j| j.id == running),
            "{n} still lists an ended job: {st:#?}"
        );
        assert_eq!(
            s.model(n, "small").map(|m| m.state),
            Some(ModelState::Complete),
            "{s:#?}"
        );
        assert_same_tree(&small, &c.root(n).join("small"));
        assert!(!lists(&s, n, "nothing"), "{s:#?}");
    }
    for n in ["a", "b"] {
        let j = s
            .job(n, &running)
            .unwrap_or_else(|| panic!("{n} lost the running job"));
        assert!(!j.state.is_final(), "{j:#?}");
    }
    let r = status_exits(&c, &[], 0);
    assert!(!r.stdout.contains("problem"), "{r:#?}");

    // Nothing left to prune but the running job, which stays.
    let r = run(
        &mut c.cmd("prune", &["--nodes", "b", "--json"]),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer prune --nodes b --json");
    let v: serde_json::Value = r.json();
    assert_eq!(v[0]["node"], "b", "{v}");
    assert_eq!(v[0]["pruned"].as_array().map(Vec::len), Some(0), "{v}");
    run(&mut c.cmd("cancel", &[&running]), Duration::from_secs(20)).assert_ok("xfer cancel");
}

/// 12. A cancelled job leaves no row of its model on its members, even on
///     one that was down when it was cancelled: the source tells it the
///     job ended once it is back. A cancelled job is no problem: `status`
///     exits 0.
#[test]
fn a_cancelled_job_leaves_no_row_even_on_a_member_that_was_down() {
    let mut c = Cluster::start("sync-ended", 47, &["a", "b", "c"], &[]);
    let big = c.dir.path().join("src/big");
    gen_model(&big, 32 * MIB, 471);
    let (id, _) = c.sync(
        &big,
        &["--from", "a", "--nodes", "b,c", "--limit-rate", "2MiB"],
    );
    c.poll("b to receive part of big", JOB_DEADLINE, |s| {
        let m = s.model("b", "big")?;
        (m.state == ModelState::Syncing && m.bytes_held > 0).then_some(())
    });
    c.kill9("c");
    let r = run(&mut c.cmd("cancel", &[&id]), Duration::from_secs(20));
    r.assert_ok("xfer cancel");
    assert!(r.stdout.contains("c: unreachable"), "{r:#?}");
    c.restart("c");

    let s = c.poll(
        "b and c to list no row of the cancelled job's model",
        JOB_DEADLINE,
        |s| {
            let ended = ["b", "c"].iter().all(|n| {
                s.job(n, &id)
                    .is_some_and(|j| j.state == JobState::Cancelled)
                    && !lists(s, n, "big")
            });
            ended.then(|| s.clone())
        },
    );
    assert!(!lists(&s, "a", "big"), "{s:#?}");
    assert!(
        c.root("b").join(".xfer/staging/big").exists(),
        "what b received stays for a later sync"
    );
    let r = status_exits(&c, &[], 0);
    assert!(!r.stdout.contains("problem"), "{r:#?}");
}

/// Striped intake (issue 36): the job of `sync --from a,b,c` on a repo.
struct Striped {
    t: tempfile::TempDir,
    repo_src: PathBuf,
    server: HubServer,
    c: Cluster,
    total: u64,
}

impl Striped {
    /// A 40 MiB repo on a Hub look-alike that caps each connection at
    /// 1 MB/s (a CDN's per-connection limit), and three agents; `liar`
    /// names one whose relayed ranges carry a flipped byte.
    fn start(tag: &str, net: u8, liar: Option<&str>) -> Striped {
        Self::start_with(tag, net, liar, &[])
    }

    /// [`Striped::start`] with more options for the Hub look-alike.
    fn start_with(tag: &str, net: u8, liar: Option<&str>, hub: &[&str]) -> Striped {
        Self::start_faulty(
            tag,
            net,
            liar.map(|n| (n, "XFER_FAULT_CORRUPT_INTAKE")),
            hub,
        )
    }

    /// [`Self::start_with`], node `fault.0` restarted with the fault hook
    /// `fault.1` set.
    fn start_faulty(tag: &str, net: u8, fault: Option<(&str, &str)>, hub: &[&str]) -> Striped {
        let t = tempdir(tag);
        let repos = t.path().join("repos");
        let spec = [
            ("config.json", 500),
            ("model-00001-of-00002.safetensors", 24 * MIB + 7),
            ("model-00002-of-00002.safetensors", 16 * MIB + 3),
        ];
        let repo_src = gen_repo(&repos, "acme/striped", net as u64, &spec);
        let total = spec.iter().map(|(_, s)| s).sum();
        let mut args = vec!["--rate", "1000000"];
        args.extend_from_slice(hub);
        let server = HubServer::start(&repos, &args);
        let env = hub_agent_env(&server, t.path());
        let mut c = Cluster::start_env(tag, net, &["a", "b", "c"], &[], env);
        if let Some((n, hook)) = fault {
            c.kill9(n);
            c.env.push((hook.into(), "1".into()));
            c.restart(n);
        }
        Striped {
            t,
            repo_src,
            server,
            c,
            total,
        }
    }

    /// Runs the job to completion; its tallies by node.
    fn run(&self) -> Vec<xfer_proto::admin::MemberTally> {
        let id = self.hand_over();
        self.finish(&id)
    }

    /// Hands the job over; its id.
    fn hand_over(&self) -> String {
        let r = run(
            self.c
                .cmd("sync", &["--json"])
                .arg("acme/striped")
                .args(["--from", "a,b,c", "--nodes", "a,b,c"]),
            Duration::from_secs(30),
        );
        r.assert_ok("xfer sync --from a,b,c");
        r.json::<serde_json::Value>()["job"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Waits for job `id` to complete and checks every node's cache; the
    /// job's tallies by node.
    fn finish(&self, id: &str) -> Vec<xfer_proto::admin::MemberTally> {
        let name = "models--acme--striped";
        let root = self.c.wait_complete(id, "a", &["a", "b", "c"], name);
        let meta = self.server.repo("acme/striped");
        for n in ["a", "b", "c"] {
            let dir = self.c.root(n).join(name);
            // The Hub's own hashes of every file, on every node.
            assert_cache(&dir, &self.repo_src, &meta);
            assert_eq!(manifest_root(&dir), root, "{n}");
        }
        let _ = &self.t;
        self.c.status().job("a", id).unwrap().delivered.clone()
    }
}

/// 12. `xfer sync ORG/NAME --from a,b,c`: every named node fetches ranges
///     of the repo from the Hub over its own connections, the Hub serves
///     each byte once, and every node ends with the Hub-verified cache.
#[test]
fn a_striped_hub_job_is_fetched_by_every_named_node_and_served_once() {
    let s = Striped::start("sync-striped", 19, None);
    let tallies = s.run();
    let served = s.server.stats()["bytes_served"].as_u64().unwrap();
    assert!(
        served as f64 <= 1.02 * s.total as f64,
        "the Hub served {served} bytes of a {}-byte repo: {tallies:#?}",
        s.total
    );
    for n in ["a", "b", "c"] {
        let t = tallies.iter().find(|t| t.node == n).unwrap();
        assert!(t.ok && t.named.is_none(), "{n}: {tallies:#?}");
        assert!(
            t.from_origin > 0,
            "{n} fetched nothing from the Hub: {tallies:#?}"
        );
    }
    let origin: u64 = tallies.iter().map(|t| t.from_origin).sum();
    assert_eq!(origin, served, "the shares add up to what the Hub served");
    // An intake node keeps what it fetched (checked against the source's
    // chunk hashes): the swarm does not send most of it back.
    for n in ["b", "c"] {
        let t = tallies.iter().find(|t| t.node == n).unwrap();
        let received = t.from_source + t.from_peers;
        // The tallies count the streamed rounds too: what it received and
        // what it fetched itself cover the whole repo.
        assert!(
            received + t.from_origin >= s.total,
            "{n} received {received} bytes and fetched {}: less than the repo: {tallies:#?}",
            t.from_origin
        );
        assert!(
            received + t.from_origin / 2 <= s.total,
            "{n} received {received} bytes over the fabric besides its own {} from the Hub: {tallies:#?}",
            t.from_origin
        );
    }
    let out = run(&mut s.c.cmd("status", &[]), Duration::from_secs(20));
    let line = out
        .stdout
        .lines()
        .find(|l| l.contains("acme/striped") && l.starts_with("job"))
        .unwrap_or_else(|| panic!("no job line: {}", out.stdout))
        .to_string();
    assert!(
        line.contains("from a (striped with b,c)") && line.contains("from the Hub: "),
        "{line}"
    );
}

/// 13. An intake node that relays wrong bytes (a fault hook flips one byte
///     of each range it sends): the file fails its Hub hash on the pulling
///     node, which fetches it again alone, names the liar, gives it no more
///     work, and no node places a file the Hub's hash did not confirm.
#[test]
fn a_lying_intake_node_is_named_and_no_node_places_its_bytes() {
    let s = Striped::start("sync-striped-liar", 20, Some("c"));
    let tallies = s.run();
    let c = tallies.iter().find(|t| t.node == "c").unwrap();
    assert!(
        c.named.as_deref().is_some_and(|w| w.contains("differ")),
        "c was not named: {tallies:#?}"
    );
    for n in ["a", "b"] {
        let t = tallies.iter().find(|t| t.node == n).unwrap();
        assert!(t.named.is_none(), "{n} named: {tallies:#?}");
    }
    let log = s.c.member("a").agent.as_ref().unwrap().log();
    assert!(
        log.contains("c sent bytes") && log.contains("differ from the origin's"),
        "{log}"
    );
}

/// 13b. An intake node whose route (or whose word) says "slow down,
///     Retry-After 20 s" to 5 of every 6 ranges, while nobody else hears
///     it (issue 53: it held the whole cluster 20 s at a time, and one
///     success in six kept it from retiring): only that node waits, the
///     cluster is never held, the node is retired, and the job completes.
#[test]
fn an_intake_node_alone_saying_slow_down_holds_only_itself_and_is_retired() {
    let s = Striped::start_faulty(
        "sync-striped-busy",
        23,
        Some(("c", "XFER_FAULT_BUSY_INTAKE")),
        &[],
    );
    let tallies = s.run();
    for t in &tallies {
        assert!(t.ok, "{}: {tallies:#?}", t.node);
    }
    let log = s.c.member("a").agent.as_ref().unwrap().log();
    assert!(
        log.contains("no other downloader hears it, so only this node waits"),
        "{log}"
    );
    assert!(
        !log.contains("every downloader of the cluster waits"),
        "a lone intake node held the cluster: {log}"
    );
    let c = tallies.iter().find(|t| t.node == "c").unwrap();
    assert!(
        c.named
            .as_deref()
            .is_some_and(|w| w.contains("heard by no other downloader")),
        "c was not retired: {tallies:#?}"
    );
}

/// 14. An intake node killed (`kill -9`) mid-stripe, with ranges of a file
///     parked half-way at the Hub: its ranges go back to the others, the
///     restarted node receives the model, and what was fetched is not
///     fetched again.
#[test]
fn a_killed_intake_node_leaves_its_ranges_to_the_others() {
    let gate_dir = tempdir("sync-striped-kill-gate");
    let gate = gate_dir.path().join("gate");
    let hold = format!("hold:model-00001-of-00002.safetensors:{}", gate.display());
    let mut s = Striped::start_with("sync-striped-kill", 21, None, &["--fault", &hold]);
    let id = s.hand_over();
    // Everything before the parked half has been served: c is mid-stripe.
    let total = s.total;
    let server = &s.server;
    wait_until("the Hub to serve all but the parked half", HANG, || {
        let served = server.stats()["bytes_served"].as_u64().unwrap();
        if served >= total - 13 * MIB {
            Ok(())
        } else {
            Err(format!("{served} of {total} bytes served"))
        }
    });
    s.c.kill9("c");
    fs::write(&gate, b"go").unwrap();
    s.c.restart("c");
    let tallies = s.finish(&id);
    let served = s.server.stats()["bytes_served"].as_u64().unwrap();
    assert!(
        served <= total + 4 * MIB,
        "the Hub served {served} bytes for a {total}-byte repo: {tallies:#?}"
    );
}

/// 15. The Hub's rate limiter opens a window while the three nodes fetch
///     their stripes: every range asked in it is answered 429 with
///     `Retry-After`. The first downloader to hear it holds the whole
///     cluster (the source's connections and every intake node's) until
///     the window ends: no node is retired or named for the origin's
///     "slow down", nothing is asked again in the window's second half
///     (everyone heard the first 429 long before), and the Hub still
///     serves the repo once.
#[test]
fn the_hubs_retry_after_holds_every_downloader_of_the_cluster() {
    let s = Striped::start_with("sync-striped-429", 22, None, &["--fault", "throttle:8:3"]);
    let tallies = s.run();
    let faults = &s.server.stats()["faults"];
    let throttled = faults["throttle"].as_u64().unwrap_or(0);
    assert!(throttled > 0, "the window never opened: {faults}");
    assert_eq!(
        faults["throttle_late"].as_u64().unwrap_or(0),
        0,
        "ranges were asked in the window's second half: {faults}"
    );
    for t in &tallies {
        assert!(t.ok && t.named.is_none(), "{}: {tallies:#?}", t.node);
    }
    let served = s.server.stats()["bytes_served"].as_u64().unwrap();
    assert!(
        served as f64 <= 1.02 * s.total as f64,
        "the Hub served {served} bytes of a {}-byte repo",
        s.total
    );
    let log = s.c.member("a").agent.as_ref().unwrap().log();
    assert!(
        log.contains("every downloader of the cluster waits"),
        "{log}"
    );
}

/// 16. The Hub moves `main` (one shard of the model changes) and the same
///     striped sync runs again over nodes that hold the old commit: every
///     node ends with the new commit's Hub-verified files under one root
///     (the old snapshot stays beside it, as huggingface_hub keeps it), and
///     the Hub serves only the changed shard (the unchanged files are in
///     the source's cache already), striped over the nodes again.
#[test]
fn a_striped_sync_after_the_hub_moved_main_fetches_only_what_changed() {
    let mut s = Striped::start("sync-striped-update", 25, None);
    let first = s.run();
    assert!(first.iter().all(|t| t.ok), "{first:#?}");
    let old_root =
        s.c.status()
            .complete_root(&["a", "b", "c"], "models--acme--striped")
            .expect("one root everywhere");
    // main moves: new bytes in the second shard; the look-alike, restarted
    // on the same ports, lists the new commit.
    let shard = "model-00002-of-00002.safetensors";
    let size = fs::metadata(s.repo_src.join(shard)).unwrap().len();
    write_random(&s.repo_src.join(shard), size, 4242);
    let repos = s.t.path().join("repos");
    s.server.restart(&repos, &["--rate", "1000000"]);
    let id = s.hand_over();
    let name = "models--acme--striped";
    let new_root = s.c.wait_complete(&id, "a", &["a", "b", "c"], name);
    assert_ne!(old_root, new_root, "b still holds the old commit");
    // The new commit's files through its snapshot on every node.
    let meta = s.server.repo("acme/striped");
    for n in ["a", "b", "c"] {
        let dir = s.c.root(n).join(name);
        assert_eq!(
            fs::read_to_string(dir.join("refs/main")).unwrap(),
            meta.commit,
            "{n}"
        );
        for path in meta.files.keys() {
            assert!(
                fs::read(s.repo_src.join(path)).unwrap()
                    == fs::read(dir.join("snapshots").join(&meta.commit).join(path)).unwrap(),
                "{path} on {n} is not the new commit's"
            );
        }
    }
    let tallies = s.c.status().job("a", &id).unwrap().delivered.clone();
    let served = s.server.stats()["bytes_served"].as_u64().unwrap();
    assert!(
        served as f64 <= 1.02 * size as f64,
        "the Hub served {served} bytes when one {size}-byte shard changed: {tallies:#?}"
    );
    for t in &tallies {
        assert!(t.ok && t.named.is_none(), "{}: {tallies:#?}", t.node);
    }
    let origin: u64 = tallies.iter().map(|t| t.from_origin).sum();
    assert_eq!(origin, served, "the shares add up to what the Hub served");
}

/// 17. `xfer sync` hands a job to every node at once, so a job that fails
///     at once (its folder does not exist) can end on its source before a
///     member took it. Here the source gets the job first and fails it;
///     only once it has told the member, which did not hold the job yet,
///     is the member handed it. The member still learns the job failed:
///     the source tells it again while it does not know the job.
#[test]
fn a_member_handed_a_job_after_it_failed_still_learns_it_failed() {
    use xfer_proto::admin::{AdminReply, AdminRequest, JobMember, JobSource, JobSpec};
    let c = Cluster::start("sync-late-member", 26, &["a", "b"], &[]);
    let cred = xfer::config::auth::Credential::load(&c.key).unwrap();
    let (a, b) = (
        c.member("a").agent.as_ref().unwrap(),
        c.member("b").agent.as_ref().unwrap(),
    );
    let spec = JobSpec {
        id: "late-member-1".into(),
        name: xfer_proto::names::ModelName::new("nothing").unwrap(),
        source: JobSource::Path(c.dir.path().join("src/nothing")),
        source_node: "a".into(),
        members: vec![JobMember {
            node: "b".into(),
            agent: b.addr.clone(),
            data: None,
        }],
        chunk_size: xfer_proto::manifest::ChunkSize::Auto,
        limit_rate: None,
        transport: Default::default(),
        peers: None,
        hub_endpoint: None,
        intake: Vec::new(),
        give_up: Default::default(),
    };
    let hand = |node: &str, agent: &common::Agent| {
        let req = AdminRequest::SyncJob {
            node: node.into(),
            job: Box::new(spec.clone()),
            hub_token: None,
        };
        let reply = ask_admin(&cred, node, agent, &req);
        assert!(matches!(reply, AdminReply::JobAccepted { .. }), "{reply:?}");
    };
    hand("a", a);
    wait_until(
        "a to tell b, which lacks the job, that it failed",
        HANG,
        || {
            let log = a.log();
            if log.contains("b does not hold the job yet") {
                Ok(())
            } else {
                Err(Text(log))
            }
        },
    );
    hand("b", b);
    c.poll("b to learn the job failed", JOB_DEADLINE, |s| {
        s.job("b", &spec.id)
            .is_some_and(|j| matches!(j.state, JobState::Failed { .. }))
            .then_some(())
    });
}
