//! A hostile (but authenticated) peer offers crafted manifests and frames.
//! Every one must be refused with `TransferMsg::Failed`, nothing outside the
//! agent's root may be touched, no model folder may appear, and the agent
//! must keep serving.
//!
//! The fake peer is built from the library (`Credential`, `client_endpoint`,
//! `connect`) and writes raw frame bytes. Offers that a well-typed
//! [`Manifest`] can express are encoded with `xfer_proto::frame::encode`; offers
//! with paths or names that the library refuses to even construct are
//! encoded from look-alike types with plain `String`s, which postcard
//! encodes to the same bytes (checked below).

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use xfer::config::auth::Credential;
use xfer::transport::quic::{client_endpoint, connect, read_frame};
use xfer_proto::frame::encode;
use xfer_proto::hash::{self, Hash};
use xfer_proto::hello::{Hello, Service};
use xfer_proto::manifest::{Entry, FileEntry, Manifest, MANIFEST_VERSION};
use xfer_proto::names::{ModelName, PROTOCOL_VERSION};
use xfer_proto::relpath::RelPath;
use xfer_proto::transfer::{Refusal, TransferMsg};

use common::*;

const CS: u64 = 64 * 1024;

// Look-alikes of `TransferMsg`, `Manifest`, `Entry` and `FileEntry` with plain
// strings, same field order and types, same variant order.
#[derive(Serialize)]
enum RawTransferMsg {
    #[allow(dead_code)]
    Failed(()),
    Offer {
        name: String,
        manifest: RawManifest,
    },
}

#[derive(Serialize, Clone)]
struct RawManifest {
    version: u32,
    chunk_size: u64,
    entries: Vec<RawEntry>,
}

#[derive(Serialize, Clone)]
enum RawEntry {
    File(RawFile),
    #[allow(dead_code)]
    Symlink {
        path: String,
        target: String,
    },
    Dir {
        path: String,
    },
}

#[derive(Serialize, Clone)]
struct RawFile {
    path: String,
    size: u64,
    hash: [u8; 32],
    executable: bool,
    chunks: Vec<[u8; 32]>,
}

fn raw_file(path: &str, data: &[u8]) -> RawFile {
    let n = hash::chunk_count(data.len() as u64, CS);
    let chunks: Vec<[u8; 32]> = data
        .chunks(CS as usize)
        .enumerate()
        .map(|(i, c)| hash::hash_chunk(c, i as u64, n, CS).0)
        .collect();
    RawFile {
        path: path.into(),
        size: data.len() as u64,
        hash: *blake3::hash(data).as_bytes(),
        executable: false,
        chunks,
    }
}

fn file(path: &str, data: &[u8]) -> FileEntry {
    let r = raw_file(path, data);
    FileEntry {
        path: RelPath::new(path).unwrap(),
        size: r.size,
        hash: Hash(r.hash),
        executable: false,
        chunks: r.chunks.into_iter().map(Hash).collect(),
    }
}

fn manifest(entries: Vec<Entry>) -> Manifest {
    Manifest {
        version: MANIFEST_VERSION,
        chunk_size: CS,
        entries,
    }
}

fn offer(name: &str, m: Manifest) -> Vec<u8> {
    encode(&TransferMsg::Offer {
        name: ModelName::new(name).unwrap(),
        manifest: m,
    })
}

fn raw_offer(name: &str, entries: Vec<RawEntry>) -> Vec<u8> {
    encode(&RawTransferMsg::Offer {
        name: name.into(),
        manifest: RawManifest {
            version: MANIFEST_VERSION,
            chunk_size: CS,
            entries,
        },
    })
}

/// What the agent did with our bytes.
#[derive(Debug)]
enum Reply {
    Msg(TransferMsg),
    /// The stream or connection ended without a readable reply.
    Closed(String),
}

async fn read_reply(recv: &mut quinn::RecvStream) -> Reply {
    match tokio::time::timeout(Duration::from_secs(15), read_frame::<TransferMsg>(recv)).await {
        Err(_) => panic!("no reply within 15 s"),
        Ok(Ok(m)) => Reply::Msg(m),
        Ok(Err(e)) => Reply::Closed(format!("{e:#}")),
    }
}

/// Opens a fresh connection, opens a transfer stream (this build's hello),
/// writes `bytes` on it (then finishes it), and reads one reply frame.
async fn send_raw(cred: &Credential, addr: SocketAddr, bytes: &[u8]) -> (Reply, Option<Reply>) {
    send_after(cred, addr, &encode(&Hello::new(Service::Transfer)), bytes).await
}

/// [`send_raw`] after `hello`, the stream's first bytes.
async fn send_after(
    cred: &Credential,
    addr: SocketAddr,
    hello: &[u8],
    bytes: &[u8],
) -> (Reply, Option<Reply>) {
    let ep = client_endpoint(cred, addr).expect("client endpoint");
    let conn = connect(&ep, addr, Duration::from_secs(5))
        .await
        .expect("connect with the right key");
    let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
    for part in [hello, bytes] {
        match send.write_all(part).await {
            Ok(()) => {}
            // The agent refused on what it had read (an unknown hello
            // version) and stopped reading: its reply is what counts.
            Err(quinn::WriteError::Stopped(_)) => break,
            Err(e) => panic!("write: {e}"),
        }
    }
    let _ = send.finish();
    let first = read_reply(&mut recv).await;
    // After `Accepted` comes the outcome.
    let second = match &first {
        Reply::Msg(TransferMsg::Accepted { .. }) => Some(read_reply(&mut recv).await),
        _ => None,
    };
    conn.close(0u32.into(), b"bye");
    let _ = tokio::time::timeout(Duration::from_secs(2), ep.wait_idle()).await;
    (first, second)
}

/// Everything below `dir`, with file contents, for before/after comparison
/// (sockets aside: the agent's loader link, `.xfer/agent.sock`).
fn snapshot(dir: &Path) -> Vec<(String, Option<Vec<u8>>)> {
    walk(dir)
        .into_iter()
        .filter(|(rel, _)| {
            use std::os::unix::fs::FileTypeExt;
            !std::fs::symlink_metadata(dir.join(rel)).is_ok_and(|m| m.file_type().is_socket())
        })
        .map(|(rel, n)| {
            let bytes =
                matches!(n, Node::File { .. }).then(|| std::fs::read(dir.join(&rel)).unwrap());
            (rel, bytes)
        })
        .collect()
}

#[test]
fn hostile_offers_are_refused_and_touch_nothing() {
    let t = tempdir("bad-manifest");
    let key = t.path().join("key");
    keygen(&key);
    // The agent's root lives inside `parent`, next to a sentinel.
    let parent = t.path().join("parent");
    std::fs::create_dir(&parent).unwrap();
    std::fs::write(parent.join("sentinel"), b"do not touch").unwrap();
    let root = parent.join("root");
    let mut agent = Agent::start("127.0.0.30:0", &root, &key);
    let addr: SocketAddr = agent.addr.parse().unwrap();
    let parent_before = listing(&parent);
    let sentinel_before = snapshot(&parent)
        .into_iter()
        .filter(|(p, _)| p == "sentinel")
        .collect::<Vec<_>>();
    let etc_x_before = Path::new("/etc/x").exists();
    let passwd_before = std::fs::read("/etc/passwd").ok();

    let data = random_bytes(30, "data", 200_000); // 4 chunks of 64 KiB
    let small = b"pwned".to_vec();

    // The look-alike types encode exactly like the real ones.
    let good = manifest(vec![
        Entry::File(file("a/b", &data)),
        Entry::Symlink {
            path: RelPath::new("c").unwrap(),
            target: "a/b".into(),
        },
        Entry::Dir {
            path: RelPath::new("d").unwrap(),
        },
    ]);
    good.validate().unwrap();
    assert_eq!(
        offer("same", good),
        raw_offer(
            "same",
            vec![
                RawEntry::File(raw_file("a/b", &data)),
                RawEntry::Symlink {
                    path: "c".into(),
                    target: "a/b".into()
                },
                RawEntry::Dir { path: "d".into() },
            ]
        ),
        "the look-alike encoding drifted from the real one"
    );

    // Offers the library can express but `validate` must refuse. The
    // expected refusal is the library's own verdict.
    // Each refusal must also say what is wrong: the third field is a part
    // of the message a user sees.
    let mut invalid: Vec<(&str, Manifest, &str)> = Vec::new();
    let link = |path: &str, target: &str| Entry::Symlink {
        path: RelPath::new(path).unwrap(),
        target: target.into(),
    };
    invalid.push((
        "symlink escaping the tree",
        manifest(vec![link("l", "../../../etc/passwd")]),
        "symlink `l` points outside the tree",
    ));
    invalid.push((
        "nested symlink escaping the tree",
        manifest(vec![link(
            "snapshots/c1/model.safetensors",
            "../../../etc/passwd",
        )]),
        "points outside the tree",
    ));
    invalid.push((
        "absolute symlink target",
        manifest(vec![link("l", "/etc/passwd")]),
        "points outside the tree or through another symlink: `/etc/passwd`",
    ));
    invalid.push((
        "symlink with .. after a name",
        manifest(vec![link("s/l", "a/../../x")]),
        "points outside the tree",
    ));
    invalid.push((
        "file under a symlink",
        manifest(vec![link("d", "e"), Entry::File(file("d/x", &small))]),
        "`d/x` is inside `d`, which is a file or symlink",
    ));
    invalid.push((
        "duplicate paths",
        manifest(vec![
            Entry::File(file("a", &small)),
            Entry::File(file("a", &small)),
        ]),
        "duplicate or unsorted path",
    ));
    let mut huge = file("big", &small);
    huge.size = u64::MAX;
    invalid.push((
        "size u64::MAX",
        manifest(vec![Entry::File(huge)]),
        "more than the 1 PiB limit",
    ));
    let mut huge = file("big", &small);
    huge.size = 1 << 60;
    invalid.push((
        "size 1<<60",
        manifest(vec![Entry::File(huge)]),
        "claims 1152921504606846976 bytes",
    ));
    // 16 Ki files of 1 PiB each: their sizes sum past u64::MAX. Each
    // needs 2^34 chunk hashes it does not carry, so the first is refused.
    let mut pib = file("big", &small);
    pib.size = 1 << 50;
    let overflow: Vec<Entry> = (0..(1u32 << 14) + 1)
        .map(|i| {
            let mut f = pib.clone();
            f.path = RelPath::new(&format!("f{i:05}")).unwrap();
            Entry::File(f)
        })
        .collect();
    invalid.push((
        "file sizes summing past u64::MAX",
        manifest(overflow),
        "file `f00000` has 1 chunk hashes but 17179869184 chunks",
    ));
    let mut short = file("f", &data);
    short.chunks.pop();
    invalid.push((
        "chunk count below size",
        manifest(vec![Entry::File(short)]),
        "has 3 chunk hashes but 4 chunks",
    ));
    let mut long = file("f", &data);
    long.chunks.push(long.chunks[0]);
    invalid.push((
        "chunk count above size",
        manifest(vec![Entry::File(long)]),
        "has 5 chunk hashes but 4 chunks",
    ));
    let mut forged = file("f", &data);
    forged.chunks[1].0[0] ^= 1;
    invalid.push((
        "chunks that do not combine to the file hash",
        manifest(vec![Entry::File(forged)]),
        "chunk hashes do not combine to the file hash",
    ));
    let mut zero = manifest(vec![Entry::File(file("f", &small))]);
    zero.chunk_size = 0;
    invalid.push((
        "chunk_size 0",
        zero,
        "chunk size 0 is not a power of two between 64 KiB and 256 MiB",
    ));
    let mut odd = manifest(vec![Entry::File(file("f", &small))]);
    odd.chunk_size = 100_000;
    invalid.push((
        "chunk_size not a power of two",
        odd,
        "chunk size 100000 is not a power of two",
    ));
    let mut version = manifest(vec![]);
    version.version = 99;
    invalid.push((
        "manifest version 99",
        version,
        "unsupported manifest version 99",
    ));

    // Offers that must not even decode.
    let mut garbage = vec![0u8; 4];
    let body = random_bytes(31, "garbage", 200);
    garbage[..4].copy_from_slice(&(body.len() as u32).to_be_bytes());
    garbage.extend_from_slice(&body);
    let mut truncated = 1000u32.to_be_bytes().to_vec();
    truncated.extend_from_slice(&body[..10]);
    let undecodable: Vec<(&str, Vec<u8>)> = vec![
        (
            "absolute path /etc/x",
            raw_offer("m", vec![RawEntry::File(raw_file("/etc/x", &small))]),
        ),
        (
            "path ../x",
            raw_offer("m", vec![RawEntry::File(raw_file("../x", &small))]),
        ),
        (
            "path ../../x",
            raw_offer("m", vec![RawEntry::File(raw_file("../../x", &small))]),
        ),
        (
            "path a/../../x",
            raw_offer("m", vec![RawEntry::File(raw_file("a/../../x", &small))]),
        ),
        (
            "dir ../../evil-dir",
            raw_offer(
                "m",
                vec![RawEntry::Dir {
                    path: "../../evil-dir".into(),
                }],
            ),
        ),
        (
            "model name ../evil",
            raw_offer("../evil", vec![RawEntry::File(raw_file("x", &small))]),
        ),
        (
            "model name .xfer",
            raw_offer(".xfer", vec![RawEntry::File(raw_file("x", &small))]),
        ),
        ("random bytes with a valid length prefix", garbage),
        (
            "oversized length prefix",
            vec![0xff, 0xff, 0xff, 0xff, 0, 1, 2],
        ),
        ("length prefix longer than the stream", truncated),
        ("empty stream", vec![]),
    ];

    let cred = Credential::load(&key).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for (what, m, says) in &invalid {
            let why = m.validate().expect_err(what).to_string();
            assert!(
                why.contains(says),
                "{what}: the refusal `{why}` should say `{says}`"
            );
            let (reply, _) = send_raw(&cred, addr, &offer("m", m.clone())).await;
            eprintln!("{what}: {reply:?}");
            match reply {
                Reply::Msg(TransferMsg::Failed(r)) => {
                    assert_eq!(r, Refusal::BadManifest(why), "{what}")
                }
                other => panic!("{what}: expected BadManifest, got {other:?}"),
            }
        }
        for (what, bytes) in &undecodable {
            let (reply, _) = send_raw(&cred, addr, bytes).await;
            eprintln!("{what}: {reply:?}");
            match reply {
                Reply::Msg(TransferMsg::Failed(Refusal::Protocol(_))) => {}
                Reply::Closed(why) => eprintln!("{what}: the agent closed the stream ({why})"),
                other => panic!("{what}: expected a protocol refusal, got {other:?}"),
            }
        }

        // Well-formed frames that are not what the agent expects.
        let (reply, _) = send_raw(
            &cred,
            addr,
            &encode(&TransferMsg::Done {
                root: Hash([0; 32]),
                received_bytes: 0,
                corrupt_chunks: 0,
            }),
        )
        .await;
        assert!(
            matches!(reply, Reply::Msg(TransferMsg::Failed(Refusal::Protocol(_)))),
            "Done instead of an offer: {reply:?}"
        );
        let (reply, _) = send_after(
            &cred,
            addr,
            &encode(&Hello {
                version: PROTOCOL_VERSION + 1,
                service: Service::Transfer,
            }),
            &offer("m", manifest(vec![])),
        )
        .await;
        assert!(
            matches!(
                reply,
                Reply::Msg(TransferMsg::Failed(Refusal::Version { .. }))
            ),
            "protocol version + 1: {reply:?}"
        );

        // A hello naming no service, an oversized hello, and an admin
        // request past its limit: each refused with a protocol refusal,
        // none read into memory.
        let mut unknown = encode(&Hello::new(Service::Admin));
        *unknown.last_mut().unwrap() = 9;
        let mut huge_hello = encode(&Hello::new(Service::Admin));
        huge_hello[..4].copy_from_slice(&(1u32 << 20).to_be_bytes());
        let huge_request = (64u32 << 20).to_be_bytes().to_vec();
        for (what, hello, rest) in [
            ("unknown service", unknown, vec![]),
            ("1 MiB hello", huge_hello, vec![]),
            (
                "64 MiB admin request",
                encode(&Hello::new(Service::Admin)),
                huge_request,
            ),
        ] {
            let (reply, _) = send_after(&cred, addr, &hello, &rest).await;
            match reply {
                Reply::Msg(TransferMsg::Failed(Refusal::Protocol(why))) => {
                    eprintln!("{what}: {why}");
                    assert!(
                        why.contains("unreadable")
                            && (what == "unknown service" || why.contains("limit")),
                        "{what}: {why}"
                    );
                }
                other => panic!("{what}: expected a protocol refusal, got {other:?}"),
            }
        }

        // A file that claims a terabyte, consistently with its chunk
        // hashes: valid, but it cannot fit.
        let cs = 256 << 20;
        let chunks: Vec<Hash> = (0..4096u32)
            .map(|i| Hash(*blake3::hash(&i.to_le_bytes()).as_bytes()))
            .collect();
        let terabyte = Manifest {
            version: MANIFEST_VERSION,
            chunk_size: cs,
            entries: vec![Entry::File(FileEntry {
                path: RelPath::new("weights").unwrap(),
                size: 4096 * cs,
                hash: hash::file_hash_from_chunks(&chunks),
                executable: false,
                chunks,
            })],
        };
        terabyte.validate().unwrap();
        let (reply, _) = send_raw(&cred, addr, &offer("tera", terabyte)).await;
        assert!(
            matches!(
                reply,
                Reply::Msg(TransferMsg::Failed(Refusal::NoSpace { .. }))
            ),
            "a 1 TiB file: {reply:?}"
        );

        // The control: a valid offer through the same fake peer is accepted
        // and completed (it has no chunks to fetch), so the refusals above
        // are about the content, not about the fake peer.
        let ok = manifest(vec![
            Entry::Dir {
                path: RelPath::new("d").unwrap(),
            },
            Entry::File(file("empty", b"")),
        ]);
        let root_hash = ok.root();
        let (first, second) = send_raw(&cred, addr, &offer("control-ok", ok)).await;
        assert!(
            matches!(
                first,
                Reply::Msg(TransferMsg::Accepted {
                    held_bytes: 0,
                    need_bytes: 0,
                    ..
                })
            ),
            "valid offer: {first:?}"
        );
        match second {
            Some(Reply::Msg(TransferMsg::Done { root, .. })) => assert_eq!(root, root_hash),
            other => panic!("valid offer not completed: {other:?}"),
        }
    });
    drop(rt);

    assert!(agent.running(), "the agent died: {}", agent.log());
    // Nothing outside the root was touched.
    assert_eq!(listing(&parent), parent_before);
    let sentinel_after = snapshot(&parent)
        .into_iter()
        .filter(|(p, _)| p == "sentinel")
        .collect::<Vec<_>>();
    assert_eq!(sentinel_after, sentinel_before);
    assert_eq!(Path::new("/etc/x").exists(), etc_x_before);
    assert_eq!(std::fs::read("/etc/passwd").ok(), passwd_before);
    assert!(!t.path().join("evil").exists() && !t.path().join("evil-dir").exists());
    // No model folder but the control's.
    assert_eq!(
        listing(&root),
        [".xfer".to_string(), "control-ok".to_string()].into()
    );
    assert_eq!(
        listing(&root.join(".xfer/models")),
        ["control-ok.json".to_string()].into()
    );
    assert!(root.join("control-ok/d").is_dir());
    assert_eq!(std::fs::read(root.join("control-ok/empty")).unwrap(), b"");
    // The refused terabyte reserved nothing.
    let staged: u64 = walk(&root.join(".xfer/staging"))
        .iter()
        .filter(|(p, _)| p.contains("/data/"))
        .map(|(_, n)| match n {
            Node::File { len, .. } => *len,
            _ => 0,
        })
        .sum();
    assert_eq!(staged, 0);

    // The agent still accepts a real push.
    let src = t.path().join("real");
    gen_model(&src, 2 * MIB, 32);
    let s = push_ok(&src, &[&agent.addr], &key, &[]);
    assert_eq!(s.bytes_sent, tree_bytes(&src));
    assert_same_tree(&src, &root.join("real"));
}

/// A model folder on the agent with symlinks planted in it (by a local
/// user, or left over).
fn planted(tag: &str, seed: u64) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let t = tempdir(tag);
    keygen(&t.path().join("key"));
    let src = t.path().join("src");
    gen_model(&src, 2 * MIB, seed);
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("victim"), b"original").unwrap();
    (t, src, outside)
}

fn assert_untouched(outside: &Path) {
    assert_eq!(listing(outside), ["victim".to_string()].into());
    assert_eq!(std::fs::read(outside.join("victim")).unwrap(), b"original");
}

/// Planted symlinks are never written through: a link where a file goes is
/// replaced, not followed; a link where a directory goes makes the push
/// fail without touching what it points to.
#[test]
fn planted_symlinks_are_never_followed() {
    let (t, src, outside) = planted("planted", 33);
    let key = t.path().join("key");
    let root = t.path().join("root");
    let m1 = root.join("m1");
    std::fs::create_dir_all(&m1).unwrap();
    std::os::unix::fs::symlink(outside.join("victim"), m1.join(CONFIG)).unwrap();
    let m2 = root.join("m2");
    std::fs::create_dir_all(&m2).unwrap();
    std::os::unix::fs::symlink(&outside, m2.join("nested")).unwrap();
    let agent = Agent::start("127.0.0.31:0", &root, &key);

    push_ok(&src, &[&agent.addr], &key, &["--name", "m1"]);
    assert_untouched(&outside);
    assert!(!std::fs::symlink_metadata(m1.join(CONFIG))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_same_tree(&src, &m1);

    let r = push(&src, &[&agent.addr], &key, &["--name", "m2"]);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(r.stderr.contains("symlink"), "{r:#?}");
    assert_untouched(&outside);
    for (rel, node) in walk(&m2) {
        if let Node::File { .. } = node {
            same_bytes(&src.join(&rel), &m2.join(&rel)).unwrap();
        }
    }
}

/// After a file's chunks are all in staging but placing it failed (here: a
/// planted symlink in its way, since removed; equally an agent killed
/// between the last chunk and the rename), a re-run must place it.
#[test]
fn a_file_complete_in_staging_is_placed_by_the_next_push() {
    let (t, src, outside) = planted("planted-resume", 34);
    let key = t.path().join("key");
    let root = t.path().join("root");
    let model = root.join("m");
    std::fs::create_dir_all(&model).unwrap();
    std::os::unix::fs::symlink(&outside, model.join("nested")).unwrap();
    let agent = Agent::start("127.0.0.32:0", &root, &key);
    let r = push(&src, &[&agent.addr], &key, &["--name", "m"]);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");

    std::fs::remove_file(model.join("nested")).unwrap();
    push_ok(&src, &[&agent.addr], &key, &["--name", "m"]);
    assert_same_tree(&src, &model);
    assert_untouched(&outside);
}

/// The model folder itself being a symlink that points outside: a push
/// under that name is refused, says why, and writes nothing through it.
#[test]
fn a_model_folder_that_is_a_symlink_is_refused() {
    let (t, src, outside) = planted("planted-model-dir", 35);
    let key = t.path().join("key");
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("m")).unwrap();
    let agent = Agent::start("127.0.0.33:0", &root, &key);

    let r = push(&src, &[&agent.addr], &key, &["--name", "m"]);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(
        r.stderr
            .contains("it is a symlink; xfer never writes through links"),
        "{r:#?}"
    );
    assert_untouched(&outside);
    assert!(std::fs::symlink_metadata(root.join("m"))
        .unwrap()
        .file_type()
        .is_symlink());
    // No record of a model that was never placed.
    assert!(!root.join(".xfer/models/m.json").exists());
}

/// A path or link target with control characters (a newline, an escape
/// sequence, DEL, a C1 CSI) is refused, whether it arrives as a path (which
/// does not even decode) or as a link target (which decodes, then fails
/// validation). Each refusal names the path escaped, the agent's log
/// carries no raw control character, and no file or folder is created.
#[test]
fn control_characters_in_paths_are_refused_shown_escaped_and_create_nothing() {
    let t = tempdir("bad-manifest-ctl");
    let key = t.path().join("key");
    keygen(&key);
    let root = t.path().join("root");
    let mut agent = Agent::start("127.0.0.34:0", &root, &key);
    let addr: SocketAddr = agent.addr.parse().unwrap();
    let small = b"injected".to_vec();
    let evil = "a\nb\u{1b}[31mRED";
    let shown = r"a\nb\u{1b}[31mRED";

    let paths: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "a file named with a newline and ESC",
            raw_offer("m", vec![RawEntry::File(raw_file(evil, &small))]),
            shown,
        ),
        (
            "a file with DEL in a folder's name",
            raw_offer("m", vec![RawEntry::File(raw_file("d\u{7f}/x", &small))]),
            r"d\u{7f}/x",
        ),
        (
            "an empty folder named with a C1 CSI and a tab",
            raw_offer(
                "m",
                vec![RawEntry::Dir {
                    path: "\u{9b}31m\tx".into(),
                }],
            ),
            r"\u{9b}31m\tx",
        ),
    ];
    let link = manifest(vec![
        Entry::File(file("a", &small)),
        Entry::Symlink {
            path: RelPath::new("l").unwrap(),
            target: evil.into(),
        },
    ]);
    let cred = Credential::load(&key).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for (what, bytes, shown) in &paths {
            let (reply, _) = send_raw(&cred, addr, bytes).await;
            eprintln!("{what}: {reply:?}");
            match reply {
                Reply::Msg(TransferMsg::Failed(Refusal::Protocol(why))) => {
                    assert!(why.contains(shown), "{what}: `{why}` lacks `{shown}`");
                    assert!(why.contains("control character"), "{what}: {why}");
                    assert!(!why.chars().any(char::is_control), "{what}: {why:?}");
                }
                other => panic!("{what}: expected a protocol refusal, got {other:?}"),
            }
        }
        let (reply, _) = send_raw(&cred, addr, &offer("m", link)).await;
        eprintln!("link target: {reply:?}");
        match reply {
            Reply::Msg(TransferMsg::Failed(Refusal::BadManifest(why))) => {
                assert!(why.contains(shown), "`{why}` lacks `{shown}`");
                assert!(!why.chars().any(char::is_control), "{why:?}");
            }
            other => panic!("link target: expected BadManifest, got {other:?}"),
        }
    });
    drop(rt);

    assert!(agent.running(), "the agent died: {}", agent.log());
    let log = agent.log();
    assert!(
        !log.contains('\u{1b}') && !log.contains('\u{9b}') && !log.contains('\u{7f}'),
        "a raw control character reached the agent's log:\n{log:?}"
    );
    // No model folder, nothing named with a control character anywhere.
    assert_eq!(listing(&root), [".xfer".to_string()].into());
    for (rel, _) in walk(&root) {
        assert!(!rel.chars().any(char::is_control), "created {rel:?}");
    }
    assert!(!root.join(".xfer/models/m.json").exists());
}

/// A connection that asks to join a running transfer as one more lane
/// (`TransferMsg::Lane`) must carry the secret that transfer's `Accepted`
/// gave its source alone: with the cluster's own credential but the wrong
/// key it is refused as forbidden and attached to nothing; with the key it
/// attaches, from another connection than the offer's (as a source that
/// fell back to management attaches a lane over the fabric).
#[test]
fn a_lane_without_the_transfers_key_is_refused() {
    let t = tempdir("lane-key");
    let key = t.path().join("key");
    keygen(&key);
    let mut agent = Agent::start("127.0.0.31:0", &t.path().join("root"), &key);
    let addr: SocketAddr = agent.addr.parse().unwrap();
    let cred = Credential::load(&key).unwrap();
    let data = random_bytes(31, "data", 200_000);
    let m = manifest(vec![Entry::File(file("w.bin", &data))]);
    let root = m.root();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // The source's offer, held open: the transfer runs, waiting for
        // chunk requests to be served.
        let ep = client_endpoint(&cred, addr).unwrap();
        let conn = connect(&ep, addr, Duration::from_secs(5)).await.unwrap();
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&encode(&Hello::new(Service::Transfer)))
            .await
            .unwrap();
        send.write_all(&offer("laned", m.clone())).await.unwrap();
        let lane_key = match read_reply(&mut recv).await {
            Reply::Msg(TransferMsg::Accepted { lane_key, .. }) => lane_key,
            other => panic!("the offer was not accepted: {other:?}"),
        };
        let lane = |key: [u8; 16]| {
            encode(&TransferMsg::Lane {
                name: ModelName::new("laned").unwrap(),
                root,
                key,
            })
        };
        let mut wrong = lane_key;
        wrong[0] ^= 1;
        let (reply, _) = send_raw(&cred, addr, &lane(wrong)).await;
        assert!(
            matches!(&reply, Reply::Msg(TransferMsg::Failed(Refusal::Forbidden(why))) if why.contains("only its source may add connections")),
            "a lane with the wrong key: {reply:?}"
        );
        let (reply, _) = send_raw(&cred, addr, &lane(lane_key)).await;
        assert!(
            matches!(reply, Reply::Msg(TransferMsg::LaneAttached { lanes: 2 })),
            "a lane with the key: {reply:?}"
        );
        conn.close(0u32.into(), b"bye");
    });
    assert!(agent.running(), "the agent died: {}", agent.log());
}
