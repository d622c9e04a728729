//! `xfer-launch` end to end on a cluster of network namespaces with two
//! NICs per node (`scripts/launchnet.sh`): a management network that holds
//! the default route but cannot reach the other nodes, and a fabric that
//! can, with interface names that differ per node. Real `xfer serve` agents
//! run in the nodes, each in its own mount namespace so that every node has
//! its own root at the same absolute path, as on separate machines; the
//! engine is the stand-in of `tests/standin`, which checks the argv and
//! environment it gets against the plan, meets the other ranks over the
//! fabric and serves /health and /v1/completions on the head.
//!
//! Needs root (namespaces, mounts); without it each test says why and
//! returns. The tests share the address ranges, so they run one at a time.

#[macro_use]
mod launchlab;
// `runner = "srun"` in real Slurm jobs (its own file; the Slurm lab is
// shared with xfer's tests/slurm.rs).
#[path = "common/slurm.rs"]
mod slurm_lab;
mod slurm_launch;
use launchlab::wait;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use launchlab::*;

#[test]
fn check_flags_the_management_route_and_up_pins_every_rank_to_the_fabric() {
    need_root!();
    let lab = Lab::up("xla", 3, &[1, 2, 3]);
    let m = lab.model("a");
    lab.push(&m, "tiny", &[1, 2, 3]);
    let file = lab.cluster_file("c.toml", &lab.launch("vllm", "tiny", &[]), |i| {
        lab.fabric(i)
    });
    lab.save_plan(&file);

    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}{}", text(&out.stderr));
    for i in 1..=3 {
        let route = rows(&shown, "route");
        assert!(
            route.iter().any(|r| r.starts_with("WARN")
                && r.contains(&format!("n{i}"))
                && r.contains(&format!("would pick {}", lab.mgmt_ip(i)))
                && r.contains(&format!(
                    "pins {} on {}",
                    lab.fabric_ip(i),
                    lab.fabric_if(i)
                ))),
            "{shown}"
        );
    }
    let reach = rows(&shown, "reach");
    assert_eq!(reach.len(), 3, "{shown}");
    assert!(reach.iter().all(|r| r.starts_with("pass")), "{shown}");
    assert!(
        rows(&shown, "weights")
            .iter()
            .all(|r| r.starts_with("pass")),
        "{shown}"
    );
    assert!(
        rows(&shown, "versions")[0].contains("vllm 0.11.0 on every node"),
        "{shown}"
    );

    // The same nodes described by their management NIC: unreachable.
    let wrong = lab.cluster_file("mgmt.toml", &lab.launch("vllm", "tiny", &[]), |i| {
        format!("fabric_if = \"mgmt0\"\nfabric_ip = \"{}\"", lab.mgmt_ip(i))
    });
    let out = lab.xl(&["check"], &wrong);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    let reach = rows(&shown, "reach");
    assert!(
        reach
            .iter()
            .all(|r| r.starts_with("FAIL") && r.contains("cannot reach")),
        "{shown}"
    );

    // Up: every rank gets the fabric, the group meets, the head answers.
    let out = lab.xl(&["up", "--timeout", "60", "--grace", "2"], &file);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("ready: run "), "{err}");
    assert!(err.contains("tokens/s"), "{err}");
    let got = lab.standins();
    assert_eq!(got.len(), 3, "{got:?}");
    for s in &got {
        assert_eq!(s["ok"], true, "{s}");
        let env = &s["env"];
        let ip = env["VLLM_HOST_IP"].as_str().unwrap();
        let i: usize = ip.rsplit('.').next().unwrap().parse().unwrap();
        assert_eq!(ip, lab.fabric_ip(i));
        assert_eq!(env["NCCL_SOCKET_IFNAME"], format!("={}", lab.fabric_if(i)));
        assert_eq!(env["GLOO_SOCKET_IFNAME"], lab.fabric_if(i));
        assert_eq!(env["HF_HUB_OFFLINE"], "1");
    }
    // The run record says what ran and how it went.
    let state = lab.dir.join("state/xfer-launch");
    let rec = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    // It holds the plan, and so the `[launch.env]` values: owner only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&rec).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", rec.display());
    let rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rec).unwrap()).unwrap();
    assert_eq!(rec["outcome"], "ready");
    assert!(rec["time_to_ready_s"].as_f64().unwrap() > 0.0);
    assert_eq!(rec["plan"]["ranks"].as_array().unwrap().len(), 3);
    assert_eq!(rec["config_digest"], rec["plan"]["digest"]);

    // Logs of every rank, then down leaves nothing running.
    let out = lab.xl(&["logs"], &file);
    let logs = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for i in 1..=3 {
        assert!(logs.contains(&format!("[n{i}] ")), "{logs}");
    }
    let out = lab.xl(&["down", "--grace", "2"], &file);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("stopped"),
        "{}",
        text(&out.stdout)
    );
    lab.assert_none_alive();
}

#[test]
fn the_hash_gate_names_the_odd_node_and_up_starts_nothing() {
    need_root!();
    let lab = Lab::up("xlb", 2, &[1, 2]);
    lab.push(&lab.model("a"), "tiny", &[1]);
    lab.push(&lab.model("b"), "tiny", &[2]);
    let file = lab.cluster_file("c.toml", &lab.launch("vllm", "tiny", &[]), |i| {
        lab.fabric(i)
    });
    lab.save_plan(&file);
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    let w = rows(&shown, "weights");
    assert!(
        w.iter()
            .any(|r| r.starts_with("FAIL") && r.contains("different models") && r.contains("n2")),
        "{shown}"
    );
    let out = lab.xl(&["up", "--timeout", "30"], &file);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("refusing to start"), "{err}");
    assert!(lab.standins().is_empty(), "something started");

    // A partial copy: the file is gone on n2.
    lab.push(&lab.model("a"), "tiny", &[2]);
    std::fs::remove_file(lab.root_of(2).join("tiny/model.safetensors")).unwrap();
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(
        rows(&shown, "weights")
            .iter()
            .any(|r| r.starts_with("FAIL") && r.contains("n2") && r.contains("model.safetensors")),
        "{shown}"
    );
}

#[test]
fn a_crashing_rank_takes_the_whole_group_down() {
    need_root!();
    let lab = Lab::up("xlc", 2, &[1, 2]);
    lab.push(&lab.model("a"), "tiny", &[1, 2]);
    // While loading: the head is still loading when rank 1 dies. SGLang's
    // workers ignore SIGTERM, so stopping them takes SIGKILL.
    let launch = lab.launch(
        "sglang",
        "tiny",
        &[
            ("STANDIN_CRASH_RANK", "1"),
            ("STANDIN_CRASH_AFTER", "1"),
            ("STANDIN_LOAD_SECS", "20"),
        ],
    );
    let file = lab.cluster_file("c.toml", &launch, |i| lab.fabric(i));
    lab.save_plan(&file);
    let t = Instant::now();
    let out = lab.xl(&["up", "--timeout", "60", "--grace", "1"], &file);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("rank 1 on n2"), "{err}");
    assert!(err.contains("exited with code 17"), "{err}");
    assert!(err.contains("NCCL error: unhandled system error"), "{err}");
    assert!(err.contains("hint [nccl-system-error]"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    lab.assert_none_alive();
    assert_eq!(lab.standins().len(), 2);

    // After ready, with no launcher attached, and the head hanging on the
    // lost peer (as NCCL does): the failed rank's agent stops the group.
    for e in std::fs::read_dir(lab.out_dir()).unwrap().flatten() {
        std::fs::remove_file(e.path()).unwrap();
    }
    let launch = lab.launch(
        "sglang",
        "tiny",
        &[
            ("STANDIN_CRASH_RANK", "1"),
            ("STANDIN_CRASH_AFTER", "3"),
            ("STANDIN_HANG_ON_LOSS", "1"),
        ],
    );
    let file = lab.cluster_file("c2.toml", &launch, |i| lab.fabric(i));
    lab.save_plan(&file);
    let out = lab.xl(&["up", "--timeout", "60", "--grace", "1"], &file);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(lab.alive().len(), 2, "both ranks run once ready");
    lab.assert_none_alive();
    let out = lab.xl(&["logs"], &file);
    let logs = text(&out.stdout);
    assert!(
        logs.contains("[n2] [xfer agent] rank failed: rank 1 on n2"),
        "{logs}"
    );
    assert!(
        logs.contains("[n1] [xfer agent] stopping: stopped because rank 1 on n2"),
        "{logs}"
    );
}

#[test]
fn a_hanging_rank_is_stopped_at_the_init_timeout_with_a_hint() {
    need_root!();
    let lab = Lab::up("xld", 2, &[1, 2]);
    lab.push(&lab.model("a"), "tiny", &[1, 2]);
    let launch = lab.launch("vllm", "tiny", &[("STANDIN_HANG_RANK", "1")]);
    let file = lab.cluster_file("c.toml", &launch, |i| lab.fabric(i));
    lab.save_plan(&file);
    let out = lab.xl(&["up", "--timeout", "6", "--grace", "1"], &file);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not ready within 6s"), "{err}");
    assert!(err.contains("hint [nccl-socket]"), "{err}");
    lab.assert_none_alive();
}

#[test]
fn a_taken_port_a_missing_interface_and_a_dead_agent_each_fail_clearly() {
    need_root!();
    // Node 3 has no agent.
    let lab = Lab::up("xle", 3, &[1, 2]);
    lab.push(&lab.model("a"), "tiny", &[1, 2]);
    // Something holds the API port on the head.
    let mut squatter = squat_api_port(&lab, 1);
    let file = lab.cluster_file("c.toml", &lab.launch("vllm", "tiny", &[]), |i| {
        match i {
            2 => format!("fabric_if = \"fab9\"\nfabric_ip = \"{}\"", lab.fabric_ip(2)),
            // This machine has no RDMA device at all.
            1 => format!("{}\nrdma_device = \"mlx5_0\"\ngid_index = 3", lab.fabric(1)),
            _ => lab.fabric(i),
        }
    });
    let t = Instant::now();
    let out = lab.xl(&["check"], &file);
    let took = t.elapsed();
    let _ = squatter.kill();
    let _ = squatter.wait();
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    let has = |check: &str, node: &str, needle: &str| {
        rows(&shown, check).iter().any(|r| {
            r.starts_with("FAIL") && r.split_whitespace().nth(2) == Some(node) && r.contains(needle)
        })
    };
    assert!(
        has(
            "ports",
            "n1",
            &format!("api port 8000 in use by python3 (pid {})", squatter.id())
        ),
        "{shown}"
    );
    assert!(has("fabric", "n2", "no interface fab9"), "{shown}");
    assert!(has("agent", "n3", "did not answer"), "{shown}");
    assert!(has("rdma", "n1", "mlx5_0"), "{shown}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    // Every failing row says what to do.
    let lines: Vec<&str> = shown.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("FAIL") {
            assert!(lines.get(i + 1).is_some_and(|n| n.contains("fix: ")), "{l}");
        }
    }
}

#[test]
fn vllm_on_ray_starts_the_ray_head_first_and_stops_ray_after() {
    need_root!();
    let lab = Lab::up("xlf", 2, &[1, 2]);
    lab.push(&lab.model("a"), "tiny", &[1, 2]);
    let file = lab.cluster_file("c.toml", &lab.launch("vllm-ray", "tiny", &[]), |i| {
        lab.fabric(i)
    });
    lab.save_plan(&file);
    let out = lab.xl(&["up", "--timeout", "60", "--grace", "2"], &file);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    // Head: ray start --head and vllm serve; worker: ray start only. All
    // checked by the stand-in against the plan, with Ray's memory killer off.
    let got = lab.standins();
    let argv0 = |s: &serde_json::Value| {
        let a = s["argv"].as_array().unwrap();
        format!("{} {}", a[0].as_str().unwrap(), a[1].as_str().unwrap())
    };
    let mut kinds: Vec<String> = got.iter().map(argv0).collect();
    kinds.sort();
    assert_eq!(kinds, ["ray start", "ray start", "vllm serve"], "{got:?}");
    for s in &got {
        assert_eq!(s["ok"], true, "{s}");
        assert_eq!(s["env"]["RAY_memory_monitor_refresh_ms"], "0", "{s}");
    }
    // `logs --follow` streams until the ranks stop, then returns.
    let mut follow = Command::new(launch_bin())
        .args(["logs", "--follow", "--cluster", file.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stream = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let (stream, out) = (stream.clone(), follow.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut s = stream.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        })
    };
    // Following: it has streamed what the ranks logged so far.
    wait_until("`logs --follow` to stream the ranks' logs", HANG, || {
        let s = stream.lock().unwrap().clone();
        if s.contains("[n1]") && s.contains("[n2]") {
            Ok(())
        } else {
            Err(s)
        }
    });
    let out = lab.xl(&["down", "--grace", "2"], &file);
    assert!(out.status.success(), "{}", text(&out.stderr));
    lab.assert_none_alive();
    let followed = follow.wait_with_output().unwrap();
    assert!(followed.status.success(), "{}", text(&followed.stderr));
    reader.join().unwrap();
    let streamed = stream.lock().unwrap().clone();
    assert!(streamed.contains("[n1] [xfer agent] stopped"), "{streamed}");
    let logs = text(&lab.xl(&["logs"], &file).stdout);
    // The hook runs from the absolute path the agent resolved on its PATH.
    for i in 1..=2 {
        let hook = format!("[n{i}] [xfer agent] running /");
        assert!(
            logs.lines()
                .any(|l| l.starts_with(&hook) && l.ends_with("/ray stop --force")),
            "{logs}"
        );
    }
}

/// Stops the lab's dockerds (the nodes' and the operator's) on drop.
struct Dockerds(Vec<std::path::PathBuf>);

impl Drop for Dockerds {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = Command::new(repo().join("scripts/dockerd.sh"))
                .arg("stop")
                .arg(d)
                .status();
        }
    }
}

/// `docker -H unix://DIR/docker.sock ARGS`, its stdout.
fn docker(dir: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("docker")
        .env(
            "DOCKER_HOST",
            format!("unix://{}/docker.sock", dir.display()),
        )
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
fn ranks_run_in_the_image_on_every_node_and_down_or_a_failure_removes_every_container() {
    need_root!();
    let script = repo().join("scripts/dockerd.sh");
    let installed = Command::new(&script).arg("install").status().unwrap();
    assert!(installed.success(), "scripts/dockerd.sh install failed");
    let mut lab = Lab::up("xli", 2, &[]);
    let op = lab.dir.join("docker-op");
    let _stop = Dockerds(vec![lab.docker_dir(1), lab.docker_dir(2), op.clone()]);
    for i in 1..=2 {
        let a = lab.start_agent_with_docker(i);
        lab.agents[i - 1] = Some(a);
    }
    // The operator's engine holds the stand-in's image, built here.
    let out = Command::new(&script)
        .arg("start")
        .arg(&op)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sock = text(&out.stdout).trim().to_string();
    let out = Command::new(&script)
        .args(["images", &sock])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    lab.push(&lab.model("a"), "tiny", &[1, 2]);
    let to = format!(
        "{}:{AGENT_PORT},{}:{AGENT_PORT}",
        lab.mgmt_ip(1),
        lab.mgmt_ip(2)
    );
    let out = Command::new(xfer_bin())
        .env("DOCKER_HOST", &sock)
        .args([
            "image",
            "push",
            "xt/standin:1",
            "--json",
            "--to",
            &to,
            "--key",
        ])
        .arg(lab.key())
        .arg("--cache")
        .arg(lab.dir.join("cache"))
        .output()
        .unwrap();
    assert!(out.status.success(), "image push: {}", text(&out.stderr));
    let pushed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = pushed["id"].as_str().unwrap().to_string();

    let launch = format!(
        "engine = \"vllm\"\nmodel = \"{}/tiny\"\nimage = \"xt/standin:1\"\ngpus = \"none\"\nshm_size = \"64MiB\"\n",
        lab.mnt.display()
    );
    let file = lab.cluster_file("c.toml", &launch, |i| lab.fabric(i));
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}{}", text(&out.stderr));
    let image = rows(&shown, "image");
    assert!(
        image.iter().all(|r| r.starts_with("pass")) && shown.contains(&id[7..19]),
        "{shown}"
    );

    // Up: every rank in a container of the image, on the host network.
    let out = lab.xl(&["up", "--timeout", "60", "--grace", "2"], &file);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("ready: run ") && err.contains("tokens/s"),
        "{err}"
    );
    for i in 1..=2 {
        let names = docker(
            &lab.docker_dir(i),
            &["ps", "--format", "{{.Names}} {{.Image}}"],
        );
        assert!(
            names
                .lines()
                .any(|l| l.starts_with("xfer-") && l.ends_with("xt/standin:1")),
            "node {i}: {names}"
        );
    }
    let out = lab.xl(&["logs"], &file);
    let logs = text(&out.stdout);
    assert!(logs.contains("[n1] ") && logs.contains("[n2] "), "{logs}");
    assert!(
        logs.contains("docker run --rm --init --name xfer-"),
        "{logs}"
    );

    let out = lab.xl(&["down", "--grace", "2"], &file);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for i in 1..=2 {
        let left = docker(&lab.docker_dir(i), &["ps", "-aq"]);
        assert!(left.trim().is_empty(), "node {i} kept containers: {left}");
    }

    // A failure: node 2's container dies under the running group. Its
    // agent sees the rank exit and stops the group, and every container
    // of the run goes, on both nodes.
    let out = lab.xl(&["up", "--timeout", "60", "--grace", "2"], &file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let victim = docker(&lab.docker_dir(2), &["ps", "-q"]);
    assert_eq!(victim.split_whitespace().count(), 1, "{victim}");
    docker(&lab.docker_dir(2), &["kill", victim.trim()]);
    let left = || -> Vec<String> {
        (1..=2)
            .map(|i| docker(&lab.docker_dir(i), &["ps", "-aq"]))
            .filter(|l| !l.trim().is_empty())
            .collect()
    };
    wait_until(
        "every container of the run to go after a rank failed",
        HANG,
        || {
            let left = left();
            if left.is_empty() {
                Ok(())
            } else {
                Err(left)
            }
        },
    );
    let out = lab.xl(&["down", "--grace", "2"], &file);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // The gate: a node without the image fails the check, named, with the fix.
    docker(&lab.docker_dir(2), &["rmi", "xt/standin:1"]);
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    let image = rows(&shown, "image");
    assert!(
        image
            .iter()
            .any(|r| r.starts_with("FAIL") && r.contains("n2 lacks image xt/standin:1")),
        "{shown}"
    );
    assert!(
        shown.contains("fix: load it: `xfer image push xt/standin:1 --cluster")
            && shown.contains("--nodes n2`"),
        "{shown}"
    );

    // `deploy` mends it: the image goes from the operator's engine to n2
    // alone (n1 holds it), the model is held everywhere, and it serves.
    let out = Command::new(launch_bin())
        .args(["deploy", "--cluster", file.to_str().unwrap()])
        .args(["--json", "--timeout", "60", "--grace", "2"])
        .env("XDG_STATE_HOME", lab.dir.join("state"))
        .env("XDG_CACHE_HOME", lab.dir.join("op-cache"))
        .env("DOCKER_HOST", &sock)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let phases = &v["phases"];
    assert_eq!(
        phases["image_lacking"],
        serde_json::json!(["n2"]),
        "{stdout}"
    );
    assert_eq!(phases["lacking"], serde_json::json!([]), "{stdout}");
    assert_eq!(phases["image"].as_str(), Some(id.as_str()), "{stdout}");
    assert!(
        phases["image_s"].as_f64().is_some_and(|s| s > 0.0),
        "{stdout}"
    );
    assert_eq!(v["ready"], true, "{stdout}");
    let held = docker(
        &lab.docker_dir(2),
        &["image", "inspect", "--format", "{{.Id}}", "xt/standin:1"],
    );
    assert_eq!(held.trim(), id, "n2's image");
    let out = lab.xl(&["down", "--grace", "2"], &file);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // The operator's engine lacks the image: one line naming it, nothing
    // starts.
    docker(&lab.docker_dir(2), &["rmi", "xt/standin:1"]);
    let out = Command::new(launch_bin())
        .args(["deploy", "--cluster", file.to_str().unwrap()])
        .args(["--timeout", "60", "--grace", "2"])
        .env("XDG_STATE_HOME", lab.dir.join("state"))
        .env("XDG_CACHE_HOME", lab.dir.join("op-cache"))
        .env(
            "DOCKER_HOST",
            format!("unix://{}/none.sock", lab.dir.display()),
        )
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("the delivery of image xt/standin:1 failed")
            && last.contains("run deploy again"),
        "{err}"
    );
    for i in 1..=2 {
        let left = docker(&lab.docker_dir(i), &["ps", "-aq"]);
        assert!(left.trim().is_empty(), "node {i} started something: {left}");
    }
}

/// A node whose Python has another NCCL (then another torch) than the
/// others'. Faked the way it happens: node 2's agent finds a `python3`
/// first on its `PATH` that puts a different `torch` on the module path;
/// the launcher has no switch to report another version, so nothing in
/// production can hide a real mismatch.
/// A `python3` for one node: `fake/bin/python3`, the real interpreter
/// with `pylib` first on its `PYTHONPATH` (a node whose packages differ
/// from the others'). Returns `fake` and `pylib`; start the node's agent
/// with `fake/bin` first on its PATH.
fn fake_python(lab: &Lab) -> (std::path::PathBuf, std::path::PathBuf) {
    let fake = lab.dir.join("fake-python");
    let pylib = fake.join("pylib");
    std::fs::create_dir_all(&pylib).unwrap();
    let real = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    let real = text(&real.stdout).trim().to_string();
    let shim = fake.join("bin/python3");
    std::fs::create_dir_all(shim.parent().unwrap()).unwrap();
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\nPYTHONPATH='{}':\"$PYTHONPATH\" exec '{real}' \"$@\"\n",
            pylib.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (fake, pylib)
}

#[test]
fn a_node_with_another_nccl_or_torch_is_refused_by_check_and_up() {
    need_root!();
    let mut lab = Lab::up("xlu", 2, &[1]);
    let (fake, pylib) = fake_python(&lab);
    std::fs::create_dir_all(pylib.join("torch/cuda")).unwrap();
    // The stand-in's torch version, with an NCCL.
    let torch = |version: &str| {
        std::fs::write(
            pylib.join("torch/__init__.py"),
            format!("__version__ = \"{version}\"\nfrom . import cuda\n"),
        )
        .unwrap();
        std::fs::write(pylib.join("torch/cuda/__init__.py"), "").unwrap();
        std::fs::write(
            pylib.join("torch/cuda/nccl.py"),
            "def version():\n    return (2, 21, 5)\n",
        )
        .unwrap();
    };
    torch("2.13.0");
    lab.agents[1] = Some(lab.start_agent_with_path_first(2, &fake.join("bin")));
    lab.push(&lab.model("a"), "tiny", &[1, 2]);
    let file = lab.cluster_file("c.toml", &lab.launch("vllm", "tiny", &[]), |i| {
        lab.fabric(i)
    });
    lab.save_plan(&file);

    // NCCL alone differs: its own row fails, torch passes.
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}{}", text(&out.stderr));
    let fails: Vec<&str> = shown.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(fails.len(), 1, "{shown}");
    let nccl = rows(&shown, "nccl");
    assert_eq!(nccl.len(), 1, "{shown}");
    assert!(
        nccl[0].starts_with("FAIL") && nccl[0].contains("NCCL differs: 2.21.5 on n2; none on n1"),
        "{shown}"
    );
    assert!(shown.contains("vllm#46097"), "{shown}");
    assert!(
        rows(&shown, "versions")
            .iter()
            .any(|r| r.starts_with("pass") && r.contains("torch 2.13.0 on every node")),
        "{shown}"
    );
    let units = shown
        .lines()
        .find(|l| l.starts_with("launch units differ: "))
        .unwrap_or_else(|| panic!("no unit line: {shown}"));
    assert!(
        units.contains(" on n1; ") && units.ends_with(" on n2"),
        "{units}"
    );

    // And torch too: the versions row names it; up starts nothing.
    torch("2.12.0");
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}");
    assert!(
        rows(&shown, "versions")
            .iter()
            .any(|r| r.starts_with("FAIL")
                && r.contains("torch differs: 2.12.0 on n2; 2.13.0 on n1")),
        "{shown}"
    );
    assert!(rows(&shown, "nccl")[0].starts_with("FAIL"), "{shown}");
    let out = lab.xl(&["up", "--timeout", "30"], &file);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("refusing to start: 2 check(s) failed"),
        "{err}"
    );
    assert!(lab.standins().is_empty(), "something started");

    // Without the odd torch, node 2 runs what node 1 runs: one unit.
    std::fs::remove_dir_all(pylib.join("torch")).unwrap();
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(
        rows(&shown, "nccl")[0].contains("no NCCL on any node"),
        "{shown}"
    );
    // (The line under the table reads as a `unit` row too.)
    let unit: Vec<&str> = rows(&shown, "unit")
        .into_iter()
        .filter(|r| !r.starts_with("launch "))
        .collect();
    assert!(
        unit.len() == 1 && unit[0].starts_with("pass") && unit[0].contains("nccl none"),
        "{shown}"
    );
    let line = shown
        .lines()
        .find(|l| l.starts_with("launch unit "))
        .unwrap_or_else(|| panic!("no unit line: {shown}"));
    let id = line
        .split_whitespace()
        .nth(2)
        .unwrap()
        .trim_end_matches(':');

    // `up` records the unit and `status` shows it.
    let out = lab.xl(&["up", "--timeout", "60"], &file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = lab.xl(&["status"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}{}", text(&out.stderr));
    assert!(
        shown.contains("n1: run ") && shown.contains("n2: run "),
        "{shown}"
    );
    assert!(shown.contains(" running"), "{shown}");
    assert!(shown.contains(&format!("launch unit {id}: ")), "{shown}");
    let out = lab.xl(&["down"], &file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// How long node 1's resolver makes a lookup wait (`options timeout:N
/// attempts:1` in its resolv.conf).
const DEAD_RESOLVER_TIMEOUT: Duration = Duration::from_secs(3);

/// The rows of `check --json`'s output for `check`, as (node, verdict, detail, fix).
fn json_rows(v: &serde_json::Value, check: &str) -> Vec<(String, String, String, String)> {
    v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["check"] == check)
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("node"), s("verdict"), s("detail"), s("fix"))
        })
        .collect()
}

#[test]
fn a_resolver_that_does_not_answer_is_caught_quickly_and_the_hosts_lines_fix_it() {
    need_root!();
    let mut lab = Lab::up("xlr", 2, &[]);
    // Node 1's name server never answers; node 2 keeps launchnet's,
    // which fails at once. Neither hosts file has the fabric addresses.
    let hosts = [
        lab.deaf_resolver(1, DEAD_RESOLVER_TIMEOUT),
        lab.etc_of(2).join("hosts"),
    ];
    std::fs::copy(&hosts[0], &hosts[1]).unwrap();
    std::fs::write(
        lab.etc_of(2).join("resolv.conf"),
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
    )
    .unwrap();
    let fabric: Vec<String> = (1..=2).map(|i| lab.fabric_ip(i)).collect();
    for i in 1..=2 {
        lab.agents[i - 1] = Some(lab.start_agent(i));
    }
    // One node at a time: two receivers that cannot link to each other
    // (the management network does not forward between nodes) wait out
    // the source's super-seeding patience.
    let m = lab.model("a");
    lab.push(&m, "tiny", &[1]);
    lab.push(&m, "tiny", &[2]);
    let file = lab.cluster_file("c.toml", &lab.launch("vllm", "tiny", &[]), |i| {
        lab.fabric(i)
    });

    let t = Instant::now();
    let out = lab.xl(&["check", "--json"], &file);
    let took = t.elapsed();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    let res = json_rows(&v, "resolver");
    assert_eq!(res.len(), 2, "{v:#}");
    let (node, verdict, detail, fix) = &res[0];
    assert_eq!(
        (node.as_str(), verdict.as_str()),
        ("n1", "warn"),
        "{detail}"
    );
    // Each address named with its node; "got no answer within 1.5 s", or
    // "took 1.5 s and failed" when the fabric's neighbour table has
    // already given up on the name server's address.
    for (i, ip) in fabric.iter().enumerate() {
        assert!(detail.contains(&format!("{ip} (n{}) ", i + 1)), "{detail}");
    }
    assert!(detail.starts_with("reverse lookup of "), "{detail}");
    assert_eq!(
        fix,
        &format!(
            "add the fabric addresses to /etc/hosts on every node: run `xfer-launch hosts {}` to print the lines",
            file.display()
        )
    );
    assert_eq!(res[1].1, "pass", "{:?}", res[1]);
    // The probe waited its cap, not the resolver: each slow lookup is
    // reported at 1.5 s, under the resolver's timeout, and the whole check
    // took less than the two lookups one after another would have.
    let facts = &v["nodes"][0][1]["Ok"]["resolver"]["Ok"];
    let cap = facts["cap_ms"].as_u64().unwrap();
    assert!(
        Duration::from_millis(cap) < DEAD_RESOLVER_TIMEOUT,
        "{facts:#}"
    );
    for l in facts["reverse"].as_array().unwrap() {
        assert!(l["answer"].get("Found").is_none(), "{facts:#}");
        let ms = l["ms"].as_u64().unwrap();
        assert!(ms > 1_000 && ms <= cap, "{facts:#}");
    }
    assert!(took < DEAD_RESOLVER_TIMEOUT * 2, "check took {took:?}");

    // The fix: `xfer-launch hosts` on every node.
    let out = Command::new(launch_bin())
        .arg("hosts")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = text(&out.stdout);
    for i in 1..=2 {
        assert!(
            lines.contains(&format!("{}\tn{i}-fabric\n", lab.fabric_ip(i))),
            "{lines}"
        );
        // Written in place: the agents see the file `ip netns exec` mounted.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&hosts[i - 1])
            .unwrap();
        std::io::Write::write_all(&mut f, lines.as_bytes()).unwrap();
    }
    let out = lab.xl(&["check", "--json"], &file);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let res = json_rows(&v, "resolver");
    assert!(res.iter().all(|r| r.1 == "pass"), "{res:?}");
    let n2 = &v["nodes"][0][1]["Ok"]["resolver"]["Ok"]["reverse"][1]["answer"];
    assert_eq!(n2["Found"], "n2-fabric", "{v:#}");
}

/// The commit the Hub look-alike at `endpoint` gives `repo`'s main, and
/// the lab's `[launch]` table with `model = "REPO@COMMIT"` (so the plan,
/// which the stand-in checks its argv against, names the snapshot's path
/// before any node holds it).
fn launch_of_repo(lab: &Lab, endpoint: &str, repo: &str) -> (String, String) {
    let info = Command::new("ip")
        .args(["netns", "exec", &lab.ns(1), "curl", "-sf"])
        .arg(format!("{endpoint}/api/models/{repo}"))
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let commit = info["sha"].as_str().unwrap().to_string();
    let launch = launch_of_model(lab, &format!("{repo}@{commit}"));
    (commit, launch)
}

/// The lab's `[launch]` table with `model = "MODEL"` (a Hub repo, with
/// `@REV` or at `main`).
fn launch_of_model(lab: &Lab, model: &str) -> String {
    let launch = lab.launch("vllm", "tiny", &[]).replace(
        &format!("model = \"{}/tiny\"", lab.mnt.display()),
        &format!("model = \"{model}\""),
    );
    assert!(launch.contains(&format!("model = \"{model}\"")), "{launch}");
    launch
}

/// The Hub repo `org/tiny` under `repos`: the lab's small model (its
/// config.json and model.safetensors). Returns its folder.
fn tiny_repo(lab: &Lab, repos: &std::path::Path) -> std::path::PathBuf {
    let hub_repo = repos.join("org/tiny");
    std::fs::create_dir_all(&hub_repo).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(lab.model("a").join(f), hub_repo.join(f)).unwrap();
    }
    hub_repo
}

/// [`tiny_repo`] as `org/tiny`, and a copy of it as `org/tiny2` (a second
/// model that no node holds yet). Returns `org/tiny`'s folder.
fn tiny_repos(lab: &Lab, repos: &std::path::Path) -> std::path::PathBuf {
    let hub_repo = tiny_repo(lab, repos);
    let second = repos.join("org/tiny2");
    std::fs::create_dir_all(&second).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(hub_repo.join(f), second.join(f)).unwrap();
    }
    hub_repo
}

/// `xfer-launch deploy --cluster FILE ARGS` as the operator runs it, with
/// the Hub look-alike at `endpoint` as `HF_ENDPOINT`.
fn deploy_cmd(lab: &Lab, file: &std::path::Path, endpoint: &str, args: &[&str]) -> Command {
    let mut c = Command::new(launch_bin());
    c.args(["deploy", "--cluster", file.to_str().unwrap()])
        .args(args)
        .env("XDG_STATE_HOME", lab.dir.join("state"))
        .env("HF_ENDPOINT", endpoint);
    c
}

/// What the Hub look-alike in the head's namespace says it did (`/_stats`).
fn hub_stats(lab: &Lab, endpoint: &str) -> serde_json::Value {
    let out = Command::new("ip")
        .args(["netns", "exec", &lab.ns(1), "curl", "-sf"])
        .arg(format!("{endpoint}/_stats"))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// `deploy` killed with `kill -9` while the head's agent pulls (the Hub
/// holds the shard half-way), then run again: it resumes, the Hub serves
/// the shard about once (the agents kept what they had verified, and the
/// rerun does not start a second download beside the first), every node
/// holds the same bytes, and it serves.
#[test]
fn deploy_killed_mid_sync_resumes_and_downloads_the_model_once() {
    need_root!();
    let lab = Lab::up("xdk", 2, &[1, 2]);
    let repos = lab.dir.join("repos");
    let size: usize = 12 << 20;
    let w = big_repo(&repos, "big", size);
    let gate = lab.dir.join("release");
    let (_hub, port) = hub_in_head(
        &lab,
        &repos,
        &[format!("hold:model.safetensors:{}", gate.display())],
    );
    let endpoint = format!("http://{}:{port}", lab.mgmt_ip(1));
    let (commit, launch) = launch_of_repo(&lab, &endpoint, "org/big");
    let file = lab.cluster_file("c.toml", &launch, |i| lab.fabric(i));
    lab.save_plan(&file);
    let deploy = || deploy_cmd(&lab, &file, &endpoint, &["--json", "--timeout", "120"]);
    // The first deploy, killed once the Hub has sent half the shard and
    // holds the rest.
    let first_log = lab.dir.join("first-deploy.log");
    let mut first = deploy()
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&first_log).unwrap())
        .spawn()
        .unwrap();
    let half = (size / 2) as u64;
    wait_until("the pull to reach the hold", HANG, || {
        assert!(
            first.try_wait().unwrap().is_none(),
            "deploy ended before the hold: {}",
            std::fs::read_to_string(&first_log).unwrap_or_default()
        );
        let stats = hub_stats(&lab, &endpoint);
        if stats["bytes_served"].as_u64().unwrap_or(0) >= half {
            Ok(())
        } else {
            Err(stats)
        }
    });
    first.kill().unwrap();
    first.wait().unwrap();
    // Run again while the Hub still holds, and let it go once the rerun
    // has handed its sync over.
    let mut again = deploy()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(again.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut l = String::new();
        if err.read_line(&mut l).unwrap() == 0 {
            break;
        }
        seen.push_str(&l);
        // The sync starts beside the preflight, whose table ends in its
        // count line.
        if seen.contains("syncing hf://org/big@") && l.contains(" passed") && l.contains(" skipped")
        {
            break;
        }
    }
    assert!(seen.contains("syncing hf://org/big@"), "{seen}");
    // The check beside it names the sync in flight as what deploy does
    // next, not as a failure.
    assert!(
        (seen.contains("deploy syncs the model here now (found: models--org--big is syncing")
            || seen.contains("deploy syncs the model here now (found: models--org--big is queued")),
        "{seen}"
    );
    std::fs::write(&gate, b"").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    let out = again.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{seen}{rest}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["ready"], true, "{stdout}");
    for i in 1..=2 {
        let snap = lab.root_of(i).join(format!(
            "models--org--big/snapshots/{commit}/model.safetensors"
        ));
        assert!(std::fs::read(&snap).unwrap() == w, "n{i}'s copy differs");
    }
    // Downloaded about once: the bytes of the first run's half are not
    // fetched again (a chunk in flight at the kill may be).
    let served = hub_stats(&lab, &endpoint)["bytes_served"].as_u64().unwrap();
    let bound = size as u64 + (4 << 20) + 4096;
    assert!(
        served <= bound,
        "the Hub served {served} bytes for a {size}-byte model (at most {bound}): the rerun downloaded it again{seen}{rest}"
    );
    let down = lab.xl(&["down"], &file);
    assert!(down.status.success(), "{}", text(&down.stderr));
}

/// A repo written as `size` pseudo-random bytes of `model.safetensors` and
/// a `config.json` under `repos/org/NAME`; the bytes are returned.
fn big_repo(repos: &std::path::Path, name: &str, size: usize) -> Vec<u8> {
    let dir = repos.join("org").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        format!("{{\"tag\": \"{name}\"}}\n"),
    )
    .unwrap();
    let mut w = Vec::with_capacity(size);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while w.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.extend_from_slice(&x.to_le_bytes());
    }
    w.truncate(size);
    std::fs::write(dir.join("model.safetensors"), &w).unwrap();
    w
}

/// A node whose disk cannot hold the model: `deploy` stops before the
/// download, in one line naming the node, what the model needs and what
/// is free; the Hub sends no byte of the shard, and nothing starts.
#[test]
fn deploy_to_a_node_whose_disk_is_too_small_stops_before_the_download() {
    need_root!();
    let mut lab = Lab::up("xdz", 2, &[1]);
    let small = lab.root_of(2);
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2200m,mode=755", "xfer-small"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(mounted.success());
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _umount = Umount(small.clone());
    lab.agents[1] = Some(lab.start_agent(2));
    // A 2.5 GiB shard (sparse: it costs no disk here) for a 2.1 GiB disk,
    // which passes the check's own floor (2 GiB free).
    let repos = lab.dir.join("repos");
    let dir = repos.join("org/big");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), "{}\n").unwrap();
    std::fs::File::create(dir.join("model.safetensors"))
        .unwrap()
        .set_len(5 << 29)
        .unwrap();
    let (_hub, port) = hub_in_head(&lab, &repos, &[]);
    let endpoint = format!("http://{}:{port}", lab.mgmt_ip(1));
    let launch = launch_of_model(&lab, "org/big");
    let file = lab.cluster_file("c.toml", &launch, |i| lab.fabric(i));
    let out = deploy_cmd(&lab, &file, &endpoint, &["--timeout", "60"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("n2 (2.1 GiB free at") && last.contains("takes 2.5 GiB (the Hub's listing)"),
        "{err}"
    );
    let served = hub_stats(&lab, &endpoint)["bytes_served"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        served < 1 << 20,
        "the Hub served {served} bytes before the refusal: {err}"
    );
    assert!(lab.standins().is_empty(), "something started: {err}");
}

/// Issue 34's one command: from an empty cluster to a completion. The
/// model is a Hub repo (a Hub look-alike, `tests/hub_server.py`, runs
/// inside the head's namespace, where its agent pulls); no node holds it.
/// `deploy` checks first (everything but the weights must pass), syncs the
/// repo to both nodes (pulled once, fanned out over the fabric), then
/// `up` starts the ranks and waits for the engine to answer. Its JSON
/// gives each phase's time. Run again, it moves nothing: the sync phase
/// is skipped because every node holds the model verified.
#[test]
fn deploy_takes_an_empty_cluster_to_a_completion_and_a_second_deploy_syncs_nothing() {
    need_root!();
    let lab = Lab::up("xdp", 2, &[1, 2]);
    let repos = lab.dir.join("repos");
    // A second repo, for the last case.
    let hub_repo = tiny_repos(&lab, &repos);
    let (_hub, port) = hub_in_head(&lab, &repos, &[]);
    let endpoint = format!("http://{}:{port}", lab.mgmt_ip(1));
    let (commit, launch) = launch_of_repo(&lab, &endpoint, "org/tiny");
    let file = lab.cluster_file("c.toml", &launch, |i| lab.fabric(i));
    lab.save_plan(&file);

    let deploy = || {
        deploy_cmd(&lab, &file, &endpoint, &["--json", "--timeout", "120"])
            .output()
            .unwrap()
    };
    let out = deploy();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["ready"], true, "{stdout}");
    // `up` asked again only what the sync changed; the slow probes passed
    // once, in deploy's preflight.
    assert!(
        stderr.contains("checking 2 node(s) again (the weights"),
        "{stderr}"
    );
    // The empty nodes' weights rows say what deploy does next, not a
    // failure with a fix to run.
    assert_eq!(
        stderr.matches("deploy syncs the model here now").count(),
        2,
        "{stderr}"
    );
    assert!(
        !stderr.contains("syncs it to every node that lacks it"),
        "{stderr}"
    );
    let phases = &v["phases"];
    assert_eq!(
        phases["lacking"],
        serde_json::json!(["n1", "n2"]),
        "{stdout}"
    );
    assert!(phases["root"].is_string(), "{stdout}");
    for k in ["check_s", "sync_s", "up_s"] {
        assert!(phases[k].as_f64().is_some_and(|s| s > 0.0), "{k}: {stdout}");
    }
    assert!(
        v["readiness"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{stdout}"
    );
    assert_eq!(lab.standins().len(), 2, "{stderr}");
    for i in 1..=2 {
        let snap = lab.root_of(i).join(format!(
            "models--org--tiny/snapshots/{commit}/model.safetensors"
        ));
        assert_eq!(
            std::fs::read(&snap).unwrap(),
            std::fs::read(hub_repo.join("model.safetensors")).unwrap(),
            "n{i}'s copy"
        );
    }
    let down = lab.xl(&["down"], &file);
    assert!(down.status.success(), "{}", text(&down.stderr));

    // Again: nothing to sync, and it serves.
    std::fs::remove_dir_all(lab.out_dir()).unwrap();
    std::fs::create_dir_all(lab.out_dir()).unwrap();
    let out = deploy();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["phases"]["lacking"], serde_json::json!([]), "{stdout}");
    assert_eq!(v["phases"]["sync_s"], 0.0, "{stdout}");
    let down = lab.xl(&["down"], &file);
    assert!(down.status.success(), "{}", text(&down.stderr));

    // A typo in the repo's name: the sync fails at once, in one line that
    // names the repo, and nothing starts.
    let typo = launch.replace("org/tiny@", "org/tinny@");
    let file = lab.cluster_file("typo.toml", &typo, |i| lab.fabric(i));
    std::fs::remove_dir_all(lab.out_dir()).unwrap();
    std::fs::create_dir_all(lab.out_dir()).unwrap();
    let out = deploy_cmd(&lab, &file, &endpoint, &["--timeout", "60"])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("the sync of hf://org/tinny@") && last.contains("run deploy again"),
        "{err}"
    );
    assert!(lab.standins().is_empty(), "something started: {err}");

    // A check besides the weights fails (the API port is taken on n1):
    // deploy stops before `up`, and the sync, which started beside the
    // preflight once the nodes' weights and disks were read, goes on: the
    // next deploy finds the model there.
    let mut squatter = squat_api_port(&lab, 1);
    let (commit2, launch2) = launch_of_repo(&lab, &endpoint, "org/tiny2");
    let file = lab.cluster_file("port.toml", &launch2, |i| lab.fabric(i));
    let out = deploy_cmd(&lab, &file, &endpoint, &["--timeout", "60"])
        .output()
        .unwrap();
    let _ = squatter.kill();
    let _ = squatter.wait();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "the sync of hf://org/tiny2@{commit2} started beside the check goes on"
        )),
        "{err}"
    );
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("besides the weights failed"), "{err}");
    assert!(lab.standins().is_empty(), "something started: {err}");
    for i in 1..=2 {
        let snap = lab.root_of(i).join(format!(
            "models--org--tiny2/snapshots/{commit2}/model.safetensors"
        ));
        wait_until(&format!("n{i}'s copy of org/tiny2"), HANG, || snap.exists());
    }
}

/// The model is a Hub repo at `main`, and the Hub's `main` moves after the
/// first deploy (a new commit: config.json changed). Deploy again: the
/// nodes still hold the old commit verified, and before this fix deploy
/// said "nothing to move" and served it; now it reads the Hub's commit
/// for `main` from the operator's machine, finds both nodes stale, syncs
/// the new commit into the same name, and serves that (each node's
/// `refs/main` names it and its snapshot holds the new config.json).
#[test]
fn deploy_after_the_hub_moved_main_syncs_the_new_commit_and_serves_it() {
    need_root!();
    let lab = Lab::up("xdm", 2, &[1, 2]);
    let repos = lab.dir.join("repos");
    let hub_repo = tiny_repo(&lab, &repos);
    let launch = launch_of_model(&lab, "org/tiny");
    let file = lab.cluster_file("c.toml", &launch, |i| lab.fabric(i));
    lab.save_plan(&file);
    let deploy = |endpoint: &str| {
        std::fs::remove_dir_all(lab.out_dir()).unwrap();
        std::fs::create_dir_all(lab.out_dir()).unwrap();
        let out = deploy_cmd(&lab, &file, endpoint, &["--json", "--timeout", "120"])
            .output()
            .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{stdout}{stderr}");
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(v["ready"], true, "{stdout}");
        let down = lab.xl(&["down"], &file);
        assert!(down.status.success(), "{}", text(&down.stderr));
        (v, stderr)
    };
    let refs_main = |i: usize| {
        std::fs::read_to_string(lab.root_of(i).join("models--org--tiny/refs/main"))
            .unwrap_or_default()
            .trim()
            .to_string()
    };

    let (hub, port) = hub_in_head(&lab, &repos, &[]);
    let (v, _) = deploy(&format!("http://{}:{port}", lab.mgmt_ip(1)));
    assert_eq!(v["phases"]["lacking"], serde_json::json!(["n1", "n2"]));
    let first = refs_main(1);
    assert_eq!(first.len(), 40, "{first:?}");
    assert_eq!(refs_main(2), first);
    drop(hub);

    // main moves: a new config.json, so a new commit.
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hub_repo.join("config.json")).unwrap()).unwrap();
    config["xfer_test_revision"] = serde_json::json!(2);
    let new_config = serde_json::to_vec_pretty(&config).unwrap();
    std::fs::write(hub_repo.join("config.json"), &new_config).unwrap();
    let (_hub, port) = hub_in_head(&lab, &repos, &[]);
    let (v, stderr) = deploy(&format!("http://{}:{port}", lab.mgmt_ip(1)));
    let phases = &v["phases"];
    assert_eq!(
        phases["lacking"],
        serde_json::json!(["n1", "n2"]),
        "the nodes' older commit was not noticed: {v:#}\n{stderr}"
    );
    assert!(stderr.contains("hold(s) an older commit"), "{stderr}");
    assert!(phases["sync_s"].as_f64().is_some_and(|s| s > 0.0), "{v:#}");
    let second = refs_main(1);
    assert_ne!(second, first, "n1 still names the old commit");
    assert_eq!(refs_main(2), second);
    for i in 1..=2 {
        let snap = lab
            .root_of(i)
            .join(format!("models--org--tiny/snapshots/{second}/config.json"));
        assert_eq!(
            std::fs::read(&snap).unwrap(),
            new_config,
            "n{i}'s config.json"
        );
    }
    assert!(
        v["readiness"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{v:#}"
    );
}

/// The stand-in's report of its compile cache on node `node`: whether it
/// found the artifact (warm) or built it.
fn cache_of(lab: &Lab, node: &str) -> Option<serde_json::Value> {
    lab.standins()
        .into_iter()
        .find(|s| s["node"] == node && s["mode"] == "vllm")
        .map(|s| s["compile_cache"].clone())
}

fn fresh_out(lab: &Lab) {
    std::fs::remove_dir_all(lab.out_dir()).unwrap();
    std::fs::create_dir_all(lab.out_dir()).unwrap();
}

#[test]
fn compile_caches_built_on_the_first_start_reach_the_other_nodes_verified() {
    need_root!();
    // Networks of its own, so that it may run beside the other labs.
    let standin = repo().join("tests/standin");
    let nets = Nets {
        mgmt: "10.93",
        fabric: "10.94.0",
    };
    let lab = Lab::with_engine(
        "xcc",
        3,
        &[1, 2, 3],
        standin.join("bin"),
        Some(standin.join("pylib")),
        nets,
    );
    let m = lab.model("a");
    lab.push(&m, "tiny", &[1, 2, 3]);
    let name = xfer_proto::compile_cache::snapshot_name("vllm", &["vllm".into()]);
    let artifact = "vllm/torch_compile_cache/standin/graph.bin";
    let on = |nodes: &str, caches: &str| {
        let l = lab.launch("vllm", "tiny", &[]).replacen(
            "\n[launch.env]",
            &format!("nodes = {nodes}\ncaches = {caches}\n\n[launch.env]"),
            1,
        );
        lab.cluster_file("c.toml", &l, |i| lab.fabric(i))
    };

    // n1 and n2, both cold: `check` warns, the ranks build their caches,
    // and once ready the head's is the snapshot on both, verified.
    let file = on("[\"n1\", \"n2\"]", "[\"vllm\"]");
    lab.save_plan(&file);
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown}{}", text(&out.stderr));
    let row = rows(&shown, "caches");
    assert!(
        row.len() == 1 && row[0].starts_with("WARN") && row[0].contains("none on n1, n2"),
        "{shown}"
    );
    let out = lab.xl(&["up", "--timeout", "60"], &file);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    for n in ["n1", "n2"] {
        let c = cache_of(&lab, n).unwrap_or_else(|| panic!("no report from {n}: {err}"));
        assert_eq!(c["warm"], false, "{n}: {c}");
        let live = lab.root_of(n[1..].parse().unwrap()).join(".xfer-caches");
        assert!(
            c["path"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{}/.xfer-caches/{name}/vllm/", lab.mnt.display())),
            "{c} not under {}",
            live.display()
        );
    }
    assert!(
        err.contains(&format!("compile caches {name}: offering n1's")),
        "{err}"
    );
    let built = std::fs::read(
        lab.root_of(1)
            .join(".xfer-caches")
            .join(&name)
            .join(artifact),
    )
    .unwrap();
    for i in [1, 2] {
        assert_eq!(
            std::fs::read(lab.root_of(i).join(&name).join(artifact)).unwrap(),
            built,
            "n{i}'s snapshot"
        );
    }
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    let row = rows(&shown, "caches");
    assert!(
        row.len() == 1 && row[0].starts_with("pass") && row[0].contains("one root on every node"),
        "{shown}"
    );
    assert!(
        shown.contains(", caches "),
        "the unit names the caches: {shown}"
    );
    let down = lab.xl(&["down"], &file);
    assert!(down.status.success(), "{}", text(&down.stderr));

    // A fresh node: n3 gets the snapshot before its rank starts, and its
    // engine finds the artifact it never built.
    fresh_out(&lab);
    let file = on("[\"n1\", \"n3\"]", "[\"vllm\"]");
    lab.save_plan(&file);
    let out = lab.xl(&["up", "--timeout", "60"], &file);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("delivering root") && err.contains("from n1 to n3"),
        "{err}"
    );
    let c = cache_of(&lab, "n3").unwrap_or_else(|| panic!("no report from n3: {err}"));
    assert_eq!(c["warm"], true, "{c}");
    assert!(
        c["head"]
            .as_str()
            .unwrap()
            .starts_with("standin compiled graph v1"),
        "{c}"
    );
    assert!(!err.contains("offering"), "every node started warm: {err}");
    let status = lab.xl(&["status"], &file);
    let shown = text(&status.stdout);
    assert!(
        shown.contains("launch unit") && shown.contains(", caches "),
        "status names the caches' root: {shown}{}",
        text(&status.stderr)
    );
    let down = lab.xl(&["down"], &file);
    assert!(down.status.success(), "{}", text(&down.stderr));

    // A snapshot changed on disk after its delivery (same size: its
    // record's stamp tells, and failing that the hash the agent computes
    // as it copies): n3 refuses to start its rank, naming the file.
    fresh_out(&lab);
    let snap = lab.root_of(3).join(&name).join(artifact);
    let mut bytes = std::fs::read(&snap).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&snap, &bytes).unwrap();
    std::fs::remove_dir_all(lab.root_of(3).join(".xfer-caches")).unwrap();
    let out = lab.xl(&["up", "--timeout", "60"], &file);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("n3: not starting rank 1: compile cache")
            && err.contains(&format!("{artifact} was modified since it was verified"))
            && err.contains(&format!("xfer rm {name} --nodes n3")),
        "{err}"
    );
    assert!(cache_of(&lab, "n3").is_none(), "n3 started: {err}");
    assert!(
        !lab.root_of(3)
            .join(".xfer-caches")
            .join(&name)
            .join(artifact)
            .exists(),
        "the tampered file was copied into the live cache"
    );

    // A cache entry that is a path, inside or outside the root, is refused
    // in one line before anything is asked of a node.
    for bad in ["\"../../etc\"", "\"/etc/cron.d\"", "\"vllm/../../x\""] {
        let f = on("[\"n1\", \"n2\"]", &format!("[{bad}]"));
        let out = lab.xl(&["check"], &f);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("caches takes kinds of compile cache, not paths"),
            "{err}"
        );
    }
    let f = on("[\"n1\", \"n2\"]", "[\"vlm\"]");
    let err = text(&lab.xl(&["check"], &f).stderr);
    assert!(err.contains("did you mean \"vllm\""), "{err}");
}

/// A process in node `i` that holds the engine's API port (8000), once it
/// listens.
fn squat_api_port(lab: &Lab, i: usize) -> std::process::Child {
    let mut squatter = Command::new("ip")
        .args(["netns", "exec", &lab.ns(i), "python3", "-c"])
        .arg("import socket,time\ns=socket.socket()\ns.bind(('0.0.0.0',8000))\ns.listen()\nprint('ok',flush=True)\ntime.sleep(600)")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(squatter.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    squatter
}

/// A CNCF ModelPack artifact (issue 35) in a registry on the head's own
/// management address (Debian's docker-registry, the artifact pushed by
/// `tests/oci_push.py` as `modctl push` would): `xfer sync oci://` takes
/// it to both nodes as a job, `check` gates it (the weights row passes on
/// the one root every node holds) and `up` serves it.
#[test]
fn a_modelpack_artifact_synced_to_the_nodes_passes_the_gate_and_serves() {
    need_root!();
    let lab = Lab::up("xoa", 2, &[1, 2]);
    let addr = format!("{}:15166", lab.mgmt_ip(1));
    let reg = lab.dir.join("registry");
    std::fs::create_dir_all(&reg).unwrap();
    std::fs::write(
        reg.join("config.yml"),
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            reg.join("data").display()
        ),
    )
    .unwrap();
    let _registry = Reaped(
        Command::new("ip")
            .args(["netns", "exec", &lab.ns(1), "docker-registry", "serve"])
            .arg(reg.join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (scripts/test.sh installs it)"),
    );
    wait_until("the registry to answer", HANG, || {
        Command::new("ip")
            .args(["netns", "exec", &lab.ns(1), "curl", "-sf"])
            .arg(format!("http://{addr}/v2/"))
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success()
    });
    let m = lab.model("oci");
    let spec = serde_json::json!([
        {"media": "application/vnd.cncf.model.weight.config.v1.raw", "path": "config.json", "file": m.join("config.json")},
        {"media": "application/vnd.cncf.model.weight.v1.raw", "path": "model.safetensors", "file": m.join("model.safetensors")},
    ]);
    std::fs::write(lab.dir.join("spec.json"), spec.to_string()).unwrap();
    let pushed = Command::new("ip")
        .args(["netns", "exec", &lab.ns(1), "python3"])
        .arg(repo().join("tests/oci_push.py"))
        .args([&addr, "org/tiny", "v1"])
        .arg(lab.dir.join("spec.json"))
        .output()
        .unwrap();
    assert!(pushed.status.success(), "{}", text(&pushed.stderr));

    let file = lab.cluster_file("c.toml", &lab.launch("vllm", "tiny", &[]), |i| {
        lab.fabric(i)
    });
    lab.save_plan(&file);
    let synced = Command::new(xfer_bin())
        .args(["sync", &format!("oci://{addr}/org/tiny:v1"), "--insecure"])
        .args(["--from", "n1", "--wait", "--cluster"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(synced.status.success(), "{}", text(&synced.stderr));
    for i in 1..=2 {
        assert_eq!(
            std::fs::read(lab.root_of(i).join("tiny/model.safetensors")).unwrap(),
            std::fs::read(m.join("model.safetensors")).unwrap(),
            "n{i}'s copy"
        );
    }
    let out = lab.xl(&["check"], &file);
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown}{}", text(&out.stderr));
    let weights = rows(&shown, "weights");
    assert!(
        !weights.is_empty() && weights.iter().all(|r| r.starts_with("pass")),
        "{shown}"
    );
    let out = lab.xl(&["up", "--timeout", "60"], &file);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(lab.standins().len(), 2);
    let down = lab.xl(&["down"], &file);
    assert!(down.status.success(), "{}", text(&down.stderr));
}

/// Every rank log of node `i` (`<root>/.xfer/runs/*/rank.log`), joined.
fn rank_logs(lab: &Lab, i: usize) -> String {
    let runs = lab.root_of(i).join(".xfer/runs");
    let mut all = String::new();
    for e in std::fs::read_dir(runs).into_iter().flatten().flatten() {
        all += &std::fs::read_to_string(e.path().join("rank.log")).unwrap_or_default();
    }
    all
}

/// `deploy` under `stream_weights` starts the ranks *held* while its
/// preflight still runs (here node 2's torch probe waits for a gate the
/// test opens): each rank waits before it reads the model or binds a
/// port, and is released only once the preflight passed. When the
/// preflight fails instead (node 2's torch differs), the held ranks are
/// stopped, never released, and `deploy` refuses in one line.
#[test]
fn held_ranks_start_beside_the_preflight_and_run_only_once_it_passed() {
    need_root!();
    let mut lab = Lab::up("xhd", 2, &[1]);
    // Node 2's Python: a torch whose import waits for `gate` (and says it
    // was asked), so the preflight's slow round ends when the test says.
    let (fake, pylib) = fake_python(&lab);
    std::fs::create_dir_all(pylib.join("torch")).unwrap();
    let gate = lab.dir.join("gate");
    let asked = lab.dir.join("gate.asked");
    let torch = |version: &str| {
        std::fs::write(
            pylib.join("torch/__init__.py"),
            format!(
                "import os, time\nopen({asked:?}, 'w').close()\nwhile not os.path.exists({gate:?}):\n    time.sleep(0.02)\n__version__ = \"{version}\"\n",
                asked = asked.display().to_string(),
                gate = gate.display().to_string(),
            ),
        )
        .unwrap();
    };
    torch("2.13.0");
    lab.agents[1] = Some(lab.start_agent_with_path_first(2, &fake.join("bin")));
    let repos = lab.dir.join("repos");
    tiny_repos(&lab, &repos);
    let (_hub, port) = hub_in_head(&lab, &repos, &[]);
    let endpoint = format!("http://{}:{port}", lab.mgmt_ip(1));
    let streamed = |repo: &str| {
        let (_, launch) = launch_of_repo(&lab, &endpoint, repo);
        let launch = launch.replacen("\n[launch.env]", "stream_weights = true\n\n[launch.env]", 1);
        assert!(launch.contains("stream_weights = true\n"), "{launch}");
        launch
    };
    let both_held = |what: &str| {
        wait_until(what, HANG, || {
            let logs: Vec<String> = (1..=2).map(|i| rank_logs(&lab, i)).collect();
            if logs.iter().all(|l| l.contains("standin: held until")) {
                Ok(())
            } else {
                Err(Text(logs.join("\n")))
            }
        })
    };

    // It passes: held, then released once the gate opened.
    let file = lab.cluster_file("c.toml", &streamed("org/tiny"), |i| lab.fabric(i));
    lab.save_plan(&file);
    let deploy = deploy_cmd(&lab, &file, &endpoint, &["--json", "--timeout", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    both_held("both ranks to start held");
    // The preflight cannot end before the gate opens; once its torch probe
    // waits there, the ranks are held beside a preflight known to run.
    wait_until(
        "the preflight's torch probe to wait at the gate",
        HANG,
        || asked.exists(),
    );
    for i in 1..=2 {
        let log = rank_logs(&lab, i);
        assert!(
            !log.contains("standin: released"),
            "n{i} went on before the verdict: {log}"
        );
    }
    std::fs::write(&gate, b"go").unwrap();
    let out = deploy.wait_with_output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["ready"], true, "{stdout}");
    assert!(
        v["phases"]["check_s"].as_f64().is_some_and(|s| s > 0.0),
        "{stdout}"
    );
    let held_at = stderr.find("; held (the engine imports").expect(&stderr);
    let table_at = stderr.find("torch 2.13.0 on every node").expect(&stderr);
    let released_at = stderr.find("released the held ranks").expect(&stderr);
    assert!(held_at < table_at && table_at < released_at, "{stderr}");
    for i in 1..=2 {
        let log = rank_logs(&lab, i);
        let (h, r) = (
            log.find("standin: held until").unwrap(),
            log.find("standin: released").expect(&log),
        );
        assert!(h < r, "{log}");
        // Once released, the rank met the preflight's rendezvous through
        // the store node 2 hosts on the rendezvous port (node 2 is its
        // rank 0, the head rank 1), and the agent read what it reported.
        let spec = format!("{}:29500 {} 2 57.0", lab.fabric_ip(2), i % 2);
        let (r, m) = (
            log.find("standin: released").unwrap(),
            log.find(&format!("standin: meeting the rendezvous {spec}"))
                .expect(&log),
        );
        assert!(r < m && log.contains("standin: rendezvous ok "), "{log}");
        let agent =
            std::fs::read_to_string(lab.dir.join(format!("agent{i}.log"))).unwrap_or_default();
        assert!(agent.contains("was met by its held engine in"), "{agent}");
    }
    // The preflight left the rendezvous to the held ranks, and `deploy`
    // showed what they reported once released.
    let left = stderr
        .find(launcher::check::HELD_RENDEZVOUS)
        .expect(&stderr);
    let met: Vec<_> = rows(&stderr, "rendezvous")
        .into_iter()
        .filter(|r| r.starts_with("pass"))
        .collect();
    assert_eq!(met.len(), 2, "{stderr}");
    assert!(left < stderr.find(met[0]).unwrap(), "{stderr}");
    assert!(released_at < stderr.find(met[0]).unwrap(), "{stderr}");
    let down = lab.xl(&["down"], &file);
    assert!(down.status.success(), "{}", text(&down.stderr));

    // It fails: node 2's torch differs; the held ranks are stopped.
    for i in 1..=2 {
        let _ = std::fs::remove_dir_all(lab.root_of(i).join(".xfer/runs"));
    }
    std::fs::remove_file(&gate).unwrap();
    std::fs::remove_file(&asked).unwrap();
    torch("2.12.0");
    let file = lab.cluster_file("c2.toml", &streamed("org/tiny2"), |i| lab.fabric(i));
    lab.save_plan(&file);
    let deploy = deploy_cmd(&lab, &file, &endpoint, &["--timeout", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    both_held("both ranks of the second deploy to start held");
    std::fs::write(&gate, b"go").unwrap();
    let out = deploy.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("refusing to start"), "{stderr}");
    assert!(stderr.contains("torch differs"), "{stderr}");
    assert!(
        stderr.contains("its preflight failed while it was held"),
        "{stderr}"
    );
    for i in 1..=2 {
        let log = rank_logs(&lab, i);
        assert!(
            !log.contains("standin: released"),
            "n{i} was released: {log}"
        );
        let runs = lab.root_of(i).join(".xfer/runs");
        for e in std::fs::read_dir(&runs).unwrap().flatten() {
            assert!(
                !e.path().join("released").exists(),
                "n{i}: {}",
                e.path().display()
            );
        }
        // Its agent stopped it, for that reason, before `deploy` returned.
        assert!(
            log.contains("stopping: its preflight failed while it was held")
                && log.contains("stopped"),
            "n{i}: {log}"
        );
    }
}

/// A held rank meets the preflight's rendezvous once released, and it
/// fails there (the stand-in refuses it as a worker whose Gloo cannot
/// connect would): `deploy` shows the failing rendezvous rows with what
/// the ranks reported (or that a rank was stopped before it met, its
/// agent having seen the peer's rank exit), stops every rank, and exits 1,
/// before any rank reads the model.
#[test]
fn a_rendezvous_the_held_ranks_fail_stops_them_with_its_row() {
    need_root!();
    let lab = Lab::up("xhr", 2, &[1, 2]);
    let repos = lab.dir.join("repos");
    tiny_repos(&lab, &repos);
    let (_hub, port) = hub_in_head(&lab, &repos, &[]);
    let endpoint = format!("http://{}:{port}", lab.mgmt_ip(1));
    let (_, launch) = launch_of_repo(&lab, &endpoint, "org/tiny");
    let launch = launch.replacen(
        "\n[launch.env]\n",
        "stream_weights = true\n\n[launch.env]\nSTANDIN_RENDEZVOUS = \"refuse\"\n",
        1,
    );
    let file = lab.cluster_file("c.toml", &launch, |i| lab.fabric(i));
    lab.save_plan(&file);
    let out = deploy_cmd(&lab, &file, &endpoint, &["--timeout", "120"])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("released the held ranks"), "{stderr}");
    let failed: Vec<_> = rows(&stderr, "rendezvous")
        .into_iter()
        .filter(|r| r.starts_with("FAIL"))
        .collect();
    assert_eq!(failed.len(), 2, "{stderr}");
    // A node that met the fault says so; the other may have been stopped
    // by its agent first (a peer's rank exited), before it met anything.
    let faulted = |r: &&str| {
        r.contains("in the held engine's worker, through the store at")
            && r.contains("Connection refused (the test's fault)")
    };
    assert!(failed.iter().any(faulted), "{stderr}");
    assert!(
        failed
            .iter()
            .all(|r| faulted(r) || r.contains("ended before it met the other ranks")),
        "{stderr}"
    );
    assert!(stderr.contains("refusing to start"), "{stderr}");
    let met: Vec<_> = (1..=2).map(|i| rank_logs(&lab, i)).collect();
    assert!(
        met.iter().any(|l| l.contains("standin: rendezvous failed")),
        "{met:?}"
    );
    // No rank got as far as checking (reading) the model.
    assert!(lab.standins().is_empty(), "{:?}", lab.standins());
    lab.assert_none_alive();
}
