//! A test cluster: agents on loopback addresses named by a cluster file,
//! driven with `xfer sync`, `xfer status` and friends (tests/sync.rs,
//! tests/torture_node.rs).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use xfer::agent::sync::status::{JobView, ModelState, ModelStatus};
use xfer_proto::admin::JobState;

use super::*;

/// How long a job may take before a test gives up.
pub const JOB_DEADLINE: Duration = Duration::from_secs(60);

/// One element of `xfer status --json`, read through the product's type.
pub use xfer::client::status::NodeReport as Report;

/// `xfer status --json`, parsed.
#[derive(Debug, Clone)]
pub struct Status(pub Vec<Report>);

impl Status {
    pub fn report(&self, node: &str) -> &Report {
        self.0
            .iter()
            .find(|r| r.node == node)
            .unwrap_or_else(|| panic!("no report of {node}: {self:#?}"))
    }

    /// Model `name` as `node` reports it.
    pub fn model(&self, node: &str, name: &str) -> Option<&ModelStatus> {
        self.report(node)
            .status
            .as_ref()?
            .models
            .iter()
            .find(|m| m.name == name)
    }

    /// Job `id` as `node` knows it.
    pub fn job(&self, node: &str, id: &str) -> Option<&JobView> {
        self.report(node)
            .status
            .as_ref()?
            .jobs
            .iter()
            .find(|j| j.id == id)
    }

    /// The root every one of `nodes` holds `name` complete with, if they all
    /// do and agree.
    pub fn complete_root(&self, nodes: &[&str], name: &str) -> Option<String> {
        let roots: Vec<Option<String>> = nodes
            .iter()
            .map(|n| {
                self.model(n, name)
                    .filter(|m| m.state == ModelState::Complete)
                    .and_then(|m| m.root.map(|r| r.to_hex()))
            })
            .collect();
        let first = roots.first()?.clone()?;
        roots
            .iter()
            .all(|r| r.as_deref() == Some(first.as_str()))
            .then_some(first)
    }
}

/// Writes a cluster file naming `key` and `nodes` (name, agent address, root).
pub fn write_cluster_file(file: &Path, key: &Path, nodes: &[(&str, &str, &Path)]) {
    let mut toml = format!("key = \"{}\"\n", key.display());
    for (name, agent, root) in nodes {
        toml.push_str(&format!(
            "\n[[node]]\nname = \"{name}\"\nagent = \"{agent}\"\nroot = \"{}\"\n",
            root.display()
        ));
    }
    fs::write(file, toml).unwrap();
}

/// `xfer status --cluster FILE --json`, parsed. It exits 1 when a node
/// is unreachable or a job failed (saying so on stderr), else 0; either
/// way stdout is the one JSON document.
pub fn status(file: &Path) -> Status {
    let mut cmd = xfer();
    cmd.arg("status").arg("--cluster").arg(file).arg("--json");
    let r = run(&mut cmd, Duration::from_secs(20));
    let code = r.status.code();
    assert!(
        code == Some(0) || (code == Some(1) && r.stderr.contains("problem")),
        "xfer status failed: {r:#?}"
    );
    Status(r.json())
}

/// A node of a test cluster.
pub struct Member {
    pub name: String,
    pub root: PathBuf,
    /// `IP:PORT` its agent listens on (fixed at the first start, so a
    /// restarted agent is where the cluster file says).
    pub addr: String,
    pub agent: Option<Agent>,
}

/// Agents on 127.0.`net`.1, .2, ... and the cluster file naming them.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub key: PathBuf,
    pub file: PathBuf,
    pub members: Vec<Member>,
    /// `xfer serve` options of every agent.
    pub extra: Vec<String>,
    /// Environment of every agent.
    pub env: Vec<(String, String)>,
}

impl Cluster {
    pub fn start(tag: &str, net: u8, names: &[&str], extra: &[&str]) -> Cluster {
        Self::start_env(tag, net, names, extra, Vec::new())
    }

    pub fn start_env(
        tag: &str,
        net: u8,
        names: &[&str],
        extra: &[&str],
        env: Vec<(String, String)>,
    ) -> Cluster {
        let dir = tempdir(tag);
        let key = dir.path().join("cluster.key");
        keygen(&key);
        let mut c = Cluster {
            key,
            file: dir.path().join("cluster.toml"),
            members: Vec::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env,
            dir,
        };
        for (i, name) in names.iter().enumerate() {
            let root = c.dir.path().join("nodes").join(name).join("root");
            fs::create_dir_all(&root).unwrap();
            let listen = format!("127.0.{net}.{}:0", i + 1);
            let agent = c.spawn(name, &listen, &root);
            c.members.push(Member {
                name: name.to_string(),
                root,
                addr: agent.addr.clone(),
                agent: Some(agent),
            });
        }
        let nodes: Vec<(&str, &str, &Path)> = c
            .members
            .iter()
            .map(|m| (m.name.as_str(), m.addr.as_str(), m.root.as_path()))
            .collect();
        write_cluster_file(&c.file, &c.key, &nodes);
        c
    }

    pub fn spawn(&self, name: &str, listen: &str, root: &Path) -> Agent {
        // Sync sources live in the test's folder, outside every root.
        let export = self.dir.path().to_str().expect("a UTF-8 temp path");
        let mut extra: Vec<&str> = vec!["--export", export];
        extra.extend(self.extra.iter().map(String::as_str));
        // The source's hash cache stays in the node's folder.
        let xdg = self.dir.path().join("nodes").join(name).join("xdg-cache");
        Agent::start_cmd(listen, root, &self.key, &extra, |c| {
            c.env("XDG_CACHE_HOME", &xdg);
            for (k, v) in &self.env {
                c.env(k, v);
            }
        })
    }

    pub fn member(&self, name: &str) -> &Member {
        self.members
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    pub fn member_mut(&mut self, name: &str) -> &mut Member {
        self.members
            .iter_mut()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    pub fn root(&self, name: &str) -> &Path {
        &self.member(name).root
    }

    /// `kill -9` a node's agent.
    pub fn kill9(&mut self, name: &str) {
        let m = self.member_mut(name);
        let mut a = m.agent.take().unwrap_or_else(|| panic!("{name} is down"));
        a.kill9();
    }

    /// Starts a node's agent again: the same address, root and key.
    pub fn restart(&mut self, name: &str) {
        let (addr, root) = {
            let m = self.member(name);
            assert!(m.agent.is_none(), "{name} is running");
            (m.addr.clone(), m.root.clone())
        };
        let a = self.spawn(name, &addr, &root);
        assert_eq!(a.addr, addr);
        self.member_mut(name).agent = Some(a);
    }

    /// The agents' logs, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for m in &self.members {
            let log = m.agent.as_ref().map(|a| a.log()).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            s.push_str(&format!(
                "--- {} ({}):\n{}\n",
                m.name,
                m.addr,
                tail.join("\n")
            ));
        }
        s
    }

    /// `xfer SUB --cluster FILE ARGS...`.
    pub fn cmd(&self, sub: &str, args: &[&str]) -> Command {
        let mut c = xfer();
        c.arg(sub).arg("--cluster").arg(&self.file).args(args);
        c
    }

    /// `xfer sync SOURCE --json ARGS...`; returns the job id.
    pub fn sync(&self, source: &Path, args: &[&str]) -> (String, Run) {
        let r = run(
            self.cmd("sync", &["--json"]).arg(source).args(args),
            Duration::from_secs(30),
        );
        r.assert_ok("xfer sync");
        let v: serde_json::Value = r.json();
        let id = v["job"].as_str().expect("job id").to_string();
        (id, r)
    }

    /// `xfer status --json`.
    pub fn status(&self) -> Status {
        status(&self.file)
    }

    /// Polls `status` until `f` returns something (see [`wait_until`]);
    /// panics after `timeout` with the last status and the agents' logs.
    pub fn poll<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Status) -> Option<T>,
    ) -> T {
        wait_until(what, timeout, || {
            let s = self.status();
            f(&s).ok_or_else(|| Text(format!("{s:#?}\n{}", self.logs())))
        })
    }

    /// Waits until the source's job `id` is complete and every member holds
    /// `name` complete with one root; returns it.
    pub fn wait_complete(&self, id: &str, source: &str, members: &[&str], name: &str) -> String {
        self.poll(
            &format!("job {id} ({name}) complete on {members:?}"),
            JOB_DEADLINE,
            |s| {
                let job = s.job(source, id)?;
                assert!(
                    !matches!(job.state, JobState::Failed { .. } | JobState::Cancelled),
                    "job {id} ended {}: {s:#?}\n{}",
                    job.shown(),
                    self.logs()
                );
                if !matches!(job.state, JobState::Complete { .. }) {
                    return None;
                }
                s.complete_root(members, name)
            },
        )
    }
}
