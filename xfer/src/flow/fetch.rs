//! `xfer fetch`: copy a complete model from an agent into a local root.
//!
//! The mirror image of a push: this process asks an agent for a model it
//! holds, then pulls the chunks it lacks into its own [`Store`] with the same
//! scheduler, verification and journal as an agent uses. It is how one node
//! serves another today, and what peer-to-peer fan-out builds on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::auth::Credential;
use crate::engine::scheduler;
use crate::flow::receive::{receive, Links};
use crate::store::{Store, StoreError};
use crate::transport::quic::{self, read_frame, write_frame, ConnectError, OpenServiceError};
use crate::transport::rdma::link::Nic;
use crate::transport::Fetcher;
use crate::util::chain::Chain;
use crate::util::permanence::Permanence;
use xfer_proto::chunkset::ChunkSet;
use xfer_proto::hello::Service;
use xfer_proto::manifest::ManifestError;
use xfer_proto::names::ModelName;
use xfer_proto::refusal::Refusal;
use xfer_proto::transfer::TransferMsg;

/// Why a fetch did not bring the model.
#[derive(Debug, thiserror::Error)]
pub enum FetchModelError {
    /// The local root cannot be opened, the agent's address does not
    /// resolve, or no endpoint can be made for it: in the lower layer's
    /// words.
    #[error("{0}")]
    Setup(Chain),
    /// The agent cannot be reached.
    #[error("{0}")]
    Connect(ConnectError),
    /// The agent does not open its transfer service.
    #[error("{0}")]
    Open(OpenServiceError),
    /// The request cannot be sent.
    #[error("{0}")]
    Ask(Chain),
    /// The agent closed the request before it answered.
    #[error("{addr} closed the request: {error}")]
    Closed {
        /// The agent.
        addr: SocketAddr,
        /// What the read said.
        error: Chain,
    },
    /// The agent refused (it does not hold the model, ...).
    #[error("{addr}: {refusal}")]
    Refused {
        /// The agent.
        addr: SocketAddr,
        /// Its refusal.
        refusal: Refusal,
    },
    /// The agent answered something else than a manifest.
    #[error("{addr}: protocol error: unexpected {kind}")]
    Unexpected {
        /// The agent.
        addr: SocketAddr,
        /// What it sent.
        kind: &'static str,
    },
    /// The agent's manifest does not hold together.
    #[error("{addr} sent an invalid manifest: {error}")]
    Manifest {
        /// The agent.
        addr: SocketAddr,
        /// What is wrong with it.
        error: ManifestError,
    },
    /// A task of the fetch failed (panicked or was cancelled).
    #[error("{0}")]
    Task(tokio::task::JoinError),
    /// The local store does not take the model.
    #[error("{}: {error}", root.display())]
    Begin {
        /// The local root.
        root: PathBuf,
        /// Why not.
        error: StoreError,
    },
    /// The chunks could not all be fetched.
    #[error("fetching {name} from {addr}: {refusal}")]
    Receive {
        /// The model.
        name: ModelName,
        /// The agent.
        addr: SocketAddr,
        /// Why.
        refusal: Refusal,
    },
}

/// Permanent when the agent or the transfer refused for good.
impl Permanence for FetchModelError {
    fn is_permanent(&self) -> bool {
        match self {
            FetchModelError::Refused { refusal, .. } | FetchModelError::Receive { refusal, .. } => {
                refusal.is_permanent()
            }
            _ => false,
        }
    }
}

/// What to fetch from where.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The agent's address (`HOST:PORT`).
    pub from: String,
    /// The model to fetch.
    pub name: ModelName,
    /// The local root it is stored under (`ROOT/NAME`).
    pub root: PathBuf,
    /// The cluster credential, loaded once by the caller.
    pub cred: Arc<Credential>,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// The RDMA NIC to fetch with; `None`: QUIC.
    pub nic: Option<Arc<dyn Nic>>,
}

/// The `--json` summary.
#[derive(Debug, Serialize)]
pub struct FetchSummary {
    /// The model's name.
    pub name: String,
    /// Its root, in hex.
    pub root: String,
    /// Where it is stored.
    pub path: PathBuf,
    /// The model's size in bytes.
    pub bytes_total: u64,
    /// Chunk bytes fetched.
    pub bytes_received: u64,
    /// Bytes already held.
    pub bytes_skipped: u64,
    /// Chunks that failed their check and were fetched again.
    pub corrupt_chunks: u64,
    /// Seconds the fetch took.
    pub duration_s: f64,
}

/// Fetches `opts.name` from the agent at `opts.from` into `opts.root`.
pub async fn fetch(opts: &FetchOptions) -> Result<FetchSummary, FetchModelError> {
    let started = Instant::now();
    let cred = &opts.cred;
    let name = opts.name.clone();
    let store = Store::open(&opts.root).map_err(|e| FetchModelError::Setup(e.into()))?;
    let addr = quic::resolve(&opts.from).map_err(|e| FetchModelError::Setup(e.into()))?;
    let ep = quic::client_endpoint(cred, addr).map_err(|e| FetchModelError::Setup(e.into()))?;
    let conn = quic::connect(&ep, addr, opts.connect_timeout)
        .await
        .map_err(FetchModelError::Connect)?;
    let (mut send, mut recv) = quic::open_service(&conn, Service::Transfer)
        .await
        .map_err(FetchModelError::Open)?;
    write_frame(&mut send, &TransferMsg::Want { name: name.clone() })
        .await
        .map_err(|e| FetchModelError::Ask(e.into()))?;
    let manifest =
        match read_frame::<TransferMsg>(&mut recv)
            .await
            .map_err(|e| FetchModelError::Closed {
                addr,
                error: e.into(),
            })? {
            TransferMsg::Have { manifest } => manifest,
            TransferMsg::Failed(refusal) => return Err(FetchModelError::Refused { addr, refusal }),
            other => {
                return Err(FetchModelError::Unexpected {
                    addr,
                    kind: other.kind(),
                })
            }
        };
    manifest
        .validate()
        .map_err(|error| FetchModelError::Manifest { addr, error })?;
    let manifest = Arc::new(manifest);
    let transfer = {
        let (store, name, manifest) = (store.clone(), name.clone(), manifest.clone());
        tokio::task::spawn_blocking(move || store.begin(&name, manifest))
            .await
            .map_err(FetchModelError::Task)?
    }
    .map_err(|error| FetchModelError::Begin {
        root: opts.root.clone(),
        error,
    })?;
    let transfer = Arc::new(transfer);
    let skipped = transfer.held_bytes();
    let fetcher =
        Fetcher::connect(conn.clone(), opts.nic.as_ref(), transfer.map().chunk_size()).await;
    let peer = (0, fetcher, ChunkSet::full(transfer.map().len()));
    let result = receive(
        transfer,
        vec![peer],
        Links::none(),
        scheduler::Config::default(),
        CancellationToken::new(),
    )
    .await;
    quic::close_done(ep, &conn).await;
    let received = result.map_err(|refusal| FetchModelError::Receive {
        name: name.clone(),
        addr,
        refusal,
    })?;
    Ok(FetchSummary {
        name: name.to_string(),
        root: received.root.to_hex(),
        path: store.model_dir(&name),
        bytes_total: manifest.total_bytes(),
        bytes_received: received.received_bytes,
        bytes_skipped: skipped,
        corrupt_chunks: received.corrupt_chunks,
        duration_s: started.elapsed().as_secs_f64(),
    })
}
