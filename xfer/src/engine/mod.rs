//! The sans-IO core of a transfer: the chunk [`scheduler`] (events in,
//! requests out), the swarm [`policy`] every receiver runs (its windows
//! and the slow-peer detector), and the swarm's [`topology`] the source
//! runs (who links to whom, and who fetches from the source), and the
//! source's super-[`seeding`] ledger (each chunk out once). The network
//! [`sim`]ulator drives the same scheduler, policy and topology over a
//! simulated network of up to a thousand nodes; it is compiled for tests
//! only (or with the `test-support` feature).

pub mod policy;
pub mod scheduler;
pub mod seeding;
#[cfg(any(test, feature = "test-support"))]
pub mod sim;
pub mod topology;
