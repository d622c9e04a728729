//! [`CliError`]: why an `xfer-launch` command failed, the one line `main`
//! prints after `xfer-launch: ` (exit 1). Each variant keeps its cause
//! typed until then.

use launcher::agents::{CredentialError, NodeError};
use xfer::config::cluster::ClusterError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The cluster file could not be found or read.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The cluster file's `[launch]` table is wrong.
    #[error(transparent)]
    Launch(#[from] launcher::config::LaunchError),
    /// The cluster credential could not be loaded.
    #[error(transparent)]
    Credential(#[from] CredentialError),
    /// `xfer-launch rank` could not become its rank.
    #[error(transparent)]
    Rank(#[from] launcher::srun::RankError),
    /// The srun runner's step could not be found or cancelled.
    #[error(transparent)]
    Srun(#[from] launcher::srun::SrunError),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    /// Ctrl-C could not be watched for.
    #[error("cannot watch for Ctrl-C: {0}")]
    Signal(std::io::Error),
    /// `--node` names a node that is not in the launch.
    #[error("no node {name} in the launch; it has {}", .has.join(", "))]
    NoSuchNode {
        /// The name given.
        name: String,
        /// The launch's nodes.
        has: Vec<String>,
    },
    /// A node's agent did not answer (`logs`' first question).
    #[error("agent of {node} at {agent} did not answer: {why}")]
    Unanswered {
        /// The node.
        node: String,
        /// Its agent's address.
        agent: String,
        /// Why.
        why: NodeError,
    },
    /// A node's answer was not the one asked for.
    #[error("{0}")]
    Unexpected(NodeError),
    /// A node's agent failed a later question (`logs` reading a log).
    #[error("{node}: {why}")]
    Node {
        /// The node.
        node: String,
        /// Why.
        why: NodeError,
    },
    /// Some agents did not answer `down` or `status`; `again` is the
    /// command to run once they are back.
    #[error("{silent} agent(s) did not answer; {}", match .again { Again::Down => "their ranks may still run: start the agent again (it adopts its ranks) and run `xfer-launch down` again", Again::Status => "start them again (they adopt their ranks) and run `xfer-launch status` again" })]
    Silent {
        /// How many did not answer.
        silent: usize,
        /// Which command to run again.
        again: Again,
    },
    /// `up` did not get as far as starting the ranks.
    #[error(transparent)]
    Up(#[from] launcher::up::UpError),
    /// `deploy` failed before `up`, or its sync failed.
    #[error(transparent)]
    Deploy(#[from] launcher::deploy::DeployError),
    /// The nodes could not settle the model's commit (`plan` says so and
    /// goes on with `<COMMIT>`).
    #[error(transparent)]
    Commit(#[from] launcher::check::CommitError),
    /// The run started but did not come up (`why` is its recorded reason).
    #[error("run {run} did not come up: {why}")]
    NotUp {
        /// The run's id.
        run: String,
        /// Why, as recorded.
        why: String,
    },
}

/// The command [`CliError::Silent`] says to run again.
#[derive(Debug, Clone, Copy)]
pub enum Again {
    /// `xfer-launch down`.
    Down,
    /// `xfer-launch status`.
    Status,
}
