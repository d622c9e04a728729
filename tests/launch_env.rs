//! `--allow-exec` against the rank's environment and devices, each attack
//! performed against a real agent (issue 30, finding 4): executables
//! planted in a model's folder, named like the allowed program (`sleep`,
//! `docker`, `python3`), reached through `PATH` in the rank's environment
//! or the preflight's `python_of`; `LD_PRELOAD` and `DOCKER_HOST`; raw
//! host devices for a rank's container. Each is refused with one line,
//! and no planted program ever runs (its marker file never appears). And
//! the controls: the allowed program still runs, from the absolute path
//! the agent resolved on its own `PATH`, and so does the container
//! engine, resolved when the agent started.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;
use common::*;
use xfer::config::auth::Credential;
use xfer_proto::launch::*;

/// Writes an executable shell script `dir/name`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// Plants `<root>/m/tools/NAME`, which would create `marker` if it ever
/// ran; returns the folder.
fn plant(root: &Path, name: &str, marker: &Path) -> PathBuf {
    let tools = root.join("m").join("tools");
    script(
        &tools,
        name,
        &format!("touch '{}'\necho 9.9.9", marker.display()),
    );
    tools
}

fn spec(run: &str, argv: &[&str], env: &[(&str, &str)]) -> RankSpec {
    RankSpec {
        run: run.into(),
        node: "n1".parse().unwrap(),
        rank: 0,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        procs: vec![ProcSpec {
            argv: argv.iter().map(|a| a.to_string()).collect(),
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

fn start(cred: &Credential, agent: &Agent, spec: RankSpec) -> LaunchReply {
    ask_launch(cred, "n1", agent, &LaunchRequest::StartRank(Box::new(spec)))
}

fn refusal(reply: LaunchReply) -> String {
    match reply {
        LaunchReply::Failed(Refusal::Forbidden(why)) => {
            assert_eq!(why.lines().count(), 1, "{why}");
            why
        }
        other => panic!("expected a Forbidden refusal, got {other:?}"),
    }
}

fn runs(reply: LaunchReply) -> Vec<RankReport> {
    match reply {
        LaunchReply::Runs(r) => r,
        other => panic!("expected the runs, got {other:?}"),
    }
}

fn stop(cred: &Credential, agent: &Agent, run: &str) -> Vec<RankReport> {
    runs(ask_launch(
        cred,
        "n1",
        agent,
        &LaunchRequest::StopRun {
            run: Some(run.into()),
            grace_ms: 1_000,
            reason: "test over".into(),
        },
    ))
}

/// Waits until run `run`'s first process runs; its report.
fn running(cred: &Credential, agent: &Agent, run: &str) -> RankReport {
    let query = LaunchRequest::RunQuery {
        run: Some(run.into()),
    };
    let mut report = None;
    wait_until("the rank to run", Duration::from_secs(30), || {
        let r = runs(ask_launch(cred, "n1", agent, &query)).remove(0);
        let up = matches!(r.procs[0].state, ProcState::Running { .. });
        assert!(r.state.is_live(), "{r:?}");
        report = Some(r);
        up
    });
    report.unwrap()
}

/// The test's own dir, key, credential and root.
fn setup(tag: &str) -> (tempfile::TempDir, PathBuf, Credential, PathBuf) {
    let t = tempdir(tag);
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    (t, key, cred, root)
}

#[test]
fn a_rank_cannot_reach_a_planted_program_through_its_environment() {
    let (t, key, cred, root) = setup("launchenv-host");
    let marker = t.path().join("planted-ran");
    let tools = plant(&root, "sleep", &marker);
    plant(&root, "python3", &marker);
    let tools = tools.to_str().unwrap();
    let agent = Agent::start_with(
        "127.0.0.67:0",
        &root,
        &key,
        &["--allow-launch", "--allow-exec", "sleep"],
    );

    // `sleep` is allowed; `PATH` would make it the planted one.
    let why = refusal(start(
        &cred,
        &agent,
        spec("p1", &["sleep", "600"], &[("PATH", tools)]),
    ));
    assert!(
        why.starts_with("n1: [launch.env] sets PATH, which chooses the program a name runs"),
        "{why}"
    );
    assert!(why.contains("--allow-exec"), "{why}");
    // The loader's keys, the same way.
    let so = format!("{tools}/evil.so");
    for (k, v) in [("LD_PRELOAD", so.as_str()), ("LD_LIBRARY_PATH", tools)] {
        let why = refusal(start(
            &cred,
            &agent,
            spec("p2", &["sleep", "600"], &[(k, v)]),
        ));
        assert!(
            why.starts_with(&format!(
                "n1: [launch.env] sets {k}, which makes the dynamic loader"
            )),
            "{why}"
        );
    }
    // Nor the release file of a held rank, which only the agent names:
    // set by a launcher, it could point a rank at a file it creates.
    let why = refusal(start(
        &cred,
        &agent,
        spec(
            "p4",
            &["sleep", "600"],
            &[("XFER_HOLD_FILE", &format!("{tools}/go"))],
        ),
    ));
    assert!(
        why.starts_with("n1: [launch.env] sets XFER_HOLD_FILE, which the agent sets itself"),
        "{why}"
    );
    // Nor by its path, which is not the name the operator allowed.
    let planted = format!("{tools}/sleep");
    let why = refusal(start(&cred, &agent, spec("p3", &[&planted, "600"], &[])));
    assert!(
        why.contains("is not in this agent's --allow-exec list"),
        "{why}"
    );

    // The preflight runs the allowed program, not a planted "Python" that
    // its `python_of` names.
    let probe = LaunchRequest::Preflight(Box::new(PreflightRequest {
        node: "n1".parse().unwrap(),
        fabric_if: "lo".into(),
        fabric_ip: "127.0.0.67".parse().unwrap(),
        model_path: "/nonexistent".into(),
        revision: None,
        ports: vec![],
        listen_port: None,
        peers: vec![],
        window_ms: 0,
        versions: vec![VersionProbe {
            what: "engine".into(),
            argv: vec!["sleep".into(), "0".into()],
            python_of: Some(format!("{tools}/python3")),
        }],
        rdma: None,
        image: None,
        resolve: Vec::new(),
        loader_link: false,
    }));
    let LaunchReply::PreflightReport(facts) = ask_launch(&cred, "n1", &agent, &probe) else {
        panic!("no preflight report");
    };
    assert_ne!(facts.versions[0].version, Probe::Ok("9.9.9".into()));

    assert!(!marker.exists(), "a planted program ran");
    assert!(
        !root.join(".xfer/runs").exists()
            || std::fs::read_dir(root.join(".xfer/runs"))
                .unwrap()
                .next()
                .is_none(),
        "a refused rank left a run record"
    );

    // The control: the allowed program runs, from the absolute path the
    // agent found on its own PATH (this test's), as does its stop hook.
    let sleep = xfer::util::program::resolve("sleep").unwrap();
    let mut ok = spec("p4", &["sleep", "600"], &[("XFER_TEST", "1")]);
    ok.on_stop = vec![vec!["sleep".into(), "0".into()]];
    let started = runs(start(&cred, &agent, ok)).remove(0);
    assert_eq!(started.procs[0].argv[0], sleep.to_str().unwrap());
    let r = running(&cred, &agent, "p4");
    assert_eq!(r.procs[0].argv, [sleep.to_str().unwrap(), "600"]);
    let stopped = stop(&cred, &agent, "p4").remove(0);
    let log = std::fs::read_to_string(&stopped.log).unwrap();
    assert!(
        log.contains(&format!("running {} 0", sleep.display())),
        "{log}"
    );
    assert!(!marker.exists(), "a planted program ran");
}

/// An engine stand-in: logs every command line (`$0` is the path it was
/// started by) to `log`; `image inspect` prints an id, `run` sleeps.
fn fake_docker(dir: &Path, log: &Path) -> PathBuf {
    script(
        dir,
        "docker",
        &format!(
            "echo \"$0 $*\" >> '{log}'\ncase \"$1\" in\n  image) echo sha256:{id} ;;\n  run) exec sleep 600 ;;\nesac",
            log = log.display(),
            id = "ab".repeat(32)
        ),
    )
}

#[test]
fn a_container_rank_cannot_steer_the_engine_or_take_host_devices() {
    let (t, key, cred, root) = setup("launchenv-container");
    let marker = t.path().join("planted-ran");
    let tools = plant(&root, "docker", &marker);
    let tools = tools.to_str().unwrap();
    let log = t.path().join("docker.log");
    let docker = fake_docker(&t.path().join("bin"), &log);
    let path = format!(
        "{}:{}",
        t.path().join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let agent = Agent::start_cmd(
        "127.0.0.68:0",
        &root,
        &key,
        &[
            "--allow-launch",
            "--allow-exec",
            "vllm",
            "--container-engine",
            "docker",
        ],
        |c| {
            c.env("PATH", &path);
        },
    );
    let boxed = |run: &str, env: &[(&str, &str)], gpus: &[&str]| {
        let mut s = spec(run, &["vllm", "serve", "/m"], env);
        s.container = Some(ContainerSpec {
            image: "xt/app:1".into(),
            image_id: None,
            gpus: GpuAccess::Devices(gpus.iter().map(|d| d.to_string()).collect()),
            shm_bytes: None,
        });
        s
    };

    // The client would run the planted `docker`, or talk to another daemon,
    // or load a library of the caller's.
    for (k, v) in [
        ("PATH", tools),
        ("DOCKER_HOST", "tcp://127.0.0.1:9"),
        ("LD_PRELOAD", &format!("{tools}/evil.so")),
    ] {
        let why = refusal(start(
            &cred,
            &agent,
            boxed("c1", &[(k, v)], &["/dev/nvidia0"]),
        ));
        assert!(
            why.starts_with(&format!("n1: [launch.env] sets {k}, ")),
            "{why}"
        );
    }
    // Raw host devices, by path or with docker's permission suffix.
    for raw in ["/dev/mem", "/dev/sda:/dev/sda:rwm", "/dev/kmsg"] {
        let why = refusal(start(
            &cred,
            &agent,
            boxed("c2", &[], &["/dev/nvidia0", raw]),
        ));
        assert!(
            why.starts_with(&format!("n1: gpus lists {raw:?}, which ")),
            "{why}"
        );
        assert!(why.contains("nvidia.com/gpu=0"), "{why}");
    }
    // A held rank in a container could not see its release file.
    let mut held = boxed("c4", &[], &["/dev/nvidia0"]);
    held.held = true;
    let why = refusal(start(&cred, &agent, held));
    assert!(
        why.starts_with("n1: a held rank cannot run in a container"),
        "{why}"
    );
    assert!(!marker.exists(), "the planted docker ran");
    let ran = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !ran.contains(" run "),
        "a refused rank reached docker: {ran}"
    );

    // The control: GPU devices pass, and the agent runs the engine it
    // resolved when it started, for the rank and for its stop hook.
    let docker = docker.to_str().unwrap();
    let started = runs(start(
        &cred,
        &agent,
        boxed(
            "c3",
            &[("NCCL_DEBUG", "INFO")],
            &["/dev/nvidia0", "nvidia.com/gpu=0"],
        ),
    ))
    .remove(0);
    assert_eq!(started.procs[0].argv[0], docker);
    running(&cred, &agent, "c3");
    wait_until("docker run", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains(&format!("{docker} run --rm")))
    });
    stop(&cred, &agent, "c3");
    let ran = std::fs::read_to_string(&log).unwrap();
    assert!(
        ran.contains("--device /dev/nvidia0 --device nvidia.com/gpu=0 --env NCCL_DEBUG"),
        "{ran}"
    );
    assert!(
        ran.contains(&format!("{docker} rm -f xfer-c3-r0-0")),
        "{ran}"
    );
    assert!(!marker.exists(), "the planted docker ran");
}
