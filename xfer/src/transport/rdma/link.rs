//! Bringing up the RDMA data plane of one QUIC connection: the exchange of
//! queue-pair and ring details on a stream of its own, and the [`Nic`]s
//! that take part in it.
//!
//! The fetching node opens a stream and sends a [`Hello`]: its GID and GID
//! index, MTU, port, LID, and the QPN and PSN of each queue pair it made.
//! The serving node makes as many queue pairs, connects them to the
//! fetching node's (INIT → RTR → RTS) and answers with its own details
//! ([`Answer::Accept`]), or says why not ([`Answer::Refuse`]). The fetching
//! node connects its side, registers its receive ring and sends where the
//! ring is ([`RingInfo`]: address, rkey, slots, slot size); the serving node
//! maps and registers the source files read-only and confirms
//! ([`Ready::Ready`]); a node serving a model still arriving (a swarm peer
//! relaying) registers a bounce pool instead and copies each verified
//! chunk into it before the write. From then on chunk requests name ring
//! slots
//! ([`xfer_proto::stream::RdmaRequest`]).
//!
//! A refusal or failure at any step leaves the connection as it was: the
//! fetching node says why in one line and fetches over QUIC.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::plane::{PlaneConfig, PlaneError, RecvPlane, RingInfo, SendPlane};
use super::verbs::Verbs;
use crate::transport::quic::{read_frame, write_frame};
use crate::transport::ChunkReader;
use xfer_proto::chunkset::ChunkMap;
use xfer_proto::stream::StreamRequest;

pub use xfer_proto::stream::{Local, QpInfo, RdmaHello as Hello};

/// Why a device or its queue pairs could not be set up. On the serving
/// side its text is the refusal sent to the fetching node.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A verb failed.
    #[error("{verb} failed: {err}; {hint}")]
    Verb {
        /// The verb and its arguments, e.g. `ibv_alloc_pd(mlx5_0)`.
        verb: String,
        /// What it returned.
        err: std::io::Error,
        /// What usually causes it.
        hint: &'static str,
    },
    /// The device, port or request cannot carry the data plane; the text
    /// says why and what to do.
    #[error("{0}")]
    Unusable(String),
}

/// A NIC that can make queue pairs for one connection.
pub trait Nic: Send + Sync + std::fmt::Debug + 'static {
    /// Makes `qps` queue pairs, ready to be connected to a peer's.
    fn prepare(&self, qps: u32) -> Result<Box<dyn PendingLink>, SetupError>;
}

/// Queue pairs made but not yet connected.
pub trait PendingLink: Send {
    /// What to send the peer.
    fn local(&self) -> Local;
    /// Connects queue pair i to the peer's queue pair i.
    fn connect(self: Box<Self>, remote: &Local) -> Result<Arc<dyn Verbs>, SetupError>;
}

/// Queue pairs a fetching node may ask for.
const MAX_QPS: usize = 16;
/// Ring slots a fetching node may offer.
const MAX_SLOTS: u32 = 4096;
/// The whole exchange, both ways.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The serving node's answer to a [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// The serving node's queue pairs.
    Accept(Local),
    /// Why not.
    Refuse(String),
}

/// The serving node's answer to the ring's details.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Ready {
    /// The send plane is up.
    Ready,
    /// Why not.
    Refuse(String),
}

/// Why the fetching side could not bring up the data plane ([`open`]).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// This node's device or queue pairs could not be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The receive ring could not be set up.
    #[error(transparent)]
    Plane(#[from] PlaneError),
    /// The exchange's stream could not be opened.
    #[error("{0}")]
    Stream(quinn::ConnectionError),
    /// The exchange broke off.
    #[error("the exchange broke off ({0:#})")]
    Exchange(anyhow::Error),
    /// The serving node refused, in its words.
    #[error("{0}")]
    Refused(String),
    /// The exchange took longer than [`EXCHANGE_TIMEOUT`].
    #[error("the peer did not finish the queue-pair exchange within {} s", EXCHANGE_TIMEOUT.as_secs())]
    Timeout,
}

/// The fetching side: brings up the data plane on `conn`, or says why not.
pub async fn open(
    conn: &quinn::Connection,
    nic: &dyn Nic,
    cfg: PlaneConfig,
) -> Result<Arc<RecvPlane>, OpenError> {
    let exchange = async {
        let pending = nic.prepare(cfg.qps)?;
        let (mut send, mut recv) = conn.open_bi().await.map_err(OpenError::Stream)?;
        let hello = StreamRequest::RdmaHello(Hello {
            local: pending.local(),
        });
        let io = OpenError::Exchange;
        write_frame(&mut send, &hello).await.map_err(io)?;
        let remote = match read_frame::<Answer>(&mut recv).await.map_err(io)? {
            Answer::Accept(l) => l,
            Answer::Refuse(why) => return Err(OpenError::Refused(why)),
        };
        let verbs = pending.connect(&remote)?;
        let plane = RecvPlane::new(verbs, cfg)?;
        write_frame(&mut send, &plane.ring_info())
            .await
            .map_err(io)?;
        match read_frame::<Ready>(&mut recv).await.map_err(io)? {
            Ready::Ready => {
                let _ = send.finish();
                Ok(plane)
            }
            Ready::Refuse(why) => Err(OpenError::Refused(why)),
        }
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .unwrap_or(Err(OpenError::Timeout))
}

/// What a serving node can offer on a connection.
#[derive(Clone)]
pub struct Offer {
    /// Its NIC, if it has a data plane (`--transport auto|rdma` and a
    /// usable device).
    pub nic: Option<Arc<dyn Nic>>,
    /// The source files, in manifest order, when they are complete and
    /// can be mapped; `None` for a model still arriving, whose chunks go
    /// through a bounce pool.
    pub files: Option<Vec<PathBuf>>,
}

impl Offer {
    /// No data plane: every hello is refused.
    pub fn none() -> Offer {
        Offer {
            nic: None,
            files: None,
        }
    }
}

/// The serving side of one exchange, whose [`Hello`] has been read: the
/// data plane, or `None` after telling the fetching node why not.
pub async fn accept(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    hello: Hello,
    offer: &Offer,
    map: Arc<ChunkMap>,
    reader: Arc<dyn ChunkReader>,
) -> Option<Arc<SendPlane>> {
    let exchange = async {
        let verbs = match admit(&hello, offer) {
            Ok(nic) => nic
                .prepare(hello.local.qps.len() as u32)
                .and_then(|p| {
                    let ours = p.local();
                    p.connect(&hello.local).map(|v| (v, ours))
                })
                .map_err(|e| e.to_string()),
            Err(why) => Err(why.to_string()),
        };
        let (verbs, ours) = match verbs {
            Ok(v) => v,
            Err(why) => {
                let _ = write_frame(&mut send, &Answer::Refuse(why)).await;
                let _ = send.finish();
                return None;
            }
        };
        write_frame(&mut send, &Answer::Accept(ours)).await.ok()?;
        let ring: RingInfo = read_frame(&mut recv).await.ok()?;
        let cfg = PlaneConfig::new(ring.slot_size);
        let plane = check_ring(&ring, &map)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                match &offer.files {
                    Some(files) => SendPlane::new(verbs, files, map.clone(), ring, cfg),
                    None => SendPlane::bounced(verbs, reader, map.clone(), ring, cfg),
                }
                .map_err(|e| e.to_string())
            });
        let reply = match &plane {
            Ok(_) => Ready::Ready,
            Err(why) => Ready::Refuse(why.clone()),
        };
        write_frame(&mut send, &reply).await.ok()?;
        let _ = send.finish();
        plane.ok()
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, exchange)
        .await
        .ok()
        .flatten()
}

/// Why this node refuses the data plane a peer asked for: the text of the
/// `Refuse` answer it sends back.
#[derive(Debug, thiserror::Error)]
enum LinkRefused {
    /// Too few or too many queue pairs.
    #[error("asked for {0} queue pairs; between 1 and {MAX_QPS} are allowed")]
    QueuePairs(usize),
    /// This node has no RDMA.
    #[error("the serving node has no RDMA data plane (started with --transport quic, or no usable device)")]
    NoPlane,
    /// Too few or too many ring slots.
    #[error("a ring of {0} slots; between 1 and {MAX_SLOTS} are allowed")]
    Slots(u32),
    /// Slots smaller than a chunk.
    #[error("ring slots of {slot} bytes cannot hold chunks of {chunk}")]
    SlotSize {
        /// The ring's slot size.
        slot: u32,
        /// The transfer's chunk size.
        chunk: u64,
    },
}

/// Whether this node takes the data plane a hello asks for. (Both ends
/// speak the same protocol version: the connection's ALPN settled it.)
fn admit<'a>(hello: &Hello, offer: &'a Offer) -> Result<&'a Arc<dyn Nic>, LinkRefused> {
    let n = hello.local.qps.len();
    if n == 0 || n > MAX_QPS {
        return Err(LinkRefused::QueuePairs(n));
    }
    let Some(nic) = &offer.nic else {
        return Err(LinkRefused::NoPlane);
    };
    Ok(nic)
}

/// Whether a ring can hold every chunk of `map`, within limits.
fn check_ring(ring: &RingInfo, map: &ChunkMap) -> Result<(), LinkRefused> {
    if ring.slots == 0 || ring.slots > MAX_SLOTS {
        return Err(LinkRefused::Slots(ring.slots));
    }
    if u64::from(ring.slot_size) < map.chunk_size() {
        return Err(LinkRefused::SlotSize {
            slot: ring.slot_size,
            chunk: map.chunk_size(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::double::DoubleHub;
    use super::*;

    fn hello(qps: u32) -> Hello {
        let nic = DoubleHub::new(1);
        let mut local = nic.prepare(qps.max(1)).unwrap().local();
        local.qps.truncate(qps as usize);
        Hello { local }
    }

    #[test]
    fn hellos_outside_the_rules_are_refused_with_the_reason() {
        let offer = Offer {
            nic: Some(DoubleHub::new(2).nic()),
            files: Some(Vec::new()),
        };
        let refused = |h: &Hello, o: &Offer| admit(h, o).err().unwrap().to_string();
        assert!(admit(&hello(4), &offer).is_ok());
        assert!(refused(&hello(0), &offer).contains("asked for 0 queue pairs"));
        let many = Hello {
            local: Local {
                qps: vec![QpInfo { qpn: 1, psn: 0 }; 17],
                ..hello(1).local
            },
        };
        assert!(refused(&many, &offer).contains("between 1 and 16"));
        assert!(refused(&hello(4), &Offer::none()).contains("has no RDMA data plane"));
    }

    #[test]
    fn a_hello_is_told_from_a_chunk_request_by_its_tag() {
        use xfer_proto::frame::{decode_frame, encode};
        let h = StreamRequest::RdmaHello(hello(4));
        let back = decode_frame::<StreamRequest>(&encode(&h)).unwrap();
        assert_eq!(back, h);
        assert!(!matches!(
            back,
            StreamRequest::Chunk(_) | StreamRequest::Rdma(_)
        ));
    }

    #[test]
    fn rings_that_cannot_hold_a_chunk_are_refused() {
        let m = xfer_proto::manifest::Manifest {
            version: xfer_proto::manifest::MANIFEST_VERSION,
            chunk_size: 4 << 20,
            entries: Vec::new(),
        };
        let map = ChunkMap::new(&m);
        let ring = |slots, slot_size| RingInfo {
            addr: 0,
            rkey: 1,
            slots,
            slot_size,
        };
        assert!(check_ring(&ring(16, 4 << 20), &map).is_ok());
        assert!(check_ring(&ring(16, 1 << 20), &map)
            .unwrap_err()
            .to_string()
            .contains("cannot hold chunks"));
        assert!(check_ring(&ring(0, 4 << 20), &map).is_err());
        assert!(check_ring(&ring(MAX_SLOTS + 1, 4 << 20), &map).is_err());
    }
}
