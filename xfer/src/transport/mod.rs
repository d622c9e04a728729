//! Moving chunk bytes between authenticated peers.
//!
//! The rest of xfer sees two small traits: a [`ChunkFetcher`] gets one chunk
//! from a connected peer, and a [`ChunkReader`] supplies chunk bytes when this
//! node serves. QUIC ([`quic`]) implements them over one mutually
//! authenticated connection per peer; the RDMA data plane ([`rdma`]) keeps
//! that connection for requests and moves the bytes by RDMA writes, behind
//! the same [`ChunkFetcher`], so the scheduler, store and verification are
//! unchanged. [`select`] decides which one a command uses.

pub mod files;
pub mod quic;
pub mod rdma;
pub mod select;

use std::future::Future;

use bytes::Bytes;

use crate::manifest::ChunkId;

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
    fn read_chunk(&self, chunk: ChunkId) -> Result<Bytes, String>;
}
