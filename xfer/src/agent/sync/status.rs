//! What an agent says about itself when asked: each model it holds or is
//! receiving (root, state, bytes, rate, ETA, last error) and the jobs it
//! knows. [`Activity`] is the live part the agent updates as transfers,
//! verifications and repairs run; [`AgentStatus`] is the reply on the wire.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::job::JobRecord;
use crate::flow::feed::DraftFeed;
use crate::flow::receive::{Tally, MAX_FALLBACKS};
use crate::flow::receiver::Watcher;
use crate::hub::download::Stats;
use crate::store::{Store, Transfer};
pub use xfer_proto::admin::{AgentStatus, JobView, ModelState, ModelStatus};
use xfer_proto::names::ModelName;
use xfer_proto::transfer::FallbackRoute;

impl From<&JobRecord> for JobView {
    fn from(r: &JobRecord) -> JobView {
        JobView {
            id: r.spec.id.clone(),
            name: r.spec.name.to_string(),
            source_node: r.spec.source_node.clone(),
            nodes: r.spec.members.iter().map(|m| m.node.clone()).collect(),
            state: r.state.clone(),
            here: None,
            last_error: r.last_error.clone(),
            rounds: r.rounds,
            delivered: r.delivered.clone(),
            attempt: r.attempt,
            next_attempt_unix: r.next_attempt_unix,
            hub_endpoint: r
                .hub_endpoint
                .clone()
                .or_else(|| r.spec.hub_endpoint.clone()),
            intake: r.spec.intake.clone(),
            give_up_unix: super::life::give_up_unix(r),
            last_round: r.last_round.clone(),
        }
    }
}

/// Whether a complete record's manifest already holds everything `live`
/// delivers, unchanged (a re-sync of the revision it holds): a manifest
/// with the record's root, or a streamed draft every file (path and size;
/// a Hub cache names each blob by its content hash) and link of which the
/// record has. Only then does the row stay `complete` while it runs; a
/// new revision shows as syncing, with its draft, so a rank that loads as
/// it streams never takes the old bytes for the new.
fn holds_all_of(record: &xfer_proto::manifest::Manifest, live: &Live) -> bool {
    use xfer_proto::manifest::{Entry, Manifest};
    let sizes: HashMap<&xfer_proto::relpath::RelPath, u64> =
        record.files().map(|f| (&f.path, f.size)).collect();
    let links: HashMap<&xfer_proto::relpath::RelPath, &str> = record
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::Symlink { path, target } => Some((path, target.as_str())),
            _ => None,
        })
        .collect();
    let covered = |shape: &Manifest| {
        shape.entries.iter().all(|e| match e {
            Entry::File(f) => sizes.get(&f.path) == Some(&f.size),
            Entry::Symlink { path, target } => links.get(path) == Some(&target.as_str()),
            Entry::Dir { .. } => true,
        })
    };
    match live {
        Live::Receiving { transfer, .. } if !transfer.is_draft() => {
            transfer.manifest().root() == record.root()
        }
        Live::Receiving { transfer, .. } => covered(transfer.manifest()),
        Live::Pulling { feed, .. } => covered(&feed.draft().shape()),
        Live::Verifying | Live::Repairing => false,
    }
}

/// What the pulling node holds of its pull: the bytes downloaded (this run
/// and the runs it resumed), or what is sealed if that is more (files that
/// were in place already).
fn pulled_bytes(feed: &DraftFeed, stats: &Stats) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    let (sealed, _) = feed.sealed_bytes();
    let fetched = stats.downloaded.load(Relaxed) + stats.resumed.load(Relaxed);
    sealed.max(fetched)
}

/// The models that only ended jobs name: some final job names each, and
/// no unfinished one does.
fn ended_only(jobs: &[JobRecord]) -> HashSet<ModelName> {
    let open: HashSet<&ModelName> = jobs
        .iter()
        .filter(|j| !j.state.is_final())
        .map(|j| &j.spec.name)
        .collect();
    jobs.iter()
        .filter(|j| j.state.is_final() && !open.contains(&j.spec.name))
        .map(|j| j.spec.name.clone())
        .collect()
}

/// What is happening to one model right now.
enum Live {
    Receiving {
        transfer: Arc<Transfer>,
        tally: Arc<Tally>,
    },
    /// This node pulls the model from the Hub (a job's source): the
    /// pull's feed says which files are sealed, that is verified and in
    /// place with their links; its counters, how many bytes came in.
    Pulling {
        feed: Arc<DraftFeed>,
        stats: Arc<Stats>,
    },
    Verifying,
    Repairing,
}

#[derive(Default)]
struct Entry {
    live: Option<Live>,
    last_error: Option<String>,
    failed: bool,
    repaired: u64,
    from: (u64, u64),
    /// (held, total) bytes of the last transfer when it ended: a failed
    /// one still shows what a re-run resumes from.
    held: (u64, u64),
    /// The last (time, held bytes) sample, for the rate.
    sample: Option<(Instant, u64, f64)>,
    /// Whether the complete record already holds all the running transfer
    /// delivers ([`holds_all_of`]), worked out once per transfer: it only
    /// changes when the transfer does (a record it marks stops being
    /// complete and is not asked).
    live_covered: Option<bool>,
    /// Pairs whose data for this model went over management: this node's
    /// links of past transfers, and, as a job's source, its members'.
    routes: Vec<FallbackRoute>,
}

impl Entry {
    fn add_route(&mut self, route: FallbackRoute) {
        if self.routes.len() < MAX_FALLBACKS && !self.routes.contains(&route) {
            self.routes.push(route);
        }
    }
}

/// The agent's live view of its models.
#[derive(Default)]
pub struct Activity {
    models: Mutex<HashMap<ModelName, Entry>>,
}

impl Watcher for Activity {
    fn receiving(&self, name: &ModelName, transfer: Arc<Transfer>, tally: Arc<Tally>) {
        Activity::receiving(self, name, transfer, tally)
    }

    fn ended(&self, name: &ModelName, error: Option<String>) {
        Activity::ended(self, name, error)
    }
}

impl Activity {
    /// `name` is being received: `transfer`, with its `tally`.
    pub fn receiving(&self, name: &ModelName, transfer: Arc<Transfer>, tally: Arc<Tally>) {
        let mut m = self.models.lock().unwrap();
        let e = m.entry(name.clone()).or_default();
        e.live = Some(Live::Receiving { transfer, tally });
        e.failed = false;
        e.sample = None;
        e.live_covered = None;
        // A new transfer finds its own way; old fallbacks would mislead.
        e.routes.clear();
    }

    /// This node pulls `name` from the Hub, streaming `feed` to the
    /// others; `stats` counts what the download brought in so far.
    pub fn pulling(&self, name: &ModelName, feed: Arc<DraftFeed>, stats: Arc<Stats>) {
        let mut m = self.models.lock().unwrap();
        let e = m.entry(name.clone()).or_default();
        e.live = Some(Live::Pulling { feed, stats });
        e.failed = false;
        e.sample = None;
        e.live_covered = None;
    }

    /// The pull of `name` here ended (its outcome is the job's).
    pub fn pulled(&self, name: &ModelName) {
        if let Some(e) = self.models.lock().unwrap().get_mut(name) {
            if let Some(Live::Pulling { feed, stats }) = &e.live {
                let (_, total) = feed.sealed_bytes();
                e.held = (pulled_bytes(feed, stats).min(total), total);
                e.live = None;
                e.sample = None;
            }
        }
    }

    /// A pair whose data for `name` goes over management (told to a job's
    /// source by its push).
    pub fn fell_back(&self, name: &ModelName, route: FallbackRoute) {
        let mut m = self.models.lock().unwrap();
        m.entry(name.clone()).or_default().add_route(route);
    }

    /// `name` is being re-hashed.
    pub fn verifying(&self, name: &ModelName) {
        self.models
            .lock()
            .unwrap()
            .entry(name.clone())
            .or_default()
            .live = Some(Live::Verifying);
    }

    /// `name` is being repaired, because `why`.
    pub fn repairing(&self, name: &ModelName, why: String) {
        let mut m = self.models.lock().unwrap();
        let e = m.entry(name.clone()).or_default();
        e.live = Some(Live::Repairing);
        e.last_error = Some(why);
    }

    /// `files` files of `name` were repaired.
    pub fn repaired(&self, name: &ModelName, files: u64) {
        let mut m = self.models.lock().unwrap();
        let e = m.entry(name.clone()).or_default();
        e.repaired += files;
    }

    /// The running activity ended; `error` says why if it failed.
    pub fn ended(&self, name: &ModelName, error: Option<String>) {
        let mut m = self.models.lock().unwrap();
        let e = m.entry(name.clone()).or_default();
        if let Some(Live::Receiving { transfer, tally }) = &e.live {
            e.from = (
                tally.from_source.load(std::sync::atomic::Ordering::Relaxed),
                tally.from_peers.load(std::sync::atomic::Ordering::Relaxed),
            );
            e.held = (transfer.held_bytes(), transfer.manifest().total_bytes());
            for r in tally.fallbacks_from(0) {
                e.add_route(r);
            }
        }
        // A transfer that completed makes every earlier error stale.
        let completed = matches!(&e.live, Some(Live::Receiving { transfer, .. })
            if error.is_none() && transfer.held_bytes() >= transfer.manifest().total_bytes());
        if completed {
            e.last_error = None;
        }
        e.live = None;
        e.failed = error.is_some();
        if error.is_some() {
            e.last_error = error;
        }
    }

    /// Drops what is known about `name` (it was removed), unless a
    /// transfer of it is running.
    pub fn forget(&self, name: &ModelName) {
        let mut m = self.models.lock().unwrap();
        if !matches!(m.get(name), Some(Entry { live: Some(_), .. })) {
            m.remove(name);
        }
    }

    /// Records `error` as the last error about `name`.
    pub fn note_error(&self, name: &ModelName, error: String) {
        self.models
            .lock()
            .unwrap()
            .entry(name.clone())
            .or_default()
            .last_error = Some(error);
    }

    /// Samples the progress of running transfers, for their rates; the
    /// agent calls it about once a second.
    pub fn tick(&self) {
        let now = Instant::now();
        let mut m = self.models.lock().unwrap();
        for e in m.values_mut() {
            let held = match &e.live {
                Some(Live::Receiving { transfer, .. }) => transfer.held_bytes(),
                Some(Live::Pulling { feed, stats }) => pulled_bytes(feed, stats),
                _ => continue,
            };
            e.sample = Some(match e.sample {
                Some((t, h, r)) => {
                    let dt = now.duration_since(t).as_secs_f64().max(1e-3);
                    let inst = held.saturating_sub(h) as f64 / dt;
                    (now, held, if r > 0.0 { 0.6 * r + 0.4 * inst } else { inst })
                }
                None => (now, held, 0.0),
            });
        }
    }

    /// The status of every model this node holds, receives or is expected
    /// to receive (`jobs`).
    pub fn report(&self, store: &Store, node: Option<String>, jobs: &[JobRecord]) -> AgentStatus {
        let mut out: Vec<ModelStatus> = Vec::new();
        let records: HashMap<ModelName, _> = store.models().into_iter().collect();
        let replacing = store.replacing();
        let mut m = self.models.lock().unwrap();
        let mut names: Vec<ModelName> = records.keys().cloned().collect();
        names.extend(replacing.iter().cloned());
        names.extend(m.keys().cloned());
        for j in jobs {
            // A finished job names nothing still to come (a removed model
            // must not come back as queued).
            if !j.state.is_final() && node.as_deref().is_some_and(|n| j.spec.is_member(n)) {
                names.push(j.spec.name.clone());
            }
        }
        let ended = ended_only(jobs);
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        for name in names {
            let rec = records.get(&name);
            // What is left of a transfer whose job ended (failed or
            // cancelled) here is not a model: no row.
            let idle = m.get(&name).is_none_or(|e| e.live.is_none());
            if rec.is_none() && !replacing.contains(&name) && idle && ended.contains(&name) {
                continue;
            }
            let e = m.entry(name.clone()).or_default();
            let mut st = ModelStatus {
                name: name.to_string(),
                root: rec.map(|r| r.manifest.root),
                state: if rec.is_some() {
                    ModelState::Complete
                } else if replacing.contains(&name) {
                    ModelState::Replacing
                } else if e.failed {
                    ModelState::Failed
                } else {
                    ModelState::Queued
                },
                bytes_total: rec.map_or(e.held.1, |r| r.manifest.manifest.total_bytes()),
                bytes_held: rec.map_or(e.held.0, |r| r.manifest.manifest.total_bytes()),
                rate_bps: 0.0,
                eta_s: None,
                from_source: e.from.0,
                from_peers: e.from.1,
                last_error: e.last_error.clone(),
                repaired_files: e.repaired,
                fallbacks: e.routes.clone(),
                pending: Vec::new(),
                draft: rec.and_then(|r| r.draft),
            };
            // A transfer that has not changed a complete model yet (a
            // re-sync of what it holds, or a new revision before its first
            // file lands: the record is marked `replacing` first) leaves
            // it complete, with its root: a model that was fine is shown
            // fine until it is not.
            if let (Some(live), Some(rec), None) = (&e.live, rec, e.live_covered) {
                e.live_covered = Some(holds_all_of(&rec.manifest.manifest, live));
            }
            let live = match (&e.live, rec) {
                (Some(_), Some(_)) if e.live_covered == Some(true) => None,
                (live, _) => live.as_ref(),
            };
            match live {
                Some(Live::Receiving { transfer, tally }) => {
                    let held = transfer.held_bytes();
                    let total = transfer.manifest().total_bytes();
                    let rate = e.sample.map(|(_, _, r)| r).unwrap_or(0.0);
                    st.state = ModelState::Syncing;
                    // A streamed pull's root is known only once it is sealed;
                    // until then its draft's id names it.
                    st.root = (!transfer.is_draft()).then(|| transfer.manifest().root());
                    st.draft = transfer.draft_lineage();
                    st.pending = transfer.pending().iter().map(|p| p.to_string()).collect();
                    st.bytes_total = total;
                    st.bytes_held = held;
                    st.rate_bps = rate;
                    st.eta_s = (rate > 0.0).then(|| (total - held) as f64 / rate);
                    st.from_source = tally.from_source.load(std::sync::atomic::Ordering::Relaxed);
                    st.from_peers = tally.from_peers.load(std::sync::atomic::Ordering::Relaxed);
                    for r in tally.fallbacks_from(0) {
                        if !st.fallbacks.contains(&r) {
                            st.fallbacks.push(r);
                        }
                    }
                }
                Some(Live::Pulling { feed, stats }) => {
                    let (_, total) = feed.sealed_bytes();
                    let held = pulled_bytes(feed, stats).min(total);
                    let rate = e.sample.map(|(_, _, r)| r).unwrap_or(0.0);
                    st.state = ModelState::Syncing;
                    st.root = None;
                    st.draft = Some(feed.id());
                    st.pending = feed.pending().iter().map(|p| p.to_string()).collect();
                    st.bytes_total = total;
                    st.bytes_held = held;
                    st.rate_bps = rate;
                    st.eta_s = (rate > 0.0).then(|| (total - held) as f64 / rate);
                }
                Some(Live::Verifying) => st.state = ModelState::Verifying,
                Some(Live::Repairing) => st.state = ModelState::Repairing,
                None => {}
            }
            out.push(st);
        }
        // A member's copy of a job is not updated by the source; show the
        // state of the model here instead.
        let jobs = jobs
            .iter()
            .map(|j| {
                let mut v = JobView::from(j);
                let source_here = j.me.as_deref() == Some(j.spec.source_node.as_str());
                if !source_here && !j.state.is_final() {
                    if let Some(m) = out.iter().find(|m| m.name == j.spec.name.as_str()) {
                        v.here = Some(m.state);
                    }
                }
                v
            })
            .collect();
        AgentStatus {
            node,
            data: None,
            root: store.root().display().to_string(),
            models: out,
            jobs,
            images: Vec::new(),
            platform: Some(crate::image::registry::manifest::Platform::of_node().to_string()),
        }
    }
}
