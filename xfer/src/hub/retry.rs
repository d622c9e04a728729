//! When to try an HTTP request again, and how long to wait first: 408, 429
//! and 5xx answers, resets and cut-short bodies are retried with jittered
//! exponential backoff, and a server's `Retry-After` (or the Hub's
//! `RateLimit: "…";r=0;t=55`) wins over our own guess. Pure: no clock, no I/O.

use std::time::Duration;

/// Tries per request before giving up, counting the first.
pub const MAX_TRIES: u32 = 6;
/// Longest wait between two tries, and longest `Retry-After` honoured.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
const BASE: Duration = Duration::from_millis(250);
const CAP: Duration = Duration::from_secs(10);

/// Whether an HTTP status is worth another try.
pub fn is_retryable(status: u16) -> bool {
    status == 408 || status == 429 || (500..600).contains(&status)
}

/// What a server asked us to wait, from `Retry-After` (seconds; HTTP dates
/// are treated as "a while") or the `t=` of the Hub's `RateLimit` header.
pub fn server_wait(retry_after: Option<&str>, ratelimit: Option<&str>) -> Option<Duration> {
    if let Some(v) = retry_after {
        let v = v.trim();
        return Some(match v.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s).min(MAX_WAIT),
            _ => Duration::from_secs(5),
        });
    }
    let t = ratelimit?
        .split(';')
        .find_map(|p| p.trim().strip_prefix("t="))?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(Duration::from_secs(t).min(MAX_WAIT))
}

/// The wait before try number `attempt + 1` (`attempt` ≥ 1 tries failed):
/// the server's wish if it stated one, else full jitter over an exponential
/// ceiling. `unit` is a random number in [0, 1).
pub fn backoff(attempt: u32, server: Option<Duration>, unit: f64) -> Duration {
    if let Some(s) = server {
        // A little jitter on top, so many connections told "1 s" do not all
        // come back in the same millisecond.
        return s + BASE.mul_f64(unit);
    }
    let ceiling = BASE
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(10))
        .min(CAP);
    ceiling.mul_f64(0.5 + unit / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(is_retryable(s), "{s}");
        }
        for s in [200, 206, 301, 400, 401, 403, 404, 416] {
            assert!(!is_retryable(s), "{s}");
        }
    }

    #[test]
    fn the_server_decides_when_it_says() {
        assert_eq!(server_wait(Some("3"), None), Some(Duration::from_secs(3)));
        assert_eq!(
            server_wait(Some("0.5"), None),
            Some(Duration::from_millis(500))
        );
        assert_eq!(server_wait(Some("99999"), None), Some(MAX_WAIT));
        assert_eq!(
            server_wait(Some("Wed, 21 Oct 2015 07:28:00 GMT"), None),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            server_wait(None, Some(r#""resolvers";r=0;t=55"#)),
            Some(Duration::from_secs(55))
        );
        assert_eq!(server_wait(None, Some("garbage")), None);
        assert_eq!(server_wait(None, None), None);
        let w = backoff(1, Some(Duration::from_secs(2)), 0.99);
        assert!(
            w >= Duration::from_secs(2) && w < Duration::from_secs(3),
            "{w:?}"
        );
    }

    #[test]
    fn backoff_grows_is_jittered_and_capped() {
        let lo = backoff(1, None, 0.0);
        let hi = backoff(1, None, 0.999);
        assert!(lo < hi && hi <= BASE, "{lo:?} {hi:?}");
        assert!(backoff(3, None, 0.0) > backoff(1, None, 0.999));
        assert!(backoff(30, None, 0.999) <= CAP);
    }
}
