//! Images on this node: loading one into the node's container engine from
//! the blobs the swarm delivered, and the record of what was loaded (for
//! `xfer status`).
//!
//! A load checks that every blob of the image is a complete model here,
//! streams them into `docker load` (or `podman load`) as one tar while
//! hashing each against its sha256 digest ([`crate::image::loadtar`]), and
//! then asks the engine for the image's id, which must be the config's
//! digest. Layers whose stacks the engine holds already (from an earlier
//! image) are checked too but left out of the stream, so a re-delivery
//! after a new top layer loads only that layer; should the engine refuse
//! such a stream, the load is tried once more with every layer. A blob
//! whose bytes do not match is removed, so that the next `xfer image
//! push` sends it again. Records live in
//! `<root>/.xfer/images/<id hex>.json`.

use std::collections::BTreeSet;
use std::io::Read;
use std::process::Stdio;
use std::time::Instant;

use crate::image::loadtar::{self, LoadTarError};
use crate::image::runtime::Runtime;
use crate::store::Store;
use xfer_proto::image::{Digest, ImageDesc, ImageLoadReport, ImageStatus, BLOB_FILE};
use xfer_proto::refusal::Refusal;

/// The folder of the records under `.xfer`.
const AREA: &str = "images";

/// What the refusal says when this agent has no engine.
pub fn engine_off(node: &str) -> String {
    format!(
        "{node}: this agent has no container engine; start it with `xfer serve --container-engine docker` (or podman)"
    )
}

/// Loads `desc` into `engine` from the blobs in `store`.
pub async fn load(
    store: &Store,
    engine: Option<Runtime>,
    node: &str,
    desc: ImageDesc,
) -> Result<ImageLoadReport, Refusal> {
    let Some(engine) = engine else {
        return Err(Refusal::Forbidden(engine_off(node)));
    };
    desc.check()
        .map_err(|e| Refusal::Protocol(format!("{node}: {e}")))?;
    let version = engine
        .version()
        .await
        .map_err(|e| Refusal::Image(format!("{node}: {e}")))?;
    let engine_label = format!("{} {version}", engine.program());
    for b in desc.blobs() {
        held(store, node, &b.digest, b.size)?;
    }
    let started = Instant::now();
    let already = engine
        .image_id(&desc.reference)
        .await
        .map_err(|e| Refusal::Image(format!("{node}: {e}")))?;
    let mut loaded_bytes = 0;
    if already != Some(desc.id()) {
        // Layers the engine holds already are checked but not streamed.
        let omit = match engine.held_chains().await {
            Ok(held) => crate::image::omittable(&desc, &held),
            Err(e) => {
                tracing::warn!("cannot list the layers {engine_label} holds ({e}); sending all");
                BTreeSet::new()
            }
        };
        let mut result = load_blocking(store, node, &desc, engine.clone(), omit.clone()).await;
        if let Err(Failure::Runtime(why)) = &result {
            if !omit.is_empty() {
                tracing::warn!(
                    "{} load without the {} layer(s) it held failed ({why}); sending every layer",
                    engine.program(),
                    omit.len()
                );
                result = load_blocking(store, node, &desc, engine.clone(), BTreeSet::new()).await;
            }
        }
        loaded_bytes = result.map_err(Failure::into_refusal)?;
    }
    let load_s = started.elapsed().as_secs_f64();
    let id = engine
        .image_id(&desc.reference)
        .await
        .map_err(|e| Refusal::Image(format!("{node}: {e}")))?
        .ok_or_else(|| {
            Refusal::Image(format!(
                "{node}: {} reported no error, but holds no image {} after the load; check its log",
                engine.program(),
                desc.reference
            ))
        })?;
    if id != desc.id() {
        return Err(Refusal::Image(format!(
            "{node}: {} says {} is {}, but the pushed image is {}; remove the other image there (`{} rmi {}`) and push again",
            engine.program(),
            desc.reference,
            id.short(),
            desc.id().short(),
            engine.program(),
            desc.reference
        )));
    }
    let record = ImageStatus {
        reference: desc.reference.clone(),
        id,
        bytes: desc.bytes(),
        layers: desc.layers.len() as u32,
        loaded_unix: crate::util::clock::unix_now(),
        engine_id: None,
    };
    let file = record_file(&desc.reference);
    let bytes = serde_json::to_vec(&record).expect("a record serializes");
    if let Err(e) = store.write_note(AREA, &file, &bytes) {
        tracing::warn!("cannot record image {}: {e}", desc.reference);
    }
    tracing::info!(
        "loaded image {} ({}) into {engine_label} in {load_s:.1}s",
        desc.reference,
        id.short()
    );
    Ok(ImageLoadReport {
        reference: desc.reference,
        id,
        engine: engine_label,
        loaded_bytes,
        check_s: 0.0,
        load_s,
    })
}

/// One record per reference (a new push of `app:1` replaces the old).
fn record_file(reference: &str) -> String {
    let safe: String = reference
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let h = blake3::hash(reference.as_bytes()).to_hex();
    format!("{safe}-{}.json", &h[..8])
}

/// `Ok` when blob `d` is a complete model here of one file of `size`.
fn held(store: &Store, node: &str, d: &Digest, size: u64) -> Result<(), Refusal> {
    let missing = |why: &str| {
        Refusal::Image(format!(
            "{node}: blob {d:?} of the image {why}; run `xfer image push` again to deliver it"
        ))
    };
    let rec = store
        .record(&d.model())
        .ok_or_else(|| missing("is not here"))?;
    let files: Vec<_> = rec.manifest.manifest.files().collect();
    match files.as_slice() {
        [f] if f.path.as_str() == BLOB_FILE && f.size == size => Ok(()),
        _ => Err(missing("is here in another shape than the image says")),
    }
}

/// Why a load failed: the engine's own refusal (which a load with every
/// layer may not hit), or anything else.
enum Failure {
    Runtime(Refusal),
    Other(Refusal),
}

impl Failure {
    fn into_refusal(self) -> Refusal {
        match self {
            Failure::Runtime(r) | Failure::Other(r) => r,
        }
    }
}

/// [`stream_load`] on a blocking thread.
async fn load_blocking(
    store: &Store,
    node: &str,
    desc: &ImageDesc,
    engine: Runtime,
    omit: BTreeSet<Digest>,
) -> Result<u64, Failure> {
    let (s, d, n) = (store.clone(), desc.clone(), node.to_string());
    tokio::task::spawn_blocking(move || stream_load(&s, &n, &d, engine, &omit))
        .await
        .map_err(|e| Failure::Other(Refusal::Image(format!("{node}: the load task failed: {e}"))))?
}

/// Streams the image into `engine load` (blocking), leaving out the
/// layers in `omit`: returns the blob bytes written.
fn stream_load(
    store: &Store,
    node: &str,
    desc: &ImageDesc,
    engine: Runtime,
    omit: &BTreeSet<Digest>,
) -> Result<u64, Failure> {
    let mut child = engine
        .std_command()
        .arg("load")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            Failure::Other(Refusal::Image(format!(
                "{node}: {}",
                engine.spawn_error(&e)
            )))
        })?;
    let stdin = child.stdin.take().expect("piped");
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    // Both outputs drain on their own threads, so a chatty engine never
    // blocks the stream.
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.by_ref().take(1 << 20).read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.by_ref().take(1 << 20).read_to_string(&mut s);
        s
    });
    let open = |d: &Digest| store.open_model_file(&d.model(), BLOB_FILE);
    let written = loadtar::write(
        desc,
        open,
        std::io::BufWriter::with_capacity(1 << 20, stdin),
        omit,
    );
    if let Err(LoadTarError::Digest { what, want, got }) = &written {
        // Stop the engine before it takes anything, then drop the blob.
        let _ = child.kill();
        let _ = child.wait();
        let removed = store.remove(&want.model(), true);
        tracing::warn!(
            "image {}: {what} {want} hashes to {got}; removed it ({removed:?})",
            desc.reference
        );
        return Err(Failure::Other(Refusal::Image(format!(
            "{node}: {what} {want} of {} does not match its digest (its bytes hash to {got}); removed it from this node, run `xfer image push` again to resend it",
            desc.reference
        ))));
    }
    let status = child.wait();
    let (out, err) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    let ok = status.as_ref().is_ok_and(|s| s.success());
    match written {
        Ok(n) if ok => {
            tracing::debug!("{} load: {}", engine.program(), out.trim());
            Ok(n)
        }
        Err(LoadTarError::Blob {
            what,
            digest,
            source,
        }) => Err(Failure::Other(Refusal::Image(format!(
            "{node}: cannot read {what} {digest:?}: {source}; run `xfer image push` again"
        )))),
        _ => Err(Failure::Runtime(Refusal::Image(format!(
            "{node}: {} load failed: {}",
            engine.program(),
            engine.explain(&err)
        )))),
    }
}

/// The images this agent loaded, newest first, each with what `engine`
/// says of its reference now (when there is one).
pub async fn status(store: &Store, engine: Option<Runtime>) -> Vec<ImageStatus> {
    let mut out: Vec<ImageStatus> = store
        .read_notes(AREA)
        .into_iter()
        .filter_map(|(_, bytes)| serde_json::from_slice(&bytes).ok())
        .collect();
    out.sort_by_key(|s: &ImageStatus| std::cmp::Reverse(s.loaded_unix));
    if let Some(engine) = engine {
        for s in &mut out {
            s.engine_id = Some(match engine.image_id(&s.reference).await {
                Ok(Some(id)) => Ok(id),
                Ok(None) => Err(format!("not in {} any more", engine.program())),
                Err(e) => Err(e.to_string()),
            });
        }
    }
    out
}
