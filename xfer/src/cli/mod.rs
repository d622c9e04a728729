//! The `xfer` binary's own parts: the local multi-node demo ([`demo`]).

pub mod demo;
