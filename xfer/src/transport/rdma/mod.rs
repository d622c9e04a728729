//! The RDMA data plane (RoCE / InfiniBand): chunks move by RDMA
//! WRITE_WITH_IMM into a receive ring on the fetching node, while requests,
//! errors and negotiation stay on the authenticated QUIC connection.
//!
//! [`link`] brings a data plane up on a connection (the queue-pair and
//! ring exchange on the QUIC connection) and defines the [`link::Nic`]
//! that takes part in it. [`verbs`] is the small trait the data plane needs from a NIC;
//! [`double`] implements it in process with the rules of real hardware, and
//! `sys` (cargo feature `rdma`) over libibverbs. The protocol itself is
//! sans-IO ([`ring`]); [`plane`] drives it over any [`verbs::Verbs`] and
//! implements [`super::ChunkFetcher`], so the scheduler, store, resume and
//! BLAKE3 verification are the same as over QUIC.

#[cfg(test)]
pub mod double;
pub mod link;
pub mod plane;
pub mod ring;
#[cfg(feature = "rdma")]
pub mod sys;
pub mod verbs;
