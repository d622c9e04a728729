//! Why a credential, a cluster key or the operator's CA folder could not
//! be read, written or used ([`CredError`]): one line each, naming the file
//! and what to do. A cause from below (an I/O error, a TLS or certificate
//! library's error) is part of the line, after a colon, as it was when
//! these were `anyhow` chains.

use std::path::{Path, PathBuf};

/// Why a credential or the CA folder could not be read, written or used.
#[derive(Debug, thiserror::Error)]
pub enum CredError {
    /// A file or folder operation failed; `what` names it ("cannot write
    /// /x", "cannot read credential /x; issue one with ...").
    #[error("{what}: {why}")]
    Io {
        /// The operation and its path, with the fix when there is one.
        what: String,
        /// The system's error.
        why: std::io::Error,
    },
    /// An I/O error on a file the caller already named.
    #[error(transparent)]
    Bare(#[from] std::io::Error),
    /// A key is never written through a symlink.
    #[error("{} is a symlink; xfer never writes a key through one. Remove it, or name the real path", .0.display())]
    Symlink(PathBuf),
    /// A key file is there already and `--force` was not given.
    #[error("{} already exists; it may be a key in use. Pass --force to replace it", .0.display())]
    Exists(PathBuf),
    /// A secret others can read.
    #[error("{} is open to other users (mode {mode:o}), and anyone who can read it can act as its holder; run `chmod 600 {}`", path.display(), path.display())]
    Shared {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A reloaded credential names another holder.
    #[error("{} now names {now} where it named {was}; an agent keeps its name: restart it to change it", path.display())]
    Renamed {
        /// The credential file.
        path: PathBuf,
        /// Who it names now.
        now: String,
        /// Who it named.
        was: String,
    },
    /// The file is not what it should be (not PEM, no key, not a cluster
    /// key, a certificate that cannot be read or names no identity); the
    /// line says what it is not and how to get the right one.
    #[error("{}{what}", path.display())]
    NotA {
        /// The file.
        path: PathBuf,
        /// What follows its name: " is not a PEM file: ...", ": ...".
        what: String,
    },
    /// The certificate has expired.
    #[error("{} expired on {on} (UTC); {renew}", path.display())]
    Expired {
        /// The credential file.
        path: PathBuf,
        /// The day it expired.
        on: time::Date,
        /// The command that renews it.
        renew: String,
    },
    /// The certificate is not valid yet.
    #[error("{} is valid only from {from} (UTC); check this machine's clock", path.display())]
    NotYet {
        /// The credential file.
        path: PathBuf,
        /// When it becomes valid.
        from: time::OffsetDateTime,
    },
    /// The operator's CA folder is not in the state the command needs
    /// (a CA there already, a rotation under way or not, a torn
    /// rotation, bad `--days`); the line says what to run.
    #[error("{0}")]
    CaState(String),
    /// The TLS library refused the key or certificates.
    #[error(transparent)]
    Tls(#[from] rustls::Error),
    /// The TLS library could not build a certificate verifier.
    #[error(transparent)]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The certificate library could not make a key or certificate.
    #[error(transparent)]
    Cert(#[from] rcgen::Error),
}

impl CredError {
    /// An I/O failure of `what` (the operation and its path).
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> CredError {
        let what = what.into();
        move |why| CredError::Io { what, why }
    }

    /// A file that is not what it should be.
    pub(crate) fn not_a(path: &Path, what: impl Into<String>) -> CredError {
        CredError::NotA {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }
}
