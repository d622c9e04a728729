//! Every flag `xfer-launch plan` renders for SGLang, fed to the argument
//! parser of the real `sglang.launch_server` installed by
//! `scripts/engines.sh install` (in `$XFER_ENGINES_VENV`, default
//! /var/tmp/xfer-venv-engines).
//!
//! The parser is not rebuilt here: a small Python script imports
//! `sglang.launch_server` and calls its own `prepare_server_args(argv)` (what
//! `python -m sglang.launch_server` runs after loading its plugins), with
//! `argparse.ArgumentParser.parse_args` wrapped so that it stops right after
//! parsing, before `ServerArgs.__post_init__` looks for GPUs and the model.
//! Whatever way SGLang builds its parser, this is the one that parses.
//!
//! Accepted is not enough: argparse also takes any unambiguous prefix of a
//! flag, so a rendered flag that is only a prefix is named too, and only the
//! ones listed in [`ABBREVIATED`] pass.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// The two nodes of the cluster file; `[launch]` is added per case.
const NODES: &str = r#"key = "/etc/xfer/cluster.key"

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
"#;

/// Passed through to the engine: a flag with a value, one written
/// `--flag=value`, and a switch.
const EXTRA_ARGS: &str =
    r#"["--mem-fraction-static", "0.8", "--log-level=warning", "--enable-metrics"]"#;

/// Rendered flags that SGLang only takes as a prefix of its own, and the
/// flag each must resolve to. `--tp` is the flag of SGLang's documented
/// commands, but 0.5.23 defines only `--tp-size` / `--tensor-parallel-size`:
/// `--tp` works while `--tp-size` is the one flag it prefixes (another would
/// make it ambiguous, which argparse refuses, and the parse would fail).
const ABBREVIATED: &[(&str, &str)] = &[];

/// Runs in the venv's python: reads `[{"name", "argv"}]` on stdin, prints
/// one `XFER-RESULT <json>` line with, per case, whether the real parser
/// took it, argparse's error and leftover arguments if not, the flags that
/// are not the parser's own but prefixes of them, and the parsed values.
const PARSE: &str = r#"
import argparse, contextlib, io, json, re, sys

cases = json.load(sys.stdin)

import sglang
import sglang.launch_server as launch_server

# What `python -m sglang.launch_server` does before parsing.
launch_server.load_plugins()


class Parsed(Exception):
    pass


real_parse_args = argparse.ArgumentParser.parse_args
parsers = []


def parse_args(self, args=None, namespace=None):
    parsers.append(self)
    raise Parsed(real_parse_args(self, args, namespace))


argparse.ArgumentParser.parse_args = parse_args
number = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?")
results = []
for case in cases:
    argv = case["argv"]
    parsers.clear()
    r = {"name": case["name"], "ok": False, "error": "", "unknown": [],
         "abbreviated": {}, "values": {}}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            launch_server.prepare_server_args(argv)
        r["error"] = "prepare_server_args returned without calling parse_args"
    except Parsed as p:
        r["ok"] = True
        r["values"] = json.loads(json.dumps(vars(p.args[0]), default=str))
    except SystemExit as e:
        # argparse's last line is the error; the usage before it is long.
        lines = err.getvalue().strip().splitlines() or [f"argparse exited {e.code}"]
        r["error"] = lines[-1]
    if parsers:
        parser = parsers[0]
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                r["unknown"] = parser.parse_known_args(argv)[1]
            except SystemExit:
                pass
        own = parser._option_string_actions
        for a in argv:
            flag = a.split("=", 1)[0]
            if a.startswith("-") and not number.fullmatch(a) and flag not in own \
                    and flag not in r["unknown"]:
                r["abbreviated"][flag] = sorted(o for o in own if o.startswith(flag))
    results.append(r)
print("XFER-RESULT " + json.dumps({"version": sglang.__version__, "cases": results}))
"#;

/// The engines venv's python; the test fails (not skips) without it.
fn python() -> PathBuf {
    let venv = std::env::var_os("XFER_ENGINES_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/xfer-venv-engines"));
    let python = venv.join("bin/python");
    assert!(
        python.is_file(),
        "no engines venv at {} (XFER_ENGINES_VENV): run scripts/engines.sh install",
        venv.display()
    );
    python
}

/// `xfer-launch plan --json` of the two nodes under `launch`.
fn plan(name: &str, launch: &str) -> Value {
    let dir = std::env::temp_dir().join(format!("xfer-launch-sglang-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("{NODES}\n[launch]\n{launch}")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xfer-launch"))
        .args(["plan", "--cluster", path.to_str().unwrap(), "--json"])
        .output()
        .expect("xfer-launch runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// What follows `-m sglang.launch_server` in a rank's argv.
fn server_args(rank: &Value) -> Vec<String> {
    let argv: Vec<String> = rank["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let at = argv
        .windows(2)
        .position(|w| w == ["-m", "sglang.launch_server"])
        .unwrap_or_else(|| panic!("no `-m sglang.launch_server` in {argv:?}"));
    argv[at + 2..].to_vec()
}

/// Runs [`PARSE`] on `cases` (name, argv); returns SGLang's version and
/// the result of each case by name.
fn parse(cases: &[(String, Vec<String>)]) -> (String, BTreeMap<String, Value>) {
    let python = python();
    let input: Vec<Value> = cases
        .iter()
        .map(|(name, argv)| json!({ "name": name, "argv": argv }))
        .collect();
    let mut child = Command::new(&python)
        .args(["-c", PARSE])
        .env_remove("PYTHONPATH")
        .env("PYTHONNOUSERSITE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(Value::from(input).to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("XFER-RESULT ")) else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!(
            "sglang's parser does not build in {} (exit {:?}): run scripts/engines.sh install\n{}",
            python.display(),
            out.status.code(),
            tail.join("\n")
        );
    };
    let result: Value = serde_json::from_str(line).unwrap();
    let by_name = result["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_string(), r.clone()))
        .collect();
    (result["version"].as_str().unwrap().to_string(), by_name)
}

#[test]
fn real_sglang_launch_server_parses_every_flag_xfer_renders() {
    // tp only (the documented command), and tp × pp (adds --pp-size).
    let mut cases = Vec::new();
    let mut plans = BTreeMap::new();
    for (name, sizes) in [("tp2", "tp = 2\npp = 1"), ("tp2-pp2", "tp = 2\npp = 2")] {
        let plan = plan(
            &format!("{name}.toml"),
            &format!(
                "engine = \"sglang\"\nmodel = \"/models/qwen3-8b\"\n{sizes}\nextra_args = {EXTRA_ARGS}\n"
            ),
        );
        let ranks = plan["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), 2, "{plan}");
        for rank in ranks {
            cases.push((format!("{name} rank {}", rank["rank"]), server_args(rank)));
        }
        plans.insert(name, plan);
    }
    assert!(
        cases[2].1.contains(&"--pp-size".to_string()),
        "{:?}",
        cases[2].1
    );
    // The negatives, through the same parser: a flag SGLang does not have,
    // and one it takes only as a prefix of its own.
    let head = cases[0].1.clone();
    let bogus = [head.clone(), vec!["--no-such-flag".into()]].concat();
    let prefix = [head, vec!["--mem-frac".into(), "0.5".into()]].concat();
    cases.push(("bogus".into(), bogus));
    cases.push(("prefix".into(), prefix));

    let (version, results) = parse(&cases);
    let allowed: BTreeMap<String, Value> = ABBREVIATED
        .iter()
        .map(|(flag, full)| (flag.to_string(), json!([full])))
        .collect();
    for (name, plan) in &plans {
        for rank in plan["ranks"].as_array().unwrap() {
            let case = format!("{name} rank {}", rank["rank"]);
            let r = &results[&case];
            assert!(
                r["ok"] == true,
                "{case}: sglang {version}'s launch_server does not accept {} (argv {:?}): {}",
                r["unknown"],
                cases.iter().find(|c| c.0 == case).unwrap().1,
                r["error"].as_str().unwrap()
            );
            for (flag, full) in r["abbreviated"].as_object().unwrap() {
                assert_eq!(
                    allowed.get(flag),
                    Some(full),
                    "{case}: {flag} is not a flag of sglang {version}'s launch_server, only a prefix of {full}"
                );
            }
            // And each lands where xfer means it to.
            let v = &r["values"];
            let head_ip = plan["head_ip"].as_str().unwrap();
            for (dest, want) in [
                ("model_path", plan["model"].clone()),
                ("tp_size", plan["tp"].clone()),
                ("pp_size", plan["pp"].clone()),
                ("nnodes", plan["nnodes"].clone()),
                ("node_rank", rank["rank"].clone()),
                ("dist_init_addr", json!(format!("{head_ip}:20000"))),
                ("host", json!("0.0.0.0")),
                ("port", plan["api_port"].clone()),
                ("mem_fraction_static", json!(0.8)),
                ("log_level", json!("warning")),
                ("enable_metrics", json!(true)),
            ] {
                assert_eq!(v[dest], want, "{case}: {dest} (sglang {version})");
            }
        }
    }

    let r = &results["bogus"];
    assert!(
        r["ok"] == false,
        "sglang {version} took --no-such-flag: {r}"
    );
    assert_eq!(r["unknown"], json!(["--no-such-flag"]), "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("unrecognized arguments: --no-such-flag"),
        "{r}"
    );
    let r = &results["prefix"];
    assert!(r["ok"] == true, "{r}");
    assert_eq!(
        r["abbreviated"]["--mem-frac"],
        json!(["--mem-fraction-static"]),
        "{r}"
    );
}
