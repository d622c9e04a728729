//! The commands of `xfer-launch` (binary only): [`args`] is the command
//! line, each other module one command's body over the library (load the
//! setup, talk to the agents, print). `main` parses and dispatches.

use std::path::Path;
use std::process::ExitCode;

use launcher::agents::Agents;
use launcher::config::Setup;

mod args;
mod check;
mod deploy;
mod down;
mod error;
mod hosts;
mod logs;
mod plan;
mod status;
mod up;

/// What the docs promise of this binary's arguments, shared with the
/// other binary's tests.
#[cfg(test)]
#[path = "../../../tests/common/cli_docs.rs"]
mod cli_docs;

pub use args::{Cli, Cmd, UpArgs};
pub use check::check;
pub use deploy::deploy;
pub use down::down;
pub use error::{Again, CliError};
pub use hosts::hosts;
pub use logs::logs;
pub use plan::plan;
pub use status::status;
pub use up::up;

/// Reads the cluster file and its `[launch]` table.
fn load(cluster: &Path) -> Result<Setup, CliError> {
    Ok(launcher::config::load(cluster)?)
}

/// Loads the setup and the credential, and runs `f` on a runtime.
pub fn with_agents<F, Fut>(cluster: &Path, f: F) -> Result<ExitCode, CliError>
where
    F: FnOnce(Setup, Agents) -> Fut,
    Fut: std::future::Future<Output = Result<ExitCode, CliError>>,
{
    let setup = load(cluster)?;
    let agents = Agents::new(&setup)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    rt.block_on(async move {
        // Registered before anything is asked: a Ctrl-C from here on is ours.
        let mut interrupt =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
                .map_err(CliError::Signal)?;
        tokio::select! {
            r = f(setup, agents) => r,
            _ = interrupt.recv() => {
                // Nothing is stopped behind the operator's back: a run that
                // was serving before this command must not go down with it.
                eprintln!("{INTERRUPTED}");
                Ok(ExitCode::from(130))
            }
        }
    })
}

/// What a Ctrl-C leaves, and the commands that act on it.
const INTERRUPTED: &str = "xfer-launch: interrupted (Ctrl-C); nothing was stopped: ranks it started keep running (`xfer-launch status` shows them, `xfer-launch down` stops them) and a sync it started goes on in the agents (`xfer status` follows it, `xfer cancel JOB` stops it)";
