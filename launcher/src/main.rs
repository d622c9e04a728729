//! `xfer-launch`: start one inference engine across the nodes of an xfer
//! cluster file, every rank pinned to its own fabric interface and address.
//!
//! ```sh
//! xfer-launch plan --cluster cluster.toml [--json]   # the dry run: what each node runs
//! xfer-launch check --cluster cluster.toml [--json]  # preflight on every node, through the agents
//! xfer-launch up --cluster cluster.toml              # check, start every rank, wait until ready
//! xfer-launch down --cluster cluster.toml            # stop every rank (SIGTERM, then SIGKILL)
//! xfer-launch logs --cluster cluster.toml [--node N] [--follow]
//! ```
//!
//! The cluster file is the one `xfer` reads (`docs/cluster.example.toml`):
//! each `[[node]]` gives its `fabric_if`, `fabric_ip` and optional
//! `rdma_device`/`gid_index`, and a `[launch]` table says what to start:
//!
//! ```toml
//! [launch]
//! engine = "vllm"          # vllm | vllm-ray | sglang | custom
//! model = "Qwen/Qwen3-8B"  # or "/abs/path" (same on every node); ORG/NAME[@COMMIT]
//! tp = 2                   # default 1
//! pp = 1                   # default: the number of nodes
//! head = "spark-a"         # default: the first node
//! extra_args = ["--max-model-len", "32768"]
//! [launch.env]
//! NCCL_DEBUG = "INFO"
//! ```
//!
//! The other keys (`revision`, `nodes`, `master_port` 29500, `api_port`
//! 8000, `ray_port` 6379, `dist_port` 20000, `template` for the custom
//! engine with `{rank}`, `{nnodes}`, `{head_ip}`, `{fabric_ip}`,
//! `{fabric_if}`, `{model}`, `{master_port}`, `{api_port}`, `{ray_port}`,
//! `{dist_port}`, `{tp}`, `{pp}`, `{node}`, `{head}`) are described in
//! `launcher/src/config.rs`; the environment every rank gets, and why, in
//! `launcher/src/plan.rs`.
//!
//! `plan` prints, per node, `env K=V ... COMMAND` lines ready to paste into
//! a shell on that node, and with `--json` the same plan as data, with a
//! BLAKE3 digest that changes exactly when what runs changes. Errors are
//! one line, `FILE:LINE:COL: what; the fix`. Exit codes: 0 done, 1 refused
//! or failed (the message says why), 2 usage errors.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use launcher::agents::Agents;
use launcher::config::Setup;
use launcher::up::UpOptions;
use xfer::agent::ranks::{RankReport, RunState};
use xfer_proto::launch::{LaunchReply, LaunchRequest};

#[derive(Parser)]
#[command(
    name = "xfer-launch",
    version,
    about = "Start vLLM or SGLang across the nodes of an xfer cluster file, each rank pinned to its fabric."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the exact command line and environment each node will run (a dry run).
    Plan {
        /// The cluster file, with its [launch] table.
        #[arg(long)]
        cluster: PathBuf,
        /// Print the plan as JSON (with its digest) instead of shell lines.
        #[arg(long)]
        json: bool,
    },
    /// Check every node through its agent: weights, memory, disk, GPUs, fabric, reachability, ports, versions, RDMA.
    Check {
        #[arg(long)]
        cluster: PathBuf,
        /// Print the rows and every node's facts as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check, start every rank through its agent, and wait until the engine answers.
    Up {
        #[arg(long)]
        cluster: PathBuf,
        /// Seconds the engine may take to become ready (loading 100+ GB takes minutes).
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
        /// Seconds between SIGTERM and SIGKILL when stopping.
        #[arg(long, default_value_t = 15)]
        grace: u64,
        /// Where to write the run record (default: ~/.local/state/xfer-launch/RUN.json).
        #[arg(long)]
        record: Option<PathBuf>,
        /// The API's base URL for the readiness probe (default: http://HEAD_AGENT_HOST:API_PORT).
        #[arg(long)]
        api_url: Option<String>,
        /// Print the outcome as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Stop every rank on every node: SIGTERM, then SIGKILL after the grace period.
    Down {
        #[arg(long)]
        cluster: PathBuf,
        /// Seconds between SIGTERM and SIGKILL.
        #[arg(long, default_value_t = 15)]
        grace: u64,
        /// Stop this run only (default: every running one).
        #[arg(long)]
        run: Option<String>,
    },
    /// Show each rank's log (the newest run, or --run).
    Logs {
        #[arg(long)]
        cluster: PathBuf,
        /// Only this node.
        #[arg(long)]
        node: Option<String>,
        /// The run (default: each node's newest).
        #[arg(long)]
        run: Option<String>,
        /// Keep printing as the logs grow, until every rank has stopped.
        #[arg(long, short)]
        follow: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Plan { cluster, json } => plan(&cluster, json),
        Cmd::Check { cluster, json } => with_agents(&cluster, |s, a| check(s, a, json)),
        Cmd::Up {
            cluster,
            timeout,
            grace,
            record,
            api_url,
            json,
        } => {
            let opts = UpOptions {
                init_timeout: Duration::from_secs(timeout),
                grace: Duration::from_secs(grace),
                record,
                api_url,
            };
            with_agents(&cluster, |s, a| up(s, a, opts, json))
        }
        Cmd::Down {
            cluster,
            grace,
            run,
        } => with_agents(&cluster, |s, a| down(s, a, Duration::from_secs(grace), run)),
        Cmd::Logs {
            cluster,
            node,
            run,
            follow,
        } => with_agents(&cluster, |s, a| logs(s, a, node, run, follow)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xfer-launch: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load(cluster: &PathBuf) -> Result<Setup, String> {
    launcher::config::load(cluster).map_err(|e| e.to_string())
}

fn plan(cluster: &PathBuf, json: bool) -> Result<ExitCode, String> {
    let setup = load(cluster)?;
    let plan = launcher::plan::plan(&setup);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&plan).expect("a plan always serializes")
        );
    } else {
        print!("{}", launcher::plan::render_text(&plan));
    }
    Ok(ExitCode::SUCCESS)
}

/// Loads the setup and the credential, and runs `f` on a runtime.
fn with_agents<F, Fut>(cluster: &PathBuf, f: F) -> Result<ExitCode, String>
where
    F: FnOnce(Setup, Agents) -> Fut,
    Fut: std::future::Future<Output = Result<ExitCode, String>>,
{
    let setup = load(cluster)?;
    let agents = Agents::new(&setup)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    rt.block_on(f(setup, agents))
}

async fn check(setup: Setup, agents: Agents, json: bool) -> Result<ExitCode, String> {
    let checked = launcher::check::run(&setup, &agents).await;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&checked).expect("a check always serializes")
        );
    } else {
        print!("{}", launcher::preflight::render(&checked.rows));
        if checked.model_path != setup.model.path {
            println!("model path: {}", checked.model_path);
        }
    }
    Ok(if checked.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn up(setup: Setup, agents: Agents, opts: UpOptions, json: bool) -> Result<ExitCode, String> {
    let out = launcher::up::up(&setup, &agents, &opts).await?;
    let record = out.record.display().to_string();
    match out.result {
        Ok(r) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"run": out.run, "record": record, "ready": true, "readiness": r})
                );
            }
            let secs = std::fs::read(&out.record)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["time_to_ready_s"].as_f64())
                .unwrap_or(0.0);
            eprintln!(
                "ready: run {} answers at {} after {secs:.1}s; first token in {:.0} ms, {} tokens in {:.2}s = {:.1} tokens/s",
                out.run, r.url, r.first_token_ms, r.completion_tokens, r.completion_s, r.tokens_per_s
            );
            eprintln!("record: {record}");
            eprintln!(
                "the agents supervise the ranks now; stop them with `xfer-launch down --cluster {}`",
                setup.path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"run": out.run, "record": record, "ready": false, "error": why})
                );
            }
            // Show the failing ranks from the record.
            let failed = std::fs::read(&out.record)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| serde_json::from_value::<Vec<RankReport>>(v["failure"].clone()).ok())
                .unwrap_or_default();
            for f in failed.iter().take(3) {
                print_failure(f);
            }
            eprintln!("record: {record}");
            Err(format!("run {} did not come up: {why}", out.run))
        }
    }
}

fn print_failure(r: &RankReport) {
    eprintln!(
        "--- last lines of rank {} on {} ({}) ---",
        r.rank, r.node, r.log
    );
    for l in &r.tail {
        eprintln!("  {l}");
    }
    for h in &r.hints {
        eprintln!("hint [{}]: {}\n  seen: {}", h.id, h.hint, h.line);
    }
}

async fn down(
    setup: Setup,
    agents: Agents,
    grace: Duration,
    run: Option<String>,
) -> Result<ExitCode, String> {
    let answers = launcher::up::stop(&agents, run.as_deref(), grace, "xfer-launch down").await;
    let mut failed = 0;
    for (n, a) in setup.nodes.iter().zip(answers) {
        match a {
            Ok(reports) if reports.is_empty() => println!("{}: nothing running", n.name),
            Ok(reports) => {
                for r in reports {
                    let procs = r.procs.len();
                    let state = match &r.state {
                        RunState::Stopped(_) => "stopped".to_string(),
                        RunState::Failed(w) => format!("had failed: {w}"),
                        s => format!("{s:?}"),
                    };
                    println!(
                        "{}: run {} rank {} {state} ({procs} process(es))",
                        n.name, r.run, r.rank
                    );
                }
            }
            Err(e) => {
                failed += 1;
                println!("{}: agent {} did not answer: {e}", n.name, n.agent);
            }
        }
    }
    if failed > 0 {
        return Err(format!(
            "{failed} agent(s) did not answer; their ranks may still run: start the agent again (it adopts its ranks) and run `xfer-launch down` again"
        ));
    }
    Ok(ExitCode::SUCCESS)
}

async fn logs(
    setup: Setup,
    agents: Agents,
    node: Option<String>,
    run: Option<String>,
    follow: bool,
) -> Result<ExitCode, String> {
    let picked: Vec<usize> = match &node {
        Some(name) => {
            let i = setup
                .nodes
                .iter()
                .position(|n| &n.name == name)
                .ok_or_else(|| {
                    let names: Vec<&str> = setup.nodes.iter().map(|n| n.name.as_str()).collect();
                    format!("no node {name} in the launch; it has {}", names.join(", "))
                })?;
            vec![i]
        }
        None => (0..setup.nodes.len()).collect(),
    };
    // Which run each node shows.
    let mut cursors: Vec<(usize, String, u64, bool)> = Vec::new();
    for &i in &picked {
        let msg = LaunchRequest::RunQuery { run: run.clone() };
        match agents.ask(i, &msg, launcher::agents::QUICK).await {
            Ok(LaunchReply::Runs(r)) => match r.first() {
                Some(r) => {
                    eprintln!(
                        "== {} rank {} run {}: {:?} ({}) ==",
                        r.node, r.rank, r.run, r.state, r.log
                    );
                    cursors.push((i, r.run.clone(), 0, true));
                }
                None => eprintln!("== {}: no run ==", setup.nodes[i].name),
            },
            Ok(other) => return Err(launcher::agents::unexpected(&other)),
            Err(e) => {
                return Err(format!(
                    "agent of {} at {} did not answer: {e}",
                    setup.nodes[i].name, setup.nodes[i].agent
                ))
            }
        }
    }
    loop {
        let mut any_live = false;
        for c in cursors.iter_mut() {
            loop {
                let msg = LaunchRequest::ReadLog {
                    run: c.1.clone(),
                    offset: c.2,
                    max: 1 << 20,
                };
                let chunk = match agents.ask(c.0, &msg, launcher::agents::QUICK).await {
                    Ok(LaunchReply::Log(l)) => l,
                    Ok(other) => return Err(launcher::agents::unexpected(&other)),
                    Err(e) => return Err(format!("{}: {e}", setup.nodes[c.0].name)),
                };
                let text = String::from_utf8_lossy(&chunk.data);
                for line in text.split_inclusive('\n') {
                    print!("[{}] {line}", chunk.node);
                    if !line.ends_with('\n') {
                        println!();
                    }
                }
                c.2 = chunk.offset + chunk.data.len() as u64;
                c.3 = chunk.live;
                if chunk.data.is_empty() || c.2 >= chunk.size {
                    break;
                }
            }
            any_live |= c.3;
        }
        if !follow || !any_live {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(ExitCode::SUCCESS)
}
