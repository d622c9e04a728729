//! The verbs the RDMA data plane uses, as a trait: what the ring protocol
//! needs from a NIC once its queue pairs are connected, and nothing more.
//!
//! Two implementations: [`super::sys`] over libibverbs (`rdma-sys`, cargo
//! feature `rdma`), and [`super::double`], an in-process double that
//! enforces the rules real hardware enforces (rkeys, bounds, access flags,
//! receive WRs, queue depths, flushes after an error) so the adapter logic
//! runs end to end on machines without a NIC.

use std::fmt;

/// A registered memory region, as the side that registered it sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// What a registration allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Source files: read by the local NIC only (no local write: since
    /// Linux 6.5 a writable registration of a shared file mapping fails).
    LocalRead,
    /// The receive ring: the remote side writes into it.
    RemoteWrite,
}

/// One RDMA WRITE_WITH_IMM: `len` bytes at `local_addr` (in a region with
/// `lkey`) to `remote_addr` (in the peer's region with `rkey`); the peer
/// gets a receive completion carrying `imm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteImm {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Source address.
    pub local_addr: u64,
    /// Bytes to write.
    pub len: u32,
    /// Local key of the source region.
    pub lkey: u32,
    /// Destination address in the peer's memory.
    pub remote_addr: u64,
    /// Remote key of the destination region.
    pub rkey: u32,
    /// Immediate value the peer receives.
    pub imm: u32,
    /// Ask for a completion (selective signalling: most writes do not).
    pub signaled: bool,
}

/// How a work request ended (`ibv_wc_status`, the ones that matter here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// The remote key or bounds were wrong (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccess,
    /// The local key or bounds were wrong (`IBV_WC_LOC_PROT_ERR`).
    LocalProtection,
    /// The peer had no receive WR posted (`IBV_WC_RNR_RETRY_EXC_ERR`).
    ReceiverNotReady,
    /// The QP went to the error state; this WR was never executed
    /// (`IBV_WC_WR_FLUSH_ERR`).
    Flushed,
    /// Retries exhausted: the link or the peer is gone
    /// (`IBV_WC_RETRY_EXC_ERR`).
    Transport,
    /// Any other status, by number.
    Other(u32),
}

/// Which side of a work request completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcKind {
    /// Sender: a signalled RDMA write finished.
    Write,
    /// Receiver: a WRITE_WITH_IMM landed and consumed a receive WR.
    RecvImm {
        /// The immediate value.
        imm: u32,
        /// Bytes written.
        byte_len: u32,
    },
}

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The queue pair.
    pub qp: u32,
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// Which side completed.
    pub kind: WcKind,
}

/// Why a verb failed to post.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    #[error("queue pair {0} is in the error state")]
    /// The queue pair is in the error state.
    QpError(u32),
    #[error("send queue of queue pair {0} is full")]
    /// The send queue is full.
    QueueFull(u32),
    #[error("no queue pair {0}")]
    /// No such queue pair.
    NoQp(u32),
    #[error("{0}")]
    /// The verb failed; the text names it and the usual cause.
    Os(String),
}

/// The data-plane verbs of one connected set of queue pairs.
pub trait Verbs: Send + Sync + 'static {
    /// Registers `len` bytes at `addr`.
    fn register(&self, addr: u64, len: u64, access: Access) -> Result<Region, VerbsError>;
    /// Posts a write on queue pair `qp` (0-based, of this connection).
    fn post_write_imm(&self, qp: u32, wr: WriteImm) -> Result<(), VerbsError>;
    /// Posts a receive WR on `qp` (each WRITE_WITH_IMM consumes one).
    fn post_recv(&self, qp: u32, wr_id: u64) -> Result<(), VerbsError>;
    /// Appends up to `max` completions of every queue pair to `out`.
    fn poll(&self, out: &mut Vec<Completion>, max: usize);
    /// The send queue depth of each queue pair.
    fn send_depth(&self) -> u32;
    /// How many queue pairs this connection has.
    fn qps(&self) -> u32;
    /// The fetching node opened `len` bytes at `offset` of its `region` to
    /// one write (a ring slot granted in a request). Hardware needs no
    /// call; the double uses it to catch writes into slots never granted.
    fn open_window(&self, _region: &Region, _offset: u64, _len: u64) {}
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WcStatus::Success => f.write_str("success"),
            WcStatus::RemoteAccess => f.write_str("remote access error (rkey or bounds)"),
            WcStatus::LocalProtection => f.write_str("local protection error (lkey or bounds)"),
            WcStatus::ReceiverNotReady => f.write_str("receiver not ready (no receive posted)"),
            WcStatus::Flushed => f.write_str("flushed (queue pair in error)"),
            WcStatus::Transport => f.write_str("transport retries exhausted"),
            WcStatus::Other(n) => write!(f, "status {n}"),
        }
    }
}
