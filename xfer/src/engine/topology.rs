//! Who links to whom in a swarm, and who fetches from the source: a sans-IO
//! state machine owned by the source.
//!
//! The source is the swarm's coordinator: it has a control connection to
//! every receiver, so it sees receivers come and go, and receivers report
//! slow peers to it. It feeds [`Event`]s to one [`Topology`] and drains
//! [`Action`]s (link these two receivers, unlink them, feed this receiver
//! from the source with these homes, stop feeding it), which it sends to the
//! receivers concerned; receivers only apply what they are told. Decisions
//! are a pure function of the config (its `seed`) and the event sequence.
//!
//! Policy:
//!
//! - **Bounded degree.** Every receiver has at most [`Config::degree`] (`K`)
//!   peer links; links are undirected (a link counts once toward each end).
//!   The graph is the union of `K/2` random Hamiltonian cycles over the live
//!   receivers (a pair adjacent in two cycles is one link), so it is
//!   connected by construction (one cycle already is), `K`-regular but for
//!   the rare such coincidence, and an expander with high probability (well
//!   mixed: rarest-first sees a fair sample of the swarm). With `N − 1 ≤ K`
//!   live receivers it is the full mesh instead.
//! - **Why `K = 8`** ([`DEFAULT_DEGREE`]). A random `K`-regular graph has
//!   diameter about `log_{K−1} N`: 1,024 receivers are about 4 hops apart
//!   (3.6), so a chunk reaches everyone a few chunk-times after it leaves
//!   the source. It stays connected when 10% of the nodes die at random
//!   (here by construction; the expansion of a random 8-regular graph
//!   tolerates far more). And each link costs a QUIC connection, a
//!   handshake, flow-control buffers and a bitfield on both ends, so 8
//!   instead of `N − 1` keeps a receiver's cost flat as the swarm grows,
//!   while 8 peers are still enough to keep a receiver's download busy
//!   with at most 2 requests per peer (8 in flight, `policy::swarm_config`).
//! - **Joins.** A new (or returning) receiver is spliced into each cycle at
//!   a random edge `u–v` (which becomes `u–x–v`), choosing edges whose ends
//!   it is not linked to yet, and preferring the edges of pairs adjacent in
//!   two cycles, which repairs those: every other degree is unchanged.
//! - **Deaths.** A receiver that is gone is cut out of each cycle, its
//!   predecessor and successor becoming adjacent: each neighbour that lost
//!   a link gets one back at once (with a node that just got spare degree),
//!   degrees never grow, and every cycle still spans the live receivers, so
//!   the graph stays connected. If the new pair was already linked, the
//!   successor is moved to a random edge instead (a few tries).
//! - **Slow peers.** A receiver reporting a peer slow loses that link: the
//!   peer is moved, in every cycle where the two are adjacent, to a random
//!   edge elsewhere (degrees are unchanged, the reporter gets the peer's old
//!   successor instead). A receiver reported slow never becomes a feeder,
//!   and a slow feeder stops being one (its slots move as for a death).
//! - **Feeders.** Only [`Config::feeders`] (`F`) receivers fetch from the
//!   source; the others get every chunk from peers. Chunks are split into
//!   `F` home slots (chunk `c` is in slot `c mod F`), and each slot belongs
//!   to one feeder, which asks the source for its slot's chunks nobody near
//!   it holds ([`scheduler::Event::Homes`]). So the source uploads each
//!   chunk about once, and all feeders agree because the coordinator
//!   assigns the slots. The first feeders are the receivers with the
//!   highest rendezvous hash of (seed, receiver). A feeder that dies or is
//!   reported slow hands its slots to its best-ranked live neighbour that
//!   is not a feeder (it already holds most of what the slot delivered, so
//!   the source re-sends little), else to the best-ranked live receiver,
//!   else (every receiver feeds) to the feeder with the fewest slots.
//!   Slots never move otherwise, so a chunk's home changes only when its
//!   feeder goes.
//! - **Why `F = 4K = 32`** ([`DEFAULT_FEEDERS`]). The source's upload is
//!   the one link every byte crosses, so it must stay busy (the `S/B`
//!   bound). A feeder keeps one request at the source
//!   (`policy::bounded_swarm_config`) and that request takes one of its `K`
//!   places in flight, so the source's transfer gets at least `1/K` of the
//!   feeder's download: any `K` feeders served at once can take the
//!   source's whole upload, and 32 requests waiting keep the source's
//!   serving slots full (the simulator's source serves 8 at once) through
//!   a few feeders' deaths. Each feeder takes only `1/F` of the file from
//!   the source, and the source's chunks enter the graph at 32 places, so
//!   the farthest receiver of 1,024 is `log_{K−1}(N/F)` ≈ 2 hops from a
//!   feeder. The source keeps data connections to 32 receivers, not `N`.
//!   Measured in the simulator: 16 and 64 feeders are within 0.01 × of 32;
//!   8 were worse (1.18 × the bound against 1.17 ×, and 1.035 × S from the
//!   source).
//! - **Order.** Within one event every `Unlink` comes before every `Link`,
//!   and a receiver's degree is at most `K` after each event, so a
//!   receiver applying actions in order never has more than `K` links.
//!
//! Each event costs O(K) (a feeder's replacement O(log N) more).

use std::collections::{BTreeSet, HashMap, VecDeque};

use super::scheduler::{mix, Homes};

/// A receiver, as numbered by the runtime (the source is not one).
pub type NodeId = u32;

/// Peer links per receiver by default (see the module docs for why).
pub const DEFAULT_DEGREE: u32 = 8;
/// Receivers fetching from the source by default (see the module docs).
pub const DEFAULT_FEEDERS: u32 = 4 * DEFAULT_DEGREE;

/// Tunables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Peer links per receiver, at most; less than 2 acts as 2, and beyond
    /// the full mesh an odd degree acts as one less (the links are `K/2`
    /// cycles).
    pub degree: u32,
    /// Home slots, each owned by one receiver fetching from the source (if
    /// there are fewer receivers, some own several); at least 1.
    pub feeders: u32,
    /// Seed of every random choice.
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            degree: DEFAULT_DEGREE,
            feeders: DEFAULT_FEEDERS,
            seed: 0,
        }
    }
}

/// Something the source learnt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A receiver joined the swarm, or came back after it was gone.
    Joined(NodeId),
    /// A receiver is gone (its control connection broke).
    Gone(NodeId),
    /// `reporter` measured its link to `peer` far slower than its others.
    Slow {
        /// The receiver that measured.
        reporter: NodeId,
        /// The peer it found slow.
        peer: NodeId,
    },
    /// `reporter` cannot reach `peer` at all: they are no longer linked
    /// where the graph can avoid it, and neither is judged slow for it.
    Cut {
        /// The receiver that could not link.
        reporter: NodeId,
        /// The peer it could not reach.
        peer: NodeId,
    },
}

/// What the receivers should be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `a` and `b` become peers.
    Link {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
    /// `a` and `b` are no longer peers.
    Unlink {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
    /// `node` fetches from the source, as home to these chunks (replacing
    /// any homes it was given before).
    Feed {
        /// The receiver.
        node: NodeId,
        /// The chunks it is home to.
        homes: Homes,
    },
    /// `node` no longer fetches from the source.
    Unfeed {
        /// The receiver.
        node: NodeId,
    },
}

/// No node (an index).
const NONE: u32 = u32::MAX;

#[derive(Debug)]
struct Node {
    id: NodeId,
    alive: bool,
    /// Reported slow while feeding: never a feeder again.
    shunned: bool,
    /// Rendezvous rank: higher feeds first.
    rank: u64,
    /// Per cycle: (predecessor, successor), or `NONE` while not in it.
    ring: Vec<(u32, u32)>,
    /// Neighbours in the cycles, with how many cycle edges join us.
    adj: Vec<(u32, u32)>,
    /// Home slots owned.
    slots: Vec<u32>,
    /// Position in `Topology::live`.
    pos: u32,
}

/// The peer graph and feeder set of one swarm.
#[derive(Debug)]
pub struct Topology {
    cfg: Config,
    cycles: usize,
    nodes: Vec<Node>,
    index: HashMap<NodeId, u32>,
    /// Live nodes (indices), in no order.
    live: Vec<u32>,
    /// Per home slot: its feeder (an index), or `NONE`.
    slots: Vec<u32>,
    /// Live non-feeders that may feed, best first.
    candidates: BTreeSet<(std::cmp::Reverse<u64>, u32)>,
    rng: u64,
    /// Pairs adjacent in two cycles, maybe (checked when used): (cycle, node
    /// whose successor edge it is).
    doubles: Vec<(usize, u32)>,
    /// Pairs touched by the current event, with their link state before it.
    touched: HashMap<(u32, u32), bool>,
    /// Feeders whose slots the current event changed, and former feeders.
    refeed: Vec<u32>,
    unfed: Vec<u32>,
    /// Whether the current event started with the full mesh.
    was_mesh: Option<Vec<(u32, u32)>>,
    actions: VecDeque<Action>,
    /// Within `new`: slots are handed out once every receiver is in.
    building: bool,
}

impl Topology {
    /// The topology of a swarm of `receivers` (in any order; duplicates are
    /// ignored), as if each had joined, in an order that depends only on the
    /// set and the seed.
    pub fn new(cfg: Config, receivers: impl IntoIterator<Item = NodeId>) -> Self {
        let degree = cfg.degree.max(2);
        let mut t = Topology {
            cfg: Config { degree, ..cfg },
            cycles: (degree / 2) as usize,
            nodes: Vec::new(),
            index: HashMap::new(),
            live: Vec::new(),
            slots: vec![NONE; cfg.feeders.max(1) as usize],
            candidates: BTreeSet::new(),
            rng: mix(cfg.seed ^ 0x746f_706f),
            doubles: Vec::new(),
            touched: HashMap::new(),
            refeed: Vec::new(),
            unfed: Vec::new(),
            was_mesh: None,
            actions: VecDeque::new(),
            building: false,
        };
        let mut ids: Vec<NodeId> = receivers.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        ids.sort_by_key(|&id| mix(id as u64 ^ mix(cfg.seed)));
        t.building = true;
        for id in ids {
            t.handle(Event::Joined(id));
        }
        t.building = false;
        // The best-ranked receivers feed, one slot each (several each if
        // there are fewer receivers than slots).
        t.begin();
        let best: Vec<u32> = t.candidates.iter().map(|&(_, j)| j).collect();
        if !best.is_empty() {
            for s in 0..t.slots.len() {
                let j = best[s % best.len()];
                t.give(s, j);
            }
        }
        t.end();
        t
    }

    /// The config in force (the degree as used).
    pub fn config(&self) -> Config {
        self.cfg
    }

    /// Feeds one event.
    pub fn handle(&mut self, event: Event) {
        self.begin();
        match event {
            Event::Joined(id) => self.join(id),
            Event::Gone(id) => {
                if let Some(i) = self.live_index(id) {
                    self.leave(i);
                }
            }
            Event::Cut { reporter, peer } => {
                if let (Some(r), Some(p)) = (self.live_index(reporter), self.live_index(peer)) {
                    self.cut(r, p);
                }
            }
            Event::Slow { reporter, peer } => {
                if let (Some(r), Some(p)) = (self.live_index(reporter), self.live_index(peer)) {
                    self.slow(r, p);
                }
            }
        }
        self.end();
    }

    /// Next action to carry out, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The live peers of `id` (empty if unknown or gone), in no order.
    pub fn peers(&self, id: NodeId) -> Vec<NodeId> {
        let Some(i) = self.live_index(id) else {
            return Vec::new();
        };
        if self.mesh() {
            return self
                .live
                .iter()
                .filter(|&&j| j != i)
                .map(|&j| self.nodes[j as usize].id)
                .collect();
        }
        self.nodes[i as usize]
            .adj
            .iter()
            .map(|&(j, _)| self.nodes[j as usize].id)
            .collect()
    }

    /// The live receivers fetching from the source, in no order.
    pub fn feeders(&self) -> Vec<NodeId> {
        let mut f: Vec<NodeId> = self
            .slots
            .iter()
            .filter(|&&s| s != NONE)
            .map(|&s| self.nodes[s as usize].id)
            .collect();
        f.sort_unstable();
        f.dedup();
        f
    }

    /// The home slots of `id` (empty unless it feeds).
    pub fn homes(&self, id: NodeId) -> Homes {
        let slots = self
            .live_index(id)
            .map(|i| self.nodes[i as usize].slots.clone())
            .unwrap_or_default();
        Homes {
            of: self.slots.len() as u32,
            slots,
        }
    }

    /// Live receivers.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no receiver is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Whether `id` is in the swarm now (joined and not gone).
    pub fn is_live(&self, id: NodeId) -> bool {
        self.live_index(id).is_some()
    }

    fn live_index(&self, id: NodeId) -> Option<u32> {
        self.index
            .get(&id)
            .copied()
            .filter(|&i| self.nodes[i as usize].alive)
    }

    /// Whether the links are the full mesh (few receivers) rather than the
    /// cycles.
    fn mesh(&self) -> bool {
        self.live.len() <= self.cfg.degree as usize + 1
    }

    fn next_random(&mut self) -> u64 {
        self.rng = mix(self.rng);
        self.rng
    }

    fn random_live(&mut self) -> u32 {
        let n = self.live.len() as u64;
        let k = (self.next_random() % n) as usize;
        self.live[k]
    }

    // --- Links -----------------------------------------------------------

    fn begin(&mut self) {
        self.touched.clear();
        self.refeed.clear();
        self.unfed.clear();
        self.was_mesh = self.mesh().then(|| self.mesh_pairs());
    }

    fn mesh_pairs(&self) -> Vec<(u32, u32)> {
        let mut v = Vec::new();
        for (k, &a) in self.live.iter().enumerate() {
            for &b in &self.live[k + 1..] {
                v.push((a.min(b), a.max(b)));
            }
        }
        v
    }

    fn linked_in_cycles(&self, a: u32, b: u32) -> bool {
        self.mult(a, b) > 0
    }

    fn mult(&self, a: u32, b: u32) -> u32 {
        self.nodes[a as usize]
            .adj
            .iter()
            .find(|&&(j, _)| j == b)
            .map_or(0, |&(_, m)| m)
    }

    fn touch(&mut self, a: u32, b: u32) {
        let key = (a.min(b), a.max(b));
        if !self.touched.contains_key(&key) {
            let before = self.linked_in_cycles(a, b);
            self.touched.insert(key, before);
        }
    }

    /// Adds one cycle edge `a–b`.
    fn add_edge(&mut self, a: u32, b: u32) {
        if a == b || a == NONE || b == NONE {
            return;
        }
        self.touch(a, b);
        for (x, y) in [(a, b), (b, a)] {
            let adj = &mut self.nodes[x as usize].adj;
            match adj.iter_mut().find(|e| e.0 == y) {
                Some(e) => e.1 += 1,
                None => adj.push((y, 1)),
            }
        }
    }

    /// Removes one cycle edge `a–b`.
    fn remove_edge(&mut self, a: u32, b: u32) {
        if a == b || a == NONE || b == NONE {
            return;
        }
        self.touch(a, b);
        for (x, y) in [(a, b), (b, a)] {
            let adj = &mut self.nodes[x as usize].adj;
            if let Some(k) = adj.iter().position(|e| e.0 == y) {
                adj[k].1 -= 1;
                if adj[k].1 == 0 {
                    adj.swap_remove(k);
                }
            }
        }
    }

    /// Puts `x` between `u` and its successor in cycle `c`.
    fn splice(&mut self, c: usize, x: u32, u: u32) {
        let v = self.nodes[u as usize].ring[c].1;
        self.remove_edge(u, v);
        self.nodes[u as usize].ring[c].1 = x;
        self.nodes[v as usize].ring[c].0 = x;
        self.nodes[x as usize].ring[c] = (u, v);
        self.add_edge(u, x);
        self.add_edge(x, v);
    }

    /// Takes `x` out of cycle `c`; returns its (predecessor, successor),
    /// now adjacent.
    fn unsplice(&mut self, c: usize, x: u32) -> (u32, u32) {
        let (p, s) = self.nodes[x as usize].ring[c];
        self.nodes[x as usize].ring[c] = (NONE, NONE);
        if p == x {
            return (NONE, NONE);
        }
        self.remove_edge(p, x);
        self.remove_edge(x, s);
        self.nodes[p as usize].ring[c].1 = s;
        self.nodes[s as usize].ring[c].0 = p;
        self.add_edge(p, s);
        (p, s)
    }

    /// A node `u` of cycle `c` whose successor edge `x` may be spliced into
    /// without linking `x` to a node it is linked to already (and not next
    /// to `avoid`), preferring doubled pairs; any edge after a few tries.
    fn splice_point(&mut self, c: usize, x: u32, avoid: u32) -> u32 {
        let ok = |t: &Self, u: u32| {
            let v = t.nodes[u as usize].ring[c].1;
            u != x
                && v != x
                && u != avoid
                && v != avoid
                && !t.linked_in_cycles(x, u)
                && !t.linked_in_cycles(x, v)
        };
        while let Some((dc, u)) = self.doubles.pop() {
            if dc != c {
                // Kept for its own cycle; cheap to look at later.
                self.doubles.insert(0, (dc, u));
                break;
            }
            let n = &self.nodes[u as usize];
            if !n.alive || n.ring[c].1 == NONE {
                continue;
            }
            let v = n.ring[c].1;
            if self.mult(u, v) >= 2 && ok(self, u) {
                return u;
            }
        }
        let mut u = self.random_live();
        for _ in 0..16 {
            if ok(self, u) {
                return u;
            }
            u = self.random_live();
        }
        u
    }

    fn join(&mut self, id: NodeId) {
        let i = match self.index.get(&id) {
            Some(&i) if self.nodes[i as usize].alive => return,
            Some(&i) => i,
            None => {
                let i = self.nodes.len() as u32;
                self.index.insert(id, i);
                self.nodes.push(Node {
                    id,
                    alive: false,
                    shunned: false,
                    rank: mix(id as u64 ^ mix(self.cfg.seed ^ 0x6665_6564)),
                    ring: vec![(NONE, NONE); self.cycles],
                    adj: Vec::new(),
                    slots: Vec::new(),
                    pos: 0,
                });
                i
            }
        };
        if self.live.is_empty() {
            for c in 0..self.cycles {
                self.nodes[i as usize].ring[c] = (i, i);
            }
        } else {
            for c in 0..self.cycles {
                let u = self.splice_point(c, i, NONE);
                self.splice(c, i, u);
            }
        }
        let n = &mut self.nodes[i as usize];
        n.alive = true;
        n.pos = self.live.len() as u32;
        self.live.push(i);
        if !n.shunned {
            self.candidates.insert((std::cmp::Reverse(n.rank), i));
        }
        // Slots nobody owns (every feeder was gone): a slot moves only when
        // its feeder goes, never to a newcomer otherwise.
        if self.building {
            return;
        }
        for s in 0..self.slots.len() {
            if self.slots[s] == NONE {
                self.assign(s, &[]);
            }
        }
    }

    fn leave(&mut self, i: u32) {
        let mut orphans: Vec<u32> = Vec::new();
        for c in 0..self.cycles {
            let (p, s) = self.unsplice(c, i);
            if p == NONE {
                continue;
            }
            orphans.push(p);
            orphans.push(s);
            if p != s && self.mult(p, s) >= 2 {
                // Already linked: move the successor elsewhere instead.
                if !self.relocate(c, s, p) {
                    self.doubles.push((c, p));
                }
            }
        }
        let n = &mut self.nodes[i as usize];
        n.alive = false;
        let pos = n.pos as usize;
        let slots = std::mem::take(&mut n.slots);
        self.live.swap_remove(pos);
        if let Some(&moved) = self.live.get(pos) {
            self.nodes[moved as usize].pos = pos as u32;
        }
        let rank = self.nodes[i as usize].rank;
        self.candidates.remove(&(std::cmp::Reverse(rank), i));
        for &s in &slots {
            self.slots[s as usize] = NONE;
        }
        for s in slots {
            self.assign(s as usize, &orphans);
        }
    }

    /// Moves `x` in cycle `c` to a random edge whose ends it is not linked
    /// to, away from `avoid`; false if no such edge was found in a few
    /// tries (nothing changes then).
    fn relocate(&mut self, c: usize, x: u32, avoid: u32) -> bool {
        if self.live.len() <= 3 {
            return false;
        }
        for _ in 0..8 {
            let u = self.random_live();
            let v = self.nodes[u as usize].ring[c].1;
            // A node leaving is still among the live while its cycles are
            // mended, but no longer in them.
            if v == NONE {
                continue;
            }
            let (p, s) = self.nodes[x as usize].ring[c];
            if [x, p, s, avoid].contains(&u) || [x, p, s, avoid].contains(&v) {
                continue;
            }
            if self.linked_in_cycles(x, u) || self.linked_in_cycles(x, v) {
                continue;
            }
            // Once out, its old neighbours become adjacent: not doubled.
            if p != s && self.mult(p, s) > 0 {
                continue;
            }
            self.unsplice(c, x);
            self.splice(c, x, u);
            return true;
        }
        false
    }

    /// Moves `p` away from `r` in every cycle where they are neighbours
    /// (a mesh links everyone: nothing to do there).
    fn cut(&mut self, r: u32, p: u32) {
        if r == p || self.mesh() {
            return;
        }
        for c in 0..self.cycles {
            let (pp, ps) = self.nodes[p as usize].ring[c];
            if pp == r || ps == r {
                self.relocate(c, p, r);
            }
        }
    }

    fn slow(&mut self, r: u32, p: u32) {
        if r == p {
            return;
        }
        if !self.mesh() {
            for c in 0..self.cycles {
                let (pp, ps) = self.nodes[p as usize].ring[c];
                if pp == r || ps == r {
                    self.relocate(c, p, r);
                }
            }
        }
        if !self.nodes[p as usize].slots.is_empty() {
            self.nodes[p as usize].shunned = true;
            let near: Vec<u32> = self.nodes[p as usize].adj.iter().map(|&(j, _)| j).collect();
            let slots = std::mem::take(&mut self.nodes[p as usize].slots);
            self.unfed.push(p);
            for &s in &slots {
                self.slots[s as usize] = NONE;
            }
            for s in slots {
                self.assign(s as usize, &near);
            }
        } else {
            let rank = self.nodes[p as usize].rank;
            self.nodes[p as usize].shunned = true;
            self.candidates.remove(&(std::cmp::Reverse(rank), p));
        }
    }

    // --- Feeders ---------------------------------------------------------

    /// Gives slot `s` to the best-ranked live non-feeder among `near`, else
    /// the best-ranked live non-feeder, else the live feeder with the
    /// fewest slots.
    fn assign(&mut self, s: usize, near: &[u32]) {
        let free = |t: &Self, j: u32| {
            let n = &t.nodes[j as usize];
            n.alive && !n.shunned && n.slots.is_empty()
        };
        let pick = near
            .iter()
            .copied()
            .filter(|&j| free(self, j))
            .max_by_key(|&j| (self.nodes[j as usize].rank, j))
            .or_else(|| self.candidates.first().map(|&(_, j)| j))
            .or_else(|| {
                let mut best: Option<u32> = None;
                for &f in &self.slots {
                    if f != NONE
                        && self.nodes[f as usize].alive
                        && best.is_none_or(|b| {
                            self.nodes[f as usize].slots.len() < self.nodes[b as usize].slots.len()
                        })
                    {
                        best = Some(f);
                    }
                }
                best
            })
            .or_else(|| {
                // Only shunned receivers are left: one of them, rather than
                // no source at all.
                self.live.iter().copied().min()
            });
        if let Some(j) = pick {
            self.give(s, j);
        }
    }

    fn give(&mut self, s: usize, j: u32) {
        let n = &mut self.nodes[j as usize];
        n.slots.push(s as u32);
        n.slots.sort_unstable();
        let rank = n.rank;
        self.candidates.remove(&(std::cmp::Reverse(rank), j));
        self.slots[s] = j;
        self.refeed.push(j);
    }

    /// Emits this event's actions: unlinks, then links, then feeds.
    fn end(&mut self) {
        let mut unlinks: Vec<(u32, u32)> = Vec::new();
        let mut links: Vec<(u32, u32)> = Vec::new();
        let now_mesh = self.mesh();
        match (self.was_mesh.take(), now_mesh) {
            (None, false) => {
                for (&(a, b), &before) in &self.touched {
                    let after = self.linked_in_cycles(a, b);
                    if before && !after {
                        unlinks.push((a, b));
                    } else if after && !before {
                        links.push((a, b));
                    }
                }
            }
            (was, _) => {
                let before: BTreeSet<(u32, u32)> = match was {
                    Some(pairs) => pairs.into_iter().collect(),
                    None => self.cycle_pairs_before(),
                };
                let after: BTreeSet<(u32, u32)> = if now_mesh {
                    self.mesh_pairs().into_iter().collect()
                } else {
                    self.cycle_pairs()
                };
                unlinks.extend(before.difference(&after));
                links.extend(after.difference(&before));
            }
        }
        unlinks.sort_unstable();
        links.sort_unstable();
        let id = |t: &Self, i: u32| t.nodes[i as usize].id;
        for (a, b) in unlinks {
            let (a, b) = (id(self, a), id(self, b));
            self.actions.push_back(Action::Unlink { a, b });
        }
        for (a, b) in links {
            let (a, b) = (id(self, a), id(self, b));
            self.actions.push_back(Action::Link { a, b });
        }
        let mut unfed = std::mem::take(&mut self.unfed);
        unfed.sort_unstable();
        unfed.dedup();
        for &j in &unfed {
            let n = &self.nodes[j as usize];
            if n.alive && n.slots.is_empty() {
                self.actions.push_back(Action::Unfeed { node: n.id });
            }
        }
        let mut refeed = std::mem::take(&mut self.refeed);
        refeed.sort_unstable();
        refeed.dedup();
        for &j in &refeed {
            if self.nodes[j as usize].alive {
                let id = self.nodes[j as usize].id;
                let homes = self.homes(id);
                self.actions.push_back(Action::Feed { node: id, homes });
            }
        }
        self.unfed = unfed;
        self.refeed = refeed;
    }

    /// Live cycle links now.
    fn cycle_pairs(&self) -> BTreeSet<(u32, u32)> {
        let mut set = BTreeSet::new();
        for &a in &self.live {
            for &(b, _) in &self.nodes[a as usize].adj {
                set.insert((a.min(b), a.max(b)));
            }
        }
        set
    }

    /// Cycle links before this event: now, with the touched pairs as they
    /// were (only used when the event left the full mesh).
    fn cycle_pairs_before(&self) -> BTreeSet<(u32, u32)> {
        let mut set = self.cycle_pairs();
        for (&pair, &before) in &self.touched {
            if before {
                set.insert(pair);
            } else {
                set.remove(&pair);
            }
        }
        set
    }

    /// Largest degree among live receivers.
    pub fn max_degree(&self) -> usize {
        self.live
            .iter()
            .map(|&i| self.peers(self.nodes[i as usize].id).len())
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The links as a receiver-side mirror would see them, built only from
    /// the actions (checking the degree bound after every action).
    #[derive(Default)]
    struct Mirror {
        links: HashMap<NodeId, HashSet<NodeId>>,
        feeding: HashMap<NodeId, Homes>,
        max_seen: usize,
        gone: HashSet<NodeId>,
    }

    impl Mirror {
        fn apply(&mut self, t: &mut Topology, k: usize) {
            while let Some(a) = t.poll_action() {
                match a {
                    Action::Link { a, b } => {
                        self.gone.remove(&a);
                        self.gone.remove(&b);
                        assert!(self.links.entry(a).or_default().insert(b), "{a}-{b} twice");
                        assert!(self.links.entry(b).or_default().insert(a));
                        for n in [a, b] {
                            let d = self.links[&n].len();
                            self.max_seen = self.max_seen.max(d);
                            assert!(d <= k, "receiver {n} has {d} links > {k}");
                        }
                    }
                    Action::Unlink { a, b } => {
                        // The links of a gone receiver broke already.
                        let gone = self.gone.contains(&a) || self.gone.contains(&b);
                        let had = self.links.entry(a).or_default().remove(&b);
                        assert!(had || gone, "{a}-{b} absent");
                        assert_eq!(self.links.entry(b).or_default().remove(&a), had);
                    }
                    Action::Feed { node, homes } => {
                        self.feeding.insert(node, homes);
                    }
                    Action::Unfeed { node } => {
                        assert!(self.feeding.remove(&node).is_some());
                    }
                }
            }
        }

        fn forget(&mut self, node: NodeId) {
            // What a gone receiver's peers see at once: its links broke.
            self.gone.insert(node);
            if let Some(peers) = self.links.remove(&node) {
                for p in peers {
                    self.links.get_mut(&p).unwrap().remove(&node);
                }
            }
            self.feeding.remove(&node);
        }
    }

    fn connected(t: &Topology) -> bool {
        let live: Vec<NodeId> = t.live.iter().map(|&i| t.nodes[i as usize].id).collect();
        let Some(&first) = live.first() else {
            return true;
        };
        let mut seen = HashSet::from([first]);
        let mut todo = vec![first];
        while let Some(x) = todo.pop() {
            for p in t.peers(x) {
                if seen.insert(p) {
                    todo.push(p);
                }
            }
        }
        seen.len() == live.len()
    }

    fn degrees(t: &Topology) -> (usize, usize) {
        let d: Vec<usize> = t
            .live
            .iter()
            .map(|&i| t.peers(t.nodes[i as usize].id).len())
            .collect();
        (
            d.iter().copied().min().unwrap_or(0),
            d.iter().copied().max().unwrap_or(0),
        )
    }

    /// Mirror, topology and the slot assignment agree.
    fn consistent(t: &Topology, m: &Mirror) {
        for &i in &t.live {
            let id = t.nodes[i as usize].id;
            let mut want: Vec<NodeId> = t.peers(id);
            want.sort_unstable();
            let mut got: Vec<NodeId> = m
                .links
                .get(&id)
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
            got.sort_unstable();
            assert_eq!(got, want, "links of {id}");
        }
        let of = t.slots.len() as u32;
        let mut owned = vec![0; of as usize];
        for (node, homes) in &m.feeding {
            assert_eq!(homes.of, of);
            assert_eq!(*homes, t.homes(*node), "homes of {node}");
            for &s in &homes.slots {
                owned[s as usize] += 1;
            }
        }
        assert!(
            owned.iter().all(|&n| n == 1),
            "each slot owned once: {owned:?}"
        );
    }

    fn built(n: u32, cfg: Config) -> (Topology, Mirror) {
        let mut t = Topology::new(cfg, 1..=n);
        let mut m = Mirror::default();
        m.apply(&mut t, cfg.degree as usize);
        (t, m)
    }

    #[test]
    fn a_built_graph_is_connected_bounded_and_nearly_regular() {
        for n in [10, 17, 64, 256, 1024] {
            let cfg = Config::default();
            let (t, m) = built(n, cfg);
            consistent(&t, &m);
            assert!(connected(&t), "N={n}");
            let (lo, hi) = degrees(&t);
            assert!(hi <= 8, "N={n}: max degree {hi}");
            // Near the mesh (N < 2K) random cycles overlap more.
            let floor = if n >= 64 { 7 } else { 5 };
            assert!(lo >= floor, "N={n}: min degree {lo}");
            let full = t
                .live
                .iter()
                .filter(|&&i| t.nodes[i as usize].adj.len() == 8)
                .count();
            if n >= 64 {
                assert!(full * 100 >= n as usize * 95, "N={n}: {full} of degree 8");
            }
            assert_eq!(
                t.feeders().len(),
                (DEFAULT_FEEDERS as usize).min(n as usize)
            );
            assert!(m.max_seen <= 8);
        }
    }

    #[test]
    fn few_receivers_are_a_full_mesh_and_all_feed() {
        for n in 1..=9 {
            let (t, m) = built(n, Config::default());
            consistent(&t, &m);
            for id in 1..=n {
                assert_eq!(t.peers(id).len(), n as usize - 1, "N={n}");
            }
            assert_eq!(t.feeders().len(), n as usize);
        }
        // Growing past K + 1 leaves the mesh; shrinking back returns to it.
        let (mut t, mut m) = built(9, Config::default());
        t.handle(Event::Joined(10));
        m.apply(&mut t, 8);
        consistent(&t, &m);
        assert!(connected(&t));
        t.handle(Event::Gone(3));
        m.forget(3);
        m.apply(&mut t, 8);
        consistent(&t, &m);
        for id in (1..=10).filter(|&i| i != 3) {
            assert_eq!(t.peers(id).len(), 8);
        }
    }

    #[test]
    fn the_same_inputs_make_the_same_graph() {
        let run = |seed: u64| {
            let cfg = Config {
                seed,
                ..Config::default()
            };
            let mut t = Topology::new(cfg, (1..=300).rev());
            let mut out: Vec<Action> = std::iter::from_fn(|| t.poll_action()).collect();
            for ev in [
                Event::Gone(7),
                Event::Slow {
                    reporter: 9,
                    peer: 12,
                },
                Event::Joined(7),
                Event::Joined(301),
            ] {
                t.handle(ev);
                out.extend(std::iter::from_fn(|| t.poll_action()));
            }
            out
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn deaths_are_rewired_within_the_bound_and_feeders_replaced() {
        let n = 1024u32;
        let cfg = Config::default();
        let (mut t, mut m) = built(n, cfg);
        let started = std::time::Instant::now();
        let mut x = 5u64;
        let mut dead = HashSet::new();
        while dead.len() < (n / 10) as usize {
            x = mix(x);
            let id = (x % n as u64) as u32 + 1;
            if !dead.insert(id) {
                continue;
            }
            t.handle(Event::Gone(id));
            m.forget(id);
            m.apply(&mut t, 8);
            assert!(t.max_degree() <= 8);
        }
        // Kill every first feeder too.
        for f in built(n, cfg).0.feeders() {
            if dead.insert(f) {
                t.handle(Event::Gone(f));
                m.forget(f);
                m.apply(&mut t, 8);
            }
        }
        consistent(&t, &m);
        assert!(connected(&t));
        let (lo, hi) = degrees(&t);
        assert!(hi <= 8 && lo >= 6, "degrees {lo}..{hi}");
        let full = t
            .live
            .iter()
            .filter(|&&i| t.nodes[i as usize].adj.len() >= 7)
            .count();
        assert!(full * 100 >= t.len() * 97, "{full} of {} near 8", t.len());
        let f = t.feeders();
        assert_eq!(f.len(), DEFAULT_FEEDERS as usize);
        assert!(f.iter().all(|id| !dead.contains(id)));
        // Coming back: spliced in again, degrees still bounded.
        for &id in dead.iter().take(20) {
            t.handle(Event::Joined(id));
            m.apply(&mut t, 8);
        }
        consistent(&t, &m);
        assert!(connected(&t));
        assert!(t.max_degree() <= 8);
        assert!(m.max_seen <= 8);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn a_slow_link_is_rewired_and_a_slow_feeder_replaced() {
        let (mut t, mut m) = built(64, Config::default());
        let a = 5;
        let b = t.peers(a)[0];
        t.handle(Event::Slow {
            reporter: a,
            peer: b,
        });
        m.apply(&mut t, 8);
        consistent(&t, &m);
        assert!(!t.peers(a).contains(&b));
        assert!(t.peers(a).len() >= 7 && t.peers(b).len() >= 7);
        let f = t.feeders()[0];
        let homes = t.homes(f);
        let r = t.peers(f)[0];
        t.handle(Event::Slow {
            reporter: r,
            peer: f,
        });
        let acts: Vec<Action> = std::iter::from_fn(|| t.poll_action()).collect();
        assert!(acts.contains(&Action::Unfeed { node: f }), "{acts:?}");
        let heir = acts
            .iter()
            .find_map(|a| match a {
                Action::Feed { node, homes: h } if *h == homes => Some(*node),
                _ => None,
            })
            .expect("its slots go to one new feeder");
        assert!(!t.feeders().contains(&f));
        assert!(t.feeders().contains(&heir));
        assert_eq!(t.feeders().len(), DEFAULT_FEEDERS as usize);
        assert!(connected(&t));
    }

    #[test]
    fn with_every_receiver_gone_slots_wait_for_the_next() {
        let (mut t, mut m) = built(3, Config::default());
        for id in 1..=3 {
            t.handle(Event::Gone(id));
            m.forget(id);
            m.apply(&mut t, 8);
        }
        assert!(t.feeders().is_empty());
        t.handle(Event::Joined(2));
        m.apply(&mut t, 8);
        assert_eq!(t.feeders(), [2]);
        assert_eq!(t.homes(2).slots.len(), DEFAULT_FEEDERS as usize);
        consistent(&t, &m);
    }
}
