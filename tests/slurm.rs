//! xfer inside real Slurm jobs (issue 56), on a lab of `scripts/slurmlab.sh`:
//! slurmctld on host 0, one slurmd per node host, each with its own host
//! name, Slurm's NodeAddr on the fabric. Long-lived agents run on every
//! node as systemd would start them; the one cluster file describes every
//! job's nodes through its `[slurm]` table (`{host}` templates, no
//! `[[node]]`), and the batch script runs `xfer push MODEL --cluster FILE`
//! with no node list: the job's allocation is the node list.
//!
//! What is asserted: each allocated node's tree is byte-identical to the
//! source, the push's summary names exactly the allocated nodes, a job
//! requeued onto the same nodes moves 0 bytes, a node whose agent is down
//! fails the job naming that node, and a job cancelled mid-push leaves the
//! nodes' partial copies, which the next job completes without sending
//! again what had landed. Jobs are followed through `scontrol show job`,
//! never by sleeping. Needs root and Slurm (`scripts/test.sh` installs it).

use crate::common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::netns::HostAgent;
use common::slurm::SlurmLab;
use common::*;

/// A lab with an agent on every node host and one shared cluster file.
struct Site {
    lab: SlurmLab,
    t: tempfile::TempDir,
    agents: Vec<Option<HostAgent>>,
}

impl Site {
    fn up(prefix: &str, nodes: u32) -> Site {
        Self::up_at(prefix, nodes, 400)
    }

    /// With the fabric at `fabric_mbit`.
    fn up_at(prefix: &str, nodes: u32, fabric_mbit: u32) -> Site {
        let lab = SlurmLab::up(prefix, nodes, 100, fabric_mbit);
        let t = tempdir(&format!("slurm-{prefix}"));
        let key = t.path().join("cluster.key");
        keygen(&key);
        // The shared cluster file: no [[node]], every job's hosts from the
        // template; the root is on each node's own local disk.
        fs::write(
            t.path().join("cluster.toml"),
            format!(
                "key = \"cluster.key\"\n\n[slurm]\nagent = \"{{host}}:7470\"\nroot = \"{}/local/xfer\"\nfabric_if = \"eth1\"\nfabric_ip = \"{{host}}-fab\"\n",
                lab.dir().display()
            ),
        )
        .unwrap();
        let mut s = Site {
            lab,
            t,
            agents: Vec::new(),
        };
        s.agents.push(None);
        for i in 1..=nodes {
            let a = s.start_agent(i);
            s.agents.push(Some(a));
        }
        s
    }

    /// Host `i`'s root as this process sees it (its local disk).
    fn root(&self, i: u32) -> PathBuf {
        self.lab.disk(i).join("xfer")
    }

    /// `xfer serve` on host `i`, as its systemd unit would run it.
    fn start_agent(&self, i: u32) -> HostAgent {
        fs::create_dir_all(self.root(i)).unwrap();
        let log = self.t.path().join(format!("agent-{i}.log"));
        let mut child = self
            .lab
            .cmd(i, bin())
            .args(["serve", "--listen", "0.0.0.0:7470", "--root"])
            .arg(self.lab.dir().join("local/xfer"))
            .arg("--key")
            .arg(self.t.path().join("cluster.key"))
            .env("XDG_CACHE_HOME", self.t.path().join(format!("xdg-{i}")))
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("start an agent on a Slurm node");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.starts_with("xfer agent listening on"),
            "agent on {}: {line:?}; its log: {}",
            self.lab.name(i),
            fs::read_to_string(&log).unwrap_or_default()
        );
        HostAgent(child)
    }

    /// A batch script that pushes `src` to the job's nodes and keeps each
    /// run's summary as `push-JOBID-RESTART.json`.
    fn push_script(&self, src: &Path) -> PathBuf {
        self.push_script_with(src, "")
    }

    /// [`Site::push_script`] with more arguments for `xfer push`.
    fn push_script_with(&self, src: &Path, extra: &str) -> PathBuf {
        let script = self.t.path().join("push.sbatch");
        fs::write(
            &script,
            format!(
                "#!/bin/bash\nset -euo pipefail\nout={dir}/push-$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}.json\nXDG_CACHE_HOME={dir}/xdg-batch exec {xfer} push {src} --cluster {dir}/cluster.toml --json {extra} > \"$out\"\n",
                dir = self.t.path().display(),
                xfer = bin(),
                src = src.display(),
            ),
        )
        .unwrap();
        script
    }

    fn summary(&self, job: &str, restart: u32) -> PushJson {
        let path = self.t.path().join(format!("push-{job}-{restart}.json"));
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), self.lab.logs()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn out(&self, job: &str) -> String {
        fs::read_to_string(self.t.path().join(format!("job-{job}.out"))).unwrap_or_default()
    }
}

const JOB_TIME: Duration = Duration::from_secs(180);

/// The one command in place of `sbcast`: inside a 3-node job, `xfer push
/// --cluster FILE` with no node list reaches every allocated node's disk,
/// byte for byte; the same job requeued finds the model in place and
/// sends nothing.
#[test]
fn a_slurm_job_places_a_model_on_every_allocated_node_and_a_requeue_moves_nothing() {
    let s = Site::up("xsa", 3);
    let src = s.t.path().join("src/tiny-llama");
    gen_model(&src, 12 * MIB, 56);
    let script = s.push_script(&src);
    let out = format!("{}/job-%j.out", s.t.path().display());
    let id = s.lab.sbatch(
        &script,
        &["--nodes=3", "--output", &out, "--open-mode=append"],
    );
    let j = s.lab.wait_done(&id, 0, JOB_TIME);
    assert_eq!(
        j.state,
        "COMPLETED",
        "{j:?}\njob output: {}\n{}",
        s.out(&id),
        s.lab.logs()
    );
    let first = s.summary(&id, 0);
    let mut names: Vec<String> = first.nodes.iter().map(|n| n.addr.clone()).collect();
    names.sort();
    assert_eq!(
        names,
        (1..=3)
            .map(|i| format!("{}:7470", s.lab.name(i)))
            .collect::<Vec<_>>(),
        "the push went to exactly the job's hosts: {first:#?}"
    );
    for i in 1..=3 {
        assert_same_tree(&src, &s.root(i).join("tiny-llama"));
    }
    assert!(first.bytes_sent >= tree_bytes(&src), "{first:#?}");

    // The job requeued (as Slurm does after a node failure or preemption)
    // runs on the same nodes and finds every copy in place.
    s.lab.requeue(&id);
    let j = s.lab.wait_done(&id, 1, JOB_TIME);
    assert_eq!(j.state, "COMPLETED", "{j:?}\n{}", s.out(&id));
    let again = s.summary(&id, 1);
    assert_eq!(again.bytes_sent, 0, "{again:#?}");
    assert!(again.nodes.iter().all(|n| n.ok), "{again:#?}");
}

/// A node of the allocation whose agent is down fails the job, and the
/// job's output names that node (its Slurm name and agent address); the
/// other nodes still receive the model.
#[test]
fn a_node_whose_agent_is_down_fails_the_job_naming_it() {
    let mut s = Site::up("xsb", 2);
    let src = s.t.path().join("src/m");
    gen_model(&src, 2 * MIB, 57);
    s.agents[2].take().unwrap().kill9();
    let script = s.push_script(&src);
    let out = format!("{}/job-%j.out", s.t.path().display());
    let id = s.lab.sbatch(&script, &["--nodes=2", "--output", &out]);
    let j = s.lab.wait_done(&id, 0, JOB_TIME);
    assert_eq!(j.state, "FAILED", "{j:?}\n{}", s.out(&id));
    let text = s.out(&id);
    let dead = format!("{}:7470", s.lab.name(2));
    assert!(text.contains("error:") && text.contains(&dead), "{text}");
    let summary = s.summary(&id, 0);
    assert!(!summary.node(&dead).ok, "{summary:#?}");
    assert!(summary.node(&format!("{}:7470", s.lab.name(1))).ok);
    assert_same_tree(&src, &s.root(1).join("m"));
}

/// `scancel` while the push runs: the job ends CANCELLED, the node keeps
/// what had landed (and no model under its final name), and the next job
/// completes the copy without sending it again. The push goes to node 2
/// only (`--nodes`), so that no agent of the job holds the whole model and
/// could finish the copy on its own after the cancel (which the agents
/// do: a push's receivers fetch from each other).
#[test]
fn a_job_cancelled_mid_push_leaves_copies_the_next_job_completes() {
    let s = Site::up_at("xsc", 2, 60);
    let src = s.t.path().join("src/big");
    gen_model(&src, 48 * MIB, 58);
    let total = tree_bytes(&src);
    let manifest = scan(&src, MIB);
    let script = s.push_script_with(
        &src,
        &format!("--nodes {} --chunk-size 1MiB", s.lab.name(2)),
    );
    let out = format!("{}/job-%j.out", s.t.path().display());
    let id = s.lab.sbatch(&script, &["--nodes=2", "--output", &out]);
    s.lab.wait_running(&id, JOB_TIME);
    // Cancel once node 2's journal holds a quarter of the model.
    let journal = s.root(2).join(".xfer/staging/big/journal");
    let held = || journal_held_bytes(&journal, &manifest);
    wait_until("a quarter of the model held on node 2", JOB_TIME, || {
        held() >= total / 4
    });
    let r = s.lab.ctl(&["scancel", &id]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let j = s.lab.wait_done(&id, 0, JOB_TIME);
    assert_eq!(j.state, "CANCELLED", "{j:?}\n{}", s.out(&id));
    s.lab.wait_idle(JOB_TIME);
    // Every file under its final name is whole and right; some are not
    // there yet.
    let placed = s.root(2).join("big");
    let mut missing = 0;
    for rel in listing(&src).iter().filter(|r| src.join(r).is_file()) {
        match fs::read(placed.join(rel)) {
            Ok(bytes) => assert!(
                bytes == fs::read(src.join(rel)).unwrap(),
                "{rel} placed wrong"
            ),
            Err(_) => missing += 1,
        }
    }
    assert!(
        missing > 0,
        "node 2: the model is whole although the push was cancelled at {} of {total} bytes: cancel earlier\n{}",
        held(),
        s.out(&id)
    );
    let kept = held();
    assert!(kept >= total / 4, "node 2 kept what had landed: {kept}");

    let id2 = s.lab.sbatch(&script, &["--nodes=2", "--output", &out]);
    let j = s.lab.wait_done(&id2, 0, JOB_TIME);
    assert_eq!(j.state, "COMPLETED", "{j:?}\n{}", s.out(&id2));
    let second = s.summary(&id2, 0);
    assert_same_tree(&src, &s.root(2).join("big"));
    assert!(
        second.bytes_skipped >= kept && second.bytes_sent + second.bytes_skipped == total,
        "the second job sent {} and skipped {} of {total} bytes, but node 2 held {kept}",
        second.bytes_sent,
        second.bytes_skipped
    );
}

/// Job-scoped agents with job-scoped credentials: the batch script makes a
/// CA in the job's shared folder, one node credential per host of the
/// allocation and an operator's, and deletes the CA key at once (nothing
/// more is issued); it starts one agent per node as a step of the job
/// (`srun --ntasks-per-node=1 --overlap xfer serve`, each with its own
/// host's credential, a root on each node's local disk), pushes with the
/// operator's, then ends the step and removes every credential. Every node
/// holds the model, no credential is left, and no agent outlives the job.
#[test]
fn job_scoped_agents_serve_the_job_and_end_with_it() {
    let s = Site::up("xsd", 2);
    let src = s.t.path().join("src/jm");
    gen_model(&src, 6 * MIB, 59);
    let shared = s.t.path().join("jobs");
    fs::create_dir_all(&shared).unwrap();
    let local = s.lab.dir().join("local");
    let script = s.t.path().join("scoped.sbatch");
    fs::write(
        &script,
        format!(
            r#"#!/bin/bash
set -euo pipefail
dir={shared}/$SLURM_JOB_ID
root={local}/job-$SLURM_JOB_ID
mkdir -p "$dir"
chmod 700 "$dir"
{xfer} ca init --dir "$dir/ca" >/dev/null
for h in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
  {xfer} ca issue "$h" --role node --days 1 --dir "$dir/ca" --out "$dir/node-$h.pem" >/dev/null
done
{xfer} ca issue operator --role operator --days 1 --dir "$dir/ca" --out "$dir/operator.pem" >/dev/null
rm -f "$dir/ca/ca.key"
printf 'key = "operator.pem"\n[slurm]\nagent = "{{host}}:7471"\nroot = "%s"\n' "$root" > "$dir/cluster.toml"
srun --ntasks-per-node=1 mkdir -p "$root"
srun --ntasks-per-node=1 --overlap sh -c 'exec {xfer} serve --listen 0.0.0.0:7471 --root "$1" --key "$0/node-$SLURMD_NODENAME.pem" --cluster "$0/cluster.toml"' "$dir" "$root" > "$dir/agents.log" 2>&1 &
agents=$!
for _ in $(seq 300); do {xfer} status --cluster "$dir/cluster.toml" >/dev/null 2>&1 && break; sleep 0.1; done
XDG_CACHE_HOME="$dir/xdg" {xfer} push {src} --cluster "$dir/cluster.toml" --json > "$dir/push.json"
kill "$agents"; wait "$agents" || true
rm -rf "$dir/ca" "$dir"/*.pem
"#,
            shared = shared.display(),
            local = local.display(),
            xfer = bin(),
            src = src.display(),
        ),
    )
    .unwrap();
    let out = format!("{}/job-%j.out", s.t.path().display());
    let id = s.lab.sbatch(&script, &["--nodes=2", "--output", &out]);
    let j = s.lab.wait_done(&id, 0, JOB_TIME);
    assert_eq!(j.state, "COMPLETED", "{j:?}\n{}", s.out(&id));
    let dir = shared.join(&id);
    let summary: PushJson =
        serde_json::from_str(&fs::read_to_string(dir.join("push.json")).unwrap()).unwrap();
    assert_eq!(summary.nodes.len(), 2, "{summary:#?}");
    for i in 1..=2 {
        assert_same_tree(&src, &s.lab.disk(i).join(format!("job-{id}/jm")));
    }
    let left: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".pem") || n == "ca")
        .collect();
    assert!(
        left.is_empty(),
        "the job's credentials are removed: {left:?}"
    );
    let log = fs::read_to_string(dir.join("agents.log")).unwrap_or_default();
    assert!(
        !log.contains("simple mode"),
        "the agents ran on their own node credentials: {log}"
    );
    // No agent of the job is left on any node once Slurm has cleaned up.
    s.lab.wait_idle(JOB_TIME);
    for i in 1..=2 {
        let out = std::process::Command::new("ip")
            .args(["netns", "pids", &format!("{}-h{i}", s.lab.prefix)])
            .output()
            .unwrap();
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            assert!(
                !cmdline.contains(":7471"),
                "a job agent outlived its job: {pid} {cmdline}"
            );
        }
    }
}
