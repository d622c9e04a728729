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
) -> Result<AdminReply, String> {
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
) -> Result<LaunchReply, String> {
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
) -> Result<Option<SocketAddr>, String> {
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
        AdminReply::Failed(r) => Err(r.to_string()),
        other => Err(format!("answered {} to a status query", other.kind())),
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
) -> Result<Reply, String> {
    let exchange = async {
        let sock = quic::resolve(addr).map_err(|e| format!("{e:#}"))?;
        let ep = quic::client_endpoint(cred, sock).map_err(|e| format!("{e:#}"))?;
        let conn = quic::connect(&ep, sock, connect).await?;
        let leaf = quic::peer_certificate(&conn);
        let checked = match node {
            Some(node) => cred.check_node(leaf.as_ref(), node),
            None => cred.peer(leaf.as_ref()).map(|_| ()),
        };
        if let Err(why) = checked {
            conn.close(0u32.into(), b"not the node asked for");
            return Err(format!("{addr}: {why}"));
        }
        let (mut send, mut recv) = quic::open_service(&conn, service).await?;
        write_frame(&mut send, req)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let _ = send.finish();
        // A status report lists every model and job: allow a full frame.
        let reply = read_frame_within::<Reply>(&mut recv, MAX_FRAME)
            .await
            .map_err(|e| format!("{sock}: {e:#}"))?;
        conn.close(0u32.into(), b"done");
        Ok(reply)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {}s", timeout.as_secs())),
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
