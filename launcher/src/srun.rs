//! The srun runner (`[launch] runner = "srun"`): inside a Slurm job, once
//! the preflight passed on every node, `xfer-launch up` starts every rank
//! as one job step, so Slurm owns the processes (their cgroups, signals
//! and teardown) and `--kill-on-bad-exit` takes the step down when a rank
//! dies. The agents still check, sync and verify; they start nothing.
//!
//! The step runs `xfer-launch rank --ranks FILE` once per node: it finds
//! its own rank in the plan's rank file by `SLURMD_NODENAME`, runs the
//! rank's `pre` commands to completion, then becomes the engine (`exec`),
//! so the signals Slurm sends reach it. Each rank's output goes to
//! `rank-NODE.log` beside the run record; the step is named
//! `xfer-launch-RUN`, which is how `down` finds it to `scancel` it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use serde::{Deserialize, Serialize};

use crate::plan::Plan;

/// Every step `up` starts is named this and the run's id.
pub const STEP_PREFIX: &str = "xfer-launch-";

/// One rank as the step's task runs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEntry {
    /// The node's (Slurm host's) name.
    pub node: String,
    /// Its rank, 0 on the head.
    pub rank: usize,
    /// Added to the environment the step inherits.
    pub env: BTreeMap<String, String>,
    /// Run to completion first, in order.
    pub pre: Vec<Vec<String>>,
    /// The engine; empty when the node runs none of its own.
    pub argv: Vec<String>,
}

/// What `xfer-launch rank` reads: every rank of one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankFile {
    /// The run's id.
    pub run: String,
    /// In rank order.
    pub ranks: Vec<RankEntry>,
}

impl RankFile {
    /// The ranks of `plan`, run `run`.
    pub fn of(plan: &Plan, run: &str) -> RankFile {
        RankFile {
            run: run.to_string(),
            ranks: plan
                .ranks
                .iter()
                .map(|r| RankEntry {
                    node: r.node.clone(),
                    rank: r.rank,
                    env: r.env.clone(),
                    pre: r.pre.clone(),
                    argv: r.argv.clone(),
                })
                .collect(),
        }
    }
}

/// Why the step could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum SrunError {
    /// Not inside a Slurm job.
    #[error("runner = \"srun\" starts the ranks as a step of the Slurm job this runs in, but SLURM_JOB_ID is not set; run xfer-launch inside sbatch or salloc, or set runner = \"agents\"")]
    NotInJob,
    /// A file beside the record.
    #[error("{}: {err}; pass --record PATH in a folder every node can read (the rank file goes beside it)", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What the system said.
        err: std::io::Error,
    },
    /// `srun` or `squeue` could not be run.
    #[error("cannot run {what}: {err}; install Slurm's client (slurm-client) on this node")]
    Spawn {
        /// The program.
        what: &'static str,
        /// What the system said.
        err: std::io::Error,
    },
    /// `scancel` refused.
    #[error("scancel {step} failed: {why}")]
    Cancel {
        /// The step.
        step: String,
        /// Its stderr.
        why: String,
    },
}

/// The folder beside `record` (`RUN.json`) that holds the rank file and
/// the ranks' logs: `RUN.srun/`.
pub fn step_dir(record: &Path) -> PathBuf {
    record.with_extension("srun")
}

/// The `srun` command line of `plan`'s step: one task per node, on
/// exactly the plan's nodes, the whole step killed when a rank exits
/// non-zero, each node's output in its own log.
pub fn step_argv(plan: &Plan, run: &str, dir: &Path, exe: &Path) -> Vec<String> {
    let n = plan.ranks.len();
    let nodes: Vec<&str> = plan.ranks.iter().map(|r| r.node.as_str()).collect();
    vec![
        "srun".into(),
        format!("--job-name={STEP_PREFIX}{run}"),
        format!("--nodes={n}"),
        format!("--ntasks={n}"),
        "--ntasks-per-node=1".into(),
        format!("--nodelist={}", nodes.join(",")),
        "--kill-on-bad-exit=1".into(),
        "--export=ALL".into(),
        format!("--output={}/rank-%N.log", dir.display()),
        exe.display().to_string(),
        "rank".into(),
        "--ranks".into(),
        dir.join("ranks.json").display().to_string(),
    ]
}

/// The running step.
pub struct Step {
    child: Child,
    /// Where its rank file and logs are.
    pub dir: PathBuf,
    /// Its name (`xfer-launch-RUN`).
    pub name: String,
}

/// Writes the rank file and starts the step (in its own process group,
/// so that interrupting `up` leaves it to `down`).
pub fn start(plan: &Plan, run: &str, dir: &Path, exe: &Path) -> Result<Step, SrunError> {
    if std::env::var_os("SLURM_JOB_ID").is_none_or(|v| v.is_empty()) {
        return Err(SrunError::NotInJob);
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |err| SrunError::Io { path, err }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let file = dir.join("ranks.json");
    let body = serde_json::to_vec_pretty(&RankFile::of(plan, run)).expect("plain data serializes");
    std::fs::write(&file, body).map_err(io(&file))?;
    let log = dir.join("srun.log");
    let out = std::fs::File::create(&log).map_err(io(&log))?;
    let err = out.try_clone().map_err(io(&log))?;
    let argv = step_argv(plan, run, dir, exe);
    use std::os::unix::process::CommandExt;
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|err| SrunError::Spawn { what: "srun", err })?;
    Ok(Step {
        child,
        dir: dir.to_path_buf(),
        name: format!("{STEP_PREFIX}{run}"),
    })
}

impl Step {
    /// How the step ended, once it has.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Why the step ended: every rank srun says failed, in the order srun
    /// heard of them (which is not always the order they failed: a rank
    /// that dies can take its peers down with it before srun hears of it),
    /// and the last lines of each one's log.
    pub fn failure(&self, status: ExitStatus) -> (String, Option<String>) {
        let srun_log = std::fs::read_to_string(self.dir.join("srun.log")).unwrap_or_default();
        let failed = failed_tasks(&srun_log);
        if failed.is_empty() {
            return (
                format!(
                    "the srun step ended ({status}): {}",
                    last_lines(&srun_log, 5).replace('\n', " | ")
                ),
                None,
            );
        }
        let said: Vec<String> = failed
            .iter()
            .map(|(node, said)| format!("rank on {node}: {said}"))
            .collect();
        let tails: Vec<String> = failed
            .iter()
            .map(|(node, _)| {
                let t = tail(&self.dir.join(format!("rank-{node}.log")), 20);
                format!("[{node}]\n{t}")
            })
            .collect();
        (
            format!("the srun step ended ({status}): {}", said.join("; ")),
            Some(tails.join("\n")),
        )
    }

    /// Cancels the step (a timeout, or `up` interrupted).
    pub fn cancel(&mut self) {
        let _ = cancel_steps(Some(self.name.trim_start_matches(STEP_PREFIX)));
        let _ = self.child.wait();
    }
}

/// Every `srun: error: NODE: task N: WHAT` line, in order: (NODE, WHAT),
/// one per node.
pub fn failed_tasks(srun_log: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for l in srun_log.lines() {
        let Some(rest) = l.strip_prefix("srun: error: ") else {
            continue;
        };
        let Some((node, rest)) = rest.split_once(": ") else {
            continue;
        };
        let Some(said) = rest.strip_prefix("task ").and_then(|r| r.split_once(": ")) else {
            continue;
        };
        if !out.iter().any(|(n, _)| n == node) {
            out.push((node.to_string(), said.1.to_string()));
        }
    }
    out
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The last `n` lines of the file at `path`.
pub fn tail(path: &Path, n: usize) -> String {
    last_lines(&std::fs::read_to_string(path).unwrap_or_default(), n)
}

/// `scancel`s this job's steps `up` started (only run `run`'s when given);
/// returns their ids.
pub fn cancel_steps(run: Option<&str>) -> Result<Vec<String>, SrunError> {
    let job = std::env::var("SLURM_JOB_ID").map_err(|_| SrunError::NotInJob)?;
    let out = Command::new("squeue")
        .args(["-h", "-s", "-j", &job, "-o", "%i %j"])
        .output()
        .map_err(|err| SrunError::Spawn {
            what: "squeue",
            err,
        })?;
    let listing = String::from_utf8_lossy(&out.stdout).to_string();
    let mut cancelled = Vec::new();
    for step in ours(&listing, run) {
        let r = Command::new("scancel")
            .arg(&step)
            .output()
            .map_err(|err| SrunError::Spawn {
                what: "scancel",
                err,
            })?;
        if !r.status.success() {
            return Err(SrunError::Cancel {
                step,
                why: String::from_utf8_lossy(&r.stderr).trim().to_string(),
            });
        }
        cancelled.push(step);
    }
    Ok(cancelled)
}

/// The step ids in `squeue -s -o "%i %j"` output that `up` started.
fn ours(listing: &str, run: Option<&str>) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.trim().split_once(' '))
        .filter(|(_, name)| match run {
            Some(r) => name.strip_prefix(STEP_PREFIX) == Some(r),
            None => name.starts_with(STEP_PREFIX),
        })
        .map(|(id, _)| id.to_string())
        .collect()
}

/// Why `xfer-launch rank` could not become its rank.
#[derive(Debug, thiserror::Error)]
pub enum RankError {
    /// The rank file.
    #[error("cannot read the rank file {}: {why}; `xfer-launch up` writes it (runner = \"srun\")", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// This node has no rank.
    #[error("node {node:?} has no rank in {} (its ranks are on {}); srun --nodelist must name the plan's nodes", path.display(), nodes.join(", "))]
    NoRank {
        /// This node.
        node: String,
        /// The file.
        path: PathBuf,
        /// The nodes it has.
        nodes: Vec<String>,
    },
    /// A `pre` command failed.
    #[error("rank {rank} on {node}: `{cmd}` {why}")]
    Pre {
        /// The rank.
        rank: usize,
        /// This node.
        node: String,
        /// The command.
        cmd: String,
        /// How it failed.
        why: String,
    },
    /// The engine could not be started.
    #[error("rank {rank} on {node}: cannot run `{cmd}`: {err}")]
    Exec {
        /// The rank.
        rank: usize,
        /// This node.
        node: String,
        /// The command.
        cmd: String,
        /// What the system said.
        err: std::io::Error,
    },
}

/// `xfer-launch rank`: becomes this node's rank of the run in `file`
/// (returns only on failure, or never when the rank runs no engine).
pub fn run_rank(file: &Path, node: &str) -> RankError {
    let bad = |why: String| RankError::File {
        path: file.to_path_buf(),
        why,
    };
    let parsed = std::fs::read(file)
        .map_err(|e| bad(e.to_string()))
        .and_then(|b| serde_json::from_slice::<RankFile>(&b).map_err(|e| bad(e.to_string())));
    let ranks = match parsed {
        Ok(r) => r,
        Err(e) => return e,
    };
    let Some(me) = ranks.ranks.iter().find(|r| r.node == node) else {
        return RankError::NoRank {
            node: node.to_string(),
            path: file.to_path_buf(),
            nodes: ranks.ranks.iter().map(|r| r.node.clone()).collect(),
        };
    };
    eprintln!(
        "xfer-launch: rank {} of run {} on {node}",
        me.rank, ranks.run
    );
    for cmd in &me.pre {
        let shown = cmd.join(" ");
        match Command::new(&cmd[0]).args(&cmd[1..]).envs(&me.env).status() {
            Ok(s) if s.success() => {}
            Ok(s) => {
                return RankError::Pre {
                    rank: me.rank,
                    node: node.to_string(),
                    cmd: shown,
                    why: format!("exited with {s}"),
                }
            }
            Err(e) => {
                return RankError::Pre {
                    rank: me.rank,
                    node: node.to_string(),
                    cmd: shown,
                    why: format!("could not start: {e}"),
                }
            }
        }
    }
    if me.argv.is_empty() {
        // Nothing of its own (a Ray worker): the step holds the node until
        // Slurm ends it.
        loop {
            std::thread::park();
        }
    }
    use std::os::unix::process::CommandExt;
    let err = Command::new(&me.argv[0])
        .args(&me.argv[1..])
        .envs(&me.env)
        .exec();
    RankError::Exec {
        rank: me.rank,
        node: node.to_string(),
        cmd: me.argv.join(" "),
        err,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{setup, COMMIT};

    #[test]
    fn the_step_is_one_task_per_plan_node_killed_whole_when_a_rank_fails() {
        let s = setup(&format!(
            "engine = \"vllm\"\nmodel = \"Qwen/Qwen3-8B@{COMMIT}\"\nrunner = \"srun\""
        ));
        let plan = crate::plan::plan(&s);
        let argv = step_argv(
            &plan,
            "r1",
            Path::new("/shared/r1.srun"),
            Path::new("/bin/xl"),
        );
        let nodes: Vec<&str> = plan.ranks.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(argv[0], "srun");
        for want in [
            "--job-name=xfer-launch-r1".to_string(),
            format!("--nodes={}", nodes.len()),
            "--ntasks-per-node=1".to_string(),
            format!("--nodelist={}", nodes.join(",")),
            "--kill-on-bad-exit=1".to_string(),
            "--output=/shared/r1.srun/rank-%N.log".to_string(),
        ] {
            assert!(argv.contains(&want), "{want} in {argv:?}");
        }
        assert_eq!(
            &argv[argv.len() - 4..],
            ["/bin/xl", "rank", "--ranks", "/shared/r1.srun/ranks.json"]
        );
        let file = RankFile::of(&plan, "r1");
        assert_eq!(file.ranks[0].argv, plan.ranks[0].argv);
        assert_eq!(file.ranks[1].env, plan.ranks[1].env);
        assert_eq!(step_dir(Path::new("/s/r1.json")), Path::new("/s/r1.srun"));
    }

    #[test]
    fn the_failed_rank_is_read_from_sruns_own_words() {
        let log = "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\nsrun: error: xsl-n2: task 1: Exited with exit code 3\nsrun: error: xsl-n1: task 0: Killed\n";
        assert_eq!(
            failed_tasks(log),
            [
                ("xsl-n2".to_string(), "Exited with exit code 3".to_string()),
                ("xsl-n1".to_string(), "Killed".to_string())
            ]
        );
        assert!(failed_tasks("srun: error: something else").is_empty());
        let listing = "7.0 xfer-launch-a\n7.1 other\n7.2 xfer-launch-b\n";
        assert_eq!(ours(listing, None), ["7.0", "7.2"]);
        assert_eq!(ours(listing, Some("b")), ["7.2"]);
    }

    #[test]
    fn a_rank_file_without_this_node_is_refused_naming_the_nodes() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("ranks.json");
        let file = RankFile {
            run: "r".into(),
            ranks: vec![RankEntry {
                node: "a".into(),
                rank: 0,
                env: BTreeMap::new(),
                pre: vec![vec!["false".into()]],
                argv: vec!["true".into()],
            }],
        };
        std::fs::write(&f, serde_json::to_vec(&file).unwrap()).unwrap();
        let e = run_rank(&f, "b").to_string();
        assert!(
            e.contains("node \"b\" has no rank") && e.contains("on a"),
            "{e}"
        );
        // A pre command that fails stops the rank before its engine.
        let e = run_rank(&f, "a").to_string();
        assert!(e.contains("rank 0 on a: `false` exited"), "{e}");
        let e = run_rank(&t.path().join("none.json"), "a").to_string();
        assert!(e.contains("cannot read the rank file"), "{e}");
    }
}
