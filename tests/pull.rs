//! `xfer pull` against a Hub-protocol server (`tests/hub_server.py`) and a
//! real mirror (olah): the exact `huggingface_hub` cache layout, paging,
//! gated and renamed repos, clear errors, retries, servers that ignore
//! Range, corrupt bodies, `kill -9` and resume, a full disk, `--local-dir`,
//! filters, and the real client reading what we wrote.
//!
//! Every test starts its own server (ports picked by the kernel) on repos it
//! generates in its own temp dir, and runs the real `xfer` binary.

use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::hub::*;
use common::*;
use xfer_proto::relpath::RelPath as RelPathOf;

/// The number of tree entries (files and folders) of a repo.
fn tree_entries(meta: &RepoMeta) -> usize {
    let mut dirs = BTreeSet::new();
    for p in meta.files.keys() {
        let parts: Vec<&str> = p.split('/').collect();
        for i in 1..parts.len() {
            dirs.insert(parts[..i].join("/"));
        }
    }
    meta.files.len() + dirs.len()
}

/// Asserts the server resolved every file of `meta` (under `served_as`)
/// exactly once, and nothing else: no `HEAD` (the first `GET` of a file
/// finds where its bytes are), one `GET` of the resolve URL per file, which
/// serves a regular file's bytes and redirects an LFS file to the CDN.
fn assert_resolved_once(stats: &serde_json::Value, served_as: &str, meta: &RepoMeta) {
    assert_eq!(stats["resolve_head"], 0, "no HEAD: {stats:#}");
    assert_eq!(
        stats["resolve_get"],
        meta.files.len(),
        "one GET per file: {stats:#}"
    );
    assert_eq!(
        stats["cdn_get"],
        meta.lfs_count(),
        "one CDN GET per LFS file: {stats:#}"
    );
    let by_path = stats["resolve_by_path"].as_object().unwrap();
    let got: BTreeSet<&str> = by_path.keys().map(String::as_str).collect();
    let want: BTreeSet<String> = meta
        .files
        .keys()
        .map(|p| format!("{served_as}/{p}"))
        .collect();
    assert_eq!(
        got,
        want.iter().map(String::as_str).collect(),
        "resolved paths"
    );
    for p in meta.files.keys() {
        let n = &by_path[&format!("{served_as}/{p}")];
        assert_eq!(n.as_u64(), Some(1), "{p}: resolved once");
    }
}

/// 1. A paged listing whose next links point at huggingface.co, a renamed
///    repo (relative 307) and a gated repo with the right token: the exact
///    cache layout, every file verified and resolved once, and the token
///    never sent to the CDN.
#[test]
fn paged_alias_and_gated_repos_land_in_the_exact_cache_layout() {
    let t = tempdir("pull-layout");
    let repos = t.path().join("repos");
    let tiny = small_repo(&repos, "acme/tiny", 1);
    let gated = gen_repo(
        &repos,
        "acme/gated",
        2,
        &[
            ("config.json", 50),
            ("model.safetensors", 2 * MIB + 5),
            ("sub/a/b/weights.bin", 1024),
        ],
    );
    let server = HubServer::start(
        &repos,
        &[
            "--page-size",
            "2",
            "--foreign-next-links",
            "--token",
            "sekrit",
            "--gated",
            "acme/gated",
            "--alias",
            "old/tiny=acme/tiny",
        ],
    );
    let env = PullEnv::new(&server.endpoint(), t.path()).with_token("sekrit");

    // The renamed repo, listed 2 entries a page.
    let meta = server.repo("acme/tiny");
    let s = env.pull_ok("old/tiny", &[]);
    let dir = env.repo_dir("old/tiny");
    assert_eq!(s.repo, "old/tiny");
    assert_eq!(s.revision, "main");
    assert_eq!(Path::new(&s.repo_dir), dir);
    assert_eq!(Path::new(&s.path), dir.join("snapshots").join(&meta.commit));
    assert_all_verified(&s, &meta);
    assert_eq!(s.bytes_downloaded, meta.total(), "{s:#?}");
    assert_eq!((s.bytes_resumed, s.bytes_present), (0, 0), "{s:#?}");
    assert_cache(&dir, &tiny, &meta);
    let stats = server.stats();
    assert_eq!(stats["auth_leaks"], 0, "{stats:#}");
    assert_eq!(
        stats["api_tree"],
        tree_entries(&meta).div_ceil(2),
        "every page of the listing, each once: {stats:#}"
    );
    assert_resolved_once(&stats, "acme/tiny", &meta);
    assert!(
        stats["cdn_get"].as_u64().unwrap() >= meta.lfs_count() as u64,
        "{stats:#}"
    );

    // The gated repo with the right token.
    server.reset_stats();
    let meta = server.repo("acme/gated");
    let s = env.pull_ok("acme/gated", &[]);
    assert_all_verified(&s, &meta);
    assert_cache(&env.repo_dir("acme/gated"), &gated, &meta);
    let stats = server.stats();
    assert_eq!(stats["auth_leaks"], 0, "{stats:#}");
    assert_resolved_once(&stats, "acme/gated", &meta);
    assert!(stats["cdn_get"].as_u64().unwrap() >= 2, "{stats:#}");
}

/// 2. Refusals are one clear line each, exit non-zero, and leave nothing
///    in the cache.
#[test]
fn gated_unknown_repo_and_unknown_revision_are_clear_errors() {
    let t = tempdir("pull-errors");
    let repos = t.path().join("repos");
    gen_repo(&repos, "acme/gated", 3, &[("model.safetensors", MIB + 3)]);
    gen_repo(&repos, "acme/tiny", 4, &[("config.json", 100)]);
    let server = HubServer::start(&repos, &["--token", "sekrit", "--gated", "acme/gated"]);
    let env = PullEnv::new(&server.endpoint(), t.path());

    let one_line = |r: &Run| {
        assert_eq!(
            r.stderr.trim().lines().count(),
            1,
            "one line on stderr: {r:#?}"
        )
    };
    // No token: 401.
    let r = env.pull("acme/gated", &[]);
    let e = assert_error(
        &r,
        &["acme/gated", "gated", "HF_TOKEN", "licence", "log in"],
    );
    one_line(&r);
    eprintln!("no token: {e}");
    // A wrong token: 403.
    let r = env.clone().with_token("wrong").pull("acme/gated", &[]);
    let e = assert_error(
        &r,
        &[
            "acme/gated",
            "gated",
            "HF_TOKEN",
            "licence",
            "authorized list",
        ],
    );
    one_line(&r);
    eprintln!("wrong token: {e}");
    // A repo that does not exist.
    let r = env.pull("acme/nothere", &[]);
    let e = assert_error(&r, &["acme/nothere", "not found"]);
    one_line(&r);
    eprintln!("unknown repo: {e}");
    // A revision that does not exist.
    let r = env.pull("acme/tiny@nope", &[]);
    let e = assert_error(&r, &["acme/tiny", "revision", "nope"]);
    one_line(&r);
    eprintln!("unknown revision: {e}");

    let files: Vec<String> = if env.cache.exists() {
        walk(&env.cache)
            .into_iter()
            .filter(|(_, n)| !matches!(n, Node::Dir))
            .map(|(p, _)| p)
            .collect()
    } else {
        Vec::new()
    };
    assert!(files.is_empty(), "refused pulls left files: {files:?}");
    let stats = server.stats();
    assert_eq!(stats["resolve_head"], 0, "{stats:#}");
    assert_eq!(stats["resolve_get"], 0, "{stats:#}");
    assert_eq!(stats["cdn_get"], 0, "{stats:#}");
}

/// 3. 429 with Retry-After, 500s, truncated and reset bodies and a 503 from
///    the API are all retried: the pull succeeds and every file verifies.
#[test]
fn transient_failures_are_retried_and_the_pull_succeeds() {
    let t = tempdir("pull-retries");
    let repos = t.path().join("repos");
    let src = small_repo(&repos, "acme/tiny", 5);
    let server = HubServer::start(
        &repos,
        &[
            "--fault",
            "429:2:0.3",
            "--fault",
            "500:2",
            "--fault",
            "truncate:2",
            "--fault",
            "reset:1",
            "--fault",
            "503-api:1",
        ],
    );
    let env = PullEnv::new(&server.endpoint(), t.path());
    let meta = server.repo("acme/tiny");
    let s = env.pull_ok("acme/tiny", &[]);
    assert_all_verified(&s, &meta);
    assert_cache(&env.repo_dir("acme/tiny"), &src, &meta);
    assert!(s.retries >= 5, "retries: {s:#?}");
    let stats = server.stats();
    let faults = &stats["faults"];
    for (kind, n) in [
        ("429", 2),
        ("500", 2),
        ("truncate", 2),
        ("reset", 1),
        ("503-api", 1),
    ] {
        assert_eq!(faults[kind], n, "{kind} injected: {stats:#}");
    }
    assert!(faults.get("server_error").is_none(), "{stats:#}");
    assert_eq!(stats["auth_leaks"], 0, "{stats:#}");
}

/// 4. A server that ignores Range: each file comes as one stream from byte
///    0, and the bytes are right.
#[test]
fn a_server_ignoring_range_is_read_as_whole_streams() {
    let t = tempdir("pull-norange");
    let repos = t.path().join("repos");
    let src = gen_repo(
        &repos,
        "acme/big",
        6,
        &[
            ("config.json", 200),
            ("model-00001-of-00002.safetensors", 6 * MIB + 1),
            ("sub/model-00002-of-00002.safetensors", 6 * MIB - 3),
        ],
    );
    let server = HubServer::start(&repos, &["--fault", "ignore-range"]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    let meta = server.repo("acme/big");
    let s = env.pull_ok("acme/big", &["--part-size", "1MiB", "--connections", "4"]);
    assert_all_verified(&s, &meta);
    assert_cache(&env.repo_dir("acme/big"), &src, &meta);
    assert!(
        s.whole_streams >= meta.lfs_count() as u64,
        "every multi-part file must have switched to one stream: {s:#?}"
    );
    assert!(s.bytes_downloaded >= meta.total(), "{s:#?}");
    let stats = server.stats();
    assert!(
        stats["faults"]["ignore-range"].as_u64().unwrap_or(0) >= 1,
        "{stats:#}"
    );
    // Learnt once per host, so no file is sent whole more than once (before,
    // each of the 4 connections asked for a part and got the whole file).
    assert_eq!(
        stats["bytes_served"].as_u64(),
        Some(meta.total()),
        "every file exactly once: {stats:#}"
    );
}

/// Partial downloads of files this revision no longer has (the repo
/// changed on the server after an interrupted pull) are removed once the
/// pull completes; a running pull's lock keeps its own.
#[test]
fn incomplete_files_of_an_older_revision_are_cleaned_up() {
    let t = tempdir("pull-leftovers");
    let repos = t.path().join("repos");
    let src = small_repo(&repos, "acme/tiny", 5);
    let server = HubServer::start(&repos, &[]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    let meta = server.repo("acme/tiny");
    let blobs = env.repo_dir("acme/tiny").join("blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let old = "0".repeat(64);
    for ext in ["xfer.incomplete", "xfer.parts"] {
        std::fs::write(blobs.join(format!("{old}.{ext}")), b"left by a killed pull").unwrap();
    }
    let s = env.pull_ok("acme/tiny", &[]);
    assert_eq!(s.stale_removed, 2, "{s:#?}");
    assert_eq!(s.tree_cache, format!("trees/{}.json", meta.commit));
    assert_cache(&env.repo_dir("acme/tiny"), &src, &meta);
}

/// Streaming's puller side (issue 17): asked for chunk hashes, a pull
/// announces the draft of its files, each chunk's BLAKE3 hash as it lands
/// and a seal per file; a file corrupted once is withdrawn and announced
/// again under the next generation. Applied in order to a draft, the
/// announcements give every file's BLAKE3 hash, as `b3sum` of the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_announces_chunks_seals_and_withdrawals_that_rebuild_its_manifest() {
    use std::sync::{Arc, Mutex};
    use xfer::hub::announce::{DraftUpdate, OnDraft};
    use xfer_proto::draft::Applied;
    use xfer_proto::manifest::Entry;

    let t = tempdir("pull-draft");
    let repos = t.path().join("repos");
    let src = small_repo(&repos, "acme/tiny", 11);
    let bad = "model-00001-of-00002.safetensors";
    let server = HubServer::start(&repos, &["--fault", &format!("corrupt-once:{bad}")]);
    let env = xfer::hub::env::HubEnv {
        endpoint: server.endpoint(),
        token: None,
        cache_root: t.path().join("cache"),
    };
    let opts = xfer::hub::pull::PullOptions {
        repo: xfer_proto::repo::RepoRef::parse("acme/tiny", xfer_proto::repo::RepoType::Model)
            .unwrap(),
        include: Vec::new(),
        exclude: Vec::new(),
        local_dir: None,
        connections: 4,
        part_size: 1 << 20,
        chunk_size: Some((64 * 1024).into()),
        intake: Default::default(),
        before_change: None,
        stats: None,
        pin: None,
    };
    let seen: Arc<Mutex<Vec<DraftUpdate>>> = Default::default();
    let on: OnDraft = {
        let seen = seen.clone();
        Arc::new(move |u| seen.lock().unwrap().push(u))
    };
    let progress = xfer::util::progress::Progress::new(false);
    let (s, _) = xfer::hub::pull::pull(&opts, &env, &progress, None, Some(on))
        .await
        .unwrap();
    assert!(s.verification.all_verified, "{s:#?}");
    assert_eq!(s.verification.recovered, 1, "{s:#?}");

    let updates = std::mem::take(&mut *seen.lock().unwrap());
    let DraftUpdate::Listed { mut draft, .. } = updates[0].clone() else {
        panic!("the listing comes first: {:?}", updates[0])
    };
    let mut withdrawn = Vec::new();
    for u in &updates[1..] {
        let e = match u {
            DraftUpdate::Event(e) => e,
            DraftUpdate::FirstByte => continue,
            DraftUpdate::Listed { .. } => panic!("one listing only: {u:?}"),
        };
        match draft.apply(e) {
            Ok(Applied::Withdrawn(f, _)) => withdrawn.push(f),
            Ok(Applied::Stale) => panic!("a stale announcement: {e:?}"),
            Ok(_) => {}
            Err(why) => panic!("{why}: {e:?}"),
        }
    }
    // The draft lists contents as the cache holds them: blobs by hash.
    let repo_dir = t.path().join("cache/models--acme--tiny");
    let bad_blob = fs::read_link(repo_dir.join("snapshots").join(&s.commit).join(bad)).unwrap();
    let bad_blob = format!("blobs/{}", bad_blob.file_name().unwrap().to_str().unwrap());
    let bad_index = draft.index_of(&RelPathOf::new(&bad_blob).unwrap()).unwrap();
    assert_eq!(withdrawn, vec![bad_index], "the corrupted file, once");
    assert_eq!(draft.generation(bad_index), Some(1));
    let manifest = draft.manifest().expect("every file sealed");
    let blobs = fs::read_dir(repo_dir.join("blobs")).unwrap().count();
    assert_eq!(manifest.file_count(), blobs, "one file per blob");
    let _ = &src;
    let mut links = 0;
    for e in &manifest.entries {
        match e {
            Entry::File(f) => {
                let bytes = fs::read(repo_dir.join(f.path.as_str())).unwrap();
                assert_eq!(
                    f.hash,
                    blake3::hash(&bytes).into(),
                    "{}: the announced chunks are the file's",
                    f.path.as_str()
                );
            }
            // The snapshot's names, each the link the cache holds.
            Entry::Symlink { path, target } => {
                assert!(
                    path.as_str()
                        .starts_with(&format!("snapshots/{}/", s.commit)),
                    "{e:?}"
                );
                assert_eq!(
                    fs::read_link(repo_dir.join(path.as_str())).unwrap(),
                    std::path::Path::new(target),
                    "{e:?}"
                );
                links += 1;
            }
            Entry::Dir { .. } => panic!("{e:?}"),
        }
    }
    assert!(
        links >= blobs,
        "one snapshot name per file at least: {links} for {blobs} blobs"
    );

    // A re-run finds every file in place: each is hashed once, checked
    // against its Hub hash, and announced sealed, giving the same manifest.
    let (s, _) = xfer::hub::pull::pull(&opts, &env, &progress, None, Some(on_again(&seen)))
        .await
        .unwrap();
    assert_eq!(s.bytes_downloaded, 0, "{s:#?}");
    let updates = std::mem::take(&mut *seen.lock().unwrap());
    let DraftUpdate::Listed {
        draft: mut again, ..
    } = updates[0].clone()
    else {
        panic!("{:?}", updates[0])
    };
    for u in &updates[1..] {
        if let DraftUpdate::Event(e) = u {
            again.apply(e).unwrap();
        }
    }
    assert_eq!(again.manifest().expect("all sealed"), manifest);
}

fn on_again(
    seen: &std::sync::Arc<std::sync::Mutex<Vec<xfer::hub::announce::DraftUpdate>>>,
) -> xfer::hub::announce::OnDraft {
    let seen = seen.clone();
    std::sync::Arc::new(move |u| seen.lock().unwrap().push(u))
}

/// 5a. A body corrupted once fails its sha256, is downloaded again and
///     passes.
#[test]
fn a_body_corrupted_once_is_downloaded_again() {
    let t = tempdir("pull-corrupt-once");
    let repos = t.path().join("repos");
    let src = small_repo(&repos, "acme/tiny", 7);
    let bad = "model-00001-of-00002.safetensors";
    let server = HubServer::start(&repos, &["--fault", &format!("corrupt-once:{bad}")]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    let meta = server.repo("acme/tiny");
    let s = env.pull_ok("acme/tiny", &[]);
    assert_eq!(s.verification.recovered, 1, "{s:#?}");
    assert_all_verified(&s, &meta);
    assert!(
        s.bytes_downloaded >= meta.total() + meta.files[bad].size,
        "the bad file is fetched twice: {s:#?}"
    );
    assert_cache(&env.repo_dir("acme/tiny"), &src, &meta);
    assert_eq!(server.stats()["faults"]["corrupt-once"], 1);
}

/// 5b. A body that is corrupt every time fails the pull with a message that
///     says so, and the bad bytes are never placed.
#[test]
fn a_body_corrupt_every_time_fails_and_is_never_placed() {
    let t = tempdir("pull-corrupt");
    let repos = t.path().join("repos");
    small_repo(&repos, "acme/tiny", 8);
    let bad = "sub/model-00002-of-00002.safetensors";
    let server = HubServer::start(&repos, &["--fault", &format!("corrupt:{bad}")]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    let meta = server.repo("acme/tiny");
    let r = env.pull("acme/tiny", &[]);
    let e = assert_error(&r, &[bad, "sha256", "second time", "corrupt"]);
    eprintln!("{e}");
    let dir = env.repo_dir("acme/tiny");
    let etag = &meta.files[bad].etag;
    assert!(
        !dir.join("blobs").join(etag).exists(),
        "the corrupt file must not be placed under its etag"
    );
    let link = dir.join("snapshots").join(&meta.commit).join(bad);
    assert!(
        fs::symlink_metadata(&link).is_err(),
        "no snapshot link to the corrupt file"
    );
    assert!(
        !dir.join("refs/main").exists(),
        "no ref to an unfinished snapshot"
    );
    // What was placed is right.
    if dir.join("blobs").exists() {
        for name in listing(&dir.join("blobs")) {
            if let Some((p, _)) = meta.files.iter().find(|(_, f)| f.etag == name) {
                same_bytes(
                    &repos.join("acme/tiny").join(p),
                    &dir.join("blobs").join(&name),
                )
                .unwrap();
            } else {
                assert!(
                    name.starts_with(etag.as_str()),
                    "unexpected file in blobs/: {name}"
                );
            }
        }
    }
    assert_eq!(
        server.stats()["faults"]["corrupt"],
        2,
        "served corrupt twice"
    );
}

/// Bytes the resume sidecar `path` records as written (0 if unreadable).
fn sidecar_done(path: &Path) -> u64 {
    let Ok(b) = fs::read(path) else { return 0 };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b) else {
        return 0;
    };
    v["done"]
        .as_array()
        .map(|a| a.iter().filter_map(|d| d.as_u64()).sum())
        .unwrap_or(0)
}

/// 6. `kill -9` in the middle of a large file: nothing is placed; the
///    re-run resumes every part from what the sidecar recorded.
#[test]
fn kill_9_mid_download_then_resume() {
    let t = tempdir("pull-kill9");
    let repos = t.path().join("repos");
    let src = gen_repo(
        &repos,
        "acme/big",
        9,
        &[("model.safetensors", 96 * MIB + 4321)],
    );
    let server = HubServer::start(&repos, &["--rate", "20000000"]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    let meta = server.repo("acme/big");
    let etag = meta.files["model.safetensors"].etag.clone();
    let dir = env.repo_dir("acme/big");
    let blob = dir.join("blobs").join(&etag);
    let incomplete = dir.join("blobs").join(format!("{etag}.xfer.incomplete"));
    let sidecar = dir.join("blobs").join(format!("{etag}.xfer.parts"));
    let args = ["--connections", "4", "--part-size", "4MiB"];

    let mut p = Proc::spawn(&mut env.cmd("acme/big", &args));
    let mut seen = 0;
    wait_until(
        "the sidecar to record 20 MiB",
        Duration::from_secs(60),
        || {
            assert!(
                p.running(),
                "the pull ended before it could be killed (sidecar had {seen} bytes)"
            );
            seen = sidecar_done(&sidecar);
            seen > 20 * MIB
        },
    );
    let r = p.kill9();
    assert!(!r.success(), "killed: {r:#?}");
    eprintln!("killed with {seen} bytes recorded");
    assert!(!blob.exists(), "no blob under its final name after kill -9");
    assert!(incomplete.exists() && sidecar.exists());
    assert!(!dir.join("refs/main").exists());
    assert!(
        sidecar_done(&sidecar) >= seen,
        "the sidecar never goes back"
    );

    let s = env.pull_ok("acme/big", &args);
    assert!(s.bytes_resumed >= 20 * MIB, "{s:#?}");
    assert!(s.bytes_resumed >= seen, "{s:#?}");
    assert!(s.bytes_downloaded < meta.total(), "{s:#?}");
    assert_eq!(
        s.bytes_downloaded + s.bytes_resumed,
        meta.total(),
        "exactly the missing bytes are fetched: {s:#?}"
    );
    assert!(
        s.verification.all_verified && s.verification.sha256_ok == 1,
        "{s:#?}"
    );
    assert_cache(&dir, &src, &meta);
}

/// 7. A cache on a disk too small is refused before any byte is fetched,
///    with how much is needed and how much there is; with room, it works.
#[test]
fn a_full_disk_is_refused_before_downloading() {
    let t = tempdir("pull-disk");
    let repos = t.path().join("repos");
    let src = gen_repo(
        &repos,
        "acme/big",
        10,
        &[
            ("config.json", 100),
            ("model-00001-of-00002.safetensors", 32 * MIB + 1),
            ("model-00002-of-00002.safetensors", 32 * MIB - 1),
        ],
    );
    let Some(fs) = tmpfs_or_skip(&t.path().join("mnt"), "32m") else {
        return;
    };
    let server = HubServer::start(&repos, &[]);
    let env = PullEnv::new(&server.endpoint(), t.path()).with_cache(&fs.dir.join("hub"));
    let r = env.pull("acme/big", &[]);
    let e = assert_error(&r, &["disk space", "need ", " have ", " at "]);
    assert!(
        e.contains(&fs.dir.display().to_string()),
        "the error names where: {e}"
    );
    eprintln!("{e}");
    let stats = server.stats();
    assert_eq!(stats["cdn_get"], 0, "nothing fetched: {stats:#}");
    assert_eq!(stats["resolve_get"], 0, "nothing fetched: {stats:#}");
    let blobs = env.repo_dir("acme/big").join("blobs");
    assert!(
        !blobs.exists() || listing(&blobs).is_empty(),
        "nothing written: {:?}",
        listing(&blobs)
    );

    fs.resize("128m");
    let meta = server.repo("acme/big");
    let s = env.pull_ok("acme/big", &[]);
    assert_all_verified(&s, &meta);
    assert_cache(&env.repo_dir("acme/big"), &src, &meta);
}

/// 8. `--local-dir`: plain files plus `huggingface_hub`'s metadata; a
///    re-run fetches nothing.
#[test]
fn local_dir_gets_plain_files_and_metadata_and_a_rerun_fetches_nothing() {
    let t = tempdir("pull-localdir");
    let repos = t.path().join("repos");
    let src = small_repo(&repos, "acme/tiny", 11);
    let server = HubServer::start(&repos, &["--page-size", "3"]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    let meta = server.repo("acme/tiny");
    let local = t.path().join("local");
    let ld = local.to_str().unwrap();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();

    let s = env.pull_ok("acme/tiny", &["--local-dir", ld]);
    assert_all_verified(&s, &meta);
    assert_eq!(Path::new(&s.path), local);
    let after = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let meta_dir = local.join(".cache/huggingface/download");
    let mut want_files = BTreeSet::new();
    for (path, f) in &meta.files {
        same_bytes(&src.join(path), &local.join(path)).unwrap();
        let m = meta_dir.join(format!("{path}.metadata"));
        let text = fs::read_to_string(&m).unwrap_or_else(|e| panic!("{}: {e}", m.display()));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{path}.metadata: {text:?}");
        assert_eq!(lines[0], meta.commit, "{path}.metadata: commit");
        assert_eq!(lines[1], f.etag, "{path}.metadata: etag");
        let ts: f64 = lines[2]
            .parse()
            .unwrap_or_else(|_| panic!("{path}.metadata: timestamp {:?}", lines[2]));
        assert!(
            ts >= before.floor() - 1.0 && ts <= after + 1.0,
            "{path}.metadata: timestamp {ts} not within the pull ({before}..{after})"
        );
        want_files.insert(path.clone());
        want_files.insert(format!(".cache/huggingface/download/{path}.metadata"));
    }
    want_files.insert(format!(".cache/huggingface/trees/{}.json", meta.commit));
    let got_files: BTreeSet<String> = walk(&local)
        .into_iter()
        .filter(|(p, n)| !matches!(n, Node::Dir) && p != ".cache/huggingface/.gitignore")
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        got_files, want_files,
        "exactly the files and their metadata"
    );
    assert!(!env.cache.exists(), "--local-dir leaves the cache alone");

    server.reset_stats();
    let s = env.pull_ok("acme/tiny", &["--local-dir", ld]);
    assert_eq!(s.bytes_present, meta.total(), "{s:#?}");
    assert_eq!(s.bytes_downloaded, 0, "{s:#?}");
    assert_eq!(s.verification.present, meta.files.len(), "{s:#?}");
    assert!(s.verification.all_verified, "{s:#?}");
    let stats = server.stats();
    assert_eq!(stats["resolve_get"], 0, "{stats:#}");
    assert_eq!(stats["cdn_get"], 0, "{stats:#}");
    for path in meta.files.keys() {
        same_bytes(&src.join(path), &local.join(path)).unwrap();
    }
}

/// 9. `--include` / `--exclude` (fnmatch: `*` crosses `/`; `dir/` is
///    everything under it): only the chosen files are resolved and placed.
#[test]
fn include_and_exclude_choose_the_files() {
    let t = tempdir("pull-filters");
    let repos = t.path().join("repos");
    let src = small_repo(&repos, "acme/tiny", 12);
    let server = HubServer::start(&repos, &[]);
    let meta = server.repo("acme/tiny");
    type Case = (&'static str, &'static [&'static str], fn(&str) -> bool);
    let cases: [Case; 4] = [
        ("json", &["--include", "*.json"], |p| p.ends_with(".json")),
        (
            "top-shard",
            &["--include", "*.safetensors", "--exclude", "sub/*"],
            |p| p == "model-00001-of-00002.safetensors",
        ),
        ("sub", &["--include", "sub/"], |p| p.starts_with("sub/")),
        (
            "no-weights",
            &["--exclude", "*.safetensors", "--exclude", "tokenizer.txt"],
            |p| !p.ends_with(".safetensors") && p != "tokenizer.txt",
        ),
    ];
    for (tag, args, keep) in cases {
        let env = PullEnv::new(&server.endpoint(), &t.path().join(tag));
        let want = meta.only(keep);
        assert!(!want.files.is_empty() && want.files.len() < meta.files.len());
        server.reset_stats();
        let s = env.pull_ok("acme/tiny", args);
        assert_all_verified(&s, &want);
        assert_cache(&env.repo_dir("acme/tiny"), &src, &want);
        assert_resolved_once(&server.stats(), "acme/tiny", &want);
    }
    let env = PullEnv::new(&server.endpoint(), &t.path().join("none"));
    let r = env.pull("acme/tiny", &["--include", "*.gguf"]);
    assert_error(&r, &["none match", "--include"]);
}

/// Runs the real client's `hf` CLI.
fn hf_cli(env: &PullEnv, args: &[&str]) -> Run {
    hf_python(); // fails with how to install the venv
    let mut c = Command::new(Path::new(HF_VENV).join("bin/hf"));
    env.apply(&mut c);
    c.args(args);
    run(&mut c, Duration::from_secs(120))
}

/// 10. The real `huggingface_hub` reads our cache offline, and `hf cache
///     verify` finds every file right (and notices a corrupted one).
#[test]
fn the_real_client_reads_and_verifies_our_cache() {
    hf_python();
    let t = tempdir("pull-hfclient");
    let repos = t.path().join("repos");
    let src = small_repo(&repos, "acme/tiny", 13);
    // The stock client follows next links as they are: keep them local.
    let server = HubServer::start(&repos, &["--page-size", "2"]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    let meta = server.repo("acme/tiny");
    let s = env.pull_ok("acme/tiny", &[]);
    assert_all_verified(&s, &meta);
    let snap = env
        .repo_dir("acme/tiny")
        .join("snapshots")
        .join(&meta.commit);
    assert_eq!(Path::new(&s.path), snap);

    assert_eq!(
        offline_snapshot(&env, "acme/tiny"),
        snap.display().to_string()
    );
    let cache = env.cache.to_str().unwrap();
    let verify = [
        "cache",
        "verify",
        "acme/tiny",
        "--cache-dir",
        cache,
        "--fail-on-missing-files",
        "--fail-on-extra-files",
    ];
    let r = hf_cli(&env, &verify);
    r.assert_ok("hf cache verify");

    // `trees/<commit>.json` is the listing huggingface_hub writes itself.
    let theirs = t.path().join("hf-cache");
    let r = hf_cli(
        &env,
        &[
            "download",
            "acme/tiny",
            "--cache-dir",
            theirs.to_str().unwrap(),
        ],
    );
    r.assert_ok("hf download into a cache of its own");
    let json = |p: PathBuf| -> serde_json::Value {
        let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_slice(&b).unwrap()
    };
    let tree_in = |cache: &Path| {
        cache
            .join("models--acme--tiny/trees")
            .join(format!("{}.json", meta.commit))
    };
    assert_eq!(json(tree_in(&theirs)), json(tree_in(&env.cache)));

    // A re-run finds everything in place, and so does the real client
    // online: it fetches no byte again.
    let s = env.pull_ok("acme/tiny", &[]);
    assert_eq!(s.bytes_present, meta.total(), "{s:#?}");
    assert_eq!(s.bytes_downloaded, 0, "{s:#?}");
    assert_cache(&env.repo_dir("acme/tiny"), &src, &meta);
    server.reset_stats();
    let r = hf_cli(&env, &["download", "acme/tiny"]);
    r.assert_ok("hf download");
    assert!(r.stdout.contains(snap.to_str().unwrap()), "{r:#?}");
    let stats = server.stats();
    assert_eq!(stats["resolve_get"], 0, "hf download re-fetched: {stats:#}");
    assert_eq!(stats["cdn_get"], 0, "hf download re-fetched: {stats:#}");

    // The same for --local-dir: `hf cache verify --local-dir` passes and
    // `hf download --local-dir` takes our metadata as up to date.
    let local = t.path().join("local");
    let ld = local.to_str().unwrap();
    env.pull_ok("acme/tiny", &["--local-dir", ld]);
    let r = hf_cli(
        &env,
        &[
            "cache",
            "verify",
            "acme/tiny",
            "--local-dir",
            ld,
            "--fail-on-missing-files",
            "--fail-on-extra-files",
        ],
    );
    r.assert_ok("hf cache verify --local-dir");
    assert_eq!(
        json(local.join(format!(".cache/huggingface/trees/{}.json", meta.commit))),
        json(tree_in(&env.cache))
    );
    server.reset_stats();
    let r = hf_cli(&env, &["download", "acme/tiny", "--local-dir", ld]);
    r.assert_ok("hf download --local-dir");
    let stats = server.stats();
    assert_eq!(stats["resolve_get"], 0, "hf download re-fetched: {stats:#}");
    assert_eq!(stats["cdn_get"], 0, "hf download re-fetched: {stats:#}");
    for path in meta.files.keys() {
        same_bytes(&src.join(path), &local.join(path)).unwrap();
    }

    // The check has teeth: a same-size corrupted blob fails it.
    let bad = "sub/model-00002-of-00002.safetensors";
    scribble(&snap.join(bad), 1000, 1, 14);
    let r = hf_cli(&env, &verify);
    assert!(
        !r.success(),
        "hf cache verify passed a corrupt blob: {r:#?}"
    );
    assert!(
        format!("{}{}", r.stdout, r.stderr).contains("model-00002-of-00002.safetensors"),
        "{r:#?}"
    );
}

/// An olah mirror started by `scripts/olah-mirror.sh`, stopped on drop.
struct Olah {
    workdir: PathBuf,
    url: String,
}

impl Olah {
    fn start(workdir: &Path, repo: &str, src: &Path) -> Olah {
        // The port is free when picked but could be taken before olah binds
        // it: then try another.
        let mut tries = 0;
        loop {
            tries += 1;
            let port = unused_tcp_port();
            let r = run(
                Command::new("bash")
                    .arg(workspace_root().join("scripts/olah-mirror.sh"))
                    .arg("start")
                    .arg(workdir)
                    .arg(port.to_string())
                    .arg(repo)
                    .arg(src),
                Duration::from_secs(300),
            );
            // Stopped on drop, even if it failed half-way.
            let olah = Olah {
                workdir: workdir.to_path_buf(),
                url: r
                    .stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("READY "))
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            };
            if r.success() && !olah.url.is_empty() {
                return olah;
            }
            let port_taken = r.stderr.contains("already in use") || r.stderr.contains("is port");
            assert!(
                port_taken && tries < 3,
                "scripts/olah-mirror.sh start failed: {r:#?}"
            );
        }
    }
}

impl Drop for Olah {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(workspace_root().join("scripts/olah-mirror.sh"))
            .arg("stop")
            .arg(&self.workdir)
            .status();
    }
}

/// What a Hub-like server must say about the files of `src` committed as
/// `commit`: sha256 etags for LFS files (≥ 1 MiB or `.safetensors`), git
/// blob sha1 for the rest.
fn meta_of(src: &Path, commit: &str) -> RepoMeta {
    use sha1::Digest as _;
    let mut files = std::collections::BTreeMap::new();
    for (path, node) in walk(src) {
        let Node::File { len, .. } = node else {
            continue;
        };
        let data = fs::read(src.join(&path)).unwrap();
        let lfs = len >= MIB || path.ends_with(".safetensors");
        let mut g = sha1::Sha1::new();
        g.update(format!("blob {len}\0").as_bytes());
        g.update(&data);
        let sha1 = hex::encode(g.finalize());
        let sha256 = lfs.then(|| hex::encode(sha2::Sha256::digest(&data)));
        files.insert(
            path,
            FileMeta {
                size: len,
                etag: sha256.clone().unwrap_or_else(|| sha1.clone()),
                sha1,
                sha256,
                lfs,
            },
        );
    }
    RepoMeta {
        commit: commit.to_string(),
        files,
    }
}

/// 11. A real mirror, olah, which ignores Range and sends chunked bodies:
///     same bytes, verified, readable by the real client offline.
#[test]
fn pull_from_an_olah_mirror() {
    hf_python();
    let t = tempdir("pull-olah");
    let src = gen_repo(
        t.path(),
        "src/olah-tiny",
        15,
        &[
            ("config.json", 400),
            ("sub/tokenizer.json", 20_000),
            ("model.safetensors", 5 * MIB + 4321),
        ],
    );
    let repo = "acme/olah-tiny";
    let olah = Olah::start(&t.path().join("olah"), repo, &src);
    let git_dir = olah.workdir.join("mirrors/models").join(repo);
    let out = Command::new("git")
        .arg("-C")
        .arg(&git_dir)
        .args(["rev-parse", "HEAD"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git rev-parse in {}",
        git_dir.display()
    );
    let commit = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let meta = meta_of(&src, &commit);

    let env = PullEnv::new(&olah.url, t.path());
    let s = env.pull_ok(repo, &["--part-size", "1MiB", "--connections", "4"]);
    assert_all_verified(&s, &meta);
    assert!(s.whole_streams >= 1, "olah ignores Range: {s:#?}");
    assert_cache(&env.repo_dir(repo), &src, &meta);
    let snap = env.repo_dir(repo).join("snapshots").join(&commit);
    assert_eq!(offline_snapshot(&env, repo), snap.display().to_string());
    drop(olah);
}

/// Files with the same contents (empty `__init__.py`s, a copied shard)
/// share one blob: it is downloaded once and every path links to it.
#[test]
fn identical_files_share_one_blob() {
    let t = tempdir("pull-dups");
    let repos = t.path().join("repos");
    let src = gen_repo(
        &repos,
        "acme/dups",
        16,
        &[("config.json", 100), ("model.safetensors", 2 * MIB + 99)],
    );
    fs::create_dir_all(src.join("a")).unwrap();
    fs::create_dir_all(src.join("b/c")).unwrap();
    fs::write(src.join("a/__init__.py"), b"").unwrap();
    fs::write(src.join("b/c/__init__.py"), b"").unwrap();
    fs::copy(
        src.join("model.safetensors"),
        src.join("b/copy.safetensors"),
    )
    .unwrap();
    let server = HubServer::start(&repos, &[]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    let meta = server.repo("acme/dups");
    assert_eq!(
        meta.files["a/__init__.py"].etag,
        meta.files["b/c/__init__.py"].etag
    );

    let s = env.pull_ok("acme/dups", &[]);
    assert_all_verified(&s, &meta);
    let dup_bytes = meta.files["b/copy.safetensors"].size;
    assert_eq!(
        s.bytes_downloaded,
        meta.total() - dup_bytes,
        "each blob once: {s:#?}"
    );
    assert_cache(&env.repo_dir("acme/dups"), &src, &meta);
    assert!(
        server.stats()["cdn_get"].as_u64() == Some(1),
        "one CDN GET for the shared shard"
    );

    // In a local dir each path is its own file.
    let local = t.path().join("local");
    let s = env.pull_ok("acme/dups", &["--local-dir", local.to_str().unwrap()]);
    assert_all_verified(&s, &meta);
    for path in meta.files.keys() {
        same_bytes(&src.join(path), &local.join(path)).unwrap();
    }
}

/// The small files (config, tokenizer, index) come first, whatever their
/// names: in path order `model.safetensors.index.json` and `tokenizer*`
/// sort after the shards, and an engine started while the weights land
/// (`[launch] stream_weights`) needs them before any shard.
#[test]
fn the_small_files_are_fetched_before_the_weights() {
    let t = tempdir("pull-order");
    let repos = t.path().join("repos");
    gen_repo(
        &repos,
        "acme/order",
        17,
        &[
            ("config.json", 300),
            ("model-00001-of-00002.safetensors", MIB + 5),
            ("model-00002-of-00002.safetensors", MIB + 7),
            ("model.safetensors.index.json", 400),
            ("tokenizer.json", 50_000),
            ("tokenizer_config.json", 200),
        ],
    );
    let server = HubServer::start(&repos, &[]);
    let env = PullEnv::new(&server.endpoint(), t.path());
    env.pull_ok("acme/order", &["--connections", "1"]);
    let order: Vec<String> = server.stats()["resolve_order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_str()
                .unwrap()
                .trim_start_matches("acme/order/")
                .to_string()
        })
        .collect();
    assert_eq!(order.len(), 6, "{order:?}");
    let first_weight = order
        .iter()
        .position(|p| p.ends_with(".safetensors"))
        .unwrap();
    assert_eq!(
        first_weight, 4,
        "every small file before the weights: {order:?}"
    );
}

/// A pinned pull (what `xfer-launch deploy` hands its sync: the commit it
/// read for a branch) lists and fetches the pinned commit, whatever the
/// branch names when it runs, and writes the branch's ref to that commit;
/// a pin the Hub does not serve fails naming it, writing no ref.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_pull_fetches_its_commit_and_writes_the_branchs_ref_to_it() {
    let t = tempdir("pull-pinned");
    let repos = t.path().join("repos");
    let _src = small_repo(&repos, "acme/tiny", 12);
    let server = HubServer::start(&repos, &[]);
    let commit = server.repo("acme/tiny").commit;
    let env = xfer::hub::env::HubEnv {
        endpoint: server.endpoint(),
        token: None,
        cache_root: t.path().join("cache"),
    };
    // `v1` is a branch this Hub does not know (any more): only the pin
    // can have listed the files.
    let opts = |pin: &str| xfer::hub::pull::PullOptions {
        repo: xfer_proto::repo::RepoRef::parse("acme/tiny@v1", xfer_proto::repo::RepoType::Model)
            .unwrap(),
        include: Vec::new(),
        exclude: Vec::new(),
        local_dir: None,
        connections: 4,
        part_size: 1 << 20,
        chunk_size: None,
        intake: Default::default(),
        before_change: None,
        stats: None,
        pin: Some(pin.to_string()),
    };
    let progress = xfer::util::progress::Progress::new(false);
    let repo_dir = t.path().join("cache/models--acme--tiny");
    let unknown = "f".repeat(40);
    let e = xfer::hub::pull::pull(&opts(&unknown), &env, &progress, None, None)
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains(&unknown), "{e:#}");
    assert!(!repo_dir.join("refs/v1").exists());

    let (s, _) = xfer::hub::pull::pull(&opts(&commit), &env, &progress, None, None)
        .await
        .unwrap();
    assert!(s.verification.all_verified, "{s:#?}");
    assert_eq!(s.commit, commit);
    assert_eq!(
        fs::read_to_string(repo_dir.join("refs/v1")).unwrap(),
        commit
    );
    assert!(repo_dir.join("snapshots").join(&commit).is_dir());
}
