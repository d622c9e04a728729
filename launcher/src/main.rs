//! `xfer-launch`: start one inference engine across the nodes of an xfer
//! cluster file, every rank pinned to its own fabric interface and address.
//!
//! ```sh
//! xfer-launch plan --cluster cluster.toml [--json]   # the dry run: what each node runs
//! xfer-launch check --cluster cluster.toml [--json]  # preflight on every node, through the agents
//! xfer-launch up --cluster cluster.toml              # check, start every rank, wait until ready
//! xfer-launch deploy --cluster cluster.toml          # check, sync the model where missing, then up
//! xfer-launch down --cluster cluster.toml            # stop every rank (SIGTERM, then SIGKILL)
//! xfer-launch status --cluster cluster.toml          # what runs, and its launch unit
//! xfer-launch logs --cluster cluster.toml [--node N] [--follow]
//! xfer-launch hosts cluster.toml                     # /etc/hosts lines for the fabric addresses
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
//! `launcher/src/config/mod.rs`; the environment every rank gets, and why, in
//! `launcher/src/plan.rs`.
//!
//! `plan` prints, per node, `env K=V ... COMMAND` lines ready to paste into
//! a shell on that node, and with `--json` the same plan as data, with a
//! BLAKE3 digest that changes exactly when what runs changes. Errors are
//! one line, `FILE:LINE:COL: what; the fix`. Exit codes: 0 done, 1 refused
//! or failed (the message says why), 2 usage errors.
//!
//! This file parses the command line and dispatches; the commands' bodies
//! are in `cli/`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use launcher::up::UpOptions;

mod cli;

use cli::{with_agents, Cli, Cmd};

/// `up`'s (and `deploy`'s) options, and whether to print JSON.
fn up_options(a: &cli::UpArgs) -> (UpOptions, bool) {
    let opts = UpOptions {
        init_timeout: Duration::from_secs(a.timeout),
        grace: Duration::from_secs(a.grace),
        record: a.record.clone(),
        api_url: a.api_url.clone(),
        evict_page_cache: a.evict_page_cache,
    };
    (opts, a.json)
}

/// The cluster file `--cluster` or `$XFER_CLUSTER` names.
fn file(cluster: Option<std::path::PathBuf>) -> Result<std::path::PathBuf, cli::CliError> {
    Ok(xfer::config::cluster::cluster_file(cluster)?)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Plan { cluster, json } => file(cluster).and_then(|c| cli::plan(&c, json)),
        Cmd::Check { cluster, json } => {
            file(cluster).and_then(|c| with_agents(&c, |s, a| cli::check(s, a, json)))
        }
        Cmd::Up(a) => {
            let (opts, json) = up_options(&a);
            file(a.cluster).and_then(|c| with_agents(&c, |s, a| cli::up(s, a, opts, json)))
        }
        Cmd::Deploy(d) => {
            let (opts, json) = up_options(&d.up);
            let engine = d.image_engine;
            file(d.up.cluster)
                .and_then(|c| with_agents(&c, |s, a| cli::deploy(s, a, opts, engine, json)))
        }
        Cmd::Down {
            cluster,
            grace,
            run,
        } => file(cluster)
            .and_then(|c| with_agents(&c, |s, a| cli::down(s, a, Duration::from_secs(grace), run))),
        Cmd::Status {
            cluster,
            run,
            record,
            json,
        } => {
            file(cluster).and_then(|c| with_agents(&c, |s, a| cli::status(s, a, run, record, json)))
        }
        Cmd::Logs {
            cluster,
            nodes,
            run,
            follow,
        } => {
            file(cluster).and_then(|c| with_agents(&c, |s, a| cli::logs(s, a, nodes, run, follow)))
        }
        Cmd::Hosts { file: f, cluster } => file(f.or(cluster)).and_then(|c| cli::hosts(&c)),
        Cmd::Rank { ranks } => {
            // This node, as Slurm names it (else its host name).
            let node = std::env::var("SLURMD_NODENAME")
                .ok()
                .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
                .unwrap_or_default();
            Err(cli::CliError::Rank(launcher::srun::run_rank(
                &ranks,
                node.trim(),
            )))
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            // Wrapped on a terminal, one line otherwise.
            eprintln!(
                "{}",
                xfer_proto::text::wrap(
                    &format!("xfer-launch: {e}"),
                    xfer::util::term::stderr_width(),
                    4
                )
            );
            ExitCode::FAILURE
        }
    }
}
