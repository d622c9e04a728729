//! `--transport auto|quic|rdma` on a machine without RDMA (this one: no
//! `/sys/class/infiniband`): `auto` says in one line why it falls back and
//! the transfer completes over QUIC; `rdma` refuses to start, with the
//! reason, and touches nothing. Skipped (with a note) where RDMA exists.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn rdma_present() -> bool {
    Path::new("/sys/class/infiniband").exists()
}

#[test]
fn auto_falls_back_to_quic_with_the_reason_and_completes() {
    if rdma_present() {
        eprintln!("skipped: this machine has /sys/class/infiniband");
        return;
    }
    let t = tempdir("transport-auto");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 6 * MIB, 3);
    let mut a = Agent::start_with(
        "127.0.0.2:0",
        &t.path().join("root"),
        &key,
        &["--transport", "auto"],
    );
    let r = push(&src, &[a.addr.as_str()], &key, &["--transport", "auto"]);
    r.assert_ok("push --transport auto");
    let line = "rdma: no device (kernel lacks RDMA support: /sys/class/infiniband does not exist); using QUIC";
    assert_eq!(
        r.stderr
            .lines()
            .filter(|l| l.contains("rdma:"))
            .collect::<Vec<_>>(),
        [line],
        "{}",
        r.stderr
    );
    assert_same_tree(&src, &a.model_dir("m"));
    a.wait_log(line);
    assert!(a.running());
}

#[test]
fn rdma_without_a_device_refuses_clearly_and_touches_nothing() {
    if rdma_present() {
        eprintln!("skipped: this machine has /sys/class/infiniband");
        return;
    }
    let t = tempdir("transport-rdma");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 4);
    let a = Agent::start("127.0.0.2:0", &t.path().join("root"), &key);
    let r = push(&src, &[a.addr.as_str()], &key, &["--transport", "rdma"]);
    assert!(!r.success());
    let err = r.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--transport rdma: no device (kernel lacks RDMA support"),
        "{err}"
    );
    assert!(err.contains("use --transport quic"), "{err}");
    assert!(!a.model_dir("m").exists(), "nothing may arrive");

    // The agent refuses to start the same way.
    let root = t.path().join("root2");
    let out = run(
        xfer()
            .args([
                "serve",
                "--listen",
                "127.0.0.3:0",
                "--transport",
                "rdma",
                "--key",
            ])
            .arg(&key)
            .arg("--root")
            .arg(&root),
        Duration::from_secs(10),
    );
    assert!(!out.success());
    assert!(
        out.stderr.contains("--transport rdma: no device"),
        "{}",
        out.stderr
    );
    assert!(
        !root.join(".xfer").exists(),
        "the agent must not touch its root"
    );
}

/// The fallback line only when it was asked about: a push that leaves
/// `--transport` at its default says nothing of RDMA (with or without
/// `--json`), the same push with `--log info` says it once, and an agent
/// logs it once.
#[test]
fn the_fallback_line_shows_only_when_asked() {
    if rdma_present() {
        eprintln!("skipped: this machine has /sys/class/infiniband");
        return;
    }
    let t = tempdir("transport-quiet");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 5);
    let mut a = Agent::start("127.0.0.196:0", &t.path().join("root"), &key);
    let rdma_lines = |s: &str| s.lines().filter(|l| l.contains("rdma:")).count();
    let r = push(&src, &[a.addr.as_str()], &key, &[]);
    r.assert_ok("push");
    assert_eq!(rdma_lines(&r.stderr), 0, "{}", r.stderr);
    assert_eq!(rdma_lines(&r.stdout), 0, "{}", r.stdout);
    let r = push(&src, &[a.addr.as_str()], &key, &["--log", "info"]);
    r.assert_ok("push --log info");
    assert_eq!(rdma_lines(&r.stderr), 1, "{}", r.stderr);
    assert_eq!(rdma_lines(&a.log()), 1, "{}", a.log());
    assert!(a.running());
}
