//! `xfer-launch plan`: the dry run, as shell lines or JSON. A model path
//! at a revision holds `<COMMIT>` until the agents say which commit their
//! `refs/` name; plan asks them (weights only) and keeps `<COMMIT>`, with
//! one line saying why, when it cannot learn it.

use std::path::Path;
use std::process::ExitCode;

use launcher::config::{Setup, COMMIT_PLACEHOLDER};

use super::CliError;

pub fn plan(cluster: &Path, json: bool) -> Result<ExitCode, CliError> {
    let mut setup = super::load(cluster)?;
    if setup.model.path.contains(COMMIT_PLACEHOLDER) {
        match learn_commit(&setup) {
            Ok(path) => {
                setup.model.path = path;
                setup.model.unresolved = None;
            }
            Err(why) => eprintln!(
                "plan: the model path keeps {COMMIT_PLACEHOLDER}: {why}; `xfer-launch check` resolves it"
            ),
        }
    }
    let plan = launcher::plan::plan(&setup);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&plan).expect("a plan always serializes")
        );
    } else {
        print!("{}", launcher::plan::render_text(&plan));
    }
    Ok(ExitCode::SUCCESS)
}

/// The model path with the commit the agents resolve.
fn learn_commit(setup: &Setup) -> Result<String, CliError> {
    let agents = launcher::agents::Agents::new(setup)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CliError::Runtime)?;
    Ok(rt.block_on(launcher::check::resolve_commit(setup, &agents))?)
}
