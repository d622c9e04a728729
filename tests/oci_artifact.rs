//! `xfer pull oci://`: a CNCF ModelPack model artifact (raw and tar layers,
//! pushed into Debian's registry by `tests/oci_push.py` as `modctl push`
//! would) placed as a model folder and pushed to two agents; an artifact
//! whose layer leaves the folder, and one of another type, are refused in
//! one line with nothing placed. `xfer sync oci://`: the same artifact as
//! an agent job to three nodes (its weight streamed while it downloads),
//! then a new tag of it in place, then an unknown tag and a layer that
//! leaves the folder, each failing the job in one line with nothing
//! placed.
//!
//! Issue 53, against a hostile registry (`tests/hostile_registry.py`): a
//! token realm on another host never gets the registry's credentials (nor
//! an https registry's realm a plain-HTTP request); declared sizes beyond
//! the disk or past 64 bits are refused before a byte is fetched; a
//! cancelled job's staging folder goes, and an agent that starts removes
//! the ones of ended or unknown jobs; a symlink planted in the staging
//! area (or the CLI's cache) fails the pull naming it, with nothing
//! written outside; a model of many small layers is fetched several
//! layers at once.

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
    // The source's marks of the round, in the order they happen.
    let round = c.status().job("a", &id).unwrap().last_round.clone();
    let round = round.expect("the source keeps its last round's timeline");
    let marks = [round.listed_s, round.downloaded_s, round.streamed_s];
    let [Some(listed), Some(downloaded), Some(streamed)] = marks else {
        panic!("an artifact round marks its listing, download and stream: {round:?}");
    };
    assert!(
        listed <= downloaded && downloaded <= streamed && streamed <= round.done_s,
        "{round:?}"
    );
    let out = run(&mut c.cmd("status", &[]), Duration::from_secs(20));
    assert!(
        out.stdout.contains("tiny") && out.stdout.contains("complete"),
        "{}",
        out.stdout
    );

    // A new tag of the same name: updated in place on every node, followed
    // with `--wait --json`, which says where the seconds went.
    let r = run(
        c.cmd(
            "sync",
            &[
                "--json",
                "--wait",
                "--insecure",
                "--nodes",
                "a,b,c",
                "--from",
                "a",
            ],
        )
        .arg(format!("oci://{}/org/tiny:v2", reg.addr)),
        Duration::from_secs(60),
    );
    r.assert_ok("xfer sync oci:// --wait --json");
    let done: serde_json::Value = r.json();
    let id = done["job"].as_str().unwrap().to_string();
    let tl = &done["timeline"];
    let secs = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| panic!("{done}"));
    let (handed, seen) = (secs(&tl["handed_s"]), secs(&tl["seen_s"]));
    let round_done = secs(&tl["round"]["done_s"]);
    assert!(
        handed <= seen && round_done <= seen && secs(&tl["round"]["streamed_s"]) <= round_done,
        "{done}"
    );
    let root2 = c.wait_complete(&id, "a", &nodes, "tiny");
    assert_eq!(done["root"].as_str(), Some(root2.as_str()), "{done}");
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
    let proxy = Proc(proxy);

    let mut c = Cluster::start("oci-sync-kill", 24, &["a", "b", "c"], &[]);
    let id = sync_oci(&c, &front, "org/tiny:v1");
    let part = c
        .root("a")
        .join(".xfer/oci")
        .join(&id)
        .join(format!("blobs/.incoming/sha256-{hex}.part"));
    wait_until("the weight layer to reach the hold", HANG, || {
        let len = std::fs::metadata(&part).map_or(0, |m| m.len());
        if len >= size / 2 {
            Ok(())
        } else {
            Err(Text(format!("{len} bytes of {}\n{}", size / 2, c.logs())))
        }
    });
    c.kill9("a");
    std::fs::write(&gate, b"").unwrap();
    c.restart("a");
    c.wait_complete(&id, "a", &["a", "b", "c"], "tiny");
    drop(proxy);
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

/// `tests/hostile_registry.py` on `host` with `args`: killed on drop.
struct Hostile {
    child: std::process::Child,
    /// `IP:PORT` of the registry.
    addr: String,
    /// The port of its token listener (0: none).
    token_port: u16,
    /// With `--tls`: its scheme is https.
    tls: bool,
}

impl Hostile {
    fn start(host: &str, args: &[&str]) -> Hostile {
        let mut child = std::process::Command::new("python3")
            .arg(hub::workspace_root().join("tests/hostile_registry.py"))
            .args(["--host", host])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let mut it = line.split_whitespace().skip(1);
        let port = it
            .next()
            .unwrap_or_else(|| panic!("hostile_registry.py: {line:?}"));
        Hostile {
            child,
            addr: format!("{host}:{port}"),
            token_port: it.next().unwrap().parse().unwrap(),
            tls: args.contains(&"--tls"),
        }
    }

    /// What it saw: `blob_gets` and `token_requests`.
    fn seen(&self) -> serde_json::Value {
        let scheme = if self.tls { "https" } else { "http" };
        let out = std::process::Command::new("curl")
            .args(["-sk", &format!("{scheme}://{}/_seen", self.addr)])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The Authorization headers its token listener was sent.
    fn token_auth(&self) -> Vec<serde_json::Value> {
        self.seen()["token_requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["auth"].clone())
            .collect()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `xfer pull oci://ADDR/org/m:v1 --local-dir DIR` with a cache in `t`,
/// no credentials but `creds`, and `env`.
fn pull_hostile(
    t: &Path,
    addr: &str,
    dir: &Path,
    creds: bool,
    env: &[(&str, &str)],
    extra: &[&str],
) -> Run {
    let mut c = xfer();
    c.env("XDG_CACHE_HOME", t.join("cache"))
        .env("HOME", t)
        .env_remove("DOCKER_CONFIG")
        .env_remove("XFER_REGISTRY_AUTH_HOSTS")
        .env_remove("XFER_REGISTRY_USERNAME")
        .env_remove("XFER_REGISTRY_PASSWORD");
    if creds {
        c.env("XFER_REGISTRY_USERNAME", "alice")
            .env("XFER_REGISTRY_PASSWORD", "s3cret");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.args(["pull", &format!("oci://{addr}/org/m:v1")])
        .args(extra)
        .arg("--local-dir")
        .arg(dir);
    run(&mut c, Duration::from_secs(60))
}

/// The error line of a failed command (stderr's lines that say `error`).
fn error_lines(r: &Run) -> Vec<String> {
    r.stderr
        .lines()
        .filter(|l| l.contains("error"))
        .map(String::from)
        .collect()
}

/// Issue 53, finding 3: a registry whose challenge names a token realm on
/// another host (plain HTTP, recording what it is sent) never gets the
/// registry's credentials, from `xfer pull oci://` or from the agent of
/// `xfer sync oci://`: each fails in one line naming the realm, the
/// registry and the fix. An https registry's realm over plain HTTP is
/// not asked at all, with or without credentials. The operator's allow
/// list (`XFER_REGISTRY_AUTH_HOSTS`) sends them, and an anonymous token
/// may come from elsewhere.
#[test]
fn a_token_realm_on_another_host_is_never_sent_the_registrys_credentials() {
    let t = tempdir("oci-realm");
    let basic = "Basic YWxpY2U6czNjcmV0"; // alice:s3cret
    let reg = Hostile::start(
        "127.0.0.166",
        &["--realm", "token", "--token-host", "127.0.9.99"],
    );
    let realm = format!("http://127.0.9.99:{}/token", reg.token_port);
    let dir = t.path().join("m");
    let r = pull_hostile(t.path(), &reg.addr, &dir, true, &[], &["--insecure"]);
    assert!(!r.success(), "{r:?}");
    let lines = error_lines(&r);
    assert_eq!(lines.len(), 1, "{r:?}");
    assert!(
        lines[0].contains(&realm)
            && lines[0].contains(&format!("registry {}", reg.addr))
            && lines[0].contains("XFER_REGISTRY_AUTH_HOSTS=127.0.9.99"),
        "{r:?}"
    );
    assert!(reg.token_auth().is_empty(), "{:?}", reg.seen());
    assert!(!dir.join("config.json").exists());

    // Anonymous: the realm elsewhere (plain HTTP, as the registry) is
    // asked, without an Authorization header.
    let r = pull_hostile(t.path(), &reg.addr, &dir, false, &[], &["--insecure"]);
    r.assert_ok("an anonymous pull");
    assert_eq!(reg.token_auth(), [serde_json::Value::Null]);
    // The operator allowed the host: the credentials go there.
    let dir2 = t.path().join("m2");
    let allow = [("XFER_REGISTRY_AUTH_HOSTS", "127.0.9.99")];
    let r = pull_hostile(t.path(), &reg.addr, &dir2, true, &allow, &["--insecure"]);
    r.assert_ok("a pull with the realm allowed");
    assert_eq!(reg.token_auth()[1], basic);

    // An https registry naming a plain-HTTP realm: never asked.
    let tls = t.path().join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    let (ca, cert, key) = crate::common::docker::test_ca(&tls, "127.0.0.167");
    let pair = format!("{}:{}", cert.display(), key.display());
    let reg_tls = Hostile::start(
        "127.0.0.167",
        &[
            "--tls",
            &pair,
            "--realm",
            "token",
            "--token-host",
            "127.0.9.98",
        ],
    );
    let realm = format!("http://127.0.9.98:{}/token", reg_tls.token_port);
    let ca = ca.display().to_string();
    for creds in [true, false] {
        let r = pull_hostile(
            t.path(),
            &reg_tls.addr,
            &dir,
            creds,
            &allow,
            &["--ca-file", &ca],
        );
        assert!(!r.success(), "{r:?}");
        let lines = error_lines(&r);
        assert_eq!(lines.len(), 1, "{r:?}");
        assert!(
            lines[0].contains(&realm) && lines[0].contains("over plain HTTP"),
            "{r:?}"
        );
    }
    assert!(reg_tls.token_auth().is_empty(), "{:?}", reg_tls.seen());

    // The agent's own credentials, under `xfer sync oci://`: the same.
    let env = vec![
        ("XFER_REGISTRY_USERNAME".to_string(), "agent".to_string()),
        ("XFER_REGISTRY_PASSWORD".to_string(), "s3cret".to_string()),
    ];
    let c = Cluster::start_env("oci-realm", 167, &["a", "b"], &[], env);
    let before = reg.token_auth().len();
    let id = sync_nodes(&c, &reg.addr, "org/m:v1", "a,b");
    let why = wait_failed(&c, &id);
    assert!(
        why.contains(&format!("http://127.0.9.99:{}/token", reg.token_port))
            && why.contains("XFER_REGISTRY_AUTH_HOSTS=127.0.9.99")
            && !why.contains('\n'),
        "{why}"
    );
    assert_eq!(reg.token_auth().len(), before, "{:?}", reg.seen());
}

/// `xfer sync oci://REG/REFERENCE --insecure --nodes NODES --from a`; the
/// job's id.
fn sync_nodes(c: &Cluster, reg: &str, reference: &str, nodes: &str) -> String {
    let r = run(
        c.cmd(
            "sync",
            &["--json", "--insecure", "--nodes", nodes, "--from", "a"],
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

/// Issue 53, finding 6: a manifest that declares a 1 TiB layer is refused
/// before a byte of it is fetched, by `xfer pull oci://` and by the agent
/// of `xfer sync oci://` (one line: need, have, the fix; the registry saw
/// no GET of any blob, and the job's staging folder is gone); two layers
/// of 2^63 bytes (whose sum wraps to 0 in 64 bits) are refused naming the
/// manifest; a blob sent longer than its size is cut off at its size and
/// refused.
#[test]
fn declared_sizes_beyond_the_disk_or_64_bits_are_refused_before_a_byte() {
    let t = tempdir("oci-huge");
    let tib = (1u64 << 40).to_string();
    let reg = Hostile::start("127.0.0.168", &["--declare", &tib]);
    let dir = t.path().join("m");
    let r = pull_hostile(t.path(), &reg.addr, &dir, false, &[], &["--insecure"]);
    assert!(!r.success(), "{r:?}");
    let lines = error_lines(&r);
    assert_eq!(lines.len(), 1, "{r:?}");
    assert!(
        lines[0].contains("not enough disk space")
            // The blob cache and the copy in DIR, on one disk.
            && lines[0].contains("need 2.0 TiB")
            && lines[0].contains("have ")
            && lines[0].contains("larger disk"),
        "{r:?}"
    );
    assert_eq!(reg.seen()["blob_gets"], serde_json::json!([]), "{r:?}");

    let half = (1u64 << 63).to_string();
    let wrap = Hostile::start("127.0.0.168", &["--declare", &half, "--declare", &half]);
    let r = pull_hostile(t.path(), &wrap.addr, &dir, false, &[], &["--insecure"]);
    assert!(!r.success(), "{r:?}");
    let lines = error_lines(&r);
    assert_eq!(lines.len(), 1, "{r:?}");
    assert!(
        lines[0].contains("manifest sha256:")
            && lines[0].contains("more than 18446744073709551615 bytes"),
        "{r:?}"
    );
    assert_eq!(wrap.seen()["blob_gets"], serde_json::json!([]), "{r:?}");
    assert!(!dir.join("config.json").exists());

    // More bytes than the blob's size: never more than its size kept.
    let long = Hostile::start("127.0.0.168", &["--overlong"]);
    let r = pull_hostile(t.path(), &long.addr, &dir, false, &[], &["--insecure"]);
    assert!(!r.success(), "{r:?}");
    assert!(r.stderr.contains("sent more than the 24 bytes"), "{r:?}");
    let incoming = t.path().join("cache/xfer/images/.incoming");
    for e in std::fs::read_dir(&incoming).unwrap() {
        let len = e.unwrap().metadata().unwrap().len();
        assert!(len <= 24, "a partial blob of {len} bytes");
    }
    assert!(!dir.join("config.json").exists());

    // The agent's job: refused in one line before any GET of a blob; its
    // staging folder is gone.
    let c = Cluster::start("oci-huge", 168, &["a", "b"], &[]);
    for (reg, want) in [
        (&reg, "need 1.0 TiB"),
        (&wrap, "more than 18446744073709551615"),
    ] {
        let id = sync_nodes(&c, &reg.addr, "org/m:v1", "a,b");
        let why = wait_failed(&c, &id);
        assert!(why.contains(want) && !why.contains('\n'), "{why}");
        if want.contains("TiB") {
            assert!(why.contains("--root"), "{why}");
        }
        assert_eq!(reg.seen()["blob_gets"], serde_json::json!([]), "{why}");
        let stage = c.root("a").join(".xfer/oci").join(&id);
        c.poll("the staging folder to go", Duration::from_secs(10), |_| {
            (!stage.exists()).then_some(())
        });
    }
}

/// A child process killed when dropped (a test that panics leaves none).
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A weight of `size` bytes pushed as org/tiny:v1 into a fresh registry on
/// `ip`, behind a `registry_proxy.py` front that holds the weight's first
/// GET half-way until the file `gate` exists: (registry, front's address,
/// the weight's hex digest, the proxy).
fn held_registry(
    t: &Path,
    ip: &str,
    port: u16,
    size: u64,
    gate: &Path,
) -> (RegistryServer, String, String, Proc) {
    use sha2::Digest as _;
    let reg = RegistryServer::start_in(&t.join("registry"), None, ip, port, None);
    let v1 = t.join("v1");
    oci_push(
        &reg.addr,
        "org/tiny",
        "v1",
        &artifact_spec(&v1, size, 31),
        t,
    );
    let hex = hex::encode(sha2::Sha256::digest(
        std::fs::read(v1.join("model.safetensors")).unwrap(),
    ));
    let mut proxy = std::process::Command::new("python3")
        .arg(hub::workspace_root().join("tests/registry_proxy.py"))
        .args(["--host", ip, "--upstream", &reg.addr, "--fault"])
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
    let front = format!("{ip}:{}", line.split_whitespace().nth(1).unwrap());
    (reg, front, hex, Proc(proxy))
}

/// What `registry_proxy.py` at `front` says it saw (`GET /_seen`).
fn seen(front: &str) -> serde_json::Value {
    let r = run(
        std::process::Command::new("curl")
            .arg("-sf")
            .arg(format!("http://{front}/_seen")),
        Duration::from_secs(20),
    );
    r.assert_ok("curl /_seen");
    r.json()
}

/// Waits until the partial weight of job `id` on a holds `at_least` bytes.
fn wait_part(c: &Cluster, id: &str, hex: &str, at_least: u64) -> std::path::PathBuf {
    let part = c
        .root("a")
        .join(".xfer/oci")
        .join(id)
        .join(format!("blobs/.incoming/sha256-{hex}.part"));
    wait_until("the weight layer to reach the hold", HANG, || {
        let len = std::fs::metadata(&part).map_or(0, |m| m.len());
        if len >= at_least {
            Ok(())
        } else {
            Err(Text(format!("{len} bytes of {at_least}\n{}", c.logs())))
        }
    });
    part
}

/// Issue 53, finding 6: a cancelled artifact job's staging folder goes at
/// once (its fetch held half-way), and an agent that starts removes the
/// staging folders of jobs that ended or that it does not know.
#[test]
fn a_cancelled_artifact_job_leaves_no_staging_folder() {
    let t = tempdir("oci-cancel");
    let gate = t.path().join("release");
    let size = 8u64 << 20;
    let (_reg, front, hex, proxy) = held_registry(t.path(), "127.0.0.169", 15169, size, &gate);
    let mut c = Cluster::start("oci-cancel", 169, &["a", "b"], &[]);
    let id = sync_nodes(&c, &front, "org/tiny:v1", "a,b");
    wait_part(&c, &id, &hex, size / 2);
    let stage = c.root("a").join(".xfer/oci").join(&id);
    run(&mut c.cmd("cancel", &[&id]), Duration::from_secs(30)).assert_ok("xfer cancel");
    c.poll(
        "the cancelled job's staging folder to go",
        Duration::from_secs(10),
        |_| (!stage.exists()).then_some(()),
    );
    std::fs::write(&gate, b"").unwrap();
    // The front has sent the rest of the held answer (or found the
    // cancelled fetch gone): whatever it would bring back, it has had.
    wait_until("the front to end its held answer", HANG, || {
        let seen = seen(&front);
        if seen["holds_ended"] == 1 {
            Ok(())
        } else {
            Err(seen)
        }
    });
    assert!(!stage.exists(), "the cancelled job's fetch came back");
    drop(proxy);

    // Left behind by a crash: the folder of the cancelled (final) job and
    // one of a job the agent never heard of. Both go when it starts.
    let orphan = c.root("a").join(".xfer/oci/0123456789abcdef");
    for d in [&stage, &orphan] {
        std::fs::create_dir_all(d.join("blobs/.incoming")).unwrap();
        std::fs::write(d.join("blobs/.incoming/x.part"), vec![0u8; 1 << 20]).unwrap();
    }
    c.kill9("a");
    c.restart("a");
    c.poll(
        "the leftover staging folders to go",
        Duration::from_secs(20),
        |_| (!stage.exists() && !orphan.exists()).then_some(()),
    );
}

/// Issue 53, finding 7: the agent's staging area is reached beneath its
/// root, never through a symlink. `<root>/.xfer/oci` planted as a symlink
/// to an outside folder: the job fails in one line naming it, and nothing
/// lands outside. A partial weight replaced by a symlink to an outside
/// file while the source is down: the resumed job fails naming the
/// symlink, and the file is untouched. `xfer pull oci://`'s own partial
/// blob planted as a symlink: the same.
#[test]
fn a_symlink_in_the_staging_area_fails_the_job_and_nothing_lands_outside() {
    let t = tempdir("oci-planted");
    let outside = t.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let victim = outside.join("victim");
    std::fs::write(&victim, b"keep me").unwrap();

    // The CLI's cache: its partial blob is a planted link.
    let reg = Hostile::start("127.0.0.170", &[]);
    let incoming = t.path().join("cache/xfer/images/.incoming");
    std::fs::create_dir_all(&incoming).unwrap();
    // sha256 of the hostile registry's `config.json` layer.
    let part = incoming
        .join("sha256-4bebf7dba2e37ce6166493cdcfb8f61810db88844139be2b932de7e0275babd0.part");
    std::os::unix::fs::symlink(&victim, &part).unwrap();
    let dir = t.path().join("m");
    let r = pull_hostile(t.path(), &reg.addr, &dir, false, &[], &["--insecure"]);
    assert!(!r.success(), "{r:?}");
    let lines = error_lines(&r);
    assert_eq!(lines.len(), 1, "{r:?}");
    assert!(
        lines[0].contains(&part.display().to_string()) && lines[0].contains("is a symlink"),
        "{r:?}"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");

    // The agent: `.xfer/oci` itself a symlink.
    let gate = t.path().join("release");
    let size = 8u64 << 20;
    let (_reg, front, hex, _proxy) = held_registry(t.path(), "127.0.0.170", 15170, size, &gate);
    let mut c = Cluster::start("oci-planted", 170, &["a", "b"], &[]);
    let oci = c.root("a").join(".xfer/oci");
    std::os::unix::fs::symlink(&outside, &oci).unwrap();
    let id = sync_nodes(&c, &front, "org/tiny:v1", "a,b");
    let why = wait_failed(&c, &id);
    assert!(
        why.contains(&format!("{} is a symlink", oci.display())) && !why.contains('\n'),
        "{why}"
    );
    let names: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["victim"]);
    std::fs::remove_file(&oci).unwrap();

    // A partial weight replaced by a link while the source is down.
    let id = sync_nodes(&c, &front, "org/tiny:v1", "a,b");
    let part = wait_part(&c, &id, &hex, size / 2);
    c.kill9("a");
    std::fs::remove_file(&part).unwrap();
    std::os::unix::fs::symlink(&victim, &part).unwrap();
    std::fs::write(&gate, b"").unwrap();
    c.restart("a");
    let why = wait_failed(&c, &id);
    assert!(
        why.contains(&format!("{} is a symlink", part.display())) && !why.contains('\n'),
        "{why}"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    let names: Vec<_> = std::fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["victim"]);
}

/// Issue 53: a model of 1,000 small raw layers from a registry that takes
/// 20 ms to answer each blob (a WAN): fetched several at once, so the
/// pull takes well under the 20 s that one fetch after the other spends
/// waiting alone, and every file is placed with its bytes.
#[test]
fn a_model_of_many_small_layers_is_fetched_several_at_once() {
    let t = tempdir("oci-many");
    let reg = Hostile::start("127.0.0.172", &["--many", "1000:4096", "--latency", "20"]);
    let dir = t.path().join("m");
    let r = pull_hostile(t.path(), &reg.addr, &dir, false, &[], &["--insecure"]);
    r.assert_ok("a pull of 1,000 layers");
    eprintln!("1,000 layers of 4 KiB, 20 ms a blob: {:?}", r.elapsed);
    // Several at once: the registry saw answers overlap (one after another,
    // it never would). The time itself is a benchmark's, not a test's.
    let overlap = reg.seen()["max_in_flight"].as_u64().unwrap_or(0);
    assert!(
        overlap >= 2,
        "the blobs were fetched one at a time (at most {overlap} at once)"
    );
    for i in [0usize, 517, 999] {
        let want: Vec<u8> = format!("{i:08}").bytes().cycle().take(4096).collect();
        assert_eq!(std::fs::read(dir.join(format!("r/{i}.bin"))).unwrap(), want);
    }
    assert_eq!(
        reg.seen()["blob_gets"].as_array().unwrap().len(),
        1001,
        "each blob fetched once"
    );
}
