//! The sans-IO core of a transfer: the chunk [`scheduler`] (events in,
//! requests out), the swarm [`policy`] every receiver runs (its windows
//! and the slow-peer detector), and the swarm's [`topology`] the source
//! runs (who links to whom, and who fetches from the source), and the
//! source's super-[`seeding`] ledger (each chunk out once), and the
//! striped intake's planner ([`striping`], issue 36: which downloader
//! fetches which part from the origin, who steals and who retires, when
//! the cluster holds; `hub::download` runs it). The network
//! [`sim`]ulator drives the same scheduler, policy and topology over a
//! simulated network of up to a thousand nodes, for the tests and the
//! hidden `xfer simulate` command.

pub mod policy;
pub mod scheduler;
pub mod seeding;
pub mod sim;
pub mod striping;
pub mod topology;
