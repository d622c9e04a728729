//! Parallel ranged downloads of a set of files into their incomplete files.
//!
//! Every file is cut into [`Parts`]; a fixed number of workers (one HTTP
//! connection each) take parts in file order, so files finish one after
//! another at the full rate and can be verified and fanned out while the
//! next ones download. With intake nodes (striped intake, issue 36) their
//! connections take parts too. Which part a downloader gets next, whose
//! slow range is cut for an idle one, and which intake node retires or is
//! named is decided by the sans-IO planner [`crate::engine::striping`];
//! this module is its I/O driver: it asks, fetches, writes, and tells it
//! what came of each range.
//!
//! Bytes are written at their offsets, then the part's progress advances,
//! then (twice a second) the sidecar is rewritten: after
//! `kill -9` a re-run resumes every part from its recorded prefix.
//!
//! A server that answers a Range request with `200` and the whole body
//! (stock olah, some mirrors) switches that file to one sequential stream,
//! written from offset 0, so nothing is ever written at the wrong place.
//! Each file is hashed as its bytes land: whenever the written prefix grows,
//! a blocking task feeds it to the file's [`Digester`] (sha256 or git sha1,
//! and BLAKE3 chunk hashes if asked), reading it back from the page cache
//! just after it was written. When the last byte is written only the tail
//! is left to hash, then a [`Finisher`] checks the digest and places the
//! file; a file that fails its hash is downloaded once more, from scratch.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use reqwest::{StatusCode, Url};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::digest::{self, Digest, Digester, Expected};
use super::hold::{self, Heard, OriginHold};
use super::http::{error_chain, host_of, Failure, HubHttp};
use super::intake::{Intake, IntakeShare, RangeAsk};
use super::parts::Parts;
use super::ranges::{Ask, RangeHosts};
use super::retry;
use crate::engine::striping::{self, Answer, InFlight, Next, Planner, Thief, THIS_NODE};

/// Bytes per ranged request.
pub const DEFAULT_PART_SIZE: u64 = 16 << 20;

/// One file to fetch.
#[derive(Debug, Clone)]
pub struct FileJob {
    /// The file's name in the repository (for messages and bars).
    pub path: String,
    /// `…/resolve/{commit}/{path}`.
    pub url: String,
    /// Size in bytes.
    pub size: u64,
    /// The hash the file must have (its etag names the sidecar's owner).
    pub expected: Expected,
    /// Also compute the file's BLAKE3 chunk hashes at this chunk size.
    pub chunk_size: Option<u64>,
    /// The file's index in the streamed pull's draft (with `chunk_size`).
    pub draft_file: Option<u32>,
    /// Where the bytes go until verified.
    pub incomplete: PathBuf,
    /// The resume record next to it.
    pub sidecar: PathBuf,
}

/// What became of a finished file.
pub enum Verdict {
    /// Verified and placed.
    Placed,
    /// The contents do not match; try the download once more.
    Mismatch(String),
    /// Give up on the whole pull.
    Fatal(String),
}

/// Places a file whose bytes are all written and hashed, if its digest
/// matched. Called on a blocking thread, once per completed download.
pub trait Finisher: Send + Sync + 'static {
    /// Places file `index` if `digest` matched; says what happened.
    fn finish(&self, index: usize, job: &FileJob, digest: Digest) -> Verdict;
}

/// Counters for the summary and the bars.
#[derive(Debug, Default)]
pub struct Stats {
    /// Bytes received over HTTP (including re-downloads).
    pub downloaded: AtomicU64,
    /// Bytes the sidecars said were already there.
    pub resumed: AtomicU64,
    /// Requests tried again after a transient failure.
    pub retries: AtomicU64,
    /// Files downloaded a second time after a hash mismatch.
    pub redownloads: AtomicU64,
    /// Files whose server ignored Range.
    pub whole_streams: AtomicU64,
    /// Who fetched what from the origin, when other nodes took ranges
    /// ([`Options::intake`]): this node first, then each intake node.
    pub shares: Mutex<Vec<IntakeShare>>,
}

/// Tuning.
#[derive(Debug, Clone)]
pub struct Options {
    /// HTTP connections at once.
    pub connections: usize,
    /// Bytes per ranged request.
    pub part_size: u64,
    /// The repo's id, for messages.
    pub repo: String,
    /// Other nodes that fetch ranges over their own links (striped
    /// intake); empty: this node alone.
    pub intake: Intake,
}

/// Progress as the downloader sees it, for bars.
pub trait Watch: Send + Sync + 'static {
    /// `n` more bytes of file `index` are written.
    fn written(&self, index: usize, n: u64);
    /// File `index` resumes with `n` bytes written by an earlier run
    /// (bars count them as held, not as moved now).
    fn resumed(&self, _index: usize, _n: u64) {}
    /// File `index` is verified and placed, or starts over (`ok == false`).
    fn finished(&self, index: usize, ok: bool);
    /// Chunks `first..first + hashes.len()` of file `index` have these
    /// BLAKE3 hashes (only with [`FileJob::chunk_size`]), before the file's
    /// `finished`: chunks past the written prefix as their part lands them
    /// (a chunk may be told twice, with the same hash), the rest in order.
    fn hashed(&self, _index: usize, _first: u32, _hashes: &[xfer_proto::hash::Hash]) {}
}

struct FileState {
    job: FileJob,
    file: File,
    parts: Mutex<Parts>,
    dirty: AtomicBool,
    /// The sidecar was last written without fsync (on the hot path of
    /// announcing chunks); the next periodic save makes it durable.
    unsynced: AtomicBool,
    /// Resolved once, on first use; cleared if the CDN refuses a stale URL.
    url: tokio::sync::Mutex<Option<Url>>,
    /// The server ignores Range for this file: one stream, from 0.
    whole: AtomicBool,
    streaming: AtomicBool,
    /// Completed downloads of this file that failed their hash.
    mismatches: AtomicU64,
    /// Being verified (guards against finishing twice).
    finishing: AtomicBool,
    /// Verified and placed: its sidecar is gone for good.
    placed: AtomicBool,
    /// Held while the sidecar is written or removed.
    sidecar_io: Mutex<()>,
    /// The file's bytes hashed so far, in order. Locked before `parts`
    /// when both are (a catch-up reads the prefix under it).
    trail: Mutex<Trail>,
    /// A task is feeding `trail` (at most one per file).
    hashing: AtomicBool,
    /// Byte ranges intake node `r` wrote in this download of the file.
    remote_spans: Mutex<Vec<(u64, u64, usize)>>,
    /// After a mismatch with remote ranges in it: this node fetches the
    /// file again alone, and these ranges' BLAKE3 (as the intake nodes
    /// sent them) are compared with the origin's second answer.
    suspects: Mutex<Vec<Span>>,
}

/// One download's single hashing pass.
struct Trail {
    digest: Digester,
    /// Chunk hashes already told to the [`Watch`].
    announced: usize,
    /// The read-back buffer, kept between catch-ups, freed when done.
    buf: Vec<u8>,
}

impl FileState {
    fn fresh_trail(&self) -> Trail {
        Trail {
            digest: Digester::new(&self.job.expected, self.job.size, self.job.chunk_size),
            announced: 0,
            buf: Vec::new(),
        }
    }
}

struct Shared {
    http: HubHttp,
    opts: Options,
    files: Vec<FileState>,
    /// Which part each downloader gets next, who steals, who retires
    /// (`engine::striping`: this module only feeds it and does its word).
    plan: Mutex<Planner>,
    /// Files not yet placed.
    unfinished: AtomicU64,
    wake: Notify,
    cancel: CancellationToken,
    failure: Mutex<Option<DownloadError>>,
    stats: Arc<Stats>,
    /// Per intake node: bytes written from it.
    remote_bytes: Vec<AtomicU64>,
    /// Intake nodes' ranges in flight, by (file, part).
    flights: Mutex<std::collections::HashMap<(usize, usize), Flight>>,
    /// Per downloading node ([`THIS_NODE`], then intake node `r` at
    /// `r + 1`): its connections holding a part now.
    busy: Vec<AtomicUsize>,
    finisher: Arc<dyn Finisher>,
    watch: Arc<dyn Watch>,
    ranges: RangeHosts,
    /// The origin's "slow down", for every downloader of the cluster.
    hold: OriginHold,
}

/// Why a download stopped ([`download`]).
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// An incomplete file's folder could not be created.
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        /// The folder.
        dir: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// An incomplete file could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The incomplete file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// Another pull holds the incomplete file's lock.
    #[error("another xfer pull is downloading {file} into {}; wait for it to finish or stop it", path.display())]
    Locked {
        /// The file's path in the repo.
        file: String,
        /// The incomplete file.
        path: PathBuf,
    },
    /// Writing to the disk failed.
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// A part failed too many times in a row.
    #[error("{file}: {why} ({tries} tries in a row)")]
    GaveUp {
        /// The file's path in the repo.
        file: String,
        /// The last failure.
        why: String,
        /// How many tries failed in a row.
        tries: u32,
    },
    /// A fatal failure of a request, a check or a placement, in words.
    #[error("{0}")]
    Failed(String),
    /// The Hub refused a file with a 4xx that names the cause (see
    /// [`Failure::Refused`]).
    #[error("{why}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// What the Hub said and what to do.
        why: String,
    },
}

/// A file the Hub refused, or a full disk, is permanent; the rest is
/// retried.
impl crate::util::permanence::Permanence for DownloadError {
    fn is_permanent(&self) -> bool {
        matches!(
            self,
            DownloadError::Refused { .. } | DownloadError::Disk(DiskError::Full { .. })
        )
    }
}

/// A write to a downloaded file that failed.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// No space is left.
    #[error("disk full: need {} more at {}; free space there or set HF_HUB_CACHE to a larger disk", xfer_proto::units::Bytes(*need), path.display())]
    Full {
        /// The file being written.
        path: PathBuf,
        /// Bytes the file needs.
        need: u64,
    },
    /// Any other write failure.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file being written.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// Opens (or resumes) the incomplete files of `jobs`, with the sidecars'
/// progress. Fails with a clear message when one is locked by another pull
/// or cannot be created.
fn open_files(
    jobs: Vec<FileJob>,
    part_size: u64,
    stats: &Stats,
) -> Result<Vec<FileState>, DownloadError> {
    let mut out = Vec::with_capacity(jobs.len());
    for job in jobs {
        if let Some(dir) = job.incomplete.parent() {
            crate::util::beneath::create_dir_all_durable(dir).map_err(|source| {
                DownloadError::CreateDir {
                    dir: dir.to_path_buf(),
                    source,
                }
            })?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&job.incomplete)
            .map_err(|source| DownloadError::Open {
                path: job.incomplete.clone(),
                source,
            })?;
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(DownloadError::Locked {
                file: job.path.clone(),
                path: job.incomplete.clone(),
            });
        }
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let resumed = (len == job.size)
            .then(|| std::fs::read(&job.sidecar).ok())
            .flatten()
            .and_then(|b| Parts::decode(&b, job.expected.etag(), job.size));
        let parts = match resumed {
            Some(p) => {
                stats.resumed.fetch_add(p.written(), Ordering::Relaxed);
                p
            }
            None => {
                file.set_len(0)
                    .and_then(|_| crate::store::preallocate(&file, job.size))
                    .map_err(|e| disk_error(&job.incomplete, job.size, e))?;
                Parts::new(job.expected.etag(), job.size, part_size)
            }
        };
        let trail = Mutex::new(Trail {
            digest: Digester::new(&job.expected, job.size, job.chunk_size),
            announced: 0,
            buf: Vec::new(),
        });
        out.push(FileState {
            job,
            trail,
            hashing: AtomicBool::new(false),
            file,
            parts: Mutex::new(parts),
            dirty: AtomicBool::new(true),
            unsynced: AtomicBool::new(false),
            url: tokio::sync::Mutex::new(None),
            whole: AtomicBool::new(false),
            streaming: AtomicBool::new(false),
            mismatches: AtomicU64::new(0),
            finishing: AtomicBool::new(false),
            placed: AtomicBool::new(false),
            sidecar_io: Mutex::new(()),
            remote_spans: Mutex::new(Vec::new()),
            suspects: Mutex::new(Vec::new()),
        });
    }
    Ok(out)
}

fn disk_error(path: &std::path::Path, need: u64, e: std::io::Error) -> DiskError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        DiskError::Full {
            path: path.to_path_buf(),
            need,
        }
    } else {
        DiskError::Write {
            path: path.to_path_buf(),
            source: e,
        }
    }
}

/// Downloads every job, verifying each through `finisher` as it completes.
/// Returns when all are placed, or with the first fatal error (the sidecars
/// are saved either way, so a re-run resumes).
pub async fn download(
    http: HubHttp,
    jobs: Vec<FileJob>,
    opts: Options,
    finisher: Arc<dyn Finisher>,
    watch: Arc<dyn Watch>,
    stats: Arc<Stats>,
) -> Result<(), DownloadError> {
    let chunk_size = jobs.iter().find_map(|j| j.chunk_size);
    let remotes = opts.intake.remotes.len();
    let part_size = striping::part_size(
        opts.part_size,
        opts.connections,
        remotes,
        opts.intake.connections,
        jobs.iter().map(|j| j.size).sum(),
        chunk_size,
    );
    let files = open_files(jobs, part_size, &stats)?;
    let mut queue = Vec::new();
    for (f, st) in files.iter().enumerate() {
        let parts = st.parts.lock().unwrap();
        for i in 0..parts.len() {
            if !parts.is_done(i) {
                queue.push((f, i));
            }
        }
    }
    let shared = Arc::new(Shared {
        remote_bytes: (0..remotes).map(|_| AtomicU64::new(0)).collect(),
        flights: Mutex::default(),
        busy: (0..=opts.intake.remotes.len())
            .map(|_| AtomicUsize::new(0))
            .collect(),
        http,
        unfinished: AtomicU64::new(files.len() as u64),
        plan: Mutex::new(Planner::new(files.len(), queue, remotes)),
        files,
        wake: Notify::new(),
        cancel: CancellationToken::new(),
        failure: Mutex::new(None),
        stats,
        finisher,
        watch,
        opts,
        ranges: RangeHosts::default(),
        hold: OriginHold::default(),
    });
    // Bytes an earlier run wrote count as held on the bars, not as moved.
    for (f, st) in shared.files.iter().enumerate() {
        let held = st.parts.lock().unwrap().written();
        if held > 0 {
            shared.watch.resumed(f, held);
        }
    }
    // Files already complete (resumed, or empty) finish first.
    for f in 0..shared.files.len() {
        if shared.files[f].parts.lock().unwrap().is_complete() {
            finish_file(&shared, f).await;
        }
    }
    // Every task below holds the open incomplete files and their locks.
    // A dropped download (a cancelled job's round) must release them: the
    // sets abort their tasks when dropped, and the guard cancels the rest.
    let _stop = shared.cancel.clone().drop_guard();
    let mut flusher = tokio::task::JoinSet::new();
    flusher.spawn(flush_sidecars(shared.clone()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..shared.opts.connections.max(1) {
        workers.spawn(worker(shared.clone()));
    }
    for r in 0..remotes {
        for _ in 0..shared.opts.intake.connections.max(1) {
            workers.spawn(remote_worker(shared.clone(), r));
        }
    }
    while workers.join_next().await.is_some() {}
    flusher.abort_all();
    save_sidecars(&shared);
    if remotes > 0 {
        *shared.stats.shares.lock().unwrap() = shares(&shared);
    }
    let failure = shared.failure.lock().unwrap().take();
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

async fn flush_sidecars(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = shared.clone();
        let _ = tokio::task::spawn_blocking(move || save_sidecars(&s)).await;
    }
}

/// Rewrites the sidecar of every file that moved, durably: the file's
/// bytes are fdatasynced first, then the sidecar is written to a temporary,
/// fsynced, renamed in and its folder fsynced. The bytes it counts are
/// already written (and, after a power cut, on disk), so a crash never
/// claims more than is there.
fn save_sidecars(shared: &Shared) {
    for st in &shared.files {
        save_sidecar_as(st, true);
    }
}

/// Rewrites one file's sidecar if it moved, atomically but without fsync:
/// called for every chunk announced, where an fsync each would slow the
/// download. It survives the process's death (the page cache keeps it);
/// the next [`save_sidecars`], within half a second, makes it durable.
fn save_sidecar(st: &FileState) {
    save_sidecar_as(st, false);
}

fn save_sidecar_as(st: &FileState, durable: bool) {
    let _io = st.sidecar_io.lock().unwrap();
    if st.placed.load(Ordering::Acquire) {
        return;
    }
    let moved = st.dirty.swap(false, Ordering::AcqRel);
    let unsynced = durable && st.unsynced.swap(false, Ordering::AcqRel);
    if !moved && !unsynced {
        return;
    }
    let bytes = st.parts.lock().unwrap().encode();
    let ok = if durable {
        st.file
            .sync_data()
            .and_then(|_| crate::util::beneath::write_file_durable(&st.job.sidecar, &bytes, 0o644))
    } else {
        st.unsynced.store(true, Ordering::Release);
        let tmp = st.job.sidecar.with_extension("tmp");
        std::fs::write(&tmp, &bytes).and_then(|_| std::fs::rename(&tmp, &st.job.sidecar))
    };
    if let Err(e) = ok {
        tracing::warn!("cannot save {}: {e}", st.job.sidecar.display());
    }
}

fn fail(shared: &Shared, why: DownloadError) {
    let mut f = shared.failure.lock().unwrap();
    if f.is_none() {
        *f = Some(why);
    }
    shared.cancel.cancel();
    shared.wake.notify_waiters();
}

async fn worker(shared: Arc<Shared>) {
    // This connection's rate over its last part (for work stealing).
    let mut rate = 0.0f64;
    loop {
        if shared.cancel.is_cancelled() {
            return;
        }
        let next = shared.plan.lock().unwrap().next_local();
        let Some((f, i)) = next else {
            // Parts may come back (a hash mismatch, a slow intake node's
            // range cut for us); wait for them or the end.
            if idle(&shared, THIS_NODE, rate, Duration::from_millis(200)).await {
                continue;
            }
            return;
        };
        let (began, before) = (std::time::Instant::now(), part_left(&shared, f, i));
        let holding = Busy::new(&shared.busy[THIS_NODE]);
        let fetched = fetch_part(&shared, f, i).await;
        // Not while the file is checked and placed: the link is free then.
        drop(holding);
        if let Err(why) = fetched {
            fail(&shared, why);
            return;
        }
        rate = rate_of(before, began);
        let complete = shared.files[f].parts.lock().unwrap().is_complete();
        if complete {
            finish_file(&shared, f).await;
        }
    }
}

/// A downloader with nothing to take, whose last part went at `rate`:
/// steals (see [`steal`]) and waits for parts to come back, at most
/// `poll`. False when the download is over (every file placed, or
/// cancelled): the downloader stops.
async fn idle(shared: &Shared, node: usize, rate: f64, poll: Duration) -> bool {
    if shared.unfinished.load(Ordering::Acquire) == 0 {
        return false;
    }
    let woken = shared.wake.notified();
    steal(shared, node, rate);
    tokio::select! {
        _ = woken => true,
        _ = tokio::time::sleep(poll) => true,
        _ = shared.cancel.cancelled() => false,
    }
}

/// The origin asked one downloader to wait `wait`: every downloader of
/// the cluster (this node's connections and every intake node's) holds
/// until then. Said once per new hold.
fn origin_asked_to_wait(shared: &Shared, wait: Duration, why: &str) {
    if shared.hold.hold(wait) {
        tracing::warn!(
            "{why}: every downloader of the cluster waits {:.1} s before asking the origin again",
            wait.as_secs_f64()
        );
    }
}

/// One of intake node `r`'s connections: takes the next part the planner
/// gives it (of a file whose URL is resolved and whose origin honours
/// Range), fetches it through the node, and puts it back on any failure.
/// The planner retires the node after repeated failures or lone "slow
/// down"s, or once it is named; the download never fails because of it.
async fn remote_worker(shared: Arc<Shared>, r: usize) {
    let remote = shared.opts.intake.remotes[r].clone();
    let takes_work = || shared.plan.lock().unwrap().takes_work(r);
    let mut rate = 0.0f64;
    loop {
        if shared.cancel.is_cancelled() || !takes_work() {
            return;
        }
        if !shared.hold.pass(&shared.cancel).await || !takes_work() {
            return;
        }
        let Some((f, i, url)) = pick_remote(&shared, r) else {
            if idle(&shared, r + 1, rate, Duration::from_millis(100)).await {
                continue;
            }
            return;
        };
        let (began, before) = (std::time::Instant::now(), part_left(&shared, f, i));
        let holding = Busy::new(&shared.busy[r + 1]);
        let outcome = tokio::select! {
            o = remote_attempt(&shared, r, f, i, url) => o,
            _ = shared.cancel.cancelled() => return,
        };
        drop(holding);
        rate = rate_of(before - part_left(&shared, f, i).min(before), began);
        let (from, to) = shared.files[f].parts.lock().unwrap().missing(i);
        if from < to {
            // Not done (a failure, a short body): back to the front.
            shared.plan.lock().unwrap().put_back((f, i));
            shared.wake.notify_waiters();
        }
        // What the node's answer was, and what the planner makes of it.
        let (answer, why, wait) = match outcome {
            Ok(()) => (Answer::Fetched, String::new(), None),
            // The origin's "slow down" to this node: every downloader
            // waits (the loop's top) when another heard it too; alone, only
            // this node waits, and it retires if it mostly says so.
            Err(Failure::Transient {
                why,
                wait: Some(wait),
            }) => {
                shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                let wait = wait.min(retry::MAX_WAIT);
                let why = format!("{}: {why}", remote.name());
                let backed = match shared.hold.heard(Heard::Intake(r), wait) {
                    hold::Verdict::HoldAll { newly } => {
                        if newly {
                            tracing::warn!(
                                "{why}: every downloader of the cluster waits {:.1} s before asking the origin again",
                                wait.as_secs_f64()
                            );
                        }
                        true
                    }
                    hold::Verdict::Spent => true,
                    hold::Verdict::OnlyIt => false,
                };
                (Answer::Busy { backed }, why, Some(wait))
            }
            Err(why) => {
                shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                (Answer::Failed, why.into_words(), None)
            }
        };
        let next = shared.plan.lock().unwrap().answered(r, answer, &why);
        match next {
            Next::Carry if answer == Answer::Fetched => {}
            Next::Carry => continue,
            Next::Retired(why) => {
                tracing::warn!(
                    "{}: {why}; it takes no more ranges, the other downloaders carry on",
                    remote.name()
                );
                return;
            }
            Next::WaitAlone => {
                let wait = wait.unwrap_or_default();
                tracing::info!(
                    "{why}; no other downloader hears it, so only this node waits {:.1} s",
                    wait.as_secs_f64()
                );
                // Its own wait, cut short when the download is over (the
                // others finished the parts).
                let until = tokio::time::Instant::now() + wait;
                loop {
                    let woken = shared.wake.notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    if shared.unfinished.load(Ordering::Acquire) == 0 {
                        break;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep_until(until) => break,
                        _ = woken => {}
                        _ = shared.cancel.cancelled() => return,
                    }
                }
                continue;
            }
            Next::Backoff(strikes) => {
                tracing::info!(
                    "{}: {why}; its range goes back to the others",
                    remote.name()
                );
                let pause = retry::backoff(strikes, None, rand::thread_rng().gen());
                tokio::time::sleep(pause).await;
                continue;
            }
        }
        let complete = shared.files[f].parts.lock().unwrap().is_complete();
        if complete {
            finish_file(&shared, f).await;
        }
    }
}

/// The part the planner gives intake node `r` next, and its file's URL:
/// only a file whose URL is resolved and whose origin honours Range.
fn pick_remote(shared: &Shared, r: usize) -> Option<(usize, usize, Url)> {
    let mut plan = shared.plan.lock().unwrap();
    let (f, i) = plan.next_remote(r, |f| {
        let st = &shared.files[f];
        !st.whole.load(Ordering::Acquire) && st.url.try_lock().is_ok_and(|u| u.is_some())
    })?;
    let url = shared.files[f].url.try_lock().ok().and_then(|u| u.clone());
    match url {
        Some(url) => Some((f, i, url)),
        None => {
            plan.put_back((f, i));
            None
        }
    }
}

/// Part `i` of file `f` (its missing rest) through intake node `r`.
async fn remote_attempt(
    shared: &Arc<Shared>,
    r: usize,
    f: usize,
    i: usize,
    url: Url,
) -> Result<(), Failure> {
    let st = &shared.files[f];
    let (from, to) = st.parts.lock().unwrap().missing(i);
    if from >= to {
        return Ok(());
    }
    let token = shared.http.token_for(&url);
    let ask = RangeAsk {
        url,
        token,
        from,
        to,
        draft_file: st.job.draft_file,
    };
    let mut body = shared.opts.intake.remotes[r].fetch(ask).await?;
    let got = Arc::new(AtomicU64::new(0));
    let cut = CancellationToken::new();
    shared.flights.lock().unwrap().insert(
        (f, i),
        Flight {
            node: r + 1,
            at: std::time::Instant::now(),
            got: got.clone(),
            to_go: to - from,
            cut: cut.clone(),
        },
    );
    let _landed = Landed(shared, (f, i));
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BUF);
    let mut offset = from;
    let mut buf_at = from;
    let result = loop {
        let piece = tokio::select! {
            p = body.recv() => p,
            // Another downloader is idle and this range is slow: stop
            // here; the rest goes back to the queue for it.
            _ = cut.cancelled() => {
                shared.plan.lock().unwrap().cut((f, i), r);
                break Ok(());
            }
        };
        let Some(piece) = piece else {
            break Ok(());
        };
        let data = match piece {
            Ok(d) => d,
            Err(why) => break Err(Failure::Transient { why, wait: None }),
        };
        if offset + data.len() as u64 > to {
            break Err(Failure::Transient {
                why: "sent more bytes than asked for".into(),
                wait: None,
            });
        }
        if buf.is_empty() {
            buf_at = offset;
        }
        offset += data.len() as u64;
        shared
            .stats
            .downloaded
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        shared.remote_bytes[r].fetch_add(data.len() as u64, Ordering::Relaxed);
        got.fetch_add(data.len() as u64, Ordering::Relaxed);
        buf.extend_from_slice(&data);
        if buf.len() >= WRITE_BUF {
            flush(shared, f, i, false, &mut buf, buf_at)?;
        }
    };
    flush(shared, f, i, false, &mut buf, buf_at)?;
    if offset > from {
        st.remote_spans.lock().unwrap().push((from, offset, r));
    }
    result?;
    if offset < to && !cut.is_cancelled() {
        return Err(Failure::Transient {
            why: format!(
                "the range of {} ended at byte {offset} of {to}",
                st.job.path
            ),
            wait: None,
        });
    }
    Ok(())
}

/// An intake node's range in flight.
struct Flight {
    /// The intake node's downloader index (`r + 1`).
    node: usize,
    at: std::time::Instant,
    /// Bytes it brought so far.
    got: Arc<AtomicU64>,
    /// Bytes it was asked for.
    to_go: u64,
    /// Stops it where it is.
    cut: CancellationToken,
}

/// Removes a flight when its attempt ends, however.
struct Landed<'a>(&'a Shared, (usize, usize));

impl Drop for Landed<'_> {
    fn drop(&mut self) {
        self.0.flights.lock().unwrap().remove(&self.1);
    }
}

/// Counts a connection holding a part while it lives.
struct Busy<'a>(&'a AtomicUsize);

impl<'a> Busy<'a> {
    fn new(count: &'a AtomicUsize) -> Busy<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        Busy(count)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Bytes part `i` of file `f` still misses.
fn part_left(shared: &Shared, f: usize, i: usize) -> u64 {
    let (from, to) = shared.files[f].parts.lock().unwrap().missing(i);
    to.saturating_sub(from)
}

/// Bytes per second of `bytes` since `began`.
fn rate_of(bytes: u64, began: std::time::Instant) -> f64 {
    bytes as f64 / began.elapsed().as_secs_f64().max(1e-3)
}

/// Work stealing for an idle downloader of `node` whose last part went at
/// `rate` bytes/s: the intake ranges in flight, as they stand, weighed by
/// [`striping::victim`]; the one it picks is cut where it is, and its rest
/// goes back to the queue (not to the node it was cut from). One cut per
/// call.
fn steal(shared: &Shared, node: usize, rate: f64) {
    let connections = match node {
        THIS_NODE => shared.opts.connections,
        _ => shared.opts.intake.connections,
    };
    let thief = Thief {
        node,
        rate,
        busy: shared.busy[node].load(Ordering::Acquire),
        connections,
    };
    let flights = shared.flights.lock().unwrap();
    let open: Vec<&Flight> = flights.values().filter(|f| !f.cut.is_cancelled()).collect();
    let seen: Vec<InFlight> = open
        .iter()
        .map(|f| InFlight {
            node: f.node,
            secs: f.at.elapsed().as_secs_f64(),
            got: f.got.load(Ordering::Relaxed),
            to_go: f.to_go,
        })
        .collect();
    if let Some(v) = striping::victim(&thief, &seen) {
        open[v].cut.cancel();
    }
}

/// Who fetched what: this node's own connections, then each intake node.
fn shares(shared: &Shared) -> Vec<IntakeShare> {
    let remote: u64 = shared
        .remote_bytes
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .sum();
    let plan = shared.plan.lock().unwrap();
    let mut out = vec![IntakeShare {
        node: "this node".into(),
        bytes: shared
            .stats
            .downloaded
            .load(Ordering::Relaxed)
            .saturating_sub(remote),
        blamed: false,
        retired: None,
    }];
    for (r, remote) in shared.opts.intake.remotes.iter().enumerate() {
        out.push(IntakeShare {
            node: remote.name().to_string(),
            bytes: shared.remote_bytes[r].load(Ordering::Relaxed),
            blamed: plan.blamed(r),
            retired: plan.retired(r).map(str::to_string),
        });
    }
    out
}

/// Verifies and places file `f` once its bytes are all written (exactly once
/// per download of it).
async fn finish_file(shared: &Arc<Shared>, f: usize) {
    let st = &shared.files[f];
    if st.finishing.swap(true, Ordering::AcqRel) {
        return;
    }
    // The sidecar now says "complete": if we die while verifying, the re-run
    // verifies again instead of downloading again.
    st.dirty.store(true, Ordering::Release);
    let s = shared.clone();
    let _ = tokio::task::spawn_blocking(move || save_sidecars(&s)).await;
    let s = shared.clone();
    let verdict = tokio::task::spawn_blocking(move || {
        let st = &s.files[f];
        // Only the bytes after the last catch-up are left to hash.
        let digest = {
            let mut t = st.trail.lock().unwrap();
            if let Err(e) = catch_up(&s, f, &mut t, st.job.size) {
                let why = format!("cannot read back {}: {e}", st.job.incomplete.display());
                return (Verdict::Fatal(why), Vec::new());
            }
            // `finishing` keeps catch-ups off the fresh trail until the
            // download starts over (or for good, once placed).
            std::mem::replace(&mut *t, st.fresh_trail())
                .digest
                .finish(&st.job.incomplete)
        };
        // The origin's second answer for ranges intake nodes sent first:
        // read before the file is placed (moved) below.
        let asked: Vec<_> = st
            .suspects
            .lock()
            .unwrap()
            .iter()
            .map(|&(from, to, r, _)| (from, to, r))
            .collect();
        let second = hash_spans(st, asked);
        let verdict = s.finisher.finish(f, &st.job, digest);
        let spans = std::mem::take(&mut *st.remote_spans.lock().unwrap());
        if matches!(verdict, Verdict::Mismatch(_)) && !spans.is_empty() {
            // Keep what the intake nodes sent, to compare with the origin's
            // bytes once this node fetched the file again alone.
            let first = hash_spans(st, spans);
            *st.suspects.lock().unwrap() = first;
            s.plan.lock().unwrap().local_only(f);
        }
        (verdict, second)
    })
    .await
    .unwrap_or_else(|e| {
        (
            Verdict::Fatal(format!("verifying crashed: {e}")),
            Vec::new(),
        )
    });
    let (verdict, second) = verdict;
    if matches!(verdict, Verdict::Placed) {
        blame(shared, f, &second);
    }
    match verdict {
        Verdict::Placed => {
            shared.watch.finished(f, true);
            {
                let _io = st.sidecar_io.lock().unwrap();
                st.placed.store(true, Ordering::Release);
                let _ = std::fs::remove_file(&st.job.sidecar);
            }
            if shared.unfinished.fetch_sub(1, Ordering::AcqRel) == 1 {
                shared.wake.notify_waiters();
            }
        }
        Verdict::Mismatch(why) if st.mismatches.fetch_add(1, Ordering::AcqRel) == 0 => {
            tracing::warn!("{why}; downloading {} once more", st.job.path);
            shared.stats.redownloads.fetch_add(1, Ordering::Relaxed);
            shared.watch.finished(f, false);
            let n = {
                let mut p = st.parts.lock().unwrap();
                p.reset();
                p.len()
            };
            // The trail is fresh since the finish; catch-ups resume once
            // `finishing` is off, and see the reset prefix.
            st.streaming.store(false, Ordering::Release);
            st.finishing.store(false, Ordering::SeqCst);
            st.dirty.store(true, Ordering::Release);
            shared.plan.lock().unwrap().redo(f, n);
            shared.wake.notify_waiters();
        }
        Verdict::Mismatch(why) => fail(
            shared,
            DownloadError::Failed(format!(
                "{why}, again after downloading it a second time: the server is serving corrupt data; \
                 report it to the mirror's operator or try another HF_ENDPOINT"
            )),
        ),
        Verdict::Fatal(why) => fail(shared, DownloadError::Failed(why)),
    }
}

/// A span of a file written by intake node `.2`, with the BLAKE3 of its
/// bytes (`None`: unreadable, which blames no one).
type Span = (u64, u64, usize, Option<blake3::Hash>);

/// Each span `(from, to, node)` of file `st` with the BLAKE3 of its bytes
/// as they are in the incomplete file now.
fn hash_spans(st: &FileState, spans: Vec<(u64, u64, usize)>) -> Vec<Span> {
    if spans.is_empty() {
        return Vec::new();
    }
    let mut buf = vec![0u8; HASH_BUF];
    let mut one = |from: u64, to: u64| {
        let mut h = blake3::Hasher::new();
        let mut at = from;
        while at < to {
            let n = ((to - at) as usize).min(buf.len());
            st.file.read_exact_at(&mut buf[..n], at).ok()?;
            h.update(&buf[..n]);
            at += n as u64;
        }
        Some(h.finalize())
    };
    spans
        .into_iter()
        .map(|(from, to, r)| (from, to, r, one(from, to)))
        .collect()
}

/// Names the intake nodes whose ranges of file `f` differ from the bytes
/// the origin sent this node when it fetched the file again alone (`now`,
/// which verified), and gives them no more work.
fn blame(shared: &Shared, f: usize, now: &[Span]) {
    let st = &shared.files[f];
    let first = std::mem::take(&mut *st.suspects.lock().unwrap());
    for ((from, to, r, sent), (_, _, _, origin)) in first.iter().zip(now) {
        let differs = matches!((sent, origin), (Some(a), Some(b)) if a != b);
        if differs && shared.plan.lock().unwrap().blame(*r) {
            tracing::warn!(
                "{} sent bytes {from}..{to} of {} that differ from the origin's: it gets no more ranges; check that node (its disk, memory or proxy)",
                shared.opts.intake.remotes[*r].name(),
                st.job.path
            );
        }
    }
}

/// Fails when the size a server gives for file `f` is not the listing's.
fn check_size(st: &FileState, said: Option<u64>) -> Result<(), Failure> {
    match said {
        Some(size) if size != st.job.size => Err(Failure::Fatal(format!(
            "the server says {} has {size} bytes but the file listing said {}; the repository changed while pulling: run again",
            st.job.path, st.job.size
        ))),
        _ => Ok(()),
    }
}

/// Brings part `i` of file `f` to completion, retrying transient failures
/// (the retry count restarts whenever bytes arrive).
async fn fetch_part(shared: &Arc<Shared>, f: usize, i: usize) -> Result<(), DownloadError> {
    let st = &shared.files[f];
    let mut tries = 0u32;
    loop {
        if shared.cancel.is_cancelled() {
            return Ok(());
        }
        let (from, to, complete) = {
            let p = st.parts.lock().unwrap();
            let (from, to) = p.missing(i);
            (from, to, p.is_complete())
        };
        if st.whole.load(Ordering::Acquire) {
            // One stream carries the whole file: keep it going until the
            // file is complete, unless another connection carries it now.
            if complete || st.streaming.load(Ordering::Acquire) {
                return Ok(());
            }
        } else if from >= to {
            return Ok(());
        }
        if !shared.hold.pass(&shared.cancel).await {
            return Ok(());
        }
        let before = shared.stats.downloaded.load(Ordering::Relaxed);
        let outcome = tokio::select! {
            r = attempt(shared, f, i, from, to) => r,
            _ = shared.cancel.cancelled() => return Ok(()),
        };
        match outcome {
            Ok(()) => continue,
            Err(Failure::Refused { status, why }) => {
                return Err(DownloadError::Refused { status, why })
            }
            Err(Failure::Fatal(why)) => return Err(DownloadError::Failed(why)),
            Err(Failure::Transient { why, wait }) => {
                if shared.stats.downloaded.load(Ordering::Relaxed) > before {
                    tries = 0;
                }
                tries += 1;
                shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                if tries >= retry::MAX_TRIES {
                    return Err(DownloadError::GaveUp {
                        file: st.job.path.clone(),
                        why,
                        tries,
                    });
                }
                let pause = retry::backoff(tries, wait, rand::thread_rng().gen());
                if wait.is_some() {
                    origin_asked_to_wait(shared, pause, &why);
                }
                tracing::info!("{}: {why}; retrying in {pause:.1?}", st.job.path);
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// One request for `[from, to)` of part `i`, streamed to disk.
async fn attempt(
    shared: &Arc<Shared>,
    f: usize,
    i: usize,
    from: u64,
    to: u64,
) -> Result<(), Failure> {
    let st = &shared.files[f];
    // The file's first request also finds where its bytes are (no HEAD):
    // the others wait for it, then go straight there.
    let mut slot = Some(st.url.lock().await);
    let stored = slot.as_ref().and_then(|s| (**s).clone());
    if stored.is_some() {
        slot = None;
    }
    let resolve_url = parse_url(&st.job.url);
    let host = host_of(stored.as_ref().unwrap_or(&resolve_url));
    let mut probe = None;
    if !st.whole.load(Ordering::Acquire) {
        match shared.ranges.ask(&host).await {
            Ask::Part => {}
            Ask::Probe(p) => probe = Some(p),
            Ask::Whole => mark_whole(shared, f, &host),
        }
    }
    let whole = st.whole.load(Ordering::Acquire);
    // One whole-file stream per file: claim it before asking, so the other
    // connections do not each make the server send the whole file.
    let mut claim = None;
    if whole {
        if st.streaming.swap(true, Ordering::AcqRel) {
            return Ok(()); // another connection streams it
        }
        claim = Some(Claim(&st.streaming));
    }
    let range = (!whole).then_some((from, to));
    let (repo, path) = (&shared.opts.repo, &st.job.path);
    let sent = match &stored {
        Some(url) => shared
            .http
            .get_bytes(url, range, repo, path)
            .await
            .map(|r| (url.clone(), r, None)),
        None => {
            shared
                .http
                .get_resolving(&st.job.url, range, repo, path)
                .await
        }
    };
    let (url, mut resp, linked) = match sent {
        Ok(r) => r,
        Err(Failure::Fatal(why) | Failure::Refused { why, .. })
            if stored
                .as_ref()
                .is_some_and(|u| host_of(u) != host_of(&resolve_url)) =>
        {
            // A presigned CDN URL can expire mid-pull: resolve afresh once.
            *st.url.lock().await = None;
            return Err(Failure::Transient {
                why: format!("the CDN refused a stored URL ({why})"),
                wait: None,
            });
        }
        Err(e) => return Err(e),
    };
    if let Some(mut guard) = slot.take() {
        check_size(st, linked.or_else(|| total_size(&resp)))?;
        *guard = Some(url.clone());
        drop(guard);
        // Intake nodes wait for a file's URL before they take its parts.
        if !shared.opts.intake.remotes.is_empty() {
            shared.wake.notify_waiters();
        }
    }
    if let Some(p) = probe.take() {
        p.learnt(resp.status() == StatusCode::PARTIAL_CONTENT);
    }
    let mut offset = if resp.status() == StatusCode::PARTIAL_CONTENT {
        let start = content_range_start(resp.headers());
        if start != Some(from) {
            return Err(Failure::Transient {
                why: format!(
                    "{} answered bytes from {start:?} when asked for {from}",
                    host_of(&url)
                ),
                wait: None,
            });
        }
        from
    } else {
        // The whole body from byte 0: this connection streams the file.
        if claim.is_none() {
            if st.streaming.swap(true, Ordering::AcqRel) {
                return Ok(()); // another connection already does
            }
            claim = Some(Claim(&st.streaming));
        }
        mark_whole(shared, f, &host);
        0
    };
    let streaming =
        offset == 0 && st.whole.load(Ordering::Acquire) && resp.status() == StatusCode::OK;
    let result = async {
        let end = if streaming { st.job.size } else { to };
        // Bytes a whole-file stream repeats are already on disk.
        let skip_until = if streaming {
            st.parts.lock().unwrap().prefix()
        } else {
            0
        };
        // Network chunks are small; gather them so the disk sees one write
        // per WRITE_BUF, not one per chunk.
        let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BUF);
        let mut buf_at = offset;
        loop {
            let chunk = match resp.chunk().await {
                Ok(c) => c,
                Err(e) => {
                    // Keep what did arrive: the retry starts after it.
                    flush(shared, f, i, streaming, &mut buf, buf_at)?;
                    return Err(Failure::Transient {
                        why: format!("{}: body cut short: {}", host_of(&url), error_chain(&e)),
                        wait: None,
                    });
                }
            };
            let Some(data) = chunk else { break };
            if offset + data.len() as u64 > end {
                if !streaming {
                    return Err(Failure::Transient {
                        why: format!("{} sent more bytes than asked for", host_of(&url)),
                        wait: None,
                    });
                }
                return Err(Failure::Fatal(format!(
                    "{} is longer than the {} bytes the listing says; the repository changed while pulling: run again",
                    st.job.path, st.job.size
                )));
            }
            let start = offset;
            offset += data.len() as u64;
            shared
                .stats
                .downloaded
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            let keep_from = skip_until.saturating_sub(start).min(data.len() as u64) as usize;
            if keep_from == data.len() {
                continue;
            }
            if buf.is_empty() {
                buf_at = start + keep_from as u64;
            }
            buf.extend_from_slice(&data[keep_from..]);
            if buf.len() >= WRITE_BUF {
                flush(shared, f, i, streaming, &mut buf, buf_at)?;
            }
        }
        flush(shared, f, i, streaming, &mut buf, buf_at)?;
        if offset < end {
            return Err(Failure::Transient {
                why: format!(
                    "{}: body of {} ended at byte {offset} of {end}",
                    host_of(&url),
                    st.job.path
                ),
                wait: None,
            });
        }
        Ok(())
    }
    .await;
    drop(claim);
    result
}

/// Releases a file's whole-file stream when its request ends, however.
struct Claim<'a>(&'a AtomicBool);

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// File `f` comes from `host`, which ignores Range: one stream from now on.
fn mark_whole(shared: &Shared, f: usize, host: &str) {
    let st = &shared.files[f];
    if !st.whole.swap(true, Ordering::AcqRel) {
        shared.stats.whole_streams.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            "{host} ignores Range requests; downloading {} as one stream",
            st.job.path
        );
    }
}

/// Bytes gathered from the network before one positioned write.
const WRITE_BUF: usize = 1 << 20;

/// Writes `buf` (the file's bytes from `at`) and only then records them as
/// written in part `i` (or the whole-file prefix), so the sidecar never
/// counts a byte that is not in the file.
fn flush(
    shared: &Arc<Shared>,
    f: usize,
    i: usize,
    streaming: bool,
    buf: &mut Vec<u8>,
    at: u64,
) -> Result<(), Failure> {
    if buf.is_empty() {
        return Ok(());
    }
    let st = &shared.files[f];
    st.file
        .write_all_at(buf, at)
        .map_err(|e| Failure::Fatal(disk_error(&st.job.incomplete, st.job.size, e).to_string()))?;
    let upto = at + buf.len() as u64;
    let ahead = {
        let mut p = st.parts.lock().unwrap();
        if streaming {
            p.advance_prefix(upto);
            None
        } else {
            let start = p.start(i);
            p.advance(i, upto - start);
            // A part past the written prefix: the in-order pass reaches it
            // only when every part before it is done.
            (p.prefix() < start).then_some(start)
        }
    };
    st.dirty.store(true, Ordering::Release);
    shared.watch.written(f, buf.len() as u64);
    buf.clear();
    if let (Some(start), Some(cs)) = (ahead, st.job.chunk_size) {
        announce_landed(shared, f, start, at, upto, cs);
    }
    hash_behind(shared, f);
    Ok(())
}

/// Announces the chunks of file `f` that the write `[from, upto)` of the
/// part starting at `part_start` completed, ahead of the in-order pass
/// (which needs every byte before them, and so would hold a fan-out back
/// by up to a whole part's download): each is read back from the page
/// cache and hashed now. Only for parts that start on a chunk boundary;
/// the in-order pass still covers every chunk, for the sealed manifest.
fn announce_landed(shared: &Shared, f: usize, part_start: u64, from: u64, upto: u64, cs: u64) {
    let st = &shared.files[f];
    if part_start % cs != 0 {
        return;
    }
    let size = st.job.size;
    let count = xfer_proto::hash::chunk_count(size, cs);
    let mut k = from.max(part_start) / cs;
    let mut buf = Vec::new();
    while k < count && k * cs < upto {
        let (start, end) = (k * cs, ((k + 1) * cs).min(size));
        if start >= part_start && end <= upto && end > from {
            buf.resize((end - start) as usize, 0);
            // A read that fails is only a lost head start.
            if st.file.read_exact_at(&mut buf, start).is_ok() {
                let h = xfer_proto::hash::hash_chunk(&buf, k, count, cs);
                // Announced means kept by the agents: a re-run must resume it.
                save_sidecar(st);
                shared.watch.hashed(f, k as u32, &[h]);
            }
        }
        k += 1;
    }
}

/// Feeds file `f`'s trail up to byte `upto`, starts the writeback of what
/// it fed, and tells the watch the chunk hashes it completed (in order: the
/// caller holds the trail's lock).
fn catch_up(shared: &Shared, f: usize, t: &mut Trail, upto: u64) -> std::io::Result<()> {
    let st = &shared.files[f];
    let from = t.digest.at();
    if upto > from && t.buf.is_empty() {
        t.buf = vec![0u8; HASH_BUF];
    }
    let fed = digest::feed_from(&mut t.digest, &st.file, upto, &mut t.buf);
    start_writeback(&st.file, from, t.digest.at());
    let done = t.digest.chunks_done();
    if done.len() > t.announced {
        // What a fan-out is told of, a re-run after a crash resumes from:
        // the agents keep those chunks, so the download must not redo them.
        save_sidecar(st);
        shared
            .watch
            .hashed(f, t.announced as u32, &done[t.announced..]);
        t.announced = done.len();
    }
    if t.digest.at() == st.job.size {
        t.buf = Vec::new();
    }
    fed
}

/// Starts writing `[from, to)` of `file` to disk without waiting, so the
/// fsync before the file is placed has little left to do.
fn start_writeback(file: &File, from: u64, to: u64) {
    if to > from {
        // SAFETY: a hint on an fd we own; failure only loses the head start.
        unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                from as libc::off64_t,
                (to - from) as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }
}

/// Bytes read back per step when hashing.
const HASH_BUF: usize = 1 << 20;

/// Makes sure a task feeds file `f`'s written prefix to its digest: starts
/// one unless one runs (which looks again before it stops, so no write is
/// missed).
fn hash_behind(shared: &Arc<Shared>, f: usize) {
    let st = &shared.files[f];
    if st.hashing.swap(true, Ordering::SeqCst) {
        return;
    }
    let s = shared.clone();
    tokio::task::spawn_blocking(move || {
        let st = &s.files[f];
        loop {
            {
                // Checked under the trail's lock, as the finish and the
                // restart change it: never feed a finished or fresh trail
                // the bytes of a download that is over.
                let mut t = st.trail.lock().unwrap();
                if !st.finishing.load(Ordering::SeqCst) {
                    let upto = st.parts.lock().unwrap().prefix();
                    // An error here is met again, and reported, when the
                    // file is finished.
                    let _ = catch_up(&s, f, &mut t, upto);
                }
            }
            st.hashing.store(false, Ordering::SeqCst);
            let behind = {
                let t = st.trail.lock().unwrap();
                !st.finishing.load(Ordering::SeqCst)
                    && st.parts.lock().unwrap().prefix() > t.digest.at()
            };
            if !behind || st.hashing.swap(true, Ordering::SeqCst) {
                return;
            }
        }
    });
}

fn parse_url(s: &str) -> Url {
    Url::parse(s).expect("resolve URLs are built from a parsed endpoint")
}

/// The first byte of a `Content-Range: bytes a-b/total` header.
/// The file's whole size as a reply states it: the total of a
/// `Content-Range`, or the length of a `200`.
fn total_size(resp: &reqwest::Response) -> Option<u64> {
    let h = resp.headers();
    if resp.status() == StatusCode::PARTIAL_CONTENT {
        let v = h.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
        v.rsplit_once('/')?.1.trim().parse().ok()
    } else {
        h.get(reqwest::header::CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    }
}

fn content_range_start(h: &reqwest::header::HeaderMap) -> Option<u64> {
    let v = h.get(reqwest::header::CONTENT_RANGE)?.to_str().ok()?;
    v.trim()
        .strip_prefix("bytes ")?
        .split_once('-')?
        .0
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(content_range_start(&h), None);
        h.insert(
            reqwest::header::CONTENT_RANGE,
            "bytes 100-199/1000".parse().unwrap(),
        );
        assert_eq!(content_range_start(&h), Some(100));
    }
}
