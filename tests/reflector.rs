//! A receiver is not a reflector (issue 53, finding 2): any node credential
//! may offer a new name and then send a `Swarm` or `Links` naming peers at
//! any address, which the receiver would dial (a QUIC Initial of 1,200
//! bytes or more each, retried). Each test is the attack, by a hostile
//! source with a valid credential, against a real agent; a UDP socket of
//! the test stands for the victim and counts what reaches it:
//! 1. a `Swarm` of 60,000 peers (it fits the 1 MiB request limit) is
//!    refused before any is dialled: no datagram reaches the victim;
//! 2. an agent with a cluster file dials no peer outside it;
//! 3. `Links` additions past the bound are not dialled.

use crate::common;

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::Duration;

use common::agents::Agent;
use common::trees::gen_model;
use common::*;
use xfer::config::auth::Credential;
use xfer::transport::quic::{client_endpoint, connect, read_frame, write_frame};
use xfer_proto::hello::{Hello, Service};
use xfer_proto::names::ModelName;
use xfer_proto::transfer::{SwarmPeer, TransferMsg};

/// A socket that receives whatever is sent to it; counts datagrams
/// already arrived (without waiting).
struct Victim(UdpSocket);

impl Victim {
    fn bind(ip: &str) -> Victim {
        let s = UdpSocket::bind(format!("{ip}:0")).unwrap();
        s.set_nonblocking(true).unwrap();
        Victim(s)
    }
    fn addr(&self) -> SocketAddr {
        self.0.local_addr().unwrap()
    }
    fn received(&self) -> usize {
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while self.0.recv_from(&mut buf).is_ok() {
            n += 1;
        }
        n
    }
}

fn peers(n: u32, first_id: u32, at: SocketAddr) -> Vec<SwarmPeer> {
    (first_id..first_id + n)
        .map(|id| SwarmPeer {
            id,
            label: "v".into(),
            addr: at,
            fallback: None,
        })
        .collect()
}

/// Offers the tree at `dir` as `name` to the agent at `addr`, sends
/// `swarm`, then each of `after`; returns the agent's replies, the first
/// (`Accepted`) and the next, if any arrived within 15 s.
async fn hostile_source(
    key: &Path,
    addr: SocketAddr,
    dir: &Path,
    name: &str,
    swarm: TransferMsg,
    after: Vec<TransferMsg>,
) -> (TransferMsg, Option<TransferMsg>) {
    let cred = Credential::load(key).unwrap();
    let tree = xfer::store::scan::scan(dir, 1 << 20, &|_| {}).unwrap();
    let ep = client_endpoint(&cred, addr).unwrap();
    let conn = connect(&ep, addr, Duration::from_secs(5)).await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    write_frame(&mut send, &Hello::new(Service::Transfer))
        .await
        .unwrap();
    let offer = TransferMsg::Offer {
        name: ModelName::new(name).unwrap(),
        manifest: tree.manifest,
    };
    write_frame(&mut send, &offer).await.unwrap();
    write_frame(&mut send, &swarm).await.unwrap();
    for m in &after {
        write_frame(&mut send, m).await.unwrap();
    }
    let first = read_frame::<TransferMsg>(&mut recv).await.unwrap();
    let next = tokio::time::timeout(
        Duration::from_secs(15),
        read_frame::<TransferMsg>(&mut recv),
    )
    .await
    .ok()
    .and_then(Result::ok);
    // Keep the connection while the test looks at the agent.
    std::mem::forget((ep, conn, send));
    (first, next)
}

fn model(t: &tempfile::TempDir) -> std::path::PathBuf {
    let dir = t.path().join("m");
    gen_model(&dir, MIB, 11);
    dir
}

#[test]
fn a_swarm_of_sixty_thousand_peers_is_refused_before_any_is_dialled() {
    let t = tempdir("reflector-swarm");
    let key = t.path().join("key");
    keygen(&key);
    let a = Agent::start("127.0.0.95:0", &t.path().join("root"), &key);
    let victim = Victim::bind("127.0.0.96");
    let swarm = TransferMsg::Swarm {
        me: 0,
        peers: peers(60_000, 1, victim.addr()),
        homes: None,
        bounded: true,
        connections: 1,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr: SocketAddr = a.addr.parse().unwrap();
    let (first, next) = rt.block_on(hostile_source(&key, addr, &model(&t), "m", swarm, vec![]));
    assert!(matches!(first, TransferMsg::Accepted { .. }), "{first:?}");
    match next {
        Some(TransferMsg::Failed(r)) => {
            let why = r.to_string();
            assert!(why.contains("the swarm names 60000 peers"), "{why}");
        }
        other => panic!("the swarm was not refused: {other:?}\n{}", a.log()),
    }
    // Refused on reading: nothing was ever dialled.
    assert_eq!(victim.received(), 0, "datagrams reached the victim");
}

#[test]
fn an_agent_with_a_cluster_file_dials_no_peer_outside_it_and_links_are_bounded() {
    let t = tempdir("reflector-cluster");
    let key = t.path().join("key");
    keygen(&key);
    let victim = Victim::bind("127.0.0.98");
    // The cluster is this node alone (127.0.0.97); the victim is outside.
    let file = t.path().join("cluster.toml");
    let port = unused_udp_port();
    let root = t.path().join("root");
    common::cluster::write_cluster_file(
        &file,
        &key,
        &[("n1", &format!("127.0.0.97:{port}"), &root)],
    );
    let a = Agent::start_with(
        &format!("127.0.0.97:{port}"),
        &root,
        &key,
        &["--cluster", file.to_str().unwrap()],
    );
    let swarm = TransferMsg::Swarm {
        me: 0,
        peers: peers(8, 1, victim.addr()),
        homes: None,
        bounded: false,
        connections: 1,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr: SocketAddr = a.addr.parse().unwrap();
    let dir = model(&t);
    let _ = rt.block_on(hostile_source(&key, addr, &dir, "m", swarm, vec![]));
    a.wait_log("is not a node of this agent's cluster file");
    assert_eq!(victim.received(), 0, "datagrams reached the victim");

    // Without a cluster file, `Links` additions stop at the bound.
    let t2 = tempdir("reflector-links");
    let key2 = t2.path().join("key");
    keygen(&key2);
    let b = Agent::start("127.0.0.99:0", &t2.path().join("root"), &key2);
    // Peers at addresses where nothing listens (a closed UDP port).
    let nowhere: SocketAddr = format!("127.0.0.99:{}", unused_udp_port()).parse().unwrap();
    let swarm = TransferMsg::Swarm {
        me: 0,
        peers: peers(2, 1, nowhere),
        homes: None,
        bounded: true,
        connections: 1,
    };
    let links = TransferMsg::Links {
        add: peers(1000, 10, nowhere),
        remove: Vec::new(),
    };
    let addr: SocketAddr = b.addr.parse().unwrap();
    let dir2 = model(&t2);
    let _ = rt.block_on(hostile_source(&key2, addr, &dir2, "m", swarm, vec![links]));
    b.wait_log("this transfer links 72 peers already");
    rt.shutdown_background();
}
