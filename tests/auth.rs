//! Mutual authentication: only holders of the cluster key can write to an
//! agent, and a refused peer leaves nothing behind.

use crate::common;

use std::time::Duration;

use common::*;

/// Asserts that `root` holds no trace of a model: no folder, no staging
/// files, no record.
fn assert_nothing_written(root: &std::path::Path) {
    assert_eq!(
        listing(root),
        [".xfer".to_string()].into(),
        "only the agent's own .xfer may be in its root"
    );
    let staged: Vec<_> = walk(&root.join(".xfer/staging")).into_keys().collect();
    assert!(staged.is_empty(), "staging holds {staged:?}");
    let records: Vec<_> = walk(&root.join(".xfer/models")).into_keys().collect();
    assert!(records.is_empty(), "records: {records:?}");
}

/// A pusher with another cluster's key is refused; a missing or junk key
/// file is refused with a hint to run `xfer ca issue`; nothing is written;
/// the agent still serves a push with the right key.
#[test]
fn wrong_or_missing_key_is_refused_and_writes_nothing() {
    let t = tempdir("auth");
    let key_a = t.path().join("key-a");
    let key_b = t.path().join("key-b");
    keygen(&key_a);
    keygen(&key_b);
    assert_ne!(
        std::fs::read(&key_a).unwrap(),
        std::fs::read(&key_b).unwrap()
    );
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 20);
    let root = t.path().join("root");
    let mut agent = Agent::start("127.0.0.20:0", &root, &key_a);

    // Another cluster's key.
    let r = push(&src, &[&agent.addr], &key_b, &["--connect-timeout", "5"]);
    assert!(!r.success(), "{r:#?}");
    assert_eq!(r.status.code(), Some(1));
    assert!(r.elapsed < Duration::from_secs(10), "{r:#?}");
    let err = r.stderr.to_lowercase();
    assert!(
        err.contains("authentication") && err.contains("key") && err.contains(&agent.addr),
        "the error must say authentication failed and point at the key: {r:#?}"
    );
    let s: PushJson = r.json();
    assert!(!s.node(&agent.addr).ok);
    assert_eq!(s.bytes_sent, 0);

    // A key file that does not exist.
    let missing = t.path().join("no-such-key");
    let r = push(&src, &[&agent.addr], &missing, &[]);
    assert!(!r.success(), "{r:#?}");
    // Per-node credentials are the normal mode: the fix is `xfer ca issue`.
    assert!(
        r.stderr.contains("xfer ca issue") && r.stderr.contains("no-such-key"),
        "{r:#?}"
    );

    // A file that is not a key.
    let junk = t.path().join("junk-key");
    std::fs::write(&junk, "not a key\n").unwrap();
    let r = push(&src, &[&agent.addr], &junk, &[]);
    assert!(!r.success(), "{r:#?}");
    assert!(r.stderr.contains("xfer ca issue"), "{r:#?}");

    assert!(agent.running(), "the agent died: {}", agent.log());
    assert_nothing_written(&root);

    // The agent survived and still serves its own cluster.
    let s = push_ok(&src, &[&agent.addr], &key_a, &[]);
    assert_eq!(s.bytes_sent, tree_bytes(&src));
    assert_same_tree(&src, &root.join("m"));
}

/// An agent started without a usable key refuses to start, with the hint.
#[test]
fn agent_without_key_does_not_start() {
    let t = tempdir("auth-agent");
    let r = run(
        xfer()
            .args(["serve", "--listen", "127.0.0.21:0", "--root"])
            .arg(t.path().join("root"))
            .arg("--key")
            .arg(t.path().join("absent")),
        Duration::from_secs(20),
    );
    assert!(!r.success(), "{r:#?}");
    assert!(r.stderr.contains("xfer ca issue"), "{r:#?}");
    assert!(
        !r.stdout.contains("listening"),
        "must not claim to listen: {r:#?}"
    );
}

/// `xfer keygen` refuses to overwrite an existing key unless --force.
#[test]
fn keygen_does_not_overwrite() {
    let t = tempdir("auth-keygen");
    let key = t.path().join("key");
    keygen(&key);
    let before = std::fs::read(&key).unwrap();
    let r = run(
        xfer().arg("keygen").arg("--out").arg(&key),
        Duration::from_secs(20),
    );
    assert!(!r.success(), "{r:#?}");
    assert!(r.stderr.contains("--force"), "{r:#?}");
    assert_eq!(std::fs::read(&key).unwrap(), before, "key was replaced");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600,
        "the key must be private"
    );
}

/// A key file that other users can read is refused by every command that
/// loads it, in one line with the fix; the file is left as it was.
#[test]
fn a_key_open_to_other_users_is_refused_not_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempdir("auth-mode");
    let key = t.path().join("cluster.key");
    keygen(&key);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let before = std::fs::read(&key).unwrap();
    let root = t.path().join("root");
    let serve = run(
        xfer()
            .args(["serve", "--listen", "127.0.0.22:0", "--root"])
            .arg(&root)
            .arg("--key")
            .arg(&key),
        Duration::from_secs(20),
    );
    let src = t.path().join("src");
    gen_model(&src, 64 * KIB, 3);
    let push = push(&src, &["127.0.0.22:7470"], &key, &[]);
    for (what, r) in [("serve", &serve), ("push", &push)] {
        assert!(!r.success(), "{what}: {r:#?}");
        assert!(
            r.stderr.contains("mode 644") && r.stderr.contains("chmod 600"),
            "{what}: {}",
            r.stderr
        );
        let errors = r.stderr.lines().filter(|l| l.starts_with("error:")).count();
        assert_eq!(errors, 1, "{what}: one error line: {}", r.stderr);
    }
    assert!(!serve.stdout.contains("listening"), "{serve:#?}");
    assert_eq!(std::fs::read(&key).unwrap(), before);
}

/// `xfer keygen` never writes through a symlink, with or without --force,
/// and never replaces a file without --force.
#[test]
fn keygen_never_writes_through_a_symlink_or_over_a_file() {
    let t = tempdir("auth-keygen");
    let victim = t.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let link = t.path().join("cluster.key");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    for extra in [&[][..], &["--force"][..]] {
        let r = run(
            xfer().arg("keygen").arg("--out").arg(&link).args(extra),
            Duration::from_secs(20),
        );
        assert!(!r.success(), "{extra:?}: {r:#?}");
        assert!(r.stderr.contains("symlink"), "{extra:?}: {}", r.stderr);
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    let r = run(
        xfer().arg("keygen").arg("--out").arg(&victim),
        Duration::from_secs(20),
    );
    assert!(!r.success() && r.stderr.contains("--force"), "{r:#?}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
}

/// An agent refuses a root that every local user may write to.
#[test]
fn an_agent_refuses_a_root_writable_by_every_user() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempdir("auth-root");
    let key = t.path().join("cluster.key");
    keygen(&key);
    let root = t.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let r = run(
        xfer()
            .args(["serve", "--listen", "127.0.0.23:0", "--root"])
            .arg(&root)
            .arg("--key")
            .arg(&key),
        Duration::from_secs(20),
    );
    assert!(!r.success(), "{r:#?}");
    assert!(r.stderr.contains("chmod o-w"), "{}", r.stderr);
    let errors = r.stderr.lines().filter(|l| l.starts_with("error:")).count();
    assert_eq!(errors, 1, "one error line: {}", r.stderr);
    assert!(
        !root.join(".xfer").exists(),
        "the agent wrote into the root"
    );
}
