//! `xfer doctor` as a user runs it: on this machine (which has no RDMA
//! hardware) it says so and why, lists the loopback interface and the
//! real UDP buffer limits; pointed at a fake sysfs tree with `--json`, it
//! reports the RoCE v2 IPv4 GID to configure.

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

fn doctor(args: &[&str]) -> (Output, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xfer"))
        .arg("doctor")
        .args(args)
        .output()
        .expect("run xfer doctor");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "xfer doctor {args:?}: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (out, stdout)
}

#[test]
fn on_this_machine() {
    let (_, out) = doctor(&[]);
    if Path::new("/sys/class/infiniband").exists() {
        assert!(
            out.starts_with("RDMA devices (/sys/class/infiniband):"),
            "{out}"
        );
    } else {
        assert!(
            out.starts_with("RDMA: none (/sys/class/infiniband does not exist: no RDMA hardware, or the kernel lacks RDMA support (ib_core / rdma_rxe modules)); xfer uses QUIC\n"),
            "{out}"
        );
    }
    let lo = out
        .lines()
        .find(|l| l.trim_start().starts_with("lo "))
        .unwrap_or_else(|| panic!("no lo line:\n{out}"));
    assert!(
        lo.contains("127.0.0.1/8") && lo.contains("loopback"),
        "{lo}"
    );

    let rmem_max = fs::read_to_string("/proc/sys/net/core/rmem_max").unwrap();
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("rmem_max "))
        .unwrap_or_else(|| panic!("no rmem_max line:\n{out}"));
    assert!(
        line.contains(&format!(" {} bytes (", rmem_max.trim())),
        "{line} vs {rmem_max}"
    );
    let below = |name: &str| {
        let v = fs::read_to_string(format!("/proc/sys/net/core/{name}")).unwrap();
        v.trim().parse::<u64>().unwrap() < 64 << 20
    };
    assert_eq!(
        out.contains("hint: QUIC at 10+ Gb/s wants large socket buffers: sysctl -w net.core.rmem_max=67108864"),
        below("rmem_max") || below("wmem_max"),
        "{out}"
    );
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, format!("{text}\n")).unwrap();
}

#[test]
fn a_fake_roce_device_as_json() {
    let sys = tempfile::tempdir().unwrap();
    let port = sys.path().join("class/infiniband/rocep1s0f1/ports/1");
    write(&port.join("state"), "4: ACTIVE");
    write(&port.join("phys_state"), "5: LinkUp");
    write(&port.join("link_layer"), "Ethernet");
    write(&port.join("rate"), "200 Gb/sec (4X HDR)");
    for (i, gid, ty) in [
        (0, "fe80:0000:0000:0000:ba3f:d2ff:fe01:0001", "IB/RoCE v1"),
        (1, "fe80:0000:0000:0000:ba3f:d2ff:fe01:0001", "RoCE v2"),
        (2, "0000:0000:0000:0000:0000:ffff:c0a8:6401", "IB/RoCE v1"),
        (3, "0000:0000:0000:0000:0000:ffff:c0a8:6401", "RoCE v2"),
        (4, "0000:0000:0000:0000:0000:0000:0000:0000", ""),
    ] {
        write(&port.join(format!("gids/{i}")), gid);
        write(&port.join(format!("gid_attrs/types/{i}")), ty);
        write(&port.join(format!("gid_attrs/ndevs/{i}")), "enp1s0f1np1");
    }
    write(&sys.path().join("class/net/enp1s0f1np1/mtu"), "1500");

    let (_, out) = doctor(&["--json", "--sys", sys.path().to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(out.trim_end().lines().count(), 1, "{out}");
    let dev = &v["rdma"]["devices"][0];
    assert_eq!(dev["name"], "rocep1s0f1");
    let p = &dev["ports"][0];
    assert_eq!(p["state"], "4: ACTIVE");
    assert_eq!(p["netdev"], "enp1s0f1np1");
    assert_eq!(p["netdev_mtu"], 1500);
    assert_eq!(p["mtu"], 1024);
    assert_eq!(p["gid_index"], 3);
    let gids = p["gids"].as_array().unwrap();
    assert_eq!(gids.len(), 4, "the zero GID is left out: {p}");
    let v2: Vec<&serde_json::Value> = gids.iter().filter(|g| g["roce_v2_ipv4"] == true).collect();
    assert_eq!(v2.len(), 1, "{p}");
    assert_eq!(v2[0]["index"], 3);
    assert_eq!(v2[0]["type"], "RoCE v2");
    assert_eq!(v2[0]["ipv4"], "192.168.100.1");
    assert_eq!(v2[0]["ip"], "::ffff:192.168.100.1");
    // The other sections read this machine.
    let ifaces = v["fabric"]["interfaces"].as_array().unwrap();
    assert!(
        ifaces
            .iter()
            .any(|i| i["name"] == "lo" && i["loopback"] == true),
        "{v}"
    );
    assert!(v["udp_buffers"]["rmem_max"]["bytes"].is_u64(), "{v}");

    // The same tree as text.
    let (_, text) = doctor(&["--sys", sys.path().to_str().unwrap()]);
    let marked: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("<- RoCE v2 IPv4"))
        .collect();
    assert_eq!(marked.len(), 1, "{text}");
    assert!(marked[0].trim_start().starts_with("3 "), "{text}");
    assert!(marked[0].contains("::ffff:192.168.100.1"), "{text}");
    assert!(
        marked[0].ends_with("<- RoCE v2 IPv4 (use gid_index = 3)"),
        "{text}"
    );
}
