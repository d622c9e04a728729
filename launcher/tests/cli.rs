//! `xfer-launch` as a user runs it: exit codes, where output goes, and that
//! the printed plan is the library's plan.

use std::path::PathBuf;
use std::process::{Command, Output};

const FILE: &str = r#"key = "/etc/xfer/cluster.key"

[defaults]
root = "/var/lib/xfer/hub"

[[node]]
name = "spark-a"
agent = "10.0.0.1"
fabric_if = "enp1s0f1np1"
fabric_ip = "192.168.100.1"
rdma_device = "rocep1s0f1"
gid_index = 3

[[node]]
name = "spark-b"
agent = "10.0.0.2"
fabric_if = "enp1s0f0np0"
fabric_ip = "192.168.100.2"

[launch]
engine = "vllm"
model = "/models/qwen3-8b"
tp = 2
pp = 1
"#;

/// Writes `text` to a file of its own and returns its path.
fn cluster_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xfer-launch-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xfer-launch"))
        .args(args)
        .output()
        .expect("xfer-launch runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

#[test]
fn plan_prints_the_librarys_plan() {
    let path = cluster_file("ok.toml", FILE);
    let p = path.to_str().unwrap();
    let out = run(&["plan", "--cluster", p]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    let plan = launcher::plan::plan(&launcher::config::load(&path).unwrap());
    assert_eq!(shown, launcher::plan::render_text(&plan));
    assert!(shown.contains("NCCL_SOCKET_IFNAME==enp1s0f0np0"), "{shown}");
    assert!(out.stderr.is_empty());

    let out = run(&["plan", "--cluster", p, "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["digest"], plan.digest.as_str());
    assert_eq!(
        json["ranks"][1]["argv"].as_array().unwrap().last().unwrap(),
        "--headless"
    );
    assert!(json["ranks"][1]["env"].get("NCCL_IB_HCA").is_none());
}

#[test]
fn a_refused_file_is_one_line_with_exit_1() {
    let bad = FILE.replace("tp = 2", "tp = 2\nmodle = \"x\"");
    let line = bad.lines().position(|l| l.starts_with("modle")).unwrap() + 1;
    let path = cluster_file("bad.toml", &bad);
    let out = run(&["plan", "--cluster", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert_eq!(
        err,
        format!(
            "xfer-launch: {}:{line}:1: unknown key \"modle\" in [launch]; did you mean \"model\"?\n",
            path.display()
        )
    );
    let out = run(&["plan", "--cluster", "/nonexistent/cluster.toml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cannot read cluster file /nonexistent/cluster.toml"));
}

#[test]
fn commands_that_need_the_agents_say_when_the_key_is_missing() {
    let path = cluster_file("nokey.toml", FILE);
    let p = path.to_str().unwrap();
    for cmd in ["check", "up", "down", "logs"] {
        let out = run(&[cmd, "--cluster", p]);
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        let err = text(&out.stderr);
        assert!(err.starts_with("xfer-launch: "), "{err}");
        assert!(err.contains("/etc/xfer/cluster.key"), "{err}");
        assert!(err.contains("names it as `key`"), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// The plan of each engine on the two-node file, against the files in
/// launcher/tests/golden (`UPDATE_GOLDEN=1` rewrites them after a change
/// that is meant).
#[test]
fn plans_match_the_golden_files() {
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    for (engine, extra) in [
        ("vllm", "tp = 2\npp = 1"),
        ("vllm-ray", "tp = 1\npp = 2"),
        ("sglang", "tp = 2\npp = 1"),
    ] {
        let launch = format!(
            "[launch]\nengine = \"{engine}\"\nmodel = \"/models/qwen3-8b\"\n{extra}\nextra_args = [\"--max-model-len\", \"32768\"]\n[launch.env]\nNCCL_DEBUG = \"INFO\"\n"
        );
        let file = FILE.split("[launch]").next().unwrap().to_string() + &launch;
        let path = cluster_file(&format!("golden-{engine}.toml"), &file);
        for (suffix, args) in [("txt", vec![]), ("json", vec!["--json"])] {
            let mut a = vec!["plan", "--cluster", path.to_str().unwrap()];
            a.extend(args);
            let out = run(&a);
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            // The file's path differs from run to run; nothing else may.
            let shown = text(&out.stdout);
            let want = golden.join(format!("plan-{engine}.{suffix}"));
            if std::env::var_os("UPDATE_GOLDEN").is_some() {
                std::fs::create_dir_all(&golden).unwrap();
                std::fs::write(&want, &shown).unwrap();
            }
            let expected = std::fs::read_to_string(&want)
                .unwrap_or_else(|e| panic!("{}: {e}; run with UPDATE_GOLDEN=1", want.display()));
            assert_eq!(
                shown,
                expected,
                "{engine} {suffix} differs from {}",
                want.display()
            );
        }
    }
}

/// `XFER_CLUSTER` names the cluster file when `--cluster` is not given;
/// without either, one line names both.
#[test]
fn xfer_cluster_names_the_file_and_its_absence_is_one_line() {
    let path = cluster_file("env.toml", FILE);
    let given = run(&["plan", "--cluster", path.to_str().unwrap()]);
    let from_env = Command::new(env!("CARGO_BIN_EXE_xfer-launch"))
        .arg("plan")
        .env("XFER_CLUSTER", &path)
        .output()
        .unwrap();
    assert_eq!(
        from_env.status.code(),
        Some(0),
        "{}",
        text(&from_env.stderr)
    );
    assert_eq!(text(&from_env.stdout), text(&given.stdout));
    let neither = Command::new(env!("CARGO_BIN_EXE_xfer-launch"))
        .arg("plan")
        .env_remove("XFER_CLUSTER")
        .output()
        .unwrap();
    assert_eq!(neither.status.code(), Some(1));
    let err = text(&neither.stderr);
    assert!(
        err.contains("--cluster FILE") && err.contains("XFER_CLUSTER=FILE"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A model at a branch: `plan` asks the agents for the commit and, when it
/// cannot (here: no credential), keeps `<COMMIT>` and says why in one line.
#[test]
fn plan_says_why_the_commit_stays_a_placeholder() {
    let file = FILE.replace("model = \"/models/qwen3-8b\"", "model = \"Qwen/Qwen3-8B\"");
    let path = cluster_file("commit.toml", &file);
    let out = run(&["plan", "--cluster", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("snapshots/<COMMIT>"));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("plan: the model path keeps <COMMIT>: ")
            && err.contains("/etc/xfer/cluster.key")
            && err.contains("xfer-launch check"),
        "{err}"
    );
}
