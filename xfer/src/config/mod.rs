//! What the operator configures: the cluster file ([`cluster`]) that names
//! the nodes, their agents and fabrics, and the credential ([`auth`]) that
//! lets nodes and operators authenticate each other, and [`tomltext`], the
//! wording of TOML mistakes (line, column, "did you mean") shared with the
//! launcher's `[launch]` table.

pub mod auth;
pub mod cluster;
pub mod tomltext;
