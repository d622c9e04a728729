//! A budget for repeated log lines: the first few of every window are
//! logged one by one, the rest only counted and summed up in one line when
//! the next window opens. Pure (the caller passes the time), so a storm of
//! refusals or of failing fetches from one peer cannot grow the log
//! without bound, and the rule is tested without waiting.

use std::time::{Duration, Instant};

/// What to do with one more line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `hidden` lines of the last window went unlogged before it
    /// (say so first when nonzero).
    Log {
        /// Lines hidden since the last one logged.
        hidden: u64,
    },
    /// Count it only.
    Hide,
}

/// One budget: `shown` lines per `window`.
#[derive(Debug, Clone)]
pub struct LogBudget {
    shown: u32,
    window: Duration,
    opened: Option<Instant>,
    used: u32,
    hidden: u64,
}

impl LogBudget {
    /// A budget of `shown` lines per `window`.
    pub fn new(shown: u32, window: Duration) -> LogBudget {
        LogBudget {
            shown,
            window,
            opened: None,
            used: 0,
            hidden: 0,
        }
    }

    /// One more line at `now`.
    pub fn admit(&mut self, now: Instant) -> Verdict {
        let mut carried = 0;
        if self
            .opened
            .is_none_or(|w| now.saturating_duration_since(w) >= self.window)
        {
            carried = std::mem::take(&mut self.hidden);
            self.opened = Some(now);
            self.used = 0;
        }
        if self.used < self.shown {
            self.used += 1;
            Verdict::Log { hidden: carried }
        } else {
            self.hidden += carried + 1;
            Verdict::Hide
        }
    }

    /// The window's length, for the summary line.
    pub fn window(&self) -> Duration {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storm_logs_a_few_lines_a_window_and_counts_the_rest() {
        let t0 = Instant::now();
        let mut b = LogBudget::new(3, Duration::from_secs(10));
        let first: Vec<Verdict> = (0..70_000).map(|_| b.admit(t0)).collect();
        let logged = first.iter().filter(|v| **v != Verdict::Hide).count();
        assert_eq!(logged, 3);
        // The next window opens with the count of what was hidden.
        assert_eq!(
            b.admit(t0 + Duration::from_secs(10)),
            Verdict::Log { hidden: 69_997 }
        );
        assert_eq!(
            b.admit(t0 + Duration::from_secs(11)),
            Verdict::Log { hidden: 0 }
        );
    }
}
