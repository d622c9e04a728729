//! [`Refusal`]: why an agent refused a request or abandoned a transfer,
//! the one error every service answers with. Each says what to do.

use serde::{Deserialize, Serialize};

/// Why a receiver refused or abandoned a transfer. Each says what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    #[error("protocol version {theirs} is not {ours}; run the same xfer version on every node")]
    /// The peer speaks another protocol version.
    Version {
        /// This node's version.
        ours: u32,
        /// The peer's version.
        theirs: u32,
    },
    #[error("rejected manifest: {0}")]
    /// The manifest failed its checks.
    BadManifest(String),
    #[error("rejected: {0}")]
    /// The model name is not allowed.
    BadName(String),
    #[error("no space: need {need}, have {have} at {path}; free space there or start the agent with another --root", need = crate::units::Bytes(*need), have = crate::units::Bytes(*have))]
    /// Not enough free space.
    NoSpace {
        /// Bytes needed.
        need: u64,
        /// Bytes free.
        have: u64,
        /// Where.
        path: String,
    },
    #[error("disk error at {path}: {message}")]
    /// A disk operation failed.
    Io {
        /// The file or folder.
        path: String,
        /// What the system said.
        message: String,
    },
    #[error("refusing to write {path}: {reason}")]
    /// Writing there would be unsafe (a symlink, a path outside the root).
    Unsafe {
        /// The path.
        path: String,
        /// Why it is unsafe.
        reason: String,
    },
    #[error("protocol error: {0}")]
    /// A message broke the protocol.
    Protocol(String),
    #[error("chunk {file}/{index} failed its BLAKE3 check {times} times; the source's copy may be changing or damaged")]
    /// A chunk kept failing its hash check.
    Corrupt {
        /// The file's index.
        file: u32,
        /// The chunk's index in the file.
        index: u32,
        /// How many times it failed.
        times: u32,
    },
    #[error("transfer superseded by a newer push of the same model")]
    /// A newer push of the same model took over.
    Superseded,
    #[error("lost the source: {0}; run the push again to resume")]
    /// The source went away.
    SourceLost(String),
    #[error("this agent holds no complete model named `{0}`; push it there first")]
    /// This agent has no complete model of that name.
    NotHeld(String),
    #[error("the source sent {strikes} chunks that failed their BLAKE3 check and was dropped; its files may be changing while being sent, or its disk or memory is damaged (run `xfer verify` or `b3sum` there)")]
    /// The source sent too many corrupt chunks and was dropped.
    CorruptSource {
        /// Corrupt chunks it sent.
        strikes: u32,
    },
    #[error("busy: {0}")]
    /// The agent is busy with the same thing.
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
    #[error("{0}")]
    /// A swarm peer asked to join a transfer this node does not run (its
    /// own ended, or it was never offered here) and does not hold under
    /// that root: the joiner gets those chunks elsewhere.
    NotServing(String),
    #[error("the origin refused a striped range: {0}")]
    /// An intake node's request to the Hub or mirror failed (its status
    /// or error, in words).
    Origin(String),
    #[error("the origin asked to wait: {why}")]
    /// An intake node's request got a "slow down" from the Hub or mirror
    /// (429, or 503 and the like with `Retry-After`): the source pauses
    /// every downloader of the cluster for `wait_ms`, not only this node.
    OriginBusy {
        /// The origin's status, in words.
        why: String,
        /// How long the origin asked to wait, if it said (`Retry-After`,
        /// or the Hub's `RateLimit` `t=`), in milliseconds.
        wait_ms: Option<u64>,
    },
    #[error("{0}")]
    /// The model does not fit under the node's budget (`serve
    /// --max-bytes`), and eviction may not or cannot make the room; the
    /// text names the node's budget, what holds the space and the fix.
    OverBudget(String),
}

/// A refusal as every service's reply encodes it. [`crate::transfer::TransferMsg`],
/// [`crate::admin::AdminReply`] and [`crate::launch::LaunchReply`] each
/// put `Failed(Refusal)` first, at tag 0, so this one frame reads as the
/// right reply whatever the service: an agent can refuse a stream before
/// it knows which service the opener wanted (an unreadable
/// [`crate::hello::Hello`], another version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailedReply {
    /// The refusal.
    Failed(Refusal),
}

impl Refusal {
    /// Whether trying again cannot help until someone acts (frees space,
    /// fixes a path, allows it, upgrades a node): a sync job fails at once
    /// on such a refusal instead of retrying it.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Refusal::Version { .. }
                | Refusal::BadManifest(_)
                | Refusal::BadName(_)
                | Refusal::NoSpace { .. }
                | Refusal::OverBudget(_)
                | Refusal::Unsafe { .. }
                | Refusal::Forbidden(_)
        )
    }

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
