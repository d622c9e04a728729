//! One vocabulary, no guessing (issue 32): `xfer sync ORG/NAME` is the
//! folder of that name when the source node has it and is refused when only
//! the operator's machine has it; a model is named by its repo id as well
//! as by its stored name (`sync --name`, `rm`); `push --cluster --nodes`
//! delivers to the named nodes; `serve --listen localhost:PORT` starts;
//! `XFER_CLUSTER` stands in for `--cluster`; and `xfer-launch plan` prints
//! the commit the agents resolve instead of `<COMMIT>`.
//!
//! Real agents on loopback addresses (127.0.13x.y), the real `xfer` binary.

use crate::common;

use std::ffi::CString;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use common::cluster::*;
use common::*;

/// The operator's working directory in a test: `DIR/work`.
fn work(c: &Cluster) -> std::path::PathBuf {
    let w = c.dir.path().join("work");
    fs::create_dir_all(&w).unwrap();
    w
}

/// `xfer sync local/my-model`, run from a directory holding
/// `local/my-model`, on agents that see that directory: a folder, synced as
/// one, and the line the command prints says so.
#[test]
fn an_org_name_the_source_node_holds_as_a_folder_is_synced_as_one() {
    let c = Cluster::start("vocab-folder", 131, &["a", "b"], &[]);
    let work = work(&c);
    let src = work.join("local/my-model");
    gen_model(&src, 6 * MIB, 131);
    let want = manifest_root(&src);

    let r = run(
        c.cmd("sync", &["local/my-model", "--from", "a", "--nodes", "a,b"])
            .current_dir(&work),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer sync local/my-model");
    let id = r.stdout.trim().to_string();
    assert!(
        r.stderr
            .contains(&format!("folder {} on node a", src.display())),
        "the hand-off line names the reading taken: {r:#?}"
    );
    let s = c.status();
    let job = s.job("a", &id).expect("the source knows the job");
    assert_eq!(
        job.name.to_string(),
        "my-model",
        "named after the folder: {job:#?}"
    );
    let root = c.wait_complete(&id, "a", &["a", "b"], "my-model");
    assert_eq!(root, want);
    for n in ["a", "b"] {
        assert_same_tree(&src, &c.root(n).join("my-model"));
        assert!(
            !c.root(n).join("models--local--my-model").exists(),
            "{n}: nothing was pulled from the Hub"
        );
    }
}

/// An agent in a mount namespace of its own where `hidden` is an empty
/// tmpfs: the operator's folder there does not exist for it.
fn agent_not_seeing(c: &Cluster, listen: &str, root: &Path, hidden: &Path) -> Agent {
    let export = c.dir.path().to_str().unwrap().to_string();
    let target = CString::new(hidden.to_str().unwrap()).unwrap();
    Agent::start_cmd(listen, root, &c.key, &["--export", &export], move |cmd| {
        // SAFETY: only async-signal-safe syscalls between fork and exec,
        // on a CString made before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let none = c"none".as_ptr();
                let tmpfs = c"tmpfs".as_ptr();
                if libc::unshare(libc::CLONE_NEWNS) != 0
                    || libc::mount(
                        none,
                        c"/".as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) != 0
                    || libc::mount(tmpfs, target.as_ptr(), tmpfs, 0, std::ptr::null()) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    })
}

/// `local/my-model` is a folder where the operator runs but not on the
/// `--from` node: refused, exit non-zero, one line with both readings and
/// how to pick each, and no job handed over.
#[test]
fn an_org_name_only_the_operator_has_as_a_folder_is_refused_with_both_readings() {
    // One agent that sees everything, for the cluster's key and folder.
    let c = Cluster::start("vocab-ambiguous", 132, &["b"], &[]);
    let work = work(&c);
    let src = work.join("local/my-model");
    gen_model(&src, MIB, 132);
    let root_a = c.dir.path().join("nodes/a/root");
    fs::create_dir_all(&root_a).unwrap();
    let a = agent_not_seeing(&c, "127.0.132.9:0", &root_a, &work);
    let b = c.member("b");
    write_cluster_file(
        &c.file,
        &c.key,
        &[("a", &a.addr, &root_a), ("b", &b.addr, &b.root)],
    );

    let r = run(
        c.cmd("sync", &["local/my-model", "--from", "a", "--nodes", "a,b"])
            .current_dir(&work),
        Duration::from_secs(30),
    );
    assert!(!r.success(), "an ambiguous SOURCE must be refused: {r:#?}");
    let line = r.stderr.trim();
    assert_eq!(line.lines().count(), 1, "one line: {r:#?}");
    for part in [
        &format!("a folder here ({})", src.display()),
        "not on node a",
        "./local/my-model --from a",
        "hf://local/my-model",
    ] {
        assert!(line.contains(part), "{part:?} missing from {line:?}");
    }
    let s = c.status();
    for n in ["a", "b"] {
        let jobs = &s.report(n).status.as_ref().expect("reachable").jobs;
        assert!(jobs.is_empty(), "{n} got a job: {jobs:#?}");
    }
    drop(a);
}

/// A folder laid out as a Hub cache repo (`blobs/` named by sha256,
/// snapshot names linking to them, `refs/main`): what a Hub cache name
/// may hold.
fn hub_shaped(dir: &Path, size: usize) {
    use sha2::Digest;
    let data = common::trees::random_bytes(133, "hub", size);
    let sha = hex::encode(sha2::Sha256::digest(&data));
    let commit = "0123456789abcdef0123456789abcdef01234567";
    std::fs::create_dir_all(dir.join("blobs")).unwrap();
    std::fs::create_dir_all(dir.join("refs")).unwrap();
    std::fs::create_dir_all(dir.join("snapshots").join(commit)).unwrap();
    std::fs::write(dir.join("blobs").join(&sha), &data).unwrap();
    std::fs::write(dir.join("refs/main"), commit).unwrap();
    std::os::unix::fs::symlink(
        format!("../../blobs/{sha}"),
        dir.join("snapshots").join(commit).join("model.safetensors"),
    )
    .unwrap();
}

/// `sync --name Org/Name` stores the folder as `models--Org--Name`, and
/// `xfer rm Org/Name` removes it from every node. (A folder not laid out
/// as a Hub cache repo cannot take that name: see
/// `trust::a_hub_named_model_holds_the_hubs_bytes_whoever_pushes_it`.)
#[test]
fn a_repo_id_names_the_model_for_sync_and_rm() {
    let c = Cluster::start("vocab-rm", 133, &["a", "b"], &[]);
    let src = c.dir.path().join("src/weights");
    hub_shaped(&src, 4 * MIB as usize);
    // A plain folder may not take a Hub cache name: the job fails at once
    // (the receivers refuse its tree for good), naming the fix.
    let plain = c.dir.path().join("src/plain");
    gen_model(&plain, MIB, 134);
    let r = run(
        c.cmd("sync", &["--wait"]).arg(&plain).args([
            "--from",
            "a",
            "--name",
            "Org/Plain",
            "--give-up-after",
            "never",
        ]),
        Duration::from_secs(120),
    );
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(
        r.stderr
            .contains("is a Hub cache name, and this tree is not a Hub cache repo")
            && r.stderr.contains("takes another name"),
        "{r:#?}"
    );
    let (id, _) = c.sync(&src, &["--from", "a", "--name", "Org/Name"]);
    c.wait_complete(&id, "a", &["a", "b"], "models--Org--Name");

    let r = run(
        &mut c.cmd("rm", &["Org/Name", "--yes"]),
        Duration::from_secs(60),
    );
    r.assert_ok("xfer rm Org/Name");
    for n in ["a", "b"] {
        assert!(
            r.stdout
                .contains(&format!("{n}: removed models--Org--Name")),
            "{r:#?}"
        );
        assert!(
            !c.root(n).join("models--Org--Name").exists(),
            "{n} still holds the model"
        );
    }
    assert!(!r.stderr.contains("--name"), "{r:#?}");
}

/// `xfer push SRC --cluster FILE --nodes a,c` delivers to a and c (named
/// by the cluster file) and not to b; `--cluster` with `--to` is refused.
#[test]
fn push_with_cluster_delivers_to_the_named_nodes() {
    let c = Cluster::start("vocab-push", 134, &["a", "b", "c"], &[]);
    let src = c.dir.path().join("src/pushed");
    gen_model(&src, 4 * MIB, 134);
    let r = run(
        xfer()
            .arg("push")
            .arg(&src)
            .arg("--cluster")
            .arg(&c.file)
            .args(["--nodes", "a,c", "--json"]),
        Duration::from_secs(60),
    );
    r.assert_ok("xfer push --cluster");
    let v: serde_json::Value = r.json();
    assert_eq!(v["nodes"].as_array().map(Vec::len), Some(2), "{r:#?}");
    for n in ["a", "c"] {
        assert_same_tree(&src, &c.root(n).join("pushed"));
    }
    assert!(!c.root("b").join("pushed").exists(), "b was not named");

    let both = run(
        xfer()
            .arg("push")
            .arg(&src)
            .arg("--cluster")
            .arg(&c.file)
            .args(["--to", &c.member("a").addr]),
        Duration::from_secs(30),
    );
    assert!(!both.success(), "{both:#?}");
    assert!(both.stderr.contains("--to"), "{both:#?}");
}

/// `serve --listen localhost:0` starts on 127.0.0.1; a cluster file naming
/// it `localhost:PORT` reaches it; `XFER_CLUSTER` stands in for
/// `--cluster`, and without either `status` says so in one line.
#[test]
fn serve_listens_on_a_host_name_and_xfer_cluster_names_the_file() {
    let t = tempdir("vocab-env");
    let key = t.path().join("key");
    keygen(&key);
    let root = t.path().join("root");
    let a = Agent::start("localhost:0", &root, &key);
    let port = a
        .addr
        .strip_prefix("127.0.0.1:")
        .unwrap_or_else(|| panic!("localhost listens on 127.0.0.1, not {}", a.addr));
    let file = t.path().join("cluster.toml");
    write_cluster_file(&file, &key, &[("a", &format!("localhost:{port}"), &root)]);

    let r = run(
        xfer().args(["status", "--json"]).env("XFER_CLUSTER", &file),
        Duration::from_secs(20),
    );
    r.assert_ok("XFER_CLUSTER=FILE xfer status");
    let s = Status(r.json());
    assert!(s.report("a").reachable, "{s:#?}");

    let none = run(
        xfer().args(["status"]).env_remove("XFER_CLUSTER"),
        Duration::from_secs(20),
    );
    assert!(!none.success(), "{none:#?}");
    assert!(
        none.stderr.contains("--cluster FILE") && none.stderr.contains("XFER_CLUSTER=FILE"),
        "{none:#?}"
    );
}

/// `xfer-launch`, built next to the `xfer` under test (built here if not).
fn launch_bin() -> std::path::PathBuf {
    let p = Path::new(bin()).with_file_name("xfer-launch");
    if !p.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = std::process::Command::new(cargo)
            .args(["build", "-q", "-p", "launcher", "--bin", "xfer-launch"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok && p.exists(), "cannot build {}", p.display());
    }
    p
}

/// `xfer-launch plan` on a model at a branch asks the agents which commit
/// their `refs/` name and prints the real `snapshots/<commit>`.
#[test]
fn launch_plan_prints_the_commit_the_agents_resolve() {
    let c = Cluster::start("vocab-plan", 135, &["a"], &[]);
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let refs = c.root("a").join("models--acme--tiny/refs");
    fs::create_dir_all(&refs).unwrap();
    fs::write(refs.join("main"), commit).unwrap();
    let a = c.member("a");
    let ip = a.addr.split(':').next().unwrap();
    let file = c.dir.path().join("launch.toml");
    fs::write(
        &file,
        format!(
            "key = \"{}\"\n[[node]]\nname = \"a\"\nagent = \"{}\"\nroot = \"{}\"\nfabric_if = \"lo\"\nfabric_ip = \"{ip}\"\n[launch]\nengine = \"vllm\"\nmodel = \"acme/tiny\"\n",
            c.key.display(),
            a.addr,
            a.root.display()
        ),
    )
    .unwrap();
    let r = run(
        std::process::Command::new(launch_bin())
            .args(["plan", "--cluster"])
            .arg(&file),
        Duration::from_secs(30),
    );
    r.assert_ok("xfer-launch plan");
    assert!(
        r.stdout
            .contains(&format!("models--acme--tiny/snapshots/{commit}"))
            && !r.stdout.contains("<COMMIT>"),
        "{r:#?}"
    );
    assert!(r.stderr.is_empty(), "{r:#?}");
}
