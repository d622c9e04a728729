//! [`StoreError`]: why the store could not do what it was asked. The
//! store knows nothing of the wire; where one of these reaches a peer it
//! becomes the [`Refusal`] of the same name and text (`From`), so what a
//! receiver answers is what the store said.

use xfer_proto::refusal::Refusal;

/// Why the store refused or failed. Each says what to do: its text is the
/// [`Refusal`]'s of the same name, written once, there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// Not enough free space.
    NoSpace {
        /// Bytes needed.
        need: u64,
        /// Bytes free.
        have: u64,
        /// Where.
        path: String,
    },
    /// A disk operation failed.
    Io {
        /// The file or folder.
        path: String,
        /// What the system said.
        message: String,
    },
    /// Writing there would be unsafe (a symlink, a path outside the root).
    Unsafe {
        /// The path.
        path: String,
        /// Why it is unsafe.
        reason: String,
    },
    /// Something the caller asked that the manifest or the store's state
    /// does not allow (a chunk not in the manifest, a root that does not
    /// match).
    Invalid(String),
    /// The tree offered under a Hub cache name is not the Hub's: its shape,
    /// or a blob's bytes against its name ([`super::hub_layout`]). The
    /// source's manifest is wrong: no retry mends it.
    NotHubs(String),
    /// Another transfer of the same model holds it.
    Busy(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Refusal::from(self.clone()).fmt(f)
    }
}

impl std::error::Error for StoreError {}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Refusal {
        match e {
            StoreError::NoSpace { need, have, path } => Refusal::NoSpace { need, have, path },
            StoreError::Io { path, message } => Refusal::Io { path, message },
            StoreError::Unsafe { path, reason } => Refusal::Unsafe { path, reason },
            StoreError::Invalid(m) => Refusal::Protocol(m),
            StoreError::NotHubs(m) => Refusal::BadManifest(m),
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
            assert!(!text.is_empty());
            assert_eq!(Refusal::from(e).to_string(), text);
        }
    }
}

/// Why a held chunk's file could not be opened ([`super::Transfer::open_held`]).
#[derive(Debug, thiserror::Error)]
pub enum OpenHeldError {
    /// The manifest has no such chunk.
    #[error("no such chunk")]
    NoSuchChunk,
    /// The chunk is not verified yet.
    #[error("not held yet")]
    NotHeld,
    /// The file holding it could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The staging or placed file.
        path: std::path::PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}
