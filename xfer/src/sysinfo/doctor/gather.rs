//! Gathering `xfer doctor`'s reports: the RDMA devices under
//! `<sys>/class/infiniband` (through [`crate::sysinfo::rdma`]), the
//! interfaces and default route, and the UDP buffer sysctls under
//! `<proc>`. Nothing here fails: what cannot be read is reported with the
//! reason.

use std::io;
use std::path::Path;

use super::{
    Candidate, DefaultRoute, Fabric, RdmaDevice, RdmaPortReport, RdmaReport, Report, Sysctl,
    UdpBuffers, BUFFER_HINT, IB_MTUS, ROCE_OVERHEAD, WANTED_BUFFER,
};
use crate::sysinfo::net;
use crate::sysinfo::rdma::{self, read_attr, LinkLayer, SysPort};
use xfer_proto::launch::{IfaceFacts, Probe, RouteFacts};

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
    let gids = p.gids();
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
    let (mtu, mtu_note) = match (&link_layer, &netdev, netdev_mtu) {
        (Some(LinkLayer::InfiniBand), _, _) => (None, "n/a in sysfs (ibv_devinfo shows it)".to_string()),
        (Some(LinkLayer::Ethernet), Some(nd), Some(m)) => match roce_mtu(m) {
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
        (Some(LinkLayer::Ethernet), Some(nd), None) => (
            None,
            format!(
                "unknown: cannot read the MTU of {nd} at {}",
                mtu_path.as_ref().map_or_else(String::new, |p| p.display().to_string())
            ),
        ),
        (Some(LinkLayer::Ethernet), None, _) => (
            None,
            "unknown: no netdev behind this port (no GID names one, and device/net has none for it)"
                .to_string(),
        ),
        (other, _, _) => (
            None,
            format!(
                "unknown: link layer {}",
                other
                    .as_ref()
                    .map_or_else(|| "unreadable".to_string(), |l| format!("{:?}", l.as_str()))
            ),
        ),
    };
    RdmaPortReport {
        port: n,
        state: p.state_text.clone(),
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
