//! `xfer doctor`: what this node offers the data plane, as the kernel
//! reports it, for a person to read (or as one JSON object).
//!
//! This module owns the three reports' types; reading them is in
//! `gather`, the plain text in `render`:
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
//! sysfs itself is read by [`crate::sysinfo::rdma`] (ports, states, GIDs).

use std::net::IpAddr;

use serde::Serialize;

pub use crate::sysinfo::rdma::{GidEntry, LinkLayer};
pub use xfer_proto::launch::OperState;

mod gather;
mod render;

pub use gather::{fabric, gather, rdma_devices, roce_mtu, udp_buffers};
pub use render::render;

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
    /// The RDMA devices.
    pub rdma: RdmaReport,
    /// The interfaces a fabric could use.
    pub fabric: Fabric,
    /// The UDP socket buffer limits.
    pub udp_buffers: UdpBuffers,
}

/// The RDMA devices of this node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RdmaReport {
    /// `<sys>/class/infiniband`.
    pub dir: String,
    /// Every device, by name.
    pub devices: Vec<RdmaDevice>,
    /// Why there are no devices, when there are none.
    pub none: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
/// One RDMA device.
pub struct RdmaDevice {
    /// "mlx5_0", "rocep1s0f1", ...
    pub name: String,
    /// The netdevs of its PCI device (`device/net/*`).
    pub netdevs: Vec<String>,
    /// Its ports, ascending.
    pub ports: Vec<RdmaPortReport>,
    /// What is wrong with the device as a whole (no ports).
    pub problem: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
/// One port of an RDMA device.
pub struct RdmaPortReport {
    /// Its number.
    pub port: u32,
    /// "4: ACTIVE" as sysfs has it.
    pub state: Option<String>,
    /// "5: LinkUp".
    pub phys_state: Option<String>,
    /// InfiniBand or Ethernet (RoCE), as sysfs writes it.
    pub link_layer: Option<LinkLayer>,
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

/// The interfaces a fabric could use.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fabric {
    /// Every interface with an address, by name.
    pub interfaces: Vec<Candidate>,
    /// Interfaces without any address.
    pub without_address: Vec<String>,
    /// The IPv4 default route, if any.
    pub default_route: Option<DefaultRoute>,
    /// Why there is no default route, when there is none.
    pub default_route_note: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
/// An interface a fabric could use.
pub struct Candidate {
    /// Its name.
    pub name: String,
    /// Whether it is loopback (by name, or every address is).
    pub loopback: bool,
    /// The IPv4 default route goes out of it.
    pub default_route: bool,
    /// Its operstate.
    pub operstate: OperState,
    /// Its MTU.
    pub mtu: u32,
    /// "10.0.0.5/24".
    pub ipv4: Vec<String>,
    /// Its IPv6 addresses with prefix length.
    pub ipv6: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
/// The IPv4 default route.
pub struct DefaultRoute {
    /// The interface it goes out of.
    pub iface: String,
    /// Its gateway, if any.
    pub gateway: Option<IpAddr>,
    /// The source address the route uses, if known.
    pub src: Option<IpAddr>,
}

/// `<proc>/sys/net/core/{r,w}mem_{max,default}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UdpBuffers {
    /// `<proc>/sys/net/core`.
    pub dir: String,
    /// `rmem_max`.
    pub rmem_max: Sysctl,
    /// `wmem_max`.
    pub wmem_max: Sysctl,
    /// `rmem_default`.
    pub rmem_default: Sysctl,
    /// `wmem_default`.
    pub wmem_default: Sysctl,
    /// [`BUFFER_HINT`], when a limit is below [`WANTED_BUFFER`].
    pub hint: Option<String>,
}

/// One sysctl value in bytes, or why it could not be read.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sysctl {
    /// The value, when read.
    pub bytes: Option<u64>,
    /// Why it could not be read.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::render::{render_buffers, render_fabric, render_rdma};
    use super::*;
    use crate::sysinfo::net::tests::iface;
    use std::fs;
    use std::net::Ipv4Addr;
    use std::path::Path;
    use xfer_proto::launch::{Probe, RouteFacts};

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
        assert_eq!(ib.link_layer, Some(LinkLayer::InfiniBand));
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
