//! `xfer serve`: start the node agent with the options given.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

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
        allow_launch,
        allow_exec,
        export,
        retry,
        max_connections_per_source,
        handshake_burst,
        handshakes_per_second,
        first_message_timeout,
        cluster,
    } = args;
    let members = match &cluster {
        None => None,
        Some(file) => Some(
            xfer::config::cluster::Cluster::load(file)?
                .nodes
                .into_iter()
                .map(|n| n.name)
                .collect(),
        ),
    };
    let exports = export
        .iter()
        .map(|d| {
            d.canonicalize()
                .ok()
                .filter(|c| c.is_dir())
                .with_context(|| {
                    format!(
                        "--export {}: no such folder; create it or drop the flag",
                        d.display()
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
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
        permits: xfer::agent::permit::Permits {
            launch: allow_launch,
            exec: allow_exec,
            exports,
        },
        guard: xfer::agent::guard::GuardConfig {
            retry,
            max_connections_per_source: max_connections_per_source.max(1),
            handshake_burst,
            handshakes_per_second: handshakes_per_second.max(1),
            ..Default::default()
        },
        first_message_timeout: Duration::from_secs(first_message_timeout.max(1)),
        members: members.map(|m| (cluster.unwrap_or_default(), m)),
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}
