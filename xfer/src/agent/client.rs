//! The typed client of an agent's admin and launch services: one request,
//! one reply, over the cluster's mutually authenticated QUIC. The CLI's
//! `sync`, `status`, `cancel` and `rm`, the launcher and the agents'
//! own group stops all ask through here. Each asks a node by its name in
//! the cluster file: with issued credentials the answer is taken only
//! from an agent whose certificate carries that name.

use std::net::SocketAddr;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::auth::Credential;
use crate::transport::quic::{self, read_frame_within, write_frame};
use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::frame::MAX_FRAME;
use xfer_proto::hello::Service;
use xfer_proto::launch::{LaunchReply, LaunchRequest};

/// Why asking an agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
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
    /// The agent refused the request.
    #[error("{0}")]
    Refused(xfer_proto::refusal::Refusal),
    /// The agent answered with another kind of reply.
    #[error("answered {0} to a status query")]
    Unexpected(&'static str),
}

impl AskError {
    /// Whether the message already names its cause and fix (a failed
    /// handshake, a refusal, no answer): nothing like "is its agent
    /// running?" is to be added to it.
    pub fn explains_itself(&self) -> bool {
        matches!(
            self,
            AskError::Connect(_) | AskError::Refused(_) | AskError::WrongNode { .. }
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
) -> Result<AdminReply, AskError> {
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
) -> Result<LaunchReply, AskError> {
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

/// The data address the agent at `addr` advertises (its `--data` or
/// `--fabric-if`), asked over management; `None` if it advertises none.
/// `node`: its name, when known, checked like [`admin`]'s; a push to bare
/// addresses knows none (the address is only used to connect, mutually
/// authenticated, and what comes over it is verified chunk by chunk).
pub async fn advertised_data(
    cred: &Credential,
    node: Option<&str>,
    addr: &str,
) -> Result<Option<SocketAddr>, AskError> {
    let reply = exchange(
        cred,
        node,
        addr,
        Service::Admin,
        &AdminRequest::Status,
        ASK_TIMEOUT,
        ASK_TIMEOUT,
    )
    .await?;
    match reply {
        AdminReply::Status(s) => Ok(s.data),
        AdminReply::Failed(r) => Err(AskError::Refused(r)),
        other => Err(AskError::Unexpected(other.kind())),
    }
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
) -> Result<Reply, AskError> {
    let exchange = async {
        let sock = quic::resolve(addr).map_err(AskError::Address)?;
        let ep = quic::client_endpoint(cred, sock).map_err(AskError::Address)?;
        let conn = quic::connect(&ep, sock, connect).await?;
        let leaf = quic::peer_certificate(&conn);
        let checked = match node {
            Some(node) => cred.check_node(leaf.as_ref(), node),
            None => cred.peer(leaf.as_ref()).map(|_| ()),
        };
        if let Err(why) = checked {
            conn.close(0u32.into(), b"not the node asked for");
            return Err(AskError::WrongNode {
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
            (Err(e), Err(_)) => Err(AskError::Send(e)),
            (Ok(()), Err(why)) => Err(AskError::Reply { sock, why }),
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(AskError::Timeout(timeout.as_secs())),
    }
}

/// Fills in the data address of every destination that has none with the
/// one its agent advertises, asking them all at once. An agent that cannot
/// be asked keeps its agent address for data (the push then says why it
/// cannot be reached).
pub async fn learn_data_addrs(
    cred: &std::sync::Arc<Credential>,
    dests: &mut [crate::flow::route::Destination],
) {
    let mut asks = tokio::task::JoinSet::new();
    for (i, d) in dests.iter().enumerate().filter(|(_, d)| d.data.is_none()) {
        let (cred, name, agent) = (cred.clone(), d.name.clone(), d.agent.clone());
        asks.spawn(async move {
            let found = advertised_data(&cred, name.as_deref(), &agent).await;
            if let Err(e) = &found {
                tracing::debug!("{agent}: no advertised data address ({e})");
            }
            (i, found.ok().flatten())
        });
    }
    while let Some(Ok((i, found))) = asks.join_next().await {
        if let Some(a) = found {
            dests[i].data = Some(a.to_string());
        }
    }
}
