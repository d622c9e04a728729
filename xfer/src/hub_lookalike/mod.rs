//! The Hub look-alike: the demo's (and tests') own Hugging Face Hub, an in-process HTTP/1 server on
//! 127.0.0.1 that serves one folder as one model repo at one commit, over
//! the subset of the Hub protocol that xfer's Hub client uses (the same
//! answers as `tests/hub_server.py`, without its faults, gating or CDN
//! redirect), so `xfer demo` can pull a model with no Python and no network.
//!
//! It owns the server's start, accept loop and stop; the repo's listing
//! (files hashed once at start: git blob sha1 for all, sha256 for LFS files)
//! is in `repo`, the routes below and the file bodies in `serve`: streamed
//! from disk in slices, never a whole file in memory, each connection paced
//! by its own `util::rate` limiter like a CDN's per-connection limit.
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

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio_util::sync::CancellationToken;

use xfer_proto::repo::{RepoRef, RepoType};

mod repo;
mod serve;

use repo::{scan, Repo};
use serve::{answer, connection_pace};

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
        Self::start_on(dir, repo_id, rate, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// [`Self::start`], listening on `at` (`xfer hub-serve --listen`).
    pub async fn start_on(dir: &Path, repo_id: &str, rate: u64, at: SocketAddr) -> Result<DemoHub> {
        let parsed = RepoRef::parse(repo_id, RepoType::Model).map_err(anyhow::Error::msg)?;
        if parsed.id != repo_id {
            bail!("the demo Hub serves a repo id without a revision, not `{repo_id}`");
        }
        let root = dir.to_path_buf();
        let files = tokio::task::spawn_blocking(move || scan(&root))
            .await
            .context("hashing the demo model crashed")?
            .with_context(|| format!("cannot serve {} as a Hub repo", dir.display()))?;
        let listener = tokio::net::TcpListener::bind(at).await.with_context(|| {
            format!("the Hub look-alike cannot listen on {at}; pick a free address with --listen")
        })?;
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
            // One pace per connection, shared by its requests in turn.
            let pace = connection_pace(repo.rate);
            let stop = repo.stop.clone();
            let service = hyper::service::service_fn(move |req| {
                let (repo, pace) = (repo.clone(), pace.clone());
                async move { Ok::<_, Infallible>(answer(&repo, &pace, &req)) }
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
#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;
    use sha1::Digest as _;
    use std::path::PathBuf;

    use super::repo::Entry;
    use super::serve::{parse_range, rate_slice, Asked, Body};
    use super::PAGE_SIZE;
    use crate::hub::env::HubEnv;
    use crate::hub::pull::{pull, PullOptions, PullSummary};
    use crate::util::progress::Progress;
    use crate::util::rate::RateLimiter;

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
            repo: RepoRef::parse("xfer-demo/model", RepoType::Model).unwrap(),
            include: vec![],
            exclude: vec![],
            local_dir: None,
            connections,
            part_size: 1 << 20,
            chunk_size: None,
            intake: Default::default(),
            before_change: None,
            stats: None,
            pin: None,
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
            listed.extend(crate::hub::api::parse_tree_page(&body).unwrap());
            let Some(next) = link.and_then(|l| crate::hub::api::next_page(&l, ep)) else {
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

    /// A limited connection is paced slice by slice; an unlimited one has
    /// no limiter at all.
    #[tokio::test]
    async fn connections_pace_slices() {
        let limiter = RateLimiter::new(1_000_000);
        let slice = rate_slice(1_000_000);
        let t = std::time::Instant::now();
        limiter.acquire(slice).await;
        limiter.acquire(slice).await;
        assert!(t.elapsed() > Duration::from_millis(15), "{:?}", t.elapsed());
        assert!(connection_pace(1_000_000).is_some());
        assert!(connection_pace(0).is_none());
    }
}
