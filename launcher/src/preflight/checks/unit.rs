//! The launch unit's checks: `nccl` (one NCCL build on every node, a check
//! of its own because mixed builds hang multi-node vLLM, vllm#46097) and
//! `unit` (every node would start the same [`LaunchUnit`]: a row per field
//! no other check compares, the CUDA runtime and the GPU architecture,
//! and, when the nodes agree, the unit and its id).
//!
//! The other fields have their rows in their own checks: the weights'
//! root in `weights`, the image in `image`, the engine, torch and the
//! driver in `versions`; `xfer-launch check` prints each node's unit id
//! under the table when they differ.

use crate::preflight::{Ctx, Rows, Verdict};
use crate::unit::{build_of, differences, Difference, LaunchUnit, UNKNOWN};

/// The fix of an NCCL mismatch.
pub const NCCL_FIX: &str = "install one NCCL build on every node: the same torch wheel (its nvidia-nccl), and the same libnccl where LD_LIBRARY_PATH or VLLM_NCCL_SO_PATH name one; mixed NCCL builds hang multi-node vLLM at init (vllm#46097)";

/// Each answering node's unit, in rank order.
fn units(ctx: &Ctx) -> Vec<(String, LaunchUnit)> {
    ctx.nodes
        .iter()
        .map(|(n, f)| (n.name.to_string(), LaunchUnit::of(ctx.setup, f)))
        .collect()
}

/// "A on n1, n2; B on n3".
fn spread(d: &Difference) -> String {
    d.values
        .iter()
        .map(|(v, ns)| format!("{v} on {}", ns.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `nccl`: one NCCL build on every node.
pub fn nccl(ctx: &Ctx, rows: &mut Rows) {
    let skip = if ctx.setup.container.is_some() {
        Some("the ranks run in the image, whose id pins their NCCL")
    } else if ctx.setup.engine == crate::config::Engine::Custom {
        Some("a custom engine may not use torch")
    } else {
        None
    };
    if let Some(why) = skip {
        rows.add("nccl", "*", Verdict::Skip, format!("skipped: {why}"), None);
        return;
    }
    let unknown: Vec<String> = ctx
        .nodes
        .iter()
        .filter_map(|(n, f)| match build_of(f) {
            Some(Ok(_)) => None,
            Some(Err(why)) => Some(format!("{}: {why}", n.name)),
            None => Some(format!("{}: not asked", n.name)),
        })
        .collect();
    if !unknown.is_empty() {
        rows.add(
            "nccl",
            "*",
            Verdict::Warn,
            format!("cannot tell the NCCL build on {}", unknown.join("; ")),
            Some("make torch importable by the engine's Python on that node (and allow `python3` in the agent's --allow-exec); an unchecked NCCL mismatch hangs multi-node vLLM (vllm#46097)".into()),
        );
    }
    let known: Vec<(String, LaunchUnit)> = units(ctx)
        .into_iter()
        .filter(|(_, u)| u.nccl != UNKNOWN)
        .collect();
    match differences(&known).into_iter().find(|d| d.field == "nccl") {
        Some(d) => rows.add(
            "nccl",
            "*",
            Verdict::Fail,
            format!("NCCL differs: {}", spread(&d)),
            Some(NCCL_FIX.into()),
        ),
        None => {
            if let Some((_, u)) = known.first() {
                let what = if u.nccl == crate::unit::NONE {
                    "no NCCL on any node (torch without CUDA)".to_string()
                } else {
                    format!("NCCL {} on every node", u.nccl)
                };
                rows.add("nccl", "*", Verdict::Pass, what, None);
            }
        }
    }
}

/// `unit`: the CUDA runtime and the GPU architecture agree, and the id of
/// the one unit every node would start (or the fields they differ on).
pub fn unit(ctx: &Ctx, rows: &mut Rows) {
    let units = units(ctx);
    if units.is_empty() {
        return;
    }
    let diffs = differences(&units);
    for d in &diffs {
        let (what, fix) = match d.field {
            "cuda_runtime" => (
                "CUDA runtime",
                "install the same torch build (the same +cuXYZ) on every node",
            ),
            "gpu_arch" => (
                "GPU architecture",
                "run one launch on GPUs of one architecture, or split the nodes into launches of their own",
            ),
            _ => continue,
        };
        rows.add(
            "unit",
            "*",
            Verdict::Fail,
            format!("{what} differs: {}", spread(d)),
            Some(fix.into()),
        );
    }
    if diffs.is_empty() {
        rows.add(
            "unit",
            "*",
            Verdict::Pass,
            format!("{} on every node", units[0].1.summary()),
            None,
        );
    }
    // Every other field that differs has its row in its own check
    // (weights, image, versions), which says what to do: the units'
    // ids are printed under the table.
}
