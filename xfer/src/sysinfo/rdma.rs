//! The RDMA device the cluster file names for this node, read from sysfs
//! (`class/infiniband/DEV/ports/N/{state,link_layer,gids/IDX}`): that it
//! exists, that a port is ACTIVE, and the GID at the configured index.
//! The sysfs root is a parameter so tests can build a fake tree.

use std::fs;
use std::path::Path;

use xfer_proto::launch::{Probe, RdmaFacts, RdmaNeed, RdmaPort};

/// Reads the device `need` names under `sys` (`/sys` on a real node).
pub fn rdma(sys: &Path, need: Option<&RdmaNeed>) -> Probe<RdmaFacts> {
    let Some(need) = need else {
        return Probe::Skipped("no rdma_device for this node in the cluster file".into());
    };
    let class = sys.join("class/infiniband");
    let Ok(entries) = fs::read_dir(&class) else {
        return Probe::Failed(format!(
            "no RDMA devices: {} does not exist (no RDMA hardware or the kernel lacks RDMA support)",
            class.display()
        ));
    };
    let dev = &need.device;
    let dir = class.join(dev);
    if !dir.is_dir() {
        let mut present: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().to_str().map(str::to_string))
            .collect();
        present.sort();
        let have = if present.is_empty() {
            "it has none".to_string()
        } else {
            format!("it has: {}", present.join(", "))
        };
        return Probe::Failed(format!(
            "no RDMA device {dev} on this node ({have}); fix rdma_device in the cluster file (`ibv_devices` lists them)"
        ));
    }
    let numbers = numbered(&dir.join("ports"));
    let ports: Vec<RdmaPort> = numbers
        .iter()
        .map(|&n| {
            let pdir = dir.join("ports").join(n.to_string());
            RdmaPort {
                port: n,
                state: read_attr(&pdir.join("state")).unwrap_or_else(|| "unknown".into()),
                link_layer: read_attr(&pdir.join("link_layer")).unwrap_or_else(|| "unknown".into()),
                // Not in sysfs (`ibv_devinfo` reports it).
                active_mtu: None,
            }
        })
        .collect();
    if ports.is_empty() {
        return Probe::Failed(format!(
            "{dev} has no ports in {}; check the driver with `ibv_devinfo -d {dev}`",
            dir.join("ports").display()
        ));
    }
    let state_name = |s: &str| s.split_once(':').map_or(s, |(_, n)| n).trim().to_string();
    let Some(active) = ports.iter().find(|p| state_name(&p.state) == "ACTIVE") else {
        let parts: Vec<String> = ports
            .iter()
            .map(|p| format!("port {} is {} ({})", p.port, state_name(&p.state), p.state))
            .collect();
        return Probe::Failed(format!(
            "{dev} {}; check the cable and the switch port",
            parts.join(", ")
        ));
    };
    let gid = match need.gid_index {
        None => None,
        Some(idx) => {
            let path = dir
                .join("ports")
                .join(active.port.to_string())
                .join("gids")
                .join(idx.to_string());
            match read_attr(&path) {
                Some(g) if !is_zero_gid(&g) => Some(g),
                _ => {
                    return Probe::Failed(format!(
                    "GID index {idx} of {dev} port {} is empty; `show_gids` lists the valid ones",
                    active.port
                ))
                }
            }
        }
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
                    state: "4: ACTIVE".into(),
                    link_layer: "Ethernet".into(),
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
