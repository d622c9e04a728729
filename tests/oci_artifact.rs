//! `xfer pull oci://`: a CNCF ModelPack model artifact (raw and tar layers,
//! pushed into Debian's registry by `tests/oci_push.py` as `modctl push`
//! would) placed as a model folder and pushed to two agents; an artifact
//! whose layer leaves the folder, and one of another type, are refused in
//! one line with nothing placed. `xfer sync oci://`: the same artifact as
//! an agent job to three nodes (its weight streamed while it downloads),
//! then a new tag of it in place, then an unknown tag and a layer that
//! leaves the folder, each failing the job in one line with nothing
//! placed.

use std::path::Path;
use std::time::Duration;

use crate::common::cluster::Cluster;
use crate::common::docker::RegistryServer;
use crate::common::*;

fn oci_push(addr: &str, repo: &str, tag: &str, spec: &serde_json::Value, dir: &Path) -> String {
    let f = dir.join(format!("{tag}.json"));
    std::fs::write(&f, spec.to_string()).unwrap();
    let out = std::process::Command::new("python3")
        .arg(hub::workspace_root().join("tests/oci_push.py"))
        .args([addr, repo, tag])
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "oci_push.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_modelpack_artifact_becomes_a_model_folder_on_two_agents() {
    if std::process::Command::new("docker-registry")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("docker-registry is missing: scripts/test.sh installs it (apt-get install docker-registry)");
    }
    let t = tempdir("oci-artifact");
    let reg =
        RegistryServer::start_in(&t.path().join("registry"), None, "127.0.0.161", 15161, None);
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("tok")).unwrap();
    std::fs::write(src.join("config.json"), b"{\"model_type\": \"llama\"}\n").unwrap();
    write_random(&src.join("model.safetensors"), 3 << 20, 7);
    std::fs::write(src.join("tok/tokenizer.json"), b"{}\n").unwrap();
    std::fs::write(src.join("tok/special.json"), b"[]\n").unwrap();
    let f = |p: &str| src.join(p).display().to_string();
    let spec = serde_json::json!([
        {"media": "application/vnd.cncf.model.weight.config.v1.raw", "path": "config.json", "file": f("config.json")},
        {"media": "application/vnd.cncf.model.weight.v1.raw", "path": "model.safetensors", "file": f("model.safetensors")},
        {"media": "application/vnd.cncf.model.weight.config.v1.tar", "tar": {
            "tokenizer.json": f("tok/tokenizer.json"), "extra/special.json": f("tok/special.json")}},
    ]);
    oci_push(&reg.addr, "org/tiny", "v1", &spec, t.path());

    let key = t.path().join("key");
    keygen(&key);
    let a = Agent::start("127.0.0.162:0", &t.path().join("ra"), &key);
    let b = Agent::start("127.0.0.163:0", &t.path().join("rb"), &key);
    let dir = t.path().join("tiny");
    let r = run(
        xfer()
            .env("XDG_CACHE_HOME", t.path().join("cache"))
            .args([
                "pull",
                &format!("oci://{}/org/tiny:v1", reg.addr),
                "--insecure",
                "--json",
                "--local-dir",
            ])
            .arg(&dir)
            .args(["--to", &format!("{},{}", a.addr, b.addr), "--key"])
            .arg(&key),
        Duration::from_secs(120),
    );
    r.assert_ok("pull oci://");
    let v: serde_json::Value = r.json();
    assert_eq!(v["artifact"]["files"], 4, "{v}");
    let expect = [
        ("config.json", "config.json"),
        ("model.safetensors", "model.safetensors"),
        ("tokenizer.json", "tok/tokenizer.json"),
        ("extra/special.json", "tok/special.json"),
    ];
    for root in [&dir, &a.root.join("tiny"), &b.root.join("tiny")] {
        for (placed, from) in expect {
            assert_eq!(
                std::fs::read(root.join(placed)).unwrap(),
                std::fs::read(src.join(from)).unwrap(),
                "{} in {}",
                placed,
                root.display()
            );
        }
    }
    assert_eq!(v["push"]["nodes"][0]["ok"], true, "{v}");

    // A raw layer whose path leaves the folder: refused, nothing placed.
    let evil = serde_json::json!([
        {"media": "application/vnd.cncf.model.weight.config.v1.raw", "path": "config.json", "file": f("config.json")},
        {"media": "application/vnd.cncf.model.weight.v1.raw", "path": "../../outside.bin", "file": f("config.json")},
    ]);
    oci_push(&reg.addr, "org/evil", "v1", &evil, t.path());
    let bad = t.path().join("bad");
    let r = run(
        xfer()
            .env("XDG_CACHE_HOME", t.path().join("cache"))
            .args([
                "pull",
                &format!("oci://{}/org/evil:v1", reg.addr),
                "--insecure",
                "--local-dir",
            ])
            .arg(&bad),
        Duration::from_secs(60),
    );
    assert!(!r.success());
    assert!(
        r.stderr.contains("stay inside the model folder"),
        "{}",
        r.stderr
    );
    assert!(!bad.join("config.json").exists(), "nothing placed");
    assert!(!t.path().join("outside.bin").exists());

    // A compressed layer: named, with the fix.
    let gz = serde_json::json!([
        {"media": "application/vnd.cncf.model.weight.v1.tar+gzip", "tar": {"w.bin": f("config.json")}},
    ]);
    oci_push(&reg.addr, "org/gz", "v1", &gz, t.path());
    let r = run(
        xfer()
            .env("XDG_CACHE_HOME", t.path().join("cache"))
            .args([
                "pull",
                &format!("oci://{}/org/gz:v1", reg.addr),
                "--insecure",
                "--local-dir",
            ])
            .arg(t.path().join("gz")),
        Duration::from_secs(60),
    );
    assert!(!r.success());
    assert!(
        r.stderr.contains("tar+gzip") && r.stderr.contains("does not read yet"),
        "{}",
        r.stderr
    );
    drop(reg);
}

/// The files of a ModelPack artifact (the spec `oci_push.py` reads) built
/// under `src`: a config, a weight of `weight` bytes (seeded by `seed`),
/// and a tar of two tokenizer files.
fn artifact_spec(src: &Path, weight: u64, seed: u64) -> serde_json::Value {
    std::fs::create_dir_all(src.join("tok")).unwrap();
    std::fs::write(src.join("config.json"), b"{\"model_type\": \"llama\"}\n").unwrap();
    write_random(&src.join("model.safetensors"), weight, seed);
    std::fs::write(src.join("tok/tokenizer.json"), b"{}\n").unwrap();
    std::fs::write(src.join("tok/special.json"), b"[]\n").unwrap();
    let f = |p: &str| src.join(p).display().to_string();
    serde_json::json!([
        {"media": "application/vnd.cncf.model.weight.config.v1.raw", "path": "config.json", "file": f("config.json")},
        {"media": "application/vnd.cncf.model.weight.v1.raw", "path": "model.safetensors", "file": f("model.safetensors")},
        {"media": "application/vnd.cncf.model.weight.config.v1.tar", "tar": {
            "tokenizer.json": f("tok/tokenizer.json"), "extra/special.json": f("tok/special.json")}},
    ])
}

/// `xfer sync oci://REG/org/tiny:TAG --insecure` to a, b and c (a pulls);
/// the job's id.
fn sync_oci(c: &Cluster, reg: &str, reference: &str) -> String {
    let r = run(
        c.cmd(
            "sync",
            &["--json", "--insecure", "--nodes", "a,b,c", "--from", "a"],
        )
        .arg(format!("oci://{reg}/{reference}")),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer sync oci://");
    r.json::<serde_json::Value>()["job"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Waits for job `id` to fail; its reason.
fn wait_failed(c: &Cluster, id: &str) -> String {
    c.poll(
        &format!("job {id} to fail"),
        Duration::from_secs(60),
        |s| match &s.job("a", id)?.state {
            xfer_proto::admin::JobState::Failed { reason } => Some(reason.clone()),
            xfer_proto::admin::JobState::Complete { .. } => panic!("job {id} completed"),
            _ => None,
        },
    )
}

#[test]
fn a_modelpack_artifact_synced_as_a_job_reaches_every_node_and_updates_in_place() {
    let t = tempdir("oci-sync");
    let reg =
        RegistryServer::start_in(&t.path().join("registry"), None, "127.0.0.164", 15164, None);
    let (v1, v2) = (t.path().join("v1"), t.path().join("v2"));
    oci_push(
        &reg.addr,
        "org/tiny",
        "v1",
        &artifact_spec(&v1, 3 << 20, 11),
        t.path(),
    );
    oci_push(
        &reg.addr,
        "org/tiny",
        "v2",
        &artifact_spec(&v2, 5 << 20, 12),
        t.path(),
    );
    let c = Cluster::start("oci-sync", 23, &["a", "b", "c"], &[]);
    let nodes = ["a", "b", "c"];
    let expect = [
        ("config.json", "config.json"),
        ("model.safetensors", "model.safetensors"),
        ("tokenizer.json", "tok/tokenizer.json"),
        ("extra/special.json", "tok/special.json"),
    ];
    let same_files = |src: &Path| {
        for n in nodes {
            for (placed, from) in expect {
                assert_eq!(
                    std::fs::read(c.root(n).join("tiny").join(placed)).unwrap(),
                    std::fs::read(src.join(from)).unwrap(),
                    "{placed} on {n}"
                );
            }
        }
    };
    let staged = || {
        std::fs::read_dir(c.root("a").join(".xfer/oci"))
            .map(|d| d.count())
            .unwrap_or(0)
    };

    // The job: a pulls the artifact, every node ends with the same
    // verified model (the root the launcher's gate compares), and what a
    // staged is gone.
    let id = sync_oci(&c, &reg.addr, "org/tiny:v1");
    let root1 = c.wait_complete(&id, "a", &nodes, "tiny");
    same_files(&v1);
    assert_eq!(staged(), 0, "a kept the artifact's staging folder");
    // The weight reached b and c in the stream, while it downloaded: the
    // round after it moved only the tar layer's small files.
    let log = c.member("a").agent.as_ref().unwrap().log();
    assert!(log.contains("streamed to 2 node(s)"), "{log}");
    let tallies = c.status().job("a", &id).unwrap().delivered.clone();
    for n in ["b", "c"] {
        let t = tallies.iter().find(|t| t.node == n).unwrap();
        assert!(
            t.ok && t.from_source + t.from_peers < 1 << 20,
            "{n} got the weight in the last round, not the stream: {tallies:#?}"
        );
    }
    let out = run(&mut c.cmd("status", &[]), Duration::from_secs(20));
    assert!(
        out.stdout.contains("tiny") && out.stdout.contains("complete"),
        "{}",
        out.stdout
    );

    // A new tag of the same name: updated in place on every node.
    let id = sync_oci(&c, &reg.addr, "org/tiny:v2");
    let root2 = c.wait_complete(&id, "a", &nodes, "tiny");
    assert_ne!(root1, root2);
    same_files(&v2);

    // An unknown tag fails the job at once, in one line with the fix;
    // the model stays as it was.
    let id = sync_oci(&c, &reg.addr, "org/tiny:v9");
    let why = wait_failed(&c, &id);
    assert!(why.contains("check the name and tag"), "{why}");
    assert!(!why.contains('\n'), "{why}");
    same_files(&v2);

    // A layer that leaves the folder: refused before anything is placed.
    let f = |p: &str| v1.join(p).display().to_string();
    let evil = serde_json::json!([
        {"media": "application/vnd.cncf.model.weight.config.v1.raw", "path": "config.json", "file": f("config.json")},
        {"media": "application/vnd.cncf.model.weight.v1.raw", "path": "../../outside.bin", "file": f("config.json")},
    ]);
    oci_push(&reg.addr, "org/evil", "v1", &evil, t.path());
    let id = sync_oci(&c, &reg.addr, "org/evil:v1");
    let why = wait_failed(&c, &id);
    assert!(why.contains("stay inside the model folder"), "{why}");
    for n in nodes {
        assert!(!c.root(n).join("evil").exists(), "evil placed on {n}");
        assert!(!c.root(n).join("outside.bin").exists());
    }
    assert_eq!(staged(), 0, "a failed job's staging folder stayed");
    drop(reg);
}

/// `kill -9` of the job's source while the registry is half-way through
/// the weight layer (a front holds the rest): the restarted agent resumes
/// the job from its staging folder, fetching only the missing half, and
/// every node ends with the model.
#[test]
fn an_artifact_job_whose_source_is_killed_mid_layer_resumes_from_what_it_fetched() {
    use sha2::Digest as _;
    let t = tempdir("oci-sync-kill");
    let reg =
        RegistryServer::start_in(&t.path().join("registry"), None, "127.0.0.165", 15165, None);
    let v1 = t.path().join("v1");
    let size = 8u64 << 20;
    oci_push(
        &reg.addr,
        "org/tiny",
        "v1",
        &artifact_spec(&v1, size, 21),
        t.path(),
    );
    let hex = hex::encode(sha2::Sha256::digest(
        std::fs::read(v1.join("model.safetensors")).unwrap(),
    ));
    let gate = t.path().join("release");
    let mut proxy = std::process::Command::new("python3")
        .arg(hub::workspace_root().join("tests/registry_proxy.py"))
        .args(["--host", "127.0.0.165", "--upstream", &reg.addr, "--fault"])
        .arg(format!("hold-once:sha256:{hex}:{}", gate.display()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(proxy.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let front = format!("127.0.0.165:{}", line.split_whitespace().nth(1).unwrap());

    let mut c = Cluster::start("oci-sync-kill", 24, &["a", "b", "c"], &[]);
    let id = sync_oci(&c, &front, "org/tiny:v1");
    let part = c
        .root("a")
        .join(".xfer/oci")
        .join(&id)
        .join(format!("blobs/.incoming/sha256-{hex}.part"));
    let started = std::time::Instant::now();
    while std::fs::metadata(&part).map_or(0, |m| m.len()) < size / 2 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the weight layer never reached the hold: {}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.kill9("a");
    std::fs::write(&gate, b"").unwrap();
    c.restart("a");
    c.wait_complete(&id, "a", &["a", "b", "c"], "tiny");
    let _ = proxy.kill();
    let _ = proxy.wait();
    for n in ["a", "b", "c"] {
        assert_eq!(
            std::fs::read(c.root(n).join("tiny/model.safetensors")).unwrap(),
            std::fs::read(v1.join("model.safetensors")).unwrap(),
            "{n}"
        );
    }
    // The restarted agent's round: only the missing half came again.
    let log = c.member("a").agent.as_ref().unwrap().log();
    let fetched: u64 = log
        .lines()
        .rev()
        .filter_map(|l| l.split(" bytes (").nth(1))
        .filter_map(|l| l.split(" fetched from the registry").next())
        .find_map(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no round line: {log}"));
    assert!(
        fetched <= size / 2 + (2 << 20),
        "the restarted job fetched {fetched} bytes of an {size}-byte weight half in: {log}"
    );
}
