//! The one way the integration tests wait: poll a probe until it reports
//! the event the test waits for, under a deadline that only bounds a hang
//! (never the thing under test). A timeout panics naming what was awaited
//! and the last state the probe saw.
//!
//! A probe returns `Result<T, S>` (done with `T`, or not yet, having seen
//! `S`), `Option<T>` or `bool`; see [`Seen`]. `tests/launchlab` includes
//! this file by path, so it depends on std and tokio only.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long a wait may last before a test calls it a hang, when the test
/// has no better bound of its own.
pub const HANG: Duration = Duration::from_secs(120);

/// What a probe reports: done with `Done`, or not yet with the `State` it saw.
pub trait Seen {
    type Done;
    type State: Debug;
    fn seen(self) -> Result<Self::Done, Self::State>;
}

impl<T, S: Debug> Seen for Result<T, S> {
    type Done = T;
    type State = S;
    fn seen(self) -> Result<T, S> {
        self
    }
}

impl<T> Seen for Option<T> {
    type Done = T;
    type State = Unsaid;
    fn seen(self) -> Result<T, Unsaid> {
        self.ok_or(Unsaid)
    }
}

impl Seen for bool {
    type Done = ();
    type State = Unsaid;
    fn seen(self) -> Result<(), Unsaid> {
        self.then_some(()).ok_or(Unsaid)
    }
}

/// The state of a probe that does not say what it saw.
#[derive(Debug)]
pub struct Unsaid;

/// A state shown as it is (a log, a listing), not quoted and escaped.
pub struct Text(pub String);

impl Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The pause after the `n`th look: short at first (most events come
/// soon), then at most 200 ms (a probe may start a process).
fn pause(n: u32) -> Duration {
    Duration::from_millis((10u64 << n.min(5)).min(200))
}

/// Polls `probe` until it reports done and returns what it returned;
/// panics after `deadline` with `what` and the last state it saw.
pub fn wait_until<P: Seen>(
    what: &str,
    deadline: Duration,
    mut probe: impl FnMut() -> P,
) -> P::Done {
    let start = Instant::now();
    for n in 0.. {
        match probe().seen() {
            Ok(done) => return done,
            Err(seen) if start.elapsed() >= deadline => {
                panic!("timed out after {deadline:?} waiting for {what}; last seen: {seen:#?}")
            }
            Err(_) => std::thread::sleep(pause(n)),
        }
    }
    unreachable!()
}

/// [`wait_until`] for async tests: the probe is a future, the pauses
/// tokio's.
pub async fn wait_until_async<P: Seen, F: Future<Output = P>>(
    what: &str,
    deadline: Duration,
    mut probe: impl FnMut() -> F,
) -> P::Done {
    let start = Instant::now();
    for n in 0.. {
        match probe().await.seen() {
            Ok(done) => return done,
            Err(seen) if start.elapsed() >= deadline => {
                panic!("timed out after {deadline:?} waiting for {what}; last seen: {seen:#?}")
            }
            Err(_) => tokio::time::sleep(pause(n)).await,
        }
    }
    unreachable!()
}
