//! Progress bars: one per destination, drawn on stderr only when stdout is a
//! terminal, so scripts and `--json` consumers see nothing but their output.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A set of bars that may be hidden.
#[derive(Clone)]
pub struct Progress {
    multi: MultiProgress,
}

impl Progress {
    /// Bars are shown when `want` is set and stdout is a terminal.
    pub fn new(want: bool) -> Self {
        let enabled = want && std::io::stdout().is_terminal();
        let target = if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Progress {
            multi: MultiProgress::with_draw_target(target),
        }
    }

    /// A byte bar labelled `label`.
    pub fn bytes(&self, label: &str, total: u64) -> ProgressBar {
        let bar = self.multi.add(ProgressBar::new(total));
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>24} [{bar:32.cyan/blue}] {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} ETA {eta:>4} {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(label.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    }

    /// A byte counter without a known total (hashing while walking).
    pub fn counter(&self, label: &str) -> ProgressBar {
        let bar = self.multi.add(ProgressBar::new_spinner());
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>24} {spinner} {bytes:>10} {binary_bytes_per_sec:>12} {msg}",
            )
            .expect("valid template"),
        );
        bar.set_prefix(label.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        bar
    }
}
