//! The launch lab the launcher's end-to-end tests share (tests/launch.rs
//! with the stand-in engine, tests/engines.rs with real vLLM and Ray): a
//! cluster of network namespaces with two NICs per node
//! (`scripts/launchnet.sh`), real `xfer serve` agents in them, each in its
//! own mount namespace so that every node has its own root at the same
//! absolute path, a cluster key, model folders and cluster files.
//!
//! The labs share the address ranges, so they run one at a time (in one
//! test binary; cargo runs the binaries one after another).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

// The suite's one wait helper, shared with tests/common.
#[path = "../common/wait.rs"]
pub mod wait;
pub use wait::*;

pub static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub const AGENT_PORT: u16 = 7470;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn launch_bin() -> &'static str {
    env!("CARGO_BIN_EXE_xfer-launch")
}

/// The `xfer` binary, built next to `xfer-launch`.
pub fn xfer_bin() -> PathBuf {
    let p = Path::new(launch_bin()).with_file_name("xfer");
    if !p.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-q", "-p", "xfer", "--bin", "xfer"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok && p.exists(), "cannot build {}", p.display());
    }
    p
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Why these tests cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        return Some("needs root for network namespaces and mounts".into());
    }
    for tool in ["ip", "unshare", "mount", "python3", "nft"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!(
                "{tool} is not installed (scripts/test.sh installs it)"
            ));
        }
    }
    None
}

extern "C" {
    #[link_name = "geteuid"]
    pub fn libc_geteuid() -> u32;
}

macro_rules! need_root {
    () => {
        if let Some(why) = unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// A lab's two networks: node i is at `mgmt`.i.2 (management, the default
/// route) and `fabric`.i (the fabric).
#[derive(Clone, Copy)]
pub struct Nets {
    pub mgmt: &'static str,
    pub fabric: &'static str,
}

/// launchnet.sh's defaults (tests/launch.rs).
pub const DEFAULT_NETS: Nets = Nets {
    mgmt: "10.79",
    fabric: "10.80.0",
};

/// A launch cluster: namespaces, agents, a key, a model, a cluster file.
pub struct Lab {
    pub prefix: String,
    pub dir: PathBuf,
    /// The path every node's root is mounted at, inside its agent.
    pub mnt: PathBuf,
    pub n: usize,
    /// The lab's networks (scripts/launchnet.sh's MGMT_NET, FABRIC_NET).
    pub nets: Nets,
    /// Put first on the agents' PATH: the stand-in's or a real engine's.
    engine_bin: PathBuf,
    /// The stand-in's Python modules (it plays `sglang` too).
    pythonpath: Option<PathBuf>,
    pub agents: Vec<Option<Child>>,
    _guard: std::sync::MutexGuard<'static, ()>,
}

impl Lab {
    pub fn script() -> PathBuf {
        repo().join("scripts/launchnet.sh")
    }

    /// `n` nodes; agents on the nodes listed in `with_agents`.
    pub fn up(prefix: &str, n: usize, with_agents: &[usize]) -> Lab {
        let standin = repo().join("tests/standin");
        Lab::with_engine(
            prefix,
            n,
            with_agents,
            standin.join("bin"),
            Some(standin.join("pylib")),
            DEFAULT_NETS,
        )
    }

    /// `n` nodes whose agents find the engine in `engine_bin` first.
    pub fn with_engine(
        prefix: &str,
        n: usize,
        with_agents: &[usize],
        engine_bin: PathBuf,
        pythonpath: Option<PathBuf>,
        nets: Nets,
    ) -> Lab {
        let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("xfer-launch-it-{prefix}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mnt")).unwrap();
        std::fs::create_dir_all(dir.join("out")).unwrap();
        let out = Command::new(Self::script())
            .args(["up", &n.to_string()])
            .env("PREFIX", prefix)
            .env("MGMT_NET", nets.mgmt)
            .env("FABRIC_NET", nets.fabric)
            .output()
            .unwrap();
        assert!(out.status.success(), "launchnet up: {}", text(&out.stderr));
        let key = dir.join("cluster.key");
        let k = Command::new(xfer_bin())
            .args(["keygen", "--out", key.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(k.status.success(), "{}", text(&k.stderr));
        let mut lab = Lab {
            prefix: prefix.to_string(),
            mnt: dir.join("mnt"),
            dir,
            n,
            engine_bin,
            pythonpath,
            nets,
            agents: Vec::new(),
            _guard: guard,
        };
        for i in 1..=n {
            std::fs::create_dir_all(lab.root_of(i)).unwrap();
            let a = with_agents.contains(&i).then(|| lab.start_agent(i));
            lab.agents.push(a);
        }
        // A fresh veth reports its carrier a moment after it is set up: a
        // check at once would see the fabric down.
        for i in 1..=n {
            let state = || {
                Command::new("ip")
                    .args(["netns", "exec", &lab.ns(i), "cat"])
                    .arg(format!("/sys/class/net/{}/operstate", lab.fabric_if(i)))
                    .output()
                    .map(|o| text(&o.stdout).trim().to_string())
                    .unwrap_or_default()
            };
            wait_until(
                &format!("node {i}'s fabric {} to come up", lab.fabric_if(i)),
                Duration::from_secs(60),
                || {
                    let s = state();
                    if s == "up" {
                        Ok(())
                    } else {
                        Err(s)
                    }
                },
            );
        }
        lab
    }

    pub fn ns(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }

    pub fn mgmt_ip(&self, i: usize) -> String {
        format!("{}.{i}.2", self.nets.mgmt)
    }

    pub fn fabric_ip(&self, i: usize) -> String {
        format!("{}.{i}", self.nets.fabric)
    }

    /// `s` with the default networks' addresses (10.79.*, 10.80.0.*)
    /// moved to this lab's, for scripts written with the defaults.
    pub fn here(&self, s: &str) -> String {
        s.replace("10.80.0.", &format!("{}.", self.nets.fabric))
            .replace("10.79.", &format!("{}.", self.nets.mgmt))
    }

    pub fn fabric_if(&self, i: usize) -> &'static str {
        if i % 2 == 1 {
            "fab0"
        } else {
            "enp1s0f1"
        }
    }

    /// Node `i`'s own root folder, as seen from the host.
    pub fn root_of(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node{i}"))
    }

    pub fn out_dir(&self) -> PathBuf {
        self.dir.join("out")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.join("cluster.key")
    }

    /// Runs `xfer serve` inside node `i`, in a mount namespace where the
    /// node's root is at `mnt`, with the stand-in engine on its PATH.
    pub fn start_agent(&self, i: usize) -> Child {
        let ns = self.ns(i);
        self.spawn_agent(i, &["ip", "netns", "exec", &ns], "", "")
    }

    /// [`Lab::start_agent`] with a private dockerd of its own, started
    /// in the agent's network and mount namespaces (so that the node's
    /// root is at `mnt` for its containers too), its state under
    /// `dir/docker<i>`, and `--container-engine docker`. Entered with
    /// nsenter, not `ip netns exec`, whose fresh /sys hides the cgroups
    /// dockerd needs: the cgroup tree is carried over a new sysfs by hand.
    /// Stop the dockerd with [`Lab::stop_docker`].
    pub fn start_agent_with_docker(&self, i: usize) -> Child {
        let d = self.docker_dir(i);
        std::fs::create_dir_all(d.join("cg")).unwrap();
        let prelude = format!(
            "mount --rbind /sys/fs/cgroup '{cg}' && mount -t sysfs sysfs /sys && mount --rbind '{cg}' /sys/fs/cgroup && ",
            cg = d.join("cg").display()
        );
        let after_mount = format!(
            "'{}' start '{}' >/dev/null && export DOCKER_HOST=unix://{}/docker.sock && ",
            repo().join("scripts/dockerd.sh").display(),
            d.display(),
            d.display()
        );
        let net = format!("--net=/run/netns/{}", self.ns(i));
        self.spawn_agent_with(
            i,
            &["nsenter", &net],
            &prelude,
            &after_mount,
            " --container-engine docker",
        )
    }

    /// Node `i`'s dockerd folder (its socket is `docker.sock` there).
    pub fn docker_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("docker{i}"))
    }

    /// Stops node `i`'s dockerd.
    pub fn stop_docker(&self, i: usize) {
        let _ = Command::new(repo().join("scripts/dockerd.sh"))
            .arg("stop")
            .arg(self.docker_dir(i))
            .status();
    }

    /// [`Lab::start_agent`] with `first` before everything else on the
    /// agent's `PATH`: a node whose programs (its `python3`) differ from
    /// the other nodes'.
    pub fn start_agent_with_path_first(&self, i: usize, first: &Path) -> Child {
        let ns = self.ns(i);
        self.spawn_agent_on(i, &["ip", "netns", "exec", &ns], "", "", "", Some(first))
    }

    fn spawn_agent(&self, i: usize, enter: &[&str], prelude: &str, extra: &str) -> Child {
        self.spawn_agent_with(i, enter, prelude, "", extra)
    }

    fn spawn_agent_with(
        &self,
        i: usize,
        enter: &[&str],
        prelude: &str,
        after_mount: &str,
        extra: &str,
    ) -> Child {
        self.spawn_agent_on(i, enter, prelude, after_mount, extra, None)
    }

    fn spawn_agent_on(
        &self,
        i: usize,
        enter: &[&str],
        prelude: &str,
        after_mount: &str,
        extra: &str,
        path_first: Option<&Path>,
    ) -> Child {
        let path = format!(
            "{}{}:{}",
            path_first
                .map(|p| format!("{}:", p.display()))
                .unwrap_or_default(),
            self.engine_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let script = format!(
            "{prelude}mount --bind '{}' '{}' && {after_mount}exec '{}' serve --listen 0.0.0.0:{AGENT_PORT} --root '{}' --key '{}' --verify-every 0 --allow-launch{extra}",
            self.root_of(i).display(),
            self.mnt.display(),
            xfer_bin().display(),
            self.mnt.display(),
            self.key().display()
        );
        let mut cmd = Command::new(enter[0]);
        if let Some(py) = &self.pythonpath {
            cmd.env("PYTHONPATH", py);
        }
        let mut child = cmd
            .args(&enter[1..])
            .args([
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
            ])
            .env("PATH", path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::File::create(self.dir.join(format!("agent{i}.log"))).unwrap(),
            ))
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.contains("listening"),
            "agent {i} did not start: {line}{}",
            std::fs::read_to_string(self.dir.join(format!("agent{i}.log"))).unwrap_or_default()
        );
        child
    }

    /// Node `i`'s folder under /etc/netns, which `ip netns exec` mounts
    /// over /etc (launchnet.sh's `down` removes it).
    pub fn etc_of(&self, i: usize) -> PathBuf {
        PathBuf::from(format!("/etc/netns/{}", self.ns(i)))
    }

    /// Gives node `i` a name server that never answers (an address of the
    /// fabric that nobody owns: every query is sent and none answered, as
    /// on a fabric the site's DNS cannot be reached from), waited for
    /// `timeout` a query, and a hosts file of its own: the machine's
    /// without the lab's fabric addresses, naming the host (as Debian's
    /// installer writes it), so that only the fabric addresses are left to
    /// the resolver. Call it before the node's agent starts (`ip netns
    /// exec` mounts the files when it enters); returns the hosts file,
    /// which may then be appended to in place.
    pub fn deaf_resolver(&self, i: usize, timeout: Duration) -> PathBuf {
        let hostname = text(&Command::new("hostname").output().unwrap().stdout)
            .trim()
            .to_string();
        let fabric: Vec<String> = (1..=self.n).map(|j| self.fabric_ip(j)).collect();
        let mut hosts: String = std::fs::read_to_string("/etc/hosts")
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                !fabric
                    .iter()
                    .any(|ip| l.split_whitespace().next() == Some(ip))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let named = hosts
            .lines()
            .any(|l| !l.starts_with('#') && l.split_whitespace().skip(1).any(|n| n == hostname));
        if !named {
            hosts += &format!("127.0.1.1 {hostname}\n");
        }
        let etc = self.etc_of(i);
        std::fs::write(etc.join("hosts"), hosts).unwrap();
        std::fs::write(
            etc.join("resolv.conf"),
            format!(
                "nameserver {}.250\noptions timeout:{} attempts:1\n",
                self.nets.fabric,
                timeout.as_secs().max(1)
            ),
        )
        .unwrap();
        etc.join("hosts")
    }

    /// Pushes a model folder to the agents of `nodes` under `name`.
    pub fn push(&self, src: &Path, name: &str, nodes: &[usize]) {
        let to: Vec<String> = nodes
            .iter()
            .map(|i| format!("{}:{AGENT_PORT}", self.mgmt_ip(*i)))
            .collect();
        let out = Command::new(xfer_bin())
            .args(["push", src.to_str().unwrap(), "--name", name, "--key"])
            .arg(self.key())
            .args(["--to", &to.join(",")])
            .output()
            .unwrap();
        assert!(out.status.success(), "push: {}", text(&out.stderr));
    }

    /// A small model folder with the files engines look for.
    pub fn model(&self, tag: &str) -> PathBuf {
        let m = self.dir.join(format!("model-{tag}"));
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("config.json"), format!("{{\"tag\": \"{tag}\"}}\n")).unwrap();
        let mut w = Vec::with_capacity(3 << 20);
        let mut x: u64 = tag.bytes().fold(7, |a, b| a * 31 + b as u64);
        while w.len() < 3 << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.extend_from_slice(&x.to_le_bytes());
        }
        std::fs::write(m.join("model.safetensors"), w).unwrap();
        m
    }

    /// Writes a cluster file: every node by its management address, with
    /// `node_extra(i)` lines, and `launch` as the [launch] table's body.
    pub fn cluster_file(
        &self,
        name: &str,
        launch: &str,
        node_extra: impl Fn(usize) -> String,
    ) -> PathBuf {
        let mut f = format!("key = \"{}\"\n", self.key().display());
        for i in 1..=self.n {
            f += &format!(
                "\n[[node]]\nname = \"n{i}\"\nagent = \"{}:{AGENT_PORT}\"\nroot = \"{}\"\n{}\n",
                self.mgmt_ip(i),
                self.mnt.display(),
                node_extra(i)
            );
        }
        f += &format!("\n[launch]\n{launch}\n");
        let p = self.dir.join(name);
        std::fs::write(&p, f).unwrap();
        p
    }

    /// The usual fabric lines of node `i`.
    pub fn fabric(&self, i: usize) -> String {
        format!(
            "fabric_if = \"{}\"\nfabric_ip = \"{}\"",
            self.fabric_if(i),
            self.fabric_ip(i)
        )
    }

    /// A [launch] body for `engine` on the model `name`, with the stand-in
    /// told to check against the plan and to write what it got.
    pub fn launch(&self, engine: &str, name: &str, env: &[(&str, &str)]) -> String {
        let mut l = format!(
            "engine = \"{engine}\"\nmodel = \"{}/{name}\"\n",
            self.mnt.display()
        );
        if engine == "vllm-ray" {
            l += &format!("pp = {}\n", self.n);
        }
        l += "\n[launch.env]\n";
        l += &format!(
            "STANDIN_PLAN = \"{}\"\nSTANDIN_OUT = \"{}\"\n",
            self.dir.join("plan.json").display(),
            self.out_dir().display()
        );
        for (k, v) in env {
            l += &format!("{k} = \"{v}\"\n");
        }
        l
    }

    /// `xfer-launch plan --json` of `file`, saved where the stand-in reads it.
    pub fn save_plan(&self, file: &Path) {
        let out = self.xl(&["plan", "--json"], file);
        assert!(out.status.success(), "{}", text(&out.stderr));
        std::fs::write(self.dir.join("plan.json"), &out.stdout).unwrap();
    }

    pub fn xl(&self, args: &[&str], file: &Path) -> Output {
        let mut a: Vec<&str> = vec![args[0], "--cluster", file.to_str().unwrap()];
        a.extend(&args[1..]);
        Command::new(launch_bin())
            .args(&a)
            .env("XDG_STATE_HOME", self.dir.join("state"))
            .output()
            .unwrap()
    }

    /// What the stand-in processes reported (one JSON per process).
    pub fn standins(&self) -> Vec<serde_json::Value> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(self.out_dir()).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "json") {
                let t = std::fs::read_to_string(e.path()).unwrap();
                v.push(serde_json::from_str(&t).unwrap_or_else(|e| panic!("{t}: {e}")));
            }
        }
        v
    }

    /// Stand-in processes that are still alive.
    pub fn alive(&self) -> Vec<u64> {
        self.standins()
            .iter()
            .filter_map(|s| s["pid"].as_u64())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| {
                        !s.rsplit_once(')')
                            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                    })
                    .unwrap_or(false)
            })
            .collect()
    }

    /// Waits until no stand-in process is alive.
    pub fn assert_none_alive(&self) {
        wait_until("every stand-in process to end", HANG, || {
            let alive = self.alive();
            if alive.is_empty() {
                Ok(())
            } else {
                Err(alive)
            }
        });
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for pid in self.alive() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        for a in self.agents.iter_mut().flatten() {
            let _ = a.kill();
            let _ = a.wait();
        }
        // A cluster left up would shadow the next one on the same networks:
        // say so if it could not be taken down (the next `up` clears what a
        // vanished cluster left).
        let down = Command::new(Self::script())
            .arg("down")
            .env("PREFIX", &self.prefix)
            .status();
        if !down.as_ref().is_ok_and(|s| s.success()) {
            eprintln!("launchnet down {}: {down:?}", self.prefix);
        }
    }
}

/// The rows of a check for one check name.
pub fn rows<'a>(out: &'a str, check: &str) -> Vec<&'a str> {
    out.lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(check))
        .collect()
}

/// `tests/hub_server.py` serving `repos` inside the head's namespace (where
/// its agent pulls) on the head's management address (which the launcher
/// reaches too, for the listing), with these `--fault`s: the child and its
/// port.
pub fn hub_in_head(lab: &Lab, repos: &std::path::Path, faults: &[String]) -> (Reaped, String) {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &lab.ns(1), "python3"])
        .arg(repo().join("tests/hub_server.py"))
        .arg("--repos")
        .arg(repos)
        .args(["--host", &lab.mgmt_ip(1)]);
    for f in faults {
        cmd.arg("--fault").arg(f);
    }
    let mut hub = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(hub.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .strip_prefix("READY ")
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("hub_server.py did not start: {line:?}"))
        .to_string();
    (Reaped(hub), port)
}

/// A child killed and reaped when dropped, on a failed assertion too.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
