//! Pulling images and OCI artifacts from a registry (the OCI distribution
//! API): references with Docker's defaults ([`reference`]), credentials and
//! the registry's challenge ([`auth`]), manifests and indexes told apart by
//! media type with the platform picked ([`manifest`]), and the HTTP client
//! that fetches and checks them ([`client`]); a ModelPack model artifact
//! placed as a model folder ([`artifact`]). Blobs land in the same cache
//! `xfer image push` keeps ([`super::archive`]), so the delivery to the
//! nodes is the same.

pub mod artifact;
pub mod auth;
pub mod client;
pub mod manifest;
pub mod reference;
