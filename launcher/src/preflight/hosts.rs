//! The `/etc/hosts` lines that fix the `resolver` row: every node's fabric
//! address with a stable name, so that the reverse lookups torch.distributed
//! makes of them are answered from the file, before any name server
//! (`xfer-launch hosts` prints them).

use std::fmt::Write as _;
use std::net::IpAddr;

/// The name a node's fabric address gets: its cluster-file name, lower
/// case, `_` as `-`, with `-fabric` after it (never the node's own host
/// name, which its management address keeps).
pub fn fabric_name(node: &str) -> String {
    let base: String = node
        .chars()
        .map(|c| match c {
            '_' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    format!("{base}-fabric")
}

/// The lines for `nodes` (name, fabric address), with a comment saying
/// where they come from; nodes without a fabric address are named in a
/// comment. `file` is the cluster file, for that comment.
pub fn lines(file: &str, nodes: &[(&str, Option<IpAddr>)]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# The fabric addresses of {file} (xfer-launch hosts): add these lines to /etc/hosts on every node"
    );
    for (name, ip) in nodes {
        match ip {
            Some(ip) => {
                let _ = writeln!(o, "{ip}\t{}", fabric_name(name));
            }
            None => {
                let _ = writeln!(o, "# {name}: no fabric_ip in the cluster file");
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fabric_address_gets_one_line_with_a_stable_name() {
        let ip = |s: &str| Some(s.parse().unwrap());
        let out = lines(
            "c.toml",
            &[
                ("Spark_A", ip("192.168.100.1")),
                ("spark-b", ip("fd00::2")),
                ("mgmt-only", None),
            ],
        );
        let body: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            body,
            ["192.168.100.1\tspark-a-fabric", "fd00::2\tspark-b-fabric"]
        );
        assert!(out.starts_with("# The fabric addresses of c.toml"), "{out}");
        assert!(out.contains("# mgmt-only: no fabric_ip"), "{out}");
        // The same input, the same lines.
        assert_eq!(fabric_name("n1"), "n1-fabric");
    }
}
