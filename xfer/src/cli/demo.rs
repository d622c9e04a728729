//! `xfer demo`: a local multi-node run with no setup.
//!
//! Generates a model-like repo (safetensors shards, config files, a nested
//! folder, an empty file) and serves it from a local Hub look-alike
//! ([`xfer::hub_lookalike`]) that caps each connection like a CDN. Then, with
//! agents on 127.0.0.2, 127.0.0.3, ... as real child processes:
//!
//! 1. the download alone: `xfer pull` into a scratch cache;
//! 2. S/B: that folder pushed to as many fresh agents (the fan-out alone);
//! 3. streamed: `xfer pull --to` the demo's agents, every verified chunk
//!    fanned out while its file still downloads;
//!
//! and prints the three times and the streamed one's ratio to the larger of
//! the first two, with each node's root and where its bytes came from.
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

use std::time::Instant;

use xfer::flow::pull_fanout::{pull_and_fan_out, FanOut};
use xfer::flow::push::{push, PushOptions};
use xfer::hub::env::HubEnv;
use xfer::hub::pull::PullOptions;
use xfer::hub_lookalike::DemoHub;
use xfer::store::verify::verify;
use xfer::util::progress::Progress;
use xfer_proto::manifest::ChunkSize;
use xfer_proto::repo::{RepoRef, RepoType};
use xfer_proto::units::Bytes;

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub size: u64,
    pub nodes: usize,
    pub dir: PathBuf,
    pub chunk_size: ChunkSize,
    /// The Hub look-alike's cap per connection, bytes per second.
    pub hub_rate: u64,
    /// End by serving a tiny model with real vLLM when it is installed.
    pub engine: bool,
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
    // The engines on the agents' PATH, when they are installed.
    if let Some(path) = super::demo_engine::agent_path() {
        cmd.env("PATH", path);
    }
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

/// The demo's repo on its Hub look-alike.
const REPO: &str = "xfer-demo/model";
/// Its folder in an HF cache (and on the agents).
const CACHE_NAME: &str = "models--xfer-demo--model";

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
    let src = dir.join("repos").join(REPO);
    println!(
        "generating a {} model-like repo in {}",
        Bytes(opts.size),
        src.display()
    );
    generate_model(&src, opts.size, 42)?;
    let hub = DemoHub::start(&src, REPO, opts.hub_rate).await?;
    println!(
        "serving it as {REPO} from a local Hub look-alike at {}, each connection capped at {}/s like a CDN",
        hub.endpoint(),
        Bytes(opts.hub_rate)
    );

    // 1. The download alone.
    println!("\n1. the download alone: xfer pull into a scratch cache");
    let alone = dir.join("alone-cache");
    let t = Instant::now();
    let (pulled, _) = xfer::hub::pull::pull(
        &pull_options(None),
        &hub_env(&hub, &alone),
        &Progress::new(true),
        None,
        None,
    )
    .await?;
    let download_s = t.elapsed().as_secs_f64();
    println!("   {} in {download_s:.2}s", Bytes(pulled.bytes_downloaded));

    // 2. S/B: the same folder pushed to fresh nodes.
    println!(
        "\n2. S/B: xfer push of that folder to {} fresh nodes",
        opts.nodes
    );
    let sb_dir = dir.join("s-over-b");
    let fresh = start_nodes(&sb_dir, opts.nodes, &key, None)?;
    let mut popts = push_options(&fresh, &key, opts.chunk_size)?;
    popts.src = alone.join(CACHE_NAME);
    let bars = Progress::new(true);
    let pushed = push(&popts, &bars).await;
    bars.end();
    let pushed = pushed?;
    let fan_out_s = pushed.duration_s - pushed.hash_s;
    let mut all_ok = pushed.ok();
    println!("   {fan_out_s:.2}s (+{:.2}s hashing)", pushed.hash_s);
    drop(fresh);
    let _ = fs::remove_dir_all(&sb_dir);
    let _ = fs::remove_dir_all(&alone);

    // 3. Streamed: pull once, every chunk fanned out as it lands.
    let shared = dir.join("hub");
    let ns = mount_namespace();
    if ns.is_some() {
        fs::create_dir_all(&shared)?;
    }
    let agents = start_nodes(
        dir,
        opts.nodes,
        &key,
        ns.as_deref().map(|u| (u, shared.as_path())),
    )?;
    println!(
        "\n3. streamed: xfer pull --to {} agents ({}): each verified chunk goes out as it lands",
        agents.len(),
        agents
            .iter()
            .map(|a| a.addr.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let t = Instant::now();
    let s = pull_and_fan_out(
        pull_options(Some(opts.chunk_size)),
        hub_env(&hub, &dir.join("source-cache")),
        push_options(&agents, &key, opts.chunk_size)?,
        FanOut::Stream,
        Progress::new(true),
        None,
    )
    .await?;
    let total_s = t.elapsed().as_secs_f64();
    all_ok &= s.ok();
    println!();
    println!(
        "{:<18} {:<8} {:<66} {:>10} {:>11} {:>11}",
        "node", "verify", "root", "first (s)", "from source", "from peers"
    );
    for (a, (n, st)) in agents.iter().zip(s.nodes.iter().zip(&s.streamed)) {
        let report = verify(&a.root.join(&s.name), &s.manifest)?;
        all_ok &= report.ok && n.ok;
        println!(
            "{:<18} {:<8} {:<66} {:>10} {:>11} {:>11}",
            a.addr,
            if report.ok && n.ok { "ok" } else { "FAILED" },
            report.root,
            n.first_byte_s.map_or("-".into(), |f| format!("{f:.2}")),
            Bytes(st.from_source + n.from_source).to_string(),
            Bytes(st.from_peers + n.from_peers).to_string()
        );
        if let Some(e) = n.error.as_ref().or(st.error.as_ref()) {
            println!("  error: {e}");
        }
    }
    let ideal = download_s.max(fan_out_s);
    println!();
    println!(
        "download alone {download_s:.2}s, S/B {fan_out_s:.2}s (push to {} nodes), streamed pull to {} nodes {total_s:.2}s = {:.2} x max(download, S/B); pulling then pushing takes {:.2}s = {:.2} x",
        opts.nodes,
        opts.nodes,
        total_s / ideal,
        download_s + fan_out_s,
        (download_s + fan_out_s) / ideal
    );
    println!(
        "root {}; the source sent {:.2}x the model, the nodes passed the rest to each other; every node holds the cache huggingface_hub loads offline",
        s.root, s.source_sent_x
    );
    if let Some(cs) = s.pull.chunk_size {
        println!(
            "chunks of {} ({} for this {} model; --chunk-size sets it)",
            Bytes(cs),
            match opts.chunk_size {
                ChunkSize::Auto => "auto",
                ChunkSize::Fixed(_) => "fixed",
            },
            Bytes(opts.size)
        );
    }
    println!(
        "the Hub look-alike served {} in all: the model once for the download alone and once for the streamed pull",
        Bytes(hub.bytes_served())
    );
    if all_ok {
        let model = format!("{CACHE_NAME}/snapshots/{}", s.pull.commit);
        all_ok &= launch_check(
            dir,
            &agents,
            &key,
            ns.is_some().then_some(shared.as_path()),
            &model,
        );
    }
    let launcher = std::env::current_exe()
        .ok()
        .map(|e| e.with_file_name("xfer-launch"))
        .filter(|p| p.exists());
    if let (true, true, Some(launcher), true) = (
        all_ok,
        opts.engine,
        launcher,
        ns.is_some() && agents.len() >= 2,
    ) {
        let two = &agents[..2];
        let mut popts = push_options(two, &key, opts.chunk_size)?;
        popts.src = dir.join("tiny-llama-src");
        popts.name = Some(xfer_proto::names::ModelName::new("tiny").map_err(anyhow::Error::msg)?);
        let pushing = async { Ok(push(&popts, &Progress::new(true)).await?.ok()) };
        let nodes: Vec<super::demo_engine::Node> = two
            .iter()
            .map(|a| super::demo_engine::Node { addr: &a.addr })
            .collect();
        all_ok &=
            super::demo_engine::serve_tiny_model(dir, &launcher, &key, &shared, &nodes, pushing)
                .await;
    }
    Ok(all_ok)
}

/// What the demo says of the engine rows on a machine without vLLM.
const NO_ENGINE: &str = "no vLLM here, so the versions and rendezvous rows cannot pass (nothing else is wrong); `scripts/test.sh` installs vLLM's CPU build, then `xfer demo` serves a model across two nodes";

/// The demo's pull: its repo, 8 connections, chunk hashes at `chunk_size`.
fn pull_options(chunk_size: Option<ChunkSize>) -> PullOptions {
    PullOptions {
        repo: RepoRef::parse(REPO, RepoType::Model).expect("the demo's repo id is valid"),
        include: Vec::new(),
        exclude: Vec::new(),
        local_dir: None,
        connections: 8,
        part_size: 16 << 20,
        chunk_size,
        intake: Default::default(),
        before_change: None,
        stats: None,
        pin: None,
    }
}

fn hub_env(hub: &DemoHub, cache: &Path) -> HubEnv {
    HubEnv {
        endpoint: hub.endpoint(),
        token: None,
        cache_root: cache.to_path_buf(),
    }
}

/// Starts `n` agents on 127.0.0.2, ... with roots `dir/node1`, ...
fn start_nodes(
    dir: &Path,
    n: usize,
    key: &Path,
    shared: Option<(&[&str], &Path)>,
) -> Result<Vec<Agent>> {
    (0..n)
        .map(|i| {
            let root = dir.join(format!("node{}", i + 1));
            fs::create_dir_all(&root)?;
            start_agent(&format!("127.0.0.{}", i + 2), &root, key, shared)
        })
        .collect()
}

fn push_options(agents: &[Agent], key: &Path, chunk_size: ChunkSize) -> Result<PushOptions> {
    Ok(PushOptions {
        src: PathBuf::new(),
        to: agents
            .iter()
            .map(|a| xfer::flow::route::Destination::agent(&a.addr))
            .collect(),
        me: None,
        routes: None,
        cred: std::sync::Arc::new(xfer::config::auth::Credential::load(key)?),
        name: Some(xfer_proto::names::ModelName::new(CACHE_NAME).map_err(anyhow::Error::msg)?),
        chunk_size,
        limit_rate: None,
        connect_timeout: Duration::from_secs(5),
        rehash: true,
        connections: 1,
        nic: None,
        peers: xfer::engine::topology::DEFAULT_DEGREE,
    })
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
    // depend on what this machine has installed, and without vLLM its
    // rendezvous (the probe runs the engine's torch).
    let engine_here = super::demo_engine::engine_bin().is_some();
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
        .filter(|c| engine_here || !c.starts_with("rendezvous"))
        .collect();
    if !table.contains(" passed, ") {
        unexpected.push("xfer-launch check did not run".into());
    }
    if !engine_here {
        println!("launch: {NO_ENGINE}");
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
