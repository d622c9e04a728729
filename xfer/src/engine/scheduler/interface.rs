//! What goes in and out of the [`Scheduler`](super::Scheduler): its
//! [`Config`], the [`Event`]s the runtime feeds it, the [`Action`]s it
//! asks for, and the assigned [`Homes`].

use xfer_proto::chunkset::ChunkSet;

/// A peer, as numbered by the runtime.
pub type PeerId = u32;

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Requests in flight per partial peer (and per seed unless `seed_window`).
    pub window: u32,
    /// Corrupt chunks a seed may serve before it is dropped (a partial peer
    /// is dropped at its first).
    pub max_peer_strikes: u32,
    /// Times one chunk may fail verification before the transfer stops.
    pub max_chunk_failures: u32,
    /// Requests in flight to one seed; 0 means `window`.
    pub seed_window: u32,
    /// Requests in flight across all peers; 0 means no limit but the windows.
    pub max_in_flight: u32,
    /// This receiver's own id in a swarm. When set, chunks nobody else holds
    /// are taken from a seed only by their home receiver (see module docs).
    pub me: Option<PeerId>,
    /// Seed of the per-receiver tie-break order among equally rare chunks;
    /// 0 keeps chunk order.
    pub tie_break: u64,
    /// Missing-chunk count at or below which in-flight chunks are also
    /// requested from a second holder; 0 disables the endgame.
    pub endgame: u32,
    /// In a swarm, how far ahead of the chunks already in the swarm a home
    /// chunk may be asked of the seed (chunk `c` only once `c < present +
    /// seed_lead`, and at first `c < 2 * present + 1`), so the seed serves
    /// the swarm in order, a few chunks at a time, and the first copies
    /// reach the swarm early; 0: no limit. Relies on `PeerHas` announcements
    /// reaching us: without them a receiver may wait for a swarm it never
    /// hears from.
    pub seed_lead: u32,
    /// The source's peer id, when the runtime knows it: then only the
    /// source is a seed, and a peer that joins holding everything (a
    /// receiver that finished) is asked like any partial peer, not
    /// rationed by homes. `None`: every peer that joins complete is a seed.
    pub source: Option<PeerId>,
    /// The source is still getting its chunks (a pull streaming to the
    /// swarm): it joins as a seed with the chunks it has (it is `source`,
    /// which must be set), announces the rest with `PeerHas` as it gets
    /// them, and may withdraw some ([`Event::Withdrawn`]). Nothing is
    /// stuck for want of a source until [`Event::SourceComplete`], and the
    /// seed lead does not apply (the source's chunks do not come in order).
    pub growing: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            window: 16,
            max_peer_strikes: 8,
            max_chunk_failures: 3,
            seed_window: 0,
            max_in_flight: 0,
            me: None,
            tie_break: 0,
            endgame: 0,
            seed_lead: 16,
            source: None,
            growing: false,
        }
    }
}

/// The chunks a receiver fetching from a seed is home to, as the swarm's
/// coordinator assigned them ([`crate::engine::topology`]): chunk `c` is
/// in slot `c mod of`, and the receiver owns `slots`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Homes {
    /// Slots in all.
    pub of: u32,
    /// The slots owned, sorted.
    pub slots: Vec<u32>,
}

impl Homes {
    /// Whether chunk `c` is homed here.
    pub fn contains(&self, chunk: u64) -> bool {
        self.of > 0 && self.slots.contains(&((chunk % u64::from(self.of)) as u32))
    }
}

/// Something that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A peer is connected and holds these chunks. A peer holding every chunk
    /// is a seed.
    PeerJoined {
        /// The peer.
        peer: PeerId,
        /// The chunks it holds.
        has: ChunkSet,
    },
    /// A peer now also holds a chunk.
    PeerHas {
        /// The peer.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// A fetched chunk passed its check and is stored.
    Verified {
        /// The peer it came from.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// A fetched chunk failed its BLAKE3 check.
    Corrupt {
        /// The peer it came from.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// A fetch failed without data (stream reset, peer lacked it).
    FetchFailed {
        /// The peer asked.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// A partial peer answered that it does not hold `chunk` (it was
    /// withdrawn there, or an announcement of an older download of it
    /// reached us late): it is no longer counted as a holder until it
    /// announces the chunk again, and the request is as `FetchFailed`.
    /// An announcement that arrived while the request was in flight is
    /// newer than this answer (they travel apart) and keeps it a holder.
    PeerLacks {
        /// The peer asked.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// A peer disconnected.
    PeerGone {
        /// The peer.
        peer: PeerId,
    },
    /// The runtime measured this peer serving far slower than the others:
    /// it is asked only for chunks no other peer can serve, and is no longer
    /// a home for chunks fetched from the seed.
    PeerSlow {
        /// The peer.
        peer: PeerId,
    },
    /// The swarm's coordinator assigned this receiver's home chunks (empty:
    /// it no longer fetches from the seed). From then on homes are only
    /// these, never computed from the roster, and the scheduler never
    /// reports [`StuckReason::NoSource`]: the coordinator decides who
    /// serves whom and may link new peers at any time.
    Homes(Homes),
    /// The growing source withdrew chunks `first..end` (the download they
    /// came from failed its Hub hash): whoever held them no longer does,
    /// and they are fetched again once the source announces them anew.
    Withdrawn {
        /// First chunk withdrawn.
        first: u64,
        /// One past the last chunk withdrawn.
        end: u64,
    },
    /// The growing source has every chunk: from now on a missing chunk
    /// nobody can serve is stuck, as in any transfer.
    SourceComplete,
    /// The coordinator (the source) is gone: no new links or homes will
    /// come. From then on the transfer is stuck ([`StuckReason::NoSource`])
    /// once nothing is in flight and nothing can be asked of any peer.
    CoordinatorLost,
}

/// Something the runtime should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Fetch a chunk from a peer.
    Fetch {
        /// The peer to ask.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// An earlier `Fetch` of this chunk from this peer is no longer needed
    /// (another copy arrived first, or a seed was asked for a chunk a partial
    /// peer now holds). The runtime may abort it; if it still completes, its
    /// result is ignored.
    Cancel {
        /// The peer asked.
        peer: PeerId,
        /// The chunk's number.
        chunk: u64,
    },
    /// Disconnect a peer and ask it for nothing more.
    DropPeer {
        /// The peer.
        peer: PeerId,
        /// Why.
        reason: DropReason,
    },
    /// Every chunk is held.
    Complete,
    /// No connected peer can supply what is missing, or a chunk keeps failing.
    Stuck(StuckReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// Why a peer was dropped.
pub enum DropReason {
    /// Served more corrupt chunks than allowed (a partial peer: one).
    Corrupt {
        /// Corrupt chunks it served.
        strikes: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// Why a transfer cannot go on.
pub enum StuckReason {
    /// This chunk failed verification too many times.
    ChunkKeepsFailing {
        /// The chunk's number.
        chunk: u64,
        /// How many times it failed.
        failures: u32,
    },
    /// Chunks are missing and no connected peer has them.
    NoSource {
        /// How many chunks are missing.
        missing: u64,
    },
}
