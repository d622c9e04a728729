//! The typed client of an agent's admin and launch services, as the
//! operator asks: [`admin`] and [`launch`] over the transport's exchange
//! (`transport::ask`), and [`AskError`], the one error of an ask that
//! brought no answer wanted: the node could not be asked, it refused, or
//! it answered with another kind of reply.

use std::future::Future;
use std::time::Duration;

use crate::config::auth::Credential;
use crate::transport::ask;
pub use crate::transport::ask::{ExchangeError, ASK_TIMEOUT};
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::launch::{LaunchReply, LaunchRequest};
use xfer_proto::refusal::Refusal;

/// Why asking one agent did not bring the answer wanted.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    /// The node could not be asked: no connection, the wrong node, no
    /// reply in time (the transport's words).
    #[error(transparent)]
    Unreachable(#[from] ExchangeError),
    /// The node refused, saying why.
    #[error("{0}")]
    Refused(Refusal),
    /// The node answered with another kind of reply (another version of
    /// xfer there): the protocol's failure, named by the reply's kind.
    #[error("answered {0}")]
    Unexpected(&'static str),
}

impl AskError {
    /// Whether the message already names its cause and fix (a failed
    /// handshake, the wrong node, a refusal): nothing like "is its agent
    /// running?" is to be added to it.
    pub fn explains_itself(&self) -> bool {
        match self {
            AskError::Unreachable(e) => e.explains_itself(),
            AskError::Refused(_) => true,
            AskError::Unexpected(_) => false,
        }
    }
}

/// Asks the admin service of `node`'s agent at `addr`, all within
/// `timeout`. A reply is returned whatever its kind: a refusal
/// (`AdminReply::Failed`) is the caller's to read.
pub async fn admin(
    cred: &Credential,
    node: &str,
    addr: &str,
    req: &AdminRequest,
    timeout: Duration,
) -> Result<AdminReply, AskError> {
    Ok(ask::admin(cred, node, addr, req, timeout).await?)
}

/// Asks the launch service of `node`'s agent at `addr`, all within
/// `timeout`; like [`admin`], a refusal is in the reply.
pub async fn launch(
    cred: &Credential,
    node: &str,
    addr: &str,
    req: &LaunchRequest,
    timeout: Duration,
) -> Result<LaunchReply, AskError> {
    Ok(ask::launch(cred, node, addr, req, timeout).await?)
}

/// Runs the asks concurrently, one task each, and collects their
/// answers in order.
pub(super) async fn all<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("status task"));
    }
    out
}
