//! The integration suite of `xfer`, one test binary: every module starts
//! real `xfer` processes (agents, pushes, pulls against a Hub look-alike)
//! on loopback, in temp dirs, each test on its own ports and folders so
//! that all run in parallel. The tests that need network namespaces with
//! shaped links are in `shaped_net.rs`; the launcher's are in `launch.rs`.

mod common;

mod auth;
mod bad_manifest;
mod ca_crash;
mod corruption;
mod day_two;
mod demo;
mod disk_full;
mod doctor;
mod fetch;
mod fuzz_corpus;
mod hub_hostile;
mod integrity;
mod launch_env;
mod layers;
mod loader_link;
mod loader_plugin;
mod manifest;
mod oci_artifact;
mod permits;
mod planted;
mod pull;
mod pull_fanout;
mod pull_stream;
mod push;
mod reflector;
mod resume;
mod store_budget;
mod sync;
mod sync_errors;
mod sync_local;
mod terminal;
mod torture_node;
mod transport;
mod trust;
mod vocabulary;
