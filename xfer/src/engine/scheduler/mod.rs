//! Which chunk to fetch from which peer: a sans-IO state machine.
//!
//! The scheduler owns no sockets, files or clocks. The runtime feeds it
//! [`Event`]s (a peer joined, a chunk verified, a chunk failed its hash, a
//! peer went away) and drains [`Action`]s (fetch chunk X from peer P, drop
//! peer P, done, stuck). The same machine is driven by the QUIC adapter, by
//! tests, and by the network simulator ([`crate::engine::sim`]), so its decisions are
//! deterministic.
//!
//! Peers are of two kinds: *seeds* join holding every chunk (the source), and
//! *partial* peers (other receivers) announce a bitfield at join and then each
//! chunk they verify (`PeerHas`). Policy:
//!
//! - **Peers before the seed.** A chunk that some partial peer holds is only
//!   ever fetched from partial peers. Requests are driven by peer: the
//!   partial peers are visited in rotation (from a per-receiver place), and
//!   each one with room is asked for the rarest requestable chunk it holds
//!   (fewest holders; chunks are kept in buckets by holder count, so this
//!   costs O(1) per announcement), one request per visit, from a
//!   per-receiver random place among equally rare chunks. So our requests
//!   spread over every peer that has something for us instead of piling
//!   onto the few holders of the rarest chunks. A peer announcing a chunk we
//!   lack is asked for it at once if there is room.
//! - **Super-seeding by partition.** A chunk no partial peer holds is fetched
//!   from a seed, but in a swarm ([`Config::me`] set) only by its *home*
//!   receiver: with the receivers known when the first seed joined sorted
//!   into a roster, chunk `c` is homed at roster entry `c mod len` (balanced),
//!   or, if that receiver is gone, slow or served a corrupt chunk, at the live
//!   one with the highest rendezvous hash of (chunk, receiver). Receivers that
//!   see the same live set agree, so the source uploads each chunk about once.
//!   Home chunks are asked in chunk order, and only a little ahead of the
//!   swarm ([`Config::seed_lead`]): so the seed serves the swarm roughly in
//!   order, a few chunks at a time, and the first copies reach the swarm early
//!   instead of all arriving together late. When a partial peer announces a
//!   chunk we asked the seed for, that request is withdrawn
//!   ([`Action::Cancel`]): the seed's upload is the scarcest there is. A
//!   receiver with nothing in flight, nothing to ask of partial peers and no
//!   home chunk waiting may take one chunk of another home from the seed, so
//!   nothing waits forever on a home that never delivers.
//! - **Assigned homes.** With bounded peer sets a receiver sees only its few
//!   peers, so homes cannot be computed from a roster: the swarm's
//!   coordinator ([`crate::engine::topology`], at the source) tells each
//!   receiver that fetches from the seed which chunks are its own
//!   ([`Event::Homes`]: chunk `c` is home here if slot `c mod of` is ours),
//!   and a receiver never told so has no seed among its peers. All
//!   feeders agree because one coordinator assigns every slot once. Then
//!   the roster is not used, requests to a seed count toward
//!   `max_in_flight` (so the source's transfer keeps its share of a
//!   feeder's download), and the scheduler never reports
//!   [`StuckReason::NoSource`] (the coordinator links new peers when old
//!   ones go) until the coordinator is lost ([`Event::CoordinatorLost`]).
//!   A feeder with nothing at all in flight still takes one chunk of
//!   another home from the seed, as above: so a peer it cannot reach never
//!   leaves it waiting forever (measured in the simulator: the bounded runs
//!   move by at most 0.005 x, the source still uploads 1.00 x S).
//! - **Slow start.** In a swarm, a receiver holding `k` chunks has at most
//!   `k + 1` requests in flight to partial peers: early on, when few chunks
//!   exist, their copies go to many receivers rather than a few.
//! - **Busy peers.** A partial peer that declines a request (`FetchFailed`)
//!   is not asked again until it serves us something, until we have no
//!   request in flight to any partial peer, or until we have verified twice
//!   as many chunks as we have peers, whichever comes first (or, for a chunk
//!   it announces while we have room, at once).
//! - **Slow peers.** A peer the runtime reports slow ([`Event::PeerSlow`])
//!   is asked only for chunks no other peer holds, and is not a home.
//! - **Corrupt chunks.** A partial peer that serves one chunk failing its
//!   check is dropped for the transfer ([`Action::DropPeer`]; it is ignored
//!   if it joins again) and the chunk is fetched elsewhere. A seed is dropped
//!   only after more than [`Config::max_peer_strikes`] corrupt chunks. A
//!   chunk that fails [`Config::max_chunk_failures`] times anywhere stops the
//!   transfer with a reason.
//! - **Windows.** Up to `window` requests per partial peer, `seed_window` per
//!   seed, and `max_in_flight` to partial peers in all (requests to a seed do
//!   not count, so a busy swarm never starves the source of work; with
//!   assigned homes they do, see above).
//! - **Endgame.** When `endgame` or fewer chunks are missing, a chunk already
//!   in flight is also requested from one other holder; the first copy wins
//!   and the other request is cancelled ([`Action::Cancel`]).
//!
//! Without [`Config::me`] and with `tie_break == 0` (a plain push from one
//! source) this reduces to: lowest-numbered missing chunk first, `window` in
//! flight, so files complete (and are placed) in order.

mod choose;
mod interface;
mod peers;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};

use xfer_proto::chunkset::ChunkSet;

pub use interface::{Action, Config, DropReason, Event, Homes, PeerId, StuckReason};

#[derive(Debug)]
struct Peer {
    id: PeerId,
    has: ChunkSet,
    in_flight: u32,
    strikes: u32,
    seed: bool,
    alive: bool,
    /// Reported slow ([`Event::PeerSlow`]).
    slow: bool,
    /// The `Scheduler::epoch` in which it last declined a request (busy), or
    /// 0. It is not asked again while that epoch lasts and we have verified
    /// fewer than `refused_until` chunks, unless it serves us one meanwhile
    /// (or announces a chunk we lack while we have room).
    refused: u64,
    refused_until: u64,
}

/// No peer (an index into `Scheduler::peers`).
const NONE: u32 = u32::MAX;

/// A 64-bit mix (splitmix64's finaliser): tie-break keys and rendezvous
/// hashes here, and the topology's random cycles.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn rendezvous(chunk: u64, peer: PeerId) -> u64 {
    mix(chunk.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ ((peer as u64) << 32 | peer as u64))
}

/// The fetch scheduler for one manifest.
#[derive(Debug)]
pub struct Scheduler {
    cfg: Config,
    held: ChunkSet,
    /// Chunks not held at start, in tie-break order; held ones are skipped.
    order: Vec<u64>,
    /// Per chunk: index of the peer it is in flight from, or `NONE`.
    owner: Vec<u32>,
    /// Per chunk: the endgame duplicate's peer index, or `NONE`.
    dup: Vec<u32>,
    /// Per chunk: live partial peers (indices) that hold it.
    holders: Vec<Vec<u32>>,
    /// Per chunk: its home receiver (only with `cfg.me`).
    home: Vec<PeerId>,
    requests: usize,
    /// Requests in flight to partial peers (bounded by `max_in_flight`).
    peer_requests: usize,
    missing: u64,
    failures: HashMap<u64, u32>,
    peers: Vec<Peer>,
    /// Peer id to index in `peers`: small ids directly, others hashed.
    direct: Vec<u32>,
    index: HashMap<PeerId, usize>,
    /// Requestable chunks (missing, not in flight, held by a partial peer),
    /// bucketed by their number of holders, for rarest-first in O(1).
    buckets: Vec<Vec<u64>>,
    /// Per chunk: its bucket (`NONE` if none) and position there.
    bucket_of: Vec<u32>,
    bucket_pos: Vec<u32>,
    /// Missing chunks homed here (in a swarm, in chunk order; otherwise in
    /// tie-break order); entries before `mine_head` are held.
    mine: Vec<u64>,
    mine_head: usize,
    /// Advances when nothing is in flight to a partial peer: every decline
    /// is forgotten then.
    epoch: u64,
    /// (peer slot, chunk) whose `PeerHas` arrived while a request for the
    /// chunk to that peer was in flight: its "I lack it" answer to that
    /// request is older than the announcement (they travel on different
    /// streams), so it does not unlearn the holder. At most one entry per
    /// request in flight.
    reannounced: HashSet<(u32, u64)>,
    actions: VecDeque<Action>,
    finished: bool,
    /// Whether a seed ever joined; before that, nothing is stuck yet (partial
    /// peers may still be waiting for the source themselves).
    seeded: bool,
    /// Rotates among equally loaded holders.
    turn: u64,
    /// Next peer (index) the peer rotation visits.
    cursor: usize,
    /// Requestable chunks (the total size of `buckets`).
    queued: usize,
    /// Partial peers that served a corrupt chunk: ignored for good.
    banned: Vec<PeerId>,
    /// Chunks held here or by some partial peer, ever, and their number.
    known: ChunkSet,
    seen: u64,
    /// Whether a home chunk waits for the seed lead (see `pick_from_seed`).
    gated: bool,
    /// Chunks verified (from any peer) so far.
    verified: u64,
    /// Seeds connected now.
    live_seeds: u32,
    /// Receivers known when the first seed joined (with `cfg.me`), sorted:
    /// the shared basis of the home partition.
    roster: Vec<PeerId>,
    roster_frozen: bool,
    /// Roster length when last sorted.
    roster_sorted: usize,
    /// Homes assigned by the coordinator ([`Event::Homes`]), if any.
    assigned: Option<Homes>,
    /// [`Action::Complete`] was given (a withdrawal may take it back).
    completed: bool,
    /// With `cfg.growing`: the source said it has every chunk.
    source_complete: bool,
}

impl Scheduler {
    /// A scheduler that already holds `held`.
    pub fn new(held: ChunkSet, cfg: Config) -> Self {
        let len = held.capacity();
        let mut order: Vec<u64> = (0..len).filter(|&n| !held.contains(n)).collect();
        if cfg.tie_break != 0 {
            order.sort_by_key(|&c| mix(c ^ mix(cfg.tie_break)));
        }
        let me = cfg.me.unwrap_or(0);
        let mine = order.clone();
        let (known, seen) = (held.clone(), held.count());
        let mut s = Scheduler {
            cfg,
            missing: order.len() as u64,
            order,
            owner: vec![NONE; len as usize],
            dup: vec![NONE; len as usize],
            holders: vec![Vec::new(); len as usize],
            home: vec![me; len as usize],
            held,
            requests: 0,
            peer_requests: 0,
            failures: HashMap::new(),
            peers: Vec::new(),
            direct: Vec::new(),
            index: HashMap::new(),
            buckets: Vec::new(),
            bucket_of: vec![NONE; len as usize],
            bucket_pos: vec![0; len as usize],
            mine,
            mine_head: 0,
            epoch: 1,
            reannounced: HashSet::new(),
            actions: VecDeque::new(),
            finished: false,
            seeded: false,
            turn: cfg.tie_break,
            cursor: (mix(cfg.tie_break) >> 33) as usize,
            queued: 0,
            banned: Vec::new(),
            known,
            seen,
            gated: false,
            verified: 0,
            live_seeds: 0,
            roster: Vec::new(),
            roster_frozen: false,
            // Never equal to a real length: the first rehome adds `me`.
            roster_sorted: usize::MAX,
            assigned: None,
            completed: false,
            source_complete: false,
        };
        s.settle();
        s
    }

    /// Chunks held so far.
    pub fn held(&self) -> &ChunkSet {
        &self.held
    }

    /// Requests currently in flight (endgame duplicates included).
    pub fn in_flight(&self) -> usize {
        self.requests
    }

    /// Whether `p` declined a request lately (see `Peer::refused`).
    fn refusing(&self, p: &Peer) -> bool {
        p.refused == self.epoch && self.verified < p.refused_until
    }

    /// Feeds one event.
    pub fn handle(&mut self, event: Event) {
        match event {
            Event::PeerJoined { peer, has } => {
                self.join(peer, has);
            }
            Event::PeerHas { peer, chunk } => {
                // A growing seed's new chunk may be asked for at once.
                if !self.peer_has(peer, chunk) {
                    return;
                }
            }
            Event::Withdrawn { first, end } => self.withdraw(first, end),
            Event::SourceComplete => self.source_complete = true,
            Event::Verified { peer, chunk } => {
                self.finish_request(peer, chunk);
                self.verified += 1;
                if let Some(i) = self.slot(peer) {
                    // It is serving us again: its decline is forgotten.
                    self.peers[i].refused = 0;
                }
                if chunk < self.held.capacity() && self.held.insert(chunk) {
                    self.note(chunk);
                    self.missing -= 1;
                    self.unbucket(chunk);
                    let c = chunk as usize;
                    for other in [std::mem::replace(&mut self.owner[c], NONE), {
                        std::mem::replace(&mut self.dup[c], NONE)
                    }] {
                        if other != NONE {
                            self.release(other);
                            let peer = self.peers[other as usize].id;
                            self.actions.push_back(Action::Cancel { peer, chunk });
                        }
                    }
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
                if let Some(i) = self.slot(peer) {
                    if !self.peers[i].alive {
                        self.settle();
                        return;
                    }
                    self.peers[i].strikes += 1;
                    let strikes = self.peers[i].strikes;
                    // A partial peer gets no second chance: what it holds
                    // is not to be trusted, and others hold the same.
                    if !self.peers[i].seed || strikes > self.cfg.max_peer_strikes {
                        if !self.peers[i].seed {
                            self.banned.push(peer);
                        }
                        self.remove_peer(i);
                        self.actions.push_back(Action::DropPeer {
                            peer,
                            reason: DropReason::Corrupt { strikes },
                        });
                    }
                }
            }
            Event::PeerLacks { peer, chunk } => {
                let older = self
                    .slot(peer)
                    .is_some_and(|i| self.reannounced.remove(&(i as u32, chunk)));
                if !older {
                    self.peer_lacks(peer, chunk);
                }
                self.failed_fetch(peer, chunk);
            }
            Event::FetchFailed { peer, chunk } => self.failed_fetch(peer, chunk),
            Event::PeerGone { peer } => {
                if let Some(i) = self.slot(peer) {
                    self.remove_peer(i);
                }
            }
            Event::Homes(homes) => {
                self.assigned = Some(homes);
                self.rehome();
            }
            Event::CoordinatorLost => {
                self.assigned = None;
                self.seeded = true;
            }
            Event::PeerSlow { peer } => {
                if let Some(i) = self.slot(peer) {
                    if !self.peers[i].slow {
                        self.peers[i].slow = true;
                        self.rehome();
                    }
                }
            }
        }
        self.settle();
    }

    /// Next action to carry out, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }
}
