//! `xfer-launch status`: what each node's agent runs for the launch (the
//! newest run, or `--run`), and the launch unit that run started, read
//! from its record.

use std::path::PathBuf;
use std::process::ExitCode;

use launcher::agents::Agents;
use launcher::config::Setup;
use xfer_proto::launch::{LaunchReply, LaunchRequest, RunState};

use super::{Again, CliError};

pub async fn status(
    setup: Setup,
    agents: Agents,
    run: Option<String>,
    record: Option<PathBuf>,
    json: bool,
) -> Result<ExitCode, CliError> {
    let answers = agents
        .ask_all(
            |_, _| LaunchRequest::RunQuery { run: run.clone() },
            launcher::agents::QUICK,
        )
        .await;
    let mut lines = Vec::new();
    let mut ranks = Vec::new();
    let mut newest: Option<(u64, String)> = None;
    let mut silent = 0;
    for (n, a) in setup.nodes.iter().zip(answers) {
        match a {
            Ok(LaunchReply::Runs(reports)) => match reports.first() {
                Some(r) => {
                    let state = match &r.state {
                        RunState::Running => "running".to_string(),
                        RunState::Stopping(w) => format!("stopping: {w}"),
                        RunState::Stopped(w) => format!("stopped: {w}"),
                        RunState::Failed(w) => format!("failed: {w}"),
                    };
                    lines.push(format!("{}: run {} rank {} {state}", n.name, r.run, r.rank));
                    if newest.as_ref().is_none_or(|(t, _)| r.started_unix > *t) {
                        newest = Some((r.started_unix, r.run.clone()));
                    }
                    ranks.push(serde_json::json!({"node": n.name, "run": r.run, "rank": r.rank, "state": state}));
                }
                None => lines.push(format!("{}: nothing running", n.name)),
            },
            Ok(other) => {
                silent += 1;
                lines.push(format!(
                    "{}: {}",
                    n.name,
                    launcher::agents::unexpected(&other)
                ));
            }
            Err(e) => {
                silent += 1;
                lines.push(format!("{}: agent {} did not answer: {e}", n.name, n.agent));
            }
        }
    }
    let run = run.or(newest.map(|(_, r)| r));
    let path = record.or_else(|| {
        run.as_ref()
            .map(|r| launcher::record::default_dir().join(format!("{r}.json")))
    });
    let rec = path
        .as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    let unit = rec.as_ref().map(|r| r["unit"].clone());
    if json {
        println!(
            "{}",
            serde_json::json!({"run": run, "ranks": ranks, "record": path, "unit": unit})
        );
    } else {
        for l in &lines {
            println!("{l}");
        }
        let width = xfer::util::term::stdout_width();
        let line = match (&unit, &path) {
            (Some(u), _) => match serde_json::from_value::<launcher::unit::LaunchUnit>(u.clone()) {
                Ok(u) => format!("launch {}", u.summary()),
                Err(_) => "launch unit: the nodes differed when it started (see its record)".into(),
            },
            (None, Some(p)) => format!(
                "launch unit: unknown, no record at {}; pass --record FILE",
                p.display()
            ),
            (None, None) => "launch unit: no run".into(),
        };
        println!("{}", xfer_proto::text::wrap(&line, width, 4));
    }
    if silent > 0 {
        return Err(CliError::Silent {
            silent,
            again: Again::Status,
        });
    }
    Ok(ExitCode::SUCCESS)
}
