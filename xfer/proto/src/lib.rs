//! xfer-proto: the vocabulary every xfer node shares, with no I/O runtime
//! (no tokio, quinn or rustls), so that what travels between nodes can be
//! read, checked and tested on its own.
//!
//! - [`names`]: the protocol version, ALPN, default port, model names;
//! - [`hash`]: the BLAKE3 chunk tree; [`relpath`]: the path rules;
//!   [`manifest`]: a tree's description; [`chunkset`]: sets of chunks;
//!   [`draft`]: a manifest that grows while its source downloads;
//! - [`frame`]: the length prefix, [`frame::WireError`] and size limits;
//! - [`hello`]: the first frame of a control stream (version, service);
//!   then one message vocabulary per service: [`transfer`] (push, swarm,
//!   fetch), [`admin`] (sync jobs, status, cancel, rm) and [`launch`]
//!   (preflight, ranks, logs), each refusable with a [`refusal::Refusal`];
//! - [`launch_rules`]: the environment keys and devices a rank may carry;
//! - [`local`]: the loader link, what a rank asks its own agent over the
//!   agent's Unix socket;
//! - [`image`]: container images as content-addressed blobs;
//! - [`stream`]: the tagged chunk-stream requests;
//! - [`units`]: byte and rate formatting for messages; [`text`]: lines
//!   and tables that fit a terminal;
//! - [`repo`]: Hub repository references and the commit-id check.
//!
//! Every decoder here is strict and bounded: hostile input is an error
//! with its reason, never a panic or an allocation a peer chose.

// Every public item keeps its doc line (`cargo clippy -D warnings` makes
// this an error).
#![warn(missing_docs)]

pub mod admin;
pub mod chunkset;
pub mod compile_cache;
pub mod draft;
pub mod frame;
pub mod hash;
pub mod hello;
pub mod image;
pub mod launch;
pub mod launch_rules;
pub mod local;
pub mod manifest;
pub mod names;
pub mod rdma;
pub mod refusal;
pub mod relpath;
pub mod repo;
pub mod secret;
pub mod stream;
pub mod text;
pub mod transfer;
pub mod units;
