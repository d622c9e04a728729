//! Small parts with no knowledge of xfer's domain: the Unix clock, aligned buffers, files
//! beneath a root that no planted symlink redirects (and durable writes),
//! files only their owner may read, file stamps, programs resolved to
//! absolute paths, the send-rate limiter, progress bars, the terminal's
//! width, the metrics counters, a budget for repeated log lines, and the
//! model checks' seeded generator; whether an error is permanent, and the
//! chain of a layer whose errors are not typed yet.

pub mod aligned;
pub mod beneath;
pub mod chain;
pub mod clock;
pub mod lograte;
pub mod metrics;
pub mod permanence;
pub mod private;
pub mod program;
pub mod progress;
pub mod rate;
#[cfg(test)]
pub mod seeded;
pub mod stamp;
pub mod term;
