//! Small parts with no knowledge of xfer's domain: aligned buffers, the
//! send-rate limiter, progress bars, the metrics counters and the TOML
//! span reader.

pub mod aligned;
pub mod metrics;
pub mod progress;
pub mod rate;
pub mod tomltext;
