//! The checks of the preflight table, one function each, in groups of
//! related checks. Every function reads the nodes' facts from [`Ctx`] and
//! appends its rows to [`Rows`]; [`crate::preflight::judge`] calls them in
//! the order of [`crate::preflight::CHECKS`].
//!
//! [`Ctx`]: crate::preflight::Ctx
//! [`Rows`]: crate::preflight::Rows

mod agent;
mod containers;
mod host;
mod net;
mod rdma;
mod resolver;
mod unit;
mod versions;
mod weights;

pub use agent::agent;
pub use containers::{containers, image};
pub use host::{cache, disk, gpu, memory};
pub use net::{fabric, links, ports, reach, rendezvous, route};
pub use rdma::rdma;
pub use resolver::resolver;
pub use unit::{nccl, unit};
pub use versions::versions;
pub use weights::{loader, weights};
