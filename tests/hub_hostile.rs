//! `xfer pull` against a hostile Hub (`tests/hub_server.py`): a listing
//! naming a file with a newline and an escape sequence, and a listing
//! that pages forever. Each pull fails with one line that says why,
//! creates nothing, and (the endless one) stays within bounded memory.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::hub::*;
use common::*;

/// A repo holding a file named with a newline and an ESC colour sequence:
/// the Hub lists it as JSON `a\nb\u001b[31mRED`. The pull is refused with
/// the name escaped, and nothing lands in the cache.
#[test]
fn a_hub_path_with_control_characters_is_refused_and_nothing_is_created() {
    let t = tempdir("hub-ctl-path");
    let repos = t.path().join("repos");
    gen_repo(&repos, "acme/evil", 7, &[("config.json", 100)]);
    std::fs::write(repos.join("acme/evil/a\nb\u{1b}[31mRED"), b"red").unwrap();
    let server = HubServer::start(&repos, &[]);
    let env = PullEnv::new(&server.endpoint(), t.path());

    let r = env.pull("acme/evil", &[]);
    let line = assert_error(
        &r,
        &["unsafe path", r"`a\nb\u{1b}[31mRED`", "control character"],
    );
    eprintln!("{line}");
    assert!(
        !r.stderr.contains('\u{1b}'),
        "a raw ESC reached the terminal: {:?}",
        r.stderr
    );
    let made: Vec<String> = if env.cache.exists() {
        walk(&env.cache)
            .into_iter()
            .filter(|(_, n)| !matches!(n, Node::Dir))
            .map(|(p, _)| p)
            .collect()
    } else {
        Vec::new()
    };
    assert!(made.is_empty(), "the refused pull left files: {made:?}");
    let stats = server.stats();
    assert_eq!(stats["resolve_get"], 0, "{stats:#}");
    assert_eq!(stats["cdn_get"], 0, "{stats:#}");
}

/// A Hub whose listing has a `Link: rel="next"` on every page, 50,000
/// made-up files a page: the pull stops at the listing's bound with one
/// line naming the repo and the bound, downloads nothing, and its peak
/// RSS (GNU time's %M) stays far below what the pages would take if kept.
#[test]
fn an_endless_listing_stops_at_its_bound_in_bounded_memory() {
    let t = tempdir("hub-endless");
    let repos = t.path().join("repos");
    gen_repo(&repos, "acme/endless", 8, &[("config.json", 100)]);
    let server = HubServer::start(&repos, &["--endless-tree", "50000"]);
    let env = PullEnv::new(&server.endpoint(), t.path());

    let rss_file = t.path().join("rss");
    let mut cmd = Command::new("/usr/bin/time");
    cmd.arg("-f").arg("%M").arg("-o").arg(&rss_file).arg(bin());
    env.apply(&mut cmd);
    cmd.env_remove("RUST_LOG")
        .env_remove("XFER_KEY")
        .args(["pull", "acme/endless", "--json"]);
    let r = run(&mut cmd, Duration::from_secs(300));
    let line = assert_error(
        &r,
        &["acme/endless", "more than 200000 entries", "HF_ENDPOINT"],
    );
    eprintln!("{line}");
    let stats = server.stats();
    let pages = stats["api_tree"].as_u64().unwrap();
    assert!(
        (4..=6).contains(&pages),
        "the listing stops once past 200,000 entries (4 or 5 pages of 50,000): {stats:#}"
    );
    assert_eq!(stats["resolve_get"], 0, "{stats:#}");
    let text = std::fs::read_to_string(&rss_file).unwrap();
    let kib: u64 = text
        .lines()
        .rev()
        .filter_map(|l| l.trim().parse().ok())
        .next()
        .unwrap_or_else(|| panic!("no peak RSS from /usr/bin/time: {text:?}"));
    eprintln!("peak RSS of the pull: {} MiB", kib >> 10);
    assert!(
        kib < 300 << 10,
        "the pull's peak RSS was {} MiB; the listing should be bounded far below 300 MiB",
        kib >> 10
    );
}
