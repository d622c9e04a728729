//! Several QUIC connections to one peer, used as one.
//!
//! One QUIC connection is driven by one task at a time, so it is one core
//! on each end whatever the link. A fetching node may hold several
//! connections (lanes) to one peer, each on its own endpoint and socket,
//! so the runtime can drive them on different cores; a [`Lanes`] spreads
//! chunk requests over them, each to the lane with the fewest requests in
//! flight. The first lane is the connection the transfer started on: its
//! loss is the loss of the peer. An extra lane that closes is dropped and
//! its requests go to the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use quinn::Connection;

/// Most connections to one peer (`--connections`). Each is a socket, a
/// handshake and its windows; past the cores of a node more only cost.
pub const MAX_CONNECTIONS: usize = 64;

/// The default number of connections per peer on this machine: one per
/// two cores (each connection keeps a core busy on each end at line
/// rate, and the other cores hash, write and serve), at most four, at
/// least one. One on a 2-core machine, four from 8 cores up.
pub fn default_connections() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).clamp(1, 4)
}

/// Why a `--connections` value is refused; the line names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionsError {
    /// Not a number.
    #[error("`{0}` is not a number; pass --connections 1 to {MAX_CONNECTIONS}")]
    NotANumber(String),
    /// Zero, or more than [`MAX_CONNECTIONS`].
    #[error("{0} connections is out of range; pass --connections 1 to {MAX_CONNECTIONS} (default here: {default})", default = default_connections())]
    OutOfRange(usize),
}

/// Checks a `--connections` value (clap's value parser).
pub fn parse_connections(s: &str) -> Result<usize, ConnectionsError> {
    let n: usize = s
        .parse()
        .map_err(|_| ConnectionsError::NotANumber(s.to_string()))?;
    if n == 0 || n > MAX_CONNECTIONS {
        return Err(ConnectionsError::OutOfRange(n));
    }
    Ok(n)
}

#[derive(Clone)]
struct Lane {
    conn: Connection,
    /// Requests in flight on this lane.
    busy: Arc<AtomicUsize>,
}

/// The connections to one peer, the first being the one the transfer
/// started on. Clones share the lanes.
#[derive(Clone)]
pub struct Lanes {
    lanes: Arc<Mutex<Vec<Lane>>>,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lanes({})", self.len())
    }
}

/// A request in flight on a lane; counted until dropped.
pub(crate) struct Taken {
    pub(crate) conn: Connection,
    pub(crate) primary: bool,
    busy: Arc<AtomicUsize>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Lanes {
    /// One lane: `primary`.
    pub fn new(primary: Connection) -> Lanes {
        Lanes {
            lanes: Arc::new(Mutex::new(vec![Lane {
                conn: primary,
                busy: Arc::default(),
            }])),
        }
    }

    /// Adds a lane; returns how many there are now.
    pub fn add(&self, conn: Connection) -> usize {
        let mut lanes = self.lanes.lock().unwrap();
        lanes.push(Lane {
            conn,
            busy: Arc::default(),
        });
        lanes.len()
    }

    /// How many lanes there are.
    pub fn len(&self) -> usize {
        self.lanes.lock().unwrap().len()
    }

    /// Never: there is always the primary lane.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The connection the transfer started on.
    pub fn primary(&self) -> Connection {
        self.lanes.lock().unwrap()[0].conn.clone()
    }

    /// The live lane with the fewest requests in flight (the first of
    /// equals, so one lane is used until it has work queued), counted as
    /// busy with one more until the returned guard is dropped. Extra lanes
    /// that closed are dropped here.
    pub(crate) fn take(&self) -> Taken {
        let mut lanes = self.lanes.lock().unwrap();
        let mut i = 1;
        while i < lanes.len() {
            if lanes[i].conn.close_reason().is_some() {
                lanes.swap_remove(i);
            } else {
                i += 1;
            }
        }
        let (index, lane) = lanes
            .iter()
            .enumerate()
            .min_by_key(|(_, l)| l.busy.load(Ordering::Relaxed))
            .expect("the primary lane is never removed");
        lane.busy.fetch_add(1, Ordering::Relaxed);
        Taken {
            conn: lane.conn.clone(),
            primary: index == 0,
            busy: lane.busy.clone(),
        }
    }
}
