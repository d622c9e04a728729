//! `xfer-launch`: start one inference engine across the nodes of an xfer
//! cluster file, every rank pinned to its own fabric interface and address.
//!
//! ```sh
//! xfer-launch plan --cluster cluster.toml [--json]   # the dry run: what each node runs
//! xfer-launch check --cluster cluster.toml           # preflight (not built yet)
//! xfer-launch up|down|logs --cluster cluster.toml    # (not built yet)
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
//! (the message says why), 2 usage errors and the commands not built yet.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Check every node before a launch (not built yet).
    Check {
        #[arg(long)]
        cluster: PathBuf,
    },
    /// Start the engine on every node (not built yet).
    Up {
        #[arg(long)]
        cluster: PathBuf,
    },
    /// Stop the engine on every node (not built yet).
    Down {
        #[arg(long)]
        cluster: PathBuf,
    },
    /// Show each rank's output (not built yet).
    Logs {
        #[arg(long)]
        cluster: PathBuf,
    },
}

/// What each command still lacks, said when it is run.
const NOT_BUILT: &[(&str, &str)] = &[
    (
        "check",
        "it needs a preflight request in the agent protocol, run on every node: the fabric_ip is on fabric_if and up, a TCP connect to the head over the fabric, a don't-fragment ping at full MTU, the GID table, free master/API/Ray ports, the same engine, torch, NCCL and driver versions, the model's manifest root at the same path, MemAvailable and an idle GPU, and resolving <COMMIT> from refs/; `xfer-launch plan` is the dry run meanwhile",
    ),
    (
        "up",
        "it needs the agents to spawn and supervise each rank (the plan's pre commands, then argv with its env), in order (the Ray head first), readiness by /health on the head then a one-token completion, and stopping every rank when one dies; run the `xfer-launch plan` blocks by hand meanwhile",
    ),
    (
        "down",
        "it needs `up`'s record of the running group (plan digest, each rank's process) to stop it: SIGTERM then SIGKILL (SGLang ranks above 0 ignore SIGTERM), and `ray stop` on every node for vllm-ray",
    ),
    (
        "logs",
        "it needs `up` to keep each rank's stdout and stderr on its node and the agent to stream them back",
    ),
];

fn not_built(cmd: &str) -> ExitCode {
    let why = NOT_BUILT
        .iter()
        .find(|(c, _)| *c == cmd)
        .map_or("", |(_, w)| *w);
    eprintln!("xfer-launch {cmd}: not built yet: {why}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Plan { cluster, json } => match launcher::config::load(&cluster) {
            Ok(setup) => {
                let plan = launcher::plan::plan(&setup);
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&plan).expect("a plan always serializes")
                    );
                } else {
                    print!("{}", launcher::plan::render_text(&plan));
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("xfer-launch: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Check { .. } => not_built("check"),
        Cmd::Up { .. } => not_built("up"),
        Cmd::Down { .. } => not_built("down"),
        Cmd::Logs { .. } => not_built("logs"),
    }
}
