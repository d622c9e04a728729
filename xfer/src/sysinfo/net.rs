//! The node's network as the kernel sees it: interfaces (`/sys/class/net`
//! and `getifaddrs`), the IPv4 default route (`/proc/net/route`) and
//! whether a TCP port is free, naming the process that holds it from
//! `/proc/net/tcp{,6}` and `/proc/*/fd`. The parsers are pure functions
//! over the text those files hold.

use std::collections::BTreeMap;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use xfer_proto::launch::{IfaceFacts, OperState, PortFacts, Probe, RouteFacts};

/// Every interface in `/sys/class/net`, sorted by name, with its state,
/// MTU and addresses.
pub fn interfaces() -> Vec<IfaceFacts> {
    let mut addrs = addresses();
    let Ok(entries) = fs::read_dir("/sys/class/net") else {
        // No sysfs: the addresses still say where an address is.
        return addrs
            .into_iter()
            .map(|(name, addrs)| IfaceFacts {
                name,
                operstate: OperState::Unknown,
                carrier: None,
                mtu: 0,
                addrs,
            })
            .collect();
    };
    let mut out: Vec<IfaceFacts> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let dir = e.path();
            let read = |f: &str| fs::read_to_string(dir.join(f)).ok();
            Some(IfaceFacts {
                operstate: read("operstate").map_or(OperState::Unknown, |s| OperState::parse(&s)),
                carrier: read("carrier").and_then(|s| match s.trim() {
                    "1" => Some(true),
                    "0" => Some(false),
                    _ => None,
                }),
                mtu: read("mtu").and_then(|s| s.trim().parse().ok()).unwrap_or(0),
                addrs: addrs.remove(&name).unwrap_or_default(),
                name,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether `ip` is this host's own (loopback, or an address of one of its
/// interfaces, in this network namespace).
pub fn is_own_address(ip: IpAddr) -> bool {
    ip.is_loopback() || addresses().values().flatten().any(|(a, _)| *a == ip)
}

/// The addresses of every interface, from `getifaddrs`.
fn addresses() -> BTreeMap<String, Vec<(IpAddr, u8)>> {
    let mut out: BTreeMap<String, Vec<(IpAddr, u8)>> = BTreeMap::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned; its
        // pointers are null or valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-null; its family says which sockaddr
        // it is, and so does the netmask's (when there is one).
        let (addr, prefix) = unsafe {
            match (*ifa.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    let ip = Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
                    let prefix = if ifa.ifa_netmask.is_null() {
                        32
                    } else {
                        let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in);
                        prefix_len(&m.sin_addr.s_addr.to_ne_bytes())
                    };
                    (IpAddr::V4(ip), prefix)
                }
                libc::AF_INET6 => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                    let prefix = if ifa.ifa_netmask.is_null() {
                        128
                    } else {
                        let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in6);
                        prefix_len(&m.sin6_addr.s6_addr)
                    };
                    (IpAddr::V6(ip), prefix)
                }
                _ => continue,
            }
        };
        out.entry(name).or_default().push((addr, prefix));
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The prefix length of a netmask: its count of one bits.
pub fn prefix_len(mask: &[u8]) -> u8 {
    mask.iter().map(|b| b.count_ones() as u8).sum()
}

/// The interface the ranks are pinned to.
pub fn fabric(name: &str, ifaces: &[IfaceFacts]) -> Probe<IfaceFacts> {
    match ifaces.iter().find(|i| i.name == name) {
        Some(i) => Probe::Ok(i.clone()),
        None => {
            let names: Vec<&str> = ifaces.iter().map(|i| i.name.as_str()).collect();
            Probe::Failed(format!(
                "no interface {name} on this node (it has: {}); fix fabric_if for this node in the cluster file",
                names.join(", ")
            ))
        }
    }
}

/// The IPv4 default route with the lowest metric, from `/proc/net/route`.
pub fn default_route() -> Probe<RouteFacts> {
    match fs::read_to_string("/proc/net/route") {
        Ok(text) => route_from(&text, &interfaces()),
        Err(e) => Probe::Skipped(format!(
            "cannot read /proc/net/route: {e}; the agent needs /proc mounted to report routes"
        )),
    }
}

/// The default route in `/proc/net/route` text, its source address taken
/// from `ifaces`.
pub fn route_from(text: &str, ifaces: &[IfaceFacts]) -> Probe<RouteFacts> {
    const RTF_UP: u32 = 0x1;
    let best = text
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let hex = |s: &str| u32::from_str_radix(s, 16).ok();
            let (dest, gw, flags, metric, mask) = (
                hex(f[1])?,
                hex(f[2])?,
                hex(f[3])?,
                f[6].parse::<u32>().ok()?,
                hex(f[7])?,
            );
            (dest == 0 && mask == 0 && flags & RTF_UP != 0).then_some((f[0], gw, metric))
        })
        .min_by_key(|&(_, _, metric)| metric);
    let Some((iface, gw, _)) = best else {
        return Probe::Skipped("no IPv4 default route".into());
    };
    // The kernel prints the address as a number in host byte order of
    // the network-order bytes.
    let gateway = (gw != 0).then(|| IpAddr::V4(Ipv4Addr::from(gw.to_ne_bytes())));
    let src = ifaces
        .iter()
        .find(|i| i.name == iface)
        .and_then(|i| i.addrs.iter().find(|(a, _)| a.is_ipv4()).map(|(a, _)| *a));
    Probe::Ok(RouteFacts {
        iface: iface.to_string(),
        gateway,
        src,
    })
}

/// Whether a server could bind `0.0.0.0:port` now; when not, who holds it.
pub fn port_free(what: &str, port: u16) -> PortFacts {
    PortFacts {
        what: what.to_string(),
        port,
        free: match try_bind(port) {
            Ok(()) => Probe::Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                Probe::Failed(match port_owner(port) {
                    Some((pid, name)) => format!("in use by {name} (pid {pid})"),
                    None => "in use (owner not visible)".to_string(),
                })
            }
            Err(e) => Probe::Failed(format!(
                "cannot bind 0.0.0.0:{port}: {e}; run the engine as a user allowed to bind it or pick another port"
            )),
        },
    }
}

/// Binds and listens like a server does (with SO_REUSEADDR), then lets go.
fn try_bind(port: u16) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())?;
    s.listen(1)?;
    Ok(())
}

/// The pid and name of a process holding a socket on `port`: a listening
/// one if any, else any socket bound to it.
pub fn port_owner(port: u16) -> Option<(u32, String)> {
    let tables: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .collect();
    let mut inodes: Vec<u64> = tables
        .iter()
        .flat_map(|t| socket_inodes(t, port, true))
        .collect();
    if inodes.is_empty() {
        inodes = tables
            .iter()
            .flat_map(|t| socket_inodes(t, port, false))
            .collect();
    }
    if inodes.is_empty() {
        return None;
    }
    let pid = inode_owner(Path::new("/proc"), &inodes)?;
    let name = fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    Some((pid, name))
}

/// The inodes of the sockets on local `port` in `/proc/net/tcp{,6}` text:
/// listening ones only (state 0A) when `listening`, else any. Sockets
/// without an inode (TIME_WAIT) are left out.
pub fn socket_inodes(text: &str, port: u16, listening: bool) -> Vec<u64> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                return None;
            }
            let (_, p) = f[1].rsplit_once(':')?;
            let p = u16::from_str_radix(p, 16).ok()?;
            let inode: u64 = f[9].parse().ok()?;
            (p == port && inode != 0 && (!listening || f[3] == "0A")).then_some(inode)
        })
        .collect()
}

/// The first process under `proc` with an fd on one of `inodes`.
fn inode_owner(proc: &Path, inodes: &[u64]) -> Option<u32> {
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let mut pids: Vec<u32> = fs::read_dir(proc)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().find(|pid| {
        let Ok(fds) = fs::read_dir(proc.join(pid.to_string()).join("fd")) else {
            return false;
        };
        fds.filter_map(|e| e.ok())
            .filter_map(|e| fs::read_link(e.path()).ok())
            .any(|l| l.to_str().is_some_and(|l| wanted.iter().any(|w| w == l)))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An interface that is up, with `addrs` (shared with doctor's tests).
    pub(crate) fn iface(name: &str, addrs: &[(&str, u8)]) -> IfaceFacts {
        IfaceFacts {
            name: name.into(),
            operstate: OperState::Up,
            carrier: Some(true),
            mtu: 1500,
            addrs: addrs
                .iter()
                .map(|(a, p)| (a.parse().unwrap(), *p))
                .collect(),
        }
    }

    #[test]
    fn prefix_lengths() {
        assert_eq!(prefix_len(&[255, 255, 255, 0]), 24);
        assert_eq!(prefix_len(&[255, 255, 240, 0]), 20);
        assert_eq!(prefix_len(&[0; 4]), 0);
        let mut v6 = [0u8; 16];
        v6[..8].fill(255);
        assert_eq!(prefix_len(&v6), 64);
    }

    #[test]
    fn real_interfaces_include_loopback() {
        let ifs = interfaces();
        let lo = ifs.iter().find(|i| i.name == "lo").expect("lo");
        assert!(
            lo.addrs.contains(&("127.0.0.1".parse().unwrap(), 8)),
            "{lo:?}"
        );
        assert!(lo.mtu > 0);
    }

    #[test]
    fn fabric_names_the_interfaces_there_are() {
        let ifs = vec![iface("eth0", &[]), iface("lo", &[])];
        assert_eq!(fabric("eth0", &ifs), Probe::Ok(ifs[0].clone()));
        match fabric("ib0", &ifs) {
            Probe::Failed(e) => assert!(
                e.starts_with("no interface ib0 on this node (it has: eth0, lo)"),
                "{e}"
            ),
            other => panic!("{other:?}"),
        }
    }

    const ROUTE: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
wlan0\t00000000\t0102A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0
eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
";

    #[test]
    fn default_route_with_the_lowest_metric() {
        let ifs = vec![
            iface(
                "eth0",
                &[("fe80::1", 64), ("10.0.0.5", 24), ("10.0.0.6", 24)],
            ),
            iface("wlan0", &[("192.168.2.7", 24)]),
        ];
        assert_eq!(
            route_from(ROUTE, &ifs),
            Probe::Ok(RouteFacts {
                iface: "eth0".into(),
                gateway: Some("10.0.0.1".parse().unwrap()),
                src: Some("10.0.0.5".parse().unwrap()),
            })
        );
        let only_wlan: String = ROUTE.lines().take(2).map(|l| format!("{l}\n")).collect();
        assert_eq!(
            route_from(&only_wlan, &ifs),
            Probe::Ok(RouteFacts {
                iface: "wlan0".into(),
                gateway: Some("192.168.2.1".parse().unwrap()),
                src: Some("192.168.2.7".parse().unwrap()),
            })
        );
    }

    #[test]
    fn no_default_route() {
        let text: String = ROUTE
            .lines()
            .enumerate()
            .filter(|(i, _)| *i == 0 || *i == 3)
            .map(|(_, l)| format!("{l}\n"))
            .collect();
        assert_eq!(
            route_from(&text, &[]),
            Probe::Skipped("no IPv4 default route".into())
        );
        assert_eq!(
            route_from("", &[]),
            Probe::Skipped("no IPv4 default route".into())
        );
    }

    #[test]
    fn listening_sockets_in_proc_net_tcp() {
        let tcp = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7368 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:7368 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 5151 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1F90 0100007F:7368 06 00000000:00000000 03:00000DAC 00000000     0        0 0 3 0000000000000000
";
        assert_eq!(socket_inodes(tcp, 29544, true), vec![4242]);
        assert_eq!(socket_inodes(tcp, 29544, false), vec![4242, 5151]);
        assert!(socket_inodes(tcp, 8080, false).is_empty());
        let tcp6 = "\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(socket_inodes(tcp6, 8080, true), vec![777]);
        assert!(socket_inodes("garbage\nmore garbage", 1, false).is_empty());
    }

    #[test]
    fn a_held_port_names_this_process() {
        let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let me = std::process::id();
        let comm = fs::read_to_string("/proc/self/comm").unwrap();
        let facts = port_free("master", port);
        assert_eq!(facts.what, "master");
        assert_eq!(facts.port, port);
        assert_eq!(
            facts.free,
            Probe::Failed(format!("in use by {} (pid {me})", comm.trim()))
        );
        drop(held);
        // Freed: a server could bind it now.
        assert_eq!(port_free("master", port).free, Probe::Ok(()));
    }
}
