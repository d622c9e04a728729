//! The admin service: the operator's requests. A sync job is stored and,
//! on its source node, started; a status query reports every model and
//! job; a cancel stops a job; an rm deletes a model from the root.

use anyhow::Result;

use super::{answer, read_or_refuse, Ctx};
use xfer_proto::admin::{check_job_id, AdminReply, AdminRequest};
use xfer_proto::frame::REQUEST_LIMIT;
use xfer_proto::refusal::Refusal;

/// Answers the one request on an admin stream.
pub(super) async fn serve(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    ctx: &Ctx,
) -> Result<()> {
    let request: AdminRequest =
        read_or_refuse(&mut send, &mut recv, REQUEST_LIMIT, "admin request").await?;
    let reply = match request {
        AdminRequest::SyncJob { node, job } => {
            let id = job.id.clone();
            match ctx.runner.accept(node, job) {
                Ok(()) => AdminReply::JobAccepted { id },
                Err(r) => AdminReply::Failed(r),
            }
        }
        AdminRequest::Status => AdminReply::Status(ctx.activity.report(
            &ctx.store,
            ctx.runner.me(),
            &ctx.runner.records(),
        )),
        AdminRequest::CancelJob { id } => match check_job_id(&id) {
            Err(why) => AdminReply::Failed(Refusal::Protocol(why)),
            Ok(()) => {
                let known = ctx.runner.cancel(&id);
                AdminReply::JobCancelled { id, known }
            }
        },
        AdminRequest::RemoveModel { name, force } => {
            let store = ctx.store.clone();
            let n = name.clone();
            match tokio::task::spawn_blocking(move || store.remove(&n, force)).await? {
                Ok(existed) => {
                    tracing::info!("removed {name}");
                    ctx.activity.forget(&name);
                    ctx.runner.forget_model(&name);
                    AdminReply::ModelRemoved { name, existed }
                }
                Err(r) => AdminReply::Failed(r.into()),
            }
        }
    };
    answer(&conn, send, &reply).await
}
