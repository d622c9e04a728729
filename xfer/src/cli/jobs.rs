//! The commands that ask a cluster's agents: `sync` (hand a job over, or
//! follow it), `status` (one table across nodes; exit 1 on an unreachable
//! node or a failed job), `cancel`, `rm` and `prune`.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::args::*;
use xfer::config::auth::Credential;
use xfer::util::progress::Progress;

/// The cluster file `--cluster` or `$XFER_CLUSTER` names, loaded.
fn load(file: Option<std::path::PathBuf>) -> Result<xfer::config::cluster::Cluster> {
    let file = xfer::config::cluster::cluster_file(file)?;
    Ok(xfer::config::cluster::Cluster::load(&file)?)
}

/// `xfer sync`.
pub async fn sync(args: SyncArgs) -> Result<ExitCode> {
    let SyncArgs {
        source,
        at: ClusterNodes {
            file: ClusterFile { cluster },
            nodes,
        },
        from,
        name,
        repo_type,
        chunking: Chunking { chunk_size },
        limit_rate,
        wait,
        json,
        transport,
        peers,
        insecure,
        ca_file,
        give_up_after,
    } = args;
    let cluster = load(cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    let req = xfer::client::sync::SyncRequest {
        source,
        cwd: std::env::current_dir()?,
        nodes,
        from,
        name,
        repo_type,
        chunk_size,
        limit_rate,
        transport,
        peers,
        registry: xfer::client::sync::RegistryAccess { insecure, ca_file },
        give_up: give_up_after,
        pin: None,
    };
    let started = std::time::Instant::now();
    let spec = xfer::client::sync::sync(&cluster, &cred, &req).await?;
    let handed_s = started.elapsed().as_secs_f64();
    if !wait {
        if json {
            println!(
                "{}",
                serde_json::json!({"job": spec.id, "name": spec.name.to_string()})
            );
        } else {
            println!("{}", spec.id);
            eprintln!(
                "job {} handed to {} node(s): {} from the {}; follow it with `xfer status --cluster ...`",
                spec.id,
                spec.members.len(),
                xfer_proto::names::for_people(spec.name.as_str()),
                xfer::client::source::reading(&spec)
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "job {}: {} from the {} (Ctrl-C stops following; the job goes on)",
        spec.id,
        xfer_proto::names::for_people(spec.name.as_str()),
        xfer::client::source::reading(&spec)
    );
    let cluster_file = cluster.path.display().to_string();
    let progress = Progress::new(!json);
    let root = super::out::or_interrupted(
        xfer::client::wait::wait(&cluster, &cred, &spec, &progress),
        || {
            format!(
                "stopped following job {}; it goes on on the nodes (nothing is lost): follow it with `xfer status --cluster {cluster_file}`, stop it with `xfer cancel {} --cluster {cluster_file}`",
                spec.id, spec.id
            )
        },
    )
    .await;
    progress.end();
    let root = match root {
        Ok(root) => root,
        // A script reading `--json` learns the outcome too, not only the
        // terminal reading stderr.
        Err(e) if json => {
            println!(
                "{}",
                serde_json::json!({"job": spec.id, "name": spec.name.to_string(), "error": format!("{e:#}")})
            );
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        // Where the seconds went: this command's hand-over and the moment
        // it saw the end, and the source's own marks of the last round.
        let seen_s = started.elapsed().as_secs_f64();
        let round =
            xfer::client::status::status(&cluster, &cred, std::slice::from_ref(&spec.source_node))
                .await
                .ok()
                .and_then(|r| r.into_iter().next())
                .and_then(|r| r.status)
                .and_then(|s| s.jobs.into_iter().find(|j| j.id == spec.id))
                .and_then(|j| j.last_round);
        println!(
            "{}",
            serde_json::json!({
                "job": spec.id,
                "name": spec.name.to_string(),
                "root": root,
                "timeline": {"handed_s": handed_s, "round": round, "seen_s": seen_s},
            })
        );
    } else {
        println!(
            "{}: {} complete on {} node(s), root {root}",
            spec.id,
            xfer_proto::names::for_people(spec.name.as_str()),
            spec.members.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `xfer status`.
pub async fn status(args: StatusArgs) -> Result<ExitCode> {
    let StatusArgs {
        at: ClusterNodes {
            file: ClusterFile { cluster },
            nodes,
        },
        json,
        watch,
    } = args;
    let cluster = load(cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    // Registered before the first refresh, so a Ctrl-C during one ends
    // the watch with that refresh's code.
    let mut interrupt = if watch {
        Some(tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::interrupt(),
        )?)
    } else {
        None
    };
    let code = loop {
        let reports = xfer::client::status::status(&cluster, &cred, &nodes).await?;
        let problems = xfer::client::status::problems(&reports);
        let last = xfer::client::status::problems_line(&problems);
        if json {
            serde_json::to_writer(std::io::stdout().lock(), &reports)?;
            println!();
            if let Some(line) = &last {
                eprintln!("{line}");
            }
        } else {
            if watch && std::io::stdout().is_terminal() {
                print!("\x1b[2J\x1b[H");
            }
            let width = xfer::util::term::stdout_width();
            print!("{}", xfer::client::render::render(&reports, width));
            let now = xfer::util::clock::unix_now();
            for r in &reports {
                for j in r.status.iter().flat_map(|s| &s.jobs) {
                    if r.status.as_ref().and_then(|s| s.node.as_deref())
                        == Some(j.source_node.as_str())
                    {
                        super::out::say(&xfer::client::render::job_line(j, now));
                    }
                }
            }
            if let Some(line) = &last {
                println!("{line}");
            }
        }
        let code = if problems.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
        let Some(interrupt) = interrupt.as_mut() else {
            break code;
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = interrupt.recv() => break code,
        }
    };
    Ok(code)
}

/// `xfer prune`.
pub async fn prune(args: PruneArgs) -> Result<ExitCode> {
    let PruneArgs {
        at: ClusterNodes {
            file: ClusterFile { cluster },
            nodes,
        },
        json,
    } = args;
    let cluster = load(cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    let reports = xfer::client::cleanup::prune(&cluster, &cred, &nodes).await?;
    let failed = reports.iter().any(|r| r.error.is_some());
    if json {
        serde_json::to_writer(std::io::stdout().lock(), &reports)?;
        println!();
    } else {
        for r in &reports {
            if let Some(e) = &r.error {
                println!("{}: FAILED: {e}", r.node);
                continue;
            }
            if r.pruned.is_empty() {
                println!("{}: no ended job", r.node);
            }
            for j in &r.pruned {
                println!(
                    "{}: removed job {} ({}, {})",
                    r.node,
                    j.id,
                    xfer_proto::names::for_people(&j.name),
                    j.state.label()
                );
            }
        }
    }
    Ok(exit_for(failed))
}

/// `xfer cancel`.
pub async fn cancel(args: CancelArgs) -> Result<ExitCode> {
    let CancelArgs {
        job,
        at: ClusterFile { cluster },
    } = args;
    xfer_proto::admin::check_job_id(&job).map_err(anyhow::Error::msg)?;
    let cluster = load(cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    let replies = xfer::client::cleanup::cancel(&cluster, &cred, &job).await;
    let mut known = 0;
    for (node, r) in &replies {
        match r {
            Ok(true) => {
                known += 1;
                println!("{node}: cancelled");
            }
            Ok(false) => println!("{node}: did not know job {job}"),
            Err(e) => println!("{node}: unreachable: {e}"),
        }
    }
    if known == 0 {
        anyhow::bail!("no node knew job {job}; list jobs with `xfer status`");
    }
    Ok(ExitCode::SUCCESS)
}

/// `xfer gc`.
pub async fn gc(args: GcArgs) -> Result<ExitCode> {
    let GcArgs {
        at: ClusterNodes {
            file: ClusterFile { cluster },
            nodes,
        },
        dry_run,
        need,
        json,
    } = args;
    let cluster = load(cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    let answers = xfer::client::cleanup::gc(&cluster, &cred, &nodes, dry_run, need).await?;
    let failed = answers.iter().any(|a| a.error.is_some());
    if json {
        serde_json::to_writer(std::io::stdout().lock(), &answers)?;
        println!();
    } else {
        use xfer_proto::units::Bytes;
        for a in &answers {
            if let Some(e) = &a.error {
                println!("{}: FAILED: {e}", a.node);
                continue;
            }
            let Some(r) = &a.report else { continue };
            let verb = if r.dry_run { "would evict" } else { "evicted" };
            for (name, bytes, why) in &r.evicted {
                println!(
                    "{}: {verb} {} ({}): {why}",
                    a.node,
                    xfer_proto::names::for_people(name),
                    Bytes(*bytes)
                );
            }
            for f in &r.failed {
                println!("{}: could not evict {f}", a.node);
            }
            println!(
                "{}: {} held of a {} budget (evicts above {}, down to {}); {} model(s){}",
                a.node,
                Bytes(r.used),
                Bytes(r.limit),
                Bytes(r.high),
                Bytes(r.low),
                r.models.len(),
                if r.evicted.is_empty() {
                    ", nothing to evict"
                } else {
                    ""
                }
            );
        }
    }
    Ok(exit_for(failed))
}

/// `xfer ls`: each node's models (by repo id), newest use first, and its
/// budget; what a dry-run `gc` reports, without its plan.
pub async fn ls(args: LsArgs) -> Result<ExitCode> {
    let LsArgs {
        at: ClusterNodes {
            file: ClusterFile { cluster },
            nodes,
        },
        json,
    } = args;
    let cluster = load(cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    let mut answers = xfer::client::cleanup::gc(&cluster, &cred, &nodes, true, None).await?;
    let failed = answers.iter().any(|a| a.error.is_some());
    for a in &mut answers {
        if let Some(r) = &mut a.report {
            r.evicted.clear();
            r.models.sort_by(|x, y| {
                y.last_used_ms
                    .cmp(&x.last_used_ms)
                    .then(x.name.cmp(&y.name))
            });
        }
    }
    if json {
        serde_json::to_writer(std::io::stdout().lock(), &answers)?;
        println!();
        return Ok(exit_for(failed));
    }
    use xfer_proto::units::Bytes;
    let now = xfer::util::clock::unix_now_ms();
    for a in &answers {
        if let Some(e) = &a.error {
            println!("{}: FAILED: {e}", a.node);
            continue;
        }
        let Some(r) = &a.report else { continue };
        println!(
            "{}: {} held of a {} budget (evicts above {}, down to {})",
            a.node,
            Bytes(r.used),
            Bytes(r.limit),
            Bytes(r.high),
            Bytes(r.low)
        );
        for m in &r.models {
            let ago = now.saturating_sub(m.last_used_ms) / 1000;
            let mut notes = Vec::new();
            if m.pinned {
                notes.push("pinned".to_string());
            }
            if let Some(h) = m.held.as_ref().filter(|h| h.as_str() != "pinned") {
                notes.push(h.clone());
            }
            println!(
                "  {:<48} {:>10}  used {:>8} ago{}",
                xfer_proto::names::for_people(&m.name),
                Bytes(m.bytes).to_string(),
                human_ago(ago),
                if notes.is_empty() {
                    String::new()
                } else {
                    format!("  ({})", notes.join(", "))
                }
            );
        }
    }
    Ok(exit_for(failed))
}

/// `90 s`, `12 min`, `5 h`, `3 d`.
fn human_ago(s: u64) -> String {
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// `xfer pin` and `xfer unpin`.
pub async fn pin(args: PinArgs, pinned: bool) -> Result<ExitCode> {
    let PinArgs {
        name,
        at: ClusterNodes {
            file: ClusterFile { cluster },
            nodes,
        },
        repo_type,
    } = args;
    let cluster = load(cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    let name =
        xfer_proto::names::ModelName::from_user(&name, repo_type).map_err(anyhow::Error::msg)?;
    let replies = xfer::client::cleanup::pin(&cluster, &cred, &nodes, &name, pinned).await?;
    let mut failed = false;
    for (node, r) in &replies {
        match r {
            Ok(p) => println!(
                "{node}: {} {}",
                xfer_proto::names::for_people(name.as_str()),
                if *p { "pinned" } else { "unpinned" }
            ),
            Err(e) => {
                failed = true;
                println!("{node}: FAILED: {e}");
            }
        }
    }
    Ok(exit_for(failed))
}

/// `xfer rm`.
pub async fn rm(args: RmArgs) -> Result<ExitCode> {
    let RmArgs {
        name,
        at: ClusterNodes {
            file: ClusterFile { cluster },
            nodes,
        },
        repo_type,
        yes,
        force,
    } = args;
    let cluster = load(cluster)?;
    let name =
        xfer_proto::names::ModelName::from_user(&name, repo_type).map_err(anyhow::Error::msg)?;
    let targets: Vec<String> = cluster
        .select(&nodes)?
        .iter()
        .map(|n| n.name.to_string())
        .collect();
    if !yes {
        if !std::io::stdin().is_terminal() {
            anyhow::bail!(
                "xfer rm deletes {name} from {}; pass --yes to confirm",
                targets.join(", ")
            );
        }
        eprint!("delete {name} from {}? [y/N] ", targets.join(", "));
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            anyhow::bail!("not confirmed; nothing deleted");
        }
    }
    let cred = Arc::new(Credential::load(&cluster.key)?);
    let replies = xfer::client::cleanup::remove(&cluster, &cred, &nodes, &name, force).await?;
    let mut failed = false;
    for (node, r) in &replies {
        match r {
            Ok(true) => println!("{node}: removed {name}"),
            Ok(false) => println!("{node}: had no {name}"),
            Err(e) => {
                failed = true;
                println!("{node}: FAILED: {e}");
            }
        }
    }
    if failed {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Exit 1 when any node failed, else 0.
fn exit_for(failed: bool) -> ExitCode {
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
