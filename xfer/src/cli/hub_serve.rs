//! `xfer hub-serve`: a folder served as one Hub model repo on this
//! machine, by the Hub look-alike the demo uses ([`xfer::hub_lookalike`]),
//! until Ctrl-C. What the quick start on one machine syncs from.

use std::process::ExitCode;

use anyhow::{bail, Result};

use super::args::HubServeArgs;
use xfer::hub_lookalike::DemoHub;

/// Serves `args.dir` as `args.repo` until interrupted.
pub async fn run(args: HubServeArgs) -> Result<ExitCode> {
    if !args.dir.is_dir() {
        bail!(
            "{} is not a folder; give the folder whose files the repo serves",
            args.dir.display()
        );
    }
    let hub = DemoHub::start_on(&args.dir, &args.repo, args.rate, args.listen).await?;
    println!(
        "serving {} as the Hub repo {} at {}",
        args.dir.display(),
        args.repo,
        hub.endpoint()
    );
    println!(
        "use it with: HF_ENDPOINT={} xfer sync {} --wait   (Ctrl-C stops the server)",
        hub.endpoint(),
        args.repo
    );
    tokio::signal::ctrl_c().await?;
    eprintln!(
        "hub-serve: stopped; it served {} of file bodies",
        xfer_proto::units::Bytes(hub.bytes_served())
    );
    Ok(ExitCode::SUCCESS)
}
