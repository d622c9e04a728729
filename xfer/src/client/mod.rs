//! The operator's side of the agents' services: what `xfer sync`,
//! `status`, `cancel`, `rm`, `prune`, `xfer image push --cluster` and the
//! launcher ask of a cluster's nodes, and how their answers read. It
//! shares a floor with `agent` (the node's side) and neither uses the
//! other: both speak the wire types of `xfer-proto` over `transport::ask`.
//!
//! - [`ask`]: the typed client of the admin and launch services and
//!   [`AskError`], the one error of an ask;
//! - [`source`]: what `xfer sync SOURCE` names (a folder or a Hub repo);
//! - [`sync`]: a job built and handed to the agents; [`wait`] follows it;
//! - [`status`]: every node's status and the problems it shows;
//!   [`render`] its table;
//! - [`cleanup`]: `cancel`, `rm`, `prune`;
//! - [`image`]: an image delivered to the nodes.

pub mod ask;
pub mod cleanup;
pub mod image;
pub mod render;
pub mod source;
pub mod status;
pub mod sync;
pub mod wait;

pub use ask::{admin, launch, AskError, ASK_TIMEOUT};
