//! A real Slurm cluster for a test (`scripts/slurmlab.sh`): slurmctld on
//! host 0, one slurmd per host 1..=n named `{prefix}-n{i}`, over shaped
//! management and fabric links; jobs are submitted with `sbatch` from host
//! 0 and followed through `scontrol show job`. Removed on drop.
//! (Included by xfer's and the launcher's tests, each using a part.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::wait::wait_until;

/// A lab made by `scripts/slurmlab.sh up`.
pub struct SlurmLab {
    pub prefix: String,
    pub n: u32,
}

/// What `scontrol show job` says of a job.
#[derive(Clone, Debug)]
pub struct JobInfo {
    pub state: String,
    pub restarts: u32,
    pub exit_code: String,
    pub nodes: String,
}

impl SlurmLab {
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/slurmlab.sh")
    }

    /// Hosts 0..=n with Slurm running; panics (saying what to install)
    /// when it cannot start: `scripts/test.sh` installs Slurm.
    pub fn up(prefix: &str, n: u32, mgmt_mbit: u32, fabric_mbit: u32) -> SlurmLab {
        let out = Command::new(Self::script())
            .env("PREFIX", prefix)
            .args([
                "up",
                &n.to_string(),
                &mgmt_mbit.to_string(),
                &fabric_mbit.to_string(),
            ])
            .output()
            .expect("run scripts/slurmlab.sh");
        let lab = SlurmLab {
            prefix: prefix.to_string(),
            n,
        };
        assert!(
            out.status.success(),
            "scripts/slurmlab.sh up failed (Slurm comes from scripts/test.sh: slurmctld slurmd slurm-client munge): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        lab
    }

    /// Host `i`'s Slurm name.
    pub fn name(&self, i: u32) -> String {
        format!("{}-n{i}", self.prefix)
    }

    /// The lab's state and logs.
    pub fn dir(&self) -> PathBuf {
        PathBuf::from(format!("/var/tmp/xfer-slurmlab-{}", self.prefix))
    }

    /// `CMD ARGS` on host `i`, as a shell there would run it.
    pub fn cmd(&self, i: u32, program: &str) -> Command {
        let mut c = Command::new(Self::script());
        c.env("PREFIX", &self.prefix)
            .args(["exec", &i.to_string(), program]);
        c
    }

    /// Runs a Slurm client command on host 0 (the login host).
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.cmd(0, args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .output()
            .expect("run a Slurm command")
    }

    /// `sbatch --parsable ARGS SCRIPT`: the job's id.
    pub fn sbatch(&self, script: &Path, args: &[&str]) -> String {
        let mut a = vec!["sbatch", "--parsable"];
        a.extend_from_slice(args);
        let s = script.to_str().unwrap();
        a.push(s);
        let out = self.ctl(&a);
        assert!(
            out.status.success(),
            "sbatch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap()
            .to_string()
    }

    /// Host `i`'s local disk (its `$DIR/local`), as this process sees it.
    pub fn disk(&self, i: u32) -> PathBuf {
        self.dir().join("disks").join(self.name(i))
    }

    /// `scontrol requeue ID`, then lets it start at once (Slurm holds a
    /// requeued batch job back two minutes by default).
    pub fn requeue(&self, id: &str) {
        for args in [
            vec!["scontrol", "requeue", id],
            vec![
                "scontrol",
                "update",
                &format!("JobId={id}"),
                "StartTime=now",
            ],
        ] {
            let r = self.ctl(&args.iter().map(|a| a.as_ref()).collect::<Vec<&str>>());
            assert!(
                r.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&r.stderr)
            );
        }
    }

    /// The job as `scontrol show job -o` describes it.
    pub fn job(&self, id: &str) -> JobInfo {
        let out = self.ctl(&["scontrol", "show", "job", "-o", id]);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let field = |k: &str| {
            text.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .unwrap_or("")
                .to_string()
        };
        JobInfo {
            state: field("JobState"),
            restarts: field("Restarts").parse().unwrap_or(0),
            exit_code: field("ExitCode"),
            nodes: field("NodeList"),
        }
    }

    /// Waits until job `id` has left the queue for good (COMPLETED,
    /// FAILED, CANCELLED, TIMEOUT, NODE_FAIL...) after `restarts` restarts.
    pub fn wait_done(&self, id: &str, restarts: u32, within: Duration) -> JobInfo {
        const ENDED: &[&str] = &[
            "COMPLETED",
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "BOOT_FAIL",
            "DEADLINE",
        ];
        wait_until(&format!("Slurm job {id} to end"), within, || {
            let j = self.job(id);
            (ENDED.contains(&j.state.as_str()) && j.restarts >= restarts).then_some(j)
        })
    }

    /// Waits until every node is idle: after a cancel, Slurm keeps a node
    /// COMPLETING until the job's processes on it are gone.
    pub fn wait_idle(&self, within: Duration) {
        wait_until("every Slurm node idle", within, || {
            let out = self.ctl(&["sinfo", "-h", "-N", "-o", "%N %t"]);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let idle = text.lines().filter(|l| l.ends_with(" idle")).count();
            (idle as u32 == self.n)
                .then_some(())
                .ok_or(super::wait::Text(text))
        })
    }

    /// Waits until job `id` is RUNNING.
    pub fn wait_running(&self, id: &str, within: Duration) -> JobInfo {
        wait_until(&format!("Slurm job {id} to run"), within, || {
            let j = self.job(id);
            (j.state == "RUNNING").then_some(j)
        })
    }

    /// The tail of the controller's and every slurmd's log.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir().join("log"))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            s.push_str(&format!(
                "--- {}:\n{}\n",
                f.display(),
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        s
    }
}

impl Drop for SlurmLab {
    fn drop(&mut self) {
        let out = Command::new(Self::script())
            .env("PREFIX", &self.prefix)
            .arg("down")
            .output();
        if let Ok(o) = out {
            if !o.status.success() {
                eprintln!(
                    "slurmlab down ({}): {}",
                    self.prefix,
                    String::from_utf8_lossy(&o.stderr)
                );
            }
        }
    }
}
