//! A cluster of network namespaces with shaped links
//! (`scripts/netcluster.sh`) and what runs in it: agents on host I at
//! 10.78.0.(I+1):7470, pushes from host 0, and `nft` rules that drop
//! packets inside one host. Needs root; `cluster` returns `None`, with a
//! note, where namespaces cannot be made.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::bin;

/// A cluster made by `scripts/netcluster.sh`, removed on drop.
pub struct Cluster {
    pub prefix: String,
}

impl Cluster {
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/netcluster.sh")
    }

    pub fn up(prefix: &str, n: u32, rate_mbit: u32) -> Result<Cluster, String> {
        let out = Command::new(Self::script())
            .args(["up", &n.to_string(), &rate_mbit.to_string()])
            .env("PREFIX", prefix)
            .output()
            .map_err(|e| e.to_string())?;
        let cluster = Cluster {
            prefix: prefix.to_string(),
        };
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(cluster)
    }

    pub fn ip(&self, i: u32) -> String {
        format!("10.78.0.{}", i + 1)
    }

    /// `xfer ARGS...` inside host `i`.
    pub fn xfer(&self, i: u32) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{}-h{i}", self.prefix), bin()])
            .env_remove("RUST_LOG")
            .env_remove("XFER_KEY")
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(Self::script())
            .arg("down")
            .env("PREFIX", &self.prefix)
            .status();
    }
}

/// An agent inside a host, killed on drop.
pub struct HostAgent(pub Child);

impl HostAgent {
    pub fn kill9(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn start_agent(c: &Cluster, i: u32, root: &Path, key: &Path) -> HostAgent {
    start_agent_env(c, i, root, key, &[])
}

pub fn start_agent_env(
    c: &Cluster,
    i: u32,
    root: &Path,
    key: &Path,
    env: &[(&str, &str)],
) -> HostAgent {
    let mut child = c
        .xfer(i)
        .envs(env.iter().copied())
        .args(["serve", "--listen", &format!("{}:7470", c.ip(i)), "--root"])
        .arg(root)
        .arg("--key")
        .arg(key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start agent in netns");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("xfer agent listening on"), "{line:?}");
    HostAgent(child)
}

/// A cluster of `n` agent hosts plus the source, or `None` (with a note)
/// where network namespaces cannot be made.
pub fn cluster(tag: &str, n: u32, rate_mbit: u32) -> Option<Cluster> {
    // Unique per process and per call: tests of one binary run at once.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let prefix = format!("x{tag}{}n{k}", std::process::id() % 10_000);
    match Cluster::up(&prefix, n, rate_mbit) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("skipping: cannot build a netns cluster (needs root): {e}");
            None
        }
    }
}

pub fn addrs(c: &Cluster, hosts: impl Iterator<Item = u32>) -> Vec<String> {
    hosts.map(|i| format!("{}:7470", c.ip(i))).collect()
}

/// `xfer push SRC --to ADDRS --json` from host 0, as a command. Chunks of
/// 1 MiB give these small models enough chunks to spread over a swarm.
pub fn push_from_source(
    c: &Cluster,
    src: &Path,
    to: &[String],
    key: &Path,
    cache: &Path,
) -> Command {
    let mut cmd = c.xfer(0);
    cmd.env("XDG_CACHE_HOME", cache)
        .arg("push")
        .arg(src)
        .args([
            "--to",
            &to.join(","),
            "--json",
            "--chunk-size",
            "1MiB",
            "--key",
        ])
        .arg(key);
    cmd
}

/// `nft -f -` inside host `i`: `rules` is an nft script.
pub fn nft(c: &Cluster, i: u32, rules: &str) {
    use std::io::Write as _;
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("{}-h{i}", c.prefix),
            "nft",
            "-f",
            "-",
        ])
        .stdin(Stdio::piped())
        .spawn()
        .expect("nft");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "nft failed on host {i}: {rules}"
    );
}

/// Removes every rule `nft` added inside host `i`.
pub fn nft_flush(c: &Cluster, i: u32) {
    nft(c, i, "flush ruleset\n");
}

/// Bytes host `i` has sent on its link so far (`tx_bytes` of its eth0).
pub fn tx_bytes(c: &Cluster, i: u32) -> u64 {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &format!("{}-h{i}", c.prefix),
            "cat",
            "/sys/class/net/eth0/statistics/tx_bytes",
        ])
        .output()
        .expect("read tx_bytes");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}
