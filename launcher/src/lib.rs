//! The launcher's library: [`config`] reads and checks the `[launch]` table
//! of the cluster file, [`plan`] renders what every node runs. Both are
//! pure; `xfer-launch` (src/main.rs) is the command line over them.

pub mod config;
pub mod plan;
