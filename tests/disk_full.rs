//! A full disk on the agent: refused up front with how much is needed and
//! how much there is, or failed cleanly when the disk fills mid-push; never
//! a partial file under the final path; a re-run after making room resumes.
//!
//! Needs root to mount a small tmpfs; without it the tests say why and pass.

use crate::common;

use std::time::Duration;

use common::*;

/// A 30 MiB push into 16 MiB is refused before anything is written, with
/// the numbers; after the disk grows, the same push succeeds.
#[test]
fn no_space_is_refused_with_need_and_have_then_succeeds_after_growing() {
    let t = tempdir("disk-full");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 30 * MIB, 50);
    let Some(fs) = tmpfs_or_skip(&t.path().join("mnt"), "16m") else {
        return;
    };
    let root = fs.dir.join("root");
    let agent = Agent::start("127.0.0.50:0", &root, &key);

    let r = push(&src, &[&agent.addr], &key, &[]);
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    let err = r.stderr.to_lowercase();
    for word in ["no space", "need", "have"] {
        assert!(err.contains(word), "stderr lacks {word:?}: {r:#?}");
    }
    let s: PushJson = r.json();
    assert!(!s.node(&agent.addr).ok);
    assert_eq!(s.bytes_sent, 0, "nothing is sent to a full disk: {s:#?}");
    assert_no_wrong_files(&src, &root.join("m"));
    assert!(!root.join(".xfer/models/m.json").exists());

    fs.resize("128m");
    let s = push_ok(&src, &[&agent.addr], &key, &[]);
    assert_eq!(s.bytes_sent, tree_bytes(&src));
    assert_same_tree(&src, &root.join("m"));
    let (r, _) = verify(&root.join("m"));
    assert!(r.success(), "{r:#?}");
}

/// The disk fills up (another writer) in the middle of a push: the push
/// fails with a space error, nothing partial is placed, and after the space
/// is freed a re-run resumes and completes.
#[test]
fn disk_filling_up_mid_push_fails_cleanly_and_resumes() {
    let t = tempdir("disk-fills");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 16 * MIB, 51);
    let manifest = scan(&src, MIB);
    let Some(fs) = tmpfs_or_skip(&t.path().join("mnt"), "24m") else {
        return;
    };
    let root = fs.dir.join("root");
    let agent = Agent::start("127.0.0.51:0", &root, &key);
    let journal = agent.journal("m");

    let pusher = Proc::spawn(&mut push_cmd(
        &src,
        &[&agent.addr],
        &key,
        &["--limit-rate", "4MiB", "--chunk-size", "1MiB"],
    ));
    wait_until("the first chunks", Duration::from_secs(60), || {
        journal_held_bytes(&journal, &manifest) >= 2 * MIB
    });
    // Another writer takes every free byte.
    let filler = fs.dir.join("filler");
    fill_disk(&filler);
    let r = pusher.wait(Duration::from_secs(60));
    assert_eq!(r.status.code(), Some(1), "{r:#?}\nagent: {}", agent.log());
    assert!(
        r.stderr.to_lowercase().contains("space"),
        "the error must say the disk is full: {r:#?}"
    );
    assert_no_wrong_files(&src, &root.join("m"));
    assert!(!root.join(".xfer/models/m.json").exists());

    eprintln!("mid-push failure: {}", r.stderr.trim());
    std::fs::remove_file(&filler).unwrap();
    let s = push_ok(&src, &[&agent.addr], &key, &["--chunk-size", "1MiB"]);
    assert!(s.bytes_skipped > 0, "nothing was resumed: {s:#?}");
    assert_eq!(s.bytes_sent + s.bytes_skipped, tree_bytes(&src));
    assert_same_tree(&src, &root.join("m"));
}
