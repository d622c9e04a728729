//! Whether an error is one that trying again cannot fix: each error type
//! that reaches a sync job's rounds says so itself ([`Permanence`]), from
//! its own facts (a 4xx of the Hub, a full disk, a node's refusal), so a
//! new permanent cause is never retried for want of a list naming it.

use std::time::Duration;

/// What an error says about trying again.
pub trait Permanence {
    /// Whether retrying cannot fix it (someone must act first).
    fn is_permanent(&self) -> bool;

    /// How long the other side asked to wait before the next try, if it did.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

impl<T: Permanence + ?Sized> Permanence for &T {
    fn is_permanent(&self) -> bool {
        (**self).is_permanent()
    }

    fn retry_after(&self) -> Option<Duration> {
        (**self).retry_after()
    }
}

impl Permanence for xfer_proto::refusal::Refusal {
    fn is_permanent(&self) -> bool {
        xfer_proto::refusal::Refusal::is_permanent(self)
    }
}
