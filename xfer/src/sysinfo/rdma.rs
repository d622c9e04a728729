//! RDMA devices and ports as sysfs shows them
//! (`class/infiniband/DEV/ports/N/{state,link_layer,gids/IDX}`), read in
//! one place: [`devices`] and [`ports`] give typed [`SysPort`]s that the
//! preflight probe ([`rdma`]), `xfer doctor` and the `--transport` choice
//! all use, with the port state and link layer parsed ([`PortState`],
//! [`LinkLayer`]) and the GID table ([`SysPort::gids`]). [`rdma`] checks
//! the device the cluster file names for this node: that it exists, that
//! a port is ACTIVE, and the GID at the configured index. The sysfs root is a parameter so tests can build a
//! fake tree.

use std::fs;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use xfer_proto::rdma::{LinkLayer, PortState};

/// One port of an RDMA device, as sysfs shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysPort {
    /// The device's name ("mlx5_0").
    pub device: String,
    /// The port's number (from 1).
    pub number: u32,
    /// `<sys>/class/infiniband/DEV/ports/N`.
    pub dir: PathBuf,
    /// The state as sysfs writes it ("4: ACTIVE"); None when unreadable.
    pub state_text: Option<String>,
    /// The state, parsed.
    pub state: PortState,
    /// InfiniBand or Ethernet (RoCE); None when unreadable.
    pub link_layer: Option<LinkLayer>,
}

/// One non-zero entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GidEntry {
    /// Its index in the table.
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

impl SysPort {
    /// The state's name ("ACTIVE", "DOWN", ...) without its number.
    pub fn state_name(&self) -> &str {
        self.state.name()
    }

    /// Whether the port is ACTIVE.
    pub fn is_active(&self) -> bool {
        self.state == PortState::Active
    }

    /// Every non-zero entry of the port's GID table, by index.
    pub fn gids(&self) -> Vec<GidEntry> {
        let pdir = &self.dir;
        numbered(&pdir.join("gids"))
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
            .collect()
    }

    /// The index of the first RoCE v2 GID with an IPv4 address (what
    /// `show_gids` marks, the one an RDMA transport over RoCE uses).
    pub fn roce_v2_ipv4_gid_index(&self) -> Option<u32> {
        self.gids().iter().find(|g| g.roce_v2_ipv4).map(|g| g.index)
    }

    /// The network interfaces this port's GIDs are bound to
    /// (`gid_attrs/ndevs/IDX`; RoCE), and the device's own
    /// (`device/net/*`), sorted and deduplicated.
    pub fn netdevs(&self) -> Vec<String> {
        let ndevs = self.dir.join("gid_attrs/ndevs");
        let mut out: Vec<String> = numbered(&ndevs)
            .into_iter()
            .filter_map(|i| read_attr(&ndevs.join(i.to_string())))
            .collect();
        if let Some(dev_dir) = self.dir.parent().and_then(Path::parent) {
            if let Ok(entries) = fs::read_dir(dev_dir.join("device/net")) {
                out.extend(entries.filter_map(|e| e.ok()?.file_name().into_string().ok()));
            }
        }
        out.retain(|n| !n.is_empty());
        out.sort();
        out.dedup();
        out
    }

    /// The GID at `index`, unless that entry is empty (all zero) or absent.
    pub fn gid(&self, index: u32) -> Option<String> {
        read_attr(&self.dir.join("gids").join(index.to_string())).filter(|g| !is_zero_gid(g))
    }
}

/// `<sys>/class/infiniband`.
pub fn class_dir(sys: &Path) -> PathBuf {
    sys.join("class/infiniband")
}

/// The RDMA devices under `<sys>/class/infiniband`, by name; the error is
/// the folder's (NotFound: no RDMA hardware or kernel support).
pub fn devices(sys: &Path) -> io::Result<Vec<String>> {
    let mut names: Vec<String> = fs::read_dir(class_dir(sys))?
        .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
        .collect();
    names.sort();
    Ok(names)
}

/// The ports of device `dev`, ascending (empty when it has none or the
/// folder cannot be read).
pub fn ports(sys: &Path, dev: &str) -> Vec<SysPort> {
    let dir = class_dir(sys).join(dev).join("ports");
    numbered(&dir)
        .into_iter()
        .map(|n| {
            let pdir = dir.join(n.to_string());
            let state = read_attr(&pdir.join("state"));
            SysPort {
                device: dev.to_string(),
                number: n,
                state: PortState::parse(state.as_deref()),
                state_text: state,
                link_layer: read_attr(&pdir.join("link_layer")).map(|l| LinkLayer::parse(&l)),
                dir: pdir,
            }
        })
        .collect()
}

use xfer_proto::launch::{Probe, RdmaFacts, RdmaNeed, RdmaPort};

/// Reads the device `need` names under `sys` (`/sys` on a real node).
pub fn rdma(sys: &Path, need: Option<&RdmaNeed>) -> Probe<RdmaFacts> {
    let Some(need) = need else {
        return Probe::Skipped("no rdma_device for this node in the cluster file".into());
    };
    let class = class_dir(sys);
    let Ok(present) = devices(sys) else {
        return Probe::Failed(format!(
            "no RDMA devices: {} does not exist (no RDMA hardware or the kernel lacks RDMA support)",
            class.display()
        ));
    };
    let dev = &need.device;
    let dir = class.join(dev);
    if !dir.is_dir() {
        let have = if present.is_empty() {
            "it has none".to_string()
        } else {
            format!("it has: {}", present.join(", "))
        };
        return Probe::Failed(format!(
            "no RDMA device {dev} on this node ({have}); fix rdma_device in the cluster file (`ibv_devices` lists them)"
        ));
    }
    let found = ports(sys, dev);
    let ports: Vec<RdmaPort> = found
        .iter()
        .map(|p| RdmaPort {
            port: p.number,
            state: p.state.clone(),
            link_layer: p.link_layer.clone(),
            // Not in sysfs (`ibv_devinfo` reports it).
            active_mtu: None,
        })
        .collect();
    if ports.is_empty() {
        return Probe::Failed(format!(
            "{dev} has no ports in {}; check the driver with `ibv_devinfo -d {dev}`",
            dir.join("ports").display()
        ));
    }
    let Some(active) = found.iter().find(|p| p.is_active()) else {
        let parts: Vec<String> = found
            .iter()
            .map(|p| {
                format!(
                    "port {} is {} ({})",
                    p.number,
                    p.state_name(),
                    p.state_text.as_deref().unwrap_or("unknown")
                )
            })
            .collect();
        return Probe::Failed(format!(
            "{dev} {}; check the cable and the switch port",
            parts.join(", ")
        ));
    };
    let gid = match need.gid_index {
        None => None,
        Some(idx) => match active.gid(idx) {
            Some(g) => Some(g),
            None => {
                return Probe::Failed(format!(
                    "GID index {idx} of {dev} port {} is empty; `show_gids` lists the valid ones",
                    active.number
                ))
            }
        },
    };
    Probe::Ok(RdmaFacts {
        device: dev.clone(),
        ports,
        gid,
    })
}

/// A sysfs attribute, trimmed; None when it cannot be read (absent, or
/// the driver refuses the read, as some do for `gid_attrs` of an
/// InfiniBand port).
pub fn read_attr(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// The numeric entries of a sysfs folder (`ports/`, `gids/`), ascending;
/// empty when it cannot be read.
pub fn numbered(dir: &Path) -> Vec<u32> {
    let mut out: Vec<u32> = fs::read_dir(dir)
        .map(|es| {
            es.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

/// "0000:0000:0000:0000:0000:0000:0000:0000" or anything else with no
/// non-zero digit.
pub fn is_zero_gid(g: &str) -> bool {
    g.chars().all(|c| c == '0' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";
    const GID: &str = "0000:0000:0000:0000:0000:ffff:0a00:0005";

    fn port(sys: &Path, dev: &str, n: u32, state: &str, gids: &[(u32, &str)]) {
        let p = sys.join(format!("class/infiniband/{dev}/ports/{n}"));
        fs::create_dir_all(p.join("gids")).unwrap();
        fs::write(p.join("state"), format!("{state}\n")).unwrap();
        fs::write(p.join("link_layer"), "Ethernet\n").unwrap();
        for (i, g) in gids {
            fs::write(p.join("gids").join(i.to_string()), format!("{g}\n")).unwrap();
        }
    }

    fn need(dev: &str, gid_index: Option<u32>) -> RdmaNeed {
        RdmaNeed {
            device: dev.into(),
            gid_index,
        }
    }

    fn failed(p: Probe<RdmaFacts>) -> String {
        match p {
            Probe::Failed(e) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_active_port_with_its_gid() {
        let sys = tempfile::tempdir().unwrap();
        port(sys.path(), "mlx5_0", 1, "4: ACTIVE", &[(0, ZERO), (3, GID)]);
        assert_eq!(
            rdma(sys.path(), Some(&need("mlx5_0", Some(3)))),
            Probe::Ok(RdmaFacts {
                device: "mlx5_0".into(),
                ports: vec![RdmaPort {
                    port: 1,
                    state: PortState::Active,
                    link_layer: Some(LinkLayer::Ethernet),
                    active_mtu: None,
                }],
                gid: Some(GID.into()),
            })
        );
        match rdma(sys.path(), Some(&need("mlx5_0", None))) {
            Probe::Ok(f) => assert_eq!(f.gid, None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nothing_asked_or_nothing_there() {
        let sys = tempfile::tempdir().unwrap();
        assert_eq!(
            rdma(sys.path(), None),
            Probe::Skipped("no rdma_device for this node in the cluster file".into())
        );
        let e = failed(rdma(sys.path(), Some(&need("mlx5_0", None))));
        assert!(e.starts_with("no RDMA devices: "), "{e}");
        assert!(e.ends_with("/class/infiniband does not exist (no RDMA hardware or the kernel lacks RDMA support)"), "{e}");
        fs::create_dir_all(sys.path().join("class/infiniband")).unwrap();
        let e = failed(rdma(sys.path(), Some(&need("mlx5_0", None))));
        assert!(e.contains("(it has none)"), "{e}");
    }

    #[test]
    fn a_missing_device_lists_those_present() {
        let sys = tempfile::tempdir().unwrap();
        port(sys.path(), "rocep1s0f1", 1, "4: ACTIVE", &[]);
        port(sys.path(), "rocep1s0f0", 1, "4: ACTIVE", &[]);
        let e = failed(rdma(sys.path(), Some(&need("mlx5_0", None))));
        assert!(
            e.starts_with("no RDMA device mlx5_0 on this node (it has: rocep1s0f0, rocep1s0f1); fix rdma_device"),
            "{e}"
        );
    }

    #[test]
    fn a_down_port() {
        let sys = tempfile::tempdir().unwrap();
        port(sys.path(), "mlx5_0", 1, "1: DOWN", &[(3, GID)]);
        assert_eq!(
            failed(rdma(sys.path(), Some(&need("mlx5_0", Some(3))))),
            "mlx5_0 port 1 is DOWN (1: DOWN); check the cable and the switch port"
        );
        // A second port that is up is enough.
        port(sys.path(), "mlx5_0", 2, "4: ACTIVE", &[(3, GID)]);
        assert!(matches!(
            rdma(sys.path(), Some(&need("mlx5_0", Some(3)))),
            Probe::Ok(RdmaFacts { ports, .. }) if ports.len() == 2
        ));
        let sys = tempfile::tempdir().unwrap();
        fs::create_dir_all(sys.path().join("class/infiniband/mlx5_0")).unwrap();
        let e = failed(rdma(sys.path(), Some(&need("mlx5_0", None))));
        assert!(e.starts_with("mlx5_0 has no ports"), "{e}");
    }

    #[test]
    fn an_empty_or_missing_gid() {
        let sys = tempfile::tempdir().unwrap();
        port(sys.path(), "mlx5_0", 1, "4: ACTIVE", &[(3, ZERO)]);
        let want = "GID index 3 of mlx5_0 port 1 is empty; `show_gids` lists the valid ones";
        assert_eq!(
            failed(rdma(sys.path(), Some(&need("mlx5_0", Some(3))))),
            want
        );
        fs::remove_file(sys.path().join("class/infiniband/mlx5_0/ports/1/gids/3")).unwrap();
        assert_eq!(
            failed(rdma(sys.path(), Some(&need("mlx5_0", Some(3))))),
            want
        );
    }
}
