//! `xfer-launch check`: the preflight table (or JSON), exit 1 on any failure.

use std::process::ExitCode;

use launcher::agents::Agents;
use launcher::config::Setup;

use super::CliError;

pub async fn check(setup: Setup, agents: Agents, json: bool) -> Result<ExitCode, CliError> {
    let checked = launcher::check::run(&setup, &agents).await;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&checked).expect("a check always serializes")
        );
    } else {
        print!(
            "{}",
            launcher::preflight::render(&checked.rows, xfer::util::term::stdout_width())
        );
        if let Some(line) = checked.unit_line() {
            let width = xfer::util::term::stdout_width();
            println!("{}", xfer_proto::text::wrap(&line, width, 4));
        }
        if checked.model_path != setup.model.path {
            println!("model path: {}", checked.model_path);
        }
    }
    Ok(if checked.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
