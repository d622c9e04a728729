//! What an authenticated caller may do beyond moving models, each attack
//! performed against a real agent: starting a process (a rank, a version
//! probe) on an agent without `--allow-launch`, or with `--allow-exec`
//! naming other programs, and syncing from a folder outside the root and
//! the exports. Each must be refused with one line naming the node and the
//! switch, and leave nothing behind. And a rank record planted to point at
//! an unrelated process must never get that process signalled.

use std::path::Path;
use std::time::Duration;

use crate::common;
use common::cluster::Cluster;
use common::*;
use xfer::client;
use xfer::config::auth::Credential;
use xfer_proto::launch::*;

/// A rank whose one process writes `id` to `out`.
fn id_rank(run: &str, out: &Path) -> LaunchRequest {
    let argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        format!("id > '{}'; exec sleep 600", out.display()),
    ];
    LaunchRequest::StartRank(Box::new(RankSpec {
        run: run.into(),
        node: "n1".parse().unwrap(),
        rank: 0,
        env: Default::default(),
        procs: vec![ProcSpec {
            argv,
            wait_tcp: None,
        }],
        on_stop: vec![],
        group: vec![],
        wait_timeout_ms: 1_000,
        grace_ms: 1_000,
        weights: None,
        evict_page_cache: false,
        container: None,
        caches: None,
        held: false,
        rendezvous: None,
    }))
}

/// A preflight that asks for the output of `id` as a "version".
fn id_probe(out: &Path) -> LaunchRequest {
    LaunchRequest::Preflight(Box::new(PreflightRequest {
        node: "n1".parse().unwrap(),
        fabric_if: "lo".into(),
        fabric_ip: "127.0.0.1".parse().unwrap(),
        model_path: "/nonexistent".into(),
        revision: None,
        ports: vec![],
        listen_port: None,
        peers: vec![],
        window_ms: 0,
        versions: vec![VersionProbe {
            what: "engine".into(),
            argv: vec![
                "sh".into(),
                "-c".into(),
                format!("id > '{}'; echo 1.0", out.display()),
            ],
            python_of: None,
        }],
        rdma: None,
        image: None,
        resolve: Vec::new(),
        loader_link: false,
    }))
}

/// A rendezvous probe of one rank in `program`'s Python.
fn rendezvous(program: &str) -> LaunchRequest {
    LaunchRequest::Rendezvous(Box::new(xfer_proto::launch::RendezvousRequest {
        node: "n1".parse().unwrap(),
        python_of: program.into(),
        rank: 0,
        world: 1,
        master: "127.0.0.61:1".parse().unwrap(),
        fabric_if: "lo".into(),
        timeout_ms: 5_000,
    }))
}

fn ask(cred: &Credential, agent: &Agent, req: &LaunchRequest) -> LaunchReply {
    ask_launch(cred, "n1", agent, req)
}

fn refusal(reply: LaunchReply) -> String {
    match reply {
        LaunchReply::Failed(Refusal::Forbidden(why)) => why,
        other => panic!("expected a Forbidden refusal, got {other:?}"),
    }
}

#[test]
fn an_agent_starts_no_process_unless_its_operator_allowed_launches() {
    let t = tempdir("permit-launch");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let (root, out) = (t.path().join("root"), t.path().join("id.out"));
    std::fs::create_dir_all(&root).unwrap();

    // Off by default: neither a rank nor a version probe runs.
    let agent = Agent::start("127.0.0.61:0", &root, &key);
    let why = refusal(ask(&cred, &agent, &id_rank("r1", &out)));
    assert!(why.starts_with("n1: launching is off"), "{why}");
    assert!(why.contains("--allow-launch"), "{why}");
    let LaunchReply::PreflightReport(facts) = ask(&cred, &agent, &id_probe(&out)) else {
        panic!("no preflight report");
    };
    match &facts.versions[0].version {
        Probe::Skipped(why) => assert!(why.contains("--allow-launch"), "{why}"),
        other => panic!("the version probe ran: {other:?}"),
    }
    // Nor the rendezvous probe, which would run the engine's Python.
    match ask(&cred, &agent, &rendezvous("python3")) {
        LaunchReply::Rendezvoused(Probe::Failed(why)) => {
            assert!(why.contains("--allow-launch"), "{why}")
        }
        other => panic!("the rendezvous probe ran: {other:?}"),
    }
    drop(agent);

    // Allowed, but only `vllm`: `sh` is refused, naming the flag to add.
    let agent = Agent::start_with(
        "127.0.0.61:0",
        &root,
        &key,
        &["--allow-launch", "--allow-exec", "vllm"],
    );
    let why = refusal(ask(&cred, &agent, &id_rank("r2", &out)));
    assert!(why.contains("--allow-exec sh"), "{why}");
    match ask(&cred, &agent, &rendezvous("python3")) {
        LaunchReply::Rendezvoused(Probe::Failed(why)) => {
            assert!(why.contains("--allow-exec python3"), "{why}")
        }
        other => panic!("the rendezvous probe ran: {other:?}"),
    }
    drop(agent);
    assert!(!out.exists(), "a refused request ran `id`");
    assert!(
        !root.join(".xfer/runs").exists()
            || std::fs::read_dir(root.join(".xfer/runs"))
                .unwrap()
                .next()
                .is_none(),
        "a refused rank left a run record"
    );

    // The control: with launches allowed, the same request does run.
    let agent = Agent::start_with("127.0.0.61:0", &root, &key, &["--allow-launch"]);
    assert!(matches!(
        ask(&cred, &agent, &id_rank("r3", &out)),
        LaunchReply::Runs(_)
    ));
    wait_until(
        "the rank to write id's output",
        Duration::from_secs(30),
        || std::fs::read_to_string(&out).is_ok_and(|s| s.contains("uid=")),
    );
    let stop = LaunchRequest::StopRun {
        run: Some("r3".into()),
        grace_ms: 100,
        reason: "test over".into(),
    };
    assert!(matches!(ask(&cred, &agent, &stop), LaunchReply::Runs(_)));
}

#[test]
fn a_sync_from_outside_the_root_and_the_exports_is_refused() {
    let c = Cluster::start("permit-export", 62, &["a", "b"], &[]);
    let r = run(
        c.cmd("sync", &["--json"])
            .arg("/etc")
            .args(["--from", "a", "--nodes", "b"]),
        Duration::from_secs(30),
    );
    assert!(!r.success(), "syncing /etc was accepted: {}", r.stdout);
    assert!(
        r.stderr.contains("/etc is outside a's root") && r.stderr.contains("--export /etc"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    for n in ["a", "b"] {
        assert!(!c.root(n).join("etc").exists(), "{n} holds /etc");
    }
    // A folder the cluster's agents export (the test's own) still syncs.
    let src = c.dir.path().join("m");
    gen_model(&src, 2 * MIB, 7);
    let (id, _) = c.sync(&src, &["--from", "a", "--nodes", "b"]);
    c.wait_complete(&id, "a", &["b"], "m");
}

#[test]
fn a_job_id_that_is_a_path_reads_and_writes_nothing_outside_the_jobs_folder() {
    let c = Cluster::start("permit-cancel", 63, &["a"], &[]);
    // `<root>/.xfer/jobs/../../x.json` is `<root>/x.json`.
    let planted = c.root("a").join("x.json");
    std::fs::write(&planted, b"planted").unwrap();
    let cred = Credential::load(&c.key).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for id in ["../../x", "/etc/passwd", "a/../../x"] {
        let req = xfer_proto::admin::AdminRequest::CancelJob { id: id.into() };
        let reply = rt
            .block_on(client::admin(
                &cred,
                "a",
                &c.member("a").addr,
                &req,
                Duration::from_secs(10),
            ))
            .expect("the agent answers");
        match reply {
            xfer_proto::admin::AdminReply::Failed(Refusal::Protocol(why)) => {
                assert!(why.contains("job id"), "{id}: {why}")
            }
            other => panic!("{id}: expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(std::fs::read(&planted).unwrap(), b"planted");
    // The CLI says so before it asks anyone.
    let r = run(&mut c.cmd("cancel", &["../../x"]), Duration::from_secs(30));
    assert!(!r.success());
    assert!(r.stderr.contains("job id `../../x`"), "{}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
}

#[test]
fn rm_deletes_a_folder_xfer_did_not_place_only_with_force() {
    let c = Cluster::start("permit-rm", 64, &["a"], &[]);
    let notes = c.root("a").join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    std::fs::write(notes.join("keep.txt"), b"mine").unwrap();
    let r = run(
        &mut c.cmd("rm", &["notes", "--yes"]),
        Duration::from_secs(30),
    );
    assert!(!r.success(), "{}", r.stdout);
    assert!(
        r.stdout.contains("a: FAILED") && r.stdout.contains("--force"),
        "{}",
        r.stdout
    );
    assert_eq!(std::fs::read(notes.join("keep.txt")).unwrap(), b"mine");
    let r = run(
        &mut c.cmd("rm", &["notes", "--yes", "--force"]),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer rm --force");
    assert!(!notes.exists());
}

#[test]
fn a_hub_token_is_never_sent_over_plain_http_to_another_machine() {
    let t = tempdir("permit-token");
    let cache = t.path().join("hub");
    // 192.0.2.1 (TEST-NET-1) is never reached: the pull must stop first.
    let r = run(
        xfer()
            .args(["pull", "acme/model", "--json"])
            .env("HF_ENDPOINT", "http://192.0.2.1:9")
            .env("HF_TOKEN", "hf_secret_value")
            .env("HF_HUB_CACHE", &cache)
            .env("HF_HOME", t.path().join("hf-home")),
        Duration::from_secs(30),
    );
    assert!(!r.success(), "{r:#?}");
    assert!(
        r.stderr.contains("plain http") && r.stderr.contains("unset HF_TOKEN"),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("hf_secret_value") && !r.stdout.contains("hf_secret_value"));
    assert!(
        !cache.exists() || std::fs::read_dir(&cache).unwrap().next().is_none(),
        "the refused pull wrote into the cache"
    );
}

/// The agent checks the launcher's weight gate again before it starts a
/// rank: a gate naming another root (the model changed since the
/// preflight, or a caller skipped it) starts nothing.
#[test]
fn an_agent_starts_no_rank_on_weights_it_does_not_hold_verified() {
    let t = tempdir("permit-weights");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let (root, out) = (t.path().join("root"), t.path().join("id.out"));
    std::fs::create_dir_all(&root).unwrap();
    let agent = Agent::start_with("127.0.0.62:0", &root, &key, &["--allow-launch"]);
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 62);
    let pushed = push_ok(&src, &[&agent.addr], &key, &[]);
    let path = root.join("m").display().to_string();
    let with_gate = |run: &str, root: xfer_proto::hash::Hash| {
        let LaunchRequest::StartRank(mut spec) = id_rank(run, &out) else {
            unreachable!()
        };
        spec.weights = Some(WeightGate {
            path: path.clone(),
            root,
        });
        LaunchRequest::StartRank(spec)
    };

    let other = xfer_proto::hash::Hash::from(blake3::hash(b"another model"));
    let why = refusal(ask(&cred, &agent, &with_gate("w1", other)));
    assert!(why.contains("not starting rank 0"), "{why}");
    assert!(why.contains(&other.short().to_string()), "{why}");
    let missing = WeightGate {
        path: root.join("absent").display().to_string(),
        root: pushed.root,
    };
    let LaunchRequest::StartRank(mut spec) = id_rank("w2", &out) else {
        unreachable!()
    };
    spec.weights = Some(missing);
    let why = refusal(ask(&cred, &agent, &LaunchRequest::StartRank(spec)));
    assert!(why.contains("not held by the xfer agent"), "{why}");
    assert!(
        !out.exists(),
        "a rank started on weights the agent does not hold"
    );

    // The root it holds: the rank starts.
    let reply = ask(&cred, &agent, &with_gate("w3", pushed.root));
    assert!(matches!(reply, LaunchReply::Runs(_)), "{reply:?}");
    ask(
        &cred,
        &agent,
        &LaunchRequest::StopRun {
            run: Some("w3".into()),
            grace_ms: 1_000,
            reason: "test over".into(),
        },
    );
}

#[test]
fn an_agent_materialises_compile_caches_only_beneath_its_root() {
    use xfer_proto::compile_cache::{snapshot_name, CacheGate};
    let t = tempdir("permit-caches");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let (root, out) = (t.path().join("root"), t.path().join("id.out"));
    std::fs::create_dir_all(&root).unwrap();
    let agent = Agent::start_with("127.0.0.63:0", &root, &key, &["--allow-launch"]);
    let name = snapshot_name("vllm", &["vllm".into()]);
    let src = t.path().join(&name);
    std::fs::create_dir_all(src.join("vllm/torch_compile_cache")).unwrap();
    std::fs::write(
        src.join("vllm/torch_compile_cache/graph.bin"),
        b"compiled\n",
    )
    .unwrap();
    let pushed = push_ok(&src, &[&agent.addr], &key, &[]);
    let with_gate = |run: &str, gate: CacheGate| {
        let LaunchRequest::StartRank(mut spec) = id_rank(run, &out) else {
            unreachable!()
        };
        spec.caches = Some(gate);
        LaunchRequest::StartRank(spec)
    };
    let gate = |name: &str, kinds: &[&str]| CacheGate {
        name: name.into(),
        root: pushed.root,
        kinds: kinds.iter().map(|k| k.to_string()).collect(),
    };

    // A name or a kind that is a path: refused before anything is read.
    let why = refusal(ask(
        &cred,
        &agent,
        &with_gate("c1", gate("../../etc", &["vllm"])),
    ));
    assert!(
        why.contains("compile cache name `../../etc` is not xfer-caches-"),
        "{why}"
    );
    let why = refusal(ask(
        &cred,
        &agent,
        &with_gate("c2", gate(&name, &["../../tmp"])),
    ));
    assert!(why.contains("compile cache kind `../../tmp`"), "{why}");

    // A symlink planted where the live caches go: the copy would land
    // outside the root, so the agent refuses and writes nothing there.
    let outside = t.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join(".xfer-caches")).unwrap();
    let why = refusal(ask(&cred, &agent, &with_gate("c3", gate(&name, &["vllm"]))));
    assert!(why.contains("not starting rank 0"), "{why}");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "{why}");
    assert!(!out.exists(), "a rank started: {why}");
    std::fs::remove_file(root.join(".xfer-caches")).unwrap();

    // The snapshot it holds: copied into the live folder, then the rank starts.
    let reply = ask(&cred, &agent, &with_gate("c4", gate(&name, &["vllm"])));
    assert!(matches!(reply, LaunchReply::Runs(_)), "{reply:?}");
    let live = root
        .join(".xfer-caches")
        .join(&name)
        .join("vllm/torch_compile_cache/graph.bin");
    assert_eq!(std::fs::read(&live).unwrap(), b"compiled\n");
    ask(
        &cred,
        &agent,
        &LaunchRequest::StopRun {
            run: Some("c4".into()),
            grace_ms: 1_000,
            reason: "test over".into(),
        },
    );
}

/// A rank of one `sleep 600`, with `env`.
fn sleep_spec(run: &str, env: &[(&str, &str)]) -> RankSpec {
    RankSpec {
        run: run.into(),
        node: "n1".parse().unwrap(),
        rank: 0,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        procs: vec![ProcSpec {
            argv: vec!["sleep".into(), "600".into()],
            wait_tcp: None,
        }],
        on_stop: vec![],
        group: vec![],
        wait_timeout_ms: 1_000,
        grace_ms: 1_000,
        weights: None,
        evict_page_cache: false,
        container: None,
        caches: None,
        held: false,
        rendezvous: None,
    }
}

/// Plants a live `rank.json` for run `run` whose one process is `pid`,
/// where the agent keeps its ranks (`<root>/.xfer/runs/<run>/`).
fn plant_rank(root: &Path, run: &str, pid: u32, boot_id: &str, start: u64) {
    let dir = root.join(".xfer/runs").join(run);
    std::fs::create_dir_all(&dir).unwrap();
    let rec = serde_json::json!({
        "spec": sleep_spec(run, &[]),
        "started_unix": 1,
        "state": RunState::Running,
        "procs": [ProcState::Running { pid }],
        "failed_ms": null,
        "boot_id": boot_id,
        "starts": [start],
    });
    std::fs::write(dir.join("rank.json"), serde_json::to_vec(&rec).unwrap()).unwrap();
}

fn stop_all() -> LaunchRequest {
    LaunchRequest::StopRun {
        run: None,
        grace_ms: 200,
        reason: "xfer-launch down".into(),
    }
}

fn runs(reply: LaunchReply) -> Vec<RankReport> {
    match reply {
        LaunchReply::Runs(r) => r,
        other => panic!("expected the runs, got {other:?}"),
    }
}

#[test]
fn a_planted_rank_record_never_gets_an_unrelated_process_signalled() {
    use xfer::sysinfo::proc;
    let t = tempdir("permit-stale");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();

    // The victim leads its own process group, as a rank's process would.
    let mut victim = Proc::spawn(std::process::Command::new("setsid").args(["sleep", "1000"]));
    let pid = victim.pid();
    wait_until(
        "the victim to lead its own group",
        Duration::from_secs(10),
        || proc::stat(pid).unwrap().is_some_and(|s| s.pgrp == pid),
    );
    let start = proc::start_ticks(pid).unwrap().unwrap();
    let boot = proc::boot_id().unwrap();
    // (a) as if written before a reboot; (b) this boot, but the pid is now
    // another process than the one recorded.
    plant_rank(
        &root,
        "other-boot",
        pid,
        "00000000-0000-0000-0000-000000000000",
        start,
    );
    plant_rank(&root, "reused-pid", pid, &boot, start + 1);

    let agent = Agent::start_with("127.0.0.66:0", &root, &key, &["--allow-launch"]);
    let reports = runs(ask(&cred, &agent, &stop_all()));
    let mut seen: Vec<&str> = reports.iter().map(|r| r.run.as_str()).collect();
    seen.sort();
    assert_eq!(seen, ["other-boot", "reused-pid"], "{reports:?}");
    for r in &reports {
        let RunState::Failed(why) = &r.state else {
            panic!("{}: {:?}", r.run, r.state);
        };
        assert!(why.starts_with("stale record: "), "{why}");
        assert!(why.contains("never signalled"), "{why}");
        let cause = match r.run.as_str() {
            "other-boot" => "written in another boot",
            _ => &format!("pid {pid} is now another process"),
        };
        assert!(why.contains(cause), "{}: {why}", r.run);
    }
    assert!(victim.running(), "the agent killed an unrelated process");
    // A query says the same, and the agent logged why.
    let reports = runs(ask(&cred, &agent, &LaunchRequest::RunQuery { run: None }));
    assert_eq!(reports.len(), 2);
    assert!(reports
        .iter()
        .all(|r| matches!(&r.state, RunState::Failed(w) if w.starts_with("stale record"))));
    let log = agent.log();
    assert!(
        log.contains("stale record") && log.contains("another boot"),
        "{log}"
    );
    // A second stop signals nothing either.
    runs(ask(&cred, &agent, &stop_all()));
    assert!(victim.running(), "the agent killed an unrelated process");
    drop(agent);
    victim.kill9();
}

#[test]
fn a_restarted_agent_still_stops_the_rank_it_started_and_keeps_its_record_private() {
    use std::os::unix::fs::PermissionsExt;
    use xfer::sysinfo::proc;
    let t = tempdir("permit-adopt");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();

    let mut agent = Agent::start_with("127.0.0.66:0", &root, &key, &["--allow-launch"]);
    let start = LaunchRequest::StartRank(Box::new(sleep_spec(
        "r1",
        &[("XFER_TEST_SECRET", "s3cret-value")],
    )));
    runs(ask(&cred, &agent, &start));
    let query = LaunchRequest::RunQuery {
        run: Some("r1".into()),
    };
    let mut pid = 0;
    wait_until("the rank to run", Duration::from_secs(30), || {
        match runs(ask(&cred, &agent, &query))[0].procs[0].state {
            ProcState::Running { pid: p } => {
                pid = p;
                true
            }
            _ => false,
        }
    });
    // The record holds the env value; only the agent's user may read it.
    let dir = root.join(".xfer/runs/r1");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("rank.json")), 0o600);
    assert_eq!(mode(&dir.join("rank.log")), 0o600);
    let rec = std::fs::read_to_string(dir.join("rank.json")).unwrap();
    assert!(rec.contains("s3cret-value") && rec.contains(&proc::boot_id().unwrap()));
    assert!(!agent.log().contains("s3cret-value"), "{}", agent.log());

    // A new agent adopts the rank, and stopping it reaches the process.
    agent.kill9();
    let agent = Agent::start_with("127.0.0.66:0", &root, &key, &["--allow-launch"]);
    let reports = runs(ask(&cred, &agent, &stop_all()));
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(
        reports[0].state,
        RunState::Stopped("xfer-launch down".into())
    );
    wait_until("the adopted rank to end", Duration::from_secs(10), || {
        proc::stat(pid).unwrap().is_none_or(|s| s.state == 'Z')
    });
}
