//! The integrity findings of issue 30, each performed with real agents:
//! - an update of a complete model whose source dies mid-way leaves it
//!   `replacing`, and the launch gate refuses it, before and after an
//!   agent restart, until the update is run again;
//! - a node credential cannot replace a model the operator delivered;
//! - a draft offered under an id a peer chose (the root of the real
//!   model) does not make the next push take its bytes as held;
//! - a draft listing that claims a terabyte is refused before anything is
//!   built for it, with the agent's memory bounded;
//! - a source that floods draft events and fails every chunk request
//!   raises neither the agent's memory nor its log without bound.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::*;
use xfer::config::auth::Credential;
use xfer::transport::quic::{client_endpoint, connect, read_frame, write_frame};
use xfer::transport::rdma::link::Offer;
use xfer::transport::serve::{serve, Serving};
use xfer::transport::ChunkReader;
use xfer_proto::admin::{AdminReply, AdminRequest, ModelState};
use xfer_proto::chunkset::ChunkMap;
use xfer_proto::draft::{Draft, DraftEvent, DraftListing};
use xfer_proto::hash::{self, Hash};
use xfer_proto::hello::{Hello, Service};
use xfer_proto::launch::{LaunchReply, LaunchRequest, PreflightRequest, WeightFacts};
use xfer_proto::manifest::ChunkId;
use xfer_proto::names::ModelName;
use xfer_proto::relpath::RelPath;
use xfer_proto::transfer::TransferMsg;

const CS: u64 = 64 * KIB;

/// The model `name`'s state in the agent's status.
fn state_of(cred: &Credential, agent: &Agent, name: &str) -> Option<ModelState> {
    match ask_admin(cred, "b", agent, &AdminRequest::Status) {
        AdminReply::Status(s) => s.models.iter().find(|m| m.name == name).map(|m| m.state),
        other => panic!("status: {other:?}"),
    }
}

/// The launch gate's weights row for `<root>/<name>`: what the operator's
/// preflight reads.
fn gate(cred: &Credential, agent: &Agent, name: &str) -> WeightFacts {
    let req = LaunchRequest::Preflight(Box::new(PreflightRequest {
        node: "b".parse().unwrap(),
        fabric_if: "lo".into(),
        fabric_ip: "127.0.0.1".parse().unwrap(),
        model_path: agent.model_dir(name).display().to_string(),
        revision: None,
        ports: Vec::new(),
        listen_port: None,
        peers: Vec::new(),
        window_ms: 0,
        versions: Vec::new(),
        rdma: None,
        image: None,
        resolve: Vec::new(),
        loader_link: false,
    }));
    match ask_launch(cred, "b", agent, &req) {
        LaunchReply::PreflightReport(f) => f.weights,
        other => panic!("preflight: {other:?}"),
    }
}

fn passes(w: &WeightFacts) -> bool {
    w.problems.is_empty() && w.state == Some(ModelState::Complete)
}

/// `dir/name` with `weights.bin` (seeded) and `config.json`, plus
/// `z-extra.bin` of `extra` bytes when nonzero (sorted last, so fetched
/// after weights.bin).
fn model(dir: &Path, name: &str, seed: u64, extra: u64) -> PathBuf {
    let m = dir.join(name);
    std::fs::create_dir_all(&m).unwrap();
    write_random(&m.join("weights.bin"), 4 * MIB, seed);
    std::fs::write(m.join("config.json"), b"{\"layers\": 2}\n").unwrap();
    if extra > 0 {
        write_random(&m.join("z-extra.bin"), extra, seed + 1);
    }
    m
}

#[test]
fn a_killed_update_leaves_the_model_replacing_and_the_gate_refuses_it() {
    let t = tempdir("integrity-update");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let root = t.path().join("rb");
    let mut b = Agent::start("127.0.0.151:0", &root, &key);
    let v1 = model(&t.path().join("v1"), "legit", 1, 0);
    let v2 = model(&t.path().join("v2"), "legit", 2, 8 * MIB);
    let s = push_ok(&v1, &[&b.addr], &key, &[]);
    let v1_root = s.nodes[0].root.unwrap();
    assert!(passes(&gate(&cred, &b, "legit")));

    // The update, from a source that serves v2's weights.bin and
    // config.json but never z-extra.bin, dies once weights.bin is in
    // place: whatever order the chunks go in, the update cannot complete.
    let placed = b.model_dir("legit").join("weights.bin");
    let v2_weights = std::fs::read(v2.join("weights.bin")).unwrap();
    let addr: SocketAddr = b.addr.parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let src = rt.block_on(withholding_source(
        &cred,
        addr,
        &v2,
        "z-extra.bin",
        released.clone(),
    ));
    wait_until(
        "v2's weights.bin to be placed",
        Duration::from_secs(60),
        || std::fs::read(&placed).is_ok_and(|d| d == v2_weights),
    );
    assert!(
        !b.model_dir("legit").join("z-extra.bin").exists(),
        "the withheld file was placed"
    );
    // The source dies without a word, as a `kill -9`ed push does.
    drop(src);
    released.store(true, std::sync::atomic::Ordering::Relaxed);
    rt.shutdown_background();

    // Neither v1 nor v2 is complete, and the gate says so.
    let w = gate(&cred, &b, "legit");
    assert!(!passes(&w), "the gate passed a half-replaced model: {w:?}");
    assert_ne!(state_of(&cred, &b, "legit"), Some(ModelState::Complete));
    // After an agent restart too: the record says `replacing`.
    b.kill9();
    let b = Agent::start("127.0.0.151:0", &root, &key);
    assert_eq!(state_of(&cred, &b, "legit"), Some(ModelState::Replacing));
    let w = gate(&cred, &b, "legit");
    assert!(!passes(&w), "after a restart the gate passed: {w:?}");
    assert!(
        w.problems.iter().any(|p| p.contains("replacing")),
        "{:?}",
        w.problems
    );

    // The update run again completes it, with v2's root.
    let s = push_ok(&v2, &[&b.addr], &key, &[]);
    let v2_root = s.nodes[0].root.unwrap();
    assert_ne!(v1_root, v2_root);
    assert_same_tree(&v2, &b.model_dir("legit"));
    let w = gate(&cred, &b, "legit");
    assert!(passes(&w), "{w:?}");
    assert_eq!(w.root, Some(v2_root));

    // A file changed behind the store's back fails the gate's stamps.
    flip_byte(&b.model_dir("legit").join("config.json"), 3, false);
    let w = gate(&cred, &b, "legit");
    assert!(
        w.problems.iter().any(|p| p.contains("config.json")),
        "{:?}",
        w.problems
    );
}

/// `xfer ca init` and the credentials issued from it, via the CLI.
fn issue_all(t: &Path, names: &[(&str, &str)]) -> Vec<PathBuf> {
    let ca = t.join("ca");
    run(
        xfer().args(["ca", "init", "--dir"]).arg(&ca),
        Duration::from_secs(20),
    )
    .assert_ok("xfer ca init");
    names
        .iter()
        .map(|(name, role)| {
            let out = t.join(format!("{name}.cred"));
            run(
                xfer()
                    .args(["ca", "issue", name, "--role", role, "--dir"])
                    .arg(&ca)
                    .arg("--out")
                    .arg(&out),
                Duration::from_secs(20),
            )
            .assert_ok("xfer ca issue");
            out
        })
        .collect()
}

#[test]
fn a_node_credential_cannot_replace_a_model_the_operator_delivered() {
    let t = tempdir("integrity-scope");
    let creds = issue_all(
        t.path(),
        &[("a", "node"), ("b", "node"), ("op", "operator")],
    );
    let (a_cred, b_cred, op) = (&creds[0], &creds[1], &creds[2]);
    let b = Agent::start("127.0.0.152:0", &t.path().join("rb"), b_cred);
    let legit = model(&t.path().join("v1"), "legit4", 3, 0);
    push_ok(&legit, &[&b.addr], op, &[]);

    // Node a's credential (a stolen node disk) pushes other bytes under
    // the same name: refused, nothing changed.
    let forged = model(&t.path().join("v2"), "legit4", 4, 4 * MIB);
    let r = push(&forged, &[&b.addr], a_cred, &[]);
    assert!(!r.success(), "a node credential replaced the model");
    let out = format!("{}{}", r.stdout, r.stderr);
    assert!(out.contains("may not replace the model `legit4`"), "{out}");
    assert_same_tree(&legit, &b.model_dir("legit4"));
    let opc = Credential::load(op).unwrap();
    assert!(passes(&gate(&opc, &b, "legit4")));
    b.wait_log("refused an offer of legit4 from node a");

    // A new name is a node's to deliver; the operator may replace anything.
    let fresh = model(&t.path().join("v3"), "fresh", 5, 0);
    push_ok(&fresh, &[&b.addr], a_cred, &[]);
    push_ok(&forged, &[&b.addr], op, &[]);
    assert_same_tree(&forged, &b.model_dir("legit4"));
}

/// Serves the bytes a lying source claims for its draft.
struct Forged(Vec<Vec<u8>>, Arc<ChunkMap>);

impl ChunkReader for Forged {
    fn read_chunk(&self, chunk: ChunkId) -> Result<bytes::Bytes, xfer::transport::ReadError> {
        let start = self.1.offset(chunk) as usize;
        let len = self.1.chunk_len(chunk) as usize;
        Ok(bytes::Bytes::copy_from_slice(
            &self.0[chunk.file as usize][start..start + len],
        ))
    }
}

/// A hostile source of a draft: offered, accepted, serving its chunk
/// requests from `reader`.
struct DraftSource {
    ep: quinn::Endpoint,
    conn: quinn::Connection,
    send: quinn::SendStream,
    map: Arc<ChunkMap>,
}

impl DraftSource {
    async fn offer(
        cred: &Credential,
        addr: SocketAddr,
        name: &str,
        id: Hash,
        listing: DraftListing,
        reader: impl FnOnce(Arc<ChunkMap>) -> Arc<dyn ChunkReader>,
    ) -> DraftSource {
        let draft = Draft::from_listing(&listing).unwrap();
        let map = Arc::new(ChunkMap::new(&draft.shape()));
        let offer = TransferMsg::OfferDraft {
            name: ModelName::new(name).unwrap(),
            id,
            listing,
        };
        let served = reader(map.clone());
        let (ep, conn, send) = open_offer(cred, addr, offer, map.clone(), served).await;
        DraftSource {
            ep,
            conn,
            send,
            map,
        }
    }

    async fn tell(&mut self, ev: DraftEvent) {
        write_frame(&mut self.send, &TransferMsg::Draft(ev))
            .await
            .unwrap();
    }

    async fn hang_up(self) {
        self.conn.close(0u32.into(), b"gone");
        self.ep.wait_idle().await;
    }
}

/// Opens a transfer to the agent at `addr` with `offer` (an `Offer` or an
/// `OfferDraft`) in a swarm of one, as a source with one destination does,
/// and serves the agent's chunk requests from `reader`: the endpoint, the
/// connection and the control stream's sender.
async fn open_offer(
    cred: &Credential,
    addr: SocketAddr,
    offer: TransferMsg,
    map: Arc<ChunkMap>,
    reader: Arc<dyn ChunkReader>,
) -> (quinn::Endpoint, quinn::Connection, quinn::SendStream) {
    let ep = client_endpoint(cred, addr).unwrap();
    let conn = connect(&ep, addr, Duration::from_secs(5)).await.unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    write_frame(&mut send, &Hello::new(Service::Transfer))
        .await
        .unwrap();
    write_frame(&mut send, &offer).await.unwrap();
    let swarm = TransferMsg::Swarm {
        me: 0,
        peers: Vec::new(),
        homes: None,
        bounded: false,
        connections: 1,
    };
    write_frame(&mut send, &swarm).await.unwrap();
    match read_frame::<TransferMsg>(&mut recv).await.unwrap() {
        TransferMsg::Accepted { .. } => {}
        other => panic!("the offer was not accepted: {other:?}"),
    }
    // Progress reports are read and dropped, so they never block it.
    tokio::spawn(async move { while read_frame::<TransferMsg>(&mut recv).await.is_ok() {} });
    let serving = Serving::new(map, reader, Offer::none());
    tokio::spawn(serve(conn.clone(), serving));
    (ep, conn, send)
}

/// Serves every file of a tree but one (`withheld`), whose reads wait
/// until `released` and then fail.
struct Withholding {
    inner: xfer::transport::files::FileChunkReader,
    withheld: u32,
    released: Arc<std::sync::atomic::AtomicBool>,
}

impl ChunkReader for Withholding {
    fn read_chunk(&self, chunk: ChunkId) -> Result<bytes::Bytes, xfer::transport::ReadError> {
        if chunk.file != self.withheld {
            return self.inner.read_chunk(chunk);
        }
        while !self.released.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(xfer::transport::ReadError::NotDownloaded)
    }
}

/// A source that offers the tree at `dir` (named as its folder) to the
/// agent at `addr`, as `xfer push` does, and serves all of it but the file
/// `withheld`. Dropping it drops the connection without a close.
async fn withholding_source(
    cred: &Credential,
    addr: SocketAddr,
    dir: &Path,
    withheld: &str,
    released: Arc<std::sync::atomic::AtomicBool>,
) -> (quinn::Endpoint, quinn::Connection, quinn::SendStream) {
    let tree = xfer::store::scan::scan(dir, 4 * MIB, &|_| {}).unwrap();
    let map = Arc::new(ChunkMap::new(&tree.manifest));
    let withheld = tree
        .sources
        .iter()
        .position(|p| p.ends_with(withheld))
        .expect("the withheld file is in the tree") as u32;
    let reader = Withholding {
        inner: xfer::transport::files::FileChunkReader::new(tree.sources.clone(), map.clone()),
        withheld,
        released,
    };
    let name = dir.file_name().unwrap().to_str().unwrap();
    let offer = TransferMsg::Offer {
        name: ModelName::new(name).unwrap(),
        manifest: tree.manifest.clone(),
    };
    open_offer(cred, addr, offer, map, Arc::new(reader)).await
}

/// The chunk hashes of `data`, at [`CS`].
fn hashes_of(data: &[u8]) -> Vec<Hash> {
    let count = hash::chunk_count(data.len() as u64, CS);
    data.chunks(CS as usize)
        .enumerate()
        .map(|(i, c)| hash::hash_chunk(c, i as u64, count, CS))
        .collect()
}

fn listing(files: &[(&str, u64)]) -> DraftListing {
    DraftListing {
        chunk_size: CS,
        files: files
            .iter()
            .map(|(p, s)| (RelPath::new(p).unwrap(), *s))
            .collect(),
        links: Vec::new(),
    }
}

/// A lying source: offers a draft of `files` named `name` under `id`,
/// announces and serves other bytes for file 0, seals it, and hangs up once
/// the agent placed it.
async fn poison(
    cred: &Credential,
    addr: SocketAddr,
    name: &str,
    id: Hash,
    files: &[(&str, u64)],
    placed: &Path,
) {
    let forged: Vec<Vec<u8>> = files
        .iter()
        .enumerate()
        .map(|(i, (_, s))| random_bytes(99, &format!("forged{i}"), *s as usize))
        .collect();
    let served = forged.clone();
    let mut src = DraftSource::offer(cred, addr, name, id, listing(files), |map| {
        Arc::new(Forged(served, map))
    })
    .await;
    src.tell(DraftEvent::Hashed {
        file: 0,
        generation: 0,
        first: 0,
        hashes: hashes_of(&forged[0]),
    })
    .await;
    src.tell(DraftEvent::Sealed {
        file: 0,
        generation: 0,
    })
    .await;
    assert_eq!(src.map.files(), files.len());
    let want = forged[0].clone();
    wait_until_async("the forged file to be placed", HANG, || async {
        std::fs::read(placed).ok().as_ref() == Some(&want)
    })
    .await;
    src.hang_up().await;
}

/// Answers every chunk request "not yet", counting them.
struct NotYet(Arc<std::sync::atomic::AtomicU64>);

impl ChunkReader for NotYet {
    fn read_chunk(&self, _: ChunkId) -> Result<bytes::Bytes, xfer::transport::ReadError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err(xfer::transport::ReadError::NotDownloaded)
    }
}

#[test]
fn a_source_that_fails_every_request_cannot_flood_the_log_or_the_memory() {
    let t = tempdir("integrity-flood");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let b = Agent::start("127.0.0.155:0", &t.path().join("rb"), &key);
    let addr: SocketAddr = b.addr.parse().unwrap();
    let asked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (size, events) = (256 * MIB, 1500);
    let counter = asked.clone();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let mut src = DraftSource::offer(
                &cred,
                addr,
                "flood",
                Hash([5; 32]),
                listing(&[("big.bin", size)]),
                |_| Arc::new(NotYet(counter.clone())),
            )
            .await;
            // The same announcement again and again: 4,096 hashes (128 KiB)
            // an event, 190 MiB in all, as fast as the agent reads them.
            let data = random_bytes(3, "flood", size as usize);
            let hashes = hashes_of(&data);
            drop(data);
            for _ in 0..events {
                src.tell(DraftEvent::Hashed {
                    file: 0,
                    generation: 0,
                    first: 0,
                    hashes: hashes.clone(),
                })
                .await;
            }
            // Then requests answered "not yet", thousands of them.
            wait_until_async("the agent to ask 3,000 times", HANG, || async {
                let asked = counter.load(std::sync::atomic::Ordering::Relaxed);
                if asked >= 3000 {
                    Ok(())
                } else {
                    Err(asked)
                }
            })
            .await;
            src.hang_up().await;
        });
    let lines = b
        .log()
        .lines()
        .filter(|l| l.contains("fetch from peer"))
        .count();
    assert!(
        lines <= 10,
        "{lines} warnings for {} failed requests",
        asked.load(std::sync::atomic::Ordering::Relaxed)
    );
    let rss = peak_rss(b.pid().unwrap());
    assert!(rss < 200 * MIB, "the agent peaked at {} MiB", rss / MIB);
}

#[test]
fn a_draft_under_a_chosen_id_does_not_poison_the_next_push() {
    let t = tempdir("integrity-poison");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let b = Agent::start("127.0.0.153:0", &t.path().join("rb"), &key);
    let legit = t.path().join("src/victim2");
    std::fs::create_dir_all(&legit).unwrap();
    write_random(&legit.join("a.bin"), 192 * KIB, 21);
    std::fs::write(legit.join("b.json"), vec![b'x'; 99]).unwrap();
    let root = Hash::from_hex(&manifest_root(&legit)).unwrap();

    let addr: SocketAddr = b.addr.parse().unwrap();
    let placed = b.model_dir("victim2").join("a.bin");
    let files = [("a.bin", 192 * KIB), ("b.json", 99)];
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(poison(&cred, addr, "victim2", root, &files, &placed));

    // The real model: every byte of a.bin comes from the source again.
    let s = push_ok(&legit, &[&b.addr], &key, &[]);
    assert_eq!(s.nodes[0].root, Some(root));
    assert_eq!(
        s.nodes[0].bytes_skipped, 0,
        "the forged a.bin counted as held: {s:#?}"
    );
    assert_same_tree(&legit, &b.model_dir("victim2"));
    let (r, _) = verify(&b.model_dir("victim2"));
    r.assert_ok("xfer verify");
}

/// The peak resident set of process `pid`, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn a_terabyte_listing_is_refused_before_anything_is_built() {
    let t = tempdir("integrity-listing");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let b = Agent::start("127.0.0.154:0", &t.path().join("rb"), &key);
    let addr: SocketAddr = b.addr.parse().unwrap();
    let offer = |chunk_size: u64, name: &str| TransferMsg::OfferDraft {
        name: ModelName::new(name).unwrap(),
        id: Hash([7; 32]),
        listing: DraftListing {
            chunk_size,
            files: vec![(RelPath::new("huge.bin").unwrap(), 1 << 40)],
            links: Vec::new(),
        },
    };
    let replies = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let ep = client_endpoint(&cred, addr).unwrap();
        // Six at once, at 64 KiB chunks (2^24 chunks) and at 4 MiB.
        let asks: Vec<_> = (0..6)
            .map(|i| {
                let ep = ep.clone();
                let msg = offer(if i % 2 == 0 { CS } else { 4 * MIB }, &format!("huge{i}"));
                tokio::spawn(async move {
                    let conn = connect(&ep, addr, Duration::from_secs(5)).await.unwrap();
                    let (mut send, mut recv) = conn.open_bi().await.unwrap();
                    write_frame(&mut send, &Hello::new(Service::Transfer))
                        .await
                        .unwrap();
                    write_frame(&mut send, &msg).await.unwrap();
                    read_frame::<TransferMsg>(&mut recv).await.unwrap()
                })
            })
            .collect();
        let mut out = Vec::new();
        for a in asks {
            out.push(a.await.unwrap());
        }
        out
    });
    for (i, r) in replies.iter().enumerate() {
        let TransferMsg::Failed(why) = r else {
            panic!("offer {i} was not refused: {r:?}");
        };
        let why = why.to_string();
        let expected = if i % 2 == 0 { "a draft may" } else { "space" };
        assert!(why.contains(expected), "offer {i}: {why}");
    }
    let rss = peak_rss(b.pid().unwrap());
    assert!(rss < 200 * MIB, "the agent peaked at {} MiB", rss / MIB);
    assert!(!b.staging_dir("huge0").join("data").exists());
}

/// A streamed draft's links are checked before anything is placed: one
/// that leaves the tree, or leads to no file of the draft, is refused at
/// the offer, and nothing appears under the model's name.
#[test]
fn a_draft_whose_link_leaves_the_tree_is_refused_at_the_offer() {
    let t = tempdir("integrity-draft-link");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let cred = Credential::load(&key).unwrap();
    let b = Agent::start("127.0.0.156:0", &t.path().join("rb"), &key);
    let addr: SocketAddr = b.addr.parse().unwrap();
    let bad = [
        "../../../../../../etc/passwd",
        "/etc/passwd",
        "../../blobs/not-in-the-draft",
    ];
    let replies = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let ep = client_endpoint(&cred, addr).unwrap();
        let mut out = Vec::new();
        for (i, target) in bad.iter().enumerate() {
            let msg = TransferMsg::OfferDraft {
                name: ModelName::new(&format!("linky{i}")).unwrap(),
                id: Hash([9; 32]),
                listing: DraftListing {
                    chunk_size: CS,
                    files: vec![(RelPath::new("blobs/aa").unwrap(), 10)],
                    links: vec![(RelPath::new("snapshots/c/x").unwrap(), target.to_string())],
                },
            };
            let conn = connect(&ep, addr, Duration::from_secs(5)).await.unwrap();
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            write_frame(&mut send, &Hello::new(Service::Transfer))
                .await
                .unwrap();
            write_frame(&mut send, &msg).await.unwrap();
            out.push(read_frame::<TransferMsg>(&mut recv).await.unwrap());
        }
        out
    });
    for (i, r) in replies.iter().enumerate() {
        let TransferMsg::Failed(why) = r else {
            panic!(
                "the draft with link target {} was not refused: {r:?}",
                bad[i]
            );
        };
        let why = why.to_string();
        assert!(
            why.contains("leads to none of its files"),
            "{}: {why}",
            bad[i]
        );
        assert!(!b.model_dir(&format!("linky{i}")).exists());
    }
}
