//! `xfer pull`: a Hub repository (or a mirror's, via `HF_ENDPOINT`) into
//! the `huggingface_hub` cache, once, verified.
//!
//! The revision is resolved to a commit, the tree listed (all pages), the
//! files filtered by `--include`/`--exclude`, the disk checked, then
//! [`hub::download`] fetches them over parallel ranged connections. Each
//! file is checked against the Hub's sha256 or git sha1 before it is renamed
//! into `blobs/` (or into `--local-dir`) and linked from the snapshot; the
//! ref is written last, so an offline reader never sees a ref to a snapshot
//! we did not finish. With `--to`, `flow::pull_fanout` pushes the files
//! to agents while the rest download.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::util::chain::Chain;
use crate::util::permanence::Permanence;
use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};

use crate::hub::announce::{self, Announcer, DraftPaths, DraftUpdate, OnDraft};
use crate::hub::api::{
    next_page, parse_tree_page_counted, ListingBudget, RemoteFile, RevisionInfo, MAX_PAGE_BYTES,
};
use crate::hub::cache::RepoCache;
use crate::hub::digest::{Digest, Digester, Expected};
use crate::hub::download::{self, FileJob, Finisher, Stats, Verdict, Watch};
use crate::hub::env::HubEnv;
use crate::hub::http::HubHttp;
use crate::hub::{leftovers, tree_cache};
use crate::util::beneath::{create_dir_all_durable, rename_durable, write_file_durable};
use crate::util::progress::Progress;
use xfer_proto::draft::Draft;
use xfer_proto::hash::Hash;
use xfer_proto::manifest::ChunkSize;
use xfer_proto::relpath::RelPath;
use xfer_proto::repo::RepoRef;
use xfer_proto::units::Bytes;

/// What to pull, and how.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// The repo and revision, parsed once by the caller.
    pub repo: RepoRef,
    /// Glob patterns: pull only the files matching one (empty: all).
    pub include: Vec<String>,
    /// Glob patterns: skip the files matching one.
    pub exclude: Vec<String>,
    /// Write `<dir>/<path>` instead of the cache layout.
    pub local_dir: Option<PathBuf>,
    /// HTTP connections at once.
    pub connections: usize,
    /// Bytes per ranged request.
    pub part_size: u64,
    /// Also compute each file's BLAKE3 chunk hashes at this chunk size, in
    /// the same pass as its Hub hash (for a fan-out, which sends them);
    /// auto picks it from the listed files' size
    /// ([`PullSummary::chunk_size`] says which).
    pub chunk_size: Option<ChunkSize>,
    /// Other nodes that fetch ranges from the origin over their own links
    /// (striped intake, issue 36); empty: this node alone.
    pub intake: super::intake::Intake,
    /// Told before the pull first changes what the repo's folder holds
    /// (a blob placed, a link added or changed, the listing or a ref
    /// rewritten); `None`: nobody asks.
    pub before_change: Option<BeforeChange>,
    /// The download's counters, for a caller that reads them while the
    /// pull runs or after it failed (a sync job's progress); `None`: the
    /// pull's own.
    pub stats: Option<Arc<Stats>>,
    /// The commit to pull the revision at, whatever it names now: the
    /// files are listed and fetched at it, and `refs/<revision>` is
    /// written to it (`None`: the commit the revision names now).
    pub pin: Option<String>,
}

/// Called before a pull changes what the repo's folder holds; an error
/// stops the pull before the change. A Hub job's source marks the model's
/// record `replacing` here, so a pull that finds everything in place (the
/// same revision again) or fails before it places a file leaves a
/// complete model complete. Called again at each change: make it
/// idempotent.
#[derive(Clone)]
pub struct BeforeChange(pub Arc<dyn Fn() -> std::io::Result<()> + Send + Sync>);

impl std::fmt::Debug for BeforeChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeChange")
    }
}

impl BeforeChange {
    fn call(hook: &Option<BeforeChange>) -> std::io::Result<()> {
        match hook {
            Some(h) => (h.0)(),
            None => Ok(()),
        }
    }
}

/// The `--json` summary (read back by the integration tests).
#[derive(Debug, Serialize, Deserialize, Default)]
pub struct PullSummary {
    /// The repo's id, `ORG/NAME`.
    pub repo: String,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    /// The Hub pulled from.
    pub endpoint: String,
    /// The snapshot folder (or the local dir): what to hand to vLLM.
    pub path: String,
    /// The repository's cache folder (`models--org--name`); empty with
    /// `--local-dir`.
    pub repo_dir: String,
    /// Files in the snapshot.
    pub files: usize,
    /// Bytes in the snapshot.
    pub bytes_total: u64,
    /// Bytes fetched over HTTP in this run (re-downloads included).
    pub bytes_downloaded: u64,
    /// Bytes an interrupted earlier run had written and this one kept.
    pub bytes_resumed: u64,
    /// Bytes of files already in the cache, not fetched again.
    pub bytes_present: u64,
    /// How the files were checked.
    pub verification: Verification,
    /// Requests tried again after a transient failure.
    pub retries: u64,
    /// Files whose server ignored Range and were fetched as one stream.
    pub whole_streams: u64,
    /// HTTP connections used.
    pub connections: usize,
    /// `trees/<commit>.json`, relative to the repo folder (or local dir).
    pub tree_cache: String,
    /// Incomplete files of earlier revisions removed after this pull.
    pub stale_removed: usize,
    /// Wall time of the pull, in seconds.
    pub duration_s: f64,
    /// Downloaded bytes per second over the whole run, in MB/s.
    pub rate_mb_s: f64,
    /// The chunk size the files were hashed at, when asked to
    /// ([`PullOptions::chunk_size`]).
    #[serde(default)]
    pub chunk_size: Option<u64>,
    /// With striped intake: what each downloader fetched from the origin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub intake: Vec<super::intake::IntakeShare>,
    /// Files found in place by name and size and not hashed by this pull
    /// (relative to the repo folder or local dir): a caller that must know
    /// their bytes are the Hub's checks these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhashed: Vec<RelPath>,
}

/// How every file was checked.
#[derive(Debug, Serialize, Deserialize, Default)]
pub struct Verification {
    /// Files whose sha256 (LFS) matched the Hub's `lfs.oid`.
    pub sha256_ok: usize,
    /// Files whose git blob sha1 matched the Hub's `oid`.
    pub git_sha1_ok: usize,
    /// Files already in the cache under their hash name (size checked).
    pub present: usize,
    /// Files that failed their check once and passed after a re-download.
    pub recovered: u64,
    /// True when every file in the summary was checked or already present.
    pub all_verified: bool,
}

/// Where each kind of file goes: the cache layout or a plain folder.
#[derive(Clone)]
enum Layout {
    Cache { cache: RepoCache, commit: String },
    LocalDir { dir: PathBuf, commit: String },
}

impl Layout {
    fn final_path(&self, f: &RemoteFile) -> PathBuf {
        match self {
            Layout::Cache { cache, .. } => cache.blob(f.expected.etag()),
            Layout::LocalDir { dir, .. } => f.path.under(dir),
        }
    }

    /// Every path a placed file shows up at.
    fn visible(&self, f: &RemoteFile) -> Vec<PathBuf> {
        match self {
            Layout::Cache { cache, commit } => {
                vec![self.final_path(f), f.path.under(&cache.snapshot(commit))]
            }
            Layout::LocalDir { .. } => vec![self.final_path(f)],
        }
    }

    /// The symlink a receiver of the streamed draft places for `f` (path
    /// and target, relative to [`Self::root`]): in the cache, its name in
    /// the snapshot, leading to its blob.
    fn draft_link(&self, f: &RemoteFile) -> Result<Option<(RelPath, String)>> {
        match self {
            Layout::Cache { commit, .. } => {
                let path = RelPath::new(&format!("snapshots/{commit}/{}", f.path))
                    .map_err(anyhow::Error::msg)?;
                let target = crate::hub::cache::link_target(&f.path, f.expected.etag());
                Ok(Some((path, target)))
            }
            Layout::LocalDir { .. } => Ok(None),
        }
    }

    fn meta_dir(&self, dir: &Path) -> PathBuf {
        dir.join(".cache/huggingface/download")
    }

    /// The folder the pull writes into: the repo's cache folder, or the dir.
    /// Where `f`'s contents go, relative to [`Self::root`].
    fn content_rel(&self, f: &RemoteFile) -> Result<RelPath> {
        let path = self.final_path(f);
        let rel = path
            .strip_prefix(self.root())
            .ok()
            .and_then(|p| p.to_str())
            .and_then(|p| RelPath::new(p).ok());
        rel.with_context(|| {
            format!(
                "{} is not a path inside {}",
                path.display(),
                self.root().display()
            )
        })
    }

    fn root(&self) -> &Path {
        match self {
            Layout::Cache { cache, .. } => cache.dir(),
            Layout::LocalDir { dir, .. } => dir,
        }
    }

    /// Where `huggingface_hub` keeps `trees/<commit>.json`.
    fn tree_folder(&self) -> PathBuf {
        match self {
            Layout::Cache { cache, .. } => cache.dir().to_path_buf(),
            Layout::LocalDir { dir, .. } => dir.join(".cache/huggingface"),
        }
    }

    /// Where incomplete files and their sidecars live.
    fn incomplete_dir(&self) -> PathBuf {
        match self {
            Layout::Cache { cache, .. } => cache.dir().join("blobs"),
            Layout::LocalDir { dir, .. } => self.meta_dir(dir),
        }
    }

    fn incomplete(&self, f: &RemoteFile) -> (PathBuf, PathBuf) {
        let etag = f.expected.etag();
        let base = match self {
            Layout::Cache { cache, .. } => cache.incomplete_blob(etag, "xfer"),
            Layout::LocalDir { dir, .. } => {
                let m = f.path.under(&self.meta_dir(dir));
                m.with_file_name(format!(
                    "{}.{etag}.xfer.incomplete",
                    m.file_name().and_then(|n| n.to_str()).unwrap_or("file")
                ))
            }
        };
        let sidecar = base.with_extension("parts");
        (base, sidecar)
    }

    /// Whether `f` is already in place, so it need not be fetched.
    fn present(&self, f: &RemoteFile) -> bool {
        let size_ok =
            |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() == f.size);
        match self {
            Layout::Cache { .. } => size_ok(&self.final_path(f)),
            Layout::LocalDir { dir, .. } => {
                let meta = f.path.under(&self.meta_dir(dir));
                let meta = meta.with_file_name(format!(
                    "{}.metadata",
                    meta.file_name().and_then(|n| n.to_str()).unwrap_or("file")
                ));
                let etag_ok = std::fs::read_to_string(meta)
                    .ok()
                    .is_some_and(|m| m.lines().nth(1) == Some(f.expected.etag()));
                etag_ok && size_ok(&self.final_path(f))
            }
        }
    }

    /// Makes a verified file visible: the blob and its snapshot link, or
    /// the file and its `.metadata`.
    fn place(&self, f: &RemoteFile, incomplete: &Path) -> std::io::Result<()> {
        let fin = self.final_path(f);
        if let Some(parent) = fin.parent() {
            create_dir_all_durable(parent)?;
        }
        std::fs::File::open(incomplete)?.sync_all()?;
        rename_durable(incomplete, &fin)?;
        self.link(f)
    }

    /// Whether `f`'s link (or `.metadata`) is already what [`Self::link`]
    /// would write, so a pull of what is in place changes nothing.
    fn linked(&self, f: &RemoteFile) -> bool {
        match self {
            Layout::Cache { cache, commit } => {
                let at = f.path.under(&cache.snapshot(commit));
                std::fs::read_link(at).is_ok_and(|t| {
                    t == Path::new(&crate::hub::cache::link_target(&f.path, f.expected.etag()))
                })
            }
            // `present` read the same `.metadata` (commit aside: a new
            // commit with the same file keeps the old line).
            Layout::LocalDir { .. } => self.present(f),
        }
    }

    /// The part of placing that does not move bytes (also done for files
    /// already present).
    fn link(&self, f: &RemoteFile) -> std::io::Result<()> {
        match self {
            Layout::Cache { cache, commit } => {
                cache.link(commit, &f.path, f.expected.etag()).map(|_| ())
            }
            Layout::LocalDir { dir, commit } => {
                let meta = f.path.under(&self.meta_dir(dir));
                let meta = meta.with_file_name(format!(
                    "{}.metadata",
                    meta.file_name().and_then(|n| n.to_str()).unwrap_or("file")
                ));
                let now = crate::util::clock::since_epoch().as_secs_f64();
                // Durably, after the file itself: a `.metadata` never
                // survives a power cut that its file did not.
                let text = format!("{commit}\n{}\n{now}\n", f.expected.etag());
                write_file_durable(&meta, text.as_bytes(), 0o644)
            }
        }
    }
}

/// Lists, downloads, verifies and places `opts.repo`. `on_placed` is told of
/// every file as soon as it is in place (for fan-out while downloading).
pub async fn pull(
    opts: &PullOptions,
    env: &HubEnv,
    progress: &Progress,
    on_placed: Option<OnPlaced>,
    on_draft: Option<OnDraft>,
) -> Result<(PullSummary, Vec<RemoteFile>)> {
    let started = Instant::now();
    let repo = &opts.repo;
    let filter = Filter::new(&opts.include, &opts.exclude)?;
    let http = HubHttp::new(env)?;
    let ep = &env.endpoint;

    // A pinned pull lists the commit itself; the ref it writes is still
    // the revision's.
    let at = match &opts.pin {
        Some(c) => RepoRef {
            revision: c.clone(),
            ..repo.clone()
        },
        None => repo.clone(),
    };
    let (commit, all_files) = listing(&http, &at, ep).await?;
    if let Some(pin) = opts.pin.as_ref().filter(|p| **p != commit) {
        bail!(
            "{} at the pinned commit {pin} answered with commit {commit}; the Hub or mirror does not serve that commit: run the command again to resolve {} afresh",
            repo.id,
            repo.revision
        );
    }
    let files = all_files.clone();
    let listed = files.len();
    let files: Vec<RemoteFile> = files
        .into_iter()
        .filter(|f| filter.wants(&f.path))
        .collect();
    if files.is_empty() {
        bail!(
            "{} lists {listed} files at {} and none match --include/--exclude; check the patterns",
            repo.id,
            &commit[..12]
        );
    }

    let layout = match &opts.local_dir {
        Some(dir) => Layout::LocalDir {
            dir: dir.clone(),
            commit: commit.clone(),
        },
        None => Layout::Cache {
            cache: RepoCache::new(&env.cache_root, &repo.cache_folder()),
            commit: commit.clone(),
        },
    };
    let mut summary = PullSummary {
        repo: repo.id.clone(),
        revision: repo.revision.clone(),
        commit: commit.clone(),
        endpoint: ep.clone(),
        files: files.len(),
        bytes_total: files.iter().map(|f| f.size).sum(),
        connections: opts.connections,
        ..Default::default()
    };
    match &layout {
        Layout::Cache { cache, .. } => {
            summary.path = cache.snapshot(&commit).display().to_string();
            summary.repo_dir = cache.dir().display().to_string();
        }
        Layout::LocalDir { dir, .. } => summary.path = dir.display().to_string(),
    }

    // A streaming fan-out hears of the files first (with chunk hashes).
    let chunk_size = opts.chunk_size.map(|c| c.for_bytes(summary.bytes_total));
    summary.chunk_size = chunk_size;
    let draft = match (&on_draft, chunk_size) {
        (Some(on), Some(cs)) => {
            let (d, paths) =
                draft_of(&layout, &files, cs).map_err(|e| anyhow::anyhow!("{}: {e}", repo.id))?;
            on(DraftUpdate::Listed {
                draft: d.clone(),
                commit: commit.clone(),
                paths,
            });
            Some((on.clone(), d, cs))
        }
        _ => None,
    };

    // Files already in place are only linked; the rest are fetched.
    // They are reported in one batch, so a fan-out's first round has them all.
    let mut todo = Vec::new();
    let mut present = Vec::new();
    let before_change = &opts.before_change;
    for f in &files {
        if layout.present(f) {
            if !layout.linked(f) {
                BeforeChange::call(before_change)
                    .and_then(|_| layout.link(f))
                    .with_context(|| format!("cannot link {}", f.path))?;
            }
            summary.bytes_present += f.size;
            summary.verification.present += 1;
            present.push(PlacedFile {
                path: f.path.clone(),
                visible: layout.visible(f),
                content: layout.final_path(f),
                chunks: None,
            });
        } else {
            todo.push(f.clone());
        }
    }
    if draft.is_none() {
        for f in files.iter().filter(|f| layout.present(f)) {
            summary.unhashed.push(layout.content_rel(f)?);
        }
    }
    if let Some((on, d, cs)) = &draft {
        let mut sealed = std::collections::HashSet::new();
        for f in files.iter().filter(|f| layout.present(f)) {
            let index = d.index_of(&layout.content_rel(f)?).expect("listed");
            if !sealed.insert(index) {
                continue;
            }
            let path = layout.final_path(f);
            let (expected, size, cs) = (f.expected.clone(), f.size, *cs);
            let got = tokio::task::spawn_blocking(move || hash_whole(&path, &expected, size, cs))
                .await??;
            announce::announce_sealed(on, index, 0, &got);
        }
    }
    if let (Some(cb), false) = (&on_placed, present.is_empty()) {
        cb(&present);
    }
    // The small files first (config, tokenizer, index; in path order the
    // index and the tokenizer sort after the shards): an engine started
    // while the weights land needs them before any shard.
    todo.sort_by_key(|f| xfer_proto::repo::is_weight_file(f.path.as_str()));
    // Files with the same contents share one blob, and so one incomplete
    // file: download it once, then link the other paths to it.
    let mut seen = std::collections::HashSet::new();
    let (todo, same_blob): (Vec<RemoteFile>, Vec<RemoteFile>) = todo
        .into_iter()
        .partition(|f| seen.insert(layout.incomplete(f).0));
    check_space(&layout, &todo)?;

    let draft_file = |f: &RemoteFile| -> Option<u32> {
        let (_, d, _) = draft.as_ref()?;
        d.index_of(&layout.content_rel(f).ok()?)
    };
    let jobs: Vec<FileJob> = todo
        .iter()
        .map(|f| {
            let (incomplete, sidecar) = layout.incomplete(f);
            FileJob {
                draft_file: draft_file(f),
                path: f.path.to_string(),
                url: repo.resolve_url(ep, &commit, f.path.as_str()),
                size: f.size,
                expected: f.expected.clone(),
                chunk_size,
                incomplete,
                sidecar,
            }
        })
        .collect();
    let stats = opts.stats.clone().unwrap_or_default();
    let finisher = Arc::new(Placer {
        layout: layout.clone(),
        files: todo.clone(),
        same_blob,
        before_change: before_change.clone(),
        sha256_ok: AtomicU64::new(0),
        git_sha1_ok: AtomicU64::new(0),
        on_placed,
    });
    let bars = Arc::new(Bars::new(progress, &todo, &repo.id));
    let watch: Arc<dyn Watch> = match &draft {
        Some((on, d, _)) => {
            // Paths sharing a blob are one file of the draft.
            let jobs = todo
                .iter()
                .map(|f| layout.content_rel(f))
                .collect::<Result<Vec<_>>>()?;
            Arc::new(Announcer::new(bars.clone(), on.clone(), d, &jobs))
        }
        None => bars.clone(),
    };
    download::download(
        http,
        jobs,
        download::Options {
            connections: opts.connections,
            part_size: opts.part_size,
            repo: repo.id.clone(),
            intake: opts.intake.clone(),
        },
        finisher.clone(),
        watch,
        stats.clone(),
    )
    .await?;
    bars.total.finish_and_clear();

    // The listing, as huggingface_hub caches it, then the ref, last; each
    // only if it says something new (a same-revision pull writes nothing).
    let tree_at = tree_cache::path(&layout.tree_folder(), &commit);
    if std::fs::read(&tree_at).ok() != Some(tree_cache::render(&all_files)) {
        BeforeChange::call(before_change)
            .and_then(|_| tree_cache::write(&layout.tree_folder(), &commit, &all_files))
            .with_context(|| {
                format!(
                    "cannot write the tree listing in {}",
                    layout.tree_folder().display()
                )
            })?;
    }
    summary.tree_cache = tree_at
        .strip_prefix(layout.root())
        .unwrap_or(&tree_at)
        .display()
        .to_string();
    summary.stale_removed =
        leftovers::remove_stale(&layout.incomplete_dir(), &Default::default()).len();
    if let Layout::Cache { cache, .. } = &layout {
        if repo.revision != commit && cache.read_ref(&repo.revision).as_deref() != Some(&commit) {
            BeforeChange::call(before_change)
                .and_then(|_| cache.write_ref(&repo.revision, &commit))
                .with_context(|| format!("cannot write the ref in {}", cache.dir().display()))?;
        }
    }
    let v = &mut summary.verification;
    v.sha256_ok = finisher.sha256_ok.load(Ordering::Relaxed) as usize;
    v.git_sha1_ok = finisher.git_sha1_ok.load(Ordering::Relaxed) as usize;
    v.recovered = stats.redownloads.load(Ordering::Relaxed);
    v.all_verified = v.sha256_ok + v.git_sha1_ok + v.present == files.len();
    summary.bytes_downloaded = stats.downloaded.load(Ordering::Relaxed);
    summary.bytes_resumed = stats.resumed.load(Ordering::Relaxed);
    summary.retries = stats.retries.load(Ordering::Relaxed);
    summary.whole_streams = stats.whole_streams.load(Ordering::Relaxed);
    summary.intake = std::mem::take(&mut *stats.shares.lock().unwrap());
    summary.duration_s = started.elapsed().as_secs_f64();
    summary.rate_mb_s = summary.bytes_downloaded as f64 / 1e6 / summary.duration_s.max(1e-9);
    Ok((summary, files))
}

/// The draft of `files`: one file per content path (paths sharing a blob
/// are one), with where each one's bytes are, in the draft's order.
fn draft_of(
    layout: &Layout,
    files: &[RemoteFile],
    chunk_size: u64,
) -> Result<(Draft, Vec<DraftPaths>)> {
    let mut unique = std::collections::BTreeMap::new();
    for f in files {
        unique.entry(layout.content_rel(f)?).or_insert_with(|| {
            let paths = DraftPaths {
                content: layout.final_path(f),
                incomplete: layout.incomplete(f).0,
            };
            (f.size, paths)
        });
    }
    // The snapshot's names, placed by each receiver with their blobs.
    let mut links = Vec::new();
    for f in files {
        if let Some(l) = layout.draft_link(f)? {
            links.push(l);
        }
    }
    links.sort();
    links.dedup_by(|a, b| a.0 == b.0);
    let draft = Draft::new(
        chunk_size,
        unique
            .iter()
            .map(|(p, (size, _))| (p.clone(), *size))
            .collect(),
    )
    .and_then(|d| d.with_links(links))
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut paths = vec![None; draft.file_count()];
    for (p, (_, at)) in unique {
        paths[draft.index_of(&p).expect("listed") as usize] = Some(at);
    }
    Ok((
        draft,
        paths.into_iter().map(|p| p.expect("every file")).collect(),
    ))
}

/// The chunk hashes of a file already in place, checked against its Hub
/// hash (the cache may hold a damaged copy).
fn hash_whole(path: &Path, expected: &Expected, size: u64, chunk_size: u64) -> Result<Vec<Hash>> {
    use std::io::Read;
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut d = Digester::new(expected, size, Some(chunk_size));
    let mut buf = vec![0u8; 1 << 20];
    while d.at() < size {
        let n = ((size - d.at()) as usize).min(buf.len());
        file.read_exact(&mut buf[..n])
            .with_context(|| format!("cannot read {}", path.display()))?;
        d.update(&buf[..n]);
    }
    let out = d.finish(path);
    if let Err(why) = out.verdict {
        bail!("{why}; the cached copy is damaged: delete it and pull again");
    }
    Ok(out.chunks.map(|(_, c)| c).unwrap_or_default())
}

/// Told of files as soon as they are in their final place.
pub type OnPlaced = Arc<dyn Fn(&[PlacedFile]) + Send + Sync>;

/// A file that just became visible in its final place.
pub struct PlacedFile {
    /// The file's path in the repo.
    pub path: RelPath,
    /// What became visible: the blob and its snapshot link, or the file in
    /// the local dir.
    pub visible: Vec<PathBuf>,
    /// The file holding the bytes (the blob, or the file in the local dir).
    pub content: PathBuf,
    /// Its BLAKE3 chunk hashes and their chunk size, when the pull computed
    /// them (`PullOptions::chunk_size`) as it downloaded.
    pub chunks: Option<(u64, Vec<Hash>)>,
}

/// Every file of the listing, following `Link: rel="next"` pages (kept on
/// the endpoint's host), within a [`ListingBudget`] of entries and bytes
/// and [`MAX_PAGE_BYTES`] a page: a Hub that pages forever is refused,
/// its pages are not kept.
/// The commit `repo`'s revision names and the bytes of every file at it,
/// from the Hub's own listing (nothing is downloaded): what a node needs
/// free to hold the whole repo.
pub async fn listing_size(repo: &RepoRef, env: &HubEnv) -> Result<(String, u64)> {
    let http = HubHttp::new(env)?;
    let (commit, files) = listing(&http, repo, &env.endpoint).await?;
    let total = crate::hub::api::total_size(&files).map_err(anyhow::Error::msg)?;
    Ok((commit, total))
}

/// The commit `repo`'s revision names, and every file at it.
async fn listing(http: &HubHttp, repo: &RepoRef, ep: &str) -> Result<(String, Vec<RemoteFile>)> {
    let (body, _) = http
        .get_api(
            &repo.revision_url(ep),
            &repo.id,
            &format!("@{}", repo.revision),
        )
        .await
        .map_err(anyhow::Error::new)?;
    let commit = RevisionInfo::parse(&body).map_err(anyhow::Error::msg)?.sha;
    let files = list_files(http, repo, ep, &commit).await?;
    Ok((commit, files))
}

async fn list_files(
    http: &HubHttp,
    repo: &RepoRef,
    ep: &str,
    commit: &str,
) -> Result<Vec<RemoteFile>> {
    let mut url = repo.tree_url(ep, commit);
    let mut files = Vec::new();
    let mut budget = ListingBudget::new(&repo.id);
    loop {
        let (body, headers) = http
            .get_api_within(
                &url,
                &repo.id,
                &format!("the file list at {}", &commit[..12]),
                MAX_PAGE_BYTES,
            )
            .await
            .map_err(anyhow::Error::new)?;
        let (page, entries) = parse_tree_page_counted(&body).map_err(anyhow::Error::msg)?;
        budget
            .take(body.len(), entries)
            .map_err(anyhow::Error::msg)?;
        files.extend(page);
        let link = headers.get("link").and_then(|l| l.to_str().ok());
        match link.and_then(|l| next_page(l, ep)) {
            Some(next) => url = next,
            None => break,
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files.dedup_by(|a, b| a.path == b.path);
    // Every later sum is over some of these files.
    crate::hub::api::total_size(&files).map_err(anyhow::Error::msg)?;
    Ok(files)
}

/// Refuses early, with numbers, when the files cannot fit.
fn check_space(layout: &Layout, todo: &[RemoteFile]) -> Result<()> {
    let mut need = 0;
    let mut at = None;
    for f in todo {
        let (incomplete, _) = layout.incomplete(f);
        let allocated = std::fs::metadata(&incomplete).is_ok_and(|m| m.len() == f.size);
        if !allocated {
            need += f.size;
        }
        at.get_or_insert(incomplete);
    }
    let Some(at) = at else { return Ok(()) };
    let dir = at.parent().expect("incomplete files live in a folder");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let have =
        crate::store::free_space(dir).with_context(|| format!("cannot stat {}", dir.display()))?;
    if need > have {
        return Err(NotEnoughSpace {
            need,
            have,
            dir: dir.to_path_buf(),
        }
        .into());
    }
    Ok(())
}

/// The files of a pull cannot fit on the disk that is to hold them.
#[derive(Debug, thiserror::Error)]
#[error("not enough disk space: need {}, have {} at {}; free some, or point HF_HUB_CACHE (or --local-dir) at a larger disk", Bytes(*need), Bytes(*have), dir.display())]
pub struct NotEnoughSpace {
    /// Bytes the files need.
    pub need: u64,
    /// Bytes free.
    pub have: u64,
    /// The folder they go to.
    pub dir: PathBuf,
}

/// Permanent: the disk stays too small until someone frees some.
impl Permanence for NotEnoughSpace {
    fn is_permanent(&self) -> bool {
        true
    }
}

/// A failed pull, read for what it says about trying again. The pull's
/// error is not typed yet: each link of its chain that is one of the
/// Hub's typed errors ([`Failure`](crate::hub::http::Failure),
/// [`DownloadError`](crate::hub::download::DownloadError),
/// [`NotEnoughSpace`], [`HubEnvError`](crate::hub::env::HubEnvError)) or
/// a node's [`Refusal`](xfer_proto::refusal::Refusal) is asked.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PullFailure(pub Chain);

impl From<anyhow::Error> for PullFailure {
    fn from(e: anyhow::Error) -> PullFailure {
        PullFailure(e.into())
    }
}

impl PullFailure {
    /// Each typed link of the chain, as what it says about trying again.
    fn typed(&self) -> impl Iterator<Item = &dyn Permanence> {
        use crate::hub::download::DownloadError;
        use crate::hub::env::HubEnvError;
        use crate::hub::http::Failure;
        use xfer_proto::refusal::Refusal;
        self.0.links().filter_map(|c| -> Option<&dyn Permanence> {
            if let Some(f) = c.downcast_ref::<Failure>() {
                return Some(f);
            }
            if let Some(d) = c.downcast_ref::<DownloadError>() {
                return Some(d);
            }
            if let Some(n) = c.downcast_ref::<NotEnoughSpace>() {
                return Some(n);
            }
            if let Some(h) = c.downcast_ref::<HubEnvError>() {
                return Some(h);
            }
            c.downcast_ref::<Refusal>().map(|r| r as &dyn Permanence)
        })
    }

    /// The disk that is too small, if that is why: the bytes needed, and
    /// those free when the pull counted them.
    pub fn full_disk(&self) -> Option<(u64, Option<u64>)> {
        use crate::hub::download::{DiskError, DownloadError};
        self.0.links().find_map(|c| {
            if let Some(n) = c.downcast_ref::<NotEnoughSpace>() {
                return Some((n.need, Some(n.have)));
            }
            match c.downcast_ref::<DownloadError>() {
                Some(DownloadError::Disk(DiskError::Full { need, .. })) => Some((*need, None)),
                _ => None,
            }
        })
    }
}

impl Permanence for PullFailure {
    fn is_permanent(&self) -> bool {
        self.typed().any(|t| t.is_permanent())
    }

    fn retry_after(&self) -> Option<Duration> {
        self.typed().find_map(|t| t.retry_after())
    }
}

/// `--include`/`--exclude`, with `huggingface_hub`'s fnmatch semantics
/// (`*` crosses `/`); a pattern ending in `/` means everything under it.
struct Filter {
    include: Option<GlobSet>,
    exclude: Option<GlobSet>,
}

impl Filter {
    fn new(include: &[String], exclude: &[String]) -> Result<Filter> {
        let build = |pats: &[String]| -> Result<Option<GlobSet>> {
            if pats.is_empty() {
                return Ok(None);
            }
            let mut b = GlobSetBuilder::new();
            for p in pats {
                let p = if p.ends_with('/') {
                    format!("{p}*")
                } else {
                    p.clone()
                };
                b.add(Glob::new(&p).with_context(|| {
                    format!("bad pattern `{p}`; use globs like '*.safetensors'")
                })?);
            }
            Ok(Some(b.build()?))
        };
        Ok(Filter {
            include: build(include)?,
            exclude: build(exclude)?,
        })
    }

    fn wants(&self, p: &RelPath) -> bool {
        self.include.as_ref().is_none_or(|g| g.is_match(p.as_str()))
            && !self
                .exclude
                .as_ref()
                .is_some_and(|g| g.is_match(p.as_str()))
    }
}

/// Verifies each finished download and places it.
struct Placer {
    layout: Layout,
    files: Vec<RemoteFile>,
    /// Files not downloaded themselves: another of `files` has the same
    /// incomplete file (same blob), and they are linked when it is placed.
    same_blob: Vec<RemoteFile>,
    before_change: Option<BeforeChange>,
    sha256_ok: AtomicU64,
    git_sha1_ok: AtomicU64,
    on_placed: Option<OnPlaced>,
}

impl Finisher for Placer {
    fn finish(&self, index: usize, job: &FileJob, digest: Digest) -> Verdict {
        let f = &self.files[index];
        if let Err(why) = digest.verdict {
            return Verdict::Mismatch(format!("{}: {why}", f.path));
        }
        let placed = BeforeChange::call(&self.before_change)
            .and_then(|_| self.layout.place(f, &job.incomplete));
        if let Err(e) = placed {
            return Verdict::Fatal(format!(
                "cannot place {} at {}: {e}",
                f.path,
                self.layout.final_path(f).display()
            ));
        }
        // Paths with the same contents link to the blob just placed.
        let twins: Vec<&RemoteFile> = self
            .same_blob
            .iter()
            .filter(|d| self.layout.incomplete(d).0 == job.incomplete)
            .collect();
        for d in &twins {
            if let Err(e) = self.layout.link(d) {
                return Verdict::Fatal(format!("cannot link {}: {e}", d.path));
            }
        }
        let placed: Vec<PlacedFile> = std::iter::once(f)
            .chain(twins)
            .map(|g| {
                match g.expected {
                    Expected::Sha256(_) => &self.sha256_ok,
                    Expected::GitSha1(_) => &self.git_sha1_ok,
                }
                .fetch_add(1, Ordering::Relaxed);
                PlacedFile {
                    path: g.path.clone(),
                    visible: self.layout.visible(g),
                    content: self.layout.final_path(g),
                    chunks: digest.chunks.clone(),
                }
            })
            .collect();
        if let Some(cb) = &self.on_placed {
            cb(&placed);
        }
        Verdict::Placed
    }
}

/// An overall bar and one bar per file being downloaded.
struct Bars {
    progress: Progress,
    total: crate::util::progress::Bar,
    files: Vec<(String, u64)>,
    active: Mutex<Vec<Option<crate::util::progress::Bar>>>,
}

impl Bars {
    fn new(progress: &Progress, todo: &[RemoteFile], repo: &str) -> Bars {
        Bars {
            progress: progress.clone(),
            total: progress.bytes(repo, todo.iter().map(|f| f.size).sum()),
            files: todo.iter().map(|f| (f.path.to_string(), f.size)).collect(),
            active: Mutex::new(vec![None; todo.len()]),
        }
    }
}

impl Bars {
    /// File `index`'s bar, made when the file starts.
    fn file_bar(&self, index: usize, f: impl FnOnce(&crate::util::progress::Bar)) {
        let mut active = self.active.lock().unwrap();
        let bar = active[index].get_or_insert_with(|| {
            let (name, size) = &self.files[index];
            let short = xfer_proto::text::file_label(name, self.progress.name_cols());
            self.progress.part(&short, *size)
        });
        f(bar);
    }
}

impl Watch for Bars {
    fn written(&self, index: usize, n: u64) {
        self.total.inc(n);
        self.file_bar(index, |bar| bar.inc(n));
    }

    fn resumed(&self, index: usize, n: u64) {
        self.total.held_more(n);
        self.file_bar(index, |bar| bar.resume_at(n));
    }

    fn finished(&self, index: usize, ok: bool) {
        let mut active = self.active.lock().unwrap();
        if let Some(bar) = active[index].take() {
            if !ok {
                self.total
                    .set_position(self.total.position().saturating_sub(bar.position()));
            }
            bar.finish_and_clear();
        }
    }
}
