//! Choosing requests: which chunk to ask of which peer, within the
//! windows, from partial peers first, then the seed, then duplicates in
//! the endgame; and when the transfer is complete or stuck.

use super::{mix, Action, Peer, PeerId, Scheduler, StuckReason, NONE};

impl Scheduler {
    pub(super) fn room(&self) -> bool {
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

    pub(super) fn window(&self, p: &Peer) -> u32 {
        if p.seed && self.cfg.seed_window > 0 {
            self.cfg.seed_window
        } else {
            self.cfg.window
        }
    }

    pub(super) fn request(&mut self, chunk: u64, peer: u32) {
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

    pub(super) fn release(&mut self, peer: u32) {
        self.requests -= 1;
        let p = &mut self.peers[peer as usize];
        p.in_flight -= 1;
        if !p.seed {
            self.peer_requests -= 1;
        }
    }

    /// Ends the request for `chunk` from `peer`, if there is one.
    pub(super) fn finish_request(&mut self, peer: PeerId, chunk: u64) {
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
        self.reannounced.remove(&(i, chunk));
        self.rebucket(chunk);
    }

    pub(super) fn stop(&mut self, reason: StuckReason) {
        if !self.finished {
            self.finished = true;
            self.actions.push_back(Action::Stuck(reason));
        }
    }

    /// Among live seeds (or partial peers) other than `not` that hold `chunk`
    /// and have room, the one with the fewest of our requests (rotating among
    /// equals).
    pub(super) fn holder(&mut self, chunk: u64, seeds: bool, not: u32) -> Option<u32> {
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
    pub(super) fn fill_from_peers(&mut self, full: bool) {
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
    pub(super) fn best_from(&mut self, i: usize) -> Option<u64> {
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
    pub(super) fn pick_from_seed(&mut self, any: bool) -> Option<(u64, u32)> {
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
    pub(super) fn pick_duplicate(&mut self) -> Option<(u64, u32)> {
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
    pub(super) fn settle(&mut self) {
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
