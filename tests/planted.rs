//! Symlinks planted under an agent's root by someone who can write it: a
//! real push never writes through one. Each case plants a link to a file
//! (or folder) outside the root, pushes a real model to a real agent, and
//! checks that the outside is untouched and that the push either replaced
//! the link or failed with a message naming it and the fix.

use crate::common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use common::*;

const KNOWN: &[u8] = b"outside the root; must never change\n";

/// A file outside any root, with known bytes.
fn victim(dir: &Path, name: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    fs::write(&p, KNOWN).unwrap();
    p
}

fn assert_untouched(p: &Path) {
    assert_eq!(fs::read(p).unwrap(), KNOWN, "{} was written", p.display());
}

/// The error of the one node of a push that must fail.
fn failed_push(src: &Path, agent: &Agent, key: &Path) -> String {
    let r = run(
        &mut push_cmd(src, &[&agent.addr], key, &["--chunk-size", "64KiB"]),
        Duration::from_secs(120),
    );
    assert_eq!(r.status.code(), Some(1), "{r:#?}");
    let s: PushJson = r.json();
    let n = s.node(&agent.addr);
    assert!(!n.ok, "{n:#?}");
    n.error.clone().unwrap_or_default()
}

/// A stale record `.tmp` that is a symlink is replaced, not written
/// through: the push succeeds and the record is a real file.
#[test]
fn a_symlink_at_the_record_tmp_is_replaced_not_followed() {
    let t = tempdir("planted-tmp");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 171);
    let outside = victim(t.path(), "victim");
    let agent = Agent::start("127.0.0.171:0", &t.path().join("root"), &key);
    let tmp = agent.root.join(".xfer/models/m.json.tmp");
    symlink(&outside, &tmp).unwrap();

    push_ok(&src, &[&agent.addr], &key, &["--chunk-size", "64KiB"]);
    assert_untouched(&outside);
    let rec = fs::symlink_metadata(agent.root.join(".xfer/models/m.json")).unwrap();
    assert!(rec.is_file(), "the record is a real file");
    assert!(
        fs::symlink_metadata(&tmp).is_err(),
        "the temporary file was renamed into place"
    );
    assert_same_tree(&src, &agent.model_dir("m"));
}

/// Staging files a receive writes: symlinked data files are refused with a
/// message that names the link and the fix; a symlinked `journal.tmp` is
/// replaced. Neither target changes.
#[test]
fn symlinks_at_staging_files_are_refused_and_never_written_through() {
    let t = tempdir("planted-staging");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 172);
    let data_victim = victim(t.path(), "data-victim");
    let journal_victim = victim(t.path(), "journal-victim");
    let agent = Agent::start("127.0.0.172:0", &t.path().join("root"), &key);
    let staging = agent.staging_dir("m");
    fs::create_dir_all(staging.join("data")).unwrap();
    let files = scan(&src, 64 << 10).files().count();
    for i in 0..files {
        symlink(&data_victim, staging.join("data").join(i.to_string())).unwrap();
    }
    symlink(&journal_victim, staging.join("journal.tmp")).unwrap();

    let err = failed_push(&src, &agent, &key);
    assert!(
        err.contains("is a symlink; xfer never writes through one. Remove it"),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}", staging.join("data").display())),
        "{err}"
    );
    assert!(err.contains("planted it"), "{err}");
    assert_untouched(&data_victim);
    assert_untouched(&journal_victim);
    assert!(
        fs::symlink_metadata(staging.join("journal"))
            .unwrap()
            .is_file(),
        "the journal was written as a real file"
    );
}

/// `.xfer/models` itself replaced by a symlink to an outside folder: the
/// record is refused, nothing is written into that folder.
#[test]
fn a_symlinked_records_folder_is_refused_and_nothing_lands_outside() {
    let t = tempdir("planted-dir");
    let key = t.path().join("key");
    keygen(&key);
    let src = t.path().join("m");
    gen_model(&src, 2 * MIB, 173);
    let outside = t.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let agent = Agent::start("127.0.0.173:0", &t.path().join("root"), &key);
    let models = agent.root.join(".xfer/models");
    fs::remove_dir(&models).unwrap();
    symlink(&outside, &models).unwrap();

    let err = failed_push(&src, &agent, &key);
    assert!(
        err.contains(&format!(
            "{} is a symlink; xfer never writes through one",
            models.display()
        )) || err.contains(&format!("refusing to write {}", models.display())),
        "{err}"
    );
    assert!(err.contains("planted it"), "{err}");
    let inside: Vec<_> = fs::read_dir(&outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(inside.is_empty(), "written outside the root: {inside:?}");
}
