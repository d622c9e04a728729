//! `xfer-launch deploy`: the preflight, the sync of the model and the
//! delivery of the image to the nodes that lack them, then `up`; with `--json`, every phase's time.

use std::process::ExitCode;

use launcher::agents::Agents;
use launcher::config::Setup;
use launcher::up::UpOptions;
use xfer::util::progress::Progress;
use xfer_proto::image::ContainerRuntime;

pub async fn deploy(
    setup: Setup,
    agents: Agents,
    opts: UpOptions,
    image_engine: ContainerRuntime,
    json: bool,
) -> Result<ExitCode, String> {
    let progress = Progress::new(!json);
    let phases = launcher::deploy::prepare(&setup, &agents, image_engine, &progress)
        .await
        .map_err(|e| e.to_string())?;
    super::up::up_after(setup, agents, opts, json, Some(phases)).await
}
