//! The sans-IO core of a transfer: the chunk [`scheduler`] (events in,
//! requests out) and the swarm [`policy`] every receiver runs (its
//! windows and the slow-peer detector). The network [`sim`]ulator drives
//! the same scheduler and policy over a simulated network of up to a
//! thousand nodes; it is compiled for tests only (or with the
//! `test-support` feature).

pub mod policy;
pub mod scheduler;
#[cfg(any(test, feature = "test-support"))]
pub mod sim;
pub mod topology;
