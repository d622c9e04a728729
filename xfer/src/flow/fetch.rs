//! `xfer fetch`: copy a complete model from an agent into a local root.
//!
//! The mirror image of a push: this process asks an agent for a model it
//! holds, then pulls the chunks it lacks into its own [`Store`] with the same
//! scheduler, verification and journal as an agent uses. It is how one node
//! serves another today, and what peer-to-peer fan-out builds on.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::auth::Credential;
use crate::engine::scheduler;
use crate::flow::receive::{receive, Links};
use crate::store::Store;
use crate::transport::quic::{self, read_frame, write_frame};
use crate::transport::rdma::link::Nic;
use crate::transport::Fetcher;
use xfer_proto::chunkset::ChunkSet;
use xfer_proto::hello::Service;
use xfer_proto::names::ModelName;
use xfer_proto::transfer::TransferMsg;

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
pub async fn fetch(opts: &FetchOptions) -> Result<FetchSummary> {
    let started = Instant::now();
    let cred = &opts.cred;
    let name = opts.name.clone();
    let store = Store::open(&opts.root)?;
    let addr = quic::resolve(&opts.from)?;
    let ep = quic::client_endpoint(cred, addr)?;
    let conn = quic::connect(&ep, addr, opts.connect_timeout)
        .await
        .map_err(anyhow::Error::msg)?;
    let (mut send, mut recv) = quic::open_service(&conn, Service::Transfer)
        .await
        .map_err(anyhow::Error::msg)?;
    write_frame(&mut send, &TransferMsg::Want { name: name.clone() }).await?;
    let manifest = match read_frame::<TransferMsg>(&mut recv)
        .await
        .with_context(|| format!("{addr} closed the request"))?
    {
        TransferMsg::Have { manifest } => manifest,
        TransferMsg::Failed(r) => bail!("{addr}: {r}"),
        other => bail!("{addr}: protocol error: unexpected {}", other.kind()),
    };
    manifest
        .validate()
        .with_context(|| format!("{addr} sent an invalid manifest"))?;
    let manifest = Arc::new(manifest);
    let transfer = {
        let (store, name, manifest) = (store.clone(), name.clone(), manifest.clone());
        tokio::task::spawn_blocking(move || store.begin(&name, manifest)).await?
    }
    .map_err(|r| anyhow::anyhow!("{}: {r}", opts.root.display()))?;
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
    conn.close(0u32.into(), b"done");
    let _ = tokio::time::timeout(Duration::from_secs(2), ep.wait_idle()).await;
    let received = result.map_err(|r| anyhow::anyhow!("fetching {name} from {addr}: {r}"))?;
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
