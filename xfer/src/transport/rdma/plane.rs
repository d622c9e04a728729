//! The RDMA data plane of one connection, over any [`Verbs`]: the fetching
//! side ([`RecvPlane`], [`RdmaFetcher`]) and the serving side
//! ([`SendPlane`], driven by [`crate::transport::serve`]).
//!
//! The QUIC connection stays: each chunk is still requested on a stream of
//! its own, but the request names a ring slot ([`RdmaRequest`]) and the
//! bytes arrive by RDMA WRITE_WITH_IMM into that slot; the fetching node
//! learns of them from its receive completion, copies the slot out and
//! hands the bytes to the same BLAKE3 check and store as over QUIC. The
//! serving node writes straight from a read-only registration of the
//! source file's mapping (no copy, no page of it writable by the NIC).
//! When the data plane fails (a queue pair error, a write that breaks the
//! ring rules, a write that never lands), the fetcher says so once and
//! fetches the rest over QUIC on the same connection, so a transfer never
//! stops because of RDMA.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{oneshot, Semaphore};

use super::ring::{Landed, RecvRing, RingLayout, SendAction, SendQueues, WriteReq};
use super::verbs::{Access, Completion, Region, Verbs, VerbsError, WcKind, WcStatus, WriteImm};
use crate::transport::quic::{read_frame, write_frame, QuicFetcher};
use crate::transport::{ChunkFetcher, ChunkReader, FetchError};
use crate::util::aligned::AlignedBuf;
use xfer_proto::chunkset::ChunkMap;
use xfer_proto::manifest::ChunkId;
use xfer_proto::stream::{RdmaReply, RdmaRequest, StreamRequest};

/// How a data plane is shaped.
#[derive(Clone, Copy, Debug)]
pub struct PlaneConfig {
    /// Queue pairs per connection (4 reach 200 Gb/s).
    pub qps: u32,
    /// Ring slots on the fetching side: chunks in flight per connection.
    pub slots: u32,
    /// One slot: the chunk size.
    pub slot_size: u32,
    /// Every n-th write asks for a completion.
    pub signal_every: u32,
    /// A granted write that has not landed after this long means the data
    /// plane is stuck.
    pub land_timeout: Duration,
}

impl PlaneConfig {
    /// The defaults, with ring slots of one chunk.
    pub fn new(chunk_size: u32) -> PlaneConfig {
        PlaneConfig {
            qps: 4,
            slots: 16,
            slot_size: chunk_size,
            signal_every: 16,
            land_timeout: Duration::from_secs(30),
        }
    }
}

/// The fetching node's ring, as the serving node needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingInfo {
    /// Its address in the fetching node's memory.
    pub addr: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Number of slots.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_size: u32,
}

type Waiter = oneshot::Sender<Result<Landed, String>>;

/// The fetching side: the registered ring, its credits, and the
/// completions that fill it.
pub struct RecvPlane {
    verbs: Arc<dyn Verbs>,
    /// The ring's memory: never moved or freed while registered.
    ring_mem: Box<[u8]>,
    region: Region,
    ring: Mutex<RecvRing>,
    credits: Semaphore,
    waiters: Mutex<HashMap<u32, Waiter>>,
    broken: Mutex<Option<String>>,
    next_qp: AtomicU32,
    cfg: PlaneConfig,
}

/// Why a plane could not be set up ([`RecvPlane::new`], [`SendPlane::new`],
/// [`SendPlane::bounced`]). On the serving side its text is the refusal
/// sent to the fetching node.
#[derive(Debug, thiserror::Error)]
pub enum PlaneError {
    /// Memory could not be registered with the NIC.
    #[error("cannot register {what}: {err}")]
    Register {
        /// What: the receive ring, the bounce pool or a file's path.
        what: String,
        /// What the verbs said.
        err: VerbsError,
    },
    /// A source file could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A source file's size could not be read.
    #[error("{0}")]
    Stat(std::io::Error),
    /// A source file could not be mapped.
    #[error("cannot map {}: {source}", path.display())]
    Map {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// Why a chunk could not be copied into a bounce slot.
#[derive(Debug, thiserror::Error)]
enum FillError {
    #[error("a chunk of {0} bytes does not fit a bounce slot")]
    TooBig(usize),
    #[error("the bounce pool closed")]
    Closed,
    #[error("bounce pool out of slots")]
    OutOfSlots,
}

impl RecvPlane {
    /// Allocates and registers the ring and starts polling completions.
    pub fn new(verbs: Arc<dyn Verbs>, cfg: PlaneConfig) -> Result<Arc<RecvPlane>, PlaneError> {
        let layout = RingLayout {
            slots: cfg.slots,
            slot_size: cfg.slot_size,
        };
        let ring_mem = vec![0u8; layout.len() as usize].into_boxed_slice();
        let region = verbs
            .register(ring_mem.as_ptr() as u64, layout.len(), Access::RemoteWrite)
            .map_err(|err| PlaneError::Register {
                what: "the receive ring".into(),
                err,
            })?;
        let plane = Arc::new(RecvPlane {
            verbs,
            ring_mem,
            region,
            ring: Mutex::new(RecvRing::new(layout)),
            credits: Semaphore::new(cfg.slots as usize),
            waiters: Mutex::default(),
            broken: Mutex::default(),
            next_qp: AtomicU32::new(0),
            cfg,
        });
        tokio::spawn(poll_completions(Arc::downgrade(&plane)));
        Ok(plane)
    }

    /// The ring, as the serving node needs it.
    pub fn ring_info(&self) -> RingInfo {
        RingInfo {
            addr: self.region.addr,
            rkey: self.region.rkey,
            slots: self.cfg.slots,
            slot_size: self.cfg.slot_size,
        }
    }

    /// Why the data plane stopped, if it did.
    pub fn broken(&self) -> Option<String> {
        self.broken.lock().unwrap().clone()
    }

    fn break_with(&self, why: String) {
        {
            let mut b = self.broken.lock().unwrap();
            if b.is_some() {
                return;
            }
            *b = Some(why.clone());
        }
        for (_, w) in self.waiters.lock().unwrap().drain() {
            let _ = w.send(Err(why.clone()));
        }
    }

    fn on_completion(&self, c: Completion) {
        match (c.status, c.kind) {
            (WcStatus::Success, WcKind::RecvImm { imm, byte_len }) => {
                let landed = self.ring.lock().unwrap().landed(imm, byte_len);
                match landed {
                    Ok(l) => {
                        if let Some(w) = self.waiters.lock().unwrap().remove(&l.slot) {
                            let _ = w.send(Ok(l));
                        }
                    }
                    Err(e) => self.break_with(format!("a write broke the ring protocol: {e}")),
                }
            }
            (WcStatus::Success, WcKind::Write) => {}
            (status, _) => {
                self.break_with(format!("receive on queue pair {} failed: {status}", c.qp))
            }
        }
    }

    /// Fetches one chunk over the data plane; `Err(None)` means the data
    /// plane is unusable (fall back), `Err(Some(e))` a per-chunk answer.
    async fn fetch(
        &self,
        conn: &quinn::Connection,
        chunk: ChunkId,
        len: usize,
    ) -> Result<Bytes, Option<FetchError>> {
        if self.broken().is_some() {
            return Err(None);
        }
        let _credit = self.credits.acquire().await.map_err(|_| None)?;
        let grant = match self.ring.lock().unwrap().grant(chunk, len as u32) {
            Ok(Some(g)) => g,
            Ok(None) => return Err(None), // credits and slots disagree: a bug
            Err(e) => return Err(Some(FetchError::Protocol(e.to_string()))),
        };
        let layout = self.ring.lock().unwrap().layout();
        let qp = self.next_qp.fetch_add(1, Ordering::Relaxed) % self.verbs.qps();
        let give_back = |why: Option<String>| {
            self.waiters.lock().unwrap().remove(&grant.slot);
            self.ring.lock().unwrap().release(grant.slot);
            if let Some(w) = why {
                self.break_with(w);
            }
        };
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().unwrap().insert(grant.slot, tx);
        self.verbs
            .open_window(&self.region, layout.offset(grant.slot), len as u64);
        if let Err(e) = self.verbs.post_recv(qp, u64::from(grant.slot)) {
            give_back(Some(format!("cannot post a receive: {e}")));
            return Err(None);
        }
        let lost = |e: &dyn std::fmt::Display| FetchError::Connection(e.to_string());
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| Some(lost(&e)))?;
        let req = RdmaRequest {
            chunk,
            slot: grant.slot,
            qp,
            imm: grant.imm,
            len: len as u32,
        };
        if let Err(e) = write_frame(&mut send, &StreamRequest::Rdma(req)).await {
            give_back(None);
            return Err(Some(lost(&e)));
        }
        let _ = send.finish();
        let reply = read_frame::<RdmaReply>(&mut recv);
        tokio::pin!(reply);
        let mut rx = rx;
        let timeout = self.cfg.land_timeout;
        let stuck = || format!("a write did not land within {}s", timeout.as_secs());
        // Biased: a write that landed counts as landed even when the
        // serving side, failing its queue pair later, reports it failed.
        let landed = tokio::select! {
            biased;
            l = &mut rx => l.unwrap_or_else(|_| Err("the data plane stopped".into())),
            r = &mut reply => match r {
                // Done on the serving side before our completion was
                // polled: it is on its way.
                Ok(RdmaReply::Written) => match tokio::time::timeout(timeout, &mut rx).await {
                    Ok(Ok(l)) => l,
                    Ok(Err(_)) => Err("the data plane stopped".into()),
                    Err(_) => Err(stuck()),
                },
                Ok(RdmaReply::Unavailable(why)) => {
                    give_back(None);
                    return Err(Some(FetchError::Unavailable(chunk, why)));
                }
                Ok(RdmaReply::Failed(why)) => Err(why),
                Err(e) => {
                    give_back(None);
                    return Err(Some(lost(&e)));
                }
            },
            _ = tokio::time::sleep(timeout) => Err(stuck()),
        };
        match landed {
            Ok(l) => {
                let at = layout.offset(l.slot) as usize;
                let mut buf = AlignedBuf::with_capacity(len);
                buf.extend_from_slice(&self.ring_mem[at..at + l.len as usize]);
                self.ring.lock().unwrap().release(l.slot);
                Ok(Bytes::from_owner(buf))
            }
            Err(why) => {
                give_back(Some(why));
                Err(None)
            }
        }
    }
}

/// A side of the data plane whose completions [`poll_completions`] feeds.
trait Polled: Send + Sync + 'static {
    fn verbs(&self) -> &dyn Verbs;
    fn on_completion(&self, c: Completion);
    /// Stop polling (the plane failed for good).
    fn stopped(&self) -> bool {
        false
    }
}

impl Polled for RecvPlane {
    fn verbs(&self) -> &dyn Verbs {
        self.verbs.as_ref()
    }
    fn on_completion(&self, c: Completion) {
        RecvPlane::on_completion(self, c)
    }
    fn stopped(&self) -> bool {
        self.broken().is_some()
    }
}

impl Polled for SendPlane {
    fn verbs(&self) -> &dyn Verbs {
        self.verbs.as_ref()
    }
    fn on_completion(&self, c: Completion) {
        SendPlane::on_completion(self, c)
    }
}

/// Polls `plane`'s completions until it is dropped or stops: busy while
/// completions come, 100 µs naps while none do.
async fn poll_completions<P: Polled>(plane: Weak<P>) {
    let mut out = Vec::with_capacity(64);
    loop {
        let Some(p) = plane.upgrade() else { return };
        if p.stopped() {
            return;
        }
        out.clear();
        p.verbs().poll(&mut out, 64);
        let idle = out.is_empty();
        for c in out.drain(..) {
            p.on_completion(c);
        }
        drop(p);
        if idle {
            tokio::time::sleep(Duration::from_micros(100)).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

/// Fetches chunks from one peer over its RDMA data plane, and over QUIC
/// on the same connection once the data plane has failed.
#[derive(Clone)]
pub struct RdmaFetcher {
    plane: Arc<RecvPlane>,
    conn: quinn::Connection,
    quic: QuicFetcher,
    told: Arc<AtomicBool>,
    over_rdma: Arc<AtomicU64>,
}

impl RdmaFetcher {
    /// Over `plane`, falling back to QUIC on `conn`.
    pub fn new(plane: Arc<RecvPlane>, conn: quinn::Connection) -> RdmaFetcher {
        RdmaFetcher {
            plane,
            quic: QuicFetcher::new(conn.clone()),
            conn,
            told: Arc::default(),
            over_rdma: Arc::default(),
        }
    }

    /// Chunks that came over RDMA so far.
    pub fn chunks_over_rdma(&self) -> u64 {
        self.over_rdma.load(Ordering::Relaxed)
    }

    /// The receive plane.
    pub fn plane(&self) -> &Arc<RecvPlane> {
        &self.plane
    }
}

impl ChunkFetcher for RdmaFetcher {
    async fn fetch(&self, chunk: ChunkId, len: usize) -> Result<Bytes, FetchError> {
        match self.plane.fetch(&self.conn, chunk, len).await {
            Ok(b) => {
                self.over_rdma.fetch_add(1, Ordering::Relaxed);
                Ok(b)
            }
            Err(Some(e)) => Err(e),
            Err(None) => {
                if !self.told.swap(true, Ordering::Relaxed) {
                    let why = self.plane.broken().unwrap_or_else(|| "unusable".into());
                    tracing::warn!(
                        "rdma: {why}; continuing over QUIC to {}",
                        self.conn.remote_address()
                    );
                }
                self.quic.fetch(chunk, len).await
            }
        }
    }
}

/// One source file, mapped read-only and registered for the NIC to read.
struct Source {
    _map: Option<memmap2::Mmap>,
    region: Option<Region>,
}

/// Where the serving node's chunk bytes come from.
enum Origin {
    /// Complete files, mapped and registered read-only: the NIC reads them
    /// in place.
    Files(Vec<Source>),
    /// Verified chunks of a model still arriving (a swarm peer relaying),
    /// copied into a registered bounce pool first.
    Bounce {
        reader: Arc<dyn ChunkReader>,
        pool: BouncePool,
    },
}

/// Slots of a bounce pool: chunks being written to one peer at once.
const BOUNCE_SLOTS: u32 = 8;

/// Memory allocated once, written only through its raw pointer.
struct RawBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is owned (freed once, in Drop); its slots are written
// only by the one write that took the slot from the pool's free list.
unsafe impl Send for RawBuf {}
// SAFETY: as for Send.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    fn new(len: usize) -> RawBuf {
        let b = vec![0u8; len].into_boxed_slice();
        RawBuf {
            ptr: Box::into_raw(b).cast::<u8>(),
            len,
        }
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from a boxed slice in `new`, freed once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// Registered memory the NIC reads relayed chunks from: each slot belongs
/// to one write from the time it is taken until its completion.
struct BouncePool {
    mem: RawBuf,
    region: Region,
    slot_size: u32,
    free: Mutex<Vec<u32>>,
    permits: Semaphore,
}

/// A bounce slot held by one write; back in the pool when dropped.
struct BounceSlot<'a> {
    pool: &'a BouncePool,
    index: u32,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Drop for BounceSlot<'_> {
    fn drop(&mut self) {
        self.pool.free.lock().unwrap().push(self.index);
    }
}

impl BouncePool {
    fn new(verbs: &dyn Verbs, slots: u32, slot_size: u32) -> Result<BouncePool, PlaneError> {
        let len = slots as usize * slot_size as usize;
        let mem = RawBuf::new(len);
        let region = verbs
            .register(mem.ptr as u64, len as u64, Access::LocalRead)
            .map_err(|err| PlaneError::Register {
                what: "the bounce pool".into(),
                err,
            })?;
        Ok(BouncePool {
            mem,
            region,
            slot_size,
            free: Mutex::new((0..slots).rev().collect()),
            permits: Semaphore::new(slots as usize),
        })
    }

    /// Takes a slot (waiting for one) and copies `bytes` into it: the
    /// address and key to write from, and the slot to hold until done.
    async fn fill(&self, bytes: &[u8]) -> Result<(u64, u32, BounceSlot<'_>), FillError> {
        if bytes.len() > self.slot_size as usize {
            return Err(FillError::TooBig(bytes.len()));
        }
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| FillError::Closed)?;
        let index = self
            .free
            .lock()
            .unwrap()
            .pop()
            .ok_or(FillError::OutOfSlots)?;
        let slot = BounceSlot {
            pool: self,
            index,
            _permit: permit,
        };
        let offset = index as usize * self.slot_size as usize;
        // SAFETY: slot `index` was taken from the free list, so no other
        // write uses it and the NIC reads it no more (its last write
        // completed before the slot went back); the copy stays inside it.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.mem.ptr.add(offset), bytes.len())
        };
        Ok((self.region.addr + offset as u64, self.region.lkey, slot))
    }
}

/// A write waiting to be posted or confirmed, and who waits for it.
type PendingWrite = (WriteImm, oneshot::Sender<Result<(), WriteFailed>>);

/// Why a write of the serving side did not land: its queue pair failed
/// (the text of the `RdmaReply::Failed` the fetcher gets).
#[derive(Clone, Debug, thiserror::Error)]
enum WriteFailed {
    /// The write could not be posted.
    #[error("cannot post a write on queue pair {qp}: {error}")]
    Post {
        /// The queue pair.
        qp: u32,
        /// The verb's error.
        error: VerbsError,
    },
    /// A write on the queue pair completed in error.
    #[error("a write on queue pair {qp} failed: {status}")]
    Completion {
        /// The queue pair.
        qp: u32,
        /// The completion's status.
        status: WcStatus,
    },
}

/// The serving side: where the bytes come from and their registrations,
/// the queue pairs' send queues, and the writes waiting for completion.
pub struct SendPlane {
    /// Declared first: dropped (and the memory deregistered) before the
    /// memory of `origin` is unmapped or freed.
    verbs: Arc<dyn Verbs>,
    origin: Origin,
    map: Arc<ChunkMap>,
    ring: RingInfo,
    queues: Mutex<SendQueues>,
    pending: Mutex<HashMap<u64, PendingWrite>>,
    next_tag: AtomicU64,
}

impl SendPlane {
    /// Maps and registers `paths` (the manifest's complete files, in order)
    /// and starts polling completions. `ring` is the fetching node's.
    pub fn new(
        verbs: Arc<dyn Verbs>,
        paths: &[PathBuf],
        map: Arc<ChunkMap>,
        ring: RingInfo,
        cfg: PlaneConfig,
    ) -> Result<Arc<SendPlane>, PlaneError> {
        let mut sources = Vec::with_capacity(paths.len());
        for p in paths {
            let f = std::fs::File::open(p).map_err(|source| PlaneError::Open {
                path: p.clone(),
                source,
            })?;
            let len = f.metadata().map_err(PlaneError::Stat)?.len();
            if len == 0 {
                sources.push(Source {
                    _map: None,
                    region: None,
                });
                continue;
            }
            // SAFETY: a read-only shared mapping of a file this process
            // opened read-only; the data plane only reads it, and the
            // chunk's BLAKE3 check on the fetching side catches a file
            // changed underneath.
            let m = unsafe { memmap2::Mmap::map(&f) }.map_err(|source| PlaneError::Map {
                path: p.clone(),
                source,
            })?;
            let region = verbs
                .register(m.as_ptr() as u64, len, Access::LocalRead)
                .map_err(|err| PlaneError::Register {
                    what: p.display().to_string(),
                    err,
                })?;
            sources.push(Source {
                _map: Some(m),
                region: Some(region),
            });
        }
        Ok(Self::start(verbs, Origin::Files(sources), map, ring, cfg))
    }

    /// Serves the chunks `reader` has (a model still arriving) through a
    /// registered bounce pool. Every write is signalled, so each slot comes
    /// back as soon as its write is done.
    pub fn bounced(
        verbs: Arc<dyn Verbs>,
        reader: Arc<dyn ChunkReader>,
        map: Arc<ChunkMap>,
        ring: RingInfo,
        cfg: PlaneConfig,
    ) -> Result<Arc<SendPlane>, PlaneError> {
        let pool = BouncePool::new(verbs.as_ref(), BOUNCE_SLOTS, ring.slot_size)?;
        let cfg = PlaneConfig {
            signal_every: 1,
            ..cfg
        };
        Ok(Self::start(
            verbs,
            Origin::Bounce { reader, pool },
            map,
            ring,
            cfg,
        ))
    }

    fn start(
        verbs: Arc<dyn Verbs>,
        origin: Origin,
        map: Arc<ChunkMap>,
        ring: RingInfo,
        cfg: PlaneConfig,
    ) -> Arc<SendPlane> {
        let plane = Arc::new(SendPlane {
            queues: Mutex::new(SendQueues::new(
                verbs.qps(),
                verbs.send_depth(),
                cfg.signal_every,
            )),
            verbs,
            origin,
            map,
            ring,
            pending: Mutex::default(),
            next_tag: AtomicU64::new(1),
        });
        tokio::spawn(poll_completions(Arc::downgrade(&plane)));
        plane
    }

    /// Writes one requested chunk; resolves when the write is known done.
    pub(crate) async fn write(&self, req: RdmaRequest) -> RdmaReply {
        if self.map.number(req.chunk).is_none() {
            return RdmaReply::Unavailable("no such chunk".into());
        }
        let len = self.map.chunk_len(req.chunk);
        if len != u64::from(req.len) || req.slot >= self.ring.slots || req.len > self.ring.slot_size
        {
            return RdmaReply::Unavailable(format!(
                "bad request: chunk of {len} bytes, asked {} into slot {} of {}",
                req.len, req.slot, self.ring.slots
            ));
        }
        // The bounce slot (if any) is held until the write is done.
        let (local_addr, lkey, _slot) = match &self.origin {
            Origin::Files(sources) => {
                let Some(region) = sources.get(req.chunk.file as usize).and_then(|s| s.region)
                else {
                    return RdmaReply::Unavailable("no such file".into());
                };
                (region.addr + self.map.offset(req.chunk), region.lkey, None)
            }
            Origin::Bounce { reader, pool } => {
                let r = reader.clone();
                let chunk = req.chunk;
                let bytes = match tokio::task::spawn_blocking(move || r.read_chunk(chunk)).await {
                    Ok(Ok(b)) => b,
                    Ok(Err(why)) => return RdmaReply::Unavailable(why.to_string()),
                    Err(e) => return RdmaReply::Failed(format!("reading the chunk failed: {e}")),
                };
                if bytes.len() as u64 != len {
                    return RdmaReply::Unavailable(format!(
                        "the chunk read back as {} bytes, not {len}",
                        bytes.len()
                    ));
                }
                match pool.fill(&bytes).await {
                    Ok((addr, lkey, slot)) => (addr, lkey, Some(slot)),
                    Err(why) => return RdmaReply::Failed(why.to_string()),
                }
            }
        };
        let wr = WriteImm {
            wr_id: 0,
            local_addr,
            len: req.len,
            lkey,
            remote_addr: self.ring.addr + u64::from(req.slot) * u64::from(self.ring.slot_size),
            rkey: self.ring.rkey,
            imm: req.imm,
            signaled: false,
        };
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(tag, (wr, tx));
        let actions = self.queues.lock().unwrap().submit(WriteReq {
            tag,
            qp: req.qp,
            len: req.len,
        });
        self.post(actions);
        match rx.await {
            Ok(Ok(())) => RdmaReply::Written,
            Ok(Err(why)) => RdmaReply::Failed(why.to_string()),
            Err(_) => RdmaReply::Failed("the data plane stopped".into()),
        }
    }

    fn post(&self, actions: Vec<SendAction>) {
        for SendAction::Post {
            tag,
            qp,
            wr_id,
            signaled,
        } in actions
        {
            let wr = self.pending.lock().unwrap().get(&tag).map(|(w, _)| *w);
            let Some(mut wr) = wr else { continue };
            wr.wr_id = wr_id;
            wr.signaled = signaled;
            if let Err(e) = self.verbs.post_write_imm(qp, wr) {
                self.fail_qp(qp, WriteFailed::Post { qp, error: e });
            }
        }
    }

    fn fail_qp(&self, qp: u32, why: WriteFailed) {
        let lost = self.queues.lock().unwrap().fail(qp);
        let mut pending = self.pending.lock().unwrap();
        for tag in lost {
            if let Some((_, tx)) = pending.remove(&tag) {
                let _ = tx.send(Err(why.clone()));
            }
        }
    }

    fn on_completion(&self, c: Completion) {
        if c.kind != WcKind::Write {
            return;
        }
        if c.status != WcStatus::Success {
            self.fail_qp(
                c.qp,
                WriteFailed::Completion {
                    qp: c.qp,
                    status: c.status,
                },
            );
            return;
        }
        let (done, more) = self.queues.lock().unwrap().completed(c.qp, c.wr_id);
        {
            let mut pending = self.pending.lock().unwrap();
            for tag in done {
                if let Some((_, tx)) = pending.remove(&tag) {
                    let _ = tx.send(Ok(()));
                }
            }
        }
        self.post(more);
    }
}

#[cfg(test)]
mod tests {
    use super::super::double::{DoubleHub, Fabric};
    use super::super::link::Offer;
    use super::*;
    use crate::config::auth::Credential;
    use crate::flow::receive::{receive, Links};
    use crate::store::Store;
    use crate::transport::files::FileChunkReader;
    use crate::transport::quic;
    use crate::transport::serve::{serve, Serving};
    use crate::transport::ChunkReader;
    use crate::transport::Fetcher;
    use rand::{RngCore, SeedableRng};
    use tokio_util::sync::CancellationToken;
    use xfer_proto::chunkset::ChunkSet;
    use xfer_proto::names::ModelName;

    const CHUNK: u32 = 1 << 20;

    /// How the serving node takes part.
    enum Server {
        /// With a NIC of the hub and its complete files.
        Rdma,
        /// With no NIC (`--transport quic`, or no device).
        NoNic,
        /// With a NIC, serving a model still arriving (a swarm peer).
        Relay,
    }

    struct Run {
        _tmp: tempfile::TempDir,
        hub: DoubleHub,
        fetcher: Fetcher,
        root: String,
        want: String,
        dst: PathBuf,
        src: PathBuf,
        chunks: u64,
    }

    impl Run {
        fn fabric(&self) -> Fabric {
            let f = self.hub.fabrics();
            assert_eq!(f.len(), 1, "one data plane per connection");
            f[0].clone()
        }

        fn rdma(&self) -> &RdmaFetcher {
            match &self.fetcher {
                Fetcher::Rdma(f) => f,
                Fetcher::Quic(_) => panic!("the data plane did not come up"),
            }
        }

        /// The tree arrived whole and every write kept to the ring's rules.
        fn assert_arrived(&self) {
            assert_eq!(self.root, self.want);
            same_tree(&self.src, &self.dst);
            for f in self.hub.fabrics() {
                assert!(f.violations().is_empty(), "{:?}", f.violations());
            }
        }

        /// One data plane came up and carried every chunk.
        fn assert_all_over_rdma(&self) {
            self.assert_arrived();
            assert_eq!(self.rdma().chunks_over_rdma(), self.chunks);
            assert_eq!(self.fabric().writes(), self.chunks);
            assert_eq!(self.rdma().plane().broken(), None);
        }

        /// The data plane carried at least `min` chunks, not all, and then
        /// broke on queue pair `qp`; QUIC carried the rest.
        fn assert_fell_back(&self, min: u64, qp: u32) {
            self.assert_arrived();
            let over = self.rdma().chunks_over_rdma();
            assert!(
                over >= min && over < self.chunks,
                "{over} of {} over RDMA",
                self.chunks
            );
            let why = self.rdma().plane().broken().unwrap();
            assert!(why.contains(&format!("queue pair {qp}")), "{why}");
        }
    }

    /// Moves a model-like tree from one node to another: requests and the
    /// queue-pair exchange on real QUIC over loopback, the data plane on
    /// the double; `tweak` may set faults on the hub first.
    async fn transfer(seed: u64, server: Server, tweak: impl FnOnce(&DoubleHub)) -> Run {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let src = dir.join("src");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        for (name, len) in [
            ("model-00001.safetensors", 9 * CHUNK as usize + 4099),
            ("sub/model-00002.safetensors", 3 * CHUNK as usize),
            ("config.json", 517),
            ("empty", 0),
        ] {
            let mut b = vec![0u8; len];
            rng.fill_bytes(&mut b);
            std::fs::write(src.join(name), b).unwrap();
        }
        let tree = crate::store::scan::scan(&src, u64::from(CHUNK), &|_| {}).unwrap();
        let manifest = Arc::new(tree.manifest);
        let map = Arc::new(ChunkMap::new(&manifest));

        crate::config::auth::keygen(&dir.join("key"), true).unwrap();
        let cred = Credential::load(&dir.join("key")).unwrap();
        let server_ep = quic::server_endpoint("127.0.0.1:0".parse().unwrap(), &cred).unwrap();
        let addr = server_ep.local_addr().unwrap();
        let client = quic::client_endpoint(&cred, addr).unwrap();
        let accepting = tokio::spawn(async move {
            let incoming = server_ep.accept().await.unwrap();
            (incoming.await.unwrap(), server_ep)
        });
        let conn = quic::connect(&client, addr, Duration::from_secs(5))
            .await
            .unwrap();
        let (served, _server) = accepting.await.unwrap();

        let hub = DoubleHub::new(seed);
        tweak(&hub);
        let offer = match server {
            Server::Rdma => Offer {
                nic: Some(hub.nic()),
                files: Some(tree.sources.clone()),
            },
            Server::NoNic => Offer::none(),
            Server::Relay => Offer {
                nic: Some(hub.nic()),
                files: None,
            },
        };
        let reader: Arc<dyn ChunkReader> =
            Arc::new(FileChunkReader::new(tree.sources.clone(), map.clone()));
        tokio::spawn(serve(served, Serving::new(map.clone(), reader, offer)));

        let store = Store::open(&dir.join("dst")).unwrap();
        let name = ModelName::new("m").unwrap();
        let t = Arc::new(store.begin(&name, manifest.clone()).unwrap());
        let fetcher = Fetcher::connect(conn, Some(&hub.nic()), u64::from(CHUNK)).await;
        let got = receive(
            t,
            vec![(0, fetcher.clone(), ChunkSet::full(map.len()))],
            Links::none(),
            crate::engine::scheduler::Config::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        Run {
            _tmp: tmp,
            hub,
            fetcher,
            root: got.root.to_hex().to_string(),
            want: manifest.root().to_hex().to_string(),
            dst: store.model_dir(&name),
            src,
            chunks: map.len(),
        }
    }

    fn same_tree(a: &std::path::Path, b: &std::path::Path) {
        for name in [
            "model-00001.safetensors",
            "sub/model-00002.safetensors",
            "config.json",
            "empty",
        ] {
            assert_eq!(
                std::fs::read(a.join(name)).unwrap(),
                std::fs::read(b.join(name)).unwrap(),
                "{name}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_model_moves_over_the_data_plane_with_every_chunk_verified() {
        transfer(1, Server::Rdma, |_| {})
            .await
            .assert_all_over_rdma();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_queue_pair_error_mid_transfer_falls_back_to_quic_and_completes() {
        let r = transfer(2, Server::Rdma, |hub| hub.fail_serving_after(2, 2)).await;
        r.assert_fell_back(2, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_without_a_nic_refuses_the_exchange_and_quic_carries_it() {
        let r = transfer(3, Server::NoNic, |_| {}).await;
        assert!(matches!(r.fetcher, Fetcher::Quic(_)));
        r.assert_arrived();
        // The fetching node made queue pairs, but no fabric was ever joined.
        assert!(r.hub.fabrics().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_relay_serves_chunks_of_a_model_still_arriving_through_its_bounce_pool() {
        transfer(4, Server::Relay, |_| {})
            .await
            .assert_all_over_rdma();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_relay_whose_queue_pair_fails_falls_back_to_quic_and_completes() {
        let r = transfer(5, Server::Relay, |hub| hub.fail_serving_after(1, 3)).await;
        r.assert_fell_back(3, 1);
    }
}
