//! `deploy`, the day before `up`: the preflight must pass but for the
//! weights and the image; the model, when it is a Hub repo, is synced to
//! every launch node that lacks it (pulled once by the head's agent and
//! fanned out to the others while it downloads; a node that already holds
//! it verified keeps it), and `[launch] image` is delivered from the
//! operator's engine to the nodes that lack it (or hold another image
//! under its name). `up` does the rest. The sync starts as soon as the
//! nodes' weights and free space are read, beside the rest of the
//! preflight (whose rendezvous probe imports torch); the image is delivered once
//! the preflight passed, and `up` asks again only what a sync changes.
//! Each phase is timed. Run again after an interruption, the sync resumes
//! from the agents' journals, the image's blobs a node holds are not sent
//! again, and a complete model or a loaded image is not moved again.
//!
//! With `[launch] stream_weights`, `up` runs beside the sync: the ranks
//! start once the small files are verified on every node, and each rank's
//! loader takes each shard as its node's agent verifies it
//! ([`crate::stream`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use xfer::client::image::{push_to_cluster, Note};
use xfer::client::sync::{hub_size, sync, SyncRequest, TransportChoice};
use xfer::client::wait::wait;
use xfer::config::auth::Credential;
use xfer::config::cluster::Cluster;
use xfer::util::progress::Progress;
use xfer_proto::image::ContainerRuntime;
use xfer_proto::launch::Probe;
use xfer_proto::repo::RepoRef;
use xfer_proto::units::Bytes;

use crate::agents::{Agents, NodeError};
use crate::check::{self, Checked};
use crate::config::Setup;
use crate::preflight::{self, Verdict};

/// The check whose failure a sync can fix.
const WEIGHTS: &str = "weights";
/// The check whose failure an image delivery can fix.
const IMAGE: &str = "image";

/// How the phases before `up` went.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phases {
    /// The first preflight, seconds.
    pub check_s: f64,
    /// The sync, seconds (0 when every node held the model).
    pub sync_s: f64,
    /// The nodes that lacked the model, by name.
    pub lacking: Vec<String>,
    /// The synced model's root, when a sync ran.
    pub root: Option<String>,
    /// The image delivery, seconds (0 when every node held the image, or
    /// there is none). It runs beside the sync.
    pub image_s: f64,
    /// The nodes the image was delivered to, by name.
    pub image_lacking: Vec<String>,
    /// The delivered image's id, when a delivery ran.
    pub image: Option<String>,
    /// How long each round of the first preflight took.
    pub check_rounds: crate::check::Rounds,
    /// When `deploy` started (`answered_s` counts from it).
    #[serde(skip)]
    pub started: Option<Instant>,
}

/// Why `deploy` stopped before `up`. Every variant is one line.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// A check a sync cannot fix failed.
    #[error("{failed} check(s) besides the weights failed (the table above says which, and the fix); fix them, then run deploy again")]
    ChecksFailed {
        /// How many rows failed.
        failed: usize,
    },
    /// Nodes lack a model that is a folder, not a repo.
    #[error("{nodes} lack {path}, which is a folder, not a Hub repo: deploy syncs only a model named by ORG/NAME; copy it with `xfer sync {path} --cluster {file} --nodes {nodes}` (or set model = \"ORG/NAME\"), then run deploy again")]
    NotARepo {
        /// The model's path.
        path: String,
        /// The nodes that lack it, comma separated.
        nodes: String,
        /// The cluster file.
        file: String,
    },
    /// Nodes lack the space for the model, by the Hub's listing.
    #[error("{repo} takes {need} (the Hub's listing) and {nodes} cannot hold it: free space there (what a node already holds of the model counts), or start its agent with --root on a larger disk; then run deploy again")]
    NoSpace {
        /// The repo, `ORG/NAME@REV`.
        repo: String,
        /// The model's size.
        need: Bytes,
        /// Each short node with its free space, comma separated.
        nodes: String,
    },
    /// The cluster file or key could not be read for the sync.
    #[error("cannot start the sync: {0}")]
    Setup(String),
    /// The image could not be delivered.
    #[error("the delivery of image {image} failed: {why}; once that is fixed, run deploy again (blobs the nodes hold are not sent again)")]
    Image {
        /// The image reference.
        image: String,
        /// Why it failed.
        why: String,
    },
    /// The sync failed.
    #[error("the sync of {repo} failed: {why}; once that is fixed, run deploy again (the nodes keep what they verified)")]
    Sync {
        /// What was synced (`hf://ORG/NAME@REV`).
        repo: String,
        /// Why it failed.
        why: String,
    },
}

/// What `deploy` hands `up`.
pub struct Prepared<'a> {
    /// The phases so far.
    pub phases: Phases,
    /// The Hub's commit for the revision, when the sync streams beside
    /// `up`: the snapshot path the ranks load (`refs/` is written only at
    /// the sync's end).
    pub commit: Option<String>,
    /// The sync, when it runs beside `up` (`stream_weights`).
    pub streaming: Option<Streaming>,
    /// The preflight: passed, or still running beside a streamed sync
    /// (then `up` starts the ranks held and releases them once it passed).
    pub checked: Preflight<'a>,
}

/// Where `deploy`'s preflight stands when `up` takes over.
pub enum Preflight<'a> {
    /// It passed: `up` asks again only what a sync changes
    /// ([`check::recheck`]).
    Passed(Checked),
    /// It still runs (`stream_weights`, a vLLM on the hosts, the sync
    /// started): `up` plans on the light facts, starts the ranks held, and
    /// releases them only once this passed. It leaves the rendezvous to
    /// the held ranks ([`check::RendezvousBy::HeldRanks`]) once `up` says
    /// they started.
    Running(check::Running<'a>, check::HeldStarted),
}

/// Whether `up` may start `setup`'s ranks held while the preflight runs:
/// under `stream_weights`, for vLLM's multiprocess backend (whose loader
/// plugin holds it before it reads or binds anything) on the hosts (a
/// container could not see the release file). Ray's backend starts `ray
/// start` first, which binds ports, so it waits for the verdict.
pub fn may_hold(setup: &Setup) -> bool {
    setup.stream_weights
        && setup.container.is_none()
        && setup.engine == crate::config::Engine::Vllm
        && setup.runner == crate::config::Runner::Agents
}

/// The preflight, then the sync of the model to the launch nodes that
/// lack it and, beside it, the delivery of the image from the operator's
/// `image_engine` to the nodes that lack it. `progress` shows the sync.
/// With `stream_weights`, the sync is only started: `up` runs beside it.
///
/// The sync does not wait for the whole preflight: the facts it depends
/// on (each node's weights and free space, the Hub's listing) come back
/// in a fraction of a second, while the engine's versions, the resolver
/// and the rendezvous take seconds (the probe imports torch). So the sync
/// starts on those first facts and the whole preflight runs beside it;
/// the image is delivered, and `up` starts, only once it passed. Under
/// [`may_hold`], with a sync started, the preflight still running is
/// handed to `up` instead ([`Preflight::Running`]).
pub async fn prepare<'a>(
    setup: &'a Setup,
    agents: &'a Agents,
    image_engine: ContainerRuntime,
    progress: &Progress,
) -> Result<Prepared<'a>, DeployError> {
    let t0 = Instant::now();
    eprintln!(
        "checking {} node(s); the model's sync starts once their weights and disks are read...",
        setup.nodes.len()
    );
    // A repo at a branch: the Hub's commit for it now, read from here while
    // the nodes are checked, so nodes that hold an older one are synced too
    // (and its size, for the disk check).
    let listing = async {
        match &setup.model.repo {
            Some(repo) => hub_listing(repo).await,
            None => None,
        }
    };
    let early = async {
        let ((nodes, rows), listed) = tokio::join!(check::light(setup, agents), listing);
        let lacking = lacking_model(setup, &nodes, &rows, listed.as_ref());
        let image_lacking = match &setup.container {
            Some(_) => nodes_of(failing(&rows, Some(IMAGE)), setup),
            None => Vec::new(),
        };
        if let (false, Some(repo), Some((_, total))) =
            (lacking.is_empty(), &setup.model.repo, &listed)
        {
            check_space(repo, &nodes, &lacking, *total)?;
        }
        let sync = match lacking.is_empty() {
            true => None,
            false => {
                let (cluster, cred) = sync_setup(setup)?;
                let pin = listed.as_ref().map(|(c, _)| c.as_str());
                Some(start_sync(setup, &cluster, &cred, &lacking, pin).await?)
            }
        };
        Ok::<_, DeployError>((lacking, image_lacking, listed, sync))
    };
    // Under `may_hold` the rendezvous is the held ranks' to meet, if `up`
    // starts them held; the sender dropped, the agents' probe meets it.
    let (held_started, by) = match may_hold(setup) {
        true => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), check::RendezvousBy::HeldRanks(rx))
        }
        false => (None, check::RendezvousBy::Probe),
    };
    let mut full: check::Running<'a> = Box::pin(check::run_with(setup, agents, by));
    let (mut early, done) = {
        tokio::pin!(early);
        let mut done = None;
        loop {
            tokio::select! {
                c = &mut full, if done.is_none() => done = Some(c),
                e = &mut early => break (e, done),
            }
        }
    };
    if let (None, Some(held_started)) = (&done, held_started) {
        match early {
            Ok((lacking, _, listed, Some(sync))) => {
                eprintln!(
                    "the ranks start held once the small files are verified; the rest of the preflight goes on beside them"
                );
                return Ok(Prepared {
                    phases: Phases {
                        started: Some(t0),
                        lacking,
                        ..Phases::default()
                    },
                    commit: listed.map(|(c, _)| c),
                    streaming: Some(sync),
                    checked: Preflight::Running(full, held_started),
                });
            }
            // Nothing to sync, or the early facts failed: the verdict first
            // (`held_started` dropped: the agents' probe meets the rendezvous).
            other => early = other,
        }
    }
    let checked = match done {
        Some(c) => c,
        None => full.await,
    };
    let (moving, image_moving) = match &early {
        Ok((lacking, image_lacking, ..)) => (lacking.as_slice(), image_lacking.as_slice()),
        Err(_) => (&[][..], &[][..]),
    };
    eprint!(
        "{}",
        preflight::render(
            &as_deploy_moves(&checked.rows, moving, image_moving),
            xfer::util::term::stderr_width()
        )
    );
    let (lacking, image_lacking, listed, sync) = early?;
    let others = failing(&checked.rows, None).count();
    if others > 0 {
        if let Some(s) = &sync {
            eprintln!(
                "the sync of {} started beside the check goes on (`xfer status` follows it)",
                s.source
            );
        }
        return Err(DeployError::ChecksFailed { failed: others });
    }
    let mut phases = Phases {
        check_s: t0.elapsed().as_secs_f64(),
        check_rounds: checked.rounds.clone(),
        started: Some(t0),
        lacking: lacking.clone(),
        image_lacking: image_lacking.clone(),
        ..Phases::default()
    };
    if lacking.is_empty() && image_lacking.is_empty() {
        eprintln!("every node holds the model verified (and the image): nothing to move");
        return Ok(Prepared {
            phases,
            commit: None,
            streaming: None,
            checked: Preflight::Passed(checked),
        });
    }
    // With the loader plugin, `up` starts the ranks while the sync runs:
    // it is followed beside `up`.
    let stream = setup.stream_weights && setup.container.is_none();
    if stream && sync.is_some() {
        return Ok(Prepared {
            phases,
            commit: listed.map(|(c, _)| c),
            streaming: sync,
            checked: Preflight::Passed(checked),
        });
    }
    let model = async {
        match sync {
            None => Ok(None),
            Some(s) => s.wait(progress).await.map(Some),
        }
    };
    let image = async {
        if image_lacking.is_empty() {
            return Ok(None);
        }
        let Some(c) = setup.container.as_ref() else {
            return Ok(None);
        };
        let (cluster, cred) = sync_setup(setup)?;
        let t = Instant::now();
        let id = deliver_image(&c.image, &cluster, &cred, &image_lacking, image_engine).await?;
        Ok::<_, DeployError>(Some((id, t.elapsed().as_secs_f64())))
    };
    let (model, image) = tokio::join!(model, image);
    if let Some((root, secs)) = model? {
        phases.sync_s = secs;
        phases.root = Some(root);
    }
    if let Some((id, secs)) = image? {
        phases.image_s = secs;
        phases.image = Some(id);
    }
    Ok(Prepared {
        phases,
        commit: None,
        streaming: None,
        checked: Preflight::Passed(checked),
    })
}

/// The cluster file and the operator's key, read for a sync or a delivery.
fn sync_setup(setup: &Setup) -> Result<(Cluster, Arc<Credential>), DeployError> {
    let cluster = Cluster::load(&setup.path).map_err(|e| DeployError::Setup(format!("{e:#}")))?;
    let cred = Credential::load(&setup.key).map_err(|e| DeployError::Setup(format!("{e:#}")))?;
    Ok((cluster, Arc::new(cred)))
}

/// The failing rows of `check`, or of every check but the weights and the
/// image (`None`).
fn failing<'a>(
    rows: &'a [preflight::Row],
    check: Option<&'static str>,
) -> impl Iterator<Item = &'a preflight::Row> + 'a {
    rows.iter().filter(move |r| {
        r.verdict == Verdict::Fail
            && match check {
                Some(c) => r.check == c,
                None => r.check != WEIGHTS && r.check != IMAGE,
            }
    })
}

/// The rows as `deploy` shows them: a weights row that failed on a node
/// the sync fills, or an image row on a node the image is delivered to,
/// is what `deploy` does next, not a failure (its fix was "run xfer
/// sync"): it reads `moving: ...` and passes to the next step, which says
/// how the move went.
fn as_deploy_moves(
    rows: &[preflight::Row],
    lacking: &[String],
    image_lacking: &[String],
) -> Vec<preflight::Row> {
    rows.iter()
        .cloned()
        .map(|mut r| {
            let what = match r.check {
                WEIGHTS if lacking.contains(&r.node) => "deploy syncs the model here now",
                IMAGE if image_lacking.contains(&r.node) => "deploy delivers the image here now",
                _ => return r,
            };
            if r.verdict == Verdict::Fail {
                r.verdict = Verdict::Skip;
                r.detail = format!("{what} (found: {})", r.detail);
                r.fix = None;
            }
            r
        })
        .collect()
}

/// The launch nodes the model must be synced to: those whose weights row
/// failed, and those that hold another commit than the Hub's for the
/// revision now (`listed`), in rank order.
fn lacking_model(
    setup: &Setup,
    nodes: &[(String, Result<xfer_proto::launch::NodeFacts, NodeError>)],
    rows: &[preflight::Row],
    listed: Option<&(String, u64)>,
) -> Vec<String> {
    let mut lacking = nodes_of(failing(rows, Some(WEIGHTS)), setup);
    let Some((commit, _)) = listed else {
        return lacking;
    };
    let stale = stale_nodes(nodes, commit, &lacking);
    if stale.is_empty() {
        return lacking;
    }
    eprintln!(
        "{} hold(s) an older commit of the model than the Hub's {}: syncing the new one there",
        stale.join(", "),
        &commit[..commit.len().min(12)]
    );
    lacking.extend(stale);
    setup
        .nodes
        .iter()
        .filter(|n| lacking.contains(&n.name))
        .map(|n| n.name.clone())
        .collect()
}

/// How long the listing may take from here before `deploy` goes on and
/// leaves the space to the agents' own check at the sync's start.
const LISTING_TIMEOUT: Duration = Duration::from_secs(15);

/// The Hub's commit for `repo`'s revision and the repo's size, read from
/// the operator's machine (nothing is downloaded); `None`, with a warning,
/// when the Hub does not answer within [`LISTING_TIMEOUT`] or
/// `HF_HUB_OFFLINE` is set: the nodes' own copies and the agents' own
/// space checks then decide.
async fn hub_listing(repo: &RepoRef) -> Option<(String, u64)> {
    let name = format!("{}@{}", repo.id, repo.revision);
    if std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| !v.is_empty() && v != "0") {
        eprintln!(
            "HF_HUB_OFFLINE is set: {name} is not looked up on the Hub; the nodes' copies decide"
        );
        return None;
    }
    let sized = tokio::time::timeout(
        LISTING_TIMEOUT,
        hub_size(&repo.id, &repo.revision, repo.repo_type),
    )
    .await;
    match sized {
        Ok(Ok(listed)) => Some(listed),
        Ok(Err(e)) => {
            eprintln!("warning: cannot read {name} from the Hub here ({e:#}); the nodes' copies decide, and each agent checks its own space when a sync starts");
            None
        }
        Err(_) => {
            eprintln!("warning: the Hub did not list {name} within {}s from here; the nodes' copies decide, and each agent checks its own space when a sync starts", LISTING_TIMEOUT.as_secs());
            None
        }
    }
}

/// The nodes (not already in `lacking`) that hold the model at another
/// commit than `commit`, the Hub's for the revision now.
fn stale_nodes(
    nodes: &[(String, Result<xfer_proto::launch::NodeFacts, NodeError>)],
    commit: &str,
    lacking: &[String],
) -> Vec<String> {
    nodes
        .iter()
        .filter(|(n, _)| !lacking.contains(n))
        .filter(|(_, f)| {
            f.as_ref()
                .ok()
                .and_then(|f| f.weights.commit.as_deref())
                .is_some_and(|held| held != commit)
        })
        .map(|(n, _)| n.clone())
        .collect()
}

/// Every node in `lacking` has the space for the model, `total` bytes by
/// the Hub's listing: its free space plus what it holds of the model
/// already.
fn check_space(
    repo: &RepoRef,
    nodes: &[(String, Result<xfer_proto::launch::NodeFacts, NodeError>)],
    lacking: &[String],
    total: u64,
) -> Result<(), DeployError> {
    let name = format!("{}@{}", repo.id, repo.revision);
    let short: Vec<String> = nodes
        .iter()
        .filter(|(n, _)| lacking.contains(n))
        .filter_map(|(n, f)| {
            let f = f.as_ref().ok()?;
            let Probe::Ok(d) = &f.disk else { return None };
            (d.free_bytes + f.weights.bytes_present < total)
                .then(|| format!("{n} ({} free at {})", Bytes(d.free_bytes), d.path))
        })
        .collect();
    if !short.is_empty() {
        return Err(DeployError::NoSpace {
            repo: name,
            need: Bytes(total),
            nodes: short.join(", "),
        });
    }
    eprintln!(
        "{name}: {} by the Hub's listing; every node that lacks it has the space",
        Bytes(total)
    );
    Ok(())
}

/// The launch nodes these failing rows name, in rank order; a row about
/// every node ("*": the nodes differ) names them all.
fn nodes_of<'a>(rows: impl Iterator<Item = &'a preflight::Row>, setup: &Setup) -> Vec<String> {
    let named: Vec<&str> = rows.map(|r| r.node.as_str()).collect();
    setup
        .nodes
        .iter()
        .filter(|n| named.iter().any(|r| *r == "*" || *r == n.name))
        .map(|n| n.name.clone())
        .collect()
}

/// A sync the agents run while `up` starts the ranks (`stream_weights`):
/// what [`Streaming::wait`] needs to see it end.
pub struct Streaming {
    cluster: Cluster,
    cred: Arc<Credential>,
    spec: xfer::client::sync::JobSpec,
    source: String,
    started: Instant,
}

impl Streaming {
    /// The model's source, as the sync names it (`hf://ORG/NAME@COMMIT`).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Waits for the sync to end on every node; the model's root and the
    /// seconds since it started.
    pub async fn wait(self, progress: &Progress) -> Result<(String, f64), DeployError> {
        let failed = |why: String| DeployError::Sync {
            repo: self.source.clone(),
            why,
        };
        let root = wait(&self.cluster, &self.cred, &self.spec, progress)
            .await
            .map_err(|e| failed(format!("{e:#}")))?;
        progress.end();
        let secs = self.started.elapsed().as_secs_f64();
        eprintln!(
            "{}: complete on {} node(s) in {secs:.1}s, root {root}",
            self.source,
            self.spec.members.len(),
        );
        Ok((root, secs))
    }
}

/// Starts the sync of the model, a Hub repo, to every launch node, head
/// first: the head pulls, and a node that holds it verified already takes
/// nothing. The agents run it; [`Streaming::wait`] follows it.
async fn start_sync(
    setup: &Setup,
    cluster: &Cluster,
    cred: &Arc<Credential>,
    lacking: &[String],
    pin: Option<&str>,
) -> Result<Streaming, DeployError> {
    let Some(repo) = &setup.model.repo else {
        return Err(DeployError::NotARepo {
            path: setup.model.path.clone(),
            nodes: lacking.join(","),
            file: setup.path.display().to_string(),
        });
    };
    let source = format!("hf://{}@{}", repo.id, repo.revision);
    eprintln!(
        "syncing {source} to {} (lacking on {})",
        setup
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        lacking.join(", ")
    );
    let started = Instant::now();
    let req = SyncRequest {
        source: source.clone(),
        cwd: std::env::current_dir().unwrap_or_else(|_| "/".into()),
        nodes: setup.nodes.iter().map(|n| n.name.clone()).collect(),
        from: None,
        name: None,
        repo_type: repo.repo_type,
        chunk_size: xfer_proto::manifest::ChunkSize::Auto,
        limit_rate: None,
        transport: TransportChoice::Auto,
        peers: None,
        registry: Default::default(),
        give_up: Default::default(),
        // The commit read above, not the branch: a branch that moves
        // before the source node resolves it must not leave the sync and
        // the path `up` serves on two commits.
        pin: pin.map(str::to_string),
    };
    let spec = sync(cluster, cred, &req)
        .await
        .map_err(|e| DeployError::Sync {
            repo: source.clone(),
            why: format!("{e:#}"),
        })?;
    Ok(Streaming {
        cluster: cluster.clone(),
        cred: cred.clone(),
        spec,
        source,
        started,
    })
}

/// Delivers `image` from the operator's engine to `nodes`; every node must
/// load it. Returns its id.
async fn deliver_image(
    image: &str,
    cluster: &Cluster,
    cred: &Arc<Credential>,
    nodes: &[String],
    engine: ContainerRuntime,
) -> Result<String, DeployError> {
    eprintln!(
        "delivering image {image} from this machine's {} to {}",
        engine.program(),
        nodes.join(", ")
    );
    let failed = |why: String| DeployError::Image {
        image: image.to_string(),
        why,
    };
    let note = |n: Note| match n {
        Note::Warning(m) => eprintln!("{m}"),
        Note::Progress(_) => {}
    };
    let summary = push_to_cluster(
        cluster,
        cred.clone(),
        nodes,
        image,
        engine,
        Progress::new(false),
        &note,
    )
    .await
    .map_err(|e| failed(format!("{e:#}")))?;
    if let Some(bad) = summary.nodes.iter().find(|n| !n.ok) {
        return Err(failed(format!(
            "{}: {}",
            bad.node,
            bad.error.as_deref().unwrap_or("not loaded")
        )));
    }
    eprintln!(
        "image {image}: {} loaded on {} in {:.1}s; this machine sent {}",
        summary.id.short(),
        nodes.join(", "),
        summary.duration_s,
        xfer_proto::units::Bytes(summary.bytes_sent)
    );
    Ok(summary.id.to_string())
}
