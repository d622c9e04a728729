//! Where a job round's seconds go, on its source: the marks the runner
//! reaches (listed, hashed, downloaded, streamed), read on one clock that
//! starts with the round, ended into the [`RoundTimeline`] the job's record
//! and `xfer sync --wait --json` carry.

use std::sync::Mutex;
use std::time::Instant;

use xfer_proto::admin::RoundTimeline;

/// A mark a round reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// The source's listing was read.
    Listed,
    /// A folder source was hashed.
    Hashed,
    /// The download from the origin ended.
    Downloaded,
    /// The stream to the members ended.
    Streamed,
}

/// One round's clock and the marks read on it.
#[derive(Debug)]
pub struct RoundClock {
    origin: Instant,
    marks: Mutex<RoundTimeline>,
}

impl RoundClock {
    /// A clock that starts now.
    pub fn start() -> RoundClock {
        RoundClock {
            origin: Instant::now(),
            marks: Mutex::new(RoundTimeline::default()),
        }
    }

    /// `mark` reached now.
    pub fn mark(&self, mark: Mark) {
        self.mark_at(mark, Instant::now());
    }

    /// `mark` reached at `at` (the first reading of a mark stays).
    pub fn mark_at(&self, mark: Mark, at: Instant) {
        let s = at.saturating_duration_since(self.origin).as_secs_f64();
        let mut t = self.marks.lock().unwrap();
        let slot = match mark {
            Mark::Listed => &mut t.listed_s,
            Mark::Hashed => &mut t.hashed_s,
            Mark::Downloaded => &mut t.downloaded_s,
            Mark::Streamed => &mut t.streamed_s,
        };
        slot.get_or_insert(s);
    }

    /// The round's timeline, ended now.
    pub fn end(self) -> RoundTimeline {
        let done_s = self.origin.elapsed().as_secs_f64();
        RoundTimeline {
            done_s,
            ..self.marks.into_inner().unwrap()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn marks_are_read_on_the_rounds_clock_and_the_first_reading_stays() {
        let clock = RoundClock::start();
        let at = clock.origin + Duration::from_millis(1500);
        clock.mark_at(Mark::Downloaded, at);
        clock.mark_at(Mark::Downloaded, at + Duration::from_secs(1));
        clock.mark_at(Mark::Listed, clock.origin);
        let t = clock.end();
        assert_eq!(t.downloaded_s, Some(1.5));
        assert_eq!(t.listed_s, Some(0.0));
        assert_eq!((t.hashed_s, t.streamed_s), (None, None));
        assert!(t.done_s >= 0.0);
    }
}
