//! The striped intake's planner, event by event and in simulation.

use rand::{Rng, SeedableRng};

use super::sim::{self, Node, Setup};
use super::*;

const MIB: u64 = 1 << 20;
/// 100 Mbit/s.
const I: f64 = 12.5e6;

fn h(c: u64) -> Hash {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&c.to_le_bytes());
    Hash(b)
}

fn fetches(a: &[Action]) -> Vec<(Downloader, Range<u64>)> {
    a.iter()
        .filter_map(|a| match a {
            Action::Fetch { by, chunks } => Some((*by, chunks.clone())),
            _ => None,
        })
        .collect()
}

/// A 512 MiB repo of 4 MiB chunks in 4 files, to `nodes`.
fn setup(nodes: Vec<Node>) -> Setup {
    Setup {
        nodes,
        shared_uplink: None,
        chunk: 4 * MIB,
        files: vec![32, 32, 32, 32],
        cfg: StripeConfig::default(),
        throttle: None,
        verifier_rate: I,
        detect_s: 1.0,
        request_s: 0.05,
    }
}

fn honest(rate: f64) -> Node {
    Node {
        rate,
        dies_at: None,
        lies: false,
    }
}

fn size(s: &Setup) -> u64 {
    s.files.iter().sum::<u64>() * s.chunk
}

#[test]
fn work_is_handed_out_on_demand_in_spans_and_the_tail_is_stolen() {
    let cfg = StripeConfig {
        span_chunks: 4,
        ..StripeConfig::default()
    };
    let mut st = Stripes::new(cfg, &[6, 3]);
    assert_eq!(fetches(&st.handle(Input::Idle(1))), vec![(1, 0..4)]);
    // The rest of file 0, then file 1: a span never crosses files.
    assert_eq!(fetches(&st.handle(Input::Idle(2))), vec![(2, 4..6)]);
    assert_eq!(fetches(&st.handle(Input::Idle(3))), vec![(3, 6..9)]);
    let done = st.handle(Input::Fetched {
        by: 2,
        chunks: 4..6,
        hashes: vec![h(4), h(5)],
    });
    assert!(done.is_empty(), "{done:?}");
    // Nothing queued: 2 takes the back half of the largest rest (1's
    // 0..4 or 3's 6..9; 1's is larger), and 1 is told where to stop.
    let a = st.handle(Input::Idle(2));
    assert_eq!(
        a,
        vec![
            Action::Cut { by: 1, at: 2 },
            Action::Fetch {
                by: 2,
                chunks: 2..4
            }
        ]
    );
    assert!(st.flying_disjoint());
    // 1 stops at the cut; file 0 settles when 2's half is in.
    st.handle(Input::Fetched {
        by: 1,
        chunks: 0..2,
        hashes: vec![h(0), h(1)],
    });
    let a = st.handle(Input::Fetched {
        by: 2,
        chunks: 2..4,
        hashes: vec![h(2), h(3)],
    });
    assert_eq!(
        a,
        vec![Action::Settled {
            file: 0,
            hashes: (0..6).map(h).collect(),
            rechecked: false
        }]
    );
    assert_eq!(st.duplicate_chunks, 0);
}

#[test]
fn a_dead_downloader_gives_back_only_what_it_did_not_report() {
    let mut st = Stripes::new(StripeConfig::default(), &[8]);
    st.handle(Input::Idle(1));
    st.handle(Input::Fetched {
        by: 1,
        chunks: 0..3,
        hashes: (0..3).map(h).collect(),
    });
    st.handle(Input::Progress { by: 1, upto: 3 });
    // Silent for the stall time: gone, and 2 gets chunks 3..8.
    st.handle(Input::Tick { now_ms: 20_000 });
    assert_eq!(fetches(&st.handle(Input::Idle(2))), vec![(2, 3..8)]);
}

#[test]
fn nothing_is_handed_out_while_the_origin_asks_the_cluster_to_wait() {
    let mut st = Stripes::new(StripeConfig::default(), &[16]);
    st.handle(Input::Throttled { until_ms: 5_000 });
    assert!(st.handle(Input::Idle(1)).is_empty());
    assert!(st.handle(Input::Tick { now_ms: 4_999 }).is_empty());
    assert_eq!(
        fetches(&st.handle(Input::Tick { now_ms: 5_000 })),
        vec![(1, 0..8)]
    );
}

#[test]
fn a_lying_downloader_is_named_by_the_recheck_and_gets_no_more_work() {
    let mut st = Stripes::new(StripeConfig::default(), &[4, 4]);
    st.handle(Input::Idle(1));
    st.handle(Input::Idle(2));
    let bad = |c: u64| {
        let mut x = h(c);
        x.0[31] = 9;
        x
    };
    st.handle(Input::Fetched {
        by: 1,
        chunks: 0..4,
        hashes: vec![h(0), bad(1), h(2), h(3)],
    });
    // The file assembled from those fails its Hub hash: every span of it
    // is fetched again from the origin, and 1 is named for chunk 1.
    let a = st.handle(Input::Mismatch { file: 0 });
    assert_eq!(a, vec![Action::Recheck { chunks: 0..4 }]);
    let a = st.handle(Input::Rechecked {
        chunks: 0..4,
        hashes: (0..4).map(h).collect(),
    });
    assert_eq!(
        a,
        vec![
            Action::Settled {
                file: 0,
                hashes: (0..4).map(h).collect(),
                rechecked: true
            },
            Action::Blame {
                by: 1,
                chunks: 1..2
            },
        ]
    );
    assert_eq!(st.blamed(), vec![1]);
    assert!(
        st.handle(Input::Idle(1)).is_empty(),
        "a blamed downloader got work"
    );
}

#[test]
fn a_malformed_report_ends_that_downloaders_part_and_nothing_else() {
    let mut st = Stripes::new(StripeConfig::default(), &[8]);
    st.handle(Input::Idle(1));
    // Three chunks, two hashes; then chunks past the repo's end.
    st.handle(Input::Fetched {
        by: 1,
        chunks: 0..3,
        hashes: vec![h(0), h(1)],
    });
    assert_eq!(fetches(&st.handle(Input::Idle(2))), vec![(2, 0..8)]);
    st.handle(Input::Fetched {
        by: 2,
        chunks: 0..9,
        hashes: (0..9).map(h).collect(),
    });
    assert!(!st.is_done());
}

/// N downloaders, each with its own 100 Mbit/s link: the intake takes
/// about S / (N × I), and the origin serves the repo about once.
#[test]
fn n_links_pull_n_times_as_fast_and_the_origin_serves_the_repo_once() {
    for n in [1usize, 2, 4, 8, 16] {
        let s = setup(vec![honest(I); n]);
        let o = sim::run(&s);
        let ideal = size(&s) as f64 / (n as f64 * I);
        eprintln!(
            "N = {n}: {:.2} s, {:.3} x S/(N I); origin {:.3} x S",
            o.seconds,
            o.seconds / ideal,
            o.origin_bytes as f64 / size(&s) as f64
        );
        assert!(!o.stuck && o.true_files && !o.overlapped, "{o:?}");
        assert!(
            o.seconds <= 1.05 * ideal,
            "N = {n}: {:.2} s against {ideal:.2} s ({:.3} x)",
            o.seconds,
            o.seconds / ideal
        );
        assert!(
            o.origin_bytes as f64 <= 1.02 * size(&s) as f64,
            "N = {n}: the origin served {} of {}",
            o.origin_bytes,
            size(&s)
        );
    }
}

/// The same nodes behind one uplink as fast as one node's link: no slower
/// than one node pulling alone.
#[test]
fn behind_one_shared_uplink_striping_is_no_slower_than_one_node() {
    for n in [2usize, 4] {
        let mut s = setup(vec![honest(I); n]);
        s.shared_uplink = Some(I);
        let o = sim::run(&s);
        let alone = size(&s) as f64 / I;
        eprintln!(
            "shared uplink, N = {n}: {:.3} x one node alone",
            o.seconds / alone
        );
        assert!(
            o.seconds <= 1.05 * alone,
            "N = {n}: {:.2} s against one node's {alone:.2} s",
            o.seconds
        );
    }
}

/// Four downloaders: one killed a third of the way, one at a tenth of the
/// rate. The others take over; the total stays within 1.3 × the ideal of
/// the survivors.
#[test]
fn a_killed_and_a_slow_downloader_are_taken_over() {
    let mut nodes = vec![honest(I); 4];
    let ideal_all = (128 * 4 * MIB) as f64 / (4.0 * I);
    nodes[1].dies_at = Some(ideal_all / 3.0);
    nodes[2].rate = I / 10.0;
    let s = setup(nodes);
    let o = sim::run(&s);
    let survivors = I + I / 10.0 + I;
    let ideal = size(&s) as f64 / survivors;
    eprintln!(
        "killed + slow: {:.3} x the survivors' ideal; origin {:.3} x S",
        o.seconds / ideal,
        o.origin_bytes as f64 / size(&s) as f64
    );
    assert!(!o.stuck && o.true_files, "{o:?}");
    assert!(
        o.seconds <= 1.3 * ideal,
        "{:.2} s against the survivors' {ideal:.2} s ({:.3} x)",
        o.seconds,
        o.seconds / ideal
    );
}

/// A downloader that announces wrong hashes: every file it touched is
/// rechecked from the origin, it is named, no file settles on its bytes,
/// and the origin serves the repo plus those files again.
#[test]
fn a_lying_downloader_is_named_and_no_file_settles_on_its_bytes() {
    let mut nodes = vec![honest(I); 4];
    nodes[3].lies = true;
    let s = setup(nodes);
    let o = sim::run(&s);
    assert!(!o.stuck && o.true_files, "{o:?}");
    eprintln!(
        "liar: origin {:.3} x S, {:.2} s",
        o.origin_bytes as f64 / size(&s) as f64,
        o.seconds
    );
    assert_eq!(o.blamed, vec![3]);
    assert_eq!(o.fetched_after_blame, 0);
    assert!(o.origin_bytes <= 2 * size(&s), "{o:?}");
}

/// The invariants, over random runs: up to 16 downloaders of random
/// rates, some killed, some lying, the origin throttling; with one honest
/// downloader alive to the end:
/// - every run ends, every file settled on its true hashes;
/// - every liar whose chunks were kept is named, and no honest node is;
/// - nothing is handed out while throttled or to a named liar;
/// - the spans in flight never overlap.
#[test]
fn random_runs_keep_the_invariants() {
    for seed in 0..150u64 {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let n = rng.gen_range(1..=16usize);
        let files: Vec<u64> = (0..rng.gen_range(1..=5))
            .map(|_| rng.gen_range(0..40))
            .collect();
        if files.iter().all(|f| *f == 0) {
            continue;
        }
        let mut nodes: Vec<Node> = (0..n)
            .map(|_| Node {
                rate: I * rng.gen_range(0.05..2.0),
                dies_at: rng.gen_bool(0.2).then(|| rng.gen_range(0.0..10.0)),
                lies: rng.gen_bool(0.15),
            })
            .collect();
        // One honest survivor.
        let k = rng.gen_range(0..n);
        nodes[k].dies_at = None;
        nodes[k].lies = false;
        let s = Setup {
            nodes: nodes.clone(),
            shared_uplink: rng.gen_bool(0.3).then(|| I * rng.gen_range(0.5..4.0)),
            chunk: MIB,
            files,
            cfg: StripeConfig {
                span_chunks: rng.gen_range(1..12),
                min_steal_chunks: rng.gen_range(1..4),
                stall_ms: rng.gen_range(500..20_000),
            },
            throttle: rng.gen_bool(0.3).then(|| {
                let at = rng.gen_range(0.0..5.0);
                (at, at + rng.gen_range(0.1..3.0))
            }),
            verifier_rate: I,
            detect_s: rng.gen_range(0.1..3.0),
            request_s: rng.gen_range(0.0..0.2),
        };
        let o = sim::run(&s);
        let why = format!("seed {seed}: {s:?}\n{o:?}");
        assert!(!o.stuck, "{why}");
        assert!(o.true_files, "{why}");
        assert!(!o.overlapped, "{why}");
        assert_eq!(o.fetched_while_throttled, 0, "{why}");
        assert_eq!(o.fetched_after_blame, 0, "{why}");
        for (d, node) in nodes.iter().enumerate() {
            let d = d as u32;
            if !node.lies {
                assert!(!o.blamed.contains(&d), "honest {d} named: {why}");
            }
        }
        for d in &o.blamed {
            assert!(nodes[*d as usize].lies, "{why}");
        }
        for (d, kept) in &o.fetched_by {
            if nodes[*d as usize].lies && *kept > 0 {
                assert!(
                    o.blamed.contains(d),
                    "liar {d} kept {kept} chunks unnamed: {why}"
                );
            }
        }
    }
}
