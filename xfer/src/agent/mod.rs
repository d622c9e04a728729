//! `xfer serve`: the node agent.
//!
//! Accepts mutually authenticated QUIC connections, reads the
//! [`Hello`] that opens the control stream (one version check, here) and
//! hands the stream to the service it names, one module each:
//! - [`transfer`]: offers, swarm joins and wants (moving models);
//! - [`admin`]: sync jobs, status, cancel, rm;
//! - [`launch`]: preflight, reach probes, ranks and their logs;
//!
//! and, on its own Unix socket, [`local`]: the loader link, what this
//! node's ranks ask of their agent.
//!
//! The operator's side of these services is `crate::client`, on the same
//! floor: neither uses the other.

mod admin;
mod caches;
pub mod containers;
pub mod guard;
mod images;
mod intake;
pub mod keeper;
mod launch;
pub mod local;
pub mod permit;
pub mod preflight;
pub mod ranks;
pub mod sync;
mod transfer;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::util::lograte::{LogBudget, Verdict};
use anyhow::Result;

use crate::agent::guard::{Admit, Guard};
use crate::agent::permit::Permits;
use crate::agent::ranks::supervisor::Supervisor;
use crate::agent::sync::runner::Runner;
use crate::agent::sync::status::Activity;
use crate::config::auth::identity::{Peer, Role};
use crate::config::auth::Credential;
use crate::engine::scheduler;
use crate::flow::receiver::Receiver;
use crate::store::evict;
use crate::store::Store;
use crate::transport::quic::{self, read_frame_within, write_frame};
use crate::transport::rdma::link::Nic;
use xfer_proto::frame::HELLO_LIMIT;
use xfer_proto::hello::{Hello, Service};
use xfer_proto::names::NodeName;
use xfer_proto::refusal::Refusal;

/// How the agent is started.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// The management address to listen on (`--listen`).
    pub listen: SocketAddr,
    /// This node's data address (`--data`, `--fabric-if`): advertised in
    /// its status, and listened on when `listen` does not cover it.
    pub data: Option<SocketAddr>,
    /// The store's root folder (`--root`).
    pub root: PathBuf,
    /// This node's credential file (`--key`).
    pub key: PathBuf,
    /// The scheduler policy transfers start from.
    pub scheduler: scheduler::Config,
    /// Re-hash complete models this often and repair damage from peers.
    pub verify_every: Option<Duration>,
    /// Serve Prometheus metrics here.
    pub metrics: Option<SocketAddr>,
    /// The RDMA NIC transfers use (`--transport`); `None`: QUIC only.
    pub nic: Option<Arc<dyn Nic>>,
    /// What callers may do beyond moving models.
    pub permits: Permits,
    /// Per-source caps and Retry before the handshake.
    pub guard: guard::GuardConfig,
    /// How long a stream's first message may take ([`FIRST_MESSAGE_TIMEOUT`]).
    pub first_message_timeout: Duration,
    /// QUIC connections per peer for the pushes of this agent's sync jobs
    /// (`--connections`).
    pub connections: usize,
    /// `--cluster FILE`: the file and the node names it lists; a node
    /// certificate of another name is refused.
    pub members: Option<(PathBuf, Vec<NodeName>)>,
    /// With `--cluster FILE`: its nodes' addresses (agent and fabric), the
    /// only ones a receiver dials for peers.
    pub member_addrs: Option<crate::flow::swarm::PeerAddrs>,
    /// The root's budget and watermarks (`--max-bytes`, `--evict-above`...).
    pub budget: keeper::BudgetConfig,
    /// With `--cluster FILE`: the model its `[launch]` names, never evicted.
    pub launch_models: Vec<xfer_proto::names::ModelName>,
}

/// Refused connections, logged so that a storm of them cannot grow the
/// log without bound: the first few of every window one line each, the
/// rest as one count when the next window starts.
struct RefusalLog {
    budget: LogBudget,
    /// The source of the last refusal not logged one by one.
    last_hidden: Option<SocketAddr>,
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog {
            budget: LogBudget::new(5, Duration::from_secs(10)),
            last_hidden: None,
        }
    }
}

impl RefusalLog {
    fn refused(&mut self, remote: SocketAddr, why: &str) {
        match self.budget.admit(std::time::Instant::now()) {
            Verdict::Log { hidden } => {
                if let (true, Some(last)) = (hidden > 0, self.last_hidden.take()) {
                    tracing::warn!(
                        "refused {hidden} more connections in the last {} s (not logged one by one; the last from {last})",
                        self.budget.window().as_secs()
                    );
                }
                tracing::warn!("refused connection from {remote}: {why}");
            }
            Verdict::Hide => self.last_hidden = Some(remote),
        }
    }
}

/// How long the first message of a stream (its hello, then its request or
/// offer) may take to arrive whole: a peer that goes silent is refused and
/// gives its stream and connection slot back. Generous for a 64 MiB offer
/// over a slow link.
pub const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the agent until the process is stopped.
pub async fn run(opts: AgentOptions) -> Result<()> {
    let cred = Arc::new(Credential::load(&opts.key)?);
    let facts = cred.facts();
    if let Some(me) = facts.me.as_ref().filter(|me| me.role == Role::Operator) {
        anyhow::bail!(
            "{} is the credential of {me}, which may launch and remove on every node; an agent runs with its node's own credential: `xfer ca issue NODE --out FILE` (role node)",
            opts.key.display()
        );
    }
    if let (Some(me), Some((file, members))) = (&facts.me, &opts.members) {
        if !members.contains(&me.name) {
            anyhow::bail!(
                "this agent is {me}, which {} does not list; add a [[node]] named {} there, or give this agent its own node's credential",
                file.display(),
                me.name
            );
        }
    }
    refuse_shared_root(&opts.root)?;
    let store = Store::open(&opts.root)?;
    let ep = quic::server_endpoint(opts.listen, &cred)?;
    let listen = ep.local_addr()?;
    // A data address the listening socket does not take gets its own.
    let data_ep = match opts.data {
        Some(d) if !covers(listen, d) => Some(quic::server_endpoint(d, &cred).map_err(|e| {
            anyhow::anyhow!("--data {d}: cannot listen there ({e:#}); give an address of this node's fabric interface")
        })?),
        _ => None,
    };
    println!(
        "xfer agent listening on {listen} root {} cluster {}{}",
        opts.root.display(),
        cred.cluster_id().short(),
        opts.data.map(|d| format!(" data {d}")).unwrap_or_default()
    );
    match (&facts.me, facts.not_after) {
        (Some(me), Some(until)) => tracing::info!(
            "this agent is {me}; its certificate is valid until {} (UTC){}",
            until.date(),
            if facts.rotating {
                "; trusting the old and the new CA (rotation)"
            } else {
                ""
            }
        ),
        _ => tracing::info!(
            "simple mode: every holder of {} is equivalent to root on this node",
            opts.key.display()
        ),
    }
    reload_on_hangup(cred.clone(), opts.key.clone());
    use std::io::Write;
    std::io::stdout().flush()?;
    if let Some(addr) = opts.metrics {
        let listener = crate::util::metrics::serve(addr);
        tokio::spawn(async move {
            if let Err(e) = listener.await {
                tracing::error!("{e:#}");
            }
        });
    }
    let activity = Arc::new(Activity::default());
    {
        let activity = activity.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                activity.tick();
            }
        });
    }
    let ranks = Supervisor::open(&opts.root, cred.clone());
    let permits = Arc::new(opts.permits);
    let runner = Runner::new(
        store.clone(),
        cred.clone(),
        activity.clone(),
        opts.nic.clone(),
        permits.clone(),
        opts.connections,
    );
    runner.resume_all();
    // Before any rank starts: every rank is given its path.
    match local::bind(&opts.root) {
        Ok(listener) => {
            tracing::info!(
                "loader link on {} (this node's ranks ask it)",
                local::socket_path(&opts.root).display()
            );
            tokio::spawn(local::serve(
                listener,
                local::LocalCtx {
                    store: store.clone(),
                    activity: activity.clone(),
                    runner: runner.clone(),
                },
            ));
        }
        Err(why) => tracing::warn!("{why}"),
    }
    if let Some(every) = opts.verify_every {
        let runner = runner.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                runner.verify_all().await;
            }
        });
    }
    let keeper = Arc::new(keeper::Keeper::new(
        store.clone(),
        opts.budget,
        opts.launch_models.clone(),
        ranks.clone(),
        runner.clone(),
    )?);
    if opts.budget.evict_above.is_some() {
        // Past the high watermark, evict down to the low one: checked at
        // start and every 30 s (a model lands in seconds at the least).
        let keeper = keeper.clone();
        tokio::spawn(async move {
            loop {
                let k = keeper.clone();
                let done =
                    tokio::task::spawn_blocking(move || k.gc(evict::Want::Watermarks, false)).await;
                if let Ok(Err(no_room)) = done {
                    tracing::warn!("above the high watermark: {no_room}");
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
        });
    }
    let within = opts.first_message_timeout;
    let ctx = Arc::new(Ctx {
        members: opts.members,
        first_message_timeout: within,
        cred: cred.clone(),
        transfer: transfer::TransferCtx {
            first_message_timeout: within,
            store: store.clone(),
            jobs: transfer::Jobs::default(),
            runner: runner.clone(),
            receiver: Receiver {
                shares: Arc::default(),
                scheduler: opts.scheduler,
                endpoint: data_ep.as_ref().unwrap_or(&ep).clone(),
                fallback_endpoint: ep.clone(),
                nic: opts.nic,
                watcher: activity.clone(),
                peer_addrs: opts.member_addrs.map(Arc::new),
            },
            keeper: keeper.clone(),
        },
        admin: AdminCtx {
            first_message_timeout: within,
            cred: cred.clone(),
            store: store.clone(),
            data: opts.data,
            activity: activity.clone(),
            runner: runner.clone(),
            permits: permits.clone(),
            keeper: keeper.clone(),
        },
        launch: LaunchCtx {
            first_message_timeout: within,
            store,
            activity,
            runner,
            ranks,
            permits,
            keeper,
        },
    });
    let refusals = Arc::new(Mutex::new(RefusalLog::default()));
    let guard = Guard::new(opts.guard);
    if let Some(data_ep) = data_ep {
        tokio::spawn(accept_all(
            data_ep,
            ctx.clone(),
            guard.clone(),
            refusals.clone(),
        ));
    }
    accept_all(ep, ctx, guard, refusals).await;
    Ok(())
}

/// Whether a socket bound to `listen` takes packets sent to `data`.
fn covers(listen: SocketAddr, data: SocketAddr) -> bool {
    listen.port() == data.port()
        && (listen.ip() == data.ip()
            || (listen.ip().is_unspecified() && listen.is_ipv4() == data.is_ipv4()))
}

/// Accepts connections on `ep` until it closes, each in its own task.
async fn accept_all(
    ep: quinn::Endpoint,
    ctx: Arc<Ctx>,
    guard: Arc<Guard>,
    refusals: Arc<Mutex<RefusalLog>>,
) {
    while let Some(incoming) = ep.accept().await {
        let remote = incoming.remote_address();
        // Decided before any cryptography: see `guard`.
        let validated = incoming.remote_address_validated();
        let mut admitted = match guard.admit(remote.ip(), validated, incoming.may_retry()) {
            Admit::Accept(a) => a,
            Admit::Retry => {
                if let Err(e) = incoming.retry() {
                    e.into_incoming().ignore();
                }
                continue;
            }
            Admit::Refuse(why) => {
                incoming.refuse();
                refusals.lock().unwrap().refused(remote, &why);
                continue;
            }
        };
        let ctx = ctx.clone();
        let refusals = refusals.clone();
        tokio::spawn(async move {
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    admitted.handshake_done(false);
                    let why = quic::describe(remote, &e);
                    refusals.lock().unwrap().refused(remote, &why);
                    return;
                }
            };
            // Mutually authenticated: the handshake's token goes back.
            admitted.handshake_done(true);
            if let Err(why) = quic::refuse_other_version(&conn, &format!("the node at {remote}")) {
                refusals.lock().unwrap().refused(remote, &why.to_string());
                return;
            }
            if let Err(e) = handle(conn.clone(), ctx).await {
                tracing::warn!("session with {remote} ended: {e:#}");
            }
            // Give the peer a moment to read our last message and close.
            let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
            // Until here the connection counts against its source.
            drop(admitted);
        });
    }
}

/// `kill -HUP` (`systemctl reload`) makes the agent read its credential
/// again: a renewed certificate, or a rotation's new trust anchors, take
/// effect for every new handshake while transfers run on.
fn reload_on_hangup(cred: Arc<Credential>, path: PathBuf) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        return;
    };
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match cred.reload() {
                Ok(f) => tracing::info!(
                    "reloaded {}: cluster {}{}",
                    path.display(),
                    f.cluster.short(),
                    f.not_after
                        .map(|t| format!(", valid until {} (UTC)", t.date()))
                        .unwrap_or_default()
                ),
                Err(e) => tracing::error!("kept the loaded credential: {e:#}"),
            }
        }
    });
}

/// A root every local user may write to would let any of them plant
/// symlinks for the agent to follow: refused (an existing root only; a
/// missing one is created with the agent's umask).
fn refuse_shared_root(root: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(root) {
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o002 != 0 {
            anyhow::bail!(
                "--root {} is writable by every user (mode {mode:o}), so any of them could plant symlinks the agent would follow; run `chmod o-w {}`",
                root.display(),
                root.display()
            );
        }
    }
    Ok(())
}

/// What the agent's services run with: the hello's checks, and each
/// service's own context, which sees only what that service uses.
struct Ctx {
    members: Option<(PathBuf, Vec<NodeName>)>,
    first_message_timeout: Duration,
    cred: Arc<Credential>,
    transfer: transfer::TransferCtx,
    admin: AdminCtx,
    launch: LaunchCtx,
}

/// What the admin service uses: sync jobs, status, cancel, rm, images.
struct AdminCtx {
    first_message_timeout: Duration,
    cred: Arc<Credential>,
    store: Store,
    /// The data address this agent advertises.
    data: Option<SocketAddr>,
    activity: Arc<Activity>,
    runner: Arc<Runner>,
    permits: Arc<Permits>,
    /// The root's budget, pins and evictions.
    keeper: Arc<keeper::Keeper>,
}

/// What the launch service uses: preflight, reach probes, ranks, logs.
struct LaunchCtx {
    first_message_timeout: Duration,
    store: Store,
    activity: Arc<Activity>,
    runner: Arc<Runner>,
    ranks: Arc<Supervisor>,
    permits: Arc<Permits>,
    /// Notes the model a rank starts on as used.
    keeper: Arc<keeper::Keeper>,
}

/// A context whose stream opens with a message read within a deadline.
trait FirstMessage {
    /// How long the stream's first message may take.
    fn first_message_timeout(&self) -> Duration;
}

impl FirstMessage for Ctx {
    fn first_message_timeout(&self) -> Duration {
        self.first_message_timeout
    }
}

impl FirstMessage for AdminCtx {
    fn first_message_timeout(&self) -> Duration {
        self.first_message_timeout
    }
}

impl FirstMessage for LaunchCtx {
    fn first_message_timeout(&self) -> Duration {
        self.first_message_timeout
    }
}

impl FirstMessage for transfer::TransferCtx {
    fn first_message_timeout(&self) -> Duration {
        self.first_message_timeout
    }
}

/// Reads the stream's [`Hello`] and hands the stream to its service. An
/// opener of another version, or of no known service, gets one
/// [`Refusal`] in the form every service answers with.
async fn handle(conn: quinn::Connection, ctx: Arc<Ctx>) -> Result<()> {
    let (mut send, mut recv) =
        tokio::time::timeout(Duration::from_secs(10), conn.accept_bi()).await??;
    let hello: Hello =
        read_or_refuse(ctx.as_ref(), &mut send, &mut recv, HELLO_LIMIT, "hello").await?;
    let peer = match ctx.cred.peer(quic::peer_certificate(&conn).as_ref()) {
        Ok(peer) => peer,
        Err(why) => return refuse(&mut send, Refusal::Forbidden(why.to_string())).await,
    };
    let caller = Caller {
        peer,
        addr: conn.remote_address(),
    };
    if let (Peer::Issued(id), Some((file, members))) = (&caller.peer, &ctx.members) {
        if id.role == Role::Node && !members.contains(&id.name) {
            let why = format!(
                "{caller} is not a node of this agent's cluster file {}; add it there and restart this agent, or reissue that node's credential under its listed name",
                file.display()
            );
            tracing::warn!("refused {caller}: {why}");
            return refuse(&mut send, Refusal::Forbidden(why)).await;
        }
    }
    match hello.check() {
        Ok(Service::Transfer) => transfer::serve(conn, send, recv, &ctx.transfer, &caller).await,
        Ok(Service::Admin) => admin::serve(conn, send, recv, &ctx.admin, &caller).await,
        Ok(Service::Launch) => launch::serve(conn, send, recv, &ctx.launch, &caller).await,
        Err(r) => refuse(&mut send, r).await,
    }
}

/// Who asked: the identity its certificate states, and where from.
struct Caller {
    peer: Peer,
    addr: SocketAddr,
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.peer, self.addr)
    }
}

impl Caller {
    /// `Ok` if the caller may do `what` on this node (`me`); a refusal is
    /// logged with the caller's name.
    fn operator_only(&self, me: &str, what: &str) -> Result<(), Refusal> {
        permit::operator_only(me, &self.peer, what).map_err(|why| {
            tracing::warn!("refused {self}: {why}");
            Refusal::Forbidden(why.to_string())
        })
    }
}

/// Sends a one-message reply and waits (briefly) for the asker to close.
async fn answer<T: serde::Serialize>(
    conn: &quinn::Connection,
    mut send: quinn::SendStream,
    reply: &T,
) -> Result<()> {
    write_frame(&mut send, reply).await?;
    let _ = send.finish();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
    Ok(())
}

/// Answers with `r` and ends the stream. Every service's reply enum has
/// `Failed(Refusal)` at the same tag, so one frame serves all
/// ([`xfer_proto::refusal::FailedReply`]).
async fn refuse(send: &mut quinn::SendStream, r: Refusal) -> Result<()> {
    Err(refusal_sent(send, r).await)
}

/// Sends `r` as the stream's last reply; returns the error that ends the
/// session (the write's, if even that failed).
async fn refusal_sent(send: &mut quinn::SendStream, r: Refusal) -> anyhow::Error {
    if let Err(e) = write_frame(send, &r.clone().into_failed()).await {
        return e;
    }
    let _ = send.finish();
    anyhow::anyhow!("refused: {r}")
}

/// Reads the stream's next message, of at most `limit` bytes. One that
/// cannot be read (oversized, malformed, cut short) is refused, naming
/// `what`, and ends the session with that error.
async fn read_or_refuse<T: serde::de::DeserializeOwned>(
    ctx: &impl FirstMessage,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
    limit: usize,
    what: &str,
) -> Result<T> {
    let within = ctx.first_message_timeout();
    let why = match tokio::time::timeout(within, read_frame_within(recv, limit)).await {
        Ok(Ok(m)) => return Ok(m),
        Ok(Err(e)) => format!("unreadable {what}: {e:#}"),
        Err(_) => format!(
            "no complete {what} within {}s; the stream is closed (send the whole message at once)",
            within.as_secs()
        ),
    };
    Err(refusal_sent(send, Refusal::Protocol(why)).await)
}
