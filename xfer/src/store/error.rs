//! [`StoreError`]: why the store could not do what it was asked. The
//! store knows nothing of the wire; where one of these reaches a peer it
//! becomes the [`Refusal`] of the same name and text (`From`), so what a
//! receiver answers is what the store said.

use xfer_proto::refusal::Refusal;

/// Why the store refused or failed. Each says what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("no space: need {need}, have {have} at {path}; free space there or start the agent with another --root", need = xfer_proto::units::Bytes(*need), have = xfer_proto::units::Bytes(*have))]
    NoSpace { need: u64, have: u64, path: String },
    #[error("disk error at {path}: {message}")]
    Io { path: String, message: String },
    #[error("refusing to write {path}: {reason}")]
    Unsafe { path: String, reason: String },
    /// Something the caller asked that the manifest or the store's state
    /// does not allow (a chunk not in the manifest, a root that does not
    /// match).
    #[error("protocol error: {0}")]
    Invalid(String),
    #[error("busy: {0}")]
    Busy(String),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Refusal {
        match e {
            StoreError::NoSpace { need, have, path } => Refusal::NoSpace { need, have, path },
            StoreError::Io { path, message } => Refusal::Io { path, message },
            StoreError::Unsafe { path, reason } => Refusal::Unsafe { path, reason },
            StoreError::Invalid(m) => Refusal::Protocol(m),
            StoreError::Busy(m) => Refusal::Busy(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_error_becomes_the_refusal_of_the_same_text() {
        for e in [
            StoreError::NoSpace {
                need: 10 << 20,
                have: 1 << 20,
                path: "/r".into(),
            },
            StoreError::Io {
                path: "/r/x".into(),
                message: "EIO".into(),
            },
            StoreError::Unsafe {
                path: "/r/l".into(),
                reason: "a symlink".into(),
            },
            StoreError::Invalid("chunk 9 is not in the manifest".into()),
            StoreError::Busy("m is being received".into()),
        ] {
            let text = e.to_string();
            assert_eq!(Refusal::from(e).to_string(), text);
        }
    }
}
