//! The `xfer` command line.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::{Parser, Subcommand};

use xfer::manifest::{Entry, Manifest};
use xfer::progress::Progress;
use xfer::units::{parse_size, Bytes};

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
    if xfer::hash::is_valid_chunk_size(n) {
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
            let cred = xfer::auth::keygen(&out, force)?;
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
            let tree =
                tokio::task::spawn_blocking(move || xfer::scan::scan(&dir, chunk_size, &|_| {}))
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
        } => {
            let scheduler = xfer::scheduler::Config {
                window: window.max(1),
                ..Default::default()
            };
            xfer::agent::run(xfer::agent::AgentOptions {
                listen,
                root,
                key,
                scheduler,
            })
            .await?;
        }
        Cmd::Push {
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
            let opts = xfer::push::PushOptions {
                src,
                to,
                key,
                name,
                chunk_size,
                limit_rate,
                connect_timeout: Duration::from_secs(connect_timeout),
                rehash,
            };
            let progress = Progress::new(!json);
            let s = xfer::push::push(&opts, &progress).await?;
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
            let env = xfer::hub::env::HubEnv::from_process().map_err(anyhow::Error::msg)?;
            let opts = xfer::pull::PullOptions {
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
                let push = xfer::push::PushOptions {
                    src: PathBuf::new(),
                    to,
                    key,
                    name: None,
                    chunk_size,
                    limit_rate: None,
                    connect_timeout: Duration::from_secs(connect_timeout),
                    rehash: false,
                };
                let s = xfer::pull_fanout::pull_and_fan_out(opts, env, push, progress).await?;
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
                                n.root.as_deref().unwrap_or("?")
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
            let (s, _) = xfer::pull::pull(&opts, &env, &progress, None).await?;
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
            let opts = xfer::fetch::FetchOptions {
                from,
                name,
                root,
                key,
                connect_timeout: Duration::from_secs(connect_timeout),
            };
            let s = xfer::fetch::fetch(&opts).await?;
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
                None => xfer::verify::recorded_manifest(&dir)?,
            };
            let r = tokio::task::spawn_blocking(move || xfer::verify::verify(&dir, &m)).await??;
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
        Cmd::Demo {
            size,
            nodes,
            dir,
            chunk_size,
        } => {
            let ok = xfer::demo::run(&xfer::demo::DemoOptions {
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
