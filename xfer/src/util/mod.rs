//! Small parts with no knowledge of xfer's domain: aligned buffers, the
//! send-rate limiter, progress bars and the metrics counters.

pub mod aligned;
pub mod metrics;
pub mod progress;
pub mod rate;
