//! xfer: move large model checkpoints to every node of a GPU cluster,
//! verified chunk by chunk, resumable, over mutually authenticated QUIC.
//!
//! The data flows through the modules in this order:
//! [`scan`] and [`manifest`] describe a tree ([`hash`] owns the chunk tree,
//! [`relpath`] the path rules), [`wire`] frames the protocol, the sans-IO
//! [`scheduler`] picks chunks, [`transport`] moves them, [`receive`] drives a
//! transfer into the [`store`] (with its [`journal`]), [`swarm`] links the
//! receivers of one transfer to each other, and [`agent`] and [`push`] are
//! the two ends a user runs. [`hub`] and [`pull`] fetch a repository from the
//! Hugging Face Hub into its cache. [`cluster`] reads the cluster file that
//! names the nodes, shared with the launcher.

pub mod agent;
pub mod aligned;
pub mod auth;
pub mod chunkset;
pub mod cluster;
pub mod demo;
pub mod doctor;
pub mod fetch;
pub mod fuzzing;
pub mod hash;
pub mod hashcache;
pub mod hub;
pub mod journal;
pub mod manifest;
pub mod metrics;
pub mod preflight;
pub mod progress;
pub mod pull;
pub mod pull_fanout;
pub mod push;
pub mod ranks;
pub mod rate;
pub mod receive;
pub mod relpath;
pub mod scan;
pub mod scheduler;
pub mod sim;
pub mod store;
pub mod swarm;
pub mod sync;
pub mod tomltext;
pub mod transport;
pub mod units;
pub mod verify;
pub mod wire;
