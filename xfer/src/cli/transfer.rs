//! The commands that move a model themselves: `push` (a local tree to
//! agents), `pull` (a Hub repo into the HF cache, optionally fanned out)
//! and `fetch` (a complete model from an agent).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::args::*;
use xfer::config::auth::Credential;
use xfer::util::progress::Progress;
use xfer_proto::names::ModelName;
use xfer_proto::units::{Bytes, Rate};

use super::out::{or_interrupted, say, warn};

/// `xfer push`.
pub async fn push(args: PushArgs) -> Result<ExitCode> {
    let PushArgs {
        src,
        dests,
        name,
        json,
        sending:
            Sending {
                chunking: Chunking { chunk_size },
                limit_rate,
                connect_timeout,
                peers,
                transport,
                connections,
            },
        rehash,
    } = args;
    let nic = xfer::transport::select::choose(transport)?;
    let (to, cred) = targets(&dests).await?;
    let name = name.as_deref().map(model_name).transpose()?;
    let opts = xfer::flow::push::PushOptions {
        src,
        to,
        me: None,
        routes: None,
        cred,
        name,
        chunk_size,
        limit_rate,
        connect_timeout: Duration::from_secs(connect_timeout),
        rehash,
        connections,
        nic,
        peers,
    };
    let progress = Progress::new(!json);
    let s = or_interrupted(xfer::flow::push::push(&opts, &progress), || {
        match progress.kept() {
            (_, _, 0) => "nothing was sent yet; run the same command again to start over".into(),
            (held, total, n) => format!(
                "{} of {} held on {n} node(s); run the same command again to resume (nothing is lost)",
                Bytes(held),
                Bytes(total)
            ),
        }
    })
    .await;
    progress.end();
    let s = s?;
    if json {
        serde_json::to_writer(std::io::stdout().lock(), &s)?;
        println!();
    } else {
        let send_s = (s.duration_s - s.hash_s).max(1e-9);
        for n in &s.nodes {
            match &n.error {
                None => say(&format!(
                    "{}: ok, {} from the source, {} from peers, already held {}",
                    n.addr,
                    Bytes(n.bytes_sent),
                    Bytes(n.from_peers),
                    Bytes(n.bytes_skipped)
                )),
                Some(e) => say(&format!("{}: FAILED: {e}", n.addr)),
            }
        }
        for n in &s.nodes {
            for d in &n.dropped_peers {
                say(&format!("{}: excluded peer {d}", n.addr));
            }
        }
        let mut notes: Vec<&String> = s.nodes.iter().flat_map(|n| &n.notes).collect();
        notes.dedup();
        for line in notes {
            say(line);
        }
        say(&format!("root {}", s.root));
        say(&format!(
            "{} files, {}; the source sent {} ({:.2}x the model) in {:.2}s ({})",
            s.files,
            Bytes(s.bytes_total),
            Bytes(s.bytes_sent),
            s.source_sent_x,
            send_s,
            Rate(s.bytes_sent as f64 / send_s)
        ));
    }
    for n in s.nodes.iter().filter(|n| !n.ok) {
        warn(&node_error(&n.addr, n.error.as_deref()));
    }
    if !s.ok() {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The `--to` list as destinations, each with its data address: the one
/// given after a slash, or the one its agent advertises.
pub(super) async fn destinations(
    to: &[String],
    cred: &Arc<Credential>,
) -> Result<Vec<xfer::flow::route::Destination>> {
    let mut dests = to
        .iter()
        .map(|s| xfer::flow::route::Destination::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    xfer::flow::route::learn_data_addrs(cred, &mut dests).await;
    Ok(dests)
}

/// Where a push goes and the credential (loaded once) to reach it with:
/// the nodes of the cluster file (`--cluster`, else `$XFER_CLUSTER` when
/// `--to` is not given; `--nodes` picks some), or the `--to` list with
/// `--key`. Exactly one of the two.
pub(super) async fn targets(
    dests: &Destinations,
) -> Result<(Vec<xfer::flow::route::Destination>, Arc<Credential>)> {
    let Destinations {
        cluster,
        nodes,
        to,
        key,
    } = dests;
    let cluster = match (cluster.clone(), to.is_empty()) {
        (None, true) => xfer::config::cluster::cluster_file_from_env(),
        (c, _) => c,
    };
    match (cluster, to.is_empty()) {
        (Some(file), true) => {
            let cluster = xfer::config::cluster::Cluster::load(&file)?;
            let dests = xfer::flow::route::Destination::of_cluster(&cluster, nodes)?;
            Ok((dests, Arc::new(Credential::load(&cluster.key)?)))
        }
        (None, false) => {
            let key = key.clone().ok_or_else(|| anyhow::anyhow!(
                "--to needs the credential: give --key FILE (or set XFER_KEY), or use --cluster FILE"
            ))?;
            let cred = Arc::new(Credential::load(&key)?);
            let dests = destinations(to, &cred).await?;
            Ok((dests, cred))
        }
        (Some(_), false) => anyhow::bail!("give either --cluster FILE [--nodes a,b] or --to AGENT,..., not both"),
        (None, true) => anyhow::bail!(
            "say where to push: --cluster FILE [--nodes a,b] (or set XFER_CLUSTER=FILE), or --to AGENT,... with --key FILE"
        ),
    }
}

/// A model name given on the command line (a stored name or a repo id),
/// checked once here.
fn model_name(name: &str) -> Result<ModelName> {
    ModelName::from_user(name, xfer_proto::repo::RepoType::Model)
        .map_err(|e| anyhow::anyhow!("--name {name}: {e}"))
}

/// `xfer pull`.
pub async fn pull(args: PullArgs) -> Result<ExitCode> {
    if let Some(reference) = args.repo.strip_prefix("oci://") {
        let reference = reference.to_string();
        return pull_artifact(args, &reference).await;
    }
    let PullArgs {
        transport,
        repo,
        repo_type,
        include,
        exclude,
        local_dir,
        connections,
        part_size,
        to,
        key,
        chunking: Chunking { chunk_size },
        connect_timeout,
        fan_out,
        json,
        ..
    } = args;
    // The data plane matters only for the fan-out to agents.
    let nic = if !to.is_empty() || transport == xfer::transport::select::TransportChoice::Rdma {
        xfer::transport::select::choose(transport)?
    } else {
        None
    };
    let repo_ref = xfer_proto::repo::RepoRef::parse(&repo, repo_type)?;
    xfer::hub::env::check_online(&repo_ref.id)?;
    let env = xfer::hub::env::HubEnv::from_process().map_err(anyhow::Error::msg)?;
    let opts = xfer::hub::pull::PullOptions {
        repo: repo_ref,
        include,
        exclude,
        local_dir,
        connections: connections.clamp(1, 256),
        part_size: part_size.max(1 << 20),
        chunk_size: None,
        intake: Default::default(),
        before_change: None,
        stats: None,
        pin: None,
    };
    let progress = Progress::new(!json);
    if !to.is_empty() {
        let Some(key) = key else {
            anyhow::bail!("--to needs the cluster credential: pass --key FILE or set XFER_KEY");
        };
        let cred = Arc::new(Credential::load(&key)?);
        let to = destinations(&to, &cred).await?;
        let push = xfer::flow::push::PushOptions {
            src: PathBuf::new(),
            to,
            me: None,
            routes: None,
            cred,
            name: None,
            chunk_size,
            limit_rate: None,
            connect_timeout: Duration::from_secs(connect_timeout),
            rehash: false,
            connections: xfer::transport::lanes::default_connections(),
            nic,
            peers: xfer::engine::topology::DEFAULT_DEGREE,
        };
        let kept = progress.clone();
        let s = or_interrupted(
            xfer::flow::pull_fanout::pull_and_fan_out(
                opts,
                env,
                push,
                fan_out.into(),
                progress,
                None,
            ),
            || pull_kept(&kept, &repo),
        )
        .await;
        kept.end();
        let s = s.map_err(|e| match e {
            xfer::flow::pull_fanout::FanOutError::Pull(p) => with_resume_fix(p.0.into_inner()),
            other => other.into(),
        })?;
        if json {
            serde_json::to_writer(std::io::stdout().lock(), &s)?;
            println!();
        } else {
            say(&format!(
                "pulled {} ({}) in {:.2}s; delivered to {} agents in {} rounds, {:.2}s after the last byte",
                s.pull.repo,
                Bytes(s.pull.bytes_total),
                s.pull.duration_s,
                s.nodes.len(),
                s.rounds,
                s.tail_s
            ));
            for n in &s.nodes {
                match &n.error {
                    None => say(&format!(
                        "{}: ok, root {}",
                        n.addr,
                        n.root.map_or("?".to_string(), |r| r.short())
                    )),
                    Some(e) => say(&format!("{}: FAILED: {e}", n.addr)),
                }
            }
            say(&format!("root {}", s.root));
            say(&format!(
                "{} on every node, {:.2}s in all",
                s.name, s.duration_s
            ));
        }
        for n in s.nodes.iter().filter(|n| !n.ok) {
            warn(&node_error(&n.addr, n.error.as_deref()));
        }
        return Ok(if s.ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let s = or_interrupted(
        xfer::hub::pull::pull(&opts, &env, &progress, None, None),
        || pull_kept(&progress, &repo),
    )
    .await;
    progress.end();
    let (s, _) = s.map_err(with_resume_fix)?;
    if json {
        serde_json::to_writer(std::io::stdout().lock(), &s)?;
        println!();
    } else {
        let v = &s.verification;
        say(&format!(
            "{}@{}: {} files, {}; downloaded {} in {:.2}s ({}), {} already present",
            s.repo,
            &s.commit[..12],
            s.files,
            Bytes(s.bytes_total),
            Bytes(s.bytes_downloaded),
            s.duration_s,
            Rate(s.rate_mb_s * 1e6),
            Bytes(s.bytes_present)
        ));
        say(&format!(
            "verified: {} sha256, {} git sha1, {} already in the cache{}",
            v.sha256_ok,
            v.git_sha1_ok,
            v.present,
            if v.recovered > 0 {
                format!(", {} re-downloaded after a mismatch", v.recovered)
            } else {
                String::new()
            }
        ));
        println!("{}", s.path);
    }
    Ok(ExitCode::SUCCESS)
}

/// `xfer fetch`.
pub async fn fetch(args: FetchArgs) -> Result<ExitCode> {
    let FetchArgs {
        name,
        from,
        root,
        key,
        repo_type,
        json,
        connect_timeout,
    } = args;
    // The syntax the cluster file's `agent` takes, checked before a lookup.
    xfer::config::cluster::parse_address(&from)
        .map_err(|e| anyhow::anyhow!("--from {from}: {e}"))?;
    let cred = Arc::new(Credential::load(&key)?);
    let opts = xfer::flow::fetch::FetchOptions {
        from,
        name: ModelName::from_user(&name, repo_type).map_err(anyhow::Error::msg)?,
        root,
        cred,
        connect_timeout: Duration::from_secs(connect_timeout),
        nic: None,
    };
    let s = or_interrupted(xfer::flow::fetch::fetch(&opts), || {
        format!(
            "the chunks received so far are kept under {}; run the same command again to resume (nothing is lost)",
            opts.root.display()
        )
    })
    .await?;
    if json {
        serde_json::to_writer(std::io::stdout().lock(), &s)?;
        println!();
    } else {
        say(&format!(
            "{}: root {}, received {}, already held {}, in {:.2}s",
            s.path.display(),
            s.root,
            Bytes(s.bytes_received),
            Bytes(s.bytes_skipped),
            s.duration_s
        ));
    }
    Ok(ExitCode::SUCCESS)
}

/// A pull's error with the fix an operator at the command line has for
/// a Hub that kept failing (transient failures, retried until they gave
/// up): run it again, it resumes. (An agent's job retries by itself.)
fn with_resume_fix(e: anyhow::Error) -> anyhow::Error {
    use xfer::hub::download::DownloadError;
    use xfer::hub::http::Failure;
    let gave_up = e.chain().any(|c| {
        matches!(c.downcast_ref::<Failure>(), Some(Failure::Transient { .. }))
            || matches!(
                c.downcast_ref::<DownloadError>(),
                Some(DownloadError::GaveUp { .. })
            )
    });
    if !gave_up {
        return e;
    }
    anyhow::anyhow!(
        "{e:#}; check the network or HF_ENDPOINT and run the same command again to resume (nothing is lost)"
    )
}

/// What an interrupted pull keeps: the bytes of the repo's files written
/// so far (in the cache's `.incomplete` files, with their part maps).
fn pull_kept(progress: &Progress, repo: &str) -> String {
    let (held, total, _) = progress.kept();
    format!(
        "{} of {} of {repo} kept in the cache; run the same command again to resume (nothing is lost)",
        Bytes(held),
        Bytes(total)
    )
}

/// `xfer pull oci://REF --local-dir DIR [--to AGENTS]`: a ModelPack model
/// artifact placed as the folder DIR (each layer checked against its
/// digest), then, with `--to`, pushed to the agents as any folder.
async fn pull_artifact(args: PullArgs, reference: &str) -> Result<ExitCode> {
    use xfer::image::registry::{artifact, client, reference::ImageRef};
    let image = ImageRef::parse(reference).map_err(anyhow::Error::msg)?;
    let Some(dir) = args.local_dir.clone() else {
        anyhow::bail!(
            "oci://{reference} needs --local-dir DIR: the model folder its files are placed in (with --to, then pushed to the agents)"
        );
    };
    let reg = client::Registry::new(
        &image,
        &client::RegistryOptions {
            insecure: args.insecure,
            ca_file: args.ca_file.clone(),
        },
    )?;
    let cache = xfer::client::image::default_cache()?;
    let placed = artifact::pull_model(&reg, &cache, &dir, artifact::Placing::Copy).await?;
    if !args.json {
        say(&format!(
            "{image}: {} files, {} placed in {} ({} from the registry)",
            placed.files,
            Bytes(placed.bytes),
            dir.display(),
            Bytes(placed.bytes_fetched)
        ));
    }
    if args.to.is_empty() {
        if args.json {
            serde_json::to_writer(
                std::io::stdout().lock(),
                &serde_json::json!({ "artifact": placed }),
            )?;
            println!();
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(key) = args.key.clone() else {
        anyhow::bail!("--to needs the cluster credential: pass --key FILE or set XFER_KEY");
    };
    let nic = xfer::transport::select::choose(args.transport)?;
    let cred = Arc::new(Credential::load(&key)?);
    let to = destinations(&args.to, &cred).await?;
    let opts = xfer::flow::push::PushOptions {
        src: dir,
        to,
        me: None,
        routes: None,
        cred,
        name: None,
        chunk_size: args.chunking.chunk_size,
        limit_rate: None,
        connect_timeout: Duration::from_secs(args.connect_timeout),
        rehash: false,
        connections: xfer::transport::lanes::default_connections(),
        nic,
        peers: xfer::engine::topology::DEFAULT_DEGREE,
    };
    let progress = Progress::new(!args.json);
    let s = xfer::flow::push::push(&opts, &progress).await;
    progress.end();
    let s = s?;
    if args.json {
        serde_json::to_writer(
            std::io::stdout().lock(),
            &serde_json::json!({ "artifact": placed, "push": s }),
        )?;
        println!();
    } else {
        say(&format!(
            "root {}: {} files on {} agent(s)",
            s.root,
            s.files,
            s.nodes.len()
        ));
    }
    let bad: Vec<_> = s.nodes.iter().filter(|n| !n.ok).collect();
    for n in &bad {
        warn(&format!(
            "error: {}: {}",
            n.addr,
            n.error.as_deref().unwrap_or("failed")
        ));
    }
    Ok(if bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `error: ADDR: WHY` for a node that failed, naming the node once (some
/// causes begin with its address already).
fn node_error(addr: &str, why: Option<&str>) -> String {
    match why.unwrap_or("failed") {
        w if w.starts_with(addr) => format!("error: {w}"),
        w => format!("error: {addr}: {w}"),
    }
}
