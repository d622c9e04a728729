//! The origin's "slow down" for a whole download: a 429 (or a 5xx with
//! `Retry-After`) that any downloader gets, this node's own connections or
//! an intake node's (issue 36), holds every downloader of the cluster
//! until the wait it named has passed. The Hub limits a token and a
//! client, not a connection: one connection that waits while fifteen
//! others, and three more nodes, keep asking is no manners at all.
//!
//! The hold only ever moves later; a request already on its way is not
//! recalled.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// When the origin lets the download ask again.
#[derive(Debug, Default)]
pub struct OriginHold {
    until: Mutex<Option<Instant>>,
}

impl OriginHold {
    /// The origin asked to wait `wait` from now. True when that moves the
    /// hold later (the first to hear it says so; the others stay quiet).
    pub fn hold(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        let mut slot = self.until.lock().unwrap();
        match *slot {
            Some(u) if u >= until => false,
            _ => {
                *slot = Some(until);
                true
            }
        }
    }

    /// Until when the download is held, if it is now.
    pub fn until(&self) -> Option<Instant> {
        let slot = self.until.lock().unwrap();
        slot.filter(|u| *u > Instant::now())
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

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_download_stops_waiting() {
        let hold = OriginHold::default();
        let cancel = CancellationToken::new();
        hold.hold(Duration::from_secs(60));
        cancel.cancel();
        assert!(!hold.pass(&cancel).await);
    }
}
