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
fn the_commands_not_built_yet_say_what_is_missing_and_exit_2() {
    for cmd in ["check", "up", "down", "logs"] {
        let out = run(&[cmd, "--cluster", "cluster.toml"]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = text(&out.stderr);
        assert!(
            err.starts_with(&format!("xfer-launch {cmd}: not built yet: it needs ")),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
