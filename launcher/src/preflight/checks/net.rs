//! The network checks: `fabric` (the address is on the interface, which
//! is up), `route` (what an engine would pick unpinned), `reach` (every
//! node connects to every other on the rendezvous port), `links` (one MTU)
//! and `ports` (the head's ports are free).

use std::net::IpAddr;

use xfer_proto::launch::Probe;

use crate::preflight::{by_value, rendezvous_port, spread, Ctx, Rows, Verdict};

/// `fabric`: the fabric_ip is on fabric_if, which is up.
pub fn fabric(ctx: &Ctx, rows: &mut Rows) {
    let (nodes, file) = (&ctx.nodes, &ctx.file);
    for (n, f) in nodes {
        let fix_at = format!("correct fabric_if / fabric_ip at {file}:{}", n.line);
        match &f.fabric {
            Probe::Ok(i) => {
                let has = i.addrs.iter().any(|(a, p)| {
                    *a == n.fabric_ip
                        // Linux answers for all of 127/8 on the loopback.
                        || (a.is_loopback() && n.fabric_ip.is_loopback() && in_prefix(*a, *p, n.fabric_ip))
                });
                let up =
                    i.operstate == "up" || (i.operstate == "unknown" && i.carrier != Some(false));
                if !has {
                    let elsewhere = f
                        .interfaces
                        .iter()
                        .find(|o| o.addrs.iter().any(|(a, _)| *a == n.fabric_ip))
                        .map(|o| format!("; {} is on {}", n.fabric_ip, o.name))
                        .unwrap_or_else(|| {
                            format!("; no interface of this node has {}", n.fabric_ip)
                        });
                    rows.add(
                        "fabric",
                        &n.name,
                        Verdict::Fail,
                        format!(
                            "{} is not on {} (it has {}){elsewhere}",
                            n.fabric_ip,
                            i.name,
                            addrs(&i.addrs)
                        ),
                        Some(fix_at),
                    );
                } else if !up || i.carrier == Some(false) {
                    rows.add(
                        "fabric",
                        &n.name,
                        Verdict::Fail,
                        format!("{} is {} (carrier {})", i.name, i.operstate, i.carrier.map_or("unknown", |c| if c { "on" } else { "off" })),
                        Some(format!("bring it up (`ip link set {} up`) and check the cable and the switch port", i.name)),
                    );
                } else {
                    rows.add(
                        "fabric",
                        &n.name,
                        Verdict::Pass,
                        format!(
                            "{} on {}, {}, mtu {}",
                            n.fabric_ip, i.name, i.operstate, i.mtu
                        ),
                        None,
                    );
                }
            }
            Probe::Failed(why) | Probe::Skipped(why) => {
                let names: Vec<&str> = f.interfaces.iter().map(|i| i.name.as_str()).collect();
                rows.add(
                    "fabric",
                    &n.name,
                    Verdict::Fail,
                    format!("{why} (interfaces: {})", names.join(", ")),
                    Some(fix_at),
                );
            }
        }
    }
}

/// `route`: what an engine would pick by itself.
pub fn route(ctx: &Ctx, rows: &mut Rows) {
    let nodes = &ctx.nodes;
    for (n, f) in nodes {
        match &f.default_route {
            Probe::Ok(r) => match r.src {
                Some(src) if src != n.fabric_ip => rows.add(
                    "route",
                    &n.name,
                    Verdict::Warn,
                    format!(
                        "the default route goes through {} ({src}), not the fabric: Ray, NCCL or SGLang left to themselves would pick {src}; the plan pins {} on {} (VLLM_HOST_IP/SGLANG_HOST_IP, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)",
                        r.iface, n.fabric_ip, n.fabric_if
                    ),
                    Some("nothing to do for xfer-launch; keep fabric_ip set, and pin the same variables in anything started by hand".into()),
                ),
                _ => rows.add(
                    "route",
                    &n.name,
                    Verdict::Pass,
                    format!("the default route goes through {} ({})", r.iface, n.fabric_ip),
                    None,
                ),
            },
            Probe::Skipped(why) => rows.add("route", &n.name, Verdict::Pass, format!("{why}: nothing to pick by mistake"), None),
            Probe::Failed(why) => rows.add("route", &n.name, Verdict::Skip, format!("skipped: {why}"), None),
        }
    }
}

/// `reach`: every node connects to every other over the fabric.
pub fn reach(ctx: &Ctx, rows: &mut Rows) {
    let (setup, nodes) = (ctx.setup, &ctx.nodes);
    let (rdv, rdv_what) = rendezvous_port(setup);
    for (n, f) in nodes {
        let mut bad = Vec::new();
        let mut good = Vec::new();
        for r in &f.reach {
            match &r.result {
                Probe::Ok(us) => good.push(format!(
                    "{} ({}) in {:.1} ms",
                    r.node,
                    r.addr,
                    *us as f64 / 1000.0
                )),
                Probe::Failed(e) | Probe::Skipped(e) => {
                    let peer_listen = nodes
                        .iter()
                        .find(|(p, _)| p.name == r.node.as_str())
                        .and_then(|(_, pf)| match &pf.listen {
                            Probe::Ok(_) => None,
                            Probe::Failed(w) | Probe::Skipped(w) => {
                                Some(format!(" ({} could not listen: {w})", r.node))
                            }
                        })
                        .unwrap_or_default();
                    bad.push(format!("{} at {}: {e}{peer_listen}", r.node, r.addr))
                }
            }
        }
        if !bad.is_empty() {
            rows.add(
                "reach",
                &n.name,
                Verdict::Fail,
                format!("cannot reach {} over {} on the {rdv_what} port {rdv}", bad.join("; "), n.fabric_if),
                Some(format!(
                    "the ranks meet there: check the fabric between these nodes (cable, VLAN, `nft list ruleset`/iptables on port {rdv}), e.g. `ping -I {} <peer fabric_ip>` on {}",
                    n.fabric_if, n.name
                )),
            );
        } else if good.is_empty() && setup.nodes.len() > 1 {
            let why = match &f.listen {
                Probe::Failed(w) | Probe::Skipped(w) => w.clone(),
                Probe::Ok(_) => "no result".into(),
            };
            rows.add(
                "reach",
                &n.name,
                Verdict::Fail,
                format!("the reachability round did not run: {why}"),
                Some("check that the agent is still running, then check again".into()),
            );
        } else if good.is_empty() {
            rows.add(
                "reach",
                &n.name,
                Verdict::Skip,
                "skipped: a single node has no peer to reach".into(),
                None,
            );
        } else {
            rows.add(
                "reach",
                &n.name,
                Verdict::Pass,
                format!("reaches {}", good.join(", ")),
                None,
            );
        }
    }
}

/// `rendezvous`: the nodes meet with the engine's own library (a Gloo
/// all-reduce in its Python), which TCP to one port does not prove.
pub fn rendezvous(ctx: &Ctx, rows: &mut Rows) {
    let (setup, nodes) = (ctx.setup, &ctx.nodes);
    for (n, f) in nodes {
        match &f.rendezvous {
            Probe::Ok(ms) => rows.add(
                "rendezvous",
                &n.name,
                Verdict::Pass,
                format!(
                    "Gloo all-reduce of {} ranks over {} in {ms} ms",
                    setup.nodes.len(),
                    n.fabric_if
                ),
                None,
            ),
            Probe::Skipped(why) => rows.add(
                "rendezvous",
                &n.name,
                Verdict::Skip,
                format!("skipped: {why}"),
                None,
            ),
            Probe::Failed(why) => rows.add(
                "rendezvous",
                &n.name,
                Verdict::Fail,
                format!(
                    "torch.distributed (Gloo) over {} did not meet the other ranks: {why}",
                    n.fabric_if
                ),
                Some(format!(
                    "the engine's ranks would hang the same way: Gloo and NCCL connect between the fabric addresses on ports of their own, so check that {} on {} is the interface that reaches the other nodes and that no firewall (`nft list ruleset`) drops connections between the fabric addresses",
                    n.fabric_if, n.name
                )),
            ),
        }
    }
}

/// `links`: one MTU on the fabric.
pub fn links(ctx: &Ctx, rows: &mut Rows) {
    let nodes = &ctx.nodes;
    let mtus = by_value(nodes.iter().filter_map(|(n, f)| match &f.fabric {
        Probe::Ok(i) => Some((i.mtu, n.name.as_str())),
        _ => None,
    }));
    match mtus.len() {
        0 => {}
        1 => {
            let mtu = mtus.keys().next().copied().unwrap_or(0);
            rows.add(
                "links",
                "*",
                Verdict::Pass,
                format!("mtu {mtu} on every fabric interface"),
                None,
            )
        }
        _ => {
            let list = spread(&mtus, |m| m.to_string(), "; ");
            rows.add(
                "links",
                "*",
                Verdict::Fail,
                format!("the fabric MTUs differ: {list}"),
                Some("set one MTU on every fabric interface (`ip link set IF mtu 9000`, and on the switch): NCCL hangs when large frames are dropped".into()),
            );
        }
    }
}

/// `ports`: the head's engine ports are free.
pub fn ports(ctx: &Ctx, rows: &mut Rows) {
    let (nodes, file) = (&ctx.nodes, &ctx.file);
    for (n, f) in nodes {
        let taken: Vec<String> = f
            .ports
            .iter()
            .filter_map(|p| match &p.free {
                Probe::Ok(()) => None,
                Probe::Failed(w) | Probe::Skipped(w) => {
                    Some(format!("{} port {} {w}", p.what, p.port))
                }
            })
            .collect();
        if f.ports.is_empty() {
            continue;
        }
        if taken.is_empty() {
            let list: Vec<String> = f
                .ports
                .iter()
                .map(|p| format!("{} {}", p.what, p.port))
                .collect();
            rows.add(
                "ports",
                &n.name,
                Verdict::Pass,
                format!("free: {}", list.join(", ")),
                None,
            );
        } else {
            rows.add(
                "ports",
                &n.name,
                Verdict::Fail,
                taken.join("; "),
                Some(format!(
                    "stop what holds it (`xfer-launch down` if it is an earlier launch), or choose another port in [launch] of {file} (master_port, api_port, ray_port, dist_port)"
                )),
            );
        }
    }
}

/// Whether `ip` is in `net`/`len`.
fn in_prefix(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

/// An interface's addresses, `IP/LEN, ...`.
fn addrs(a: &[(IpAddr, u8)]) -> String {
    if a.is_empty() {
        return "no address".into();
    }
    a.iter()
        .map(|(ip, p)| format!("{ip}/{p}"))
        .collect::<Vec<_>>()
        .join(", ")
}
