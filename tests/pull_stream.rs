//! `xfer pull --to` streams: chunks reach the agents while their file is
//! still downloading, and no agent shows a file under its final name that
//! the Hub's hash did not confirm. The Hub look-alike parks a download
//! half-way (`--fault hold:PATH:GATE`) so each test can look at the swarm
//! mid-file, at an event rather than after a delay.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::hub::*;
use common::run::Proc;
use common::wait_until;
use common::*;

use xfer::flow::pull_fanout::PullFanoutSummary as FanoutJson;

const BIG: &str = "model-00001-of-00002.safetensors";
const BIG_SIZE: u64 = 8 * MIB + 4321;
const NAME: &str = "models--acme--stream";

struct Swarm {
    t: tempfile::TempDir,
    server: HubServer,
    src: PathBuf,
    meta: RepoMeta,
    key: PathBuf,
    agents: Vec<Agent>,
    env: PullEnv,
    /// Created to let the parked download go on.
    gate: PathBuf,
}

impl Swarm {
    /// A repo with one large shard, a Hub look-alike with `faults`, and
    /// `n` agents on 127.0.0.x.
    fn start(tag: &str, n: usize, faults: &[String]) -> Swarm {
        let t = tempdir(tag);
        let repos = t.path().join("repos");
        let src = gen_repo(
            &repos,
            "acme/stream",
            31,
            &[
                ("config.json", 500),
                ("tokenizer.json", 120_000),
                (BIG, BIG_SIZE),
                ("model-00002-of-00002.safetensors", 2 * MIB + 5),
            ],
        );
        let gate = t.path().join("gate");
        let mut args: Vec<String> = vec!["--rate".into(), "20000000".into()];
        for f in faults {
            args.push("--fault".into());
            args.push(f.replace("GATE", gate.to_str().unwrap()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let server = HubServer::start(&repos, &args);
        let meta = server.repo("acme/stream");
        let key = t.path().join("cluster.key");
        keygen(&key);
        let agents = (0..n)
            .map(|i| {
                let root = t.path().join(format!("node{i}/hub"));
                std::fs::create_dir_all(&root).unwrap();
                Agent::start(
                    &format!("127.0.0.{}:{}", 2 + i, unused_udp_port()),
                    &root,
                    &key,
                )
            })
            .collect();
        let env = PullEnv::new(&server.endpoint(), t.path());
        Swarm {
            t,
            server,
            src,
            meta,
            key,
            agents,
            env,
            gate,
        }
    }

    fn pull_cmd(&self) -> std::process::Command {
        let to: Vec<&str> = self.agents.iter().map(|a| a.addr.as_str()).collect();
        self.env.cmd(
            "acme/stream",
            &[
                "--connections",
                "2",
                "--part-size",
                "1MiB",
                "--chunk-size",
                "1MiB",
                "--to",
                &to.join(","),
                "--key",
                self.key.to_str().unwrap(),
            ],
        )
    }

    /// Where `path`'s blob lands on an agent.
    fn blob_on(&self, agent: &Agent, path: &str) -> PathBuf {
        agent
            .model_dir(NAME)
            .join("blobs")
            .join(&self.meta.files[path].etag)
    }

    /// The most chunk records (tag 1) an agent's staging journal holds for
    /// any one file. Only the parked file has more than 3 chunks, so 4 of
    /// one file are its first half, whatever place the draft gives it and
    /// whatever the small files around it do.
    fn most_staged_of_one_file(agent: &Agent) -> usize {
        let Ok(bytes) = std::fs::read(agent.journal(NAME)) else {
            return 0;
        };
        let mut per_file =
            std::collections::BTreeMap::<u32, std::collections::BTreeSet<u32>>::new();
        for r in bytes.get(56..).unwrap_or_default().chunks_exact(12) {
            let word = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().unwrap());
            if word(0) == 1 {
                per_file.entry(word(4)).or_default().insert(word(8));
            }
        }
        per_file.values().map(|c| c.len()).max().unwrap_or(0)
    }

    /// Waits until every agent has staged (verified) the parked file's
    /// first half: its 4 chunks before the Hub look-alike's hold.
    fn wait_parked_half(&self) {
        for a in &self.agents {
            wait_until(
                &format!("{} to stage the parked file's first half", a.addr),
                Duration::from_secs(60),
                || Self::most_staged_of_one_file(a) >= 4,
            );
        }
    }

    fn release(&self) {
        std::fs::write(&self.gate, b"go").unwrap();
    }

    /// Every agent holds the same verified cache as the source.
    fn assert_identical_caches(&self, s: &FanoutJson) {
        let source = self.env.repo_dir("acme/stream");
        assert_cache(&source, &self.src, &self.meta);
        let want = walk(&source);
        for (a, n) in self.agents.iter().zip(&s.nodes) {
            assert!(n.ok, "{n:#?}");
            assert_eq!(n.root, Some(s.root), "{n:#?}");
            let held = a.model_dir(NAME);
            assert_eq!(walk(&held), want, "{} differs from the source", a.addr);
            assert_cache(&held, &self.src, &self.meta);
        }
    }
}

/// Watches every agent's final blob of `path` until stopped: whenever it
/// exists, its sha256 must be the Hub's. Returns what it saw wrong.
fn watch_blobs(
    paths: Vec<PathBuf>,
    sha256: String,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut wrong = Vec::new();
        let mut checked = 0;
        while !stop.load(Ordering::SeqCst) || checked == 0 {
            for p in &paths {
                if let Ok(bytes) = std::fs::read(p) {
                    let got = hex::encode(sha2_256(&bytes));
                    if got != sha256 {
                        wrong.push(format!("{} showed {got}", p.display()));
                    }
                }
            }
            checked += 1;
            std::thread::yield_now();
        }
        wrong
    })
}

fn sha2_256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}

/// The parked file's first chunks are on every agent, verified, before
/// the file finished downloading; none shows it under its final name;
/// released, every agent ends with the source's cache, which the real
/// `huggingface_hub` loads offline.
#[test]
fn chunks_reach_every_agent_while_their_file_downloads() {
    hf_python();
    let w = Swarm::start("stream-mid", 2, &[format!("hold:{BIG}:GATE")]);
    let pull = Proc::spawn(&mut w.pull_cmd());
    // The big file's first half: 4 MiB of 8 is parked.
    w.wait_parked_half();
    for a in &w.agents {
        assert!(
            !w.blob_on(a, BIG).exists(),
            "{}: the parked file is under its final name before its sha256 matched",
            a.addr
        );
    }
    assert!(
        !w.env
            .repo_dir("acme/stream")
            .join("blobs")
            .join(&w.meta.files[BIG].etag)
            .exists(),
        "the source has not finished the parked file either"
    );
    w.release();
    let r = pull.wait(Duration::from_secs(120));
    r.assert_ok("xfer pull --to");
    let s: FanoutJson = r.json();
    assert_all_verified(&s.pull, &w.meta);
    w.assert_identical_caches(&s);
    // The stream carried the contents; the final round only the rest.
    for n in &s.streamed {
        assert!(n.ok, "{n:#?}");
        assert!(
            n.from_source + n.from_peers >= w.meta.total() - 1000,
            "{n:#?}"
        );
    }
    // Each chunk left the source about once; the agents relayed the rest.
    let from_source: u64 = s.streamed.iter().map(|n| n.bytes_sent).sum();
    assert!(
        from_source * 10 <= w.meta.total() * 13,
        "the source sent {from_source} bytes of {}: {s:#?}",
        w.meta.total()
    );
    let final_bytes: u64 = s.nodes.iter().map(|n| n.bytes_sent).sum();
    assert!(
        final_bytes < MIB,
        "the final round re-sent contents: {s:#?}"
    );
    for a in &w.agents {
        let node_env = w.env.clone().with_cache(&a.root);
        let snap = offline_snapshot(&node_env, "acme/stream");
        assert_eq!(
            Path::new(&snap),
            a.model_dir(NAME).join("snapshots").join(&w.meta.commit)
        );
    }
    let _ = &w.server;
    let _ = &w.t;
}

/// A file whose body is corrupted once: its streamed chunks are withdrawn
/// on every agent, the download again flows, and no agent ever shows the
/// bad file under its final name (a watcher reads it whenever it exists).
#[test]
fn a_corrupt_once_file_is_withdrawn_and_never_placed_bad() {
    let w = Swarm::start("stream-corrupt-once", 3, &[format!("corrupt-once:{BIG}")]);
    let paths = w.agents.iter().map(|a| w.blob_on(a, BIG)).collect();
    let sha = w.meta.files[BIG].sha256.clone().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_blobs(paths, sha, stop.clone());
    let r = Proc::spawn(&mut w.pull_cmd()).wait(Duration::from_secs(120));
    stop.store(true, Ordering::SeqCst);
    let wrong = watcher.join().unwrap();
    r.assert_ok("xfer pull --to");
    assert!(wrong.is_empty(), "a bad file was visible: {wrong:?}");
    let s: FanoutJson = r.json();
    assert_eq!(s.pull.verification.recovered, 1, "{s:#?}");
    w.assert_identical_caches(&s);
}

/// A file corrupted on every download: the pull fails loudly, and no
/// agent has it, under its final name, its snapshot name or at all in its
/// cache. The files that did verify may stand in the snapshot (a receiver
/// places each name with its verified blob, as `huggingface_hub` does), but
/// no name leads to a missing or unverified blob.
#[test]
fn a_corrupt_always_file_fails_the_pull_and_reaches_no_agent() {
    let w = Swarm::start("stream-corrupt-always", 2, &[format!("corrupt:{BIG}")]);
    let r = Proc::spawn(&mut w.pull_cmd()).wait(Duration::from_secs(120));
    assert!(!r.status.success(), "{r:#?}");
    assert!(r.stderr.contains("sha256"), "{}", r.stderr);
    for a in &w.agents {
        assert!(!w.blob_on(a, BIG).exists(), "{} has the bad file", a.addr);
        let snap = a.model_dir(NAME).join("snapshots").join(&w.meta.commit);
        assert!(
            std::fs::symlink_metadata(snap.join(BIG)).is_err(),
            "{}: the bad file's snapshot name exists",
            a.addr
        );
        for e in std::fs::read_dir(&snap).into_iter().flatten().flatten() {
            let sha = std::fs::read(e.path()).map(|b| hex::encode(sha2_256(&b)));
            let name = e.file_name().to_string_lossy().to_string();
            let want = w.meta.files.get(&name).and_then(|f| f.sha256.clone());
            match want {
                Some(want) => assert_eq!(sha.ok(), Some(want), "{}: {name}", a.addr),
                None => assert!(sha.is_ok(), "{}: {name} leads nowhere", a.addr),
            }
        }
    }
}

/// 429s and 500s from the Hub while streaming are retried; the agents end
/// complete and identical.
#[test]
fn hub_errors_while_streaming_are_recovered() {
    let w = Swarm::start(
        "stream-429",
        2,
        &["429:2:0.2".to_string(), "500:2".to_string()],
    );
    let r = Proc::spawn(&mut w.pull_cmd()).wait(Duration::from_secs(120));
    r.assert_ok("xfer pull --to");
    let s: FanoutJson = r.json();
    assert!(s.pull.retries >= 4, "{s:#?}");
    w.assert_identical_caches(&s);
}

/// `kill -9` of the puller mid-file: the re-run downloads only what was
/// not written (at most the parts in flight again), and the agents keep
/// the chunks they had verified (the source sends less than the whole).
#[test]
fn a_killed_puller_resumes_and_agents_keep_their_chunks() {
    let w = Swarm::start("stream-kill-puller", 2, &[format!("hold:{BIG}:GATE")]);
    let pull = Proc::spawn(&mut w.pull_cmd());
    w.wait_parked_half();
    let _ = pull.kill9();
    w.release();
    let r = Proc::spawn(&mut w.pull_cmd()).wait(Duration::from_secs(120));
    r.assert_ok("xfer pull --to (re-run)");
    let s: FanoutJson = r.json();
    // Half the parked file was written before the kill; of the rest, a
    // part per connection may be fetched again.
    let bound = BIG_SIZE - BIG_SIZE / 2 + 2 * 2 * MIB + 2 * MIB + 200_000;
    assert!(
        s.pull.bytes_downloaded <= bound,
        "downloaded {} again, more than the {bound} not yet written: {s:#?}",
        s.pull.bytes_downloaded
    );
    assert!(s.pull.bytes_resumed > 0, "{s:#?}");
    // Each agent had staged (and verified) at least the parked file's
    // first chunks: the re-run's stream brings it less than the whole.
    for n in &s.streamed {
        let got = n.from_source + n.from_peers;
        assert!(
            got + 3 * MIB <= w.meta.total(),
            "{}: received {got} of {} again: its staged chunks were not kept: {s:#?}",
            n.addr,
            w.meta.total()
        );
    }
    w.assert_identical_caches(&s);
}

/// `kill -9` of one agent mid-stream, restarted at once: the source offers
/// it the stream again, it resumes from its journal (it receives less than
/// the whole), the pull completes, and nothing is downloaded twice.
#[test]
fn a_killed_agent_restarts_and_the_pull_completes() {
    let mut w = Swarm::start("stream-kill-agent", 2, &[format!("hold:{BIG}:GATE")]);
    let pull = Proc::spawn(&mut w.pull_cmd());
    w.wait_parked_half();
    let (addr, root) = (w.agents[1].addr.clone(), w.agents[1].root.clone());
    w.agents[1].kill9();
    w.agents[1] = Agent::start(&addr, &root, &w.key);
    w.release();
    let r = pull.wait(Duration::from_secs(120));
    r.assert_ok("xfer pull --to");
    let s: FanoutJson = r.json();
    assert_eq!(s.pull.bytes_downloaded, w.meta.total(), "{s:#?}");
    let back = &s.streamed[1];
    assert!(
        back.ok,
        "the restarted agent finished the stream: {back:#?}"
    );
    let got = back.from_source + back.from_peers;
    assert!(
        got + 3 * MIB <= w.meta.total(),
        "the restarted agent received {got} of {}: it did not resume from its journal: {s:#?}",
        w.meta.total()
    );
    w.assert_identical_caches(&s);
}
