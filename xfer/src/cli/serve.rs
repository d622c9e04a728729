//! `xfer serve`: start the node agent with the options given.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;

use super::args::*;

/// `xfer serve`.
pub async fn serve(args: ServeArgs) -> Result<ExitCode> {
    let ServeArgs {
        listen,
        root,
        key,
        window,
        verify_every,
        metrics,
        transport,
    } = args;
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
    Ok(ExitCode::SUCCESS)
}
