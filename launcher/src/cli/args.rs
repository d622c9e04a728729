//! The command line: the subcommands and their options (clap).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xfer-launch",
    version,
    about = "Start vLLM or SGLang across the nodes of an xfer cluster file, each rank pinned to its fabric."
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
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
        /// Drop the model's pages from every node's page cache before the
        /// ranks start (posix_fadvise DONTNEED on its files; never a global
        /// drop). Always done on nodes with unified memory (GB10, GH200).
        #[arg(long)]
        evict_page_cache: bool,
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
