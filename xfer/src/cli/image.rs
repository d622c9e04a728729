//! `xfer image push`: its arguments and its report. The delivery itself
//! (save, push each blob through the swarm, every node loads the image) is
//! [`xfer::flow::image`].

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::args::ImagePushArgs;
use xfer::config::auth::Credential;
use xfer::flow::image::{ImagePushOptions, NodeImage, Note};
use xfer::flow::route::Destination;
use xfer::image::runtime::Runtime;
use xfer::util::progress::Progress;

use super::out::say;
use xfer_proto::units::Bytes;

/// `xfer image push`.
pub async fn push(args: ImagePushArgs) -> Result<ExitCode> {
    let engine = Runtime::new(args.engine);
    let reference = args.image.clone();
    xfer_proto::image::check_reference(&reference).map_err(anyhow::Error::msg)?;
    let (dests, cred) = destinations(&args).await?;
    let cache = match &args.cache {
        Some(c) => c.clone(),
        None => xfer::agent::image_client::default_cache()?,
    };
    let opts = ImagePushOptions {
        reference: reference.clone(),
        engine,
        dests,
        cred,
        cache,
        transport: args.transport,
        chunk_size: args.chunk_size,
        limit_rate: args.limit_rate,
        connect_timeout: Duration::from_secs(args.connect_timeout),
        connections: args.connections,
        peers: args.peers,
    };
    let json = args.json;
    let note = move |n: Note| match n {
        Note::Warning(m) => eprintln!("{m}"),
        Note::Progress(m) if !json => eprintln!("{m}"),
        Note::Progress(_) => {}
    };
    let load = xfer::agent::image_client::load;
    let progress = Progress::new(!args.json);
    let summary = super::out::or_interrupted(
        xfer::flow::image::push(&opts, progress.clone(), &note, load),
        || {
            let (held, _, n) = progress.kept();
            format!(
                "{} of the image's blobs held on {n} node(s); run the same command again to resume (nothing is lost)",
                Bytes(held)
            )
        },
    )
    .await;
    progress.end();
    let summary = summary?;
    let id = summary.id;
    if args.json {
        serde_json::to_writer(std::io::stdout().lock(), &summary)?;
        println!();
    } else {
        for n in &summary.nodes {
            match (&n.error, n.id) {
                (None, Some(nid)) => say(&format!(
                    "{}: {} loaded as {} in {}; {} from the source, {} from peers, already held {}",
                    n.node,
                    reference,
                    nid.short(),
                    n.engine.as_deref().unwrap_or("?"),
                    Bytes(n.bytes_sent),
                    Bytes(n.from_peers),
                    Bytes(n.bytes_skipped)
                )),
                (e, _) => say(&format!(
                    "{}: FAILED: {}",
                    n.node,
                    e.as_deref().unwrap_or("?")
                )),
            }
        }
        say(&format!(
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
        ));
    }
    let odd: Vec<&NodeImage> = summary.nodes.iter().filter(|n| !n.ok).collect();
    for n in &odd {
        super::out::warn(&format!(
            "error: {}",
            n.error.as_deref().unwrap_or("failed")
        ));
    }
    Ok(if odd.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Where the nodes are and the credential (loaded once) to reach them with.
async fn destinations(args: &ImagePushArgs) -> Result<(Vec<Destination>, Arc<Credential>)> {
    super::transfer::targets(
        args.cluster.clone(),
        &args.nodes,
        &args.to,
        args.key.clone(),
    )
    .await
}
