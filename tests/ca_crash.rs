//! `xfer ca rotate` after a crash: the on-disk state an older xfer left
//! when it died between writing the new `ca.crt` and keeping the new key
//! (the old key in `ca.key`, a `ca.crt` of a key that is gone). The next
//! `xfer ca rotate` says it undid that and began a new rotation, and a
//! credential it issues meets one of the old CA.

use std::fs;
use std::time::Duration;

use crate::common;
use common::*;
use xfer::config::auth::Credential;

#[test]
fn a_rotation_that_lost_its_key_is_undone_by_the_next_rotate() {
    let t = tempdir("ca-crash");
    let ca = t.path().join("ca");
    let other = t.path().join("other");
    for d in [&ca, &other] {
        run(
            xfer().args(["ca", "init", "--dir"]).arg(d),
            Duration::from_secs(20),
        )
        .assert_ok("xfer ca init");
    }
    let issue = |name: &str| {
        let out = t.path().join(format!("{name}.cred"));
        run(
            xfer()
                .args(["ca", "issue", name, "--force", "--dir"])
                .arg(&ca)
                .arg("--out")
                .arg(&out),
            Duration::from_secs(20),
        )
        .assert_ok("xfer ca issue");
        Credential::load(&out).unwrap()
    };
    let old = issue("old");
    // The crashed rotation's writes: previous, cross, then ca.crt.
    let lost = fs::read(other.join("ca.crt")).unwrap();
    fs::copy(ca.join("ca.crt"), ca.join("previous.crt")).unwrap();
    fs::write(ca.join("cross.crt"), &lost).unwrap();
    fs::write(ca.join("ca.crt"), &lost).unwrap();
    let key_before = fs::read(ca.join("ca.key")).unwrap();

    let r = run(
        xfer().args(["ca", "rotate", "--dir"]).arg(&ca),
        Duration::from_secs(20),
    );
    r.assert_ok("xfer ca rotate after a crash");
    let first = r.stdout.lines().next().unwrap_or_default();
    assert!(first.starts_with("undid a rotation"), "{r:#?}");
    assert_ne!(fs::read(ca.join("ca.key")).unwrap(), key_before);
    assert!(!ca.join("next.key").exists());
    let new = issue("new");
    assert!(new.facts().rotating);
    assert_ne!(new.cluster_id(), old.cluster_id());
    // The new credential chains to the old CA through cross.crt.
    let f = fs::read_to_string(t.path().join("new.cred")).unwrap();
    assert_eq!(
        f.matches("BEGIN CERTIFICATE").count(),
        4,
        "leaf, cross, new CA, old CA"
    );
}
