//! `xfer serve`: start the node agent with the options given.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use super::args::*;

/// `xfer serve`.
pub async fn serve(args: ServeArgs) -> Result<ExitCode> {
    let ServeArgs {
        listen,
        data,
        fabric_if,
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
        connections,
        container_engine,
        max_bytes,
        max_percent,
        evict_above,
        evict_to,
    } = args;
    if let (Some(high), Some(low)) = (evict_above, evict_to) {
        if low > high {
            anyhow::bail!(
                "--evict-to {low}% is above --evict-above {high}%; eviction goes from the high watermark down to the low one"
            );
        }
    }
    let loaded = match &cluster {
        None => None,
        Some(file) => Some(xfer::config::cluster::Cluster::load(file)?),
    };
    let member_addrs = loaded.as_ref().map(peer_addrs);
    let launch_models: Vec<_> = loaded
        .as_ref()
        .and_then(|c| xfer::agent::keeper::launch_model(c.launch.as_ref(), &root))
        .into_iter()
        .collect();
    let members = loaded.map(|c| c.nodes.into_iter().map(|n| n.name).collect());
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
    // The engine's program, resolved once on the agent's own PATH.
    let containers = container_engine
        .map(xfer::image::runtime::Runtime::resolved)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--container-engine: {e}"))?;
    let data = data_addr(listen, data.as_deref(), fabric_if.as_deref())?;
    // RDMA only on the fabric the data address is on.
    let fabric = fabric_if.or_else(|| {
        let ip = data?.ip();
        xfer::sysinfo::net::interfaces()
            .into_iter()
            .find(|i| i.addrs.iter().any(|(a, _)| *a == ip))
            .map(|i| i.name)
    });
    let nic = xfer::transport::select::choose_on(transport, fabric.as_deref())?;
    let scheduler = xfer::engine::scheduler::Config {
        window: window.max(1),
        ..Default::default()
    };
    xfer::agent::run(xfer::agent::AgentOptions {
        listen,
        data,
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
            containers,
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
        member_addrs,
        launch_models,
        budget: xfer::agent::keeper::BudgetConfig {
            max_bytes,
            max_percent,
            evict_above,
            evict_to: evict_to.or(evict_above.map(|h| h.saturating_sub(10).max(1))),
        },
        connections,
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// Every address of the cluster file's nodes: each agent's (its host name
/// looked up once, here) and each fabric address. A receiver dials peers
/// only there.
fn peer_addrs(c: &xfer::config::cluster::Cluster) -> xfer::flow::swarm::PeerAddrs {
    use std::net::ToSocketAddrs;
    let mut ips = std::collections::HashSet::new();
    for n in &c.nodes {
        match n.agent.to_socket_addrs() {
            Ok(addrs) => ips.extend(addrs.map(|a| a.ip())),
            Err(e) => tracing::warn!(
                "cannot look up {} (node {}): {e}; this agent will not link to it as a peer",
                n.agent,
                n.name
            ),
        }
        ips.extend(n.fabric_ip);
    }
    xfer::flow::swarm::PeerAddrs(ips)
}

/// The data address `--data` or `--fabric-if` names, with `--listen`'s port
/// unless `--data` gives one.
fn data_addr(
    listen: std::net::SocketAddr,
    data: Option<&str>,
    fabric_if: Option<&str>,
) -> Result<Option<std::net::SocketAddr>> {
    use std::net::{IpAddr, SocketAddr};
    if let Some(d) = data {
        if let Ok(a) = d.parse::<SocketAddr>() {
            return Ok(Some(a));
        }
        let ip: IpAddr = d.trim_start_matches('[').trim_end_matches(']').parse().map_err(|_| {
            anyhow::anyhow!("--data {d}: not IP[:PORT]; give this node's address on its fabric, e.g. --data 192.168.100.1")
        })?;
        return Ok(Some(SocketAddr::new(ip, listen.port())));
    }
    let Some(name) = fabric_if else {
        return Ok(None);
    };
    let ifaces = xfer::sysinfo::net::interfaces();
    let Some(iface) = ifaces.iter().find(|i| i.name == name) else {
        let names: Vec<&str> = ifaces.iter().map(|i| i.name.as_str()).collect();
        anyhow::bail!(
            "--fabric-if {name}: no such interface on this node (it has: {}); name the fabric's interface, or give --data IP",
            names.join(", ")
        );
    };
    let mut addrs: Vec<IpAddr> = iface.addrs.iter().map(|(a, _)| *a).collect();
    // IPv4 first; an IPv6 link-local address is no use to other nodes.
    addrs.retain(|a| !matches!(a, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80));
    addrs.sort_by_key(|a| a.is_ipv6());
    match addrs.first() {
        Some(ip) => Ok(Some(SocketAddr::new(*ip, listen.port()))),
        None => anyhow::bail!(
            "--fabric-if {name}: the interface has no address; give it one (`ip addr add`), or give --data IP"
        ),
    }
}
