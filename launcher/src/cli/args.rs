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
    #[command(after_help = "Example:\n  xfer-launch plan --cluster cluster.toml")]
    Plan {
        /// The cluster file, with its [launch] table (default: $XFER_CLUSTER).
        #[arg(
            long,
            value_name = "FILE",
            env = "XFER_CLUSTER",
            hide_env_values = true
        )]
        cluster: Option<PathBuf>,
        /// Print the plan as JSON (with its digest) instead of shell lines.
        #[arg(long)]
        json: bool,
    },
    /// Check every node through its agent: weights, memory, disk, GPUs, fabric, reachability, ports, versions, RDMA.
    #[command(after_help = "Example:\n  XFER_CLUSTER=cluster.toml xfer-launch check")]
    Check {
        /// The cluster file, with its [launch] table (default: $XFER_CLUSTER).
        #[arg(
            long,
            value_name = "FILE",
            env = "XFER_CLUSTER",
            hide_env_values = true
        )]
        cluster: Option<PathBuf>,
        /// Print the rows and every node's facts as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check, start every rank through its agent, and wait until the engine answers.
    #[command(after_help = "Example:\n  xfer-launch up --cluster cluster.toml --timeout 3600")]
    Up(UpArgs),
    /// From nothing to serving: check everything but the weights and the
    /// image, sync the model to every launch node that lacks it (a Hub
    /// repo is pulled once and fanned out while it downloads), deliver
    /// `[launch] image` from this machine's engine where it is missing,
    /// then `up`. Run it again after an interruption: the sync resumes,
    /// and what is done is not redone.
    #[command(after_help = "Example:\n  xfer-launch deploy --cluster cluster.toml")]
    Deploy(DeployArgs),
    /// Stop every rank on every node: SIGTERM, then SIGKILL after the grace period.
    #[command(after_help = "Example:\n  xfer-launch down --cluster cluster.toml --grace 30")]
    Down {
        /// The cluster file, with its [launch] table (default: $XFER_CLUSTER).
        #[arg(
            long,
            value_name = "FILE",
            env = "XFER_CLUSTER",
            hide_env_values = true
        )]
        cluster: Option<PathBuf>,
        /// Seconds between SIGTERM and SIGKILL.
        #[arg(long, default_value_t = 15)]
        grace: u64,
        /// Stop this run only (default: every running one).
        #[arg(long)]
        run: Option<String>,
    },
    /// Show what each node runs for the launch and the launch unit it started.
    #[command(after_help = "Example:\n  xfer-launch status --cluster cluster.toml")]
    Status {
        /// The cluster file, with its [launch] table (default: $XFER_CLUSTER).
        #[arg(
            long,
            value_name = "FILE",
            env = "XFER_CLUSTER",
            hide_env_values = true
        )]
        cluster: Option<PathBuf>,
        /// This run (default: the newest any node reports).
        #[arg(long)]
        run: Option<String>,
        /// The run's record (default: the one `up` wrote in the records folder).
        #[arg(long, value_name = "FILE")]
        record: Option<PathBuf>,
        /// Print the ranks and the unit as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show each rank's log (the newest run, or --run).
    #[command(
        after_help = "Example:\n  xfer-launch logs --cluster cluster.toml --nodes spark-b --follow"
    )]
    Logs {
        /// The cluster file, with its [launch] table (default: $XFER_CLUSTER).
        #[arg(
            long,
            value_name = "FILE",
            env = "XFER_CLUSTER",
            hide_env_values = true
        )]
        cluster: Option<PathBuf>,
        /// Only these nodes, comma separated (default: every node of the
        /// launch; `--node` is an old spelling).
        #[arg(long, alias = "node", value_delimiter = ',')]
        nodes: Vec<String>,
        /// The run (default: each node's newest).
        #[arg(long)]
        run: Option<String>,
        /// Keep printing as the logs grow, until every rank has stopped.
        #[arg(long, short)]
        follow: bool,
    },
    /// Become this node's rank of a run (what `runner = "srun"`'s step runs on each node).
    #[command(
        hide = true,
        after_help = "Example:\n  xfer-launch rank --ranks ~/.local/state/xfer-launch/RUN.srun/ranks.json   # what srun runs on each node; not by hand"
    )]
    Rank {
        /// The rank file `xfer-launch up` wrote beside its run record.
        #[arg(long, value_name = "FILE")]
        ranks: PathBuf,
    },
    /// Print the /etc/hosts lines for the cluster's fabric addresses (the `resolver` check's fix).
    #[command(
        after_help = "Example:\n  xfer-launch hosts cluster.toml | sudo tee -a /etc/hosts   # on every node"
    )]
    Hosts {
        /// The cluster file (before --cluster and $XFER_CLUSTER).
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        /// The cluster file (default: $XFER_CLUSTER).
        #[arg(
            long,
            value_name = "FILE",
            env = "XFER_CLUSTER",
            hide_env_values = true
        )]
        cluster: Option<PathBuf>,
    },
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use crate::cli::cli_docs::undocumented;

    /// The README's quick start, read as a newcomer copies it: every
    /// `xfer-launch` line in it parses with these arguments.
    #[test]
    fn every_xfer_launch_command_in_the_quick_start_parses() {
        crate::cli::cli_docs::assert_quick_start_parses::<super::Cli>("xfer-launch", 3);
    }

    #[test]
    fn every_argument_has_help_and_every_command_an_example() {
        let mut missing = Vec::new();
        undocumented(&super::Cli::command(), "xfer-launch", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    #[test]
    fn logs_takes_nodes_and_the_old_node_spelling() {
        use clap::Parser;
        for argv in [
            ["xfer-launch", "logs", "--nodes", "a,b"],
            ["xfer-launch", "logs", "--node", "a,b"],
        ] {
            match super::Cli::try_parse_from(argv).unwrap().cmd {
                super::Cmd::Logs { nodes, .. } => assert_eq!(nodes, ["a", "b"]),
                _ => panic!("not logs"),
            }
        }
    }
}

/// The arguments of `deploy`: those of `up`, which it ends with, and where
/// the image comes from.
#[derive(clap::Args)]
pub struct DeployArgs {
    /// `up`'s arguments.
    #[command(flatten)]
    pub up: UpArgs,
    /// The container engine on this machine that holds `[launch] image`,
    /// delivered from it to the nodes that lack it (as `xfer image push
    /// --engine` does); DOCKER_HOST or podman's default names the engine.
    #[arg(long, value_enum, default_value = "docker")]
    pub image_engine: xfer_proto::image::ContainerRuntime,
}

/// The arguments of `up` (and of `deploy`, which ends with an `up`).
#[derive(clap::Args)]
pub struct UpArgs {
    /// The cluster file, with its [launch] table (default: $XFER_CLUSTER).
    #[arg(
        long,
        value_name = "FILE",
        env = "XFER_CLUSTER",
        hide_env_values = true
    )]
    pub cluster: Option<PathBuf>,
    /// Seconds the engine may take to become ready (loading 100+ GB takes minutes).
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Seconds between SIGTERM and SIGKILL when stopping.
    #[arg(long, default_value_t = 15)]
    pub grace: u64,
    /// Where to write the run record (default: ~/.local/state/xfer-launch/RUN.json).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// The API's base URL for the readiness probe (default: http://HEAD_AGENT_HOST:API_PORT).
    #[arg(long)]
    pub api_url: Option<String>,
    /// Drop the model's pages from every node's page cache before the
    /// ranks start (posix_fadvise DONTNEED on its files; never a global
    /// drop). Always done on nodes with unified memory (GB10, GH200).
    #[arg(long)]
    pub evict_page_cache: bool,
    /// Print the outcome as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}
