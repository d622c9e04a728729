//! Progress bars: one per destination, drawn on stderr only when stdout is a
//! terminal, so scripts and `--json` consumers see nothing but their output.
//!
//! A bar line fits the terminal: `name  [=====>    ]  1.2 GiB/4.0 GiB
//! 20.1 MiB/s  ETA 2m05s  msg`, the name elided in the middle when it is
//! long, the bar as wide as what is left. Sizes and rates use the binary
//! units of [`xfer_proto::units`]. The rate and the ETA count only the bytes
//! moved in this run: a bar resumed at bytes already held
//! ([`Bar::resume_at`], [`Bar::held_more`]) starts its clock there.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use xfer_proto::text::elide;
use xfer_proto::units::{Bytes, Rate};

/// A set of bars that may be hidden.
#[derive(Clone)]
pub struct Progress {
    multi: MultiProgress,
    /// The label's columns and the bar's, for the terminal's width.
    name_cols: usize,
    bar_cols: usize,
    /// Bars are drawn.
    shown: bool,
    /// The bars of whole destinations (not of a file within one), for
    /// [`Progress::kept`].
    tops: Arc<Mutex<Vec<Bar>>>,
}

/// The columns a bar line takes besides its name and its bar (brackets,
/// sizes, rate, ETA and a short message).
const FIXED_COLS: usize = 62;
/// The narrowest bar drawn.
const MIN_BAR: usize = 10;

impl Progress {
    /// Bars are shown when `want` is set and stdout is a terminal.
    pub fn new(want: bool) -> Self {
        let enabled = want && std::io::stdout().is_terminal();
        let target = if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        // One column short of the width: a line that fills the last
        // column leaves some terminals about to wrap.
        let width = crate::util::term::stderr_width().unwrap_or(100) - 1;
        let name_cols = width.saturating_sub(FIXED_COLS + MIN_BAR).clamp(8, 24);
        Progress {
            multi: MultiProgress::with_draw_target(target),
            name_cols,
            bar_cols: width.saturating_sub(FIXED_COLS + name_cols).max(MIN_BAR),
            shown: enabled,
            tops: Arc::default(),
        }
    }

    /// A byte bar labelled `label` for a whole destination (a node, a
    /// repo): what it holds counts in [`Progress::kept`].
    pub fn bytes(&self, label: &str, total: u64) -> Bar {
        let bar = self.part(label, total);
        self.tops.lock().unwrap().push(bar.clone());
        bar
    }

    /// Bytes held and bytes in all over the destinations' bars, and how
    /// many destinations: what an interrupted command keeps.
    pub fn kept(&self) -> (u64, u64, usize) {
        let tops = self.tops.lock().unwrap();
        let held = tops.iter().map(|b| b.position()).sum();
        let total = tops.iter().map(|b| b.bar.length().unwrap_or(0)).sum();
        (held, total, tops.len())
    }

    /// A byte bar for a part of a destination (one file of a repo).
    pub fn part(&self, label: &str, total: u64) -> Bar {
        let bar = self.multi.add(ProgressBar::new(total));
        let clock = Arc::new(Mutex::new((0u64, Instant::now(), None)));
        let (name, c) = (elide(label, self.name_cols), clock.clone());
        let w = self.name_cols;
        let style = ProgressStyle::with_template(&format!(
            "{{name}} [{{bar:{}.cyan/blue}}] {{held}} {{rate}} {{eta}} {{msg}}",
            self.bar_cols
        ))
        .expect("valid template")
        .progress_chars("=> ")
        .with_key(
            "name",
            move |_: &ProgressState, out: &mut dyn std::fmt::Write| {
                let _ = write!(out, "{name:>w$}");
            },
        )
        .with_key(
            "held",
            |s: &ProgressState, out: &mut dyn std::fmt::Write| {
                let held = format!("{}/{}", Bytes(s.pos()), Bytes(s.len().unwrap_or(0)));
                let _ = write!(out, "{held:>21}");
            },
        )
        .with_key(
            "rate",
            move |s: &ProgressState, out: &mut dyn std::fmt::Write| {
                let _ = write!(out, "{:>12}", rate(s, &c));
            },
        )
        .with_key("eta", |s: &ProgressState, out: &mut dyn std::fmt::Write| {
            let eta = if s.is_finished() || s.per_sec() <= 0.0 {
                String::new()
            } else {
                format!("ETA {}", short_duration(s.eta()))
            };
            let _ = write!(out, "{eta:<10}");
        });
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(200));
        Bar {
            bar,
            clock,
            kept_on_screen: Arc::new(AtomicBool::new(true)),
        }
    }

    /// Columns a bar's name gets (what a label must fit in).
    pub fn name_cols(&self) -> usize {
        self.name_cols
    }

    /// A byte counter without a known total (hashing while walking).
    pub fn counter(&self, label: &str) -> Bar {
        let bar = self.multi.add(ProgressBar::new_spinner());
        let clock = Arc::new(Mutex::new((0u64, Instant::now(), None)));
        let (name, c, w) = (elide(label, self.name_cols), clock.clone(), self.name_cols);
        bar.set_style(
            ProgressStyle::with_template("{name} {spinner} {done} {rate} {msg}")
                .expect("valid template")
                .with_key(
                    "name",
                    move |_: &ProgressState, out: &mut dyn std::fmt::Write| {
                        let _ = write!(out, "{name:>w$}");
                    },
                )
                .with_key(
                    "done",
                    |s: &ProgressState, out: &mut dyn std::fmt::Write| {
                        let _ = write!(out, "{:>10}", Bytes(s.pos()).to_string());
                    },
                )
                .with_key(
                    "rate",
                    move |s: &ProgressState, out: &mut dyn std::fmt::Write| {
                        let _ = write!(out, "{:>12}", rate(s, &c));
                    },
                ),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Bar {
            bar,
            clock,
            kept_on_screen: Arc::new(AtomicBool::new(true)),
        }
    }

    /// The work is over: what follows starts on a line of its own, below
    /// the bars that stay on the screen.
    pub fn end(&self) {
        let tops = self.tops.lock().unwrap();
        if self.shown
            && tops
                .iter()
                .any(|b| b.kept_on_screen.load(Ordering::Relaxed))
        {
            eprintln!();
        }
    }
}

/// The rate of the bytes moved since the bar's clock started: the
/// estimator's while it runs (reset at the held position), the average
/// once it is over.
fn rate(s: &ProgressState, clock: &Mutex<(u64, Instant, Option<Instant>)>) -> String {
    let r = if s.is_finished() {
        // Over the bar's own time: a finished bar's rate stands still.
        let (base, since, end) = *clock.lock().unwrap();
        let secs = end
            .unwrap_or_else(Instant::now)
            .duration_since(since)
            .as_secs_f64();
        if secs <= 0.0 {
            0.0
        } else {
            s.pos().saturating_sub(base) as f64 / secs
        }
    } else {
        s.per_sec()
    };
    if r > 0.0 && r.is_finite() {
        Rate(r).to_string()
    } else {
        String::new()
    }
}

/// `37s`, `2m05s`, `3h12m`.
fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s / 60) % 60),
    }
}

/// One bar; its rate and ETA count from the held position it was resumed
/// at, not from zero.
#[derive(Clone)]
pub struct Bar {
    bar: ProgressBar,
    /// The position the rate counts from and when it was reached.
    clock: Arc<Mutex<(u64, Instant, Option<Instant>)>>,
    /// Not cleared away: its line stays when the work is over.
    kept_on_screen: Arc<AtomicBool>,
}

impl Bar {
    /// The bar stands at `held`, bytes held before this run: the rate and
    /// the ETA count from here.
    pub fn resume_at(&self, held: u64) {
        self.bar.set_position(held);
        self.restart_clock();
    }

    /// `n` more bytes turned out to be held already (a file resumed from
    /// its part map): the bar moves on, the rate clock starts again here.
    pub fn held_more(&self, n: u64) {
        self.bar.inc(n);
        self.restart_clock();
    }

    fn restart_clock(&self) {
        self.bar.reset_eta();
        *self.clock.lock().unwrap() = (self.bar.position(), Instant::now(), None);
    }

    /// Moves the bar to `pos` (bytes held, counted by the rate from the
    /// resumed position).
    pub fn set_position(&self, pos: u64) {
        self.bar.set_position(pos);
    }

    /// `n` more bytes moved.
    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    /// Where the bar stands.
    pub fn position(&self) -> u64 {
        self.bar.position()
    }

    /// The total changes.
    pub fn set_length(&self, len: u64) {
        self.bar.set_length(len);
    }

    /// The total is not known (yet): the bar is drawn empty, never full.
    pub fn unset_length(&self) {
        self.bar.unset_length();
    }

    /// A short label after the bar (`verified`, a state).
    pub fn set_message(&self, msg: impl Into<std::borrow::Cow<'static, str>>) {
        self.bar.set_message(msg);
    }

    /// Done, with a label; its rate stops where it ended.
    pub fn finish_with_message(&self, msg: impl Into<std::borrow::Cow<'static, str>>) {
        self.stop_clock();
        self.bar.finish_with_message(msg);
    }

    /// Given up, with a label.
    pub fn abandon_with_message(&self, msg: impl Into<std::borrow::Cow<'static, str>>) {
        self.stop_clock();
        self.bar.abandon_with_message(msg);
    }

    /// Whether the bar was finished or abandoned.
    pub fn is_finished(&self) -> bool {
        self.bar.is_finished()
    }

    /// A finished bar runs again (what it counted changed after all): at
    /// `held`, its rate counting from there.
    pub fn reopen(&self, held: u64) {
        self.bar.reset();
        self.resume_at(held);
    }

    fn stop_clock(&self) {
        self.clock
            .lock()
            .unwrap()
            .2
            .get_or_insert_with(Instant::now);
    }

    /// Done and gone from the screen.
    pub fn finish_and_clear(&self) {
        self.kept_on_screen.store(false, Ordering::Relaxed);
        self.bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_short() {
        assert_eq!(short_duration(Duration::from_secs(37)), "37s");
        assert_eq!(short_duration(Duration::from_secs(125)), "2m05s");
        assert_eq!(short_duration(Duration::from_secs(3 * 3600 + 720)), "3h12m");
    }

    #[test]
    fn a_resumed_bar_counts_only_what_moved_since() {
        let p = Progress::new(false);
        let bar = p.bytes("model", 1 << 30);
        bar.resume_at(900 << 20);
        bar.inc(1 << 20);
        let (base, _, _) = *bar.clock.lock().unwrap();
        assert_eq!(base, 900 << 20, "the rate counts from the held position");
        assert_eq!(p.kept(), (901 << 20, 1 << 30, 1));
        // A file's bar is not a destination: it does not count as kept.
        p.part("model-00001-of-00002.safetensors", 1 << 20).inc(5);
        assert_eq!(p.kept(), (901 << 20, 1 << 30, 1));
        bar.held_more(1 << 20);
        assert_eq!(bar.clock.lock().unwrap().0, 902 << 20);
    }
}
