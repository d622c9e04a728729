//! `xfer image push` and `xfer image pull`: their arguments and their
//! reports. The deliveries themselves (save or fetch, push each blob
//! through the swarm, every node loads the image) are [`xfer::flow::image`]
//! and [`xfer::flow::image_pull`].

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::args::{ImageDelivery, ImagePullArgs, ImagePushArgs};
use xfer::config::auth::Credential;
use xfer::flow::image::{ImagePushOptions, ImagePushSummary, NodeImage, Note};
use xfer::flow::image_pull::PullSource;
use xfer::flow::route::Destination;
use xfer::image::registry::client::RegistryOptions;
use xfer::image::registry::manifest::Platform;
use xfer::image::registry::reference::ImageRef;
use xfer::image::runtime::Runtime;
use xfer::util::progress::Progress;

use super::out::say;
use xfer_proto::units::Bytes;

/// `xfer image push`.
pub async fn push(args: ImagePushArgs) -> Result<ExitCode> {
    let engine = Runtime::new(args.engine);
    let reference = args.image.clone();
    xfer_proto::image::check_reference(&reference).map_err(anyhow::Error::msg)?;
    let d = &args.delivery;
    let (dests, cred) = destinations(d).await?;
    let opts = options(d, reference.clone(), engine, dests, cred)?;
    let json = d.json;
    let note = notes(json);
    let progress = Progress::new(!json);
    let summary = super::out::or_interrupted(
        xfer::flow::image::push(&opts, progress.clone(), &note, xfer::client::image::load),
        || interrupted(&progress),
    )
    .await;
    progress.end();
    report(&[summary?], json)
}

/// `xfer image pull`: one pull per platform the nodes need.
pub async fn pull(args: ImagePullArgs) -> Result<ExitCode> {
    let image = ImageRef::parse(&args.reference).map_err(anyhow::Error::msg)?;
    let local = image.local_name();
    xfer_proto::image::check_reference(&local).map_err(anyhow::Error::msg)?;
    let d = &args.delivery;
    let (dests, cred) = destinations(d).await?;
    let groups = match &args.platform {
        Some(p) => {
            let p = Platform::parse(p).ok_or_else(|| {
                anyhow::anyhow!("--platform {p}: write OS/ARCH[/VARIANT], e.g. linux/arm64")
            })?;
            vec![(p, dests)]
        }
        None => platforms_of(&cred, dests).await,
    };
    let json = d.json;
    let note = notes(json);
    let mut summaries = Vec::new();
    for (platform, group) in groups {
        let engine = Runtime::new(xfer_proto::image::ContainerRuntime::Docker);
        let opts = options(d, local.clone(), engine, group, cred.clone())?;
        let src = PullSource {
            image: image.clone(),
            registry: RegistryOptions {
                insecure: args.insecure,
                ca_file: args.ca_file.clone(),
            },
            platform,
        };
        let progress = Progress::new(!json);
        let s = super::out::or_interrupted(
            xfer::flow::image_pull::pull(
                &src,
                &opts,
                progress.clone(),
                &note,
                xfer::client::image::load,
            ),
            || interrupted(&progress),
        )
        .await;
        progress.end();
        summaries.push(s?);
    }
    report(&summaries, json)
}

/// The nodes grouped by the platform their agents pull images for (the
/// machine's own when an agent does not say), in the nodes' order.
async fn platforms_of(
    cred: &Arc<Credential>,
    dests: Vec<Destination>,
) -> Vec<(Platform, Vec<Destination>)> {
    let mut groups: Vec<(Platform, Vec<Destination>)> = Vec::new();
    for d in dests {
        let asked = xfer::client::admin(
            cred,
            d.label(),
            &d.agent,
            &xfer_proto::admin::AdminRequest::Status,
            Duration::from_secs(10),
        )
        .await;
        let p = match asked {
            Ok(xfer_proto::admin::AdminReply::Status(s)) => {
                s.platform.as_deref().and_then(Platform::parse)
            }
            _ => None,
        }
        .unwrap_or_else(Platform::host);
        match groups.iter_mut().find(|(q, _)| *q == p) {
            Some((_, g)) => g.push(d),
            None => groups.push((p, vec![d])),
        }
    }
    groups
}

/// The delivery's options from the command line.
fn options(
    d: &ImageDelivery,
    reference: String,
    engine: Runtime,
    dests: Vec<Destination>,
    cred: Arc<Credential>,
) -> Result<ImagePushOptions> {
    let cache = match &d.cache {
        Some(c) => c.clone(),
        None => xfer::client::image::default_cache()?,
    };
    Ok(ImagePushOptions {
        reference,
        engine,
        dests,
        cred,
        cache,
        transport: d.sending.transport,
        chunk_size: d.sending.chunking.chunk_size,
        limit_rate: d.sending.limit_rate,
        connect_timeout: Duration::from_secs(d.sending.connect_timeout),
        connections: d.sending.connections,
        peers: d.sending.peers,
    })
}

/// Where a delivery's notes go: warnings always, progress unless `--json`.
fn notes(json: bool) -> impl Fn(Note) + Sync {
    move |n: Note| match n {
        Note::Warning(m) => eprintln!("{m}"),
        Note::Progress(m) if !json => eprintln!("{m}"),
        Note::Progress(_) => {}
    }
}

/// What an interrupted delivery says.
fn interrupted(progress: &Progress) -> String {
    let (held, _, n) = progress.kept();
    format!(
        "{} of the image's blobs held on {n} node(s); run the same command again to resume (nothing is lost)",
        Bytes(held)
    )
}

/// Says what each node got; fails if any node did not load the image.
fn report(summaries: &[ImagePushSummary], json: bool) -> Result<ExitCode> {
    if json {
        match summaries {
            [one] => serde_json::to_writer(std::io::stdout().lock(), one)?,
            many => serde_json::to_writer(
                std::io::stdout().lock(),
                &serde_json::json!({ "platforms": many }),
            )?,
        }
        println!();
    }
    let mut odd: Vec<&NodeImage> = Vec::new();
    for summary in summaries {
        let reference = &summary.image;
        odd.extend(summary.nodes.iter().filter(|n| !n.ok));
        if json {
            continue;
        }
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
        let (what, first) = match &summary.registry {
            Some(r) => (
                format!(
                    "{}, {} from the registry",
                    r.platform.as_deref().unwrap_or("one platform"),
                    Bytes(r.bytes_fetched)
                ),
                "fetch",
            ),
            None => (String::new(), "save"),
        };
        say(&format!(
            "{reference} {} on {} node(s): {} layers, {}{}{what}; the source sent {} in {:.2}s ({first} {:.2}s, push {:.2}s, load {:.2}s)",
            summary.id.short(),
            summary.nodes.iter().filter(|n| n.ok).count(),
            summary.layers,
            Bytes(summary.bytes_total),
            if what.is_empty() { "" } else { "; " },
            Bytes(summary.bytes_sent),
            summary.duration_s,
            summary.save_s,
            summary.push_s,
            summary.load_s
        ));
    }
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
async fn destinations(args: &ImageDelivery) -> Result<(Vec<Destination>, Arc<Credential>)> {
    super::transfer::targets(&args.dests).await
}
