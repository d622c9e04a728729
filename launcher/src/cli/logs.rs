//! `xfer-launch logs`: each rank's log through its agent, once or
//! following it until every rank has stopped.

use std::process::ExitCode;
use std::time::Duration;

use launcher::agents::Agents;
use launcher::config::Setup;
use xfer_proto::launch::{LaunchReply, LaunchRequest};

use super::CliError;

pub async fn logs(
    setup: Setup,
    agents: Agents,
    nodes: Vec<String>,
    run: Option<String>,
    follow: bool,
) -> Result<ExitCode, CliError> {
    if setup.runner == launcher::config::Runner::Srun {
        return srun_logs(&setup, &nodes, run.as_deref());
    }
    let mut picked: Vec<usize> = Vec::new();
    for name in &nodes {
        let i = setup
            .nodes
            .iter()
            .position(|n| &n.name == name)
            .ok_or_else(|| CliError::NoSuchNode {
                name: name.clone(),
                has: setup.nodes.iter().map(|n| n.name.to_string()).collect(),
            })?;
        if !picked.contains(&i) {
            picked.push(i);
        }
    }
    if nodes.is_empty() {
        picked = (0..setup.nodes.len()).collect();
    }
    // Which run each node shows.
    let mut cursors: Vec<(usize, String, u64, bool)> = Vec::new();
    for &i in &picked {
        let msg = LaunchRequest::RunQuery { run: run.clone() };
        match agents.ask(i, &msg, launcher::agents::QUICK).await {
            Ok(LaunchReply::Runs(r)) => match r.first() {
                Some(r) => {
                    eprintln!(
                        "== {} rank {} run {}: {:?} ({}) ==",
                        r.node, r.rank, r.run, r.state, r.log
                    );
                    cursors.push((i, r.run.clone(), 0, true));
                }
                None => eprintln!("== {}: no run ==", setup.nodes[i].name),
            },
            Ok(other) => return Err(CliError::Unexpected(launcher::agents::unexpected(&other))),
            Err(why) => {
                return Err(CliError::Unanswered {
                    node: setup.nodes[i].name.to_string(),
                    agent: setup.nodes[i].agent.clone(),
                    why,
                })
            }
        }
    }
    loop {
        let mut any_live = false;
        for c in cursors.iter_mut() {
            loop {
                let msg = LaunchRequest::ReadLog {
                    run: c.1.clone(),
                    offset: c.2,
                    max: 1 << 20,
                };
                let chunk = match agents.ask(c.0, &msg, launcher::agents::QUICK).await {
                    Ok(LaunchReply::Log(l)) => l,
                    Ok(other) => {
                        return Err(CliError::Unexpected(launcher::agents::unexpected(&other)))
                    }
                    Err(why) => {
                        return Err(CliError::Node {
                            node: setup.nodes[c.0].name.to_string(),
                            why,
                        })
                    }
                };
                let text = String::from_utf8_lossy(&chunk.data);
                for line in text.split_inclusive('\n') {
                    print!("[{}] {line}", chunk.node);
                    if !line.ends_with('\n') {
                        println!();
                    }
                }
                c.2 = chunk.offset + chunk.data.len() as u64;
                c.3 = chunk.live;
                if chunk.data.is_empty() || c.2 >= chunk.size {
                    break;
                }
            }
            any_live |= c.3;
        }
        if !follow || !any_live {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(ExitCode::SUCCESS)
}

/// With `runner = "srun"`: each rank's output, as the step wrote it beside
/// the run record (the newest run, or `run`).
fn srun_logs(setup: &Setup, nodes: &[String], run: Option<&str>) -> Result<ExitCode, CliError> {
    let records = launcher::record::default_dir();
    let dir = match run {
        Some(r) => records.join(format!("{r}.srun")),
        None => std::fs::read_dir(&records)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "srun"))
            .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
            .ok_or_else(|| {
                CliError::Srun(launcher::srun::SrunError::Io {
                    path: records.clone(),
                    err: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no run of runner = \"srun\" here",
                    ),
                })
            })?,
    };
    for n in &setup.nodes {
        if !nodes.is_empty() && !nodes.contains(&n.name.to_string()) {
            continue;
        }
        let log = dir.join(format!("rank-{}.log", n.name));
        eprintln!("== {} ({}) ==", n.name, log.display());
        print!("{}", std::fs::read_to_string(&log).unwrap_or_default());
    }
    Ok(ExitCode::SUCCESS)
}
