//! `xfer-launch hosts`: the `/etc/hosts` lines for the cluster's fabric
//! addresses, the fix the preflight's `resolver` row names. Reads only the
//! cluster file (no agent, no `[launch]` needed).

use std::path::Path;
use std::process::ExitCode;

use xfer::config::cluster::Cluster;

use super::CliError;

pub fn hosts(cluster: &Path) -> Result<ExitCode, CliError> {
    let c = Cluster::load(cluster)?;
    let nodes: Vec<(&str, Option<std::net::IpAddr>)> = c
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.fabric_ip))
        .collect();
    print!(
        "{}",
        launcher::preflight::hosts::lines(&cluster.display().to_string(), &nodes)
    );
    Ok(ExitCode::SUCCESS)
}
