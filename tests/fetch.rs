//! Agents serve the complete models they hold: `xfer fetch` copies one into
//! a local root with the same verification and resume as a push.

use crate::common;

use std::time::Duration;

use common::*;

#[test]
fn a_model_held_by_an_agent_can_be_fetched_and_resumed() {
    let t = tempdir("fetch");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 8 * MIB, 81);
    let agent = Agent::start("127.0.0.81:0", &t.path().join("a"), &key);
    push_ok(&src, &[&agent.addr], &key, &[]);

    let local = t.path().join("local");
    let fetch = |name: &str| {
        run(
            xfer()
                .args(["fetch", name, "--json", "--from", &agent.addr, "--root"])
                .arg(&local)
                .arg("--key")
                .arg(&key),
            Duration::from_secs(60),
        )
    };
    let first = fetch("m");
    first.assert_ok("xfer fetch");
    let s: serde_json::Value = first.json();
    assert_eq!(s["bytes_received"], s["bytes_total"]);
    assert_eq!(s["root"].as_str().unwrap(), manifest_root(&src));
    assert_same_tree(&src, &local.join("m"));
    let (v, _) = verify(&local.join("m"));
    assert!(v.success(), "{v:#?}");

    // A damaged local file is the only thing fetched again.
    scribble(&local.join("m").join(SHARD1), 10, 4, 5);
    let size = std::fs::metadata(local.join("m").join(SHARD1))
        .unwrap()
        .len();
    let again = fetch("m");
    again.assert_ok("second fetch");
    let s: serde_json::Value = again.json();
    assert_eq!(s["bytes_received"].as_u64().unwrap(), size);
    assert_same_tree(&src, &local.join("m"));

    // A model the agent does not hold: a clear error, non-zero exit.
    let missing = fetch("nope");
    assert_eq!(missing.status.code(), Some(1), "{missing:#?}");
    assert!(
        missing
            .stderr
            .contains("holds no complete model named `nope`"),
        "{missing:#?}"
    );
}

#[test]
fn a_wrong_key_cannot_fetch() {
    let t = tempdir("fetch-auth");
    let key = t.path().join("key");
    let other = t.path().join("other");
    keygen(&key);
    keygen(&other);
    let src = t.path().join("m");
    gen_model(&src, MIB, 82);
    let agent = Agent::start("127.0.0.82:0", &t.path().join("a"), &key);
    push_ok(&src, &[&agent.addr], &key, &[]);
    let local = t.path().join("local");
    let r = run(
        xfer()
            .args(["fetch", "m", "--from", &agent.addr, "--root"])
            .arg(&local)
            .arg("--key")
            .arg(&other),
        Duration::from_secs(30),
    );
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    assert!(r.stderr.contains("authentication"), "{r:#?}");
    assert!(!local.join("m").exists());
}
