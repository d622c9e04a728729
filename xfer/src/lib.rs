//! xfer: move large model checkpoints to every node of a GPU cluster,
//! verified chunk by chunk, resumable, over mutually authenticated QUIC or
//! RDMA.
//!
//! The data flows through the layers in this order, and a module uses only
//! the layers before its own (see docs/how-it-works.md):
//! - `xfer_proto`: the shared vocabulary (names, hashes, paths, manifests,
//!   chunk sets, frames, messages), a crate of its own with no I/O runtime;
//! - [`util`]: small parts (buffers, rates, bars, durable files);
//! - [`sysinfo`], [`config`]: host readers, the cluster file and
//!   credentials;
//! - [`engine`]: the sans-IO scheduler and swarm policy;
//! - [`store`]: the model store on disk;
//! - [`hub`], [`image`], [`hub_lookalike`]: pulling from the Hugging Face
//!   Hub into its cache, container images as blobs, and the Hub look-alike
//!   the demo and the tests serve;
//! - [`transport`]: QUIC and RDMA connections and chunk serving;
//! - [`flow`]: transfers end to end (the receiver, swarm, push, fetch,
//!   fan-out, image delivery);
//! - [`agent`], [`client`]: the node agent (`xfer serve`) and its
//!   services; the operator's side of them (`xfer sync`, `status`,
//!   `cancel`, `rm`, `prune`, image delivery, the launcher's asks). The
//!   two share a floor and do not use each other.
//!
//! The `xfer` binary's own `cli` sits on top. `tests/layers.rs` checks
//! this order from the source.

// Every public item keeps its doc line (`cargo clippy -D warnings` makes
// this an error).
#![warn(missing_docs)]

pub mod agent;
pub mod client;
pub mod config;
pub mod engine;
pub mod flow;
pub mod fuzzing;
pub mod hub;
pub mod hub_lookalike;
pub mod image;
pub mod store;
pub mod sysinfo;
pub mod transport;
pub mod util;
