//! The commands' human lines: each wrapped to the terminal it goes to
//! (continuation lines indented, nothing cut), and the one line Ctrl-C
//! leaves (what was kept, how to resume) with exit code 130.

use std::future::Future;
use std::io::IsTerminal;

use xfer_proto::text::wrap;

/// Prints `line` on stdout, wrapped to the terminal's width.
pub fn say(line: &str) {
    println!("{}", wrap(line, xfer::util::term::stdout_width(), 4));
}

/// Prints `line` on stderr, wrapped to the terminal's width.
pub fn warn(line: &str) {
    eprintln!("{}", wrap(line, xfer::util::term::stderr_width(), 4));
}

/// The exit code of a command stopped by Ctrl-C (128 + SIGINT).
pub const INTERRUPTED: i32 = 130;

/// Runs `work` until it ends or Ctrl-C comes; on Ctrl-C prints the line
/// `kept()` makes (what is kept and the command that resumes) and exits
/// with [`INTERRUPTED`] at once (a hashing thread is not waited for).
pub async fn or_interrupted<T>(work: impl Future<Output = T>, kept: impl FnOnce() -> String) -> T {
    tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => {
            // Below the bars' last line, on a terminal.
            if std::io::stderr().is_terminal() {
                eprintln!();
            }
            warn(&format!("interrupted: {}", kept()));
            std::process::exit(INTERRUPTED);
        }
    }
}
