//! Replays the fuzz corpora on stable: every file under
//! `fuzz/corpus/TARGET/` and `fuzz/regressions/TARGET/` goes through the
//! same `xfer::fuzzing` entry point as the fuzz target of that name, which
//! must not panic. CI has no nightly toolchain, so this is how the inputs
//! the fuzzer found (and the crashes it once found) keep being checked.
//!
//! `cargo test -p xfer --test suite -- --ignored fuzz_corpus::write_seeds`
//! regenerates the hand-made seeds (`seed-*` files) from the real types.

use std::path::{Path, PathBuf};

use xfer_proto::admin::{AdminReply, AdminRequest};
use xfer_proto::frame::encode;
use xfer_proto::hash::{self, Hash};
use xfer_proto::hello::{Hello, Service};
use xfer_proto::launch::{LaunchReply, LaunchRequest};
use xfer_proto::manifest::{ChunkId, Entry, FileEntry, Manifest, MANIFEST_VERSION};
use xfer_proto::names::ModelName;
use xfer_proto::relpath::RelPath;
use xfer_proto::stream::{ChunkReply, ChunkRequest, RdmaReply, RdmaRequest};
use xfer_proto::transfer::{FallbackRoute, HomeSlots, Refusal, SwarmPeer, TransferMsg};

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("wire", xfer::fuzzing::wire),
    ("manifest", xfer::fuzzing::manifest),
    ("cluster", xfer::fuzzing::cluster),
    ("hub_tree", xfer::fuzzing::hub_tree),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of one folder, sorted; none if it does not exist.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.expect("read corpus folder").path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

fn replay(name: &str, target: Target) {
    let corpus = files(&fuzz_dir().join("corpus").join(name));
    assert!(
        !corpus.is_empty(),
        "fuzz/corpus/{name} is empty or missing; run `cargo test -p xfer --test suite -- --ignored fuzz_corpus::write_seeds`"
    );
    let regressions = files(&fuzz_dir().join("regressions").join(name));
    for path in corpus.iter().chain(&regressions) {
        let data = std::fs::read(path).expect("read corpus file");
        let caught = std::panic::catch_unwind(|| target(&data));
        assert!(caught.is_ok(), "{name} panicked on {}", path.display());
    }
    eprintln!(
        "{name}: {} corpus files, {} regressions",
        corpus.len(),
        regressions.len()
    );
}

#[test]
fn wire_corpus() {
    replay("wire", xfer::fuzzing::wire);
}

#[test]
fn manifest_corpus() {
    replay("manifest", xfer::fuzzing::manifest);
}

#[test]
fn cluster_corpus() {
    replay("cluster", xfer::fuzzing::cluster);
}

#[test]
fn hub_tree_corpus() {
    replay("hub_tree", xfer::fuzzing::hub_tree);
}

#[test]
fn every_target_is_replayed() {
    let dirs: Vec<String> = files_and_dirs(&fuzz_dir().join("fuzz_targets"));
    for (name, _) in TARGETS {
        assert!(
            dirs.contains(&format!("{name}.rs")),
            "no fuzz target {name}"
        );
    }
    assert_eq!(
        dirs.len(),
        TARGETS.len(),
        "a fuzz target is not replayed here: {dirs:?}"
    );
}

fn files_and_dirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("fuzz/fuzz_targets")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

// ---- seeds ---------------------------------------------------------------

const CS: u64 = hash::MIN_CHUNK_SIZE;

fn file(path: &str, data: &[u8]) -> Entry {
    let n = hash::chunk_count(data.len() as u64, CS);
    Entry::File(FileEntry {
        path: RelPath::new(path).unwrap(),
        size: data.len() as u64,
        hash: blake3::hash(data).into(),
        executable: path.ends_with(".sh"),
        chunks: data
            .chunks(CS as usize)
            .enumerate()
            .map(|(i, c)| hash::hash_chunk(c, i as u64, n, CS))
            .collect(),
    })
}

fn sample_manifest() -> Manifest {
    let big: Vec<u8> = (0..(2 * CS + 100)).map(|i| (i % 251) as u8).collect();
    let m = Manifest {
        version: MANIFEST_VERSION,
        chunk_size: CS,
        entries: vec![
            file("blobs/abc", &big),
            file("config.json", b"{\"model_type\":\"llama\"}"),
            file("empty", b""),
            Entry::Dir {
                path: RelPath::new("logs").unwrap(),
            },
            file("run.sh", b"#!/bin/sh\n"),
            Entry::Symlink {
                path: RelPath::new("snapshots/c1/model.safetensors").unwrap(),
                target: "../../blobs/abc".into(),
            },
        ],
    };
    m.validate().unwrap();
    m
}

fn small_manifest() -> Manifest {
    let m = Manifest {
        version: MANIFEST_VERSION,
        chunk_size: CS,
        entries: vec![file("a", b"hello"), file("b/c", b"")],
    };
    m.validate().unwrap();
    m
}

fn wire_seeds() -> Vec<(String, Vec<u8>)> {
    let name = ModelName::new("llama-3").unwrap();
    let root = sample_manifest().root();
    let peer: std::net::SocketAddr = "10.0.0.2:7470".parse().unwrap();
    let mut has = xfer_proto::chunkset::ChunkSet::empty(70);
    has.insert(0);
    has.insert(69);
    let controls = vec![
        TransferMsg::Offer {
            name: name.clone(),
            manifest: small_manifest(),
        },
        TransferMsg::Accepted {
            held_bytes: 1,
            held_chunks: 2,
            need_bytes: 3,
            lane_key: [7; 16],
        },
        TransferMsg::Done {
            root,
            received_bytes: 5,
            corrupt_chunks: 0,
        },
        TransferMsg::Failed(Refusal::NoSpace {
            need: 10,
            have: 2,
            path: "/x".into(),
        }),
        TransferMsg::Failed(Refusal::Corrupt {
            file: 1,
            index: 2,
            times: 3,
        }),
        TransferMsg::Failed(Refusal::BadManifest("why".into())),
        TransferMsg::Want { name: name.clone() },
        TransferMsg::Have {
            manifest: small_manifest(),
        },
        TransferMsg::Swarm {
            me: 1,
            peers: vec![
                SwarmPeer {
                    id: 0,
                    label: "n0".into(),
                    addr: peer,
                    fallback: None,
                },
                SwarmPeer {
                    id: 2,
                    label: "[fd00::1]:7470".into(),
                    addr: "[fd00::1]:7470".parse().unwrap(),
                    fallback: Some(peer),
                },
            ],
            homes: Some(HomeSlots {
                of: 16,
                slots: vec![3, 7],
            }),
            bounded: true,
            connections: 2,
        },
        TransferMsg::Join {
            name: name.clone(),
            root,
            from: 2,
        },
        TransferMsg::Bitfield { has },
        TransferMsg::Has {
            chunks: vec![1, 300, 1 << 40],
        },
        TransferMsg::Progress {
            held_bytes: 1,
            from_source: 2,
            from_peers: 3,
            links: 4,
            max_links: 5,
        },
        TransferMsg::Links {
            add: vec![SwarmPeer {
                id: 3,
                label: "n3".into(),
                addr: peer,
                fallback: None,
            }],
            remove: vec![1, 2],
        },
        TransferMsg::Feed(None),
        TransferMsg::Slow { peer: 2 },
        TransferMsg::PeerDropped {
            peer,
            reason: "slow".into(),
        },
        TransferMsg::Fallback(FallbackRoute {
            from: "n1".into(),
            to: "n2".into(),
            data: peer,
            error: "timed out".into(),
        }),
    ];
    let admin_requests = vec![
        AdminRequest::Status,
        AdminRequest::CancelJob { id: "j1".into() },
        AdminRequest::RemoveModel {
            name: name.clone(),
            force: false,
        },
    ];
    let admin_replies = vec![
        AdminReply::JobAccepted { id: "j1".into() },
        AdminReply::JobCancelled {
            id: "j1".into(),
            known: true,
        },
        AdminReply::ModelRemoved {
            name: name.clone(),
            existed: false,
        },
        AdminReply::Failed(Refusal::NotHeld("m".into())),
    ];
    let launch_requests = vec![
        LaunchRequest::RunQuery {
            run: Some("r1".into()),
        },
        LaunchRequest::StopRun {
            run: None,
            grace_ms: 5,
            reason: "down".into(),
        },
        LaunchRequest::ReadLog {
            run: "r1".into(),
            offset: 0,
            max: 4096,
        },
        LaunchRequest::Reach {
            listen: Some(peer),
            peers: vec![],
            window_ms: 1000,
        },
    ];
    let launch_replies = vec![LaunchReply::Runs(vec![])];
    let hellos = [Service::Transfer, Service::Admin, Service::Launch].map(Hello::new);
    let mut out = Vec::new();
    let mut seed = |kind: &str, what: &str, frame: Vec<u8>| {
        let i = out.len();
        out.push((format!("seed-{kind}-{i:02}-{what}"), frame[4..].to_vec()));
    };
    for m in &controls {
        seed("transfer", m.kind(), encode(m));
    }
    for m in &admin_requests {
        seed("admin-request", "", encode(m));
    }
    for m in &admin_replies {
        seed("admin-reply", m.kind(), encode(m));
    }
    for m in &launch_requests {
        seed("launch-request", "", encode(m));
    }
    for m in &launch_replies {
        seed("launch-reply", m.kind(), encode(m));
    }
    for h in &hellos {
        seed("hello", "", encode(h));
    }
    // Two whole frames, prefix included.
    out.push(("seed-frame-offer".into(), encode(&controls[0])));
    out.push(("seed-frame-done".into(), encode(&controls[2])));
    let chunk = ChunkId { file: 3, index: 9 };
    let others = [
        ("chunk-request", encode(&ChunkRequest { chunk })),
        ("chunk-reply-data", encode(&ChunkReply::Data)),
        (
            "chunk-reply-unavailable",
            encode(&ChunkReply::Unavailable("gone".into())),
        ),
        (
            "rdma-request",
            encode(&RdmaRequest {
                chunk,
                slot: 4,
                qp: 7,
                imm: 0x1234,
                len: 1 << 22,
            }),
        ),
        ("rdma-reply-written", encode(&RdmaReply::Written)),
        ("rdma-reply-failed", encode(&RdmaReply::Failed("qp".into()))),
        ("model-name", encode(&name)),
    ];
    for (what, frame) in others {
        out.push((format!("seed-{what}"), frame[4..].to_vec()));
    }
    out
}

fn manifest_seeds() -> Vec<(String, Vec<u8>)> {
    let m = sample_manifest();
    let doc = serde_json::to_vec_pretty(&m.to_doc()).unwrap();
    let small = serde_json::to_vec(&small_manifest().to_doc()).unwrap();
    let record = serde_json::json!({
        "manifest": small_manifest().to_doc(),
        "stamps": { "a": { "size": 5, "mtime_ns": 1_700_000_000_000_000_000i128 } },
    });
    vec![
        ("seed-doc.json".into(), doc),
        ("seed-small.json".into(), small),
        (
            "seed-record.json".into(),
            serde_json::to_vec(&record).unwrap(),
        ),
        ("seed-postcard".into(), encode(&m)[4..].to_vec()),
        (
            "seed-postcard-small".into(),
            encode(&small_manifest())[4..].to_vec(),
        ),
    ]
}

fn cluster_seeds() -> Vec<(String, Vec<u8>)> {
    let example =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cluster.example.toml"))
            .unwrap();
    let two = b"key = \"cluster.key\"\n\n[[node]]\nname = \"n1\"\nagent = \"127.0.0.1:7470\"\nroot = \"/srv/models\"\n\n[[node]]\nname = \"n2\"\nagent = \"[::1]\"\nroot = \"/srv/models\"\nfabric_if = \"eth1\"\nfabric_ip = \"192.168.1.2\"\nrdma_device = \"mlx5_0\"\ngid_index = 3\n".to_vec();
    let defaults = b"key = \"/etc/xfer/key\"\n[defaults]\nroot = \"/data\"\nport = 7471\n\n[[node]]\nname = \"a\"\nagent = \"box.lan\"\n\n[launch]\nengine = \"vllm\"\ntp = 2\n".to_vec();
    vec![
        ("seed-example.toml".into(), example),
        ("seed-two.toml".into(), two),
        ("seed-defaults.toml".into(), defaults),
    ]
}

fn hub_seeds() -> Vec<(String, Vec<u8>)> {
    let g = "c".repeat(40);
    let sha = "a".repeat(64);
    let tree = format!(
        r#"[{{"type":"directory","oid":"{g}","size":0,"path":"original"}},
{{"type":"file","oid":"{g}","size":12,"path":"config.json"}},
{{"type":"file","oid":"{g}","size":134,"path":"original/w.safetensors","lfs":{{"oid":"{sha}","size":5000000000,"pointerSize":134}}}}]"#
    );
    let revision = r#"{"_id":"0123456789abcdef01234567","id":"o/m","sha":"0123456789abcdef0123456789abcdef01234567","private":false,"siblings":[{"rfilename":"config.json"}]}"#.to_string();
    let link = "<https://huggingface.co/api/models/o/m/tree/c?recursive=true&cursor=abc>; rel=\"next\"\nhttps://mirror.example/hf/";
    vec![
        ("seed-tree.json".into(), tree.into_bytes()),
        ("seed-tree-empty.json".into(), b"[]".to_vec()),
        ("seed-revision.json".into(), revision.into_bytes()),
        ("seed-link".into(), link.as_bytes().to_vec()),
    ]
}

/// Writes the hand-made seeds into fuzz/corpus/TARGET/.
#[test]
#[ignore = "writes fuzz/corpus; run by hand"]
fn write_seeds() {
    for (name, seeds) in [
        ("wire", wire_seeds()),
        ("manifest", manifest_seeds()),
        ("cluster", cluster_seeds()),
        ("hub_tree", hub_seeds()),
    ] {
        let dir = fuzz_dir().join("corpus").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (file, bytes) in seeds {
            std::fs::write(dir.join(file), bytes).unwrap();
        }
    }
}

/// The seeds themselves are accepted by their parsers (so the fuzzer
/// starts from inputs that go deep, not from ones refused at once).
#[test]
fn seeds_are_valid_inputs() {
    use xfer_proto::frame::decode;
    let mut checked = 0;
    for (what, body) in wire_seeds() {
        let ok = if what.starts_with("seed-transfer") {
            decode::<TransferMsg>(&body).is_ok()
        } else if what.starts_with("seed-admin-request") {
            decode::<AdminRequest>(&body).is_ok()
        } else if what.starts_with("seed-admin-reply") {
            decode::<AdminReply>(&body).is_ok()
        } else if what.starts_with("seed-launch-request") {
            decode::<LaunchRequest>(&body).is_ok()
        } else if what.starts_with("seed-launch-reply") {
            decode::<LaunchReply>(&body).is_ok()
        } else if what.starts_with("seed-hello") {
            decode::<Hello>(&body).is_ok_and(|h| h.check().is_ok())
        } else {
            continue;
        };
        assert!(ok, "{what} does not decode as its own type");
        checked += 1;
    }
    assert!(checked >= 29, "only {checked} message seeds");
    for (what, bytes) in manifest_seeds() {
        if what.ends_with(".json") && !what.contains("record") {
            Manifest::parse_json(&bytes, Path::new(&what)).expect(&what);
        }
    }
    for (what, bytes) in cluster_seeds() {
        xfer::config::cluster::Cluster::parse(std::str::from_utf8(&bytes).unwrap(), "c.toml")
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let tree = &hub_seeds()[0].1;
    assert_eq!(xfer::hub::api::parse_tree_page(tree).unwrap().len(), 2);
    let _: Hash = sample_manifest().root();
}
