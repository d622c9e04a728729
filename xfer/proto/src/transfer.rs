//! The transfer service: the messages of a push (offer, swarm, accepted,
//! progress, done), of a peer link in a swarm (join, bitfield, has) and of
//! a fetch of a held model (want, have), each refusable with a
//! [`Refusal`].
//!
//! A transfer stream opens with [`crate::hello::Hello`] for
//! [`crate::hello::Service::Transfer`]; its first [`TransferMsg`] is one of
//! the openers (`Offer`, `Join`, `Want`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::chunkset::ChunkSet;
use crate::draft::{DraftEvent, DraftListing};
use crate::hash::Hash;
use crate::manifest::Manifest;
use crate::names::ModelName;
pub use crate::refusal::Refusal;

/// Most connections a peer link opens, whatever a `Swarm` says.
pub const MAX_PEER_CONNECTIONS: u32 = 64;

/// Messages on a transfer stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TransferMsg {
    /// Refused or failed. First, at tag 0, in every service's replies:
    /// see [`crate::refusal::FailedReply`].
    Failed(Refusal),
    /// Source → receiver: store this tree under `name`.
    Offer {
        /// The model's name on the receiver.
        name: ModelName,
        /// The tree.
        manifest: Manifest,
    },
    /// Receiver → source: accepted; this much is already held.
    Accepted {
        /// Bytes of verified chunks already held.
        held_bytes: u64,
        /// Verified chunks already held.
        held_chunks: u64,
        /// Bytes still to fetch.
        need_bytes: u64,
        /// A secret of this transfer, for the source alone (the reply
        /// goes over its authenticated connection): a [`TransferMsg::Lane`]
        /// must carry it, from whichever address the source connects.
        lane_key: [u8; 16],
    },
    /// Receiver → source: the tree is complete and verified.
    Done {
        /// The tree's root.
        root: Hash,
        /// Chunk bytes that arrived and passed their check.
        received_bytes: u64,
        /// Chunks that failed their check and were fetched again.
        corrupt_chunks: u64,
    },
    /// Peer → agent: send me the complete model `name` you hold.
    Want {
        /// The model.
        name: ModelName,
    },
    /// Agent → peer: this is the model; fetch its chunks on this connection.
    Have {
        /// The model's tree.
        manifest: Manifest,
    },
    /// Source → receiver, right after `Offer`: you are `me` in a swarm;
    /// link to these peers (`peers` lists you too, for your label), and
    /// fetch from the source as home to `homes` (`None`: fetch from peers
    /// only). `bounded`: the swarm is larger than one receiver's links
    /// (each sees only a few peers). Later changes come as `Links` and
    /// `Feed`. Without it a receiver fetches from the source alone.
    Swarm {
        /// The receiver's id in the swarm.
        me: u32,
        /// The peers to link to, and the receiver itself.
        peers: Vec<SwarmPeer>,
        /// The chunks it fetches from the source; `None`: from peers only.
        homes: Option<HomeSlots>,
        /// Whether it sees only a few of the swarm's receivers.
        bounded: bool,
        /// Connections each of its peer links opens (the push's
        /// `--connections`; the receiver takes 1 to
        /// [`MAX_PEER_CONNECTIONS`]).
        connections: u32,
    },
    /// Receiver → receiver, opening a peer link: I am `from` in the swarm
    /// for model `name` with root `root`; announce what you hold.
    Join {
        /// The model.
        name: ModelName,
        /// Its root (or a draft's id).
        root: Hash,
        /// The joiner's id in the swarm.
        from: u32,
    },
    /// Receiver → peer: the verified chunks I hold now (global numbers).
    Bitfield {
        /// The chunks.
        has: ChunkSet,
    },
    /// Receiver → peer: chunks verified since the last announcement.
    Has {
        /// The chunks' numbers.
        chunks: Vec<u64>,
    },
    /// Receiver → source: how far along this node is, where its bytes
    /// came from, and how many peer links it holds (now, and at most).
    Progress {
        /// Bytes of verified chunks held.
        held_bytes: u64,
        /// Verified bytes that came from the source.
        from_source: u64,
        /// Verified bytes that came from peers.
        from_peers: u64,
        /// Peer links now.
        links: u32,
        /// Peer links at most, so far.
        max_links: u32,
    },
    /// Receiver → source: a peer was excluded from this transfer.
    PeerDropped {
        /// The peer's address.
        peer: SocketAddr,
        /// Why it was excluded.
        reason: String,
    },
    /// Receiver → source: this node reaches a peer over its management
    /// address, because the peer's data address failed.
    Fallback(FallbackRoute),
    /// Source → receiver: link to `add`, drop the links to `remove` (the
    /// swarm's peer graph was rewired).
    Links {
        /// Peers to link to.
        add: Vec<SwarmPeer>,
        /// Ids of the peers to unlink.
        remove: Vec<u32>,
    },
    /// Source → receiver: fetch from the source as home to these chunks
    /// from now on (`None`: no longer fetch from the source).
    Feed(Option<HomeSlots>),
    /// Receiver → source: peer `peer` serves far slower than the others.
    Slow {
        /// The peer's id.
        peer: u32,
    },
    /// Source → receiver, opening an extra connection (`--connections`):
    /// fetch chunks of the transfer of `name` (root `root`) that this
    /// source started over this connection too.
    Lane {
        /// The model.
        name: ModelName,
        /// Its root (or a draft's id).
        root: Hash,
        /// The transfer's `lane_key`, from [`TransferMsg::Accepted`].
        key: [u8; 16],
    },
    /// Receiver → source: the connection is in use; the transfer now has
    /// `lanes` connections to the source.
    LaneAttached {
        /// Connections to the source now.
        lanes: u32,
    },
    /// Source → receiver, an opener like `Offer`: store under `name` the
    /// files the source is still downloading. Their chunk hashes, seals
    /// and withdrawals follow as `Draft` messages; the root is known once
    /// every file is sealed. `id` names the draft where a root would (peer
    /// links, extra connections, the receiver's journal).
    OfferDraft {
        /// The model's name on the receiver.
        name: ModelName,
        /// The draft's id.
        id: Hash,
        /// The files' paths and sizes, and the chunk size.
        listing: DraftListing,
    },
    /// Source → receiver: what the download learnt about a drafted file.
    Draft(DraftEvent),
    /// Receiver → source: no link to peer `peer` could be made at all (no
    /// answer at any of its addresses): the pair is cut, the peer is not
    /// slow for the others.
    Unreachable {
        /// The peer's id.
        peer: u32,
    },
    /// Source → intake node, an opener (issue 36, striped intake): fetch
    /// the bytes `[from, to)` of `url` from the origin (the Hub's CDN or a
    /// mirror) over this node's own link and stream them back. `name` is
    /// the model being pulled: the caller must be one that may deliver it
    /// here. `token` goes only with a URL on the Hub's own origin.
    Intake {
        /// The model the bytes are for.
        name: ModelName,
        /// The file of the source's draft the bytes are part of, when the
        /// pull streams one: the intake node, a receiver of that draft too,
        /// keeps the bytes it fetched as candidates of its own transfer
        /// (checked when the source announces their chunks), so the swarm
        /// need not send them back to it.
        file: Option<crate::draft::FileIndex>,
        /// The resolved file URL (no further redirect is followed).
        url: String,
        /// First byte.
        from: u64,
        /// One past the last byte; at most [`MAX_INTAKE_SPAN`] after `from`.
        to: u64,
        /// The Hub token, for a URL on the endpoint's origin.
        token: Option<crate::secret::Secret>,
    },
    /// Intake node → source: the origin answered; exactly `len` raw bytes
    /// follow on the stream (fewer: the origin or the node failed mid-way,
    /// and the source keeps what arrived).
    IntakeBody {
        /// Bytes that follow.
        len: u64,
    },
}

/// Most bytes one [`TransferMsg::Intake`] may ask for.
pub const MAX_INTAKE_SPAN: u64 = 256 << 20;

/// The chunks a receiver fetches from the source: chunk `c` is in slot
/// `c mod of`, and the receiver is home to `slots`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeSlots {
    /// How many slots the chunks are dealt into.
    pub of: u32,
    /// The slots this receiver is home to.
    pub slots: Vec<u32>,
}

impl HomeSlots {
    /// Most slots a swarm may have (a source assigns one per feeder).
    pub const MAX: u32 = 1 << 16;

    /// Whether it is usable: `of` in 1..=MAX, slots below `of`, no more
    /// than `of` of them.
    pub fn is_well_formed(&self) -> bool {
        (1..=Self::MAX).contains(&self.of)
            && self.slots.len() <= self.of as usize
            && self.slots.iter().all(|&s| s < self.of)
    }
}

/// One member of a swarm, as the source lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwarmPeer {
    /// Its id in the swarm (the source is 0).
    pub id: u32,
    /// What the member is called in messages: its node name in a sync
    /// job, its agent address in a push.
    pub label: String,
    /// Where its data goes: its data address (its fabric), or its agent
    /// address when it has none.
    pub addr: SocketAddr,
    /// Its agent (management) address when that differs from `addr`: the
    /// way to it when `addr` cannot be reached.
    pub fallback: Option<SocketAddr>,
}

/// A pair of nodes whose data goes over management because one's data
/// address could not be reached. Shown in push output and `xfer status`,
/// never silent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FallbackRoute {
    /// The node that connects (a receiver, or the source).
    pub from: String,
    /// The node it connects to.
    pub to: String,
    /// The data address that failed.
    pub data: SocketAddr,
    /// Why it failed.
    pub error: String,
}

impl std::fmt::Display for FallbackRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} → {} over management: fabric {} unreachable ({}); check the fabric link and `fabric_ip`",
            self.from, self.to, self.data, self.error
        )
    }
}

impl TransferMsg {
    /// The message's name, for errors.
    pub fn kind(&self) -> &'static str {
        match self {
            TransferMsg::Offer { .. } => "Offer",
            TransferMsg::Accepted { .. } => "Accepted",
            TransferMsg::Done { .. } => "Done",
            TransferMsg::Failed(_) => "Failed",
            TransferMsg::Want { .. } => "Want",
            TransferMsg::Have { .. } => "Have",
            TransferMsg::Swarm { .. } => "Swarm",
            TransferMsg::Join { .. } => "Join",
            TransferMsg::Bitfield { .. } => "Bitfield",
            TransferMsg::Has { .. } => "Has",
            TransferMsg::Progress { .. } => "Progress",
            TransferMsg::PeerDropped { .. } => "PeerDropped",
            TransferMsg::Fallback(_) => "Fallback",
            TransferMsg::Links { .. } => "Links",
            TransferMsg::Feed(_) => "Feed",
            TransferMsg::Slow { .. } => "Slow",
            TransferMsg::Lane { .. } => "Lane",
            TransferMsg::LaneAttached { .. } => "LaneAttached",
            TransferMsg::OfferDraft { .. } => "OfferDraft",
            TransferMsg::Draft(_) => "Draft",
            TransferMsg::Unreachable { .. } => "Unreachable",
            TransferMsg::Intake { .. } => "Intake",
            TransferMsg::IntakeBody { .. } => "IntakeBody",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode, decode_frame, encode, frame_len, WireError};
    use crate::manifest::{ChunkId, MANIFEST_VERSION};
    use crate::stream::ChunkRequest;

    #[test]
    fn messages_round_trip() {
        let m = TransferMsg::Offer {
            name: ModelName::new("llama-3").unwrap(),
            manifest: Manifest {
                version: MANIFEST_VERSION,
                chunk_size: 1 << 22,
                entries: vec![],
            },
        };
        assert_eq!(decode_frame::<TransferMsg>(&encode(&m)).unwrap(), m);
        let r = ChunkRequest {
            chunk: ChunkId { file: 3, index: 9 },
        };
        assert_eq!(decode_frame::<ChunkRequest>(&encode(&r)).unwrap(), r);
        let f = TransferMsg::Failed(Refusal::NoSpace {
            need: 10,
            have: 2,
            path: "/x".into(),
        });
        assert_eq!(decode_frame::<TransferMsg>(&encode(&f)).unwrap(), f);
        let l = TransferMsg::Lane {
            name: ModelName::new("llama-3").unwrap(),
            root: Hash([7; 32]),
            key: [9; 16],
        };
        assert_eq!(decode_frame::<TransferMsg>(&encode(&l)).unwrap(), l);
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert!(matches!(
            frame_len([0xff; 4]),
            Err(WireError::TooLarge { .. })
        ));
        assert!(decode_frame::<TransferMsg>(&[0, 0]).is_err());
        assert!(decode_frame::<TransferMsg>(&[0, 0, 0, 2, 0xff, 0xff]).is_err());
        let mut good = encode(&ChunkRequest {
            chunk: ChunkId { file: 1, index: 1 },
        });
        good.push(0);
        good[3] += 1;
        assert!(matches!(
            decode_frame::<ChunkRequest>(&good),
            Err(WireError::Malformed(_))
        ));
        // A name that would escape the root is refused while decoding.
        let evil = encode(&String::from("../etc"));
        assert!(decode_frame::<ModelName>(&evil).is_err());
        // Random bytes never panic.
        let mut x = 12345u64;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode::<TransferMsg>(&bytes);
        }
    }

    #[test]
    fn model_names() {
        assert!(ModelName::new("models--org--name").is_ok());
        for bad in ["", ".xfer", "a/b", "..", "a b", &"x".repeat(201)] {
            assert!(ModelName::new(bad).is_err(), "{bad}");
        }
    }
}
