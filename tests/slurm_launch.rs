//! `[launch] runner = "srun"` inside real Slurm jobs (issue 56), on a lab
//! of `scripts/slurmlab.sh`: the batch script pushes a model to the job's
//! nodes (`xfer push --cluster FILE`, the nodes from the `[slurm]`
//! template), then `xfer-launch up` checks every node through its agent
//! and starts the ranks as one `srun` step; the engine is the stand-in of
//! `tests/standin` (vLLM's command line, a real rendezvous over the
//! fabric, an OpenAI API on the head).
//!
//! Asserted: `up` answers a completion, `down` cancels the step and no
//! engine process is left on any node; a rank that dies takes the step
//! down and `up` fails naming that node and showing its log's last lines;
//! a node of the allocation whose agent is down is named by the preflight
//! and no step starts.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::launchlab::{launch_bin, repo, unavailable, xfer_bin};
use crate::slurm_lab::SlurmLab;

const JOB_TIME: Duration = Duration::from_secs(240);

struct Site {
    lab: SlurmLab,
    t: tempfile::TempDir,
    agents: Vec<std::process::Child>,
}

impl Drop for Site {
    fn drop(&mut self) {
        for a in &mut self.agents {
            let _ = a.kill();
            let _ = a.wait();
        }
    }
}

impl Site {
    /// A 2-node lab with agents that may check launches (the stand-in
    /// engine first on their PATH, as the ranks' will be).
    fn up(prefix: &str) -> Site {
        let lab = SlurmLab::up(prefix, 2, 100, 400);
        let t = tempfile::Builder::new()
            .prefix("xfer-slurm-launch")
            .tempdir_in("/var/tmp")
            .unwrap();
        let key = t.path().join("cluster.key");
        let out = Command::new(xfer_bin())
            .args(["keygen", "--out"])
            .arg(&key)
            .output()
            .unwrap();
        assert!(out.status.success());
        let mut agents = Vec::new();
        for i in 1..=2 {
            fs::create_dir_all(lab.disk(i).join("xfer")).unwrap();
            let log = fs::File::create(t.path().join(format!("agent-{i}.log"))).unwrap();
            let mut child = lab
                .cmd(i, xfer_bin().to_str().unwrap())
                .args([
                    "serve",
                    "--listen",
                    "0.0.0.0:7470",
                    "--allow-launch",
                    "--verify-every",
                    "0",
                ])
                .arg("--root")
                .arg(lab.dir().join("local/xfer"))
                .arg("--key")
                .arg(&key)
                .env("PATH", standin_path())
                .env("PYTHONPATH", repo().join("tests/standin/pylib"))
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(child.stdout.take().unwrap()),
                &mut line,
            )
            .unwrap();
            assert!(line.starts_with("xfer agent listening on"), "{line:?}");
            agents.push(child);
        }
        Site { lab, t, agents }
    }

    /// The cluster file: `[slurm]` nodes, and `[launch]` with `env`.
    fn cluster(&self, env: &str) -> PathBuf {
        let local = self.lab.dir().join("local/xfer");
        let file = self.t.path().join("cluster.toml");
        fs::write(
            &file,
            format!(
                "key = \"cluster.key\"\n\n[slurm]\nagent = \"{{host}}:7470\"\nroot = \"{}\"\nfabric_if = \"eth1\"\nfabric_ip = \"{{host}}-fab\"\n\n[launch]\nengine = \"vllm\"\nmodel = \"{}/tiny\"\nrunner = \"srun\"\n\n[launch.env]\n{env}\n",
                local.display(),
                local.display()
            ),
        )
        .unwrap();
        file
    }

    /// A small model folder.
    fn model(&self) -> PathBuf {
        let m = self.t.path().join("src/tiny");
        fs::create_dir_all(&m).unwrap();
        fs::write(m.join("config.json"), "{\"model_type\": \"standin\"}\n").unwrap();
        fs::write(m.join("model.safetensors"), vec![7u8; 2 << 20]).unwrap();
        m
    }

    /// The batch script: push (when `src` is given), up, then `after`
    /// (shell lines).
    fn script(&self, file: &Path, src: Option<&Path>, after: &str) -> PathBuf {
        let d = self.t.path();
        let script = d.join("launch.sbatch");
        fs::write(
            &script,
            format!(
                "#!/bin/bash\nset -uo pipefail\nexport PATH={path} PYTHONPATH={py} XDG_STATE_HOME={d}/state XDG_CACHE_HOME={d}/cache\n{push}{xl} up --cluster {file} --json --timeout 120 > {d}/up.json 2> {d}/up.err\necho \"up exit $?\" > {d}/up.code\n{after}\n",
                path = standin_path(),
                py = repo().join("tests/standin/pylib").display(),
                d = d.display(),
                push = src
                    .map(|src| format!(
                        "{} push {} --cluster {} --json > {}/push.json || exit 3\n",
                        xfer_bin().display(),
                        src.display(),
                        file.display(),
                        d.display()
                    ))
                    .unwrap_or_default(),
                xl = launch_bin(),
                file = file.display(),
            ),
        )
        .unwrap();
        script
    }

    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.t.path().join(name)).unwrap_or_default()
    }

    fn job_out(&self, id: &str) -> String {
        self.read(&format!("job-{id}.out"))
    }

    /// Engine processes (the stand-in) left in host `i`'s namespace.
    fn engines_on(&self, i: u32) -> Vec<String> {
        let out = Command::new("ip")
            .args(["netns", "pids", &format!("{}-h{i}", self.lab.prefix)])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|pid| {
                let c = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let c = String::from_utf8_lossy(&c).replace('\0', " ");
                (c.contains("engine.py") || c.contains("xfer-launch rank"))
                    .then(|| format!("{pid} {c}"))
            })
            .collect()
    }
}

/// The stand-in's bin folder first on PATH.
fn standin_path() -> String {
    format!(
        "{}:{}",
        repo().join("tests/standin/bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn srun_runner_starts_the_engine_as_one_slurm_step_and_down_cancels_it() {
    need_root!();
    let s = Site::up("xsr");
    let file = s.cluster("");
    let src = s.model();
    let script = s.script(
        &file,
        Some(&src),
        &format!(
            "{xl} down --cluster {file} > {d}/down.txt 2>&1",
            xl = launch_bin(),
            file = file.display(),
            d = s.t.path().display()
        ),
    );
    let out = format!("{}/job-%j.out", s.t.path().display());
    let id = s.lab.sbatch(&script, &["--nodes=2", "--output", &out]);
    let j = s.lab.wait_done(&id, 0, JOB_TIME);
    let said = format!(
        "{j:?}\njob: {}\nup: {}{}\ndown: {}",
        s.job_out(&id),
        s.read("up.json"),
        s.read("up.err"),
        s.read("down.txt")
    );
    assert_eq!(j.state, "COMPLETED", "{said}");
    assert_eq!(s.read("up.code").trim(), "up exit 0", "{said}");
    let up: serde_json::Value = serde_json::from_str(s.read("up.json").trim()).expect(&said);
    assert_eq!(up["ready"], true, "{said}");
    assert!(
        up["readiness"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
        "{said}"
    );
    assert!(
        s.read("up.err").contains("as Slurm step xfer-launch-"),
        "{said}"
    );
    assert!(
        s.read("down.txt")
            .contains(&format!("cancelled Slurm step(s) {id}.")),
        "{said}"
    );
    s.lab.wait_idle(JOB_TIME);
    for i in 1..=2 {
        assert_eq!(s.engines_on(i), Vec::<String>::new(), "node {i}: {said}");
    }
}

#[test]
fn srun_runner_a_rank_that_dies_fails_up_naming_its_node() {
    need_root!();
    let s = Site::up("xsf");
    // Rank 1 dies as soon as it joined; the head would take 60 s to load.
    let file = s.cluster(
        "STANDIN_CRASH_RANK = \"1\"\nSTANDIN_CRASH_AFTER = \"0\"\nSTANDIN_LOAD_SECS = \"60\"",
    );
    let src = s.model();
    let script = s.script(&file, Some(&src), "");
    let out = format!("{}/job-%j.out", s.t.path().display());
    let id = s.lab.sbatch(&script, &["--nodes=2", "--output", &out]);
    let j = s.lab.wait_done(&id, 0, JOB_TIME);
    let err = s.read("up.err");
    let said = format!(
        "{j:?}\njob: {}\nup: {}{err}",
        s.job_out(&id),
        s.read("up.json")
    );
    assert_eq!(s.read("up.code").trim(), "up exit 1", "{said}");
    let dead = s.lab.name(2);
    assert!(
        err.contains(&format!("rank on {dead}: Exited with exit code")),
        "{said}"
    );
    assert!(
        err.contains("RuntimeError: NCCL error"),
        "its log's last lines: {said}"
    );
    s.lab.wait_idle(JOB_TIME);
    for i in 1..=2 {
        assert_eq!(s.engines_on(i), Vec::<String>::new(), "node {i}: {said}");
    }
}

#[test]
fn srun_runner_a_node_whose_agent_is_down_is_named_and_no_step_starts() {
    need_root!();
    let mut s = Site::up("xsg");
    let mut dead = s.agents.pop().unwrap();
    dead.kill().unwrap();
    dead.wait().unwrap();
    let file = s.cluster("");
    let script = s.script(&file, None, "");
    let out = format!("{}/job-%j.out", s.t.path().display());
    let id = s.lab.sbatch(&script, &["--nodes=2", "--output", &out]);
    let j = s.lab.wait_done(&id, 0, JOB_TIME);
    let err = s.read("up.err");
    let said = format!(
        "{j:?}\njob: {}\nup: {}{err}",
        s.job_out(&id),
        s.read("up.json")
    );
    assert_eq!(s.read("up.code").trim(), "up exit 1", "{said}");
    let down = format!("{}:7470", s.lab.name(2));
    assert!(err.contains(&down), "the preflight names {down}: {said}");
    assert!(!err.contains("Slurm step"), "a step started: {said}");
    let state = s.t.path().join("state");
    let steps: Vec<_> = walk(&state)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "srun"))
        .collect();
    assert!(steps.is_empty(), "a step's folder was made: {steps:?}");
    for i in 1..=2 {
        assert_eq!(s.engines_on(i), Vec::<String>::new(), "node {i}: {said}");
    }
}

/// Every path under `top`.
fn walk(top: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut dirs = vec![top.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
            all.push(e.path());
        }
    }
    all
}
