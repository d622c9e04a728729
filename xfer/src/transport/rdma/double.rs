//! An in-process double of two RDMA NICs joined by a link, enforcing what
//! real hardware enforces, so the data plane's logic can be exercised with
//! real memory, real files and real BLAKE3 checks on machines without a
//! device.
//!
//! [`Fabric::pair`] gives the two ends, each a [`Verbs`]. Writes are queued
//! per queue pair and executed when either end polls: in order within a
//! queue pair, in random order across them (so completions arrive out of
//! order, as with several QPs). Executing a write checks, like a NIC:
//! the local key and bounds (`LocalProtection`), the remote key, bounds
//! and remote-write access (`RemoteAccess`), that the receiver posted a
//! receive (`ReceiverNotReady`), and, beyond hardware, that the bytes land
//! only in a window the receiver opened ([`Verbs::open_window`]) and not
//! yet written: a write into a ring slot without credit is recorded as a
//! violation and fails with `RemoteAccess`. Any error moves the queue pair
//! to the error state: the rest of its writes complete `Flushed` and later
//! posts fail, as on hardware. [`Fabric::fail_after`] injects a transport
//! failure on a queue pair after n more writes have landed; the failing
//! write is held back until the receiver has polled, and handled, the
//! completion of every write that landed before it, so what a test counts
//! as delivered does not depend on how the two pollers are scheduled.
//!
//! [`DoubleHub`] hands out [`Nic`]s over the double, so the queue-pair
//! exchange ([`super::link`]) runs as it does between two hosts.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::link::{Local, Nic, PendingLink, QpInfo, SetupError};
use super::verbs::{Access, Completion, Region, Verbs, VerbsError, WcKind, WcStatus, WriteImm};

#[derive(Debug)]
struct Reg {
    region: Region,
    access: Access,
}

#[derive(Debug, Default)]
struct Side {
    regs: Vec<Reg>,
    /// Posted receive WRs, per queue pair.
    recvs: Vec<VecDeque<u64>>,
    /// Writes posted and not executed, per queue pair.
    wire: Vec<VecDeque<WriteImm>>,
    /// Writes executed but not retired by a signalled completion.
    unretired: Vec<u32>,
    errored: Vec<bool>,
    /// Receive completions pushed to `cq`, per queue pair.
    arrived: Vec<u64>,
    /// Receive completions this side has handled, per queue pair: those
    /// taken by a poll before its latest one (a poller handles all it took
    /// before it polls again).
    handled: Vec<u64>,
    /// Receive completions taken by the latest poll, per queue pair.
    taken: Vec<u64>,
    cq: VecDeque<Completion>,
    /// Windows opened to one write: (rkey, start address, len).
    windows: Vec<(u32, u64, u64)>,
}

#[derive(Debug)]
struct State {
    sides: [Side; 2],
    next_key: u32,
    fail_after: HashMap<(usize, u32), u32>,
    /// How many times each armed failure has been held back so far.
    held: HashMap<(usize, u32), u32>,
    violations: Vec<String>,
    rng: SmallRng,
    writes: u64,
}

/// Looks at a held failure (see [`Fabric::failure_held`]) before it fires
/// anyway: far more than a polling receiver needs to catch up.
const HOLD_LIMIT: u32 = 100_000;

/// The link between the two ends.
#[derive(Clone)]
pub struct Fabric {
    state: Arc<Mutex<State>>,
    qps: u32,
    depth: u32,
}

/// One end (one NIC's connected queue pairs).
#[derive(Clone)]
pub struct End {
    fabric: Fabric,
    side: usize,
}

impl Fabric {
    /// Two ends joined by `qps` queue pairs of send depth `depth`;
    /// `seed` fixes the order completions arrive in.
    pub fn pair(qps: u32, depth: u32, seed: u64) -> (Fabric, End, End) {
        let side = || Side {
            recvs: (0..qps).map(|_| VecDeque::new()).collect(),
            wire: (0..qps).map(|_| VecDeque::new()).collect(),
            unretired: vec![0; qps as usize],
            errored: vec![false; qps as usize],
            arrived: vec![0; qps as usize],
            handled: vec![0; qps as usize],
            taken: vec![0; qps as usize],
            ..Side::default()
        };
        let f = Fabric {
            state: Arc::new(Mutex::new(State {
                sides: [side(), side()],
                next_key: 0x100,
                fail_after: HashMap::new(),
                held: HashMap::new(),
                violations: Vec::new(),
                rng: SmallRng::seed_from_u64(seed),
                writes: 0,
            })),
            qps,
            depth,
        };
        let a = End {
            fabric: f.clone(),
            side: 0,
        };
        let b = End {
            fabric: f.clone(),
            side: 1,
        };
        (f, a, b)
    }

    /// After `n` more writes landed on queue pair `qp` of `end`'s side,
    /// the next one fails with a transport error, once the receiver has
    /// handled every write that landed on that queue pair.
    pub fn fail_after(&self, end: &End, qp: u32, n: u32) {
        self.state
            .lock()
            .unwrap()
            .fail_after
            .insert((end.side, qp), n);
    }

    /// Writes that broke the credit rules (a slot written without a grant).
    pub fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }

    /// Writes executed successfully.
    pub fn writes(&self) -> u64 {
        self.state.lock().unwrap().writes
    }

    /// Executes up to `budget` queued writes, from queue pairs picked at
    /// random (each queue pair in order).
    fn progress(st: &mut State, budget: usize) {
        for _ in 0..budget {
            let mut ready: Vec<(usize, usize)> = Vec::new();
            for s in 0..2 {
                for q in 0..st.sides[s].wire.len() {
                    if !st.sides[s].wire[q].is_empty() && !Self::failure_held(st, s, q) {
                        ready.push((s, q));
                    }
                }
            }
            if ready.is_empty() {
                return;
            }
            let (s, q) = ready[st.rng.gen_range(0..ready.len())];
            let wr = st.sides[s].wire[q].pop_front().expect("ready");
            Self::execute(st, s, q, wr);
        }
    }

    /// Whether the next write on queue pair `q` of side `s` is the injected
    /// failure and must wait: the peer has not yet handled every write
    /// that landed there. The wait is bounded ([`HOLD_LIMIT`] looks), so a
    /// receiver that stops polling cannot hang the writer; a receiver that
    /// polls catches up within a few looks.
    fn failure_held(st: &mut State, s: usize, q: usize) -> bool {
        let key = (s, q as u32);
        let peer = &st.sides[1 - s];
        if st.fail_after.get(&key) != Some(&0) || peer.handled[q] >= peer.arrived[q] {
            return false;
        }
        let looks = st.held.entry(key).or_insert(0);
        *looks += 1;
        *looks <= HOLD_LIMIT
    }

    fn execute(st: &mut State, s: usize, q: usize, wr: WriteImm) {
        let peer = 1 - s;
        let qp = q as u32;
        let fail = |st: &mut State, status: WcStatus| {
            st.sides[s].errored[q] = true;
            st.sides[s].cq.push_back(Completion {
                qp,
                wr_id: wr.wr_id,
                status,
                kind: WcKind::Write,
            });
            // Everything behind it on the queue pair is flushed.
            let rest: Vec<WriteImm> = st.sides[s].wire[q].drain(..).collect();
            for w in rest {
                st.sides[s].cq.push_back(Completion {
                    qp,
                    wr_id: w.wr_id,
                    status: WcStatus::Flushed,
                    kind: WcKind::Write,
                });
            }
        };
        if st.sides[s].errored[q] {
            fail(st, WcStatus::Flushed);
            return;
        }
        if let Some(n) = st.fail_after.get_mut(&(s, qp)) {
            if *n == 0 {
                st.fail_after.remove(&(s, qp));
                fail(st, WcStatus::Transport);
                return;
            }
            *n -= 1;
        }
        let len = u64::from(wr.len);
        let local = st.sides[s].regs.iter().find(|r| {
            r.region.lkey == wr.lkey
                && wr.local_addr >= r.region.addr
                && wr.local_addr + len <= r.region.addr + r.region.len
        });
        if local.is_none() {
            fail(st, WcStatus::LocalProtection);
            return;
        }
        let remote = st.sides[peer].regs.iter().find(|r| {
            r.region.rkey == wr.rkey
                && r.access == Access::RemoteWrite
                && wr.remote_addr >= r.region.addr
                && wr.remote_addr + len <= r.region.addr + r.region.len
        });
        if remote.is_none() {
            fail(st, WcStatus::RemoteAccess);
            return;
        }
        let window = st.sides[peer].windows.iter().position(|(k, a, l)| {
            *k == wr.rkey && wr.remote_addr >= *a && wr.remote_addr + len <= a + l
        });
        let Some(window) = window else {
            st.violations.push(format!(
                "write of {} bytes at {:#x} (imm {:#x}) into a ring slot with no credit",
                wr.len, wr.remote_addr, wr.imm
            ));
            fail(st, WcStatus::RemoteAccess);
            return;
        };
        let Some(recv) = st.sides[peer].recvs[q].pop_front() else {
            fail(st, WcStatus::ReceiverNotReady);
            return;
        };
        st.sides[peer].windows.swap_remove(window);
        // SAFETY: both ranges were registered by their owners, who keep the
        // memory alive and in place while registered (the data plane holds
        // the ring and the source mappings for the life of the connection),
        // and the bounds were checked against the registrations just above.
        // The ring window is written by no one else: it was granted to this
        // one write.
        unsafe {
            std::ptr::copy_nonoverlapping(
                wr.local_addr as *const u8,
                wr.remote_addr as *mut u8,
                wr.len as usize,
            );
        }
        st.writes += 1;
        st.sides[peer].arrived[q] += 1;
        st.sides[peer].cq.push_back(Completion {
            qp,
            wr_id: recv,
            status: WcStatus::Success,
            kind: WcKind::RecvImm {
                imm: wr.imm,
                byte_len: wr.len,
            },
        });
        st.sides[s].unretired[q] += 1;
        if wr.signaled {
            st.sides[s].unretired[q] = 0;
            st.sides[s].cq.push_back(Completion {
                qp,
                wr_id: wr.wr_id,
                status: WcStatus::Success,
                kind: WcKind::Write,
            });
        }
    }
}

/// Send queue depth of the queue pairs a [`DoubleHub`] connects.
const HUB_DEPTH: u32 = 32;

/// Makes NICs over the double that can connect to each other. Of the two
/// ends of a connection, the first to connect (the serving node, which
/// connects before it answers the hello) makes the [`Fabric`]; the second
/// takes the other end.
#[derive(Clone, Default)]
pub struct DoubleHub {
    inner: Arc<Mutex<Hub>>,
}

impl std::fmt::Debug for DoubleHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DoubleHub")
    }
}

#[derive(Default)]
struct Hub {
    seed: u64,
    next_qpn: u32,
    /// Second ends, waiting for their node, by the pair's QPN bases.
    waiting: HashMap<(u32, u32), End>,
    fabrics: Vec<Fabric>,
    /// Applied to the serving end of every fabric made: (qp, writes).
    faults: Vec<(u32, u32)>,
}

impl DoubleHub {
    /// A hub whose fabrics draw their randomness from `seed`.
    pub fn new(seed: u64) -> DoubleHub {
        let hub = DoubleHub::default();
        hub.inner.lock().unwrap().seed = seed;
        hub
    }

    /// One node's NIC.
    pub fn nic(&self) -> Arc<dyn Nic> {
        Arc::new(self.clone())
    }

    /// Every fabric made so far, in order.
    pub fn fabrics(&self) -> Vec<Fabric> {
        self.inner.lock().unwrap().fabrics.clone()
    }

    /// The serving end of every later connection fails on queue pair `qp`
    /// after `n` writes.
    pub fn fail_serving_after(&self, qp: u32, n: u32) {
        self.inner.lock().unwrap().faults.push((qp, n));
    }
}

impl Nic for DoubleHub {
    fn prepare(&self, qps: u32) -> Result<Box<dyn PendingLink>, SetupError> {
        let mut hub = self.inner.lock().unwrap();
        let base = hub.next_qpn + 0x10;
        hub.next_qpn += qps + 0x10;
        Ok(Box::new(Pending {
            hub: self.clone(),
            base,
            qps,
        }))
    }
}

/// Queue pairs of the double, numbered from `base`, not yet connected.
struct Pending {
    hub: DoubleHub,
    base: u32,
    qps: u32,
}

impl PendingLink for Pending {
    fn local(&self) -> Local {
        let mut gid = [0u8; 16];
        gid[..2].copy_from_slice(&[0xfe, 0x80]);
        gid[12..].copy_from_slice(&self.base.to_be_bytes());
        Local {
            gid,
            gid_index: 0,
            mtu: 4096,
            port: 1,
            lid: 0,
            qps: (0..self.qps)
                .map(|i| QpInfo {
                    qpn: self.base + i,
                    psn: 0,
                })
                .collect(),
        }
    }

    fn connect(self: Box<Self>, remote: &Local) -> Result<Arc<dyn Verbs>, SetupError> {
        if remote.qps.len() != self.qps as usize {
            return Err(SetupError::Unusable(format!(
                "the peer has {} queue pairs and we have {}: both ends must create as many",
                remote.qps.len(),
                self.qps
            )));
        }
        let theirs = remote.qps.first().map_or(0, |q| q.qpn);
        let key = (self.base.min(theirs), self.base.max(theirs));
        let mut hub = self.hub.inner.lock().unwrap();
        if let Some(end) = hub.waiting.remove(&key) {
            return Ok(Arc::new(end));
        }
        let seed = hub.seed.wrapping_add(hub.fabrics.len() as u64);
        let (fabric, first, second) = Fabric::pair(self.qps, HUB_DEPTH, seed);
        for &(qp, n) in &hub.faults {
            fabric.fail_after(&first, qp, n);
        }
        hub.waiting.insert(key, second);
        hub.fabrics.push(fabric);
        Ok(Arc::new(first))
    }
}

impl Verbs for End {
    fn register(&self, addr: u64, len: u64, access: Access) -> Result<Region, VerbsError> {
        let mut st = self.fabric.state.lock().unwrap();
        st.next_key += 1;
        let key = st.next_key;
        let region = Region {
            addr,
            len,
            lkey: key,
            rkey: key | 0x8000_0000,
        };
        st.sides[self.side].regs.push(Reg { region, access });
        Ok(region)
    }

    fn post_write_imm(&self, qp: u32, wr: WriteImm) -> Result<(), VerbsError> {
        let mut st = self.fabric.state.lock().unwrap();
        let side = &mut st.sides[self.side];
        let q = qp as usize;
        if q >= side.wire.len() {
            return Err(VerbsError::NoQp(qp));
        }
        if side.errored[q] {
            return Err(VerbsError::QpError(qp));
        }
        if side.wire[q].len() as u32 + side.unretired[q] >= self.fabric.depth {
            return Err(VerbsError::QueueFull(qp));
        }
        side.wire[q].push_back(wr);
        Ok(())
    }

    fn post_recv(&self, qp: u32, wr_id: u64) -> Result<(), VerbsError> {
        let mut st = self.fabric.state.lock().unwrap();
        let side = &mut st.sides[self.side];
        let q = qp as usize;
        if q >= side.recvs.len() {
            return Err(VerbsError::NoQp(qp));
        }
        side.recvs[q].push_back(wr_id);
        Ok(())
    }

    fn poll(&self, out: &mut Vec<Completion>, max: usize) {
        let mut st = self.fabric.state.lock().unwrap();
        // What the previous poll took has been handled by now.
        let side = &mut st.sides[self.side];
        for (h, t) in side.handled.iter_mut().zip(side.taken.iter_mut()) {
            *h += std::mem::take(t);
        }
        Fabric::progress(&mut st, max);
        let side = &mut st.sides[self.side];
        let n = side.cq.len().min(max);
        for c in side.cq.drain(..n) {
            if matches!(c.kind, WcKind::RecvImm { .. }) {
                side.taken[c.qp as usize] += 1;
            }
            out.push(c);
        }
    }

    fn send_depth(&self) -> u32 {
        self.fabric.depth
    }

    fn qps(&self) -> u32 {
        self.fabric.qps
    }

    fn open_window(&self, region: &Region, offset: u64, len: u64) {
        let mut st = self.fabric.state.lock().unwrap();
        st.sides[self.side]
            .windows
            .push((region.rkey, region.addr + offset, len));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(src: &Region, dst: &Region, off: u64, len: u32, imm: u32, wr_id: u64) -> WriteImm {
        WriteImm {
            wr_id,
            local_addr: src.addr,
            len,
            lkey: src.lkey,
            remote_addr: dst.addr + off,
            rkey: dst.rkey,
            imm,
            signaled: true,
        }
    }

    #[test]
    fn a_granted_write_lands_and_an_ungranted_one_is_caught() {
        let (f, a, b) = Fabric::pair(2, 8, 1);
        let src = [7u8; 64];
        let mut ring = vec![0u8; 128];
        let s = a
            .register(src.as_ptr() as u64, 64, Access::LocalRead)
            .unwrap();
        let r = b
            .register(ring.as_mut_ptr() as u64, 128, Access::RemoteWrite)
            .unwrap();
        b.open_window(&r, 64, 64);
        b.post_recv(1, 42).unwrap();
        a.post_write_imm(1, wr(&s, &r, 64, 64, 5, 1)).unwrap();
        let mut got = Vec::new();
        b.poll(&mut got, 16);
        assert_eq!(
            got,
            [Completion {
                qp: 1,
                wr_id: 42,
                status: WcStatus::Success,
                kind: WcKind::RecvImm {
                    imm: 5,
                    byte_len: 64
                }
            }]
        );
        assert!(ring[64..].iter().all(|&x| x == 7) && ring[..64].iter().all(|&x| x == 0));
        // The same slot again, without a new grant: refused.
        b.post_recv(1, 43).unwrap();
        a.post_write_imm(1, wr(&s, &r, 64, 64, 5, 2)).unwrap();
        let mut sent = Vec::new();
        a.poll(&mut sent, 16);
        assert_eq!(sent.last().unwrap().status, WcStatus::RemoteAccess);
        assert_eq!(f.violations().len(), 1);
        // The queue pair is now in error: posts fail.
        assert_eq!(
            a.post_write_imm(1, wr(&s, &r, 0, 8, 0, 3)),
            Err(VerbsError::QpError(1))
        );
    }

    #[test]
    fn keys_bounds_and_receives_are_checked() {
        let (_f, a, b) = Fabric::pair(3, 8, 2);
        let src = [1u8; 32];
        let mut ring = vec![0u8; 32];
        let s = a
            .register(src.as_ptr() as u64, 32, Access::LocalRead)
            .unwrap();
        let r = b
            .register(ring.as_mut_ptr() as u64, 32, Access::RemoteWrite)
            .unwrap();
        b.open_window(&r, 0, 32);
        let mut bad_rkey = wr(&s, &r, 0, 8, 0, 1);
        bad_rkey.rkey ^= 1;
        a.post_write_imm(0, bad_rkey).unwrap();
        // Out of the ring's bounds.
        a.post_write_imm(1, wr(&s, &r, 16, 32, 0, 2)).unwrap();
        // No receive posted on queue pair 2.
        a.post_write_imm(2, wr(&s, &r, 0, 8, 0, 3)).unwrap();
        let mut c = Vec::new();
        a.poll(&mut c, 16);
        c.sort_by_key(|c| c.qp);
        let st: Vec<WcStatus> = c.iter().map(|c| c.status).collect();
        assert_eq!(
            st,
            [
                WcStatus::RemoteAccess,
                WcStatus::RemoteAccess,
                WcStatus::ReceiverNotReady
            ]
        );
        assert!(ring.iter().all(|&x| x == 0));
    }

    #[test]
    fn completions_cross_queue_pairs_out_of_order_and_failures_flush() {
        let (f, a, b) = Fabric::pair(4, 64, 3);
        let src = [3u8; 4];
        let mut ring = vec![0u8; 4 * 64];
        let s = a
            .register(src.as_ptr() as u64, 4, Access::LocalRead)
            .unwrap();
        let r = b
            .register(ring.as_mut_ptr() as u64, 256, Access::RemoteWrite)
            .unwrap();
        for i in 0..64u32 {
            b.open_window(&r, u64::from(i) * 4, 4);
            b.post_recv(i % 4, u64::from(i)).unwrap();
            a.post_write_imm(i % 4, wr(&s, &r, u64::from(i) * 4, 4, i, u64::from(i)))
                .unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 64 {
            b.poll(&mut got, 8);
        }
        let imms: Vec<u32> = got
            .iter()
            .map(|c| match c.kind {
                WcKind::RecvImm { imm, .. } => imm,
                _ => unreachable!(),
            })
            .collect();
        let mut sorted = imms.clone();
        sorted.sort();
        assert_eq!(sorted, (0..64).collect::<Vec<u32>>());
        assert_ne!(imms, sorted, "completions should arrive out of order");
        // In order within one queue pair.
        let qp0: Vec<u32> = imms.iter().copied().filter(|i| i % 4 == 0).collect();
        assert!(qp0.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(f.writes(), 64);

        let mut drained = Vec::new();
        a.poll(&mut drained, 1000);
        assert_eq!(drained.len(), 64, "every write was signalled");

        // A transport failure after one more write on qp 1 flushes the rest.
        f.fail_after(&a, 1, 1);
        for i in 0..3u64 {
            b.open_window(&r, i * 4, 4);
            b.post_recv(1, i).unwrap();
            a.post_write_imm(1, wr(&s, &r, i * 4, 4, 0, 100 + i))
                .unwrap();
        }
        // The failing write waits until the receiver has handled the one
        // that landed before it: the receiver polls too.
        let mut c = Vec::new();
        let mut received = Vec::new();
        for _ in 0..4 {
            a.poll(&mut c, 8);
            assert!(
                c.iter().all(|c| c.status != WcStatus::Transport) || received.len() == 1,
                "the failure came before the receiver handled the landed write"
            );
            b.poll(&mut received, 8);
        }
        assert_eq!(received.len(), 1);
        let st: Vec<WcStatus> = c.iter().filter(|c| c.qp == 1).map(|c| c.status).collect();
        assert_eq!(
            st,
            [WcStatus::Success, WcStatus::Transport, WcStatus::Flushed]
        );
    }
}
