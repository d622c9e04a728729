//! Output that fits a terminal. `push`, `pull`, `status` and `xfer-launch
//! check` run under a real pseudo-terminal 100 columns wide (`script`, so
//! the bars draw as an operator sees them), and no line of the captured
//! screen is wider; the screen must also carry each command's own words,
//! so an empty or broken capture cannot pass. And Ctrl-C (a real SIGINT to
//! a real process) says what was kept and how to resume, exits 130, and the
//! same command run again completes from there.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::cluster::Cluster;
use common::hub::{gen_repo, HubServer, PullEnv};
use common::*;

/// The width the pseudo-terminal is set to.
const COLS: usize = 100;

/// `s` quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Runs `argv` (with `env`) on a pseudo-terminal of [`COLS`] x 40 through
/// `script`; returns the raw screen bytes as text and the exit code.
fn on_pty(argv: &[String], env: &[(String, PathBuf)], timeout: Duration) -> (String, Option<i32>) {
    on_pty_cols(argv, env, timeout, COLS)
}

/// [`on_pty`] on a terminal `cols` wide.
fn on_pty_cols(
    argv: &[String],
    env: &[(String, PathBuf)],
    timeout: Duration,
    cols: usize,
) -> (String, Option<i32>) {
    let line: Vec<String> = argv.iter().map(|a| quote(a)).collect();
    let shell = format!("stty cols {cols} rows 40; exec {}", line.join(" "));
    let mut c = Command::new("script");
    c.args(["-qfec", &shell, "/dev/null"])
        .env_remove("RUST_LOG")
        .env_remove("XFER_KEY")
        .env("TERM", "xterm");
    for (k, v) in env {
        c.env(k, v);
    }
    let r = run(&mut c, timeout);
    (r.stdout, r.status.code())
}

/// The lines of a captured screen: split at every newline and carriage
/// return, with the terminal's escape sequences (colours, cursor moves,
/// line erases) removed.
fn screen_lines(raw: &str) -> Vec<String> {
    let mut out = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        match chars.next() {
            // CSI: parameters up to a final byte in @..~.
            Some('[') => {
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) {
                        break;
                    }
                }
            }
            // OSC: up to BEL or ESC \.
            Some(']') => {
                while let Some(d) = chars.next() {
                    if d == '\x07' || (d == '\x1b' && chars.next_if_eq(&'\\').is_some()) {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out.split(['\n', '\r']).map(str::to_string).collect()
}

/// Asserts that no line of `raw` is over [`COLS`] columns and that the
/// screen contains every one of `words`; returns the lines.
fn assert_fits(what: &str, raw: &str, words: &[&str]) -> Vec<String> {
    assert_fits_in(what, raw, words, COLS)
}

/// [`assert_fits`] on a terminal `cols` wide.
fn assert_fits_in(what: &str, raw: &str, words: &[&str], cols: usize) -> Vec<String> {
    let lines = screen_lines(raw);
    let text = lines.join("\n");
    assert!(!text.trim().is_empty(), "{what}: an empty screen");
    for l in &lines {
        let n = l.chars().count();
        assert!(n <= cols, "{what}: a line of {n} columns: {l:?}\n{text}");
    }
    for w in words {
        assert!(text.contains(w), "{what}: no {w:?} on the screen:\n{text}");
    }
    lines
}

/// The `xfer-launch` binary, built next to `xfer`.
fn launch_bin() -> PathBuf {
    let p = Path::new(bin()).with_file_name("xfer-launch");
    if !p.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-q", "-p", "launcher", "--bin", "xfer-launch"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok && p.exists(), "cannot build {}", p.display());
    }
    p
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// A push with bars, a status table with an unreachable node and a long
/// model name, a pull with a long file name, and `xfer-launch check`
/// against a live and a dead agent: every line within 100 columns.
#[test]
fn push_pull_status_and_check_fit_a_100_column_terminal() {
    let t = tempdir("terminal");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 24 * MIB, 93);
    let root = t.path().join("root");
    let agent = Agent::start("127.0.0.193:0", &root, &key);
    let name = "meta-llama--Llama-3.1-70B-Instruct-with-a-name-too-long-for-its-column";
    let cache_env = vec![("XDG_CACHE_HOME".to_string(), t.path().join("xdg-cache"))];

    // push: the bars, then the summary.
    let (raw, code) = on_pty(
        &[
            bin().into(),
            "push".into(),
            s(&src),
            "--to".into(),
            agent.addr.clone(),
            "--key".into(),
            s(&key),
            "--name".into(),
            name.into(),
            "--limit-rate".into(),
            "12MiB".into(),
        ],
        &cache_env,
        Duration::from_secs(120),
    );
    assert_eq!(code, Some(0), "push failed:\n{raw}");
    let lines = assert_fits("push", &raw, &["from the source", "MiB/s", "root "]);
    assert!(
        lines
            .iter()
            .any(|l| l.contains(&agent.addr) && l.contains('[') && l.contains("verified")),
        "no finished bar of {} on the screen:\n{}",
        agent.addr,
        lines.join("\n")
    );
    assert!(!raw.contains("MB/s"), "one unit family:\n{raw}");

    // status: the model's row, and a node that does not answer (its error
    // on a line of its own).
    let gone = format!("127.0.0.194:{}", unused_udp_port());
    let cluster = t.path().join("cluster.toml");
    std::fs::write(
        &cluster,
        format!(
            "key = \"{}\"\n\n[[node]]\nname = \"node-a\"\nagent = \"{}\"\nroot = \"{}\"\nfabric_if = \"lo\"\nfabric_ip = \"127.0.0.193\"\n\n[[node]]\nname = \"node-gone\"\nagent = \"{gone}\"\nroot = \"{}\"\nfabric_if = \"lo\"\nfabric_ip = \"127.0.0.194\"\n\n[launch]\nengine = \"vllm\"\nmodel = \"{}\"\n",
            s(&key),
            agent.addr,
            s(&root),
            s(&t.path().join("root-gone")),
            s(&root.join(name)),
        ),
    )
    .unwrap();
    let (raw, _) = on_pty(
        &[
            bin().into(),
            "status".into(),
            "--cluster".into(),
            s(&cluster),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_fits(
        "status",
        &raw,
        &[
            "NODE",
            "node-a",
            "complete",
            "node-gone",
            "unreachable",
            "…",
        ],
    );

    // xfer-launch check: rows of a live agent (launching off) and a dead one.
    let (raw, code) = on_pty(
        &[
            s(&launch_bin()),
            "check".into(),
            "--cluster".into(),
            s(&cluster),
        ],
        &[],
        Duration::from_secs(180),
    );
    assert_eq!(code, Some(1), "check passed without an agent:\n{raw}");
    assert_fits(
        "check",
        &raw,
        &["CHECK", "weights", "node-a", "node-gone", "fix:", "failed"],
    );

    // pull: a file whose name is longer than a bar's label, paced so the
    // bars draw. The cache's path is short: the last line is the snapshot's
    // path, printed whole.
    let repos = t.path().join("repos");
    gen_repo(
        &repos,
        "o/m",
        93,
        &[
            ("config.json", 300),
            (
                "model-00001-of-00001-with-a-file-name-much-longer-than-a-bar-label.safetensors",
                6 * MIB + 5,
            ),
        ],
    );
    let hub = HubServer::start(&repos, &["--rate", "4000000"]);
    let short = tempfile::Builder::new()
        .prefix("t")
        .tempdir_in("/tmp")
        .unwrap();
    let env = PullEnv::new(&hub.endpoint(), short.path());
    let mut vars = vec![
        ("HF_ENDPOINT".to_string(), PathBuf::from(&env.endpoint)),
        ("HF_HUB_CACHE".to_string(), env.cache.clone()),
        ("HF_HOME".to_string(), env.home.clone()),
        ("HF_HUB_DISABLE_XET".to_string(), PathBuf::from("1")),
    ];
    vars.extend(cache_env);
    let (raw, code) = on_pty(
        &[bin().into(), "pull".into(), "o/m".into()],
        &vars,
        Duration::from_secs(120),
    );
    assert_eq!(code, Some(0), "pull failed:\n{raw}");
    assert_fits("pull", &raw, &["o/m@", "downloaded", "MiB/s", "verified:"]);
}

/// The `N.N UNIT of M.M UNIT` an interrupted command reports.
fn kept_of(stderr: &str) -> (String, String) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("interrupted: "))
        .unwrap_or_else(|| panic!("no interrupted line: {stderr}"));
    let rest = &line["interrupted: ".len()..];
    let (held, rest) = rest.split_once(" of ").expect("HELD of TOTAL");
    let total = rest.split(" held on ").next().unwrap();
    (held.to_string(), total.to_string())
}

fn sigint(pid: u32) {
    // SAFETY: kill(2) on a child we started and have not reaped.
    let r = unsafe { libc::kill(pid as i32, libc::SIGINT) };
    assert_eq!(r, 0, "kill -INT {pid}");
}

/// Ctrl-C in the middle of a push: one line with what the nodes hold and
/// the command that resumes, exit code 130; the same push run again sends
/// only the rest.
#[test]
fn ctrl_c_on_push_says_what_was_kept_and_the_rerun_resumes() {
    let t = tempdir("terminal-int");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 32 * MIB, 94);
    let manifest = scan(&src, MIB);
    let agent = Agent::start("127.0.0.195:0", &t.path().join("root"), &key);
    let journal = agent.journal("m");
    // The human output (not --json), rate-limited so Ctrl-C lands midway.
    let mut human = xfer();
    human
        .arg("push")
        .arg(&src)
        .args(["--to", &agent.addr, "--key"])
        .arg(&key)
        .args(["--limit-rate", "4MiB", "--chunk-size", "1MiB"])
        .env("XDG_CACHE_HOME", t.path().join("xdg-cache"));
    let mut pusher = Proc::spawn(&mut human);
    wait_until("the agent to hold 4 MiB", Duration::from_secs(60), || {
        journal_held_bytes(&journal, &manifest) >= 4 * MIB
    });
    assert!(pusher.running(), "the push ended before Ctrl-C");
    sigint(pusher.pid());
    let r = pusher.wait(Duration::from_secs(30));
    assert_eq!(r.status.code(), Some(130), "{r:#?}");
    assert!(
        r.stderr.contains("run the same command again to resume"),
        "{r:#?}"
    );
    let (held, total) = kept_of(&r.stderr);
    assert_eq!(
        total,
        xfer_proto::units::Bytes(manifest.total_bytes()).to_string(),
        "{r:#?}"
    );
    assert!(held.ends_with("B"), "{held}");
    assert!(r.stderr.contains(" held on 1 node(s)"), "{r:#?}");

    let again = push_ok(&src, &[&agent.addr], &key, &["--chunk-size", "1MiB"]);
    let n = again.node(&agent.addr);
    assert!(n.bytes_skipped >= 4 * MIB, "nothing resumed: {again:#?}");
    assert_same_tree(&src, &agent.model_dir("m"));
}

/// Ctrl-C on `sync --wait` stops following, says the job goes on and how
/// to follow it, exits 130; the job then completes on the nodes.
#[test]
fn ctrl_c_on_sync_wait_leaves_the_job_running() {
    let c = Cluster::start("terminal-sync", 95, &["a", "b"], &[]);
    let src = c.dir.path().join("m");
    gen_model(&src, 24 * MIB, 95);
    let mut follow = Proc::spawn(
        c.cmd("sync", &["--wait", "--limit-rate", "4MiB"])
            .arg(&src)
            .env("XDG_CACHE_HOME", c.dir.path().join("xdg-cache")),
    );
    c.poll("b to hold some of m", Duration::from_secs(60), |s| {
        s.model("b", "m").filter(|m| m.bytes_held > 0).map(|_| ())
    });
    assert!(follow.running(), "sync --wait ended before Ctrl-C");
    sigint(follow.pid());
    let r = follow.wait(Duration::from_secs(30));
    assert_eq!(r.status.code(), Some(130), "{r:#?}");
    assert!(r.stderr.contains("goes on on the nodes"), "{r:#?}");
    assert!(r.stderr.contains("xfer status --cluster"), "{r:#?}");
    let id = r
        .stderr
        .lines()
        .find_map(|l| {
            Some(
                l.strip_prefix("job ")?
                    .split_whitespace()
                    .next()?
                    .trim_end_matches(':'),
            )
        })
        .unwrap_or_else(|| panic!("no job id: {r:#?}"))
        .to_string();
    c.wait_complete(&id, "a", &["a", "b"], "m");
}

/// The bytes an interrupted download's part map records as written.
fn sidecar_done(path: &Path) -> u64 {
    let Ok(b) = std::fs::read(path) else { return 0 };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b) else {
        return 0;
    };
    v["done"]
        .as_array()
        .map(|a| a.iter().filter_map(|d| d.as_u64()).sum())
        .unwrap_or(0)
}

/// Ctrl-C in the middle of a pull: one line with what the cache keeps and
/// the command that resumes, exit code 130; the same pull run again
/// resumes from the part map and completes.
#[test]
fn ctrl_c_on_pull_says_what_was_kept_and_the_rerun_resumes() {
    let t = tempdir("terminal-pull-int");
    let repos = t.path().join("repos");
    gen_repo(
        &repos,
        "acme/slow",
        96,
        &[("model.safetensors", 24 * MIB + 9)],
    );
    let hub = HubServer::start(&repos, &["--rate", "4000000"]);
    let env = PullEnv::new(&hub.endpoint(), t.path());
    let etag = hub.repo("acme/slow").files["model.safetensors"]
        .etag
        .clone();
    let sidecar = env
        .repo_dir("acme/slow")
        .join("blobs")
        .join(format!("{etag}.xfer.parts"));
    let args = ["--connections", "2", "--part-size", "1MiB"];
    // The human output: the same command without --json.
    let mut human = xfer();
    env.apply(&mut human);
    human.arg("pull").arg("acme/slow").args(args);
    let mut p = Proc::spawn(&mut human);
    wait_until(
        "the part map to record 2 MiB",
        Duration::from_secs(60),
        || {
            assert!(p.running(), "the pull ended before Ctrl-C");
            sidecar_done(&sidecar) >= 2 * MIB
        },
    );
    sigint(p.pid());
    let r = p.wait(Duration::from_secs(30));
    assert_eq!(r.status.code(), Some(130), "{r:#?}");
    assert!(
        r.stderr.contains("of acme/slow kept in the cache")
            && r.stderr.contains("run the same command again to resume"),
        "{r:#?}"
    );
    let (_, total) = kept_of(&r.stderr.replace(" of acme/slow kept", " held on"));
    assert_eq!(total, xfer_proto::units::Bytes(24 * MIB + 9).to_string());

    let s = env.pull_ok("acme/slow", &args);
    assert!(s.bytes_resumed >= 2 * MIB, "nothing resumed: {s:#?}");
    assert!(s.verification.all_verified, "{s:#?}");
}

/// At 80 columns: `--help` wraps at words within the width, and a pull's
/// bars keep the shards apart (`mode…1/2`, `mode…2/2`, not `mode…ors`
/// twice).
#[test]
fn help_and_pull_bars_fit_an_80_column_terminal() {
    for args in [vec!["--help"], vec!["sync", "--help"]] {
        let mut argv = vec![bin().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let (raw, code) = on_pty_cols(&argv, &[], Duration::from_secs(30), 80);
        assert_eq!(code, Some(0), "{args:?}");
        let lines = assert_fits_in(&format!("xfer {args:?}"), &raw, &["Usage"], 80);
        // Wrapped at spaces: the words of a help line survive whole.
        let text = lines
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let whole = if args[0] == "--help" {
            "Hand a sync job to the cluster's agents and return"
        } else {
            "Fail the job when its rounds have made no progress for this long"
        };
        assert!(text.contains(whole), "{text}");
    }
    let t = tempdir("terminal-80");
    let repos = t.path().join("repos");
    gen_repo(
        &repos,
        "a/b",
        80,
        &[
            ("config.json", 200),
            ("model-00001-of-00002.safetensors", 4 * MIB),
            ("model-00002-of-00002.safetensors", 4 * MIB),
        ],
    );
    // Slow enough for the bars to be drawn.
    let server = HubServer::start(&repos, &["--total-rate", "2000000"]);
    // The snapshot path it prints is whole (to copy), so it must fit: a
    // short cache folder.
    let short = tempfile::Builder::new()
        .prefix("x")
        .tempdir_in("/tmp")
        .unwrap();
    let env = PullEnv::new(&server.endpoint(), t.path()).with_cache(&short.path().join("c"));
    let mut argv = vec![bin().to_string(), "pull".into(), "a/b".into()];
    argv.extend(["--connections".into(), "2".into()]);
    let pty_env: Vec<(String, PathBuf)> = vec![
        ("HF_ENDPOINT".to_string(), PathBuf::from(&env.endpoint)),
        ("HF_HUB_CACHE".to_string(), env.cache.clone()),
        ("HF_HOME".to_string(), env.home.clone()),
        ("HF_HUB_DISABLE_XET".to_string(), PathBuf::from("1")),
    ];
    let (raw, code) = on_pty_cols(&argv, &pty_env, Duration::from_secs(120), 80);
    assert_eq!(code, Some(0), "{raw}");
    assert_fits_in("pull at 80 columns", &raw, &["…1/2", "…2/2"], 80);
}
