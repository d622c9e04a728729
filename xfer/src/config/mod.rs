//! What the operator configures: the cluster file ([`cluster`]) that names
//! the nodes, their agents and fabrics, and the credential ([`auth`]) that
//! lets nodes and operators authenticate each other.

pub mod auth;
pub mod cluster;
