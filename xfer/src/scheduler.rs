//! Which chunk to fetch from which peer: a sans-IO state machine.
//!
//! The scheduler owns no sockets, files or clocks. The runtime feeds it
//! [`Event`]s (a peer joined, a chunk verified, a chunk failed its hash, a
//! peer went away) and drains [`Action`]s (fetch chunk X from peer P, drop
//! peer P, done, stuck). The same machine is driven by the QUIC adapter, by
//! tests, and by the network simulator, so its decisions are deterministic.
//!
//! Policy: keep up to `window` requests in flight per peer; hand each peer the
//! lowest-numbered chunk it has that is neither held nor in flight, so files
//! complete (and are placed) in order. A peer that serves too many corrupt
//! chunks is dropped; a chunk that fails too often anywhere stops the
//! transfer with a reason.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::chunkset::ChunkSet;

/// A peer, as numbered by the runtime.
pub type PeerId = u32;

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Requests in flight per peer.
    pub window: u32,
    /// Corrupt chunks a peer may serve before it is dropped.
    pub max_peer_strikes: u32,
    /// Times one chunk may fail verification before the transfer stops.
    pub max_chunk_failures: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            window: 16,
            max_peer_strikes: 8,
            max_chunk_failures: 3,
        }
    }
}

/// Something that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A peer is connected and holds these chunks.
    PeerJoined { peer: PeerId, has: ChunkSet },
    /// A peer now also holds a chunk.
    PeerHas { peer: PeerId, chunk: u64 },
    /// A fetched chunk passed its check and is stored.
    Verified { peer: PeerId, chunk: u64 },
    /// A fetched chunk failed its BLAKE3 check.
    Corrupt { peer: PeerId, chunk: u64 },
    /// A fetch failed without data (stream reset, peer lacked it).
    FetchFailed { peer: PeerId, chunk: u64 },
    /// A peer disconnected.
    PeerGone { peer: PeerId },
}

/// Something the runtime should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Fetch {
        peer: PeerId,
        chunk: u64,
    },
    DropPeer {
        peer: PeerId,
        reason: DropReason,
    },
    /// Every chunk is held.
    Complete,
    /// No connected peer can supply what is missing, or a chunk keeps failing.
    Stuck(StuckReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Served more corrupt chunks than allowed.
    Corrupt { strikes: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StuckReason {
    /// This chunk failed verification too many times.
    ChunkKeepsFailing { chunk: u64, failures: u32 },
    /// Chunks are missing and no connected peer has them.
    NoSource { missing: u64 },
}

#[derive(Debug)]
struct Peer {
    has: ChunkSet,
    in_flight: u32,
    strikes: u32,
}

/// The fetch scheduler for one manifest.
#[derive(Debug)]
pub struct Scheduler {
    cfg: Config,
    held: ChunkSet,
    /// Needed and not in flight.
    pending: BTreeSet<u64>,
    in_flight: HashMap<u64, PeerId>,
    failures: HashMap<u64, u32>,
    peers: BTreeMap<PeerId, Peer>,
    actions: VecDeque<Action>,
    finished: bool,
    /// Whether any peer ever joined; before that, nothing is stuck yet.
    joined: bool,
}

impl Scheduler {
    /// A scheduler that already holds `held`.
    pub fn new(held: ChunkSet, cfg: Config) -> Self {
        let pending = (0..held.capacity())
            .filter(|&n| !held.contains(n))
            .collect();
        let mut s = Scheduler {
            cfg,
            held,
            pending,
            in_flight: HashMap::new(),
            failures: HashMap::new(),
            peers: BTreeMap::new(),
            actions: VecDeque::new(),
            finished: false,
            joined: false,
        };
        s.settle();
        s
    }

    /// Chunks held so far.
    pub fn held(&self) -> &ChunkSet {
        &self.held
    }

    /// Requests currently in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Feeds one event.
    pub fn handle(&mut self, event: Event) {
        match event {
            Event::PeerJoined { peer, has } => {
                self.joined = true;
                self.peers.insert(
                    peer,
                    Peer {
                        has,
                        in_flight: 0,
                        strikes: 0,
                    },
                );
            }
            Event::PeerHas { peer, chunk } => {
                if let Some(p) = self.peers.get_mut(&peer) {
                    if chunk < p.has.capacity() {
                        p.has.insert(chunk);
                    }
                }
            }
            Event::Verified { peer, chunk } => {
                self.finish_request(peer, chunk);
                if chunk < self.held.capacity() {
                    self.held.insert(chunk);
                    self.pending.remove(&chunk);
                }
            }
            Event::Corrupt { peer, chunk } => {
                self.finish_request(peer, chunk);
                let failures = self.failures.entry(chunk).or_insert(0);
                *failures += 1;
                if *failures >= self.cfg.max_chunk_failures {
                    let failures = *failures;
                    self.stop(StuckReason::ChunkKeepsFailing { chunk, failures });
                    return;
                }
                self.requeue(chunk);
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.strikes += 1;
                    if p.strikes > self.cfg.max_peer_strikes {
                        let strikes = p.strikes;
                        self.remove_peer(peer);
                        self.actions.push_back(Action::DropPeer {
                            peer,
                            reason: DropReason::Corrupt { strikes },
                        });
                    }
                }
            }
            Event::FetchFailed { peer, chunk } => {
                self.finish_request(peer, chunk);
                self.requeue(chunk);
            }
            Event::PeerGone { peer } => self.remove_peer(peer),
        }
        self.settle();
    }

    /// Next action to carry out, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn finish_request(&mut self, peer: PeerId, chunk: u64) {
        if self.in_flight.get(&chunk) == Some(&peer) {
            self.in_flight.remove(&chunk);
            if let Some(p) = self.peers.get_mut(&peer) {
                p.in_flight -= 1;
            }
        }
    }

    fn requeue(&mut self, chunk: u64) {
        if chunk < self.held.capacity()
            && !self.held.contains(chunk)
            && !self.in_flight.contains_key(&chunk)
        {
            self.pending.insert(chunk);
        }
    }

    fn remove_peer(&mut self, peer: PeerId) {
        self.peers.remove(&peer);
        let lost: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, p)| **p == peer)
            .map(|(c, _)| *c)
            .collect();
        for c in lost {
            self.in_flight.remove(&c);
            self.requeue(c);
        }
    }

    fn stop(&mut self, reason: StuckReason) {
        if !self.finished {
            self.finished = true;
            self.actions.push_back(Action::Stuck(reason));
        }
    }

    /// Hands out requests while peers have room, and reports the end.
    fn settle(&mut self) {
        if self.finished {
            return;
        }
        if self.held.is_complete() {
            self.finished = true;
            self.actions.push_back(Action::Complete);
            return;
        }
        let ids: Vec<PeerId> = self.peers.keys().copied().collect();
        for id in ids {
            loop {
                let peer = &self.peers[&id];
                if peer.in_flight >= self.cfg.window {
                    break;
                }
                let Some(chunk) = self.pending.iter().copied().find(|&c| peer.has.contains(c))
                else {
                    break;
                };
                self.pending.remove(&chunk);
                self.in_flight.insert(chunk, id);
                self.peers.get_mut(&id).unwrap().in_flight += 1;
                self.actions.push_back(Action::Fetch { peer: id, chunk });
            }
        }
        if self.joined && self.in_flight.is_empty() && !self.pending.is_empty() {
            let missing = self.pending.len() as u64;
            self.stop(StuckReason::NoSource { missing });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(s: &mut Scheduler) -> Vec<Action> {
        std::iter::from_fn(|| s.poll_action()).collect()
    }

    fn cfg(window: u32) -> Config {
        Config {
            window,
            ..Config::default()
        }
    }

    #[test]
    fn fetches_only_what_is_missing_in_order_within_the_window() {
        let mut held = ChunkSet::empty(6);
        held.insert(1);
        let mut s = Scheduler::new(held, cfg(2));
        assert_eq!(drain(&mut s), [], "nothing is stuck before a peer joins");
        s.handle(Event::PeerJoined {
            peer: 7,
            has: ChunkSet::full(6),
        });
        assert_eq!(
            drain(&mut s),
            [
                Action::Fetch { peer: 7, chunk: 0 },
                Action::Fetch { peer: 7, chunk: 2 }
            ]
        );
        s.handle(Event::Verified { peer: 7, chunk: 0 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 7, chunk: 3 }]);
        for c in [2, 3] {
            s.handle(Event::Verified { peer: 7, chunk: c });
        }
        let a = drain(&mut s);
        assert_eq!(
            a,
            [
                Action::Fetch { peer: 7, chunk: 4 },
                Action::Fetch { peer: 7, chunk: 5 }
            ]
        );
        s.handle(Event::Verified { peer: 7, chunk: 4 });
        s.handle(Event::Verified { peer: 7, chunk: 5 });
        assert_eq!(drain(&mut s), [Action::Complete]);
    }

    fn started(len: u64, window: u32) -> Scheduler {
        Scheduler::new(ChunkSet::empty(len), cfg(window))
    }

    #[test]
    fn corrupt_chunks_are_refetched_then_give_up() {
        let mut s = started(2, 1);
        s.handle(Event::PeerJoined {
            peer: 1,
            has: ChunkSet::full(2),
        });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 0 }]);
        s.handle(Event::Corrupt { peer: 1, chunk: 0 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 0 }]);
        s.handle(Event::Corrupt { peer: 1, chunk: 0 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 0 }]);
        s.handle(Event::Corrupt { peer: 1, chunk: 0 });
        assert_eq!(
            drain(&mut s),
            [Action::Stuck(StuckReason::ChunkKeepsFailing {
                chunk: 0,
                failures: 3
            })]
        );
    }

    #[test]
    fn a_lying_peer_is_dropped_and_others_take_over() {
        let mut s = Scheduler::new(
            ChunkSet::empty(40),
            Config {
                window: 4,
                max_peer_strikes: 2,
                max_chunk_failures: 10,
            },
        );
        s.handle(Event::PeerJoined {
            peer: 1,
            has: ChunkSet::full(40),
        });
        s.handle(Event::PeerJoined {
            peer: 2,
            has: ChunkSet::full(40),
        });
        let mut dropped = false;
        let mut rounds = 0;
        while !s.held.is_complete() {
            rounds += 1;
            assert!(rounds < 1000);
            let Some(a) = s.poll_action() else {
                panic!("no action while incomplete")
            };
            match a {
                Action::Fetch { peer: 1, chunk } => s.handle(Event::Corrupt { peer: 1, chunk }),
                Action::Fetch { peer, chunk } => s.handle(Event::Verified { peer, chunk }),
                Action::DropPeer { peer: 1, .. } => dropped = true,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(dropped);
        assert!(!s.peers.contains_key(&1));
    }

    #[test]
    fn a_vanished_peer_returns_its_requests() {
        let mut s = started(3, 3);
        s.handle(Event::PeerJoined {
            peer: 1,
            has: ChunkSet::full(3),
        });
        assert_eq!(drain(&mut s).len(), 3);
        s.handle(Event::PeerGone { peer: 1 });
        assert_eq!(
            drain(&mut s),
            [Action::Stuck(StuckReason::NoSource { missing: 3 })]
        );
    }

    #[test]
    fn nothing_to_do_is_complete_at_once() {
        let mut s = Scheduler::new(ChunkSet::full(5), Config::default());
        assert_eq!(drain(&mut s), [Action::Complete]);
    }
}
