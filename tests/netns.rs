//! xfer across a cluster of network namespaces with shaped links
//! (`scripts/netcluster.sh`): real processes on separate hosts, real
//! bandwidth limits. Needs root; on a machine without it the test says why
//! and returns.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// A cluster made by `scripts/netcluster.sh`, removed on drop.
struct Cluster {
    prefix: String,
}

impl Cluster {
    fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/netcluster.sh")
    }

    fn up(prefix: &str, n: u32, rate_mbit: u32) -> Result<Cluster, String> {
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

    fn ip(&self, i: u32) -> String {
        format!("10.78.0.{}", i + 1)
    }

    /// `xfer ARGS...` inside host `i`.
    fn xfer(&self, i: u32) -> Command {
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
struct HostAgent(Child);

impl Drop for HostAgent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_agent(c: &Cluster, i: u32, root: &Path, key: &Path) -> HostAgent {
    let mut child = c
        .xfer(i)
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

#[test]
fn a_star_push_over_shaped_links_is_verified_and_costs_n_times_s() {
    let prefix = format!("xt{}", std::process::id() % 10_000);
    let cluster = match Cluster::up(&prefix, 2, 400) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skipping: cannot build a netns cluster (needs root): {e}");
            return;
        }
    };
    let t = tempdir("netns");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 12 * MIB, 91);
    let _a1 = start_agent(&cluster, 1, &t.path().join("h1"), &key);
    let _a2 = start_agent(&cluster, 2, &t.path().join("h2"), &key);
    let to = format!("{}:7470,{}:7470", cluster.ip(1), cluster.ip(2));
    let r = run(
        cluster
            .xfer(0)
            .env("XDG_CACHE_HOME", t.path().join("xdg"))
            .arg("push")
            .arg(&src)
            .args(["--to", &to, "--json", "--key"])
            .arg(&key),
        Duration::from_secs(120),
    );
    r.assert_ok("push across the netns cluster");
    let s: PushJson = r.json();
    assert_eq!(s.bytes_sent, 2 * s.bytes_total);
    assert_same_tree(&src, &t.path().join("h1/m"));
    assert_same_tree(&src, &t.path().join("h2/m"));
    // The source's 400 Mbit/s upload carries the model twice: a star takes
    // at least N*S/B. (Peer-to-peer fan-out is what will remove this.)
    let floor = 2.0 * s.bytes_total as f64 / (400e6 / 8.0);
    let took = s.duration_s - s.hash_s;
    assert!(
        took >= 0.9 * floor,
        "{took:.2}s is faster than the shaped link allows ({floor:.2}s): shaping is not in effect"
    );
}
