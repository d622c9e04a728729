//! The pulling node's side of striped intake (issue 36): each intake node
//! of a sync job (`xfer sync ORG/NAME --from a,b,c`) becomes a
//! [`RemoteRanges`] of the download, reached over the cluster's mutually
//! authenticated QUIC on its data address (the fabric): one connection, an
//! intake session, whose first stream opens with the transfer service's
//! hello; one [`TransferMsg::Intake`] stream per range, the bytes streamed
//! back raw after [`TransferMsg::IntakeBody`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, Endpoint};
use tokio::sync::mpsc;

use xfer_proto::admin::Secret;
use xfer_proto::hello::Service;
use xfer_proto::names::ModelName;
use xfer_proto::refusal::Refusal;
use xfer_proto::transfer::{TransferMsg, MAX_INTAKE_SPAN};

use crate::config::auth::Credential;
use crate::hub::http::Failure;
use crate::hub::intake::{Fetching, RangeAsk, RangeBody, RemoteRanges};
use crate::hub::retry;
use crate::transport::quic;
use crate::util::chain::Chain;

/// Bytes read from the stream at a time (and so at most queued per range,
/// times the channel's depth).
const READ_STEP: usize = 1 << 20;

/// One intake node.
#[derive(Clone)]
pub struct IntakeNode(Arc<Inner>);

struct Inner {
    name: String,
    addr: SocketAddr,
    model: ModelName,
    ep: Endpoint,
    timeout: Duration,
    conn: tokio::sync::Mutex<Option<Connection>>,
}

impl IntakeNode {
    /// The node `name`, its agent reached at `addr`, for model `model`.
    pub fn new(
        name: &str,
        addr: &str,
        model: ModelName,
        cred: &Credential,
        timeout: Duration,
    ) -> Result<IntakeNode, Chain> {
        let addr = quic::resolve(addr)?;
        let ep = quic::client_endpoint(cred, addr)?;
        Ok(IntakeNode(Arc::new(Inner {
            name: name.to_string(),
            addr,
            model,
            ep,
            timeout,
            conn: tokio::sync::Mutex::new(None),
        })))
    }
}

impl Inner {
    /// A stream for one request: on the session's connection, made on
    /// first use and again after it closed; a new connection's first
    /// stream carries the hello, opened under the lock so that it is the
    /// one the node accepts first.
    async fn stream(&self) -> Result<(quinn::SendStream, quinn::RecvStream), Failure> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref().filter(|c| c.close_reason().is_none()) {
            let c = c.clone();
            drop(slot);
            return c
                .open_bi()
                .await
                .map_err(|e| transient(quic::describe(self.addr, &e)));
        }
        let c = quic::connect(&self.ep, self.addr, self.timeout)
            .await
            .map_err(|e| transient(e.to_string()))?;
        let opened = quic::open_service(&c, Service::Transfer)
            .await
            .map_err(|e| transient(e.to_string()))?;
        *slot = Some(c);
        Ok(opened)
    }

    async fn fetch(self: Arc<Self>, ask: RangeAsk) -> Result<RangeBody, Failure> {
        let RangeAsk {
            url,
            token,
            from,
            to,
            draft_file,
        } = ask;
        if to <= from || to - from > MAX_INTAKE_SPAN {
            return Err(Failure::Fatal(format!(
                "range {from}..{to} is not one an intake node takes"
            )));
        }
        let (mut send, mut recv) = self.stream().await?;
        let ask = TransferMsg::Intake {
            name: self.model.clone(),
            file: draft_file,
            url: url.to_string(),
            from,
            to,
            token: token.map(Secret::new),
        };
        quic::write_frame(&mut send, &ask)
            .await
            .map_err(|e| transient(format!("{e:#}")))?;
        let reply: TransferMsg = quic::read_frame(&mut recv)
            .await
            .map_err(|e| transient(format!("{e:#}")))?;
        let len = match reply {
            TransferMsg::IntakeBody { len } if len == to - from => len,
            // The origin's "slow down", with its wait (capped as for this
            // node's own requests): the download holds every downloader.
            TransferMsg::Failed(r @ Refusal::OriginBusy { wait_ms, .. }) => {
                let wait = wait_ms.map(|ms| Duration::from_millis(ms).min(retry::MAX_WAIT));
                return Err(Failure::Transient {
                    why: r.to_string(),
                    wait,
                });
            }
            TransferMsg::Failed(r) => return Err(transient(r.to_string())),
            other => {
                return Err(transient(format!(
                    "answered {} to an intake request",
                    other.kind()
                )))
            }
        };
        let (tx, rx) = mpsc::channel::<Result<Bytes, String>>(4);
        tokio::spawn(async move {
            let _send = send; // the stream stays open until the body is read
            let mut left = len;
            while left > 0 {
                let step = (left as usize).min(READ_STEP);
                let item = match recv.read_chunk(step, true).await {
                    Ok(Some(c)) => Ok(c.bytes),
                    Ok(None) => return,
                    Err(e) => Err(e.to_string()),
                };
                let stop = item.is_err();
                if let Ok(b) = &item {
                    left -= (b.len() as u64).min(left);
                }
                if tx.send(item).await.is_err() || stop {
                    return;
                }
            }
        });
        Ok(rx)
    }
}

fn transient(why: String) -> Failure {
    Failure::Transient { why, wait: None }
}

impl RemoteRanges for IntakeNode {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn fetch(&self, ask: RangeAsk) -> Fetching {
        Box::pin(self.0.clone().fetch(ask))
    }
}
