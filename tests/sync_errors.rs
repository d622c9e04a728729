//! A sync job's errors reach the operator, and the operator's Hub settings
//! reach the job: a typo'd repo fails `xfer sync --wait` at once with the
//! Hub's own words; a Hub that is down is retried, `xfer status` saying
//! the cause, the retry count and the next attempt; a receiver without
//! space fails the job naming the node and the space needed; the
//! operator's `HF_ENDPOINT` and token (kept 0600 on the source only, never
//! logged) are what the source pulls with.
//!
//! Real agents on loopback, the real `xfer` binary, and the Hub test
//! server (`tests/hub_server.py`).

use crate::common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use xfer_proto::admin::JobState;

use common::cluster::*;
use common::hub::*;
use common::*;

/// Agents whose own Hub settings point at `endpoint`, with their own
/// empty `HF_HOME` under `dir` (so no token file of the machine is read).
fn agent_hub_env(endpoint: &str, dir: &Path) -> Vec<(String, String)> {
    let hf_home = dir.join("agent-hf-home");
    fs::create_dir_all(&hf_home).unwrap();
    [
        ("HF_ENDPOINT", endpoint.to_string()),
        ("HF_HOME", hf_home.display().to_string()),
        ("HF_HUB_DISABLE_XET", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The operator's shell: `HF_ENDPOINT` and `HF_TOKEN` as given (unset
/// when `None`), an empty `HF_HOME`, and nothing of the developer's.
fn operator_env(c: &mut Command, dir: &Path, endpoint: Option<&str>, token: Option<&str>) {
    let hf_home = dir.join("operator-hf-home");
    fs::create_dir_all(&hf_home).unwrap();
    for k in [
        "HF_ENDPOINT",
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HUGGING_FACE_HUB_TOKEN",
        "XDG_CACHE_HOME",
    ] {
        c.env_remove(k);
    }
    c.env("HF_HOME", &hf_home);
    if let Some(e) = endpoint {
        c.env("HF_ENDPOINT", e);
    }
    if let Some(t) = token {
        c.env("HF_TOKEN", t);
    }
}

/// `xfer status` as the operator reads it (the table and the job lines);
/// it exits 1, naming the problem last, while a job has failed or retries.
fn status_text(c: &Cluster) -> String {
    let r = run(&mut c.cmd("status", &[]), Duration::from_secs(20));
    let code = r.status.code();
    assert!(
        code == Some(0) || (code == Some(1) && r.stdout.contains(" problem")),
        "xfer status failed: {r:#?}"
    );
    if retry_attempt(&r.stdout).is_some() {
        assert_eq!(code, Some(1), "a retrying job is a problem: {r:#?}");
    }
    r.stdout
}

/// The N of the first `retrying (attempt N` in `text`.
fn retry_attempt(text: &str) -> Option<u32> {
    let at = text.find("retrying (attempt ")? + "retrying (attempt ".len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// 1. A typo'd repo: `xfer sync --wait` exits 1 within 5 s, its one error
///    line carrying the Hub's own words and the fix; the job is failed,
///    not retried.
#[test]
fn a_typod_repo_fails_sync_wait_at_once_with_the_hubs_words() {
    let t = tempdir("sync-err-typo");
    let repos = t.path().join("repos");
    small_repo(&repos, "acme/tiny", 41);
    let server = HubServer::start(&repos, &[]);
    let env = agent_hub_env(&server.endpoint(), t.path());
    let c = Cluster::start_env("sync-err-typo", 41, &["a", "b"], &[], env);

    let mut cmd = c.cmd("sync", &["--wait"]);
    cmd.arg("acme/nope").args(["--from", "a", "--nodes", "a,b"]);
    operator_env(&mut cmd, t.path(), None, None);
    let started = Instant::now();
    let r = run(&mut cmd, Duration::from_secs(60));
    let took = started.elapsed();
    assert_eq!(r.status.code(), Some(1), "{r:#?}\n{}", c.logs());
    assert!(
        took < Duration::from_secs(5),
        "xfer sync --wait took {took:?} to report a missing repo: {r:#?}"
    );
    let line = assert_error(
        &r,
        &[
            "acme/nope",
            "failed",
            "Repository not found",
            "HTTP 401",
            "check the name",
        ],
    );
    assert!(!line.contains("channel closed"), "{line}");

    // Failed once, not retried: one round, and status says why.
    let s = c.status();
    let job = s
        .report("a")
        .status
        .as_ref()
        .unwrap()
        .jobs
        .iter()
        .find(|j| j.name == "models--acme--nope")
        .expect("the source knows the job")
        .clone();
    match &job.state {
        JobState::Failed { reason } => {
            assert!(reason.contains("Repository not found"), "{reason}")
        }
        other => panic!("job state {other:?}: {job:#?}"),
    }
    assert_eq!(job.rounds, 1, "a missing repo is not retried: {job:#?}");
    assert_eq!(job.attempt, 0, "{job:#?}");
    assert_eq!(
        job.hub_endpoint.as_deref(),
        Some(server.endpoint().as_str()),
        "{job:#?}"
    );
    let text = status_text(&c);
    assert!(
        text.contains("failed: acme/nope was not found"),
        "status does not say why: {text}"
    );
}

/// 2. A Hub that is down (nothing listens on its port): the job is
///    retried (until its budget); `xfer status` shows the connection refused,
///    the retry count (2 or more) and the next attempt, on the job's line
///    and in the members' error column.
#[test]
fn a_hub_that_is_down_is_retried_and_status_says_why_and_when() {
    let t = tempdir("sync-err-down");
    let down = format!("http://127.0.0.1:{}", unused_tcp_port());
    let env = agent_hub_env(&down, t.path());
    let c = Cluster::start_env("sync-err-down", 42, &["a", "b"], &[], env);

    let mut cmd = c.cmd("sync", &["--json"]);
    cmd.arg("acme/tiny").args(["--from", "a", "--nodes", "a,b"]);
    operator_env(&mut cmd, t.path(), None, None);
    let r = run(&mut cmd, Duration::from_secs(30));
    r.assert_ok("xfer sync acme/tiny");
    let id = r.json::<serde_json::Value>()["job"]
        .as_str()
        .unwrap()
        .to_string();

    let text = wait_until("a second retry shown in the status", HANG, || {
        let text = status_text(&c);
        if retry_attempt(&text).is_some_and(|n| n >= 2) {
            Ok(text)
        } else {
            Err(Text(format!("{text}\n{}", c.logs())))
        }
    });
    let job_line = text
        .lines()
        .find(|l| l.starts_with(&format!("job {id} ")))
        .unwrap_or_else(|| panic!("no line for job {id}: {text}"));
    let low = job_line.to_lowercase();
    assert!(low.contains("connection refused"), "{job_line}");
    assert!(
        low.contains(&down),
        "the line names the endpoint: {job_line}"
    );
    assert!(
        job_line.contains(": retrying (attempt ")
            && job_line.contains("next in ")
            && job_line.contains("gives up in "),
        "{job_line}"
    );
    assert!(job_line.contains(&format!("via {down}")), "{job_line}");
    // The job tries again by itself: no "run the same command again".
    assert!(!job_line.contains("run the same command"), "{job_line}");

    // `xfer pull` against the same dead Hub gives up with the fix that
    // is the operator's: run it again.
    let mut pull = xfer();
    pull.args(["pull", "acme/tiny", "--local-dir"])
        .arg(t.path().join("pulled"))
        .env("HF_ENDPOINT", &down)
        .env("HF_HOME", t.path().join("pull-hf-home"))
        .env_remove("HF_HUB_OFFLINE");
    let r = run(&mut pull, Duration::from_secs(120));
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(
        r.stderr.to_lowercase().contains("connection refused")
            && r.stderr.contains("run the same command again to resume"),
        "{r:#?}"
    );

    let s = c.status();
    let job = s.job("a", &id).unwrap();
    assert_eq!(job.state, JobState::Syncing, "{job:#?}");
    assert!(job.attempt >= 2, "{job:#?}");
    // The members' rows carry the cause (no empty error column).
    let m = s
        .model("b", "models--acme--tiny")
        .unwrap_or_else(|| panic!("b lists no row of the job's model: {s:#?}"));
    let e = m.last_error.as_deref().unwrap_or_default().to_lowercase();
    assert!(
        e.contains("connection refused") && e.contains("retrying (attempt "),
        "b's row: {m:#?}"
    );
}

/// 3. A receiver whose disk cannot hold the model: the job fails (not
///    retried), `xfer sync --wait` exits 1, and the reason names the node
///    and the space needed.
#[test]
fn a_full_receiver_fails_the_job_naming_the_node_and_the_space_needed() {
    let mut c = Cluster::start("sync-err-full", 43, &["a", "b"], &[]);
    let src = c.dir.path().join("src/m24");
    gen_model(&src, 24 * MIB, 43);
    // b's root becomes a 16 MiB disk.
    c.kill9("b");
    let Some(disk) = tmpfs_or_skip(c.root("b"), "16m") else {
        return;
    };
    {
        use std::os::unix::fs::PermissionsExt;
        // A fresh tmpfs is mode 1777, which the agent refuses as a root.
        fs::set_permissions(&disk.dir, fs::Permissions::from_mode(0o755)).unwrap();
    }
    c.restart("b");

    let started = Instant::now();
    let r = run(
        c.cmd("sync", &["--wait"])
            .arg(&src)
            .args(["--from", "a", "--nodes", "b"]),
        Duration::from_secs(60),
    );
    assert_eq!(r.status.code(), Some(1), "{r:#?}\n{}", c.logs());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a full disk took {:?} to fail the job",
        started.elapsed()
    );
    let line = assert_error(&r, &["failed", "b: ", "no space: need ", "have "]);
    assert!(line.contains("free space there"), "the fix: {line}");

    let s = c.status();
    let job = s
        .report("a")
        .status
        .as_ref()
        .unwrap()
        .jobs
        .iter()
        .find(|j| j.name == "m24")
        .expect("the source knows the job")
        .clone();
    let JobState::Failed { reason } = &job.state else {
        panic!("{job:#?}");
    };
    assert!(reason.starts_with("b: "), "names the node: {reason}");
    assert!(reason.contains("no space: need "), "{reason}");
    assert_eq!(job.rounds, 1, "no space is not retried: {job:#?}");
    let tally = job.delivered.iter().find(|t| t.node == "b").unwrap();
    assert!(!tally.ok);
    assert!(
        tally
            .error
            .as_deref()
            .is_some_and(|e| e.contains("no space")),
        "{tally:#?}"
    );
    assert!(!c.root("b").join("m24").exists(), "nothing placed");
    // The agents go before their disk does.
    drop(c);
    drop(disk);
}

/// 4. The operator's `HF_ENDPOINT` and token travel with the job: agents
///    whose own endpoint is wrong (nothing listens) and that hold no token
///    pull a gated repo from the operator's Hub. While the job runs, the
///    token is on the source only, in a mode 0600 file beside the job, not
///    in any job record; it is gone once the job completes, and no agent
///    logged it.
#[test]
fn the_operators_hub_endpoint_and_token_reach_the_pull_and_nothing_else() {
    let t = tempdir("sync-err-env");
    let repos = t.path().join("repos");
    let big = "model.safetensors";
    let repo_src = gen_repo(
        &repos,
        "acme/private",
        44,
        &[("config.json", 300), (big, 3 * MIB + 5)],
    );
    let token = "hf_operator_secret_4f1c";
    let gate = t.path().join("gate");
    let hold = format!("hold:{big}:{}", gate.display());
    let server = HubServer::start(
        &repos,
        &[
            "--token",
            token,
            "--gated",
            "acme/private",
            "--fault",
            &hold,
        ],
    );
    let wrong = format!("http://127.0.0.1:{}", unused_tcp_port());
    let env = agent_hub_env(&wrong, t.path());
    let c = Cluster::start_env("sync-err-env", 44, &["a", "b"], &[], env);
    let name = "models--acme--private";

    let mut cmd = c.cmd("sync", &["--json"]);
    cmd.arg("acme/private")
        .args(["--from", "a", "--nodes", "a,b"]);
    operator_env(&mut cmd, t.path(), Some(&server.endpoint()), Some(token));
    let r = run(&mut cmd, Duration::from_secs(30));
    r.assert_ok("xfer sync acme/private");
    let id = r.json::<serde_json::Value>()["job"]
        .as_str()
        .unwrap()
        .to_string();

    // The big file is parked half-way: the job runs until the gate opens.
    let job = c.poll("the job's first round", Duration::from_secs(60), |s| {
        let j = s.job("a", &id)?;
        (j.state == JobState::Syncing).then(|| j.clone())
    });
    assert_eq!(
        job.hub_endpoint.as_deref(),
        Some(server.endpoint().as_str())
    );
    let jobs = |n: &str| c.root(n).join(".xfer/jobs");
    let token_file = jobs("a").join(format!("{id}.token"));
    let meta = fs::metadata(&token_file)
        .unwrap_or_else(|e| panic!("no token file {}: {e}", token_file.display()));
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(fs::read_to_string(&token_file).unwrap(), token);
    assert!(
        !jobs("b").join(format!("{id}.token")).exists(),
        "a member got the token"
    );
    for n in ["a", "b"] {
        let rec = fs::read_to_string(jobs(n).join(format!("{id}.json"))).unwrap();
        assert!(!rec.contains(token), "{n}'s job record holds the token");
        assert!(
            rec.contains(&server.endpoint()),
            "{n}'s job record lacks the operator's endpoint: {rec}"
        );
    }

    fs::write(&gate, b"go").unwrap();
    let root = c.wait_complete(&id, "a", &["a", "b"], name);
    let meta = server.repo("acme/private");
    for n in ["a", "b"] {
        let dir = c.root(n).join(name);
        assert_eq!(manifest_root(&dir), root, "{n}");
        assert_cache(&dir, &repo_src, &meta);
    }
    assert!(
        !token_file.exists(),
        "the token outlived its job: {}",
        token_file.display()
    );
    for m in &c.members {
        let log = m.agent.as_ref().unwrap().log();
        assert!(!log.contains(token), "{} logged the token:\n{log}", m.name);
    }
    assert!(
        status_text(&c).contains(&format!("via {}", server.endpoint())),
        "status does not show the endpoint"
    );
}
