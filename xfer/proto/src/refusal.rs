//! [`Refusal`]: why an agent refused a request or abandoned a transfer,
//! the one error every service answers with. Each says what to do.

use serde::{Deserialize, Serialize};

/// Why a receiver refused or abandoned a transfer. Each says what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    #[error("protocol version {theirs} is not {ours}; run the same xfer version on every node")]
    Version { ours: u32, theirs: u32 },
    #[error("rejected manifest: {0}")]
    BadManifest(String),
    #[error("rejected: {0}")]
    BadName(String),
    #[error("no space: need {need}, have {have} at {path}; free space there or start the agent with another --root", need = crate::units::Bytes(*need), have = crate::units::Bytes(*have))]
    NoSpace { need: u64, have: u64, path: String },
    #[error("disk error at {path}: {message}")]
    Io { path: String, message: String },
    #[error("refusing to write {path}: {reason}")]
    Unsafe { path: String, reason: String },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("chunk {file}/{index} failed its BLAKE3 check {times} times; the source's copy may be changing or damaged")]
    Corrupt { file: u32, index: u32, times: u32 },
    #[error("transfer superseded by a newer push of the same model")]
    Superseded,
    #[error("lost the source: {0}; run the push again to resume")]
    SourceLost(String),
    #[error("this agent holds no complete model named `{0}`; push it there first")]
    NotHeld(String),
    #[error("the source sent {strikes} chunks that failed their BLAKE3 check and was dropped; its files may be changing while being sent, or its disk or memory is damaged (run `xfer verify` or `b3sum` there)")]
    CorruptSource { strikes: u32 },
    #[error("busy: {0}")]
    Busy(String),
    /// The agent's operator has not allowed this (`--allow-launch`,
    /// `--allow-exec`, `--export`); the text names the node and the switch.
    #[error("{0}")]
    Forbidden(String),
    /// An image could not be loaded (a blob missing or damaged, the
    /// container engine failed); the text names the node, the cause and
    /// the fix.
    #[error("{0}")]
    Image(String),
}

/// A refusal as every service's reply encodes it. [`crate::transfer::TransferMsg`],
/// [`crate::admin::AdminReply`] and [`crate::launch::LaunchReply`] each
/// put `Failed(Refusal)` first, at tag 0, so this one frame reads as the
/// right reply whatever the service: an agent can refuse a stream before
/// it knows which service the opener wanted (an unreadable
/// [`crate::hello::Hello`], another version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailedReply {
    Failed(Refusal),
}

impl Refusal {
    /// This refusal as a reply of any service.
    pub fn into_failed(self) -> FailedReply {
        FailedReply::Failed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::AdminReply;
    use crate::frame::{decode_frame, encode};
    use crate::launch::LaunchReply;
    use crate::transfer::TransferMsg;

    #[test]
    fn one_refusal_frame_reads_as_every_services_failed_reply() {
        let r = Refusal::Version { ours: 3, theirs: 2 };
        let frame = encode(&r.clone().into_failed());
        assert_eq!(frame, encode(&TransferMsg::Failed(r.clone())));
        assert_eq!(
            decode_frame::<TransferMsg>(&frame).unwrap(),
            TransferMsg::Failed(r.clone())
        );
        assert_eq!(
            decode_frame::<AdminReply>(&frame).unwrap(),
            AdminReply::Failed(r.clone())
        );
        assert_eq!(
            decode_frame::<LaunchReply>(&frame).unwrap(),
            LaunchReply::Failed(r)
        );
    }
}
