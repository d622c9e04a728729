//! The launcher's library. [`config`] reads and checks the `[launch]`
//! table of the cluster file and [`plan`] renders what every node runs;
//! [`preflight`] says what to ask the nodes and judges their answers,
//! [`specs`] turns the plan into the agents' rank specs, [`unit`] reads
//! a node's launch unit from its facts. Those are pure.
//! [`stream`] is `up`'s gate under `[launch] stream_weights`; [`deploy`]
//! checks and syncs before `up`; [`caches`] delivers and offers the
//! compile caches.
//! [`agents`] talks to the nodes' xfer agents, [`check`], [`up`] (with
//! [`ready`] and [`record`]) drive a launch, [`diagnose`] reads a failed
//! rank's log for the known [`signatures`] and its root cause
//! ([`traceback`]); `xfer-launch` (src/main.rs, src/cli/) is the command
//! line over them. The terminal's width is xfer's `util::term`.

// Every public item keeps its doc line (`cargo clippy -D warnings` makes
// this an error).
#![warn(missing_docs)]

pub mod agents;
pub mod caches;
pub mod check;
pub mod config;
pub mod deploy;
pub mod diagnose;
pub mod plan;
pub mod preflight;
pub mod ready;
pub mod record;
pub mod signatures;
pub mod specs;
pub mod srun;
pub mod stream;
pub mod traceback;
pub mod unit;
pub mod up;
