//! The node's store over months (issue 57), with a real agent on loopback
//! whose root has a 10 MiB budget (`serve --max-bytes 10MiB`) and models
//! of 3 MiB each:
//! - `xfer gc --need` plans and evicts least recently used first, never a
//!   pinned model nor one whose path a live run's rank uses;
//! - when evicting everything that may go cannot make the room, it evicts
//!   nothing and fails in one line naming what holds the space;
//! - once the run stops and the pin is lifted, the same ask evicts in
//!   order of last use (the pin counts as a use).

use crate::common;

use std::path::Path;
use std::time::Duration;

use xfer::config::auth::Credential;
use xfer_proto::launch::{LaunchReply, LaunchRequest, ProcSpec, RankSpec};

use common::cluster::*;
use common::*;

const MIB: u64 = 1 << 20;

fn push(c: &Cluster, src: &Path, name: &str) {
    run(
        c.cmd("push", &["--name", name]).arg(src),
        Duration::from_secs(60),
    )
    .assert_ok("xfer push");
}

fn gc(c: &Cluster, args: &[&str]) -> Run {
    run(&mut c.cmd("gc", args), Duration::from_secs(60))
}

fn held(c: &Cluster) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(c.root("n1"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names
}

#[test]
fn gc_evicts_the_least_recently_used_never_a_pinned_or_running_model() {
    let c = Cluster::start(
        "gc",
        201,
        &["n1"],
        &["--max-bytes", "10MiB", "--allow-launch"],
    );
    let src = c.dir.path().join("src");
    for (i, name) in ["m1", "m2", "m3"].iter().enumerate() {
        gen_model(&src.join(name), 3 * MIB, 570 + i as u64);
        push(&c, &src.join(name), name);
    }
    let r = run(&mut c.cmd("pin", &["m1"]), Duration::from_secs(30));
    r.assert_ok("xfer pin");
    assert!(r.stdout.contains("n1: m1 pinned"), "{}", r.stdout);
    // A rank whose command reads m2 (a stand-in engine: it sleeps).
    let cred = Credential::load(&c.key).unwrap();
    let agent = c.member("n1").agent.as_ref().unwrap();
    let m2 = c.root("n1").join("m2");
    let spec = RankSpec {
        run: "gc-run".into(),
        node: "n1".parse().unwrap(),
        rank: 0,
        env: Default::default(),
        procs: vec![ProcSpec {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "exec sleep 600".into(),
                m2.display().to_string(),
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
    };
    match ask_launch(
        &cred,
        "n1",
        agent,
        &LaunchRequest::StartRank(Box::new(spec)),
    ) {
        LaunchReply::Runs(_) => {}
        other => panic!("the rank did not start: {other:?}"),
    }

    // `xfer ls` shows the budget, and each model's size, pin and hold.
    let ls = run(&mut c.cmd("ls", &[]), Duration::from_secs(30));
    ls.assert_ok("xfer ls");
    assert!(
        ls.stdout.contains("n1: 9.0 MiB held of a 10.0 MiB budget"),
        "{}",
        ls.stdout
    );
    let line = |m: &str| {
        ls.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{m} ")))
            .unwrap_or_else(|| panic!("no {m} in {}", ls.stdout))
            .to_string()
    };
    assert!(line("m1").ends_with("(pinned)"), "{}", ls.stdout);
    assert!(
        line("m2").ends_with("(in use by run gc-run)"),
        "{}",
        ls.stdout
    );
    assert!(line("m3").contains("3.0 MiB"), "{}", ls.stdout);

    // Room for 3 MiB more: only m3 may go.
    let plan = gc(&c, &["--need", "3MiB", "--dry-run"]);
    plan.assert_ok("xfer gc --dry-run");
    assert!(
        plan.stdout
            .contains("n1: would evict m3 (3.0 MiB): room asked for: least recently used"),
        "{}",
        plan.stdout
    );
    assert_eq!(held(&c), ["m1", "m2", "m3"], "a dry run evicted");
    gc(&c, &["--need", "3MiB"]).assert_ok("xfer gc");
    assert_eq!(held(&c), ["m1", "m2"]);
    gen_model(&src.join("m4"), 3 * MIB, 574);
    push(&c, &src.join("m4"), "m4");

    // Room for 6 MiB: m4 alone is not enough; nothing goes, and the one
    // line names the run's model and the pinned one.
    let refused = gc(&c, &["--need", "6MiB"]);
    assert!(!refused.success(), "{}", refused.stdout);
    let line = refused
        .stdout
        .lines()
        .find(|l| l.starts_with("n1: FAILED"))
        .unwrap_or_else(|| panic!("{}{}", refused.stdout, refused.stderr))
        .to_string();
    assert!(
        line.contains("m2 (3.0 MiB, in use by run gc-run)"),
        "{line}"
    );
    assert!(line.contains("m1 (3.0 MiB, pinned)"), "{line}");
    assert_eq!(held(&c), ["m1", "m2", "m4"], "a refused gc evicted");

    // The run stops and m1 is unpinned (a use, now): m2, the least
    // recently used, goes first, then m4; m1 stays.
    match ask_launch(
        &cred,
        "n1",
        agent,
        &LaunchRequest::StopRun {
            run: Some("gc-run".into()),
            grace_ms: 1_000,
            reason: "test over".into(),
        },
    ) {
        LaunchReply::Runs(_) => {}
        other => panic!("stop: {other:?}"),
    }
    run(&mut c.cmd("unpin", &["m1"]), Duration::from_secs(30)).assert_ok("xfer unpin");
    let done = gc(&c, &["--need", "6MiB", "--json"]);
    done.assert_ok("xfer gc --need 6MiB");
    let v: serde_json::Value = done.json();
    let evicted: Vec<&str> = v[0]["report"]["evicted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[0].as_str().unwrap())
        .collect();
    assert_eq!(evicted, ["m2", "m4"], "{v}");
    assert_eq!(held(&c), ["m1"]);
    assert!(c
        .member("n1")
        .agent
        .as_ref()
        .unwrap()
        .log()
        .contains("evicted m2"));
}

/// A push that does not fit under the budget: without watermarks it is
/// refused in one line saying what `xfer gc` would evict; with them
/// (`--evict-above`) the agent evicts the least recently used model that
/// is not pinned and takes the push; when only pinned models are left,
/// it refuses naming them, and nothing is lost.
#[test]
fn a_push_over_the_budget_evicts_with_watermarks_and_names_what_holds_the_space() {
    let plain = Cluster::start("budget-plain", 202, &["n1"], &["--max-bytes", "10MiB"]);
    let src = plain.dir.path().join("src");
    for (i, name) in ["m1", "m2", "m3", "m4"].iter().enumerate() {
        gen_model(&src.join(name), 3 * MIB, 580 + i as u64);
    }
    for name in ["m1", "m2", "m3"] {
        push(&plain, &src.join(name), name);
    }
    let r = run(
        plain.cmd("push", &["--name", "m4"]).arg(src.join("m4")),
        Duration::from_secs(60),
    );
    assert!(!r.success(), "{}", r.stdout);
    let all = format!("{}{}", r.stdout, r.stderr);
    assert!(
        all.contains("m4 needs 3.0 MiB and this node's budget of 10.0 MiB holds 9.0 MiB")
            && all.contains("would evict m1 (least recently used first)"),
        "{all}"
    );
    assert_eq!(held(&plain), ["m1", "m2", "m3"]);

    let c = Cluster::start(
        "budget-evict",
        203,
        &["n1"],
        &["--max-bytes", "10MiB", "--evict-above", "100%"],
    );
    for name in ["m1", "m2", "m3"] {
        push(&c, &src.join(name), name);
    }
    run(&mut c.cmd("pin", &["m1"]), Duration::from_secs(30)).assert_ok("xfer pin m1");
    push(&c, &src.join("m4"), "m4");
    assert_eq!(held(&c), ["m1", "m3", "m4"], "{}", c.logs());
    let log = c.member("n1").agent.as_ref().unwrap().log();
    assert!(log.contains("evicted m2 (3.0 MiB): room for m4"), "{log}");
    for name in ["m3", "m4"] {
        run(&mut c.cmd("pin", &[name]), Duration::from_secs(30)).assert_ok("xfer pin");
    }
    gen_model(&src.join("m5"), 3 * MIB, 585);
    let r = run(
        c.cmd("push", &["--name", "m5"]).arg(src.join("m5")),
        Duration::from_secs(60),
    );
    assert!(!r.success(), "{}", r.stdout);
    let all = format!("{}{}", r.stdout, r.stderr);
    assert!(
        all.contains("cannot make room") && all.contains("m1 (3.0 MiB, pinned)"),
        "{all}"
    );
    assert_eq!(held(&c), ["m1", "m3", "m4"]);
}
