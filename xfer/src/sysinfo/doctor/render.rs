//! `xfer doctor`'s plain-text report: its three sections as aligned
//! tables, the RoCE v2 IPv4 GID marked, and hints where a value is wrong.

use std::fmt::Write as _;

use super::{Fabric, LinkLayer, RdmaReport, Report, UdpBuffers};

/// The plain-text report.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    render_rdma(&mut out, &r.rdma);
    out.push('\n');
    render_fabric(&mut out, &r.fabric);
    out.push('\n');
    render_buffers(&mut out, &r.udp_buffers);
    out
}

pub(super) fn render_rdma(out: &mut String, r: &RdmaReport) {
    if let Some(why) = &r.none {
        let _ = writeln!(out, "RDMA: none ({why}); xfer uses QUIC");
        return;
    }
    let _ = writeln!(out, "RDMA devices ({}):", r.dir);
    let dash = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".to_string());
    for d in &r.devices {
        let netdevs = if d.netdevs.is_empty() {
            String::new()
        } else {
            format!(" (netdevs: {})", d.netdevs.join(", "))
        };
        let _ = writeln!(out, "  {}{netdevs}", d.name);
        if let Some(p) = &d.problem {
            let _ = writeln!(out, "    {p}");
        }
        for p in &d.ports {
            let _ = writeln!(out, "    port {}", p.port);
            let link = match &p.link_layer {
                Some(LinkLayer::Ethernet) => "Ethernet (RoCE)".to_string(),
                other => other.as_ref().map_or("-", LinkLayer::as_str).to_string(),
            };
            let netdev = match (&p.netdev, p.netdev_mtu) {
                (Some(nd), Some(m)) => format!("{nd} (mtu {m})"),
                (Some(nd), None) => nd.clone(),
                (None, _) => "-".to_string(),
            };
            let mtu = match p.mtu {
                Some(m) => format!("{m} ({})", p.mtu_note),
                None => p.mtu_note.clone(),
            };
            let gids = if p.gids.is_empty() {
                "none".to_string()
            } else {
                format!("{} non-zero", p.gids.len())
            };
            let rows: Vec<Vec<String>> = [
                ("state", dash(&p.state)),
                ("phys_state", dash(&p.phys_state)),
                ("link_layer", link),
                ("rate", dash(&p.rate)),
                ("netdev", netdev),
                ("mtu", mtu),
                ("gids", gids),
            ]
            .into_iter()
            .map(|(k, v)| vec![k.to_string(), v])
            .collect();
            table(out, "      ", &rows);
            if !p.gids.is_empty() {
                let mut rows = vec![vec![
                    "idx".to_string(),
                    "type".to_string(),
                    "netdev".to_string(),
                    "gid".to_string(),
                    String::new(),
                ]];
                for g in &p.gids {
                    rows.push(vec![
                        g.index.to_string(),
                        dash(&g.gid_type),
                        dash(&g.ndev),
                        g.ip.map_or_else(|| g.gid.clone(), |ip| ip.to_string()),
                        if g.roce_v2_ipv4 {
                            format!("<- RoCE v2 IPv4 (use gid_index = {})", g.index)
                        } else {
                            String::new()
                        },
                    ]);
                }
                table(out, "        ", &rows);
            }
            if p.link_layer == Some(LinkLayer::Ethernet) && p.gid_index.is_none() {
                let on = p.netdev.as_deref().unwrap_or("its netdev");
                let _ = writeln!(
                    out,
                    "      no RoCE v2 GID with an IPv4 address: the kernel adds one when {on} has an IPv4 address and is up"
                );
            }
        }
    }
}

pub(super) fn render_fabric(out: &mut String, f: &Fabric) {
    let _ = writeln!(out, "Fabric candidates (interfaces with an address):");
    if f.interfaces.is_empty() {
        let _ = writeln!(out, "  none");
    } else {
        let mut rows = vec![["name", "state", "mtu", "ipv4", "ipv6", ""]
            .map(str::to_string)
            .to_vec()];
        for c in &f.interfaces {
            let mut marks = Vec::new();
            if c.loopback {
                marks.push("loopback".to_string());
            }
            if c.default_route {
                let via = f
                    .default_route
                    .as_ref()
                    .and_then(|r| r.gateway)
                    .map_or_else(String::new, |g| format!(" via {g}"));
                marks.push(format!("<- default route{via}"));
            }
            let list = |v: &[String]| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.join(", ")
                }
            };
            rows.push(vec![
                c.name.clone(),
                c.operstate.to_string(),
                c.mtu.to_string(),
                list(&c.ipv4),
                list(&c.ipv6),
                marks.join(", "),
            ]);
        }
        table(out, "  ", &rows);
    }
    if !f.without_address.is_empty() {
        let _ = writeln!(
            out,
            "  without an address: {}",
            f.without_address.join(", ")
        );
    }
    if let Some(why) = &f.default_route_note {
        let _ = writeln!(out, "  default route: none ({why})");
    }
}

pub(super) fn render_buffers(out: &mut String, b: &UdpBuffers) {
    let _ = writeln!(out, "UDP socket buffers ({}):", b.dir);
    let rows: Vec<Vec<String>> = [
        ("rmem_max", &b.rmem_max),
        ("wmem_max", &b.wmem_max),
        ("rmem_default", &b.rmem_default),
        ("wmem_default", &b.wmem_default),
    ]
    .into_iter()
    .map(|(name, s)| {
        let value = match (s.bytes, &s.error) {
            (Some(n), _) => format!("{n} bytes ({:.1} MiB)", n as f64 / (1u64 << 20) as f64),
            (None, Some(e)) => format!("unreadable: {e}"),
            (None, None) => "unreadable".to_string(),
        };
        vec![name.to_string(), value]
    })
    .collect();
    table(out, "  ", &rows);
    if let Some(h) = &b.hint {
        let _ = writeln!(out, "  hint: {h}");
    }
}

/// Writes `rows` as columns two spaces apart, each line after `indent`;
/// trailing blanks are dropped.
fn table(out: &mut String, indent: &str, rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut width = vec![0; cols];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    for r in rows {
        let mut line = indent.to_string();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ", w = width[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}
