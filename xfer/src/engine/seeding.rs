//! The source's super-seeding ledger: a sans-IO record of which receiver
//! each chunk first went to, deciding whether the source serves a request
//! now or holds it back.
//!
//! The source's upload is the one link every byte of the model must
//! cross, so a chunk it sends twice costs the whole swarm a chunk-time.
//! Receivers ask the source only for their home chunks, but timing makes
//! them ask for others too: an idle receiver takes a chunk of another
//! home, the endgame doubles a request, a rewired feeder asks again for
//! what its predecessor got. Measured on a netns swarm of 8 receivers,
//! those made the source upload 1.24 × S. The ledger enforces the rule
//! whatever the receivers do:
//!
//! - **A chunk goes out once.** The first request for chunk `c` is served,
//!   and `c`'s *first holder* is recorded. A later request from the same
//!   receiver is served too (its copy was lost or cancelled).
//! - **A second copy waits** ([`Verdict::Wait`]) while the first holder is
//!   alive: the copy is on its way through the peers, and a receiver that
//!   gets it there withdraws its request to the source (the driver sees the
//!   stream stopped). The driver holds the request, not the receiver's
//!   transfer: the receiver's other requests go on.
//! - **Unless the holder is lost.** When the first holder dies, leaves or is
//!   found slow ([`SeedLedger::lost`]), every chunk it held first counts as
//!   never sent, and waiting requests for them are served.
//! - **Or when the asker cannot reach the holder.** A receiver that could
//!   not link to a peer at all says so ([`SeedLedger::cut`]); from then on
//!   its requests for chunks that peer holds first are served at once.
//! - **Or after [`SeedLedger::patience`].** A first holder that is alive but
//!   never passes the chunk on (its peers cannot reach it, its disk fails
//!   reads) must not leave the others waiting forever: a request is served
//!   once the chunk's first send is `max(patience, t)` old, `t` being when
//!   that first send was (so a slow transfer, where everything takes long,
//!   does not count as a stuck one: at 20 s a swarm of 16 on 50 Mbit/s
//!   links, 37 s long, had the source send 1.31 × S).
//!
//! Memory: 12 bytes per chunk of the model (30,000 chunks for 119 GB in
//! 4 MiB chunks: 360 KB), whatever the receivers claim.

use std::time::Duration;

/// No receiver.
const NONE: u32 = u32::MAX;

/// Whether the source serves a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it.
    Serve,
    /// Hold it until a receiver is [lost](SeedLedger::lost) or until `until`
    /// (on the caller's clock), then ask again.
    Wait {
        /// When the request may be served whatever happens.
        until: Duration,
    },
}

/// Which receiver each chunk first went to.
#[derive(Debug)]
pub struct SeedLedger {
    first: Vec<u32>,
    /// When each chunk first went out (the caller's clock).
    first_at: Vec<Duration>,
    patience: Duration,
    /// (asker, holder) pairs where the asker cannot reach the holder.
    cut: std::collections::HashSet<(u32, u32)>,
    /// Chunks served once.
    sent: u64,
    /// Second copies served (a holder was lost, or patience ran out).
    again: u64,
}

impl SeedLedger {
    /// How long a second copy waits at least by default: far longer than a
    /// chunk takes to cross a swarm of a thousand receivers at 100 Mbit/s
    /// (a 4 MiB chunk-time is 0.34 s there, the graph about 4 hops deep).
    pub const DEFAULT_PATIENCE: Duration = Duration::from_secs(60);

    /// A ledger for `chunks` chunks (more are added as they are asked for:
    /// a growing draft).
    pub fn new(chunks: u64, patience: Duration) -> SeedLedger {
        let n = usize::try_from(chunks).unwrap_or(0);
        SeedLedger {
            first: vec![NONE; n],
            first_at: vec![Duration::ZERO; n],
            patience,
            cut: std::collections::HashSet::new(),
            sent: 0,
            again: 0,
        }
    }

    /// How long a second copy waits at least for its first holder to pass
    /// it on.
    pub fn patience(&self) -> Duration {
        self.patience
    }

    /// Receiver `to` asks for `chunk` at `now`.
    pub fn ask(&mut self, to: u32, chunk: u64, now: Duration) -> Verdict {
        let Ok(c) = usize::try_from(chunk) else {
            return Verdict::Serve;
        };
        if c >= self.first.len() {
            self.first.resize(c + 1, NONE);
            self.first_at.resize(c + 1, Duration::ZERO);
        }
        match self.first[c] {
            NONE => {
                self.first[c] = to;
                self.first_at[c] = now;
                self.sent += 1;
                Verdict::Serve
            }
            holder if holder == to => Verdict::Serve,
            holder if self.cut.contains(&(to, holder)) => {
                self.again += 1;
                Verdict::Serve
            }
            _ => {
                let first = self.first_at[c];
                let until = first + self.patience.max(first);
                if now >= until {
                    self.again += 1;
                    Verdict::Serve
                } else {
                    Verdict::Wait { until }
                }
            }
        }
    }

    /// The source withdrew `chunks` (a streamed file failed its Hub hash):
    /// the copies it sent of them are void, and the next download's copies
    /// go out as first ones. True if that freed any chunk.
    pub fn forget(&mut self, chunks: std::ops::Range<u64>) -> bool {
        let end = (chunks.end.min(self.first.len() as u64)) as usize;
        let start = (chunks.start as usize).min(end);
        let mut freed = false;
        for f in &mut self.first[start..end] {
            freed |= *f != NONE;
            *f = NONE;
        }
        freed
    }

    /// Receiver `who` died, left or was found slow: what it held first
    /// counts as never sent. True if that freed any chunk (waiting requests
    /// should ask again).
    pub fn lost(&mut self, who: u32) -> bool {
        let mut freed = false;
        for f in self.first.iter_mut().filter(|f| **f == who) {
            *f = NONE;
            freed = true;
        }
        freed
    }

    /// Receiver `asker` cannot reach `holder`: it is served the chunks
    /// `holder` holds first without waiting (now and from now on). True if
    /// the pair is new (waiting requests should ask again). Bounded by the
    /// swarm's pairs, which the caller's members bound.
    pub fn cut(&mut self, asker: u32, holder: u32) -> bool {
        self.cut.insert((asker, holder))
    }

    /// `holder` is back (a restarted or late receiver answers now): the
    /// pairs that could not reach it are whole again.
    pub fn mend(&mut self, holder: u32) {
        self.cut.retain(|&(_, h)| h != holder);
    }

    /// Chunks served for the first time, and second copies served.
    pub fn counts(&self) -> (u64, u64) {
        (self.sent, self.again)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Duration = Duration::from_secs(20);

    fn at(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_chunk_goes_out_once_while_its_first_holder_lives() {
        let mut l = SeedLedger::new(4, P);
        assert_eq!(l.ask(1, 0, at(0)), Verdict::Serve);
        assert_eq!(l.ask(2, 0, at(1)), Verdict::Wait { until: at(20) });
        // The first holder asking again (its copy was lost) is served.
        assert_eq!(l.ask(1, 0, at(2)), Verdict::Serve);
        assert_eq!(l.counts(), (1, 0));
    }

    #[test]
    fn a_withdrawn_chunk_goes_out_again_as_a_first_copy_of_the_next_download() {
        let mut l = SeedLedger::new(4, P);
        l.ask(1, 1, at(0));
        l.ask(1, 2, at(0));
        l.ask(1, 3, at(0));
        // Chunks 1..3 are withdrawn: 1's copies of them are void, so 2's
        // request for the new download's chunk 2 is not held back behind
        // 1 (which holds nothing of it now); chunk 3 still is.
        assert!(l.forget(1..3));
        assert!(!l.forget(1..3), "nothing left to forget");
        assert_eq!(l.ask(2, 2, at(1)), Verdict::Serve);
        assert_eq!(l.ask(2, 3, at(1)), Verdict::Wait { until: at(20) });
        assert!(!l.forget(10..20), "beyond the ledger: nothing");
    }

    #[test]
    fn an_asker_that_cannot_reach_the_holder_is_served_at_once_and_only_it() {
        let mut l = SeedLedger::new(4, P);
        l.ask(1, 0, at(0));
        assert!(l.cut(2, 1));
        assert!(!l.cut(2, 1), "known already");
        assert_eq!(l.ask(2, 0, at(1)), Verdict::Serve);
        assert_eq!(l.ask(3, 0, at(1)), Verdict::Wait { until: at(20) });
        // Later first copies to 1 are served to 2 at once too.
        l.ask(1, 1, at(2));
        assert_eq!(l.ask(2, 1, at(3)), Verdict::Serve);
        assert_eq!(l.counts(), (2, 2));
        // Back (it rejoined): 2 waits for what 1 holds first again.
        l.mend(1);
        l.ask(1, 2, at(4));
        assert_eq!(l.ask(2, 2, at(5)), Verdict::Wait { until: at(24) });
    }

    #[test]
    fn a_lost_holder_frees_its_chunks_and_only_its_own() {
        let mut l = SeedLedger::new(4, P);
        l.ask(1, 0, at(0));
        l.ask(2, 1, at(0));
        assert!(l.lost(1));
        assert!(!l.lost(1), "nothing more to free");
        assert_eq!(l.ask(3, 0, at(1)), Verdict::Serve);
        assert_eq!(l.ask(3, 1, at(1)), Verdict::Wait { until: at(20) });
    }

    #[test]
    fn patience_serves_a_second_copy_after_the_first_send() {
        let mut l = SeedLedger::new(2, P);
        l.ask(1, 0, at(5));
        assert_eq!(l.ask(2, 0, at(24)), Verdict::Wait { until: at(25) });
        assert_eq!(l.ask(2, 0, at(25)), Verdict::Serve);
        assert_eq!(l.counts(), (1, 1));
    }

    #[test]
    fn a_late_first_send_waits_as_long_as_the_transfer_has_run() {
        let mut l = SeedLedger::new(2, P);
        l.ask(1, 0, at(50));
        assert_eq!(l.ask(2, 0, at(60)), Verdict::Wait { until: at(100) });
    }

    #[test]
    fn chunks_beyond_the_start_count_are_tracked_too() {
        let mut l = SeedLedger::new(0, P);
        assert_eq!(l.ask(1, 7, at(0)), Verdict::Serve);
        assert!(matches!(l.ask(2, 7, at(0)), Verdict::Wait { .. }));
    }

    /// Invariant, over random sequences of asks and losses: a second copy
    /// of a chunk is served only to its first holder, after a loss of that
    /// holder, or once patience ran out since the first send.
    #[test]
    fn random_sequences_never_serve_an_early_second_copy() {
        let mut rng = 0x1234_5678_u64;
        let mut next = || {
            rng = crate::engine::scheduler::mix(rng);
            rng
        };
        for _ in 0..200 {
            let mut l = SeedLedger::new(16, P);
            // Our own model: per chunk, (first holder, first send time).
            let mut model: Vec<Option<(u32, Duration)>> = vec![None; 16];
            let mut now = Duration::ZERO;
            for _ in 0..300 {
                now += Duration::from_millis(next() % 400);
                let who = (next() % 6) as u32;
                if next() % 10 == 0 {
                    l.lost(who);
                    for m in model.iter_mut() {
                        if m.is_some_and(|(h, _)| h == who) {
                            *m = None;
                        }
                    }
                    continue;
                }
                let c = next() % 16;
                let v = l.ask(who, c, now);
                let m = &mut model[c as usize];
                let want = match *m {
                    None => {
                        *m = Some((who, now));
                        Verdict::Serve
                    }
                    Some((h, _)) if h == who => Verdict::Serve,
                    Some((_, t)) if now >= t + P.max(t) => Verdict::Serve,
                    Some((_, t)) => Verdict::Wait {
                        until: t + P.max(t),
                    },
                };
                assert_eq!(v, want, "chunk {c} asked by {who} at {now:?}");
            }
        }
    }
}
