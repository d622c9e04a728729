//! `xfer image push`: a local container image delivered to nodes like a
//! model. The image is saved once (`docker save`) into content-addressed
//! blobs under a local cache ([`xfer::image::archive`]), each blob is
//! pushed as a model of its own through the swarm (a blob a node already
//! holds is not sent again, an interrupted one resumes), and then every
//! node's agent checks the blobs against their sha256 digests and loads
//! the image into its own engine. Every node must report the image's id.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::args::ImagePushArgs;
use xfer::flow::push::{PushOptions, PushSummary};
use xfer::flow::route::Destination;
use xfer::image::archive;
use xfer::image::engine::Engine;
use xfer::util::progress::Progress;
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::image::{Digest, ImageDesc};
use xfer_proto::units::Bytes;

/// How long one node may take to check and load an image.
const LOAD_TIMEOUT: Duration = Duration::from_secs(3600);

/// The `--json` summary.
#[derive(Debug, Serialize)]
pub struct ImagePushSummary {
    pub image: String,
    pub id: Digest,
    pub layers: usize,
    pub bytes_total: u64,
    /// Chunk bytes the source sent, summed over blobs and nodes.
    pub bytes_sent: u64,
    /// Bytes the nodes already held, summed over blobs and nodes.
    pub bytes_skipped: u64,
    /// Whether the local blob cache already held the image (no `docker save`).
    pub cached: bool,
    /// `docker save` into the cache (0 when cached).
    pub save_s: f64,
    /// From the first blob's push to the last's end: the pushes start while
    /// the save still runs, so `save_s` and `push_s` overlap.
    pub push_s: f64,
    pub load_s: f64,
    pub duration_s: f64,
    pub blobs: Vec<BlobSummary>,
    pub nodes: Vec<NodeImage>,
}

#[derive(Debug, Serialize)]
pub struct BlobSummary {
    pub digest: Digest,
    pub size: u64,
    pub bytes_sent: u64,
    pub bytes_skipped: u64,
}

#[derive(Debug, Serialize, Default)]
pub struct NodeImage {
    pub node: String,
    pub ok: bool,
    pub error: Option<String>,
    /// The id the node's engine reports.
    pub id: Option<Digest>,
    pub engine: Option<String>,
    pub bytes_sent: u64,
    pub from_peers: u64,
    pub bytes_skipped: u64,
    /// Bytes streamed into its engine (0: it held the image already).
    pub loaded_bytes: u64,
    pub load_s: f64,
}

/// `xfer image push`.
pub async fn push(args: ImagePushArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let engine = Engine::new(args.engine);
    let reference = args.image.clone();
    xfer_proto::image::check_reference(&reference).map_err(anyhow::Error::msg)?;
    let (dests, key) = destinations(&args).await?;
    let id = match engine.image_id(&reference).await {
        Ok(Some(id)) => id,
        Ok(None) => bail!(
            "image {reference} does not exist locally ({} holds no such image); build or pull it first, or check `{} images`",
            engine.program(),
            engine.program()
        ),
        Err(e) => bail!("cannot ask the local engine for {reference}: {e}"),
    };
    let cache = match &args.cache {
        Some(c) => c.clone(),
        None => default_cache()?,
    };
    // The image's blobs, known before the save: its config (the id) and
    // its layers. Each is pushed as soon as `docker save` has written it to
    // the cache, while the save goes on with the next.
    let layers = engine
        .layers(&reference)
        .await
        .map_err(|e| anyhow::anyhow!("cannot ask the local engine for {reference}: {e}"))?;
    let expected: BTreeSet<Digest> = layers.iter().copied().chain([id]).collect();
    let nic = xfer::transport::select::choose(args.transport)?;
    let progress = Progress::new(!args.json);
    let mut delivery = Delivery {
        nodes: dests
            .iter()
            .map(|d| NodeImage {
                node: d.label().to_string(),
                ok: true,
                ..NodeImage::default()
            })
            .collect(),
        dests: dests.clone(),
        blobs: Vec::new(),
        key: key.clone(),
        nic,
        progress,
        cache: cache.clone(),
    };
    let (tx, mut saved) = tokio::sync::mpsc::unbounded_channel::<Digest>();
    let lookup = archive::cached(&cache, &id, &reference);
    for b in &lookup.discarded {
        eprintln!(
            "blob {} of {reference} in {} no longer hashes to its digest (damaged on disk); discarded, saving the image again",
            b.digest,
            cache.display()
        );
    }
    let (saving, cached) = match lookup.desc {
        Some(d) => {
            for b in d.blobs() {
                let _ = tx.send(b.digest);
            }
            drop(tx);
            (tokio::spawn(async move { Ok((d, Duration::ZERO)) }), true)
        }
        None => {
            if !args.json {
                eprintln!(
                    "{reference} ({}): {} layers; saving, each blob pushed once saved",
                    id.short(),
                    layers.len()
                );
            }
            let (r, c, e) = (reference.clone(), cache.clone(), engine.clone());
            let saving = tokio::spawn(async move {
                let t = Instant::now();
                let desc = save(e, r, c, tx).await?;
                Ok::<_, anyhow::Error>((desc, t.elapsed()))
            });
            (saving, false)
        }
    };
    let mut pushed = BTreeSet::new();
    let mut first_push: Option<Instant> = None;
    while let Some(d) = saved.recv().await {
        if expected.contains(&d) && pushed.insert(d) {
            first_push.get_or_insert_with(Instant::now);
            delivery.blob(&args, d, &reference).await?;
        }
    }
    let (desc, save_took) = saving.await??;
    let save_s = save_took.as_secs_f64();
    if desc.id() != id {
        bail!(
            "{} saved {reference} as {}, but it was {} a moment ago (retagged meanwhile?); run xfer image push again",
            engine.program(),
            desc.id().short(),
            id.short()
        );
    }
    if !args.json {
        eprintln!(
            "{reference} ({}): {} layers, {}{}",
            id.short(),
            desc.layers.len(),
            Bytes(desc.bytes()),
            if cached { ", blobs already saved" } else { "" }
        );
    }
    // Whatever the save named that was not expected (none, unless the
    // image changed under the same id).
    for b in desc.blobs() {
        if pushed.insert(b.digest) {
            first_push.get_or_insert_with(Instant::now);
            delivery.blob(&args, b.digest, &reference).await?;
        }
    }
    let push_started = first_push.unwrap_or_else(Instant::now);
    let Delivery {
        mut nodes, blobs, ..
    } = delivery;
    let push_s = push_started.elapsed().as_secs_f64();

    // Every node loads it into its own engine, at once.
    let load_started = Instant::now();
    let cred = std::sync::Arc::new(xfer::config::auth::Credential::load(&key)?);
    let loads = dests
        .iter()
        .zip(&nodes)
        .filter(|(_, n)| n.ok)
        .map(|(d, _)| {
            let (cred, desc, d) = (cred.clone(), desc.clone(), d.clone());
            async move {
                let req = AdminRequest::LoadImage(Box::new(desc));
                let reply =
                    xfer::agent::client::admin(&cred, d.label(), &d.agent, &req, LOAD_TIMEOUT)
                        .await;
                (d.label().to_string(), reply)
            }
        });
    for (label, reply) in futures_join(loads).await {
        let n = nodes
            .iter_mut()
            .find(|n| n.node == label)
            .expect("a node we asked");
        match reply {
            Ok(AdminReply::ImageLoaded(r)) => {
                n.id = Some(r.id);
                n.engine = Some(r.engine.clone());
                n.loaded_bytes = r.loaded_bytes;
                n.load_s = r.load_s;
                if r.id != id {
                    n.ok = false;
                    n.error = Some(format!(
                        "{label}: holds {reference} as {}, not {}; remove it there and push again",
                        r.id.short(),
                        id.short()
                    ));
                }
            }
            Ok(AdminReply::Failed(r)) => {
                n.ok = false;
                n.error = Some(with_node(&label, r.to_string()));
            }
            Ok(other) => {
                n.ok = false;
                n.error = Some(format!(
                    "{label}: answered {}; run the same xfer version on every node",
                    other.kind()
                ));
            }
            Err(e) => {
                n.ok = false;
                n.error = Some(with_node(&label, e.to_string()));
            }
        }
    }
    let summary = ImagePushSummary {
        image: reference.clone(),
        id,
        layers: desc.layers.len(),
        bytes_total: desc.bytes(),
        bytes_sent: blobs.iter().map(|b| b.bytes_sent).sum(),
        bytes_skipped: blobs.iter().map(|b| b.bytes_skipped).sum(),
        cached,
        save_s,
        push_s,
        load_s: load_started.elapsed().as_secs_f64(),
        duration_s: started.elapsed().as_secs_f64(),
        blobs,
        nodes,
    };
    if args.json {
        serde_json::to_writer(std::io::stdout().lock(), &summary)?;
        println!();
    } else {
        for n in &summary.nodes {
            match (&n.error, n.id) {
                (None, Some(nid)) => println!(
                    "{}: {} loaded as {} in {}; {} from the source, {} from peers, already held {}",
                    n.node,
                    reference,
                    nid.short(),
                    n.engine.as_deref().unwrap_or("?"),
                    Bytes(n.bytes_sent),
                    Bytes(n.from_peers),
                    Bytes(n.bytes_skipped)
                ),
                (e, _) => println!("{}: FAILED: {}", n.node, e.as_deref().unwrap_or("?")),
            }
        }
        println!(
            "{reference} {} on {} node(s): {} layers, {}; the source sent {} in {:.2}s (save {:.2}s, push {:.2}s, load {:.2}s)",
            id.short(),
            summary.nodes.iter().filter(|n| n.ok).count(),
            summary.layers,
            Bytes(summary.bytes_total),
            Bytes(summary.bytes_sent),
            summary.duration_s,
            summary.save_s,
            summary.push_s,
            summary.load_s
        );
    }
    let odd: Vec<&NodeImage> = summary.nodes.iter().filter(|n| !n.ok).collect();
    if !odd.is_empty() {
        // Whatever failed, the next push hashes every blob again before
        // sending it, so damage the stamps missed cannot be sent twice.
        archive::distrust(&cache, &desc);
    }
    for n in &odd {
        eprintln!("error: {}", n.error.as_deref().unwrap_or("failed"));
    }
    Ok(if odd.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The blobs pushed so far, and what each node got.
struct Delivery {
    dests: Vec<Destination>,
    nodes: Vec<NodeImage>,
    blobs: Vec<BlobSummary>,
    key: PathBuf,
    nic: Option<std::sync::Arc<dyn xfer::transport::rdma::link::Nic>>,
    progress: Progress,
    cache: PathBuf,
}

impl Delivery {
    /// Pushes blob `digest` from the cache, as a model through the swarm,
    /// to every node that has not failed yet.
    async fn blob(&mut self, args: &ImagePushArgs, digest: Digest, reference: &str) -> Result<()> {
        let live: Vec<Destination> = self
            .dests
            .iter()
            .zip(&self.nodes)
            .filter(|(_, n)| n.ok)
            .map(|(d, _)| d.clone())
            .collect();
        if live.is_empty() {
            return Ok(());
        }
        let file = archive::blob_path(&self.cache, &digest);
        let size = std::fs::metadata(&file)
            .with_context(|| format!("blob {digest:?} of {reference} is not in the cache"))?
            .len();
        let opts = PushOptions {
            src: file.parent().expect("a blob has a folder").to_path_buf(),
            to: live,
            me: None,
            routes: None,
            cred: std::sync::Arc::new(xfer::config::auth::Credential::load(&self.key)?),
            name: Some(digest.model()),
            chunk_size: args.chunk_size,
            limit_rate: args.limit_rate,
            connect_timeout: Duration::from_secs(args.connect_timeout),
            rehash: false,
            connections: args.connections,
            nic: self.nic.clone(),
            peers: args.peers,
        };
        let s: PushSummary = xfer::flow::push::push(&opts, &self.progress)
            .await
            .with_context(|| format!("pushing blob {digest:?} of {reference}"))?;
        self.blobs.push(BlobSummary {
            digest,
            size,
            bytes_sent: s.bytes_sent,
            bytes_skipped: s.bytes_skipped,
        });
        for ns in &s.nodes {
            let Some(n) = self
                .nodes
                .iter_mut()
                .zip(&self.dests)
                .find(|(_, d)| d.label() == ns.addr || d.agent == ns.addr)
                .map(|(n, _)| n)
            else {
                continue;
            };
            n.bytes_sent += ns.bytes_sent;
            n.from_peers += ns.from_peers;
            n.bytes_skipped += ns.bytes_skipped;
            if !ns.ok {
                n.ok = false;
                n.error = Some(format!(
                    "{}: blob {digest:?} was not delivered: {}",
                    n.node,
                    ns.error.as_deref().unwrap_or("failed")
                ));
            }
        }
        Ok(())
    }
}

/// `msg` with the node's name in front, unless it already names it.
fn with_node(node: &str, msg: String) -> String {
    if msg.starts_with(node) {
        msg
    } else {
        format!("{node}: {msg}")
    }
}

/// Where the nodes are and the key to reach them with.
async fn destinations(args: &ImagePushArgs) -> Result<(Vec<Destination>, PathBuf)> {
    match (&args.cluster, args.to.is_empty()) {
        (Some(file), true) => {
            let cluster = xfer::config::cluster::Cluster::load(file)?;
            let dests = cluster
                .select(&args.nodes)?
                .into_iter()
                .map(|n| Destination {
                    agent: n.agent.clone(),
                    data: n.data_addr(),
                    name: Some(n.name.to_string()),
                })
                .collect();
            Ok((dests, cluster.key.clone()))
        }
        (None, false) => {
            let key = args.key.clone().context(
                "--to needs the cluster credential: give --key FILE (or set XFER_KEY), or use --cluster FILE",
            )?;
            let cred = std::sync::Arc::new(xfer::config::auth::Credential::load(&key)?);
            let dests = super::transfer::destinations(&args.to, &cred).await?;
            Ok((dests, key))
        }
        (Some(_), false) => bail!("give either --cluster FILE or --to AGENTS, not both"),
        (None, true) => bail!("say where to push: --cluster FILE [--nodes a,b] or --to AGENT,..."),
    }
}

/// `$XDG_CACHE_HOME/xfer/images`, else `~/.cache/xfer/images`.
fn default_cache() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .context("neither XDG_CACHE_HOME nor HOME is set; give --cache DIR")?;
    Ok(base.join("xfer").join("images"))
}

/// `docker save` of `reference`, unpacked as it streams into `cache`;
/// each blob's digest goes to `saved` once the blob is complete there.
async fn save(
    engine: Engine,
    reference: String,
    cache: PathBuf,
    saved: tokio::sync::mpsc::UnboundedSender<Digest>,
) -> Result<ImageDesc> {
    tokio::task::spawn_blocking(move || -> Result<ImageDesc> {
        let r = reference;
        let mut child = engine
            .std_command()
            .args(["save", "--", &r])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!(engine.spawn_error(&e)))?;
        let stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let err = std::thread::spawn(move || {
            use std::io::Read;
            let mut s = String::new();
            let _ = stderr.by_ref().take(1 << 20).read_to_string(&mut s);
            s
        });
        let unpacked = archive::unpack(stdout, &cache, &r, |d| {
            let _ = saved.send(d);
        });
        let status = child.wait()?;
        let err = err.join().unwrap_or_default();
        if !status.success() {
            bail!(
                "{} save {r} failed: {}",
                engine.program(),
                engine.explain(&err)
            );
        }
        let desc = unpacked?;
        archive::remember(&cache, &desc)?;
        Ok(desc)
    })
    .await?
}

/// Runs every future at once and returns their outputs in order.
async fn futures_join<F>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("a load task panicked"));
    }
    out
}
