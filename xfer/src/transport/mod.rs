//! Moving chunk bytes between authenticated peers.
//!
//! The rest of xfer sees two small traits: a [`ChunkFetcher`] gets one chunk
//! from a connected peer, and a [`ChunkReader`] supplies chunk bytes when this
//! node serves. QUIC ([`quic`]) implements them over one mutually
//! authenticated connection per peer; the RDMA data plane ([`rdma`]) keeps
//! that connection for requests and moves the bytes by RDMA writes, behind
//! the same [`ChunkFetcher`], so the scheduler, store and verification are
//! unchanged. [`select`] decides which one a node uses, [`Fetcher`] is
//! what a fetching node gets for one peer (RDMA when both ends can, QUIC
//! otherwise), and [`serve`] answers both on the serving node. [`ask`] is
//! the one-request, one-reply exchange with an agent's admin or launch
//! service.

pub mod ask;
pub mod files;
pub mod lanes;
pub mod quic;
pub mod rdma;
pub mod select;
pub mod serve;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;

use lanes::Lanes;
use quic::QuicFetcher;
use rdma::link::Nic;
use rdma::plane::{PlaneConfig, RdmaFetcher};
use xfer_proto::manifest::ChunkId;

/// Why a fetch produced no bytes.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FetchError {
    /// The peer answered but does not have the chunk.
    #[error("peer does not have chunk {0:?}: {1}")]
    Unavailable(ChunkId, String),
    /// The connection failed; the peer is gone.
    #[error("connection lost: {0}")]
    Connection(String),
    /// The peer answered nonsense.
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// Why a [`ChunkReader`] has no bytes for a chunk; the asker gets it in
/// words (`Unavailable`).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The chunk is not one of the model's.
    #[error("no such chunk")]
    NoSuchChunk,
    /// The chunk's file is not one of the model's.
    #[error("no such file")]
    NoSuchFile,
    /// A draft's chunk whose hash the download has not announced yet.
    #[error("not downloaded yet")]
    NotDownloaded,
    /// The chunk's file cannot be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The chunk's bytes cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The chunk's bytes cannot be mapped.
    #[error("cannot map {}: {source}", path.display())]
    Map {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file's length cannot be had.
    #[error("{0}")]
    Stat(std::io::Error),
    /// The file ends before the chunk does.
    #[error("{} is shorter than its manifest says; was it changed?", path.display())]
    Shorter {
        /// The file.
        path: PathBuf,
    },
    /// Neither the placed file nor the one still downloading can be opened.
    #[error("neither {} nor {} can be opened", content.display(), incomplete.display())]
    Unopenable {
        /// Where the file is once placed.
        content: PathBuf,
        /// Where it is while it downloads.
        incomplete: PathBuf,
    },
    /// The store does not hold the chunk (in its words).
    #[error(transparent)]
    NotHeld(crate::store::OpenHeldError),
}

/// Fetches chunks from one connected peer.
pub trait ChunkFetcher: Clone + Send + Sync + 'static {
    /// Fetches chunk `chunk`, which is `len` bytes long. The bytes are not
    /// verified here; the caller checks them against the manifest.
    fn fetch(
        &self,
        chunk: ChunkId,
        len: usize,
    ) -> impl Future<Output = Result<Bytes, FetchError>> + Send;
}

/// Supplies the bytes of chunks this node serves.
pub trait ChunkReader: Send + Sync + 'static {
    /// The chunk's bytes, or why they cannot be had.
    fn read_chunk(&self, chunk: ChunkId) -> Result<Bytes, ReadError>;
}

/// Fetches from one peer over the data plane the two ends agreed on.
#[derive(Clone)]
pub enum Fetcher {
    /// Over QUIC.
    Quic(QuicFetcher),
    /// Over the RDMA data plane.
    Rdma(RdmaFetcher),
}

impl Fetcher {
    /// Over QUIC only.
    pub fn quic(conn: quinn::Connection) -> Fetcher {
        Fetcher::Quic(QuicFetcher::new(conn))
    }

    /// Over RDMA when this node has a NIC (`nic`) and the peer takes the
    /// data plane for chunks of `chunk_size` bytes; over QUIC otherwise,
    /// saying why in one line.
    pub async fn connect(
        conn: quinn::Connection,
        nic: Option<&Arc<dyn Nic>>,
        chunk_size: u64,
    ) -> Fetcher {
        Fetcher::connect_lanes(Lanes::new(conn), nic, chunk_size).await
    }

    /// [`Fetcher::connect`] on the first of `lanes`; over QUIC, chunk
    /// requests spread over all of them, including lanes added later.
    pub async fn connect_lanes(
        lanes: Lanes,
        nic: Option<&Arc<dyn Nic>>,
        chunk_size: u64,
    ) -> Fetcher {
        let quic = |lanes| Fetcher::Quic(QuicFetcher::over(lanes));
        let Some(nic) = nic else {
            return quic(lanes);
        };
        let Ok(slot) = u32::try_from(chunk_size) else {
            tracing::warn!("rdma: chunks of {chunk_size} bytes do not fit a ring slot; using QUIC");
            return quic(lanes);
        };
        let conn = lanes.primary();
        match rdma::link::open(&conn, nic.as_ref(), PlaneConfig::new(slot)).await {
            Ok(plane) => {
                tracing::info!("rdma: data plane up with {}", conn.remote_address());
                Fetcher::Rdma(RdmaFetcher::new(plane, conn))
            }
            Err(why) => {
                tracing::warn!("rdma: {why}; using QUIC with {}", conn.remote_address());
                quic(lanes)
            }
        }
    }

    /// Which data plane this is, for logs and summaries.
    pub fn plane(&self) -> &'static str {
        match self {
            Fetcher::Quic(_) => "quic",
            Fetcher::Rdma(_) => "rdma",
        }
    }
}

impl ChunkFetcher for Fetcher {
    async fn fetch(&self, chunk: ChunkId, len: usize) -> Result<Bytes, FetchError> {
        match self {
            Fetcher::Quic(f) => f.fetch(chunk, len).await,
            Fetcher::Rdma(f) => f.fetch(chunk, len).await,
        }
    }
}

/// Holds a chunk request until it may be served: the source's
/// super-seeding gate (`flow::coordinator::SeedGate`), given the chunk's
/// number. A request whose fetcher withdraws it meanwhile is dropped.
pub trait Admission: Send + Sync {
    /// Resolves when `chunk` may be served.
    fn admit(
        &self,
        chunk: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}
