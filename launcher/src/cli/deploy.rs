//! `xfer-launch deploy`: the preflight, the sync of the model and the
//! delivery of the image to the nodes that lack them, then `up`; with `--json`, every phase's time.

use std::process::ExitCode;

use launcher::agents::Agents;
use launcher::config::Setup;
use launcher::deploy::Preflight;
use launcher::up::{Before, UpOptions};
use xfer::util::progress::Progress;
use xfer_proto::image::ContainerRuntime;

use super::CliError;

pub async fn deploy(
    mut setup: Setup,
    agents: Agents,
    opts: UpOptions,
    image_engine: ContainerRuntime,
    json: bool,
) -> Result<ExitCode, CliError> {
    let progress = Progress::new(!json);
    // The preflight may still run beside `up` (held ranks): it goes by the
    // cluster file as read, while `up` goes by the commit the Hub named.
    let as_read = setup.clone();
    let prepared = launcher::deploy::prepare(&as_read, &agents, image_engine, &progress).await?;
    let mut phases = prepared.phases;
    let commit = prepared.commit;
    let (streaming, checked) = match (prepared.streaming, prepared.checked) {
        (Some(s), c) => (s, c),
        (None, Preflight::Passed(checked)) => {
            return super::up::up_after(setup, &agents, opts, json, Some((phases, &checked))).await;
        }
        (None, Preflight::Running(..)) => {
            unreachable!("a running preflight is handed on only beside a sync")
        }
    };
    // `stream_weights`: `up` starts the ranks while the agents sync; each
    // rank's loader takes each shard as its agent verifies it.
    if let Some(commit) = &commit {
        setup.model.at_commit(commit);
    }
    let t0 = std::time::Instant::now();
    let passed;
    let before = match checked {
        Preflight::Passed(c) => {
            passed = c;
            Before::Passed(&passed)
        }
        Preflight::Running(full, held_started) => Before::Running(full, held_started),
    };
    let up = launcher::up::up(&setup, &agents, &opts, before);
    let source = streaming.source().to_string();
    let quiet = Progress::new(false);
    let wait = streaming.wait(&quiet);
    tokio::pin!(up, wait);
    let mut synced = None;
    let out = loop {
        tokio::select! {
            r = &mut wait, if synced.is_none() => match r {
                Ok(done) => synced = Some(done),
                Err(e) => {
                    // The ranks may be waiting for shards that will not come.
                    launcher::up::stop(&agents, None, opts.grace, "the sync of the model failed").await;
                    return Err(e.into());
                }
            },
            out = &mut up => break out?,
        }
    };
    if out.result.is_err() && synced.is_none() {
        // The ranks are stopped: say so now, not once the sync ends (it may
        // be waiting on a Hub that holds its last file for the ranks).
        eprintln!(
            "the sync of {source} started for this launch goes on in the agents (`xfer status` follows it, `xfer cancel JOB` stops it)"
        );
        return super::up::report(&setup, out, json, Some(phases), t0);
    }
    let (root, secs) = match synced {
        Some(done) => done,
        None => wait.await?,
    };
    phases.sync_s = secs;
    phases.root = Some(root);
    super::up::report(&setup, out, json, Some(phases), t0)
}
