//! Torture of one node under faults, with figures: a disk that fills up in
//! the middle of a push, bit rot on a node that holds a complete model, and
//! a storm of unauthenticated connections.
//!
//! Every case prints one line to stderr for the summary table:
//!
//! ```text
//! TORTURE case=<name> <key>=<value> ...
//! ```
//!
//! The default (short) mode is sized for CI. The long mode flips more bytes,
//! sends more attackers and moves more data:
//!
//! ```text
//! XFER_TORTURE=long cargo test -p xfer --test torture_node -- --nocapture --test-threads=1
//! ```
//!
//! `XFER_TORTURE_SEED=N` replays the bit-rot case's random flips. The disk
//! case needs root (a loop-mounted ext4 image, else a tmpfs); without it, it
//! says why and passes.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use xfer::agent::sync::status::ModelState;

use common::cluster::*;
use common::*;

/// Prints the case's figures line (`TORTURE case=NAME k=v ...`).
fn figures(case: &str, pairs: &[(&str, String)]) {
    let mut line = format!("TORTURE case={case}");
    for (k, v) in pairs {
        assert!(
            !v.is_empty() && !v.contains(char::is_whitespace),
            "figure {k}={v:?} must be one word"
        );
        line.push_str(&format!(" {k}={v}"));
    }
    eprintln!("{line}");
}

// ---------------------------------------------------------------------------
// 1. Disk full

/// A push into a small filesystem (loop-mounted ext4, else tmpfs) that
/// another writer fills in the middle of the push: the push fails with one
/// line naming the node, the lack of space and the fix; nothing is presented
/// as complete; once the space is freed the same push resumes from what the
/// agent already held and completes byte-identical.
///
/// (A push larger than the free space from the start is refused before a
/// byte moves, with nothing to resume: tests/disk_full.rs covers that.)
#[test]
fn disk_full() {
    let t = tempdir("torture-disk");
    let key = t.path().join("key");
    keygen(&key);
    let model = sized(24, 160) * MIB;
    let src = t.path().join("m");
    gen_model(&src, model, 81);
    let manifest = scan(&src, MIB);
    let total = tree_bytes(&src);
    let disk = match SmallDisk::mount(&t.path().join("mnt"), sized(64, 256)) {
        Ok(d) => d,
        Err(why) => {
            eprintln!("SKIPPED: the disk-full case needs a small filesystem (run as root): {why}");
            return;
        }
    };
    let root = disk.dir.join("root");
    let agent = Agent::start("127.0.0.81:0", &root, &key);
    let cluster = t.path().join("cluster.toml");
    write_cluster_file(&cluster, &key, &[("n1", &agent.addr, &root)]);

    // Ballast: leave room for the model and a little more, so the push
    // passes the agent's up-front space check.
    let ballast = disk.dir.join("ballast");
    let free = xfer::store::free_space(&disk.dir).unwrap();
    let leave = total + 4 * MIB;
    assert!(
        free > leave,
        "{} is too small: {free} bytes free",
        disk.kind
    );
    write_random(&ballast, free - leave, 81);

    let pusher = Proc::spawn(&mut push_cmd(
        &src,
        &[&agent.addr],
        &key,
        &["--limit-rate", "8MiB", "--chunk-size", "1MiB"],
    ));
    let journal = agent.journal("m");
    wait_until("the first chunks", Duration::from_secs(60), || {
        journal_held_bytes(&journal, &manifest) >= 2 * MIB
    });
    fill_disk(&ballast);
    let r = pusher.wait(Duration::from_secs(120));
    let held = journal_held_bytes(&journal, &manifest);
    assert_eq!(
        r.status.code(),
        Some(1),
        "the push into a full disk must fail: {r:#?}\nagent: {}",
        agent.log()
    );

    // One line that names the node, says the disk is full and what to do.
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains(&agent.addr))
        .unwrap_or_else(|| panic!("no error line names {}: {r:#?}", agent.addr));
    eprintln!("disk full: {line}");
    let lower = line.to_lowercase();
    assert!(
        lower.contains("no space") || lower.contains("disk full"),
        "the error must say the disk is full: {line:?}"
    );
    assert!(
        lower.contains("free space") && lower.contains("--root"),
        "the error must say how to fix it: {line:?}"
    );
    let s: PushJson = r.json();
    let node = s.node(&agent.addr);
    assert!(!node.ok, "{s:#?}");
    assert!(
        node.error.as_deref().is_some_and(|e| e.contains("space")),
        "the node's error: {node:#?}"
    );

    // Nothing is presented as complete.
    assert_no_wrong_files(&src, &root.join("m"));
    assert!(
        !root.join(".xfer/models/m.json").exists(),
        "a failed model has a record"
    );
    assert!(held > 0, "nothing was held when the disk filled");
    let st = status(&cluster);
    let m = st
        .model("n1", "m")
        .unwrap_or_else(|| panic!("status does not list the failed model: {st:#?}"));
    assert_eq!(m.state, ModelState::Failed, "{m:#?}");
    assert!(
        m.last_error.as_deref().is_some_and(|e| e.contains("space")),
        "status does not say why: {m:#?}"
    );
    // What a re-run resumes from (status used to say 0 of 0 bytes).
    assert_eq!(
        (m.bytes_held, m.bytes_total),
        (held, total),
        "status of the failed model: {m:#?}"
    );

    // Make room; the same push resumes.
    fs::remove_file(&ballast).unwrap();
    let s = push_ok(&src, &[&agent.addr], &key, &["--chunk-size", "1MiB"]);
    assert_eq!(
        s.bytes_skipped, held,
        "the re-run did not reuse what the agent held: {s:#?}"
    );
    assert_eq!(s.bytes_sent + s.bytes_skipped, total, "{s:#?}");
    assert_same_tree(&src, &root.join("m"));
    let (r, v) = verify(&root.join("m"));
    assert!(r.success() && v["ok"] == true, "{r:#?}");
    let st = status(&cluster);
    assert_eq!(
        st.model("n1", "m").map(|m| m.state),
        Some(ModelState::Complete),
        "{st:#?}"
    );

    figures(
        "disk_full",
        &[
            ("fs", disk.kind.to_string()),
            ("bytes_before_full", held.to_string()),
            ("resumed_skipped", s.bytes_skipped.to_string()),
            ("ok", "1".into()),
        ],
    );
}

// ---------------------------------------------------------------------------
// 2. Bit rot

/// Picks `k` distinct chunks of the non-empty files of `manifest` and one
/// byte offset inside each: (file path, chunk index, file offset).
fn pick_flips(
    manifest: &xfer_proto::manifest::Manifest,
    k: usize,
    rng: &mut SmallRng,
) -> Vec<(String, u32, u64)> {
    let cs = manifest.chunk_size;
    let chunks: Vec<(String, u32, u64)> = manifest
        .files()
        .flat_map(|f| {
            (0..f.chunks.len() as u64).map(move |i| {
                let len = cs.min(f.size - i * cs);
                (f.path.to_string(), i as u32, len)
            })
        })
        .collect();
    assert!(chunks.len() >= k, "{} chunks, {k} flips", chunks.len());
    let mut picked = BTreeSet::new();
    while picked.len() < k {
        picked.insert(rng.gen_range(0..chunks.len()));
    }
    picked
        .into_iter()
        .map(|n| {
            let (path, i, len) = chunks[n].clone();
            (path, i, i as u64 * cs + rng.gen_range(0..len))
        })
        .collect()
}

/// The (file, chunk) pairs `xfer verify --json` reports damaged.
fn reported_chunks(v: &serde_json::Value) -> BTreeSet<(String, u32)> {
    let mut out = BTreeSet::new();
    for m in v["mismatched"].as_array().into_iter().flatten() {
        let path = m["path"].as_str().unwrap_or_default().to_string();
        for c in m["bad_chunks"].as_array().into_iter().flatten() {
            out.insert((path.clone(), c.as_u64().unwrap() as u32));
        }
    }
    out
}

/// Two agents hold a model; K bytes in K distinct chunks rot on one of them
/// (most with the mtime put back, some not). `xfer verify` names every
/// damaged chunk and no other; the agent's periodic verify then repairs the
/// node from its peer until it is byte-identical to the source.
#[test]
fn bit_rot() {
    let k = sized(8, 200);
    let seed: u64 = std::env::var("XFER_TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(82);
    let mut c = Cluster::start("torture-rot", 82, &["a", "b"], &["--verify-every", "1"]);
    let src = c.dir.path().join("src/m");
    gen_model(&src, sized(8, 96) * MIB, 82);
    let want = manifest_root(&src);
    let (id, _) = c.sync(
        &src,
        &["--from", "a", "--nodes", "a,b", "--chunk-size", "256KiB"],
    );
    assert_eq!(c.wait_complete(&id, "a", &["a", "b"], "m"), want);

    // Rot behind the agent's back while it is down.
    c.kill9("b");
    let model = c.root("b").join("m");
    let manifest = scan(&src, 256 * KIB);
    let mut rng = SmallRng::seed_from_u64(seed);
    let flips = pick_flips(&manifest, k, &mut rng);
    for (n, (path, _, offset)) in flips.iter().enumerate() {
        flip_byte(&model.join(path), *offset, n % 4 != 3);
    }
    let flipped: BTreeSet<(String, u32)> = flips.iter().map(|(p, i, _)| (p.clone(), *i)).collect();

    let (r, v) = verify(&model);
    assert!(!r.success(), "xfer verify passed a damaged model: {r:#?}");
    let reported = reported_chunks(&v);
    let missed: Vec<_> = flipped.difference(&reported).collect();
    let invented: Vec<_> = reported.difference(&flipped).collect();
    assert!(missed.is_empty(), "xfer verify missed {missed:?}: {v:#}");
    assert!(
        invented.is_empty(),
        "xfer verify reported intact chunks {invented:?}"
    );
    let detected = flipped.intersection(&reported).count();

    // The agent comes back, its periodic verify finds the damage and
    // repairs it from a.
    let started = Instant::now();
    c.restart("b");
    let files: BTreeSet<&String> = flips.iter().map(|(p, _, _)| p).collect();
    wait_until(&format!("b to repair {files:?}"), HANG, || {
        let damaged: Vec<&&String> = files
            .iter()
            .filter(|p| same_bytes(&src.join(p), &model.join(p)).is_err())
            .collect();
        if damaged.is_empty() {
            Ok(())
        } else {
            Err(Text(format!("still damaged: {damaged:?}\n{}", c.logs())))
        }
    });
    let repair_s = started.elapsed().as_secs_f64();
    c.poll("b to report the repair", Duration::from_secs(30), |s| {
        let m = s.model("b", "m")?;
        (m.state == ModelState::Complete && m.repaired_files >= files.len() as u64).then_some(())
    });
    assert_same_tree(&src, &model);
    let (r, v) = verify(&model);
    assert!(
        r.success() && v["ok"] == true,
        "xfer verify after repair: {r:#?}"
    );
    assert_eq!(
        c.status().model("a", "m").unwrap().repaired_files,
        0,
        "a was not damaged"
    );

    figures(
        "bit_rot",
        &[
            ("flips", k.to_string()),
            ("detected_by_verify", detected.to_string()),
            ("detect_rate", format!("{:.3}", detected as f64 / k as f64)),
            ("repaired", "1".into()),
            ("repair_s", format!("{repair_s:.2}")),
            ("seed", seed.to_string()),
        ],
    );
}

// ---------------------------------------------------------------------------
// 3. Authentication storm

/// Path → (is a dir, size, mtime) of everything under `root`.
fn snapshot(root: &Path) -> BTreeMap<String, (bool, u64, SystemTime)> {
    walk(root)
        .into_keys()
        .map(|rel| {
            let m = fs::symlink_metadata(root.join(&rel)).unwrap();
            (rel, (m.is_dir(), m.len(), m.modified().unwrap()))
        })
        .collect()
}

/// CPU time (user + system) `pid` has used.
fn cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|x| x.parse().unwrap())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis((f[0] + f[1]) * 1000 / hz)
}

/// The three kinds of intruder.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Intruder {
    /// No client certificate at all.
    NoCert,
    /// The cluster's own node certificate (anyone on the wire sees it in a
    /// handshake) replayed without its private key.
    StolenCert,
    /// A node certificate of another cluster, with its key: made from
    /// another `xfer keygen` key exactly as xfer makes one (the cluster is
    /// its CA's key, so the same CA and node names do not help).
    OtherCluster,
}

mod tls {
    //! Clients that trust any server, so only the agent can refuse them.

    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
    };
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::ResolvesClientCert;
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::sign::CertifiedKey;
    use rustls::{DigitallySignedStruct, SignatureScheme};

    /// Accepts any server certificate and remembers the last one.
    #[derive(Debug)]
    pub struct AcceptAny {
        pub seen: Mutex<Option<CertificateDer<'static>>>,
        provider: Arc<CryptoProvider>,
    }

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            *self.seen.lock().unwrap() = Some(end_entity.clone().into_owned());
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }

        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    }

    /// Presents a fixed certificate with a fixed (wrong) key.
    #[derive(Debug)]
    struct Present(Arc<CertifiedKey>);

    impl ResolvesClientCert for Present {
        fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
            Some(self.0.clone())
        }

        fn has_certs(&self) -> bool {
            true
        }
    }

    /// A QUIC client config speaking xfer's ALPN that trusts any server and
    /// presents `cert` signed with `key` (which need not be its own), or no
    /// certificate at all.
    pub fn client(
        verifier: Arc<AcceptAny>,
        identity: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
    ) -> quinn::ClientConfig {
        let provider = verifier.provider.clone();
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut cfg = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let key = provider.key_provider.load_private_key(key).unwrap();
                let ck = Arc::new(CertifiedKey::new(vec![cert], key));
                builder.with_client_cert_resolver(Arc::new(Present(ck)))
            }
        };
        cfg.alpn_protocols = vec![xfer_proto::names::ALPN.to_vec()];
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(cfg).unwrap();
        quinn::ClientConfig::new(Arc::new(quic))
    }

    /// A fresh P-256 key.
    pub fn fresh_key() -> PrivateKeyDer<'static> {
        let k = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        PrivateKeyDer::Pkcs8(k.serialize_der().into())
    }

    /// A node certificate of the cluster whose `xfer keygen` key is at
    /// `path`, made as xfer makes one (same CA name, same node name, same
    /// key usages), and its key.
    pub fn node_identity(path: &Path) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let pem = std::fs::read_to_string(path).unwrap();
        let Some(PrivateKeyDer::Pkcs8(der)) =
            rustls_pemfile::private_key(&mut pem.as_bytes()).unwrap()
        else {
            panic!("{} is not a PKCS#8 key", path.display());
        };
        let ca_key = KeyPair::from_pkcs8_der_and_sign_algo(&der, &PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(DnType::CommonName, "xfer cluster CA");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = p.self_signed(&ca_key).unwrap();
        let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p =
            CertificateParams::new(vec![xfer::config::auth::SERVER_NAME.to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, "xfer node");
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let leaf = p.signed_by(&leaf_key, &ca, &ca_key).unwrap();
        (
            leaf.der().clone(),
            PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
    }

    pub fn accept_any() -> Arc<AcceptAny> {
        Arc::new(AcceptAny {
            seen: Mutex::new(None),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        })
    }
}

/// How one connection attempt ended.
#[derive(Debug)]
enum Outcome {
    /// The agent refused it: the error the client saw.
    Refused(String),
    /// The agent answered on a stream.
    Answered(xfer_proto::admin::AdminReply),
}

/// Connects with `ep`, sends `msg` on a stream and waits for an answer.
async fn attempt(
    ep: &quinn::Endpoint,
    addr: SocketAddr,
    msg: &xfer_proto::admin::AdminRequest,
) -> Outcome {
    use xfer::transport::quic;
    let conn = match quic::connect(ep, addr, Duration::from_secs(5)).await {
        Ok(c) => c,
        Err(e) => return Outcome::Refused(e.to_string()),
    };
    let exchange = async {
        let (mut send, mut recv) = quic::open_service(&conn, xfer_proto::hello::Service::Admin)
            .await
            .map_err(anyhow::Error::msg)?;
        quic::write_frame(&mut send, msg).await?;
        let _ = send.finish();
        quic::read_frame::<xfer_proto::admin::AdminReply>(&mut recv).await
    };
    let out = match tokio::time::timeout(Duration::from_secs(5), exchange).await {
        Ok(Ok(reply)) => Outcome::Answered(reply),
        Ok(Err(e)) => Outcome::Refused(format!("{e:#}")),
        Err(_) => Outcome::Refused("TIMEOUT: no answer and no refusal within 5 s".into()),
    };
    conn.close(0u32.into(), b"done");
    out
}

/// A client endpoint on loopback with `cfg`.
fn endpoint(cfg: quinn::ClientConfig) -> quinn::Endpoint {
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    ep
}

/// What a storm did: every attempt, and the agent's CPU time during them.
struct Storm {
    outcomes: Vec<(Intruder, Outcome, Duration)>,
    agent_cpu: Duration,
}

/// `n` attempts of each kind of intruder against the agent `pid` at `addr`,
/// each trying to remove `victim`. First, clients with the cluster's key
/// that only ask for the status must be answered (so the harness can see an
/// admission).
fn storm(addr: SocketAddr, pid: u32, key: &Path, other: &Path, victim: &str, n: usize) -> Storm {
    use xfer_proto::admin::{AdminReply, AdminRequest};
    use xfer_proto::names::ModelName;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cred = xfer::config::auth::Credential::load(key).unwrap();
        let ours = xfer::transport::quic::client_endpoint(&cred, addr).unwrap();
        let status = AdminRequest::Status;
        let out = attempt(&ours, addr, &status).await;
        assert!(
            matches!(out, Outcome::Answered(AdminReply::Status(_))),
            "the cluster's own key was not answered, the storm would prove nothing: {out:?}"
        );

        // The hand-made clients below are answered when they hold the
        // cluster's key, so only the key can make them fail.
        let forged = endpoint(tls::client(
            tls::accept_any(),
            Some(tls::node_identity(key)),
        ));
        let out = attempt(&forged, addr, &status).await;
        assert!(
            matches!(out, Outcome::Answered(AdminReply::Status(_))),
            "a hand-made node certificate of the right cluster was not answered: {out:?}"
        );

        // Learn the node certificate the way an eavesdropper would.
        let spy = tls::accept_any();
        let _ = attempt(&endpoint(tls::client(spy.clone(), None)), addr, &status).await;
        let stolen = spy
            .seen
            .lock()
            .unwrap()
            .clone()
            .expect("the agent's certificate");

        let harm = AdminRequest::RemoveModel {
            name: ModelName::new(victim).unwrap(),
            force: true,
        };
        let intruders = [
            (Intruder::NoCert, None),
            (Intruder::StolenCert, Some((stolen, tls::fresh_key()))),
            (Intruder::OtherCluster, Some(tls::node_identity(other))),
        ]
        .map(|(kind, id)| (kind, endpoint(tls::client(tls::accept_any(), id))));
        let mut outcomes = Vec::new();
        let cpu = cpu_time(pid);
        for i in 0..n * intruders.len() {
            // Interleave the kinds, as a real storm would.
            let (kind, ep) = &intruders[i % intruders.len()];
            let t = Instant::now();
            let out = attempt(ep, addr, &harm).await;
            outcomes.push((*kind, out, t.elapsed()));
        }
        Storm {
            outcomes,
            agent_cpu: cpu_time(pid) - cpu,
        }
    })
}

/// The `q` quantile (0..=1) of `d`, in milliseconds.
fn quantile_ms(d: &mut [Duration], q: f64) -> f64 {
    d.sort();
    let i = ((d.len() - 1) as f64 * q).round() as usize;
    d[i].as_secs_f64() * 1000.0
}

/// One agent, N connections of each kind of intruder, each trying to remove
/// a model the agent holds: every one is refused before any stream is
/// answered, the root is untouched, the agent keeps running and serves its
/// own cluster afterwards. Figures: what a refusal costs, with a QUIC Retry
/// before every handshake (the default) and, in the same run, without
/// (`case=auth_no_retry`). The handshake rate limit is off here, so that
/// every attempt reaches the TLS handshake; `auth_rate_limited` storms the
/// default agent.
#[test]
fn auth() {
    auth_storm("auth", 83, &["--handshake-burst", "0"]);
    auth_storm(
        "auth_no_retry",
        86,
        &["--retry", "never", "--handshake-burst", "0"],
    );
}

fn auth_storm(case: &str, net: u8, extra: &[&str]) {
    let n = sized(60, 1000);
    let mut c = Cluster::start(&format!("torture-{case}"), net, &["n1"], extra);
    let other = c.dir.path().join("other-cluster.key");
    keygen(&other);
    let src = c.dir.path().join("src/m");
    gen_model(&src, 2 * MIB, 83);
    let agent_addr = c.member("n1").addr.clone();
    push_ok(&src, &[&agent_addr], &c.key, &[]);
    let root = c.root("n1").to_path_buf();
    let before = snapshot(&root);
    let pid = c.member("n1").agent.as_ref().unwrap().pid().unwrap();

    let addr: SocketAddr = agent_addr.parse().unwrap();
    let started = Instant::now();
    let Storm {
        outcomes,
        agent_cpu: cpu,
    } = storm(addr, pid, &c.key, &other, "m", n);

    let attempts = outcomes.len();
    assert_eq!(attempts, 3 * n);
    let answered: Vec<_> = outcomes
        .iter()
        .filter(|(_, o, _)| matches!(o, Outcome::Answered(_)))
        .collect();
    assert!(
        answered.is_empty(),
        "intruders were answered: {answered:#?}"
    );
    let slow: Vec<_> = outcomes
        .iter()
        .filter(|(_, o, _)| matches!(o, Outcome::Refused(e) if e.starts_with("TIMEOUT")))
        .collect();
    assert!(
        slow.is_empty(),
        "the agent neither answered nor refused: {slow:#?}"
    );
    let not_tls: Vec<_> = outcomes
        .iter()
        .filter(|(_, o, _)| matches!(o, Outcome::Refused(e) if !e.contains("handshake")))
        .collect();
    assert!(
        not_tls.is_empty(),
        "refused, but not by the TLS handshake: {not_tls:#?}"
    );
    let rejected = attempts - answered.len();
    for kind in [
        Intruder::NoCert,
        Intruder::StolenCert,
        Intruder::OtherCluster,
    ] {
        let (_, o, _) = outcomes.iter().find(|(k, _, _)| *k == kind).unwrap();
        eprintln!("{kind:?} is refused with: {o:?}");
    }

    let member = c.member_mut("n1");
    let agent = member.agent.as_mut().unwrap();
    assert!(agent.running(), "the agent died in the storm");
    // A storm cannot grow the log without bound: a few lines per 10 s.
    let logged = agent.log().matches("refused connection from").count();
    let windows = started.elapsed().as_secs() / 10 + 1;
    assert!(
        logged as u64 <= 5 * windows,
        "{logged} refusals logged one by one in {windows} window(s) of 10 s"
    );
    let after = snapshot(&root);
    assert_eq!(before, after, "the storm changed the agent's root");

    // The agent still serves its own cluster.
    let st = c.status();
    assert_eq!(
        st.model("n1", "m").map(|m| m.state),
        Some(ModelState::Complete),
        "{st:#?}"
    );
    let s = push_ok(&src, &[&agent_addr], &c.key, &[]);
    assert_eq!(s.bytes_sent, 0, "the model was damaged: {s:#?}");
    assert_same_tree(&src, &root.join("m"));

    let mut walls: Vec<Duration> = outcomes.iter().map(|(_, _, d)| *d).collect();
    figures(
        case,
        &[
            ("attempts", attempts.to_string()),
            ("rejected", rejected.to_string()),
            (
                "reject_rate",
                format!("{:.3}", rejected as f64 / attempts as f64),
            ),
            ("median_ms", format!("{:.2}", quantile_ms(&mut walls, 0.5))),
            ("p99_ms", format!("{:.2}", quantile_ms(&mut walls, 0.99))),
            (
                "agent_cpu_ms_per_attempt",
                format!("{:.3}", cpu.as_secs_f64() * 1000.0 / attempts as f64),
            ),
        ],
    );
}

/// The default agent under the same storm: after a burst of failed
/// handshakes the source is refused before its handshake (nothing to
/// verify, nothing to sign), a little at the refill rate still reaches the
/// handshake, none is answered, the refusals are logged within bounds, and
/// a node of the cluster at another address is still served.
#[test]
fn auth_rate_limited() {
    use xfer::agent::guard::{HANDSHAKES_PER_SECOND, HANDSHAKE_BURST};
    let n = sized(60, 1000);
    let mut c = Cluster::start("torture-auth-limited", 87, &["n1"], &[]);
    let other = c.dir.path().join("other-cluster.key");
    keygen(&other);
    let agent_addr = c.member("n1").addr.clone();
    let addr: SocketAddr = agent_addr.parse().unwrap();
    let pid = c.member("n1").agent.as_ref().unwrap().pid().unwrap();
    let started = Instant::now();
    let Storm {
        outcomes,
        agent_cpu: cpu,
    } = storm(addr, pid, &c.key, &other, "m", n);
    let elapsed = started.elapsed();
    let attempts = outcomes.len();
    let by_tls = outcomes
        .iter()
        .filter(|(_, o, _)| matches!(o, Outcome::Refused(e) if e.contains("handshake")))
        .count();
    let before = outcomes
        .iter()
        .filter(|(_, o, _)| matches!(o, Outcome::Refused(e) if e.contains("refused to accept")))
        .count();
    assert_eq!(
        by_tls + before,
        attempts,
        "neither refused by the handshake nor before it: {:#?}",
        outcomes
            .iter()
            .filter(|(_, o, _)| !matches!(o, Outcome::Refused(e)
                if e.contains("handshake") || e.contains("refused to accept")))
            .collect::<Vec<_>>()
    );
    let allowed =
        HANDSHAKE_BURST as f64 + HANDSHAKES_PER_SECOND as f64 * elapsed.as_secs_f64() + 1.0;
    assert!(
        (by_tls as f64) <= allowed,
        "{by_tls} handshakes in {elapsed:?}, the bucket allows {allowed:.0}"
    );
    assert!(before > 0, "the storm was never limited");
    let member = c.member_mut("n1");
    let agent = member.agent.as_mut().unwrap();
    assert!(agent.running(), "the agent died in the storm");
    let log = agent.log();
    let logged = log.matches("refused connection from").count();
    let windows = started.elapsed().as_secs() / 10 + 1;
    assert!(
        logged as u64 <= 5 * windows,
        "{logged} refusals logged one by one in {windows} window(s) of 10 s"
    );
    assert!(
        log.contains("refused connection from 127.0.0.1:"),
        "the refusals are not logged with their source: {log}"
    );
    let key = c.key.clone();
    runtime().block_on(async move {
        answers_status(&cluster_endpoint(&key, "127.0.87.20"), addr).await;
    });
    figures(
        "auth_rate_limited",
        &[
            ("attempts", attempts.to_string()),
            ("reached_handshake", by_tls.to_string()),
            ("refused_before", before.to_string()),
            (
                "agent_cpu_ms_per_attempt",
                format!("{:.3}", cpu.as_secs_f64() * 1000.0 / attempts as f64),
            ),
        ],
    );
}

// ---------------------------------------------------------------------------
// 4. A hostile peer that holds the cluster's key

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`, `VmData`, ...).
fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A client endpoint bound to `bind` (a loopback address of its own, so
/// the agent sees it as its own source) holding the cluster's key.
fn cluster_endpoint(key: &Path, bind: &str) -> quinn::Endpoint {
    let cred = xfer::config::auth::Credential::load(key).unwrap();
    let tls =
        quinn::crypto::rustls::QuicClientConfig::try_from(cred.client_config().unwrap()).unwrap();
    let mut cfg = quinn::ClientConfig::new(std::sync::Arc::new(tls));
    cfg.transport_config(std::sync::Arc::new(
        xfer::transport::quic::transport_config(),
    ));
    let mut ep = quinn::Endpoint::client(format!("{bind}:0").parse().unwrap()).unwrap();
    ep.set_default_client_config(cfg);
    ep
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Bounds one step of an attack: it must not hang.
async fn step<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no progress within 30 s"))
}

/// The agent answers its own cluster's status request from `ep`.
async fn answers_status(ep: &quinn::Endpoint, addr: SocketAddr) {
    use xfer_proto::admin::{AdminReply, AdminRequest};
    let out = attempt(ep, addr, &AdminRequest::Status).await;
    assert!(
        matches!(out, Outcome::Answered(AdminReply::Status(_))),
        "the agent no longer answers a status request: {out:?}"
    );
}

/// The attack of issue 15: a peer with the cluster's key opens 1,000
/// streams and on each claims a 64 MiB frame (the length prefix and a few
/// bytes, then silence). The agent reads the claims into buffers that grow
/// only with the bytes that arrive, so its memory stays bounded; one
/// connection's streams stop at the stream cap (the rest wait for credit);
/// and the agent still answers a normal request afterwards.
///
/// Each stream is the control stream of its own connection (the agent
/// reads a manifest-sized frame, up to `MAX_FRAME`, only there), spread
/// over 20 source addresses of 50 connections each (the per-source cap is
/// 64). One more connection serves a held model and claims the largest
/// chunk request on as many chunk streams as the agent allows.
#[test]
fn a_thousand_64_mib_claims() {
    use xfer::transport::quic::{self, MAX_CONCURRENT_STREAMS};
    use xfer_proto::frame::{MAX_FRAME, STREAM_REQUEST_LIMIT};
    use xfer_proto::hello::Service;
    use xfer_proto::names::ModelName;
    use xfer_proto::transfer::TransferMsg;
    const SOURCES: usize = 20;
    const PER_SOURCE: usize = 50;
    // Chosen from measurement (printed below) with margin.
    const RSS_BOUND_MIB: u64 = 200;

    let t = tempdir("torture-claims");
    let key = t.path().join("key");
    keygen(&key);
    let root = t.path().join("root");
    let agent = Agent::start("127.0.84.1:0", &root, &key);
    let addr: SocketAddr = agent.addr.parse().unwrap();
    let pid = agent.pid().unwrap();
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 84);
    push_ok(&src, &[&agent.addr], &key, &[]);
    let rss_before = proc_kib(pid, "VmRSS");
    let data_before = proc_kib(pid, "VmData");

    let rt = runtime();
    let (opened, served_streams) = rt.block_on(async {
        let claim = |bytes: usize| {
            let mut b = (bytes as u32).to_be_bytes().to_vec();
            b.extend_from_slice(b"a few bytes");
            b
        };
        // Everything stays open until the end: endpoints, connections,
        // streams.
        let mut endpoints = Vec::new();
        let mut held = Vec::new();
        let mut handshake_retries = 0u32;
        for s in 0..SOURCES {
            let ep = cluster_endpoint(&key, &format!("127.0.84.{}", 10 + s));
            for i in 0..PER_SOURCE {
                // Generous: the test is about memory, not latency, on a
                // machine other work may share.
                // About one run in four, one of these thousand handshakes
                // gets no answer within quinn's idle timeout (no UDP drops
                // counted, nothing in the agent's log; not understood yet).
                // The test is about memory: such a handshake is tried
                // again, at most twice, and the retries are reported.
                let mut tries = 0;
                let conn = loop {
                    tries += 1;
                    match step("connect", quic::connect(&ep, addr, Duration::from_secs(20))).await {
                        Ok(c) => break c,
                        Err(e) if tries < 3 && e.to_string().contains("timed out") => {
                            handshake_retries += 1
                        }
                        Err(e) => panic!("source {s}, connection {i}, try {tries}: {e}"),
                    }
                };
                let (mut send, recv) = step("open", quic::open_service(&conn, Service::Transfer))
                    .await
                    .unwrap();
                step("claim", send.write_all(&claim(MAX_FRAME)))
                    .await
                    .unwrap();
                held.push((conn, send, recv));
            }
            endpoints.push(ep);
        }

        // One connection: more streams than the stream cap, each claiming
        // a 64 MiB frame. The agent reads only the first (the control
        // stream); the others hold their credit, so opening stops at the
        // cap: a stream that gets no credit within the bound is the cap.
        let ep = cluster_endpoint(&key, "127.0.84.40");
        let conn = quic::connect(&ep, addr, Duration::from_secs(5))
            .await
            .unwrap();
        let (mut send, recv) = quic::open_service(&conn, Service::Transfer).await.unwrap();
        send.write_all(&claim(MAX_FRAME)).await.unwrap();
        held.push((conn.clone(), send, recv));
        let mut opened = 1;
        while opened < 1000 {
            match tokio::time::timeout(Duration::from_secs(2), conn.open_bi()).await {
                Ok(Ok((mut send, recv))) => {
                    step("claim", send.write_all(&claim(MAX_FRAME)))
                        .await
                        .unwrap();
                    held.push((conn.clone(), send, recv));
                    opened += 1;
                }
                Ok(Err(e)) => panic!("opening a stream failed: {e}"),
                Err(_) => break,
            }
        }

        // The chunk-stream path: a connection that asked for a held model
        // claims the largest chunk request on as many streams as allowed.
        let conn = quic::connect(&ep, addr, Duration::from_secs(5))
            .await
            .unwrap();
        let (mut send, mut recv) = quic::open_service(&conn, Service::Transfer).await.unwrap();
        let want = TransferMsg::Want {
            name: ModelName::new("m").unwrap(),
        };
        quic::write_frame(&mut send, &want).await.unwrap();
        let have: TransferMsg = step("have", quic::read_frame(&mut recv)).await.unwrap();
        assert!(matches!(have, TransferMsg::Have { .. }), "{have:?}");
        let mut served = 0;
        while served < 1000 {
            match tokio::time::timeout(Duration::from_secs(2), conn.open_bi()).await {
                Ok(Ok((mut send, recv))) => {
                    step("claim", send.write_all(&claim(STREAM_REQUEST_LIMIT)))
                        .await
                        .unwrap();
                    held.push((conn.clone(), send, recv));
                    served += 1;
                }
                Ok(Err(e)) => panic!("opening a chunk stream failed: {e}"),
                Err(_) => break,
            }
        }

        // A normal request, from an address of its own: answered. (Its
        // round trip also means the agent has taken in the claims above.)
        answers_status(&cluster_endpoint(&key, "127.0.84.2"), addr).await;
        let rss = proc_kib(pid, "VmRSS");
        let hwm = proc_kib(pid, "VmHWM");
        let data = proc_kib(pid, "VmData");
        figures(
            "claims",
            &[
                ("connections", (SOURCES * PER_SOURCE + 2).to_string()),
                ("claims_64mib", (SOURCES * PER_SOURCE + opened).to_string()),
                ("handshake_retries", handshake_retries.to_string()),
                ("streams_on_one_connection", opened.to_string()),
                ("chunk_streams", served.to_string()),
                ("rss_before_mib", (rss_before / 1024).to_string()),
                ("rss_mib", (rss / 1024).to_string()),
                ("rss_peak_mib", (hwm / 1024).to_string()),
                ("vm_data_before_mib", (data_before / 1024).to_string()),
                ("vm_data_mib", (data / 1024).to_string()),
            ],
        );
        assert!(
            handshake_retries <= 5,
            "{handshake_retries} of the 1,000 handshakes had to be tried again"
        );
        assert!(
            hwm < RSS_BOUND_MIB << 10,
            "the agent's RSS peaked at {} MiB under the attack (bound {RSS_BOUND_MIB} MiB)",
            hwm / 1024
        );
        // What the claims would have reserved: 1,000 x 64 MiB of address
        // space (untouched pages do not show in RSS, so check this too).
        assert!(
            data < data_before + (4 << 20),
            "the agent's data segment grew from {} to {} MiB",
            data_before / 1024,
            data / 1024
        );
        drop(held);
        drop(endpoints);
        (opened, served)
    });
    assert_eq!(
        opened, MAX_CONCURRENT_STREAMS as usize,
        "streams one connection could hold open"
    );
    // The connection's control stream (the want) is still open too.
    assert_eq!(
        served_streams + 1,
        MAX_CONCURRENT_STREAMS as usize,
        "chunk streams one connection could hold open"
    );
}

/// Connections from one source address over the cap are refused before
/// their handshake (and logged, naming the source); a connection from
/// another address still works, and so does one from the same address
/// once it is under the cap again.
#[test]
fn connections_per_source_are_capped() {
    use xfer::agent::guard::MAX_CONNECTIONS_PER_SOURCE;
    use xfer::transport::quic;
    use xfer_proto::hello::Service;

    let t = tempdir("torture-cap");
    let key = t.path().join("key");
    keygen(&key);
    let agent = Agent::start("127.0.85.1:0", &t.path().join("root"), &key);
    let addr: SocketAddr = agent.addr.parse().unwrap();
    runtime().block_on(async {
        let ep = cluster_endpoint(&key, "127.0.85.10");
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS_PER_SOURCE {
            let conn = step("connect", quic::connect(&ep, addr, Duration::from_secs(5)))
                .await
                .unwrap();
            // A session the agent keeps: an admin stream, no request yet.
            let stream = step("open", quic::open_service(&conn, Service::Admin))
                .await
                .unwrap();
            held.push((conn, stream));
        }
        let over = quic::connect(&ep, addr, Duration::from_secs(5)).await;
        let err = over.expect_err("a connection over the cap was accepted");
        assert!(err.to_string().contains("refused"), "{err}");
        eprintln!("over the cap: {err}");

        // Another source is not affected.
        answers_status(&cluster_endpoint(&key, "127.0.85.11"), addr).await;

        // Under the cap again (the agent counts a connection until its
        // session ends): the same source is answered.
        let (conn, _) = held.pop().unwrap();
        conn.close(0u32.into(), b"done");
        drop(conn);
        wait_until_async(
            "the same source answered under the cap again",
            HANG,
            || async {
                use xfer_proto::admin::{AdminReply, AdminRequest};
                match attempt(&ep, addr, &AdminRequest::Status).await {
                    Outcome::Answered(AdminReply::Status(_)) => Ok(()),
                    other => Err(other),
                }
            },
        )
        .await;
        drop(held);
    });
    let log = agent.log();
    assert!(
        log.contains("refused connection from 127.0.85.10:")
            && log.contains(&format!(
                "already holds {MAX_CONNECTIONS_PER_SOURCE} connections"
            )),
        "the refusal is not logged with its source: {log}"
    );
}

/// A peer with the key that opens a stream and then goes silent (after
/// the hello, or half-way through its request) is refused once the first
/// message has not arrived whole in time, and the agent goes on serving.
#[test]
fn a_silent_stream_is_refused_and_closed() {
    use xfer::transport::quic;
    use xfer_proto::admin::AdminReply;
    use xfer_proto::hello::Service;

    let t = tempdir("torture-silent");
    let key = t.path().join("key");
    keygen(&key);
    let agent = Agent::start_with(
        "127.0.86.1:0",
        &t.path().join("root"),
        &key,
        &["--first-message-timeout", "1"],
    );
    let addr: SocketAddr = agent.addr.parse().unwrap();
    runtime().block_on(async {
        let ep = cluster_endpoint(&key, "127.0.86.10");
        let conn = step("connect", quic::connect(&ep, addr, Duration::from_secs(5)))
            .await
            .unwrap();
        // Silent after the hello.
        let (_send, mut recv) = step("open", quic::open_service(&conn, Service::Admin))
            .await
            .unwrap();
        let reply: AdminReply = step("the refusal", quic::read_frame(&mut recv))
            .await
            .expect("a refusal frame");
        let AdminReply::Failed(r) = reply else {
            panic!("expected a refusal, got {reply:?}")
        };
        assert!(
            r.to_string()
                .contains("no complete admin request within 1s"),
            "{r}"
        );
        // Half a request (a length prefix for 100 bytes, then 10), on a
        // new connection: a refusal ends its session.
        let conn = step("connect", quic::connect(&ep, addr, Duration::from_secs(5)))
            .await
            .unwrap();
        let (mut send, mut recv) = step("open", quic::open_service(&conn, Service::Admin))
            .await
            .unwrap();
        send.write_all(&100u32.to_be_bytes()).await.unwrap();
        send.write_all(&[0u8; 10]).await.unwrap();
        let reply: AdminReply = step("the refusal", quic::read_frame(&mut recv))
            .await
            .expect("a refusal frame");
        assert!(matches!(reply, AdminReply::Failed(_)), "{reply:?}");
        answers_status(&ep, addr).await;
    });
}
