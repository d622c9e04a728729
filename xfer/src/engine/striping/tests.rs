//! The striped intake's planner, event by event, and in a seeded,
//! virtual-time simulation of a download that drives it as
//! `hub::download` does (no clock, no socket).

use std::collections::{BTreeMap, HashSet};

use rand::{Rng, SeedableRng};

use super::*;

const MB: u64 = 1 << 20;

#[test]
fn parts_go_out_in_file_order_and_a_part_put_back_goes_first() {
    let mut p = Planner::new(2, [(0, 0), (0, 1), (1, 0)], 1);
    assert_eq!(p.next_local(), Some((0, 0)));
    assert_eq!(p.next_remote(0, |_| true), Some((0, 1)));
    p.put_back((0, 1));
    assert_eq!(p.next_local(), Some((0, 1)));
    assert_eq!(p.next_local(), Some((1, 0)));
    assert_eq!(p.next_local(), None);
    p.redo(1, 2);
    assert_eq!(p.queued(), 2);
    assert_eq!(p.next_local(), Some((1, 0)));
}

/// An intake node skips parts of a file that is not ready for it (its URL
/// unresolved, or its origin ignores Range), of a file gone local-only,
/// and parts cut from it; this node's connections take any of them.
#[test]
fn an_intake_node_takes_only_parts_it_may() {
    let mut p = Planner::new(3, [(0, 0), (1, 0), (1, 1), (2, 0)], 2);
    assert_eq!(p.next_remote(0, |f| f != 0), Some((1, 0)));
    p.cut((1, 0), 0);
    p.put_back((1, 0));
    p.local_only(2);
    assert_eq!(p.next_remote(0, |f| f != 0), Some((1, 1)));
    assert_eq!(p.next_remote(0, |f| f != 0), None, "{p:?}");
    assert_eq!(p.next_remote(1, |f| f != 0), Some((1, 0)), "another node");
    assert_eq!(p.next_local(), Some((0, 0)));
    assert_eq!(p.next_local(), Some((2, 0)));
}

#[test]
fn three_failures_in_a_row_retire_an_intake_node_and_a_success_forgives() {
    let mut p = Planner::new(1, [(0, 0)], 1);
    assert_eq!(p.answered(0, Answer::Failed, "x"), Next::Backoff(1));
    assert_eq!(p.answered(0, Answer::Failed, "x"), Next::Backoff(2));
    assert_eq!(p.answered(0, Answer::Fetched, ""), Next::Carry);
    assert_eq!(p.answered(0, Answer::Failed, "x"), Next::Backoff(1));
    // A backed "slow down" is no strike and forgives none.
    assert_eq!(
        p.answered(0, Answer::Busy { backed: true }, "b"),
        Next::Carry
    );
    assert_eq!(p.answered(0, Answer::Failed, "x"), Next::Backoff(2));
    assert!(p.takes_work(0));
    assert_eq!(
        p.answered(0, Answer::Failed, "refused"),
        Next::Retired("refused".into())
    );
    assert!(!p.takes_work(0));
    assert_eq!(p.retired(0), Some("refused"));
    assert_eq!(p.next_remote(0, |_| true), None, "a retired node got work");
    assert_eq!(p.next_local(), Some((0, 0)));
}

/// Issue 53: a node that says "slow down" alone three times in its last
/// six answers retires, whatever successes it mixes in; one the hold
/// believed is no strike.
#[test]
fn a_node_that_mostly_says_slow_down_alone_retires() {
    let mut p = Planner::new(1, [], 1);
    let alone = Answer::Busy { backed: false };
    assert_eq!(p.answered(0, alone, "b"), Next::WaitAlone);
    for _ in 0..4 {
        assert_eq!(p.answered(0, Answer::Fetched, ""), Next::Carry);
    }
    assert_eq!(p.answered(0, alone, "b"), Next::WaitAlone);
    // The first lone one has left the window of six.
    assert_eq!(p.answered(0, Answer::Fetched, ""), Next::Carry);
    assert_eq!(p.answered(0, alone, "b"), Next::WaitAlone);
    assert_eq!(
        p.answered(0, alone, "b"),
        Next::Retired("b (3 of its last 6 answers, heard by no other downloader)".into())
    );
    assert_eq!(
        p.retired(0),
        Some("b (3 of its last 6 answers, heard by no other downloader)")
    );
}

#[test]
fn a_named_node_gets_no_more_work() {
    let mut p = Planner::new(1, [(0, 0)], 2);
    assert!(p.blame(1));
    assert!(!p.blame(1), "named twice");
    assert!(p.blamed(1) && !p.blamed(0));
    assert_eq!(p.next_remote(1, |_| true), None);
    assert_eq!(p.next_remote(0, |_| true), Some((0, 0)));
}

/// Work stealing: a downloader whose node has room on its link cuts
/// another node's slow range; one whose node still has a quarter or
/// more of its connections busy cuts nothing (its link is full), and no
/// downloader cuts its own node's range (the rest would run on the
/// same link).
#[test]
fn only_a_node_with_room_on_its_link_cuts_another_nodes_slow_range() {
    let slow = |node| InFlight {
        node,
        secs: 2.0,
        got: MB,
        to_go: 8 * MB,
    };
    let brisk = InFlight {
        node: 2,
        secs: 2.0,
        got: 6 * MB,
        to_go: 8 * MB,
    };
    // The thief did its last part at 2 MB/s; the slow range at 0.5.
    let thief = |busy| Thief {
        node: 0,
        rate: 2.0 * MB as f64,
        busy,
        connections: 16,
    };
    let flights = [brisk, slow(1)];
    assert_eq!(victim(&thief(4), &flights), Some(1), "4 of 16 busy");
    assert_eq!(victim(&thief(5), &flights), None, "5 of 16 busy");
    assert_eq!(victim(&thief(0), &flights[..1]), None, "not slow");
    let own = Thief {
        node: 1,
        ..thief(0)
    };
    assert_eq!(victim(&own, &[slow(1)]), None, "its own node's range");
    assert_eq!(
        victim(
            &Thief {
                rate: 0.0,
                ..thief(0)
            },
            &flights
        ),
        None
    );
}

#[test]
fn striped_parts_are_small_whole_chunks_and_a_lone_node_keeps_its_size() {
    let big = 16 * MB;
    assert_eq!(part_size(big, 16, 0, 8, 100 << 30, Some(4 * MB)), big);
    // 16 + 3 x 8 workers, four parts each, of 400 MiB: 2.5 MiB, cut to
    // whole 1 MiB chunks.
    assert_eq!(part_size(big, 16, 3, 8, 400 * MB, Some(MB)), 2 * MB);
    assert_eq!(part_size(big, 16, 3, 8, 400 * MB, None), 400 * MB / 160);
    assert_eq!(part_size(big, 16, 3, 8, MB, None), MIN_STRIPED_PART);
    assert_eq!(part_size(big, 16, 3, 8, 100 << 30, None), big);
}

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

#[test]
fn this_nodes_slow_down_holds_everyone_and_only_ever_later() {
    let mut h = HoldRule::default();
    assert_eq!(h.until(s(0)), None);
    assert_eq!(
        h.heard(Heard::ThisNode, s(3), s(0)),
        Verdict::HoldAll { newly: true }
    );
    assert_eq!(
        h.heard(Heard::ThisNode, s(1), s(0)),
        Verdict::HoldAll { newly: false },
        "a shorter wait shortened the hold"
    );
    assert_eq!(h.until(s(2)), Some(s(3)));
    assert_eq!(
        h.heard(Heard::ThisNode, s(4), s(2)),
        Verdict::HoldAll { newly: true }
    );
    assert_eq!(h.until(s(5)), Some(s(6)));
    assert_eq!(h.until(s(6)), None);
    assert_eq!(h.held(), s(6));
}

/// Issue 53: an intake node alone saying "slow down" holds only itself;
/// backed by another downloader within the window, everyone; and the
/// cluster is never held longer than the cap in all.
#[test]
fn an_intake_nodes_word_alone_holds_only_it_and_holds_are_bounded() {
    let mut h = HoldRule::default();
    let w = s(20);
    assert_eq!(h.heard(Heard::Intake(0), w, s(0)), Verdict::OnlyIt);
    assert_eq!(h.heard(Heard::Intake(0), w, s(1)), Verdict::OnlyIt);
    assert_eq!(h.until(s(1)), None, "a lone intake node held the cluster");
    assert_eq!(
        h.heard(Heard::Intake(1), w, s(2)),
        Verdict::HoldAll { newly: true }
    );
    assert_eq!(h.until(s(2)), Some(s(22)));
    let later = s(2) + CORROBORATE + w + s(1);
    assert_eq!(h.heard(Heard::Intake(0), w, later), Verdict::OnlyIt);
    let mut now = later;
    let spent = (0..100).any(|_| {
        now += s(60);
        h.heard(Heard::ThisNode, s(60), now) == Verdict::Spent
    });
    assert!(spent, "the holds never ran out");
    assert_eq!(h.held(), MAX_TOTAL_HOLD);
}

/// An intake node in the simulation.
#[derive(Clone, Debug)]
struct Node {
    /// Bytes/s per connection.
    rate: f64,
    /// From then on every range it is asked fails (killed).
    dies_at: Option<f64>,
    /// It answers every range "slow down" (its route throttled, or a liar).
    busy: bool,
}

/// One connection of a downloader: node 0 is this node, `r + 1` intake
/// node `r`.
#[derive(Clone, Debug, Default)]
struct Conn {
    node: usize,
    part: Option<Part>,
    began: f64,
    got: u64,
    cut: bool,
    /// Its pace over its last part, bytes/s.
    rate: f64,
    /// Waiting alone (a lone "slow down") until then.
    until: f64,
    stopped: bool,
}

#[derive(Debug)]
struct Run {
    seconds: f64,
    /// Bytes each downloader (0 this node, `r + 1` intake node `r`) wrote.
    bytes: Vec<u64>,
    retired: Vec<bool>,
    stuck: bool,
}

/// A download of `parts` parts of `part` bytes, one file per 4 parts, by
/// `local` connections of this node at `local_rate` each and `conns`
/// connections per intake node, driving [`Planner`], [`victim`] and
/// [`HoldRule`] as `hub::download` does, in steps of 10 ms; each step checks
/// that no part is held twice, that no retired or named node holds a new
/// part, and that no part goes back to the node it was cut from.
fn simulate(
    nodes: &[Node],
    local: usize,
    local_rate: f64,
    conns: usize,
    parts: usize,
    part: u64,
) -> Run {
    const DT: f64 = 0.01;
    let files = parts.div_ceil(4);
    let all: Vec<Part> = (0..parts).map(|k| (k / 4, k % 4)).collect();
    let mut plan = Planner::new(files, all.clone(), nodes.len());
    let mut hold = HoldRule::default();
    let mut done: BTreeMap<Part, u64> = all.iter().map(|p| (*p, 0)).collect();
    let mut cs: Vec<Conn> = (0..local)
        .map(|_| Conn::default())
        .chain((0..nodes.len()).flat_map(|r| {
            (0..conns).map(move |_| Conn {
                node: r + 1,
                ..Conn::default()
            })
        }))
        .collect();
    let mut bytes = vec![0u64; nodes.len() + 1];
    let mut t = 0.0f64;
    let mut steps = 0u64;
    let now = |t: f64| Duration::from_secs_f64(t);
    while done.values().any(|d| *d < part) {
        steps += 1;
        if steps > 2_000_000 {
            return Run {
                seconds: t,
                bytes,
                retired: (0..nodes.len()).map(|r| !plan.takes_work(r)).collect(),
                stuck: true,
            };
        }
        t += DT;
        // Idle connections take a part, or steal.
        for c in 0..cs.len() {
            let conn = &cs[c];
            if conn.part.is_some() || conn.stopped || t < conn.until {
                continue;
            }
            if hold.until(now(t)).is_some() {
                continue;
            }
            let node = conn.node;
            let picked = match node {
                THIS_NODE => plan.next_local(),
                n => {
                    if !plan.takes_work(n - 1) {
                        cs[c].stopped = true;
                        continue;
                    }
                    plan.next_remote(n - 1, |_| true)
                }
            };
            match picked {
                Some(p) => {
                    assert!(
                        cs.iter().all(|o| o.part != Some(p)),
                        "part {p:?} handed out twice at {t:.2} s"
                    );
                    assert!(done[&p] < part, "a done part {p:?} handed out");
                    let cs = &mut cs[c];
                    (cs.part, cs.began, cs.got, cs.cut) = (Some(p), t, 0, false);
                }
                None => {
                    let thief = Thief {
                        node,
                        rate: cs[c].rate,
                        busy: cs
                            .iter()
                            .filter(|o| o.node == node && o.part.is_some())
                            .count(),
                        connections: if node == THIS_NODE { local } else { conns },
                    };
                    let open: Vec<usize> = (0..cs.len())
                        .filter(|&o| cs[o].node != THIS_NODE && cs[o].part.is_some() && !cs[o].cut)
                        .collect();
                    let seen: Vec<InFlight> = open
                        .iter()
                        .map(|&o| InFlight {
                            node: cs[o].node,
                            secs: t - cs[o].began,
                            got: cs[o].got,
                            to_go: part,
                        })
                        .collect();
                    if let Some(v) = victim(&thief, &seen) {
                        cs[open[v]].cut = true;
                    }
                }
            }
        }
        // Connections fetch.
        for conn in cs.iter_mut() {
            let Some(p) = conn.part else { continue };
            let node = conn.node;
            if node == THIS_NODE {
                let n = ((local_rate * DT) as u64).min(part - done[&p]);
                *done.get_mut(&p).unwrap() += n;
                bytes[0] += n;
                conn.got += n;
                if done[&p] == part {
                    conn.rate = conn.got as f64 / (t - conn.began).max(DT);
                    conn.part = None;
                }
                continue;
            }
            let r = node - 1;
            let n = &nodes[r];
            let dead = n.dies_at.is_some_and(|d| t >= d);
            let answer = if n.busy {
                let wait = Duration::from_secs(2);
                let backed = hold.heard(Heard::Intake(r), wait, now(t)) != Verdict::OnlyIt;
                Some((Answer::Busy { backed }, wait))
            } else if dead {
                Some((Answer::Failed, Duration::ZERO))
            } else {
                let k = ((n.rate * DT) as u64).min(part - done[&p]);
                *done.get_mut(&p).unwrap() += k;
                bytes[node] += k;
                conn.got += k;
                (done[&p] == part || conn.cut).then_some((Answer::Fetched, Duration::ZERO))
            };
            let Some((answer, wait)) = answer else {
                continue;
            };
            conn.rate = conn.got as f64 / (t - conn.began).max(DT);
            conn.part = None;
            if conn.cut {
                plan.cut(p, r);
            }
            if done[&p] < part {
                plan.put_back(p);
            }
            match plan.answered(r, answer, "said so") {
                Next::WaitAlone => conn.until = t + wait.as_secs_f64(),
                Next::Retired(_) => conn.stopped = true,
                Next::Carry | Next::Backoff(_) => {}
            }
        }
        // No part cut from a node is held by it.
        for conn in &cs {
            if let (Some(p), n) = (conn.part, conn.node) {
                assert!(
                    n == THIS_NODE || plan.cut_from.get(&p) != Some(&(n - 1)),
                    "part {p:?} went back to node {n}, which it was cut from"
                );
            }
        }
    }
    Run {
        seconds: t,
        bytes,
        retired: (0..nodes.len()).map(|r| !plan.takes_work(r)).collect(),
        stuck: false,
    }
}

fn honest(rate: f64) -> Node {
    Node {
        rate,
        dies_at: None,
        busy: false,
    }
}

/// Four links of 10 MB/s pull about four times as fast as one, and a
/// node a hundred times slower than the rest does not set the pace: its
/// ranges are cut for the others.
#[test]
fn n_links_pull_about_n_times_as_fast_and_a_slow_one_is_stolen_from() {
    let rate = 10.0e6 / 4.0;
    let alone = simulate(&[], 4, rate, 4, 64, 4 * MB);
    let four = simulate(
        &[honest(rate), honest(rate), honest(rate)],
        4,
        rate,
        4,
        64,
        4 * MB,
    );
    assert!(!alone.stuck && !four.stuck);
    assert!(
        four.seconds < alone.seconds / 3.0,
        "one link {:.1} s, four {:.1} s",
        alone.seconds,
        four.seconds
    );
    let slow = simulate(
        &[honest(rate), honest(rate / 100.0)],
        4,
        rate,
        4,
        64,
        4 * MB,
    );
    // Alone, the slow node's one range would take 168 s.
    assert!(!slow.stuck && slow.seconds < 60.0, "{slow:?}");
    assert!(slow.retired.iter().all(|r| !r), "{slow:?}");
}

#[test]
fn a_killed_node_and_a_node_that_says_slow_down_alone_retire_and_the_rest_finish() {
    let rate = 2.5e6;
    let nodes = [
        honest(rate),
        Node {
            dies_at: Some(3.0),
            ..honest(rate)
        },
        Node {
            busy: true,
            ..honest(rate)
        },
    ];
    let run = simulate(&nodes, 4, rate, 4, 64, 4 * MB);
    assert!(!run.stuck, "{run:?}");
    assert_eq!(run.retired, [false, true, true], "{run:?}");
    assert_eq!(run.bytes[3], 0, "the busy node wrote bytes");
    assert_eq!(run.bytes.iter().sum::<u64>(), 64 * 4 * MB, "{run:?}");
}

/// Random clusters, seeded: every download ends with every byte written
/// once, honest nodes are never retired, and (checked each step) no part
/// is held twice or goes back to the node it was cut from.
#[test]
fn random_runs_keep_the_invariants() {
    for seed in 0..60u64 {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let nodes: Vec<Node> = (0..rng.gen_range(0..6))
            .map(|_| Node {
                rate: 2.5e6 * rng.gen_range(0.01..3.0),
                dies_at: rng.gen_bool(0.2).then(|| rng.gen_range(0.0..10.0)),
                busy: rng.gen_bool(0.15),
            })
            .collect();
        let local = rng.gen_range(1..8);
        let conns = rng.gen_range(1..5);
        let parts = rng.gen_range(1..80);
        let run = simulate(&nodes, local, 2.5e6, conns, parts, MB);
        let why = format!("seed {seed}: {nodes:?}, {run:?}");
        assert!(!run.stuck, "{why}");
        assert_eq!(run.bytes.iter().sum::<u64>(), parts as u64 * MB, "{why}");
        for (r, n) in nodes.iter().enumerate() {
            if !n.busy && n.dies_at.is_none() {
                assert!(!run.retired[r], "honest node {r} retired: {why}");
            }
            if n.busy {
                assert_eq!(run.bytes[r + 1], 0, "{why}");
            }
        }
    }
}

#[test]
fn a_cut_part_is_remembered_per_node() {
    let mut p = Planner::new(1, [(0, 0)], 2);
    let got = p.next_remote(0, |_| true);
    assert_eq!(got, Some((0, 0)));
    p.cut((0, 0), 0);
    p.put_back((0, 0));
    let seen: HashSet<_> = [p.next_remote(0, |_| true), p.next_remote(1, |_| true)].into();
    assert_eq!(seen, HashSet::from([None, Some((0, 0))]));
}
