//! Where a delivery's seconds went: marks on one clock that starts when
//! the command does, per node (connected, accepted, first chunk, done,
//! closed) and for the whole delivery, so a bench can split the gap
//! between the measured time and S/B into named parts.

use serde::{Deserialize, Serialize};
use std::time::Instant;

/// The clock every mark is read on: seconds since `origin`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock started at `origin`.
    pub fn since(origin: Instant) -> Clock {
        Clock { origin }
    }

    /// Seconds from the origin to now.
    pub fn now(&self) -> f64 {
        self.at(Instant::now())
    }

    /// Seconds from the origin to `at` (0 for an instant before it).
    pub fn at(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.origin).as_secs_f64()
    }
}

/// One receiver's marks, seconds on the delivery's clock (its last
/// attempt's, when it was offered the model again).
#[derive(Debug, Serialize, Deserialize, Clone, Copy, Default, PartialEq)]
pub struct NodeMarks {
    /// Its QUIC handshake completed.
    pub connected_s: Option<f64>,
    /// It answered the offer (what it already holds).
    pub accepted_s: Option<f64>,
    /// It first reported a verified chunk.
    pub first_chunk_s: Option<f64>,
    /// It reported the whole model verified and placed.
    pub done_s: Option<f64>,
    /// Its connection was closed and drained.
    pub closed_s: Option<f64>,
}

/// The delivery's marks: the earliest first chunk and the latest of each
/// other mark over its receivers.
#[derive(Debug, Serialize, Deserialize, Clone, Copy, Default, PartialEq)]
pub struct Timeline {
    /// The source's tree was hashed (0 for a streamed delivery).
    pub hashed_s: f64,
    /// The last receiver's handshake completed.
    pub connected_s: Option<f64>,
    /// The last receiver answered its offer.
    pub accepted_s: Option<f64>,
    /// The first verified chunk anywhere.
    pub first_chunk_s: Option<f64>,
    /// The last receiver reported done.
    pub done_s: Option<f64>,
    /// The last connection was closed and drained.
    pub closed_s: Option<f64>,
    /// The delivery returned its summary.
    pub returned_s: f64,
}

impl Timeline {
    /// The delivery's marks from its receivers'.
    pub fn of<'a>(
        hashed_s: f64,
        nodes: impl IntoIterator<Item = &'a NodeMarks> + Clone,
        returned_s: f64,
    ) -> Timeline {
        let last = |f: fn(&NodeMarks) -> Option<f64>| {
            nodes.clone().into_iter().filter_map(f).reduce(f64::max)
        };
        Timeline {
            hashed_s,
            connected_s: last(|m| m.connected_s),
            accepted_s: last(|m| m.accepted_s),
            first_chunk_s: nodes
                .clone()
                .into_iter()
                .filter_map(|m| m.first_chunk_s)
                .reduce(f64::min),
            done_s: last(|m| m.done_s),
            closed_s: last(|m| m.closed_s),
            returned_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delivery_takes_the_last_of_each_mark_and_the_first_chunk() {
        let a = NodeMarks {
            connected_s: Some(0.5),
            accepted_s: Some(0.6),
            first_chunk_s: Some(0.9),
            done_s: Some(10.0),
            closed_s: Some(10.2),
        };
        let b = NodeMarks {
            connected_s: Some(0.4),
            accepted_s: Some(0.7),
            first_chunk_s: Some(0.8),
            done_s: Some(11.0),
            closed_s: None,
        };
        let t = Timeline::of(0.3, [&a, &b], 11.5);
        assert_eq!(t.connected_s, Some(0.5));
        assert_eq!(t.accepted_s, Some(0.7));
        assert_eq!(t.first_chunk_s, Some(0.8));
        assert_eq!(t.done_s, Some(11.0));
        assert_eq!(t.closed_s, Some(10.2));
        assert_eq!((t.hashed_s, t.returned_s), (0.3, 11.5));
        assert_eq!(Timeline::of(0.0, [], 1.0).done_s, None);
    }
}
