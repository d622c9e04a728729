//! The README's quick start, read as a newcomer copies it: every `xfer`
//! command line in it must parse with this binary's own arguments (with
//! the `export`s and `K=V` prefixes above it in its environment).

#[path = "../../../tests/common/readme.rs"]
mod readme;

use clap::Parser;

use super::args::Cli;

#[test]
fn every_xfer_command_in_the_quick_start_parses() {
    let text = include_str!("../../../README.md");
    let found = readme::commands(text, "## Quick start", "xfer");
    assert!(
        found.len() >= 8,
        "the quick start has only {} xfer commands; did its heading change?",
        found.len()
    );
    for c in found {
        for (k, v) in &c.env {
            std::env::set_var(k, v);
        }
        let parsed = Cli::try_parse_from(&c.argv);
        for (k, _) in &c.env {
            std::env::remove_var(k);
        }
        if let Err(e) = parsed {
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            assert!(
                matches!(e.kind(), DisplayHelp | DisplayVersion),
                "README.md line {}: `{}` does not parse:\n{e}",
                c.line,
                c.argv.join(" ")
            );
        }
    }
}
