//! One request, one reply, to an agent's admin or launch service over the
//! cluster's mutually authenticated QUIC: the exchange under the
//! operator's client (`crate::client`) and the agents' own asks of each
//! other (a job's end told to its members, a group's stop, a data address
//! learned). Each asks a node by its name in the cluster file: with issued
//! credentials the answer is taken only from an agent whose certificate
//! carries that name. What the reply says (a refusal, another kind of
//! reply) is the caller's to read.

use std::net::SocketAddr;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::quic::{self, read_frame_within, write_frame};
use crate::config::auth::Credential;
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::frame::MAX_FRAME;
use xfer_proto::hello::Service;
use xfer_proto::launch::{LaunchReply, LaunchRequest};

/// Why an exchange with an agent brought no reply: the transport's part
/// of a failed ask (the reply's own refusals are the caller's).
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The address does not resolve, or no endpoint could be made for it.
    #[error("{0:#}")]
    Address(anyhow::Error),
    /// Connecting failed.
    #[error(transparent)]
    Connect(#[from] quic::ConnectError),
    /// The answering agent is not the node asked for.
    #[error("{addr}: {why}")]
    WrongNode {
        /// The address asked.
        addr: String,
        /// What its certificate says instead.
        why: crate::config::auth::PeerError,
    },
    /// The service's stream could not be opened.
    #[error(transparent)]
    Open(#[from] quic::OpenServiceError),
    /// The request could not be sent.
    #[error("{0:#}")]
    Send(anyhow::Error),
    /// The reply did not come, or is not the reply expected.
    #[error("{sock}: {why:#}")]
    Reply {
        /// The agent's address.
        sock: SocketAddr,
        /// What went wrong.
        why: anyhow::Error,
    },
    /// The whole exchange took longer than its timeout.
    #[error("no answer within {0}s")]
    Timeout(u64),
}

impl ExchangeError {
    /// Whether the message already names its cause and fix (a failed
    /// handshake, the wrong node): nothing like "is its agent running?" is
    /// to be added to it.
    pub fn explains_itself(&self) -> bool {
        matches!(
            self,
            ExchangeError::Connect(_) | ExchangeError::WrongNode { .. }
        )
    }
}

/// How long one agent gets to answer a status query, connection included.
pub const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// The connection's own limit for an answer that may take `timeout`: an
/// agent that is down is known within a few seconds either way.
fn connect_limit(timeout: Duration) -> Duration {
    timeout.min(ASK_TIMEOUT.max(Duration::from_secs(5)))
}

/// Asks the admin service of `node`'s agent at `addr`.
pub async fn admin(
    cred: &Credential,
    node: &str,
    addr: &str,
    req: &AdminRequest,
    timeout: Duration,
) -> Result<AdminReply, ExchangeError> {
    exchange(
        cred,
        Some(node),
        addr,
        Service::Admin,
        req,
        connect_limit(timeout),
        timeout,
    )
    .await
}

/// Asks the launch service of `node`'s agent at `addr`.
pub async fn launch(
    cred: &Credential,
    node: &str,
    addr: &str,
    req: &LaunchRequest,
    timeout: Duration,
) -> Result<LaunchReply, ExchangeError> {
    exchange(
        cred,
        Some(node),
        addr,
        Service::Launch,
        req,
        connect_limit(timeout),
        timeout,
    )
    .await
}

/// Asks the admin service at `addr` for the agent's status, connection
/// included within [`ASK_TIMEOUT`]. `node`: its name, when known, checked
/// like [`admin`]'s; a push to bare addresses knows none (the address is
/// only used to connect, mutually authenticated, and what comes over it
/// is verified chunk by chunk).
pub async fn status(
    cred: &Credential,
    node: Option<&str>,
    addr: &str,
) -> Result<AdminReply, ExchangeError> {
    exchange(
        cred,
        node,
        addr,
        Service::Admin,
        &AdminRequest::Status,
        ASK_TIMEOUT,
        ASK_TIMEOUT,
    )
    .await
}

/// One request and its reply on a fresh connection: connecting may take
/// `connect`, the whole exchange `timeout`. `node`: the name the answering
/// agent's certificate must carry (`None`: any node of the cluster).
async fn exchange<Req: Serialize, Reply: DeserializeOwned>(
    cred: &Credential,
    node: Option<&str>,
    addr: &str,
    service: Service,
    req: &Req,
    connect: Duration,
    timeout: Duration,
) -> Result<Reply, ExchangeError> {
    let exchange = async {
        let sock = quic::resolve(addr).map_err(ExchangeError::Address)?;
        let ep = quic::client_endpoint(cred, sock).map_err(ExchangeError::Address)?;
        let conn = quic::connect(&ep, sock, connect).await?;
        let leaf = quic::peer_certificate(&conn);
        let checked = match node {
            Some(node) => cred.check_node(leaf.as_ref(), node),
            None => cred.peer(leaf.as_ref()).map(|_| ()),
        };
        if let Err(why) = checked {
            conn.close(0u32.into(), b"not the node asked for");
            return Err(ExchangeError::WrongNode {
                addr: addr.to_string(),
                why,
            });
        }
        let (mut send, mut recv) = quic::open_service(&conn, service).await?;
        // An agent that refuses (a node the cluster file does not list)
        // may answer and stop reading before the request is all sent: the
        // write then fails, but its answer is there to read, and it is
        // the one to show.
        let sent = write_frame(&mut send, req).await;
        let _ = send.finish();
        // A status report lists every model and job: allow a full frame.
        let reply = read_frame_within::<Reply>(&mut recv, MAX_FRAME).await;
        match (sent, reply) {
            (_, Ok(reply)) => {
                conn.close(0u32.into(), b"done");
                Ok(reply)
            }
            (Err(e), Err(_)) => Err(ExchangeError::Send(e)),
            (Ok(()), Err(why)) => Err(ExchangeError::Reply { sock, why }),
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(ExchangeError::Timeout(timeout.as_secs())),
    }
}
