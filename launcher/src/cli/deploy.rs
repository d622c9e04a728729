//! `xfer-launch deploy`: the preflight, the sync of the model to the nodes
//! that lack it, then `up`; with `--json`, every phase's time.

use std::process::ExitCode;

use launcher::agents::Agents;
use launcher::config::Setup;
use launcher::up::UpOptions;
use xfer::util::progress::Progress;

pub async fn deploy(
    setup: Setup,
    agents: Agents,
    opts: UpOptions,
    json: bool,
) -> Result<ExitCode, String> {
    let progress = Progress::new(!json);
    let phases = launcher::deploy::prepare(&setup, &agents, &progress)
        .await
        .map_err(|e| e.to_string())?;
    super::up::up_after(setup, agents, opts, json, Some(phases)).await
}
