//! The demo's own Hugging Face Hub: an in-process HTTP/1 server on
//! 127.0.0.1 that serves one folder as one model repo at one commit, over
//! the subset of the Hub protocol that xfer's Hub client uses (the same
//! answers as `tests/hub_server.py`, without its faults, gating or CDN
//! redirect), so `xfer demo` can pull a model with no Python and no network.
//!
//! It owns the repo's listing (files hashed once at start: git blob sha1 for
//! all, sha256 for LFS files), the routes below, and the file bodies:
//! streamed from disk in slices, never a whole file in memory, each
//! connection capped by its own token bucket like a CDN's per-connection
//! limit.
//!
//! - `GET /api/models/{repo}[/revision/{rev}]`: the repo info (`sha`,
//!   `siblings`) and `X-Repo-Commit`;
//! - `GET /api/models/{repo}/tree/{rev}[/{dir}]?recursive=&cursor=`: the
//!   listing, paged by `Link: <...>; rel="next"`;
//! - `GET|HEAD /{repo}/resolve/{rev}/{path}`: the bytes, `Range: bytes=a-b`
//!   answered `206` with `Content-Range`; `ETag` is the git sha1, or the
//!   sha256 with `X-Linked-Etag`/`X-Linked-Size` for LFS files.
//!
//! Revisions `main` and the commit resolve; any other is `RevisionNotFound`,
//! another repo `RepoNotFound`, as the Hub says them (`X-Error-Code`).

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::fs::File;
use std::io::Read;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper::body::{Bytes, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RANGE};
use hyper::{Method, Request, Response, StatusCode};
use percent_encoding::percent_decode_str;
use rayon::prelude::*;
use serde_json::json;
use sha1::Digest as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use xfer_proto::relpath::RelPath;
use xfer_proto::repo::{RepoRef, RepoType};

/// File names stored in LFS whatever their size (`hub_server.py`'s
/// `LFS_SUFFIXES`); files of [`LFS_MIN_SIZE`] or more are LFS too.
const LFS_SUFFIXES: [&str; 4] = [".safetensors", ".bin", ".pth", ".gguf"];
/// The size from which `hub_server.py` stores any file in LFS.
const LFS_MIN_SIZE: u64 = 1 << 20;
/// Tree entries per listing page (the Hub's own page size).
const PAGE_SIZE: usize = 1000;
/// Bytes per body slice when the rate is unlimited.
const FULL_SPEED_SLICE: u64 = 256 << 10;
/// Bytes read per step while hashing at start.
const HASH_BUF: usize = 1 << 20;

/// A running demo Hub; dropping it stops the server.
pub struct DemoHub {
    addr: SocketAddr,
    served: Arc<AtomicU64>,
    stop: CancellationToken,
    accept: tokio::task::JoinHandle<()>,
}

impl DemoHub {
    /// Serves the files under `dir` as the model repo `repo_id` (e.g. "xfer-demo/model") at one fixed commit,
    /// on 127.0.0.1 (an ephemeral port), each connection's file bodies capped at `rate` bytes/s (0 = unlimited),
    /// like a CDN's per-connection limit. Hashes every file once at start (sha256 for LFS files, git blob sha1 for all).
    pub async fn start(dir: &Path, repo_id: &str, rate: u64) -> Result<DemoHub> {
        let parsed = RepoRef::parse(repo_id, RepoType::Model).map_err(anyhow::Error::msg)?;
        if parsed.id != repo_id {
            bail!("the demo Hub serves a repo id without a revision, not `{repo_id}`");
        }
        let root = dir.to_path_buf();
        let files = tokio::task::spawn_blocking(move || scan(&root))
            .await
            .context("hashing the demo model crashed")?
            .with_context(|| format!("cannot serve {} as a Hub repo", dir.display()))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("the demo Hub cannot listen on 127.0.0.1")?;
        let addr = listener
            .local_addr()
            .context("the demo Hub's listening address")?;
        let served = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let repo = Arc::new(Repo::new(
            repo_id,
            files,
            format!("http://{addr}"),
            rate,
            served.clone(),
            stop.clone(),
        ));
        tracing::debug!(
            "demo Hub serves {repo_id} at {} on {addr}",
            &repo.commit[..12]
        );
        let accept = tokio::spawn(accept_loop(listener, repo));
        Ok(DemoHub {
            addr,
            served,
            stop,
            accept,
        })
    }

    /// e.g. "http://127.0.0.1:PORT", what HF_ENDPOINT would be.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Bytes of file bodies served so far.
    pub fn bytes_served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

impl Drop for DemoHub {
    fn drop(&mut self) {
        self.stop.cancel();
        self.accept.abort();
    }
}

// ------------------------------------------------------------------ repo ---

/// One file of the repo, hashed.
struct Entry {
    /// The path inside the repo, `/`-separated.
    path: String,
    abs: PathBuf,
    size: u64,
    /// The git blob sha1 of the contents.
    sha1: String,
    /// The sha256 of the contents, for LFS files only.
    sha256: Option<String>,
}

impl Entry {
    /// What `ETag` names: the sha256 of an LFS file, else the git sha1.
    fn etag(&self) -> &str {
        self.sha256.as_deref().unwrap_or(&self.sha1)
    }

    /// The LFS pointer git stores in place of an LFS file.
    fn pointer(&self) -> Option<String> {
        self.sha256.as_ref().map(|sha| {
            format!(
                "version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {}\n",
                self.size
            )
        })
    }

    /// The `oid` the tree lists: the git sha1 of the pointer for an LFS
    /// file, as the Hub does.
    fn tree_oid(&self) -> String {
        match self.pointer() {
            Some(p) => git_blob_sha1(p.as_bytes()),
            None => self.sha1.clone(),
        }
    }
}

/// The served repo and the server's shared state.
struct Repo {
    id: String,
    commit: String,
    files: BTreeMap<String, Entry>,
    dirs: BTreeSet<String>,
    /// `http://127.0.0.1:PORT`, for the `Link` header.
    origin: String,
    rate: u64,
    served: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Repo {
    fn new(
        id: &str,
        files: Vec<Entry>,
        origin: String,
        rate: u64,
        served: Arc<AtomicU64>,
        stop: CancellationToken,
    ) -> Repo {
        let files: BTreeMap<String, Entry> =
            files.into_iter().map(|e| (e.path.clone(), e)).collect();
        let dirs = files
            .keys()
            .flat_map(|p| p.match_indices('/').map(|(i, _)| p[..i].to_string()))
            .collect();
        // As hub_server.py: a sha1 over the sorted (path, tree oid) list.
        let mut listing = sha1::Sha1::new();
        for e in files.values() {
            listing.update(format!("{}\0{}\n", e.path, e.tree_oid()));
        }
        Repo {
            id: id.to_string(),
            commit: hex::encode(listing.finalize()),
            files,
            dirs,
            origin,
            rate,
            served,
            stop,
        }
    }

    fn is_lfs(path: &str, size: u64) -> bool {
        size >= LFS_MIN_SIZE || LFS_SUFFIXES.iter().any(|s| path.ends_with(s))
    }
}

/// Lists and hashes every file under `root` (`.git` folders skipped),
/// sorted by path, in parallel.
fn scan(root: &Path) -> Result<Vec<Entry>> {
    let mut found = Vec::new();
    walk(root, root, &mut found)?;
    found.sort();
    found
        .into_par_iter()
        .map(|(path, abs, size)| {
            let lfs = Repo::is_lfs(&path, size);
            let (sha1, sha256) = hash_file(&abs, size, lfs)
                .with_context(|| format!("cannot hash {}", abs.display()))?;
            Ok(Entry {
                path,
                abs,
                size,
                sha1,
                sha256,
            })
        })
        .collect()
}

/// Collects `(repo path, absolute path, size)` of the files under `dir`.
fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf, u64)>) -> Result<()> {
    let listing =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for item in listing {
        let item = item.with_context(|| format!("cannot list {}", dir.display()))?;
        let abs = item.path();
        let kind = item
            .file_type()
            .with_context(|| format!("cannot stat {}", abs.display()))?;
        if kind.is_dir() {
            if item.file_name() != ".git" {
                walk(root, &abs, out)?;
            }
            continue;
        }
        // Symlinks are followed to files only (a folder link could loop).
        let meta =
            std::fs::metadata(&abs).with_context(|| format!("cannot stat {}", abs.display()))?;
        if !meta.is_file() {
            continue;
        }
        let rel = abs
            .strip_prefix(root)
            .ok()
            .and_then(|p| p.to_str())
            .with_context(|| format!("{} has a name that is not UTF-8", abs.display()))?
            .to_string();
        RelPath::new(&rel).map_err(|why| anyhow::anyhow!("cannot serve `{rel}`: {why}"))?;
        out.push((rel, abs, meta.len()));
    }
    Ok(())
}

/// The git blob sha1 of a file of `size` bytes and, if `lfs`, its sha256,
/// in one streaming pass.
fn hash_file(path: &Path, size: u64, lfs: bool) -> Result<(String, Option<String>)> {
    let mut file = File::open(path)?;
    let mut sha1 = sha1::Sha1::new();
    sha1.update(format!("blob {size}\0"));
    let mut sha256 = lfs.then(sha2::Sha256::new);
    let mut buf = vec![0u8; HASH_BUF];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sha1.update(&buf[..n]);
        if let Some(h) = &mut sha256 {
            h.update(&buf[..n]);
        }
        total += n as u64;
    }
    if total != size {
        bail!("it changed size while being hashed ({size} then {total} bytes)");
    }
    Ok((
        hex::encode(sha1.finalize()),
        sha256.map(|h| hex::encode(h.finalize())),
    ))
}

fn git_blob_sha1(bytes: &[u8]) -> String {
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()));
    h.update(bytes);
    hex::encode(h.finalize())
}

// ---------------------------------------------------------------- server ---

async fn accept_loop(listener: tokio::net::TcpListener, repo: Arc<Repo>) {
    loop {
        let sock = match listener.accept().await {
            Ok((sock, _)) => sock,
            Err(e) => {
                tracing::debug!("demo Hub accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let repo = repo.clone();
        tokio::spawn(async move {
            // One bucket per connection, shared by its requests in turn.
            let bucket = Arc::new(Mutex::new(Bucket::new(repo.rate)));
            let stop = repo.stop.clone();
            let service = hyper::service::service_fn(move |req| {
                let (repo, bucket) = (repo.clone(), bucket.clone());
                async move { Ok::<_, Infallible>(answer(&repo, &bucket, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(hyper_util::rt::TokioIo::new(sock), service);
            tokio::select! {
                r = conn => if let Err(e) = r { tracing::debug!("demo Hub connection: {e}") },
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// Routes one request.
fn answer(
    repo: &Arc<Repo>,
    bucket: &Arc<Mutex<Bucket>>,
    req: &Request<Incoming>,
) -> Response<Body> {
    let head = req.method() == Method::HEAD;
    if !head && req.method() != Method::GET {
        return hub_error(StatusCode::METHOD_NOT_ALLOWED, None, "method not allowed");
    }
    let raw = req.uri().path();
    // Each segment decoded on its own: an encoded `/` stays inside one.
    let segs: Option<Vec<String>> = raw
        .split('/')
        .skip(1)
        .map(|s| {
            percent_decode_str(s)
                .decode_utf8()
                .ok()
                .map(|s| s.into_owned())
        })
        .collect();
    let Some(segs) = segs else {
        return hub_error(StatusCode::BAD_REQUEST, None, "the path is not UTF-8");
    };
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let id: Vec<&str> = repo.id.split('/').collect();
    let not_found = || hub_error(StatusCode::NOT_FOUND, None, &format!("Not found: {raw}"));
    let repo_not_found = || {
        hub_error(
            StatusCode::UNAUTHORIZED,
            Some("RepoNotFound"),
            "Repository not found",
        )
    };

    if segs.len() >= 3 && segs[0] == "api" {
        let rest = &segs[2..];
        if segs[1] != "models" || !rest.starts_with(&id) {
            return repo_not_found();
        }
        let rest = &rest[id.len()..];
        return match rest.first().copied() {
            None | Some("revision") => {
                let rev = rest.get(1..).map(|r| r.join("/")).unwrap_or_default();
                let rev = if rev.is_empty() { "main" } else { rev.as_str() };
                match repo.check_revision(rev) {
                    Some(refused) => refused,
                    None => repo.revision_info(),
                }
            }
            Some("tree") if rest.len() >= 2 => match repo.check_revision(rest[1]) {
                Some(refused) => refused,
                None => repo.tree(
                    raw,
                    req.uri().query(),
                    rest[1],
                    rest[2..].join("/").trim_matches('/'),
                ),
            },
            Some(_) => not_found(),
        };
    }
    let Some(at) = segs.iter().position(|s| *s == "resolve") else {
        return not_found();
    };
    if !(1..=2).contains(&at) || segs.len() < at + 3 {
        return not_found();
    }
    if segs[..at] != id[..] {
        return repo_not_found();
    }
    if let Some(refused) = repo.check_revision(segs[at + 1]) {
        return refused;
    }
    let range = req.headers().get(RANGE).and_then(|v| v.to_str().ok());
    repo.resolve(&segs[at + 2..].join("/"), range, head, bucket)
}

impl Repo {
    /// `None` when `rev` names the commit, else the Hub's refusal.
    fn check_revision(&self, rev: &str) -> Option<Response<Body>> {
        (rev != "main" && rev != self.commit).then(|| {
            hub_error(
                StatusCode::NOT_FOUND,
                Some("RevisionNotFound"),
                &format!("Invalid rev id: {rev}"),
            )
        })
    }

    /// `GET /api/models/{repo}/revision/{rev}`.
    fn revision_info(&self) -> Response<Body> {
        let siblings: Vec<_> = self
            .files
            .keys()
            .map(|p| json!({ "rfilename": p }))
            .collect();
        let body = json!({
            "_id": &self.commit[..24],
            "id": self.id,
            "modelId": self.id,
            "author": self.id.split('/').next(),
            "sha": self.commit,
            "private": false,
            "disabled": false,
            "gated": false,
            "tags": [],
            "siblings": siblings,
            "usedStorage": self.files.values().map(|e| e.size).sum::<u64>(),
        });
        self.json(StatusCode::OK, &body, None)
    }

    /// `GET /api/models/{repo}/tree/{rev}[/{dir}]`, one page of it.
    fn tree(&self, path: &str, query: Option<&str>, rev: &str, dir: &str) -> Response<Body> {
        let params: Vec<(String, String)> = query
            .unwrap_or("")
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                let v = percent_decode_str(v).decode_utf8_lossy().into_owned();
                (k.to_string(), v)
            })
            .collect();
        let param = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let recursive = matches!(param("recursive"), Some("true" | "True" | "1"));
        if !dir.is_empty() && !self.dirs.contains(dir) {
            return hub_error(
                StatusCode::NOT_FOUND,
                Some("EntryNotFound"),
                &format!("{dir} does not exist on \"{rev}\""),
            );
        }
        let prefix = if dir.is_empty() {
            String::new()
        } else {
            format!("{dir}/")
        };
        let listed = |p: &str| {
            p.strip_prefix(prefix.as_str())
                .is_some_and(|rest| recursive || !rest.contains('/'))
        };
        let mut entries: Vec<(String, serde_json::Value)> = self
            .dirs
            .iter()
            .filter(|d| listed(d))
            .map(|d| {
                let oid = hex::encode(sha1::Sha1::digest(format!("{}:{d}", self.commit)));
                (
                    d.clone(),
                    json!({ "type": "directory", "oid": oid, "size": 0, "path": d }),
                )
            })
            .collect();
        for e in self.files.values().filter(|e| listed(&e.path)) {
            let mut item =
                json!({ "type": "file", "oid": e.tree_oid(), "size": e.size, "path": e.path });
            if let (Some(sha), Some(p)) = (&e.sha256, e.pointer()) {
                item["lfs"] = json!({ "oid": sha, "size": e.size, "pointerSize": p.len() });
            }
            entries.push((e.path.clone(), item));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let Ok(start) = param("cursor").unwrap_or("0").parse::<usize>() else {
            return hub_error(StatusCode::BAD_REQUEST, None, "bad cursor");
        };
        let page: Vec<_> = entries
            .iter()
            .skip(start)
            .take(PAGE_SIZE)
            .map(|(_, v)| v)
            .collect();
        let next = start + page.len();
        let link = (next < entries.len()).then(|| {
            let mut q: Vec<String> = params
                .iter()
                .filter(|(k, _)| k != "cursor")
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            q.push(format!("cursor={next}"));
            format!("<{}{path}?{}>; rel=\"next\"", self.origin, q.join("&"))
        });
        self.json(StatusCode::OK, &json!(page), link)
    }

    /// `GET|HEAD /{repo}/resolve/{rev}/{path}`: the file's bytes, or the
    /// part `range` asks for.
    fn resolve(
        &self,
        path: &str,
        range: Option<&str>,
        head: bool,
        bucket: &Arc<Mutex<Bucket>>,
    ) -> Response<Body> {
        let Some(e) = self.files.get(path) else {
            let mut r = hub_error(
                StatusCode::NOT_FOUND,
                Some("EntryNotFound"),
                &format!("{path} does not exist on \"{}\"", self.commit),
            );
            r.headers_mut()
                .insert("x-repo-commit", header(&self.commit));
            return r;
        };
        let mut builder = Response::builder()
            .header("x-repo-commit", &self.commit)
            .header("etag", format!("\"{}\"", e.etag()))
            .header("accept-ranges", "bytes");
        if let Some(sha) = &e.sha256 {
            builder = builder
                .header("x-linked-etag", format!("\"{sha}\""))
                .header("x-linked-size", e.size);
        }
        let (status, start, end) = match parse_range(range, e.size) {
            Asked::Whole => (StatusCode::OK, 0, e.size),
            Asked::Part(a, b) => {
                builder =
                    builder.header("content-range", format!("bytes {a}-{}/{}", b - 1, e.size));
                (StatusCode::PARTIAL_CONTENT, a, b)
            }
            Asked::Unsatisfiable => {
                return builder
                    .status(StatusCode::RANGE_NOT_SATISFIABLE)
                    .header("content-range", format!("bytes */{}", e.size))
                    .header(CONTENT_LENGTH, 0)
                    .body(Body::empty())
                    .expect("a response of valid parts");
            }
        };
        let builder = builder
            .status(status)
            .header(CONTENT_TYPE, "application/octet-stream")
            .header(CONTENT_LENGTH, end - start);
        if head || start == end {
            return builder
                .body(Body::empty())
                .expect("a response of valid parts");
        }
        let file = match File::open(&e.abs) {
            Ok(f) => Arc::new(f),
            Err(err) => {
                tracing::warn!("demo Hub cannot open {}: {err}", e.abs.display());
                return hub_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    None,
                    &format!("cannot read {path}"),
                );
            }
        };
        let (tx, rx) = mpsc::channel(1);
        let send = send_range(
            file,
            start,
            end,
            self.rate,
            bucket.clone(),
            self.served.clone(),
            tx,
        );
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = send => {}
                _ = stop.cancelled() => {}
            }
        });
        builder
            .body(Body::File {
                rx,
                left: end - start,
            })
            .expect("a response of valid parts")
    }

    /// A JSON reply with `X-Repo-Commit` and, for a paged listing, `Link`.
    fn json(
        &self,
        status: StatusCode,
        body: &serde_json::Value,
        link: Option<String>,
    ) -> Response<Body> {
        let mut r = json_reply(status, body);
        r.headers_mut()
            .insert("x-repo-commit", header(&self.commit));
        if let Some(l) = link {
            r.headers_mut().insert("link", header(&l));
        }
        r
    }
}

/// Streams `[start, end)` of `file` into `tx` in slices, each after the
/// connection's bucket allows it; stops early if the client goes away.
async fn send_range(
    file: Arc<File>,
    start: u64,
    end: u64,
    rate: u64,
    bucket: Arc<Mutex<Bucket>>,
    served: Arc<AtomicU64>,
    tx: mpsc::Sender<std::io::Result<Bytes>>,
) {
    let slice = if rate == 0 {
        FULL_SPEED_SLICE
    } else {
        rate_slice(rate)
    };
    let mut pos = start;
    while pos < end {
        let n = slice.min(end - pos);
        let wait = bucket.lock().expect("bucket lock").take(n);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let f = file.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; n as usize];
            f.read_exact_at(&mut buf, pos).map(|()| Bytes::from(buf))
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        let failed = read.is_err();
        if let Err(e) = &read {
            tracing::warn!("demo Hub cannot read at byte {pos}: {e}");
        }
        // A failed read ends the body with an error: the client sees the
        // connection cut and retries, rather than wrong bytes.
        if tx.send(read).await.is_err() || failed {
            return;
        }
        served.fetch_add(n, Ordering::Relaxed);
        pos += n;
    }
}

/// The send slice, and the bucket's burst, at `rate` bytes/s: about 20 ms
/// of data, as `hub_server.py`.
fn rate_slice(rate: u64) -> u64 {
    (rate / 50).clamp(16 << 10, 256 << 10)
}

/// A per-connection token bucket: a burst of one slice, refilled at `rate`
/// bytes/s.
struct Bucket {
    rate: u64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: u64) -> Bucket {
        Bucket {
            rate,
            tokens: 0.0,
            last: Instant::now(),
        }
    }

    /// Takes `n` bytes' worth of tokens; returns how long to wait before
    /// sending them (zero when unlimited).
    fn take(&mut self, n: u64) -> Duration {
        if self.rate == 0 {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let rate = self.rate as f64;
        let refill = now.duration_since(self.last).as_secs_f64() * rate;
        self.tokens = (self.tokens + refill).min(rate_slice(self.rate) as f64) - n as f64;
        self.last = now;
        if self.tokens < 0.0 {
            Duration::from_secs_f64(-self.tokens / rate)
        } else {
            Duration::ZERO
        }
    }
}

/// What a `Range` header asks of a file of some size.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    /// No range (or one we do not take, as several): the whole file, `200`.
    Whole,
    /// Bytes `[a, b)`, `206`.
    Part(u64, u64),
    /// Past the end, `416`.
    Unsatisfiable,
}

/// Parses `bytes=a-b`, `bytes=a-` or `bytes=-n`, as `hub_server.py` does.
fn parse_range(value: Option<&str>, size: u64) -> Asked {
    let Some(spec) = value.and_then(|v| v.strip_prefix("bytes=")) else {
        return Asked::Whole;
    };
    if spec.contains(',') {
        return Asked::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Asked::Whole;
    };
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        return match b.parse::<u64>() {
            Ok(n) if n > 0 && size > 0 => Asked::Part(size.saturating_sub(n), size),
            Ok(_) => Asked::Unsatisfiable,
            Err(_) => Asked::Whole,
        };
    }
    let Ok(start) = a.parse::<u64>() else {
        return Asked::Whole;
    };
    let end = if b.is_empty() {
        size
    } else {
        match b.parse::<u64>() {
            Ok(last) => last.saturating_add(1),
            Err(_) => return Asked::Whole,
        }
    };
    if start >= size || end <= start {
        Asked::Unsatisfiable
    } else {
        Asked::Part(start, end.min(size))
    }
}

// ----------------------------------------------------------------- reply ---

/// A reply body: a small one in memory, or a file streamed in slices.
enum Body {
    Full(Option<Bytes>),
    File {
        rx: mpsc::Receiver<std::io::Result<Bytes>>,
        /// Bytes still to come.
        left: u64,
    },
}

impl Body {
    fn empty() -> Body {
        Body::Full(None)
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::File { rx, left } => rx.poll_recv(cx).map(|slice| {
                slice.map(|r| {
                    r.map(|b| {
                        *left = left.saturating_sub(b.len() as u64);
                        Frame::data(b)
                    })
                })
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Full(b) => b.is_none(),
            Body::File { left, .. } => *left == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Body::File { left, .. } => SizeHint::with_exact(*left),
        }
    }
}

fn json_reply(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let bytes = Bytes::from(body.to_string());
    Response::builder()
        .status(status)
        .header(CONTENT_TYPE, "application/json")
        .header(CONTENT_LENGTH, bytes.len())
        .body(Body::Full(Some(bytes)))
        .expect("a response of valid parts")
}

/// An error as the Hub sends it: `{"error": message}`, and with a `code`,
/// `X-Error-Code` and `X-Error-Message`.
fn hub_error(status: StatusCode, code: Option<&str>, message: &str) -> Response<Body> {
    let mut r = json_reply(status, &json!({ "error": message }));
    if let Some(code) = code {
        r.headers_mut().insert("x-error-code", header(code));
        r.headers_mut().insert("x-error-message", header(message));
    }
    r
}

/// A header value of any text (non-ASCII and control characters escaped).
fn header(text: &str) -> HeaderValue {
    HeaderValue::from_str(text)
        .or_else(|_| HeaderValue::from_str(&text.escape_default().to_string()))
        .expect("escaped text is visible ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;

    use xfer::hub::env::HubEnv;
    use xfer::hub::pull::{pull, PullOptions, PullSummary};
    use xfer::util::progress::Progress;

    /// Writes `files` (path, size) of random bytes under `dir`.
    fn write_tree(dir: &Path, files: &[(&str, usize)]) -> Vec<(String, Vec<u8>)> {
        let mut rng = rand::thread_rng();
        files
            .iter()
            .map(|&(path, size)| {
                let mut bytes = vec![0u8; size];
                rng.fill_bytes(&mut bytes);
                let abs = dir.join(path);
                std::fs::create_dir_all(abs.parent().unwrap()).unwrap();
                std::fs::write(&abs, &bytes).unwrap();
                (path.to_string(), bytes)
            })
            .collect()
    }

    async fn pull_from(hub: &DemoHub, cache: &Path, connections: usize) -> PullSummary {
        let env = HubEnv {
            endpoint: hub.endpoint(),
            token: None,
            cache_root: cache.to_path_buf(),
        };
        let opts = PullOptions {
            repo: "xfer-demo/model".into(),
            repo_type: RepoType::Model,
            include: vec![],
            exclude: vec![],
            local_dir: None,
            connections,
            part_size: 1 << 20,
            chunk_size: None,
        };
        let (summary, _) = pull(&opts, &env, &Progress::new(false), None, None)
            .await
            .unwrap();
        summary
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn demo_hub_serves_xfers_own_puller() {
        let src = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let files = write_tree(
            src.path(),
            &[
                ("config.json", 321),
                ("model-00001-of-00002.safetensors", 3 << 20),
                ("sub/model-00002-of-00002.safetensors", (1 << 20) + 17),
            ],
        );
        let hub = DemoHub::start(src.path(), "xfer-demo/model", 0)
            .await
            .unwrap();
        let summary = pull_from(&hub, cache.path(), 4).await;
        assert!(summary.verification.all_verified, "{summary:?}");
        assert_eq!(summary.files, 3);
        assert_eq!(summary.verification.sha256_ok, 2);
        assert_eq!(summary.verification.git_sha1_ok, 1);
        let total: usize = files.iter().map(|(_, b)| b.len()).sum();
        for (path, bytes) in &files {
            let got = std::fs::read(Path::new(&summary.path).join(path)).unwrap();
            assert!(got == *bytes, "{path} differs from its source");
        }
        assert!(hub.bytes_served() >= total as u64, "{}", hub.bytes_served());

        // The Hub's refusals, as the client reads them.
        let http = reqwest::Client::new();
        let ep = hub.endpoint();
        let r = http
            .get(format!("{ep}/api/models/xfer-demo/model/revision/v9"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        assert_eq!(r.headers()["x-error-code"], "RevisionNotFound");
        let r = http
            .get(format!("{ep}/other/model/resolve/main/config.json"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["x-error-code"], "RepoNotFound");
        let r = http
            .get(format!("{ep}/xfer-demo/model/resolve/main/config.json"))
            .header("range", "bytes=400-")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 416);
        let shard = &files[1];
        let r = http
            .head(format!("{ep}/xfer-demo/model/resolve/main/{}", shard.0))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["content-length"],
            shard.1.len().to_string().as_str()
        );
        assert_eq!(
            r.headers()["x-linked-size"],
            shard.1.len().to_string().as_str()
        );
        let sha = hex::encode(sha2::Sha256::digest(&shard.1));
        assert_eq!(r.headers()["etag"], format!("\"{sha}\"").as_str());
        assert_eq!(r.headers()["x-linked-etag"], format!("\"{sha}\"").as_str());

        // Dropped, it stops serving.
        drop(hub);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(http
            .get(format!("{ep}/api/models/xfer-demo/model"))
            .send()
            .await
            .is_err());
    }

    /// A listing longer than a page is paged as the client follows it.
    #[test]
    fn long_listings_are_paged() {
        let files = (0..PAGE_SIZE + 5)
            .map(|i| Entry {
                path: format!("d/{i:05}.txt"),
                abs: PathBuf::new(),
                size: 1,
                sha1: "c".repeat(40),
                sha256: None,
            })
            .collect();
        let ep = "http://127.0.0.1:9";
        let repo = Repo::new(
            "o/m",
            files,
            ep.into(),
            0,
            Arc::default(),
            CancellationToken::new(),
        );
        let path = format!("/api/models/o/m/tree/{}", repo.commit);
        let mut query = "recursive=true&expand=false".to_string();
        let mut listed = Vec::new();
        for _ in 0..3 {
            let r = repo.tree(&path, Some(&query), &repo.commit, "");
            let link = r
                .headers()
                .get("link")
                .map(|l| l.to_str().unwrap().to_string());
            let Body::Full(Some(body)) = r.into_body() else {
                panic!("a JSON body")
            };
            listed.extend(xfer::hub::api::parse_tree_page(&body).unwrap());
            let Some(next) = link.and_then(|l| xfer::hub::api::next_page(&l, ep)) else {
                break;
            };
            query = next.split_once('?').unwrap().1.to_string();
        }
        assert_eq!(
            listed.len(),
            PAGE_SIZE + 5,
            "every file once, the folder dropped"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn demo_hub_throttles_and_still_verifies() {
        let src = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        write_tree(src.path(), &[("model.safetensors", 2 << 20)]);
        let hub = DemoHub::start(src.path(), "xfer-demo/model", 2_000_000)
            .await
            .unwrap();
        let summary = pull_from(&hub, cache.path(), 1).await;
        assert!(summary.verification.all_verified, "{summary:?}");
        assert!(hub.bytes_served() >= 2 << 20);
    }

    #[test]
    fn ranges_as_hub_server_py() {
        assert_eq!(parse_range(None, 10), Asked::Whole);
        assert_eq!(parse_range(Some("bytes=2-4"), 10), Asked::Part(2, 5));
        assert_eq!(parse_range(Some("bytes=8-"), 10), Asked::Part(8, 10));
        assert_eq!(parse_range(Some("bytes=5-99"), 10), Asked::Part(5, 10));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Asked::Part(7, 10));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Asked::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Asked::Whole);
    }

    #[test]
    fn the_bucket_paces_slices() {
        let mut b = Bucket::new(1_000_000);
        let first = b.take(20_000);
        assert!(first > Duration::from_millis(15), "{first:?}");
        assert_eq!(Bucket::new(0).take(1 << 30), Duration::ZERO);
    }
}
