//! `xfer simulate` (hidden): the network simulator's prediction of a push of
//! one shape, as JSON, so a script can print it beside a real run's. The
//! model and its development-machine preset are `engine::sim`'s; this only
//! builds the `Setup` from the arguments and renders the `Report`.

use std::process::ExitCode;

use anyhow::{bail, Result};
use serde_json::json;

use super::args::SimulateArgs;
use xfer::engine::sim::{self, Setup, THIS_MACHINE_CORES};
use xfer::engine::topology;

const MIB: f64 = 1_048_576.0;

/// Runs the simulation and prints its JSON; exits 1 when a node did not
/// complete.
pub fn run(a: SimulateArgs) -> Result<ExitCode> {
    let out = simulate(&a)?;
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(if out["incomplete"] == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The prediction for `a`, as the JSON `run` prints.
fn simulate(a: &SimulateArgs) -> Result<serde_json::Value> {
    let setup = setup(a)?;
    let (n, size) = (setup.receivers.len(), a.size_mib as f64 * MIB);
    let rate = setup.source.up;
    let s_over_b = size / rate;
    let model = json!({
        "latency_ms": setup.source.latency * 1e3,
        "cores": setup.source.cores * (n + 1) as f64,
        "service_ms": setup.costs.service * 1e3,
        "verify_ms_per_mib": setup.costs.verify * MIB * 1e3,
        "cpu_mib_s": if setup.costs.per_byte > 0.0 { 1.0 / setup.costs.per_byte / MIB } else { 0.0 },
        "share_loss": setup.costs.share_loss,
        "control_ms": setup.costs.control * 1e3,
        "start_s": setup.costs.start,
    });
    let started = std::time::Instant::now();
    let r = sim::run(setup);
    let took = started.elapsed().as_secs_f64();
    let mut done: Vec<f64> = r.nodes.iter().filter_map(|x| x.done_at).collect();
    done.sort_by(f64::total_cmp);
    let incomplete = n - done.len();
    let rank = |q: f64| -> Option<f64> {
        let i = ((q * done.len() as f64).ceil() as usize).clamp(1, done.len().max(1)) - 1;
        done.get(i).map(|t| t / s_over_b)
    };
    let wall = done.last().copied().unwrap_or(r.end).max(r.source_done);
    Ok(json!({
        "nodes": n,
        "rate_mbit": a.rate_mbit,
        "size_mib": a.size_mib,
        "chunk_size": a.chunking.chunk_size.for_bytes(a.size_mib * (1 << 20)),
        "degree": a.degree,
        "seed": a.seed,
        "model": model,
        "s_over_b_s": s_over_b,
        "p50_x": rank(0.5),
        "p90_x": rank(0.9),
        "max_x": rank(1.0),
        "wall_x": wall / s_over_b,
        "source_x": r.source_served as f64 / size,
        "source_wire_x": r.source_wire as f64 / size,
        "wire_x": r.wire as f64 / (n as f64 * size),
        "max_peers": r.max_peers,
        "incomplete": incomplete,
        "events": r.events,
        "sim_seconds": took,
    }))
}

/// The development machine's preset (or no costs with `--ideal`), with
/// every knob given on the command line applied over it.
fn setup(a: &SimulateArgs) -> Result<Setup> {
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(a.rate_mbit) {
        bail!(
            "--rate-mbit {} is not a rate; give Mbit/s above 0, e.g. 100",
            a.rate_mbit
        );
    }
    if a.size_mib == 0 {
        bail!("--size-mib 0 is an empty model; give its size in MiB, e.g. 128");
    }
    for (flag, v) in [
        ("--latency-ms", a.latency_ms),
        ("--service-ms", a.service_ms),
        ("--verify-ms-per-mib", a.verify_ms_per_mib),
        ("--cpu-mib-s", a.cpu_mib_s),
        ("--control-ms", a.control_ms),
        ("--start-s", a.start_s),
    ] {
        if let Some(v) = v.filter(|v| !v.is_finite() || *v < 0.0) {
            bail!("{flag} {v} is negative or not a number; give 0 or more");
        }
    }
    if let Some(v) = a.cores.filter(|&v| !positive(v)) {
        bail!("--cores {v} is not a core count; give more than 0, e.g. 2");
    }
    if let Some(v) = a.share_loss.filter(|v| !(0.0..1.0).contains(v)) {
        bail!("--share-loss {v} is out of range; give 0 or more and below 1, e.g. 0.1");
    }
    let n = a.nodes as usize;
    let bytes = a.size_mib * (1 << 20);
    // As the agents pick it (auto: from the model's size).
    let chunk_size = a.chunking.chunk_size.for_bytes(bytes);
    let chunks = bytes.div_ceil(chunk_size);
    let mut s = Setup::this_machine(n, a.rate_mbit * 1e6 / 8.0, chunks, chunk_size);
    if a.ideal {
        s.costs = sim::Costs::default();
    }
    let latency = a.latency_ms.map(|ms| ms / 1e3).unwrap_or(if a.ideal {
        50e-6
    } else {
        sim::this_machine_latency(a.rate_mbit * 1e6 / 8.0)
    });
    let cores = match (a.cores, a.ideal) {
        (Some(c), _) => c / (n + 1) as f64,
        (None, true) => f64::INFINITY,
        (None, false) => THIS_MACHINE_CORES / (n + 1) as f64,
    };
    for node in std::iter::once(&mut s.source).chain(s.receivers.iter_mut()) {
        node.latency = latency;
        node.cores = cores;
    }
    let c = &mut s.costs;
    if let Some(v) = a.service_ms {
        c.service = v / 1e3;
    }
    if let Some(v) = a.verify_ms_per_mib {
        c.verify = v / 1e3 / MIB;
    }
    if let Some(v) = a.cpu_mib_s {
        c.per_byte = if v > 0.0 { 1.0 / (v * MIB) } else { 0.0 };
    }
    if let Some(v) = a.share_loss {
        c.share_loss = v;
    }
    if let Some(v) = a.control_ms {
        c.control = v / 1e3;
    }
    if let Some(v) = a.start_s {
        c.start = v;
    }
    s.topology = Some(topology::Config {
        degree: a.degree,
        seed: a.seed,
        ..Default::default()
    });
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::{Cli, Cmd};
    use clap::Parser;

    fn args(line: &str) -> SimulateArgs {
        match Cli::try_parse_from(line.split_whitespace()).unwrap().cmd {
            Cmd::Simulate(a) => a,
            _ => unreachable!("not simulate"),
        }
    }

    #[test]
    fn the_preset_and_its_knobs() {
        let s = setup(&args(
            "xfer simulate --nodes 8 --rate-mbit 100 --size-mib 128",
        ))
        .unwrap();
        assert_eq!(s.costs, sim::Costs::THIS_MACHINE);
        // Auto, as the agents pick it: 256 KiB for 128 MiB.
        assert_eq!(
            (s.chunks, s.chunk_bytes, s.receivers.len()),
            (512, 256 << 10, 8)
        );
        assert_eq!(s.source.up, 12.5e6);
        assert_eq!(s.source.latency, sim::THIS_MACHINE_LATENCY);
        let s = setup(&args(
            "xfer simulate --nodes 8 --rate-mbit 400 --size-mib 128 --chunk-size 4MiB",
        ))
        .unwrap();
        assert_eq!((s.chunks, s.chunk_bytes), (32, 4 << 20));
        assert_eq!(s.source.latency, sim::THIS_MACHINE_LATENCY / 4.0);
        assert_eq!(s.receivers[0].cores, THIS_MACHINE_CORES / 9.0);
        let s = setup(&args(
            "xfer simulate --nodes 8 --rate-mbit 100 --size-mib 128 --ideal --service-ms 3",
        ))
        .unwrap();
        let want = sim::Costs {
            service: 3e-3,
            ..Default::default()
        };
        assert_eq!(s.costs, want);
        assert!(s.receivers[0].cores.is_infinite());
        let bad = setup(&args("xfer simulate --nodes 8 --rate-mbit 0 --size-mib 1"));
        assert!(bad.unwrap_err().to_string().contains("--rate-mbit 0"));
    }

    #[test]
    fn prints_the_figures_a_script_compares() {
        let out = simulate(&args(
            "xfer simulate --nodes 4 --rate-mbit 100 --size-mib 64",
        ))
        .unwrap();
        assert_eq!(out["incomplete"], 0);
        assert_eq!(out["nodes"], 4);
        let x = |k: &str| out[k].as_f64().unwrap_or_else(|| panic!("{k} missing"));
        assert!(1.0 <= x("p50_x") && x("p50_x") <= x("p90_x") && x("p90_x") <= x("max_x"));
        assert!(x("source_x") >= 1.0 && x("wire_x") >= 1.0);
        assert!(x("max_x") <= x("wall_x"));
    }
}
