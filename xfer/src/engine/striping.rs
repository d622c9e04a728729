//! Striped intake's planner (issue 36), sans-IO: the rule by which a Hub
//! download hands its parts to its downloaders (this node's own
//! connections, and intake nodes that fetch ranges from the origin over
//! their own links), steals from a slow one, retires a dead one and
//! stops a lying one, and when the origin's "slow down" holds the whole
//! cluster. No clock, socket or file: the driver, `hub::download` (and
//! `hub::hold` for the hold), feeds it what happened (a part picked, put
//! back or cut, an intake node's answer, a file that failed its hash, the
//! time as a [`Duration`] since the download began) and does what it says.
//!
//! - **Parts on demand, in file order.** A downloader with a free
//!   connection takes the first queued part it may ([`Planner::next_local`],
//!   [`Planner::next_remote`]); nothing is fixed up front, so a fast link
//!   takes more. An intake node takes only parts of a file the driver
//!   says is ready for it (its URL resolved, its origin honouring
//!   `Range`), never a part cut from it, never a file gone local-only; a
//!   part not finished goes back to the queue's front ([`Planner::put_back`]).
//! - **Work stealing** ([`victim`]): an idle downloader cuts another
//!   node's intake range in flight that would take longest to finish, if
//!   it runs at under half the thief's rate and has more than a second
//!   left, and only while at most a quarter of the thief's node's
//!   connections hold a part. The rest goes back to the queue, not to the
//!   node it was cut from ([`Planner::cut`]).
//! - **Dead and lying downloaders** ([`Planner::answered`],
//!   [`Planner::blame`]): an intake node that fails [`INTAKE_STRIKES`]
//!   ranges in a row, or says "slow down" alone [`INTAKE_BUSY_STRIKES`]
//!   times in its last [`INTAKE_BUSY_WINDOW`] answers, is retired; one
//!   whose bytes differ from the origin's second answer is named; neither
//!   gets more work. A file that failed its hash with intake ranges in it
//!   is fetched again by this node alone ([`Planner::redo`]).
//! - **One hold for the cluster** ([`HoldRule`]): this node's "slow down"
//!   holds every downloader; an intake node's only when another downloader
//!   heard the same within [`CORROBORATE`] (alone, only it waits); at most
//!   [`MAX_TOTAL_HOLD`] over one download.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Part `.1` of file `.0`.
pub type Part = (usize, usize);

/// The downloader index of this node's own connections in [`Thief`] and
/// [`InFlight`]; intake node `r` is `r + 1`.
pub const THIS_NODE: usize = 0;

/// Consecutive failures after which an intake node takes no more work
/// (its parts go back to the others).
pub const INTAKE_STRIKES: u32 = 3;

/// "The origin asked to wait" answers that no other downloader backed
/// ([`Verdict::OnlyIt`]), out of an intake node's last
/// [`INTAKE_BUSY_WINDOW`] answers, after which it takes no more work: a
/// node that mostly says so (its route is throttled for good, or it lies)
/// is retired, whatever successes it mixes in.
pub const INTAKE_BUSY_STRIKES: usize = 3;
/// The answers [`INTAKE_BUSY_STRIKES`] counts over.
pub const INTAKE_BUSY_WINDOW: usize = 6;

/// The smallest part a striped download hands out.
pub const MIN_STRIPED_PART: u64 = 1 << 20;

/// How recent another downloader's "slow down" must be to back an intake
/// node's.
pub const CORROBORATE: Duration = Duration::from_secs(60);
/// The longest the whole cluster is held over one download.
pub const MAX_TOTAL_HOLD: Duration = Duration::from_secs(300);

/// What an intake node's range came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Its bytes arrived (or it was cut, or there was nothing left).
    Fetched,
    /// The origin asked it to wait; `backed`: the hold believed it (or
    /// the cluster's holds are spent), so it was no word of its own.
    Busy {
        /// Not [`Verdict::OnlyIt`].
        backed: bool,
    },
    /// Any other failure (unreachable, refused, a short body).
    Failed,
}

/// What the intake node does after an [`Answer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Takes its next part.
    Carry,
    /// Waits the origin's wait alone (nobody else heard it), then carries on.
    WaitAlone,
    /// Pauses after its `n`th failure in a row, then carries on.
    Backoff(u32),
    /// Takes no more work, for this reason (kept for the report).
    Retired(String),
}

/// One intake node's standing.
#[derive(Debug, Default, Clone)]
struct Standing {
    /// Failures in a row.
    strikes: u32,
    /// Its last answers: whether each was a "slow down" nobody else heard.
    recent: VecDeque<bool>,
    retired: Option<String>,
    blamed: bool,
}

/// Which part each downloader gets next, and who gets no more.
#[derive(Debug, Clone)]
pub struct Planner {
    /// Parts waiting for a downloader, in the order they are handed out.
    queue: VecDeque<Part>,
    /// Parts cut from an intake node's slow range, and from which node:
    /// that node does not take them again.
    cut_from: HashMap<Part, usize>,
    /// Per file: only this node's own connections fetch it.
    local_only: Vec<bool>,
    intakes: Vec<Standing>,
}

impl Planner {
    /// A download of `files` files whose parts `queue` are still to fetch
    /// (in file order), with `intakes` intake nodes.
    pub fn new(files: usize, queue: impl IntoIterator<Item = Part>, intakes: usize) -> Planner {
        Planner {
            queue: queue.into_iter().collect(),
            cut_from: HashMap::new(),
            local_only: vec![false; files],
            intakes: vec![Standing::default(); intakes],
        }
    }

    /// The next part for one of this node's own connections.
    pub fn next_local(&mut self) -> Option<Part> {
        self.queue.pop_front()
    }

    /// The first queued part intake node `r` may take: of a file `ready`
    /// says it can fetch, not local-only, not cut from it. None for a
    /// node that takes no more work.
    pub fn next_remote(&mut self, r: usize, ready: impl Fn(usize) -> bool) -> Option<Part> {
        if !self.takes_work(r) {
            return None;
        }
        let at = self.queue.iter().position(|&(f, i)| {
            self.cut_from.get(&(f, i)) != Some(&r) && !self.local_only[f] && ready(f)
        })?;
        self.queue.remove(at)
    }

    /// A part taken and not finished (a failure, a short body, a cut, or
    /// picked when the driver could not start it) goes back to the front.
    pub fn put_back(&mut self, part: Part) {
        self.queue.push_front(part);
    }

    /// Intake node `r`'s range of `part` was cut for an idle downloader:
    /// its rest never goes back to `r`.
    pub fn cut(&mut self, part: Part, r: usize) {
        self.cut_from.insert(part, r);
    }

    /// File `f` failed its hash with intake ranges in it: only this node's
    /// own connections fetch it again.
    pub fn local_only(&mut self, f: usize) {
        self.local_only[f] = true;
    }

    /// File `f` (of `parts` parts) is fetched again from scratch.
    pub fn redo(&mut self, f: usize, parts: usize) {
        self.queue.extend((0..parts).map(|i| (f, i)));
    }

    /// Whether intake node `r` still takes work (neither retired nor named).
    pub fn takes_work(&self, r: usize) -> bool {
        let s = &self.intakes[r];
        !s.blamed && s.retired.is_none()
    }

    /// Intake node `r`'s range came to `answer` (`why`: what it said, for
    /// a failure or a "slow down"): what it does next. It retires after
    /// [`INTAKE_STRIKES`] failures in a row, or [`INTAKE_BUSY_STRIKES`]
    /// lone "slow down"s in its last [`INTAKE_BUSY_WINDOW`] answers.
    pub fn answered(&mut self, r: usize, answer: Answer, why: &str) -> Next {
        let s = &mut self.intakes[r];
        let mut note = |alone: bool| {
            if s.recent.len() == INTAKE_BUSY_WINDOW {
                s.recent.pop_front();
            }
            s.recent.push_back(alone);
            (s.recent.iter().filter(|b| **b).count(), s.recent.len())
        };
        let next = match answer {
            Answer::Fetched => {
                note(false);
                s.strikes = 0;
                Next::Carry
            }
            Answer::Busy { backed: true } => {
                note(false);
                Next::Carry
            }
            Answer::Busy { backed: false } => {
                let (alone, of) = note(true);
                if alone >= INTAKE_BUSY_STRIKES {
                    Next::Retired(format!(
                        "{why} ({alone} of its last {of} answers, heard by no other downloader)"
                    ))
                } else {
                    Next::WaitAlone
                }
            }
            Answer::Failed => {
                s.strikes += 1;
                if s.strikes >= INTAKE_STRIKES {
                    Next::Retired(why.to_string())
                } else {
                    Next::Backoff(s.strikes)
                }
            }
        };
        if let Next::Retired(why) = &next {
            s.retired.get_or_insert_with(|| why.clone());
        }
        next
    }

    /// Intake node `r` sent bytes that differ from the origin's: named, no
    /// more work. True the first time.
    pub fn blame(&mut self, r: usize) -> bool {
        !std::mem::replace(&mut self.intakes[r].blamed, true)
    }

    /// Whether intake node `r` was named.
    pub fn blamed(&self, r: usize) -> bool {
        self.intakes[r].blamed
    }

    /// Why intake node `r` retired, if it did.
    pub fn retired(&self, r: usize) -> Option<&str> {
        self.intakes[r].retired.as_deref()
    }

    /// Parts waiting for a downloader.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

/// The part size of a download of `total` bytes by `connections` of this
/// node and `remotes` intake nodes of `intake_connections` each: with no
/// intake node, `part_size`; striped, small enough that every downloader's
/// connections get several parts each (work is handed out on demand, so a
/// fast node takes more and the tail is short), at most `part_size`, at
/// least [`MIN_STRIPED_PART`]. With the streamed pull's `chunk_size`, a
/// whole number of chunks: an intake node keeps the chunks its ranges cover
/// whole, so a part that began mid-chunk would leave two chunks of every
/// part for the swarm to send it back.
pub fn part_size(
    part_size: u64,
    connections: usize,
    remotes: usize,
    intake_connections: usize,
    total: u64,
    chunk_size: Option<u64>,
) -> u64 {
    if remotes == 0 {
        return part_size;
    }
    let workers = (connections + remotes * intake_connections.max(1)).max(1) as u64;
    let part = (total / (workers * 4)).clamp(MIN_STRIPED_PART, part_size.max(MIN_STRIPED_PART));
    match chunk_size.filter(|&c| c > 0) {
        Some(c) => (part / c).max(1) * c,
        None => part,
    }
}

/// An idle downloader, as [`victim`] weighs it.
#[derive(Debug, Clone, Copy)]
pub struct Thief {
    /// Its node's downloader index ([`THIS_NODE`], or `r + 1`).
    pub node: usize,
    /// Its pace over its last part, bytes/s.
    pub rate: f64,
    /// Its node's connections holding a part now.
    pub busy: usize,
    /// Its node's connections.
    pub connections: usize,
}

/// An intake range in flight, as [`victim`] weighs it.
#[derive(Debug, Clone, Copy)]
pub struct InFlight {
    /// The intake node's downloader index (`r + 1`).
    pub node: usize,
    /// Seconds since it began.
    pub secs: f64,
    /// Bytes it brought so far.
    pub got: u64,
    /// Bytes it was asked for.
    pub to_go: u64,
}

/// Work stealing: which of `flights` `thief` cuts, if any. The range that
/// would take longest to finish at its own pace, if that pace is under
/// half the thief's and it has more than a second left (and would finish
/// at least twice as fast with the thief); only while at most a quarter
/// of the thief's node's connections hold a part (before that its link is
/// full: one connection's pace says nothing of the link's, and a cut would
/// only move work onto a link that has no room); never its own node's
/// range (the rest would run on the same link); a thief that has not
/// finished a part yet steals nothing.
pub fn victim(thief: &Thief, flights: &[InFlight]) -> Option<usize> {
    if thief.rate <= 0.0 || thief.busy * 4 > thief.connections {
        return None;
    }
    let rate = thief.rate;
    flights
        .iter()
        .enumerate()
        .filter(|(_, fl)| fl.node != thief.node)
        .filter_map(|(i, fl)| {
            let own = fl.got as f64 / fl.secs.max(1e-3);
            let left = fl.to_go.saturating_sub(fl.got) as f64;
            let eta = if own > 0.0 { left / own } else { f64::INFINITY };
            (fl.secs > 0.5 && own < rate / 2.0 && eta > 1.0 && eta > 2.0 * left / rate)
                .then_some((eta, i))
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, i)| i)
}

/// Who heard the origin's "slow down".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Heard {
    /// This node's own connections: trusted.
    ThisNode,
    /// Intake node `r`: its word.
    Intake(usize),
}

/// What a "slow down" does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Every downloader waits; `newly`: this moved the hold later (the
    /// first to hear it says so, the others stay quiet).
    HoldAll {
        /// Whether the hold moved later.
        newly: bool,
    },
    /// Only the intake node that said it waits: nobody else heard it.
    OnlyIt,
    /// The cluster was held [`MAX_TOTAL_HOLD`] already: no more.
    Spent,
}

/// The origin's "slow down" for a whole download (issue 53): times are
/// durations since the download began, given by the driver. The hold only
/// ever moves later.
#[derive(Debug, Default, Clone)]
pub struct HoldRule {
    until: Option<Duration>,
    /// When each downloader last heard a "slow down".
    heard: HashMap<Heard, Duration>,
    /// How long the cluster was held so far.
    held: Duration,
}

impl HoldRule {
    /// `who` heard the origin ask to wait `wait`, at `now`.
    pub fn heard(&mut self, who: Heard, wait: Duration, now: Duration) -> Verdict {
        self.heard.insert(who, now);
        let backed = who == Heard::ThisNode
            || self
                .heard
                .iter()
                .any(|(w, t)| *w != who && now.saturating_sub(*t) <= CORROBORATE);
        if !backed {
            return Verdict::OnlyIt;
        }
        let from = self.until.filter(|u| *u > now).unwrap_or(now);
        let room = MAX_TOTAL_HOLD.saturating_sub(self.held);
        if room.is_zero() {
            return Verdict::Spent;
        }
        let until = (now + wait).min(from + room);
        if until <= from {
            return Verdict::HoldAll { newly: false };
        }
        self.held += until - from;
        self.until = Some(until);
        Verdict::HoldAll { newly: true }
    }

    /// Until when every downloader is held, if it is at `now`.
    pub fn until(&self, now: Duration) -> Option<Duration> {
        self.until.filter(|u| *u > now)
    }

    /// How long the cluster was held so far.
    pub fn held(&self) -> Duration {
        self.held
    }
}

#[cfg(test)]
mod tests;
