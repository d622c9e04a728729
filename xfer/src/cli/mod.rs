//! The `xfer` binary's own layer: the arguments ([`args`]), one module per
//! group of commands, and the local multi-node demo ([`demo`]). `main.rs`
//! only parses, sets up logging and the runtime, and calls [`run`].
//!
//! - [`local`]: `keygen`, `manifest`, `verify`, `doctor` (no agent needed);
//! - [`ca`]: `ca init`, `ca issue`, `ca rotate` (the operator's CA);
//! - [`serve`]: `serve`, the node agent;
//! - [`jobs`]: `sync`, `status`, `cancel`, `rm`, `prune` (ask the cluster's agents);
//! - [`transfer`]: `push`, `pull`, `fetch` (move a model themselves);
//! - [`image`]: `image push` (a container image, as blobs, to nodes);
//! - [`hub_serve`]: `hub-serve` (a folder as a Hub repo, on this machine);
//! - [`simulate`]: `simulate` (hidden: the network simulator's prediction);
//! - [`out`]: human lines fitted to the terminal, and the Ctrl-C line.

pub mod args;
mod ca;
pub mod demo;
pub mod demo_engine;
mod hub_serve;
mod image;
mod jobs;
mod local;
mod out;
mod serve;
mod simulate;
mod transfer;

/// What the docs promise of this binary's arguments, shared with the
/// other binary's tests.
#[cfg(test)]
#[path = "../../../tests/common/cli_docs.rs"]
mod cli_docs;

use std::process::ExitCode;

use anyhow::Result;

use args::{Chunking, Cmd, DemoArgs};

/// Runs one command to its exit code.
pub async fn run(cmd: Cmd) -> Result<ExitCode> {
    match cmd {
        Cmd::Keygen(a) => local::keygen(a).await,
        Cmd::Ca(c) => ca::run(c),
        Cmd::Manifest(a) => local::manifest(a).await,
        Cmd::Verify(a) => local::verify(a).await,
        Cmd::Doctor(a) => local::doctor(a).await,
        Cmd::Serve(a) => serve::serve(a).await,
        Cmd::Sync(a) => jobs::sync(a).await,
        Cmd::Status(a) => jobs::status(a).await,
        Cmd::Cancel(a) => jobs::cancel(a).await,
        Cmd::Rm(a) => jobs::rm(a).await,
        Cmd::Prune(a) => jobs::prune(a).await,
        Cmd::Gc(a) => jobs::gc(a).await,
        Cmd::Ls(a) => jobs::ls(a).await,
        Cmd::Pin(a) => jobs::pin(a, true).await,
        Cmd::Unpin(a) => jobs::pin(a, false).await,
        Cmd::Push(a) => transfer::push(a).await,
        Cmd::Pull(a) => transfer::pull(a).await,
        Cmd::Fetch(a) => transfer::fetch(a).await,
        Cmd::Image(args::ImageCmd::Push(a)) => image::push(a).await,
        Cmd::Image(args::ImageCmd::Pull(a)) => image::pull(a).await,
        Cmd::Demo(a) => demo_command(a).await,
        Cmd::HubServe(a) => hub_serve::run(a).await,
        Cmd::Simulate(a) => simulate::run(a),
    }
}

/// `xfer demo`.
async fn demo_command(args: DemoArgs) -> Result<ExitCode> {
    let DemoArgs {
        size,
        nodes,
        dir,
        chunking: Chunking { chunk_size },
        hub_rate,
        no_engine,
    } = args;
    let ok = demo::run(&demo::DemoOptions {
        size,
        nodes,
        dir,
        chunk_size,
        hub_rate,
        engine: !no_engine,
    })
    .await?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
