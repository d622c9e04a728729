//! Helpers of the `xfer pull` tests: the Hub-protocol test server
//! (`tests/hub_server.py`), generated repos, the `xfer pull` command line
//! and its JSON summary, and checks of the Hugging Face cache layout.
//!
//! Each test starts its own server on ports the kernel picks, with its repos
//! and cache in its own temp dir, so tests run in parallel threads.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

use super::*;

/// The real `huggingface_hub` client, installed by `scripts/test.sh`.
pub const HF_VENV: &str = "/var/tmp/xfer-venv-hf";

/// The test server script.
pub fn hub_server_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/hub_server.py")
}

/// The workspace root (for `scripts/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

// ---------------------------------------------------------------------------
// The server

/// A running `tests/hub_server.py`; killed when dropped.
pub struct HubServer {
    child: Child,
    pub hub_port: u16,
    pub cdn_port: u16,
    /// While stopped: the two ports, bound and not listening, so another
    /// test's server cannot take them (a connection is refused, as to a
    /// Hub that is down, never answered by someone else's Hub).
    held: Vec<socket2::Socket>,
}

impl HubServer {
    /// Starts the server on `repos` with extra options (`--fault ...`,
    /// `--page-size N`, ...) and waits for its `READY` line.
    pub fn start(repos: &Path, extra: &[&str]) -> HubServer {
        let mut child = Command::new("python3")
            .arg(hub_server_script())
            .arg("--repos")
            .arg(repos)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start python3 tests/hub_server.py");
        let err = child.stderr.take().unwrap();
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(err).read_to_string(&mut s);
            s
        });
        let line = first_line(&mut child, Duration::from_secs(60));
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 3 || f[0] != "READY" {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "hub_server.py did not start: first line {line:?}, stderr:\n{}",
                err.join().unwrap_or_default()
            );
        }
        HubServer {
            child,
            hub_port: f[1].parse().unwrap(),
            cdn_port: f[2].parse().unwrap(),
            held: Vec::new(),
        }
    }

    /// `HF_ENDPOINT` for this server.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.hub_port)
    }

    /// `GET /_stats`.
    pub fn stats(&self) -> serde_json::Value {
        serde_json::from_str(&http(self.hub_port, "GET", "/_stats")).expect("/_stats JSON")
    }

    /// `POST /_stats/reset`.
    pub fn reset_stats(&self) {
        http(self.hub_port, "POST", "/_stats/reset");
    }

    /// `GET /_repos`: commit and per-file hashes of every repo.
    pub fn repos(&self) -> BTreeMap<String, RepoMeta> {
        serde_json::from_str(&http(self.hub_port, "GET", "/_repos")).expect("/_repos JSON")
    }

    /// [`Self::repos`] of one repo.
    pub fn repo(&self, id: &str) -> RepoMeta {
        self.repos()
            .remove(id)
            .unwrap_or_else(|| panic!("the server has no repo {id}"))
    }
}

impl HubServer {
    /// Stops this server and starts it again on the same ports (the
    /// agents' `HF_ENDPOINT` stays right), reading `repos` anew: a moved
    /// `main`.
    /// Stops this server (a Hub that went down); [`Self::restart`] brings
    /// it back on the same ports.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.held = [self.hub_port, self.cdn_port]
            .into_iter()
            .filter_map(hold_port)
            .collect();
    }

    pub fn restart(&mut self, repos: &Path, extra: &[&str]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.held.clear();
        let (hub, cdn) = (self.hub_port.to_string(), self.cdn_port.to_string());
        let mut args = extra.to_vec();
        args.extend(["--port", &hub, "--cdn-port", &cdn]);
        *self = HubServer::start(repos, &args);
    }
}

/// 127.0.0.1:`port` bound and never listened on: connections to it are
/// refused, and no other socket takes the port meanwhile.
fn hold_port(port: u16) -> Option<socket2::Socket> {
    use socket2::{Domain, Socket, Type};
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).ok()?;
    // The killed server's connections may linger in TIME_WAIT.
    s.set_reuse_address(true).ok()?;
    s.bind(&addr.into()).ok()?;
    Some(s)
}

impl Drop for HubServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request with `Connection: close`; returns the body of a 200.
pub fn http(port: u16, method: &str, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the test server");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{method} {path}: {head}"
    );
    body.to_string()
}

/// What `/_repos` says about a repo.
#[derive(Debug, Clone, Deserialize)]
pub struct RepoMeta {
    pub commit: String,
    pub files: BTreeMap<String, FileMeta>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FileMeta {
    pub size: u64,
    pub sha1: String,
    pub sha256: Option<String>,
    pub etag: String,
    pub lfs: bool,
}

impl RepoMeta {
    pub fn total(&self) -> u64 {
        self.files.values().map(|f| f.size).sum()
    }

    pub fn lfs_count(&self) -> usize {
        self.files.values().filter(|f| f.lfs).count()
    }

    /// Only the files `keep` accepts.
    pub fn only(&self, keep: impl Fn(&str) -> bool) -> RepoMeta {
        RepoMeta {
            commit: self.commit.clone(),
            files: self
                .files
                .iter()
                .filter(|(p, _)| keep(p))
                .map(|(p, f)| (p.clone(), f.clone()))
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------
// Repos

/// Writes the files of `spec` (path, size) under `repos/<id>/`; contents are
/// pseudo-random, seeded by `seed` and the path. `.json` files get JSON text.
/// Returns the repo's folder.
pub fn gen_repo(repos: &Path, id: &str, seed: u64, spec: &[(&str, u64)]) -> PathBuf {
    let dir = repos.join(id);
    for (i, (path, size)) in spec.iter().enumerate() {
        let p = dir.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        if path.ends_with(".json") {
            let head = format!("{{\"repo\": \"{id}\", \"path\": \"{path}\", \"pad\": \"");
            let len = (*size as usize).max(head.len() + 3);
            let pad = len - head.len() - 3;
            let hex = hex::encode(random_bytes(seed, path, pad / 2 + 1));
            fs::write(&p, format!("{head}{}\"}}\n", &hex[..pad])).unwrap();
        } else {
            write_random(&p, *size, seed.wrapping_mul(1000).wrapping_add(i as u64));
        }
    }
    dir
}

/// A small model repo: JSON files at the top and two folders deep, a
/// non-LFS text file, and two multi-MiB safetensors shards (one in a
/// subfolder), with sizes that are not multiples of anything.
pub fn small_repo(repos: &Path, id: &str, seed: u64) -> PathBuf {
    gen_repo(
        repos,
        id,
        seed,
        &[
            ("config.json", 300),
            ("generation_config.json", 120),
            ("tokenizer.txt", 200_001),
            ("sub/deeper/info.json", 90),
            ("model-00001-of-00002.safetensors", 3 * MIB + 12_345),
            ("sub/model-00002-of-00002.safetensors", 2 * MIB + 777),
        ],
    )
}

// ---------------------------------------------------------------------------
// Running `xfer pull`

/// What `xfer pull --json` prints, read through the product's own type.
pub use xfer::hub::pull::PullSummary as PullJson;

/// The environment of one test's pulls: endpoint, cache, token.
#[derive(Clone)]
pub struct PullEnv {
    pub endpoint: String,
    /// `HF_HUB_CACHE`.
    pub cache: PathBuf,
    /// `HF_HOME` (kept empty, so no token file of the machine is read).
    pub home: PathBuf,
    pub token: Option<String>,
}

impl PullEnv {
    pub fn new(endpoint: &str, dir: &Path) -> PullEnv {
        PullEnv {
            endpoint: endpoint.to_string(),
            cache: dir.join("cache"),
            home: dir.join("hf-home"),
            token: None,
        }
    }

    pub fn with_token(mut self, token: &str) -> PullEnv {
        self.token = Some(token.to_string());
        self
    }

    pub fn with_cache(mut self, cache: &Path) -> PullEnv {
        self.cache = cache.to_path_buf();
        self
    }

    /// Sets the Hugging Face variables of a command (xfer or the real
    /// client), removing any the developer may have set.
    pub fn apply(&self, c: &mut Command) {
        for k in [
            "HF_TOKEN",
            "HF_TOKEN_PATH",
            "HUGGING_FACE_HUB_TOKEN",
            "HF_HUB_OFFLINE",
            "HF_HUB_ENABLE_HF_TRANSFER",
            "XDG_CACHE_HOME",
        ] {
            c.env_remove(k);
        }
        c.env("HF_ENDPOINT", &self.endpoint)
            .env("HF_HUB_CACHE", &self.cache)
            .env("HF_HOME", &self.home)
            .env("HF_HUB_DISABLE_TELEMETRY", "1")
            .env("HF_HUB_DISABLE_XET", "1")
            .env("HF_HUB_DISABLE_PROGRESS_BARS", "1");
        if let Some(t) = &self.token {
            c.env("HF_TOKEN", t);
        }
    }

    /// `xfer pull REPO --json ARGS...`.
    pub fn cmd(&self, repo: &str, args: &[&str]) -> Command {
        let mut c = xfer();
        self.apply(&mut c);
        c.arg("pull").arg(repo).arg("--json").args(args);
        c
    }

    /// Runs a pull (at most 120 s).
    pub fn pull(&self, repo: &str, args: &[&str]) -> Run {
        run(&mut self.cmd(repo, args), Duration::from_secs(120))
    }

    /// Runs a pull that must succeed; returns its summary.
    pub fn pull_ok(&self, repo: &str, args: &[&str]) -> PullJson {
        let r = self.pull(repo, args);
        r.assert_ok(&format!("xfer pull {repo} {args:?}"));
        r.json()
    }

    /// `<cache>/models--org--name`.
    pub fn repo_dir(&self, id: &str) -> PathBuf {
        self.cache
            .join(format!("models--{}", id.replace('/', "--")))
    }
}

/// Asserts that a failed run failed with a one-line `error: ...` that
/// contains every word of `words` (case-insensitively); returns the line.
pub fn assert_error(r: &Run, words: &[&str]) -> String {
    assert!(
        !r.success() && r.status.code().is_some_and(|c| c != 0),
        "expected a failure: {r:#?}"
    );
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let errors: Vec<&&str> = lines.iter().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "exactly one `error: ` line: {r:#?}");
    let line = errors[0].to_string();
    let low = line.to_lowercase();
    for w in words {
        assert!(
            low.contains(&w.to_lowercase()),
            "the error lacks {w:?}: {line}"
        );
    }
    line
}

// ---------------------------------------------------------------------------
// Checking the cache

/// `"../" * (depth + 2) + "blobs/<etag>"`: where `snapshots/<commit>/<path>`
/// must point, as `huggingface_hub` writes it.
pub fn link_target(path: &str, etag: &str) -> String {
    format!(
        "{}blobs/{etag}",
        "../".repeat(path.matches('/').count() + 2)
    )
}

/// Asserts the exact Hugging Face cache layout of `repo_dir` after a pull
/// of `want` (a subset of the files of the repo at `src`): `blobs/` holds
/// exactly the wanted etags with the source's bytes, `snapshots/<commit>/`
/// exactly relative links to them (and their folders), `refs/main` the
/// commit without a newline, and nothing else (no incomplete, sidecar or
/// temp file anywhere).
pub fn assert_cache(repo_dir: &Path, src: &Path, want: &RepoMeta) {
    let blobs = repo_dir.join("blobs");
    let want_blobs: BTreeSet<String> = want.files.values().map(|f| f.etag.clone()).collect();
    assert_eq!(
        listing(&blobs),
        want_blobs,
        "blobs/ of {} must hold exactly the wanted etags (no .incomplete, .parts or temp files)",
        repo_dir.display()
    );
    for (path, f) in &want.files {
        if let Err(e) = same_bytes(&src.join(path), &blobs.join(&f.etag)) {
            panic!("blob of {path}: {e}");
        }
    }
    let refs = fs::read(repo_dir.join("refs/main")).expect("refs/main");
    assert_eq!(
        String::from_utf8_lossy(&refs),
        want.commit,
        "refs/main must be the commit with no trailing newline"
    );
    assert_eq!(
        listing(&repo_dir.join("refs")),
        BTreeSet::from(["main".to_string()])
    );
    assert_eq!(
        listing(&repo_dir.join("snapshots")),
        BTreeSet::from([want.commit.clone()]),
        "one snapshot"
    );
    let snap = repo_dir.join("snapshots").join(&want.commit);
    let mut want_tree = BTreeMap::new();
    for (path, f) in &want.files {
        let parts: Vec<&str> = path.split('/').collect();
        for i in 1..parts.len() {
            want_tree.insert(parts[..i].join("/"), Node::Dir);
        }
        want_tree.insert(path.clone(), Node::Link(link_target(path, &f.etag).into()));
    }
    assert_eq!(
        walk(&snap),
        want_tree,
        "snapshots/{} must hold exactly relative links to the blobs",
        want.commit
    );
    for path in want.files.keys() {
        if let Err(e) = same_bytes(&src.join(path), &snap.join(path)) {
            panic!("{path} through its snapshot link: {e}");
        }
    }
    let top = listing(repo_dir);
    assert_eq!(
        top,
        ["blobs", "refs", "snapshots", "trees"]
            .map(String::from)
            .into(),
        "nothing else in {}",
        repo_dir.display()
    );
    // The listing huggingface_hub keeps, one per commit, naming every file.
    assert_eq!(
        listing(&repo_dir.join("trees")),
        BTreeSet::from([format!("{}.json", want.commit)])
    );
    let tree: serde_json::Value = serde_json::from_slice(
        &fs::read(repo_dir.join("trees").join(format!("{}.json", want.commit))).unwrap(),
    )
    .unwrap();
    let listed: BTreeSet<String> = tree["files"]
        .as_object()
        .expect("trees/<commit>.json has files")
        .keys()
        .cloned()
        .collect();
    assert!(
        want.files.keys().all(|p| listed.contains(p)),
        "trees/{}.json must list every file: {listed:?}",
        want.commit
    );
}

/// Asserts that the summary says every wanted file was downloaded and
/// checked by its hash in this run.
pub fn assert_all_verified(s: &PullJson, want: &RepoMeta) {
    let lfs = want.lfs_count();
    assert_eq!(s.files, want.files.len(), "{s:#?}");
    assert_eq!(s.bytes_total, want.total(), "{s:#?}");
    assert_eq!(s.commit, want.commit, "{s:#?}");
    let v = &s.verification;
    assert!(v.all_verified, "{s:#?}");
    assert_eq!(v.sha256_ok, lfs, "one sha256 check per LFS file: {s:#?}");
    assert_eq!(
        v.git_sha1_ok,
        want.files.len() - lfs,
        "one git sha1 check per regular file: {s:#?}"
    );
    assert_eq!(v.present, 0, "{s:#?}");
}

/// A TCP port on 127.0.0.1 that nothing listens on (bound, then released).
pub fn unused_tcp_port() -> u16 {
    let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

/// The real client's python, or a failure that says how to install it.
pub fn hf_python() -> PathBuf {
    let py = Path::new(HF_VENV).join("bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import huggingface_hub"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} with huggingface_hub is missing: run scripts/test.sh, which installs it",
        HF_VENV
    );
    py
}

/// `snapshot_download(repo, local_files_only=True)` with `HF_HUB_OFFLINE=1`
/// through the real client; returns the path it prints.
pub fn offline_snapshot(env: &PullEnv, repo: &str) -> String {
    let mut c = Command::new(hf_python());
    env.apply(&mut c);
    c.env("HF_HUB_OFFLINE", "1").args([
        "-c",
        &format!(
            "from huggingface_hub import snapshot_download; print(snapshot_download('{repo}', local_files_only=True))"
        ),
    ]);
    let r = run(&mut c, Duration::from_secs(60));
    r.assert_ok("offline snapshot_download");
    r.stdout.trim().to_string()
}
