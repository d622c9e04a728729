//! Small parts with no knowledge of xfer's domain: aligned buffers, the
//! send-rate limiter, progress bars, the metrics counters and files only
//! their owner may read.

pub mod aligned;
pub mod metrics;
pub mod private;
pub mod progress;
pub mod rate;
