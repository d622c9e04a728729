//! Striped intake (issue 36), sans-IO: which downloader fetches which
//! chunks of a repo from the origin (the Hub, or the mirror `HF_ENDPOINT`
//! names), so that every node's link to the outside pulls at once and the
//! origin serves each byte about once. Events in ([`Input`]), actions out
//! ([`Action`]); no clock, socket or file. The coordinator (the sync's
//! source agent) would run one [`Stripes`] per pull; [`sim`] drives it
//! over simulated links for the tests.
//!
//! The model, in the draft's vocabulary ([`xfer_proto::draft`]): chunks
//! are numbered draft-wide, each file's chunks contiguous, and a *span* is
//! a run of chunks of one file.
//!
//! - **Work is handed out on demand**, a span of at most
//!   [`StripeConfig::span_chunks`] at a time, to a downloader that asks
//!   ([`Input::Idle`]); nothing is fixed up front, so a fast downloader
//!   takes more.
//! - **Work stealing.** When nothing is left to hand out, an idle
//!   downloader takes the back half of the largest unfetched rest of a
//!   span in flight (its owner is told where to stop, [`Action::Cut`]);
//!   the tail of a pull is shared out instead of waiting on the slowest.
//! - **A dead downloader** ([`Input::Left`], or no [`Input::Progress`]
//!   for [`StripeConfig::stall_ms`]) gives its span's unfetched rest back
//!   to the queue: what it reported fetched stays fetched.
//! - **Hub manners.** [`Input::Throttled`] (a 429 or a `Retry-After`
//!   anywhere) holds every assignment until the time it names: one wait
//!   for the cluster, not one per node.
//! - **Trust stays with the origin.** A downloader's chunk hashes are
//!   claims. When a file assembled from them fails its Hub hash
//!   ([`Input::Mismatch`]), every span of it is fetched again from the
//!   origin by the verifying node ([`Action::Recheck`]); a span whose
//!   origin bytes hash otherwise than its downloader announced names that
//!   downloader ([`Action::Blame`]), which gets no more work, and the file
//!   is settled on the origin's hashes ([`Action::Settled`]).
//!
//! The invariants (checked by the randomized test below): spans in flight
//! never overlap each other or a fetched chunk, except the few chunks a
//! cut arrives too late for; a blamed downloader is never handed work
//! again; nothing is handed out while throttled; and with one honest
//! downloader alive, every chunk ends fetched and every file settled.
//! Memory: a few words per file, per downloader and per span handed out
//! (at most the number of chunks over `span_chunks`, plus one per steal).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;

use xfer_proto::hash::Hash;

/// A downloader (a node whose agent fetches from the origin).
pub type Downloader = u32;

/// How the work is cut.
#[derive(Clone, Debug)]
pub struct StripeConfig {
    /// Chunks handed out at a time (a span): 8 chunks of 4 MiB is 32 MiB,
    /// a few seconds on one connection of a capped CDN.
    pub span_chunks: u64,
    /// A span in flight is split for an idle downloader only when at
    /// least this many chunks of it are left.
    pub min_steal_chunks: u64,
    /// A downloader that reported nothing for this long has left.
    pub stall_ms: u64,
}

impl Default for StripeConfig {
    fn default() -> Self {
        StripeConfig {
            span_chunks: 8,
            min_steal_chunks: 2,
            stall_ms: 10_000,
        }
    }
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A downloader can take work (it joined, or finished its span).
    Idle(Downloader),
    /// A downloader is gone (killed, its agent unreachable).
    Left(Downloader),
    /// A downloader fetched chunks `chunks` (a prefix of its span, or the
    /// whole) and announces their BLAKE3 hashes, in order.
    Fetched {
        /// Who fetched.
        by: Downloader,
        /// The chunks fetched.
        chunks: Range<u64>,
        /// Their hashes, as the downloader computed them.
        hashes: Vec<Hash>,
    },
    /// A downloader is alive and has fetched its span up to `upto`
    /// (exclusive).
    Progress {
        /// Who.
        by: Downloader,
        /// The first chunk of its span it has not fetched yet.
        upto: u64,
    },
    /// The origin asked the cluster to wait until `until_ms`.
    Throttled {
        /// When assignments may resume.
        until_ms: u64,
    },
    /// Time passed.
    Tick {
        /// Now, in milliseconds.
        now_ms: u64,
    },
    /// File `file`, assembled from the announced chunks, failed its Hub
    /// hash on the verifying node.
    Mismatch {
        /// The file.
        file: u32,
    },
    /// The verifying node fetched `chunks` from the origin again; these
    /// are their hashes.
    Rechecked {
        /// The chunks.
        chunks: Range<u64>,
        /// Their hashes from the origin's bytes.
        hashes: Vec<Hash>,
    },
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// `by` fetches `chunks` from the origin.
    Fetch {
        /// Who.
        by: Downloader,
        /// What.
        chunks: Range<u64>,
    },
    /// `by` stops its span before chunk `at` (the rest went to another).
    Cut {
        /// Who.
        by: Downloader,
        /// The first chunk it no longer fetches.
        at: u64,
    },
    /// The verifying node fetches `chunks` from the origin again.
    Recheck {
        /// What.
        chunks: Range<u64>,
    },
    /// `by` announced hashes for `chunks` that the origin's bytes do not
    /// have: it is named in the report and gets no more work.
    Blame {
        /// Who.
        by: Downloader,
        /// The chunks it got wrong.
        chunks: Range<u64>,
    },
    /// File `file`'s chunks are all fetched: its hashes (announced, or the
    /// origin's after a recheck) are final for this generation; the
    /// verifying node checks it against its Hub hash.
    Settled {
        /// The file.
        file: u32,
        /// Its chunks' hashes, in order.
        hashes: Vec<Hash>,
        /// Whether they are the origin's own (after a recheck): then no
        /// further check can blame a downloader.
        rechecked: bool,
    },
}

/// A span handed out and not yet fetched whole.
#[derive(Clone, Debug)]
struct InFlight {
    chunks: Range<u64>,
    /// The first chunk not reported fetched.
    upto: u64,
    /// When it last reported.
    heard_ms: u64,
}

/// One downloader's standing.
#[derive(Clone, Debug, Default)]
struct Standing {
    blamed: bool,
    gone: bool,
    /// Chunks it fetched that were kept.
    fetched: u64,
}

/// A file's chunks, draft-wide.
#[derive(Clone, Debug)]
struct FileChunks {
    chunks: Range<u64>,
    /// Who fetched each chunk, and the hash announced (None: not yet).
    got: Vec<Option<(Downloader, Hash)>>,
    /// Mid-recheck: the origin's hashes so far (None: not rechecked yet).
    recheck: Option<Vec<Option<Hash>>>,
    settled: bool,
}

/// The planner.
pub struct Stripes {
    cfg: StripeConfig,
    files: Vec<FileChunks>,
    /// Spans not handed out yet, in order (each within one file).
    queue: VecDeque<Range<u64>>,
    flying: BTreeMap<Downloader, InFlight>,
    idle: BTreeSet<Downloader>,
    standing: BTreeMap<Downloader, Standing>,
    now_ms: u64,
    throttled_until: u64,
    /// Chunks fetched more than once (a cut that came too late, a dead
    /// downloader's unreported rest): what the origin served twice.
    pub duplicate_chunks: u64,
}

impl Stripes {
    /// A pull of files of `chunk_counts` chunks each (in the draft's
    /// order), fetched by downloaders that announce themselves with
    /// [`Input::Idle`].
    pub fn new(cfg: StripeConfig, chunk_counts: &[u64]) -> Stripes {
        let mut files = Vec::with_capacity(chunk_counts.len());
        let mut queue = VecDeque::new();
        let mut at = 0;
        for &n in chunk_counts {
            files.push(FileChunks {
                chunks: at..at + n,
                got: vec![None; n as usize],
                recheck: None,
                // An empty file has nothing to fetch.
                settled: n == 0,
            });
            if n > 0 {
                queue.push_back(at..at + n);
            }
            at += n;
        }
        Stripes {
            cfg,
            files,
            queue,
            flying: BTreeMap::new(),
            idle: BTreeSet::new(),
            standing: BTreeMap::new(),
            now_ms: 0,
            throttled_until: 0,
            duplicate_chunks: 0,
        }
    }

    /// Whether every file is settled.
    pub fn is_done(&self) -> bool {
        self.files.iter().all(|f| f.settled)
    }

    /// Chunks each downloader fetched that were kept.
    pub fn fetched_by(&self) -> BTreeMap<Downloader, u64> {
        self.standing.iter().map(|(d, s)| (*d, s.fetched)).collect()
    }

    /// The downloaders blamed so far.
    pub fn blamed(&self) -> Vec<Downloader> {
        self.standing
            .iter()
            .filter(|(_, s)| s.blamed)
            .map(|(d, _)| *d)
            .collect()
    }

    /// The planner's state in one line, for a test that failed.
    pub fn describe(&self) -> String {
        let missing: Vec<u64> = (0..self.files.last().map_or(0, |f| f.chunks.end))
            .filter(|c| !self.is_got(*c))
            .collect();
        let unsettled: Vec<(usize, bool)> = self
            .files
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.settled)
            .map(|(i, f)| (i, f.recheck.is_some()))
            .collect();
        format!(
            "queue {:?}, flying {:?}, idle {:?}, missing {missing:?}, unsettled (file, rechecking) {unsettled:?}, now {} ms",
            self.queue, self.flying, self.idle, self.now_ms
        )
    }

    /// Whether the spans in flight (their unfetched rests) are disjoint.
    pub fn flying_disjoint(&self) -> bool {
        let mut rests: Vec<Range<u64>> = self
            .flying
            .values()
            .map(|f| f.upto..f.chunks.end)
            .filter(|r| !r.is_empty())
            .collect();
        rests.sort_by_key(|r| r.start);
        rests.windows(2).all(|p| p[0].end <= p[1].start)
    }

    /// Applies one event; the actions it calls for, in order.
    pub fn handle(&mut self, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        match input {
            Input::Idle(d) => {
                let s = self.standing.entry(d).or_default();
                s.gone = false;
                if !s.blamed {
                    if let Some(f) = self.flying.remove(&d) {
                        // Asking again without reporting its span whole:
                        // its rest goes back.
                        self.requeue(f.chunks.clone());
                    }
                    self.idle.insert(d);
                }
            }
            Input::Left(d) => self.leave(d),
            Input::Progress { by, upto } => {
                if let Some(f) = self.flying.get_mut(&by) {
                    f.upto = upto.clamp(f.upto, f.chunks.end);
                    f.heard_ms = self.now_ms;
                }
            }
            Input::Fetched { by, chunks, hashes } => self.fetched(by, chunks, hashes, &mut out),
            Input::Throttled { until_ms } => {
                self.throttled_until = self.throttled_until.max(until_ms);
            }
            Input::Tick { now_ms } => {
                self.now_ms = self.now_ms.max(now_ms);
                let stalled: Vec<Downloader> = self
                    .flying
                    .iter()
                    .filter(|(_, f)| self.now_ms.saturating_sub(f.heard_ms) >= self.cfg.stall_ms)
                    .map(|(d, _)| *d)
                    .collect();
                for d in stalled {
                    self.leave(d);
                }
            }
            Input::Mismatch { file } => self.mismatch(file, &mut out),
            Input::Rechecked { chunks, hashes } => self.rechecked(chunks, hashes, &mut out),
        }
        self.assign(&mut out);
        out
    }

    fn leave(&mut self, d: Downloader) {
        self.standing.entry(d).or_default().gone = true;
        self.idle.remove(&d);
        if let Some(f) = self.flying.remove(&d) {
            self.requeue(f.chunks.clone());
        }
    }

    /// Puts the unfetched chunks of `span` back at the queue's front.
    fn requeue(&mut self, span: Range<u64>) {
        let mut runs = Vec::new();
        let mut start = None;
        for c in span.clone() {
            let free = !self.is_got(c);
            match (free, start) {
                (true, None) => start = Some(c),
                (false, Some(s)) => {
                    runs.push(s..c);
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            runs.push(s..span.end);
        }
        for r in runs.into_iter().rev() {
            self.queue.push_front(r);
        }
    }

    fn file_of(&self, chunk: u64) -> usize {
        self.files.partition_point(|f| f.chunks.end <= chunk)
    }

    fn is_got(&self, chunk: u64) -> bool {
        let f = &self.files[self.file_of(chunk)];
        f.got[(chunk - f.chunks.start) as usize].is_some()
    }

    fn fetched(
        &mut self,
        by: Downloader,
        chunks: Range<u64>,
        hashes: Vec<Hash>,
        out: &mut Vec<Action>,
    ) {
        let total = self.files.last().map_or(0, |f| f.chunks.end);
        if chunks.end > total || hashes.len() as u64 != chunks.end.saturating_sub(chunks.start) {
            // A malformed report: treated as the downloader leaving.
            self.leave(by);
            return;
        }
        if self.standing.get(&by).is_some_and(|s| s.blamed) {
            return;
        }
        let mut kept = 0;
        for (c, h) in chunks.clone().zip(hashes) {
            let i = self.file_of(c);
            let f = &mut self.files[i];
            let slot = &mut f.got[(c - f.chunks.start) as usize];
            if slot.is_some() || f.settled || f.recheck.is_some() {
                self.duplicate_chunks += 1;
                continue;
            }
            *slot = Some((by, h));
            kept += 1;
        }
        self.standing.entry(by).or_default().fetched += kept;
        if let Some(f) = self.flying.get_mut(&by) {
            if chunks.end >= f.chunks.end {
                self.flying.remove(&by);
            } else {
                f.upto = f.upto.max(chunks.end);
                f.heard_ms = self.now_ms;
            }
        }
        // The files this completed.
        let (first, last) = (
            self.file_of(chunks.start),
            self.file_of(chunks.end.max(1) - 1),
        );
        for i in first..=last.min(self.files.len().saturating_sub(1)) {
            self.settle_if_whole(i, out);
        }
    }

    fn settle_if_whole(&mut self, i: usize, out: &mut Vec<Action>) {
        let f = &mut self.files[i];
        if f.settled || f.recheck.is_some() || f.got.iter().any(|g| g.is_none()) {
            return;
        }
        f.settled = true;
        out.push(Action::Settled {
            file: i as u32,
            hashes: f.got.iter().map(|g| g.expect("whole").1).collect(),
            rechecked: false,
        });
    }

    fn mismatch(&mut self, file: u32, out: &mut Vec<Action>) {
        let Some(f) = self.files.get_mut(file as usize) else {
            return;
        };
        if !f.settled || f.recheck.is_some() {
            return;
        }
        f.settled = false;
        f.recheck = Some(vec![None; f.got.len()]);
        let (start, end) = (f.chunks.start, f.chunks.end);
        let mut at = start;
        while at < end {
            let to = (at + self.cfg.span_chunks).min(end);
            out.push(Action::Recheck { chunks: at..to });
            at = to;
        }
    }

    fn rechecked(&mut self, chunks: Range<u64>, hashes: Vec<Hash>, out: &mut Vec<Action>) {
        if chunks.is_empty() || hashes.len() as u64 != chunks.end - chunks.start {
            return;
        }
        let i = self.file_of(chunks.start);
        let Some(f) = self.files.get_mut(i) else {
            return;
        };
        if chunks.end > f.chunks.end {
            return;
        }
        let Some(re) = f.recheck.as_mut() else {
            return;
        };
        let mut blamed: BTreeMap<Downloader, Range<u64>> = BTreeMap::new();
        for (c, h) in chunks.zip(hashes) {
            let k = (c - f.chunks.start) as usize;
            re[k] = Some(h);
            if let Some((by, claimed)) = f.got[k] {
                if claimed != h {
                    blamed
                        .entry(by)
                        .and_modify(|r| r.end = c + 1)
                        .or_insert(c..c + 1);
                }
            }
        }
        if re.iter().all(|h| h.is_some()) {
            let hashes: Vec<Hash> = re.iter().map(|h| h.expect("all")).collect();
            f.recheck = None;
            f.settled = true;
            out.push(Action::Settled {
                file: i as u32,
                hashes,
                rechecked: true,
            });
        }
        for (by, chunks) in blamed {
            let s = self.standing.entry(by).or_default();
            if !s.blamed {
                s.blamed = true;
                self.idle.remove(&by);
                if let Some(fl) = self.flying.remove(&by) {
                    self.requeue(fl.chunks.clone());
                }
            }
            out.push(Action::Blame { by, chunks });
        }
    }

    /// Hands work to idle downloaders: the queue's front, else half of the
    /// largest rest in flight.
    fn assign(&mut self, out: &mut Vec<Action>) {
        if self.now_ms < self.throttled_until {
            return;
        }
        while let Some(&d) = self.idle.iter().next() {
            let span = match self.queue.pop_front() {
                Some(mut s) => {
                    // Skip chunks fetched meanwhile (a late report).
                    while s.start < s.end && self.is_got(s.start) {
                        s.start += 1;
                    }
                    if s.is_empty() {
                        continue;
                    }
                    let end = (s.start + self.cfg.span_chunks).min(s.end);
                    if end < s.end {
                        self.queue.push_front(end..s.end);
                    }
                    s.start..end
                }
                None => match self.steal(d, out) {
                    Some(s) => s,
                    None => return,
                },
            };
            self.idle.remove(&d);
            self.flying.insert(
                d,
                InFlight {
                    chunks: span.clone(),
                    upto: span.start,
                    heard_ms: self.now_ms,
                },
            );
            out.push(Action::Fetch {
                by: d,
                chunks: span,
            });
        }
    }

    /// The back half of the largest unfetched rest in flight, cut from its
    /// owner.
    fn steal(&mut self, thief: Downloader, out: &mut Vec<Action>) -> Option<Range<u64>> {
        let (&victim, f) = self
            .flying
            .iter()
            .filter(|(v, _)| **v != thief)
            .max_by_key(|(v, f)| (f.chunks.end - f.upto, std::cmp::Reverse(**v)))?;
        let rest = f.chunks.end - f.upto;
        if rest < self.cfg.min_steal_chunks.max(2) {
            return None;
        }
        let at = f.upto + rest.div_ceil(2);
        let end = f.chunks.end;
        self.flying.get_mut(&victim).expect("found").chunks.end = at;
        out.push(Action::Cut { by: victim, at });
        Some(at..end)
    }
}

pub mod sim;

#[cfg(test)]
mod tests;
