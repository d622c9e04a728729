//! The commands that ask a cluster's agents: `sync` (hand a job over, or
//! follow it), `status` (one table across nodes), `cancel` and `rm`.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::args::*;
use xfer::config::auth::Credential;
use xfer::util::progress::Progress;

/// `xfer sync`.
pub async fn sync(args: SyncArgs) -> Result<ExitCode> {
    let SyncArgs {
        source,
        cluster,
        nodes,
        from,
        name,
        repo_type,
        chunk_size,
        limit_rate,
        wait,
        json,
        transport,
        peers,
    } = args;
    let cluster = xfer::config::cluster::Cluster::load(&cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    let req = xfer::agent::sync::client::SyncRequest {
        source,
        nodes,
        from,
        name,
        repo_type,
        chunk_size,
        limit_rate,
        transport,
        peers,
    };
    let spec = xfer::agent::sync::client::sync(&cluster, &cred, &req).await?;
    if !wait {
        if json {
            println!(
                "{}",
                serde_json::json!({"job": spec.id, "name": spec.name.to_string()})
            );
        } else {
            println!("{}", spec.id);
            eprintln!(
                "job {} handed to {} node(s): {} from {}; follow it with `xfer status --cluster ...`",
                spec.id,
                spec.members.len(),
                spec.name,
                spec.source_node
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("job {} (Ctrl-C stops following; the job goes on)", spec.id);
    let cluster_file = cluster.path.display().to_string();
    let progress = Progress::new(!json);
    let root = super::out::or_interrupted(
        xfer::agent::sync::client::wait(&cluster, &cred, &spec, &progress),
        || {
            format!(
                "stopped following job {}; it goes on on the nodes (nothing is lost): follow it with `xfer status --cluster {cluster_file}`, stop it with `xfer cancel {} --cluster {cluster_file}`",
                spec.id, spec.id
            )
        },
    )
    .await;
    progress.end();
    let root = root?;
    if json {
        println!(
            "{}",
            serde_json::json!({"job": spec.id, "name": spec.name.to_string(), "root": root})
        );
    } else {
        println!(
            "{}: {} complete on {} node(s), root {root}",
            spec.id,
            spec.name,
            spec.members.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `xfer status`.
pub async fn status(args: StatusArgs) -> Result<ExitCode> {
    let StatusArgs {
        cluster,
        nodes,
        json,
        watch,
    } = args;
    let cluster = xfer::config::cluster::Cluster::load(&cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    loop {
        let reports = xfer::agent::sync::client::status(&cluster, &cred, &nodes).await?;
        if json {
            serde_json::to_writer(std::io::stdout().lock(), &reports)?;
            println!();
        } else {
            if watch && std::io::stdout().is_terminal() {
                print!("\x1b[2J\x1b[H");
            }
            let width = xfer::util::term::stdout_width();
            print!("{}", xfer::agent::sync::client::render(&reports, width));
            for r in &reports {
                for j in r.status.iter().flat_map(|s| &s.jobs) {
                    if r.status.as_ref().and_then(|s| s.node.as_deref())
                        == Some(j.source_node.as_str())
                    {
                        // The job on its line; its last error wrapped on
                        // indented lines under it.
                        super::out::say(&format!(
                            "job {} {} from {} to {}: {}",
                            j.id,
                            j.name,
                            j.source_node,
                            j.nodes.join(","),
                            j.shown(),
                        ));
                        if let Some(e) = &j.last_error {
                            super::out::say(&format!("    last error: {e}"));
                        }
                    }
                }
            }
        }
        if !watch {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(ExitCode::SUCCESS)
}

/// `xfer cancel`.
pub async fn cancel(args: CancelArgs) -> Result<ExitCode> {
    let CancelArgs { job, cluster } = args;
    xfer_proto::admin::check_job_id(&job).map_err(anyhow::Error::msg)?;
    let cluster = xfer::config::cluster::Cluster::load(&cluster)?;
    let cred = Arc::new(Credential::load(&cluster.key)?);
    let replies = xfer::agent::sync::client::cancel(&cluster, &cred, &job).await?;
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

/// `xfer rm`.
pub async fn rm(args: RmArgs) -> Result<ExitCode> {
    let RmArgs {
        name,
        cluster,
        nodes,
        yes,
        force,
    } = args;
    let cluster = xfer::config::cluster::Cluster::load(&cluster)?;
    let name = xfer_proto::names::ModelName::new(&name).map_err(anyhow::Error::msg)?;
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
    let replies = xfer::agent::sync::client::remove(&cluster, &cred, &nodes, &name, force).await?;
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
