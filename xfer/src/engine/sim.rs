//! A deterministic discrete-event simulator of a swarm transfer, driving the
//! real [`Scheduler`] of every receiver.
//!
//! Node 0 is the source (a seed holding every chunk); nodes `1..=N` are
//! receivers, each with its own scheduler whose peers are the source and every
//! other receiver (the full mesh, [`Setup::topology`] `None`), or whom the
//! source's [`Topology`] links it to (at most `K` receivers, and the source
//! only for feeders). Peer ids are node numbers.
//!
//! The model:
//!
//! - **Virtual time** in nanoseconds; no clock, threads or sockets. Ties are
//!   broken by insertion order, so a run is a pure function of its [`Setup`].
//! - **Links.** Every node has an upload and a download rate (bytes/s) and a
//!   one-way access latency; a message from `a` to `b` takes
//!   `latency(a) + latency(b)`.
//! - **Requests.** A `Fetch` reaches the sender one latency later. A sender
//!   serves at most `slots` requests at once; the rest wait in a FIFO queue
//!   of at most `queue` entries, and a request that finds slots and queue
//!   full is declined at once (the requester gets `FetchFailed` one latency
//!   later), as a busy agent would answer.
//! - **Fair sharing.** Transfers run at max-min fair rates over the
//!   senders' upload and the receivers' download capacities. When a transfer
//!   starts or ends, the rates of every transfer at that sender's upload and
//!   that receiver's download are recomputed by progressive filling, holding
//!   all other transfers' rates fixed (always feasible; exact for the
//!   transfers touched, approximate globally), which keeps each event cheap.
//! - **Delivery.** The last byte arrives one latency after the sender sent
//!   it; the receiver's scheduler gets `Verified` (or `Corrupt` if the sender
//!   corrupts what it serves), and one further latency later every other
//!   receiver still missing the chunk gets `PeerHas` (one that holds it has
//!   no use for the news).
//! - **Slow peers.** Each receiver's runtime keeps the mean rate of the
//!   transfers each partial peer made to it; a peer averaging at most half
//!   the mean over all partial peers (after two transfers) is reported once
//!   with `PeerSlow`.
//! - **Failures.** A node may die at a scripted time: its transfers stop and
//!   everyone's scheduler gets `PeerGone` at once. It may come back later with
//!   the chunks it had verified, under a fresh scheduler, and everyone gets
//!   `PeerJoined` with its bitfield.
//! - **Topology.** With [`Setup::topology`] set, the source runs the
//!   product's [`Topology`]; its actions reach each receiver concerned one
//!   latency later: `Link` makes each end meet the other (`PeerJoined`
//!   with its bitfield then), `Unlink` gives `PeerGone` and aborts the
//!   transfers between them, `Feed` gives `Homes` and then the source as a
//!   peer, `Unfeed` the reverse. `PeerHas` goes only to linked peers. A
//!   death breaks the dead node's links at once (its peers get
//!   `PeerGone`) and reaches the topology one latency later; a returning
//!   node starts with no peers and is linked anew; a slow-peer report
//!   also goes to the topology. Receivers run
//!   [`policy::bounded_swarm_config`]. Each node's most links at once is
//!   reported ([`NodeReport::max_peers`]).
//! - **Actions.** `Cancel` aborts a transfer wherever it is; `DropPeer` aborts
//!   every transfer from that peer to the dropping node.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::engine::policy;
use crate::engine::scheduler::{self, Action, Event, PeerId, Scheduler, StuckReason};
use crate::engine::topology::{self, Topology};
use xfer_proto::chunkset::ChunkSet;

/// One node's link and behaviour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeSpec {
    /// Upload rate, bytes per second.
    pub up: f64,
    /// Download rate, bytes per second.
    pub down: f64,
    /// One-way access latency, seconds.
    pub latency: f64,
    /// Requests served concurrently; the rest wait in a FIFO queue.
    pub slots: u32,
    /// Requests that may wait in that queue; one more is declined at once
    /// (the requester gets `FetchFailed`). `None`: no limit.
    pub queue: Option<u32>,
    /// Serves chunks that fail their check.
    pub corrupt: bool,
    /// Dies at this time (seconds).
    pub dies_at: Option<f64>,
    /// Comes back at this time (seconds), after dying.
    pub returns_at: Option<f64>,
}

impl NodeSpec {
    /// A symmetric link of `rate` bytes/s with `latency` seconds one way.
    pub fn link(rate: f64, latency: f64) -> Self {
        NodeSpec {
            up: rate,
            down: rate,
            latency,
            slots: 2,
            queue: None,
            corrupt: false,
            dies_at: None,
            returns_at: None,
        }
    }
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Chunks in the model.
    pub chunks: u64,
    /// Bytes per chunk.
    pub chunk_bytes: u64,
    /// The source node.
    pub source: NodeSpec,
    /// The receiving nodes.
    pub receivers: Vec<NodeSpec>,
    /// The receivers' base scheduler settings; each node's swarm settings
    /// (`me`, `tie_break`, windows) come from [`policy::swarm_config`]
    /// (with a topology, [`policy::bounded_swarm_config`]).
    pub sched: scheduler::Config,
    /// Give up at this virtual time (seconds).
    pub until: f64,
    /// The peer graph: `None`, the full mesh with every receiver fetching
    /// from the source; `Some`, bounded links and feeders, as the source's
    /// [`Topology`] decides (see the module docs).
    pub topology: Option<topology::Config>,
}

/// What happened to one receiver.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeReport {
    /// When its scheduler reported `Complete` (seconds).
    pub done_at: Option<f64>,
    /// Verified chunk bytes received from the source.
    pub from_source: u64,
    /// Verified chunk bytes received from other receivers.
    pub from_peers: u64,
    /// Chunk bytes this node uploaded.
    pub uploaded: u64,
    /// Peers its scheduler dropped.
    pub dropped: Vec<PeerId>,
    /// Peers it reported slow.
    pub slow: Vec<PeerId>,
    /// Why its scheduler gave up, if it did.
    pub stuck: Option<StuckReason>,
    /// Alive at the end.
    pub alive: bool,
    /// Most peer links it had at once (the source not counted).
    pub max_peers: usize,
    /// Whether it was ever told to fetch from the source.
    pub fed: bool,
}

/// The outcome of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Receivers, in node order (node `i + 1` is `nodes[i]`).
    pub nodes: Vec<NodeReport>,
    /// Chunk bytes the source uploaded (including cancelled transfers).
    pub source_uploaded: u64,
    /// When the source finished its last upload (seconds).
    pub source_done: f64,
    /// Events processed.
    pub events: u64,
    /// Virtual time of the last event (seconds).
    pub end: f64,
    /// Most peer links any receiver had at once.
    pub max_peers: usize,
}

/// A tiny xorshift64* generator, for scripted randomness in tests.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next pseudo-random number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

const NS: f64 = 1e9;

fn ns(seconds: f64) -> u64 {
    (seconds * NS).ceil() as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A request reaches its sender.
    Request(usize),
    /// A declined request's answer reaches the requester.
    Declined(usize),
    /// A transfer's last byte left the sender, if its version still matches.
    Sent(usize, u32),
    /// A transfer's last byte reached the receiver.
    Deliver(usize),
    /// A receiver's new chunk becomes known to the others.
    Announce(usize, u64),
    Die(usize),
    Return(usize),
    /// A topology action reaches a receiver (an index into `Sim::told`).
    Told(usize),
    /// A topology event reaches the source (an index into `Sim::tell`).
    Tell(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Requested,
    Queued,
    Active,
    Sent,
    Over,
}

#[derive(Debug)]
struct Flow {
    from: usize,
    to: usize,
    chunk: u64,
    /// Epochs of both ends at creation: a death ends the flow.
    epochs: (u32, u32),
    state: State,
    remaining: f64,
    rate: f64,
    /// Time `remaining` was last brought up to date (ns).
    last: u64,
    /// When the transfer became active (ns).
    started: u64,
    /// When its pending `Sent` event fires (ns).
    due: u64,
    /// Marks membership in the set being re-rated.
    mark: u32,
    version: u32,
}

struct Node {
    spec: NodeSpec,
    alive: bool,
    epoch: u32,
    sched: Option<Scheduler>,
    held: ChunkSet,
    queue: VecDeque<usize>,
    ups: Vec<usize>,
    downs: Vec<usize>,
    /// Transfers to this node not yet over (stale entries pruned lazily).
    open: Vec<usize>,
    /// Peers this node's scheduler dropped.
    dropped: Vec<PeerId>,
    /// The product's slow-peer detector, fed with each peer transfer.
    speed: policy::SlowPeerDetector,
    report: NodeReport,
    /// With a topology: the receivers it is linked to now, and whether the
    /// source is its peer.
    links: Vec<usize>,
    fed: bool,
}

struct Sim {
    setup: Setup,
    nodes: Vec<Node>,
    flows: Vec<Flow>,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    now: u64,
    events: u64,
    /// When the source last finished an upload (ns).
    source_done: u64,
    /// Current mark for `Flow::mark`.
    stamp: u32,
    /// Largest receiver latency: announcements take `latency(sender)` plus this.
    max_latency: f64,
    /// The source's topology, if the links are bounded.
    topo: Option<Topology>,
    /// Topology actions on their way to a receiver: (receiver, its epoch
    /// when sent, action).
    told: Vec<(usize, u32, topology::Action)>,
    /// Topology events on their way to the source.
    tell: Vec<topology::Event>,
}

/// Runs one simulation to the end (every live receiver complete or stuck, or
/// `until`).
pub fn run(setup: Setup) -> Report {
    let n = setup.receivers.len();
    let len = setup.chunks;
    let mut nodes = Vec::with_capacity(n + 1);
    for (i, spec) in std::iter::once(setup.source)
        .chain(setup.receivers.iter().copied())
        .enumerate()
    {
        nodes.push(Node {
            spec,
            alive: true,
            epoch: 0,
            sched: None,
            held: if i == 0 {
                ChunkSet::full(len)
            } else {
                ChunkSet::empty(len)
            },
            queue: VecDeque::new(),
            ups: Vec::new(),
            downs: Vec::new(),
            open: Vec::new(),
            dropped: Vec::new(),
            speed: policy::SlowPeerDetector::default(),
            report: NodeReport::default(),
            links: Vec::new(),
            fed: false,
        });
    }
    let max_latency = setup
        .receivers
        .iter()
        .map(|s| s.latency)
        .fold(0.0, f64::max);
    let mut sim = Sim {
        setup,
        nodes,
        flows: Vec::new(),
        heap: BinaryHeap::new(),
        seq: 0,
        now: 0,
        events: 0,
        source_done: 0,
        stamp: 0,
        max_latency,
        topo: None,
        told: Vec::new(),
        tell: Vec::new(),
    };
    for i in 1..=n {
        let spec = sim.nodes[i].spec;
        if let Some(t) = spec.dies_at {
            sim.at(ns(t), Ev::Die(i));
            if let Some(t2) = spec.returns_at {
                sim.at(ns(t2.max(t)), Ev::Return(i));
            }
        }
    }
    for i in 1..=n {
        sim.start(i);
    }
    if let Some(cfg) = sim.setup.topology {
        sim.topo = Some(Topology::new(cfg, (1..=n).map(|i| i as u32)));
        sim.topology_acts();
    }
    let until = ns(sim.setup.until);
    while let Some(Reverse((t, _, ev))) = sim.heap.pop() {
        if t > until {
            break;
        }
        sim.now = t;
        sim.events += 1;
        sim.dispatch(ev);
    }
    let source_uploaded = sim.nodes[0].report.uploaded;
    let max_peers = sim.nodes[1..]
        .iter()
        .map(|n| n.report.max_peers)
        .max()
        .unwrap_or(0);
    let source_done = sim.source_done as f64 / NS;
    Report {
        nodes: sim
            .nodes
            .into_iter()
            .skip(1)
            .map(|mut n| {
                n.report.alive = n.alive;
                n.report.dropped = n.dropped;
                n.report
            })
            .collect(),
        source_uploaded,
        source_done,
        events: sim.events,
        end: sim.now as f64 / NS,
        max_peers,
    }
}

impl Sim {
    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    fn latency(&self, a: usize, b: usize) -> u64 {
        ns(self.nodes[a].spec.latency + self.nodes[b].spec.latency)
    }

    fn live(&self, f: usize) -> bool {
        let fl = &self.flows[f];
        fl.state != State::Over
            && self.nodes[fl.from].alive
            && self.nodes[fl.to].alive
            && fl.epochs == (self.nodes[fl.from].epoch, self.nodes[fl.to].epoch)
    }

    /// (Re)starts receiver `i` with the chunks it holds: a fresh scheduler
    /// that meets every live receiver, then the source (with a topology: no
    /// one until the source's actions reach it).
    fn start(&mut self, i: usize) {
        // The receiver's settings in a swarm, exactly as the agents make them.
        let cfg = if self.setup.topology.is_some() {
            policy::bounded_swarm_config(self.setup.sched, i as PeerId)
        } else {
            policy::swarm_config(self.setup.sched, i as PeerId)
        };
        let mut s = Scheduler::new(self.nodes[i].held.clone(), cfg);
        if self.setup.topology.is_some() {
            self.nodes[i].sched = Some(s);
            self.act(i);
            return;
        }
        for j in 1..self.nodes.len() {
            if j != i && self.nodes[j].alive {
                s.handle(Event::PeerJoined {
                    peer: j as PeerId,
                    has: self.nodes[j].held.clone(),
                });
            }
        }
        if self.nodes[0].alive {
            s.handle(Event::PeerJoined {
                peer: 0,
                has: self.nodes[0].held.clone(),
            });
        }
        self.nodes[i].sched = Some(s);
        self.act(i);
    }

    fn feed(&mut self, i: usize, e: Event) {
        if let Some(s) = self.nodes[i].sched.as_mut() {
            s.handle(e);
            self.act(i);
        }
    }

    /// Carries out receiver `i`'s pending actions.
    fn act(&mut self, i: usize) {
        loop {
            let Some(a) = self.nodes[i].sched.as_mut().and_then(|s| s.poll_action()) else {
                return;
            };
            match a {
                Action::Fetch { peer, chunk } => {
                    let p = peer as usize;
                    if p >= self.nodes.len() || !self.nodes[p].alive {
                        if let Some(s) = self.nodes[i].sched.as_mut() {
                            s.handle(Event::PeerGone { peer });
                        }
                        continue;
                    }
                    let f = self.flows.len();
                    self.flows.push(Flow {
                        from: p,
                        to: i,
                        chunk,
                        epochs: (self.nodes[p].epoch, self.nodes[i].epoch),
                        state: State::Requested,
                        remaining: self.setup.chunk_bytes as f64,
                        rate: 0.0,
                        last: self.now,
                        started: self.now,
                        due: 0,
                        mark: 0,
                        version: 0,
                    });
                    self.nodes[i].open.push(f);
                    let t = self.now + self.latency(i, p);
                    self.at(t, Ev::Request(f));
                }
                Action::Cancel { peer, chunk } => {
                    // Requests are few per pair; the newest match is the one.
                    let p = peer as usize;
                    if let Some(f) = self.find_flow(p, i, chunk) {
                        self.abort(f);
                    }
                }
                Action::DropPeer { peer, .. } => {
                    self.nodes[i].dropped.push(peer);
                    let p = peer as usize;
                    for f in self.open_flows(i) {
                        if self.flows[f].from == p {
                            self.abort(f);
                        }
                    }
                }
                Action::Complete => {
                    if self.nodes[i].report.done_at.is_none() {
                        self.nodes[i].report.done_at = Some(self.now as f64 / NS);
                    }
                }
                Action::Stuck(why) => self.nodes[i].report.stuck = Some(why),
            }
        }
    }

    /// Transfers to `to` that are not over.
    fn open_flows(&mut self, to: usize) -> Vec<usize> {
        let flows = &self.flows;
        self.nodes[to]
            .open
            .retain(|&f| flows[f].state != State::Over);
        self.nodes[to].open.clone()
    }

    fn find_flow(&mut self, from: usize, to: usize, chunk: u64) -> Option<usize> {
        let flows = &self.flows;
        self.nodes[to]
            .open
            .retain(|&f| flows[f].state != State::Over);
        self.nodes[to]
            .open
            .iter()
            .copied()
            .find(|&f| self.flows[f].from == from && self.flows[f].chunk == chunk)
    }

    /// Ends a transfer wherever it is.
    fn abort(&mut self, f: usize) {
        let state = self.flows[f].state;
        self.flows[f].state = State::Over;
        let (from, to) = (self.flows[f].from, self.flows[f].to);
        match state {
            State::Queued => self.nodes[from].queue.retain(|&g| g != f),
            State::Active => {
                self.detach(f);
                self.reshare(from, to);
                self.serve(from);
            }
            _ => {}
        }
    }

    fn detach(&mut self, f: usize) {
        let (from, to) = (self.flows[f].from, self.flows[f].to);
        self.nodes[from].ups.retain(|&g| g != f);
        self.nodes[to].downs.retain(|&g| g != f);
    }

    /// Recomputes the rate of every transfer at `s`'s upload and `r`'s download.
    fn reshare(&mut self, s: usize, r: usize) {
        let list: Vec<usize> = self.nodes[s]
            .ups
            .iter()
            .chain(self.nodes[r].downs.iter())
            .copied()
            .collect();
        self.rerate(list);
    }

    /// Recomputes the rate of every transfer at node `n`, both directions.
    fn reshare_node(&mut self, n: usize) {
        let list: Vec<usize> = self.nodes[n]
            .ups
            .iter()
            .chain(self.nodes[n].downs.iter())
            .copied()
            .collect();
        self.rerate(list);
    }

    /// Max-min fair rates for the transfers in `list`, by progressive
    /// filling over the links they use, holding every other transfer's rate
    /// fixed (so the result is always feasible). Transfers whose rate changes
    /// get a new completion event.
    fn rerate(&mut self, mut list: Vec<usize>) {
        self.stamp += 1;
        let stamp = self.stamp;
        list.retain(|&f| std::mem::replace(&mut self.flows[f].mark, stamp) != stamp);
        if list.is_empty() {
            return;
        }
        // Links: (node * 2 + 0 = upload, + 1 = download, free capacity, open).
        let mut links: Vec<(usize, f64, u32)> = Vec::with_capacity(list.len() * 2);
        let mut ends: Vec<(usize, usize)> = Vec::with_capacity(list.len());
        for &f in &list {
            let (from, to) = (self.flows[f].from, self.flows[f].to);
            let mut end = [0usize; 2];
            for (k, link) in [from * 2, to * 2 + 1].into_iter().enumerate() {
                end[k] = match links.iter().position(|l| l.0 == link) {
                    Some(p) => p,
                    None => {
                        let node = &self.nodes[link / 2];
                        let (cap, on) = if link % 2 == 0 {
                            (node.spec.up, &node.ups)
                        } else {
                            (node.spec.down, &node.downs)
                        };
                        let fixed: f64 = on
                            .iter()
                            .filter(|&&g| self.flows[g].mark != stamp)
                            .map(|&g| self.flows[g].rate)
                            .sum();
                        links.push((link, (cap - fixed).max(0.0), 0));
                        links.len() - 1
                    }
                };
                links[end[k]].2 += 1;
            }
            ends.push((end[0], end[1]));
        }
        let mut rate = vec![f64::NAN; list.len()];
        let mut left = list.len();
        while left > 0 {
            let Some((bottleneck, level)) = links
                .iter()
                .enumerate()
                .filter(|(_, l)| l.2 > 0)
                .map(|(i, l)| (i, l.1 / l.2 as f64))
                .min_by(|a, b| a.1.total_cmp(&b.1))
            else {
                break;
            };
            for k in 0..list.len() {
                let (u, d) = ends[k];
                if rate[k].is_nan() && (u == bottleneck || d == bottleneck) {
                    rate[k] = level;
                    left -= 1;
                    for l in [u, d] {
                        links[l].1 = (links[l].1 - level).max(0.0);
                        links[l].2 -= 1;
                    }
                }
            }
        }
        for (k, &f) in list.iter().enumerate() {
            let fl = &mut self.flows[f];
            fl.remaining = (fl.remaining - fl.rate * (self.now - fl.last) as f64 / NS).max(0.0);
            fl.last = self.now;
            let r = rate[k].max(1.0);
            if r == fl.rate && fl.version > 0 {
                continue;
            }
            fl.rate = r;
            let t = self.now + ns(fl.remaining / r);
            // A later finish keeps the pending event, which re-arms itself
            // when it fires early: fewer heap entries.
            if fl.version > 0 && t >= fl.due {
                continue;
            }
            fl.version += 1;
            fl.due = t;
            let v = fl.version;
            self.at(t, Ev::Sent(f, v));
        }
    }

    /// Starts queued requests at `s` while it has free slots.
    fn serve(&mut self, s: usize) {
        while self.nodes[s].ups.len() < self.nodes[s].spec.slots.max(1) as usize {
            let Some(f) = self.nodes[s].queue.pop_front() else {
                return;
            };
            if !self.live(f) {
                self.flows[f].state = State::Over;
                continue;
            }
            let to = self.flows[f].to;
            let fl = &mut self.flows[f];
            fl.state = State::Active;
            fl.last = self.now;
            fl.started = self.now;
            self.nodes[s].ups.push(f);
            self.nodes[to].downs.push(f);
            self.reshare(s, to);
        }
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Request(f) => {
                if self.live(f) && self.flows[f].state == State::Requested {
                    let s = self.flows[f].from;
                    let node = &self.nodes[s];
                    if node.ups.len() >= node.spec.slots.max(1) as usize
                        && node
                            .spec
                            .queue
                            .is_some_and(|q| node.queue.len() >= q as usize)
                    {
                        self.flows[f].state = State::Sent;
                        let t = self.now + self.latency(s, self.flows[f].to);
                        self.at(t, Ev::Declined(f));
                        return;
                    }
                    self.flows[f].state = State::Queued;
                    self.nodes[s].queue.push_back(f);
                    self.serve(s);
                }
            }
            Ev::Sent(f, v) => {
                let now = self.now;
                let fl = &mut self.flows[f];
                if fl.state != State::Active || fl.version != v {
                    return;
                }
                fl.remaining = (fl.remaining - fl.rate * (now - fl.last) as f64 / NS).max(0.0);
                fl.last = now;
                if fl.remaining > fl.rate * 2.0 / NS {
                    let t = now + ns(fl.remaining / fl.rate);
                    fl.due = t;
                    self.at(t, Ev::Sent(f, v));
                    return;
                }
                let (s, r) = (fl.from, fl.to);
                self.flows[f].state = State::Sent;
                self.flows[f].last = self.now;
                self.nodes[s].report.uploaded += self.setup.chunk_bytes;
                if s == 0 {
                    self.source_done = self.now;
                }
                self.detach(f);
                self.reshare(s, r);
                self.serve(s);
                let t = self.now + self.latency(s, r);
                self.at(t, Ev::Deliver(f));
            }
            Ev::Declined(f) => {
                if self.live(f) && self.flows[f].state == State::Sent {
                    self.flows[f].state = State::Over;
                    let (peer, chunk) = (self.flows[f].from as PeerId, self.flows[f].chunk);
                    self.feed(self.flows[f].to, Event::FetchFailed { peer, chunk });
                }
            }
            Ev::Deliver(f) => {
                if !self.live(f) || self.flows[f].state != State::Sent {
                    return;
                }
                self.flows[f].state = State::Over;
                let (s, r, chunk) = (self.flows[f].from, self.flows[f].to, self.flows[f].chunk);
                let peer = s as PeerId;
                if self.nodes[s].spec.corrupt {
                    self.feed(r, Event::Corrupt { peer, chunk });
                    return;
                }
                let bytes = self.setup.chunk_bytes;
                if s != 0 {
                    self.measure(r, s, f);
                }
                if self.nodes[r].held.insert(chunk) {
                    if s == 0 {
                        self.nodes[r].report.from_source += bytes;
                    } else {
                        self.nodes[r].report.from_peers += bytes;
                    }
                    let t = self.now + ns(self.nodes[r].spec.latency + self.max_latency);
                    self.at(t, Ev::Announce(r, chunk));
                }
                self.feed(r, Event::Verified { peer, chunk });
            }
            Ev::Announce(r, chunk) => {
                if !self.nodes[r].alive {
                    return;
                }
                let peer = r as PeerId;
                // Receivers that hold the chunk are not told: their scheduler
                // never looks at who holds a chunk it has. With a topology,
                // only its peers are told.
                let to: Vec<usize> = if self.topo.is_some() {
                    self.nodes[r].links.clone()
                } else {
                    (1..self.nodes.len()).filter(|&q| q != r).collect()
                };
                for q in to {
                    if self.nodes[q].alive && !self.nodes[q].held.contains(chunk) {
                        self.feed(q, Event::PeerHas { peer, chunk });
                    }
                }
            }
            Ev::Die(i) => self.die(i),
            Ev::Told(k) => self.told(k),
            Ev::Tell(k) => {
                let ev = self.tell[k].clone();
                if let Some(t) = self.topo.as_mut() {
                    t.handle(ev);
                }
                self.topology_acts();
            }
            Ev::Return(i) => {
                if self.nodes[i].alive {
                    return;
                }
                self.nodes[i].alive = true;
                self.nodes[i].epoch += 1;
                self.nodes[i].report.done_at = None;
                self.nodes[i].report.stuck = None;
                if self.topo.is_some() {
                    // It reconnects to the source, which links it anew.
                    self.start(i);
                    let t = self.now + self.latency(i, 0);
                    self.tell(t, topology::Event::Joined(i as u32));
                    return;
                }
                let has = self.nodes[i].held.clone();
                for q in 1..self.nodes.len() {
                    if q != i && self.nodes[q].alive {
                        self.feed(
                            q,
                            Event::PeerJoined {
                                peer: i as PeerId,
                                has: has.clone(),
                            },
                        );
                    }
                }
                self.start(i);
            }
        }
    }

    /// Feeds the product's slow-peer detector ([`policy::SlowPeerDetector`])
    /// with one transfer of peer `s` to `r`; the first time it flags `s`, the
    /// scheduler is told, as the agents' receive loop does.
    fn measure(&mut self, r: usize, s: usize, f: usize) {
        let fl = &self.flows[f];
        let took = std::time::Duration::from_nanos(fl.last.max(fl.started + 1) - fl.started);
        let bytes = self.setup.chunk_bytes;
        if self.nodes[r].speed.record(s as PeerId, bytes, took) {
            self.nodes[r].report.slow.push(s as PeerId);
            self.feed(r, Event::PeerSlow { peer: s as PeerId });
            if self.topo.is_some() {
                let t = self.now + self.latency(r, 0);
                let (reporter, peer) = (r as u32, s as u32);
                self.tell(t, topology::Event::Slow { reporter, peer });
            }
        }
    }

    fn die(&mut self, i: usize) {
        if !self.nodes[i].alive {
            return;
        }
        self.nodes[i].alive = false;
        self.nodes[i].sched = None;
        let mut touched = Vec::new();
        let ups = std::mem::take(&mut self.nodes[i].ups);
        let downs = std::mem::take(&mut self.nodes[i].downs);
        for f in ups.into_iter().chain(downs) {
            let (s, r) = (self.flows[f].from, self.flows[f].to);
            self.flows[f].state = State::Over;
            self.nodes[s].ups.retain(|&g| g != f);
            self.nodes[r].downs.retain(|&g| g != f);
            touched.push(if s == i { r } else { s });
        }
        let queued: Vec<usize> = std::mem::take(&mut self.nodes[i].queue).into();
        for f in queued {
            self.flows[f].state = State::Over;
        }
        for n in touched {
            self.reshare_node(n);
            self.serve(n);
        }
        if self.topo.is_some() {
            // Its peers see their links break; the source hears later.
            self.nodes[i].fed = false;
            for q in std::mem::take(&mut self.nodes[i].links) {
                self.nodes[q].links.retain(|&x| x != i);
                self.feed(q, Event::PeerGone { peer: i as PeerId });
            }
            let t = self.now + self.latency(i, 0);
            self.tell(t, topology::Event::Gone(i as u32));
            return;
        }
        for q in 1..self.nodes.len() {
            if q != i && self.nodes[q].alive {
                self.feed(q, Event::PeerGone { peer: i as PeerId });
            }
        }
    }

    fn tell(&mut self, t: u64, ev: topology::Event) {
        self.tell.push(ev);
        let k = self.tell.len() - 1;
        self.at(t, Ev::Tell(k));
    }

    /// Sends the topology's pending actions to the receivers concerned, one
    /// latency away.
    fn topology_acts(&mut self) {
        while let Some(a) = self.topo.as_mut().and_then(|t| t.poll_action()) {
            let to: Vec<usize> = match a {
                topology::Action::Link { a, b } | topology::Action::Unlink { a, b } => {
                    vec![a as usize, b as usize]
                }
                topology::Action::Feed { node, .. } | topology::Action::Unfeed { node } => {
                    vec![node as usize]
                }
            };
            for n in to {
                self.told.push((n, self.nodes[n].epoch, a.clone()));
                let k = self.told.len() - 1;
                let t = self.now + self.latency(0, n);
                self.at(t, Ev::Told(k));
            }
        }
    }

    /// Receiver `n` applies a topology action, as its runtime would: links
    /// are made (each end meets the other with its bitfield) or broken, and
    /// the source becomes its peer or stops being one.
    fn told(&mut self, k: usize) {
        let (n, epoch, ref a) = self.told[k];
        if !self.nodes[n].alive || self.nodes[n].epoch != epoch {
            return;
        }
        match a.clone() {
            topology::Action::Link { a, b } => {
                let other = (a + b) as usize - n;
                if !self.nodes[other].alive || self.nodes[n].links.contains(&other) {
                    return;
                }
                self.nodes[n].links.push(other);
                let d = self.nodes[n].links.len();
                let r = &mut self.nodes[n].report;
                r.max_peers = r.max_peers.max(d);
                let has = self.nodes[other].held.clone();
                let peer = other as PeerId;
                self.feed(n, Event::PeerJoined { peer, has });
            }
            topology::Action::Unlink { a, b } => {
                let other = (a + b) as usize - n;
                if !self.nodes[n].links.contains(&other) {
                    return;
                }
                self.nodes[n].links.retain(|&x| x != other);
                self.cut(other, n);
                self.feed(
                    n,
                    Event::PeerGone {
                        peer: other as PeerId,
                    },
                );
            }
            topology::Action::Feed { homes, .. } => {
                self.nodes[n].report.fed = true;
                self.feed(n, Event::Homes(homes));
                if !self.nodes[n].fed && self.nodes[0].alive {
                    self.nodes[n].fed = true;
                    let has = self.nodes[0].held.clone();
                    self.feed(n, Event::PeerJoined { peer: 0, has });
                }
            }
            topology::Action::Unfeed { .. } => {
                if self.nodes[n].fed {
                    self.nodes[n].fed = false;
                    self.feed(n, Event::Homes(scheduler::Homes::default()));
                    self.cut(0, n);
                    self.feed(n, Event::PeerGone { peer: 0 });
                }
            }
        }
    }

    /// Aborts every transfer from `from` to `to` (their link is gone).
    fn cut(&mut self, from: usize, to: usize) {
        for f in self.open_flows(to) {
            if self.flows[f].from == from {
                self.abort(f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: u64 = 4 << 20;
    /// 10 Gb/s.
    const RATE: f64 = 1.25e9;
    const LATENCY: f64 = 50e-6;
    const CHUNKS: u64 = 256;

    /// The base settings an agent's receiver starts from; the simulator
    /// turns them into a swarm member's with the product's policy.
    fn sched() -> scheduler::Config {
        scheduler::Config::default()
    }

    fn node(rate: f64) -> NodeSpec {
        NodeSpec {
            slots: 6,
            queue: Some(1),
            ..NodeSpec::link(rate, LATENCY)
        }
    }

    fn setup(receivers: Vec<NodeSpec>) -> Setup {
        Setup {
            chunks: CHUNKS,
            chunk_bytes: CHUNK,
            source: NodeSpec {
                slots: 8,
                queue: None,
                ..node(RATE)
            },
            receivers,
            sched: sched(),
            until: 3600.0,
            topology: None,
        }
    }

    fn equal(n: usize) -> Setup {
        setup(vec![node(RATE); n])
    }

    /// max(S/B_src_up, S/B_down of receiver `i`, N·S/ΣB_up), seconds.
    fn bound(s: &Setup, i: usize) -> f64 {
        let bytes = (s.chunks * s.chunk_bytes) as f64;
        let up: f64 = s.source.up + s.receivers.iter().map(|r| r.up).sum::<f64>();
        (bytes / s.source.up)
            .max(bytes / s.receivers[i].down)
            .max(s.receivers.len() as f64 * bytes / up)
    }

    fn source_multiple(s: &Setup, r: &Report) -> f64 {
        r.source_uploaded as f64 / (s.chunks * s.chunk_bytes) as f64
    }

    /// Worst completion among `nodes` (receiver indices), each as a multiple
    /// of its own bound.
    fn worst(s: &Setup, r: &Report, nodes: impl Iterator<Item = usize>) -> f64 {
        nodes
            .map(|i| {
                let n = &r.nodes[i];
                assert_eq!(n.stuck, None, "receiver {i} stuck");
                let t = n
                    .done_at
                    .unwrap_or_else(|| panic!("receiver {i} never completed"));
                t / bound(s, i)
            })
            .fold(0.0, f64::max)
    }

    fn timed(s: &Setup) -> (Report, std::time::Duration) {
        let started = std::time::Instant::now();
        let r = run(s.clone());
        (r, started.elapsed())
    }

    fn check_equal(n: usize, limit: f64) {
        let s = equal(n);
        let (r, took) = timed(&s);
        let ratio = worst(&s, &r, 0..n);
        let src = source_multiple(&s, &r);
        eprintln!(
            "equal links, N={n}, S={CHUNKS}: slowest receiver {ratio:.3} x LB, \
             source uploaded {src:.3} x S ({} events, {took:.2?})",
            r.events
        );
        assert!(ratio <= limit, "N={n}: {ratio:.3} x LB > {limit}");
        assert!(src <= 1.3, "N={n}: source uploaded {src:.3} x S");
        // Equal links: the detector may misfire, but rarely (N=256: 3 of
        // 65280 receiver-peer pairs).
        let reports: usize = r.nodes.iter().map(|x| x.slow.len()).sum();
        eprintln!("N={n}: {reports} slow-peer reports");
        assert!(reports <= n / 16, "{reports} slow-peer reports");
    }

    #[test]
    fn equal_links_4() {
        check_equal(4, 1.15);
    }

    #[test]
    fn equal_links_16() {
        check_equal(16, 1.15);
    }

    // The agents' policy (engine::policy) measures 1.186 here. The bound
    // this test held before, 1.15, was met by a simulator-only policy
    // (seed window 1, 6 in flight, its own slow-peer detector) that the
    // agents never ran; the simulation is deterministic, so this is a
    // regression guard at the measured figure, and the scheduler work of
    // the bounded-degree issue takes it back to 1.15.
    #[test]
    fn equal_links_64() {
        check_equal(64, 1.19);
    }

    // 1.260 measured with the agents' policy (1.19 with the simulator's
    // own, before they were one). The target is 1.15; what is left is mostly the start:
    // the source's 8 slots release the first chunks 8 at a time, and each
    // receiver serves a new chunk to 6 others at once (1/6 of its upload
    // each), so the first copies multiply by 7 every 6 chunk times and it
    // takes some 25 chunk times before every receiver has work for its
    // links; with 256 chunks that alone is 10% of the bound.
    #[test]
    fn equal_links_256() {
        check_equal(256, 1.27);
    }

    #[test]
    fn a_slow_node_holds_nobody_back() {
        let n = 16;
        let mut receivers = vec![node(RATE); n];
        receivers[0] = node(RATE / 4.0);
        let s = setup(receivers);
        let (r, took) = timed(&s);
        let others = worst(&s, &r, 1..n);
        let slow = worst(&s, &r, 0..1);
        eprintln!(
            "one 4x slower node, N={n}: others {others:.3} x their bound, \
             slow node {slow:.3} x its bound, source {:.3} x S ({took:.2?})",
            source_multiple(&s, &r)
        );
        // 1.178 with the agents' policy (see equal_links_64).
        assert!(others <= 1.18, "others {others:.3}");
        // Node 1 (receiver 0) is the slow one; nobody else is reported.
        assert!(r.nodes.iter().all(|x| x.slow.iter().all(|&p| p == 1)));
        let reporters = r.nodes.iter().filter(|x| x.slow == [1]).count();
        eprintln!(
            "the slow node was reported by {reporters} of {} receivers",
            n - 1
        );
        // The agents' detector waits for 4 samples at a third of the mean
        // (the simulator's own took 2 at half): fewer receivers report the
        // node, which still holds nobody back (above).
        assert!(
            reporters >= n / 4,
            "only {reporters} reported the slow node"
        );
    }

    /// Kills a tenth of `s`'s receivers at random times in the middle of
    /// the transfer (bound `lb`); the first killed comes back near the end.
    fn a_tenth_die_and_one_returns(s: &mut Setup, lb: f64, seed: u64) -> (Vec<usize>, usize) {
        let n = s.receivers.len();
        let mut rng = XorShift::new(seed);
        let mut dead = Vec::new();
        while dead.len() < n / 10 {
            let i = rng.below(n as u64) as usize;
            if !dead.contains(&i) {
                dead.push(i);
                s.receivers[i].dies_at = Some(lb * (0.2 + 0.6 * rng.unit()));
            }
        }
        let back = dead[0];
        s.receivers[back].returns_at = Some(lb * 0.9);
        (dead, back)
    }

    #[test]
    fn a_tenth_of_the_nodes_die_and_one_returns() {
        let n = 64;
        let mut s = equal(n);
        let lb = bound(&s, 0);
        let (dead, back) = a_tenth_die_and_one_returns(&mut s, lb, 11);
        let (r, took) = timed(&s);
        let survivors = worst(&s, &r, (0..n).filter(|i| !dead.contains(i)));
        let returned = worst(&s, &r, std::iter::once(back));
        eprintln!(
            "{} of {n} die mid-transfer: survivors {survivors:.3} x LB, the returning \
             node {returned:.3} x LB, source {:.3} x S ({took:.2?})",
            dead.len(),
            source_multiple(&s, &r)
        );
        assert!(survivors <= 1.3, "survivors {survivors:.3}");
        for &i in &dead[1..] {
            assert!(!r.nodes[i].alive);
        }
    }

    #[test]
    fn a_corrupting_peer_is_dropped_and_everyone_completes() {
        let n = 16;
        let mut s = equal(n);
        s.receivers[5].corrupt = true;
        let (r, took) = timed(&s);
        let all = worst(&s, &r, 0..n);
        let droppers = r.nodes.iter().filter(|x| x.dropped.contains(&6)).count();
        eprintln!(
            "one corrupting peer, N={n}: {droppers} receivers dropped it, slowest \
             {all:.3} x LB ({took:.2?})"
        );
        assert!(droppers > 0);
        assert!(r.nodes.iter().all(|x| x.dropped.iter().all(|&p| p == 6)));
    }

    /// Equal links, `n` receivers, links and feeders as the source's
    /// topology decides (K = 8, 16 feeders).
    fn bounded(n: usize, chunks: u64) -> Setup {
        Setup {
            chunks,
            topology: Some(topology::Config::default()),
            ..equal(n)
        }
    }

    /// Checks the degree bound on every receiver; returns the most links seen.
    fn degree_held(r: &Report) -> usize {
        let k = topology::DEFAULT_DEGREE as usize;
        for (i, x) in r.nodes.iter().enumerate() {
            assert!(
                x.max_peers <= k,
                "receiver {i}: {} links > {k}",
                x.max_peers
            );
        }
        assert_eq!(
            r.max_peers,
            r.nodes.iter().map(|x| x.max_peers).max().unwrap()
        );
        r.max_peers
    }

    fn check_bounded(n: usize, chunks: u64, limit: f64) {
        let s = bounded(n, chunks);
        let (r, took) = timed(&s);
        let ratio = worst(&s, &r, 0..n);
        let src = source_multiple(&s, &r);
        let k = degree_held(&r);
        let fed = r.nodes.iter().filter(|x| x.fed).count();
        eprintln!(
            "bounded degree, N={n}, S={chunks}: slowest receiver {ratio:.3} x LB, \
             source uploaded {src:.3} x S, at most {k} peers, {fed} fed \
             ({} events, {took:.2?})",
            r.events
        );
        // Every receiver lags by about the same: the depth of the swarm.
        let lb = bound(&s, 0);
        let first = r
            .nodes
            .iter()
            .filter_map(|x| x.done_at)
            .fold(f64::MAX, f64::min);
        eprintln!(
            "N={n}: first receiver done at {:.3} x LB, source done at {:.3} x LB",
            first / lb,
            r.source_done / lb
        );
        assert!(ratio <= limit, "N={n}: {ratio:.3} x LB > {limit}");
        assert!(src <= 1.3, "N={n}: source uploaded {src:.3} x S");
        assert_eq!(fed, topology::DEFAULT_FEEDERS as usize);
    }

    /// Chunks in the bounded-degree runs. Every receiver finishes some 35
    /// to 45 chunk-times after the bound (the swarm's depth: a chunk
    /// crosses the source's link, then 3 or 4 receivers' links shared 6
    /// ways, before the farthest receiver has it; the first receiver is
    /// done at 1.08 x), and the slowest a few more: with 256 chunks that was
    /// 1.17 x (N = 256) and 1.20 x (N = 1,024), with 384 1.144 x and
    /// 1.153 x (both before a seed request counted toward a feeder's
    /// `max_in_flight`); now with 512 1.125 x and 1.152 x, with 640
    /// (N = 1,024) 1.140 x. The tail moves by about 0.01 x from one chunk
    /// count to the next.
    const BOUNDED_CHUNKS: u64 = 512;

    // 1.125 x LB measured, source 1.002 x S, 32 feeders, at most 8 peers.
    #[test]
    fn bounded_degree_256() {
        check_bounded(256, BOUNDED_CHUNKS, 1.15);
    }

    // 1.140 x LB measured, source 1.003 x S (1.152 x with 512 chunks). The slowest test here: 5 million events, 15-28 s
    // in debug on a shared 2-core machine.
    #[test]
    fn bounded_degree_1024() {
        check_bounded(1024, 640, 1.15);
    }

    #[test]
    fn bounded_degree_a_tenth_die() {
        let n = 256;
        let mut s = bounded(n, CHUNKS);
        let lb = bound(&s, 0);
        let (dead, back) = a_tenth_die_and_one_returns(&mut s, lb, 7);
        let (r, took) = timed(&s);
        let survivors = worst(&s, &r, (0..n).filter(|i| !dead.contains(i)));
        let returned = worst(&s, &r, std::iter::once(back));
        let src = source_multiple(&s, &r);
        let k = degree_held(&r);
        let dead_feeders = dead.iter().filter(|&&i| r.nodes[i].fed).count();
        eprintln!(
            "bounded degree, {} of {n} die ({dead_feeders} of them feeders): survivors \
             {survivors:.3} x LB, the returning node {returned:.3} x LB, source \
             {src:.3} x S, at most {k} peers ({took:.2?})",
            dead.len()
        );
        assert!(survivors <= 1.3, "survivors {survivors:.3}");
        assert!(src <= 1.3, "source uploaded {src:.3} x S");
        assert!(dead_feeders > 0, "no feeder died: the test proves less");
        for &i in &dead[1..] {
            assert!(!r.nodes[i].alive);
        }
    }
}
