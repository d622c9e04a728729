//! A token-bucket rate limiter for `--limit-rate`.

use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// Limits the average rate of bytes passing through it.
#[derive(Debug)]
pub struct RateLimiter {
    bytes_per_sec: f64,
    next_free: Mutex<Instant>,
}

impl RateLimiter {
    /// A limiter at `bytes_per_sec` (at least 1).
    pub fn new(bytes_per_sec: u64) -> Self {
        RateLimiter {
            bytes_per_sec: bytes_per_sec.max(1) as f64,
            next_free: Mutex::new(Instant::now()),
        }
    }

    /// Waits until `bytes` may pass.
    pub async fn acquire(&self, bytes: u64) {
        let wait_until = {
            let mut next = self.next_free.lock().await;
            let now = Instant::now();
            let start = (*next).max(now);
            *next = start + Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec);
            start
        };
        tokio::time::sleep_until(wait_until.into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn paces_to_the_rate() {
        let l = RateLimiter::new(1_000_000);
        let t = Instant::now();
        for _ in 0..5 {
            l.acquire(100_000).await;
        }
        // The first acquire is free; four more need 0.4 s.
        assert!(
            t.elapsed() >= Duration::from_millis(390),
            "{:?}",
            t.elapsed()
        );
    }
}
