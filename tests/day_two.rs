//! Day two (issue 52): a model that was fine stays fine, whatever the
//! operator does next. With real agents on loopback, the real `xfer`
//! binary and the Hub test server (`tests/hub_server.py`):
//! 1. a complete Hub model stays complete (its records on every node never
//!    say `replacing`) through a re-sync of the revision it holds, a re-sync
//!    against a Hub that is down (which now gives up, `sync --wait` exiting
//!    1 with the cause), and a sync cancelled while it retries; `status`
//!    exits 1 exactly while a job retries or has failed;
//! 2. a sync cancelled mid-download on three nodes leaves no lock on its
//!    incomplete files, and the next sync of the repo completes;
//! 3. `HF_HUB_OFFLINE=1` stops `xfer pull` and `xfer sync` before they ask
//!    the Hub, as `hf download` does.

use crate::common;

use std::fs;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use xfer_proto::admin::JobState;

use common::cluster::*;
use common::hub::*;
use common::*;

/// Agents whose own Hub settings point at `endpoint`, with an empty
/// `HF_HOME` of their own.
fn agent_env(endpoint: &str, dir: &Path) -> Vec<(String, String)> {
    let hf_home = dir.join("agent-hf-home");
    fs::create_dir_all(&hf_home).unwrap();
    vec![
        ("HF_ENDPOINT".into(), endpoint.to_string()),
        ("HF_HOME".into(), hf_home.display().to_string()),
        ("HF_HUB_DISABLE_XET".into(), "1".into()),
    ]
}

/// `xfer sync hf://REPO --from a --nodes NODES ARGS...` in an operator
/// shell with no Hub settings of its own.
fn sync_cmd(c: &Cluster, dir: &Path, repo: &str, nodes: &str, args: &[&str]) -> Command {
    let mut cmd = c.cmd("sync", args);
    cmd.arg(format!("hf://{repo}"))
        .args(["--from", "a", "--nodes", nodes]);
    let hf_home = dir.join("operator-hf-home");
    fs::create_dir_all(&hf_home).unwrap();
    for k in [
        "HF_ENDPOINT",
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "XDG_CACHE_HOME",
    ] {
        cmd.env_remove(k);
    }
    cmd.env("HF_HOME", &hf_home);
    cmd
}

/// The model's record on `node`, as its agent keeps it.
fn record(c: &Cluster, node: &str, name: &str) -> serde_json::Value {
    let p = c.root(node).join(format!(".xfer/models/{name}.json"));
    let bytes = fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_slice(&bytes).unwrap()
}

/// Every node's record of `name` vouches for `root` (no `replacing`), and
/// status says complete with that root.
fn assert_fine(c: &Cluster, nodes: &[&str], name: &str, root: &str, after: &str) {
    for n in nodes {
        let rec = record(c, n, name);
        assert!(
            rec.get("replacing").is_none(),
            "after {after}: {n}'s record of {name} says replacing: {rec}\n{}",
            c.logs()
        );
        assert_eq!(
            rec["manifest"]["root"].as_str(),
            Some(root),
            "after {after}"
        );
    }
    let s = c.status();
    assert_eq!(
        s.complete_root(nodes, name).as_deref(),
        Some(root),
        "after {after}, status: {s:#?}"
    );
}

/// The text field `key` of a command's `--json` output.
fn field(r: &Run, key: &str) -> String {
    let v: serde_json::Value = r.json();
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key} in {v}"))
        .to_string()
}

/// `xfer status`: its exit code and text.
fn status_run(c: &Cluster) -> Run {
    run(&mut c.cmd("status", &[]), Duration::from_secs(30))
}

#[test]
fn a_complete_model_stays_complete_through_resyncs_a_dead_hub_and_cancels() {
    let t = tempdir("day2-fine");
    let repos = t.path().join("repos");
    small_repo(&repos, "acme/tiny", 52);
    let mut server = HubServer::start(&repos, &[]);
    let endpoint = server.endpoint();
    let mut c = Cluster::start_env(
        "day2-fine",
        151,
        &["a", "b"],
        &[],
        agent_env(&endpoint, t.path()),
    );
    let name = "models--acme--tiny";
    let nodes = ["a", "b"];

    // The first sync.
    let r = run(
        &mut sync_cmd(&c, t.path(), "acme/tiny", "a,b", &["--wait", "--json"]),
        Duration::from_secs(120),
    );
    r.assert_ok("the first sync");
    let root = field(&r, "root");
    assert_fine(&c, &nodes, name, &root, "the first sync");
    assert_eq!(status_run(&c).status.code(), Some(0));

    // The revision it holds, again: nothing to write, nothing marked.
    let r = run(
        &mut sync_cmd(&c, t.path(), "acme/tiny", "a,b", &["--wait", "--json"]),
        Duration::from_secs(120),
    );
    r.assert_ok("a re-sync of the same revision");
    assert_eq!(
        r.json::<serde_json::Value>()["root"].as_str(),
        Some(root.as_str())
    );
    assert_fine(&c, &nodes, name, &root, "a re-sync of the same revision");

    // The Hub goes down: the job gives up after its budget, `--wait`
    // exits 1 with the cause and the fix, and the model is untouched.
    server.stop();
    let started = Instant::now();
    let r = run(
        &mut sync_cmd(
            &c,
            t.path(),
            "acme/tiny",
            "a,b",
            &["--wait", "--json", "--give-up-after", "3s"],
        ),
        Duration::from_secs(120),
    );
    let line = assert_error(
        &r,
        &["gave up after", "connection refused", "--give-up-after"],
    );
    assert!(line.contains(&endpoint), "the cause names the Hub: {line}");
    let out: serde_json::Value = r.json();
    assert!(
        out["error"].as_str().is_some_and(|e| e.contains("gave up")),
        "--json says how the job ended: {out}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "a 3 s budget took {:?}",
        started.elapsed()
    );
    assert_fine(&c, &nodes, name, &root, "a sync against a dead Hub");
    let s = status_run(&c);
    assert_eq!(s.status.code(), Some(1), "a failed job: {s:#?}");
    assert!(
        s.stderr.contains("failed") || s.stdout.contains("failed"),
        "{s:#?}"
    );
    run(&mut c.cmd("prune", &[]), Duration::from_secs(30)).assert_ok("xfer prune");
    assert_eq!(status_run(&c).status.code(), Some(0), "pruned");

    // A sync that retries for ever, cancelled: status is non-zero while
    // it retries and says so; after the cancel the model is as it was.
    let r = run(
        &mut sync_cmd(
            &c,
            t.path(),
            "acme/tiny",
            "a,b",
            &["--json", "--give-up-after", "never"],
        ),
        Duration::from_secs(30),
    );
    r.assert_ok("a sync against a dead Hub");
    let id = field(&r, "job");
    let rounds = c.poll("the job to retry", Duration::from_secs(60), |s| {
        s.job("a", &id).filter(|j| j.attempt >= 1).map(|j| j.rounds)
    });
    // kill -9 of the source mid-retry: the restarted agent resumes the job
    // (another round) and the model is still as it was.
    c.kill9("a");
    c.restart("a");
    c.poll(
        "the restarted source to retry again",
        Duration::from_secs(60),
        |s| s.job("a", &id).filter(|j| j.rounds > rounds).map(|_| ()),
    );
    assert_fine(&c, &nodes, name, &root, "kill -9 of the source mid-retry");
    let s = status_run(&c);
    assert_eq!(s.status.code(), Some(1), "a retrying job: {s:#?}");
    let job_line = s
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("job {id} ")))
        .unwrap_or_else(|| panic!("no line for {id}: {s:#?}"))
        .to_string();
    assert!(
        job_line.contains(": retrying (attempt ") && !job_line.contains("syncing"),
        "one state on the job's line: {job_line}"
    );
    let last = s.stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("1 problem: ")
            && last.contains("retrying")
            && last.contains("xfer cancel"),
        "{s:#?}"
    );
    run(&mut c.cmd("cancel", &[&id]), Duration::from_secs(30)).assert_ok("xfer cancel");
    c.poll("the job to be cancelled", Duration::from_secs(30), |s| {
        s.job("a", &id)
            .filter(|j| j.state == JobState::Cancelled)
            .map(|_| ())
    });
    assert_fine(&c, &nodes, name, &root, "a cancelled sync");
    assert_eq!(status_run(&c).status.code(), Some(0), "cancelled is well");

    // The Hub is back: the same command as the one that gave up succeeds,
    // with the same root, and moves nothing.
    server.restart(&repos, &[]);
    let r = run(
        &mut sync_cmd(&c, t.path(), "acme/tiny", "a,b", &["--wait", "--json"]),
        Duration::from_secs(120),
    );
    r.assert_ok("the same sync once the Hub is back");
    assert_eq!(field(&r, "root"), root);
    assert_fine(&c, &nodes, name, &root, "the sync after the failures");
}

/// The incomplete files under `dir` (recursively).
fn incomplete_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(incomplete_files(&p));
        } else if p.to_string_lossy().ends_with(".incomplete") {
            out.push(p);
        }
    }
    out
}

/// Whether some process holds `path`'s flock.
fn locked(path: &Path) -> bool {
    let Ok(f) = fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock on an fd we own; released when `f` closes.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

#[test]
fn a_sync_cancelled_mid_download_on_three_nodes_leaves_no_lock_and_the_next_completes() {
    let t = tempdir("day2-locks");
    let repos = t.path().join("repos");
    gen_repo(
        &repos,
        "acme/mid-model",
        53,
        &[
            ("config.json", 400),
            ("model-00001-of-00002.safetensors", 6 * MIB),
            ("model-00002-of-00002.safetensors", 6 * MIB + 99),
        ],
    );
    // 64 KiB/s per connection (about 12 s for the whole repo): the
    // download is still running when it is cancelled.
    let mut server = HubServer::start(&repos, &["--rate", "65536"]);
    let c = Cluster::start_env(
        "day2-locks",
        152,
        &["a", "b", "c"],
        &[],
        agent_env(&server.endpoint(), t.path()),
    );
    let r = run(
        &mut sync_cmd(&c, t.path(), "acme/mid-model", "a,b,c", &["--json"]),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer sync");
    let id = field(&r, "job");
    let blobs = c.root("a").join("models--acme--mid-model/blobs");
    let held = wait_until("a download to begin", HANG, || {
        // The shards' (sha256-named) files: config.json may well be done
        // before the cancel.
        let held: Vec<PathBuf> = incomplete_files(&blobs)
            .into_iter()
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.split('.').next().is_some_and(|stem| stem.len() == 64)
            })
            .filter(|p| locked(p))
            .collect();
        if held.is_empty() {
            Err(Text(c.logs()))
        } else {
            Ok(held)
        }
    });
    // The pulling node shows what it downloaded, not only what it sealed
    // (the shards are sealed when whole).
    let name = "models--acme--mid-model";
    c.poll(
        "the pulling node to show its download",
        Duration::from_secs(60),
        |s| {
            s.model("a", name)
                .filter(|m| m.bytes_held >= MIB && m.bytes_total > 12 * MIB && m.rate_bps > 0.0)
                .map(|_| ())
        },
    );
    run(&mut c.cmd("cancel", &[&id]), Duration::from_secs(30)).assert_ok("xfer cancel");
    c.poll("the job to be cancelled", Duration::from_secs(30), |s| {
        s.job("a", &id)
            .filter(|j| j.state == JobState::Cancelled)
            .map(|_| ())
    });
    // The cancelled round's tasks let go of their files, and nothing of
    // the cancelled job stays on the disk: its partial files go once let
    // go (a failed job keeps them to resume from). The agent removes a
    // partial file only when no task holds its lock, so their going is
    // the event that proves both; the test does not probe the locks
    // meanwhile (a probe holds the lock for a moment, and the agent would
    // rightly keep a file it sees locked).
    wait_until("the cancelled job's partial files to go", HANG, || {
        let left = incomplete_files(&blobs);
        if left.is_empty() {
            Ok(())
        } else {
            Err(Text(format!("left: {left:?}\n{}", c.logs())))
        }
    });
    let still: Vec<&PathBuf> = held.iter().filter(|p| locked(p)).collect();
    assert!(still.is_empty(), "the cancelled job still locks {still:?}");
    // ... and they went because the round stopped, not because the
    // download went on behind the cancel and completed them.
    for p in &held {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let blob = blobs.join(name.split('.').next().unwrap());
        assert!(
            !blob.exists(),
            "the cancelled download went on and placed {}\n{}",
            blob.display(),
            c.logs()
        );
    }
    // The next sync of the same repo completes (at full speed now).
    server.restart(&repos, &[]);
    let r = run(
        &mut sync_cmd(
            &c,
            t.path(),
            "acme/mid-model",
            "a,b,c",
            &["--wait", "--json", "--give-up-after", "60s"],
        ),
        Duration::from_secs(180),
    );
    r.assert_ok("the sync after the cancel");
    let root = field(&r, "root");
    assert_fine(
        &c,
        &["a", "b", "c"],
        "models--acme--mid-model",
        &root,
        "the re-sync",
    );
}

#[test]
fn hf_hub_offline_stops_pull_and_sync_before_they_ask_the_hub() {
    let t = tempdir("day2-offline");
    let repos = t.path().join("repos");
    small_repo(&repos, "acme/tiny", 54);
    let server = HubServer::start(&repos, &[]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    let mut cmd = env.cmd("acme/tiny", &[]);
    cmd.env("HF_HUB_OFFLINE", "1");
    let r = run(&mut cmd, Duration::from_secs(60));
    let line = assert_error(&r, &["HF_HUB_OFFLINE", "acme/tiny", "unset"]);
    assert!(!line.contains("panicked"), "{line}");
    let stats = server.stats();
    for k in ["api_revision", "api_tree", "resolve_get", "cdn_get"] {
        assert_eq!(
            stats[k].as_u64(),
            Some(0),
            "nothing was asked of the Hub: {stats}"
        );
    }
    assert!(
        !env.repo_dir("acme/tiny").exists(),
        "nothing was written: {}",
        env.repo_dir("acme/tiny").display()
    );

    let c = Cluster::start_env(
        "day2-offline",
        153,
        &["a", "b"],
        &[],
        agent_env(&server.endpoint(), t.path()),
    );
    let mut cmd = sync_cmd(&c, t.path(), "acme/tiny", "a,b", &["--wait"]);
    cmd.env("HF_HUB_OFFLINE", "1");
    let r = run(&mut cmd, Duration::from_secs(60));
    assert_error(&r, &["HF_HUB_OFFLINE", "acme/tiny"]);
    let s = c.status();
    assert!(
        s.report("a").status.as_ref().unwrap().jobs.is_empty(),
        "no job was handed over offline: {s:#?}"
    );
}

#[test]
fn a_full_disk_on_the_pulling_node_names_the_agents_root_as_the_fix() {
    let t = tempdir("day2-full");
    let repos = t.path().join("repos");
    small_repo(&repos, "acme/tiny", 55);
    let server = HubServer::start(&repos, &[]);
    let mut c = Cluster::start_env(
        "day2-full",
        154,
        &["a", "b"],
        &[],
        agent_env(&server.endpoint(), t.path()),
    );
    // The pulling node's root on a disk smaller than the repo (5 MiB).
    c.kill9("a");
    let root = c.root("a").to_path_buf();
    fs::remove_dir_all(&root).unwrap();
    let Some(_disk) = common::disk::tmpfs_or_skip(&root, "2m") else {
        panic!("needs root for a tmpfs mount, as CI has");
    };
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    c.restart("a");
    let r = run(
        &mut sync_cmd(&c, t.path(), "acme/tiny", "a,b", &["--wait"]),
        Duration::from_secs(120),
    );
    let line = assert_error(&r, &["not enough space", "--root", "a:"]);
    assert!(line.contains(&root.display().to_string()), "{line}");
    assert!(
        !line.contains("HF_HUB_CACHE"),
        "the agent does not read it: {line}"
    );
    // Killed before the tmpfs goes.
    c.kill9("a");
}

/// Ctrl-C of `xfer-launch deploy` says what it leaves running and how to
/// stop it, and exits 130 (it stopped silently). The agent it asks never
/// answers (a UDP socket that swallows the handshake), so the signal
/// comes while the preflight waits: sent once the socket got the first
/// packet, an event.
#[test]
fn ctrl_c_of_deploy_says_what_goes_on_and_exits_130() {
    let launch = Path::new(bin()).with_file_name("xfer-launch");
    if !launch.exists() {
        eprintln!("skipped: xfer-launch is not built (cargo build --workspace)");
        return;
    }
    let t = tempdir("ctrl-c");
    let key = t.path().join("key");
    keygen(&key);
    let deaf = std::net::UdpSocket::bind("127.0.0.155:0").unwrap();
    deaf.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let file = t.path().join("c.toml");
    fs::write(
        &file,
        format!(
            "key = \"{}\"\n\n[[node]]\nname = \"n1\"\nagent = \"{}\"\nroot = \"{}\"\nfabric_if = \"lo\"\nfabric_ip = \"127.0.0.155\"\n\n[launch]\nengine = \"vllm\"\nmodel = \"acme/big-model\"\n",
            key.display(),
            deaf.local_addr().unwrap(),
            t.path().join("root").display()
        ),
    )
    .unwrap();
    let child = Command::new(&launch)
        .args(["deploy", "--cluster"])
        .arg(&file)
        .env("HF_HUB_OFFLINE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1500];
    deaf.recv_from(&mut first)
        .expect("deploy asked the node's agent");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("interrupted (Ctrl-C); nothing was stopped")
            && last.contains("`xfer-launch down` stops them")
            && last.contains("`xfer cancel JOB` stops it"),
        "{err}"
    );
}
