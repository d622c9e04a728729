//! The `xfer` command line.

mod cli;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use xfer::util::progress::Progress;
use xfer_proto::manifest::{Entry, Manifest};
use xfer_proto::units::{parse_size, Bytes};

#[derive(Parser)]
#[command(
    name = "xfer",
    version,
    about = "Move model checkpoints to every GPU node at line rate, verified chunk by chunk."
)]
struct Cli {
    /// Log filter, e.g. `info` or `xfer=debug` (overrides RUST_LOG).
    #[arg(long, global = true)]
    log: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create the cluster credential (copy the same file to every node).
    Keygen {
        #[arg(long)]
        out: PathBuf,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Describe a directory: per-file BLAKE3 (as b3sum prints it) and the root hash.
    Manifest {
        dir: PathBuf,
        /// Print the full manifest as JSON.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = "4MiB", value_parser = parse_chunk)]
        chunk_size: u64,
    },
    /// Run the node agent: receive models into ROOT and serve them to peers.
    Serve {
        #[arg(long, default_value = "0.0.0.0:7470")]
        listen: std::net::SocketAddr,
        #[arg(long)]
        root: PathBuf,
        #[arg(long, env = "XFER_KEY")]
        key: PathBuf,
        /// Chunk requests in flight per peer.
        #[arg(long, default_value_t = 16)]
        window: u32,
        /// Re-hash complete models every SECS seconds and repair damaged
        /// files from the other nodes of their jobs (0: never).
        #[arg(long, default_value_t = 21600)]
        verify_every: u64,
        /// Serve Prometheus metrics at /metrics on PORT (127.0.0.1) or IP:PORT.
        #[arg(long, value_parser = xfer::util::metrics::parse_addr)]
        metrics: Option<std::net::SocketAddr>,
        /// The data plane: RDMA when this node has an active RDMA port (and
        /// this build can drive it), else QUIC; `rdma` refuses without one.
        #[arg(long, value_enum, default_value_t = xfer::transport::select::TransportChoice::Auto)]
        transport: xfer::transport::select::TransportChoice,
    },
    /// Hand a sync job to the cluster's agents and return (they own it from then on).
    Sync {
        /// An absolute path on the source node, or ORG/NAME[@REV] to pull from the Hub.
        source: String,
        #[arg(long)]
        cluster: PathBuf,
        /// Nodes that must end with the model (default: every node).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// The node holding the path, or pulling the repo (default: the first of --nodes).
        #[arg(long)]
        from: Option<String>,
        /// Name on the nodes (default: the folder's name; Hub repos use models--org--name).
        #[arg(long)]
        name: Option<String>,
        #[arg(long, default_value = "model", value_parser = parse_repo_type)]
        repo_type: xfer::hub::repo::RepoType,
        #[arg(long, default_value = "4MiB", value_parser = parse_chunk)]
        chunk_size: u64,
        /// Cap the source's send rate, e.g. 500MiB (bytes per second).
        #[arg(long, value_parser = parse_size)]
        limit_rate: Option<u64>,
        /// Follow the job with progress bars until it completes (Ctrl-C leaves it running).
        #[arg(long)]
        wait: bool,
        /// The data plane the source node offers: RDMA where its agent has
        /// it (auto), never (quic), or fail the job without it (rdma).
        #[arg(long, value_enum, default_value_t = xfer::transport::select::TransportChoice::Auto)]
        transport: xfer::transport::select::TransportChoice,
        #[arg(long)]
        json: bool,
    },
    /// One table of every node's models: root, state, progress, rate, ETA, last error.
    Status {
        #[arg(long)]
        cluster: PathBuf,
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        #[arg(long)]
        json: bool,
        /// Refresh every second until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Stop a sync job on every node (what was delivered stays).
    Cancel {
        job: String,
        #[arg(long)]
        cluster: PathBuf,
    },
    /// Delete a model from the nodes' roots.
    Rm {
        name: String,
        #[arg(long)]
        cluster: PathBuf,
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Deliver a directory to one or more agents.
    Push {
        src: PathBuf,
        /// Agents, comma separated: HOST[:PORT],...
        #[arg(long, value_delimiter = ',', required = true)]
        to: Vec<String>,
        #[arg(long, env = "XFER_KEY")]
        key: PathBuf,
        /// Name on the agents (default: the directory's name).
        #[arg(long)]
        name: Option<String>,
        /// Print one JSON summary on stdout.
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = "4MiB", value_parser = parse_chunk)]
        chunk_size: u64,
        /// Cap the total send rate, e.g. 500MiB (bytes per second).
        #[arg(long, value_parser = parse_size)]
        limit_rate: Option<u64>,
        /// Seconds to wait for each agent to answer.
        #[arg(long, default_value_t = 5)]
        connect_timeout: u64,
        /// Re-read every file instead of trusting the hash cache.
        #[arg(long)]
        rehash: bool,
        /// The data plane: RDMA when this node has an active RDMA port (and
        /// this build can drive it), else QUIC; `rdma` refuses without one.
        #[arg(long, value_enum, default_value_t = xfer::transport::select::TransportChoice::Auto)]
        transport: xfer::transport::select::TransportChoice,
    },
    /// Download a Hugging Face repo (or HF_ENDPOINT's mirror) into the HF cache, verified.
    Pull {
        /// ORG/NAME[@REVISION] (a branch, tag or commit; default main).
        repo: String,
        #[arg(long, default_value = "model", value_parser = parse_repo_type)]
        repo_type: xfer::hub::repo::RepoType,
        /// Only files matching this glob (repeatable), e.g. '*.safetensors'.
        #[arg(long)]
        include: Vec<String>,
        /// Skip files matching this glob (repeatable), e.g. 'original/*'.
        #[arg(long)]
        exclude: Vec<String>,
        /// Write plain files into DIR instead of the HF cache layout.
        #[arg(long)]
        local_dir: Option<PathBuf>,
        /// Parallel HTTP connections (ranged requests across and within files).
        #[arg(long, default_value_t = 16)]
        connections: usize,
        /// Bytes per ranged request.
        #[arg(long, default_value = "16MiB", value_parser = parse_size)]
        part_size: u64,
        /// Also deliver to these agents while downloading: HOST[:PORT],...
        /// (their --root can be their HF cache).
        #[arg(long, value_delimiter = ',')]
        to: Vec<String>,
        /// The cluster credential, needed with --to.
        #[arg(long, env = "XFER_KEY")]
        key: Option<PathBuf>,
        #[arg(long, default_value = "4MiB", value_parser = parse_chunk)]
        chunk_size: u64,
        /// Seconds to wait for each agent to answer.
        #[arg(long, default_value_t = 5)]
        connect_timeout: u64,
        /// Print one JSON summary on stdout.
        #[arg(long)]
        json: bool,
        /// The data plane: RDMA when this node has an active RDMA port (and
        /// this build can drive it), else QUIC; `rdma` refuses without one.
        #[arg(long, value_enum, default_value_t = xfer::transport::select::TransportChoice::Auto)]
        transport: xfer::transport::select::TransportChoice,
    },
    /// Copy a complete model from an agent into a local root (ROOT/NAME).
    Fetch {
        name: String,
        /// The agent holding the model: HOST[:PORT].
        #[arg(long)]
        from: String,
        #[arg(long)]
        root: PathBuf,
        #[arg(long, env = "XFER_KEY")]
        key: PathBuf,
        #[arg(long)]
        json: bool,
        #[arg(long, default_value_t = 5)]
        connect_timeout: u64,
    },
    /// Re-hash a received tree against its manifest.
    Verify {
        dir: PathBuf,
        /// Manifest from `xfer manifest --json` (default: the one the agent recorded).
        #[arg(long)]
        manifest: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// What this node offers the data plane: RDMA devices and their GIDs,
    /// the interfaces a fabric could use, the UDP socket buffer limits.
    Doctor {
        /// Print one JSON object with the same data.
        #[arg(long)]
        json: bool,
        /// The sysfs root to read (tests point it at a fake tree).
        #[arg(long, default_value = "/sys", hide = true)]
        sys: PathBuf,
        /// The procfs root to read (tests point it at a fake tree).
        #[arg(long, default_value = "/proc", hide = true)]
        proc: PathBuf,
    },
    /// Local multi-node demo: generate a model, start agents on 127.0.0.x, push, verify.
    Demo {
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        size: u64,
        #[arg(long, default_value_t = 4)]
        nodes: usize,
        #[arg(long, default_value = "/tmp/xfer-demo")]
        dir: PathBuf,
        #[arg(long, default_value = "4MiB", value_parser = parse_chunk)]
        chunk_size: u64,
    },
}

fn parse_chunk(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    if xfer_proto::hash::is_valid_chunk_size(n) {
        Ok(n)
    } else {
        Err(format!(
            "{s} is not a power of two between 64KiB and 256MiB"
        ))
    }
}

fn parse_repo_type(s: &str) -> Result<xfer::hub::repo::RepoType, String> {
    xfer::hub::repo::RepoType::parse(s)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default = match cli.cmd {
        Cmd::Serve { .. } => "info",
        _ => "warn",
    };
    let filter = cli
        .log
        .clone()
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| default.to_string());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(run(cli.cmd)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cmd: Cmd) -> Result<ExitCode> {
    match cmd {
        Cmd::Keygen { out, force } => {
            let cred = xfer::config::auth::keygen(&out, force)?;
            println!(
                "wrote {} (cluster {}); copy it to every node and pass it as --key",
                out.display(),
                cred.cluster_id().short()
            );
        }
        Cmd::Manifest {
            dir,
            json,
            chunk_size,
        } => {
            let started = Instant::now();
            let tree = tokio::task::spawn_blocking(move || {
                xfer::store::scan::scan(&dir, chunk_size, &|_| {})
            })
            .await??;
            let m = tree.manifest;
            if json {
                serde_json::to_writer(std::io::stdout().lock(), &m.to_doc())?;
                println!();
            } else {
                print_manifest(&m, started.elapsed());
            }
        }
        Cmd::Serve {
            listen,
            root,
            key,
            window,
            verify_every,
            metrics,
            transport,
        } => {
            let nic = xfer::transport::select::choose(transport)?;
            let scheduler = xfer::engine::scheduler::Config {
                window: window.max(1),
                ..Default::default()
            };
            xfer::agent::run(xfer::agent::AgentOptions {
                listen,
                root,
                key,
                scheduler,
                verify_every: (verify_every > 0).then(|| Duration::from_secs(verify_every)),
                metrics,
                nic,
            })
            .await?;
        }
        Cmd::Sync {
            source,
            cluster,
            nodes,
            from,
            name,
            repo_type,
            chunk_size,
            limit_rate,
            wait,
            json,
            transport,
        } => {
            let cluster = xfer::config::cluster::Cluster::load(&cluster)?;
            let req = xfer::agent::sync::client::SyncRequest {
                source,
                nodes,
                from,
                name,
                repo_type,
                chunk_size,
                limit_rate,
                transport,
            };
            let spec = xfer::agent::sync::client::sync(&cluster, &req).await?;
            if !wait {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"job": spec.id, "name": spec.name.to_string()})
                    );
                } else {
                    println!("{}", spec.id);
                    eprintln!(
                        "job {} handed to {} node(s): {} from {}; follow it with `xfer status --cluster ...`",
                        spec.id,
                        spec.members.len(),
                        spec.name,
                        spec.source_node
                    );
                }
                return Ok(ExitCode::SUCCESS);
            }
            eprintln!("job {} (Ctrl-C stops following; the job goes on)", spec.id);
            let root =
                xfer::agent::sync::client::wait(&cluster, &spec, &Progress::new(!json)).await?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"job": spec.id, "name": spec.name.to_string(), "root": root})
                );
            } else {
                println!(
                    "{}: {} complete on {} node(s), root {root}",
                    spec.id,
                    spec.name,
                    spec.members.len()
                );
            }
        }
        Cmd::Status {
            cluster,
            nodes,
            json,
            watch,
        } => {
            let cluster = xfer::config::cluster::Cluster::load(&cluster)?;
            loop {
                let reports = xfer::agent::sync::client::status(&cluster, &nodes).await?;
                if json {
                    serde_json::to_writer(std::io::stdout().lock(), &reports)?;
                    println!();
                } else {
                    if watch && std::io::stdout().is_terminal() {
                        print!("\x1b[2J\x1b[H");
                    }
                    print!("{}", xfer::agent::sync::client::render(&reports));
                    for r in &reports {
                        for j in r.status.iter().flat_map(|s| &s.jobs) {
                            if r.status.as_ref().and_then(|s| s.node.as_deref())
                                == Some(j.source_node.as_str())
                            {
                                println!(
                                    "job {} {} from {} to {}: {}{}",
                                    j.id,
                                    j.name,
                                    j.source_node,
                                    j.nodes.join(","),
                                    j.shown(),
                                    j.last_error
                                        .as_deref()
                                        .map(|e| format!(" (last error: {e})"))
                                        .unwrap_or_default()
                                );
                            }
                        }
                    }
                }
                if !watch {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        Cmd::Cancel { job, cluster } => {
            let cluster = xfer::config::cluster::Cluster::load(&cluster)?;
            let replies = xfer::agent::sync::client::cancel(&cluster, &job).await?;
            let mut known = 0;
            for (node, r) in &replies {
                match r {
                    Ok(true) => {
                        known += 1;
                        println!("{node}: cancelled");
                    }
                    Ok(false) => println!("{node}: did not know job {job}"),
                    Err(e) => println!("{node}: unreachable: {e}"),
                }
            }
            if known == 0 {
                anyhow::bail!("no node knew job {job}; list jobs with `xfer status`");
            }
        }
        Cmd::Rm {
            name,
            cluster,
            nodes,
            yes,
        } => {
            let cluster = xfer::config::cluster::Cluster::load(&cluster)?;
            let name = xfer_proto::names::ModelName::new(&name).map_err(anyhow::Error::msg)?;
            let targets: Vec<String> = cluster
                .select(&nodes)?
                .iter()
                .map(|n| n.name.to_string())
                .collect();
            if !yes {
                if !std::io::stdin().is_terminal() {
                    anyhow::bail!(
                        "xfer rm deletes {name} from {}; pass --yes to confirm",
                        targets.join(", ")
                    );
                }
                eprint!("delete {name} from {}? [y/N] ", targets.join(", "));
                let mut answer = String::new();
                std::io::stdin().read_line(&mut answer)?;
                if !matches!(answer.trim(), "y" | "Y" | "yes") {
                    anyhow::bail!("not confirmed; nothing deleted");
                }
            }
            let replies = xfer::agent::sync::client::remove(&cluster, &nodes, &name).await?;
            let mut failed = false;
            for (node, r) in &replies {
                match r {
                    Ok(true) => println!("{node}: removed {name}"),
                    Ok(false) => println!("{node}: had no {name}"),
                    Err(e) => {
                        failed = true;
                        println!("{node}: FAILED: {e}");
                    }
                }
            }
            if failed {
                return Ok(ExitCode::FAILURE);
            }
        }
        Cmd::Push {
            transport,
            src,
            to,
            key,
            name,
            json,
            chunk_size,
            limit_rate,
            connect_timeout,
            rehash,
        } => {
            let nic = xfer::transport::select::choose(transport)?;
            let opts = xfer::flow::push::PushOptions {
                src,
                to,
                key,
                name,
                chunk_size,
                limit_rate,
                connect_timeout: Duration::from_secs(connect_timeout),
                rehash,
                nic,
            };
            let progress = Progress::new(!json);
            let s = xfer::flow::push::push(&opts, &progress).await?;
            if json {
                serde_json::to_writer(std::io::stdout().lock(), &s)?;
                println!();
            } else {
                let send_s = (s.duration_s - s.hash_s).max(1e-9);
                for n in &s.nodes {
                    match &n.error {
                        None => println!(
                            "{}: ok, {} from the source, {} from peers, already held {}",
                            n.addr,
                            Bytes(n.bytes_sent),
                            Bytes(n.from_peers),
                            Bytes(n.bytes_skipped)
                        ),
                        Some(e) => println!("{}: FAILED: {e}", n.addr),
                    }
                }
                for n in &s.nodes {
                    for d in &n.dropped_peers {
                        println!("{}: excluded peer {d}", n.addr);
                    }
                }
                println!(
                    "root {}  {} files, {}; the source sent {} ({:.2}x the model) in {:.2}s ({:.0} MB/s)",
                    s.root,
                    s.files,
                    Bytes(s.bytes_total),
                    Bytes(s.bytes_sent),
                    s.source_sent_x,
                    send_s,
                    s.bytes_sent as f64 / send_s / 1e6
                );
            }
            for n in s.nodes.iter().filter(|n| !n.ok) {
                eprintln!("error: {}", n.error.as_deref().unwrap_or("failed"));
            }
            if !s.ok() {
                return Ok(ExitCode::FAILURE);
            }
        }
        Cmd::Pull {
            transport,
            repo,
            repo_type,
            include,
            exclude,
            local_dir,
            connections,
            part_size,
            to,
            key,
            chunk_size,
            connect_timeout,
            json,
        } => {
            // The data plane matters only for the fan-out to agents.
            let nic =
                if !to.is_empty() || transport == xfer::transport::select::TransportChoice::Rdma {
                    xfer::transport::select::choose(transport)?
                } else {
                    None
                };
            let env = xfer::hub::env::HubEnv::from_process().map_err(anyhow::Error::msg)?;
            let opts = xfer::hub::pull::PullOptions {
                repo,
                repo_type,
                include,
                exclude,
                local_dir,
                connections: connections.clamp(1, 256),
                part_size: part_size.max(1 << 20),
            };
            let progress = Progress::new(!json);
            if !to.is_empty() {
                let Some(key) = key else {
                    anyhow::bail!(
                        "--to needs the cluster credential: pass --key FILE or set XFER_KEY"
                    );
                };
                let push = xfer::flow::push::PushOptions {
                    src: PathBuf::new(),
                    to,
                    key,
                    name: None,
                    chunk_size,
                    limit_rate: None,
                    connect_timeout: Duration::from_secs(connect_timeout),
                    rehash: false,
                    nic,
                };
                let s =
                    xfer::flow::pull_fanout::pull_and_fan_out(opts, env, push, progress).await?;
                if json {
                    serde_json::to_writer(std::io::stdout().lock(), &s)?;
                    println!();
                } else {
                    println!(
                        "pulled {} ({}) in {:.2}s; delivered to {} agents in {} rounds, {:.2}s after the last byte",
                        s.pull.repo,
                        Bytes(s.pull.bytes_total),
                        s.pull.duration_s,
                        s.nodes.len(),
                        s.rounds,
                        s.tail_s
                    );
                    for n in &s.nodes {
                        match &n.error {
                            None => println!(
                                "{}: ok, root {}",
                                n.addr,
                                n.root.map_or("?".to_string(), |r| r.to_hex())
                            ),
                            Some(e) => println!("{}: FAILED: {e}", n.addr),
                        }
                    }
                    println!(
                        "root {}  {} on every node, {:.2}s in all",
                        s.root, s.name, s.duration_s
                    );
                }
                for n in s.nodes.iter().filter(|n| !n.ok) {
                    eprintln!("error: {}", n.error.as_deref().unwrap_or("failed"));
                }
                return Ok(if s.ok() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
            let (s, _) = xfer::hub::pull::pull(&opts, &env, &progress, None).await?;
            if json {
                serde_json::to_writer(std::io::stdout().lock(), &s)?;
                println!();
            } else {
                let v = &s.verification;
                println!(
                    "{}@{}: {} files, {}; downloaded {} in {:.2}s ({:.0} MB/s), {} already present",
                    s.repo,
                    &s.commit[..12],
                    s.files,
                    Bytes(s.bytes_total),
                    Bytes(s.bytes_downloaded),
                    s.duration_s,
                    s.rate_mb_s,
                    Bytes(s.bytes_present)
                );
                println!(
                    "verified: {} sha256, {} git sha1, {} already in the cache{}",
                    v.sha256_ok,
                    v.git_sha1_ok,
                    v.present,
                    if v.recovered > 0 {
                        format!(", {} re-downloaded after a mismatch", v.recovered)
                    } else {
                        String::new()
                    }
                );
                println!("{}", s.path);
            }
        }
        Cmd::Fetch {
            name,
            from,
            root,
            key,
            json,
            connect_timeout,
        } => {
            let opts = xfer::flow::fetch::FetchOptions {
                from,
                name,
                root,
                key,
                connect_timeout: Duration::from_secs(connect_timeout),
                nic: None,
            };
            let s = xfer::flow::fetch::fetch(&opts).await?;
            if json {
                serde_json::to_writer(std::io::stdout().lock(), &s)?;
                println!();
            } else {
                println!(
                    "{}: root {}, received {}, already held {}, in {:.2}s",
                    s.path.display(),
                    s.root,
                    Bytes(s.bytes_received),
                    Bytes(s.bytes_skipped),
                    s.duration_s
                );
            }
        }
        Cmd::Verify {
            dir,
            manifest,
            json,
        } => {
            let m = match manifest {
                Some(p) => Manifest::load_json(&p)?,
                None => xfer::store::verify::recorded_manifest(&dir)?,
            };
            let r = tokio::task::spawn_blocking(move || xfer::store::verify::verify(&dir, &m))
                .await??;
            if json {
                serde_json::to_writer(std::io::stdout().lock(), &r)?;
                println!();
            } else {
                for p in &r.missing {
                    println!("missing   {p}");
                }
                for m in &r.mismatched {
                    println!("mismatch  {}: {} {:?}", m.path, m.reason, m.bad_chunks);
                }
                println!(
                    "{} root {}: {} files, {}",
                    if r.ok { "ok" } else { "FAILED" },
                    r.root,
                    r.files,
                    Bytes(r.bytes)
                );
            }
            if !r.ok {
                return Ok(ExitCode::FAILURE);
            }
        }
        Cmd::Doctor { json, sys, proc } => {
            let report = xfer::sysinfo::doctor::gather(&sys, &proc);
            let text = if json {
                let mut t = serde_json::to_string(&report)?;
                t.push('\n');
                t
            } else {
                xfer::sysinfo::doctor::render(&report)
            };
            std::io::stdout()
                .lock()
                .write_all(text.as_bytes())
                .context("cannot write the report to stdout (was the pipe closed?)")?;
        }
        Cmd::Demo {
            size,
            nodes,
            dir,
            chunk_size,
        } => {
            let ok = cli::demo::run(&cli::demo::DemoOptions {
                size,
                nodes,
                dir,
                chunk_size,
            })
            .await?;
            if !ok {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_manifest(m: &Manifest, took: Duration) {
    for e in &m.entries {
        match e {
            Entry::File(f) => println!("{}  {}", f.hash, f.path),
            Entry::Symlink { path, target } => println!("{:<64}  {path} -> {target}", "symlink"),
            Entry::Dir { path } => println!("{:<64}  {path}/", "dir"),
        }
    }
    let bytes = m.total_bytes();
    eprintln!(
        "root {}  {} files, {}, chunk {}, hashed in {:.2}s ({:.2} GB/s)",
        m.root(),
        m.file_count(),
        Bytes(bytes),
        Bytes(m.chunk_size),
        took.as_secs_f64(),
        bytes as f64 / took.as_secs_f64().max(1e-9) / 1e9
    );
}
