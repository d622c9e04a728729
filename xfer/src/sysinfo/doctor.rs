//! `xfer doctor`: what this node offers the data plane, as the kernel
//! reports it, for a person to read (or as one JSON object).
//!
//! This module owns the three reports and their rendering:
//!
//! - the RDMA devices under `<sys>/class/infiniband`: every port's state,
//!   link layer (InfiniBand or Ethernet, i.e. RoCE), rate, the netdev
//!   behind it, the MTU RoCE can use on it, and the GID table with the
//!   RoCE v2 IPv4 entries marked, since that index is what an RDMA
//!   transport over RoCE must be configured with;
//! - the interfaces a fabric could run on, from [`crate::sysinfo::net`]
//!   (`getifaddrs` and `/sys/class/net` of this machine, whatever `sys`
//!   says), with the IPv4 default route read from `<proc>/net/route`;
//! - the UDP socket buffer limits QUIC depends on, from
//!   `<proc>/sys/net/core`.
//!
//! Nothing here fails: what cannot be read is reported with the reason.
//! The sysfs and procfs roots are parameters so tests can use fake trees;
//! the sysfs readers are shared with [`crate::sysinfo::rdma`].

use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use serde::Serialize;

use crate::sysinfo::net;
use crate::sysinfo::rdma::{self, is_zero_gid, numbered, read_attr, SysPort};
use xfer_proto::launch::{IfaceFacts, Probe, RouteFacts};

/// The socket buffer limit below which the report suggests raising it.
pub const WANTED_BUFFER: u64 = 64 << 20;

/// The hint printed when `rmem_max` or `wmem_max` is below [`WANTED_BUFFER`].
pub const BUFFER_HINT: &str = "QUIC at 10+ Gb/s wants large socket buffers: sysctl -w net.core.rmem_max=67108864 net.core.wmem_max=67108864 (and in /etc/sysctl.d/)";

/// Bytes the kernel takes off a netdev's MTU before picking the IB MTU of
/// a RoCE port: `iboe_get_mtu` in `include/rdma/ib_addr.h` subtracts the
/// largest headers a RoCE packet may carry inside the Ethernet payload:
/// GRH/IP 40 + UDP 8 + BTH 12 + XRC ETH 4 + Atomic ETH 28 + ICRC 4.
pub const ROCE_OVERHEAD: u32 = 96;

/// The IB MTUs a port can run, ascending.
pub const IB_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// Everything `xfer doctor` reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub rdma: RdmaReport,
    pub fabric: Fabric,
    pub udp_buffers: UdpBuffers,
}

/// The RDMA devices of this node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RdmaReport {
    /// `<sys>/class/infiniband`.
    pub dir: String,
    pub devices: Vec<RdmaDevice>,
    /// Why there are no devices, when there are none.
    pub none: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RdmaDevice {
    /// "mlx5_0", "rocep1s0f1", ...
    pub name: String,
    /// The netdevs of its PCI device (`device/net/*`).
    pub netdevs: Vec<String>,
    pub ports: Vec<RdmaPortReport>,
    /// What is wrong with the device as a whole (no ports).
    pub problem: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RdmaPortReport {
    pub port: u32,
    /// "4: ACTIVE" as sysfs has it.
    pub state: Option<String>,
    /// "5: LinkUp".
    pub phys_state: Option<String>,
    /// "InfiniBand" or "Ethernet" (RoCE).
    pub link_layer: Option<String>,
    /// "100 Gb/sec (4X EDR)".
    pub rate: Option<String>,
    /// The netdev behind the port: the one GID 0 is bound to, else any
    /// GID's, else the device's netdev whose `dev_port` is this port's.
    pub netdev: Option<String>,
    /// `/sys/class/net/NETDEV/mtu`.
    pub netdev_mtu: Option<u32>,
    /// The IB MTU RoCE runs at on this port, derived from `netdev_mtu`
    /// (see [`roce_mtu`]); None for InfiniBand, whose active MTU sysfs
    /// does not show.
    pub mtu: Option<u32>,
    /// How `mtu` was found, or why it is unknown.
    pub mtu_note: String,
    /// Every non-zero GID.
    pub gids: Vec<GidEntry>,
    /// The first RoCE v2 GID with an IPv4 address: the index to configure.
    pub gid_index: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GidEntry {
    pub index: u32,
    /// As sysfs has it: "0000:0000:0000:0000:0000:ffff:c0a8:6401".
    pub gid: String,
    /// The GID as an IPv6 address ("::ffff:192.168.100.1"), when it is one.
    pub ip: Option<Ipv6Addr>,
    /// `gid_attrs/types/IDX`: "RoCE v2", "IB/RoCE v1".
    #[serde(rename = "type")]
    pub gid_type: Option<String>,
    /// `gid_attrs/ndevs/IDX`.
    pub ndev: Option<String>,
    /// The IPv4 address of an IPv4-mapped GID.
    pub ipv4: Option<Ipv4Addr>,
    /// A RoCE v2 GID with an IPv4 address.
    pub roce_v2_ipv4: bool,
}

/// The interfaces a fabric could use.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fabric {
    /// Every interface with an address, by name.
    pub interfaces: Vec<Candidate>,
    /// Interfaces without any address.
    pub without_address: Vec<String>,
    pub default_route: Option<DefaultRoute>,
    /// Why there is no default route, when there is none.
    pub default_route_note: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    pub name: String,
    pub loopback: bool,
    /// The IPv4 default route goes out of it.
    pub default_route: bool,
    pub operstate: String,
    pub mtu: u32,
    /// "10.0.0.5/24".
    pub ipv4: Vec<String>,
    pub ipv6: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DefaultRoute {
    pub iface: String,
    pub gateway: Option<IpAddr>,
    pub src: Option<IpAddr>,
}

/// `<proc>/sys/net/core/{r,w}mem_{max,default}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UdpBuffers {
    pub dir: String,
    pub rmem_max: Sysctl,
    pub wmem_max: Sysctl,
    pub rmem_default: Sysctl,
    pub wmem_default: Sysctl,
    /// [`BUFFER_HINT`], when a limit is below [`WANTED_BUFFER`].
    pub hint: Option<String>,
}

/// One sysctl value in bytes, or why it could not be read.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sysctl {
    pub bytes: Option<u64>,
    pub error: Option<String>,
}

/// Reads everything: RDMA under `sys`, the interfaces of this machine,
/// the default route and the buffers under `proc`.
pub fn gather(sys: &Path, proc: &Path) -> Report {
    let ifaces = net::interfaces();
    let route_path = proc.join("net/route");
    let route = match std::fs::read_to_string(&route_path) {
        Ok(text) => net::route_from(&text, &ifaces),
        Err(e) => Probe::Skipped(format!(
            "cannot read {}: {e}; mount procfs at {} to see routes",
            route_path.display(),
            proc.display()
        )),
    };
    Report {
        rdma: rdma_devices(sys),
        fabric: fabric(&ifaces, &route),
        udp_buffers: udp_buffers(proc),
    }
}

/// The IB MTU a RoCE port runs at over a netdev with MTU `netdev_mtu`:
/// the largest of [`IB_MTUS`] not above `netdev_mtu - ROCE_OVERHEAD`, the
/// kernel's own rule (`iboe_get_mtu`). 1500 gives 1024, 9000 gives 4096,
/// 4192 is the least that gives 4096. None below 352 (no IB MTU fits).
pub fn roce_mtu(netdev_mtu: u32) -> Option<u32> {
    let room = netdev_mtu.checked_sub(ROCE_OVERHEAD)?;
    IB_MTUS.iter().rev().copied().find(|&m| m <= room)
}

/// Every RDMA device under `<sys>/class/infiniband`, by name.
pub fn rdma_devices(sys: &Path) -> RdmaReport {
    let class = sys.join("class/infiniband");
    let dir = class.display().to_string();
    let entries = match std::fs::read_dir(&class) {
        Ok(e) => e,
        Err(e) => {
            let why = if e.kind() == io::ErrorKind::NotFound {
                format!("{dir} does not exist: no RDMA hardware, or the kernel lacks RDMA support (ib_core / rdma_rxe modules)")
            } else {
                format!("cannot read {dir}: {e}; run xfer doctor as a user who can read sysfs")
            };
            return RdmaReport {
                dir,
                devices: Vec::new(),
                none: Some(why),
            };
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
        .collect();
    names.sort();
    let devices: Vec<RdmaDevice> = names
        .iter()
        .map(|name| device(sys, &class.join(name), name))
        .collect();
    let none = devices
        .is_empty()
        .then(|| format!("no devices under {dir}"));
    RdmaReport { dir, devices, none }
}

/// One device folder.
fn device(sys: &Path, dir: &Path, name: &str) -> RdmaDevice {
    // The netdevs of the PCI device, with the port each serves
    // (`dev_port` counts from 0; absent means the first).
    let mut netdevs: Vec<(String, u32)> = std::fs::read_dir(dir.join("device/net"))
        .map(|es| {
            es.filter_map(|e| {
                let e = e.ok()?;
                let n = e.file_name().to_str()?.to_string();
                let dev_port = read_attr(&e.path().join("dev_port"))
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                Some((n, dev_port))
            })
            .collect()
        })
        .unwrap_or_default();
    netdevs.sort();
    let ports_dir = dir.join("ports");
    let ports: Vec<RdmaPortReport> = rdma::ports(sys, name)
        .iter()
        .map(|p| port(sys, p, &netdevs))
        .collect();
    let problem = ports.is_empty().then(|| {
        format!(
            "no ports in {}; check the driver with `ibv_devinfo -d {name}` and `dmesg`",
            ports_dir.display()
        )
    });
    RdmaDevice {
        name: name.to_string(),
        netdevs: netdevs.into_iter().map(|(n, _)| n).collect(),
        ports,
        problem,
    }
}

/// One port, with its GIDs, netdev and MTU.
fn port(sys: &Path, p: &SysPort, netdevs: &[(String, u32)]) -> RdmaPortReport {
    let (pdir, n) = (&p.dir, p.number);
    let gids: Vec<GidEntry> = numbered(&pdir.join("gids"))
        .into_iter()
        .filter_map(|i| {
            let gid = read_attr(&pdir.join("gids").join(i.to_string()))?;
            if is_zero_gid(&gid) {
                return None;
            }
            let ip: Option<Ipv6Addr> = gid.parse().ok();
            let gid_type = read_attr(&pdir.join("gid_attrs/types").join(i.to_string()))
                .filter(|s| !s.is_empty());
            let ndev = read_attr(&pdir.join("gid_attrs/ndevs").join(i.to_string()))
                .filter(|s| !s.is_empty());
            let ipv4 = ip.and_then(|ip| ip.to_ipv4_mapped());
            let roce_v2_ipv4 = ipv4.is_some() && gid_type.as_deref() == Some("RoCE v2");
            Some(GidEntry {
                index: i,
                gid,
                ip,
                gid_type,
                ndev,
                ipv4,
                roce_v2_ipv4,
            })
        })
        .collect();
    let netdev = gids
        .iter()
        .find(|g| g.index == 0 && g.ndev.is_some())
        .or_else(|| gids.iter().find(|g| g.ndev.is_some()))
        .and_then(|g| g.ndev.clone())
        .or_else(|| {
            netdevs
                .iter()
                .find(|(_, dev_port)| dev_port + 1 == n)
                .map(|(name, _)| name.clone())
        });
    let mtu_path = netdev
        .as_ref()
        .map(|nd| sys.join("class/net").join(nd).join("mtu"));
    let netdev_mtu: Option<u32> = mtu_path
        .as_ref()
        .and_then(|p| read_attr(p))
        .and_then(|s| s.parse().ok());
    let link_layer = p.link_layer.clone();
    let (mtu, mtu_note) = match (link_layer.as_deref(), &netdev, netdev_mtu) {
        (Some("InfiniBand"), _, _) => (None, "n/a in sysfs (ibv_devinfo shows it)".to_string()),
        (Some("Ethernet"), Some(nd), Some(m)) => match roce_mtu(m) {
            Some(ib) => (
                Some(ib),
                format!(
                    "largest IB MTU <= {nd} MTU {m} - {ROCE_OVERHEAD} bytes of RoCE headers, the kernel's rule"
                ),
            ),
            None => (
                None,
                format!(
                    "none: {nd} MTU {m} leaves no room for a 256-byte IB MTU; raise it (ip link set {nd} mtu 9000)"
                ),
            ),
        },
        (Some("Ethernet"), Some(nd), None) => (
            None,
            format!(
                "unknown: cannot read the MTU of {nd} at {}",
                mtu_path.as_ref().map_or_else(String::new, |p| p.display().to_string())
            ),
        ),
        (Some("Ethernet"), None, _) => (
            None,
            "unknown: no netdev behind this port (no GID names one, and device/net has none for it)"
                .to_string(),
        ),
        (other, _, _) => (
            None,
            format!(
                "unknown: link layer {}",
                other.map_or_else(|| "unreadable".to_string(), |l| format!("{l:?}"))
            ),
        ),
    };
    RdmaPortReport {
        port: n,
        state: p.state.clone(),
        phys_state: read_attr(&pdir.join("phys_state")),
        link_layer,
        rate: read_attr(&pdir.join("rate")),
        netdev,
        netdev_mtu,
        mtu,
        mtu_note,
        gid_index: gids.iter().find(|g| g.roce_v2_ipv4).map(|g| g.index),
        gids,
    }
}

/// The interfaces with an address, marked, and the default route.
pub fn fabric(ifaces: &[IfaceFacts], route: &Probe<RouteFacts>) -> Fabric {
    let (default_route, default_route_note) = match route {
        Probe::Ok(r) => (
            Some(DefaultRoute {
                iface: r.iface.clone(),
                gateway: r.gateway,
                src: r.src,
            }),
            None,
        ),
        Probe::Skipped(why) | Probe::Failed(why) => (None, Some(why.clone())),
    };
    let mut interfaces = Vec::new();
    let mut without_address = Vec::new();
    for i in ifaces {
        if i.addrs.is_empty() {
            without_address.push(i.name.clone());
            continue;
        }
        let with_prefix = |v4: bool| -> Vec<String> {
            i.addrs
                .iter()
                .filter(|(a, _)| a.is_ipv4() == v4)
                .map(|(a, p)| format!("{a}/{p}"))
                .collect()
        };
        interfaces.push(Candidate {
            name: i.name.clone(),
            loopback: i.name == "lo" || i.addrs.iter().all(|(a, _)| a.is_loopback()),
            default_route: default_route.as_ref().is_some_and(|r| r.iface == i.name),
            operstate: i.operstate.clone(),
            mtu: i.mtu,
            ipv4: with_prefix(true),
            ipv6: with_prefix(false),
        });
    }
    Fabric {
        interfaces,
        without_address,
        default_route,
        default_route_note,
    }
}

/// The UDP-relevant socket buffer sysctls under `<proc>/sys/net/core`.
pub fn udp_buffers(proc: &Path) -> UdpBuffers {
    let dir = proc.join("sys/net/core");
    let read = |name: &str| -> Sysctl {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => match text.trim().parse::<u64>() {
                Ok(n) => Sysctl {
                    bytes: Some(n),
                    error: None,
                },
                Err(_) => Sysctl {
                    bytes: None,
                    error: Some(format!(
                        "{} holds {:?}, not a byte count; check `sysctl net.core.{name}`",
                        path.display(),
                        text.trim()
                    )),
                },
            },
            Err(e) => Sysctl {
                bytes: None,
                error: Some(match e.kind() {
                    io::ErrorKind::NotFound => format!(
                        "cannot read {}: {e}; procfs is not mounted at {} or this network namespace hides net.core (check `sysctl net.core.{name}`)",
                        path.display(),
                        proc.display()
                    ),
                    _ => format!(
                        "cannot read {}: {e}; run xfer doctor as a user who can read it, or check `sysctl net.core.{name}`",
                        path.display()
                    ),
                }),
            },
        }
    };
    let (rmem_max, wmem_max) = (read("rmem_max"), read("wmem_max"));
    let small = |s: &Sysctl| s.bytes.is_some_and(|b| b < WANTED_BUFFER);
    let hint = (small(&rmem_max) || small(&wmem_max)).then(|| BUFFER_HINT.to_string());
    UdpBuffers {
        dir: dir.display().to_string(),
        rmem_max,
        wmem_max,
        rmem_default: read("rmem_default"),
        wmem_default: read("wmem_default"),
        hint,
    }
}

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

fn render_rdma(out: &mut String, r: &RdmaReport) {
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
            let link = match p.link_layer.as_deref() {
                Some("Ethernet") => "Ethernet (RoCE)".to_string(),
                other => other.unwrap_or("-").to_string(),
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
            if p.link_layer.as_deref() == Some("Ethernet") && p.gid_index.is_none() {
                let on = p.netdev.as_deref().unwrap_or("its netdev");
                let _ = writeln!(
                    out,
                    "      no RoCE v2 GID with an IPv4 address: the kernel adds one when {on} has an IPv4 address and is up"
                );
            }
        }
    }
}

fn render_fabric(out: &mut String, f: &Fabric) {
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
                c.operstate.clone(),
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

fn render_buffers(out: &mut String, b: &UdpBuffers) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysinfo::net::tests::iface;
    use std::fs;

    const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";
    const LINK_LOCAL: &str = "fe80:0000:0000:0000:ba3f:d2ff:fe01:0001";
    const V4_MAPPED: &str = "0000:0000:0000:0000:0000:ffff:c0a8:6401";

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, format!("{text}\n")).unwrap();
    }

    /// A port: its attributes and (index, gid, type, ndev) GID entries.
    fn port(
        sys: &Path,
        dev: &str,
        n: u32,
        attrs: &[(&str, &str)],
        gids: &[(u32, &str, Option<&str>, Option<&str>)],
    ) {
        let p = sys.join(format!("class/infiniband/{dev}/ports/{n}"));
        fs::create_dir_all(p.join("gids")).unwrap();
        for (k, v) in attrs {
            write(&p.join(k), v);
        }
        for (i, g, t, nd) in gids {
            write(&p.join("gids").join(i.to_string()), g);
            if let Some(t) = t {
                write(&p.join("gid_attrs/types").join(i.to_string()), t);
            }
            if let Some(nd) = nd {
                write(&p.join("gid_attrs/ndevs").join(i.to_string()), nd);
            }
        }
    }

    /// A RoCE device with port 1 ACTIVE (RoCE v2 IPv4 GID at 3) and
    /// port 2 DOWN, and an InfiniBand device.
    fn fake_sys(sys: &Path, netdev_mtu: u32) {
        let nd = "enp1s0f1np1";
        port(
            sys,
            "rocep1s0f1",
            1,
            &[
                ("state", "4: ACTIVE"),
                ("phys_state", "5: LinkUp"),
                ("link_layer", "Ethernet"),
                ("rate", "100 Gb/sec (4X EDR)"),
            ],
            &[
                (0, LINK_LOCAL, Some("IB/RoCE v1"), Some(nd)),
                (1, LINK_LOCAL, Some("RoCE v2"), Some(nd)),
                (2, V4_MAPPED, Some("IB/RoCE v1"), Some(nd)),
                (3, V4_MAPPED, Some("RoCE v2"), Some(nd)),
                (4, ZERO, None, None),
            ],
        );
        port(
            sys,
            "rocep1s0f1",
            2,
            &[
                ("state", "1: DOWN"),
                ("phys_state", "3: Disabled"),
                ("link_layer", "Ethernet"),
                ("rate", "100 Gb/sec (4X EDR)"),
            ],
            &[(0, ZERO, None, None)],
        );
        fs::create_dir_all(sys.join(format!("class/infiniband/rocep1s0f1/device/net/{nd}")))
            .unwrap();
        write(
            &sys.join(format!("class/net/{nd}/mtu")),
            &netdev_mtu.to_string(),
        );
        port(
            sys,
            "mlx5_0",
            1,
            &[
                ("state", "4: ACTIVE"),
                ("phys_state", "5: LinkUp"),
                ("link_layer", "InfiniBand"),
                ("rate", "200 Gb/sec (4X HDR)"),
            ],
            &[(0, "fe80:0000:0000:0000:0c42:a103:0065:ee7c", None, None)],
        );
        write(
            &sys.join("class/infiniband/mlx5_0/device/net/ib0/dev_port"),
            "0",
        );
        write(&sys.join("class/net/ib0/mtu"), "2044");
    }

    #[test]
    fn roce_mtu_follows_the_kernel_rule() {
        assert_eq!(roce_mtu(9000), Some(4096));
        assert_eq!(roce_mtu(4192), Some(4096));
        assert_eq!(roce_mtu(4191), Some(2048));
        assert_eq!(roce_mtu(1500), Some(1024));
        assert_eq!(roce_mtu(1024 + 96), Some(1024));
        assert_eq!(roce_mtu(1024 + 95), Some(512));
        assert_eq!(roce_mtu(352), Some(256));
        assert_eq!(roce_mtu(351), None);
        assert_eq!(roce_mtu(0), None);
    }

    #[test]
    fn a_roce_and_an_infiniband_device() {
        let sys = tempfile::tempdir().unwrap();
        fake_sys(sys.path(), 9000);
        let r = rdma_devices(sys.path());
        assert_eq!(r.none, None);
        let names: Vec<&str> = r.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["mlx5_0", "rocep1s0f1"]);

        let ib = &r.devices[0].ports[0];
        assert_eq!(ib.link_layer.as_deref(), Some("InfiniBand"));
        assert_eq!(ib.netdev.as_deref(), Some("ib0"));
        assert_eq!(ib.netdev_mtu, Some(2044));
        assert_eq!(ib.mtu, None);
        assert_eq!(ib.mtu_note, "n/a in sysfs (ibv_devinfo shows it)");
        assert_eq!(ib.gids.len(), 1);
        assert_eq!(ib.gids[0].gid_type, None);
        assert_eq!(ib.gid_index, None);

        let roce = &r.devices[1];
        assert_eq!(roce.netdevs, ["enp1s0f1np1"]);
        assert_eq!(roce.problem, None);
        let (p1, p2) = (&roce.ports[0], &roce.ports[1]);
        assert_eq!(p1.state.as_deref(), Some("4: ACTIVE"));
        assert_eq!(p1.phys_state.as_deref(), Some("5: LinkUp"));
        assert_eq!(p1.rate.as_deref(), Some("100 Gb/sec (4X EDR)"));
        assert_eq!(p1.netdev.as_deref(), Some("enp1s0f1np1"));
        assert_eq!(p1.netdev_mtu, Some(9000));
        assert_eq!(p1.mtu, Some(4096));
        let idx: Vec<u32> = p1.gids.iter().map(|g| g.index).collect();
        assert_eq!(idx, [0, 1, 2, 3], "the zero GID is left out");
        let marked: Vec<u32> = p1
            .gids
            .iter()
            .filter(|g| g.roce_v2_ipv4)
            .map(|g| g.index)
            .collect();
        assert_eq!(marked, [3], "v1 IPv4 and v2 link-local are not marked");
        assert_eq!(p1.gid_index, Some(3));
        assert_eq!(p1.gids[3].ipv4, Some(Ipv4Addr::new(192, 168, 100, 1)));
        assert_eq!(p1.gids[2].ipv4, Some(Ipv4Addr::new(192, 168, 100, 1)));
        assert_eq!(p1.gids[0].ipv4, None);

        assert_eq!(p2.state.as_deref(), Some("1: DOWN"));
        assert!(p2.gids.is_empty());
        assert_eq!(p2.netdev, None, "device/net's only netdev serves port 1");
        assert_eq!(p2.gid_index, None);
        assert!(
            p2.mtu_note.starts_with("unknown: no netdev"),
            "{}",
            p2.mtu_note
        );

        // A standard Ethernet MTU.
        write(&sys.path().join("class/net/enp1s0f1np1/mtu"), "1500");
        let r = rdma_devices(sys.path());
        assert_eq!(r.devices[1].ports[0].mtu, Some(1024));
    }

    #[test]
    fn the_rendering_marks_the_roce_v2_ipv4_gid() {
        let sys = tempfile::tempdir().unwrap();
        fake_sys(sys.path(), 9000);
        let mut out = String::new();
        render_rdma(&mut out, &rdma_devices(sys.path()));
        let marked: Vec<&str> = out.lines().filter(|l| l.contains("<-")).collect();
        assert_eq!(marked.len(), 1, "{out}");
        let cols: Vec<&str> = marked[0].split_whitespace().collect();
        assert_eq!(
            cols,
            [
                "3",
                "RoCE",
                "v2",
                "enp1s0f1np1",
                "::ffff:192.168.100.1",
                "<-",
                "RoCE",
                "v2",
                "IPv4",
                "(use",
                "gid_index",
                "=",
                "3)"
            ],
            "{out}"
        );
        assert!(
            out.contains("      mtu         4096 (largest IB MTU <= enp1s0f1np1 MTU 9000 - 96 bytes of RoCE headers, the kernel's rule)\n"),
            "{out}"
        );
        assert!(out.contains("      link_layer  Ethernet (RoCE)\n"), "{out}");
        assert!(
            out.contains("      mtu         n/a in sysfs (ibv_devinfo shows it)\n"),
            "{out}"
        );
        assert!(
            out.contains("  rocep1s0f1 (netdevs: enp1s0f1np1)\n"),
            "{out}"
        );
        assert!(out.contains("      state       1: DOWN\n"), "{out}");
        // The GID columns line up: every row's gid starts where the header's does.
        let header = out.lines().rfind(|l| l.contains("idx")).unwrap();
        let at = header.find("gid").unwrap();
        let row0 = out.lines().find(|l| l.contains("fe80::ba3f")).unwrap();
        assert_eq!(row0.find("fe80::"), Some(at), "{out}");
        assert_eq!(marked[0].find("::ffff:"), Some(at), "{out}");
        // Port 2 says how a RoCE v2 IPv4 GID comes to be.
        assert!(
            out.contains("no RoCE v2 GID with an IPv4 address: the kernel adds one when its netdev has an IPv4 address"),
            "{out}"
        );
    }

    #[test]
    fn the_json_has_the_same_data() {
        let sys = tempfile::tempdir().unwrap();
        fake_sys(sys.path(), 9000);
        let proc = tempfile::tempdir().unwrap();
        let r = Report {
            rdma: rdma_devices(sys.path()),
            fabric: fabric(&[], &Probe::Skipped("no IPv4 default route".into())),
            udp_buffers: udp_buffers(proc.path()),
        };
        let v = serde_json::to_value(&r).unwrap();
        let p1 = &v["rdma"]["devices"][1]["ports"][0];
        assert_eq!(p1["port"], 1);
        assert_eq!(p1["state"], "4: ACTIVE");
        assert_eq!(p1["link_layer"], "Ethernet");
        assert_eq!(p1["netdev"], "enp1s0f1np1");
        assert_eq!(p1["netdev_mtu"], 9000);
        assert_eq!(p1["mtu"], 4096);
        assert_eq!(p1["gid_index"], 3);
        let g3 = &p1["gids"][3];
        assert_eq!(g3["index"], 3);
        assert_eq!(g3["gid"], V4_MAPPED);
        assert_eq!(g3["ip"], "::ffff:192.168.100.1");
        assert_eq!(g3["type"], "RoCE v2");
        assert_eq!(g3["ndev"], "enp1s0f1np1");
        assert_eq!(g3["ipv4"], "192.168.100.1");
        assert_eq!(g3["roce_v2_ipv4"], true);
        assert_eq!(p1["gids"][2]["roce_v2_ipv4"], false);
        let ib = &v["rdma"]["devices"][0]["ports"][0];
        assert_eq!(ib["mtu"], serde_json::Value::Null);
        assert_eq!(ib["mtu_note"], "n/a in sysfs (ibv_devinfo shows it)");
        assert_eq!(v["rdma"]["none"], serde_json::Value::Null);
        assert_eq!(v["fabric"]["default_route_note"], "no IPv4 default route");
        assert!(v["udp_buffers"]["rmem_max"]["error"]
            .as_str()
            .unwrap()
            .starts_with("cannot read "));
    }

    #[test]
    fn no_devices() {
        let sys = tempfile::tempdir().unwrap();
        let r = rdma_devices(sys.path());
        assert!(r.devices.is_empty());
        let mut out = String::new();
        render_rdma(&mut out, &r);
        assert_eq!(
            out,
            format!(
                "RDMA: none ({}/class/infiniband does not exist: no RDMA hardware, or the kernel lacks RDMA support (ib_core / rdma_rxe modules)); xfer uses QUIC\n",
                sys.path().display()
            )
        );
        fs::create_dir_all(sys.path().join("class/infiniband")).unwrap();
        let mut out = String::new();
        render_rdma(&mut out, &rdma_devices(sys.path()));
        assert_eq!(
            out,
            format!(
                "RDMA: none (no devices under {}/class/infiniband); xfer uses QUIC\n",
                sys.path().display()
            )
        );
    }

    #[test]
    fn a_device_without_ports() {
        let sys = tempfile::tempdir().unwrap();
        fs::create_dir_all(sys.path().join("class/infiniband/rxe0")).unwrap();
        let r = rdma_devices(sys.path());
        let p = r.devices[0].problem.as_deref().unwrap();
        assert!(p.starts_with("no ports in "), "{p}");
        assert!(p.contains("`ibv_devinfo -d rxe0`"), "{p}");
    }

    #[test]
    fn fabric_candidates_mark_loopback_and_the_default_route() {
        let ifaces = [
            iface("eth0", &[("10.0.0.5", 24), ("fe80::1", 64)]),
            iface("ifb0", &[]),
            iface("lo", &[("127.0.0.1", 8), ("::1", 128)]),
        ];
        let route = Probe::Ok(RouteFacts {
            iface: "eth0".into(),
            gateway: Some("10.0.0.1".parse().unwrap()),
            src: Some("10.0.0.5".parse().unwrap()),
        });
        let f = fabric(&ifaces, &route);
        assert_eq!(f.without_address, ["ifb0"]);
        assert_eq!(f.interfaces.len(), 2);
        let (eth, lo) = (&f.interfaces[0], &f.interfaces[1]);
        assert!(eth.default_route && !eth.loopback);
        assert_eq!(eth.ipv4, ["10.0.0.5/24"]);
        assert_eq!(eth.ipv6, ["fe80::1/64"]);
        assert!(lo.loopback && !lo.default_route);
        let mut out = String::new();
        render_fabric(&mut out, &f);
        assert_eq!(
            out,
            "Fabric candidates (interfaces with an address):
  name  state  mtu   ipv4         ipv6
  eth0  up     1500  10.0.0.5/24  fe80::1/64  <- default route via 10.0.0.1
  lo    up     1500  127.0.0.1/8  ::1/128     loopback
  without an address: ifb0
"
        );
    }

    #[test]
    fn udp_buffers_with_a_hint_and_an_unreadable_one() {
        let proc = tempfile::tempdir().unwrap();
        let core = proc.path().join("sys/net/core");
        write(&core.join("rmem_max"), "4194304");
        write(&core.join("wmem_max"), "67108864");
        write(&core.join("rmem_default"), "212992");
        write(&core.join("wmem_default"), "lots");
        let b = udp_buffers(proc.path());
        assert_eq!(b.rmem_max.bytes, Some(4 << 20));
        assert_eq!(b.wmem_max.bytes, Some(64 << 20));
        assert_eq!(b.hint.as_deref(), Some(BUFFER_HINT));
        let mut out = String::new();
        render_buffers(&mut out, &b);
        assert!(
            out.contains("  rmem_max      4194304 bytes (4.0 MiB)\n"),
            "{out}"
        );
        assert!(
            out.contains("  wmem_max      67108864 bytes (64.0 MiB)\n"),
            "{out}"
        );
        assert!(
            out.contains("  rmem_default  212992 bytes (0.2 MiB)\n"),
            "{out}"
        );
        assert!(
            out.contains("  wmem_default  unreadable: ")
                && out.contains("holds \"lots\", not a byte count"),
            "{out}"
        );
        assert!(out.ends_with(&format!("  hint: {BUFFER_HINT}\n")), "{out}");

        write(&core.join("rmem_max"), "67108864");
        assert_eq!(udp_buffers(proc.path()).hint, None);
        fs::remove_file(core.join("rmem_max")).unwrap();
        let b = udp_buffers(proc.path());
        assert_eq!(b.rmem_max.bytes, None);
        let e = b.rmem_max.error.unwrap();
        assert!(
            e.starts_with("cannot read ") && e.contains("procfs is not mounted"),
            "{e}"
        );
    }
}
