//! Shared helpers of the integration suite: temp dirs, a model generator,
//! agent processes that die with their guard, command runners with
//! timeouts, tree comparison and journal reading.
//!
//! Every test starts real `xfer` processes (`CARGO_BIN_EXE_xfer`). Tests of
//! one file run in parallel threads, so every helper works on its own temp
//! dir and agents listen on port 0 of a loopback address picked by the test.

#![allow(dead_code)]

pub mod cluster;
pub mod hub;
pub mod netns;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;

/// The agent's default fetch window (`xfer serve --window`).
pub const WINDOW: u64 = 16;
/// Default `--chunk-size`.
pub const DEFAULT_CHUNK: u64 = 4 * MIB;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_xfer")
}

/// A fresh `xfer` command.
pub fn xfer() -> Command {
    let mut c = Command::new(bin());
    // A developer's RUST_LOG or XFER_KEY must not change what tests see.
    c.env_remove("RUST_LOG")
        .env_remove("XFER_KEY")
        .env_remove("XFER_FAULT_CORRUPT_SENDS")
        .stdin(Stdio::null());
    c
}

/// A unique temp dir, removed on drop.
pub fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("xfer-it-{tag}-"))
        .tempdir()
        .expect("temp dir")
}

// ---------------------------------------------------------------------------
// Running commands

/// A finished command.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics with the command's output unless it exited 0.
    pub fn assert_ok(&self, what: &str) -> &Self {
        assert!(self.success(), "{what} failed: {self:#?}");
        self
    }

    /// The JSON document printed on stdout (the last non-empty line).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> T {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_else(|| panic!("no JSON on stdout: {self:#?}"));
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout is not the expected JSON ({e}): {self:#?}"))
    }
}

/// A child process whose stdout and stderr are collected by threads.
pub struct Proc {
    child: Child,
    started: Instant,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
    what: String,
}

fn drain<R: Read + Send + 'static>(r: R) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = BufReader::new(r).read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    })
}

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Proc {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let out = drain(child.stdout.take().unwrap());
        let err = drain(child.stderr.take().unwrap());
        Proc {
            child,
            started: Instant::now(),
            out: Some(out),
            err: Some(err),
            what,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    fn collect(&mut self, status: ExitStatus) -> Run {
        Run {
            status,
            stdout: self
                .out
                .take()
                .map(|h| h.join().unwrap())
                .unwrap_or_default(),
            stderr: self
                .err
                .take()
                .map(|h| h.join().unwrap())
                .unwrap_or_default(),
            elapsed: self.started.elapsed(),
        }
    }

    /// Waits for the process to exit; kills it and panics after `timeout`.
    pub fn wait(mut self, timeout: Duration) -> Run {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return self.collect(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let status = self.child.wait().expect("wait");
                let run = self.collect(status);
                panic!("{} did not finish within {timeout:?}: {run:#?}", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9`, then reap.
    pub fn kill9(mut self) -> Run {
        let _ = self.child.kill();
        let status = self.child.wait().expect("wait");
        self.collect(status)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs a command to completion (at most `timeout`).
pub fn run(cmd: &mut Command, timeout: Duration) -> Run {
    Proc::spawn(cmd).wait(timeout)
}

/// `xfer keygen --out PATH`.
pub fn keygen(path: &Path) {
    run(
        xfer().arg("keygen").arg("--out").arg(path),
        Duration::from_secs(30),
    )
    .assert_ok("xfer keygen");
    assert!(path.is_file());
}

/// A UDP port on 127.0.0.1 that nothing listens on (bound, then released).
pub fn unused_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

// ---------------------------------------------------------------------------
// Agents

/// An `xfer serve` child process; `kill -9`ed when dropped.
pub struct Agent {
    child: Option<Child>,
    /// `IP:PORT` the agent listens on.
    pub addr: String,
    pub root: PathBuf,
    stderr: Arc<Mutex<String>>,
}

impl Agent {
    /// Starts `xfer serve --listen LISTEN --root ROOT --key KEY` and waits
    /// for its `xfer agent listening on ADDR ...` line.
    pub fn start(listen: &str, root: &Path, key: &Path) -> Agent {
        Self::start_with(listen, root, key, &[])
    }

    pub fn start_with(listen: &str, root: &Path, key: &Path, extra: &[&str]) -> Agent {
        Self::start_cmd(listen, root, key, extra, |_| {})
    }

    /// [`Self::start_with`], with `configure` applied to the command first
    /// (to set the agent's environment, e.g. `HF_ENDPOINT`).
    pub fn start_cmd(
        listen: &str,
        root: &Path,
        key: &Path,
        extra: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Agent {
        let mut cmd = xfer();
        configure(&mut cmd);
        let mut child = cmd
            .args(["serve", "--listen", listen, "--root"])
            .arg(root)
            .arg("--key")
            .arg(key)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start xfer serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let sink = stderr.clone();
            let r = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(r).lines() {
                    let Ok(line) = line else { break };
                    let mut s = sink.lock().unwrap();
                    s.push_str(&line);
                    s.push('\n');
                }
            });
        }
        let line = first_line(&mut child, Duration::from_secs(30));
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !line.starts_with("xfer agent listening on ") || fields.len() < 5 {
            std::thread::sleep(Duration::from_millis(200));
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "agent on {listen} did not start: first line {line:?}, stderr:\n{}",
                stderr.lock().unwrap()
            );
        }
        Agent {
            child: Some(child),
            addr: fields[4].to_string(),
            root: root.to_path_buf(),
            stderr,
        }
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// `kill -9` the agent and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Where a model named `name` lands.
    pub fn model_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn staging_dir(&self, name: &str) -> PathBuf {
        self.root.join(".xfer/staging").join(name)
    }

    pub fn journal(&self, name: &str) -> PathBuf {
        self.staging_dir(name).join("journal")
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

// ---------------------------------------------------------------------------
// `xfer push --json`

/// What `xfer push --json` prints.
#[derive(Debug, Deserialize)]
pub struct PushJson {
    pub name: String,
    pub root: String,
    pub files: u64,
    pub bytes_total: u64,
    pub bytes_sent: u64,
    pub source_sent_x: f64,
    pub bytes_skipped: u64,
    pub hash_s: f64,
    pub duration_s: f64,
    pub nodes: Vec<NodeJson>,
}

/// One node of [`PushJson`].
#[derive(Debug, Deserialize, Clone)]
pub struct NodeJson {
    pub addr: String,
    pub ok: bool,
    pub error: Option<String>,
    pub root: Option<String>,
    pub bytes_sent: u64,
    pub bytes_skipped: u64,
    pub from_source: u64,
    pub from_peers: u64,
    pub dropped_peers: Vec<String>,
    pub corrupt_chunks: u64,
    pub duration_s: f64,
}

impl PushJson {
    pub fn node(&self, addr: &str) -> &NodeJson {
        self.nodes
            .iter()
            .find(|n| n.addr == addr)
            .unwrap_or_else(|| panic!("no node {addr} in {self:#?}"))
    }
}

/// The command line of `xfer push SRC --to A,B --key KEY --json EXTRA...`.
pub fn push_cmd(src: &Path, to: &[&str], key: &Path, extra: &[&str]) -> Command {
    let mut c = xfer();
    // Keep the pusher's hash cache inside the test's temp dir.
    if let Some(parent) = src.parent() {
        c.env("XDG_CACHE_HOME", parent.join("xdg-cache"));
    }
    c.arg("push")
        .arg(src)
        .arg("--to")
        .arg(to.join(","))
        .arg("--key")
        .arg(key)
        .arg("--json")
        .args(extra);
    c
}

/// Runs a push (at most 120 s).
pub fn push(src: &Path, to: &[&str], key: &Path, extra: &[&str]) -> Run {
    run(&mut push_cmd(src, to, key, extra), Duration::from_secs(120))
}

/// Runs a push that must succeed and returns its summary.
pub fn push_ok(src: &Path, to: &[&str], key: &Path, extra: &[&str]) -> PushJson {
    let r = push(src, to, key, extra);
    r.assert_ok("xfer push");
    let s: PushJson = r.json();
    assert!(
        s.nodes.iter().all(|n| n.ok && n.error.is_none()),
        "a node failed although push exited 0: {s:#?}"
    );
    s
}

/// `xfer manifest DIR --json`'s root.
pub fn manifest_root(dir: &Path) -> String {
    let r = run(
        xfer().arg("manifest").arg(dir).arg("--json"),
        Duration::from_secs(60),
    );
    r.assert_ok("xfer manifest");
    let v: serde_json::Value = r.json();
    v["root"]
        .as_str()
        .expect("root in manifest JSON")
        .to_string()
}

/// `xfer verify DIR --json`.
pub fn verify(dir: &Path) -> (Run, serde_json::Value) {
    let r = run(
        xfer().arg("verify").arg(dir).arg("--json"),
        Duration::from_secs(60),
    );
    let v = if r.stdout.trim().is_empty() {
        serde_json::Value::Null
    } else {
        r.json()
    };
    (r, v)
}

/// The manifest of a source tree, as the pusher computes it.
pub fn scan(dir: &Path, chunk_size: u64) -> xfer_proto::manifest::Manifest {
    xfer::store::scan::scan(dir, chunk_size, &|_| {})
        .expect("scan")
        .manifest
}

// ---------------------------------------------------------------------------
// Model trees

/// Pseudo-random, incompressible bytes: BLAKE3's XOF keyed by `seed` and `tag`.
pub fn random_bytes(seed: u64, tag: &str, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.update(tag.as_bytes());
    h.finalize_xof().fill(&mut out);
    out
}

/// Writes `len` pseudo-random bytes to `path` in 1 MiB pieces.
pub fn write_random(path: &Path, len: u64, seed: u64) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    let mut h = blake3::Hasher::new();
    h.update(&seed.to_le_bytes());
    h.update(path.file_name().unwrap().as_encoded_bytes());
    let mut xof = h.finalize_xof();
    let mut f = std::io::BufWriter::new(fs::File::create(path).unwrap());
    let mut buf = vec![0u8; MIB as usize];
    let mut left = len;
    while left > 0 {
        let n = left.min(MIB) as usize;
        xof.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.into_inner().unwrap().sync_all().unwrap();
}

/// Paths of the generated model.
pub const SHARD1: &str = "model-00001-of-00002.safetensors";
pub const SHARD2: &str = "model-00002-of-00002.safetensors";
pub const BLOB: &str = "blobs/x";
pub const LINK: &str = "snapshots/c1/model.safetensors";
pub const LINK_TARGET: &str = "../../blobs/x";
pub const NESTED: &str = "nested/deeper/tokenizer.bin";
pub const EMPTY_FILE: &str = "empty.txt";
pub const EMPTY_DIR: &str = "empty_dir";
pub const EXEC: &str = "run.sh";
pub const CONFIG: &str = "config.json";

/// Writes a model-like tree of about `total` bytes into `dir` (created):
/// two shards, a blob with an in-tree symlink to it
/// (`snapshots/c1/model.safetensors -> ../../blobs/x`), `config.json`, a
/// nested folder, an executable script, an empty file and an empty folder.
/// File sizes are deliberately not multiples of any chunk size.
pub fn gen_model(dir: &Path, total: u64, seed: u64) {
    gen_model_opts(dir, total, seed, true)
}

/// [`gen_model`], optionally without the empty folder.
pub fn gen_model_opts(dir: &Path, total: u64, seed: u64, empty_dir: bool) {
    fs::create_dir_all(dir).unwrap();
    let nested = 100_003;
    let blob = total * 15 / 100 + 7;
    let shard1 = total * 50 / 100 + 1234;
    let shard2 = total
        .saturating_sub(nested + blob + shard1 + 2000)
        .max(4099);
    write_random(&dir.join(SHARD1), shard1, seed);
    write_random(&dir.join(SHARD2), shard2, seed);
    write_random(&dir.join(BLOB), blob, seed);
    write_random(&dir.join(NESTED), nested, seed);
    fs::write(
        dir.join(CONFIG),
        format!(
            "{{\"architectures\": [\"TestForCausalLM\"], \"hidden_size\": 4096, \"seed\": {seed}}}\n"
        ),
    )
    .unwrap();
    fs::write(dir.join(EXEC), "#!/bin/sh\necho hello\n").unwrap();
    fs::set_permissions(dir.join(EXEC), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(dir.join(EMPTY_FILE), b"").unwrap();
    if empty_dir {
        fs::create_dir_all(dir.join(EMPTY_DIR)).unwrap();
    }
    fs::create_dir_all(dir.join("snapshots/c1")).unwrap();
    std::os::unix::fs::symlink(LINK_TARGET, dir.join(LINK)).unwrap();
}

/// Total bytes of the regular files under `dir` (symlinks not followed).
pub fn tree_bytes(dir: &Path) -> u64 {
    walk(dir)
        .values()
        .map(|n| match n {
            Node::File { len, .. } => *len,
            _ => 0,
        })
        .sum()
}

/// Overwrites `len` bytes at `offset` of an existing file with new random
/// bytes (size unchanged).
pub fn scribble(path: &Path, offset: u64, len: usize, seed: u64) {
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&random_bytes(seed, "scribble", len), offset)
        .unwrap();
    f.sync_all().unwrap();
}

/// Flips one byte of `path` at `offset` (XOR 0x5a); with `keep_mtime`, puts
/// the file's mtime back, as silent bit rot would leave it.
pub fn flip_byte(path: &Path, offset: u64, keep_mtime: bool) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0x5a;
    f.write_all_at(&b, offset).unwrap();
    if keep_mtime {
        f.set_modified(mtime).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    if keep_mtime {
        assert_eq!(fs::metadata(path).unwrap().modified().unwrap(), mtime);
    }
}

/// Flips one byte of `path` at `offset` and puts its mtime back.
pub fn flip_byte_keep_mtime(path: &Path, offset: u64) {
    flip_byte(path, offset, true)
}

/// One entry of a walked tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    File { len: u64, exec: bool },
    Link(PathBuf),
    Dir,
}

/// Every entry under `root` by relative path (symlinks not followed).
pub fn walk(root: &Path) -> BTreeMap<String, Node> {
    fn go(root: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                out.insert(rel, Node::Link(fs::read_link(&p).unwrap()));
            } else if m.is_dir() {
                out.insert(rel, Node::Dir);
                go(root, &p, out);
            } else {
                out.insert(
                    rel,
                    Node::File {
                        len: m.len(),
                        exec: m.permissions().mode() & 0o111 != 0,
                    },
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    go(root, root, &mut out);
    out
}

/// Names directly inside `dir`.
pub fn listing(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Compares two files byte by byte; on a difference, says where.
pub fn same_bytes(a: &Path, b: &Path) -> Result<(), String> {
    let (fa, fb) = (
        fs::File::open(a).map_err(|e| format!("{}: {e}", a.display()))?,
        fs::File::open(b).map_err(|e| format!("{}: {e}", b.display()))?,
    );
    let (la, lb) = (fa.metadata().unwrap().len(), fb.metadata().unwrap().len());
    if la != lb {
        return Err(format!(
            "{} is {la} bytes, {} is {lb}",
            a.display(),
            b.display()
        ));
    }
    let mut ra = BufReader::with_capacity(MIB as usize, fa);
    let mut rb = BufReader::with_capacity(MIB as usize, fb);
    let (mut ba, mut bb) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    let mut offset = 0u64;
    while offset < la {
        let n = (la - offset).min(MIB) as usize;
        ra.read_exact(&mut ba[..n]).unwrap();
        rb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            let i = (0..n).find(|&i| ba[i] != bb[i]).unwrap();
            return Err(format!(
                "{} and {} differ at byte {}",
                a.display(),
                b.display(),
                offset + i as u64
            ));
        }
        offset += n as u64;
    }
    Ok(())
}

/// Asserts that `dst` is an exact copy of `src`: the same entries (files,
/// symlinks kept as symlinks with the same target, empty dirs, empty files),
/// the same executable bits and the same bytes.
pub fn assert_same_tree(src: &Path, dst: &Path) {
    let (a, b) = (walk(src), walk(dst));
    let ka: Vec<&String> = a.keys().collect();
    let kb: Vec<&String> = b.keys().collect();
    assert_eq!(
        ka,
        kb,
        "entries of {} and {} differ",
        src.display(),
        dst.display()
    );
    for (rel, na) in &a {
        let nb = &b[rel];
        assert_eq!(na, nb, "{rel}: kind, size, mode or link target differs");
        if let Node::File { .. } = na {
            if let Err(e) = same_bytes(&src.join(rel), &dst.join(rel)) {
                panic!("{rel}: {e}");
            }
        }
    }
}

/// Asserts that every regular file present under `model_dir` (if it exists)
/// is a complete, byte-exact copy of the same path under `src`: a file may
/// be missing, but never wrong or partial.
pub fn assert_no_wrong_files(src: &Path, model_dir: &Path) {
    if !model_dir.exists() {
        return;
    }
    for (rel, node) in walk(model_dir) {
        match node {
            Node::File { .. } => {
                if let Err(e) = same_bytes(&src.join(&rel), &model_dir.join(&rel)) {
                    panic!("{rel} is under its final path with wrong content: {e}");
                }
            }
            Node::Link(t) => {
                assert_eq!(
                    fs::read_link(src.join(&rel)).ok(),
                    Some(t.clone()),
                    "{rel} is a symlink to {t:?} that the source does not have"
                );
            }
            Node::Dir => assert!(src.join(&rel).is_dir(), "{rel}: unexpected directory"),
        }
    }
}

// ---------------------------------------------------------------------------
// The agent's chunk journal

/// Reads an agent's journal (`<root>/.xfer/staging/<name>/journal`: a
/// 56-byte header, then 12-byte records of three little-endian u32: tag
/// 1 = chunk(file, index), 2 = file done(file), 3 = synced(n)) and returns
/// the bytes of the distinct chunks it records as held, with `manifest` the
/// pushed tree's manifest. A missing journal holds nothing.
pub fn journal_held_bytes(journal: &Path, manifest: &xfer_proto::manifest::Manifest) -> u64 {
    let Ok(bytes) = fs::read(journal) else {
        return 0;
    };
    if bytes.len() < 56 {
        return 0;
    }
    let files: Vec<&xfer_proto::manifest::FileEntry> = manifest.files().collect();
    let cs = manifest.chunk_size;
    let chunk_len = |f: usize, i: u64| cs.min(files[f].size.saturating_sub(i * cs));
    let mut held: BTreeSet<(usize, u64)> = BTreeSet::new();
    for r in bytes[56..].chunks_exact(12) {
        let w = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().unwrap());
        match w(0) {
            1 if (w(4) as usize) < files.len() => {
                held.insert((w(4) as usize, w(8) as u64));
            }
            2 if (w(4) as usize) < files.len() => {
                let f = w(4) as usize;
                for i in 0..files[f].chunks.len() as u64 {
                    held.insert((f, i));
                }
            }
            _ => {}
        }
    }
    held.iter().map(|&(f, i)| chunk_len(f, i)).sum()
}

/// Polls `cond` every 20 ms until it holds; panics with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// A small disk

/// A tmpfs mounted for one test, unmounted on drop.
pub struct Tmpfs {
    pub dir: PathBuf,
}

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
        })
    }

    pub fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "remount failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        unmount(&self.dir);
    }
}

/// A small filesystem for one test: a loop-mounted ext4 image (a real block
/// allocator, journal and reserved blocks) where `mkfs.ext4` and loop
/// devices work, else a tmpfs. Unmounted on drop.
pub struct SmallDisk {
    pub dir: PathBuf,
    /// `loop-ext4` or `tmpfs`.
    pub kind: &'static str,
    _tmpfs: Option<Tmpfs>,
}

impl SmallDisk {
    /// Mounts `size_mib` MiB at `dir`; the ext4 image lives next to `dir`.
    pub fn mount(dir: &Path, size_mib: u64) -> Result<SmallDisk, String> {
        match Self::loop_ext4(dir, size_mib) {
            Ok(d) => Ok(d),
            Err(why) => {
                eprintln!("note: no loop-mounted ext4 here ({why}); using a tmpfs");
                let fs = Tmpfs::mount(dir, &format!("{size_mib}m"))?;
                Ok(SmallDisk {
                    dir: dir.to_path_buf(),
                    kind: "tmpfs",
                    _tmpfs: Some(fs),
                })
            }
        }
    }

    fn loop_ext4(dir: &Path, size_mib: u64) -> Result<SmallDisk, String> {
        let image = dir.with_extension("ext4");
        let sh = |cmd: &mut Command| -> Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                return Ok(());
            }
            Err(format!(
                "{cmd:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        };
        fs::File::create(&image)
            .and_then(|f| f.set_len(size_mib * MIB))
            .map_err(|e| format!("cannot create {}: {e}", image.display()))?;
        sh(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))?;
        fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        sh(Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&image)
            .arg(dir))?;
        Ok(SmallDisk {
            dir: dir.to_path_buf(),
            kind: "loop-ext4",
            _tmpfs: None,
        })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        if self._tmpfs.is_some() {
            return; // Tmpfs unmounts itself.
        }
        unmount(&self.dir);
    }
}

/// Another writer takes every free byte of the filesystem holding `path`:
/// appends to `path` until the disk is full. Returns the bytes written.
pub fn fill_disk(path: &Path) -> u64 {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let block = vec![0xa5u8; 64 * 1024];
    let mut written = 0;
    while f.write_all(&block).is_ok() {
        written += block.len() as u64;
    }
    let _ = f.sync_all();
    written
}

/// `umount DIR`, lazily if it is busy.
fn unmount(dir: &Path) {
    let ok = Command::new("umount")
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let _ = Command::new("umount").arg("-l").arg(dir).status();
    }
}

/// Mounts a tmpfs or explains why the test cannot run here.
pub fn tmpfs_or_skip(dir: &Path, size: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(dir, size) {
        Ok(fs) => Some(fs),
        Err(why) => {
            eprintln!("SKIPPED: this test needs a tmpfs mount (run as root): {why}");
            None
        }
    }
}

/// The first line `child` prints on stdout (empty if none within
/// `within`); the rest is drained so the child never writes into a closed
/// pipe.
pub fn first_line(child: &mut Child, within: Duration) -> String {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("stdout is piped");
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut first = String::new();
        let _ = r.read_line(&mut first);
        let _ = tx.send(first);
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    rx.recv_timeout(within).unwrap_or_default()
}

/// `short`, or `long` when `XFER_TORTURE=long` (the torture suite's long
/// mode, `scripts/torture.sh long`).
pub fn sized<T>(short: T, long: T) -> T {
    if std::env::var("XFER_TORTURE").as_deref() == Ok("long") {
        long
    } else {
        short
    }
}
