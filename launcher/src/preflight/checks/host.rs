//! The host checks: `disk`, `memory` and `gpu`, each node on its own.

use xfer_proto::launch::Probe;
use xfer_proto::units::Bytes;

use crate::preflight::{Ctx, Rows, Verdict, DISK_FAIL, DISK_WARN};

/// `disk`: free space on the filesystem of the agent's root.
pub fn disk(ctx: &Ctx, rows: &mut Rows) {
    let nodes = &ctx.nodes;
    for (n, f) in nodes {
        match &f.disk {
            Probe::Ok(d) => {
                let (v, fix) = if d.free_bytes < DISK_FAIL {
                    (Verdict::Fail, Some(format!("free space on the filesystem of {} (engines write compile caches and logs there)", d.path)))
                } else if d.free_bytes < DISK_WARN {
                    (Verdict::Warn, Some(format!("free some space on the filesystem of {}; torch.compile and CUDA graph caches take several GiB", d.path)))
                } else {
                    (Verdict::Pass, None)
                };
                rows.add(
                    "disk",
                    &n.name,
                    v,
                    format!(
                        "{} free of {} at {}",
                        Bytes(d.free_bytes),
                        Bytes(d.total_bytes),
                        d.path
                    ),
                    fix,
                );
            }
            p => rows.skip_or_fail(
                "disk",
                &n.name,
                p,
                "check that the agent's root is readable",
            ),
        }
    }
}

/// `memory`: each node holds its share of the weights in memory.
pub fn memory(ctx: &Ctx, rows: &mut Rows) {
    let (setup, nodes) = (ctx.setup, &ctx.nodes);
    let nnodes = setup.nodes.len().max(1) as u64;
    for (n, f) in nodes {
        match &f.memory {
            Probe::Ok(m) => {
                let share = f.weights.bytes_present / nnodes;
                let (v, fix) = if m.mem_available < share {
                    (
                        Verdict::Fail,
                        Some("free memory on this node (stop other processes; drop the model's pages from the page cache with `xfer-launch up --evict-page-cache`), or spread the model over more nodes".to_string()),
                    )
                } else if (m.mem_available as f64) < share as f64 * 1.2 {
                    (
                        Verdict::Warn,
                        Some("little headroom: the OOM killer may stop a rank while it loads; free memory, or start with `xfer-launch up --evict-page-cache`".to_string()),
                    )
                } else {
                    (Verdict::Pass, None)
                };
                rows.add(
                    "memory",
                    &n.name,
                    v,
                    format!(
                        "MemAvailable {} of {} for a {} share of the weights",
                        Bytes(m.mem_available),
                        Bytes(m.mem_total),
                        Bytes(share)
                    ),
                    fix,
                );
            }
            p => rows.skip_or_fail("memory", &n.name, p, "check /proc/meminfo on this node"),
        }
    }
}

/// `cache`: how much of the model sits in the page cache, and whether the
/// node's memory is unified (there the cache competes with the GPU's
/// allocations, and `up` drops the model's pages before it starts).
pub fn cache(ctx: &Ctx, rows: &mut Rows) {
    for (n, f) in &ctx.nodes {
        let memory = match f.unified_memory {
            Some(true) => "unified memory: `up` drops these pages before it starts",
            Some(false) => "GPU memory is separate",
            None => "no GPU seen",
        };
        match &f.page_cache {
            Probe::Ok(c) => {
                let pct = if c.total_bytes == 0 {
                    0.0
                } else {
                    100.0 * c.resident_bytes as f64 / c.total_bytes as f64
                };
                rows.add(
                    "cache",
                    &n.name,
                    Verdict::Pass,
                    format!(
                        "{} of {} of the model ({pct:.0} %, {} files) in the page cache; {memory}",
                        Bytes(c.resident_bytes),
                        Bytes(c.total_bytes),
                        c.files
                    ),
                    None,
                );
            }
            Probe::Skipped(why) => rows.add(
                "cache",
                &n.name,
                Verdict::Skip,
                format!("skipped: {why}"),
                None,
            ),
            Probe::Failed(why) => rows.add(
                "cache",
                &n.name,
                Verdict::Warn,
                format!("{why}; {memory}"),
                Some("check that the agent may read the model's files".into()),
            ),
        }
    }
}

/// `gpu`: the GPUs are there and idle.
pub fn gpu(ctx: &Ctx, rows: &mut Rows) {
    let nodes = &ctx.nodes;
    for (n, f) in nodes {
        match &f.gpus {
            Probe::Ok(g) if !g.processes.is_empty() => {
                let list: Vec<String> = g
                    .processes
                    .iter()
                    .map(|p| match p.used_mib {
                        Some(m) => format!("{} (pid {}, {m} MiB)", p.name, p.pid),
                        None => format!("{} (pid {})", p.name, p.pid),
                    })
                    .collect();
                rows.add(
                    "gpu",
                    &n.name,
                    Verdict::Fail,
                    format!("the GPUs are busy: {}", list.join(", ")),
                    Some("stop those processes (`xfer-launch down` if they are an earlier launch), then check again".into()),
                );
            }
            Probe::Ok(g) => {
                let names: Vec<&str> = g.gpus.iter().map(|g| g.name.as_str()).collect();
                rows.add(
                    "gpu",
                    &n.name,
                    if g.gpus.is_empty() {
                        Verdict::Warn
                    } else {
                        Verdict::Pass
                    },
                    format!(
                        "{} GPU(s) idle{}{}",
                        g.gpus.len(),
                        if names.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", names.join(", "))
                        },
                        g.driver
                            .as_deref()
                            .map(|d| format!(", driver {d}"))
                            .unwrap_or_default()
                    ),
                    g.gpus.is_empty().then(|| {
                        "nvidia-smi lists no GPU: check the driver (`nvidia-smi`)".to_string()
                    }),
                );
            }
            p => rows.skip_or_fail(
                "gpu",
                &n.name,
                p,
                "run `nvidia-smi` on this node to see why it fails",
            ),
        }
    }
}
