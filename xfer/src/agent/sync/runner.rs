//! The agent's side of sync jobs: accepting and persisting them, driving
//! the ones this node is the source of (push or pull rounds, retried until
//! every member is complete, resumed after a restart), cancelling, and the
//! periodic verify that repairs a damaged copy from the job's other nodes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;

use super::cause::{self, node_of, RoundError};
use super::job::{JobDir, JobMember, JobRecord, JobSource, JobSpec, JobState, MemberTally, Secret};
use super::life::{self, Next, Policy, RoundEnd};
use super::round_clock::{Mark, RoundClock};
use super::status::Activity;
use crate::agent::permit::Permits;
use crate::config::auth::identity::Peer;
use crate::config::auth::Credential;
use crate::flow::push::{NodeSummary, PushOptions, RouteSink};
use crate::flow::route::Destination;
use crate::hub::env::{HubEnv, HubEnvError, HubSettings, Token};
use crate::hub::pull::PullOptions;
use crate::store::local::LocalSource;
use crate::store::Store;
use crate::transport::rdma::link::Nic;
use crate::transport::select::TransportChoice;
use crate::util::clock::unix_now;
use crate::util::progress::Progress;
use xfer_proto::admin::{AdminReply, AdminRequest, PrunedJob};
use xfer_proto::hash::Hash;
use xfer_proto::manifest::ChunkSize;
use xfer_proto::names::{ModelName, NodeName};
use xfer_proto::refusal::Refusal;
use xfer_proto::repo::RepoRef;

/// Held while a final job's record is read and written again or removed
/// (the members told of its end, prune), so a prune is never undone.
static FINAL_RECORDS: Mutex<()> = Mutex::new(());

/// Where model artifact jobs stage what they fetch, under the root: one
/// folder per job, `<id>`.
const OCI_STAGES: &str = ".xfer/oci";

/// Jobs on one agent.
pub struct Runner {
    store: Store,
    /// The agent's credential, loaded once at its start (reloaded in place
    /// on `SIGHUP`).
    cred: Arc<Credential>,
    jobs: JobDir,
    activity: Arc<Activity>,
    running: Mutex<HashMap<String, CancellationToken>>,
    /// This node's name, as the last job handed to it called it.
    me: Mutex<Option<String>>,
    /// The agent's RDMA NIC, for the transfers of its jobs.
    nic: Option<Arc<dyn Nic>>,
    /// Where a job's source folder may lie (`--export`).
    permits: Arc<Permits>,
    /// QUIC connections per receiving node (`--connections`).
    connections: usize,
}

impl Runner {
    /// A runner over `store`'s jobs, pushing with the agent's credential `cred`.
    pub fn new(
        store: Store,
        cred: Arc<Credential>,
        activity: Arc<Activity>,
        nic: Option<Arc<dyn Nic>>,
        permits: Arc<Permits>,
        connections: usize,
    ) -> Arc<Runner> {
        let jobs = JobDir::new(store.root());
        Arc::new(Runner {
            store,
            cred,
            jobs,
            activity,
            running: Mutex::default(),
            me: Mutex::default(),
            nic,
            permits,
            connections,
        })
    }

    /// Restarts every unfinished job this node is the source of (after the
    /// agent restarted).
    pub fn resume_all(self: &Arc<Self>) {
        for rec in self.jobs.all() {
            if let Some(me) = rec.me.clone() {
                *self.me.lock().unwrap() = Some(me);
            }
            if !rec.state.is_final() && self.is_source(&rec) {
                tracing::info!("resuming sync job {} ({})", rec.spec.id, rec.spec.name);
                self.start(rec.spec.id.clone());
            } else if rec.state.is_final() && self.is_source(&rec) {
                self.tell_ended(&rec);
            }
        }
        self.drop_orphan_stages();
    }

    fn is_source(&self, rec: &JobRecord) -> bool {
        rec.me.as_deref() == Some(rec.spec.source_node.as_str())
    }

    /// Takes a job handed over by `xfer sync`; `node` is this node's name in
    /// it. Starts it if this node is its source.
    pub fn accept(self: &Arc<Self>, node: String, spec: JobSpec) -> Result<(), Refusal> {
        self.accept_with(node, spec, None)
    }

    /// [`Self::accept`], with the operator's Hub token for a Hub job this
    /// node is the source of: kept beside the job (mode 0600) until the
    /// job ends, never in its record. A job handed over again without a
    /// token drops the old one. Other nodes never store one.
    pub fn accept_with(
        self: &Arc<Self>,
        node: String,
        spec: JobSpec,
        hub_token: Option<Secret>,
    ) -> Result<(), Refusal> {
        spec.validate()
            .map_err(|e| Refusal::Protocol(e.to_string()))?;
        if node != spec.source_node && !spec.is_member(&node) {
            return Err(Refusal::Protocol(format!(
                "node {node} is neither the source nor a member of the job"
            )));
        }
        // The source reads the folder: only under the root or an export.
        // (A path that does not exist yet fails the job's first round,
        // which says so.)
        if let JobSource::Path(p) = &spec.source {
            if node == spec.source_node && p.exists() {
                self.permits
                    .may_read(&node, self.store.root(), p)
                    .map_err(Refusal::Forbidden)?;
            }
        }
        *self.me.lock().unwrap() = Some(node.clone());
        let mut rec = self
            .jobs
            .load(&spec.id)
            .unwrap_or_else(|| JobRecord::new(spec.clone()));
        rec.spec = spec;
        rec.me = Some(node);
        life::restart(&mut rec);
        let hub_source = self.is_source(&rec) && matches!(rec.spec.source, JobSource::Hub { .. });
        match hub_token.filter(|_| hub_source && !rec.state.is_final()) {
            Some(t) => self
                .jobs
                .save_token(&rec.spec.id, &t)
                .map_err(|e| Refusal::Io {
                    path: self.store.root().display().to_string(),
                    message: format!("cannot keep the job's Hub token: {e}"),
                })?,
            None => self.jobs.remove_token(&rec.spec.id),
        }
        self.jobs.save(&rec).map_err(|e| Refusal::Io {
            path: self.store.root().display().to_string(),
            message: format!("cannot save the job: {e}"),
        })?;
        if self.is_source(&rec) && !rec.state.is_final() {
            self.start(rec.spec.id.clone());
        }
        Ok(())
    }

    /// Stops job `id` here; returns whether this node knew it.
    pub fn cancel(&self, id: &str) -> bool {
        if let Some(t) = self.running.lock().unwrap().remove(id) {
            t.cancel();
        }
        self.jobs.remove_token(id);
        match self.jobs.load(id) {
            Some(mut rec) => {
                if life::cancel(&mut rec) {
                    let _ = self.jobs.save(&rec);
                }
                if self.is_source(&rec) {
                    self.tell_ended(&rec);
                } else {
                    self.drop_leftovers(&rec.spec.name);
                }
                true
            }
            None => false,
        }
    }

    /// Job `id` ended on its source in `state`, as `peer` (the source, or
    /// an operator) says: record it here, so this member stops expecting
    /// the model. Returns whether this node knew the job.
    pub fn note_ended(&self, id: &str, state: JobState, peer: &Peer) -> Result<bool, Refusal> {
        if !state.is_final() {
            return Err(Refusal::Protocol(format!(
                "job {id}: `{}` is not an end state; a job ends complete, failed or cancelled",
                state.label()
            )));
        }
        let Some(mut rec) = self.jobs.load(id) else {
            return Ok(false);
        };
        let me = rec.me.clone().unwrap_or_else(|| "this node".into());
        let source = rec.spec.source_node.clone();
        if !peer.is_operator() && peer.name().map(|n| n.as_str()) != Some(source.as_str()) {
            let why = format!(
                "{me}: only job {id}'s source {source} or an operator may end it, and the caller is {peer}; stop it with `xfer cancel {id}` and an operator credential"
            );
            tracing::warn!("refused: {why}");
            return Err(Refusal::Forbidden(why));
        }
        if self.is_source(&rec) {
            return Err(Refusal::Protocol(format!(
                "{me} is job {id}'s source and ends it itself; stop it with `xfer cancel {id}`"
            )));
        }
        if !rec.state.is_final() {
            tracing::info!("sync job {id} ended on {source}: {}", state.label());
            rec.state = state;
            self.jobs.save(&rec).map_err(|e| Refusal::Io {
                path: self.store.root().display().to_string(),
                message: format!("cannot save the job: {e}"),
            })?;
        }
        self.drop_leftovers(&rec.spec.name);
        Ok(true)
    }

    /// Removes the records of ended jobs: every final one, and each of
    /// `ended` (jobs their source reports final, with that state), except
    /// a job running here and an unfinished one this node is the source
    /// of. Model data stays; what status knew of a transfer of a pruned
    /// job's model that is not held here goes.
    pub fn prune(&self, ended: &[(String, JobState)]) -> Vec<PrunedJob> {
        let mut out = Vec::new();
        let held = FINAL_RECORDS.lock().unwrap();
        for rec in self.jobs.all() {
            let id = &rec.spec.id;
            if self.running.lock().unwrap().contains_key(id) {
                continue;
            }
            let state = if rec.state.is_final() {
                rec.state.clone()
            } else {
                match ended.iter().find(|(e, s)| e == id && s.is_final()) {
                    Some((_, s)) if !self.is_source(&rec) => s.clone(),
                    _ => continue,
                }
            };
            self.jobs.remove(id);
            tracing::info!(
                "pruned sync job {id} ({}, {})",
                rec.spec.name,
                state.label()
            );
            out.push(PrunedJob {
                id: id.clone(),
                name: rec.spec.name.to_string(),
                state,
            });
        }
        drop(held);
        for p in &out {
            if let Ok(name) = ModelName::new(&p.name) {
                self.drop_leftovers(&name);
            }
        }
        self.drop_orphan_stages();
        out
    }

    /// Forgets the activity of `name` (a failed or cancelled transfer's
    /// error and bytes) when this node does not hold it, nothing of it is
    /// running, and no unfinished job names it.
    fn drop_leftovers(&self, name: &ModelName) {
        let open = self
            .jobs
            .all()
            .iter()
            .any(|r| &r.spec.name == name && !r.state.is_final());
        if !open && self.store.record_any(name).is_none() {
            self.activity.forget(name);
        }
    }

    /// Tells the members of the final job `rec` (this node is its source)
    /// that it ended, in the background: each one not yet told, retried
    /// with a growing pause (a member that is down learns it when it is
    /// back, or at the latest when the operator prunes), and recorded as
    /// told in the job's record once it acknowledged.
    fn tell_ended(&self, rec: &JobRecord) {
        let me = rec.me.clone().unwrap_or_default();
        let todo: Vec<JobMember> = rec
            .spec
            .members
            .iter()
            .filter(|m| m.node != me && !rec.told_ended.contains(&m.node))
            .cloned()
            .collect();
        if todo.is_empty() {
            return;
        }
        let (cred, jobs) = (self.cred.clone(), self.jobs.clone());
        let (id, state) = (rec.spec.id.clone(), rec.state.clone());
        tokio::spawn(tell_members(cred, jobs, id, state, todo));
    }

    /// Model `name` was removed here: forget the jobs that were to deliver
    /// it to this node, so status stops listing it (a job this node is the
    /// source of stays; the source re-delivers if it is still running).
    pub fn forget_model(&self, name: &ModelName) {
        for rec in self.jobs.all() {
            if &rec.spec.name == name && !self.is_source(&rec) {
                self.jobs.remove(&rec.spec.id);
            }
        }
    }

    /// This node's name, as the last job handed to it called it.
    pub fn me(&self) -> Option<String> {
        self.me.lock().unwrap().clone()
    }

    /// Every job this agent holds, finished or not.
    pub fn records(&self) -> Vec<JobRecord> {
        self.jobs.all()
    }

    fn start(self: &Arc<Self>, id: String) {
        let token = CancellationToken::new();
        {
            let mut running = self.running.lock().unwrap();
            if running.contains_key(&id) {
                return;
            }
            running.insert(id.clone(), token.clone());
        }
        let me = self.clone();
        tokio::spawn(async move {
            me.drive(&id, token).await;
            me.running.lock().unwrap().remove(&id);
        });
    }

    /// Runs rounds of job `id` until every member is complete, the job is
    /// cancelled, or it cannot go on: the driver of [`life`], which
    /// decides each state. A permanent failure fails the job at once; a
    /// transient one is retried with growing pauses, the record saying the
    /// cause, the retry count, when the next round starts and when the job
    /// gives up without progress. Once the job ended, what it held goes:
    /// the round (whose drop frees its files' locks), its staging folder,
    /// its token.
    async fn drive(&self, id: &str, cancel: CancellationToken) {
        loop {
            let Some(mut rec) = self.jobs.load(id) else {
                return;
            };
            if rec.state.is_final() {
                self.release(&rec);
                return;
            }
            life::begin_round(&mut rec);
            if matches!(rec.spec.source, JobSource::Hub { .. }) {
                if let Ok(env) = self.hub_env(&rec.spec) {
                    rec.hub_endpoint = Some(env.endpoint);
                }
            }
            let _ = self.jobs.save(&rec);
            let moved = Arc::new(crate::hub::download::Stats::default());
            let clock = RoundClock::start();
            let outcome = tokio::select! {
                r = self.round(&rec.spec, moved.clone(), &clock) => r,
                _ = cancel.cancelled() => {
                    // `cancel` saved the record; the round was dropped here.
                    if let Some(rec) = self.jobs.load(id) {
                        self.release(&rec);
                    }
                    return;
                }
            };
            let Some(mut rec) = self.jobs.load(id) else {
                return;
            };
            if rec.state == JobState::Cancelled {
                self.release(&rec);
                return;
            }
            rec.last_round = Some(clock.end());
            let downloaded = moved.downloaded.load(std::sync::atomic::Ordering::Relaxed);
            let end = match outcome {
                Ok((root, nodes)) => {
                    rec.delivered = nodes
                        .iter()
                        .map(|n| MemberTally {
                            node: node_of(&rec.spec, &n.addr),
                            from_source: n.from_source,
                            from_peers: n.from_peers,
                            from_origin: n.from_origin,
                            named: n.named.clone(),
                            ok: n.ok,
                            error: n.error.clone(),
                        })
                        .collect();
                    let moved_to_members = nodes
                        .iter()
                        .any(|n| n.from_source + n.from_peers + n.from_origin > 0);
                    match cause::of_members(&rec.spec, &nodes) {
                        None => RoundEnd::Complete { root },
                        Some(error) => RoundEnd::Failed {
                            error,
                            progressed: moved_to_members || downloaded > 0,
                        },
                    }
                }
                Err(error) => RoundEnd::Failed {
                    error,
                    progressed: downloaded > 0,
                },
            };
            let next = life::end_round(&mut rec, end, unix_now(), Policy::AGENT);
            match &rec.state {
                JobState::Complete { root } => {
                    tracing::info!("sync job {id} complete, root {root}")
                }
                JobState::Failed { reason } => tracing::warn!("sync job {id} failed: {reason}"),
                _ => tracing::warn!(
                    "sync job {id}: {}; retrying (attempt {}, next in {:.1?})",
                    rec.last_error.as_deref().unwrap_or_default(),
                    rec.attempt,
                    match next {
                        Next::RetryIn(p) => p,
                        Next::Ended => Duration::ZERO,
                    }
                ),
            }
            // What an ended job held goes before it shows ended, so whoever
            // sees it ended finds its staging folder gone (a crash between
            // the two leaves it running: the next round starts over).
            if matches!(next, Next::Ended) {
                self.release(&rec);
            }
            let _ = self.jobs.save(&rec);
            let pause = match next {
                Next::Ended => {
                    self.tell_ended(&rec);
                    return;
                }
                Next::RetryIn(pause) => pause,
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = cancel.cancelled() => {
                    if let Some(rec) = self.jobs.load(id) {
                        self.release(&rec);
                    }
                    return;
                }
            }
        }
    }

    /// What an ended job held goes: its staging folder and its token; and,
    /// for a cancelled Hub job on its source, the partial downloads it
    /// left in the model's `blobs/` (a failed job keeps them: running the
    /// sync again resumes from them).
    fn release(&self, rec: &JobRecord) {
        self.drop_stage(&rec.spec);
        self.jobs.remove_token(&rec.spec.id);
        let hub = matches!(rec.spec.source, JobSource::Hub { .. });
        if rec.state == JobState::Cancelled && hub && self.is_source(rec) {
            let blobs = self.store.root().join(rec.spec.name.as_str()).join("blobs");
            tokio::spawn(drop_partials(blobs));
        }
    }

    /// The Hub settings of a Hub job's round: the operator's endpoint and
    /// token, if the job carries them, else this agent's environment (its
    /// token only for its own endpoint); the cache is this agent's root.
    fn hub_env(&self, spec: &JobSpec) -> Result<HubEnv, RoundError> {
        let root = self.store.root().display().to_string();
        let lookup = |k: &str| match k {
            "HF_HUB_CACHE" => Some(root.clone()),
            _ => std::env::var(k).ok().filter(|v| !v.is_empty()),
        };
        let here =
            |e: HubEnvError| RoundError::Fatal(format!("{e} (the agent on {})", spec.source_node));
        if crate::hub::env::offline(&lookup) {
            if let JobSource::Hub { repo, .. } = &spec.source {
                return Err(here(HubEnvError::Offline(repo.id.clone())));
            }
        }
        let own = match HubEnv::from_lookup(&lookup) {
            // The agent's own endpoint is unusable, and the job names one.
            Err(HubEnvError::NotHttp(_)) if spec.hub_endpoint.is_some() => {
                HubEnv::from_lookup(&|k| if k == "HF_ENDPOINT" { None } else { lookup(k) })
            }
            r => r,
        }
        .map_err(here)?;
        let job = HubSettings {
            endpoint: spec.hub_endpoint.clone(),
            token: self
                .jobs
                .load_token(&spec.id)
                .and_then(|t| Token::new(t.expose())),
        };
        own.with_job(&job)
            .map_err(|e| RoundError::Fatal(format!("{e} (the job's Hub settings)")))
    }

    /// The NIC this job's source offers the other members: the agent's,
    /// unless the job asked for QUIC; a job that asked for RDMA on an
    /// agent without it fails, saying so.
    fn nic_for(&self, spec: &JobSpec) -> Result<Option<Arc<dyn Nic>>, String> {
        match (spec.transport, &self.nic) {
            (TransportChoice::Quic, _) => Ok(None),
            (TransportChoice::Rdma, None) => Err(format!(
                "--transport rdma: the agent on {} has no RDMA data plane (started with --transport quic, or no usable device: see `xfer doctor`); sync with --transport auto or quic",
                spec.source_node
            )),
            (_, nic) => Ok(nic.clone()),
        }
    }

    /// One delivery to every member: the root and each member's outcome.
    async fn round(
        &self,
        spec: &JobSpec,
        moved: Arc<crate::hub::download::Stats>,
        clock: &RoundClock,
    ) -> Result<(Hash, Vec<NodeSummary>), RoundError> {
        let nic = self.nic_for(spec).map_err(RoundError::Fatal)?;
        let mut to: Vec<Destination> = spec.members.iter().map(destination).collect();
        crate::flow::route::learn_data_addrs(&self.cred, &mut to).await;
        let activity = self.activity.clone();
        let name = spec.name.clone();
        let push = PushOptions {
            src: PathBuf::new(),
            to,
            me: NodeName::new(&spec.source_node).ok(),
            routes: Some(RouteSink(Arc::new(move |route| {
                activity.fell_back(&name, route)
            }))),
            cred: self.cred.clone(),
            name: Some(spec.name.clone()),
            chunk_size: spec.chunk_size,
            limit_rate: spec.limit_rate,
            connect_timeout: Duration::from_secs(5),
            rehash: false,
            connections: self.connections,
            nic,
            peers: spec
                .peers
                .unwrap_or(crate::engine::topology::DEFAULT_DEGREE),
        };
        let quiet = Progress::new(false);
        match &spec.source {
            JobSource::Path(src) => {
                if !src.is_dir() {
                    return Err(RoundError::Fatal(format!(
                        "{} does not exist on {} (or is not a folder); fix the path and run xfer sync again",
                        src.display(),
                        spec.source_node
                    )));
                }
                let src = self
                    .permits
                    .may_read(&spec.source_node, self.store.root(), src)
                    .map_err(RoundError::Fatal)?;
                let opts = PushOptions { src, ..push };
                if spec.is_member(&spec.source_node) {
                    return self
                        .local_round(spec, opts, LocalSource::Foreign, clock)
                        .await;
                }
                let s = crate::flow::push::push(&opts, &quiet)
                    .await
                    .map_err(|e| cause::of(&e))?;
                Ok((s.root, s.nodes))
            }
            JobSource::Hub { repo, pin } => {
                self.pull_round(spec, repo, pin.as_deref(), push, moved, clock)
                    .await
            }
            JobSource::Oci {
                reference,
                insecure,
                ca_pem,
            } => {
                self.artifact_round(spec, reference, *insecure, ca_pem.as_deref(), push, clock)
                    .await
            }
        }
    }

    /// Removes what a model artifact's job staged, once it ended (beneath
    /// the root: a symlink on the way is removed, never followed).
    fn drop_stage(&self, spec: &JobSpec) {
        if matches!(spec.source, JobSource::Oci { .. }) {
            self.remove_stage(&spec.id);
        }
    }

    /// Removes `<root>/.xfer/oci/<id>`, saying why when it cannot.
    fn remove_stage(&self, id: &str) {
        if xfer_proto::admin::check_job_id(id).is_err() {
            return;
        }
        let stage = std::path::Path::new(OCI_STAGES).join(id);
        let removed = crate::util::beneath::Root::open(self.store.root())
            .and_then(|root| root.remove_dir_all(&stage));
        match removed {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => tracing::warn!(
                "cannot remove {}: {e}",
                self.store.root().join(&stage).display()
            ),
            _ => {}
        }
    }

    /// Removes the staging folder of every model artifact job that does
    /// not run here any more: one whose job is final, unknown, or not
    /// this node's to pull (a crash or a failed removal left it).
    fn drop_orphan_stages(&self) {
        // Listed through a descriptor opened beneath the root: a symlink
        // planted at `.xfer/oci` is named, not listed.
        let dir = crate::util::beneath::Root::open(self.store.root())
            .and_then(|root| root.dir(std::path::Path::new(OCI_STAGES)));
        let dir = match dir {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => return tracing::warn!("cannot list the staging folders: {e}"),
        };
        use std::os::fd::AsRawFd;
        let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
            return;
        };
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().to_string();
            if self.running.lock().unwrap().contains_key(&id) {
                continue;
            }
            let live = self
                .jobs
                .load(&id)
                .is_some_and(|rec| !rec.state.is_final() && self.is_source(&rec));
            if !live {
                tracing::info!("removing the staging folder of ended sync job {id}");
                self.remove_stage(&id);
            }
        }
    }

    /// Where a model artifact's job keeps what it fetched until it ends:
    /// the registry's blobs and the model's files, linked from them.
    fn oci_stage(&self, spec: &JobSpec) -> PathBuf {
        self.store.root().join(OCI_STAGES).join(&spec.id)
    }

    /// A model artifact job's round (`xfer sync oci://...`): pulls the
    /// artifact from its registry (each blob checked against its digest,
    /// a cut transfer resumed) into the job's staging folder, streaming its
    /// raw layers to the other members while they download
    /// ([`crate::flow::artifact_stream`]), then delivers the placed folder
    /// as a folder job's round does (moving only what a member still
    /// lacks; to this node too when it is a member). A refusal (401/403,
    /// no such name or tag, not a ModelPack artifact, a layer that leaves
    /// the folder, a token realm the credentials may not go to, layers
    /// larger than the root's free space, a symlink in the staging folder)
    /// fails the job; anything else is retried, and what was fetched is
    /// kept for the next round. Every file of the staging folder is
    /// reached beneath the root, never through a symlink.
    async fn artifact_round(
        &self,
        spec: &JobSpec,
        reference: &str,
        insecure: bool,
        ca_pem: Option<&str>,
        mut push: PushOptions,
        clock: &RoundClock,
    ) -> Result<(Hash, Vec<NodeSummary>), RoundError> {
        use crate::image::registry::{artifact, client, reference::ImageRef};
        let image = ImageRef::parse(reference).map_err(|e| RoundError::Fatal(e.to_string()))?;
        let stage = self.oci_stage(spec);
        let io = |e: std::io::Error| match crate::util::beneath::Planted::of(&e) {
            Some(p) => RoundError::Fatal(p.to_string()),
            None => RoundError::retry(format!("cannot write under {}: {e}", stage.display())),
        };
        let root = crate::util::beneath::Root::open(self.store.root()).map_err(io)?;
        let files = crate::image::files::Files::beneath(root.clone());
        files.create_dir_all(&stage).map_err(io)?;
        let reg = client::Registry::with_ca_pem(&image, insecure, ca_pem.map(str::as_bytes))
            .map_err(|e| RoundError::Fatal(format!("{e:#} (the agent on {})", spec.source_node)))?
            .confined(root);
        let registry_error = |e: anyhow::Error| cause::of(&client::RegistryFailure::from(e));
        let plan = artifact::plan_model(&reg).await.map_err(registry_error)?;
        clock.mark(Mark::Listed);
        // Nothing is fetched that the root has no room for.
        let blobs = stage.join("blobs");
        artifact::check_space(&plan, &blobs, None).map_err(|n| {
            RoundError::Fatal(n.line(
                &format!("{image} (manifest {}) on {}", plan.manifest, spec.source_node),
                "free some under the agent's --root, or restart the agent with --root on a larger disk",
            ))
        })?;
        // One chunk size for the stream and the round after it, so what
        // the stream delivered is not sent again.
        let chunk_size = spec.chunk_size.for_bytes(plan.bytes());
        push.chunk_size = ChunkSize::Fixed(chunk_size);
        // What an earlier round placed may be partial: placed again from
        // the blobs, which are kept.
        let model = stage.join("model");
        files.remove_dir_all(&model).map_err(io)?;
        let me = spec.source_node.as_str();
        let mut others = push.clone();
        others.to.retain(|d| d.name.as_deref() != Some(me));
        // The small layers (configs, tokenizers, a model of many small
        // files) first, several at once; the others stream as they come.
        let small = artifact::prefetch(&reg, &plan, &blobs, client::BATCH_BELOW - 1)
            .await
            .map_err(registry_error)?;
        let fetched = crate::flow::artifact_stream::fetch_streaming(
            &reg, &plan, &blobs, &model, &others, chunk_size,
        )
        .await
        .map_err(|e| cause::of(&e))?;
        clock.mark_at(Mark::Downloaded, fetched.downloaded_at);
        clock.mark(Mark::Streamed);
        tracing::info!(
            "sync job {}: {image}: {} files, {} bytes ({} fetched from the registry, streamed to {} node(s))",
            spec.id,
            fetched.files,
            fetched.bytes,
            fetched.bytes_fetched + small,
            fetched.streamed.iter().filter(|n| n.ok).count()
        );
        let opts = PushOptions { src: model, ..push };
        if spec.is_member(me) {
            // Its own copy links the layers it staged and checked.
            return self
                .local_round(spec, opts, LocalSource::Staged, clock)
                .await;
        }
        let s = crate::flow::push::push(&opts, &Progress::new(false))
            .await
            .map_err(|e| cause::of(&e))?;
        Ok((s.root, s.nodes))
    }

    /// A folder job's round whose source node is a member too: the tree is
    /// hashed once, then this node's copy is placed from its own disk
    /// ([`crate::flow::local`]) while the other members are pushed theirs;
    /// its outcome is its member's, as a remote member's would be.
    async fn local_round(
        &self,
        spec: &JobSpec,
        mut push: PushOptions,
        whose: LocalSource,
        clock: &RoundClock,
    ) -> Result<(Hash, Vec<NodeSummary>), RoundError> {
        let quiet = Progress::new(false);
        let started = std::time::Instant::now();
        let tree = crate::flow::push::hash_tree(&push, &quiet)
            .await
            .map_err(|e| cause::of(&e))?;
        let hash_s = started.elapsed().as_secs_f64();
        clock.mark(Mark::Hashed);
        let root = tree.manifest.root();
        let me = &spec.source_node;
        push.to.retain(|d| d.name.as_deref() != Some(me.as_str()));
        // A dropped round (a cancelled job) stops the copy at its next file.
        let cancel = CancellationToken::new();
        let _stop = cancel.clone().drop_guard();
        let local = {
            let (store, name, tree) = (self.store.clone(), spec.name.clone(), tree.clone());
            let activity = self.activity.clone();
            tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let placed = crate::flow::local::place(
                    &store,
                    &name,
                    (&tree, whose),
                    activity.as_ref(),
                    &cancel,
                );
                (placed, started.elapsed().as_secs_f64())
            })
        };
        let remote = async {
            if push.to.is_empty() {
                return Ok(Vec::new());
            }
            crate::flow::push::deliver(&push, &spec.name, &tree, hash_s, &quiet)
                .await
                .map(|s| s.nodes)
        };
        let (local, remote) = tokio::join!(local, remote);
        let mut nodes = remote.map_err(|e| cause::of(&e))?;
        let (placed, duration_s) = local.map_err(|e| RoundError::retry(e.to_string()))?;
        let agent = spec
            .members
            .iter()
            .find(|m| &m.node == me)
            .map(|m| m.agent.clone())
            .unwrap_or_default();
        let mine = match placed {
            Ok(p) => {
                tracing::info!(
                    "sync job {}: {} placed here from {} ({} linked, {} cloned, {} copied, {} bytes)",
                    spec.id,
                    spec.name,
                    push.src.display(),
                    p.linked,
                    p.reflinked,
                    p.copied,
                    p.bytes
                );
                NodeSummary {
                    addr: agent,
                    ok: true,
                    root: Some(p.root),
                    duration_s,
                    ..Default::default()
                }
            }
            Err(e) => NodeSummary {
                addr: agent,
                error: Some(format!("local copy: {e}")),
                refusal: e.refusal(),
                duration_s,
                ..Default::default()
            },
        };
        nodes.push(mine);
        Ok((root, nodes))
    }

    /// A Hub job's round: pull into this node's root (an HF cache) and fan
    /// out to the other members; record the result here too.
    async fn pull_round(
        &self,
        spec: &JobSpec,
        repo: &RepoRef,
        pin: Option<&str>,
        mut push: PushOptions,
        moved: Arc<crate::hub::download::Stats>,
        clock: &RoundClock,
    ) -> Result<(Hash, Vec<NodeSummary>), RoundError> {
        let env = self.hub_env(spec)?;
        let opts = PullOptions {
            repo: repo.clone(),
            include: Vec::new(),
            exclude: Vec::new(),
            local_dir: None,
            connections: 16,
            part_size: crate::hub::download::DEFAULT_PART_SIZE,
            chunk_size: None,
            intake: Default::default(),
            before_change: None,
            stats: Some(moved.clone()),
            pin: pin.map(str::to_string),
        };
        let me = self.me().unwrap_or_default();
        push.to.retain(|d| d.name.as_deref() != Some(me.as_str()));
        let mut opts = opts;
        opts.intake = intake_of(spec, &push, &me);
        // The pull writes into the model's folder in place (a new revision
        // moves `refs/`): the old record stops vouching for it before the
        // first change, and only then. A pull that finds the revision in
        // place, or fails before it places a file, leaves it as it was.
        let held_before = self.store.record_any(&spec.name).is_some();
        opts.before_change = Some(self.mark_on_first_change(spec));
        // The draft this node streams: reported while the pull runs (a rank
        // here may load each file as it is sealed), and kept in the record.
        let streamed: Arc<Mutex<Option<Hash>>> = Default::default();
        let (root, nodes, manifest, shares, unhashed) = if push.to.is_empty() {
            let (pulled, _) =
                crate::hub::pull::pull(&opts, &env, &Progress::new(false), None, None)
                    .await
                    .map_err(|e| {
                        let e = crate::hub::pull::PullFailure::from(e);
                        self.pull_error(&e, Some(&e))
                    })?;
            clock.mark(Mark::Downloaded);
            let dir = self.store.model_dir(&spec.name);
            let cs = spec.chunk_size;
            let tree =
                tokio::task::spawn_blocking(move || crate::store::scan::scan(&dir, cs, &|_| {}))
                    .await
                    .map_err(|e| RoundError::retry(e.to_string()))?
                    .map_err(|e| cause::of(&crate::util::chain::Chain::from(e)))?;
            (
                tree.manifest.root(),
                Vec::new(),
                tree.manifest,
                Vec::new(),
                pulled.unhashed,
            )
        } else {
            let on_feed: crate::flow::feed::OnFeed = {
                let (activity, name, streamed) =
                    (self.activity.clone(), spec.name.clone(), streamed.clone());
                Arc::new(move |feed| {
                    *streamed.lock().unwrap() = Some(feed.id());
                    activity.pulling(&name, feed, moved.clone());
                })
            };
            let s = crate::flow::pull_fanout::pull_and_fan_out(
                opts,
                env,
                push,
                crate::flow::pull_fanout::FanOut::Stream,
                Progress::new(false),
                Some(on_feed),
            )
            .await;
            self.activity.pulled(&spec.name);
            let s = s.map_err(|e| self.pull_error(&e, e.pull()))?;
            let now = std::time::Instant::now();
            let after = |s: f64| now.checked_sub(Duration::from_secs_f64(s)).unwrap_or(now);
            clock.mark_at(Mark::Downloaded, after(s.tail_s));
            clock.mark_at(Mark::Streamed, after(s.final_round_s));
            (s.root, s.nodes, s.manifest, s.pull.intake, s.pull.unhashed)
        };
        let mut nodes = nodes;
        tally_intake(spec, &mut nodes, &shares);
        if !spec.is_member(&me) && held_before {
            // Not a member, but it held the model: its record now vouches
            // for what the pull just verified, not for the old revision.
            self.store
                .adopt(&spec.name, &manifest, None, &unhashed)
                .map_err(|e| RoundError::retry(e.to_string()))?;
        }
        if spec.is_member(&me) {
            let draft = *streamed.lock().unwrap();
            let ok = self.store.adopt(&spec.name, &manifest, draft, &unhashed);
            nodes.push(NodeSummary {
                from_origin: shares.first().map_or(0, |s| s.bytes),
                addr: spec
                    .members
                    .iter()
                    .find(|m| m.node == me)
                    .map(|m| m.agent.clone())
                    .unwrap_or_default(),
                ok: ok.is_ok(),
                error: ok.err().map(|e| e.to_string()),
                root: Some(root),
                ..Default::default()
            });
        }
        Ok((root, nodes))
    }

    /// What a failed pull on this node means for its job: as the pull
    /// says ([`crate::hub::pull::PullFailure`]), but a full disk names the
    /// agent's `--root`, which is where the fix is (not `HF_HUB_CACHE`,
    /// which the agent does not read).
    fn pull_error(
        &self,
        e: &(impl crate::util::permanence::Permanence + std::fmt::Display),
        pull: Option<&crate::hub::pull::PullFailure>,
    ) -> RoundError {
        let Some((need, have)) = pull.and_then(|p| p.full_disk()) else {
            return cause::of(e);
        };
        let me = self.me().unwrap_or_else(|| "this node".into());
        let have = have.map_or(String::new(), |h| {
            format!(", have {}", xfer_proto::units::Bytes(h))
        });
        RoundError::Fatal(format!(
            "{me}: not enough space under the agent's --root {}: need {}{have}; free some there, or restart the agent there with --root on a larger disk",
            self.store.root().display(),
            xfer_proto::units::Bytes(need)
        ))
    }

    /// The hook a Hub job's pull calls before it changes the model's
    /// folder: marks the model's record `replacing` (durably), once.
    fn mark_on_first_change(&self, spec: &JobSpec) -> crate::hub::pull::BeforeChange {
        let by = Hash(blake3::derive_key(
            "xfer 2026-12 hub pull",
            spec.id.as_bytes(),
        ));
        let (store, name) = (self.store.clone(), spec.name.clone());
        let marked = std::sync::atomic::AtomicBool::new(false);
        crate::hub::pull::BeforeChange(Arc::new(move || {
            use std::sync::atomic::Ordering;
            if marked.load(Ordering::Acquire) {
                return Ok(());
            }
            store
                .mark_replacing(&name, by)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            marked.store(true, Ordering::Release);
            Ok(())
        }))
    }

    /// Re-hashes every complete model; a damaged one is repaired from the
    /// other nodes of the jobs that delivered it.
    pub async fn verify_all(&self) {
        for (name, rec) in self.store.models() {
            self.activity.verifying(&name);
            let dir = self.store.model_dir(&name);
            let manifest = rec.manifest.manifest.clone();
            let report =
                tokio::task::spawn_blocking(move || crate::store::verify::verify(&dir, &manifest))
                    .await;
            let report = match report {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    self.activity
                        .ended(&name, Some(format!("verify failed: {e:#}")));
                    continue;
                }
                Err(e) => {
                    self.activity
                        .ended(&name, Some(format!("verify crashed: {e}")));
                    continue;
                }
            };
            if report.ok {
                // A Hub-named model an older xfer recorded: its blobs are
                // checked against their names once, here.
                let store = self.store.clone();
                let n = name.clone();
                let hub = tokio::task::spawn_blocking(move || store.check_hub_blobs(&n)).await;
                let error = match hub {
                    Ok(Ok(true)) => {
                        tracing::info!("{name}: every blob checked against its name");
                        None
                    }
                    Ok(Ok(false)) => None,
                    Ok(Err(why)) => Some(why),
                    Err(e) => Some(format!("the blob check crashed: {e}")),
                };
                self.activity.ended(&name, error);
                continue;
            }
            let damaged: Vec<String> = report
                .missing
                .iter()
                .cloned()
                .chain(report.mismatched.iter().map(|m| m.path.clone()))
                .collect();
            let why = format!(
                "verify found {} damaged file(s): {}",
                damaged.len(),
                damaged.join(", ")
            );
            tracing::warn!("{name}: {why}; repairing from peers");
            self.activity.repairing(&name, why.clone());
            match self.repair(&name, &damaged).await {
                Ok(peer) => {
                    tracing::info!("{name}: repaired {} file(s) from {peer}", damaged.len());
                    self.activity.repaired(&name, damaged.len() as u64);
                    self.activity.ended(&name, None);
                    self.activity
                        .note_error(&name, format!("{why}; repaired from {peer}"));
                }
                Err(e) => self
                    .activity
                    .ended(&name, Some(format!("{why}; repair failed: {e:#}"))),
            }
        }
    }

    /// Fetches the damaged files of `name` from the first peer that has it.
    async fn repair(&self, name: &ModelName, damaged: &[String]) -> Result<String> {
        let paths: Vec<xfer_proto::relpath::RelPath> = damaged
            .iter()
            .filter_map(|p| xfer_proto::relpath::RelPath::new(p).ok())
            .collect();
        self.store
            .forget_files(name, &paths)
            .context("cannot update the model's record")?;
        let me = self.me();
        // Each peer's data address first, then its agent address.
        let mut peers: Vec<(String, Vec<String>)> = Vec::new();
        for rec in self.jobs.all().iter().filter(|r| &r.spec.name == name) {
            for m in &rec.spec.members {
                if Some(&m.node) != me.as_ref() && !peers.iter().any(|(n, _)| n == &m.node) {
                    let addrs = m.data.iter().chain([&m.agent]).cloned().collect();
                    peers.push((m.node.clone(), addrs));
                }
            }
        }
        anyhow::ensure!(
            !peers.is_empty(),
            "no other node is known to hold {name}; push it again"
        );
        let mut last = None;
        for (node, addrs) in peers {
            let mut data_failed: Option<String> = None;
            for (i, addr) in addrs.iter().enumerate() {
                let opts = crate::flow::fetch::FetchOptions {
                    from: addr.clone(),
                    name: name.clone(),
                    root: self.store.root().to_path_buf(),
                    cred: self.cred.clone(),
                    connect_timeout: Duration::from_secs(5),
                    nic: self.nic.clone(),
                };
                match crate::flow::fetch::fetch(&opts).await {
                    Ok(_) => {
                        if let (Some(error), Ok(data)) =
                            (data_failed, crate::transport::quic::resolve(&addrs[0]))
                        {
                            let route = xfer_proto::transfer::FallbackRoute {
                                from: me.clone().unwrap_or_else(|| "this node".into()),
                                to: node.clone(),
                                data,
                                error,
                            };
                            tracing::warn!("repair: {route}");
                            self.activity.fell_back(name, route);
                        }
                        return Ok(node);
                    }
                    Err(e) => {
                        if i == 0 && addrs.len() > 1 {
                            data_failed = Some(format!("{e:#}"));
                        }
                        last = Some(format!("{node}: {e:#}"));
                    }
                }
            }
        }
        anyhow::bail!("{}", last.unwrap_or_default())
    }
}

/// Sends [`AdminRequest::JobEnded`] to each of `todo` until every one
/// answered, pausing 2 s, then longer (up to a minute), between tries;
/// gives up after a day (an agent restart tries again). A member that
/// acknowledged is added to the record's `told_ended`, if the record is
/// still there (it may have been pruned meanwhile). A member that did not
/// know the job yet is told again, a few times: the operator's `xfer sync`
/// hands the job to every node at once, so a job that fails at once can
/// end here before a member took it, and that member would then wait for
/// it for ever.
async fn tell_members(
    cred: Arc<Credential>,
    jobs: JobDir,
    id: String,
    state: JobState,
    mut todo: Vec<JobMember>,
) {
    let mut pause = Duration::from_secs(2);
    let give_up = tokio::time::Instant::now() + Duration::from_secs(24 * 3600);
    let mut unknown: HashMap<String, u32> = HashMap::new();
    let msg = AdminRequest::JobEnded {
        id: id.clone(),
        state,
    };
    loop {
        let mut left = Vec::new();
        for m in todo {
            let reply = crate::transport::ask::admin(
                &cred,
                &m.node,
                &m.agent,
                &msg,
                Duration::from_secs(10),
            )
            .await;
            match reply {
                Ok(AdminReply::JobEndedNoted { known: false, .. })
                    if *unknown.entry(m.node.clone()).or_default() < UNKNOWN_RETRIES =>
                {
                    *unknown.get_mut(&m.node).expect("counted") += 1;
                    tracing::info!(
                        "sync job {id}: {} does not hold the job yet; telling it again",
                        m.node
                    );
                    left.push(m);
                    continue;
                }
                Ok(AdminReply::JobEndedNoted { .. }) => {}
                Ok(AdminReply::Failed(why)) => {
                    tracing::warn!("sync job {id}: {} refused its end: {why}", m.node)
                }
                Ok(other) => tracing::warn!(
                    "sync job {id}: {} answered {} to its end; upgrade xfer there",
                    m.node,
                    other.kind()
                ),
                Err(e) => {
                    tracing::debug!("sync job {id}: cannot tell {} it ended yet: {e}", m.node);
                    left.push(m);
                    continue;
                }
            }
            {
                let _held = FINAL_RECORDS.lock().unwrap();
                if let Some(mut rec) = jobs.load(&id) {
                    if !rec.told_ended.contains(&m.node) {
                        rec.told_ended.push(m.node.clone());
                        let _ = jobs.save(&rec);
                    }
                }
            }
        }
        if left.is_empty() || tokio::time::Instant::now() >= give_up {
            return;
        }
        todo = left;
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(60));
    }
}

/// Times a member that does not know an ended job is told again
/// ([`tell_members`]): 2 + 4 + 8 + 16 + 32 s covers a handover that raced
/// the end.
const UNKNOWN_RETRIES: u32 = 5;

/// Where a member's data goes: its data address from the cluster file, if
/// the job has one (else the one its agent advertises, asked per round).
fn destination(m: &JobMember) -> Destination {
    Destination {
        agent: m.agent.clone(),
        data: m.data.clone(),
        name: Some(m.node.clone()),
    }
}

/// Puts each intake node's share of a striped pull in its summary: bytes
/// it fetched from the origin, and why it was named when its ranges
/// differed from the origin's or it stopped answering.
fn tally_intake(
    spec: &JobSpec,
    nodes: &mut [NodeSummary],
    shares: &[crate::hub::intake::IntakeShare],
) {
    for share in shares.iter().skip(1) {
        let Some(member) = spec.members.iter().find(|m| m.node == share.node) else {
            continue;
        };
        let Some(n) = nodes.iter_mut().find(|n| n.addr == member.agent) else {
            continue;
        };
        n.from_origin = share.bytes;
        n.named = if share.blamed {
            Some("sent bytes that differ from the origin's; check that node".into())
        } else {
            share.retired.clone()
        };
    }
}

/// The job's intake nodes (`--from a,b,c`) as ranges fetchers of this
/// node's download, each reached at its data address; a node that cannot
/// be set up is left out (the others, and this node, carry its share).
fn intake_of(spec: &JobSpec, push: &PushOptions, me: &str) -> crate::hub::intake::Intake {
    let remotes = spec
        .intake
        .iter()
        .filter(|n| n.as_str() != me)
        .filter_map(|n| {
            let d = push
                .to
                .iter()
                .find(|d| d.name.as_deref() == Some(n.as_str()))?;
            let addr = d.data.as_deref().unwrap_or(&d.agent);
            crate::flow::intake::IntakeNode::new(
                n,
                addr,
                spec.name.clone(),
                &push.cred,
                push.connect_timeout,
            )
            .map_err(|e| tracing::warn!("{n}: cannot fetch ranges through it: {e:#}"))
            .ok()
            .map(|node| Arc::new(node) as Arc<dyn crate::hub::intake::RemoteRanges>)
        })
        .collect();
    crate::hub::intake::Intake {
        remotes,
        connections: INTAKE_CONNECTIONS,
    }
}

/// Ranges each intake node fetches at once (its connections to the
/// origin, which may cap each one, as a CDN does).
const INTAKE_CONNECTIONS: usize = 16;

/// Removes a cancelled pull's partial downloads under `blobs`, once its
/// dropped tasks have let go of their locks (they close their files as
/// the runtime drops them, moments after the cancel); gives up after a
/// minute, saying so, if another pull still holds one.
async fn drop_partials(blobs: PathBuf) {
    for _ in 0..600 {
        let dir = blobs.clone();
        match tokio::task::spawn_blocking(move || crate::hub::leftovers::remove_unheld(&dir)).await
        {
            Ok(true) | Err(_) => return,
            Ok(false) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    tracing::warn!(
        "kept partial downloads in {}: another pull still holds them",
        blobs.display()
    );
}
