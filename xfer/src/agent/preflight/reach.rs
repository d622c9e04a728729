//! TCP reachability between the nodes over the fabric. Every node listens
//! on its fabric address for the whole window while connecting to every
//! peer's listener, retrying as peers start at slightly different moments;
//! what it reports is whether it could listen and, per peer, the connect
//! time or the last error.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep_until, timeout_at, Instant};

use super::{Probe, ReachFacts, ReachTarget};

/// Pause between two connect attempts to a peer.
pub const RETRY: Duration = Duration::from_millis(100);

/// Listens on `listen` and connects to every peer, for `window` at most.
/// Every peer connects to every other, so a listening node returns once
/// it reached every peer and accepted as many connections as it has
/// peers, or when the window is over (a slow peer may still be trying to
/// reach it); a node that does not listen, once every peer answered.
pub async fn probe(
    listen: Option<SocketAddr>,
    peers: &[ReachTarget],
    window: Duration,
) -> (Probe<SocketAddr>, Vec<ReachFacts>) {
    let deadline = Instant::now() + window;
    let expected = peers.len();
    let (listened, acceptor) = match listen {
        None => (
            Probe::Skipped("no listen port in the request; peers cannot test this node".into()),
            None,
        ),
        Some(addr) => match TcpListener::bind(addr).await {
            Ok(l) => (
                Probe::Ok(addr),
                Some(tokio::spawn(async move {
                    // Accept and drop until every peer came or the window
                    // ends; an accept error (out of fds) only pauses it.
                    let mut accepted = 0;
                    while accepted < expected {
                        match timeout_at(deadline, l.accept()).await {
                            Ok(Ok(_)) => accepted += 1,
                            Ok(Err(_)) => sleep_until(Instant::now() + RETRY).await,
                            Err(_) => break,
                        }
                    }
                })),
            ),
            Err(e) => (Probe::Failed(listen_error(addr, &e)), None),
        },
    };
    let tasks: Vec<_> = peers
        .iter()
        .map(|p| {
            let addr = p.addr;
            tokio::spawn(async move { connect(addr, window, deadline).await })
        })
        .collect();
    let mut reach = Vec::with_capacity(peers.len());
    for (p, t) in peers.iter().zip(tasks) {
        reach.push(ReachFacts {
            node: p.node.clone(),
            addr: p.addr,
            result: t
                .await
                .unwrap_or_else(|e| Probe::Failed(format!("the connect task failed: {e}"))),
        });
    }
    if let Some(a) = acceptor {
        let _ = a.await;
    }
    (listened, reach)
}

fn listen_error(addr: SocketAddr, e: &std::io::Error) -> String {
    let fix = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "; another process holds that port: stop it or pick another port".to_string()
        }
        std::io::ErrorKind::AddrNotAvailable => format!(
            "; {} is not an address of this node: fix fabric_ip in the cluster file or configure it on fabric_if",
            addr.ip()
        ),
        _ => String::new(),
    };
    format!("cannot listen on {addr}: {}{fix}", short(e))
}

/// An io error without the "(os error N)" suffix, lower-case where the
/// kind says it all.
fn short(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused => "connection refused".into(),
        AddrInUse => "address already in use".into(),
        AddrNotAvailable => "address not available".into(),
        HostUnreachable => "host unreachable".into(),
        NetworkUnreachable => "network unreachable".into(),
        _ => e.to_string(),
    }
}

/// "3s", "1.5s", "300ms".
fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Connects to `addr` until it works or `deadline` passes: the connect
/// time in microseconds, or the last error.
async fn connect(addr: SocketAddr, window: Duration, deadline: Instant) -> Probe<u64> {
    let timed_out = || Probe::Failed(format!("timed out after {}", human(window)));
    loop {
        let start = Instant::now();
        match timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(_)) => return Probe::Ok(start.elapsed().as_micros() as u64),
            Ok(Err(e)) => {
                if Instant::now() + RETRY >= deadline {
                    return Probe::Failed(short(&e));
                }
                sleep_until(Instant::now() + RETRY).await;
            }
            Err(_) => return timed_out(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfer_proto::names::NodeName;

    fn free_port(ip: &str) -> SocketAddr {
        let l = std::net::TcpListener::bind((ip, 0)).unwrap();
        l.local_addr().unwrap()
    }

    #[tokio::test]
    async fn two_nodes_reach_each_other_and_a_silent_peer_does_not_answer() {
        let a = free_port("127.0.0.2");
        let b = free_port("127.0.0.3");
        let silent = free_port("127.0.0.4");
        let window = Duration::from_millis(1500);
        let start = std::time::Instant::now();
        let peers_of_a = [
            ReachTarget {
                node: NodeName::new("b").unwrap(),
                addr: b,
            },
            ReachTarget {
                node: NodeName::new("silent").unwrap(),
                addr: silent,
            },
        ];
        let node_a = probe(Some(a), &peers_of_a, window);
        // B starts a little later: A must retry until B listens.
        let node_b = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let t = std::time::Instant::now();
            let r = probe(
                Some(b),
                &[ReachTarget {
                    node: NodeName::new("a").unwrap(),
                    addr: a,
                }],
                window,
            )
            .await;
            (r, t.elapsed())
        };
        let ((la, ra), ((lb, rb), b_took)) = tokio::join!(node_a, node_b);
        assert_eq!(la, Probe::Ok(a));
        assert_eq!(lb, Probe::Ok(b));
        assert!(matches!(ra[0].result, Probe::Ok(_)), "{ra:?}");
        assert_eq!(ra[0].node, "b");
        assert_eq!(
            ra[1].result,
            Probe::Failed("connection refused".into()),
            "{ra:?}"
        );
        assert!(matches!(rb[0].result, Probe::Ok(_)), "{rb:?}");
        // A listened for its whole window (the silent peer never came);
        // B stopped once A had come and it had reached A, before its own
        // window was over.
        assert!(start.elapsed() >= Duration::from_millis(1500));
        assert!(b_took < window, "{b_took:?}");
    }

    #[tokio::test]
    async fn a_taken_port_or_a_foreign_address_cannot_be_listened_on() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let (l, r) = probe(Some(addr), &[], Duration::from_millis(50)).await;
        match l {
            Probe::Failed(e) => assert!(
                e.starts_with(&format!("cannot listen on {addr}: address already in use")),
                "{e}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(r.is_empty());
        // TEST-NET-1 is on no interface of this machine.
        let foreign: SocketAddr = "192.0.2.1:29500".parse().unwrap();
        match probe(Some(foreign), &[], Duration::from_millis(50)).await.0 {
            Probe::Failed(e) => assert!(
                e.starts_with("cannot listen on 192.0.2.1:29500: address not available; 192.0.2.1 is not an address of this node"),
                "{e}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human(Duration::from_secs(3)), "3s");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
        assert_eq!(human(Duration::from_millis(300)), "300ms");
    }

    #[tokio::test]
    async fn without_a_listener_it_returns_as_soon_as_peers_answered() {
        let peer = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = peer.local_addr().unwrap();
        let start = std::time::Instant::now();
        let (l, r) = probe(
            None,
            &[ReachTarget {
                node: NodeName::new("p").unwrap(),
                addr,
            }],
            Duration::from_secs(10),
        )
        .await;
        assert!(matches!(l, Probe::Skipped(_)));
        assert!(matches!(r[0].result, Probe::Ok(_)), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
