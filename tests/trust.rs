//! Issued credentials (`xfer ca`), each attack performed with real agents:
//! a node's credential (a stolen node disk) asking a node to run `id`, to
//! sync `/etc` or to remove a model; an agent answering for another node;
//! an agent started with an operator's credential; and a CA rotation while
//! a transfer runs, after which the old CA is refused everywhere.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common;
use common::cluster::{status, write_cluster_file, Status, JOB_DEADLINE};
use common::hub::assert_error;
use common::*;
use xfer::agent::sync::status::ModelState;
use xfer::config::auth::Credential;
use xfer_proto::admin::{AdminReply, AdminRequest, JobState};
use xfer_proto::launch::*;

/// A CA folder and the credentials issued from it, all via the CLI.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn init(t: &Path) -> Pki {
        let dir = t.join("ca");
        run(
            xfer().args(["ca", "init", "--dir"]).arg(&dir),
            Duration::from_secs(20),
        )
        .assert_ok("xfer ca init");
        Pki { dir }
    }

    /// `xfer ca issue NAME --role ROLE`, written (again) to `t/NAME.cred`.
    fn issue(&self, name: &str, role: &str) -> PathBuf {
        let out = self.dir.parent().unwrap().join(format!("{name}.cred"));
        run(
            xfer()
                .args(["ca", "issue", name, "--role", role, "--force", "--dir"])
                .arg(&self.dir)
                .arg("--out")
                .arg(&out),
            Duration::from_secs(20),
        )
        .assert_ok("xfer ca issue");
        out
    }

    /// Node credentials for `a` and `b`, and an operator's (`op`).
    fn two_nodes_and_an_operator(&self) -> (PathBuf, PathBuf, PathBuf) {
        (
            self.issue("a", "node"),
            self.issue("b", "node"),
            self.issue("op", "operator"),
        )
    }

    fn rotate(&self, finish: bool) {
        let mut cmd = xfer();
        cmd.args(["ca", "rotate", "--dir"]).arg(&self.dir);
        if finish {
            cmd.arg("--finish");
        }
        run(&mut cmd, Duration::from_secs(20)).assert_ok("xfer ca rotate");
    }
}

fn launch(cred: &Path, node: &str, agent: &Agent, req: &LaunchRequest) -> LaunchReply {
    ask_launch(&Credential::load(cred).unwrap(), node, agent, req)
}

fn admin(cred: &Path, node: &str, agent: &Agent, req: &AdminRequest) -> AdminReply {
    ask_admin(&Credential::load(cred).unwrap(), node, agent, req)
}

/// A rank whose one process writes `id` to `out`.
fn id_rank(run: &str, out: &Path) -> LaunchRequest {
    LaunchRequest::StartRank(Box::new(RankSpec {
        run: run.into(),
        node: "a".parse().unwrap(),
        rank: 0,
        env: Default::default(),
        procs: vec![ProcSpec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                format!("id > '{}'; exec sleep 600", out.display()),
            ],
            wait_tcp: None,
        }],
        on_stop: vec![],
        group: vec![],
        wait_timeout_ms: 1_000,
        grace_ms: 1_000,
        weights: None,
        evict_page_cache: false,
        container: None,
        caches: None,
        held: false,
        rendezvous: None,
    }))
}

fn forbidden(what: &str, reply: impl std::fmt::Debug) -> String {
    let text = format!("{reply:?}");
    assert!(
        text.contains("Forbidden") && text.contains("only an operator may"),
        "{what}: expected an operator-only refusal, got {text}"
    );
    text
}

fn hang_up(agent: &Agent) {
    let ok = std::process::Command::new("kill")
        .args(["-HUP", &agent.pid().unwrap().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -HUP");
}

/// Sends SIGHUP and waits for the agent to say it reloaded.
fn reload(agent: &Agent) {
    let before = agent.log().matches("reloaded").count();
    hang_up(agent);
    wait_until(
        "the agent to reload its credential",
        Duration::from_secs(30),
        || agent.log().matches("reloaded").count() > before,
    );
    assert!(
        !agent.log().contains("kept the loaded credential"),
        "{}",
        agent.log()
    );
}

#[test]
fn a_node_credential_moves_models_but_cannot_launch_sync_or_remove() {
    let t = tempdir("trust-roles");
    let (a_cred, b_cred, op) = Pki::init(t.path()).two_nodes_and_an_operator();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let export = t.path().display().to_string();
    let a = Agent::start_with(
        "127.0.0.71:0",
        &root,
        &a_cred,
        &["--allow-launch", "--export", &export, "--export", "/etc"],
    );
    let out = t.path().join("id.out");

    // Node b's credential: everything an operator's is refused, logged
    // with b's name, and nothing runs.
    forbidden("rank", launch(&b_cred, "a", &a, &id_rank("r1", &out)));
    let probe = LaunchRequest::RunQuery { run: None };
    forbidden("run query", launch(&b_cred, "a", &a, &probe));
    let stop_all = LaunchRequest::StopRun {
        run: None,
        grace_ms: 0,
        reason: "attack".into(),
    };
    forbidden("stop all", launch(&b_cred, "a", &a, &stop_all));
    let rm = AdminRequest::RemoveModel {
        name: xfer_proto::names::ModelName::new("m").unwrap(),
        force: true,
    };
    forbidden("rm", admin(&b_cred, "a", &a, &rm));
    let image = AdminRequest::LoadImage(Box::new(tiny_image()));
    forbidden("image load", admin(&b_cred, "a", &a, &image));
    assert!(!out.exists(), "a node's credential ran `id`");
    a.wait_log("refused node b at");

    // Through the CLI, with b's credential as the cluster file's key: a
    // sync from /etc is refused (a's exports allow /etc: the role is what
    // refuses it), the status is not.
    let file = t.path().join("cluster-b.toml");
    write_cluster_file(&file, &b_cred, &[("a", &a.addr, &root)]);
    let r = run(
        xfer()
            .args(["sync", "/etc", "--from", "a", "--nodes", "a", "--cluster"])
            .arg(&file),
        Duration::from_secs(30),
    );
    assert!(
        !r.success(),
        "a node's credential synced /etc: {}",
        r.stdout
    );
    assert!(r.stderr.contains("only an operator may"), "{}", r.stderr);
    assert!(!root.join("etc").exists());
    // A bare ORG/NAME: the role is the cause said, not a guess between a
    // folder and a repo.
    let r = run(
        xfer()
            .args([
                "sync",
                "acme/big-model",
                "--from",
                "a",
                "--nodes",
                "a",
                "--cluster",
            ])
            .arg(&file),
        Duration::from_secs(30),
    );
    let line = assert_error(&r, &["only an operator may", "refused"]);
    assert!(!line.contains("is a folder there"), "{line}");
    // A credential of another cluster's CA: the handshake is the cause,
    // not a stopped agent.
    let other = Pki::init(&t.path().join("other")).issue("op2", "operator");
    let foreign = t.path().join("cluster-foreign.toml");
    write_cluster_file(&foreign, &other, &[("a", &a.addr, &root)]);
    let r = run(
        xfer()
            .args([
                "sync",
                "hf://acme/big-model",
                "--from",
                "a",
                "--nodes",
                "a",
                "--cluster",
            ])
            .arg(&foreign),
        Duration::from_secs(30),
    );
    let line = assert_error(&r, &["authentication", "xfer ca issue"]);
    assert!(!line.contains("is its agent running"), "{line}");
    let s = status(&file);
    assert!(s.report("a").reachable, "{s:#?}");

    // The operator's credential may launch: the check is the role's.
    let reply = launch(&op, "a", &a, &id_rank("r2", &out));
    assert!(matches!(reply, LaunchReply::Runs(_)), "{reply:?}");
    wait_until(
        "the operator's rank to run id",
        Duration::from_secs(30),
        || std::fs::read_to_string(&out).is_ok_and(|s| s.contains("uid=")),
    );
    // Nor may node b release a live run's held ranks.
    let release = LaunchRequest::Release { run: "r2".into() };
    forbidden("release", launch(&b_cred, "a", &a, &release));
    let stop = LaunchRequest::StopRun {
        run: Some("r2".into()),
        grace_ms: 1_000,
        reason: "test over".into(),
    };
    launch(&op, "a", &a, &stop);

    // Even an operator loads no image and runs no rank in one where the
    // agent's operator named no container engine.
    let reply = format!("{:?}", admin(&op, "a", &a, &image));
    assert!(
        reply.contains("Forbidden") && reply.contains("--container-engine docker"),
        "{reply}"
    );
    let LaunchRequest::StartRank(mut rank) = id_rank("r3", &out) else {
        unreachable!()
    };
    rank.container = Some(ContainerSpec {
        image: "xt/app:1".into(),
        image_id: None,
        gpus: GpuAccess::None,
        shm_bytes: None,
    });
    let reply = format!(
        "{:?}",
        launch(&op, "a", &a, &LaunchRequest::StartRank(rank))
    );
    assert!(reply.contains("--container-engine docker"), "{reply}");
}

/// A one-layer image description (no blob of it is anywhere).
fn tiny_image() -> xfer_proto::image::ImageDesc {
    use xfer_proto::image::{BlobRef, Digest, ImageDesc};
    ImageDesc {
        reference: "xt/app:1".into(),
        config: BlobRef {
            digest: Digest([1; 32]),
            size: 10,
        },
        layers: vec![BlobRef {
            digest: Digest([2; 32]),
            size: 20,
        }],
        diff_ids: Vec::new(),
    }
}

#[test]
fn a_node_answers_only_for_itself_and_an_agent_refuses_an_operator_credential() {
    let t = tempdir("trust-names");
    let pki = Pki::init(t.path());
    let (b_cred, op) = (pki.issue("b", "node"), pki.issue("op", "operator"));
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let b = Agent::start("127.0.0.72:0", &root, &b_cred);

    // The cluster file says a is at b's address: b's answers are not
    // taken as a's.
    let file = t.path().join("cluster.toml");
    write_cluster_file(&file, &op, &[("a", &b.addr, &root)]);
    let s = status(&file);
    let a = s.report("a");
    assert!(!a.reachable, "b answered for a: {s:#?}");
    let why = a.error.clone().unwrap_or_default();
    assert!(why.contains("answered for a is node b"), "{why}");

    // An agent never runs with an operator's credential.
    let r = run(
        xfer()
            .args(["serve", "--listen", "127.0.0.72:0", "--root"])
            .arg(&root)
            .arg("--key")
            .arg(&op),
        Duration::from_secs(20),
    );
    assert!(!r.success());
    assert!(
        r.stderr
            .contains("an agent runs with its node's own credential"),
        "{}",
        r.stderr
    );
}

fn job_state(s: &Status, id: &str) -> Option<JobState> {
    s.job("a", id).map(|j| j.state.clone())
}

fn unreachable_everywhere(s: &Status) -> bool {
    s.0.iter().all(|r| {
        !r.reachable
            && r.error
                .as_deref()
                .is_some_and(|e| e.contains("authentication"))
    })
}

#[test]
fn a_ca_rotation_while_a_transfer_runs_needs_no_flag_day() {
    let t = tempdir("trust-rotate");
    let pki = Pki::init(t.path());
    let (a_cred, b_cred) = (pki.issue("a", "node"), pki.issue("b", "node"));
    let old_op = pki.issue("old-op", "operator");
    let (ra, rb) = (t.path().join("ra"), t.path().join("rb"));
    let export = t.path().display().to_string();
    let a = Agent::start_with("127.0.0.73:0", &ra, &a_cred, &["--export", &export]);
    let b = Agent::start("127.0.0.74:0", &rb, &b_cred);
    let nodes = [("a", a.addr.as_str(), ra.as_path()), ("b", &b.addr, &rb)];
    let old_file = t.path().join("old.toml");
    write_cluster_file(&old_file, &old_op, &nodes);

    let src = t.path().join("src/m96");
    gen_model(&src, 96 * MIB, 73);
    let r = run(
        xfer()
            .args([
                "sync",
                "--json",
                "--from",
                "a",
                "--nodes",
                "b",
                "--limit-rate",
                "8MiB",
            ])
            .arg("--cluster")
            .arg(&old_file)
            .arg(&src),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer sync");
    let id = r.json::<serde_json::Value>()["job"]
        .as_str()
        .unwrap()
        .to_string();
    wait_until("b to receive the first bytes", JOB_DEADLINE, || {
        status(&old_file)
            .model("b", "m96")
            .is_some_and(|m| m.state == ModelState::Syncing && m.bytes_held > 0)
    });

    // Rotate while the job runs: new CA, every agent reissued and
    // reloaded one at a time.
    pki.rotate(false);
    pki.issue("b", "node");
    reload(&b);
    // a (old certificate) and b (new) still talk; the old operator
    // reaches both; so does a new one.
    let s = status(&old_file);
    assert!(s.0.iter().all(|r| r.reachable), "{s:#?}");
    pki.issue("a", "node");
    reload(&a);
    let new_op = pki.issue("new-op", "operator");
    let new_file = t.path().join("new.toml");
    write_cluster_file(&new_file, &new_op, &nodes);
    let s = status(&new_file);
    assert!(s.0.iter().all(|r| r.reachable), "{s:#?}");
    assert!(
        !matches!(job_state(&s, &id), Some(JobState::Complete { .. })),
        "the transfer ended before the rotation; it must run through it: {s:#?}"
    );

    // The transfer finishes, verified, on the new credentials.
    let root = wait_until("the transfer to complete on b", HANG, || {
        let s = status(&new_file);
        if let Some(JobState::Complete { .. }) = job_state(&s, &id) {
            if let Some(root) = s.complete_root(&["b"], "m96") {
                return Ok(root);
            }
        }
        assert!(
            !matches!(job_state(&s, &id), Some(JobState::Failed { .. })),
            "the job failed during the rotation: {s:#?}\n{}\n{}",
            a.log(),
            b.log()
        );
        Err(s)
    });
    assert_eq!(root, manifest_root(&src));
    assert_same_tree(&src, &b.model_dir("m96"));

    // Cut-over: reissue and reload again; the old CA is refused everywhere.
    pki.rotate(true);
    pki.issue("a", "node");
    pki.issue("b", "node");
    reload(&a);
    reload(&b);
    let final_op = pki.issue("final-op", "operator");
    let final_file = t.path().join("final.toml");
    write_cluster_file(&final_file, &final_op, &nodes);
    let s = status(&final_file);
    assert!(s.0.iter().all(|r| r.reachable), "{s:#?}");
    let r = run(
        xfer()
            .args(["status", "--json", "--cluster"])
            .arg(&old_file),
        Duration::from_secs(20),
    );
    let old: Status = Status(serde_json::from_str(&r.stdout).unwrap_or_default());
    assert!(
        !old.0.is_empty() && unreachable_everywhere(&old),
        "the old CA's operator still gets answers: {}\n{}",
        r.stdout,
        r.stderr
    );
}

#[test]
fn an_agent_given_the_cluster_file_accepts_only_the_nodes_it_lists() {
    let t = tempdir("trust-members");
    let pki = Pki::init(t.path());
    let (a_cred, b_cred, c_cred) = (
        pki.issue("a", "node"),
        pki.issue("b", "node"),
        pki.issue("c", "node"),
    );
    let op = pki.issue("op", "operator");
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let file = t.path().join("cluster.toml");
    write_cluster_file(
        &file,
        &op,
        &[
            ("a", "127.0.0.75:7470", &root),
            ("b", "127.0.0.76:7470", &root),
        ],
    );
    let members = file.display().to_string();
    let a = Agent::start_with("127.0.0.75:0", &root, &a_cred, &["--cluster", &members]);

    // c holds a certificate of this CA, but the cluster file has no c.
    let reply = admin(&c_cred, "a", &a, &AdminRequest::Status);
    let text = format!("{reply:?}");
    assert!(
        text.contains("Forbidden")
            && text.contains("node c at")
            && text.contains("is not a node of"),
        "{text}"
    );
    a.wait_log("refused node c at");
    // b is listed; the operator is not a node and passes.
    assert!(matches!(
        admin(&b_cred, "a", &a, &AdminRequest::Status),
        AdminReply::Status(_)
    ));
    assert!(matches!(
        admin(&op, "a", &a, &AdminRequest::Status),
        AdminReply::Status(_)
    ));

    // An agent whose own name the file does not list does not start.
    let r = run(
        xfer()
            .args([
                "serve",
                "--listen",
                "127.0.0.77:0",
                "--cluster",
                &members,
                "--root",
            ])
            .arg(&root)
            .arg("--key")
            .arg(&c_cred),
        Duration::from_secs(20),
    );
    assert!(!r.success());
    assert!(r.stderr.contains("does not list"), "{}", r.stderr);
}

/// A job's end and a prune, with issued credentials: the source's own
/// node credential tells the members a failed job ended (so they list no
/// row of it); another node's credential may neither end a job it is not
/// the source of nor prune, each refused in one line, and the job stays.
#[test]
fn a_node_credential_cannot_prune_or_end_another_sources_job() {
    let t = tempdir("trust-prune");
    let pki = Pki::init(t.path());
    let creds: Vec<PathBuf> = ["a", "b", "c"]
        .iter()
        .map(|n| pki.issue(n, "node"))
        .collect();
    let op = pki.issue("op", "operator");
    let export = t.path().display().to_string();
    let roots: Vec<PathBuf> = ["ra", "rb", "rc"]
        .iter()
        .map(|r| t.path().join(r))
        .collect();
    let agents: Vec<Agent> = (0..3)
        .map(|i| {
            let listen = format!("127.0.0.{}:0", 191 + i);
            Agent::start_with(&listen, &roots[i], &creds[i], &["--export", &export])
        })
        .collect();
    let nodes: Vec<(&str, &str, &Path)> = ["a", "b", "c"]
        .iter()
        .zip(&agents)
        .zip(&roots)
        .map(|((n, a), r)| (*n, a.addr.as_str(), r.as_path()))
        .collect();
    let op_file = t.path().join("op.toml");
    write_cluster_file(&op_file, &op, &nodes);
    let c_file = t.path().join("c.toml");
    write_cluster_file(&c_file, &creds[2], &nodes);
    let sync = |src: &Path, extra: &[&str]| -> String {
        let r = run(
            xfer()
                .args([
                    "sync",
                    "--json",
                    "--from",
                    "a",
                    "--nodes",
                    "b,c",
                    "--cluster",
                ])
                .arg(&op_file)
                .args(extra)
                .arg(src),
            Duration::from_secs(30),
        );
        r.assert_ok("xfer sync");
        r.json::<serde_json::Value>()["job"]
            .as_str()
            .unwrap()
            .to_string()
    };

    // a's node credential ends its failed job on b and c.
    let failed = sync(&t.path().join("src/nothing"), &[]);
    wait_until("b and c to learn the job failed", JOB_DEADLINE, || {
        let s = status(&op_file);
        ["b", "c"].iter().all(|n| {
            s.job(n, &failed)
                .is_some_and(|j| matches!(j.state, JobState::Failed { .. }))
                && s.model(n, "nothing").is_none()
        })
    });

    // c may not end a's running job on b.
    let src = t.path().join("src/m32");
    gen_model(&src, 32 * MIB, 191);
    let running = sync(&src, &["--limit-rate", "2MiB"]);
    wait_until("b to receive the first bytes", JOB_DEADLINE, || {
        status(&op_file)
            .model("b", "m32")
            .is_some_and(|m| m.state == ModelState::Syncing && m.bytes_held > 0)
    });
    let end = AdminRequest::JobEnded {
        id: running.clone(),
        state: JobState::Cancelled,
    };
    let text = format!("{:?}", admin(&creds[2], "b", &agents[1], &end));
    assert!(
        text.contains("Forbidden")
            && text.contains(&format!(
                "only job {running}'s source a or an operator may end it"
            ))
            && text.contains("node c"),
        "{text}"
    );
    agents[1].wait_log("refused");

    // Nor prune, through the CLI: one line per node, exit 1.
    let r = run(
        xfer().args(["prune", "--cluster"]).arg(&c_file),
        Duration::from_secs(30),
    );
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    for n in ["a", "b", "c"] {
        let line = r
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{n}: FAILED:")))
            .unwrap_or_else(|| panic!("no line of {n}: {r:#?}"));
        assert!(
            line.contains("only an operator may prune sync jobs"),
            "{line}"
        );
    }
    let s = status(&op_file);
    for n in ["a", "b", "c"] {
        assert!(s.job(n, &failed).is_some(), "{n} lost a job: {s:#?}");
    }
    for n in ["a", "b"] {
        let j = s.job(n, &running).unwrap();
        assert!(!j.state.is_final(), "{n}: {j:#?}");
    }
    assert_eq!(
        s.model("b", "m32").map(|m| m.state),
        Some(ModelState::Syncing),
        "{s:#?}"
    );

    // The operator's prune removes the failed job everywhere, not the running one.
    let r = run(
        xfer().args(["prune", "--cluster"]).arg(&op_file),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer prune as the operator");
    for n in ["a", "b", "c"] {
        assert!(
            r.stdout.contains(&format!("{n}: removed job {failed}")),
            "{r:#?}"
        );
    }
    assert!(!r.stdout.contains(&running), "{r:#?}");
}

/// Striped intake (issue 36), the attack: node b's credential (a stolen
/// node disk) asks agent a to fetch a URL "for" a model a has no sync job
/// of b's for, to spend a's link or to reach what only a can reach (a
/// metadata service, a LAN host). Refused as forbidden in one line that
/// says who may ask, and a makes no request at all; the operator's
/// credential is served (the same ask reaches the URL).
#[test]
fn a_node_that_is_not_the_jobs_source_cannot_make_another_node_fetch_a_url() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use xfer::transport::quic::{client_endpoint, connect, read_frame, write_frame};
    use xfer_proto::hello::{Hello, Service};
    use xfer_proto::transfer::TransferMsg;

    let t = tempdir("trust-intake");
    let (a_cred, b_cred, op) = Pki::init(t.path()).two_nodes_and_an_operator();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let a = Agent::start_with("127.0.0.78:0", &root, &a_cred, &[]);

    // What only a reaches: counts connections, answers one ranged GET.
    let inside = std::net::TcpListener::bind("127.0.0.78:0").unwrap();
    let url = format!("http://{}/latest/meta-data", inside.local_addr().unwrap());
    let reached = std::sync::Arc::new(AtomicUsize::new(0));
    let count = reached.clone();
    std::thread::spawn(move || {
        for conn in inside.incoming() {
            let Ok(mut conn) = conn else { return };
            count.fetch_add(1, Ordering::SeqCst);
            let mut head = [0u8; 4096];
            let _ = conn.read(&mut head);
            let _ = conn.write_all(
                b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-3/4\r\nContent-Length: 4\r\n\r\nroot",
            );
        }
    });

    let ask = |cred: &Path| {
        let cred = Credential::load(cred).unwrap();
        let addr: std::net::SocketAddr = a.addr.parse().unwrap();
        let msg = TransferMsg::Intake {
            name: xfer_proto::names::ModelName::new("m").unwrap(),
            file: Some(0),
            url: url.clone(),
            from: 0,
            to: 4,
            token: None,
        };
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let ep = client_endpoint(&cred, addr).unwrap();
            let conn = connect(&ep, addr, Duration::from_secs(10)).await.unwrap();
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            write_frame(&mut send, &Hello::new(Service::Transfer))
                .await
                .unwrap();
            write_frame(&mut send, &msg).await.unwrap();
            read_frame::<TransferMsg>(&mut recv).await.unwrap()
        })
    };

    let reply = ask(&b_cred);
    let text = format!("{reply:?}");
    assert!(
        text.contains("Forbidden")
            && text.contains("node b")
            && text.contains("not the source of a running sync job"),
        "{text}"
    );
    a.wait_log("not the source of a running sync job");

    // The operator may (b's ask was answered first: had a fetched for it,
    // the URL would have seen two connections).
    let reply = ask(&op);
    assert!(
        matches!(reply, TransferMsg::IntakeBody { len: 4 }),
        "{reply:?}"
    );
    assert_eq!(reached.load(Ordering::SeqCst), 1, "a fetched for node b");
}

/// Striped intake (issue 36): one intake session's ranges reuse a kept-
/// alive connection to the origin, as the source's own downloads do; a new
/// connection per range would pay a TCP (and, at a real CDN, a TLS)
/// handshake and a slow start every few megabytes. Two ranges asked on one
/// session (the operator may ask) reach the origin over one connection.
#[test]
fn an_intake_sessions_ranges_share_one_connection_to_the_origin() {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use xfer::transport::quic::{client_endpoint, connect, read_frame, write_frame};
    use xfer_proto::hello::{Hello, Service};
    use xfer_proto::transfer::TransferMsg;

    let t = tempdir("intake-keepalive");
    let (a_cred, _, op) = Pki::init(t.path()).two_nodes_and_an_operator();
    let root = t.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let a = Agent::start_with("127.0.0.79:0", &root, &a_cred, &[]);

    // An origin that keeps connections alive: counts connections and
    // requests, answers each ranged GET with its 4 bytes.
    let origin = std::net::TcpListener::bind("127.0.0.79:0").unwrap();
    let url = format!("http://{}/blob", origin.local_addr().unwrap());
    let (conns, reqs) = (
        std::sync::Arc::new(AtomicUsize::new(0)),
        std::sync::Arc::new(AtomicUsize::new(0)),
    );
    let (c2, r2) = (conns.clone(), reqs.clone());
    std::thread::spawn(move || {
        for conn in origin.incoming() {
            let Ok(conn) = conn else { return };
            c2.fetch_add(1, Ordering::SeqCst);
            let r2 = r2.clone();
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut lines = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    match lines.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line == "\r\n" => {
                            r2.fetch_add(1, Ordering::SeqCst);
                            let _ = w.write_all(
                                b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-3/4\r\nContent-Length: 4\r\n\r\nblob",
                            );
                        }
                        Ok(_) => {}
                    }
                }
            });
        }
    });

    let cred = Credential::load(&op).unwrap();
    let addr: std::net::SocketAddr = a.addr.parse().unwrap();
    let ask = TransferMsg::Intake {
        name: xfer_proto::names::ModelName::new("m").unwrap(),
        file: None,
        url,
        from: 0,
        to: 4,
        token: None,
    };
    let bodies = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let ep = client_endpoint(&cred, addr).unwrap();
        let conn = connect(&ep, addr, Duration::from_secs(10)).await.unwrap();
        let mut bodies = Vec::new();
        for i in 0..2 {
            let (mut send, mut recv) = conn.open_bi().await.unwrap();
            if i == 0 {
                write_frame(&mut send, &Hello::new(Service::Transfer))
                    .await
                    .unwrap();
            }
            write_frame(&mut send, &ask).await.unwrap();
            let reply = read_frame::<TransferMsg>(&mut recv).await.unwrap();
            assert!(
                matches!(reply, TransferMsg::IntakeBody { len: 4 }),
                "{reply:?}"
            );
            bodies.push(recv.read_to_end(16).await.unwrap());
        }
        bodies
    });
    assert_eq!(bodies, vec![b"blob".to_vec(), b"blob".to_vec()]);
    assert_eq!(reqs.load(Ordering::SeqCst), 2, "two ranges asked");
    assert_eq!(
        conns.load(Ordering::SeqCst),
        1,
        "the session's second range opened a new connection to the origin"
    );
}

/// Copies `from` to `to` as it is (links kept as links).
fn copy_tree(from: &Path, to: &Path) {
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a {} {}", from.display(), to.display());
}

/// The blob a snapshot's `file` links to, in the repo folder `repo`.
fn blob_of(repo: &Path, file: &str) -> PathBuf {
    let snaps = repo.join("snapshots");
    let commit = std::fs::read_dir(&snaps)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let link = commit.join(file);
    let target = std::fs::read_link(&link).unwrap();
    commit.join(target).canonicalize().unwrap()
}

/// Finding 1 of issue 53: a node credential (a stolen node disk) pushed a
/// poisoned copy of an HF cache folder (one blob overwritten with other
/// bytes of the same size, its name and `refs/main` unchanged) under the
/// cache's name, and every node reported it `complete` for `deploy` to
/// serve. Now: a node credential may not deliver a Hub cache name at all
/// (only an operator's `xfer sync` from that node does); an operator's push
/// of the poisoned copy is refused when the blob is to be placed (its
/// sha256 is not its name), and a tree with a regular file under
/// `snapshots/` is refused on the offer; the clean copy goes through.
#[test]
fn a_hub_named_model_holds_the_hubs_bytes_whoever_pushes_it() {
    let t = tempdir("trust-hub-bytes");
    let (a_cred, b_cred, op) = Pki::init(t.path()).two_nodes_and_an_operator();
    let repos = t.path().join("repos");
    common::hub::gen_repo(
        &repos,
        "acme/tiny",
        53,
        &[("config.json", 300), ("model.safetensors", 2 * MIB)],
    );
    let server = common::hub::HubServer::start(&repos, &[]);
    let env = common::hub::PullEnv::new(&server.endpoint(), t.path());
    run(&mut env.cmd("acme/tiny", &[]), Duration::from_secs(60)).assert_ok("xfer pull");
    let clean = env.cache.join("models--acme--tiny");
    let weights = blob_of(&clean, "model.safetensors");

    let poisoned_dir = t.path().join("poisoned");
    std::fs::create_dir_all(&poisoned_dir).unwrap();
    copy_tree(&clean, &poisoned_dir);
    let poisoned = poisoned_dir.join("models--acme--tiny");
    let bad_blob = poisoned.join("blobs").join(weights.file_name().unwrap());
    let size = std::fs::metadata(&bad_blob).unwrap().len();
    std::fs::write(&bad_blob, vec![7u8; size as usize]).unwrap();

    let root = t.path().join("root");
    let a = Agent::start("127.0.0.74:0", &root, &a_cred);
    let placed = root.join("models--acme--tiny");

    // Node b's credential: refused on the offer, nothing made.
    let r = common::push::push(&poisoned, &[a.addr.as_str()], &b_cred, &[]);
    assert!(
        !r.success(),
        "a node credential pushed a Hub-named model: {}",
        r.stdout
    );
    assert!(
        r.stderr
            .contains("a Hub cache name is delivered only by an operator's `xfer sync`"),
        "{}",
        r.stderr
    );
    assert!(
        !placed.exists(),
        "the refused offer made {}",
        placed.display()
    );

    // The operator's push of the poisoned copy: refused at the blob.
    let r = common::push::push(&poisoned, &[a.addr.as_str()], &op, &[]);
    assert!(
        !r.success(),
        "the poisoned copy was delivered: {}",
        r.stdout
    );
    assert!(
        r.stderr
            .contains("not to its name: a Hub-named model holds the Hub's bytes"),
        "{}",
        r.stderr
    );
    assert!(
        !placed
            .join("blobs")
            .join(weights.file_name().unwrap())
            .exists(),
        "the poisoned blob was placed"
    );
    let served = std::fs::read_dir(placed.join("snapshots"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|c| std::fs::read(c.path().join("model.safetensors")).ok())
        .next();
    assert!(
        served.is_none(),
        "a snapshot name leads to bytes that are not the Hub's"
    );

    // A regular file where a snapshot's link belongs: refused on the offer.
    let flat_dir = t.path().join("flat");
    std::fs::create_dir_all(&flat_dir).unwrap();
    copy_tree(&clean, &flat_dir);
    let flat = flat_dir.join("models--acme--tiny");
    let commit = std::fs::read_dir(flat.join("snapshots"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    std::fs::remove_file(commit.join("model.safetensors")).unwrap();
    std::fs::write(commit.join("model.safetensors"), vec![9u8; size as usize]).unwrap();
    let r = common::push::push(&flat, &[a.addr.as_str()], &op, &[]);
    assert!(!r.success(), "{}", r.stdout);
    assert!(
        r.stderr
            .contains("is a file; a snapshot's names are links to blobs"),
        "{}",
        r.stderr
    );

    // The control: the clean copy, pushed by the operator, is complete and
    // byte-identical to what the Hub serves.
    let r = common::push::push(&clean, &[a.addr.as_str()], &op, &[]);
    assert!(r.success(), "{}", r.stderr);
    assert_eq!(
        std::fs::read(blob_of(&placed, "model.safetensors")).unwrap(),
        std::fs::read(&weights).unwrap()
    );
}
