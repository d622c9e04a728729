//! `xfer demo`: a local multi-node run with no setup.
//!
//! Generates a model-like tree (safetensors shards, config files, a nested
//! folder, an empty file), starts agents on 127.0.0.2, 127.0.0.3, ... as real
//! child processes, pushes the model to all of them with progress bars (the
//! agents pass chunks to each other), then verifies every node and prints
//! its root hash, where its bytes came from, and how much the source sent.
//!
//! It ends with the launcher: it writes the cluster file of these nodes
//! (fabric = loopback, a vLLM launch of the demo model) and runs
//! `xfer-launch check` and `xfer-launch plan` on it. Engines need the model
//! at one absolute path on every node, so when the machine allows it
//! (root, or unprivileged user namespaces) each agent runs in a mount
//! namespace of its own where its node folder is mounted at the same path,
//! as on separate machines.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rand::{RngCore, SeedableRng};

use xfer::flow::push::{push, PushOptions};
use xfer::store::verify::verify;
use xfer::util::progress::Progress;
use xfer_proto::units::Bytes;

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub size: u64,
    pub nodes: usize,
    pub dir: PathBuf,
    pub chunk_size: u64,
}

const MARKER: &str = ".xfer-demo";

/// Writes a model-like tree of about `size` bytes under `dir`.
pub fn generate_model(dir: &Path, size: u64, seed: u64) -> Result<()> {
    fs::create_dir_all(dir.join("original"))?;
    let shards = 4u64;
    let small = 1 << 20;
    let shard = size.saturating_sub(2 * small) / shards;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut write = |path: PathBuf, len: u64| -> Result<()> {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, fs::File::create(&path)?);
        let mut buf = vec![0u8; 1 << 20];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            rng.fill_bytes(&mut buf[..n]);
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        f.flush()?;
        Ok(())
    };
    let mut weight_map = Vec::new();
    for i in 1..=shards {
        let name = format!("model-{i:05}-of-{shards:05}.safetensors");
        write(dir.join(&name), shard + i * 4099)?;
        weight_map.push(format!("\"layers.{i}.weight\": \"{name}\""));
    }
    fs::write(
        dir.join("model.safetensors.index.json"),
        format!(
            "{{\"metadata\": {{}}, \"weight_map\": {{{}}}}}\n",
            weight_map.join(", ")
        ),
    )?;
    fs::write(
        dir.join("config.json"),
        "{\"architectures\": [\"DemoForCausalLM\"], \"hidden_size\": 4096, \"torch_dtype\": \"float8_e4m3fn\"}\n",
    )?;
    write(dir.join("tokenizer.json"), small)?;
    write(dir.join("original/consolidated.00.pth"), small)?;
    fs::write(dir.join("original/params.json"), "{\"dim\": 4096}\n")?;
    fs::write(dir.join("generation_config.json"), "")?;
    Ok(())
}

/// An agent child process, killed when dropped.
struct Agent {
    child: Child,
    addr: String,
    root: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How agents get one model path each: the `unshare` arguments that give
/// an agent a private mount namespace, if this machine allows one.
fn mount_namespace() -> Option<Vec<&'static str>> {
    let tries: [&[&'static str]; 2] = [
        &["--mount", "--propagation", "private"],
        &[
            "--user",
            "--map-root-user",
            "--mount",
            "--propagation",
            "private",
        ],
    ];
    tries.into_iter().map(|t| t.to_vec()).find(|args| {
        Command::new("unshare")
            .args(args)
            .args([
                "sh",
                "-c",
                "mount -t tmpfs none /mnt 2>/dev/null || mount --bind / /mnt",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Starts an agent on `ip` with its models in `root`; with `shared`, in a
/// mount namespace of its own where `root` is mounted at `shared.1`.
fn start_agent(
    ip: &str,
    root: &Path,
    key: &Path,
    shared: Option<(&[&str], &Path)>,
) -> Result<Agent> {
    let exe = std::env::current_exe()?;
    // The agent sees its root at `at` inside a mount namespace, or as is.
    let (mut cmd, agent_root) = match shared {
        Some((unshare, at)) => {
            let mut c = Command::new("unshare");
            c.args(unshare).args([
                "sh",
                "-c",
                r#"mount --bind "$1" "$2" && shift 2 && exec "$@""#,
                "sh",
            ]);
            c.arg(root).arg(at).arg(&exe);
            (c, at)
        }
        None => (Command::new(exe), root),
    };
    cmd.args([
        "serve",
        "--allow-launch",
        "--listen",
        &format!("{ip}:0"),
        "--root",
    ])
    .arg(agent_root);
    let mut child = cmd
        .arg("--key")
        .arg(key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start an agent process")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let addr = line
        .split_whitespace()
        .nth(4)
        .with_context(|| format!("agent on {ip} did not start: {line:?}"))?
        .to_string();
    Ok(Agent {
        child,
        addr,
        root: root.to_path_buf(),
    })
}

/// Runs the demo and returns whether every node verified.
pub async fn run(opts: &DemoOptions) -> Result<bool> {
    if opts.nodes == 0 || opts.nodes > 200 {
        bail!("--nodes must be between 1 and 200");
    }
    let dir = &opts.dir;
    if dir.exists() {
        if !dir.join(MARKER).exists() {
            bail!(
                "{} exists and is not an xfer demo folder; pass another --dir",
                dir.display()
            );
        }
        fs::remove_dir_all(dir)?;
    }
    fs::create_dir_all(dir)?;
    fs::write(dir.join(MARKER), "")?;
    let key = dir.join("cluster.key");
    xfer::config::auth::keygen(&key, false)?;
    let src = dir.join("source/demo-model");
    println!(
        "generating a {} model-like tree in {}",
        Bytes(opts.size),
        src.display()
    );
    generate_model(&src, opts.size, 42)?;

    let hub = dir.join("hub");
    let ns = mount_namespace();
    if ns.is_some() {
        fs::create_dir_all(&hub)?;
    }
    let mut agents = Vec::new();
    for i in 0..opts.nodes {
        let ip = format!("127.0.0.{}", i + 2);
        let root = dir.join(format!("node{}", i + 1));
        fs::create_dir_all(&root)?;
        let shared = ns.as_deref().map(|u| (u, hub.as_path()));
        agents.push(start_agent(&ip, &root, &key, shared)?);
    }
    println!(
        "started {} agents: {}",
        agents.len(),
        agents
            .iter()
            .map(|a| a.addr.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let popts = PushOptions {
        src: src.clone(),
        to: agents
            .iter()
            .map(|a| xfer::flow::route::Destination::agent(&a.addr))
            .collect(),
        me: None,
        routes: None,
        key: key.clone(),
        name: None,
        chunk_size: opts.chunk_size,
        limit_rate: None,
        connect_timeout: Duration::from_secs(5),
        rehash: true,
        connections: 1,
        nic: None,
        peers: xfer::engine::topology::DEFAULT_DEGREE,
    };
    let summary = push(&popts, &Progress::new(true)).await?;
    let manifest = xfer::store::scan::scan(&src, opts.chunk_size, &|_| {})?.manifest;
    println!();
    println!(
        "{:<18} {:<8} {:<66} {:>11} {:>11}",
        "node", "verify", "root", "from source", "from peers"
    );
    let mut all_ok = summary.ok();
    for (a, n) in agents.iter().zip(&summary.nodes) {
        let report = verify(&a.root.join(&summary.name), &manifest)?;
        all_ok &= report.ok;
        println!(
            "{:<18} {:<8} {:<66} {:>11} {:>11}",
            a.addr,
            if report.ok { "ok" } else { "FAILED" },
            report.root,
            Bytes(n.from_source).to_string(),
            Bytes(n.from_peers).to_string()
        );
        if let Some(e) = &n.error {
            println!("  error: {e}");
        }
    }
    let send_s = summary.duration_s - summary.hash_s;
    println!();
    println!(
        "source root {}\n{} to {} nodes in {:.2}s (+{:.2}s hashing): {:.0} MB/s per node, {:.0} MB/s delivered; the source sent {} ({:.2}x the model), the nodes passed the rest to each other",
        summary.root,
        Bytes(summary.bytes_total),
        opts.nodes,
        send_s,
        summary.hash_s,
        summary.bytes_total as f64 / send_s / 1e6,
        (summary.bytes_total * opts.nodes as u64) as f64 / send_s / 1e6,
        Bytes(summary.bytes_sent),
        summary.bytes_sent as f64 / summary.bytes_total.max(1) as f64,
    );
    if all_ok {
        all_ok &= launch_check(
            dir,
            &agents,
            &key,
            ns.is_some().then_some(hub.as_path()),
            &summary.name,
        );
    }
    Ok(all_ok)
}

/// Writes the cluster file of the demo's nodes and runs `xfer-launch check`
/// and `plan` on it. Returns false only if a check failed that should pass
/// on any machine (everything but the engine's version and the GPUs).
fn launch_check(dir: &Path, agents: &[Agent], key: &Path, hub: Option<&Path>, model: &str) -> bool {
    println!();
    let Some(hub) = hub else {
        println!(
            "launch: skipped `xfer-launch check`: the engines need the model at one path on every node, and on one machine that takes a mount namespace per agent, which needs root or unprivileged user namespaces (`unshare --user --map-root-user --mount` fails here)"
        );
        return true;
    };
    let launcher = std::env::current_exe()
        .ok()
        .map(|e| e.with_file_name("xfer-launch"))
        .filter(|p| p.exists());
    let Some(launcher) = launcher else {
        println!("launch: skipped: xfer-launch is not built next to this xfer; build both with `cargo build --release`");
        return true;
    };
    let mut file = format!("key = \"{}\"\n", key.display());
    for (i, a) in agents.iter().enumerate() {
        let ip = a.addr.rsplit_once(':').map_or(a.addr.as_str(), |(h, _)| h);
        file += &format!(
            "\n[[node]]\nname = \"node{}\"\nagent = \"{}\"\nroot = \"{}\"\nfabric_if = \"lo\"\nfabric_ip = \"{ip}\"\n",
            i + 1,
            a.addr,
            hub.display()
        );
    }
    file += &format!(
        "\n[launch]\nengine = \"vllm\"\nmodel = \"{}\"\ntp = 1\n",
        hub.join(model).display()
    );
    let path = dir.join("cluster.toml");
    if let Err(e) = fs::write(&path, file) {
        println!("launch: cannot write {}: {e}", path.display());
        return false;
    }
    println!(
        "launch: the cluster file of these nodes is {}; checking it:",
        path.display()
    );
    println!("$ xfer-launch check --cluster {}", path.display());
    let shown = Command::new(&launcher)
        .args(["check", "--cluster"])
        .arg(&path)
        .output();
    let table = match &shown {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => format!("cannot run {}: {e}\n", launcher.display()),
    };
    print!("{table}");
    // FAIL rows other than the engine's version and the GPUs, which
    // depend on what this machine has installed.
    let mut unexpected: Vec<String> = table
        .lines()
        .filter(|l| l.starts_with("FAIL"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .take(2)
                .collect::<Vec<_>>()
                .join(" on ")
        })
        .filter(|c| !c.starts_with("versions") && !c.starts_with("gpu"))
        .collect();
    if !table.contains(" passed, ") {
        unexpected.push("xfer-launch check did not run".into());
    }
    if unexpected.is_empty() {
        println!("launch: every node holds the same verified weights at one path, reaches the others over its fabric, and has its ports free; `versions` fails only if vLLM is not installed here (on GPU nodes it must be, in the same version everywhere)");
    } else {
        println!("launch: unexpected failures: {}", unexpected.join(", "));
    }
    println!();
    println!("$ xfer-launch plan --cluster {}", path.display());
    match Command::new(&launcher)
        .args(["plan", "--cluster"])
        .arg(&path)
        .output()
    {
        Ok(o) => print!("{}", String::from_utf8_lossy(&o.stdout)),
        Err(e) => println!("cannot run {}: {e}", launcher.display()),
    }
    unexpected.is_empty()
}
