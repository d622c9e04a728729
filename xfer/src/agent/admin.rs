//! The admin service: the operator's requests. A sync job is stored and,
//! on its source node, started; a status query reports every model and
//! job; a cancel stops a job; an rm deletes a model from the root; an
//! image load puts delivered blobs into the container engine; a job's end
//! is recorded on its members; a prune removes ended jobs. Any member of
//! the cluster may ask for the status, and a job's source may tell its
//! members it ended; the rest is an operator's
//! ([`super::permit::operator_only`]).

use anyhow::Result;

use super::{answer, read_or_refuse, AdminCtx as Ctx, Caller};
use crate::store::evict::Want;
use xfer_proto::admin::{check_job_id, AdminReply, AdminRequest, AgentStatus};
use xfer_proto::frame::REQUEST_LIMIT;
use xfer_proto::refusal::Refusal;

/// Answers the one request on an admin stream.
pub(super) async fn serve(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    ctx: &Ctx,
    caller: &Caller,
) -> Result<()> {
    let request: AdminRequest =
        read_or_refuse(ctx, &mut send, &mut recv, REQUEST_LIMIT, "admin request").await?;
    let me = ctx.runner.me().unwrap_or_else(|| "this node".into());
    let what = match &request {
        AdminRequest::Status => None,
        AdminRequest::SyncJob { .. } => Some("hand it a sync job"),
        AdminRequest::CancelJob { .. } => Some("cancel a sync job"),
        AdminRequest::RemoveModel { .. } => Some("remove a model"),
        AdminRequest::LoadImage(_) => Some("load an image"),
        // The job's source may end it too: checked against the job.
        AdminRequest::JobEnded { .. } => None,
        AdminRequest::PruneJobs { .. } => Some("prune sync jobs"),
        AdminRequest::FindFolder { .. } => Some("look for a sync source folder"),
        AdminRequest::Gc { .. } => Some("evict models"),
        AdminRequest::Pin { .. } => Some("pin a model"),
    };
    if let Some(Err(r)) = what.map(|what| caller.operator_only(&me, what)) {
        return answer(&conn, send, &AdminReply::Failed(r)).await;
    }
    let reply = match request {
        AdminRequest::SyncJob {
            node,
            job,
            hub_token,
        } => {
            let id = job.id.clone();
            let named = ctx.cred.facts().me.map(|me| me.name);
            match named.filter(|n| n.as_str() != node) {
                Some(n) => AdminReply::Failed(Refusal::Forbidden(format!(
                    "this agent is node {n}, and the job calls it {node}; fix the cluster file's address of {node}"
                ))),
                None => match ctx.runner.accept_with(node, *job, hub_token) {
                    Ok(()) => {
                        tracing::info!("accepted sync job {id} from {caller}");
                        AdminReply::JobAccepted { id }
                    }
                    Err(r) => AdminReply::Failed(r),
                },
            }
        }
        AdminRequest::Status => AdminReply::Status(AgentStatus {
            data: ctx.data,
            images: super::images::status(&ctx.store, ctx.permits.engine()).await,
            ..ctx
                .activity
                .report(&ctx.store, ctx.runner.me(), &ctx.runner.records())
        }),
        AdminRequest::CancelJob { id } => match check_job_id(&id) {
            Err(why) => AdminReply::Failed(Refusal::Protocol(why.to_string())),
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
        AdminRequest::JobEnded { id, state } => match check_job_id(&id) {
            Err(why) => AdminReply::Failed(Refusal::Protocol(why.to_string())),
            Ok(()) => match ctx.runner.note_ended(&id, state, &caller.peer) {
                Ok(known) => AdminReply::JobEndedNoted { id, known },
                Err(r) => AdminReply::Failed(r),
            },
        },
        AdminRequest::PruneJobs { ended } => {
            let jobs = ctx.runner.prune(&ended);
            tracing::info!("pruned {} sync job(s) for {caller}", jobs.len());
            AdminReply::JobsPruned { jobs }
        }
        AdminRequest::LoadImage(desc) => {
            tracing::info!("loading image {} for {caller}", desc.reference);
            match super::images::load(&ctx.store, ctx.permits.engine(), &me, *desc).await {
                Ok(report) => AdminReply::ImageLoaded(Box::new(report)),
                Err(r) => {
                    tracing::warn!("{r}");
                    AdminReply::Failed(r)
                }
            }
        }
        AdminRequest::FindFolder { text, cwd } => {
            match super::sync::source::find_folder(ctx.store.root(), &text, &cwd) {
                Ok(paths) => AdminReply::FoldersFound { paths },
                Err(r) => AdminReply::Failed(r),
            }
        }
        AdminRequest::Gc { dry_run, need } => {
            let keeper = ctx.keeper.clone();
            let want = match need {
                Some(need) => Want::Room { need },
                None => Want::Watermarks,
            };
            match tokio::task::spawn_blocking(move || keeper.gc(want, dry_run)).await? {
                Ok(report) => {
                    for (name, _, _) in report.evicted.iter().filter(|_| !dry_run) {
                        if let Ok(n) = xfer_proto::names::ModelName::new(name) {
                            ctx.activity.forget(&n);
                            ctx.runner.forget_model(&n);
                        }
                    }
                    AdminReply::Gc(report)
                }
                Err(no_room) => AdminReply::Failed(Refusal::Busy(no_room.to_string())),
            }
        }
        AdminRequest::Pin { name, pinned } => match ctx.keeper.pin(&name, pinned) {
            Ok(u) => {
                tracing::info!(
                    "{} {name} for {caller}",
                    if u.pinned { "pinned" } else { "unpinned" }
                );
                AdminReply::Pinned {
                    name,
                    pinned: u.pinned,
                }
            }
            Err(e) => AdminReply::Failed(e.into()),
        },
    };
    answer(&conn, send, &reply).await
}
