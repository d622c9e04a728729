//! A deterministic, time-stepped simulation of a striped intake: each
//! downloader pulls its spans from the origin at its own rate (or a share
//! of one uplink they all sit behind), reports progress, may die, lie or
//! be throttled, and the verifying node checks each settled file against
//! the truth and fetches spans again when asked. It drives the real
//! [`Stripes`]; the figures are the intake's alone (the fan-out of what
//! each node fetched is the swarm's, [`crate::engine::sim`]).

use std::collections::BTreeMap;
use std::ops::Range;

use xfer_proto::hash::Hash;

use super::{Action, Downloader, Input, StripeConfig, Stripes};

/// One downloader.
#[derive(Clone, Debug)]
pub struct Node {
    /// Its link to the origin, bytes per second.
    pub rate: f64,
    /// When it dies (seconds), if it does.
    pub dies_at: Option<f64>,
    /// It announces wrong hashes for every chunk it fetches.
    pub lies: bool,
}

/// A run.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The downloaders, ids 0.. in order.
    pub nodes: Vec<Node>,
    /// One uplink every downloader sits behind, bytes per second.
    pub shared_uplink: Option<f64>,
    /// Bytes per chunk.
    pub chunk: u64,
    /// Chunks per file.
    pub files: Vec<u64>,
    /// The planner's settings.
    pub cfg: StripeConfig,
    /// A 429 at `.0` seconds asking everyone to wait until `.1`.
    pub throttle: Option<(f64, f64)>,
    /// The verifying node's rate for rechecks, bytes per second.
    pub verifier_rate: f64,
    /// How long after a death its connection is seen closed, seconds.
    pub detect_s: f64,
    /// Each span's request: the round trip and the origin's time to its
    /// first byte, seconds, during which the downloader's link idles.
    pub request_s: f64,
}

/// How a run went.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Seconds until every file was settled on true hashes.
    pub seconds: f64,
    /// Bytes the origin served (downloads and rechecks).
    pub origin_bytes: u64,
    /// The downloaders named.
    pub blamed: Vec<Downloader>,
    /// Chunks each downloader fetched that were kept.
    pub fetched_by: BTreeMap<Downloader, u64>,
    /// Every file's final hashes equal the truth.
    pub true_files: bool,
    /// Fetches handed out while throttled (must be none).
    pub fetched_while_throttled: usize,
    /// Fetches handed to a downloader after it was blamed (must be none).
    pub fetched_after_blame: usize,
    /// Two downloaders' spans overlapped at some step (must not).
    pub overlapped: bool,
    /// The run hit its step limit without finishing.
    pub stuck: bool,
}

/// The true hash of chunk `c`.
fn truth(c: u64) -> Hash {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(&c.to_le_bytes());
    Hash(h)
}

/// What a liar says of chunk `c`.
fn lie(c: u64) -> Hash {
    let mut h = truth(c).0;
    h[31] = 0xff;
    Hash(h)
}

struct Worker {
    span: Option<Range<u64>>,
    /// Bytes into the span.
    done: f64,
    /// Seconds of the span's request still to wait.
    wait: f64,
    alive: bool,
    reported_dead: bool,
}

/// Runs `setup` to the end.
pub fn run(setup: &Setup) -> Outcome {
    const DT: f64 = 0.005;
    let mut st = Stripes::new(setup.cfg.clone(), &setup.files);
    let mut ws: Vec<Worker> = setup
        .nodes
        .iter()
        .map(|_| Worker {
            span: None,
            done: 0.0,
            wait: 0.0,
            alive: true,
            reported_dead: false,
        })
        .collect();
    let chunk = setup.chunk as f64;
    let mut out = Outcome {
        seconds: 0.0,
        origin_bytes: 0,
        blamed: Vec::new(),
        fetched_by: BTreeMap::new(),
        true_files: true,
        fetched_while_throttled: 0,
        fetched_after_blame: 0,
        overlapped: false,
        stuck: false,
    };
    let mut final_hashes: BTreeMap<u32, Vec<Hash>> = BTreeMap::new();
    let file_start: Vec<u64> = setup
        .files
        .iter()
        .scan(0, |at, n| {
            let s = *at;
            *at += n;
            Some(s)
        })
        .collect();
    let mut rechecks: std::collections::VecDeque<Range<u64>> = Default::default();
    let mut recheck_done = 0.0;
    let mut throttled_until = 0.0;
    let mut actions = Vec::new();
    for d in 0..setup.nodes.len() as u32 {
        actions.extend(st.handle(Input::Idle(d)));
    }
    let mut t = 0.0;
    let mut step = 0u64;
    let mut next_report = 0.1;
    loop {
        // Apply the actions, which may call for more.
        while !actions.is_empty() {
            let mut more = Vec::new();
            for a in std::mem::take(&mut actions) {
                match a {
                    Action::Fetch { by, chunks } => {
                        if t < throttled_until {
                            out.fetched_while_throttled += 1;
                        }
                        if out.blamed.contains(&by) {
                            out.fetched_after_blame += 1;
                        }
                        let w = &mut ws[by as usize];
                        w.span = Some(chunks);
                        w.done = 0.0;
                        w.wait = setup.request_s;
                    }
                    Action::Cut { by, at } => {
                        let w = &mut ws[by as usize];
                        if let Some(s) = &mut w.span {
                            let pos = s.start + (w.done / chunk) as u64;
                            s.end = at.max(pos.min(s.end)).min(s.end);
                        }
                    }
                    Action::Recheck { chunks } => rechecks.push_back(chunks),
                    Action::Blame { by, .. } => {
                        if !out.blamed.contains(&by) {
                            out.blamed.push(by);
                        }
                        ws[by as usize].span = None;
                    }
                    Action::Settled {
                        file,
                        hashes,
                        rechecked,
                    } => {
                        let start = file_start[file as usize];
                        let good = hashes
                            .iter()
                            .enumerate()
                            .all(|(k, h)| *h == truth(start + k as u64));
                        if good || rechecked {
                            out.true_files &= good;
                            final_hashes.insert(file, hashes);
                        } else {
                            more.extend(st.handle(Input::Mismatch { file }));
                        }
                    }
                }
            }
            actions = more;
        }
        if final_hashes.len() == setup.files.iter().filter(|n| **n > 0).count()
            && st.is_done()
            && rechecks.is_empty()
        {
            break;
        }
        step += 1;
        if step > 20_000_000 {
            out.stuck = true;
            eprintln!("stuck: {}", st.describe());
            break;
        }
        t += DT;
        // The origin's 429.
        if let Some((at, until)) = setup.throttle {
            if t >= at && t - DT < at {
                throttled_until = until;
                actions.extend(st.handle(Input::Throttled {
                    until_ms: (until * 1000.0) as u64,
                }));
            }
        }
        // Deaths.
        for (i, n) in setup.nodes.iter().enumerate() {
            let w = &mut ws[i];
            if let Some(d) = n.dies_at {
                if t >= d {
                    w.alive = false;
                }
                if t >= d + setup.detect_s && !w.reported_dead {
                    w.reported_dead = true;
                    actions.extend(st.handle(Input::Left(i as u32)));
                }
            }
        }
        // Transfers.
        let active = ws
            .iter()
            .filter(|w| w.alive && w.span.is_some())
            .count()
            .max(1);
        for (i, n) in setup.nodes.iter().enumerate() {
            let w = &mut ws[i];
            if !w.alive || t < throttled_until {
                continue;
            }
            let Some(span) = w.span.clone() else { continue };
            if w.wait > 0.0 {
                w.wait -= DT;
                continue;
            }
            let rate = match setup.shared_uplink {
                Some(u) => n.rate.min(u / active as f64),
                None => n.rate,
            };
            let bytes = span_bytes(&span, setup) as f64;
            let step_bytes = (rate * DT).min(bytes - w.done);
            w.done += step_bytes;
            out.origin_bytes += step_bytes as u64;
            if w.done >= bytes - 0.5 {
                let hashes = span
                    .clone()
                    .map(|c| if n.lies { lie(c) } else { truth(c) })
                    .collect();
                w.span = None;
                actions.extend(st.handle(Input::Fetched {
                    by: i as u32,
                    chunks: span,
                    hashes,
                }));
                actions.extend(st.handle(Input::Idle(i as u32)));
            }
        }
        // The verifier's rechecks, one at a time.
        if let Some(r) = rechecks.front().cloned() {
            recheck_done += setup.verifier_rate * DT;
            let bytes = span_bytes(&r, setup) as f64;
            if recheck_done >= bytes {
                out.origin_bytes += bytes as u64;
                recheck_done = 0.0;
                rechecks.pop_front();
                actions.extend(st.handle(Input::Rechecked {
                    chunks: r.clone(),
                    hashes: r.map(truth).collect(),
                }));
            }
        }
        // Progress reports and the clock.
        if t >= next_report {
            next_report += 0.1;
            for (i, w) in ws.iter().enumerate() {
                if let (true, Some(s)) = (w.alive, &w.span) {
                    let upto = s.start + (w.done / chunk) as u64;
                    actions.extend(st.handle(Input::Progress { by: i as u32, upto }));
                }
            }
            actions.extend(st.handle(Input::Tick {
                now_ms: (t * 1000.0) as u64,
            }));
        }
        // No two spans in flight overlap, in the planner's view.
        if !st.flying_disjoint() {
            out.overlapped = true;
        }
    }
    out.seconds = t;
    out.fetched_by = st.fetched_by();
    out
}

/// The bytes of `span`: whole chunks (the sim's files are whole chunks).
fn span_bytes(span: &Range<u64>, setup: &Setup) -> u64 {
    (span.end - span.start) * setup.chunk
}
