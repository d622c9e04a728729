//! Serving chunks on one connection, over whichever data plane the
//! fetching node uses.
//!
//! Every request arrives on a stream of its own, its first frame a tagged
//! [`StreamRequest`]. A chunk request is answered on that stream, over
//! QUIC. An RDMA hello brings up the RDMA data plane (or is told why not);
//! after that, an RDMA request names a slot of the fetching node's ring
//! and the bytes go there by RDMA write, straight from the source file.
//! The fetching node may switch back to QUIC requests at any time (after a
//! queue-pair error, say); both kinds are served until the connection
//! closes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use quinn::{Connection, VarInt};

use super::quic::{answer_chunk, read_stream_request, write_frame};
use super::rdma::link::{self, Offer};
use super::rdma::plane::SendPlane;
use super::{Admission, ChunkReader};
use crate::util::rate::RateLimiter;
use xfer_proto::chunkset::ChunkMap;
use xfer_proto::stream::{RdmaReply, ResetCode, StreamRequest};

/// What one connection serves, and how.
#[derive(Clone)]
pub struct Serving {
    /// The chunks served.
    pub map: Arc<ChunkMap>,
    /// Where their bytes come from.
    pub reader: Arc<dyn ChunkReader>,
    /// Caps the send rate (`--limit-rate`), over both data planes.
    pub limiter: Option<Arc<RateLimiter>>,
    /// Told the size of every chunk sent.
    pub on_sent: Arc<dyn Fn(u64) + Send + Sync>,
    /// What this node offers for an RDMA data plane.
    pub rdma: Offer,
    /// Counts the chunk bytes that went by RDMA write.
    pub rdma_sent: Arc<AtomicU64>,
    /// Holds each request until it may be served (`None`: at once).
    pub admission: Option<Arc<dyn Admission>>,
}

impl Serving {
    /// Serves `map`'s chunks from `reader`, unlimited and uncounted.
    pub fn new(map: Arc<ChunkMap>, reader: Arc<dyn ChunkReader>, rdma: Offer) -> Serving {
        Serving {
            map,
            reader,
            limiter: None,
            on_sent: Arc::new(|_| {}),
            rdma,
            rdma_sent: Arc::default(),
            admission: None,
        }
    }
}

/// Serves chunk requests on `conn` until it closes, in the order they
/// arrive.
pub async fn serve(conn: Connection, serving: Serving) {
    let serving = Arc::new(serving);
    let plane: Arc<Mutex<Option<Arc<SendPlane>>>> = Arc::default();
    let mut order = 0i32;
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        // First come, first served: an earlier request's bytes go out before
        // a later one's, so chunks complete one after another (and can be
        // forwarded sooner) instead of all crawling in parallel.
        order = order.wrapping_add(1);
        let _ = send.set_priority(-order.rem_euclid(i32::MAX));
        let (s, plane, conn) = (serving.clone(), plane.clone(), conn.clone());
        tokio::spawn(async move {
            let req = match read_stream_request(&mut recv).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!("bad request from {}: {e:#}", conn.remote_address());
                    let _ = send.reset(VarInt::from_u32(ResetCode::BadRequest.code()));
                    return;
                }
            };
            match req {
                StreamRequest::Chunk(req) => {
                    let (map, reader) = (s.map.clone(), s.reader.clone());
                    answer_chunk(
                        send,
                        req,
                        map,
                        reader,
                        s.limiter.clone(),
                        s.on_sent.clone(),
                        s.admission.clone(),
                    )
                    .await;
                }
                StreamRequest::Rdma(req) => {
                    let current = plane.lock().unwrap().clone();
                    let reply = match current {
                        None => {
                            RdmaReply::Unavailable("no RDMA data plane on this connection".into())
                        }
                        Some(p) => {
                            if let (Some(a), Some(n)) = (&s.admission, s.map.number(req.chunk)) {
                                tokio::select! {
                                    _ = a.admit(n) => {}
                                    _ = conn.closed() => return,
                                }
                            }
                            if let Some(l) = &s.limiter {
                                l.acquire(u64::from(req.len)).await;
                            }
                            // Until the write is known done, or the connection
                            // ends (a last unsignalled write may never be
                            // confirmed).
                            tokio::select! {
                                r = p.write(req) => r,
                                _ = conn.closed() => return,
                            }
                        }
                    };
                    if reply == RdmaReply::Written {
                        s.rdma_sent.fetch_add(u64::from(req.len), Ordering::Relaxed);
                        (s.on_sent)(u64::from(req.len));
                        crate::util::metrics::served(u64::from(req.len));
                    }
                    let _ = write_frame(&mut send, &reply).await;
                    let _ = send.finish();
                }
                StreamRequest::RdmaHello(hello) => {
                    let up =
                        link::accept(send, recv, hello, &s.rdma, s.map.clone(), s.reader.clone())
                            .await;
                    if let Some(p) = up {
                        tracing::info!("rdma: data plane up with {}", conn.remote_address());
                        *plane.lock().unwrap() = Some(p);
                    }
                }
            }
        });
    }
}
