//! Small parts with no knowledge of xfer's domain: aligned buffers, files
//! beneath a root that no planted symlink redirects (and durable writes),
//! files only their owner may read, file stamps, the send-rate limiter,
//! progress bars and the metrics counters.

pub mod aligned;
pub mod beneath;
pub mod metrics;
pub mod private;
pub mod progress;
pub mod rate;
pub mod stamp;
