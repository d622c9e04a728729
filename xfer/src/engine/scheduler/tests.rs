//! The scheduler's unit tests.

use super::*;

fn drain(s: &mut Scheduler) -> Vec<Action> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

fn cfg(window: u32) -> Config {
    Config {
        window,
        ..Config::default()
    }
}

#[test]
fn fetches_only_what_is_missing_in_order_within_the_window() {
    let mut held = ChunkSet::empty(6);
    held.insert(1);
    let mut s = Scheduler::new(held, cfg(2));
    assert_eq!(drain(&mut s), [], "nothing is stuck before a peer joins");
    s.handle(Event::PeerJoined {
        peer: 7,
        has: ChunkSet::full(6),
    });
    assert_eq!(
        drain(&mut s),
        [
            Action::Fetch { peer: 7, chunk: 0 },
            Action::Fetch { peer: 7, chunk: 2 }
        ]
    );
    s.handle(Event::Verified { peer: 7, chunk: 0 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 7, chunk: 3 }]);
    for c in [2, 3] {
        s.handle(Event::Verified { peer: 7, chunk: c });
    }
    let a = drain(&mut s);
    assert_eq!(
        a,
        [
            Action::Fetch { peer: 7, chunk: 4 },
            Action::Fetch { peer: 7, chunk: 5 }
        ]
    );
    s.handle(Event::Verified { peer: 7, chunk: 4 });
    s.handle(Event::Verified { peer: 7, chunk: 5 });
    assert_eq!(drain(&mut s), [Action::Complete]);
}

fn started(len: u64, window: u32) -> Scheduler {
    Scheduler::new(ChunkSet::empty(len), cfg(window))
}

#[test]
fn a_growing_source_is_asked_as_it_announces_and_never_stuck_before_it_is_complete() {
    let mut s = Scheduler::new(
        ChunkSet::empty(4),
        Config {
            window: 4,
            source: Some(9),
            growing: true,
            ..Config::default()
        },
    );
    s.handle(Event::PeerJoined {
        peer: 9,
        has: ChunkSet::empty(4),
    });
    assert_eq!(
        drain(&mut s),
        [],
        "nothing announced: nothing asked, nothing stuck"
    );
    s.handle(Event::PeerHas { peer: 9, chunk: 2 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 9, chunk: 2 }]);
    s.handle(Event::Verified { peer: 9, chunk: 2 });
    assert_eq!(drain(&mut s), [], "waiting for the download, not stuck");
    for c in [0, 1, 3] {
        s.handle(Event::PeerHas { peer: 9, chunk: c });
    }
    let asked = drain(&mut s);
    assert_eq!(asked.len(), 3, "{asked:?}");
    for c in [0, 1, 3] {
        s.handle(Event::Verified { peer: 9, chunk: c });
    }
    assert_eq!(drain(&mut s), [Action::Complete]);
    // The file of chunks 2..4 failed its Hub hash: they are taken back
    // and asked for again once announced anew.
    s.handle(Event::Withdrawn { first: 2, end: 4 });
    assert_eq!(drain(&mut s), []);
    s.handle(Event::PeerHas { peer: 9, chunk: 3 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 9, chunk: 3 }]);
    s.handle(Event::Verified { peer: 9, chunk: 3 });
    s.handle(Event::SourceComplete);
    assert_eq!(
        drain(&mut s),
        [Action::Stuck(StuckReason::NoSource { missing: 1 })],
        "once complete, a chunk nobody has is stuck"
    );
}

#[test]
fn corrupt_chunks_are_refetched_then_give_up() {
    let mut s = started(2, 1);
    s.handle(Event::PeerJoined {
        peer: 1,
        has: ChunkSet::full(2),
    });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 0 }]);
    s.handle(Event::Corrupt { peer: 1, chunk: 0 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 0 }]);
    s.handle(Event::Corrupt { peer: 1, chunk: 0 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 0 }]);
    s.handle(Event::Corrupt { peer: 1, chunk: 0 });
    assert_eq!(
        drain(&mut s),
        [Action::Stuck(StuckReason::ChunkKeepsFailing {
            chunk: 0,
            failures: 3
        })]
    );
}

#[test]
fn a_lying_peer_is_dropped_and_others_take_over() {
    let mut s = Scheduler::new(
        ChunkSet::empty(40),
        Config {
            window: 4,
            max_peer_strikes: 2,
            max_chunk_failures: 10,
            ..Config::default()
        },
    );
    s.handle(Event::PeerJoined {
        peer: 1,
        has: ChunkSet::full(40),
    });
    s.handle(Event::PeerJoined {
        peer: 2,
        has: ChunkSet::full(40),
    });
    let mut dropped = false;
    let mut rounds = 0;
    while !s.held.is_complete() {
        rounds += 1;
        assert!(rounds < 1000);
        let Some(a) = s.poll_action() else {
            panic!("no action while incomplete")
        };
        match a {
            Action::Fetch { peer: 1, chunk } => s.handle(Event::Corrupt { peer: 1, chunk }),
            Action::Fetch { peer, chunk } => s.handle(Event::Verified { peer, chunk }),
            Action::DropPeer { peer: 1, .. } => dropped = true,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(dropped);
    assert!(!s.slot(1).is_some_and(|i| s.peers[i].alive));
}

#[test]
fn a_vanished_peer_returns_its_requests() {
    let mut s = started(3, 3);
    s.handle(Event::PeerJoined {
        peer: 1,
        has: ChunkSet::full(3),
    });
    assert_eq!(drain(&mut s).len(), 3);
    s.handle(Event::PeerGone { peer: 1 });
    assert_eq!(
        drain(&mut s),
        [Action::Stuck(StuckReason::NoSource { missing: 3 })]
    );
}

#[test]
fn nothing_to_do_is_complete_at_once() {
    let mut s = Scheduler::new(ChunkSet::full(5), Config::default());
    assert_eq!(drain(&mut s), [Action::Complete]);
}

#[test]
fn a_plain_push_of_many_chunks_stays_fast() {
    let n = 30_000;
    let mut s = started(n, 16);
    s.handle(Event::PeerJoined {
        peer: 1,
        has: ChunkSet::full(n),
    });
    let started = std::time::Instant::now();
    let mut next = 0;
    while let Some(a) = s.poll_action() {
        match a {
            Action::Fetch { peer: 1, chunk } => {
                assert_eq!(chunk, next, "in order");
                next += 1;
                s.handle(Event::Verified { peer: 1, chunk });
            }
            Action::Complete => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(next, n);
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}

fn swarm(me: PeerId, receivers: u32, len: u64) -> Scheduler {
    let mut s = Scheduler::new(
        ChunkSet::empty(len),
        Config {
            window: 2,
            seed_window: 1,
            max_in_flight: 4,
            me: Some(me),
            seed_lead: 0,
            ..Config::default()
        },
    );
    for r in 1..=receivers {
        if r != me {
            s.handle(Event::PeerJoined {
                peer: r,
                has: ChunkSet::empty(len),
            });
        }
    }
    s.handle(Event::PeerJoined {
        peer: 0,
        has: ChunkSet::full(len),
    });
    s
}

#[test]
fn the_seed_serves_only_home_chunks_and_peers_come_first() {
    // Receivers 1..=4; chunk c is homed at the (c mod 4)-th receiver.
    let mut s = swarm(2, 4, 8);
    assert_eq!(
        drain(&mut s),
        [Action::Fetch { peer: 0, chunk: 1 }],
        "one home chunk from the seed (seed window 1), nothing else yet"
    );
    s.handle(Event::PeerHas { peer: 3, chunk: 2 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 3, chunk: 2 }]);
    s.handle(Event::Verified { peer: 0, chunk: 1 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 5 }]);
    // Slow start: holding one chunk, at most two requests to peers.
    s.handle(Event::PeerHas { peer: 4, chunk: 7 });
    s.handle(Event::PeerHas { peer: 4, chunk: 0 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 4, chunk: 7 }]);
    s.handle(Event::Verified { peer: 3, chunk: 2 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 4, chunk: 0 }]);
    // A chunk a peer holds is not taken from the seed, even a home one:
    // the seed's request is withdrawn.
    s.handle(Event::PeerHas { peer: 1, chunk: 5 });
    assert_eq!(
        drain(&mut s),
        [
            Action::Cancel { peer: 0, chunk: 5 },
            Action::Fetch { peer: 1, chunk: 5 }
        ]
    );
}

#[test]
fn the_seed_is_asked_in_chunk_order_a_little_ahead_of_the_swarm() {
    // Receivers 1..=2, 8 chunks: receiver 1 is home to 0, 2, 4, 6.
    let mut s = Scheduler::new(
        ChunkSet::empty(8),
        Config {
            window: 2,
            seed_window: 4,
            me: Some(1),
            seed_lead: 2,
            ..Config::default()
        },
    );
    s.handle(Event::PeerJoined {
        peer: 2,
        has: ChunkSet::empty(8),
    });
    s.handle(Event::PeerJoined {
        peer: 0,
        has: ChunkSet::full(8),
    });
    // Nothing in the swarm yet: only chunk 0.
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 0 }]);
    // Not stuck while waiting for the swarm.
    s.handle(Event::Verified { peer: 0, chunk: 0 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 2 }]);
    s.handle(Event::PeerHas { peer: 2, chunk: 1 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 2, chunk: 1 }]);
    s.handle(Event::PeerHas { peer: 2, chunk: 3 });
    // Chunks 0, 1, 3 in the swarm: up to chunk 4 now.
    assert_eq!(
        drain(&mut s),
        [
            Action::Fetch { peer: 0, chunk: 4 },
            Action::Fetch { peer: 2, chunk: 3 }
        ]
    );
}

#[test]
fn waiting_for_the_swarm_is_not_stuck_but_losing_the_seed_is() {
    // Receiver 2 of 1..=2: home to chunks 1 and 3, which wait for chunk 0.
    let mut s = Scheduler::new(
        ChunkSet::empty(4),
        Config {
            me: Some(2),
            seed_lead: 1,
            ..Config::default()
        },
    );
    s.handle(Event::PeerJoined {
        peer: 1,
        has: ChunkSet::empty(4),
    });
    s.handle(Event::PeerJoined {
        peer: 0,
        has: ChunkSet::full(4),
    });
    assert_eq!(drain(&mut s), []);
    s.handle(Event::PeerGone { peer: 0 });
    assert_eq!(
        drain(&mut s),
        [Action::Stuck(StuckReason::NoSource { missing: 4 })]
    );
}

#[test]
fn a_partial_peer_serving_one_corrupt_chunk_is_dropped_at_once() {
    let mut s = Scheduler::new(
        ChunkSet::empty(4),
        Config {
            window: 4,
            max_peer_strikes: 3,
            ..Config::default()
        },
    );
    let mut half = ChunkSet::empty(4);
    half.insert(0);
    half.insert(1);
    s.handle(Event::PeerJoined {
        peer: 1,
        has: half.clone(),
    });
    s.handle(Event::PeerJoined { peer: 2, has: half });
    let a = drain(&mut s);
    assert_eq!(a.len(), 2);
    let from_1 = a
        .iter()
        .find_map(|a| match a {
            Action::Fetch { peer: 1, chunk } => Some(*chunk),
            _ => None,
        })
        .expect("a request to peer 1");
    s.handle(Event::Corrupt {
        peer: 1,
        chunk: from_1,
    });
    let a = drain(&mut s);
    assert_eq!(
        a[0],
        Action::DropPeer {
            peer: 1,
            reason: DropReason::Corrupt { strikes: 1 }
        }
    );
    // Everything asked of it, the bad chunk too, is asked of peer 2.
    let mut again: Vec<u64> = a[1..]
        .iter()
        .map(|a| match *a {
            Action::Fetch { peer: 2, chunk } => chunk,
            ref other => panic!("unexpected {other:?}"),
        })
        .collect();
    again.sort();
    assert!(again.contains(&from_1), "{a:?}");
    assert_eq!(again, [0, 1]);
    // Dropped for the transfer: what it announces or brings back is ignored.
    s.handle(Event::PeerHas { peer: 1, chunk: 2 });
    s.handle(Event::PeerJoined {
        peer: 1,
        has: ChunkSet::full(4),
    });
    assert_eq!(drain(&mut s), []);
    // A seed keeps the tolerance of `max_peer_strikes`.
    s.handle(Event::PeerJoined {
        peer: 3,
        has: ChunkSet::full(4),
    });
    let a = drain(&mut s);
    let Some(&Action::Fetch { peer: 3, chunk }) = a.first() else {
        panic!("expected a fetch from the seed, got {a:?}")
    };
    s.handle(Event::Corrupt { peer: 3, chunk });
    let a = drain(&mut s);
    assert!(
        !a.iter().any(|a| matches!(a, Action::DropPeer { .. })),
        "{a:?}"
    );
}

/// The fetches among the actions drained.
fn fetches(s: &mut Scheduler) -> Vec<Action> {
    drain(s)
        .into_iter()
        .filter(|a| matches!(a, Action::Fetch { .. }))
        .collect()
}

fn one_fetch(s: &mut Scheduler) -> (PeerId, u64) {
    match drain(s)[..] {
        [Action::Fetch { peer, chunk }] => (peer, chunk),
        ref other => panic!("expected one fetch, got {other:?}"),
    }
}

#[test]
fn a_busy_peer_is_left_alone_until_nothing_else_is_in_flight() {
    let mut half = ChunkSet::empty(6);
    for c in 0..4 {
        half.insert(c);
    }
    let mut s = Scheduler::new(ChunkSet::empty(6), cfg(1));
    s.handle(Event::PeerJoined {
        peer: 1,
        has: half.clone(),
    });
    let (_, x) = one_fetch(&mut s);
    s.handle(Event::PeerJoined { peer: 2, has: half });
    let (_, y) = one_fetch(&mut s);
    // Peer 1 declines: it is not asked again while peer 2 serves us.
    s.handle(Event::FetchFailed { peer: 1, chunk: x });
    assert_eq!(drain(&mut s), []);
    s.handle(Event::Verified { peer: 2, chunk: y });
    let (p, z) = one_fetch(&mut s);
    assert_eq!(p, 2);
    // Nothing in flight to any peer: declines are forgotten.
    s.handle(Event::FetchFailed { peer: 2, chunk: z });
    let mut asked: Vec<PeerId> = drain(&mut s)
        .into_iter()
        .map(|a| match a {
            Action::Fetch { peer, .. } => peer,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    asked.sort();
    assert_eq!(asked, [1, 2]);
}

#[test]
fn a_gone_receivers_home_chunks_move_to_the_others() {
    let mut s = swarm(2, 4, 8);
    drain(&mut s);
    s.handle(Event::Verified { peer: 0, chunk: 1 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 5 }]);
    s.handle(Event::Verified { peer: 0, chunk: 5 });
    assert_eq!(
        drain(&mut s),
        [Action::Fetch { peer: 0, chunk: 0 }],
        "idle: one chunk of another home, so nothing waits forever"
    );
    for r in [1, 3, 4] {
        s.handle(Event::PeerGone { peer: r });
    }
    assert_eq!(drain(&mut s), [], "the seed window is full");
    // Alone with the seed, every chunk is home.
    let mut got = vec![];
    let mut chunk = 0;
    loop {
        s.handle(Event::Verified { peer: 0, chunk });
        match drain(&mut s)[..] {
            [Action::Fetch { peer: 0, chunk: c }] => {
                got.push(c);
                chunk = c;
            }
            [Action::Complete] => break,
            ref other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, [2, 3, 4, 6, 7]);
}

#[test]
fn assigned_homes_replace_the_roster_and_losing_the_seed_is_not_stuck() {
    // Receiver 2 with peers 1 and 3 only; the coordinator makes it home
    // to slot 1 of 4: chunks 1 and 5 of 8.
    let mut s = Scheduler::new(
        ChunkSet::empty(8),
        Config {
            window: 1,
            seed_window: 1,
            max_in_flight: 2,
            me: Some(2),
            seed_lead: 0,
            ..Config::default()
        },
    );
    for peer in [1, 3] {
        s.handle(Event::PeerJoined {
            peer,
            has: ChunkSet::empty(8),
        });
    }
    assert_eq!(drain(&mut s), [], "no seed: nothing to do, not stuck");
    s.handle(Event::Homes(Homes {
        of: 4,
        slots: vec![1],
    }));
    s.handle(Event::PeerJoined {
        peer: 0,
        has: ChunkSet::full(8),
    });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 1 }]);
    // The seed request takes one of the two places in flight.
    s.handle(Event::PeerHas { peer: 1, chunk: 0 });
    s.handle(Event::PeerHas { peer: 3, chunk: 2 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 0 }]);
    s.handle(Event::Verified { peer: 0, chunk: 1 });
    assert_eq!(
        drain(&mut s),
        [
            Action::Fetch { peer: 3, chunk: 2 },
            Action::Fetch { peer: 0, chunk: 5 }
        ]
    );
    // Unfed: the seed goes, nothing is stuck, and nothing else of the
    // seed's is asked (no idle fetch of another home's chunk).
    s.handle(Event::Homes(Homes::default()));
    s.handle(Event::PeerGone { peer: 0 });
    s.handle(Event::Verified { peer: 1, chunk: 0 });
    s.handle(Event::Verified { peer: 3, chunk: 2 });
    assert_eq!(drain(&mut s), []);
    s.handle(Event::PeerHas { peer: 1, chunk: 7 });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 1, chunk: 7 }]);
}

#[test]
fn a_feeder_that_reaches_no_peer_still_gets_everything_from_the_seed() {
    // Home to chunk 1 of 2 (slot 1 of 2), with the agents' mesh policy
    // (a seed lead of 16), and its one peer never linked: it must not
    // wait for a swarm it cannot see.
    let mut s = Scheduler::new(
        ChunkSet::empty(2),
        crate::engine::policy::swarm_config(Config::default(), 2),
    );
    s.handle(Event::Homes(Homes {
        of: 2,
        slots: vec![1],
    }));
    s.handle(Event::PeerJoined {
        peer: 0,
        has: ChunkSet::full(2),
    });
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 1 }]);
    s.handle(Event::Verified { peer: 0, chunk: 1 });
    // Idle: the other home's chunk comes from the seed too.
    assert_eq!(drain(&mut s), [Action::Fetch { peer: 0, chunk: 0 }]);
    s.handle(Event::Verified { peer: 0, chunk: 0 });
    assert_eq!(drain(&mut s), [Action::Complete]);
}

/// A partial peer that says it lacks a chunk it announced (withdrawn there,
/// or its announcement of an older download arrived late) is not asked for
/// it again, however idle the receiver is, until it announces it anew.
#[test]
fn a_peer_that_lacks_an_announced_chunk_is_not_asked_again_until_it_has_it() {
    // Peer 1 holds chunk 0 of 2: a partial peer, not a seed.
    let mut one = ChunkSet::empty(2);
    one.insert(0);
    let mut s = Scheduler::new(ChunkSet::empty(2), cfg(1));
    s.handle(Event::PeerJoined { peer: 1, has: one });
    assert_eq!(one_fetch(&mut s), (1, 0));
    s.handle(Event::PeerLacks { peer: 1, chunk: 0 });
    // Nothing in flight anywhere: a mere decline would be forgotten and the
    // chunk asked again at once; a lack is not.
    assert_eq!(
        fetches(&mut s),
        [],
        "asked a peer for a chunk it said it lacks"
    );
    s.handle(Event::PeerHas { peer: 1, chunk: 0 });
    assert_eq!(one_fetch(&mut s), (1, 0));
}

/// The race of a flaky striped test, performed: we ask peer 1 for chunk 0
/// on an old announcement; it answers "I lack it", but before that answer
/// reaches us (another stream) it got the chunk and announced it. The late
/// answer must not unlearn the newer announcement: peer 1 is asked again,
/// or the receiver waits for an announcement that already came (the sync
/// hung, its source and the peer complete, the receiver one chunk short).
#[test]
fn a_lack_answered_before_a_newer_announcement_keeps_the_peer_a_holder() {
    let mut one = ChunkSet::empty(2);
    one.insert(0);
    let mut s = Scheduler::new(ChunkSet::empty(2), cfg(1));
    s.handle(Event::PeerJoined { peer: 1, has: one });
    assert_eq!(one_fetch(&mut s), (1, 0));
    s.handle(Event::PeerHas { peer: 1, chunk: 0 });
    s.handle(Event::PeerLacks { peer: 1, chunk: 0 });
    assert_eq!(one_fetch(&mut s), (1, 0), "the newer announcement was lost");
    // And the flag lasts one answer: a lack answered to the next request
    // unlearns the holder as before.
    s.handle(Event::PeerLacks { peer: 1, chunk: 0 });
    assert_eq!(
        fetches(&mut s),
        [],
        "asked a peer for a chunk it said it lacks"
    );
}
