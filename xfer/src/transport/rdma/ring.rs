//! The RDMA ring protocol, sans-IO: which slot of the fetching node's
//! receive ring a chunk goes to, how completions are matched to requests,
//! and how the sending node spreads writes over its queue pairs with
//! selective signalling. No verbs, no sockets: events in, decisions out.
//!
//! Flow control is by credit: the fetching node owns every slot of its
//! ring until it names one in a request ([`RecvRing::grant`]); the sender
//! writes only into the slot a request names, once; the slot comes back to
//! the fetching node when the write lands ([`RecvRing::landed`]) and is
//! granted again only after its bytes were copied out
//! ([`RecvRing::release`]). The immediate value carries the slot and a
//! generation, so a write that arrives for an older use of a slot (after a
//! reconnect) is caught instead of being taken for the current one.

use std::collections::VecDeque;

use xfer_proto::manifest::ChunkId;

/// The shape of a receive ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    /// Number of slots.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_size: u32,
}

impl RingLayout {
    /// Byte offset of `slot` in the ring.
    pub fn offset(&self, slot: u32) -> u64 {
        u64::from(slot) * u64::from(self.slot_size)
    }

    /// The ring's size in bytes.
    pub fn len(&self) -> u64 {
        self.offset(self.slots)
    }

    /// Whether the ring has no slot.
    pub fn is_empty(&self) -> bool {
        self.slots == 0
    }
}

/// The immediate value of a write: slot in the low 16 bits, generation in
/// the high 16.
pub fn imm(slot: u32, generation: u16) -> u32 {
    (u32::from(generation) << 16) | (slot & 0xffff)
}

fn split_imm(imm: u32) -> (u32, u16) {
    (imm & 0xffff, (imm >> 16) as u16)
}

/// A slot handed to the sender for one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The slot to write into.
    pub slot: u32,
    /// The immediate value the write must carry.
    pub imm: u32,
}

/// A write that landed, matched to its request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Landed {
    /// The slot it landed in.
    pub slot: u32,
    /// The chunk it holds.
    pub chunk: ChunkId,
    /// Its length in bytes.
    pub len: u32,
}

/// A completion or request that breaks the protocol.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    #[error("chunk of {len} bytes does not fit a {slot_size}-byte ring slot")]
    /// The chunk is larger than a slot.
    TooLarge {
        /// The chunk's length.
        len: u32,
        /// The slot's size.
        slot_size: u32,
    },
    #[error("write for slot {slot}, which the ring does not have")]
    /// A write names a slot past the ring's end.
    NoSuchSlot {
        /// The slot named.
        slot: u32,
    },
    #[error("write for slot {slot}, which was not granted")]
    /// A write into a slot that was not granted.
    NotGranted {
        /// The slot named.
        slot: u32,
    },
    #[error("write for slot {slot} from an older use of it (generation {got}, expected {want})")]
    /// A write from an earlier grant of the slot.
    Stale {
        /// The slot named.
        slot: u32,
        /// The generation it carried.
        got: u16,
        /// The slot's current generation.
        want: u16,
    },
    #[error("write of {got} bytes into slot {slot}, which was granted for {want}")]
    /// A write of another length than granted.
    WrongLength {
        /// The slot named.
        slot: u32,
        /// Bytes written.
        got: u32,
        /// Bytes granted.
        want: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Ours; may be granted.
    Free,
    /// Named in a request; the sender may write it once.
    Granted { chunk: ChunkId, len: u32 },
    /// Written; its bytes are being copied out.
    Full,
}

/// The fetching node's view of its ring.
#[derive(Debug)]
pub struct RecvRing {
    layout: RingLayout,
    slots: Vec<Slot>,
    generation: Vec<u16>,
    free: VecDeque<u32>,
}

impl RecvRing {
    /// An empty ring of this shape.
    pub fn new(layout: RingLayout) -> RecvRing {
        assert!(
            layout.slots <= 1 << 16,
            "at most 65536 slots fit the immediate"
        );
        RecvRing {
            layout,
            slots: vec![Slot::Free; layout.slots as usize],
            generation: vec![0; layout.slots as usize],
            free: (0..layout.slots).collect(),
        }
    }

    /// The ring's shape.
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// Free slots.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Grants a free slot for `chunk` of `len` bytes; `None` when every
    /// slot is out (wait for a release).
    pub fn grant(&mut self, chunk: ChunkId, len: u32) -> Result<Option<Grant>, RingError> {
        if len > self.layout.slot_size {
            return Err(RingError::TooLarge {
                len,
                slot_size: self.layout.slot_size,
            });
        }
        let Some(slot) = self.free.pop_front() else {
            return Ok(None);
        };
        self.slots[slot as usize] = Slot::Granted { chunk, len };
        let g = self.generation[slot as usize];
        Ok(Some(Grant {
            slot,
            imm: imm(slot, g),
        }))
    }

    /// A receive completion carrying `imm` and `byte_len`: which request it
    /// fulfils. The slot stays ours until [`RecvRing::release`].
    pub fn landed(&mut self, imm: u32, byte_len: u32) -> Result<Landed, RingError> {
        let (slot, generation) = split_imm(imm);
        let Some(state) = self.slots.get(slot as usize).copied() else {
            return Err(RingError::NoSuchSlot { slot });
        };
        let want = self.generation[slot as usize];
        if generation != want {
            return Err(RingError::Stale {
                slot,
                got: generation,
                want,
            });
        }
        match state {
            Slot::Granted { chunk, len } if len == byte_len => {
                self.slots[slot as usize] = Slot::Full;
                Ok(Landed {
                    slot,
                    chunk,
                    len: byte_len,
                })
            }
            Slot::Granted { len, .. } => Err(RingError::WrongLength {
                slot,
                got: byte_len,
                want: len,
            }),
            Slot::Free | Slot::Full => Err(RingError::NotGranted { slot }),
        }
    }

    /// Gives `slot` back (its bytes were copied out, or its request was
    /// refused). A later write for its old grant is detected as stale.
    pub fn release(&mut self, slot: u32) {
        if let Some(s) = self.slots.get_mut(slot as usize) {
            if *s != Slot::Free {
                *s = Slot::Free;
                self.generation[slot as usize] = self.generation[slot as usize].wrapping_add(1);
                self.free.push_back(slot);
            }
        }
    }
}

/// A write the sending node was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteReq {
    /// The caller's tag, returned when the write is known complete.
    pub tag: u64,
    /// The queue pair to post it on.
    pub qp: u32,
    /// Bytes to write.
    pub len: u32,
}

/// What the sender should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendAction {
    /// Post this write now on `qp`, with a completion if `signaled`.
    Post {
        /// The request's tag.
        tag: u64,
        /// The queue pair.
        qp: u32,
        /// The work request id to post with.
        wr_id: u64,
        /// Whether to ask for a completion.
        signaled: bool,
    },
}

#[derive(Debug, Default)]
struct QpQueue {
    /// Posted and not yet known complete: (wr_id, tag).
    outstanding: VecDeque<(u64, u64)>,
    /// Unsignalled posts since the last signalled one.
    since_signal: u32,
    waiting: VecDeque<WriteReq>,
}

/// The sending node's queue pairs: how many writes may be outstanding on
/// each (its send queue depth), which ones ask for a completion (every
/// `signal_every`-th, and any that fills the queue, since an RC queue
/// pair completes in order and one completion retires every write before
/// it), and which writes wait for room.
#[derive(Debug)]
pub struct SendQueues {
    depth: u32,
    signal_every: u32,
    qps: Vec<QpQueue>,
    next_wr: u64,
}

impl SendQueues {
    /// `qps` queue pairs of `depth` each, signalling every `signal_every`-th write.
    pub fn new(qps: u32, depth: u32, signal_every: u32) -> SendQueues {
        assert!(qps > 0 && depth > 0);
        SendQueues {
            depth,
            signal_every: signal_every.clamp(1, depth),
            qps: (0..qps).map(|_| QpQueue::default()).collect(),
            next_wr: 1,
        }
    }

    /// A write was requested.
    pub fn submit(&mut self, req: WriteReq) -> Vec<SendAction> {
        let qp = (req.qp as usize) % self.qps.len();
        self.qps[qp].waiting.push_back(WriteReq {
            qp: qp as u32,
            ..req
        });
        self.drain(qp)
    }

    /// A signalled write completed on `qp`: it and every write posted
    /// before it on that queue pair are done. Returns the tags done and
    /// the writes that now fit.
    pub fn completed(&mut self, qp: u32, wr_id: u64) -> (Vec<u64>, Vec<SendAction>) {
        let q = (qp as usize) % self.qps.len();
        let mut done = Vec::new();
        if self.qps[q].outstanding.iter().any(|(w, _)| *w == wr_id) {
            while let Some((w, tag)) = self.qps[q].outstanding.pop_front() {
                done.push(tag);
                if w == wr_id {
                    break;
                }
            }
        }
        (done, self.drain(q))
    }

    /// Writes posted and not yet known complete, over all queue pairs.
    pub fn outstanding(&self) -> usize {
        self.qps.iter().map(|q| q.outstanding.len()).sum()
    }

    /// Writes waiting for room.
    pub fn waiting(&self) -> usize {
        self.qps.iter().map(|q| q.waiting.len()).sum()
    }

    /// Queue pair `qp` failed: every write on it, posted or waiting, is
    /// lost; their tags.
    pub fn fail(&mut self, qp: u32) -> Vec<u64> {
        let n = self.qps.len();
        let q = &mut self.qps[(qp as usize) % n];
        let mut lost: Vec<u64> = q.outstanding.drain(..).map(|(_, t)| t).collect();
        lost.extend(q.waiting.drain(..).map(|r| r.tag));
        q.since_signal = 0;
        lost
    }

    fn drain(&mut self, qp: usize) -> Vec<SendAction> {
        let mut out = Vec::new();
        let depth = self.depth as usize;
        let signal_every = self.signal_every;
        loop {
            let q = &mut self.qps[qp];
            if q.outstanding.len() >= depth {
                break;
            }
            let Some(req) = q.waiting.pop_front() else {
                break;
            };
            let wr_id = self.next_wr;
            self.next_wr += 1;
            q.since_signal += 1;
            // Signal every n-th, and the one that fills the queue (or no
            // completion would ever make room again). An unsignalled write
            // that fails still completes (with its error), so nothing is
            // missed; the fetching node learns of every write from its own
            // receive completion.
            let signaled = q.since_signal >= signal_every || q.outstanding.len() + 1 >= depth;
            if signaled {
                q.since_signal = 0;
            }
            q.outstanding.push_back((wr_id, req.tag));
            out.push(SendAction::Post {
                tag: req.tag,
                qp: qp as u32,
                wr_id,
                signaled,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(i: u32) -> ChunkId {
        ChunkId { file: 0, index: i }
    }

    #[test]
    fn slots_are_granted_once_and_come_back_after_release() {
        let mut r = RecvRing::new(RingLayout {
            slots: 2,
            slot_size: 100,
        });
        let a = r.grant(c(0), 100).unwrap().unwrap();
        let b = r.grant(c(1), 50).unwrap().unwrap();
        assert_eq!(r.grant(c(2), 10).unwrap(), None, "no credit left");
        // Completions in any order.
        assert_eq!(
            r.landed(b.imm, 50).unwrap(),
            Landed {
                slot: b.slot,
                chunk: c(1),
                len: 50
            }
        );
        assert_eq!(r.landed(a.imm, 100).unwrap().chunk, c(0));
        // Full but not released: still not grantable, and a second write is refused.
        assert_eq!(r.grant(c(2), 10).unwrap(), None);
        assert_eq!(
            r.landed(a.imm, 100),
            Err(RingError::NotGranted { slot: a.slot })
        );
        r.release(a.slot);
        let again = r.grant(c(2), 10).unwrap().unwrap();
        assert_eq!(again.slot, a.slot);
        assert_ne!(again.imm, a.imm, "a new generation");
        // The old grant's write is now stale.
        assert!(matches!(r.landed(a.imm, 100), Err(RingError::Stale { .. })));
    }

    #[test]
    fn wrong_lengths_sizes_and_slots_are_errors() {
        let mut r = RecvRing::new(RingLayout {
            slots: 1,
            slot_size: 100,
        });
        assert_eq!(
            r.grant(c(0), 101),
            Err(RingError::TooLarge {
                len: 101,
                slot_size: 100
            })
        );
        let g = r.grant(c(0), 80).unwrap().unwrap();
        assert_eq!(
            r.landed(g.imm, 79),
            Err(RingError::WrongLength {
                slot: 0,
                got: 79,
                want: 80
            })
        );
        assert_eq!(
            r.landed(imm(7, 0), 80),
            Err(RingError::NoSuchSlot { slot: 7 })
        );
        // A refused request gives the slot back.
        r.release(g.slot);
        assert_eq!(r.available(), 1);
    }

    #[test]
    fn selective_signalling_retires_in_order_and_respects_the_depth() {
        let mut s = SendQueues::new(2, 4, 2);
        let mut posted = Vec::new();
        for tag in 0..10 {
            posted.extend(s.submit(WriteReq { tag, qp: 0, len: 1 }));
        }
        // Depth 4 on qp 0: four posted, six wait.
        assert_eq!(posted.len(), 4);
        assert_eq!(s.waiting(), 6);
        let sig: Vec<u64> = posted
            .iter()
            .filter_map(
                |SendAction::Post {
                     wr_id, signaled, ..
                 }| signaled.then_some(*wr_id),
            )
            .collect();
        // Every second one, and the one filling the queue.
        assert_eq!(sig.len(), 2, "{posted:?}");
        let (done, more) = s.completed(0, sig[0]);
        assert_eq!(done, [0, 1]);
        assert_eq!(more.len(), 2);
        let (done, _) = s.completed(0, sig[1]);
        assert_eq!(done, [2, 3]);
        assert_eq!(s.outstanding() + s.waiting(), 6);
        // A failed queue pair loses everything on it, posted or not.
        let lost = s.fail(0);
        assert_eq!(lost.len(), 6);
        assert_eq!(s.outstanding() + s.waiting(), 0);
    }

    #[test]
    fn writes_one_at_a_time_signal_every_nth() {
        let mut s = SendQueues::new(4, 64, 16);
        let mut signalled = Vec::new();
        for tag in 0..40 {
            for SendAction::Post {
                wr_id, signaled, ..
            } in s.submit(WriteReq { tag, qp: 3, len: 1 })
            {
                if signaled {
                    signalled.push(wr_id);
                }
            }
        }
        assert_eq!(signalled, [16, 32]);
        assert_eq!(s.completed(3, 16).0, (0..16).collect::<Vec<u64>>());
        assert_eq!(s.outstanding(), 24);
    }
}
