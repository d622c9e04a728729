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
