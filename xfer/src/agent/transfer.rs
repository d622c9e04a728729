//! The transfer service: moving models. A stream opens with one of
//! - an offer: checked (may this caller deliver, or supersede the running
//!   transfer of, that model?), opened as a [`crate::store::Transfer`] in
//!   the store, and handed to the receiving side
//!   ([`crate::flow::receiver`]), which pulls the missing chunks from the
//!   source and the swarm. A newer offer for the same model supersedes a
//!   running one (a restarted push resumes instead of waiting for the old
//!   connection to time out);
//! - a join from another receiver: served from this node's verified chunks;
//! - a want: serve a complete model this node holds;
//! - an intake: fetch a range from the origin for a striped pull
//!   ([`super::intake`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio_util::sync::CancellationToken;

use super::sync::runner::Runner;
use super::{read_or_refuse, refuse, Caller};
use crate::config::auth::identity::Peer;
use crate::flow::receiver::{Offered, Receiver};
use crate::flow::swarm;
use crate::store::Store;
use crate::transport::files::HeldModel;
use crate::transport::lanes::{Lanes, MAX_CONNECTIONS};
use crate::transport::quic;
use crate::transport::quic::write_frame;
use crate::transport::rdma::link::{Nic, Offer};
use crate::transport::serve::{serve as serve_chunks, Serving};
use xfer_proto::draft::Draft;
use xfer_proto::frame::MAX_FRAME;
use xfer_proto::hash::Hash;
use xfer_proto::manifest::Manifest;
use xfer_proto::names::ModelName;
use xfer_proto::transfer::{Refusal, TransferMsg};

/// What the transfer service uses: the store, the offers running here,
/// the sync jobs (whose sources may replace a model), and what the
/// receiving side needs ([`Receiver`]).
pub(super) struct TransferCtx {
    pub(super) first_message_timeout: Duration,
    pub(super) store: Store,
    pub(super) jobs: Jobs,
    pub(super) runner: Arc<Runner>,
    pub(super) receiver: Receiver,
    /// The root's budget: an offer must fit under it.
    pub(super) keeper: Arc<super::keeper::Keeper>,
}

/// Running jobs by model name: a token to cancel each, and a lock the job
/// holds while it runs.
#[derive(Default)]
pub(super) struct Jobs {
    by_name: Mutex<HashMap<ModelName, Job>>,
    next_id: std::sync::atomic::AtomicU64,
}

struct Job {
    id: u64,
    cancel: CancellationToken,
    slot: Arc<tokio::sync::Mutex<()>>,
    /// The connections to the source (`--connections`), the first being
    /// the one the offer came on; the source may attach more.
    lanes: Lanes,
    root: Hash,
    /// Who offered it.
    by: Peer,
    /// The secret a lane must carry (`Accepted`'s `lane_key`).
    lane_key: [u8; 16],
}

/// The node's budget's say on `bytes` of model `name` arriving
/// ([`crate::agent::keeper::Keeper::make_room`]).
async fn make_room(ctx: &TransferCtx, name: &ModelName, bytes: u64) -> Result<(), Refusal> {
    let (keeper, name) = (ctx.keeper.clone(), name.clone());
    tokio::task::spawn_blocking(move || keeper.make_room(&name, bytes))
        .await
        .unwrap_or_else(|e| Err(Refusal::Busy(format!("the budget check failed: {e}"))))
}

/// Serves one transfer stream, whose first message is an opener.
pub(super) async fn serve(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    ctx: &TransferCtx,
    caller: &Caller,
) -> Result<()> {
    let opener: TransferMsg = read_or_refuse(ctx, &mut send, &mut recv, MAX_FRAME, "offer").await?;
    let (name, plan) = match opener {
        TransferMsg::Offer { name, manifest } => {
            if let Err(e) = manifest.validate() {
                return refuse(&mut send, Refusal::BadManifest(e.to_string())).await;
            }
            if let Err(r) = make_room(ctx, &name, manifest.total_bytes()).await {
                return refuse(&mut send, r).await;
            }
            (name, Plan::Manifest(Arc::new(manifest)))
        }
        TransferMsg::OfferDraft { name, id, listing } => {
            // Bounds and free space first: nothing is built per chunk for
            // a listing this node could not hold anyway.
            let room = Draft::extent(&listing)
                .map_err(|e| Refusal::BadManifest(e.to_string()))
                .and_then(|(bytes, _)| ctx.store.room_for(&name, bytes).map_err(Refusal::from));
            let room = match room {
                Ok(()) => match Draft::extent(&listing) {
                    Ok((bytes, _)) => make_room(ctx, &name, bytes).await,
                    Err(e) => Err(Refusal::BadManifest(e.to_string())),
                },
                Err(r) => Err(r),
            };
            if let Err(r) = room {
                return refuse(&mut send, r).await;
            }
            match Draft::from_listing(&listing) {
                Ok(draft) => (name, Plan::Draft(id, draft)),
                Err(e) => return refuse(&mut send, Refusal::BadManifest(e.to_string())).await,
            }
        }
        TransferMsg::Want { name } => {
            return serve_model(
                conn,
                send,
                ctx.store.clone(),
                name,
                ctx.receiver.nic.clone(),
            )
            .await
        }
        TransferMsg::Join { name, root, from } => {
            let (store, shares) = (ctx.store.clone(), ctx.receiver.shares.clone());
            let join = swarm::Joining { name, root, from };
            let nic = ctx.receiver.nic.clone();
            return Ok(swarm::serve_peer(conn, send, store, shares, join, nic).await?);
        }
        TransferMsg::Lane { name, root, key } => {
            return attach_lane(conn, send, ctx, name, root, key).await
        }
        TransferMsg::Intake {
            name,
            file,
            url,
            from,
            to,
            token,
        } => {
            // Only the source of a striped Hub job that names this node
            // as an intake node (or an operator) may spend this node's link,
            // and only on that job's origin.
            let origin = if caller.peer.is_operator() {
                None
            } else {
                match intake_origin(ctx, &caller.peer, &name) {
                    Ok(o) => Some(o),
                    Err(why) => {
                        let why = format!(
                            "{caller} asked this node to fetch part of `{name}` from the origin, but {why}; only `xfer sync ORG/NAME --from SOURCE,THIS-NODE` makes it an intake node"
                        );
                        tracing::warn!("{why}");
                        return refuse(&mut send, Refusal::Forbidden(why)).await;
                    }
                }
            };
            let ask = super::intake::IntakeAsk {
                name,
                file,
                url,
                from,
                to,
                token,
                origin,
            };
            let shares = ctx.receiver.shares.clone();
            return super::intake::session(conn, send, ask, shares).await;
        }
        other => {
            return refuse(
                &mut send,
                Refusal::Protocol(format!("expected an offer, got {}", other.kind())),
            )
            .await;
        }
    };
    let key = match &plan {
        Plan::Manifest(m) => m.root(),
        Plan::Draft(id, _) => *id,
    };

    if let Err(why) = may_offer(ctx, caller, &name) {
        tracing::warn!("refused an offer of {name} from {caller}: {why}");
        return refuse(&mut send, Refusal::Forbidden(why.to_string())).await;
    }

    // Supersede a running transfer of the same model, then wait for it.
    let token = CancellationToken::new();
    let jobs = &ctx.jobs;
    let id = jobs.next_id.fetch_add(1, Ordering::Relaxed);
    let lanes = Lanes::new(conn.clone());
    let lane_key: [u8; 16] = rand::random();
    let superseding = {
        let map = jobs.by_name.lock().unwrap();
        map.get(&name).map(|j| j.by.clone())
    };
    if let Some(running) = superseding {
        if let Err(why) = may_supersede(ctx, caller, &name, &running) {
            tracing::warn!("refused an offer of {name} from {caller}: {why}");
            return refuse(&mut send, Refusal::Busy(why.to_string())).await;
        }
    }
    let slot = {
        let mut map = jobs.by_name.lock().unwrap();
        let slot = map.get(&name).map(|j| j.slot.clone()).unwrap_or_default();
        let job = Job {
            id,
            cancel: token.clone(),
            slot: slot.clone(),
            lanes: lanes.clone(),
            root: key,
            by: caller.peer.clone(),
            lane_key,
        };
        if let Some(old) = map.insert(name.clone(), job) {
            old.cancel.cancel();
        }
        slot
    };
    let _running = slot.lock().await;

    let begun = {
        let (store, name) = (ctx.store.clone(), name.clone());
        tokio::task::spawn_blocking(move || match plan {
            Plan::Manifest(m) => store.begin(&name, m),
            Plan::Draft(id, d) => store.begin_draft(&name, id, d),
        })
        .await?
    };
    let transfer = match begun {
        Ok(t) => Arc::new(t),
        Err(r) => return refuse(&mut send, r.into()).await,
    };
    let manifest = transfer.manifest().clone();
    let held = transfer.held();
    let held_bytes = transfer.held_bytes();
    write_frame(
        &mut send,
        &TransferMsg::Accepted {
            held_bytes,
            held_chunks: held.count(),
            need_bytes: manifest.total_bytes() - held_bytes,
            lane_key,
        },
    )
    .await?;
    tracing::info!(
        "receiving {name} ({} files, {} {}) from {}",
        manifest.file_count(),
        if transfer.is_draft() { "draft" } else { "root" },
        key.short(),
        conn.remote_address()
    );
    let offered = Offered {
        transfer: transfer.clone(),
        lanes,
        send: &mut send,
        recv,
        token,
    };
    let result = ctx.receiver.run(offered).await;
    transfer.release();
    {
        let mut map = jobs.by_name.lock().unwrap();
        if map.get(&name).is_some_and(|j| j.id == id) {
            map.remove(&name);
        }
    }
    let reply = match result {
        Ok(r) => {
            tracing::info!("{name} complete, root {}", r.root);
            TransferMsg::Done {
                root: r.root,
                received_bytes: r.received_bytes,
                corrupt_chunks: r.corrupt_chunks,
            }
        }
        Err(r) => {
            tracing::warn!("{name} failed: {r}");
            TransferMsg::Failed(r)
        }
    };
    write_frame(&mut send, &reply).await?;
    let _ = send.finish();
    Ok(())
}

/// Whether `caller` may deliver `name` here. An operator (or, in simple
/// mode, a holder of the cluster key) may deliver anything. A node
/// credential may deliver a Hub cache name only as the source of an
/// operator's sync job for it, and another name this node
/// does not hold, or resume one
/// it is receiving; replacing a model held here (complete, or left half
/// replaced) takes a transfer the operator started: an operator's push, or
/// a sync job handed to this agent that names the caller as its source.
/// Why an offer from a node credential is refused: one line naming the
/// caller, the model and what would allow it (the refusal's text).
#[derive(Debug, thiserror::Error)]
enum OfferRefused {
    /// A Hub cache name, not from the source of a sync job for it.
    #[error("{caller} may not deliver `{name}`: a Hub cache name is delivered only by an operator's `xfer sync` from that node (push it under another name, or run the sync)")]
    HubName {
        /// The caller, as it shows.
        caller: String,
        /// The model.
        name: ModelName,
    },
    /// A model held here, not from an operator's transfer.
    #[error("{caller} may not replace the model `{name}` held on this node; only an operator's push or an `xfer sync` job from that node may (push it with an operator credential, or run `xfer sync`)")]
    Held {
        /// The caller, as it shows.
        caller: String,
        /// The model.
        name: ModelName,
    },
    /// Another peer's transfer of the model is running.
    #[error("`{name}` is being received here from {running}; {caller} may not interrupt it (wait for it to end, or push as the operator)")]
    Receiving {
        /// The caller, as it shows.
        caller: String,
        /// The model.
        name: ModelName,
        /// The peer whose transfer runs.
        running: String,
    },
}

fn may_offer(ctx: &TransferCtx, caller: &Caller, name: &ModelName) -> Result<(), OfferRefused> {
    if caller.peer.is_operator() {
        return Ok(());
    }
    // What `deploy` serves by its Hub name: only an operator's sync job
    // from that node brings it, never a node's own push.
    if crate::store::hub_layout::is_hub_name(name) {
        if is_job_source(ctx, &caller.peer, name) {
            return Ok(());
        }
        return Err(OfferRefused::HubName {
            caller: caller.to_string(),
            name: name.clone(),
        });
    }
    if ctx.store.record_any(name).is_none() {
        return Ok(());
    }
    if is_job_source(ctx, &caller.peer, name) {
        return Ok(());
    }
    Err(OfferRefused::Held {
        caller: caller.to_string(),
        name: name.clone(),
    })
}

/// Whether a new offer from `caller` may cut short the transfer of `name`
/// that `running` offered: an operator's may, and so may the same peer (a
/// restarted push) or the source of a sync job for it; no other node.
fn may_supersede(
    ctx: &TransferCtx,
    caller: &Caller,
    name: &ModelName,
    running: &Peer,
) -> Result<(), OfferRefused> {
    if caller.peer.is_operator()
        || caller.peer == *running
        || is_job_source(ctx, &caller.peer, name)
    {
        return Ok(());
    }
    Err(OfferRefused::Receiving {
        caller: caller.to_string(),
        name: name.clone(),
        running: running.to_string(),
    })
}

/// Whether this agent holds a running sync job for `name` whose source is
/// the node `peer` names.
fn is_job_source(ctx: &TransferCtx, peer: &Peer, name: &ModelName) -> bool {
    let Some(node) = peer.name() else {
        return false;
    };
    ctx.runner
        .records()
        .iter()
        .any(|j| !j.state.is_final() && j.spec.name == *name && j.spec.source_node == node.as_str())
}

/// Why a peer may not have this node fetch from the origin for it: the
/// end of the refusal's sentence ("..., but {why}").
#[derive(Debug, thiserror::Error)]
enum NotIntake {
    /// The caller's credential names no node.
    #[error("it has no node name")]
    NoNodeName,
    /// No running sync job here has it as the source.
    #[error("it is not the source of a running sync job for it here")]
    NoJob,
    /// Its job moves no Hub repository.
    #[error("its job {0} does not pull from the Hub")]
    NotHub(String),
    /// Its job does not name this node as an intake node.
    #[error("its job {job} does not name this node ({me}) as an intake node")]
    NotNamed {
        /// The job's id.
        job: String,
        /// This node.
        me: String,
    },
    /// The job's Hub endpoint is no origin.
    #[error(transparent)]
    Endpoint(#[from] super::intake::EndpointError),
}

/// The origin of the striped Hub job for `name` whose source is `peer` and
/// whose intake nodes include this one: the only hosts this node fetches
/// from for it. Else why there is none.
fn intake_origin(
    ctx: &TransferCtx,
    peer: &Peer,
    name: &ModelName,
) -> Result<super::intake::Origin, NotIntake> {
    let Some(node) = peer.name() else {
        return Err(NotIntake::NoNodeName);
    };
    let me = ctx.runner.me().unwrap_or_default();
    let jobs = ctx.runner.records();
    let job = jobs
        .iter()
        .find(|j| {
            !j.state.is_final() && j.spec.name == *name && j.spec.source_node == node.as_str()
        })
        .ok_or(NotIntake::NoJob)?;
    if !matches!(job.spec.source, xfer_proto::admin::JobSource::Hub { .. }) {
        return Err(NotIntake::NotHub(job.spec.id.to_string()));
    }
    if !job.spec.intake.contains(&me) {
        return Err(NotIntake::NotNamed {
            job: job.spec.id.to_string(),
            me,
        });
    }
    let endpoint = job
        .spec
        .hub_endpoint
        .clone()
        .or_else(|| std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()))
        .unwrap_or_else(|| crate::hub::env::DEFAULT_ENDPOINT.to_string());
    Ok(super::intake::Origin::of_endpoint(&endpoint)?)
}

/// What an offer asks this node to store.
enum Plan {
    Manifest(Arc<Manifest>),
    /// A pull's files while it still downloads them: the draft's id and
    /// its listing.
    Draft(Hash, Draft),
}

/// Attaches `conn` to the running transfer of `name` as one more
/// connection to its source, and holds it until it closes. Only the
/// source itself may: the same certificate as the connection the offer
/// came on, and the transfer's secret `lane_key`, which only that
/// connection was told. The address may differ: a source that fell back
/// to management attaches a lane over the fabric once it answers.
async fn attach_lane(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    ctx: &TransferCtx,
    name: ModelName,
    root: Hash,
    key: [u8; 16],
) -> Result<()> {
    let found = {
        let map = ctx.jobs.by_name.lock().unwrap();
        map.get(&name)
            .filter(|j| j.root == root)
            .map(|j| (j.lanes.clone(), j.lane_key))
    };
    let Some((lanes, lane_key)) = found else {
        let why = format!(
            "no transfer of {name} with root {} is running here to add a connection to",
            root.short()
        );
        return refuse(&mut send, Refusal::Protocol(why)).await;
    };
    let source = lanes.primary();
    if key != lane_key || quic::peer_certificate(&source) != quic::peer_certificate(&conn) {
        let why = format!(
            "{} is not the source of the transfer of {name}; only its source may add connections to it",
            conn.remote_address()
        );
        return refuse(&mut send, Refusal::Forbidden(why)).await;
    }
    if lanes.len() >= MAX_CONNECTIONS {
        let why =
            format!("the transfer of {name} has {MAX_CONNECTIONS} connections, the most one may");
        return refuse(&mut send, Refusal::Busy(why)).await;
    }
    let n = lanes.add(conn.clone());
    tracing::debug!(
        "{name}: connection {n} to the source {}",
        conn.remote_address()
    );
    write_frame(&mut send, &TransferMsg::LaneAttached { lanes: n as u32 }).await?;
    // Until the source closes it (the transfer ended) or the transfer's
    // own connection goes.
    tokio::select! {
        _ = conn.closed() => {}
        _ = source.closed() => {}
    }
    Ok(())
}

/// Serves a complete model this agent holds to a peer that asked for it.
async fn serve_model(
    conn: quinn::Connection,
    mut send: quinn::SendStream,
    store: Store,
    name: ModelName,
    nic: Option<Arc<dyn Nic>>,
) -> Result<()> {
    let Some(HeldModel {
        manifest,
        map,
        reader,
        paths,
    }) = HeldModel::open(&store, &name)
    else {
        return refuse(&mut send, Refusal::NotHeld(name.to_string())).await;
    };
    write_frame(&mut send, &TransferMsg::Have { manifest }).await?;
    let _ = send.finish();
    tracing::info!("serving {name} to {}", conn.remote_address());
    let rdma = Offer {
        nic,
        files: Some(paths),
    };
    serve_chunks(conn, Serving::new(map, reader, rdma)).await;
    Ok(())
}
