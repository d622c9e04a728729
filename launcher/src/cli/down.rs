//! `xfer-launch down`: stop every rank, and say what each node stopped.

use std::process::ExitCode;
use std::time::Duration;

use launcher::agents::Agents;
use launcher::config::Setup;
use xfer_proto::launch::RunState;

use super::{Again, CliError};

pub async fn down(
    setup: Setup,
    agents: Agents,
    grace: Duration,
    run: Option<String>,
) -> Result<ExitCode, CliError> {
    if setup.runner == launcher::config::Runner::Srun {
        // Slurm owns the ranks: cancel the step(s) `up` started in this job.
        let steps = launcher::srun::cancel_steps(run.as_deref())?;
        match steps.as_slice() {
            [] => println!("no xfer-launch step runs in this Slurm job"),
            s => println!("cancelled Slurm step(s) {}", s.join(", ")),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let answers = launcher::up::stop(&agents, run.as_deref(), grace, "xfer-launch down").await;
    let mut failed = 0;
    for (n, a) in setup.nodes.iter().zip(answers) {
        match a {
            Ok(reports) if reports.is_empty() => println!("{}: nothing running", n.name),
            Ok(reports) => {
                for r in reports {
                    let procs = r.procs.len();
                    let state = match &r.state {
                        RunState::Stopped(_) => "stopped".to_string(),
                        RunState::Failed(w) => format!("had failed: {w}"),
                        s => format!("{s:?}"),
                    };
                    println!(
                        "{}: run {} rank {} {state} ({procs} process(es))",
                        n.name, r.run, r.rank
                    );
                }
            }
            Err(e) => {
                failed += 1;
                println!("{}: agent {} did not answer: {e}", n.name, n.agent);
            }
        }
    }
    if failed > 0 {
        return Err(CliError::Silent {
            silent: failed,
            again: Again::Down,
        });
    }
    Ok(ExitCode::SUCCESS)
}
