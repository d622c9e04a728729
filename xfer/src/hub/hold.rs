//! The origin's "slow down" for a whole download: a 429 (or a 5xx with
//! `Retry-After`) that this node's own connections get holds every
//! downloader of the cluster until the wait it named has passed. The Hub
//! limits a token and a client, not a connection: one connection that
//! waits while fifteen others, and three more nodes, keep asking is no
//! manners at all.
//!
//! An intake node's report (issue 36) is only its word: it holds the
//! cluster only when another downloader (this node, or another intake
//! node) heard the same within [`CORROBORATE`]; alone, only that node
//! waits ([`Verdict::OnlyIt`]), so one lying or badly routed node cannot
//! hold the others (issue 53). And the cluster is held at most
//! [`MAX_TOTAL_HOLD`] over one download.
//!
//! The hold only ever moves later; a request already on its way is not
//! recalled. The rule is `engine::striping`'s [`HoldRule`] (sans-IO, with
//! the rest of the striped intake's planner); this is its clock and its
//! wait.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::striping::HoldRule;
pub use crate::engine::striping::{Heard, Verdict, CORROBORATE, MAX_TOTAL_HOLD};

/// When the origin lets the download ask again: the rule
/// ([`HoldRule`], in `engine`) on this process's clock.
#[derive(Debug)]
pub struct OriginHold {
    /// The rule's times are durations since this.
    began: Instant,
    rule: Mutex<HoldRule>,
}

impl Default for OriginHold {
    fn default() -> Self {
        OriginHold {
            began: Instant::now(),
            rule: Mutex::default(),
        }
    }
}

impl OriginHold {
    fn now(&self) -> Duration {
        Instant::now().duration_since(self.began)
    }

    /// This node's own connections heard the origin ask to wait `wait`:
    /// every downloader holds. True when that moves the hold later.
    pub fn hold(&self, wait: Duration) -> bool {
        matches!(
            self.heard(Heard::ThisNode, wait),
            Verdict::HoldAll { newly: true }
        )
    }

    /// `who` heard the origin ask to wait `wait` from now.
    pub fn heard(&self, who: Heard, wait: Duration) -> Verdict {
        let now = self.now();
        self.rule.lock().unwrap().heard(who, wait, now)
    }

    /// Until when the download is held, if it is now.
    pub fn until(&self) -> Option<Instant> {
        let now = self.now();
        let until = self.rule.lock().unwrap().until(now)?;
        Some(self.began + until)
    }

    /// Waits until no hold is in force (re-reading it: a hold extended
    /// while waiting is waited out too). False when cancelled first.
    pub async fn pass(&self, cancel: &CancellationToken) -> bool {
        while let Some(u) = self.until() {
            tokio::select! {
                _ = tokio::time::sleep_until(u) => {}
                _ = cancel.cancelled() => return false,
            }
        }
        !cancel.is_cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn every_waiter_waits_out_the_latest_hold() {
        let hold = std::sync::Arc::new(OriginHold::default());
        let cancel = CancellationToken::new();
        assert!(hold.until().is_none());
        let t0 = Instant::now();
        assert!(hold.hold(Duration::from_secs(3)));
        // A shorter wait heard later does not shorten it.
        assert!(!hold.hold(Duration::from_secs(1)));
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let (h, c) = (hold.clone(), cancel.clone());
                tokio::spawn(async move {
                    assert!(h.pass(&c).await);
                    Instant::now()
                })
            })
            .collect();
        // Extended while they wait: they wait for the new end.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(hold.hold(Duration::from_secs(4)));
        for w in waiters {
            let passed = w.await.unwrap();
            assert!(passed - t0 >= Duration::from_secs(6), "{:?}", passed - t0);
        }
        assert!(hold.until().is_none());
    }

    /// Issue 53: an intake node alone saying "slow down" holds only
    /// itself; backed by another downloader within the window, everyone;
    /// and the cluster is never held longer than the cap in all.
    #[tokio::test(start_paused = true)]
    async fn an_intake_nodes_word_alone_holds_only_it_and_holds_are_bounded() {
        let hold = OriginHold::default();
        let w = Duration::from_secs(20);
        assert_eq!(hold.heard(Heard::Intake(0), w), Verdict::OnlyIt);
        assert_eq!(hold.heard(Heard::Intake(0), w), Verdict::OnlyIt);
        assert!(
            hold.until().is_none(),
            "a lone intake node held the cluster"
        );
        // Another node hears it too: everyone holds.
        assert_eq!(
            hold.heard(Heard::Intake(1), w),
            Verdict::HoldAll { newly: true }
        );
        assert!(hold.until().is_some());
        // Long after, a lone report is alone again.
        tokio::time::sleep(CORROBORATE + w + Duration::from_secs(1)).await;
        assert_eq!(hold.heard(Heard::Intake(0), w), Verdict::OnlyIt);
        // This node's own connections are believed; the total is capped.
        let mut spent = false;
        for _ in 0..100 {
            match hold.heard(Heard::ThisNode, Duration::from_secs(60)) {
                Verdict::Spent => {
                    spent = true;
                    break;
                }
                _ => tokio::time::sleep(Duration::from_secs(60)).await,
            }
        }
        assert!(spent, "the holds never ran out");
        assert!(hold.rule.lock().unwrap().held() <= MAX_TOTAL_HOLD);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_download_stops_waiting() {
        let hold = OriginHold::default();
        let cancel = CancellationToken::new();
        hold.hold(Duration::from_secs(60));
        cancel.cancel();
        assert!(!hold.pass(&cancel).await);
    }
}
