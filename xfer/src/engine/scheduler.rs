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

use std::collections::{HashMap, VecDeque};

use xfer_proto::chunkset::ChunkSet;

/// A peer, as numbered by the runtime.
pub type PeerId = u32;

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Requests in flight per partial peer (and per seed unless `seed_window`).
    pub window: u32,
    /// Corrupt chunks a seed may serve before it is dropped (a partial peer
    /// is dropped at its first).
    pub max_peer_strikes: u32,
    /// Times one chunk may fail verification before the transfer stops.
    pub max_chunk_failures: u32,
    /// Requests in flight to one seed; 0 means `window`.
    pub seed_window: u32,
    /// Requests in flight across all peers; 0 means no limit but the windows.
    pub max_in_flight: u32,
    /// This receiver's own id in a swarm. When set, chunks nobody else holds
    /// are taken from a seed only by their home receiver (see module docs).
    pub me: Option<PeerId>,
    /// Seed of the per-receiver tie-break order among equally rare chunks;
    /// 0 keeps chunk order.
    pub tie_break: u64,
    /// Missing-chunk count at or below which in-flight chunks are also
    /// requested from a second holder; 0 disables the endgame.
    pub endgame: u32,
    /// In a swarm, how far ahead of the chunks already in the swarm a home
    /// chunk may be asked of the seed (chunk `c` only once `c < present +
    /// seed_lead`, and at first `c < 2 * present + 1`), so the seed serves
    /// the swarm in order, a few chunks at a time, and the first copies
    /// reach the swarm early; 0: no limit. Relies on `PeerHas` announcements
    /// reaching us: without them a receiver may wait for a swarm it never
    /// hears from.
    pub seed_lead: u32,
    /// The source's peer id, when the runtime knows it: then only the
    /// source is a seed, and a peer that joins holding everything (a
    /// receiver that finished) is asked like any partial peer, not
    /// rationed by homes. `None`: every peer that joins complete is a seed.
    pub source: Option<PeerId>,
    /// The source is still getting its chunks (a pull streaming to the
    /// swarm): it joins as a seed with the chunks it has (it is `source`,
    /// which must be set), announces the rest with `PeerHas` as it gets
    /// them, and may withdraw some ([`Event::Withdrawn`]). Nothing is
    /// stuck for want of a source until [`Event::SourceComplete`], and the
    /// seed lead does not apply (the source's chunks do not come in order).
    pub growing: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            window: 16,
            max_peer_strikes: 8,
            max_chunk_failures: 3,
            seed_window: 0,
            max_in_flight: 0,
            me: None,
            tie_break: 0,
            endgame: 0,
            seed_lead: 16,
            source: None,
            growing: false,
        }
    }
}

/// The chunks a receiver fetching from a seed is home to, as the swarm's
/// coordinator assigned them ([`crate::engine::topology`]): chunk `c` is
/// in slot `c mod of`, and the receiver owns `slots`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Homes {
    /// Slots in all.
    pub of: u32,
    /// The slots owned, sorted.
    pub slots: Vec<u32>,
}

impl Homes {
    /// Whether chunk `c` is homed here.
    pub fn contains(&self, chunk: u64) -> bool {
        self.of > 0 && self.slots.contains(&((chunk % u64::from(self.of)) as u32))
    }
}

/// Something that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A peer is connected and holds these chunks. A peer holding every chunk
    /// is a seed.
    PeerJoined {
        /// The peer.
        peer: PeerId,
        /// The chunks it holds.
        has: ChunkSet,
    },
    /// A peer now also holds a chunk.
    PeerHas {
        /// The peer.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// A fetched chunk passed its check and is stored.
    Verified {
        /// The peer it came from.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// A fetched chunk failed its BLAKE3 check.
    Corrupt {
        /// The peer it came from.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// A fetch failed without data (stream reset, peer lacked it).
    FetchFailed {
        /// The peer asked.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// A peer disconnected.
    PeerGone {
        /// The peer.
        peer: PeerId,
    },
    /// The runtime measured this peer serving far slower than the others:
    /// it is asked only for chunks no other peer can serve, and is no longer
    /// a home for chunks fetched from the seed.
    PeerSlow {
        /// The peer.
        peer: PeerId,
    },
    /// The swarm's coordinator assigned this receiver's home chunks (empty:
    /// it no longer fetches from the seed). From then on homes are only
    /// these, never computed from the roster, and the scheduler never
    /// reports [`StuckReason::NoSource`]: the coordinator decides who
    /// serves whom and may link new peers at any time.
    Homes(Homes),
    /// The growing source withdrew chunks `first..end` (the download they
    /// came from failed its Hub hash): whoever held them no longer does,
    /// and they are fetched again once the source announces them anew.
    Withdrawn {
        /// First chunk withdrawn.
        first: u64,
        /// One past the last chunk withdrawn.
        end: u64,
    },
    /// The growing source has every chunk: from now on a missing chunk
    /// nobody can serve is stuck, as in any transfer.
    SourceComplete,
    /// The coordinator (the source) is gone: no new links or homes will
    /// come. From then on the transfer is stuck ([`StuckReason::NoSource`])
    /// once nothing is in flight and nothing can be asked of any peer.
    CoordinatorLost,
}

/// Something the runtime should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Fetch a chunk from a peer.
    Fetch {
        /// The peer to ask.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// An earlier `Fetch` of this chunk from this peer is no longer needed
    /// (another copy arrived first, or a seed was asked for a chunk a partial
    /// peer now holds). The runtime may abort it; if it still completes, its
    /// result is ignored.
    Cancel {
        /// The peer asked.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// Disconnect a peer and ask it for nothing more.
    DropPeer {
        /// The peer.
        peer: PeerId,
        /// Why.
        reason: DropReason,
    },
    /// Every chunk is held.
    Complete,
    /// No connected peer can supply what is missing, or a chunk keeps failing.
    Stuck(StuckReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// Why a peer was dropped.
pub enum DropReason {
    /// Served more corrupt chunks than allowed (a partial peer: one).
    Corrupt {
        /// Corrupt chunks it served.
        strikes: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// Why a transfer cannot go on.
pub enum StuckReason {
    /// This chunk failed verification too many times.
    ChunkKeepsFailing {
        /// The chunk's number.
        chunk: u64,
        /// How many times it failed.
        failures: u32,
    },
    /// Chunks are missing and no connected peer has them.
    NoSource {
        /// How many chunks are missing.
        missing: u64,
    },
}

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
            Event::FetchFailed { peer, chunk } => {
                self.finish_request(peer, chunk);
                // A partial peer that declined (busy) is left alone for a
                // while (see `Peer::refused`).
                if let Some(i) = self.slot(peer) {
                    if !self.peers[i].seed {
                        self.peers[i].refused = self.epoch;
                        self.peers[i].refused_until = self.verified + 2 * self.peers.len() as u64;
                    }
                }
            }
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

    fn join(&mut self, peer: PeerId, has: ChunkSet) {
        if has.capacity() != self.held.capacity() || self.banned.contains(&peer) {
            return;
        }
        if let Some(i) = self.slot(peer) {
            if self.peers[i].alive {
                self.remove_peer(i);
            }
        }
        let seed = if self.cfg.growing {
            self.cfg.source == Some(peer)
        } else {
            has.is_complete() && self.cfg.source.is_none_or(|s| s == peer)
        };
        self.seeded |= seed;
        self.live_seeds += seed as u32;
        let i = match self.slot(peer) {
            Some(i) => i,
            None => {
                self.set_slot(peer, self.peers.len());
                self.peers.push(Peer {
                    id: peer,
                    refused: 0,
                    refused_until: 0,
                    has: ChunkSet::empty(0),
                    in_flight: 0,
                    strikes: 0,
                    seed,
                    alive: false,
                    slow: false,
                });
                self.peers.len() - 1
            }
        };
        if !seed {
            for c in has.iter() {
                self.holders[c as usize].push(i as u32);
                self.rebucket(c);
                self.note(c);
            }
        }
        self.peers[i] = Peer {
            id: peer,
            refused: 0,
            refused_until: 0,
            has,
            in_flight: 0,
            strikes: 0,
            seed,
            alive: true,
            slow: false,
        };
        if self.cfg.me.is_some() {
            if !seed && !self.roster_frozen {
                self.roster.push(peer);
            }
            if seed {
                self.roster_frozen = true;
            }
            if self.roster_frozen {
                self.rehome();
            }
        }
    }

    /// Whether receiver `id` may be a home: me, or a live partial peer that
    /// never served a corrupt chunk.
    fn homeable(&self, id: PeerId) -> bool {
        Some(id) == self.cfg.me
            || self.slot(id).is_some_and(|i| {
                let p = &self.peers[i];
                p.alive && !p.seed && p.strikes == 0 && !p.slow
            })
    }

    /// Recomputes every chunk's home: its roster receiver (chunk number modulo
    /// the roster, so homes are balanced) while that one is homeable, else
    /// the homeable receiver with the highest rendezvous hash.
    fn rehome(&mut self) {
        if let Some(homes) = &self.assigned {
            let held = &self.held;
            self.mine_head = 0;
            self.mine = self
                .order
                .iter()
                .copied()
                .filter(|&c| homes.contains(c) && !held.contains(c))
                .collect();
            self.mine.sort_unstable();
            return;
        }
        let Some(me) = self.cfg.me else { return };
        if !self.roster_frozen {
            return;
        }
        if self.roster.len() != self.roster_sorted {
            self.roster.push(me);
            self.roster.sort_unstable();
            self.roster.dedup();
            self.roster_sorted = self.roster.len();
        }
        let ok: Vec<bool> = self.roster.iter().map(|&r| self.homeable(r)).collect();
        let mut live: Option<Vec<PeerId>> = None;
        let r = self.roster.len();
        for c in 0..self.home.len() {
            let k = c % r;
            if ok[k] {
                self.home[c] = self.roster[k];
                continue;
            }
            let live = live.get_or_insert_with(|| {
                std::iter::once(me)
                    .chain(
                        self.peers
                            .iter()
                            .filter(|p| p.alive && !p.seed && p.strikes == 0 && !p.slow)
                            .map(|p| p.id),
                    )
                    .collect()
            });
            self.home[c] = *live
                .iter()
                .max_by_key(|&&h| rendezvous(c as u64, h))
                .unwrap_or(&me);
        }
        let (home, held) = (&self.home, &self.held);
        self.mine_head = 0;
        self.mine = self
            .order
            .iter()
            .copied()
            .filter(|&c| home[c as usize] == me && !held.contains(c))
            .collect();
        // The seed serves the swarm in chunk order (see `pick_from_seed`).
        self.mine.sort_unstable();
    }

    /// Counts a chunk as present in the swarm.
    fn note(&mut self, chunk: u64) -> bool {
        let new = self.known.insert(chunk);
        self.seen += new as u64;
        new
    }

    /// Whether the chunk came from a live seed (which a settle may use).
    fn peer_has(&mut self, peer: PeerId, chunk: u64) -> bool {
        let Some(i) = self.slot(peer) else {
            return false;
        };
        let p = &mut self.peers[i];
        if !p.alive || chunk >= p.has.capacity() || !p.has.insert(chunk) || p.seed {
            return p.alive && p.seed;
        }
        let c = chunk as usize;
        self.holders[c].push(i as u32);
        if self.note(chunk) && self.gated && !self.finished {
            // The seed lead moved on: maybe a home chunk may be asked now.
            while let Some((c, p)) = self.pick_from_seed(false) {
                self.request(c, p);
            }
        }
        // A partial peer can serve what we asked the seed for: the seed's
        // time is the scarcest there is, so that request is withdrawn.
        let o = self.owner[c];
        if o != NONE && self.dup[c] == NONE && self.peers[o as usize].seed {
            self.owner[c] = NONE;
            self.release(o);
            let seed = self.peers[o as usize].id;
            self.actions.push_back(Action::Cancel { peer: seed, chunk });
        }
        self.rebucket(chunk);
        // Fast path: only this chunk became newly available, and only from
        // this peer; take it if there is room, without a full pass.
        if self.finished
            || self.held.contains(chunk)
            || self.owner[c] != NONE
            || !self.room()
            || self.peers[i].in_flight >= self.cfg.window
        {
            return false;
        }
        self.request(chunk, i as u32);
        false
    }

    /// The growing source withdrew `first..end`: nobody holds them now.
    fn withdraw(&mut self, first: u64, end: u64) {
        let end = end.min(self.held.capacity());
        for c in first..end {
            if self.held.contains(c) {
                self.held.remove(c);
                self.missing += 1;
                self.order.push(c);
            }
            for p in &mut self.peers {
                p.has.remove(c);
            }
            self.holders[c as usize].clear();
            self.failures.remove(&c);
            self.rebucket(c);
        }
        if self.completed && self.missing > 0 {
            self.completed = false;
            self.finished = false;
        }
        // Home chunks before the head were skipped as held: start over.
        if self.assigned.is_some() || self.roster_frozen {
            self.rehome();
        } else {
            let held = &self.held;
            self.mine = self
                .order
                .iter()
                .copied()
                .filter(|&c| !held.contains(c))
                .collect();
            self.mine_head = 0;
        }
    }

    /// Whether a live seed can serve `chunk` now (a growing one may not).
    fn seed_has(&self, chunk: u64) -> bool {
        !self.cfg.growing
            || self
                .peers
                .iter()
                .any(|p| p.alive && p.seed && p.has.contains(chunk))
    }

    fn slot(&self, id: PeerId) -> Option<usize> {
        match self.direct.get(id as usize) {
            Some(&i) => (i != NONE).then_some(i as usize),
            None => self.index.get(&id).copied(),
        }
    }

    fn set_slot(&mut self, id: PeerId, i: usize) {
        if id < 1 << 16 {
            if self.direct.len() <= id as usize {
                self.direct.resize(id as usize + 1, NONE);
            }
            self.direct[id as usize] = i as u32;
        } else {
            self.index.insert(id, i);
        }
    }

    fn unbucket(&mut self, chunk: u64) {
        let c = chunk as usize;
        let b = self.bucket_of[c];
        if b == NONE {
            return;
        }
        let list = &mut self.buckets[b as usize];
        let pos = self.bucket_pos[c] as usize;
        list.swap_remove(pos);
        self.queued -= 1;
        if let Some(&moved) = list.get(pos) {
            self.bucket_pos[moved as usize] = pos as u32;
        }
        self.bucket_of[c] = NONE;
    }

    /// Files `chunk` under its current holder count if it is requestable.
    fn rebucket(&mut self, chunk: u64) {
        self.unbucket(chunk);
        let c = chunk as usize;
        let h = self.holders[c].len();
        if h == 0 || self.owner[c] != NONE || self.held.contains(chunk) {
            return;
        }
        if self.buckets.len() <= h {
            self.buckets.resize_with(h + 1, Vec::new);
        }
        self.bucket_of[c] = h as u32;
        self.bucket_pos[c] = self.buckets[h].len() as u32;
        self.buckets[h].push(chunk);
        self.queued += 1;
    }

    fn room(&self) -> bool {
        // Slow start in a swarm: one request more than the chunks held.
        let held = self.held.capacity() - self.missing;
        if self.cfg.me.is_some() && self.peer_requests as u64 > held {
            return false;
        }
        // With assigned homes, requests to a seed take their place in the
        // limit too: the source's transfer to a feeder then gets at least
        // its share of the feeder's download (see the module docs).
        let seed_requests = if self.assigned.is_some() {
            self.requests - self.peer_requests
        } else {
            0
        };
        self.cfg.max_in_flight == 0
            || self.peer_requests + seed_requests < self.cfg.max_in_flight as usize
    }

    fn window(&self, p: &Peer) -> u32 {
        if p.seed && self.cfg.seed_window > 0 {
            self.cfg.seed_window
        } else {
            self.cfg.window
        }
    }

    fn request(&mut self, chunk: u64, peer: u32) {
        let c = chunk as usize;
        if self.owner[c] == NONE {
            self.owner[c] = peer;
            self.unbucket(chunk);
        } else {
            self.dup[c] = peer;
        }
        self.requests += 1;
        let p = &mut self.peers[peer as usize];
        p.in_flight += 1;
        if !p.seed {
            self.peer_requests += 1;
        }
        self.actions.push_back(Action::Fetch { peer: p.id, chunk });
    }

    fn release(&mut self, peer: u32) {
        self.requests -= 1;
        let p = &mut self.peers[peer as usize];
        p.in_flight -= 1;
        if !p.seed {
            self.peer_requests -= 1;
        }
    }

    /// Ends the request for `chunk` from `peer`, if there is one.
    fn finish_request(&mut self, peer: PeerId, chunk: u64) {
        let Some(i) = self.slot(peer) else {
            return;
        };
        let i = i as u32;
        let Some(c) = usize::try_from(chunk)
            .ok()
            .filter(|&c| c < self.owner.len())
        else {
            return;
        };
        if self.owner[c] == i {
            self.owner[c] = std::mem::replace(&mut self.dup[c], NONE);
            self.release(i);
        } else if self.dup[c] == i {
            self.dup[c] = NONE;
            self.release(i);
        }
        self.rebucket(chunk);
    }

    fn remove_peer(&mut self, i: usize) {
        let p = &mut self.peers[i];
        if !p.alive {
            return;
        }
        p.alive = false;
        let seed = p.seed;
        self.live_seeds -= seed as u32;
        if !seed {
            let has = std::mem::replace(&mut self.peers[i].has, ChunkSet::empty(0));
            for c in has.iter() {
                self.holders[c as usize].retain(|&h| h as usize != i);
                self.rebucket(c);
            }
            self.peers[i].has = has;
        }
        let i = i as u32;
        for c in 0..self.owner.len() {
            if self.dup[c] == i {
                self.dup[c] = NONE;
                self.release(i);
            }
            if self.owner[c] == i {
                self.owner[c] = std::mem::replace(&mut self.dup[c], NONE);
                self.release(i);
                self.rebucket(c as u64);
            }
        }
        if !seed {
            self.rehome();
        }
    }

    fn stop(&mut self, reason: StuckReason) {
        if !self.finished {
            self.finished = true;
            self.actions.push_back(Action::Stuck(reason));
        }
    }

    /// Among live seeds (or partial peers) other than `not` that hold `chunk`
    /// and have room, the one with the fewest of our requests (rotating among
    /// equals).
    fn holder(&mut self, chunk: u64, seeds: bool, not: u32) -> Option<u32> {
        self.turn = self.turn.wrapping_add(0x9e37_79b9);
        let list = if seeds {
            None
        } else {
            Some(&self.holders[chunk as usize])
        };
        let n = list.map_or(self.peers.len(), |l| l.len());
        if n == 0 {
            return None;
        }
        let start = (mix(self.turn) % n as u64) as usize;
        let mut best: Option<(u32, u32)> = None;
        for k in 0..n {
            let i = match list {
                Some(l) => l[(start + k) % n] as usize,
                None => (start + k) % n,
            };
            let p = &self.peers[i];
            if !p.alive
                || p.seed != seeds
                || i as u32 == not
                || p.in_flight >= self.window(p)
                || self.refusing(p)
                || (seeds && !p.has.contains(chunk))
            {
                continue;
            }
            // Slow peers rank after every other peer with room.
            let load = p.in_flight + if p.slow { 1 << 16 } else { 0 };
            if best.is_none_or(|(_, f)| load < f) {
                best = Some((i as u32, load));
                if load == 0 {
                    break;
                }
            }
        }
        best.map(|(i, _)| i)
    }

    /// Requests chunks from partial peers while there is room: visits the
    /// peers in rotation (from a per-receiver place) and asks each one that
    /// has room and has not declined us for the rarest requestable chunk it
    /// holds, one request per visit, so our requests spread over every peer
    /// with something for us instead of piling onto the few holders of the
    /// rarest chunks. Slow peers are visited last, and only for chunks no
    /// other peer holds. Unless `full`, gives up after a bounded number of
    /// fruitless visits (the rotation resumes there next time).
    fn fill_from_peers(&mut self, full: bool) {
        let n = self.peers.len();
        let patience = if full { n } else { n.min(64) };
        for pass in 0..2 {
            let mut idle = 0;
            while self.queued > 0 && self.room() && idle < patience {
                let i = self.cursor % n;
                self.cursor = self.cursor.wrapping_add(1);
                let p = &self.peers[i];
                if !p.alive
                    || p.seed
                    || p.in_flight >= self.window(p)
                    || (pass == 0 && p.slow)
                    || self.refusing(p)
                {
                    idle += 1;
                    continue;
                }
                match self.best_from(i) {
                    Some(c) => {
                        self.request(c, i as u32);
                        idle = 0;
                    }
                    None => idle += 1,
                }
            }
        }
    }

    /// The rarest requestable chunk peer `i` holds, from a random place among
    /// equally rare ones; for a slow peer, only one no other peer holds.
    fn best_from(&mut self, i: usize) -> Option<u64> {
        let ok = |s: &Self, c: u64| {
            let p = &s.peers[i];
            p.has.contains(c)
                && (!p.slow
                    || s.holders[c as usize]
                        .iter()
                        .all(|&h| s.peers[h as usize].slow))
        };
        // The rarest few hundred first: a peer usually holds some of them.
        let mut budget = 256usize;
        for b in 1..self.buckets.len() {
            let len = self.buckets[b].len();
            if len == 0 {
                continue;
            }
            self.turn = mix(self.turn);
            let start = (self.turn % len as u64) as usize;
            for k in 0..len.min(budget) {
                let c = self.buckets[b][(start + k) % len];
                if ok(self, c) {
                    return Some(c);
                }
            }
            budget -= len.min(budget);
            if budget == 0 {
                break;
            }
        }
        if budget > 0 {
            return None;
        }
        // Otherwise the rarest of what it holds.
        let mut best: Option<(u32, u64)> = None;
        for c in self.peers[i].has.iter() {
            let b = self.bucket_of[c as usize];
            if b != NONE && best.is_none_or(|(f, _)| b < f) && ok(self, c) {
                best = Some((b, c));
            }
        }
        best.map(|(_, c)| c)
    }

    /// The first missing chunk, not in flight, held by no partial peer and
    /// homed here (or any such chunk, in tie-break order, if `any`), from a
    /// seed. In a swarm, home chunk `c` waits (`gated`) until
    /// `c < present + min(seed_lead, present + 1)`, where `present` counts
    /// the chunks held here or by some partial peer.
    fn pick_from_seed(&mut self, any: bool) -> Option<(u64, u32)> {
        // Held chunks at the front are skipped for good (in a plain push the
        // front is where they accumulate).
        while let Some(&c) = self.mine.get(self.mine_head) {
            if !self.held.contains(c) {
                break;
            }
            self.mine_head += 1;
        }
        let list = if any {
            &self.order[..]
        } else {
            &self.mine[self.mine_head..]
        };
        let lead = self.cfg.seed_lead as u64;
        // The lead paces the seed by what the swarm shows us; a feeder the
        // coordinator made home to some chunks, with no partial peer
        // linked (none it can reach), has nothing shown: no pacing.
        let alone = self.assigned.is_some() && !self.peers.iter().any(|p| p.alive && !p.seed);
        let gate = if any || self.cfg.me.is_none() || lead == 0 || alone || self.cfg.growing {
            u64::MAX
        } else {
            self.seen + lead.min(self.seen + 1)
        };
        let mut gated = false;
        let mut found = None;
        for &c in list {
            if c >= gate {
                // In a swarm `mine` is in chunk order: the rest waits too.
                gated = true;
                break;
            }
            let ci = c as usize;
            if self.holders[ci].is_empty()
                && self.owner[ci] == NONE
                && !self.held.contains(c)
                && self.seed_has(c)
            {
                found = Some(c);
                break;
            }
        }
        let c = found;
        if !any {
            // Waiting for the swarm only counts while a seed is there.
            self.gated = gated && self.live_seeds > 0;
        }
        let p = self.holder(c?, true, NONE)?;
        Some((c?, p))
    }

    /// Endgame: a chunk in flight with no duplicate, from another holder.
    fn pick_duplicate(&mut self) -> Option<(u64, u32)> {
        let cands: Vec<u64> = self
            .order
            .iter()
            .copied()
            .filter(|&c| {
                let ci = c as usize;
                self.owner[ci] != NONE && self.dup[ci] == NONE
            })
            .collect();
        for c in cands {
            let ci = c as usize;
            let not = self.owner[ci];
            if let Some(p) = self
                .holder(c, false, not)
                .or_else(|| self.holder(c, true, not))
            {
                return Some((c, p));
            }
        }
        None
    }

    /// Hands out requests while peers have room, and reports the end.
    fn settle(&mut self) {
        if self.finished {
            return;
        }
        if self.missing == 0 {
            self.finished = true;
            self.completed = true;
            self.actions.push_back(Action::Complete);
            return;
        }
        if self.order.len() as u64 > self.missing + self.missing / 4 + 8 {
            let held = &self.held;
            self.order.retain(|&c| !held.contains(c));
        }
        self.fill_from_peers(false);
        while let Some((c, p)) = self.pick_from_seed(false) {
            self.request(c, p);
        }
        if self.peer_requests == 0 {
            // Nothing in flight to a partial peer: every decline is forgotten.
            self.epoch += 1;
            self.fill_from_peers(true);
        }
        // While a growing source still announces chunks, every receiver is
        // often idle: another home's chunk is left to its home (who relays
        // it), or each new chunk would leave the source once per receiver.
        let growing = self.cfg.growing && !self.source_complete;
        if self.requests == 0 && self.queued == 0 && !self.gated && !growing {
            if let Some((c, p)) = self.pick_from_seed(true) {
                self.request(c, p);
            }
        }
        if self.cfg.endgame > 0 && self.missing <= self.cfg.endgame as u64 {
            while self.room() {
                match self.pick_duplicate() {
                    Some((c, p)) => self.request(c, p),
                    None => break,
                }
            }
        }
        if self.seeded && self.requests == 0 && !self.gated && self.assigned.is_none() && !growing {
            let missing = self.missing;
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
    fn a_growing_source_is_asked_as_it_announces_and_never_stuck_before_it_is_complete() {
        let mut s = Scheduler::new(
            ChunkSet::empty(4),
            Config {
                window: 4,
                source: Some(9),
                growing: true,
                ..Config::default()
            },
        );
        s.handle(Event::PeerJoined {
            peer: 9,
            has: ChunkSet::empty(4),
        });
        assert_eq!(
            drain(&mut s),
            [],
            "nothing announced: nothing asked, nothing stuck"
        );
        s.handle(Event::PeerHas { peer: 9, chunk: 2 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 9, chunk: 2 }]);
        s.handle(Event::Verified { peer: 9, chunk: 2 });
        assert_eq!(drain(&mut s), [], "waiting for the download, not stuck");
        for c in [0, 1, 3] {
            s.handle(Event::PeerHas { peer: 9, chunk: c });
        }
        let asked = drain(&mut s);
        assert_eq!(asked.len(), 3, "{asked:?}");
        for c in [0, 1, 3] {
            s.handle(Event::Verified { peer: 9, chunk: c });
        }
        assert_eq!(drain(&mut s), [Action::Complete]);
        // The file of chunks 2..4 failed its Hub hash: they are taken back
        // and asked for again once announced anew.
        s.handle(Event::Withdrawn { first: 2, end: 4 });
        assert_eq!(drain(&mut s), []);
        s.handle(Event::PeerHas { peer: 9, chunk: 3 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 9, chunk: 3 }]);
        s.handle(Event::Verified { peer: 9, chunk: 3 });
        s.handle(Event::SourceComplete);
        assert_eq!(
            drain(&mut s),
            [Action::Stuck(StuckReason::NoSource { missing: 1 })],
            "once complete, a chunk nobody has is stuck"
        );
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
                ..Config::default()
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
        assert!(!s.slot(1).is_some_and(|i| s.peers[i].alive));
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

    #[test]
    fn a_plain_push_of_many_chunks_stays_fast() {
        let n = 30_000;
        let mut s = started(n, 16);
        s.handle(Event::PeerJoined {
            peer: 1,
            has: ChunkSet::full(n),
        });
        let started = std::time::Instant::now();
        let mut next = 0;
        while let Some(a) = s.poll_action() {
            match a {
                Action::Fetch { peer: 1, chunk } => {
                    assert_eq!(chunk, next, "in order");
                    next += 1;
                    s.handle(Event::Verified { peer: 1, chunk });
                }
                Action::Complete => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(next, n);
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }

    fn swarm(me: PeerId, receivers: u32, len: u64) -> Scheduler {
        let mut s = Scheduler::new(
            ChunkSet::empty(len),
            Config {
                window: 2,
                seed_window: 1,
                max_in_flight: 4,
                me: Some(me),
                seed_lead: 0,
                ..Config::default()
            },
        );
        for r in 1..=receivers {
            if r != me {
                s.handle(Event::PeerJoined {
                    peer: r,
                    has: ChunkSet::empty(len),
                });
            }
        }
        s.handle(Event::PeerJoined {
            peer: 0,
            has: ChunkSet::full(len),
        });
        s
    }

    #[test]
    fn the_seed_serves_only_home_chunks_and_peers_come_first() {
        // Receivers 1..=4; chunk c is homed at the (c mod 4)-th receiver.
        let mut s = swarm(2, 4, 8);
        assert_eq!(
            drain(&mut s),
            [Action::Fetch { peer: 0, chunk: 1 }],
            "one home chunk from the seed (seed window 1), nothing else yet"
        );
        s.handle(Event::PeerHas { peer: 3, chunk: 2 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 3, chunk: 2 }]);
        s.handle(Event::Verified { peer: 0, chunk: 1 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 5 }]);
        // Slow start: holding one chunk, at most two requests to peers.
        s.handle(Event::PeerHas { peer: 4, chunk: 7 });
        s.handle(Event::PeerHas { peer: 4, chunk: 0 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 4, chunk: 7 }]);
        s.handle(Event::Verified { peer: 3, chunk: 2 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 4, chunk: 0 }]);
        // A chunk a peer holds is not taken from the seed, even a home one:
        // the seed's request is withdrawn.
        s.handle(Event::PeerHas { peer: 1, chunk: 5 });
        assert_eq!(
            drain(&mut s),
            [
                Action::Cancel { peer: 0, chunk: 5 },
                Action::Fetch { peer: 1, chunk: 5 }
            ]
        );
    }

    #[test]
    fn the_seed_is_asked_in_chunk_order_a_little_ahead_of_the_swarm() {
        // Receivers 1..=2, 8 chunks: receiver 1 is home to 0, 2, 4, 6.
        let mut s = Scheduler::new(
            ChunkSet::empty(8),
            Config {
                window: 2,
                seed_window: 4,
                me: Some(1),
                seed_lead: 2,
                ..Config::default()
            },
        );
        s.handle(Event::PeerJoined {
            peer: 2,
            has: ChunkSet::empty(8),
        });
        s.handle(Event::PeerJoined {
            peer: 0,
            has: ChunkSet::full(8),
        });
        // Nothing in the swarm yet: only chunk 0.
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 0 }]);
        // Not stuck while waiting for the swarm.
        s.handle(Event::Verified { peer: 0, chunk: 0 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 2 }]);
        s.handle(Event::PeerHas { peer: 2, chunk: 1 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 2, chunk: 1 }]);
        s.handle(Event::PeerHas { peer: 2, chunk: 3 });
        // Chunks 0, 1, 3 in the swarm: up to chunk 4 now.
        assert_eq!(
            drain(&mut s),
            [
                Action::Fetch { peer: 0, chunk: 4 },
                Action::Fetch { peer: 2, chunk: 3 }
            ]
        );
    }

    #[test]
    fn waiting_for_the_swarm_is_not_stuck_but_losing_the_seed_is() {
        // Receiver 2 of 1..=2: home to chunks 1 and 3, which wait for chunk 0.
        let mut s = Scheduler::new(
            ChunkSet::empty(4),
            Config {
                me: Some(2),
                seed_lead: 1,
                ..Config::default()
            },
        );
        s.handle(Event::PeerJoined {
            peer: 1,
            has: ChunkSet::empty(4),
        });
        s.handle(Event::PeerJoined {
            peer: 0,
            has: ChunkSet::full(4),
        });
        assert_eq!(drain(&mut s), []);
        s.handle(Event::PeerGone { peer: 0 });
        assert_eq!(
            drain(&mut s),
            [Action::Stuck(StuckReason::NoSource { missing: 4 })]
        );
    }

    #[test]
    fn a_partial_peer_serving_one_corrupt_chunk_is_dropped_at_once() {
        let mut s = Scheduler::new(
            ChunkSet::empty(4),
            Config {
                window: 4,
                max_peer_strikes: 3,
                ..Config::default()
            },
        );
        let mut half = ChunkSet::empty(4);
        half.insert(0);
        half.insert(1);
        s.handle(Event::PeerJoined {
            peer: 1,
            has: half.clone(),
        });
        s.handle(Event::PeerJoined { peer: 2, has: half });
        let a = drain(&mut s);
        assert_eq!(a.len(), 2);
        let from_1 = a
            .iter()
            .find_map(|a| match a {
                Action::Fetch { peer: 1, chunk } => Some(*chunk),
                _ => None,
            })
            .expect("a request to peer 1");
        s.handle(Event::Corrupt {
            peer: 1,
            chunk: from_1,
        });
        let a = drain(&mut s);
        assert_eq!(
            a[0],
            Action::DropPeer {
                peer: 1,
                reason: DropReason::Corrupt { strikes: 1 }
            }
        );
        // Everything asked of it, the bad chunk too, is asked of peer 2.
        let mut again: Vec<u64> = a[1..]
            .iter()
            .map(|a| match *a {
                Action::Fetch { peer: 2, chunk } => chunk,
                ref other => panic!("unexpected {other:?}"),
            })
            .collect();
        again.sort();
        assert!(again.contains(&from_1), "{a:?}");
        assert_eq!(again, [0, 1]);
        // Dropped for the transfer: what it announces or brings back is ignored.
        s.handle(Event::PeerHas { peer: 1, chunk: 2 });
        s.handle(Event::PeerJoined {
            peer: 1,
            has: ChunkSet::full(4),
        });
        assert_eq!(drain(&mut s), []);
        // A seed keeps the tolerance of `max_peer_strikes`.
        s.handle(Event::PeerJoined {
            peer: 3,
            has: ChunkSet::full(4),
        });
        let a = drain(&mut s);
        let Some(&Action::Fetch { peer: 3, chunk }) = a.first() else {
            panic!("expected a fetch from the seed, got {a:?}")
        };
        s.handle(Event::Corrupt { peer: 3, chunk });
        let a = drain(&mut s);
        assert!(
            !a.iter().any(|a| matches!(a, Action::DropPeer { .. })),
            "{a:?}"
        );
    }

    fn one_fetch(s: &mut Scheduler) -> (PeerId, u64) {
        match drain(s)[..] {
            [Action::Fetch { peer, chunk }] => (peer, chunk),
            ref other => panic!("expected one fetch, got {other:?}"),
        }
    }

    #[test]
    fn a_busy_peer_is_left_alone_until_nothing_else_is_in_flight() {
        let mut half = ChunkSet::empty(6);
        for c in 0..4 {
            half.insert(c);
        }
        let mut s = Scheduler::new(ChunkSet::empty(6), cfg(1));
        s.handle(Event::PeerJoined {
            peer: 1,
            has: half.clone(),
        });
        let (_, x) = one_fetch(&mut s);
        s.handle(Event::PeerJoined { peer: 2, has: half });
        let (_, y) = one_fetch(&mut s);
        // Peer 1 declines: it is not asked again while peer 2 serves us.
        s.handle(Event::FetchFailed { peer: 1, chunk: x });
        assert_eq!(drain(&mut s), []);
        s.handle(Event::Verified { peer: 2, chunk: y });
        let (p, z) = one_fetch(&mut s);
        assert_eq!(p, 2);
        // Nothing in flight to any peer: declines are forgotten.
        s.handle(Event::FetchFailed { peer: 2, chunk: z });
        let mut asked: Vec<PeerId> = drain(&mut s)
            .into_iter()
            .map(|a| match a {
                Action::Fetch { peer, .. } => peer,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        asked.sort();
        assert_eq!(asked, [1, 2]);
    }

    #[test]
    fn a_gone_receivers_home_chunks_move_to_the_others() {
        let mut s = swarm(2, 4, 8);
        drain(&mut s);
        s.handle(Event::Verified { peer: 0, chunk: 1 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 5 }]);
        s.handle(Event::Verified { peer: 0, chunk: 5 });
        assert_eq!(
            drain(&mut s),
            [Action::Fetch { peer: 0, chunk: 0 }],
            "idle: one chunk of another home, so nothing waits forever"
        );
        for r in [1, 3, 4] {
            s.handle(Event::PeerGone { peer: r });
        }
        assert_eq!(drain(&mut s), [], "the seed window is full");
        // Alone with the seed, every chunk is home.
        let mut got = vec![];
        let mut chunk = 0;
        loop {
            s.handle(Event::Verified { peer: 0, chunk });
            match drain(&mut s)[..] {
                [Action::Fetch { peer: 0, chunk: c }] => {
                    got.push(c);
                    chunk = c;
                }
                [Action::Complete] => break,
                ref other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(got, [2, 3, 4, 6, 7]);
    }

    #[test]
    fn assigned_homes_replace_the_roster_and_losing_the_seed_is_not_stuck() {
        // Receiver 2 with peers 1 and 3 only; the coordinator makes it home
        // to slot 1 of 4: chunks 1 and 5 of 8.
        let mut s = Scheduler::new(
            ChunkSet::empty(8),
            Config {
                window: 1,
                seed_window: 1,
                max_in_flight: 2,
                me: Some(2),
                seed_lead: 0,
                ..Config::default()
            },
        );
        for peer in [1, 3] {
            s.handle(Event::PeerJoined {
                peer,
                has: ChunkSet::empty(8),
            });
        }
        assert_eq!(drain(&mut s), [], "no seed: nothing to do, not stuck");
        s.handle(Event::Homes(Homes {
            of: 4,
            slots: vec![1],
        }));
        s.handle(Event::PeerJoined {
            peer: 0,
            has: ChunkSet::full(8),
        });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 1 }]);
        // The seed request takes one of the two places in flight.
        s.handle(Event::PeerHas { peer: 1, chunk: 0 });
        s.handle(Event::PeerHas { peer: 3, chunk: 2 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 0 }]);
        s.handle(Event::Verified { peer: 0, chunk: 1 });
        assert_eq!(
            drain(&mut s),
            [
                Action::Fetch { peer: 3, chunk: 2 },
                Action::Fetch { peer: 0, chunk: 5 }
            ]
        );
        // Unfed: the seed goes, nothing is stuck, and nothing else of the
        // seed's is asked (no idle fetch of another home's chunk).
        s.handle(Event::Homes(Homes::default()));
        s.handle(Event::PeerGone { peer: 0 });
        s.handle(Event::Verified { peer: 1, chunk: 0 });
        s.handle(Event::Verified { peer: 3, chunk: 2 });
        assert_eq!(drain(&mut s), []);
        s.handle(Event::PeerHas { peer: 1, chunk: 7 });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 7 }]);
    }

    #[test]
    fn a_feeder_that_reaches_no_peer_still_gets_everything_from_the_seed() {
        // Home to chunk 1 of 2 (slot 1 of 2), with the agents' mesh policy
        // (a seed lead of 16), and its one peer never linked: it must not
        // wait for a swarm it cannot see.
        let mut s = Scheduler::new(
            ChunkSet::empty(2),
            crate::engine::policy::swarm_config(Config::default(), 2),
        );
        s.handle(Event::Homes(Homes {
            of: 2,
            slots: vec![1],
        }));
        s.handle(Event::PeerJoined {
            peer: 0,
            has: ChunkSet::full(2),
        });
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 1 }]);
        s.handle(Event::Verified { peer: 0, chunk: 1 });
        // Idle: the other home's chunk comes from the seed too.
        assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 0 }]);
        s.handle(Event::Verified { peer: 0, chunk: 0 });
        assert_eq!(drain(&mut s), [Action::Complete]);
    }
}
