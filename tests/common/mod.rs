//! Shared helpers of the integration suite, one module per concern:
//! [`run`] (commands with timeouts), [`agents`] (agent processes that die
//! with their guard), [`push`] (`xfer push --json`), [`trees`] (a model
//! generator, tree comparison), [`journal`], [`disk`] (small disks), [`wait`]
//! (the one helper every test waits with: [`wait_until`]), and
//! [`cluster`], [`hub`], [`netns`] for the cluster, Hub and namespace
//! tests. Everything is re-exported here, so `use common::*` reaches it.
//!
//! Every test starts real `xfer` processes (`CARGO_BIN_EXE_xfer`). Tests
//! run in parallel threads, so every helper works on its own temp
//! dir and agents listen on port 0 of a loopback address picked by the test.

#![allow(dead_code)]

pub mod agents;
pub mod cluster;
pub mod disk;
pub mod docker;
pub mod hub;
pub mod journal;
pub mod netns;
pub mod push;
pub mod run;
pub mod slurm;
pub mod trees;
pub mod wait;

// Each test binary uses a different part of these.
#[allow(unused_imports)]
pub use {agents::*, disk::*, journal::*, push::*, run::*, trees::*, wait::*};

use std::process::{Command, Stdio};

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;

/// The agent's default fetch window (`xfer serve --window`).
pub const WINDOW: u64 = 16;
/// Default `--chunk-size`.
pub const DEFAULT_CHUNK: u64 = 4 * MIB;

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_xfer")
}

/// A fresh `xfer` command.
pub fn xfer() -> Command {
    let mut c = Command::new(bin());
    // A developer's RUST_LOG or XFER_KEY must not change what tests see.
    c.env_remove("RUST_LOG")
        .env_remove("XFER_KEY")
        .env_remove("XFER_FAULT_CORRUPT_SENDS")
        .stdin(Stdio::null());
    c
}

/// A unique temp dir, removed on drop.
pub fn tempdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("xfer-it-{tag}-"))
        .tempdir()
        .expect("temp dir")
}

/// `short`, or `long` when `XFER_TORTURE=long` (the torture suite's long
/// mode, `scripts/torture.sh long`).
pub fn sized<T>(short: T, long: T) -> T {
    if std::env::var("XFER_TORTURE").as_deref() == Ok("long") {
        long
    } else {
        short
    }
}
