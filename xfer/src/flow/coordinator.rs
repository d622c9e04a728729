//! The source's side of a swarm's peer graph: one [`Topology`] (the
//! sans-IO policy the simulator drives too) fed with what the source
//! learns (a receiver is gone, a receiver found a peer slow), and its
//! actions sent to the receivers concerned on their control streams
//! (`Links`, `Feed`). Each receiver starts from [`Coordinator::swarm_for`]:
//! its first peers and, if it feeds from the source, its home chunks.
//!
//! It also keeps the source's [`SeedLedger`]: every chunk request a
//! receiver makes of the source passes [`SeedGate`] first, which holds a
//! second copy of a chunk while its first holder lives (super-seeding).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{mpsc, Notify};

use crate::engine::seeding::{SeedLedger, Verdict};
use crate::engine::topology::{self, Action, Event, Topology};
use crate::transport::Admission;
use xfer_proto::hash::Hash;
use xfer_proto::transfer::{HomeSlots, SwarmPeer, TransferMsg};

/// Coordinates the peer graph of one push.
pub struct Coordinator {
    topo: Mutex<Topology>,
    ledger: Mutex<SeedLedger>,
    /// Told when the ledger frees chunks (a first holder was lost).
    freed: Notify,
    /// The ledger's clock starts here.
    started: Instant,
    /// By peer id - 1.
    members: Vec<SwarmPeer>,
    outboxes: Vec<mpsc::UnboundedSender<TransferMsg>>,
    /// Connections each peer link opens (told in every `Swarm`).
    connections: u32,
}

impl Coordinator {
    /// The graph of `members` (ids 1..=N in order) with at most `degree`
    /// links each, seeded by the model's `root` (so a re-run draws the
    /// same graph), for a model of `chunks` chunks; returns it and each
    /// member's outbox, to drain onto its control stream.
    pub fn new(
        members: Vec<SwarmPeer>,
        degree: u32,
        connections: u32,
        root: Hash,
        chunks: u64,
    ) -> (Coordinator, Vec<mpsc::UnboundedReceiver<TransferMsg>>) {
        let seed = u64::from_le_bytes(root.0[..8].try_into().expect("32-byte hash"));
        let cfg = topology::Config {
            degree,
            seed,
            ..Default::default()
        };
        let mut topo = Topology::new(cfg, members.iter().map(|m| m.id));
        // The start is told whole in each `Swarm`.
        while topo.poll_action().is_some() {}
        let (outboxes, inboxes) = members.iter().map(|_| mpsc::unbounded_channel()).unzip();
        (
            Coordinator {
                topo: Mutex::new(topo),
                ledger: Mutex::new(SeedLedger::new(chunks, SeedLedger::DEFAULT_PATIENCE)),
                freed: Notify::new(),
                started: Instant::now(),
                members,
                outboxes,
                connections,
            },
            inboxes,
        )
    }

    fn member(&self, id: u32) -> Option<&SwarmPeer> {
        self.members.get((id as usize).checked_sub(1)?)
    }

    /// The `Swarm` that starts member `id`: its peers (and itself, for its
    /// label) and its homes if it feeds from the source.
    pub fn swarm_for(&self, id: u32) -> TransferMsg {
        let topo = self.topo.lock().unwrap();
        let mut peers: Vec<SwarmPeer> = topo
            .peers(id)
            .into_iter()
            .filter_map(|p| self.member(p).cloned())
            .collect();
        peers.extend(self.member(id).cloned());
        TransferMsg::Swarm {
            me: id,
            peers,
            homes: homes(topo.homes(id)),
            bounded: self.members.len() > topo.config().degree as usize + 1,
            connections: self.connections,
        }
    }

    /// Member `id`'s control connection is gone (it failed or was lost).
    pub fn gone(&self, id: u32) {
        self.lost(id);
        self.handle(Event::Gone(id));
    }

    /// What the source's first copies to `id` were worth is gone: second
    /// copies of them may go out now.
    fn lost(&self, id: u32) {
        if self.ledger.lock().unwrap().lost(id) {
            self.freed.notify_waiters();
        }
    }

    /// Waits until the source may serve `chunk` to member `id`.
    async fn admit(&self, id: u32, chunk: u64) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let verdict = {
                let now = self.started.elapsed();
                self.ledger.lock().unwrap().ask(id, chunk, now)
            };
            match verdict {
                Verdict::Serve => return,
                Verdict::Wait { until } => {
                    let deadline = tokio::time::Instant::from_std(self.started + until);
                    tokio::select! {
                        _ = freed => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
            }
        }
    }

    /// The source withdrew `chunks` (a streamed file failed its Hub hash):
    /// requests held back for them go out as first copies of the next
    /// download's, whoever got the withdrawn ones.
    pub fn withdrawn(&self, chunks: std::ops::Range<u64>) {
        if self.ledger.lock().unwrap().forget(chunks) {
            self.freed.notify_waiters();
        }
    }

    /// Member `id` is back (a restarted agent offered the transfer again):
    /// it is linked in anew; its `Swarm` is [`Self::swarm_for`] again.
    pub fn rejoined(&self, id: u32) {
        if self.member(id).is_some() {
            self.ledger.lock().unwrap().mend(id);
            self.handle(Event::Joined(id));
        }
    }

    /// Member `reporter` could not link to `peer` at all: it is served
    /// what `peer` holds first without waiting, from now on, and the graph
    /// moves them apart where it can. `peer` is not slow for the others.
    /// A peer the source has lost itself (dead, or not up yet) is not
    /// cut: its chunks are freed already, and a pair cut before a late
    /// node is up would let second copies of everything it later holds
    /// first go out (measured: the source at 1.31 × S with churn).
    pub fn unreachable(&self, reporter: u32, peer: u32) {
        let live = self.topo.lock().unwrap().is_live(peer);
        if live && self.member(peer).is_some() && self.member(reporter).is_some() {
            if self.ledger.lock().unwrap().cut(reporter, peer) {
                self.freed.notify_waiters();
            }
            self.handle(Event::Cut { reporter, peer });
        }
    }

    /// Member `reporter` found its link to `peer` far slower than others.
    pub fn slow(&self, reporter: u32, peer: u32) {
        if self.member(peer).is_some() {
            self.lost(peer);
            self.handle(Event::Slow { reporter, peer });
        }
    }

    /// Member `reporter` excluded the peer at `addr` (it served corrupt
    /// chunks): to the graph that peer is as slow as can be, so it stops
    /// feeding and its homes go to another.
    pub fn dropped(&self, reporter: u32, addr: std::net::SocketAddr) {
        if let Some(m) = self
            .members
            .iter()
            .find(|m| m.addr == addr || m.fallback == Some(addr))
        {
            self.lost(m.id);
            self.handle(Event::Slow {
                reporter,
                peer: m.id,
            });
        }
    }

    fn handle(&self, event: Event) {
        let mut topo = self.topo.lock().unwrap();
        topo.handle(event);
        while let Some(action) = topo.poll_action() {
            match action {
                Action::Link { a, b } => {
                    self.tell_link(a, b, true);
                    self.tell_link(b, a, true);
                }
                Action::Unlink { a, b } => {
                    self.tell_link(a, b, false);
                    self.tell_link(b, a, false);
                }
                Action::Feed { node, homes: h } => self.tell(node, TransferMsg::Feed(homes(h))),
                Action::Unfeed { node } => self.tell(node, TransferMsg::Feed(None)),
            }
        }
    }

    fn tell_link(&self, to: u32, peer: u32, up: bool) {
        let msg = match (up, self.member(peer)) {
            (true, Some(p)) => TransferMsg::Links {
                add: vec![p.clone()],
                remove: Vec::new(),
            },
            (false, _) => TransferMsg::Links {
                add: Vec::new(),
                remove: vec![peer],
            },
            (true, None) => return,
        };
        self.tell(to, msg);
    }

    fn tell(&self, to: u32, msg: TransferMsg) {
        if let Some(out) = (to as usize)
            .checked_sub(1)
            .and_then(|i| self.outboxes.get(i))
        {
            let _ = out.send(msg);
        }
    }
}

/// The source's gate for member `id`'s chunk requests: the ledger's
/// verdict, waited out.
pub struct SeedGate {
    /// The swarm's coordinator.
    pub coordinator: Arc<Coordinator>,
    /// The member asking.
    pub id: u32,
}

impl Admission for SeedGate {
    fn admit(&self, chunk: u64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.coordinator.admit(self.id, chunk))
    }
}

/// The wire form of a receiver's homes; none when it owns no slot.
fn homes(h: crate::engine::scheduler::Homes) -> Option<HomeSlots> {
    (!h.slots.is_empty()).then_some(HomeSlots {
        of: h.of,
        slots: h.slots,
    })
}
