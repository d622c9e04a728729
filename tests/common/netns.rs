//! A cluster of network namespaces with shaped links
//! (`scripts/netcluster.sh`) and what runs in it: agents on host I at
//! 10.78.0.(I+1):7470, pushes from host 0, and `nft` rules that drop
//! packets inside one host. Needs root; `cluster` returns `None`, with a
//! note, where namespaces cannot be made.
//!
//! [`two_net_cluster`] builds hosts with two networks: a management one
//! (eth0, `mgmt_ip`) that the root namespace is plugged into, so operator
//! commands (`xfer sync`, `xfer status`) run from the test process as they
//! would from an operator's shell, and a fabric (eth1, `fabric_ip`), each
//! shaped at its own rate. Each such cluster gets subnets of its own
//! (10.88.S.0/24 and 10.89.S.0/24), so the root namespace's routes of
//! clusters made at once never clash.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::bin;

/// A cluster made by `scripts/netcluster.sh`, removed on drop.
pub struct Cluster {
    pub prefix: String,
    /// Hosts are 0..=n.
    pub n: u32,
    /// The management subnet's first three octets (`10.78.0`).
    pub mgmt_net: String,
    /// The fabric's, when the cluster has one.
    pub fabric_net: Option<String>,
    /// Whether the root namespace is on the management network (at
    /// `{mgmt_net}.254`).
    pub root_attached: bool,
}

/// How `Cluster::up_with` builds a cluster (`scripts/netcluster.sh` env).
#[derive(Clone, Debug)]
pub struct Nets {
    /// eth0's rate (the script's RATE_MBIT).
    pub mgmt_mbit: u32,
    pub mgmt_net: String,
    /// eth1: (rate, subnet); `None`: one network.
    pub fabric: Option<(u32, String)>,
    pub root_attach: bool,
}

/// Why `Cluster::up_with` failed.
#[derive(Debug)]
pub enum UpError {
    /// The root namespace already routes the management subnet (exit 3).
    SubnetTaken(String),
    Other(String),
}

impl Cluster {
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/netcluster.sh")
    }

    pub fn up(prefix: &str, n: u32, rate_mbit: u32) -> Result<Cluster, String> {
        let nets = Nets {
            mgmt_mbit: rate_mbit,
            mgmt_net: "10.78.0".into(),
            fabric: None,
            root_attach: false,
        };
        Self::up_with(prefix, n, &nets).map_err(|e| match e {
            UpError::SubnetTaken(s) | UpError::Other(s) => s,
        })
    }

    /// `netcluster.sh up` with `nets` (MGMT_NET, FABRIC_MBIT, FABRIC_NET,
    /// ROOT_ATTACH).
    pub fn up_with(prefix: &str, n: u32, nets: &Nets) -> Result<Cluster, UpError> {
        let mut cmd = Command::new(Self::script());
        cmd.args(["up", &n.to_string(), &nets.mgmt_mbit.to_string()])
            .env("PREFIX", prefix)
            .env("MGMT_NET", &nets.mgmt_net)
            .env_remove("FABRIC_MBIT")
            .env_remove("FABRIC_NET")
            .env("ROOT_ATTACH", if nets.root_attach { "1" } else { "0" });
        if let Some((rate, net)) = &nets.fabric {
            cmd.env("FABRIC_MBIT", rate.to_string())
                .env("FABRIC_NET", net);
        }
        let out = cmd.output().map_err(|e| UpError::Other(e.to_string()))?;
        // Built before the check: on failure, drop removes what was made.
        let cluster = Cluster {
            prefix: prefix.to_string(),
            n,
            mgmt_net: nets.mgmt_net.clone(),
            fabric_net: nets.fabric.as_ref().map(|(_, net)| net.clone()),
            root_attached: nets.root_attach,
        };
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            return Err(if out.status.code() == Some(3) {
                UpError::SubnetTaken(err)
            } else {
                UpError::Other(err)
            });
        }
        Ok(cluster)
    }

    /// Host `i`'s management address (eth0).
    pub fn ip(&self, i: u32) -> String {
        self.mgmt_ip(i)
    }

    /// Host `i`'s management address (eth0).
    pub fn mgmt_ip(&self, i: u32) -> String {
        format!("{}.{}", self.mgmt_net, i + 1)
    }

    /// Host `i`'s fabric address (eth1); panics on a one-network cluster.
    pub fn fabric_ip(&self, i: u32) -> String {
        let net = self.fabric_net.as_ref().expect("a cluster with a fabric");
        format!("{net}.{}", i + 1)
    }

    /// The root namespace's address on the management network.
    pub fn root_ip(&self) -> Option<String> {
        self.root_attached.then(|| format!("{}.254", self.mgmt_net))
    }

    /// `CMD ARGS...` inside host `i`.
    pub fn exec(&self, i: u32, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{}-h{i}", self.prefix), program])
            .stdin(Stdio::null());
        c
    }

    fn script_cmd(&self, args: &[&str]) -> std::process::Output {
        let out = Command::new(Self::script())
            .args(args)
            .env("PREFIX", &self.prefix)
            .env("MGMT_NET", &self.mgmt_net)
            .env(
                "FABRIC_NET",
                self.fabric_net.as_deref().unwrap_or("10.79.0"),
            )
            .output()
            .expect("run netcluster.sh");
        assert!(
            out.status.success(),
            "netcluster.sh {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Bytes the tbf qdisc of host `i`'s `dev` (eth0, eth1) has sent: the
    /// host's upload on that link, L2 headers included.
    pub fn qdisc_bytes(&self, i: u32, dev: &str) -> u64 {
        let out = self.script_cmd(&["bytes", &i.to_string(), dev, "up"]);
        parse_u64(&out.stdout)
    }

    /// The same towards host `i` (the bridge port's qdisc): its download.
    pub fn qdisc_bytes_down(&self, i: u32, dev: &str) -> u64 {
        let out = self.script_cmd(&["bytes", &i.to_string(), dev, "down"]);
        parse_u64(&out.stdout)
    }

    /// Every byte sent on the management network so far: the hosts'
    /// uploads on eth0, so each packet between hosts counts once (the root
    /// namespace's own packets to the hosts are not in it; their replies
    /// are).
    pub fn mgmt_bytes(&self) -> u64 {
        (0..=self.n).map(|i| self.qdisc_bytes(i, "eth0")).sum()
    }

    /// The same on the fabric (eth1).
    pub fn fabric_bytes(&self) -> u64 {
        (0..=self.n).map(|i| self.qdisc_bytes(i, "eth1")).sum()
    }

    /// Cuts host `i`'s fabric: its eth1 goes down (carrier lost on both
    /// ends, like a pulled cable); its address stays configured.
    pub fn cut_fabric(&self, i: u32) {
        self.script_cmd(&["cut", &i.to_string(), "link"]);
    }

    /// Cuts host `i`'s fabric with an nft table dropping everything on
    /// eth1: the link stays up and routed, packets vanish (time-outs).
    pub fn drop_fabric(&self, i: u32) {
        self.script_cmd(&["cut", &i.to_string(), "drop"]);
    }

    /// Undoes `cut_fabric` / `drop_fabric`.
    pub fn restore_fabric(&self, i: u32) {
        self.script_cmd(&["uncut", &i.to_string()]);
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

fn parse_u64(out: &[u8]) -> u64 {
    let s = String::from_utf8_lossy(out);
    s.trim()
        .parse()
        .unwrap_or_else(|e| panic!("not a byte count ({e}): {s:?}"))
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

// Unique per process and per call: tests of one binary run at once.
static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn next_prefix(tag: &str) -> (String, u32) {
    let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (format!("x{tag}{}n{k}", std::process::id() % 10_000), k)
}

/// A cluster of `n` agent hosts plus the source, or `None` (with a note)
/// where network namespaces cannot be made.
pub fn cluster(tag: &str, n: u32, rate_mbit: u32) -> Option<Cluster> {
    let (prefix, _) = next_prefix(tag);
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

/// The /16s two-network clusters take their subnets from, management and
/// fabric, in the order tried: the first is podman's default bridge's
/// (`cni-podman0`, 10.88.0.0/16, made by a first `podman run` without
/// `--network host`), so a machine where podman ran moves on to the next.
const TWO_NET_RANGES: &[(u8, u8)] = &[(88, 89), (70, 71), (72, 73)];

/// Hosts 0..=n with two networks: management (eth0, 10.M.S.(I+1)) at
/// `mgmt_mbit` with the root namespace on it (10.M.S.254), and a fabric
/// (eth1, 10.F.S.(I+1)) at `fabric_mbit`; M, F and S are picked per
/// cluster (a subnet the root namespace does not route yet, from
/// [`TWO_NET_RANGES`]). `None`, with a note, where network namespaces
/// cannot be made. `tag` is at most 3 characters (the root veth's name
/// holds the prefix).
pub fn two_net_cluster(tag: &str, n: u32, mgmt_mbit: u32, fabric_mbit: u32) -> Option<Cluster> {
    assert!(tag.len() <= 3, "tag {tag:?}: at most 3 characters");
    let (prefix, k) = next_prefix(tag);
    let pid = std::process::id();
    let mut last = String::new();
    let tries = 40u32;
    for attempt in 0..tries * TWO_NET_RANGES.len() as u32 {
        let (m, f) = TWO_NET_RANGES[(attempt / tries) as usize];
        let s = 1 + (pid.wrapping_mul(31) + k * 7 + attempt) % 250;
        let nets = Nets {
            mgmt_mbit,
            mgmt_net: format!("10.{m}.{s}"),
            fabric: Some((fabric_mbit, format!("10.{f}.{s}"))),
            root_attach: true,
        };
        match Cluster::up_with(&prefix, n, &nets) {
            Ok(c) => return Some(c),
            Err(UpError::SubnetTaken(e)) => last = e,
            Err(UpError::Other(e)) => {
                eprintln!("skipping: cannot build a two-network netns cluster (needs root): {e}");
                return None;
            }
        }
    }
    panic!("no free 10.M.S.0/24 for the root namespace in 10.88, 10.70 or 10.72 after {} tries: {last}", tries as usize * TWO_NET_RANGES.len());
}

/// `MGMT:7470/DATA` for `xfer push --to`: each host's agent (management)
/// address, then its data address (the fabric IP; the port is the agent's).
pub fn data_addrs(c: &Cluster, hosts: impl Iterator<Item = u32>) -> Vec<String> {
    hosts
        .map(|i| format!("{}:7470/{}", c.mgmt_ip(i), c.fabric_ip(i)))
        .collect()
}

/// An agent inside host `i`: `xfer serve --listen LISTEN --root ROOT --key
/// KEY EXTRA...` with `env`, stderr into `log`. Waits for its first line.
#[allow(clippy::too_many_arguments)]
pub fn start_agent_in(
    c: &Cluster,
    i: u32,
    listen: &str,
    root: &Path,
    key: &Path,
    extra: &[&str],
    env: &[(&str, &Path)],
    log: &Path,
) -> HostAgent {
    let mut child = c
        .xfer(i)
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .args(["serve", "--listen", listen, "--root"])
        .arg(root)
        .arg("--key")
        .arg(key)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("agent log"))
        .spawn()
        .expect("start agent in netns");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("xfer agent listening on"),
        "agent on host {i}: {line:?}; its log: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    HostAgent(child)
}

/// One `[[node]]` of a two-network cluster file.
pub struct FabricNode {
    pub name: String,
    /// `MGMT_IP:PORT`.
    pub agent: String,
    pub fabric_if: String,
    pub fabric_ip: String,
    /// Written only when set (`data_port`; default: the agent's port).
    pub data_port: Option<u16>,
    pub root: PathBuf,
}

/// `[[node]]` h`i` of `c`: agent at `mgmt_ip(i):7470`, fabric eth1 at
/// `fabric_ip(i)`, root `root`.
pub fn fabric_node(c: &Cluster, i: u32, root: &Path) -> FabricNode {
    FabricNode {
        name: format!("h{i}"),
        agent: format!("{}:7470", c.mgmt_ip(i)),
        fabric_if: "eth1".into(),
        fabric_ip: c.fabric_ip(i),
        data_port: None,
        root: root.to_path_buf(),
    }
}

/// Writes a cluster file naming `key` and `nodes` with their fabrics.
pub fn write_fabric_cluster_file(file: &Path, key: &Path, nodes: &[FabricNode]) {
    let mut toml = format!("key = \"{}\"\n", key.display());
    for n in nodes {
        toml.push_str(&format!(
            "\n[[node]]\nname = \"{}\"\nagent = \"{}\"\nroot = \"{}\"\nfabric_if = \"{}\"\nfabric_ip = \"{}\"\n",
            n.name,
            n.agent,
            n.root.display(),
            n.fabric_if,
            n.fabric_ip
        ));
        if let Some(p) = n.data_port {
            toml.push_str(&format!("data_port = {p}\n"));
        }
    }
    std::fs::write(file, toml).unwrap();
}

/// Held by the tests that measure a transfer's speed against S/B, so that
/// two of them never share the machine's cores (tests of one binary run
/// at once).
pub fn rate_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
