//! `xfer-launch plan`: the dry run, as shell lines or JSON.

use std::path::Path;
use std::process::ExitCode;

pub fn plan(cluster: &Path, json: bool) -> Result<ExitCode, String> {
    let setup = super::load(cluster)?;
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
