//! `xfer serve`: the node agent.
//!
//! Accepts mutually authenticated QUIC connections and reads the first
//! message of the control stream. An offer opens a
//! [`Transfer`](crate::store::Transfer) in the store and pulls the missing
//! chunks from the offering peer; a want serves a complete model it holds. A newer offer for the
//! same model supersedes a running one (a restarted push resumes instead of
//! waiting for the old connection to time out).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

use crate::auth::Credential;
use crate::chunkset::{ChunkMap, ChunkSet};
use crate::receive::receive;
use crate::scheduler;
use crate::store::Store;
use crate::transport::files::FileChunkReader;
use crate::transport::quic::{self, read_frame, write_frame, QuicFetcher};
use crate::wire::{Control, ModelName, Refusal, PROTOCOL_VERSION};

/// How the agent is started.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub listen: SocketAddr,
    pub root: PathBuf,
    pub key: PathBuf,
    pub scheduler: scheduler::Config,
}

/// Running jobs by model name: a token to cancel each, and a lock the job
/// holds while it runs.
#[derive(Default)]
struct Jobs {
    by_name: Mutex<HashMap<ModelName, Job>>,
    next_id: std::sync::atomic::AtomicU64,
}

struct Job {
    id: u64,
    cancel: CancellationToken,
    slot: Arc<tokio::sync::Mutex<()>>,
}

/// Runs the agent until the process is stopped.
pub async fn run(opts: AgentOptions) -> Result<()> {
    let cred = Credential::load(&opts.key)?;
    let store = Store::open(&opts.root)?;
    let ep = quic::server_endpoint(opts.listen, &cred)?;
    println!(
        "xfer agent listening on {} root {} cluster {}",
        ep.local_addr()?,
        opts.root.display(),
        cred.cluster_id().short()
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    let jobs = Arc::new(Jobs::default());
    while let Some(incoming) = ep.accept().await {
        let (store, jobs, cfg) = (store.clone(), jobs.clone(), opts.scheduler);
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(
                        "refused connection from {remote}: {}",
                        quic::describe(remote, &e)
                    );
                    return;
                }
            };
            if let Err(e) = handle(conn.clone(), store, jobs, cfg).await {
                tracing::warn!("session with {remote} ended: {e:#}");
            }
            // Give the peer a moment to read our last message and close.
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
        });
    }
    Ok(())
}

async fn handle(
    conn: quinn::Connection,
    store: Store,
    jobs: Arc<Jobs>,
    cfg: scheduler::Config,
) -> Result<()> {
    let (mut send, mut recv) =
        tokio::time::timeout(Duration::from_secs(10), conn.accept_bi()).await??;
    let offer: Control = match read_frame(&mut recv).await {
        Ok(m) => m,
        Err(e) => {
            let r = Refusal::Protocol(format!("unreadable offer: {e:#}"));
            write_frame(&mut send, &Control::Failed(r.clone())).await?;
            let _ = send.finish();
            anyhow::bail!(r);
        }
    };
    let (name, manifest) = match offer {
        Control::Offer { version, .. } | Control::Want { version, .. }
            if version != PROTOCOL_VERSION =>
        {
            return refuse(
                &mut send,
                Refusal::Version {
                    ours: PROTOCOL_VERSION,
                    theirs: version,
                },
            )
            .await;
        }
        Control::Offer { name, manifest, .. } => (name, manifest),
        Control::Want { name, .. } => return serve_model(conn, send, store, name).await,
        other => {
            return refuse(
                &mut send,
                Refusal::Protocol(format!("expected an offer, got {}", other.kind())),
            )
            .await;
        }
    };
    if let Err(e) = manifest.validate() {
        return refuse(&mut send, Refusal::BadManifest(e.to_string())).await;
    }
    let manifest = Arc::new(manifest);

    // Supersede a running transfer of the same model, then wait for it.
    let token = CancellationToken::new();
    let id = jobs
        .next_id
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let slot = {
        let mut map = jobs.by_name.lock().unwrap();
        let slot = map.get(&name).map(|j| j.slot.clone()).unwrap_or_default();
        let job = Job {
            id,
            cancel: token.clone(),
            slot: slot.clone(),
        };
        if let Some(old) = map.insert(name.clone(), job) {
            old.cancel.cancel();
        }
        slot
    };
    let _running = slot.lock().await;

    let begun = {
        let (store, name, manifest) = (store.clone(), name.clone(), manifest.clone());
        tokio::task::spawn_blocking(move || store.begin(&name, manifest)).await?
    };
    let transfer = match begun {
        Ok(t) => Arc::new(t),
        Err(r) => return refuse(&mut send, r).await,
    };
    let held = transfer.held();
    let held_bytes = transfer.held_bytes();
    write_frame(
        &mut send,
        &Control::Accepted {
            held_bytes,
            held_chunks: held.count(),
            need_bytes: manifest.total_bytes() - held_bytes,
        },
    )
    .await?;
    tracing::info!(
        "receiving {name} ({} files, root {}) from {}",
        manifest.file_count(),
        manifest.root().short(),
        conn.remote_address()
    );
    let source = (
        0,
        QuicFetcher::new(conn.clone()),
        ChunkSet::full(held.capacity()),
    );
    let result = receive(transfer, vec![source], cfg, token.clone()).await;
    {
        let mut map = jobs.by_name.lock().unwrap();
        if map.get(&name).is_some_and(|j| j.id == id) {
            map.remove(&name);
        }
    }
    let reply = match result {
        Ok(r) => {
            tracing::info!("{name} complete, root {}", r.root);
            Control::Done {
                root: r.root,
                received_bytes: r.received_bytes,
                corrupt_chunks: r.corrupt_chunks,
            }
        }
        Err(r) => {
            tracing::warn!("{name} failed: {r}");
            Control::Failed(r)
        }
    };
    write_frame(&mut send, &reply).await?;
    let _ = send.finish();
    Ok(())
}

/// Serves a complete model this agent holds to a peer that asked for it.
async fn serve_model(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    store: Store,
    name: ModelName,
) -> Result<()> {
    let Some(record) = store.record(&name) else {
        return refuse(&mut send, Refusal::NotHeld(name.to_string())).await;
    };
    let manifest = record.manifest.manifest;
    let dir = store.model_dir(&name);
    let paths = manifest.files().map(|f| f.path.under(&dir)).collect();
    let map = Arc::new(ChunkMap::new(&manifest));
    let reader = Arc::new(FileChunkReader::new(paths, map.clone()));
    write_frame(&mut send, &Control::Have { manifest }).await?;
    let _ = send.finish();
    tracing::info!("serving {name} to {}", conn.remote_address());
    quic::serve_chunks(conn, map, reader, None, Arc::new(|_| {})).await;
    Ok(())
}

async fn refuse(send: &mut quinn::SendStream, r: Refusal) -> Result<()> {
    write_frame(send, &Control::Failed(r.clone())).await?;
    let _ = send.finish();
    anyhow::bail!("refused: {r}")
}
