//! The wall clock as Unix time: the one reader of `SystemTime::now()`
//! against the epoch, for records, job views and logs (a clock set before
//! 1970 reads as 0, never an error).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time since the Unix epoch (zero before it).
pub fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Now, in whole Unix seconds.
pub fn unix_now() -> u64 {
    since_epoch().as_secs()
}

/// Now, in Unix milliseconds.
pub fn unix_now_ms() -> u64 {
    since_epoch().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_and_milliseconds_agree() {
        let (s, ms) = (unix_now(), unix_now_ms());
        assert!(s > 1_700_000_000, "{s}");
        assert!(ms / 1000 >= s && ms / 1000 <= s + 1, "{s} {ms}");
    }
}
