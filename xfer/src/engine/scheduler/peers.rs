//! The scheduler's bookkeeping of peers and chunks: joins and departures,
//! announcements and withdrawals, chunk rarity buckets and homes.

use xfer_proto::chunkset::ChunkSet;

use super::{rendezvous, Action, Peer, PeerId, Scheduler, NONE};

impl Scheduler {
    pub(super) fn join(&mut self, peer: PeerId, has: ChunkSet) {
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
    pub(super) fn homeable(&self, id: PeerId) -> bool {
        Some(id) == self.cfg.me
            || self.slot(id).is_some_and(|i| {
                let p = &self.peers[i];
                p.alive && !p.seed && p.strikes == 0 && !p.slow
            })
    }

    /// Recomputes every chunk's home: its roster receiver (chunk number modulo
    /// the roster, so homes are balanced) while that one is homeable, else
    /// the homeable receiver with the highest rendezvous hash.
    pub(super) fn rehome(&mut self) {
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
    pub(super) fn note(&mut self, chunk: u64) -> bool {
        let new = self.known.insert(chunk);
        self.seen += new as u64;
        new
    }

    /// Whether the chunk came from a live seed (which a settle may use).
    pub(super) fn peer_has(&mut self, peer: PeerId, chunk: u64) -> bool {
        let Some(i) = self.slot(peer) else {
            return false;
        };
        let asked = usize::try_from(chunk)
            .ok()
            .filter(|&c| c < self.owner.len())
            .is_some_and(|c| self.owner[c] == i as u32 || self.dup[c] == i as u32);
        if asked {
            self.reannounced.insert((i as u32, chunk));
        }
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

    /// A fetch of `chunk` from `peer` failed without data: the request
    /// ends, and a partial peer that declined (busy) is left alone for a
    /// while (see `Peer::refused`).
    pub(super) fn failed_fetch(&mut self, peer: PeerId, chunk: u64) {
        self.finish_request(peer, chunk);
        if let Some(i) = self.slot(peer) {
            if !self.peers[i].seed {
                self.peers[i].refused = self.epoch;
                self.peers[i].refused_until = self.verified + 2 * self.peers.len() as u64;
            }
        }
    }

    /// Partial peer `peer` said it does not hold `chunk`: forget that it
    /// did, until it announces it again.
    pub(super) fn peer_lacks(&mut self, peer: PeerId, chunk: u64) {
        let Some(i) = self.slot(peer) else {
            return;
        };
        let p = &mut self.peers[i];
        if p.seed || chunk >= p.has.capacity() || !p.has.contains(chunk) {
            return;
        }
        p.has.remove(chunk);
        self.holders[chunk as usize].retain(|&h| h as usize != i);
        self.rebucket(chunk);
    }

    /// The growing source withdrew `first..end`: nobody holds them now.
    pub(super) fn withdraw(&mut self, first: u64, end: u64) {
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
    pub(super) fn seed_has(&self, chunk: u64) -> bool {
        !self.cfg.growing
            || self
                .peers
                .iter()
                .any(|p| p.alive && p.seed && p.has.contains(chunk))
    }

    pub(super) fn slot(&self, id: PeerId) -> Option<usize> {
        match self.direct.get(id as usize) {
            Some(&i) => (i != NONE).then_some(i as usize),
            None => self.index.get(&id).copied(),
        }
    }

    pub(super) fn set_slot(&mut self, id: PeerId, i: usize) {
        if id < 1 << 16 {
            if self.direct.len() <= id as usize {
                self.direct.resize(id as usize + 1, NONE);
            }
            self.direct[id as usize] = i as u32;
        } else {
            self.index.insert(id, i);
        }
    }

    pub(super) fn unbucket(&mut self, chunk: u64) {
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
    pub(super) fn rebucket(&mut self, chunk: u64) {
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

    pub(super) fn remove_peer(&mut self, i: usize) {
        let p = &mut self.peers[i];
        if !p.alive {
            return;
        }
        p.alive = false;
        let seed = p.seed;
        self.live_seeds -= seed as u32;
        self.reannounced.retain(|&(slot, _)| slot as usize != i);
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
}
