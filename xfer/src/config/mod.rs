//! What the operator configures: the cluster file ([`cluster`]) that names
//! the nodes, their agents and fabrics, and the credential ([`auth`]) that
//! lets nodes and operators authenticate each other, and [`toml_reader`],
//! the one reader of hand-written TOML (positions as line and column, typed
//! values, "did you mean") that the cluster file and the launcher's
//! `[launch]` table share.

pub mod auth;
pub mod cluster;
pub mod slurm;
pub mod toml_reader;
