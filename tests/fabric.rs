//! The data rides the fabric (issue 16): hosts with a slow management
//! network (eth0, 40 Mbit/s, the cluster file's `agent` addresses, which
//! the root namespace is on) and a fast fabric (eth1, 400 Mbit/s,
//! `fabric_ip`). Operator commands (`xfer sync`, `xfer status`) run here, in
//! the root namespace, over management; every chunk must go over the
//! fabric. The proof is in tc's byte counters: the management links carry
//! under 3% of the model's bytes, and the fabric's carry the rest.
//!
//! A node whose fabric is cut (link down, or every packet dropped) falls
//! back to management, completes, and says so (`over management`) in the
//! push summary, the push's human output and `xfer status`.
//! A receiver keeps at most `--peers K` peer links.
//!
//! Speed is measured, not asserted: each test prints its time as a
//! multiple of S/B, and `scripts/bench-fanout.sh` (MGMT_MBIT) reports the
//! figures on a quiet machine with a release build. Which network carried
//! the bytes is asserted, from tc's counters; completion is waited for
//! through status and exit, never by sleeping. The tests that print times
//! hold `rate_lock` so that they never share the cores with each other.
//! Needs root; each test skips with a note without it.

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use xfer_proto::admin::JobState;

use common::cluster::{status, Status};
use common::netns::*;
use common::*;

use xfer::agent::sync::status::ModelState;

const MGMT_MBIT: u32 = 40;
const FABRIC_MBIT: u32 = 400;

/// S/B in seconds: `bytes` through one link of `mbit`.
fn s_over_b(bytes: u64, mbit: u32) -> f64 {
    bytes as f64 / (mbit as f64 * 1e6 / 8.0)
}

/// A two-network cluster with agents on some hosts and a cluster file
/// naming every host (h0..hN) with its fabric.
struct Fab {
    c: Cluster,
    t: tempfile::TempDir,
    key: PathBuf,
    file: PathBuf,
    agents: Vec<(u32, HostAgent)>,
}

impl Fab {
    /// Hosts 0..=n; agents (`--listen 0.0.0.0:7470`, one socket for both
    /// networks) on `agents`.
    fn start(tag: &str, n: u32, agents: impl Iterator<Item = u32>) -> Option<Fab> {
        let c = two_net_cluster(tag, n, MGMT_MBIT, FABRIC_MBIT)?;
        let t = tempdir(&format!("fabric-{tag}"));
        let key = t.path().join("cluster.key");
        keygen(&key);
        let file = t.path().join("cluster.toml");
        let mut f = Fab {
            c,
            key,
            file,
            agents: Vec::new(),
            t,
        };
        let nodes: Vec<FabricNode> = (0..=n).map(|i| fabric_node(&f.c, i, &f.root(i))).collect();
        write_fabric_cluster_file(&f.file, &f.key, &nodes);
        for i in agents {
            fs::create_dir_all(f.root(i)).unwrap();
            let xdg = f.t.path().join(format!("h{i}/xdg"));
            let export = f.t.path().join("src");
            fs::create_dir_all(&export).unwrap();
            let a = start_agent_in(
                &f.c,
                i,
                "0.0.0.0:7470",
                &f.root(i),
                &f.key,
                &["--export", export.to_str().unwrap()],
                &[("XDG_CACHE_HOME", &xdg)],
                &f.log(i),
            );
            f.agents.push((i, a));
        }
        Some(f)
    }

    fn root(&self, i: u32) -> PathBuf {
        self.t.path().join(format!("h{i}/root"))
    }

    fn log(&self, i: u32) -> PathBuf {
        self.t.path().join(format!("h{i}/agent.log"))
    }

    /// A source tree under the agents' `--export` folder.
    fn model(&self, name: &str, bytes: u64, seed: u64) -> PathBuf {
        let src = self.t.path().join("src").join(name);
        gen_model(&src, bytes, seed);
        src
    }

    /// The tail of every agent's log, for failure messages.
    fn logs(&self) -> String {
        let mut s = String::new();
        for (i, _) in &self.agents {
            let log = fs::read_to_string(self.log(*i)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(20)..];
            s.push_str(&format!("--- h{i}:\n{}\n", tail.join("\n")));
        }
        s
    }

    /// `xfer sync SRC --cluster FILE --from h0 --nodes NODES --wait --json`,
    /// run here in the root namespace.
    fn sync_cmd(&self, src: &Path, nodes: &str) -> std::process::Command {
        let mut cmd = xfer();
        cmd.arg("sync")
            .arg(src)
            .arg("--cluster")
            .arg(&self.file)
            .args([
                "--from",
                "h0",
                "--nodes",
                nodes,
                "--chunk-size",
                "1MiB",
                "--wait",
                "--json",
            ]);
        cmd
    }
}

/// `xfer status --cluster FILE` (the human table), run in the root namespace.
fn status_text(file: &Path) -> String {
    let r = run(
        xfer().arg("status").arg("--cluster").arg(file),
        Duration::from_secs(20),
    );
    r.assert_ok("xfer status");
    format!("{}{}", r.stdout, r.stderr)
}

/// Whether `s` shows model `name` complete on every one of `nodes` with
/// one root, and `h0`'s job for it complete. Panics on a failed job.
fn job_done(s: &Status, nodes: &[String], name: &str, logs: impl Fn() -> String) -> bool {
    let jobs = s
        .report("h0")
        .status
        .as_ref()
        .map(|st| st.jobs.clone())
        .unwrap_or_default();
    let Some(job) = jobs.iter().rev().find(|j| j.name == name) else {
        return false;
    };
    assert!(
        !matches!(job.state, JobState::Failed { .. } | JobState::Cancelled),
        "the job ended {}: {s:#?}\n{}",
        job.shown(),
        logs()
    );
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    matches!(job.state, JobState::Complete { .. }) && s.complete_root(&names, name).is_some()
}

/// Any receiver holds some of `name`.
fn any_bytes_held(s: &Status, nodes: &[String], name: &str) -> bool {
    nodes.iter().any(|n| {
        s.0.iter().any(|r| r.node == *n) && s.model(n, name).is_some_and(|m| m.bytes_held > 0)
    })
}

/// Syncs 256 MiB from h0 to h1..=hN over the cluster file (commands in the
/// root namespace) and checks the figures.
fn sync_rides_the_fabric(tag: &str, n: u32, seed: u64, source_too: bool) {
    let _serial = rate_lock();
    let Some(f) = Fab::start(tag, n, 0..=n) else {
        return;
    };
    let src = f.model("m", 256 * MIB, seed);
    let want = manifest_root(&src);
    let bytes = tree_bytes(&src);
    let first = if source_too { 0 } else { 1 };
    let nodes: Vec<String> = (first..=n).map(|i| format!("h{i}")).collect();
    let floor = s_over_b(bytes, FABRIC_MBIT);

    let (m0, f0) = (f.c.mgmt_bytes(), f.c.fabric_bytes());
    let sync = Proc::spawn(&mut f.sync_cmd(&src, &nodes.join(",")));
    // The transfer starts when a receiver first holds bytes (after the
    // source has hashed the tree) and ends when status shows every member
    // complete; status is asked every 100 ms.
    let mut before = Instant::now();
    let mut started: Option<Instant> = None;
    let done = wait_until("the sync to complete", Duration::from_secs(300), || {
        let asked = Instant::now();
        let s = status(&f.file);
        if started.is_none() && any_bytes_held(&s, &nodes, "m") {
            // Between the last status without bytes and this one.
            started = Some(before + (asked - before) / 2);
        }
        if job_done(&s, &nodes, "m", || f.logs()) {
            return Ok(Instant::now());
        }
        before = asked;
        Err(Text(format!("{s:#?}\n{}", f.logs())))
    });
    let r = sync.wait(Duration::from_secs(60));
    r.assert_ok("xfer sync --wait");
    let (m1, f1) = (f.c.mgmt_bytes(), f.c.fabric_bytes());
    let v: Value = r.json();
    assert_eq!(v["root"].as_str(), Some(want.as_str()), "{v}");

    let took = (done - started.expect("a receiver held bytes before the end")).as_secs_f64();
    let mgmt_x = (m1 - m0) as f64 / bytes as f64;
    let fabric_x = (f1 - f0) as f64 / bytes as f64;
    eprintln!(
        "fabric: sync of 256 MiB to {} nodes (the source's own among them: {source_too}): {took:.2} s = {:.2} x S/B of the fabric ({floor:.2} s); \
         management links carried {:.2}% of the model ({} bytes), the fabric {fabric_x:.2} x",
        nodes.len(),
        took / floor,
        mgmt_x * 100.0,
        m1 - m0
    );
    for i in first..=n {
        assert_same_tree(&src, &f.root(i).join("m"));
    }
    assert!(
        mgmt_x < 0.03,
        "the management links carried {:.1}% of the model's bytes ({} of {bytes}): the data did not ride the fabric",
        mgmt_x * 100.0,
        m1 - m0
    );
}

#[test]
fn sync_to_two_nodes_rides_the_fabric() {
    sync_rides_the_fabric("fs2", 2, 161, false);
}

/// The shape: from a node's exported folder to 3 nodes, that node
/// among them (it places its own copy from disk, outside the swarm).
#[test]
fn sync_from_an_export_to_three_nodes_with_its_own_rides_the_fabric() {
    sync_rides_the_fabric("fs3", 2, 163, true);
}

#[test]
fn sync_to_four_nodes_rides_the_fabric() {
    sync_rides_the_fabric("fs4", 4, 162, false);
}

/// The JSON summary of a push, whole (for the fields the typed summary
/// may not have yet) and typed.
fn push_json(r: &Run) -> (Value, PushJson) {
    (r.json(), r.json())
}

#[test]
fn push_given_data_addresses_rides_the_fabric() {
    let _serial = rate_lock();
    let n = 4;
    let Some(f) = Fab::start("fp", n, 1..=n) else {
        return;
    };
    let src = f.model("m", 256 * MIB, 163);
    let want = manifest_root(&src);
    let bytes = tree_bytes(&src);
    let floor = s_over_b(bytes, FABRIC_MBIT);
    let to = data_addrs(&f.c, 1..=n);

    let (m0, f0) = (f.c.mgmt_bytes(), f.c.fabric_bytes());
    let r = run(
        &mut push_from_source(&f.c, &src, &to, &f.key, &f.t.path().join("xdg0")),
        Duration::from_secs(300),
    );
    let (m1, f1) = (f.c.mgmt_bytes(), f.c.fabric_bytes());
    r.assert_ok("xfer push --to MGMT/DATA");
    let (v, s) = push_json(&r);
    assert_eq!(s.root.to_hex(), want);
    let took = s.duration_s - s.hash_s;
    let mgmt_x = (m1 - m0) as f64 / bytes as f64;
    let fabric_x = (f1 - f0) as f64 / bytes as f64;
    eprintln!(
        "fabric: push of 256 MiB to {n} nodes: {took:.2} s = {:.2} x S/B of the fabric ({floor:.2} s); \
         management links carried {:.2}% of the model ({} bytes), the fabric {fabric_x:.2} x; source sent {:.2} x S",
        took / floor,
        mgmt_x * 100.0,
        m1 - m0,
        s.source_sent_x
    );
    for (k, i) in (1..=n).enumerate() {
        let node = &s.nodes[k];
        assert!(node.ok, "{node:#?}");
        assert_eq!(
            node.root.map(|r| r.to_hex()),
            Some(want.clone()),
            "{node:#?}"
        );
        assert_same_tree(&src, &f.root(i).join("m"));
        let j = &v["nodes"][k];
        assert_eq!(
            j["data_addr"].as_str(),
            Some(format!("{}:7470", f.c.fabric_ip(i)).as_str()),
            "host {i}: {j:#}"
        );
        assert_eq!(j["over"].as_str(), Some("fabric"), "host {i}: {j:#}");
    }
    assert!(
        mgmt_x < 0.03,
        "the management links carried {:.1}% of the model's bytes ({} of {bytes}): the data did not ride the fabric",
        mgmt_x * 100.0,
        m1 - m0
    );
}

/// Every line of `text` that says a link fell back to management.
fn fallback_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.contains("over management"))
        .collect()
}

#[test]
fn a_node_whose_fabric_is_cut_falls_back_to_management_and_says_so() {
    let n = 4;
    let Some(f) = Fab::start("fc", n, 0..=n) else {
        return;
    };
    // Both ways a fabric fails, before anything is sent: h2's eth1 goes
    // down (a pulled cable: h2 has no route to the fabric, the others'
    // packets to it go nowhere), h3's stays up but drops everything (nft;
    // only time-outs). h1 and h4 keep theirs.
    let cut = [2u32, 3];
    f.c.cut_fabric(2);
    f.c.drop_fabric(3);
    let fabric_of = |i: u32| format!("{}:7470", f.c.fabric_ip(i));
    let to = data_addrs(&f.c, 1..=n);
    let t0 = Instant::now();

    // 1. push --json: the cut nodes complete over management and the
    //    summary says so.
    let src = f.model("m1", 8 * MIB, 171);
    let bytes = tree_bytes(&src);
    let down0: Vec<u64> = cut
        .iter()
        .map(|&i| f.c.qdisc_bytes_down(i, "eth0"))
        .collect();
    let r = run(
        &mut push_from_source(&f.c, &src, &to, &f.key, &f.t.path().join("xdg0")),
        Duration::from_secs(180),
    );
    let down1: Vec<u64> = cut
        .iter()
        .map(|&i| f.c.qdisc_bytes_down(i, "eth0"))
        .collect();
    r.assert_ok("xfer push with two fabrics cut");
    let (v, s) = push_json(&r);
    for (k, i) in (1..=n).enumerate() {
        assert!(s.nodes[k].ok, "{:#?}", s.nodes[k]);
        assert_same_tree(&src, &f.root(i).join("m1"));
    }
    for (c, &i) in cut.iter().enumerate() {
        let j = &v["nodes"][(i - 1) as usize];
        eprintln!("fabric: cut node h{i}'s summary: {j:#}");
        assert_eq!(j["over"].as_str(), Some("management"), "h{i}: {j:#}");
        let notes: Vec<&str> = j["notes"]
            .as_array()
            .unwrap_or_else(|| panic!("h{i}: no notes list: {j:#}"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            notes
                .iter()
                .any(|n| n.contains("over management") && n.contains(&fabric_of(i))),
            "h{i}: no note names its cut fabric {} and `over management`: {notes:#?}",
            fabric_of(i)
        );
        // The bytes really came over management (its eth0 download).
        let got = down1[c] - down0[c];
        assert!(
            got >= bytes * 9 / 10,
            "h{i} took only {got} bytes over management for a {bytes}-byte model"
        );
    }
    for i in [1u32, 4] {
        let j = &v["nodes"][(i - 1) as usize];
        assert_eq!(j["over"].as_str(), Some("fabric"), "h{i}: {j:#}");
    }

    // 2. The human push output prints each note on a line of its own.
    let src2 = f.model("m2", 8 * MIB, 172);
    let mut cmd = f.c.xfer(0);
    cmd.env("XDG_CACHE_HOME", f.t.path().join("xdg0"))
        .arg("push")
        .arg(&src2)
        .args(["--to", &to.join(","), "--chunk-size", "1MiB", "--key"])
        .arg(&f.key);
    let r = run(&mut cmd, Duration::from_secs(180));
    r.assert_ok("xfer push (human output) with two fabrics cut");
    let out = format!("{}{}", r.stdout, r.stderr);
    let lines = fallback_lines(&out);
    eprintln!("fabric: the human push output's fallback lines: {lines:#?}");
    for i in cut {
        assert!(
            lines.iter().any(|l| l.contains(&fabric_of(i))),
            "the push output has no `over management` line naming {}:\n{out}",
            fabric_of(i)
        );
    }

    // 3. A sync over the cluster file: `xfer status` (in the root
    //    namespace) says the cut nodes fell back.
    let src3 = f.model("m3", 8 * MIB, 173);
    let nodes: Vec<String> = (1..=n).map(|i| format!("h{i}")).collect();
    let r = run(
        &mut f.sync_cmd(&src3, &nodes.join(",")),
        Duration::from_secs(180),
    );
    r.assert_ok("xfer sync --wait with two fabrics cut");
    let s = status(&f.file);
    for (k, name) in nodes.iter().enumerate() {
        assert_eq!(
            s.model(name, "m3").map(|m| m.state),
            Some(ModelState::Complete),
            "{s:#?}"
        );
        assert_same_tree(&src3, &f.root(k as u32 + 1).join("m3"));
    }
    let text = status_text(&f.file);
    let lines = fallback_lines(&text);
    eprintln!("fabric: xfer status's fallback lines: {lines:#?}");
    for i in cut {
        assert!(
            lines.iter().any(|l| l.contains(&fabric_of(i))),
            "xfer status has no `over management` line naming {}:\n{text}",
            fabric_of(i)
        );
    }
    eprintln!(
        "fabric: fallback test (3 transfers of 8 MiB) took {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn with_peers_3_no_receiver_holds_more_than_3_peer_links() {
    let _serial = rate_lock();
    let n = 8;
    let rate = 100;
    let Some(c) = cluster("pd", n, rate) else {
        return;
    };
    let t = tempdir("fabric-peers");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 64 * MIB, 174);
    let want = manifest_root(&src);
    let _agents: Vec<_> = (1..=n)
        .map(|i| start_agent(&c, i, &t.path().join(format!("h{i}")), &key))
        .collect();
    let to = addrs(&c, 1..=n);
    let mut cmd = push_from_source(&c, &src, &to, &key, &t.path().join("xdg"));
    cmd.args(["--peers", "3"]);
    let r = run(&mut cmd, Duration::from_secs(180));
    r.assert_ok("xfer push --peers 3");
    let (v, s) = push_json(&r);
    assert_eq!(s.root.to_hex(), want);
    let floor = s_over_b(s.bytes_total, rate);
    let took = s.duration_s - s.hash_s;
    let links: Vec<Option<u64>> = (0..n as usize)
        .map(|k| v["nodes"][k]["max_peer_links"].as_u64())
        .collect();
    eprintln!(
        "fabric: 8 receivers with --peers 3, 64 MiB at {rate} Mbit/s: {took:.2} s = {:.2} x S/B ({floor:.2} s); \
         max_peer_links per node {links:?} (max {:?}); source sent {:.2} x S",
        took / floor,
        links.iter().flatten().max(),
        s.source_sent_x
    );
    for (k, i) in (1..=n).enumerate() {
        let node = &s.nodes[k];
        assert!(node.ok, "{node:#?}");
        assert_eq!(
            node.root.map(|r| r.to_hex()),
            Some(want.clone()),
            "{node:#?}"
        );
        assert_same_tree(&src, &t.path().join(format!("h{i}/m")));
        let l =
            links[k].unwrap_or_else(|| panic!("host {i}: no max_peer_links: {:#}", v["nodes"][k]));
        assert!(l <= 3, "host {i} held {l} peer links at once (--peers 3)");
    }
}

/// A node whose fabric drops everything when the push starts and comes
/// back while it runs: the push falls back to management, tries the data
/// address again, and once it answers a second lane over it carries part
/// of the rest; the summary says when. The source is capped (256 KiB/s
/// for 8 MiB) so that the push outlasts the fabric's return by far more
/// than one re-probe (2 s plus a 5 s connect timeout).
#[test]
fn a_fabric_back_mid_push_carries_the_rest_beside_management() {
    let Some(f) = Fab::start("fr", 1, 0..=1) else {
        return;
    };
    f.c.drop_fabric(1);
    let src = f.model("m", 32 * MIB, 181);
    let bytes = tree_bytes(&src);
    let to = data_addrs(&f.c, 1..=1);
    let mgmt0 = f.c.qdisc_bytes_down(1, "eth0");
    let mut cmd = push_from_source(&f.c, &src, &to, &f.key, &f.t.path().join("xdg"));
    cmd.args(["--limit-rate", "1MiB"]);
    let push = Proc::spawn(&mut cmd);
    // The event: a quarter of the model has come over management.
    wait_until(
        "a quarter of the model over management",
        Duration::from_secs(120),
        || f.c.qdisc_bytes_down(1, "eth0") - mgmt0 >= bytes / 4,
    );
    let fab0 = f.c.qdisc_bytes_down(1, "eth1");
    f.c.restore_fabric(1);
    let r = push.wait(Duration::from_secs(180));
    r.assert_ok("xfer push with a fabric back mid-way");
    let fab = f.c.qdisc_bytes_down(1, "eth1") - fab0;
    let (v, s) = push_json(&r);
    let node = &s.nodes[0];
    assert!(node.ok, "{node:#?}");
    assert_same_tree(&src, &f.root(1).join("m"));
    let j = &v["nodes"][0];
    assert_eq!(j["over"].as_str(), Some("management"), "{j:#}");
    let notes = j["notes"].to_string();
    assert!(
        notes.contains("answered again after"),
        "{j:#}\n{}",
        r.stderr
    );
    let lanes = &node.bytes_per_connection;
    eprintln!("fabric: per lane {lanes:?}, {fab} bytes down eth1, of {bytes}; {notes}");
    assert_eq!(lanes.len(), 2, "no lane over the fabric: {node:#?}");
    assert!(
        lanes[1] >= bytes / 8 && fab >= bytes / 8,
        "the fabric lane carried {} bytes ({fab} bytes down eth1) of {bytes}: {node:#?}",
        lanes[1]
    );
}

/// Bytes an nft counter named `name` in table `inet xcount` of host `i`
/// has counted.
fn counted(f: &Fab, i: u32, name: &str) -> u64 {
    let out =
        f.c.exec(i, "nft")
            .args(["-j", "list", "counter", "inet", "xcount", name])
            .output()
            .expect("nft");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|e| e["counter"]["bytes"].as_u64())
        .unwrap_or(0)
}

/// Two receivers whose fabric cannot reach each other (each drops the
/// other's fabric address) while both reach the source over it: their
/// peer links fall back to management. Once the block is lifted
/// mid-push, each link tries the data address again, finds it answers,
/// and is made again over it, so the rest of what the two exchange goes
/// over the fabric (counted on h2's fabric from h1's fabric address).
#[test]
fn a_peer_link_over_management_moves_to_the_fabric_once_it_answers() {
    let Some(f) = Fab::start("pl", 2, 1..=2) else {
        return;
    };
    let (fab1, fab2) = (f.c.fabric_ip(1), f.c.fabric_ip(2));
    let block = |i: u32, other: &str| {
        nft(
            &f.c,
            i,
            &format!(
                "table inet xblock {{\n chain in {{ type filter hook input priority 0; ip saddr {other} drop\n }}\n chain out {{ type filter hook output priority 0; ip daddr {other} drop\n }}\n}}\n"
            ),
        )
    };
    block(1, &fab2);
    block(2, &fab1);
    nft(
        &f.c,
        2,
        &format!(
            "table inet xcount {{\n counter peer {{ }}\n chain in {{ type filter hook input priority -10; iifname \"eth1\" ip saddr {fab1} counter name \"peer\"\n }}\n}}\n"
        ),
    );
    let src = f.model("m", 32 * MIB, 183);
    let bytes = tree_bytes(&src);
    let to = data_addrs(&f.c, 1..=2);
    let mut cmd = push_from_source(&f.c, &src, &to, &f.key, &f.t.path().join("xdg"));
    cmd.args(["--limit-rate", "1MiB"]);
    let push = Proc::spawn(&mut cmd);
    // The event: a peer link was made over management (the receiver's
    // own warning).
    let over_mgmt = |i: u32| {
        fs::read_to_string(f.log(i))
            .unwrap_or_default()
            .contains("over management")
    };
    wait_until(
        "a peer link over management",
        Duration::from_secs(120),
        || over_mgmt(1) && over_mgmt(2),
    );
    let before = counted(&f, 2, "peer");
    for i in 1..=2 {
        nft(&f.c, i, "delete table inet xblock\n");
    }
    let r = push.wait(Duration::from_secs(180));
    r.assert_ok("xfer push with peer links back on the fabric");
    let (_, s) = push_json(&r);
    for (k, i) in (1..=2).enumerate() {
        assert!(s.nodes[k].ok, "{:#?}", s.nodes[k]);
        assert_same_tree(&src, &f.root(i).join("m"));
    }
    let moved = (1..=2)
        .filter(|&i| {
            fs::read_to_string(f.log(i))
                .unwrap_or_default()
                .contains("answers again; linking over it")
        })
        .count();
    let peer_fabric = counted(&f, 2, "peer") - before;
    eprintln!(
        "fabric: {peer_fabric} bytes from h1's fabric address reached h2 after the block was lifted, of {bytes}; {moved} link(s) moved"
    );
    assert!(
        moved >= 1,
        "no peer link moved to the fabric:\n{}",
        f.logs()
    );
    assert!(
        peer_fabric >= bytes / 16,
        "only {peer_fabric} bytes of {bytes} came from h1 over the fabric after the block:\n{}",
        f.logs()
    );
}

/// `--connections 2` applies to the links between receivers too: every
/// receiver's link to each of its peers is made over two connections
/// (each joined like the first; chunk requests spread over both), and
/// every copy is whole.
#[test]
fn connections_apply_to_peer_links_too() {
    let Some(f) = Fab::start("pc", 3, 1..=3) else {
        return;
    };
    let src = f.model("m", 24 * MIB, 185);
    let to = data_addrs(&f.c, 1..=3);
    let mut cmd = push_from_source(&f.c, &src, &to, &f.key, &f.t.path().join("xdg"));
    cmd.args(["--connections", "2"]);
    let r = run(&mut cmd, Duration::from_secs(180));
    r.assert_ok("xfer push --connections 2 to three receivers");
    let (_, s) = push_json(&r);
    for (k, i) in (1..=3).enumerate() {
        assert!(s.nodes[k].ok, "{:#?}", s.nodes[k]);
        assert_same_tree(&src, &f.root(i).join("m"));
        let log = fs::read_to_string(f.log(i)).unwrap_or_default();
        let linked = log.matches("linked over 2 connections").count();
        assert!(
            linked >= 1,
            "h{i} made no peer link over 2 connections:\n{}",
            f.logs()
        );
    }
}
