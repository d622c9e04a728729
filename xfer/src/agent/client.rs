//! The typed client of an agent's admin and launch services: one request,
//! one reply, over the cluster's mutually authenticated QUIC. The CLI's
//! `sync`, `status`, `cancel` and `rm`, the launcher and the agents'
//! own group stops all ask through here.

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

/// Asks the admin service of the agent at `addr`.
pub async fn admin(
    cred: &Credential,
    addr: &str,
    req: &AdminRequest,
    timeout: Duration,
) -> Result<AdminReply, String> {
    exchange(
        cred,
        addr,
        Service::Admin,
        req,
        connect_limit(timeout),
        timeout,
    )
    .await
}

/// Asks the launch service of the agent at `addr`.
pub async fn launch(
    cred: &Credential,
    addr: &str,
    req: &LaunchRequest,
    timeout: Duration,
) -> Result<LaunchReply, String> {
    exchange(
        cred,
        addr,
        Service::Launch,
        req,
        connect_limit(timeout),
        timeout,
    )
    .await
}

/// One request and its reply on a fresh connection: connecting may take
/// `connect`, the whole exchange `timeout`.
async fn exchange<Req: Serialize, Reply: DeserializeOwned>(
    cred: &Credential,
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
