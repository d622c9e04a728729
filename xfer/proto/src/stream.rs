//! The chunk streams: one short stream per chunk, opened by the node that
//! wants it. Its first frame is a [`StreamRequest`], tagged by kind, so the
//! server never tells requests apart by trying decoders in turn. Chunk
//! bytes follow their [`ChunkReply::Data`] header raw, unframed, so they
//! are never copied through a serializer.

use serde::{Deserialize, Serialize};

use crate::manifest::ChunkId;

/// The first frame of every stream a fetching node opens, tagged by kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StreamRequest {
    /// Send this chunk's bytes on this stream, over QUIC.
    Chunk(ChunkRequest),
    /// Bring up the RDMA data plane of this connection (the exchange
    /// continues on this stream).
    RdmaHello(RdmaHello),
    /// Write this chunk into the ring by RDMA; answered with [`RdmaReply`].
    Rdma(RdmaRequest),
}

/// Why a server reset a stream, as the QUIC reset code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ResetCode {
    /// The request was malformed or too large.
    BadRequest = 1,
    /// The chunk could not be read or sent.
    SendFailed = 2,
}

impl ResetCode {
    /// The code on the wire.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The reset code a peer sent, if it is one of ours.
    pub fn from_code(code: u64) -> Option<ResetCode> {
        match code {
            1 => Some(ResetCode::BadRequest),
            2 => Some(ResetCode::SendFailed),
            _ => None,
        }
    }
}

/// One queue pair as the peer needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpInfo {
    /// Its queue pair number.
    pub qpn: u32,
    /// The first packet sequence number it sends with (24 bits).
    pub psn: u32,
}

/// What the peer needs to connect to a set of queue pairs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Local {
    /// The port's global id (GID).
    pub gid: [u8; 16],
    /// The GID's index in the port's table.
    pub gid_index: u32,
    /// The port's active MTU in bytes (256 ... 4096).
    pub mtu: u32,
    /// The port number on the device.
    pub port: u8,
    /// The port's LID: InfiniBand routes by it within a subnet; 0 on RoCE.
    pub lid: u16,
    /// Its queue pairs.
    pub qps: Vec<QpInfo>,
}

/// The fetching node's opening of the RDMA exchange: its queue pairs.
/// (The protocol version was checked once, by the connection's Hello.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaHello {
    /// Its queue pairs and port.
    pub local: Local,
}

/// A chunk asked for over QUIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRequest {
    /// The chunk.
    pub chunk: ChunkId,
}

/// Reply header on a chunk stream. `Data` is followed by exactly the chunk's
/// length in raw bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChunkReply {
    /// The chunk's bytes follow.
    Data,
    /// The server has no bytes for it, saying why.
    Unavailable(String),
}

/// Write `chunk` (`len` bytes) into ring slot `slot` on queue pair `qp`,
/// with immediate value `imm`: a chunk request on a connection whose RDMA
/// data plane is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaRequest {
    /// The chunk.
    pub chunk: ChunkId,
    /// The ring slot to write it into.
    pub slot: u32,
    /// The queue pair to write on.
    pub qp: u32,
    /// The immediate value the write carries.
    pub imm: u32,
    /// The chunk's length in bytes.
    pub len: u32,
}

/// Reply on an RDMA chunk stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RdmaReply {
    /// The write completed (sent once a signalled completion covers it;
    /// the fetching node normally knows sooner, from its own completion).
    Written,
    /// The chunk cannot be had; nothing was written.
    Unavailable(String),
    /// The data plane failed for this write (queue pair error): fetch it
    /// another way.
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_frame, encode};

    #[test]
    fn every_stream_request_decodes_as_what_it_was_and_nothing_else() {
        let chunk = ChunkId { file: 3, index: 9 };
        let reqs = [
            StreamRequest::Chunk(ChunkRequest { chunk }),
            StreamRequest::Rdma(RdmaRequest {
                chunk,
                slot: 1,
                qp: 2,
                imm: 3,
                len: 4,
            }),
            StreamRequest::RdmaHello(RdmaHello {
                local: Local {
                    gid: [7; 16],
                    gid_index: 1,
                    mtu: 4096,
                    port: 1,
                    lid: 0,
                    qps: vec![QpInfo { qpn: 5, psn: 6 }],
                },
            }),
        ];
        for r in reqs {
            assert_eq!(decode_frame::<StreamRequest>(&encode(&r)).unwrap(), r);
        }
        // An unknown tag is an error, not another kind.
        assert!(decode_frame::<StreamRequest>(&[0, 0, 0, 3, 9, 0, 0]).is_err());
    }

    #[test]
    fn reset_codes_round_trip() {
        for c in [ResetCode::BadRequest, ResetCode::SendFailed] {
            assert_eq!(ResetCode::from_code(u64::from(c.code())), Some(c));
        }
        assert_eq!(ResetCode::from_code(0), None);
    }
}
